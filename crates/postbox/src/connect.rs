//! Connecting to an outbox database by URL: one entry point for every store this build has.
//!
//! How each database opens its store from the options is in its folder under `store/`
//! (`connect.rs` there); [`AnyStore`] lists the databases once (`any_store!` below).

use crate::error::{Error, Result};
use crate::schema::SchemaName;
use crate::store::Store;

/// Connects to the outbox database `url` names: `postgres://…` or `postgresql://…` for
/// PostgreSQL, `mysql://…` or `mariadb://…` for MySQL 8.0.23+ / MariaDB 10.6+, `sqlite:…` or a file
/// path ending in `.db`, `.sqlite` or `.sqlite3` for SQLite (created if missing). See [`ConnectOptions`] for the schema and the pool size.
///
/// The store hands out the producer that writes to the table its relays read
/// ([`StoreExt::outbox`](crate::StoreExt::outbox)), so the two cannot disagree on where events go.
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
    pub(crate) url: String,
    pub(crate) schema: Option<SchemaName>,
    pub(crate) max_connections: Option<u32>,
    pub(crate) acquire_timeout: Option<std::time::Duration>,
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
    /// use postbox::connect::DatabaseKind;
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
        AnyStore::open(self.kind()?, self).await
    }
}

/// Writes [`AnyStore`] and what goes through its variants, once for every database: each line
/// names the variant (the [`DatabaseKind`] of the same name), the store, and the cargo feature
/// that builds it. Every variant and match arm written here is compiled with that feature only:
/// the databases' features are named in this one list, and each store is gated once, at its
/// folder under `store/`, where `from_options` opens it.
macro_rules! any_store {
    ($(
        $(#[$doc:meta])*
        $variant:ident($store:ident) if feature $feature:literal;
    )*) => {
        /// A store on whichever database [`connect`] found at the URL.
        #[non_exhaustive]
        pub enum AnyStore {
            $(
                $(#[$doc])*
                #[cfg(feature = $feature)]
                $variant(crate::store::$store),
            )*
        }

        impl AnyStore {
            /// Which database it is.
            pub fn kind(&self) -> DatabaseKind {
                match *self {
                    $(
                        #[cfg(feature = $feature)]
                        AnyStore::$variant(_) => DatabaseKind::$variant,
                    )*
                }
            }

            fn inner(&self) -> &dyn Store {
                match self {
                    $(
                        #[cfg(feature = $feature)]
                        AnyStore::$variant(s) => s,
                    )*
                }
            }

            /// The store of `kind`, opened with `options`.
            async fn open(kind: DatabaseKind, options: &ConnectOptions) -> Result<AnyStore> {
                match kind {
                    $(
                        #[cfg(feature = $feature)]
                        DatabaseKind::$variant => Ok(AnyStore::$variant(
                            crate::store::$store::from_options(options).await?,
                        )),
                    )*
                    #[allow(unreachable_patterns, reason = "a database left out of this build")]
                    kind => Err(Error::invalid_config(
                        "database_url",
                        format!("this build of Postbox has no {kind:?} store (cargo feature)"),
                    )),
                }
            }
        }
    };
}

any_store! {
    /// PostgreSQL.
    Postgres(PgStore) if feature "postgres";
    /// SQLite.
    Sqlite(SqliteStore) if feature "sqlite";
    /// MySQL or MariaDB.
    MySql(MySqlStore) if feature "mysql";
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

// Every call goes to the store inside: one forwarding list for every method of both traits, so
// a method added to either is forwarded here or this does not compile.
crate::forward_store!(AnyStore, |self| self.inner());
