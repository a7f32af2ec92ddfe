//! Carries out the schedule: each fault at its time, undone after its hold, one at a time.

use std::time::{Duration, Instant};

use postbox_testkit::proxy::Proxy;
use rustix::process::Signal;
use serde::Serialize;
use sqlx::PgPool;
use tracing::{debug, info, warn};

use crate::fleet::Fleet;
use crate::schedule::{Fault, FaultKind, Lane, Schedule};
use postbox_testkit::cluster::Cluster;

/// How long a kill or pause waits for its relay to hold claimed events before striking anyway.
const STRIKE_WAIT: Duration = Duration::from_secs(5);

/// How long the next fault waits for a killed relay's replacement to be serving.
pub(crate) const READY_WAIT: Duration = Duration::from_secs(60);

/// What the kit can hurt, and the database it watches the relays through.
pub(crate) struct Targets<'a> {
    pub(crate) fleet: &'a Fleet,
    pub(crate) cluster: &'a Cluster,
    pub(crate) proxy: &'a Proxy,
    pub(crate) pool: &'a PgPool,
}

/// A fault as it was carried out.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Injected {
    pub(crate) fault: Fault,
    /// When it actually started and ended, from the start of the producers, in milliseconds.
    pub(crate) started_ms: u64,
    pub(crate) ended_ms: u64,
    /// Whether it hit anything (a kill or pause finds no relay while its slot is restarting).
    pub(crate) applied: bool,
    /// Relays running when it started: what a database restart or a broker fault can catch in
    /// flight.
    pub(crate) relays_running: u32,
    /// Kill, pause: the events the relay held under its lease just before the strike.
    pub(crate) in_flight: Option<i64>,
}

/// Runs every fault of `schedule` at its time from `start`, one after the other (or, when the
/// schedule overlaps, one lane after the other, the lanes side by side); the broker is up and
/// every relay running (or being replaced) when it returns.
pub(crate) async fn inject(
    schedule: &Schedule,
    start: Instant,
    targets: &Targets<'_>,
) -> anyhow::Result<Vec<Injected>> {
    let lane = |lane: Option<Lane>| {
        let faults: Vec<&Fault> = schedule
            .faults
            .iter()
            .filter(|f| lane.is_none_or(|l| f.kind.lane() == l))
            .collect();
        run_lane(faults, start, targets)
    };
    let mut done = if schedule.overlap {
        let (relays, database, broker) = tokio::join!(
            lane(Some(Lane::Relays)),
            lane(Some(Lane::Database)),
            lane(Some(Lane::Broker))
        );
        let mut done = relays?;
        done.extend(database?);
        done.extend(broker?);
        done
    } else {
        lane(None).await?
    };
    done.sort_by_key(|i| i.started_ms);
    Ok(done)
}

async fn run_lane(
    faults: Vec<&Fault>,
    start: Instant,
    targets: &Targets<'_>,
) -> anyhow::Result<Vec<Injected>> {
    let mut done = Vec::with_capacity(faults.len());
    for fault in faults {
        let due = start + fault.at;
        tokio::time::sleep_until(due.into()).await;
        let started = start.elapsed();
        let relays_running = targets.fleet.running();
        info!("fault: {fault}");
        let (applied, in_flight) = apply(fault, targets).await?;
        let ended = start.elapsed();
        if !applied {
            warn!("fault had nothing to hit: {fault}");
        }
        done.push(Injected {
            fault: fault.clone(),
            started_ms: started.as_millis() as u64,
            ended_ms: ended.as_millis() as u64,
            applied,
            relays_running,
            in_flight,
        });
    }
    Ok(done)
}

async fn apply(fault: &Fault, targets: &Targets<'_>) -> anyhow::Result<(bool, Option<i64>)> {
    match fault.kind {
        FaultKind::Kill => {
            let in_flight = mid_batch(targets, fault.relay).await;
            let killed = targets.fleet.tag(fault.relay);
            let applied = targets.fleet.kill(fault.relay, fault.hold);
            if applied
                && !targets
                    .fleet
                    .wait_serving(fault.relay, killed.as_deref(), READY_WAIT)
                    .await
            {
                warn!(
                    slot = fault.relay,
                    "the replacement relay is not serving yet"
                );
            }
            Ok((applied, in_flight))
        }
        FaultKind::Pause => {
            let in_flight = mid_batch(targets, fault.relay).await;
            let Some(pid) = targets.fleet.signal(fault.relay, Signal::STOP) else {
                return Ok((false, in_flight));
            };
            tokio::time::sleep(fault.hold).await;
            targets.fleet.resume(fault.relay, pid);
            Ok((true, in_flight))
        }
        FaultKind::PgRestart => {
            let unreachable = targets
                .cluster
                .restart(fault.immediate, fault.hold)
                .await
                .map_err(|e| {
                    anyhow::Error::new(e).context(format!(
                        "restarting the private PostgreSQL cluster failed (its log: {})",
                        targets.cluster.log().display()
                    ))
                })?;
            info!(?unreachable, "PostgreSQL is back");
            Ok((true, None))
        }
        FaultKind::BrokerStall => {
            targets.proxy.stall();
            tokio::time::sleep(fault.hold).await;
            targets.proxy.up();
            Ok((true, None))
        }
        FaultKind::BrokerDown => {
            targets.proxy.down();
            tokio::time::sleep(fault.hold).await;
            targets.proxy.up();
            Ok((true, None))
        }
        FaultKind::SlotDrop => {
            let dropped = drop_slot(targets.pool).await?;
            tokio::time::sleep(fault.hold).await;
            Ok((dropped, None))
        }
        FaultKind::LongTransaction => {
            let mut report = targets.pool.begin().await?;
            sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                .execute(&mut *report)
                .await?;
            sqlx::query("SELECT count(*) FROM outbox_events")
                .execute(&mut *report)
                .await?;
            tokio::time::sleep(fault.hold).await;
            // A PostgreSQL restart meanwhile (another lane's fault) ends it first.
            report.rollback().await.ok();
            Ok((true, None))
        }
    }
}

/// The slot `postbox relay --source cdc` reads by default.
pub(crate) const CDC_SLOT: &str = "postbox";

/// Ends the connection reading the CDC slot and drops the slot before its relay reconnects;
/// `false` when there was no slot to drop (the relays had not made it again yet).
async fn drop_slot(pool: &PgPool) -> anyhow::Result<bool> {
    for _ in 0..50 {
        sqlx::query(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
             WHERE slot_name = $1 AND active_pid IS NOT NULL",
        )
        .bind(CDC_SLOT)
        .execute(pool)
        .await?;
        match sqlx::query("SELECT pg_drop_replication_slot($1)")
            .bind(CDC_SLOT)
            .execute(pool)
            .await
        {
            Ok(_) => {
                info!(slot = CDC_SLOT, "replication slot dropped");
                return Ok(true);
            }
            Err(e) => match e.as_database_error().and_then(|d| d.code()).as_deref() {
                // In use again: its relay reconnected between the two statements.
                Some("55006") => tokio::time::sleep(Duration::from_millis(20)).await,
                Some("42704") => return Ok(false),
                _ => return Err(e.into()),
            },
        }
    }
    warn!(
        slot = CDC_SLOT,
        "the replication slot stayed in use; not dropped"
    );
    Ok(false)
}

/// Waits, up to `STRIKE_WAIT`, until the relay of `slot` holds claimed events, so that a kill or
/// a pause catches a batch in flight (an idle relay has nothing to lose, and nothing to fence).
/// Returns how many it held, if it was seen holding any.
async fn mid_batch(targets: &Targets<'_>, slot: u32) -> Option<i64> {
    let deadline = Instant::now() + STRIKE_WAIT;
    while Instant::now() < deadline {
        let tag = targets.fleet.tag(slot)?;
        let held: Result<i64, _> = sqlx::query_scalar(
            "SELECT count(*) FROM outbox_events \
             WHERE status = 'PROCESSING' AND locked_by LIKE $1 || '-%' AND locked_until > now()",
        )
        .bind(&tag)
        .fetch_one(targets.pool)
        .await;
        match held {
            Ok(n) if n > 0 => return Some(n),
            Ok(_) => {}
            Err(e) => debug!(error = %e, "cannot see the relay's claims"),
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    None
}

/// The most extra deliveries `fault` can cause, by G3 and at-least-once delivery.
///
/// - A killed relay's batch was in flight: at most `batch_size` events, published again by the
///   relay that takes them over.
/// - A paused relay's batch likewise; when it wakes, it may still publish the rest of that batch
///   (its marks are fenced), at most once more each.
/// - A database restart can cost every running relay the results of its batch in flight (its
///   marks fail), so `batch_size` × relays.
/// - A broker that refuses connections can have swallowed what was in flight on the connection it
///   dropped: `batch_size` × relays.
/// - A stalled broker stores everything it is sent and acknowledges nothing: every publish during
///   the stall is repeated. A relay starts at most a batch per publish timeout, so
///   `batch_size` × relays × (2 + stall ÷ publish timeout); the 2 covers the batch in flight when
///   the stall begins and the one cut short when it ends.
pub(crate) fn duplicate_bound(
    injected: &Injected,
    batch_size: u32,
    relays: u32,
    publish_timeout: Duration,
) -> u64 {
    if !injected.applied {
        return 0;
    }
    let batch = u64::from(batch_size);
    let relays = u64::from(relays.max(injected.relays_running));
    match injected.fault.kind {
        FaultKind::Kill | FaultKind::Pause => batch,
        FaultKind::PgRestart | FaultKind::BrokerDown => batch * relays,
        // Slower claims, never a repeat. A dropped slot ends no relay and no lease: what it had
        // delivered is claimed by status, by the slot or by the polling claim, once.
        FaultKind::LongTransaction | FaultKind::SlotDrop => 0,
        FaultKind::BrokerStall => {
            let timeout = publish_timeout.as_millis().max(1) as u64;
            let windows = (injected.fault.hold.as_millis() as u64).div_ceil(timeout);
            batch * relays * (2 + windows)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn injected(kind: FaultKind, hold_ms: u64, applied: bool) -> Injected {
        Injected {
            fault: Fault {
                at: Duration::ZERO,
                kind,
                relay: 0,
                hold: Duration::from_millis(hold_ms),
                immediate: false,
            },
            started_ms: 0,
            ended_ms: hold_ms,
            applied,
            relays_running: 3,
            in_flight: None,
        }
    }

    #[test]
    fn bounds_follow_what_each_fault_can_catch_in_flight() {
        let pt = Duration::from_secs(2);
        assert_eq!(
            duplicate_bound(&injected(FaultKind::Kill, 0, true), 100, 3, pt),
            100
        );
        assert_eq!(
            duplicate_bound(&injected(FaultKind::PgRestart, 1000, true), 100, 3, pt),
            300
        );
        assert_eq!(
            duplicate_bound(&injected(FaultKind::BrokerStall, 5000, true), 100, 3, pt),
            100 * 3 * 5
        );
        assert_eq!(
            duplicate_bound(&injected(FaultKind::Pause, 5000, false), 100, 3, pt),
            0
        );
    }
}
