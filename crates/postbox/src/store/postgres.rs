//! The PostgreSQL store: the production back-end.

/// The advisory locks Postbox takes on PostgreSQL, one key each, as `pg_locks` shows them
/// (`classid` the key, `objid` the schema's `hashtext`): every lock is the two-key form
/// `(key, hashtext(schema))`, so each schema has its own. The statements take the key as a
/// parameter, so these are the only place the values are written.
pub mod pg_locks {
    /// Serializes the migrations of one schema (held for the migration's transaction; waited
    /// for).
    pub const MIGRATE: i32 = 7_012_026;
    /// One vacuum of a schema's outbox table at a time (held by the vacuuming session; not
    /// waited for: the other relays skip the table).
    pub const VACUUM: i32 = 7_012_027;
    /// One build of a schema's retry index at a time (held by the building session; not waited
    /// for).
    pub const RETRY_INDEX: i32 = 7_012_028;
    /// Archiving and purging of one schema one at a time (held for the batch's transaction; not
    /// waited for): the first key is `hashtext` of this name.
    pub const RETENTION: &str = "postbox_retention";
}

use std::borrow::Cow;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Connection;
use sqlx::Row;
use sqlx::postgres::{PgConnection, PgListener, PgPool, PgPoolOptions, PgRow};
use uuid::Uuid;

use super::list::{ListDialect, list_query};
use super::migrations::{self, Migration};
use super::row::{add_claimed_row, stored_event};
use super::{
    ArchiveBatch, ArchiveParams, Backlog, Capabilities, ClaimParams, Claimed,
    EXACT_PROCESSED_COUNT, EventStatus, FailedMark, GapParams, Gaps, Horizon, HorizonProbe,
    LEASE_EXPIRED, ListParams, MarkFailedParams, MarkProcessedParams, PurgeBatch, PurgeKind,
    PurgeParams, RejectedTenant, ReleaseParams, RenewParams, ReportedSink, RetryFailedParams,
    SlowLaneParams, StatusCounts, Store, StoredEvent, Tenant, TenantAddParams, TenantStatus,
    Wakeups, ms, secs, storable_error,
};
use crate::error::{Error, Result};
use crate::glob::Glob;
use crate::inbox::InboxStats;
use crate::ops::StoreOps;
use crate::schema::{SchemaName, Target, TenantId};
use crate::sink::SinkHealth;
use crate::sql::{PerSchema, render, safe};

/// The index of the events below a relay's floor that claims still take (migration
/// `0008_claim.sql`), built by `PgStore::build_retry_index`.
const RETRY_INDEX: &str = "outbox_events_retry_idx";

/// The channel enqueue notifies and relays listen on; the payload is the schema name.
pub(crate) const NOTIFY_CHANNEL: &str = "postbox_events";

/// Migrations of every outbox schema, in order. Names are recorded in the schema's
/// `postbox_schema_history` table, never in the application's own migration table.
const OUTBOX_MIGRATIONS: &[Migration] = &[
    Migration {
        name: "outbox_0001_events",
        sql: include_str!("../../sql/postgres/0001_outbox_events.sql"),
    },
    Migration {
        name: "outbox_0002_claim_function",
        sql: include_str!("../../sql/postgres/0002_claim_function.sql"),
    },
    Migration {
        name: "outbox_0003_no_auto_analyze",
        sql: include_str!("../../sql/postgres/0003_no_auto_analyze.sql"),
    },
    Migration {
        name: "outbox_0004_bounded_reads",
        sql: include_str!("../../sql/postgres/0004_bounded_reads.sql"),
    },
    Migration {
        name: "outbox_0005_sql_enqueue",
        sql: include_str!("../../sql/postgres/0005_sql_enqueue.sql"),
    },
    Migration {
        name: "outbox_0006_retention",
        sql: include_str!("../../sql/postgres/0006_retention.sql"),
    },
    Migration {
        name: "outbox_0007_ordering",
        sql: include_str!("../../sql/postgres/0007_ordering.sql"),
    },
    Migration {
        name: "outbox_0008_claim",
        sql: include_str!("../../sql/postgres/0008_claim.sql"),
    },
    Migration {
        name: "outbox_0009_ordered_heads",
        sql: include_str!("../../sql/postgres/0009_ordered_heads.sql"),
    },
    Migration {
        name: "outbox_0010_ordered_backlog",
        sql: include_str!("../../sql/postgres/0010_ordered_backlog.sql"),
    },
    Migration {
        name: "outbox_0011_ordered_runs",
        sql: include_str!("../../sql/postgres/0011_ordered_runs.sql"),
    },
    Migration {
        name: "outbox_0012_inlined_probes",
        sql: include_str!("../../sql/postgres/0012_inlined_probes.sql"),
    },
    Migration {
        name: "outbox_0013_inbox",
        sql: include_str!("../../sql/postgres/0013_inbox.sql"),
    },
    Migration {
        name: "outbox_0014_horizon_checks",
        sql: include_str!("../../sql/postgres/0014_horizon_checks.sql"),
    },
];

/// Migrations of the default schema only.
const REGISTRY_MIGRATIONS: &[Migration] = &[
    Migration {
        name: "registry_0001_tenants",
        sql: include_str!("../../sql/postgres/0001_tenants.sql"),
    },
    Migration {
        name: "registry_0002_tenant_names",
        sql: include_str!("../../sql/postgres/0002_tenant_names.sql"),
    },
    Migration {
        name: "registry_0003_sink_health",
        sql: include_str!("../../sql/postgres/0003_sink_health.sql"),
    },
];

struct PgSql {
    claim: std::sync::Arc<str>,
    claim_unordered: std::sync::Arc<str>,
    claim_ids: std::sync::Arc<str>,
    floor: std::sync::Arc<str>,
    gaps: std::sync::Arc<str>,
    horizon: std::sync::Arc<str>,
    skip: std::sync::Arc<str>,
    renew: std::sync::Arc<str>,
    mark_processed: std::sync::Arc<str>,
    mark_failed: std::sync::Arc<str>,
    release: std::sync::Arc<str>,
    status_counts: std::sync::Arc<str>,
    backlog: std::sync::Arc<str>,
    backlog_ordered: std::sync::Arc<str>,
    retry_failed: std::sync::Arc<str>,
    retry_slow_lane: std::sync::Arc<str>,
    vacuum: std::sync::Arc<str>,
    archive: std::sync::Arc<str>,
    archive_count: std::sync::Arc<str>,
    archive_purge: std::sync::Arc<str>,
    purge_failed: std::sync::Arc<str>,
    purge_failed_count: std::sync::Arc<str>,
    inbox_purge: std::sync::Arc<str>,
    inbox_purge_count: std::sync::Arc<str>,
    inbox_stats: std::sync::Arc<str>,
    tenant_list: std::sync::Arc<str>,
    tenant_add: std::sync::Arc<str>,
    tenant_set_status: std::sync::Arc<str>,
    sinks_forget: std::sync::Arc<str>,
    sinks_report: std::sync::Arc<str>,
    sinks_reported: std::sync::Arc<str>,
}

impl PgSql {
    fn build(schema: &SchemaName) -> Self {
        PgSql {
            claim: render(include_str!("../../sql/postgres/claim.sql"), schema),
            claim_unordered: render(
                include_str!("../../sql/postgres/claim_unordered.sql"),
                schema,
            ),
            claim_ids: render(include_str!("../../sql/postgres/claim_ids.sql"), schema),
            floor: render(include_str!("../../sql/postgres/floor.sql"), schema),
            gaps: render(include_str!("../../sql/postgres/gaps.sql"), schema),
            horizon: render(include_str!("../../sql/postgres/horizon.sql"), schema),
            skip: render(include_str!("../../sql/postgres/skip.sql"), schema),
            renew: render(include_str!("../../sql/postgres/renew.sql"), schema),
            mark_processed: render(
                include_str!("../../sql/postgres/mark_processed.sql"),
                schema,
            ),
            mark_failed: render(include_str!("../../sql/postgres/mark_failed.sql"), schema),
            release: render(include_str!("../../sql/postgres/release.sql"), schema),
            status_counts: render(include_str!("../../sql/postgres/status_counts.sql"), schema),
            backlog: render(include_str!("../../sql/postgres/backlog.sql"), schema),
            backlog_ordered: render(
                include_str!("../../sql/postgres/backlog_ordered.sql"),
                schema,
            ),
            retry_failed: render(include_str!("../../sql/postgres/retry_failed.sql"), schema),
            retry_slow_lane: render(
                include_str!("../../sql/postgres/retry_slow_lane.sql"),
                schema,
            ),
            vacuum: render(include_str!("../../sql/postgres/vacuum.sql"), schema),
            archive: render(include_str!("../../sql/postgres/archive.sql"), schema),
            archive_count: render(include_str!("../../sql/postgres/archive_count.sql"), schema),
            archive_purge: render(include_str!("../../sql/postgres/archive_purge.sql"), schema),
            purge_failed: render(include_str!("../../sql/postgres/purge_failed.sql"), schema),
            purge_failed_count: render(
                include_str!("../../sql/postgres/purge_failed_count.sql"),
                schema,
            ),
            inbox_purge: render(include_str!("../../sql/postgres/inbox_purge.sql"), schema),
            inbox_purge_count: render(
                include_str!("../../sql/postgres/inbox_purge_count.sql"),
                schema,
            ),
            inbox_stats: render(include_str!("../../sql/postgres/inbox_stats.sql"), schema),
            tenant_list: render(include_str!("../../sql/postgres/tenant_list.sql"), schema),
            tenant_add: render(include_str!("../../sql/postgres/tenant_add.sql"), schema),
            tenant_set_status: render(
                include_str!("../../sql/postgres/tenant_set_status.sql"),
                schema,
            ),
            sinks_forget: render(include_str!("../../sql/postgres/sinks_forget.sql"), schema),
            sinks_report: render(include_str!("../../sql/postgres/sinks_report.sql"), schema),
            sinks_reported: render(
                include_str!("../../sql/postgres/sinks_reported.sql"),
                schema,
            ),
        }
    }
}

impl PgSql {
    /// The delete and its dry-run count of a purge that deletes rows (`FAILED` events, inbox
    /// records); `None` for the archive's, one function that drops whole weeks too.
    fn row_purge(&self, kind: PurgeKind) -> Option<(&std::sync::Arc<str>, &std::sync::Arc<str>)> {
        match kind {
            PurgeKind::Archive => None,
            PurgeKind::Failed => Some((&self.purge_failed, &self.purge_failed_count)),
            PurgeKind::Inbox => Some((&self.inbox_purge, &self.inbox_purge_count)),
        }
    }
}

/// A [`Store`] on PostgreSQL.
///
/// ```no_run
/// # async fn example() -> postbox::Result<()> {
/// let pool = sqlx::PgPool::connect("postgres://localhost/app").await?;
/// let store = postbox::PgStore::new(pool);
/// postbox::migrate(&store).await?;
/// # Ok(()) }
/// ```
pub struct PgStore {
    pool: PgPool,
    default_schema: SchemaName,
    sql: PerSchema<PgSql>,
}

impl PgStore {
    /// A store whose default schema is `public`.
    pub fn new(pool: PgPool) -> Self {
        Self::with_schema(pool, SchemaName::public())
    }

    /// A store whose default schema (its own outbox and the tenant registry) is `schema`.
    pub fn with_schema(pool: PgPool, schema: SchemaName) -> Self {
        PgStore {
            pool,
            default_schema: schema,
            sql: PerSchema::new(PgSql::build),
        }
    }

    /// The connection pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Claims the events of `ids` that are still `PENDING` and never tried, as
    /// [`Store::events_claim`] claims (lease, token, per-aggregate order of
    /// `params.order.aggregate_types`); `params.batch_size` and `params.floor` are not used. For
    /// a relay that learns of committed events elsewhere — the CDC relay reads them from the
    /// WAL — and leaves what it does not get (taken, finished, waiting behind its aggregate, a
    /// retry) to the polling claim.
    ///
    /// ```no_run
    /// # async fn example(store: postbox::PgStore, target: postbox::Target) -> postbox::Result<()> {
    /// use postbox::store::{ClaimOrder, ClaimParams};
    /// let claimed = store
    ///     .events_claim_ids(
    ///         &ClaimParams {
    ///             target: &target,
    ///             batch_size: 100,
    ///             lease: std::time::Duration::from_secs(30),
    ///             relay_id: "relay-1",
    ///             order: ClaimOrder::default(),
    ///             floor: 0,
    ///         },
    ///         &[41, 42],
    ///     )
    ///     .await?;
    /// println!("claimed {} of 2", claimed.events.len());
    /// # Ok(()) }
    /// ```
    pub async fn events_claim_ids(&self, p: &ClaimParams<'_>, ids: &[i64]) -> Result<Claimed> {
        let sql = self.sql.get(&p.target.schema);
        let token = Uuid::new_v4();
        let rows = sqlx::query(safe(&sql.claim_ids))
            .bind(ids)
            .bind(ms(p.lease))
            .bind(p.relay_id)
            .bind(token)
            .bind(p.order.aggregate_types)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| map_missing_table(e, &p.target.schema))?;
        claimed_from(&rows, token, p.target)
    }

    async fn migrate_in(
        conn: &mut sqlx::PgConnection,
        schema: &SchemaName,
        registry: bool,
    ) -> Result<Vec<String>> {
        sqlx::query(include_str!("../../sql/postgres/migrate_lock.sql"))
            .bind(schema.as_str())
            .bind(pg_locks::MIGRATE)
            .execute(&mut *conn)
            .await?;
        sqlx::query(include_str!("../../sql/postgres/migrate_quiet.sql"))
            .execute(&mut *conn)
            .await?;
        let create = render(include_str!("../../sql/postgres/create_schema.sql"), schema);
        sqlx::raw_sql(safe(&create)).execute(&mut *conn).await?;
        let wanted: Vec<Migration> = OUTBOX_MIGRATIONS
            .iter()
            .chain(if registry { REGISTRY_MIGRATIONS } else { &[] })
            .copied()
            .collect();
        let history = migrations::History {
            create: render(
                include_str!("../../sql/postgres/history_create.sql"),
                schema,
            )
            .to_string(),
            read: render(include_str!("../../sql/postgres/history_read.sql"), schema).to_string(),
            record: render(
                include_str!("../../sql/postgres/history_record.sql"),
                schema,
            )
            .to_string(),
        };
        let applied = migrations::apply::<sqlx::Postgres>(conn, &history, &wanted, |template| {
            render(template, schema).to_string()
        })
        .await?;
        Ok(applied)
    }

    /// Takes the right to build `schema`'s retry index (migration `0008_claim.sql`) on a
    /// connection of its own; `None` when another session has it. Taken before the migrations'
    /// transaction commits, so that of several migrations at once the one that applied them
    /// builds the index too.
    async fn retry_index_lock(&self, schema: &SchemaName) -> Result<Option<PgConnection>> {
        let mut conn = PgConnection::connect_with(&self.pool.connect_options()).await?;
        let ours: bool =
            sqlx::query_scalar(include_str!("../../sql/postgres/retry_index_lock.sql"))
                .bind(schema.as_str())
                .bind(pg_locks::RETRY_INDEX)
                .fetch_one(&mut conn)
                .await?;
        if ours {
            Ok(Some(conn))
        } else {
            conn.close().await.ok();
            Ok(None)
        }
    }

    /// Builds `schema`'s retry index on `conn` (which holds [`PgStore::retry_index_lock`]) if it
    /// is missing, without blocking writes: `CREATE INDEX CONCURRENTLY`, outside a transaction.
    /// A build that did not finish (an invalid index) is dropped and done again. Returns whether
    /// it built the index now.
    async fn build_retry_index(mut conn: PgConnection, schema: &SchemaName) -> Result<bool> {
        let state: Option<bool> =
            sqlx::query_scalar(include_str!("../../sql/postgres/retry_index_state.sql"))
                .bind(schema.as_str())
                .fetch_optional(&mut conn)
                .await?;
        if state == Some(true) {
            conn.close().await.ok();
            return Ok(false);
        }
        let not_built = |e: sqlx::Error| Error::IndexNotBuilt {
            schema: schema.to_string(),
            index: RETRY_INDEX,
            reason: e.to_string(),
        };
        // A concurrent build waits for every transaction that could still see the table
        // without the index: a snapshot held open for long holds it back.
        sqlx::query(include_str!("../../sql/postgres/retry_index_wait.sql"))
            .execute(&mut conn)
            .await?;
        if state == Some(false) {
            let drop = render(
                include_str!("../../sql/postgres/retry_index_drop.sql"),
                schema,
            );
            sqlx::raw_sql(safe(&drop))
                .execute(&mut conn)
                .await
                .map_err(not_built)?;
        }
        let build = render(include_str!("../../sql/postgres/retry_index.sql"), schema);
        sqlx::raw_sql(safe(&build))
            .execute(&mut conn)
            .await
            .map_err(not_built)?;
        conn.close().await.ok();
        Ok(true)
    }

    /// Every registry row: a tenant, or why it cannot be served (a row added by hand with a
    /// name Postbox refuses).
    async fn tenant_rows(&self) -> Result<Vec<std::result::Result<Tenant, RejectedTenant>>> {
        let sql = self.sql.get(&self.default_schema);
        let rows = sqlx::query(safe(&sql.tenant_list))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| map_missing_table(e, &self.default_schema))?;
        rows.iter()
            .map(|row| {
                let id: String = row.try_get(0)?;
                let schema: String = row.try_get(1)?;
                Ok(Self::tenant_from_row(row).map_err(|e| RejectedTenant {
                    id,
                    schema,
                    reason: e.to_string(),
                }))
            })
            .collect()
    }

    fn tenant_from_row(row: &PgRow) -> Result<Tenant> {
        let id: String = row.try_get(0)?;
        let schema: String = row.try_get(1)?;
        let status: String = row.try_get(2)?;
        Ok(Tenant {
            id: TenantId::new(&id)?,
            schema: SchemaName::new(&schema)?,
            status: TenantStatus::from_sql(&status),
            created_at: row.try_get(3)?,
        })
    }
}

/// The list statement's PostgreSQL words (`store/list.rs`): tables in the schema, arrays for
/// lists, `LIKE` with an escape for globs.
struct PgList<'a>(&'a SchemaName);

impl ListDialect for PgList<'_> {
    type Db = sqlx::Postgres;
    const BRANCH: &'static str = "(";
    const COLUMNS: &'static str = include_str!("../../sql/postgres/list_columns.sql");
    const NULL_ARCHIVED_AT: &'static str = "NULL::timestamptz AS archived_at";

    fn table(&self, table: &'static str) -> Cow<'static, str> {
        Cow::Owned(render(&format!("{{schema}}.{table}"), self.0).to_string())
    }

    fn parked(&self) -> Cow<'static, str> {
        let sql = render(include_str!("../../sql/postgres/list_parked.sql"), self.0);
        Cow::Owned(sql.to_string())
    }

    fn ids(&self, q: &mut sqlx::QueryBuilder<Self::Db>, ids: &[i64]) {
        q.push("id = ANY(").push_bind(ids.to_vec()).push(")");
    }

    fn statuses(&self, q: &mut sqlx::QueryBuilder<Self::Db>, statuses: &[EventStatus]) {
        let statuses: Vec<&'static str> = statuses.iter().map(|s| s.as_str()).collect();
        q.push("status = ANY(").push_bind(statuses).push(")");
    }

    fn glob(&self, q: &mut sqlx::QueryBuilder<Self::Db>, column: &'static str, glob: &Glob) {
        q.push(column).push(" LIKE ").push_bind(glob.to_like());
        q.push(" ESCAPE '\\'");
    }

    fn created(&self, q: &mut sqlx::QueryBuilder<Self::Db>, op: &'static str, t: DateTime<Utc>) {
        q.push("created_at ").push(op).push(" ").push_bind(t);
    }
}

/// Takes the retention lock of `schema`'s outbox for the rest of `tx`: archiving and purging run
/// one at a time per table (relays and commands alike). False when another session holds it.
async fn retention_lock(tx: &mut sqlx::PgConnection, schema: &SchemaName) -> Result<bool> {
    Ok(
        sqlx::query_scalar(include_str!("../../sql/postgres/retention_lock.sql"))
            .bind(schema.as_str())
            .bind(pg_locks::RETENTION)
            .fetch_one(tx)
            .await?,
    )
}

/// A batch size as the SQL functions take it.
/// A claim's rows as [`Claimed`], in id order: UPDATE … RETURNING does not keep the order of
/// the picked rows (a join that spills into batches reorders them); the contract is id order.
fn claimed_from(rows: &[PgRow], token: Uuid, target: &Target) -> Result<Claimed> {
    let mut claimed = Claimed {
        claim_token: token,
        events: Vec::with_capacity(rows.len()),
        ..Claimed::default()
    };
    for row in rows {
        add_claimed_row(&mut claimed, row, target.tenant.as_ref())?;
    }
    claimed.events.sort_unstable_by_key(|e| e.id);
    Ok(claimed)
}

fn batch_size(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// A count read from SQL (never negative).
fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

fn map_missing_table(err: sqlx::Error, schema: &SchemaName) -> Error {
    if let sqlx::Error::Database(db) = &err {
        // undefined table, undefined schema, undefined function (postbox_claim)
        if matches!(db.code().as_deref(), Some("42P01" | "3F000" | "42883")) {
            return Error::NotMigrated {
                schema: schema.to_string(),
            };
        }
        // postbox_id_sequence (migration 0014): the sequence cannot be relied on, and its hint
        // is the fix.
        if matches!(db.code().as_deref(), Some("55000" | "42501"))
            && db.message().contains("outbox's id sequence")
            && let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
        {
            return Error::UnsafeSequence {
                schema: schema.to_string(),
                problem: pg.message().to_owned(),
                fix: pg.hint().unwrap_or_default().to_owned(),
            };
        }
    }
    Error::Database(err)
}

#[async_trait]
impl Store for PgStore {
    fn capabilities(&self) -> Capabilities {
        Capabilities::SERVER
    }

    async fn claim_floor(&self, target: &Target, from: i64, settled: i64) -> Result<i64> {
        let sql = self.sql.get(&target.schema);
        let floor: Option<i64> = sqlx::query_scalar(safe(&sql.floor))
            .bind(from)
            .bind(settled.saturating_add(1))
            .fetch_one(&self.pool)
            .await
            .map_err(|e| map_missing_table(e, &target.schema))?;
        Ok(floor.unwrap_or(from))
    }

    async fn claim_gaps(&self, p: &GapParams<'_>) -> Result<Gaps> {
        let sql = self.sql.get(&p.target.schema);
        let lo: Vec<i64> = p.passed.iter().map(|r| *r.start()).collect();
        let hi: Vec<i64> = p.passed.iter().map(|r| *r.end()).collect();
        let rows: Vec<(i64, bool, bool, bool)> = sqlx::query_as(safe(&sql.gaps))
            .bind(&lo)
            .bind(&hi)
            .bind(p.after)
            .bind(i32::try_from(p.limit).unwrap_or(i32::MAX))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| map_missing_table(e, &p.target.schema))?;
        Ok(super::gaps_from(rows))
    }

    fn default_schema(&self) -> SchemaName {
        self.default_schema.clone()
    }

    async fn events_claim(&self, p: &ClaimParams<'_>) -> Result<Claimed> {
        let sql = self.sql.get(&p.target.schema);
        let token = Uuid::new_v4();
        let ordered = p.order.is_on();
        let text = if ordered {
            &sql.claim
        } else {
            &sql.claim_unordered
        };
        let mut query = sqlx::query(safe(text))
            .bind(i32::try_from(p.batch_size).unwrap_or(i32::MAX))
            .bind(ms(p.lease))
            .bind(p.relay_id)
            .bind(token)
            .bind(p.order.aggregate_types)
            .bind(p.order.settled_through)
            .bind(LEASE_EXPIRED)
            .bind(p.floor);
        if ordered {
            query = query
                .bind(i32::try_from(p.order.walk).unwrap_or(i32::MAX))
                .bind(p.order.sweep);
        }
        let rows = query
            .fetch_all(&self.pool)
            .await
            .map_err(|e| map_missing_table(e, &p.target.schema))?;
        claimed_from(&rows, token, p.target)
    }

    async fn leases_renew(&self, p: &RenewParams<'_>) -> Result<u64> {
        let sql = self.sql.get(&p.target.schema);
        let done = sqlx::query(safe(&sql.renew))
            .bind(p.ids)
            .bind(p.claim_token)
            .bind(ms(p.lease))
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    async fn events_mark_processed(&self, p: &MarkProcessedParams<'_>) -> Result<u64> {
        if p.ids.is_empty() {
            return Ok(0);
        }
        let sql = self.sql.get(&p.target.schema);
        let done = sqlx::query(safe(&sql.mark_processed))
            .bind(p.ids)
            .bind(p.claim_token)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    async fn events_mark_failed(&self, p: &MarkFailedParams<'_>) -> Result<Vec<FailedMark>> {
        if p.tries.is_empty() {
            return Ok(Vec::new());
        }
        let sql = self.sql.get(&p.target.schema);
        let ids: Vec<i64> = p.tries.iter().map(|t| t.id).collect();
        let errors: Vec<_> = p.tries.iter().map(|t| storable_error(&t.error)).collect();
        let permanent: Vec<bool> = p.tries.iter().map(|t| t.permanent).collect();
        let max_retries: Vec<Option<i32>> = p.tries.iter().map(|t| t.max_retries).collect();
        let rows = sqlx::query(safe(&sql.mark_failed))
            .bind(&ids)
            .bind(&errors)
            .bind(&permanent)
            .bind(p.claim_token)
            .bind(ms(p.retry.base))
            .bind(ms(p.retry.cap))
            .bind(&max_retries)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                Ok(FailedMark {
                    id: r.try_get(0)?,
                    retry_count: r.try_get(1)?,
                    gave_up: r.try_get(2)?,
                })
            })
            .collect()
    }

    async fn events_release(&self, p: &ReleaseParams<'_>) -> Result<u64> {
        if p.releases.is_empty() {
            return Ok(0);
        }
        let sql = self.sql.get(&p.target.schema);
        let ids: Vec<i64> = p.releases.iter().map(|r| r.id).collect();
        let errors: Vec<_> = p
            .releases
            .iter()
            .map(|r| storable_error(&r.error))
            .collect();
        let delays: Vec<f64> = p.releases.iter().map(|r| ms(r.delay)).collect();
        let done = sqlx::query(safe(&sql.release))
            .bind(&ids)
            .bind(&errors)
            .bind(&delays)
            .bind(p.claim_token)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    async fn backlog(&self, target: &Target, ordered: &[String]) -> Result<Backlog> {
        let sql = self.sql.get(&target.schema);
        let query = if ordered.is_empty() {
            sqlx::query(safe(&sql.backlog))
        } else {
            sqlx::query(safe(&sql.backlog_ordered)).bind(ordered)
        };
        let row = query
            .fetch_one(&self.pool)
            .await
            .map_err(|e| map_missing_table(e, &target.schema))?;
        Ok(Backlog {
            next_due_in: secs(row.try_get(0)?),
        })
    }

    async fn commit_horizon(
        &self,
        target: &Target,
        probe: Option<&HorizonProbe>,
    ) -> Result<Horizon> {
        let sql = self.sql.get(&target.schema);
        let (last, writers, settled): (Option<i64>, Option<Vec<String>>, Option<i64>) =
            sqlx::query_as(safe(&sql.horizon))
                .bind(probe.map(|p| p.last_id))
                .bind(probe.map(|p| &p.writers))
                .fetch_one(&self.pool)
                .await
                .map_err(|e| map_missing_table(e, &target.schema))?;
        Ok(Horizon {
            settled,
            probe: last.map(|last_id| HorizonProbe {
                last_id,
                writers: writers.unwrap_or_default(),
            }),
        })
    }

    async fn outbox_heads(&self, targets: &[Target]) -> Result<Vec<Option<i64>>> {
        let schemas: Vec<&str> = targets.iter().map(|t| t.schema.as_str()).collect();
        let heads: Vec<Option<i64>> =
            sqlx::query_scalar(include_str!("../../sql/postgres/heads.sql"))
                .bind(&schemas)
                .fetch_all(&self.pool)
                .await?;
        Ok(heads)
    }

    async fn wakeups(&self) -> Result<Option<Box<dyn Wakeups>>> {
        // A listener keeps its connection checked out for as long as it lives, so it gets a
        // connection of its own rather than one of the pool's: on a one-connection pool it
        // would otherwise leave the relay waiting for itself.
        let own = PgPoolOptions::new()
            .max_connections(1)
            .connect_lazy_with((*self.pool.connect_options()).clone());
        let mut listener = PgListener::connect_with(&own).await?;
        listener.listen(NOTIFY_CHANNEL).await?;
        Ok(Some(Box::new(PgWakeups { listener })))
    }
}

#[async_trait]
impl StoreOps for PgStore {
    async fn schema_migrate(&self, schema: &SchemaName, registry: bool) -> Result<Vec<String>> {
        let mut tx = self.pool.begin().await?;
        let mut applied = Self::migrate_in(&mut tx, schema, registry).await?;
        let index = self.retry_index_lock(schema).await?;
        tx.commit().await?;
        if let Some(conn) = index
            && Self::build_retry_index(conn, schema).await?
        {
            applied.push(RETRY_INDEX.to_owned());
        }
        // A sequence relays cannot rely on is refused here already, not first by a relay.
        let check = render(include_str!("../../sql/postgres/id_sequence.sql"), schema);
        sqlx::query(safe(&check))
            .execute(&self.pool)
            .await
            .map_err(|e| map_missing_table(e, schema))?;
        Ok(applied)
    }

    async fn events_retry_failed(&self, p: &RetryFailedParams<'_>) -> Result<u64> {
        let sql = self.sql.get(&p.target.schema);
        let done = sqlx::query(safe(&sql.retry_failed))
            .bind(p.ids)
            .bind(super::RETRIED_BY_OPERATOR)
            .execute(&self.pool)
            .await
            .map_err(|e| map_missing_table(e, &p.target.schema))?;
        Ok(done.rows_affected())
    }

    async fn events_retry_slow_lane(&self, p: &SlowLaneParams<'_>) -> Result<u64> {
        let sql = self.sql.get(&p.target.schema);
        let exclude: Vec<String> = p.exclude.iter().map(|g| g.to_like()).collect();
        let done = sqlx::query(safe(&sql.retry_slow_lane))
            .bind(p.after.as_secs_f64())
            .bind(i32::try_from(p.max_tries).unwrap_or(i32::MAX))
            .bind(i64::from(p.batch_size))
            .bind(&exclude)
            .bind(super::RETRIED_BY_SLOW_LANE)
            .execute(&self.pool)
            .await
            .map_err(|e| map_missing_table(e, &p.target.schema))?;
        Ok(done.rows_affected())
    }

    async fn events_list(&self, p: &ListParams<'_>) -> Result<Vec<StoredEvent>> {
        p.filter.validate()?;
        let schema = &p.target.schema;
        let rows = list_query(&PgList(schema), p)
            .build()
            .fetch_all(&self.pool)
            .await
            .map_err(|e| map_missing_table(e, schema))?;
        rows.iter()
            .map(|row| stored_event(row, p.target.tenant.as_ref()).map_err(Error::from))
            .collect()
    }

    async fn events_archive(&self, p: &ArchiveParams<'_>) -> Result<Option<ArchiveBatch>> {
        let schema = &p.target.schema;
        let sql = self.sql.get(schema);
        let mut tx = self.pool.begin().await?;
        if !p.dry_run && !retention_lock(&mut tx, schema).await? {
            return Ok(None);
        }
        let statement = if p.dry_run {
            &sql.archive_count
        } else {
            &sql.archive
        };
        let row = sqlx::query(safe(statement))
            .bind(p.older_than.as_secs_f64())
            .bind(p.after_id)
            .bind(batch_size(p.batch_size))
            .fetch_one(&mut *tx)
            .await
            .map_err(|e| map_missing_table(e, schema))?;
        tx.commit().await?;
        Ok(Some(ArchiveBatch {
            last_id: row.try_get(0)?,
            moved: count(row.try_get(1)?),
            done: row.try_get(2)?,
        }))
    }

    async fn events_purge(&self, p: &PurgeParams<'_>) -> Result<Option<PurgeBatch>> {
        let schema = &p.target.schema;
        let sql = self.sql.get(schema);
        let mut tx = self.pool.begin().await?;
        if !p.dry_run && !retention_lock(&mut tx, schema).await? {
            return Ok(None);
        }
        let age = p.older_than.as_secs_f64();
        let batch = match sql.row_purge(p.kind) {
            None => {
                let row = sqlx::query(safe(&sql.archive_purge))
                    .bind(age)
                    .bind(batch_size(p.batch_size))
                    .bind(p.dry_run)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(|e| map_missing_table(e, schema))?;
                let rest = count(row.try_get(1)?);
                PurgeBatch {
                    purged: count(row.try_get(0)?),
                    done: p.dry_run || rest < u64::from(p.batch_size),
                }
            }
            Some((_, counting)) if p.dry_run => PurgeBatch {
                purged: count(
                    sqlx::query_scalar(safe(counting))
                        .bind(age)
                        .fetch_one(&mut *tx)
                        .await
                        .map_err(|e| map_missing_table(e, schema))?,
                ),
                done: true,
            },
            Some((delete, _)) => {
                let gone = sqlx::query(safe(delete))
                    .bind(age)
                    .bind(i64::from(p.batch_size))
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| map_missing_table(e, schema))?
                    .rows_affected();
                PurgeBatch {
                    purged: gone,
                    done: gone < u64::from(p.batch_size),
                }
            }
        };
        tx.commit().await?;
        Ok(Some(batch))
    }

    async fn status_counts(&self, target: &Target) -> Result<StatusCounts> {
        let sql = self.sql.get(&target.schema);
        let row = sqlx::query(safe(&sql.status_counts))
            .bind(target.schema.as_str())
            .bind(EXACT_PROCESSED_COUNT)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| map_missing_table(e, &target.schema))?;
        Ok(StatusCounts {
            pending: row.try_get(0)?,
            processing: row.try_get(1)?,
            processed: row.try_get(2)?,
            failed: row.try_get(3)?,
            oldest_pending_age: secs(row.try_get(4)?),
            dead_tuples: row.try_get(5)?,
            processed_exact: row.try_get(6)?,
        })
    }

    async fn events_skip(&self, target: &Target, ids: &[i64]) -> Result<Vec<i64>> {
        let sql = self.sql.get(&target.schema);
        let mut skipped: Vec<i64> = sqlx::query_scalar(safe(&sql.skip))
            .bind(ids)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| map_missing_table(e, &target.schema))?;
        skipped.sort_unstable();
        Ok(skipped)
    }

    async fn tenant_add(&self, p: &TenantAddParams<'_>) -> Result<Tenant> {
        if p.id.as_str() == crate::schema::DEFAULT_TENANT {
            return Err(Error::InvalidName {
                kind: "tenant",
                name: p.id.to_string(),
                reason: "it names the default schema's outbox (pick another id)",
            });
        }
        let schema = p.schema.cloned().unwrap_or_else(|| p.id.default_schema());
        if schema == self.default_schema {
            return Err(Error::TenantExists(p.id.to_string()));
        }
        let mut tx = self.pool.begin().await?;
        let sql = self.sql.get(&self.default_schema);
        let row = sqlx::query(safe(&sql.tenant_add))
            .bind(p.id.as_str())
            .bind(schema.as_str())
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| map_missing_table(e, &self.default_schema))?
            .ok_or_else(|| Error::TenantExists(p.id.to_string()))?;
        let tenant = Self::tenant_from_row(&row)?;
        Self::migrate_in(&mut tx, &schema, false).await?;
        let index = self.retry_index_lock(&schema).await?;
        tx.commit().await?;
        if let Some(conn) = index {
            Self::build_retry_index(conn, &schema).await?;
        }
        Ok(tenant)
    }

    async fn tenant_list(&self) -> Result<Vec<Tenant>> {
        Ok(self
            .tenant_rows()
            .await?
            .into_iter()
            .filter_map(std::result::Result::ok)
            .collect())
    }

    async fn tenant_rejected(&self) -> Result<Vec<RejectedTenant>> {
        Ok(self
            .tenant_rows()
            .await?
            .into_iter()
            .filter_map(std::result::Result::err)
            .collect())
    }

    async fn tenant_set_status(&self, id: &TenantId, status: TenantStatus) -> Result<Tenant> {
        let sql = self.sql.get(&self.default_schema);
        let row = sqlx::query(safe(&sql.tenant_set_status))
            .bind(id.as_str())
            .bind(status.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| map_missing_table(e, &self.default_schema))?
            .ok_or_else(|| Error::UnknownTenant(id.to_string()))?;
        Self::tenant_from_row(&row)
    }

    async fn sinks_report(&self, relay_id: &str, sinks: &[SinkHealth]) -> Result<()> {
        let sql = self.sql.get(&self.default_schema);
        let mut tx = self.pool.begin().await?;
        sqlx::query(safe(&sql.sinks_forget))
            .bind(relay_id)
            .execute(&mut *tx)
            .await
            .map_err(|e| map_missing_table(e, &self.default_schema))?;
        for sink in sinks {
            sqlx::query(safe(&sql.sinks_report))
                .bind(relay_id)
                .bind(&sink.name)
                .bind(sink.up)
                .bind(sink.since)
                .bind(sink.last_error.as_deref().map(storable_error))
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn sinks_reported(&self) -> Result<Vec<ReportedSink>> {
        let sql = self.sql.get(&self.default_schema);
        let rows: Vec<super::ReportedRow> = sqlx::query_as(safe(&sql.sinks_reported))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| map_missing_table(e, &self.default_schema))?;
        Ok(super::reported_sinks(rows))
    }

    async fn inbox_stats(&self, target: &Target) -> Result<Vec<InboxStats>> {
        let sql = self.sql.get(&target.schema);
        let rows: Vec<(String, i64, i64)> = sqlx::query_as(safe(&sql.inbox_stats))
            .bind(super::INBOX_COUNT_LIMIT)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| map_missing_table(e, &target.schema))?;
        Ok(super::inbox_stats(rows))
    }

    async fn oldest_transaction_age(&self) -> Result<Option<Duration>> {
        let age: Option<f64> =
            sqlx::query_scalar(include_str!("../../sql/postgres/oldest_transaction.sql"))
                .fetch_one(&self.pool)
                .await?;
        Ok(secs(age))
    }

    async fn outbox_dead_rows(&self, targets: &[Target]) -> Result<Vec<u64>> {
        let schemas: Vec<&str> = targets.iter().map(|t| t.schema.as_str()).collect();
        let rows: Vec<(String, i64)> =
            sqlx::query_as(include_str!("../../sql/postgres/dead_rows.sql"))
                .bind(&schemas)
                .fetch_all(&self.pool)
                .await?;
        Ok(schemas
            .iter()
            .map(|s| {
                rows.iter()
                    .find(|(name, _)| name == s)
                    .map_or(0, |(_, dead)| u64::try_from(*dead).unwrap_or(0))
            })
            .collect())
    }

    async fn outbox_vacuum(&self, target: &Target) -> Result<()> {
        // VACUUM cannot run in a transaction and may take a while on a large table, so it gets
        // a connection of its own rather than holding one of the relay's.
        let mut conn = PgConnection::connect_with(&self.pool.connect_options()).await?;
        // Only the owner (or a superuser) may vacuum; anyone else gets a warning and nothing
        // done, so ask first.
        let may: Option<bool> =
            sqlx::query_scalar(include_str!("../../sql/postgres/may_vacuum.sql"))
                .bind(target.schema.as_str())
                .fetch_optional(&mut conn)
                .await?;
        match may {
            None => {
                return Err(Error::NotMigrated {
                    schema: target.schema.as_str().to_owned(),
                });
            }
            Some(false) => {
                return Err(Error::NotOwner {
                    schema: target.schema.as_str().to_owned(),
                });
            }
            Some(true) => {}
        }
        let ours: bool = sqlx::query_scalar(include_str!("../../sql/postgres/vacuum_lock.sql"))
            .bind(target.schema.as_str())
            .bind(pg_locks::VACUUM)
            .fetch_one(&mut conn)
            .await?;
        if !ours {
            return Ok(());
        }
        sqlx::raw_sql(include_str!("../../sql/postgres/vacuum_wait.sql"))
            .execute(&mut conn)
            .await?;
        let sql = self.sql.get(&target.schema);
        sqlx::raw_sql(safe(&sql.vacuum)).execute(&mut conn).await?;
        conn.close().await.ok();
        Ok(())
    }
}

struct PgWakeups {
    listener: PgListener,
}

#[async_trait]
impl Wakeups for PgWakeups {
    async fn next(&mut self) -> Result<Option<String>> {
        let n = self.listener.recv().await?;
        // Notifications that queued up meanwhile say nothing more: one round serves them all.
        while self.listener.next_buffered().is_some() {}
        Ok(Some(n.payload().to_owned()))
    }
}

#[cfg(test)]
mod lock_tests {
    /// The lock statements take their key as `$2` (from [`super::pg_locks`]), never as a
    /// number or a name of their own.
    #[test]
    fn lock_statements_take_the_key_as_a_parameter() {
        for (file, sql) in [
            (
                "migrate_lock",
                include_str!("../../sql/postgres/migrate_lock.sql"),
            ),
            (
                "vacuum_lock",
                include_str!("../../sql/postgres/vacuum_lock.sql"),
            ),
            (
                "retry_index_lock",
                include_str!("../../sql/postgres/retry_index_lock.sql"),
            ),
            (
                "retention_lock",
                include_str!("../../sql/postgres/retention_lock.sql"),
            ),
        ] {
            let code: String = sql
                .lines()
                .filter(|l| !l.trim_start().starts_with("--"))
                .collect();
            assert!(
                code.contains("advisory") && code.contains("$2"),
                "{file}: {code}"
            );
            assert!(
                !code.contains('\'')
                    && !code
                        .chars()
                        .any(|c| c.is_ascii_digit() && c != '1' && c != '2'),
                "{file}: a key written in the statement: {code}"
            );
        }
    }
}
