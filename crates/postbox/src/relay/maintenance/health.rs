//! Sink health reports: what this relay sees of its sinks, written for the operator's side.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tracing::debug;

use crate::metrics as metric;
use crate::store::Store;

/// How often sink health is reported while unchanged (so `postbox status` can tell a live report
/// from a relay that stopped).
const HEALTH_EVERY: Duration = Duration::from_secs(15);

/// How often the sinks' health is looked at.
const HEALTH_CHECK: Duration = Duration::from_secs(1);

pub(super) struct HealthReports {
    last_check: Option<Instant>,
    last_report: Option<(Instant, Vec<crate::sink::SinkHealth>)>,
    task: Option<JoinHandle<()>>,
}

impl HealthReports {
    pub(super) fn new() -> Self {
        HealthReports {
            last_check: None,
            last_report: None,
            task: None,
        }
    }

    /// Looks at the sinks' health now and then; reports it when it changed, and every
    /// `HEALTH_EVERY` while it does not.
    pub(super) fn tick(
        &mut self,
        store: &Arc<dyn Store>,
        sink: &Arc<dyn crate::sink::Sink>,
        relay_id: &str,
    ) {
        if self
            .last_check
            .is_some_and(|at| at.elapsed() < HEALTH_CHECK)
            || self.task.as_ref().is_some_and(|t| !t.is_finished())
        {
            return;
        }
        self.last_check = Some(Instant::now());
        let health = sink.health();
        if health.is_empty() {
            return;
        }
        for h in &health {
            metrics::gauge!(metric::SINK_UP, "sink" => h.name.clone()).set(if h.up {
                1.0
            } else {
                0.0
            });
        }
        let due = match &self.last_report {
            Some((at, last)) => *last != health || at.elapsed() >= HEALTH_EVERY,
            None => true,
        };
        if !due {
            return;
        }
        self.last_report = Some((Instant::now(), health.clone()));
        let store = Arc::clone(store);
        let relay_id = relay_id.to_owned();
        self.task = Some(tokio::spawn(async move {
            if let Err(e) = store.sinks_report(&relay_id, &health).await {
                debug!(error = %e, "cannot report sink health; trying again later");
            }
        }));
    }

    /// Withdraws this relay's reports: it serves no sink any more.
    pub(super) async fn stop(&mut self, store: &Arc<dyn Store>, relay_id: &str) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        if self.last_report.is_some() {
            let _ = store.sinks_report(relay_id, &[]).await;
        }
    }
}
