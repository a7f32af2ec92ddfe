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
