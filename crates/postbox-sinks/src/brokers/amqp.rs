//! RabbitMQ (AMQP 0-9-1) sink: persistent, mandatory publishes on a channel in confirm mode.

use std::time::Duration;

use async_trait::async_trait;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};
use postbox::{OutboxEvent, PublishError, Sink};
use serde::Deserialize;
use tokio::sync::Mutex;
use tokio::time::Instant;

use std::sync::Arc;

use crate::cloudevents::{Binding, CloudEventsConfig, Encoder, Format, Message};
use crate::open::Shared;
use crate::routing::no_destination;
use crate::settings::SinkSettings;
use crate::{Error, Result, RoutableSink, Template, defaults};

/// Configuration of an [`AmqpSink`].
///
/// ```
/// let config: postbox_sinks::AmqpConfig = serde_json::from_value(serde_json::json!({
///     "url": "amqp://guest:guest@127.0.0.1:5672/%2f",
///     "exchange": "billing",
///     "routing_key": "{aggregate_type}.{event_type}",
/// })).unwrap();
/// assert!(config.mandatory);
/// ```
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct AmqpConfig {
    /// The broker URI, credentials and vhost included, e.g.
    /// `amqp://user:password@host:5672/%2f`. Default `amqp://127.0.0.1:5672/%2f` (user and
    /// password `guest`).
    #[serde(default = "default_url")]
    pub url: String,
    /// The exchange to publish to. Default `""`, the default exchange, which routes to the queue
    /// named by the routing key. The exchange must exist; Postbox declares nothing.
    #[serde(default)]
    pub exchange: String,
    /// The routing key template, e.g. `{aggregate_type}.{event_type}`. Required, unless the sink
    /// is used only through [`RoutableSink::publish_to`] with a destination (a [`crate::Router`]
    /// whose routes each give one).
    #[serde(default)]
    pub routing_key: Option<Template>,
    /// Publish with the `mandatory` flag, so that a message no queue receives is returned and the
    /// publish fails (retryable) instead of being dropped by the broker. Default `true`; turn it
    /// off only for fan-out where nobody listening is fine.
    #[serde(default = "default_true")]
    pub mandatory: bool,
    /// The connection name the broker shows. Default `postbox`.
    #[serde(default = "defaults::client_name")]
    pub connection_name: String,
    /// Bound on one publish, reconnecting included. Default 5 s.
    #[serde(default = "defaults::publish_timeout", with = "humantime_serde")]
    pub publish_timeout: Duration,
    /// Bound on the first connection in [`AmqpSink::connect`]. Default 5 s.
    #[serde(default = "defaults::connect_timeout", with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Longest wait between reconnection attempts (they start at 50 ms and double). Default 2 s.
    #[serde(default = "defaults::reconnect_max_delay", with = "humantime_serde")]
    pub reconnect_max_delay: Duration,
    /// How each event is written: `postbox` (default) or `cloudevents` (binary mode:
    /// `cloudEvents:*` headers, the content type in `content_type`; see [`crate::cloudevents`]).
    #[serde(default)]
    pub format: Format,
    /// The CloudEvents settings (`mode`, `source`, `dataschema`), with `format = "cloudevents"`.
    #[serde(default)]
    pub cloudevents: CloudEventsConfig,
}

fn default_url() -> String {
    "amqp://127.0.0.1:5672/%2f".to_owned()
}

fn default_true() -> bool {
    true
}

impl AmqpConfig {
    /// A configuration with every default (the default exchange) and this routing key template.
    pub fn new(routing_key: Template) -> Self {
        AmqpConfig {
            url: default_url(),
            exchange: String::new(),
            routing_key: Some(routing_key),
            mandatory: true,
            connection_name: defaults::client_name(),
            publish_timeout: defaults::publish_timeout(),
            connect_timeout: defaults::connect_timeout(),
            reconnect_max_delay: defaults::reconnect_max_delay(),
            format: Format::default(),
            cloudevents: CloudEventsConfig::default(),
        }
    }
}

/// Publishes events to RabbitMQ; an event counts as published when the broker confirms it
/// (`basic.ack` in confirm mode) and did not return it as unroutable.
///
/// Messages are persistent (`delivery_mode` 2), so a durable queue keeps them across a broker
/// restart once confirmed. Properties: `message_id` = dedup id, `type` = event type,
/// `content_type` = `application/json`, `timestamp` = enqueue time, `app_id` = `postbox`;
/// headers: the [`crate::headers`] metadata and the event's own headers. The body is the event
/// payload. With `format = "cloudevents"`, a CloudEvent of the AMQP binding
/// ([`crate::cloudevents`]; `content_type` is `application/cloudevents+json` in structured mode).
///
/// One connection and one confirm-mode channel are shared by all publishes; when either breaks,
/// the next publish opens new ones, waiting for the broker up to `publish_timeout`. A publish
/// whose channel breaks before its confirm is sent again on the new one (the broker may then
/// hold two copies with the same `message_id`).
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use postbox_sinks::{AmqpConfig, AmqpSink};
///
/// let mut config = AmqpConfig::new("{aggregate_type}.{event_type}".parse()?);
/// config.exchange = "billing".into();
/// let sink = AmqpSink::connect(config).await?;
/// # let _ = sink; Ok(()) }
/// ```
pub struct AmqpSink {
    config: AmqpConfig,
    encoder: Encoder,
    exchange: ShortString,
    link: Mutex<Option<Link>>,
}

impl std::fmt::Debug for AmqpSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpSink")
            .field("url", &postbox::redact::redact(&self.config.url))
            .field("exchange", &self.config.exchange)
            .field("routing_key", &self.config.routing_key)
            .finish_non_exhaustive()
    }
}

/// An open connection and its confirm-mode channel.
struct Link {
    connection: Connection,
    channel: Channel,
}

impl AmqpSink {
    /// Connects to `config.url` and opens a channel in confirm mode; fails if that does not
    /// succeed within `connect_timeout`.
    pub async fn connect(config: AmqpConfig) -> Result<AmqpSink> {
        let exchange = ShortString::try_new(config.exchange.clone())
            .map_err(|e| Error::config("exchange", e.to_string()))?;
        let address = postbox::redact::redact(&config.url);
        let link = tokio::time::timeout(config.connect_timeout, open(&config))
            .await
            .map_err(|_| {
                Error::connect(
                    "RabbitMQ",
                    &address,
                    format!("no connection within {:?}", config.connect_timeout),
                )
            })?
            .map_err(|e| Error::connect("RabbitMQ", &address, e))?;
        Ok(AmqpSink {
            encoder: Encoder::new(config.format, &config.cloudevents),
            exchange,
            config,
            link: Mutex::new(Some(link)),
        })
    }

    /// The current channel, reopening the channel or the connection when broken; retries until
    /// `deadline`.
    async fn channel(&self, deadline: Instant) -> Result<Channel, PublishError> {
        let mut backoff = crate::reconnect_backoff(self.config.reconnect_max_delay).attempts();
        let mut link = self.link.lock().await;
        loop {
            let error = match link.as_ref() {
                Some(l) if l.channel.status().connected() => return Ok(l.channel.clone()),
                Some(l) if l.connection.status().connected() => {
                    match confirm_channel(&l.connection).await {
                        Ok(channel) => {
                            tracing::info!("RabbitMQ sink reopened its channel");
                            if let Some(l) = link.as_mut() {
                                l.channel = channel.clone();
                            }
                            return Ok(channel);
                        }
                        Err(e) => e,
                    }
                }
                _ => {
                    if let Some(old) = link.take() {
                        tokio::spawn(async move {
                            let _ = old.connection.close(200, "reconnecting".into()).await;
                        });
                    }
                    let remaining = deadline.saturating_duration_since(Instant::now());
                    match tokio::time::timeout(remaining, open(&self.config)).await {
                        Ok(Ok(new)) => {
                            tracing::info!("RabbitMQ sink reconnected");
                            let channel = new.channel.clone();
                            *link = Some(new);
                            return Ok(channel);
                        }
                        Ok(Err(e)) => e,
                        Err(_) => break,
                    }
                }
            };
            let delay = backoff.next_delay();
            if Instant::now() + delay >= deadline {
                return Err(PublishError::unavailable(format!(
                    "RabbitMQ: not connected, and reconnecting failed within {:?}: {error}",
                    self.config.publish_timeout
                )));
            }
            tracing::debug!(%error, ?delay, "RabbitMQ sink cannot connect yet");
            tokio::time::sleep(delay).await;
        }
        Err(PublishError::unavailable(format!(
            "RabbitMQ: not connected, and reconnecting took longer than {:?}",
            self.config.publish_timeout
        )))
    }

    /// The message's properties: its `headers` (taken, not copied) and content type, and the
    /// event's.
    fn properties(
        &self,
        event: &OutboxEvent,
        headers: Vec<(String, String)>,
        content_type: &str,
    ) -> Result<BasicProperties, PublishError> {
        let mut table = FieldTable::default();
        for (name, value) in headers {
            let key = ShortString::try_new(name).map_err(|e| {
                PublishError::permanent(format!("RabbitMQ: an event header name is too long: {e}"))
            })?;
            table.insert(key, AMQPValue::LongString(LongString::from(value)));
        }
        let message_id = ShortString::try_new(event.dedup_id()).map_err(|e| {
            PublishError::permanent(format!(
                "RabbitMQ: the dedup id of event {} does not fit `message_id` ({e}); use a \
                 shorter idempotency key",
                event.id
            ))
        })?;
        let mut props = BasicProperties::default()
            .with_delivery_mode(2)
            .with_content_type(content_type.into())
            .with_message_id(message_id)
            .with_app_id("postbox".into())
            .with_timestamp(u64::try_from(event.created_at.timestamp()).unwrap_or(0))
            .with_headers(table);
        if let Ok(kind) = ShortString::try_new(event.event_type.clone()) {
            props = props.with_type(kind);
        }
        Ok(props)
    }

    async fn publish_once(
        &self,
        event: &OutboxEvent,
        routing_key: &ShortString,
        deadline: Instant,
    ) -> Result<(), PublishError> {
        let Message {
            headers,
            content_type,
            body,
        } = self.encoder.encode(event, Binding::Amqp)?;
        let properties = self.properties(event, headers, content_type)?;
        let options = BasicPublishOptions {
            mandatory: self.config.mandatory,
            immediate: false,
        };
        let mut backoff = crate::reconnect_backoff(self.config.reconnect_max_delay).attempts();
        loop {
            let channel = self.channel(deadline).await?;
            let sent = channel
                .basic_publish(
                    self.exchange.clone(),
                    routing_key.clone(),
                    options,
                    &body,
                    properties.clone(),
                )
                .await;
            // Not sent, or sent but the channel or connection broke before the confirm (the
            // broker may have it: at-least-once). Reopen and send again while time is left.
            let error = match sent {
                Err(e) => e,
                Ok(confirm) => match confirm.await {
                    Ok(confirmation) => return self.confirmed(confirmation, routing_key),
                    Err(e) => e,
                },
            };
            let delay = backoff.next_delay();
            // The broker closed the channel over this message (e.g. `NOT_FOUND`: no such
            // exchange): sending it again now would fail the same way.
            let refused = matches!(error.kind(), lapin::ErrorKind::ProtocolError(_));
            if refused || Instant::now() + delay >= deadline {
                let message = format!(
                    "RabbitMQ: no confirm for the message with routing key \"{routing_key}\" on \
                     exchange {:?}: {error}",
                    self.config.exchange
                );
                // A refusal is about this message; anything else, the broker being away.
                return Err(if refused {
                    PublishError::retryable(message)
                } else {
                    PublishError::unavailable(message)
                });
            }
            tracing::debug!(%error, "RabbitMQ publish unconfirmed; reopening and sending again");
            tokio::time::sleep(delay).await;
        }
    }

    fn confirmed(
        &self,
        confirmation: Confirmation,
        routing_key: &ShortString,
    ) -> Result<(), PublishError> {
        match confirmation {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned)) => {
                Err(PublishError::retryable(format!(
                    "RabbitMQ: exchange {:?} returned the message with routing key \"{routing_key}\" \
                     ({} {}): no queue is bound to receive it; bind one",
                    self.config.exchange, returned.reply_code, returned.reply_text
                )))
            }
            Confirmation::Nack(None) => Err(PublishError::retryable(
                "RabbitMQ: the broker refused the message (basic.nack)",
            )),
            Confirmation::NotRequested => Err(PublishError::retryable(
                "RabbitMQ: the channel is not in confirm mode, so delivery is unknown",
            )),
        }
    }
}

#[async_trait]
impl Sink for AmqpSink {
    async fn publish(&self, event: &OutboxEvent) -> Result<(), PublishError> {
        self.publish_to(event, None).await
    }
}

#[async_trait]
impl RoutableSink for AmqpSink {
    /// Publishes to the configured exchange with the routing key `destination` renders (the
    /// configured `routing_key` when `None`).
    async fn publish_to(
        &self,
        event: &OutboxEvent,
        destination: Option<&Template>,
    ) -> Result<(), PublishError> {
        let template = destination
            .or(self.config.routing_key.as_ref())
            .ok_or_else(|| no_destination("RabbitMQ", "routing_key"))?;
        let routing_key = template.render(event)?;
        let routing_key = ShortString::try_new(routing_key).map_err(|e| {
            PublishError::permanent(format!(
                "RabbitMQ: the routing key of event {}: {e}",
                event.id
            ))
        })?;
        let deadline = Instant::now() + self.config.publish_timeout;
        match tokio::time::timeout_at(deadline, self.publish_once(event, &routing_key, deadline))
            .await
        {
            Ok(result) => result,
            Err(_) => Err(PublishError::unavailable(format!(
                "RabbitMQ: no publisher confirm within {:?} (broker away, blocked or slow)",
                self.config.publish_timeout
            ))),
        }
    }
}

async fn open(config: &AmqpConfig) -> Result<Link, lapin::Error> {
    let properties = ConnectionProperties::default()
        .with_connection_name(LongString::from(config.connection_name.clone()));
    let connection = Connection::connect(&config.url, properties).await?;
    let channel = confirm_channel(&connection).await?;
    Ok(Link {
        connection,
        channel,
    })
}

async fn confirm_channel(connection: &Connection) -> Result<Channel, lapin::Error> {
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    Ok(channel)
}

impl std::fmt::Debug for AmqpConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpConfig")
            .field("url", &postbox::redact::redact(&self.url))
            .field("exchange", &self.exchange)
            .field("routing_key", &self.routing_key)
            .field("mandatory", &self.mandatory)
            .field("connection_name", &self.connection_name)
            .field("publish_timeout", &self.publish_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("reconnect_max_delay", &self.reconnect_max_delay)
            .field("format", &self.format)
            .field("cloudevents", &self.cloudevents)
            .finish()
    }
}

#[async_trait]
impl SinkSettings for AmqpConfig {
    const DESTINATION_KEY: Option<&'static str> = Some("routing_key");
    const DESTINATION_NAME: &'static str = "routing key";
    const EXAMPLE_DESTINATION: &'static str = "{aggregate_type}.{event_type}";

    fn address(&self) -> String {
        self.url.clone()
    }

    fn destination(&self) -> Option<&Template> {
        self.routing_key.as_ref()
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
        Ok(Arc::new(AmqpSink::connect(config).await?))
    }
}
