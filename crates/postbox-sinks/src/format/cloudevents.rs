//! CloudEvents 1.0: what a sink sends when its table says `format = "cloudevents"`.
//!
//! Every broker sink can write each event as a [CloudEvent](https://cloudevents.io) instead of
//! Postbox's own shape, in one of two content modes:
//!
//! - **binary** (the default): the attributes travel in the protocol's metadata, under the
//!   names its CloudEvents binding gives them (HTTP and NATS `ce-id` headers, Kafka `ce_id`
//!   headers, AMQP `cloudEvents:id` application properties, MQTT 5 user properties named
//!   `id`, …), the content type (`application/json`) where the protocol keeps it, and the body
//!   is the event payload, unchanged;
//! - **structured**: the body is the whole event as `application/cloudevents+json` (the
//!   attributes and `data`, the payload).
//!
//! The mapping (the same in both modes):
//!
//! | attribute | value |
//! |---|---|
//! | `specversion` | `1.0` |
//! | `id` | the dedup id: the idempotency key, else the event id |
//! | `source` | `cloudevents.source`; by default `/postbox/{database}/{schema}` (the event's tenant schema) |
//! | `type` | the event type |
//! | `subject` | the aggregate: `{aggregate_type}/{aggregate_id}` (the id alone without a type; absent without an aggregate) |
//! | `time` | when the event was enqueued (its transaction's time), RFC 3339 UTC |
//! | `datacontenttype` | `application/json` |
//! | `dataschema` | `cloudevents.dataschema` rendered for the event, if set (e.g. `https://schemas.example.com/{event_type}/v{schema_version}`) |
//! | `schemaversion` (extension) | the payload's schema version |
//! | `partitionkey` (extension) | the aggregate id, when the event has one (Kafka's key too) |
//! | `traceparent`, `tracestate` (extension) | the event's headers of those names, when present |
//!
//! The Postbox headers ([`crate::headers`], `postbox-dedup-id` among them) and the event's own
//! headers still travel beside the attributes, so a consumer that reads either finds what it
//! needs, and the broker's own dedup field (`Nats-Msg-Id`, AMQP `message_id`, `Idempotency-Key`)
//! is still set — except in MQTT's binary mode, whose binding reads every user property as an
//! attribute: its user properties are the attributes alone.
//!
//! ```
//! use postbox_sinks::cloudevents::{CloudEventsConfig, Format, Mode};
//!
//! let config: postbox_sinks::KafkaConfig = serde_json::from_value(serde_json::json!({
//!     "bootstrap_servers": "127.0.0.1:9092",
//!     "topic": "billing",
//!     "format": "cloudevents",
//!     "cloudevents": {"mode": "structured", "source": "/billing"},
//! })).unwrap();
//! assert_eq!(config.format, Format::Cloudevents);
//! assert_eq!(config.cloudevents.mode, Mode::Structured);
//! ```
#![cfg_attr(
    not(any(
        feature = "nats",
        feature = "amqp",
        feature = "kafka",
        feature = "redis",
        feature = "mqtt",
        feature = "webhook"
    )),
    allow(dead_code, reason = "the encoder serves the broker sinks' features")
)]

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt::Write as _;

use chrono::SecondsFormat;
use postbox::{OutboxEvent, PublishError};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::{Template, headers};

/// The CloudEvents version written.
pub const SPEC_VERSION: &str = "1.0";
/// The content type of the payload (`datacontenttype`), and of Postbox's own messages.
pub const JSON: &str = "application/json";
/// The content type of a structured-mode message.
pub const STRUCTURED: &str = "application/cloudevents+json";

/// How a sink writes each event.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Format {
    /// The payload as the body, Postbox's metadata as headers (docs/sinks.md). The default.
    #[default]
    Postbox,
    /// A CloudEvent 1.0, in the [`Mode`] of `cloudevents.mode` (see the module docs).
    Cloudevents,
}

/// The CloudEvents content mode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Mode {
    /// Attributes in the protocol's metadata, the payload as the body. The default.
    #[default]
    Binary,
    /// The whole event as the body, `application/cloudevents+json`.
    Structured,
}

/// Where the events come from, for the default `source`: set by whoever opens the sinks beside
/// a database (the `postbox` binary does).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    /// The database's name, e.g. `billing`.
    pub database: String,
    /// The schema of the default outbox, e.g. `public`; a tenant's events name their tenant's.
    pub schema: String,
}

/// The `cloudevents` table of a sink (used with `format = "cloudevents"`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct CloudEventsConfig {
    /// `binary` (default) or `structured`.
    #[serde(default)]
    pub mode: Mode,
    /// The `source` attribute, a URI-reference such as `/billing` or `urn:acme:billing`. Default
    /// `/postbox/{database}/{schema}` of the outbox the event comes from (`/postbox/{schema}`
    /// when the sink was opened without a database; `/postbox` for the default schema then).
    #[serde(default)]
    pub source: Option<String>,
    /// The `dataschema` attribute, a URI template with the destination placeholders and
    /// `{schema_version}`, e.g. `https://schemas.example.com/{event_type}/v{schema_version}`.
    /// Default none (no `dataschema`).
    #[serde(default)]
    pub dataschema: Option<Template>,
    /// Filled when the sink is opened; see [`Origin`].
    #[serde(skip)]
    pub(crate) origin: Option<Origin>,
}

impl CloudEventsConfig {
    /// Sets where the events come from, for the default `source`.
    pub fn set_origin(&mut self, origin: Option<Origin>) {
        self.origin = origin;
    }

    /// Checks what deserializing cannot: a `source` that is not empty. The error names the key.
    pub(crate) fn check(&self) -> Result<(), crate::ConfigError> {
        if let Some(source) = &self.source
            && (source.trim().is_empty() || source.chars().any(char::is_control))
        {
            return Err(crate::ConfigError::new(
                "cloudevents.source",
                format!(
                    "{source:?} is not a URI-reference; write e.g. \"/billing\" or \
                     \"urn:acme:billing\", or leave it out for /postbox/{{database}}/{{schema}}"
                ),
            ));
        }
        Ok(())
    }

    fn source<'a>(&'a self, event: &OutboxEvent) -> Cow<'a, str> {
        if let Some(source) = &self.source {
            return Cow::Borrowed(source);
        }
        match (&self.origin, event.tenant.as_deref()) {
            (Some(o), Some(tenant)) => Cow::Owned(format!("/postbox/{}/{tenant}", o.database)),
            (Some(o), None) => Cow::Owned(format!("/postbox/{}/{}", o.database, o.schema)),
            (None, Some(tenant)) => Cow::Owned(format!("/postbox/{tenant}")),
            (None, None) => Cow::Borrowed("/postbox"),
        }
    }
}

/// The protocol a message is for: which names its CloudEvents binding gives the attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(dead_code, reason = "each sink feature uses its own")]
pub(crate) enum Binding {
    /// HTTP: `ce-` headers, values percent-encoded, the content type in `Content-Type`.
    Http,
    /// NATS: `ce-` headers (values percent-encoded, as HTTP's), `content-type`.
    Nats,
    /// Kafka: `ce_` headers, `content-type`.
    Kafka,
    /// AMQP: `cloudEvents:` application properties (message headers on RabbitMQ), the content
    /// type in the `content_type` property.
    Amqp,
    /// MQTT 5: user properties named by the attributes, the content type in its property.
    Mqtt,
    /// Redis Streams, which has no CloudEvents binding: `ce_` fields and `content-type`, as
    /// Kafka's headers.
    Redis,
}

impl Binding {
    fn prefix(self) -> &'static str {
        match self {
            Binding::Http | Binding::Nats => "ce-",
            Binding::Kafka | Binding::Redis => "ce_",
            Binding::Amqp => "cloudEvents:",
            Binding::Mqtt => "",
        }
    }

    /// Where the content type goes as a header, for protocols without a property of their own.
    fn content_type_header(self) -> Option<&'static str> {
        match self {
            Binding::Nats | Binding::Kafka | Binding::Redis => Some("content-type"),
            Binding::Http | Binding::Amqp | Binding::Mqtt => None,
        }
    }

    fn percent_encodes(self) -> bool {
        matches!(self, Binding::Http | Binding::Nats)
    }
}

/// What a sink sends for one event: its headers (or properties, or fields), its content type
/// and its body.
#[derive(Debug)]
pub(crate) struct Message<'e> {
    /// Name/value pairs, in order.
    pub(crate) headers: Vec<(String, String)>,
    /// The body's content type, for protocols that keep it apart from the headers.
    #[allow(dead_code, reason = "Kafka, NATS and Redis carry it among the headers")]
    pub(crate) content_type: &'static str,
    /// The body.
    pub(crate) body: Cow<'e, [u8]>,
}

/// How one sink writes its events: its [`Format`], with the CloudEvents settings.
#[derive(Clone, Debug, Default)]
pub(crate) struct Encoder {
    cloudevents: Option<CloudEventsConfig>,
}

impl Encoder {
    pub(crate) fn new(format: Format, config: &CloudEventsConfig) -> Encoder {
        Encoder {
            cloudevents: (format == Format::Cloudevents).then(|| config.clone()),
        }
    }

    /// Whether events are written as CloudEvents.
    #[allow(dead_code, reason = "used only by some sink features")]
    pub(crate) fn is_cloudevents(&self) -> bool {
        self.cloudevents.is_some()
    }

    /// The message of `event` for `binding`. Fails (permanently) only when a `dataschema`
    /// template needs a value the event lacks.
    pub(crate) fn encode<'e>(
        &self,
        event: &'e OutboxEvent,
        binding: Binding,
    ) -> Result<Message<'e>, PublishError> {
        let Some(config) = &self.cloudevents else {
            return Ok(Message {
                headers: headers::all(event),
                content_type: JSON,
                body: Cow::Borrowed(event.payload.get().as_bytes()),
            });
        };
        let attributes = attributes(event, config)?;
        let mut out = Vec::with_capacity(attributes.len() + 12);
        let (content_type, body) = match config.mode {
            Mode::Binary => {
                for (name, value) in &attributes {
                    let value = if binding.percent_encodes() {
                        percent_encode(value)
                    } else {
                        value.clone()
                    };
                    out.push((format!("{}{name}", binding.prefix()), value));
                }
                (JSON, Cow::Borrowed(event.payload.get().as_bytes()))
            }
            Mode::Structured => (STRUCTURED, Cow::Owned(structured(&attributes, event)?)),
        };
        if let Some(header) = binding.content_type_header() {
            out.push((header.to_owned(), content_type.to_owned()));
        }
        // The Postbox and event headers beside them, unless one has an attribute's name; but
        // not among MQTT's binary-mode user properties, which its binding reads, every one, as
        // an attribute (and `postbox-event-id` is no attribute name).
        if !(binding == Binding::Mqtt && config.mode == Mode::Binary) {
            for (name, value) in headers::all(event) {
                if !out.iter().any(|(n, _)| n.eq_ignore_ascii_case(&name)) {
                    out.push((name, value));
                }
            }
        }
        Ok(Message {
            headers: out,
            content_type,
            body,
        })
    }
}

/// The attributes of `event` but `data` and `datacontenttype`, by name.
fn attributes(
    event: &OutboxEvent,
    config: &CloudEventsConfig,
) -> Result<Vec<(&'static str, String)>, PublishError> {
    let mut out = vec![
        ("specversion", SPEC_VERSION.to_owned()),
        ("id", event.dedup_id()),
        ("source", config.source(event).into_owned()),
        ("type", event.event_type.clone()),
        (
            "time",
            event
                .created_at
                .to_rfc3339_opts(SecondsFormat::Millis, true),
        ),
    ];
    match (&event.aggregate_type, &event.aggregate_id) {
        (Some(kind), Some(id)) => out.push(("subject", format!("{kind}/{id}"))),
        (None, Some(id)) => out.push(("subject", id.clone())),
        _ => {}
    }
    if let Some(template) = &config.dataschema {
        out.push(("dataschema", template.render(event)?));
    }
    out.push(("schemaversion", event.schema_version.to_string()));
    if let Some(id) = &event.aggregate_id {
        out.push(("partitionkey", id.clone()));
    }
    for name in ["traceparent", "tracestate"] {
        if let Some((_, value)) = event
            .headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
        {
            out.push((name, value.clone()));
        }
    }
    Ok(out)
}

/// The structured-mode body: the attributes, `datacontenttype` and the payload as `data`.
fn structured(
    attributes: &[(&'static str, String)],
    event: &OutboxEvent,
) -> Result<Vec<u8>, PublishError> {
    #[derive(Serialize)]
    struct Envelope<'a> {
        #[serde(flatten)]
        attributes: BTreeMap<&'static str, &'a str>,
        datacontenttype: &'static str,
        data: &'a RawValue,
    }
    let envelope = Envelope {
        attributes: attributes.iter().map(|(k, v)| (*k, v.as_str())).collect(),
        datacontenttype: JSON,
        data: &event.payload,
    };
    serde_json::to_vec(&envelope).map_err(|e| {
        PublishError::permanent(format!(
            "event {} cannot be written as a CloudEvent: {e}",
            event.id
        ))
    })
}

/// Percent-encodes what the HTTP binding does not allow in a header value: anything but
/// printable ASCII, and space, `"` and `%` (CloudEvents HTTP binding, 3.1.3.2). Written here
/// because the set is the binding's own, not one of the URL encoders' sets.
fn percent_encode(value: &str) -> String {
    let allowed = |b: u8| (0x21..=0x7e).contains(&b) && b != b'"' && b != b'%';
    if value.bytes().all(allowed) {
        return value.to_owned();
    }
    let mut out = String::with_capacity(value.len() + 8);
    for b in value.bytes() {
        if allowed(b) {
            out.push(char::from(b));
        } else {
            // Writing to a String cannot fail.
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests;
