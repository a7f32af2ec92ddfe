//! Every few seconds: the backlog gauges, the sink gauges, a point of the page's history, and
//! the alert checks. One cheap status query per served target.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use postbox::RelayStats;
use postbox::metrics as metric;
use postbox::store::StatusCounts;
use serde::Serialize;
use tokio::sync::watch;
use tracing::debug;

use crate::alerts::{Alerts, Check};
use crate::server::Shared;

/// How much history the page shows.
const HISTORY: Duration = Duration::from_secs(15 * 60);

/// One point of the page's history: what the relay did since the previous point.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Point {
    pub(crate) at: DateTime<Utc>,
    /// Seconds since the previous point.
    pub(crate) seconds: f64,
    pub(crate) published: u64,
    pub(crate) failed_tries: u64,
    pub(crate) gave_up: u64,
    /// Mean latency of the events published in the interval, in seconds.
    pub(crate) mean_latency: Option<f64>,
    /// Outstanding (`PENDING` and `PROCESSING`) events of every served target at that time.
    pub(crate) backlog: i64,
}

/// The relay's recent throughput and latency, for the page.
#[derive(Debug, Default)]
pub(crate) struct History {
    points: VecDeque<Point>,
    last: Option<(std::time::Instant, RelayStats)>,
}

impl History {
    /// Adds a point from the relay's running totals.
    fn push(&mut self, stats: RelayStats, backlog: i64, keep: usize) {
        let now = std::time::Instant::now();
        if let Some((at, last)) = self.last {
            let published = stats.published.saturating_sub(last.published);
            let latency = stats.latency_total.saturating_sub(last.latency_total);
            self.points.push_back(Point {
                at: Utc::now(),
                seconds: now.duration_since(at).as_secs_f64(),
                published,
                failed_tries: stats.failed_tries.saturating_sub(last.failed_tries),
                gave_up: stats.gave_up.saturating_sub(last.gave_up),
                mean_latency: (published > 0).then(|| latency.as_secs_f64() / published as f64),
                backlog,
            });
            while self.points.len() > keep {
                self.points.pop_front();
            }
        }
        self.last = Some((now, stats));
    }

    pub(crate) fn points(&self) -> Vec<Point> {
        self.points.iter().cloned().collect()
    }
}

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
    let targets = match crate::api::targets(shared, None).await {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_is_deltas_and_bounded() {
        let mut h = History::default();
        let mut stats = RelayStats::default();
        h.push(stats, 0, 3);
        assert!(h.points().is_empty(), "the first sample is only a baseline");
        for i in 1..=5u64 {
            stats.published += 10;
            stats.latency_total += Duration::from_millis(10 * i * 10);
            h.push(stats, 7, 3);
        }
        let points = h.points();
        assert_eq!(points.len(), 3);
        assert!(points.iter().all(|p| p.published == 10 && p.backlog == 7));
        let last = points
            .last()
            .and_then(|p| p.mean_latency)
            .unwrap_or_default();
        assert!((last - 0.05).abs() < 1e-9, "{last}");
    }
}
