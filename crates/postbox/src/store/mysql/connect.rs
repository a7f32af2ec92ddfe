//! Connecting to MySQL or MariaDB: the pool, its sessions (`READ COMMITTED`) and the check of
//! the server's version.

use std::str::FromStr;

use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPool, MySqlPoolOptions};

use super::MySqlStore;
use crate::connect::ConnectOptions;
use crate::error::{Error, Result};
use crate::store::server::probe;

/// The oldest servers with `FOR UPDATE SKIP LOCKED` (and on MySQL, invisible columns).
const NEEDED: &str = "MySQL 8.0.23 or later (SKIP LOCKED, invisible columns), or MariaDB \
                      10.6 or later (SKIP LOCKED)";

/// Which server answers: MySQL or MariaDB, and its version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ServerVersion {
    mariadb: bool,
    major: u32,
    minor: u32,
    patch: u32,
}

impl ServerVersion {
    /// Reads `SELECT VERSION()`: `8.0.36`, `8.4.0-log`, `10.11.6-MariaDB-0+deb12u1`,
    /// `5.5.5-10.6.12-MariaDB` (the prefix some proxies add).
    pub(crate) fn parse(version: &str) -> Option<ServerVersion> {
        let mariadb = version.to_ascii_lowercase().contains("mariadb");
        let text = version.strip_prefix("5.5.5-").unwrap_or(version);
        let mut parts = text
            .split(|c: char| !c.is_ascii_digit())
            .filter(|p| !p.is_empty());
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        let patch = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        Some(ServerVersion {
            mariadb,
            major,
            minor,
            patch,
        })
    }

    /// Whether the server has what the store needs.
    pub(crate) fn supported(&self) -> bool {
        if self.mariadb {
            (self.major, self.minor) >= (10, 6)
        } else {
            // 8.0.23: invisible columns (0002_retry_due.sql).
            (self.major, self.minor, self.patch) >= (8, 0, 23)
        }
    }
}

/// Refuses a server without `SKIP LOCKED`, naming the versions needed.
async fn check_version(conn: &mut MySqlConnection) -> Result<ServerVersion> {
    let version: String =
        sqlx::query_scalar(include_str!("../../../sql/mysql/queries/version.sql"))
            .fetch_one(&mut *conn)
            .await?;
    match ServerVersion::parse(&version) {
        Some(v) if v.supported() => Ok(v),
        _ => Err(Error::invalid_config(
            "database_url",
            format!("the server is version {version}; Postbox needs {NEEDED}"),
        )),
    }
}

/// Every session of a store's pool: `READ COMMITTED`, and on MySQL live `information_schema`
/// table statistics (its `AUTO_INCREMENT` is cached for a day otherwise).
async fn prepare_session(conn: &mut MySqlConnection) -> std::result::Result<(), sqlx::Error> {
    sqlx::query(include_str!("../../../sql/mysql/queries/session.sql"))
        .execute(&mut *conn)
        .await?;
    let version: String =
        sqlx::query_scalar(include_str!("../../../sql/mysql/queries/version.sql"))
            .fetch_one(&mut *conn)
            .await?;
    if ServerVersion::parse(&version).is_some_and(|v| !v.mariadb) {
        sqlx::query(include_str!("../../../sql/mysql/queries/session_mysql.sql"))
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

impl MySqlStore {
    /// Connects to `url` (`mysql://user:password@host:3306/database`), refusing a server older
    /// than MySQL 8.0.23 or MariaDB 10.6. The URL must name the database.
    pub async fn connect(url: &str) -> Result<Self> {
        let options = MySqlConnectOptions::from_str(url.trim())?;
        Self::connect_with(options, 10).await
    }

    /// Connects with `options` and a pool of at most `max_connections`.
    pub async fn connect_with(options: MySqlConnectOptions, max_connections: u32) -> Result<Self> {
        Self::connect_pool(options, max_connections, None).await
    }

    /// [`MySqlStore::connect_with`], with how long a statement waits for a free connection.
    pub(crate) async fn connect_pool(
        options: MySqlConnectOptions,
        max_connections: u32,
        acquire_timeout: Option<std::time::Duration>,
    ) -> Result<Self> {
        let mut pool = MySqlPoolOptions::new()
            .max_connections(max_connections.max(1))
            .after_connect(|conn, _| Box::pin(async move { prepare_session(conn).await }));
        if let Some(timeout) = acquire_timeout {
            pool = pool.acquire_timeout(timeout);
        }
        Self::from_pool(pool.connect_with(options).await?).await
    }

    /// A store over an existing pool. Its sessions should run at `READ COMMITTED`; on MySQL,
    /// with `information_schema_stats_expiry = 0` (the pools of [`MySqlStore::connect`] do).
    pub async fn from_pool(pool: MySqlPool) -> Result<Self> {
        let mut conn = pool.acquire().await?;
        check_version(&mut conn).await?;
        let database: Option<String> =
            sqlx::query_scalar(include_str!("../../../sql/mysql/queries/database.sql"))
                .fetch_one(&mut *conn)
                .await?;
        let database = database.ok_or_else(|| {
            Error::invalid_config(
                "database_url",
                "the MySQL URL names no database; add it, e.g. mysql://user@host:3306/app",
            )
        })?;
        drop(conn);
        Ok(MySqlStore {
            pool,
            database,
            pending_probe: std::sync::Mutex::new(None),
        })
    }

    /// The connection pool.
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }
}

impl MySqlStore {
    /// The store [`ConnectOptions::connect`] opens for a `mysql://` or `mariadb://` URL: one
    /// connection alone first, then a pool of 10 connections unless the options say otherwise.
    pub(crate) async fn from_options(o: &ConnectOptions) -> Result<Self> {
        let options = mysql_options(&o.url)?;
        probe::<MySqlConnection>(&options).await?;
        MySqlStore::connect_pool(options, o.max_connections.unwrap_or(10), o.acquire_timeout).await
    }
}

/// The options of a `mysql://` or `mariadb://` URL (sqlx reads the first spelling only).
fn mysql_options(url: &str) -> Result<MySqlConnectOptions> {
    let url = url.trim();
    let url = match url.get(..10) {
        Some(scheme) if scheme.eq_ignore_ascii_case("mariadb://") => {
            format!("mysql://{}", &url[10..])
        }
        _ => url.to_owned(),
    };
    url.parse().map_err(|e: sqlx::Error| {
        Error::invalid_config(
            "database_url",
            format!(
                "{:?} is not a valid MySQL URL: {e}",
                crate::redact::redact(&url)
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_without_skip_locked_are_refused() {
        let v = |s: &str| ServerVersion::parse(s).map(|v| v.supported());
        assert_eq!(v("8.0.36"), Some(true));
        assert_eq!(v("8.0.22"), Some(false));
        assert_eq!(v("8.0.23-log"), Some(true));
        assert_eq!(v("8.4.0-log"), Some(true));
        assert_eq!(v("5.7.44"), Some(false));
        assert_eq!(v("10.11.19-MariaDB-0+deb12u1"), Some(true));
        assert_eq!(v("10.6.12-MariaDB"), Some(true));
        assert_eq!(v("10.5.23-MariaDB"), Some(false));
        assert_eq!(v("5.5.5-10.6.12-MariaDB"), Some(true));
        assert_eq!(v("nonsense"), None);
    }
}
