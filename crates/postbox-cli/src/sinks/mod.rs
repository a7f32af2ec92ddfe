//! Where the relay publishes: the binary's own sinks (stdout, null), the broker sinks of
//! `postbox-sinks`, and routes between them.
//!
//! [`plan`] reads the configuration into a [`SinkPlan`] (checked, nothing connected yet);
//! [`open`] connects it.

mod open;
mod plan;
mod spec;
mod stdout;

pub(crate) use open::open;
pub(crate) use plan::{SinkPlan, plan};
