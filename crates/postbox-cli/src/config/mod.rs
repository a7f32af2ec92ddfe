//! Configuration: built-in defaults, then `postbox.toml`, then `POSTBOX_*` environment
//! variables, then command-line flags, each layer overriding the one before (figment).
//!
//! Every key is documented in [`keys::KEYS`], which feeds `--help` and is checked against
//! `CONFIG.md` and [`Config::default`] by tests.

mod keys;
mod values;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use figment::providers::{Env, Format, Serialized, Toml};
use figment::value::{Dict, Map};
use figment::{Figment, Metadata, Profile, Provider, Source};
use serde::{Deserialize, Serialize};

pub(crate) use keys::{KEYS, keys_help};
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

/// Values given on the command line; `None` leaves the key to the lower layers.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct Overrides {
    /// `--database-url`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) database_url: Option<String>,
    /// `--schema`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) schema: Option<String>,
    /// `--batch-size`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) batch_size: Option<u32>,
    /// `--poll-interval`.
    #[serde(
        with = "humantime_serde::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub(crate) poll_interval: Option<Duration>,
    /// `--lease`.
    #[serde(
        with = "humantime_serde::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub(crate) lease: Option<Duration>,
    /// `--backoff-base`.
    #[serde(
        with = "humantime_serde::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub(crate) backoff_base: Option<Duration>,
    /// `--backoff-cap`.
    #[serde(
        with = "humantime_serde::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub(crate) backoff_cap: Option<Duration>,
    /// `--publish-timeout`.
    #[serde(
        with = "humantime_serde::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub(crate) publish_timeout: Option<Duration>,
    /// `--concurrency`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) concurrency: Option<usize>,
    /// `--admin-listen`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) admin_listen: Option<std::net::SocketAddr>,
    /// `--source`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) source: Option<RelaySource>,
    /// `--cdc-slot`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cdc_slot: Option<String>,
    /// `--log-format`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) log_format: Option<LogFormat>,
    /// `--log-level`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) log_level: Option<String>,
    /// `--sink`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) sink: Option<SinkKind>,
    /// `--sink-url`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) sink_url: Option<String>,
    /// `--topic`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) topic: Option<String>,
    /// `--exchange`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) exchange: Option<String>,
    /// `--sink-format`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) sink_format: Option<String>,
}

impl Provider for Overrides {
    fn metadata(&self) -> Metadata {
        Metadata::named(FLAGS_SOURCE).interpolater(|_: &Profile, keys: &[&str]| {
            format!("--{}", keys.join(".").replace('_', "-"))
        })
    }

    fn data(&self) -> figment::Result<Map<Profile, Dict>> {
        Serialized::defaults(self).data()
    }
}

/// The `POSTBOX_*` variables of some keys, as plain strings.
struct RawEnv(&'static [&'static str]);

impl Provider for RawEnv {
    fn metadata(&self) -> Metadata {
        Metadata::named("environment variable(s)")
    }

    fn data(&self) -> figment::Result<Map<Profile, Dict>> {
        let mut dict = Dict::new();
        for key in self.0 {
            let var = format!("{ENV_PREFIX}{}", key.to_ascii_uppercase());
            if let Some(value) = std::env::var_os(&var) {
                let value = value
                    .into_string()
                    .map_err(|_| figment::Error::from(format!("{var} is not valid UTF-8")))?;
                dict.insert((*key).to_owned(), figment::value::Value::from(value));
            }
        }
        Ok(Map::from([(Profile::Default, dict)]))
    }
}

/// The built-in defaults as a figment layer.
struct Defaults(Config);

impl Provider for Defaults {
    fn metadata(&self) -> Metadata {
        Metadata::named(DEFAULTS_SOURCE)
    }

    fn data(&self) -> figment::Result<Map<Profile, Dict>> {
        Serialized::defaults(&self.0).data()
    }
}

/// A loaded configuration and the layers it came from.
#[derive(Debug)]
pub(crate) struct Loaded {
    /// The effective values.
    pub(crate) config: Config,
    figment: Figment,
}

impl Loaded {
    /// Where the value of `key` came from: `--flag`, `POSTBOX_KEY`, a file path, or
    /// `built-in default`.
    pub(crate) fn source_of(&self, key: &str) -> String {
        let Some(md) = self.figment.find_metadata(key) else {
            return DEFAULTS_SOURCE.to_owned();
        };
        if md.name == FLAGS_SOURCE {
            format!("--{}", key.replace('_', "-"))
        } else if md.name.contains("environment") {
            format!("{ENV_PREFIX}{}", key.to_ascii_uppercase())
        } else if let Some(Source::File(path)) = &md.source {
            path.display().to_string()
        } else {
            md.name.to_string()
        }
    }
}

/// Loads the configuration: `defaults`, then the file (`explicit_file`, which must exist, or
/// `postbox.toml` in the working directory if there is one), then `POSTBOX_*` variables, then
/// `overrides`. Every error names the key and where its value came from.
pub(crate) fn load(
    defaults: Config,
    explicit_file: Option<&Path>,
    overrides: &Overrides,
) -> anyhow::Result<Loaded> {
    let file: Option<PathBuf> = match explicit_file {
        Some(path) if !path.is_file() => {
            bail!("configuration file {} does not exist", path.display())
        }
        Some(path) => Some(path.to_owned()),
        None => Some(PathBuf::from(DEFAULT_FILE)).filter(|p| p.is_file()),
    };
    let keys: Vec<&str> = KEYS
        .iter()
        .map(|k| k.key)
        .filter(|k| !RAW_ENV_KEYS.contains(k))
        .collect();
    let mut figment = Figment::from(Defaults(defaults));
    if let Some(file) = &file {
        figment = figment.merge(Toml::file_exact(file));
    }
    let figment = figment
        .merge(Env::prefixed(ENV_PREFIX).only(&keys))
        .merge(RawEnv(RAW_ENV_KEYS))
        .merge(overrides.clone());
    let config: Config = figment.extract().map_err(|e| {
        let all: Vec<String> = e.into_iter().map(|e| describe(&e)).collect();
        anyhow!("invalid configuration {}", all.join("; "))
    })?;
    let loaded = Loaded { config, figment };
    validate(&loaded)?;
    Ok(loaded)
}

/// One figment error as "key `k` (set by SOURCE): what is wrong", SOURCE being the flag, the
/// variable or the file.
fn describe(e: &figment::Error) -> String {
    let key = e.path.join(".");
    let source = match &e.metadata {
        Some(md) if md.name == FLAGS_SOURCE => format!("--{}", key.replace('_', "-")),
        Some(md) if md.name.contains("environment") => {
            format!("{ENV_PREFIX}{}", key.to_ascii_uppercase())
        }
        Some(md) => match &md.source {
            Some(Source::File(path)) => path.display().to_string(),
            _ => md.name.to_string(),
        },
        None => "an unknown source".to_owned(),
    };
    if key.is_empty() {
        format!("in {source}: {}", e.kind)
    } else {
        format!("key `{key}` (set by {source}): {}", e.kind)
    }
}

/// Range and consistency checks the types cannot express; errors name the key and its source.
fn validate(loaded: &Loaded) -> anyhow::Result<()> {
    let c = &loaded.config;
    let bad = |key: &str, msg: String| -> anyhow::Result<()> {
        Err(anyhow!(
            "invalid configuration key `{key}` (set by {}): {msg}",
            loaded.source_of(key)
        ))
    };
    // The relay's own rules (batch size, intervals, lease and publish timeout, concurrency,
    // backoff, retry policies), checked where they are defined; the error names the key.
    if let Err(postbox::Error::InvalidConfig { field, reason }) = c.relay_config().validate() {
        // Where the key it is checked against was set, too.
        let related = match field {
            "publish_timeout" => Some("lease"),
            "busy_poll_interval" | "head_poll_interval" => Some("poll_interval"),
            "backoff_cap" => Some("backoff_base"),
            _ => None,
        };
        return match related {
            Some(other) => bad(
                field,
                format!("{reason} ({other} is set by {})", loaded.source_of(other)),
            ),
            None => bad(field, reason),
        };
    }
    if i32::try_from(c.max_retries).is_err() {
        return bad("max_retries", format!("{} is too large", c.max_retries));
    }
    if c.payload_limit.0 == 0 {
        return bad("payload_limit", "must be above zero".into());
    }
    if let Err(e) = tracing_subscriber::EnvFilter::try_new(&c.log_level) {
        return bad(
            "log_level",
            format!("{:?} is not a log filter: {e}", c.log_level),
        );
    }
    if let Err(e) = Location::parse(c.database_url.as_ref().map(DatabaseUrl::expose)) {
        return bad("database_url", format!("{e:#}"));
    }
    for url in &c.database_urls {
        if let Err(e) = Location::parse(Some(url.expose())) {
            return bad("database_urls", format!("{e:#}"));
        }
    }
    let mut shown: Vec<String> = c.database_urls.iter().map(|u| u.to_string()).collect();
    shown.sort();
    if shown.windows(2).any(|w| w[0] == w[1]) {
        return bad(
            "database_urls",
            "lists a database twice; each database is served once".to_owned(),
        );
    }
    if let Some(token) = &c.admin_token
        && let Err(e) = postbox_admin::Token::new(token.expose())
    {
        return bad("admin_token", e.to_string());
    }
    if let Some(addr) = c.admin_listen
        && !addr.ip().is_loopback()
        && c.admin_token.is_none()
    {
        return bad(
            "admin_listen",
            format!(
                "{addr} is not a loopback address, and admin_token is not set: anyone who can \
                 reach it could act on events; set POSTBOX_ADMIN_TOKEN, or listen on 127.0.0.1"
            ),
        );
    }
    if let Err(e) = postbox_admin::alerts::Alerts::new(c.alert_config()) {
        let key = if c.alert_max_per_hour == 0 {
            "alert_max_per_hour"
        } else {
            "alert_webhook"
        };
        return bad(key, e.to_string());
    }
    if c.alert_sink_down_after.is_zero() {
        return bad("alert_sink_down_after", "must be above zero".into());
    }
    if c.alert_repeat_after.is_zero() {
        return bad("alert_repeat_after", "must be above zero".into());
    }
    c.relay_config()
        .validate()
        .context("invalid relay configuration")?;
    if c.sink.is_some() && !c.routes.is_empty() && !loaded.source_of("sink").starts_with("--") {
        return bad(
            "sink",
            "is set, and so are [[routes]]; use one: `sink` (with sink_url, topic) for a single \
             sink, or [[routes]] with [sinks.NAME] tables (a --sink flag overrides the routes)"
                .into(),
        );
    }
    Ok(())
}

/// A duration as configuration writes it (`1s`, `500ms`).
pub(crate) fn show(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

#[cfg(test)]
#[allow(
    clippy::result_large_err,
    reason = "figment::Jail's closures must return figment::Error"
)]
mod tests {
    use super::*;
    use figment::Jail;

    fn load_in_jail(overrides: &Overrides) -> Result<Config, figment::Error> {
        load(Config::default(), None, overrides)
            .map(|l| l.config)
            .map_err(|e| figment::Error::from(format!("{e:#}")))
    }

    #[test]
    fn defaults_match_the_documented_ones() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            let c = load_in_jail(&Overrides::default())?;
            assert_eq!(c, Config::default());
            assert_eq!(c.batch_size, 100);
            assert_eq!(c.poll_interval, Duration::from_secs(5));
            assert_eq!(c.lease, Duration::from_secs(30));
            assert_eq!(c.max_retries, 5);
            assert_eq!(c.backoff_base, Duration::from_secs(1));
            assert_eq!(c.backoff_cap, Duration::from_secs(300));
            assert_eq!(c.publish_timeout, Duration::from_secs(10));
            assert_eq!(c.concurrency, 64);
            assert_eq!(c.payload_limit, ByteSize(1024 * 1024));
            assert_eq!(c.database_url, None);
            // The documented defaults parse to the same values (those that are values: the
            // others are explained in parentheses).
            let mut toml = String::new();
            for k in KEYS.iter().filter(|k| !k.default.starts_with('(')) {
                toml.push_str(&format!("{} = {}\n", k.key, k.default));
            }
            jail.create_file("postbox.toml", &toml)?;
            assert_eq!(load_in_jail(&Overrides::default())?, Config::default());
            Ok(())
        });
    }

    #[test]
    fn flag_beats_env_beats_file_beats_default() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            jail.create_file(
                "postbox.toml",
                "batch_size = 10\nlease = \"40s\"\nschema = \"from_file\"\nconcurrency = 3\n",
            )?;
            jail.set_env("POSTBOX_BATCH_SIZE", 20);
            jail.set_env("POSTBOX_SCHEMA", "from_env");
            let flags = Overrides {
                batch_size: Some(30),
                ..Overrides::default()
            };
            let loaded = load(Config::default(), None, &flags)
                .map_err(|e| figment::Error::from(e.to_string()))?;
            let c = &loaded.config;
            assert_eq!(c.batch_size, 30, "flag wins");
            assert_eq!(c.schema, "from_env", "env beats file");
            assert_eq!(c.lease, Duration::from_secs(40), "file beats default");
            assert_eq!(c.concurrency, 3);
            assert_eq!(c.poll_interval, Duration::from_secs(5), "default");
            assert_eq!(loaded.source_of("batch_size"), "--batch-size");
            assert_eq!(loaded.source_of("schema"), "POSTBOX_SCHEMA");
            assert!(loaded.source_of("lease").ends_with("postbox.toml"));
            assert_eq!(loaded.source_of("poll_interval"), DEFAULTS_SOURCE);

            let no_flag = load_in_jail(&Overrides::default())?;
            assert_eq!(no_flag.batch_size, 20, "env beats file");
            Ok(())
        });
    }

    #[test]
    fn an_explicit_file_replaces_the_working_directory_one() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            jail.create_file("postbox.toml", "batch_size = 10\n")?;
            jail.create_file("other.toml", "batch_size = 11\n")?;
            let c = load(
                Config::default(),
                Some(Path::new("other.toml")),
                &Overrides::default(),
            )
            .map_err(|e| figment::Error::from(e.to_string()))?
            .config;
            assert_eq!(c.batch_size, 11);
            let err = load(
                Config::default(),
                Some(Path::new("missing.toml")),
                &Overrides::default(),
            )
            .expect_err("a missing explicit file is an error");
            assert!(err.to_string().contains("missing.toml"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn invalid_values_name_their_key() {
        let cases: &[(&str, &str, &str)] = &[
            ("POSTBOX_BATCH_SIZE", "0", "batch_size"),
            ("POSTBOX_BATCH_SIZE", "lots", "BATCH_SIZE"),
            ("POSTBOX_LEASE", "soon", "LEASE"),
            ("POSTBOX_LEASE", "50ms", "lease"),
            ("POSTBOX_PUBLISH_TIMEOUT", "1m", "publish_timeout"),
            ("POSTBOX_SCHEMA", "bad;name", "schema"),
            ("POSTBOX_LOG_FORMAT", "xml", "LOG_FORMAT"),
            ("POSTBOX_LOG_LEVEL", "info,[", "log_level"),
            ("POSTBOX_PAYLOAD_LIMIT", "1 parsec", "PAYLOAD_LIMIT"),
            ("POSTBOX_DATABASE_URL", "oracle://x/y", "database_url"),
            ("POSTBOX_BACKOFF_CAP", "1ms", "backoff_cap"),
        ];
        for (var, value, key) in cases {
            Jail::expect_with(|jail| {
                jail.clear_env();
                jail.set_env(var, value);
                let err = load(Config::default(), None, &Overrides::default())
                    .expect_err(var)
                    .to_string();
                assert!(err.contains(key), "{var}={value}: {err}");
                Ok(())
            });
        }
        Jail::expect_with(|jail| {
            jail.clear_env();
            jail.create_file("postbox.toml", "batch_sise = 10\n")?;
            let err = load(Config::default(), None, &Overrides::default())
                .expect_err("typo")
                .to_string();
            assert!(err.contains("batch_sise"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn sink_variables_are_taken_as_written() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            jail.set_env("POSTBOX_SINK", "webhook");
            jail.set_env("POSTBOX_SINK_URL", "https://h.example/{event_type}");
            jail.set_env("POSTBOX_WEBHOOK_SECRET", "0123");
            let c = load_in_jail(&Overrides::default())?;
            assert_eq!(c.sink, Some(SinkKind::Webhook));
            assert_eq!(
                c.webhook_secret.as_ref().map(Secret::expose),
                Some("0123"),
                "not parsed as the number 123"
            );
            jail.set_env("POSTBOX_SINK", "redis");
            jail.set_env("POSTBOX_SINK_URL", "redis://127.0.0.1:6379");
            jail.set_env("POSTBOX_WEBHOOK_SECRET", "");
            jail.set_env("POSTBOX_TOPIC", "{event_type}");
            let loaded = load(Config::default(), None, &Overrides::default())
                .expect("the keys themselves are valid");
            let err = crate::sinks::check(&loaded).expect_err("a secret for a redis sink");
            assert!(
                err.to_string().contains("webhook_secret")
                    && err.to_string().contains("POSTBOX_WEBHOOK_SECRET"),
                "{err}"
            );
            Ok(())
        });
    }

    #[test]
    fn sink_and_routes_exclude_each_other_unless_sink_is_a_flag() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            jail.create_file(
                "postbox.toml",
                "[sinks.out]\nkind = \"stdout\"\n[[routes]]\nsink = \"out\"\n",
            )?;
            let c = load_in_jail(&Overrides::default())?;
            assert_eq!(c.routes.len(), 1);
            jail.set_env("POSTBOX_SINK", "null");
            let err = load(Config::default(), None, &Overrides::default())
                .expect_err("both")
                .to_string();
            assert!(
                err.contains("`sink`") && err.contains("POSTBOX_SINK"),
                "{err}"
            );
            let flag = Overrides {
                sink: Some(SinkKind::Null),
                ..Overrides::default()
            };
            assert_eq!(load_in_jail(&flag)?.sink, Some(SinkKind::Null));
            Ok(())
        });
    }

    #[test]
    fn unrelated_postbox_variables_are_ignored() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            jail.set_env("POSTBOX_TEST_DATABASE_URL", "postgres://elsewhere/x");
            jail.set_env("POSTBOX_CONFIG", "x.toml");
            assert_eq!(load_in_jail(&Overrides::default())?, Config::default());
            Ok(())
        });
    }
}
