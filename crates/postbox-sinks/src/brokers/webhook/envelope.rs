//! The webhook's request body and its signature: the JSON [`Envelope`] of an event, and the
//! HMAC-SHA256 [`sign`]ature a receiver checks with the [`TIMESTAMP_HEADER`].

use std::collections::BTreeMap;

use hmac::{Hmac, KeyInit, Mac};
use postbox::OutboxEvent;
use serde::Serialize;
use serde_json::value::RawValue;
use sha2::Sha256;

/// The JSON body of a webhook request: the event's metadata and its payload.
///
/// ```json
/// {
///   "id": 42,
///   "dedup_id": "Invoice:456:InvoiceCreated:2026-04-24",
///   "idempotency_key": "Invoice:456:InvoiceCreated:2026-04-24",
///   "event_type": "InvoiceCreated",
///   "aggregate_type": "Invoice",
///   "aggregate_id": "456",
///   "tenant": null,
///   "event_class": "billing::InvoiceCreated",
///   "schema_version": 1,
///   "created_at": "2026-04-24T10:00:00.000Z",
///   "headers": {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
///   "payload": {"invoice_id": 456, "amount_cents": 1200}
/// }
/// ```
#[derive(Debug, Serialize)]
pub struct Envelope<'a> {
    /// The event id.
    pub id: i64,
    /// The idempotency key, else the event id as a string.
    pub dedup_id: String,
    /// The idempotency key, if the event has one.
    pub idempotency_key: Option<&'a str>,
    /// The event type.
    pub event_type: &'a str,
    /// The aggregate type, if any.
    pub aggregate_type: Option<&'a str>,
    /// The aggregate id, if any.
    pub aggregate_id: Option<&'a str>,
    /// The tenant; `null` for the default schema.
    pub tenant: Option<&'a str>,
    /// The producer's type name, if set.
    pub event_class: Option<&'a str>,
    /// The payload's schema version.
    pub schema_version: i32,
    /// Enqueue time, RFC 3339 UTC with milliseconds.
    pub created_at: String,
    /// The event's own headers.
    pub headers: &'a BTreeMap<String, String>,
    /// The event payload, as stored.
    pub payload: &'a RawValue,
}

impl<'a> Envelope<'a> {
    /// The envelope of `event`.
    pub fn of(event: &'a OutboxEvent) -> Self {
        Envelope {
            id: event.id,
            dedup_id: event.dedup_id(),
            idempotency_key: event.idempotency_key.as_deref(),
            event_type: &event.event_type,
            aggregate_type: event.aggregate_type.as_deref(),
            aggregate_id: event.aggregate_id.as_deref(),
            tenant: event.tenant.as_deref(),
            event_class: event.event_class.as_deref(),
            schema_version: event.schema_version,
            created_at: event
                .created_at
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            headers: &event.headers,
            payload: &event.payload,
        }
    }
}

/// The header carrying the time a request was signed, in whole seconds since the Unix epoch.
pub const TIMESTAMP_HEADER: &str = "X-Postbox-Timestamp";

/// The signature header's value for a request sent at `timestamp` (Unix seconds, as sent in
/// [`TIMESTAMP_HEADER`]) with `body`: `sha256=` and the lower-case hex HMAC-SHA256, under
/// `secret`, of the text `{timestamp}.{body}`. A receiver recomputes it over the timestamp
/// header and the raw body, compares in constant time, and refuses a timestamp older than a few
/// minutes: a captured request cannot be replayed later.
///
/// ```
/// let sig = postbox_sinks::webhook::sign(b"key", 1776988800, b"{}");
/// assert_eq!(sig, "sha256=5c245ae4df3dea2ee7db25752a664fa2fa18e3d248a75810c859d6b4bf2773c4");
/// ```
pub fn sign(secret: &[u8], timestamp: u64, body: &[u8]) -> String {
    // HMAC accepts keys of any length; `new_from_slice` cannot fail for it.
    let Ok(mut mac) = <Hmac<Sha256> as KeyInit>::new_from_slice(secret) else {
        unreachable!("HMAC takes keys of any length")
    };
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}
