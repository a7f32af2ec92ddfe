//! Test helpers for Postbox: a fresh PostgreSQL database or SQLite file per test, and scripted
//! sinks. Dev-only; never part of a release build.

mod event;
pub mod proxy;

pub use event::{TestEvent, event};

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use postbox::store::{
    Backlog, ClaimParams, Claimed, FailedMark, MarkFailedParams, MarkProcessedParams, RenewParams,
    StatusCounts, TenantAddParams, Wakeups,
};
use postbox::{OutboxEvent, PublishError, Sink};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection};

/// The server tests use: `POSTBOX_TEST_DATABASE_URL`, default `postgres://postgres@127.0.0.1:5432/postgres`.
pub fn admin_url() -> String {
    std::env::var("POSTBOX_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// A PostgreSQL database of its own for one test, dropped when the test ends.
///
/// PostgreSQL must be running; a test that cannot reach it fails (it is never skipped).
pub struct TestDb {
    name: String,
    url: String,
    pool: PgPool,
}

impl TestDb {
    /// Creates a fresh, empty database.
    pub async fn new() -> TestDb {
        let name = format!("postbox_test_{}", uuid::Uuid::new_v4().simple());
        let admin: PgConnectOptions = admin_url().parse().expect("POSTBOX_TEST_DATABASE_URL");
        let mut conn = admin
            .connect()
            .await
            .unwrap_or_else(|e| panic!("PostgreSQL is not reachable at {}: {e}", admin_url()));
        sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .execute(&mut conn)
            .await
            .expect("create test database");
        conn.close().await.ok();
        let options = admin.clone().database(&name);
        let url = format!("{}/{}", base_url(&admin_url()), name);
        let pool = PgPoolOptions::new()
            .max_connections(20)
            .connect_with(options)
            .await
            .expect("connect to test database");
        TestDb { name, url, pool }
    }

    /// A pool on the test database.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The test database's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A new pool on the test database (for a second relay, say).
    pub async fn new_pool(&self, max_connections: u32) -> PgPool {
        PgPoolOptions::new()
            .max_connections(max_connections)
            .connect(&self.url)
            .await
            .expect("connect to test database")
    }
}

fn base_url(url: &str) -> String {
    // Strip the database name (and any query) from the admin URL.
    let no_query = url.split('?').next().unwrap_or(url);
    match no_query.rfind('/') {
        Some(i) if i > "postgres://".len() => no_query[..i].to_owned(),
        _ => no_query.to_owned(),
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Drop cannot await, and the test's runtime may be single-threaded: a short-lived runtime
        // on its own thread removes the database; FORCE closes the test's own connections.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                if let Ok(mut conn) = sqlx::PgConnection::connect(&admin_url()).await {
                    let _ = sqlx::raw_sql(AssertSqlSafe(format!(
                        "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
                    )))
                    .execute(&mut conn)
                    .await;
                }
            });
        })
        .join();
    }
}

/// An SQLite database file of its own for one test, in a temporary directory removed afterwards.
pub struct TestSqlite {
    dir: tempfile::TempDir,
}

impl TestSqlite {
    /// A fresh temporary directory for the database file.
    pub fn new() -> TestSqlite {
        TestSqlite {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    /// The database file's path.
    pub fn path(&self) -> std::path::PathBuf {
        self.dir.path().join("postbox.db")
    }

    /// Opens the store.
    pub async fn store(&self) -> postbox::SqliteStore {
        postbox::SqliteStore::open(self.path())
            .await
            .expect("open sqlite")
    }
}

impl Default for TestSqlite {
    fn default() -> Self {
        Self::new()
    }
}

/// A sink that records what it published, and fails or panics for events as scripted.
#[derive(Clone, Default)]
pub struct RecordingSink {
    state: Arc<Mutex<State>>,
    calls: Arc<AtomicU64>,
}

#[derive(Default)]
struct State {
    published: Vec<OutboxEvent>,
    attempts: HashMap<i64, u32>,
    fail_types: HashMap<String, Behaviour>,
}

/// What the [`RecordingSink`] does with an event type.
#[derive(Clone, Copy, Debug)]
pub enum Behaviour {
    /// Return a retryable error.
    Fail,
    /// Return a permanent error.
    FailPermanently,
    /// Panic.
    Panic,
    /// Sleep this long before acknowledging.
    Slow(std::time::Duration),
    /// Fail the first N tries of each event, then succeed.
    FailTimes(u32),
}

impl RecordingSink {
    /// A sink that acknowledges everything.
    pub fn new() -> Self {
        Self::default()
    }

    /// Scripts the behaviour for events of `event_type`.
    pub fn script(&self, event_type: &str, behaviour: Behaviour) {
        self.state
            .lock()
            .expect("lock")
            .fail_types
            .insert(event_type.to_owned(), behaviour);
    }

    /// Events acknowledged so far, in acknowledgement order.
    pub fn published(&self) -> Vec<OutboxEvent> {
        self.state.lock().expect("lock").published.clone()
    }

    /// Ids acknowledged so far.
    pub fn published_ids(&self) -> Vec<i64> {
        self.published().iter().map(|e| e.id).collect()
    }

    /// Publish calls so far, failed ones included.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// Tries of one event so far.
    pub fn attempts(&self, id: i64) -> u32 {
        self.state
            .lock()
            .expect("lock")
            .attempts
            .get(&id)
            .copied()
            .unwrap_or(0)
    }
}

#[async_trait]
impl Sink for RecordingSink {
    async fn publish(&self, event: &OutboxEvent) -> Result<(), PublishError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let (behaviour, attempt) = {
            let mut st = self.state.lock().expect("lock");
            let n = st.attempts.entry(event.id).or_insert(0);
            *n += 1;
            let attempt = *n;
            (st.fail_types.get(&event.event_type).copied(), attempt)
        };
        match behaviour {
            Some(Behaviour::Fail) => return Err(PublishError::retryable("scripted failure")),
            Some(Behaviour::FailPermanently) => {
                return Err(PublishError::permanent("scripted permanent failure"));
            }
            Some(Behaviour::Panic) => panic!("scripted panic for event {}", event.id),
            Some(Behaviour::Slow(d)) => tokio::time::sleep(d).await,
            Some(Behaviour::FailTimes(n)) if attempt <= n => {
                return Err(PublishError::retryable(format!(
                    "scripted failure {attempt}"
                )));
            }
            _ => {}
        }
        self.state
            .lock()
            .expect("lock")
            .published
            .push(event.clone());
        Ok(())
    }
}

/// Waits until `check` returns true, polling every few milliseconds; panics with `what` if it has
/// not happened within `timeout`. Tests wait on conditions with it instead of sleeping blindly.
pub async fn wait_until<F, Fut>(what: &str, timeout: std::time::Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check().await {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting until {what}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// A [`Store`](postbox::Store) call that [`FaultyStore`] can make fail or hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StoreOp {
    /// `events_claim`.
    Claim,
    /// `leases_renew`.
    Renew,
    /// `events_mark_processed`.
    MarkProcessed,
    /// `events_mark_failed`.
    MarkFailed,
}

/// A [`Store`](postbox::Store) that delegates to another one and injects faults: calls that fail
/// as if the database were unreachable, and marks held back as if the relay had stalled.
///
/// Clones share their faults, so a test keeps one clone and gives another to a relay.
#[derive(Clone)]
pub struct FaultyStore {
    inner: Arc<dyn postbox::Store>,
    faults: Arc<Faults>,
}

struct Faults {
    failing: Mutex<HashMap<StoreOp, u64>>,
    injected: Mutex<HashMap<StoreOp, u64>>,
    calls: Mutex<HashMap<StoreOp, u64>>,
    marks_open: tokio::sync::watch::Sender<bool>,
    marks_held: AtomicU64,
}

impl FaultyStore {
    /// Wraps `inner`; no faults until scripted.
    pub fn new(inner: impl postbox::Store) -> Self {
        FaultyStore {
            inner: Arc::new(inner),
            faults: Arc::new(Faults {
                failing: Mutex::default(),
                injected: Mutex::default(),
                calls: Mutex::default(),
                marks_open: tokio::sync::watch::Sender::new(true),
                marks_held: AtomicU64::new(0),
            }),
        }
    }

    /// Makes the next `n` calls of `op` fail with a connection error (`u64::MAX`: all of them).
    pub fn fail_next(&self, op: StoreOp, n: u64) {
        self.faults.failing.lock().expect("lock").insert(op, n);
    }

    /// Failures injected into `op` so far.
    pub fn injected(&self, op: StoreOp) -> u64 {
        get(&self.faults.injected, op)
    }

    /// Calls of `op` so far, failed ones included.
    pub fn calls(&self, op: StoreOp) -> u64 {
        get(&self.faults.calls, op)
    }

    /// Holds every later mark (processed or failed) until [`FaultyStore::release_marks`]: the
    /// relay has published but stalls before recording it.
    pub fn hold_marks(&self) {
        self.faults.marks_open.send_replace(false);
    }

    /// Lets held marks through.
    pub fn release_marks(&self) {
        self.faults.marks_open.send_replace(true);
    }

    /// Mark calls waiting behind [`FaultyStore::hold_marks`] right now.
    pub fn marks_held(&self) -> u64 {
        self.faults.marks_held.load(Ordering::SeqCst)
    }

    fn enter(&self, op: StoreOp) -> postbox::Result<()> {
        *self
            .faults
            .calls
            .lock()
            .expect("lock")
            .entry(op)
            .or_insert(0) += 1;
        let mut failing = self.faults.failing.lock().expect("lock");
        match failing.get_mut(&op) {
            Some(n) if *n > 0 => {
                if *n != u64::MAX {
                    *n -= 1;
                }
                *self
                    .faults
                    .injected
                    .lock()
                    .expect("lock")
                    .entry(op)
                    .or_insert(0) += 1;
                Err(postbox::Error::Database(sqlx::Error::Io(
                    std::io::Error::new(
                        std::io::ErrorKind::ConnectionRefused,
                        format!("injected fault: {op:?} cannot reach the database"),
                    ),
                )))
            }
            _ => Ok(()),
        }
    }

    async fn gate_marks(&self) {
        let mut open = self.faults.marks_open.subscribe();
        if *open.borrow() {
            return;
        }
        self.faults.marks_held.fetch_add(1, Ordering::SeqCst);
        let _ = open.wait_for(|open| *open).await;
        self.faults.marks_held.fetch_sub(1, Ordering::SeqCst);
    }
}

fn get(map: &Mutex<HashMap<StoreOp, u64>>, op: StoreOp) -> u64 {
    map.lock().expect("lock").get(&op).copied().unwrap_or(0)
}

#[async_trait]
impl postbox::Store for FaultyStore {
    async fn schema_migrate(
        &self,
        schema: &postbox::SchemaName,
        registry: bool,
    ) -> postbox::Result<Vec<String>> {
        self.inner.schema_migrate(schema, registry).await
    }

    fn default_schema(&self) -> postbox::SchemaName {
        self.inner.default_schema()
    }

    async fn events_claim(&self, p: &ClaimParams<'_>) -> postbox::Result<Claimed> {
        self.enter(StoreOp::Claim)?;
        self.inner.events_claim(p).await
    }

    async fn leases_renew(&self, p: &RenewParams<'_>) -> postbox::Result<u64> {
        self.enter(StoreOp::Renew)?;
        self.inner.leases_renew(p).await
    }

    async fn events_mark_processed(&self, p: &MarkProcessedParams<'_>) -> postbox::Result<u64> {
        self.gate_marks().await;
        self.enter(StoreOp::MarkProcessed)?;
        self.inner.events_mark_processed(p).await
    }

    async fn events_mark_failed(
        &self,
        p: &MarkFailedParams<'_>,
    ) -> postbox::Result<Vec<FailedMark>> {
        self.gate_marks().await;
        self.enter(StoreOp::MarkFailed)?;
        self.inner.events_mark_failed(p).await
    }

    async fn events_retry_failed(
        &self,
        params: &postbox::store::RetryFailedParams<'_>,
    ) -> postbox::Result<u64> {
        self.inner.events_retry_failed(params).await
    }

    async fn status_counts(&self, target: &postbox::Target) -> postbox::Result<StatusCounts> {
        self.inner.status_counts(target).await
    }

    async fn backlog(&self, target: &postbox::Target) -> postbox::Result<Backlog> {
        self.inner.backlog(target).await
    }

    async fn tenant_add(&self, p: &TenantAddParams<'_>) -> postbox::Result<postbox::Tenant> {
        self.inner.tenant_add(p).await
    }

    async fn tenant_list(&self) -> postbox::Result<Vec<postbox::Tenant>> {
        self.inner.tenant_list().await
    }

    async fn tenant_set_status(
        &self,
        id: &postbox::TenantId,
        status: postbox::TenantStatus,
    ) -> postbox::Result<postbox::Tenant> {
        self.inner.tenant_set_status(id, status).await
    }

    async fn wakeups(&self) -> postbox::Result<Option<Box<dyn Wakeups>>> {
        self.inner.wakeups().await
    }
}
