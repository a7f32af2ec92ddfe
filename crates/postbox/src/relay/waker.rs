//! When the relay runs its next round: at once while batches come back full, on a notification
//! (`NOTIFY`), when a retry it scheduled comes due, every `busy_poll_interval` for targets that
//! had events lately, and every `poll_interval` otherwise. The timing is the pure function
//! [`next_round`]; the [`Waker`] waits for whichever comes first.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::error::Result;
use crate::schema::{SchemaName, Target};
use crate::store::{Store, Wakeups};

/// Scheduled retries a relay remembers for waking up on time.
const MAX_REMEMBERED_RETRIES: usize = 10_000;

/// What the timing of the next round depends on.
#[derive(Clone, Copy, Debug)]
pub(super) struct Timing {
    /// `RelayConfig::poll_interval`.
    pub(super) poll_interval: Duration,
    /// `RelayConfig::busy_poll_interval`.
    pub(super) busy_poll_interval: Duration,
}

/// The next round: how long to wait for it, and whether it serves only the busy targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct NextRound {
    pub(super) wait: Duration,
    pub(super) busy_only: bool,
}

/// When to run the next round of a running relay whose last round came back with no full
/// batch. A full round (every target) is due `poll_interval` after the last one, or when the
/// earliest retry this relay scheduled comes due (`next_retry`, from now), whichever is sooner;
/// meanwhile, while a target is busy, busy-only rounds run every `busy_poll_interval`, at a
/// fixed pace from the start of the last round (`round_started`). No query runs per idle round.
pub(super) fn next_round(
    timing: Timing,
    now: Instant,
    last_full: Instant,
    round_started: Instant,
    next_retry: Option<Duration>,
    any_busy: bool,
) -> NextRound {
    let full_wait = next_retry.map_or(timing.poll_interval, |d| {
        d.clamp(Duration::from_millis(5), timing.poll_interval)
    });
    let full_at = (last_full + timing.poll_interval).min(now + full_wait);
    let until_full = full_at.saturating_duration_since(now);
    if any_busy && timing.busy_poll_interval < until_full {
        let since_round = now.saturating_duration_since(round_started);
        NextRound {
            wait: timing.busy_poll_interval.saturating_sub(since_round),
            busy_only: true,
        }
    } else {
        NextRound {
            wait: until_full,
            busy_only: false,
        }
    }
}

/// What ended a wait.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Woken {
    /// A notification: events may have been committed in any target.
    Hint,
    /// The wait ran out.
    Timeout,
    /// Rows were inserted in these targets (their heads moved); they may not be committed yet.
    Rows(Vec<Target>),
    /// Shutdown.
    Stop,
}

/// The notification listener (where the store has one), reconnected when it breaks, and the
/// watch on the targets' heads.
pub(super) struct Waker {
    enabled: bool,
    listener: Option<Box<dyn Wakeups>>,
    heads: Option<Heads>,
}

/// The last id each target's sequence handed out, checked every `every` while the relay waits:
/// a moved head means rows were inserted (by any producer, notifying or not).
struct Heads {
    every: Duration,
    last: HashMap<SchemaName, i64>,
}

impl Heads {
    /// The targets whose head moved since the last look (none on the first look at a target).
    async fn moved(&mut self, store: &dyn Store, targets: &[Target]) -> Result<Vec<Target>> {
        let heads = store.outbox_heads(targets).await?;
        let mut moved = Vec::new();
        for (target, head) in targets.iter().zip(heads) {
            let Some(head) = head else { continue };
            if let Some(last) = self.last.insert(target.schema.clone(), head)
                && last != head
            {
                moved.push(target.clone());
            }
        }
        Ok(moved)
    }
}

impl Waker {
    /// A waker that listens for notifications when `enabled` (running relays with
    /// notifications on); draining relays compute their own wake-ups.
    pub(super) async fn start(
        store: &dyn Store,
        enabled: bool,
        head_poll: Option<Duration>,
    ) -> Waker {
        let mut waker = Waker {
            enabled,
            listener: None,
            heads: head_poll.map(|every| Heads {
                every,
                last: HashMap::new(),
            }),
        };
        waker.connect(store).await;
        waker
    }

    async fn connect(&mut self, store: &dyn Store) {
        if !self.enabled || self.listener.is_some() {
            return;
        }
        match store.wakeups().await {
            Ok(listener) => self.listener = listener,
            Err(e) => debug!(error = %e, "no notification listener; polling only"),
        }
    }

    /// Waits for a notification, new rows in one of `targets`, `wait`, or shutdown.
    pub(super) async fn wait(
        &mut self,
        store: &dyn Store,
        wait: Duration,
        stop: &mut watch::Receiver<bool>,
        targets: &[Target],
    ) -> Woken {
        let Some(every) = self.heads.as_ref().map(|h| h.every).filter(|e| *e < wait) else {
            return self.wait_once(store, wait, stop).await;
        };
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Woken::Timeout;
            }
            match self.wait_once(store, every.min(left), stop).await {
                Woken::Timeout => {}
                woken => return woken,
            }
            let Some(heads) = self.heads.as_mut() else {
                continue;
            };
            match heads.moved(store, targets).await {
                Ok(moved) if !moved.is_empty() => return Woken::Rows(moved),
                Ok(_) => {}
                Err(e) => {
                    warn!(error = %e,
                        "cannot read the outbox id sequences; new rows of producers that do not \
                         NOTIFY are found at the next poll only (grant the relay's role USAGE on \
                         the outbox_events_id_seq sequences)");
                    self.heads = None;
                }
            }
        }
    }

    /// Waits for a notification, `wait`, or shutdown.
    async fn wait_once(
        &mut self,
        store: &dyn Store,
        wait: Duration,
        stop: &mut watch::Receiver<bool>,
    ) -> Woken {
        self.connect(store).await;
        let stopped = |s: bool| if s { Woken::Stop } else { Woken::Timeout };
        match &mut self.listener {
            Some(listener) => tokio::select! {
                hint = listener.next() => {
                    if let Err(e) = hint {
                        debug!(error = %e, "notification listener lost; polling until it reconnects");
                        self.listener = None;
                    }
                    Woken::Hint
                }
                s = wait_or_stop(wait, stop) => stopped(s),
            },
            None => stopped(wait_or_stop(wait, stop).await),
        }
    }
}

/// The retries this relay scheduled, earliest first, so an idle relay wakes for them rather
/// than at its next poll. Wake-up times only: whether an event is due is decided by the
/// database clock.
#[derive(Default)]
pub(super) struct RetrySchedule {
    retries: Mutex<BinaryHeap<Reverse<Instant>>>,
}

impl RetrySchedule {
    /// Remembers a retry scheduled `after` from now.
    pub(super) fn note(&self, after: Duration) {
        let mut retries = self
            .retries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Bounded: past this many, later retries are found by polling.
        if retries.len() < MAX_REMEMBERED_RETRIES {
            retries.push(Reverse(Instant::now() + after));
        }
    }

    /// Time until the earliest retry still ahead (zero if one has just come due); retries
    /// already passed are forgotten.
    pub(super) fn until_next(&self) -> Option<Duration> {
        let mut retries = self
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
}

/// Sleeps for `wait` unless shutdown comes first; returns true on shutdown.
pub(super) async fn wait_or_stop(wait: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    if *stop.borrow() {
        return true;
    }
    tokio::select! {
        () = tokio::time::sleep(wait) => false,
        _ = stop.wait_for(|s| *s) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMING: Timing = Timing {
        poll_interval: Duration::from_secs(5),
        busy_poll_interval: Duration::from_millis(10),
    };

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_relay_waits_for_its_poll_or_its_next_retry() {
        let start = Instant::now();
        tokio::time::advance(ms(1000)).await;
        let now = Instant::now();
        let idle = next_round(TIMING, now, start, now, None, false);
        assert_eq!(
            idle,
            NextRound {
                wait: ms(4000),
                busy_only: false
            }
        );
        let retry = next_round(TIMING, now, start, now, Some(ms(1500)), false);
        assert_eq!(
            retry,
            NextRound {
                wait: ms(1500),
                busy_only: false
            }
        );
        // A retry that came due is served at once (after 5 ms, not in a tight loop).
        let due = next_round(TIMING, now, start, now, Some(Duration::ZERO), false);
        assert_eq!(due.wait, ms(5));
        tokio::time::advance(ms(4500)).await;
        let late = next_round(TIMING, Instant::now(), start, now, None, false);
        assert_eq!(late.wait, Duration::ZERO, "the poll is overdue");
    }

    #[tokio::test(start_paused = true)]
    async fn a_busy_relay_polls_its_busy_targets_at_a_fixed_pace() {
        let last_full = Instant::now();
        let round_started = Instant::now();
        tokio::time::advance(ms(3)).await;
        let busy = next_round(TIMING, Instant::now(), last_full, round_started, None, true);
        assert_eq!(
            busy,
            NextRound {
                wait: ms(7),
                busy_only: true
            }
        );
        tokio::time::advance(ms(20)).await;
        let slow_round = next_round(TIMING, Instant::now(), last_full, round_started, None, true);
        assert_eq!(
            slow_round.wait,
            Duration::ZERO,
            "a round longer than the pace goes on at once"
        );
        // A full round due sooner than the next busy poll wins.
        tokio::time::advance(ms(4980)).await;
        let full = next_round(
            TIMING,
            Instant::now(),
            last_full,
            Instant::now(),
            None,
            true,
        );
        assert!(!full.busy_only);
    }

    #[tokio::test(start_paused = true)]
    async fn retries_are_remembered_until_they_come_due() {
        let schedule = RetrySchedule::default();
        assert_eq!(schedule.until_next(), None);
        schedule.note(ms(300));
        schedule.note(ms(100));
        assert_eq!(schedule.until_next(), Some(ms(100)));
        tokio::time::advance(ms(150)).await;
        assert_eq!(schedule.until_next(), Some(Duration::ZERO), "one came due");
        assert_eq!(schedule.until_next(), Some(ms(150)));
        tokio::time::advance(ms(200)).await;
        assert_eq!(schedule.until_next(), Some(Duration::ZERO));
        assert_eq!(schedule.until_next(), None);
    }
}
