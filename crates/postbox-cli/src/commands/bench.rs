//! `postbox bench`: runs the benchmarks of `postbox-bench` and prints their report.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use postbox_bench::{BenchOptions, run as run_bench};

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
    if let Some(t) = &args.tenants {
        opts.tenants = t.iter().copied().filter(|n| *n > 0).collect();
    }
    if let Some(r) = &args.tenant_rates {
        opts.tenant_rates = r.clone();
    }
    if let Some(d) = args.tenant_duration {
        opts.tenant_duration = d;
    }
    if let Some(d) = args.tenant_warmup {
        opts.tenant_warmup = d;
    }
    if let Some(d) = args.tenant_idle {
        opts.tenant_idle = d;
    }
    if let Some(n) = args.tenant_backlog {
        opts.tenant_backlog = n;
    }
    if let Some(r) = &args.tenant_relays {
        opts.tenant_relays = r.clone();
    }
    anyhow::ensure!(
        opts.tenant_rates.iter().all(|r| *r > 0) && opts.tenant_relays.iter().all(|n| *n > 0),
        "--tenant-rates and --tenant-relays must be above zero"
    );
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

/// `postbox bench`.
#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    /// Tiny scale, finishes in seconds (a smoke test; its figures mean nothing)
    #[arg(long)]
    pub(crate) quick: bool,

    /// Print the report as JSON instead of a table
    #[arg(long)]
    pub(crate) json: bool,

    /// Events preloaded for each drain and ceiling run [default: 100000; quick: 2000]
    #[arg(long, value_name = "N")]
    pub(crate) events: Option<u64>,

    /// Relay counts to drain with, comma-separated [default: 1,4]
    #[arg(long, value_name = "N,N", value_delimiter = ',')]
    pub(crate) relays: Option<Vec<usize>>,

    /// Producer counts for the enqueue overhead, comma-separated [default: 1,8]
    #[arg(long, value_name = "N,N", value_delimiter = ',')]
    pub(crate) producers: Option<Vec<usize>>,

    /// Producer rate of the latency runs, events/s [default: 2000; quick: 500]
    #[arg(long, value_name = "EVENTS_PER_SEC")]
    pub(crate) rate: Option<u64>,

    /// How long each latency run produces [default: 10s; quick: 500ms]
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub(crate) latency_duration: Option<Duration>,

    /// How long each enqueue-overhead measurement runs [default: 5s; quick: 300ms]
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub(crate) enqueue_duration: Option<Duration>,

    /// Business rows (one INSERT each) in each business transaction of the enqueue overhead
    /// [default: 1, the smallest transaction]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) business_statements: Option<u32>,

    /// Aggregate counts of the ordering phase, comma-separated, 0 to skip it: --events spread
    /// over that many aggregates, drained with and without ordering [default: 10000,100;
    /// quick: 1000,10]
    #[arg(long, value_name = "N,N", value_delimiter = ',')]
    pub(crate) ordered_aggregates: Option<Vec<u64>>,

    /// Events of the soak, 0 to skip it [default: 1000000; quick: 4000]
    #[arg(long, value_name = "N")]
    pub(crate) soak_events: Option<u64>,

    /// Events per soak window [default: 100000; quick: 1000]
    #[arg(long, value_name = "N")]
    pub(crate) soak_window: Option<u64>,

    /// Processed events in the table at the start of the history phase, 0 to skip it
    /// (PostgreSQL; on MySQL any other value runs its held-transaction drain) [default: 1000000;
    /// quick: 20000]
    #[arg(long, value_name = "N")]
    pub(crate) history_rows: Option<u64>,

    /// How long the history phase runs [default: 5m; quick: 6s]
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub(crate) history_duration: Option<Duration>,

    /// Producer rate of the history phase, events/s [default: 1000; quick: 200]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) history_rate: Option<u64>,

    /// Measurement window of the history phase [default: 30s; quick: 2s]
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub(crate) history_window: Option<Duration>,

    /// Events in each backlog of the CDC comparison, 0 to skip it (PostgreSQL; needs
    /// wal_level = logical, else the report says why it was not measured) [default: 500000;
    /// quick: 2000]
    #[arg(long, value_name = "N")]
    pub(crate) cdc_events: Option<u64>,

    /// Producer rate of the CDC comparison's latency runs, events/s [default: 1000; quick: 200]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) cdc_rate: Option<u64>,

    /// How long the CDC comparison watches the slot's WAL (how far it trails, what the server
    /// keeps) while 20 other tables churn; then as long again with a producer transaction held
    /// open [default: 1m; quick: 3s]
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub(crate) cdc_churn: Option<Duration>,

    /// How long the CDC relay then stays stopped while they churn on [default: 30s; quick: 1s]
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub(crate) cdc_stopped: Option<Duration>,

    /// Tenant counts of the tenants phase, comma-separated, 0 to skip it (PostgreSQL): that many
    /// tenant schemas, plain-SQL producers committing into random ones, relays with defaults
    /// [default: 1000; quick: 20]
    #[arg(long, value_name = "N,N", value_delimiter = ',')]
    pub(crate) tenants: Option<Vec<usize>>,

    /// Producer rates of the tenants phase, events/s, comma-separated; the first is also the
    /// rate of its slow-destination and backlog runs [default: 50,1000; quick: 50]
    #[arg(long, value_name = "N,N", value_delimiter = ',')]
    pub(crate) tenant_rates: Option<Vec<u64>>,

    /// How long each latency run of the tenants phase produces [default: 20s; quick: 1s]
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub(crate) tenant_duration: Option<Duration>,

    /// How long each latency run of the tenants phase produces before it measures: a relay
    /// that has run a while, whose connections have met the tenants' tables (statements
    /// prepared, functions compiled); one more run measures a relay from its start, 0 measures
    /// every run from the start [default: 30s; quick: 500ms]
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub(crate) tenant_warmup: Option<Duration>,

    /// How long the tenants phase watches an idle relay's CPU [default: 20s; quick: 500ms]
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub(crate) tenant_idle: Option<Duration>,

    /// Events of one tenant's backlog beside which the others' latency is measured, 0 to skip
    /// that run [default: 1000000; quick: 2000]
    #[arg(long, value_name = "N")]
    pub(crate) tenant_backlog: Option<u64>,

    /// Relay counts of the tenants phase's latency runs, comma-separated [default: 1,2; quick: 1]
    #[arg(long, value_name = "N,N", value_delimiter = ',')]
    pub(crate) tenant_relays: Option<Vec<usize>>,

    /// Relay and ceiling batch size [config: batch_size; default: 100]
    #[arg(long, value_name = "N")]
    pub(crate) batch_size: Option<u32>,

    /// Dead rows that make the relays vacuum the outbox table, 0 for never [config:
    /// vacuum_threshold; default: 50000]
    #[arg(long, value_name = "N")]
    pub(crate) vacuum_threshold: Option<u64>,
}

#[cfg(test)]
mod tests {
    use crate::cli::{Cli, Command};
    use clap::Parser;

    #[test]
    fn bench_takes_a_vacuum_threshold() {
        let cli = Cli::try_parse_from(["postbox", "bench", "--quick", "--vacuum-threshold", "0"])
            .expect("parses");
        match cli.command {
            Command::Bench(a) => {
                assert!(a.quick);
                assert_eq!(a.vacuum_threshold, Some(0));
            }
            other => panic!("unexpected {other:?}"),
        }
        match Cli::try_parse_from(["postbox", "bench"])
            .expect("parses")
            .command
        {
            Command::Bench(a) => assert_eq!(a.vacuum_threshold, None),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn bench_business_statements_are_at_least_one() {
        match Cli::try_parse_from(["postbox", "bench", "--business-statements", "3"])
            .expect("parses")
            .command
        {
            Command::Bench(a) => assert_eq!(a.business_statements, Some(3)),
            other => panic!("unexpected {other:?}"),
        }
        let err = Cli::try_parse_from(["postbox", "bench", "--business-statements", "0"])
            .expect_err("zero statements is no business transaction");
        assert!(err.to_string().contains("--business-statements"), "{err}");
    }
}
