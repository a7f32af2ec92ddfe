//! What the slot delivered and what became of it: the ids waiting for a claim, the transactions
//! whose events are not all recorded yet, and the WAL position the server may forget up to.
//!
//! The rule this file keeps: a position is confirmed only once every event of every transaction
//! committed up to it was claimed and its outcome recorded (or found in the table taken,
//! finished or waiting for the polling claim). The outbox table is the truth; the slot only
//! says, fast and in commit order, which rows to claim.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pg_walstream::SharedLsnFeedback;
use tokio::sync::Notify;

/// One delivered transaction whose events are not all recorded.
struct Txn {
    seq: u64,
    /// The end of its commit, once the commit arrived. Without streaming, the server sends a
    /// transaction only once it has committed, so its ids are claimable as they arrive: a
    /// transaction of a million events starts publishing before its last insert is decoded,
    /// and is confirmed only from its commit on.
    end_lsn: Option<u64>,
    remaining: usize,
}

/// How many times an id the claim by id did not get is looked at again (after 1, 2, 4, … 128
/// ms: a quarter of a second in all) before it is left to the polling claim.
pub(crate) const RECHECKS: u8 = 8;

/// A delivered id the claim by id did not get, looked at again from `due`.
struct Recheck {
    id: i64,
    due: Instant,
}

#[derive(Default)]
struct State {
    /// Ids delivered and not handed to a claim yet, in commit order.
    queue: VecDeque<i64>,
    /// Ids the claim by id did not get, to look at again (see [`Progress::missed`]).
    recheck: Vec<Recheck>,
    /// How many times each id in `recheck` was missed.
    misses: HashMap<i64, u8>,
    /// Ids delivered and not recorded yet, with their transaction's `seq`.
    owner: HashMap<i64, u64>,
    txns: VecDeque<Txn>,
    next_seq: u64,
    /// The furthest position delivered: a commit's end, or a heartbeat.
    received: u64,
    /// The furthest position whose work is all recorded.
    confirmed: u64,
    /// Whether the slot is being read now.
    streaming: bool,
    /// The current stream's feedback, told each confirmed position.
    feedback: Option<Arc<SharedLsnFeedback>>,
}

/// The shared progress of one CDC relay.
#[derive(Default)]
pub(crate) struct Progress {
    state: Mutex<State>,
    /// Woken when ids arrive.
    pub(crate) arrived: Notify,
    /// Woken when the database stops answering ([`Progress::server_lost`]).
    pub(crate) lost: Notify,
    /// Whether the slot's confirmed position stood still while the WAL grew
    /// ([`CdcConfig::stall_after`](crate::CdcConfig::stall_after)).
    stalled: std::sync::atomic::AtomicBool,
    /// Whether another reader holds the slot (this relay waits for it: a standby).
    standby: std::sync::atomic::AtomicBool,
}

impl Progress {
    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while the lock is held leaves plain data, still consistent per operation.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A new stream started at the slot's confirmed position: what the old one delivered and
    /// nobody claimed is delivered again, so forget it. Ids claimed meanwhile are recorded as
    /// usual; their `done` finds no owner and changes nothing.
    pub(crate) fn restart(&self, feedback: Arc<SharedLsnFeedback>) {
        self.set_standby(false);
        let mut s = self.state();
        forget(&mut s);
        s.received = s.confirmed;
        s.streaming = true;
        s.feedback = Some(feedback);
    }

    /// The stream stopped (an error, a lost slot): the polling claim carries the load.
    pub(crate) fn stopped(&self) {
        let mut s = self.state();
        forget(&mut s);
        s.streaming = false;
        s.feedback = None;
    }

    /// The database stopped answering the relay's other connections (it is shutting down,
    /// restarting or unreachable): the reader lets go of the slot. A fast shutdown of
    /// PostgreSQL waits until every logical reader has confirmed all the WAL sent to it, which
    /// a relay holding unrecorded events never does: holding on would hold the shutdown up
    /// until `pg_ctl` gives up. The next reader starts again from the confirmed position.
    pub(crate) fn server_lost(&self) {
        self.lost.notify_waiters();
    }

    /// The lag check found the confirmed position stalled (or moving again).
    pub(crate) fn set_stalled(&self, stalled: bool) {
        (self.stalled).store(stalled, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether another reader holds the slot: this relay waits for it as a standby.
    pub(crate) fn set_standby(&self, standby: bool) {
        (self.standby).store(standby, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether this relay waits for a slot another reader holds.
    pub(crate) fn standby(&self) -> bool {
        self.standby.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether the confirmed position stood still for a minute while the WAL grew.
    pub(crate) fn stalled(&self) -> bool {
        self.stalled.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether the slot is being read now.
    pub(crate) fn streaming(&self) -> bool {
        self.state().streaming
    }

    /// A committed transaction's changes begin to arrive: its ids follow
    /// ([`Progress::delivered`]), then its commit ([`Progress::committed`]).
    pub(crate) fn begin(&self) {
        open(&mut self.state());
    }

    /// Outbox ids of the transaction whose changes are arriving, in the order it wrote them:
    /// claimable now (the transaction has committed), confirmed once its commit arrives.
    pub(crate) fn delivered(&self, ids: Vec<i64>) {
        if ids.is_empty() {
            return;
        }
        add(&mut self.state(), ids);
        self.arrived.notify_one();
    }

    /// The transaction whose changes arrived committed at `end_lsn`, with these last outbox ids
    /// (all of them, when no [`Progress::begin`] came first).
    pub(crate) fn committed(&self, end_lsn: u64, ids: Vec<i64>) {
        let any = !ids.is_empty();
        let mut s = self.state();
        add(&mut s, ids);
        if let Some(txn) = s.txns.back_mut() {
            txn.end_lsn = Some(end_lsn);
        }
        s.received = s.received.max(end_lsn);
        advance(&mut s);
        drop(s);
        if any {
            self.arrived.notify_one();
        }
    }

    /// A heartbeat, or any position past which nothing of the outbox was delivered.
    pub(crate) fn passed(&self, lsn: u64) {
        let mut s = self.state();
        s.received = s.received.max(lsn);
        advance(&mut s);
    }

    /// Up to `n` ids for a claim: the rechecks that are due, then the queue in commit order.
    pub(crate) fn take(&self, n: usize) -> Vec<i64> {
        let mut s = self.state();
        let now = Instant::now();
        let mut ids = Vec::new();
        let mut i = 0;
        while i < s.recheck.len() && ids.len() < n {
            if s.recheck[i].due <= now {
                ids.push(s.recheck.swap_remove(i).id);
            } else {
                i += 1;
            }
        }
        let more = (n - ids.len()).min(s.queue.len());
        ids.extend(s.queue.drain(..more));
        ids
    }

    /// Ids a claim by id did not get. A row the slot delivered may not be visible to other
    /// sessions yet: the server sends a commit to the slot's reader once its WAL is flushed,
    /// a moment before the transaction shows as committed to new snapshots. An ordered event
    /// also waits while an earlier one of its aggregate is in flight. So each is looked at again
    /// a few times, soon ([`RECHECKS`]); after that it is someone else's, finished, or waits
    /// for longer, and is left to the polling claim.
    pub(crate) fn missed(&self, ids: impl IntoIterator<Item = i64>) {
        let mut s = self.state();
        let now = Instant::now();
        let mut given_up = Vec::new();
        for id in ids {
            if !s.owner.contains_key(&id) {
                continue;
            }
            let misses = s.misses.entry(id).or_default();
            *misses += 1;
            if *misses > RECHECKS {
                given_up.push(id);
            } else {
                let due = now + Duration::from_millis(1 << (*misses - 1));
                s.recheck.push(Recheck { id, due });
            }
        }
        drop(s);
        self.done(given_up);
    }

    /// Splits `ids` into those missed for the first time and those missed before.
    pub(crate) fn first_misses(&self, ids: Vec<i64>) -> (Vec<i64>, Vec<i64>) {
        let s = self.state();
        ids.into_iter().partition(|id| !s.misses.contains_key(id))
    }

    /// Delivered ids waiting to be looked at again.
    pub(crate) fn rechecking(&self) -> usize {
        self.state().recheck.len()
    }

    /// When the next recheck due after `after` is due, if any waits.
    pub(crate) fn next_recheck_after(&self, after: Option<Instant>) -> Option<Instant> {
        (self.state().recheck.iter())
            .map(|r| r.due)
            .filter(|due| after < Some(*due))
            .min()
    }

    /// Ids whose claim failed: claimed first next time.
    pub(crate) fn put_back(&self, ids: &[i64]) {
        let mut s = self.state();
        for &id in ids.iter().rev() {
            if s.owner.contains_key(&id) {
                s.queue.push_front(id);
            }
        }
    }

    /// Whether ids wait for a claim now (queued, or a recheck due).
    pub(crate) fn waiting(&self) -> bool {
        let s = self.state();
        let now = Instant::now();
        !s.queue.is_empty() || s.recheck.iter().any(|r| r.due <= now)
    }

    /// These ids are recorded (or were not this relay's to claim).
    pub(crate) fn done(&self, ids: impl IntoIterator<Item = i64>) {
        let mut s = self.state();
        let mut any = false;
        for id in ids {
            s.misses.remove(&id);
            if let Some(seq) = s.owner.remove(&id) {
                let front = s.txns.front().map_or(0, |t| t.seq);
                if let Some(txn) = seq
                    .checked_sub(front)
                    .and_then(|i| s.txns.get_mut(usize::try_from(i).ok()?))
                {
                    txn.remaining = txn.remaining.saturating_sub(1);
                    any = true;
                }
            }
        }
        if any {
            advance(&mut s);
        }
    }

    /// The furthest position confirmed, and the furthest delivered.
    pub(crate) fn positions(&self) -> (u64, u64) {
        let s = self.state();
        (s.confirmed, s.received)
    }

    /// Events delivered and not recorded yet.
    pub(crate) fn unrecorded(&self) -> usize {
        self.state().owner.len()
    }
}

/// Opens a transaction at the back of `s.txns`, its commit not arrived yet.
fn open(s: &mut State) {
    let seq = s.next_seq;
    s.next_seq += 1;
    s.txns.push_back(Txn {
        seq,
        end_lsn: None,
        remaining: 0,
    });
}

/// Adds `ids` to the transaction whose changes are arriving (opened first if no begin was
/// seen), and to the queue.
fn add(s: &mut State, ids: Vec<i64>) {
    if s.txns.back().is_none_or(|t| t.end_lsn.is_some()) {
        open(s);
    }
    let Some(seq) = s.txns.back().map(|t| t.seq) else {
        return;
    };
    let mut added = 0;
    for &id in &ids {
        if s.owner.insert(id, seq).is_none() {
            added += 1;
        }
    }
    if let Some(txn) = s.txns.back_mut() {
        txn.remaining += added;
    }
    s.queue.extend(ids);
}

/// Forgets what a stream delivered: the next reader of the slot delivers it again.
fn forget(s: &mut State) {
    s.queue.clear();
    s.recheck.clear();
    s.misses.clear();
    s.owner.clear();
    s.txns.clear();
}

/// Confirms every finished transaction at the front, and what was delivered past the last one
/// when none is left.
fn advance(s: &mut State) {
    while let Some(end_lsn) = s
        .txns
        .front()
        .filter(|t| t.remaining == 0)
        .and_then(|t| t.end_lsn)
    {
        s.txns.pop_front();
        s.confirmed = s.confirmed.max(end_lsn);
    }
    if s.txns.is_empty() {
        s.confirmed = s.confirmed.max(s.received);
    }
    if let Some(feedback) = &s.feedback {
        feedback.update_flushed_lsn(s.confirmed);
        feedback.update_applied_lsn(s.confirmed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_position_is_confirmed_only_when_every_transaction_up_to_it_is_recorded() {
        let p = Progress::default();
        p.restart(SharedLsnFeedback::new_shared());
        p.committed(100, vec![1, 2]);
        p.committed(200, vec![3]);
        assert_eq!(p.take(10), vec![1, 2, 3]);
        p.done([3]);
        assert_eq!(
            p.positions(),
            (0, 200),
            "the second is done, the first is not"
        );
        p.done([1]);
        assert_eq!(p.positions().0, 0);
        p.done([2]);
        assert_eq!(p.positions(), (200, 200));
    }

    #[test]
    fn a_transactions_ids_are_claimable_as_they_arrive_and_confirmed_only_from_its_commit() {
        let p = Progress::default();
        p.restart(SharedLsnFeedback::new_shared());
        p.committed(100, vec![1]);
        p.begin();
        p.delivered(vec![2, 3]);
        assert!(p.waiting(), "the first ids of a transaction still arriving");
        assert_eq!(p.take(10), vec![1, 2, 3]);
        p.done([1, 2, 3]);
        p.passed(150);
        assert_eq!(
            p.positions().0,
            100,
            "every id arrived so far is recorded, but its commit has not come"
        );
        p.delivered(vec![4]);
        p.committed(300, vec![5]);
        assert_eq!(p.take(10), vec![4, 5]);
        p.done([5]);
        assert_eq!(p.positions().0, 100, "4 is not recorded");
        p.done([4]);
        assert_eq!(p.positions(), (300, 300));
        p.begin();
        p.committed(400, Vec::new());
        assert_eq!(
            p.positions(),
            (400, 400),
            "a transaction without outbox ids"
        );
    }

    #[test]
    fn heartbeats_advance_the_position_only_when_nothing_is_outstanding() {
        let p = Progress::default();
        p.restart(SharedLsnFeedback::new_shared());
        p.passed(50);
        assert_eq!(p.positions().0, 50);
        p.committed(100, vec![7]);
        p.passed(150);
        assert_eq!(p.positions().0, 50, "event 7 is not recorded");
        p.done(p.take(1));
        assert_eq!(p.positions().0, 150);
    }

    #[test]
    fn a_missed_id_is_looked_at_again_a_few_times_then_left_to_the_polling_claim() {
        let p = Progress::default();
        p.restart(SharedLsnFeedback::new_shared());
        p.committed(100, vec![1, 2]);
        assert_eq!(p.take(10), vec![1, 2]);
        p.done([2]);
        p.missed([1]);
        assert_eq!(p.positions().0, 0, "1 is not recorded yet");
        for _ in 0..RECHECKS {
            let due = p.next_recheck_after(None).expect("a recheck waits");
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            assert!(p.waiting());
            assert_eq!(p.take(10), vec![1]);
            p.missed([1]);
        }
        assert_eq!(p.next_recheck_after(None), None);
        assert!(!p.waiting());
        assert_eq!(p.positions(), (100, 100), "left to the polling claim");
    }

    #[test]
    fn ids_put_back_are_claimed_first_and_a_restart_forgets_what_was_delivered() {
        let p = Progress::default();
        p.restart(SharedLsnFeedback::new_shared());
        p.committed(100, vec![1, 2, 3]);
        let taken = p.take(2);
        p.put_back(&taken);
        assert_eq!(p.take(10), vec![1, 2, 3]);
        p.restart(SharedLsnFeedback::new_shared());
        assert!(!p.waiting());
        assert_eq!(p.unrecorded(), 0);
        p.done([1, 2, 3]);
        assert_eq!(p.positions(), (0, 0), "nothing past the confirmed position");
    }
}
