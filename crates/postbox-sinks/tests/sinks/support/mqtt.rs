//! MQTT harness: the testkit's QoS 1 subscriber on a topic prefix of its own, a proxy in front
//! of the broker.

use std::time::Duration;

use postbox::OutboxEvent;
use postbox_sinks::{MqttConfig, MqttSink};
use postbox_testkit::consumers::MqttTopics;
pub(crate) use postbox_testkit::consumers::mqtt::BROKER;

use super::proxy::Proxy;
use super::{Collector, Harness, Received};

pub(crate) struct MqttHarness {
    pub(crate) sink: MqttSink,
    pub(crate) consumer: MqttTopics,
    pub(crate) proxy: Proxy,
}

pub(crate) fn sink_config(proxy: &Proxy, prefix: &str, publish_timeout: Duration) -> MqttConfig {
    let mut config = MqttConfig::new(
        format!("{prefix}/{{aggregate_type}}/{{event_type}}")
            .parse()
            .expect("template"),
    );
    config.port = proxy.port();
    config.publish_timeout = publish_timeout;
    config.connect_timeout = Duration::from_secs(2);
    config.reconnect_max_delay = Duration::from_millis(200);
    config
}

impl Harness for MqttHarness {
    type Sink = MqttSink;

    async fn start(publish_timeout: Duration) -> Self {
        let consumer = MqttTopics::start().await;
        let proxy = Proxy::start(BROKER.parse().expect("address")).await;
        let sink = MqttSink::connect(sink_config(&proxy, &consumer.prefix, publish_timeout))
            .await
            .expect("connect sink");
        MqttHarness {
            sink,
            consumer,
            proxy,
        }
    }

    fn sink(&self) -> &MqttSink {
        &self.sink
    }

    fn collector(&self) -> &Collector {
        &self.consumer.collector
    }

    fn expected_destination(&self, event: &OutboxEvent) -> String {
        format!(
            "{}/{}/{}",
            self.consumer.prefix,
            event.aggregate_type.as_deref().unwrap_or_default(),
            event.event_type
        )
    }

    fn other_destination(&self) -> (String, String) {
        (
            format!("{}/routed/{{event_type}}", self.consumer.prefix),
            format!("{}/routed/InvoiceCreated", self.consumer.prefix),
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
        assert_eq!(
            got.extra.get("qos").map(String::as_str),
            Some("AtLeastOnce")
        );
        assert_eq!(
            got.extra.get("content_type").map(String::as_str),
            Some("application/json")
        );
    }

    async fn cleanup(self) {
        self.consumer.cleanup();
    }
}
