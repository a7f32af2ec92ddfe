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
    let targets = match postbox::status::targets(&*shared.store, None).await {
        Ok(targets) => targets,
        Err(e) => {
            debug!(?e, "monitor: cannot list the targets");
            return Vec::new();
        }
    };
    // Up to 50 targets, each one's counts (PROCESSED included); past that, what waits in each,
    // one statement per hundred tenant schemas rather than one per tenant (see
    // StoreOps::status_outstanding). A target that cannot be read fails the batch: then one by
    // one.
    let many = targets.len() > postbox::status::SUMMARY_ABOVE;
    let batch = if many {
        match shared.store.status_outstanding(&targets).await {
            Ok(all) => Some(all),
            Err(e) => {
                debug!(error = %e, "monitor: cannot read the counts at once; one by one");
                None
            }
        }
    } else {
        None
    };
    let read: Vec<(String, StatusCounts)> = match batch {
        Some(all) => targets
            .iter()
            .zip(all)
            .map(|(t, o)| {
                let mut counts = StatusCounts::default();
                counts.pending = o.pending;
                counts.processing = o.processing;
                counts.failed = o.failed;
                counts.oldest_pending_age = o.oldest_pending_age;
                (t.label().to_owned(), counts)
            })
            .collect(),
        None => {
            let mut each = Vec::new();
            for target in &targets {
                match shared.store.status_counts(target).await {
                    Ok(counts) => each.push((target.label().to_owned(), counts)),
                    Err(e) => {
                        debug!(tenant = target.label(), error = %e, "monitor: cannot read the counts")
                    }
                }
            }
            each
        }
    };
    // The gauges, under the relay's tenant labels: tenants past its limit are summed under one
    // label, the oldest age being the oldest of them.
    let mut gauges: std::collections::BTreeMap<String, StatusCounts> = Default::default();
    for (tenant, c) in &read {
        let label = shared
            .relay
            .as_ref()
            .map_or_else(|| tenant.clone(), |r| r.metric_tenant(tenant));
        let g = gauges.entry(label).or_default();
        g.pending += c.pending;
        g.processing += c.processing;
        g.processed += c.processed;
        g.failed += c.failed;
        g.oldest_pending_age = g.oldest_pending_age.max(c.oldest_pending_age);
    }
    for (label, c) in gauges {
        for (status, n) in [
            ("PENDING", c.pending),
            ("PROCESSING", c.processing),
            ("PROCESSED", c.processed),
            ("FAILED", c.failed),
        ] {
            // The batched read of many targets leaves PROCESSED out (its count is the
            // history's).
            if status == "PROCESSED" && many {
                continue;
            }
            metrics::gauge!(metric::EVENTS, "tenant" => label.clone(), "status" => status)
                .set(n as f64);
        }
        metrics::gauge!(metric::OLDEST_PENDING_AGE, "tenant" => label)
            .set(c.oldest_pending_age.unwrap_or_default().as_secs_f64());
    }
    read
}
