//! Redis Streams harness: stream keys under a prefix of its own, a reader polling them with
//! `XRANGE`, a proxy in front of the server.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use postbox::OutboxEvent;
use postbox_sinks::{RedisConfig, RedisSink};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use tokio::task::JoinHandle;

use super::proxy::Proxy;
use super::{Collector, Harness, Received};

pub(crate) const SERVER: &str = "127.0.0.1:6379";

pub(crate) struct RedisHarness {
    pub(crate) sink: RedisSink,
    pub(crate) connection: MultiplexedConnection,
    pub(crate) prefix: String,
    pub(crate) proxy: Proxy,
    collector: Arc<Collector>,
    reader: JoinHandle<()>,
}

pub(crate) async fn admin() -> MultiplexedConnection {
    redis::Client::open(format!("redis://{SERVER}"))
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("Redis is not reachable at {SERVER}: {e}"))
}

pub(crate) fn sink_config(proxy: &Proxy, template: &str, publish_timeout: Duration) -> RedisConfig {
    let mut config = RedisConfig::new(template.parse().expect("template"));
    config.url = format!("redis://{}", proxy.addr());
    config.publish_timeout = publish_timeout;
    config.connect_timeout = Duration::from_secs(2);
    config.reconnect_max_delay = Duration::from_millis(200);
    config
}

/// Entries of `key` after `after` (exclusive), as (id, fields in order).
pub(crate) async fn entries(
    connection: &mut MultiplexedConnection,
    key: &str,
    after: &str,
) -> Vec<(String, Vec<(String, String)>)> {
    let start = if after.is_empty() {
        "-".to_owned()
    } else {
        format!("({after}")
    };
    let raw: Vec<(String, Vec<String>)> = redis::cmd("XRANGE")
        .arg(key)
        .arg(start)
        .arg("+")
        .query_async(connection)
        .await
        .unwrap_or_default();
    raw.into_iter()
        .map(|(id, flat)| {
            let fields = flat
                .chunks(2)
                .map(|kv| (kv[0].clone(), kv.get(1).cloned().unwrap_or_default()))
                .collect();
            (id, fields)
        })
        .collect()
}

impl Harness for RedisHarness {
    type Sink = RedisSink;

    async fn start(publish_timeout: Duration) -> Self {
        let prefix = format!("postbox_test_{}", super::suffix());
        let connection = admin().await;
        let collector = Arc::new(Collector::default());
        let reader_collector = collector.clone();
        let mut reader_connection = connection.clone();
        let pattern = format!("{prefix}:*");
        let reader = tokio::spawn(async move {
            let mut last: HashMap<String, String> = HashMap::new();
            loop {
                let keys: Vec<String> = reader_connection.keys(&pattern).await.unwrap_or_default();
                for key in keys {
                    let after = last.get(&key).cloned().unwrap_or_default();
                    for (id, fields) in entries(&mut reader_connection, &key, &after).await {
                        let mut received = Received {
                            destination: key.clone(),
                            ..Received::default()
                        };
                        for (name, value) in fields {
                            if name == "payload" {
                                received.body = serde_json::from_str(&value).unwrap_or_default();
                                received.extra.insert("payload".into(), value);
                            } else if received.headers.insert(name.clone(), value).is_some() {
                                received.extra.insert("duplicate_field".into(), name);
                            }
                        }
                        received.extra.insert("entry_id".into(), id.clone());
                        reader_collector.push(received);
                        last.insert(key.clone(), id);
                    }
                }
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
        });
        let proxy = Proxy::start(SERVER.parse().expect("address")).await;
        let template = format!("{prefix}:{{aggregate_type}}:{{event_type}}");
        let sink = RedisSink::connect(sink_config(&proxy, &template, publish_timeout))
            .await
            .expect("connect sink");
        RedisHarness {
            sink,
            connection,
            prefix,
            proxy,
            collector,
            reader,
        }
    }

    fn sink(&self) -> &RedisSink {
        &self.sink
    }

    fn collector(&self) -> &Collector {
        &self.collector
    }

    fn expected_destination(&self, event: &OutboxEvent) -> String {
        format!(
            "{}:{}:{}",
            self.prefix,
            event.aggregate_type.as_deref().unwrap_or_default(),
            event.event_type
        )
    }

    fn other_destination(&self) -> (String, String) {
        (
            format!("{}:routed:{{event_type}}", self.prefix),
            format!("{}:routed:InvoiceCreated", self.prefix),
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

    async fn cleanup(mut self) {
        self.reader.abort();
        let keys: Vec<String> = self
            .connection
            .keys(format!("{}:*", self.prefix))
            .await
            .unwrap_or_default();
        if !keys.is_empty() {
            let _: Result<(), _> = self.connection.del(keys).await;
        }
    }
}
