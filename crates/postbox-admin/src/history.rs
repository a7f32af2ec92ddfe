//! The page's recent history: what the relay did, point by point, over the last 15 minutes.

use std::collections::VecDeque;
use std::time::Duration;

use chrono::{DateTime, Utc};
use postbox::relay::RelayStats;
use serde::Serialize;

/// How much history the page shows.
pub(crate) const HISTORY: Duration = Duration::from_secs(15 * 60);

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
    pub(crate) fn push(&mut self, stats: RelayStats, backlog: i64, keep: usize) {
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
