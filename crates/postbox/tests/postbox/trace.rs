//! Trace context (feature `otel`): `enqueue` records the current span's `traceparent` unless the
//! caller set one, and the relay's publish span links to the producer's trace.

#![allow(
    clippy::unwrap_used,
    reason = "tests fail loudly on the first unexpected error"
)]

use std::sync::Arc;
use std::time::Duration;

use crate::common::{config, pg};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use postbox::{Event, Relay};
use postbox_testkit::{RecordingSink, wait_until};
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::prelude::*;

#[tokio::test]
async fn enqueue_records_the_trace_and_the_publish_span_links_to_it() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("postbox-test")));
    // This test's thread only (the runtime is single-threaded): other tests are not traced.
    let _guard = tracing::subscriber::set_default(subscriber);
    // A callsite first hit on another test's thread while `set_default` above was registering
    // this subscriber can keep the interest it computed without it ("never"), and then its spans
    // never reach this subscriber. Recomputing every registered callsite's interest now that the
    // subscriber is in place closes that window (the relay's publish callsite is the one at stake:
    // other tests in this binary run relays).
    tracing::callsite::rebuild_interest_cache();

    let (db, store) = pg().await;
    let outbox = db.outbox();
    let checkout = tracing::info_span!("checkout");
    let trace_id = checkout.context().span().span_context().trace_id();
    let own = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let ids = async {
        let mut tx = db.pool().begin().await.unwrap();
        let traced = outbox
            .enqueue(&mut tx, Event::new("OrderPlaced", &1).unwrap())
            .await
            .unwrap();
        let given = outbox
            .enqueue(
                &mut tx,
                Event::new("OrderPlaced", &2)
                    .unwrap()
                    .header("traceparent", own),
            )
            .await
            .unwrap();
        tx.commit().await.unwrap();
        [traced.id().unwrap(), given.id().unwrap()]
    }
    .instrument(checkout)
    .await;
    // Outside any span: nothing is added.
    let mut tx = db.pool().begin().await.unwrap();
    let untraced = outbox
        .enqueue(&mut tx, Event::new("OrderPlaced", &3).unwrap())
        .await
        .unwrap()
        .id()
        .unwrap();
    tx.commit().await.unwrap();

    let header = |id: i64| {
        let pool = db.pool().clone();
        async move {
            sqlx::query_scalar::<_, Option<String>>(
                "SELECT headers->>'traceparent' FROM outbox_events WHERE id = $1",
            )
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    let recorded = header(ids[0]).await.unwrap();
    assert!(
        recorded.starts_with(&format!("00-{trace_id}-")),
        "{recorded} is not of trace {trace_id}"
    );
    assert_eq!(
        header(ids[1]).await.as_deref(),
        Some(own),
        "the caller's header wins"
    );
    assert_eq!(header(untraced).await, None);

    let sink = RecordingSink::new();
    // Again, right before the relay makes its spans: no registration that raced the first
    // rebuild is still in progress ~100 ms later.
    tracing::callsite::rebuild_interest_cache();
    let relay = Relay::from_parts(Arc::new(store), Arc::new(sink.clone()), config())
        .unwrap()
        .start();
    wait_until("published", Duration::from_secs(10), || async {
        sink.published_ids().len() == 3
    })
    .await;
    relay.stop().await.unwrap();
    // The sink got the header as it was stored.
    let published = sink.published();
    let first = published.iter().find(|e| e.id == ids[0]).unwrap();
    assert_eq!(first.headers.get("traceparent"), Some(&recorded));

    let spans = exporter.get_finished_spans().unwrap();
    let publish = spans
        .iter()
        .filter(|s| s.name == "postbox.publish")
        .collect::<Vec<_>>();
    assert_eq!(
        publish.len(),
        3,
        "{:?}",
        spans.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    let linked: Vec<String> = publish
        .iter()
        .flat_map(|s| {
            s.links
                .iter()
                .map(|l| l.span_context.trace_id().to_string())
        })
        .collect();
    assert!(linked.contains(&trace_id.to_string()), "{linked:?}");
    assert!(
        linked.contains(&"4bf92f3577b34da6a3ce929d0e0e4736".to_owned()),
        "{linked:?}"
    );
    assert_eq!(
        linked.len(),
        2,
        "the untraced event's span links to nothing"
    );
}
