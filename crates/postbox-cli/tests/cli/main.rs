//! End-to-end tests of the `postbox` binary against a fresh PostgreSQL database each (never
//! skipped: a test fails if PostgreSQL is down).

mod config;
mod demo;
mod relay;
mod status;
mod support;
mod tenants;
