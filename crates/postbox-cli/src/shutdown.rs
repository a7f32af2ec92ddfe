//! Graceful shutdown on SIGINT and SIGTERM: the first signal asks the relay to stop claiming and
//! finish the batch in flight; a second one exits at once.

use std::future::Future;

use anyhow::Context;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;
use tracing::{info, warn};

/// The shutdown request, shared by whoever waits for it.
#[derive(Clone, Debug)]
pub(crate) struct Shutdown {
    received: watch::Receiver<Option<&'static str>>,
}

impl Shutdown {
    /// Starts listening for SIGINT and SIGTERM. Call it before any work starts, so a signal is
    /// never missed (or left to its default action, which kills the process).
    pub(crate) fn install() -> anyhow::Result<Shutdown> {
        let mut term = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
        let mut int = signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?;
        let (tx, received) = watch::channel(None);
        tokio::spawn(async move {
            let first = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            info!(
                signal = first,
                "shutting down: no new claims; finishing the batch in flight (send the signal again to exit at once)"
            );
            tx.send_replace(Some(first));
            let (second, code) = tokio::select! {
                _ = term.recv() => ("SIGTERM", 143),
                _ = int.recv() => ("SIGINT", 130),
            };
            warn!(
                signal = second,
                "second signal: exiting now; events in flight are published again once their lease expires"
            );
            std::process::exit(code);
        });
        Ok(Shutdown { received })
    }

    /// Completes when a signal has been received.
    pub(crate) fn requested(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.received.clone();
        async move {
            // An error means the listener is gone, which only happens at exit: treat as a request.
            let _ = rx.wait_for(Option::is_some).await;
        }
    }

    /// The signal received, if any.
    pub(crate) fn received(&self) -> Option<&'static str> {
        *self.received.borrow()
    }
}
