//! The cases of what a relay reads and does beside its claims: wake-up hints, the dead rows
//! that marks leave and the vacuum that removes them, and the oldest open transaction (the one
//! that keeps a vacuum or InnoDB's purge from removing anything).

#![allow(
    clippy::unwrap_used,
    clippy::missing_panics_doc,
    reason = "a test suite fails loudly on the first unexpected error"
)]

use std::time::Duration;

use tokio::time::Instant;

use postbox::Event;

use super::StoreHarness;
use super::helpers::{claim, enqueue_n, mark_processed, ready, target};
use crate::wait_until;
use postbox::StoreExt;

fn event(event_type: &str) -> Event {
    Event::new(event_type, &serde_json::json!({}))
        .unwrap()
        .without_idempotency_key()
}

/// A conformance case: a store with wake-up hints gives one once a transaction that enqueued
/// commits (the relay's cue to claim at once); a store without them says so with `None`, and
/// its relays poll.
pub async fn wakeups_come_with_commits_or_the_store_has_none<B: StoreHarness>() {
    let b = ready::<B>().await;
    let Some(mut wakeups) = b.store().wakeups().await.unwrap() else {
        return;
    };
    let outbox = b.store().outbox();
    b.enqueue_one(&outbox, event("Woken")).await.unwrap();
    let hint = tokio::time::timeout(Duration::from_secs(5), wakeups.next())
        .await
        .expect("a hint within 5 s of the commit")
        .unwrap();
    assert!(hint.is_some(), "the source of hints ended");
}

/// A conformance case: marks leave dead row versions; a store whose database keeps them
/// ([`StoreHarness::DEAD_ROWS`]) counts them (its statistics may lag: the case waits for them)
/// and `outbox_vacuum` removes them; every store answers one count per target and vacuums
/// without error.
pub async fn marks_leave_dead_rows_that_a_vacuum_removes<B: StoreHarness>() {
    let b = ready::<B>().await;
    let store = b.store();
    let t = target(&b);
    let ids = enqueue_n(&b, 50).await;
    let c = claim(&b, "r1", 50, Duration::from_secs(30)).await;
    assert_eq!(mark_processed(&b, c.claim_token, &ids).await, 50);
    let dead = || async {
        store
            .outbox_dead_rows(std::slice::from_ref(&t))
            .await
            .unwrap()
    };
    assert_eq!(dead().await.len(), 1, "one count per target");
    if B::DEAD_ROWS {
        wait_until(
            "the statistics count the dead rows of the claim and the marks",
            Duration::from_secs(15),
            || async { dead().await[0] >= 50 },
        )
        .await;
    } else {
        assert_eq!(dead().await, [0]);
    }
    store.outbox_vacuum(&t).await.unwrap();
    wait_until(
        "the vacuum removed the dead rows",
        Duration::from_secs(15),
        || async { dead().await[0] == 0 },
    )
    .await;
    assert_eq!(b.row_count().await, 50, "a vacuum removes no event");
}

/// A conformance case: while a transaction that enqueued is held open, a store whose database
/// can tell ([`StoreHarness::SEES_TRANSACTIONS`]) reports an oldest open transaction at least as
/// old as that one (a writer holds vacuum and purge back as a reader with a snapshot does);
/// other stores report none.
pub async fn the_oldest_open_transaction_is_seen_where_the_database_tells<B: StoreHarness>() {
    let b = ready::<B>().await;
    let outbox = b.store().outbox();
    let (_, open) = b.open_enqueue(&outbox, event("Held")).await;
    let opened = Instant::now();
    if B::SEES_TRANSACTIONS {
        wait_until(
            "the held transaction is seen, 200 ms old",
            Duration::from_secs(10),
            || async {
                let age = b.store().oldest_transaction_age().await.unwrap();
                opened.elapsed() >= Duration::from_millis(200)
                    && age.is_some_and(|age| age >= Duration::from_millis(200))
            },
        )
        .await;
    } else {
        assert_eq!(b.store().oldest_transaction_age().await.unwrap(), None);
    }
    b.commit_open(open).await;
}
