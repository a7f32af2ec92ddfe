//! [`CdcStore`]: a [`PgStore`] whose claims take the ids the slot delivered, in commit order,
//! and fall back to the polling claim for everything else.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
use crate::progress::Progress;
use crate::{setup, stream};

/// A [`Store`] for a relay that reads the outbox table's inserts from a PostgreSQL logical
/// replication slot (change data capture) instead of polling for them.
///
/// Started with [`CdcStore::start`] over a migrated [`PgStore`], it keeps one replication
/// connection open on the slot: each committed transaction's outbox ids arrive in commit order,
/// and the relay's next claim takes exactly those rows by primary key — no scan of the table.
/// Everything else is the [`PgStore`]'s, unchanged: leases, fencing, marks, retries (claimed by
/// the polling claim, at most every [`CdcConfig::poll_interval`] while the slot streams),
/// tenants, the operator's surface. The slot's position is confirmed to the server only once
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
    polled: Mutex<Polled>,
    /// `sql/ids_taken.sql` for this schema.
    ids_taken_sql: String,
    cancel: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    slot: String,
}

/// When the polling claim last ran beside the slot, and whether it came back full.
#[derive(Default)]
struct Polled {
    at: Option<Instant>,
    full: bool,
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
}

impl CdcStore {
    /// Checks the server (`wal_level = logical`, a role with `REPLICATION`), creates the
    /// publication if it is missing, and starts reading the slot (created on first use) over
    /// its own replication connection to `database_url`. Fails with an error naming the fix
    /// when the server cannot do logical replication; once started, a slot that breaks is
    /// retried in the background while the polling claim serves.
    pub async fn start(store: PgStore, database_url: &str, config: CdcConfig) -> Result<Self> {
        config.validate()?;
        let schema = store.default_schema();
        setup::prepare(store.pool(), &schema, &config).await?;
        let progress = Arc::new(Progress::default());
        let cancel = CancellationToken::new();
        let tasks = stream::spawn(stream::Stream {
            url: database_url.to_owned(),
            config: config.clone(),
            schema: schema.clone(),
            pool: store.pool().clone(),
            progress: Arc::clone(&progress),
            cancel: cancel.clone(),
        });
        // The schema's name is validated by `SchemaName`, and quoted.
        let ids_taken_sql =
            include_str!("../sql/ids_taken.sql").replace("{schema}", &schema.quoted());
        Ok(CdcStore {
            inner: store,
            schema,
            progress,
            poll_every: config.poll_interval,
            polled: Mutex::default(),
            ids_taken_sql,
            cancel,
            tasks,
            slot: config.slot,
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

    fn cdc_target(&self, target: &Target) -> bool {
        target.tenant.is_none() && target.schema == self.schema
    }

    /// Whether the polling claim runs now: always while the slot is not read; else at most every
    /// `poll_every`, or again at once while it comes back full (a backlog the slot does not
    /// cover). A poll that finds a few events finds those the slot is about to deliver: polling
    /// again at once would race the slot for every new event and claim each one twice.
    fn poll_due(&self) -> bool {
        if !self.progress.streaming() {
            return true;
        }
        let polled = self.polled.lock().unwrap_or_else(|e| e.into_inner());
        polled.full || polled.at.is_none_or(|at| at.elapsed() >= self.poll_every)
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

    /// Ids a claim by id did not get. Missed once, each is looked at again after a millisecond
    /// without further ado: most often the row was not visible yet. Missed again, those taken
    /// by another claim, finished or waiting for a retry are done here (the polling claim's);
    /// the rest — still not visible, or ordered behind an event in flight — are looked at again
    /// ([`Progress::missed`]). If the table cannot be read now, every one is looked at again.
    async fn missed(&self, ids: Vec<i64>) {
        let (first, ids) = self.progress.first_misses(ids);
        self.progress.missed(first);
        if ids.is_empty() {
            return;
        }
        let taken: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(self.ids_taken_sql.as_str()))
            .bind(&ids)
            .fetch_all(self.inner.pool())
            .await
            .unwrap_or_default();
        let taken: HashSet<i64> = taken.into_iter().collect();
        let (done, again): (Vec<i64>, Vec<i64>) =
            ids.into_iter().partition(|id| taken.contains(id));
        self.progress.done(done);
        self.progress.missed(again);
    }

    /// Whether the slot streams and the timed poll is due, whatever waits in the queue: also
    /// when no poll has run yet (a relay whose slot delivered before its first claim would
    /// otherwise not poll until the slot's queue ran dry).
    fn poll_overdue(&self) -> bool {
        if !self.progress.streaming() {
            return false;
        }
        let polled = self.polled.lock().unwrap_or_else(|e| e.into_inner());
        polled.at.is_none_or(|at| at.elapsed() >= self.poll_every)
    }

    /// The polling claim beside the slot, and when it ran and whether it came back full.
    async fn poll(&self, p: &ClaimParams<'_>) -> postbox::Result<Claimed> {
        let claimed = self.watch(self.inner.events_claim(p).await)?;
        let full = claimed.events.len() + claimed.exhausted.len()
            >= usize::try_from(p.batch_size).unwrap_or(usize::MAX);
        let mut polled = self.polled.lock().unwrap_or_else(|e| e.into_inner());
        *polled = Polled {
            at: Some(Instant::now()),
            full,
        };
        Ok(claimed)
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
        if !self.cdc_target(p.target) {
            return self.watch(self.inner.events_claim(p).await);
        }
        // The timed poll runs even while delivered ids wait: a relay whose slot is far behind
        // (restarted after a stop, while a polling relay did the work) reads back everything it
        // missed before it reaches new commits, and those must not wait for that.
        if self.poll_overdue() {
            let claimed = self.poll(p).await?;
            if !claimed.events.is_empty()
                || !claimed.undecodable.is_empty()
                || !claimed.exhausted.is_empty()
            {
                if self.progress.waiting() {
                    self.progress.arrived.notify_one();
                }
                return Ok(claimed);
            }
        }
        let ids = self
            .progress
            .take(usize::try_from(p.batch_size).unwrap_or(usize::MAX));
        if !ids.is_empty() {
            let claimed = match self.watch(self.inner.events_claim_ids(p, &ids).await) {
                Ok(claimed) => claimed,
                Err(e) => {
                    self.progress.put_back(&ids);
                    return Err(e);
                }
            };
            // What this claim did not get is not visible yet, someone else's, finished, or
            // waits behind its aggregate or for a retry: looked at again a few times, then the
            // polling claim's (`Progress::missed`).
            let got: HashSet<i64> = claimed
                .events
                .iter()
                .map(|e| e.id)
                .chain(claimed.undecodable.iter().map(|u| u.id))
                .collect();
            let missed: Vec<i64> = ids.into_iter().filter(|id| !got.contains(id)).collect();
            if !missed.is_empty() {
                self.missed(missed).await;
            }
            if self.progress.waiting() {
                self.progress.arrived.notify_one();
            }
            return Ok(claimed);
        }
        if !self.poll_due() {
            return Ok(Claimed::default());
        }
        self.poll(p).await
    }

    async fn claim_floor(&self, target: &Target, from: i64, settled: i64) -> postbox::Result<i64> {
        self.inner.claim_floor(target, from, settled).await
    }

    async fn claim_gaps(&self, p: &GapParams<'_>) -> postbox::Result<Gaps> {
        self.inner.claim_gaps(p).await
    }

    async fn leases_renew(&self, p: &RenewParams<'_>) -> postbox::Result<u64> {
        self.watch(self.inner.leases_renew(p).await)
    }

    async fn events_mark_processed(&self, p: &MarkProcessedParams<'_>) -> postbox::Result<u64> {
        // Recorded or not, the rows are in the table under a lease: a mark that failed is taken
        // over by the polling claim when the lease ends, so the slot need not wait for it.
        let marked = self.watch(self.inner.events_mark_processed(p).await);
        self.progress.done(p.ids.iter().copied());
        marked
    }

    async fn events_mark_failed(
        &self,
        p: &MarkFailedParams<'_>,
    ) -> postbox::Result<Vec<FailedMark>> {
        let marked = self.watch(self.inner.events_mark_failed(p).await);
        self.progress.done(p.tries.iter().map(|t| t.id));
        marked
    }

    async fn events_release(&self, p: &ReleaseParams<'_>) -> postbox::Result<u64> {
        let released = self.watch(self.inner.events_release(p).await);
        self.progress.done(p.releases.iter().map(|r| r.id));
        released
    }

    async fn backlog(&self, target: &Target, ordered: &[String]) -> postbox::Result<Backlog> {
        self.inner.backlog(target, ordered).await
    }

    async fn commit_horizon(
        &self,
        target: &Target,
        probe: Option<&HorizonProbe>,
    ) -> postbox::Result<Horizon> {
        self.watch(self.inner.commit_horizon(target, probe).await)
    }

    async fn wakeups(&self) -> postbox::Result<Option<Box<dyn Wakeups>>> {
        Ok(Some(Box::new(Arrivals {
            progress: Arc::clone(&self.progress),
            schema: self.schema.as_str().to_owned(),
        })))
    }

    async fn outbox_heads(&self, targets: &[Target]) -> postbox::Result<Vec<Option<i64>>> {
        self.inner.outbox_heads(targets).await
    }
}

postbox::forward_store_ops!(CdcStore, |self| &self.inner);

/// Wakes the relay when the slot delivers outbox ids.
struct Arrivals {
    progress: Arc<Progress>,
    schema: String,
}

#[async_trait]
impl Wakeups for Arrivals {
    async fn next(&mut self) -> postbox::Result<Option<String>> {
        let arrived = self.progress.arrived.notified();
        match self.progress.next_recheck() {
            Some(due) => {
                tokio::select! {
                    () = arrived => {}
                    () = tokio::time::sleep_until(tokio::time::Instant::from_std(due)) => {}
                }
            }
            None => arrived.await,
        }
        Ok(Some(self.schema.clone()))
    }
}
