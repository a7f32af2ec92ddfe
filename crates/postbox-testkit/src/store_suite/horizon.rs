//! Cases of the ids handed out to transactions that may not have committed yet: the commit
//! horizon, which ordered claims wait for (G6), and the head of the outbox table, which an idle
//! relay polls.
//!
//! Stores find the horizon differently — PostgreSQL waits for the writers it saw, MySQL reads
//! ids only once they are [a moment old](SETTLE_WITHIN), SQLite draws ids in commit order and
//! settles everything at once — so the cases state what every one of them must meet, and wait
//! for it with a deadline.

#![allow(
    clippy::unwrap_used,
    clippy::missing_panics_doc,
    reason = "a test suite fails loudly on the first unexpected error"
)]

use std::time::Duration;

use postbox::store::HorizonProbe;
use postbox::{Event, Target, schema::TenantId};
use tokio::time::Instant;

use super::StoreHarness;
use super::helpers::{ready, target};
use postbox::StoreExt;

/// How long a store may take to settle an id after its transaction ended.
const SETTLE_WITHIN: Duration = Duration::from_secs(5);

/// How long a write that is free to commit may take on a busy test machine; waiting this long
/// for one that must wait shows that it waits.
const A_FREE_WRITE_TAKES: Duration = Duration::from_millis(250);

fn event(event_type: &str) -> Event {
    Event::new(event_type, &serde_json::json!({}))
        .expect("event")
        .aggregate("Invoice", "1")
        .without_idempotency_key()
}

/// The horizon as a relay follows it: each call passes on the probe of the last.
struct Horizon<'a, B> {
    b: &'a B,
    target: Target,
    probe: Option<HorizonProbe>,
}

impl<'a, B: StoreHarness> Horizon<'a, B> {
    fn new(b: &'a B) -> Self {
        Horizon {
            b,
            target: target(b),
            probe: None,
        }
    }

    /// The settled id of the next call, if it names one.
    async fn next(&mut self) -> Option<i64> {
        let horizon = self
            .b
            .store()
            .commit_horizon(&self.target, self.probe.as_ref())
            .await
            .expect("commit horizon");
        self.probe = horizon.probe;
        horizon.settled
    }

    /// Follows the horizon until it has passed `id`; panics after [`SETTLE_WITHIN`].
    async fn until_past(&mut self, id: i64) {
        let follower = tokio::sync::Mutex::new(self);
        crate::wait_until(
            &format!("the commit horizon passes {id}"),
            SETTLE_WITHIN,
            || async {
                let settled = follower.lock().await.next().await;
                settled.is_some_and(|settled| settled >= id)
            },
        )
        .await;
    }

    /// The highest id settled in `rounds` calls spread over at least `at_least`.
    async fn highest_over(&mut self, at_least: Duration, rounds: u32) -> Option<i64> {
        let until = Instant::now() + at_least;
        let mut highest = None;
        let mut done = 0;
        while done < rounds || Instant::now() < until {
            highest = highest.max(self.next().await);
            done += 1;
            // The subject: the horizon watched over a span of time, a look every 5 ms.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        highest
    }
}

/// A conformance case: an id committed is settled, eventually; an id whose transaction is still
/// open never is while a later id is committed — else an ordered claim could publish the later
/// event first. A store may settle an open id only if it draws ids in commit order (no later id
/// can commit before it: SQLite's one writer at a time).
pub async fn the_commit_horizon_settles_committed_ids_and_never_one_still_open<B: StoreHarness>() {
    let b = ready::<B>().await;
    let outbox = b.store().outbox();
    let mut horizon = Horizon::new(&b);

    let started = Instant::now();
    let committed = b
        .enqueue_one(&outbox, event("Committed"))
        .await
        .unwrap()
        .id()
        .unwrap();
    horizon.until_past(committed).await;
    // A store that ignored open transactions would pass an open id as soon as this: the
    // horizon is watched twice as long below (and for some rounds at least) before it is taken
    // to stay where it is.
    let watch = started.elapsed() * 2;

    let (open_id, open) = b.open_enqueue(&outbox, event("Open")).await;
    assert!(open_id > committed);
    let settled_while_open = horizon.highest_over(watch, 10).await;
    // A later write, started when first awaited.
    let mut later = std::pin::pin!(b.enqueue_one(&outbox, event("Later")));
    let later_id = if settled_while_open.is_some_and(|s| s >= open_id) {
        // The store settled the open id: no later id may commit before it does. A write that
        // could commit would within A_FREE_WRITE_TAKES; this one must not.
        tokio::select! {
            done = &mut later => panic!(
                "the horizon settled {open_id} while its transaction was open ({settled_while_open:?}), \
                 yet a later id committed first: {done:?}"
            ),
            // The subject: a write that is not blocked commits within this.
            () = tokio::time::sleep(A_FREE_WRITE_TAKES) => {}
        }
        b.commit_open(open).await;
        later.await.unwrap().id().unwrap()
    } else {
        // Ids commit out of order: the later one commits now, and the horizon stays below the
        // open id for as long as it is open.
        let later_id = tokio::time::timeout(SETTLE_WITHIN, later)
            .await
            .expect("a later write commits beside an open transaction")
            .unwrap()
            .id()
            .unwrap();
        let settled = horizon.highest_over(watch, 10).await;
        assert!(
            settled.is_none_or(|s| s < open_id),
            "the horizon settled {settled:?} while {open_id} is open and {later_id} committed"
        );
        b.commit_open(open).await;
        later_id
    };
    assert!(later_id > open_id, "ids are handed out in order");
    horizon.until_past(later_id).await;
}

/// A conformance case: an id whose transaction rolled back never commits, and does not hold the
/// horizon back: the later ids committed are settled past it.
pub async fn an_id_rolled_back_does_not_hold_the_commit_horizon_back<B: StoreHarness>() {
    let b = ready::<B>().await;
    let outbox = b.store().outbox();
    let mut horizon = Horizon::new(&b);
    horizon.next().await;
    let (gone, open) = b.open_enqueue(&outbox, event("RolledBack")).await;
    b.rollback_open(open).await;
    let after = b
        .enqueue_one(&outbox, event("Committed"))
        .await
        .unwrap()
        .id()
        .unwrap();
    // SQLite hands a rolled-back id out again: its counter rolled back with the row.
    assert!(gone <= after);
    horizon.until_past(after).await;
    assert_eq!(b.row_count().await, 1, "the rolled-back event is not there");
}

/// A conformance case: [`outbox_heads`](postbox::Store::outbox_heads) answers the heads that
/// are not the ones known, with their places, and none for a target without an outbox table
/// (nor for one whose head is known and has not moved). A store that can tell
/// starts at 0, and its head is never below an id committed — whatever transactions are open or
/// rolled back beside it —, so that an idle relay sees rows of producers that do not notify.
/// (PostgreSQL's and MySQL's heads also move before a commit and for a rollback; SQLite's moves
/// with the commit.) A store that cannot tell answers `None` every time.
pub async fn the_head_of_the_outbox_moves_with_every_id_handed_out<B: StoreHarness>() {
    let b = ready::<B>().await;
    let store = b.store();
    let outbox = store.outbox();
    let t = target(&b);
    let ghost = TenantId::new("ghost").unwrap();
    let nowhere = Target {
        schema: ghost.default_schema(),
        tenant: Some(ghost),
    };
    assert!(store.outbox_heads(&[], &[]).await.unwrap().is_empty());
    let targets = [t.clone(), nowhere.clone(), t.clone()];
    let head = async || {
        let moved = store.outbox_heads(&targets, &[]).await.unwrap();
        assert!(
            moved.iter().all(|(place, _)| *place != 1),
            "a target without an outbox table has no head: {moved:?}"
        );
        let first = moved
            .iter()
            .find(|(place, _)| *place == 0)
            .and_then(|m| m.1);
        let last = moved
            .iter()
            .find(|(place, _)| *place == 2)
            .and_then(|m| m.1);
        assert_eq!(first, last, "the same target, the same head");
        // Known, and not moved: nothing comes back.
        let known = [first, None, first];
        let again = store.outbox_heads(&targets, &known).await.unwrap();
        assert!(
            again
                .iter()
                .all(|(place, head)| *place != 0 || *head != first),
            "a head known and not moved comes back: {again:?}"
        );
        first
    };
    let at_least = async |id: i64, when: &str| {
        let moved = head().await.expect("a head");
        assert!(moved >= id, "head {moved} below committed id {id} {when}");
    };

    let Some(empty) = head().await else {
        enqueue_and_commit(&b).await;
        assert_eq!(head().await, None, "a store that cannot tell never can");
        return;
    };
    assert_eq!(empty, 0, "no id handed out yet");
    let committed = enqueue_and_commit(&b).await;
    at_least(committed, "once it committed").await;
    let (_, open) = b.open_enqueue(&outbox, event("Open")).await;
    at_least(committed, "beside an open transaction").await;
    b.rollback_open(open).await;
    at_least(committed, "beside a rollback").await;
    let after = enqueue_and_commit(&b).await;
    at_least(after, "once it committed").await;
}

async fn enqueue_and_commit<B: StoreHarness>(b: &B) -> i64 {
    b.enqueue_one(&b.store().outbox(), event("Committed"))
        .await
        .unwrap()
        .id()
        .unwrap()
}
