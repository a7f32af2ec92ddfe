#![doc = include_str!("../README.md")]

#[cfg(not(any(feature = "postgres", feature = "sqlite", feature = "mysql")))]
compile_error!(
    "Postbox needs a store: enable the `postgres`, the `sqlite` or the `mysql` feature (or several)"
);

pub mod backoff;
mod connect;
mod error;
mod event;
mod glob;
mod handlers;
pub mod inbox;
pub mod metrics;
mod migrate;
pub mod ops;
mod ordering;
mod outbox;
pub mod redact;
mod relay;
pub mod replay;
mod schema;
mod sink;
pub mod status;
pub mod store;
pub mod trace;

pub use backoff::Backoff;
pub use connect::{AnyStore, ConnectOptions, DatabaseKind, connect};
pub use error::{Error, Result};
pub use event::{
    DEFAULT_MAX_RETRIES, DomainEvent, Enqueued, Event, OutboxEvent, daily_idempotency_key,
};
pub use glob::{Glob, GlobError};
pub use handlers::{HandlerError, Handlers};
pub use inbox::{Inbox, Received};
pub use migrate::migrate;
pub use outbox::{
    DEFAULT_NOTIFY_INTERVAL, DEFAULT_PAYLOAD_LIMIT, Outbox, OutboxBuilder, OutboxConnection,
};
pub use relay::{
    EffectivePolicy, FailedNotice, Notice, Relay, RelayConfig, RelayHandle, RelayProgress,
    RelayStats, RetryPolicy, Rounds,
};
pub use schema::{SchemaName, Target, TenantId};
pub use sink::{PublishError, Sink, SinkHealth};
pub use store::stores::*;
pub use store::{Store, StoreExt, Tenant, TenantStatus};

#[doc(hidden)]
pub use async_trait::async_trait as __async_trait;
