//! Connecting to an outbox database by URL: one entry point for every store this build has.

use crate::error::{Error, Result};
use crate::schema::SchemaName;
#[cfg(feature = "mysql")]
use crate::store::MySqlStore;
#[cfg(feature = "postgres")]
use crate::store::PgStore;
#[cfg(feature = "sqlite")]
use crate::store::SqliteStore;
use crate::store::Store;

/// Connects to the outbox database `url` names: `postgres://…` or `postgresql://…` for
/// PostgreSQL, `mysql://…` or `mariadb://…` for MySQL 8.0.23+ / MariaDB 10.6+, `sqlite:…` or a file
/// path ending in `.db`, `.sqlite` or `.sqlite3` for SQLite (created if missing). See [`ConnectOptions`] for the schema and the pool size.
///
/// The store hands out the producer that writes to the table its relays read
/// ([`Store::outbox`]), so the two cannot disagree on where events go.
///
/// ```no_run
/// use postbox::StoreExt;
/// # async fn example() -> postbox::Result<()> {
/// let store = postbox::connect("postgres://postgres@127.0.0.1/app").await?;
/// postbox::migrate(&store).await?;
/// let outbox = store.outbox();
/// # let _ = outbox; Ok(()) }
/// ```
pub async fn connect(url: &str) -> Result<AnyStore> {
    ConnectOptions::new(url).connect().await
}

/// How to connect: the URL, and optionally the default schema (PostgreSQL) and pool size.
///
/// ```no_run
/// # async fn example() -> postbox::Result<()> {
/// let store = postbox::ConnectOptions::new("postgres://postgres@127.0.0.1/app")
///     .schema("billing".parse()?)
///     .max_connections(8)
///     .connect()
///     .await?;
/// # let _ = store; Ok(()) }
/// ```
#[derive(Clone)]
pub struct ConnectOptions {
    url: String,
    schema: Option<SchemaName>,
    max_connections: Option<u32>,
    acquire_timeout: Option<std::time::Duration>,
}

impl std::fmt::Debug for ConnectOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectOptions")
            .field("url", &crate::redact::redact(&self.url))
            .field("schema", &self.schema)
            .field("max_connections", &self.max_connections)
            .field("acquire_timeout", &self.acquire_timeout)
            .finish()
    }
}

/// Which database a URL names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DatabaseKind {
    /// PostgreSQL: `postgres://…`, `postgresql://…`.
    Postgres,
    /// SQLite: `sqlite:…`, or a path ending in `.db`, `.sqlite` or `.sqlite3`.
    Sqlite,
    /// MySQL 8.0.23+ or MariaDB 10.6+: `mysql://…`, `mariadb://…`.
    MySql,
}

impl DatabaseKind {
    /// The kind of database `url` names, or an error that says how to write one.
    ///
    /// ```
    /// use postbox::DatabaseKind;
    /// assert_eq!(DatabaseKind::of("postgresql://db/app").unwrap(), DatabaseKind::Postgres);
    /// assert_eq!(DatabaseKind::of("outbox.db").unwrap(), DatabaseKind::Sqlite);
    /// assert_eq!(DatabaseKind::of("mysql://db/app").unwrap(), DatabaseKind::MySql);
    /// assert!(DatabaseKind::of("oracle://db/app").is_err());
    /// ```
    pub fn of(url: &str) -> Result<DatabaseKind> {
        let lower = url.trim().to_ascii_lowercase();
        if lower.starts_with("postgres://") || lower.starts_with("postgresql://") {
            return Ok(DatabaseKind::Postgres);
        }
        if lower.starts_with("mysql://") || lower.starts_with("mariadb://") {
            return Ok(DatabaseKind::MySql);
        }
        if lower.starts_with("sqlite:")
            || [".db", ".sqlite", ".sqlite3"]
                .iter()
                .any(|ext| lower.ends_with(ext))
        {
            return Ok(DatabaseKind::Sqlite);
        }
        Err(Error::invalid_config(
            "database_url",
            format!(
                "{:?} is neither a PostgreSQL URL (postgres://… or postgresql://…), a MySQL or \
                 MariaDB URL (mysql://…) nor SQLite (sqlite:… or a file path ending in .db)",
                crate::redact::redact(url)
            ),
        ))
    }
}

impl ConnectOptions {
    /// Options for `url`, with the store's defaults: schema `public` (PostgreSQL), a pool of
    /// 10 connections on PostgreSQL and MySQL and 4 on SQLite.
    pub fn new(url: impl Into<String>) -> Self {
        ConnectOptions {
            url: url.into(),
            schema: None,
            max_connections: None,
            acquire_timeout: None,
        }
    }

    /// The default schema: its outbox, and the tenant registry (PostgreSQL; default `public`).
    pub fn schema(mut self, schema: SchemaName) -> Self {
        self.schema = Some(schema);
        self
    }

    /// The most connections the store's pool opens.
    pub fn max_connections(mut self, max: u32) -> Self {
        self.max_connections = Some(max.max(1));
        self
    }

    /// How long a statement waits for a free connection of the pool before it fails (PostgreSQL
    /// and MySQL; default 30 s).
    pub fn acquire_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.acquire_timeout = Some(timeout);
        self
    }

    /// Which database the URL names.
    pub fn kind(&self) -> Result<DatabaseKind> {
        DatabaseKind::of(&self.url)
    }

    /// Connects. On PostgreSQL and MySQL one connection is opened alone first, so that a server
    /// that refuses it says why (refused, authentication failed, no such database) at once,
    /// where a pool would retry until its acquire timeout and report only that.
    pub async fn connect(&self) -> Result<AnyStore> {
        match self.kind()? {
            #[cfg(feature = "postgres")]
            DatabaseKind::Postgres => {
                let options: sqlx::postgres::PgConnectOptions =
                    self.url.trim().parse().map_err(|e: sqlx::Error| {
                        Error::invalid_config(
                            "database_url",
                            format!(
                                "{:?} is not a valid PostgreSQL URL: {e}",
                                crate::redact::redact(&self.url)
                            ),
                        )
                    })?;
                probe::<sqlx::postgres::PgConnection>(&options).await?;
                let mut pool = sqlx::postgres::PgPoolOptions::new()
                    .max_connections(self.max_connections.unwrap_or(10));
                if let Some(timeout) = self.acquire_timeout {
                    pool = pool.acquire_timeout(timeout);
                }
                let pool = pool.connect_with(options).await?;
                let schema = self.schema.clone().unwrap_or_else(SchemaName::public);
                Ok(AnyStore::Postgres(PgStore::with_schema(pool, schema)))
            }
            #[cfg(feature = "sqlite")]
            DatabaseKind::Sqlite => {
                let url = self.url.trim();
                let store = if url.to_ascii_lowercase().starts_with("sqlite:") {
                    SqliteStore::connect(url).await?
                } else {
                    SqliteStore::open(url).await?
                };
                Ok(AnyStore::Sqlite(store))
            }
            #[cfg(feature = "mysql")]
            DatabaseKind::MySql => {
                let options = mysql_options(&self.url)?;
                probe::<sqlx::mysql::MySqlConnection>(&options).await?;
                let store = MySqlStore::connect_pool(
                    options,
                    self.max_connections.unwrap_or(10),
                    self.acquire_timeout,
                )
                .await?;
                Ok(AnyStore::MySql(store))
            }
            #[allow(unreachable_patterns, reason = "a database left out of this build")]
            kind => Err(Error::invalid_config(
                "database_url",
                format!("this build of Postbox has no {kind:?} store (cargo feature)"),
            )),
        }
    }
}

/// Opens one connection alone and closes it: a server that refuses it says why at once, where
/// a pool would retry until its acquire timeout and report only that.
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn probe<C: sqlx::Connection>(options: &C::Options) -> Result<()> {
    C::connect_with(options).await?.close().await.ok();
    Ok(())
}

/// The options of a `mysql://` or `mariadb://` URL (sqlx reads the first spelling only).
#[cfg(feature = "mysql")]
pub(crate) fn mysql_options(url: &str) -> Result<sqlx::mysql::MySqlConnectOptions> {
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

/// A store on whichever database [`connect`] found at the URL.
#[non_exhaustive]
pub enum AnyStore {
    /// PostgreSQL.
    #[cfg(feature = "postgres")]
    Postgres(PgStore),
    /// SQLite.
    #[cfg(feature = "sqlite")]
    Sqlite(SqliteStore),
    /// MySQL or MariaDB.
    #[cfg(feature = "mysql")]
    MySql(MySqlStore),
}

impl std::fmt::Debug for AnyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.kind() {
            DatabaseKind::Postgres => "AnyStore::Postgres",
            DatabaseKind::Sqlite => "AnyStore::Sqlite",
            DatabaseKind::MySql => "AnyStore::MySql",
        })
    }
}

impl AnyStore {
    /// Which database it is.
    pub fn kind(&self) -> DatabaseKind {
        match *self {
            #[cfg(feature = "postgres")]
            AnyStore::Postgres(_) => DatabaseKind::Postgres,
            #[cfg(feature = "sqlite")]
            AnyStore::Sqlite(_) => DatabaseKind::Sqlite,
            #[cfg(feature = "mysql")]
            AnyStore::MySql(_) => DatabaseKind::MySql,
        }
    }

    fn inner(&self) -> &dyn Store {
        match self {
            #[cfg(feature = "postgres")]
            AnyStore::Postgres(s) => s,
            #[cfg(feature = "sqlite")]
            AnyStore::Sqlite(s) => s,
            #[cfg(feature = "mysql")]
            AnyStore::MySql(s) => s,
        }
    }
}

// Every call goes to the store inside: one forwarding list for every method of both traits, so
// a method added to either is forwarded here or this does not compile.
crate::forward_store!(AnyStore, |self| self.inner());
