//! Cases of getting events into the table: migrations (applied once however many relays start
//! together), a row inserted by plain SQL, an enqueued event's fields, duplicates, ids already
//! taken, batches answered in input order, and the events a store refuses without spoiling the
//! caller's transaction.

#![allow(
    clippy::unwrap_used,
    clippy::missing_panics_doc,
    reason = "a test suite fails loudly on the first unexpected error"
)]

use std::time::Duration;

use postbox::{Error, Event, event::Enqueued};

use super::StoreHarness;
use super::helpers::{claim, enqueue_n, events, ready, target};
use postbox::StoreExt;

/// A conformance case; see the module docs.
pub async fn migrate_is_idempotent<B: StoreHarness>() {
    let b = B::new().await;
    let err = b.store().status_counts(&target(&b)).await.unwrap_err();
    assert!(matches!(err, Error::NotMigrated { .. }), "{err:?}");

    // Several relays starting at once all migrate.
    let (x, y, z) = tokio::join!(
        postbox::migrate(b.store()),
        postbox::migrate(b.store()),
        postbox::migrate(b.store())
    );
    let applied: Vec<Vec<String>> = vec![x.unwrap(), y.unwrap(), z.unwrap()];
    assert_eq!(
        applied.iter().filter(|a| !a.is_empty()).count(),
        1,
        "exactly one migration run applies the migrations: {applied:?}"
    );
    let id = enqueue_n(&b, 1).await[0];
    assert_eq!(
        postbox::migrate(b.store()).await.unwrap(),
        Vec::<String>::new()
    );
    assert_eq!(
        b.row(id).await.status,
        "PENDING",
        "migrating again keeps the data"
    );
    assert_eq!(b.row_count().await, 1);
}

/// A conformance case; see the module docs.
pub async fn plain_sql_insert_is_a_valid_pending_event<B: StoreHarness>() {
    let b = ready::<B>().await;
    let id = b
        .insert_plain("InvoiceCreated", r#"{"invoice_id": 456}"#)
        .await;
    let row = b.row(id).await;
    assert_eq!(row.status, "PENDING");
    assert_eq!(row.retry_count, 0);
    assert_eq!(row.max_retries, 5);
    assert_eq!(row.schema_version, 1);
    assert_eq!(row.headers, serde_json::json!({}));
    assert_eq!(row.claim_token, None);

    let claimed = claim(&b, "r1", 10, Duration::from_secs(30)).await;
    assert_eq!(claimed.events.len(), 1);
    let e = &claimed.events[0];
    assert_eq!(e.id, id);
    assert_eq!(e.tenant, None);
    assert_eq!(e.event_type, "InvoiceCreated");
    assert_eq!(e.aggregate_type.as_deref(), Some("Invoice"));
    assert_eq!(e.aggregate_id.as_deref(), Some("456"));
    assert_eq!(e.idempotency_key, None);
    assert_eq!(e.dedup_id(), id.to_string());
    assert!(e.headers.is_empty());
    assert_eq!((e.retry_count, e.max_retries, e.schema_version), (0, 5, 1));
    assert_eq!(e.claim_token, claimed.claim_token);
    let payload: serde_json::Value = e.payload_as().unwrap();
    assert_eq!(payload, serde_json::json!({"invoice_id": 456}));
    let age = chrono::Utc::now() - e.created_at;
    assert!(
        age.num_seconds().abs() < 60,
        "created_at is UTC now: {}",
        e.created_at
    );
}

/// A conformance case; see the module docs.
pub async fn enqueued_event_keeps_its_fields<B: StoreHarness>() {
    let b = ready::<B>().await;
    let event = Event::new(
        "InvoiceCreated",
        &serde_json::json!({"invoice_id": 456, "n": [1, 2]}),
    )
    .unwrap()
    .aggregate("Invoice", "456")
    .event_class("billing::InvoiceCreated")
    .schema_version(3)
    .header("traceparent", "00-abc-01")
    .max_retries(7);
    let id = b
        .enqueue_one(&b.store().outbox(), event)
        .await
        .unwrap()
        .id()
        .unwrap();
    let claimed = claim(&b, "r1", 10, Duration::from_secs(30)).await;
    let e = &claimed.events[0];
    assert_eq!(e.id, id);
    let today = chrono::Utc::now().date_naive();
    assert_eq!(
        e.idempotency_key.as_deref(),
        Some(
            postbox::event::daily_idempotency_key("Invoice", "456", "InvoiceCreated", today)
                .as_str()
        )
    );
    assert_eq!(e.event_class.as_deref(), Some("billing::InvoiceCreated"));
    assert_eq!((e.schema_version, e.max_retries), (3, 7));
    assert_eq!(
        e.headers.get("traceparent").map(String::as_str),
        Some("00-abc-01")
    );
    let payload: serde_json::Value = e.payload_as().unwrap();
    assert_eq!(payload, serde_json::json!({"invoice_id": 456, "n": [1, 2]}));
}

/// A conformance case; see the module docs.
pub async fn duplicates_are_reported_and_stored_once<B: StoreHarness>() {
    let b = ready::<B>().await;
    let outbox = b.store().outbox();
    let keyed = |key: &str| Event::new("Paid", &1).unwrap().idempotency_key(key);
    let first = b.enqueue_one(&outbox, keyed("k1")).await.unwrap();
    assert!(matches!(first, Enqueued::Inserted(_)));
    assert_eq!(
        b.enqueue_one(&outbox, keyed("k1")).await.unwrap(),
        Enqueued::Duplicate
    );

    let daily = || {
        Event::new("InvoiceCreated", &1)
            .unwrap()
            .aggregate("Invoice", "456")
    };
    assert!(
        b.enqueue_one(&outbox, daily())
            .await
            .unwrap()
            .id()
            .is_some()
    );
    assert_eq!(
        b.enqueue_one(&outbox, daily()).await.unwrap(),
        Enqueued::Duplicate
    );

    let many = b
        .enqueue(
            &outbox,
            vec![keyed("k2"), keyed("k1"), keyed("k2"), daily(), keyed("k3")],
        )
        .await
        .unwrap();
    assert!(matches!(many[0], Enqueued::Inserted(_)), "{many:?}");
    assert_eq!(many[1..4], [Enqueued::Duplicate; 3], "{many:?}");
    assert!(matches!(many[4], Enqueued::Inserted(_)), "{many:?}");
    assert_eq!(b.row_count().await, 4);
}

/// A conformance case; see the module docs.
pub async fn an_id_that_is_taken_is_an_error_never_a_duplicate<B: StoreHarness>() {
    let b = ready::<B>().await;
    let outbox = b.store().outbox();
    let ids = enqueue_n(&b, 3).await;
    if b.rewind_ids().await {
        let keyed = Event::new("Paid", &1).unwrap().idempotency_key("fresh-key");
        for event in [events(1).remove(0), keyed] {
            let err = b.enqueue_one(&outbox, event).await.unwrap_err();
            assert!(matches!(err, Error::IdTaken { .. }), "{err:?}");
            assert!(err.to_string().contains("id sequence"), "{err}");
        }
        let err = b.enqueue(&outbox, events(2)).await.unwrap_err();
        assert!(matches!(err, Error::IdTaken { .. }), "{err:?}");
        assert_eq!(b.row_count().await, 3, "nothing was written");
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(
                b.row(*id).await.event_type,
                format!("E{i}"),
                "rows untouched"
            );
        }
    }
    // An idempotency key that exists is still a duplicate, whatever the ids.
    b.exec("UPDATE outbox_events SET idempotency_key = 'k' WHERE id = 1")
        .await;
    let again = Event::new("Paid", &1).unwrap().idempotency_key("k");
    assert_eq!(
        b.enqueue_one(&outbox, again).await.unwrap(),
        Enqueued::Duplicate
    );
}

/// A conformance case; see the module docs.
pub async fn enqueue_many_returns_results_in_input_order<B: StoreHarness>() {
    let b = ready::<B>().await;
    let outbox = b.store().outbox();
    b.enqueue_one(
        &outbox,
        Event::new("Seed", &0).unwrap().idempotency_key("dup-7"),
    )
    .await
    .unwrap();
    let batch: Vec<Event> = (0..40)
        .map(|i| {
            let e = Event::new(format!("E{i}"), &i).unwrap();
            match i % 4 {
                0 => e.without_idempotency_key(),
                1 => e.idempotency_key(format!("key-{i}")),
                2 => e.aggregate("Order", i.to_string()),
                _ if i == 7 => e.idempotency_key("dup-7"),
                _ => e.without_idempotency_key(),
            }
        })
        .collect();
    let results = b.enqueue(&outbox, batch).await.unwrap();
    assert_eq!(results.len(), 40);
    let mut last_id = 0;
    for (i, result) in results.iter().enumerate() {
        if i == 7 {
            assert_eq!(*result, Enqueued::Duplicate);
            continue;
        }
        let id = result
            .id()
            .unwrap_or_else(|| panic!("event {i} was inserted"));
        assert_eq!(
            b.row(id).await.event_type,
            format!("E{i}"),
            "result {i} names its row"
        );
        assert!(id > last_id, "ids follow the input order");
        last_id = id;
    }
    assert_eq!(b.row_count().await, 40);
    assert_eq!(
        b.enqueue(&outbox, Vec::new()).await.unwrap(),
        Vec::<Enqueued>::new()
    );
}

/// A conformance case; see the module docs.
pub async fn oversized_events_are_refused_and_nothing_is_written<B: StoreHarness>() {
    let b = ready::<B>().await;
    let outbox = b.store().outbox_builder().payload_limit(1024).build();
    let long = "x".repeat(101);
    let cases: Vec<(&str, Event)> = vec![
        ("payload", Event::new("Big", &"y".repeat(1100)).unwrap()),
        ("event_type", Event::new(long.clone(), &1).unwrap()),
        (
            "aggregate_type",
            Event::new("T", &1).unwrap().aggregate(long.clone(), "1"),
        ),
        (
            "aggregate_id",
            Event::new("T", &1).unwrap().aggregate("A", long.clone()),
        ),
        (
            "event_class",
            Event::new("T", &1).unwrap().event_class("c".repeat(256)),
        ),
        (
            "idempotency_key",
            Event::new("T", &1)
                .unwrap()
                .idempotency_key("k".repeat(256)),
        ),
    ];
    for (field, event) in cases {
        let err = b.enqueue_one(&outbox, event.clone()).await.unwrap_err();
        match &err {
            Error::InvalidEvent { field: f, .. } => assert_eq!(*f, field),
            other => panic!("{field}: expected InvalidEvent, got {other:?}"),
        }
        assert!(err.to_string().contains(field), "{err}");
        // One bad event refuses the whole batch, before anything is written.
        let batch = vec![Event::new("Good", &1).unwrap(), event];
        let err = b.enqueue(&outbox, batch).await.unwrap_err();
        assert!(matches!(err, Error::InvalidEvent { .. }), "{err:?}");
    }
    assert_eq!(b.row_count().await, 0);

    // The limits are inclusive, and count characters, not bytes.
    let at_limit = "é".repeat(100);
    let fits = Event::new(at_limit.clone(), &"y".repeat(1022))
        .unwrap()
        .aggregate(at_limit.clone(), "1");
    let id = b.enqueue_one(&outbox, fits).await.unwrap().id().unwrap();
    assert_eq!(b.row(id).await.event_type.chars().count(), 100);
    let fits = Event::new("T", &1)
        .unwrap()
        .aggregate("A", at_limit)
        .without_idempotency_key();
    assert!(b.enqueue_one(&outbox, fits).await.unwrap().id().is_some());
}

/// A conformance case; see the module docs.
pub async fn a_refused_event_leaves_the_callers_transaction_usable<B: StoreHarness>() {
    let b = ready::<B>().await;
    let outbox = b.store().outbox_builder().payload_limit(1024).build();
    let good = |n: i32| Event::new("Good", &n).unwrap().without_idempotency_key();
    let bad: Vec<(&str, Event)> = vec![
        ("payload", Event::new("T", &"y".repeat(2000)).unwrap()),
        ("payload", Event::new("T", &"nul \0 inside").unwrap()),
        ("event_type", Event::new("Nul\0Type", &1).unwrap()),
        ("aggregate_id", good(0).aggregate("Invoice", "4\0 56")),
        ("event_class", good(0).event_class("a\0b")),
        ("headers", good(0).header("traceparent", "00-\0")),
        ("headers", good(0).header("bad\0name", "v")),
        ("idempotency_key", good(0).idempotency_key("k\0")),
    ];
    let mut events = vec![good(1)];
    let fields: Vec<&str> = bad.iter().map(|(f, _)| *f).collect();
    events.extend(bad.into_iter().map(|(_, e)| e));
    events.push(good(2));
    let results = b.enqueue_each_then_commit(&outbox, events).await;
    assert!(results[0].as_ref().is_ok_and(|r| r.id().is_some()));
    for (result, field) in results[1..=fields.len()].iter().zip(&fields) {
        match result {
            Err(Error::InvalidEvent { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: expected InvalidEvent, got {other:?}"),
        }
    }
    assert!(
        results
            .last()
            .unwrap()
            .as_ref()
            .is_ok_and(|r| r.id().is_some())
    );
    assert_eq!(
        b.row_count().await,
        2,
        "the good events around the refused ones committed"
    );

    // A backslash followed by the text `u0000` is no NUL, and is stored as given.
    let lookalike = serde_json::json!({ "path": "C:\\u0000dir", "odd": "\\\\u0000" });
    let id = b
        .enqueue_one(&outbox, Event::new("Path", &lookalike).unwrap())
        .await
        .unwrap()
        .id()
        .unwrap();
    let claimed = claim(&b, "r1", 10, Duration::from_secs(30)).await;
    let e = claimed.events.iter().find(|e| e.id == id).unwrap();
    assert_eq!(e.payload_as::<serde_json::Value>().unwrap(), lookalike);
}
