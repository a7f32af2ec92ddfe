//! The sinks' integration tests, one binary: the sink conformance suite and each sink's own
//! cases against the loopback brokers, CloudEvents output read by the official SDK, per-aggregate
//! order through relays, a destination's outage, and a service that embeds relay and sink.

mod support;

mod cloudevents;
mod conformance;
#[cfg(all(feature = "nats", feature = "webhook"))]
mod embedded_service;
#[cfg(feature = "redis")]
mod ordering;
#[cfg(feature = "webhook")]
mod outage;
