//! Outcomes: each publish's result, buffered with its claim until the claim is flushed —
//! acknowledged, a failed try (the event's fault), or its destination unavailable (put back
//! without a try; a claim whose every destination was down pauses its target) — and the
//! operator's alert when an event goes `FAILED`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::error;

use super::Pipeline;
use crate::metrics as metric;
use crate::ordering::{HELD_BACK, Work};
use crate::relay::timing::FLUSH_WINDOW;
use crate::relay::{FailedNotice, Inner, Notice, publish};
use crate::sink::{PublishError, Sink};
use crate::store::{FailedTry, Release};

/// The pause before an event whose destination was down is tried again, when the sink does not
/// say.
const UNAVAILABLE_PAUSE: Duration = Duration::from_secs(1);

/// One publish's outcome.
pub(in crate::relay) struct Done {
    claim: u64,
    id: i64,
    /// When the event's transaction inserted it (the database clock).
    created_at: chrono::DateTime<chrono::Utc>,
    /// `None`: not tried, as an earlier event of its ordered aggregate failed.
    result: Option<std::result::Result<(), PublishError>>,
    /// The route that took it, for the metrics' `route` label.
    route: Option<String>,
}

/// The outcomes of one publish, or of one ordered aggregate's events in this claim.
pub(super) type Publishing = Pin<Box<dyn Future<Output = Vec<Done>> + Send>>;

/// The publish of one piece of work: its event, or its ordered aggregate's chain, which stops at
/// its first failure (the later events go back untried, held back by it).
pub(super) fn publishing(
    sink: Arc<dyn Sink>,
    claim: u64,
    work: Work,
    timeout: Duration,
) -> Publishing {
    Box::pin(async move {
        let mut outcomes = Vec::with_capacity(work.events().len());
        let mut failed = false;
        // A chain stops at its first failure: the later events of the aggregate go
        // back untried, held back by it.
        for event in work.events() {
            let result = if failed {
                None
            } else {
                let result = publish::publish_one(&sink, event, timeout).await;
                failed = result.is_err();
                Some(result)
            };
            outcomes.push(Done {
                claim,
                id: event.id,
                created_at: event.created_at,
                route: result.as_ref().and_then(|_| sink.route_of(event)),
                result,
            });
        }
        outcomes
    })
}

impl Pipeline {
    /// Buffers one outcome with its claim.
    pub(super) fn record(&mut self, done: Done) {
        let Some(open) = self.claims.get_mut(&done.claim) else {
            return;
        };
        open.keeper.release(done.id);
        open.outstanding -= 1;
        open.buffered_since.get_or_insert_with(Instant::now);
        let Some(result) = done.result else {
            open.releases.push(Release {
                id: done.id,
                error: HELD_BACK.to_owned(),
                delay: Duration::ZERO,
            });
            if self.flush_at.is_none() {
                self.flush_at = Some(Instant::now() + FLUSH_WINDOW);
            }
            return;
        };
        let tenant = self.inner.metric_tenant(open.target.label());
        let route = done.route.unwrap_or_else(|| "default".to_owned());
        let outcome = match &result {
            Ok(()) => "ok",
            Err(e) if e.is_unavailable() => "unavailable",
            Err(_) => "failed",
        };
        metrics::counter!(metric::PUBLISH_OUTCOMES, "tenant" => tenant.clone(),
            "route" => route.clone(), "outcome" => outcome)
        .increment(1);
        match result {
            Ok(()) => {
                open.all_unavailable = false;
                open.done.push(done.id);
                // From the insert (database clock) to the destination's acknowledgement (this
                // host's clock): the two agree as far as their clocks are synchronised.
                let latency = (chrono::Utc::now() - done.created_at)
                    .to_std()
                    .unwrap_or_default();
                self.stats.latency_total += latency;
                self.inner.live.add_latency(latency);
                metrics::histogram!(metric::PUBLISH_LATENCY, "tenant" => tenant, "route" => route)
                    .record(latency.as_secs_f64());
                // A destination answered: the target's claims go on.
                self.paused.remove(&open.target.schema);
            }
            Err(e) if e.is_unavailable() => {
                let delay = e.retry_after().unwrap_or(UNAVAILABLE_PAUSE);
                open.pause = Some(open.pause.map_or(delay, |p| p.min(delay)));
                // Claims grow only while destinations answer: an outage is not a backlog to
                // take in large batches.
                self.sizes.remove(&open.target.schema);
                if open.all_unavailable && !a_destination_is_up(&*self.inner.sink) {
                    // No destination of this claim answered so far and none is known up: no
                    // new claims of the target until the pause is over (a success lifts it).
                    self.paused
                        .insert(open.target.schema.clone(), Instant::now() + delay);
                }
                // Logged and stored: a sink's error may quote a URL with its secrets.
                let error = crate::redact::redact(&e.to_string());
                self.last_unavailable = Some(error.clone());
                open.releases.push(Release {
                    id: done.id,
                    error,
                    delay,
                });
            }
            Err(e) => {
                open.all_unavailable = false;
                // The retry policy of the event's type, if one matches.
                let event_type = open.event_types.get(&done.id).map_or("", String::as_str);
                let policy = self.inner.config.policy_for(event_type);
                open.tries.push(FailedTry {
                    id: done.id,
                    permanent: e.is_permanent(),
                    error: crate::redact::redact(&e.to_string()),
                    max_retries: policy.max_retries.and_then(|m| i32::try_from(m).ok()),
                });
            }
        }
        if self.flush_at.is_none() {
            self.flush_at = Some(Instant::now() + FLUSH_WINDOW);
        }
    }
}

/// Whether `sink` reports one of its destinations up (a route beside a down one). A sink that
/// tracks no health reports none.
pub(super) fn a_destination_is_up(sink: &dyn Sink) -> bool {
    sink.health().iter().any(|h| h.up)
}

/// The operator alert for an event that went `FAILED`: a log line, a metric, and a notice to
/// the relay's subscribers (an alert sink).
pub(super) fn alert_failed(
    inner: &Inner,
    tenant: &str,
    id: i64,
    event_type: &str,
    retry_count: i32,
    error: &str,
) {
    error!(
        tenant,
        event_id = id,
        event_type,
        retry_count,
        error,
        "event FAILED and will not be retried; fix the cause, then retry it (an operator's retry puts it back in the queue)"
    );
    metrics::counter!(metric::EVENTS_FAILED, "tenant" => inner.metric_tenant(tenant)).increment(1);
    // No subscriber is not an error: the log line above is the alert then.
    let _ = inner.notices.send(Notice::Failed(FailedNotice::new(
        tenant,
        id,
        event_type,
        retry_count,
        error,
    )));
}
