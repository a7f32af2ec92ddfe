//! In-process handlers: the seed's event listeners, as a [`Sink`].

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::{BoxFuture, join_all};

use crate::event::{DomainEvent, OutboxEvent};
use crate::sink::{PublishError, Sink};

/// The error a handler returns; anything convertible (`anyhow::Error`, `std::io::Error`,
/// `String`, `&str`) will do.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync>;

type Handler =
    Arc<dyn Fn(Arc<OutboxEvent>) -> BoxFuture<'static, Result<(), PublishError>> + Send + Sync>;

/// Handlers registered by event type, and catch-all handlers (for audit), published to in
/// process.
///
/// For each event, every handler registered for its type and every catch-all handler runs,
/// concurrently, each within the handler timeout (default 10 s). The event is published when all
/// of them succeed; an error, a timeout or a panic in any of them is a failed try of the event,
/// which is retried with backoff. An event that no handler matches fails permanently (it is
/// `FAILED` at once, so nothing is dropped silently; an operator's retry brings it back once a handler
/// exists).
///
/// ```
/// use postbox::{event::DomainEvent, handlers::Handlers};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// struct InvoiceCreated { invoice_id: i64 }
/// impl DomainEvent for InvoiceCreated {
///     const EVENT_TYPE: &'static str = "InvoiceCreated";
///     const AGGREGATE_TYPE: &'static str = "Invoice";
///     fn aggregate_id(&self) -> Option<String> { Some(self.invoice_id.to_string()) }
/// }
///
/// let handlers = Handlers::new()
///     .on(|e: InvoiceCreated| async move {
///         println!("send invoice {} by mail", e.invoice_id);
///         Ok::<_, std::io::Error>(())
///     })
///     .on_any(|e| async move {
///         println!("audit: {} {}", e.event_type, e.id);
///         Ok::<_, std::io::Error>(())
///     });
/// ```
#[derive(Clone)]
pub struct Handlers {
    by_type: HashMap<String, Vec<Handler>>,
    catch_all: Vec<Handler>,
    timeout: Duration,
}

impl Default for Handlers {
    fn default() -> Self {
        Self::new()
    }
}

impl Handlers {
    /// No handlers yet; handler timeout 10 s.
    pub fn new() -> Self {
        Handlers {
            by_type: HashMap::new(),
            catch_all: Vec::new(),
            timeout: Duration::from_secs(10),
        }
    }

    /// Sets how long one handler may take for one event before the try counts as failed.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Registers a typed handler for `E::EVENT_TYPE`; the payload is deserialized into `E` (a
    /// payload that does not deserialize fails the event permanently).
    pub fn on<E, F, Fut, Err>(self, handler: F) -> Self
    where
        E: DomainEvent,
        F: Fn(E) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), Err>> + Send + 'static,
        Err: Into<HandlerError>,
    {
        let handler = Arc::new(handler);
        self.on_type(E::EVENT_TYPE, move |event: Arc<OutboxEvent>| {
            let handler = Arc::clone(&handler);
            async move {
                let typed: E = serde_json::from_str(event.payload.get()).map_err(|e| {
                    PublishError::permanent(format!(
                        "payload of {} event {} does not deserialize into {}: {e}",
                        event.event_type,
                        event.id,
                        std::any::type_name::<E>()
                    ))
                })?;
                handler(typed).await.map_err(|e| classify(e.into()))
            }
        })
    }

    /// Registers an untyped handler for events of `event_type`. Returning a permanent
    /// [`PublishError`] fails the event at once; any other error is retried.
    pub fn on_type<F, Fut, Err>(mut self, event_type: &str, handler: F) -> Self
    where
        F: Fn(Arc<OutboxEvent>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), Err>> + Send + 'static,
        Err: Into<HandlerError>,
    {
        self.by_type
            .entry(event_type.to_owned())
            .or_default()
            .push(wrap(handler));
        self
    }

    /// Registers a catch-all handler, run for every event (e.g. an audit log).
    pub fn on_any<F, Fut, Err>(mut self, handler: F) -> Self
    where
        F: Fn(Arc<OutboxEvent>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), Err>> + Send + 'static,
        Err: Into<HandlerError>,
    {
        self.catch_all.push(wrap(handler));
        self
    }
}

/// Turns a handler's error into a [`PublishError`]: a `PublishError` keeps its class, anything
/// else is retryable.
fn classify(error: HandlerError) -> PublishError {
    match error.downcast::<PublishError>() {
        Ok(p) => *p,
        Err(other) => PublishError::retryable(&other).with_source(BoxedError(other)),
    }
}

/// A handler's boxed error as a [`std::error::Error`] of its own, so that it can be kept as the
/// source of a [`PublishError`] (a `Box<dyn Error>` is not itself an `Error`).
#[derive(Debug)]
struct BoxedError(HandlerError);

impl std::fmt::Display for BoxedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for BoxedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

fn wrap<F, Fut, Err>(handler: F) -> Handler
where
    F: Fn(Arc<OutboxEvent>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), Err>> + Send + 'static,
    Err: Into<HandlerError>,
{
    Arc::new(move |event| {
        let fut = handler(event);
        Box::pin(async move { fut.await.map_err(|e| classify(e.into())) })
    })
}

#[async_trait]
impl Sink for Handlers {
    async fn publish(&self, event: &OutboxEvent) -> Result<(), PublishError> {
        let typed = self
            .by_type
            .get(&event.event_type)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        if typed.is_empty() && self.catch_all.is_empty() {
            return Err(PublishError::permanent(format!(
                "no handler is registered for event type {:?}",
                event.event_type
            )));
        }
        let shared = Arc::new(event.clone());
        let runs = typed.iter().chain(&self.catch_all).map(|h| {
            let run = h(Arc::clone(&shared));
            async move {
                match tokio::time::timeout(self.timeout, run).await {
                    Ok(result) => result,
                    Err(_) => Err(PublishError::retryable(format!(
                        "handler timed out after {:?}",
                        self.timeout
                    ))),
                }
            }
        });
        let results = join_all(runs).await;
        // A permanent error wins over a retryable one: retrying cannot help that handler.
        let mut first_retryable = None;
        for result in results {
            match result {
                Err(e) if e.is_permanent() => return Err(e),
                Err(e) => {
                    first_retryable.get_or_insert(e);
                }
                Ok(()) => {}
            }
        }
        first_retryable.map_or(Ok(()), Err)
    }
}
