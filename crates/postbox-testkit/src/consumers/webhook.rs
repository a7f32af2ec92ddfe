//! An HTTP endpoint of the test's own that records every request and answers from a script.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use tokio::task::JoinHandle;

use super::{Collector, Received};

/// One scripted answer.
struct Answer {
    /// Only for a request whose path starts with this; `None`: for any request.
    under: Option<String>,
    status: u16,
    body: String,
    /// How long to wait before answering.
    delay: Duration,
}

#[derive(Default)]
struct Endpoint {
    collector: Arc<Collector>,
    script: Mutex<VecDeque<Answer>>,
}

/// An axum server on an ephemeral loopback port that takes every POST under `/hooks/`, records
/// it — the path as `destination`, the envelope's `payload` as `body`, the headers, the raw
/// body in `extra["raw_body"]` — and answers with the first scripted answer that fits the
/// request (each used once), or 200 `ok`. It records a request before answering it, so once a
/// publisher has its answers, everything it sent is in the collector.
pub struct Webhook {
    /// Where it listens: `http://{addr}/hooks/…`.
    pub addr: SocketAddr,
    /// What it received.
    pub collector: Arc<Collector>,
    endpoint: Arc<Endpoint>,
    server: JoinHandle<()>,
}

async fn hook(
    State(endpoint): State<Arc<Endpoint>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, String) {
    let envelope: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let mut received = Received {
        destination: uri.path().to_owned(),
        body: envelope["payload"].clone(),
        ..Received::default()
    };
    for (name, value) in &headers {
        received.headers.insert(
            name.as_str().to_owned(),
            value.to_str().unwrap_or_default().to_owned(),
        );
    }
    received.extra.insert(
        "raw_body".into(),
        String::from_utf8_lossy(&body).into_owned(),
    );
    let next = {
        let mut script = endpoint.script.lock().expect("script");
        let at = script.iter().position(|a| {
            a.under
                .as_deref()
                .is_none_or(|prefix| uri.path().starts_with(prefix))
        });
        at.and_then(|at| script.remove(at))
    };
    endpoint.collector.push(received);
    match next {
        Some(answer) => {
            // The subject: an endpoint that takes the time the test scripted to answer.
            tokio::time::sleep(answer.delay).await;
            (
                StatusCode::from_u16(answer.status).expect("status"),
                answer.body,
            )
        }
        None => (StatusCode::OK, "ok".to_owned()),
    }
}

impl Webhook {
    /// Starts the endpoint on an ephemeral port.
    pub async fn start() -> Webhook {
        let endpoint = Arc::new(Endpoint::default());
        let collector = Arc::clone(&endpoint.collector);
        let app = axum::Router::new()
            .route("/hooks/{*rest}", axum::routing::post(hook))
            .with_state(Arc::clone(&endpoint));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("address");
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Webhook {
            addr,
            collector,
            endpoint,
            server,
        }
    }

    /// The next request not taken by an earlier answer gets `status` and `body`.
    pub fn answer(&self, status: u16, body: &str) {
        self.script(None, status, body, Duration::ZERO);
    }

    /// Like [`Webhook::answer`], after `delay`.
    pub fn answer_after(&self, status: u16, body: &str, delay: Duration) {
        self.script(None, status, body, delay);
    }

    /// The next request whose path starts with `prefix` gets `status` and `body`.
    pub fn answer_under(&self, prefix: &str, status: u16, body: &str) {
        self.script(Some(prefix.to_owned()), status, body, Duration::ZERO);
    }

    fn script(&self, under: Option<String>, status: u16, body: &str, delay: Duration) {
        self.endpoint
            .script
            .lock()
            .expect("script")
            .push_back(Answer {
                under,
                status,
                body: body.to_owned(),
                delay,
            });
    }

    /// Waits until every id of `ids` arrived (or `within` passed); returns what arrived. No
    /// marker is needed: a request is recorded before it is answered, so once the publisher is
    /// done, everything it sent is in.
    pub async fn received(&self, ids: &[i64], within: Duration) -> Vec<Received> {
        self.collector.wait_for_ids(ids, within).await
    }

    /// Stops the server.
    pub fn cleanup(self) {
        self.server.abort();
    }
}
