//! What the slot delivered and what became of it: the ids waiting for a claim, the transactions
//! whose events are not all recorded yet, and the WAL position the server may forget up to.
//! Ids are kept per outbox (the default schema's and each tenant's, numbered by sequences of
//! their own): an id means nothing without its schema ([`Sid`]).
//!
//! The rule this file keeps: a position is confirmed only once every event of every transaction
//! committed up to it was claimed and its outcome recorded (or found in the table taken,
//! finished or waiting for the polling claim). The outbox table is the truth; the slot only
//! says, fast and in commit order, which rows to claim.

use std::collections::{HashMap, HashSet, VecDeque};
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

/// An outbox the slot serves (the default schema's, or a tenant's), by the order it was first
/// named: ids of different outboxes may be equal.
pub(crate) type Sid = u32;

/// A delivered event: its outbox and its id there.
pub(crate) type Key = (Sid, i64);

/// A delivered id the claim by id did not get, looked at again from `due`.
struct Recheck {
    key: Key,
    due: Instant,
}

#[derive(Default)]
struct State {
    /// Ids delivered and not handed to a claim yet, per outbox, in commit order.
    queue: HashMap<Sid, VecDeque<i64>>,
    /// Ids the claim by id did not get, to look at again (see [`Progress::missed`]).
    recheck: Vec<Recheck>,
    /// How many times each id in `recheck` was missed.
    misses: HashMap<Key, u8>,
    /// Ids delivered and not recorded yet, with their transaction's `seq`.
    owner: HashMap<Key, u64>,
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

/// The outboxes the slot serves: their schemas by [`Sid`], and which are served now.
#[derive(Default)]
struct Outboxes {
    names: Vec<String>,
    sids: HashMap<String, Sid>,
    served: HashSet<Sid>,
}

/// The shared progress of one CDC relay.
#[derive(Default)]
pub(crate) struct Progress {
    state: Mutex<State>,
    outboxes: Mutex<Outboxes>,
    /// Bumped at each change of the outboxes served (the reader keeps its own copy).
    served_version: std::sync::atomic::AtomicU64,
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

    fn outboxes(&self) -> MutexGuard<'_, Outboxes> {
        self.outboxes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The [`Sid`] of the outbox in `schema`, named now if it was not before.
    pub(crate) fn sid(&self, schema: &str) -> Sid {
        let mut o = self.outboxes();
        if let Some(&sid) = o.sids.get(schema) {
            return sid;
        }
        let sid = Sid::try_from(o.names.len()).unwrap_or(Sid::MAX);
        o.names.push(schema.to_owned());
        o.sids.insert(schema.to_owned(), sid);
        sid
    }

    /// The schema of the outbox `sid`.
    pub(crate) fn schema(&self, sid: Sid) -> Option<String> {
        self.outboxes()
            .names
            .get(usize::try_from(sid).ok()?)
            .cloned()
    }

    /// The served outbox in `schema`, if the slot serves it now.
    pub(crate) fn served(&self, schema: &str) -> Option<Sid> {
        let o = self.outboxes();
        o.sids.get(schema).copied().filter(|s| o.served.contains(s))
    }

    /// Every served outbox, by schema (for the reader's own copy), and the version it is.
    pub(crate) fn served_all(&self) -> (u64, HashMap<String, Sid>) {
        let version = self
            .served_version
            .load(std::sync::atomic::Ordering::Acquire);
        let o = self.outboxes();
        let all = (o.served.iter())
            .filter_map(|&sid| Some((o.names.get(usize::try_from(sid).ok()?)?.clone(), sid)))
            .collect();
        (version, all)
    }

    /// The version of the outboxes served: changes whenever [`Progress::serve`] changes them.
    pub(crate) fn served_version(&self) -> u64 {
        self.served_version
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// The slot serves the outboxes of `schemas` from now on. What it delivered of an outbox no
    /// longer served and nobody recorded is left to the polling claim (counted recorded here:
    /// a suspended tenant's events wait in its table, not in the slot).
    pub(crate) fn serve(&self, schemas: &[String]) {
        let sids: HashSet<Sid> = schemas.iter().map(|s| self.sid(s)).collect();
        let dropped: Vec<Sid> = {
            let mut o = self.outboxes();
            if o.served == sids {
                return;
            }
            let dropped = o.served.difference(&sids).copied().collect();
            o.served = sids;
            dropped
        };
        self.served_version
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        for sid in dropped {
            let ids: Vec<i64> = {
                let mut s = self.state();
                s.queue.remove(&sid);
                s.recheck.retain(|r| r.key.0 != sid);
                s.owner.keys().filter(|k| k.0 == sid).map(|k| k.1).collect()
            };
            self.done(sid, ids);
        }
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
    pub(crate) fn delivered(&self, ids: Vec<Key>) {
        if ids.is_empty() {
            return;
        }
        add(&mut self.state(), ids);
        self.arrived.notify_one();
    }

    /// The transaction whose changes arrived committed at `end_lsn`, with these last outbox ids
    /// (all of them, when no [`Progress::begin`] came first).
    pub(crate) fn committed(&self, end_lsn: u64, ids: Vec<Key>) {
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

    /// Up to `n` ids of outbox `sid` for a claim: the rechecks that are due, then the queue in
    /// commit order.
    pub(crate) fn take(&self, sid: Sid, n: usize) -> Vec<i64> {
        let mut s = self.state();
        let now = Instant::now();
        let mut ids = Vec::new();
        let mut i = 0;
        while i < s.recheck.len() && ids.len() < n {
            if s.recheck[i].key.0 == sid && s.recheck[i].due <= now {
                ids.push(s.recheck.swap_remove(i).key.1);
            } else {
                i += 1;
            }
        }
        if let Some(queue) = s.queue.get_mut(&sid) {
            let more = (n - ids.len()).min(queue.len());
            ids.extend(queue.drain(..more));
            if queue.is_empty() {
                s.queue.remove(&sid);
            }
        }
        ids
    }

    /// Ids a claim by id did not get. A row the slot delivered may not be visible to other
    /// sessions yet: the server sends a commit to the slot's reader once its WAL is flushed,
    /// a moment before the transaction shows as committed to new snapshots. An ordered event
    /// also waits while an earlier one of its aggregate is in flight. So each is looked at again
    /// a few times, soon ([`RECHECKS`]); after that it is someone else's, finished, or waits
    /// for longer, and is left to the polling claim.
    pub(crate) fn missed(&self, sid: Sid, ids: impl IntoIterator<Item = i64>) {
        let mut s = self.state();
        let now = Instant::now();
        let mut given_up = Vec::new();
        for id in ids {
            let key = (sid, id);
            if !s.owner.contains_key(&key) {
                continue;
            }
            let misses = s.misses.entry(key).or_default();
            *misses += 1;
            if *misses > RECHECKS {
                given_up.push(id);
            } else {
                let due = now + Duration::from_millis(1 << (*misses - 1));
                s.recheck.push(Recheck { key, due });
            }
        }
        drop(s);
        self.done(sid, given_up);
    }

    /// Splits `ids` of outbox `sid` into those missed for the first time and those missed
    /// before.
    pub(crate) fn first_misses(&self, sid: Sid, ids: Vec<i64>) -> (Vec<i64>, Vec<i64>) {
        let s = self.state();
        ids.into_iter()
            .partition(|&id| !s.misses.contains_key(&(sid, id)))
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

    /// Ids of outbox `sid` whose claim failed: claimed first next time.
    pub(crate) fn put_back(&self, sid: Sid, ids: &[i64]) {
        let mut s = self.state();
        let owned: Vec<i64> = (ids.iter().rev())
            .copied()
            .filter(|&id| s.owner.contains_key(&(sid, id)))
            .collect();
        let queue = s.queue.entry(sid).or_default();
        for id in owned {
            queue.push_front(id);
        }
    }

    /// Whether ids of outbox `sid` wait for a claim now (queued, or a recheck due).
    pub(crate) fn waiting(&self, sid: Sid) -> bool {
        let s = self.state();
        let now = Instant::now();
        s.queue.get(&sid).is_some_and(|q| !q.is_empty())
            || s.recheck.iter().any(|r| r.key.0 == sid && r.due <= now)
    }

    /// The outboxes whose ids wait for a claim now.
    pub(crate) fn waiting_outboxes(&self) -> Vec<Sid> {
        let s = self.state();
        let now = Instant::now();
        let mut sids: Vec<Sid> = (s.queue.iter())
            .filter(|(_, q)| !q.is_empty())
            .map(|(&sid, _)| sid)
            .chain(s.recheck.iter().filter(|r| r.due <= now).map(|r| r.key.0))
            .collect();
        sids.sort_unstable();
        sids.dedup();
        sids
    }

    /// These ids of outbox `sid` are recorded (or were not this relay's to claim).
    pub(crate) fn done(&self, sid: Sid, ids: impl IntoIterator<Item = i64>) {
        let mut s = self.state();
        let mut any = false;
        for id in ids {
            let key = (sid, id);
            s.misses.remove(&key);
            if let Some(seq) = s.owner.remove(&key) {
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
/// seen), and to their outboxes' queues.
fn add(s: &mut State, ids: Vec<Key>) {
    if s.txns.back().is_none_or(|t| t.end_lsn.is_some()) {
        open(s);
    }
    let Some(seq) = s.txns.back().map(|t| t.seq) else {
        return;
    };
    let mut added = 0;
    for &key in &ids {
        if s.owner.insert(key, seq).is_none() {
            added += 1;
        }
    }
    if let Some(txn) = s.txns.back_mut() {
        txn.remaining += added;
    }
    for (sid, id) in ids {
        s.queue.entry(sid).or_default().push_back(id);
    }
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

    /// Ids of the first outbox named (the default schema's).
    fn k(ids: &[i64]) -> Vec<Key> {
        ids.iter().map(|&id| (0, id)).collect()
    }

    #[test]
    fn ids_of_two_outboxes_are_told_apart_and_an_outbox_no_longer_served_is_left_to_the_poll() {
        let p = Progress::default();
        p.restart(SharedLsnFeedback::new_shared());
        let public = p.sid("public");
        let tenant = p.sid("tenant_a");
        p.serve(&["public".to_owned(), "tenant_a".to_owned()]);
        assert_eq!(p.served("tenant_a"), Some(tenant));
        // One transaction writes id 7 in both outboxes.
        p.committed(100, vec![(public, 7), (tenant, 7)]);
        assert_eq!(p.waiting_outboxes(), vec![public, tenant]);
        assert_eq!(p.take(tenant, 10), vec![7]);
        assert_eq!(p.take(public, 10), vec![7]);
        p.done(tenant, [7]);
        assert_eq!(p.positions().0, 0, "the default schema's 7 is not recorded");
        p.committed(200, vec![(tenant, 8)]);
        p.serve(&["public".to_owned()]);
        assert_eq!(p.served("tenant_a"), None);
        assert!(
            !p.waiting(tenant),
            "what a suspended tenant's outbox had is the poll's"
        );
        p.done(public, [7]);
        assert_eq!(p.positions(), (200, 200));
    }

    #[test]
    fn a_position_is_confirmed_only_when_every_transaction_up_to_it_is_recorded() {
        let p = Progress::default();
        p.restart(SharedLsnFeedback::new_shared());
        p.committed(100, k(&[1, 2]));
        p.committed(200, k(&[3]));
        assert_eq!(p.take(0, 10), vec![1, 2, 3]);
        p.done(0, [3]);
        assert_eq!(
            p.positions(),
            (0, 200),
            "the second is done, the first is not"
        );
        p.done(0, [1]);
        assert_eq!(p.positions().0, 0);
        p.done(0, [2]);
        assert_eq!(p.positions(), (200, 200));
    }

    #[test]
    fn a_transactions_ids_are_claimable_as_they_arrive_and_confirmed_only_from_its_commit() {
        let p = Progress::default();
        p.restart(SharedLsnFeedback::new_shared());
        p.committed(100, k(&[1]));
        p.begin();
        p.delivered(k(&[2, 3]));
        assert!(
            p.waiting(0),
            "the first ids of a transaction still arriving"
        );
        assert_eq!(p.take(0, 10), vec![1, 2, 3]);
        p.done(0, [1, 2, 3]);
        p.passed(150);
        assert_eq!(
            p.positions().0,
            100,
            "every id arrived so far is recorded, but its commit has not come"
        );
        p.delivered(k(&[4]));
        p.committed(300, k(&[5]));
        assert_eq!(p.take(0, 10), vec![4, 5]);
        p.done(0, [5]);
        assert_eq!(p.positions().0, 100, "4 is not recorded");
        p.done(0, [4]);
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
        p.committed(100, k(&[7]));
        p.passed(150);
        assert_eq!(p.positions().0, 50, "event 7 is not recorded");
        p.done(0, p.take(0, 1));
        assert_eq!(p.positions().0, 150);
    }

    #[test]
    fn a_missed_id_is_looked_at_again_a_few_times_then_left_to_the_polling_claim() {
        let p = Progress::default();
        p.restart(SharedLsnFeedback::new_shared());
        p.committed(100, k(&[1, 2]));
        assert_eq!(p.take(0, 10), vec![1, 2]);
        p.done(0, [2]);
        p.missed(0, [1]);
        assert_eq!(p.positions().0, 0, "1 is not recorded yet");
        for _ in 0..RECHECKS {
            let due = p.next_recheck_after(None).expect("a recheck waits");
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            assert!(p.waiting(0));
            assert_eq!(p.take(0, 10), vec![1]);
            p.missed(0, [1]);
        }
        assert_eq!(p.next_recheck_after(None), None);
        assert!(!p.waiting(0));
        assert_eq!(p.positions(), (100, 100), "left to the polling claim");
    }

    #[test]
    fn ids_put_back_are_claimed_first_and_a_restart_forgets_what_was_delivered() {
        let p = Progress::default();
        p.restart(SharedLsnFeedback::new_shared());
        p.committed(100, k(&[1, 2, 3]));
        let taken = p.take(0, 2);
        p.put_back(0, &taken);
        assert_eq!(p.take(0, 10), vec![1, 2, 3]);
        p.restart(SharedLsnFeedback::new_shared());
        assert!(!p.waiting(0));
        assert_eq!(p.unrecorded(), 0);
        p.done(0, [1, 2, 3]);
        assert_eq!(p.positions(), (0, 0), "nothing past the confirmed position");
    }
}
