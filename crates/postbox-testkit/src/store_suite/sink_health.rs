//! The case of sink health: what each relay last saw of its sinks, kept for `postbox status`
//! and the admin API.

#![allow(
    clippy::unwrap_used,
    clippy::missing_panics_doc,
    reason = "a test suite fails loudly on the first unexpected error"
)]

use std::time::Duration;

use chrono::{DateTime, Utc};
use postbox::sink::SinkHealth;
use postbox::store::{MAX_ERROR_BYTES, ReportedSink};

use super::StoreHarness;
use super::helpers::ready;

/// `(relay, sink, up, since, last error)` of one report.
type Row = (String, String, bool, DateTime<Utc>, Option<String>);

/// The [`Row`] of each report, by relay and sink.
fn summary(reported: &[ReportedSink]) -> Vec<Row> {
    let mut rows: Vec<_> = reported
        .iter()
        .map(|r| {
            (
                r.relay_id.clone(),
                r.health.name.clone(),
                r.health.up,
                r.health.since,
                r.health.last_error.clone(),
            )
        })
        .collect();
    rows.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    rows
}

/// A conformance case: a relay's report of its sinks replaces its earlier one, field for field;
/// other relays' reports stand beside it; an empty report forgets the relay; an error is stored
/// as `last_error` is (without NUL characters, at most [`MAX_ERROR_BYTES`]). A store that cannot
/// keep reports keeps none: it reports nothing, ever.
pub async fn sink_reports_keep_each_relays_latest<B: StoreHarness>() {
    let b = ready::<B>().await;
    let store = b.store();
    assert!(store.sinks_reported().await.unwrap().is_empty());
    // Whole milliseconds, which every store keeps exactly.
    let since = DateTime::from_timestamp_millis(Utc::now().timestamp_millis() - 90_000).unwrap();
    let up = |name: &str| SinkHealth::new(name, true, since, None);
    let down = |name: &str, error: &str| SinkHealth::new(name, false, since, Some(error.into()));
    let row = |relay: &str, sink: &SinkHealth| -> Row {
        (
            relay.to_owned(),
            sink.name.clone(),
            sink.up,
            sink.since,
            sink.last_error.clone(),
        )
    };

    let first = [up("kafka"), down("webhook", "connection refused")];
    store.sinks_report("relay-1", &first).await.unwrap();
    let reported = store.sinks_reported().await.unwrap();
    if reported.is_empty() {
        store.sinks_report("relay-2", &first).await.unwrap();
        assert!(
            store.sinks_reported().await.unwrap().is_empty(),
            "a store that keeps no report keeps none"
        );
        return;
    }
    assert_eq!(
        summary(&reported),
        [row("relay-1", &first[0]), row("relay-1", &first[1])]
    );
    for r in &reported {
        assert!(
            r.reported_ago < Duration::from_secs(60),
            "reported just now: {:?}",
            r.reported_ago
        );
    }

    let other = [down("kafka", "timed out")];
    store.sinks_report("relay-2", &other).await.unwrap();
    let again = [down("kafka", "broker gone")];
    store.sinks_report("relay-1", &again).await.unwrap();
    assert_eq!(
        summary(&store.sinks_reported().await.unwrap()),
        [row("relay-1", &again[0]), row("relay-2", &other[0])],
        "relay-1's new report replaces its old one, relay-2's stands"
    );

    store.sinks_report("relay-1", &[]).await.unwrap();
    let long = format!("a\0b{}", "x".repeat(2 * MAX_ERROR_BYTES));
    store
        .sinks_report("relay-2", &[down("kafka", &long)])
        .await
        .unwrap();
    let reported = store.sinks_reported().await.unwrap();
    assert_eq!(reported.len(), 1, "relay-1 is forgotten: {reported:?}");
    let error = reported[0].health.last_error.as_deref().unwrap();
    assert!(error.starts_with("ab"), "without NUL: {:?}", &error[..10]);
    assert!(error.len() <= MAX_ERROR_BYTES, "{} bytes", error.len());
}
