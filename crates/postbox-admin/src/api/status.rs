//! `GET /api/status`: every outbox's counts, this process's relay, the sinks every relay
//! reported, the replication slots and the recent history (also what the page shows).

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use postbox::status::StatusReport;
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
