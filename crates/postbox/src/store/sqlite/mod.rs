//! The SQLite store: the embedded, zero-setup default. One outbox per database file; no tenants.
//!
//! This file holds the store type and the two trait impls, with the answers of what SQLite has
//! no need of (floors, a horizon probe, wake-ups, tenants, vacuum) written in place; the rest
//! is handed to the file of its concern: opening the database (`connect.rs`), migrations
//! (`migrate.rs`), the claim and the heads (`claim.rs`), marks (`marks.rs`), listing and
//! retention (`history.rs`), status (`status.rs`), sink health (`health.rs`) and the inbox
//! (`inbox.rs`).

mod claim;
mod connect;
mod health;
mod history;
pub(crate) mod inbox;
mod marks;
mod migrate;
pub(crate) mod outbox;
mod status;

use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::SqlitePool;

use super::{
    ArchiveBatch, ArchiveParams, Backlog, Capabilities, ClaimParams, Claimed, FailedMark,
    GapParams, Gaps, Horizon, HorizonProbe, ListParams, MarkFailedParams, MarkProcessedParams,
    PurgeBatch, PurgeParams, RejectedTenant, ReleaseParams, RenewParams, ReportedSink,
    RetryFailedParams, SlowLaneParams, StatusCounts, Store, StoredEvent, Tenant, TenantAddParams,
    TenantStatus, Wakeups,
};
use crate::error::{Error, Result};
use crate::inbox::InboxStats;
use crate::ops::StoreOps;
use crate::schema::{SchemaName, Target, TenantId};
use crate::sink::SinkHealth;

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

/// A duration as milliseconds, the unit the SQL takes leases and backoffs in.
fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
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

impl SqliteStore {
    fn check_target(target: &Target) -> Result<()> {
        if target.tenant.is_some() {
            return Err(Error::Unsupported(NO_TENANTS));
        }
        Ok(())
    }
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

    async fn outbox_heads(
        &self,
        targets: &[Target],
        known: &[Option<i64>],
    ) -> Result<Vec<(usize, Option<i64>)>> {
        self.heads(targets, known).await
    }

    async fn backlog(&self, target: &Target, ordered: &[String]) -> Result<Backlog> {
        self.read_backlog(target, ordered).await
    }

    async fn outbox_due(
        &self,
        targets: &[Target],
        ordered: &[String],
    ) -> Result<Vec<Option<Duration>>> {
        crate::store::due_each(self, targets, ordered).await
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

    async fn replication_slots(&self) -> Result<Vec<super::ReplicationSlot>> {
        Ok(Vec::new())
    }

    async fn schema_migrate(&self, _schema: &SchemaName, _registry: bool) -> Result<Vec<String>> {
        // One outbox per database: no schema to name, no registry.
        self.apply_migrations().await
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
        crate::store::outstanding_each(self, targets).await
    }

    async fn events_skip(&self, target: &Target, ids: &[i64]) -> Result<Vec<i64>> {
        self.skip(target, ids).await
    }

    async fn sinks_report(&self, relay_id: &str, sinks: &[SinkHealth]) -> Result<()> {
        self.record_sink_health(relay_id, sinks).await
    }

    async fn inbox_stats(&self, target: &Target) -> Result<Vec<InboxStats>> {
        self.read_inbox_stats(target).await
    }

    async fn sinks_reported(&self) -> Result<Vec<ReportedSink>> {
        self.read_sink_health().await
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
