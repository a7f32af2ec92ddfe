//! The store seam: what the relay and the admin commands need from a database.
//!
//! The relay engine never names a database driver. It talks to a [`Store`], whose methods are
//! noun-first with one params struct each; [`PgStore`], [`SqliteStore`] and [`MySqlStore`]
//! implement it and pass one shared conformance suite (`tests/store_conformance.rs`).
//!
//! This file holds the traits ([`Store`], [`StoreExt`], [`Wakeups`]), what a store can do
//! ([`Capabilities`]) and `forward_store!`; what the traits take and return is in `claims.rs`
//! (the relay's hot path) and `operator.rs` (the operator's surface).

use std::time::Duration;

use async_trait::async_trait;

use crate::error::Result;
use crate::inbox::{INBOX_COUNT_LIMIT, Inbox};
use crate::outbox::{Outbox, OutboxBuilder};
use crate::schema::{SchemaName, Target};

mod claims;
mod list;
mod migrations;
mod operator;
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
pub(crate) use claims::storable_error;
pub use claims::{
    BacklogFrom, ClaimOrder, ClaimParams, Claimed, ExhaustedEvent, FailedMark, FailedTry,
    GapParams, Gaps, Horizon, HorizonProbe, MAX_ERROR_BYTES, MarkFailedParams, MarkProcessedParams,
    PassedEvent, Release, ReleaseParams, RenewParams,
};
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) use operator::outstanding_each;
pub use operator::{
    Backlog, EXACT_PROCESSED_COUNT, OpenTransaction, Outstanding, RejectedTenant, ReplicationSlot,
    ReportedSink, RetryFailedParams, SlowLaneParams, StatusCounts, TenantAddParams,
};
pub(crate) use operator::{ReportedRow, inbox_stats, reported_sinks};
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

/// [`Store::outbox_due`] for a store that serves one target per statement (SQLite, MySQL: one
/// outbox per database): [`Store::backlog`] of each.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) async fn due_each<S: Store + ?Sized>(
    store: &S,
    targets: &[Target],
    ordered: &[String],
) -> Result<Vec<Option<Duration>>> {
    let mut due = Vec::with_capacity(targets.len());
    for target in targets {
        due.push(store.backlog(target, ordered).await?.next_due_in);
    }
    Ok(due)
}

/// The heads of [`Store::outbox_heads`] that differ from `known`, from every head read.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) fn moved_heads(
    heads: impl IntoIterator<Item = Option<i64>>,
    known: &[Option<i64>],
) -> Vec<(usize, Option<i64>)> {
    heads
        .into_iter()
        .enumerate()
        .filter(|(i, head)| known.get(*i).copied().flatten() != *head)
        .collect()
}

/// What a stale event's `last_error` says when a claim takes it over from a relay whose lease ran
/// out (a failed try, G3): every store's claim writes this text, with `{relay}` replaced by the
/// relay that held it.
pub(crate) const LEASE_EXPIRED: &str =
    "lease expired: relay {relay} did not finish publishing in time (crashed or stalled)";

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
    /// Whether one relay's claims may run side by side, each locking rows the others skip
    /// (PostgreSQL, MySQL/MariaDB): while its claims come back full, a relay keeps two in flight,
    /// so that a backlog is claimed on two of the server's cores. Not with one writer at a time
    /// (SQLite), where the second would only wait for the first.
    pub concurrent_claims: bool,
}

impl Capabilities {
    /// The capabilities of a store that claims from a floor and tracks its commit horizon with
    /// probes (PostgreSQL, MySQL/MariaDB).
    pub const SERVER: Capabilities = Capabilities {
        claims_from_floor: true,
        ids_in_commit_order: false,
        concurrent_claims: true,
    };

    /// The capabilities of a store that claims by scanning from the first due event and draws
    /// ids in commit order (SQLite).
    pub const EMBEDDED: Capabilities = Capabilities {
        claims_from_floor: false,
        ids_in_commit_order: true,
        concurrent_claims: false,
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

    /// What a relay's claims passed over while a transaction held its commit horizon back: how
    /// far the next ids present past the last it read go, and the ranges missing among them (in
    /// flight, rolled back or removed: the relay keeps them), and the rows now in the ranges it
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

    /// [`Store::backlog`] of a target (no ordered aggregate types) read from where a relay's
    /// claims start ([`BacklogFrom`]), not from the start of the table: what a transaction
    /// held open keeps of the events done since it began lies below. The default reads the
    /// whole backlog.
    async fn backlog_from(&self, target: &Target, from: &BacklogFrom) -> Result<Backlog> {
        let _ = from;
        self.backlog(target, &[]).await
    }

    /// [`Store::backlog`]'s `next_due_in` of each of `targets`, in the same order, in as few
    /// statements as the database allows (one per few hundred tenant schemas on PostgreSQL):
    /// what a relay serving many targets reads now and then to find the work no wake-up named —
    /// a retry another relay scheduled coming due, a lease a dead relay left, an operator's
    /// retry — without claiming from every target. Fails as a whole if one target cannot be
    /// read; the caller then asks [`Store::backlog`] of each to find which.
    async fn outbox_due(
        &self,
        targets: &[Target],
        ordered: &[String],
    ) -> Result<Vec<Option<Duration>>>;

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

    /// How long the oldest writer of `probe` (see [`Store::commit_horizon`]) has been in its
    /// transaction, where the store can tell (PostgreSQL; `None` elsewhere, or when none of
    /// them is still open). A relay that starts beside a transaction held open learns so at
    /// once, rather than by watching its probe not settle.
    async fn horizon_writers_age(
        &self,
        target: &Target,
        probe: &HorizonProbe,
    ) -> Result<Option<Duration>> {
        let _ = (target, probe);
        Ok(None)
    }

    /// A source of wake-up hints, where the database has one.
    async fn wakeups(&self) -> Result<Option<Box<dyn Wakeups>>>;

    /// The heads of `targets`' outbox tables that are not the ones the caller knows (`known`,
    /// in the same order; `None`: not read yet, or none), each with its place in `targets`. A
    /// head is the last id the table's id sequence handed out (PostgreSQL; MySQL's
    /// AUTO_INCREMENT; SQLite's AUTOINCREMENT counter), `None` where it cannot tell (no such
    /// table). One cheap read for many targets at once, whatever the tables hold, that answers
    /// only what moved: an idle relay checks it often to find rows written by producers that do
    /// not `NOTIFY`. A head is never below an id committed. On PostgreSQL and MySQL it moves
    /// when a row is inserted, before its transaction commits, and also for one that rolls
    /// back; SQLite's moves with the commit (its counter is part of the transaction).
    async fn outbox_heads(
        &self,
        targets: &[Target],
        known: &[Option<i64>],
    ) -> Result<Vec<(usize, Option<i64>)>>;
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
            async fn backlog_from(
                &$s,
                target: &$crate::Target,
                from: &$crate::store::BacklogFrom,
            ) -> $crate::Result<$crate::store::Backlog> {
                $crate::Store::backlog_from($inner, target, from).await
            }
            async fn outbox_due(
                &$s,
                targets: &[$crate::Target],
                ordered: &[String],
            ) -> $crate::Result<Vec<Option<std::time::Duration>>> {
                $crate::Store::outbox_due($inner, targets, ordered).await
            }
            async fn commit_horizon(
                &$s,
                target: &$crate::Target,
                probe: Option<&$crate::store::HorizonProbe>,
            ) -> $crate::Result<$crate::store::Horizon> {
                $crate::Store::commit_horizon($inner, target, probe).await
            }
            async fn horizon_writers_age(
                &$s,
                target: &$crate::Target,
                probe: &$crate::store::HorizonProbe,
            ) -> $crate::Result<Option<std::time::Duration>> {
                $crate::Store::horizon_writers_age($inner, target, probe).await
            }
            async fn wakeups(
                &$s,
            ) -> $crate::Result<Option<Box<dyn $crate::store::Wakeups>>> {
                $crate::Store::wakeups($inner).await
            }
            async fn outbox_heads(
                &$s,
                targets: &[$crate::Target],
                known: &[Option<i64>],
            ) -> $crate::Result<Vec<(usize, Option<i64>)>> {
                $crate::Store::outbox_heads($inner, targets, known).await
            }
        }
        $crate::forward_store_ops!($ty, |$s| $inner);
    };
}
