//! The relay's loop: rounds of claims, the pipeline publishing and recording meanwhile, the
//! waker's wait when nothing is waiting, and the drain's end.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{error, info, warn};

use super::pipeline::Pipeline;
use super::stats::Stall;
use super::targets::Targets;
use super::waker::{Timing, Waker, Woken, next_round, wait_or_stop};
use super::{Mode, Relay, RelayStats, maintenance};
use crate::backoff::Backoff;
use crate::error::{Error, Result};
use crate::metrics as metric;
use crate::schema::Target;

/// What one round's claims found.
#[derive(Clone, Copy, Default)]
struct Round {
    /// A claim came back full: more work is waiting.
    full: bool,
    /// A claim took an event.
    claimed: bool,
    /// An ordered claim came back short while this relay had events of its target in flight.
    behind_own: bool,
}

impl Relay {
    pub(super) async fn run_mode(
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

    /// The relay's loop: rounds of claims, the pipeline publishing and recording meanwhile, and
    /// when nothing is waiting the waker's wait.
    pub(super) async fn work(
        &self,
        mode: Mode,
        mut stop: watch::Receiver<bool>,
    ) -> Result<RelayStats> {
        let inner = &*self.inner;
        let cfg = &inner.config;
        let store = &*inner.store;
        let mut stats = RelayStats::default();
        let mut targets = Targets::default();
        let mut pipeline = Pipeline::new(Arc::clone(&self.inner));
        // Draining waits for due times it computes itself; hints would only add wake-ups.
        // Without notifications the relay polls only.
        let mut waker = Waker::start(
            store,
            mode == Mode::Forever && cfg.notifications,
            cfg.head_poll_interval.filter(|_| mode == Mode::Forever),
        )
        .await;
        let timing = Timing {
            poll_interval: cfg.poll_interval,
            busy_poll_interval: cfg.busy_poll_interval,
        };
        // Pauses after failed rounds: 100 ms, 200 ms, … up to the poll interval.
        let mut db_errors = Backoff::new(Duration::from_millis(100), cfg.poll_interval).attempts();
        // Busy-only rounds serve just the targets that had events lately; a full round serves
        // every target, after a notification, at each poll, and when a retry comes due.
        let mut busy_only = false;
        let mut last_full = Instant::now();
        let mut maintenance = maintenance::Maintenance::new(cfg, Arc::clone(&inner.rounds));
        let mut stall = Stall::new();
        let mut gave_up = None;
        let claim_path = store.capabilities().claim_path();
        metrics::gauge!(metric::RELAY_CLAIM_PATH, "path" => claim_path).set(1.0);
        info!(relay = %inner.id, ?mode, claim_path = %claim_path, "relay started");
        loop {
            if *stop.borrow() {
                break;
            }
            let round_started = Instant::now();
            let round = async {
                targets.refresh(store, cfg.tenant_refresh).await?;
                self.round(&mut pipeline, &mut targets, busy_only, &stop)
                    .await
            }
            .await;
            if !busy_only {
                last_full = Instant::now();
            }
            busy_only = false;
            maintenance.tick(&inner.store, &inner.sink, &inner.id, targets.list());
            let Round {
                full,
                claimed,
                behind_own,
            } = match round {
                Ok(round) => {
                    db_errors.reset();
                    round
                }
                Err(e) => {
                    let wait = db_errors.next_delay();
                    if self
                        .ride_out(e, wait, &mut pipeline, &mut stats, &mut stop)
                        .await?
                    {
                        break;
                    }
                    inner.rounds.finished();
                    continue;
                }
            };
            // Publish and record; claim again as soon as there is room when more is waiting.
            self.drive(&mut pipeline, &mut stats, full, &stop).await;
            inner.rounds.finished();
            if mode == Mode::Drain
                && let Some(waited) = stall.check(&stats, cfg.drain_patience)
            {
                gave_up = Some(self.give_up(&stats, &pipeline, waited));
                break;
            }
            // With ordering, a claim can come back short because it stopped at aggregates then
            // in flight (its own, or this relay's earlier claims'); the pipeline has recorded
            // them since, so their next events are claimable now.
            let ordered = !cfg.ordered_aggregate_types.is_empty();
            if full || (ordered && (claimed || behind_own)) || *stop.borrow() {
                continue;
            }
            let wait = match mode {
                Mode::Drain => match self.drain_wait(targets.list()).await? {
                    None => break,
                    Some(wait) => wait,
                },
                Mode::Forever => {
                    let next = next_round(
                        timing,
                        Instant::now(),
                        last_full,
                        round_started,
                        inner.retries.until_next(),
                        targets.any_busy(),
                    );
                    busy_only = next.busy_only;
                    next.wait
                }
            };
            inner.rounds.waiting(true);
            let woken = waker.wait(store, wait, &mut stop, targets.list()).await;
            inner.rounds.waiting(false);
            match self.after_wake(woken, &mut targets, busy_only) {
                Some(next_busy_only) => busy_only = next_busy_only,
                None => break,
            }
        }
        if let Err(e) = pipeline.stop().await {
            warn!(relay = %inner.id, error = %e,
                "could not record the last outcomes; those events are taken over when their leases expire");
        }
        stats.add(pipeline.take_stats());
        maintenance.stop(&inner.store, &inner.id).await;
        info!(relay = %inner.id, ?stats, "relay stopped");
        gave_up.map_or(Ok(stats), Err)
    }

    /// After a round that failed: stops the relay (`Err`) when no target can be served without
    /// an operator; else keeps recording what is in flight, or waits `wait` before the next
    /// round. `Ok(true)`: shutdown came meanwhile.
    async fn ride_out(
        &self,
        e: Error,
        wait: Duration,
        pipeline: &mut Pipeline,
        stats: &mut RelayStats,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<bool> {
        let id = &self.inner.id;
        if e.needs_operator() {
            error!(relay = %id, error = %e, "relay cannot serve any target");
            pipeline.stop().await.ok();
            return Err(e);
        }
        warn!(relay = %id, error = %e, retry_in = ?wait,
            "relay round failed; events stay in the outbox and are retried (check the database)");
        if !pipeline.is_idle() {
            // Keep recording what is in flight while the database recovers.
            self.drive(pipeline, stats, false, stop).await;
            return Ok(false);
        }
        Ok(wait_or_stop(wait, stop).await)
    }

    /// What a wake-up means for the next round: `None` to stop; else whether the round serves
    /// only the busy targets (`busy_only` as planned, unless something woke the relay).
    fn after_wake(&self, woken: Woken, targets: &mut Targets, busy_only: bool) -> Option<bool> {
        let cfg = &self.inner.config;
        match woken {
            Woken::Stop => None,
            Woken::Hint => Some(false),
            Woken::Rows(moved) => {
                // The rows may not be committed yet: poll those targets busily until they are
                // (or the busy period ends).
                for target in &moved {
                    targets.mark_busy(target, cfg.busy_period.max(cfg.busy_poll_interval));
                }
                Some(false)
            }
            Woken::Timeout => Some(busy_only),
        }
    }

    /// The error a drain returns when destinations stayed down past `drain_patience`.
    fn give_up(&self, stats: &RelayStats, pipeline: &Pipeline, waited: Duration) -> Error {
        let e = Error::Unavailable {
            deferred: stats.deferred,
            waited,
            reason: pipeline
                .last_unavailable()
                .unwrap_or("no reason given")
                .to_owned(),
        };
        error!(relay = %self.inner.id, error = %e, "drain gave up");
        e
    }

    /// How long a drain waits before its next round: until the next retry or expired lease is
    /// due (any relay's), or `None` when nothing is left. Draining must know both, so it asks
    /// the database; a read that fails for a passing reason is retried within a second.
    async fn drain_wait(&self, targets: &[Target]) -> Result<Option<Duration>> {
        let poll = self.inner.config.poll_interval;
        match self.next_due(targets).await {
            Ok(due) => Ok(due.map(|due| due.clamp(Duration::from_millis(5), poll))),
            Err(e) if e.needs_operator() => {
                error!(relay = %self.inner.id, error = %e,
                    "cannot drain: a served target's events cannot be read");
                Err(e)
            }
            Err(e) => {
                warn!(error = %e, "cannot read the backlog; retrying");
                Ok(Some(poll.min(Duration::from_secs(1))))
            }
        }
    }

    /// Steps the pipeline until it is idle, or (`claim_more`) until another batch fits, or
    /// shutdown. A step is short (one outcome, or a window of them), and is never cut off, so
    /// no outcome is lost mid-record.
    async fn drive(
        &self,
        pipeline: &mut Pipeline,
        stats: &mut RelayStats,
        claim_more: bool,
        stop: &watch::Receiver<bool>,
    ) {
        loop {
            let room = claim_more && pipeline.has_room();
            if pipeline.is_idle() || room || *stop.borrow() {
                break;
            }
            if let Err(e) = pipeline.step().await {
                warn!(relay = %self.inner.id, error = %e,
                    "recording results failed; those events are taken over when their leases expire");
            }
        }
        stats.add(pipeline.take_stats());
    }

    /// One claim from each target of the round, while the pipeline has room. Returns whether any
    /// claim came back full (more work is waiting), whether any claimed an event, and whether an
    /// ordered one came back short behind this relay's own events (or waits for them). A tenant
    /// whose claim fails is logged and skipped, so it cannot hold up the others (one whose
    /// tables are gone waits for the next registry read); a target whose destinations were all
    /// down waits for its pause. The round fails when every target failed: with the default
    /// schema's error when that one needs an operator (not migrated) — the relay then stops —,
    /// else as a transient error.
    async fn round(
        &self,
        pipeline: &mut Pipeline,
        targets: &mut Targets,
        busy_only: bool,
        stop: &watch::Receiver<bool>,
    ) -> Result<Round> {
        let mut result = Round::default();
        let mut failed = None;
        let mut served = 0;
        let busy_period = self.inner.config.busy_period;
        let round = targets.round(busy_only);
        let alone = round.len() == 1;
        for target in round {
            if *stop.borrow() || !pipeline.has_room() {
                break;
            }
            if pipeline.is_paused(&target) {
                continue;
            }
            if pipeline.waits_for_own(&target) {
                // Claimed again as soon as this relay's events of it are recorded.
                result.behind_own = true;
                continue;
            }
            // A backlog that needs no order: two claims side by side.
            let claimed = if pipeline.pairs(&target, alone) {
                pipeline.claim_pair(&target).await
            } else {
                pipeline.claim(&target).await
            };
            match claimed {
                Ok(claimed) => {
                    served += 1;
                    if claimed.any && !busy_period.is_zero() {
                        targets.mark_busy(&target, busy_period);
                    }
                    result.full |= claimed.full;
                    result.claimed |= claimed.any;
                    result.behind_own |= claimed.behind_own;
                }
                Err(e) if e.needs_operator() && target.tenant.is_some() => {
                    targets.park(&target, &e.to_string());
                }
                Err(e) => {
                    warn!(tenant = target.label(), error = %e,
                        "claim failed; its events stay in the outbox, other tenants are still served");
                    // The default schema's error decides whether the relay can go on.
                    if target.tenant.is_none() || failed.is_none() {
                        failed = Some(e);
                    }
                }
            }
        }
        match failed {
            Some(e) if served == 0 => Err(e),
            _ => Ok(result),
        }
    }

    /// How long until the earliest outstanding event is due, or `None` when nothing is left.
    async fn next_due(&self, targets: &[Target]) -> Result<Option<Duration>> {
        let mut due: Option<Duration> = None;
        for target in targets {
            let ordered = &self.inner.config.ordered_aggregate_types;
            if let Some(d) = self.inner.store.backlog(target, ordered).await?.next_due_in {
                due = Some(due.map_or(d, |cur| cur.min(d)));
            }
        }
        Ok(due)
    }
}
