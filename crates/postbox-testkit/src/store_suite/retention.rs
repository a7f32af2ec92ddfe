//! Cases of retention: old PROCESSED events moved to the archive batch by batch (a dry run moves
//! nothing), and old archived and FAILED events purged; with the walks that run every batch of
//! either.

#![allow(
    clippy::unwrap_used,
    clippy::missing_panics_doc,
    reason = "a test suite fails loudly on the first unexpected error"
)]

use std::time::Duration;

use postbox::{Event, event::Enqueued};

use super::StoreHarness;
use super::helpers::{claim, enqueue_n, failed, mark_failed, mark_processed, ready, target};
use postbox::StoreExt;

/// Archives every batch of `target` older than `days`, `batch` rows at a time; returns the
/// total moved (or counted) and the number of batches.
pub(super) async fn archive_all<B: StoreHarness>(
    b: &B,
    days: u64,
    batch: u32,
    dry_run: bool,
) -> (u64, u32) {
    let t = target(b);
    let (mut after_id, mut moved, mut batches) = (0, 0, 0);
    loop {
        let done = b
            .store()
            .events_archive(&postbox::store::ArchiveParams {
                target: &t,
                older_than: Duration::from_secs(days * 86_400),
                after_id,
                batch_size: batch,
                dry_run,
                lock_wait: None,
            })
            .await
            .unwrap()
            .expect("nobody else archives");
        batches += 1;
        moved += done.moved;
        assert!(done.last_id >= after_id, "the walk goes forward");
        after_id = done.last_id;
        if done.done {
            return (moved, batches);
        }
        assert!(batches < 100, "the walk ends");
    }
}

/// Purges every batch of `kind` older than `days`; returns the total.
async fn purge_all<B: StoreHarness>(
    b: &B,
    kind: postbox::store::PurgeKind,
    days: u64,
    dry_run: bool,
) -> u64 {
    let t = target(b);
    let mut purged = 0;
    for _ in 0..100 {
        let done = b
            .store()
            .events_purge(&postbox::store::PurgeParams {
                target: &t,
                kind,
                older_than: Duration::from_secs(days * 86_400),
                batch_size: 2,
                dry_run,
                lock_wait: None,
            })
            .await
            .unwrap()
            .expect("nobody else purges");
        purged += done.purged;
        if done.done {
            return purged;
        }
    }
    panic!("the purge never ends")
}

/// A conformance case; see the module docs.
pub async fn retention_archives_old_processed_events_and_nothing_else<B: StoreHarness>() {
    let b = ready::<B>().await;
    let keyed = || {
        Event::new("Keyed", &serde_json::json!({}))
            .expect("event")
            .idempotency_key("order-1:created")
    };
    let outbox = b.store().outbox();
    let first = b.enqueue_one(&outbox, keyed()).await.unwrap();
    let mut ids = vec![first.id().expect("inserted")];
    ids.extend(enqueue_n(&b, 7).await);
    assert_eq!(
        b.enqueue_one(&outbox, keyed()).await.unwrap(),
        Enqueued::Duplicate
    );
    let c = claim(&b, "r1", 7, Duration::from_secs(30)).await;
    let processed = [ids[0], ids[2], ids[4], ids[5], ids[6]];
    assert_eq!(mark_processed(&b, c.claim_token, &processed).await, 5);
    mark_failed(&b, c.claim_token, &[failed(ids[1], "gone", true)]).await;
    // ids[3] stays PROCESSING (claimed), ids[7] PENDING (never claimed).
    // Created 40 days ago: all but ids[5]. The walk follows ids and stops at the first young
    // row, so ids[6] (old, but after a young one) waits for a later run.
    let old: Vec<i64> = ids.iter().copied().filter(|id| *id != ids[5]).collect();
    b.backdate("outbox_events", "created_at", &old, 40).await;

    for batch in [1, 2, 100] {
        assert_eq!(
            archive_all(&b, 30, batch, true).await.0,
            3,
            "dry run, batches of {batch}"
        );
    }
    assert_eq!(
        b.archived_ids().await,
        Vec::<i64>::new(),
        "a dry run moves nothing"
    );
    assert_eq!(b.row_count().await, 8);

    let (moved, batches) = archive_all(&b, 30, 2, false).await;
    assert_eq!(moved, 3);
    assert!(batches >= 3, "{batches} batches");
    assert_eq!(b.archived_ids().await, [ids[0], ids[2], ids[4]]);
    assert_eq!(b.row_count().await, 5);
    for id in [ids[1], ids[3], ids[5], ids[6], ids[7]] {
        b.row(id).await;
    }
    assert_eq!(
        archive_all(&b, 30, 2, false).await.0,
        0,
        "nothing left to move"
    );
    // Younger than the cutoff: nothing moves, whatever the status.
    assert_eq!(archive_all(&b, 50, 100, false).await.0, 0);

    // Once the young row is archived too, the walk reaches the old one behind it.
    b.backdate("outbox_events", "created_at", &[ids[5]], 40)
        .await;
    assert_eq!(archive_all(&b, 30, 100, false).await.0, 2);
    assert_eq!(
        b.archived_ids().await,
        [ids[0], ids[2], ids[4], ids[5], ids[6]]
    );
    // An archived event's idempotency key is free again: the dedup window is the hot table.
    let again = b.enqueue_one(&outbox, keyed()).await.unwrap();
    assert!(matches!(again, Enqueued::Inserted(_)), "{again:?}");
}

/// A conformance case; see the module docs.
pub async fn purge_removes_old_archived_and_failed_events_only<B: StoreHarness>() {
    use postbox::store::PurgeKind;
    let b = ready::<B>().await;
    let ids = enqueue_n(&b, 9).await;
    let c = claim(&b, "r1", 9, Duration::from_secs(30)).await;
    mark_processed(&b, c.claim_token, &ids[..5]).await;
    mark_failed(
        &b,
        c.claim_token,
        &[
            failed(ids[5], "a", true),
            failed(ids[6], "b", true),
            failed(ids[7], "c", true),
        ],
    )
    .await;
    b.backdate("outbox_events", "created_at", &ids, 40).await;
    assert_eq!(archive_all(&b, 30, 100, false).await.0, 5);
    b.backdate("outbox_events_archive", "archived_at", &ids[..3], 100)
        .await;
    b.backdate("outbox_events", "updated_at", &ids[5..7], 10)
        .await;

    assert_eq!(purge_all(&b, PurgeKind::Archive, 90, true).await, 3);
    assert_eq!(purge_all(&b, PurgeKind::Failed, 7, true).await, 2);
    assert_eq!(b.archived_ids().await.len(), 5, "a dry run deletes nothing");

    assert_eq!(purge_all(&b, PurgeKind::Archive, 90, false).await, 3);
    assert_eq!(b.archived_ids().await, ids[3..5]);
    assert_eq!(purge_all(&b, PurgeKind::Failed, 7, false).await, 2);
    assert_eq!(b.row(ids[7]).await.status, "FAILED", "failed lately: kept");
    assert_eq!(b.row(ids[8]).await.status, "PROCESSING", "not failed: kept");
    assert_eq!(b.row_count().await, 2);
    assert_eq!(purge_all(&b, PurgeKind::Archive, 90, false).await, 0);
    assert_eq!(purge_all(&b, PurgeKind::Failed, 7, false).await, 0);
}
