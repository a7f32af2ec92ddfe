//! The slot's reader and its two helpers: the heartbeat that keeps the slot moving while the
//! outbox is idle, and the lag check that feeds the metrics and the alert.
//!
//! The replication protocol and pgoutput decoding are pg_walstream's: of the crates that speak
//! them (pgwire-replication, pgoutput, the unpublished rust-postgres forks), it is the one kept
//! up to date that decodes pgoutput including logical messages (the heartbeat), sends standby
//! status updates from positions the consumer confirms (never on its own), and connects over
//! rustls without libpq. sqlx, which every other query uses, cannot open a replication
//! connection.

use std::sync::Arc;
use std::time::Duration;

use pg_walstream::{
    CancellationToken, EventType, LogicalReplicationStream, ReplicationError,
    ReplicationStreamConfig, RetryConfig, StreamingMode,
};
use postbox::{SchemaName, backoff::Backoff};
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tracing::{error, info, warn};

use crate::config::CdcConfig;
use crate::progress::{Key, Progress};

/// The prefix of the relay's heartbeat messages in the WAL.
const HEARTBEAT: &str = "postbox-heartbeat";

/// How many ids of a transaction the reader hands to claims before its commit arrives. The
/// server sends a transaction only once it has committed, so its rows may be taken at once: a
/// transaction of a million inserts starts publishing as soon as its first ids are decoded,
/// not once all of them are.
const HAND_OVER: usize = 1_000;

/// Metric names (documented in docs/cdc.md).
pub(crate) mod metric {
    /// 1 while the slot is read, 0 while the polling claim carries the load.
    pub(crate) const STREAMING: &str = "postbox_cdc_streaming";
    /// Outbox events the slot delivered.
    pub(crate) const EVENTS: &str = "postbox_cdc_events_total";
    /// WAL the slot holds back, in bytes.
    pub(crate) const LAG_BYTES: &str = "postbox_cdc_slot_lag_bytes";
    /// Seconds the confirmed position trails the server.
    pub(crate) const LAG_SECONDS: &str = "postbox_cdc_slot_lag_seconds";
    /// WAL the slot may still hold before `max_slot_wal_keep_size` invalidates it.
    pub(crate) const SAFE_WAL: &str = "postbox_cdc_slot_safe_wal_bytes";
    /// WAL the server keeps for the slot (from its `restart_lsn`), in bytes.
    pub(crate) const KEPT_BYTES: &str = "postbox_cdc_slot_kept_bytes";
    /// 1 while the slot's confirmed position has not moved for a minute while WAL grew.
    pub(crate) const STALLED: &str = "postbox_cdc_slot_stalled";
}

/// What the reader needs.
pub(crate) struct Stream {
    pub(crate) url: String,
    pub(crate) config: CdcConfig,
    pub(crate) schema: SchemaName,
    pub(crate) pool: PgPool,
    pub(crate) progress: Arc<Progress>,
    pub(crate) cancel: CancellationToken,
}

/// Starts the reader, the heartbeat, the tenants' outboxes in the publication and the lag
/// check.
pub(crate) fn spawn(stream: Stream) -> Vec<JoinHandle<()>> {
    let stream = Arc::new(stream);
    vec![
        tokio::spawn(read(Arc::clone(&stream))),
        tokio::spawn(heartbeat(Arc::clone(&stream))),
        tokio::spawn(crate::tenants::follow(Arc::clone(&stream))),
        tokio::spawn(lag(stream)),
    ]
}

/// Reads the slot until cancelled; when it breaks, the polling claim serves while it is opened
/// again (100 ms, doubling to 5 s between tries).
async fn read(s: Arc<Stream>) {
    let slot = s.config.slot.as_str();
    let mut retry = Backoff::new(Duration::from_millis(100), Duration::from_secs(5)).attempts();
    let gauge = metrics::gauge!(metric::STREAMING, "slot" => slot.to_owned());
    // Whether this relay said it waits as a standby (once per wait).
    let mut told = false;
    while !s.cancel.is_cancelled() {
        let result = read_once(&s, &mut retry).await;
        s.progress.stopped();
        gauge.set(0.0);
        let held = matches!(&result, Err(e) if e.to_string().contains("is active for PID"));
        if held && !std::mem::replace(&mut told, true) {
            warn!(
                slot,
                "the CDC slot is read by another relay: this one waits for it as a standby, and \
                 polls only if that relay stops confirming (a rolling deploy's new relay, or a \
                 second host)"
            );
        }
        told &= held;
        s.progress.set_standby(held);
        match result {
            Ok(Ended::Cancelled) => break,
            Ok(Ended::ServerLost) => warn!(
                slot,
                "the database stopped answering: the CDC relay lets go of the slot (a server \
                 shutdown waits for its readers) and reads it again once the server is back; the \
                 polling claim serves meanwhile"
            ),
            Err(e) => {
                let text = e.to_string();
                if text.contains("can no longer get changes") || text.contains("invalidated") {
                    error!(slot, error = %text,
                        "the CDC slot was invalidated (it held more WAL than max_slot_wal_keep_size \
                         allows): dropping it and creating a new one; events committed meanwhile \
                         are claimed by the polling claim");
                    drop_slot(&s).await;
                } else if text.contains("publication") && text.contains("does not exist") {
                    // The slot decodes with the catalog as it was at each change: past a DROP
                    // PUBLICATION it fails at the same change forever, even once the
                    // publication is back. A new slot starts past it.
                    error!(slot, publication = %s.config.publication, error = %text,
                        "the CDC publication was dropped: creating it again, and a new slot (the \
                         old one cannot read past the drop); events committed meanwhile are \
                         claimed by the polling claim");
                    if let Err(e) = crate::setup::prepare(&s.pool, &s.schema, &s.config).await {
                        warn!(slot, error = %e, "cannot create the publication again");
                    }
                    drop_slot(&s).await;
                } else if held {
                    // A standby (logged above, once).
                } else {
                    error!(slot, error = %text,
                        "the CDC slot cannot be read; the polling claim carries the load until it \
                         can (check the server's logs and pg_replication_slots)");
                }
            }
        }
        let wait = retry.next_delay();
        let released = async {
            if held {
                released(&s, wait.max(STANDBY_LOOK)).await;
            } else {
                tokio::time::sleep(wait).await;
            }
        };
        tokio::select! {
            () = s.cancel.cancelled() => break,
            () = released => {}
        }
    }
}

/// How often a standby looks whether the reader let the slot go.
const STANDBY_LOOK: Duration = Duration::from_millis(100);

/// A standby waits until the slot is let go (its reader stopped: a rolling deploy's old pod),
/// or for `longest`. It looks every [`STANDBY_LOOK`] with a plain query on its pool: trying the
/// slot that often would start a replication connection, a server process, each time; waiting
/// out the retry's backoff (up to 5 s) left events unpublished that long after a handover.
async fn released(s: &Stream, longest: Duration) {
    let until = tokio::time::Instant::now() + longest;
    while tokio::time::Instant::now() < until {
        tokio::time::sleep(STANDBY_LOOK).await;
        let held = crate::setup::slot_held(&s.pool, &s.config.slot).await;
        if !held.unwrap_or(true) {
            return;
        }
    }
}

/// Drops the slot nobody reads any more (it cannot be read past where it broke); the next
/// read creates a new one at the current WAL position.
async fn drop_slot(s: &Stream) {
    if let Err(e) = sqlx::query(include_str!("../sql/slot_drop.sql"))
        .bind(&s.config.slot)
        .execute(&s.pool)
        .await
    {
        warn!(slot = %s.config.slot, error = %e, "cannot drop the slot");
    }
}

/// Why a replication connection ended without an error of its own.
enum Ended {
    /// The relay stops.
    Cancelled,
    /// The relay's other connections found the database going away ([`Progress::server_lost`]).
    ServerLost,
}

/// Whether `e` says the database is shutting down, restarting or out of reach, rather than
/// that one statement failed.
pub(crate) fn server_lost(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => true,
        // Class 57: operator intervention (admin_shutdown, crash_shutdown, cannot_connect_now);
        // class 08: connection exception.
        sqlx::Error::Database(d) => d
            .code()
            .is_some_and(|c| c.starts_with("57P") || c.starts_with("08")),
        _ => false,
    }
}

/// One replication connection, from the slot's confirmed position, until it breaks (`Err`),
/// the relay stops or the database goes away (`Ok`).
async fn read_once(
    s: &Stream,
    retry: &mut postbox::backoff::Attempts,
) -> Result<Ended, ReplicationError> {
    let slot = s.config.slot.as_str();
    let config = ReplicationStreamConfig::builder(slot, s.config.publication.as_str())
        .with_protocol_version(1)
        .with_streaming_mode(StreamingMode::Off)
        .with_messages(true)
        .with_feedback_interval(Duration::from_millis(200))
        .with_connection_timeout(Duration::from_secs(10))
        .with_retry_config(RetryConfig {
            max_attempts: 1,
            ..RetryConfig::default()
        });
    let mut stream = LogicalReplicationStream::new(&replication_url(&s.url), config).await?;
    stream.start(None).await?;
    s.progress.restart(Arc::clone(&stream.shared_lsn_feedback));
    metrics::gauge!(metric::STREAMING, "slot" => slot.to_owned()).set(1.0);
    retry.reset();
    info!(slot, publication = %s.config.publication, "CDC relay reading the slot");
    let events = metrics::counter!(metric::EVENTS, "slot" => slot.to_owned());
    // The outboxes served, by schema: this reader's copy, read again when they change.
    let (mut served_version, mut served) = s.progress.served_all();
    let mut ids: Vec<Key> = Vec::new();
    loop {
        // A `Notified` hears `notify_waiters` from the moment it is made, polled or not.
        let lost = s.progress.lost.notified();
        let event = tokio::select! {
            event = stream.next_event(&s.cancel) => event,
            () = lost => return Ok(Ended::ServerLost),
        };
        let event = match event {
            Ok(event) => event,
            Err(ReplicationError::Cancelled(_)) => {
                let _ = stream.stop().await;
                return Ok(Ended::Cancelled);
            }
            Err(e) => return Err(e),
        };
        match event.event_type {
            EventType::Begin { .. } => {
                ids.clear();
                s.progress.begin();
            }
            EventType::Insert {
                schema: ref in_schema,
                ref table,
                ref data,
                ..
            } if &**table == "outbox_events" => {
                if s.progress.served_version() != served_version {
                    (served_version, served) = s.progress.served_all();
                }
                // An outbox the relay does not serve (a suspended tenant's, another
                // deployment's on a shared publication) is left to its own claims.
                let Some(&sid) = served.get(&**in_schema) else {
                    stream.maybe_send_feedback().await;
                    continue;
                };
                match data
                    .get("id")
                    .and_then(|v| v.as_str())
                    .and_then(|v| v.parse::<i64>().ok())
                {
                    Some(id) => {
                        ids.push((sid, id));
                        if ids.len() >= HAND_OVER {
                            events.increment(ids.len() as u64);
                            s.progress.delivered(std::mem::take(&mut ids));
                        }
                    }
                    None => warn!(
                        slot,
                        "an outbox insert without a readable id; the polling claim takes it"
                    ),
                }
            }
            EventType::Commit { end_lsn, .. } => {
                events.increment(ids.len() as u64);
                s.progress
                    .committed(end_lsn.value(), std::mem::take(&mut ids));
            }
            EventType::Message { ref prefix, .. } if &**prefix == HEARTBEAT => {
                s.progress.passed(event.lsn.value());
            }
            _ => {}
        }
        stream.maybe_send_feedback().await;
    }
}

/// `url` as a replication connection to its database.
fn replication_url(url: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}replication=database")
}

/// Writes a heartbeat into the WAL every `heartbeat`.
async fn heartbeat(s: Arc<Stream>) {
    let mut every = tokio::time::interval(s.config.heartbeat);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = s.cancel.cancelled() => return,
            _ = every.tick() => {}
        }
        if let Err(e) = sqlx::query(include_str!("../sql/heartbeat.sql"))
            .execute(&s.pool)
            .await
        {
            if server_lost(&e) {
                s.progress.server_lost();
            }
            warn!(slot = %s.config.slot, error = %e,
                "cannot write the CDC heartbeat; the slot advances only with outbox events meanwhile");
        }
    }
}

/// Reads the slot's lag and the WAL the server keeps for it into the metrics every `lag_check`;
/// logs an error when the WAL kept passes `lag_alert` (naming the open transaction that holds
/// it), and when the confirmed position has not moved for `stall_after` while the WAL grew.
async fn lag(s: Arc<Stream>) {
    let slot = s.config.slot.as_str();
    let mut every = tokio::time::interval(s.config.lag_check);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The confirmed position last seen, and when it was first seen there.
    let mut still: Option<(i64, std::time::Instant)> = None;
    // What the server keeps for the slot is read as `postbox status` reads it.
    let store = postbox::PgStore::new(s.pool.clone());
    loop {
        tokio::select! {
            () = s.cancel.cancelled() => return,
            _ = every.tick() => {}
        }
        let row: Result<Option<SlotLag>, _> = sqlx::query_as(include_str!("../sql/slot_lag.sql"))
            .bind(slot)
            .fetch_optional(&s.pool)
            .await;
        let Ok(Some(lag)) = row else {
            continue;
        };
        // What the server keeps for the slot, and the transaction that holds it.
        let slots = postbox::ops::StoreOps::replication_slots(&store)
            .await
            .unwrap_or_default();
        let kept_by = slots.into_iter().find(|k| k.name == slot);
        let pin = kept_by.as_ref().and_then(|k| k.pinned_by.as_ref());
        let bytes = u64::try_from(lag.lag_bytes.unwrap_or(0)).unwrap_or(0);
        let kept = (kept_by.as_ref())
            .and_then(|k| k.kept_bytes)
            .map_or(bytes, |k| u64::try_from(k).unwrap_or(0));
        metrics::gauge!(metric::LAG_BYTES, "slot" => slot.to_owned()).set(bytes as f64);
        metrics::gauge!(metric::KEPT_BYTES, "slot" => slot.to_owned()).set(kept as f64);
        metrics::gauge!(metric::LAG_SECONDS, "slot" => slot.to_owned())
            .set(lag.lag_seconds.unwrap_or(0.0));
        if let Some(safe) = lag.safe_wal_size {
            metrics::gauge!(metric::SAFE_WAL, "slot" => slot.to_owned()).set(safe as f64);
        }
        if kept.max(bytes) > s.config.lag_alert || lag.wal_status.as_deref() == Some("unreserved") {
            match pin {
                Some(pin) => error!(slot, kept_bytes = kept, lag_bytes = bytes,
                    wal_status = ?lag.wal_status, pid = pin.pid, database = ?pin.database,
                    application = ?pin.application, open_secs = pin.age_secs.round(),
                    "the server keeps more WAL for the CDC slot than the alert allows, held by an \
                     open transaction: the slot cannot pass it until it ends (`postbox status` \
                     shows its query; end it with SELECT pg_terminate_backend(pid); see \
                     docs/cdc.md, max_slot_wal_keep_size)"),
                None => error!(slot, kept_bytes = kept, lag_bytes = bytes,
                    wal_status = ?lag.wal_status, active = lag.active,
                    "the server keeps more WAL for the CDC slot than the alert allows, until \
                     the slot advances (is the relay reading? see docs/cdc.md, \
                     max_slot_wal_keep_size)"),
            }
        }
        let stalled = match (lag.confirmed_lsn, still) {
            (Some(at), Some((was, since))) if at == was => {
                since.elapsed() >= s.config.stall_after && bytes > 0
            }
            (Some(at), _) => {
                still = Some((at, std::time::Instant::now()));
                false
            }
            (None, _) => false,
        };
        metrics::gauge!(metric::STALLED, "slot" => slot.to_owned()).set(if stalled {
            1.0
        } else {
            0.0
        });
        s.progress.set_stalled(stalled);
        if stalled {
            error!(
                slot,
                lag_bytes = bytes,
                kept_bytes = kept,
                current_lsn = lag.current_lsn,
                stalled_secs = still.map_or(0, |(_, since)| since.elapsed().as_secs()),
                "the CDC slot's confirmed position has not moved while the server's WAL grew: \
                 the relay is not recording what the slot delivers (see its errors), or \
                 nobody reads the slot"
            );
        }
    }
}

#[derive(sqlx::FromRow)]
struct SlotLag {
    lag_bytes: Option<i64>,
    lag_seconds: Option<f64>,
    wal_status: Option<String>,
    safe_wal_size: Option<i64>,
    active: bool,
    confirmed_lsn: Option<i64>,
    current_lsn: Option<i64>,
}
