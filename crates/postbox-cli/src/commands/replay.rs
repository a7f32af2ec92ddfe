//! `postbox replay`: chosen events published again, to the configured sinks or another one.

use std::process::ExitCode;

use anyhow::{anyhow, bail};
use clap::Args;
use postbox::replay::{Replay, ReplayDedup, ReplayOptions};
use tracing::warn;

use crate::cli::SchemaArg;
use crate::commands::filter;
use crate::commands::filter::FilterArgs;
use crate::commands::progress::Progress;
use crate::config::Config;
use crate::database::{Create, Database};
use crate::sinks;
use crate::sinks::SinkArgs;

/// How many events a dry run shows.
const SAMPLE: usize = 5;

/// Replays (or with `--dry-run` counts) the events the arguments choose.
pub(crate) async fn run(config: &Config, args: &ReplayArgs) -> anyhow::Result<ExitCode> {
    let mut chosen = filter::parse(&args.filter)?;
    if !args.ids.is_empty() {
        chosen.ids = args.ids.clone();
        chosen.archive = true;
    }
    let f = &args.filter;
    let narrowed = !args.ids.is_empty()
        || !f.status.is_empty()
        || f.event_type.is_some()
        || f.aggregate_type.is_some()
        || f.aggregate_id.is_some()
        || f.since.is_some()
        || f.until.is_some();
    if !narrowed && !args.all {
        bail!(
            "say which events to replay: ids, or --type, --aggregate-type, --aggregate-id, \
             --since, --until, --status; --all replays every PROCESSED and FAILED event"
        );
    }
    if let Some(rate) = args.rate
        && !(rate.is_finite() && rate > 0.0)
    {
        bail!("--rate {rate} is not a rate: give events per second above zero");
    }
    let filter = Replay::filter(&chosen)?;
    let location = config.location()?;
    let db = Database::connect(&location, config.schema.clone(), Create::Never).await?;
    db.ensure_migrated().await?;
    let target = db.target(f.tenant.as_deref()).await?;
    let mut options = ReplayOptions::default()
        .rate_limit(args.rate)
        .concurrency(args.concurrency as usize)
        .publish_timeout(config.publish_timeout)
        .dedup(if args.keep_dedup_id {
            ReplayDedup::Original
        } else {
            ReplayDedup::PerReplay
        });
    if let Some(id) = &args.replay_id {
        options = options.replay_id(id.clone());
    }
    let replay_id = options.replay_id.clone();

    if args.dry_run {
        // No sink is opened for a dry run: only the database is read.
        let (count, sample) =
            postbox::replay::preview(&*db.store, &target, &filter, SAMPLE).await?;
        println!(
            "dry run: {count} event(s) of {} would be replayed; nothing was published",
            target.label()
        );
        for e in sample {
            println!(
                "  {} {} {} {}:{} created {}",
                e.id,
                e.status,
                e.event_type,
                e.aggregate_type.as_deref().unwrap_or("-"),
                e.aggregate_id.as_deref().unwrap_or("-"),
                e.created_at
                    .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            );
        }
        return Ok(ExitCode::SUCCESS);
    }

    let plan = sinks::plan(config).map_err(|e| anyhow!("invalid sink configuration: {e:?}"))?;
    let opened = sinks::open(plan, Some(location.origin(&config.schema))).await?;
    let replay = Replay::new(db.store.clone(), opened.sink, options);
    let progress = Progress::start(format!("{}: replayed", target.label()));
    let report = replay.run(&target, &filter, |n| progress.add(n)).await?;
    progress.finish();
    println!(
        "{} event(s) of {} replayed (replay id {replay_id}; --replay-id {replay_id} runs it again \
         without new duplicates for consumers that drop repeats)",
        report.published,
        target.label()
    );
    if report.failed.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    for (id, reason) in &report.failed {
        warn!(event_id = id, reason, "not replayed");
        eprintln!("not replayed: event {id}: {reason}");
    }
    eprintln!(
        "error: {} event(s) could not be replayed (listed above); fix the cause and replay \
         them by id",
        report.failed.len()
    );
    Ok(ExitCode::FAILURE)
}

/// `postbox replay`.
#[derive(Debug, Args)]
pub(crate) struct ReplayArgs {
    /// Ids of the events to replay (the archive is read too)
    #[arg(value_name = "ID")]
    pub(crate) ids: Vec<i64>,

    /// Which events.
    #[command(flatten)]
    pub(crate) filter: FilterArgs,

    /// Replay every PROCESSED and FAILED event (needed when no id and no filter is given)
    #[arg(long)]
    pub(crate) all: bool,

    /// Count the events and show the first ones; publish nothing
    #[arg(long)]
    pub(crate) dry_run: bool,

    /// At most this many events per second
    #[arg(long, value_name = "EVENTS_PER_SECOND")]
    pub(crate) rate: Option<f64>,

    /// The replay's id [default: a new UUID]; give an interrupted replay's id to run it again
    /// without new duplicates for consumers that drop repeats
    #[arg(long, value_name = "ID")]
    pub(crate) replay_id: Option<String>,

    /// Deliver with the original dedup id (idempotency key): consumers that drop repeats then
    /// drop events they already have
    #[arg(long)]
    pub(crate) keep_dedup_id: bool,

    /// Events published at once
    #[arg(long, value_name = "N", default_value_t = 32,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub(crate) concurrency: u32,

    /// The default schema.
    #[command(flatten)]
    pub(crate) schema: SchemaArg,

    /// Where events are published.
    #[command(flatten)]
    pub(crate) sink: SinkArgs,
}
