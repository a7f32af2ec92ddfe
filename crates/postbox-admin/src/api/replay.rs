//! `POST /api/replay`: events published again to the relay's sinks, marked as replays.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use tracing::info;

use super::events::ListQuery;
use super::{ApiResult, json_rejection, target};
use crate::error::ApiError;
use crate::state::Shared;

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
