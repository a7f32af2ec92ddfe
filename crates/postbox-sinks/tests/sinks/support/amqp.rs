//! RabbitMQ harness: the testkit's queue and consumer, bound to a topic exchange of its own, a
//! proxy in front of the broker.

use std::time::Duration;

use lapin::options::ExchangeDeclareOptions;
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use postbox::OutboxEvent;
use postbox_sinks::{AmqpConfig, AmqpSink};
use postbox_testkit::consumers::AmqpQueue;
pub(crate) use postbox_testkit::consumers::amqp::URL;

use super::proxy::Proxy;
use super::{Collector, Harness, Received};

pub(crate) const BROKER: &str = "127.0.0.1:5672";

pub(crate) struct AmqpHarness {
    pub(crate) sink: AmqpSink,
    pub(crate) consumer: AmqpQueue,
    pub(crate) exchange: String,
    pub(crate) proxy: Proxy,
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

impl Harness for AmqpHarness {
    type Sink = AmqpSink;

    async fn start(publish_timeout: Duration) -> Self {
        let mut consumer = AmqpQueue::start().await;
        let exchange = consumer.bind_exchange().await;
        let proxy = Proxy::start(BROKER.parse().expect("address")).await;
        let sink = AmqpSink::connect(sink_config(&proxy, &exchange, publish_timeout))
            .await
            .expect("connect sink");
        AmqpHarness {
            sink,
            consumer,
            exchange,
            proxy,
        }
    }

    fn sink(&self) -> &AmqpSink {
        &self.sink
    }

    fn collector(&self) -> &Collector {
        &self.consumer.collector
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
        self.consumer.cleanup().await;
    }
}
