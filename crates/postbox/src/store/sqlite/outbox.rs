//! The SQLite statement of an [`Outbox`](crate::Outbox): one event at a time (SQLite has no
//! multi-row `RETURNING` that keeps input order, and its inserts are local calls).

use sqlx::sqlite::SqliteConnection;

use crate::error::Result;
use crate::event::Enqueued;
use crate::outbox::{Checked, Outbox};
use crate::schema::SchemaName;

const ENQUEUE: &str = include_str!("../../../sql/sqlite/queries/enqueue.sql");

/// What an outbox keeps for SQLite: nothing, its statement names no schema.
pub(crate) struct Prepared;

impl Prepared {
    pub(crate) fn new(_schema: &SchemaName) -> Self {
        Prepared
    }
}

/// One event of `outbox`; `None` when its idempotency key exists already.
pub(crate) async fn insert_one(
    outbox: &Outbox,
    _prepared: &Prepared,
    conn: &mut SqliteConnection,
    event: &Checked<'_>,
) -> Result<Option<i64>> {
    insert(conn, event)
        .await
        .map_err(|e| outbox.write_error(e, "main"))
}

/// Many events of `outbox`, one at a time; results in the order of `events`.
pub(crate) async fn insert_many(
    outbox: &Outbox,
    prepared: &Prepared,
    conn: &mut SqliteConnection,
    events: &[Checked<'_>],
) -> Result<Vec<Enqueued>> {
    let mut out = Vec::with_capacity(events.len());
    for event in events {
        let id = insert_one(outbox, prepared, &mut *conn, event).await?;
        out.push(id.map_or(Enqueued::Duplicate, Enqueued::Inserted));
    }
    Ok(out)
}

/// One event; `None` when its idempotency key exists already.
async fn insert(
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
