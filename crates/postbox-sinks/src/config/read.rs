//! Reading a sink's configuration, checked before anything connects: from a `[sinks.NAME]`
//! table ([`SinkConfig::from_table`]) or from the single-sink keys ([`SingleSink`]).

use std::time::Duration;

use serde_json::{Map, Value};

use super::{ConfigError, SinkConfig, SinkKind, default_publish_timeout};
use crate::Template;
use crate::cloudevents::{CloudEventsConfig, Format};

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
