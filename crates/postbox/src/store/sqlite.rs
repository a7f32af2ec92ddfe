//! The SQLite store: the embedded, zero-setup default. One outbox per database file; no tenants.

use std::borrow::Cow;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};
use uuid::Uuid;

use super::list::{ListDialect, list_query};
use super::migrations::{self, Migration};
use super::row::{add_claimed_row, stored_event};
use super::{
    ArchiveBatch, ArchiveParams, Backlog, Capabilities, ClaimParams, Claimed, EventStatus,
    FailedMark, GapParams, Gaps, Horizon, HorizonProbe, LEASE_EXPIRED, ListParams,
    MarkFailedParams, MarkProcessedParams, PurgeBatch, PurgeKind, PurgeParams, RejectedTenant,
    ReleaseParams, RenewParams, ReportedSink, RetryFailedParams, SlowLaneParams, StatusCounts,
    Store, StoredEvent, Tenant, TenantAddParams, TenantStatus, Wakeups, ms, secs, storable_error,
};
use crate::error::{Error, Result};
use crate::glob::Glob;
use crate::inbox::InboxStats;
use crate::ops::StoreOps;
use crate::schema::{SchemaName, Target, TenantId};
use crate::sink::SinkHealth;

const MIGRATIONS: &[Migration] = &[
    Migration {
        name: "outbox_0001_events",
        sql: include_str!("../../sql/sqlite/0001_outbox_events.sql"),
    },
    Migration {
        name: "outbox_0002_sink_health",
        sql: include_str!("../../sql/sqlite/0002_sink_health.sql"),
    },
    Migration {
        name: "outbox_0003_retention",
        sql: include_str!("../../sql/sqlite/0003_retention.sql"),
    },
    Migration {
        name: "outbox_0004_ordering",
        sql: include_str!("../../sql/sqlite/0004_ordering.sql"),
    },
    Migration {
        name: "outbox_0005_inbox",
        sql: include_str!("../../sql/sqlite/0005_inbox.sql"),
    },
];

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

/// The list statement's SQLite words (`store/list.rs`): JSON arrays read with `json_each` for
/// lists, `GLOB` for globs (case-sensitive like the globs themselves), times compared through
/// `julianday`, which reads every date form SQLite knows.
struct SqliteList;

impl ListDialect for SqliteList {
    type Db = sqlx::Sqlite;
    const BRANCH: &'static str = "SELECT * FROM (";
    const COLUMNS: &'static str = include_str!("../../sql/sqlite/list_columns.sql");
    const NULL_ARCHIVED_AT: &'static str = "NULL AS archived_at";

    fn table(&self, table: &'static str) -> Cow<'static, str> {
        Cow::Borrowed(table)
    }

    fn parked(&self) -> Cow<'static, str> {
        Cow::Borrowed(include_str!("../../sql/sqlite/list_parked.sql"))
    }

    fn ids(&self, q: &mut sqlx::QueryBuilder<Self::Db>, ids: &[i64]) {
        q.push("id IN (SELECT value FROM json_each(");
        q.push_bind(ids_json(ids)).push("))");
    }

    fn statuses(&self, q: &mut sqlx::QueryBuilder<Self::Db>, statuses: &[EventStatus]) {
        let statuses: Vec<&str> = statuses.iter().map(|s| s.as_str()).collect();
        q.push("status IN (SELECT value FROM json_each(");
        q.push_bind(serde_json::to_string(&statuses).unwrap_or_default());
        q.push("))");
    }

    fn glob(&self, q: &mut sqlx::QueryBuilder<Self::Db>, column: &'static str, glob: &Glob) {
        q.push(column).push(" GLOB ");
        q.push_bind(glob.to_sqlite_glob().to_owned());
    }

    fn created(&self, q: &mut sqlx::QueryBuilder<Self::Db>, op: &'static str, t: DateTime<Utc>) {
        let t = t.format("%Y-%m-%dT%H:%M:%S%.fZ").to_string();
        q.push("julianday(created_at) ").push(op);
        q.push(" julianday(").push_bind(t).push(")");
    }
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
    fn capabilities(&self) -> Capabilities {
        Capabilities::EMBEDDED
    }

    async fn claim_floor(&self, _target: &Target, _from: i64, _settled: i64) -> Result<i64> {
        // Claims scan from the first due event (Capabilities::EMBEDDED): no floor.
        Ok(0)
    }

    async fn claim_gaps(&self, _params: &GapParams<'_>) -> Result<Gaps> {
        // Claims scan from the first due event (Capabilities::EMBEDDED): nothing is passed over.
        Ok(Gaps::default())
    }

    async fn commit_horizon(
        &self,
        _target: &Target,
        _probe: Option<&HorizonProbe>,
    ) -> Result<Horizon> {
        // One writer at a time: ids are drawn in commit order, every committed id is settled.
        Ok(Horizon {
            settled: Some(i64::MAX),
            probe: None,
        })
    }

    fn default_schema(&self) -> SchemaName {
        SchemaName::new("main").unwrap_or_else(|_| SchemaName::public())
    }

    async fn events_claim(&self, p: &ClaimParams<'_>) -> Result<Claimed> {
        Self::check_target(p.target)?;
        let token = Uuid::new_v4();
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let pick = sqlx::query_as(include_str!("../../sql/sqlite/claim_pick.sql"))
            .bind(i64::from(p.batch_size))
            .bind(serde_json::to_string(p.order.aggregate_types)?);
        let picked: Vec<(i64, bool)> = pick.fetch_all(&mut *tx).await.map_err(map_missing_table)?;
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
            .bind(LEASE_EXPIRED)
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
                    .bind(t.max_retries)
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

    async fn events_release(&self, p: &ReleaseParams<'_>) -> Result<u64> {
        Self::check_target(p.target)?;
        if p.releases.is_empty() {
            return Ok(0);
        }
        let token = p.claim_token.to_string();
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let mut released = 0;
        for r in p.releases {
            released += sqlx::query(include_str!("../../sql/sqlite/release.sql"))
                .bind(r.id)
                .bind(storable_error(&r.error))
                .bind(ms(r.delay))
                .bind(&token)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        }
        tx.commit().await?;
        Ok(released)
    }

    async fn outbox_heads(&self, targets: &[Target]) -> Result<Vec<Option<i64>>> {
        let head: Option<i64> = sqlx::query_scalar(include_str!("../../sql/sqlite/head.sql"))
            .fetch_optional(&self.pool)
            .await?;
        Ok(targets
            .iter()
            .map(|t| {
                if t.tenant.is_none() {
                    Some(head.unwrap_or(0))
                } else {
                    None
                }
            })
            .collect())
    }

    async fn backlog(&self, target: &Target, ordered: &[String]) -> Result<Backlog> {
        Self::check_target(target)?;
        let query = if ordered.is_empty() {
            sqlx::query(include_str!("../../sql/sqlite/backlog.sql"))
        } else {
            sqlx::query(include_str!("../../sql/sqlite/backlog_ordered.sql"))
                .bind(serde_json::to_string(ordered)?)
        };
        let row = query
            .fetch_one(&self.pool)
            .await
            .map_err(map_missing_table)?;
        Ok(Backlog {
            next_due_in: secs(row.try_get(0)?),
        })
    }

    async fn wakeups(&self) -> Result<Option<Box<dyn Wakeups>>> {
        Ok(None)
    }
}

#[async_trait]
impl StoreOps for SqliteStore {
    async fn tenant_rejected(&self) -> Result<Vec<RejectedTenant>> {
        // Tenant ids and schema names are checked when they are registered; no row can be bad.
        Ok(Vec::new())
    }

    async fn outbox_dead_rows(&self, targets: &[Target]) -> Result<Vec<u64>> {
        // SQLite reuses a deleted row's space in place; no vacuum is owed for the claim's sake.
        Ok(vec![0; targets.len()])
    }

    async fn outbox_vacuum(&self, _target: &Target) -> Result<()> {
        Ok(())
    }

    async fn oldest_transaction_age(&self) -> Result<Option<Duration>> {
        // SQLite does not say which transactions are open.
        Ok(None)
    }

    async fn schema_migrate(&self, _schema: &SchemaName, _registry: bool) -> Result<Vec<String>> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let history = migrations::History {
            create: include_str!("../../sql/sqlite/history_create.sql").to_owned(),
            read: include_str!("../../sql/sqlite/history_read.sql").to_owned(),
            record: include_str!("../../sql/sqlite/history_record.sql").to_owned(),
        };
        let applied =
            migrations::apply::<sqlx::Sqlite>(&mut tx, &history, MIGRATIONS, str::to_owned).await?;
        tx.commit().await?;
        Ok(applied)
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

    async fn events_retry_slow_lane(&self, p: &SlowLaneParams<'_>) -> Result<u64> {
        Self::check_target(p.target)?;
        let exclude: Vec<&str> = p.exclude.iter().map(|g| g.to_sqlite_glob()).collect();
        let done = sqlx::query(include_str!("../../sql/sqlite/retry_slow_lane.sql"))
            .bind(p.after.as_secs_f64())
            .bind(i64::from(p.max_tries))
            .bind(i64::from(p.batch_size))
            .bind(serde_json::to_string(&exclude)?)
            .execute(&self.pool)
            .await
            .map_err(map_missing_table)?;
        Ok(done.rows_affected())
    }

    async fn events_list(&self, p: &ListParams<'_>) -> Result<Vec<StoredEvent>> {
        Self::check_target(p.target)?;
        p.filter.validate()?;
        let rows = list_query(&SqliteList, p)
            .build()
            .fetch_all(&self.pool)
            .await
            .map_err(map_missing_table)?;
        rows.iter()
            .map(|row| stored_event(row, None).map_err(Error::from))
            .collect()
    }

    async fn events_archive(&self, p: &ArchiveParams<'_>) -> Result<Option<ArchiveBatch>> {
        Self::check_target(p.target)?;
        // One writer at a time is SQLite's own rule: no lock of Postbox's is needed.
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let walked = sqlx::query(include_str!("../../sql/sqlite/archive_walk.sql"))
            .bind(p.older_than.as_secs_f64())
            .bind(p.after_id)
            .bind(i64::from(p.batch_size))
            .fetch_all(&mut *tx)
            .await
            .map_err(map_missing_table)?;
        let mut last_id = p.after_id;
        let mut old = Vec::new();
        let mut reached_young = false;
        for row in &walked {
            // NULL: a created_at SQLite cannot read as a date; such a row is left where it is.
            let young: Option<bool> = row.try_get(1)?;
            if young == Some(true) {
                reached_young = true;
                break;
            }
            last_id = row.try_get(0)?;
            if row.try_get::<bool, _>(2)? && young.is_some() {
                old.push(last_id);
            }
        }
        let done = reached_young || walked.len() < p.batch_size as usize;
        let moved = if old.is_empty() {
            0
        } else if p.dry_run {
            old.len() as u64
        } else {
            let ids = ids_json(&old);
            sqlx::query(include_str!("../../sql/sqlite/archive_move.sql"))
                .bind(&ids)
                .execute(&mut *tx)
                .await?;
            sqlx::query(include_str!("../../sql/sqlite/archive_delete.sql"))
                .bind(&ids)
                .execute(&mut *tx)
                .await?
                .rows_affected()
        };
        tx.commit().await?;
        Ok(Some(ArchiveBatch {
            last_id,
            moved,
            done,
        }))
    }

    async fn events_purge(&self, p: &PurgeParams<'_>) -> Result<Option<PurgeBatch>> {
        Self::check_target(p.target)?;
        let age = p.older_than.as_secs_f64();
        let (statement, count) = match p.kind {
            PurgeKind::Archive => (
                include_str!("../../sql/sqlite/archive_purge.sql"),
                include_str!("../../sql/sqlite/archive_purge_count.sql"),
            ),
            PurgeKind::Failed => (
                include_str!("../../sql/sqlite/purge_failed.sql"),
                include_str!("../../sql/sqlite/purge_failed_count.sql"),
            ),
            PurgeKind::Inbox => (
                include_str!("../../sql/sqlite/inbox_purge.sql"),
                include_str!("../../sql/sqlite/inbox_purge_count.sql"),
            ),
        };
        if p.dry_run {
            let n: i64 = sqlx::query_scalar(count)
                .bind(age)
                .fetch_one(&self.pool)
                .await
                .map_err(map_missing_table)?;
            return Ok(Some(PurgeBatch {
                purged: u64::try_from(n).unwrap_or(0),
                done: true,
            }));
        }
        let gone = sqlx::query(statement)
            .bind(age)
            .bind(i64::from(p.batch_size))
            .execute(&self.pool)
            .await
            .map_err(map_missing_table)?
            .rows_affected();
        Ok(Some(PurgeBatch {
            purged: gone,
            done: gone < u64::from(p.batch_size),
        }))
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

    async fn events_skip(&self, target: &Target, ids: &[i64]) -> Result<Vec<i64>> {
        Self::check_target(target)?;
        let mut skipped: Vec<i64> = sqlx::query_scalar(include_str!("../../sql/sqlite/skip.sql"))
            .bind(ids_json(ids))
            .fetch_all(&self.pool)
            .await
            .map_err(map_missing_table)?;
        skipped.sort_unstable();
        Ok(skipped)
    }

    async fn sinks_report(&self, relay_id: &str, sinks: &[SinkHealth]) -> Result<()> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        sqlx::query(include_str!("../../sql/sqlite/sinks_forget.sql"))
            .bind(relay_id)
            .execute(&mut *tx)
            .await
            .map_err(map_missing_table)?;
        for sink in sinks {
            sqlx::query(include_str!("../../sql/sqlite/sinks_report.sql"))
                .bind(relay_id)
                .bind(&sink.name)
                .bind(sink.up)
                .bind(sink.since.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
                .bind(sink.last_error.as_deref().map(storable_error))
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn inbox_stats(&self, target: &Target) -> Result<Vec<InboxStats>> {
        Self::check_target(target)?;
        let rows: Vec<(String, i64, i64)> =
            sqlx::query_as(include_str!("../../sql/sqlite/inbox_stats.sql"))
                .bind(super::INBOX_COUNT_LIMIT)
                .fetch_all(&self.pool)
                .await
                .map_err(map_missing_table)?;
        Ok(super::inbox_stats(rows))
    }

    async fn sinks_reported(&self) -> Result<Vec<ReportedSink>> {
        let rows: Vec<super::ReportedRow> =
            sqlx::query_as(include_str!("../../sql/sqlite/sinks_reported.sql"))
                .fetch_all(&self.pool)
                .await
                .map_err(map_missing_table)?;
        Ok(super::reported_sinks(rows))
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
}
