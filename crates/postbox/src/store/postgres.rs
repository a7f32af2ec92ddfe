//! The PostgreSQL store: the production back-end.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::Connection;
use sqlx::postgres::{PgConnection, PgListener, PgPool, PgPoolOptions, PgRow};
// Statements built with format! below interpolate only `SchemaName::quoted()` and constant
// text, which is why they may be wrapped in `AssertSqlSafe`.
use sqlx::{AssertSqlSafe, Row};
use uuid::Uuid;

use super::migrations::{self, Migration};
use super::row::{add_claimed_row, stored_event};
use super::sql::{PerSchema, render, safe};
use super::{
    ArchiveBatch, ArchiveParams, Backlog, ClaimParams, Claimed, EXACT_PROCESSED_COUNT, FailedMark,
    Horizon, HorizonProbe, ListParams, MarkFailedParams, MarkProcessedParams, Order, PurgeBatch,
    PurgeKind, PurgeParams, RejectedTenant, ReleaseParams, RenewParams, ReportedSink,
    RetryFailedParams, SlowLaneParams, StatusCounts, Store, StoredEvent, Tenant, TenantAddParams,
    TenantStatus, Wakeups, ms, secs, storable_error,
};
use crate::error::{Error, Result};
use crate::schema::{SchemaName, Target, TenantId};
use crate::sink::SinkHealth;

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
    claim_ordered: std::sync::Arc<str>,
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
}

impl PgSql {
    fn build(schema: &SchemaName) -> Self {
        PgSql {
            claim: render(include_str!("../../sql/postgres/claim.sql"), schema),
            claim_ordered: render(include_str!("../../sql/postgres/claim_ordered.sql"), schema),
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

    fn registry(&self) -> String {
        format!("{}.postbox_tenants", self.default_schema.quoted())
    }

    async fn migrate_in(
        conn: &mut sqlx::PgConnection,
        schema: &SchemaName,
        registry: bool,
    ) -> Result<Vec<String>> {
        // Serialize concurrent migrations of the same schema (several relays starting at once).
        sqlx::query("SELECT pg_advisory_xact_lock(7012026, hashtext($1))")
            .bind(schema.as_str())
            .execute(&mut *conn)
            .await?;
        let q = schema.quoted();
        // "already exists, skipping" notices are noise in an operator's log.
        sqlx::query("SET LOCAL client_min_messages = warning")
            .execute(&mut *conn)
            .await?;
        sqlx::raw_sql(AssertSqlSafe(format!("CREATE SCHEMA IF NOT EXISTS {q}")))
            .execute(&mut *conn)
            .await?;
        let wanted: Vec<Migration> = OUTBOX_MIGRATIONS
            .iter()
            .chain(if registry { REGISTRY_MIGRATIONS } else { &[] })
            .copied()
            .collect();
        let applied = migrations::apply::<sqlx::Postgres>(
            conn,
            &format!("{q}.postbox_schema_history"),
            "TIMESTAMPTZ NOT NULL DEFAULT now()",
            &wanted,
            |template| render(template, schema).to_string(),
        )
        .await?;
        Ok(applied)
    }

    /// Every registry row: a tenant, or why it cannot be served (a row added by hand with a
    /// name Postbox refuses).
    async fn tenant_rows(&self) -> Result<Vec<std::result::Result<Tenant, RejectedTenant>>> {
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT id, schema_name, status, created_at FROM {} ORDER BY id",
            self.registry()
        )))
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

/// One table's part of a list statement: its rows matching the filter, in the page's range.
/// Only fixed SQL text and the quoted schema are pushed; every value is bound.
fn list_branch(
    query: &mut sqlx::QueryBuilder<sqlx::Postgres>,
    schema: &SchemaName,
    table: &'static str,
    p: &ListParams<'_>,
) {
    let f = p.filter;
    query.push(
        "(SELECT id, status, event_type::text AS event_type, \
         aggregate_type::text AS aggregate_type, aggregate_id::text AS aggregate_id, \
         idempotency_key::text AS idempotency_key, event_class::text AS event_class, \
         schema_version, headers::text AS headers, payload::text AS payload, retry_count, \
         max_retries, last_error, processed_at, locked_until, locked_by, created_at, \
         updated_at, ",
    );
    query.push(if table == "outbox_events" {
        "NULL::timestamptz AS archived_at"
    } else {
        "archived_at"
    });
    query.push(format_args!(" FROM {}.{table} WHERE TRUE", schema.quoted()));
    if !f.ids.is_empty() {
        query.push(" AND id = ANY(");
        query.push_bind(f.ids.clone());
        query.push(")");
    }
    if !f.statuses.is_empty() {
        let statuses: Vec<&'static str> = f.statuses.iter().map(|s| s.as_str()).collect();
        query.push(" AND status = ANY(");
        query.push_bind(statuses);
        query.push(")");
    }
    if let Some(glob) = &f.event_type {
        query.push(" AND event_type LIKE ");
        query.push_bind(glob.to_like());
        query.push(" ESCAPE '\\'");
    }
    if let Some(glob) = &f.aggregate_type {
        query.push(" AND aggregate_type LIKE ");
        query.push_bind(glob.to_like());
        query.push(" ESCAPE '\\'");
    }
    if let Some(id) = &f.aggregate_id {
        query.push(" AND aggregate_id = ");
        query.push_bind(id.clone());
    }
    if f.parked && table == "outbox_events" {
        query.push(format_args!(
            " AND status = 'FAILED' AND skipped_at IS NULL AND aggregate_id IS NOT NULL \
             AND EXISTS (SELECT 1 FROM {}.outbox_events l \
             WHERE l.aggregate_type = {table}.aggregate_type \
             AND l.aggregate_id = {table}.aggregate_id AND l.id > {table}.id \
             AND l.status IN ('PENDING', 'PROCESSING'))",
            schema.quoted()
        ));
    }
    if let Some(since) = f.since {
        query.push(" AND created_at >= ");
        query.push_bind(since);
    }
    if let Some(until) = f.until {
        query.push(" AND created_at < ");
        query.push_bind(until);
    }
    let newest_first = p.order == Order::NewestFirst;
    if let Some(after) = p.after {
        query.push(if newest_first {
            " AND id < "
        } else {
            " AND id > "
        });
        query.push_bind(after);
    }
    query.push(if newest_first {
        " ORDER BY id DESC LIMIT "
    } else {
        " ORDER BY id ASC LIMIT "
    });
    query.push_bind(i64::from(p.limit));
    query.push(")");
}

/// Takes the retention lock of `schema`'s outbox for the rest of `tx`: archiving and purging run
/// one at a time per table (relays and commands alike). False when another session holds it.
async fn retention_lock(tx: &mut sqlx::PgConnection, schema: &SchemaName) -> Result<bool> {
    Ok(sqlx::query_scalar(
        "SELECT pg_try_advisory_xact_lock(hashtext('postbox_retention'), hashtext($1))",
    )
    .bind(schema.as_str())
    .fetch_one(tx)
    .await?)
}

/// A batch size as the SQL functions take it.
fn batch_size(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// A count read from SQL (never negative).
fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

fn map_missing_table(err: sqlx::Error, schema: &SchemaName) -> Error {
    if let sqlx::Error::Database(db) = &err
        // undefined table, undefined schema, undefined function (postbox_claim)
        && matches!(db.code().as_deref(), Some("42P01" | "3F000" | "42883"))
    {
        return Error::NotMigrated {
            schema: schema.to_string(),
        };
    }
    Error::Database(err)
}

#[async_trait]
impl Store for PgStore {
    async fn schema_migrate(&self, schema: &SchemaName, registry: bool) -> Result<Vec<String>> {
        let mut tx = self.pool.begin().await?;
        let applied = Self::migrate_in(&mut tx, schema, registry).await?;
        tx.commit().await?;
        Ok(applied)
    }

    fn default_schema(&self) -> SchemaName {
        self.default_schema.clone()
    }

    async fn events_claim(&self, p: &ClaimParams<'_>) -> Result<Claimed> {
        let sql = self.sql.get(&p.target.schema);
        let token = Uuid::new_v4();
        let ordered = p.order.is_on();
        let query = sqlx::query(safe(if ordered {
            &sql.claim_ordered
        } else {
            &sql.claim
        }))
        .bind(i32::try_from(p.batch_size).unwrap_or(i32::MAX))
        .bind(ms(p.lease))
        .bind(p.relay_id)
        .bind(token);
        let query = if ordered {
            query
                .bind(p.order.aggregate_types)
                .bind(p.order.settled_through)
        } else {
            query
        };
        let rows = query
            .fetch_all(&self.pool)
            .await
            .map_err(|e| map_missing_table(e, &p.target.schema))?;
        let mut claimed = Claimed {
            claim_token: token,
            events: Vec::with_capacity(rows.len()),
            ..Claimed::default()
        };
        for row in &rows {
            add_claimed_row(&mut claimed, row, p.target.tenant.as_ref())?;
        }
        // UPDATE … RETURNING does not keep the order of the picked rows (a join that spills into
        // batches reorders them); the contract is id order.
        claimed.events.sort_unstable_by_key(|e| e.id);
        Ok(claimed)
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

    async fn events_retry_failed(&self, p: &RetryFailedParams<'_>) -> Result<u64> {
        let sql = self.sql.get(&p.target.schema);
        let done = sqlx::query(safe(&sql.retry_failed))
            .bind(p.ids)
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
            .execute(&self.pool)
            .await
            .map_err(|e| map_missing_table(e, &p.target.schema))?;
        Ok(done.rows_affected())
    }

    async fn events_list(&self, p: &ListParams<'_>) -> Result<Vec<StoredEvent>> {
        p.filter.validate()?;
        let schema = &p.target.schema;
        let mut query = sqlx::QueryBuilder::<sqlx::Postgres>::new("SELECT * FROM (");
        list_branch(&mut query, schema, "outbox_events", p);
        if p.filter.reads_archive() {
            query.push(" UNION ALL ");
            list_branch(&mut query, schema, "outbox_events_archive", p);
        }
        query.push(") AS e ORDER BY id ");
        query.push(match p.order {
            Order::NewestFirst => "DESC",
            Order::OldestFirst => "ASC",
        });
        query.push(" LIMIT ");
        query.push_bind(i64::from(p.limit));
        let rows = query
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
        let batch = match (p.kind, p.dry_run) {
            (PurgeKind::Archive, dry_run) => {
                let row = sqlx::query(safe(&sql.archive_purge))
                    .bind(age)
                    .bind(batch_size(p.batch_size))
                    .bind(dry_run)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(|e| map_missing_table(e, schema))?;
                let rest = count(row.try_get(1)?);
                PurgeBatch {
                    purged: count(row.try_get(0)?),
                    done: dry_run || rest < u64::from(p.batch_size),
                }
            }
            (PurgeKind::Failed, true) => PurgeBatch {
                purged: count(
                    sqlx::query_scalar(safe(&sql.purge_failed_count))
                        .bind(age)
                        .fetch_one(&mut *tx)
                        .await
                        .map_err(|e| map_missing_table(e, schema))?,
                ),
                done: true,
            },
            (PurgeKind::Failed, false) => {
                let gone = sqlx::query(safe(&sql.purge_failed))
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
        let schema = p.schema.cloned().unwrap_or_else(|| p.id.default_schema());
        if schema == self.default_schema {
            return Err(Error::TenantExists(p.id.to_string()));
        }
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {} (id, schema_name) VALUES ($1, $2)
             ON CONFLICT DO NOTHING
             RETURNING id, schema_name, status, created_at",
            self.registry()
        )))
        .bind(p.id.as_str())
        .bind(schema.as_str())
        .fetch_optional(&mut *tx)
        .await
        .map_err(|e| map_missing_table(e, &self.default_schema))?
        .ok_or_else(|| Error::TenantExists(p.id.to_string()))?;
        let tenant = Self::tenant_from_row(&row)?;
        Self::migrate_in(&mut tx, &schema, false).await?;
        tx.commit().await?;
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
        let row = sqlx::query(AssertSqlSafe(format!(
            "UPDATE {} SET status = $2 WHERE id = $1 RETURNING id, schema_name, status, created_at",
            self.registry()
        )))
        .bind(id.as_str())
        .bind(status.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| map_missing_table(e, &self.default_schema))?
        .ok_or_else(|| Error::UnknownTenant(id.to_string()))?;
        Self::tenant_from_row(&row)
    }

    async fn sinks_report(&self, relay_id: &str, sinks: &[SinkHealth]) -> Result<()> {
        let table = format!("{}.postbox_sink_health", self.default_schema.quoted());
        let mut tx = self.pool.begin().await?;
        // Safe: a quoted, validated schema name and a constant.
        sqlx::query(AssertSqlSafe(format!(
            "DELETE FROM {table} WHERE relay_id = $1 OR reported_at < now() - interval '1 day'"
        )))
        .bind(relay_id)
        .execute(&mut *tx)
        .await
        .map_err(|e| map_missing_table(e, &self.default_schema))?;
        for sink in sinks {
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {table} (relay_id, sink, up, since, last_error)
                 VALUES ($1, $2, $3, $4, $5)"
            )))
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
        let rows: Vec<super::ReportedRow> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT relay_id, sink, up, since, last_error,
                        EXTRACT(EPOCH FROM now() - reported_at)::float8
                 FROM {}.postbox_sink_health ORDER BY sink, relay_id",
            self.default_schema.quoted()
        )))
        .fetch_all(&self.pool)
        .await
        .map_err(|e| map_missing_table(e, &self.default_schema))?;
        Ok(super::reported_sinks(rows))
    }

    async fn oldest_transaction_age(&self) -> Result<Option<Duration>> {
        // Only transactions that hold a snapshot (backend_xmin) keep vacuum from working.
        let age: Option<f64> = sqlx::query_scalar(
            "SELECT EXTRACT(EPOCH FROM now() - min(xact_start))::float8
             FROM pg_stat_activity
             WHERE datname = current_database() AND backend_xmin IS NOT NULL
               AND pid <> pg_backend_pid()",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(secs(age))
    }

    async fn outbox_heads(&self, targets: &[Target]) -> Result<Vec<Option<i64>>> {
        let schemas: Vec<&str> = targets.iter().map(|t| t.schema.as_str()).collect();
        // The identity column's sequence, read without touching the table: one buffer each.
        let heads: Vec<Option<i64>> = sqlx::query_scalar(
            "SELECT CASE WHEN q.seq IS NULL THEN NULL
                         -- NULL until the sequence's first use: no row yet.
                         ELSE coalesce(pg_sequence_last_value(q.seq), 0) END
             FROM unnest($1::text[]) WITH ORDINALITY AS s(name, n),
                  LATERAL (SELECT to_regclass(quote_ident(s.name) || '.outbox_events_id_seq')
                          AS seq) AS q
             ORDER BY s.n",
        )
        .bind(&schemas)
        .fetch_all(&self.pool)
        .await?;
        Ok(heads)
    }

    async fn outbox_dead_rows(&self, targets: &[Target]) -> Result<Vec<u64>> {
        let schemas: Vec<&str> = targets.iter().map(|t| t.schema.as_str()).collect();
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "SELECT schemaname::text, n_dead_tup FROM pg_stat_user_tables
             WHERE relname = 'outbox_events' AND schemaname = ANY($1)",
        )
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
        let may: Option<bool> = sqlx::query_scalar(
            "SELECT pg_has_role(c.relowner, 'USAGE')
                    OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = $1 AND c.relname = 'outbox_events'",
        )
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
        // One relay vacuums a table at a time; the others skip it. The lock is the session's,
        // so it goes with the connection.
        let ours: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock(7012027, hashtext($1))")
            .bind(target.schema.as_str())
            .fetch_one(&mut conn)
            .await?;
        if !ours {
            return Ok(());
        }
        // Waits for an autovacuum worker to give way, not for an operator's vacuum.
        sqlx::raw_sql("SET lock_timeout = '60s'")
            .execute(&mut conn)
            .await?;
        let sql = self.sql.get(&target.schema);
        sqlx::raw_sql(safe(&sql.vacuum)).execute(&mut conn).await?;
        conn.close().await.ok();
        Ok(())
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
