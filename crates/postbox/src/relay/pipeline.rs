//! The claim → publish → mark pipeline: claimed events queue for a publish slot (at most
//! `concurrency` publish at once), each outcome is recorded as soon as its claim is done or
//! within a short window, and the relay claims again as soon as the queue runs low — so one slow
//! event, or a destination that hangs, holds up only itself, never the events behind it.
//!
//! Outcomes, each write fenced by its claim's token:
//! - acknowledged: `PROCESSED`;
//! - a failed try (the event's fault): backed off, or `FAILED` at its limit;
//! - destination unavailable: put back without spending a try, after the pause the sink asked
//!   for; a claim whose every event found its destination down pauses that target's claims for
//!   as long, so an outage does not churn through the backlog.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};
use uuid::Uuid;

use super::lease::LeaseKeeper;
use super::timing::{FLUSH_WINDOW, write_patience};
use super::{FailedNotice, Inner, Notice, RelayConfig, RelayStats, publish};
use crate::backoff::Backoff;
use crate::error::Result;
use crate::event::OutboxEvent;
use crate::metrics as metric;
use crate::schema::{SchemaName, Target};
use crate::sink::{PublishError, Sink};
use crate::store::{
    ClaimOrder, ClaimParams, FailedMark, FailedTry, HorizonProbe, MarkFailedParams,
    MarkProcessedParams, Release, ReleaseParams,
};

/// Marks of acknowledged events written at once, each on a connection of its own, while the
/// relay claims and publishes the next batches: the database works on the next claim while the
/// last batch is marked.
const MARKS_IN_FLIGHT: usize = 2;

/// What one mark of acknowledged events wrote.
struct Marked {
    tenant: String,
    /// Events asked to be marked.
    asked: u64,
    /// Rows marked (fewer: taken over by another relay since).
    marked: u64,
}

/// The pause before an event whose destination was down is tried again, when the sink does not
/// say.
const UNAVAILABLE_PAUSE: Duration = Duration::from_secs(1);

/// One publish's outcome.
struct Done {
    claim: u64,
    id: i64,
    /// When the event's transaction inserted it (the database clock).
    created_at: chrono::DateTime<chrono::Utc>,
    /// `None`: not tried, as an earlier event of its ordered aggregate failed.
    result: Option<std::result::Result<(), PublishError>>,
    /// The route that took it, for the metrics' `route` label.
    route: Option<String>,
}

/// The outcomes of one publish, or of one ordered aggregate's events in this claim.
type Publishing = Pin<Box<dyn Future<Output = Vec<Done>> + Send>>;

/// What waits for a publish slot: one event, or the events of one ordered aggregate in a claim,
/// published one after another in id order (G6).
enum Work {
    One(Arc<OutboxEvent>),
    Chain(Vec<Arc<OutboxEvent>>),
}

impl Work {
    fn events(&self) -> &[Arc<OutboxEvent>] {
        match self {
            Work::One(event) => std::slice::from_ref(event),
            Work::Chain(events) => events,
        }
    }
}

/// Why an event of an ordered aggregate went back without a try.
const HELD_BACK: &str = "held back: an earlier event of its aggregate was not published";

/// The commit horizon of one target (see [`Store::commit_horizon`](crate::Store)).
#[derive(Default)]
struct HorizonState {
    settled: i64,
    probe: Option<HorizonProbe>,
    /// When the pending probe was taken, and whether its wait was logged.
    probe_since: Option<Instant>,
    warned: bool,
}

/// How long ordered events may wait for the writers of a probe before the relay says so.
const HORIZON_PATIENCE: Duration = Duration::from_secs(10);

/// Where a target's claims take new work from (see [`Store::claim_floor`](crate::Store)).
#[derive(Default)]
struct FloorState {
    floor: i64,
    /// When the floor last started again from 0.
    swept: Option<Instant>,
}

/// How often a relay's floor is found again from the start of the table: a sweep, one read that
/// walks the polling index from its start, for an event put back below the floor by a path that
/// does not mark it (an operator's hand-written `UPDATE`, say). Every path of Postbox's own
/// marks it.
const FLOOR_SWEEP: Duration = Duration::from_secs(60);

/// A claim whose events are not all recorded yet.
struct OpenClaim {
    target: Target,
    token: Uuid,
    keeper: LeaseKeeper,
    /// Events of the claim whose outcome is not in yet.
    outstanding: usize,
    /// The claim's event types by id (for alerts).
    event_types: HashMap<i64, String>,
    /// Outcomes not recorded yet.
    done: Vec<i64>,
    tries: Vec<FailedTry>,
    releases: Vec<Release>,
    /// Whether every outcome so far was an unavailable destination.
    all_unavailable: bool,
    /// The shortest pause a destination asked for.
    pause: Option<Duration>,
    started: Instant,
}

impl OpenClaim {
    fn buffered(&self) -> usize {
        self.done.len() + self.tries.len() + self.releases.len()
    }
}

/// What one claim brought in.
pub(super) struct Claimed {
    /// Whether it was a full batch (more work is likely waiting).
    pub(super) full: bool,
    /// Whether it claimed anything.
    pub(super) any: bool,
}

/// The pipeline of one relay run.
pub(super) struct Pipeline {
    inner: Arc<Inner>,
    running: FuturesUnordered<Publishing>,
    /// Marks of acknowledged events being written ([`MARKS_IN_FLIGHT`] at most).
    marking: FuturesUnordered<tokio::task::JoinHandle<Result<Marked>>>,
    queued: VecDeque<(u64, Work)>,
    claims: HashMap<u64, OpenClaim>,
    next_claim: u64,
    flush_at: Option<Instant>,
    /// Targets whose last claim found every destination down, until when.
    paused: HashMap<SchemaName, Instant>,
    /// The commit horizon of each target, with ordering on or claims from a floor.
    horizons: HashMap<SchemaName, HorizonState>,
    /// The floor of each target's claims, where the store claims from one.
    floors: HashMap<SchemaName, FloorState>,
    /// The size of each target's next claim (see [`RelayConfig::max_batch_size`]); back to
    /// `batch_size` when a destination is unavailable.
    sizes: HashMap<SchemaName, u32>,
    /// The last reason a destination gave for being down (redacted).
    last_unavailable: Option<String>,
    stats: RelayStats,
}

impl Pipeline {
    pub(super) fn new(inner: Arc<Inner>) -> Self {
        Pipeline {
            inner,
            running: FuturesUnordered::new(),
            marking: FuturesUnordered::new(),
            queued: VecDeque::new(),
            claims: HashMap::new(),
            next_claim: 0,
            flush_at: None,
            paused: HashMap::new(),
            horizons: HashMap::new(),
            floors: HashMap::new(),
            sizes: HashMap::new(),
            last_unavailable: None,
            stats: RelayStats::default(),
        }
    }

    /// Whether nothing is claimed, publishing or waiting to be recorded.
    pub(super) fn is_idle(&self) -> bool {
        self.running.is_empty()
            && self.queued.is_empty()
            && self.claims.is_empty()
            && self.marking.is_empty()
    }

    /// Whether another batch fits: the queue is running low and no more than `concurrency` plus
    /// one batch of events are claimed and unrecorded.
    pub(super) fn has_room(&self) -> bool {
        let cfg = &self.inner.config;
        let batch = cfg.batch_size as usize;
        let unrecorded: usize = self
            .claims
            .values()
            .map(|c| c.outstanding + c.buffered())
            .sum();
        self.queued.len() <= batch / 2 && unrecorded + batch <= cfg.concurrency.max(batch) + batch
    }

    /// Whether `target`'s claims are paused (its destinations were all down).
    pub(super) fn is_paused(&mut self, target: &Target) -> bool {
        match self.paused.get(&target.schema) {
            Some(until) if *until > Instant::now() => true,
            Some(_) => {
                self.paused.remove(&target.schema);
                false
            }
            None => false,
        }
    }

    /// The commit horizon of `target`: advances it with one probe of the table (see
    /// [`Store::commit_horizon`](crate::Store)) and returns the id up to which ordered events
    /// may be claimed.
    async fn horizon(&mut self, target: &Target, ordered: bool) -> Result<i64> {
        let state = self.horizons.entry(target.schema.clone()).or_default();
        let horizon = self
            .inner
            .store
            .commit_horizon(target, state.probe.as_ref())
            .await?;
        if let Some(settled) = horizon.settled {
            state.settled = state.settled.max(settled);
        }
        match (&state.probe, &horizon.probe) {
            (Some(old), Some(new)) if old == new => {
                if ordered
                    && !state.warned
                    && state
                        .probe_since
                        .is_some_and(|at| at.elapsed() > HORIZON_PATIENCE)
                {
                    state.warned = true;
                    warn!(tenant = target.label(), writers = ?new.writers,
                        "ordered events wait for transactions writing to the outbox table that \
                         stay open (PostgreSQL: find them in pg_locks by virtualtransaction; \
                         MySQL: the transaction that inserted the id named), and end them; \
                         events of ordered aggregates drawn after them are not published until \
                         they commit or roll back");
                }
            }
            _ => {
                state.probe_since = Some(Instant::now());
                state.warned = false;
            }
        }
        state.probe = horizon.probe;
        Ok(state.settled)
    }

    /// The floor of `target`'s next claim: advanced from the last one, or found again from the
    /// start of the table (a sweep) every [`FLOOR_SWEEP`].
    async fn floor(&mut self, target: &Target, settled: i64) -> Result<i64> {
        let state = self.floors.entry(target.schema.clone()).or_default();
        if state.swept.is_none_or(|at| at.elapsed() >= FLOOR_SWEEP) {
            state.swept = Some(Instant::now());
            state.floor = 0;
        }
        state.floor = self
            .inner
            .store
            .claim_floor(target, state.floor, settled)
            .await?;
        Ok(state.floor)
    }

    /// The last reason a destination gave for being down (redacted).
    pub(super) fn last_unavailable(&self) -> Option<&str> {
        self.last_unavailable.as_deref()
    }

    /// The stats since the last call.
    pub(super) fn take_stats(&mut self) -> RelayStats {
        std::mem::take(&mut self.stats)
    }

    /// Claims a batch of `target` and queues its events for publishing; rows that cannot be
    /// read fail at once, alone.
    pub(super) async fn claim(&mut self, target: &Target) -> Result<Claimed> {
        let inner = Arc::clone(&self.inner);
        let cfg = &inner.config;
        let tenant = target.label();
        let ordered = !cfg.ordered_aggregate_types.is_empty();
        let floors = inner.store.claims_from_floor();
        let settled_through = if ordered || floors {
            self.horizon(target, ordered).await?
        } else {
            0
        };
        let floor = if floors {
            self.floor(target, settled_through).await?
        } else {
            0
        };
        let size = self
            .sizes
            .get(&target.schema)
            .copied()
            .unwrap_or(cfg.batch_size);
        let started = Instant::now();
        let mut claimed = inner
            .store
            .events_claim(&ClaimParams {
                target,
                batch_size: size,
                lease: cfg.lease,
                relay_id: &inner.id,
                order: ClaimOrder {
                    aggregate_types: &cfg.ordered_aggregate_types,
                    settled_through,
                },
                floor,
            })
            .await?;
        metrics::histogram!(metric::CLAIM_SECONDS, "tenant" => tenant.to_owned())
            .record(started.elapsed().as_secs_f64());
        let mut stats = RelayStats {
            recovered: claimed.recovered,
            gave_up: claimed.exhausted.len() as u64,
            failed_tries: claimed.recovered + claimed.exhausted.len() as u64,
            ..RelayStats::default()
        };
        let count = claimed.events.len() + claimed.exhausted.len() + claimed.undecodable.len();
        let full = count >= size as usize;
        self.sizes
            .insert(target.schema.clone(), next_size(cfg, size, count));
        if count > 0 {
            metrics::histogram!(metric::BATCH_SIZE, "tenant" => tenant.to_owned())
                .record(count as f64);
        }
        if claimed.recovered > 0 {
            info!(tenant, relay = %inner.id, count = claimed.recovered,
                "recovered {} stale events (a relay did not finish within its lease)", claimed.recovered);
            metrics::counter!(metric::STALE_RECOVERED, "tenant" => tenant.to_owned())
                .increment(claimed.recovered);
        }
        for e in &claimed.exhausted {
            alert_failed(
                &inner,
                tenant,
                e.id,
                &e.event_type,
                e.retry_count,
                &e.last_error,
            );
        }
        let token = claimed.claim_token;
        let mut held = Vec::new();
        if ordered && let Some(first) = claimed.undecodable.iter().map(|u| u.id).min() {
            // An unreadable row's aggregate is not known for sure: ordered events after it wait
            // for the next claim, where the FAILED row holds back its own aggregate only.
            let (later, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut claimed.events)
                .into_iter()
                .partition(|e| e.id > first && is_ordered(cfg, e));
            claimed.events = kept;
            held = later;
        }
        if !held.is_empty() {
            let releases: Vec<Release> = held
                .iter()
                .map(|e| Release {
                    id: e.id,
                    error: HELD_BACK.to_owned(),
                    delay: Duration::ZERO,
                })
                .collect();
            inner
                .store
                .events_release(&ReleaseParams {
                    target,
                    claim_token: token,
                    releases: &releases,
                })
                .await?;
        }
        if !claimed.undecodable.is_empty() {
            // A row no sink could be given fails at once, alone: the rest of the batch goes on.
            let tries: Vec<FailedTry> = claimed
                .undecodable
                .iter()
                .map(|u| FailedTry {
                    id: u.id,
                    error: u.reason.clone(),
                    permanent: true,
                    max_retries: None,
                })
                .collect();
            let deadline = Instant::now() + write_patience(cfg.lease);
            let marks = mark_failed(&inner, target, token, &tries, cfg.retry, deadline).await?;
            stats.failed_tries += marks.len() as u64;
            stats.gave_up += marks.len() as u64;
            for mark in &marks {
                let reason = tries
                    .iter()
                    .find(|t| t.id == mark.id)
                    .map_or("", |t| t.error.as_str());
                alert_failed(
                    &inner,
                    tenant,
                    mark.id,
                    "(unreadable)",
                    mark.retry_count,
                    reason,
                );
            }
        }
        self.add(stats);
        if !claimed.events.is_empty() {
            let claim = self.next_claim;
            self.next_claim += 1;
            let keeper = LeaseKeeper::start(
                Arc::clone(&inner.store),
                target.clone(),
                token,
                claimed.events.iter().map(|e| e.id).collect(),
                cfg.lease,
            );
            let event_types = claimed
                .events
                .iter()
                .map(|e| (e.id, e.event_type.clone()))
                .collect();
            self.claims.insert(
                claim,
                OpenClaim {
                    target: target.clone(),
                    token,
                    keeper,
                    outstanding: claimed.events.len(),
                    event_types,
                    done: Vec::new(),
                    tries: Vec::new(),
                    releases: Vec::new(),
                    all_unavailable: true,
                    pause: None,
                    started: Instant::now(),
                },
            );
            self.queued.extend(
                plan(cfg, claimed.events)
                    .into_iter()
                    .map(|work| (claim, work)),
            );
        }
        Ok(Claimed {
            full,
            any: count > 0,
        })
    }

    /// Starts publishes while slots are free, then waits for one outcome or for the window of
    /// buffered outcomes to close, and records what is due. Returns at once when idle.
    pub(super) async fn step(&mut self) -> Result<()> {
        let cfg = &self.inner.config;
        while self.running.len() < cfg.concurrency {
            let Some((claim, work)) = self.queued.pop_front() else {
                break;
            };
            let sink = Arc::clone(&self.inner.sink);
            let timeout = cfg.publish_timeout;
            self.running.push(Box::pin(async move {
                let mut outcomes = Vec::with_capacity(work.events().len());
                let mut failed = false;
                // A chain stops at its first failure: the later events of the aggregate go
                // back untried, held back by it.
                for event in work.events() {
                    let result = if failed {
                        None
                    } else {
                        let result = publish::publish_one(&sink, event, timeout).await;
                        failed = result.is_err();
                        Some(result)
                    };
                    outcomes.push(Done {
                        claim,
                        id: event.id,
                        created_at: event.created_at,
                        route: result.as_ref().and_then(|_| sink.route_of(event)),
                        result,
                    });
                }
                outcomes
            }));
        }
        if self.running.is_empty() {
            self.flush(true).await?;
            // Nothing else to wait for: the marks in flight.
            return match self.marking.next().await {
                Some(marked) => self.account(marked),
                None => Ok(()),
            };
        }
        let window = async {
            match self.flush_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let marking = async {
            if self.marking.is_empty() {
                std::future::pending().await
            } else {
                self.marking.next().await
            }
        };
        let mut marked = None;
        tokio::select! {
            done = self.running.next() => {
                for done in done.into_iter().flatten() {
                    self.record(done);
                }
            }
            m = marking => marked = m,
            () = window => {}
        }
        if let Some(m) = marked {
            self.account(m)?;
        }
        let due = self.flush_at.is_some_and(|at| at <= Instant::now());
        self.flush(due).await
    }

    /// Counts a finished mark of acknowledged events; its error, if it failed for good.
    fn account(
        &mut self,
        marked: std::result::Result<Result<Marked>, tokio::task::JoinError>,
    ) -> Result<()> {
        let marked = match marked {
            Ok(marked) => marked?,
            // A panic in the mark is the relay's own, as it was when marks ran inline.
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // Cancelled: the runtime is shutting down; the events' leases will run out.
            Err(_) => return Ok(()),
        };
        let fenced = marked.asked - marked.marked;
        metrics::counter!(metric::EVENTS_PUBLISHED, "tenant" => marked.tenant.clone())
            .increment(marked.marked);
        if fenced > 0 {
            metrics::counter!(metric::EVENTS_FENCED, "tenant" => marked.tenant.clone())
                .increment(fenced);
            warn!(tenant = marked.tenant, relay = %self.inner.id, count = fenced,
                "results not recorded: another relay took these events over after this relay's lease expired (they may be published twice)");
        }
        self.add(RelayStats {
            published: marked.marked,
            fenced,
            ..RelayStats::default()
        });
        Ok(())
    }

    /// Writes the mark of `done` (acknowledged events of one claim) on a task of its own, once
    /// fewer than [`MARKS_IN_FLIGHT`] are being written, retried until `deadline`.
    async fn mark_processed(
        &mut self,
        target: &Target,
        token: Uuid,
        done: Vec<i64>,
        deadline: Instant,
    ) -> Result<()> {
        while self.marking.len() >= MARKS_IN_FLIGHT {
            if let Some(marked) = self.marking.next().await {
                self.account(marked)?;
            }
        }
        let store = Arc::clone(&self.inner.store);
        let target = target.clone();
        self.marking.push(tokio::spawn(async move {
            let tenant = target.label().to_owned();
            let processed = MarkProcessedParams {
                target: &target,
                claim_token: token,
                ids: &done,
            };
            let started = Instant::now();
            let marked =
                with_patience(deadline, || store.events_mark_processed(&processed)).await?;
            metrics::histogram!(metric::MARK_SECONDS, "tenant" => tenant.clone())
                .record(started.elapsed().as_secs_f64());
            Ok(Marked {
                tenant,
                asked: done.len() as u64,
                marked,
            })
        }));
        Ok(())
    }

    /// Publishes and records everything claimed so far.
    pub(super) async fn finish(&mut self) -> Result<()> {
        while !self.is_idle() {
            self.step().await?;
        }
        Ok(())
    }

    /// Stops: events still waiting for a publish slot go back to their queue at once (no try
    /// spent), the publishes in flight finish and are recorded.
    pub(super) async fn stop(&mut self) -> Result<()> {
        for (claim, work) in std::mem::take(&mut self.queued) {
            if let Some(open) = self.claims.get_mut(&claim) {
                for event in work.events() {
                    open.outstanding -= 1;
                    open.keeper.release(event.id);
                    open.releases.push(Release {
                        id: event.id,
                        error: "the relay stopped before publishing it".to_owned(),
                        delay: Duration::ZERO,
                    });
                }
                // Not an outage: the claim's pause, if any, comes from its outcomes.
            }
        }
        self.finish().await
    }

    /// Buffers one outcome with its claim.
    fn record(&mut self, done: Done) {
        let Some(open) = self.claims.get_mut(&done.claim) else {
            return;
        };
        open.keeper.release(done.id);
        open.outstanding -= 1;
        let Some(result) = done.result else {
            open.releases.push(Release {
                id: done.id,
                error: HELD_BACK.to_owned(),
                delay: Duration::ZERO,
            });
            if self.flush_at.is_none() {
                self.flush_at = Some(Instant::now() + FLUSH_WINDOW);
            }
            return;
        };
        let tenant = open.target.label().to_owned();
        let route = done.route.unwrap_or_else(|| "default".to_owned());
        let outcome = match &result {
            Ok(()) => "ok",
            Err(e) if e.is_unavailable() => "unavailable",
            Err(_) => "failed",
        };
        metrics::counter!(metric::PUBLISH_OUTCOMES, "tenant" => tenant.clone(),
            "route" => route.clone(), "outcome" => outcome)
        .increment(1);
        match result {
            Ok(()) => {
                open.all_unavailable = false;
                open.done.push(done.id);
                // From the insert (database clock) to the destination's acknowledgement (this
                // host's clock): the two agree as far as their clocks are synchronised.
                let latency = (chrono::Utc::now() - done.created_at)
                    .to_std()
                    .unwrap_or_default();
                self.stats.latency_total += latency;
                self.inner.live.add_latency(latency);
                metrics::histogram!(metric::PUBLISH_LATENCY, "tenant" => tenant, "route" => route)
                    .record(latency.as_secs_f64());
                // A destination answered: the target's claims go on.
                self.paused.remove(&open.target.schema);
            }
            Err(e) if e.is_unavailable() => {
                let delay = e.retry_after().unwrap_or(UNAVAILABLE_PAUSE);
                open.pause = Some(open.pause.map_or(delay, |p| p.min(delay)));
                // Claims grow only while destinations answer: an outage is not a backlog to
                // take in large batches.
                self.sizes.remove(&open.target.schema);
                if open.all_unavailable && !a_destination_is_up(&*self.inner.sink) {
                    // No destination of this claim answered so far and none is known up: no
                    // new claims of the target until the pause is over (a success lifts it).
                    self.paused
                        .insert(open.target.schema.clone(), Instant::now() + delay);
                }
                // Logged and stored: a sink's error may quote a URL with its secrets.
                let error = crate::redact::redact(&e.to_string());
                self.last_unavailable = Some(error.clone());
                open.releases.push(Release {
                    id: done.id,
                    error,
                    delay,
                });
            }
            Err(e) => {
                open.all_unavailable = false;
                // The retry policy of the event's type, if one matches.
                let event_type = open.event_types.get(&done.id).map_or("", String::as_str);
                let policy = self.inner.config.policy_for(event_type);
                open.tries.push(FailedTry {
                    id: done.id,
                    permanent: e.is_permanent(),
                    error: crate::redact::redact(&e.to_string()),
                    max_retries: policy.max_retries.and_then(|m| i32::try_from(m).ok()),
                });
            }
        }
        if self.flush_at.is_none() {
            self.flush_at = Some(Instant::now() + FLUSH_WINDOW);
        }
    }

    /// Records the buffered outcomes of every finished claim, and with `all`, of every claim.
    /// The writes of one flush are retried together for at most [`write_patience`], so their
    /// leases are not left unrenewed for longer (the invariant of [`super::timing`]).
    async fn flush(&mut self, all: bool) -> Result<()> {
        let deadline = Instant::now() + write_patience(self.inner.config.lease);
        let ready: Vec<u64> = self
            .claims
            .iter()
            .filter(|(_, c)| c.outstanding == 0 || (all && c.buffered() > 0))
            .map(|(id, _)| *id)
            .collect();
        for id in ready {
            self.flush_claim(id, deadline).await?;
        }
        self.flush_at = self
            .claims
            .values()
            .any(|c| c.buffered() > 0)
            .then(|| Instant::now() + FLUSH_WINDOW);
        Ok(())
    }

    /// Writes the buffered outcomes of `claim`, retrying until `deadline`.
    async fn flush_claim(&mut self, claim: u64, deadline: Instant) -> Result<()> {
        let inner = Arc::clone(&self.inner);
        let cfg = &inner.config;
        let Some(open) = self.claims.get_mut(&claim) else {
            return Ok(());
        };
        let finished = open.outstanding == 0;
        let target = open.target.clone();
        let tenant = target.label();
        let token = open.token;
        let done = std::mem::take(&mut open.done);
        let tries = std::mem::take(&mut open.tries);
        let releases = std::mem::take(&mut open.releases);
        let mut stats = RelayStats::default();
        if !done.is_empty() {
            self.mark_processed(&target, token, done, deadline).await?;
        }
        if !releases.is_empty() {
            let params = ReleaseParams {
                target: &target,
                claim_token: token,
                releases: &releases,
            };
            let released = with_patience(deadline, || inner.store.events_release(&params)).await?;
            stats.deferred += released;
            stats.fenced += releases.len() as u64 - released;
            metrics::counter!(metric::EVENTS_DEFERRED, "tenant" => tenant.to_owned())
                .increment(released);
            for r in &releases {
                inner.retries.note(r.delay);
            }
            debug!(
                tenant,
                count = released,
                "destination unavailable; events put back without spending a try"
            );
        }
        if !tries.is_empty() {
            // One mark per backoff: events whose type has a retry policy of its own back off
            // by it.
            let event_types = &self.claims[&claim].event_types;
            let backoff_of = |id: i64| {
                let event_type = event_types.get(&id).map_or("", String::as_str);
                cfg.policy_for(event_type).backoff
            };
            let mut groups: Vec<(Backoff, Vec<FailedTry>)> = Vec::new();
            for t in &tries {
                let backoff = backoff_of(t.id);
                match groups.iter_mut().find(|(b, _)| *b == backoff) {
                    Some((_, group)) => group.push(t.clone()),
                    None => groups.push((backoff, vec![t.clone()])),
                }
            }
            let mut marks = Vec::with_capacity(tries.len());
            for (backoff, group) in &groups {
                marks.extend(mark_failed(&inner, &target, token, group, *backoff, deadline).await?);
            }
            stats.failed_tries += marks.len() as u64;
            stats.fenced += (tries.len() - marks.len()) as u64;
            metrics::counter!(metric::PUBLISH_FAILURES, "tenant" => tenant.to_owned())
                .increment(marks.len() as u64);
            for mark in marks {
                let error = tries
                    .iter()
                    .find(|t| t.id == mark.id)
                    .map_or("", |t| t.error.as_str());
                if mark.gave_up {
                    stats.gave_up += 1;
                    let event_type = event_types.get(&mark.id).map_or("", String::as_str);
                    alert_failed(&inner, tenant, mark.id, event_type, mark.retry_count, error);
                } else {
                    let retry_in =
                        backoff_of(mark.id).delay(u32::try_from(mark.retry_count).unwrap_or(0));
                    inner.retries.note(retry_in);
                    warn!(
                        tenant,
                        event_id = mark.id,
                        retry_count = mark.retry_count,
                        ?retry_in,
                        error,
                        "publish failed; retry scheduled"
                    );
                }
            }
        }
        if stats.fenced > 0 {
            metrics::counter!(metric::EVENTS_FENCED, "tenant" => tenant.to_owned())
                .increment(stats.fenced);
            warn!(tenant, relay = %inner.id, count = stats.fenced,
                "results not recorded: another relay took these events over after this relay's lease expired (they may be published twice)");
        }
        if finished && let Some(open) = self.claims.remove(&claim) {
            if open.all_unavailable
                && let Some(pause) = open.pause
                && !a_destination_is_up(&*self.inner.sink)
            {
                // Every destination of the claim was down, and no other is known up: no further
                // claims of this target until the sink's next probe, instead of churning through
                // its backlog. Where another route is up, claims go on: the events of the down
                // one are put back until its probe and the next claim reaches past them.
                self.paused
                    .insert(open.target.schema.clone(), Instant::now() + pause);
            }
            metrics::histogram!(metric::BATCH_SECONDS, "tenant" => tenant.to_owned())
                .record(open.started.elapsed().as_secs_f64());
        }
        self.add(stats);
        Ok(())
    }

    fn add(&mut self, stats: RelayStats) {
        self.stats.add(stats);
        self.inner.live.add(stats);
    }
}

/// The size of the claim after one of `size` that brought `count` events: doubled after a full
/// claim, up to `max_batch_size`; halved after one less than half full, down to `batch_size`.
fn next_size(cfg: &RelayConfig, size: u32, count: usize) -> u32 {
    let cap = cfg.max_batch_size.max(cfg.batch_size);
    if count >= size as usize {
        size.saturating_mul(2).min(cap)
    } else if count < (size / 2) as usize {
        (size / 2).max(cfg.batch_size)
    } else {
        size
    }
}

/// Whether `event` belongs to an ordered aggregate of `cfg`.
fn is_ordered(cfg: &RelayConfig, event: &OutboxEvent) -> bool {
    match (&event.aggregate_type, &event.aggregate_id) {
        (Some(kind), Some(_)) => crate::store::orders_type(&cfg.ordered_aggregate_types, kind),
        _ => false,
    }
}

/// A claim's events (in id order) as work: each ordered aggregate's events as one chain, in id
/// order, where its first event was; every other event alone.
fn plan(cfg: &RelayConfig, events: Vec<OutboxEvent>) -> Vec<Work> {
    let mut work: Vec<Work> = Vec::with_capacity(events.len());
    let mut chains: HashMap<(String, String), usize> = HashMap::new();
    for event in events {
        let event = Arc::new(event);
        if !is_ordered(cfg, &event) {
            work.push(Work::One(event));
            continue;
        }
        let key = (
            event.aggregate_type.clone().unwrap_or_default(),
            event.aggregate_id.clone().unwrap_or_default(),
        );
        match chains.get(&key) {
            Some(&at) => {
                if let Work::Chain(chain) = &mut work[at] {
                    chain.push(event);
                }
            }
            None => {
                chains.insert(key, work.len());
                work.push(Work::Chain(vec![event]));
            }
        }
    }
    work
}

/// Whether `sink` reports one of its destinations up (a route beside a down one). A sink that
/// tracks no health reports none.
fn a_destination_is_up(sink: &dyn Sink) -> bool {
    sink.health().iter().any(|h| h.up)
}

/// Records failed tries backing off by `retry`, retrying until `deadline`.
async fn mark_failed(
    inner: &Inner,
    target: &Target,
    token: Uuid,
    tries: &[FailedTry],
    retry: Backoff,
    deadline: Instant,
) -> Result<Vec<FailedMark>> {
    let failed = MarkFailedParams {
        target,
        claim_token: token,
        tries,
        retry,
    };
    with_patience(deadline, || inner.store.events_mark_failed(&failed)).await
}

/// Retries a write of outcomes until `deadline` (at most [`write_patience`] after its flush
/// began), so a short database outage after publishing does not turn published events into
/// stale claims (which would publish them again). A wait that would end past the deadline is
/// not begun: the last attempt starts before it.
async fn with_patience<T, F, Fut>(deadline: Instant, mut op: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let mut waits = Backoff::new(Duration::from_millis(50), Duration::from_secs(2)).attempts();
    loop {
        match op().await {
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() + waits.clone().next_delay() < deadline => {
                let wait = waits.next_delay();
                warn!(error = %e, retry_in = ?wait, "recording results failed; retrying");
                tokio::time::sleep(wait).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// The operator alert for an event that went `FAILED`: a log line, a metric, and a notice to
/// the relay's subscribers (an alert sink).
pub(super) fn alert_failed(
    inner: &Inner,
    tenant: &str,
    id: i64,
    event_type: &str,
    retry_count: i32,
    error: &str,
) {
    error!(
        tenant,
        event_id = id,
        event_type,
        retry_count,
        error,
        "event FAILED and will not be retried; fix the cause, then retry it (an operator's retry puts it back in the queue)"
    );
    metrics::counter!(metric::EVENTS_FAILED, "tenant" => tenant.to_owned()).increment(1);
    // No subscriber is not an error: the log line above is the alert then.
    let _ = inner.notices.send(Notice::Failed(FailedNotice::new(
        tenant,
        id,
        event_type,
        retry_count,
        error,
    )));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_grow_with_a_backlog_and_shrink_back_when_it_is_gone() {
        let cfg = RelayConfig::default().batch_size(100).max_batch_size(500);
        let mut size = cfg.batch_size;
        let mut sizes = Vec::new();
        // Full claims: a backlog.
        for _ in 0..4 {
            size = next_size(&cfg, size, size as usize);
            sizes.push(size);
        }
        assert_eq!(sizes, [200, 400, 500, 500]);
        // Claims half full hold their size; nearly empty ones halve it, down to batch_size.
        assert_eq!(next_size(&cfg, 500, 300), 500);
        let mut shrinking = Vec::new();
        for _ in 0..4 {
            size = next_size(&cfg, size, 3);
            shrinking.push(size);
        }
        assert_eq!(shrinking, [250, 125, 100, 100]);
        // A cap at or below batch_size: claims stay at batch_size.
        let fixed = RelayConfig::default().batch_size(100).max_batch_size(50);
        assert_eq!(next_size(&fixed, 100, 100), 100);
        assert_eq!(next_size(&fixed, 100, 0), 100);
    }
}
