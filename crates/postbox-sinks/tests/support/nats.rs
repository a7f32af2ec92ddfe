//! NATS JetStream harness: a stream of its own, a pull consumer, a proxy in front of the server.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use futures::StreamExt;
use postbox::OutboxEvent;
use postbox_sinks::{NatsConfig, NatsSink};
use tokio::task::JoinHandle;

use super::proxy::Proxy;
use super::{Collector, Harness, Received};

pub(crate) const SERVER: &str = "127.0.0.1:4222";

pub(crate) struct NatsHarness {
    pub(crate) sink: NatsSink,
    pub(crate) jetstream: jetstream::Context,
    pub(crate) stream: String,
    pub(crate) prefix: String,
    pub(crate) proxy: Proxy,
    collector: Arc<Collector>,
    consumer: JoinHandle<()>,
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
        let mut stream = self
            .jetstream
            .get_stream(&self.stream)
            .await
            .expect("stream");
        stream.info().await.expect("stream info").state.messages
    }
}

impl Harness for NatsHarness {
    type Sink = NatsSink;

    async fn start(publish_timeout: Duration) -> Self {
        let suffix = super::suffix();
        let prefix = format!("postbox_test_{suffix}");
        let stream_name = format!("POSTBOX_TEST_{suffix}");
        let client = async_nats::connect(SERVER)
            .await
            .unwrap_or_else(|e| panic!("NATS is not reachable at {SERVER}: {e}"));
        let jetstream = jetstream::new(client);
        let stream = jetstream
            .create_stream(stream::Config {
                name: stream_name.clone(),
                subjects: vec![format!("{prefix}.>")],
                max_age: Duration::from_secs(600),
                ..Default::default()
            })
            .await
            .expect("create stream");
        let consumer = stream
            .create_consumer(consumer::pull::Config::default())
            .await
            .expect("create consumer");
        let mut messages = consumer.messages().await.expect("consume");
        let collector = Arc::new(Collector::default());
        let sink_collector = collector.clone();
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
                sink_collector.push(received);
            }
        });
        let proxy = Proxy::start(SERVER.parse().expect("address")).await;
        let sink = NatsSink::connect(Self::config(&prefix, &proxy, publish_timeout))
            .await
            .expect("connect sink");
        NatsHarness {
            sink,
            jetstream,
            stream: stream_name,
            prefix,
            proxy,
            collector,
            consumer,
        }
    }

    fn sink(&self) -> &NatsSink {
        &self.sink
    }

    fn collector(&self) -> &Collector {
        &self.collector
    }

    fn expected_destination(&self, event: &OutboxEvent) -> String {
        format!(
            "{}.{}.{}",
            self.prefix,
            event.aggregate_type.as_deref().unwrap_or_default(),
            event.event_type
        )
    }

    fn other_destination(&self) -> (String, String) {
        (
            format!("{}.routed.{{event_type}}", self.prefix),
            format!("{}.routed.InvoiceCreated", self.prefix),
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
        self.consumer.abort();
        let _ = self.jetstream.delete_stream(&self.stream).await;
    }
}
