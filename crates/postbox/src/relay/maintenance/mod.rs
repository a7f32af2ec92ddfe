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

mod health;
mod retention;
mod slow_lane;
mod vacuum;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tracing::warn;

use super::rounds::Tracker;
use crate::error::Error;
use crate::metrics::TenantLabels;
use crate::schema::{SchemaName, Target};
use crate::store::Store;
use health::HealthReports;
use retention::Retention;
use slow_lane::SlowLane;
use vacuum::Vacuum;

/// Every maintenance task of one relay, ticked together from its loop: each starts its work on
/// a task of its own when due and returns at once, so none holds up a claim; and together they
/// hold at most one of the store's connections at a time ([`Background`]), so the claims, marks
/// and renewals always find one.
pub(super) struct Maintenance {
    vacuum: Vacuum,
    retention: Retention,
    slow_lane: SlowLane,
    health: HealthReports,
}

impl Maintenance {
    pub(super) fn new(
        cfg: &crate::relay::RelayConfig,
        rounds: Arc<Tracker>,
        background: Background,
        labels: Arc<TenantLabels>,
    ) -> Self {
        Maintenance {
            vacuum: Vacuum::new(
                cfg.vacuum_threshold,
                background.clone(),
                Arc::clone(&labels),
            ),
            retention: Retention::new(
                cfg.retention,
                cfg.archive_retention,
                cfg.inbox_retention,
                background.clone(),
                Arc::clone(&labels),
            ),
            slow_lane: SlowLane::new(
                cfg.dead_letter_retry_interval,
                cfg.dead_letter_max_retries,
                cfg.slow_lane_excluded(),
                rounds,
                background,
                labels,
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

/// How long a statement of maintenance (retention, the slow lane) waits for a lock on a table
/// (a migration's `ALTER TABLE`, a `VACUUM FULL`, an operator's `LOCK TABLE`) before it gives
/// that table up until its next run: it holds the one [`Background`] permit meanwhile, which
/// every other table's maintenance waits for. Its batches take milliseconds; a lock this long
/// is held on purpose.
pub(super) const LOCK_WAIT: Duration = Duration::from_secs(1);

/// How long the due sweep and maintenance leave a table alone once a statement of theirs gave
/// up waiting for its lock: each try costs the one background connection its wait
/// ([`LOCK_WAIT`], the sweep's 500 ms), which every other table's maintenance waits for. Nothing
/// can be claimed from a locked table either; its claim in flight returns when the lock goes.
pub(super) const LOCKED_FOR: Duration = Duration::from_secs(30);

/// The store connections a relay's background work (maintenance, the due sweep) may hold at
/// once: one. Each statement of it takes the permit for its own span, so a run over a thousand
/// tenants never leaves the claims waiting for a connection of the pool. It also keeps the
/// tables found locked, which background work leaves alone for [`LOCKED_FOR`].
#[derive(Clone, Debug)]
pub(in crate::relay) struct Background {
    permit: Arc<Semaphore>,
    /// Tables found locked, and until when they are left alone.
    locked: Arc<Mutex<HashMap<SchemaName, Instant>>>,
}

impl Default for Background {
    fn default() -> Self {
        Background {
            permit: Arc::new(Semaphore::new(1)),
            locked: Arc::default(),
        }
    }
}

impl Background {
    /// Runs `work` holding the permit.
    pub(in crate::relay) async fn run<T>(&self, work: impl Future<Output = T>) -> T {
        // The semaphore is never closed: the permit always comes.
        let _permit = self.permit.acquire().await.ok();
        work.await
    }

    /// Whether `target`'s table was found locked lately: background work leaves it alone.
    pub(in crate::relay) fn is_locked(&self, target: &Target) -> bool {
        let Ok(mut locked) = self.locked.lock() else {
            return false;
        };
        let now = Instant::now();
        locked.retain(|_, until| *until > now);
        locked.contains_key(&target.schema)
    }

    /// Takes in `error` of a statement on `target`'s table: one that gave up waiting for the
    /// table's lock leaves the table alone for [`LOCKED_FOR`]. Returns whether it did.
    pub(in crate::relay) fn found_locked(&self, target: &Target, error: &Error) -> bool {
        if !error.is_lock_timeout() {
            return false;
        }
        if let Ok(mut locked) = self.locked.lock() {
            locked.insert(target.schema.clone(), Instant::now() + LOCKED_FOR);
        }
        warn!(
            tenant = target.label(),
            left_alone_for = ?LOCKED_FOR,
            "the outbox table is locked (a VACUUM FULL, a migration's ALTER TABLE, a LOCK \
             TABLE): its due sweep and maintenance wait; nothing is claimed from it until the \
             lock goes (find the holder in pg_locks)"
        );
        true
    }

    /// Runs `work` holding the permit, or without it once `patience` has passed: a statement of
    /// maintenance that waits for a lock (a tenant table locked by a `VACUUM FULL` or a
    /// migration) holds up that long at most the work that must not wait for it (the due
    /// sweep), which then takes a connection of its own.
    pub(in crate::relay) async fn run_within<T>(
        &self,
        patience: Duration,
        work: impl Future<Output = T>,
    ) -> T {
        let _permit = tokio::time::timeout(patience, self.permit.acquire())
            .await
            .ok()
            .and_then(|p| p.ok());
        work.await
    }
}

/// Where a periodic pass over many targets goes on: each run takes the next share, so that every
/// target is visited at least once per `cover` when runs come every `every`, however many there
/// are: `cover / every` targets a run at the least (all of them, up to that many), more when
/// there are more than that squared.
#[derive(Debug, Default)]
struct Rotation {
    next: usize,
}

impl Rotation {
    /// The targets of this run, and whether it ends a pass over all of them.
    fn share(
        &mut self,
        targets: &[Target],
        every: Duration,
        cover: Duration,
    ) -> (Vec<Target>, bool) {
        let n = targets.len();
        if n == 0 {
            return (Vec::new(), true);
        }
        let runs = (cover.as_secs_f64() / every.as_secs_f64().max(1e-3)).max(1.0);
        let share = ((n as f64 / runs).ceil().max(runs.floor()) as usize).clamp(1, n);
        let start = self.next % n;
        let taken = (0..share)
            .map(|k| targets[(start + k) % n].clone())
            .collect();
        let wrapped = start + share >= n;
        self.next = (start + share) % n;
        (taken, wrapped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::SchemaName;

    fn targets(n: usize) -> Vec<Target> {
        (0..n)
            .map(|i| {
                Target::default_schema(SchemaName::new(&format!("s{i}")).expect("a schema name"))
            })
            .collect()
    }

    #[test]
    fn a_rotation_visits_every_target_once_per_cover() {
        let minute = Duration::from_secs(60);
        let hour = Duration::from_secs(3600);
        // Few targets: all of them at every run.
        let mut few = Rotation::default();
        assert_eq!(few.share(&targets(10), minute, hour), (targets(10), true));
        // A thousand: 60 a run, every one within 17 minutes.
        let all = targets(1000);
        let mut many = Rotation::default();
        let mut seen = std::collections::HashSet::new();
        let mut passes = 0;
        for _ in 0..17 {
            let (share, wrapped) = many.share(&all, minute, hour);
            assert_eq!(share.len(), 60);
            seen.extend(share);
            passes += usize::from(wrapped);
        }
        assert_eq!(seen.len(), 1000);
        assert_eq!(passes, 1);
        // Ten thousand: a sixtieth a run, every one within the hour.
        let (share, _) = Rotation::default().share(&targets(10_000), minute, hour);
        assert_eq!(share.len(), 167);
    }
}
