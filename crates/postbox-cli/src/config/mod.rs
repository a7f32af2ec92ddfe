//! Configuration: built-in defaults, then `postbox.toml`, then `POSTBOX_*` environment
//! variables, then command-line flags, each layer overriding the one before (figment).
//!
//! Every key is documented in [`keys::KEYS`], which feeds `--help` and is checked against
//! `CONFIG.md` and [`Config::default`] by tests.

mod keys;
mod load;
mod validate;
mod values;

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use serde::{Deserialize, Serialize};

pub(crate) use keys::{KEYS, keys_help};
pub(crate) use load::{Loaded, Overrides, load};
pub(crate) use postbox_sinks::SinkKind;
pub(crate) use values::{ByteSize, DatabaseUrl, LogFormat, RelaySource, Secret, SecretUrl};

use crate::database::Location;

/// The configuration file read from the working directory when `--config` is not given.
pub(crate) const DEFAULT_FILE: &str = "postbox.toml";

/// The prefix of configuration environment variables (`POSTBOX_BATCH_SIZE`, …).
pub(crate) const ENV_PREFIX: &str = "POSTBOX_";

/// Metadata name of the built-in defaults layer.
const DEFAULTS_SOURCE: &str = "built-in default";

/// Metadata name of the command-line flags layer.
const FLAGS_SOURCE: &str = "command-line flag";

/// Keys whose `POSTBOX_*` variable is taken as written, never parsed as a number, array or
/// quoted string the way figment parses the others: a secret `0123` stays `0123`, a topic
/// `{event_type}` stays a template.
const RAW_ENV_KEYS: &[&str] = &[
    "sink_url",
    "topic",
    "exchange",
    "webhook_secret",
    "admin_token",
    "alert_webhook",
];

/// The effective configuration. Field docs: see [`KEYS`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Config {
    /// Where the outbox lives; `None` for the SQLite file `postbox.db`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) database_url: Option<DatabaseUrl>,
    /// Several databases one relay serves (sharded outboxes), when `database_url` is not set.
    #[serde(deserialize_with = "values::url_list")]
    pub(crate) database_urls: Vec<DatabaseUrl>,
    /// PostgreSQL schema of the default outbox and tenant registry, checked as it is read.
    pub(crate) schema: postbox::SchemaName,
    /// Events claimed per batch.
    pub(crate) batch_size: u32,
    /// The largest batch claims grow to while they come back full.
    pub(crate) max_batch_size: u32,
    /// Idle polling interval.
    #[serde(with = "humantime_serde")]
    pub(crate) poll_interval: Duration,
    /// Polling interval of a busy outbox.
    #[serde(with = "humantime_serde")]
    pub(crate) busy_poll_interval: Duration,
    /// How long an outbox stays busy after its last event.
    #[serde(with = "humantime_serde")]
    pub(crate) busy_period: Duration,
    /// How often an idle relay checks the id sequences; zero: never.
    #[serde(with = "humantime_serde")]
    pub(crate) head_poll_interval: Duration,
    /// Dead rows that make the relay vacuum a table; 0: never.
    pub(crate) vacuum_threshold: u64,
    /// Claim lease.
    #[serde(with = "humantime_serde")]
    pub(crate) lease: Duration,
    /// Retry limit of enqueued events.
    pub(crate) max_retries: u32,
    /// Backoff unit.
    #[serde(with = "humantime_serde")]
    pub(crate) backoff_base: Duration,
    /// Longest backoff.
    #[serde(with = "humantime_serde")]
    pub(crate) backoff_cap: Duration,
    /// Timeout of one publish.
    #[serde(with = "humantime_serde")]
    pub(crate) publish_timeout: Duration,
    /// Events published at once.
    pub(crate) concurrency: usize,
    /// Tenants whose metrics get a label of their own.
    pub(crate) metrics_tenants: usize,
    /// How long a drain waits for destinations that are down.
    #[serde(with = "humantime_serde")]
    pub(crate) drain_patience: Duration,
    /// Age past which processed events are archived; zero: never.
    #[serde(with = "humantime_serde")]
    pub(crate) retention: Duration,
    /// Age past which archived events are deleted; zero: never.
    #[serde(with = "humantime_serde")]
    pub(crate) archive_retention: Duration,
    /// The inbox's dedup window: age past which inbox records are deleted; zero: never.
    #[serde(with = "humantime_serde")]
    pub(crate) inbox_retention: Duration,
    /// The `dead_letter_*` keys configure the slow lane (FAILED is the dead-letter state): how
    /// long after its last try a FAILED event gets a slow-lane try; zero: never.
    #[serde(with = "humantime_serde")]
    pub(crate) dead_letter_retry_interval: Duration,
    /// The `dead_letter_*` keys configure the slow lane: slow-lane tries of a FAILED event;
    /// zero: none.
    pub(crate) dead_letter_max_retries: u32,
    /// Aggregate types published one aggregate at a time, in commit order (`*`: all).
    #[serde(deserialize_with = "values::list")]
    pub(crate) ordered_aggregate_types: Vec<String>,
    /// Where the relay learns of committed events: polling, or a logical replication slot.
    pub(crate) source: RelaySource,
    /// The CDC relay's replication slot.
    pub(crate) cdc_slot: String,
    /// The CDC relay's publication.
    pub(crate) cdc_publication: String,
    /// Whether the CDC relay claims each event before publishing it.
    pub(crate) cdc_claim: bool,
    /// Log format.
    pub(crate) log_format: LogFormat,
    /// Log filter.
    pub(crate) log_level: String,
    /// Largest payload enqueued.
    pub(crate) payload_limit: ByteSize,
    /// The one sink of the relay (`None`: stdout, or the routes when there are some).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) sink: Option<SinkKind>,
    /// The sink's address (a template for webhooks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) sink_url: Option<SecretUrl>,
    /// The sink's destination template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) topic: Option<postbox_sinks::Template>,
    /// The AMQP exchange.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) exchange: Option<String>,
    /// The single sink's message format.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) sink_format: Option<postbox_sinks::cloudevents::Format>,
    /// The webhook signing key; never serialized (so never shown).
    #[serde(default, skip_serializing)]
    pub(crate) webhook_secret: Option<Secret>,
    /// `[sinks.NAME]` tables, as written (they may hold secrets: never serialized).
    #[serde(default, skip_serializing)]
    pub(crate) sinks: BTreeMap<String, RawTable>,
    /// `[[routes]]` tables, as written.
    #[serde(default, skip_serializing)]
    pub(crate) routes: Vec<RawTable>,
    /// The `[routing]` table, as written.
    #[serde(default, skip_serializing)]
    pub(crate) routing: Option<RawTable>,
    /// `[[retry_policies]]` tables: retries per event type, the first match applying.
    #[serde(default, skip_serializing)]
    pub(crate) retry_policies: Vec<RetryPolicyTable>,
    /// Where the relay serves metrics, probes, the admin API and page (`None`: off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) admin_listen: Option<std::net::SocketAddr>,
    /// The admin API's bearer token; never serialized (so never shown).
    #[serde(default, skip_serializing)]
    pub(crate) admin_token: Option<Secret>,
    /// Where alerts are posted (Slack-compatible JSON); it may hold a secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) alert_webhook: Option<SecretUrl>,
    /// A sink down this long alerts.
    #[serde(with = "humantime_serde")]
    pub(crate) alert_sink_down_after: Duration,
    /// An outstanding event this old alerts; zero: never.
    #[serde(with = "humantime_serde")]
    pub(crate) alert_backlog_age: Duration,
    /// A lasting condition alerts again after this long.
    #[serde(with = "humantime_serde")]
    pub(crate) alert_repeat_after: Duration,
    /// At most this many alerts an hour.
    pub(crate) alert_max_per_hour: u32,
}

/// One `[[retry_policies]]` table: how events whose type `event_type` matches are retried.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RetryPolicyTable {
    /// The event types (a glob: `*` and `?`).
    pub(crate) event_type: postbox::glob::Glob,
    /// Tries before FAILED, instead of the event's own `max_retries`.
    #[serde(default)]
    pub(crate) max_retries: Option<u32>,
    /// The backoff unit, instead of `backoff_base`.
    #[serde(default, with = "humantime_serde::option")]
    pub(crate) backoff_base: Option<Duration>,
    /// The longest backoff, instead of `backoff_cap`.
    #[serde(default, with = "humantime_serde::option")]
    pub(crate) backoff_cap: Option<Duration>,
    /// Whether FAILED events of these types get the slow lane.
    #[serde(default = "slow_lane_default")]
    pub(crate) slow_lane: bool,
}

fn slow_lane_default() -> bool {
    true
}

/// A table of `postbox.toml` kept as written, parsed later into what it describes (a sink, a
/// route) so that errors can name it. Its `Debug` hides the values, which may be secrets.
#[derive(Clone, PartialEq, Deserialize)]
#[serde(transparent)]
pub(crate) struct RawTable(pub(crate) serde_json::Value);

impl std::fmt::Debug for RawTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            serde_json::Value::Object(map) => f.debug_set().entries(map.keys()).finish(),
            _ => f.write_str("(not a table)"),
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        let relay = postbox::RelayConfig::default();
        let alerts = postbox_admin::alerts::AlertConfig::default();
        Config {
            database_url: None,
            database_urls: Vec::new(),
            schema: postbox::SchemaName::public(),
            batch_size: relay.batch_size,
            max_batch_size: relay.max_batch_size,
            poll_interval: relay.poll_interval,
            busy_poll_interval: relay.busy_poll_interval,
            busy_period: relay.busy_period,
            head_poll_interval: relay.head_poll_interval.unwrap_or_default(),
            vacuum_threshold: relay.vacuum_threshold.unwrap_or(0),
            lease: relay.lease,
            max_retries: postbox::event::DEFAULT_MAX_RETRIES.unsigned_abs(),
            backoff_base: relay.retry.base,
            backoff_cap: relay.retry.cap,
            publish_timeout: relay.publish_timeout,
            concurrency: relay.concurrency,
            metrics_tenants: relay.metrics_tenants,
            drain_patience: relay.drain_patience,
            retention: relay.retention.unwrap_or_default(),
            archive_retention: relay.archive_retention.unwrap_or_default(),
            inbox_retention: relay.inbox_retention.unwrap_or_default(),
            dead_letter_retry_interval: relay.dead_letter_retry_interval.unwrap_or_default(),
            dead_letter_max_retries: relay.dead_letter_max_retries,
            ordered_aggregate_types: relay.ordered_aggregate_types,
            source: RelaySource::Poll,
            cdc_slot: postbox_cdc::CdcConfig::default().slot,
            cdc_publication: postbox_cdc::CdcConfig::default().publication,
            cdc_claim: postbox_cdc::CdcConfig::default().claim,
            log_format: LogFormat::Text,
            log_level: "info".to_owned(),
            payload_limit: ByteSize(postbox::outbox::DEFAULT_PAYLOAD_LIMIT),
            sink: None,
            sink_url: None,
            topic: None,
            exchange: None,
            sink_format: None,
            webhook_secret: None,
            sinks: BTreeMap::new(),
            routes: Vec::new(),
            routing: None,
            retry_policies: Vec::new(),
            admin_listen: None,
            admin_token: None,
            alert_webhook: None,
            alert_sink_down_after: alerts.sink_down_after,
            alert_backlog_age: alerts.backlog_age_over.unwrap_or_default(),
            alert_repeat_after: alerts.repeat_after,
            alert_max_per_hour: alerts.max_per_hour,
        }
    }
}

impl Config {
    /// The settings of the relay.
    pub(crate) fn relay_config(&self) -> postbox::RelayConfig {
        let mut relay = postbox::RelayConfig::default()
            .batch_size(self.batch_size)
            .max_batch_size(self.max_batch_size)
            .poll_interval(self.poll_interval)
            .busy_poll_interval(self.busy_poll_interval)
            .busy_period(self.busy_period)
            .head_poll_interval(
                (!self.head_poll_interval.is_zero()).then_some(self.head_poll_interval),
            )
            .vacuum_threshold((self.vacuum_threshold > 0).then_some(self.vacuum_threshold))
            .lease(self.lease)
            .retry(postbox::backoff::Backoff {
                base: self.backoff_base,
                cap: self.backoff_cap,
            })
            .publish_timeout(self.publish_timeout)
            .concurrency(self.concurrency)
            .metrics_tenants(self.metrics_tenants)
            .drain_patience(self.drain_patience)
            .retention(self.retention())
            .archive_retention(
                (!self.archive_retention.is_zero()).then_some(self.archive_retention),
            )
            .inbox_retention((!self.inbox_retention.is_zero()).then_some(self.inbox_retention))
            .dead_letter_retry_interval(
                (!self.dead_letter_retry_interval.is_zero())
                    .then_some(self.dead_letter_retry_interval),
            )
            .dead_letter_max_retries(self.dead_letter_max_retries)
            .ordered_aggregate_types(self.ordered_aggregate_types.iter().cloned());
        for p in &self.retry_policies {
            let mut policy =
                postbox::relay::RetryPolicy::new(p.event_type.clone()).slow_lane(p.slow_lane);
            if let Some(max) = p.max_retries {
                policy = policy.max_retries(max);
            }
            if p.backoff_base.is_some() || p.backoff_cap.is_some() {
                policy = policy.backoff(postbox::backoff::Backoff {
                    base: p.backoff_base.unwrap_or(self.backoff_base),
                    cap: p.backoff_cap.unwrap_or(self.backoff_cap),
                });
            }
            relay = relay.retry_policy(policy);
        }
        relay
    }

    /// The alert settings.
    pub(crate) fn alert_config(&self) -> postbox_admin::alerts::AlertConfig {
        let mut alerts = postbox_admin::alerts::AlertConfig::default();
        alerts.webhook = self.alert_webhook.as_ref().map(|u| u.expose().to_owned());
        alerts.sink_down_after = self.alert_sink_down_after;
        alerts.backlog_age_over =
            (!self.alert_backlog_age.is_zero()).then_some(self.alert_backlog_age);
        alerts.repeat_after = self.alert_repeat_after;
        alerts.max_per_hour = self.alert_max_per_hour;
        alerts
    }

    /// The age past which processed events are archived; `None` when retention is off.
    pub(crate) fn retention(&self) -> Option<Duration> {
        (!self.retention.is_zero()).then_some(self.retention)
    }

    /// Where the database is: `database_url`. A command that works on one database refuses a
    /// configuration that lists several in `database_urls` only.
    pub(crate) fn location(&self) -> anyhow::Result<Location> {
        if self.database_url.is_none() && !self.database_urls.is_empty() {
            anyhow::bail!(
                "this command works on one database, and database_urls lists {}: name the one \
                 with --database-url (or POSTBOX_DATABASE_URL)",
                self.database_urls.len()
            );
        }
        Location::parse(self.database_url.as_ref().map(DatabaseUrl::expose))
            .context("invalid configuration key `database_url`")
    }

    /// The databases a relay serves and `migrate` migrates: `database_url` when set, else every
    /// one of `database_urls`, else the default SQLite file.
    pub(crate) fn locations(&self) -> anyhow::Result<Vec<Location>> {
        if self.database_url.is_some() || self.database_urls.is_empty() {
            return Ok(vec![self.location()?]);
        }
        self.database_urls
            .iter()
            .map(|url| {
                Location::parse(Some(url.expose()))
                    .context("invalid configuration key `database_urls`")
            })
            .collect()
    }
}
/// A duration as configuration writes it (`1s`, `500ms`).
pub(crate) fn show(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}
