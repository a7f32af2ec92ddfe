//! Test helpers for Postbox: a fresh PostgreSQL database or SQLite file per test, and scripted
//! sinks. Dev-only; never part of a release build.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
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
