//! The sink seam: where a relay publishes events.

use async_trait::async_trait;

use crate::event::OutboxEvent;

/// Why publishing one event failed, and whether trying again can help.
///
/// The retry policy reads [`PublishError::is_permanent`]; it never parses messages.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// Worth retrying: a broker down, a timeout, a handler error.
    #[error("{0}")]
    Retryable(String),
    /// Retrying cannot help (for example a webhook answered 400): the event goes `FAILED` at once.
    #[error("permanent: {0}")]
    Permanent(String),
}

impl PublishError {
    /// A retryable error with this message.
    pub fn retryable(msg: impl std::fmt::Display) -> Self {
        PublishError::Retryable(msg.to_string())
    }

    /// A permanent error with this message.
    pub fn permanent(msg: impl std::fmt::Display) -> Self {
        PublishError::Permanent(msg.to_string())
    }

    /// Whether the event should go `FAILED` without further tries.
    pub fn is_permanent(&self) -> bool {
        matches!(self, PublishError::Permanent(_))
    }
}

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
