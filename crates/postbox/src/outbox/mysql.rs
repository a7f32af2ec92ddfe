//! The MySQL statement of an [`Outbox`](super::Outbox): one event at a time. MySQL has no
//! `RETURNING` and no `ON CONFLICT (column)`: the insert reports a duplicate key, and only one on
//! the idempotency key's index is a duplicate event (InnoDB undoes the statement alone; the
//! caller's transaction goes on).

use sqlx::mysql::MySqlConnection;

use super::Checked;

const ENQUEUE: &str = include_str!("../../sql/mysql/enqueue.sql");

/// The idempotency key's unique index, as MySQL names it in a duplicate-key error.
const KEY_INDEX: &str = "outbox_events_idempotency_key_idx";

/// One event; `None` when its idempotency key exists already.
pub(super) async fn insert(
    conn: &mut MySqlConnection,
    c: &Checked<'_>,
) -> std::result::Result<Option<i64>, sqlx::Error> {
    let event = c.event;
    let done = sqlx::query(ENQUEUE)
        .bind(&event.event_type)
        .bind(&event.aggregate_type)
        .bind(&event.aggregate_id)
        .bind(event.payload.get())
        .bind(&event.event_class)
        .bind(event.schema_version)
        .bind(&c.headers)
        .bind(c.key.as_deref())
        .bind(c.max_retries)
        .execute(conn)
        .await;
    match done {
        Ok(done) => Ok(Some(
            i64::try_from(done.last_insert_id()).unwrap_or(i64::MAX),
        )),
        Err(sqlx::Error::Database(db))
            if db.is_unique_violation() && c.key.is_some() && db.message().contains(KEY_INDEX) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}
