//! Scripted sinks: record what was published, fail, stall or panic as a test says.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use postbox::{OutboxEvent, PublishError, Sink};

/// A sink that records what it published, and fails or panics for events as scripted.
#[derive(Clone, Default)]
pub struct RecordingSink {
    state: Arc<Mutex<State>>,
    calls: Arc<AtomicU64>,
}

#[derive(Default)]
struct State {
    published: Vec<OutboxEvent>,
    attempts: HashMap<i64, u32>,
    fail_types: HashMap<String, Behaviour>,
}

/// What the [`RecordingSink`] does with an event type.
#[derive(Clone, Debug)]
pub enum Behaviour {
    /// Return a retryable error.
    Fail,
    /// Return a permanent error.
    FailPermanently,
    /// Panic.
    Panic,
    /// Sleep this long before acknowledging.
    Slow(std::time::Duration),
    /// Fail the first N tries of each event, then succeed.
    FailTimes(u32),
    /// Return this error.
    FailWith(PublishError),
}

impl RecordingSink {
    /// A sink that acknowledges everything.
    pub fn new() -> Self {
        Self::default()
    }

    /// Scripts the behaviour for events of `event_type`.
    pub fn script(&self, event_type: &str, behaviour: Behaviour) {
        self.state
            .lock()
            .expect("lock")
            .fail_types
            .insert(event_type.to_owned(), behaviour);
    }

    /// Takes back the script of `event_type`: its events are acknowledged again.
    pub fn unscript(&self, event_type: &str) {
        self.state
            .lock()
            .expect("lock")
            .fail_types
            .remove(event_type);
    }

    /// Events acknowledged so far, in acknowledgement order.
    pub fn published(&self) -> Vec<OutboxEvent> {
        self.state.lock().expect("lock").published.clone()
    }

    /// Ids acknowledged so far.
    pub fn published_ids(&self) -> Vec<i64> {
        self.published().iter().map(|e| e.id).collect()
    }

    /// Publish calls so far, failed ones included.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// Tries of one event so far.
    pub fn attempts(&self, id: i64) -> u32 {
        self.state
            .lock()
            .expect("lock")
            .attempts
            .get(&id)
            .copied()
            .unwrap_or(0)
    }
}

#[async_trait]
impl Sink for RecordingSink {
    async fn publish(&self, event: &OutboxEvent) -> Result<(), PublishError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let (behaviour, attempt) = {
            let mut st = self.state.lock().expect("lock");
            let n = st.attempts.entry(event.id).or_insert(0);
            *n += 1;
            let attempt = *n;
            (st.fail_types.get(&event.event_type).cloned(), attempt)
        };
        match behaviour {
            Some(Behaviour::Fail) => return Err(PublishError::retryable("scripted failure")),
            Some(Behaviour::FailPermanently) => {
                return Err(PublishError::permanent("scripted permanent failure"));
            }
            Some(Behaviour::Panic) => panic!("scripted panic for event {}", event.id),
            // The subject: a destination that takes this long to acknowledge.
            Some(Behaviour::Slow(d)) => tokio::time::sleep(d).await,
            Some(Behaviour::FailWith(e)) => return Err(e),
            Some(Behaviour::FailTimes(n)) if attempt <= n => {
                return Err(PublishError::retryable(format!(
                    "scripted failure {attempt}"
                )));
            }
            _ => {}
        }
        self.state
            .lock()
            .expect("lock")
            .published
            .push(event.clone());
        Ok(())
    }
}
