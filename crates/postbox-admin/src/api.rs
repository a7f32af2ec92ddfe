//! The JSON admin API, under `/api`, behind the token: status, events, tenants. Write routes
//! are audited in the log (target `postbox::audit`).

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use chrono::Utc;
use postbox::status::StatusReport;
use postbox::store::{
    EventFilter, FilterText, ListParams, Order, RetryFailedParams, StatusCounts, StoredEvent,
};
use postbox::{StoreExt, Target, schema::TenantId, sink::SinkHealth, store::TenantStatus};
use serde::{Deserialize, Serialize};
use tracing::info;

use crate::error::ApiError;
use crate::history::Point;
use crate::state::Shared;

/// Most events one list returns.
const MAX_LIMIT: u32 = 1000;

type ApiResult<T> = Result<Json<T>, ApiError>;

/// One target, for the routes about one tenant's events (the default outbox when none is
/// named).
async fn target(shared: &Shared, tenant: Option<&str>) -> Result<Target, ApiError> {
    Ok(postbox::status::target(&*shared.store, tenant).await?)
}

/// `GET /api/status`.
#[derive(Serialize)]
pub(crate) struct Status {
    pub(crate) targets: Vec<TargetStatus>,
    /// Age in seconds of the database's oldest open transaction that holds a snapshot
    /// (PostgreSQL): a long one keeps vacuum from removing dead rows.
    pub(crate) oldest_transaction_age_secs: Option<f64>,
    pub(crate) relay: Option<RelayStatus>,
    /// What every relay last reported of its sinks (from the database).
    pub(crate) reported_sinks: Vec<postbox::store::ReportedSink>,
    /// The database's logical replication slots (PostgreSQL), a CDC relay's, with the WAL each
    /// holds back.
    pub(crate) replication_slots: Vec<postbox::store::ReplicationSlot>,
    pub(crate) history: Vec<Point>,
}

/// One outbox's line: the library's [`postbox::status::TargetReport`], as the CLI's `status`
/// prints it.
#[derive(Serialize)]
pub(crate) struct TargetStatus {
    /// The target itself, for the page's reads of its events; `None` for a tenant the registry
    /// holds but that is not served.
    #[serde(skip)]
    pub(crate) target: Option<Target>,
    pub(crate) tenant: String,
    pub(crate) schema: String,
    /// `ACTIVE` or `SUSPENDED` for a tenant; `null` for the default outbox.
    pub(crate) tenant_status: Option<TenantStatus>,
    #[serde(flatten)]
    pub(crate) counts: Option<StatusCounts>,
    /// Ordered aggregates parked by a FAILED event (up to 1,000 heads read).
    pub(crate) parked_aggregates: i64,
    /// The consumers of its inbox: messages recorded in the dedup window, repeats skipped.
    pub(crate) inbox: Vec<postbox::inbox::InboxStats>,
    /// Why the counts could not be read, or why the tenant is not served.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
}

#[derive(Serialize)]
pub(crate) struct RelayStatus {
    pub(crate) id: String,
    pub(crate) published: u64,
    pub(crate) failed_tries: u64,
    pub(crate) gave_up: u64,
    pub(crate) recovered: u64,
    pub(crate) fenced: u64,
    pub(crate) deferred: u64,
    pub(crate) sinks: Vec<SinkHealth>,
}

pub(crate) async fn status(State(shared): State<Arc<Shared>>) -> ApiResult<Status> {
    read_status(&shared).await.map(Json)
}

/// What `/api/status` and the page show: every target's counts, this process's relay, the
/// sinks every relay reported, and the recent history.
pub(crate) async fn read_status(shared: &Shared) -> Result<Status, ApiError> {
    let report = StatusReport::read(&*shared.store).await?;
    let out = report
        .targets
        .into_iter()
        .map(|t| TargetStatus {
            tenant: t
                .tenant
                .unwrap_or_else(|| postbox::status::DEFAULT_TENANT.to_owned()),
            schema: t.schema,
            tenant_status: t.tenant_status,
            counts: t.counts,
            parked_aggregates: t.parked_aggregates,
            inbox: t.inbox,
            error: t.error,
            target: t.target,
        })
        .collect();
    let relay = shared.relay.as_ref().map(|relay| {
        let stats = relay.stats();
        RelayStatus {
            id: relay.id().to_owned(),
            published: stats.published,
            failed_tries: stats.failed_tries,
            gave_up: stats.gave_up,
            recovered: stats.recovered,
            fenced: stats.fenced,
            deferred: stats.deferred,
            sinks: relay.sinks(),
        }
    });
    let reported_sinks = report.sinks;
    let replication_slots = report.replication_slots;
    let history = shared
        .history
        .lock()
        .map(|h| h.points())
        .unwrap_or_default();
    Ok(Status {
        targets: out,
        oldest_transaction_age_secs: report.oldest_transaction_age.map(|d| d.as_secs_f64()),
        relay,
        reported_sinks,
        replication_slots,
        history,
    })
}

/// The query of `GET /api/events`: the filters of `postbox events list`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListQuery {
    tenant: Option<String>,
    /// Comma-separated statuses.
    status: Option<String>,
    #[serde(rename = "type")]
    event_type: Option<String>,
    aggregate_type: Option<String>,
    aggregate_id: Option<String>,
    since: Option<String>,
    until: Option<String>,
    #[serde(default)]
    archive: bool,
    /// Only the heads of parked ordered aggregates.
    #[serde(default)]
    parked: bool,
    /// `newest` (default) or `oldest`.
    order: Option<String>,
    /// Ids past this one, in the order asked for (the next page).
    after: Option<i64>,
    limit: Option<u32>,
}

impl ListQuery {
    fn filter(&self) -> Result<EventFilter, ApiError> {
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

/// Most events one replay through the API publishes; larger replays belong to `postbox
/// replay`, which pages, paces and shows progress from a terminal.
const MAX_REPLAY: u64 = 10_000;

/// The body of `POST /api/replay`: the filters of `GET /api/events` (statuses `PROCESSED`
/// and/or `FAILED`, both by default), or `ids`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReplayBody {
    tenant: Option<String>,
    #[serde(default)]
    ids: Vec<i64>,
    status: Option<String>,
    #[serde(rename = "type")]
    event_type: Option<String>,
    aggregate_type: Option<String>,
    aggregate_id: Option<String>,
    since: Option<String>,
    until: Option<String>,
    #[serde(default)]
    archive: bool,
    /// Count and sample only.
    #[serde(default)]
    dry_run: bool,
    /// Keep the original dedup id (consumers that drop repeats drop the replay).
    #[serde(default)]
    keep_dedup_id: bool,
    /// The id of an earlier replay to run again without new duplicates.
    replay_id: Option<String>,
    /// Events per second at most.
    rate: Option<f64>,
}

/// What a replay did, or would do.
#[derive(Serialize)]
pub(crate) struct Replayed {
    replay_id: String,
    matched: u64,
    /// The first events it takes (a dry run).
    sample: Vec<i64>,
    published: u64,
    failed: Vec<(i64, String)>,
}

/// `POST /api/replay`: events published again to the relay's sinks, marked as replays.
pub(crate) async fn replay(
    State(shared): State<Arc<Shared>>,
    body: Result<Json<ReplayBody>, JsonRejection>,
) -> ApiResult<Replayed> {
    use postbox::replay::{Replay, ReplayDedup, ReplayOptions};
    let Json(body) = body.map_err(json_rejection)?;
    let Some(relay) = &shared.relay else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "replay publishes to the relay's sinks, and this server has no relay",
        ));
    };
    if body.rate.is_some_and(|r| !(r > 0.0 && r.is_finite())) {
        return Err(ApiError::bad_request(
            "\"rate\" must be above zero (events per second)",
        ));
    }
    let mut filter = ListQuery {
        status: body.status.clone(),
        event_type: body.event_type.clone(),
        aggregate_type: body.aggregate_type.clone(),
        aggregate_id: body.aggregate_id.clone(),
        since: body.since.clone(),
        until: body.until.clone(),
        archive: body.archive,
        ..ListQuery::default()
    }
    .filter()?;
    filter.ids = body.ids.clone();
    let filter = Replay::filter(&filter)?;
    let target = target(&shared, body.tenant.as_deref()).await?;
    let mut options = ReplayOptions::default().rate_limit(body.rate);
    if let Some(id) = &body.replay_id {
        options = options.replay_id(id.clone());
    }
    if body.keep_dedup_id {
        options = options.dedup(ReplayDedup::Original);
    }
    let replay_id = options.replay_id.clone();
    let replay = Replay::new(Arc::clone(&shared.store), relay.sink(), options);
    let (matched, sample) = replay.preview(&target, &filter, 10).await?;
    let sample = sample.iter().map(|e| e.id).collect();
    if body.dry_run {
        return Ok(Json(Replayed {
            replay_id,
            matched,
            sample,
            published: 0,
            failed: Vec::new(),
        }));
    }
    if matched > MAX_REPLAY {
        return Err(ApiError::bad_request(format!(
            "the filter selects {matched} events; the API replays at most {MAX_REPLAY} at once: \
             narrow it, or run `postbox replay`"
        )));
    }
    info!(target: "postbox::audit", action = "replay", tenant = target.label(), replay_id, matched,
        "admin API: replay started");
    let report = replay.run(&target, &filter, |_| {}).await?;
    info!(target: "postbox::audit", action = "replay", tenant = target.label(), replay_id,
        published = report.published, failed = report.failed.len(), "admin API: replay done");
    Ok(Json(Replayed {
        replay_id,
        matched,
        sample,
        published: report.published,
        failed: report.failed,
    }))
}

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
