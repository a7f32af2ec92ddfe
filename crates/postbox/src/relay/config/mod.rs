//! Relay settings: [`RelayConfig`], its defaults and setters; `validate.rs` checks them.

use std::time::Duration;

pub use super::policy::{EffectivePolicy, RetryPolicy};

mod validate;
use crate::backoff::Backoff;

/// How a relay runs. Every field has the seed's default (docs/architecture.md, "The contract"); each has a setter of the
/// same name.
///
/// ```
/// use std::time::Duration;
/// let config = postbox::RelayConfig::default()
///     .batch_size(500)
///     .poll_interval(Duration::from_secs(1));
/// config.validate().unwrap();
/// assert_eq!(config.batch_size, 500);
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RelayConfig {
    /// Events claimed per batch (default 100): the first claim of a target, and the size claims
    /// shrink back to when the outbox is nearly empty. Larger batches amortize round trips; they
    /// also widen the window of events re-published after a crash (G3).
    pub batch_size: u32,
    /// The largest batch a claim grows to while claims come back full (default 500): each full
    /// claim doubles the next, up to this, and a claim that comes back less than half full
    /// halves it, down to `batch_size` — a backlog is drained in large batches, a trickle of
    /// events in small ones; a destination that is unavailable sets it back to `batch_size`. At
    /// or below `batch_size`, claims stay at `batch_size`. G3's bound on events re-published
    /// after a crash is this size per batch in flight.
    pub max_batch_size: u32,
    /// How often the relay polls when no notification arrives (default 5 s). Notifications wake
    /// it at once; polling catches events inserted without one and notifications lost in a
    /// reconnect.
    pub poll_interval: Duration,
    /// How long a claim lasts (default 30 s; at least 600 ms). A relay renews the leases of a
    /// batch it is still publishing, every third of a lease; a relay that dies loses them, and
    /// its events are taken over after this long (counted as a failed try). Once an event's
    /// outcome is known its lease goes unrenewed until the result is written: up to a third of
    /// a lease since the last renewal, 50 ms gathering a claim's outcomes, and half a lease
    /// retrying the write while the database is down — which must leave room for round trips
    /// (the invariant behind G3, `docs/guarantees.md`), hence the minimum. Too short a lease
    /// leads to duplicate publishing of slow batches.
    pub lease: Duration,
    /// Backoff between an event's failed tries (default: base 1 s, cap 300 s).
    pub retry: Backoff,
    /// How long one publish may take before it counts as failed (default 10 s). Must be shorter
    /// than `lease`.
    pub publish_timeout: Duration,
    /// How many events of a batch are published at once (default 64).
    pub concurrency: usize,
    /// How often the tenant registry is re-read (default 10 s).
    pub tenant_refresh: Duration,
    /// Tenants whose metrics are recorded under their own `tenant` label (default 100): the
    /// first this many the relay records anything of; the others are recorded together under
    /// [`OTHER_TENANTS`](crate::metrics::OTHER_TENANTS), so that a relay serving thousands of
    /// tenants keeps a bounded number of series (see [`TenantLabels`](crate::metrics::TenantLabels)).
    /// The default schema always has its own.
    pub metrics_tenants: usize,
    /// This relay's name in `locked_by` and logs (default: host, process id and a random suffix).
    pub relay_id: Option<String>,
    /// Whether to listen for `NOTIFY` wake-ups where the store has them (default true). Without
    /// them, new events wait for the next poll.
    pub notifications: bool,
    /// How often the relay polls a busy target (default 10 ms): one that had events within the
    /// last `busy_period`. Producers notify at most once per `Outbox::notify_interval`, so
    /// this is how quickly the events committed between two notifications are found.
    pub busy_poll_interval: Duration,
    /// How long a target stays busy after its last event (default 1 s; zero turns busy polling
    /// off, and then only notifications and `poll_interval` find events).
    pub busy_period: Duration,
    /// Dead row versions in a target's outbox table that make the relay vacuum it (PostgreSQL;
    /// default 50,000; `None` leaves vacuuming to autovacuum). Every mark leaves one; until they
    /// are vacuumed, claims walk past them and slow down. Autovacuum looks at a database about
    /// once a minute and waits for a fifth of the table to be dead, far too late for a busy
    /// outbox: a 1M-event drain kept 0.86 of its first speed with autovacuum alone, 1.0 with
    /// this (see `docs/performance.md`). The relay's role must own the table.
    pub vacuum_threshold: Option<u64>,
    /// How long a drain ([`Relay::drain`](crate::Relay::drain)) waits for destinations that
    /// are down: when its events have only been put back for this long (nothing published,
    /// nothing failed), it gives up with [`Error::Unavailable`](crate::Error::Unavailable), leaving them `PENDING` with no
    /// try spent. Long enough to wait out a broker's restart.
    pub drain_patience: Duration,
    /// How often an idle relay checks whether rows arrived, in one cheap read of every target's
    /// id sequence ([`Store::outbox_heads`](crate::Store::outbox_heads)); `None` leaves it to
    /// notifications and `poll_interval`. This is how soon the first event of a producer that
    /// does not `NOTIFY` (plain SQL, another language) is found after a quiet spell; the ones
    /// after it are found by busy polling.
    pub head_poll_interval: Option<Duration>,
    /// Age past which `PROCESSED` events move to `outbox_events_archive` (counted from their
    /// creation, by the database clock); `None` keeps every event in the hot table. The relays
    /// archive in short batches, one relay at a time per table, every minute. An event's
    /// idempotency key guards against duplicates while it is in the hot table: this long.
    pub retention: Option<Duration>,
    /// Age past which archived events are deleted (counted from their archiving); `None` keeps
    /// the archive forever.
    pub archive_retention: Option<Duration>,
    /// The inbox's dedup window ([`Inbox`](crate::inbox::Inbox)): records of handled messages older
    /// than this (counted from their receipt) are deleted, in the same runs and batches as the
    /// archive's. A repeat of a message arrives within it to be skipped; after it, it is handled
    /// again. `None` keeps every record.
    pub inbox_retention: Option<Duration>,
    /// The slow lane of `FAILED` events (the dead-letter state): this long after its last try,
    /// a `FAILED` event gets one more try, up to
    /// [`dead_letter_max_retries`](Self::dead_letter_max_retries) times, before it waits for an
    /// operator. `None` turns the slow lane off.
    pub dead_letter_retry_interval: Option<Duration>,
    /// Slow-lane tries a `FAILED` event gets at most; `0` turns the slow lane off.
    pub dead_letter_max_retries: u32,
    /// Retry policies per event type, the first match applying
    /// ([`policy_for`](Self::policy_for)); events no policy matches get the settings above.
    pub retry_policies: Vec<RetryPolicy>,
    /// Aggregate types whose events are published one aggregate at a time, in commit order
    /// (G6, `docs/guarantees.md`); `*` orders every aggregate. Empty by default: events publish
    /// concurrently and retries may reorder them. An ordered event waits while an earlier event
    /// of its aggregate is unfinished (a failing one parks its aggregate until it succeeds, is
    /// retried or skipped) and until every transaction that may commit an earlier id has ended.
    pub ordered_aggregate_types: Vec<String>,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            batch_size: 100,
            max_batch_size: 500,
            poll_interval: Duration::from_secs(5),
            lease: Duration::from_secs(30),
            retry: Backoff::default(),
            publish_timeout: Duration::from_secs(10),
            concurrency: 64,
            tenant_refresh: Duration::from_secs(10),
            metrics_tenants: 100,
            relay_id: None,
            notifications: true,
            busy_poll_interval: Duration::from_millis(10),
            busy_period: Duration::from_secs(1),
            vacuum_threshold: Some(50_000),
            drain_patience: Duration::from_secs(60),
            head_poll_interval: Some(Duration::from_millis(10)),
            retention: Some(Duration::from_secs(30 * 86_400)),
            archive_retention: Some(Duration::from_secs(90 * 86_400)),
            inbox_retention: Some(Duration::from_secs(7 * 86_400)),
            dead_letter_retry_interval: Some(Duration::from_secs(3600)),
            dead_letter_max_retries: 24,
            retry_policies: Vec::new(),
            ordered_aggregate_types: Vec::new(),
        }
    }
}

impl RelayConfig {
    // Setters, one per field, so that settings added later do not break callers.

    /// Sets how often an idle relay checks for new rows (field
    /// [`head_poll_interval`](Self::head_poll_interval)).
    pub fn head_poll_interval(mut self, head_poll_interval: Option<Duration>) -> Self {
        self.head_poll_interval = head_poll_interval;
        self
    }

    /// Sets the age past which processed events are archived (field
    /// [`retention`](Self::retention)).
    pub fn retention(mut self, retention: Option<Duration>) -> Self {
        self.retention = retention;
        self
    }

    /// Sets the age past which archived events are deleted (field
    /// [`archive_retention`](Self::archive_retention)).
    pub fn archive_retention(mut self, archive_retention: Option<Duration>) -> Self {
        self.archive_retention = archive_retention;
        self
    }

    /// Sets the inbox's dedup window (field [`inbox_retention`](Self::inbox_retention)).
    pub fn inbox_retention(mut self, inbox_retention: Option<Duration>) -> Self {
        self.inbox_retention = inbox_retention;
        self
    }

    /// Sets how long after its last try a `FAILED` event gets a slow-lane try (field
    /// [`dead_letter_retry_interval`](Self::dead_letter_retry_interval)).
    pub fn dead_letter_retry_interval(mut self, interval: Option<Duration>) -> Self {
        self.dead_letter_retry_interval = interval;
        self
    }

    /// Sets how many slow-lane tries a `FAILED` event gets (field
    /// [`dead_letter_max_retries`](Self::dead_letter_max_retries)).
    pub fn dead_letter_max_retries(mut self, max: u32) -> Self {
        self.dead_letter_max_retries = max;
        self
    }

    /// Sets the ordered aggregate types (field
    /// [`ordered_aggregate_types`](Self::ordered_aggregate_types)).
    pub fn ordered_aggregate_types<I, S>(mut self, types: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.ordered_aggregate_types = types.into_iter().map(Into::into).collect();
        self
    }

    /// Adds a retry policy (field [`retry_policies`](Self::retry_policies)); policies added
    /// first win.
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.retry_policies.push(policy);
        self
    }

    /// What applies to events of `event_type`: the first matching policy over the relay's own
    /// settings.
    pub fn policy_for(&self, event_type: &str) -> EffectivePolicy {
        let slow_lane_on =
            self.dead_letter_retry_interval.is_some() && self.dead_letter_max_retries > 0;
        match self
            .retry_policies
            .iter()
            .find(|p| p.event_type.matches(event_type))
        {
            Some(p) => EffectivePolicy {
                matched: Some(p.event_type.clone()),
                max_retries: p.max_retries,
                backoff: p.backoff.unwrap_or(self.retry),
                slow_lane: slow_lane_on && p.slow_lane,
            },
            None => EffectivePolicy {
                matched: None,
                max_retries: None,
                backoff: self.retry,
                slow_lane: slow_lane_on,
            },
        }
    }

    /// The globs of the event types the slow lane skips: those whose first matching policy
    /// turns it off (exact for types no earlier policy also matches).
    pub(crate) fn slow_lane_excluded(&self) -> Vec<crate::glob::Glob> {
        self.retry_policies
            .iter()
            .filter(|p| !p.slow_lane)
            .map(|p| p.event_type.clone())
            .collect()
    }

    /// Sets how long a drain waits for destinations that are down (field
    /// [`drain_patience`](Self::drain_patience)).
    pub fn drain_patience(mut self, drain_patience: Duration) -> Self {
        self.drain_patience = drain_patience;
        self
    }

    /// Sets events claimed per batch (field [`batch_size`](Self::batch_size)).
    pub fn batch_size(mut self, batch_size: u32) -> Self {
        self.batch_size = batch_size;
        self
    }

    /// Sets the largest batch claims grow to (field [`max_batch_size`](Self::max_batch_size)).
    pub fn max_batch_size(mut self, max_batch_size: u32) -> Self {
        self.max_batch_size = max_batch_size;
        self
    }

    /// Sets the idle polling interval (field [`poll_interval`](Self::poll_interval)).
    pub fn poll_interval(mut self, poll_interval: Duration) -> Self {
        self.poll_interval = poll_interval;
        self
    }

    /// Sets how long a claim lasts (field [`lease`](Self::lease)).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Sets the backoff between an event's failed tries (field [`retry`](Self::retry)).
    pub fn retry(mut self, retry: Backoff) -> Self {
        self.retry = retry;
        self
    }

    /// Sets how long one publish may take (field [`publish_timeout`](Self::publish_timeout)).
    pub fn publish_timeout(mut self, publish_timeout: Duration) -> Self {
        self.publish_timeout = publish_timeout;
        self
    }

    /// Sets how many events of a batch are published at once (field [`concurrency`](Self::concurrency)).
    pub fn concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency;
        self
    }

    /// Sets how many tenants get metrics of their own (field
    /// [`metrics_tenants`](Self::metrics_tenants)).
    pub fn metrics_tenants(mut self, metrics_tenants: usize) -> Self {
        self.metrics_tenants = metrics_tenants;
        self
    }

    /// Sets how often the tenant registry is re-read (field [`tenant_refresh`](Self::tenant_refresh)).
    pub fn tenant_refresh(mut self, tenant_refresh: Duration) -> Self {
        self.tenant_refresh = tenant_refresh;
        self
    }

    /// Sets whether to listen for wake-ups (field [`notifications`](Self::notifications)).
    pub fn notifications(mut self, notifications: bool) -> Self {
        self.notifications = notifications;
        self
    }

    /// Sets the polling interval of a busy target (field [`busy_poll_interval`](Self::busy_poll_interval)).
    pub fn busy_poll_interval(mut self, busy_poll_interval: Duration) -> Self {
        self.busy_poll_interval = busy_poll_interval;
        self
    }

    /// Sets how long a target stays busy after its last event (field [`busy_period`](Self::busy_period)).
    pub fn busy_period(mut self, busy_period: Duration) -> Self {
        self.busy_period = busy_period;
        self
    }

    /// Sets the dead rows that make the relay vacuum a table (`None`: never) (field [`vacuum_threshold`](Self::vacuum_threshold)).
    pub fn vacuum_threshold(mut self, vacuum_threshold: Option<u64>) -> Self {
        self.vacuum_threshold = vacuum_threshold;
        self
    }

    /// Sets this relay's name in `locked_by` and logs (field [`relay_id`](Self::relay_id)).
    pub fn relay_id(mut self, relay_id: impl Into<String>) -> Self {
        self.relay_id = Some(relay_id.into());
        self
    }
}
