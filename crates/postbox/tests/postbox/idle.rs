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

/// Inserts with `insert` after the relay has been idle past its busy period, `rounds` times, and
/// returns each round's time to publish.
async fn times_from_idle<F, Fut>(
    sink: &RecordingSink,
    rounds: usize,
    mut insert: F,
) -> Vec<Duration>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut times = Vec::with_capacity(rounds);
    for round in 0..rounds {
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
        times.push(started.elapsed());
    }
    times
}

/// The worst of `times`.
fn worst(times: &[Duration]) -> Duration {
    times.iter().copied().max().unwrap_or_default()
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
    // The default schema and the tenant take turns, twice each.
    let times = times_from_idle(&sink, 4, |round| {
        let pool = pool.clone();
        let table = if round % 2 == 1 {
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
    // Each target's row is found at once in one of its two rounds at least: the poll would take
    // seconds in both, and a stall of the machine under the whole suite meets one round.
    for (target, first) in [("the default schema", 0), ("a tenant", 1)] {
        let best = times[first].min(times[first + 2]);
        assert!(
            best < Duration::from_secs(1),
            "{best:?} for {target} ({times:?}): found by the poll, not at once"
        );
    }
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
    let worst = worst(
        &times_from_idle(&sink, 3, |_| {
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
        .await,
    );
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
    let worst = worst(
        &times_from_idle(&sink, 3, |_| {
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
        .await,
    );
    handle.stop().await.unwrap();
    assert!(
        worst < Duration::from_secs(1),
        "{worst:?}: found by the poll, not at once"
    );
}
