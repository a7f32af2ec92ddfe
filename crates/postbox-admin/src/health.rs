//! `/healthz`, `/readyz` and `/metrics`: what an orchestrator and a scraper ask, no token.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::state::Shared;

/// How long a readiness check waits for the database.
const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// The process answers.
pub(crate) async fn healthz() -> &'static str {
    "ok\n"
}

/// Ready: the database answers and is migrated, a sink accepts events (when the relay has
/// sinks that track their destinations), and every check of the application's own passes
/// ([`crate::AdminBuilder::ready_check`]). Otherwise 503 with every reason, one per line.
pub(crate) async fn readyz(State(shared): State<Arc<Shared>>) -> Response {
    let reasons = not_ready(&shared).await;
    if reasons.is_empty() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        let body = format!("not ready:\n{}\n", reasons.join("\n"));
        (StatusCode::SERVICE_UNAVAILABLE, body).into_response()
    }
}

/// Why the relay is not ready; empty when it is.
pub(crate) async fn not_ready(shared: &Shared) -> Vec<String> {
    let mut reasons = Vec::new();
    let target = postbox::Target::default_schema(shared.store.default_schema());
    match tokio::time::timeout(READY_TIMEOUT, shared.store.status_counts(&target)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e @ postbox::Error::NotMigrated { .. })) => {
            reasons.push(format!("database not migrated: {e}"));
        }
        Ok(Err(e)) => reasons.push(format!("database unreachable: {e}")),
        Err(_) => reasons.push(format!(
            "database unreachable: no answer within {}",
            humantime::format_duration(READY_TIMEOUT)
        )),
    }
    if let Some(relay) = &shared.relay {
        let sinks = relay.sinks();
        if !sinks.is_empty() && !sinks.iter().any(|s| s.up) {
            for s in sinks {
                reasons.push(format!(
                    "sink {} down since {}: {}",
                    s.name,
                    s.since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                    s.last_error.as_deref().unwrap_or("no answer")
                ));
            }
        }
    }
    reasons.extend(shared.ready_checks.iter().filter_map(|check| check()));
    reasons
}

/// The Prometheus text exposition.
pub(crate) async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    match &shared.metrics {
        Some(handle) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            handle.render(),
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "metrics are not enabled\n").into_response(),
    }
}
