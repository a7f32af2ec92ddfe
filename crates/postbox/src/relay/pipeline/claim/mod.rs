//! Claiming: where a target's claims start (its commit horizon and its floor), how large they
//! are, and what a claim brings in — events queued for publishing, stale ones recovered, rows
//! that cannot be read failed at once, alone.

mod horizon;

use std::future::Future;
use std::ops::RangeInclusive;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::time::Instant;
use tracing::{debug, info};

use super::flush::mark_failed;
use super::outcomes::alert_failed;
use super::{Claimed, OpenClaim, Pipeline};
use crate::error::Result;
use crate::metrics as metric;
use crate::ordering::{HELD_BACK, is_ordered, plan};
use crate::relay::lease::LeaseKeeper;
use crate::relay::timing::write_patience;
use crate::relay::{Inner, RelayConfig, RelayStats};
use crate::schema::Target;
use crate::store::{
    self, ClaimOrder, ClaimParams, FailedTry, HorizonProbe, Release, ReleaseParams,
};

/// The commit horizon of one target (see [`Store::commit_horizon`](crate::Store)).
#[derive(Default)]
pub(super) struct HorizonState {
    settled: i64,
    probe: Option<HorizonProbe>,
    /// When the pending probe was taken, and whether its wait was logged.
    probe_since: Option<Instant>,
    warned: bool,
}

impl HorizonState {
    /// The id through which every event is committed or rolled back, as last read.
    pub(in crate::relay) fn settled(&self) -> i64 {
        self.settled
    }
}

/// Where a target's claims take new work from (see [`Store::claim_floor`](crate::Store)).
#[derive(Default)]
pub(super) struct FloorState {
    floor: i64,
    /// When the floor last started again from 0.
    swept: Option<Instant>,
    /// The id after the last event of this relay's last claim, while its claims come back full
    /// (relays without ordered aggregate types): where the next claim takes new work from.
    cursor: Option<i64>,
    /// When a claim last started from the floor.
    floor_claimed: Option<Instant>,
    /// When a claim last was a sweep (see [`ClaimOrder::sweep`]).
    ordered_swept: Option<Instant>,
    /// The last id known past the commit horizon, read by
    /// [`Store::claim_gaps`](crate::Store) or taken by a claim that took every id in its range
    /// (`Pipeline::claimed`): every id up to it is settled, or was present then, or is in
    /// `passed`. The floor and the cursor go up to it + 1 (or to
    /// the commit horizon + 1, whichever is higher).
    scanned: i64,
    /// How many ids present past `scanned` the next read takes: doubled after a read that came
    /// back full (see `GAP_SPAN_MAX` in the horizon module).
    span: u32,
    /// Ranges of ids the floor and the cursor may pass, none of which was visible when read (in
    /// flight, rolled back, removed), in id order: read again from time to time until the
    /// horizon is past them and nothing in them is left to do.
    passed: Vec<PassedRange>,
    /// Whether the relay said that `passed` is full.
    passed_full: bool,
    /// Until when this relay's claims go one at a time: other relays' claims took most of the
    /// ids its last pair passed over (see [`CROWDED`]).
    crowded: Option<Instant>,
}

/// A range of ids a relay's floor and cursor passed (see [`FloorState::passed`]), and when it
/// was last read.
#[derive(Debug)]
pub(super) struct PassedRange {
    ids: RangeInclusive<i64>,
    /// When it was passed or last read again.
    read: Instant,
    /// The commit horizon then.
    settled: i64,
}

/// How often a relay's claims start from the floor while they come back full and could start
/// past the last event claimed (its cursor). Between the floor and the cursor lie this relay's
/// events in flight, those other relays claimed at the same moment, and what the marks left
/// behind, which a snapshot held open keeps (every claim from the floor walks those entries):
/// what a claim from the cursor passes over and the floor finds is an event whose relay's lease
/// ran out, or one a concurrent claim locked and then let go. Both are taken at the latest this
/// long after they became claimable, or at once when a claim comes back short.
const FLOOR_CLAIM: Duration = Duration::from_secs(5);

/// How often an ordered relay's claim is a sweep (see [`ClaimOrder::sweep`]): the longest an
/// event that is not ordered, or a ready aggregate past the first few hundred, waits behind
/// ordered events that cannot go yet.
const ORDERED_SWEEP: Duration = Duration::from_secs(1);

/// How many claims' worth of due events an ordered claim reads in id order before it finds the
/// ready aggregates' heads directly (see [`ClaimOrder::walk`]): more than one, so that the rows
/// other relays are claiming at the same moment (skipped, as they are locked) do not leave it
/// short.
const WALK_CLAIMS: u32 = 4;

/// How many ids a pair of full claims may span per event they took before the relay's claims go
/// one at a time (see [`Pipeline::pairs`]): three or more claims' worth of events between its
/// own were other relays' — two relays side by side with pairs of their own span about two —
/// and the database's cores are busy without a second claim from each of them (on two cores,
/// four relays' pairs drained no faster than their single claims, each skipping what the
/// others had locked).
const CROWDED: f64 = 3.0;

/// How long a crowded relay's claims go one at a time (see [`CROWDED`]) before it tries a pair
/// again: the other relays may have stopped or moved on.
const CROWDED_FOR: Duration = Duration::from_secs(5);

/// What a relay keeps of one target's claims: its commit horizon and its floor (each once the
/// store has one). Taken out of the pipeline while a claim of the target is prepared, so that
/// the claims of several targets are prepared side by side ([`Pipeline::claim_each`]).
#[derive(Default)]
pub(super) struct TargetClaims {
    horizon: Option<HorizonState>,
    floor: Option<FloorState>,
}

impl TargetClaims {
    /// Where `target`'s next claim takes new work from: past its last claim (its cursor) while
    /// its claims come back full, never above `through` + 1 (the commit horizon, or the ids
    /// read past it: see [`Self::passed`]), so that a transaction that commits late is still
    /// found; else, and every [`FLOOR_CLAIM`], from the floor. Ordered relays always claim from
    /// the floor: an event that waited for its aggregate stays behind, below where the claims
    /// went on.
    async fn claim_start(
        &mut self,
        inner: &Inner,
        target: &Target,
        through: i64,
        ordered: bool,
    ) -> Result<i64> {
        let state = self.floor.get_or_insert_with(Default::default);
        if !ordered
            && let Some(cursor) = state.cursor
            && state
                .floor_claimed
                .is_some_and(|at| at.elapsed() < FLOOR_CLAIM)
        {
            return Ok(cursor.min(through.saturating_add(1)).max(state.floor));
        }
        state.floor_claimed = Some(Instant::now());
        Self::floor(state, inner, target, through).await
    }

    /// Whether `target`'s next claim is a sweep (see [`ClaimOrder::sweep`]): once every
    /// [`ORDERED_SWEEP`].
    fn sweep(&mut self) -> bool {
        let state = self.floor.get_or_insert_with(Default::default);
        if state
            .ordered_swept
            .is_none_or(|at| at.elapsed() >= ORDERED_SWEEP)
        {
            state.ordered_swept = Some(Instant::now());
            true
        } else {
            false
        }
    }

    /// Where `target`'s next claim starts and how large it is (`size`): its commit horizon,
    /// the ids passed, its floor or cursor.
    async fn prepare(&mut self, inner: &Inner, target: &Target, size: u32) -> Result<Prepared> {
        let cfg = &inner.config;
        let ordered = !cfg.ordered_aggregate_types.is_empty();
        let floors = inner.store.capabilities().claims_from_floor;
        let (settled_through, stalled) = if ordered || floors {
            self.horizon(inner, target, ordered).await?
        } else {
            (0, false)
        };
        let floor = if floors {
            let (through, late) = self.passed(inner, target, settled_through, stalled).await?;
            let start = self.claim_start(inner, target, through, ordered).await?;
            // An event committed late below where the claims went on: this claim starts at it.
            late.map_or(start, |late| start.min(late))
        } else {
            0
        };
        let sweep = ordered && self.sweep();
        Ok(Prepared {
            settled_through,
            floor,
            size,
            sweep,
        })
    }
}

/// How many targets' claims a round makes side by side at most ([`Pipeline::claim_each`]):
/// each on a connection of its own, leaving the rest of a small pool to marks and renewals.
pub(in crate::relay) const CLAIMS_AT_ONCE: usize = 4;

/// How long the claims of a round wait for each other at most (see [`Pipeline::claim_each`]):
/// past it, a claim that has not returned is taken in whenever it does, beside the publishes.
/// Claims take milliseconds; one that takes this long waits for a lock (or a server that is
/// far behind), and the targets whose claims returned go on without it.
const CLAIM_PATIENCE: Duration = Duration::from_millis(500);

/// How long the claims of a round wait for the rest once one has returned: the claims of
/// different targets, started together, return within milliseconds of each other unless one
/// waits for something the others do not.
const LATE_AFTER: Duration = Duration::from_millis(50);

/// What a claim under way asks for (see [`Pipeline::claim_later`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::relay) enum Shape {
    /// One claim of the target's size.
    One,
    /// Two side by side (see [`Pipeline::claim_pair`]).
    Pair,
    /// One of `batch_size` at most: other targets have events now, and a backlog's large
    /// claims and their marks would take the database's cores from their short claims, whose
    /// latency is what they wait for.
    Small,
}

/// A claim's task, aborted when the claim is dropped (the relay stopped or was dropped).
struct Running(tokio::task::JoinHandle<Asked>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A claim under way on its own (see [`Pipeline::claim_each`]).
pub(super) type Asking = Pin<Box<dyn Future<Output = Asked> + Send>>;

/// What a claim under way brings back: its target, what the pipeline keeps of that target's
/// claims, and where the claim started with what it took.
pub(in crate::relay) struct Asked {
    target: Target,
    claims: TargetClaims,
    asked: Result<(Prepared, Asks)>,
}

/// What a claim under way asked the store: one claim, or two side by side from the same start
/// (see [`Pipeline::claim_pair`]).
enum Asks {
    One(store::Claimed),
    Pair(Result<store::Claimed>, Result<store::Claimed>),
}

impl Pipeline {
    /// What the pipeline keeps of `target`'s claims, taken out until [`Self::put_claims`].
    fn take_claims(&mut self, target: &Target) -> TargetClaims {
        TargetClaims {
            horizon: self.horizons.remove(&target.schema),
            floor: self.floors.remove(&target.schema),
        }
    }

    /// Puts back what [`Self::take_claims`] took (and a claim updated).
    fn put_claims(&mut self, target: &Target, claims: TargetClaims) {
        if let Some(horizon) = claims.horizon {
            self.horizons.insert(target.schema.clone(), horizon);
        }
        if let Some(floor) = claims.floor {
            self.floors.insert(target.schema.clone(), floor);
        }
    }

    /// Where this relay's claims of `target` start, for a read of its backlog that does not
    /// walk what lies below ([`Store::backlog_from`](crate::Store::backlog_from)): `None` until
    /// it has a floor there, or while a claim of it is under way.
    pub(in crate::relay) fn backlog_from(&self, target: &Target) -> Option<store::BacklogFrom> {
        let state = self.floors.get(&target.schema)?;
        (state.floor > 0).then(|| store::BacklogFrom {
            floor: state.floor,
            passed: state.passed.iter().map(|r| r.ids.clone()).collect(),
        })
    }

    /// Takes in where a claim of `target` took ids (see [`horizon::claimed`]).
    fn claimed(&mut self, target: &Target, spread: &Spread) {
        if let Some(floor) = self.floors.get_mut(&target.schema) {
            horizon::claimed(floor, spread);
        }
    }

    /// The size of `target`'s next claim.
    fn size_of(&self, target: &Target) -> u32 {
        self.sizes
            .get(&target.schema)
            .copied()
            .unwrap_or(self.inner.config.batch_size)
    }

    /// Where `target`'s next claim starts and how large it is.
    async fn prepare(&mut self, target: &Target) -> Result<Prepared> {
        let mut claims = self.take_claims(target);
        let size = self.size_of(target);
        let prepared = claims.prepare(&self.inner, target, size).await;
        self.put_claims(target, claims);
        prepared
    }

    /// Whether `target`'s next claim is a pair of claims side by side (see
    /// [`Capabilities::concurrent_claims`](crate::store::Capabilities)): the store lets one
    /// relay's claims run at once, the round serves this target `alone` (with others, one claim
    /// each is what is fair), its claims need no order, and they have grown past `batch_size`
    /// and go on past the last one (a backlog, and destinations that take it: a destination
    /// found down sets the size back), and other relays are not claiming most of the same
    /// range (see [`CROWDED`]).
    pub(in crate::relay) fn pairs(&self, target: &Target, alone: bool) -> bool {
        let cfg = &self.inner.config;
        alone
            && cfg.ordered_aggregate_types.is_empty()
            && self.inner.store.capabilities().concurrent_claims
            && self
                .sizes
                .get(&target.schema)
                .is_some_and(|size| *size > cfg.batch_size)
            && self.floors.get(&target.schema).is_some_and(|state| {
                state.cursor.is_some() && state.crowded.is_none_or(|until| until <= Instant::now())
            })
    }

    /// Claims a batch of `target` and queues its events for publishing; rows that cannot be
    /// read fail at once, alone.
    pub(in crate::relay) async fn claim(&mut self, target: &Target) -> Result<Claimed> {
        let prepared = self.prepare(target).await?;
        let claimed = ask(&self.inner, target, &prepared).await?;
        self.take_in(target, &prepared, claimed).await
    }

    /// Takes in what one claim of `target` brought ([`Self::absorb`]) and goes on past it: its
    /// cursor, the ids it took.
    async fn take_in(
        &mut self,
        target: &Target,
        prepared: &Prepared,
        claimed: store::Claimed,
    ) -> Result<Claimed> {
        let spread = Spread::of([&claimed]);
        let (result, last) = self.absorb(target, prepared, claimed).await?;
        self.set_cursor(target, result.full, last);
        self.claimed(target, &spread);
        Ok(result)
    }

    /// One claim of each of `targets` (at most [`CLAIMS_AT_ONCE`], of different targets), side
    /// by side: each prepared and asked on a connection of its own, so that a tenant's claim
    /// does not wait for the round trips of the others' (a burst of events into a few tenants
    /// costs one claim's time, as a burst into one schema does). What each brought is taken in
    /// in the order they return; the result of each that returned, in that order.
    ///
    /// A claim that has not returned [`LATE_AFTER`] after the first one did (or
    /// [`CLAIM_PATIENCE`] after they started) is left to return later: it stays in the pipeline
    /// beside the publishes, is taken in when it returns ([`Pipeline::ready`]) and its result
    /// waits for the relay's loop ([`Pipeline::take_late`]); its target is not claimed again
    /// meanwhile ([`Pipeline::is_claiming`]). So a tenant whose table is locked (a migration's
    /// `ALTER TABLE`, `VACUUM FULL`, an operator's `LOCK TABLE`) holds up its own claim only.
    pub(in crate::relay) async fn claim_each(
        &mut self,
        targets: &[Target],
    ) -> Vec<(Target, Result<Claimed>)> {
        let mut asking: FuturesUnordered<Asking> = targets
            .iter()
            .map(|target| self.asking(target, Shape::One))
            .collect();
        let mut cutoff = Instant::now() + CLAIM_PATIENCE;
        let mut results = Vec::with_capacity(targets.len());
        while let Ok(Some(asked)) = tokio::time::timeout_at(cutoff, asking.next()).await {
            cutoff = cutoff.min(Instant::now() + LATE_AFTER);
            results.push(self.take_asked(asked).await);
        }
        self.claiming.extend(asking);
        results
    }

    /// Starts a claim of `target` of `shape` (see [`Self::claim_each`], [`Self::claim_pair`]):
    /// what the pipeline keeps of its claims goes with it until [`Self::take_asked`] puts it
    /// back.
    fn asking(&mut self, target: &Target, shape: Shape) -> Asking {
        let claims = self.take_claims(target);
        let pair = shape == Shape::Pair;
        let size = match shape {
            Shape::Small => self.size_of(target).min(self.inner.config.batch_size),
            Shape::One | Shape::Pair => self.size_of(target),
        };
        let inner = Arc::clone(&self.inner);
        let target = target.clone();
        let events = size as usize * if pair { 2 } else { 1 };
        self.claiming_targets
            .insert(target.schema.clone(), (target.clone(), events));
        // On a task of its own, so that it goes on (and gives its connection back) while the
        // relay's loop is busy elsewhere, waiting for a connection of the same pool, say; the
        // task ends with the relay (see `Running`).
        let task = tokio::spawn(async move {
            let mut claims = claims;
            let asked = async {
                let prepared = claims.prepare(&inner, &target, size).await?;
                let asks = if pair {
                    let (first, second) = tokio::join!(
                        ask(&inner, &target, &prepared),
                        ask(&inner, &target, &prepared)
                    );
                    Asks::Pair(first, second)
                } else {
                    Asks::One(ask(&inner, &target, &prepared).await?)
                };
                Ok((prepared, asks))
            }
            .await;
            Asked {
                target,
                claims,
                asked,
            }
        });
        let mut running = Running(task);
        Box::pin(async move {
            match (&mut running.0).await {
                Ok(asked) => asked,
                // A panic in a claim is the relay's own, as it was when claims ran inline.
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                // Cancelled: the runtime is shutting down.
                Err(_) => std::future::pending().await,
            }
        })
    }

    /// Starts a claim of `target` of `shape` that the relay does not wait for: it is taken in when it returns, beside the publishes ([`Pipeline::ready`]), and
    /// its result waits for the relay's loop ([`Pipeline::take_late`]). A backlog's claims go
    /// this way, so that while one is under way (up to two of `max_batch_size`) the relay goes
    /// on publishing, and claims the events others have just committed.
    pub(in crate::relay) fn claim_later(&mut self, target: &Target, shape: Shape) {
        let asking = self.asking(target, shape);
        self.claiming.push(asking);
    }

    /// Takes in a claim started by [`Self::asking`] that returned.
    pub(super) async fn take_asked(&mut self, asked: Asked) -> (Target, Result<Claimed>) {
        let Asked {
            target,
            claims,
            asked,
        } = asked;
        self.claiming_targets.remove(&target.schema);
        self.put_claims(&target, claims);
        let result = match asked {
            Ok((prepared, Asks::One(claimed))) => self.take_in(&target, &prepared, claimed).await,
            Ok((prepared, Asks::Pair(first, second))) => {
                self.take_pair(&target, &prepared, first, second).await
            }
            Err(e) => Err(e),
        };
        (target, result)
    }

    /// Two claims of `target` side by side, from the same start: the rows one locks the other
    /// skips, so together they take the next two batches, each on a connection of its own,
    /// while a relay that claims one batch at a time leaves the database's other cores to its
    /// marks. The first error is returned once what the other claimed is queued (an error
    /// taking in one claim's rows included).
    pub(in crate::relay) async fn claim_pair(&mut self, target: &Target) -> Result<Claimed> {
        let asked = self.asking(target, Shape::Pair).await;
        self.take_asked(asked).await.1
    }

    /// Takes in what a pair of claims of `target` brought (see [`Self::claim_pair`]).
    async fn take_pair(
        &mut self,
        target: &Target,
        prepared: &Prepared,
        first: Result<store::Claimed>,
        second: Result<store::Claimed>,
    ) -> Result<Claimed> {
        let mut result = Claimed {
            full: true,
            any: false,
            behind_own: false,
        };
        let spread = Spread::of(first.iter().chain(second.iter()));
        let mut last = None;
        let mut failed = None;
        for claimed in [first, second] {
            // Each claim's events are queued even when the other's could not be (its unreadable
            // rows could not be failed): they are this relay's to publish, under its lease.
            let absorbed = match claimed {
                Ok(claimed) => self.absorb(target, prepared, claimed).await,
                Err(e) => Err(e),
            };
            match absorbed {
                Ok((one, one_last)) => {
                    result.full &= one.full;
                    result.any |= one.any;
                    last = last.max(one_last);
                }
                Err(e) => {
                    result.full = false;
                    failed.get_or_insert(e);
                }
            }
        }
        // The claims go on past both, while both came back full.
        self.set_cursor(target, result.full, last);
        self.claimed(target, &spread);
        if result.full
            && spread.per_event() >= CROWDED
            && let Some(state) = self.floors.get_mut(&target.schema)
        {
            state.crowded = Some(Instant::now() + CROWDED_FOR);
            debug!(
                tenant = target.label(),
                ids_per_event = spread.per_event(),
                "other relays claim most of this relay's range: its claims go one at a time \
                 for a while"
            );
        }
        failed.map_or(Ok(result), Err)
    }

    /// Where `target`'s next claim takes new work from: past `last`, the last event of a full
    /// claim (relays without ordered aggregate types); from its floor again after a short one
    /// (and finds whatever the cursor passed over).
    fn set_cursor(&mut self, target: &Target, full: bool, last: Option<i64>) {
        let ordered = !self.inner.config.ordered_aggregate_types.is_empty();
        if let Some(state) = self.floors.get_mut(&target.schema) {
            state.cursor = if full && !ordered {
                last.map(|id| id.saturating_add(1))
            } else {
                None
            };
        }
    }

    /// Takes in what one claim brought: counts it, fails its unreadable rows, sets the size of
    /// the next claim, and queues its events for publishing. Returns it and its last id.
    async fn absorb(
        &mut self,
        target: &Target,
        prepared: &Prepared,
        mut claimed: store::Claimed,
    ) -> Result<(Claimed, Option<i64>)> {
        let inner = Arc::clone(&self.inner);
        let cfg = &inner.config;
        let tenant = target.label();
        let ordered = !cfg.ordered_aggregate_types.is_empty();
        let size = prepared.size;
        let mut stats = RelayStats {
            recovered: claimed.recovered,
            gave_up: claimed.exhausted.len() as u64,
            failed_tries: claimed.recovered + claimed.exhausted.len() as u64,
            ..RelayStats::default()
        };
        let count = claimed.events.len() + claimed.exhausted.len() + claimed.undecodable.len();
        let full = count >= size as usize;
        let last = (claimed.events.iter().map(|e| e.id))
            .chain(claimed.exhausted.iter().map(|e| e.id))
            .chain(claimed.undecodable.iter().map(|u| u.id))
            .max();
        // Ordered events wait for this relay's own events of their aggregates in flight: a
        // claim beside those says nothing of the backlog, and keeps its size for the claim
        // after them (else claims of few aggregates never grow past the first).
        let behind_own = ordered && !full && self.claims.values().any(|c| c.target == *target);
        if behind_own {
            self.behind_own.insert(target.schema.clone());
        } else {
            self.behind_own.remove(&target.schema);
            self.sizes
                .insert(target.schema.clone(), next_size(cfg, size, count));
        }
        if count > 0 {
            metrics::histogram!(metric::BATCH_SIZE, "tenant" => inner.metric_tenant(tenant))
                .record(count as f64);
        }
        if claimed.recovered > 0 {
            info!(tenant, relay = %inner.id, count = claimed.recovered,
                "recovered {} stale events (a relay did not finish within its lease)", claimed.recovered);
            metrics::counter!(metric::STALE_RECOVERED, "tenant" => inner.metric_tenant(tenant))
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
                .partition(|e| e.id > first && is_ordered(&cfg.ordered_aggregate_types, e));
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
                    buffered_since: None,
                    writing: false,
                },
            );
            for work in plan(&cfg.ordered_aggregate_types, claimed.events) {
                self.queued.push(&target.schema, claim, work);
            }
        }
        Ok((
            Claimed {
                full,
                any: count > 0,
                behind_own,
            },
            last,
        ))
    }
}

/// The ids some claims took: how many, and the range they span.
#[derive(Debug, Default)]
pub(super) struct Spread {
    events: usize,
    first: Option<i64>,
    last: Option<i64>,
}

impl Spread {
    fn of<'a>(claims: impl IntoIterator<Item = &'a store::Claimed>) -> Spread {
        let mut spread = Spread::default();
        for claimed in claims {
            let ids = (claimed.events.iter().map(|e| e.id))
                .chain(claimed.exhausted.iter().map(|e| e.id))
                .chain(claimed.undecodable.iter().map(|u| u.id));
            for id in ids {
                spread.events += 1;
                spread.first = Some(spread.first.map_or(id, |f| f.min(id)));
                spread.last = Some(spread.last.map_or(id, |l| l.max(id)));
            }
        }
        spread
    }

    /// Ids spanned per event taken: 1 when the claims took every id in their range.
    fn per_event(&self) -> f64 {
        match (self.first, self.last) {
            (Some(first), Some(last)) if self.events > 0 => {
                (last - first + 1) as f64 / self.events as f64
            }
            _ => 1.0,
        }
    }
}

/// Where a claim starts and how large it is (see [`Pipeline::prepare`]).
pub(in crate::relay) struct Prepared {
    settled_through: i64,
    floor: i64,
    size: u32,
    sweep: bool,
}

/// Asks the store for the claim `prepared` describes.
async fn ask(inner: &Inner, target: &Target, prepared: &Prepared) -> Result<store::Claimed> {
    let cfg = &inner.config;
    let started = Instant::now();
    let claimed = inner
        .store
        .events_claim(&ClaimParams {
            target,
            batch_size: prepared.size,
            lease: cfg.lease,
            relay_id: &inner.id,
            order: ClaimOrder {
                aggregate_types: &cfg.ordered_aggregate_types,
                settled_through: prepared.settled_through,
                walk: prepared.size.saturating_mul(WALK_CLAIMS),
                sweep: prepared.sweep,
            },
            floor: prepared.floor,
        })
        .await?;
    metrics::histogram!(metric::CLAIM_SECONDS, "tenant" => inner.metric_tenant(target.label()))
        .record(started.elapsed().as_secs_f64());
    Ok(claimed)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spread_counts_the_ids_spanned_per_event_taken() {
        let spread = |events, first, last| Spread {
            events,
            first,
            last,
        };
        // One relay's pair over a fresh backlog: every id taken.
        assert_eq!(spread(1000, Some(1), Some(1000)).per_event(), 1.0);
        // Four relays' claims interleaved: a quarter of the ids each.
        assert!(spread(1000, Some(1), Some(4000)).per_event() >= CROWDED);
        assert_eq!(spread(0, None, None).per_event(), 1.0);
    }

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
