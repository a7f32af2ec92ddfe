//! Sink configuration: one serde [`SinkConfig`] for every kind of sink, tagged by `kind`, read
//! from a table such as `[sinks.billing]` of `postbox.toml` (or built in code), checked before
//! anything connects, and opened with [`SinkConfig::open`].
//!
//! Each kind of sink lives in a module of its own whose configuration implements
//! [`SinkSettings`]; the list at the bottom of this file (`sink_kinds!`) names them. Adding a
//! sink is that module plus one line there.
//!
//! Every configuration mistake is a [`ConfigError`]: which key, table or rule, and what is
//! wrong. A sink's table names the key (`url`, `publish_timeout`); a routing configuration
//! names the table or rule around it (`sinks.billing`, `routes[2]`).

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use postbox::redact::redact;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::cloudevents::{CloudEventsConfig, Format};
pub use crate::error::ConfigError;
use crate::open::{Reconnecting, Shared};
pub use crate::settings::{Secret, SinkSettings, default_publish_timeout};
use crate::{Error, Result, RoutableSink, Template};

/// A sink of the stdout kind: one JSON line per event on the process's stdout.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct StdoutConfig {}

/// A sink of the null kind: discards every event (they are still marked `PROCESSED`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct NullConfig {}

#[async_trait]
impl SinkSettings for StdoutConfig {
    const DESTINATION_KEY: Option<&'static str> = None;

    fn address(&self) -> String {
        String::new()
    }

    fn destination(&self) -> Option<&Template> {
        None
    }

    fn check_destination(&self, _: &Template) -> std::result::Result<(), ConfigError> {
        Err(ConfigError::new(
            "topic",
            "the stdout sink takes no topic; leave `topic` out",
        ))
    }

    fn publish_timeout(&self) -> Option<Duration> {
        None
    }

    async fn connect(&self, shared: &Shared) -> Result<Arc<dyn RoutableSink>> {
        Ok(shared.stdout()?)
    }
}

#[async_trait]
impl SinkSettings for NullConfig {
    const DESTINATION_KEY: Option<&'static str> = None;

    fn address(&self) -> String {
        String::new()
    }

    fn destination(&self) -> Option<&Template> {
        None
    }

    fn check_destination(&self, _: &Template) -> std::result::Result<(), ConfigError> {
        Err(ConfigError::new(
            "topic",
            "the null sink takes no topic; leave `topic` out",
        ))
    }

    fn publish_timeout(&self) -> Option<Duration> {
        None
    }

    async fn connect(&self, _: &Shared) -> Result<Arc<dyn RoutableSink>> {
        Ok(Arc::new(crate::stdout::NullSink))
    }
}

/// Declares the kinds of sink: the [`SinkConfig`] enum (tagged by `kind`), the [`SinkKind`]
/// names, and the dispatch of [`SinkSettings`] over them.
macro_rules! sink_kinds {
    ($( $(#[cfg($cfg:meta)])? $variant:ident($config:ty) = $name:literal, $doc:literal; )*) => {
        /// One sink's kind and settings, as a `[sinks.NAME]` table holds them (`kind = "nats"`
        /// and that kind's keys; see docs/sinks.md).
        ///
        /// ```
        /// let config = postbox_sinks::SinkConfig::from_table(
        ///     &serde_json::json!({"kind": "nats", "url": "nats://127.0.0.1:4222",
        ///                         "subject": "billing.{event_type}"}),
        ///     std::time::Duration::from_secs(10),
        /// ).unwrap();
        /// assert_eq!(config.kind().name(), "nats");
        /// ```
        #[derive(Clone, Debug, Deserialize)]
        #[serde(tag = "kind", deny_unknown_fields)]
        #[non_exhaustive]
        pub enum SinkConfig {
            $( #[doc = $doc] $(#[cfg($cfg)])? #[serde(rename = $name)] $variant($config), )*
        }

        /// The kinds of sink this build has.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum SinkKind {
            $( #[doc = $doc] $(#[cfg($cfg)])? $variant, )*
        }

        impl SinkKind {
            /// Every kind this build has, in the order of the docs.
            pub const ALL: &'static [SinkKind] = &[ $( $(#[cfg($cfg)])? SinkKind::$variant, )* ];

            /// The name, as `kind` and `--sink` write it.
            pub fn name(self) -> &'static str {
                match self { $( $(#[cfg($cfg)])? SinkKind::$variant => $name, )* }
            }

            /// What the kind does, in one line (for `--help`).
            pub fn description(self) -> &'static str {
                match self { $( $(#[cfg($cfg)])? SinkKind::$variant => $doc, )* }
            }

            /// The destination's key in this kind's table; `None` when it takes none.
            pub fn destination_key(self) -> Option<&'static str> {
                match self {
                    $( $(#[cfg($cfg)])? SinkKind::$variant => <$config as SinkSettings>::DESTINATION_KEY, )*
                }
            }

            /// What the destination is called in messages.
            pub fn destination_name(self) -> &'static str {
                match self {
                    $( $(#[cfg($cfg)])? SinkKind::$variant => <$config as SinkSettings>::DESTINATION_NAME, )*
                }
            }

            /// A destination to show in messages.
            pub fn example_destination(self) -> &'static str {
                match self {
                    $( $(#[cfg($cfg)])? SinkKind::$variant => <$config as SinkSettings>::EXAMPLE_DESTINATION, )*
                }
            }

            fn read_url(self, table: &mut Map<String, Value>) -> std::result::Result<(), ConfigError> {
                match self {
                    $( $(#[cfg($cfg)])? SinkKind::$variant => <$config as SinkSettings>::read_url(table), )*
                }
            }
        }

        impl SinkConfig {
            /// The kind.
            pub fn kind(&self) -> SinkKind {
                match self { $( $(#[cfg($cfg)])? SinkConfig::$variant(_) => SinkKind::$variant, )* }
            }

            fn settings(&self) -> &dyn DynSettings {
                match self { $( $(#[cfg($cfg)])? SinkConfig::$variant(c) => c, )* }
            }

            fn settings_mut(&mut self) -> &mut dyn DynSettings {
                match self { $( $(#[cfg($cfg)])? SinkConfig::$variant(c) => c, )* }
            }
        }
    };
}

/// [`SinkSettings`] without its associated items, so that [`SinkConfig`] can hand out a
/// `&dyn` of whichever kind it holds.
#[async_trait]
trait DynSettings: Send + Sync {
    fn settle(&mut self) -> std::result::Result<(), ConfigError>;
    fn address(&self) -> String;
    fn destination(&self) -> Option<&Template>;
    fn check_destination(&self, destination: &Template) -> std::result::Result<(), ConfigError>;
    fn publish_timeout(&self) -> Option<Duration>;
    fn set_publish_timeout(&mut self, timeout: Duration);
    fn reconnect_max_delay(&self) -> Option<Duration>;
    async fn connect(&self, shared: &Shared) -> Result<Arc<dyn RoutableSink>>;
}

#[async_trait]
impl<T: SinkSettings> DynSettings for T {
    fn settle(&mut self) -> std::result::Result<(), ConfigError> {
        SinkSettings::settle(self)
    }
    fn address(&self) -> String {
        SinkSettings::address(self)
    }
    fn destination(&self) -> Option<&Template> {
        SinkSettings::destination(self)
    }
    fn check_destination(&self, destination: &Template) -> std::result::Result<(), ConfigError> {
        SinkSettings::check_destination(self, destination)
    }
    fn publish_timeout(&self) -> Option<Duration> {
        SinkSettings::publish_timeout(self)
    }
    fn set_publish_timeout(&mut self, timeout: Duration) {
        SinkSettings::set_publish_timeout(self, timeout);
    }
    fn reconnect_max_delay(&self) -> Option<Duration> {
        SinkSettings::reconnect_max_delay(self)
    }
    async fn connect(&self, shared: &Shared) -> Result<Arc<dyn RoutableSink>> {
        SinkSettings::connect(self, shared).await
    }
}

impl fmt::Display for SinkKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for SinkKind {
    type Err = ConfigError;

    /// The kind named `s`; an unknown name is a mistake in `kind` that lists the kinds this
    /// build has.
    fn from_str(s: &str) -> std::result::Result<Self, ConfigError> {
        SinkKind::ALL
            .iter()
            .copied()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = SinkKind::ALL.iter().map(|k| k.name()).collect();
                ConfigError::new(
                    "kind",
                    format!(
                        "unknown sink kind {s:?}; this build has {}",
                        names.join(", ")
                    ),
                )
            })
    }
}

impl<'de> Deserialize<'de> for SinkKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl serde::Serialize for SinkKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl SinkConfig {
    /// The sink of a `[sinks.NAME]` table: `kind` and the keys of that kind's configuration
    /// (see docs/sinks.md), plus `url` for every kind (`mqtt://host:port` for MQTT, the
    /// bootstrap servers for Kafka). A table without `publish_timeout` gets
    /// [`default_publish_timeout`] of the relay's `relay_publish_timeout`; one with it must be
    /// shorter than the relay's. Errors name the key (secrets hidden); see [`ConfigError::at`].
    pub fn from_table(
        table: &Value,
        relay_publish_timeout: Duration,
    ) -> std::result::Result<SinkConfig, ConfigError> {
        let Value::Object(map) = table else {
            return Err(ConfigError::new(
                "",
                "must be a table, e.g. [sinks.events] with kind = \"nats\"",
            ));
        };
        let mut map = map.clone();
        let kind = match map.get("kind") {
            None => {
                return Err(ConfigError::new(
                    "kind",
                    "is missing: say which sink this is, e.g. kind = \"nats\"",
                ));
            }
            Some(Value::String(k)) => k.parse::<SinkKind>()?,
            Some(_) => {
                return Err(ConfigError::new(
                    "kind",
                    "must be a string, e.g. kind = \"nats\"",
                ));
            }
        };
        if kind.destination_key().is_none()
            && let Some(key) = map.keys().find(|k| *k != "kind")
        {
            return Err(ConfigError::new(
                "",
                format!("unknown field `{key}`: the {kind} kind takes no settings"),
            ));
        }
        kind.read_url(&mut map)?;
        // The destination first, so that a mistake in it is named by its key.
        if let Some(key) = kind.destination_key()
            && let Some(Value::String(destination)) = map.get(key)
            && let Err(e) = destination.parse::<Template>()
        {
            return Err(ConfigError::new(key, e.to_string()));
        }
        check_format(&map)?;
        let explicit_timeout = map.contains_key("publish_timeout");
        let mut config: SinkConfig = serde_json::from_value(Value::Object(map))
            .map_err(|e| ConfigError::new("", e.to_string()))?;
        config.settings_mut().settle()?;
        if explicit_timeout {
            if let Some(timeout) = config.publish_timeout()
                && (timeout >= relay_publish_timeout || timeout.is_zero())
            {
                return Err(ConfigError::new(
                    "publish_timeout",
                    format!(
                        "{} must be above zero and shorter than the relay's publish_timeout \
                         ({}), so that the sink gives up first, with its own error; lower it or \
                         raise the relay's",
                        humantime::format_duration(timeout),
                        humantime::format_duration(relay_publish_timeout)
                    ),
                ));
            }
        } else {
            config
                .settings_mut()
                .set_publish_timeout(default_publish_timeout(relay_publish_timeout));
        }
        Ok(config)
    }

    /// The sink of the single-sink keys (`sink`, `sink_url`, `topic`, `exchange`, `webhook_secret`,
    /// `sink_format`): the table `{kind, url: sink_url, <destination key>: topic, exchange, secret:
    /// webhook_secret, format: sink_format}`. The caller checks first that each key given applies
    /// to the kind (it knows how to name them). An error's [`ConfigError::at`] is the single-sink
    /// key it is about (`sink_url`, `topic`, `exchange`, `webhook_secret`, `sink_format`), or
    /// `sink`.
    pub fn from_single(single: &SingleSink<'_>) -> std::result::Result<SinkConfig, ConfigError> {
        let kind = single.kind;
        let mut table = Map::new();
        table.insert("kind".into(), kind.name().into());
        if let Some(url) = single.url {
            table.insert("url".into(), url.into());
        }
        if let (Some(topic), Some(key)) = (single.topic, kind.destination_key())
            && key != "url"
        {
            table.insert(key.into(), topic.into());
        }
        if let Some(exchange) = single.exchange {
            table.insert("exchange".into(), exchange.into());
        }
        if let Some(secret) = single.webhook_secret {
            table.insert("secret".into(), secret.into());
        }
        if let Some(format) = single.format {
            table.insert(
                "format".into(),
                serde_json::to_value(format).unwrap_or(Value::Null),
            );
        }
        Self::from_table(&Value::Object(table), single.relay_publish_timeout).map_err(|e| {
            let at = match e.at.as_str() {
                "url" => "sink_url",
                "secret" => "webhook_secret",
                "exchange" => "exchange",
                "format" => "sink_format",
                key if Some(key) == kind.destination_key() => "topic",
                _ => "sink",
            };
            ConfigError {
                at: at.to_owned(),
                ..e
            }
        })
    }

    /// Where it publishes, for logs: the address with any password hidden.
    pub fn address(&self) -> String {
        redact(&self.settings().address())
    }

    /// The sink's own destination template, if it has one.
    pub fn own_destination(&self) -> Option<&Template> {
        self.settings().destination()
    }

    /// Whether every event needs a destination (all but stdout and null).
    pub fn needs_destination(&self) -> bool {
        self.kind().destination_key().is_some()
    }

    /// Checks a route's destination template (its `topic`) for this sink.
    pub fn check_destination(
        &self,
        destination: &Template,
    ) -> std::result::Result<(), ConfigError> {
        self.settings().check_destination(destination)
    }

    /// How long one publish may take; `None` for stdout and null, which bound nothing.
    pub fn publish_timeout(&self) -> Option<Duration> {
        self.settings().publish_timeout()
    }

    /// Opens the sink. A broker that cannot be reached yet does not fail the start: the sink
    /// keeps connecting in the background (waiting up to its `reconnect_max_delay` between
    /// attempts) and its events fail as retryable until it is up. A configuration mistake
    /// fails.
    ///
    /// Every kind with a destination is opened behind a [`crate::Breaker`] named `name`: once
    /// the destination is down its events wait without spending tries, and it is probed until
    /// it is back.
    pub async fn open(&self, name: &str) -> Result<Arc<dyn RoutableSink>> {
        self.open_shared(name, &Shared::default()).await
    }

    pub(crate) async fn open_shared(
        &self,
        name: &str,
        shared: &Shared,
    ) -> Result<Arc<dyn RoutableSink>> {
        let label = match self.address() {
            a if a.is_empty() => format!("{} sink", self.kind()),
            a => format!("{} sink at {a}", self.kind()),
        };
        let sink = connect_or_keep_trying(self.kind(), label, self.clone(), shared).await?;
        Ok(with_breaker(self.kind(), name, sink))
    }

    pub(crate) fn reconnect_max_delay(&self) -> Option<Duration> {
        self.settings().reconnect_max_delay()
    }

    pub(crate) async fn connect(&self, shared: &Shared) -> Result<Arc<dyn RoutableSink>> {
        self.settings().connect(shared).await
    }
}

/// Checks `format` and the `cloudevents` table before the table is deserialized, so that each
/// mistake is named by its key: a `cloudevents` table without `format = "cloudevents"` (it would
/// change nothing), and a `source` that is no URI-reference.
fn check_format(table: &Map<String, Value>) -> std::result::Result<(), ConfigError> {
    let cloudevents = match table.get("format") {
        None => false,
        Some(value) => {
            serde_json::from_value::<Format>(value.clone()).map_err(|e| {
                ConfigError::new(
                    "format",
                    format!("{e}; write format = \"postbox\" (the default) or \"cloudevents\""),
                )
            })? == Format::Cloudevents
        }
    };
    if let Some(settings) = table.get("cloudevents") {
        if !cloudevents {
            return Err(ConfigError::new(
                "cloudevents",
                "is only used with format = \"cloudevents\"; add that, or leave the table out",
            ));
        }
        let settings: CloudEventsConfig = serde_json::from_value(settings.clone())
            .map_err(|e| ConfigError::new("cloudevents", e.to_string()))?;
        settings.check()?;
    }
    Ok(())
}

/// The single-sink keys, for [`SinkConfig::from_single`].
#[derive(Clone, Copy, Debug)]
pub struct SingleSink<'a> {
    /// `sink`.
    pub kind: SinkKind,
    /// `sink_url`: the broker's address, or the webhook's URL template.
    pub url: Option<&'a str>,
    /// `topic`: the destination template (not for webhooks, whose URL is the destination).
    pub topic: Option<&'a str>,
    /// `exchange` (AMQP).
    pub exchange: Option<&'a str>,
    /// `webhook_secret`.
    pub webhook_secret: Option<&'a str>,
    /// `sink_format`: the sink's `format` (`postbox` when `None`).
    pub format: Option<Format>,
    /// The relay's `publish_timeout`.
    pub relay_publish_timeout: Duration,
}

/// Connects `config` once; when the broker cannot be reached ([`Error::Connect`]) and the kind
/// connects to one, logs a warning and returns a [`Reconnecting`] sink that keeps trying.
pub(crate) async fn connect_or_keep_trying(
    kind: SinkKind,
    label: String,
    config: SinkConfig,
    shared: &Shared,
) -> Result<Arc<dyn RoutableSink>> {
    let max_delay = config.reconnect_max_delay();
    let first = config.connect(shared).await;
    let Some(max_delay) = max_delay else {
        return first;
    };
    let error = match first {
        Ok(sink) => return Ok(sink),
        Err(e @ Error::Connect { .. }) => e,
        Err(e) => return Err(e),
    };
    let config = Arc::new(config);
    Ok(Reconnecting::start(
        &kind.to_string(),
        label,
        max_delay,
        error,
        move || {
            let config = Arc::clone(&config);
            Box::pin(async move {
                // Brokers' connect never uses what is shared (only stdout does).
                config.connect(&Shared::default()).await
            })
        },
    ))
}

/// `sink` behind a [`crate::Breaker`] named `name`, for the kinds that have a destination that
/// can be down (every kind but stdout and null).
pub(crate) fn with_breaker(
    kind: SinkKind,
    name: &str,
    sink: Arc<dyn RoutableSink>,
) -> Arc<dyn RoutableSink> {
    if kind.destination_key().is_some() {
        Arc::new(crate::Breaker::new(name, sink))
    } else {
        sink
    }
}

sink_kinds! {
    Stdout(StdoutConfig) = "stdout",
        "One JSON line per event on stdout, flushed before the event counts as published.";
    Null(NullConfig) = "null",
        "Discards events (they are still marked PROCESSED): for trials and benchmarks.";
    #[cfg(feature = "webhook")]
    Webhook(crate::WebhookConfig) = "webhook",
        "POSTs each event to an HTTP endpoint (a URL template); 2xx acknowledges.";
    #[cfg(feature = "nats")]
    Nats(crate::NatsConfig) = "nats",
        "NATS JetStream (the destination is the subject); the stream's PubAck acknowledges.";
    #[cfg(feature = "amqp")]
    Amqp(crate::AmqpConfig) = "amqp",
        "RabbitMQ (the destination is the routing key); the publisher confirm acknowledges.";
    #[cfg(feature = "kafka")]
    Kafka(crate::KafkaConfig) = "kafka",
        "Kafka (the destination is the topic); the delivery report (acks=all) acknowledges.";
    #[cfg(feature = "redis")]
    Redis(crate::RedisConfig) = "redis",
        "Redis Streams (the destination is the stream key); the XADD reply acknowledges.";
    #[cfg(feature = "mqtt")]
    Mqtt(crate::MqttConfig) = "mqtt",
        "MQTT 5 (the destination is the topic), QoS 1; the PUBACK acknowledges.";
}

#[cfg(all(
    test,
    feature = "nats",
    feature = "amqp",
    feature = "kafka",
    feature = "redis",
    feature = "mqtt",
    feature = "webhook"
))]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    const RELAY: Duration = Duration::from_secs(10);

    fn single(kind: SinkKind) -> SingleSink<'static> {
        SingleSink {
            kind,
            url: None,
            topic: None,
            exchange: None,
            webhook_secret: None,
            format: None,
            relay_publish_timeout: RELAY,
        }
    }

    fn table(value: serde_json::Value) -> std::result::Result<SinkConfig, String> {
        SinkConfig::from_table(&value, RELAY).map_err(|e| e.to_string())
    }

    #[cfg(feature = "kafka")]
    #[test]
    fn cloudevents_settings_are_checked_by_key() {
        let kafka = |extra: serde_json::Value| {
            let mut t = serde_json::json!({"kind": "kafka", "topic": "billing"});
            t.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            table(t)
        };
        let config = SinkConfig::from_table(
            &serde_json::json!({"kind": "kafka", "topic": "billing", "format": "cloudevents",
                                "cloudevents": {"mode": "structured", "source": "/billing"}}),
            RELAY,
        )
        .unwrap();
        let SinkConfig::Kafka(c) = config else {
            panic!("kafka")
        };
        assert_eq!(c.format, Format::Cloudevents);
        assert_eq!(c.cloudevents.mode, crate::cloudevents::Mode::Structured);
        assert_eq!(c.cloudevents.source.as_deref(), Some("/billing"));

        let err = kafka(serde_json::json!({"cloudevents": {"mode": "binary"}})).unwrap_err();
        assert!(
            err.starts_with("cloudevents:") && err.contains("format = \"cloudevents\""),
            "{err}"
        );
        let err = kafka(serde_json::json!({"format": "cloud-events"})).unwrap_err();
        assert!(
            err.starts_with("format:") && err.contains("cloud-events"),
            "{err}"
        );
        let err =
            kafka(serde_json::json!({"format": "cloudevents", "cloudevents": {"source": ""}}))
                .unwrap_err();
        assert!(err.contains("cloudevents.source"), "{err}");
        let err =
            kafka(serde_json::json!({"format": "cloudevents", "cloudevents": {"mod": "binary"}}))
                .unwrap_err();
        assert!(
            err.starts_with("cloudevents:") && err.contains("mod"),
            "{err}"
        );
        let err = kafka(serde_json::json!({"format": "cloudevents",
                                           "cloudevents": {"dataschema": "https://x/{schema}"}}))
        .unwrap_err();
        assert!(err.contains("{schema}"), "{err}");
    }

    #[test]
    fn every_broker_has_its_default_address() {
        let spec = |kind| {
            SinkConfig::from_single(&SingleSink {
                topic: Some("events.{event_type}"),
                ..single(kind)
            })
            .unwrap()
        };
        let topic: Option<Template> = Some("events.{event_type}".parse().unwrap());
        let SinkConfig::Nats(c) = spec(SinkKind::Nats) else {
            panic!("nats")
        };
        assert_eq!(c.url, "nats://127.0.0.1:4222");
        assert_eq!(c.subject, topic);
        assert_eq!(c.publish_timeout, Duration::from_secs(5));
        let SinkConfig::Amqp(c) = spec(SinkKind::Amqp) else {
            panic!("amqp")
        };
        assert_eq!(c.url, "amqp://127.0.0.1:5672/%2f");
        assert_eq!(c.exchange, "", "the default exchange");
        let SinkConfig::Redis(c) = spec(SinkKind::Redis) else {
            panic!("redis")
        };
        assert_eq!(c.url, "redis://127.0.0.1:6379");
        let SinkConfig::Mqtt(c) = spec(SinkKind::Mqtt) else {
            panic!("mqtt")
        };
        assert_eq!((c.host.as_str(), c.port), ("127.0.0.1", 1883));
        let SinkConfig::Kafka(c) = spec(SinkKind::Kafka) else {
            panic!("kafka")
        };
        assert_eq!(c.bootstrap_servers, "127.0.0.1:9092");
        assert_eq!(c.topic, topic);
    }

    #[test]
    fn nats_credentials_leave_the_url() {
        let spec = SinkConfig::from_single(&SingleSink {
            url: Some("nats://relay:p%40ss@n1:4222, nats://relay:p%40ss@n2:4222"),
            topic: Some("x"),
            ..single(SinkKind::Nats)
        })
        .unwrap();
        let SinkConfig::Nats(c) = spec else {
            panic!("nats")
        };
        assert_eq!(c.url, "nats://n1:4222,nats://n2:4222");
        assert_eq!(c.user.as_deref(), Some("relay"));
        assert_eq!(c.password.as_ref().map(Secret::expose), Some("p@ss"));
        assert!(!format!("{c:?}").contains("p@ss"), "Debug hides it");
        let SinkConfig::Nats(c) =
            table(serde_json::json!({"kind": "nats", "url": "nats://s3cr3t-token@n1:4222"}))
                .unwrap()
        else {
            panic!("nats")
        };
        assert_eq!(c.url, "nats://n1:4222");
        assert_eq!(c.token.as_ref().map(Secret::expose), Some("s3cr3t-token"));
        assert!(c.user.is_none());
        let err = table(
            serde_json::json!({"kind": "nats", "url": "nats://a:b@n1", "user": "a", "password": "b"}),
        )
        .unwrap_err();
        assert!(err.contains("give them once"), "{err}");
    }

    #[test]
    fn kafka_servers_come_from_a_url_or_a_list() {
        use crate::kafka::kafka_servers;
        assert_eq!(
            kafka_servers("kafka://k1:9092,k2:9093").as_deref(),
            Ok("k1:9092,k2:9093")
        );
        assert_eq!(
            kafka_servers("k1:9092, kafka://k2:9093/").as_deref(),
            Ok("k1:9092,k2:9093")
        );
        assert!(kafka_servers("http://k1:9092").is_err());
        assert!(kafka_servers("k1:9092,,k2").is_err());
        let SinkConfig::Kafka(c) = SinkConfig::from_single(&SingleSink {
            url: Some("kafka://10.0.0.1:9092,10.0.0.2:9092"),
            topic: Some("billing.{aggregate_type}"),
            ..single(SinkKind::Kafka)
        })
        .unwrap() else {
            panic!("kafka")
        };
        assert_eq!(c.bootstrap_servers, "10.0.0.1:9092,10.0.0.2:9092");
        let SinkConfig::Kafka(c) = table(serde_json::json!({"kind": "kafka",
            "bootstrap_servers": "a:1", "properties": {"sasl.password": "kafka-pw"}}))
        .unwrap() else {
            panic!("kafka")
        };
        assert!(!format!("{c:?}").contains("kafka-pw"), "{c:?}");
    }

    #[test]
    fn mqtt_urls_give_host_port_and_credentials() {
        let SinkConfig::Mqtt(c) = table(serde_json::json!({"kind": "mqtt",
            "url": "mqtt://relay:p%40ss@broker.internal:1884", "topic": "a/{event_type}"}))
        .unwrap() else {
            panic!("mqtt")
        };
        assert_eq!((c.host.as_str(), c.port), ("broker.internal", 1884));
        assert_eq!(c.username.as_deref(), Some("relay"));
        assert_eq!(c.password.as_ref().map(Secret::expose), Some("p@ss"));
        assert!(!format!("{c:?}").contains("p@ss"));
        for (url, host, port) in [
            ("127.0.0.1", "127.0.0.1", 1883),
            ("tcp://[::1]:1999/", "::1", 1999),
        ] {
            let SinkConfig::Mqtt(c) =
                table(serde_json::json!({"kind": "mqtt", "url": url})).unwrap()
            else {
                panic!("mqtt")
            };
            assert_eq!((c.host.as_str(), c.port), (host, port), "{url}");
        }
        for bad in [
            "mqtts://h:8883",
            "mqtt://h:port",
            "mqtt://h/topic",
            "mqtt://:1883",
        ] {
            assert!(
                table(serde_json::json!({"kind": "mqtt", "url": bad})).is_err(),
                "{bad}"
            );
        }
        let err =
            table(serde_json::json!({"kind": "mqtt", "url": "ws://u:secret@h:1"})).unwrap_err();
        assert!(!err.contains("secret"), "{err}");
        let err = SinkConfig::from_single(&SingleSink {
            url: Some("ftp://u:secret@h/{event_type}"),
            ..single(SinkKind::Webhook)
        })
        .unwrap_err();
        assert_eq!(err.at, "sink_url", "{err}");
        let err = err.to_string();
        assert!(err.contains("u:***@h") && !err.contains("secret"), "{err}");
        let err = table(serde_json::json!({"kind": "webhook", "url": "https://u:secret@h/{nope}"}))
            .unwrap_err();
        assert!(err.contains("{nope}") && !err.contains("secret"), "{err}");
    }

    #[test]
    fn the_sink_gives_up_before_the_relay() {
        assert_eq!(
            default_publish_timeout(Duration::from_secs(10)),
            Duration::from_secs(5)
        );
        assert_eq!(
            default_publish_timeout(Duration::from_secs(2)),
            Duration::from_millis(1600)
        );
    }

    #[test]
    fn tables_take_url_for_every_kind() {
        let SinkConfig::Kafka(c) =
            table(serde_json::json!({"kind": "kafka", "url": "kafka://k:1"})).unwrap()
        else {
            panic!("kafka")
        };
        assert_eq!(c.bootstrap_servers, "k:1");
        assert_eq!(c.topic, None);
        let SinkConfig::Kafka(c) = table(serde_json::json!({"kind": "kafka"})).unwrap() else {
            panic!("kafka default")
        };
        assert_eq!(c.bootstrap_servers, crate::kafka::DEFAULT_SERVERS);
        let SinkConfig::Kafka(c) = table(
            serde_json::json!({"kind": "kafka", "bootstrap_servers": "a:1,b:2",
            "topic": "t.{event_type}", "publish_timeout": "2s",
            "properties": {"compression.type": "lz4"}}),
        )
        .unwrap() else {
            panic!("kafka native keys")
        };
        assert_eq!(c.bootstrap_servers, "a:1,b:2");
        assert_eq!(c.publish_timeout, Duration::from_secs(2));
        assert_eq!(c.properties["compression.type"], "lz4");
    }

    #[test]
    fn bad_tables_are_refused_with_the_reason() {
        for (value, expect) in [
            (serde_json::json!({"url": "nats://h"}), "kind"),
            (serde_json::json!({"kind": "natz"}), "natz"),
            (
                serde_json::json!({"kind": "nats", "subjekt": "x"}),
                "subjekt",
            ),
            (
                serde_json::json!({"kind": "nats", "subject": "a.{nope}"}),
                "{nope}",
            ),
            (
                serde_json::json!({"kind": "webhook", "url": "ftp://x"}),
                "scheme",
            ),
            (
                serde_json::json!({"kind": "kafka", "url": "k:1", "bootstrap_servers": "k:2"}),
                "not both",
            ),
            (
                serde_json::json!({"kind": "mqtt", "url": "mqtt://h", "port": 1}),
                "not both",
            ),
            (serde_json::json!({"kind": "stdout", "url": "x"}), "url"),
            (
                serde_json::json!({"kind": "redis", "publish_timeout": "10s"}),
                "shorter than the relay's",
            ),
            (serde_json::json!("nats"), "table"),
        ] {
            let err = table(value.clone()).unwrap_err();
            assert!(err.contains(expect), "{value}: {err}");
        }
    }

    #[test]
    fn kinds_parse_by_name() {
        for kind in SinkKind::ALL {
            assert_eq!(kind.name().parse::<SinkKind>(), Ok(*kind));
        }
        let err = "natz".parse::<SinkKind>().unwrap_err();
        assert_eq!(err.at, "kind");
        assert!(
            err.message.contains("nats"),
            "names what this build has: {err}"
        );
    }
}
