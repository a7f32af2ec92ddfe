//! Logs: always to stderr, so stdout stays clean for event lines.

use std::io::IsTerminal;

use anyhow::anyhow;
use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Chooses the log filter: `--log-level` if given, else `RUST_LOG` if set, else the configured
/// `log_level` (postbox.toml, `POSTBOX_LOG_LEVEL`, default `info`).
pub(crate) fn filter(flag: Option<&str>, configured: &str) -> String {
    if let Some(flag) = flag {
        return flag.to_owned();
    }
    match std::env::var("RUST_LOG") {
        Ok(env) if !env.trim().is_empty() => env,
        _ => configured.to_owned(),
    }
}

/// Installs the global subscriber writing to stderr.
pub(crate) fn init(filter: &str, format: LogFormat) -> anyhow::Result<()> {
    let filter =
        EnvFilter::try_new(filter).map_err(|e| anyhow!("invalid log filter {filter:?}: {e}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let installed = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        LogFormat::Json => builder.json().with_current_span(false).try_init(),
    };
    installed.map_err(|e| anyhow!("cannot install the logger: {e}"))
}
