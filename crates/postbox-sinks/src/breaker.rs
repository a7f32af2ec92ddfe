//! A circuit breaker in front of a sink: once its destination answers "unavailable" (down,
//! unreachable, not acknowledging), the breaker stops sending to it and fails its events at once
//! — as unavailable, so they wait without spending a try, with a pause until the next probe —,
//! lets one event through as a probe after a backoff (doubling up to a cap), and closes again on
//! the first answer that is not an outage.

use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use postbox::{OutboxEvent, PublishError, Sink, backoff::Backoff, sink::SinkHealth};
use tokio::time::Instant;
use tracing::{info, warn};

use crate::{RoutableSink, Template};

/// The first pause after the destination went down, and the longest.
pub const PROBE_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(250), Duration::from_secs(30));

/// How long events wait while a probe is out (about the longest a publish may take).
const PROBE_WAIT: Duration = Duration::from_secs(1);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Sending.
    Closed,
    /// Not sending until then.
    Open(Instant),
    /// One event is out as a probe.
    Probing,
}

struct State {
    phase: Phase,
    /// Outages in a row (probes that failed included), for the backoff.
    opens: u32,
    since: DateTime<Utc>,
    last_error: Option<String>,
}

/// A [`RoutableSink`] (and [`Sink`]) with a circuit breaker; see the module docs. Its
/// [`health`](RoutableSink::health) says whether the destination is up, and since when.
///
/// ```
/// use postbox_sinks::Breaker;
/// let sink = Breaker::new("audit", postbox_sinks::stdout::NullSink);
/// assert!(postbox_sinks::RoutableSink::health(&sink)[0].up);
/// ```
pub struct Breaker<S> {
    name: String,
    inner: S,
    backoff: Backoff,
    state: Mutex<State>,
}

impl<S> Breaker<S> {
    /// A breaker named `name` (in logs, `postbox status` and metrics) in front of `inner`.
    pub fn new(name: impl Into<String>, inner: S) -> Self {
        Breaker {
            name: name.into(),
            inner,
            backoff: PROBE_BACKOFF,
            state: Mutex::new(State {
                phase: Phase::Closed,
                opens: 0,
                since: Utc::now(),
                last_error: None,
            }),
        }
    }

    /// Probes with `backoff` instead of [`PROBE_BACKOFF`].
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether to send now (and whether as the probe), or how long to wait.
    fn admit(&self) -> Result<bool, (Duration, String)> {
        let mut state = self.lock();
        let down = |state: &State, wait: Duration| {
            (
                wait,
                format!(
                    "{} is down since {} ({}); waiting for it",
                    self.name,
                    state.since.format("%Y-%m-%dT%H:%M:%SZ"),
                    state.last_error.as_deref().unwrap_or("no answer")
                ),
            )
        };
        match state.phase {
            Phase::Closed => Ok(false),
            Phase::Open(until) => {
                let now = Instant::now();
                if now < until {
                    Err(down(&state, until - now))
                } else {
                    state.phase = Phase::Probing;
                    Ok(true)
                }
            }
            Phase::Probing => Err(down(&state, PROBE_WAIT)),
        }
    }

    /// Takes the outcome of a publish into account; returns the error, with the pause until
    /// the next probe when the destination is down.
    fn settle(&self, probe: bool, result: Result<(), PublishError>) -> Result<(), PublishError> {
        let mut state = self.lock();
        match result {
            Err(e) if e.is_unavailable() => {
                let reopen = match state.phase {
                    Phase::Closed => {
                        state.since = Utc::now();
                        warn!(sink = %self.name, error = %e,
                            "destination down; its events wait without spending tries, probing it");
                        true
                    }
                    Phase::Probing if probe => true,
                    // Publishes sent before the breaker opened, failing now: already counted.
                    _ => false,
                };
                let pause = if reopen {
                    let pause = self.backoff.delay(state.opens);
                    state.opens = state.opens.saturating_add(1);
                    state.phase = Phase::Open(Instant::now() + pause);
                    pause
                } else {
                    match state.phase {
                        Phase::Open(until) => until.saturating_duration_since(Instant::now()),
                        _ => PROBE_WAIT,
                    }
                };
                state.last_error = Some(e.message().to_owned());
                let pause = e.retry_after().map_or(pause, |hint| hint.max(pause));
                Err(e.with_retry_after(pause))
            }
            other => {
                // Any answer that is not an outage means the destination is there.
                if state.phase != Phase::Closed {
                    info!(sink = %self.name, down_for = ?(Utc::now() - state.since).to_std().unwrap_or_default(),
                        "destination back; sending again");
                    state.since = Utc::now();
                }
                state.phase = Phase::Closed;
                state.opens = 0;
                state.last_error = None;
                other
            }
        }
    }

    fn health_now(&self) -> SinkHealth {
        let state = self.lock();
        SinkHealth::new(
            self.name.clone(),
            state.phase == Phase::Closed,
            state.since,
            state.last_error.clone(),
        )
    }
}

#[async_trait]
impl<S: RoutableSink> RoutableSink for Breaker<S> {
    async fn publish_to(
        &self,
        event: &OutboxEvent,
        destination: Option<&Template>,
    ) -> Result<(), PublishError> {
        let probe = match self.admit() {
            Ok(probe) => probe,
            Err((wait, message)) => {
                return Err(PublishError::unavailable(message).with_retry_after(wait));
            }
        };
        let result = self.inner.publish_to(event, destination).await;
        self.settle(probe, result)
    }

    fn health(&self) -> Vec<SinkHealth> {
        vec![self.health_now()]
    }
}

#[async_trait]
impl<S: RoutableSink> Sink for Breaker<S> {
    async fn publish(&self, event: &OutboxEvent) -> Result<(), PublishError> {
        self.publish_to(event, None).await
    }

    fn health(&self) -> Vec<SinkHealth> {
        vec![self.health_now()]
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use super::*;

    /// A destination that is down until told otherwise, counting what reaches it.
    #[derive(Default)]
    struct Flaky {
        up: AtomicBool,
        calls: AtomicUsize,
    }

    #[async_trait]
    impl RoutableSink for Arc<Flaky> {
        async fn publish_to(
            &self,
            _event: &OutboxEvent,
            _destination: Option<&Template>,
        ) -> Result<(), PublishError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if self.up.load(Ordering::SeqCst) {
                Ok(())
            } else {
                Err(PublishError::unavailable("connection refused"))
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_outage_is_probed_with_backoff_and_ends_at_the_first_success() {
        let dest = Arc::new(Flaky::default());
        let breaker = Breaker::new("hook", Arc::clone(&dest));
        let event = postbox_testkit::event(1).build();
        // The first failure opens the breaker; what follows fails fast, without a call.
        let first = breaker.publish(&event).await.unwrap_err();
        assert!(first.is_unavailable());
        assert_eq!(first.retry_after(), Some(Duration::from_millis(250)));
        for _ in 0..50 {
            let e = breaker.publish(&event).await.unwrap_err();
            assert!(
                e.is_unavailable() && e.to_string().contains("hook is down since"),
                "{e}"
            );
        }
        assert_eq!(dest.calls.load(Ordering::SeqCst), 1);
        assert!(!Sink::health(&breaker)[0].up);
        // Probes come at 250 ms, then 500 ms, 1 s, … later.
        tokio::time::advance(Duration::from_millis(250)).await;
        let probe = breaker.publish(&event).await.unwrap_err();
        assert_eq!(probe.retry_after(), Some(Duration::from_millis(500)));
        assert_eq!(dest.calls.load(Ordering::SeqCst), 2);
        tokio::time::advance(Duration::from_millis(499)).await;
        assert!(breaker.publish(&event).await.is_err());
        assert_eq!(
            dest.calls.load(Ordering::SeqCst),
            2,
            "no call before the next probe"
        );
        dest.up.store(true, Ordering::SeqCst);
        tokio::time::advance(Duration::from_millis(1)).await;
        breaker.publish(&event).await.unwrap();
        assert!(Sink::health(&breaker)[0].up);
        for _ in 0..10 {
            breaker.publish(&event).await.unwrap();
        }
        assert_eq!(dest.calls.load(Ordering::SeqCst), 13, "full speed again");
    }

    #[tokio::test(start_paused = true)]
    async fn the_probe_backoff_stops_at_its_cap() {
        let dest = Arc::new(Flaky::default());
        let breaker = Breaker::new("hook", Arc::clone(&dest));
        let event = postbox_testkit::event(1).build();
        let mut last = Duration::ZERO;
        for _ in 0..12 {
            let e = breaker.publish(&event).await.unwrap_err();
            last = e.retry_after().unwrap();
            tokio::time::advance(last).await;
        }
        assert_eq!(last, Duration::from_secs(30));
    }
}
