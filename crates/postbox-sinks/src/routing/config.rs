//! Routing configuration: named sinks (`[sinks.NAME]`), ordered routes (`[[routes]]`) and what
//! happens to an event no route matches (`[routing]`), as `postbox.toml` writes them. Read into
//! a [`RoutingConfig`], checked into [`Routes`] before anything connects (every error names the
//! table or rule it is about), then opened into a [`Router`].
//!
//! ```
//! # #[cfg(feature = "nats")]
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use postbox_sinks::RoutingConfig;
//!
//! let config: RoutingConfig = serde_json::from_value(serde_json::json!({
//!     "sinks": {"billing": {"kind": "nats", "url": "nats://127.0.0.1:4222"}},
//!     "routes": [{"event_type": "Invoice*", "sink": "billing",
//!                 "topic": "billing.{aggregate_type}.{event_type}"}],
//! }))?;
//! let routes = config.check(Duration::from_secs(10))?;
//! assert_eq!(routes.routes[0].label, "routes[0]");
//! // routes.open().await? gives the Router to hand to a relay.
//! # Ok(()) }
//! # #[cfg(not(feature = "nats"))]
//! # fn main() {}
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use postbox::redact::redact;
use serde::Deserialize;
use serde_json::Value;

use crate::cloudevents::Origin;
use crate::config::{ConfigError, SinkConfig};
use crate::open::{OwnDestination, Shared};
use crate::stdout::StdoutSink;
use crate::{Error, Glob, Result, Route, Router, Template, Unmatched};

/// Named sinks and the routes between them, as written (`[sinks.NAME]`, `[[routes]]`,
/// `[routing]`). The tables are kept as written until [`RoutingConfig::check`], so that errors
/// can name them; its `Debug` shows no values (they may be secrets).
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoutingConfig {
    /// `[sinks.NAME]` tables: `kind` and that kind's keys.
    #[serde(default)]
    pub sinks: BTreeMap<String, Value>,
    /// `[[routes]]` tables, in order: `event_type` and `aggregate_type` globs, `sink`, `topic`.
    #[serde(default)]
    pub routes: Vec<Value>,
    /// The `[routing]` table: `unmatched = "fail"` (default) or `"default"` with a
    /// `default_route = { sink, topic }`.
    #[serde(default)]
    pub routing: Option<Value>,
}

impl std::fmt::Debug for RoutingConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoutingConfig")
            .field("sinks", &self.sinks.keys().collect::<Vec<_>>())
            .field("routes", &self.routes.len())
            .field("routing", &self.routing.is_some())
            .finish()
    }
}

/// Named sinks and the routes between them, checked.
#[derive(Debug)]
#[non_exhaustive]
pub struct Routes {
    /// The sinks some route uses, by name.
    pub sinks: BTreeMap<String, SinkConfig>,
    /// Sinks defined but used by no route (not opened).
    pub unused: Vec<String>,
    /// The routes, in order.
    pub routes: Vec<RouteConfig>,
    /// Where unmatched events go; `None`: they fail.
    pub default_route: Option<RouteConfig>,
}

/// One route, checked.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RouteConfig {
    /// `routes[i]`, or `routing.default_route`.
    pub label: String,
    /// Glob over the event type.
    pub event_type: Option<Glob>,
    /// Glob over the aggregate type.
    pub aggregate_type: Option<Glob>,
    /// The sink's name.
    pub sink: String,
    /// The destination; `None`: the sink's own.
    pub topic: Option<Template>,
}

impl RouteConfig {
    /// The topic for logs and `postbox config`: a URL's secrets hidden.
    pub fn shown_topic(&self) -> String {
        self.topic
            .as_ref()
            .map_or_else(|| "(the sink's own)".to_owned(), |t| redact(t.as_str()))
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

impl RoutingConfig {
    /// Whether no sink, route or `[routing]` is configured.
    pub fn is_empty(&self) -> bool {
        self.sinks.is_empty() && self.routes.is_empty() && self.routing.is_none()
    }

    /// Checks every table; the sinks' publish timeouts default to
    /// [`default_publish_timeout`](crate::config::default_publish_timeout) of the relay's
    /// `relay_publish_timeout`. Errors name the table or rule (`sinks.NAME`, `routes[2]`,
    /// `routing.default_route`).
    pub fn check(
        &self,
        relay_publish_timeout: Duration,
    ) -> std::result::Result<Routes, ConfigError> {
        if self.routes.is_empty() {
            return Err(ConfigError::new(
                "sinks",
                "[sinks] or [routing] are configured but no [[routes]] send events anywhere; add \
                 [[routes]] (or use `sink` for a single sink)",
            ));
        }
        let mut defined = BTreeMap::new();
        for (name, table) in &self.sinks {
            let at = format!("sinks.{name}");
            let spec =
                SinkConfig::from_table(table, relay_publish_timeout).map_err(|e| e.within(at))?;
            defined.insert(name.clone(), spec);
        }
        let mut routes = Vec::with_capacity(self.routes.len());
        for (i, table) in self.routes.iter().enumerate() {
            let label = format!("routes[{i}]");
            let RouteTable {
                event_type,
                aggregate_type,
                sink,
                topic,
            } = parse_table(table, &label)?;
            check_target(&defined, &label, &sink, topic.as_ref())?;
            routes.push(RouteConfig {
                label,
                event_type,
                aggregate_type,
                sink,
                topic,
            });
        }
        let routing = match &self.routing {
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
                return Err(ConfigError::new(
                    label,
                    "is set but routing.unmatched is \"fail\"; set unmatched = \"default\" to \
                     send unmatched events to it",
                ));
            }
            (UnmatchedPolicy::Default, None) => {
                return Err(ConfigError::new(
                    "routing.unmatched",
                    "is \"default\" but there is no routing.default_route; add default_route = \
                     { sink = \"…\", topic = \"…\" }",
                ));
            }
            (UnmatchedPolicy::Default, Some(DefaultRouteTable { sink, topic })) => {
                check_target(&defined, label, &sink, topic.as_ref())?;
                Some(RouteConfig {
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
        Ok(Routes {
            sinks,
            unused: unused.into_keys().collect(),
            routes,
            default_route,
        })
    }
}

impl Routes {
    /// Opens every sink some route uses (concurrently; one that cannot connect yet keeps
    /// trying in the background) and builds the router.
    pub async fn open(self) -> Result<Router> {
        self.open_shared(&Shared::default()).await
    }

    async fn open_shared(self, shared: &Shared) -> Result<Router> {
        let opening = self.sinks.iter().map(|(name, config)| async move {
            let sink = config
                .open_shared(name, shared)
                .await
                .map_err(|e| Error::Open {
                    sink: name.clone(),
                    source: Box::new(e),
                })?;
            Ok::<_, Error>((name.clone(), sink))
        });
        let mut opened = BTreeMap::new();
        for result in futures::future::join_all(opening).await {
            let (name, sink) = result?;
            opened.insert(name, sink);
        }
        let route = |config: RouteConfig| -> Route {
            // Every route's sink was checked to exist and opened above.
            let sink = Arc::clone(&opened[&config.sink]);
            let mut route = Route::new(config.label, config.sink, sink, config.topic);
            if let Some(glob) = config.event_type {
                route = route.event_type(glob);
            }
            if let Some(glob) = config.aggregate_type {
                route = route.aggregate_type(glob);
            }
            route
        };
        let routes = self.routes.into_iter().map(route).collect();
        let unmatched = match self.default_route {
            Some(config) => Unmatched::Default(Box::new(route(config))),
            None => Unmatched::Fail,
        };
        Ok(Router::new(routes, unmatched))
    }
}

/// Where a relay publishes: one sink for every event, or routes between named sinks.
#[derive(Debug)]
pub enum SinkSetup {
    /// One sink takes every event, to its own destination.
    Single(Box<SinkConfig>),
    /// Routes send each event to the sinks that match it.
    Routed(Box<Routes>),
}

/// The sinks of a [`SinkSetup`], opened.
#[non_exhaustive]
pub struct Opened {
    /// What the relay publishes to.
    pub sink: Arc<dyn postbox::Sink>,
    /// The stdout writer, if a sink writes to stdout: its [`StdoutSink::broken`] tells when the
    /// reader went away.
    pub stdout: Option<Arc<StdoutSink>>,
}

impl SinkSetup {
    /// Refuses an ordering the setup cannot honour (G6: `ordered` aggregate types, `*` for
    /// all): a destination that ordered events can reach and that is chosen by `{event_type}`
    /// sends the events of one aggregate to several topics (streams, subjects, URLs), and no
    /// consumer sees their order. The error is a mistake in `ordered_aggregate_types` whose
    /// message says which sink or route, and what to do.
    ///
    /// ```
    /// use postbox_sinks::{SinkConfig, SinkSetup};
    /// use std::time::Duration;
    /// let table = serde_json::json!({"kind": "null"});
    /// let config = SinkConfig::from_table(&table, Duration::from_secs(10)).unwrap();
    /// let setup = SinkSetup::Single(Box::new(config));
    /// assert!(setup.check_ordering(&["Invoice".to_owned()]).is_ok());
    /// ```
    pub fn check_ordering(&self, ordered: &[String]) -> std::result::Result<(), ConfigError> {
        if ordered.is_empty() {
            return Ok(());
        }
        let refuse = |what: &str, template: &Template| {
            Err(ConfigError::new(
                "ordered_aggregate_types",
                format!(
                    "{what} chooses its destination `{}` by {{event_type}}: the events of one \
                     aggregate would go to several destinations, where no consumer sees their \
                     order (ordered_aggregate_types = {ordered:?}); choose it by \
                     {{aggregate_type}} instead, or leave these aggregate types out of \
                     ordered_aggregate_types",
                    template.as_str()
                ),
            ))
        };
        let splits = |t: &Template| t.as_str().contains("{event_type}");
        match self {
            SinkSetup::Single(config) => match config.own_destination() {
                Some(t) if splits(t) => refuse("the sink", t),
                _ => Ok(()),
            },
            SinkSetup::Routed(routes) => {
                let reaches = |route: &RouteConfig| match &route.aggregate_type {
                    None => true,
                    Some(glob) => ordered.iter().any(|o| o == "*" || glob.matches(o)),
                };
                for route in routes.routes.iter().chain(&routes.default_route) {
                    if !reaches(route) {
                        continue;
                    }
                    let destination = route.topic.as_ref().or_else(|| {
                        routes
                            .sinks
                            .get(&route.sink)
                            .and_then(|s| s.own_destination())
                    });
                    if let Some(t) = destination
                        && splits(t)
                    {
                        return refuse(&format!("{} (sink {})", route.label, route.sink), t);
                    }
                }
                Ok(())
            }
        }
    }

    /// Opens the sink, or every sink some route uses.
    pub async fn open(self) -> Result<Opened> {
        self.open_for(None).await
    }

    /// Opens the sink, or every sink some route uses, for the outbox of `origin`: its database
    /// and schema make the default CloudEvents `source` (see [`crate::cloudevents`]).
    pub async fn open_for(self, origin: Option<Origin>) -> Result<Opened> {
        let shared = Shared::with_origin(origin);
        let sink: Arc<dyn postbox::Sink> = match self {
            SinkSetup::Single(config) => {
                let name = config.kind().name();
                Arc::new(OwnDestination(config.open_shared(name, &shared).await?))
            }
            SinkSetup::Routed(routes) => Arc::new((*routes).open_shared(&shared).await?),
        };
        Ok(Opened {
            sink,
            stdout: shared.stdout_sink(),
        })
    }
}

/// Deserializes a table, errors named by `label`.
fn parse_table<T: serde::de::DeserializeOwned>(
    table: &Value,
    label: &str,
) -> std::result::Result<T, ConfigError> {
    serde_json::from_value(table.clone()).map_err(|e| ConfigError::new(label, e.to_string()))
}

/// Checks that a route's sink exists and that it has a destination that sink can take.
fn check_target(
    sinks: &BTreeMap<String, SinkConfig>,
    label: &str,
    sink: &str,
    topic: Option<&Template>,
) -> std::result::Result<(), ConfigError> {
    let Some(spec) = sinks.get(sink) else {
        let known: Vec<String> = sinks.keys().map(|k| format!("{k:?}")).collect();
        let known = if known.is_empty() {
            "none is defined: add a [sinks.NAME] table".to_owned()
        } else {
            format!("the defined ones are {}", known.join(", "))
        };
        return Err(ConfigError::new(
            label,
            format!("sink {sink:?} is not defined; {known}"),
        ));
    };
    match topic {
        Some(topic) => spec
            .check_destination(topic)
            .map_err(|e| ConfigError::new(label, format!("sink {sink:?}: {e}"))),
        None if spec.needs_destination() && spec.own_destination().is_none() => {
            Err(ConfigError::new(
                label,
                format!(
                    "has no `topic`, and sink {sink:?} ({}) has no `{}` of its own; give the \
                     route a topic, e.g. topic = \"billing.{{aggregate_type}}.{{event_type}}\"",
                    spec.kind(),
                    spec.kind().destination_key().unwrap_or("topic")
                ),
            ))
        }
        None => Ok(()),
    }
}

#[cfg(all(
    test,
    feature = "nats",
    feature = "webhook",
    feature = "redis",
    feature = "kafka"
))]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A routing configuration parsed from TOML, as `postbox.toml` holds it.
    fn config(toml: &str) -> RoutingConfig {
        toml::from_str(toml).expect("toml")
    }

    fn routed_plan(toml: &str) -> Routes {
        config(toml).check(Duration::from_secs(10)).expect("valid")
    }

    fn error(toml: &str) -> ConfigError {
        config(toml)
            .check(Duration::from_secs(10))
            .expect_err("invalid")
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
        let SinkConfig::Webhook(hook) = &plan.sinks["audit_hook"] else {
            panic!("webhook")
        };
        assert_eq!(hook.secret.as_ref().map(|s| s.expose()), Some("s3cr3t"));
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
            assert_eq!(err.at, key, "{toml}\n{err:?}");
            assert!(err.message.contains(text), "{toml}\n{err:?}");
        }
    }
}
