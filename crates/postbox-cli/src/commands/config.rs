//! `postbox config`: the effective configuration and where each value comes from.

use std::process::ExitCode;

use crate::config::{KEYS, Loaded};
use crate::database::DEFAULT_SQLITE_FILE;
use crate::sinks::{self, SinkPlan};

/// Prints every key with its effective value (passwords hidden) and its source.
pub(crate) fn run(loaded: &Loaded) -> anyhow::Result<ExitCode> {
    let values = serde_json::to_value(&loaded.config)?;
    println!("# effective configuration (flag > POSTBOX_* > postbox.toml > built-in default)");
    let width = KEYS.iter().map(|k| k.key.len()).max().unwrap_or(0);
    for k in KEYS {
        let c = &loaded.config;
        let value = match k.key {
            // Shown through their redacting Display, never raw.
            "database_url" => c.database_url.as_ref().map_or_else(
                || format!("(unset: SQLite file {DEFAULT_SQLITE_FILE})"),
                |url| format!("{:?}", url.to_string()),
            ),
            "sink_url" => c.sink_url.as_ref().map_or_else(
                || "(unset: the broker's default)".to_owned(),
                |url| format!("{:?}", url.to_string()),
            ),
            "webhook_secret" => c
                .webhook_secret
                .as_ref()
                .map_or_else(|| "(unset)".to_owned(), |_| "\"***\" (set)".to_owned()),
            key => values
                .get(key)
                .map_or_else(|| "(unset)".to_owned(), ToString::to_string),
        };
        println!("{:<width$} = {value}  # {}", k.key, loaded.source_of(k.key));
    }
    print_routes(loaded);
    Ok(ExitCode::SUCCESS)
}

/// The routing tables, summarized: sink kinds and addresses (passwords hidden, never a secret),
/// and each route.
fn print_routes(loaded: &Loaded) {
    let c = &loaded.config;
    if c.sinks.is_empty() && c.routes.is_empty() {
        return;
    }
    let Ok(SinkPlan::Routed(plan)) = sinks::plan(c) else {
        println!("# [[routes]] are configured but not used: `sink` is set");
        return;
    };
    println!("# routing ({})", loaded.source_of("routes"));
    for (name, spec) in &plan.sinks {
        println!("#   sinks.{name}: {} {}", spec.kind(), spec.address());
    }
    for name in &plan.unused {
        println!("#   sinks.{name}: used by no route");
    }
    for route in plan.routes.iter().chain(&plan.default_route) {
        println!(
            "#   {}: event_type {:?}, aggregate_type {:?} -> sink {:?}, topic {:?}",
            route.label,
            route.event_type.as_ref().map_or("*", |g| g.as_str()),
            route
                .aggregate_type
                .as_ref()
                .map_or("(any)", |g| g.as_str()),
            route.sink,
            route.shown_topic(),
        );
    }
    if plan.default_route.is_none() {
        println!("#   unmatched events: FAILED (routing.unmatched = \"fail\")");
    }
}
