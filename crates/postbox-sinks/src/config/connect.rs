//! Opening a configured sink: connecting, or keeping trying in the background while its broker
//! cannot be reached, behind a breaker when it has a destination that can be down.

use std::sync::Arc;
use std::time::Duration;

use super::{SinkConfig, SinkKind};
use crate::open::{Reconnecting, Shared};
use crate::{Error, Result, RoutableSink};

impl SinkConfig {
    /// Opens the sink. A broker that cannot be reached yet does not fail the start: the sink
    /// keeps connecting in the background (waiting up to its `reconnect_max_delay` between
    /// attempts) and its events fail as retryable until it is up. A configuration mistake
    /// fails.
    ///
    /// Every kind with a destination is opened behind a [`crate::Breaker`] named `name`: once
    /// the destination is down its events wait without spending tries, and it is probed until
    /// it is back.
    pub async fn open(&self, name: &str) -> Result<Arc<dyn RoutableSink>> {
        self.open_shared(name, &Shared::default()).await
    }

    pub(crate) async fn open_shared(
        &self,
        name: &str,
        shared: &Shared,
    ) -> Result<Arc<dyn RoutableSink>> {
        let label = match self.address() {
            a if a.is_empty() => format!("{} sink", self.kind()),
            a => format!("{} sink at {a}", self.kind()),
        };
        let sink = connect_or_keep_trying(self.kind(), label, self.clone(), shared).await?;
        Ok(with_breaker(self.kind(), name, sink))
    }

    pub(crate) fn reconnect_max_delay(&self) -> Option<Duration> {
        self.settings().reconnect_max_delay()
    }

    pub(crate) async fn connect(&self, shared: &Shared) -> Result<Arc<dyn RoutableSink>> {
        self.settings().connect(shared).await
    }
}

/// Connects `config` once; when the broker cannot be reached ([`Error::Connect`]) and the kind
/// connects to one, logs a warning and returns a [`Reconnecting`] sink that keeps trying.
pub(crate) async fn connect_or_keep_trying(
    kind: SinkKind,
    label: String,
    config: SinkConfig,
    shared: &Shared,
) -> Result<Arc<dyn RoutableSink>> {
    let max_delay = config.reconnect_max_delay();
    let first = config.connect(shared).await;
    let Some(max_delay) = max_delay else {
        return first;
    };
    let error = match first {
        Ok(sink) => return Ok(sink),
        Err(e @ Error::Connect { .. }) => e,
        Err(e) => return Err(e),
    };
    let config = Arc::new(config);
    Ok(Reconnecting::start(
        &kind.to_string(),
        label,
        max_delay,
        error,
        move || {
            let config = Arc::clone(&config);
            Box::pin(async move {
                // Brokers' connect never uses what is shared (only stdout does).
                config.connect(&Shared::default()).await
            })
        },
    ))
}

/// `sink` behind a [`crate::Breaker`] named `name`, for the kinds that have a destination that
/// can be down (every kind but stdout and null).
pub(crate) fn with_breaker(
    kind: SinkKind,
    name: &str,
    sink: Arc<dyn RoutableSink>,
) -> Arc<dyn RoutableSink> {
    if kind.destination_key().is_some() {
        Arc::new(crate::Breaker::new(name, sink))
    } else {
        sink
    }
}
