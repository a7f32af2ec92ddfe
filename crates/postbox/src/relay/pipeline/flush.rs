//! Flushing: the buffered outcomes of a claim written to the store, each write fenced by the
//! claim's token and retried for at most the write patience of `relay::timing`; marks of
//! acknowledged events on tasks of their own, a few at once, while the relay claims on.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;
use tracing::{debug, warn};
use uuid::Uuid;

use super::Pipeline;
use super::outcomes::{a_destination_is_up, alert_failed};
use crate::backoff::Backoff;
use crate::error::Result;
use crate::metrics as metric;
use crate::relay::timing::{FLUSH_WINDOW, write_patience};
use crate::relay::{Inner, RelayStats};
use crate::schema::Target;
use crate::store::{FailedMark, FailedTry, MarkFailedParams, MarkProcessedParams, ReleaseParams};

/// Marks of acknowledged events written at once, each on a connection of its own, while the
/// relay claims and publishes the next batches: the database works on the next claim while the
/// last batch is marked.
pub(super) const MARKS_IN_FLIGHT: usize = 2;

/// What one mark of acknowledged events wrote.
pub(in crate::relay) struct Marked {
    tenant: String,
    /// Events asked to be marked.
    asked: u64,
    /// Rows marked (fewer: taken over by another relay since).
    marked: u64,
}

impl Pipeline {
    /// Counts a finished mark of acknowledged events; its error, if it failed for good.
    pub(super) fn account(
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
        metrics::counter!(metric::EVENTS_PUBLISHED, "tenant" => self.inner.metric_tenant(&marked.tenant))
            .increment(marked.marked);
        if fenced > 0 {
            metrics::counter!(metric::EVENTS_FENCED, "tenant" => self.inner.metric_tenant(&marked.tenant))
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
        let label = self.inner.metric_tenant(target.label());
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
            metrics::histogram!(metric::MARK_SECONDS, "tenant" => label)
                .record(started.elapsed().as_secs_f64());
            Ok(Marked {
                tenant,
                asked: done.len() as u64,
                marked,
            })
        }));
        Ok(())
    }

    /// Records the buffered outcomes of every finished claim, and with `all`, of every claim.
    /// The writes of one flush are retried together for at most [`write_patience`], so their
    /// leases are not left unrenewed for longer (the invariant of [`crate::relay::timing`]).
    pub(super) async fn flush(&mut self, all: bool) -> Result<()> {
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
            metrics::counter!(metric::EVENTS_DEFERRED, "tenant" => inner.metric_tenant(tenant))
                .increment(released);
            for r in &releases {
                inner.retries.note(&target.schema, r.delay);
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
            metrics::counter!(metric::PUBLISH_FAILURES, "tenant" => inner.metric_tenant(tenant))
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
                    inner.retries.note(&target.schema, retry_in);
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
            metrics::counter!(metric::EVENTS_FENCED, "tenant" => inner.metric_tenant(tenant))
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
            metrics::histogram!(metric::BATCH_SECONDS, "tenant" => inner.metric_tenant(tenant))
                .record(open.started.elapsed().as_secs_f64());
        }
        self.add(stats);
        Ok(())
    }
}

/// Records failed tries backing off by `retry`, retrying until `deadline`.
pub(super) async fn mark_failed(
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
