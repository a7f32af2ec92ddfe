//! What the broker received: the run's Redis stream, read as it fills (straight from Redis, not
//! through the proxy) and trimmed behind the reader, so a million-event run does not keep a
//! million entries in Redis.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use redis::streams::{StreamReadOptions, StreamReadReply, StreamTrimOptions, StreamTrimmingMode};
use tokio::sync::watch;
use tracing::warn;

/// The stream field with the event id, and the one with the payload (`postbox-sinks`).
const EVENT_ID_FIELD: &str = "postbox-event-id";
const PAYLOAD_FIELD: &str = "payload";

/// The deliveries of one event.
#[derive(Clone, Debug)]
pub(crate) struct Delivered {
    pub(crate) count: u32,
    /// Which entry of the stream (counted from 0) was its first delivery.
    pub(crate) first: u64,
    /// The marker of the payload of its first delivery.
    pub(crate) marker: Option<String>,
}

/// Everything read from the stream.
#[derive(Clone, Debug, Default)]
pub(crate) struct Deliveries {
    pub(crate) by_event: HashMap<i64, Delivered>,
    /// Stream entries read.
    pub(crate) entries: u64,
    /// Entries without a readable event id or marker, with a sample of them.
    pub(crate) malformed: u64,
    pub(crate) malformed_sample: Vec<String>,
    /// Events delivered with different payloads on different deliveries.
    pub(crate) inconsistent: u64,
}

impl Deliveries {
    fn add(&mut self, entry_id: &str, event_id: Option<i64>, marker: Option<String>) {
        let entry = self.entries;
        self.entries += 1;
        let (Some(event_id), Some(marker)) = (event_id, marker) else {
            self.malformed += 1;
            if self.malformed_sample.len() < 5 {
                self.malformed_sample.push(entry_id.to_owned());
            }
            return;
        };
        match self.by_event.get_mut(&event_id) {
            Some(d) => {
                d.count += 1;
                if d.marker.as_deref() != Some(marker.as_str()) {
                    self.inconsistent += 1;
                }
            }
            None => {
                self.by_event.insert(
                    event_id,
                    Delivered {
                        count: 1,
                        first: entry,
                        marker: Some(marker),
                    },
                );
            }
        }
    }
}

/// Reads the stream `key` until told to stop, then reads what is left and returns it all.
pub(crate) struct StreamReader {
    connection: MultiplexedConnection,
    key: String,
    last_id: String,
    deliveries: Deliveries,
}

impl StreamReader {
    /// Connects to Redis at `url`.
    pub(crate) async fn connect(url: &str, key: String) -> anyhow::Result<StreamReader> {
        let client = redis::Client::open(url).with_context(|| format!("Redis URL {url:?}"))?;
        let connection = tokio::time::timeout(
            Duration::from_secs(10),
            client.get_multiplexed_async_connection(),
        )
        .await
        .context("no connection to Redis within 10s")?
        .with_context(|| format!("connect to Redis at {url}"))?;
        Ok(StreamReader {
            connection,
            key,
            last_id: "0-0".to_owned(),
            deliveries: Deliveries::default(),
        })
    }

    /// Reads as entries arrive until `stop` turns true, then reads to the end of the stream.
    pub(crate) async fn follow(
        mut self,
        mut stop: watch::Receiver<bool>,
    ) -> anyhow::Result<Deliveries> {
        let mut errors = 0u32;
        loop {
            let stopping = *stop.borrow();
            match self.read_some().await {
                Ok(0) if stopping => return Ok(self.deliveries),
                Ok(0) => {
                    errors = 0;
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_millis(200)) => {}
                        _ = stop.changed() => {}
                    }
                }
                Ok(_) => errors = 0,
                Err(e) => {
                    // Redis itself is never a fault of the run; a few errors in a row are.
                    errors += 1;
                    if errors >= 20 {
                        return Err(e.context("reading the stream back failed 20 times in a row"));
                    }
                    warn!(error = %format!("{e:#}"), "reading the stream failed; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }

    /// Reads up to a page of entries after the last one read; returns how many.
    async fn read_some(&mut self) -> anyhow::Result<usize> {
        let options = StreamReadOptions::default().count(5_000);
        let reply: Option<StreamReadReply> = self
            .connection
            .xread_options(&[&self.key], &[&self.last_id], &options)
            .await
            .context("XREAD")?;
        let mut read = 0;
        for key in reply.map(|r| r.keys).unwrap_or_default() {
            for entry in key.ids {
                let event_id = entry
                    .get::<String>(EVENT_ID_FIELD)
                    .and_then(|v| v.parse::<i64>().ok());
                let marker = entry
                    .get::<String>(PAYLOAD_FIELD)
                    .and_then(|p| serde_json::from_str::<serde_json::Value>(&p).ok())
                    .and_then(|p| p.get("marker")?.as_str().map(str::to_owned));
                self.deliveries.add(&entry.id, event_id, marker);
                self.last_id = entry.id;
                read += 1;
            }
        }
        if read > 0 {
            // Entries before the last one read are counted: drop them from Redis.
            let trim = StreamTrimOptions::minid(StreamTrimmingMode::Exact, self.last_id.clone());
            let _: usize = self
                .connection
                .xtrim_options(&self.key, &trim)
                .await
                .context("XTRIM")?;
        }
        Ok(read)
    }

    /// Deletes the stream `key`.
    pub(crate) async fn remove(url: &str, key: &str) -> anyhow::Result<()> {
        let client = redis::Client::open(url)?;
        let mut connection = client.get_multiplexed_async_connection().await?;
        let _: usize = connection.del(key).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeats_count_and_mixed_payloads_are_caught() {
        let mut d = Deliveries::default();
        d.add("1-0", Some(7), Some("a".into()));
        d.add("2-0", Some(7), Some("a".into()));
        d.add("3-0", Some(8), Some("b".into()));
        d.add("4-0", Some(8), Some("c".into()));
        d.add("5-0", None, Some("d".into()));
        assert_eq!(d.entries, 5);
        assert_eq!(d.by_event[&7].count, 2);
        assert_eq!((d.by_event[&7].first, d.by_event[&8].first), (0, 2));
        assert_eq!(d.inconsistent, 1);
        assert_eq!(d.malformed, 1);
        assert_eq!(d.malformed_sample, vec!["5-0".to_owned()]);
    }
}
