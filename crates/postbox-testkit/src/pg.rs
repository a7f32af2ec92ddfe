//! A fresh PostgreSQL database per test.

use postbox::StoreExt;
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

    /// A producer writing to the test database's default outbox (schema `public`).
    pub fn outbox(&self) -> postbox::Outbox {
        self.outbox_builder().build()
    }

    /// The settings of such a producer.
    pub fn outbox_builder(&self) -> postbox::outbox::OutboxBuilder {
        postbox::PgStore::new(self.pool.clone()).outbox_builder()
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
                // A prepared transaction a failed test left behind would block the drop, and
                // every logical slot made on the server after it (a slot waits for the
                // transactions running when it is made): roll it back, from its database.
                let own = format!("{}/{}", base_url(&admin_url()), name);
                if let Ok(mut conn) = sqlx::PgConnection::connect(&own).await {
                    let gids: Vec<String> = sqlx::query_scalar(
                        "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()",
                    )
                    .fetch_all(&mut conn)
                    .await
                    .unwrap_or_default();
                    for gid in gids {
                        let _ = sqlx::raw_sql(AssertSqlSafe(format!(
                            "ROLLBACK PREPARED '{}'",
                            gid.replace('\'', "''")
                        )))
                        .execute(&mut conn)
                        .await;
                    }
                    conn.close().await.ok();
                }
                if let Ok(mut conn) = sqlx::PgConnection::connect(&admin_url()).await {
                    // A CDC test's replication slots keep WAL and block the drop: end their
                    // readers, then drop them.
                    let _ = sqlx::query(
                        "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
                         WHERE database = $1 AND active_pid IS NOT NULL",
                    )
                    .bind(&name)
                    .execute(&mut conn)
                    .await;
                    for _ in 0..50 {
                        let left: Result<i64, _> = sqlx::query_scalar(
                            "SELECT count(*) FROM (SELECT pg_drop_replication_slot(slot_name) \
                             FROM pg_replication_slots WHERE database = $1 AND NOT active) d",
                        )
                        .bind(&name)
                        .fetch_one(&mut conn)
                        .await;
                        let active: i64 = sqlx::query_scalar(
                            "SELECT count(*) FROM pg_replication_slots WHERE database = $1",
                        )
                        .bind(&name)
                        .fetch_one(&mut conn)
                        .await
                        .unwrap_or(0);
                        if left.is_ok() && active == 0 {
                            break;
                        }
                        // A terminated reader takes a moment to release its slot.
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A test that panics with a prepared transaction of its own still gets its database
    /// dropped, and leaves no transaction behind that a logical slot made later would wait for.
    #[tokio::test]
    async fn a_database_with_a_prepared_transaction_left_is_dropped() {
        let db = TestDb::new().await;
        let name = db.name.clone();
        let mut open = sqlx::PgConnection::connect(db.url())
            .await
            .expect("connect to the test database");
        sqlx::raw_sql(
            "CREATE TABLE t (id int PRIMARY KEY); BEGIN; INSERT INTO t VALUES (1); \
             PREPARE TRANSACTION 'left-behind'",
        )
        .execute(&mut open)
        .await
        .expect("test setup");
        drop(db);
        let mut admin = sqlx::PgConnection::connect(&admin_url())
            .await
            .expect("test setup");
        let (databases, prepared): (i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM pg_database WHERE datname = $1), \
             (SELECT count(*) FROM pg_prepared_xacts WHERE database = $1)",
        )
        .bind(&name)
        .fetch_one(&mut admin)
        .await
        .expect("test setup");
        assert_eq!(
            (databases, prepared),
            (0, 0),
            "the database and its transaction are gone"
        );
    }
}
