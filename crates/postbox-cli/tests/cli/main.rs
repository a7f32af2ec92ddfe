//! End-to-end tests of the `postbox` binary against a fresh PostgreSQL database each (never
//! skipped: a test fails if PostgreSQL is down). The sink tests need the brokers on 127.0.0.1 too:
//! NATS with JetStream (4222), RabbitMQ (5672, guest/guest), Redis (6379), Mosquitto (1883), the
//! tansu Kafka-protocol broker (9092; tests that restart a broker start one of their own).

mod admin;
mod config;
mod demo;
mod events;
mod inbox;
mod mysql;
mod relay;
mod retention;
mod secrets;
mod sinks;
mod status;
mod support;
mod tenants;
