//! The sink seam: where a relay publishes events.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::event::OutboxEvent;

/// Why publishing one event failed, and whether trying again can help.
///
/// The retry policy reads [`PublishError::is_permanent`] and [`PublishError::retry_after`]; it
/// never parses messages. The error that caused it, if any, is kept as its
/// [`source`](std::error::Error::source).
///
/// ```
/// use std::time::Duration;
/// use postbox::PublishError;
///
/// let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
/// let e = PublishError::retryable("broker down")
///     .with_source(io)
///     .with_retry_after(Duration::from_secs(30));
/// assert!(!e.is_permanent());
/// assert_eq!(e.retry_after(), Some(Duration::from_secs(30)));
/// assert!(std::error::Error::source(&e).is_some());
/// assert_eq!(PublishError::permanent("400 Bad Request").to_string(), "permanent: 400 Bad Request");
/// ```
#[derive(Debug, Clone)]
pub struct PublishError {
    permanent: bool,
    message: String,
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
    retry_after: Option<Duration>,
}

impl PublishError {
    /// Worth retrying: a broker down, a timeout, a handler error.
    pub fn retryable(msg: impl std::fmt::Display) -> Self {
        PublishError {
            permanent: false,
            message: msg.to_string(),
            source: None,
            retry_after: None,
        }
    }

    /// Retrying cannot help (for example a webhook answered 400): the event goes `FAILED` at once.
    pub fn permanent(msg: impl std::fmt::Display) -> Self {
        PublishError {
            permanent: true,
            ..PublishError::retryable(msg)
        }
    }

    /// Keeps `source` as the cause of this error.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(source));
        self
    }

    /// Says the destination asked for a pause before the next try (an HTTP `Retry-After`, a
    /// broker's throttling hint).
    pub fn with_retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    /// Whether the event should go `FAILED` without further tries.
    pub fn is_permanent(&self) -> bool {
        self.permanent
    }

    /// The pause the destination asked for, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// The message, without the `permanent: ` prefix that `Display` adds to permanent errors.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl std::fmt::Display for PublishError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.permanent {
            f.write_str("permanent: ")?;
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
        self.permanent == other.permanent
            && self.message == other.message
            && self.retry_after == other.retry_after
    }
}

impl Eq for PublishError {}

/// Where a relay publishes events: in-process [`crate::Handlers`], stdout, a broker.
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
}

#[async_trait]
impl<S: Sink + ?Sized> Sink for std::sync::Arc<S> {
    async fn publish(&self, event: &OutboxEvent) -> Result<(), PublishError> {
        (**self).publish(event).await
    }
}
