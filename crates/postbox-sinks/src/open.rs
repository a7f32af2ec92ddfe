//! Opening configured sinks: connecting to the brokers, and keeping at it in the background
//! when one is away at start-up.
//!
//! A broker that cannot be reached at start-up does not stop the relay: the sink keeps
//! connecting in the background, and events for it fail as retryable (they wait with backoff,
//! other sinks' events flow) until it is up. Configuration mistakes still stop the start.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use postbox::{OutboxEvent, PublishError, Sink, backoff::Backoff};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::cloudevents::Origin;
use crate::stdout::StdoutSink;
use crate::{Error, Result, RoutableSink, Template};

/// What the sinks opened together share: one stdout writer, however many sinks write to it, and
/// where the events come from (the default CloudEvents `source`).
#[derive(Default)]
pub struct Shared {
    stdout: OnceLock<Arc<StdoutSink>>,
    origin: Option<Origin>,
}

impl Shared {
    /// Sinks opened for the outbox of `origin` (its database and schema name the CloudEvents
    /// `source` of sinks that do not set one).
    pub fn with_origin(origin: Option<Origin>) -> Shared {
        Shared {
            origin,
            ..Shared::default()
        }
    }

    /// Where the events come from, if known.
    pub fn origin(&self) -> Option<Origin> {
        self.origin.clone()
    }

    /// The stdout writer, started on first use.
    pub(crate) fn stdout(&self) -> Result<Arc<StdoutSink>> {
        if let Some(s) = self.stdout.get() {
            return Ok(Arc::clone(s));
        }
        let started =
            Arc::new(StdoutSink::start().map_err(|e| {
                Error::config("kind", format!("cannot start the stdout writer: {e}"))
            })?);
        Ok(Arc::clone(self.stdout.get_or_init(|| started)))
    }

    /// The stdout writer, if a sink uses it.
    pub fn stdout_sink(&self) -> Option<Arc<StdoutSink>> {
        self.stdout.get().cloned()
    }
}

/// A sink that publishes every event to its own configured destination: what a single sink
/// (no routes) is to a relay.
pub struct OwnDestination(pub Arc<dyn RoutableSink>);

#[async_trait]
impl Sink for OwnDestination {
    async fn publish(&self, event: &OutboxEvent) -> std::result::Result<(), PublishError> {
        self.0.publish_to(event, None).await
    }

    fn health(&self) -> Vec<postbox::sink::SinkHealth> {
        self.0.health()
    }
}

/// A boxed connection attempt.
pub(crate) type ConnectFuture = Pin<Box<dyn Future<Output = Result<Arc<dyn RoutableSink>>> + Send>>;

/// A broker sink whose first connection failed: it keeps connecting in the background, and
/// until it succeeds every publish fails as retryable with the last connection error.
pub struct Reconnecting {
    /// The kind of sink, e.g. `redis sink`; the last error names the broker's address.
    kind: String,
    state: Arc<ConnectState>,
    task: JoinHandle<()>,
}

#[derive(Default)]
struct ConnectState {
    sink: OnceLock<Arc<dyn RoutableSink>>,
    last_error: Mutex<String>,
}

impl Reconnecting {
    /// Starts connecting in the background after a first failed attempt (`error`), waiting
    /// from 100 ms up to `max_delay` between attempts.
    pub(crate) fn start<F>(
        kind: &str,
        label: String,
        max_delay: Duration,
        error: Error,
        connect: F,
    ) -> Arc<dyn RoutableSink>
    where
        F: Fn() -> ConnectFuture + Send + Sync + 'static,
    {
        warn!(
            sink = %label,
            error = %error,
            "cannot connect; the relay starts anyway and keeps trying, retrying this sink's \
             events meanwhile"
        );
        let state = Arc::new(ConnectState {
            sink: OnceLock::new(),
            last_error: Mutex::new(error.to_string()),
        });
        let task = tokio::spawn(keep_connecting(label, state.clone(), max_delay, connect));
        Arc::new(Reconnecting {
            kind: format!("{kind} sink"),
            state,
            task,
        })
    }

    /// Whether the background connection has succeeded.
    pub fn is_connected(&self) -> bool {
        self.state.sink.get().is_some()
    }
}

async fn keep_connecting<F>(
    label: String,
    state: Arc<ConnectState>,
    max_delay: Duration,
    connect: F,
) where
    F: Fn() -> ConnectFuture + Send + Sync + 'static,
{
    let mut waits = Backoff::new(Duration::from_millis(100), max_delay).attempts();
    let mut attempts = 1u64;
    loop {
        tokio::time::sleep(waits.next_delay()).await;
        attempts += 1;
        match connect().await {
            Ok(sink) => {
                let _ = state.sink.set(sink);
                info!(sink = %label, attempts, "connected");
                return;
            }
            Err(e) => {
                tracing::debug!(sink = %label, error = %e, "still cannot connect");
                if let Ok(mut last) = state.last_error.lock() {
                    *last = e.to_string();
                }
            }
        }
    }
}

impl Drop for Reconnecting {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[async_trait]
impl RoutableSink for Reconnecting {
    async fn publish_to(
        &self,
        event: &OutboxEvent,
        destination: Option<&Template>,
    ) -> std::result::Result<(), PublishError> {
        if let Some(sink) = self.state.sink.get() {
            return sink.publish_to(event, destination).await;
        }
        let last = self
            .state
            .last_error
            .lock()
            .map(|e| e.clone())
            .unwrap_or_default();
        Err(PublishError::unavailable(format!(
            "{}: not connected yet, still trying; last attempt: {last}",
            self.kind
        )))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    struct Ack;

    #[async_trait]
    impl RoutableSink for Ack {
        async fn publish_to(
            &self,
            _event: &OutboxEvent,
            _destination: Option<&Template>,
        ) -> std::result::Result<(), PublishError> {
            Ok(())
        }
    }

    fn refused() -> Error {
        Error::Connect {
            broker: "Test",
            address: "127.0.0.1:1".into(),
            source: "connection refused".into(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_unreachable_broker_is_retried_in_the_background() {
        let attempts = Arc::new(AtomicUsize::new(1));
        let counter = attempts.clone();
        let sink = Reconnecting::start(
            "null",
            "test sink".into(),
            Duration::from_millis(400),
            refused(),
            move || {
                let n = counter.fetch_add(1, Ordering::SeqCst);
                Box::pin(async move {
                    if n < 3 {
                        Err(refused())
                    } else {
                        Ok(Arc::new(Ack) as Arc<dyn RoutableSink>)
                    }
                })
            },
        );
        let event = postbox_testkit::event(1).build();
        let err = sink.publish_to(&event, None).await.expect_err("not yet");
        assert!(!err.is_permanent());
        assert!(
            err.to_string().contains("not connected yet") && err.to_string().contains("refused"),
            "{err}"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        sink.publish_to(&event, None)
            .await
            .expect("connected by now");
        assert_eq!(attempts.load(Ordering::SeqCst), 4);
    }
}
