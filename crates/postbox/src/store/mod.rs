//! The store seam: what the relay and the admin commands need from a database.
//!
//! The relay engine never names a database driver. It talks to a [`Store`], whose methods are
//! noun-first with one params struct each; [`PgStore`], [`SqliteStore`] and [`MySqlStore`]
//! implement it and pass one shared conformance suite (`tests/store_conformance.rs`).

use std::ops::RangeInclusive;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::error::Result;
use crate::event::OutboxEvent;
use crate::inbox::{INBOX_COUNT_LIMIT, Inbox, InboxStats};
use crate::outbox::{Outbox, OutboxBuilder};
use crate::schema::{SchemaName, Target, TenantId};
use crate::sink::SinkHealth;

mod list;
mod migrations;
mod reads;
mod retention;
mod row;

// One folder per database, each built only with its cargo feature: the one place a database's
// feature gates its code (the enums that list every database, `AnyStore` and the outbox's
// connection, name the features once in a macro). The databases' stores are re-exported here
// and at the crate root through `stores`.
#[cfg(feature = "mysql")]
pub(crate) mod mysql;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
#[cfg(feature = "sqlite")]
pub(crate) mod sqlite;

#[cfg(any(feature = "postgres", feature = "mysql"))]
mod server;

/// The store of each database this build has, re-exported here and at the crate root.
pub(crate) mod stores {
    #[cfg(feature = "mysql")]
    pub use super::mysql::MySqlStore;
    #[cfg(feature = "postgres")]
    pub use super::postgres::PgStore;
    #[cfg(feature = "sqlite")]
    pub use super::sqlite::SqliteStore;
}

pub use crate::schema::{Tenant, TenantStatus};
#[cfg(feature = "postgres")]
pub use postgres::pg_locks;
pub use reads::{
    EventFilter, EventStatus, FilterText, ListParams, Order, ParseTimeError, StoredEvent,
    StoredEventError, parse_time,
};
pub use retention::{
    ArchiveBatch, ArchiveParams, PurgeBatch, PurgeKind, PurgeParams, archive_all, purge_all,
};
pub use row::Undecodable;
pub use stores::*;

/// Seconds read from SQL as a duration; a negative value (overdue) is zero.
pub(crate) fn secs(v: Option<f64>) -> Option<Duration> {
    v.map(|s| Duration::from_secs_f64(s.max(0.0)))
}

/// What a stale event's `last_error` says when a claim takes it over from a relay whose lease ran
/// out (a failed try, G3): every store's claim writes this text, with `{relay}` replaced by the
/// relay that held it.
pub(crate) const LEASE_EXPIRED: &str =
    "lease expired: relay {relay} did not finish publishing in time (crashed or stalled)";

/// Parameters of [`Store::events_claim`].
#[derive(Clone, Debug)]
pub struct ClaimParams<'a> {
    /// Whose events to claim.
    pub target: &'a Target,
    /// At most this many events.
    pub batch_size: u32,
    /// How long the claim lasts before another relay may take the events over.
    pub lease: Duration,
    /// This relay's id, written to `locked_by`.
    pub relay_id: &'a str,
    /// Which events go one aggregate at a time, in commit order (G6); none by default.
    pub order: ClaimOrder<'a>,
    /// Where new work is claimed from: an id below which every event is finished or went
    /// wrong once (see [`Store::claim_floor`]); 0 claims from the start. Stores that do not
    /// [claim from a floor](Store::claims_from_floor) ignore it.
    pub floor: i64,
}

/// Per-aggregate ordering of a claim (G6, `docs/guarantees.md`): an event of an ordered
/// aggregate type is claimed only once every earlier event of its aggregate is `PROCESSED` or
/// skipped by an operator (or taken by the same claim, which then holds its aggregate's events
/// in id order), and once its id is at or below the commit horizon.
///
/// ```
/// let types = vec!["Invoice".to_owned()];
/// let order = postbox::store::ClaimOrder {
///     aggregate_types: &types,
///     settled_through: 42,
///     walk: 400,
///     sweep: false,
/// };
/// assert!(order.is_on());
/// assert!(!postbox::store::ClaimOrder::default().is_on());
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct ClaimOrder<'a> {
    /// Ordered aggregate types; `*` orders every aggregate; empty turns ordering off.
    pub aggregate_types: &'a [String],
    /// The commit horizon ([`Store::commit_horizon`]): ordered events above this id are not
    /// claimed yet, since a transaction that may still commit an earlier id is running.
    pub settled_through: i64,
    /// With ordering on, the span of ids the claim reads in id order, from the first due event
    /// at or above the floor, each event checked against the earlier events of its aggregate.
    /// When events there wait for their aggregates and the batch is not full, it takes ready
    /// aggregates' heads (and the events right behind them) directly, looking at up to
    /// 4 × `batch_size` aggregates, so that its cost does not grow with the events waiting
    /// behind aggregates in flight or parked; when nothing there waits, it reads on in id
    /// order. 0 reads on to the end. Stores whose claim reads in id order only (MySQL/MariaDB,
    /// SQLite) ignore it.
    pub walk: u32,
    /// Whether the claim is a sweep: it looks at every aggregate's head, not only the first
    /// 4 × `batch_size`, and also takes the due events past the [`walk`](Self::walk) that are
    /// not ordered (no aggregate, or a type not in [`aggregate_types`](Self::aggregate_types)),
    /// in one read of them without a check of their aggregates. A relay makes one a second;
    /// until then such events wait for the events before them.
    pub sweep: bool,
}

impl ClaimOrder<'_> {
    /// Whether any aggregate type is ordered.
    pub fn is_on(&self) -> bool {
        !self.aggregate_types.is_empty()
    }
}

/// Parameters of [`Store::claim_gaps`].
#[derive(Clone, Debug)]
pub struct GapParams<'a> {
    /// Whose table to read.
    pub target: &'a Target,
    /// Ranges of ids a relay's floor or cursor went past while none of them was visible (a
    /// transaction still open, one that rolled back, rows removed): the rows in them now are
    /// looked up.
    pub passed: &'a [RangeInclusive<i64>],
    /// The first `limit` ids present after this one are read, in id order.
    pub after: i64,
    /// See [`after`](Self::after); 0 reads none.
    pub limit: u32,
}

/// The answer of [`Store::claim_gaps`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Gaps {
    /// The ids present (visible, whatever their status) after [`GapParams::after`], ascending.
    pub present: Vec<i64>,
    /// The rows now in [`GapParams::passed`]: committed since the relay passed them.
    pub found: Vec<PassedEvent>,
}

/// A row in one of [`GapParams::passed`], committed since the relay passed its id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PassedEvent {
    /// Its id.
    pub id: i64,
    /// In flight or waiting without having gone wrong (no `last_error`): below the floor, only
    /// the relay's passed ranges find it.
    pub unfinished: bool,
    /// Unfinished, and no relay holds a lease on it: a claim may take it now.
    pub claimable: bool,
}

/// A probe of a table's commit horizon, kept between calls of [`Store::commit_horizon`]: the
/// last id drawn when it was taken, and the transactions then writing to the table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HorizonProbe {
    /// The last id the table's sequence had handed out.
    pub last_id: i64,
    /// The writers of the table then (PostgreSQL virtual transaction ids).
    pub writers: Vec<String>,
}

/// The answer of [`Store::commit_horizon`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Horizon {
    /// Every event at or below this id is committed or rolled back for good, when known.
    pub settled: Option<i64>,
    /// The probe to pass to the next call.
    pub probe: Option<HorizonProbe>,
}

/// The result of [`Store::events_claim`].
#[derive(Debug, Default)]
pub struct Claimed {
    /// The fencing token of this claim; every later write on these events must present it.
    pub claim_token: Uuid,
    /// Events now `PROCESSING` under this relay's lease, in id order.
    pub events: Vec<OutboxEvent>,
    /// How many of `events` were stale claims of a relay that did not finish in time (their lost
    /// lease counted as a failed try).
    pub recovered: u64,
    /// Stale events whose lost lease was their last allowed try: they are now `FAILED`.
    pub exhausted: Vec<ExhaustedEvent>,
    /// Claimed events whose rows cannot be read (a column a producer filled with what cannot be
    /// decoded); the relay fails them at once, fenced by this claim's token.
    pub undecodable: Vec<Undecodable>,
}

/// A stale event that went `FAILED` when its lease ran out on its last try.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExhaustedEvent {
    /// The event id.
    pub id: i64,
    /// Its event type.
    pub event_type: String,
    /// The failed tries, now equal to the event's `max_retries`.
    pub retry_count: i32,
    /// The reason stored in `last_error`.
    pub last_error: String,
}

/// Parameters of [`Store::leases_renew`].
#[derive(Clone, Debug)]
pub struct RenewParams<'a> {
    /// Whose events.
    pub target: &'a Target,
    /// The claim's fencing token.
    pub claim_token: Uuid,
    /// The events still being published.
    pub ids: &'a [i64],
    /// The new lease, from the database's `now()`.
    pub lease: Duration,
}

/// Parameters of [`Store::events_mark_processed`].
#[derive(Clone, Debug)]
pub struct MarkProcessedParams<'a> {
    /// Whose events.
    pub target: &'a Target,
    /// The claim's fencing token; rows claimed since by another relay are left alone.
    pub claim_token: Uuid,
    /// Events whose publishing was acknowledged.
    pub ids: &'a [i64],
}

/// One failed try, for [`Store::events_mark_failed`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailedTry {
    /// The event id.
    pub id: i64,
    /// The error, stored in `last_error` (without NUL characters, and cut to
    /// [`MAX_ERROR_BYTES`]).
    pub error: String,
    /// A permanent error sends the event to `FAILED` at once, whatever its retries.
    pub permanent: bool,
    /// Tries before `FAILED` for this event, instead of its `max_retries` column (a retry
    /// policy of its type); `None` keeps the column's.
    pub max_retries: Option<i32>,
}

/// Parameters of [`Store::events_mark_failed`].
#[derive(Clone, Debug)]
pub struct MarkFailedParams<'a> {
    /// Whose events.
    pub target: &'a Target,
    /// The claim's fencing token.
    pub claim_token: Uuid,
    /// The failed tries.
    pub tries: &'a [FailedTry],
    /// The backoff before the next try.
    pub retry: crate::Backoff,
}

/// An event whose destination was down, for [`Store::events_release`].
#[derive(Clone, Debug, PartialEq)]
pub struct Release {
    /// The event id.
    pub id: i64,
    /// Why, stored in `last_error` (cleaned as [`FailedTry::error`] is).
    pub error: String,
    /// When to try it again, from the database's `now()`.
    pub delay: Duration,
}

/// Parameters of [`Store::events_release`].
#[derive(Clone, Debug)]
pub struct ReleaseParams<'a> {
    /// Whose events.
    pub target: &'a Target,
    /// The claim's fencing token.
    pub claim_token: Uuid,
    /// The events to put back.
    pub releases: &'a [Release],
}

/// What became of one failed try.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailedMark {
    /// The event id.
    pub id: i64,
    /// Failed tries so far, this one included.
    pub retry_count: i32,
    /// `true` when the event is now `FAILED` for good; `false` when it waits for a retry.
    pub gave_up: bool,
}

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

/// The longest error text stored in `last_error`, in bytes; longer ones are cut (on a character
/// boundary) and end in `…`.
pub const MAX_ERROR_BYTES: usize = 4096;

/// An error text as it can be stored: secrets hidden ([`crate::redact::redact`]), without NUL
/// characters (PostgreSQL's text cannot hold them, and one would make the whole mark fail) and
/// at most [`MAX_ERROR_BYTES`] long.
pub(crate) fn storable_error(error: &str) -> std::borrow::Cow<'_, str> {
    let error = crate::redact::redact(error);
    if error.len() <= MAX_ERROR_BYTES && !error.contains('\0') {
        return std::borrow::Cow::Owned(error);
    }
    let mut text: String = error.chars().filter(|c| *c != '\0').collect();
    if text.len() > MAX_ERROR_BYTES {
        let mut cut = MAX_ERROR_BYTES - '…'.len_utf8();
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push('…');
    }
    std::borrow::Cow::Owned(text)
}

/// Up to how many `PROCESSED` events [`Store::status_counts`] counts exactly.
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

/// Parameters of [`Store::events_retry_failed`].
#[derive(Clone, Debug)]
pub struct RetryFailedParams<'a> {
    /// Whose events.
    pub target: &'a Target,
    /// The events to retry; `None` retries every `FAILED` event of the target.
    pub ids: Option<&'a [i64]>,
}

/// Parameters of [`Store::events_retry_slow_lane`].
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
}

/// Parameters of [`Store::tenant_add`].
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

/// A wake-up source: yields when events may have been committed (PostgreSQL `NOTIFY`).
///
/// Notifications are hints only: one can be lost (for example during a reconnect), so the relay
/// still polls.
#[async_trait]
pub trait Wakeups: Send {
    /// Waits for the next hint. Returns the schema named in it, if any; an error means the
    /// listener broke and the caller should fall back to polling.
    async fn next(&mut self) -> Result<Option<String>>;
}

/// What a store can do beyond the contract every store keeps, declared by the store itself
/// ([`Store::capabilities`], a required method): a wrapper forwards the answer of the store it
/// wraps, and cannot drop a capability by leaving a method out.
///
/// ```
/// # async fn example() -> postbox::Result<()> {
/// use postbox::Store;
/// let store = postbox::connect("sqlite::memory:").await?;
/// let caps = store.capabilities();
/// assert!(!caps.claims_from_floor);      // SQLite claims scan from the first due event
/// assert!(caps.ids_in_commit_order);    // one writer at a time: ids are commit order
/// assert_eq!(caps.claim_path(), "scan");
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Capabilities {
    /// Whether [`Store::events_claim`] takes [`ClaimParams::floor`], with floors from
    /// [`Store::claim_floor`]: the claim's cost then depends on the batch, not on the dead row
    /// versions the marks left behind (PostgreSQL, MySQL/MariaDB). A relay claims from a floor
    /// exactly when its store says so.
    pub claims_from_floor: bool,
    /// Whether ids are drawn in commit order (SQLite: one writer at a time), so that every
    /// committed id is settled at once and [`Store::commit_horizon`] needs no probe.
    pub ids_in_commit_order: bool,
}

impl Capabilities {
    /// The capabilities of a store that claims from a floor and tracks its commit horizon with
    /// probes (PostgreSQL, MySQL/MariaDB).
    pub const SERVER: Capabilities = Capabilities {
        claims_from_floor: true,
        ids_in_commit_order: false,
    };

    /// The capabilities of a store that claims by scanning from the first due event and draws
    /// ids in commit order (SQLite).
    pub const EMBEDDED: Capabilities = Capabilities {
        claims_from_floor: false,
        ids_in_commit_order: true,
    };

    /// The name of the claim path these capabilities give a relay: `floor` or `scan`. Relays
    /// log it when they start and export it as `postbox_relay_claim_path{path}`.
    pub fn claim_path(&self) -> &'static str {
        if self.claims_from_floor {
            "floor"
        } else {
            "scan"
        }
    }
}

/// The database behind an outbox, as the relay's hot path needs it: claims, leases, marks,
/// the commit horizon and wake-ups. See the module docs.
///
/// Every method is required, with no default: what a store can do is declared by
/// [`Store::capabilities`], so a wrapper that forgets a method does not compile instead of
/// silently changing the claim path. The operator's surface (listing, retention, tenants,
/// status) is the supertrait [`StoreOps`](crate::ops::StoreOps); the producer and consumer
/// handles ([`StoreExt::outbox`], [`StoreExt::inbox`]) come with every store.
#[async_trait]
pub trait Store: crate::ops::StoreOps + Send + Sync + 'static {
    /// What this store can do beyond the contract every store keeps.
    fn capabilities(&self) -> Capabilities;

    /// The schema used when none is named (`public` on PostgreSQL, `main` on SQLite).
    fn default_schema(&self) -> SchemaName;

    /// Claims due events in one short transaction (docs/architecture.md, "The contract").
    async fn events_claim(&self, params: &ClaimParams<'_>) -> Result<Claimed>;

    /// The floor of the next claims of `target`, from the last one (`from`, 0 at first): the
    /// first event at or above it that is in flight or waiting without having gone wrong (no
    /// `last_error`), and never above the commit horizon `settled` + 1 (see
    /// [`Store::commit_horizon`]), so that an event whose transaction commits late lands above
    /// it. Below the floor a claim takes only events that went wrong once (a failed try, a
    /// destination that was down, a lease taken over, an operator's retry), through a path of
    /// their own. Costs what was done since `from`, not the history. A store that does not
    /// claim from a floor ([`Capabilities::claims_from_floor`]) answers 0.
    async fn claim_floor(&self, target: &Target, from: i64, settled: i64) -> Result<i64>;

    /// What a relay's claims passed over while a transaction held its commit horizon back: the
    /// next ids present past the last it read (the ranges missing between them are in flight,
    /// rolled back or removed, and the relay keeps them), and the rows now in the ranges it
    /// keeps. With them a relay's floor and cursor go on past a transaction that stays open, so
    /// that a claim costs what it takes, not what was done since that transaction began; the
    /// event is claimed when it commits. Reads of the primary key. A store that does not claim
    /// from a floor ([`Capabilities::claims_from_floor`]) answers nothing.
    async fn claim_gaps(&self, params: &GapParams<'_>) -> Result<Gaps>;

    /// Extends the lease of events still being published; returns how many were renewed (fewer
    /// than asked means some leases were lost to another relay).
    async fn leases_renew(&self, params: &RenewParams<'_>) -> Result<u64>;

    /// Marks acknowledged events `PROCESSED`; returns how many rows changed.
    async fn events_mark_processed(&self, params: &MarkProcessedParams<'_>) -> Result<u64>;

    /// Records failed tries: back to `PENDING` after a backoff, or `FAILED` at the limit.
    async fn events_mark_failed(&self, params: &MarkFailedParams<'_>) -> Result<Vec<FailedMark>>;

    /// Puts claimed events whose destination was down back to `PENDING` after their delay,
    /// without counting a try (their `retry_count` is unchanged); fenced by the claim token.
    /// Returns how many rows changed.
    async fn events_release(&self, params: &ReleaseParams<'_>) -> Result<u64>;

    /// What is still to do in a target. Costs what the outstanding events cost, not the
    /// history: it stops at the first claimable event. With `ordered` aggregate types (see
    /// [`ClaimOrder`]), an event held back by an earlier event of its aggregate that is `FAILED`
    /// (a parked aggregate) or in flight is not counted as claimable.
    async fn backlog(&self, target: &Target, ordered: &[String]) -> Result<Backlog>;

    /// The commit horizon of a target's table (see [`ClaimOrder::settled_through`]): takes a
    /// probe when `probe` is `None`, and says the probe's last id is settled once every
    /// transaction that was writing to the table when it was taken has ended. A store whose ids
    /// are drawn in commit order ([`Capabilities::ids_in_commit_order`]) settles everything at
    /// once.
    async fn commit_horizon(
        &self,
        target: &Target,
        probe: Option<&HorizonProbe>,
    ) -> Result<Horizon>;

    /// A source of wake-up hints, where the database has one.
    async fn wakeups(&self) -> Result<Option<Box<dyn Wakeups>>>;

    /// The head of each of `targets`' outbox tables, in the same order: the last id its id
    /// sequence handed out (PostgreSQL; MySQL's AUTO_INCREMENT; SQLite's AUTOINCREMENT
    /// counter), `None` where it cannot tell. One cheap read for every target at once, whatever
    /// the tables hold: an idle relay checks it often to find rows written by producers that do
    /// not `NOTIFY`. A head is never below an id committed. On PostgreSQL and MySQL it moves
    /// when a row is inserted, before its transaction commits, and also for one that rolls
    /// back; SQLite's moves with the commit (its counter is part of the transaction).
    async fn outbox_heads(&self, targets: &[Target]) -> Result<Vec<Option<i64>>>;
}

/// The producer's and the consumer's handles of any store, and a single event by id: built on
/// [`Store::default_schema`] and [`StoreOps::events_list`](crate::ops::StoreOps::events_list),
/// so that every store, wrappers included, has them the same.
///
/// ```
/// # async fn example() -> postbox::Result<()> {
/// use postbox::StoreExt;
/// let store = postbox::connect("sqlite::memory:").await?;
/// let outbox = store.outbox();         // writes to the table this store's relays read
/// let inbox = store.inbox("billing")?; // records what the consumer "billing" handled
/// # let _ = (outbox, inbox); Ok(()) }
/// ```
#[async_trait]
pub trait StoreExt: Store {
    /// A producer that writes to this store's default outbox: the table its relays read.
    fn outbox(&self) -> Outbox {
        self.outbox_builder().build()
    }

    /// The settings of such a producer (payload limit, notifications, a tenant's outbox).
    fn outbox_builder(&self) -> OutboxBuilder {
        OutboxBuilder::new(self.default_schema())
    }

    /// The inbox of `consumer` in this store's default schema: where the consumer records, in
    /// its own transactions, the messages it has handled ([`Inbox::receive`]). Refuses an empty
    /// name or one over [`MAX_CONSUMER_LEN`](crate::inbox::MAX_CONSUMER_LEN) characters.
    fn inbox(&self, consumer: &str) -> Result<Inbox> {
        Inbox::new(consumer, self.default_schema())
    }

    /// Event `id` of `target`, from the outbox table or the archive.
    async fn event_get(&self, target: &Target, id: i64) -> Result<Option<StoredEvent>> {
        let filter = EventFilter {
            ids: vec![id],
            archive: true,
            ..EventFilter::default()
        };
        let mut found = self
            .events_list(&ListParams {
                target,
                filter: &filter,
                order: Order::NewestFirst,
                after: None,
                limit: 1,
            })
            .await?;
        Ok(found.pop())
    }
}

impl<S: Store + ?Sized> StoreExt for S {}

/// Implements [`Store`] and [`StoreOps`](crate::ops::StoreOps) for a type by handing every
/// call to the store `$inner` gives (an expression of `self`): one list of methods for every
/// wrapper, so a method added to either trait is forwarded everywhere or fails to compile.
///
/// A wrapper that changes some calls (a test's faulty store) writes those by hand and forwards
/// the rest with [`forward_store_ops!`](crate::forward_store_ops).
#[macro_export]
macro_rules! forward_store {
    ($ty:ty, |$s:ident| $inner:expr) => {
        #[$crate::__async_trait]
        impl $crate::Store for $ty {
            fn capabilities(&$s) -> $crate::store::Capabilities {
                $crate::Store::capabilities($inner)
            }
            fn default_schema(&$s) -> $crate::SchemaName {
                $crate::Store::default_schema($inner)
            }
            async fn events_claim(
                &$s,
                p: &$crate::store::ClaimParams<'_>,
            ) -> $crate::Result<$crate::store::Claimed> {
                $crate::Store::events_claim($inner, p).await
            }
            async fn claim_floor(
                &$s,
                target: &$crate::Target,
                from: i64,
                settled: i64,
            ) -> $crate::Result<i64> {
                $crate::Store::claim_floor($inner, target, from, settled).await
            }
            async fn claim_gaps(
                &$s,
                p: &$crate::store::GapParams<'_>,
            ) -> $crate::Result<$crate::store::Gaps> {
                $crate::Store::claim_gaps($inner, p).await
            }
            async fn leases_renew(&$s, p: &$crate::store::RenewParams<'_>) -> $crate::Result<u64> {
                $crate::Store::leases_renew($inner, p).await
            }
            async fn events_mark_processed(
                &$s,
                p: &$crate::store::MarkProcessedParams<'_>,
            ) -> $crate::Result<u64> {
                $crate::Store::events_mark_processed($inner, p).await
            }
            async fn events_mark_failed(
                &$s,
                p: &$crate::store::MarkFailedParams<'_>,
            ) -> $crate::Result<Vec<$crate::store::FailedMark>> {
                $crate::Store::events_mark_failed($inner, p).await
            }
            async fn events_release(
                &$s,
                p: &$crate::store::ReleaseParams<'_>,
            ) -> $crate::Result<u64> {
                $crate::Store::events_release($inner, p).await
            }
            async fn backlog(
                &$s,
                target: &$crate::Target,
                ordered: &[String],
            ) -> $crate::Result<$crate::store::Backlog> {
                $crate::Store::backlog($inner, target, ordered).await
            }
            async fn commit_horizon(
                &$s,
                target: &$crate::Target,
                probe: Option<&$crate::store::HorizonProbe>,
            ) -> $crate::Result<$crate::store::Horizon> {
                $crate::Store::commit_horizon($inner, target, probe).await
            }
            async fn wakeups(
                &$s,
            ) -> $crate::Result<Option<Box<dyn $crate::store::Wakeups>>> {
                $crate::Store::wakeups($inner).await
            }
            async fn outbox_heads(
                &$s,
                targets: &[$crate::Target],
            ) -> $crate::Result<Vec<Option<i64>>> {
                $crate::Store::outbox_heads($inner, targets).await
            }
        }
        $crate::forward_store_ops!($ty, |$s| $inner);
    };
}
