//! A relay's rounds, counted as they finish: what a test, a health check or an embedding
//! service waits on instead of a clock ("the relay has looked again, and is waiting").
//!
//! A round is one pass of the relay's loop in which it looked at its targets: read the heads of
//! their id sequences or their backlog, and claimed from each target something said had work (a
//! notification, a moved head, a full claim, a retry come due). Publishing and recording go on
//! beside the rounds. When nothing is left to claim at once and nothing is in flight, the relay
//! waits for a wake-up, its next look, or a retry coming due.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::{Notify, watch};

/// Where a relay's loop is, as of its last change.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayProgress {
    /// Rounds finished since the relay was made (across its runs), failed rounds included.
    pub rounds: u64,
    /// Whether the relay is waiting for its next round: its last round left nothing it could
    /// claim at once, every event it claimed is published and recorded, and it is waiting for a
    /// notification, its next look or a due retry.
    pub waiting: bool,
    /// Passes of the slow lane finished (each gives the `FAILED` events that are due one more
    /// try); 0 while it is off.
    pub slow_lane_passes: u64,
}

/// Watches a relay's rounds ([`Relay::rounds`](super::Relay::rounds)).
///
/// ```no_run
/// # async fn example(relay: postbox::Relay) {
/// let mut rounds = relay.rounds();
/// let handle = relay.start();
/// // Every event committed before this line has been claimed, and the relay is idle.
/// rounds.settle().await;
/// # let _ = handle.stop().await; }
/// ```
#[derive(Clone, Debug)]
pub struct Rounds {
    rx: watch::Receiver<RelayProgress>,
    sweep: Arc<Sweep>,
}

/// A caller's request that the relay look at every target at its next round (see
/// [`Rounds::settle`]), and the relay's wake-up for it.
#[derive(Debug, Default)]
pub(super) struct Sweep {
    requested: AtomicBool,
    wake: Notify,
}

impl Sweep {
    fn request(&self) {
        self.requested.store(true, Ordering::SeqCst);
        self.wake.notify_one();
    }

    /// Whether a sweep was asked for since the last call.
    pub(super) fn take(&self) -> bool {
        self.requested.swap(false, Ordering::SeqCst)
    }

    /// Waits for a request. Cancel-safe.
    pub(super) async fn requested(&self) {
        self.wake.notified().await;
    }
}

impl Rounds {
    pub(super) fn new(rx: watch::Receiver<RelayProgress>, sweep: Arc<Sweep>) -> Self {
        Rounds { rx, sweep }
    }

    /// The relay's progress now.
    pub fn progress(&self) -> RelayProgress {
        *self.rx.borrow()
    }

    /// Waits until `n` more rounds have finished than had when it was called. The first of
    /// them may have been under way at the call; with `n ≥ 2`, at least one round ran wholly
    /// after it. Returns early only if every handle on the relay is gone.
    pub fn pass(&mut self, n: u64) -> impl Future<Output = ()> + Send + '_ {
        // Counted from the call, not from the first poll of the future.
        let target = self.progress().rounds.saturating_add(n);
        async move {
            let _ = self.rx.wait_for(|p| p.rounds >= target).await;
        }
    }

    /// Waits until `done` holds for the relay's progress; at once if it holds now. Returns
    /// early only if every handle on the relay is gone.
    pub async fn until(&mut self, mut done: impl FnMut(&RelayProgress) -> bool + Send) {
        let _ = self.rx.wait_for(|p| done(p)).await;
    }

    /// Asks the relay to look at every target it serves, and waits until a round that started
    /// after the call has finished and the relay is waiting for its next one: whatever was
    /// committed and due before the call has been claimed, published and recorded, and the
    /// relay found nothing more to claim at once. A relay that never runs out of work never
    /// settles; bound the wait with a timeout. Returns early only if every handle on the relay
    /// is gone.
    pub fn settle(&mut self) -> impl Future<Output = ()> + Send + '_ {
        // A relay claims from the targets something says have work; this asks it to look at
        // every one of them.
        self.sweep.request();
        let now = self.progress();
        // A round under way may have claimed before the call: wait for the one after it.
        let target = now.rounds + if now.waiting { 1 } else { 2 };
        async move {
            let _ = self.rx.wait_for(|p| p.rounds >= target && p.waiting).await;
        }
    }
}

/// The relay's side: the sender its loop updates.
#[derive(Debug)]
pub(super) struct Tracker {
    tx: watch::Sender<RelayProgress>,
    sweep: Arc<Sweep>,
}

impl Default for Tracker {
    fn default() -> Self {
        Tracker {
            tx: watch::channel(RelayProgress::default()).0,
            sweep: Arc::default(),
        }
    }
}

impl Tracker {
    pub(super) fn watch(&self) -> Rounds {
        Rounds::new(self.tx.subscribe(), Arc::clone(&self.sweep))
    }

    /// The callers' requests to look at every target.
    pub(super) fn sweep(&self) -> &Sweep {
        &self.sweep
    }

    /// A round finished (claims made, what they took published and recorded, or the round
    /// failed).
    pub(super) fn finished(&self) {
        self.tx.send_modify(|p| p.rounds += 1);
    }

    /// The slow lane finished a pass over every target.
    pub(super) fn slow_lane_passed(&self) {
        self.tx.send_modify(|p| p.slow_lane_passes += 1);
    }

    /// The relay starts or stops waiting for its next round.
    pub(super) fn waiting(&self, waiting: bool) {
        self.tx.send_if_modified(|p| {
            let changed = p.waiting != waiting;
            p.waiting = waiting;
            changed
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    /// Polls `fut` once: whether it is done.
    fn ready(fut: std::pin::Pin<&mut impl Future<Output = ()>>) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        matches!(fut.poll(&mut cx), Poll::Ready(()))
    }

    #[test]
    fn pass_counts_rounds_from_the_call() {
        let tracker = Tracker::default();
        tracker.finished();
        let mut rounds = tracker.watch();
        let mut pass = pin!(rounds.pass(2));
        tracker.finished();
        assert!(!ready(pass.as_mut()));
        tracker.finished();
        assert!(ready(pass.as_mut()));
    }

    #[test]
    fn settle_needs_a_whole_round_after_the_call_and_a_wait() {
        // A round is under way at the call: the one finishing next does not count.
        let tracker = Tracker::default();
        let mut rounds = tracker.watch();
        let mut settle = pin!(rounds.settle());
        tracker.finished();
        tracker.waiting(true);
        assert!(
            !ready(settle.as_mut()),
            "that round may have claimed before the call"
        );
        tracker.waiting(false);
        tracker.finished();
        assert!(!ready(settle.as_mut()), "finished, but not yet waiting");
        tracker.waiting(true);
        assert!(ready(settle.as_mut()));

        // Waiting at the call: the next round is wholly after it.
        let tracker = Tracker::default();
        tracker.finished();
        tracker.waiting(true);
        let mut rounds = tracker.watch();
        let mut settle = pin!(rounds.settle());
        assert!(!ready(settle.as_mut()));
        tracker.waiting(false);
        tracker.finished();
        tracker.waiting(true);
        assert!(ready(settle.as_mut()));
        assert_eq!(
            tracker.watch().progress(),
            RelayProgress {
                rounds: 2,
                waiting: true,
                slow_lane_passes: 0,
            }
        );
    }
}
