//! A relay's rounds, counted as they finish: what a test, a health check or an embedding
//! service waits on instead of a clock ("the relay has looked again, and is waiting").
//!
//! A round is one pass of the relay's loop in which it looked at its targets: read the heads of
//! their id sequences or their backlog, and claimed from each target something said had work (a
//! notification, a moved head, a full claim, a retry come due). Publishing and recording go on
//! beside the rounds. When nothing is left to claim at once and nothing is in flight, the relay
//! waits for a wake-up, its next look, or a retry coming due.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

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
    /// Requests to look at every target ([`Rounds::settle`]) the relay has served: it looked at
    /// every target since the request, and was then waiting.
    pub sweeps: u64,
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

/// Callers' requests that the relay look at every target at its next round (see
/// [`Rounds::settle`]), numbered, and the relay's wake-up for them.
#[derive(Debug, Default)]
pub(super) struct Sweep {
    requested: AtomicU64,
    wake: Notify,
}

impl Sweep {
    /// Asks for a sweep; returns the request's number.
    fn request(&self) -> u64 {
        let n = self.requested.fetch_add(1, Ordering::SeqCst) + 1;
        self.wake.notify_one();
        n
    }

    /// The number of the latest request.
    pub(super) fn latest(&self) -> u64 {
        self.requested.load(Ordering::SeqCst)
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
        // every one of them, and waits until it says it has, and is waiting.
        let request = self.sweep.request();
        async move {
            let _ = self.rx.wait_for(|p| p.sweeps >= request && p.waiting).await;
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

    /// The relay has looked at every target for the sweep requests up to `request`, and is
    /// waiting.
    pub(super) fn swept(&self, request: u64) {
        self.tx.send_if_modified(|p| {
            let changed = p.sweeps < request || !p.waiting;
            p.sweeps = p.sweeps.max(request);
            p.waiting = true;
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
    fn settle_waits_until_the_relay_served_its_request_and_waits() {
        let tracker = Tracker::default();
        let mut rounds = tracker.watch();
        let mut settle = pin!(rounds.settle());
        // The relay was waiting before it took the request in: that does not count.
        tracker.waiting(true);
        assert!(!ready(settle.as_mut()), "the request is not served yet");
        tracker.waiting(false);
        tracker.finished();
        assert!(!ready(settle.as_mut()), "a round, but not the sweep's end");
        let request = tracker.sweep().latest();
        assert_eq!(request, 1);
        tracker.swept(request);
        assert!(ready(settle.as_mut()));
        assert_eq!(
            tracker.watch().progress(),
            RelayProgress {
                rounds: 1,
                waiting: true,
                slow_lane_passes: 0,
                sweeps: 1,
            }
        );
        // A later request waits for its own sweep.
        let mut rounds = tracker.watch();
        let mut again = pin!(rounds.settle());
        assert!(!ready(again.as_mut()));
        tracker.swept(2);
        assert!(ready(again.as_mut()));
    }
}
