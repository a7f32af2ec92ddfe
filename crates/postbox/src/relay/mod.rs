//! The relay: claims committed events, publishes them to a [`Sink`], marks them, retries
//! failures and recovers the leases of dead relays (DESIGN §3).

mod config;
mod publish;
mod vacuum;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tracing::{debug, error, info, warn};

pub use config::RelayConfig;

use crate::backoff::Backoff;
use crate::error::{Error, Result};
use crate::schema::{SchemaName, Target};
use crate::sink::Sink;
use crate::store::{
    ClaimParams, FailedTry, MarkFailedParams, MarkProcessedParams, RenewParams, Store,
    TenantStatus, Wakeups,
};

/// Scheduled retries a relay remembers for waking up on time.
const MAX_REMEMBERED_RETRIES: usize = 10_000;

/// What a relay did, summed over its run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayStats {
    /// Events published and marked `PROCESSED`.
    pub published: u64,
    /// Failed tries (publish errors, timeouts, panics) recorded.
    pub failed_tries: u64,
    /// Events that went `FAILED` (out of retries, or a permanent error).
    pub gave_up: u64,
    /// Stale events taken over from a relay that did not finish in time.
    pub recovered: u64,
    /// Results this relay could not record because another relay had taken the event over.
    pub fenced: u64,
}

impl RelayStats {
    fn add(&mut self, other: RelayStats) {
        self.published += other.published;
        self.failed_tries += other.failed_tries;
        self.gave_up += other.gave_up;
        self.recovered += other.recovered;
        self.fenced += other.fenced;
    }
}

/// A relay over one store and one sink.
///
/// ```no_run
/// use postbox::{Handlers, Relay, RelayConfig};
///
/// # async fn example() -> anyhow::Result<()> {
/// let store = postbox::connect("postgres://localhost/app").await?;
/// let handlers = Handlers::new().on_any(|e| async move {
///     println!("{} {}", e.id, e.event_type);
///     Ok::<_, std::io::Error>(())
/// });
/// let relay = Relay::new(store, handlers, RelayConfig::default())?;
/// // Runs until Ctrl-C, then finishes the batch in flight and returns.
/// relay.run(async { let _ = tokio::signal::ctrl_c().await; }).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Relay {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    sink: Arc<dyn Sink>,
    config: RelayConfig,
    id: String,
    /// The retries this relay scheduled, earliest first, so an idle relay wakes for them rather
    /// than at its next poll. Wake-up times only: whether an event is due is decided by the
    /// database clock.
    retries: std::sync::Mutex<BinaryHeap<Reverse<Instant>>>,
}

/// Whether the loop stops when the work runs out.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Forever,
    Drain,
}

/// The targets to serve, and when they were last read.
struct Targets {
    list: Vec<Target>,
    read_at: Option<Instant>,
    next_start: usize,
    /// Until when each target (by schema) counts as busy: it had events lately, so it is
    /// polled every `busy_poll_interval`.
    busy_until: HashMap<SchemaName, Instant>,
}

impl Targets {
    fn is_busy(&self, target: &Target, now: Instant) -> bool {
        self.busy_until
            .get(&target.schema)
            .is_some_and(|until| *until > now)
    }

    fn any_busy(&self, now: Instant) -> bool {
        self.busy_until.values().any(|until| *until > now)
    }
}

/// What ended an idle wait.
enum Woken {
    /// A notification: events may have been committed in any target.
    Hint,
    /// The wait ran out.
    Timeout,
    /// Shutdown.
    Stop,
}

impl Relay {
    /// A relay; fails if `config` is invalid.
    pub fn new(store: impl Store, sink: impl Sink, config: RelayConfig) -> Result<Self> {
        Self::from_parts(Arc::new(store), Arc::new(sink), config)
    }

    /// A relay over a shared store and sink.
    pub fn from_parts(
        store: Arc<dyn Store>,
        sink: Arc<dyn Sink>,
        config: RelayConfig,
    ) -> Result<Self> {
        config.validate()?;
        let id = config.relay_id.clone().unwrap_or_else(default_relay_id);
        Ok(Relay {
            inner: Arc::new(Inner {
                store,
                sink,
                config,
                id,
                retries: std::sync::Mutex::new(BinaryHeap::new()),
            }),
        })
    }

    /// This relay's id, as written to `locked_by`.
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// Relays until `shutdown` completes; then stops claiming, finishes the batch in flight, and
    /// returns. Database errors are logged and retried, never fatal.
    pub async fn run(&self, shutdown: impl Future<Output = ()> + Send) -> Result<RelayStats> {
        self.run_mode(Mode::Forever, shutdown).await
    }

    /// Relays until every event of every served target is `PROCESSED` or `FAILED` (waiting out
    /// backoffs and the leases of dead relays), or until `shutdown` completes.
    pub async fn drain(&self, shutdown: impl Future<Output = ()> + Send) -> Result<RelayStats> {
        self.run_mode(Mode::Drain, shutdown).await
    }

    async fn run_mode(
        &self,
        mode: Mode,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<RelayStats> {
        let (stop_tx, stop_rx) = watch::channel(false);
        let work = self.work(mode, stop_rx);
        tokio::pin!(work);
        let stop = async move {
            shutdown.await;
            let _ = stop_tx.send(true);
            // Keep the sender alive so the worker sees `true`, not a closed channel.
            std::future::pending::<()>().await
        };
        tokio::select! {
            result = &mut work => result,
            () = stop => unreachable!("the stop future never completes"),
        }
    }

    async fn work(&self, mode: Mode, mut stop: watch::Receiver<bool>) -> Result<RelayStats> {
        let cfg = &self.inner.config;
        let mut stats = RelayStats::default();
        let mut targets = Targets {
            list: Vec::new(),
            read_at: None,
            next_start: 0,
            busy_until: HashMap::new(),
        };
        let mut wakeups = self.connect_wakeups(mode).await;
        // Pauses after failed rounds: 100 ms, 200 ms, … up to the poll interval.
        let mut db_errors = Backoff::new(Duration::from_millis(100), cfg.poll_interval).attempts();
        // Busy-only rounds serve just the targets that had events lately; a full round serves
        // every target, after a notification, at each poll, and when a retry comes due.
        let mut busy_only = false;
        let mut last_full = Instant::now();
        let mut vacuum = vacuum::Vacuum::new(cfg.vacuum_threshold);
        info!(relay = %self.inner.id, ?mode, "relay started");
        loop {
            if *stop.borrow() {
                break;
            }
            let round_started = Instant::now();
            let round = async {
                self.refresh_targets(&mut targets).await?;
                self.round(&mut targets, busy_only, &stop).await
            }
            .await;
            if !busy_only {
                last_full = Instant::now();
            }
            busy_only = false;
            vacuum.tick(&self.inner.store, &targets.list);
            let full = match round {
                Ok((round_stats, full)) => {
                    db_errors.reset();
                    stats.add(round_stats);
                    full
                }
                Err(e) if e.needs_operator() => {
                    error!(relay = %self.inner.id, error = %e, "relay cannot serve any target");
                    return Err(e);
                }
                Err(e) => {
                    let wait = db_errors.next_delay();
                    warn!(relay = %self.inner.id, error = %e, retry_in = ?wait,
                        "relay round failed; events stay in the outbox and are retried (check the database)");
                    if wait_or_stop(wait, &mut stop).await {
                        break;
                    }
                    continue;
                }
            };
            if full || *stop.borrow() {
                continue;
            }
            let wait = match mode {
                // Draining must know when nothing is left, and when the next retry or expired
                // lease is due (any relay's), so it asks the database.
                Mode::Drain => match self.next_due(&targets).await {
                    Ok(None) => break,
                    Ok(Some(due)) => due.clamp(Duration::from_millis(5), cfg.poll_interval),
                    Err(e) if e.needs_operator() => {
                        error!(relay = %self.inner.id, error = %e,
                            "cannot drain: a served target's events cannot be read");
                        return Err(e);
                    }
                    Err(e) => {
                        warn!(error = %e, "cannot read the backlog; retrying");
                        cfg.poll_interval.min(Duration::from_secs(1))
                    }
                },
                // Running, it waits for a notification, its own next retry, or the poll: no
                // query per idle round (it would cost most on a busy table). A busy target is
                // polled every busy_poll_interval meanwhile.
                Mode::Forever => {
                    let now = Instant::now();
                    let full_wait = self.until_next_retry().map_or(cfg.poll_interval, |d| {
                        d.clamp(Duration::from_millis(5), cfg.poll_interval)
                    });
                    let full_at = (last_full + cfg.poll_interval).min(now + full_wait);
                    let until_full = full_at.saturating_duration_since(now);
                    if targets.any_busy(now) && cfg.busy_poll_interval < until_full {
                        busy_only = true;
                        // Busy polls keep their pace however long the round took.
                        cfg.busy_poll_interval
                            .saturating_sub(round_started.elapsed())
                    } else {
                        until_full
                    }
                }
            };
            match self.idle(wait, &mut wakeups, &mut stop, mode).await {
                Woken::Stop => break,
                Woken::Hint => busy_only = false,
                Woken::Timeout => {}
            }
        }
        vacuum.stop();
        info!(relay = %self.inner.id, ?stats, "relay stopped");
        Ok(stats)
    }

    /// Waits for a notification, `wait`, or shutdown.
    async fn idle(
        &self,
        wait: Duration,
        wakeups: &mut Option<Box<dyn Wakeups>>,
        stop: &mut watch::Receiver<bool>,
        mode: Mode,
    ) -> Woken {
        if wakeups.is_none() && mode == Mode::Forever {
            *wakeups = self.connect_wakeups(mode).await;
        }
        let stopped = |s: bool| if s { Woken::Stop } else { Woken::Timeout };
        match wakeups {
            Some(w) => {
                tokio::select! {
                    hint = w.next() => {
                        if let Err(e) = hint {
                            debug!(error = %e, "notification listener lost; polling until it reconnects");
                            *wakeups = None;
                        }
                        Woken::Hint
                    }
                    s = wait_or_stop(wait, stop) => stopped(s),
                }
            }
            None => stopped(wait_or_stop(wait, stop).await),
        }
    }

    async fn connect_wakeups(&self, mode: Mode) -> Option<Box<dyn Wakeups>> {
        if mode == Mode::Drain || !self.inner.config.notifications {
            // Draining waits for due times it computes itself; hints would only add wake-ups.
            // Without notifications the relay polls only.
            return None;
        }
        match self.inner.store.wakeups().await {
            Ok(w) => w,
            Err(e) => {
                debug!(error = %e, "no notification listener; polling only");
                None
            }
        }
    }

    /// Reads the served targets: the default schema and every active tenant.
    async fn refresh_targets(&self, targets: &mut Targets) -> Result<()> {
        if let Some(at) = targets.read_at
            && at.elapsed() < self.inner.config.tenant_refresh
        {
            return Ok(());
        }
        let store = &self.inner.store;
        let mut list = vec![Target::default_schema(store.default_schema())];
        match store.tenant_list().await {
            Ok(tenants) => list.extend(
                tenants
                    .iter()
                    .filter(|t| t.status == TenantStatus::Active)
                    .map(|t| t.target()),
            ),
            Err(Error::Unsupported(_)) => {}
            Err(e) => return Err(e),
        }
        if list != targets.list {
            info!(targets = ?list.iter().map(Target::label).collect::<Vec<_>>(), "serving");
        }
        targets.list = list;
        let now = Instant::now();
        targets.read_at = Some(now);
        targets.busy_until.retain(|_, until| *until > now);
        Ok(())
    }

    /// One batch from each target, starting one further along each round so no target always
    /// goes first. Returns whether any batch came back full (more work is waiting). A target
    /// whose batch fails (say, a tenant schema dropped by hand) is logged and skipped, so it
    /// cannot hold up the others; the round fails only when every target failed.
    async fn round(
        &self,
        targets: &mut Targets,
        busy_only: bool,
        stop: &watch::Receiver<bool>,
    ) -> Result<(RelayStats, bool)> {
        let mut stats = RelayStats::default();
        let mut full = false;
        let mut failed = None;
        let mut served = 0;
        let n = targets.list.len();
        let start = targets.next_start % n.max(1);
        targets.next_start = targets.next_start.wrapping_add(1);
        let busy_period = self.inner.config.busy_period;
        for i in 0..n {
            if *stop.borrow() {
                break;
            }
            let target = &targets.list[(start + i) % n];
            if busy_only && !targets.is_busy(target, Instant::now()) {
                continue;
            }
            match self.batch(target).await {
                Ok((batch, was_full)) => {
                    served += 1;
                    if batch != RelayStats::default() && !busy_period.is_zero() {
                        targets
                            .busy_until
                            .insert(target.schema.clone(), Instant::now() + busy_period);
                    }
                    stats.add(batch);
                    full |= was_full;
                }
                Err(e) => {
                    warn!(tenant = target.label(), error = %e,
                        "batch failed; its events stay in the outbox, other tenants are still served");
                    failed = Some(e);
                }
            }
        }
        match failed {
            Some(e) if served == 0 => Err(e),
            _ => Ok((stats, full)),
        }
    }

    /// Remembers a retry this relay scheduled `after` from now.
    fn note_retry(&self, after: Duration) {
        let mut retries = self
            .inner
            .retries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Bounded: past this many, later retries are found by polling.
        if retries.len() < MAX_REMEMBERED_RETRIES {
            retries.push(Reverse(Instant::now() + after));
        }
    }

    /// Time until the earliest retry this relay scheduled that is still ahead (zero if one has
    /// just come due); retries already passed are forgotten.
    fn until_next_retry(&self) -> Option<Duration> {
        let mut retries = self
            .inner
            .retries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = Instant::now();
        let mut came_due = false;
        while let Some(Reverse(at)) = retries.peek() {
            if *at > now {
                return Some(if came_due { Duration::ZERO } else { *at - now });
            }
            retries.pop();
            came_due = true;
        }
        came_due.then_some(Duration::ZERO)
    }

    /// How long until the earliest outstanding event is due, or `None` when nothing is left.
    async fn next_due(&self, targets: &Targets) -> Result<Option<Duration>> {
        let mut due: Option<Duration> = None;
        for target in &targets.list {
            if let Some(d) = self.inner.store.backlog(target).await?.next_due_in {
                due = Some(due.map_or(d, |cur| cur.min(d)));
            }
        }
        Ok(due)
    }

    /// Claims, publishes and marks one batch of `target`. Public for tests and tools that want
    /// to step a relay by hand; returns the batch's stats and whether it was full.
    pub async fn batch(&self, target: &Target) -> Result<(RelayStats, bool)> {
        let inner = &*self.inner;
        let cfg = &inner.config;
        let tenant = target.label();
        let claimed = inner
            .store
            .events_claim(&ClaimParams {
                target,
                batch_size: cfg.batch_size,
                lease: cfg.lease,
                relay_id: &inner.id,
            })
            .await?;
        let mut stats = RelayStats {
            recovered: claimed.recovered,
            gave_up: claimed.exhausted.len() as u64,
            failed_tries: claimed.recovered + claimed.exhausted.len() as u64,
            ..RelayStats::default()
        };
        let full = claimed.events.len() + claimed.exhausted.len() + claimed.undecodable.len()
            >= cfg.batch_size as usize;
        if claimed.recovered > 0 {
            info!(tenant, relay = %inner.id, count = claimed.recovered,
                "recovered {} stale events (a relay did not finish within its lease)", claimed.recovered);
            metrics::counter!("postbox_stale_recovered_total", "tenant" => tenant.to_owned())
                .increment(claimed.recovered);
        }
        for e in &claimed.exhausted {
            alert_failed(tenant, e.id, &e.event_type, e.retry_count, &e.last_error);
        }
        let token = claimed.claim_token;
        if !claimed.undecodable.is_empty() {
            // A row no sink could be given fails at once, alone: the rest of the batch goes on.
            let tries: Vec<FailedTry> = claimed
                .undecodable
                .iter()
                .map(|u| FailedTry {
                    id: u.id,
                    error: u.reason.clone(),
                    permanent: true,
                })
                .collect();
            let failed = MarkFailedParams {
                target,
                claim_token: token,
                tries: &tries,
                retry: cfg.retry,
            };
            let marks = self
                .with_patience(|| inner.store.events_mark_failed(&failed))
                .await?;
            stats.failed_tries += marks.len() as u64;
            stats.gave_up += marks.len() as u64;
            for mark in &marks {
                let reason = tries
                    .iter()
                    .find(|t| t.id == mark.id)
                    .map_or("", |t| t.error.as_str());
                alert_failed(tenant, mark.id, "(unreadable)", mark.retry_count, reason);
            }
        }
        if claimed.events.is_empty() {
            return Ok((stats, full));
        }
        let ids: Vec<i64> = claimed.events.iter().map(|e| e.id).collect();
        let started = Instant::now();

        let outcomes = publish::publish_batch(
            &inner.sink,
            &claimed.events,
            cfg.concurrency,
            cfg.publish_timeout,
            cfg.lease / 3,
            || async {
                match inner
                    .store
                    .leases_renew(&RenewParams {
                        target,
                        claim_token: token,
                        ids: &ids,
                        lease: cfg.lease,
                    })
                    .await
                {
                    Ok(n) if (n as usize) < ids.len() => warn!(
                        tenant,
                        renewed = n,
                        claimed = ids.len(),
                        "some leases were lost to another relay; their results will not be recorded"
                    ),
                    Ok(_) => {}
                    Err(e) => {
                        warn!(tenant, error = %e, "lease renewal failed; retrying at the next tick")
                    }
                }
            },
        )
        .await;

        let mut done = Vec::with_capacity(outcomes.len());
        let mut tries = Vec::new();
        for (id, outcome) in outcomes {
            match outcome {
                Ok(()) => done.push(id),
                Err(e) => tries.push(FailedTry {
                    id,
                    permanent: e.is_permanent(),
                    error: e.to_string(),
                }),
            }
        }
        let processed = MarkProcessedParams {
            target,
            claim_token: token,
            ids: &done,
        };
        let marked = self
            .with_patience(|| inner.store.events_mark_processed(&processed))
            .await?;
        stats.published += marked;
        stats.fenced += done.len() as u64 - marked;
        metrics::counter!("postbox_events_published_total", "tenant" => tenant.to_owned())
            .increment(marked);
        if !tries.is_empty() {
            let failed = MarkFailedParams {
                target,
                claim_token: token,
                tries: &tries,
                retry: cfg.retry,
            };
            let marks = self
                .with_patience(|| inner.store.events_mark_failed(&failed))
                .await?;
            stats.failed_tries += marks.len() as u64;
            stats.fenced += (tries.len() - marks.len()) as u64;
            metrics::counter!("postbox_publish_failures_total", "tenant" => tenant.to_owned())
                .increment(marks.len() as u64);
            for mark in marks {
                let t = tries.iter().find(|t| t.id == mark.id);
                let error = t.map_or("", |t| t.error.as_str());
                if mark.gave_up {
                    stats.gave_up += 1;
                    let event_type = claimed
                        .events
                        .iter()
                        .find(|e| e.id == mark.id)
                        .map_or("", |e| e.event_type.as_str());
                    alert_failed(tenant, mark.id, event_type, mark.retry_count, error);
                } else {
                    let retry_in = cfg
                        .retry
                        .delay(u32::try_from(mark.retry_count).unwrap_or(0));
                    self.note_retry(retry_in);
                    warn!(
                        tenant,
                        event_id = mark.id,
                        retry_count = mark.retry_count,
                        ?retry_in,
                        error,
                        "publish failed; retry scheduled"
                    );
                }
            }
        }
        if stats.fenced > 0 {
            warn!(tenant, relay = %inner.id, count = stats.fenced,
                "results not recorded: another relay took these events over after this relay's lease expired (they may be published twice)");
        }
        metrics::histogram!("postbox_batch_seconds", "tenant" => tenant.to_owned())
            .record(started.elapsed().as_secs_f64());
        debug!(tenant, size = claimed.events.len(), elapsed = ?started.elapsed(), "batch done");
        Ok((stats, full))
    }

    /// Retries a mark for up to half a lease, so a short database outage after publishing does not
    /// turn published events into stale claims (which would publish them again).
    async fn with_patience<T, F, Fut>(&self, mut op: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let deadline = Instant::now() + self.inner.config.lease / 2;
        let mut waits = Backoff::new(Duration::from_millis(50), Duration::from_secs(2)).attempts();
        loop {
            match op().await {
                Ok(v) => return Ok(v),
                Err(e) if Instant::now() + waits.clone().next_delay() < deadline => {
                    let wait = waits.next_delay();
                    warn!(error = %e, retry_in = ?wait, "recording results failed; retrying");
                    tokio::time::sleep(wait).await;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// The operator alert for an event that went `FAILED`.
fn alert_failed(tenant: &str, id: i64, event_type: &str, retry_count: i32, error: &str) {
    error!(
        tenant,
        event_id = id,
        event_type,
        retry_count,
        error,
        "event FAILED and will not be retried; fix the cause, then retry it (an operator's retry puts it back in the queue)"
    );
    metrics::counter!("postbox_events_failed_total", "tenant" => tenant.to_owned()).increment(1);
}

/// Sleeps for `wait` unless shutdown comes first; returns true on shutdown.
async fn wait_or_stop(wait: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    if *stop.borrow() {
        return true;
    }
    tokio::select! {
        () = tokio::time::sleep(wait) => false,
        _ = stop.wait_for(|s| *s) => true,
    }
}

fn default_relay_id() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "relay".to_owned());
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    format!("{host}-{}-{}", std::process::id(), &suffix[..6])
}

impl std::fmt::Debug for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Forever => "run",
            Mode::Drain => "drain",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send<T: Send>(_: &T) {}

    /// Compile-time check: relays are spawned on multi-threaded runtimes, so their futures must
    /// stay `Send`.
    #[allow(dead_code, reason = "only compiled, never run")]
    fn relay_futures_are_send(relay: Relay, target: Target) {
        assert_send(&relay.run(async {}));
        assert_send(&relay.drain(async {}));
        assert_send(&relay.batch(&target));
    }
}
