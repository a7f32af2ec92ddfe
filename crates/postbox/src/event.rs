//! Events as the producer writes them ([`Event`], [`DomainEvent`]) and as a sink receives them
//! ([`OutboxEvent`]).

use std::collections::BTreeMap;

use chrono::{DateTime, NaiveDate, Utc};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use uuid::Uuid;

use crate::error::{Error, Result};

/// The retry limit of an event that sets none, in an outbox that configures none: 5 tries
/// before the event is `FAILED`. The migrations repeat it (the `max_retries` column's default,
/// and PostgreSQL's SQL enqueue functions), each such line commented with this constant's name;
/// a test checks them against it.
pub const DEFAULT_MAX_RETRIES: i32 = 5;

/// Column widths of `outbox_events` (docs/architecture.md, "The contract"); checked before anything is written.
pub(crate) const MAX_TYPE_CHARS: usize = 100;
pub(crate) const MAX_CLASS_CHARS: usize = 255;
pub(crate) const MAX_KEY_CHARS: usize = 255;

/// A domain event type known at compile time.
///
/// Implement it for the events your service emits; [`Event::from_domain`] turns a value into an
/// [`Event`] and typed handlers ([`crate::handlers::Handlers::on`]) get it back deserialized.
///
/// ```
/// use postbox::{event::DomainEvent, Event};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// struct InvoiceCreated { invoice_id: i64, amount_cents: i64 }
///
/// impl DomainEvent for InvoiceCreated {
///     const EVENT_TYPE: &'static str = "InvoiceCreated";
///     const AGGREGATE_TYPE: &'static str = "Invoice";
///     fn aggregate_id(&self) -> Option<String> { Some(self.invoice_id.to_string()) }
/// }
///
/// let event = Event::from_domain(&InvoiceCreated { invoice_id: 456, amount_cents: 1200 }).unwrap();
/// assert_eq!(event.event_type(), "InvoiceCreated");
/// ```
pub trait DomainEvent: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The `event_type` column, e.g. `InvoiceCreated`.
    const EVENT_TYPE: &'static str;
    /// The `aggregate_type` column, e.g. `Invoice`.
    const AGGREGATE_TYPE: &'static str;
    /// The schema version of this event's payload (default 1).
    const SCHEMA_VERSION: i32 = 1;

    /// The aggregate's id, e.g. `456`; `None` for an event without an aggregate (it then has no
    /// idempotency key unless one is given).
    fn aggregate_id(&self) -> Option<String>;

    /// The `event_class` column: the producer's type name, for deserializing.
    fn event_class() -> &'static str {
        std::any::type_name::<Self>()
    }
}

/// How an event's idempotency key is chosen (docs/architecture.md, "The contract").
#[derive(Clone, Debug, PartialEq, Eq)]
enum KeyChoice {
    /// `{aggregateType}:{aggregateId}:{eventType}:{date}`, date in UTC, when an aggregate is given.
    Daily,
    /// A key the caller gave.
    Explicit(String),
    /// No key: the event is never deduplicated.
    None,
}

/// The seed's deterministic daily idempotency key, `{aggregateType}:{aggregateId}:{eventType}:{date}`,
/// with `date` the UTC calendar day.
///
/// ```
/// use chrono::NaiveDate;
/// let day = NaiveDate::from_ymd_opt(2026, 4, 24).unwrap();
/// assert_eq!(
///     postbox::event::daily_idempotency_key("Invoice", "456", "InvoiceCreated", day),
///     "Invoice:456:InvoiceCreated:2026-04-24"
/// );
/// ```
pub fn daily_idempotency_key(
    aggregate_type: &str,
    aggregate_id: &str,
    event_type: &str,
    date_utc: NaiveDate,
) -> String {
    format!(
        "{aggregate_type}:{aggregate_id}:{event_type}:{}",
        date_utc.format("%Y-%m-%d")
    )
}

/// An event to enqueue: built by the producer, written by [`crate::Outbox::enqueue`] in the
/// caller's transaction.
///
/// ```
/// use postbox::Event;
/// let event = Event::new("InvoiceCreated", &serde_json::json!({"invoice_id": 456}))
///     .unwrap()
///     .aggregate("Invoice", "456")
///     .header("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
///     .max_retries(10);
/// assert_eq!(event.aggregate_id(), Some("456"));
/// ```
#[derive(Clone, Debug)]
pub struct Event {
    pub(crate) event_type: String,
    pub(crate) aggregate_type: Option<String>,
    pub(crate) aggregate_id: Option<String>,
    pub(crate) payload: Box<RawValue>,
    pub(crate) event_class: Option<String>,
    pub(crate) schema_version: i32,
    pub(crate) headers: BTreeMap<String, String>,
    pub(crate) max_retries: Option<i32>,
    key: KeyChoice,
}

impl Event {
    /// An event of `event_type` with `payload` serialized to JSON.
    ///
    /// Fails if the payload cannot be serialized.
    pub fn new(event_type: impl Into<String>, payload: &impl Serialize) -> Result<Self> {
        let payload = serde_json::value::to_raw_value(payload)
            .map_err(|e| Error::invalid_event("payload", format!("cannot be serialized: {e}")))?;
        Ok(Event {
            event_type: event_type.into(),
            aggregate_type: None,
            aggregate_id: None,
            payload,
            event_class: None,
            schema_version: 1,
            headers: BTreeMap::new(),
            max_retries: None,
            key: KeyChoice::Daily,
        })
    }

    /// An event from a typed [`DomainEvent`]: type, aggregate, class and schema version come from
    /// the trait.
    pub fn from_domain<E: DomainEvent>(event: &E) -> Result<Self> {
        let mut built = Event::new(E::EVENT_TYPE, event)?
            .event_class(E::event_class())
            .schema_version(E::SCHEMA_VERSION);
        built.aggregate_type = Some(E::AGGREGATE_TYPE.to_owned());
        built.aggregate_id = event.aggregate_id();
        Ok(built)
    }

    /// Sets the aggregate this event belongs to (`aggregate_type`, `aggregate_id`).
    pub fn aggregate(mut self, aggregate_type: impl Into<String>, id: impl Into<String>) -> Self {
        self.aggregate_type = Some(aggregate_type.into());
        self.aggregate_id = Some(id.into());
        self
    }

    /// Sets `event_class`, the producer's type name.
    pub fn event_class(mut self, class: impl Into<String>) -> Self {
        self.event_class = Some(class.into());
        self
    }

    /// Sets the payload's schema version (default 1).
    pub fn schema_version(mut self, version: i32) -> Self {
        self.schema_version = version;
        self
    }

    /// Adds a header, e.g. `traceparent`.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// Sets this event's retry limit (default: the outbox's configured `max_retries`,
    /// [`DEFAULT_MAX_RETRIES`] unless configured).
    pub fn max_retries(mut self, max_retries: i32) -> Self {
        self.max_retries = Some(max_retries);
        self
    }

    /// Uses `key` as the idempotency key instead of the daily one.
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.key = KeyChoice::Explicit(key.into());
        self
    }

    /// Gives the event no idempotency key: it is never treated as a duplicate.
    pub fn without_idempotency_key(mut self) -> Self {
        self.key = KeyChoice::None;
        self
    }

    /// The event type.
    pub fn event_type(&self) -> &str {
        &self.event_type
    }

    /// The aggregate type, if any.
    pub fn aggregate_type(&self) -> Option<&str> {
        self.aggregate_type.as_deref()
    }

    /// The aggregate id, if any.
    pub fn aggregate_id(&self) -> Option<&str> {
        self.aggregate_id.as_deref()
    }

    /// The idempotency key this event gets when enqueued on the UTC day `today`.
    pub fn resolved_idempotency_key(&self, today: NaiveDate) -> Option<String> {
        match &self.key {
            KeyChoice::Explicit(k) => Some(k.clone()),
            KeyChoice::None => None,
            KeyChoice::Daily => match (&self.aggregate_type, &self.aggregate_id) {
                (Some(t), Some(id)) => Some(daily_idempotency_key(t, id, &self.event_type, today)),
                _ => None,
            },
        }
    }

    /// Checks every field against the table's limits; `payload_limit` is in bytes.
    pub(crate) fn validate(&self, payload_limit: usize, key: Option<&str>) -> Result<()> {
        // A NUL is refused here rather than by PostgreSQL, whose error would abort the caller's
        // whole transaction.
        fn no_nul(field: &'static str, value: &str) -> Result<()> {
            if value.contains('\0') {
                return Err(Error::invalid_event(
                    field,
                    "contains a NUL character, which PostgreSQL cannot store in text",
                ));
            }
            Ok(())
        }
        fn width(field: &'static str, value: Option<&str>, max: usize) -> Result<()> {
            match value {
                Some(v) if v.chars().count() > max => Err(Error::invalid_event(
                    field,
                    format!(
                        "is {} characters long; the limit is {max}",
                        v.chars().count()
                    ),
                )),
                Some(v) => no_nul(field, v),
                None => Ok(()),
            }
        }
        if self.event_type.is_empty() {
            return Err(Error::invalid_event("event_type", "is empty"));
        }
        width("event_type", Some(&self.event_type), MAX_TYPE_CHARS)?;
        width(
            "aggregate_type",
            self.aggregate_type.as_deref(),
            MAX_TYPE_CHARS,
        )?;
        width("aggregate_id", self.aggregate_id.as_deref(), MAX_TYPE_CHARS)?;
        width("event_class", self.event_class.as_deref(), MAX_CLASS_CHARS)?;
        width("idempotency_key", key, MAX_KEY_CHARS)?;
        for (name, value) in &self.headers {
            no_nul("headers", name)?;
            no_nul("headers", value)?;
        }
        let size = self.payload.get().len();
        if size > payload_limit {
            return Err(Error::invalid_event(
                "payload",
                format!(
                    "is {size} bytes; the limit is {payload_limit} bytes (raise `payload_limit` or store the data elsewhere and send a reference)"
                ),
            ));
        }
        if has_nul_escape(self.payload.get()) {
            return Err(Error::invalid_event(
                "payload",
                "contains a NUL character (\\u0000), which PostgreSQL's jsonb cannot store",
            ));
        }
        if let Some(m) = self.max_retries
            && m < 0
        {
            return Err(Error::invalid_event(
                "max_retries",
                format!("is {m}; it must be 0 or more"),
            ));
        }
        Ok(())
    }
}

/// Whether JSON text holds the escape `\u0000` (a NUL), as opposed to an escaped backslash
/// followed by the text `u0000`: the escape's backslash must not itself be escaped.
fn has_nul_escape(json: &str) -> bool {
    json.match_indices("\\u0000").any(|(at, _)| {
        let backslashes_before = json[..at].bytes().rev().take_while(|b| *b == b'\\').count();
        backslashes_before % 2 == 0
    })
}

/// What [`crate::Outbox::enqueue`] did with an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Enqueued {
    /// The event was written with this id; it is published once the transaction commits.
    Inserted(i64),
    /// An event with the same idempotency key exists already; nothing was written.
    Duplicate,
}

impl Enqueued {
    /// The new event's id, if one was written.
    pub fn id(self) -> Option<i64> {
        match self {
            Enqueued::Inserted(id) => Some(id),
            Enqueued::Duplicate => None,
        }
    }
}

/// An event as a relay hands it to a [`crate::Sink`]: a committed row of `outbox_events`, claimed
/// by this relay.
///
/// Relays build them from claimed rows; [`OutboxEvent::new`] builds one by hand, to test a sink
/// or a handler (`postbox-testkit` has a builder for every field).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[non_exhaustive]
pub struct OutboxEvent {
    /// The event id (the message id on the wire).
    pub id: i64,
    /// The tenant the event belongs to; `None` for the default schema.
    pub tenant: Option<crate::schema::TenantId>,
    /// The event type, e.g. `InvoiceCreated`.
    pub event_type: String,
    /// The aggregate type, e.g. `Invoice`.
    pub aggregate_type: Option<String>,
    /// The aggregate id, e.g. `456`.
    pub aggregate_id: Option<String>,
    /// The idempotency key, if the event has one.
    pub idempotency_key: Option<String>,
    /// The payload, as the JSON text stored.
    pub payload: Box<RawValue>,
    /// Headers such as `traceparent`.
    pub headers: BTreeMap<String, String>,
    /// The producer's type name.
    pub event_class: Option<String>,
    /// The payload's schema version.
    pub schema_version: i32,
    /// Failed tries so far.
    pub retry_count: i32,
    /// The event's retry limit.
    pub max_retries: i32,
    /// When the event was enqueued (database clock, UTC).
    pub created_at: DateTime<Utc>,
    /// The fencing token of the claim under which this relay holds the event.
    #[serde(skip)]
    pub claim_token: Uuid,
}

impl OutboxEvent {
    /// An event with id `id`, type `event_type` and `payload`, as if just enqueued: no aggregate,
    /// key, tenant, class or headers, schema version 1, no failed tries, retry limit [`DEFAULT_MAX_RETRIES`], created
    /// now. Set the other fields directly.
    ///
    /// ```
    /// let mut event = postbox::OutboxEvent::new(7, "InvoiceCreated", &serde_json::json!({"id": 7}))
    ///     .unwrap();
    /// event.aggregate_type = Some("Invoice".into());
    /// assert_eq!(event.dedup_id(), "7");
    /// ```
    pub fn new(id: i64, event_type: impl Into<String>, payload: &impl Serialize) -> Result<Self> {
        Ok(OutboxEvent {
            id,
            tenant: None,
            event_type: event_type.into(),
            aggregate_type: None,
            aggregate_id: None,
            idempotency_key: None,
            payload: serde_json::value::to_raw_value(payload)?,
            headers: BTreeMap::new(),
            event_class: None,
            schema_version: 1,
            retry_count: 0,
            max_retries: DEFAULT_MAX_RETRIES,
            created_at: Utc::now(),
            claim_token: Uuid::nil(),
        })
    }

    /// The id consumers use to drop repeats: the idempotency key, else the event id.
    pub fn dedup_id(&self) -> String {
        self.idempotency_key
            .clone()
            .unwrap_or_else(|| self.id.to_string())
    }

    /// Deserializes the payload into `T`.
    pub fn payload_as<T: DeserializeOwned>(&self) -> Result<T> {
        Ok(serde_json::from_str(self.payload.get())?)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::*;

    #[test]
    fn daily_key_uses_the_given_utc_day() {
        let e = Event::new("InvoiceCreated", &1)
            .unwrap()
            .aggregate("Invoice", "456");
        let day = NaiveDate::from_ymd_opt(2026, 4, 24).unwrap();
        assert_eq!(
            e.resolved_idempotency_key(day).as_deref(),
            Some("Invoice:456:InvoiceCreated:2026-04-24")
        );
        let no_aggregate = Event::new("Ping", &1).unwrap();
        assert_eq!(no_aggregate.resolved_idempotency_key(day), None);
        let explicit = Event::new("Ping", &1).unwrap().idempotency_key("k1");
        assert_eq!(
            explicit.resolved_idempotency_key(day).as_deref(),
            Some("k1")
        );
        let none = e.without_idempotency_key();
        assert_eq!(none.resolved_idempotency_key(day), None);
    }

    #[test]
    fn validation_names_the_field() {
        let long = "x".repeat(101);
        let err = Event::new(long.clone(), &1)
            .unwrap()
            .validate(1024, None)
            .unwrap_err();
        assert!(err.to_string().contains("event_type"), "{err}");
        let err = Event::new("T", &1)
            .unwrap()
            .aggregate(long, "1")
            .validate(1024, None)
            .unwrap_err();
        assert!(err.to_string().contains("aggregate_type"), "{err}");
        let err = Event::new("T", &"y".repeat(2000))
            .unwrap()
            .validate(1024, None)
            .unwrap_err();
        assert!(
            err.to_string().contains("payload") && err.to_string().contains("1024"),
            "{err}"
        );
        let err = Event::new("T", &"a\u{0}b")
            .unwrap()
            .validate(1024, None)
            .unwrap_err();
        assert!(err.to_string().contains("NUL"), "{err}");
    }
}
