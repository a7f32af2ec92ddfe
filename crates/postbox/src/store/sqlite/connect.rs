//! Opening an SQLite database: a file or an `sqlite:` URL, in WAL mode, or an existing pool.

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};

use super::SqliteStore;
use crate::connect::ConnectOptions;
use crate::error::Result;

impl SqliteStore {
    /// Opens (creating if needed) the database file at `path`, in WAL mode with a 30 s busy
    /// timeout.
    pub async fn open(path: impl AsRef<std::path::Path>) -> Result<Self> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true);
        Self::connect_with(options).await
    }

    /// Opens a database from an `sqlite:` URL, e.g. `sqlite://postbox.db`.
    pub async fn connect(url: &str) -> Result<Self> {
        let options = SqliteConnectOptions::from_str(url)?.create_if_missing(true);
        Self::connect_with(options).await
    }

    pub(super) async fn connect_with(options: SqliteConnectOptions) -> Result<Self> {
        let options = options
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(30))
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await?;
        Ok(SqliteStore { pool })
    }

    /// A store over an existing pool (it should use WAL mode and a busy timeout).
    pub fn from_pool(pool: SqlitePool) -> Self {
        SqliteStore { pool }
    }

    /// The connection pool.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }
}

impl SqliteStore {
    /// The store [`ConnectOptions::connect`] opens for an `sqlite:` URL, or for a file path
    /// ending in `.db`, `.sqlite` or `.sqlite3` (created if missing).
    pub(crate) async fn from_options(o: &ConnectOptions) -> Result<Self> {
        let url = o.url.trim();
        if url.to_ascii_lowercase().starts_with("sqlite:") {
            SqliteStore::connect(url).await
        } else {
            SqliteStore::open(url).await
        }
    }
}
