//! One batch of one target: claim, fail the rows that cannot be read, publish the rest while
//! their leases are kept alive, and record every outcome, fenced by the claim's token.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use super::lease::LeaseKeeper;
use super::{Inner, RelayStats, publish};
use crate::backoff::Backoff;
use crate::error::Result;
use crate::schema::Target;
use crate::store::{ClaimParams, FailedTry, MarkFailedParams, MarkProcessedParams};

/// Claims, publishes and marks one batch of `target`; returns the batch's stats and whether it
/// was full (more work is waiting).
pub(super) async fn run(inner: &Inner, target: &Target) -> Result<(RelayStats, bool)> {
    let cfg = &inner.config;
    let tenant = target.label();
    let claimed = inner
        .store
        .events_claim(&ClaimParams {
            target,
            batch_size: cfg.batch_size,
            lease: cfg.lease,
            relay_id: &inner.id,
        })
        .await?;
    let mut stats = RelayStats {
        recovered: claimed.recovered,
        gave_up: claimed.exhausted.len() as u64,
        failed_tries: claimed.recovered + claimed.exhausted.len() as u64,
        ..RelayStats::default()
    };
    let full = claimed.events.len() + claimed.exhausted.len() + claimed.undecodable.len()
        >= cfg.batch_size as usize;
    if claimed.recovered > 0 {
        info!(tenant, relay = %inner.id, count = claimed.recovered,
            "recovered {} stale events (a relay did not finish within its lease)", claimed.recovered);
        metrics::counter!("postbox_stale_recovered_total", "tenant" => tenant.to_owned())
            .increment(claimed.recovered);
    }
    for e in &claimed.exhausted {
        alert_failed(tenant, e.id, &e.event_type, e.retry_count, &e.last_error);
    }
    let token = claimed.claim_token;
    if !claimed.undecodable.is_empty() {
        // A row no sink could be given fails at once, alone: the rest of the batch goes on.
        let tries: Vec<FailedTry> = claimed
            .undecodable
            .iter()
            .map(|u| FailedTry {
                id: u.id,
                error: u.reason.clone(),
                permanent: true,
            })
            .collect();
        let marks = mark_failed(inner, target, token, &tries).await?;
        stats.failed_tries += marks.len() as u64;
        stats.gave_up += marks.len() as u64;
        for mark in &marks {
            let reason = tries
                .iter()
                .find(|t| t.id == mark.id)
                .map_or("", |t| t.error.as_str());
            alert_failed(tenant, mark.id, "(unreadable)", mark.retry_count, reason);
        }
    }
    if claimed.events.is_empty() {
        return Ok((stats, full));
    }
    let started = Instant::now();
    let keeper = LeaseKeeper::start(
        inner.store.clone(),
        target.clone(),
        token,
        claimed.events.iter().map(|e| e.id).collect(),
        cfg.lease,
    );
    let outcomes = publish::publish_batch(
        &inner.sink,
        &claimed.events,
        cfg.concurrency,
        cfg.publish_timeout,
    )
    .await;
    drop(keeper);

    let mut done = Vec::with_capacity(outcomes.len());
    let mut tries = Vec::new();
    for (id, outcome) in outcomes {
        match outcome {
            Ok(()) => done.push(id),
            Err(e) => tries.push(FailedTry {
                id,
                permanent: e.is_permanent(),
                // Logged and stored: a sink's error may quote a URL with its secrets.
                error: crate::redact::redact(&e.to_string()),
            }),
        }
    }
    let processed = MarkProcessedParams {
        target,
        claim_token: token,
        ids: &done,
    };
    let marked = with_patience(cfg.lease, || inner.store.events_mark_processed(&processed)).await?;
    stats.published += marked;
    stats.fenced += done.len() as u64 - marked;
    metrics::counter!("postbox_events_published_total", "tenant" => tenant.to_owned())
        .increment(marked);
    if !tries.is_empty() {
        let marks = mark_failed(inner, target, token, &tries).await?;
        stats.failed_tries += marks.len() as u64;
        stats.fenced += (tries.len() - marks.len()) as u64;
        metrics::counter!("postbox_publish_failures_total", "tenant" => tenant.to_owned())
            .increment(marks.len() as u64);
        for mark in marks {
            let t = tries.iter().find(|t| t.id == mark.id);
            let error = t.map_or("", |t| t.error.as_str());
            if mark.gave_up {
                stats.gave_up += 1;
                let event_type = claimed
                    .events
                    .iter()
                    .find(|e| e.id == mark.id)
                    .map_or("", |e| e.event_type.as_str());
                alert_failed(tenant, mark.id, event_type, mark.retry_count, error);
            } else {
                let retry_in = cfg
                    .retry
                    .delay(u32::try_from(mark.retry_count).unwrap_or(0));
                inner.retries.note(retry_in);
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
        warn!(tenant, relay = %inner.id, count = stats.fenced,
            "results not recorded: another relay took these events over after this relay's lease expired (they may be published twice)");
    }
    metrics::histogram!("postbox_batch_seconds", "tenant" => tenant.to_owned())
        .record(started.elapsed().as_secs_f64());
    debug!(tenant, size = claimed.events.len(), elapsed = ?started.elapsed(), "batch done");
    Ok((stats, full))
}

/// Records failed tries, with the relay's patience.
async fn mark_failed(
    inner: &Inner,
    target: &Target,
    token: uuid::Uuid,
    tries: &[FailedTry],
) -> Result<Vec<crate::store::FailedMark>> {
    let failed = MarkFailedParams {
        target,
        claim_token: token,
        tries,
        retry: inner.config.retry,
    };
    with_patience(inner.config.lease, || {
        inner.store.events_mark_failed(&failed)
    })
    .await
}

/// Retries a mark for up to half a lease, so a short database outage after publishing does not
/// turn published events into stale claims (which would publish them again).
async fn with_patience<T, F, Fut>(lease: Duration, mut op: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let deadline = Instant::now() + lease / 2;
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

/// The operator alert for an event that went `FAILED`.
pub(super) fn alert_failed(tenant: &str, id: i64, event_type: &str, retry_count: i32, error: &str) {
    error!(
        tenant,
        event_id = id,
        event_type,
        retry_count,
        error,
        "event FAILED and will not be retried; fix the cause, then retry it (an operator's retry puts it back in the queue)"
    );
    metrics::counter!("postbox_events_failed_total", "tenant" => tenant.to_owned()).increment(1);
}
