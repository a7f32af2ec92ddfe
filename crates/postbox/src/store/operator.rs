//! What the operator's surface ([`StoreOps`](crate::ops::StoreOps)) passes to a store and gets
//! back: status counts, the backlog, sink and inbox reports, rejected tenants, retries and new
//! tenants.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::secs;
use crate::inbox::InboxStats;
use crate::schema::{SchemaName, Target, TenantId};
use crate::sink::SinkHealth;

#[cfg(doc)]
use super::Store;

/// The events of one target by status, for `postbox status`.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct StatusCounts {
    /// `PENDING` events (new, or waiting for a retry).
    pub pending: i64,
    /// `PROCESSING` events (claimed by a relay).
    pub processing: i64,
    /// `PROCESSED` events still in the table: counted exactly on a table of up to
    /// [`EXACT_PROCESSED_COUNT`] of them, estimated from the database's statistics above that
    /// (see `processed_exact`), so that a long history is not read to count it.
    pub processed: i64,
    /// Whether `processed` is an exact count (`false`: an estimate).
    pub processed_exact: bool,
    /// `FAILED` events awaiting an operator.
    pub failed: i64,
    /// Age of the oldest `PENDING` or `PROCESSING` event, by the database clock.
    #[serde(with = "opt_secs")]
    pub oldest_pending_age: Option<Duration>,
    /// Dead row versions in the target's `outbox_events` (PostgreSQL's statistics; `None` on
    /// SQLite). Many of them slow claims down until vacuum removes them.
    pub dead_tuples: Option<i64>,
}

/// What waits in one outbox: the part of [`StatusCounts`] a summary over many outboxes reads
/// ([`StoreOps::status_outstanding`](crate::ops::StoreOps::status_outstanding)).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Outstanding {
    /// `PENDING` events (new, or waiting for a retry).
    pub pending: i64,
    /// `PROCESSING` events (claimed by a relay).
    pub processing: i64,
    /// `FAILED` events awaiting an operator.
    pub failed: i64,
    /// Age of the oldest `PENDING` or `PROCESSING` event, by the database clock.
    #[serde(with = "opt_secs")]
    pub oldest_pending_age: Option<Duration>,
}

impl From<&StatusCounts> for Outstanding {
    fn from(c: &StatusCounts) -> Self {
        Outstanding {
            pending: c.pending,
            processing: c.processing,
            failed: c.failed,
            oldest_pending_age: c.oldest_pending_age,
        }
    }
}

/// [`StoreOps::status_outstanding`](crate::ops::StoreOps::status_outstanding) for a store that
/// reads one target per statement: [`StoreOps::status_counts`](crate::ops::StoreOps) of each.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) async fn outstanding_each<S: crate::ops::StoreOps + ?Sized>(
    store: &S,
    targets: &[crate::schema::Target],
) -> crate::Result<Vec<Outstanding>> {
    let mut out = Vec::with_capacity(targets.len());
    for target in targets {
        out.push(Outstanding::from(&store.status_counts(target).await?));
    }
    Ok(out)
}

mod opt_secs {
    use std::time::Duration;

    pub(super) fn serialize<S: serde::Serializer>(
        d: &Option<Duration>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_some(&d.as_secs_f64()),
            None => s.serialize_none(),
        }
    }
}

/// Up to how many `PROCESSED` events [`StoreOps::status_counts`](crate::ops::StoreOps::status_counts) counts exactly.
pub const EXACT_PROCESSED_COUNT: i64 = 100_000;

/// What is still to do in one target, for draining.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Backlog {
    /// How long until an outstanding (`PENDING` or `PROCESSING`) event can be claimed: zero if
    /// one can be now, else until the earliest lease or backoff runs out; `None` when nothing is
    /// outstanding.
    pub next_due_in: Option<Duration>,
}

/// One relay's last report of one sink.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct ReportedSink {
    /// The relay that reported.
    pub relay_id: String,
    /// What it saw.
    #[serde(flatten)]
    pub health: SinkHealth,
    /// How long ago it reported (a relay that stopped reports no more).
    #[serde(with = "secs_f64")]
    pub reported_ago: Duration,
}

/// A row of `postbox_sink_health` as every store reads it: relay, sink, up, since, last error,
/// seconds since the report.
pub(crate) type ReportedRow = (String, String, bool, DateTime<Utc>, Option<String>, f64);

/// The consumers of [`Store::inbox_stats`] from their rows (consumer, messages, duplicates).
pub(crate) fn inbox_stats(rows: Vec<(String, i64, i64)>) -> Vec<InboxStats> {
    rows.into_iter()
        .map(|(consumer, messages, duplicates)| InboxStats::new(consumer, messages, duplicates))
        .collect()
}

/// The reports of [`Store::sinks_reported`] from their rows.
pub(crate) fn reported_sinks(rows: Vec<ReportedRow>) -> Vec<ReportedSink> {
    rows.into_iter()
        .map(
            |(relay_id, name, up, since, last_error, age)| ReportedSink {
                relay_id,
                health: SinkHealth::new(name, up, since, last_error),
                reported_ago: secs(Some(age)).unwrap_or_default(),
            },
        )
        .collect()
}

mod secs_f64 {
    use std::time::Duration;

    pub(super) fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }
}

/// A tenant registry row that cannot be served, and why.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct RejectedTenant {
    /// The id as stored.
    pub id: String,
    /// The schema name as stored.
    pub schema: String,
    /// What is wrong with it.
    pub reason: String,
}

/// Parameters of [`StoreOps::events_retry_failed`](crate::ops::StoreOps::events_retry_failed).
#[derive(Clone, Debug)]
pub struct RetryFailedParams<'a> {
    /// Whose events.
    pub target: &'a Target,
    /// The events to retry; `None` retries every `FAILED` event of the target.
    pub ids: Option<&'a [i64]>,
}

/// Parameters of [`StoreOps::events_retry_slow_lane`](crate::ops::StoreOps::events_retry_slow_lane).
#[derive(Clone, Debug)]
pub struct SlowLaneParams<'a> {
    /// Whose events.
    pub target: &'a Target,
    /// How long after its last try a `FAILED` event gets another.
    pub after: Duration,
    /// Slow-lane tries an event gets at most (tries past its `max_retries`).
    pub max_tries: u32,
    /// Events released at most in this call.
    pub batch_size: u32,
    /// Event types the slow lane skips.
    pub exclude: &'a [crate::glob::Glob],
    /// How long each statement waits for a lock on the table (another session's `ALTER TABLE`,
    /// `VACUUM FULL`, `LOCK TABLE`) before it fails with the database's lock-timeout error;
    /// `None` waits as long as the lock is held. PostgreSQL only: MySQL and SQLite wait as
    /// their own settings say (`lock_wait_timeout`, the busy timeout).
    pub lock_wait: Option<Duration>,
}

/// Parameters of [`StoreOps::tenant_add`](crate::ops::StoreOps::tenant_add).
#[derive(Clone, Debug)]
pub struct TenantAddParams<'a> {
    /// The new tenant.
    pub id: &'a TenantId,
    /// Its schema; `None` for `s_<tenant>`.
    pub schema: Option<&'a SchemaName>,
}

impl<'a> TenantAddParams<'a> {
    /// Tenant `id` in its default schema `s_<tenant>`.
    pub fn new(id: &'a TenantId) -> Self {
        TenantAddParams { id, schema: None }
    }
}

/// A logical replication slot of the outbox's database (PostgreSQL): what a CDC relay reads
/// (`postbox relay --source cdc`), and the WAL it keeps on the server.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct ReplicationSlot {
    /// The slot's name.
    pub name: String,
    /// Whether a reader is connected now. A slot nobody reads keeps WAL until one does or it is
    /// dropped.
    pub active: bool,
    /// WAL the slot holds back, in bytes: from its confirmed position to the server's current
    /// one.
    pub lag_bytes: Option<i64>,
    /// `reserved`, `extended`, `unreserved` (about to be invalidated) or `lost`.
    pub wal_status: Option<String>,
    /// WAL the slot may still hold before `max_slot_wal_keep_size` invalidates it, in bytes;
    /// `None` without a limit.
    pub safe_wal_bytes: Option<i64>,
    /// WAL the server keeps for the slot, in bytes: from its `restart_lsn` (where decoding
    /// restarts) to the server's current position. It can be far more than
    /// [`lag_bytes`](Self::lag_bytes): `restart_lsn` cannot pass a transaction that was open
    /// when the slot last moved, whatever its reader confirmed. This is what fills the disk.
    pub kept_bytes: Option<i64>,
    /// The open transaction that holds [`kept_bytes`](Self::kept_bytes) back, when the slot
    /// keeps more than 16 MiB beyond its confirmed position: the oldest one that wrote.
    pub pinned_by: Option<OpenTransaction>,
}

/// An open transaction of the server ([`ReplicationSlot::pinned_by`]), as `pg_stat_activity`
/// shows it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct OpenTransaction {
    /// The backend's process id (`SELECT pg_terminate_backend(pid)` ends it).
    pub pid: i32,
    /// Its database.
    pub database: Option<String>,
    /// Its role.
    pub user: Option<String>,
    /// Its `application_name`.
    pub application: Option<String>,
    /// How long the transaction has been open, in seconds.
    pub age_secs: f64,
    /// `active`, `idle in transaction`, …
    pub state: Option<String>,
    /// The start of its current or last statement (200 characters).
    pub query: Option<String>,
}

impl Eq for OpenTransaction {}
