//! The benchmark's results: a table for people, JSON for machines.

use std::fmt::Write as _;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Events (or transactions) per second over a measured span.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Throughput {
    /// How many were done.
    pub count: u64,
    /// In how long, in seconds.
    pub seconds: f64,
    /// `count / seconds`.
    pub per_second: f64,
}

impl Throughput {
    pub(crate) fn new(count: u64, elapsed: Duration) -> Self {
        let seconds = elapsed.as_secs_f64().max(1e-9);
        Throughput {
            count,
            seconds,
            per_second: count as f64 / seconds,
        }
    }
}

/// Commit-to-publish latency percentiles, in milliseconds.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Percentiles {
    /// Target rate of the producers, events/s.
    pub rate: u64,
    /// How long the producers ran, seconds.
    pub seconds: f64,
    /// Events measured.
    pub samples: u64,
    /// Median.
    pub p50_ms: f64,
    /// 95th percentile.
    pub p95_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Slowest.
    pub max_ms: f64,
}

impl Percentiles {
    pub(crate) fn from_hist(h: &Histogram<u64>, rate: u64, duration: Duration) -> Self {
        let ms = |us: u64| us as f64 / 1000.0;
        Percentiles {
            rate,
            seconds: duration.as_secs_f64(),
            samples: h.len(),
            p50_ms: ms(h.value_at_quantile(0.50)),
            p95_ms: ms(h.value_at_quantile(0.95)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            max_ms: ms(h.max()),
        }
    }
}

/// Enqueue overhead at one level of concurrency.
#[derive(Clone, Debug, Serialize)]
pub struct EnqueueOverhead {
    /// Concurrent producers.
    pub producers: usize,
    /// Business rows each business transaction inserts, one statement each.
    pub business_statements: u32,
    /// Business transactions with their business rows and no event.
    pub without_event: Throughput,
    /// The same transactions with a second business row (of the event's payload) instead of an
    /// event: the floor, what any second statement costs.
    pub second_row: Throughput,
    /// How much longer a transaction takes with the second row: `without / second_row - 1`, in
    /// percent.
    pub second_row_pct: f64,
    /// The same transactions with one `enqueue` each, through the default `Outbox` (at most one
    /// `NOTIFY` per `notify_interval`).
    pub with_event: Throughput,
    /// How much longer a transaction takes with the event: `without / with_event - 1`, in percent.
    pub overhead_pct: f64,
    /// What the enqueue costs beyond any second statement: `second_row / with_event - 1`, in
    /// percent.
    pub event_over_second_row_pct: f64,
    /// The same transactions with the event written by the last business statement itself,
    /// through `Outbox::enqueue_with` (PostgreSQL): no statement of its own.
    pub with_event_in_statement: Option<Throughput>,
    /// How much longer a transaction takes with the event in its statement:
    /// `without / in_statement - 1`, in percent.
    pub in_statement_pct: Option<f64>,
    /// What the event in the statement costs beyond any second statement:
    /// `second_row / in_statement - 1`, in percent (negative: less than a second row).
    pub in_statement_over_second_row_pct: Option<f64>,
    /// The same transactions with an enqueue that sends `NOTIFY` on every commit (PostgreSQL).
    pub with_event_notify_each: Option<Throughput>,
    /// Overhead of the enqueue with `NOTIFY` on every commit: `without / notify_each - 1`, in
    /// percent.
    pub notify_each_pct: Option<f64>,
}

/// The business transaction rates of one enqueue measurement, one per variant.
pub(crate) struct Variants {
    pub(crate) without_event: Throughput,
    pub(crate) second_row: Throughput,
    pub(crate) with_event: Throughput,
    pub(crate) in_statement: Option<Throughput>,
    pub(crate) notify_each: Option<Throughput>,
}

impl EnqueueOverhead {
    /// Puts the measurements of one producer count together and works out the percentages.
    pub(crate) fn new(producers: usize, business_statements: u32, v: Variants) -> Self {
        let without = v.without_event;
        let slower =
            |base: Throughput, x: Throughput| (base.per_second / x.per_second - 1.0) * 100.0;
        EnqueueOverhead {
            producers,
            business_statements,
            second_row_pct: slower(without, v.second_row),
            overhead_pct: slower(without, v.with_event),
            event_over_second_row_pct: slower(v.second_row, v.with_event),
            in_statement_pct: v.in_statement.map(|t| slower(without, t)),
            in_statement_over_second_row_pct: v.in_statement.map(|t| slower(v.second_row, t)),
            notify_each_pct: v.notify_each.map(|t| slower(without, t)),
            without_event: without,
            second_row: v.second_row,
            with_event: v.with_event,
            with_event_in_statement: v.in_statement,
            with_event_notify_each: v.notify_each,
        }
    }
}

/// One commit-to-publish latency run: how producers notify and how the relay looks for events.
#[derive(Clone, Debug, Serialize)]
pub struct LatencyRun {
    /// The producers' `NOTIFY` and the relay's polling in this run, e.g. `NOTIFY each commit`.
    pub mode: String,
    /// What was measured.
    pub percentiles: Percentiles,
}

/// The relays' own claims during a run (the `postbox_claim_seconds` histogram), ms.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct ClaimTimes {
    /// Claims recorded.
    pub claims: u64,
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Slowest.
    pub max_ms: f64,
}

/// Drain and ceiling at one level of parallelism.
#[derive(Clone, Debug, Serialize)]
pub struct DrainRun {
    /// Relays (drain) and loop workers (ceiling).
    pub relays: usize,
    /// `postbox` relays draining to the null sink.
    pub relay: Throughput,
    /// The relays' claims during the drain; `None` when the process records metrics elsewhere.
    pub claims: Option<ClaimTimes>,
    /// The relay's own claim and mark statements in a minimal loop.
    pub ceiling: Throughput,
    /// `relay / ceiling`.
    pub ratio: f64,
}

/// A drain with per-aggregate ordering (G6) beside the same drain without.
#[derive(Clone, Debug, Serialize)]
pub struct OrderingRun {
    /// Aggregates the backlog is spread over (round robin, by id).
    pub aggregates: u64,
    /// Relays draining.
    pub relays: usize,
    /// Without ordering.
    pub unordered: Throughput,
    /// With `ordered_aggregate_types = ["Invoice"]`.
    pub ordered: Throughput,
    /// `ordered / unordered`.
    pub ratio: f64,
}

/// The soak: throughput per window of events over a long drain.
#[derive(Clone, Debug, Serialize)]
pub struct Soak {
    /// Events drained.
    pub events: u64,
    /// Events per window.
    pub window: u64,
    /// Dead rows that made the relays vacuum the outbox table (`RelayConfig::vacuum_threshold`);
    /// `None`: never.
    pub vacuum_threshold: Option<u64>,
    /// Events/s of each window, in order.
    pub windows_per_second: Vec<f64>,
    /// Last window over first.
    pub last_over_first: f64,
    /// Resident memory of the benchmark process (relays included) at each window, KiB.
    pub rss_kib: Vec<u64>,
    /// Peak resident memory, KiB.
    pub peak_rss_kib: u64,
}

/// One window of the history phase.
#[derive(Clone, Debug, Serialize)]
pub struct HistoryWindow {
    /// End of the window, seconds from the start.
    pub at_secs: f64,
    /// Events published per second in the window.
    pub published_per_second: f64,
    /// Commit-to-publish median of the window's events, ms.
    pub latency_p50_ms: f64,
    /// Commit-to-publish 99th percentile, ms.
    pub latency_p99_ms: f64,
    /// Median of 20 claims of 100 (rolled back) at the window's end, ms.
    pub claim_p50_ms: f64,
    /// 99th percentile of those claims, ms.
    pub claim_p99_ms: f64,
    /// `outbox_events`' heap and TOAST, MiB.
    pub table_mib: f64,
    /// Its indexes, MiB.
    pub indexes_mib: f64,
    /// `outbox_events_archive`, every partition with its indexes, MiB.
    pub archive_mib: f64,
    /// Live rows of `outbox_events` (the statistics' count).
    pub rows: u64,
    /// Dead row versions of `outbox_events`.
    pub dead_rows: u64,
    /// Resident memory of the benchmark process (relays included), MiB.
    pub rss_mib: f64,
}

/// The history phase: a long processed history under retention, steady producers, relays with
/// every maintenance task on.
#[derive(Clone, Debug, Serialize)]
pub struct HistoryRun {
    /// Processed events in the table at the start (written by plain SQL, then `VACUUM
    /// ANALYZE`).
    pub history_rows: u64,
    /// The relays' `retention` and `archive_retention`, seconds.
    pub retention_secs: f64,
    /// Producer rate, events/s.
    pub rate: u64,
    /// Relays.
    pub relays: usize,
    /// How long producers ran, seconds.
    pub seconds: f64,
    /// The windows, in order.
    pub windows: Vec<HistoryWindow>,
    /// Published events/s of the last window over the second's (the first archives the due
    /// half of the history).
    pub throughput_last_over_first: f64,
    /// Claim p99 of the last window over the second's.
    pub claim_p99_last_over_first: f64,
    /// Table and index size of the last window over the second's.
    pub table_last_over_first: f64,
    /// Events in the archive at the end.
    pub archived_at_end: u64,
    /// A fresh backlog drained on the empty table and on the table with its history, before the
    /// steady state; `None` when skipped.
    pub drain: Option<HistoryDrain>,
}

/// One relay draining the same plain-SQL backlog (statistics taken while it is pending) on an
/// empty table and on the table with the history phase's history, each time on a quiet database
/// and with a `REPEATABLE READ` snapshot held open throughout (what a `pg_dump`, a long report
/// or a replica with `hot_standby_feedback` does).
#[derive(Clone, Debug, Serialize)]
pub struct HistoryDrain {
    /// Events in each backlog.
    pub events: u64,
    /// On the empty table.
    pub empty: DrainCase,
    /// On the table with the history.
    pub history: DrainCase,
    /// `history / empty` events/s, quiet.
    pub ratio: f64,
}

/// One backlog drained quiet, with a snapshot held, and beside a producer transaction held.
#[derive(Clone, Debug, Serialize)]
pub struct DrainCase {
    /// On a quiet database.
    pub quiet: Throughput,
    /// The relay's claims there.
    pub quiet_claims: Option<ClaimTimes>,
    /// With a snapshot held open throughout.
    pub held: Throughput,
    /// The relay's claims there.
    pub held_claims: Option<ClaimTimes>,
    /// `held / quiet` events/s.
    pub held_over_quiet: f64,
    /// Beside a producer transaction held open throughout, which wrote an event before the
    /// backlog: the commit horizon stays below the whole backlog.
    pub producer_held: Throughput,
    /// The relay's claims there.
    pub producer_held_claims: Option<ClaimTimes>,
    /// `producer_held / quiet` events/s.
    pub producer_over_quiet: f64,
}

/// The CDC relay beside the polling relay, in the same run on the same server (PostgreSQL).
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CdcOutcome {
    /// Both measured.
    Measured(Box<CdcRun>),
    /// The server cannot feed a CDC relay (`wal_level`, a role without `REPLICATION`): why, and
    /// the fix.
    Unavailable {
        /// The CDC relay's error.
        reason: String,
    },
}

/// CDC against polling: both relays as a user starts them (defaults, one process), on the same
/// plain-SQL producers and backlogs.
#[derive(Clone, Debug, Serialize)]
pub struct CdcRun {
    /// The run's replication slot.
    pub slot: String,
    /// Producer rate of the latency runs, events/s.
    pub rate: u64,
    /// Commit-to-publish latency of the polling relay, plain-SQL producers (no `NOTIFY`).
    pub latency_poll: Percentiles,
    /// The same producers, CDC relay.
    pub latency_cdc: Percentiles,
    /// The same producers writing into a tenant's outbox, the same CDC relay (the slot serves
    /// every active tenant's outbox).
    pub latency_cdc_tenant: Percentiles,
    /// The same producers through a rolling deploy of the CDC relay.
    pub deploy: Deploy,
    /// Events in each drained backlog.
    pub events: u64,
    /// The relay's own claim + mark statements, 4 clients at once.
    pub ceiling: Throughput,
    /// One polling relay draining the backlog.
    pub poll: Throughput,
    /// One CDC relay draining the same backlog from its slot (timed from its start).
    pub cdc: Throughput,
    /// `cdc / poll` events/s.
    pub cdc_over_poll: f64,
    /// `cdc / ceiling` events/s.
    pub cdc_over_ceiling: f64,
    /// The polling drain with a snapshot held open throughout.
    pub poll_held: Throughput,
    /// The CDC drain with a snapshot held open throughout.
    pub cdc_held: Throughput,
    /// `cdc_held / cdc`.
    pub cdc_held_over_quiet: f64,
    /// `poll_held / poll`.
    pub poll_held_over_quiet: f64,
    /// The slot's retained WAL while other tables churn.
    pub wal: CdcWal,
}

/// A rolling deploy of the CDC relay under load: a new relay started beside the reading one
/// after a third of the run, the old one stopped after two thirds.
#[derive(Clone, Debug, Serialize)]
pub struct Deploy {
    /// Commit-to-publish latency across the whole run, the handover included.
    pub latency: Percentiles,
    /// Events committed.
    pub events: u64,
    /// Publishes of an event already published.
    pub repeats: u64,
    /// Events the old relay had read and not yet recorded when it was told to stop.
    pub in_flight: u64,
    /// From the old relay told to stop until it had let the slot go, ms.
    pub stop_ms: f64,
}

/// The WAL a CDC relay's slot keeps while other tables take writes and the outbox is idle.
#[derive(Clone, Debug, Serialize)]
pub struct CdcWal {
    /// Tables taking writes.
    pub tables: u32,
    /// How long the relay ran beside them, seconds.
    pub seconds: f64,
    /// WAL the server wrote meanwhile, MiB.
    pub written_mib: f64,
    /// The same per second.
    pub written_mib_per_second: f64,
    /// Retained WAL (current position − the slot's confirmed one), sampled each second: median.
    pub retained_p50_mib: f64,
    /// The most retained.
    pub retained_max_mib: f64,
    /// Retained when the relay was stopped.
    pub retained_end_mib: f64,
    /// WAL the server kept for the slot (current position − its `restart_lsn`), sampled each
    /// second: median.
    pub kept_p50_mib: f64,
    /// The most kept.
    pub kept_max_mib: f64,
    /// The most retained in a second window as long, with one producer transaction held open.
    pub held_retained_max_mib: f64,
    /// Kept in that window: median.
    pub held_kept_p50_mib: f64,
    /// Kept in that window: the most.
    pub held_kept_max_mib: f64,
    /// How long the relay then stayed stopped while the tables churned, seconds.
    pub stopped_seconds: f64,
    /// Retained at the end of the stop.
    pub retained_after_stop_mib: f64,
    /// From the restart until the slot was confirmed past the WAL position of the restart,
    /// seconds.
    pub catch_up_seconds: f64,
    /// Retained then.
    pub retained_after_catch_up_mib: f64,
}

/// Everything one `postbox bench` run measured.
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    /// `postgres` or `sqlite`.
    pub backend: &'static str,
    /// Batch size used by relays and the ceiling loop.
    pub batch_size: u32,
    /// Enqueue overhead, per producer count.
    pub enqueue: Vec<EnqueueOverhead>,
    /// Drain vs. ceiling, per relay count.
    pub drain: Vec<DrainRun>,
    /// Commit-to-publish latency, one run per way of finding new events (PostgreSQL only; empty
    /// on SQLite): debounced `NOTIFY` with busy polling, `NOTIFY` on every commit, polling only.
    pub latency: Vec<LatencyRun>,
    /// Drains with and without per-aggregate ordering, per aggregate count.
    pub ordering: Vec<OrderingRun>,
    /// The soak, when run.
    pub soak: Option<Soak>,
    /// The history phase, when run (PostgreSQL).
    pub history: Option<HistoryRun>,
    /// MySQL/MariaDB's part of the history phase, when run: one relay draining a plain-SQL
    /// backlog on a quiet database and beside a transaction held open (InnoDB's purge waits for
    /// it).
    pub held_drain: Option<HeldDrain>,
    /// CDC against polling, when run (PostgreSQL).
    pub cdc: Option<CdcOutcome>,
    /// The tenants phase, one run per tenant count (PostgreSQL).
    pub tenants: Vec<TenantsRun>,
}

/// The tenants phase for one count of tenants: plain-SQL producers committing into random
/// tenants, relays started with defaults.
#[derive(Clone, Debug, Serialize)]
pub struct TenantsRun {
    /// Tenant schemas (beside the default schema).
    pub tenants: usize,
    /// Seconds `tenant_add` took for all of them, four at once.
    pub add_seconds: f64,
    /// Seconds a relay's start-up sweep over every tenant took.
    pub settle_seconds: f64,
    /// A settled relay's CPU while nothing happens, in percent of one core.
    pub idle_cpu_pct: f64,
    /// The server connections one relay holds.
    pub connections: i64,
    /// Seconds each latency run produced before it measured (but the one from a relay's
    /// start).
    pub warmup_seconds: f64,
    /// Commit → publish, per load.
    pub latency: Vec<TenantLatency>,
}

/// One latency run of the tenants phase.
#[derive(Clone, Debug, Serialize)]
pub struct TenantLatency {
    /// The load and the relays.
    pub what: String,
    /// Relays serving.
    pub relays: usize,
    /// Commit → publish.
    pub percentiles: Percentiles,
    /// Each relay's CPU while the producers ran, in percent of one core.
    pub relay_cpu_pct: f64,
    /// Beside a backlog: the backlog's events published per second meanwhile.
    pub backlog_per_s: Option<f64>,
}

/// One relay draining the same plain-SQL backlog (`ANALYZE TABLE` while it is pending) on a
/// quiet database and with a `REPEATABLE READ` transaction held open throughout (MySQL/MariaDB).
#[derive(Clone, Debug, Serialize)]
pub struct HeldDrain {
    /// Events in each backlog.
    pub events: u64,
    /// Both drains.
    pub case: DrainCase,
}

impl BenchReport {
    /// The report as an aligned text table.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "postbox bench — {} (batch size {})",
            self.backend, self.batch_size
        );
        let _ = writeln!(out);
        let statements = self.enqueue.first().map_or(1, |e| e.business_statements);
        let _ = writeln!(
            out,
            "enqueue overhead (business transactions/s; {statements} business statement{} each)",
            if statements == 1 { "" } else { "s" }
        );
        let _ = writeln!(
            out,
            "  {:>9}  {:>10}  {:>10}  {:>7}  {:>10}  {:>7}  {:>10}  {:>10}  {:>7}  {:>10}  {:>11}  {:>7}",
            "producers",
            "without",
            "2nd row",
            "+%",
            "event",
            "+%",
            "vs 2nd row",
            "in stmt",
            "+%",
            "vs 2nd row",
            "NOTIFY each",
            "+%"
        );
        let rate = |t: Option<Throughput>| {
            t.map_or_else(|| "-".to_owned(), |t| format!("{:.0}", t.per_second))
        };
        let opt_pct = |p: Option<f64>| p.map_or_else(|| "-".to_owned(), pct);
        for e in &self.enqueue {
            let _ = writeln!(
                out,
                "  {:>9}  {:>10.0}  {:>10.0}  {:>7}  {:>10.0}  {:>7}  {:>10}  {:>10}  {:>7}  {:>10}  {:>11}  {:>7}",
                e.producers,
                e.without_event.per_second,
                e.second_row.per_second,
                pct(e.second_row_pct),
                e.with_event.per_second,
                pct(e.overhead_pct),
                pct(e.event_over_second_row_pct),
                rate(e.with_event_in_statement),
                opt_pct(e.in_statement_pct),
                opt_pct(e.in_statement_over_second_row_pct),
                rate(e.with_event_notify_each),
                opt_pct(e.notify_each_pct)
            );
        }
        let _ = writeln!(out);
        let _ = writeln!(out, "drain to the null sink (events/s)");
        let _ = writeln!(
            out,
            "  {:>9}  {:>12}  {:>12}  {:>9}  {:>17}",
            "relays", "relay", "ceiling", "ratio", "claim p50/p99 ms"
        );
        for d in &self.drain {
            let _ = writeln!(
                out,
                "  {:>9}  {:>12.0}  {:>12.0}  {:>8.2}x  {:>17}",
                d.relays,
                d.relay.per_second,
                d.ceiling.per_second,
                d.ratio,
                claim_cell(d.claims)
            );
        }
        if !self.latency.is_empty() {
            let _ = writeln!(out);
            let _ = writeln!(out, "commit-to-publish latency (ms)");
            let _ = writeln!(
                out,
                "  {:<30}  {:>7}  {:>8}  {:>8}  {:>8}  {:>8}",
                "mode", "rate/s", "p50", "p95", "p99", "max"
            );
            for run in &self.latency {
                let p = &run.percentiles;
                let _ = writeln!(
                    out,
                    "  {:<30}  {:>7}  {:>8.2}  {:>8.2}  {:>8.2}  {:>8.2}",
                    run.mode, p.rate, p.p50_ms, p.p95_ms, p.p99_ms, p.max_ms
                );
            }
        }
        if !self.ordering.is_empty() {
            let _ = writeln!(out);
            let _ = writeln!(
                out,
                "per-aggregate ordering: drain to the null sink (events/s)"
            );
            let _ = writeln!(
                out,
                "  {:>10}  {:>6}  {:>12}  {:>12}  {:>9}",
                "aggregates", "relays", "unordered", "ordered", "ratio"
            );
            for o in &self.ordering {
                let _ = writeln!(
                    out,
                    "  {:>10}  {:>6}  {:>12.0}  {:>12.0}  {:>8.2}x",
                    o.aggregates, o.relays, o.unordered.per_second, o.ordered.per_second, o.ratio
                );
            }
        }
        if let Some(s) = &self.soak {
            let _ = writeln!(out);
            let vacuum = match s.vacuum_threshold {
                Some(n) => format!("relay vacuum at {n} dead rows"),
                None => "relay vacuum off".to_owned(),
            };
            let _ = writeln!(
                out,
                "soak: {} events, windows of {}, {vacuum}",
                s.events, s.window
            );
            let windows: Vec<String> = s
                .windows_per_second
                .iter()
                .map(|w| format!("{w:.0}"))
                .collect();
            let _ = writeln!(out, "  events/s per window: {}", windows.join(" "));
            let _ = writeln!(
                out,
                "  last/first: {:.2}   peak RSS: {:.1} MiB",
                s.last_over_first,
                s.peak_rss_kib as f64 / 1024.0
            );
        }
        if let Some(h) = &self.held_drain {
            let _ = writeln!(out);
            let _ = writeln!(
                out,
                "history: drain of {} plain-SQL events, ANALYZE TABLE while pending, 1 relay (events/s, claim p50/p99 ms):",
                h.events,
            );
            let _ = writeln!(
                out,
                "  quiet {:>8.0} ({})  snapshot held {:>8.0} ({})  held/quiet {:.2}x",
                h.case.quiet.per_second,
                claim_cell(h.case.quiet_claims),
                h.case.held.per_second,
                claim_cell(h.case.held_claims),
                h.case.held_over_quiet,
            );
            let _ = writeln!(
                out,
                "  producer transaction held {:>8.0} ({})  /quiet {:.2}x",
                h.case.producer_held.per_second,
                claim_cell(h.case.producer_held_claims),
                h.case.producer_over_quiet,
            );
        }
        if let Some(h) = &self.history {
            let _ = writeln!(out);
            let _ = writeln!(
                out,
                "history: {} processed events at the start, retention {:.0}s, {} events/s for {:.0}s, {} relay(s)",
                h.history_rows, h.retention_secs, h.rate, h.seconds, h.relays
            );
            if let Some(d) = &h.drain {
                let _ = writeln!(
                    out,
                    "  drain of {} plain-SQL events, ANALYZE while pending, 1 relay (events/s, claim p50/p99 ms):",
                    d.events,
                );
                for (table, case) in [("empty table", &d.empty), ("with the history", &d.history)] {
                    let _ = writeln!(
                        out,
                        "    {table:<17} quiet {:>8.0} ({})  snapshot held {:>8.0} ({})  held/quiet {:.2}x",
                        case.quiet.per_second,
                        claim_cell(case.quiet_claims),
                        case.held.per_second,
                        claim_cell(case.held_claims),
                        case.held_over_quiet,
                    );
                    let _ = writeln!(
                        out,
                        "    {:<17} producer transaction held {:>8.0} ({})  /quiet {:.2}x",
                        "",
                        case.producer_held.per_second,
                        claim_cell(case.producer_held_claims),
                        case.producer_over_quiet,
                    );
                }
                let _ = writeln!(out, "    history/empty (quiet) {:.2}x", d.ratio);
            }
            let _ = writeln!(
                out,
                "  {:>6}  {:>8}  {:>8}  {:>8}  {:>8}  {:>8}  {:>9}  {:>9}  {:>9}  {:>9}  {:>8}  {:>7}",
                "at s",
                "events/s",
                "lat p50",
                "lat p99",
                "claim50",
                "claim99",
                "table MiB",
                "index MiB",
                "arch. MiB",
                "rows",
                "dead",
                "RSS MiB"
            );
            for w in &h.windows {
                let _ = writeln!(
                    out,
                    "  {:>6.0}  {:>8.0}  {:>8.2}  {:>8.2}  {:>8.2}  {:>8.2}  {:>9.1}  {:>9.1}  {:>9.1}  {:>9}  {:>8}  {:>7.1}",
                    w.at_secs,
                    w.published_per_second,
                    w.latency_p50_ms,
                    w.latency_p99_ms,
                    w.claim_p50_ms,
                    w.claim_p99_ms,
                    w.table_mib,
                    w.indexes_mib,
                    w.archive_mib,
                    w.rows,
                    w.dead_rows,
                    w.rss_mib
                );
            }
            let _ = writeln!(
                out,
                "  last/second window: events/s {:.2}, claim p99 {:.2}, table+indexes {:.2}; {} events archived",
                h.throughput_last_over_first,
                h.claim_p99_last_over_first,
                h.table_last_over_first,
                h.archived_at_end
            );
        }
        match &self.cdc {
            Some(CdcOutcome::Unavailable { reason }) => {
                let _ = writeln!(out);
                let _ = writeln!(out, "CDC against polling: not measured: {reason}");
            }
            Some(CdcOutcome::Measured(c)) => c.table(&mut out),
            None => {}
        }
        for t in &self.tenants {
            let _ = writeln!(out);
            let _ = writeln!(
                out,
                "tenants: {} schemas (added in {:.0} s; a relay's start-up sweep {:.1} s), \
                 plain-SQL producers into random tenants, relays with defaults, measured after \
                 {:.1} s of the same load",
                t.tenants, t.add_seconds, t.settle_seconds, t.warmup_seconds
            );
            let _ = writeln!(
                out,
                "  idle: relay CPU {:.2} % of a core, {} server connections",
                t.idle_cpu_pct, t.connections
            );
            let _ = writeln!(
                out,
                "  {:<64}  {:>8}  {:>8}  {:>8}  {:>8}  {:>8}",
                "commit → publish (ms)", "p50", "p95", "p99", "max", "CPU %"
            );
            for l in &t.latency {
                let p = &l.percentiles;
                let _ = writeln!(
                    out,
                    "  {:<64}  {:>8.1}  {:>8.1}  {:>8.1}  {:>8.1}  {:>8.1}",
                    l.what, p.p50_ms, p.p95_ms, p.p99_ms, p.max_ms, l.relay_cpu_pct
                );
                if let Some(rate) = l.backlog_per_s {
                    let _ = writeln!(
                        out,
                        "    (the backlog's tenant meanwhile: {rate:.0} events/s published)"
                    );
                }
            }
        }
        out
    }
}

impl CdcRun {
    fn table(&self, out: &mut String) {
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "CDC against polling (one relay each, defaults; slot {})",
            self.slot
        );
        let _ = writeln!(
            out,
            "  commit-to-publish latency (ms), plain-SQL producers at {}/s",
            self.rate
        );
        let _ = writeln!(
            out,
            "    {:<10}  {:>8}  {:>8}  {:>8}  {:>8}",
            "relay", "p50", "p95", "p99", "max"
        );
        for (what, p) in [
            ("polling", &self.latency_poll),
            ("CDC", &self.latency_cdc),
            ("CDC tenant", &self.latency_cdc_tenant),
            ("CDC deploy", &self.deploy.latency),
        ] {
            let _ = writeln!(
                out,
                "    {:<10}  {:>8.2}  {:>8.2}  {:>8.2}  {:>8.2}",
                what, p.p50_ms, p.p95_ms, p.p99_ms, p.max_ms
            );
        }
        let _ = writeln!(
            out,
            "  rolling deploy (a new CDC relay started beside the reading one, then the old one \
             stopped): {} repeated publishes of {} events; {} in flight at the stop, which took \
             {:.0} ms",
            self.deploy.repeats, self.deploy.events, self.deploy.in_flight, self.deploy.stop_ms
        );
        let _ = writeln!(
            out,
            "  drain of {} plain-SQL events (events/s): ceiling (4 clients) {:.0}",
            self.events, self.ceiling.per_second
        );
        let _ = writeln!(
            out,
            "    {:<10}  {:>10}  {:>14}  {:>11}",
            "relay", "quiet", "snapshot held", "held/quiet"
        );
        for (what, quiet, held, ratio) in [
            (
                "polling",
                self.poll,
                self.poll_held,
                self.poll_held_over_quiet,
            ),
            ("CDC", self.cdc, self.cdc_held, self.cdc_held_over_quiet),
        ] {
            let _ = writeln!(
                out,
                "    {:<10}  {:>10.0}  {:>14.0}  {:>10.2}x",
                what, quiet.per_second, held.per_second, ratio
            );
        }
        let _ = writeln!(
            out,
            "    CDC/polling {:.2}x, CDC/ceiling {:.2}x",
            self.cdc_over_poll, self.cdc_over_ceiling
        );
        let w = &self.wal;
        let _ = writeln!(
            out,
            "  slot WAL, outbox idle, {} tables churning: {:.0} MiB written in {:.0} s ({:.1} MiB/s)",
            w.tables, w.written_mib, w.seconds, w.written_mib_per_second
        );
        let _ = writeln!(
            out,
            "    behind (confirmed) with the relay running: median {:.1} MiB, max {:.1} MiB, at stop {:.1} MiB",
            w.retained_p50_mib, w.retained_max_mib, w.retained_end_mib
        );
        let _ = writeln!(
            out,
            "    kept by the server (restart_lsn): median {:.1} MiB, max {:.1} MiB",
            w.kept_p50_mib, w.kept_max_mib
        );
        let _ = writeln!(
            out,
            "    with a producer transaction held open as long: behind max {:.1} MiB, kept median {:.1} MiB, max {:.1} MiB",
            w.held_retained_max_mib, w.held_kept_p50_mib, w.held_kept_max_mib
        );
        let _ = writeln!(
            out,
            "    relay stopped {:.0} s: {:.1} MiB retained; restarted: caught up in {:.1} s ({:.1} MiB retained)",
            w.stopped_seconds,
            w.retained_after_stop_mib,
            w.catch_up_seconds,
            w.retained_after_catch_up_mib
        );
    }
}

/// A percentage for the table, signed: `+12.3%`.
fn pct(p: f64) -> String {
    format!("{p:+.1}%")
}

/// A duration for people: `50ms`, `1s`; `Debug` (`1.5ms`, `250µs`) below whole milliseconds.
/// `p50 / p99` of a run's claims, or `-` when none were recorded.
fn claim_cell(claims: Option<ClaimTimes>) -> String {
    claims.map_or_else(
        || "-".to_owned(),
        |c| format!("{:.2} / {:.2}", c.p50_ms, c.p99_ms),
    )
}

pub(crate) fn human(d: Duration) -> String {
    if !d.as_nanos().is_multiple_of(1_000_000) {
        return format!("{d:?}");
    }
    let ms = d.as_millis();
    if ms >= 1000 && ms.is_multiple_of(1000) {
        format!("{}s", d.as_secs())
    } else {
        format!("{ms}ms")
    }
}

/// The process's resident memory in KiB (Linux), 0 where unknown.
pub(crate) fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(human(Duration::from_millis(50)), "50ms");
        assert_eq!(human(Duration::from_millis(1500)), "1500ms");
        assert_eq!(human(Duration::from_secs(2)), "2s");
        assert_eq!(human(Duration::from_micros(250)), "250µs");
        assert_eq!(human(Duration::ZERO), "0ms");
    }

    #[test]
    fn percentages_are_signed() {
        assert_eq!(pct(12.34), "+12.3%");
        assert_eq!(pct(-1.0), "-1.0%");
    }
}
