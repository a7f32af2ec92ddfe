//! `postbox`: the transactional outbox relay daemon and its admin commands.
//!
//! `main` parses the command line, builds the runtime and maps the outcome to an exit status;
//! everything else lives in the modules below.

mod cli;
mod commands;
mod config;
mod database;
mod logging;
mod shutdown;
mod sinks;

use std::process::ExitCode;

use clap::Parser;

/// Parses the command line, runs the command, prints an error (with its causes) to stderr.
fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("cannot start the tokio runtime");
    match runtime.block_on(commands::run(cli)) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {}", describe(&error));
            ExitCode::FAILURE
        }
    }
}

/// An error with its causes, `: `-separated, leaving out a cause whose text an outer message
/// already repeats (sqlx and figment often include their source in their own message), and
/// ending in what to do about it with this command line, where the library's error says what
/// is wrong without naming commands.
pub(crate) fn describe(error: &anyhow::Error) -> String {
    let mut text = causes(error);
    let hint = error
        .chain()
        .find_map(|cause| match cause.downcast_ref::<postbox::Error>()? {
            postbox::Error::NotMigrated { .. } => Some("run `postbox migrate`".to_owned()),
            postbox::Error::UnknownTenant(id) => {
                Some(format!("add it with `postbox tenants add {id}`"))
            }
            _ => None,
        });
    if let Some(hint) = hint {
        text.push_str("; ");
        text.push_str(&hint);
    }
    text
}

fn causes(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let cause = cause.to_string();
        if text.contains(&cause) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&cause);
    }
    text
}
