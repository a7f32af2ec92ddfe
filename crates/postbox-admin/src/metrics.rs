//! The Prometheus recorder: every `metrics` call of the relay lands in it, and `/metrics`
//! renders it in the text exposition format.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use postbox::metrics::{self as metric, MetricKind};

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
            Matcher::Full(metric::PUBLISH_LATENCY.to_owned()),
            LATENCY_BUCKETS,
        )
        .and_then(|b| {
            b.set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), STATEMENT_BUCKETS)
        })
        .and_then(|b| {
            b.set_buckets_for_metric(Matcher::Full(metric::BATCH_SIZE.to_owned()), BATCH_BUCKETS)
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

/// The names of every metric Postbox records ([`postbox::metrics::ALL`]).
pub fn metric_names() -> impl Iterator<Item = &'static str> {
    postbox::metrics::ALL.iter().map(|m| m.name)
}

/// The help text of every metric ([`postbox::metrics::ALL`]), and the build info.
fn describe() {
    for m in postbox::metrics::ALL {
        let (name, help) = (m.name, m.help);
        match m.kind {
            MetricKind::Counter => metrics::describe_counter!(name, help),
            MetricKind::Histogram if name.ends_with("_seconds") => {
                metrics::describe_histogram!(name, metrics::Unit::Seconds, help)
            }
            MetricKind::Histogram => metrics::describe_histogram!(name, help),
            MetricKind::Gauge => metrics::describe_gauge!(name, help),
            // A kind added later: recorded, not described, until it is named here.
            _ => {}
        }
    }
    metrics::gauge!(metric::BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
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
        for m in postbox::metrics::ALL {
            let entry = format!("`{}{{{}}}`", m.name, m.labels.join(","));
            assert!(
                docs.contains(&entry),
                "docs/operations.md lacks {entry} (the metric with its labels)"
            );
        }
        // And the docs list no metric Postbox does not record: every `postbox_…{…}` in
        // backticks is one of them.
        for (i, _) in docs.match_indices("`postbox_") {
            let rest = &docs[i + 1..];
            let name_len = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            if rest[name_len..].starts_with('{') {
                let name = &rest[..name_len];
                assert!(
                    names.contains(&name),
                    "docs/operations.md lists {name}, which Postbox does not record"
                );
            }
        }
    }
}
