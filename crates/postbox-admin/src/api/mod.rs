//! The JSON admin API, under `/api`, behind the token: status, events, tenants. Write routes
//! are audited in the log (target `postbox::audit`).
//!
//! The routes live by concern in `status`, `events`, `replay` and `tenants`; this file holds
//! what they share and the fallback for unknown paths.

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use postbox::Target;

use crate::error::ApiError;
use crate::state::Shared;

mod events;
mod replay;
mod status;
mod tenants;

pub(crate) use events::{
    list_events, retry_event, retry_events, retry_one, show_event, skip_event,
};
pub(crate) use replay::replay;
pub(crate) use status::{Status, read_status, status};
pub(crate) use tenants::{resume_tenant, suspend_tenant, tenants};

type ApiResult<T> = Result<Json<T>, ApiError>;

/// One target, for the routes about one tenant's events (the default outbox when none is
/// named).
async fn target(shared: &Shared, tenant: Option<&str>) -> Result<Target, ApiError> {
    Ok(postbox::status::target(&*shared.store, tenant).await?)
}

/// Every unknown path under the token.
pub(crate) async fn not_found() -> ApiError {
    ApiError::not_found("no such route; see the admin API in docs/operations.md")
}

/// A JSON body that could not be read: its status (400, 413, 415, 422→400) and axum's reason.
fn json_rejection(e: JsonRejection) -> ApiError {
    let status = match e.status() {
        StatusCode::UNPROCESSABLE_ENTITY => StatusCode::BAD_REQUEST,
        other => other,
    };
    ApiError::new(status, format!("request body: {}", e.body_text()))
}
