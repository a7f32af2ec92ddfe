//! `GET /api/status`: every outbox's counts, this process's relay, the sinks every relay
//! reported, the replication slots and the recent history (also what the page shows).

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use postbox::status::{SUMMARY_ABOVE, StatusReport, StatusSummary};
use postbox::store::StatusCounts;
use postbox::{Target, sink::SinkHealth, store::TenantStatus};
use serde::Serialize;

use super::ApiResult;
use crate::error::ApiError;
use crate::history::Point;
use crate::state::Shared;

/// `GET /api/status`.
#[derive(Serialize)]
pub(crate) struct Status {
    /// Every target's line; past 50 targets (without `?all=true`) only those the summary
    /// names: the largest and oldest backlogs, the most FAILED events.
    pub(crate) targets: Vec<TargetStatus>,
    /// Past 50 targets: the totals and the lists the targets above come from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) summary: Option<StatusSummary>,
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

/// `GET /api/status` takes `?all=true`: a line per target however many.
#[derive(serde::Deserialize, Default)]
pub(crate) struct StatusQuery {
    #[serde(default)]
    all: bool,
}

pub(crate) async fn status(
    State(shared): State<Arc<Shared>>,
    axum::extract::Query(q): axum::extract::Query<StatusQuery>,
) -> ApiResult<Status> {
    read_status(&shared, q.all).await.map(Json)
}

/// What `/api/status` and the page show: every target's counts (past 50 targets, unless `all`,
/// a summary and the targets it names), this process's relay, the sinks every relay reported,
/// and the recent history.
pub(crate) async fn read_status(shared: &Shared, all: bool) -> Result<Status, ApiError> {
    let targets = postbox::status::targets(&*shared.store, None).await?;
    if !all && targets.len() > SUMMARY_ABOVE {
        return read_summary(shared, &targets).await;
    }
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
    let reported_sinks = report.sinks;
    let replication_slots = report.replication_slots;
    Ok(Status {
        targets: out,
        summary: None,
        oldest_transaction_age_secs: report.oldest_transaction_age.map(|d| d.as_secs_f64()),
        relay: relay_status(shared),
        reported_sinks,
        replication_slots,
        history: history(shared),
    })
}

/// The status of many targets: a summary, and a line for each target it names.
async fn read_summary(shared: &Shared, targets: &[Target]) -> Result<Status, ApiError> {
    let summary = StatusSummary::read(&*shared.store, SUMMARY_TOP).await?;
    let by_schema: std::collections::HashMap<&str, &Target> =
        targets.iter().map(|t| (t.schema.as_str(), t)).collect();
    let mut seen = std::collections::HashSet::new();
    let lines = summary
        .busiest
        .iter()
        .chain(&summary.oldest)
        .chain(&summary.failing)
        .filter(|l| seen.insert(l.schema.clone()));
    let out = lines
        .map(|l| {
            let mut counts = StatusCounts::default();
            counts.pending = l.outstanding.pending;
            counts.processing = l.outstanding.processing;
            counts.failed = l.outstanding.failed;
            counts.oldest_pending_age = l.outstanding.oldest_pending_age;
            TargetStatus {
                target: by_schema.get(l.schema.as_str()).map(|t| (*t).clone()),
                tenant: l
                    .tenant
                    .clone()
                    .unwrap_or_else(|| postbox::status::DEFAULT_TENANT.to_owned()),
                schema: l.schema.clone(),
                tenant_status: None,
                counts: Some(counts),
                parked_aggregates: 0,
                inbox: Vec::new(),
                error: None,
            }
        })
        .collect();
    Ok(Status {
        targets: out,
        oldest_transaction_age_secs: summary.oldest_transaction_age.map(|d| d.as_secs_f64()),
        summary: Some(summary),
        relay: relay_status(shared),
        reported_sinks: shared.store.sinks_reported().await.unwrap_or_default(),
        replication_slots: shared.store.replication_slots().await.unwrap_or_default(),
        history: history(shared),
    })
}

/// Targets of each list of a summary the status shows.
const SUMMARY_TOP: usize = 10;

fn relay_status(shared: &Shared) -> Option<RelayStatus> {
    shared.relay.as_ref().map(|relay| {
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
    })
}

fn history(shared: &Shared) -> Vec<Point> {
    shared
        .history
        .lock()
        .map(|h| h.points())
        .unwrap_or_default()
}
