//! [`CdcStore`]: a [`PgStore`] whose claims take the ids the slot delivered, in commit order —
//! read unclaimed ([`crate::reads`]) or claimed by id — and fall back to the polling claim for
//! everything else. The claim is `claim.rs`; the outcomes of read events `outcomes.rs`; the
//! relay's wake-ups `arrivals.rs`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use pg_walstream::CancellationToken;
use postbox::store::{
    Backlog, Capabilities, ClaimParams, Claimed, FailedMark, GapParams, Gaps, Horizon,
    HorizonProbe, MarkFailedParams, MarkProcessedParams, ReleaseParams, RenewParams, Wakeups,
};
use postbox::{PgStore, SchemaName, Store, Target};
use tokio::task::JoinHandle;

use crate::config::CdcConfig;
use crate::error::Result;
use crate::progress::{Progress, Sid};
use crate::reads::Reads;
use crate::{setup, stream};

mod arrivals;
mod claim;
mod outcomes;

/// A [`Store`] for a relay that reads the outbox table's inserts from a PostgreSQL logical
/// replication slot (change data capture) instead of polling for them.
///
/// Started with [`CdcStore::start`] over a migrated [`PgStore`], it keeps one replication
/// connection open on the slot: each committed transaction's outbox ids arrive in commit order,
/// and the relay's next claim takes exactly those rows by primary key — no scan of the table —
/// reading them without a claim (one write per event: the mark), or claiming them by id when
/// aggregates are ordered or [`CdcConfig::claim`] is set.
/// The slot serves the default schema's outbox and every active tenant's (their tables are kept
/// in the publication as tenants are added, suspended and resumed), each keyed by schema.
/// Everything else is the [`PgStore`]'s, unchanged: leases, fencing, marks, retries (claimed by
/// the polling claim, at most every [`CdcConfig::poll_interval`] while the slot streams), the
/// operator's surface. The slot's position is confirmed to the server only once
/// every event committed up to it is recorded in the table, so a crash re-reads what was in
/// flight; when the slot cannot be read (dropped, invalidated, the server failed over), the
/// polling claim carries the load on every round until it can.
///
/// ```no_run
/// use postbox::{handlers::Handlers, PgStore, Relay, RelayConfig};
/// use postbox_cdc::{CdcConfig, CdcStore};
///
/// # async fn example() -> anyhow::Result<()> {
/// let url = "postgres://postgres@localhost/app";
/// let store = PgStore::new(sqlx::PgPool::connect(url).await?);
/// postbox::migrate(&store).await?;
/// let store = CdcStore::start(store, url, CdcConfig::default()).await?;
/// let handlers = Handlers::new().on_any(|e| async move {
///     println!("{} {}", e.id, e.event_type);
///     Ok::<_, std::io::Error>(())
/// });
/// Relay::new(store, handlers, RelayConfig::default())?
///     .run(async { let _ = tokio::signal::ctrl_c().await; })
///     .await?;
/// # Ok(()) }
/// ```
pub struct CdcStore {
    inner: PgStore,
    schema: SchemaName,
    progress: Arc<Progress>,
    poll_every: Duration,
    /// What the relay keeps for each outbox the slot serves, made at its first claim.
    lanes: Mutex<HashMap<SchemaName, Arc<Lane>>>,
    cancel: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    slot: String,
    /// The relay id and lease of the last read: what a failed read event is claimed with, so
    /// that its failed try is recorded as a claimed event's is.
    reader: Mutex<Option<(String, Duration)>>,
    /// [`CdcConfig::claim`].
    claim: bool,
    /// The server's WAL position when the relay started.
    started_at: u64,
}

/// Where a CDC relay's slot stands ([`CdcStore::status`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CdcStatus {
    /// The slot's name.
    pub slot: String,
    /// Whether the slot is being read now (else the polling claim carries the load).
    pub streaming: bool,
    /// The furthest WAL position whose events are all recorded (what the server is told).
    pub confirmed_lsn: u64,
    /// The furthest WAL position the slot delivered.
    pub received_lsn: u64,
    /// Events the slot delivered whose outcome is not recorded yet.
    pub unrecorded: usize,
    /// Of those, events the claim by id did not get (not visible yet, or behind an event of
    /// their aggregate in flight) that wait to be looked at again.
    pub rechecking: usize,
    /// Whether the slot's confirmed position on the server has not moved for a minute while
    /// the server's WAL grew (the lag check's finding; metric `postbox_cdc_slot_stalled`).
    pub stalled: bool,
    /// Whether another relay reads the slot and this one waits for it: a standby claims the
    /// default schema's events only while that relay's confirmation is stalled.
    pub standby: bool,
}

impl CdcStore {
    /// Checks the server (`wal_level = logical`, a role with `REPLICATION`), creates the
    /// publication if it is missing, and starts reading the slot (created on first use) over
    /// its own replication connection to `database_url`. Fails with an error naming the fix
    /// when the server cannot do logical replication; once started, a slot that breaks is
    /// retried in the background while the polling claim serves.
    pub async fn start(store: PgStore, database_url: &str, config: CdcConfig) -> Result<Self> {
        config.validate()?;
        // This relay's own poll is the safety net beside its slot: it never leaves the events
        // to a CDC relay (itself, or the reader a standby waits for: see `poll_due`).
        let store = store.leave_to_cdc_relay(false);
        let schema = store.default_schema();
        setup::prepare(store.pool(), &schema, &config).await?;
        setup::record_slot(store.pool(), &schema, &config.slot).await;
        // What was committed before this start is the slot's to name first (see `poll_due`).
        let started_at: i64 = sqlx::query_scalar(include_str!("../../sql/wal_position.sql"))
            .fetch_one(store.pool())
            .await
            .map_err(crate::Error::Database)?;
        let progress = Arc::new(Progress::default());
        // A relay started while another reads the slot (a rolling deploy's new pod) is a
        // standby from its first claim: polling before its reader finds the slot held would
        // take events that relay is publishing unclaimed, and publish them a second time.
        let held = setup::slot_held(store.pool(), &config.slot)
            .await
            .map_err(crate::Error::Database)?;
        progress.set_standby(held);
        // The default schema's outbox first; tenants' once they are in the publication.
        progress.serve(&[schema.as_str().to_owned()]);
        let cancel = CancellationToken::new();
        let tasks = stream::spawn(stream::Stream {
            url: database_url.to_owned(),
            config: config.clone(),
            schema: schema.clone(),
            pool: store.pool().clone(),
            progress: Arc::clone(&progress),
            cancel: cancel.clone(),
        });
        Ok(CdcStore {
            inner: store,
            schema,
            progress,
            poll_every: config.poll_interval,
            lanes: Mutex::default(),
            cancel,
            tasks,
            slot: config.slot,
            reader: Mutex::default(),
            claim: config.claim,
            started_at: u64::try_from(started_at).unwrap_or(0),
        })
    }

    /// Where the slot stands now.
    pub fn status(&self) -> CdcStatus {
        let (confirmed_lsn, received_lsn) = self.progress.positions();
        CdcStatus {
            slot: self.slot.clone(),
            streaming: self.progress.streaming(),
            confirmed_lsn,
            received_lsn,
            unrecorded: self.progress.unrecorded(),
            rechecking: self.progress.rechecking(),
            stalled: self.progress.stalled(),
            standby: self.progress.standby(),
        }
    }

    /// A readiness check for the admin server (`postbox_admin::AdminBuilder::ready_check`):
    /// the reason while the slot's confirmed position has not moved for a minute while the
    /// server's WAL grew ([`CdcStatus::stalled`]), `None` otherwise.
    pub fn stall_check(&self) -> impl Fn() -> Option<String> + Send + Sync + 'static {
        let progress = Arc::clone(&self.progress);
        let slot = self.slot.clone();
        move || {
            progress.stalled().then(|| {
                format!(
                    "CDC slot {slot}: its confirmed position has not moved for a minute while \
                     the server's WAL grew (the relay records nothing of what the slot delivers; \
                     see its errors)"
                )
            })
        }
    }

    /// Stops reading the slot (also done on drop). What was delivered and not recorded is
    /// delivered again to the next reader of the slot.
    pub async fn stop(&mut self) {
        self.cancel.cancel();
        for task in self.tasks.drain(..) {
            let _ = task.await;
        }
    }

    /// The lane of `target`'s outbox while the slot serves it (the default schema's, and each
    /// active tenant's in the publication), made at its first claim.
    fn serving(&self, target: &Target) -> Option<Arc<Lane>> {
        let sid = self.progress.served(target.schema.as_str())?;
        let mut lanes = self.lanes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(lane) = lanes.get(&target.schema) {
            return Some(Arc::clone(lane));
        }
        let lane = Arc::new(Lane::new(sid));
        lanes.insert(target.schema.clone(), Arc::clone(&lane));
        Some(lane)
    }

    /// The lane of `target`'s outbox, if one was made, served now or not: the outcomes of
    /// events read before a tenant was suspended are still recorded through it.
    fn lane(&self, target: &Target) -> Option<Arc<Lane>> {
        let lanes = self.lanes.lock().unwrap_or_else(|e| e.into_inner());
        lanes.get(&target.schema).map(Arc::clone)
    }

    /// `target`'s lane if `token` is one of its reads (events published without a claim).
    fn read_lane(&self, target: &Target, token: &uuid::Uuid) -> Option<Arc<Lane>> {
        self.lane(target).filter(|l| l.reads.is_read(token))
    }

    /// Passes `result` on; an error that says the database is going away also makes the reader
    /// let go of the slot ([`Progress::server_lost`]).
    fn watch<T>(&self, result: postbox::Result<T>) -> postbox::Result<T> {
        if let Err(postbox::Error::Database(e)) = &result
            && crate::stream::server_lost(e)
        {
            self.progress.server_lost();
        }
        result
    }
}

/// What a CDC relay keeps for one outbox the slot serves.
pub(super) struct Lane {
    sid: Sid,
    polled: Mutex<claim::Polled>,
    /// The events published without a claim ([`crate::reads`]).
    reads: Reads,
}

impl Lane {
    fn new(sid: Sid) -> Self {
        Lane {
            sid,
            polled: Mutex::default(),
            reads: Reads::default(),
        }
    }
}

impl Drop for CdcStore {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

#[async_trait]
impl Store for CdcStore {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn default_schema(&self) -> SchemaName {
        self.inner.default_schema()
    }

    async fn events_claim(&self, p: &ClaimParams<'_>) -> postbox::Result<Claimed> {
        self.claim(p).await
    }

    async fn claim_floor(&self, target: &Target, from: i64, settled: i64) -> postbox::Result<i64> {
        self.inner.claim_floor(target, from, settled).await
    }

    async fn claim_gaps(&self, p: &GapParams<'_>) -> postbox::Result<Gaps> {
        self.inner.claim_gaps(p).await
    }

    async fn leases_renew(&self, p: &RenewParams<'_>) -> postbox::Result<u64> {
        let Some(lane) = self.read_lane(p.target, &p.claim_token) else {
            return self.watch(self.inner.leases_renew(p).await);
        };
        // A read holds no lease; what a poll of this relay adopted holds that claim's.
        let split = lane.reads.split(p.ids.iter().copied());
        let mut renewed = split.read.len() as u64;
        for (token, ids) in &split.adopted {
            let params = RenewParams {
                claim_token: *token,
                ids,
                ..p.clone()
            };
            renewed += self.watch(self.inner.leases_renew(&params).await)?;
        }
        Ok(renewed)
    }

    async fn events_mark_processed(&self, p: &MarkProcessedParams<'_>) -> postbox::Result<u64> {
        let marked = match self.read_lane(p.target, &p.claim_token) {
            Some(lane) => self.mark_read(&lane, p).await,
            None => self.watch(self.inner.events_mark_processed(p).await),
        };
        self.recorded(p.target, p.ids.iter().copied(), marked.is_ok());
        marked
    }

    async fn events_mark_failed(
        &self,
        p: &MarkFailedParams<'_>,
    ) -> postbox::Result<Vec<FailedMark>> {
        let marked = match self.read_lane(p.target, &p.claim_token) {
            Some(lane) => self.fail_read(&lane, p).await,
            None => self.watch(self.inner.events_mark_failed(p).await),
        };
        self.recorded(p.target, p.tries.iter().map(|t| t.id), marked.is_ok());
        marked
    }

    async fn events_release(&self, p: &ReleaseParams<'_>) -> postbox::Result<u64> {
        let released = match self.read_lane(p.target, &p.claim_token) {
            Some(lane) => self.release_read(&lane, p).await,
            None => self.watch(self.inner.events_release(p).await),
        };
        self.recorded(p.target, p.releases.iter().map(|r| r.id), released.is_ok());
        released
    }

    async fn backlog(&self, target: &Target, ordered: &[String]) -> postbox::Result<Backlog> {
        self.inner.backlog(target, ordered).await
    }

    async fn backlog_from(
        &self,
        target: &Target,
        from: &postbox::store::BacklogFrom,
    ) -> postbox::Result<Backlog> {
        self.inner.backlog_from(target, from).await
    }

    async fn outbox_due(
        &self,
        targets: &[Target],
        ordered: &[String],
    ) -> postbox::Result<Vec<Option<Duration>>> {
        self.inner.outbox_due(targets, ordered).await
    }

    async fn commit_horizon(
        &self,
        target: &Target,
        probe: Option<&HorizonProbe>,
    ) -> postbox::Result<Horizon> {
        self.watch(self.inner.commit_horizon(target, probe).await)
    }

    async fn horizon_writers_age(
        &self,
        target: &Target,
        probe: &HorizonProbe,
    ) -> postbox::Result<Option<std::time::Duration>> {
        self.watch(self.inner.horizon_writers_age(target, probe).await)
    }

    async fn wakeups(&self) -> postbox::Result<Option<Box<dyn Wakeups>>> {
        Ok(Some(Box::new(arrivals::Arrivals::new(
            Arc::clone(&self.progress),
            self.schema.as_str(),
        ))))
    }

    async fn outbox_heads(
        &self,
        targets: &[Target],
        known: &[Option<i64>],
    ) -> postbox::Result<Vec<(usize, Option<i64>)>> {
        self.inner.outbox_heads(targets, known).await
    }
}

postbox::forward_store_ops!(CdcStore, |self| &self.inner);
