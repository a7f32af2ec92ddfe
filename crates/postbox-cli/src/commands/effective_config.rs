//! `postbox config`: the effective configuration and where each value comes from.

use std::process::ExitCode;

use clap::Args;

use crate::cli::SchemaArg;
use crate::commands::relay::RelayTuning;
use crate::config::{KEYS, Loaded};
use crate::database::DEFAULT_SQLITE_FILE;
use crate::sinks::SinkArgs;
use crate::sinks::{self, SinkPlan};

/// Prints every key with its effective value (passwords hidden) and its source.
pub(crate) fn run(loaded: &Loaded, event_type: Option<&str>) -> anyhow::Result<ExitCode> {
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
            "database_urls" => format!(
                "[{}]",
                c.database_urls
                    .iter()
                    .map(|url| format!("{:?}", url.to_string()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            "sink_url" => c.sink_url.as_ref().map_or_else(
                || "(unset: the broker's default)".to_owned(),
                |url| format!("{:?}", url.to_string()),
            ),
            "webhook_secret" => c
                .webhook_secret
                .as_ref()
                .map_or_else(|| "(unset)".to_owned(), |_| "\"***\" (set)".to_owned()),
            // A token, and a URL whose path is often the secret (Slack's): never shown.
            "admin_token" => c
                .admin_token
                .as_ref()
                .map_or_else(|| "(unset)".to_owned(), |_| "\"***\" (set)".to_owned()),
            "alert_webhook" => c
                .alert_webhook
                .as_ref()
                .map_or_else(|| "(unset)".to_owned(), |_| "\"***\" (set)".to_owned()),
            key => values
                .get(key)
                .map_or_else(|| "(unset)".to_owned(), ToString::to_string),
        };
        println!("{:<width$} = {value}  # {}", k.key, loaded.source_of(k.key));
    }
    print_routes(loaded);
    print_retry_policies(loaded, event_type);
    Ok(ExitCode::SUCCESS)
}

/// The `[[retry_policies]]`, and which applies to `event_type`.
fn print_retry_policies(loaded: &Loaded, event_type: Option<&str>) {
    let c = &loaded.config;
    let relay = c.relay_config();
    if !c.retry_policies.is_empty() {
        println!(
            "# retry policies ({}), the first match applies",
            loaded.source_of("retry_policies")
        );
        let slow_lane_on =
            relay.dead_letter_retry_interval.is_some() && relay.dead_letter_max_retries > 0;
        for (i, p) in relay.retry_policies.iter().enumerate() {
            let line = describe_policy(
                Some(&p.event_type),
                p.max_retries,
                p.backoff.unwrap_or(relay.retry),
                slow_lane_on && p.slow_lane,
            );
            println!("#   {}: {line}", i + 1);
        }
    }
    if let Some(event_type) = event_type {
        let effective = relay.policy_for(event_type);
        let source = effective.matched.as_ref().map_or_else(
            || "no [[retry_policies]] table matches: the relay's settings".to_owned(),
            |g| format!("[[retry_policies]] event_type = {:?}", g.as_str()),
        );
        println!("# event type {event_type:?}: {source}");
        let line = describe_policy(
            effective.matched.as_ref(),
            effective.max_retries,
            effective.backoff,
            effective.slow_lane,
        );
        println!("#   {line}");
    }
}

/// One line: the glob, the tries, the backoff, the slow lane.
fn describe_policy(
    glob: Option<&postbox::glob::Glob>,
    max_retries: Option<u32>,
    backoff: postbox::backoff::Backoff,
    slow_lane: bool,
) -> String {
    let tries = max_retries.map_or_else(
        || {
            format!(
                "the event's own max_retries (default {})",
                postbox::event::DEFAULT_MAX_RETRIES
            )
        },
        |m| m.to_string(),
    );
    format!(
        "event_type {:?}: tries {tries}, backoff min({}, {} x 2^n), slow lane {}",
        glob.map_or("*", |g| g.as_str()),
        humantime::format_duration(backoff.cap),
        humantime::format_duration(backoff.base),
        if slow_lane { "on" } else { "off" }
    )
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

/// `postbox config`.
#[derive(Debug, Args)]
pub(crate) struct ConfigArgs {
    /// The default schema.
    #[command(flatten)]
    pub(crate) schema: SchemaArg,

    /// The sink, to preview its effect.
    #[command(flatten)]
    pub(crate) sink: SinkArgs,

    /// Relay tuning, to preview its effect.
    #[command(flatten)]
    pub(crate) tuning: RelayTuning,

    /// Also say how events of this type are retried: which [[retry_policies]] table applies,
    /// its tries, backoff and slow lane
    #[arg(long, value_name = "TYPE")]
    pub(crate) event_type: Option<String>,
}
