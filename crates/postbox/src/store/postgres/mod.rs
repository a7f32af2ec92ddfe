//! The PostgreSQL store: the production back-end.
//!
//! This file holds the store type, its statements per schema and the two trait impls, which
//! hand each call to the file of its concern: migrations (`migrate.rs`), the claim
//! (`claim.rs`), the marks a relay and an operator make (`marks.rs`), the commit horizon and the
//! table heads (`horizon.rs`), wake-ups (`wakeups.rs`), listing and retention (`history.rs`),
//! tenants (`tenants.rs`), status and upkeep (`status.rs`), sink health (`health.rs`), the
//! inbox (`inbox.rs`), and a CDC relay beside the polling claim (`cdc_reader.rs`).

mod cdc_reader;
mod claim;
mod connect;
mod functions;
mod health;
mod history;
mod horizon;
pub(crate) mod inbox;
mod marks;
mod migrate;
pub(crate) mod outbox;
mod sql;
mod status;
mod tenants;
mod wakeups;

use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::PgPool;

use super::{
    ArchiveBatch, ArchiveParams, Backlog, BacklogFrom, Capabilities, ClaimParams, Claimed,
    FailedMark, GapParams, Gaps, Horizon, HorizonProbe, ListParams, MarkFailedParams,
    MarkProcessedParams, PurgeBatch, PurgeKind, PurgeParams, RejectedTenant, ReleaseParams,
    RenewParams, ReportedSink, RetryFailedParams, SlowLaneParams, StatusCounts, Store, StoredEvent,
    Tenant, TenantAddParams, TenantStatus, Wakeups,
};
use crate::error::{Error, Result};
use crate::inbox::InboxStats;
use crate::ops::StoreOps;
use crate::schema::{SchemaName, Target, TenantId};
use crate::sink::SinkHealth;
use sql::{PerSchema, render, safe};

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

struct PgSql {
    claim: std::sync::Arc<str>,
    claim_unordered: std::sync::Arc<str>,
    claim_ids: std::sync::Arc<str>,
    read_ids: std::sync::Arc<str>,
    ids_taken: std::sync::Arc<str>,
    ordered_put_back: std::sync::Arc<str>,
    mark_unclaimed: std::sync::Arc<str>,
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
    backlog_from: std::sync::Arc<str>,
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
            claim: render(
                include_str!("../../../sql/postgres/queries/claim.sql"),
                schema,
            ),
            claim_unordered: render(
                include_str!("../../../sql/postgres/queries/claim_unordered.sql"),
                schema,
            ),
            claim_ids: render(
                include_str!("../../../sql/postgres/queries/claim_ids.sql"),
                schema,
            ),
            read_ids: render(
                include_str!("../../../sql/postgres/queries/read_ids.sql"),
                schema,
            ),
            ids_taken: render(
                include_str!("../../../sql/postgres/queries/ids_taken.sql"),
                schema,
            ),
            ordered_put_back: render(
                include_str!("../../../sql/postgres/queries/ordered_put_back.sql"),
                schema,
            ),
            mark_unclaimed: render(
                include_str!("../../../sql/postgres/queries/mark_unclaimed.sql"),
                schema,
            ),
            floor: render(
                include_str!("../../../sql/postgres/queries/claim_floor.sql"),
                schema,
            ),
            gaps: render(
                include_str!("../../../sql/postgres/queries/claim_gaps.sql"),
                schema,
            ),
            horizon: render(
                include_str!("../../../sql/postgres/queries/horizon.sql"),
                schema,
            ),
            skip: render(
                include_str!("../../../sql/postgres/queries/skip.sql"),
                schema,
            ),
            renew: render(
                include_str!("../../../sql/postgres/queries/renew.sql"),
                schema,
            ),
            mark_processed: render(
                include_str!("../../../sql/postgres/queries/mark_processed.sql"),
                schema,
            ),
            mark_failed: render(
                include_str!("../../../sql/postgres/queries/mark_failed.sql"),
                schema,
            ),
            release: render(
                include_str!("../../../sql/postgres/queries/release.sql"),
                schema,
            ),
            status_counts: render(
                include_str!("../../../sql/postgres/queries/status_counts.sql"),
                schema,
            ),
            backlog: render(
                include_str!("../../../sql/postgres/queries/backlog.sql"),
                schema,
            ),
            backlog_from: render(
                include_str!("../../../sql/postgres/queries/backlog_from.sql"),
                schema,
            ),
            backlog_ordered: render(
                include_str!("../../../sql/postgres/queries/backlog_ordered.sql"),
                schema,
            ),
            retry_failed: render(
                include_str!("../../../sql/postgres/queries/retry_failed.sql"),
                schema,
            ),
            retry_slow_lane: render(
                include_str!("../../../sql/postgres/queries/retry_slow_lane.sql"),
                schema,
            ),
            vacuum: render(
                include_str!("../../../sql/postgres/queries/vacuum.sql"),
                schema,
            ),
            archive: render(
                include_str!("../../../sql/postgres/queries/archive.sql"),
                schema,
            ),
            archive_count: render(
                include_str!("../../../sql/postgres/queries/archive_count.sql"),
                schema,
            ),
            archive_purge: render(
                include_str!("../../../sql/postgres/queries/archive_purge.sql"),
                schema,
            ),
            purge_failed: render(
                include_str!("../../../sql/postgres/queries/purge_failed.sql"),
                schema,
            ),
            purge_failed_count: render(
                include_str!("../../../sql/postgres/queries/purge_failed_count.sql"),
                schema,
            ),
            inbox_purge: render(
                include_str!("../../../sql/postgres/queries/inbox_purge.sql"),
                schema,
            ),
            inbox_purge_count: render(
                include_str!("../../../sql/postgres/queries/inbox_purge_count.sql"),
                schema,
            ),
            inbox_stats: render(
                include_str!("../../../sql/postgres/queries/inbox_stats.sql"),
                schema,
            ),
            tenant_list: render(
                include_str!("../../../sql/postgres/queries/tenant_list.sql"),
                schema,
            ),
            tenant_add: render(
                include_str!("../../../sql/postgres/queries/tenant_add.sql"),
                schema,
            ),
            tenant_set_status: render(
                include_str!("../../../sql/postgres/queries/tenant_set_status.sql"),
                schema,
            ),
            sinks_forget: render(
                include_str!("../../../sql/postgres/queries/sinks_forget.sql"),
                schema,
            ),
            sinks_report: render(
                include_str!("../../../sql/postgres/queries/sinks_report.sql"),
                schema,
            ),
            sinks_reported: render(
                include_str!("../../../sql/postgres/queries/sinks_reported.sql"),
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
    /// Whether claims of the default schema leave its events to a CDC relay that reads them
    /// ([`PgStore::leave_to_cdc_relay`]); `None` when they do not.
    cdc_reader: Option<cdc_reader::CdcReader>,
}

/// A duration as milliseconds, the unit the SQL takes leases and backoffs in.
fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
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

impl PgStore {
    /// A store whose default schema is `public`.
    pub fn new(pool: PgPool) -> Self {
        Self::with_schema(pool, SchemaName::public())
    }

    /// A store whose default schema (its own outbox and the tenant registry) is `schema`.
    pub fn with_schema(pool: PgPool, schema: SchemaName) -> Self {
        PgStore {
            pool,
            sql: PerSchema::new(PgSql::build),
            cdc_reader: Some(cdc_reader::CdcReader::new(&schema)),
            default_schema: schema,
        }
    }

    /// Whether this store's claims of its default schema leave the events to a CDC relay
    /// (`postbox-cdc`) that reads that outbox from a replication slot (default: they do). A
    /// CDC relay publishes what it reads without a claim, which a polling relay cannot see:
    /// side by side, both would take each new event and publish a share of all traffic twice.
    /// So while such a relay reads and keeps confirming, a polling relay leaves it the default
    /// schema's events and those of every tenant whose outbox table a publication holds (the
    /// CDC relay adds its active tenants'); it claims them again within a second of that relay
    /// stopping, or once its confirmation has stood still for a minute while the server's WAL
    /// grew. Retries, expired leases and what the slot does not deliver are the CDC relay's
    /// own poll's. A CDC relay records its slot in `postbox_cdc_slots` (migration
    /// `0020_registry_cdc_slots`); a slot there that a reader holds is what a poller looks for,
    /// once a second. The CDC relay's own store sets this off.
    ///
    /// ```no_run
    /// # async fn example(pool: sqlx::PgPool) {
    /// // A poller that claims every event whatever else reads the table.
    /// let store = postbox::PgStore::new(pool).leave_to_cdc_relay(false);
    /// # }
    /// ```
    pub fn leave_to_cdc_relay(mut self, leave: bool) -> Self {
        self.cdc_reader = leave.then(|| cdc_reader::CdcReader::new(&self.default_schema));
        self
    }

    /// The connection pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

#[async_trait]
impl Store for PgStore {
    fn capabilities(&self) -> Capabilities {
        Capabilities::SERVER
    }

    async fn claim_floor(&self, target: &Target, from: i64, settled: i64) -> Result<i64> {
        self.floor(target, from, settled).await
    }

    async fn claim_gaps(&self, p: &GapParams<'_>) -> Result<Gaps> {
        self.gaps(p).await
    }

    fn default_schema(&self) -> SchemaName {
        self.default_schema.clone()
    }

    async fn events_claim(&self, p: &ClaimParams<'_>) -> Result<Claimed> {
        if let Some(reader) = &self.cdc_reader
            && reader
                .serves(
                    &self.pool,
                    &p.target.schema,
                    p.target.tenant.is_none() && p.target.schema == self.default_schema,
                )
                .await
        {
            return Ok(Claimed::default());
        }
        self.claim(p).await
    }

    async fn leases_renew(&self, p: &RenewParams<'_>) -> Result<u64> {
        self.renew(p).await
    }

    async fn events_mark_processed(&self, p: &MarkProcessedParams<'_>) -> Result<u64> {
        self.mark_processed(p).await
    }

    async fn events_mark_failed(&self, p: &MarkFailedParams<'_>) -> Result<Vec<FailedMark>> {
        self.mark_failed(p).await
    }

    async fn events_release(&self, p: &ReleaseParams<'_>) -> Result<u64> {
        self.release(p).await
    }

    async fn backlog(&self, target: &Target, ordered: &[String]) -> Result<Backlog> {
        self.read_backlog(target, ordered).await
    }

    async fn outbox_due(
        &self,
        targets: &[Target],
        ordered: &[String],
    ) -> Result<Vec<Option<Duration>>> {
        self.read_due(targets, ordered).await
    }

    async fn commit_horizon(
        &self,
        target: &Target,
        probe: Option<&HorizonProbe>,
    ) -> Result<Horizon> {
        self.horizon(target, probe).await
    }

    async fn backlog_from(&self, target: &Target, from: &BacklogFrom) -> Result<Backlog> {
        self.read_backlog_from(target, from).await
    }

    async fn horizon_writers_age(
        &self,
        _target: &Target,
        probe: &HorizonProbe,
    ) -> Result<Option<Duration>> {
        self.writers_age(probe).await
    }

    async fn outbox_heads(
        &self,
        targets: &[Target],
        known: &[Option<i64>],
    ) -> Result<Vec<(usize, Option<i64>)>> {
        self.heads(targets, known).await
    }

    async fn wakeups(&self) -> Result<Option<Box<dyn Wakeups>>> {
        self.listen().await
    }
}

#[async_trait]
impl StoreOps for PgStore {
    async fn schema_migrate(&self, schema: &SchemaName, registry: bool) -> Result<Vec<String>> {
        self.migrate_schema(schema, registry).await
    }

    async fn events_retry_failed(&self, p: &RetryFailedParams<'_>) -> Result<u64> {
        self.retry_failed(p).await
    }

    async fn events_retry_slow_lane(&self, p: &SlowLaneParams<'_>) -> Result<u64> {
        self.retry_slow_lane(p).await
    }

    async fn events_list(&self, p: &ListParams<'_>) -> Result<Vec<StoredEvent>> {
        self.list(p).await
    }

    async fn events_archive(&self, p: &ArchiveParams<'_>) -> Result<Option<ArchiveBatch>> {
        self.archive(p).await
    }

    async fn events_purge(&self, p: &PurgeParams<'_>) -> Result<Option<PurgeBatch>> {
        self.purge(p).await
    }

    async fn status_counts(&self, target: &Target) -> Result<StatusCounts> {
        self.count_statuses(target).await
    }

    async fn status_outstanding(
        &self,
        targets: &[Target],
    ) -> Result<Vec<crate::store::Outstanding>> {
        self.read_outstanding(targets).await
    }

    async fn events_skip(&self, target: &Target, ids: &[i64]) -> Result<Vec<i64>> {
        self.skip(target, ids).await
    }

    async fn tenant_add(&self, p: &TenantAddParams<'_>) -> Result<Tenant> {
        self.add_tenant(p).await
    }

    async fn tenant_list(&self) -> Result<Vec<Tenant>> {
        self.list_tenants().await
    }

    async fn tenant_rejected(&self) -> Result<Vec<RejectedTenant>> {
        self.rejected_tenants().await
    }

    async fn tenant_set_status(&self, id: &TenantId, status: TenantStatus) -> Result<Tenant> {
        self.set_tenant_status(id, status).await
    }

    async fn sinks_report(&self, relay_id: &str, sinks: &[SinkHealth]) -> Result<()> {
        self.record_sink_health(relay_id, sinks).await
    }

    async fn sinks_reported(&self) -> Result<Vec<ReportedSink>> {
        self.read_sink_health().await
    }

    async fn inbox_stats(&self, target: &Target) -> Result<Vec<InboxStats>> {
        self.read_inbox_stats(target).await
    }

    async fn oldest_transaction_age(&self) -> Result<Option<Duration>> {
        self.oldest_transaction().await
    }

    async fn replication_slots(&self) -> Result<Vec<super::ReplicationSlot>> {
        self.read_replication_slots().await
    }

    async fn outbox_dead_rows(&self, targets: &[Target]) -> Result<Vec<u64>> {
        self.dead_rows(targets).await
    }

    async fn outbox_vacuum(&self, target: &Target) -> Result<()> {
        self.vacuum(target).await
    }

    async fn vacuum_horizon(&self) -> Result<Option<String>> {
        Ok(sqlx::query_scalar(include_str!(
            "../../../sql/postgres/queries/vacuum_horizon.sql"
        ))
        .fetch_optional(&self.pool)
        .await?
        .flatten())
    }

    async fn vacuum_held_read(&self, target: &Target) -> Result<Option<String>> {
        let sql = render(
            include_str!("../../../sql/postgres/queries/vacuum_held_read.sql"),
            &self.default_schema,
        );
        Ok(sqlx::query_scalar(safe(&sql))
            .bind(target.schema.as_str())
            .fetch_optional(&self.pool)
            .await?)
    }

    async fn vacuum_held_record(&self, target: &Target, held: Option<&str>) -> Result<()> {
        let sql = render(
            include_str!("../../../sql/postgres/queries/vacuum_held_record.sql"),
            &self.default_schema,
        );
        sqlx::query(safe(&sql))
            .bind(target.schema.as_str())
            .bind(held)
            .execute(&self.pool)
            .await?;
        Ok(())
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
                include_str!("../../../sql/postgres/queries/migrate_lock.sql"),
            ),
            (
                "vacuum_lock",
                include_str!("../../../sql/postgres/queries/vacuum_lock.sql"),
            ),
            (
                "retry_index_lock",
                include_str!("../../../sql/postgres/queries/retry_index_lock.sql"),
            ),
            (
                "retention_lock",
                include_str!("../../../sql/postgres/queries/retention_lock.sql"),
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
