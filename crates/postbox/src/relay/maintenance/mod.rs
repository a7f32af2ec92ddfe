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

use std::sync::Arc;

use super::rounds::Tracker;
use crate::schema::Target;
use crate::store::Store;
use health::HealthReports;
use retention::Retention;
use slow_lane::SlowLane;
use vacuum::Vacuum;

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
