//! Redis Streams sink: `XADD` per event; the entry id in the reply is the acknowledgement.

use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{Client, RedisError};
use async_trait::async_trait;
use postbox::{OutboxEvent, PublishError, Sink};
use serde::Deserialize;
use tokio::time::Instant;

use std::sync::Arc;

use crate::cloudevents::{Binding, CloudEventsConfig, Encoder, Format};
use crate::open::Shared;
use crate::routing::no_destination;
use crate::settings::SinkSettings;
use crate::{Error, Result, RoutableSink, Template, defaults};

/// The stream field that holds the event payload (JSON).
pub const PAYLOAD_FIELD: &str = "payload";

/// Configuration of a [`RedisSink`].
///
/// ```
/// let config: postbox_sinks::RedisConfig = serde_json::from_value(serde_json::json!({
///     "url": "redis://127.0.0.1:6379",
///     "stream": "billing:{aggregate_type}",
///     "maxlen": 100000,
/// })).unwrap();
/// assert_eq!(config.maxlen, Some(100_000));
/// ```
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct RedisConfig {
    /// The server, e.g. `redis://:password@host:6379/0` (`rediss://` is not built in). Default
    /// `redis://127.0.0.1:6379`.
    #[serde(default = "default_url")]
    pub url: String,
    /// The stream key template, e.g. `billing:{aggregate_type}`. Required, unless the sink is used
    /// only through [`RoutableSink::publish_to`] with a destination (a [`crate::Router`] whose
    /// routes each give one).
    #[serde(default)]
    pub stream: Option<Template>,
    /// Trim each stream to about this many entries (`XADD key MAXLEN ~ N`; Redis trims whole
    /// macro nodes, so a stream may hold somewhat more). Trimmed entries are gone: keep `N` well
    /// above what consumers may lag behind. Default none: never trimmed.
    #[serde(default)]
    pub maxlen: Option<u64>,
    /// Bound on one publish, reconnecting included. Default 5 s.
    #[serde(default = "defaults::publish_timeout", with = "humantime_serde")]
    pub publish_timeout: Duration,
    /// Bound on the first connection in [`RedisSink::connect`], and on each reconnection
    /// attempt. Default 5 s.
    #[serde(default = "defaults::connect_timeout", with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Longest wait between reconnection attempts. Default 2 s.
    #[serde(default = "defaults::reconnect_max_delay", with = "humantime_serde")]
    pub reconnect_max_delay: Duration,
    /// How each event is written: `postbox` (default) or `cloudevents` (binary mode: `ce_*` fields
    /// and `content-type`, as Kafka headers; see [`crate::cloudevents`]).
    #[serde(default)]
    pub format: Format,
    /// The CloudEvents settings (`mode`, `source`, `dataschema`), with `format = "cloudevents"`.
    #[serde(default)]
    pub cloudevents: CloudEventsConfig,
}

fn default_url() -> String {
    "redis://127.0.0.1:6379".to_owned()
}

impl RedisConfig {
    /// A configuration with every default and this stream key template.
    pub fn new(stream: Template) -> Self {
        RedisConfig {
            url: default_url(),
            stream: Some(stream),
            maxlen: None,
            publish_timeout: defaults::publish_timeout(),
            connect_timeout: defaults::connect_timeout(),
            reconnect_max_delay: defaults::reconnect_max_delay(),
            format: Format::default(),
            cloudevents: CloudEventsConfig::default(),
        }
    }
}

/// Appends events to Redis streams; an event counts as published when `XADD` answers with the
/// new entry's id.
///
/// Each entry has the field `payload` (the event payload, JSON), the [`crate::headers`] metadata as
/// fields (`postbox-event-id`, `postbox-dedup-id`, …) and the event's own headers as fields (one
/// named `payload` is left out). With `format = "cloudevents"`, the entry is a CloudEvent with
/// `ce_*` fields (binary mode; `payload` the data) or the whole event in `payload` (structured
/// mode), and `content-type` ([`crate::cloudevents`]). How long an acknowledged entry survives
/// depends on the server's persistence (`appendonly yes` with `appendfsync always` or `everysec`)
/// and on replication; see `docs/sinks.md`.
///
/// The connection is re-established by itself; a publish made while the server is away retries
/// until `publish_timeout`. A retry after a connection dropped mid-command can append the entry
/// twice (same `postbox-dedup-id`).
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use postbox_sinks::{RedisConfig, RedisSink};
///
/// let sink = RedisSink::connect(RedisConfig::new("billing:{aggregate_type}".parse()?)).await?;
/// # let _ = sink; Ok(()) }
/// ```
pub struct RedisSink {
    connection: ConnectionManager,
    config: RedisConfig,
    encoder: Encoder,
}

impl std::fmt::Debug for RedisSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSink")
            .field("url", &postbox::redact::redact(&self.config.url))
            .field("stream", &self.config.stream)
            .finish_non_exhaustive()
    }
}

impl RedisSink {
    /// Connects to `config.url`; fails if the first connection does not succeed within
    /// `connect_timeout`.
    pub async fn connect(config: RedisConfig) -> Result<RedisSink> {
        let address = postbox::redact::redact(&config.url);
        let client = Client::open(config.url.as_str())
            .map_err(|e| Error::config("url", format!("{address:?}: {e}")))?;
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connect_timeout))
            .set_response_timeout(Some(config.publish_timeout))
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(config.reconnect_max_delay)
            .set_number_of_retries(3);
        let connection = tokio::time::timeout(
            config.connect_timeout,
            ConnectionManager::new_with_config(client, manager_config),
        )
        .await
        .map_err(|_| {
            Error::connect(
                "Redis",
                &address,
                format!("no connection within {:?}", config.connect_timeout),
            )
        })?
        .map_err(|e| Error::connect("Redis", &address, e))?;
        Ok(RedisSink {
            connection,
            encoder: Encoder::new(config.format, &config.cloudevents),
            config,
        })
    }

    fn command(&self, key: &str, event: &OutboxEvent) -> Result<::redis::Cmd, PublishError> {
        let message = self.encoder.encode(event, Binding::Redis)?;
        let mut cmd = ::redis::cmd("XADD");
        cmd.arg(key);
        if let Some(n) = self.config.maxlen {
            cmd.arg("MAXLEN").arg("~").arg(n);
        }
        cmd.arg("*");
        for (name, value) in &message.headers {
            if name != PAYLOAD_FIELD {
                cmd.arg(name).arg(value);
            }
        }
        cmd.arg(PAYLOAD_FIELD).arg(message.body.as_ref());
        Ok(cmd)
    }

    async fn add(
        &self,
        cmd: &::redis::Cmd,
        key: &str,
        deadline: Instant,
    ) -> Result<(), PublishError> {
        let mut backoff = crate::reconnect_backoff(self.config.reconnect_max_delay).attempts();
        loop {
            let mut connection = self.connection.clone();
            let error = match cmd.query_async::<Option<String>>(&mut connection).await {
                Ok(Some(_entry_id)) => return Ok(()),
                Ok(None) => {
                    return Err(PublishError::retryable(format!(
                        "Redis: XADD to {key:?} answered nil instead of an entry id"
                    )));
                }
                Err(e) => e,
            };
            let delay = backoff.next_delay();
            if !reconnectable(&error) {
                return Err(classify(key, &error));
            }
            if Instant::now() + delay >= deadline {
                return Err(PublishError::unavailable(format!(
                    "Redis: XADD to {key:?}: {error}"
                )));
            }
            tracing::debug!(%error, ?delay, "Redis sink retries after a connection error");
            tokio::time::sleep(delay).await;
        }
    }
}

#[async_trait]
impl Sink for RedisSink {
    async fn publish(&self, event: &OutboxEvent) -> Result<(), PublishError> {
        self.publish_to(event, None).await
    }
}

#[async_trait]
impl RoutableSink for RedisSink {
    /// Appends to the stream whose key `destination` renders (the configured `stream` when
    /// `None`).
    async fn publish_to(
        &self,
        event: &OutboxEvent,
        destination: Option<&Template>,
    ) -> Result<(), PublishError> {
        let template = destination
            .or(self.config.stream.as_ref())
            .ok_or_else(|| no_destination("Redis", "stream"))?;
        let key = template.render(event)?;
        let cmd = self.command(&key, event)?;
        let deadline = Instant::now() + self.config.publish_timeout;
        match tokio::time::timeout_at(deadline, self.add(&cmd, &key, deadline)).await {
            Ok(result) => result,
            Err(_) => Err(PublishError::unavailable(format!(
                "Redis: no XADD reply for {key:?} within {:?} (server away or slow)",
                self.config.publish_timeout
            ))),
        }
    }
}

/// Errors after which a new connection may succeed: the server was away, not a reply.
fn reconnectable(e: &RedisError) -> bool {
    (e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal()) && !e.is_timeout()
}

fn classify(key: &str, e: &RedisError) -> PublishError {
    match e.code() {
        Some("WRONGTYPE") => PublishError::permanent(format!(
            "Redis: key {key:?} holds something other than a stream ({e}); rename the stream or \
             remove that key"
        )),
        _ => PublishError::retryable(format!("Redis: XADD to {key:?}: {e}")),
    }
}

impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &postbox::redact::redact(&self.url))
            .field("stream", &self.stream)
            .field("maxlen", &self.maxlen)
            .field("publish_timeout", &self.publish_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("reconnect_max_delay", &self.reconnect_max_delay)
            .field("format", &self.format)
            .field("cloudevents", &self.cloudevents)
            .finish()
    }
}

#[async_trait]
impl SinkSettings for RedisConfig {
    const DESTINATION_KEY: Option<&'static str> = Some("stream");
    const DESTINATION_NAME: &'static str = "stream key";
    const EXAMPLE_DESTINATION: &'static str = "billing:{aggregate_type}";

    fn address(&self) -> String {
        self.url.clone()
    }

    fn destination(&self) -> Option<&Template> {
        self.stream.as_ref()
    }

    fn publish_timeout(&self) -> Option<Duration> {
        Some(self.publish_timeout)
    }

    fn set_publish_timeout(&mut self, timeout: Duration) {
        self.publish_timeout = timeout;
    }

    fn reconnect_max_delay(&self) -> Option<Duration> {
        Some(self.reconnect_max_delay)
    }

    async fn connect(&self, shared: &Shared) -> Result<Arc<dyn RoutableSink>> {
        let mut config = self.clone();
        config.cloudevents.set_origin(shared.origin());
        Ok(Arc::new(RedisSink::connect(config).await?))
    }
}
