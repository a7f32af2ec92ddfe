//! The metadata every published message carries, and its names.
//!
//! Each sink sends these as the broker allows: NATS and Kafka headers, AMQP message headers, MQTT 5
//! user properties, Redis stream fields, HTTP headers. The event's own headers (`traceparent`,
//! `tracestate`, custom ones) travel beside them under their own names; a Postbox name wins over
//! an event header of the same name.

use std::collections::BTreeMap;

use chrono::SecondsFormat;
use postbox::OutboxEvent;

/// The event id (`outboxevents.id`), decimal.
pub const EVENT_ID: &str = "postbox-event-id";
/// The id consumers drop repeats by: the idempotency key, else the event id
/// ([`OutboxEvent::dedup_id`]).
pub const DEDUP_ID: &str = "postbox-dedup-id";
/// The event type, e.g. `InvoiceCreated`.
pub const EVENT_TYPE: &str = "postbox-event-type";
/// The aggregate type, e.g. `Invoice`; absent when the event has none.
pub const AGGREGATE_TYPE: &str = "postbox-aggregate-type";
/// The aggregate id, e.g. `456`; absent when the event has none.
pub const AGGREGATE_ID: &str = "postbox-aggregate-id";
/// The payload's schema version, decimal.
pub const SCHEMA_VERSION: &str = "postbox-schema-version";
/// The tenant; absent for the default schema.
pub const TENANT: &str = "postbox-tenant";
/// The producer's type name (`event_class`); absent when not set.
pub const EVENT_CLASS: &str = "postbox-event-class";
/// When the event was enqueued, RFC 3339 in UTC with milliseconds, e.g.
/// `2026-04-24T10:00:00.000Z`.
pub const CREATED_AT: &str = "postbox-created-at";

/// The JetStream header that carries the dedup id (the NATS sink's); the stream drops a repeat
/// within its duplicate window.
pub const NATS_MSG_ID: &str = "Nats-Msg-Id";
/// The HTTP header that carries the dedup id (the webhook sink's).
pub const IDEMPOTENCY_KEY: &str = "Idempotency-Key";

/// The dedup id of a received message, from its headers, for a consumer's
/// [`Inbox`](postbox::inbox::Inbox): `postbox-dedup-id`, which every sink that has headers sends,
/// else the broker's own dedup field (`Nats-Msg-Id`, `Idempotency-Key`), else a CloudEvent's
/// `id` in binary mode (`ce-id`, `ce_id`, `cloudEvents:id`, `cloudEvents_id`; see
/// [`crate::cloudevents`]); names compared case-insensitively, as HTTP does. `None` when the
/// message has none of them.
///
/// Give it what the client library hands the consumer as name/value text: Kafka record headers,
/// NATS headers, HTTP request headers, MQTT 5 user properties, Redis stream fields. A RabbitMQ
/// message carries the dedup id in its `message_id` property instead (the AMQP sink sets it),
/// and keeps the headers too.
///
/// ```
/// use postbox_sinks::headers;
///
/// let received = [("content-type", "application/json"), ("Nats-Msg-Id", "Invoice:456:InvoiceCreated:2026-04-24")];
/// assert_eq!(headers::dedup_id(received), Some("Invoice:456:InvoiceCreated:2026-04-24"));
/// assert_eq!(headers::dedup_id([("postbox-dedup-id", "7"), ("Nats-Msg-Id", "7")]), Some("7"));
/// assert_eq!(headers::dedup_id([("ce_id", "Invoice:456"), ("content-type", "application/json")]), Some("Invoice:456"));
/// assert_eq!(headers::dedup_id([("traceparent", "00-…")]), None);
/// ```
pub fn dedup_id<'a, I>(headers: I) -> Option<&'a str>
where
    I: IntoIterator<Item = (&'a str, &'a str)>,
{
    let mut fallback = None;
    for (name, value) in headers {
        if name.eq_ignore_ascii_case(DEDUP_ID) {
            return Some(value);
        }
        let rank = if name.eq_ignore_ascii_case(NATS_MSG_ID)
            || name.eq_ignore_ascii_case(IDEMPOTENCY_KEY)
        {
            1
        } else if CLOUDEVENTS_ID.iter().any(|n| name.eq_ignore_ascii_case(n)) {
            2
        } else {
            continue;
        };
        if fallback.is_none_or(|(best, _)| rank < best) {
            fallback = Some((rank, value));
        }
    }
    fallback.map(|(_, value)| value)
}

/// The names a CloudEvent's `id` has in binary mode: HTTP and NATS, Kafka and Redis, AMQP (and
/// its JMS-safe spelling).
const CLOUDEVENTS_ID: [&str; 4] = ["ce-id", "ce_id", "cloudEvents:id", "cloudEvents_id"];

/// The Postbox metadata of `event`, by the names above (absent values are left out).
///
/// ```
/// # fn event() -> postbox::OutboxEvent {
/// #     let mut e = postbox::OutboxEvent::new(7, "InvoiceCreated", &serde_json::json!({})).unwrap();
/// #     e.aggregate_type = Some("Invoice".into());
/// #     e.aggregate_id = Some("456".into());
/// #     e
/// # }
/// use postbox_sinks::headers;
///
/// let meta = headers::metadata(&event());
/// assert_eq!(meta[headers::EVENT_ID], "7");
/// assert_eq!(meta[headers::DEDUP_ID], "7"); // no idempotency key: the event id
/// assert!(!meta.contains_key(headers::TENANT));
/// ```
pub fn metadata(event: &OutboxEvent) -> BTreeMap<&'static str, String> {
    let mut out = BTreeMap::new();
    out.insert(EVENT_ID, event.id.to_string());
    out.insert(DEDUP_ID, event.dedup_id());
    out.insert(EVENT_TYPE, event.event_type.clone());
    if let Some(v) = &event.aggregate_type {
        out.insert(AGGREGATE_TYPE, v.clone());
    }
    if let Some(v) = &event.aggregate_id {
        out.insert(AGGREGATE_ID, v.clone());
    }
    out.insert(SCHEMA_VERSION, event.schema_version.to_string());
    if let Some(v) = &event.tenant {
        out.insert(TENANT, v.to_string());
    }
    if let Some(v) = &event.event_class {
        out.insert(EVENT_CLASS, v.clone());
    }
    out.insert(
        CREATED_AT,
        event
            .created_at
            .to_rfc3339_opts(SecondsFormat::Millis, true),
    );
    out
}

/// Every header a message of `event` carries: the event's own headers, then the Postbox
/// metadata (which replaces an event header of the same name, compared case-insensitively).
///
/// ```
/// # fn event() -> postbox::OutboxEvent {
/// #     let mut e = postbox::OutboxEvent::new(7, "InvoiceCreated", &serde_json::json!({})).unwrap();
/// #     e.aggregate_type = Some("Invoice".into());
/// #     e.aggregate_id = Some("456".into());
/// #     e.headers.insert("traceparent".into(), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into());
/// #     e
/// # }
/// let all = postbox_sinks::headers::all(&event());
/// assert!(all.iter().any(|(name, _)| name == "traceparent"));
/// assert!(all.iter().any(|(name, _)| name == "postbox-event-id"));
/// ```
pub fn all(event: &OutboxEvent) -> Vec<(String, String)> {
    let meta = metadata(event);
    let mut out: Vec<(String, String)> = event
        .headers
        .iter()
        .filter(|(name, _)| !meta.keys().any(|m| m.eq_ignore_ascii_case(name)))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    out.extend(meta.into_iter().map(|(k, v)| (k.to_owned(), v)));
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn metadata_names_every_field_and_leaves_out_absent_ones() {
        let mut e = crate::test_event::event(42, true, Some("acme"));
        e.idempotency_key = Some("Invoice:456:InvoiceCreated:2026-04-24".into());
        e.event_class = Some("billing::InvoiceCreated".into());
        let m = metadata(&e);
        assert_eq!(m[EVENT_ID], "42");
        assert_eq!(m[DEDUP_ID], "Invoice:456:InvoiceCreated:2026-04-24");
        assert_eq!(m[EVENT_TYPE], "InvoiceCreated");
        assert_eq!(m[AGGREGATE_TYPE], "Invoice");
        assert_eq!(m[AGGREGATE_ID], "456");
        assert_eq!(m[SCHEMA_VERSION], "1");
        assert_eq!(m[TENANT], "acme");
        assert_eq!(m[EVENT_CLASS], "billing::InvoiceCreated");
        assert_eq!(m[CREATED_AT], "2026-04-24T10:00:00.000Z");

        let bare = crate::test_event::event(1, false, None);
        let m = metadata(&bare);
        assert_eq!(m[DEDUP_ID], "1");
        for absent in [AGGREGATE_TYPE, AGGREGATE_ID, TENANT, EVENT_CLASS] {
            assert!(!m.contains_key(absent), "{absent}");
        }
    }

    #[test]
    fn postbox_names_win_over_event_headers() {
        let mut e = crate::test_event::event(42, true, None);
        e.headers.insert("Postbox-Event-Id".into(), "forged".into());
        e.headers
            .insert("traceparent".into(), "00-abc-def-01".into());
        let all = all(&e);
        let ids: Vec<_> = all
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(EVENT_ID))
            .collect();
        assert_eq!(ids, vec![&(EVENT_ID.to_owned(), "42".to_owned())]);
        assert!(all.contains(&("traceparent".into(), "00-abc-def-01".into())));
    }
}
