//! NATS JetStream harness: the testkit's stream and pull consumer, a proxy in front of the
//! server.

use std::time::Duration;

use postbox::OutboxEvent;
use postbox_sinks::{NatsConfig, NatsSink};
use postbox_testkit::consumers::NatsStream;
pub(crate) use postbox_testkit::consumers::nats::SERVER;

use super::proxy::Proxy;
use super::{Collector, Harness, Received};

pub(crate) struct NatsHarness {
    pub(crate) sink: NatsSink,
    pub(crate) consumer: NatsStream,
    pub(crate) proxy: Proxy,
}

impl NatsHarness {
    pub(crate) fn config(prefix: &str, proxy: &Proxy, publish_timeout: Duration) -> NatsConfig {
        let mut config = NatsConfig::new(
            format!("{prefix}.{{aggregate_type}}.{{event_type}}")
                .parse()
                .expect("template"),
        );
        config.url = format!("nats://{}", proxy.addr());
        config.publish_timeout = publish_timeout;
        config.connect_timeout = Duration::from_secs(3);
        config.reconnect_max_delay = Duration::from_millis(200);
        config
    }

    pub(crate) async fn message_count(&self) -> u64 {
        self.consumer.message_count().await
    }
}

impl Harness for NatsHarness {
    type Sink = NatsSink;

    async fn start(publish_timeout: Duration) -> Self {
        let consumer = NatsStream::start().await;
        let proxy = Proxy::start(SERVER.parse().expect("address")).await;
        let sink = NatsSink::connect(Self::config(&consumer.prefix, &proxy, publish_timeout))
            .await
            .expect("connect sink");
        NatsHarness {
            sink,
            consumer,
            proxy,
        }
    }

    fn sink(&self) -> &NatsSink {
        &self.sink
    }

    fn collector(&self) -> &Collector {
        &self.consumer.collector
    }

    fn expected_destination(&self, event: &OutboxEvent) -> String {
        format!(
            "{}.{}.{}",
            self.consumer.prefix,
            event.aggregate_type.as_deref().unwrap_or_default(),
            event.event_type
        )
    }

    fn other_destination(&self) -> (String, String) {
        (
            format!("{}.routed.{{event_type}}", self.consumer.prefix),
            format!("{}.routed.InvoiceCreated", self.consumer.prefix),
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
        assert_eq!(got.header("Nats-Msg-Id"), Some(event.dedup_id().as_str()));
    }

    async fn cleanup(self) {
        self.consumer.cleanup().await;
    }
}
