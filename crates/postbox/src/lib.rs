#![doc = include_str!("../README.md")]

pub mod backoff;
mod enqueue;
mod error;
mod event;
mod handlers;
mod migrate;
pub mod redact;
mod relay;
mod schema;
mod sink;
pub mod store;

pub use backoff::Backoff;
pub use enqueue::{
    DEFAULT_NOTIFY_INTERVAL, DEFAULT_PAYLOAD_LIMIT, Outbox, OutboxBuilder, OutboxConnection,
};
pub use error::{Error, Result};
pub use event::{DomainEvent, Enqueued, Event, OutboxEvent, daily_idempotency_key};
pub use handlers::{HandlerError, Handlers};
pub use migrate::migrate;
pub use relay::{Relay, RelayConfig, RelayStats};
pub use schema::{SchemaName, Target, TenantId};
pub use sink::{PublishError, Sink};
#[cfg(feature = "postgres")]
pub use store::PgStore;
#[cfg(feature = "sqlite")]
pub use store::SqliteStore;
pub use store::{Store, Tenant, TenantStatus};
