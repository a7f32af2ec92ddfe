//! Handlers and sinks that fail, panic or hang (G5), and what in-process handlers receive.
//!
//! Each test has a database of its own and waits on conditions, never on guessed sleeps.

#![allow(
    clippy::unwrap_used,
    reason = "tests fail loudly on the first unexpected error"
)]

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{Running, config, count, enqueue, events, pg, row};
use postbox::{
    Event, OutboxEvent, PublishError, Relay, Sink, event::DomainEvent, handlers::Handlers,
    relay::RelayStats,
};
use postbox_testkit::{Behaviour, RecordingSink, TestDb, wait_until};
use serde::{Deserialize, Serialize};

/// Runs `relay` until the events `failing` are all `FAILED`, checks that it still publishes a new
/// event afterwards, and returns its stats.
async fn relay_survives_failures(
    db: &TestDb,
    relay: Relay,
    failing: &[i64],
    probe_sink: &RecordingSink,
) -> RelayStats {
    let running = Running::start(relay);
    wait_until(
        "the failing events are FAILED",
        Duration::from_secs(10),
        || async {
            for id in failing {
                if row(db, "public", *id).await.status != "FAILED" {
                    return false;
                }
            }
            true
        },
    )
    .await;
    let after = enqueue(db, &db.outbox(), events("After", 1)).await[0];
    wait_until(
        "an event enqueued afterwards is published",
        Duration::from_secs(10),
        || async { probe_sink.published_ids().contains(&after) },
    )
    .await;
    running.stop().await
}

#[tokio::test]
async fn a_panicking_handler_counts_failed_tries_and_the_relay_keeps_publishing() {
    let (db, store) = pg().await;
    let outbox = db.outbox();
    let boom = enqueue(
        &db,
        &outbox,
        vec![
            Event::new("Boom", &1).unwrap().max_retries(3),
            Event::new("BoomEarly", &1).unwrap().max_retries(3),
        ],
    )
    .await;
    let fine = enqueue(&db, &outbox, events("Fine", 5)).await;
    let probe = RecordingSink::new();
    let handlers = Handlers::new()
        .on_type("Boom", |e: Arc<OutboxEvent>| async move {
            if e.id > 0 {
                panic!("handler exploded on event {}", e.id);
            }
            Ok::<_, std::io::Error>(())
        })
        .on_type(
            "BoomEarly",
            |e: Arc<OutboxEvent>| -> std::future::Ready<Result<(), std::io::Error>> {
                panic!("handler exploded before its future, on event {}", e.id)
            },
        )
        .on_type("Fine", |_| async { Ok::<_, std::io::Error>(()) })
        .on_type("After", {
            let probe = probe.clone();
            move |e: Arc<OutboxEvent>| {
                let probe = probe.clone();
                async move { probe.publish(&e).await }
            }
        });
    let relay = Relay::new(store, handlers, config()).unwrap();
    let stats = relay_survives_failures(&db, relay, &boom, &probe).await;

    for (id, message) in boom
        .iter()
        .zip(["handler exploded on event", "before its future"])
    {
        let r = row(&db, "public", *id).await;
        assert_eq!(r.retry_count, 3, "every panic is a counted try");
        let error = r.last_error.unwrap();
        assert!(
            error.contains("panicked") && error.contains(message),
            "{error}"
        );
    }
    for id in fine {
        assert_eq!(row(&db, "public", id).await.status, "PROCESSED");
    }
    assert_eq!((stats.failed_tries, stats.gave_up), (6, 2));
}

#[tokio::test]
async fn a_panicking_sink_counts_failed_tries_and_the_relay_keeps_publishing() {
    let (db, store) = pg().await;
    let outbox = db.outbox();
    let boom = enqueue(
        &db,
        &outbox,
        vec![Event::new("Boom", &1).unwrap().max_retries(2)],
    )
    .await;
    let fine = enqueue(&db, &outbox, events("Fine", 5)).await;
    let sink = RecordingSink::new();
    sink.script("Boom", Behaviour::Panic);
    let relay = Relay::new(store, sink.clone(), config()).unwrap();
    let stats = relay_survives_failures(&db, relay, &boom, &sink).await;

    let r = row(&db, "public", boom[0]).await;
    assert_eq!(r.retry_count, 2);
    assert_eq!(sink.attempts(boom[0]), 2);
    let error = r.last_error.unwrap();
    assert!(
        error.contains("panicked") && error.contains("scripted panic"),
        "{error}"
    );
    let published: HashSet<i64> = sink.published_ids().into_iter().collect();
    assert!(fine.iter().all(|id| published.contains(id)));
    assert_eq!((stats.failed_tries, stats.gave_up), (2, 1));
}

#[tokio::test]
async fn a_handler_timeout_counts_as_a_failed_try() {
    let (db, store) = pg().await;
    let slow = enqueue(
        &db,
        &db.outbox(),
        vec![Event::new("Slow", &1).unwrap().max_retries(2)],
    )
    .await[0];
    let handlers = Handlers::new()
        .timeout(Duration::from_millis(100))
        .on_type("Slow", |_| async {
            // The subject: a handler that hangs past its timeout.
            tokio::time::sleep(Duration::from_secs(30)).await;
            Ok::<_, std::io::Error>(())
        });
    let relay = Relay::new(store, handlers, config()).unwrap();
    let started = Instant::now();
    let stats = relay.drain(std::future::pending()).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    let r = row(&db, "public", slow).await;
    assert_eq!((r.status.as_str(), r.retry_count), ("FAILED", 2));
    assert!(r.last_error.unwrap().contains("timed out"));
    assert_eq!(stats.failed_tries, 2);
}

#[tokio::test]
async fn a_publish_timeout_counts_as_a_failed_try() {
    let (db, store) = pg().await;
    let slow = enqueue(
        &db,
        &db.outbox(),
        vec![Event::new("Slow", &1).unwrap().max_retries(2)],
    )
    .await[0];
    let sink = RecordingSink::new();
    sink.script("Slow", Behaviour::Slow(Duration::from_secs(30)));
    let cfg = config()
        .publish_timeout(Duration::from_millis(100))
        .lease(Duration::from_millis(600));
    let relay = Relay::new(store, sink.clone(), cfg).unwrap();
    relay.drain(std::future::pending()).await.unwrap();
    let r = row(&db, "public", slow).await;
    assert_eq!((r.status.as_str(), r.retry_count), ("FAILED", 2));
    assert!(r.last_error.unwrap().contains("timed out"));
    assert_eq!(sink.attempts(slow), 2);
    assert!(sink.published().is_empty());
}

// ---- handlers ------------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct InvoiceCreated {
    invoice_id: i64,
    amount_cents: i64,
}

impl DomainEvent for InvoiceCreated {
    const EVENT_TYPE: &'static str = "InvoiceCreated";
    const AGGREGATE_TYPE: &'static str = "Invoice";
    fn aggregate_id(&self) -> Option<String> {
        Some(self.invoice_id.to_string())
    }
}

#[tokio::test]
async fn typed_handlers_get_their_payload_and_catch_all_handlers_see_every_event() {
    let (db, store) = pg().await;
    let invoices: Vec<InvoiceCreated> = (1..=3)
        .map(|i| InvoiceCreated {
            invoice_id: i,
            amount_cents: i * 100,
        })
        .collect();
    let mut all = enqueue(
        &db,
        &db.outbox(),
        invoices
            .iter()
            .map(|i| Event::from_domain(i).unwrap())
            .collect(),
    )
    .await;
    all.extend(enqueue(&db, &db.outbox(), events("Other", 2)).await);

    let typed = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let handlers = Handlers::new()
        .on({
            let typed = typed.clone();
            move |e: InvoiceCreated| {
                typed.lock().unwrap().push(e);
                async { Ok::<_, std::io::Error>(()) }
            }
        })
        .on_any({
            let seen = seen.clone();
            move |e: Arc<OutboxEvent>| {
                seen.lock().unwrap().push((e.id, e.event_type.clone()));
                async { Ok::<_, std::io::Error>(()) }
            }
        });
    let relay = Relay::new(store, handlers, config()).unwrap();
    let stats = relay.drain(std::future::pending()).await.unwrap();

    let mut typed = typed.lock().unwrap().clone();
    typed.sort_by_key(|e| e.invoice_id);
    assert_eq!(typed, invoices);
    let mut seen_ids: Vec<i64> = seen.lock().unwrap().iter().map(|(id, _)| *id).collect();
    seen_ids.sort_unstable();
    assert_eq!(seen_ids, all);
    assert_eq!(stats.published, 5);
    assert_eq!(count(&db, "PROCESSED").await, 5);
}

#[tokio::test]
async fn events_no_handler_can_take_fail_permanently() {
    let (db, store) = pg().await;
    let outbox = db.outbox();
    let ok = enqueue(
        &db,
        &outbox,
        vec![
            Event::from_domain(&InvoiceCreated {
                invoice_id: 1,
                amount_cents: 5,
            })
            .unwrap(),
        ],
    )
    .await[0];
    let unhandled = enqueue(&db, &outbox, events("NobodyListens", 1)).await[0];
    let garbled = enqueue(
        &db,
        &outbox,
        vec![Event::new("InvoiceCreated", &serde_json::json!({"invoice": "one"})).unwrap()],
    )
    .await[0];
    let rejected = enqueue(&db, &outbox, events("Rejected", 1)).await[0];
    let retried = enqueue(
        &db,
        &outbox,
        vec![Event::new("Flaky", &1).unwrap().max_retries(3)],
    )
    .await[0];

    let handlers = Handlers::new()
        .on(|_: InvoiceCreated| async { Ok::<_, std::io::Error>(()) })
        .on_type("Rejected", |_| async {
            Err::<(), _>(PublishError::permanent("400: schema mismatch"))
        })
        .on_type("Flaky", |_| async {
            Err::<(), _>(std::io::Error::other("connection reset"))
        });
    let relay = Relay::new(store, handlers, config()).unwrap();
    relay.drain(std::future::pending()).await.unwrap();

    assert_eq!(row(&db, "public", ok).await.status, "PROCESSED");
    for (id, reason) in [
        (unhandled, "no handler"),
        (garbled, "does not deserialize"),
        (rejected, "schema mismatch"),
    ] {
        let r = row(&db, "public", id).await;
        assert_eq!(
            (r.status.as_str(), r.retry_count),
            ("FAILED", 1),
            "event {id} fails at its first try"
        );
        let error = r.last_error.unwrap();
        assert!(error.contains(reason), "{error}");
    }
    let r = row(&db, "public", retried).await;
    assert_eq!(
        (r.status.as_str(), r.retry_count),
        ("FAILED", 3),
        "a plain error is retried"
    );
    assert!(r.last_error.unwrap().contains("connection reset"));
}
