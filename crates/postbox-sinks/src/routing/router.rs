//! Routing: ordered rules that send each event to one or more sinks, each with a destination
//! template of its own.
//!
//! A [`Router`] is itself a [`Sink`]: hand it to a relay. For each event it takes every
//! [`Route`] whose globs match the event's type and aggregate type, renders each route's
//! destination, and publishes to all of them at once. The event counts as published only when
//! every matched route acknowledged it.

use std::sync::Arc;

use async_trait::async_trait;
use postbox::{OutboxEvent, PublishError, Sink};

use crate::{Glob, Template};

/// A sink that can publish to a destination given per call, so that several routes share one
/// connection.
///
/// Every broker sink of this crate implements it: the destination is the NATS subject, the AMQP
/// routing key (on the sink's exchange), the Kafka topic, the Redis stream key, the MQTT topic or
/// the webhook URL. Its `Sink::publish` is `publish_to(event, None)`.
#[async_trait]
pub trait RoutableSink: Send + Sync + 'static {
    /// Publishes `event` to the destination `destination` renders for it, or to the sink's own
    /// configured destination when `None`, and waits for the acknowledgement.
    ///
    /// A sink configured without a destination of its own fails `None` permanently.
    async fn publish_to(
        &self,
        event: &OutboxEvent,
        destination: Option<&Template>,
    ) -> Result<(), PublishError>;

    /// The health of the destination, where the sink tracks it (a [`crate::Breaker`] does).
    fn health(&self) -> Vec<postbox::sink::SinkHealth> {
        Vec::new()
    }
}

#[async_trait]
impl<S: RoutableSink + ?Sized> RoutableSink for Arc<S> {
    async fn publish_to(
        &self,
        event: &OutboxEvent,
        destination: Option<&Template>,
    ) -> Result<(), PublishError> {
        (**self).publish_to(event, destination).await
    }

    fn health(&self) -> Vec<postbox::sink::SinkHealth> {
        (**self).health()
    }
}

/// The error of a sink that has no destination of its own and was asked to publish to it.
#[allow(dead_code, reason = "used only by some sink features")]
pub(crate) fn no_destination(sink: &str, field: &str) -> PublishError {
    PublishError::permanent(format!(
        "{sink}: this sink has no `{field}` of its own, and the route gave no destination; give \
         the sink a `{field}` or the route a topic"
    ))
}

/// One routing rule: which events (globs over event type and aggregate type), which sink, and
/// which destination.
///
/// A route without globs matches every event. An `aggregate_type` glob never matches an event
/// without an aggregate type, not even `*`.
#[derive(Clone)]
pub struct Route {
    label: String,
    event_type: Option<Glob>,
    aggregate_type: Option<Glob>,
    sink_name: String,
    sink: Arc<dyn RoutableSink>,
    destination: Option<Template>,
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Route")
            .field("label", &self.label)
            .field("event_type", &self.event_type)
            .field("aggregate_type", &self.aggregate_type)
            .field("sink", &self.sink_name)
            .field("destination", &self.destination)
            .finish()
    }
}

impl Route {
    /// A route to `sink` (called `sink_name` in messages) that matches every event, publishing to
    /// `destination` (`None`: the sink's own). `label` names the route in error messages, e.g.
    /// `routes[2]`.
    pub fn new(
        label: impl Into<String>,
        sink_name: impl Into<String>,
        sink: Arc<dyn RoutableSink>,
        destination: Option<Template>,
    ) -> Route {
        Route {
            label: label.into(),
            event_type: None,
            aggregate_type: None,
            sink_name: sink_name.into(),
            sink,
            destination,
        }
    }

    /// Matches only events whose type matches `glob`.
    pub fn event_type(mut self, glob: Glob) -> Route {
        self.event_type = Some(glob);
        self
    }

    /// Matches only events whose aggregate type matches `glob`.
    pub fn aggregate_type(mut self, glob: Glob) -> Route {
        self.aggregate_type = Some(glob);
        self
    }

    /// The label given to [`Route::new`].
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Whether this route takes `event`.
    pub fn matches(&self, event: &OutboxEvent) -> bool {
        let event_type = self
            .event_type
            .as_ref()
            .is_none_or(|g| g.matches(&event.event_type));
        let aggregate_type = match (&self.aggregate_type, &event.aggregate_type) {
            (None, _) => true,
            (Some(glob), Some(value)) => glob.matches(value),
            (Some(_), None) => false,
        };
        event_type && aggregate_type
    }

    /// Whether this route and `other` publish to the same place (same sink, same template).
    fn same_target(&self, other: &Route) -> bool {
        Arc::ptr_eq(&self.sink, &other.sink)
            && self.destination.as_ref().map(Template::as_str)
                == other.destination.as_ref().map(Template::as_str)
    }

    async fn publish(&self, event: &OutboxEvent) -> Result<(), PublishError> {
        self.sink.publish_to(event, self.destination.as_ref()).await
    }

    fn describe(&self) -> String {
        match &self.destination {
            Some(d) => format!(
                "{} (sink {}, {:?})",
                self.label,
                self.sink_name,
                postbox::redact::redact(d.as_str())
            ),
            None => format!("{} (sink {})", self.label, self.sink_name),
        }
    }
}

/// What happens to an event that no route matches.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Unmatched {
    /// It fails permanently (the event goes `FAILED` at once), with a reason naming its type.
    Fail,
    /// It goes to this route (its globs are not consulted).
    Default(Box<Route>),
}

/// Sends each event to every route that matches it; an event counts as published only when
/// every matched route acknowledged it.
///
/// The matched routes are published to concurrently, so a slow broker delays only the events
/// routed to it (each sink bounds its own publish by its `publish_timeout`). Two matched routes
/// with the same sink and the same destination template publish once.
///
/// **Retries repeat acknowledged routes.** If one route fails, the event fails (retryable unless
/// some route failed permanently) and on the next try it is published to *every* matched route
/// again, including those that had acknowledged it: they receive it twice, with the same
/// `postbox-dedup-id`. Consumers drop repeats by it, as they must anyway (at-least-once).
///
/// ```
/// use std::sync::Arc;
/// use postbox::{OutboxEvent, PublishError};
/// use postbox_sinks::{RoutableSink, Route, Router, Template, Unmatched};
///
/// struct Print;
///
/// #[async_trait::async_trait]
/// impl RoutableSink for Print {
///     async fn publish_to(&self, e: &OutboxEvent, to: Option<&Template>) -> Result<(), PublishError> {
///         let to = to.map(|t| t.render(e)).transpose()?;
///         println!("{} -> {to:?}", e.id);
///         Ok(())
///     }
/// }
///
/// let print: Arc<dyn RoutableSink> = Arc::new(Print);
/// let router = Router::new(
///     vec![
///         Route::new("routes[0]", "print", print.clone(), Some("billing.{event_type}".parse().unwrap()))
///             .event_type("Invoice*".parse().unwrap()),
///         Route::new("routes[1]", "print", print, Some("audit".parse().unwrap())),
///     ],
///     Unmatched::Fail,
/// );
/// // hand `router` to a `postbox::Relay` as its sink
/// # let _ = router;
/// ```
#[derive(Debug)]
pub struct Router {
    routes: Vec<Route>,
    unmatched: Unmatched,
}

impl Router {
    /// A router over `routes`, in order, with `unmatched` for events no route matches.
    pub fn new(routes: Vec<Route>, unmatched: Unmatched) -> Router {
        Router { routes, unmatched }
    }

    /// The routes that take `event`, in order, without repeats of the same sink and destination;
    /// the default route when none matches and there is one.
    pub fn routes_for(&self, event: &OutboxEvent) -> Vec<&Route> {
        let mut matched: Vec<&Route> = Vec::new();
        for route in self.routes.iter().filter(|r| r.matches(event)) {
            if !matched.iter().any(|m| m.same_target(route)) {
                matched.push(route);
            }
        }
        if matched.is_empty()
            && let Unmatched::Default(route) = &self.unmatched
        {
            matched.push(route);
        }
        matched
    }
}

#[async_trait]
impl Sink for Router {
    /// The health of every sink of the routes, once per sink name.
    fn health(&self) -> Vec<postbox::sink::SinkHealth> {
        let mut seen = std::collections::BTreeMap::new();
        let defaults = match &self.unmatched {
            Unmatched::Default(route) => vec![route.as_ref()],
            _ => Vec::new(),
        };
        for route in self.routes.iter().chain(defaults) {
            for health in route.sink.health() {
                seen.entry(health.name.clone()).or_insert(health);
            }
        }
        seen.into_values().collect()
    }

    fn route_of(&self, event: &OutboxEvent) -> Option<String> {
        let routes = self.routes_for(event);
        (!routes.is_empty()).then(|| {
            routes
                .iter()
                .map(|r| r.label.as_str())
                .collect::<Vec<_>>()
                .join("+")
        })
    }

    async fn publish(&self, event: &OutboxEvent) -> Result<(), PublishError> {
        let routes = self.routes_for(event);
        match routes.as_slice() {
            [] => Err(PublishError::permanent(format!(
                "no route matches event {} (event_type {:?}, aggregate_type {}); add a route \
                 for it or a default route, then retry the event",
                event.id,
                event.event_type,
                event
                    .aggregate_type
                    .as_deref()
                    .map_or_else(|| "none".to_owned(), |a| format!("{a:?}"))
            ))),
            [route] => route
                .publish(event)
                .await
                .map_err(|e| with_route(&e, route)),
            many => {
                let outcomes =
                    futures::future::join_all(many.iter().map(|r| r.publish(event))).await;
                combine(many, outcomes)
            }
        }
    }
}

/// The error of `route`, prefixed with which route it was, its class and pause kept.
fn with_route(error: &PublishError, route: &Route) -> PublishError {
    let message = format!("{}: {}", route.describe(), error.message());
    let named = if error.is_permanent() {
        PublishError::permanent(message)
    } else if error.is_unavailable() {
        PublishError::unavailable(message)
    } else {
        PublishError::retryable(message)
    };
    match error.retry_after() {
        Some(after) => named.with_retry_after(after),
        None => named,
    }
}

/// The outcome of a fan-out: `Ok` when every route acknowledged; otherwise one error naming
/// every failed route, permanent when any failure was (retrying cannot make that route succeed,
/// so the event could never be published to all its routes), unavailable when every failure
/// was a destination down (with the shortest pause they asked for), else retryable.
fn combine(routes: &[&Route], outcomes: Vec<Result<(), PublishError>>) -> Result<(), PublishError> {
    let failed: Vec<(&Route, PublishError)> = routes
        .iter()
        .zip(outcomes)
        .filter_map(|(route, outcome)| outcome.err().map(|e| (*route, e)))
        .collect();
    if failed.is_empty() {
        return Ok(());
    }
    let permanent = failed.iter().any(|(_, e)| e.is_permanent());
    let details: Vec<String> = failed
        .iter()
        .map(|(route, e)| format!("{}: {}", route.describe(), e.message()))
        .collect();
    let message = format!(
        "{} of {} routes failed (the others acknowledged; a retry sends to every route again): {}",
        failed.len(),
        routes.len(),
        details.join("; ")
    );
    let unavailable = failed.iter().all(|(_, e)| e.is_unavailable());
    Err(if permanent {
        PublishError::permanent(message)
    } else if unavailable {
        let pause = failed.iter().filter_map(|(_, e)| e.retry_after()).min();
        let error = PublishError::unavailable(message);
        match pause {
            Some(pause) => error.with_retry_after(pause),
            None => error,
        }
    } else {
        PublishError::retryable(message)
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests;
