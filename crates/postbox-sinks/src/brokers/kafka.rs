//! Kafka sink: an idempotent producer with `acks=all`; the delivery report is the acknowledgement.

use std::collections::BTreeMap;
use std::sync::RwLock;
use std::time::Duration;

use async_trait::async_trait;
use postbox::{OutboxEvent, PublishError, Sink};
use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::util::Timeout;
use serde::Deserialize;

use std::sync::Arc;

use serde_json::{Map, Value};

use crate::cloudevents::{Binding, CloudEventsConfig, Encoder, Format};
use crate::error::ConfigError;
use crate::open::Shared;
use crate::routing::no_destination;
use crate::settings::SinkSettings;
use crate::{Error, Result, RoutableSink, Template, defaults};

/// librdkafka settings Postbox fixes, because the acknowledgement means nothing without them.
const FIXED: [(&str, &str); 2] = [("acks", "all"), ("enable.idempotence", "true")];

/// Configuration of a [`KafkaSink`].
///
/// ```
/// let config: postbox_sinks::KafkaConfig = serde_json::from_value(serde_json::json!({
///     "bootstrap_servers": "127.0.0.1:9092",
///     "topic": "billing.{aggregate_type}",
///     "properties": {"compression.type": "lz4"},
/// })).unwrap();
/// assert_eq!(config.properties["compression.type"], "lz4");
/// ```
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct KafkaConfig {
    /// `bootstrap.servers`, e.g. `kafka-1:9092,kafka-2:9092`.
    pub bootstrap_servers: String,
    /// The topic template, e.g. `billing.{aggregate_type}`. The topic must exist unless the
    /// cluster creates topics on first use. Required, unless the sink is used only through
    /// [`RoutableSink::publish_to`] with a destination (a [`crate::Router`] whose routes each give
    /// one).
    #[serde(default)]
    pub topic: Option<Template>,
    /// `client.id`. Default `postbox`.
    #[serde(default = "defaults::client_name")]
    pub client_id: String,
    /// Further librdkafka settings (`security.protocol`, `sasl.*`, `compression.type`,
    /// `linger.ms`, …). `acks` and `enable.idempotence` are fixed (`all`, `true`) and refused
    /// here; `message.timeout.ms` defaults to `publish_timeout`, `reconnect.backoff.ms` to 100
    /// and `reconnect.backoff.max.ms` to 2000. Default none.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// Bound on one publish: the producer's `message.timeout.ms` and the wait for the delivery
    /// report. Default 5 s.
    #[serde(default = "defaults::publish_timeout", with = "humantime_serde")]
    pub publish_timeout: Duration,
    /// Bound on the metadata request [`KafkaSink::connect`] makes to check the cluster is
    /// reachable. Default 5 s.
    #[serde(default = "defaults::connect_timeout", with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// How each event is written: `postbox` (default) or `cloudevents` (binary mode: `ce_*`
    /// headers and `content-type`; see [`crate::cloudevents`]).
    #[serde(default)]
    pub format: Format,
    /// The CloudEvents settings (`mode`, `source`, `dataschema`), with `format = "cloudevents"`.
    #[serde(default)]
    pub cloudevents: CloudEventsConfig,
}

impl KafkaConfig {
    /// A configuration with every default, these bootstrap servers and this topic template.
    pub fn new(bootstrap_servers: impl Into<String>, topic: Template) -> Self {
        KafkaConfig {
            bootstrap_servers: bootstrap_servers.into(),
            topic: Some(topic),
            client_id: defaults::client_name(),
            properties: BTreeMap::new(),
            publish_timeout: defaults::publish_timeout(),
            connect_timeout: defaults::connect_timeout(),
            format: Format::default(),
            cloudevents: CloudEventsConfig::default(),
        }
    }

    fn client_config(&self) -> Result<ClientConfig> {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &self.bootstrap_servers)
            .set("client.id", &self.client_id)
            .set(
                "message.timeout.ms",
                self.publish_timeout.as_millis().max(1).to_string(),
            )
            // librdkafka's default waits up to 10 s between reconnection attempts; a relay
            // wants the broker back within one publish timeout.
            .set("reconnect.backoff.ms", "100")
            .set("reconnect.backoff.max.ms", "2000");
        for (key, value) in &self.properties {
            if FIXED.iter().any(|(fixed, _)| fixed == key) {
                return Err(Error::config(
                    "properties",
                    format!(
                        "`{key}` is fixed by Postbox (acks=all, enable.idempotence=true): an \
                         event counts as published only when every in-sync replica has it"
                    ),
                ));
            }
            config.set(key, value);
        }
        for (key, value) in FIXED {
            config.set(key, value);
        }
        Ok(config)
    }
}

/// Publishes events to Kafka; an event counts as published when its delivery report arrives,
/// which with `acks=all` means every in-sync replica has it.
///
/// The producer is idempotent (`enable.idempotence=true`: no duplicates or reordering from its own
/// retries). Key: the aggregate id (so one aggregate's events share a partition), none when the
/// event has no aggregate. Headers: the [`crate::headers`] metadata, `postbox-dedup-id` among them,
/// and the event's own headers. The value is the event payload. With `format = "cloudevents"` the
/// record is a CloudEvent of the Kafka binding ([`crate::cloudevents`]). librdkafka reconnects by
/// itself; a producer that hits a fatal error is replaced by a new one.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use postbox_sinks::{KafkaConfig, KafkaSink};
///
/// let config = KafkaConfig::new("127.0.0.1:9092", "billing.{aggregate_type}".parse()?);
/// let sink = KafkaSink::connect(config).await?;
/// # let _ = sink; Ok(()) }
/// ```
pub struct KafkaSink {
    client_config: ClientConfig,
    producer: RwLock<FutureProducer>,
    topic: Option<Template>,
    publish_timeout: Duration,
    encoder: Encoder,
}

impl std::fmt::Debug for KafkaSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSink")
            .field("topic", &self.topic)
            .field("publish_timeout", &self.publish_timeout)
            .finish_non_exhaustive()
    }
}

impl KafkaSink {
    /// Creates the producer and checks that the cluster answers a metadata request within
    /// `connect_timeout`.
    pub async fn connect(config: KafkaConfig) -> Result<KafkaSink> {
        let client_config = config.client_config()?;
        let producer: FutureProducer = client_config
            .create()
            .map_err(|e| Error::config("properties", e.to_string()))?;
        let probe = producer.clone();
        let timeout = config.connect_timeout;
        tokio::task::spawn_blocking(move || probe.client().fetch_metadata(None, timeout))
            .await
            .map_err(|e| Error::connect("Kafka", &config.bootstrap_servers, e))?
            .map_err(|e| Error::connect("Kafka", &config.bootstrap_servers, e))?;
        Ok(KafkaSink {
            client_config,
            producer: RwLock::new(producer),
            encoder: Encoder::new(config.format, &config.cloudevents),
            topic: config.topic,
            publish_timeout: config.publish_timeout,
        })
    }

    fn producer(&self) -> FutureProducer {
        match self.producer.read() {
            Ok(p) => p.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Replaces a producer that hit a fatal error (it accepts nothing more).
    fn replace_if_fatal(&self, failed: &FutureProducer) {
        let Some((code, reason)) = failed.client().fatal_error() else {
            return;
        };
        let mut current = match self.producer.write() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        // Another publish may have replaced it already.
        if current.client().fatal_error().is_none() {
            return;
        }
        match self.client_config.create::<FutureProducer>() {
            Ok(fresh) => {
                tracing::error!(?code, %reason, "Kafka producer hit a fatal error; replaced it");
                *current = fresh;
            }
            Err(e) => {
                tracing::error!(error = %e, "Kafka producer hit a fatal error and cannot be replaced")
            }
        }
    }
}

#[async_trait]
impl Sink for KafkaSink {
    async fn publish(&self, event: &OutboxEvent) -> Result<(), PublishError> {
        self.publish_to(event, None).await
    }
}

#[async_trait]
impl RoutableSink for KafkaSink {
    /// Produces to the topic `destination` renders (the configured `topic` when `None`).
    async fn publish_to(
        &self,
        event: &OutboxEvent,
        destination: Option<&Template>,
    ) -> Result<(), PublishError> {
        let template = destination
            .or(self.topic.as_ref())
            .ok_or_else(|| no_destination("Kafka", "topic"))?;
        let topic = template.render(event)?;
        if topic.is_empty() {
            return Err(PublishError::permanent(format!(
                "Kafka: event {} renders an empty topic",
                event.id
            )));
        }
        let message = self.encoder.encode(event, Binding::Kafka)?;
        let mut message_headers = OwnedHeaders::new();
        for (key, value) in &message.headers {
            message_headers = message_headers.insert(Header {
                key,
                value: Some(value.as_str()),
            });
        }
        let mut record = FutureRecord::to(&topic)
            .payload(message.body.as_ref())
            .headers(message_headers);
        if let Some(key) = &event.aggregate_id {
            record = record.key(key.as_str());
        }
        let producer = self.producer();
        let send = producer.send(record, Timeout::After(self.publish_timeout));
        match tokio::time::timeout(self.publish_timeout + Duration::from_millis(500), send).await {
            Ok(Ok(_delivery)) => Ok(()),
            Ok(Err((err, _message))) => {
                self.replace_if_fatal(&producer);
                Err(classify(&topic, &err))
            }
            Err(_) => Err(PublishError::unavailable(format!(
                "Kafka: no delivery report for topic {topic:?} within {:?}",
                self.publish_timeout
            ))),
        }
    }
}

fn classify(topic: &str, err: &KafkaError) -> PublishError {
    use RDKafkaErrorCode as C;
    match err.rdkafka_error_code() {
        Some(
            C::MessageSizeTooLarge
            | C::InvalidMessageSize
            | C::InvalidMessage
            | C::InvalidRecord
            | C::InvalidTopic
            | C::BadMessage,
        ) => PublishError::permanent(format!("Kafka: topic {topic:?}: {err}")),
        Some(C::MessageTimedOut) => PublishError::unavailable(format!(
            "Kafka: topic {topic:?}: not delivered within message.timeout.ms (brokers away or \
             no leader): {err}"
        )),
        Some(
            C::BrokerTransportFailure
            | C::AllBrokersDown
            | C::BrokerNotAvailable
            | C::LeaderNotAvailable
            | C::NotLeaderForPartition
            | C::RequestTimedOut
            | C::NetworkException,
        ) => PublishError::unavailable(format!("Kafka: topic {topic:?}: {err}")),
        _ => PublishError::retryable(format!("Kafka: topic {topic:?}: {err}")),
    }
}

impl std::fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaConfig")
            .field("bootstrap_servers", &self.bootstrap_servers)
            .field("topic", &self.topic)
            .field("client_id", &self.client_id)
            .field("properties", &crate::settings::debug_map(&self.properties))
            .field("publish_timeout", &self.publish_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("format", &self.format)
            .field("cloudevents", &self.cloudevents)
            .finish()
    }
}

/// Kafka's bootstrap servers when no URL is given.
pub const DEFAULT_SERVERS: &str = "127.0.0.1:9092";

#[async_trait]
impl SinkSettings for KafkaConfig {
    const DESTINATION_KEY: Option<&'static str> = Some("topic");

    /// `url` (`kafka://host:port,host:port` or `host:port,…`) is `bootstrap_servers`; without
    /// either, the broker on 127.0.0.1.
    fn read_url(table: &mut Map<String, Value>) -> std::result::Result<(), ConfigError> {
        match (table.remove("url"), table.contains_key("bootstrap_servers")) {
            (Some(_), true) => Err(ConfigError::new(
                "url",
                "give `url` or `bootstrap_servers`, not both",
            )),
            (Some(url), false) => {
                let url = url
                    .as_str()
                    .ok_or_else(|| ConfigError::new("url", "must be a string"))?;
                table.insert("bootstrap_servers".into(), kafka_servers(url)?.into());
                Ok(())
            }
            (None, true) => Ok(()),
            (None, false) => {
                table.insert("bootstrap_servers".into(), DEFAULT_SERVERS.into());
                Ok(())
            }
        }
    }

    fn address(&self) -> String {
        self.bootstrap_servers.clone()
    }

    fn destination(&self) -> Option<&Template> {
        self.topic.as_ref()
    }

    fn publish_timeout(&self) -> Option<Duration> {
        Some(self.publish_timeout)
    }

    fn set_publish_timeout(&mut self, timeout: Duration) {
        self.publish_timeout = timeout;
    }

    fn reconnect_max_delay(&self) -> Option<Duration> {
        Some(crate::defaults::reconnect_max_delay())
    }

    async fn connect(&self, shared: &Shared) -> Result<Arc<dyn RoutableSink>> {
        let mut config = self.clone();
        config.cloudevents.set_origin(shared.origin());
        Ok(Arc::new(KafkaSink::connect(config).await?))
    }
}

/// Kafka bootstrap servers from `kafka://host:port,host:port` or a plain `host:port` list (the
/// `url` of a Kafka sink's table); a mistake is one in `url`.
pub fn kafka_servers(url: &str) -> Result<String, ConfigError> {
    let mut servers = Vec::new();
    for entry in url.split(',') {
        let entry = entry.trim();
        let entry = entry.strip_prefix("kafka://").unwrap_or(entry);
        let entry = entry.strip_suffix('/').unwrap_or(entry);
        if entry.contains("://") {
            return Err(ConfigError::new(
                "url",
                format!(
                    "{url:?}: Kafka bootstrap servers are written kafka://host:port,host:port \
                     or host:port,host:port (TLS and SASL go in the [sinks.NAME] table's \
                     properties)"
                ),
            ));
        }
        if entry.is_empty() || entry.contains(['/', '@', ' ']) {
            return Err(ConfigError::new(
                "url",
                format!(
                    "{url:?} is not a list of Kafka servers; write kafka://host:port,host:port"
                ),
            ));
        }
        servers.push(entry);
    }
    Ok(servers.join(","))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn acks_and_idempotence_cannot_be_overridden() {
        let mut config = KafkaConfig::new("127.0.0.1:9092", Template::parse("t").unwrap());
        config.properties.insert("acks".into(), "1".into());
        let err = config.client_config().err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("acks")));
        config.properties.clear();
        config
            .properties
            .insert("compression.type".into(), "lz4".into());
        let built = config.client_config().unwrap();
        assert_eq!(built.get("acks"), Some("all"));
        assert_eq!(built.get("enable.idempotence"), Some("true"));
        assert_eq!(built.get("message.timeout.ms"), Some("5000"));
        assert_eq!(built.get("compression.type"), Some("lz4"));
    }

    #[test]
    fn size_errors_are_permanent_timeouts_retryable() {
        let e = KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge);
        assert!(classify("t", &e).is_permanent());
        let e = KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut);
        assert!(!classify("t", &e).is_permanent());
    }
}
