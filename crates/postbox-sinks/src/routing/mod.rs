//! Several sinks at once: the [`Router`](crate::Router) that sends each event to every route
//! whose globs match it (`router`), and the `[sinks.NAME]` / `[[routes]]` / `[routing]` tables
//! that are checked and opened into one (`config`).

mod config;
mod router;

pub use config::{Opened, RouteConfig, Routes, RoutingConfig, SinkSetup};
#[allow(
    unused_imports,
    reason = "used by the broker sinks, each behind a feature of its own"
)]
pub(crate) use router::no_destination;
pub use router::{RoutableSink, Route, Router, Unmatched};
