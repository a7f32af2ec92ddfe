//! Publishing one batch: bounded concurrency, a timeout per event, panics caught.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};

use crate::event::OutboxEvent;
use crate::sink::{PublishError, Sink};

/// Publishes `events`, at most `concurrency` at once. Returns each event's id with its outcome.
///
/// Written with a plain `FuturesUnordered` rather than `buffer_unordered` over a closure: the
/// closure form makes the relay's future lose `Send` (a higher-ranked lifetime limitation), and
/// users spawn relays on multi-threaded runtimes.
pub(super) async fn publish_batch(
    sink: &Arc<dyn Sink>,
    events: &[OutboxEvent],
    concurrency: usize,
    timeout: Duration,
) -> Vec<(i64, Result<(), PublishError>)> {
    let mut waiting = events.iter();
    let mut running = FuturesUnordered::new();
    let mut outcomes = Vec::with_capacity(events.len());
    loop {
        while running.len() < concurrency {
            match waiting.next() {
                Some(event) => running.push(publish_tagged(sink, event, timeout)),
                None => break,
            }
        }
        match running.next().await {
            Some(outcome) => outcomes.push(outcome),
            None => return outcomes,
        }
    }
}

async fn publish_tagged(
    sink: &Arc<dyn Sink>,
    event: &OutboxEvent,
    timeout: Duration,
) -> (i64, Result<(), PublishError>) {
    (event.id, publish_one(sink, event, timeout).await)
}

/// One publish: an error, a timeout or a panic is a failed try, never a dead relay.
async fn publish_one(
    sink: &Arc<dyn Sink>,
    event: &OutboxEvent,
    timeout: Duration,
) -> Result<(), PublishError> {
    let attempt = AssertUnwindSafe(sink.publish(event)).catch_unwind();
    match tokio::time::timeout(timeout, attempt).await {
        Ok(Ok(result)) => result,
        Ok(Err(panic)) => Err(PublishError::retryable(format!(
            "publisher panicked: {}",
            panic_message(&*panic)
        ))),
        Err(_) => Err(PublishError::retryable(format!(
            "publish timed out after {timeout:?}"
        ))),
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_owned()
    }
}
