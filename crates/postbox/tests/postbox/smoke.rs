//! End to end on every store: committed events are published once, rolled-back ones never.

#![allow(
    clippy::unwrap_used,
    reason = "tests fail loudly on the first unexpected error"
)]

use postbox::StoreExt;
#[cfg(feature = "sqlite")]
use postbox::ops::StoreOps;
#[cfg(feature = "sqlite")]
use std::collections::HashMap;
use std::time::Duration;

use postbox::Store;
#[cfg(feature = "sqlite")]
use postbox::Target;
#[cfg(any(feature = "postgres", feature = "mysql"))]
use postbox::event::Enqueued;
use postbox::{Event, Relay, RelayConfig};
use postbox_testkit::RecordingSink;
#[cfg(feature = "postgres")]
use postbox_testkit::TestDb;
#[cfg(feature = "sqlite")]
use postbox_testkit::TestSqlite;

fn fast() -> RelayConfig {
    RelayConfig::default().poll_interval(Duration::from_millis(50))
}

/// Drains `store` to a recording sink: exactly the event `id` is published, once.
async fn drains_exactly(store: impl Store, id: i64) {
    let sink = RecordingSink::new();
    let relay = Relay::new(store, sink.clone(), fast()).unwrap();
    let stats = relay.drain(std::future::pending()).await.unwrap();
    assert_eq!(stats.published, 1);
    assert_eq!(sink.published_ids(), vec![id]);
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn postgres_commit_is_published_and_rollback_is_not() {
    let db = TestDb::new().await;
    let store = postbox::PgStore::new(db.pool().clone());
    postbox::migrate(&store).await.unwrap();
    let outbox = db.outbox();

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

    drains_exactly(store, a.id().unwrap()).await;
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sqlite_commit_is_published_and_rollback_is_not() {
    let file = TestSqlite::new();
    let store = file.store().await;
    postbox::migrate(&store).await.unwrap();
    let outbox = store.outbox();
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

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn a_relay_on_an_unmigrated_sqlite_database_stops_with_a_clear_error() {
    let file = TestSqlite::new();
    let relay = Relay::new(file.store().await, RecordingSink::new(), fast()).unwrap();
    let err = relay.run(std::future::pending()).await.unwrap_err();
    assert!(matches!(err, postbox::Error::NotMigrated { .. }), "{err}");
    assert!(err.to_string().contains("not migrated"), "{err}");
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn a_relay_on_an_unmigrated_postgres_database_stops_with_a_clear_error() {
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

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g3_two_relays_on_one_sqlite_file_publish_each_event_exactly_once() {
    let file = TestSqlite::new();
    let store = file.store().await;
    postbox::migrate(&store).await.unwrap();
    let mut tx = store.pool().begin().await.unwrap();
    store
        .outbox()
        .enqueue_many(
            &mut tx,
            (0..2000).map(|i| {
                Event::new("Bulk", &serde_json::json!({ "i": i }))
                    .unwrap()
                    .without_idempotency_key()
            }),
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let mut sinks = Vec::new();
    let mut drains = Vec::new();
    for _ in 0..2 {
        let sink = RecordingSink::new();
        sinks.push(sink.clone());
        let relay = Relay::new(file.store().await, sink, fast()).unwrap();
        drains.push(tokio::spawn(async move {
            relay.drain(std::future::pending()).await
        }));
    }
    for drain in drains {
        let stats = drain.await.unwrap().unwrap();
        assert_eq!((stats.recovered, stats.fenced), (0, 0));
    }
    let mut published: HashMap<i64, usize> = HashMap::new();
    for id in sinks.iter().flat_map(|s| s.published_ids()) {
        *published.entry(id).or_default() += 1;
    }
    assert_eq!(published.len(), 2000);
    assert!(
        published.values().all(|n| *n == 1),
        "an event was published twice"
    );
    let counts = store
        .status_counts(&Target::default_schema(store.default_schema()))
        .await
        .unwrap();
    assert_eq!(
        (counts.processed, counts.pending, counts.processing),
        (2000, 0, 0)
    );
}

/// A relay started in the background of a service: its stats are readable while it runs, and
/// stopping it returns its totals.
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn a_started_relay_reports_live_stats_and_stops_on_request() {
    let file = TestSqlite::new();
    let store = file.store().await;
    postbox::migrate(&store).await.unwrap();
    let sink = RecordingSink::new();
    let relay = Relay::new(file.store().await, sink.clone(), fast()).unwrap();
    let handle = relay.start();
    let mut tx = store.pool().begin().await.unwrap();
    let events = (0..20).map(|i| {
        Event::new("Started", &serde_json::json!({ "i": i }))
            .unwrap()
            .without_idempotency_key()
    });
    store.outbox().enqueue_many(&mut tx, events).await.unwrap();
    tx.commit().await.unwrap();
    postbox_testkit::wait_until(
        "the relay published all 20",
        Duration::from_secs(10),
        || async { handle.stats().published == 20 },
    )
    .await;
    assert!(!handle.is_finished());
    let totals = handle.stop().await.unwrap();
    assert_eq!(totals.published, 20);
    assert_eq!(sink.published_ids().len(), 20);
}

#[cfg(feature = "mysql")]
#[tokio::test]
async fn mysql_commit_is_published_and_rollback_is_not() {
    let db = postbox_testkit::TestMySql::new().await;
    let store = db.store().await;
    postbox::migrate(&store).await.unwrap();
    let outbox = store.outbox();

    let mut tx = store.pool().begin().await.unwrap();
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

    let mut tx = store.pool().begin().await.unwrap();
    outbox
        .enqueue(&mut tx, Event::new("Ghost", &2).unwrap())
        .await
        .unwrap();
    tx.rollback().await.unwrap();

    drains_exactly(store, a.id().unwrap()).await;
}

/// `postbox::connect` with a schema other than `public`: the store's producer writes to that
/// schema's table, and a relay over the same store publishes from it (store and outbox cannot
/// disagree on where events go).
#[cfg(feature = "postgres")]
#[tokio::test]
async fn connect_by_url_gives_one_schema_to_the_producer_and_the_relay() {
    let db = TestDb::new().await;
    let store = postbox::ConnectOptions::new(db.url())
        .schema("billing".parse().unwrap())
        .max_connections(4)
        .connect()
        .await
        .unwrap();
    assert_eq!(store.kind(), postbox::connect::DatabaseKind::Postgres);
    postbox::migrate(&store).await.unwrap();
    let outbox = store.outbox();
    assert_eq!(outbox.schema().as_str(), "billing");
    let mut tx = db.pool().begin().await.unwrap();
    let id = outbox
        .enqueue(&mut tx, Event::new("Billed", &1).unwrap())
        .await
        .unwrap()
        .id()
        .unwrap();
    tx.commit().await.unwrap();
    let in_billing: i64 = sqlx::query_scalar("SELECT count(*) FROM billing.outbox_events")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(in_billing, 1);
    drains_exactly(store, id).await;
}

/// `postbox::connect` on an SQLite path creates the file; its outbox and relay meet.
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn connect_by_path_opens_sqlite_for_the_producer_and_the_relay() {
    let file = TestSqlite::new();
    let path = file.path();
    let store = postbox::connect(path.to_str().unwrap()).await.unwrap();
    assert_eq!(store.kind(), postbox::connect::DatabaseKind::Sqlite);
    postbox::migrate(&store).await.unwrap();
    let pool = match &store {
        postbox::AnyStore::Sqlite(s) => s.pool().clone(),
        other => panic!("not SQLite: {other:?}"),
    };
    let mut tx = pool.begin().await.unwrap();
    let id = store
        .outbox()
        .enqueue(&mut tx, Event::new("Local", &1).unwrap())
        .await
        .unwrap()
        .id()
        .unwrap();
    tx.commit().await.unwrap();
    drains_exactly(store, id).await;
}

/// A server that refuses the connection says why, at once: not a pool timeout after the
/// acquire timeout.
#[cfg(feature = "postgres")]
#[tokio::test]
async fn connect_reports_the_servers_reason_at_once() {
    let admin = postbox_testkit::admin_url();
    let (base, _) = admin.rsplit_once('/').unwrap();
    let missing = format!("{base}/postbox_no_such_database");
    let started = std::time::Instant::now();
    let e = postbox::ConnectOptions::new(missing.as_str())
        .acquire_timeout(Duration::from_secs(20))
        .connect()
        .await
        .expect_err("no such database");
    assert!(
        e.to_string().contains("does not exist"),
        "the server's reason: {e}"
    );
    // A closed port: refused, reported as such.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let e = postbox::connect(&format!("postgres://postgres@127.0.0.1:{port}/postgres"))
        .await
        .expect_err("nothing listens");
    assert!(
        e.to_string().to_ascii_lowercase().contains("refused"),
        "{e}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "both answered at once, not after a pool timeout: {:?}",
        started.elapsed()
    );
}

/// A store reached through `connect()` — the binary's path — declares what the store itself
/// declares, and so does a wrapper of it: a relay over either claims the same way (a floor on
/// PostgreSQL and MySQL/MariaDB, a scan on SQLite).
#[tokio::test]
async fn connect_and_wrappers_keep_every_capability_of_the_store() {
    use postbox::store::Capabilities;
    use postbox_testkit::FaultyStore;

    #[cfg(feature = "postgres")]
    {
        let db = TestDb::new().await;
        let direct = postbox::PgStore::new(db.pool().clone()).capabilities();
        let connected = postbox::connect(db.url()).await.unwrap();
        assert_eq!(direct, Capabilities::SERVER);
        assert_eq!(connected.capabilities(), direct);
        assert_eq!(connected.capabilities().claim_path(), "floor");
        assert_eq!(FaultyStore::new(connected).capabilities(), direct);
    }
    #[cfg(feature = "mysql")]
    {
        let db = postbox_testkit::TestMySql::new().await;
        let direct = db.store().await.capabilities();
        let connected = postbox::connect(db.url()).await.unwrap();
        assert_eq!(direct, Capabilities::SERVER);
        assert_eq!(connected.capabilities(), direct);
        assert_eq!(FaultyStore::new(connected).capabilities(), direct);
    }
    #[cfg(feature = "sqlite")]
    {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("caps.db");
        let connected = postbox::connect(path.to_str().unwrap()).await.unwrap();
        assert_eq!(connected.capabilities(), Capabilities::EMBEDDED);
        assert_eq!(connected.capabilities().claim_path(), "scan");
        assert_eq!(
            FaultyStore::new(connected).capabilities(),
            Capabilities::EMBEDDED
        );
    }
}
