//! The operator's side of a Postbox relay, served on one HTTP port:
//!
//! - `GET /metrics`: Prometheus metrics (the relay's counters and histograms, and gauges of the
//!   backlog and the sinks refreshed every few seconds);
//! - `GET /healthz` (the process answers) and `GET /readyz` (the database is reachable and
//!   migrated, a sink is connected, the application's own checks pass; the reason in the body
//!   when not);
//! - `/api/…`: a JSON admin API behind a bearer token — status, events (list, show, retry),
//!   tenants (suspend, resume);
//! - `GET /`: a small page rendered on the server, behind a session the token opens: backlog,
//!   throughput and latency, sinks, the latest `FAILED` events with a retry button.
//!
//! [`alerts`] sends an operator a message (a Slack-compatible webhook, and a log line) when an
//! event goes `FAILED`, a sink stays down or the backlog grows old — a handful per outage,
//! not thousands.
//!
//! ```no_run
//! use std::sync::Arc;
//! use postbox_admin::{Admin, Token};
//!
//! # async fn example(relay: postbox::Relay, store: Arc<dyn postbox::Store>) -> Result<(), Box<dyn std::error::Error>> {
//! let metrics = postbox_admin::install_metrics()?;
//! let admin = Admin::builder(store)
//!     .relay(relay.clone())
//!     .metrics(metrics)
//!     .token(Token::new("s3cret-token")?)
//!     .bind("127.0.0.1:9187".parse()?)
//!     .await?;
//! println!("admin on http://{}", admin.local_addr());
//! let server = tokio::spawn(admin.serve(async { let _ = tokio::signal::ctrl_c().await; }));
//! relay.run(async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! server.await??;
//! # Ok(()) }
//! ```

pub mod alerts;
mod api;
mod auth;
mod error;
mod health;
mod history;
mod metrics;
mod monitor;
mod page;
mod server;
mod state;

pub use auth::Token;
pub use error::AdminError;
pub use metrics::{install_metrics, metric_names};
pub use server::{Admin, AdminBuilder, DEFAULT_REFRESH};
