//! A QoS 1 subscriber to a topic prefix of its own on Mosquitto.

use std::sync::Arc;
use std::time::Duration;

use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, PublishProperties};
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::{Collector, MARKER, Received};

/// The broker the subscriber reads from.
pub const BROKER: &str = "127.0.0.1:1883";

/// An MQTT 5 subscriber to `<prefix>/#` at QoS 1 that collects each message: the topic as
/// `destination`, the user properties as headers, the QoS and the content type in `extra`
/// (`qos`, `content_type`).
pub struct MqttTopics {
    /// The topics' prefix: publish to `<prefix>/…`.
    pub prefix: String,
    /// What the subscriber received.
    pub collector: Arc<Collector>,
    client: AsyncClient,
    subscriber: JoinHandle<()>,
}

impl MqttTopics {
    /// Subscribes under a prefix of its own; returns once the broker acknowledged the
    /// subscription.
    pub async fn start() -> MqttTopics {
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
        let sink = Arc::clone(&collector);
        let (subscribed_tx, subscribed) = oneshot::channel();
        let keep = client.clone();
        let subscriber = tokio::spawn(async move {
            // The event loop runs while a client is alive.
            let _client = keep;
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
                        sink.push(received);
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
        MqttTopics {
            prefix,
            collector,
            client,
            subscriber,
        }
    }

    /// Waits until every id of `ids` arrived, then for a marker behind them on each topic they
    /// arrived on (see [the module](super)); returns what arrived, markers left out. Call it
    /// once the publisher is done.
    pub async fn received(&self, ids: &[i64], within: Duration) -> Vec<Received> {
        super::behind_markers(
            &self.collector,
            ids,
            within,
            "",
            |topic, _, id| async move {
                let properties = PublishProperties {
                    user_properties: vec![
                        ("postbox-event-id".to_owned(), id.to_string()),
                        (MARKER.to_owned(), "1".to_owned()),
                    ],
                    ..PublishProperties::default()
                };
                self.client
                    .publish_with_properties(topic, QoS::AtLeastOnce, false, "{}", properties)
                    .await
                    .expect("publish a marker");
            },
        )
        .await
    }

    /// Stops the subscriber.
    pub fn cleanup(self) {
        self.subscriber.abort();
    }
}
