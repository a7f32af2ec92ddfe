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
use std::time::Duration;

use postbox::redact::redact;
use serde::Deserialize;
use serde_json::Value;

use crate::config::{ConfigError, SinkConfig};
use crate::{Glob, Template};

#[cfg(doc)]
use crate::Router;

mod setup;

pub use setup::{Opened, SinkSetup};

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
mod tests;
