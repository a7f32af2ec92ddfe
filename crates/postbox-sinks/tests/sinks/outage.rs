//! A webhook endpoint that is down, or refuses the relay's credentials, for a while: a relay
//! with the real sink (behind its breaker) rides it out — no event ends `FAILED`, no try is
//! spent, the endpoint is probed rather than flooded, and everything is published once it is
//! back. Needs PostgreSQL on 127.0.0.1:5432.

#![allow(clippy::unwrap_used, reason = "tests")]

use std::sync::Arc;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use postbox::StoreExt;
use postbox::ops::StoreOps;
use postbox::{Event, PgStore, Relay, RelayConfig};
use postbox_sinks::{SinkConfig, SinkSetup};
use postbox_testkit::{TestDb, wait_until};
use tokio::net::TcpListener;

/// An endpoint answering `status` to everything, counting requests.
#[derive(Default)]
struct Endpoint {
    status: AtomicU16,
    requests: AtomicUsize,
}

async fn hook(State(endpoint): State<Arc<Endpoint>>) -> StatusCode {
    endpoint.requests.fetch_add(1, Ordering::SeqCst);
    StatusCode::from_u16(endpoint.status.load(Ordering::SeqCst)).unwrap()
}

async fn serve(endpoint: Arc<Endpoint>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new()
        .route("/hooks/{kind}", post(hook))
        .with_state(endpoint);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/hooks/{{event_type}}")
}

async fn ride_out(down_status: u16) {
    let db = TestDb::new().await;
    let store = PgStore::new(db.pool().clone());
    postbox::migrate(&store).await.unwrap();
    let endpoint = Arc::new(Endpoint::default());
    endpoint.status.store(down_status, Ordering::SeqCst);
    let url = serve(Arc::clone(&endpoint)).await;
    // Two tries per event, backoffs of 20 ms: were the outage spent on tries, every event would
    // be FAILED long before it ends.
    let outbox = store.outbox_builder().max_retries(2).build();
    let mut tx = db.pool().begin().await.unwrap();
    let events = (0..200).map(|i| {
        Event::new("Paid", &serde_json::json!({ "i": i }))
            .unwrap()
            .without_idempotency_key()
    });
    outbox.enqueue_many(&mut tx, events).await.unwrap();
    tx.commit().await.unwrap();

    let setup = SinkSetup::Single(Box::new(
        SinkConfig::from_table(
            &serde_json::json!({"kind": "webhook", "url": url, "publish_timeout": "1s"}),
            Duration::from_secs(2),
        )
        .unwrap(),
    ));
    let opened = setup.open().await.unwrap();
    let config = RelayConfig::default()
        .poll_interval(Duration::from_millis(100))
        .publish_timeout(Duration::from_secs(2))
        .lease(Duration::from_secs(5))
        .retry(postbox::backoff::Backoff::new(
            Duration::from_millis(20),
            Duration::from_millis(100),
        ));
    let relay = Relay::from_parts(
        Arc::new(PgStore::new(db.pool().clone())),
        opened.sink,
        config,
    )
    .unwrap();
    let handle = relay.start();
    // The subject: the endpoint is down for 3 s.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let during = endpoint.requests.load(Ordering::SeqCst);
    let health = relay_health(&store).await;
    let failed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox_events WHERE status = 'FAILED' OR retry_count > 0",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(failed, 0, "the outage spent no try");
    // The first wave of concurrent publishes (the relay's `concurrency`, 64) finds it down;
    // after that only probes, with backoff (250 ms, 500 ms, 1 s, 2 s …).
    assert!(
        during <= 64 + 10,
        "{during} requests reached the endpoint while it was down"
    );
    assert!(
        health
            .iter()
            .any(|h| !h.health.up && h.health.name == "webhook"),
        "status can tell the sink is down: {health:?}"
    );
    endpoint.status.store(200, Ordering::SeqCst);
    wait_until(
        "every event is published",
        Duration::from_secs(30),
        || async {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM outbox_events WHERE status = 'PROCESSED'",
            )
            .fetch_one(db.pool())
            .await
            .unwrap()
                == 200
        },
    )
    .await;
    let stats = handle.stop().await.unwrap();
    assert_eq!((stats.failed_tries, stats.gave_up), (0, 0), "{stats:?}");
    assert!(stats.deferred > 0, "{stats:?}");
}

/// What relays reported of their sinks, once a report of a sink down is in.
async fn relay_health(store: &PgStore) -> Vec<postbox::store::ReportedSink> {
    wait_until(
        "a relay reported its sink down",
        Duration::from_secs(5),
        || async {
            let reported = store.sinks_reported().await.unwrap();
            reported.iter().any(|r| !r.health.up)
        },
    )
    .await;
    store.sinks_reported().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_answering_503_for_a_while_fails_nothing() {
    ride_out(503).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_rotation_answering_401_for_a_while_fails_nothing() {
    ride_out(401).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_nobody_listens_to_fails_nothing() {
    // Connection refused: the port was bound and closed.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let error = postbox_sinks::WebhookSink::new(postbox_sinks::WebhookConfig::new(
        format!("http://127.0.0.1:{port}/x").parse().unwrap(),
    ))
    .unwrap();
    let event = postbox_testkit::event(1).build();
    let e = postbox::Sink::publish(&error, &event).await.unwrap_err();
    assert!(e.is_unavailable(), "{e}");
}

/// A route whose endpoint accepts connections and never answers (a hung server) beside a healthy
/// one: the healthy route's events are all published within seconds, while the hung route's
/// events wait, with no try spent — its first requests time out (the sink's own timeout, 1 s
/// here), its breaker opens, and its events stop taking publish slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_route_does_not_hold_up_a_healthy_one() {
    let kinds = (0..600).map(|i| if i % 2 == 0 { "Stuck" } else { "Fast" });
    let took = hung_beside_healthy(kinds.collect()).await;
    // Without the breaker, the 300 hung events would take the 64 publish slots a second at a
    // time: about 5 s.
    assert!(took < Duration::from_secs(4), "{took:?}");
}

/// The hung route's backlog is older than the healthy route's events, and ten batches long:
/// once its breaker is open, claims reach past its events (put back until the next probe) to
/// the healthy route's, instead of pausing the whole table on every batch of hung events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_down_routes_backlog_does_not_starve_a_healthy_route() {
    let mut kinds = vec!["Stuck"; 1000];
    kinds.extend(["Fast"; 100]);
    let took = hung_beside_healthy(kinds).await;
    // Pausing the table while a claim held only hung events would take one probe backoff per
    // batch of 100 (0.25 s, 0.5 s, 1 s, … : over 60 s).
    assert!(took < Duration::from_secs(5), "{took:?}");
}

/// Enqueues events of `kinds` ("Stuck" or "Fast", in id order), runs a relay routing "Stuck" to
/// a hung endpoint and "Fast" to a healthy one until every "Fast" event is published, checks no
/// try was spent, and returns how long that took.
async fn hung_beside_healthy(kinds: Vec<&'static str>) -> Duration {
    let db = TestDb::new().await;
    let store = PgStore::new(db.pool().clone());
    postbox::migrate(&store).await.unwrap();
    let healthy = Arc::new(Endpoint::default());
    healthy.status.store(200, Ordering::SeqCst);
    let healthy_url = serve(Arc::clone(&healthy)).await;
    // Accepts, reads nothing, answers nothing.
    let hung = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hung_url = format!("http://{}/hooks/{{event_type}}", hung.local_addr().unwrap());
    let _hung = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = hung.accept().await {
            held.push(socket);
        }
    });

    let fast = kinds.iter().filter(|k| **k == "Fast").count();
    let outbox = store.outbox_builder().max_retries(2).build();
    let mut tx = db.pool().begin().await.unwrap();
    let events = kinds.iter().enumerate().map(|(i, kind)| {
        Event::new(*kind, &serde_json::json!({ "i": i }))
            .unwrap()
            .without_idempotency_key()
    });
    outbox.enqueue_many(&mut tx, events).await.unwrap();
    tx.commit().await.unwrap();

    let routing = postbox_sinks::RoutingConfig {
        sinks: [
            (
                "stuck".to_owned(),
                serde_json::json!({"kind": "webhook", "url": hung_url, "publish_timeout": "1s"}),
            ),
            (
                "fast".to_owned(),
                serde_json::json!({"kind": "webhook", "url": healthy_url, "publish_timeout": "1s"}),
            ),
        ]
        .into_iter()
        .collect(),
        routes: vec![
            serde_json::json!({"event_type": "Stuck", "sink": "stuck"}),
            serde_json::json!({"event_type": "Fast", "sink": "fast"}),
        ],
        routing: None,
    };
    let setup = SinkSetup::Routed(Box::new(routing.check(Duration::from_secs(2)).unwrap()));
    let opened = setup.open().await.unwrap();
    let config = RelayConfig::default()
        .poll_interval(Duration::from_millis(100))
        .publish_timeout(Duration::from_secs(2))
        .lease(Duration::from_secs(5));
    let relay = Relay::from_parts(
        Arc::new(PgStore::new(db.pool().clone())),
        opened.sink,
        config,
    )
    .unwrap();
    let started = std::time::Instant::now();
    let handle = relay.start();
    wait_until(
        &format!("the healthy route's {fast} events are published"),
        Duration::from_secs(20),
        || async {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM outbox_events WHERE status = 'PROCESSED' AND event_type = 'Fast'",
            )
            .fetch_one(db.pool())
            .await
            .unwrap()
                == i64::try_from(fast).unwrap()
        },
    )
    .await;
    let took = started.elapsed();
    let stats = handle.stop().await.unwrap();
    let spent: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox_events WHERE status = 'FAILED' OR retry_count > 0",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(spent, 0, "the hung route spent no try: {stats:?}");
    took
}
