//! Maintenance of the outbox tables a relay serves, beside its work: vacuuming, retention and
//! sink health reports.
//!
//! Every mark leaves a dead row version in the table and dead entries in its indexes; until they
//! are vacuumed, each claim walks past more of them. Autovacuum may be off, or far behind on a
//! table that grows by the million (its default threshold is a fifth of the table), so the relay
//! checks the dead-row count of its targets now and then and vacuums a table past its
//! threshold. The vacuum runs on a connection of its own, beside the relay's work; a table
//! another relay is vacuuming is skipped, and an autovacuum worker (throttled by its cost limits,
//! so slow on a large table) is cancelled in its favour by PostgreSQL.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use super::rounds::Tracker;
use crate::error::Error;
use crate::metrics as metric;
use crate::schema::{SchemaName, Target};
use crate::store::{
    ArchiveParams, PurgeKind, PurgeParams, SlowLaneParams, Store, archive_all, purge_all,
};

/// How often the dead-row counts are read.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// After a vacuum that took `t`, the table is left alone for `t` times this.
const VACUUM_DUTY_PAUSE: u32 = 9;

/// How long a table the relay may not vacuum is left alone before it tries again.
const SKIP_FOR: Duration = Duration::from_secs(600);

/// Every maintenance task of one relay, ticked together from its loop: each starts its work on
/// a task of its own when due and returns at once, so none holds up a claim.
pub(super) struct Maintenance {
    vacuum: Vacuum,
    retention: Retention,
    slow_lane: SlowLane,
    health: HealthReports,
}

impl Maintenance {
    pub(super) fn new(cfg: &crate::relay::RelayConfig, rounds: Arc<Tracker>) -> Self {
        Maintenance {
            vacuum: Vacuum::new(cfg.vacuum_threshold),
            retention: Retention::new(cfg.retention, cfg.archive_retention, cfg.inbox_retention),
            slow_lane: SlowLane::new(
                cfg.dead_letter_retry_interval,
                cfg.dead_letter_max_retries,
                cfg.slow_lane_excluded(),
                rounds,
            ),
            health: HealthReports::new(),
        }
    }

    /// Starts what is due on `targets`.
    pub(super) fn tick(
        &mut self,
        store: &Arc<dyn Store>,
        sink: &Arc<dyn crate::sink::Sink>,
        relay_id: &str,
        targets: &[Target],
    ) {
        self.vacuum.tick(store, targets);
        self.retention.tick(store, targets);
        self.slow_lane.tick(store, targets);
        self.health.tick(store, sink, relay_id);
    }

    /// Stops every task and withdraws this relay's sink health reports.
    pub(super) async fn stop(&mut self, store: &Arc<dyn Store>, relay_id: &str) {
        self.vacuum.stop();
        self.retention.stop();
        self.slow_lane.stop();
        self.health.stop(store, relay_id).await;
    }
}

pub(super) struct Vacuum {
    threshold: Option<u64>,
    last_check: Option<Instant>,
    task: Option<JoinHandle<()>>,
    /// Tables to leave alone until a moment: just vacuumed, or their vacuum failed for a reason
    /// the operator must fix.
    skip: Arc<Mutex<HashMap<SchemaName, Instant>>>,
}

impl Vacuum {
    pub(super) fn new(threshold: Option<u64>) -> Self {
        Vacuum {
            threshold,
            last_check: None,
            task: None,
            skip: Arc::default(),
        }
    }

    /// Starts a check (and the vacuums it calls for) unless one ran lately or is still running.
    pub(super) fn tick(&mut self, store: &Arc<dyn Store>, targets: &[Target]) {
        let Some(threshold) = self.threshold else {
            return;
        };
        if self.last_check.is_some_and(|at| at.elapsed() < CHECK_EVERY)
            || self.task.as_ref().is_some_and(|t| !t.is_finished())
            || targets.is_empty()
        {
            return;
        }
        self.last_check = Some(Instant::now());
        let store = Arc::clone(store);
        let targets = targets.to_vec();
        let skip = Arc::clone(&self.skip);
        self.task = Some(tokio::spawn(async move {
            check(&*store, &targets, threshold, &skip).await;
        }));
    }

    /// Abandons a vacuum in flight (the server finishes or cancels it on its own).
    pub(super) fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

async fn check(
    store: &dyn Store,
    targets: &[Target],
    threshold: u64,
    skip: &Mutex<HashMap<SchemaName, Instant>>,
) {
    let dead = match store.outbox_dead_rows(targets).await {
        Ok(dead) => dead,
        Err(e) => {
            debug!(error = %e, "cannot read dead-row counts; vacuum check skipped");
            return;
        }
    };
    for (target, dead) in targets.iter().zip(dead) {
        if dead < threshold {
            continue;
        }
        {
            let mut skip = skip.lock().unwrap_or_else(PoisonError::into_inner);
            match skip.get(&target.schema) {
                Some(until) if *until > Instant::now() => continue,
                Some(_) => {
                    skip.remove(&target.schema);
                }
                None => {}
            }
        }
        let started = Instant::now();
        match store.outbox_vacuum(target).await {
            Ok(()) => {
                let elapsed = started.elapsed();
                info!(
                    tenant = target.label(),
                    dead_rows = dead,
                    ?elapsed,
                    "vacuumed the outbox table"
                );
                // A vacuum removes nothing while an older snapshot is open (a long transaction,
                // an ANALYZE), and the count stays past the threshold: without a pause the
                // relay would vacuum the table back to back. Vacuuming takes at most a tenth of
                // the time.
                skip.lock().unwrap_or_else(PoisonError::into_inner).insert(
                    target.schema.clone(),
                    Instant::now() + elapsed * VACUUM_DUTY_PAUSE,
                );
                metrics::counter!(metric::VACUUMS, "tenant" => target.label().to_owned())
                    .increment(1);
            }
            Err(e @ Error::NotOwner { .. }) => {
                warn!(tenant = target.label(), dead_rows = dead, error = %e,
                    "cannot vacuum the outbox table; claims slow down as dead rows pile up");
                skip.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(target.schema.clone(), Instant::now() + SKIP_FOR);
            }
            Err(e) => {
                debug!(tenant = target.label(), error = %e, "vacuum failed; trying again later")
            }
        }
    }
}

/// How often a relay runs retention over its targets.
const RETENTION_EVERY: Duration = Duration::from_secs(60);

/// Rows per retention batch: each batch is one short transaction.
const RETENTION_BATCH: u32 = 1_000;

/// Retention, run by the relays: every minute, `PROCESSED` events past `retention` move to the
/// archive, archived events past `archive_retention` and inbox records past `inbox_retention`
/// are deleted, in short batches (see [`Store::events_archive`]). One relay at a time works on a
/// table; the others skip it.
pub(super) struct Retention {
    ages: Ages,
    last_run: Option<Instant>,
    task: Option<JoinHandle<()>>,
}

/// The ages of [`Retention`], from the relay's configuration.
#[derive(Clone, Copy)]
struct Ages {
    retention: Option<Duration>,
    archive_retention: Option<Duration>,
    inbox_retention: Option<Duration>,
}

impl Retention {
    pub(super) fn new(
        retention: Option<Duration>,
        archive_retention: Option<Duration>,
        inbox_retention: Option<Duration>,
    ) -> Self {
        Retention {
            ages: Ages {
                retention,
                archive_retention,
                inbox_retention,
            },
            last_run: None,
            task: None,
        }
    }

    /// Starts a retention run unless one ran lately or is still running.
    pub(super) fn tick(&mut self, store: &Arc<dyn Store>, targets: &[Target]) {
        let ages = self.ages;
        if (ages.retention.is_none()
            && ages.archive_retention.is_none()
            && ages.inbox_retention.is_none())
            || self
                .last_run
                .is_some_and(|at| at.elapsed() < RETENTION_EVERY)
            || self.task.as_ref().is_some_and(|t| !t.is_finished())
            || targets.is_empty()
        {
            return;
        }
        self.last_run = Some(Instant::now());
        let store = Arc::clone(store);
        let targets = targets.to_vec();
        self.task = Some(tokio::spawn(async move {
            for target in &targets {
                retain(&*store, target, ages).await;
            }
        }));
    }

    /// Abandons a run in flight: the batch in progress rolls back, the rest waits for the next
    /// run (of this relay or another).
    pub(super) fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

async fn retain(store: &dyn Store, target: &Target, ages: Ages) {
    let tenant = target.label();
    if let Some(older_than) = ages.retention {
        let params = ArchiveParams {
            target,
            older_than,
            after_id: 0,
            batch_size: RETENTION_BATCH,
            dry_run: false,
        };
        let started = Instant::now();
        match archive_all(store, params, false, |n| {
            metrics::counter!(metric::EVENTS_ARCHIVED, "tenant" => tenant.to_owned()).increment(n);
        })
        .await
        {
            Ok(Some(0)) => {}
            Ok(Some(moved)) => info!(tenant, moved, elapsed = ?started.elapsed(),
                "archived processed events past their retention"),
            Ok(None) => debug!(tenant, "another relay is archiving; skipped"),
            Err(e) => warn!(tenant, error = %e,
                "archiving failed; processed events stay in the outbox table until the next run"),
        }
    }
    if let Some(older_than) = ages.archive_retention {
        let purged = purge_past(store, target, PurgeKind::Archive, older_than, |n| {
            metrics::counter!(metric::EVENTS_PURGED, "tenant" => tenant.to_owned()).increment(n);
        });
        match purged.await {
            Ok(Some(0) | None) => {}
            Ok(Some(purged)) => info!(
                tenant,
                purged, "purged archived events past archive_retention"
            ),
            Err(e) => {
                warn!(tenant, error = %e, "purging the archive failed; trying again at the next run")
            }
        }
    }
    if let Some(older_than) = ages.inbox_retention {
        let purged = purge_past(store, target, PurgeKind::Inbox, older_than, |n| {
            metrics::counter!(metric::INBOX_PURGED, "tenant" => tenant.to_owned()).increment(n);
        });
        match purged.await {
            Ok(Some(0) | None) => {}
            Ok(Some(purged)) => info!(
                tenant,
                purged, "purged inbox records past inbox_retention (the dedup window)"
            ),
            Err(e) => {
                warn!(tenant, error = %e, "purging the inbox failed; trying again at the next run")
            }
        }
    }
}

/// One relay's purge of `kind` past `older_than` in `target`, in retention batches; `None` when
/// another relay holds the table's retention lock.
async fn purge_past(
    store: &dyn Store,
    target: &Target,
    kind: PurgeKind,
    older_than: Duration,
    progress: impl FnMut(u64) + Send,
) -> crate::Result<Option<u64>> {
    let params = PurgeParams {
        target,
        kind,
        older_than,
        batch_size: RETENTION_BATCH,
        dry_run: false,
    };
    purge_all(store, params, false, progress).await
}

/// How often sink health is reported while unchanged (so `postbox status` can tell a live report
/// from a relay that stopped).
const HEALTH_EVERY: Duration = Duration::from_secs(15);

/// How often the sinks' health is looked at.
const HEALTH_CHECK: Duration = Duration::from_secs(1);

/// Reports what the relay's sinks say of their destinations to the store (for `postbox status`)
/// and to the metrics, beside the work.
/// Events released by the slow lane per statement.
const SLOW_LANE_BATCH: u32 = 1000;

/// The slow lane of `FAILED` events: every so often (a tenth of the interval, at most a minute),
/// each served target's `FAILED` events that waited `interval` since their last try get one more
/// try, `max_tries` times at most. Any relay may release them (the statement skips rows another
/// relay is releasing); each release is one short statement of at most 1,000 rows.
pub(super) struct SlowLane {
    interval: Option<Duration>,
    max_tries: u32,
    /// Event types whose retry policy turns the slow lane off.
    exclude: Arc<[crate::glob::Glob]>,
    last_run: Option<Instant>,
    task: Option<JoinHandle<()>>,
    /// Told of every pass, for whoever waits on the relay.
    rounds: Arc<Tracker>,
}

impl SlowLane {
    pub(super) fn new(
        interval: Option<Duration>,
        max_tries: u32,
        exclude: Vec<crate::glob::Glob>,
        rounds: Arc<Tracker>,
    ) -> Self {
        SlowLane {
            interval: interval.filter(|_| max_tries > 0),
            max_tries,
            exclude: exclude.into(),
            last_run: None,
            task: None,
            rounds,
        }
    }

    /// Starts a release unless one ran lately or is still running.
    pub(super) fn tick(&mut self, store: &Arc<dyn Store>, targets: &[Target]) {
        let Some(interval) = self.interval else {
            return;
        };
        let every = (interval / 10).min(Duration::from_secs(60));
        if self.last_run.is_some_and(|at| at.elapsed() < every)
            || self.task.as_ref().is_some_and(|t| !t.is_finished())
            || targets.is_empty()
        {
            return;
        }
        self.last_run = Some(Instant::now());
        let store = Arc::clone(store);
        let targets = targets.to_vec();
        let max_tries = self.max_tries;
        let exclude = Arc::clone(&self.exclude);
        let rounds = Arc::clone(&self.rounds);
        self.task = Some(tokio::spawn(async move {
            for target in &targets {
                let params = SlowLaneParams {
                    target,
                    after: interval,
                    max_tries,
                    batch_size: SLOW_LANE_BATCH,
                    exclude: &exclude,
                };
                match store.events_retry_slow_lane(&params).await {
                    Ok(0) | Err(Error::Unsupported(_)) => {}
                    Ok(n) => {
                        info!(
                            tenant = target.label(),
                            count = n,
                            "slow lane: FAILED events given one more try"
                        );
                        metrics::counter!(metric::SLOW_LANE_RETRIES, "tenant" => target.label().to_owned())
                            .increment(n);
                    }
                    Err(e) => {
                        debug!(tenant = target.label(), error = %e, "slow lane skipped this round")
                    }
                }
            }
            rounds.slow_lane_passed();
        }));
    }

    /// Abandons a release in flight.
    pub(super) fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

pub(super) struct HealthReports {
    last_check: Option<Instant>,
    last_report: Option<(Instant, Vec<crate::sink::SinkHealth>)>,
    task: Option<JoinHandle<()>>,
}

impl HealthReports {
    pub(super) fn new() -> Self {
        HealthReports {
            last_check: None,
            last_report: None,
            task: None,
        }
    }

    /// Looks at the sinks' health now and then; reports it when it changed, and every
    /// `HEALTH_EVERY` while it does not.
    pub(super) fn tick(
        &mut self,
        store: &Arc<dyn Store>,
        sink: &Arc<dyn crate::sink::Sink>,
        relay_id: &str,
    ) {
        if self
            .last_check
            .is_some_and(|at| at.elapsed() < HEALTH_CHECK)
            || self.task.as_ref().is_some_and(|t| !t.is_finished())
        {
            return;
        }
        self.last_check = Some(Instant::now());
        let health = sink.health();
        if health.is_empty() {
            return;
        }
        for h in &health {
            metrics::gauge!(metric::SINK_UP, "sink" => h.name.clone()).set(if h.up {
                1.0
            } else {
                0.0
            });
        }
        let due = match &self.last_report {
            Some((at, last)) => *last != health || at.elapsed() >= HEALTH_EVERY,
            None => true,
        };
        if !due {
            return;
        }
        self.last_report = Some((Instant::now(), health.clone()));
        let store = Arc::clone(store);
        let relay_id = relay_id.to_owned();
        self.task = Some(tokio::spawn(async move {
            if let Err(e) = store.sinks_report(&relay_id, &health).await {
                debug!(error = %e, "cannot report sink health; trying again later");
            }
        }));
    }

    /// Withdraws this relay's reports: it serves no sink any more.
    pub(super) async fn stop(&mut self, store: &Arc<dyn Store>, relay_id: &str) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        if self.last_report.is_some() {
            let _ = store.sinks_report(relay_id, &[]).await;
        }
    }
}
