//! The producer side of the benchmark: business transactions with and without an enqueue (or a
//! second business row in its place), on either database.

use std::sync::Arc;

use postbox::{AnyStore, Event, Outbox, PgStore, SqliteStore, Store, event::Enqueued};
use sqlx::mysql::MySqlPool;
use sqlx::postgres::PgPool;
use sqlx::sqlite::SqlitePool;

use crate::BenchError;

/// A pool of the scratch database, typed for the producer's transactions.
#[derive(Clone)]
pub(crate) enum Db {
    Pg(PgPool),
    Sqlite(SqlitePool),
    /// MySQL or MariaDB, with its store (made once: it reads the server's version).
    MySql(MySqlPool, Arc<dyn Store>),
}

const CREATE_PG: &str = "CREATE TABLE IF NOT EXISTS public.bench_business (id BIGSERIAL PRIMARY KEY, data TEXT NOT NULL)";
const CREATE_SQLITE: &str =
    "CREATE TABLE IF NOT EXISTS bench_business (id INTEGER PRIMARY KEY, data TEXT NOT NULL)";
const CREATE_MYSQL: &str = "CREATE TABLE IF NOT EXISTS bench_business (id BIGINT AUTO_INCREMENT PRIMARY KEY, data TEXT NOT NULL)";
const INSERT_MYSQL: &str = "INSERT INTO bench_business (data) VALUES (?)";
const INSERT_PG: &str = "INSERT INTO public.bench_business (data) VALUES ($1)";
const INSERT_SQLITE: &str = "INSERT INTO bench_business (data) VALUES (?1)";

/// What a business transaction writes beside its business row.
#[derive(Clone, Copy)]
pub(crate) enum Extra<'a> {
    /// Nothing: the transaction without an event.
    Nothing,
    /// A second business row: the floor, what any second statement costs.
    SecondRow,
    /// An event, enqueued through this outbox after the business rows.
    Event(&'a Outbox),
    /// An event written by the last business statement itself, through this outbox's
    /// `enqueue_with` (PostgreSQL).
    EventInStatement(&'a Outbox),
}

/// A payload of about 300 bytes, as in the measurements the targets come from.
pub(crate) fn payload(i: u64) -> serde_json::Value {
    serde_json::json!({
        "invoice_id": i,
        "customer": "cus_0123456789abcdef",
        "amount_cents": 129900 + i % 1000,
        "currency": "EUR",
        "lines": [
            {"sku": "plan-pro-monthly", "qty": 1, "unit_cents": 99900},
            {"sku": "seat-addon", "qty": 3, "unit_cents": 10000}
        ],
        "note": "benchmark event with a payload of roughly three hundred bytes",
    })
}

/// The data of the second business row: the event's payload, so both carry the same bytes.
fn second_row(i: u64) -> String {
    payload(i).to_string()
}

pub(crate) fn event(i: u64) -> Result<Event, BenchError> {
    event_of(i, None)
}

/// Event `i`, of aggregate `i % aggregates` (of its own aggregate when `None`).
pub(crate) fn event_of(i: u64, aggregates: Option<u64>) -> Result<Event, BenchError> {
    let aggregate = aggregates.map_or(i, |n| i % n.max(1));
    Ok(Event::new("InvoiceCreated", &payload(i))?
        .aggregate("Invoice", aggregate.to_string())
        .without_idempotency_key())
}

impl Db {
    /// The store over this pool, as `postbox::connect` hands it to a service and to the
    /// `postbox` binary (an [`AnyStore`]): the bench's relays run the path users run.
    pub(crate) fn store(&self) -> Arc<dyn Store> {
        match self {
            Db::Pg(p) => Arc::new(AnyStore::Postgres(PgStore::new(p.clone()))),
            Db::Sqlite(p) => Arc::new(AnyStore::Sqlite(SqliteStore::from_pool(p.clone()))),
            Db::MySql(_, store) => Arc::clone(store),
        }
    }

    pub(crate) async fn create_business_table(&self) -> Result<(), BenchError> {
        match self {
            Db::Pg(p) => sqlx::query(CREATE_PG).execute(p).await.map(drop),
            Db::Sqlite(p) => sqlx::query(CREATE_SQLITE).execute(p).await.map(drop),
            Db::MySql(p, _) => sqlx::query(CREATE_MYSQL).execute(p).await.map(drop),
        }
        .map_err(BenchError::db)
    }

    /// One business transaction: `statements` business rows, and beside them what `extra` says.
    /// Returns the event's id when an event was inserted.
    pub(crate) async fn business_tx(
        &self,
        i: u64,
        statements: u32,
        extra: Extra<'_>,
    ) -> Result<Option<i64>, BenchError> {
        let data = format!("invoice {i}");
        let second = matches!(extra, Extra::SecondRow).then(|| second_row(i));
        let rows = std::iter::repeat_n(data.as_str(), statements as usize).chain(second.as_deref());
        let (event, in_statement) = match extra {
            Extra::Event(o) => (Some((o, event(i)?)), false),
            Extra::EventInStatement(o) => (Some((o, event(i)?)), true),
            Extra::Nothing | Extra::SecondRow => (None, false),
        };
        // Two arms of one shape: the transactions are of different types.
        match self {
            Db::Pg(p) => {
                let mut rows: Vec<&str> = rows.collect();
                // The row whose statement carries the event, when it is to.
                let carrier = if in_statement { rows.pop() } else { None };
                let mut tx = p.begin().await.map_err(BenchError::db)?;
                for row in rows {
                    let insert = sqlx::query(INSERT_PG).bind(row);
                    insert.execute(&mut *tx).await.map_err(BenchError::db)?;
                }
                let id = match (event, carrier) {
                    (Some((o, e)), Some(row)) => {
                        let insert = sqlx::query(INSERT_PG).bind(row);
                        o.enqueue_with(&mut tx, insert, e).await?.id()
                    }
                    (Some((o, e)), None) => o.enqueue(&mut tx, e).await?.id(),
                    (None, _) => None,
                };
                tx.commit().await.map_err(BenchError::db)?;
                Ok(id)
            }
            Db::Sqlite(_) | Db::MySql(..) if in_statement => Err(BenchError::Setup(
                "an event in the business statement needs PostgreSQL".into(),
            )),
            Db::MySql(p, _) => {
                let mut tx = p.begin().await.map_err(BenchError::db)?;
                for row in rows {
                    let insert = sqlx::query(INSERT_MYSQL).bind(row);
                    insert.execute(&mut *tx).await.map_err(BenchError::db)?;
                }
                let id = match event {
                    Some((o, e)) => o.enqueue(&mut tx, e).await?.id(),
                    None => None,
                };
                tx.commit().await.map_err(BenchError::db)?;
                Ok(id)
            }
            Db::Sqlite(p) => {
                let begin = p.begin_with("BEGIN IMMEDIATE");
                let mut tx = begin.await.map_err(BenchError::db)?;
                for row in rows {
                    let insert = sqlx::query(INSERT_SQLITE).bind(row);
                    insert.execute(&mut *tx).await.map_err(BenchError::db)?;
                }
                let id = match event {
                    Some((o, e)) => o.enqueue(&mut tx, e).await?.id(),
                    None => None,
                };
                tx.commit().await.map_err(BenchError::db)?;
                Ok(id)
            }
        }
    }

    /// Writes `count` events starting at `first` with `enqueue_many`, one transaction per chunk.
    pub(crate) async fn preload(
        &self,
        outbox: &Outbox,
        first: u64,
        count: u64,
        aggregates: Option<u64>,
    ) -> Result<Vec<Enqueued>, BenchError> {
        let events = (first..first + count)
            .map(|i| event_of(i, aggregates))
            .collect::<Result<Vec<_>, _>>()?;
        match self {
            Db::Pg(p) => {
                let mut tx = p.begin().await.map_err(BenchError::db)?;
                let done = outbox.enqueue_many(&mut tx, events).await?;
                tx.commit().await.map_err(BenchError::db)?;
                Ok(done)
            }
            Db::Sqlite(p) => {
                let mut tx = p
                    .begin_with("BEGIN IMMEDIATE")
                    .await
                    .map_err(BenchError::db)?;
                let done = outbox.enqueue_many(&mut tx, events).await?;
                tx.commit().await.map_err(BenchError::db)?;
                Ok(done)
            }
            Db::MySql(p, _) => {
                let mut tx = p.begin().await.map_err(BenchError::db)?;
                let done = outbox.enqueue_many(&mut tx, events).await?;
                tx.commit().await.map_err(BenchError::db)?;
                Ok(done)
            }
        }
    }
}
