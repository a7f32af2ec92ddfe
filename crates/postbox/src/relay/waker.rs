//! What wakes a waiting relay besides its own timing: notifications (`NOTIFY`), each naming the
//! schema whose events were committed, heard by a task of their own; and the retries this relay
//! scheduled, per target, so that it claims each target's retries when they come due.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::debug;

use crate::backoff::Backoff;
use crate::schema::SchemaName;
use crate::store::Store;

/// Scheduled retries a relay remembers for waking up on time.
const MAX_REMEMBERED_RETRIES: usize = 10_000;

/// What the notification listener heard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Heard {
    /// Events were committed in this schema's outbox.
    Named(String),
    /// Events may have been committed anywhere (a notification that names no schema), or
    /// notifications may have been lost (the listener reconnected): every target is looked at.
    Anywhere,
}

/// The notification listener, on a task of its own that reconnects it when it breaks; what it
/// hears waits in a channel, so the relay's wait for it can be dropped at any moment.
pub(super) struct Listener {
    rx: mpsc::UnboundedReceiver<Heard>,
    task: JoinHandle<()>,
}

impl Listener {
    /// Starts listening where the store has notifications; `None` where it has none (the relay
    /// polls only).
    pub(super) async fn start(store: Arc<dyn Store>) -> Option<Listener> {
        let first = match store.wakeups().await {
            Ok(Some(listener)) => Some(listener),
            Ok(None) => return None,
            Err(e) => {
                debug!(error = %e, "no notification listener yet; polling until it connects");
                None
            }
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(listen(store, first, tx));
        Some(Listener { rx, task })
    }

    /// Waits for what the listener hears next; pending for ever once it is gone. Cancel-safe.
    pub(super) async fn next(&mut self) -> Heard {
        match self.rx.recv().await {
            Some(heard) => heard,
            None => std::future::pending().await,
        }
    }

    /// What was heard and not taken yet.
    pub(super) fn drain(&mut self) -> Vec<Heard> {
        let mut heard = Vec::new();
        while let Ok(h) = self.rx.try_recv() {
            heard.push(h);
        }
        heard
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The listener's task: forwards each notification, reconnects after a break (and says
/// [`Heard::Anywhere`] then: what was notified meanwhile is lost), until the relay is gone.
async fn listen(
    store: Arc<dyn Store>,
    mut listener: Option<Box<dyn crate::store::Wakeups>>,
    tx: mpsc::UnboundedSender<Heard>,
) {
    let mut retries = Backoff::new(Duration::from_millis(100), Duration::from_secs(5)).attempts();
    loop {
        if let Some(l) = listener.as_mut() {
            retries.reset();
            loop {
                let heard = match l.next().await {
                    Ok(Some(schema)) => Heard::Named(schema),
                    Ok(None) => Heard::Anywhere,
                    Err(e) => {
                        debug!(error = %e, "notification listener lost; polling until it reconnects");
                        break;
                    }
                };
                if tx.send(heard).is_err() {
                    return;
                }
            }
        }
        tokio::time::sleep(retries.next_delay()).await;
        listener = match store.wakeups().await {
            Ok(Some(l)) => {
                if tx.send(Heard::Anywhere).is_err() {
                    return;
                }
                Some(l)
            }
            Ok(None) => return,
            Err(e) => {
                debug!(error = %e, "notification listener cannot reconnect yet");
                None
            }
        };
    }
}

/// The retries this relay scheduled, earliest first, with their targets, so an idle relay
/// claims each target when its retry comes due rather than at its next look. Wake-up times
/// only: whether an event is due is decided by the database clock.
#[derive(Default)]
pub(super) struct RetrySchedule {
    retries: Mutex<BinaryHeap<Reverse<(Instant, SchemaName)>>>,
}

impl RetrySchedule {
    /// Remembers a retry of `schema`'s target scheduled `after` from now.
    pub(super) fn note(&self, schema: &SchemaName, after: Duration) {
        let mut retries = self
            .retries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Bounded: past this many, later retries are found by the due sweep.
        if retries.len() < MAX_REMEMBERED_RETRIES {
            retries.push(Reverse((Instant::now() + after, schema.clone())));
        }
    }

    /// The targets whose retries have come due (each once), forgotten from here on.
    pub(super) fn take_due(&self) -> Vec<SchemaName> {
        let mut retries = self
            .retries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = Instant::now();
        let mut due: Vec<SchemaName> = Vec::new();
        while retries.peek().is_some_and(|Reverse((at, _))| *at <= now) {
            if let Some(Reverse((_, schema))) = retries.pop()
                && !due.contains(&schema)
            {
                due.push(schema);
            }
        }
        due
    }

    /// When the earliest retry still ahead comes due.
    pub(super) fn next(&self) -> Option<Instant> {
        self.retries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .peek()
            .map(|Reverse((at, _))| *at)
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

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[tokio::test(start_paused = true)]
    async fn retries_are_remembered_per_target_until_they_come_due() {
        let schedule = RetrySchedule::default();
        let name = |n: &str| SchemaName::new(n).expect("a schema name");
        let (a, b) = (name("a"), name("b"));
        assert_eq!(schedule.next(), None);
        schedule.note(&a, ms(300));
        schedule.note(&b, ms(100));
        schedule.note(&b, ms(120));
        let start = Instant::now();
        assert_eq!(schedule.next(), Some(start + ms(100)));
        assert!(schedule.take_due().is_empty());
        tokio::time::advance(ms(150)).await;
        assert_eq!(schedule.take_due(), vec![b.clone()], "b once, for both");
        assert_eq!(schedule.next(), Some(start + ms(300)));
        tokio::time::advance(ms(200)).await;
        assert_eq!(schedule.take_due(), vec![a]);
        assert_eq!(schedule.next(), None);
    }
}
