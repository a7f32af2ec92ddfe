//! Kafka harnesses: a librdkafka mock cluster of its own, topics created up front, a consumer on
//! the same cluster ("broker down" sets the mock brokers down); and the same on a real broker
//! (tansu) of its own.
//!
//! The mock cluster handle is not `Send`, so it lives on a thread of its own that takes commands.
//!
//! Its consumer stays here rather than with the other brokers' in `postbox_testkit::consumers`:
//! there it would drag rdkafka (librdkafka, built from source) into the testkit.

use std::sync::{Arc, mpsc};
use std::thread;
use std::time::Duration;

use postbox::OutboxEvent;
use postbox_sinks::{KafkaConfig, KafkaSink};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Headers, Message};
use rdkafka::mocking::MockCluster;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tokio::task::JoinHandle;

use postbox_testkit::tansu::Tansu;

use super::{Collector, Harness, Received};

pub(crate) enum Command {
    Down,
    /// Delay every broker answer by far more than any publish timeout.
    Stall,
    /// No delay, and every connection dropped once so no delayed answer blocks the next ones.
    Up,
    ProduceErrors(Vec<RDKafkaRespErr>),
}

/// A mock cluster running on its own thread; dropped with this handle.
pub(crate) struct Mock {
    pub(crate) bootstrap: String,
    commands: mpsc::Sender<(Command, mpsc::Sender<()>)>,
}

impl Mock {
    pub(crate) fn start(topics: Vec<String>) -> Mock {
        let (ready_tx, ready_rx) = mpsc::channel();
        let (commands, commands_rx) = mpsc::channel::<(Command, mpsc::Sender<()>)>();
        thread::spawn(move || {
            let cluster = MockCluster::new(1).expect("mock cluster");
            for topic in &topics {
                cluster.create_topic(topic, 1, 1).expect("create topic");
            }
            ready_tx.send(cluster.bootstrap_servers()).expect("ready");
            while let Ok((command, done)) = commands_rx.recv() {
                match command {
                    Command::Down => cluster.broker_down(-1).expect("broker down"),
                    Command::Stall => cluster
                        .broker_round_trip_time(-1, Duration::from_secs(30))
                        .expect("broker rtt"),
                    Command::Up => {
                        cluster
                            .broker_round_trip_time(-1, Duration::ZERO)
                            .expect("broker rtt");
                        cluster.broker_down(-1).expect("broker down");
                        cluster.broker_up(-1).expect("broker up");
                    }
                    Command::ProduceErrors(errors) => {
                        cluster.request_errors(RDKafkaApiKey::Produce, &errors);
                    }
                }
                let _ = done.send(());
            }
        });
        let bootstrap = ready_rx.recv().expect("mock cluster started");
        Mock {
            bootstrap,
            commands,
        }
    }

    pub(crate) fn command(&self, command: Command) {
        let (done, wait) = mpsc::channel();
        self.commands.send((command, done)).expect("mock thread");
        wait.recv().expect("mock command done");
    }
}

pub(crate) struct KafkaHarness {
    pub(crate) sink: KafkaSink,
    pub(crate) mock: Mock,
    pub(crate) prefix: String,
    collector: Arc<Collector>,
    consumer: JoinHandle<()>,
}

pub(crate) fn sink_config(bootstrap: &str, prefix: &str, publish_timeout: Duration) -> KafkaConfig {
    let mut config = KafkaConfig::new(
        bootstrap,
        format!("{prefix}.{{aggregate_type}}.{{event_type}}")
            .parse()
            .expect("template"),
    );
    config.publish_timeout = publish_timeout;
    config.connect_timeout = Duration::from_secs(5);
    for (k, v) in [
        ("reconnect.backoff.ms", "20"),
        ("reconnect.backoff.max.ms", "200"),
        ("retry.backoff.ms", "20"),
        ("retry.backoff.max.ms", "200"),
    ] {
        config.properties.insert(k.into(), v.into());
    }
    config
}

/// The topics of a harness whose topic names start with `prefix`.
fn topics(prefix: &str) -> Vec<String> {
    ["InvoiceCreated", "InvoicePaid"]
        .iter()
        .map(|t| format!("{prefix}.Invoice.{t}"))
        .collect()
}

/// The topic `event` goes to under the harnesses' template.
fn destination(prefix: &str, event: &OutboxEvent) -> String {
    format!(
        "{prefix}.{}.{}",
        event.aggregate_type.as_deref().unwrap_or_default(),
        event.event_type
    )
}

/// The other topic the consumer reads, as a route's template and as rendered.
fn other_destination(prefix: &str) -> (String, String) {
    (
        format!("{prefix}.{{aggregate_type}}.InvoicePaid"),
        format!("{prefix}.Invoice.InvoicePaid"),
    )
}

/// A consumer of `topics` (partition 0, from the beginning) on `bootstrap`, collecting what it
/// reads; it keeps asking while the brokers are away.
fn consume(bootstrap: &str, prefix: &str, topics: &[String]) -> (Arc<Collector>, JoinHandle<()>) {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", prefix)
        .set("enable.auto.commit", "false")
        .set("reconnect.backoff.max.ms", "200")
        .create()
        .expect("consumer");
    let mut assignment = TopicPartitionList::new();
    for topic in topics {
        assignment
            .add_partition_offset(topic, 0, Offset::Beginning)
            .expect("assign");
    }
    consumer.assign(&assignment).expect("assign");
    let collector = Arc::new(Collector::default());
    let sink_collector = collector.clone();
    let task = tokio::spawn(async move {
        loop {
            let message = match consumer.recv().await {
                Ok(message) => message,
                Err(_) => {
                    // A pause before asking again after an error (the brokers may be down):
                    // nothing signals that they are back.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            };
            let mut received = Received {
                destination: message.topic().to_owned(),
                body: serde_json::from_slice(message.payload().unwrap_or_default())
                    .unwrap_or_default(),
                key: message
                    .key()
                    .map(|k| String::from_utf8_lossy(k).into_owned()),
                ..Received::default()
            };
            if let Some(headers) = message.headers() {
                for header in headers.iter() {
                    received.headers.insert(
                        header.key.to_owned(),
                        String::from_utf8_lossy(header.value.unwrap_or_default()).into_owned(),
                    );
                }
            }
            sink_collector.push(received);
        }
    });
    (collector, task)
}

impl Harness for KafkaHarness {
    type Sink = KafkaSink;

    async fn start(publish_timeout: Duration) -> Self {
        let prefix = format!("postbox_test_{}", super::suffix());
        let topics = topics(&prefix);
        let mock = Mock::start(topics.clone());
        let (collector, consumer) = consume(&mock.bootstrap, &prefix, &topics);
        let sink = KafkaSink::connect(sink_config(&mock.bootstrap, &prefix, publish_timeout))
            .await
            .expect("connect sink");
        KafkaHarness {
            sink,
            mock,
            prefix,
            collector,
            consumer,
        }
    }

    fn sink(&self) -> &KafkaSink {
        &self.sink
    }

    fn collector(&self) -> &Collector {
        &self.collector
    }

    fn expected_destination(&self, event: &OutboxEvent) -> String {
        destination(&self.prefix, event)
    }

    fn other_destination(&self) -> (String, String) {
        other_destination(&self.prefix)
    }

    async fn broker_down(&self) {
        self.mock.command(Command::Down);
    }

    async fn stall_acks(&self) {
        self.mock.command(Command::Stall);
    }

    async fn broker_up(&self) {
        self.mock.command(Command::Up);
    }

    fn check_specific(&self, event: &OutboxEvent, got: &Received) {
        assert_eq!(got.key, event.aggregate_id, "key = aggregate id");
    }

    async fn cleanup(self) {
        self.consumer.abort();
    }
}

/// Kafka harness on a real broker: a tansu process of its own (`postbox_testkit::tansu`), its
/// topics created up front, a consumer on it. "Broker down" kills the process, "stalled" stops
/// it (`SIGSTOP`), "up" starts it again on the same port and storage, or lets it go on.
pub(crate) struct TansuHarness {
    pub(crate) sink: KafkaSink,
    broker: tokio::sync::Mutex<Tansu>,
    pub(crate) prefix: String,
    collector: Arc<Collector>,
    consumer: JoinHandle<()>,
    stalled: std::sync::atomic::AtomicBool,
}

impl Harness for TansuHarness {
    type Sink = KafkaSink;

    async fn start(publish_timeout: Duration) -> Self {
        let broker = Tansu::start().await;
        let prefix = format!("postbox_test_{}", super::suffix());
        let topics = topics(&prefix);
        for topic in &topics {
            broker.create_topic(topic, 1);
        }
        let (collector, consumer) = consume(&broker.bootstrap(), &prefix, &topics);
        let sink = KafkaSink::connect(sink_config(&broker.bootstrap(), &prefix, publish_timeout))
            .await
            .unwrap_or_else(|e| panic!("connect sink: {e}\n{}", broker.log()));
        TansuHarness {
            sink,
            broker: tokio::sync::Mutex::new(broker),
            prefix,
            collector,
            consumer,
            stalled: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn sink(&self) -> &KafkaSink {
        &self.sink
    }

    fn collector(&self) -> &Collector {
        &self.collector
    }

    fn expected_destination(&self, event: &OutboxEvent) -> String {
        destination(&self.prefix, event)
    }

    fn other_destination(&self) -> (String, String) {
        other_destination(&self.prefix)
    }

    async fn broker_down(&self) {
        self.broker.lock().await.kill();
    }

    async fn stall_acks(&self) {
        self.broker.lock().await.stall();
        self.stalled
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    async fn broker_up(&self) {
        let mut broker = self.broker.lock().await;
        if self
            .stalled
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            broker.resume();
        } else {
            broker.restart().await;
        }
    }

    fn check_specific(&self, event: &OutboxEvent, got: &Received) {
        assert_eq!(got.key, event.aggregate_id, "key = aggregate id");
    }

    async fn cleanup(self) {
        self.consumer.abort();
    }
}
