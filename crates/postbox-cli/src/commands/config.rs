//! `postbox config`: the effective configuration and where each value comes from.

use std::process::ExitCode;

use crate::config::{KEYS, Loaded};
use crate::database::DEFAULT_SQLITE_FILE;

/// Prints every key with its effective value (passwords hidden) and its source.
pub(crate) fn run(loaded: &Loaded) -> anyhow::Result<ExitCode> {
    let values = serde_json::to_value(&loaded.config)?;
    println!("# effective configuration (flag > POSTBOX_* > postbox.toml > built-in default)");
    let width = KEYS.iter().map(|k| k.key.len()).max().unwrap_or(0);
    for k in KEYS {
        let value = match (k.key, &loaded.config.database_url) {
            // Shown through its redacting Display, never raw.
            ("database_url", Some(url)) => format!("{:?}", url.to_string()),
            ("database_url", None) => format!("(unset: SQLite file {DEFAULT_SQLITE_FILE})"),
            (key, _) => values
                .get(key)
                .map_or_else(|| "(unset)".to_owned(), ToString::to_string),
        };
        println!("{:<width$} = {value}  # {}", k.key, loaded.source_of(k.key));
    }
    Ok(ExitCode::SUCCESS)
}
