//! Postbox's CDC relay: the outbox table's inserts read from a PostgreSQL logical replication
//! slot, in commit order, and read by primary key, published and marked (one write per event) —
//! beside the polling claim, which stays the safety net for everything the slot does not deliver.
//!
//! A [`CdcStore`] wraps a migrated [`postbox::PgStore`]; any [`postbox::Relay`] runs on it with
//! its sinks, routing, retries, ordering and metrics unchanged. See docs/cdc.md for when to
//! choose it over polling, the server settings it needs and how it fails.
//!
//! ```no_run
//! # async fn example() -> anyhow::Result<()> {
//! let url = "postgres://postgres@localhost/app";
//! let pg = postbox::PgStore::new(sqlx::PgPool::connect(url).await?);
//! postbox::migrate(&pg).await?;
//! let store = postbox_cdc::CdcStore::start(pg, url, postbox_cdc::CdcConfig::default()).await?;
//! println!("{:?}", store.status());
//! # Ok(()) }
//! ```

mod config;
mod error;
mod progress;
mod reads;
mod setup;
mod store;
mod stream;
mod tenants;

pub use config::CdcConfig;
pub use error::{Error, Result};
pub use store::{CdcStatus, CdcStore};
