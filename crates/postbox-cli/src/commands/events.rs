//! `postbox events list|show|skip`: a look inside the outbox and its archive, and an operator's
//! skip of a parked aggregate's head.

use std::fmt::Write as _;
use std::process::ExitCode;

use anyhow::bail;
use clap::{Args, Subcommand};
use postbox::store::{ListParams, Order, StoredEvent};

use crate::cli::SchemaArg;
use crate::commands::filter;
use crate::commands::filter::FilterArgs;
use crate::config::Config;
use crate::database::{Create, Database};
use postbox::StoreExt;

/// Runs one events subcommand.
pub(crate) async fn run(config: &Config, command: &EventsCommand) -> anyhow::Result<ExitCode> {
    let db = Database::connect(&config.location()?, config.schema.clone(), Create::Never).await?;
    db.ensure_migrated().await?;
    match command {
        EventsCommand::List(args) => {
            let (target, mut filter) = filter::resolve(&db, &args.filter).await?;
            filter.parked = args.parked;
            let events = db
                .store
                .events_list(&ListParams {
                    target: &target,
                    filter: &filter,
                    order: Order::NewestFirst,
                    after: None,
                    limit: args.limit,
                })
                .await?;
            if args.json {
                let events: Vec<_> = events.iter().map(json).collect();
                println!("{}", serde_json::to_string_pretty(&events)?);
            } else {
                print!("{}", table(&events));
                if events.len() == args.limit as usize {
                    eprintln!("(the newest {} shown; --limit shows more)", args.limit);
                }
            }
        }
        EventsCommand::Show(args) => {
            let target = db.target(args.tenant.as_deref()).await?;
            let Some(event) = db.store.event_get(&target, args.id).await? else {
                bail!(
                    "event {} is not in {} (neither outbox_events nor outbox_events_archive)",
                    args.id,
                    target.label()
                );
            };
            if args.json {
                println!("{}", serde_json::to_string_pretty(&json(&event))?);
            } else {
                print!("{}", show(&event));
            }
        }
        EventsCommand::Skip(args) => {
            let target = db.target(args.tenant.as_deref()).await?;
            let skipped = db.store.events_skip(&target, &args.ids).await?;
            println!(
                "{} event(s) of {} skipped: the later events of their aggregates are published \
                 at a relay's next poll{}",
                skipped.len(),
                target.label(),
                if skipped.is_empty() {
                    String::new()
                } else {
                    format!(
                        " ({})",
                        skipped
                            .iter()
                            .map(i64::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                }
            );
            let left: Vec<String> = args
                .ids
                .iter()
                .filter(|id| !skipped.contains(id))
                .map(i64::to_string)
                .collect();
            if !left.is_empty() {
                eprintln!(
                    "note: left alone (in flight, PROCESSED, already skipped or not there): {}",
                    left.join(", ")
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// An event as JSON, payload and headers as JSON values (as text when a producer stored
/// something that is not JSON).
fn json(event: &StoredEvent) -> serde_json::Value {
    let mut value = serde_json::to_value(event).unwrap_or_default();
    for field in ["payload", "headers"] {
        let text = match field {
            "payload" => &event.payload,
            _ => &event.headers,
        };
        if let Ok(parsed) = serde_json::from_str::<serde_json::Value>(text) {
            value[field] = parsed;
        }
    }
    value
}

/// The list as a table, newest first.
fn table(events: &[StoredEvent]) -> String {
    if events.is_empty() {
        return "0 events\n".to_owned();
    }
    let rows: Vec<[String; 7]> = events
        .iter()
        .map(|e| {
            let status = match e.archived_at {
                Some(_) => format!("{} (archived)", e.status),
                None => e.status.clone(),
            };
            let aggregate = match (&e.aggregate_type, &e.aggregate_id) {
                (Some(t), Some(id)) => format!("{t}:{id}"),
                (Some(t), None) => t.clone(),
                (None, Some(id)) => id.clone(),
                (None, None) => "-".to_owned(),
            };
            let error = e
                .last_error
                .as_deref()
                .map(|err| one_line(err, 60))
                .unwrap_or_default();
            [
                e.id.to_string(),
                status,
                e.event_type.clone(),
                aggregate,
                e.created_at.format("%Y-%m-%d %H:%M:%S").to_string(),
                format!("{}/{}", e.retry_count, e.max_retries),
                error,
            ]
        })
        .collect();
    let header = [
        "ID",
        "STATUS",
        "TYPE",
        "AGGREGATE",
        "CREATED (UTC)",
        "TRIES",
        "LAST ERROR",
    ];
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[&str]| {
        let mut text = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                text.push_str(cell);
            } else {
                let _ = write!(text, "{cell:<w$}  ");
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&header);
    for row in &rows {
        line(&row.each_ref().map(String::as_str));
    }
    out
}

/// One event, every column, for a human.
fn show(e: &StoredEvent) -> String {
    let time = |t: Option<chrono::DateTime<chrono::Utc>>| {
        t.map_or("-".to_owned(), |t| {
            t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
        })
    };
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".to_owned());
    let pretty = |text: &str| {
        serde_json::from_str::<serde_json::Value>(text)
            .ok()
            .and_then(|v| serde_json::to_string_pretty(&v).ok())
            .unwrap_or_else(|| format!("{text}  (not JSON)"))
    };
    let mut out = String::new();
    let fields = [
        ("id", e.id.to_string()),
        (
            "tenant",
            e.tenant
                .as_ref()
                .map_or("-".to_owned(), ToString::to_string),
        ),
        ("status", e.status.clone()),
        ("event_type", e.event_type.clone()),
        ("aggregate_type", opt(&e.aggregate_type)),
        ("aggregate_id", opt(&e.aggregate_id)),
        ("idempotency_key", opt(&e.idempotency_key)),
        ("event_class", opt(&e.event_class)),
        ("schema_version", e.schema_version.to_string()),
        (
            "retry_count",
            // Tries past max_retries are the slow lane's (one each, after the event went FAILED).
            match e.retry_count - e.max_retries {
                slow if slow > 0 => format!(
                    "{} ({} of {}, then {slow} in the slow lane)",
                    e.retry_count, e.max_retries, e.max_retries
                ),
                _ => format!("{} of {}", e.retry_count, e.max_retries),
            },
        ),
        ("created_at", time(Some(e.created_at))),
        ("updated_at", time(Some(e.updated_at))),
        ("processed_at", time(e.processed_at)),
        ("locked_until", time(e.locked_until)),
        ("locked_by", opt(&e.locked_by)),
        ("archived_at", time(e.archived_at)),
        ("last_error", opt(&e.last_error)),
    ];
    for (name, value) in fields {
        let _ = writeln!(out, "{name:<16} {value}");
    }
    let _ = writeln!(out, "headers\n{}", pretty(&e.headers));
    let _ = writeln!(out, "payload\n{}", pretty(&e.payload));
    out
}

/// `text` on one line, cut to `max` characters.
fn one_line(text: &str, max: usize) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.chars().count() <= max {
        flat
    } else {
        let cut: String = flat.chars().take(max - 1).collect();
        format!("{cut}…")
    }
}

/// `postbox events …`.
#[derive(Debug, Subcommand)]
pub(crate) enum EventsCommand {
    /// List events, newest first, by status, type, aggregate, time; the archive too
    #[command(
        long_about = "List the events of the default schema (or --tenant) that match every \
                      filter given, newest first: id, status, type, aggregate, creation time, \
                      tries and last error, as a table or with --json. --archive reads \
                      outbox_events_archive too. A filter that matches nothing prints \
                      \"0 events\"; a filter that cannot match (a time range backwards, an \
                      unknown status, a glob with [ ]) is refused."
    )]
    List(EventsListArgs),

    /// Show one event: every column, headers, last error, the payload pretty-printed
    Show(EventsShowArgs),

    /// Skip the held-back head of an ordered aggregate: it stays FAILED, the rest flows
    #[command(
        long_about = "Skip events that hold back the later events of their ordered aggregate \
                      (ordered_aggregate_types): each goes FAILED, if it was waiting for a \
                      retry, and is marked skipped, so that the rest of its aggregate is \
                      published; `postbox events list --parked` lists the candidates. Events in \
                      flight or already PROCESSED are left alone (and named). `postbox retry \
                      ID` undoes a skip: the event is published again, after the events that \
                      overtook it."
    )]
    Skip(EventsSkipArgs),
}

/// `postbox events skip`.
#[derive(Debug, Args)]
pub(crate) struct EventsSkipArgs {
    /// Ids of the events to skip
    #[arg(value_name = "ID", required = true)]
    pub(crate) ids: Vec<i64>,

    /// The tenant the events belong to (`default`: the default schema) [default: the default schema]
    #[arg(long, value_name = "TENANT")]
    pub(crate) tenant: Option<String>,

    /// The default schema.
    #[command(flatten)]
    pub(crate) schema: SchemaArg,
}

/// `postbox events list`.
#[derive(Debug, Args)]
pub(crate) struct EventsListArgs {
    /// Which events.
    #[command(flatten)]
    pub(crate) filter: FilterArgs,

    /// Only the heads of parked aggregates: FAILED events (not skipped) that hold back later
    /// events of their aggregate (ordered_aggregate_types)
    #[arg(long)]
    pub(crate) parked: bool,

    /// At most this many events
    #[arg(long, value_name = "N", default_value_t = 50,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) limit: u32,

    /// Print JSON (an array of events, payloads and headers as JSON) instead of a table
    #[arg(long)]
    pub(crate) json: bool,

    /// The default schema.
    #[command(flatten)]
    pub(crate) schema: SchemaArg,
}

/// `postbox events show`.
#[derive(Debug, Args)]
pub(crate) struct EventsShowArgs {
    /// The event id
    #[arg(value_name = "ID")]
    pub(crate) id: i64,

    /// The tenant the event belongs to (`default`: the default schema) [default: the default schema]
    #[arg(long, value_name = "TENANT")]
    pub(crate) tenant: Option<String>,

    /// Print JSON instead of text
    #[arg(long)]
    pub(crate) json: bool,

    /// The default schema.
    #[command(flatten)]
    pub(crate) schema: SchemaArg,
}
