//! The slow lane: `FAILED` events tried again on the `dead_letter_*` settings.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tracing::{debug, info};

use super::{Background, LOCK_WAIT, Rotation};
use crate::error::Error;
use crate::metrics as metric;
use crate::metrics::TenantLabels;
use crate::relay::rounds::Tracker;
use crate::schema::Target;
use crate::store::{SlowLaneParams, Store};

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
    rotation: Rotation,
    background: Background,
    labels: Arc<TenantLabels>,
}

impl SlowLane {
    pub(super) fn new(
        interval: Option<Duration>,
        max_tries: u32,
        exclude: Vec<crate::glob::Glob>,
        rounds: Arc<Tracker>,
        background: Background,
        labels: Arc<TenantLabels>,
    ) -> Self {
        SlowLane {
            rotation: Rotation::default(),
            background,
            labels,
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
        // Every target once per tenth of the interval (a slow-lane try comes at most that much
        // late), a share of them per run when there are many.
        let (targets, pass) = self.rotation.share(targets, every, interval / 10);
        let background = self.background.clone();
        let labels = Arc::clone(&self.labels);
        let max_tries = self.max_tries;
        let exclude = Arc::clone(&self.exclude);
        let rounds = Arc::clone(&self.rounds);
        self.task = Some(tokio::spawn(async move {
            for target in &targets {
                if background.is_locked(target) {
                    continue;
                }
                let params = SlowLaneParams {
                    target,
                    after: interval,
                    max_tries,
                    batch_size: SLOW_LANE_BATCH,
                    exclude: &exclude,
                    lock_wait: Some(LOCK_WAIT),
                };
                match background.run(store.events_retry_slow_lane(&params)).await {
                    Ok(0) | Err(Error::Unsupported(_)) => {}
                    Ok(n) => {
                        info!(
                            tenant = target.label(),
                            count = n,
                            "slow lane: FAILED events given one more try"
                        );
                        metrics::counter!(metric::SLOW_LANE_RETRIES, "tenant" => labels.label(target.label()))
                            .increment(n);
                    }
                    Err(e) => {
                        if !background.found_locked(target, &e) {
                            debug!(tenant = target.label(), error = %e, "slow lane skipped this round");
                        }
                    }
                }
            }
            if pass {
                rounds.slow_lane_passed();
            }
        }));
    }

    /// Abandons a release in flight.
    pub(super) fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}
