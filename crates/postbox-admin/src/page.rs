//! The page at `/`: HTML rendered on the server from the relay's live state (templates under
//! `templates/`, every value escaped by askama), and a few lines of JavaScript that reload it
//! every few seconds.
//!
//! A visitor who is not signed in gets the sign-in form and no data. Signing in with the admin
//! token sets a session cookie (`HttpOnly`, `SameSite=Strict`) holding a digest of the token
//! under another label: it opens the page, and is not the API's bearer token. The page's one
//! write, Retry, is a form that needs the cookie and a request from the page's own origin.

use std::sync::Arc;
use std::time::Duration;

use askama::Template;
use axum::Form;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use postbox::store::TenantStatus;
use postbox::store::{EventFilter, ListParams, Order};
use serde::Deserialize;

use crate::api::{self, Status};
use crate::error::ApiError;
use crate::state::Shared;

const SCRIPT: &str = include_str!("../assets/app.js");

/// The session cookie's name.
const COOKIE: &str = "postbox_admin";

/// How long a sign-in lasts.
const SESSION_SECONDS: u64 = 12 * 3600;

/// FAILED events listed per tenant.
const FAILED_PER_TENANT: u32 = 20;

/// Only this origin's script, forms posted to this origin, no framing: event data shown on the
/// page cannot run as code.
const CSP: &str = "default-src 'none'; script-src 'self'; form-action 'self'; style-src 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'";

#[derive(Template)]
#[template(path = "login.html")]
struct LoginPage<'a> {
    /// Why the visitor sees the form again, if there is a reason.
    message: Option<&'a str>,
}

#[derive(Template)]
#[template(path = "page.html")]
struct Dashboard {
    relay: String,
    updated: String,
    /// With many targets: the totals line above the targets the summary names.
    summary: Option<String>,
    targets: Vec<TargetRow>,
    sinks: Vec<SinkRow>,
    /// The database's logical replication slots (a CDC relay's); the section is left out
    /// without any.
    slots: Vec<SlotRow>,
    rates: Option<String>,
    bars: Vec<Bar>,
    failed: Vec<FailedRow>,
    notice: Option<String>,
}

struct TargetRow {
    tenant: String,
    pending: i64,
    processing: i64,
    failed: i64,
    oldest: String,
    /// Parked aggregates, a suspended tenant, or why the counts could not be read.
    note: String,
}

struct SlotRow {
    name: String,
    active: bool,
    /// How far its confirmed position trails the server, for people.
    lag: String,
    /// The WAL the server keeps for it (from `restart_lsn`), for people.
    kept: String,
    /// The open transaction that holds its WAL, if one does.
    pinned_by: String,
    wal_status: String,
    /// Not read, or its WAL about to be dropped (`unreserved`, `lost`).
    alarm: bool,
}

struct SinkRow {
    name: String,
    up: bool,
    since: String,
    last_error: String,
}

/// One bar of the throughput chart (SVG user units).
struct Bar {
    x: String,
    y: String,
    width: String,
    height: String,
    colour: &'static str,
    title: String,
}

struct FailedRow {
    id: i64,
    tenant: String,
    event_type: String,
    aggregate: String,
    tries: i32,
    last_error: String,
    updated: String,
}

/// `GET /`: the dashboard when signed in, else the sign-in form.
pub(crate) async fn index(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if !signed_in(&shared, &headers) {
        return html(StatusCode::OK, &LoginPage { message: None });
    }
    dashboard(&shared, None).await
}

#[derive(Deserialize)]
pub(crate) struct SignIn {
    token: String,
}

/// `POST /login`: the token from the form; right → the session cookie and the dashboard.
pub(crate) async fn login(
    State(shared): State<Arc<Shared>>,
    form: Result<Form<SignIn>, axum::extract::rejection::FormRejection>,
) -> Response {
    let signed =
        |token: &&crate::Token| matches!(&form, Ok(Form(f)) if token.matches(f.token.trim()));
    let Some(token) = shared.token.as_ref().filter(signed) else {
        let message = if shared.token.is_none() {
            "No admin token is configured for this relay: the page cannot be opened."
        } else {
            "The token was refused."
        };
        return html(
            StatusCode::UNAUTHORIZED,
            &LoginPage {
                message: Some(message),
            },
        );
    };
    let cookie = format!(
        "{COOKIE}={}; Path=/; HttpOnly; SameSite=Strict; Max-Age={SESSION_SECONDS}",
        token.session_value()
    );
    see_other(cookie)
}

/// `POST /logout`: forgets the session.
pub(crate) async fn logout() -> Response {
    see_other(format!(
        "{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"
    ))
}

#[derive(Deserialize)]
pub(crate) struct RetryForm {
    tenant: String,
    id: i64,
}

/// `POST /retry`: the Retry button of a FAILED event; answers with the dashboard and what the
/// retry did.
pub(crate) async fn retry(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    form: Result<Form<RetryForm>, axum::extract::rejection::FormRejection>,
) -> Response {
    if !signed_in(&shared, &headers) {
        let message = Some("Sign in again: the session has ended.");
        return html(StatusCode::UNAUTHORIZED, &LoginPage { message });
    }
    if !same_origin(&headers) {
        return (
            StatusCode::FORBIDDEN,
            "a form from another site cannot act on this relay",
        )
            .into_response();
    }
    let Ok(Form(form)) = form else {
        return dashboard(&shared, Some("The retry form was incomplete.".to_owned())).await;
    };
    let notice = match api::retry_one(&shared, Some(&form.tenant), form.id, "admin page").await {
        Ok(_) => format!("Event {} is back in the queue.", form.id),
        Err(e) => format!("Retry of event {} failed: {}", form.id, e.message()),
    };
    dashboard(&shared, Some(notice)).await
}

/// `GET /app.js`: the page's reload loop.
pub(crate) async fn script() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        SCRIPT,
    )
}

async fn dashboard(shared: &Shared, notice: Option<String>) -> Response {
    match build(shared, notice).await {
        Ok(page) => html(StatusCode::OK, &page),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the relay's state cannot be read: {}", e.message()),
        )
            .into_response(),
    }
}

async fn build(shared: &Shared, notice: Option<String>) -> Result<Dashboard, ApiError> {
    let status = api::read_status(shared, false).await?;
    let failed = failed_rows(shared, &status).await?;
    Ok(Dashboard {
        relay: status.relay.as_ref().map_or_else(
            || "no relay in this process".to_owned(),
            |r| {
                format!(
                    "relay {}: {} published, {} failed tries, {} FAILED",
                    r.id, r.published, r.failed_tries, r.gave_up
                )
            },
        ),
        updated: chrono::Utc::now().format("%H:%M:%S UTC").to_string(),
        summary: status.summary.as_ref().map(|s| {
            format!(
                "{} outboxes ({} suspended): {} pending, {} processing, {} FAILED; {} with a \
                 backlog, {} with FAILED events. Below: the largest and oldest backlogs and the \
                 most FAILED events.",
                s.targets,
                s.suspended,
                s.totals.pending,
                s.totals.processing,
                s.totals.failed,
                s.with_backlog,
                s.with_failed
            )
        }),
        targets: status
            .targets
            .iter()
            .map(|t| {
                let counts = t.counts.clone().unwrap_or_default();
                let mut note = Vec::new();
                if t.parked_aggregates > 0 {
                    note.push(format!("{} parked aggregate(s)", t.parked_aggregates));
                }
                for i in &t.inbox {
                    note.push(format!(
                        "inbox {}: {}{} handled, {} duplicate(s) skipped",
                        i.consumer,
                        if i.messages_exact() { "" } else { "≥" },
                        i.messages,
                        i.duplicates
                    ));
                }
                if let Some(status) = t.tenant_status.filter(|s| *s != TenantStatus::Active) {
                    note.push(status.to_string());
                }
                if let Some(error) = &t.error {
                    note.push(error.clone());
                }
                TargetRow {
                    tenant: t.tenant.clone(),
                    pending: counts.pending,
                    processing: counts.processing,
                    failed: counts.failed,
                    oldest: counts.oldest_pending_age.map_or_else(|| "—".into(), age),
                    note: note.join("; "),
                }
            })
            .collect(),
        sinks: sink_rows(&status),
        slots: status
            .replication_slots
            .iter()
            .map(|s| SlotRow {
                name: s.name.clone(),
                active: s.active,
                lag: s.lag_bytes.map_or_else(
                    || "—".into(),
                    |b| format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0)),
                ),
                kept: s.kept_bytes.map_or_else(
                    || "—".into(),
                    |b| format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0)),
                ),
                pinned_by: s.pinned_by.as_ref().map_or_else(String::new, |p| {
                    format!(
                        "pid {} ({}, open {})",
                        p.pid,
                        p.state.as_deref().unwrap_or("-"),
                        age(Duration::from_secs_f64(p.age_secs.max(0.0)))
                    )
                }),
                wal_status: s.wal_status.clone().unwrap_or_else(|| "—".into()),
                alarm: !s.active || matches!(s.wal_status.as_deref(), Some("unreserved" | "lost")),
            })
            .collect(),
        rates: status.history.last().map(|last| {
            let rate = last.published as f64 / last.seconds.max(0.001);
            let latency = last
                .mean_latency
                .map_or_else(|| "—".into(), |s| age(Duration::from_secs_f64(s)));
            format!(
                "now: {rate:.1} events/s, mean latency {latency}, backlog {}",
                last.backlog
            )
        }),
        bars: bars(&status),
        failed,
        notice,
    })
}

fn sink_rows(status: &Status) -> Vec<SinkRow> {
    let list: Vec<&postbox::sink::SinkHealth> = match &status.relay {
        Some(relay) => relay.sinks.iter().collect(),
        None => status.reported_sinks.iter().map(|s| &s.health).collect(),
    };
    list.into_iter()
        .map(|s| SinkRow {
            name: s.name.clone(),
            up: s.up,
            since: s.since.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
            last_error: s.last_error.clone().unwrap_or_default(),
        })
        .collect()
}

/// One bar per point of the last 15 minutes (5 s each), the newest at the right; red where
/// events went FAILED.
fn bars(status: &Status) -> Vec<Bar> {
    let points = &status.history;
    let rates: Vec<f64> = points
        .iter()
        .map(|p| p.published as f64 / p.seconds.max(0.001))
        .collect();
    let max = rates.iter().copied().fold(1.0, f64::max);
    let slots = points.len().max(180);
    let width = 600.0 / slots as f64;
    let offset = slots - points.len();
    points
        .iter()
        .zip(&rates)
        .enumerate()
        .map(|(i, (p, rate))| {
            let height = rate / max * 86.0;
            let latency = p
                .mean_latency
                .map(|s| format!(", mean latency {}", age(Duration::from_secs_f64(s))))
                .unwrap_or_default();
            Bar {
                x: format!("{:.2}", (offset + i) as f64 * width),
                y: format!("{:.2}", 88.0 - height),
                width: format!("{:.2}", (width - 1.0).max(1.0)),
                height: format!("{height:.2}"),
                colour: if p.gave_up > 0 { "#b3261e" } else { "#3b6fd8" },
                title: format!("{rate:.1} events/s{latency}"),
            }
        })
        .collect()
}

/// The latest FAILED events of every target that has some.
async fn failed_rows(shared: &Shared, status: &Status) -> Result<Vec<FailedRow>, ApiError> {
    let mut rows = Vec::new();
    let with_failed = status.targets.iter().filter_map(|t| {
        let target = t.target.as_ref()?;
        (t.counts.as_ref()?.failed > 0).then_some((t, target))
    });
    for (t, target) in with_failed {
        let mut filter = EventFilter::default();
        filter.statuses = vec![postbox::store::EventStatus::Failed];
        let events = shared
            .store
            .events_list(&ListParams {
                target,
                filter: &filter,
                order: Order::NewestFirst,
                after: None,
                limit: FAILED_PER_TENANT,
            })
            .await?;
        rows.extend(events.into_iter().map(|e| {
            FailedRow {
                id: e.id,
                tenant: t.tenant.clone(),
                event_type: e.event_type,
                aggregate: [e.aggregate_type, e.aggregate_id]
                    .into_iter()
                    .flatten()
                    .collect::<Vec<_>>()
                    .join(" "),
                tries: e.retry_count,
                last_error: e.last_error.unwrap_or_default(),
                updated: e.updated_at.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
            }
        }));
    }
    Ok(rows)
}

/// Whether the request carries this relay's session cookie.
fn signed_in(shared: &Shared, headers: &HeaderMap) -> bool {
    let Some(token) = &shared.token else {
        return false;
    };
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .any(|(name, value)| name == COOKIE && token.matches_session(value))
}

/// Whether a form post comes from this page: browsers say so in `Sec-Fetch-Site`, or in an
/// `Origin` that names this host. (The `SameSite=Strict` cookie already stays home on a
/// cross-site post; this refuses one from a browser that would send it.)
fn same_origin(headers: &HeaderMap) -> bool {
    if let Some(site) = headers.get("sec-fetch-site") {
        return site == "same-origin";
    }
    match headers.get(header::ORIGIN) {
        None => true,
        Some(origin) => {
            let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
            let origin_host = origin
                .to_str()
                .ok()
                .and_then(|o| o.split_once("://"))
                .map(|(_, h)| h);
            host.is_some() && origin_host == host
        }
    }
}

fn html(status: StatusCode, page: &impl Template) -> Response {
    match page.render() {
        Ok(body) => (
            status,
            [
                (header::CONTENT_TYPE, "text/html; charset=utf-8"),
                (header::CONTENT_SECURITY_POLICY, CSP),
                (header::CACHE_CONTROL, "no-store"),
            ],
            body,
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the page could not be rendered: {e}"),
        )
            .into_response(),
    }
}

/// 303 to `/`, setting `cookie`.
fn see_other(cookie: String) -> Response {
    (
        StatusCode::SEE_OTHER,
        [
            (header::LOCATION, "/".to_owned()),
            (header::SET_COOKIE, cookie),
        ],
    )
        .into_response()
}

/// A duration as a person reads it.
fn age(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 1.0 {
        format!("{} ms", (s * 1000.0).round())
    } else if s < 120.0 {
        format!("{s:.1} s")
    } else if s < 7200.0 {
        format!("{} min", (s / 60.0).round())
    } else {
        format!("{:.1} h", s / 3600.0)
    }
}

#[cfg(test)]
mod tests;
