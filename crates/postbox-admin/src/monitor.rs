//! Every few seconds: the backlog gauges, the sink gauges, a point of the page's history, and
//! the alert checks. One cheap status query per served target.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use postbox::metrics as metric;
use postbox::store::StatusCounts;
use tokio::sync::watch;
use tracing::debug;

use crate::alerts::{Alerts, Check};
use crate::history::HISTORY;
use crate::state::Shared;

/// Refreshes until `stop`.
pub(crate) async fn run(
    shared: Arc<Shared>,
    alerts: Option<Alerts>,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let keep = (HISTORY.as_secs_f64() / every.as_secs_f64()).ceil() as usize;
    let mut alerts = alerts.map(|a| a.start(shared.relay.as_ref().map(|r| r.subscribe())));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => break,
        }
        let counts = refresh_backlog(&shared).await;
        let mut checks = Vec::new();
        for (tenant, counts) in &counts {
            checks.push(Check::Backlog {
                tenant: tenant.clone(),
                oldest: counts.oldest_pending_age,
                pending: counts.pending + counts.processing,
            });
        }
        if let Some(relay) = &shared.relay {
            for sink in relay.sinks() {
                let down = if sink.up {
                    Duration::ZERO
                } else {
                    (Utc::now() - sink.since).to_std().unwrap_or_default()
                };
                metrics::gauge!(metric::SINK_UP, "sink" => sink.name.clone()).set(if sink.up {
                    1.0
                } else {
                    0.0
                });
                metrics::gauge!(metric::SINK_DOWN_SECONDS, "sink" => sink.name.clone())
                    .set(down.as_secs_f64());
                checks.push(Check::Sink(sink));
            }
            let backlog = counts.iter().map(|(_, c)| c.pending + c.processing).sum();
            if let Ok(mut history) = shared.history.lock() {
                history.push(relay.stats(), backlog, keep);
            }
        }
        if let Some(alerts) = alerts.as_mut() {
            alerts.check(checks);
        }
    }
    if let Some(alerts) = alerts {
        alerts.stop().await;
    }
}

/// Reads every served target's counts and sets the backlog gauges.
async fn refresh_backlog(shared: &Shared) -> Vec<(String, StatusCounts)> {
    let mut out = Vec::new();
    let targets = match postbox::status::targets(&*shared.store, None).await {
        Ok(targets) => targets,
        Err(e) => {
            debug!(?e, "monitor: cannot list the targets");
            return out;
        }
    };
    for target in targets {
        let tenant = target.label().to_owned();
        match shared.store.status_counts(&target).await {
            Ok(counts) => {
                for (status, n) in [
                    ("PENDING", counts.pending),
                    ("PROCESSING", counts.processing),
                    ("PROCESSED", counts.processed),
                    ("FAILED", counts.failed),
                ] {
                    metrics::gauge!(metric::EVENTS, "tenant" => tenant.clone(), "status" => status)
                        .set(n as f64);
                }
                metrics::gauge!(metric::OLDEST_PENDING_AGE, "tenant" => tenant.clone())
                    .set(counts.oldest_pending_age.unwrap_or_default().as_secs_f64());
                out.push((tenant, counts));
            }
            Err(e) => debug!(tenant, error = %e, "monitor: cannot read the counts"),
        }
    }
    out
}
