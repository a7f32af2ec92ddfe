//! Trace context across the outbox (feature `otel`): `enqueue` records the current span's W3C
//! `traceparent` in the event's headers, unless the caller set one; the relay's publish span
//! links to it. The sinks forward headers as they are, so the consumer continues the trace.
//!
//! Without the feature nothing is recorded and the relay opens no publish span; an event that
//! carries a `traceparent` (set by hand, or by a producer in another language) is still
//! forwarded with it.

/// The W3C trace-context header.
pub const TRACEPARENT: &str = "traceparent";

/// The current span's context as a `traceparent` value, when the `otel` feature is on and the
/// current span belongs to a sampled or unsampled OpenTelemetry trace.
#[cfg(feature = "otel")]
pub(crate) fn current_traceparent() -> Option<String> {
    use opentelemetry::trace::TraceContextExt;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let cx = tracing::Span::current().context();
    let span = cx.span();
    let sc = span.span_context();
    sc.is_valid().then(|| {
        format!(
            "00-{}-{}-{:02x}",
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags().to_u8()
        )
    })
}

#[cfg(not(feature = "otel"))]
pub(crate) fn current_traceparent() -> Option<String> {
    None
}

/// The span a relay publishes an event in, linked to the trace its `traceparent` header names
/// (feature `otel`). Without the feature there is no trace to link and no span is made: the
/// publish path costs what it cost before trace context existed.
#[cfg(feature = "otel")]
pub(crate) fn publish_span(event: &crate::event::OutboxEvent) -> tracing::Span {
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let span = tracing::info_span!(
        "postbox.publish",
        event_id = event.id,
        event_type = %event.event_type,
        tenant = event.tenant.as_ref().map_or("default", |t| t.as_str()),
    );
    if let Some(sc) = event.headers.get(TRACEPARENT).and_then(|v| parse(v)) {
        span.add_link(sc);
    }
    span
}

#[cfg(not(feature = "otel"))]
pub(crate) fn publish_span(_event: &crate::event::OutboxEvent) -> tracing::Span {
    tracing::Span::none()
}

/// A `traceparent` value (`00-<32 hex>-<16 hex>-<2 hex>`) as a remote span context; `None` for
/// anything else (a malformed header is forwarded, never trusted).
#[cfg(feature = "otel")]
fn parse(value: &str) -> Option<opentelemetry::trace::SpanContext> {
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
    let mut parts = value.trim().split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if version != "00"
        || parts.next().is_some()
        || trace.len() != 32
        || span.len() != 16
        || flags.len() != 2
    {
        return None;
    }
    let trace_id = TraceId::from_hex(trace).ok()?;
    let span_id = SpanId::from_hex(span).ok()?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    let sc = SpanContext::new(
        trace_id,
        span_id,
        TraceFlags::new(flags),
        true,
        TraceState::default(),
    );
    sc.is_valid().then_some(sc)
}

#[cfg(all(test, feature = "otel"))]
mod tests {
    use super::*;

    #[test]
    fn traceparents_parse_strictly() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let sc = parse(good).expect("valid");
        assert_eq!(
            sc.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert!(sc.is_remote());
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        ] {
            assert!(parse(bad).is_none(), "{bad}");
        }
    }
}
