//! The claim of a CDC relay: the ids the slot delivered, read or claimed by id, and the polling
//! claim beside the slot (when it runs, and what it took that the slot names later).

use std::collections::{BTreeSet, HashSet};
use std::time::Instant;

use postbox::store::{ClaimParams, Claimed, MarkProcessedParams};
use postbox::{Store, Target};
use uuid::Uuid;

use super::{CdcStore, Lane};

/// When the polling claim last ran beside the slot, whether it came back full, when the slot
/// last named events a claim had taken, and the events the polls took that the slot has not
/// named yet.
#[derive(Default)]
pub(super) struct Polled {
    at: Option<Instant>,
    full: bool,
    overlapped: Option<Instant>,
    taken: BTreeSet<i64>,
}

/// The most ids of events its polls took that a relay remembers until the slot names them (the
/// lowest are forgotten first: a slot that names one of those costs a look at the table).
const POLLED_KEPT: usize = 1_000_000;

impl CdcStore {
    /// [`Store::events_claim`]: the ids the slot delivered, read or claimed by id, and the
    /// polling claim beside them (the outboxes the slot serves: the default schema's and the
    /// active tenants' in the publication); the polling claim alone elsewhere.
    pub(super) async fn claim(&self, p: &ClaimParams<'_>) -> postbox::Result<Claimed> {
        let Some(lane) = self.serving(p.target) else {
            return self.watch(self.inner.events_claim(p).await);
        };
        let lane = &*lane;
        // The timed poll runs even while delivered ids wait: a relay whose slot is far behind
        // (restarted after a stop, while a polling relay did the work) reads back everything it
        // missed before it reaches new commits, and those must not wait for that.
        if self.poll_overdue(lane) {
            let claimed = self.poll(lane, p).await?;
            if !claimed.events.is_empty()
                || !claimed.undecodable.is_empty()
                || !claimed.exhausted.is_empty()
            {
                if self.progress.waiting(lane.sid) {
                    self.progress.arrived.notify_one();
                }
                return Ok(claimed);
            }
        }
        let ids = self.take(lane, usize::try_from(p.batch_size).unwrap_or(usize::MAX));
        if !ids.is_empty() {
            // Without ordered aggregate types the rows are read and published unclaimed (one
            // write per event, the mark), unless told to claim them (a poller runs beside); an
            // ordered event is claimed, so that the claim can hold it back behind an earlier
            // event of its aggregate.
            let read = !self.claim && p.order.aggregate_types.is_empty();
            let result = if read {
                lane.reads.begin(&ids);
                self.inner.events_read_ids(p, &ids).await
            } else {
                self.inner.events_claim_ids(p, &ids).await
            };
            let claimed = match self.watch(result) {
                Ok(claimed) => claimed,
                Err(e) => {
                    if read {
                        lane.reads.read(Uuid::nil(), &ids, &HashSet::new());
                    }
                    self.progress.put_back(lane.sid, &ids);
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
                lane.reads.read(claimed.claim_token, &ids, &got);
                *self.reader.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some((p.relay_id.to_owned(), p.lease));
            }
            let missed: Vec<i64> = ids.into_iter().filter(|id| !got.contains(id)).collect();
            if !missed.is_empty() {
                self.missed(lane, p.target, missed).await;
            }
            if self.progress.waiting(lane.sid) {
                self.progress.arrived.notify_one();
            }
            return Ok(claimed);
        }
        if !self.poll_due(lane) {
            return Ok(Claimed::default());
        }
        self.poll(lane, p).await
    }

    /// Whether the polling claim runs now: always while the slot is not read; else at most every
    /// `poll_every`, or again at once while it comes back full, once the slot has named what was
    /// committed before the relay started, and while, for `poll_every`, nothing a claim took was
    /// also named by the slot (a backlog the slot does not cover). A poll that finds a few events
    /// finds those the slot is about to deliver: polling again at once would race the slot for
    /// every new event and take each one twice. So would full polls of a backlog the slot is
    /// delivering: each event would be taken by a poll, then looked at again when the slot
    /// names it.
    fn poll_due(&self, lane: &Lane) -> bool {
        if !self.progress.streaming() {
            // A standby (another relay reads the slot) leaves the slot's events to that relay,
            // which publishes them and polls for everything else, unless it stops confirming:
            // polling beside it would publish the events it is reading a second time.
            return !self.progress.standby() || self.progress.stalled();
        }
        let polled = lane.polled.lock().unwrap_or_else(|e| e.into_inner());
        let apart = polled
            .overlapped
            .is_none_or(|at| at.elapsed() >= self.poll_every);
        let caught_up = self.progress.positions().1 >= self.started_at;
        (polled.full && apart && caught_up)
            || polled.at.is_none_or(|at| at.elapsed() >= self.poll_every)
    }

    /// The slot named events a claim had taken, or a poll claimed events being read: the
    /// polls and the slot are taking the same events.
    fn overlapped(lane: &Lane) {
        lane.polled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .overlapped = Some(Instant::now());
    }

    /// Ids a claim by id did not get. Missed once, each is looked at again after a millisecond
    /// without further ado: most often the row was not visible yet. Missed again, those taken
    /// by another claim, finished or waiting for a retry are done here (the polling claim's);
    /// the rest — still not visible, or ordered behind an event in flight — are looked at again
    /// ([`Progress::missed`]). If the table cannot be read now, every one is looked at again.
    async fn missed(&self, lane: &Lane, target: &Target, ids: Vec<i64>) {
        let (first, ids) = self.progress.first_misses(lane.sid, ids);
        self.progress.missed(lane.sid, first);
        if ids.is_empty() {
            return;
        }
        let taken = (self.inner.events_ids_taken(target, &ids).await).unwrap_or_default();
        let taken: HashSet<i64> = taken.into_iter().collect();
        let (done, again): (Vec<i64>, Vec<i64>) =
            ids.into_iter().partition(|id| taken.contains(id));
        if !done.is_empty() {
            Self::overlapped(lane);
        }
        self.progress.done(lane.sid, done);
        self.progress.missed(lane.sid, again);
    }

    /// Whether the slot streams and the timed poll is due, whatever waits in the queue: also
    /// when no poll has run yet (a relay whose slot delivered before its first claim would
    /// otherwise not poll until the slot's queue ran dry).
    fn poll_overdue(&self, lane: &Lane) -> bool {
        if !self.progress.streaming() {
            return false;
        }
        let polled = lane.polled.lock().unwrap_or_else(|e| e.into_inner());
        polled.at.is_none_or(|at| at.elapsed() >= self.poll_every)
    }

    /// Up to `n` ids the slot named, for a read or a claim by id. Those this relay's polls took
    /// are theirs: they are left out at once, without a look at the table (a relay whose slot
    /// starts behind, or catches up on a backlog it polled meanwhile, is named every one of
    /// them).
    fn take(&self, lane: &Lane, n: usize) -> Vec<i64> {
        loop {
            let ids = self.progress.take(lane.sid, n);
            if ids.is_empty() {
                return ids;
            }
            let (polled, ids): (Vec<i64>, Vec<i64>) = {
                let mut polled = lane.polled.lock().unwrap_or_else(|e| e.into_inner());
                if polled.taken.is_empty() {
                    return ids;
                }
                ids.into_iter().partition(|id| polled.taken.remove(id))
            };
            if polled.is_empty() {
                return ids;
            }
            Self::overlapped(lane);
            self.progress.done(lane.sid, polled);
            if !ids.is_empty() {
                return ids;
            }
        }
    }

    /// The polling claim beside the slot, and when it ran and whether it came back full.
    async fn poll(&self, lane: &Lane, p: &ClaimParams<'_>) -> postbox::Result<Claimed> {
        let mut claimed = self.watch(self.inner.events_claim(p).await)?;
        let full = claimed.events.len() + claimed.exhausted.len()
            >= usize::try_from(p.batch_size).unwrap_or(usize::MAX);
        if !p.order.aggregate_types.is_empty() {
            self.put_back_busy_aggregates(p, &mut claimed).await?;
        }
        // Events this relay is publishing from a read are left to the read, under this claim's
        // token; those a read published whose mark found them claimed are marked now.
        let before = claimed.events.len();
        let settle = lane.reads.poll_claimed(&mut claimed);
        if claimed.events.len() < before {
            Self::overlapped(lane);
        }
        if !settle.is_empty() {
            let done = MarkProcessedParams {
                target: p.target,
                claim_token: claimed.claim_token,
                ids: &settle,
            };
            self.watch(self.inner.events_mark_processed(&done).await)?;
        }
        let mut polled = lane.polled.lock().unwrap_or_else(|e| e.into_inner());
        polled.at = Some(Instant::now());
        polled.full = full;
        polled.taken.extend(claimed.events.iter().map(|e| e.id));
        while polled.taken.len() > POLLED_KEPT {
            polled.taken.pop_first();
        }
        Ok(claimed)
    }

    /// Puts back, untouched, the ordered events this poll took whose aggregate has another
    /// event in flight or `FAILED` (`PgStore::events_ordered_put_back`): the poll goes by id, the slot
    /// by commit order, and with producers committing out of id order an event with a lower id
    /// can be due while a later one of its aggregate is being published. They are taken again
    /// once their aggregate is free.
    async fn put_back_busy_aggregates(
        &self,
        p: &ClaimParams<'_>,
        claimed: &mut Claimed,
    ) -> postbox::Result<()> {
        if claimed.events.is_empty() {
            return Ok(());
        }
        let ids: Vec<i64> = claimed.events.iter().map(|e| e.id).collect();
        let back = (self.inner)
            .events_ordered_put_back(p, claimed.claim_token, &ids)
            .await;
        let back: HashSet<i64> = self.watch(back)?.into_iter().collect();
        if !back.is_empty() {
            tracing::debug!(
                events = back.len(),
                "ordered events a poll took put back: another event of their aggregate is in flight or FAILED"
            );
            claimed.events.retain(|e| !back.contains(&e.id));
        }
        Ok(())
    }
}
