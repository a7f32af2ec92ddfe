//! Redis Streams harness: the testkit's reader of the stream keys under a prefix of its own, a
//! proxy in front of the server.

use std::time::Duration;

use postbox::OutboxEvent;
use postbox_sinks::{RedisConfig, RedisSink};
use postbox_testkit::consumers::RedisStreams;
pub(crate) use postbox_testkit::consumers::redis::SERVER;
use redis::aio::MultiplexedConnection;

use super::proxy::Proxy;
use super::{Collector, Harness, Received};

pub(crate) struct RedisHarness {
    pub(crate) sink: RedisSink,
    pub(crate) consumer: RedisStreams,
    pub(crate) proxy: Proxy,
}

/// A direct (unproxied) connection for setting up and inspecting the server.
pub(crate) async fn admin() -> MultiplexedConnection {
    postbox_testkit::consumers::redis::connect().await
}

pub(crate) fn sink_config(proxy: &Proxy, template: &str, publish_timeout: Duration) -> RedisConfig {
    let mut config = RedisConfig::new(template.parse().expect("template"));
    config.url = format!("redis://{}", proxy.addr());
    config.publish_timeout = publish_timeout;
    config.connect_timeout = Duration::from_secs(2);
    config.reconnect_max_delay = Duration::from_millis(200);
    config
}

impl Harness for RedisHarness {
    type Sink = RedisSink;

    async fn start(publish_timeout: Duration) -> Self {
        let consumer = RedisStreams::start().await;
        let proxy = Proxy::start(SERVER.parse().expect("address")).await;
        let template = format!("{}:{{aggregate_type}}:{{event_type}}", consumer.prefix);
        let sink = RedisSink::connect(sink_config(&proxy, &template, publish_timeout))
            .await
            .expect("connect sink");
        RedisHarness {
            sink,
            consumer,
            proxy,
        }
    }

    fn sink(&self) -> &RedisSink {
        &self.sink
    }

    fn collector(&self) -> &Collector {
        &self.consumer.collector
    }

    fn expected_destination(&self, event: &OutboxEvent) -> String {
        format!(
            "{}:{}:{}",
            self.consumer.prefix,
            event.aggregate_type.as_deref().unwrap_or_default(),
            event.event_type
        )
    }

    fn other_destination(&self) -> (String, String) {
        (
            format!("{}:routed:{{event_type}}", self.consumer.prefix),
            format!("{}:routed:InvoiceCreated", self.consumer.prefix),
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

    fn check_specific(&self, _event: &OutboxEvent, got: &Received) {
        assert!(!got.extra.contains_key("duplicate_field"), "{got:?}");
        assert!(got.extra.contains_key("entry_id"));
    }

    async fn cleanup(self) {
        self.consumer.cleanup().await;
    }
}
