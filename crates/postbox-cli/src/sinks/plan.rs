//! Where the relay publishes, as configured: one sink (the keys `sink`, `sink_url`, `topic`,
//! `exchange`, `webhook_secret`), or named sinks (`[sinks.NAME]`) with ordered routes
//! (`[[routes]]`, `[routing]`). Read and checked when the configuration loads, before anything
//! connects; every error names the key, table or rule it is about.

use std::collections::BTreeMap;

use postbox_sinks::{Glob, Template};
use serde::Deserialize;

use super::spec::{SingleKeys, SinkSpec, hide};
use crate::config::{Config, RawTable, SecretUrl, SinkKind, show};

/// The sinks of the relay.
#[derive(Debug)]
pub(crate) enum SinkPlan {
    /// One sink takes every event.
    Single(SinkSpec),
    /// Routes send each event to the sinks that match it.
    Routed(RoutePlan),
}

/// Named sinks and the routes between them.
#[derive(Debug)]
pub(crate) struct RoutePlan {
    /// The sinks some route uses, by name.
    pub(crate) sinks: BTreeMap<String, SinkSpec>,
    /// Sinks defined but used by no route (not opened).
    pub(crate) unused: Vec<String>,
    /// The routes, in order.
    pub(crate) routes: Vec<RouteSpec>,
    /// Where unmatched events go; `None`: they fail.
    pub(crate) default_route: Option<RouteSpec>,
}

/// One route, checked.
#[derive(Clone, Debug)]
pub(crate) struct RouteSpec {
    /// `routes[i]`, or `routing.default_route`.
    pub(crate) label: String,
    /// Glob over the event type.
    pub(crate) event_type: Option<Glob>,
    /// Glob over the aggregate type.
    pub(crate) aggregate_type: Option<Glob>,
    /// The sink's name.
    pub(crate) sink: String,
    /// The destination; `None`: the sink's own.
    pub(crate) topic: Option<Template>,
}

impl RouteSpec {
    /// The topic for logs and `postbox config`: a URL's password hidden.
    pub(crate) fn shown_topic(&self) -> String {
        self.topic.as_ref().map_or_else(
            || "(the sink's own)".to_owned(),
            |t| SecretUrl::from(t.as_str()).to_string(),
        )
    }
}

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

/// `[[routes]]` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RouteTable {
    #[serde(default)]
    event_type: Option<Glob>,
    #[serde(default)]
    aggregate_type: Option<Glob>,
    sink: String,
    #[serde(default)]
    topic: Option<Template>,
}

/// `[routing]` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RoutingTable {
    #[serde(default)]
    unmatched: UnmatchedPolicy,
    #[serde(default)]
    default_route: Option<DefaultRouteTable>,
}

#[derive(Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum UnmatchedPolicy {
    #[default]
    Fail,
    Default,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DefaultRouteTable {
    sink: String,
    #[serde(default)]
    topic: Option<Template>,
}

/// The plan of `config`: routes when `[[routes]]` (or `[sinks]`, `[routing]`) are configured and
/// `sink` is not set, else the one sink of the single-sink keys (stdout by default).
pub(crate) fn plan(config: &Config) -> Result<SinkPlan, PlanError> {
    let tables = !config.routes.is_empty() || !config.sinks.is_empty() || config.routing.is_some();
    if config.sink.is_some() || !tables {
        let keys = SingleKeys {
            kind: config.sink.unwrap_or(SinkKind::Stdout),
            sink_url: config.sink_url.as_ref(),
            topic: config.topic.as_ref(),
            exchange: config.exchange.as_deref(),
            webhook_secret: config.webhook_secret.as_ref(),
            relay_publish_timeout: config.publish_timeout,
        };
        return SinkSpec::from_keys(&keys)
            .map(SinkPlan::Single)
            .map_err(|(key, message)| PlanError::new(key, message));
    }
    routed(config).map(SinkPlan::Routed)
}

fn routed(config: &Config) -> Result<RoutePlan, PlanError> {
    let single_keys = [
        ("sink_url", config.sink_url.is_some(), "`url`"),
        ("topic", config.topic.is_some(), "each route's `topic`"),
        ("exchange", config.exchange.is_some(), "`exchange`"),
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
    if config.routes.is_empty() {
        return Err(PlanError::new(
            "sinks",
            "[sinks] or [routing] are configured but no [[routes]] send events anywhere; add \
             [[routes]] (or use `sink` for a single sink)",
        ));
    }
    let relay_timeout = config.publish_timeout;
    let mut defined = BTreeMap::new();
    for (name, table) in &config.sinks {
        let key = format!("sinks.{name}");
        let (spec, explicit_timeout) =
            SinkSpec::from_table(&table.0, relay_timeout).map_err(|e| PlanError::new(&key, e))?;
        if explicit_timeout
            && let Some(timeout) = spec.publish_timeout()
            && (timeout >= relay_timeout || timeout.is_zero())
        {
            return Err(PlanError::new(
                &key,
                format!(
                    "publish_timeout ({}) must be above zero and shorter than the relay's \
                     publish_timeout ({}), so that the sink gives up first, with its own error; \
                     lower it or raise the relay's",
                    show(timeout),
                    show(relay_timeout)
                ),
            ));
        }
        defined.insert(name.clone(), spec);
    }
    let mut routes = Vec::with_capacity(config.routes.len());
    for (i, table) in config.routes.iter().enumerate() {
        let label = format!("routes[{i}]");
        let RouteTable {
            event_type,
            aggregate_type,
            sink,
            topic,
        } = parse_table(table, &label)?;
        check_target(&defined, &label, &sink, topic.as_ref())?;
        routes.push(RouteSpec {
            label,
            event_type,
            aggregate_type,
            sink,
            topic,
        });
    }
    let routing = match &config.routing {
        Some(table) => parse_table(table, "routing")?,
        None => RoutingTable {
            unmatched: UnmatchedPolicy::Fail,
            default_route: None,
        },
    };
    let label = "routing.default_route";
    let default_route = match (routing.unmatched, routing.default_route) {
        (UnmatchedPolicy::Fail, None) => None,
        (UnmatchedPolicy::Fail, Some(_)) => {
            return Err(PlanError::new(
                label,
                "is set but routing.unmatched is \"fail\"; set unmatched = \"default\" to send \
                 unmatched events to it",
            ));
        }
        (UnmatchedPolicy::Default, None) => {
            return Err(PlanError::new(
                "routing.unmatched",
                "is \"default\" but there is no routing.default_route; add default_route = { \
                 sink = \"…\", topic = \"…\" }",
            ));
        }
        (UnmatchedPolicy::Default, Some(DefaultRouteTable { sink, topic })) => {
            check_target(&defined, label, &sink, topic.as_ref())?;
            Some(RouteSpec {
                label: label.to_owned(),
                event_type: None,
                aggregate_type: None,
                sink,
                topic,
            })
        }
    };
    let used: Vec<&str> = routes
        .iter()
        .chain(&default_route)
        .map(|r| r.sink.as_str())
        .collect();
    let (sinks, unused): (BTreeMap<_, _>, BTreeMap<_, _>) = defined
        .into_iter()
        .partition(|(name, _)| used.contains(&name.as_str()));
    Ok(RoutePlan {
        sinks,
        unused: unused.into_keys().collect(),
        routes,
        default_route,
    })
}

/// Deserializes a table, errors named by `label`.
fn parse_table<T: serde::de::DeserializeOwned>(
    table: &RawTable,
    label: &str,
) -> Result<T, PlanError> {
    serde_json::from_value(table.0.clone()).map_err(|e| PlanError::new(label, e.to_string()))
}

/// Checks that a route's sink exists and that it has a destination that sink can take.
fn check_target(
    sinks: &BTreeMap<String, SinkSpec>,
    label: &str,
    sink: &str,
    topic: Option<&Template>,
) -> Result<(), PlanError> {
    let Some(spec) = sinks.get(sink) else {
        let known: Vec<String> = sinks.keys().map(|k| format!("{k:?}")).collect();
        let known = if known.is_empty() {
            "none is defined: add a [sinks.NAME] table".to_owned()
        } else {
            format!("the defined ones are {}", known.join(", "))
        };
        return Err(PlanError::new(
            label,
            format!("sink {sink:?} is not defined; {known}"),
        ));
    };
    match topic {
        Some(topic) => spec.check_destination(topic).map_err(|e| {
            PlanError::new(
                label,
                format!("sink {sink:?}: {}", hide(topic.as_str(), &e)),
            )
        }),
        None if spec.needs_destination() && spec.own_destination().is_none() => {
            Err(PlanError::new(
                label,
                format!(
                    "has no `topic`, and sink {sink:?} ({}) has no `{}` of its own; give the \
                     route a topic, e.g. topic = \"billing.{{aggregate_type}}.{{event_type}}\"",
                    spec.kind(),
                    spec.destination_key()
                ),
            ))
        }
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A configuration with these tables, parsed from TOML as `postbox.toml` would be.
    fn config(toml: &str) -> Config {
        #[derive(Deserialize)]
        struct Tables {
            #[serde(default)]
            sinks: BTreeMap<String, RawTable>,
            #[serde(default)]
            routes: Vec<RawTable>,
            #[serde(default)]
            routing: Option<RawTable>,
        }
        use figment::providers::Format;
        let tables: Tables = figment::Figment::from(figment::providers::Toml::string(toml))
            .extract()
            .expect("toml");
        Config {
            sinks: tables.sinks,
            routes: tables.routes,
            routing: tables.routing,
            ..Config::default()
        }
    }

    fn routed_plan(toml: &str) -> RoutePlan {
        match plan(&config(toml)).expect("valid") {
            SinkPlan::Routed(p) => p,
            SinkPlan::Single(s) => panic!("single {s:?}"),
        }
    }

    fn error(toml: &str) -> PlanError {
        plan(&config(toml)).expect_err("invalid")
    }

    const SINKS: &str = r#"
        [sinks.billing_nats]
        kind = "nats"
        url = "nats://127.0.0.1:4222"
        [sinks.audit_hook]
        kind = "webhook"
        secret = "s3cr3t"
        [sinks.spare]
        kind = "redis"
        stream = "spare"
    "#;

    #[test]
    fn the_documented_example_reads() {
        let plan = routed_plan(&format!(
            r#"{SINKS}
            [[routes]]
            event_type = "Invoice*"
            aggregate_type = "Invoice"
            sink = "billing_nats"
            topic = "billing.{{aggregate_type}}.{{event_type}}"
            [[routes]]
            event_type = "*"
            sink = "audit_hook"
            topic = "https://audit.example/{{event_type}}"
            [routing]
            unmatched = "default"
            default_route = {{ sink = "billing_nats", topic = "unrouted.{{event_type}}" }}
            "#
        ));
        assert_eq!(plan.routes.len(), 2);
        assert_eq!(plan.routes[0].label, "routes[0]");
        assert_eq!(
            plan.routes[0].event_type.as_ref().map(Glob::as_str),
            Some("Invoice*")
        );
        assert_eq!(plan.routes[1].sink, "audit_hook");
        assert_eq!(plan.unused, ["spare"]);
        assert_eq!(plan.sinks.len(), 2);
        let default = plan.default_route.expect("default route");
        assert_eq!(default.label, "routing.default_route");
        assert_eq!(
            default.topic.as_ref().map(Template::as_str),
            Some("unrouted.{event_type}")
        );
        let SinkSpec::Webhook(hook) = &plan.sinks["audit_hook"] else {
            panic!("webhook")
        };
        assert_eq!(hook.secret.as_deref(), Some("s3cr3t"));
        assert_eq!(hook.publish_timeout, Duration::from_secs(5));
    }

    #[test]
    fn a_route_may_use_the_sinks_own_destination_or_stdout() {
        let plan = routed_plan(
            r#"
            [sinks.spare]
            kind = "redis"
            stream = "spare:{event_type}"
            [sinks.out]
            kind = "stdout"
            [[routes]]
            sink = "spare"
            [[routes]]
            sink = "out"
            "#,
        );
        assert!(plan.routes.iter().all(|r| r.topic.is_none()));
        assert!(
            plan.default_route.is_none(),
            "unmatched events fail by default"
        );
    }

    #[test]
    fn mistakes_are_refused_naming_the_rule_or_sink() {
        let cases: Vec<(String, &str, &str)> = vec![
            (
                format!("{SINKS}\n[[routes]]\nsink = \"billing_nats\"\ntopic = \"a\"\n[[routes]]\nsink = \"nope\"\ntopic = \"a\""),
                "routes[1]",
                "\"nope\" is not defined",
            ),
            (
                format!("{SINKS}\n[[routes]]\nevent_type = \"Invoice[0-9]\"\nsink = \"billing_nats\"\ntopic = \"a\""),
                "routes[0]",
                "not supported",
            ),
            (
                format!("{SINKS}\n[[routes]]\nsink = \"billing_nats\"\ntopic = \"a.{{aggregate}}\""),
                "routes[0]",
                "{aggregate}",
            ),
            (
                format!("{SINKS}\n[[routes]]\nsink = \"billing_nats\""),
                "routes[0]",
                "no `subject` of its own",
            ),
            (
                format!("{SINKS}\n[[routes]]\nsink = \"audit_hook\"\ntopic = \"audit.example/x\""),
                "routes[0]",
                "audit_hook",
            ),
            (
                format!("{SINKS}\n[[routes]]\nsink = \"billing_nats\"\ntopik = \"a\""),
                "routes[0]",
                "topik",
            ),
            (
                "[sinks.x]\nkind = \"natz\"\n[[routes]]\nsink = \"x\"".to_owned(),
                "sinks.x",
                "natz",
            ),
            (
                "[sinks.x]\nurl = \"nats://h\"\n[[routes]]\nsink = \"x\"".to_owned(),
                "sinks.x",
                "kind",
            ),
            (
                "[sinks.x]\nkind = \"kafka\"\nurl = \"kafka://k:1\"\nbootstrap_servers = \"k:2\"\n[[routes]]\nsink = \"x\"\ntopic = \"t\"".to_owned(),
                "sinks.x",
                "not both",
            ),
            (
                "[sinks.x]\nkind = \"redis\"\npublish_timeout = \"10s\"\n[[routes]]\nsink = \"x\"\ntopic = \"t\"".to_owned(),
                "sinks.x",
                "shorter than the relay's",
            ),
            (
                "[sinks.x]\nkind = \"stdout\"\n[[routes]]\nsink = \"x\"\ntopic = \"t\"".to_owned(),
                "routes[0]",
                "takes no topic",
            ),
            (
                format!("{SINKS}\n[[routes]]\nsink = \"billing_nats\"\ntopic = \"a\"\n[routing]\nunmatched = \"default\""),
                "routing.unmatched",
                "no routing.default_route",
            ),
            (
                format!("{SINKS}\n[[routes]]\nsink = \"billing_nats\"\ntopic = \"a\"\n[routing]\nunmatched = \"drop\""),
                "routing",
                "drop",
            ),
            (
                format!("{SINKS}\n[[routes]]\nsink = \"billing_nats\"\ntopic = \"a\"\n[routing]\ndefault_route = {{ sink = \"spare\" }}"),
                "routing.default_route",
                "unmatched",
            ),
            (
                format!("{SINKS}\n[[routes]]\nsink = \"billing_nats\"\ntopic = \"a\"\n[routing]\nunmatched = \"default\"\ndefault_route = {{ sink = \"gone\", topic = \"x\" }}"),
                "routing.default_route",
                "\"gone\" is not defined",
            ),
            (SINKS.to_owned(), "sinks", "no [[routes]]"),
        ];
        for (toml, key, text) in cases {
            let err = error(&toml);
            assert_eq!(err.key, key, "{toml}\n{err:?}");
            assert!(err.message.contains(text), "{toml}\n{err:?}");
        }
        assert_eq!(
            error(&format!("{SINKS}\n[[routes]]\nsink = \"x\"")).lookup,
            "routes"
        );
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
            matches!(plan(&c), Ok(SinkPlan::Single(SinkSpec::Null))),
            "`sink` (a flag, by the time it gets here) wins over the routes"
        );
    }

    #[test]
    fn without_sinks_or_routes_the_relay_prints_to_stdout() {
        assert!(matches!(
            plan(&Config::default()),
            Ok(SinkPlan::Single(SinkSpec::Stdout))
        ));
    }
}
