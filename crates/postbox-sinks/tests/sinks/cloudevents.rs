//! Every sink's CloudEvents output (`format = "cloudevents"`), binary and structured, as a
//! consumer receives it from the real broker, decoded by the official CloudEvents SDK for Python
//! (`cloudevents` 2.x, `tests/sinks/cloudevents/decode.py`): each mapped attribute and the payload
//! must come out as Postbox wrote them.
//!
//! Needs `python3` with `cloudevents` (scripts/install-deps installs it) and the loopback
//! services of the conformance suite.

#![allow(clippy::unwrap_used, reason = "tests")]

use crate::support;

use std::future::Future;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use postbox::{OutboxEvent, Sink};
use postbox_sinks::cloudevents::{CloudEventsConfig, Mode, Origin};
use serde_json::{Value, json};
use support::{Harness, Received};

const PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);
const MODES: [Mode; 2] = [Mode::Binary, Mode::Structured];

/// The CloudEvents settings every test uses: a `dataschema`, the default `source` of the
/// `billing` database.
fn settings(mode: Mode) -> CloudEventsConfig {
    let mut c = CloudEventsConfig::default();
    c.mode = mode;
    c.dataschema = Some(
        "https://schemas.example.com/{event_type}/v{schema_version}"
            .parse()
            .unwrap(),
    );
    c.set_origin(Some(Origin {
        database: "billing".into(),
        schema: "public".into(),
    }));
    c
}

/// The testkit's full event, with an aggregate id that HTTP must percent-encode.
fn event() -> OutboxEvent {
    let mut e = support::full_event();
    e.aggregate_id = Some(format!("inv {} ✓", e.id));
    e
}

/// Publishes one event through each sink (binary, then structured), waits for the harness's
/// consumer to receive both, decodes them with the SDK's `binding` and checks them.
async fn decoded_by_the_sdk<H: Harness>(harness: &H, binding: &str, sinks: [Box<dyn Sink>; 2]) {
    let mut published = Vec::new();
    for (mode, sink) in MODES.into_iter().zip(sinks) {
        let e = event();
        sink.publish(&e).await.unwrap();
        published.push((mode, e));
    }
    // The harness is this test's alone: the two messages are all it receives. They are told
    // apart by their dedup id: `postbox-dedup-id`, or the `id` user property of MQTT's binary
    // mode, which carries the attributes only.
    let received = harness
        .collector()
        .wait_for(published.len(), Duration::from_secs(10))
        .await;
    let messages: Vec<Value> = published
        .iter()
        .map(|(_, e)| {
            let dedup_id = e.dedup_id();
            let got = received
                .iter()
                .find(|r| {
                    r.header("postbox-dedup-id").or_else(|| r.header("id")) == Some(&*dedup_id)
                })
                .unwrap_or_else(|| panic!("event {} not received: {received:?}", e.id));
            as_received(binding, got)
        })
        .collect();
    let decoded = sdk_decode(&messages);
    for ((mode, e), event) in published.iter().zip(decoded) {
        check(binding, *mode, e, &event);
    }
}

/// What the consumer got, as the decoding script takes it.
fn as_received(binding: &str, got: &Received) -> Value {
    let body = got
        .extra
        .get("raw_body")
        .or_else(|| got.extra.get("payload"))
        .cloned()
        .unwrap_or_else(|| got.body.to_string());
    let content_type = got
        .extra
        .get("content_type")
        .cloned()
        .or_else(|| got.header("content-type").map(str::to_owned));
    json!({
        "binding": binding,
        "headers": got.headers,
        "content_type": content_type,
        "key": got.key,
        "body": body,
    })
}

/// Runs the SDK over `messages`.
fn sdk_decode(messages: &[Value]) -> Vec<Value> {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/sinks/cloudevents/decode.py"
    );
    let mut child = Command::new("python3")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs (scripts/install-deps installs it with the cloudevents SDK)");
    let input = serde_json::to_vec(messages).unwrap();
    child.stdin.take().unwrap().write_all(&input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the CloudEvents SDK refused a message ({}): {}\nmessages: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        serde_json::to_string_pretty(messages).unwrap()
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The decoded `got` is `e`, mapped as docs/sinks.md says.
fn check(binding: &str, mode: Mode, e: &OutboxEvent, got: &Value) {
    let what = format!("{binding} {mode:?}, event {}", e.id);
    let attributes = &got["attributes"];
    let aggregate_id = e.aggregate_id.clone().unwrap();
    let expected = [
        ("specversion", "1.0".to_owned()),
        ("id", e.dedup_id()),
        ("source", "/postbox/billing/acme".to_owned()),
        ("type", "InvoiceCreated".to_owned()),
        ("subject", format!("Invoice/{aggregate_id}")),
        ("datacontenttype", "application/json".to_owned()),
        (
            "dataschema",
            "https://schemas.example.com/InvoiceCreated/v3".to_owned(),
        ),
        ("schemaversion", "3".to_owned()),
        ("partitionkey", aggregate_id.clone()),
        ("traceparent", e.headers["traceparent"].clone()),
        ("tracestate", e.headers["tracestate"].clone()),
    ];
    for (name, value) in expected {
        assert_eq!(
            attributes[name].as_str(),
            Some(value.as_str()),
            "{what}: attribute {name} in {attributes}"
        );
    }
    let time = chrono::DateTime::parse_from_rfc3339(attributes["time"].as_str().unwrap())
        .unwrap_or_else(|err| panic!("{what}: time {}: {err}", attributes["time"]));
    assert_eq!(
        time.timestamp_millis(),
        e.created_at.timestamp_millis(),
        "{what}: time"
    );
    let payload: Value = serde_json::from_str(e.payload.get()).unwrap();
    assert_eq!(got["data"], payload, "{what}: data");
}

/// One sink per mode, each built by `make` from its configuration's CloudEvents settings.
async fn one_per_mode<F, Fut>(make: F) -> [Box<dyn Sink>; 2]
where
    F: Fn(CloudEventsConfig) -> Fut,
    Fut: Future<Output = Box<dyn Sink>>,
{
    [
        make(settings(Mode::Binary)).await,
        make(settings(Mode::Structured)).await,
    ]
}

/// Sets `format = "cloudevents"` and the CloudEvents settings on a sink's configuration.
macro_rules! cloudevents {
    ($config:expr, $settings:expr) => {{
        let mut config = $config;
        config.format = postbox_sinks::cloudevents::Format::Cloudevents;
        config.cloudevents = $settings;
        config
    }};
}

#[cfg(feature = "webhook")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_requests_decode_with_the_sdks_http_binding() {
    let h = support::webhook::WebhookHarness::start(PUBLISH_TIMEOUT).await;
    let sinks = one_per_mode(|ce| {
        let config = cloudevents!(support::webhook::sink_config(&h.proxy, PUBLISH_TIMEOUT), ce);
        async move { Box::new(postbox_sinks::WebhookSink::new(config).unwrap()) as Box<dyn Sink> }
    })
    .await;
    decoded_by_the_sdk(&h, "http", sinks).await;
    h.cleanup().await;
}

#[cfg(feature = "kafka")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_records_decode_with_the_sdks_kafka_binding() {
    let h = support::kafka::KafkaHarness::start(PUBLISH_TIMEOUT).await;
    let sinks = one_per_mode(|ce| {
        let config = support::kafka::sink_config(&h.mock.bootstrap, &h.prefix, PUBLISH_TIMEOUT);
        let config = cloudevents!(config, ce);
        async move {
            Box::new(postbox_sinks::KafkaSink::connect(config).await.unwrap()) as Box<dyn Sink>
        }
    })
    .await;
    decoded_by_the_sdk(&h, "kafka", sinks).await;
    h.cleanup().await;
}

#[cfg(feature = "amqp")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_messages_decode_with_the_sdks_amqp_binding() {
    let h = support::amqp::AmqpHarness::start(PUBLISH_TIMEOUT).await;
    let sinks =
        one_per_mode(|ce| {
            let config = support::amqp::sink_config(&h.proxy, &h.exchange, PUBLISH_TIMEOUT);
            let config = cloudevents!(config, ce);
            async move {
                Box::new(postbox_sinks::AmqpSink::connect(config).await.unwrap()) as Box<dyn Sink>
            }
        })
        .await;
    decoded_by_the_sdk(&h, "amqp", sinks).await;
    h.cleanup().await;
}

#[cfg(feature = "nats")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_messages_decode_with_the_sdks_http_binding() {
    let h = support::nats::NatsHarness::start(PUBLISH_TIMEOUT).await;
    let sinks =
        one_per_mode(|ce| {
            let config =
                support::nats::NatsHarness::config(&h.consumer.prefix, &h.proxy, PUBLISH_TIMEOUT);
            let config = cloudevents!(config, ce);
            async move {
                Box::new(postbox_sinks::NatsSink::connect(config).await.unwrap()) as Box<dyn Sink>
            }
        })
        .await;
    decoded_by_the_sdk(&h, "http", sinks).await;
    h.cleanup().await;
}

#[cfg(feature = "mqtt")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_messages_decode_with_the_sdks_event_type() {
    let h = support::mqtt::MqttHarness::start(PUBLISH_TIMEOUT).await;
    let sinks =
        one_per_mode(|ce| {
            let config = support::mqtt::sink_config(&h.proxy, &h.consumer.prefix, PUBLISH_TIMEOUT);
            let config = cloudevents!(config, ce);
            async move {
                Box::new(postbox_sinks::MqttSink::connect(config).await.unwrap()) as Box<dyn Sink>
            }
        })
        .await;
    decoded_by_the_sdk(&h, "mqtt", sinks).await;
    h.cleanup().await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_entries_decode_with_the_sdks_kafka_binding() {
    let h = support::redis::RedisHarness::start(PUBLISH_TIMEOUT).await;
    let template = format!("{}:{{aggregate_type}}:{{event_type}}", h.consumer.prefix);
    let sinks = one_per_mode(|ce| {
        let config = support::redis::sink_config(&h.proxy, &template, PUBLISH_TIMEOUT);
        let config = cloudevents!(config, ce);
        async move {
            Box::new(postbox_sinks::RedisSink::connect(config).await.unwrap()) as Box<dyn Sink>
        }
    })
    .await;
    decoded_by_the_sdk(&h, "kafka", sinks).await;
    h.cleanup().await;
}
