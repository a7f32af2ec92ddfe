//! The operator's surface of a store: what `postbox status`, `postbox events`, retention,
//! tenants and the admin API need, beside the relay's hot path ([`Store`](crate::Store)).
//!
//! [`StoreOps`] is a supertrait of [`Store`](crate::Store): every store has both. Its methods
//! are required too: a store that cannot do one says so by answering
//! [`Error::Unsupported`](crate::Error::Unsupported) (or an empty answer where "nothing" is
//! true), in its own code, where a reader of that store sees it.

use std::time::Duration;

use async_trait::async_trait;

use crate::error::Result;
use crate::inbox::InboxStats;
use crate::schema::{SchemaName, Target, TenantId};
use crate::sink::SinkHealth;
use crate::store::{
    ArchiveBatch, ArchiveParams, ListParams, Outstanding, PurgeBatch, PurgeParams, RejectedTenant,
    ReplicationSlot, ReportedSink, RetryFailedParams, SlowLaneParams, StatusCounts, StoredEvent,
    Tenant, TenantAddParams, TenantStatus,
};

/// The operator's surface of a store. See the module docs.
#[async_trait]
pub trait StoreOps: Send + Sync {
    /// Creates or upgrades the outbox tables of `schema`; with `registry`, also the tenant
    /// registry (the default schema has it). Safe to run concurrently and repeatedly.
    async fn schema_migrate(&self, schema: &SchemaName, registry: bool) -> Result<Vec<String>>;

    /// Puts `FAILED` events back to `PENDING` with `retry_count` 0 (an operator's retry, once the
    /// cause is fixed); returns how many. Events in any other state are left alone.
    async fn events_retry_failed(&self, params: &RetryFailedParams<'_>) -> Result<u64>;

    /// Counts the events of a target by status, without reading its processed history (see
    /// [`StatusCounts::processed`]).
    async fn status_counts(&self, target: &Target) -> Result<StatusCounts>;

    /// What waits in each of `targets` (in the same order): the events not done and the
    /// `FAILED` ones, and the age of the oldest outstanding, in as few statements as the
    /// database allows (one per hundred tenant schemas on PostgreSQL; no history read). What a
    /// status over thousands of tenants, and the admin server's gauges, read. Fails as a whole
    /// if one target cannot be read; [`StoreOps::status_counts`] then tells which.
    async fn status_outstanding(&self, targets: &[Target]) -> Result<Vec<Outstanding>>;

    /// The slow lane: `FAILED` events whose last try is older than `after` and that had fewer
    /// than `max_tries` slow-lane tries go back to `PENDING` for one more try (their
    /// `retry_count` raised to `max_retries`, so one failure makes them `FAILED` again; then
    /// `retry_count - max_retries` is the number of slow-lane tries they had). Returns how many.
    async fn events_retry_slow_lane(&self, params: &SlowLaneParams<'_>) -> Result<u64>;

    /// An operator's skip of the held-back heads of ordered aggregates: the events (`PENDING`
    /// or `FAILED`, not in flight) go `FAILED` and no longer hold back the later events of
    /// their aggregate; a retry undoes it. Returns the ids skipped.
    async fn events_skip(&self, target: &Target, ids: &[i64]) -> Result<Vec<i64>>;

    /// A page of the events of [`target`](ListParams::target) that match a filter, in the
    /// order asked for, from the outbox table and, with
    /// [`EventFilter::archive`](crate::store::EventFilter::archive), from the archive; resume
    /// after the last id of a page. Each call is one short read. Refuses an invalid filter
    /// ([`EventFilter::validate`](crate::store::EventFilter::validate)).
    async fn events_list(&self, params: &ListParams<'_>) -> Result<Vec<StoredEvent>>;

    /// One batch of retention: moves `PROCESSED` events created more than
    /// [`older_than`](ArchiveParams::older_than) ago to `outbox_events_archive`, walking the
    /// table in id order from [`after_id`](ArchiveParams::after_id) (with `dry_run`, counts
    /// them). Each batch is a short transaction; loop until [`ArchiveBatch::done`]. `None` when
    /// another relay or command is archiving this table now (try later).
    async fn events_archive(&self, params: &ArchiveParams<'_>) -> Result<Option<ArchiveBatch>>;

    /// One batch of purging archived or `FAILED` events older than
    /// [`older_than`](PurgeParams::older_than) (with `dry_run`, counts every batch's worth at
    /// once). Loop until [`PurgeBatch::done`]. `None` when another relay or command is purging
    /// this table now.
    async fn events_purge(&self, params: &PurgeParams<'_>) -> Result<Option<PurgeBatch>>;

    /// Registers a tenant and migrates its schema.
    async fn tenant_add(&self, params: &TenantAddParams<'_>) -> Result<Tenant>;

    /// Every registered tenant that can be served, by id (see [`StoreOps::tenant_rejected`]
    /// for the rest).
    async fn tenant_list(&self) -> Result<Vec<Tenant>>;

    /// Registry rows that cannot be served: added by hand with an id or schema name Postbox
    /// refuses. Relays skip them and say so; `postbox status` lists them.
    async fn tenant_rejected(&self) -> Result<Vec<RejectedTenant>>;

    /// Suspends or resumes a tenant.
    async fn tenant_set_status(&self, id: &TenantId, status: TenantStatus) -> Result<Tenant>;

    /// Dead row versions in the outbox table of each of `targets`, in the same order, as far as
    /// the database's statistics know (stores without dead rows report zero).
    async fn outbox_dead_rows(&self, targets: &[Target]) -> Result<Vec<u64>>;

    /// Removes the dead row versions that marks leave in `target`'s outbox table and its
    /// indexes (PostgreSQL `VACUUM`; nothing to do elsewhere). A table another relay is
    /// vacuuming is skipped; an autovacuum worker on the table gives way. Fails with
    /// [`Error::NotOwner`](crate::Error::NotOwner) when the database role may not vacuum the
    /// table.
    async fn outbox_vacuum(&self, target: &Target) -> Result<()>;

    /// Records what relay `relay_id` sees of its sinks now (replacing its earlier report), for
    /// [`StoreOps::sinks_reported`].
    async fn sinks_report(&self, relay_id: &str, sinks: &[SinkHealth]) -> Result<()>;

    /// What every relay last reported of its sinks, oldest reports included (see
    /// [`ReportedSink::reported_ago`]).
    async fn sinks_reported(&self) -> Result<Vec<ReportedSink>>;

    /// The consumers of `target`'s inbox ([`Inbox`](crate::inbox::Inbox)): each one's messages
    /// recorded and repeats skipped, by consumer name.
    async fn inbox_stats(&self, target: &Target) -> Result<Vec<InboxStats>>;

    /// Age of the oldest open transaction in the database, where the database can tell. A long
    /// one keeps vacuum from removing processed events' dead rows, and claims slow down.
    async fn oldest_transaction_age(&self) -> Result<Option<Duration>>;

    /// The logical replication slots of the database (PostgreSQL; none elsewhere): the CDC
    /// relay's, each with the WAL it holds back.
    async fn replication_slots(&self) -> Result<Vec<ReplicationSlot>>;

    /// What holds vacuum back in the database, where the database can tell (PostgreSQL: the
    /// oldest transaction id whose snapshot or writes keep dead row versions; `None` elsewhere,
    /// or when nothing does). While it stays what it was at a table's last
    /// [`outbox_vacuum`](StoreOps::outbox_vacuum), another vacuum of that table removes nothing.
    async fn vacuum_horizon(&self) -> Result<Option<String>> {
        Ok(None)
    }

    /// What held vacuum back ([`vacuum_horizon`](StoreOps::vacuum_horizon)) when a relay last
    /// vacuumed `target`'s outbox table, as [`vacuum_held_record`](StoreOps::vacuum_held_record)
    /// kept it (PostgreSQL: the default schema's `postbox_vacuums`; `None` elsewhere). A relay
    /// started later does not vacuum the table again while the same transaction holds it back.
    async fn vacuum_held_read(&self, target: &Target) -> Result<Option<String>> {
        let _ = target;
        Ok(None)
    }

    /// Keeps what held vacuum back (`None`: nothing) when a relay vacuumed `target`'s outbox
    /// table, for [`vacuum_held_read`](StoreOps::vacuum_held_read) (kept nowhere but on
    /// PostgreSQL).
    async fn vacuum_held_record(&self, target: &Target, held: Option<&str>) -> Result<()> {
        let _ = (target, held);
        Ok(())
    }
}

/// Implements [`StoreOps`] for a type by handing every call to the store `$inner` gives (an
/// expression of `self`). See [`forward_store!`](crate::forward_store).
#[macro_export]
macro_rules! forward_store_ops {
    ($ty:ty, |$s:ident| $inner:expr) => {
        #[$crate::__async_trait]
        impl $crate::ops::StoreOps for $ty {
            async fn schema_migrate(
                &$s,
                schema: &$crate::SchemaName,
                registry: bool,
            ) -> $crate::Result<Vec<String>> {
                $crate::ops::StoreOps::schema_migrate($inner, schema, registry).await
            }
            async fn events_retry_failed(
                &$s,
                p: &$crate::store::RetryFailedParams<'_>,
            ) -> $crate::Result<u64> {
                $crate::ops::StoreOps::events_retry_failed($inner, p).await
            }
            async fn status_counts(
                &$s,
                target: &$crate::Target,
            ) -> $crate::Result<$crate::store::StatusCounts> {
                $crate::ops::StoreOps::status_counts($inner, target).await
            }
            async fn status_outstanding(
                &$s,
                targets: &[$crate::Target],
            ) -> $crate::Result<Vec<$crate::store::Outstanding>> {
                $crate::ops::StoreOps::status_outstanding($inner, targets).await
            }
            async fn events_retry_slow_lane(
                &$s,
                p: &$crate::store::SlowLaneParams<'_>,
            ) -> $crate::Result<u64> {
                $crate::ops::StoreOps::events_retry_slow_lane($inner, p).await
            }
            async fn events_skip(
                &$s,
                target: &$crate::Target,
                ids: &[i64],
            ) -> $crate::Result<Vec<i64>> {
                $crate::ops::StoreOps::events_skip($inner, target, ids).await
            }
            async fn events_list(
                &$s,
                p: &$crate::store::ListParams<'_>,
            ) -> $crate::Result<Vec<$crate::store::StoredEvent>> {
                $crate::ops::StoreOps::events_list($inner, p).await
            }
            async fn events_archive(
                &$s,
                p: &$crate::store::ArchiveParams<'_>,
            ) -> $crate::Result<Option<$crate::store::ArchiveBatch>> {
                $crate::ops::StoreOps::events_archive($inner, p).await
            }
            async fn events_purge(
                &$s,
                p: &$crate::store::PurgeParams<'_>,
            ) -> $crate::Result<Option<$crate::store::PurgeBatch>> {
                $crate::ops::StoreOps::events_purge($inner, p).await
            }
            async fn tenant_add(
                &$s,
                p: &$crate::store::TenantAddParams<'_>,
            ) -> $crate::Result<$crate::store::Tenant> {
                $crate::ops::StoreOps::tenant_add($inner, p).await
            }
            async fn tenant_list(&$s) -> $crate::Result<Vec<$crate::store::Tenant>> {
                $crate::ops::StoreOps::tenant_list($inner).await
            }
            async fn tenant_rejected(
                &$s,
            ) -> $crate::Result<Vec<$crate::store::RejectedTenant>> {
                $crate::ops::StoreOps::tenant_rejected($inner).await
            }
            async fn tenant_set_status(
                &$s,
                id: &$crate::schema::TenantId,
                status: $crate::store::TenantStatus,
            ) -> $crate::Result<$crate::store::Tenant> {
                $crate::ops::StoreOps::tenant_set_status($inner, id, status).await
            }
            async fn outbox_dead_rows(
                &$s,
                targets: &[$crate::Target],
            ) -> $crate::Result<Vec<u64>> {
                $crate::ops::StoreOps::outbox_dead_rows($inner, targets).await
            }
            async fn outbox_vacuum(&$s, target: &$crate::Target) -> $crate::Result<()> {
                $crate::ops::StoreOps::outbox_vacuum($inner, target).await
            }
            async fn sinks_report(
                &$s,
                relay_id: &str,
                sinks: &[$crate::sink::SinkHealth],
            ) -> $crate::Result<()> {
                $crate::ops::StoreOps::sinks_report($inner, relay_id, sinks).await
            }
            async fn sinks_reported(
                &$s,
            ) -> $crate::Result<Vec<$crate::store::ReportedSink>> {
                $crate::ops::StoreOps::sinks_reported($inner).await
            }
            async fn inbox_stats(
                &$s,
                target: &$crate::Target,
            ) -> $crate::Result<Vec<$crate::inbox::InboxStats>> {
                $crate::ops::StoreOps::inbox_stats($inner, target).await
            }
            async fn oldest_transaction_age(
                &$s,
            ) -> $crate::Result<Option<std::time::Duration>> {
                $crate::ops::StoreOps::oldest_transaction_age($inner).await
            }
            async fn replication_slots(
                &$s,
            ) -> $crate::Result<Vec<$crate::store::ReplicationSlot>> {
                $crate::ops::StoreOps::replication_slots($inner).await
            }
            async fn vacuum_horizon(&$s) -> $crate::Result<Option<String>> {
                $crate::ops::StoreOps::vacuum_horizon($inner).await
            }
            async fn vacuum_held_read(
                &$s,
                target: &$crate::Target,
            ) -> $crate::Result<Option<String>> {
                $crate::ops::StoreOps::vacuum_held_read($inner, target).await
            }
            async fn vacuum_held_record(
                &$s,
                target: &$crate::Target,
                held: Option<&str>,
            ) -> $crate::Result<()> {
                $crate::ops::StoreOps::vacuum_held_record($inner, target, held).await
            }
        }
    };
}
