//! What a relay did: totals of a run, and live counters an embedding service can read while it
//! runs.

use std::sync::atomic::{AtomicU64, Ordering};

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
}

impl RelayStats {
    pub(super) fn add(&mut self, other: RelayStats) {
        self.published += other.published;
        self.failed_tries += other.failed_tries;
        self.gave_up += other.gave_up;
        self.recovered += other.recovered;
        self.fenced += other.fenced;
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
}

impl LiveStats {
    pub(super) fn add(&self, s: RelayStats) {
        self.published.fetch_add(s.published, Ordering::Relaxed);
        self.failed_tries
            .fetch_add(s.failed_tries, Ordering::Relaxed);
        self.gave_up.fetch_add(s.gave_up, Ordering::Relaxed);
        self.recovered.fetch_add(s.recovered, Ordering::Relaxed);
        self.fenced.fetch_add(s.fenced, Ordering::Relaxed);
    }

    pub(super) fn snapshot(&self) -> RelayStats {
        RelayStats {
            published: self.published.load(Ordering::Relaxed),
            failed_tries: self.failed_tries.load(Ordering::Relaxed),
            gave_up: self.gave_up.load(Ordering::Relaxed),
            recovered: self.recovered.load(Ordering::Relaxed),
            fenced: self.fenced.load(Ordering::Relaxed),
        }
    }
}
