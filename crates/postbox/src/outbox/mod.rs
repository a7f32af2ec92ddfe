//! The producer side: writing events into `outbox_events` inside the caller's own transaction.
//!
//! An [`Outbox`] comes from the store whose relays read its table ([`Store::outbox`](crate::Store::outbox)), so the
//! two cannot disagree on the schema; [`OutboxBuilder::tenant`] points it at a tenant's table.
//! The statements of each database live in a module of their own.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chrono::{NaiveDate, Utc};

use crate::error::{Error, Result};
use crate::event::{DEFAULT_MAX_RETRIES, Enqueued, Event};
use crate::schema::{SchemaName, Tenant};

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

/// Default payload limit: 1 MiB of JSON.
pub const DEFAULT_PAYLOAD_LIMIT: usize = 1024 * 1024;

/// Default shortest time between two notifications from one [`Outbox`].
pub const DEFAULT_NOTIFY_INTERVAL: Duration = Duration::from_millis(50);

/// The producer side of Postbox: writes events into `outbox_events` inside the caller's own sqlx
/// transaction, so they are committed, or rolled back, with the business rows.
///
/// Get one from the store whose relays publish the events ([`Store::outbox`](crate::Store::outbox), or
/// [`Store::outbox_builder`](crate::Store::outbox_builder) to change its settings): it writes to the table they read.
///
/// ```no_run
/// use postbox::{Event, StoreExt};
///
/// # #[cfg(feature = "postgres")]
/// # async fn example(pool: sqlx::PgPool) -> anyhow::Result<()> {
/// let store = postbox::PgStore::new(pool.clone());
/// let outbox = store.outbox();
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
    #[cfg(feature = "postgres")]
    pg: postgres::Statements,
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox")
            .field("schema", &self.inner.schema)
            .field("payload_limit", &self.inner.payload_limit)
            .field("max_retries", &self.inner.max_retries)
            .field("notify", &self.inner.notify)
            .field("notify_interval", &self.inner.notify_interval)
            .finish()
    }
}

impl Outbox {
    /// The schema this outbox writes to (PostgreSQL; SQLite has one outbox per file).
    pub fn schema(&self) -> &SchemaName {
        &self.inner.schema
    }

    /// The notification payload (the schema) when this enqueue is to notify, else `None`: the
    /// first enqueue notifies, then at most one per `notify_interval`. Relays keep polling
    /// briskly for a while after each wake-up (`RelayConfig::busy_period`), so they find the
    /// events committed in between without a notification of their own.
    #[cfg_attr(
        not(feature = "postgres"),
        allow(dead_code, reason = "PostgreSQL notifies")
    )]
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

    /// Writes one event through `conn`, normally the caller's open transaction. Returns
    /// [`Enqueued::Duplicate`] if an event with the same idempotency key exists (race-free: the
    /// database's unique index decides). Invalid events are refused before anything is written.
    pub async fn enqueue<C>(&self, conn: &mut C, event: Event) -> Result<Enqueued>
    where
        C: OutboxConnection + ?Sized,
    {
        let event = self.check(&event, Utc::now().date_naive())?;
        self.insert_one(conn.outbox_connection(), &event).await
    }

    /// One checked event through `conn`.
    async fn insert_one(&self, conn: Conn<'_>, event: &Checked<'_>) -> Result<Enqueued> {
        let id = match conn {
            #[cfg(feature = "postgres")]
            Conn::Postgres(c) => postgres::insert_one(self, c, event).await?,
            #[cfg(feature = "sqlite")]
            Conn::Sqlite(c) => sqlite::insert(c, event)
                .await
                .map_err(|e| self.write_error(e, "main"))?,
            #[cfg(feature = "mysql")]
            Conn::MySql(c) => mysql::insert(c, event)
                .await
                .map_err(|e| self.write_error(e, self.inner.schema.as_str()))?,
        };
        Ok(id.map_or(Enqueued::Duplicate, Enqueued::Inserted))
    }

    /// The error of a failed insert. A primary-key collision is named as such: only an
    /// idempotency key that exists makes a duplicate (the statements' `ON CONFLICT` names it),
    /// so an id that is taken must never pass for one.
    fn write_error(&self, err: sqlx::Error, schema: &str) -> Error {
        if let sqlx::Error::Database(db) = &err
            && db.is_unique_violation()
            // PostgreSQL names the constraint; SQLite names the column, MySQL the key.
            && (db.constraint() == Some("outbox_events_pkey")
                || db.message().contains("outbox_events.id")
                || db.message().contains("'PRIMARY'")
                || db.message().contains("outbox_events.PRIMARY"))
        {
            return Error::IdTaken {
                schema: schema.to_owned(),
            };
        }
        Error::Database(err)
    }

    /// Validates `event` and works out what is written beside its own fields.
    fn check<'e>(&self, event: &'e Event, today: NaiveDate) -> Result<Checked<'e>> {
        let key = event.resolved_idempotency_key(today);
        event.validate(self.inner.payload_limit, key.as_deref())?;
        // The current trace, unless the caller named one (feature `otel`; else never).
        let headers = match crate::trace::current_traceparent() {
            Some(tp) if !event.headers.contains_key(crate::trace::TRACEPARENT) => {
                let mut headers = event.headers.clone();
                headers.insert(crate::trace::TRACEPARENT.to_owned(), tp);
                serde_json::to_string(&headers)?
            }
            _ => serde_json::to_string(&event.headers)?,
        };
        Ok(Checked {
            event,
            headers,
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
        // PostgreSQL writes them in one multi-row INSERT; the others one at a time.
        #[cfg(feature = "postgres")]
        #[allow(irrefutable_let_patterns, reason = "a build with PostgreSQL alone")]
        if let Conn::Postgres(c) = conn.outbox_connection() {
            return postgres::insert_many(self, c, &checked).await;
        }
        let mut out = Vec::with_capacity(checked.len());
        for event in &checked {
            out.push(self.insert_one(conn.outbox_connection(), event).await?);
        }
        Ok(out)
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

#[cfg(feature = "postgres")]
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

/// Settings of an [`Outbox`]; from [`Store::outbox_builder`](crate::Store::outbox_builder).
#[derive(Clone, Debug)]
pub struct OutboxBuilder {
    schema: SchemaName,
    payload_limit: usize,
    max_retries: i32,
    notify: bool,
    notify_interval: Duration,
}

impl OutboxBuilder {
    /// An outbox writing to `schema`, the default schema of a store.
    pub(crate) fn new(schema: SchemaName) -> Self {
        OutboxBuilder {
            schema,
            payload_limit: DEFAULT_PAYLOAD_LIMIT,
            max_retries: DEFAULT_MAX_RETRIES,
            notify: true,
            notify_interval: DEFAULT_NOTIFY_INTERVAL,
        }
    }

    /// Writes to `tenant`'s outbox (its schema, as the tenant registry has it) instead of the
    /// store's default one.
    ///
    /// ```no_run
    /// use postbox::ops::StoreOps;
    /// use postbox::{StoreExt, TenantId};
    /// # #[cfg(feature = "postgres")]
    /// # async fn example(store: postbox::PgStore) -> postbox::Result<()> {
    /// let acme = store.tenant_add(&postbox::store::TenantAddParams::new(&TenantId::new("acme")?)).await?;
    /// let outbox = store.outbox_builder().tenant(&acme).build();
    /// assert_eq!(outbox.schema().as_str(), "s_acme");
    /// # Ok(()) }
    /// ```
    pub fn tenant(mut self, tenant: &Tenant) -> Self {
        self.schema = tenant.schema.clone();
        self
    }

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
    /// use postbox::StoreExt;
    ///
    /// # fn example(store: &dyn postbox::Store) {
    /// let outbox = store.outbox_builder()
    ///     .notify_interval(Duration::from_millis(20))
    ///     .build();
    /// # let _ = outbox; }
    /// ```
    pub fn notify_interval(mut self, interval: Duration) -> Self {
        self.notify_interval = interval;
        self
    }

    /// The largest payload accepted, in bytes of JSON (default 1 MiB).
    pub fn payload_limit(mut self, bytes: usize) -> Self {
        self.payload_limit = bytes;
        self
    }

    /// The retry limit of events that do not set their own (default [`DEFAULT_MAX_RETRIES`], 5).
    pub fn max_retries(mut self, max_retries: i32) -> Self {
        self.max_retries = max_retries.max(0);
        self
    }

    /// Builds the outbox; its statements are rendered once, here.
    pub fn build(self) -> Outbox {
        Outbox {
            inner: Arc::new(Inner {
                #[cfg(feature = "postgres")]
                pg: postgres::Statements::build(&self.schema),
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
    /// A connection [`super::Outbox`] (and an [`Inbox`](crate::Inbox)) can write through.
    pub enum Conn<'a> {
        /// PostgreSQL.
        #[cfg(feature = "postgres")]
        Postgres(&'a mut sqlx::postgres::PgConnection),
        /// SQLite.
        #[cfg(feature = "sqlite")]
        Sqlite(&'a mut sqlx::sqlite::SqliteConnection),
        /// MySQL or MariaDB.
        #[cfg(feature = "mysql")]
        MySql(&'a mut sqlx::mysql::MySqlConnection),
    }

    pub trait Sealed {
        fn outbox_connection(&mut self) -> Conn<'_>;
    }
}

pub(crate) use sealed::Conn;
use sealed::Sealed;

/// A connection or transaction that [`Outbox::enqueue`] can write through: a PostgreSQL, SQLite
/// or MySQL connection, pooled connection or transaction. Sealed.
pub trait OutboxConnection: Sealed + Send {}

macro_rules! outbox_connection {
    ($variant:ident, $db:ty, $conn:ty) => {
        impl Sealed for $conn {
            fn outbox_connection(&mut self) -> Conn<'_> {
                Conn::$variant(self)
            }
        }
        impl OutboxConnection for $conn {}
        impl Sealed for sqlx::Transaction<'_, $db> {
            fn outbox_connection(&mut self) -> Conn<'_> {
                Conn::$variant(&mut *self)
            }
        }
        impl OutboxConnection for sqlx::Transaction<'_, $db> {}
        impl Sealed for sqlx::pool::PoolConnection<$db> {
            fn outbox_connection(&mut self) -> Conn<'_> {
                Conn::$variant(&mut *self)
            }
        }
        impl OutboxConnection for sqlx::pool::PoolConnection<$db> {}
    };
}

#[cfg(feature = "postgres")]
outbox_connection!(Postgres, sqlx::Postgres, sqlx::postgres::PgConnection);
#[cfg(feature = "sqlite")]
outbox_connection!(Sqlite, sqlx::Sqlite, sqlx::sqlite::SqliteConnection);
#[cfg(feature = "mysql")]
outbox_connection!(MySql, sqlx::MySql, sqlx::mysql::MySqlConnection);

#[cfg(all(test, feature = "postgres"))]
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
}

#[cfg(test)]
mod default_max_retries_tests {
    use crate::event::DEFAULT_MAX_RETRIES;

    /// Every migration line that gives `max_retries` a default repeats
    /// [`DEFAULT_MAX_RETRIES`]: each names the constant in a comment and holds its value.
    #[test]
    fn the_migrations_repeat_the_constant() {
        let n = DEFAULT_MAX_RETRIES;
        for (file, sql, expected) in [
            (
                "postgres/0001_outbox_events.sql",
                include_str!("../../sql/postgres/0001_outbox_events.sql"),
                1,
            ),
            (
                "postgres/0005_sql_enqueue.sql",
                include_str!("../../sql/postgres/0005_sql_enqueue.sql"),
                4,
            ),
            (
                "sqlite/0001_outbox_events.sql",
                include_str!("../../sql/sqlite/0001_outbox_events.sql"),
                1,
            ),
            (
                "mysql/0001_outbox_events.sql",
                include_str!("../../sql/mysql/0001_outbox_events.sql"),
                1,
            ),
        ] {
            let mut checked = 0;
            for line in sql.lines() {
                let (code, comment) = line.split_once("--").unwrap_or((line, ""));
                let lower = code.to_lowercase();
                let gives_default = lower.contains("max_retries")
                    && (lower.contains("default") || lower.contains("coalesce"));
                if !gives_default {
                    continue;
                }
                assert!(
                    comment.contains("DEFAULT_MAX_RETRIES"),
                    "{file}: a default of max_retries without a comment naming \
                     DEFAULT_MAX_RETRIES: {line}"
                );
                assert!(
                    [
                        format!("default {n}"),
                        format!(", {n})"),
                        format!("(default {n})")
                    ]
                    .iter()
                    .any(|v| lower.contains(v.as_str())),
                    "{file}: max_retries' default is not DEFAULT_MAX_RETRIES ({n}): {line}"
                );
                checked += 1;
            }
            assert_eq!(checked, expected, "{file}: lines that give the default");
        }
    }
}
