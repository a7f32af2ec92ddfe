//! The producer side: writing events into `outbox_events` inside the caller's own transaction.
//!
//! An [`Outbox`] comes from the store whose relays read its table ([`StoreExt::outbox`](crate::StoreExt::outbox)), so the
//! two cannot disagree on the schema; [`OutboxBuilder::tenant`] points it at a tenant's table.
//! The statements of each database live in its folder under `store/` (`outbox.rs` there);
//! `conn` hands each write to it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chrono::{NaiveDate, Utc};

use crate::error::{Error, Result};
use crate::event::{DEFAULT_MAX_RETRIES, Enqueued, Event};
use crate::schema::{SchemaName, Tenant};

mod conn;

pub use conn::OutboxConnection;
use conn::Prepared;
pub(crate) use conn::{Conn, InboxPrepared};

/// Default payload limit: 1 MiB of JSON.
pub const DEFAULT_PAYLOAD_LIMIT: usize = 1024 * 1024;

/// Default shortest time between two notifications from one [`Outbox`].
pub const DEFAULT_NOTIFY_INTERVAL: Duration = Duration::from_millis(50);

/// The producer side of Postbox: writes events into `outbox_events` inside the caller's own sqlx
/// transaction, so they are committed, or rolled back, with the business rows.
///
/// Get one from the store whose relays publish the events ([`StoreExt::outbox`](crate::StoreExt::outbox), or
/// [`StoreExt::outbox_builder`](crate::StoreExt::outbox_builder) to change its settings): it writes to the table they read.
///
/// ```no_run
/// use postbox::outbox::OutboxConnection;
/// use postbox::{Event, StoreExt};
///
/// // `tx`: the caller's open sqlx transaction (PostgreSQL, SQLite or MySQL), in which it has
/// // just inserted invoice 456; the event commits, or rolls back, with it.
/// async fn invoice_created<C>(url: &str, tx: &mut C) -> anyhow::Result<()>
/// where
///     C: OutboxConnection + ?Sized,
/// {
///     let store = postbox::connect(url).await?; // once, at start-up
///     let outbox = store.outbox();
///     let event = Event::new("InvoiceCreated", &serde_json::json!({"invoice_id": 456}))?
///         .aggregate("Invoice", "456");
///     outbox.enqueue(tx, event).await?; // Inserted(id), or Duplicate
///     Ok(())
/// }
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
    /// What each database keeps for this outbox (its statements for the schema).
    prepared: Prepared,
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
    pub(crate) fn notify_payload(&self) -> Option<&str> {
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
        let id = conn.insert_one(self, event).await?;
        Ok(id.map_or(Enqueued::Duplicate, Enqueued::Inserted))
    }

    /// What each database keeps for this outbox.
    pub(crate) fn prepared(&self) -> &Prepared {
        &self.inner.prepared
    }

    /// The error of a failed insert. A primary-key collision is named as such: only an
    /// idempotency key that exists makes a duplicate (the statements' `ON CONFLICT` names it),
    /// so an id that is taken must never pass for one.
    pub(crate) fn write_error(&self, err: sqlx::Error, schema: &str) -> Error {
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
    pub(crate) fn check<'e>(&self, event: &'e Event, today: NaiveDate) -> Result<Checked<'e>> {
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
        conn.outbox_connection().insert_many(self, &checked).await
    }
}

/// Whole microseconds, saturating (a `u64` of them lasts 584,000 years).
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// An event that passed validation, with what is written beside its own fields.
pub(crate) struct Checked<'e> {
    pub(crate) event: &'e Event,
    pub(crate) key: Option<String>,
    pub(crate) headers: String,
    pub(crate) max_retries: i32,
}

/// Settings of an [`Outbox`]; from [`StoreExt::outbox_builder`](crate::StoreExt::outbox_builder).
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
    /// use postbox::{StoreExt, schema::TenantId};
    /// # async fn example(store: postbox::AnyStore) -> postbox::Result<()> {
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
                prepared: Prepared::new(&self.schema),
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
                include_str!("../../sql/postgres/migrations/0001_outbox_events.sql"),
                1,
            ),
            (
                "postgres/0005_sql_enqueue.sql",
                include_str!("../../sql/postgres/migrations/0005_sql_enqueue.sql"),
                4,
            ),
            (
                "sqlite/0001_outbox_events.sql",
                include_str!("../../sql/sqlite/migrations/0001_outbox_events.sql"),
                1,
            ),
            (
                "mysql/0001_outbox_events.sql",
                include_str!("../../sql/mysql/migrations/0001_outbox_events.sql"),
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
