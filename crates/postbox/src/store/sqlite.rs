//! The SQLite store: the embedded, zero-setup default. One outbox per database file; no tenants.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::Row;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};
use uuid::Uuid;

use super::migrations::{self, Migration};
use super::row::add_claimed_row;
use super::{
    Backlog, ClaimParams, Claimed, FailedMark, MarkFailedParams, MarkProcessedParams, RenewParams,
    RetryFailedParams, StatusCounts, Store, Tenant, TenantAddParams, TenantStatus, Wakeups, ms,
    secs, storable_error,
};
use crate::error::{Error, Result};
use crate::schema::{SchemaName, Target, TenantId};

const MIGRATIONS: &[Migration] = &[Migration {
    name: "outbox_0001_events",
    sql: include_str!("../../sql/sqlite/0001_outbox_events.sql"),
}];

const NO_TENANTS: &str =
    "tenants need PostgreSQL: an SQLite database holds one outbox (use one file per tenant)";

/// A [`Store`] on SQLite.
///
/// ```no_run
/// # async fn example() -> postbox::Result<()> {
/// let store = postbox::SqliteStore::open("postbox.db").await?;
/// postbox::migrate(&store).await?;
/// # Ok(()) }
/// ```
pub struct SqliteStore {
    pool: SqlitePool,
}

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

    async fn connect_with(options: SqliteConnectOptions) -> Result<Self> {
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

    fn check_target(target: &Target) -> Result<()> {
        if target.tenant.is_some() {
            return Err(Error::Unsupported(NO_TENANTS));
        }
        Ok(())
    }
}

fn ids_json(ids: &[i64]) -> String {
    // A JSON array of integers: read back with json_each, so one statement serves any count.
    let mut s = String::with_capacity(ids.len() * 8 + 2);
    s.push('[');
    for (i, id) in ids.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&id.to_string());
    }
    s.push(']');
    s
}

fn map_missing_table(err: sqlx::Error) -> Error {
    if let sqlx::Error::Database(db) = &err
        && db.message().contains("no such table")
    {
        return Error::NotMigrated {
            schema: "main".to_owned(),
        };
    }
    Error::Database(err)
}

#[async_trait]
impl Store for SqliteStore {
    async fn schema_migrate(&self, _schema: &SchemaName, _registry: bool) -> Result<Vec<String>> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let applied = migrations::apply::<sqlx::Sqlite>(
            &mut tx,
            "postbox_schema_history",
            "TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))",
            MIGRATIONS,
            str::to_owned,
        )
        .await?;
        tx.commit().await?;
        Ok(applied)
    }

    fn default_schema(&self) -> SchemaName {
        SchemaName::new("main").unwrap_or_else(|_| SchemaName::public())
    }

    async fn events_claim(&self, p: &ClaimParams<'_>) -> Result<Claimed> {
        Self::check_target(p.target)?;
        let token = Uuid::new_v4();
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let picked: Vec<(i64, bool)> =
            sqlx::query_as(include_str!("../../sql/sqlite/claim_pick.sql"))
                .bind(i64::from(p.batch_size))
                .fetch_all(&mut *tx)
                .await
                .map_err(map_missing_table)?;
        let mut claimed = Claimed {
            claim_token: token,
            ..Claimed::default()
        };
        if picked.is_empty() {
            tx.commit().await?;
            return Ok(claimed);
        }
        let ids: Vec<i64> = picked.iter().map(|(id, _)| *id).collect();
        let stale: Vec<i64> = picked
            .iter()
            .filter(|(_, stale)| *stale)
            .map(|(id, _)| *id)
            .collect();
        let rows = sqlx::query(include_str!("../../sql/sqlite/claim_take.sql"))
            .bind(ids_json(&ids))
            .bind(ms(p.lease))
            .bind(p.relay_id)
            .bind(token.to_string())
            .bind(ids_json(&stale))
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        for row in &rows {
            add_claimed_row(&mut claimed, row, None)?;
        }
        // RETURNING does not promise an order; the contract is id order.
        claimed.events.sort_unstable_by_key(|e| e.id);
        Ok(claimed)
    }

    async fn leases_renew(&self, p: &RenewParams<'_>) -> Result<u64> {
        Self::check_target(p.target)?;
        let done = sqlx::query(include_str!("../../sql/sqlite/renew.sql"))
            .bind(ids_json(p.ids))
            .bind(p.claim_token.to_string())
            .bind(ms(p.lease))
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    async fn events_mark_processed(&self, p: &MarkProcessedParams<'_>) -> Result<u64> {
        Self::check_target(p.target)?;
        if p.ids.is_empty() {
            return Ok(0);
        }
        let done = sqlx::query(include_str!("../../sql/sqlite/mark_processed.sql"))
            .bind(ids_json(p.ids))
            .bind(p.claim_token.to_string())
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    async fn events_mark_failed(&self, p: &MarkFailedParams<'_>) -> Result<Vec<FailedMark>> {
        Self::check_target(p.target)?;
        if p.tries.is_empty() {
            return Ok(Vec::new());
        }
        let token = p.claim_token.to_string();
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let mut marks = Vec::with_capacity(p.tries.len());
        for t in p.tries {
            let row: Option<(i64, i32, bool)> =
                sqlx::query_as(include_str!("../../sql/sqlite/mark_failed.sql"))
                    .bind(t.id)
                    .bind(storable_error(&t.error))
                    .bind(t.permanent)
                    .bind(&token)
                    .bind(ms(p.retry.base))
                    .bind(ms(p.retry.cap))
                    .fetch_optional(&mut *tx)
                    .await?;
            if let Some((id, retry_count, gave_up)) = row {
                marks.push(FailedMark {
                    id,
                    retry_count,
                    gave_up,
                });
            }
        }
        tx.commit().await?;
        Ok(marks)
    }

    async fn events_retry_failed(&self, p: &RetryFailedParams<'_>) -> Result<u64> {
        Self::check_target(p.target)?;
        let done = sqlx::query(include_str!("../../sql/sqlite/retry_failed.sql"))
            .bind(p.ids.map(ids_json))
            .execute(&self.pool)
            .await
            .map_err(map_missing_table)?;
        Ok(done.rows_affected())
    }

    async fn status_counts(&self, target: &Target) -> Result<StatusCounts> {
        Self::check_target(target)?;
        let row = sqlx::query(include_str!("../../sql/sqlite/status_counts.sql"))
            .fetch_one(&self.pool)
            .await
            .map_err(map_missing_table)?;
        Ok(StatusCounts {
            pending: row.try_get(0)?,
            processing: row.try_get(1)?,
            processed: row.try_get(2)?,
            failed: row.try_get(3)?,
            oldest_pending_age: secs(row.try_get(4)?),
            dead_tuples: row.try_get(5)?,
            processed_exact: true,
        })
    }

    async fn backlog(&self, target: &Target) -> Result<Backlog> {
        Self::check_target(target)?;
        let row = sqlx::query(include_str!("../../sql/sqlite/backlog.sql"))
            .fetch_one(&self.pool)
            .await
            .map_err(map_missing_table)?;
        Ok(Backlog {
            next_due_in: secs(row.try_get(0)?),
        })
    }

    async fn tenant_add(&self, _p: &TenantAddParams<'_>) -> Result<Tenant> {
        Err(Error::Unsupported(NO_TENANTS))
    }

    async fn tenant_list(&self) -> Result<Vec<Tenant>> {
        Err(Error::Unsupported(NO_TENANTS))
    }

    async fn tenant_set_status(&self, _id: &TenantId, _status: TenantStatus) -> Result<Tenant> {
        Err(Error::Unsupported(NO_TENANTS))
    }

    async fn wakeups(&self) -> Result<Option<Box<dyn Wakeups>>> {
        Ok(None)
    }
}
