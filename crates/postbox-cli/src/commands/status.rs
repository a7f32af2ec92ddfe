//! `postbox status`: event counts per status, per target.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use postbox::status::{SUMMARY_ABOVE, StatusReport, StatusSummary};
use postbox::store::StatusCounts;
use postbox::store::TenantStatus;
use serde::Serialize;

use crate::cli::SchemaArg;
use crate::config::Config;
use crate::database::{Create, Database};

/// One target's line of the report.
#[derive(Debug, Serialize)]
struct TargetStatus {
    /// The tenant id, or `null` for the default schema.
    tenant: Option<String>,
    /// The schema holding its events.
    schema: String,
    /// `ACTIVE` or `SUSPENDED` for a tenant; `null` for the default schema.
    tenant_status: Option<TenantStatus>,
    /// The counts, if they could be read.
    #[serde(flatten)]
    counts: Option<Counts>,
    /// The consumers of its inbox: messages recorded in the dedup window, repeats skipped.
    inbox: Vec<InboxLine>,
    /// Why the counts could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// One consumer of an inbox, as printed.
#[derive(Debug, Serialize)]
struct InboxLine {
    /// The consumer's name.
    consumer: String,
    /// Messages it recorded, within the dedup window (`inbox_retention`).
    messages: i64,
    /// Whether `messages` is exact; past 100,000 it is "at least".
    messages_exact: bool,
    /// Repeats it skipped.
    duplicates: i64,
}

/// Counts by status, as printed.
#[derive(Debug, Serialize)]
struct Counts {
    pending: i64,
    processing: i64,
    processed: i64,
    /// Whether `processed` is exact; on a long history it is the database's estimate, so that
    /// the history is not read to count it.
    processed_exact: bool,
    failed: i64,
    /// Ordered aggregates parked by a FAILED event that holds back later ones (counted up to
    /// 1,000): `postbox events list --parked` lists them.
    parked_aggregates: i64,
    /// Age in seconds of the oldest PENDING or PROCESSING event; `null` when there is none.
    oldest_pending_age_secs: Option<f64>,
    /// Dead row versions of the outbox table (PostgreSQL); `null` on SQLite.
    dead_tuples: Option<i64>,
}

impl From<StatusCounts> for Counts {
    fn from(c: StatusCounts) -> Self {
        Counts {
            pending: c.pending,
            processing: c.processing,
            processed: c.processed,
            processed_exact: c.processed_exact,
            failed: c.failed,
            parked_aggregates: 0,
            oldest_pending_age_secs: c.oldest_pending_age.map(|d| d.as_secs_f64()),
            dead_tuples: c.dead_tuples,
        }
    }
}

/// The whole report (the `--json` document).
#[derive(Debug, Serialize)]
struct Report {
    /// Where the outbox is (no password).
    database: String,
    /// Age in seconds of the database's oldest open transaction that holds a snapshot
    /// (PostgreSQL); a long one keeps vacuum from removing dead rows and slows claims.
    oldest_transaction_age_secs: Option<f64>,
    /// The default schema first, then tenants by id (empty when `summary` is given instead).
    targets: Vec<TargetStatus>,
    /// With more than 50 targets (and no `--all`): totals, the largest and oldest backlogs, the
    /// most FAILED events, instead of a line per target.
    #[serde(skip_serializing_if = "Option::is_none")]
    summary: Option<StatusSummary>,
    /// What running relays report of their sinks: down ones, and since when.
    sinks: Vec<SinkLine>,
    /// The database's logical replication slots (PostgreSQL): a CDC relay's, with the WAL each
    /// holds back.
    replication_slots: Vec<postbox::store::ReplicationSlot>,
}

/// One relay's report of one sink.
#[derive(Debug, Serialize)]
struct SinkLine {
    /// The sink (a `[sinks.NAME]` table, or the kind of the one sink).
    sink: String,
    /// The relay that reported it.
    relay: String,
    /// Whether it accepts events.
    up: bool,
    /// Since when it is up or down (UTC, RFC 3339).
    since: String,
    /// Why it is down.
    last_error: Option<String>,
    /// Seconds since the relay reported; relays report at least every 15 s while they run.
    reported_secs_ago: f64,
    /// The relay has not reported for over a minute: it may have stopped.
    stale: bool,
}

/// Prints the report; exits 1 if a target could not be read. With several databases
/// (`database_urls`), one report each (`--json`: `{"databases": [...]}`); a database that
/// cannot be read is reported and the others still are.
pub(crate) async fn run(config: &Config, args: &StatusArgs) -> anyhow::Result<ExitCode> {
    let locations = config.locations()?;
    if let [location] = locations.as_slice() {
        let report = report(config, location, args.all).await?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print!("{}", table(&report));
        }
        return Ok(exit_code(&report));
    }
    let mut reports = Vec::with_capacity(locations.len());
    let mut unreachable = Vec::new();
    for location in &locations {
        match report(config, location, args.all).await {
            Ok(report) => reports.push(report),
            Err(e) => unreachable.push(serde_json::json!({
                "database": location.to_string(),
                "error": format!("{e:#}"),
            })),
        }
    }
    if args.json {
        let doc = serde_json::json!({ "databases": reports, "unreachable": unreachable });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        for (i, report) in reports.iter().enumerate() {
            if i > 0 {
                println!();
            }
            print!("{}", table(report));
        }
        for u in &unreachable {
            println!("\n{}: cannot be read: {}", u["database"], u["error"]);
        }
    }
    let failed =
        !unreachable.is_empty() || reports.iter().any(|r| exit_code(r) != ExitCode::SUCCESS);
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Failure when a target could not be read.
fn exit_code(report: &Report) -> ExitCode {
    if report.targets.iter().any(|t| t.error.is_some()) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// The report of one database: the library's [`StatusReport`], as printed.
async fn report(
    config: &Config,
    location: &crate::database::Location,
    all: bool,
) -> anyhow::Result<Report> {
    let db = Database::connect(location, config.schema.clone(), Create::Never).await?;
    db.ensure_migrated().await?;
    let tenants = match db.store.tenant_list().await {
        Ok(tenants) => tenants.len(),
        Err(postbox::Error::Unsupported(_)) => 0,
        Err(e) => return Err(e).context("cannot read the tenant registry"),
    };
    if !all && tenants + 1 > SUMMARY_ABOVE {
        let summary = StatusSummary::read(&*db.store, SUMMARY_TOP)
            .await
            .context("cannot read the outbox's status")?;
        let sinks = db.store.sinks_reported().await.unwrap_or_default();
        return Ok(Report {
            database: db.location.clone(),
            oldest_transaction_age_secs: summary.oldest_transaction_age.map(|d| d.as_secs_f64()),
            targets: Vec::new(),
            sinks: sink_lines(&sinks),
            replication_slots: db.store.replication_slots().await.unwrap_or_default(),
            summary: Some(summary),
        });
    }
    let read = StatusReport::read(&*db.store)
        .await
        .context("cannot read the outbox's status")?;
    let sinks = sink_lines(&read.sinks);
    let targets = read
        .targets
        .into_iter()
        .map(|t| TargetStatus {
            tenant: t.tenant,
            schema: t.schema,
            tenant_status: t.tenant_status,
            counts: t.counts.map(|c| {
                let mut counts = Counts::from(c);
                counts.parked_aggregates = t.parked_aggregates;
                counts
            }),
            inbox: t
                .inbox
                .iter()
                .map(|i| InboxLine {
                    consumer: i.consumer.clone(),
                    messages: i.messages,
                    messages_exact: i.messages_exact(),
                    duplicates: i.duplicates,
                })
                .collect(),
            error: t.error,
        })
        .collect();
    Ok(Report {
        database: db.location.clone(),
        oldest_transaction_age_secs: read.oldest_transaction_age.map(|d| d.as_secs_f64()),
        targets,
        sinks,
        replication_slots: read.replication_slots,
        summary: None,
    })
}

/// Lines of the targets a summary lists in `postbox status`, at most.
const SUMMARY_TOP: usize = 10;

/// What relays reported of their sinks, as printed.
fn sink_lines(reported: &[postbox::store::ReportedSink]) -> Vec<SinkLine> {
    reported
        .iter()
        .map(|r| SinkLine {
            sink: r.health.name.clone(),
            relay: r.relay_id.clone(),
            up: r.health.up,
            since: r
                .health
                .since
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            last_error: r.health.last_error.clone(),
            reported_secs_ago: r.reported_ago.as_secs_f64(),
            stale: r.reported_ago > Duration::from_secs(60),
        })
        .collect()
}

/// The report as an aligned table (or, for many targets, its summary).
fn table(report: &Report) -> String {
    if let Some(summary) = &report.summary {
        return summary_table(report, summary);
    }
    let header = [
        "TENANT",
        "SCHEMA",
        "STATE",
        "PENDING",
        "PROCESSING",
        "PROCESSED",
        "FAILED",
        "OLDEST",
        "DEAD ROWS",
    ];
    let mut rows: Vec<[String; 9]> = vec![header.map(str::to_owned)];
    for t in &report.targets {
        let tenant = t.tenant.clone().unwrap_or_else(|| "(default)".to_owned());
        let state = match t.tenant_status {
            Some(TenantStatus::Active) | None => "active",
            Some(other) => other.as_str(),
        };
        let row = match (&t.counts, &t.error) {
            (Some(c), _) => [
                tenant,
                t.schema.clone(),
                state.to_owned(),
                c.pending.to_string(),
                c.processing.to_string(),
                if c.processed_exact {
                    c.processed.to_string()
                } else {
                    format!("~{}", c.processed)
                },
                if c.parked_aggregates > 0 {
                    format!("{} ({} parked)", c.failed, c.parked_aggregates)
                } else {
                    c.failed.to_string()
                },
                c.oldest_pending_age_secs
                    .map_or_else(|| "-".to_owned(), age),
                c.dead_tuples
                    .map_or_else(|| "-".to_owned(), |d| d.to_string()),
            ],
            (None, error) => [
                tenant,
                t.schema.clone(),
                state.to_owned(),
                format!("error: {}", error.as_deref().unwrap_or("unknown")),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
            ],
        };
        rows.push(row);
    }
    let mut out = format!("{}\n\n", report.database);
    out.push_str(&aligned(&rows, 3, ""));
    out.push_str(&sinks_block(report));
    let mut inboxes = report
        .targets
        .iter()
        .filter(|t| !t.inbox.is_empty())
        .peekable();
    if inboxes.peek().is_some() {
        out.push('\n');
    }
    for t in inboxes {
        for i in &t.inbox {
            out.push_str(&format!(
                "inbox {} of {}: {}{} message(s) handled, {} duplicate(s) skipped\n",
                i.consumer,
                t.tenant.as_deref().unwrap_or("(default)"),
                if i.messages_exact { "" } else { "at least " },
                i.messages,
                i.duplicates
            ));
        }
    }
    for slot in &report.replication_slots {
        out.push_str(&slot_line(slot));
    }
    if let Some(secs) = report.oldest_transaction_age_secs {
        out.push_str(&format!(
            "\noldest open transaction: {}{}\n",
            age(secs),
            if secs > 60.0 {
                " (long transactions keep vacuum from removing dead rows; claims slow down)"
            } else {
                ""
            }
        ));
    }
    out
}

/// What relays reported of their sinks, a line each.
fn sinks_block(report: &Report) -> String {
    let mut out = String::new();
    if !report.sinks.is_empty() {
        out.push('\n');
        for sink in &report.sinks {
            let state = if sink.up { "up" } else { "DOWN" };
            out.push_str(&format!(
                "sink {} ({}): {state} since {}{}{}\n",
                sink.sink,
                sink.relay,
                sink.since,
                sink.last_error
                    .as_deref()
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default(),
                if sink.stale {
                    format!(" [last report {} ago]", age(sink.reported_secs_ago))
                } else {
                    String::new()
                }
            ));
        }
    }
    out
}

/// The report of many targets: totals, then the few an operator looks at first.
fn summary_table(report: &Report, s: &StatusSummary) -> String {
    let t = &s.totals;
    let mut out = format!("{}\n\n", report.database);
    out.push_str(&format!(
        "{} outboxes (the default schema and {} tenant(s), {} suspended{}): {} pending, {} \
         processing, {} FAILED; {} with a backlog, {} with FAILED events; oldest outstanding \
         {}\n(`postbox status --all` lists every one)\n",
        s.targets,
        s.targets.saturating_sub(1),
        s.suspended,
        if s.rejected > 0 {
            format!(", {} registry row(s) not served", s.rejected)
        } else {
            String::new()
        },
        t.pending,
        t.processing,
        t.failed,
        s.with_backlog,
        s.with_failed,
        t.oldest_pending_age
            .map_or_else(|| "-".to_owned(), |d| age(d.as_secs_f64())),
    ));
    for (title, lines) in [
        ("largest backlogs", &s.busiest),
        ("oldest outstanding events", &s.oldest),
        ("most FAILED events", &s.failing),
    ] {
        if lines.is_empty() {
            continue;
        }
        out.push_str(&format!("\n{title}:\n"));
        let mut rows: Vec<[String; 6]> = vec![
            [
                "TENANT",
                "SCHEMA",
                "PENDING",
                "PROCESSING",
                "FAILED",
                "OLDEST",
            ]
            .map(str::to_owned),
        ];
        for l in lines {
            let o = &l.outstanding;
            rows.push([
                l.tenant.clone().unwrap_or_else(|| "(default)".to_owned()),
                l.schema.clone(),
                o.pending.to_string(),
                o.processing.to_string(),
                o.failed.to_string(),
                o.oldest_pending_age
                    .map_or_else(|| "-".to_owned(), |d| age(d.as_secs_f64())),
            ]);
        }
        out.push_str(&aligned(&rows, 2, "  "));
    }
    out.push_str(&sinks_block(report));
    for slot in &report.replication_slots {
        out.push_str(&slot_line(slot));
    }
    if let Some(secs) = report.oldest_transaction_age_secs {
        out.push_str(&format!("\noldest open transaction: {}\n", age(secs)));
    }
    out
}

/// `rows` as aligned columns, each line after `indent`: the first `names` columns left-aligned,
/// the others (numbers) right-aligned.
fn aligned<const N: usize>(rows: &[[String; N]], names: usize, indent: &str) -> String {
    let mut widths = [0usize; N];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::from(indent);
        for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
            if i < names {
                line.push_str(&format!("{cell:<w$}  "));
            } else {
                line.push_str(&format!("{cell:>w$}  "));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// A replication slot's line: whether it is read, the WAL it holds back, and what to do when
/// that is a problem.
fn slot_line(slot: &postbox::store::ReplicationSlot) -> String {
    let mib = |b: i64| b as f64 / (1024.0 * 1024.0);
    let mut line = format!(
        "\nreplication slot {}: {}, {} behind, {} of WAL kept",
        slot.name,
        if slot.active { "read" } else { "NOT READ" },
        slot.lag_bytes
            .map_or_else(|| "-".to_owned(), |b| format!("{:.1} MiB", mib(b))),
        slot.kept_bytes
            .map_or_else(|| "-".to_owned(), |b| format!("{:.1} MiB", mib(b)))
    );
    if let Some(status) = &slot.wal_status {
        line.push_str(&format!(", wal_status {status}"));
    }
    if let Some(safe) = slot.safe_wal_bytes {
        line.push_str(&format!(", {:.1} MiB before it is invalidated", mib(safe)));
    }
    if !slot.active {
        line.push_str(&format!(
            " (it keeps WAL until a relay reads it: start `postbox relay --source cdc --cdc-slot \
             {0}`, or drop it with SELECT pg_drop_replication_slot('{0}'))",
            slot.name
        ));
    } else if matches!(slot.wal_status.as_deref(), Some("unreserved" | "lost")) {
        line.push_str(" (past max_slot_wal_keep_size: the server is about to drop its WAL)");
    }
    if let Some(pin) = &slot.pinned_by {
        line.push_str(&format!(
            "\n  WAL kept by open transaction pid {} ({}, user {}, open {}, {}): {} \
             (the server keeps WAL from before it began until it ends; end it with \
             SELECT pg_terminate_backend({}))",
            pin.pid,
            pin.database.as_deref().unwrap_or("-"),
            pin.user.as_deref().unwrap_or("-"),
            age(pin.age_secs),
            pin.state.as_deref().unwrap_or("-"),
            pin.query.as_deref().unwrap_or("-"),
            pin.pid
        ));
    }
    line.push('\n');
    line
}

/// An age for humans: `42s`, `3m 5s`, `2h 1m`.
fn age(secs: f64) -> String {
    let d = Duration::from_secs(secs.max(0.0).round() as u64);
    humantime::format_duration(d).to_string()
}

/// `postbox status`.
#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// Print JSON instead of a table
    #[arg(long)]
    pub(crate) json: bool,

    /// A line for every tenant, however many (past 50 outboxes the report is a summary:
    /// totals, the largest and oldest backlogs, the most FAILED events)
    #[arg(long)]
    pub(crate) all: bool,

    /// The default schema.
    #[command(flatten)]
    pub(crate) schema: SchemaArg,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_and_marks_missing_ages() {
        let report = Report {
            database: "SQLite file postbox.db".to_owned(),
            oldest_transaction_age_secs: Some(125.0),
            replication_slots: Vec::new(),
            summary: None,
            sinks: vec![SinkLine {
                sink: "billing".to_owned(),
                relay: "host-1".to_owned(),
                up: false,
                since: "2026-11-30T12:00:00Z".to_owned(),
                last_error: Some("connection refused".to_owned()),
                reported_secs_ago: 3.0,
                stale: false,
            }],
            targets: vec![
                TargetStatus {
                    tenant: None,
                    schema: "public".to_owned(),
                    tenant_status: None,
                    counts: Some(Counts {
                        pending: 3,
                        processing: 0,
                        processed: 1200,
                        processed_exact: true,
                        failed: 1,
                        parked_aggregates: 0,
                        oldest_pending_age_secs: Some(65.2),
                        dead_tuples: Some(4200),
                    }),
                    inbox: vec![InboxLine {
                        consumer: "billing".to_owned(),
                        messages: 100_000,
                        messages_exact: false,
                        duplicates: 3,
                    }],
                    error: None,
                },
                TargetStatus {
                    tenant: Some("acme".to_owned()),
                    schema: "s_acme".to_owned(),
                    tenant_status: Some(TenantStatus::Suspended),
                    counts: Some(Counts {
                        pending: 0,
                        processing: 0,
                        processed: 2_500_000,
                        processed_exact: false,
                        failed: 0,
                        parked_aggregates: 0,
                        oldest_pending_age_secs: None,
                        dead_tuples: None,
                    }),
                    inbox: Vec::new(),
                    error: None,
                },
            ],
        };
        let text = table(&report);
        assert!(text.contains("1m 5s"), "{text}");
        assert!(text.contains("SUSPENDED"), "{text}");
        assert!(text.contains("~2500000"), "an estimate is marked: {text}");
        assert!(
            text.contains(
                "sink billing (host-1): DOWN since 2026-11-30T12:00:00Z: connection refused"
            ),
            "{text}"
        );
        assert!(text.contains("(default)"), "{text}");
        assert!(
            text.contains(
                "inbox billing of (default): at least 100000 message(s) handled, 3 duplicate(s) skipped"
            ),
            "{text}"
        );
        assert!(
            text.contains("DEAD ROWS") && text.contains("4200"),
            "{text}"
        );
        assert!(
            text.contains("oldest open transaction: 2m 5s (long"),
            "{text}"
        );
        let json = serde_json::to_value(&report).expect("json");
        assert_eq!(json["targets"][0]["pending"], 3);
        assert_eq!(json["targets"][0]["tenant"], serde_json::Value::Null);
        assert_eq!(json["targets"][1]["tenant_status"], "SUSPENDED");
        assert!(json["targets"][1]["oldest_pending_age_secs"].is_null());
        assert_eq!(json["targets"][0]["dead_tuples"], 4200);
        assert_eq!(json["oldest_transaction_age_secs"], 125.0);
    }
}
