//! A RabbitMQ queue of its own with a consumer, optionally bound to topic exchanges of its own.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, ExchangeDeclareOptions,
    ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use tokio::task::JoinHandle;

use super::{Collector, MARKER, Received};

/// The broker the consumer reads from.
pub const URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// A durable queue of its own (gone with its consumer should a failed test skip its cleanup)
/// and a consumer that acknowledges every delivery and collects it: the routing key as
/// `destination`, the headers as text, and in `extra` the `message_id`, `delivery_mode`,
/// `content_type`, `type` properties and the `exchange` it came through (empty: the default
/// exchange).
pub struct AmqpQueue {
    /// The queue's name: the routing key on the default exchange.
    pub queue: String,
    /// What the consumer received.
    pub collector: Arc<Collector>,
    /// A direct (unproxied) connection.
    pub connection: Connection,
    /// A channel on it, for setting up and inspecting the broker.
    pub channel: Channel,
    exchanges: Vec<String>,
    consumer: JoinHandle<()>,
}

/// A header value as text.
fn text(value: &AMQPValue) -> String {
    match value {
        AMQPValue::LongString(s) => s.to_string(),
        AMQPValue::ShortString(s) => s.to_string(),
        other => format!("{other:?}"),
    }
}

impl AmqpQueue {
    /// Declares a queue of its own and starts consuming it.
    pub async fn start() -> AmqpQueue {
        let queue = format!("postbox_test_{}", super::suffix());
        let connection = Connection::connect(URL, ConnectionProperties::default())
            .await
            .unwrap_or_else(|e| panic!("RabbitMQ is not reachable at {URL}: {e}"));
        let channel = connection.create_channel().await.expect("channel");
        channel
            .queue_declare(
                queue.as_str().into(),
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
        let mut deliveries = channel
            .basic_consume(
                queue.as_str().into(),
                "postbox-test".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("consume");
        let collector = Arc::new(Collector::default());
        let sink = Arc::clone(&collector);
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
                extra.insert("exchange".into(), delivery.exchange.to_string());
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

    /// Declares a topic exchange of its own (gone with its last binding), binds the queue to
    /// everything on it (`#`), and returns its name.
    pub async fn bind_exchange(&mut self) -> String {
        let exchange = format!("postbox_test_x_{}", super::suffix());
        self.channel
            .exchange_declare(
                exchange.as_str().into(),
                ExchangeKind::Topic,
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

    /// Waits until every id of `ids` arrived, then for a marker behind them through each
    /// exchange and routing key they arrived with (see [the module](super)); returns what
    /// arrived, markers left out. Call it once the publisher is done.
    pub async fn received(&self, ids: &[i64], within: Duration) -> Vec<Received> {
        super::behind_markers(
            &self.collector,
            ids,
            within,
            "exchange",
            |routing_key, exchange, id| async move {
                let mut headers = FieldTable::default();
                headers.insert(
                    "postbox-event-id".into(),
                    AMQPValue::LongString(LongString::from(id.to_string())),
                );
                headers.insert(MARKER.into(), AMQPValue::LongString(LongString::from("1")));
                self.channel
                    .basic_publish(
                        exchange.as_str().into(),
                        routing_key.as_str().into(),
                        BasicPublishOptions::default(),
                        b"{}",
                        BasicProperties::default().with_headers(headers),
                    )
                    .await
                    .expect("publish a marker");
            },
        )
        .await
    }

    /// Stops consuming, deletes the queue and the exchanges, closes the connection.
    pub async fn cleanup(self) {
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
