//! Real consumers of the shared brokers on 127.0.0.1 (NATS JetStream 4222, RabbitMQ 5672, Redis
//! 6379, Mosquitto 1883) and a webhook endpoint of the test's own, each on a stream, queue, key
//! prefix or topic prefix with a random suffix, collecting what arrives. Modelled on the consumers
//! of postbox-sinks' conformance suite.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// A short random suffix, so that parallel tests never share a stream, queue, key or topic.
pub(crate) fn suffix() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..12].to_owned()
}

/// One message as a consumer of the broker saw it.
#[derive(Clone, Debug, Default)]
pub(crate) struct Received {
    /// Subject, routing key, topic, stream key or URL path.
    pub(crate) destination: String,
    /// The payload, parsed (for webhooks: the envelope's `payload`).
    pub(crate) body: serde_json::Value,
    /// Headers, properties or fields, by name as received.
    pub(crate) headers: BTreeMap<String, String>,
    /// Broker-specific extras (AMQP `message_id`, the raw webhook body, …).
    pub(crate) extra: BTreeMap<String, String>,
}

impl Received {
    /// A header by name, compared case-insensitively.
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The `postbox-event-id` header.
    pub(crate) fn event_id(&self) -> Option<i64> {
        self.header("postbox-event-id")?.parse().ok()
    }
}

/// What a consumer has received so far.
pub(crate) struct Collector {
    items: Mutex<Vec<Received>>,
    count: watch::Sender<usize>,
}

impl Default for Collector {
    fn default() -> Self {
        Collector {
            items: Mutex::new(Vec::new()),
            count: watch::channel(0).0,
        }
    }
}

impl Collector {
    fn push(&self, r: Received) {
        let mut items = self.items.lock().expect("collector");
        items.push(r);
        self.count.send_replace(items.len());
    }

    pub(crate) fn snapshot(&self) -> Vec<Received> {
        self.items.lock().expect("collector").clone()
    }

    /// Waits until every id in `ids` arrived (or `within` passed), then a little longer so that
    /// repeats would show; returns what arrived.
    pub(crate) async fn wait_for_ids(&self, ids: &[i64], within: Duration) -> Vec<Received> {
        let deadline = Instant::now() + within;
        let mut count = self.count.subscribe();
        loop {
            let seen: HashSet<i64> = self
                .snapshot()
                .iter()
                .filter_map(Received::event_id)
                .collect();
            if ids.iter().all(|id| seen.contains(id)) || Instant::now() >= deadline {
                break;
            }
            let _ = tokio::time::timeout_at(deadline, count.changed()).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        self.snapshot()
    }
}

/// A JetStream stream capturing `<prefix>.>` with a pull consumer.
pub(crate) struct NatsStream {
    pub(crate) prefix: String,
    pub(crate) collector: Arc<Collector>,
    jetstream: async_nats::jetstream::Context,
    stream: String,
    consumer: JoinHandle<()>,
}

impl NatsStream {
    pub(crate) async fn start() -> NatsStream {
        use async_nats::jetstream::{self, consumer, stream};
        let suffix = suffix();
        let prefix = format!("postbox_cli_{suffix}");
        let name = format!("POSTBOX_CLI_{suffix}");
        let client = async_nats::connect("127.0.0.1:4222")
            .await
            .unwrap_or_else(|e| panic!("NATS is not reachable at 127.0.0.1:4222: {e}"));
        let jetstream = jetstream::new(client);
        let created = jetstream
            .create_stream(stream::Config {
                name: name.clone(),
                subjects: vec![format!("{prefix}.>")],
                max_age: Duration::from_secs(600),
                ..Default::default()
            })
            .await
            .expect("create stream");
        let consumer = created
            .create_consumer(consumer::pull::Config::default())
            .await
            .expect("create consumer");
        let mut messages = consumer.messages().await.expect("consume");
        let collector = Arc::new(Collector::default());
        let sink = collector.clone();
        let consumer = tokio::spawn(async move {
            while let Some(Ok(message)) = messages.next().await {
                let mut received = Received {
                    destination: message.subject.to_string(),
                    body: serde_json::from_slice(&message.payload).unwrap_or_default(),
                    ..Received::default()
                };
                if let Some(headers) = &message.headers {
                    for (name, values) in headers.iter() {
                        if let Some(value) = values.first() {
                            received
                                .headers
                                .insert(name.to_string(), value.as_str().to_owned());
                        }
                    }
                }
                let _ = message.ack().await;
                sink.push(received);
            }
        });
        NatsStream {
            prefix,
            collector,
            jetstream,
            stream: name,
            consumer,
        }
    }

    pub(crate) async fn cleanup(self) {
        self.consumer.abort();
        let _ = self.jetstream.delete_stream(&self.stream).await;
    }
}

/// A RabbitMQ queue of its own with a consumer; optionally a topic exchange bound to it.
pub(crate) struct AmqpQueue {
    pub(crate) queue: String,
    pub(crate) collector: Arc<Collector>,
    connection: lapin::Connection,
    channel: lapin::Channel,
    exchanges: Vec<String>,
    consumer: JoinHandle<()>,
}

impl AmqpQueue {
    pub(crate) async fn start() -> AmqpQueue {
        use lapin::options::{BasicAckOptions, BasicConsumeOptions, QueueDeclareOptions};
        use lapin::types::{AMQPValue, FieldTable};
        let queue = format!("postbox_cli_{}", suffix());
        let connection = lapin::Connection::connect(
            "amqp://guest:guest@127.0.0.1:5672/%2f",
            lapin::ConnectionProperties::default(),
        )
        .await
        .unwrap_or_else(|e| panic!("RabbitMQ is not reachable at 127.0.0.1:5672: {e}"));
        let channel = connection.create_channel().await.expect("channel");
        channel
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions {
                    durable: true,
                    auto_delete: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("declare queue");
        let mut deliveries = channel
            .basic_consume(
                queue.as_str().into(),
                "postbox-cli-test".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("consume");
        let collector = Arc::new(Collector::default());
        let sink = collector.clone();
        let consumer = tokio::spawn(async move {
            while let Some(Ok(delivery)) = deliveries.next().await {
                let props = &delivery.properties;
                let mut received = Received {
                    destination: delivery.routing_key.to_string(),
                    body: serde_json::from_slice(&delivery.data).unwrap_or_default(),
                    ..Received::default()
                };
                if let Some(headers) = props.headers() {
                    for (name, value) in headers {
                        let text = match value {
                            AMQPValue::LongString(s) => s.to_string(),
                            AMQPValue::ShortString(s) => s.to_string(),
                            other => format!("{other:?}"),
                        };
                        received.headers.insert(name.to_string(), text);
                    }
                }
                if let Some(v) = props.message_id() {
                    received.extra.insert("message_id".into(), v.to_string());
                }
                if let Some(v) = props.delivery_mode() {
                    received.extra.insert("delivery_mode".into(), v.to_string());
                }
                received
                    .extra
                    .insert("exchange".into(), delivery.exchange.to_string());
                let _ = delivery.ack(BasicAckOptions::default()).await;
                sink.push(received);
            }
        });
        AmqpQueue {
            queue,
            collector,
            connection,
            channel,
            exchanges: Vec::new(),
            consumer,
        }
    }

    /// Declares a topic exchange of its own, bound to the queue with `#`; returns its name.
    pub(crate) async fn bind_exchange(&mut self) -> String {
        use lapin::options::{ExchangeDeclareOptions, QueueBindOptions};
        use lapin::types::FieldTable;
        let exchange = format!("postbox_cli_x_{}", suffix());
        self.channel
            .exchange_declare(
                exchange.as_str().into(),
                lapin::ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    auto_delete: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("declare exchange");
        self.channel
            .queue_bind(
                self.queue.as_str().into(),
                exchange.as_str().into(),
                "#".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("bind queue");
        self.exchanges.push(exchange.clone());
        exchange
    }

    pub(crate) async fn cleanup(self) {
        use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
        self.consumer.abort();
        let _ = self
            .channel
            .queue_delete(self.queue.as_str().into(), QueueDeleteOptions::default())
            .await;
        for exchange in &self.exchanges {
            let _ = self
                .channel
                .exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
                .await;
        }
        let _ = self.connection.close(200, "done".into()).await;
    }
}

/// A reader of every Redis stream under `<prefix>:`, polling with `XRANGE`.
pub(crate) struct RedisStreams {
    pub(crate) prefix: String,
    pub(crate) collector: Arc<Collector>,
    connection: redis::aio::MultiplexedConnection,
    reader: JoinHandle<()>,
}

impl RedisStreams {
    pub(crate) async fn start() -> RedisStreams {
        let prefix = format!("postbox_cli_{}", suffix());
        let connection = redis::Client::open("redis://127.0.0.1:6379")
            .expect("client")
            .get_multiplexed_async_connection()
            .await
            .unwrap_or_else(|e| panic!("Redis is not reachable at 127.0.0.1:6379: {e}"));
        let collector = Arc::new(Collector::default());
        let sink = collector.clone();
        let mut reader_connection = connection.clone();
        let pattern = format!("{prefix}:*");
        let reader = tokio::spawn(async move {
            let mut last: HashMap<String, String> = HashMap::new();
            loop {
                let keys: Vec<String> = redis::cmd("KEYS")
                    .arg(&pattern)
                    .query_async(&mut reader_connection)
                    .await
                    .unwrap_or_default();
                for key in keys {
                    let start = last
                        .get(&key)
                        .map_or_else(|| "-".to_owned(), |id| format!("({id}"));
                    let entries: Vec<(String, Vec<String>)> = redis::cmd("XRANGE")
                        .arg(&key)
                        .arg(start)
                        .arg("+")
                        .query_async(&mut reader_connection)
                        .await
                        .unwrap_or_default();
                    for (id, flat) in entries {
                        let mut received = Received {
                            destination: key.clone(),
                            ..Received::default()
                        };
                        for pair in flat.chunks(2) {
                            let value = pair.get(1).cloned().unwrap_or_default();
                            if pair[0] == "payload" {
                                received.body = serde_json::from_str(&value).unwrap_or_default();
                            } else {
                                received.headers.insert(pair[0].clone(), value);
                            }
                        }
                        sink.push(received);
                        last.insert(key.clone(), id);
                    }
                }
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
        });
        RedisStreams {
            prefix,
            collector,
            connection,
            reader,
        }
    }

    pub(crate) async fn cleanup(mut self) {
        self.reader.abort();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}:*", self.prefix))
            .query_async(&mut self.connection)
            .await
            .unwrap_or_default();
        if !keys.is_empty() {
            let _: Result<(), _> = redis::cmd("DEL")
                .arg(keys)
                .query_async(&mut self.connection)
                .await;
        }
    }
}

/// A QoS 1 subscriber to `<prefix>/#` on Mosquitto.
pub(crate) struct MqttTopics {
    pub(crate) prefix: String,
    pub(crate) collector: Arc<Collector>,
    subscriber: JoinHandle<()>,
}

impl MqttTopics {
    pub(crate) async fn start() -> MqttTopics {
        use rumqttc::v5::mqttbytes::QoS;
        use rumqttc::v5::mqttbytes::v5::Packet;
        use rumqttc::v5::{AsyncClient, Event, MqttOptions};
        let prefix = format!("postbox_cli_{}", suffix());
        let mut options = MqttOptions::new(format!("{prefix}-sub"), "127.0.0.1", 1883);
        options
            .set_max_packet_size(Some(1024 * 1024))
            .set_keep_alive(Duration::from_secs(30));
        let (client, mut eventloop) = AsyncClient::new(options, 100);
        client
            .subscribe(format!("{prefix}/#"), QoS::AtLeastOnce)
            .await
            .expect("subscribe");
        let collector = Arc::new(Collector::default());
        let sink = collector.clone();
        let (subscribed_tx, subscribed) = tokio::sync::oneshot::channel();
        let subscriber = tokio::spawn(async move {
            let _client = client;
            let mut subscribed_tx = Some(subscribed_tx);
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        if let Some(tx) = subscribed_tx.take() {
                            let _ = tx.send(());
                        }
                    }
                    Ok(Event::Incoming(Packet::Publish(publish))) => {
                        let mut received = Received {
                            destination: String::from_utf8_lossy(&publish.topic).into_owned(),
                            body: serde_json::from_slice(&publish.payload).unwrap_or_default(),
                            ..Received::default()
                        };
                        received
                            .extra
                            .insert("qos".into(), format!("{:?}", publish.qos));
                        if let Some(props) = &publish.properties {
                            for (k, v) in &props.user_properties {
                                received.headers.insert(k.clone(), v.clone());
                            }
                        }
                        sink.push(received);
                    }
                    Ok(_) => {}
                    Err(e) => panic!("MQTT subscriber at 127.0.0.1:1883 failed: {e}"),
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(5), subscribed)
            .await
            .expect("SUBACK in time")
            .expect("subscriber running");
        MqttTopics {
            prefix,
            collector,
            subscriber,
        }
    }

    pub(crate) fn cleanup(self) {
        self.subscriber.abort();
    }
}

/// An HTTP endpoint on an ephemeral port that records every POST under `/hooks/` and answers
/// 200, or 500 to the first request whose path starts with a given prefix.
pub(crate) struct Webhook {
    pub(crate) addr: SocketAddr,
    pub(crate) collector: Arc<Collector>,
    server: JoinHandle<()>,
}

#[derive(Default)]
struct Endpoint {
    collector: Arc<Collector>,
    fail_once: Mutex<Option<String>>,
}

impl Webhook {
    /// Starts the endpoint; the first request under `fail_once` (a path prefix) gets a 500.
    pub(crate) async fn start(fail_once: Option<&str>) -> Webhook {
        use axum::body::Bytes;
        use axum::extract::State;
        use axum::http::{HeaderMap, StatusCode, Uri};

        async fn hook(
            State(endpoint): State<Arc<Endpoint>>,
            uri: Uri,
            headers: HeaderMap,
            body: Bytes,
        ) -> StatusCode {
            let envelope: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            let mut received = Received {
                destination: uri.path().to_owned(),
                body: envelope["payload"].clone(),
                ..Received::default()
            };
            for (name, value) in &headers {
                received.headers.insert(
                    name.as_str().to_owned(),
                    value.to_str().unwrap_or_default().to_owned(),
                );
            }
            received.extra.insert(
                "raw_body".into(),
                String::from_utf8_lossy(&body).into_owned(),
            );
            endpoint.collector.push(received);
            let mut fail_once = endpoint.fail_once.lock().expect("script");
            if fail_once
                .as_deref()
                .is_some_and(|prefix| uri.path().starts_with(prefix))
            {
                *fail_once = None;
                return StatusCode::INTERNAL_SERVER_ERROR;
            }
            StatusCode::OK
        }

        let endpoint = Arc::new(Endpoint {
            collector: Arc::new(Collector::default()),
            fail_once: Mutex::new(fail_once.map(str::to_owned)),
        });
        let collector = endpoint.collector.clone();
        let app = axum::Router::new()
            .route("/hooks/{*rest}", axum::routing::post(hook))
            .with_state(endpoint);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("address");
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Webhook {
            addr,
            collector,
            server,
        }
    }

    pub(crate) fn cleanup(self) {
        self.server.abort();
    }
}
