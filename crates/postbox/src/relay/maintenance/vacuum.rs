//! Vacuum: the dead-row counts of the tables a relay serves, read now and then, and a table
//! past its threshold vacuumed on a connection of its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use super::Background;
use crate::error::Error;
use crate::metrics as metric;
use crate::metrics::TenantLabels;
use crate::schema::{SchemaName, Target};
use crate::store::Store;

/// How often the dead-row counts are read: every second, and with many targets every
/// millisecond per target (the read lists every table of the database; ten thousand tenants:
/// every ten seconds).
const CHECK_EVERY: Duration = Duration::from_secs(1);
const CHECK_EVERY_PER_TARGET: Duration = Duration::from_millis(1);

/// After a vacuum that took `t`, the table is left alone for `t` times this.
const VACUUM_DUTY_PAUSE: u32 = 9;

/// How long a table the relay may not vacuum is left alone before it tries again.
const SKIP_FOR: Duration = Duration::from_secs(600);

pub(super) struct Vacuum {
    threshold: Option<u64>,
    last_check: Option<Instant>,
    task: Option<JoinHandle<()>>,
    /// Tables to leave alone until a moment: just vacuumed, or their vacuum failed for a reason
    /// the operator must fix.
    skip: Arc<Mutex<HashMap<SchemaName, Instant>>>,
    /// What held vacuum back when each table was last vacuumed ([`StoreOps::vacuum_horizon`]).
    held_at: Arc<Mutex<HashMap<SchemaName, String>>>,
    background: Background,
    labels: Arc<TenantLabels>,
}

impl Vacuum {
    pub(super) fn new(
        threshold: Option<u64>,
        background: Background,
        labels: Arc<TenantLabels>,
    ) -> Self {
        Vacuum {
            threshold,
            last_check: None,
            task: None,
            skip: Arc::default(),
            held_at: Arc::default(),
            background,
            labels,
        }
    }

    /// Starts a check (and the vacuums it calls for) unless one ran lately or is still running.
    pub(super) fn tick(&mut self, store: &Arc<dyn Store>, targets: &[Target]) {
        let Some(threshold) = self.threshold else {
            return;
        };
        let every = CHECK_EVERY.max(CHECK_EVERY_PER_TARGET * targets.len() as u32);
        if self.last_check.is_some_and(|at| at.elapsed() < every)
            || self.task.as_ref().is_some_and(|t| !t.is_finished())
            || targets.is_empty()
        {
            return;
        }
        self.last_check = Some(Instant::now());
        let store = Arc::clone(store);
        let targets = targets.to_vec();
        let tables = Tables {
            skip: Arc::clone(&self.skip),
            held_at: Arc::clone(&self.held_at),
        };
        let background = self.background.clone();
        let labels = Arc::clone(&self.labels);
        self.task = Some(tokio::spawn(async move {
            check(&*store, &targets, threshold, &tables, &background, &labels).await;
        }));
    }

    /// Abandons a vacuum in flight (the server finishes or cancels it on its own).
    pub(super) fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// What a relay remembers of the tables it vacuums.
struct Tables {
    /// Tables to leave alone until a moment (see [`Vacuum`]).
    skip: Arc<Mutex<HashMap<SchemaName, Instant>>>,
    /// What held vacuum back at each table's last vacuum.
    held_at: Arc<Mutex<HashMap<SchemaName, String>>>,
}

async fn check(
    store: &dyn Store,
    targets: &[Target],
    threshold: u64,
    tables: &Tables,
    background: &Background,
    labels: &TenantLabels,
) {
    let skip = &tables.skip;
    let dead = match background.run(store.outbox_dead_rows(targets)).await {
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
        // A transaction that has held vacuum back since this table's last vacuum (a producer's
        // left open, a long report) keeps every row version that vacuum left: another would
        // read the whole table for nothing, and again after each pause. The last vacuum may be
        // another relay's, or this one's before a restart (kept in the database): a rolling
        // deploy beside a held transaction would otherwise vacuum every table once per relay.
        let held = store.vacuum_horizon().await.ok().flatten();
        if let Some(now) = &held
            && held_back(store, tables, target, now).await
        {
            debug!(
                tenant = target.label(),
                dead_rows = dead,
                "vacuum skipped: what held back the last one still does"
            );
            continue;
        }
        let started = Instant::now();
        match store.outbox_vacuum(target).await {
            Ok(()) => {
                {
                    let mut held_at = tables
                        .held_at
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner);
                    match &held {
                        Some(held) => held_at.insert(target.schema.clone(), held.clone()),
                        None => held_at.remove(&target.schema),
                    };
                }
                if let Err(e) = store.vacuum_held_record(target, held.as_deref()).await {
                    debug!(tenant = target.label(), error = %e,
                        "cannot keep what held this vacuum back; relays started later may vacuum again");
                }
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
                metrics::counter!(metric::VACUUMS, "tenant" => labels.label(target.label()))
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

/// Whether `now` (what holds vacuum back) is what held back the last vacuum of `target`'s
/// table: by this relay (remembered), or by any relay (kept in the database, then remembered).
async fn held_back(store: &dyn Store, tables: &Tables, target: &Target, now: &str) -> bool {
    let remembered = tables
        .held_at
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&target.schema)
        .cloned();
    if remembered.as_deref() == Some(now) {
        return true;
    }
    let kept = store.vacuum_held_read(target).await.ok().flatten();
    if kept.as_deref() != Some(now) {
        return false;
    }
    tables
        .held_at
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(target.schema.clone(), now.to_owned());
    true
}
