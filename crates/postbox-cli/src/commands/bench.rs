//! `postbox bench`: runs the benchmarks of `postbox-bench` and prints their report.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use postbox_bench::{BenchOptions, run as run_bench};

use crate::cli::BenchArgs;
use crate::config::Config;
use crate::database::Location;

/// Quieter logs than the daemon's, so progress bars stay readable; flags and config override.
pub(crate) fn defaults() -> Config {
    Config {
        log_level: "warn".to_owned(),
        ..Config::default()
    }
}

/// Runs the benchmark against the configured PostgreSQL or MySQL server, or SQLite without one.
pub(crate) async fn run(config: &Config, args: &BenchArgs) -> anyhow::Result<ExitCode> {
    let url = match config.location()? {
        Location::Postgres(..) => config.database_url.as_ref().map(|u| u.expose().to_owned()),
        Location::MySql(..) => config.database_url.as_ref().map(|u| u.expose().to_owned()),
        Location::Sqlite { .. } => None,
    };
    let mut opts = if args.quick {
        BenchOptions::quick(url)
    } else {
        BenchOptions::full(url)
    };
    opts.batch_size = args.batch_size.unwrap_or(config.batch_size);
    let vacuum = args.vacuum_threshold.unwrap_or(config.vacuum_threshold);
    opts.vacuum_threshold = (vacuum > 0).then_some(vacuum);
    if let Some(n) = args.events {
        opts.events = n;
    }
    if let Some(r) = &args.relays {
        opts.relays = r.clone();
    }
    if let Some(p) = &args.producers {
        opts.producers = p.clone();
    }
    if let Some(r) = args.rate {
        opts.rate = r;
    }
    if let Some(d) = args.latency_duration {
        opts.latency_duration = d;
    }
    if let Some(d) = args.enqueue_duration {
        opts.enqueue_duration = d;
    }
    if let Some(n) = args.business_statements {
        opts.business_statements = n;
    }
    if let Some(n) = args.soak_events {
        opts.soak_events = n;
    }
    if let Some(n) = args.soak_window {
        opts.soak_window = n;
    }
    if let Some(a) = &args.ordered_aggregates {
        opts.ordered_aggregates = a.iter().copied().filter(|n| *n > 0).collect();
    }
    if let Some(n) = args.history_rows {
        opts.history_rows = n;
    }
    if let Some(d) = args.history_duration {
        opts.history_duration = d;
    }
    if let Some(r) = args.history_rate {
        opts.history_rate = r;
    }
    if let Some(w) = args.history_window {
        opts.history_window = w;
    }
    if let Some(n) = args.cdc_events {
        opts.cdc_events = n;
    }
    if let Some(r) = args.cdc_rate {
        opts.cdc_rate = r;
    }
    if let Some(d) = args.cdc_churn {
        opts.cdc_churn = d;
    }
    if let Some(d) = args.cdc_stopped {
        opts.cdc_stopped = d;
    }
    anyhow::ensure!(
        opts.history_rows == 0
            || (opts.history_window > Duration::ZERO
                && opts.history_duration >= opts.history_window),
        "--history-window must be above zero and at most --history-duration"
    );
    anyhow::ensure!(
        opts.relays.iter().chain(&opts.producers).all(|n| *n > 0) && opts.rate > 0,
        "--relays, --producers and --rate must be above zero"
    );
    anyhow::ensure!(
        opts.soak_events == 0 || opts.soak_window > 0,
        "--soak-window must be above zero"
    );
    let report = run_bench(&opts).await.context("benchmark failed")?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.table());
    }
    Ok(ExitCode::SUCCESS)
}
