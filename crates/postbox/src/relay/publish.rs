//! Publishing one event: a timeout, panics caught.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tracing::Instrument;

use crate::event::OutboxEvent;
use crate::sink::{PublishError, Sink};

/// One publish: an error, a timeout or a panic is a failed try, never a dead relay.
pub(super) async fn publish_one(
    sink: &Arc<dyn Sink>,
    event: &OutboxEvent,
    timeout: Duration,
) -> Result<(), PublishError> {
    let span = crate::trace::publish_span(event);
    let attempt = AssertUnwindSafe(sink.publish(event).instrument(span)).catch_unwind();
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
