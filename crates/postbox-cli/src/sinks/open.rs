//! Opening the planned sinks: connecting to the brokers, building the router.
//!
//! A broker that cannot be reached at start-up does not stop the relay: the sink keeps
//! connecting in the background, and events for it fail as retryable (they wait with backoff,
//! other sinks' events flow) until it is up. Configuration mistakes still stop the relay.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use anyhow::Context;
use async_trait::async_trait;
use postbox::{OutboxEvent, PublishError, Sink};
use postbox_sinks::{
    AmqpSink, KafkaSink, MqttSink, NatsSink, RedisSink, RoutableSink, Route, Router, Template,
    Unmatched, WebhookSink,
};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::plan::{RoutePlan, RouteSpec, SinkPlan};
use super::spec::SinkSpec;
use super::stdout::{NullSink, StdoutSink};
use crate::config::SinkKind;

/// The relay's sink, opened.
pub(crate) struct Opened {
    /// What the relay publishes to.
    pub(crate) sink: Arc<dyn Sink>,
    /// Completes with the error once stdout breaks, if stdout is one of the sinks.
    pub(crate) stdout_broken: Option<Pin<Box<dyn Future<Output = String> + Send>>>,
}

/// Opens the sinks of `plan`; the named sinks of a routed plan concurrently.
pub(crate) async fn open(plan: SinkPlan) -> anyhow::Result<Opened> {
    let mut stdout = None;
    let sink: Arc<dyn Sink> = match plan {
        SinkPlan::Single(spec) => {
            let kind = spec.kind();
            let sink = open_one(spec, &mut stdout)
                .await
                .with_context(|| format!("cannot start the {kind} sink"))?;
            Arc::new(OwnDestination(sink))
        }
        SinkPlan::Routed(plan) => Arc::new(router(plan, &mut stdout).await?),
    };
    let stdout_broken = stdout.map(|s: Arc<StdoutSink>| {
        Box::pin(s.broken()) as Pin<Box<dyn Future<Output = String> + Send>>
    });
    Ok(Opened {
        sink,
        stdout_broken,
    })
}

async fn router(plan: RoutePlan, stdout: &mut Option<Arc<StdoutSink>>) -> anyhow::Result<Router> {
    // Stdout first and alone: it is opened once and shared by every sink of that kind.
    let mut opened = std::collections::BTreeMap::new();
    let mut brokers = Vec::new();
    for (name, spec) in plan.sinks {
        match spec {
            SinkSpec::Stdout | SinkSpec::Null | SinkSpec::Webhook(_) => {
                let sink = open_one(spec, stdout)
                    .await
                    .with_context(|| format!("cannot start sink `sinks.{name}`"))?;
                opened.insert(name, sink);
            }
            spec => brokers.push(async move {
                let mut none = None;
                let sink = open_one(spec, &mut none)
                    .await
                    .with_context(|| format!("cannot start sink `sinks.{name}`"));
                (name, sink)
            }),
        }
    }
    for (name, sink) in futures::future::join_all(brokers).await {
        opened.insert(name, sink?);
    }
    let route = |spec: RouteSpec| -> anyhow::Result<Route> {
        let sink = opened
            .get(&spec.sink)
            .cloned()
            .with_context(|| format!("{}: sink {:?} was not opened", spec.label, spec.sink))?;
        let mut route = Route::new(spec.label, spec.sink, sink, spec.topic);
        if let Some(glob) = spec.event_type {
            route = route.event_type(glob);
        }
        if let Some(glob) = spec.aggregate_type {
            route = route.aggregate_type(glob);
        }
        Ok(route)
    };
    let routes = plan
        .routes
        .into_iter()
        .map(route)
        .collect::<anyhow::Result<Vec<_>>>()?;
    let unmatched = match plan.default_route {
        Some(spec) => Unmatched::Default(Box::new(route(spec)?)),
        None => Unmatched::Fail,
    };
    Ok(Router::new(routes, unmatched))
}

/// Opens one sink. A broker that cannot be reached yet gives a [`Connecting`] sink.
async fn open_one(
    spec: SinkSpec,
    stdout: &mut Option<Arc<StdoutSink>>,
) -> anyhow::Result<Arc<dyn RoutableSink>> {
    let kind = spec.kind();
    let label = format!("{kind} sink at {}", spec.address());
    let sink: Arc<dyn RoutableSink> = match spec {
        SinkSpec::Stdout => match stdout {
            Some(shared) => shared.clone(),
            None => {
                let sink = Arc::new(StdoutSink::start().context("cannot start the stdout writer")?);
                *stdout = Some(sink.clone());
                sink
            }
        },
        SinkSpec::Null => Arc::new(NullSink),
        SinkSpec::Webhook(config) => Arc::new(WebhookSink::new(config)?),
        SinkSpec::Nats(config) => {
            let retry = config.reconnect_max_delay;
            Connecting::start(kind, label, retry, move || {
                let config = config.clone();
                Box::pin(async move {
                    Ok(Arc::new(NatsSink::connect(config).await?) as Arc<dyn RoutableSink>)
                })
            })
            .await?
        }
        SinkSpec::Amqp(config) => {
            let retry = config.reconnect_max_delay;
            Connecting::start(kind, label, retry, move || {
                let config = config.clone();
                Box::pin(async move {
                    Ok(Arc::new(AmqpSink::connect(config).await?) as Arc<dyn RoutableSink>)
                })
            })
            .await?
        }
        SinkSpec::Kafka(config) => {
            Connecting::start(kind, label, Duration::from_secs(2), move || {
                let config = config.clone();
                Box::pin(async move {
                    Ok(Arc::new(KafkaSink::connect(config).await?) as Arc<dyn RoutableSink>)
                })
            })
            .await?
        }
        SinkSpec::Redis(config) => {
            let retry = config.reconnect_max_delay;
            Connecting::start(kind, label, retry, move || {
                let config = config.clone();
                Box::pin(async move {
                    Ok(Arc::new(RedisSink::connect(config).await?) as Arc<dyn RoutableSink>)
                })
            })
            .await?
        }
        SinkSpec::Mqtt(config) => {
            let retry = config.reconnect_max_delay;
            Connecting::start(kind, label, retry, move || {
                let config = config.clone();
                Box::pin(async move {
                    Ok(Arc::new(MqttSink::connect(config).await?) as Arc<dyn RoutableSink>)
                })
            })
            .await?
        }
    };
    Ok(sink)
}

/// A single sink publishes every event to its own configured destination.
struct OwnDestination(Arc<dyn RoutableSink>);

#[async_trait]
impl Sink for OwnDestination {
    async fn publish(&self, event: &OutboxEvent) -> Result<(), PublishError> {
        self.0.publish_to(event, None).await
    }
}

/// A boxed connection attempt.
type ConnectFuture =
    Pin<Box<dyn Future<Output = postbox_sinks::Result<Arc<dyn RoutableSink>>> + Send>>;

/// A broker sink whose first connection failed: it keeps connecting in the background, and
/// until it succeeds every publish fails as retryable with the last connection error.
struct Connecting {
    /// The kind of sink, e.g. `redis`; the last error names the broker's address.
    kind: String,
    state: Arc<ConnectState>,
    task: JoinHandle<()>,
}

#[derive(Default)]
struct ConnectState {
    sink: OnceLock<Arc<dyn RoutableSink>>,
    last_error: Mutex<String>,
}

impl Connecting {
    /// Connects once; on success returns the sink itself. When the broker cannot be reached
    /// (`Error::Connect`), logs a warning and returns a sink that keeps trying, waiting from
    /// 100 ms up to `max_delay` between attempts. Any other error (a configuration mistake) is
    /// returned.
    async fn start<F>(
        kind: SinkKind,
        label: String,
        max_delay: Duration,
        connect: F,
    ) -> anyhow::Result<Arc<dyn RoutableSink>>
    where
        F: Fn() -> ConnectFuture + Send + Sync + 'static,
    {
        let error = match connect().await {
            Ok(sink) => return Ok(sink),
            Err(e @ postbox_sinks::Error::Connect { .. }) => e,
            Err(e) => return Err(e.into()),
        };
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
        let task = tokio::spawn(keep_connecting(
            label.clone(),
            state.clone(),
            max_delay,
            connect,
        ));
        Ok(Arc::new(Connecting {
            kind: format!("{kind} sink"),
            state,
            task,
        }))
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
    let mut waits = postbox::Backoff::new(Duration::from_millis(100), max_delay).attempts();
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

impl Drop for Connecting {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[async_trait]
impl RoutableSink for Connecting {
    async fn publish_to(
        &self,
        event: &OutboxEvent,
        destination: Option<&Template>,
    ) -> Result<(), PublishError> {
        if let Some(sink) = self.state.sink.get() {
            return sink.publish_to(event, destination).await;
        }
        let last = self
            .state
            .last_error
            .lock()
            .map(|e| e.clone())
            .unwrap_or_default();
        Err(PublishError::retryable(format!(
            "{}: not connected yet, still trying; last attempt: {last}",
            self.kind
        )))
    }
}

#[cfg(test)]
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
        ) -> Result<(), PublishError> {
            Ok(())
        }
    }

    fn event() -> OutboxEvent {
        postbox_testkit::event(1).event_type("E").build()
    }

    #[tokio::test(start_paused = true)]
    async fn an_unreachable_broker_is_retried_in_the_background() {
        let attempts = Arc::new(AtomicUsize::new(0));
        let counter = attempts.clone();
        let sink = Connecting::start(
            SinkKind::Redis,
            "test sink".into(),
            Duration::from_millis(400),
            move || {
                let n = counter.fetch_add(1, Ordering::SeqCst);
                Box::pin(async move {
                    if n < 3 {
                        Err(postbox_sinks::Error::Connect {
                            broker: "Test",
                            address: "127.0.0.1:1".into(),
                            source: "connection refused".into(),
                        })
                    } else {
                        Ok(Arc::new(Ack) as Arc<dyn RoutableSink>)
                    }
                })
            },
        )
        .await
        .expect("starts although the broker is away");
        let err = sink.publish_to(&event(), None).await.expect_err("not yet");
        assert!(!err.is_permanent());
        assert!(
            err.to_string().contains("not connected yet") && err.to_string().contains("refused"),
            "{err}"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        sink.publish_to(&event(), None)
            .await
            .expect("connected by now");
        assert_eq!(attempts.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn configuration_errors_stop_the_start() {
        let err = Connecting::start(
            SinkKind::Redis,
            "test sink".into(),
            Duration::from_secs(1),
            || {
                Box::pin(async {
                    Err(postbox_sinks::Error::Config {
                        field: "url",
                        reason: "not a URL".into(),
                    })
                })
            },
        )
        .await
        .err()
        .expect("refused");
        assert!(err.to_string().contains("url"), "{err}");
    }
}
