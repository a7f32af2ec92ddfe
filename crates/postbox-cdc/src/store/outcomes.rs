//! What became of the events a CDC relay read without a claim: each outcome recorded under
//! the token of the claim that holds the row, and counted towards the slot's confirmation.

use std::collections::HashSet;
use std::time::Duration;

use postbox::store::{
    ClaimOrder, ClaimParams, FailedMark, MarkFailedParams, MarkProcessedParams, ReleaseParams,
};
use postbox::{Store, Target};
use uuid::Uuid;

use super::{CdcStore, Lane};

impl CdcStore {
    /// The outcome of `ids` of `target` was written (`ok`) or could not be: counted towards the
    /// slot's confirmation for that outbox alone (a tenant's ids are numbered by a sequence of
    /// their own and may equal the default schema's). A write that failed leaves the slot's position
    /// where it is, the ids unrecorded: the relay retries the write for a while, and if it
    /// gives up, the polling claim takes the rows (read ones are still `PENDING`; claimed ones
    /// once their lease ends), publishes them and records them, and its mark lets the position
    /// pass them.
    pub(super) fn recorded(&self, target: &Target, ids: impl IntoIterator<Item = i64>, ok: bool) {
        if ok && let Some(lane) = self.lane(target) {
            self.progress.done(lane.sid, ids);
        }
    }
}

/// The outcomes of read events ([`crate::reads`]): each recorded under the token of the claim
/// that holds the row — a poll of this relay that adopted it, or (for a failed try or a put
/// back) a claim by id made for it — or, for `PROCESSED`, by the unclaimed mark.
impl CdcStore {
    pub(super) async fn mark_read(
        &self,
        lane: &Lane,
        p: &MarkProcessedParams<'_>,
    ) -> postbox::Result<u64> {
        let split = lane.reads.split(p.ids.iter().copied());
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
        for (token, ids) in lane.reads.finish(&p.claim_token, &finished, &unmarked) {
            match self.mark_with(p.target, token, &ids).await {
                Ok(n) => marked += n,
                Err(e) => failed = Some(e),
            }
        }
        lane.reads.unrecorded(&unrecorded);
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
        lane: &Lane,
        target: &Target,
        ids: impl IntoIterator<Item = i64>,
    ) -> postbox::Result<Vec<(Uuid, HashSet<i64>)>> {
        let split = lane.reads.split(ids);
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

    pub(super) async fn fail_read(
        &self,
        lane: &Lane,
        p: &MarkFailedParams<'_>,
    ) -> postbox::Result<Vec<FailedMark>> {
        let ids: Vec<i64> = p.tries.iter().map(|t| t.id).collect();
        let claims = self.claims_of(lane, p.target, ids.iter().copied()).await;
        lane.reads.finish(&p.claim_token, &ids, &[]);
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

    pub(super) async fn release_read(
        &self,
        lane: &Lane,
        p: &ReleaseParams<'_>,
    ) -> postbox::Result<u64> {
        let ids: Vec<i64> = p.releases.iter().map(|r| r.id).collect();
        let claims = self.claims_of(lane, p.target, ids.iter().copied()).await;
        lane.reads.finish(&p.claim_token, &ids, &[]);
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
