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
//!
//! This file holds the kinds (`sink_kinds!`) and what every kind's configuration answers;
//! `read` reads a table or the single-sink keys, `connect` opens a configured sink, and
//! `builtin` holds the stdout and null kinds.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use postbox::redact::redact;
use serde::Deserialize;
use serde_json::{Map, Value};

pub use crate::error::ConfigError;
use crate::open::Shared;
pub use crate::settings::{Secret, SinkSettings, default_publish_timeout};
use crate::{Result, RoutableSink, Template};

mod builtin;
mod connect;
mod read;

pub use builtin::{NullConfig, StdoutConfig};
pub use read::SingleSink;

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
mod tests;
