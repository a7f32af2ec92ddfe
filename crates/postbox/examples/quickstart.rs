//! The README's library example, runnable: an invoice and its event in one transaction, then a
//! relay with a typed handler and an audit catch-all, drained.
//!
//! ```text
//! cargo run -p postbox --example quickstart
//! ```

use postbox::StoreExt;
use postbox::{Event, Relay, RelayConfig, SqliteStore, event::DomainEvent, handlers::Handlers};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct InvoiceCreated {
    invoice_id: i64,
    amount_cents: i64,
}

impl DomainEvent for InvoiceCreated {
    const EVENT_TYPE: &'static str = "InvoiceCreated";
    const AGGREGATE_TYPE: &'static str = "Invoice";
    fn aggregate_id(&self) -> Option<String> {
        Some(self.invoice_id.to_string())
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    // PostgreSQL works the same way: `PgStore::new(pool)` and a `PgPool` transaction.
    let store = SqliteStore::open(dir.path().join("app.db")).await?;
    postbox::migrate(&store).await?;
    let pool = store.pool().clone();
    sqlx::query("CREATE TABLE invoices (id INTEGER PRIMARY KEY, amount_cents INTEGER)")
        .execute(&pool)
        .await?;

    // Producer: the business row and its event commit together, or not at all.
    let outbox = store.outbox(); // writes to the table this store's relays read
    let mut tx = pool.begin().await?;
    sqlx::query("INSERT INTO invoices (id, amount_cents) VALUES (456, 1200)")
        .execute(&mut *tx)
        .await?;
    let event = Event::from_domain(&InvoiceCreated {
        invoice_id: 456,
        amount_cents: 1200,
    })?;
    println!("enqueued: {:?}", outbox.enqueue(&mut tx, event).await?);
    tx.commit().await?;

    // Relay: publishes committed events to in-process handlers, retrying failures.
    let handlers = Handlers::new()
        .on(|e: InvoiceCreated| async move {
            println!(
                "notify: invoice {} for {} cents",
                e.invoice_id, e.amount_cents
            );
            Ok::<_, std::io::Error>(())
        })
        .on_any(|e| async move {
            println!("audit: event {} {}", e.id, e.event_type);
            Ok::<_, std::io::Error>(())
        });
    let relay = Relay::new(store, handlers, RelayConfig::default())?;
    let stats = relay.drain(std::future::pending()).await?;
    println!("published {}", stats.published);
    Ok(())
}
