//! The demo's invoice service: an `invoices` table, and each invoice written together with its
//! `InvoiceCreated` event in one transaction.

use anyhow::Context;
use postbox::{Event, Outbox, SchemaName, event::DomainEvent};
use serde::{Deserialize, Serialize};
use sqlx::AssertSqlSafe;

use crate::database::Pool;

/// The event the invoice service emits.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct InvoiceCreated {
    /// The invoice number, e.g. `INV-1001`; also the aggregate id.
    pub(super) number: String,
    /// Who is billed.
    pub(super) customer: String,
    /// The amount, in cents.
    pub(super) amount_cents: i64,
}

impl DomainEvent for InvoiceCreated {
    const EVENT_TYPE: &'static str = "InvoiceCreated";
    const AGGREGATE_TYPE: &'static str = "Invoice";

    fn aggregate_id(&self) -> Option<String> {
        Some(self.number.clone())
    }

    fn event_class() -> &'static str {
        "demo.InvoiceCreated"
    }
}

/// What became of one invoice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Written {
    /// Committed, with its event's id.
    Committed(i64),
    /// Rolled back after the invoice and its event were written.
    RolledBack,
}

/// Writes invoices and their events, in one transaction each.
pub(super) struct InvoiceService {
    pool: Pool,
    outbox: Outbox,
    /// `invoices`, qualified by the demo's schema on PostgreSQL.
    table: String,
}

/// The demo's connection step refuses MySQL before a service is made.
const NO_MYSQL: &str = "the demo runs on PostgreSQL or SQLite";

impl InvoiceService {
    /// A service writing to `pool`; on PostgreSQL its tables live in `schema`.
    pub(super) fn new(pool: Pool, schema: &SchemaName, outbox: Outbox) -> Self {
        let table = match pool {
            Pool::Postgres(_) => format!("{}.invoices", schema.quoted()),
            Pool::Sqlite(_) | Pool::MySql(_) => "invoices".to_owned(),
        };
        InvoiceService {
            pool,
            outbox,
            table,
        }
    }

    /// Creates the `invoices` table.
    pub(super) async fn create_table(&self) -> anyhow::Result<()> {
        // The only dynamic part is the schema, quoted by `SchemaName::quoted`.
        let sql = AssertSqlSafe(format!(
            "CREATE TABLE {} (
                 number       TEXT PRIMARY KEY,
                 customer     TEXT NOT NULL,
                 amount_cents BIGINT NOT NULL
             )",
            self.table
        ));
        match &self.pool {
            Pool::Postgres(p) => sqlx::query(sql).execute(p).await.map(drop),
            Pool::Sqlite(p) => sqlx::query(sql).execute(p).await.map(drop),
            Pool::MySql(_) => anyhow::bail!(NO_MYSQL),
        }
        .context("cannot create the invoices table")
    }

    /// Writes the invoice and its event in one transaction; commits it, or rolls it back when
    /// `reject` gives a reason (as a late business check would).
    pub(super) async fn create(
        &self,
        invoice: &InvoiceCreated,
        reject: Option<&str>,
    ) -> anyhow::Result<Written> {
        let event = Event::from_domain(invoice)?;
        let insert = AssertSqlSafe(format!(
            "INSERT INTO {} (number, customer, amount_cents) VALUES ($1, $2, $3)",
            self.table
        ));
        let enqueued = match &self.pool {
            Pool::Postgres(pool) => {
                let mut tx = pool.begin().await?;
                sqlx::query(insert)
                    .bind(&invoice.number)
                    .bind(&invoice.customer)
                    .bind(invoice.amount_cents)
                    .execute(&mut *tx)
                    .await?;
                let enqueued = self.outbox.enqueue(&mut tx, event).await?;
                if reject.is_some() {
                    tx.rollback().await?;
                } else {
                    tx.commit().await?;
                }
                enqueued
            }
            Pool::Sqlite(pool) => {
                let mut tx = pool.begin().await?;
                sqlx::query(insert)
                    .bind(&invoice.number)
                    .bind(&invoice.customer)
                    .bind(invoice.amount_cents)
                    .execute(&mut *tx)
                    .await?;
                let enqueued = self.outbox.enqueue(&mut tx, event).await?;
                if reject.is_some() {
                    tx.rollback().await?;
                } else {
                    tx.commit().await?;
                }
                enqueued
            }
            Pool::MySql(_) => anyhow::bail!(NO_MYSQL),
        };
        match (enqueued.id(), reject) {
            (_, Some(_)) => Ok(Written::RolledBack),
            (Some(id), None) => Ok(Written::Committed(id)),
            (None, None) => {
                anyhow::bail!("the event of invoice {} was a duplicate", invoice.number)
            }
        }
    }

    /// The numbers of the invoices that exist (were committed).
    pub(super) async fn committed_numbers(&self) -> anyhow::Result<Vec<String>> {
        let sql = AssertSqlSafe(format!("SELECT number FROM {} ORDER BY number", self.table));
        let numbers = match &self.pool {
            Pool::Postgres(p) => sqlx::query_scalar(sql).fetch_all(p).await?,
            Pool::Sqlite(p) => sqlx::query_scalar(sql).fetch_all(p).await?,
            Pool::MySql(_) => anyhow::bail!(NO_MYSQL),
        };
        Ok(numbers)
    }
}
