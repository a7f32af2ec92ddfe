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

use std::sync::Mutex;
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
#[derive(Clone, Copy)]
struct Seen {
    at: Instant,
    /// Whether pollers leave the schema's events to the reader.
    leave: bool,
    /// The reader's confirmed position, and since when it has not moved.
    confirmed: Option<(i64, Instant)>,
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

    /// Whether a CDC relay reads the schema's outbox now and keeps confirming. A failed look
    /// (a schema migrated before `postbox_cdc_slots`, a role that may not read it) counts as
    /// none: the poll goes on.
    pub(crate) async fn reads(&self, pool: &PgPool) -> bool {
        let last = *self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(seen) = last
            && seen.at.elapsed() < CHECK_EVERY
        {
            return seen.leave;
        }
        let row: Option<(i64, i64)> = sqlx::query_as(safe(&self.sql))
            .fetch_optional(pool)
            .await
            .unwrap_or(None);
        let now = Instant::now();
        let (leave, confirmed) = match row {
            None => (false, None),
            Some((confirmed, wal)) => {
                let since = match last.and_then(|s| s.confirmed) {
                    Some((before, since)) if before == confirmed => since,
                    _ => now,
                };
                let stalled = wal > confirmed && since.elapsed() >= STALLED_AFTER;
                (!stalled, Some((confirmed, since)))
            }
        };
        *self.seen.lock().unwrap_or_else(|e| e.into_inner()) = Some(Seen {
            at: now,
            leave,
            confirmed,
        });
        leave
    }
}
