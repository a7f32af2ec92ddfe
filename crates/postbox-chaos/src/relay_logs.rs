//! What the relays said about the faults: their logs (in the run directory) tell how many stale
//! events were taken over and how many late results were fenced off, which shows the faults
//! reached the lease and fencing paths rather than idle relays.

use std::path::Path;

use serde::Serialize;

/// Totals over every relay log of a run.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct RelayLogs {
    /// Events claimed again after another relay's lease ran out ("recovered N stale events").
    pub(crate) stale_taken_over: u64,
    /// Results a relay could not record because another relay had taken the events over.
    pub(crate) fenced: u64,
    /// Lease renewals that found some leases taken over.
    pub(crate) leases_lost: u64,
    /// Error-level lines (an event going FAILED, a relay giving up).
    pub(crate) errors: u64,
    /// Relay starts ("relay started").
    pub(crate) starts: u64,
    /// Relay starts that named the floor as their claim path (`claim_path=floor`): the claim
    /// `postbox relay` runs on PostgreSQL, which the run is meant to exercise.
    pub(crate) starts_claiming_from_floor: u64,
    /// Times a CDC relay began reading its replication slot ("CDC relay reading the slot"):
    /// at its start, and again after the slot was lost or taken by another relay.
    pub(crate) slot_reads: u64,
}

impl RelayLogs {
    /// Reads every `relay-*.log` in `dir`; unreadable files count for nothing.
    pub(crate) fn read(dir: &Path) -> RelayLogs {
        let mut totals = RelayLogs::default();
        let Ok(entries) = std::fs::read_dir(dir) else {
            return totals;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if !(name.starts_with("relay-") && name.ends_with(".log")) {
                continue;
            }
            if let Ok(text) = std::fs::read_to_string(entry.path()) {
                for line in text.lines() {
                    totals.add(line);
                }
            }
        }
        totals
    }

    fn add(&mut self, line: &str) {
        if line.contains("stale events") {
            self.stale_taken_over += count(line);
        } else if line.contains("results not recorded") {
            self.fenced += count(line);
        } else if line.contains("leases were lost") {
            self.leases_lost += 1;
        }
        if line.contains("CDC relay reading the slot") {
            self.slot_reads += 1;
        }
        if line.contains(" ERROR ") {
            self.errors += 1;
        }
        if line.contains("relay started") {
            self.starts += 1;
            if line.contains("claim_path=floor") || line.contains("\"claim_path\":\"floor\"") {
                self.starts_claiming_from_floor += 1;
            }
        }
    }
}

/// The `count=N` field of a log line, 0 without one.
fn count(line: &str) -> u64 {
    line.split_whitespace()
        .find_map(|field| field.strip_prefix("count="))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_come_from_the_relays_lines() {
        let mut logs = RelayLogs::default();
        logs.add(
            "2026-04-24T10:00:00Z  INFO postbox::relay: recovered 7 stale events (a relay did \
             not finish within its lease) tenant=\"default\" relay=chaos-relay-0-1-42-abc count=7",
        );
        logs.add(
            "2026-04-24T10:00:01Z  WARN postbox::relay: results not recorded: another relay took \
             these events over tenant=\"default\" relay=x count=3",
        );
        logs.add("2026-04-24T10:00:02Z ERROR postbox::relay: event FAILED and will not be retried");
        assert_eq!(logs.stale_taken_over, 7);
        assert_eq!(logs.fenced, 3);
        assert_eq!(logs.errors, 1);
    }
}
