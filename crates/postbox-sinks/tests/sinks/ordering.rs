//! Per-aggregate ordering (G6) seen from a real broker's consumer side: producers commit the
//! events of 20 aggregates out of id order (transactions that linger after drawing their ids),
//! with rollbacks, while three relays publish them to Redis streams — one stream per aggregate —
//! through a sink that fails one try in seven. Each stream must hold exactly its aggregate's
//! committed events, each once, in id order. Needs PostgreSQL on 127.0.0.1:5432 and Redis on
//! 127.0.0.1:6379.

#![allow(clippy::unwrap_used, reason = "tests")]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use postbox::StoreExt;
use postbox::{
    Event, OutboxEvent, PgStore, PublishError, Relay, RelayConfig, Sink, backoff::Backoff,
};
use postbox_sinks::{RedisConfig, RedisSink};
use postbox_testkit::{TestDb, wait_until};

const REDIS: &str = "redis://127.0.0.1:6379";

/// The real sink, failing one try in `every` before it reaches Redis.
struct Intermittent {
    inner: RedisSink,
    calls: AtomicU64,
    every: u64,
}

#[async_trait]
impl Sink for Intermittent {
    async fn publish(&self, event: &OutboxEvent) -> Result<(), PublishError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) % self.every == self.every - 1 {
            return Err(PublishError::retryable("intermittent failure"));
        }
        self.inner.publish(event).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_aggregates_stream_holds_its_committed_events_once_in_order() {
    let db = TestDb::new().await;
    let store = PgStore::new(db.pool().clone());
    postbox::migrate(&store).await.unwrap();
    let prefix = format!("postbox_test_order_{}", uuid::Uuid::new_v4().simple());
    let mut config = RedisConfig::new(format!("{prefix}.{{aggregate_id}}").parse().unwrap());
    config.url = REDIS.to_owned();
    let sink = Arc::new(Intermittent {
        inner: RedisSink::connect(config)
            .await
            .unwrap_or_else(|e| panic!("Redis is not reachable at {REDIS}: {e}")),
        calls: AtomicU64::new(0),
        every: 7,
    });
    let relay_config = RelayConfig::default()
        .poll_interval(Duration::from_millis(50))
        .lease(Duration::from_secs(5))
        .publish_timeout(Duration::from_secs(2))
        .retry(Backoff::new(
            Duration::from_millis(5),
            Duration::from_millis(20),
        ))
        .ordered_aggregate_types(["Invoice"]);
    let relays: Vec<_> = (0..3)
        .map(|_| {
            let relay = Relay::from_parts(
                Arc::new(PgStore::new(db.pool().clone())),
                sink.clone(),
                relay_config.clone(),
            )
            .unwrap();
            relay.start()
        })
        .collect();

    let producers: Vec<_> = (0..4u64)
        .map(|p| {
            let pool = db.pool().clone();
            let outbox = store.outbox();
            tokio::spawn(async move {
                let mut committed = Vec::new();
                for i in 0..100u64 {
                    let aggregate = ((i * 7 + p * 3) % 20 + 1).to_string();
                    let mut tx = pool.begin().await.unwrap();
                    let event =
                        Event::new("InvoiceChanged", &serde_json::json!({ "p": p, "i": i }))
                            .unwrap()
                            .aggregate("Invoice", aggregate.as_str())
                            .without_idempotency_key()
                            // The sink's failures are deliberate: no event may run out of tries.
                            .max_retries(100);
                    let id = outbox.enqueue(&mut tx, event).await.unwrap().id().unwrap();
                    // 0-6 ms, the subject: producer jitter, so later ids commit first.
                    tokio::time::sleep(Duration::from_millis((p * 5 + i * 3) % 7)).await;
                    if i % 10 == 9 {
                        tx.rollback().await.unwrap();
                    } else {
                        tx.commit().await.unwrap();
                        committed.push((aggregate, id));
                    }
                }
                committed
            })
        })
        .collect();
    let mut expected: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for p in producers {
        for (aggregate, id) in p.await.unwrap() {
            expected.entry(aggregate).or_default().push(id);
        }
    }
    for ids in expected.values_mut() {
        ids.sort_unstable();
    }
    // On a timeout, say what the table holds: which events are not PROCESSED, and why.
    wait_until(
        "the 360 events are published",
        Duration::from_secs(60),
        || async {
            let processed: i64 =
                sqlx::query_scalar("SELECT count(*) FROM outbox_events WHERE status = 'PROCESSED'")
                    .fetch_one(db.pool())
                    .await
                    .unwrap();
            if processed == 360 {
                return Ok(());
            }
            let rest: Vec<(i64, String, String, i32, Option<String>)> = sqlx::query_as(
                "SELECT id, status, aggregate_id, retry_count, last_error FROM outbox_events
             WHERE status <> 'PROCESSED' ORDER BY id LIMIT 20",
            )
            .fetch_all(db.pool())
            .await
            .unwrap();
            Err(format!(
                "{processed} of 360 published; the first others: {rest:?}"
            ))
        },
    )
    .await;
    for relay in relays {
        relay.stop().await.unwrap();
    }

    let mut redis = redis::Client::open(REDIS)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    for (aggregate, ids) in &expected {
        let key = format!("{prefix}.{aggregate}");
        let raw: Vec<(String, Vec<String>)> = redis::cmd("XRANGE")
            .arg(&key)
            .arg("-")
            .arg("+")
            .query_async(&mut redis)
            .await
            .unwrap();
        let seen: Vec<i64> = raw
            .iter()
            .map(|(_, fields)| {
                let at = fields
                    .chunks(2)
                    .find(|kv| kv[0] == "postbox-event-id")
                    .expect("the event id field");
                at[1].parse().unwrap()
            })
            .collect();
        assert_eq!(
            &seen, ids,
            "stream {key}: the committed events, once each, in id order"
        );
        let _: () = redis::cmd("DEL")
            .arg(&key)
            .query_async(&mut redis)
            .await
            .unwrap();
    }
}
