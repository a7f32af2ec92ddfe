//! MQTT 5 sink: QoS 1 publishes, each acknowledged by its own `PUBACK`.
//!
//! rumqttc has no per-publish acknowledgement future, so this module correlates packet ids
//! itself. One task drives the client's event loop; another, the dispatcher, hands publish
//! requests to the event loop one at a time and queues a waiter for each, in the same order. The
//! event loop reports `Outgoing::Publish(pkid)` for requests in the order it took them, so each
//! report pops the oldest waiter and files it under its packet id; `PUBACK(pkid)` completes it.
//! When the connection drops, every waiter fails as retryable and the next connection starts
//! with a fresh event loop (clean start), so nothing is re-sent behind the correlation's back.

mod config;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use postbox::{OutboxEvent, PublishError, Sink};
use rumqttc::Outgoing;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, PubAckReason, PublishProperties};
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::cloudevents::{Binding, Encoder};
use crate::routing::no_destination;
use crate::{Error, Result, RoutableSink, Template};

pub use config::MqttConfig;

/// Publishes events to an MQTT 5 broker at QoS 1; an event counts as published when the
/// broker's `PUBACK` for that very message arrives with a success reason.
///
/// The payload is the event payload (JSON, with content type `application/json` and payload format
/// indicator UTF-8); the [`crate::headers`] metadata and the event's own headers go as MQTT 5 user
/// properties. With `format = "cloudevents"`, a CloudEvent of the MQTT 5 binding
/// ([`crate::cloudevents`]). A `PUBACK` means the broker took responsibility for the message: it
/// reaches the subscribers that are connected or have persistent sessions, not ones that subscribe
/// later (unless `retain` is set, which keeps only the last message per topic).
///
/// The sink reconnects by itself; a publish made while the broker is away waits for it up to
/// `publish_timeout`. A publish awaiting its `PUBACK` when the connection drops is sent again on
/// the next connection within `publish_timeout` (the broker may then have it twice, with the same
/// `postbox-dedup-id`).
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use postbox_sinks::{MqttConfig, MqttSink};
///
/// let sink = MqttSink::connect(MqttConfig::new("billing/{event_type}".parse()?)).await?;
/// # let _ = sink; Ok(()) }
/// ```
pub struct MqttSink {
    shared: Arc<Shared>,
    requests: mpsc::UnboundedSender<Request>,
    topic: Option<Template>,
    retain: bool,
    publish_timeout: Duration,
    encoder: Encoder,
    tasks: [JoinHandle<()>; 2],
}

impl std::fmt::Debug for MqttSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MqttSink")
            .field("topic", &self.topic)
            .field("connected", &*self.shared.connected.borrow())
            .finish_non_exhaustive()
    }
}

impl Drop for MqttSink {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// State shared by the publishers, the dispatcher and the event-loop task.
struct Shared {
    state: Mutex<Connection>,
    /// Whether a connection is up; changed only while `state` is locked, together with it.
    connected: watch::Sender<bool>,
}

/// The current connection, as far as publishing is concerned.
struct Connection {
    /// Handle to the current event loop; `None` while disconnected.
    client: Option<AsyncClient>,
    /// Waiters of requests handed to the event loop that it has not yet reported as sent, in
    /// the order they were handed over.
    awaiting_pkid: VecDeque<Waiter>,
    /// The broker's maximum packet size, from its CONNACK.
    max_packet_size: Option<u32>,
    next_waiter: u64,
}

struct Waiter {
    id: u64,
    reply: oneshot::Sender<Reply>,
}

/// What became of one publish request.
type Reply = Result<(), Failure>;

enum Failure {
    /// Never handed to the broker (no connection at that moment): safe to try again at once.
    NotSent,
    /// The connection dropped before the `PUBACK`: the broker may or may not have the message.
    Lost,
    /// The broker refused the message, or it cannot be sent.
    Failed(PublishError),
}

struct Request {
    topic: String,
    payload: Bytes,
    properties: PublishProperties,
    retain: bool,
    reply: oneshot::Sender<Reply>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Connection> {
        match self.state.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}

impl MqttSink {
    /// Starts the client and waits for the first CONNACK; fails if the broker cannot be reached
    /// or refuses the connection within `connect_timeout`.
    pub async fn connect(config: MqttConfig) -> Result<MqttSink> {
        let options = config.options()?;
        let address = format!("mqtt://{}:{}", config.host, config.port);
        let (connected, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            state: Mutex::new(Connection {
                client: None,
                awaiting_pkid: VecDeque::new(),
                max_packet_size: None,
                next_waiter: 0,
            }),
            connected,
        });
        let (first_tx, first_rx) = oneshot::channel();
        let backoff = crate::reconnect_backoff(config.reconnect_max_delay).attempts();
        let driver = tokio::spawn(drive(shared.clone(), options, backoff, first_tx));
        let (requests, requests_rx) = mpsc::unbounded_channel();
        let dispatcher = tokio::spawn(dispatch(shared.clone(), requests_rx));
        let sink = MqttSink {
            shared,
            requests,
            topic: config.topic,
            retain: config.retain,
            publish_timeout: config.publish_timeout,
            encoder: Encoder::new(config.format, &config.cloudevents),
            tasks: [driver, dispatcher],
        };
        let first = tokio::time::timeout(config.connect_timeout + Duration::from_secs(1), first_rx)
            .await
            .map_err(|_| {
                Error::connect(
                    "MQTT",
                    &address,
                    format!("no CONNACK within {:?}", config.connect_timeout),
                )
            })?
            .map_err(|_| Error::connect("MQTT", &address, "the client task ended"))?;
        first.map_err(|reason| Error::connect("MQTT", &address, reason))?;
        Ok(sink)
    }

    async fn publish_until_sent(
        &self,
        request: impl Fn(oneshot::Sender<Reply>) -> Request,
    ) -> Result<(), PublishError> {
        let stopped = || PublishError::unavailable("MQTT: the sink is shutting down");
        let mut connected = self.shared.connected.subscribe();
        loop {
            connected.wait_for(|up| *up).await.map_err(|_| stopped())?;
            let (reply, replied) = oneshot::channel();
            self.requests.send(request(reply)).map_err(|_| stopped())?;
            match replied.await.map_err(|_| stopped())? {
                Ok(()) => return Ok(()),
                Err(Failure::Failed(e)) => return Err(e),
                // Send again once reconnected (at-least-once: the first copy may have arrived).
                Err(Failure::NotSent | Failure::Lost) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }
}

#[async_trait]
impl Sink for MqttSink {
    async fn publish(&self, event: &OutboxEvent) -> Result<(), PublishError> {
        self.publish_to(event, None).await
    }
}

#[async_trait]
impl RoutableSink for MqttSink {
    /// Publishes to the topic `destination` renders (the configured `topic` when `None`).
    async fn publish_to(
        &self,
        event: &OutboxEvent,
        destination: Option<&Template>,
    ) -> Result<(), PublishError> {
        let template = destination
            .or(self.topic.as_ref())
            .ok_or_else(|| no_destination("MQTT", "topic"))?;
        let topic = template.render(event)?;
        if topic.is_empty() || topic.contains(['+', '#', '\0']) {
            return Err(PublishError::permanent(format!(
                "MQTT: {topic:?} is not a topic one can publish to (empty, or has a wildcard or \
                 NUL); check the topic template and the event's values"
            )));
        }
        let message = self.encoder.encode(event, Binding::Mqtt)?;
        let payload = Bytes::copy_from_slice(&message.body);
        let properties = PublishProperties {
            payload_format_indicator: Some(1),
            content_type: Some(message.content_type.to_owned()),
            user_properties: message.headers,
            ..PublishProperties::default()
        };
        let publish = self.publish_until_sent(|reply| Request {
            topic: topic.clone(),
            payload: payload.clone(),
            properties: properties.clone(),
            retain: self.retain,
            reply,
        });
        let deadline = Instant::now() + self.publish_timeout;
        match tokio::time::timeout_at(deadline, publish).await {
            Ok(result) => result,
            Err(_) => Err(PublishError::unavailable(format!(
                "MQTT: no PUBACK for topic {topic:?} within {:?} (broker away or slow)",
                self.publish_timeout
            ))),
        }
    }
}

/// Hands requests to the current event loop, one at a time, queueing a waiter for each in the
/// same order. Runs until the sink is dropped.
async fn dispatch(shared: Arc<Shared>, mut requests: mpsc::UnboundedReceiver<Request>) {
    while let Some(request) = requests.recv().await {
        if request.reply.is_closed() {
            continue; // the publisher gave up (timeout) before its turn came
        }
        let (client, id) = {
            let mut conn = shared.lock();
            let Some(client) = conn.client.clone() else {
                let _ = request.reply.send(Err(Failure::NotSent));
                continue;
            };
            if let Some(max) = conn.max_packet_size {
                let size = estimated_size(&request);
                if size > max as usize {
                    let _ = request
                        .reply
                        .send(Err(Failure::Failed(PublishError::permanent(format!(
                            "MQTT: the message for topic {:?} is about {size} bytes; the broker \
                             accepts at most {max}",
                            request.topic
                        )))));
                    continue;
                }
            }
            let id = conn.next_waiter;
            conn.next_waiter += 1;
            conn.awaiting_pkid.push_back(Waiter {
                id,
                reply: request.reply,
            });
            (client, id)
        };
        let sent = client
            .publish_with_properties(
                request.topic,
                QoS::AtLeastOnce,
                request.retain,
                request.payload,
                request.properties,
            )
            .await;
        if sent.is_err() {
            // The event loop is gone; if its task has not failed our waiter yet, do it here.
            let mut conn = shared.lock();
            if let Some(pos) = conn.awaiting_pkid.iter().rposition(|w| w.id == id)
                && let Some(waiter) = conn.awaiting_pkid.remove(pos)
            {
                let _ = waiter.reply.send(Err(Failure::NotSent));
            }
        }
    }
}

/// Drives the event loop: connects, correlates packet ids with waiters, completes them on
/// `PUBACK`, and on a lost connection fails them all and starts over with a fresh event loop.
async fn drive(
    shared: Arc<Shared>,
    options: MqttOptions,
    mut backoff: postbox::backoff::Attempts,
    first: oneshot::Sender<Result<(), String>>,
) {
    let mut first = Some(first);
    loop {
        let (client, mut eventloop) = AsyncClient::new(options.clone(), 16);
        let mut by_pkid: HashMap<u16, oneshot::Sender<Reply>> = HashMap::new();
        let error = loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(connack))) => {
                    let max = connack.properties.as_ref().and_then(|p| p.max_packet_size);
                    {
                        let mut conn = shared.lock();
                        conn.client = Some(client.clone());
                        conn.max_packet_size = max;
                        shared.connected.send_replace(true);
                    }
                    backoff.reset();
                    tracing::info!(client_id = %options.client_id(), "MQTT sink connected");
                    if let Some(first) = first.take() {
                        let _ = first.send(Ok(()));
                    }
                }
                Ok(Event::Outgoing(Outgoing::Publish(pkid))) => {
                    let waiter = shared.lock().awaiting_pkid.pop_front();
                    match waiter {
                        Some(waiter) => {
                            if let Some(previous) = by_pkid.insert(pkid, waiter.reply) {
                                let _ = previous.send(Err(Failure::Failed(
                                    PublishError::retryable(format!(
                                        "MQTT: packet id {pkid} was reused before its PUBACK"
                                    )),
                                )));
                            }
                        }
                        None => tracing::warn!(pkid, "MQTT publish sent without a waiter"),
                    }
                }
                Ok(Event::Incoming(Packet::PubAck(ack))) => {
                    if let Some(reply) = by_pkid.remove(&ack.pkid) {
                        let _ = reply.send(puback_result(ack.reason).map_err(Failure::Failed));
                    }
                }
                Ok(_) => {}
                Err(e) => break e,
            }
        };
        let unsent = {
            let mut conn = shared.lock();
            conn.client = None;
            shared.connected.send_replace(false);
            std::mem::take(&mut conn.awaiting_pkid)
        };
        drop(eventloop);
        for waiter in unsent {
            let _ = waiter.reply.send(Err(Failure::Lost));
        }
        for (_, reply) in by_pkid.drain() {
            let _ = reply.send(Err(Failure::Lost));
        }
        if let Some(first) = first.take() {
            let _ = first.send(Err(error.to_string()));
            return;
        }
        let delay = backoff.next_delay();
        tracing::warn!(%error, ?delay, "MQTT sink disconnected; reconnecting");
        tokio::time::sleep(delay).await;
    }
}

fn puback_result(reason: PubAckReason) -> Result<(), PublishError> {
    match reason {
        PubAckReason::Success | PubAckReason::NoMatchingSubscribers => Ok(()),
        PubAckReason::NotAuthorized
        | PubAckReason::TopicNameInvalid
        | PubAckReason::PayloadFormatInvalid => Err(PublishError::permanent(format!(
            "MQTT: the broker refused the message: {reason:?}"
        ))),
        other => Err(PublishError::retryable(format!(
            "MQTT: the broker did not accept the message: {other:?}"
        ))),
    }
}

/// An upper estimate of the PUBLISH packet's size.
fn estimated_size(request: &Request) -> usize {
    let properties: usize = request
        .properties
        .user_properties
        .iter()
        .map(|(k, v)| k.len() + v.len() + 5)
        .sum();
    request.payload.len() + request.topic.len() + properties + 64
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::config::generated_client_id;
    use super::*;

    #[test]
    fn puback_reasons_are_classed() {
        assert!(puback_result(PubAckReason::Success).is_ok());
        assert!(puback_result(PubAckReason::NoMatchingSubscribers).is_ok());
        assert!(puback_result(PubAckReason::NotAuthorized).is_err_and(|e| e.is_permanent()));
        assert!(puback_result(PubAckReason::QuotaExceeded).is_err_and(|e| !e.is_permanent()));
    }

    #[test]
    fn bad_options_are_refused() {
        let topic = Template::parse("t").unwrap();
        let mut config = MqttConfig::new(topic);
        config.keep_alive = Duration::from_secs(1);
        assert!(
            config
                .options()
                .is_err_and(|e| e.to_string().contains("keep_alive"))
        );
        config.keep_alive = Duration::from_secs(30);
        config.password = Some("p".into());
        assert!(
            config
                .options()
                .is_err_and(|e| e.to_string().contains("password"))
        );
    }

    #[test]
    fn generated_client_ids_differ() {
        assert_ne!(generated_client_id(), generated_client_id());
    }
}
