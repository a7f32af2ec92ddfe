//! The relay's loop: rounds of looks and claims, the pipeline publishing and recording beside
//! them, the wait for whichever comes first — a publish finishing, a notification, the next
//! look, a retry coming due — and the drain's end.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{error, info, warn};

use super::pipeline::{CLAIMS_AT_ONCE, Pipeline, Shape};
use super::stats::Stall;
use super::targets::{ClaimSeen, HEADS_PER_READ, Pace, Targets};
use super::waker::{Heard, Listener, wait_or_stop};
use super::{Mode, Relay, RelayStats, maintenance};
use crate::backoff::Backoff;
use crate::error::{Error, Result};
use crate::metrics as metric;
use crate::schema::{SchemaName, Target};
use crate::store::BacklogFrom;

/// Targets whose backlog one read of the due sweep takes (one statement on PostgreSQL).
const DUE_PER_READ: usize = 100;

/// Up to how many targets a drain reads each one's backlog from where its claims start
/// ([`Store::backlog_from`](crate::Store::backlog_from)), one statement each; with more it reads
/// them [`DUE_PER_READ`] to a statement, from the start of each table.
const FROM_FLOOR_TARGETS: usize = 16;

/// How long a read of the due sweep waits for maintenance's statement under way (background
/// work holds one connection at a time) before it takes a connection of its own: a statement of
/// retention or the slow lane waiting for a locked tenant table does not stop the sweep.
const SWEEP_PATIENCE: Duration = Duration::from_secs(1);

/// How long a round goes on claiming from targets due by a sweep alone (at start-up, every
/// target) before it lets the relay take in what it heard and what its pipeline finished: a
/// first claim from a tenant's schema in a session costs milliseconds (its functions are
/// compiled, its tables' descriptions loaded), and a sweep of a thousand of them must not keep
/// a notified event waiting for all of them.
const SWEEP_ROUND_BUDGET: Duration = Duration::from_millis(25);

/// What one round's claims found.
#[derive(Clone, Copy, Default)]
struct Round {
    /// A claim came back full: more work is waiting.
    full: bool,
    /// A claim took an event.
    claimed: bool,
    /// An ordered claim came back short while this relay had events of its target in flight.
    behind_own: bool,
    /// Targets claimed from.
    served: usize,
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

    /// The relay's loop: rounds of looks and claims, the pipeline publishing and recording
    /// beside them, and between rounds a wait for whatever comes first.
    pub(super) async fn work(
        &self,
        mode: Mode,
        mut stop: watch::Receiver<bool>,
    ) -> Result<RelayStats> {
        let inner = &*self.inner;
        let cfg = &inner.config;
        let store = &*inner.store;
        let forever = mode == Mode::Forever;
        let mut stats = RelayStats::default();
        let mut targets = Targets::new(Pace {
            poll: cfg.poll_interval,
            busy_poll: cfg.busy_poll_interval,
            busy_period: cfg.busy_period,
            // Draining claims from every target at each round; heads would only add looks.
            heads: cfg.head_poll_interval.filter(|_| forever),
        });
        let mut pipeline = Pipeline::new(Arc::clone(&self.inner));
        // Draining waits for due times it computes itself; notifications would only add
        // wake-ups. Without them the relay finds events by its looks only.
        let mut listener = if forever && cfg.notifications {
            Listener::start(Arc::clone(&inner.store)).await
        } else {
            None
        };
        // Pauses after failed rounds: 100 ms, 200 ms, … up to the poll interval.
        let mut db_errors = Backoff::new(Duration::from_millis(100), cfg.poll_interval).attempts();
        // Maintenance and the due sweep hold one of the store's connections at most.
        let background = maintenance::Background::default();
        let mut maintenance = maintenance::Maintenance::new(
            cfg,
            Arc::clone(&inner.rounds),
            background.clone(),
            Arc::clone(&inner.labels),
        );
        let mut stall = Stall::new();
        let mut gave_up = None;
        let claim_path = store.capabilities().claim_path();
        metrics::gauge!(metric::RELAY_CLAIM_PATH, "path" => claim_path).set(1.0);
        info!(relay = %inner.id, ?mode, claim_path = %claim_path, "relay started");
        // The first round looks at every target.
        let mut sweep = true;
        // The latest sweep request (`Rounds::settle`) taken in.
        let mut requested = 0;
        // The due sweep's read under way, on a task of its own.
        let mut sweeper: Option<Sweeper> = None;
        loop {
            if *stop.borrow() {
                break;
            }
            for schema in inner.retries.take_due() {
                targets.due(&schema, false);
            }
            // What the claims that outlasted their round brought.
            for (target, claimed) in pipeline.take_late() {
                let settled = pipeline.settled_through(&target);
                self.took(
                    &mut targets,
                    &target,
                    claimed,
                    settled,
                    &mut Round::default(),
                    &mut None,
                );
            }
            let latest = inner.rounds.sweep().latest();
            sweep |= !forever || latest > requested;
            requested = latest;
            let round = async {
                targets.refresh(store, cfg.tenant_refresh).await?;
                if std::mem::take(&mut sweep) {
                    targets.all_due();
                }
                let looked = forever && self.look(&mut targets, &mut sweeper, &background).await;
                let round = self
                    .round(&mut pipeline, &mut targets, forever, &stop)
                    .await?;
                Ok::<_, Error>((round, looked))
            }
            .await;
            maintenance.tick(&inner.store, &inner.sink, &inner.id, targets.list());
            let (round, counted) = match round {
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
                    // What the failed round did not claim is looked at again.
                    sweep = true;
                    continue;
                }
            };
            if !forever {
                // Draining: publish and record; claim again as soon as there is room when more
                // is waiting.
                self.drive(&mut pipeline, &mut stats, round.full, &stop)
                    .await;
                inner.rounds.finished();
                if let Some(waited) = stall.check(&stats, cfg.drain_patience) {
                    gave_up = Some(self.give_up(&stats, &pipeline, waited));
                    break;
                }
                let ordered = !cfg.ordered_aggregate_types.is_empty();
                if round.full || (ordered && (round.claimed || round.behind_own)) || *stop.borrow()
                {
                    continue;
                }
                let from = self.backlog_from(targets.list(), &pipeline);
                let wait = match self.drain_wait(targets.list(), &from).await? {
                    None => break,
                    Some(wait) => wait,
                };
                if wait_or_stop(wait, &mut stop).await {
                    break;
                }
                continue;
            }
            if counted || round.served > 0 || round.behind_own {
                inner.rounds.finished();
            }
            // Wait for whichever comes first: the pipeline (a publish done, a mark written, its
            // window closing: recorded at once, and a slow publish holds up only itself), a
            // notification, a caller's request, the next look or claim, a retry or a pause
            // coming due, shutdown.
            let blocked = |t: &Target| {
                pipeline.is_paused(t) || pipeline.waits_for_own(t) || pipeline.is_claiming(t)
            };
            let next = [
                targets.next_look(blocked),
                inner.retries.next(),
                pipeline.next_unpause(),
            ]
            .into_iter()
            .flatten()
            .min();
            let now = Instant::now();
            // A claim due while the pipeline has no room waits for the pipeline, not the clock.
            let next = next.filter(|at| *at > now || pipeline.has_room());
            if pipeline.is_idle() && next.is_none_or(|at| at > now) {
                // Nothing due and nothing in flight: every sweep taken in is done.
                inner.rounds.swept(requested);
            } else {
                inner.rounds.waiting(false);
            }
            let sleep = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            let heard = async {
                match listener.as_mut() {
                    Some(l) => l.next().await,
                    None => std::future::pending().await,
                }
            };
            let read = async {
                match sweeper.as_mut() {
                    Some(task) => task.await.ok(),
                    None => std::future::pending().await,
                }
            };
            let stopped = async {
                let _ = stop.wait_for(|s| *s).await;
            };
            tokio::select! {
                biased;
                () = stopped => {}
                ready = pipeline.ready() => {
                    if let Err(e) = pipeline.apply(ready).await {
                        warn!(relay = %inner.id, error = %e,
                            "recording results failed; those events are taken over when their leases expire");
                    }
                    stats.add(pipeline.take_stats());
                }
                heard = heard => self.heard(heard, &mut targets),
                read = read => {
                    sweeper = None;
                    if let Some((sweep, due)) = read {
                        self.swept(&mut targets, sweep, due);
                    }
                }
                // Taken in at the loop's top (the wake-up may be for one taken already).
                () = inner.rounds.sweep().requested() => {}
                () = sleep => {}
            }
            // What else was heard meanwhile is taken in one go.
            if let Some(l) = listener.as_mut() {
                for heard in l.drain() {
                    self.heard(heard, &mut targets);
                }
            }
            inner.rounds.waiting(false);
        }
        drop(listener);
        if let Some(task) = sweeper {
            task.abort();
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

    /// Takes in a notification: the target it names is claimed at the next round, and polled
    /// briskly for a while (the producer's next events may come without one); one that names
    /// no served target makes the next round look at every target.
    fn heard(&self, heard: Heard, targets: &mut Targets) {
        let named = match heard {
            Heard::Named(schema) => SchemaName::new(&schema)
                .ok()
                .filter(|schema| targets.serves(schema)),
            Heard::Anywhere => None,
        };
        match named {
            Some(schema) => targets.due(&schema, true),
            None => targets.all_due(),
        }
    }

    /// Looks at the targets whose look is due: the heads of their id sequences (a moved head
    /// makes its target due) and a share of their backlogs (the due sweep, read on a task of
    /// its own: a first read of a tenant's backlog in a session costs milliseconds). A look
    /// that fails is logged and tried again later; returns whether the relay looked.
    async fn look(
        &self,
        targets: &mut Targets,
        sweeper: &mut Option<Sweeper>,
        background: &maintenance::Background,
    ) -> bool {
        let inner = &*self.inner;
        let store = &*inner.store;
        let mut looked = false;
        let heads = targets.heads_due();
        for chunk in heads.chunks(HEADS_PER_READ) {
            looked = true;
            let known = targets.heads_known(chunk);
            match store.outbox_heads(chunk, &known).await {
                Ok(moved) => targets.heads_read(chunk, &moved),
                Err(e) => {
                    warn!(error = %e,
                        "cannot read the outbox id sequences; new rows of producers that do not \
                         NOTIFY are found by the due sweep only (grant the relay's role USAGE on \
                         the outbox_events_id_seq sequences)");
                    targets.heads_unreadable();
                    break;
                }
            }
        }
        if sweeper.is_none() {
            let mut sweep = targets.sweep_due(DUE_PER_READ);
            sweep.retain(|target| !background.is_locked(target));
            if !sweep.is_empty() {
                let store = Arc::clone(&inner.store);
                let ordered = inner.config.ordered_aggregate_types.clone();
                let background = background.clone();
                *sweeper = Some(tokio::spawn(async move {
                    let due = background
                        .run_within(
                            SWEEP_PATIENCE,
                            read_due(&*store, &sweep, &ordered, &background),
                        )
                        .await;
                    (sweep, due)
                }));
            }
        }
        looked
    }

    /// Takes in what a read of the due sweep found: a target with an event due now is claimed,
    /// one with an event due later is claimed then; one that needs an operator is left out
    /// until the registry is read again.
    fn swept(&self, targets: &mut Targets, sweep: Vec<Target>, due: Vec<Due>) {
        for (target, due) in sweep.iter().zip(due) {
            match due {
                Due::In(d) if d.is_zero() => targets.due(&target.schema, false),
                Due::In(d) => self.inner.retries.note(&target.schema, d),
                Due::Nothing => {}
                Due::Failed(reason) => targets.park(target, &reason),
            }
        }
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
    async fn drain_wait(
        &self,
        targets: &[Target],
        from: &[Option<BacklogFrom>],
    ) -> Result<Option<Duration>> {
        let poll = self.inner.config.poll_interval;
        match self.next_due(targets, from).await {
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

    /// One claim from each target whose claim is due, while the pipeline has room (what is left
    /// stays due). Returns whether any claim came back full (more work is waiting), whether any
    /// claimed an event, and whether an ordered one came back short behind this relay's own
    /// events (or waits for them). A tenant whose claim fails is logged and skipped, so it
    /// cannot hold up the others (one whose tables are gone waits for the next registry read);
    /// a target whose destinations were all down waits for its pause. The round fails when
    /// every target failed: with the default schema's error when that one needs an operator
    /// (not migrated) — the relay then stops —, else as a transient error. With `later` (a
    /// relay that runs until stopped, not a drain), a backlog's claims are not waited for: they
    /// are taken in when they return (see `Pipeline::claim_later`).
    async fn round(
        &self,
        pipeline: &mut Pipeline,
        targets: &mut Targets,
        later: bool,
        stop: &watch::Receiver<bool>,
    ) -> Result<Round> {
        let mut result = Round::default();
        let mut failed = None;
        let mut served = 0;
        let round = targets.round(|t| pipeline.is_paused(t) || pipeline.is_claiming(t));
        let alone = round.len() == 1;
        let started = Instant::now();
        let urgent = round.urgent.len();
        let mut due = round
            .urgent
            .into_iter()
            .chain(round.swept)
            .enumerate()
            .peekable();
        let mut more = true;
        // Events were claimed from targets without a backlog: a backlog's claim waits for the
        // next round, so that theirs start publishing first.
        let mut light_claimed = false;
        while more {
            // The next few targets to claim side by side (one claim each): backlogs together,
            // the others together, while the pipeline has room for them all; past its room a
            // quiet target is claimed alone (see `Pipeline::has_room_for`).
            let mut batch: Vec<Target> = Vec::with_capacity(CLAIMS_AT_ONCE);
            while batch.len() < CLAIMS_AT_ONCE {
                let fits = |(_, t): &(usize, Target)| {
                    let backlog = targets.is_backlog(t);
                    match batch.first() {
                        None => !(backlog && light_claimed),
                        Some(first) => {
                            targets.is_backlog(first) == backlog
                                && pipeline.has_room_beside(batch.len(), !backlog, |t| {
                                    targets.is_backlog(t)
                                })
                        }
                    }
                };
                let Some((n, target)) = due.next_if(fits) else {
                    // Nothing left; or the rest waits for the next batch; or, after claims of
                    // targets without a backlog, for the next round.
                    let rest = due.peek().is_some();
                    more = !batch.is_empty() && rest;
                    // A backlog left for the next round: more work is waiting.
                    result.full |= batch.is_empty() && rest;
                    break;
                };
                if *stop.borrow() {
                    more = false;
                    break;
                }
                if !pipeline.has_room_for(&target, |t| targets.is_backlog(t)) {
                    // Left due for a later round.
                    continue;
                }
                if n >= urgent && started.elapsed() >= SWEEP_ROUND_BUDGET {
                    // The rest of the sweep waits for the next round: what was heard
                    // meanwhile, and the pipeline, go first.
                    more = false;
                    break;
                }
                if pipeline.waits_for_own(&target) {
                    // Claimed again as soon as this relay's events of it are recorded.
                    result.behind_own = true;
                    continue;
                }
                batch.push(target);
            }
            let backlogs = batch.first().is_some_and(|t| targets.is_backlog(t));
            if later && backlogs {
                // A backlog's claims are taken in when they return: the relay goes on
                // publishing, and claiming what other targets commit, meanwhile.
                for target in &batch {
                    let shape = if targets.others_busy(target) {
                        Shape::Small
                    } else if pipeline.pairs(target, alone) {
                        Shape::Pair
                    } else {
                        Shape::One
                    };
                    pipeline.claim_later(target, shape);
                    served += 1;
                }
                continue;
            }
            let claims = match batch.as_slice() {
                [] => continue,
                // A backlog that needs no order: two claims side by side.
                [target] if pipeline.pairs(target, alone) => {
                    vec![(target.clone(), pipeline.claim_pair(target).await)]
                }
                targets => pipeline.claim_each(targets).await,
            };
            let light = batch.first().is_some_and(|t| !targets.is_backlog(t));
            for (target, claimed) in claims {
                if claimed.is_ok() {
                    served += 1;
                }
                let settled = pipeline.settled_through(&target);
                let any = self.took(targets, &target, claimed, settled, &mut result, &mut failed);
                light_claimed |= light && any;
            }
        }
        result.served = served;
        match failed {
            Some(e) if served == 0 => Err(e),
            _ => Ok(result),
        }
    }

    /// Notes what a claim of `target` brought in `targets` and the round's `result`; returns
    /// whether it took an event. A tenant whose claim fails is logged and skipped (one whose
    /// tables are gone waits for the next registry read); the error is kept in `failed` when it
    /// is the default schema's or the first.
    fn took(
        &self,
        targets: &mut Targets,
        target: &Target,
        claimed: Result<super::pipeline::Claimed>,
        settled_through: Option<i64>,
        result: &mut Round,
        failed: &mut Option<Error>,
    ) -> bool {
        match claimed {
            Ok(claimed) => {
                targets.claimed(
                    target,
                    ClaimSeen {
                        any: claimed.any,
                        full: claimed.full,
                        settled_through,
                        ids_in_commit_order: self.inner.store.capabilities().ids_in_commit_order,
                    },
                );
                result.full |= claimed.full;
                result.claimed |= claimed.any;
                result.behind_own |= claimed.behind_own;
                claimed.any
            }
            Err(e) if e.needs_operator() && target.tenant.is_some() => {
                targets.park(target, &e.to_string());
                false
            }
            Err(e) => {
                targets.failed(target);
                warn!(tenant = target.label(), error = %e,
                    "claim failed; its events stay in the outbox, other tenants are still served");
                // The default schema's error decides whether the relay can go on.
                if target.tenant.is_none() || failed.is_none() {
                    *failed = Some(e);
                }
                false
            }
        }
    }

    /// Where the backlog of each of `targets` is read from (see [`Self::next_due`]): for a few
    /// targets, of a relay without ordered aggregate types, where its claims start; below lies
    /// what a transaction held open keeps of the events done since it began, which a read from
    /// the start of the table would walk at the end of every drain.
    fn backlog_from(&self, targets: &[Target], pipeline: &Pipeline) -> Vec<Option<BacklogFrom>> {
        let from = self.inner.config.ordered_aggregate_types.is_empty()
            && targets.len() <= FROM_FLOOR_TARGETS;
        targets
            .iter()
            .map(|t| if from { pipeline.backlog_from(t) } else { None })
            .collect()
    }

    /// How long until the earliest outstanding event is due, or `None` when nothing is left;
    /// each target read from `from` where it has one ([`Self::backlog_from`]).
    async fn next_due(
        &self,
        targets: &[Target],
        from: &[Option<BacklogFrom>],
    ) -> Result<Option<Duration>> {
        let ordered = &self.inner.config.ordered_aggregate_types;
        let mut due: Option<Duration> = None;
        let mut rest: Vec<Target> = Vec::new();
        for (n, target) in targets.iter().enumerate() {
            match from.get(n).and_then(Option::as_ref) {
                Some(from) => {
                    let backlog = self.inner.store.backlog_from(target, from).await?;
                    if let Some(d) = backlog.next_due_in {
                        due = Some(due.map_or(d, |cur| cur.min(d)));
                    }
                }
                None => rest.push(target.clone()),
            }
        }
        for chunk in rest.chunks(DUE_PER_READ) {
            for d in self
                .inner
                .store
                .outbox_due(chunk, ordered)
                .await?
                .into_iter()
                .flatten()
            {
                due = Some(due.map_or(d, |cur| cur.min(d)));
            }
        }
        Ok(due)
    }
}

/// The due sweep's read under way: the targets read and what each said.
type Sweeper = tokio::task::JoinHandle<(Vec<Target>, Vec<Due>)>;

/// What the due sweep found of one target.
enum Due {
    /// An event is due after this long (zero: now).
    In(Duration),
    /// Nothing is outstanding.
    Nothing,
    /// Its backlog cannot be read until an operator acts (its tables are gone).
    Failed(String),
}

/// The backlog of each of `sweep` ([`Store::outbox_due`](crate::Store::outbox_due)); where one
/// target fails the read of all, each is read on its own to find which. A table found locked
/// is left out of the sweeps for a while ([`maintenance::Background::found_locked`]).
async fn read_due(
    store: &dyn crate::Store,
    sweep: &[Target],
    ordered: &[String],
    background: &maintenance::Background,
) -> Vec<Due> {
    let due = |d: Option<Duration>| d.map_or(Due::Nothing, Due::In);
    if let Ok(all) = store.outbox_due(sweep, ordered).await {
        return all.into_iter().map(due).collect();
    }
    let mut each = Vec::with_capacity(sweep.len());
    for target in sweep {
        each.push(match store.backlog(target, ordered).await {
            Ok(b) => due(b.next_due_in),
            Err(e) if e.needs_operator() && target.tenant.is_some() => Due::Failed(e.to_string()),
            Err(e) if background.found_locked(target, &e) => Due::Nothing,
            Err(e) => {
                warn!(tenant = target.label(), error = %e,
                    "cannot read the backlog; looked at again at the next sweep");
                Due::Nothing
            }
        });
    }
    each
}
