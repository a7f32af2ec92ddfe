//! Where a target's claims start: its commit horizon, the ranges of ids a relay passed while a
//! transaction held the horizon back, and its floor.

use std::ops::RangeInclusive;
use std::time::Duration;

use tokio::time::Instant;
use tracing::warn;

use super::{FloorState, PassedRange, Spread, TargetClaims};
use crate::error::Result;
use crate::relay::Inner;
use crate::schema::Target;
use crate::store::GapParams;

/// How long ordered events may wait for the writers of a probe before the relay says so.
const HORIZON_PATIENCE: Duration = Duration::from_secs(10);

/// How often a relay's floor is found again from the start of the table: a sweep, one read that
/// walks the polling index from its start, for an event put back below the floor by a path that
/// does not mark it (an operator's hand-written `UPDATE`, say). Every path of Postbox's own
/// marks it.
const FLOOR_SWEEP: Duration = Duration::from_secs(60);

/// How long the commit horizon waits for the same writers before a relay's floor and cursor go
/// on past them (with [`Store::claim_gaps`](crate::Store)): a transaction open this long is
/// held open, not merely writing (a few claims' time).
const HORIZON_STALL: Duration = Duration::from_millis(100);

/// How many ids present past the last one read a relay reads at each claim while the commit
/// horizon is held back: enough to keep ahead of its claims.
const GAP_SPAN: u32 = 20_000;

/// The most ids present one such read takes: after a read that came back full (a relay started
/// behind a held transaction, on a table with a history: every id it reads is present) the next
/// reads twice as many, so that it is past the history in a few reads rather than one per claim
/// — until then the claims start no further than the ids read, and each walks what the drain
/// has done since it began (the held transaction keeps those index entries).
const GAP_SPAN_MAX: u32 = 640_000;

/// How often a relay reads again a range of ids it passed (see [`TargetClaims::passed`]) of up to
/// [`RECHECK_IDS_PER_SECOND`] ids, for events committed late in it: the longest such an event
/// waits for a claim.
const PASSED_RECHECK: Duration = Duration::from_secs(1);

/// How many passed ids a relay reads again per second of a range's age at most: a longer range
/// is read again less often (a range of a million ids every 10 s). A range can span many ids
/// that are gone (archived or purged while the transaction that holds the horizon back was
/// open, say) whose index entries stay until it ends; a claim that read them all every second
/// would cost what the table lost, not its batch. A transaction that holds the horizon back is
/// not waited for: when the horizon moves, every range it has reached is read again at once.
const RECHECK_IDS_PER_SECOND: u64 = 100_000;

/// The longest a passed range waits to be read again, however long: the floor's sweep
/// ([`FLOOR_SWEEP`]) would find an event committed late in it by then anyway.
const RECHECK_MAX: Duration = FLOOR_SWEEP;

/// How many ranges of passed ids a relay keeps per table (ids not visible when read: open
/// transactions', rolled-back ones, rows removed; until the horizon passes them). Past it, its
/// floor and cursor wait where they are, and its claims walk what was done since, until the
/// horizon moves on.
const MAX_PASSED: usize = 10_000;

impl TargetClaims {
    /// The commit horizon of `target`: advances it with one probe of the table (see
    /// [`Store::commit_horizon`](crate::Store)) and returns the id up to which ordered events
    /// may be claimed.
    pub(super) async fn horizon(
        &mut self,
        inner: &Inner,
        target: &Target,
        ordered: bool,
    ) -> Result<(i64, bool)> {
        let first = self.horizon.is_none();
        let state = self.horizon.get_or_insert_with(Default::default);
        let horizon = inner
            .store
            .commit_horizon(target, state.probe.as_ref())
            .await?;
        if let Some(settled) = horizon.settled {
            if settled < state.settled && !inner.store.capabilities().ids_in_commit_order {
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
                self.floor = None;
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
        // A relay that starts beside a transaction held open asks how long it has been open:
        // waiting HORIZON_STALL to see for itself, its first claims would each walk everything
        // done since that transaction began (the index entries it keeps). Its first read past
        // the horizon goes to the head of the id sequence (up to GAP_SPAN_MAX ids): what lies
        // there was most likely committed while it stayed open, and reads that double from
        // GAP_SPAN would leave the claims between them walking it. The answer only saves time:
        // without one, the relay waits and sees.
        if first
            && let Some(probe) = &horizon.probe
            && !probe.writers.is_empty()
            && let Ok(Some(age)) = inner.store.horizon_writers_age(target, probe).await
            && age >= HORIZON_STALL
        {
            state.probe_since = Instant::now().checked_sub(age).or(state.probe_since);
            let ahead = u32::try_from(probe.last_id.saturating_sub(state.settled).max(0))
                .unwrap_or(u32::MAX);
            self.floor.get_or_insert_with(Default::default).span =
                ahead.clamp(GAP_SPAN, GAP_SPAN_MAX);
        }
        let state = self.horizon.get_or_insert_with(Default::default);
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
    pub(super) async fn passed(
        &mut self,
        inner: &Inner,
        target: &Target,
        settled: i64,
        stalled: bool,
    ) -> Result<(i64, Option<i64>)> {
        let ordered = !inner.config.ordered_aggregate_types.is_empty();
        let state = self.floor.get_or_insert_with(Default::default);
        state.scanned = state.scanned.max(settled);
        // Past the horizon, a read is needed only where the claims went on past the ids known
        // (see `Self::claimed`): a claim from the cursor right after them walks fresh entries.
        let behind = ordered || state.cursor.is_none_or(|cursor| cursor > state.scanned + 1);
        let scan = stalled && behind && state.passed.len() < MAX_PASSED;
        let due: Vec<usize> = (0..state.passed.len())
            .filter(|&i| recheck_due(&state.passed[i], settled))
            .collect();
        if !scan && due.is_empty() {
            return Ok((state.scanned, None));
        }
        let reread: Vec<RangeInclusive<i64>> =
            due.iter().map(|&i| state.passed[i].ids.clone()).collect();
        // 0 until a read came back full (a FloorState starts with 0).
        let span = state.span.max(GAP_SPAN);
        let gaps = inner
            .store
            .claim_gaps(&GapParams {
                target,
                passed: &reread,
                after: state.scanned,
                limit: if scan { span } else { 0 },
            })
            .await?;
        if scan {
            state.span = if gaps.read >= u64::from(span) {
                span.saturating_mul(2).min(GAP_SPAN_MAX)
            } else {
                GAP_SPAN
            };
        }
        let mut late: Option<i64> = None;
        for found in &gaps.found {
            if found.claimable {
                late = Some(late.map_or(found.id, |l| l.min(found.id)));
            }
        }
        // A range read again is done with once the horizon is past it (nothing in it can commit
        // any more) and nothing in it is left to do.
        let now = Instant::now();
        let mut due = due.into_iter().peekable();
        let mut index = 0;
        state.passed.retain_mut(|range| {
            let this = index;
            index += 1;
            if due.next_if_eq(&this).is_none() {
                return true;
            }
            range.read = now;
            range.settled = settled;
            *range.ids.end() > settled
                || gaps
                    .found
                    .iter()
                    .any(|f| f.unfinished && range.ids.contains(&f.id))
        });
        let mut through = gaps.read_through.filter(|&id| id > state.scanned);
        for missing in gaps.missing {
            if *missing.end() <= state.scanned {
                continue;
            }
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
                // The floor and cursor stop below the first range not kept.
                through = Some(state.scanned.max(*missing.start() - 1));
                break;
            }
            let ids = (state.scanned + 1).max(*missing.start())..=*missing.end();
            state.passed.push(PassedRange {
                ids,
                read: now,
                settled,
            });
            state.scanned = *missing.end();
        }
        if let Some(through) = through {
            state.scanned = state.scanned.max(through);
        }
        if state.passed.len() < MAX_PASSED / 2 {
            state.passed_full = false;
        }
        Ok((state.scanned, late))
    }

    /// The floor of `target`'s next claim, never above `through` + 1 (see [`Self::passed`]):
    /// advanced from the last one, or found again from the start of the table (a sweep) every
    /// [`FLOOR_SWEEP`].
    pub(super) async fn floor(
        state: &mut FloorState,
        inner: &Inner,
        target: &Target,
        through: i64,
    ) -> Result<i64> {
        if state.swept.is_none_or(|at| at.elapsed() >= FLOOR_SWEEP) {
            state.swept = Some(Instant::now());
            state.floor = 0;
        }
        state.floor = inner
            .store
            .claim_floor(target, state.floor, through)
            .await?;
        Ok(state.floor)
    }
}

/// What a claim (or a pair) took tells where ids are present: when the claims took every
/// id from at most just past the last id known (`scanned`) to their last one, the relay
/// knows them all without reading them (a relay draining a backlog alone past a
/// transaction held open reads the ids past the horizon only where its claims left some).
pub(super) fn claimed(state: &mut FloorState, spread: &Spread) {
    if let (Some(first), Some(last)) = (spread.first, spread.last)
        && i64::try_from(spread.events).is_ok_and(|events| last - first + 1 == events)
        && first <= state.scanned.saturating_add(1)
        && last > state.scanned
    {
        state.scanned = last;
    }
}

/// Whether a passed range is read again now: when the commit horizon has moved since it was
/// last read and reached it (the transaction that held the horizon back has ended: what it
/// wrote in the range is visible now), or when it has waited [`PASSED_RECHECK`], longer the
/// more ids it spans (see [`RECHECK_IDS_PER_SECOND`]), never longer than [`RECHECK_MAX`].
fn recheck_due(range: &PassedRange, settled: i64) -> bool {
    if settled > range.settled && settled >= *range.ids.start() {
        return true;
    }
    let ids = u64::try_from(range.ids.end() - range.ids.start() + 1).unwrap_or(0);
    let wait = Duration::from_secs_f64(ids as f64 / RECHECK_IDS_PER_SECOND as f64)
        .clamp(PASSED_RECHECK, RECHECK_MAX);
    range.read.elapsed() >= wait
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(ids: RangeInclusive<i64>, age: Duration, settled: i64) -> PassedRange {
        PassedRange {
            ids,
            read: Instant::now() - age,
            settled,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_short_range_is_read_again_every_second() {
        assert!(!recheck_due(
            &range(10..=12, Duration::from_millis(900), 5),
            5
        ));
        assert!(recheck_due(&range(10..=12, Duration::from_secs(1), 5), 5));
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_range_is_read_again_less_often_and_at_least_every_minute() {
        let million = 1..=1_000_000;
        assert!(!recheck_due(
            &range(million.clone(), Duration::from_secs(9), 0),
            0
        ));
        assert!(recheck_due(&range(million, Duration::from_secs(10), 0), 0));
        let billion = 1..=1_000_000_000;
        assert!(!recheck_due(
            &range(billion.clone(), Duration::from_secs(59), 0),
            0
        ));
        assert!(recheck_due(&range(billion, RECHECK_MAX, 0), 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_range_is_read_again_at_once_when_the_horizon_moves_into_it() {
        let million = 1..=1_000_000;
        // The horizon moved, but not as far as the range.
        assert!(!recheck_due(&range(million.clone(), Duration::ZERO, 0), 0));
        let above = 10..=1_000_000;
        assert!(!recheck_due(&range(above.clone(), Duration::ZERO, 0), 9));
        assert!(recheck_due(&range(above.clone(), Duration::ZERO, 0), 10));
        // Already read since the horizon got there.
        assert!(!recheck_due(&range(above, Duration::ZERO, 10), 10));
    }
}
