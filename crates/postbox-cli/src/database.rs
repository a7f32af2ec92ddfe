//! Which database a `database_url` names, and connecting to it as a [`postbox::Store`].

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use postbox::{SchemaName, Store, StoreExt, Target};
use sqlx::mysql::{MySqlConnectOptions, MySqlPool};
use sqlx::postgres::{PgConnectOptions, PgPool};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};

/// The SQLite file used when no `database_url` is configured.
pub(crate) const DEFAULT_SQLITE_FILE: &str = "postbox.db";

/// Connections a CLI process opens to PostgreSQL (or MySQL) at most: a relay claims and marks one batch at
/// a time and holds one more for NOTIFY, so a few are plenty and many relays fit the server.
const MAX_CONNECTIONS: u32 = 4;

/// Where the outbox lives, parsed from `database_url` without connecting.
#[derive(Clone)]
pub(crate) enum Location {
    /// A PostgreSQL server: its options (for messages) and the URL as configured.
    Postgres(Box<PgConnectOptions>, String),
    /// A MySQL 8.0.23+ or MariaDB 10.6+ server: its options (for messages) and the URL.
    MySql(Box<MySqlConnectOptions>, String),
    /// An SQLite database.
    Sqlite {
        /// The URL or path as configured.
        url: String,
        /// The database file (absent for an in-memory database).
        file: Option<PathBuf>,
    },
}

impl Location {
    /// Reads `database_url`: none → the SQLite file `postbox.db` in the working directory;
    /// `postgres://`/`postgresql://` → PostgreSQL; `mysql://`/`mariadb://` → MySQL or MariaDB;
    /// `sqlite:` or a path ending in `.db`, `.sqlite` or `.sqlite3` → SQLite.
    /// `url` is the URL with its password (`DatabaseUrl::expose`); errors show it without.
    pub(crate) fn parse(url: Option<&str>) -> anyhow::Result<Location> {
        let Some(exposed) = url else {
            return Ok(Location::sqlite_file(DEFAULT_SQLITE_FILE));
        };
        let raw = exposed.trim();
        let url = postbox::redact::redact(raw);
        // The library's rule for what a URL names, so that the binary and a service agree.
        let kind = postbox::connect::DatabaseKind::of(raw).map_err(|_| {
            anyhow::anyhow!(
                "{url:?} is neither a PostgreSQL URL (postgres://… or postgresql://…), a MySQL or \
                 MariaDB URL (mysql://…) nor SQLite (sqlite:… or a file path ending in .db)"
            )
        })?;
        match kind {
            postbox::connect::DatabaseKind::Postgres => {
                let options = PgConnectOptions::from_str(raw)
                    .with_context(|| format!("{url} is not a valid PostgreSQL URL"))?;
                Ok(Location::Postgres(Box::new(options), raw.to_owned()))
            }
            postbox::connect::DatabaseKind::MySql => {
                let raw = match raw.get(..10) {
                    Some(s) if s.eq_ignore_ascii_case("mariadb://") => {
                        format!("mysql://{}", &raw[10..])
                    }
                    _ => raw.to_owned(),
                };
                let options = MySqlConnectOptions::from_str(&raw)
                    .with_context(|| format!("{url} is not a valid MySQL URL"))?;
                if options.get_database().is_none() {
                    bail!("{url} names no database; add it, e.g. mysql://user@host:3306/app");
                }
                Ok(Location::MySql(
                    Box::new(options),
                    exposed.trim().to_owned(),
                ))
            }
            _ if raw.to_ascii_lowercase().starts_with("sqlite:") => {
                let lower = raw.to_ascii_lowercase();
                let options = SqliteConnectOptions::from_str(raw)
                    .with_context(|| format!("{url} is not a valid SQLite URL"))?;
                let memory = lower.contains(":memory:") || lower.contains("mode=memory");
                Ok(Location::Sqlite {
                    url: raw.to_owned(),
                    file: (!memory).then(|| options.get_filename().to_owned()),
                })
            }
            _ => Ok(Location::sqlite_file(raw)),
        }
    }

    /// The database and schema of the default outbox, for the CloudEvents `source` of the
    /// sinks (`/postbox/{database}/{schema}`): PostgreSQL's database (the user's name when the
    /// URL names none) and `schema`; MySQL's database, which is its schema too; SQLite's file
    /// name without its extension (`memory` in memory) and `main`.
    pub(crate) fn origin(
        &self,
        schema: &postbox::SchemaName,
    ) -> postbox_sinks::cloudevents::Origin {
        let (database, schema) = match self {
            Location::Postgres(o, _) => (
                o.get_database().unwrap_or(o.get_username()).to_owned(),
                schema.to_string(),
            ),
            Location::MySql(o, _) => {
                let database = o.get_database().unwrap_or_default().to_owned();
                (database.clone(), database)
            }
            Location::Sqlite { file, .. } => (
                file.as_deref()
                    .and_then(|f| f.file_stem())
                    .map_or_else(|| "memory".to_owned(), |s| s.to_string_lossy().into_owned()),
                "main".to_owned(),
            ),
        };
        postbox_sinks::cloudevents::Origin { database, schema }
    }

    /// An SQLite database file at `path`.
    fn sqlite_file(path: &str) -> Location {
        Location::Sqlite {
            url: path.to_owned(),
            file: Some(PathBuf::from(path)),
        }
    }
}

impl fmt::Display for Location {
    /// Shows where the database is, never its password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Postgres(o, _) => write!(
                f,
                "PostgreSQL postgres://{}@{}:{}/{}",
                o.get_username(),
                o.get_host(),
                o.get_port(),
                o.get_database().unwrap_or("")
            ),
            Location::MySql(o, _) => write!(
                f,
                "MySQL mysql://{}@{}:{}/{}",
                o.get_username(),
                o.get_host(),
                o.get_port(),
                o.get_database().unwrap_or("")
            ),
            Location::Sqlite { file: Some(p), .. } => write!(f, "SQLite file {}", p.display()),
            Location::Sqlite { url, .. } => write!(f, "SQLite {url}"),
        }
    }
}

/// The pool behind a [`Database`], for the few commands that run their own SQL (the demo).
#[derive(Clone)]
pub(crate) enum Pool {
    /// PostgreSQL.
    Postgres(PgPool),
    /// SQLite.
    Sqlite(SqlitePool),
    /// MySQL or MariaDB.
    MySql(MySqlPool),
}

impl Pool {
    /// Closes every connection (before removing the database's files, say).
    pub(crate) async fn close(&self) {
        match self {
            Pool::Postgres(p) => p.close().await,
            Pool::Sqlite(p) => p.close().await,
            Pool::MySql(p) => p.close().await,
        }
    }
}

/// A connected outbox database.
#[derive(Clone)]
pub(crate) struct Database {
    /// The store the library works through.
    pub(crate) store: Arc<dyn Store>,
    /// The same connections, for plain SQL.
    pub(crate) pool: Pool,
    /// Where it is (for messages; no password).
    pub(crate) location: String,
}

/// Whether connecting may create a missing SQLite file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Create {
    /// Create it (`migrate`, `relay --migrate`).
    IfMissing,
    /// Refuse: the caller expects a migrated database.
    Never,
}

impl Database {
    /// Connects; `schema` is the default schema on PostgreSQL (SQLite has one outbox per file).
    pub(crate) async fn connect(
        location: &Location,
        schema: SchemaName,
        create: Create,
    ) -> anyhow::Result<Database> {
        let shown = location.to_string();
        let url = match location {
            Location::Postgres(_, url) | Location::MySql(_, url) => url,
            Location::Sqlite { url, file } => {
                if let Some(file) = file
                    && create == Create::Never
                    && !file.exists()
                {
                    bail!(
                        "there is no database at {}; create it with `postbox migrate` (or set \
                         database_url / POSTBOX_DATABASE_URL)",
                        file.display()
                    );
                }
                url
            }
        };
        if schema != SchemaName::public() && !matches!(location, Location::Postgres(..)) {
            tracing::warn!(
                %schema,
                "the `schema` setting is ignored on {}: the outbox is in the database the URL names",
                if matches!(location, Location::MySql(..)) { "MySQL" } else { "SQLite" }
            );
        }
        // The library's connect: the same stores, pools and first-connection errors as a
        // service's.
        let store = postbox::ConnectOptions::new(url.as_str())
            .schema(schema)
            .max_connections(MAX_CONNECTIONS)
            .acquire_timeout(Duration::from_secs(5))
            .connect()
            .await
            .with_context(|| format!("cannot connect to {shown}"))?;
        tracing::debug!(database = %shown, "connected");
        let pool = match &store {
            postbox::AnyStore::Postgres(s) => Pool::Postgres(s.pool().clone()),
            postbox::AnyStore::MySql(s) => Pool::MySql(s.pool().clone()),
            postbox::AnyStore::Sqlite(s) => Pool::Sqlite(s.pool().clone()),
            other => bail!("{shown}: no store for {:?} in this build", other.kind()),
        };
        Ok(Database {
            store: Arc::new(store),
            pool,
            location: shown,
        })
    }

    /// The default schema's target.
    pub(crate) fn default_target(&self) -> Target {
        Target::default_schema(self.store.default_schema())
    }

    /// The targets a command works on: `tenant`'s (`default` for the default schema), or the
    /// default schema's and every registered tenant's (see [`postbox::status::targets`]).
    pub(crate) async fn targets(&self, tenant: Option<&str>) -> anyhow::Result<Vec<Target>> {
        postbox::status::targets(&*self.store, tenant)
            .await
            .map_err(registry_error)
    }

    /// The one target of a command about one outbox's events: `tenant`'s, or the default
    /// schema's (see [`postbox::status::target`]).
    pub(crate) async fn target(&self, tenant: Option<&str>) -> anyhow::Result<Target> {
        postbox::status::target(&*self.store, tenant)
            .await
            .map_err(registry_error)
    }

    /// Whether the default schema's outbox tables are there: [`postbox::Error::NotMigrated`]
    /// when they are not. One event looked up by id (none has id 0), at the cost of an index
    /// lookup: counting the outbox would walk, at every start, what a transaction held open
    /// keeps of it.
    pub(crate) async fn migrated(&self) -> postbox::Result<()> {
        self.store
            .event_get(&self.default_target(), 0)
            .await
            .map(|_| ())
    }

    /// Fails with "run `postbox migrate`" when the outbox tables are missing.
    pub(crate) async fn ensure_migrated(&self) -> anyhow::Result<()> {
        match self.migrated().await {
            Ok(_) => Ok(()),
            Err(e @ postbox::Error::NotMigrated { .. }) => Err(anyhow::Error::new(e)
                .context(format!("{} has no outbox tables yet", self.location))),
            Err(e) => Err(anyhow::Error::new(e)
                .context(format!("cannot read the outbox in {}", self.location))),
        }
    }
}

/// A tenant that is not there or cannot be one says so itself; anything else is the registry's.
fn registry_error(e: postbox::Error) -> anyhow::Error {
    match e {
        e @ (postbox::Error::UnknownTenant(_) | postbox::Error::InvalidName { .. }) => e.into(),
        e => anyhow::Error::new(e).context("cannot read the tenant registry"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn parse(url: &str) -> anyhow::Result<Location> {
        Location::parse(Some(url))
    }

    #[test]
    fn urls_pick_the_database() {
        assert!(matches!(
            Location::parse(None),
            Ok(Location::Sqlite { file: Some(f), .. }) if f == Path::new("postbox.db")
        ));
        assert!(matches!(
            parse("postgres://u:pw@localhost:5432/app"),
            Ok(Location::Postgres(..))
        ));
        assert!(matches!(
            parse("postgresql://localhost/app"),
            Ok(Location::Postgres(..))
        ));
        assert!(matches!(
            parse("sqlite://data/outbox.db"),
            Ok(Location::Sqlite { file: Some(f), .. }) if f == Path::new("data/outbox.db")
        ));
        assert!(matches!(
            parse("/var/lib/app/outbox.db"),
            Ok(Location::Sqlite { file: Some(_), .. })
        ));
        assert!(matches!(
            parse("sqlite::memory:"),
            Ok(Location::Sqlite { file: None, .. })
        ));
        assert!(matches!(
            parse("mysql://app:pw@localhost:3306/shop"),
            Ok(Location::MySql(..))
        ));
        assert!(matches!(
            parse("mariadb://localhost/shop"),
            Ok(Location::MySql(..))
        ));
        assert!(
            parse("mysql://localhost").is_err_and(|e| e.to_string().contains("names no database"))
        );
        assert!(parse("oracle://localhost/app").is_err());
        assert!(parse("outbox").is_err());
    }

    #[test]
    fn display_hides_the_password() {
        let shown = parse("postgres://app:s3cret@db:5433/orders")
            .map(|l| l.to_string())
            .unwrap_or_default();
        assert_eq!(shown, "PostgreSQL postgres://app@db:5433/orders");
        let shown = parse("mysql://app:s3cret@db:3307/orders")
            .map(|l| l.to_string())
            .unwrap_or_default();
        assert_eq!(shown, "MySQL mysql://app@db:3307/orders");
    }
}
