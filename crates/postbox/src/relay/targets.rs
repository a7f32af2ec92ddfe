//! The targets a relay serves — the default schema and every active tenant — and, for each, what
//! the relay knows of it: whether a claim is due, whether it had events lately (busy), the last
//! head of its id sequence, and whether ids that head handed out may still commit unseen.
//!
//! A relay serving a thousand tenants cannot claim from each of them at every wake-up: a round
//! of claims over every target costs a few statements per target, most of them idle. So a
//! target is claimed when something says it has work — a notification naming it, its head
//! moving, its last claim coming back full, a retry of its coming due, the due probe finding an
//! event ready — and, while it is busy, at the busy pace only as long as ids its head handed out
//! may still commit (a transaction between its insert and its commit). Idle targets cost one
//! read of their id sequence now and then (at most [`HEAD_READS_PER_SECOND`] across all of them)
//! and one call of their backlog function per due sweep ([`DUE_READS_PER_SECOND`]).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Duration;

use tokio::time::Instant;
use tracing::{info, warn};

use crate::error::{Error, Result};
use crate::schema::{SchemaName, Target};
use crate::store::{RejectedTenant, Store, TenantStatus};

/// Sequence heads a relay reads per second at most while its targets are idle (a read costs the
/// server about a microsecond and a half each, in statements of [`HEADS_PER_READ`]): the heads
/// of up to this many targets are read every `head_poll_interval`, and of more every
/// `targets / HEAD_READS_PER_SECOND` seconds (a thousand tenants: every 50 ms; ten thousand:
/// every half second). Busy targets' heads are read every `head_poll_interval` besides.
pub(super) const HEAD_READS_PER_SECOND: usize = 20_000;

/// How often a relay none of whose targets is busy reads heads, at the least (see
/// `RelayConfig::head_poll_interval`): the longest the first row of a producer that does not
/// notify waits after a quiet spell, against a wake-up every `head_poll_interval` while nothing
/// happens (10 ms cost an idle relay about 3 % of a core; 100 ms, a tenth of that).
pub(super) const QUIET_HEAD_POLL: Duration = Duration::from_millis(100);

/// The most heads one statement reads: each read takes a lock on the sequence until the
/// statement ends, and the server's lock table is shared by every session.
pub(super) const HEADS_PER_READ: usize = 500;

/// Targets whose backlog the due sweep reads per second at most: every target is looked at
/// every `poll_interval`, or every `targets / DUE_READS_PER_SECOND` seconds where that is
/// longer (ten thousand tenants: every 50 s). The sweep finds what nothing else announces: a
/// retry another relay scheduled coming due, a lease a dead relay left, an operator's retry, a
/// row whose transaction committed long after its insert.
pub(super) const DUE_READS_PER_SECOND: usize = 200;

/// What the relay's timing settings say of when to look at a target.
#[derive(Clone, Copy, Debug)]
pub(super) struct Pace {
    /// `RelayConfig::poll_interval`: the due sweep's period (at most), and the pace of claims
    /// of an idle target whose ids may still commit.
    pub(super) poll: Duration,
    /// `RelayConfig::busy_poll_interval`: the pace of claims of a busy target whose ids may
    /// still commit, or whose head cannot be read.
    pub(super) busy_poll: Duration,
    /// `RelayConfig::busy_period`.
    pub(super) busy_period: Duration,
    /// `RelayConfig::head_poll_interval`; `None`: heads are not read.
    pub(super) heads: Option<Duration>,
}

/// What the relay knows of one target.
#[derive(Clone, Debug, Default)]
struct Watch {
    /// A claim is due at the next round: something said it has work.
    due: bool,
    /// A claim is due when nothing said to have work waits (a sweep of every target: at
    /// start-up, after notifications may have been lost, when a caller asked).
    swept: bool,
    /// Until when it counts as busy: it had events lately.
    busy_until: Option<Instant>,
    /// Ids its head handed out may still commit unseen by this relay's claims: its head moved
    /// since a claim whose commit horizon reached the head read before it.
    unsettled: bool,
    /// Its last claim came back full: a backlog.
    backlog: bool,
    /// When it was last claimed.
    claimed_at: Option<Instant>,
    /// The last head of its id sequence read (`None`: not read yet, or it cannot be).
    head: Option<i64>,
}

impl Watch {
    fn busy(&self, now: Instant) -> bool {
        self.busy_until.is_some_and(|until| until > now)
    }
}

/// What one claim of a target found, for [`Targets::claimed`].
#[derive(Clone, Copy, Debug)]
pub(super) struct ClaimSeen {
    /// It took an event.
    pub(super) any: bool,
    /// It came back full: more is waiting.
    pub(super) full: bool,
    /// The commit horizon the claim knew (see `Pipeline::settled_through`); `None` where the
    /// relay keeps none.
    pub(super) settled_through: Option<i64>,
    /// The store's ids follow commit order: what its head handed out is committed.
    pub(super) ids_in_commit_order: bool,
}

/// The targets of one round ([`Targets::round`]).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Round {
    /// Those something said have work, or whose pace has come: all claimed.
    pub(super) urgent: Vec<Target>,
    /// Those due by a sweep only: claimed after the urgent ones, as many as the round's time
    /// allows; the rest stay due for the next round.
    pub(super) swept: Vec<Target>,
}

impl Round {
    pub(super) fn len(&self) -> usize {
        self.urgent.len() + self.swept.len()
    }
}

/// The targets to serve, what the relay knows of each, and when the registry was last read.
pub(super) struct Targets {
    pace: Pace,
    list: Vec<Target>,
    /// What the relay knows of each target, in `list`'s order.
    watch: Vec<Watch>,
    /// Each target's place in `list`.
    index: HashMap<SchemaName, usize>,
    /// The targets that are due, busy or unsettled (by place in `list`): the only ones a round
    /// or the next wake-up looks at, so that their cost is that of the targets with work, not
    /// of every target. Quiet ones leave it when a round finds them so.
    active: BTreeSet<usize>,
    read_at: Option<Instant>,
    next_start: usize,
    /// Targets left out until the next registry read: their tables are missing (a tenant
    /// schema dropped by hand) or otherwise need an operator.
    parked: HashMap<SchemaName, String>,
    /// Registry rows that cannot be served, as last reported.
    rejected: Vec<RejectedTenant>,
    /// Where the next read of idle targets' heads starts in `list`, and when it is due.
    heads_next: usize,
    heads_at: Option<Instant>,
    /// Where the due sweep goes on in `list`, and when its next read is due.
    sweep_next: usize,
    sweep_at: Option<Instant>,
}

impl Targets {
    pub(super) fn new(pace: Pace) -> Self {
        Targets {
            pace,
            list: Vec::new(),
            watch: Vec::new(),
            index: HashMap::new(),
            active: BTreeSet::new(),
            read_at: None,
            next_start: 0,
            parked: HashMap::new(),
            rejected: Vec::new(),
            heads_next: 0,
            heads_at: None,
            sweep_next: 0,
            sweep_at: None,
        }
    }

    /// The served targets.
    pub(super) fn list(&self) -> &[Target] {
        &self.list
    }

    /// Re-reads the tenant registry when `refresh` has passed since the last read. A target
    /// new to the relay is claimed at once (and so is every target at the first read).
    pub(super) async fn refresh(&mut self, store: &dyn Store, refresh: Duration) -> Result<()> {
        if let Some(at) = self.read_at
            && at.elapsed() < refresh
        {
            return Ok(());
        }
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
        let rejected = store.tenant_rejected().await.unwrap_or_default();
        if rejected != self.rejected {
            for r in &rejected {
                warn!(tenant = %r.id, schema = %r.schema, reason = %r.reason,
                    "tenant registry row cannot be served; skipped (fix or remove the row)");
            }
            self.rejected = rejected;
        }
        // Parked targets get another chance with every registry read.
        let parked: Vec<SchemaName> = self.parked.drain().map(|(schema, _)| schema).collect();
        for schema in &parked {
            self.due(schema, false);
        }
        if list != self.list {
            if list.len() <= 20 {
                info!(targets = ?list.iter().map(Target::label).collect::<Vec<_>>(), "serving");
            } else {
                info!(
                    targets = list.len(),
                    tenants = list.len() - 1,
                    "serving the default schema and every active tenant"
                );
            }
            let mut old: HashMap<SchemaName, Watch> = self
                .list
                .iter()
                .zip(std::mem::take(&mut self.watch))
                .map(|(t, w)| (t.schema.clone(), w))
                .collect();
            self.watch = list
                .iter()
                .map(|t| {
                    old.remove(&t.schema).unwrap_or_else(|| Watch {
                        due: true,
                        ..Watch::default()
                    })
                })
                .collect();
            self.index = list
                .iter()
                .enumerate()
                .map(|(i, t)| (t.schema.clone(), i))
                .collect();
            self.active = (0..list.len())
                .filter(|&i| self.watch[i].due || self.watch[i].swept)
                .collect();
            // What was active stays so: its watch came along.
            let now = Instant::now();
            for (i, w) in self.watch.iter().enumerate() {
                if w.unsettled || w.busy(now) {
                    self.active.insert(i);
                }
            }
            self.list = list;
        }
        self.read_at = Some(Instant::now());
        Ok(())
    }

    /// Every target is claimed at the next round (a sweep: start-up, a lost notification, a
    /// caller waiting for the relay to have looked everywhere).
    pub(super) fn all_due(&mut self) {
        for w in &mut self.watch {
            w.swept = true;
        }
        self.active = (0..self.list.len()).collect();
    }

    /// The target of `schema` is claimed at the next round; with `busy`, it counts as busy too
    /// (a notification named it: the events committed right after it are found by the busy
    /// pace). Unknown schemas are ignored.
    pub(super) fn due(&mut self, schema: &SchemaName, busy: bool) {
        let busy_until = busy.then(|| Instant::now() + self.pace.busy_period);
        if let Some(&i) = self.index.get(schema) {
            let w = &mut self.watch[i];
            w.due = true;
            if busy_until.is_some() {
                w.busy_until = w.busy_until.max(busy_until);
            }
            self.active.insert(i);
        }
    }

    /// Whether `target`'s last claim came back full: it has a backlog.
    pub(super) fn is_backlog(&self, target: &Target) -> bool {
        self.index
            .get(&target.schema)
            .is_some_and(|&i| self.watch[i].backlog)
    }

    /// Whether a target other than `target` and without a backlog had events lately (is busy):
    /// a backlog's claims then stay small (see `Pipeline::claim_later`).
    pub(super) fn others_busy(&self, target: &Target) -> bool {
        let now = Instant::now();
        self.active.iter().any(|&i| {
            let w = &self.watch[i];
            !w.backlog && w.busy(now) && self.list[i].schema != target.schema
        })
    }

    /// Whether `schema` names a served target.
    pub(super) fn serves(&self, schema: &SchemaName) -> bool {
        self.index.contains_key(schema)
    }

    /// When `w`'s next claim is due (see [`Self::round`]), if one is.
    fn paced(&self, w: &Watch, now: Instant) -> Option<Instant> {
        if w.due || w.swept {
            return Some(now);
        }
        self.pace_at(w, now)
    }

    /// When `w`'s next claim is due by its pace alone: busy, or unsettled.
    fn pace_at(&self, w: &Watch, now: Instant) -> Option<Instant> {
        let busy = w.busy(now);
        let watched = self.pace.heads.is_some() && w.head.is_some();
        let pace = if w.unsettled {
            // Ids its head handed out may still commit: claimed again at the busy pace while
            // it is busy, at the poll's afterwards (a transaction held open).
            if busy {
                self.pace.busy_poll
            } else {
                self.pace.poll
            }
        } else if busy && !watched {
            // A busy target whose head is not read is claimed at the busy pace.
            self.pace.busy_poll
        } else {
            return None;
        };
        Some(w.claimed_at.map_or(now, |at| at + pace))
    }

    /// The targets whose claim is due — named by a notification, a moved head, a full claim, a
    /// retry come due, the due sweep, or their pace (busy, or unsettled: ids their head handed
    /// out may still commit) —, starting one further along each round so that no target always
    /// goes first. Parked targets are left out, and so are those `blocked` says cannot be
    /// claimed now (their destinations are down, or their ordered events wait for this relay's
    /// own): they stay due. Quiet targets leave the active set. The targets due by a sweep
    /// only come last (see [`Round::swept`]).
    pub(super) fn round(&mut self, blocked: impl Fn(&Target) -> bool) -> Round {
        let now = Instant::now();
        let n = self.list.len();
        let start = self.next_start % n.max(1);
        self.next_start = self.next_start.wrapping_add(1);
        let mut quiet = Vec::new();
        let mut due = Round::default();
        // In place order from `start` on, then from the first up to it.
        for &i in self.active.range(start..).chain(self.active.range(..start)) {
            let w = &self.watch[i];
            let t = &self.list[i];
            let paced = self.pace_at(w, now);
            if !w.due && !w.swept && paced.is_none() {
                if !w.busy(now) {
                    quiet.push(i);
                }
                continue;
            }
            if self.parked.contains_key(&t.schema) || blocked(t) {
                continue;
            }
            if w.due || paced.is_some_and(|at| at <= now) {
                due.urgent.push(t.clone());
            } else if w.swept {
                due.swept.push(t.clone());
            }
        }
        for i in quiet {
            self.active.remove(&i);
        }
        // Backlogs after the targets with a few new events: those are claimed first.
        due.urgent.sort_by_key(|t| self.is_backlog(t));
        due
    }

    /// Records a claim of `target`: a full one is due again at once; one that took events
    /// makes the target busy; one whose commit horizon reached the head read before it leaves
    /// nothing its head handed out unseen.
    pub(super) fn claimed(&mut self, target: &Target, seen: ClaimSeen) {
        let now = Instant::now();
        let busy_period = self.pace.busy_period;
        let Some(&i) = self.index.get(&target.schema) else {
            return;
        };
        let w = &mut self.watch[i];
        w.claimed_at = Some(now);
        w.due = seen.full;
        w.backlog = seen.full;
        w.swept = false;
        if seen.any && !busy_period.is_zero() {
            w.busy_until = w.busy_until.max(Some(now + busy_period));
        }
        // A head not read yet says of no id that it may be unseen: the first read is where
        // the next ones start (a row inserted before it and committed after this claim is the
        // due sweep's to find).
        let settled = seen.ids_in_commit_order
            || w.head.is_none()
            || seen
                .settled_through
                .is_some_and(|settled| w.head.is_some_and(|head| settled >= head));
        w.unsettled = !settled;
    }

    /// A claim of `target` failed: it is tried again at its pace, as one whose ids may still
    /// commit, rather than at once.
    pub(super) fn failed(&mut self, target: &Target) {
        if let Some(&i) = self.index.get(&target.schema) {
            let w = &mut self.watch[i];
            w.claimed_at = Some(Instant::now());
            w.due = false;
            w.swept = false;
            w.unsettled = true;
        }
    }

    /// Leaves `target` out until the next registry read; logs it once.
    pub(super) fn park(&mut self, target: &Target, reason: &str) {
        if self
            .parked
            .insert(target.schema.clone(), reason.to_owned())
            .is_none()
        {
            warn!(
                tenant = target.label(),
                reason,
                "target cannot be served; skipped until the tenant registry is read again, other tenants are still served"
            );
        }
    }

    /// The period of a full pass over `n` targets at `per_second` reads, and never shorter
    /// than `floor`.
    fn period(n: usize, per_second: usize, floor: Duration) -> Duration {
        floor.max(Duration::from_secs_f64(n as f64 / per_second as f64))
    }

    /// The targets whose heads are read now, if a read is due: every busy one, and the next
    /// share of the rest (see [`HEAD_READS_PER_SECOND`]); empty when heads are not read or no
    /// read is due.
    pub(super) fn heads_due(&mut self) -> Vec<Target> {
        let Some(every) = self.pace.heads else {
            return Vec::new();
        };
        let now = Instant::now();
        if self.heads_at.is_some_and(|at| at > now) || self.list.is_empty() {
            return Vec::new();
        }
        // A relay none of whose targets had events lately reads less often: each read wakes it
        // and costs a round trip, the most of what an idle relay spends.
        let quiet = !self.active.iter().any(|&i| self.watch[i].busy(now));
        let every = if quiet {
            every.max(QUIET_HEAD_POLL)
        } else {
            every
        };
        self.heads_at = Some(now + every);
        let n = self.list.len();
        // The share of idle targets one read takes: a full pass per period.
        let period = Self::period(n, HEAD_READS_PER_SECOND, every);
        let share =
            ((n as f64 * every.as_secs_f64() / period.as_secs_f64()).ceil() as usize).clamp(1, n);
        let mut read: Vec<usize> = self
            .active
            .iter()
            .copied()
            .filter(|&i| self.watch[i].busy(now))
            .collect();
        let busy: HashSet<usize> = read.iter().copied().collect();
        read.extend(
            (0..share)
                .map(|k| (self.heads_next + k) % n)
                .filter(|i| !busy.contains(i)),
        );
        self.heads_next = (self.heads_next + share) % n;
        read.into_iter()
            .map(|i| &self.list[i])
            .filter(|t| !self.parked.contains_key(&t.schema))
            .cloned()
            .collect()
    }

    /// The heads last read of `targets`, in order (`None`: not read yet).
    pub(super) fn heads_known(&self, targets: &[Target]) -> Vec<Option<i64>> {
        targets
            .iter()
            .map(|t| self.index.get(&t.schema).and_then(|&i| self.watch[i].head))
            .collect()
    }

    /// Takes in the heads of `targets` that moved (their place in `targets`, and the head read;
    /// `None`: cannot tell): a head that moved from one read before makes its target due, busy,
    /// and unsettled until a claim sees past it; a first read is where the next ones start.
    pub(super) fn heads_read(&mut self, targets: &[Target], moved: &[(usize, Option<i64>)]) {
        let now = Instant::now();
        let busy_period = self.pace.busy_period;
        for (place, head) in moved {
            let Some(target) = targets.get(*place) else {
                continue;
            };
            let Some(&i) = self.index.get(&target.schema) else {
                continue;
            };
            let w = &mut self.watch[i];
            if let (Some(last), Some(head)) = (w.head, head)
                && last != *head
            {
                w.due = true;
                w.unsettled = true;
                w.busy_until = w.busy_until.max(Some(now + busy_period));
                self.active.insert(i);
            }
            w.head = *head;
        }
    }

    /// Heads cannot be read (the relay's role may not read the sequences): targets are found by
    /// notifications, the busy pace and the due sweep only.
    pub(super) fn heads_unreadable(&mut self) {
        self.pace.heads = None;
    }

    /// The targets whose backlog the due sweep reads now, if a read is due (see
    /// [`DUE_READS_PER_SECOND`]): a share of every target, so that each is read once per
    /// `poll_interval` or longer period — but for those claimed within half that period: a
    /// claim finds whatever the backlog would say is due, and the backlog's read walks what marks
    /// left in the polling index (all of it while a transaction is held open).
    pub(super) fn sweep_due(&mut self, per_read: usize) -> Vec<Target> {
        let now = Instant::now();
        if self.sweep_at.is_some_and(|at| at > now) || self.list.is_empty() {
            return Vec::new();
        }
        let n = self.list.len();
        let period = Self::period(n, DUE_READS_PER_SECOND, self.pace.poll);
        let share = per_read.clamp(1, n);
        // `share` targets now, the next share after its part of the period.
        self.sweep_at = Some(now + period.mul_f64(share as f64 / n as f64));
        let read: Vec<Target> = (0..share)
            .map(|k| (self.sweep_next + k) % n)
            .filter(|&i| {
                self.watch[i]
                    .claimed_at
                    .is_none_or(|at| at + period / 2 <= now)
            })
            .map(|i| &self.list[i])
            .filter(|t| !self.parked.contains_key(&t.schema))
            .cloned()
            .collect();
        self.sweep_next = (self.sweep_next + share) % n;
        read
    }

    /// When the relay next has something to look at or claim without being told: the next
    /// heads read, the next share of the due sweep, the next paced claim (of targets not
    /// `blocked`: see [`Self::round`]).
    pub(super) fn next_look(&self, blocked: impl Fn(&Target) -> bool) -> Option<Instant> {
        let now = Instant::now();
        let mut next = [self.heads_at, self.sweep_at].into_iter().flatten().min();
        for &i in &self.active {
            let t = &self.list[i];
            if self.parked.contains_key(&t.schema) || blocked(t) {
                continue;
            }
            if let Some(at) = self.paced(&self.watch[i], now) {
                next = Some(next.map_or(at, |n| n.min(at)));
            }
        }
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pace() -> Pace {
        Pace {
            poll: Duration::from_secs(5),
            busy_poll: Duration::from_millis(10),
            busy_period: Duration::from_secs(1),
            heads: Some(Duration::from_millis(10)),
        }
    }

    fn targets(n: usize) -> Targets {
        let mut t = Targets::new(pace());
        t.list = (0..n)
            .map(|i| {
                Target::default_schema(SchemaName::new(&format!("s{i}")).expect("a schema name"))
            })
            .collect();
        t.watch = vec![Watch::default(); n];
        t.index = t
            .list
            .iter()
            .enumerate()
            .map(|(i, t)| (t.schema.clone(), i))
            .collect();
        t
    }

    fn seen(any: bool, settled_through: i64) -> ClaimSeen {
        ClaimSeen {
            any,
            full: false,
            settled_through: Some(settled_through),
            ids_in_commit_order: false,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_target_is_claimed_only_when_something_names_it() {
        let mut t = targets(3);
        assert!(t.round(|_| false).len() == 0, "nothing due: no claim");
        let s1 = t.list[1].schema.clone();
        t.due(&s1, true);
        assert_eq!(t.round(|_| false).urgent, vec![t.list[1].clone()]);
        t.claimed(&t.list[1].clone(), seen(true, 0));
        assert!(
            t.round(|_| false).len() == 0,
            "settled: no claim at the busy pace"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_backlog_counts_others_busy_only_while_a_target_without_one_had_events() {
        let mut t = targets(3);
        let all = t.list.clone();
        let full = ClaimSeen {
            full: true,
            ..seen(true, 0)
        };
        t.due(&all[0].schema, true);
        t.claimed(&all[0], full);
        assert!(!t.others_busy(&all[0]), "alone with its backlog");
        t.due(&all[1].schema, true);
        t.claimed(&all[1], full);
        assert!(!t.others_busy(&all[0]), "another backlog does not count");
        t.due(&all[2].schema, true);
        t.claimed(&all[2], seen(true, 0));
        assert!(t.others_busy(&all[0]), "a target with a few new events");
        assert!(!t.others_busy(&all[2]), "not for itself");
        tokio::time::advance(pace().busy_period).await;
        assert!(!t.others_busy(&all[0]), "quiet again");
    }

    #[tokio::test(start_paused = true)]
    async fn a_moved_head_is_claimed_at_the_busy_pace_until_a_claim_sees_past_it() {
        let mut t = targets(2);
        let all = t.list.clone();
        t.heads_read(&all, &[(0, Some(5)), (1, Some(7))]);
        assert!(
            t.round(|_| false).len() == 0,
            "the first read is the baseline"
        );
        t.heads_read(&all, &[(0, Some(6))]);
        assert_eq!(t.round(|_| false).urgent, vec![all[0].clone()]);
        // The insert has not committed: the claim's horizon is below the head.
        t.claimed(&all[0], seen(false, 5));
        assert!(t.round(|_| false).len() == 0, "not before the busy pace");
        tokio::time::advance(Duration::from_millis(10)).await;
        assert_eq!(
            t.round(|_| false).urgent,
            vec![all[0].clone()],
            "again at the busy pace"
        );
        t.claimed(&all[0], seen(true, 6));
        tokio::time::advance(Duration::from_millis(50)).await;
        assert!(t.round(|_| false).len() == 0, "settled");
    }

    #[tokio::test(start_paused = true)]
    async fn a_transaction_held_open_is_claimed_again_at_the_poll_once_the_target_is_quiet() {
        let mut t = targets(1);
        let all = t.list.clone();
        t.heads_read(&all, &[(0, Some(1))]);
        t.heads_read(&all, &[(0, Some(2))]);
        t.claimed(&all[0], seen(false, 1));
        tokio::time::advance(Duration::from_millis(1500)).await;
        t.claimed(&all[0], seen(false, 1));
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(t.round(|_| false).len() == 0, "quiet: not at the busy pace");
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(t.round(|_| false).urgent, all, "at the poll");
    }

    #[tokio::test(start_paused = true)]
    async fn the_heads_of_many_targets_are_read_a_share_at_a_time() {
        let mut t = targets(1000);
        // Busy: heads are read every head_poll_interval.
        let s0 = t.list[0].schema.clone();
        t.due(&s0, true);
        let first = t.heads_due();
        // 1,000 targets at 20,000 reads/s: a pass every 50 ms, a fifth per 10 ms (the busy one
        // among them).
        assert_eq!(first.len(), 200);
        assert!(t.heads_due().is_empty(), "not before the next 10 ms");
        tokio::time::advance(Duration::from_millis(10)).await;
        let second = t.heads_due();
        assert_eq!(second.len(), 201, "the next fifth, and the busy one");
        assert_ne!(first[1], second[1]);
        // A busy target is read every time besides.
        let busy = t.list[999].schema.clone();
        t.due(&busy, true);
        tokio::time::advance(Duration::from_millis(10)).await;
        let third = t.heads_due();
        assert!(third.iter().any(|x| x.schema == busy));
        assert_eq!(third.len(), 202);
        // Quiet: every 100 ms, the share of a pass every 100 ms.
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(t.heads_due().len(), 1000);
        tokio::time::advance(Duration::from_millis(50)).await;
        assert!(t.heads_due().is_empty());
        tokio::time::advance(Duration::from_millis(50)).await;
        assert_eq!(t.heads_due().len(), 1000);
    }

    #[tokio::test(start_paused = true)]
    async fn the_due_sweep_reads_every_target_once_per_period() {
        let mut t = targets(10_000);
        let mut read = 0;
        let start = Instant::now();
        while read < 10_000 {
            let share = t.sweep_due(200);
            read += share.len();
            if share.is_empty() {
                tokio::time::advance(Duration::from_millis(100)).await;
            }
        }
        // 10,000 targets at 200 a second: 50 s.
        let took = start.elapsed();
        assert!(
            took >= Duration::from_secs(49) && took <= Duration::from_secs(51),
            "{took:?}"
        );
        let mut small = targets(10);
        assert_eq!(small.sweep_due(200).len(), 10);
        assert!(small.sweep_due(200).is_empty());
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(small.sweep_due(200).len(), 10, "every poll_interval");
    }
}
