//! A relay running in the background of an embedding service: watch its stats, stop it.

use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::RelayStats;
use super::stats::LiveStats;
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
    pub(super) live: Arc<LiveStats>,
}

impl RelayHandle {
    /// What the relay did so far.
    pub fn stats(&self) -> RelayStats {
        self.live.snapshot()
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
        let live = self.live;
        match self.task.await {
            Ok(result) => result,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // The runtime is shutting down and took the relay with it.
            Err(_) => Ok(live.snapshot()),
        }
    }
}
