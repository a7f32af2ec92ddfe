//! Helpers shared by the relay tests: a migrated database per test, enqueueing, row
//! inspection, and relays running in the background.

#![allow(
    dead_code,
    reason = "the tests of each store feature use part of the helpers"
)]

use std::collections::HashMap;
use std::time::Duration;

use postbox::{
    Event, Outbox, PgStore, Relay, RelayConfig, SchemaName, Target, backoff::Backoff,
    relay::RelayStats,
};
use postbox_testkit::{RecordingSink, TestDb, wait_until};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Short leases and backoffs, so the suite is fast.
pub(crate) fn config() -> RelayConfig {
    RelayConfig::default()
        .batch_size(100)
        .poll_interval(Duration::from_millis(50))
        .lease(Duration::from_secs(5))
        .retry(Backoff {
            base: Duration::from_millis(20),
            cap: Duration::from_millis(200),
        })
        .publish_timeout(Duration::from_secs(2))
        .tenant_refresh(Duration::from_millis(100))
}

/// A fresh, migrated database and a store on it.
pub(crate) async fn pg() -> (TestDb, PgStore) {
    let db = TestDb::new().await;
    let store = PgStore::new(db.pool().clone());
    postbox::migrate(&store).await.expect("migrate");
    (db, store)
}

/// A store on a pool of its own, as a separate relay process would have.
pub(crate) async fn own_store(db: &TestDb, connections: u32) -> PgStore {
    PgStore::new(db.new_pool(connections).await)
}

pub(crate) fn default_target() -> Target {
    Target::default_schema(SchemaName::public())
}

/// Commits `events` with `outbox` in one transaction; returns their ids.
pub(crate) async fn enqueue(db: &TestDb, outbox: &Outbox, events: Vec<Event>) -> Vec<i64> {
    let mut tx = db.pool().begin().await.expect("begin");
    let done = outbox.enqueue_many(&mut tx, events).await.expect("enqueue");
    tx.commit().await.expect("commit");
    done.into_iter()
        .map(|e| e.id().expect("inserted"))
        .collect()
}

/// Commits one unkeyed event of `event_type` with `outbox` and waits until `sink` published it
/// (a marker: the relays behind `sink` got past everything committed before it); returns its id.
pub(crate) async fn publish_marker(
    db: &TestDb,
    outbox: &Outbox,
    sink: &RecordingSink,
    event_type: &str,
) -> i64 {
    let id = enqueue(db, outbox, events(event_type, 1)).await[0];
    wait_until(
        &format!("the {event_type} marker is published"),
        Duration::from_secs(10),
        || async { sink.published_ids().contains(&id) },
    )
    .await;
    id
}

/// `n` unkeyed events of `event_type`, payload `{"i": i}`.
pub(crate) fn events(event_type: &str, n: usize) -> Vec<Event> {
    (0..n)
        .map(|i| {
            Event::new(event_type, &serde_json::json!({ "i": i }))
                .expect("event")
                .without_idempotency_key()
        })
        .collect()
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Row {
    pub(crate) status: String,
    pub(crate) retry_count: i32,
    pub(crate) last_error: Option<String>,
    pub(crate) locked_by: Option<String>,
    pub(crate) claim_token: Option<uuid::Uuid>,
}

pub(crate) async fn row(db: &TestDb, schema: &str, id: i64) -> Row {
    let (status, retry_count, last_error, locked_by, claim_token) =
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT status, retry_count, last_error, locked_by, claim_token
             FROM \"{schema}\".outbox_events WHERE id = $1"
        )))
        .bind(id)
        .fetch_one(db.pool())
        .await
        .expect("row");
    Row {
        status,
        retry_count,
        last_error,
        locked_by,
        claim_token,
    }
}

pub(crate) async fn count(db: &TestDb, status: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox_events WHERE status = $1")
        .bind(status)
        .fetch_one(db.pool())
        .await
        .expect("count")
}

/// A relay running in the background until stopped.
pub(crate) struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<postbox::Result<RelayStats>>,
    rounds: postbox::relay::Rounds,
}

impl Running {
    pub(crate) fn start(relay: Relay) -> Running {
        let rounds = relay.rounds();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            relay
                .run(async move {
                    let _ = stopped.await;
                })
                .await
        });
        Running { stop, task, rounds }
    }

    /// Waits until the relay has finished a round begun now and is waiting for its next: what
    /// it has not claimed by then, it left alone on purpose.
    pub(crate) async fn settled(&mut self, what: &str) {
        postbox_testkit::settled(&mut self.rounds, what, Duration::from_secs(10)).await;
    }

    /// The relay's rounds, to wait on.
    pub(crate) fn rounds(&mut self) -> &mut postbox::relay::Rounds {
        &mut self.rounds
    }

    /// Stops the relay without waiting for what it has in flight (a publish that hangs).
    pub(crate) fn abort(self) {
        self.task.abort();
    }

    pub(crate) async fn stop(self) -> RelayStats {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("the relay stops within 10 s of shutdown")
            .expect("the relay task did not panic")
            .expect("the relay returns Ok")
    }
}

/// How many times each id appears.
pub(crate) fn tally(ids: impl IntoIterator<Item = i64>) -> HashMap<i64, usize> {
    let mut seen = HashMap::new();
    for id in ids {
        *seen.entry(id).or_insert(0) += 1;
    }
    seen
}

/// The buffers of `outbox_events` and its indexes that `sql` touches, run once in a transaction
/// that is rolled back. Counted per relation (`pg_stat_get_xact_blocks_fetched`, hits and reads,
/// before and after within the one transaction) rather than by `EXPLAIN (BUFFERS)`, which also
/// counts the catalog pages a statement is planned from: those depend on the session's caches,
/// which other databases' DDL on the same server can reset at any moment, not on the claim.
pub(crate) async fn table_buffers(db: &TestDb, sql: &str) -> i64 {
    const FETCHED: &str = "SELECT sum(pg_stat_get_xact_blocks_fetched(c.oid))::bigint
                           FROM pg_class c
                           WHERE c.oid = 'outbox_events'::regclass
                              OR c.oid IN (SELECT i.indexrelid FROM pg_index i
                                           WHERE i.indrelid = 'outbox_events'::regclass)";
    let mut tx = db.pool().begin().await.expect("begin");
    let before: i64 = sqlx::query_scalar(FETCHED)
        .fetch_one(&mut *tx)
        .await
        .expect("buffers before");
    sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_all(&mut *tx)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    let after: i64 = sqlx::query_scalar(FETCHED)
        .fetch_one(&mut *tx)
        .await
        .expect("buffers after");
    tx.rollback().await.expect("rollback");
    after - before
}
