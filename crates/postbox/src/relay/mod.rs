//! The relay: claims committed events, publishes them to a [`Sink`], marks them, retries
//! failures and recovers the leases of dead relays (docs/architecture.md, "The contract").
//!
//! It is made of small parts with one job each, started and stopped together by
//! [`Relay::run`] (or [`Relay::start`]):
//!
//! - `targets`: the default schema and every active tenant, served in turn;
//! - `pipeline`: claim → publish → mark, events recorded as they finish, claims as soon as
//!   there is room, with `publish` (timeouts, panics caught) and `lease` (renewals while
//!   publishing), timed by `timing` (renewals, flushes and the patience of writes, and the
//!   rule they keep together);
//! - `waker`: when the next round runs — notifications, polling, scheduled retries;
//! - `maintenance`: vacuuming the tables it serves, retention, the slow lane and sink health
//!   reports, beside the work;
//! - `rounds`: each round counted as it finishes, for whoever waits on the relay;
//! - `run`: the loop itself, rounds of claims and the waits between them.

mod config;
mod handle;
mod lease;
mod maintenance;
mod notice;
mod pipeline;
mod policy;
mod publish;
mod rounds;
mod run;
mod stats;
mod targets;
mod timing;
mod waker;

use std::future::Future;
use std::sync::Arc;

use tokio::sync::watch;

pub use config::{EffectivePolicy, RelayConfig, RetryPolicy};
pub use handle::RelayHandle;
pub use notice::{FailedNotice, Notice};
pub use rounds::{RelayProgress, Rounds};
pub use stats::RelayStats;

use crate::error::Result;
use crate::schema::Target;
use crate::sink::Sink;
use crate::store::Store;
use pipeline::Pipeline;
use stats::LiveStats;
use waker::RetrySchedule;

/// A relay over one store and one sink.
///
/// ```no_run
/// use postbox::{handlers::Handlers, Relay, RelayConfig};
///
/// # async fn example() -> anyhow::Result<()> {
/// let store = postbox::connect("postgres://localhost/app").await?;
/// let handlers = Handlers::new().on_any(|e| async move {
///     println!("{} {}", e.id, e.event_type);
///     Ok::<_, std::io::Error>(())
/// });
/// let relay = Relay::new(store, handlers, RelayConfig::default())?;
/// // Runs until Ctrl-C, then finishes the batch in flight and returns.
/// relay.run(async { let _ = tokio::signal::ctrl_c().await; }).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Relay {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    store: Arc<dyn Store>,
    sink: Arc<dyn Sink>,
    config: RelayConfig,
    id: String,
    retries: RetrySchedule,
    live: Arc<LiveStats>,
    notices: tokio::sync::broadcast::Sender<Notice>,
    rounds: Arc<rounds::Tracker>,
    /// The `tenant` label values of its metrics.
    labels: Arc<crate::metrics::TenantLabels>,
}

impl Inner {
    /// The `tenant` label to record `tenant`'s metrics under (see
    /// [`RelayConfig::metrics_tenants`]).
    fn metric_tenant(&self, tenant: &str) -> String {
        self.labels.label(tenant)
    }
}

/// Whether the loop stops when the work runs out.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Forever,
    Drain,
}

impl Relay {
    /// A relay; fails if `config` is invalid.
    pub fn new(store: impl Store, sink: impl Sink, config: RelayConfig) -> Result<Self> {
        Self::from_parts(Arc::new(store), Arc::new(sink), config)
    }

    /// A relay over a shared store and sink.
    pub fn from_parts(
        store: Arc<dyn Store>,
        sink: Arc<dyn Sink>,
        config: RelayConfig,
    ) -> Result<Self> {
        config.validate()?;
        let id = config.relay_id.clone().unwrap_or_else(default_relay_id);
        Ok(Relay {
            inner: Arc::new(Inner {
                store,
                sink,
                id,
                retries: RetrySchedule::default(),
                live: Arc::default(),
                notices: tokio::sync::broadcast::channel(notice::CAPACITY).0,
                rounds: Arc::default(),
                labels: Arc::new(crate::metrics::TenantLabels::new(config.metrics_tenants)),
                config,
            }),
        })
    }

    /// The `tenant` label this relay records `tenant`'s metrics under: its own id for the first
    /// [`metrics_tenants`](RelayConfig::metrics_tenants) tenants, else
    /// [`OTHER_TENANTS`](crate::metrics::OTHER_TENANTS) (for gauges recorded beside the
    /// relay's, such as the admin server's).
    pub fn metric_tenant(&self, tenant: &str) -> String {
        self.inner.metric_tenant(tenant)
    }

    /// This relay's id, as written to `locked_by`.
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// The sink this relay publishes to (for a replay to the same destinations).
    pub fn sink(&self) -> Arc<dyn Sink> {
        Arc::clone(&self.inner.sink)
    }

    /// What this relay did so far, across its runs.
    pub fn stats(&self) -> RelayStats {
        self.inner.live.snapshot()
    }

    /// What the sink says of its destinations: which are down, since when (empty for a sink
    /// that does not track its destinations, such as in-process handlers).
    pub fn sinks(&self) -> Vec<crate::sink::SinkHealth> {
        self.inner.sink.health()
    }

    /// Notices of what an operator should hear about as it happens (an event that went
    /// `FAILED`), for an alert sink. A subscriber that falls more than a few hundred notices
    /// behind misses the oldest ones (and is told how many); the relay never waits for one.
    ///
    /// ```no_run
    /// # async fn example(relay: postbox::Relay) {
    /// let mut notices = relay.subscribe();
    /// while let Ok(notice) = notices.recv().await {
    ///     if let postbox::relay::Notice::Failed(failed) = notice {
    ///         eprintln!("event {} FAILED: {}", failed.event_id, failed.error);
    ///     }
    /// }
    /// # }
    /// ```
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Notice> {
        self.inner.notices.subscribe()
    }

    /// Watches this relay's rounds as they finish, and whether it is waiting for the next: what
    /// a test or an embedding service waits on to know the relay has looked again (see
    /// [`Rounds`]).
    pub fn rounds(&self) -> Rounds {
        self.inner.rounds.watch()
    }

    /// Relays until `shutdown` completes; then stops claiming, finishes the batch in flight, and
    /// returns. Database errors are logged and retried, never fatal.
    pub async fn run(&self, shutdown: impl Future<Output = ()> + Send) -> Result<RelayStats> {
        self.run_mode(Mode::Forever, shutdown).await
    }

    /// Relays until every event of every served target is `PROCESSED` or `FAILED` (waiting out
    /// backoffs and the leases of dead relays), or until `shutdown` completes.
    ///
    /// Destinations that are down are waited for up to
    /// [`drain_patience`](RelayConfig::drain_patience); past it the drain returns
    /// [`Error::Unavailable`](crate::Error::Unavailable), and their events stay `PENDING` with no try spent.
    pub async fn drain(&self, shutdown: impl Future<Output = ()> + Send) -> Result<RelayStats> {
        self.run_mode(Mode::Drain, shutdown).await
    }

    /// Starts the relay on the current tokio runtime, in the background of the embedding
    /// service; the handle reads its stats and stops it.
    pub fn start(&self) -> RelayHandle {
        let (stop, stop_rx) = watch::channel(false);
        let relay = self.clone();
        let task = tokio::spawn(async move { relay.work(Mode::Forever, stop_rx).await });
        RelayHandle {
            stop,
            task,
            relay: self.clone(),
        }
    }

    /// Claims, publishes and marks one batch of `target`. Public for tests and tools that want
    /// to step a relay by hand; returns the batch's stats and whether it was full.
    pub async fn batch(&self, target: &Target) -> Result<(RelayStats, bool)> {
        let mut pipeline = Pipeline::new(Arc::clone(&self.inner));
        let claimed = pipeline.claim(target).await?;
        pipeline.finish().await?;
        Ok((pipeline.take_stats(), claimed.full))
    }
}

fn default_relay_id() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "relay".to_owned());
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    format!("{host}-{}-{}", std::process::id(), &suffix[..6])
}

impl std::fmt::Debug for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Forever => "run",
            Mode::Drain => "drain",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send<T: Send>(_: &T) {}

    /// Compile-time check: relays are spawned on multi-threaded runtimes, so their futures must
    /// stay `Send`.
    #[allow(dead_code, reason = "only compiled, never run")]
    fn relay_futures_are_send(relay: Relay, target: Target) {
        assert_send(&relay.run(async {}));
        assert_send(&relay.drain(async {}));
        assert_send(&relay.batch(&target));
    }
}
