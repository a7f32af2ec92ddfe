//! A consumer in Rust: reads a Redis stream that `postbox relay --sink redis` publishes to,
//! through a consumer group, and applies each message's effect (a row of `ledger`) once, with
//! Postbox's [`Inbox`](postbox::inbox::Inbox): a batch's `receive` calls and its effects are one
//! PostgreSQL transaction, committed before the entries are acknowledged. A crash before the
//! commit leaves nothing and the entries are read again (the group's pending list); a crash after
//! it leaves them unacknowledged, and the repeats are skipped.
//!
//! ```text
//! cargo run -p postbox-cli --example inbox_consumer -- <database url> <stream> <group>
//! ```
//!
//! The database needs the outbox tables (`postbox migrate`) and
//! `CREATE TABLE ledger (dedup_id text NOT NULL, event_id bigint NOT NULL)`.
//! crates/postbox-cli/tests/cli/inbox.rs runs it and kills it 20 times.

use anyhow::{Context, bail};
use postbox::StoreExt;
use postbox::{PgStore, inbox::Received};
use redis::AsyncCommands as _;
use redis::streams::{StreamReadOptions, StreamReadReply};

/// The inbox's consumer name: one per consumer, shared by its instances.
const CONSUMER: &str = "ledger";
/// This instance's name in the Redis consumer group.
const WORKER: &str = "worker";

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, stream, group] = args.as_slice() else {
        bail!("usage: inbox_consumer <database url> <stream> <group>");
    };
    let pool = sqlx::PgPool::connect(url)
        .await
        .context("connect to PostgreSQL")?;
    let inbox = PgStore::new(pool.clone()).inbox(CONSUMER)?;
    let redis = redis::Client::open("redis://127.0.0.1:6379")?;
    let mut conn = redis.get_multiplexed_async_connection().await?;
    let created: redis::RedisResult<()> = conn.xgroup_create_mkstream(stream, group, "0").await;
    if let Err(e) = created
        && e.code() != Some("BUSYGROUP")
    {
        return Err(e.into());
    }

    // First what an earlier instance read and never acknowledged, then new entries.
    let mut start = "0";
    loop {
        let options = StreamReadOptions::default()
            .group(group, WORKER)
            .count(200)
            .block(200);
        let reply: StreamReadReply = conn
            .xread_options(&[stream.as_str()], &[start], &options)
            .await?;
        let entries: Vec<_> = reply.keys.into_iter().flat_map(|k| k.ids).collect();
        if entries.is_empty() {
            start = ">";
            continue;
        }
        let mut tx = pool.begin().await?;
        for entry in &entries {
            let fields: Vec<(String, String)> = entry
                .map
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), redis::from_redis_value_ref(v).ok()?)))
                .collect();
            let headers = fields.iter().map(|(k, v)| (k.as_str(), v.as_str()));
            let dedup_id = postbox_sinks::headers::dedup_id(headers)
                .with_context(|| format!("entry {} has no dedup id", entry.id))?;
            if inbox.receive(&mut *tx, dedup_id).await? == Received::New {
                let event_id: i64 = entry
                    .get::<String>(postbox_sinks::headers::EVENT_ID)
                    .and_then(|id| id.parse().ok())
                    .with_context(|| format!("entry {} has no event id", entry.id))?;
                sqlx::query("INSERT INTO ledger (dedup_id, event_id) VALUES ($1, $2)")
                    .bind(dedup_id)
                    .bind(event_id)
                    .execute(&mut *tx)
                    .await?;
            }
        }
        tx.commit().await?;
        let ids: Vec<&str> = entries.iter().map(|e| e.id.as_str()).collect();
        let _: i64 = conn.xack(stream, group, &ids).await?;
    }
}
