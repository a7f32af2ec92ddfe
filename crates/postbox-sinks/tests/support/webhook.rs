//! Webhook harness: an axum server of its own on an ephemeral port that records every request
//! and answers from a script (default 200), with a proxy in front of it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::routing::post;
use postbox::OutboxEvent;
use postbox_sinks::webhook::sign;
use postbox_sinks::{WebhookConfig, WebhookSink};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::proxy::Proxy;
use super::{Collector, Harness, Received};

pub(crate) const SECRET: &str = "test-secret";

/// The endpoint's behaviour: scripted answers, then 200.
#[derive(Default)]
pub(crate) struct Endpoint {
    pub(crate) collector: Collector,
    /// Answers to give, in order: (status, body, delay before answering).
    pub(crate) script: Mutex<VecDeque<(u16, String, Duration)>>,
}

impl Endpoint {
    pub(crate) fn answer(&self, status: u16, body: &str) {
        self.answer_after(status, body, Duration::ZERO);
    }

    pub(crate) fn answer_after(&self, status: u16, body: &str, delay: Duration) {
        self.script
            .lock()
            .expect("script")
            .push_back((status, body.to_owned(), delay));
    }
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
    let next = endpoint.script.lock().expect("script").pop_front();
    endpoint.collector.push(received);
    match next {
        Some((status, text, delay)) => {
            tokio::time::sleep(delay).await;
            (StatusCode::from_u16(status).expect("status"), text)
        }
        None => (StatusCode::OK, "ok".to_owned()),
    }
}

/// Starts an endpoint on an ephemeral port.
pub(crate) async fn serve() -> (Arc<Endpoint>, std::net::SocketAddr, JoinHandle<()>) {
    let endpoint = Arc::new(Endpoint::default());
    let app = Router::new()
        .route("/hooks/{*rest}", post(hook))
        .with_state(endpoint.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (endpoint, addr, server)
}

pub(crate) fn sink_config(proxy: &Proxy, publish_timeout: Duration) -> WebhookConfig {
    let mut config = WebhookConfig::new(
        format!(
            "http://{}/hooks/{{aggregate_type}}/{{event_type}}",
            proxy.addr()
        )
        .parse()
        .expect("template"),
    );
    config.secret = Some(SECRET.into());
    config.publish_timeout = publish_timeout;
    config.connect_timeout = Duration::from_secs(1);
    config
        .headers
        .insert("Authorization".into(), "Bearer test-token".into());
    config
}

pub(crate) struct WebhookHarness {
    pub(crate) sink: WebhookSink,
    pub(crate) endpoint: Arc<Endpoint>,
    pub(crate) proxy: Proxy,
    server: JoinHandle<()>,
}

impl Harness for WebhookHarness {
    type Sink = WebhookSink;

    async fn start(publish_timeout: Duration) -> Self {
        let (endpoint, addr, server) = serve().await;
        let proxy = Proxy::start(addr).await;
        let sink = WebhookSink::new(sink_config(&proxy, publish_timeout)).expect("sink");
        WebhookHarness {
            sink,
            endpoint,
            proxy,
            server,
        }
    }

    fn sink(&self) -> &WebhookSink {
        &self.sink
    }

    fn collector(&self) -> &Collector {
        &self.endpoint.collector
    }

    fn expected_destination(&self, event: &OutboxEvent) -> String {
        format!(
            "/hooks/{}/{}",
            event.aggregate_type.as_deref().unwrap_or_default(),
            event.event_type
        )
    }

    fn other_destination(&self) -> (String, String) {
        (
            format!("http://{}/hooks/routed/{{event_type}}", self.proxy.addr()),
            "/hooks/routed/InvoiceCreated".to_owned(),
        )
    }

    async fn broker_down(&self) {
        self.proxy.down();
    }

    async fn stall_acks(&self) {
        self.proxy.stall();
    }

    async fn broker_up(&self) {
        self.proxy.up();
    }

    fn check_specific(&self, event: &OutboxEvent, got: &Received) {
        let raw = &got.extra["raw_body"];
        assert_eq!(
            got.header("idempotency-key"),
            Some(event.dedup_id().as_str())
        );
        let timestamp: u64 = got
            .header("x-postbox-timestamp")
            .and_then(|t| t.parse().ok())
            .expect("a timestamp header");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs();
        assert!(
            now.abs_diff(timestamp) < 60,
            "signed now: {timestamp} vs {now}"
        );
        assert_eq!(
            got.header("x-postbox-signature"),
            Some(sign(SECRET.as_bytes(), timestamp, raw.as_bytes()).as_str()),
            "signature over the timestamp and the exact body"
        );
        assert_eq!(got.header("content-type"), Some("application/json"));
        assert_eq!(got.header("authorization"), Some("Bearer test-token"));
        let envelope: serde_json::Value = serde_json::from_str(raw).expect("envelope");
        assert_eq!(envelope["id"], event.id);
        assert_eq!(envelope["dedup_id"], event.dedup_id());
        assert_eq!(envelope["event_type"], event.event_type.as_str());
        assert_eq!(
            envelope["aggregate_id"].as_str(),
            event.aggregate_id.as_deref()
        );
        assert_eq!(envelope["tenant"].as_str(), event.tenant.as_deref());
        assert_eq!(envelope["schema_version"], event.schema_version);
        assert_eq!(envelope["created_at"], "2026-04-24T10:00:00.000Z");
        for (k, v) in &event.headers {
            assert_eq!(envelope["headers"][k], v.as_str());
        }
    }

    async fn cleanup(self) {
        self.server.abort();
    }
}
