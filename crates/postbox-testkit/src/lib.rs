//! Test helpers for Postbox, for its own tests and for services that embed it: a fresh
//! PostgreSQL or MySQL database or SQLite file per test, scripted sinks, a store that fails on demand, a
//! TCP proxy that takes a broker away, a builder of events, and waiting on conditions.
//!
//! Features: `postgres`, `sqlite`, `mysql` (on by default) for the test databases and the store
//! conformance suite; `sinks` for the sink conformance suite (`sink_suite`); `brokers` (with
//! `sinks`) for real consumers of NATS JetStream, RabbitMQ, Redis Streams and MQTT on 127.0.0.1
//! and a webhook endpoint of the test's own (`consumers`). The testkit is a dev-dependency:
//! none of it reaches a release build.

#[cfg(feature = "postgres")]
pub mod cluster;
#[cfg(feature = "brokers")]
pub mod consumers;
mod event;
mod faulty;
mod inbox;
pub mod ledger;
#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod pg;
pub mod producers;
pub mod proxy;
#[cfg(feature = "sinks")]
pub mod sink_suite;
mod sinks;
#[cfg(feature = "sqlite")]
mod sqlite;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub mod store_suite;
pub mod tansu;
mod wait;

pub use event::{TestEvent, event};
pub use faulty::{FaultyStore, StoreOp};
pub use inbox::handle_message;
#[cfg(feature = "mysql")]
pub use mysql::{TestMySql, mysql_admin_url};
#[cfg(feature = "postgres")]
pub use pg::{TestDb, admin_url};
pub use sinks::{Behaviour, RecordingSink};
#[cfg(feature = "sqlite")]
pub use sqlite::TestSqlite;
pub use wait::{Ready, relay_until, settled, wait_until};
