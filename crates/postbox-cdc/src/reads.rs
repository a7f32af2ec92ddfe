//! The events a CDC relay publishes without claiming them, and what keeps its own polling claim
//! from publishing them a second time.
//!
//! The slot says which rows committed, so the relay needs no claim to find them: it reads them
//! by id (`PgStore::events_read_ids`), publishes them and marks them `PROCESSED` by id
//! (`PgStore::events_mark_unclaimed`) — one write per event where a claim and a mark make two.
//! Nothing in the table says such an event is being published, so the relay's own polling
//! claim (its safety net) can claim it meanwhile. This file keeps that from becoming a second
//! publish: the events of a poll that the reads hold are taken out of the poll's batch
//! ([`Reads::poll_claimed`]) and recorded under that poll's token when the read's outcome comes
//! ([`Reads::finish`]). A relay in another process that polls beside this one can still publish
//! an event being read: at most the events this relay has in flight (docs/cdc.md).

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use postbox::store::Claimed;
use uuid::Uuid;

/// How long a read event whose mark found it claimed is remembered: a poll of this relay that
/// claimed it returns well within this.
const UNSETTLED_FOR: Duration = Duration::from_secs(120);

/// A read's token is forgotten this long after the read even if some of its events never came
/// back (a relay that stopped): a mark can come no later than a publish timeout after it.
const TOKEN_FOR: Duration = Duration::from_secs(3600);

/// One read: its time, and how many of its events have no recorded outcome yet.
struct Read {
    at: Instant,
    left: usize,
}

#[derive(Default)]
struct State {
    /// The tokens of reads whose events are not all finished.
    tokens: HashMap<Uuid, Read>,
    /// Ids taken for a read, from before the read until their outcome is recorded.
    open: HashSet<i64>,
    /// Open ids that this relay's polling claim claimed meanwhile, under that claim's token:
    /// their outcome is recorded with it.
    adopted: HashMap<i64, Uuid>,
    /// Read ids whose mark found them claimed: a poll of this relay that returns with one
    /// marks it at once instead of publishing it again.
    unsettled: HashMap<i64, Instant>,
}

/// The reads of one CDC relay.
#[derive(Default)]
pub(crate) struct Reads {
    state: Mutex<State>,
}

/// The ids of a read's outcome: those a poll of this relay claimed meanwhile, by that claim's
/// token, and the rest.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Split {
    pub(crate) adopted: Vec<(Uuid, Vec<i64>)>,
    pub(crate) read: Vec<i64>,
}

impl Reads {
    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while the lock is held leaves plain data, consistent per operation.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `ids` are about to be read: from now on a poll that claims one leaves it to the read.
    pub(crate) fn begin(&self, ids: &[i64]) {
        self.state().open.extend(ids.iter().copied());
    }

    /// The read under `token` returned `got` of the ids begun; the others are not open any more.
    pub(crate) fn read(&self, token: Uuid, begun: &[i64], got: &HashSet<i64>) {
        let mut s = self.state();
        for id in begun.iter().filter(|id| !got.contains(id)) {
            s.open.remove(id);
            s.adopted.remove(id);
        }
        if !got.is_empty() {
            let now = Instant::now();
            s.tokens.retain(|_, r| now.duration_since(r.at) < TOKEN_FOR);
            s.tokens.insert(
                token,
                Read {
                    at: now,
                    left: got.len(),
                },
            );
        }
    }

    /// Whether `token` is a read's (else a claim's).
    pub(crate) fn is_read(&self, token: &Uuid) -> bool {
        self.state().tokens.contains_key(token)
    }

    /// Splits a read's finished `ids` into those a poll of this relay holds and the rest. They
    /// stay open until [`Reads::finish`].
    pub(crate) fn split(&self, ids: impl IntoIterator<Item = i64>) -> Split {
        let s = self.state();
        let mut split = Split::default();
        let mut by_token: HashMap<Uuid, Vec<i64>> = HashMap::new();
        for id in ids {
            match s.adopted.get(&id) {
                Some(token) => by_token.entry(*token).or_default().push(id),
                None => split.read.push(id),
            }
        }
        split.adopted = by_token.into_iter().collect();
        split
    }

    /// The outcome of `ids`, of the read under `token`, is recorded, except for `unmarked`
    /// (read ids the mark found claimed). Of those, the ones a poll of this relay adopted
    /// meanwhile are returned by token, to be marked with it; the rest are remembered for a
    /// poll still on its way ([`Reads::poll_claimed`]).
    pub(crate) fn finish(
        &self,
        token: &Uuid,
        ids: &[i64],
        unmarked: &[i64],
    ) -> Vec<(Uuid, Vec<i64>)> {
        let mut s = self.state();
        let now = Instant::now();
        let mut late: HashMap<Uuid, Vec<i64>> = HashMap::new();
        if !unmarked.is_empty() {
            s.unsettled
                .retain(|_, at| now.duration_since(*at) < UNSETTLED_FOR);
        }
        for &id in unmarked {
            match s.adopted.remove(&id) {
                Some(poll) => late.entry(poll).or_default().push(id),
                None => {
                    s.unsettled.insert(id, now);
                }
            }
        }
        for id in ids {
            s.open.remove(id);
            s.adopted.remove(id);
        }
        let done = match s.tokens.get_mut(token) {
            Some(read) => {
                read.left = read.left.saturating_sub(ids.len());
                read.left == 0
            }
            None => false,
        };
        if done {
            s.tokens.remove(token);
        }
        late.into_iter().collect()
    }

    /// The mark of `ids` failed: no poll adopts them any more (the relay may give up on the
    /// mark, and an adopted id would then wait for an outcome that never comes), but their read
    /// keeps its token, so that a retry of the mark is recorded as a read's.
    pub(crate) fn unrecorded(&self, ids: &HashSet<i64>) {
        if ids.is_empty() {
            return;
        }
        let mut s = self.state();
        for id in ids {
            s.open.remove(id);
            s.adopted.remove(id);
        }
    }

    /// A poll of this relay claimed `claimed`: the events being read are taken out of it (their
    /// read records them under this claim's token), and the ids of those already published by a
    /// read whose mark found them claimed are returned, to be marked now with this token.
    pub(crate) fn poll_claimed(&self, claimed: &mut Claimed) -> Vec<i64> {
        let mut s = self.state();
        if s.open.is_empty() && s.unsettled.is_empty() {
            return Vec::new();
        }
        let token = claimed.claim_token;
        let mut settle = Vec::new();
        claimed.events.retain(|e| {
            if s.open.contains(&e.id) {
                s.adopted.insert(e.id, token);
                false
            } else if s.unsettled.remove(&e.id).is_some() {
                settle.push(e.id);
                false
            } else {
                true
            }
        });
        settle
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claimed(token: Uuid, ids: &[i64]) -> Claimed {
        Claimed {
            claim_token: token,
            events: ids
                .iter()
                .map(|&id| postbox::OutboxEvent::new(id, "T", &0).expect("an event"))
                .collect(),
            ..Claimed::default()
        }
    }

    #[test]
    fn a_poll_leaves_the_events_being_read_to_the_read_and_its_outcome_uses_the_polls_token() {
        let reads = Reads::default();
        let read = Uuid::new_v4();
        reads.begin(&[1, 2, 3]);
        reads.read(read, &[1, 2, 3], &[1, 2].into_iter().collect());
        assert!(reads.is_read(&read));
        let poll = Uuid::new_v4();
        let mut polled = claimed(poll, &[2, 3, 4]);
        assert!(reads.poll_claimed(&mut polled).is_empty());
        // 2 is being read; 3 was not read (not visible then), so the poll publishes it.
        let left: Vec<i64> = polled.events.iter().map(|e| e.id).collect();
        assert_eq!(left, vec![3, 4]);
        let split = reads.split([1, 2]);
        assert_eq!(split.read, vec![1]);
        assert_eq!(split.adopted, vec![(poll, vec![2])]);
        assert!(reads.finish(&read, &[1, 2], &[]).is_empty());
        assert!(!reads.is_read(&read), "every event of the read is finished");
    }

    #[test]
    fn a_poll_that_returns_after_the_reads_mark_missed_marks_the_event_instead_of_publishing_it() {
        let reads = Reads::default();
        let read = Uuid::new_v4();
        reads.begin(&[7, 8]);
        reads.read(read, &[7, 8], &[7, 8].into_iter().collect());
        // The poll claimed 8 just before the read's mark: the mark did not get it.
        assert!(reads.finish(&read, &[7, 8], &[8]).is_empty());
        let poll = Uuid::new_v4();
        let mut polled = claimed(poll, &[8, 9]);
        assert_eq!(reads.poll_claimed(&mut polled), vec![8]);
        assert_eq!(polled.events.len(), 1);
        assert_eq!(polled.events[0].id, 9);
    }

    #[test]
    fn a_read_id_the_poll_adopted_before_the_mark_is_marked_with_the_polls_token() {
        let reads = Reads::default();
        let read = Uuid::new_v4();
        reads.begin(&[5]);
        reads.read(read, &[5], &[5].into_iter().collect());
        let split = reads.split([5]);
        assert_eq!(split.read, vec![5]);
        // The poll's claim returns while the read's mark is on its way, and got the row.
        let poll = Uuid::new_v4();
        let mut polled = claimed(poll, &[5]);
        assert!(reads.poll_claimed(&mut polled).is_empty());
        assert!(polled.events.is_empty());
        assert_eq!(reads.finish(&read, &[5], &[5]), vec![(poll, vec![5])]);
    }
}
