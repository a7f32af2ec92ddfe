//! One claimed row, decoded by column name the same way on every store.
//!
//! A claim statement returns, by name: `id`, `stale`, `exhausted`, `event_type`,
//! `aggregate_type`, `aggregate_id`, `idempotency_key`, `payload` (JSON text), `headers` (JSON
//! text), `event_class`, `schema_version`, `retry_count`, `max_retries`, `created_at`,
//! `last_error`. Rows come from producers nobody validated (any language, plain SQL), so a row
//! whose columns cannot be read is not an error of the claim: it is reported as
//! [`Undecodable`], with the column that is wrong, and the other rows of the batch go on.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde_json::value::RawValue;
use sqlx::{ColumnIndex, Decode, Row, Type};

use super::{Claimed, ExhaustedEvent, StoredEvent};
use crate::event::OutboxEvent;
use crate::schema::TenantId;

/// A claimed event whose row cannot be read; the relay fails it at once with `reason`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Undecodable {
    /// The event id.
    pub id: i64,
    /// What cannot be read, naming the column, e.g. `headers: recursion limit exceeded`.
    pub reason: String,
}

/// Reads column `name` of `row` as `T`; an error names the column.
fn get<'r, R, T>(row: &'r R, name: &str) -> Result<T, String>
where
    R: Row,
    for<'n> &'n str: ColumnIndex<R>,
    T: Decode<'r, R::Database> + Type<R::Database>,
{
    row.try_get(name).map_err(|e| match e {
        sqlx::Error::ColumnDecode { source, .. } => format!("{name}: {source}"),
        other => format!("{name}: {other}"),
    })
}

/// Adds one claimed row to `claimed`: an event to publish, a stale event that just ran out of
/// tries, or an undecodable one. Fails only when the row has no readable id.
pub(crate) fn add_claimed_row<'r, R>(
    claimed: &mut Claimed,
    row: &'r R,
    tenant: Option<&TenantId>,
) -> Result<(), sqlx::Error>
where
    R: Row,
    for<'n> &'n str: ColumnIndex<R>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
    i32: Decode<'r, R::Database> + Type<R::Database>,
    bool: Decode<'r, R::Database> + Type<R::Database>,
    String: Decode<'r, R::Database> + Type<R::Database>,
    Option<String>: Decode<'r, R::Database> + Type<R::Database>,
    DateTime<Utc>: Decode<'r, R::Database> + Type<R::Database>,
{
    let id: i64 = row.try_get("id")?;
    let token = claimed.claim_token;
    let decoded = (|| -> Result<Option<OutboxEvent>, String> {
        if get::<R, bool>(row, "exhausted")? {
            claimed.exhausted.push(ExhaustedEvent {
                id,
                event_type: get(row, "event_type").unwrap_or_default(),
                retry_count: get(row, "retry_count").unwrap_or_default(),
                last_error: get::<R, Option<String>>(row, "last_error")
                    .ok()
                    .flatten()
                    .unwrap_or_default(),
            });
            return Ok(None);
        }
        let stale: bool = get(row, "stale")?;
        let payload: String = get(row, "payload")?;
        let payload =
            RawValue::from_string(payload).map_err(|e| format!("payload is not JSON: {e}"))?;
        let headers: String = get(row, "headers")?;
        let headers = headers_from_text(&headers)?;
        let event = OutboxEvent {
            id,
            tenant: tenant.cloned(),
            event_type: get(row, "event_type")?,
            aggregate_type: get(row, "aggregate_type")?,
            aggregate_id: get(row, "aggregate_id")?,
            idempotency_key: get(row, "idempotency_key")?,
            payload,
            headers,
            event_class: get(row, "event_class")?,
            schema_version: get(row, "schema_version")?,
            retry_count: get(row, "retry_count")?,
            max_retries: get(row, "max_retries")?,
            created_at: get(row, "created_at")?,
            claim_token: token,
        };
        if stale {
            claimed.recovered += 1;
        }
        Ok(Some(event))
    })();
    match decoded {
        Ok(Some(event)) => claimed.events.push(event),
        Ok(None) => {}
        Err(reason) => claimed.undecodable.push(Undecodable {
            id,
            reason: format!("the stored event cannot be read: {reason}"),
        }),
    }
    Ok(())
}

/// Reads a row of a list statement (every column of the table by name, payload and headers as
/// JSON text, `archived_at` NULL for the outbox table) as a [`StoredEvent`].
pub(crate) fn stored_event<'r, R>(
    row: &'r R,
    tenant: Option<&TenantId>,
) -> Result<StoredEvent, sqlx::Error>
where
    R: Row,
    for<'n> &'n str: ColumnIndex<R>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
    i32: Decode<'r, R::Database> + Type<R::Database>,
    String: Decode<'r, R::Database> + Type<R::Database>,
    Option<String>: Decode<'r, R::Database> + Type<R::Database>,
    DateTime<Utc>: Decode<'r, R::Database> + Type<R::Database>,
    Option<DateTime<Utc>>: Decode<'r, R::Database> + Type<R::Database>,
{
    Ok(StoredEvent {
        id: row.try_get("id")?,
        tenant: tenant.cloned(),
        status: row.try_get("status")?,
        event_type: row.try_get("event_type")?,
        aggregate_type: row.try_get("aggregate_type")?,
        aggregate_id: row.try_get("aggregate_id")?,
        idempotency_key: row.try_get("idempotency_key")?,
        event_class: row.try_get("event_class")?,
        schema_version: row.try_get("schema_version")?,
        headers: row.try_get("headers")?,
        payload: row.try_get("payload")?,
        retry_count: row.try_get("retry_count")?,
        max_retries: row.try_get("max_retries")?,
        last_error: row.try_get("last_error")?,
        processed_at: row.try_get("processed_at")?,
        locked_until: row.try_get("locked_until")?,
        locked_by: row.try_get("locked_by")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        archived_at: row.try_get("archived_at")?,
    })
}

/// Headers stored as a JSON object; non-string values (possible from plain-SQL producers) are
/// kept as their JSON text. Anything but an object, or JSON serde cannot read (nested deeper
/// than 128 levels, numbers out of range), cannot be forwarded faithfully.
pub(crate) fn headers_from_text(text: &str) -> Result<BTreeMap<String, String>, String> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("headers: {e}"))?;
    match value {
        serde_json::Value::Object(map) => Ok(map
            .into_iter()
            .map(|(k, v)| match v {
                serde_json::Value::String(s) => (k, s),
                other => (k, other.to_string()),
            })
            .collect()),
        other => Err(format!(
            "headers: must be a JSON object of names to values, found {}",
            match other {
                serde_json::Value::Null => "null",
                serde_json::Value::Array(_) => "an array",
                _ => "a scalar",
            }
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::headers_from_text;

    #[test]
    fn headers_that_cannot_be_forwarded_name_the_column() {
        assert_eq!(
            headers_from_text(r#"{"traceparent": "00-x", "n": 1}"#).map(|h| h["n"].clone()),
            Ok("1".to_owned())
        );
        let deep = format!("{{\"a\": {}1{}}}", "[".repeat(200), "]".repeat(200));
        assert!(headers_from_text(&deep).is_err_and(|e| e.starts_with("headers:")));
        assert!(headers_from_text("[]").is_err_and(|e| e.contains("array")));
        assert!(headers_from_text(r#"{"n": 1e400}"#).is_err_and(|e| e.starts_with("headers:")));
    }
}
