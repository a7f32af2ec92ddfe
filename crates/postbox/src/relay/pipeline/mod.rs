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
//!
//! The parts, one file each: [`claim`] (where claims start, how large, what they bring in),
//! [`outcomes`] (each publish's result, buffered with its claim) and [`flush`] (the buffered
//! results written, fenced by the claim's token).

mod claim;
pub(super) use claim::{CLAIMS_AT_ONCE, Shape};
mod flush;
mod outcomes;
mod queue;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::time::Instant;
use tracing::warn;
use uuid::Uuid;

use super::lease::LeaseKeeper;
use super::timing::write_patience;
use super::{Inner, RelayStats};
use crate::error::Result;
use crate::schema::{SchemaName, Target};
use crate::store::{FailedTry, Release};

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
    /// When the first outcome not handed to a write was buffered.
    buffered_since: Option<Instant>,
    /// Whether a write of its outcomes is under way (one at a time per claim).
    writing: bool,
}

impl OpenClaim {
    fn buffered(&self) -> usize {
        self.done.len() + self.tries.len() + self.releases.len()
    }
}

/// What the pipeline has to record next ([`Pipeline::ready`]).
pub(super) enum Ready {
    /// The outcomes of one piece of work.
    Published(Vec<outcomes::Done>),
    /// A write of a claim's outcomes finished: the claim, its target, what it wrote.
    Written(
        u64,
        SchemaName,
        std::result::Result<flush::Written, tokio::task::JoinError>,
    ),
    /// The window of buffered outcomes closed.
    Window,
    /// Nothing is publishing and outcomes are buffered: write them all.
    Flush,
    /// A claim that outlasted its round returned (see [`Pipeline::claim_each`]).
    Claimed(Box<claim::Asked>),
}

/// What one claim brought in.
pub(super) struct Claimed {
    /// Whether it was a full batch (more work is likely waiting).
    pub(super) full: bool,
    /// Whether it claimed anything.
    pub(super) any: bool,
    /// An ordered claim that came back short while this relay had events of the target in
    /// flight: what it left may wait for those alone, so the relay claims again as soon as they
    /// are recorded rather than waiting for its next poll.
    pub(super) behind_own: bool,
}

/// The pipeline of one relay run.
pub(super) struct Pipeline {
    inner: Arc<Inner>,
    running: FuturesUnordered<outcomes::Publishing>,
    /// Writes of outcomes under way ([`flush::WRITES_IN_FLIGHT`] at most).
    writing: FuturesUnordered<flush::Writing>,
    /// How many of them each target has ([`flush::TARGET_WRITES_IN_FLIGHT`] at most).
    writes_of: HashMap<SchemaName, usize>,
    /// Claimed work waiting for a publish slot, the targets taking turns.
    queued: queue::Queue,
    claims: HashMap<u64, OpenClaim>,
    next_claim: u64,
    flush_at: Option<Instant>,
    /// Targets whose last claim found every destination down, until when.
    paused: HashMap<SchemaName, Instant>,
    /// The commit horizon of each target, with ordering on or claims from a floor.
    horizons: HashMap<SchemaName, claim::HorizonState>,
    /// The floor of each target's claims, where the store claims from one.
    floors: HashMap<SchemaName, claim::FloorState>,
    /// The size of each target's next claim (see [`crate::RelayConfig::max_batch_size`]); back to
    /// `batch_size` when a destination is unavailable.
    sizes: HashMap<SchemaName, u32>,
    /// Targets whose last ordered claim came back short beside this relay's own events in
    /// flight: they are claimed again once those are recorded, not beside them.
    behind_own: HashSet<SchemaName>,
    /// Claims that outlasted their round, taken in when they return (see
    /// [`Pipeline::claim_each`]), and their targets.
    claiming: FuturesUnordered<claim::Asking>,
    /// Their targets, and the most events each may bring.
    claiming_targets: HashMap<SchemaName, (Target, usize)>,
    /// What such claims brought, for the relay's loop ([`Pipeline::take_late`]).
    late: Vec<(Target, Result<Claimed>)>,
    /// The last reason a destination gave for being down (redacted).
    last_unavailable: Option<String>,
    stats: RelayStats,
}

impl Pipeline {
    pub(super) fn new(inner: Arc<Inner>) -> Self {
        Pipeline {
            inner,
            running: FuturesUnordered::new(),
            writing: FuturesUnordered::new(),
            writes_of: HashMap::new(),
            queued: queue::Queue::default(),
            claims: HashMap::new(),
            next_claim: 0,
            flush_at: None,
            paused: HashMap::new(),
            horizons: HashMap::new(),
            floors: HashMap::new(),
            sizes: HashMap::new(),
            behind_own: HashSet::new(),
            claiming: FuturesUnordered::new(),
            claiming_targets: HashMap::new(),
            late: Vec::new(),
            last_unavailable: None,
            stats: RelayStats::default(),
        }
    }

    /// Whether nothing is being claimed, claimed, publishing or waiting to be recorded.
    pub(super) fn is_idle(&self) -> bool {
        self.running.is_empty()
            && self.queued.is_empty()
            && self.claims.is_empty()
            && self.writing.is_empty()
            && self.claiming.is_empty()
    }

    /// Whether a claim of `target` that outlasted its round is still under way (see
    /// [`Pipeline::claim_each`]): the target is not claimed again until it returns.
    pub(super) fn is_claiming(&self, target: &Target) -> bool {
        self.claiming_targets.contains_key(&target.schema)
    }

    /// What the claims that outlasted their round brought since the last call, by target.
    pub(super) fn take_late(&mut self) -> Vec<(Target, Result<Claimed>)> {
        std::mem::take(&mut self.late)
    }

    /// Whether another batch fits: the queue is running low and no more than `concurrency` plus
    /// one batch of events are claimed and unrecorded.
    pub(super) fn has_room(&self) -> bool {
        let cfg = &self.inner.config;
        let batch = cfg.batch_size as usize;
        self.queued.len() <= batch / 2 && self.unrecorded() + batch <= self.room()
    }

    /// Whether a claim fits beside `others` made at the same moment (see
    /// [`Pipeline::claim_each`]): [`Self::has_room`], and a batch each of them and this one
    /// within twice the room, the bound a quiet target's claim keeps beside a full pipeline; or,
    /// for claims of targets that are no backlog (`light`; `backlog` says which are), a batch
    /// each within the room among the events of such targets (see [`Self::has_room_for`]).
    pub(super) fn has_room_beside(
        &self,
        others: usize,
        light: bool,
        backlog: impl Fn(&Target) -> bool,
    ) -> bool {
        let batches = (others + 1) * self.inner.config.batch_size as usize;
        (self.has_room() && self.unrecorded() + batches <= 2 * self.room())
            || (light && self.unrecorded_of(|t| !backlog(t)) + batches <= self.room())
    }

    /// Events claimed and not recorded yet.
    fn unrecorded(&self) -> usize {
        self.unrecorded_of(|_| true)
    }

    /// Events claimed and not recorded yet, of the targets `counted` says; a claim under way
    /// counts as many as it may bring.
    fn unrecorded_of(&self, counted: impl Fn(&Target) -> bool) -> usize {
        let claimed: usize = self
            .claims
            .values()
            .filter(|c| counted(&c.target))
            .map(|c| c.outstanding + c.buffered())
            .sum();
        let claiming: usize = self
            .claiming_targets
            .values()
            .filter(|(t, _)| counted(t))
            .map(|(_, events)| events)
            .sum();
        claimed + claiming
    }

    /// The most events claimed and unrecorded after a claim: `concurrency` (at least a batch)
    /// plus one batch.
    fn room(&self) -> usize {
        let cfg = &self.inner.config;
        let batch = cfg.batch_size as usize;
        cfg.concurrency.max(batch) + batch
    }

    /// Whether a claim of `target` fits: [`Self::has_room`]; or, for a target with nothing of
    /// this relay's in flight, room up to twice that (an event of a quiet tenant is claimed
    /// beside another tenant's backlog, and the fair queue publishes it next); or, for such a
    /// target that is no backlog (`backlog` says which are), a batch within the room among the
    /// events of targets that are none: however many events a backlog's claims (up to two of
    /// `max_batch_size`) have queued, a quiet tenant's event is claimed at once, and the quiet
    /// targets' events together stay within the room.
    pub(super) fn has_room_for(&self, target: &Target, backlog: impl Fn(&Target) -> bool) -> bool {
        if self.has_room() {
            return true;
        }
        let batch = self.inner.config.batch_size as usize;
        let quiet = !self.claims.values().any(|c| c.target == *target);
        quiet
            && (self.unrecorded() + batch <= 2 * self.room()
                || (!backlog(target) && self.unrecorded_of(|t| !backlog(t)) + batch <= self.room()))
    }

    /// Whether `target`'s next claim waits until this relay's own events of it in flight are
    /// recorded: its last ordered claim, made beside them, found their aggregates busy, and a
    /// claim now would read the same rows to find the same (with few aggregates, every other
    /// claim would be such a wasted one).
    pub(super) fn waits_for_own(&self, target: &Target) -> bool {
        self.behind_own.contains(&target.schema)
            && self.claims.values().any(|c| c.target == *target)
    }

    /// Whether `target`'s claims are paused (its destinations were all down).
    pub(super) fn is_paused(&self, target: &Target) -> bool {
        self.paused
            .get(&target.schema)
            .is_some_and(|until| *until > Instant::now())
    }

    /// When the earliest pause of a target's claims ends (see [`Self::is_paused`]).
    pub(super) fn next_unpause(&self) -> Option<Instant> {
        let now = Instant::now();
        self.paused
            .values()
            .filter(|until| **until > now)
            .min()
            .copied()
    }

    /// The commit horizon of `target` as its last claim knew it: every id up to it is committed
    /// or rolled back. `None` where the relay keeps none for it (a store whose ids follow
    /// commit order needs none).
    pub(super) fn settled_through(&self, target: &Target) -> Option<i64> {
        self.horizons.get(&target.schema).map(|h| h.settled())
    }

    /// The last reason a destination gave for being down (redacted).
    pub(super) fn last_unavailable(&self) -> Option<&str> {
        self.last_unavailable.as_deref()
    }

    /// The stats since the last call.
    pub(super) fn take_stats(&mut self) -> RelayStats {
        std::mem::take(&mut self.stats)
    }

    /// Starts publishes while slots are free, then waits for one outcome or for the window of
    /// buffered outcomes to close, and records what is due. Returns at once when idle.
    pub(super) async fn step(&mut self) -> Result<()> {
        if self.is_idle() {
            return Ok(());
        }
        let ready = self.ready().await;
        self.apply(ready).await
    }

    /// Starts publishes while slots are free, then waits for what there is to record next: an
    /// outcome, a mark written, the window of buffered outcomes closing. Cancel-safe: nothing
    /// is lost when the wait is dropped for something else (a wake-up), so the relay waits on
    /// this and on its wake-ups at once, and a publish that hangs holds up only itself. Never
    /// completes while the pipeline is idle.
    pub(super) async fn ready(&mut self) -> Ready {
        let cfg = &self.inner.config;
        while self.running.len() < cfg.concurrency {
            let Some((claim, work)) = self.queued.pop() else {
                break;
            };
            let sink = Arc::clone(&self.inner.sink);
            let timeout = cfg.publish_timeout;
            self.running
                .push(outcomes::publishing(sink, claim, work, timeout));
        }
        if self.running.is_empty() && self.has_writable() {
            // Nothing publishing: what is buffered is written now.
            return Ready::Flush;
        }
        // The window closes only while publishes run (else what is buffered was written).
        let flush_at = self.flush_at.filter(|_| !self.running.is_empty());
        let window = async {
            match flush_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let (running, writing, claiming) =
            (&mut self.running, &mut self.writing, &mut self.claiming);
        let published = async {
            if running.is_empty() {
                std::future::pending().await
            } else {
                running.next().await
            }
        };
        let written = async {
            if writing.is_empty() {
                std::future::pending().await
            } else {
                writing.next().await
            }
        };
        let returned = async {
            if claiming.is_empty() {
                std::future::pending().await
            } else {
                claiming.next().await
            }
        };
        tokio::select! {
            done = published => Ready::Published(done.unwrap_or_default()),
            Some((claim, schema, w)) = written => Ready::Written(claim, schema, w),
            Some(asked) = returned => Ready::Claimed(Box::new(asked)),
            () = window => Ready::Window,
        }
    }

    /// Records what [`Self::ready`] found, and writes the outcomes that are due. Not to be cut
    /// off: a write under way is seen through.
    pub(super) async fn apply(&mut self, ready: Ready) -> Result<()> {
        let mut all = false;
        let mut accounted = Ok(());
        match ready {
            Ready::Published(done) => {
                for done in done {
                    self.record(done);
                }
            }
            Ready::Written(claim, schema, written) => {
                accounted = self.account(claim, &schema, written);
            }
            Ready::Window => {}
            Ready::Flush => all = true,
            Ready::Claimed(asked) => {
                let late = self.take_asked(*asked).await;
                self.late.push(late);
            }
        }
        let due = all || self.flush_at.is_some_and(|at| at <= Instant::now());
        self.flush(due);
        accounted
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
        self.await_claims().await;
        for (claim, work) in self.queued.take() {
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

    /// Waits for the claims that outlasted their round, for the write patience at most, and
    /// takes in what they brought; a claim that has not returned by then (it waits for a lock)
    /// is dropped: whatever it takes stays claimed under its lease and is taken over when that
    /// expires.
    async fn await_claims(&mut self) {
        let deadline = Instant::now() + write_patience(self.inner.config.lease);
        while !self.claiming.is_empty() {
            match tokio::time::timeout_at(deadline, self.claiming.next()).await {
                Ok(Some(asked)) => {
                    let late = self.take_asked(asked).await;
                    self.late.push(late);
                }
                Ok(None) => break,
                Err(_) => {
                    let tenants: Vec<&str> = self
                        .claiming_targets
                        .values()
                        .map(|(t, _)| t.label())
                        .collect();
                    warn!(relay = %self.inner.id, ?tenants,
                        "claims did not return before the relay stopped (a table locked?); \
                         what they take is taken over when its lease expires");
                    self.claiming = FuturesUnordered::new();
                    self.claiming_targets.clear();
                }
            }
        }
    }

    fn add(&mut self, stats: RelayStats) {
        self.stats.add(stats);
        self.inner.live.add(stats);
    }
}
