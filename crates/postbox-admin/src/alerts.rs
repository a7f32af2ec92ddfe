//! Alerts that reach someone: when an event goes `FAILED`, when a sink has been down longer
//! than a threshold, when the oldest outstanding event is older than a threshold — as a log
//! line (target `postbox::alert`) and, if configured, a POST of Slack-compatible JSON
//! (`{"text": "…"}`, plus the alert's fields) to a webhook.
//!
//! An outage sends a handful of alerts, not thousands: each subject (a tenant's failures, a
//! sink, a tenant's backlog) alerts once, then at most every `repeat_after` while the
//! condition lasts, with the count of what happened in between; a sink or backlog that
//! recovers sends one "resolved" alert; and no more than `max_per_hour` go out in all.
//!
//! ```no_run
//! use std::time::Duration;
//! use postbox_admin::alerts::{AlertConfig, Alerts};
//!
//! let mut config = AlertConfig::default();
//! config.webhook = Some("https://hooks.slack.com/services/T000/B000/XXXX".to_owned());
//! config.sink_down_after = Duration::from_secs(120);
//! let alerts = Alerts::new(config).unwrap();
//! # let _ = alerts;
//! ```

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use postbox::{relay::FailedNotice, relay::Notice, sink::SinkHealth};
use serde::Serialize;
use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::warn;

use crate::error::AdminError;

/// How long one webhook POST may take.
const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(10);

/// What to alert on, and where.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct AlertConfig {
    /// An `http(s)://` URL to POST each alert to (Slack's incoming webhooks, Mattermost, a
    /// relay of your own); `None`: the log line only.
    pub webhook: Option<String>,
    /// A sink down this long alerts (default 5 minutes).
    pub sink_down_after: Duration,
    /// An outstanding event older than this alerts (default 15 minutes; `None`: never).
    pub backlog_age_over: Option<Duration>,
    /// A condition that lasts alerts again after this long (default 1 hour).
    pub repeat_after: Duration,
    /// At most this many alerts an hour, in all (default 20).
    pub max_per_hour: u32,
}

impl Default for AlertConfig {
    fn default() -> Self {
        AlertConfig {
            webhook: None,
            sink_down_after: Duration::from_secs(5 * 60),
            backlog_age_over: Some(Duration::from_secs(15 * 60)),
            repeat_after: Duration::from_secs(60 * 60),
            max_per_hour: 20,
        }
    }
}

/// The alert sender, configured; the admin server runs it ([`AdminBuilder::alerts`]).
///
/// [`AdminBuilder::alerts`]: crate::AdminBuilder::alerts
pub struct Alerts {
    config: AlertConfig,
    client: reqwest::Client,
}

impl Alerts {
    /// Checks the configuration: a webhook must be an `http` or `https` URL.
    pub fn new(config: AlertConfig) -> Result<Self, AdminError> {
        if let Some(url) = &config.webhook {
            let parsed = reqwest::Url::parse(url).map_err(|e| {
                AdminError::InvalidAlerts(format!("alert_webhook is not a URL: {e}"))
            })?;
            if !matches!(parsed.scheme(), "http" | "https") {
                return Err(AdminError::InvalidAlerts(format!(
                    "alert_webhook must be an http:// or https:// URL, not {}:",
                    parsed.scheme()
                )));
            }
        }
        if config.max_per_hour == 0 {
            return Err(AdminError::InvalidAlerts(
                "alert_max_per_hour must be at least 1".to_owned(),
            ));
        }
        let client = reqwest::Client::builder()
            .timeout(WEBHOOK_TIMEOUT)
            .build()
            .map_err(|e| AdminError::InvalidAlerts(format!("alert_webhook client: {e}")))?;
        Ok(Alerts { config, client })
    }

    /// Starts sending: notices from the relay as they come, checks as the monitor sends them.
    pub(crate) fn start(self, notices: Option<broadcast::Receiver<Notice>>) -> Running {
        let (tx, rx) = mpsc::channel(16);
        let task = tokio::spawn(send_loop(self, notices, rx));
        Running { tx, task }
    }
}

/// A condition the monitor saw.
#[derive(Debug)]
pub(crate) enum Check {
    /// A sink's state.
    Sink(SinkHealth),
    /// A tenant's outstanding events.
    Backlog {
        tenant: String,
        oldest: Option<Duration>,
        pending: i64,
    },
}

/// The running sender.
pub(crate) struct Running {
    tx: mpsc::Sender<Vec<Check>>,
    task: JoinHandle<()>,
}

impl Running {
    /// Hands over a round of checks; a round the sender has no room for is dropped (the next
    /// one says the same).
    pub(crate) fn check(&mut self, checks: Vec<Check>) {
        let _ = self.tx.try_send(checks);
    }

    /// Stops after sending what is queued.
    pub(crate) async fn stop(self) {
        drop(self.tx);
        let _ = self.task.await;
    }
}

/// One alert, as logged and posted.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct Alert {
    /// Slack's field: the message a person reads.
    text: String,
    /// `event_failed`, `sink_down`, `sink_up`, `backlog_old`, `backlog_ok`.
    kind: &'static str,
    /// The tenant or sink it is about.
    subject: String,
}

async fn send_loop(
    alerts: Alerts,
    mut notices: Option<broadcast::Receiver<Notice>>,
    mut checks: mpsc::Receiver<Vec<Check>>,
) {
    let mut policy = Policy::new(alerts.config.clone());
    loop {
        let out = tokio::select! {
            notice = recv(&mut notices) => match notice {
                Some(Ok(Notice::Failed(failed))) => policy.failed(&failed, Instant::now()),
                Some(Ok(_)) => Vec::new(),
                Some(Err(broadcast::error::RecvError::Lagged(missed))) => {
                    policy.missed(missed);
                    Vec::new()
                }
                Some(Err(broadcast::error::RecvError::Closed)) => {
                    notices = None;
                    Vec::new()
                }
                None => Vec::new(),
            },
            round = checks.recv() => match round {
                Some(round) => policy.checks(round, Instant::now()),
                None => break,
            },
        };
        for alert in out {
            deliver(&alerts, &alert).await;
        }
    }
}

/// The next notice, or never when there is no relay to hear from.
async fn recv(
    notices: &mut Option<broadcast::Receiver<Notice>>,
) -> Option<Result<Notice, broadcast::error::RecvError>> {
    match notices {
        Some(rx) => Some(rx.recv().await),
        None => std::future::pending().await,
    }
}

/// A webhook URL as logs may show it: scheme and host only, since the path of many webhooks
/// (Slack's, Mattermost's) is itself the secret.
fn shown(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(u) => format!("{}://{}/…", u.scheme(), u.host_str().unwrap_or("?")),
        Err(_) => "(not a URL)".to_owned(),
    }
}

/// Logs the alert and posts it to the webhook, if any.
async fn deliver(alerts: &Alerts, alert: &Alert) {
    warn!(target: "postbox::alert", kind = alert.kind, subject = %alert.subject, "{}", alert.text);
    let Some(url) = &alerts.config.webhook else {
        return;
    };
    let result = alerts.client.post(url).json(alert).send().await;
    let failure = match result {
        Ok(response) if response.status().is_success() => None,
        Ok(response) => Some(format!("answered {}", response.status())),
        // reqwest's errors quote the URL: only the kind of failure is kept.
        Err(e) if e.is_timeout() => Some("timed out".to_owned()),
        Err(e) if e.is_connect() => Some("cannot connect".to_owned()),
        Err(_) => Some("request failed".to_owned()),
    };
    if let Some(failure) = failure {
        warn!(
            webhook = %shown(url),
            kind = alert.kind,
            "alert webhook failed: {failure}; the alert is in this log only"
        );
    }
}

/// Which alerts go out: the deduplication and rate limiting, apart from any I/O.
struct Policy {
    config: AlertConfig,
    /// Per tenant: when its failures last alerted, and how many since.
    failed: HashMap<String, Repeat>,
    /// Per sink: when its outage last alerted.
    sinks: HashMap<String, Instant>,
    /// Per tenant: when its old backlog last alerted.
    backlogs: HashMap<String, Instant>,
    /// When the alerts of the last hour went out.
    sent: VecDeque<Instant>,
    /// Alerts dropped by the hourly limit since the last one sent.
    dropped: u64,
}

#[derive(Default)]
struct Repeat {
    last: Option<Instant>,
    since: u64,
    latest: Option<FailedNotice>,
}

impl Policy {
    fn new(config: AlertConfig) -> Self {
        Policy {
            config,
            failed: HashMap::new(),
            sinks: HashMap::new(),
            backlogs: HashMap::new(),
            sent: VecDeque::new(),
            dropped: 0,
        }
    }

    /// An event went `FAILED`: alerts at once unless its tenant alerted within
    /// `repeat_after`; then it is counted for the next alert.
    fn failed(&mut self, notice: &FailedNotice, now: Instant) -> Vec<Alert> {
        let repeat = self.failed.entry(notice.tenant.clone()).or_default();
        if repeat
            .last
            .is_some_and(|last| now.duration_since(last) < self.config.repeat_after)
        {
            repeat.since += 1;
            repeat.latest = Some(notice.clone());
            return Vec::new();
        }
        let more = std::mem::take(&mut repeat.since);
        repeat.last = Some(now);
        repeat.latest = None;
        let mut text = format!(
            "Postbox: event {} ({}) of tenant {} FAILED after {} tries: {}",
            notice.event_id, notice.event_type, notice.tenant, notice.retry_count, notice.error
        );
        if more > 0 {
            text.push_str(&format!(
                " ({more} more FAILED before it since the last alert)"
            ));
        }
        text.push_str(". Fix the cause, then `postbox retry`.");
        self.limit(
            Alert {
                text,
                kind: "event_failed",
                subject: notice.tenant.clone(),
            },
            now,
        )
    }

    /// Notices the relay sent while the sender was behind: counted, never silently lost.
    fn missed(&mut self, missed: u64) {
        warn!(
            target: "postbox::alert",
            missed, "alert sender fell behind; {missed} relay notices were not seen (their events are in `postbox events list --status failed`)"
        );
    }

    /// A round of the monitor's checks; also flushes failures counted since a tenant's last
    /// alert once `repeat_after` has passed.
    fn checks(&mut self, checks: Vec<Check>, now: Instant) -> Vec<Alert> {
        let mut out = Vec::new();
        let repeat_after = self.config.repeat_after;
        let mut due = Vec::new();
        for (tenant, repeat) in &mut self.failed {
            if repeat.since > 0
                && repeat
                    .last
                    .is_some_and(|last| now.duration_since(last) >= repeat_after)
                && let Some(latest) = repeat.latest.take()
            {
                let n = std::mem::take(&mut repeat.since);
                repeat.last = Some(now);
                due.push(Alert {
                    text: format!(
                        "Postbox: {n} more events of tenant {tenant} FAILED since the last alert; \
                         the latest: event {} ({}): {}. See `postbox events list --status failed`.",
                        latest.event_id, latest.event_type, latest.error
                    ),
                    kind: "event_failed",
                    subject: tenant.clone(),
                });
            }
        }
        for alert in due {
            out.extend(self.limit(alert, now));
        }
        for check in checks {
            let alert = match check {
                Check::Sink(sink) => self.sink(&sink, now),
                Check::Backlog {
                    tenant,
                    oldest,
                    pending,
                } => self.backlog(&tenant, oldest, pending, now),
            };
            if let Some(alert) = alert {
                out.extend(self.limit(alert, now));
            }
        }
        out
    }

    fn sink(&mut self, sink: &SinkHealth, now: Instant) -> Option<Alert> {
        let down_for = (chrono::Utc::now() - sink.since)
            .to_std()
            .unwrap_or_default();
        if sink.up {
            return self.sinks.remove(&sink.name).map(|_| Alert {
                text: format!("Postbox: sink {} is up again", sink.name),
                kind: "sink_up",
                subject: sink.name.clone(),
            });
        }
        if down_for < self.config.sink_down_after {
            return None;
        }
        let last = self.sinks.get(&sink.name);
        if last.is_some_and(|last| now.duration_since(*last) < self.config.repeat_after) {
            return None;
        }
        self.sinks.insert(sink.name.clone(), now);
        Some(Alert {
            text: format!(
                "Postbox: sink {} has been down for {} (since {}): {}. Its events wait, no try spent.",
                sink.name,
                humantime::format_duration(Duration::from_secs(down_for.as_secs())),
                sink.since
                    .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                sink.last_error.as_deref().unwrap_or("no answer")
            ),
            kind: "sink_down",
            subject: sink.name.clone(),
        })
    }

    fn backlog(
        &mut self,
        tenant: &str,
        oldest: Option<Duration>,
        pending: i64,
        now: Instant,
    ) -> Option<Alert> {
        let threshold = self.config.backlog_age_over?;
        let oldest = oldest.unwrap_or_default();
        if oldest < threshold {
            return self.backlogs.remove(tenant).map(|_| Alert {
                text: format!("Postbox: the backlog of tenant {tenant} is caught up"),
                kind: "backlog_ok",
                subject: tenant.to_owned(),
            });
        }
        let last = self.backlogs.get(tenant);
        if last.is_some_and(|last| now.duration_since(*last) < self.config.repeat_after) {
            return None;
        }
        self.backlogs.insert(tenant.to_owned(), now);
        Some(Alert {
            text: format!(
                "Postbox: the oldest outstanding event of tenant {tenant} is {} old \
                 ({pending} outstanding); check the relays and their sinks",
                humantime::format_duration(Duration::from_secs(oldest.as_secs()))
            ),
            kind: "backlog_old",
            subject: tenant.to_owned(),
        })
    }

    /// Applies the hourly limit.
    fn limit(&mut self, mut alert: Alert, now: Instant) -> Vec<Alert> {
        while self
            .sent
            .front()
            .is_some_and(|t| now.duration_since(*t) >= Duration::from_secs(3600))
        {
            self.sent.pop_front();
        }
        if self.sent.len() >= self.config.max_per_hour as usize {
            self.dropped += 1;
            warn!(target: "postbox::alert", kind = alert.kind, subject = %alert.subject,
                "alert not sent (over alert_max_per_hour): {}", alert.text);
            return Vec::new();
        }
        if self.dropped > 0 {
            alert.text.push_str(&format!(
                " ({} alerts were held back by alert_max_per_hour; see the log)",
                std::mem::take(&mut self.dropped)
            ));
        }
        self.sent.push_back(now);
        vec![alert]
    }
}

#[cfg(test)]
mod tests;
