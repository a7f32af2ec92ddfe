//! The admin server's integration tests, one binary: over a real relay on PostgreSQL (metrics,
//! probes, the API, alerts, the page in a browser), and its routes without a port over SQLite.
//!
//! The tests share one process, and so the one Prometheus recorder (`install_metrics`): a test
//! reads counters as at least what it caused.

mod admin;
mod router;
