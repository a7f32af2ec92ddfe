//! Cases of what an operator reads and does: status counts and the backlog, a retry of FAILED
//! events, and events listed by filter, page by page, and read back whole (from the table or the
//! archive).

#![allow(
    clippy::unwrap_used,
    clippy::missing_panics_doc,
    reason = "a test suite fails loudly on the first unexpected error"
)]

use std::time::Duration;

use postbox::{Error, Event};

use super::StoreHarness;
use super::helpers::{claim, enqueue_n, failed, mark_failed, mark_processed, ready, target};
use super::retention::archive_all;
use postbox::StoreExt;

/// A conformance case; see the module docs.
pub async fn status_counts_and_backlog_are_right<B: StoreHarness>() {
    let b = ready::<B>().await;
    let t = target(&b);
    let counts = b.store().status_counts(&t).await.unwrap();
    assert_eq!(
        (
            counts.pending,
            counts.processing,
            counts.processed,
            counts.failed,
            counts.oldest_pending_age
        ),
        (0, 0, 0, 0, None)
    );
    assert!(counts.processed_exact);
    // PostgreSQL reports its statistics (0 on a new table); SQLite has none.
    assert!(counts.dead_tuples.is_none_or(|d| d >= 0));
    let backlog = b.store().backlog(&t, &[]).await.unwrap();
    assert_eq!(backlog, postbox::store::Backlog::default());

    let ids = enqueue_n(&b, 6).await;
    let c = claim(&b, "r1", 3, Duration::from_secs(30)).await;
    assert_eq!(mark_processed(&b, c.claim_token, &ids[..1]).await, 1);
    mark_failed(&b, c.claim_token, &[failed(ids[1], "bad", true)]).await;

    let counts = b.store().status_counts(&t).await.unwrap();
    assert_eq!(
        (
            counts.pending,
            counts.processing,
            counts.processed,
            counts.failed
        ),
        (3, 1, 1, 1)
    );
    assert!(
        counts.processed_exact,
        "a small table's processed events are counted"
    );
    let age = counts
        .oldest_pending_age
        .expect("an outstanding event has an age");
    assert!(age < Duration::from_secs(60), "{age:?}");
    let backlog = b.store().backlog(&t, &[]).await.unwrap();
    assert_eq!(
        backlog.next_due_in,
        Some(Duration::ZERO),
        "pending events are due now"
    );
    // The same read for many targets at once answers each as the one-target reads do.
    let both = [t.clone(), t.clone()];
    let outstanding = b.store().status_outstanding(&both).await.unwrap();
    assert_eq!(outstanding.len(), 2);
    for o in &outstanding {
        assert_eq!((o.pending, o.processing, o.failed), (3, 1, 1));
        assert!(o.oldest_pending_age.is_some());
    }
    assert_eq!(
        b.store().outbox_due(&both, &[]).await.unwrap(),
        vec![Some(Duration::ZERO); 2]
    );
    assert!(b.store().outbox_due(&[], &[]).await.unwrap().is_empty());

    claim(&b, "r1", 10, Duration::from_secs(30)).await;
    let backlog = b.store().backlog(&t, &[]).await.unwrap();
    let due = backlog.next_due_in.expect("due when the leases run out");
    assert!(
        due > Duration::from_secs(28) && due <= Duration::from_secs(30),
        "{due:?}"
    );
    let counts = b.store().status_counts(&t).await.unwrap();
    assert_eq!((counts.pending, counts.processing), (0, 4));
}

/// A conformance case; see the module docs.
pub async fn an_operator_retry_puts_failed_events_back_in_the_queue<B: StoreHarness>() {
    let b = ready::<B>().await;
    let t = target(&b);
    let ids = enqueue_n(&b, 4).await;
    let c = claim(&b, "r1", 10, Duration::from_secs(30)).await;
    mark_failed(
        &b,
        c.claim_token,
        &[
            failed(ids[0], "gone", true),
            failed(ids[1], "gone too", true),
            failed(ids[2], "try again later", false),
        ],
    )
    .await;
    assert_eq!(mark_processed(&b, c.claim_token, &ids[3..]).await, 1);

    // By id: only FAILED events move; a PENDING or PROCESSED one named too is left alone.
    let only_first = [ids[0], ids[2], ids[3]];
    let n = b
        .store()
        .events_retry_failed(&postbox::store::RetryFailedParams {
            target: &t,
            ids: Some(&only_first),
        })
        .await
        .unwrap();
    assert_eq!(n, 1);
    let row = b.row(ids[0]).await;
    assert_eq!((row.status.as_str(), row.retry_count), ("PENDING", 0));
    assert_eq!(row.left_ms, None, "due at once");
    assert_eq!(b.row(ids[1]).await.status, "FAILED");
    assert_eq!(b.row(ids[3]).await.status, "PROCESSED");

    // All of them.
    let n = b
        .store()
        .events_retry_failed(&postbox::store::RetryFailedParams {
            target: &t,
            ids: None,
        })
        .await
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!(b.row(ids[1]).await.status, "PENDING");
    let claimed: Vec<i64> = claim(&b, "r2", 10, Duration::from_secs(30))
        .await
        .events
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(claimed, [ids[0], ids[1]], "retried events are claimable");
}

/// Lists `filter`'s events of the default target, `limit` at a time, following the pages.
async fn list_all<B: StoreHarness>(
    b: &B,
    filter: &postbox::store::EventFilter,
    order: postbox::store::Order,
    limit: u32,
) -> Vec<i64> {
    let t = target(b);
    let mut ids = Vec::new();
    let mut after = None;
    loop {
        let page = b
            .store()
            .events_list(&postbox::store::ListParams {
                target: &t,
                filter,
                order,
                after,
                limit,
            })
            .await
            .unwrap();
        assert!(page.len() <= limit as usize);
        ids.extend(page.iter().map(|e| e.id));
        match page.last() {
            Some(last) if page.len() == limit as usize => after = Some(last.id),
            _ => return ids,
        }
    }
}

/// A conformance case; see the module docs.
pub async fn events_are_listed_by_filter_and_read_back_whole<B: StoreHarness>() {
    use postbox::store::{EventFilter, EventStatus, Order};
    let b = ready::<B>().await;
    let outbox = b.store().outbox();
    let event = |ty: &str, agg: &str, id: &str| {
        Event::new(ty, &serde_json::json!({ "agg": id }))
            .expect("event")
            .aggregate(agg, id)
            .header("traceparent", "00-abc-def-01")
    };
    let ids: Vec<i64> = b
        .enqueue(
            &outbox,
            vec![
                event("InvoiceCreated", "Invoice", "1"),
                event("InvoiceCreated", "Invoice", "2"),
                event("InvoicePaid", "Invoice", "2"),
                event("OrderPlaced", "Order", "9"),
                event("A_B", "Odd", "x"),
                event("AxB", "Odd", "y"),
            ],
        )
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.id().expect("inserted"))
        .collect();
    let c = claim(&b, "r1", 4, Duration::from_secs(30)).await;
    mark_processed(&b, c.claim_token, &ids[..2]).await;
    mark_failed(&b, c.claim_token, &[failed(ids[2], "broker said no", true)]).await;
    // ids[0] moves to the archive.
    b.backdate("outbox_events", "created_at", &ids[..1], 40)
        .await;
    assert_eq!(archive_all(&b, 30, 100, false).await.0, 1);

    let all = EventFilter::default();
    let newest: Vec<i64> = ids[1..].iter().rev().copied().collect();
    assert_eq!(
        list_all(&b, &all, Order::NewestFirst, 100).await,
        newest,
        "hot table only"
    );
    assert_eq!(
        list_all(&b, &all, Order::NewestFirst, 2).await,
        newest,
        "in pages"
    );
    let mut with_archive = EventFilter::default();
    with_archive.archive = true;
    assert_eq!(
        list_all(&b, &with_archive, Order::OldestFirst, 2).await,
        ids,
        "archive too"
    );

    let mut f = EventFilter::default();
    f.archive = true;
    f.event_type = Some("Invoice*".parse().unwrap());
    assert_eq!(list_all(&b, &f, Order::OldestFirst, 10).await, ids[..3]);
    f.aggregate_id = Some("2".into());
    assert_eq!(list_all(&b, &f, Order::OldestFirst, 10).await, ids[1..3]);
    f.statuses = vec![EventStatus::Failed];
    assert_eq!(list_all(&b, &f, Order::OldestFirst, 10).await, [ids[2]]);
    let mut f = EventFilter::default();
    f.archive = true;
    f.statuses = vec![EventStatus::Processed];
    assert_eq!(
        list_all(&b, &f, Order::OldestFirst, 10).await,
        ids[..2],
        "archived are PROCESSED"
    );
    f.statuses = vec![EventStatus::Pending, EventStatus::Processing];
    assert_eq!(list_all(&b, &f, Order::OldestFirst, 10).await, ids[3..]);
    // Globs: `_` is literal, `?` is one character, case counts.
    let mut f = EventFilter::default();
    f.event_type = Some("A_B".parse().unwrap());
    assert_eq!(list_all(&b, &f, Order::OldestFirst, 10).await, [ids[4]]);
    f.event_type = Some("A?B".parse().unwrap());
    assert_eq!(list_all(&b, &f, Order::OldestFirst, 10).await, ids[4..]);
    f.event_type = Some("invoice*".parse().unwrap());
    assert!(list_all(&b, &f, Order::OldestFirst, 10).await.is_empty());
    let mut f = EventFilter::default();
    f.aggregate_type = Some("Ord*".parse().unwrap());
    assert_eq!(list_all(&b, &f, Order::OldestFirst, 10).await, [ids[3]]);
    // Time ranges, on created_at.
    let now = chrono::Utc::now();
    let mut f = EventFilter::default();
    f.archive = true;
    f.until = Some(now - chrono::Duration::days(10));
    assert_eq!(list_all(&b, &f, Order::OldestFirst, 10).await, [ids[0]]);
    f.until = None;
    f.since = Some(now - chrono::Duration::days(10));
    assert_eq!(list_all(&b, &f, Order::OldestFirst, 10).await, ids[1..]);
    f.until = Some(now - chrono::Duration::days(20));
    let err = b
        .store()
        .events_list(&postbox::store::ListParams {
            target: &target(&b),
            filter: &f,
            order: Order::NewestFirst,
            after: None,
            limit: 10,
        })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidFilter { .. }), "{err}");

    // One event, every column, from the table or the archive.
    let t = target(&b);
    let failed_event = b
        .store()
        .event_get(&t, ids[2])
        .await
        .unwrap()
        .expect("found");
    assert_eq!(failed_event.status, "FAILED");
    assert_eq!(failed_event.event_type, "InvoicePaid");
    assert_eq!(failed_event.aggregate_id.as_deref(), Some("2"));
    assert_eq!(failed_event.last_error.as_deref(), Some("broker said no"));
    assert!(failed_event.archived_at.is_none());
    let payload: serde_json::Value = serde_json::from_str(&failed_event.payload).unwrap();
    assert_eq!(payload, serde_json::json!({ "agg": "2" }));
    let event = failed_event.to_outbox_event().unwrap();
    assert_eq!(event.headers["traceparent"], "00-abc-def-01");
    let archived = b
        .store()
        .event_get(&t, ids[0])
        .await
        .unwrap()
        .expect("found");
    assert_eq!(archived.status, "PROCESSED");
    assert!(archived.archived_at.is_some() && archived.processed_at.is_some());
    assert!(b.store().event_get(&t, 999_999).await.unwrap().is_none());
}
