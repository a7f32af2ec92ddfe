//! The library's integration tests, one binary: the relay's guarantees and its parts against
//! real databases (a fresh one per test), the store conformance suite on every store, the SQL API
//! from other languages. The tests of a store's feature are built with it: the library is also
//! tested with one store only (`cargo test -p postbox --no-default-features --features sqlite`).
//!
//! Everything here shares one process: a test that installs process-wide state (the metrics
//! recorder, a tracing subscriber) does it once and notes only what its own runtime does.

mod any;
#[cfg(feature = "postgres")]
mod by_id;
#[cfg(feature = "postgres")]
mod common;

#[cfg(feature = "postgres")]
mod enqueue_with;
#[cfg(feature = "postgres")]
mod faults;
#[cfg(feature = "postgres")]
mod floor;
#[cfg(feature = "postgres")]
mod guarantees;
#[cfg(feature = "postgres")]
mod handlers;
#[cfg(feature = "postgres")]
mod history;
mod idle;
mod interleave;
#[cfg(feature = "postgres")]
mod many_tenants;
#[cfg(feature = "postgres")]
mod metrics;
#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod ordering;
#[cfg(feature = "postgres")]
mod polyglot;
mod public_api;
mod relay_suite;
#[cfg(feature = "postgres")]
mod replay;
#[cfg(feature = "postgres")]
mod retention;
#[cfg(feature = "postgres")]
mod slow_lane;
mod smoke;
#[cfg(feature = "postgres")]
mod sql_api;
mod sql_tree;
mod store_conformance;
#[cfg(feature = "postgres")]
mod tenants;
#[cfg(all(feature = "otel", feature = "postgres"))]
mod trace;
mod upgrade;
