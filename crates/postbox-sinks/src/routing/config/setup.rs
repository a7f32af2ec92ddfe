//! Where a relay publishes, one sink or routes between named sinks ([`SinkSetup`]), and
//! opening it: the ordering check, the sinks connected, the [`Router`] built.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{RouteConfig, Routes};
use crate::cloudevents::Origin;
use crate::config::{ConfigError, SinkConfig};
use crate::open::{OwnDestination, Shared};
use crate::stdout::StdoutSink;
use crate::{Error, Result, Route, Router, Template, Unmatched};

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
