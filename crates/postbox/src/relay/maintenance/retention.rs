//! Retention: processed events moved to the archive and purged from it, `FAILED` events and
//! inbox records purged, in short batches.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use super::{Background, LOCK_WAIT, Rotation};
use crate::metrics as metric;
use crate::metrics::TenantLabels;
use crate::schema::Target;
use crate::store::{ArchiveParams, PurgeKind, PurgeParams, Store, archive_all, purge_all};

/// How often a relay runs retention.
const RETENTION_EVERY: Duration = Duration::from_secs(60);

/// How often each target gets retention at the least: a run takes every target up to 60 of
/// them, and a share of more (a thousand tenants: 17 a minute), each alone holding the store's
/// background connection ([`Background`]). Retention counts in days; an hour's lag is nothing to
/// it, and idle tenants cost nothing between their visits.
const RETENTION_COVER: Duration = Duration::from_secs(3600);

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
    rotation: Rotation,
    background: Background,
    labels: Arc<TenantLabels>,
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
        background: Background,
        labels: Arc<TenantLabels>,
    ) -> Self {
        Retention {
            labels,
            ages: Ages {
                retention,
                archive_retention,
                inbox_retention,
            },
            last_run: None,
            task: None,
            rotation: Rotation::default(),
            background,
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
        let (targets, _) = self
            .rotation
            .share(targets, RETENTION_EVERY, RETENTION_COVER);
        let background = self.background.clone();
        let labels = Arc::clone(&self.labels);
        self.task = Some(tokio::spawn(async move {
            for target in &targets {
                if !background.is_locked(target) {
                    background
                        .run(retain(&*store, target, ages, &labels, &background))
                        .await;
                }
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

async fn retain(
    store: &dyn Store,
    target: &Target,
    ages: Ages,
    labels: &TenantLabels,
    background: &Background,
) {
    let tenant = target.label();
    let label = labels.label(tenant);
    if let Some(older_than) = ages.retention {
        let params = ArchiveParams {
            target,
            older_than,
            after_id: 0,
            batch_size: RETENTION_BATCH,
            dry_run: false,
            lock_wait: Some(LOCK_WAIT),
        };
        let started = Instant::now();
        match archive_all(store, params, false, |n| {
            metrics::counter!(metric::EVENTS_ARCHIVED, "tenant" => label.clone()).increment(n);
        })
        .await
        {
            Ok(Some(0)) => {}
            Ok(Some(moved)) => info!(tenant, moved, elapsed = ?started.elapsed(),
                "archived processed events past their retention"),
            Ok(None) => debug!(tenant, "another relay is archiving; skipped"),
            Err(e) if background.found_locked(target, &e) => return,
            Err(e) => warn!(tenant, error = %e,
                "archiving failed; processed events stay in the outbox table until the next run"),
        }
    }
    if let Some(older_than) = ages.archive_retention {
        let purged = purge_past(store, target, PurgeKind::Archive, older_than, |n| {
            metrics::counter!(metric::EVENTS_PURGED, "tenant" => label.clone()).increment(n);
        });
        match purged.await {
            Ok(Some(0) | None) => {}
            Ok(Some(purged)) => info!(
                tenant,
                purged, "purged archived events past archive_retention"
            ),
            Err(e) if background.found_locked(target, &e) => return,
            Err(e) => {
                warn!(tenant, error = %e, "purging the archive failed; trying again at the next run")
            }
        }
    }
    if let Some(older_than) = ages.inbox_retention {
        let purged = purge_past(store, target, PurgeKind::Inbox, older_than, |n| {
            metrics::counter!(metric::INBOX_PURGED, "tenant" => label.clone()).increment(n);
        });
        match purged.await {
            Ok(Some(0) | None) => {}
            Ok(Some(purged)) => info!(
                tenant,
                purged, "purged inbox records past inbox_retention (the dedup window)"
            ),
            Err(e) if background.found_locked(target, &e) => {}
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
        lock_wait: Some(LOCK_WAIT),
    };
    purge_all(store, params, false, progress).await
}
