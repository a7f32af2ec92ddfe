//! The SQLite statement of an [`Outbox`](super::Outbox): one event at a time (SQLite has no
//! multi-row `RETURNING` that keeps input order, and its inserts are local calls).

use sqlx::sqlite::SqliteConnection;

use super::Checked;

const ENQUEUE: &str = include_str!("../../sql/sqlite/enqueue.sql");

/// One event; `None` when its idempotency key exists already.
pub(super) async fn insert(
    conn: &mut SqliteConnection,
    c: &Checked<'_>,
) -> std::result::Result<Option<i64>, sqlx::Error> {
    let event = c.event;
    sqlx::query_scalar(ENQUEUE)
        .bind(&event.event_type)
        .bind(&event.aggregate_type)
        .bind(&event.aggregate_id)
        .bind(event.payload.get())
        .bind(&event.event_class)
        .bind(event.schema_version)
        .bind(&c.headers)
        .bind(c.key.as_deref())
        .bind(c.max_retries)
        .fetch_optional(conn)
        .await
}
