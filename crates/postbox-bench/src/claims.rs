//! The relays' own claim durations, read from the `postbox_claim_seconds` histogram they emit
//! through the `metrics` facade: every claim of a run, not a probe beside it.
//!
//! Written by hand: the bench keeps this one histogram in constant memory and drops the dozen
//! others the relays emit. A general recorder (metrics-util's debugging recorder) keeps every
//! sample of every histogram until read, which would grow the process whose memory the soak
//! and the history phase report.

use std::sync::{Arc, Mutex, OnceLock};

use hdrhistogram::Histogram as Hdr;
use metrics::{
    Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};

use crate::report::ClaimTimes;

/// The metric the relay records each claim's duration in, seconds.
const CLAIM_METRIC: &str = postbox::metrics::CLAIM_SECONDS;

/// Claim durations in microseconds.
struct Samples(Mutex<Hdr<u64>>);

impl HistogramFn for Samples {
    fn record(&self, seconds: f64) {
        if let Ok(mut hist) = self.0.lock() {
            hist.saturating_record((seconds * 1e6).max(1.0) as u64);
        }
    }
}

/// Records [`CLAIM_METRIC`] into [`Samples`]; every other metric is a no-op.
struct ClaimRecorder(Arc<Samples>);

impl Recorder for ClaimRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
        Counter::noop()
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        if key.name() == CLAIM_METRIC {
            Histogram::from_arc(Arc::clone(&self.0))
        } else {
            Histogram::noop()
        }
    }
}

/// The samples, once the recorder is installed; `None` when the process had a recorder of its
/// own already (the claim figures are then not reported).
fn samples() -> Option<&'static Arc<Samples>> {
    static SAMPLES: OnceLock<Option<Arc<Samples>>> = OnceLock::new();
    SAMPLES
        .get_or_init(|| {
            let hist = Hdr::new_with_bounds(1, 60_000_000, 3).ok()?;
            let samples = Arc::new(Samples(Mutex::new(hist)));
            metrics::set_global_recorder(ClaimRecorder(Arc::clone(&samples))).ok()?;
            Some(samples)
        })
        .as_ref()
}

/// Forgets the claims recorded so far: the next [`take`] covers what runs in between.
pub(crate) fn reset() {
    if let Some(samples) = samples()
        && let Ok(mut hist) = samples.0.lock()
    {
        hist.reset();
    }
}

/// The claims recorded since [`reset`]; `None` when there were none or nothing records them.
pub(crate) fn take() -> Option<ClaimTimes> {
    let samples = samples()?;
    let mut hist = samples.0.lock().ok()?;
    if hist.is_empty() {
        return None;
    }
    let ms = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    let times = ClaimTimes {
        claims: hist.len(),
        p50_ms: ms(0.5),
        p99_ms: ms(0.99),
        max_ms: hist.max() as f64 / 1000.0,
    };
    hist.reset();
    Some(times)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_claim_histogram_is_recorded() {
        reset();
        metrics::histogram!(postbox::metrics::MARK_SECONDS).record(5.0);
        assert!(take().is_none(), "another histogram must not count");
        for ms in [1.0, 2.0, 3.0, 100.0] {
            metrics::histogram!(CLAIM_METRIC, "tenant" => "t").record(ms / 1000.0);
        }
        let times = take().expect("claims recorded");
        assert_eq!(times.claims, 4);
        assert!((times.p50_ms - 2.0).abs() < 0.01, "{times:?}");
        assert!((times.max_ms - 100.0).abs() < 0.1, "{times:?}");
        assert!(take().is_none(), "take resets");
    }
}
