//! Reading events back: what [`StoreOps::events_list`](crate::ops::StoreOps::events_list) takes and
//! returns. `postbox events list/show` and replays are built on it.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::event::OutboxEvent;
use crate::glob::Glob;
use crate::schema::{Target, TenantId};

/// An event's status, as stored in the `status` column.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[non_exhaustive]
pub enum EventStatus {
    /// Waiting to be claimed (or for its retry).
    Pending,
    /// Claimed by a relay.
    Processing,
    /// Published (archived events are all `PROCESSED`).
    Processed,
    /// Out of tries, or failed for good.
    Failed,
}

impl EventStatus {
    /// Every status.
    pub const ALL: [EventStatus; 4] = [
        EventStatus::Pending,
        EventStatus::Processing,
        EventStatus::Processed,
        EventStatus::Failed,
    ];

    /// The status as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            EventStatus::Pending => "PENDING",
            EventStatus::Processing => "PROCESSING",
            EventStatus::Processed => "PROCESSED",
            EventStatus::Failed => "FAILED",
        }
    }
}

impl fmt::Display for EventStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for EventStatus {
    type Err = Error;

    /// Parses a status, in any case (`failed`, `FAILED`).
    fn from_str(s: &str) -> Result<Self> {
        EventStatus::ALL
            .into_iter()
            .find(|status| status.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| Error::InvalidFilter {
                field: "status",
                reason: format!(
                    "{s:?} is not a status; use PENDING, PROCESSING, PROCESSED or FAILED"
                ),
            })
    }
}

/// Which events to read: every condition given must hold (an empty filter matches every
/// event). Times are compared with `created_at`.
///
/// ```
/// use postbox::store::{EventFilter, EventStatus};
///
/// let mut filter = EventFilter::default();
/// filter.statuses = vec![EventStatus::Failed];
/// filter.event_type = Some("Invoice*".parse()?);
/// filter.archive = true;
/// filter.validate()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct EventFilter {
    /// Only these ids (any, when empty).
    pub ids: Vec<i64>,
    /// Only these statuses (any, when empty).
    pub statuses: Vec<EventStatus>,
    /// Event types matching this glob.
    pub event_type: Option<Glob>,
    /// Aggregate types matching this glob.
    pub aggregate_type: Option<Glob>,
    /// This aggregate id exactly.
    pub aggregate_id: Option<String>,
    /// Created at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Created before this time.
    pub until: Option<DateTime<Utc>>,
    /// Read `outbox_events_archive` too (its events are all `PROCESSED`).
    pub archive: bool,
    /// Only the heads of parked aggregates (G6): `FAILED` events, not skipped, that hold back
    /// later events of their aggregate.
    pub parked: bool,
}

impl EventFilter {
    /// Refuses a filter that cannot match anything by construction: a time range that ends
    /// before it starts, an empty aggregate id.
    pub fn validate(&self) -> Result<()> {
        if let (Some(since), Some(until)) = (self.since, self.until)
            && since >= until
        {
            return Err(Error::InvalidFilter {
                field: "since/until",
                reason: format!(
                    "the time range ends ({until}) before it starts ({since}); swap them"
                ),
            });
        }
        if self.aggregate_id.as_deref() == Some("") {
            return Err(Error::InvalidFilter {
                field: "aggregate_id",
                reason: "is empty".to_owned(),
            });
        }
        Ok(())
    }

    /// Whether the archive can hold matching events: it is asked for, and `PROCESSED` is among
    /// the statuses wanted.
    pub(crate) fn reads_archive(&self) -> bool {
        self.archive
            && !self.parked
            && (self.statuses.is_empty() || self.statuses.contains(&EventStatus::Processed))
    }
}

/// A filter as an operator writes it (command-line flags, query parameters): statuses (each may
/// be a comma-separated list, in any case), globs, an aggregate id, times for
/// [`parse_time`]. [`EventFilter::parse`] turns it into a filter, or an
/// [`Error::InvalidFilter`] naming the field: `status`, `type`, `aggregate_type`,
/// `aggregate_id`, `since`, `until` or `since/until`.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct FilterText<'a> {
    /// Statuses.
    pub statuses: Vec<&'a str>,
    /// An event-type glob.
    pub event_type: Option<&'a str>,
    /// An aggregate-type glob.
    pub aggregate_type: Option<&'a str>,
    /// An aggregate id.
    pub aggregate_id: Option<&'a str>,
    /// Created at or after.
    pub since: Option<&'a str>,
    /// Created before.
    pub until: Option<&'a str>,
    /// Read the archive too.
    pub archive: bool,
}

impl EventFilter {
    /// The filter `text` describes, times read against `now`; refused, naming the field, if any
    /// part of it is not what it should be or it cannot match anything by construction.
    ///
    /// ```
    /// use postbox::store::{EventFilter, EventStatus, FilterText};
    /// let mut text = FilterText::default();
    /// text.statuses = vec!["failed,processed"];
    /// text.event_type = Some("Invoice*");
    /// let filter = EventFilter::parse(&text, chrono::Utc::now()).unwrap();
    /// assert_eq!(filter.statuses, [EventStatus::Failed, EventStatus::Processed]);
    /// ```
    pub fn parse(text: &FilterText<'_>, now: DateTime<Utc>) -> Result<EventFilter> {
        let invalid = |field: &'static str, reason: String| Error::InvalidFilter { field, reason };
        let mut filter = EventFilter::default();
        for status in text.statuses.iter().flat_map(|s| s.split(',')) {
            let status: EventStatus = status.trim().parse()?;
            if !filter.statuses.contains(&status) {
                filter.statuses.push(status);
            }
        }
        let glob = |field: &'static str, text: Option<&str>| {
            text.map(|t| t.parse::<Glob>().map_err(|e| invalid(field, e.to_string())))
                .transpose()
        };
        filter.event_type = glob("type", text.event_type)?;
        filter.aggregate_type = glob("aggregate_type", text.aggregate_type)?;
        filter.aggregate_id = text.aggregate_id.map(str::to_owned);
        let time = |field: &'static str, text: Option<&str>| {
            text.map(|t| parse_time(t, now).map_err(|e| invalid(field, e.to_string())))
                .transpose()
        };
        filter.since = time("since", text.since)?;
        filter.until = time("until", text.until)?;
        filter.archive = text.archive;
        filter.validate()?;
        Ok(filter)
    }
}

/// A point in time as an operator writes it in a filter: RFC 3339
/// (`2026-11-30T12:00:00Z`), a date (`2026-11-30`, midnight UTC), or an age before `now`
/// (`2h`, `7d`). The error says what is accepted.
///
/// ```
/// use chrono::{DateTime, Utc};
/// let now: DateTime<Utc> = "2026-11-30T12:00:00Z".parse().unwrap();
/// let t = postbox::store::parse_time("2h", now).unwrap();
/// assert_eq!(t.to_rfc3339(), "2026-11-30T10:00:00+00:00");
/// ```
pub fn parse_time(
    text: &str,
    now: DateTime<Utc>,
) -> std::result::Result<DateTime<Utc>, ParseTimeError> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(t.with_timezone(&Utc));
    }
    if let Ok(day) = chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        return Ok(day.and_time(chrono::NaiveTime::MIN).and_utc());
    }
    if let Ok(age) = humantime::parse_duration(text) {
        return chrono::Duration::from_std(age)
            .ok()
            .and_then(|age| now.checked_sub_signed(age))
            .ok_or_else(|| ParseTimeError::AgeTooLong(text.to_owned()));
    }
    Err(ParseTimeError::NotATime(text.to_owned()))
}

/// Why [`parse_time`] refused a time; the message quotes the text and says what is accepted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseTimeError {
    /// An age (`7d`) that reaches back before the earliest time there is.
    #[error("{0:?} is an age too long")]
    AgeTooLong(String),
    /// Neither RFC 3339, a date nor an age.
    #[error(
        "{0:?} is not a time: use RFC 3339 (2026-11-30T12:00:00Z), a date (2026-11-30, UTC) or an age (2h, 7d)"
    )]
    NotATime(String),
}

/// The order events are read in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Order {
    /// Highest id first (what `postbox events list` shows).
    #[default]
    NewestFirst,
    /// Lowest id first (what a replay walks).
    OldestFirst,
}

/// Parameters of [`StoreOps::events_list`](crate::ops::StoreOps::events_list).
#[derive(Clone, Debug)]
pub struct ListParams<'a> {
    /// Whose events.
    pub target: &'a Target,
    /// Which events.
    pub filter: &'a EventFilter,
    /// In which order.
    pub order: Order,
    /// Resume after this id (in `order`): the last id of the previous page.
    pub after: Option<i64>,
    /// At most this many.
    pub limit: u32,
}

/// An event as stored, every column, read back for an operator or a replay. The payload and
/// headers are the JSON text stored, whatever a producer wrote there.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct StoredEvent {
    /// The event id.
    pub id: i64,
    /// The tenant, `None` for the default schema.
    pub tenant: Option<TenantId>,
    /// `PENDING`, `PROCESSING`, `PROCESSED` or `FAILED`.
    pub status: String,
    /// The event type.
    pub event_type: String,
    /// The aggregate type.
    pub aggregate_type: Option<String>,
    /// The aggregate id.
    pub aggregate_id: Option<String>,
    /// The idempotency key.
    pub idempotency_key: Option<String>,
    /// The producer's type name.
    pub event_class: Option<String>,
    /// The payload's schema version.
    pub schema_version: i32,
    /// The headers, as stored (JSON text).
    pub headers: String,
    /// The payload, as stored (JSON text).
    pub payload: String,
    /// Failed tries.
    pub retry_count: i32,
    /// The retry limit.
    pub max_retries: i32,
    /// Why the last try failed.
    pub last_error: Option<String>,
    /// When it was published.
    pub processed_at: Option<DateTime<Utc>>,
    /// The lease's end, or the retry's not-before time.
    pub locked_until: Option<DateTime<Utc>>,
    /// The relay that holds or held it.
    pub locked_by: Option<String>,
    /// When it was enqueued.
    pub created_at: DateTime<Utc>,
    /// When its row last changed.
    pub updated_at: DateTime<Utc>,
    /// When it was archived; `None` while in `outbox_events`.
    pub archived_at: Option<DateTime<Utc>>,
}

impl StoredEvent {
    /// The event as a sink receives it (for a replay). Fails, naming the column, when the
    /// payload or the headers cannot be read.
    pub fn to_outbox_event(&self) -> std::result::Result<OutboxEvent, StoredEventError> {
        let payload = serde_json::value::RawValue::from_string(self.payload.clone())
            .map_err(StoredEventError::Payload)?;
        let headers =
            super::row::headers_from_text(&self.headers).map_err(StoredEventError::Headers)?;
        Ok(OutboxEvent {
            id: self.id,
            tenant: self.tenant.clone(),
            event_type: self.event_type.clone(),
            aggregate_type: self.aggregate_type.clone(),
            aggregate_id: self.aggregate_id.clone(),
            idempotency_key: self.idempotency_key.clone(),
            payload,
            headers,
            event_class: self.event_class.clone(),
            schema_version: self.schema_version,
            retry_count: self.retry_count,
            max_retries: self.max_retries,
            created_at: self.created_at,
            claim_token: uuid::Uuid::nil(),
        })
    }
}

/// Why a [`StoredEvent`] cannot be read back as the event a sink receives: a column holds what
/// Postbox never writes there (a row written or edited by hand). The message names the column.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoredEventError {
    /// The `payload` column is not JSON.
    #[error("payload is not JSON: {0}")]
    Payload(#[source] serde_json::Error),
    /// The `headers` column is not a JSON object of names to values; the message says what it
    /// holds instead, starting with `headers:`.
    #[error("{0}")]
    Headers(String),
}
