//! Webhook harness: the testkit's endpoint, which records every request and answers from a
//! script (default 200), with a proxy in front of it.

use std::time::Duration;

use postbox::OutboxEvent;
use postbox_sinks::webhook::sign;
use postbox_sinks::{WebhookConfig, WebhookSink};
use postbox_testkit::consumers::Webhook;

use super::proxy::Proxy;
use super::{Collector, Harness, Received};

pub(crate) const SECRET: &str = "test-secret";

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
    pub(crate) endpoint: Webhook,
    pub(crate) proxy: Proxy,
}

impl Harness for WebhookHarness {
    type Sink = WebhookSink;

    async fn start(publish_timeout: Duration) -> Self {
        let endpoint = Webhook::start().await;
        let proxy = Proxy::start(endpoint.addr).await;
        let sink = WebhookSink::new(sink_config(&proxy, publish_timeout)).expect("sink");
        WebhookHarness {
            sink,
            endpoint,
            proxy,
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
        self.endpoint.cleanup();
    }
}
