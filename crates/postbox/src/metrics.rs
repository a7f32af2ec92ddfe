//! The names of the metrics Postbox records through the [`metrics`](https://docs.rs/metrics)
//! facade: one constant per metric, saying what it counts and its labels, and [`ALL`], their
//! list with kind and help text.
//!
//! The relay records its metrics under these names; `postbox-admin` records its monitor's
//! gauges under them and describes [`ALL`] to its Prometheus recorder. `docs/operations.md`, the
//! dashboard and alert rules in `deploy/` and a relay run against PostgreSQL (the `metrics` test)
//! are checked against [`ALL`], so a name changed here, or a metric added without its entry,
//! fails a test instead of silently emptying a dashboard.
//!
//! ```
//! use postbox::metrics;
//! assert_eq!(metrics::EVENTS_PUBLISHED, "postbox_events_published_total");
//! let published = metrics::ALL
//!     .iter()
//!     .find(|m| m.name == metrics::EVENTS_PUBLISHED)
//!     .unwrap();
//! assert_eq!(published.labels, ["tenant"]);
//! ```

use std::collections::HashSet;
use std::sync::Mutex;

use MetricKind::{Counter, Gauge, Histogram};
use RecordedBy::{Admin, Both, Relay};

/// The `tenant` label of the tenants past a relay's [`TenantLabels`] limit: never a tenant id
/// (those are letters, digits and `_`).
pub const OTHER_TENANTS: &str = "(other)";

/// The `tenant` label values a relay records: the default schema's (`default`) and the ids of
/// the first `limit` tenants it records anything of, [`OTHER_TENANTS`] for every tenant past
/// them. A relay serving ten thousand tenants then keeps a bounded number of series (each
/// labelled metric times `limit + 2`), not one per tenant per metric; its logs still name every
/// tenant.
///
/// ```
/// use postbox::metrics::{OTHER_TENANTS, TenantLabels};
/// let labels = TenantLabels::new(1);
/// assert_eq!(labels.label("acme"), "acme");
/// assert_eq!(labels.label("globex"), OTHER_TENANTS);
/// assert_eq!(labels.label("acme"), "acme");
/// assert_eq!(labels.label("default"), "default");
/// ```
#[derive(Debug)]
pub struct TenantLabels {
    limit: usize,
    own: Mutex<HashSet<String>>,
}

impl TenantLabels {
    /// Labels of their own for at most `limit` tenants.
    pub fn new(limit: usize) -> Self {
        TenantLabels {
            limit,
            own: Mutex::default(),
        }
    }

    /// The label to record `tenant` (a target's label: `default` or a tenant id) under.
    pub fn label(&self, tenant: &str) -> String {
        if tenant == crate::schema::DEFAULT_TENANT {
            return tenant.to_owned();
        }
        let mut own = self
            .own
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if own.contains(tenant) || (own.len() < self.limit && own.insert(tenant.to_owned())) {
            tenant.to_owned()
        } else {
            OTHER_TENANTS.to_owned()
        }
    }
}

/// Counter `{tenant}`: events published and marked `PROCESSED` (counted when the mark is
/// written; results fenced off are counted by [`EVENTS_FENCED`] instead).
pub const EVENTS_PUBLISHED: &str = "postbox_events_published_total";

/// Counter `{tenant}`: failed tries recorded (publish errors, timeouts, panics), including the
/// last one of an event that goes `FAILED`.
pub const PUBLISH_FAILURES: &str = "postbox_publish_failures_total";

/// Counter `{tenant, route, outcome}`: what destinations answered, per route (`routes[0]`,
/// `routes[1]+routes[3]` when an event goes to several, `default` without routing), `outcome`
/// being `ok`, `failed` (a try spent) or `unavailable` (put back without a try). Counted when
/// the answer comes, so a result later fenced off still counts.
pub const PUBLISH_OUTCOMES: &str = "postbox_publish_outcomes_total";

/// Counter `{tenant}`: events that went `FAILED` (out of tries, refused for good, unreadable).
pub const EVENTS_FAILED: &str = "postbox_events_failed_total";

/// Counter `{tenant}`: stale events taken over from a relay whose lease ran out.
pub const STALE_RECOVERED: &str = "postbox_stale_recovered_total";

/// Counter `{tenant}`: results not recorded because another relay had taken the events over
/// (their events may be published twice).
pub const EVENTS_FENCED: &str = "postbox_events_fenced_total";

/// Counter `{tenant}`: events put back without spending a try because their destination was
/// down.
pub const EVENTS_DEFERRED: &str = "postbox_events_deferred_total";

/// Counter `{tenant}`: `VACUUM` runs of outbox tables by the relay (PostgreSQL,
/// `vacuum_threshold`).
pub const VACUUMS: &str = "postbox_vacuums_total";

/// Counter `{tenant}`: `PROCESSED` events moved to the archive by the relays (`retention`).
pub const EVENTS_ARCHIVED: &str = "postbox_events_archived_total";

/// Counter `{tenant}`: archived events deleted by the relays (`archive_retention`).
pub const EVENTS_PURGED: &str = "postbox_events_purged_total";

/// Counter `{tenant}`: inbox records deleted by the relays past the dedup window
/// (`inbox_retention`).
pub const INBOX_PURGED: &str = "postbox_inbox_purged_total";

/// Counter `{tenant}`: `FAILED` events given one more try by the slow lane
/// (`dead_letter_retry_interval`).
pub const SLOW_LANE_RETRIES: &str = "postbox_slow_lane_retries_total";

/// Histogram `{tenant, route}`, seconds: from an event's insert (`created_at`, database clock)
/// to its destination's acknowledgement (the relay host's clock).
pub const PUBLISH_LATENCY: &str = "postbox_publish_latency_seconds";

/// Histogram `{tenant}`, seconds: the duration of one claim statement.
pub const CLAIM_SECONDS: &str = "postbox_claim_seconds";

/// Histogram `{tenant}`, seconds: the duration of one mark of published events (retries
/// included).
pub const MARK_SECONDS: &str = "postbox_mark_seconds";

/// Histogram `{tenant}`, seconds: from a claim to the last of its events recorded.
pub const BATCH_SECONDS: &str = "postbox_batch_seconds";

/// Histogram `{tenant}`: events per claim (claims that brought none are not recorded).
pub const BATCH_SIZE: &str = "postbox_batch_size";

/// Gauge `{tenant, status}`, set by `postbox-admin`'s monitor: events in the outbox table by
/// status (`PROCESSED` is the database's estimate on large tables).
pub const EVENTS: &str = "postbox_events";

/// Gauge `{tenant}`, seconds, set by `postbox-admin`'s monitor: the age of the oldest `PENDING`
/// or `PROCESSING` event, 0 when none.
pub const OLDEST_PENDING_AGE: &str = "postbox_oldest_pending_age_seconds";

/// Gauge `{sink}`: 1 while the sink's destination accepts events, 0 while down (from the sink's
/// breaker). Set by the relay, and by `postbox-admin`'s monitor.
pub const SINK_UP: &str = "postbox_sink_up";

/// Gauge `{sink}`, seconds, set by `postbox-admin`'s monitor: how long the sink has been down,
/// 0 when up.
pub const SINK_DOWN_SECONDS: &str = "postbox_sink_down_seconds";

/// Gauge `{path}`: 1 for the claim path the relay's store gives it, set when the relay starts:
/// `floor` (PostgreSQL, MySQL/MariaDB: claims take new work from a floor, at a cost that depends
/// on the batch) or `scan` (SQLite). See [`Capabilities`](crate::store::Capabilities).
pub const RELAY_CLAIM_PATH: &str = "postbox_relay_claim_path";

/// Gauge `{version}`, set by `postbox-admin` when it installs its recorder: always 1.
pub const BUILD_INFO: &str = "postbox_build_info";

/// What kind of metric a [`Metric`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MetricKind {
    /// A count that only grows.
    Counter,
    /// A value set now and then.
    Gauge,
    /// A distribution of recorded values (seconds where the name ends in `_seconds`).
    Histogram,
}

/// Which part of Postbox records a [`Metric`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecordedBy {
    /// The relay ([`Relay`](crate::Relay)), wherever it runs.
    Relay,
    /// `postbox-admin` (its monitor, and its recorder's build info); the relay records none.
    Admin,
    /// Both: the relay, and `postbox-admin`'s monitor from the relay's sinks.
    Both,
}

/// One metric Postbox records: its name, kind, labels and what it says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Metric {
    /// The name (one of this module's constants).
    pub name: &'static str,
    /// Counter, gauge or histogram.
    pub kind: MetricKind,
    /// The label keys every sample carries, in the order the docs list them.
    pub labels: &'static [&'static str],
    /// The help text a Prometheus exposition shows.
    pub help: &'static str,
    /// Who records it.
    pub recorded_by: RecordedBy,
}

impl Metric {
    /// Whether the relay records it (see [`RecordedBy`]).
    pub fn by_relay(&self) -> bool {
        matches!(self.recorded_by, RecordedBy::Relay | RecordedBy::Both)
    }
}

const fn metric(
    name: &'static str,
    kind: MetricKind,
    labels: &'static [&'static str],
    help: &'static str,
    recorded_by: RecordedBy,
) -> Metric {
    Metric {
        name,
        kind,
        labels,
        help,
        recorded_by,
    }
}

/// Every metric Postbox records, in the order `docs/operations.md` lists them.
pub const ALL: &[Metric] = &[
    metric(
        EVENTS_PUBLISHED,
        Counter,
        &["tenant"],
        "Events published and marked PROCESSED",
        Relay,
    ),
    metric(
        PUBLISH_FAILURES,
        Counter,
        &["tenant"],
        "Failed tries recorded (publish errors, timeouts, panics)",
        Relay,
    ),
    metric(
        PUBLISH_OUTCOMES,
        Counter,
        &["tenant", "route", "outcome"],
        "What destinations answered, per route: ok, failed (a try spent) or unavailable (put back)",
        Relay,
    ),
    metric(
        EVENTS_FAILED,
        Counter,
        &["tenant"],
        "Events that went FAILED (out of tries, refused for good, unreadable)",
        Relay,
    ),
    metric(
        STALE_RECOVERED,
        Counter,
        &["tenant"],
        "Stale events taken over from a relay whose lease ran out",
        Relay,
    ),
    metric(
        EVENTS_FENCED,
        Counter,
        &["tenant"],
        "Results not recorded because another relay had taken the events over",
        Relay,
    ),
    metric(
        EVENTS_DEFERRED,
        Counter,
        &["tenant"],
        "Events put back without spending a try because their destination was down",
        Relay,
    ),
    metric(
        VACUUMS,
        Counter,
        &["tenant"],
        "VACUUM runs of outbox tables",
        Relay,
    ),
    metric(
        EVENTS_ARCHIVED,
        Counter,
        &["tenant"],
        "PROCESSED events moved to the archive",
        Relay,
    ),
    metric(EVENTS_PURGED, Counter, &["tenant"], "Events purged", Relay),
    metric(
        INBOX_PURGED,
        Counter,
        &["tenant"],
        "Inbox records purged past inbox_retention",
        Relay,
    ),
    metric(
        SLOW_LANE_RETRIES,
        Counter,
        &["tenant"],
        "FAILED events given one more try by the slow lane",
        Relay,
    ),
    metric(
        PUBLISH_LATENCY,
        Histogram,
        &["tenant", "route"],
        "From an event's insert (database clock) to its destination's acknowledgement",
        Relay,
    ),
    metric(
        CLAIM_SECONDS,
        Histogram,
        &["tenant"],
        "Duration of one claim",
        Relay,
    ),
    metric(
        MARK_SECONDS,
        Histogram,
        &["tenant"],
        "Duration of one mark of published events",
        Relay,
    ),
    metric(
        BATCH_SECONDS,
        Histogram,
        &["tenant"],
        "From a claim to the last of its events recorded",
        Relay,
    ),
    metric(
        BATCH_SIZE,
        Histogram,
        &["tenant"],
        "Events per claim",
        Relay,
    ),
    metric(
        EVENTS,
        Gauge,
        &["tenant", "status"],
        "Events in the outbox table by status (PROCESSED is an estimate on large tables)",
        Admin,
    ),
    metric(
        OLDEST_PENDING_AGE,
        Gauge,
        &["tenant"],
        "Age of the oldest PENDING or PROCESSING event in seconds (0 when none)",
        Admin,
    ),
    metric(
        SINK_UP,
        Gauge,
        &["sink"],
        "1 when the sink accepts events, 0 when down",
        Both,
    ),
    metric(
        SINK_DOWN_SECONDS,
        Gauge,
        &["sink"],
        "How long the sink has been down in seconds (0 when up)",
        Admin,
    ),
    metric(
        RELAY_CLAIM_PATH,
        Gauge,
        &["path"],
        "1 for the claim path of the relay's store: floor or scan",
        Relay,
    ),
    metric(
        BUILD_INFO,
        Gauge,
        &["version"],
        "Postbox's version (always 1)",
        Admin,
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_prefixed_and_labelled() {
        let mut seen = std::collections::HashSet::new();
        for m in ALL {
            assert!(seen.insert(m.name), "{} is listed twice", m.name);
            assert!(m.name.starts_with("postbox_"), "{}", m.name);
            assert!(!m.labels.is_empty() && !m.help.is_empty(), "{}", m.name);
            if m.kind == Counter {
                assert!(
                    m.name.ends_with("_total"),
                    "counter {} ends in _total",
                    m.name
                );
            }
        }
    }
}
