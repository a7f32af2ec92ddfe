//! MQTT harness: a QoS 1 subscriber on a topic prefix of its own, a proxy in front of the broker.

use std::sync::Arc;
use std::time::Duration;

use postbox::OutboxEvent;
use postbox_sinks::{MqttConfig, MqttSink};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::Packet;
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::proxy::Proxy;
use super::{Collector, Harness, Received};

pub(crate) const BROKER: &str = "127.0.0.1:1883";

pub(crate) struct MqttHarness {
    pub(crate) sink: MqttSink,
    pub(crate) prefix: String,
    pub(crate) proxy: Proxy,
    collector: Arc<Collector>,
    subscriber: JoinHandle<()>,
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
        let prefix = format!("postbox_test_{}", super::suffix());
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
        let sub_collector = collector.clone();
        let (subscribed_tx, subscribed) = oneshot::channel();
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
                            if let Some(ct) = &props.content_type {
                                received.extra.insert("content_type".into(), ct.clone());
                            }
                        }
                        sub_collector.push(received);
                    }
                    Ok(_) => {}
                    Err(e) => panic!("MQTT subscriber at {BROKER} failed: {e}"),
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(5), subscribed)
            .await
            .expect("SUBACK in time")
            .expect("subscriber running");
        let proxy = Proxy::start(BROKER.parse().expect("address")).await;
        let sink = MqttSink::connect(sink_config(&proxy, &prefix, publish_timeout))
            .await
            .expect("connect sink");
        MqttHarness {
            sink,
            prefix,
            proxy,
            collector,
            subscriber,
        }
    }

    fn sink(&self) -> &MqttSink {
        &self.sink
    }

    fn collector(&self) -> &Collector {
        &self.collector
    }

    fn expected_destination(&self, event: &OutboxEvent) -> String {
        format!(
            "{}/{}/{}",
            self.prefix,
            event.aggregate_type.as_deref().unwrap_or_default(),
            event.event_type
        )
    }

    fn other_destination(&self) -> (String, String) {
        (
            format!("{}/routed/{{event_type}}", self.prefix),
            format!("{}/routed/InvoiceCreated", self.prefix),
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
        self.subscriber.abort();
    }
}
