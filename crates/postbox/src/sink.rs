//! The sink seam: where a relay publishes events.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::event::OutboxEvent;

/// Why publishing one event failed, and what the relay does about it.
///
/// Three classes, read by the retry policy (it never parses messages):
///
/// - **retryable** ([`PublishError::retryable`]): the event's own failure (a handler error, a
///   payload the broker refused this time, a webhook's 500); a failed try, counted against
///   `max_retries`, backed off;
/// - **permanent** ([`PublishError::permanent`]): retrying cannot help (a webhook's 400); the
///   event goes `FAILED` at once;
/// - **unavailable** ([`PublishError::unavailable`]): the destination is down or unreachable
///   (connection refused, no acknowledgement in time, a 503); not the event's fault, so it is
///   put back without spending a try and tried again when the destination is back
///   (docs/guarantees.md, G5).
///
/// The error that caused it, if any, is kept as its [`source`](std::error::Error::source), and
/// a destination can ask for a pause ([`PublishError::with_retry_after`]).
///
/// ```
/// use std::time::Duration;
/// use postbox::PublishError;
///
/// let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
/// let e = PublishError::unavailable("broker down")
///     .with_source(io)
///     .with_retry_after(Duration::from_secs(30));
/// assert!(e.is_unavailable() && !e.is_permanent());
/// assert_eq!(e.retry_after(), Some(Duration::from_secs(30)));
/// assert!(std::error::Error::source(&e).is_some());
/// assert_eq!(PublishError::permanent("400 Bad Request").to_string(), "permanent: 400 Bad Request");
/// ```
#[derive(Debug, Clone)]
pub struct PublishError {
    class: Class,
    message: String,
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
    retry_after: Option<Duration>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    Retryable,
    Permanent,
    Unavailable,
}

impl PublishError {
    fn new(class: Class, msg: impl std::fmt::Display) -> Self {
        PublishError {
            class,
            message: msg.to_string(),
            source: None,
            retry_after: None,
        }
    }

    /// The event's own failure, worth retrying: a handler error, a broker that refused this
    /// message. Counts as a failed try.
    pub fn retryable(msg: impl std::fmt::Display) -> Self {
        PublishError::new(Class::Retryable, msg)
    }

    /// Retrying cannot help (for example a webhook answered 400): the event goes `FAILED` at once.
    pub fn permanent(msg: impl std::fmt::Display) -> Self {
        PublishError::new(Class::Permanent, msg)
    }

    /// The destination is down or unreachable: the event waits for it without spending a try.
    pub fn unavailable(msg: impl std::fmt::Display) -> Self {
        PublishError::new(Class::Unavailable, msg)
    }

    /// Keeps `source` as the cause of this error.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(source));
        self
    }

    /// Says the destination asked for a pause before the next try (an HTTP `Retry-After`, a
    /// broker's throttling hint, a breaker's next probe).
    pub fn with_retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    /// Whether the event should go `FAILED` without further tries.
    pub fn is_permanent(&self) -> bool {
        self.class == Class::Permanent
    }

    /// Whether the destination is down (the event is not at fault and spends no try).
    pub fn is_unavailable(&self) -> bool {
        self.class == Class::Unavailable
    }

    /// The pause the destination asked for, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// The message, without the `permanent: ` or `unavailable: ` prefix that `Display` adds.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl std::fmt::Display for PublishError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.class {
            Class::Permanent => f.write_str("permanent: ")?,
            Class::Unavailable => f.write_str("unavailable: ")?,
            Class::Retryable => {}
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for PublishError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl PartialEq for PublishError {
    /// Errors are equal when they are of the same class with the same message and hint (their
    /// sources are not compared).
    fn eq(&self, other: &Self) -> bool {
        self.class == other.class
            && self.message == other.message
            && self.retry_after == other.retry_after
    }
}

impl Eq for PublishError {}

/// Whether a destination is up, as a sink last saw it (for logs, `postbox status`, metrics and
/// readiness).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct SinkHealth {
    /// The sink's name (a `[sinks.NAME]` table, or its kind).
    pub name: String,
    /// Whether it accepts events.
    pub up: bool,
    /// Since when it is in this state (UTC).
    pub since: chrono::DateTime<chrono::Utc>,
    /// Why it is down.
    pub last_error: Option<String>,
}

impl SinkHealth {
    /// A sink's health.
    pub fn new(
        name: impl Into<String>,
        up: bool,
        since: chrono::DateTime<chrono::Utc>,
        last_error: Option<String>,
    ) -> Self {
        SinkHealth {
            name: name.into(),
            up,
            since,
            last_error,
        }
    }
}

/// Where a relay publishes events: in-process [`crate::handlers::Handlers`], stdout, a broker.
///
/// `publish` returns `Ok` only once the destination has acknowledged the event; the relay then
/// marks it `PROCESSED`. An error, a timeout (the relay's `publish_timeout`) or a panic is a failed
/// try. The relay calls `publish` for many events at once (bounded by its `concurrency`), so a
/// sink can pipeline.
///
/// ```
/// use postbox::{OutboxEvent, PublishError, Sink};
///
/// struct Log;
///
/// #[async_trait::async_trait]
/// impl Sink for Log {
///     async fn publish(&self, event: &OutboxEvent) -> Result<(), PublishError> {
///         println!("{} {}", event.id, event.event_type);
///         Ok(())
///     }
/// }
/// ```
#[async_trait]
pub trait Sink: Send + Sync + 'static {
    /// Publishes one event and waits for its acknowledgement.
    async fn publish(&self, event: &OutboxEvent) -> Result<(), PublishError>;

    /// The health of the destinations behind this sink, as far as it tracks them (none by
    /// default; broker sinks of `postbox-sinks` report theirs).
    fn health(&self) -> Vec<SinkHealth> {
        Vec::new()
    }

    /// The route (or routes, joined by `+`) that take `event`, for the `route` label of the
    /// relay's metrics: names fixed by configuration (`routes[0]`, `default`), never a topic or
    /// an id, so the label's values stay few. `None` (a sink without routes) is labelled
    /// `default`.
    fn route_of(&self, event: &OutboxEvent) -> Option<String> {
        let _ = event;
        None
    }
}

#[async_trait]
impl<S: Sink + ?Sized> Sink for std::sync::Arc<S> {
    async fn publish(&self, event: &OutboxEvent) -> Result<(), PublishError> {
        (**self).publish(event).await
    }

    fn health(&self) -> Vec<SinkHealth> {
        (**self).health()
    }

    fn route_of(&self, event: &OutboxEvent) -> Option<String> {
        (**self).route_of(event)
    }
}
