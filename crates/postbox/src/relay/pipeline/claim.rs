//! Claiming: where a target's claims start (its commit horizon and its floor), how large they
//! are, and what a claim brings in — events queued for publishing, stale ones recovered, rows
//! that cannot be read failed at once, alone.

use std::ops::RangeInclusive;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{info, warn};

use super::flush::mark_failed;
use super::outcomes::alert_failed;
use super::{Claimed, OpenClaim, Pipeline};
use crate::error::Result;
use crate::metrics as metric;
use crate::ordering::{HELD_BACK, is_ordered, plan};
use crate::relay::lease::LeaseKeeper;
use crate::relay::timing::write_patience;
use crate::relay::{RelayConfig, RelayStats};
use crate::schema::Target;
use crate::store::{
    ClaimOrder, ClaimParams, FailedTry, GapParams, HorizonProbe, Release, ReleaseParams,
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

/// How long ordered events may wait for the writers of a probe before the relay says so.
const HORIZON_PATIENCE: Duration = Duration::from_secs(10);

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
    /// The last id read by [`Store::claim_gaps`](crate::Store): every id up to it is settled,
    /// or was present then, or is in `passed`. The floor and the cursor go up to it + 1 (or to
    /// the commit horizon + 1, whichever is higher).
    scanned: i64,
    /// Ranges of ids the floor and the cursor may pass, none of which was visible when read (in
    /// flight, rolled back, removed), in id order: looked up at each claim until the horizon is
    /// past them and nothing in them is left to do.
    passed: Vec<RangeInclusive<i64>>,
    /// Whether the relay said that `passed` is full.
    passed_full: bool,
}

/// How often a relay's floor is found again from the start of the table: a sweep, one read that
/// walks the polling index from its start, for an event put back below the floor by a path that
/// does not mark it (an operator's hand-written `UPDATE`, say). Every path of Postbox's own
/// marks it.
const FLOOR_SWEEP: Duration = Duration::from_secs(60);

/// How often a relay's claims start from the floor while they come back full and could start
/// past the last event claimed (its cursor). Between the floor and the cursor lie this relay's
/// events in flight, those other relays claimed at the same moment, and what the marks left
/// behind, which a snapshot held open keeps (every claim from the floor walks those entries):
/// what a claim from the cursor passes over and the floor finds is an event whose relay's lease
/// ran out, or one a concurrent claim locked and then let go. Both are taken at the latest this
/// long after they became claimable, or at once when a claim comes back short.
const FLOOR_CLAIM: Duration = Duration::from_secs(5);

/// How long the commit horizon waits for the same writers before a relay's floor and cursor go
/// on past them (with [`Store::claim_gaps`](crate::Store)): a transaction open this long is
/// held open, not merely writing (a few claims' time).
const HORIZON_STALL: Duration = Duration::from_millis(100);

/// How many ids present past the last one read a relay reads at each claim while the commit
/// horizon is held back: enough to keep ahead of its claims, and to catch up, after a start,
/// with the events done since the transaction began.
const GAP_SPAN: u32 = 20_000;

/// How many ranges of passed ids a relay keeps per table (ids not visible when read: open
/// transactions', rolled-back ones, rows removed; until the horizon passes them). Past it, its
/// floor and cursor wait where they are, and its claims walk what was done since, until the
/// horizon moves on.
const MAX_PASSED: usize = 10_000;

/// How often an ordered relay's claim is a sweep (see [`ClaimOrder::sweep`]): the longest an
/// event that is not ordered, or a ready aggregate past the first few hundred, waits behind
/// ordered events that cannot go yet.
const ORDERED_SWEEP: Duration = Duration::from_secs(1);

/// How many claims' worth of due events an ordered claim reads in id order before it finds the
/// ready aggregates' heads directly (see [`ClaimOrder::walk`]): more than one, so that the rows
/// other relays are claiming at the same moment (skipped, as they are locked) do not leave it
/// short.
const WALK_CLAIMS: u32 = 4;

impl Pipeline {
    /// The commit horizon of `target`: advances it with one probe of the table (see
    /// [`Store::commit_horizon`](crate::Store)) and returns the id up to which ordered events
    /// may be claimed.
    async fn horizon(&mut self, target: &Target, ordered: bool) -> Result<(i64, bool)> {
        let state = self.horizons.entry(target.schema.clone()).or_default();
        let horizon = self
            .inner
            .store
            .commit_horizon(target, state.probe.as_ref())
            .await?;
        if let Some(settled) = horizon.settled {
            if settled < state.settled && !self.inner.store.capabilities().ids_in_commit_order {
                // Only a sequence moved back settles lower (PostgreSQL refuses one moved below
                // ids still in the table; an emptied table restarted from 1 is allowed): claims
                // find their floor again from the start, or new events would wait below it.
                warn!(
                    tenant = target.label(),
                    from = state.settled,
                    to = settled,
                    "the outbox's id sequence moved back (setval, RESTART); claims start again \
                     from the first event"
                );
                state.settled = settled;
                self.floors.remove(&target.schema);
            } else {
                state.settled = state.settled.max(settled);
            }
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
        let stalled = state.probe.is_some()
            && state
                .probe_since
                .is_some_and(|at| at.elapsed() >= HORIZON_STALL);
        Ok((state.settled, stalled))
    }

    /// How far `target`'s floor and cursor may go (the id through which claims may take new
    /// work without missing a transaction that commits late), and the lowest id they passed
    /// that a transaction has committed since and a claim may take now. Up to the commit
    /// horizon `settled` by itself; while the horizon is held back (`stalled`: a transaction
    /// stays open), on past it with [`Store::claim_gaps`](crate::Store), keeping the ids not
    /// visible there, so that a claim does not walk every event done since that transaction
    /// began (its index entries stay until it ends).
    async fn passed(
        &mut self,
        target: &Target,
        settled: i64,
        stalled: bool,
    ) -> Result<(i64, Option<i64>)> {
        let state = self.floors.entry(target.schema.clone()).or_default();
        state.scanned = state.scanned.max(settled);
        let scan = stalled && state.passed.len() < MAX_PASSED;
        if !scan && state.passed.is_empty() {
            return Ok((state.scanned, None));
        }
        let gaps = self
            .inner
            .store
            .claim_gaps(&GapParams {
                target,
                passed: &state.passed,
                after: state.scanned,
                limit: if scan { GAP_SPAN } else { 0 },
            })
            .await?;
        let mut late: Option<i64> = None;
        for found in &gaps.found {
            if found.claimable {
                late = Some(late.map_or(found.id, |l| l.min(found.id)));
            }
        }
        // A range is done with once the horizon is past it (nothing in it can commit any more)
        // and nothing in it is left to do.
        state.passed.retain(|range| {
            *range.end() > settled
                || gaps
                    .found
                    .iter()
                    .any(|f| f.unfinished && range.contains(&f.id))
        });
        for id in gaps.present {
            if id <= state.scanned {
                continue;
            }
            if id > state.scanned + 1 {
                if state.passed.len() >= MAX_PASSED {
                    if !state.passed_full {
                        state.passed_full = true;
                        warn!(
                            tenant = target.label(),
                            kept = state.passed.len(),
                            at = state.scanned,
                            "claims wait where they are: too many ranges of ids past the commit \
                             horizon are not visible (transactions held open, rolled back); they \
                             walk what was done since until those transactions end"
                        );
                    }
                    break;
                }
                state.passed.push(state.scanned + 1..=id - 1);
            }
            state.scanned = id;
        }
        if state.passed.len() < MAX_PASSED / 2 {
            state.passed_full = false;
        }
        Ok((state.scanned, late))
    }

    /// The floor of `target`'s next claim, never above `through` + 1 (see [`Self::passed`]):
    /// advanced from the last one, or found again from the start of the table (a sweep) every
    /// [`FLOOR_SWEEP`].
    async fn floor(&mut self, target: &Target, through: i64) -> Result<i64> {
        let state = self.floors.entry(target.schema.clone()).or_default();
        if state.swept.is_none_or(|at| at.elapsed() >= FLOOR_SWEEP) {
            state.swept = Some(Instant::now());
            state.floor = 0;
        }
        state.floor = self
            .inner
            .store
            .claim_floor(target, state.floor, through)
            .await?;
        Ok(state.floor)
    }

    /// Where `target`'s next claim takes new work from: past its last claim (its cursor) while
    /// its claims come back full, never above `through` + 1 (the commit horizon, or the ids
    /// read past it: see [`Self::passed`]), so that a transaction that commits late is still
    /// found; else, and every [`FLOOR_CLAIM`], from the floor. Ordered relays always claim from
    /// the floor: an event that waited for its aggregate stays behind, below where the claims
    /// went on.
    async fn claim_start(&mut self, target: &Target, through: i64, ordered: bool) -> Result<i64> {
        let state = self.floors.entry(target.schema.clone()).or_default();
        if !ordered
            && let Some(cursor) = state.cursor
            && state
                .floor_claimed
                .is_some_and(|at| at.elapsed() < FLOOR_CLAIM)
        {
            return Ok(cursor.min(through.saturating_add(1)).max(state.floor));
        }
        state.floor_claimed = Some(Instant::now());
        self.floor(target, through).await
    }

    /// Whether `target`'s next claim is a sweep (see [`ClaimOrder::sweep`]): once every
    /// [`ORDERED_SWEEP`].
    fn sweep(&mut self, target: &Target) -> bool {
        let state = self.floors.entry(target.schema.clone()).or_default();
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

    /// Claims a batch of `target` and queues its events for publishing; rows that cannot be
    /// read fail at once, alone.
    pub(in crate::relay) async fn claim(&mut self, target: &Target) -> Result<Claimed> {
        let inner = Arc::clone(&self.inner);
        let cfg = &inner.config;
        let tenant = target.label();
        let ordered = !cfg.ordered_aggregate_types.is_empty();
        let floors = inner.store.capabilities().claims_from_floor;
        let (settled_through, stalled) = if ordered || floors {
            self.horizon(target, ordered).await?
        } else {
            (0, false)
        };
        let floor = if floors {
            let (through, late) = self.passed(target, settled_through, stalled).await?;
            let start = self.claim_start(target, through, ordered).await?;
            // An event committed late below where the claims went on: this claim starts at it.
            late.map_or(start, |late| start.min(late))
        } else {
            0
        };
        let size = self
            .sizes
            .get(&target.schema)
            .copied()
            .unwrap_or(cfg.batch_size);
        let sweep = ordered && self.sweep(target);
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
                    walk: size.saturating_mul(WALK_CLAIMS),
                    sweep,
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
        if floors && let Some(state) = self.floors.get_mut(&target.schema) {
            // A full claim: more new work waits past it. A short one: the claims start from the
            // floor again (and find whatever the cursor passed over).
            state.cursor = if full && !ordered {
                (claimed.events.iter().map(|e| e.id))
                    .chain(claimed.exhausted.iter().map(|e| e.id))
                    .chain(claimed.undecodable.iter().map(|u| u.id))
                    .max()
                    .map(|id| id.saturating_add(1))
            } else {
                None
            };
        }
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
                },
            );
            self.queued.extend(
                plan(&cfg.ordered_aggregate_types, claimed.events)
                    .into_iter()
                    .map(|work| (claim, work)),
            );
        }
        Ok(Claimed {
            full,
            any: count > 0,
            behind_own,
        })
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
