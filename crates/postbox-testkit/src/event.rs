//! Events as a relay hands them to a sink, built for tests of sinks and handlers.

use chrono::{DateTime, TimeZone, Utc};
use postbox::{OutboxEvent, schema::TenantId};

/// A builder of [`OutboxEvent`]s: an `InvoiceCreated` event with payload
/// `{"amount_cents":1200}`, created 2026-04-24 10:00:00 UTC, and nothing else until set.
///
/// ```
/// let e = postbox_testkit::event(7).aggregate("Invoice", "456").tenant("acme").build();
/// assert_eq!(e.event_type, "InvoiceCreated");
/// assert_eq!(e.aggregate_id.as_deref(), Some("456"));
/// assert_eq!(e.tenant.as_deref(), Some("acme"));
/// ```
#[derive(Clone, Debug)]
pub struct TestEvent(OutboxEvent);

/// An event with id `id`; see [`TestEvent`].
pub fn event(id: i64) -> TestEvent {
    let mut e = OutboxEvent::new(
        id,
        "InvoiceCreated",
        &serde_json::json!({"amount_cents": 1200}),
    )
    .expect("a JSON payload");
    e.created_at = Utc
        .with_ymd_and_hms(2026, 4, 24, 10, 0, 0)
        .single()
        .expect("a valid date");
    TestEvent(e)
}

impl TestEvent {
    /// The event type.
    pub fn event_type(mut self, event_type: &str) -> Self {
        self.0.event_type = event_type.to_owned();
        self
    }

    /// The aggregate type and id.
    pub fn aggregate(mut self, aggregate_type: &str, aggregate_id: &str) -> Self {
        self.0.aggregate_type = Some(aggregate_type.to_owned());
        self.0.aggregate_id = Some(aggregate_id.to_owned());
        self
    }

    /// The aggregate type alone (no id).
    pub fn aggregate_type(mut self, aggregate_type: Option<&str>) -> Self {
        self.0.aggregate_type = aggregate_type.map(str::to_owned);
        self
    }

    /// The tenant (must be a valid tenant id).
    pub fn tenant(mut self, tenant: &str) -> Self {
        self.0.tenant = Some(TenantId::new(tenant).expect("a valid tenant id"));
        self
    }

    /// The idempotency key.
    pub fn idempotency_key(mut self, key: &str) -> Self {
        self.0.idempotency_key = Some(key.to_owned());
        self
    }

    /// One header.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.0.headers.insert(name.to_owned(), value.to_owned());
        self
    }

    /// The payload.
    pub fn payload(mut self, payload: serde_json::Value) -> Self {
        self.0.payload = serde_json::value::to_raw_value(&payload).expect("a JSON payload");
        self
    }

    /// The producer's class name.
    pub fn event_class(mut self, class: &str) -> Self {
        self.0.event_class = Some(class.to_owned());
        self
    }

    /// The payload's schema version.
    pub fn schema_version(mut self, version: i32) -> Self {
        self.0.schema_version = version;
        self
    }

    /// Failed tries so far.
    pub fn retry_count(mut self, retry_count: i32) -> Self {
        self.0.retry_count = retry_count;
        self
    }

    /// When the event was enqueued.
    pub fn created_at(mut self, at: DateTime<Utc>) -> Self {
        self.0.created_at = at;
        self
    }

    /// The claim token.
    pub fn claim_token(mut self, token: uuid::Uuid) -> Self {
        self.0.claim_token = token;
        self
    }

    /// The event.
    pub fn build(self) -> OutboxEvent {
        self.0
    }
}
