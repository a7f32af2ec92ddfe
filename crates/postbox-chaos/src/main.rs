//! `postbox-chaos`: a seeded, replayable chaos run against real processes.
//!
//! It starts a PostgreSQL cluster of its own, runs several `postbox relay` processes publishing to
//! Redis Streams through a fault proxy, has producers commit (and roll back) events, and meanwhile
//! kills and pauses relays, restarts PostgreSQL and cuts the broker off, on a schedule drawn from
//! `--seed`. Then it accounts for every event: published, lost, ghost, duplicated, failed.
//!
//! `main` parses the command line, builds the runtime and turns the outcome into an exit status:
//! 0 when every check passed, 1 when a check failed, 2 when the run itself could not be carried
//! out (a service missing, a binary not built).

mod cli;
mod faults;
mod fleet;
mod producers;
mod relay_logs;
mod report;
mod run;
mod schedule;
mod stream;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let args = cli::Args::parse();
    let filter = EnvFilter::try_new(&args.log_level).unwrap_or_else(|_| EnvFilter::new("info"));
    // The database restarts on purpose: sqlx's warnings about it are expected noise.
    let filter = match "sqlx=error".parse() {
        Ok(directive) if !args.log_level.contains("sqlx") => filter.add_directive(directive),
        _ => filter,
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the tokio runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let outcome = runtime.block_on(async {
        tokio::select! {
            outcome = run::run(args) => outcome,
            signal = interrupted() => Err(anyhow::anyhow!("interrupted by {signal}; cleaned up")),
        }
    });
    // Relays still running are killed as their tasks are dropped with the runtime.
    drop(runtime);
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(2)
        }
    }
}

/// Completes on SIGINT or SIGTERM, naming it. Dropping the run future then stops PostgreSQL and
/// removes the run directory (their guards' `Drop`), and the relays die with their tasks.
async fn interrupted() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        let _ = tokio::signal::ctrl_c().await;
        return "SIGINT";
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    }
}
