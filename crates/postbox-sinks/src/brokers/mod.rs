//! The broker sinks, one file each and each behind the cargo feature of its name: NATS
//! JetStream, RabbitMQ (AMQP 0-9-1), Kafka, Redis Streams, MQTT 5 and HTTP webhooks. The crate
//! root re-exports each module (`postbox_sinks::nats`, …) and its sink and configuration.

#[cfg(feature = "amqp")]
pub mod amqp;
#[cfg(feature = "kafka")]
pub mod kafka;
#[cfg(feature = "mqtt")]
pub mod mqtt;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "redis")]
pub mod redis_streams;
#[cfg(feature = "webhook")]
pub mod webhook;
