//! Cases of claims and their leases: due events taken in id order up to the batch size and held
//! while the lease lasts, then taken over and counted as recovered (or FAILED on their last try);
//! the late writes of a fenced claim change nothing, only the holder renews, and an unreadable row
//! is reported alone.

#![allow(
    clippy::unwrap_used,
    clippy::missing_panics_doc,
    reason = "a test suite fails loudly on the first unexpected error"
)]

use std::time::Duration;

use uuid::Uuid;

use super::StoreHarness;
use super::helpers::{
    assert_ms, claim, enqueue_n, enqueue_with_max_retries, failed, lease_expired, mark_failed,
    mark_processed, ready, renew,
};

/// A conformance case; see the module docs.
pub async fn claim_takes_due_events_in_id_order_up_to_batch_size<B: StoreHarness>() {
    let b = ready::<B>().await;
    let ids = enqueue_n(&b, 3000).await;
    // Rewrite every third row so the physical order of rows is no longer the id order, and give
    // the planner statistics, so that a claim of thousands is planned as it is in production.
    b.exec(r#"UPDATE outbox_events SET headers = '{"touched": "yes"}' WHERE id % 3 = 0"#)
        .await;
    b.exec("ANALYZE outbox_events").await;

    let first = claim(&b, "relay-1", 2000, Duration::from_secs(30)).await;
    let got: Vec<i64> = first.events.iter().map(|e| e.id).collect();
    assert!(got == ids[..2000], "the first 2000 due events, in id order");
    assert_eq!(first.recovered, 0);
    for id in ids[..2000].iter().step_by(97) {
        let row = b.row(*id).await;
        assert_eq!(row.status, "PROCESSING");
        assert_eq!(row.locked_by.as_deref(), Some("relay-1"));
        assert_eq!(row.claim_token, Some(first.claim_token.to_string()));
        assert_ms(row.granted_ms, 30_000.0, "lease");
    }
    assert_eq!(b.row(ids[2000]).await.status, "PENDING");

    let rest = claim(&b, "relay-2", 100, Duration::from_secs(30)).await;
    let got: Vec<i64> = rest.events.iter().map(|e| e.id).collect();
    assert!(got == ids[2000..2100], "the next 100, in id order");
    let rest = claim(&b, "relay-2", 10_000, Duration::from_secs(30)).await;
    let got: Vec<i64> = rest.events.iter().map(|e| e.id).collect();
    assert!(got == ids[2100..], "the remaining 900, in id order");
    assert_ne!(
        rest.claim_token, first.claim_token,
        "every claim has a fresh token"
    );
    assert!(
        claim(&b, "relay-3", 1000, Duration::from_secs(30))
            .await
            .events
            .is_empty()
    );
}

/// A conformance case; see the module docs.
pub async fn claimed_events_are_not_claimed_again_before_the_lease_expires<B: StoreHarness>() {
    let b = ready::<B>().await;
    let ids = enqueue_n(&b, 3).await;
    let first = claim(&b, "r1", 10, Duration::from_secs(30)).await;
    assert_eq!(first.events.len(), 3);
    let again = claim(&b, "r2", 10, Duration::from_secs(30)).await;
    assert!(again.events.is_empty(), "{:?}", again.events);
    assert_eq!(again.recovered, 0);
    for id in ids {
        let row = b.row(id).await;
        assert_eq!(row.locked_by.as_deref(), Some("r1"));
        assert_eq!(row.claim_token, Some(first.claim_token.to_string()));
        assert_eq!(row.retry_count, 0);
    }
}

/// A conformance case; see the module docs.
pub async fn an_expired_lease_is_reclaimed_and_counted_as_recovered<B: StoreHarness>() {
    let b = ready::<B>().await;
    let ids = enqueue_n(&b, 2).await;
    let first = claim(&b, "crashed-relay", 10, Duration::from_millis(50)).await;
    assert_eq!(first.events.len(), 2);
    lease_expired(&b, ids[1]).await;

    let second = claim(&b, "r2", 10, Duration::from_secs(30)).await;
    assert_eq!(second.events.iter().map(|e| e.id).collect::<Vec<_>>(), ids);
    assert_eq!(second.recovered, 2);
    assert!(second.exhausted.is_empty());
    for e in &second.events {
        assert_eq!(e.retry_count, 1, "a lost lease counts as a failed try");
    }
    for id in ids {
        let row = b.row(id).await;
        assert_eq!(row.status, "PROCESSING");
        assert_eq!(row.retry_count, 1);
        assert_eq!(row.locked_by.as_deref(), Some("r2"));
        assert_eq!(row.claim_token, Some(second.claim_token.to_string()));
        let error = row.last_error.expect("last_error");
        assert!(
            error.contains("lease") && error.contains("crashed-relay"),
            "{error}"
        );
    }
}

/// A conformance case; see the module docs.
pub async fn a_stale_event_on_its_last_try_goes_failed<B: StoreHarness>() {
    let b = ready::<B>().await;
    let last_try = enqueue_with_max_retries(&b, 1).await;
    let has_more = enqueue_with_max_retries(&b, 2).await;
    claim(&b, "crashed-relay", 10, Duration::from_millis(50)).await;
    lease_expired(&b, has_more).await;

    let second = claim(&b, "r2", 10, Duration::from_secs(30)).await;
    assert_eq!(
        second.events.iter().map(|e| e.id).collect::<Vec<_>>(),
        [has_more]
    );
    assert_eq!(second.recovered, 1);
    assert_eq!(second.exhausted.len(), 1);
    let gone = &second.exhausted[0];
    assert_eq!((gone.id, gone.retry_count), (last_try, 1));
    assert_eq!(gone.event_type, "Flaky");
    assert!(gone.last_error.contains("lease"), "{}", gone.last_error);

    let row = b.row(last_try).await;
    assert_eq!(row.status, "FAILED");
    assert_eq!(row.retry_count, 1);
    assert_eq!(row.left_ms, None, "a FAILED event holds no lease");
    assert!(row.last_error.unwrap().contains("lease"));
    assert!(
        claim(&b, "r3", 10, Duration::from_secs(30))
            .await
            .events
            .is_empty()
    );
}

/// A conformance case; see the module docs.
pub async fn late_writes_of_a_fenced_claim_change_nothing<B: StoreHarness>() {
    let b = ready::<B>().await;
    let ids = enqueue_n(&b, 2).await;
    let a = claim(&b, "relay-a", 10, Duration::from_millis(50)).await;
    lease_expired(&b, ids[1]).await;
    let bb = claim(&b, "relay-b", 10, Duration::from_secs(30)).await;
    assert_eq!(bb.events.len(), 2);

    // Relay A wakes up and reports: none of it may land.
    assert_eq!(mark_processed(&b, a.claim_token, &ids).await, 0);
    let marks = mark_failed(&b, a.claim_token, &[failed(ids[0], "late", false)]).await;
    assert!(marks.is_empty(), "{marks:?}");
    let marks = mark_failed(&b, a.claim_token, &[failed(ids[1], "late", true)]).await;
    assert!(marks.is_empty(), "{marks:?}");
    assert_eq!(
        renew(&b, a.claim_token, &ids, Duration::from_secs(60)).await,
        0
    );
    assert_eq!(
        mark_processed(&b, Uuid::new_v4(), &ids).await,
        0,
        "a made-up token"
    );

    for id in &ids {
        let row = b.row(*id).await;
        assert_eq!(row.status, "PROCESSING");
        assert_eq!(row.claim_token, Some(bb.claim_token.to_string()));
        assert_eq!(row.locked_by.as_deref(), Some("relay-b"));
        assert_eq!(row.retry_count, 1, "only the take-over counted");
        assert!(!row.processed);
        assert_ms(row.granted_ms, 30_000.0, "relay B's lease is untouched");
    }
    assert_eq!(mark_processed(&b, bb.claim_token, &ids).await, 2);
    assert_eq!(
        mark_processed(&b, bb.claim_token, &ids).await,
        0,
        "marking twice is a no-op"
    );
}

/// A conformance case; see the module docs.
pub async fn renew_extends_the_lease_of_the_token_holder_only<B: StoreHarness>() {
    let b = ready::<B>().await;
    let ids = enqueue_n(&b, 3).await;
    let c = claim(&b, "r1", 10, Duration::from_millis(500)).await;
    assert_eq!(
        renew(&b, c.claim_token, &ids[..2], Duration::from_secs(60)).await,
        2
    );
    for id in &ids[..2] {
        let row = b.row(*id).await;
        assert_ms(row.granted_ms, 60_000.0, "renewed lease");
        assert!(row.left_ms.unwrap() > 59_000.0);
    }
    assert!(
        b.row(ids[2]).await.left_ms.unwrap() < 1_000.0,
        "not asked, not renewed"
    );
    assert_eq!(
        renew(&b, Uuid::new_v4(), &ids, Duration::from_secs(60)).await,
        0
    );
    assert!(b.row(ids[2]).await.left_ms.unwrap() < 1_000.0);
    assert_eq!(mark_processed(&b, c.claim_token, &ids[..1]).await, 1);
    assert_eq!(
        renew(&b, c.claim_token, &ids, Duration::from_secs(60)).await,
        2,
        "a processed event is not renewed"
    );
    assert_eq!(b.row(ids[0]).await.left_ms, None);
}

/// A conformance case; see the module docs.
pub async fn an_unreadable_row_is_reported_alone_and_the_rest_is_claimed<B: StoreHarness>() {
    let b = ready::<B>().await;
    let ids = enqueue_n(&b, 5).await;
    let column = b.spoil_row(ids[2]).await;
    let c = claim(&b, "r1", 10, Duration::from_secs(30)).await;
    let claimed: Vec<i64> = c.events.iter().map(|e| e.id).collect();
    assert_eq!(claimed, [ids[0], ids[1], ids[3], ids[4]]);
    assert_eq!(c.undecodable.len(), 1, "{:?}", c.undecodable);
    assert_eq!(c.undecodable[0].id, ids[2]);
    assert!(
        c.undecodable[0].reason.contains(column),
        "the reason names the column: {}",
        c.undecodable[0].reason
    );
    // It is claimed like the others, so only this claim's token can fail it.
    let marks = mark_failed(
        &b,
        c.claim_token,
        &[failed(ids[2], &c.undecodable[0].reason, true)],
    )
    .await;
    assert!(marks[0].gave_up);
    assert_eq!(b.row(ids[2]).await.status, "FAILED");
}
