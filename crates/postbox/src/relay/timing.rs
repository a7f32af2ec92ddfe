//! The lease timing: how often a batch's leases are renewed, how long its outcomes wait to be
//! written together, how long a write of them is retried — each a function of the lease, here
//! and nowhere else, with the rule they keep together.
//!
//! # The invariant
//!
//! While an event publishes, [`lease`](super::lease) renews its lease every
//! [`renew_interval`]. Once its outcome is known, its renewals stop and the outcome is written:
//! after waiting at most [`FLUSH_WINDOW`] for the other outcomes of its claim, in one flush whose
//! writes are retried together until [`write_patience`] past that window (the pipeline's
//! `with_patience`; a write that starts later — its claim's previous write still under way —
//! gets what is left, one attempt at least). So a lease goes unrenewed before its event's
//! result is written for at most
//!
//! ```text
//! renew_interval + FLUSH_WINDOW + write_patience = lease / 3 + 50 ms + lease / 2
//! ```
//!
//! plus database round trips: the last renewal's and the last write attempt's, and the claims a
//! relay makes between two steps of its pipeline. That sum ([`unrenewed`]) must stay below the
//! lease by at least [`MIN_MARGIN`] for those round trips. While it does, a live relay whose
//! database answers within the patience never loses a lease of an event it published: no other
//! relay takes the event over and publishes it again, so duplicates come only from the faults G3
//! counts (a crash, a pause past the lease, an outage longer than the patience), and G4's fencing
//! turns away the late writes of those faults only. If the sum reached the lease, a healthy
//! relay's results would be fenced off and their events published twice.
//!
//! [`RelayConfig::validate`](super::RelayConfig::validate) refuses a lease below [`MIN_LEASE`],
//! the shortest that keeps the margin.

use std::time::Duration;

/// How long outcomes of an unfinished claim wait to be written together: a few of a claim's
/// outcomes cost one write instead of one each.
pub(super) const FLUSH_WINDOW: Duration = Duration::from_millis(50);

/// What a lease must keep beyond [`unrenewed`] for database round trips (the last renewal's,
/// the last write attempt's, claims between pipeline steps). As long as the flush window: a
/// handful of round trips to a database on the same network.
pub(super) const MIN_MARGIN: Duration = Duration::from_millis(50);

/// The shortest lease that keeps [`MIN_MARGIN`]: `lease / 6 - FLUSH_WINDOW >= MIN_MARGIN`, so
/// 600 ms. Leases this short are for tests; production leases are seconds (default 30 s), whose
/// margin is seconds too (a 30 s lease goes unrenewed for at most 25.05 s).
pub(super) const MIN_LEASE: Duration = Duration::from_millis(600);

/// How often the leases of a batch being published are renewed: every third of a lease, so that
/// one renewal lost to a passing database error still leaves the next in time.
pub(super) fn renew_interval(lease: Duration) -> Duration {
    lease / 3
}

/// How long the writes of one flush of outcomes are retried before the relay gives up on them
/// (their leases then run out, and their events are taken over and published again, G3): half a
/// lease, so that a short database outage after publishing does not turn published events into
/// stale claims.
pub(super) fn write_patience(lease: Duration) -> Duration {
    lease / 2
}

/// The longest a lease goes unrenewed before its event's result is written, round trips aside:
/// see the [invariant](self#the-invariant).
pub(super) fn unrenewed(lease: Duration) -> Duration {
    renew_interval(lease) + FLUSH_WINDOW + write_patience(lease)
}

/// What `lease` leaves beyond [`unrenewed`] for round trips (zero when nothing is left).
pub(super) fn margin(lease: Duration) -> Duration {
    lease.saturating_sub(unrenewed(lease))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RelayConfig;

    /// The sum of the intervals, spelled out term by term (not through [`unrenewed`], so that
    /// dropping a term from it fails here too), stays below the lease by the margin.
    #[test]
    fn a_lease_outlasts_its_unrenewed_stretch_by_the_margin() {
        let leases = [
            MIN_LEASE,
            Duration::from_secs(1),
            Duration::from_secs(3),
            RelayConfig::default().lease,
            Duration::from_secs(600),
        ];
        for lease in leases {
            let unrenewed = renew_interval(lease) + write_patience(lease) + FLUSH_WINDOW;
            assert!(
                unrenewed + MIN_MARGIN <= lease,
                "a {lease:?} lease goes unrenewed for up to {unrenewed:?}, leaving less than \
                 {MIN_MARGIN:?} for round trips"
            );
            assert_eq!(margin(lease), lease - unrenewed);
        }
    }

    #[test]
    fn the_minimum_lease_is_the_shortest_that_keeps_the_margin() {
        assert!(margin(MIN_LEASE) >= MIN_MARGIN);
        assert!(margin(MIN_LEASE - Duration::from_millis(1)) < MIN_MARGIN);
    }

    #[test]
    fn the_default_lease_leaves_seconds_for_round_trips() {
        let lease = RelayConfig::default().lease;
        assert_eq!(unrenewed(lease), Duration::from_millis(25_050));
        assert!(margin(lease) >= Duration::from_secs(4));
    }
}
