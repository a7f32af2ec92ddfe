//! A reader of every Redis stream under a key prefix of its own.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use tokio::task::JoinHandle;

use super::{Collector, MARKER, Received};

/// The Redis server the reader reads from.
pub const SERVER: &str = "127.0.0.1:6379";

/// A reader of every stream under `<prefix>:`, polling them with `XRANGE`, that collects each
/// entry: the stream key as `destination`, the `payload` field parsed as `body` (and as text in
/// `extra["payload"]`), the other fields as headers, the entry id in `extra["entry_id"]`, and a
/// field given twice named in `extra["duplicate_field"]`.
pub struct RedisStreams {
    /// The keys' prefix: streams are `<prefix>:…`.
    pub prefix: String,
    /// What the reader received.
    pub collector: Arc<Collector>,
    /// A direct (unproxied) connection.
    pub connection: MultiplexedConnection,
    reader: JoinHandle<()>,
}

/// A direct (unproxied) connection to [`SERVER`].
pub async fn connect() -> MultiplexedConnection {
    redis::Client::open(format!("redis://{SERVER}"))
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("Redis is not reachable at {SERVER}: {e}"))
}

/// Entries of `key` after `after` (exclusive; empty: from the start), as (id, fields in order).
async fn entries(
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

impl RedisStreams {
    /// Starts reading the streams under a prefix of its own.
    pub async fn start() -> RedisStreams {
        let prefix = format!("postbox_test_{}", super::suffix());
        let connection = connect().await;
        let collector = Arc::new(Collector::default());
        let sink = Arc::clone(&collector);
        let mut reader_connection = connection.clone();
        let pattern = format!("{prefix}:*");
        let reader = tokio::spawn(async move {
            let mut last: HashMap<String, String> = HashMap::new();
            loop {
                let keys: Vec<String> = redis::cmd("KEYS")
                    .arg(&pattern)
                    .query_async(&mut reader_connection)
                    .await
                    .unwrap_or_default();
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
                        sink.push(received);
                        last.insert(key.clone(), id);
                    }
                }
                // A poll of the streams, which signal nothing to a reader of keys not known up
                // front; the test's own wait bounds it.
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
        });
        RedisStreams {
            prefix,
            collector,
            connection,
            reader,
        }
    }

    /// Waits until every id of `ids` arrived, then for a marker behind them on each stream
    /// they arrived on (see [the module](super)); returns what arrived, markers left out.
    /// Call it once the publisher is done.
    pub async fn received(&self, ids: &[i64], within: Duration) -> Vec<Received> {
        super::behind_markers(&self.collector, ids, within, "", |key, _, id| {
            let mut connection = self.connection.clone();
            async move {
                let _: String = redis::cmd("XADD")
                    .arg(&key)
                    .arg("*")
                    .arg("postbox-event-id")
                    .arg(id)
                    .arg(MARKER)
                    .arg("1")
                    .arg("payload")
                    .arg("{}")
                    .query_async(&mut connection)
                    .await
                    .expect("add a marker");
            }
        })
        .await
    }

    /// Stops reading and deletes the streams under the prefix.
    pub async fn cleanup(mut self) {
        self.reader.abort();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}:*", self.prefix))
            .query_async(&mut self.connection)
            .await
            .unwrap_or_default();
        if !keys.is_empty() {
            let _: Result<(), _> = redis::cmd("DEL")
                .arg(keys)
                .query_async(&mut self.connection)
                .await;
        }
    }
}
