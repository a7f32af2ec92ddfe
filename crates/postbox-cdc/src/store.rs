//! [`CdcStore`]: a [`PgStore`] whose claims take the ids the slot delivered, in commit order —
//! read unclaimed ([`crate::reads`]) or claimed by id — and fall back to the polling claim for
//! everything else.

use std::collections::{BTreeSet, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pg_walstream::CancellationToken;
use postbox::store::{
    Backlog, Capabilities, ClaimOrder, ClaimParams, Claimed, FailedMark, GapParams, Gaps, Horizon,
    HorizonProbe, MarkFailedParams, MarkProcessedParams, ReleaseParams, RenewParams, Wakeups,
};
use postbox::{PgStore, SchemaName, Store, Target};
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::config::CdcConfig;
use crate::error::Result;
use crate::progress::Progress;
use crate::reads::Reads;
use crate::{setup, stream};

/// A [`Store`] for a relay that reads the outbox table's inserts from a PostgreSQL logical
/// replication slot (change data capture) instead of polling for them.
///
/// Started with [`CdcStore::start`] over a migrated [`PgStore`], it keeps one replication
/// connection open on the slot: each committed transaction's outbox ids arrive in commit order,
/// and the relay's next claim takes exactly those rows by primary key — no scan of the table —
/// reading them without a claim (one write per event: the mark), or claiming them by id when
/// aggregates are ordered or [`CdcConfig::claim`] is set.
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
    /// The events published without a claim ([`crate::reads`]).
    reads: Reads,
    /// The relay id and lease of the last read: what a failed read event is claimed with, so
    /// that its failed try is recorded as a claimed event's is.
    reader: Mutex<Option<(String, Duration)>>,
    /// [`CdcConfig::claim`].
    claim: bool,
    /// The server's WAL position when the relay started.
    started_at: u64,
}

/// When the polling claim last ran beside the slot, whether it came back full, when the slot
/// last named events a claim had taken, and the events the polls took that the slot has not
/// named yet.
#[derive(Default)]
struct Polled {
    at: Option<Instant>,
    full: bool,
    overlapped: Option<Instant>,
    taken: BTreeSet<i64>,
}

/// The most ids of events its polls took that a relay remembers until the slot names them (the
/// lowest are forgotten first: a slot that names one of those costs a look at the table).
const POLLED_KEPT: usize = 1_000_000;

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
        let started_at: i64 = sqlx::query_scalar(include_str!("../sql/wal_position.sql"))
            .fetch_one(store.pool())
            .await
            .map_err(crate::Error::Database)?;
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
            reads: Reads::default(),
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

    fn cdc_target(&self, target: &Target) -> bool {
        target.tenant.is_none() && target.schema == self.schema
    }

    /// Whether the polling claim runs now: always while the slot is not read; else at most every
    /// `poll_every`, or again at once while it comes back full, once the slot has named what was
    /// committed before the relay started, and while, for `poll_every`, nothing a claim took was
    /// also named by the slot (a backlog the slot does not cover). A poll that finds a few events
    /// finds those the slot is about to deliver: polling again at once would race the slot for
    /// every new event and take each one twice. So would full polls of a backlog the slot is
    /// delivering: each event would be taken by a poll, then looked at again when the slot
    /// names it.
    fn poll_due(&self) -> bool {
        if !self.progress.streaming() {
            // A standby (another relay reads the slot) leaves the slot's events to that relay,
            // which publishes them and polls for everything else, unless it stops confirming:
            // polling beside it would publish the events it is reading a second time.
            return !self.progress.standby() || self.progress.stalled();
        }
        let polled = self.polled.lock().unwrap_or_else(|e| e.into_inner());
        let apart = polled
            .overlapped
            .is_none_or(|at| at.elapsed() >= self.poll_every);
        let caught_up = self.progress.positions().1 >= self.started_at;
        (polled.full && apart && caught_up)
            || polled.at.is_none_or(|at| at.elapsed() >= self.poll_every)
    }

    /// The slot named events a claim had taken, or a poll claimed events being read: the
    /// polls and the slot are taking the same events.
    fn overlapped(&self) {
        self.polled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .overlapped = Some(Instant::now());
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
        if !done.is_empty() {
            self.overlapped();
        }
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

    /// Up to `n` ids the slot named, for a read or a claim by id. Those this relay's polls took
    /// are theirs: they are left out at once, without a look at the table (a relay whose slot
    /// starts behind, or catches up on a backlog it polled meanwhile, is named every one of
    /// them).
    fn take(&self, n: usize) -> Vec<i64> {
        loop {
            let ids = self.progress.take(n);
            if ids.is_empty() {
                return ids;
            }
            let (polled, ids): (Vec<i64>, Vec<i64>) = {
                let mut polled = self.polled.lock().unwrap_or_else(|e| e.into_inner());
                if polled.taken.is_empty() {
                    return ids;
                }
                ids.into_iter().partition(|id| polled.taken.remove(id))
            };
            if polled.is_empty() {
                return ids;
            }
            self.overlapped();
            self.progress.done(polled);
            if !ids.is_empty() {
                return ids;
            }
        }
    }

    /// The polling claim beside the slot, and when it ran and whether it came back full.
    async fn poll(&self, p: &ClaimParams<'_>) -> postbox::Result<Claimed> {
        let mut claimed = self.watch(self.inner.events_claim(p).await)?;
        let full = claimed.events.len() + claimed.exhausted.len()
            >= usize::try_from(p.batch_size).unwrap_or(usize::MAX);
        // Events this relay is publishing from a read are left to the read, under this claim's
        // token; those a read published whose mark found them claimed are marked now.
        let before = claimed.events.len();
        let settle = self.reads.poll_claimed(&mut claimed);
        if claimed.events.len() < before {
            self.overlapped();
        }
        if !settle.is_empty() {
            let done = MarkProcessedParams {
                target: p.target,
                claim_token: claimed.claim_token,
                ids: &settle,
            };
            self.watch(self.inner.events_mark_processed(&done).await)?;
        }
        let mut polled = self.polled.lock().unwrap_or_else(|e| e.into_inner());
        polled.at = Some(Instant::now());
        polled.full = full;
        polled.taken.extend(claimed.events.iter().map(|e| e.id));
        while polled.taken.len() > POLLED_KEPT {
            polled.taken.pop_first();
        }
        Ok(claimed)
    }
}

impl CdcStore {
    /// The outcome of `ids` of `target` was written (`ok`) or could not be. Only the slot's own
    /// table counts towards its confirmation: a tenant's ids are numbered by a sequence of their
    /// own and may equal ids the slot delivered. A write that failed leaves the slot's position
    /// where it is, the ids unrecorded: the relay retries the write for a while, and if it
    /// gives up, the polling claim takes the rows (read ones are still `PENDING`; claimed ones
    /// once their lease ends), publishes them and records them, and its mark lets the position
    /// pass them.
    fn recorded(&self, target: &Target, ids: impl IntoIterator<Item = i64>, ok: bool) {
        if ok && self.cdc_target(target) {
            self.progress.done(ids);
        }
    }
}

/// The outcomes of read events ([`crate::reads`]): each recorded under the token of the claim
/// that holds the row — a poll of this relay that adopted it, or (for a failed try or a put
/// back) a claim by id made for it — or, for `PROCESSED`, by the unclaimed mark.
impl CdcStore {
    async fn mark_read(&self, p: &MarkProcessedParams<'_>) -> postbox::Result<u64> {
        let split = self.reads.split(p.ids.iter().copied());
        let mut marked = 0;
        let mut failed = None;
        // Ids whose mark failed: they stay with this read's token (a retry of the mark comes
        // back here), but no poll adopts them any more (the relay may give up on the mark).
        let mut unrecorded: HashSet<i64> = HashSet::new();
        for (token, ids) in &split.adopted {
            match self.mark_with(p.target, *token, ids).await {
                Ok(n) => marked += n,
                Err(e) => {
                    unrecorded.extend(ids);
                    failed = Some(e);
                }
            }
        }
        // A mark that fails leaves its rows PENDING: published again later (at-least-once).
        let unmarked = match self.watch(
            self.inner
                .events_mark_unclaimed(p.target, &split.read)
                .await,
        ) {
            Ok(done) => {
                marked += done.len() as u64;
                let done: HashSet<i64> = done.into_iter().collect();
                split
                    .read
                    .into_iter()
                    .filter(|id| !done.contains(id))
                    .collect()
            }
            Err(e) => {
                unrecorded.extend(&split.read);
                failed = Some(e);
                Vec::new()
            }
        };
        let finished: Vec<i64> = p
            .ids
            .iter()
            .copied()
            .filter(|id| !unrecorded.contains(id))
            .collect();
        for (token, ids) in self.reads.finish(&p.claim_token, &finished, &unmarked) {
            match self.mark_with(p.target, token, &ids).await {
                Ok(n) => marked += n,
                Err(e) => failed = Some(e),
            }
        }
        self.reads.unrecorded(&unrecorded);
        failed.map_or(Ok(marked), Err)
    }

    async fn mark_with(&self, target: &Target, token: Uuid, ids: &[i64]) -> postbox::Result<u64> {
        let params = MarkProcessedParams {
            target,
            claim_token: token,
            ids,
        };
        self.watch(self.inner.events_mark_processed(&params).await)
    }

    /// The tokens under which read events' failed tries or put-backs are recorded: those a poll
    /// of this relay adopted, and the rest claimed by id now (a row claimed by another relay
    /// meanwhile is that relay's: it is left out).
    async fn claims_of(
        &self,
        target: &Target,
        ids: impl IntoIterator<Item = i64>,
    ) -> postbox::Result<Vec<(Uuid, HashSet<i64>)>> {
        let split = self.reads.split(ids);
        let mut claims: Vec<(Uuid, HashSet<i64>)> = split
            .adopted
            .into_iter()
            .map(|(token, ids)| (token, ids.into_iter().collect()))
            .collect();
        if split.read.is_empty() {
            return Ok(claims);
        }
        let (relay_id, lease) = self
            .reader
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_else(|| ("postbox-cdc".to_owned(), Duration::from_secs(30)));
        let params = ClaimParams {
            target,
            batch_size: u32::try_from(split.read.len()).unwrap_or(u32::MAX),
            lease,
            relay_id: &relay_id,
            order: ClaimOrder::default(),
            floor: 0,
        };
        let claimed = self.watch(self.inner.events_claim_ids(&params, &split.read).await)?;
        let got = (claimed.events.iter().map(|e| e.id))
            .chain(claimed.undecodable.iter().map(|u| u.id))
            .collect();
        claims.push((claimed.claim_token, got));
        Ok(claims)
    }

    async fn fail_read(&self, p: &MarkFailedParams<'_>) -> postbox::Result<Vec<FailedMark>> {
        let ids: Vec<i64> = p.tries.iter().map(|t| t.id).collect();
        let claims = self.claims_of(p.target, ids.iter().copied()).await;
        self.reads.finish(&p.claim_token, &ids, &[]);
        let mut marks = Vec::new();
        for (token, held) in claims? {
            let tries: Vec<_> = p
                .tries
                .iter()
                .filter(|t| held.contains(&t.id))
                .cloned()
                .collect();
            let params = MarkFailedParams {
                claim_token: token,
                tries: &tries,
                ..p.clone()
            };
            marks.extend(self.watch(self.inner.events_mark_failed(&params).await)?);
        }
        Ok(marks)
    }

    async fn release_read(&self, p: &ReleaseParams<'_>) -> postbox::Result<u64> {
        let ids: Vec<i64> = p.releases.iter().map(|r| r.id).collect();
        let claims = self.claims_of(p.target, ids.iter().copied()).await;
        self.reads.finish(&p.claim_token, &ids, &[]);
        let mut released = 0;
        for (token, held) in claims? {
            let releases: Vec<_> = p
                .releases
                .iter()
                .filter(|r| held.contains(&r.id))
                .cloned()
                .collect();
            let params = ReleaseParams {
                claim_token: token,
                releases: &releases,
                ..p.clone()
            };
            released += self.watch(self.inner.events_release(&params).await)?;
        }
        Ok(released)
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
        let ids = self.take(usize::try_from(p.batch_size).unwrap_or(usize::MAX));
        if !ids.is_empty() {
            // Without ordered aggregate types the rows are read and published unclaimed (one
            // write per event, the mark), unless told to claim them (a poller runs beside); an
            // ordered event is claimed, so that the claim can hold it back behind an earlier
            // event of its aggregate.
            let read = !self.claim && p.order.aggregate_types.is_empty();
            let result = if read {
                self.reads.begin(&ids);
                self.inner.events_read_ids(p, &ids).await
            } else {
                self.inner.events_claim_ids(p, &ids).await
            };
            let claimed = match self.watch(result) {
                Ok(claimed) => claimed,
                Err(e) => {
                    if read {
                        self.reads.read(Uuid::nil(), &ids, &HashSet::new());
                    }
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
            if read {
                self.reads.read(claimed.claim_token, &ids, &got);
                *self.reader.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some((p.relay_id.to_owned(), p.lease));
            }
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
        if !self.reads.is_read(&p.claim_token) {
            return self.watch(self.inner.leases_renew(p).await);
        }
        // A read holds no lease; what a poll of this relay adopted holds that claim's.
        let split = self.reads.split(p.ids.iter().copied());
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
        let marked = if self.reads.is_read(&p.claim_token) {
            self.mark_read(p).await
        } else {
            self.watch(self.inner.events_mark_processed(p).await)
        };
        self.recorded(p.target, p.ids.iter().copied(), marked.is_ok());
        marked
    }

    async fn events_mark_failed(
        &self,
        p: &MarkFailedParams<'_>,
    ) -> postbox::Result<Vec<FailedMark>> {
        let marked = if self.reads.is_read(&p.claim_token) {
            self.fail_read(p).await
        } else {
            self.watch(self.inner.events_mark_failed(p).await)
        };
        self.recorded(p.target, p.tries.iter().map(|t| t.id), marked.is_ok());
        marked
    }

    async fn events_release(&self, p: &ReleaseParams<'_>) -> postbox::Result<u64> {
        let released = if self.reads.is_read(&p.claim_token) {
            self.release_read(p).await
        } else {
            self.watch(self.inner.events_release(p).await)
        };
        self.recorded(p.target, p.releases.iter().map(|r| r.id), released.is_ok());
        released
    }

    async fn backlog(&self, target: &Target, ordered: &[String]) -> postbox::Result<Backlog> {
        self.inner.backlog(target, ordered).await
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

    async fn wakeups(&self) -> postbox::Result<Option<Box<dyn Wakeups>>> {
        Ok(Some(Box::new(Arrivals {
            progress: Arc::clone(&self.progress),
            schema: self.schema.as_str().to_owned(),
            woke_for: None,
        })))
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

/// Wakes the relay when the slot delivers outbox ids, and when a recheck falls due — once for
/// each: a relay that does not claim then (its target paused, its pipeline full) is not woken
/// again for the same recheck, and claims it on its next round.
struct Arrivals {
    progress: Arc<Progress>,
    schema: String,
    /// The due time of the last recheck this woke the relay for.
    woke_for: Option<Instant>,
}

#[async_trait]
impl Wakeups for Arrivals {
    async fn next(&mut self) -> postbox::Result<Option<String>> {
        let arrived = self.progress.arrived.notified();
        let due = self.progress.next_recheck_after(self.woke_for);
        match due {
            Some(due) => {
                tokio::select! {
                    () = arrived => {}
                    () = tokio::time::sleep_until(tokio::time::Instant::from_std(due)) => {
                        self.woke_for = Some(due);
                    }
                }
            }
            None => arrived.await,
        }
        Ok(Some(self.schema.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pg_walstream::SharedLsnFeedback;

    /// A relay that does not claim a due recheck (its target paused) is woken for it once, not
    /// at once again and again (which spun a core).
    #[tokio::test]
    async fn a_due_recheck_wakes_the_relay_once() {
        let progress = Arc::new(Progress::default());
        progress.restart(SharedLsnFeedback::new_shared());
        let mut arrivals = Arrivals {
            progress: Arc::clone(&progress),
            schema: "public".to_owned(),
            woke_for: None,
        };
        progress.committed(100, vec![1]);
        let delivered = tokio::time::timeout(Duration::from_secs(1), arrivals.next()).await;
        assert!(delivered.is_ok(), "woken by the delivery");
        assert_eq!(progress.take(10), vec![1]);
        progress.missed([1]);
        let first = tokio::time::timeout(Duration::from_secs(1), arrivals.next()).await;
        assert!(first.is_ok(), "woken when the recheck falls due");
        let again = tokio::time::timeout(Duration::from_millis(200), arrivals.next()).await;
        assert!(again.is_err(), "not woken again for the same recheck");
        progress.committed(200, vec![2]);
        let arrival = tokio::time::timeout(Duration::from_secs(1), arrivals.next()).await;
        assert!(arrival.is_ok(), "woken by the next delivery");
    }
}
