//! The Prometheus recorder: every `metrics` call of the relay lands in it, and `/metrics`
//! renders it in the text exposition format.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::error::AdminError;

/// Buckets of the latency histograms, in seconds: 1 ms to 5 minutes (a backlog's events wait).
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];
/// Buckets of statement durations, in seconds.
const STATEMENT_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];
/// Buckets of batch sizes, in events.
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the Prometheus recorder as this process's `metrics` recorder (once; later calls
/// return the same handle) and describes Postbox's metrics. Fails if another recorder was
/// installed first.
pub fn install_metrics() -> Result<PrometheusHandle, AdminError> {
    if let Some(handle) = HANDLE.get() {
        return Ok(handle.clone());
    }
    let builder = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full("postbox_publish_latency_seconds".to_owned()),
            LATENCY_BUCKETS,
        )
        .and_then(|b| {
            b.set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), STATEMENT_BUCKETS)
        })
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full("postbox_batch_size".to_owned()),
                BATCH_BUCKETS,
            )
        })
        .map_err(|e| AdminError::Metrics(e.to_string()))?;
    let recorder = builder.build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).map_err(|e| AdminError::Metrics(e.to_string()))?;
    describe();
    let handle = HANDLE.get_or_init(|| handle).clone();
    // Keeps the histograms' summaries from growing: the recorder needs an upkeep now and then;
    // a render does it too, but a scraper may be absent for hours.
    let upkeep = handle.clone();
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move {
            let mut every = tokio::time::interval(std::time::Duration::from_secs(5));
            loop {
                every.tick().await;
                upkeep.run_upkeep();
            }
        });
    }
    Ok(handle)
}

/// What a metric is.
#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
    Histogram(Option<metrics::Unit>),
}

/// Every metric Postbox records, with its help text: the list `/metrics` describes, and the
/// one `deploy/` and `docs/operations.md` are checked against.
const METRICS: &[(&str, Kind, &str)] = &[
    (
        "postbox_events_published_total",
        Kind::Counter,
        "Events published and marked PROCESSED",
    ),
    (
        "postbox_publish_failures_total",
        Kind::Counter,
        "Failed tries recorded (publish errors, timeouts, panics)",
    ),
    (
        "postbox_publish_outcomes_total",
        Kind::Counter,
        "What destinations answered, per route: ok, failed (a try spent) or unavailable (put back)",
    ),
    (
        "postbox_events_failed_total",
        Kind::Counter,
        "Events that went FAILED (out of tries, refused for good, unreadable)",
    ),
    (
        "postbox_stale_recovered_total",
        Kind::Counter,
        "Stale events taken over from a relay whose lease ran out",
    ),
    (
        "postbox_events_fenced_total",
        Kind::Counter,
        "Results not recorded because another relay had taken the events over",
    ),
    (
        "postbox_events_deferred_total",
        Kind::Counter,
        "Events put back without spending a try because their destination was down",
    ),
    (
        "postbox_vacuums_total",
        Kind::Counter,
        "VACUUM runs of outbox tables",
    ),
    (
        "postbox_events_archived_total",
        Kind::Counter,
        "PROCESSED events moved to the archive",
    ),
    (
        "postbox_events_purged_total",
        Kind::Counter,
        "Events purged",
    ),
    (
        "postbox_publish_latency_seconds",
        Kind::Histogram(Some(metrics::Unit::Seconds)),
        "From an event's insert (database clock) to its destination's acknowledgement",
    ),
    (
        "postbox_claim_seconds",
        Kind::Histogram(Some(metrics::Unit::Seconds)),
        "Duration of one claim",
    ),
    (
        "postbox_mark_seconds",
        Kind::Histogram(Some(metrics::Unit::Seconds)),
        "Duration of one mark of published events",
    ),
    (
        "postbox_batch_seconds",
        Kind::Histogram(Some(metrics::Unit::Seconds)),
        "From a claim to the last of its events recorded",
    ),
    (
        "postbox_batch_size",
        Kind::Histogram(None),
        "Events per claim",
    ),
    (
        "postbox_events",
        Kind::Gauge,
        "Events in the outbox table by status (PROCESSED is an estimate on large tables)",
    ),
    (
        "postbox_oldest_pending_age_seconds",
        Kind::Gauge,
        "Age of the oldest PENDING or PROCESSING event in seconds (0 when none)",
    ),
    (
        "postbox_sink_up",
        Kind::Gauge,
        "1 when the sink accepts events, 0 when down",
    ),
    (
        "postbox_sink_down_seconds",
        Kind::Gauge,
        "How long the sink has been down in seconds (0 when up)",
    ),
    (
        "postbox_build_info",
        Kind::Gauge,
        "Postbox's version (always 1)",
    ),
];

/// The names of every metric Postbox records.
pub fn metric_names() -> impl Iterator<Item = &'static str> {
    METRICS.iter().map(|(name, _, _)| *name)
}

/// The help text of every metric, and the build info.
fn describe() {
    for (name, kind, help) in METRICS {
        match kind {
            Kind::Counter => metrics::describe_counter!(*name, *help),
            Kind::Gauge => metrics::describe_gauge!(*name, *help),
            Kind::Histogram(Some(unit)) => metrics::describe_histogram!(*name, *unit, *help),
            Kind::Histogram(None) => metrics::describe_histogram!(*name, *help),
        }
    }
    metrics::gauge!("postbox_build_info", "version" => env!("CARGO_PKG_VERSION")).set(1.0);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dashboard and the alert rules use only metrics that exist; the docs list them all.
    #[test]
    fn deploy_files_and_docs_name_only_real_metrics() {
        let names: Vec<&str> = metric_names().collect();
        let deploy = [
            include_str!("../../../deploy/grafana-dashboard.json"),
            include_str!("../../../deploy/prometheus-alerts.yml"),
        ];
        for text in deploy {
            for used in text
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("postbox_"))
            {
                let base = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|suffix| used.strip_suffix(suffix))
                    .unwrap_or(used);
                assert!(
                    names.contains(&base),
                    "deploy/ uses {used}, which Postbox does not record"
                );
            }
        }
        let docs = include_str!("../../../docs/operations.md");
        for name in names {
            assert!(
                docs.contains(&format!("`{name}")),
                "docs/operations.md lacks {name}"
            );
        }
    }
}
