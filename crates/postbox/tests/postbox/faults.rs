//! Production faults around the claim: rows nobody validated, error texts that cannot be stored,
//! events retried for a very long time. None of them may lose an event or fail events that had
//! nothing to do with the fault.

#![allow(
    clippy::unwrap_used,
    reason = "tests fail loudly on the first unexpected error"
)]

use std::time::Duration;

use crate::common::{Running, config, count, default_target, enqueue, events, pg, row};
use postbox::{PublishError, Relay};
use postbox_testkit::{Behaviour, RecordingSink, wait_until};

/// Plain-SQL producers can store what PostgreSQL accepts and serde cannot read: headers nested
/// deeper than 128 levels, numbers like `1e400`. Each such row fails at once, alone, with a
/// reason naming the column; the rest of its batch is published in the same round. A payload
/// is forwarded as the JSON text stored, however deep it nests.
#[tokio::test]
async fn a_row_that_cannot_be_read_fails_alone_and_the_rest_of_its_batch_is_published() {
    let (db, store) = pg().await;
    let ids = enqueue(&db, &db.outbox(), events("E", 100)).await;
    let spoiled = [
        (
            ids[10],
            "headers",
            "headers = ('{\"a\": ' || repeat('[', 200) || '1' || repeat(']', 200) || '}')::jsonb",
        ),
        (ids[50], "headers", "headers = '{\"n\": 1e400}'::jsonb"),
    ];
    let deep_payload = ids[90];
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "UPDATE outbox_events SET payload = (repeat('[', 200) || '1' || repeat(']', 200))::jsonb \
         WHERE id = {deep_payload}"
    )))
    .execute(db.pool())
    .await
    .unwrap();
    for (id, _, set) in &spoiled {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "UPDATE outbox_events SET {set} WHERE id = {id}"
        )))
        .execute(db.pool())
        .await
        .unwrap();
    }
    let sink = RecordingSink::new();
    let relay = Relay::new(store, sink.clone(), config().batch_size(100)).unwrap();
    let (stats, _) = relay.batch(&default_target()).await.unwrap();
    assert_eq!(stats.published, 98, "{stats:?}");
    assert_eq!(stats.gave_up, 2, "{stats:?}");
    assert_eq!(sink.published_ids().len(), 98);
    assert!(sink.published_ids().contains(&deep_payload));
    for (id, column, _) in spoiled {
        let r = row(&db, "public", id).await;
        assert_eq!(r.status, "FAILED", "event {id}");
        let error = r.last_error.unwrap_or_default();
        assert!(error.contains(column), "event {id}: {error}");
        assert!(!sink.published_ids().contains(&id));
    }
}

/// A destination that answers with NUL bytes in its error (a binary body) or a very long one
/// still gets each failed try recorded and backed off, not left to the lease.
#[tokio::test]
async fn error_texts_with_nul_bytes_or_megabytes_are_recorded_and_backed_off() {
    let (db, store) = pg().await;
    let ids = enqueue(&db, &db.outbox(), events("Bad", 2)).await;
    let sink = RecordingSink::new();
    sink.script(
        "Bad",
        Behaviour::FailWith(PublishError::retryable(format!(
            "500 Internal Server Error: \u{0}\u{1}binary\u{0} {}",
            "x".repeat(1 << 20)
        ))),
    );
    let relay = Relay::new(store, sink.clone(), config()).unwrap();
    let (stats, _) = relay.batch(&default_target()).await.unwrap();
    assert_eq!(stats.failed_tries, 2, "{stats:?}");
    for id in ids {
        let r = row(&db, "public", id).await;
        assert_eq!((r.status.as_str(), r.retry_count), ("PENDING", 1));
        let error = r.last_error.unwrap_or_default();
        assert!(
            error.starts_with("500 Internal Server Error: \u{1}binary"),
            "{error:.60}"
        );
        assert!(error.len() <= postbox::store::MAX_ERROR_BYTES);
    }
}

/// A destination that is down is not the events' fault: while it is, they wait without
/// spending tries (with `max_retries` 2 and backoffs of tens of milliseconds, a try counted per
/// attempt would fail them all within the outage), and the relay does not churn through the
/// backlog: it claims again only when the destination's pause is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_spends_no_tries_and_everything_is_published_when_it_ends() {
    let (db, store) = pg().await;
    let events: Vec<postbox::Event> = events("Order", 500)
        .into_iter()
        .map(|e| e.max_retries(2))
        .collect();
    let ids = enqueue(&db, &db.outbox(), events).await;
    let sink = RecordingSink::new();
    sink.script(
        "Order",
        Behaviour::FailWith(
            PublishError::unavailable("connection refused")
                .with_retry_after(Duration::from_millis(400)),
        ),
    );
    let running = Running::start(Relay::new(store, sink.clone(), config()).unwrap());
    // The subject: an outage of 1.5 s, during which the publishes are counted.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let attempts_during_outage = sink.calls();
    let failed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox_events WHERE status = 'FAILED' OR retry_count > 0",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(failed, 0, "no try was spent on the outage");
    // One batch per pause (400 ms), not the whole backlog at full speed.
    assert!(
        (100..=500).contains(&attempts_during_outage),
        "{attempts_during_outage} publishes during the outage"
    );
    sink.unscript("Order");
    wait_until(
        "every event is published",
        Duration::from_secs(20),
        || async { count(&db, "PROCESSED").await == ids.len() as i64 },
    )
    .await;
    let stats = running.stop().await;
    assert!(stats.deferred >= 100, "{stats:?}");
    assert_eq!((stats.failed_tries, stats.gave_up), (0, 0), "{stats:?}");
}

/// A drain whose destination stays down gives up after its patience, with the reason, and
/// leaves every event PENDING with no try spent; one that comes back in time is waited for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_waits_out_a_short_outage_and_gives_up_on_a_long_one() {
    let (db, store) = pg().await;
    let ids = enqueue(&db, &db.outbox(), events("Order", 20)).await;
    let sink = RecordingSink::new();
    let down = || {
        Behaviour::FailWith(
            PublishError::unavailable("connection refused by broker-1")
                .with_retry_after(Duration::from_millis(100)),
        )
    };
    sink.script("Order", down());
    let relay = Relay::new(
        store,
        sink.clone(),
        config().drain_patience(Duration::from_millis(800)),
    )
    .unwrap();
    let started = std::time::Instant::now();
    let err = relay.drain(std::future::pending()).await.unwrap_err();
    assert!(started.elapsed() >= Duration::from_millis(800));
    match &err {
        postbox::Error::Unavailable {
            deferred, reason, ..
        } => {
            assert!(*deferred >= 20, "{err}");
            assert!(reason.contains("connection refused by broker-1"), "{err}");
        }
        other => panic!("expected Unavailable, got {other}"),
    }
    assert!(err.to_string().contains("stay PENDING"), "{err}");
    let untouched: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox_events WHERE status = 'PENDING' AND retry_count = 0",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(untouched, ids.len() as i64);

    // Down for less than the patience: the drain waits, then publishes everything.
    let back = {
        let sink = sink.clone();
        tokio::spawn(async move {
            // The subject: the destination is down for 400 ms.
            tokio::time::sleep(Duration::from_millis(400)).await;
            sink.unscript("Order");
        })
    };
    let stats = relay.drain(std::future::pending()).await.unwrap();
    back.await.unwrap();
    assert_eq!(stats.published, ids.len() as u64, "{stats:?}");
    assert_eq!(count(&db, "PROCESSED").await, ids.len() as i64);
}

/// One event whose publish hangs (until `publish_timeout`) holds up only itself: the rest of
/// its batch and the batches after it are published and recorded meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_publish_does_not_hold_up_the_events_behind_it() {
    let (db, store) = pg().await;
    let hang = enqueue(&db, &db.outbox(), events("Hang", 1)).await[0];
    let fast = enqueue(&db, &db.outbox(), events("Fast", 300)).await;
    let sink = RecordingSink::new();
    sink.script("Hang", Behaviour::Slow(Duration::from_secs(30)));
    let cfg = config()
        .publish_timeout(Duration::from_secs(4))
        .lease(Duration::from_secs(10));
    let running = Running::start(Relay::new(store, sink.clone(), cfg).unwrap());
    let started = std::time::Instant::now();
    wait_until(
        "the 300 fast events are published and recorded",
        Duration::from_secs(3),
        || async { count(&db, "PROCESSED").await == fast.len() as i64 },
    )
    .await;
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(row(&db, "public", hang).await.status, "PROCESSING");
    running.stop().await;
}
