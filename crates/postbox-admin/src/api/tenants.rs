//! The tenants routes: list (`GET /api/tenants`), suspend and resume.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use chrono::Utc;
use postbox::{schema::TenantId, store::TenantStatus};
use serde::Serialize;
use tracing::info;

use super::ApiResult;
use crate::error::ApiError;
use crate::state::Shared;

/// A tenant, as listed.
#[derive(Serialize)]
pub(crate) struct TenantView {
    id: String,
    schema: String,
    status: TenantStatus,
    created_at: chrono::DateTime<Utc>,
}

impl From<postbox::store::Tenant> for TenantView {
    fn from(t: postbox::store::Tenant) -> Self {
        TenantView {
            id: t.id.as_str().to_owned(),
            schema: t.schema.as_str().to_owned(),
            status: t.status,
            created_at: t.created_at,
        }
    }
}

/// `GET /api/tenants`.
pub(crate) async fn tenants(State(shared): State<Arc<Shared>>) -> ApiResult<Vec<TenantView>> {
    let tenants = shared.store.tenant_list().await?;
    Ok(Json(tenants.into_iter().map(TenantView::from).collect()))
}

/// `POST /api/tenants/{id}/suspend`.
pub(crate) async fn suspend_tenant(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
) -> ApiResult<TenantView> {
    set_tenant(&shared, &id, TenantStatus::Suspended).await
}

/// `POST /api/tenants/{id}/resume`.
pub(crate) async fn resume_tenant(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
) -> ApiResult<TenantView> {
    set_tenant(&shared, &id, TenantStatus::Active).await
}

async fn set_tenant(shared: &Shared, id: &str, status: TenantStatus) -> ApiResult<TenantView> {
    let id: TenantId = id
        .parse()
        .map_err(|e: postbox::Error| ApiError::bad_request(format!("tenant id: {e}")))?;
    let tenant = shared.store.tenant_set_status(&id, status).await?;
    info!(target: "postbox::audit", action = "tenant_status", tenant = id.as_str(), status = ?status, "admin API: tenant status set");
    Ok(Json(tenant.into()))
}
