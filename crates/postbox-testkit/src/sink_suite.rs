//! The sink conformance suite: what every sink must do, written once and run through a
//! [`Harness`] per sink — each broker sink of `postbox-sinks`, or a sink of a user's own. A
//! harness sets up a fresh destination, a sink publishing to it, a real consumer of the broker,
//! and a way to take the broker away from the sink (a [`crate::proxy::Proxy`]).
//!
//! ```ignore
//! #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
//! async fn delivers_exactly_what_was_acked() {
//!     postbox_testkit::sink_suite::delivers_exactly_what_was_acked::<MyHarness>().await;
//! }
//! ```

#![allow(
    clippy::unwrap_used,
    clippy::missing_panics_doc,
    reason = "a test suite fails loudly on the first unexpected error"
)]

use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use postbox::{OutboxEvent, PublishError, Sink};
use tokio::sync::watch;
use tokio::time::Instant;

/// A short random suffix, so that parallel tests never share a stream, queue, key or topic.
pub fn suffix() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..12].to_owned()
}

/// A random positive event id.
pub fn event_id() -> i64 {
    i64::from_le_bytes(
        uuid::Uuid::new_v4().as_bytes()[..8]
            .try_into()
            .expect("8 bytes"),
    )
    .abs()
        % 1_000_000_000_000
}

/// An event with everything set: aggregate, idempotency key, tenant, class, trace headers.
pub fn full_event() -> OutboxEvent {
    let id = event_id();
    let mut headers = BTreeMap::new();
    headers.insert(
        "traceparent".to_owned(),
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned(),
    );
    headers.insert("tracestate".to_owned(), "congo=t61rcWkgMzE".to_owned());
    headers.insert("x-request-source".to_owned(), "checkout".to_owned());
    let mut e = crate::event(id)
        .tenant("acme")
        .aggregate("Invoice", &format!("inv-{id}"))
        .idempotency_key(&format!("Invoice:inv-{id}:InvoiceCreated:2026-04-24"))
        .payload(serde_json::json!({
            "invoice_id": id,
            "amount_cents": 1200,
            "lines": [{"sku": "A-1", "qty": 2}],
            "note": "unicode ✓"
        }))
        .event_class("billing::InvoiceCreated")
        .schema_version(3)
        .claim_token(uuid::Uuid::new_v4())
        .build();
    e.headers = headers;
    e
}

/// An event with an aggregate and nothing else: no key (dedup id = event id), no tenant, no
/// headers.
pub fn bare_event() -> OutboxEvent {
    let mut e = full_event();
    e.event_type = "InvoicePaid".to_owned();
    e.tenant = None;
    e.idempotency_key = None;
    e.event_class = None;
    e.headers.clear();
    e.schema_version = 1;
    e.payload =
        serde_json::value::to_raw_value(&serde_json::json!({"paid": true})).expect("payload");
    e
}

/// One message as a real consumer of the broker saw it.
#[derive(Clone, Debug, Default)]
pub struct Received {
    /// Subject, routing key, topic, stream key or URL path.
    pub destination: String,
    /// The payload, parsed.
    pub body: serde_json::Value,
    /// Headers, properties or fields, by name as received.
    pub headers: BTreeMap<String, String>,
    /// The message key (Kafka).
    pub key: Option<String>,
    /// Broker-specific properties (AMQP `message_id`, the raw webhook body, …).
    pub extra: BTreeMap<String, String>,
}

impl Received {
    /// A header by name, compared case-insensitively.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The `postbox-event-id` header, parsed.
    pub fn event_id(&self) -> Option<i64> {
        self.header("postbox-event-id")?.parse().ok()
    }
}

/// What a harness's consumer has received so far.
pub struct Collector {
    items: Mutex<Vec<Received>>,
    count: watch::Sender<usize>,
}

impl Default for Collector {
    fn default() -> Self {
        Collector {
            items: Mutex::new(Vec::new()),
            count: watch::channel(0).0,
        }
    }
}

impl Collector {
    /// Records a received message.
    pub fn push(&self, r: Received) {
        let mut items = self.items.lock().expect("collector");
        items.push(r);
        self.count.send_replace(items.len());
    }

    /// Everything received so far.
    pub fn snapshot(&self) -> Vec<Received> {
        self.items.lock().expect("collector").clone()
    }

    /// Waits until at least `n` messages arrived or `within` passed; returns what arrived.
    pub async fn wait_for(&self, n: usize, within: Duration) -> Vec<Received> {
        let mut count = self.count.subscribe();
        let _ = tokio::time::timeout(within, count.wait_for(|c| *c >= n)).await;
        self.snapshot()
    }

    /// Waits until every id in `ids` arrived or `within` passed; returns what arrived.
    pub async fn wait_for_ids(&self, ids: &[i64], within: Duration) -> Vec<Received> {
        let deadline = Instant::now() + within;
        let mut count = self.count.subscribe();
        loop {
            let got = self.snapshot();
            let seen: HashSet<i64> = got.iter().filter_map(Received::event_id).collect();
            if ids.iter().all(|id| seen.contains(id)) || Instant::now() >= deadline {
                return got;
            }
            let _ = tokio::time::timeout_at(deadline, count.changed()).await;
        }
    }
}

/// One sink under test, with a destination of its own, a real consumer, and a way to take the
/// broker away from the sink (a [`crate::proxy::Proxy`], or the Kafka mock cluster).
#[allow(
    async_fn_in_trait,
    reason = "the suite awaits the harness on the test's own task"
)]
pub trait Harness: Sized {
    /// The sink under test.
    type Sink: Sink + postbox_sinks::RoutableSink;

    /// Sets up a fresh destination and a sink whose `publish_timeout` is `publish_timeout`.
    async fn start(publish_timeout: Duration) -> Self;
    /// The sink under test.
    fn sink(&self) -> &Self::Sink;
    /// What the harness's consumer received.
    fn collector(&self) -> &Collector;
    /// Where `event` should arrive (rendered from the harness's template).
    fn expected_destination(&self, event: &OutboxEvent) -> String;
    /// Another destination template the consumer also sees (as a route would give it to
    /// `RoutableSink::publish_to`), and where [`full_event`] published to it arrives.
    fn other_destination(&self) -> (String, String);
    /// The broker is unreachable for the sink.
    async fn broker_down(&self);
    /// The broker keeps receiving, but no acknowledgement reaches the sink.
    async fn stall_acks(&self);
    /// Back to normal after `broker_down` or `stall_acks`.
    async fn broker_up(&self);
    /// Checks of one received message beyond the common ones (dedup field, persistence, …).
    fn check_specific(&self, event: &OutboxEvent, got: &Received);
    /// Removes what the harness created on the broker.
    async fn cleanup(self);
}

/// A received message carries exactly the payload and the metadata of `event`.
pub fn check_common(event: &OutboxEvent, got: &Received) {
    let payload: serde_json::Value = serde_json::from_str(event.payload.get()).expect("payload");
    assert_eq!(got.body, payload, "body of event {}", event.id);
    let expect = |name: &str, value: &str| {
        assert_eq!(
            got.header(name),
            Some(value),
            "header {name} of event {}: {:?}",
            event.id,
            got.headers
        );
    };
    expect("postbox-event-id", &event.id.to_string());
    expect("postbox-dedup-id", &event.dedup_id());
    expect("postbox-event-type", &event.event_type);
    expect("postbox-schema-version", &event.schema_version.to_string());
    expect("postbox-created-at", "2026-04-24T10:00:00.000Z");
    for (name, value) in [
        ("postbox-aggregate-type", &event.aggregate_type),
        ("postbox-aggregate-id", &event.aggregate_id),
        (
            "postbox-tenant",
            &event.tenant.as_ref().map(ToString::to_string),
        ),
        ("postbox-event-class", &event.event_class),
    ] {
        assert_eq!(got.header(name), value.as_deref(), "header {name}");
    }
    for (name, value) in &event.headers {
        expect(name, value);
    }
}

/// Publishes a marker behind `events` to each of their destinations and waits for the markers;
/// returns what arrived, markers left out. A marker is a copy of an event under a new id, so it
/// renders to the same subject, queue, topic, stream or path, with the same key (so the same
/// Kafka partition). A consumer of one destination (one partition) receives in publish order on
/// every broker here, so once the markers are in, anything more the sink sent for `events` (a
/// repeat, a stray copy) is in too: no guess at how long a broker takes.
async fn received_behind_markers<H: Harness>(h: &H, events: &[&OutboxEvent]) -> Vec<Received> {
    let mut seen = HashSet::new();
    let mut markers = Vec::new();
    for event in events {
        if seen.insert(h.expected_destination(event)) {
            let mut marker = (*event).clone();
            marker.id = event_id();
            marker.idempotency_key = None;
            markers.push(marker);
        }
    }
    for marker in &markers {
        h.sink().publish(marker).await.expect("marker acknowledged");
    }
    let ids: Vec<i64> = markers.iter().map(|m| m.id).collect();
    let got = h
        .collector()
        .wait_for_ids(&ids, Duration::from_secs(20))
        .await;
    for marker in &markers {
        find(&got, marker);
    }
    got.into_iter()
        .filter(|r| !r.event_id().is_some_and(|id| ids.contains(&id)))
        .collect()
}

fn find<'a>(got: &'a [Received], event: &OutboxEvent) -> &'a Received {
    got.iter()
        .find(|r| r.event_id() == Some(event.id))
        .unwrap_or_else(|| {
            panic!(
                "event {} was acknowledged but not received: {got:?}",
                event.id
            )
        })
}

fn assert_retryable(result: Result<(), PublishError>, what: &str) -> PublishError {
    match result {
        Ok(()) => panic!("{what}: the sink claimed success"),
        Err(e) => {
            assert!(
                !e.is_permanent(),
                "{what}: expected a retryable error, got {e}"
            );
            e
        }
    }
}

/// Publish → a real consumer receives exactly what was acknowledged, headers included.
pub async fn delivers_exactly_what_was_acked<H: Harness>() {
    let h = H::start(Duration::from_secs(5)).await;
    let full = full_event();
    let bare = bare_event();
    h.sink()
        .publish(&full)
        .await
        .expect("full event acknowledged");
    h.sink()
        .publish(&bare)
        .await
        .expect("bare event acknowledged");
    let got = received_behind_markers(&h, &[&full, &bare]).await;
    assert_eq!(
        got.len(),
        2,
        "received exactly the two acknowledged events: {got:?}"
    );
    for event in [&full, &bare] {
        let r = find(&got, event);
        check_common(event, r);
        assert_eq!(r.destination, h.expected_destination(event), "destination");
        h.check_specific(event, r);
    }
    h.cleanup().await;
}

/// Broker away → publish fails as retryable within a bounded time, never claiming success;
/// broker back → the next publish is delivered without any help.
pub async fn recovers_after_the_broker_comes_back<H: Harness>() {
    let timeout = Duration::from_secs(3);
    let h = H::start(timeout).await;
    let before = full_event();
    h.sink()
        .publish(&before)
        .await
        .expect("publish before the outage");

    h.broker_down().await;
    let during = bare_event();
    let started = Instant::now();
    let err = assert_retryable(
        h.sink().publish(&during).await,
        "publish while the broker is down",
    );
    let took = started.elapsed();
    assert!(
        took <= timeout + Duration::from_secs(2),
        "publish while down took {took:?}, more than its timeout {timeout:?}: {err}"
    );

    h.broker_up().await;
    let after = full_event();
    h.sink()
        .publish(&after)
        .await
        .expect("the first publish after the broker came back is delivered");

    let got = h
        .collector()
        .wait_for_ids(&[before.id, after.id], Duration::from_secs(15))
        .await;
    for event in [&before, &after] {
        check_common(event, find(&got, event));
    }
    h.cleanup().await;
}

/// The broker receives the message but its acknowledgement never arrives: the publish fails
/// (retryable) within its timeout instead of claiming success; once answers flow again the next
/// publish is acknowledged.
pub async fn no_success_without_an_acknowledgement<H: Harness>() {
    let timeout = Duration::from_secs(2);
    let h = H::start(timeout).await;
    h.sink()
        .publish(&full_event())
        .await
        .expect("publish before the stall");

    h.stall_acks().await;
    let started = Instant::now();
    let err = assert_retryable(
        h.sink().publish(&bare_event()).await,
        "publish whose acknowledgement is lost",
    );
    let took = started.elapsed();
    assert!(
        took <= timeout + Duration::from_secs(2),
        "publish without an ack took {took:?}, more than its timeout {timeout:?}: {err}"
    );

    h.broker_up().await;
    let after = full_event();
    h.sink()
        .publish(&after)
        .await
        .expect("publish after the stall");
    let got = h
        .collector()
        .wait_for_ids(&[after.id], Duration::from_secs(15))
        .await;
    check_common(&after, find(&got, &after));
    h.cleanup().await;
}

/// Many concurrent publishes: every one acknowledged, every one received once.
pub async fn concurrent_publishes_are_all_delivered<H: Harness>(n: usize) {
    let h = H::start(Duration::from_secs(10)).await;
    let events: Vec<OutboxEvent> = (0..n).map(|_| full_event()).collect();
    let results = futures::future::join_all(events.iter().map(|e| h.sink().publish(e))).await;
    for (event, result) in events.iter().zip(results) {
        result.unwrap_or_else(|e| panic!("event {} not acknowledged: {e}", event.id));
    }
    let ids: Vec<i64> = events.iter().map(|e| e.id).collect();
    let got = received_behind_markers(&h, &events.iter().collect::<Vec<_>>()).await;
    let seen: Vec<i64> = got.iter().filter_map(Received::event_id).collect();
    let unique: HashSet<i64> = seen.iter().copied().collect();
    assert_eq!(
        unique,
        ids.iter().copied().collect(),
        "every acknowledged event received"
    );
    assert_eq!(seen.len(), n, "no event received twice");
    h.cleanup().await;
}

/// `publish_to` with a destination of its own (a route's) delivers there, over the same
/// connection, with everything a plain publish carries.
pub async fn publishes_to_a_destination_given_per_call<H: Harness>() {
    use postbox_sinks::{RoutableSink, Template};
    let h = H::start(Duration::from_secs(5)).await;
    let (template, expected) = h.other_destination();
    let template: Template = template.parse().expect("template");
    let routed = full_event();
    let plain = full_event();
    h.sink()
        .publish_to(&routed, Some(&template))
        .await
        .expect("acknowledged at the given destination");
    h.sink()
        .publish_to(&plain, None)
        .await
        .expect("acknowledged at the sink's own destination");
    let got = h
        .collector()
        .wait_for_ids(&[routed.id, plain.id], Duration::from_secs(10))
        .await;
    let r = find(&got, &routed);
    check_common(&routed, r);
    h.check_specific(&routed, r);
    assert_eq!(r.destination, expected, "the route's destination");
    assert_eq!(
        find(&got, &plain).destination,
        h.expected_destination(&plain),
        "None: the sink's own destination"
    );
    h.cleanup().await;
}

/// An event lacking a value the template needs fails permanently, and nothing is sent.
pub async fn missing_template_value_is_permanent<H: Harness>() {
    let h = H::start(Duration::from_secs(5)).await;
    let mut event = full_event();
    event.aggregate_type = None;
    let err = h.sink().publish(&event).await.expect_err("cannot render");
    assert!(err.is_permanent(), "{err}");
    assert!(err.to_string().contains("aggregate_type"), "{err}");
    // Nothing was sent: had anything been, it would be in before a marker to the sink's own
    // destination (the event's could not be rendered).
    let mut marker = full_event();
    marker.id = event_id();
    let got = received_behind_markers(&h, &[&marker]).await;
    assert!(got.is_empty(), "nothing sent for the event: {got:?}");
    h.cleanup().await;
}
