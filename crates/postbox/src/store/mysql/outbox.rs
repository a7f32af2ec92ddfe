//! The MySQL statement of an [`Outbox`](crate::Outbox): one event at a time. MySQL has no
//! `RETURNING` and no `ON CONFLICT (column)`: the insert reports a duplicate key, and only one on
//! the idempotency key's index is a duplicate event (InnoDB undoes the statement alone; the
//! caller's transaction goes on).

use sqlx::mysql::MySqlConnection;

use crate::error::Result;
use crate::event::Enqueued;
use crate::outbox::{Checked, Outbox};
use crate::schema::SchemaName;

const ENQUEUE: &str = include_str!("../../../sql/mysql/queries/enqueue.sql");

/// The idempotency key's unique index, as MySQL names it in a duplicate-key error.
const KEY_INDEX: &str = "outbox_events_idempotency_key_idx";

/// What an outbox keeps for MySQL: nothing, its statement names no schema.
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
    conn: &mut MySqlConnection,
    event: &Checked<'_>,
) -> Result<Option<i64>> {
    insert(conn, event)
        .await
        .map_err(|e| outbox.write_error(e, outbox.schema().as_str()))
}

/// Many events of `outbox`, one at a time; results in the order of `events`.
pub(crate) async fn insert_many(
    outbox: &Outbox,
    prepared: &Prepared,
    conn: &mut MySqlConnection,
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
