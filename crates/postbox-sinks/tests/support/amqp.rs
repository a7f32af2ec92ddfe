//! RabbitMQ harness: a topic exchange and a queue bound to everything on it, a consumer, a proxy
//! in front of the broker.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, ExchangeDeclareOptions, ExchangeDeleteOptions,
    QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use postbox::OutboxEvent;
use postbox_sinks::{AmqpConfig, AmqpSink};
use tokio::task::JoinHandle;

use super::proxy::Proxy;
use super::{Collector, Harness, Received};

pub(crate) const BROKER: &str = "127.0.0.1:5672";
pub(crate) const URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

pub(crate) struct AmqpHarness {
    pub(crate) sink: AmqpSink,
    pub(crate) connection: Connection,
    pub(crate) channel: Channel,
    pub(crate) exchange: String,
    pub(crate) queue: String,
    pub(crate) proxy: Proxy,
    collector: Arc<Collector>,
    consumer: JoinHandle<()>,
}

/// A direct (unproxied) connection and channel for setting up and inspecting the broker.
pub(crate) async fn admin() -> (Connection, Channel) {
    let connection = Connection::connect(URL, ConnectionProperties::default())
        .await
        .unwrap_or_else(|e| panic!("RabbitMQ is not reachable at {URL}: {e}"));
    let channel = connection.create_channel().await.expect("channel");
    (connection, channel)
}

pub(crate) async fn declare_exchange(channel: &Channel, name: &str) {
    channel
        .exchange_declare(
            name.into(),
            ExchangeKind::Topic,
            // Gone with its last binding, should a failed test skip its cleanup.
            ExchangeDeclareOptions {
                auto_delete: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("declare exchange");
}

pub(crate) fn sink_config(proxy: &Proxy, exchange: &str, publish_timeout: Duration) -> AmqpConfig {
    let mut config = AmqpConfig::new("{aggregate_type}.{event_type}".parse().expect("template"));
    config.url = format!("amqp://guest:guest@{}/%2f", proxy.addr());
    config.exchange = exchange.to_owned();
    config.publish_timeout = publish_timeout;
    config.connect_timeout = Duration::from_secs(5);
    config.reconnect_max_delay = Duration::from_millis(200);
    config
}

fn text(value: &AMQPValue) -> String {
    match value {
        AMQPValue::LongString(s) => s.to_string(),
        AMQPValue::ShortString(s) => s.to_string(),
        other => format!("{other:?}"),
    }
}

impl Harness for AmqpHarness {
    type Sink = AmqpSink;

    async fn start(publish_timeout: Duration) -> Self {
        let name = format!("postbox_test_{}", super::suffix());
        let (connection, channel) = admin().await;
        declare_exchange(&channel, &name).await;
        channel
            .queue_declare(
                name.as_str().into(),
                // Durable (confirms then mean "on disk"), and gone with its consumer should a
                // failed test skip its cleanup.
                QueueDeclareOptions {
                    durable: true,
                    auto_delete: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("declare queue");
        channel
            .queue_bind(
                name.as_str().into(),
                name.as_str().into(),
                "#".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("bind queue");
        let mut deliveries = channel
            .basic_consume(
                name.as_str().into(),
                "postbox-test".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("consume");
        let collector = Arc::new(Collector::default());
        let sink_collector = collector.clone();
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
                        received.headers.insert(name.to_string(), text(value));
                    }
                }
                let extra = &mut received.extra;
                if let Some(v) = props.message_id() {
                    extra.insert("message_id".into(), v.to_string());
                }
                if let Some(v) = props.delivery_mode() {
                    extra.insert("delivery_mode".into(), v.to_string());
                }
                if let Some(v) = props.content_type() {
                    extra.insert("content_type".into(), v.to_string());
                }
                if let Some(v) = props.kind() {
                    extra.insert("type".into(), v.to_string());
                }
                let _ = delivery.ack(BasicAckOptions::default()).await;
                sink_collector.push(received);
            }
        });
        let proxy = Proxy::start(BROKER.parse().expect("address")).await;
        let sink = AmqpSink::connect(sink_config(&proxy, &name, publish_timeout))
            .await
            .expect("connect sink");
        AmqpHarness {
            sink,
            connection,
            channel,
            exchange: name.clone(),
            queue: name,
            proxy,
            collector,
            consumer,
        }
    }

    fn sink(&self) -> &AmqpSink {
        &self.sink
    }

    fn collector(&self) -> &Collector {
        &self.collector
    }

    fn expected_destination(&self, event: &OutboxEvent) -> String {
        format!(
            "{}.{}",
            event.aggregate_type.as_deref().unwrap_or_default(),
            event.event_type
        )
    }

    fn other_destination(&self) -> (String, String) {
        (
            "routed.{event_type}".to_owned(),
            "routed.InvoiceCreated".to_owned(),
        )
    }

    async fn broker_down(&self) {
        self.proxy.down();
    }

    async fn stall_acks(&self) {
        self.proxy.stall();
    }

    async fn broker_up(&self) {
        self.proxy.up();
    }

    fn check_specific(&self, event: &OutboxEvent, got: &Received) {
        assert_eq!(got.extra.get("message_id"), Some(&event.dedup_id()));
        assert_eq!(
            got.extra.get("delivery_mode").map(String::as_str),
            Some("2"),
            "persistent"
        );
        assert_eq!(
            got.extra.get("content_type").map(String::as_str),
            Some("application/json")
        );
        assert_eq!(got.extra.get("type"), Some(&event.event_type));
    }

    async fn cleanup(self) {
        self.consumer.abort();
        let _ = self
            .channel
            .queue_delete(self.queue.as_str().into(), QueueDeleteOptions::default())
            .await;
        let _ = self
            .channel
            .exchange_delete(
                self.exchange.as_str().into(),
                ExchangeDeleteOptions::default(),
            )
            .await;
        let _ = self.connection.close(200, "done".into()).await;
    }
}
