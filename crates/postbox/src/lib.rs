#![doc = include_str!("../README.md")]

#[cfg(not(any(feature = "postgres", feature = "sqlite", feature = "mysql")))]
compile_error!(
    "Postbox needs a store: enable the `postgres`, the `sqlite` or the `mysql` feature (or several)"
);

pub mod backoff;
pub mod connect;
mod error;
pub mod event;
pub mod glob;
pub mod handlers;
pub mod inbox;
pub mod metrics;
mod migrate;
pub mod ops;
mod ordering;
pub mod outbox;
pub mod redact;
pub mod relay;
pub mod replay;
pub mod schema;
pub mod sink;
pub mod status;
pub mod store;
pub mod trace;

// The crate root holds what a service needs to enqueue events and run a relay; everything else
// is reached through its module (`postbox::store::…`, `postbox::relay::…`, `postbox::ops::…`).
pub use connect::{AnyStore, ConnectOptions, connect};
pub use error::{Error, Result};
pub use event::{Event, OutboxEvent};
pub use migrate::migrate;
pub use outbox::Outbox;
pub use relay::{Relay, RelayConfig, RelayHandle};
pub use schema::{SchemaName, Target};
pub use sink::{PublishError, Sink};
pub use store::stores::*;
pub use store::{Store, StoreExt};

#[doc(hidden)]
pub use async_trait::async_trait as __async_trait;
