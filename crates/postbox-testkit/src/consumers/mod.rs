//! Real consumers of the brokers on 127.0.0.1 — NATS JetStream (4222), RabbitMQ (5672,
//! guest/guest), Redis Streams (6379), Mosquitto (1883) — and a webhook endpoint of the test's
//! own, each on a stream, queue, key prefix or topic prefix with a random suffix, collecting what
//! arrives into a [`Collector`]. The sink conformance suite's harnesses consume with them, and so
//! do end-to-end tests of a relay publishing to the brokers.
//!
//! Each consumer's `received(ids, within)` waits until every id arrived, then (for the brokers)
//! publishes a marker behind them to each destination they arrived at and waits for the markers
//! too: a consumer of one destination receives in publish order, so once the markers are in,
//! anything more that was published there before the call (a repeat) is in as well — no guess at
//! how long a broker takes. Markers carry the [`MARKER`] header and are left out of what it
//! returns.
//!
//! ```ignore
//! let nats = postbox_testkit::consumers::NatsStream::start().await;
//! // … a relay publishes to `{nats.prefix}.…` and has finished …
//! let got = nats.received(&ids, std::time::Duration::from_secs(20)).await;
//! nats.cleanup().await;
//! ```

#![allow(
    clippy::unwrap_used,
    clippy::missing_panics_doc,
    reason = "test consumers fail loudly on the first unexpected error"
)]

use std::collections::{BTreeSet, HashSet};
use std::time::Duration;

pub use crate::sink_suite::{Collector, Received, suffix};

pub mod amqp;
pub mod mqtt;
pub mod nats;
pub mod redis;
pub mod webhook;

pub use amqp::AmqpQueue;
pub use mqtt::MqttTopics;
pub use nats::NatsStream;
pub use redis::RedisStreams;
pub use webhook::Webhook;

/// The header (field, property) of the markers a consumer publishes behind what it waits for.
pub const MARKER: &str = "postbox-test-marker";

/// Whether `r` is a marker a consumer published, not a message under test.
pub fn is_marker(r: &Received) -> bool {
    r.header(MARKER).is_some()
}

/// The destinations of what `collector` received so far (markers left out), with each one's
/// extra `key` (the AMQP exchange; empty elsewhere).
fn destinations(collector: &Collector, key: &str) -> BTreeSet<(String, String)> {
    collector
        .snapshot()
        .iter()
        .filter(|r| !is_marker(r))
        .map(|r| {
            (
                r.destination.clone(),
                r.extra.get(key).cloned().unwrap_or_default(),
            )
        })
        .collect()
}

/// Waits until every id of `ids` arrived at `collector` (or `within` passed); if they all did,
/// publishes a marker to each destination seen (with `publish(destination, extra key, marker
/// id)`), waits for the markers and asserts they arrived. Returns what arrived, markers left
/// out.
async fn behind_markers<F, Fut>(
    collector: &Collector,
    ids: &[i64],
    within: Duration,
    key: &str,
    mut publish: F,
) -> Vec<Received>
where
    F: FnMut(String, String, i64) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let got = collector.wait_for_ids(ids, within).await;
    let seen: HashSet<i64> = got.iter().filter_map(Received::event_id).collect();
    if ids.iter().all(|id| seen.contains(id)) {
        let mut markers = Vec::new();
        for (destination, extra) in destinations(collector, key) {
            let id = crate::sink_suite::event_id();
            publish(destination, extra, id).await;
            markers.push(id);
        }
        let got = collector.wait_for_ids(&markers, within).await;
        let seen: HashSet<i64> = got.iter().filter_map(Received::event_id).collect();
        for marker in &markers {
            assert!(
                seen.contains(marker),
                "marker {marker} did not arrive within {within:?}: {got:?}"
            );
        }
    }
    collector
        .snapshot()
        .into_iter()
        .filter(|r| !is_marker(r))
        .collect()
}
