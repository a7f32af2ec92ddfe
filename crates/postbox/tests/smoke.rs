//! End to end on both stores: committed events are published once, rolled-back ones never.

#![allow(
    clippy::unwrap_used,
    reason = "tests fail loudly on the first unexpected error"
)]

use postbox::{Enqueued, Event, Outbox, Relay, RelayConfig, Store};
use postbox_testkit::{RecordingSink, TestDb, TestSqlite};
use std::time::Duration;

fn fast() -> RelayConfig {
    RelayConfig::default().poll_interval(Duration::from_millis(50))
}

#[tokio::test]
async fn postgres_commit_is_published_and_rollback_is_not() {
    let db = TestDb::new().await;
    let store = postbox::PgStore::new(db.pool().clone());
    postbox::migrate(&store).await.unwrap();
    let outbox = Outbox::new();

    let mut tx = db.pool().begin().await.unwrap();
    let a = outbox
        .enqueue(&mut tx, Event::new("A", &1).unwrap().aggregate("X", "1"))
        .await
        .unwrap();
    let dup = outbox
        .enqueue(&mut tx, Event::new("A", &1).unwrap().aggregate("X", "1"))
        .await
        .unwrap();
    assert_eq!(dup, Enqueued::Duplicate);
    tx.commit().await.unwrap();

    let mut tx = db.pool().begin().await.unwrap();
    outbox
        .enqueue(&mut tx, Event::new("Ghost", &2).unwrap())
        .await
        .unwrap();
    tx.rollback().await.unwrap();

    let sink = RecordingSink::new();
    let relay = Relay::new(store, sink.clone(), fast()).unwrap();
    let stats = relay.drain(std::future::pending()).await.unwrap();
    assert_eq!(stats.published, 1);
    assert_eq!(sink.published_ids(), vec![a.id().unwrap()]);
}

#[tokio::test]
async fn sqlite_commit_is_published_and_rollback_is_not() {
    let file = TestSqlite::new();
    let store = file.store().await;
    postbox::migrate(&store).await.unwrap();
    let outbox = Outbox::new();
    let mut tx = store.pool().begin().await.unwrap();
    let ids = outbox
        .enqueue_many(
            &mut tx,
            [
                Event::new("A", &1).unwrap(),
                Event::new("B", &2).unwrap().aggregate("X", "1"),
            ],
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let mut tx = store.pool().begin().await.unwrap();
    outbox
        .enqueue(&mut tx, Event::new("Ghost", &2).unwrap())
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let sink = RecordingSink::new();
    let counts_before = store
        .status_counts(&postbox::Target::default_schema(store.default_schema()))
        .await
        .unwrap();
    assert_eq!(counts_before.pending, 2);
    let relay = Relay::new(store, sink.clone(), fast()).unwrap();
    relay.drain(std::future::pending()).await.unwrap();
    let mut got = sink.published_ids();
    got.sort();
    assert_eq!(got, ids.iter().map(|e| e.id().unwrap()).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_relay_on_an_unmigrated_database_stops_with_a_clear_error() {
    let file = TestSqlite::new();
    let relay = Relay::new(file.store().await, RecordingSink::new(), fast()).unwrap();
    let err = relay.run(std::future::pending()).await.unwrap_err();
    assert!(matches!(err, postbox::Error::NotMigrated { .. }), "{err}");
    assert!(err.to_string().contains("not migrated"), "{err}");

    let db = TestDb::new().await;
    let relay = Relay::new(
        postbox::PgStore::new(db.pool().clone()),
        RecordingSink::new(),
        fast(),
    )
    .unwrap();
    let err = relay.drain(std::future::pending()).await.unwrap_err();
    assert!(matches!(err, postbox::Error::NotMigrated { .. }), "{err}");
}
