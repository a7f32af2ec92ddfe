//! Writing events in the caller's transaction.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chrono::{NaiveDate, Utc};
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgArguments, PgConnection};
use sqlx::query::Query;
use sqlx::sqlite::SqliteConnection;
use sqlx::{Arguments, AssertSqlSafe, Execute, Postgres, Sqlite, Transaction};

use crate::error::{Error, Result};
use crate::event::{Enqueued, Event};
use crate::schema::SchemaName;
use crate::store::sql::{max_placeholder, render, safe};

/// Default payload limit: 1 MiB of JSON.
pub const DEFAULT_PAYLOAD_LIMIT: usize = 1024 * 1024;

/// Default shortest time between two notifications from one [`Outbox`].
pub const DEFAULT_NOTIFY_INTERVAL: Duration = Duration::from_millis(50);

/// The producer side of Postbox: writes events into `outbox_events` inside the caller's own sqlx
/// transaction, so they are committed, or rolled back, with the business rows.
///
/// ```no_run
/// use postbox::{Event, Outbox};
///
/// # async fn example(pool: sqlx::PgPool) -> anyhow::Result<()> {
/// let outbox = Outbox::new();
/// let mut tx = pool.begin().await?;
/// sqlx::query("INSERT INTO invoices (id, amount_cents) VALUES (456, 1200)")
///     .execute(&mut *tx)
///     .await?;
/// let event = Event::new("InvoiceCreated", &serde_json::json!({"invoice_id": 456}))?
///     .aggregate("Invoice", "456");
/// outbox.enqueue(&mut tx, event).await?; // Inserted(id), or Duplicate
/// tx.commit().await?; // the event exists if and only if the invoice does
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Outbox {
    inner: Arc<Inner>,
}

struct Inner {
    schema: SchemaName,
    payload_limit: usize,
    max_retries: i32,
    notify: bool,
    notify_interval: Duration,
    /// When the last notifying enqueue ran, in microseconds since `epoch` plus one (0: never).
    last_notify: AtomicU64,
    epoch: Instant,
    pg_one: Arc<str>,
    pg_one_notify: Arc<str>,
    pg_many: Arc<str>,
    pg_many_notify: Arc<str>,
    pg_with: Wrapped,
    pg_with_notify: Wrapped,
}

impl Default for Outbox {
    fn default() -> Self {
        Self::new()
    }
}

impl Outbox {
    /// An outbox in the `public` schema with the default limits (payload 1 MiB, 5 retries).
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// Configures an outbox.
    ///
    /// ```
    /// let outbox = postbox::Outbox::builder()
    ///     .schema(postbox::SchemaName::new("s_acme").unwrap())
    ///     .payload_limit(64 * 1024)
    ///     .max_retries(8)
    ///     .build();
    /// assert_eq!(outbox.schema().as_str(), "s_acme");
    /// ```
    pub fn builder() -> OutboxBuilder {
        OutboxBuilder {
            schema: SchemaName::public(),
            payload_limit: DEFAULT_PAYLOAD_LIMIT,
            max_retries: 5,
            notify: true,
            notify_interval: DEFAULT_NOTIFY_INTERVAL,
        }
    }

    /// The schema this outbox writes to (PostgreSQL; SQLite has one outbox per file).
    pub fn schema(&self) -> &SchemaName {
        &self.inner.schema
    }

    /// The notification payload (the schema) when this enqueue is to notify, else `None`: the
    /// first enqueue notifies, then at most one per `notify_interval`. Relays keep polling
    /// briskly for a while after each wake-up (`RelayConfig::busy_period`), so they find the
    /// events committed in between without a notification of their own.
    fn notify_payload(&self) -> Option<&str> {
        let inner = &*self.inner;
        if !inner.notify {
            return None;
        }
        let schema = Some(inner.schema.as_str());
        if inner.notify_interval.is_zero() {
            return schema;
        }
        let now = micros(inner.epoch.elapsed()).saturating_add(1);
        let last = inner.last_notify.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < micros(inner.notify_interval) {
            return None;
        }
        // Of producers racing here, one wins and notifies.
        inner
            .last_notify
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .ok()
            .and(schema)
    }

    /// The statement to run, `plain` or `notifying`, and the notification payload with the
    /// latter.
    fn pg_statement(
        &self,
        plain: &Arc<str>,
        notifying: &Arc<str>,
    ) -> (AssertSqlSafe<Arc<str>>, Option<&str>) {
        match self.notify_payload() {
            Some(schema) => (safe(notifying), Some(schema)),
            None => (safe(plain), None),
        }
    }

    /// Writes one event through `conn`, normally the caller's open transaction. Returns
    /// [`Enqueued::Duplicate`] if an event with the same idempotency key exists (race-free: the
    /// database's unique index decides). Invalid events are refused before anything is written.
    pub async fn enqueue<C>(&self, conn: &mut C, event: Event) -> Result<Enqueued>
    where
        C: OutboxConnection + ?Sized,
    {
        let event = self.check(&event, Utc::now().date_naive())?;
        let id = match conn.outbox_connection() {
            Conn::Postgres(c) => {
                let (sql, notify) =
                    self.pg_statement(&self.inner.pg_one, &self.inner.pg_one_notify);
                let mut args = PgArguments::default();
                event.add_to(&mut args, notify)?;
                let rows: Vec<Option<i64>> = sqlx::query_scalar_with(sql, args)
                    .fetch_all(c)
                    .await
                    .map_err(|e| self.write_error(e, false))?;
                rows.into_iter().flatten().next()
            }
            Conn::Sqlite(c) => sqlite_insert(c, &event)
                .await
                .map_err(|e| self.write_error(e, true))?,
        };
        Ok(id.map_or(Enqueued::Duplicate, Enqueued::Inserted))
    }

    /// Runs a business `statement` and writes `event` as **one** SQL statement (PostgreSQL): one
    /// round trip to the server for both, where [`enqueue`](Self::enqueue) after the statement
    /// takes two. In a short transaction that round trip is a good part of what an enqueue
    /// costs (`docs/performance.md` has figures).
    ///
    /// `statement` is a data-modifying statement (`INSERT`, `UPDATE` or `DELETE`) built with
    /// [`sqlx::query()`] and its binds; Postbox runs it as a `WITH` query in front of its own
    /// insert (a `;` at its end is dropped; it may not be followed by a comment). Both happen
    /// or neither: an error in either part (a constraint of your table, say) fails the
    /// statement and writes nothing. Returns what [`enqueue`](Self::enqueue) returns; an
    /// invalid event, and a statement with a placeholder it has no bound value for
    /// ([`Error::InvalidStatement`]), are refused before anything is sent.
    ///
    /// Mind that the event is written whatever rows the statement touched, and that the
    /// statement's own result (rows affected, `RETURNING` rows) is not returned. When the event
    /// depends on them — an `UPDATE … WHERE status = 'open'` that may match nothing — run the
    /// statement and check its result first, then [`enqueue`](Self::enqueue). A statement that
    /// only reads (`SELECT`) is not run at all, as PostgreSQL skips an unreferenced read-only
    /// `WITH` query.
    ///
    /// ```no_run
    /// use postbox::{Event, Outbox};
    ///
    /// # async fn example(pool: sqlx::PgPool) -> anyhow::Result<()> {
    /// let outbox = Outbox::new();
    /// let mut tx = pool.begin().await?;
    /// let invoice = sqlx::query("INSERT INTO invoices (id, amount_cents) VALUES ($1, $2)")
    ///     .bind(456_i64)
    ///     .bind(1200_i64);
    /// let event = Event::new("InvoiceCreated", &serde_json::json!({"invoice_id": 456}))?
    ///     .aggregate("Invoice", "456");
    /// outbox.enqueue_with(&mut tx, invoice, event).await?; // the invoice row and its event
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub async fn enqueue_with(
        &self,
        conn: &mut PgConnection,
        mut statement: Query<'_, Postgres, PgArguments>,
        event: Event,
    ) -> Result<Enqueued> {
        let event = self.check(&event, Utc::now().date_naive())?;
        let mut args = statement
            .take_arguments()
            .map_err(sqlx::Error::Encode)?
            .unwrap_or_default();
        let business = statement.sql();
        // A trailing `;` would end the WITH query early.
        let business = business
            .as_str()
            .trim_end_matches(|c: char| c == ';' || c.is_whitespace());
        if business.trim_start().is_empty() {
            return Err(Error::InvalidStatement(
                "the business statement given to enqueue_with is empty".into(),
            ));
        }
        // The event's parameters follow the caller's: a placeholder without its value would
        // silently take one of the event's.
        let bound = args.len();
        let used = max_placeholder(business);
        if used > bound {
            return Err(Error::InvalidStatement(format!(
                "the business statement uses ${used} but {bound} value(s) are bound to it; \
                 bind one value per placeholder"
            )));
        }
        let first = bound + 1;
        let notify = self.notify_payload();
        let template = match notify {
            Some(_) => &self.inner.pg_with_notify,
            None => &self.inner.pg_with,
        };
        // Safe: the caller's own statement, and ours around it with a quoted schema name.
        let sql = AssertSqlSafe(template.render(business, first));
        event.add_to(&mut args, notify)?;
        let rows: Vec<Option<i64>> = sqlx::query_scalar_with(sql, args)
            .fetch_all(conn)
            .await
            .map_err(|e| self.write_error(e, false))?;
        Ok(rows
            .into_iter()
            .flatten()
            .next()
            .map_or(Enqueued::Duplicate, Enqueued::Inserted))
    }

    /// The error of a failed insert. A primary-key collision is named as such: only an
    /// idempotency key that exists makes a duplicate (the statements' `ON CONFLICT` names it),
    /// so an id that is taken must never pass for one.
    fn write_error(&self, err: sqlx::Error, sqlite: bool) -> Error {
        if let sqlx::Error::Database(db) = &err
            && db.is_unique_violation()
            // PostgreSQL names the constraint; SQLite names the column in its message.
            && (db.constraint() == Some("outbox_events_pkey")
                || db.message().contains("outbox_events.id"))
        {
            return Error::IdTaken {
                schema: if sqlite {
                    "main".to_owned()
                } else {
                    self.inner.schema.to_string()
                },
            };
        }
        Error::Database(err)
    }

    /// Validates `event` and works out what is written beside its own fields.
    fn check<'e>(&self, event: &'e Event, today: NaiveDate) -> Result<Checked<'e>> {
        let key = event.resolved_idempotency_key(today);
        event.validate(self.inner.payload_limit, key.as_deref())?;
        Ok(Checked {
            event,
            headers: serde_json::to_string(&event.headers)?,
            max_retries: event.max_retries.unwrap_or(self.inner.max_retries),
            key,
        })
    }

    /// Writes many events; on PostgreSQL in one multi-row `INSERT`. Results come in the order of
    /// `events`. Every event is validated before anything is written.
    pub async fn enqueue_many<C>(
        &self,
        conn: &mut C,
        events: impl IntoIterator<Item = Event>,
    ) -> Result<Vec<Enqueued>>
    where
        C: OutboxConnection + ?Sized,
    {
        let events: Vec<Event> = events.into_iter().collect();
        let today = Utc::now().date_naive();
        let checked = events
            .iter()
            .map(|e| self.check(e, today))
            .collect::<Result<Vec<_>>>()?;
        if checked.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<Option<String>> = checked.iter().map(|c| c.key.clone()).collect();
        match conn.outbox_connection() {
            Conn::Postgres(c) => {
                let col = |f: fn(&Event) -> Option<&str>| -> Vec<Option<&str>> {
                    events.iter().map(f).collect()
                };
                let (sql, notify) =
                    self.pg_statement(&self.inner.pg_many, &self.inner.pg_many_notify);
                let mut query = sqlx::query_as(sql)
                    .bind(
                        events
                            .iter()
                            .map(|e| e.event_type.as_str())
                            .collect::<Vec<_>>(),
                    )
                    .bind(col(|e| e.aggregate_type.as_deref()))
                    .bind(col(|e| e.aggregate_id.as_deref()))
                    .bind(events.iter().map(|e| e.payload.get()).collect::<Vec<_>>())
                    .bind(col(|e| e.event_class.as_deref()))
                    .bind(events.iter().map(|e| e.schema_version).collect::<Vec<_>>())
                    .bind(
                        checked
                            .iter()
                            .map(|c| c.headers.as_str())
                            .collect::<Vec<_>>(),
                    )
                    .bind(&keys)
                    .bind(checked.iter().map(|c| c.max_retries).collect::<Vec<_>>());
                if let Some(schema) = notify {
                    query = query.bind(schema);
                }
                let rows: Vec<(Option<i64>, Option<String>)> = query
                    .fetch_all(c)
                    .await
                    .map_err(|e| self.write_error(e, false))?;
                // The NULL row of the notification carries no event.
                let rows = rows.into_iter().filter_map(|(id, key)| Some((id?, key)));
                Ok(match_results(&keys, rows))
            }
            Conn::Sqlite(c) => {
                let mut out = Vec::with_capacity(checked.len());
                for event in &checked {
                    let id = sqlite_insert(c, event)
                        .await
                        .map_err(|e| self.write_error(e, true))?;
                    out.push(id.map_or(Enqueued::Duplicate, Enqueued::Inserted));
                }
                Ok(out)
            }
        }
    }
}

/// Whole microseconds, saturating (a `u64` of them lasts 584,000 years).
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// An event that passed validation, with what is written beside its own fields.
struct Checked<'e> {
    event: &'e Event,
    key: Option<String>,
    headers: String,
    max_retries: i32,
}

impl Checked<'_> {
    /// Appends the event's nine columns (and the notification's payload, if any) to `args`, in
    /// the order of the PostgreSQL enqueue statements.
    fn add_to(&self, args: &mut PgArguments, notify: Option<&str>) -> Result<()> {
        let e = self.event;
        let add = |r: std::result::Result<(), sqlx::error::BoxDynError>| {
            r.map_err(|err| Error::Database(sqlx::Error::Encode(err)))
        };
        add(args.add(e.event_type.as_str()))?;
        add(args.add(e.aggregate_type.as_deref()))?;
        add(args.add(e.aggregate_id.as_deref()))?;
        add(args.add(e.payload.get()))?;
        add(args.add(e.event_class.as_deref()))?;
        add(args.add(e.schema_version))?;
        add(args.add(self.headers.as_str()))?;
        add(args.add(self.key.as_deref()))?;
        add(args.add(self.max_retries))?;
        if let Some(schema) = notify {
            add(args.add(schema))?;
        }
        Ok(())
    }
}

/// The statement of [`Outbox::enqueue_with`] for one schema, cut where the caller's statement
/// and the event's parameters go: their numbers depend on how many parameters the caller's
/// statement has, so the text is put together for each call (a few string pushes).
struct Wrapped {
    /// Up to the caller's statement.
    head: String,
    /// After it: text, then the event's parameter number `k` (1-based), in turn.
    pieces: Vec<(String, usize)>,
    /// After the last parameter.
    tail: String,
}

impl Wrapped {
    /// Cuts the rendered template `sql` at `{business}` and at each `{eK}`.
    fn new(sql: &str) -> Self {
        let (head, mut rest) = sql.split_once("{business}").unwrap_or((sql, ""));
        let mut pieces = Vec::new();
        while let Some(at) = rest.find("{e") {
            let after = &rest[at + 2..];
            let Some(close) = after.find('}') else { break };
            let Ok(k) = after[..close].parse::<usize>() else {
                break;
            };
            pieces.push((rest[..at].to_owned(), k));
            rest = &after[close + 1..];
        }
        Wrapped {
            head: head.to_owned(),
            pieces,
            tail: rest.to_owned(),
        }
    }

    /// The statement around `business`, the event's parameters numbered from `first`.
    fn render(&self, business: &str, first: usize) -> String {
        use std::fmt::Write;
        let mut sql = String::with_capacity(self.head.len() + business.len() + 640);
        sql.push_str(&self.head);
        sql.push_str(business);
        for (text, k) in &self.pieces {
            sql.push_str(text);
            // Writing to a String cannot fail.
            let _ = write!(sql, "${}", first + k - 1);
        }
        sql.push_str(&self.tail);
        sql
    }
}

const SQLITE_ENQUEUE: &str = include_str!("../sql/sqlite/enqueue.sql");

/// One event on SQLite; `None` when its idempotency key exists already.
async fn sqlite_insert(
    conn: &mut SqliteConnection,
    c: &Checked<'_>,
) -> std::result::Result<Option<i64>, sqlx::Error> {
    let event = c.event;
    sqlx::query_scalar(SQLITE_ENQUEUE)
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

/// Maps the rows a multi-row insert returned back to its inputs: a keyed event was inserted if
/// its key came back (the first of equal keys wins); unkeyed events were all inserted, and
/// identity values are handed out in input order.
fn match_results(
    keys: &[Option<String>],
    rows: impl IntoIterator<Item = (i64, Option<String>)>,
) -> Vec<Enqueued> {
    let mut by_key = std::collections::HashMap::new();
    let mut unkeyed = Vec::new();
    for (id, key) in rows {
        match key {
            Some(k) => {
                by_key.insert(k, id);
            }
            None => unkeyed.push(id),
        }
    }
    unkeyed.sort_unstable();
    let mut unkeyed = unkeyed.into_iter();
    keys.iter()
        .map(|key| match key {
            Some(k) => by_key
                .remove(k)
                .map_or(Enqueued::Duplicate, Enqueued::Inserted),
            None => unkeyed
                .next()
                .map_or(Enqueued::Duplicate, Enqueued::Inserted),
        })
        .collect()
}

/// Settings of an [`Outbox`].
#[derive(Clone, Debug)]
pub struct OutboxBuilder {
    schema: SchemaName,
    payload_limit: usize,
    max_retries: i32,
    notify: bool,
    notify_interval: Duration,
}

impl OutboxBuilder {
    /// Whether enqueue sends `NOTIFY` (PostgreSQL; default true), so an idle relay wakes the
    /// moment the transaction commits. Without it, relays find new events at their next poll.
    pub fn notify(mut self, notify: bool) -> Self {
        self.notify = notify;
        self
    }

    /// The shortest time between two notifications from this outbox and its clones (default
    /// 50 ms; zero notifies on every enqueue).
    ///
    /// PostgreSQL serializes the commits of all transactions that notified, so a notification
    /// per transaction caps a busy producer. A relay that was woken keeps polling every
    /// `busy_poll_interval` for `busy_period` (10 ms and 1 s by default), so it finds the events
    /// enqueued in between at once. Keep this well below the relays' `busy_period`. An event
    /// whose transaction commits more than `busy_period` after the last notification is found at
    /// the next poll instead.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let outbox = postbox::Outbox::builder()
    ///     .notify_interval(Duration::from_millis(20))
    ///     .build();
    /// # let _ = outbox;
    /// ```
    pub fn notify_interval(mut self, interval: Duration) -> Self {
        self.notify_interval = interval;
        self
    }

    /// The schema to write to (default `public`); for a tenant, its schema (`s_<tenant>`).
    pub fn schema(mut self, schema: SchemaName) -> Self {
        self.schema = schema;
        self
    }

    /// The largest payload accepted, in bytes of JSON (default 1 MiB).
    pub fn payload_limit(mut self, bytes: usize) -> Self {
        self.payload_limit = bytes;
        self
    }

    /// The retry limit of events that do not set their own (default 5).
    pub fn max_retries(mut self, max_retries: i32) -> Self {
        self.max_retries = max_retries.max(0);
        self
    }

    /// Builds the outbox; its statements are rendered once, here.
    pub fn build(self) -> Outbox {
        let with = render(
            include_str!("../sql/postgres/enqueue_with.sql"),
            &self.schema,
        );
        Outbox {
            inner: Arc::new(Inner {
                pg_one: render(include_str!("../sql/postgres/enqueue.sql"), &self.schema),
                pg_one_notify: render(
                    include_str!("../sql/postgres/enqueue_notify.sql"),
                    &self.schema,
                ),
                pg_many_notify: render(
                    include_str!("../sql/postgres/enqueue_many_notify.sql"),
                    &self.schema,
                ),
                pg_many: render(
                    include_str!("../sql/postgres/enqueue_many.sql"),
                    &self.schema,
                ),
                pg_with_notify: Wrapped::new(&with),
                pg_with: Wrapped::new(with.split("-- postbox:notify").next().unwrap_or(&with)),
                schema: self.schema,
                payload_limit: self.payload_limit,
                max_retries: self.max_retries,
                notify: self.notify,
                notify_interval: self.notify_interval,
                last_notify: AtomicU64::new(0),
                epoch: Instant::now(),
            }),
        }
    }
}

mod sealed {
    /// A connection [`super::Outbox`] can write through.
    pub enum Conn<'a> {
        /// PostgreSQL.
        Postgres(&'a mut sqlx::postgres::PgConnection),
        /// SQLite.
        Sqlite(&'a mut sqlx::sqlite::SqliteConnection),
    }

    pub trait Sealed {
        fn outbox_connection(&mut self) -> Conn<'_>;
    }
}

use sealed::{Conn, Sealed};

/// A connection or transaction that [`Outbox::enqueue`] can write through: a PostgreSQL or
/// SQLite connection, pooled connection or transaction. Sealed.
pub trait OutboxConnection: Sealed + Send {}

macro_rules! outbox_connection {
    ($variant:ident, $db:ty, $conn:ty) => {
        impl Sealed for $conn {
            fn outbox_connection(&mut self) -> Conn<'_> {
                Conn::$variant(self)
            }
        }
        impl OutboxConnection for $conn {}
        impl Sealed for Transaction<'_, $db> {
            fn outbox_connection(&mut self) -> Conn<'_> {
                Conn::$variant(&mut *self)
            }
        }
        impl OutboxConnection for Transaction<'_, $db> {}
        impl Sealed for PoolConnection<$db> {
            fn outbox_connection(&mut self) -> Conn<'_> {
                Conn::$variant(&mut *self)
            }
        }
        impl OutboxConnection for PoolConnection<$db> {}
    };
}

outbox_connection!(Postgres, Postgres, PgConnection);
outbox_connection!(Sqlite, Sqlite, SqliteConnection);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_map_back_in_input_order() {
        let keys = vec![
            Some("a".to_owned()),
            None,
            Some("a".to_owned()),
            Some("b".to_owned()),
            None,
        ];
        let rows = vec![(11, Some("a".to_owned())), (13, None), (12, None)];
        assert_eq!(
            match_results(&keys, rows),
            vec![
                Enqueued::Inserted(11),
                Enqueued::Inserted(12),
                Enqueued::Duplicate,
                Enqueued::Duplicate,
                Enqueued::Inserted(13),
            ]
        );
    }

    #[test]
    fn the_wrapped_statement_numbers_the_events_parameters_after_the_callers() {
        let outbox = Outbox::builder()
            .schema(SchemaName::new("s_acme").expect("a valid name"))
            .build();
        let business = "INSERT INTO t (a, b) VALUES ($1, $2)";
        for (wrapped, last) in [
            (&outbox.inner.pg_with, 11),
            (&outbox.inner.pg_with_notify, 12),
        ] {
            let sql = wrapped.render(business, 3);
            assert!(!sql.contains('{'), "a marker is left in\n{sql}");
            assert!(
                sql.contains("(\nINSERT INTO t (a, b) VALUES ($1, $2)\n)"),
                "{sql}"
            );
            assert!(sql.contains(r#""s_acme".outbox_events"#), "{sql}");
            assert!(sql.contains("VALUES ($3, $4, $5, $6::jsonb, $7, $8, $9::jsonb, $10, $11)"));
            assert!(sql.contains(&format!("${last}")) && !sql.contains(&format!("${}", last + 1)));
            assert_eq!(sql.contains("pg_notify"), last == 12, "{sql}");
        }
    }
}
