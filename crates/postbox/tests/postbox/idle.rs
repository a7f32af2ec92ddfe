//! Fast from idle for every producer: a row inserted by plain SQL (no `NOTIFY`) into an outbox
//! the relay has not heard from for a while is found by the relay's cheap look at the id
//! sequences, not by its `poll_interval`; on PostgreSQL, for the default schema and a tenant,
//! on SQLite and on MySQL.

#![allow(
    clippy::unwrap_used,
    reason = "tests fail loudly on the first unexpected error"
)]

use std::time::{Duration, Instant};

use postbox::{Relay, RelayConfig};
use postbox_testkit::{RecordingSink, wait_until};

/// A relay that would otherwise find plain-SQL rows only at its 5 s poll.
fn config() -> RelayConfig {
    RelayConfig::default()
        .poll_interval(Duration::from_secs(5))
        .busy_period(Duration::from_millis(200))
        .tenant_refresh(Duration::from_millis(100))
}

/// Inserts with `insert` after the relay has been idle past its busy period, three times, and
/// returns the worst time to publish.
async fn worst_from_idle<F, Fut>(sink: &RecordingSink, mut insert: F) -> Duration
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut worst = Duration::ZERO;
    for round in 0..3 {
        // The wait is the subject: idle for longer than the busy period (200 ms), so that only
        // the look at the id sequences can find the row before the 5 s poll.
        tokio::time::sleep(Duration::from_millis(600)).await;
        let published = sink.published().len();
        let started = Instant::now();
        insert(round).await;
        wait_until(
            "the plain-SQL row is published",
            Duration::from_secs(10),
            || async { sink.published().len() > published },
        )
        .await;
        worst = worst.max(started.elapsed());
    }
    worst
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_sql_rows_are_found_fast_after_idle_on_postgres() {
    let db = postbox_testkit::TestDb::new().await;
    use postbox::ops::StoreOps as _;
    let store = postbox::PgStore::new(db.pool().clone());
    postbox::migrate(&store).await.unwrap();
    let acme = store
        .tenant_add(&postbox::store::TenantAddParams::new(
            &postbox::schema::TenantId::new("acme").unwrap(),
        ))
        .await
        .unwrap();
    let sink = RecordingSink::new();
    let relay = Relay::new(store, sink.clone(), config()).unwrap();
    let handle = relay.start();
    postbox_testkit::settled(
        &mut handle.rounds(),
        "the relay started",
        Duration::from_secs(10),
    )
    .await;
    let pool = db.pool().clone();
    let worst = worst_from_idle(&sink, |round| {
        let pool = pool.clone();
        let table = if round == 1 {
            format!("{}.outbox_events", acme.schema.quoted())
        } else {
            "outbox_events".to_owned()
        };
        async move {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO {table} (event_type, aggregate_type, aggregate_id, payload)
                 VALUES ('Plain', 'Order', '1', '{{}}')"
            )))
            .execute(&pool)
            .await
            .unwrap();
        }
    })
    .await;
    handle.stop().await.unwrap();
    assert!(
        worst < Duration::from_secs(1),
        "{worst:?}: found by the poll, not at once"
    );
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_sql_rows_are_found_fast_after_idle_on_sqlite() {
    let file = postbox_testkit::TestSqlite::new();
    let store = file.store().await;
    postbox::migrate(&store).await.unwrap();
    let pool = store.pool().clone();
    let sink = RecordingSink::new();
    let relay = Relay::from_parts(
        std::sync::Arc::new(store),
        std::sync::Arc::new(sink.clone()),
        config(),
    )
    .unwrap();
    let handle = relay.start();
    postbox_testkit::settled(
        &mut handle.rounds(),
        "the relay started",
        Duration::from_secs(10),
    )
    .await;
    let worst = worst_from_idle(&sink, |_| {
        let pool = pool.clone();
        async move {
            sqlx::query(
                "INSERT INTO outbox_events (event_type, aggregate_type, aggregate_id, payload)
                 VALUES ('Plain', 'Order', '1', '{}')",
            )
            .execute(&pool)
            .await
            .unwrap();
        }
    })
    .await;
    handle.stop().await.unwrap();
    assert!(
        worst < Duration::from_secs(1),
        "{worst:?}: found by the poll, not at once"
    );
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_sql_rows_are_found_fast_after_idle_on_mysql() {
    let db = postbox_testkit::TestMySql::new().await;
    let store = db.store().await;
    postbox::migrate(&store).await.unwrap();
    let pool = store.pool().clone();
    let sink = RecordingSink::new();
    let relay = Relay::new(store, sink.clone(), config()).unwrap();
    let handle = relay.start();
    postbox_testkit::settled(
        &mut handle.rounds(),
        "the relay started",
        Duration::from_secs(10),
    )
    .await;
    let worst = worst_from_idle(&sink, |_| {
        let pool = pool.clone();
        async move {
            sqlx::query(
                "INSERT INTO outbox_events (event_type, aggregate_type, aggregate_id, payload)
                 VALUES ('Plain', 'Order', '1', '{}')",
            )
            .execute(&pool)
            .await
            .unwrap();
        }
    })
    .await;
    handle.stop().await.unwrap();
    assert!(
        worst < Duration::from_secs(1),
        "{worst:?}: found by the poll, not at once"
    );
}
