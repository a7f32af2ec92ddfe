//! The configuration's range and consistency checks that its types cannot express.

use anyhow::{Context, anyhow};

use super::{DatabaseUrl, Loaded};
use crate::database::Location;

/// Range and consistency checks the types cannot express; errors name the key and its source.
pub(super) fn validate(loaded: &Loaded) -> anyhow::Result<()> {
    let c = &loaded.config;
    let bad = |key: &str, msg: String| -> anyhow::Result<()> {
        Err(anyhow!(
            "invalid configuration key `{key}` (set by {}): {msg}",
            loaded.source_of(key)
        ))
    };
    // The relay's own rules (batch size, intervals, lease and publish timeout, concurrency,
    // backoff, retry policies), checked where they are defined; the error names the key.
    if let Err(postbox::Error::InvalidConfig { field, reason }) = c.relay_config().validate() {
        // Where the key it is checked against was set, too.
        let related = match field {
            "publish_timeout" => Some("lease"),
            "busy_poll_interval" | "head_poll_interval" => Some("poll_interval"),
            "backoff_cap" => Some("backoff_base"),
            _ => None,
        };
        return match related {
            Some(other) => bad(
                field,
                format!("{reason} ({other} is set by {})", loaded.source_of(other)),
            ),
            None => bad(field, reason),
        };
    }
    if i32::try_from(c.max_retries).is_err() {
        return bad("max_retries", format!("{} is too large", c.max_retries));
    }
    if c.payload_limit.0 == 0 {
        return bad("payload_limit", "must be above zero".into());
    }
    if let Err(e) = tracing_subscriber::EnvFilter::try_new(&c.log_level) {
        return bad(
            "log_level",
            format!("{:?} is not a log filter: {e}", c.log_level),
        );
    }
    if let Err(e) = Location::parse(c.database_url.as_ref().map(DatabaseUrl::expose)) {
        return bad("database_url", format!("{e:#}"));
    }
    for url in &c.database_urls {
        if let Err(e) = Location::parse(Some(url.expose())) {
            return bad("database_urls", format!("{e:#}"));
        }
    }
    let mut shown: Vec<String> = c.database_urls.iter().map(|u| u.to_string()).collect();
    shown.sort();
    if shown.windows(2).any(|w| w[0] == w[1]) {
        return bad(
            "database_urls",
            "lists a database twice; each database is served once".to_owned(),
        );
    }
    if let Some(token) = &c.admin_token
        && let Err(e) = postbox_admin::Token::new(token.expose())
    {
        return bad("admin_token", e.to_string());
    }
    if let Some(addr) = c.admin_listen
        && !addr.ip().is_loopback()
        && c.admin_token.is_none()
    {
        return bad(
            "admin_listen",
            format!(
                "{addr} is not a loopback address, and admin_token is not set: anyone who can \
                 reach it could act on events; set POSTBOX_ADMIN_TOKEN, or listen on 127.0.0.1"
            ),
        );
    }
    if let Err(e) = postbox_admin::alerts::Alerts::new(c.alert_config()) {
        let key = if c.alert_max_per_hour == 0 {
            "alert_max_per_hour"
        } else {
            "alert_webhook"
        };
        return bad(key, e.to_string());
    }
    if c.alert_sink_down_after.is_zero() {
        return bad("alert_sink_down_after", "must be above zero".into());
    }
    if c.alert_repeat_after.is_zero() {
        return bad("alert_repeat_after", "must be above zero".into());
    }
    c.relay_config()
        .validate()
        .context("invalid relay configuration")?;
    if c.sink.is_some() && !c.routes.is_empty() && !loaded.source_of("sink").starts_with("--") {
        return bad(
            "sink",
            "is set, and so are [[routes]]; use one: `sink` (with sink_url, topic) for a single \
             sink, or [[routes]] with [sinks.NAME] tables (a --sink flag overrides the routes)"
                .into(),
        );
    }
    Ok(())
}
