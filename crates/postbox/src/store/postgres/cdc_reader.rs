//! A polling relay beside a CDC relay: while a CDC relay reads the default schema's outbox from
//! a replication slot and keeps confirming, a polling claim of that schema leaves its events to
//! it. Both would otherwise take every new event at the same moment — the CDC relay publishes
//! what it reads without a claim, which a poller cannot see — and publish a large share of all
//! traffic twice (half of it, one event at a time). The CDC relay polls for everything else
//! itself (retries, expired leases, what the slot did not deliver), so nothing waits; if it
//! stops (its replication connection ends), pollers claim again within a second; if its
//! confirmation stands still for a minute while the server's WAL grows, they claim beside it.
//! A CDC relay records its slot in the default schema's `postbox_cdc_slots` (migration
//! 0020_registry_cdc_slots); a slot there that a reader holds (`active`) is a CDC relay reading.
//! It reads the active tenants' outboxes too, once it has added their tables to its
//! publication: a tenant's claim leaves its events to the reader while a publication holds its
//! outbox table.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::postgres::PgPool;

use super::sql::{render, safe};
use crate::schema::SchemaName;

/// How often the poller looks whether a CDC relay reads.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// How long a reader's confirmation may stand still while the WAL grows before pollers claim
/// beside it (the CDC relay's own `stall_after`).
const STALLED_AFTER: Duration = Duration::from_secs(60);

/// What the last look found.
#[derive(Clone)]
struct Seen {
    at: Instant,
    /// Whether pollers leave the schema's events to the reader.
    leave: bool,
    /// The reader's confirmed position, and since when it has not moved.
    confirmed: Option<(i64, Instant)>,
    /// The schemas whose outbox table a publication holds: the tenants the reader serves.
    published: Arc<HashSet<String>>,
}

/// Whether to leave a schema's events to a CDC relay, looked up at most every second.
pub(crate) struct CdcReader {
    /// `cdc_reader.sql` for the schema.
    sql: std::sync::Arc<str>,
    seen: Mutex<Option<Seen>>,
}

impl CdcReader {
    /// Looks for CDC relays reading `schema`'s outbox.
    pub(crate) fn new(schema: &SchemaName) -> Self {
        CdcReader {
            sql: render(
                include_str!("../../../sql/postgres/queries/cdc_reader.sql"),
                schema,
            ),
            seen: Mutex::default(),
        }
    }

    /// Whether a CDC relay reads the default schema's outbox now and keeps confirming, and so
    /// serves the outbox of `schema` (the default schema's, or a tenant's whose table its
    /// publication holds). A failed look (a schema migrated before `postbox_cdc_slots`, a role
    /// that may not read it) counts as none: the poll goes on.
    pub(crate) async fn serves(&self, pool: &PgPool, schema: &SchemaName, default: bool) -> bool {
        let seen = self.look(pool).await;
        seen.leave && (default || seen.published.contains(schema.as_str()))
    }

    async fn look(&self, pool: &PgPool) -> Seen {
        let last = self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(seen) = &last
            && seen.at.elapsed() < CHECK_EVERY
        {
            return seen.clone();
        }
        let row: Option<(i64, i64, Vec<String>)> = sqlx::query_as(safe(&self.sql))
            .fetch_optional(pool)
            .await
            .unwrap_or(None);
        let now = Instant::now();
        let (leave, confirmed, published) = match row {
            None => (false, None, HashSet::new()),
            Some((confirmed, wal, published)) => {
                let since = match last.as_ref().and_then(|s| s.confirmed) {
                    Some((before, since)) if before == confirmed => since,
                    _ => now,
                };
                let stalled = wal > confirmed && since.elapsed() >= STALLED_AFTER;
                (
                    !stalled,
                    Some((confirmed, since)),
                    published.into_iter().collect(),
                )
            }
        };
        let seen = Seen {
            at: now,
            leave,
            confirmed,
            published: Arc::new(published),
        };
        *self.seen.lock().unwrap_or_else(|e| e.into_inner()) = Some(seen.clone());
        seen
    }
}
