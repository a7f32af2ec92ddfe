//! What a relay did: totals of a run, and live counters an embedding service can read while it
//! runs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What a relay did, summed over its run (or so far, from [`RelayHandle::stats`]).
///
/// [`RelayHandle::stats`]: super::RelayHandle::stats
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayStats {
    /// Events published and marked `PROCESSED`.
    pub published: u64,
    /// Failed tries (publish errors, timeouts, panics) recorded.
    pub failed_tries: u64,
    /// Events that went `FAILED` (out of retries, a permanent error, an unreadable row).
    pub gave_up: u64,
    /// Stale events taken over from a relay that did not finish in time.
    pub recovered: u64,
    /// Results this relay could not record because another relay had taken the event over.
    pub fenced: u64,
    /// Events put back, without spending a try, because their destination was down.
    pub deferred: u64,
    /// The sum of the published events' latencies, from their insert (the database clock) to
    /// the destination's acknowledgement; divided by `published`, the mean latency.
    pub latency_total: Duration,
}

impl RelayStats {
    pub(super) fn add(&mut self, other: RelayStats) {
        self.published += other.published;
        self.failed_tries += other.failed_tries;
        self.gave_up += other.gave_up;
        self.recovered += other.recovered;
        self.fenced += other.fenced;
        self.deferred += other.deferred;
        self.latency_total += other.latency_total;
    }
}

/// The running totals, updated after every batch.
#[derive(Debug, Default)]
pub(super) struct LiveStats {
    published: AtomicU64,
    failed_tries: AtomicU64,
    gave_up: AtomicU64,
    recovered: AtomicU64,
    fenced: AtomicU64,
    deferred: AtomicU64,
    latency_micros: AtomicU64,
}

impl LiveStats {
    pub(super) fn add(&self, s: RelayStats) {
        self.published.fetch_add(s.published, Ordering::Relaxed);
        self.failed_tries
            .fetch_add(s.failed_tries, Ordering::Relaxed);
        self.gave_up.fetch_add(s.gave_up, Ordering::Relaxed);
        self.recovered.fetch_add(s.recovered, Ordering::Relaxed);
        self.fenced.fetch_add(s.fenced, Ordering::Relaxed);
        self.deferred.fetch_add(s.deferred, Ordering::Relaxed);
        self.add_latency(s.latency_total);
    }

    /// Adds published events' latencies.
    pub(super) fn add_latency(&self, latency: Duration) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.latency_micros.fetch_add(micros, Ordering::Relaxed);
    }

    pub(super) fn snapshot(&self) -> RelayStats {
        RelayStats {
            published: self.published.load(Ordering::Relaxed),
            failed_tries: self.failed_tries.load(Ordering::Relaxed),
            gave_up: self.gave_up.load(Ordering::Relaxed),
            recovered: self.recovered.load(Ordering::Relaxed),
            fenced: self.fenced.load(Ordering::Relaxed),
            deferred: self.deferred.load(Ordering::Relaxed),
            latency_total: Duration::from_micros(self.latency_micros.load(Ordering::Relaxed)),
        }
    }
}

/// Whether a drain is stuck on destinations that are down: events were only put back, nothing
/// published or failed, for longer than the drain's patience.
pub(super) struct Stall {
    progress: u64,
    deferred: u64,
    since: Instant,
}

impl Stall {
    pub(super) fn new() -> Self {
        Stall {
            progress: 0,
            deferred: 0,
            since: Instant::now(),
        }
    }

    /// How long the drain has made no progress while putting events back, once that is more
    /// than `patience`.
    pub(super) fn check(&mut self, stats: &RelayStats, patience: Duration) -> Option<Duration> {
        let progress = stats.published + stats.failed_tries + stats.gave_up;
        if progress != self.progress {
            self.progress = progress;
            self.deferred = stats.deferred;
            self.since = Instant::now();
            return None;
        }
        let waited = self.since.elapsed();
        (stats.deferred > self.deferred && waited >= patience).then_some(waited)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(published: u64, deferred: u64) -> RelayStats {
        RelayStats {
            published,
            deferred,
            ..RelayStats::default()
        }
    }

    #[test]
    fn a_stall_is_only_events_put_back_without_progress() {
        let mut stall = Stall::new();
        // Nothing put back: not stuck, however long.
        assert_eq!(stall.check(&stats(0, 0), Duration::ZERO), None);
        // Put back with no progress: stuck once the patience is over.
        assert!(stall.check(&stats(0, 3), Duration::ZERO).is_some());
        assert_eq!(stall.check(&stats(0, 3), Duration::from_secs(60)), None);
        // Progress resets the wait, and only new put-backs count after it.
        assert_eq!(stall.check(&stats(1, 3), Duration::ZERO), None);
        assert_eq!(stall.check(&stats(1, 3), Duration::ZERO), None);
        assert!(stall.check(&stats(1, 4), Duration::ZERO).is_some());
    }
}
