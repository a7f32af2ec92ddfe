//! The CDC relay's wake-ups: ids the slot delivered, and rechecks come due, each naming the
//! outbox (the default schema's or a tenant's) whose claim should run.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use postbox::store::Wakeups;

use crate::progress::Progress;

/// Wakes the relay when the slot delivers outbox ids, and when a recheck falls due — once for
/// each: a relay that does not claim then (its target paused, its pipeline full) is not woken
/// again for the same recheck, and claims it on its next round. Each wake-up names one schema
/// whose ids wait; a delivery to several outboxes wakes the relay once for each.
pub(super) struct Arrivals {
    progress: Arc<Progress>,
    /// The default schema: named when what woke the relay was taken meanwhile.
    schema: String,
    /// Schemas whose ids wait, still to be named.
    named: VecDeque<String>,
    /// The due time of the last recheck this woke the relay for.
    woke_for: Option<Instant>,
}

impl Arrivals {
    pub(super) fn new(progress: Arc<Progress>, schema: &str) -> Self {
        Arrivals {
            progress,
            schema: schema.to_owned(),
            named: VecDeque::new(),
            woke_for: None,
        }
    }
}

#[async_trait]
impl Wakeups for Arrivals {
    async fn next(&mut self) -> postbox::Result<Option<String>> {
        if let Some(schema) = self.named.pop_front() {
            return Ok(Some(schema));
        }
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
        let waiting = self.progress.waiting_outboxes();
        self.named.extend(
            waiting
                .into_iter()
                .filter_map(|sid| self.progress.schema(sid)),
        );
        Ok(Some(
            self.named
                .pop_front()
                .unwrap_or_else(|| self.schema.clone()),
        ))
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
        let public = progress.sid("public");
        progress.serve(&["public".to_owned()]);
        let mut arrivals = Arrivals::new(Arc::clone(&progress), "public");
        progress.committed(100, vec![(public, 1)]);
        let delivered = tokio::time::timeout(Duration::from_secs(1), arrivals.next()).await;
        assert!(delivered.is_ok(), "woken by the delivery");
        assert_eq!(progress.take(public, 10), vec![1]);
        progress.missed(public, [1]);
        let first = tokio::time::timeout(Duration::from_secs(1), arrivals.next()).await;
        assert!(first.is_ok(), "woken when the recheck falls due");
        let again = tokio::time::timeout(Duration::from_millis(200), arrivals.next()).await;
        assert!(again.is_err(), "not woken again for the same recheck");
        progress.committed(200, vec![(public, 2)]);
        let arrival = tokio::time::timeout(Duration::from_secs(1), arrivals.next()).await;
        assert!(arrival.is_ok(), "woken by the next delivery");
    }

    /// A delivery to two outboxes names each schema once.
    #[tokio::test]
    async fn a_delivery_to_two_outboxes_wakes_each_schemas_claim() {
        let progress = Arc::new(Progress::default());
        progress.restart(SharedLsnFeedback::new_shared());
        let public = progress.sid("public");
        let tenant = progress.sid("tenant_a");
        progress.serve(&["public".to_owned(), "tenant_a".to_owned()]);
        let mut arrivals = Arrivals::new(Arc::clone(&progress), "public");
        progress.committed(100, vec![(tenant, 1), (public, 1)]);
        let mut named = Vec::new();
        for _ in 0..2 {
            let woke = tokio::time::timeout(Duration::from_secs(1), arrivals.next()).await;
            named.push(woke.expect("woken").expect("named").expect("a schema"));
        }
        named.sort();
        assert_eq!(named, ["public", "tenant_a"]);
    }
}
