//! The checker: what committed (the ledger), what the table says, what the broker received, and
//! whether the guarantees held. Prints the table, or JSON.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use crate::faults::{Injected, duplicate_bound};
use crate::fleet::UnplannedExit;
use crate::producers::Tally;
use crate::relay_logs::RelayLogs;
use crate::schedule::FaultKind;
use crate::stream::Deliveries;

/// A committed event, as the ledger recorded it.
#[derive(Clone, Debug)]
pub(crate) struct LedgerRow {
    pub(crate) marker: String,
    pub(crate) event_id: i64,
    pub(crate) path: String,
}

/// An outbox row at the end of the run.
#[derive(Clone, Debug)]
pub(crate) struct OutboxRow {
    pub(crate) id: i64,
    pub(crate) status: String,
    pub(crate) retry_count: i32,
    pub(crate) last_error: Option<String>,
    pub(crate) aggregate_id: Option<String>,
}

/// The settings the report repeats, and the bound depends on.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Settings {
    pub(crate) seed: u64,
    pub(crate) minutes: f64,
    pub(crate) events: u64,
    pub(crate) relays: u32,
    pub(crate) producers: u32,
    pub(crate) batch_size: u32,
    /// Aggregates the events share, published in order per aggregate (0: no ordering).
    pub(crate) ordered_aggregates: u32,
    /// Tenant schemas sharing the events with the default schema (0: none).
    pub(crate) tenants: u32,
    /// How the relays found events.
    pub(crate) source: crate::cli::Source,
    #[serde(rename = "lease_ms", serialize_with = "millis")]
    pub(crate) lease: Duration,
    #[serde(rename = "publish_timeout_ms", serialize_with = "millis")]
    pub(crate) publish_timeout: Duration,
    pub(crate) schedule_fingerprint: String,
    pub(crate) faults_scheduled: usize,
}

fn millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_millis() as u64)
}

/// Everything the run gathered.
pub(crate) struct Evidence {
    pub(crate) ledger: Vec<LedgerRow>,
    pub(crate) rows: Vec<OutboxRow>,
    pub(crate) deliveries: Deliveries,
    pub(crate) tally: Tally,
    pub(crate) injected: Vec<Injected>,
    pub(crate) unplanned_exits: Vec<UnplannedExit>,
    pub(crate) relays_started: u32,
    pub(crate) relay_logs: RelayLogs,
    /// How long the outbox took to drain after the faults and producers stopped, if it did.
    pub(crate) drained_in: Option<Duration>,
    pub(crate) elapsed: Duration,
}

/// One line of the verdict.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Check {
    pub(crate) name: &'static str,
    pub(crate) value: u64,
    pub(crate) bound: u64,
    pub(crate) ok: bool,
}

/// The result of a run.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Report {
    pub(crate) passed: bool,
    pub(crate) settings: Settings,
    pub(crate) elapsed_s: f64,
    pub(crate) drained_in_s: Option<f64>,
    pub(crate) committed: u64,
    pub(crate) committed_library: u64,
    pub(crate) committed_sql: u64,
    pub(crate) not_committed: u64,
    pub(crate) rolled_back_on_purpose: u64,
    pub(crate) commits_in_doubt: u64,
    pub(crate) commits_in_doubt_committed: u64,
    pub(crate) producer_errors: u64,
    pub(crate) published_distinct: u64,
    pub(crate) stream_entries: u64,
    pub(crate) duplicates: u64,
    pub(crate) duplicate_bound: u64,
    pub(crate) max_deliveries_of_one_event: u32,
    pub(crate) events_retried: u64,
    pub(crate) max_retry_count: i32,
    pub(crate) relays_started: u32,
    pub(crate) relay_logs: RelayLogs,
    /// Events held by the relays that kills and pauses hit, as seen just before each strike.
    pub(crate) in_flight_at_strikes: i64,
    pub(crate) strikes_mid_batch: u64,
    pub(crate) faults: BTreeMap<FaultKind, u64>,
    pub(crate) faults_without_target: u64,
    pub(crate) checks: Vec<Check>,
    /// A few ids of each kind of failure, to start looking from.
    pub(crate) lost_sample: Vec<i64>,
    pub(crate) ghost_sample: Vec<i64>,
    pub(crate) failed_sample: Vec<(i64, String)>,
    pub(crate) unfinished_sample: Vec<(i64, String)>,
    /// Events first delivered before an earlier event of their aggregate: (later, earlier).
    pub(crate) out_of_order_sample: Vec<(i64, i64)>,
    pub(crate) unplanned_exits: Vec<UnplannedExit>,
    pub(crate) producer_error_sample: Vec<String>,
    pub(crate) malformed_sample: Vec<String>,
    pub(crate) injected: Vec<Injected>,
}

impl Report {
    /// Checks the evidence against the guarantees.
    pub(crate) fn new(settings: Settings, evidence: Evidence) -> Report {
        let Evidence {
            ledger,
            rows,
            deliveries,
            tally,
            injected,
            unplanned_exits,
            relays_started,
            relay_logs,
            drained_in,
            elapsed,
        } = evidence;
        let by_id: HashMap<i64, &LedgerRow> = ledger.iter().map(|l| (l.event_id, l)).collect();
        let committed_markers: HashSet<&str> = ledger.iter().map(|l| l.marker.as_str()).collect();
        let rows_by_id: HashMap<i64, &OutboxRow> = rows.iter().map(|r| (r.id, r)).collect();

        // What committed, by the ledger, and whether the table agrees.
        let committed_library = ledger.iter().filter(|l| l.path == "library").count() as u64;
        let committed = ledger.len() as u64;
        let rows_without_ledger = rows.iter().filter(|r| !by_id.contains_key(&r.id)).count();
        let ledger_without_row = ledger
            .iter()
            .filter(|l| !rows_by_id.contains_key(&l.event_id))
            .count();
        // A transaction the producer saw fail before its commit, or roll back, cannot be in the
        // ledger.
        let rolled_back_yet_committed = tally
            .not_committed
            .iter()
            .filter(|m| committed_markers.contains(m.as_str()))
            .count();
        let in_doubt_committed = tally
            .in_doubt
            .iter()
            .filter(|m| committed_markers.contains(m.as_str()))
            .count() as u64;

        // What was published.
        let mut lost = Vec::new();
        let mut failed = Vec::new();
        let mut unfinished = Vec::new();
        let mut published = 0u64;
        for l in &ledger {
            let row = rows_by_id.get(&l.event_id);
            let status = row.map_or("(no row)", |r| r.status.as_str());
            if status == "FAILED" {
                let error = row.and_then(|r| r.last_error.clone()).unwrap_or_default();
                failed.push((l.event_id, error));
            }
            if matches!(status, "PENDING" | "PROCESSING") {
                unfinished.push((l.event_id, status.to_owned()));
            }
            if deliveries.by_event.contains_key(&l.event_id) {
                published += 1;
            } else if status != "FAILED" {
                lost.push(l.event_id);
            }
        }
        let mut ghosts = Vec::new();
        let mut mismatched = 0u64;
        let mut duplicates = 0u64;
        let mut max_deliveries = 0;
        for (id, d) in &deliveries.by_event {
            duplicates += u64::from(d.count.saturating_sub(1));
            max_deliveries = max_deliveries.max(d.count);
            match by_id.get(id) {
                None => ghosts.push(*id),
                Some(l) if d.marker.as_deref() != Some(l.marker.as_str()) => mismatched += 1,
                Some(_) => {}
            }
        }
        ghosts.sort_unstable();
        lost.sort_unstable();
        failed.sort_unstable();
        unfinished.sort_unstable();
        let events_retried = rows.iter().filter(|r| r.retry_count > 0).count() as u64;
        let max_retry_count = rows.iter().map(|r| r.retry_count).max().unwrap_or(0);

        let relays = settings.relays;
        let bound: u64 = injected
            .iter()
            .map(|i| duplicate_bound(i, settings.batch_size, relays, settings.publish_timeout))
            .sum();
        let mut faults = BTreeMap::new();
        for i in injected.iter().filter(|i| i.applied) {
            *faults.entry(i.fault.kind).or_insert(0) += 1;
        }
        let faults_without_target = injected.iter().filter(|i| !i.applied).count() as u64;
        let out_of_order = out_of_order(&rows, &deliveries);

        let zero = |name, value: u64| Check {
            name,
            value,
            bound: 0,
            ok: value == 0,
        };
        let mut checks = vec![
            zero("lost (committed, never published)", lost.len() as u64),
            zero("ghosts (published, never committed)", ghosts.len() as u64),
            Check {
                name: "duplicates (extra deliveries)",
                value: duplicates,
                bound,
                ok: duplicates <= bound,
            },
            zero("FAILED events", failed.len() as u64),
            zero("left PENDING or PROCESSING", unfinished.len() as u64),
            zero(
                "payloads not matching the ledger",
                mismatched + deliveries.inconsistent,
            ),
            zero("unreadable stream entries", deliveries.malformed),
            zero(
                "table and ledger disagree",
                (rows_without_ledger + ledger_without_row) as u64,
            ),
            zero(
                "rolled back, yet committed",
                rolled_back_yet_committed as u64,
            ),
            zero(
                "relays that died on their own",
                unplanned_exits.iter().filter(|e| !e.during_start).count() as u64,
            ),
        ];
        // The relays run the claim that ships: every start named the floor, and there were some.
        checks.push(zero(
            "relay starts not claiming from the floor",
            (relay_logs.starts - relay_logs.starts_claiming_from_floor)
                + u64::from(relay_logs.starts == 0),
        ));
        // A CDC run read its slot (else it was a polling run under another name), and read it
        // again after every drop of it that hit.
        if settings.source == crate::cli::Source::Cdc {
            let drops = injected
                .iter()
                .filter(|i| i.applied && i.fault.kind == FaultKind::SlotDrop)
                .count() as u64;
            checks.push(zero(
                "slot drops not followed by a new read of the slot",
                (drops + 1).saturating_sub(relay_logs.slot_reads),
            ));
        }
        if settings.ordered_aggregates > 0 {
            checks.push(zero(
                "out of order within an aggregate",
                out_of_order.len() as u64,
            ));
        }
        let passed = checks.iter().all(|c| c.ok) && drained_in.is_some();
        Report {
            passed,
            elapsed_s: elapsed.as_secs_f64(),
            drained_in_s: drained_in.map(|d| d.as_secs_f64()),
            committed,
            committed_library,
            committed_sql: committed - committed_library,
            not_committed: tally.not_committed.len() as u64,
            rolled_back_on_purpose: tally.rolled_back_on_purpose,
            commits_in_doubt: tally.in_doubt.len() as u64,
            commits_in_doubt_committed: in_doubt_committed,
            producer_errors: tally.errors,
            published_distinct: published,
            stream_entries: deliveries.entries,
            duplicates,
            duplicate_bound: bound,
            max_deliveries_of_one_event: max_deliveries,
            events_retried,
            max_retry_count,
            relays_started,
            relay_logs,
            in_flight_at_strikes: injected.iter().filter_map(|i| i.in_flight).sum(),
            strikes_mid_batch: injected.iter().filter(|i| i.in_flight.is_some()).count() as u64,
            faults,
            faults_without_target,
            checks,
            lost_sample: lost.into_iter().take(10).collect(),
            ghost_sample: ghosts.into_iter().take(10).collect(),
            failed_sample: failed.into_iter().take(10).collect(),
            unfinished_sample: unfinished.into_iter().take(10).collect(),
            out_of_order_sample: out_of_order.into_iter().take(10).collect(),
            unplanned_exits,
            producer_error_sample: tally.first_errors,
            malformed_sample: deliveries.malformed_sample,
            injected,
            settings,
        }
    }

    /// The report as a table for people.
    pub(crate) fn table(&self) -> String {
        let s = &self.settings;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "postbox-chaos seed {}: {} relays, {} events, {} min of faults, lease {}, publish \
             timeout {}, batch {}{}{}, schedule {} ({} faults)",
            s.seed,
            s.relays,
            s.events,
            s.minutes,
            humantime::format_duration(s.lease),
            humantime::format_duration(s.publish_timeout),
            s.batch_size,
            if s.ordered_aggregates > 0 {
                format!(", ordered over {} aggregates", s.ordered_aggregates)
            } else {
                String::new()
            },
            if s.tenants > 0 {
                format!(", the default schema and {} tenants", s.tenants)
            } else {
                String::new()
            },
            s.schedule_fingerprint,
            s.faults_scheduled,
        );
        let _ = writeln!(out);
        let _ = writeln!(out, "{:<42} {:>10} {:>10}  result", "", "count", "bound");
        let line = |out: &mut String, name: &str, value: String| {
            let _ = writeln!(out, "{name:<42} {value:>10}");
        };
        line(&mut out, "committed events", self.committed.to_string());
        line(
            &mut out,
            "  through Outbox::enqueue",
            self.committed_library.to_string(),
        );
        line(
            &mut out,
            "  through plain SQL",
            self.committed_sql.to_string(),
        );
        line(
            &mut out,
            "not committed (rolled back or failed)",
            self.not_committed.to_string(),
        );
        line(
            &mut out,
            "  rolled back on purpose",
            self.rolled_back_on_purpose.to_string(),
        );
        line(
            &mut out,
            "commits in doubt (of which committed)",
            format!(
                "{} ({})",
                self.commits_in_doubt, self.commits_in_doubt_committed
            ),
        );
        line(
            &mut out,
            "published (distinct events)",
            self.published_distinct.to_string(),
        );
        line(&mut out, "stream entries", self.stream_entries.to_string());
        for c in &self.checks {
            let _ = writeln!(
                out,
                "{:<42} {:>10} {:>10}  {}",
                c.name,
                c.value,
                c.bound,
                if c.ok { "ok" } else { "FAIL" }
            );
        }
        line(
            &mut out,
            "events retried (highest retry_count)",
            format!("{} ({})", self.events_retried, self.max_retry_count),
        );
        line(
            &mut out,
            "most deliveries of one event",
            self.max_deliveries_of_one_event.to_string(),
        );
        line(
            &mut out,
            "relay processes started",
            self.relays_started.to_string(),
        );
        line(
            &mut out,
            "relays that could not start (restarted)",
            self.unplanned_exits
                .iter()
                .filter(|e| e.during_start)
                .count()
                .to_string(),
        );
        let strikes = FaultKind::ALL
            .iter()
            .filter(|k| matches!(k, FaultKind::Kill | FaultKind::Pause))
            .map(|k| self.faults.get(k).copied().unwrap_or(0))
            .sum::<u64>();
        line(
            &mut out,
            "kills/pauses that caught a batch (events)",
            format!(
                "{}/{strikes} ({})",
                self.strikes_mid_batch, self.in_flight_at_strikes
            ),
        );
        line(
            &mut out,
            "stale events taken over (relay logs)",
            self.relay_logs.stale_taken_over.to_string(),
        );
        line(
            &mut out,
            "late results fenced off (relay logs)",
            self.relay_logs.fenced.to_string(),
        );
        line(
            &mut out,
            "producer transactions failed",
            self.producer_errors.to_string(),
        );
        let faults: Vec<String> = FaultKind::ALL
            .iter()
            .map(|k| format!("{} {}", k.name(), self.faults.get(k).copied().unwrap_or(0)))
            .collect();
        let _ = writeln!(
            out,
            "faults injected: {}{}",
            faults.join(", "),
            if self.faults_without_target > 0 {
                format!(" ({} found no relay to hit)", self.faults_without_target)
            } else {
                String::new()
            }
        );
        match self.drained_in_s {
            Some(d) => {
                let _ = writeln!(
                    out,
                    "drained {d:.1}s after the faults and producers stopped; run took {:.0}s",
                    self.elapsed_s
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "NOT DRAINED: events were still PENDING or PROCESSING at the drain timeout"
                );
            }
        }
        self.details(&mut out);
        let _ = writeln!(out, "result: {}", if self.passed { "PASS" } else { "FAIL" });
        out
    }

    fn details(&self, out: &mut String) {
        if !self.lost_sample.is_empty() {
            let _ = writeln!(out, "lost event ids (first 10): {:?}", self.lost_sample);
        }
        if !self.ghost_sample.is_empty() {
            let _ = writeln!(out, "ghost event ids (first 10): {:?}", self.ghost_sample);
        }
        for (id, error) in &self.failed_sample {
            let _ = writeln!(out, "FAILED event {id}: {error}");
        }
        for (id, status) in &self.unfinished_sample {
            let _ = writeln!(out, "unfinished event {id}: {status}");
        }
        for exit in &self.unplanned_exits {
            let _ = writeln!(
                out,
                "relay {} (instance {}) {}: {} — log {}\n{}",
                exit.slot,
                exit.instance,
                if exit.during_start {
                    "could not start"
                } else {
                    "ended on its own"
                },
                exit.status,
                exit.log.display(),
                indent(&exit.tail)
            );
        }
        if !self.out_of_order_sample.is_empty() {
            let _ = writeln!(
                out,
                "delivered before an earlier event of its aggregate (event, earlier id; first 10): {:?}",
                self.out_of_order_sample
            );
        }
        if !self.malformed_sample.is_empty() {
            let _ = writeln!(
                out,
                "unreadable stream entries (first 5): {:?}",
                self.malformed_sample
            );
        }
        if !self.passed && !self.producer_error_sample.is_empty() {
            let _ = writeln!(out, "first producer errors:");
            for e in &self.producer_error_sample {
                let _ = writeln!(out, "  {e}");
            }
        }
    }
}

/// The deliveries that broke an aggregate's order (G6): per aggregate, its events in the order
/// of their first delivery, and each one whose id is below that of an event delivered before it,
/// as (the event delivered first, the earlier id delivered after it). Repeats of an event
/// already delivered do not count: at-least-once allows them.
fn out_of_order(rows: &[OutboxRow], deliveries: &Deliveries) -> Vec<(i64, i64)> {
    let mut by_aggregate: HashMap<&str, Vec<(u64, i64)>> = HashMap::new();
    for row in rows {
        if let (Some(aggregate), Some(d)) = (&row.aggregate_id, deliveries.by_event.get(&row.id)) {
            by_aggregate
                .entry(aggregate.as_str())
                .or_default()
                .push((d.first, row.id));
        }
    }
    let mut broken = Vec::new();
    for events in by_aggregate.values_mut() {
        events.sort_unstable();
        let mut highest: Option<i64> = None;
        for &(_, id) in events.iter() {
            match highest {
                Some(h) if id < h => broken.push((h, id)),
                _ => highest = Some(id),
            }
        }
    }
    broken.sort_unstable();
    broken
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::Fault;
    use crate::stream::Delivered;

    fn settings() -> Settings {
        Settings {
            seed: 1,
            minutes: 1.0,
            events: 4,
            relays: 2,
            producers: 1,
            batch_size: 10,
            ordered_aggregates: 0,
            tenants: 0,
            source: crate::cli::Source::Poll,
            lease: Duration::from_secs(3),
            publish_timeout: Duration::from_secs(2),
            schedule_fingerprint: String::new(),
            faults_scheduled: 1,
        }
    }

    fn ledger(id: i64) -> LedgerRow {
        LedgerRow {
            marker: format!("m{id}"),
            event_id: id,
            path: if id % 2 == 0 { "library" } else { "sql" }.to_owned(),
        }
    }

    fn row(id: i64, status: &str) -> OutboxRow {
        OutboxRow {
            id,
            status: status.to_owned(),
            retry_count: 0,
            last_error: (status == "FAILED").then(|| "broker away".to_owned()),
            aggregate_id: Some(format!("acct-{}", id % 2)),
        }
    }

    fn delivered(deliveries: &mut Deliveries, id: i64, marker: &str, count: u32) {
        deliveries.by_event.insert(
            id,
            Delivered {
                count,
                first: deliveries.entries,
                marker: Some(marker.to_owned()),
            },
        );
        deliveries.entries += u64::from(count);
    }

    fn evidence(deliveries: Deliveries, rows: Vec<OutboxRow>) -> Evidence {
        Evidence {
            ledger: (1..=4).map(ledger).collect(),
            rows,
            deliveries,
            tally: Tally {
                not_committed: vec!["m99".to_owned()],
                ..Tally::default()
            },
            injected: vec![Injected {
                fault: Fault {
                    at: Duration::ZERO,
                    kind: FaultKind::Kill,
                    relay: 0,
                    hold: Duration::ZERO,
                    immediate: false,
                },
                started_ms: 0,
                ended_ms: 0,
                applied: true,
                relays_running: 2,
                in_flight: Some(3),
            }],
            unplanned_exits: Vec::new(),
            relays_started: 3,
            relay_logs: RelayLogs {
                starts: 2,
                starts_claiming_from_floor: 2,
                ..RelayLogs::default()
            },
            drained_in: Some(Duration::from_secs(1)),
            elapsed: Duration::from_secs(60),
        }
    }

    fn check<'a>(report: &'a Report, name: &str) -> &'a Check {
        report
            .checks
            .iter()
            .find(|c| c.name.starts_with(name))
            .unwrap_or_else(|| panic!("no check {name}"))
    }

    #[test]
    fn every_event_published_once_or_within_the_bound_passes() {
        let mut d = Deliveries::default();
        for id in 1..=4 {
            delivered(&mut d, id, &format!("m{id}"), if id == 1 { 3 } else { 1 });
        }
        let rows = (1..=4).map(|id| row(id, "PROCESSED")).collect();
        let report = Report::new(settings(), evidence(d, rows));
        assert!(report.passed, "{}", report.table());
        assert_eq!(report.duplicates, 2);
        assert_eq!(report.duplicate_bound, 10, "one kill: one batch");
        assert_eq!(report.committed_library, 2);
        assert!(report.table().contains("result: PASS"));
    }

    #[test]
    fn a_relay_that_does_not_claim_from_the_floor_fails_the_run() {
        let rows: Vec<OutboxRow> = (1..=4).map(|id| row(id, "PROCESSED")).collect();
        let mut d = Deliveries::default();
        for id in 1..=4 {
            delivered(&mut d, id, &format!("m{id}"), 1);
        }
        let mut e = evidence(d, rows);
        e.relay_logs.starts_claiming_from_floor = 1;
        let report = Report::new(settings(), e);
        assert!(!report.passed);
        assert_eq!(check(&report, "relay starts not claiming").value, 1);
    }

    #[test]
    fn lost_ghost_failed_mismatched_and_excess_duplicates_each_fail() {
        let mut d = Deliveries::default();
        delivered(&mut d, 1, "m1", 12); // 11 extra deliveries, over the bound of 10
        delivered(&mut d, 2, "m3", 1); // event 2 carrying another event's payload
        delivered(&mut d, 7, "m99", 1); // a rolled-back event published
        let rows = vec![
            row(1, "PROCESSED"),
            row(2, "PROCESSED"),
            row(3, "FAILED"),
            row(4, "PROCESSED"), // marked, never received: lost
        ];
        let report = Report::new(settings(), evidence(d, rows));
        assert!(!report.passed);
        assert_eq!(check(&report, "lost").value, 1);
        assert_eq!(report.lost_sample, vec![4]);
        assert_eq!(check(&report, "ghosts").value, 1);
        assert_eq!(report.ghost_sample, vec![7]);
        assert_eq!(check(&report, "FAILED").value, 1);
        assert_eq!(check(&report, "payloads").value, 1);
        assert!(!check(&report, "duplicates").ok);
        assert!(check(&report, "table and ledger").ok);
        assert!(report.table().contains("FAILED event 3: broker away"));
    }

    #[test]
    fn an_aggregate_delivered_out_of_id_order_fails_an_ordered_run() {
        // acct-0 holds 2 and 4, acct-1 holds 1 and 3; 3 goes out before 1, and 2 is repeated
        // after 4 (a repeat, which at-least-once allows).
        let mut d = Deliveries::default();
        for (id, count) in [(2, 1), (3, 1), (1, 1), (4, 1)] {
            delivered(&mut d, id, &format!("m{id}"), count);
        }
        if let Some(repeated) = d.by_event.get_mut(&2) {
            repeated.count = 2;
        }
        d.entries += 1;
        let rows: Vec<OutboxRow> = (1..=4).map(|id| row(id, "PROCESSED")).collect();
        let mut ordered = settings();
        ordered.ordered_aggregates = 2;
        ordered.batch_size = 100;
        let report = Report::new(ordered, evidence(d.clone(), rows.clone()));
        assert_eq!(check(&report, "out of order within an aggregate").value, 1);
        assert_eq!(report.out_of_order_sample, [(3, 1)]);
        assert!(!report.passed);
        assert!(report.table().contains("ordered over 2 aggregates"));
        // Without ordering, the same deliveries are no fault.
        let mut loose = settings();
        loose.batch_size = 100;
        let report = Report::new(loose, evidence(d, rows));
        assert!(report.passed, "{}", report.table());
    }

    #[test]
    fn an_undrained_outbox_fails_the_run() {
        let mut d = Deliveries::default();
        for id in 1..=3 {
            delivered(&mut d, id, &format!("m{id}"), 1);
        }
        let mut rows: Vec<OutboxRow> = (1..=3).map(|id| row(id, "PROCESSED")).collect();
        rows.push(row(4, "PENDING"));
        let mut e = evidence(d, rows);
        e.drained_in = None;
        let report = Report::new(settings(), e);
        assert!(!report.passed);
        assert_eq!(check(&report, "left PENDING").value, 1);
        assert_eq!(check(&report, "lost").value, 1);
        assert!(report.table().contains("NOT DRAINED"));
    }
}
