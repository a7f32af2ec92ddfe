//! A NATS JetStream stream of its own with a pull consumer.

use std::sync::Arc;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, consumer, stream};
use futures::StreamExt;
use tokio::task::JoinHandle;

use super::{Collector, MARKER, Received};

/// The NATS server the consumer reads from.
pub const SERVER: &str = "127.0.0.1:4222";

/// A JetStream stream capturing `<prefix>.>`, read by a pull consumer that acknowledges every
/// message and collects it: the subject as `destination`, the first value of each header.
pub struct NatsStream {
    /// The subjects' prefix: publish to `<prefix>.…`.
    pub prefix: String,
    /// The stream's name.
    pub stream: String,
    /// What the consumer received.
    pub collector: Arc<Collector>,
    /// The JetStream context the stream was created with (unproxied).
    pub jetstream: jetstream::Context,
    consumer: JoinHandle<()>,
}

impl NatsStream {
    /// Creates a stream of its own (messages kept 10 minutes) and starts consuming it.
    pub async fn start() -> NatsStream {
        let suffix = super::suffix();
        let prefix = format!("postbox_test_{suffix}");
        let name = format!("POSTBOX_TEST_{suffix}");
        let client = async_nats::connect(SERVER)
            .await
            .unwrap_or_else(|e| panic!("NATS is not reachable at {SERVER}: {e}"));
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
        let sink = Arc::clone(&collector);
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
            stream: name,
            collector,
            jetstream,
            consumer,
        }
    }

    /// How many messages the stream holds.
    pub async fn message_count(&self) -> u64 {
        let mut stream = self
            .jetstream
            .get_stream(&self.stream)
            .await
            .expect("stream");
        stream.info().await.expect("stream info").state.messages
    }

    /// Waits until every id of `ids` arrived, then for a marker behind them on each subject
    /// they arrived on (see [the module](super)); returns what arrived, markers left out.
    /// Call it once the publisher is done.
    pub async fn received(&self, ids: &[i64], within: Duration) -> Vec<Received> {
        super::behind_markers(&self.collector, ids, within, "", |subject, _, id| {
            let jetstream = self.jetstream.clone();
            async move {
                let mut headers = HeaderMap::new();
                headers.insert("postbox-event-id", id.to_string().as_str());
                headers.insert(MARKER, "1");
                jetstream
                    .publish_with_headers(subject, headers, "{}".into())
                    .await
                    .expect("publish a marker")
                    .await
                    .expect("marker acknowledged");
            }
        })
        .await
    }

    /// Stops consuming and deletes the stream.
    pub async fn cleanup(self) {
        self.consumer.abort();
        let _ = self.jetstream.delete_stream(&self.stream).await;
    }
}
