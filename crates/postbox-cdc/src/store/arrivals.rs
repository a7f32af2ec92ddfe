//! The CDC relay's wake-ups: ids the slot delivered, and rechecks come due.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use postbox::store::Wakeups;

use crate::progress::Progress;

/// Wakes the relay when the slot delivers outbox ids, and when a recheck falls due — once for
/// each: a relay that does not claim then (its target paused, its pipeline full) is not woken
/// again for the same recheck, and claims it on its next round.
pub(super) struct Arrivals {
    pub(super) progress: Arc<Progress>,
    pub(super) schema: String,
    /// The due time of the last recheck this woke the relay for.
    pub(super) woke_for: Option<Instant>,
}

#[async_trait]
impl Wakeups for Arrivals {
    async fn next(&mut self) -> postbox::Result<Option<String>> {
        let arrived = self.progress.arrived.notified();
        let due = self.progress.next_recheck_after(self.woke_for);
        match due {
            Some(due) => {
                tokio::select! {
                    () = arrived => {}
                    () = tokio::time::sleep_until(tokio::time::Instant::from_std(due)) => {
                        self.woke_for = Some(due);
                    }
                }
            }
            None => arrived.await,
        }
        Ok(Some(self.schema.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pg_walstream::SharedLsnFeedback;
    use std::time::Duration;

    /// A relay that does not claim a due recheck (its target paused) is woken for it once, not
    /// at once again and again (which spun a core).
    #[tokio::test]
    async fn a_due_recheck_wakes_the_relay_once() {
        let progress = Arc::new(Progress::default());
        progress.restart(SharedLsnFeedback::new_shared());
        let mut arrivals = Arrivals {
            progress: Arc::clone(&progress),
            schema: "public".to_owned(),
            woke_for: None,
        };
        progress.committed(100, vec![1]);
        let delivered = tokio::time::timeout(Duration::from_secs(1), arrivals.next()).await;
        assert!(delivered.is_ok(), "woken by the delivery");
        assert_eq!(progress.take(10), vec![1]);
        progress.missed([1]);
        let first = tokio::time::timeout(Duration::from_secs(1), arrivals.next()).await;
        assert!(first.is_ok(), "woken when the recheck falls due");
        let again = tokio::time::timeout(Duration::from_millis(200), arrivals.next()).await;
        assert!(again.is_err(), "not woken again for the same recheck");
        progress.committed(200, vec![2]);
        let arrival = tokio::time::timeout(Duration::from_secs(1), arrivals.next()).await;
        assert!(arrival.is_ok(), "woken by the next delivery");
    }
}
