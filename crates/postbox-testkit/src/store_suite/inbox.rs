//! Cases of the inbox: a consumer's record of the messages it handled, written in its own
//! transaction with the message's effect (here: an event enqueued in the same transaction, so
//! the effects are counted as rows of `outbox_events`).

use std::time::Duration;

use postbox::Error;
use postbox::inbox::{MAX_CONSUMER_LEN, MAX_MESSAGE_ID_LEN, Received};
use postbox::store::{PurgeKind, PurgeParams};

use super::StoreHarness;
use super::helpers::{ready, target};
use postbox::StoreExt;

/// The first delivery is handled, a repeat is skipped and counted, per consumer; a transaction
/// that rolls back records nothing (the message is handled when it comes again) and counts no
/// repeat; names and ids out of bounds are refused before anything is written.
pub async fn an_inbox_handles_each_message_once_per_consumer<B: StoreHarness>() {
    let b = ready::<B>().await;
    let store = b.store();
    let outbox = store.outbox();
    let billing = store.inbox("billing").unwrap();
    let shipping = store.inbox("shipping").unwrap();

    assert_eq!(
        b.inbox_handle(&billing, &outbox, "m-1", true)
            .await
            .unwrap(),
        Received::New
    );
    assert_eq!(
        b.inbox_handle(&billing, &outbox, "m-1", true)
            .await
            .unwrap(),
        Received::Duplicate
    );
    // Another consumer of the same message handles it for itself.
    assert_eq!(
        b.inbox_handle(&shipping, &outbox, "m-1", true)
            .await
            .unwrap(),
        Received::New
    );
    // A consumer that dies before its commit: nothing recorded, the effect gone with it, and
    // the redelivery is handled.
    assert_eq!(
        b.inbox_handle(&billing, &outbox, "m-2", false)
            .await
            .unwrap(),
        Received::New
    );
    assert_eq!(
        b.inbox_handle(&billing, &outbox, "m-2", true)
            .await
            .unwrap(),
        Received::New
    );
    // A repeat whose transaction rolls back is skipped, and not counted.
    assert_eq!(
        b.inbox_handle(&billing, &outbox, "m-2", false)
            .await
            .unwrap(),
        Received::Duplicate
    );
    assert_eq!(
        b.inbox_handle(&billing, &outbox, "m-2", true)
            .await
            .unwrap(),
        Received::Duplicate
    );
    assert_eq!(
        b.row_count().await,
        3,
        "one effect per message and consumer"
    );

    let stats = store.inbox_stats(&target(&b)).await.unwrap();
    let figures: Vec<(&str, i64, i64)> = stats
        .iter()
        .map(|s| (s.consumer.as_str(), s.messages, s.duplicates))
        .collect();
    assert_eq!(figures, [("billing", 2, 2), ("shipping", 1, 0)]);
    assert!(stats.iter().all(|s| s.messages_exact()));

    // Bounds, in characters, checked before anything is sent.
    assert!(matches!(
        store.inbox(""),
        Err(Error::InvalidMessage {
            field: "consumer",
            ..
        })
    ));
    assert!(store.inbox(&"c".repeat(MAX_CONSUMER_LEN + 1)).is_err());
    let widest = store.inbox(&"é".repeat(MAX_CONSUMER_LEN)).unwrap();
    let longest = "ü".repeat(MAX_MESSAGE_ID_LEN);
    assert_eq!(
        b.inbox_handle(&widest, &outbox, &longest, true)
            .await
            .unwrap(),
        Received::New
    );
    assert_eq!(
        b.inbox_handle(&widest, &outbox, &longest, true)
            .await
            .unwrap(),
        Received::Duplicate
    );
    for bad in [String::new(), "x".repeat(MAX_MESSAGE_ID_LEN + 1)] {
        let err = b
            .inbox_handle(&billing, &outbox, &bad, true)
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidMessage {
                    field: "message_id",
                    ..
                }
            ),
            "{err}"
        );
    }
    assert_eq!(b.row_count().await, 4);
}

/// Two first deliveries of one message at once (two instances of a consumer): the second waits
/// for the first's transaction, and is a duplicate if it committed, new if it rolled back.
pub async fn a_concurrent_delivery_waits_for_the_first_and_never_runs_twice<B: StoreHarness>() {
    let b = ready::<B>().await;
    let store = b.store();
    let outbox = store.outbox();
    let inbox = store.inbox("billing").unwrap();

    for commit_first in [true, false] {
        let id = if commit_first {
            "m-commit"
        } else {
            "m-rollback"
        };
        let (first, open) = b.inbox_open(&inbox, &outbox, id).await;
        assert_eq!(first, Received::New);
        let mut second = std::pin::pin!(b.inbox_handle(&inbox, &outbox, id, true));
        // The subject: while the first delivery's transaction is open, the second must wait
        // for it, not decide (a look that cannot see the uncommitted record would say "new"
        // and run the effect twice).
        assert!(
            tokio::time::timeout(WHILE_THE_FIRST_IS_OPEN, &mut second)
                .await
                .is_err(),
            "the second delivery of {id} did not wait for the first's transaction"
        );
        if commit_first {
            b.commit_open(open).await;
        } else {
            b.rollback_open(open).await;
        }
        let second = second.await.unwrap();
        let expected = if commit_first {
            Received::Duplicate
        } else {
            Received::New
        };
        assert_eq!(second, expected, "{id}");
    }
    assert_eq!(b.row_count().await, 2, "each message's effect once");
}

/// How long the second delivery is watched while the first is open.
const WHILE_THE_FIRST_IS_OPEN: Duration = Duration::from_millis(300);

/// Records past the dedup window are purged (a dry run counts them); a repeat of a purged
/// message is handled again, one inside the window is still skipped.
pub async fn inbox_records_past_the_dedup_window_are_purged<B: StoreHarness>() {
    let b = ready::<B>().await;
    let store = b.store();
    let outbox = store.outbox();
    let inbox = store.inbox("billing").unwrap();
    for id in ["old-1", "old-2", "new"] {
        assert_eq!(
            b.inbox_handle(&inbox, &outbox, id, true).await.unwrap(),
            Received::New
        );
    }
    b.backdate_inbox("old-1", 8).await;
    b.backdate_inbox("old-2", 9).await;

    let t = target(&b);
    let purge = |dry_run| PurgeParams {
        target: &t,
        kind: PurgeKind::Inbox,
        older_than: Duration::from_secs(7 * 86_400),
        batch_size: 1,
        dry_run,
        lock_wait: None,
    };
    let counted = postbox::store::purge_all(store, purge(true), true, |_| {})
        .await
        .unwrap();
    assert_eq!(counted, Some(2));
    let mut batches = Vec::new();
    let purged = postbox::store::purge_all(store, purge(false), true, |n| batches.push(n))
        .await
        .unwrap();
    assert_eq!(purged, Some(2));
    assert!(batches.iter().all(|&n| n <= 1), "batches of 1: {batches:?}");

    assert_eq!(
        b.inbox_handle(&inbox, &outbox, "old-1", true)
            .await
            .unwrap(),
        Received::New,
        "past the window, a repeat is handled again"
    );
    assert_eq!(
        b.inbox_handle(&inbox, &outbox, "new", true).await.unwrap(),
        Received::Duplicate
    );
    let stats = store.inbox_stats(&t).await.unwrap();
    assert_eq!(stats.len(), 1);
    assert_eq!((stats[0].messages, stats[0].duplicates), (2, 1));
}
