//! Where the relay publishes, from the configuration: the single-sink keys (`sink`, `sink_url`,
//! `topic`, `exchange`, `webhook_secret`) or the routing tables (`[sinks.NAME]`, `[[routes]]`,
//! `[routing]`). `postbox-sinks` checks and opens them; this module reads the configuration
//! into them and names, in every error, the key, table or rule it is about.

mod args;

use anyhow::{Context, anyhow};
use postbox_sinks::cloudevents::Origin;
use postbox_sinks::{ConfigError, Opened, RoutingConfig, SingleSink, SinkConfig, SinkSetup};

pub(crate) use args::SinkArgs;

use crate::config::{Config, Loaded, SinkKind};

/// The sinks of the relay, as configured.
pub(crate) type SinkPlan = SinkSetup;

/// A configuration mistake, and where it is.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct PlanError {
    /// What to name in the message: a key (`topic`), a table (`sinks.audit`) or a rule
    /// (`routes[2]`).
    pub(crate) key: String,
    /// The key to look its source up by (`routes` for `routes[2]`).
    pub(crate) lookup: String,
    /// What is wrong, and what to do.
    pub(crate) message: String,
}

impl From<ConfigError> for PlanError {
    /// The mistake the sinks' configuration found, at the key, table or rule it names.
    fn from(e: ConfigError) -> PlanError {
        PlanError::new(e.at, e.message)
    }
}

impl PlanError {
    fn new(key: impl Into<String>, message: impl Into<String>) -> PlanError {
        let key = key.into();
        PlanError {
            lookup: key.split('[').next().unwrap_or_default().to_owned(),
            key,
            message: message.into(),
        }
    }
}

/// The plan of `config`: routes when `[[routes]]` (or `[sinks]`, `[routing]`) are configured and
/// `sink` is not set, else the one sink of the single-sink keys (stdout by default).
pub(crate) fn plan(config: &Config) -> Result<SinkPlan, PlanError> {
    let plan = unchecked_plan(config)?;
    plan.check_ordering(&config.ordered_aggregate_types)
        .map_err(PlanError::from)?;
    Ok(plan)
}

/// The sinks and routes of `config`, before the ordering check.
fn unchecked_plan(config: &Config) -> Result<SinkPlan, PlanError> {
    let routing = RoutingConfig {
        sinks: config
            .sinks
            .iter()
            .map(|(name, table)| (name.clone(), table.0.clone()))
            .collect(),
        routes: config.routes.iter().map(|t| t.0.clone()).collect(),
        routing: config.routing.as_ref().map(|t| t.0.clone()),
    };
    if config.sink.is_some() || routing.is_empty() {
        return single(config).map(|c| SinkSetup::Single(Box::new(c)));
    }
    let single_keys = [
        ("sink_url", config.sink_url.is_some(), "`url`"),
        ("topic", config.topic.is_some(), "each route's `topic`"),
        ("exchange", config.exchange.is_some(), "`exchange`"),
        ("sink_format", config.sink_format.is_some(), "`format`"),
        (
            "webhook_secret",
            config.webhook_secret.is_some(),
            "`secret`",
        ),
    ];
    for (key, set, instead) in single_keys {
        if set {
            return Err(PlanError::new(
                key,
                format!(
                    "is only used with `sink` (one sink for every event); with [[routes]], give \
                     {instead} in the [sinks.NAME] table or route instead"
                ),
            ));
        }
    }
    routing
        .check(config.publish_timeout)
        .map(|routes| SinkSetup::Routed(Box::new(routes)))
        .map_err(PlanError::from)
}

/// The sink of the single-sink keys. The keys that do not apply to the kind, and the ones it
/// cannot do without, are named here, with the flags that set them.
fn single(config: &Config) -> Result<SinkConfig, PlanError> {
    let kind = config.sink.unwrap_or(SinkKind::Stdout);
    let unused = |key: &'static str, what: &str| -> Result<(), PlanError> {
        Err(PlanError::new(
            key,
            format!("is not used by the {kind} sink ({what})"),
        ))
    };
    let takes_destinations = kind.destination_key().is_some();
    if config.exchange.is_some() && kind.name() != "amqp" {
        unused("exchange", "only the amqp sink has an exchange")?;
    }
    if config.webhook_secret.is_some() && kind.name() != "webhook" {
        unused("webhook_secret", "only the webhook sink signs its requests")?;
    }
    if config.sink_format.is_some() && !takes_destinations {
        unused("sink_format", "it writes its own shape")?;
    }
    if config.sink_url.is_some() && !takes_destinations {
        unused("sink_url", "it has no address")?;
    }
    if config.topic.is_some() && !takes_destinations {
        unused("topic", "it has no destinations")?;
    }
    if kind.name() == "webhook" {
        if config.topic.is_some() {
            unused(
                "topic",
                "the webhook URL is the destination: put placeholders in sink_url, e.g. \
                 https://hooks.example.com/{event_type}",
            )?;
        }
        if config.sink_url.is_none() {
            return Err(PlanError::new(
                "sink_url",
                "is required with the webhook sink: the endpoint, e.g. --sink-url \
                 'https://hooks.example.com/{event_type}' (placeholders allowed)",
            ));
        }
    } else if takes_destinations && config.topic.is_none() {
        return Err(PlanError::new(
            "topic",
            format!(
                "is required with the {kind} sink: the {} template, e.g. --topic '{}'",
                kind.destination_name(),
                kind.example_destination()
            ),
        ));
    }
    SinkConfig::from_single(&SingleSink {
        kind,
        url: config.sink_url.as_ref().map(|u| u.expose()),
        topic: config.topic.as_ref().map(|t| t.as_str()),
        exchange: config.exchange.as_deref(),
        webhook_secret: config.webhook_secret.as_ref().map(|s| s.expose()),
        format: config.sink_format,
        relay_publish_timeout: config.publish_timeout,
    })
    .map_err(PlanError::from)
}

/// Opens the planned sinks, for the outbox of `origin` (the default CloudEvents `source`; none
/// when they serve several databases).
pub(crate) async fn open(plan: SinkPlan, origin: Option<Origin>) -> anyhow::Result<Opened> {
    let kind = match &plan {
        SinkSetup::Single(config) => format!("the {} sink", config.kind()),
        _ => "the sinks".to_owned(),
    };
    plan.open_for(origin)
        .await
        .with_context(|| format!("cannot start {kind}"))
}

/// Checks the sinks and routes of `loaded` as a relay would open them, before anything
/// connects; errors name the key (or table, or rule) and where its value was set.
pub(crate) fn check(loaded: &Loaded) -> anyhow::Result<()> {
    let c = &loaded.config;
    if let Err(e) = plan(c) {
        let what = if e.key.contains(['.', '[']) || e.key == "sinks" {
            format!("`{}`", e.key)
        } else {
            format!("key `{}`", e.key)
        };
        return Err(anyhow!(
            "invalid configuration {what} (set by {}): {}",
            loaded.source_of(&e.lookup),
            e.message
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::Deserialize;

    use super::*;
    use crate::config::RawTable;

    const SINKS: &str = r#"
        [sinks.billing_nats]
        kind = "nats"
        url = "nats://127.0.0.1:4222"
        [sinks.audit_hook]
        kind = "webhook"
        secret = "s3cr3t"
    "#;

    /// A configuration with these tables, parsed from TOML as `postbox.toml` would be.
    fn config(toml: &str) -> Config {
        #[derive(Deserialize)]
        struct Tables {
            #[serde(default)]
            sinks: BTreeMap<String, RawTable>,
            #[serde(default)]
            routes: Vec<RawTable>,
        }
        use figment::providers::Format;
        let tables: Tables = figment::Figment::from(figment::providers::Toml::string(toml))
            .extract()
            .expect("toml");
        Config {
            sinks: tables.sinks,
            routes: tables.routes,
            ..Config::default()
        }
    }

    #[test]
    fn single_sink_keys_do_not_mix_with_routes() {
        let mut c = config(&format!(
            "{SINKS}\n[[routes]]\nsink = \"billing_nats\"\ntopic = \"a\""
        ));
        c.topic = Some("x".parse().expect("template"));
        assert_eq!(plan(&c).expect_err("mixed").key, "topic");
        c.topic = None;
        c.sink = Some(SinkKind::Null);
        assert!(
            matches!(plan(&c), Ok(SinkSetup::Single(s)) if s.kind() == SinkKind::Null),
            "`sink` (a flag, by the time it gets here) wins over the routes"
        );
        assert_eq!(
            plan(&config(&format!("{SINKS}\n[[routes]]\nsink = \"x\"")))
                .expect_err("unknown sink")
                .lookup,
            "routes"
        );
    }

    #[test]
    fn without_sinks_or_routes_the_relay_prints_to_stdout() {
        assert!(matches!(
            plan(&Config::default()),
            Ok(SinkSetup::Single(s)) if s.kind() == SinkKind::Stdout
        ));
    }

    #[test]
    fn single_keys_that_do_not_apply_are_refused_by_name() {
        let with = |f: &dyn Fn(&mut Config)| {
            let mut c = Config::default();
            f(&mut c);
            plan(&c).expect_err("refused").key
        };
        let kind = |name: &str| Some(name.parse::<SinkKind>().expect("kind"));
        assert_eq!(with(&|c| c.sink = kind("nats")), "topic");
        assert_eq!(with(&|c| c.sink = kind("webhook")), "sink_url");
        assert_eq!(
            with(&|c| {
                c.sink = kind("nats");
                c.exchange = Some("billing".into());
            }),
            "exchange"
        );
        assert_eq!(
            with(&|c| {
                c.sink = kind("webhook");
                c.sink_url = Some("http://h/x".into());
                c.topic = Some("x".parse().expect("template"));
            }),
            "topic"
        );
        assert_eq!(
            with(&|c| c.sink_url = Some("http://h/x".into())),
            "sink_url"
        );
        assert_eq!(
            with(&|c| {
                c.sink = kind("webhook");
                c.sink_url = Some("ftp://h/{event_type}".into());
            }),
            "sink_url"
        );
    }

    #[test]
    fn an_ordering_the_sinks_cannot_honour_is_refused_with_the_reason() {
        let nats = |topic: &str, ordered: &[&str]| {
            let c = Config {
                sink: Some("nats".parse().expect("kind")),
                topic: Some(topic.parse().expect("template")),
                ordered_aggregate_types: ordered.iter().map(|s| (*s).to_owned()).collect(),
                ..Config::default()
            };
            plan(&c)
        };
        let e = nats("billing.{event_type}", &["Invoice"]).expect_err("refused");
        assert_eq!(e.key, "ordered_aggregate_types");
        assert!(e.message.contains("{event_type}"), "{}", e.message);
        assert!(nats("billing.{aggregate_type}", &["Invoice"]).is_ok());
        assert!(nats("billing.{event_type}", &[]).is_ok());

        let mut routed = config(
            r#"
            [sinks.bus]
            kind = "nats"
            [[routes]]
            aggregate_type = "Customer"
            sink = "bus"
            topic = "crm.{event_type}"
            [[routes]]
            aggregate_type = "Inv*"
            sink = "bus"
            topic = "billing.{event_type}"
            "#,
        );
        routed.ordered_aggregate_types = vec!["Invoice".to_owned()];
        let e = plan(&routed).expect_err("refused");
        assert!(e.message.contains("routes[1]"), "{}", e.message);
    }
}
