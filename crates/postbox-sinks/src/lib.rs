//! Broker sinks for [Postbox](postbox): where a relay publishes the events of the outbox.
//!
//! Each sink implements [`postbox::Sink`] and sits behind a cargo feature of its own:
//!
//! | feature   | sink | acknowledged when |
//! |-----------|------|-------------------|
//! | `nats`    | [`NatsSink`] (JetStream) | the stream's `PubAck` arrives |
//! | `amqp`    | [`AmqpSink`] (RabbitMQ) | the publisher confirm (`basic.ack`) arrives and nothing was returned |
//! | `kafka`   | [`KafkaSink`] | the delivery report arrives (`acks=all`, idempotent producer) |
//! | `redis`   | [`RedisSink`] (Streams) | `XADD` answers with the new entry id |
//! | `mqtt`    | [`MqttSink`] (MQTT 5) | the event's own `PUBACK` arrives (QoS 1) |
//! | `webhook` | [`WebhookSink`] (HTTP) | the endpoint answers 2xx |
//!
//! `publish` returns `Ok` only once the broker acknowledged the event; the relay then marks it
//! `PROCESSED`. Every error is classed retryable or permanent
//! ([`PublishError`](postbox::PublishError)) and keeps its cause, every publish is bounded by the sink's
//! `publish_timeout` (default 5 s, shorter than the relay's lease), and every sink reconnects by
//! itself when its broker comes back: a publish made while the broker is away waits for it up to
//! `publish_timeout`, then fails as retryable.
//!
//! Several sinks and destinations at once: a [`Router`] sends each event to every [`Route`] whose
//! globs match its event type and aggregate type (`Invoice*`), each route with a destination
//! template of its own, over the route's sink's shared connection ([`RoutableSink`]).
//!
//! Each message carries the event's metadata under the names in [`headers`] (`postbox-event-id`,
//! `postbox-dedup-id`, `postbox-event-type`, …) and the event's own headers (`traceparent`, …),
//! plus the broker's own dedup field where it has one (`Nats-Msg-Id`, AMQP `message_id`,
//! `Idempotency-Key`). Destinations are [`Template`]s such as `billing.{aggregate_type}.{event_type}`.
//!
//! The workspace's `docs/sinks.md` says exactly what each acknowledgement guarantees, which
//! broker setting it relies on, and gives a minimal configuration per sink.
//!
//! ```no_run
//! # #[cfg(feature = "nats")]
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use postbox_sinks::{NatsConfig, NatsSink};
//!
//! let mut config = NatsConfig::new("billing.{aggregate_type}.{event_type}".parse()?);
//! config.url = "nats://127.0.0.1:4222".into();
//! let sink = NatsSink::connect(config).await?;
//! // hand `sink` to a `postbox::Relay`
//! # let _ = sink; Ok(()) }
//! ```

mod breaker;
mod brokers;
pub mod config;
mod error;
mod format;
mod open;
mod routing;
mod settings;
pub mod stdout;
mod template;

#[cfg(feature = "amqp")]
pub use brokers::amqp;
#[cfg(feature = "kafka")]
pub use brokers::kafka;
#[cfg(feature = "mqtt")]
pub use brokers::mqtt;
#[cfg(feature = "nats")]
pub use brokers::nats;
#[cfg(feature = "redis")]
pub use brokers::redis_streams;
#[cfg(feature = "webhook")]
pub use brokers::webhook;
pub use format::{cloudevents, headers};

pub use breaker::{Breaker, PROBE_BACKOFF};
pub use config::{ConfigError, Secret, SingleSink, SinkConfig, SinkKind, SinkSettings};
pub use error::{BoxError, Error, Result};
pub use open::{OwnDestination, Reconnecting, Shared};
/// Routes match with the same globs as the event filters of `postbox` (re-exported).
pub use postbox::{glob::Glob, glob::GlobError};
pub use routing::{
    Opened, RoutableSink, Route, RouteConfig, Router, Routes, RoutingConfig, SinkSetup, Unmatched,
};
pub use template::{RenderError, Template, TemplateError};

#[cfg(feature = "amqp")]
pub use amqp::{AmqpConfig, AmqpSink};
#[cfg(feature = "kafka")]
pub use kafka::{KafkaConfig, KafkaSink};
#[cfg(feature = "mqtt")]
pub use mqtt::{MqttConfig, MqttSink};
#[cfg(feature = "nats")]
pub use nats::{NatsConfig, NatsSink};
#[cfg(feature = "redis")]
pub use redis_streams::{RedisConfig, RedisSink};
#[cfg(feature = "webhook")]
pub use webhook::{WebhookConfig, WebhookSink};

/// The waits between a sink's reconnection attempts: from 100 ms, doubling up to `max` (the
/// sink's `reconnect_max_delay`).
#[allow(dead_code, reason = "used only by some sink features")]
pub(crate) fn reconnect_backoff(max: std::time::Duration) -> postbox::backoff::Backoff {
    postbox::backoff::Backoff::new(std::time::Duration::from_millis(100), max)
}

/// Defaults shared by every sink's configuration.
#[allow(dead_code, reason = "used only by some sink features")]
pub(crate) mod defaults {
    use std::time::Duration;

    /// How long one publish may take, reconnecting included: 5 s, well inside the relay's
    /// 30 s lease, so that a publish that cannot finish fails before the lease runs out.
    pub(crate) fn publish_timeout() -> Duration {
        Duration::from_secs(5)
    }

    /// How long the first connection may take when the sink is built: 5 s.
    pub(crate) fn connect_timeout() -> Duration {
        Duration::from_secs(5)
    }

    /// Longest wait between two reconnection attempts: 2 s.
    pub(crate) fn reconnect_max_delay() -> Duration {
        Duration::from_secs(2)
    }

    /// The client name brokers show for Postbox's connections.
    pub(crate) fn client_name() -> String {
        "postbox".to_owned()
    }
}

#[cfg(test)]
pub(crate) mod test_event {
    use postbox::OutboxEvent;

    /// An `InvoiceCreated` event, optionally with aggregate `Invoice`/`456` and a tenant.
    pub(crate) fn event(id: i64, aggregate: bool, tenant: Option<&str>) -> OutboxEvent {
        let mut e = postbox_testkit::event(id);
        if aggregate {
            e = e.aggregate("Invoice", "456");
        }
        if let Some(t) = tenant {
            e = e.tenant(t);
        }
        e.build()
    }
}

#[cfg(all(test, feature = "nats", feature = "webhook"))]
#[allow(clippy::unwrap_used, reason = "tests")]
mod config_tests {
    /// The configurations nest in an application's own, e.g. an enum tagged by `kind`, and
    /// still refuse unknown keys.
    #[test]
    fn configs_nest_in_a_tagged_enum_and_refuse_unknown_keys() {
        #[derive(serde::Deserialize)]
        #[serde(tag = "kind", rename_all = "snake_case")]
        #[allow(dead_code, reason = "only deserialized")]
        enum SinkConfig {
            Nats(crate::NatsConfig),
            Webhook(crate::WebhookConfig),
        }
        let parsed: SinkConfig = serde_json::from_value(serde_json::json!({
            "kind": "nats",
            "subject": "billing.{event_type}",
            "publish_timeout": "2s",
        }))
        .unwrap();
        let SinkConfig::Nats(nats) = parsed else {
            panic!("not nats")
        };
        assert_eq!(nats.publish_timeout, std::time::Duration::from_secs(2));
        assert_eq!(nats.url, "nats://127.0.0.1:4222");

        let err = serde_json::from_value::<SinkConfig>(serde_json::json!({
            "kind": "webhook",
            "url": "https://example.com/{event_type}",
            "secrett": "typo",
        }))
        .err()
        .unwrap();
        assert!(err.to_string().contains("secrett"), "{err}");
    }
}
