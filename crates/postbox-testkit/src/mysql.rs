//! A fresh MySQL/MariaDB database per test.

use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection};

/// The server tests use: `POSTBOX_TEST_MYSQL_URL`, default `mysql://root@127.0.0.1:3306/mysql`.
pub fn mysql_admin_url() -> String {
    std::env::var("POSTBOX_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/mysql".to_owned())
}

/// A MySQL or MariaDB database of its own for one test, dropped when the test ends.
///
/// The server must be running; a test that cannot reach it fails (it is never skipped).
pub struct TestMySql {
    name: String,
    url: String,
}

impl TestMySql {
    /// Creates a fresh, empty database.
    pub async fn new() -> TestMySql {
        let name = format!("postbox_test_{}", uuid::Uuid::new_v4().simple());
        let admin: MySqlConnectOptions = mysql_admin_url().parse().expect("POSTBOX_TEST_MYSQL_URL");
        let mut conn = admin.connect().await.unwrap_or_else(|e| {
            panic!(
                "MySQL/MariaDB is not reachable at {}: {e}",
                mysql_admin_url()
            )
        });
        sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE `{name}`")))
            .execute(&mut conn)
            .await
            .expect("create test database");
        conn.close().await.ok();
        let base = mysql_admin_url();
        let base = base.split('?').next().unwrap_or(&base);
        let base = base.rsplit_once('/').map_or(base, |(b, _)| b);
        TestMySql {
            url: format!("{base}/{name}"),
            name,
        }
    }

    /// The test database's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Connects the store.
    pub async fn store(&self) -> postbox::MySqlStore {
        postbox::MySqlStore::connect(&self.url)
            .await
            .expect("connect to the test database")
    }
}

impl Drop for TestMySql {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Drop cannot await, and the test's runtime may be single-threaded: a short-lived runtime
        // on its own thread removes the database.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                if let Ok(mut conn) = MySqlConnection::connect(&mysql_admin_url()).await {
                    // The test's own connections may still be open, one of them inside a
                    // transaction whose rollback waits for the test's runtime, which waits for
                    // this drop: DROP DATABASE would wait for their metadata locks for ever
                    // (seen once: 21 minutes). They are ended first, as PostgreSQL's
                    // `DROP DATABASE … WITH (FORCE)` ends them.
                    let others: Vec<i64> = sqlx::query_scalar(
                        "SELECT CAST(id AS SIGNED) FROM information_schema.processlist \
                         WHERE db = ? AND id <> CONNECTION_ID()",
                    )
                    .bind(&name)
                    .fetch_all(&mut conn)
                    .await
                    .unwrap_or_default();
                    for id in others {
                        // A number the server gave: nothing of the test's in the statement.
                        let _ = sqlx::raw_sql(AssertSqlSafe(format!("KILL {id}")))
                            .execute(&mut conn)
                            .await;
                    }
                    let _ =
                        sqlx::raw_sql(AssertSqlSafe(format!("DROP DATABASE IF EXISTS `{name}`")))
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

    /// A test that ends with one of its connections inside a transaction (its rollback queued
    /// for a runtime that waits for this drop) still gets its database dropped: the drop ends
    /// that connection first, where `DROP DATABASE` alone would wait for its metadata lock.
    #[tokio::test]
    async fn a_database_with_a_transaction_left_open_is_dropped() {
        let db = TestMySql::new().await;
        let name = db.name.clone();
        let mut open = MySqlConnection::connect(db.url())
            .await
            .expect("connect to the test database");
        sqlx::raw_sql("CREATE TABLE t (id INT PRIMARY KEY) ENGINE = InnoDB")
            .execute(&mut open)
            .await
            .expect("test setup");
        sqlx::raw_sql("BEGIN; INSERT INTO t VALUES (1)")
            .execute(&mut open)
            .await
            .expect("test setup");
        drop(db);
        let mut admin = MySqlConnection::connect(&mysql_admin_url())
            .await
            .expect("test setup");
        let left: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM information_schema.schemata WHERE schema_name = ?",
        )
        .bind(&name)
        .fetch_one(&mut admin)
        .await
        .expect("test setup");
        assert_eq!(left, 0, "the database is gone");
    }
}
