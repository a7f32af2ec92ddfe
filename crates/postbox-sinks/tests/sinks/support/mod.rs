//! The harness of each broker for the sink conformance suite (`postbox_testkit::sink_suite`):
//! the sink under test and a proxy in front of its broker, around a consumer of
//! `postbox_testkit::consumers` (Kafka's consumer is here, see `kafka.rs`).

#![allow(dead_code, reason = "each feature uses part of the support code")]

pub(crate) use postbox_testkit::proxy;
pub(crate) use postbox_testkit::sink_suite::*;

#[cfg(feature = "amqp")]
pub(crate) mod amqp;
#[cfg(feature = "kafka")]
pub(crate) mod kafka;
#[cfg(feature = "mqtt")]
pub(crate) mod mqtt;
#[cfg(feature = "nats")]
pub(crate) mod nats;
#[cfg(feature = "redis")]
pub(crate) mod redis;
#[cfg(feature = "webhook")]
pub(crate) mod webhook;
