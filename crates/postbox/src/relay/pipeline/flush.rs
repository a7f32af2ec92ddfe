//! Flushing: the buffered outcomes of a claim written to the store, each write fenced by the
//! claim's token and retried for at most the write patience of `relay::timing`, on tasks of
//! their own, a few at once, while the relay claims and publishes on: a write that waits (a
//! locked tenant table) holds up only its target.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinError;
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
use crate::schema::{SchemaName, Target};
use crate::store::{
    FailedMark, FailedTry, MarkFailedParams, MarkProcessedParams, Release, ReleaseParams,
};

/// Writes of buffered outcomes under way at once, each on a task (and a connection) of its own,
/// while the relay claims and publishes on: the database works on the next claim while the last
/// batch is recorded. Three: as many connections as the relay's writes held before they left
/// its loop (two marks beside one write awaited), so that they take no more of a small pool
/// (the binary's has four) from the claims.
pub(super) const WRITES_IN_FLIGHT: usize = 3;

/// Of those, the most one target has under way: a target whose writes wait (its table locked by
/// a `VACUUM FULL` or a migration, its rows locked by another session) holds this many, and the
/// other targets' outcomes are written beside them. A claim has one write under way at a time;
/// what it records meanwhile goes with its next.
pub(super) const TARGET_WRITES_IN_FLIGHT: usize = 2;

/// A write of buffered outcomes under way: its claim, its target, and what it wrote.
pub(super) type Writing = Pin<
    Box<dyn Future<Output = (u64, SchemaName, std::result::Result<Written, JoinError>)> + Send>,
>;

/// What one write of a claim's buffered outcomes did.
pub(in crate::relay) struct Written {
    stats: RelayStats,
    /// The first write that failed for good (its events are taken over when their leases
    /// expire); the others were still made.
    failed: Option<crate::Error>,
}

/// The buffered outcomes of one claim handed to a write.
struct Outcomes {
    target: Target,
    token: Uuid,
    done: Vec<i64>,
    tries: Vec<FailedTry>,
    releases: Vec<Release>,
    /// The event types of `tries`, by id (their retry policy, their alert).
    event_types: HashMap<i64, String>,
}

impl Pipeline {
    /// Takes in a finished write: its counts, its claim free to write again; its error, if one
    /// of its writes failed for good.
    pub(super) fn account(
        &mut self,
        claim: u64,
        schema: &SchemaName,
        written: std::result::Result<Written, JoinError>,
    ) -> Result<()> {
        if let Some(n) = self.writes_of.get_mut(schema) {
            *n -= 1;
            if *n == 0 {
                self.writes_of.remove(schema);
            }
        }
        // What the claim buffered meanwhile goes at the flush that follows every take-in
        // (`Pipeline::apply`), which also sets the next window.
        if let Some(open) = self.claims.get_mut(&claim) {
            open.writing = false;
        }
        let written = match written {
            Ok(written) => written,
            // A panic in a write is the relay's own, as it was when writes ran inline.
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // Cancelled: the runtime is shutting down; the events' leases will run out.
            Err(_) => return Ok(()),
        };
        self.add(written.stats);
        written.failed.map_or(Ok(()), Err)
    }

    /// Whether a claim has buffered outcomes a write can take now (see [`Self::flush`]).
    pub(super) fn has_writable(&self) -> bool {
        self.writing.len() < WRITES_IN_FLIGHT
            && self
                .claims
                .values()
                .any(|c| c.buffered() > 0 && self.may_write(c))
    }

    /// Whether `open` may start a write: none of its own under way, and its target below
    /// [`TARGET_WRITES_IN_FLIGHT`].
    fn may_write(&self, open: &super::OpenClaim) -> bool {
        !open.writing
            && self
                .writes_of
                .get(&open.target.schema)
                .copied()
                .unwrap_or(0)
                < TARGET_WRITES_IN_FLIGHT
    }

    /// Starts the writes of every finished claim's outcomes, and with `all`, of every claim's
    /// buffered ones, as far as [`WRITES_IN_FLIGHT`] and [`TARGET_WRITES_IN_FLIGHT`] allow; the
    /// rest stay buffered until a write returns. Never waits for a write: a target whose writes
    /// wait for a lock holds up only itself.
    pub(super) fn flush(&mut self, all: bool) {
        let ready: Vec<u64> = self
            .claims
            .iter()
            .filter(|(_, c)| !c.writing && (c.outstanding == 0 || (all && c.buffered() > 0)))
            .map(|(id, _)| *id)
            .collect();
        for id in ready {
            if self.writing.len() >= WRITES_IN_FLIGHT {
                break;
            }
            self.flush_claim(id);
        }
        self.flush_at = self
            .claims
            .values()
            .any(|c| c.buffered() > 0 && !c.writing)
            .then(|| Instant::now() + FLUSH_WINDOW);
    }

    /// Hands the buffered outcomes of `claim` to a write of their own, if it may start one;
    /// a finished claim is closed.
    fn flush_claim(&mut self, claim: u64) {
        let Some(open) = self.claims.get(&claim) else {
            return;
        };
        if open.buffered() > 0 && !self.may_write(open) {
            return;
        }
        let Some(open) = self.claims.get_mut(&claim) else {
            return;
        };
        let finished = open.outstanding == 0;
        // The lease invariant (relay::timing) counts the write patience from the flush window
        // of the first outcome buffered: a write that waited for its claim's last one gets what
        // is left of it (always one attempt).
        let deadline = open.buffered_since.take().unwrap_or_else(Instant::now)
            + FLUSH_WINDOW
            + write_patience(self.inner.config.lease);
        let mut outcomes = Outcomes {
            target: open.target.clone(),
            token: open.token,
            done: std::mem::take(&mut open.done),
            tries: std::mem::take(&mut open.tries),
            releases: std::mem::take(&mut open.releases),
            event_types: HashMap::new(),
        };
        let any = !(outcomes.done.is_empty()
            && outcomes.tries.is_empty()
            && outcomes.releases.is_empty());
        if finished {
            if let Some(mut open) = self.claims.remove(&claim) {
                outcomes.event_types = std::mem::take(&mut open.event_types);
                self.close(&open);
            }
        } else {
            open.writing = any;
            outcomes.event_types = outcomes
                .tries
                .iter()
                .filter_map(|t| open.event_types.get(&t.id).map(|e| (t.id, e.clone())))
                .collect();
        }
        if !any {
            return;
        }
        let schema = outcomes.target.schema.clone();
        *self.writes_of.entry(schema.clone()).or_default() += 1;
        let task = tokio::spawn(write(Arc::clone(&self.inner), outcomes, deadline));
        self.writing
            .push(Box::pin(async move { (claim, schema, task.await) }));
    }

    /// Closes a claim whose every outcome is handed to a write.
    fn close(&mut self, open: &super::OpenClaim) {
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
        metrics::histogram!(metric::BATCH_SECONDS, "tenant" => self.inner.metric_tenant(open.target.label()))
            .record(open.started.elapsed().as_secs_f64());
    }
}

/// Writes one claim's buffered outcomes — acknowledged events marked, unavailable ones put
/// back, failed tries backed off or `FAILED` — each retried until `deadline`; a write that
/// fails for good does not stop the others.
async fn write(inner: Arc<Inner>, o: Outcomes, deadline: Instant) -> Written {
    let cfg = &inner.config;
    let tenant = o.target.label();
    let label = inner.metric_tenant(tenant);
    let mut stats = RelayStats::default();
    let mut failed = None;
    let mut keep = |e: crate::Error| {
        failed.get_or_insert(e);
    };
    if !o.done.is_empty() {
        let processed = MarkProcessedParams {
            target: &o.target,
            claim_token: o.token,
            ids: &o.done,
        };
        let started = Instant::now();
        match with_patience(deadline, || inner.store.events_mark_processed(&processed)).await {
            Ok(marked) => {
                metrics::histogram!(metric::MARK_SECONDS, "tenant" => label.clone())
                    .record(started.elapsed().as_secs_f64());
                metrics::counter!(metric::EVENTS_PUBLISHED, "tenant" => label.clone())
                    .increment(marked);
                stats.published += marked;
                stats.fenced += o.done.len() as u64 - marked;
            }
            Err(e) => keep(e),
        }
    }
    if !o.releases.is_empty() {
        let params = ReleaseParams {
            target: &o.target,
            claim_token: o.token,
            releases: &o.releases,
        };
        match with_patience(deadline, || inner.store.events_release(&params)).await {
            Ok(released) => {
                stats.deferred += released;
                stats.fenced += o.releases.len() as u64 - released;
                metrics::counter!(metric::EVENTS_DEFERRED, "tenant" => label.clone())
                    .increment(released);
                for r in &o.releases {
                    inner.retries.note(&o.target.schema, r.delay);
                }
                debug!(
                    tenant,
                    count = released,
                    "destination unavailable; events put back without spending a try"
                );
            }
            Err(e) => keep(e),
        }
    }
    if !o.tries.is_empty() {
        // One mark per backoff: events whose type has a retry policy of its own back off by it.
        let backoff_of = |id: i64| {
            let event_type = o.event_types.get(&id).map_or("", String::as_str);
            cfg.policy_for(event_type).backoff
        };
        let mut groups: Vec<(Backoff, Vec<FailedTry>)> = Vec::new();
        for t in &o.tries {
            let backoff = backoff_of(t.id);
            match groups.iter_mut().find(|(b, _)| *b == backoff) {
                Some((_, group)) => group.push(t.clone()),
                None => groups.push((backoff, vec![t.clone()])),
            }
        }
        let mut marks = Vec::with_capacity(o.tries.len());
        let mut asked = 0;
        for (backoff, group) in &groups {
            match mark_failed(&inner, &o.target, o.token, group, *backoff, deadline).await {
                Ok(m) => {
                    asked += group.len();
                    marks.extend(m);
                }
                Err(e) => keep(e),
            }
        }
        stats.failed_tries += marks.len() as u64;
        stats.fenced += (asked - marks.len()) as u64;
        metrics::counter!(metric::PUBLISH_FAILURES, "tenant" => label.clone())
            .increment(marks.len() as u64);
        for mark in marks {
            let error = o
                .tries
                .iter()
                .find(|t| t.id == mark.id)
                .map_or("", |t| t.error.as_str());
            if mark.gave_up {
                stats.gave_up += 1;
                let event_type = o.event_types.get(&mark.id).map_or("", String::as_str);
                alert_failed(&inner, tenant, mark.id, event_type, mark.retry_count, error);
            } else {
                let retry_in =
                    backoff_of(mark.id).delay(u32::try_from(mark.retry_count).unwrap_or(0));
                inner.retries.note(&o.target.schema, retry_in);
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
        metrics::counter!(metric::EVENTS_FENCED, "tenant" => label).increment(stats.fenced);
        warn!(tenant, relay = %inner.id, count = stats.fenced,
            "results not recorded: another relay took these events over after this relay's lease expired (they may be published twice)");
    }
    Written { stats, failed }
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
