//! The events routes: list (`GET /api/events`), show one, and retry or skip one or many.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use chrono::Utc;
use postbox::StoreExt;
use postbox::store::{EventFilter, FilterText, ListParams, Order, RetryFailedParams, StoredEvent};
use serde::{Deserialize, Serialize};
use tracing::info;

use super::{ApiResult, json_rejection, target};
use crate::error::ApiError;
use crate::state::Shared;

/// Most events one list returns.
const MAX_LIMIT: u32 = 1000;

/// The query of `GET /api/events`: the filters of `postbox events list`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListQuery {
    pub(super) tenant: Option<String>,
    /// Comma-separated statuses.
    pub(super) status: Option<String>,
    #[serde(rename = "type")]
    pub(super) event_type: Option<String>,
    pub(super) aggregate_type: Option<String>,
    pub(super) aggregate_id: Option<String>,
    pub(super) since: Option<String>,
    pub(super) until: Option<String>,
    #[serde(default)]
    pub(super) archive: bool,
    /// Only the heads of parked ordered aggregates.
    #[serde(default)]
    pub(super) parked: bool,
    /// `newest` (default) or `oldest`.
    pub(super) order: Option<String>,
    /// Ids past this one, in the order asked for (the next page).
    pub(super) after: Option<i64>,
    pub(super) limit: Option<u32>,
}

impl ListQuery {
    pub(super) fn filter(&self) -> Result<EventFilter, ApiError> {
        let mut text = FilterText::default();
        text.statuses = self.status.iter().map(String::as_str).collect();
        text.event_type = self.event_type.as_deref();
        text.aggregate_type = self.aggregate_type.as_deref();
        text.aggregate_id = self.aggregate_id.as_deref();
        text.since = self.since.as_deref();
        text.until = self.until.as_deref();
        text.archive = self.archive;
        let mut filter = EventFilter::parse(&text, Utc::now())?;
        filter.parked = self.parked;
        Ok(filter)
    }

    fn order(&self) -> Result<Order, ApiError> {
        match self.order.as_deref() {
            None | Some("newest") => Ok(Order::NewestFirst),
            Some("oldest") => Ok(Order::OldestFirst),
            Some(other) => Err(ApiError::bad_request(format!(
                "parameter order: {other:?} is not an order; use newest or oldest"
            ))),
        }
    }

    fn limit(&self) -> Result<u32, ApiError> {
        match self.limit {
            None => Ok(50),
            Some(n @ 1..=MAX_LIMIT) => Ok(n),
            Some(n) => Err(ApiError::bad_request(format!(
                "parameter limit: {n} is out of range; use 1 to {MAX_LIMIT}"
            ))),
        }
    }
}

/// A page of events.
#[derive(Serialize)]
pub(crate) struct EventPage {
    events: Vec<StoredEvent>,
    /// The `after` of the next page; `None` on the last.
    next_after: Option<i64>,
}

/// `GET /api/events`.
pub(crate) async fn list_events(
    State(shared): State<Arc<Shared>>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> ApiResult<EventPage> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let filter = query.filter()?;
    let limit = query.limit()?;
    let target = target(&shared, query.tenant.as_deref()).await?;
    let events = shared
        .store
        .events_list(&ListParams {
            target: &target,
            filter: &filter,
            order: query.order()?,
            after: query.after,
            limit,
        })
        .await?;
    let next_after = (events.len() == limit as usize)
        .then(|| events.last().map(|e| e.id))
        .flatten();
    Ok(Json(EventPage { events, next_after }))
}

/// The query of the routes about one event.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TenantQuery {
    tenant: Option<String>,
}

/// An event id from the path, refused with a clear message when it is not one.
fn event_id(id: &str) -> Result<i64, ApiError> {
    id.parse::<i64>().ok().filter(|id| *id > 0).ok_or_else(|| {
        ApiError::bad_request(format!("{id:?} is not an event id (a positive integer)"))
    })
}

/// `GET /api/events/{id}`.
pub(crate) async fn show_event(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    query: Result<Query<TenantQuery>, QueryRejection>,
) -> ApiResult<StoredEvent> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let id = event_id(&id)?;
    let target = target(&shared, query.tenant.as_deref()).await?;
    shared
        .store
        .event_get(&target, id)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("no event {id} in tenant {}", target.label())))
}

/// What a retry did.
#[derive(Serialize)]
pub(crate) struct Retried {
    retried: u64,
}

/// `POST /api/events/{id}/retry`: one `FAILED` event back to the queue.
pub(crate) async fn retry_event(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    query: Result<Query<TenantQuery>, QueryRejection>,
) -> ApiResult<Retried> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let id = event_id(&id)?;
    let retried = retry_one(&shared, query.tenant.as_deref(), id, "admin API").await?;
    Ok(Json(Retried { retried }))
}

/// Puts one `FAILED` event back in the queue, audited as done through `via`.
pub(crate) async fn retry_one(
    shared: &Shared,
    tenant: Option<&str>,
    id: i64,
    via: &str,
) -> Result<u64, ApiError> {
    let target = target(shared, tenant).await?;
    let Some(event) = shared.store.event_get(&target, id).await? else {
        return Err(ApiError::not_found(format!(
            "no event {id} in tenant {}",
            target.label()
        )));
    };
    if event.status != "FAILED" {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "event {id} is {}, not FAILED: only FAILED events are retried",
                event.status
            ),
        ));
    }
    let retried = shared
        .store
        .events_retry_failed(&RetryFailedParams {
            target: &target,
            ids: Some(&[id]),
        })
        .await?;
    info!(target: "postbox::audit", action = "retry", tenant = target.label(), event_id = id, retried, "{via}: event retried");
    Ok(retried)
}

/// The answer of a skip.
#[derive(Serialize)]
pub(crate) struct Skipped {
    skipped: Vec<i64>,
}

/// `POST /api/events/{id}/skip`: the held-back head of an ordered aggregate goes FAILED,
/// marked skipped, and the rest of its aggregate flows (`postbox events skip`).
pub(crate) async fn skip_event(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    query: Result<Query<TenantQuery>, QueryRejection>,
) -> ApiResult<Skipped> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let id = event_id(&id)?;
    let target = target(&shared, query.tenant.as_deref()).await?;
    let Some(event) = shared.store.event_get(&target, id).await? else {
        return Err(ApiError::not_found(format!(
            "no event {id} in tenant {}",
            target.label()
        )));
    };
    let skipped = shared.store.events_skip(&target, &[id]).await?;
    if skipped.is_empty() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "event {id} is {} (or already skipped): only PENDING and FAILED events are skipped",
                event.status
            ),
        ));
    }
    info!(target: "postbox::audit", action = "skip", tenant = target.label(), event_id = id, "admin API: event skipped");
    Ok(Json(Skipped { skipped }))
}

/// The body of `POST /api/events/retry`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RetryBody {
    tenant: Option<String>,
    /// These `FAILED` events; or
    ids: Option<Vec<i64>>,
    /// every `FAILED` event of the tenant (must be `true`, to be asked for on purpose).
    #[serde(default)]
    all: bool,
}

/// Most ids one retry request names.
const MAX_IDS: usize = 10_000;

/// `POST /api/events/retry`.
pub(crate) async fn retry_events(
    State(shared): State<Arc<Shared>>,
    body: Result<Json<RetryBody>, JsonRejection>,
) -> ApiResult<Retried> {
    let Json(body) = body.map_err(json_rejection)?;
    let ids = match (&body.ids, body.all) {
        (Some(_), true) | (None, false) => {
            return Err(ApiError::bad_request(
                "give either \"ids\": [...] or \"all\": true",
            ));
        }
        (Some(ids), false) if ids.is_empty() || ids.len() > MAX_IDS => {
            return Err(ApiError::bad_request(format!(
                "\"ids\" holds {} ids; give 1 to {MAX_IDS}",
                ids.len()
            )));
        }
        (Some(ids), false) => Some(ids.as_slice()),
        (None, true) => None,
    };
    let target = target(&shared, body.tenant.as_deref()).await?;
    let retried = shared
        .store
        .events_retry_failed(&RetryFailedParams {
            target: &target,
            ids,
        })
        .await?;
    info!(target: "postbox::audit", action = "retry", tenant = target.label(),
        ids = ?ids.map(<[i64]>::len), all = body.all, retried, "admin API: FAILED events retried");
    Ok(Json(Retried { retried }))
}
