//! Sinks without a broker: `stdout` (JSON lines) and `null` (discard). Both take no
//! destination: a route to them needs no topic.

use std::collections::BTreeMap;
use std::io::{self, BufWriter, Write};
use std::sync::mpsc;

use crate::{RoutableSink, Template};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use postbox::{OutboxEvent, PublishError, Sink};
use serde::Serialize;
use serde_json::value::RawValue;
use tokio::sync::{oneshot, watch};

/// Most lines written between two flushes; acknowledgements wait for the flush.
const MAX_LINES_PER_FLUSH: usize = 1024;

/// One event as a line on stdout. The field names are part of the binary's interface.
#[derive(Debug, Serialize)]
pub struct EventLine<'a> {
    /// Event id; consumers drop repeats by it (or by `idempotency_key`).
    pub id: i64,
    /// The tenant, or `null` for the default schema.
    pub tenant: Option<&'a str>,
    /// E.g. `InvoiceCreated`.
    pub event_type: &'a str,
    /// E.g. `Invoice`.
    pub aggregate_type: Option<&'a str>,
    /// E.g. `456`.
    pub aggregate_id: Option<&'a str>,
    /// The deduplication key, if the event has one.
    pub idempotency_key: Option<&'a str>,
    /// The producer's type name.
    pub event_class: Option<&'a str>,
    /// The payload's schema version.
    pub schema_version: i32,
    /// Failed tries before this one.
    pub retry_count: i32,
    /// When the event was enqueued (UTC, RFC 3339).
    pub created_at: DateTime<Utc>,
    /// Headers such as `traceparent`.
    pub headers: &'a BTreeMap<String, String>,
    /// The payload, as JSON (not a string).
    pub payload: &'a RawValue,
}

impl<'a> From<&'a OutboxEvent> for EventLine<'a> {
    fn from(e: &'a OutboxEvent) -> Self {
        EventLine {
            id: e.id,
            tenant: e.tenant.as_deref(),
            event_type: &e.event_type,
            aggregate_type: e.aggregate_type.as_deref(),
            aggregate_id: e.aggregate_id.as_deref(),
            idempotency_key: e.idempotency_key.as_deref(),
            event_class: e.event_class.as_deref(),
            schema_version: e.schema_version,
            retry_count: e.retry_count,
            created_at: e.created_at,
            headers: &e.headers,
            payload: &e.payload,
        }
    }
}

/// A line waiting to be written, and who to tell once it is.
struct Pending {
    line: Vec<u8>,
    written: oneshot::Sender<Result<(), String>>,
}

/// Writes each event as one JSON line to stdout, and acknowledges it only once the line is
/// written and flushed.
///
/// One writer thread owns stdout, so lines never interleave; it writes whatever is queued, flushes
/// once, then acknowledges the lot. If stdout breaks (the reader went away), the sink reports it
/// through [`StdoutSink::broken`] so the relay can stop instead of failing every event.
pub struct StdoutSink {
    queue: mpsc::Sender<Pending>,
    broken: watch::Receiver<Option<String>>,
}

impl StdoutSink {
    /// Starts the writer thread on the process's stdout.
    pub fn start() -> io::Result<StdoutSink> {
        Self::start_with(io::stdout)
    }

    /// Starts the writer thread on the writer `open` returns (in that thread).
    fn start_with<W, F>(open: F) -> io::Result<StdoutSink>
    where
        W: Write,
        F: FnOnce() -> W + Send + 'static,
    {
        let (queue, lines) = mpsc::channel::<Pending>();
        let (broken_tx, broken) = watch::channel(None);
        std::thread::Builder::new()
            .name("postbox-stdout".to_owned())
            .spawn(move || write_lines(BufWriter::new(open()), &lines, &broken_tx))?;
        Ok(StdoutSink { queue, broken })
    }

    /// Completes with the error once stdout cannot be written any more.
    pub fn broken(&self) -> impl Future<Output = String> + Send + 'static + use<> {
        let mut rx = self.broken.clone();
        async move {
            let error = match rx.wait_for(Option::is_some).await {
                Ok(error) => error.clone(),
                Err(_) => None,
            };
            match error {
                Some(error) => error,
                // The writer thread is gone without an error: stdout never broke.
                None => std::future::pending().await,
            }
        }
    }
}

/// The writer thread: batches of queued lines, one flush per batch, then the acknowledgements.
fn write_lines<W: Write>(
    mut out: W,
    lines: &mpsc::Receiver<Pending>,
    broken: &watch::Sender<Option<String>>,
) {
    let mut batch = Vec::new();
    while let Ok(first) = lines.recv() {
        batch.push(first);
        while batch.len() < MAX_LINES_PER_FLUSH {
            match lines.try_recv() {
                Ok(more) => batch.push(more),
                Err(_) => break,
            }
        }
        let written = batch
            .iter()
            .try_for_each(|p| out.write_all(&p.line))
            .and_then(|()| out.flush())
            .map_err(|e| e.to_string());
        if let Err(e) = &written {
            broken.send_replace(Some(e.clone()));
        }
        for pending in batch.drain(..) {
            // The publisher may have timed out and gone; nothing to tell then.
            let _ = pending.written.send(written.clone());
        }
    }
}

#[async_trait]
impl Sink for StdoutSink {
    async fn publish(&self, event: &OutboxEvent) -> Result<(), PublishError> {
        let mut line = serde_json::to_vec(&EventLine::from(event)).map_err(|e| {
            PublishError::permanent(format!("event {} cannot be written as JSON: {e}", event.id))
        })?;
        line.push(b'\n');
        let (written, ack) = oneshot::channel();
        self.queue
            .send(Pending { line, written })
            .map_err(|_| PublishError::retryable("the stdout writer has stopped"))?;
        match ack.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(PublishError::retryable(format!(
                "cannot write to stdout: {e}"
            ))),
            Err(_) => Err(PublishError::retryable("the stdout writer has stopped")),
        }
    }
}

#[async_trait]
impl RoutableSink for StdoutSink {
    /// Writes the line; stdout has no destinations, so `destination` is not used.
    async fn publish_to(
        &self,
        event: &OutboxEvent,
        _destination: Option<&Template>,
    ) -> Result<(), PublishError> {
        self.publish(event).await
    }
}

/// Acknowledges every event without sending it anywhere (for trials and benchmarks).
#[derive(Clone, Copy, Debug, Default)]
pub struct NullSink;

#[async_trait]
impl Sink for NullSink {
    async fn publish(&self, _event: &OutboxEvent) -> Result<(), PublishError> {
        Ok(())
    }
}

#[async_trait]
impl RoutableSink for NullSink {
    async fn publish_to(
        &self,
        _event: &OutboxEvent,
        _destination: Option<&Template>,
    ) -> Result<(), PublishError> {
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A writer tests can read back, that fails once told to.
    #[derive(Clone, Default)]
    struct Shared {
        bytes: Arc<Mutex<Vec<u8>>>,
        fail: Arc<std::sync::atomic::AtomicBool>,
    }

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.fail.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "reader went away",
                ));
            }
            self.bytes.lock().expect("lock").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn event(id: i64) -> OutboxEvent {
        postbox_testkit::event(id)
            .tenant("acme")
            .aggregate("Invoice", &id.to_string())
            .idempotency_key(&format!("Invoice:{id}:InvoiceCreated:2026-04-24"))
            .payload(serde_json::json!({ "invoice_id": id }))
            .header("traceparent", "00-abc-def-01")
            .event_class("app::InvoiceCreated")
            .schema_version(2)
            .retry_count(1)
            .created_at(DateTime::from_timestamp(1_776_988_800, 0).expect("time"))
            .build()
    }

    #[tokio::test]
    async fn lines_are_whole_json_objects_written_before_the_ack() {
        let out = Shared::default();
        let writer = out.clone();
        let sink = Arc::new(StdoutSink::start_with(move || writer).expect("start"));
        let publishes = (1..=200).map(|id| {
            let sink = Arc::clone(&sink);
            tokio::spawn(async move { sink.publish(&event(id)).await })
        });
        for p in futures::future::join_all(publishes).await {
            p.expect("task").expect("published");
        }
        let text = String::from_utf8(out.bytes.lock().expect("lock").clone()).expect("utf8");
        let mut ids: Vec<i64> = text
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).expect("a JSON line");
                v["id"].as_i64().expect("id")
            })
            .collect();
        ids.sort_unstable();
        assert_eq!(ids, (1..=200).collect::<Vec<_>>());
        let first: serde_json::Value =
            serde_json::from_str(text.lines().next().expect("a line")).expect("json");
        assert_eq!(first["tenant"], "acme");
        assert!(
            first["payload"].is_object(),
            "payload is JSON, not a string"
        );
        assert_eq!(first["headers"]["traceparent"], "00-abc-def-01");
        assert_eq!(first["created_at"], "2026-04-24T00:00:00Z");
        for key in [
            "event_type",
            "aggregate_type",
            "aggregate_id",
            "idempotency_key",
            "event_class",
            "schema_version",
            "retry_count",
        ] {
            assert!(first.get(key).is_some(), "{key} missing");
        }
    }

    #[tokio::test]
    async fn a_broken_stdout_fails_the_publish_and_is_reported() {
        let out = Shared::default();
        out.fail.store(true, std::sync::atomic::Ordering::SeqCst);
        let writer = out.clone();
        let sink = StdoutSink::start_with(move || writer).expect("start");
        let broken = sink.broken();
        let err = sink.publish(&event(1)).await.expect_err("must fail");
        assert!(!err.is_permanent());
        assert!(broken.await.contains("reader went away"));
    }
}
