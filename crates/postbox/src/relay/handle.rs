//! A relay running in the background of an embedding service: watch its stats, stop it.

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::RelayStats;
use crate::error::Result;

/// A relay started with [`Relay::start`](super::Relay::start) on the current tokio runtime.
///
/// ```no_run
/// # async fn example(relay: postbox::Relay) -> postbox::Result<()> {
/// let handle = relay.start();
/// // … the service runs …
/// println!("published so far: {}", handle.stats().published);
/// let totals = handle.stop().await?; // finishes the batch in flight
/// # let _ = totals; Ok(()) }
/// ```
pub struct RelayHandle {
    pub(super) stop: watch::Sender<bool>,
    pub(super) task: JoinHandle<Result<RelayStats>>,
    pub(super) relay: super::Relay,
}

impl RelayHandle {
    /// What the relay did so far.
    pub fn stats(&self) -> RelayStats {
        self.relay.stats()
    }

    /// The relay itself: its id, its notices ([`Relay::subscribe`](super::Relay::subscribe)).
    pub fn relay(&self) -> &super::Relay {
        &self.relay
    }

    /// Watches the relay's rounds ([`Relay::rounds`](super::Relay::rounds)).
    pub fn rounds(&self) -> super::Rounds {
        self.relay.rounds()
    }

    /// What the sink says of its destinations: which are down, since when.
    pub fn sinks(&self) -> Vec<crate::sink::SinkHealth> {
        self.relay.sinks()
    }

    /// Whether the relay has stopped (asked to, or on an error an operator must fix).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Asks the relay to stop: it stops claiming, finishes the batch in flight, and returns its
    /// totals (or the error that stopped it earlier).
    pub async fn stop(self) -> Result<RelayStats> {
        let _ = self.stop.send(true);
        self.wait().await
    }

    /// Waits until the relay stops on its own (a drain that finished, an error).
    pub async fn wait(self) -> Result<RelayStats> {
        match self.task.await {
            Ok(result) => result,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // The runtime is shutting down and took the relay with it.
            Err(_) => Ok(self.relay.stats()),
        }
    }
}
