//! The admin server over a real relay on PostgreSQL: metrics scraped and parsed, probes before
//! and after migrating, every API route with no token, a wrong one and the right one, bad
//! input, retries from the API, and alerts on a local webhook.

#![allow(
    clippy::unwrap_used,
    reason = "tests fail loudly on the first unexpected error"
)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use postbox::StoreExt;
use postbox::{Event, PgStore, Relay, RelayConfig, RelayHandle, Store, backoff::Backoff};
use postbox_admin::alerts::{AlertConfig, Alerts};
use postbox_admin::{Admin, AdminError, Token};
use postbox_testkit::{Behaviour, RecordingSink, TestDb, wait_until};
use tokio::sync::oneshot;

const TOKEN: &str = "test-token-0123456789abcdef";

fn config() -> RelayConfig {
    RelayConfig::default()
        .poll_interval(Duration::from_millis(50))
        .lease(Duration::from_secs(5))
        .retry(Backoff {
            base: Duration::from_millis(20),
            cap: Duration::from_millis(100),
        })
        .publish_timeout(Duration::from_secs(2))
}

/// A relay and an admin server on a fresh database.
struct Setup {
    db: TestDb,
    store: Arc<dyn Store>,
    sink: RecordingSink,
    relay: Option<RelayHandle>,
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    server: tokio::task::JoinHandle<Result<(), AdminError>>,
}

impl Setup {
    async fn new(migrate: bool, alerts: Option<Alerts>) -> Setup {
        Setup::with_config(migrate, alerts, config()).await
    }

    async fn with_config(migrate: bool, alerts: Option<Alerts>, config: RelayConfig) -> Setup {
        let db = TestDb::new().await;
        let store = PgStore::new(db.pool().clone());
        if migrate {
            postbox::migrate(&store).await.unwrap();
        }
        let store: Arc<dyn Store> = Arc::new(store);
        let sink = RecordingSink::new();
        let relay = Relay::from_parts(Arc::clone(&store), Arc::new(sink.clone()), config).unwrap();
        let mut builder = Admin::builder(Arc::clone(&store))
            .relay(relay.clone())
            .metrics(postbox_admin::install_metrics().unwrap())
            .token(Token::new(TOKEN).unwrap())
            .refresh(Duration::from_millis(200));
        if let Some(alerts) = alerts {
            builder = builder.alerts(alerts);
        }
        let admin = builder.bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = admin.local_addr();
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(admin.serve(async move {
            let _ = stopped.await;
        }));
        // On a database without tables only the server runs.
        let relay = migrate.then(|| relay.start());
        Setup {
            db,
            store,
            sink,
            relay,
            addr,
            stop: Some(stop),
            server,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    async fn enqueue(&self, event_type: &str, n: usize) -> Vec<i64> {
        let outbox = self.store.outbox();
        let mut tx = self.db.pool().begin().await.unwrap();
        let events: Vec<Event> = (0..n)
            .map(|i| Event::new(event_type, &serde_json::json!({ "i": i })).unwrap())
            .collect();
        let done = outbox.enqueue_many(&mut tx, events).await.unwrap();
        tx.commit().await.unwrap();
        done.into_iter().map(|e| e.id().unwrap()).collect()
    }

    /// One event of `event_type` that `behaviour` makes `FAILED`; the sink is polite again after.
    async fn failed_event(&self, event_type: &str, behaviour: Behaviour) -> i64 {
        self.sink.script(event_type, behaviour);
        let id = self.enqueue(event_type, 1).await[0];
        wait_until("the event is FAILED", Duration::from_secs(10), || async {
            self.status_of(id).await == "FAILED"
        })
        .await;
        self.sink.unscript(event_type);
        id
    }

    /// Points of the page's history so far: one per refresh round of the server.
    async fn history_points(&self) -> usize {
        let (_, body) = get(&self.url("/api/status"), Some(TOKEN)).await;
        let status: serde_json::Value = serde_json::from_str(&body).unwrap();
        status["history"].as_array().map_or(0, Vec::len)
    }

    async fn status_of(&self, id: i64) -> String {
        sqlx::query_scalar("SELECT status FROM outbox_events WHERE id = $1")
            .bind(id)
            .fetch_one(self.db.pool())
            .await
            .unwrap()
    }

    async fn stop(mut self) {
        if let Some(relay) = self.relay.take() {
            relay.stop().await.unwrap();
        }
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.server.await.unwrap().unwrap();
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::new()
}

async fn get(url: &str, token: Option<&str>) -> (u16, String) {
    let mut request = client().get(url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

async fn post(url: &str, token: Option<&str>, body: Option<&str>) -> (u16, String) {
    let mut request = client().post(url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body.to_owned());
    }
    let response = request.send().await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

#[tokio::test]
async fn metrics_are_scraped_and_parsed_while_events_flow() {
    let s = Setup::new(true, None).await;
    s.sink.script("Broken", Behaviour::FailPermanently);
    let broken = s.enqueue("Broken", 1).await[0];
    let ids = s.enqueue("OrderPlaced", 25).await;
    wait_until("25 events published", Duration::from_secs(10), || async {
        ids.iter().all(|id| s.sink.published_ids().contains(id))
    })
    .await;
    wait_until(
        "the broken event is FAILED",
        Duration::from_secs(10),
        || async { s.status_of(broken).await == "FAILED" },
    )
    .await;
    // The marks of published events are counted once written, and the gauges refresh every
    // 200 ms here: scraped until both show this test's events.
    let scraped = || async {
        let (code, text) = get(&s.url("/metrics"), None).await;
        assert_eq!(code, 200);
        let lines = text.lines().map(|l| Ok(l.to_owned()));
        (prometheus_parse::Scrape::parse(lines).unwrap(), text)
    };
    let counted = |scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]| {
        scrape
            .samples
            .iter()
            .find(|x| x.metric == name && labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v)))
            .and_then(|x| match &x.value {
                prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Gauge(v) => Some(*v),
                _ => None,
            })
    };
    let (scrape, text) = wait_until(
        "the scrape shows this test's events published and none pending",
        Duration::from_secs(10),
        || async {
            let (scrape, text) = scraped().await;
            let published = counted(
                &scrape,
                "postbox_events_published_total",
                &[("tenant", "default")],
            );
            let pending = counted(
                &scrape,
                "postbox_events",
                &[("tenant", "default"), ("status", "PENDING")],
            );
            if published >= Some(25.0) && pending == Some(0.0) {
                Ok((scrape, text))
            } else {
                Err(format!(
                    "published {published:?}, pending {pending:?}\n{text}"
                ))
            }
        },
    )
    .await;
    let value = |name: &str, labels: &[(&str, &str)]| -> Option<f64> {
        scrape
            .samples
            .iter()
            .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .map(|s| match &s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => *v,
                prometheus_parse::Value::Histogram(h) => h.last().map_or(0.0, |b| b.count),
                prometheus_parse::Value::Summary(_) => f64::NAN,
            })
    };
    let published = value("postbox_events_published_total", &[("tenant", "default")]).unwrap();
    assert!(published >= 25.0, "published {published}\n{text}");
    let acked = value(
        "postbox_publish_outcomes_total",
        &[
            ("tenant", "default"),
            ("route", "default"),
            ("outcome", "ok"),
        ],
    )
    .unwrap_or_default();
    assert!(acked >= 25.0, "acknowledgements per route {acked}\n{text}");
    for (name, labels) in [
        (
            "postbox_publish_outcomes_total",
            &[
                ("tenant", "default"),
                ("route", "default"),
                ("outcome", "failed"),
            ][..],
        ),
        (
            "postbox_publish_failures_total",
            &[("tenant", "default")][..],
        ),
        ("postbox_events_failed_total", &[("tenant", "default")][..]),
    ] {
        // Other tests of this process count into the same recorder: at least this one.
        assert!(
            value(name, labels).is_some_and(|v| v >= 1.0),
            "{name}\n{text}"
        );
    }
    let latencies = value(
        "postbox_publish_latency_seconds",
        &[("tenant", "default"), ("route", "default")],
    )
    .unwrap();
    assert!(latencies >= 25.0, "latency samples {latencies}\n{text}");
    assert!(value("postbox_claim_seconds", &[("tenant", "default")]).unwrap() >= 1.0);
    assert!(value("postbox_mark_seconds", &[("tenant", "default")]).unwrap() >= 1.0);
    assert!(value("postbox_batch_size", &[("tenant", "default")]).unwrap() >= 1.0);
    assert_eq!(
        value(
            "postbox_events",
            &[("tenant", "default"), ("status", "PENDING")]
        ),
        Some(0.0),
        "{text}"
    );
    assert!(
        value(
            "postbox_oldest_pending_age_seconds",
            &[("tenant", "default")]
        )
        .is_some()
    );
    assert_eq!(value("postbox_build_info", &[]), Some(1.0));
    // Help text comes from the recorder's descriptions.
    assert!(
        scrape
            .docs
            .get("postbox_publish_latency_seconds")
            .is_some_and(|d| d.contains("acknowledgement")),
        "{:?}",
        scrape.docs
    );
    s.stop().await;
}

/// The counters of what a relay does beside publishing reach the scrape: an event recovered from
/// a dead relay's expired claim, a result fenced off because another relay took the event over,
/// and the relay's own vacuum of the table.
#[tokio::test]
async fn recoveries_fences_and_vacuums_are_counted_in_the_scrape() {
    let s = Setup::with_config(true, None, config().vacuum_threshold(Some(1))).await;
    // A dead relay's claim: PROCESSING, its lease long gone.
    let stale: i64 = sqlx::query_scalar(
        "INSERT INTO outbox_events (event_type, payload, status, locked_by, locked_until, claim_token)
         VALUES ('Stale', '{}', 'PROCESSING', 'dead-relay', now() - interval '1 minute',
                 gen_random_uuid())
         RETURNING id",
    )
    .fetch_one(s.db.pool())
    .await
    .unwrap();
    wait_until(
        "the stale event is published",
        Duration::from_secs(10),
        || async { s.sink.published_ids().contains(&stale) },
    )
    .await;
    // Taken over while this relay publishes it: the slow publish ends with a result that must
    // not be recorded.
    s.sink
        .script("Slow", Behaviour::Slow(Duration::from_millis(1500)));
    let slow = s.enqueue("Slow", 1).await[0];
    wait_until(
        "the slow event is claimed",
        Duration::from_secs(10),
        || async { s.status_of(slow).await == "PROCESSING" },
    )
    .await;
    sqlx::query("UPDATE outbox_events SET claim_token = gen_random_uuid() WHERE id = $1")
        .bind(slow)
        .execute(s.db.pool())
        .await
        .unwrap();
    s.enqueue("OrderPlaced", 50).await;
    let scrape = || async {
        let (_, text) = get(&s.url("/metrics"), None).await;
        let lines = text.lines().map(|l| Ok(l.to_owned()));
        prometheus_parse::Scrape::parse(lines).unwrap()
    };
    let count = |scrape: &prometheus_parse::Scrape, name: &str| -> f64 {
        scrape
            .samples
            .iter()
            .filter(|x| x.metric == name && x.labels.get("tenant") == Some("default"))
            .map(|x| match x.value {
                prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Untyped(v) => v,
                _ => 0.0,
            })
            .sum()
    };
    for name in [
        "postbox_stale_recovered_total",
        "postbox_events_fenced_total",
        "postbox_vacuums_total",
    ] {
        // Other tests of this process count into the same recorder: at least this one's.
        wait_until(name, Duration::from_secs(20), || async {
            count(&scrape().await, name) >= 1.0
        })
        .await;
    }
    s.stop().await;
}

#[tokio::test]
async fn readyz_says_what_is_missing_before_migrating_and_is_ready_after() {
    let s = Setup::new(false, None).await;
    assert_eq!(
        get(&s.url("/healthz"), None).await,
        (200, "ok\n".to_owned())
    );
    let (code, body) = get(&s.url("/readyz"), None).await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("not migrated"), "{body}");
    let store = PgStore::new(s.db.pool().clone());
    postbox::migrate(&store).await.unwrap();
    let (code, body) = get(&s.url("/readyz"), None).await;
    assert_eq!((code, body.as_str()), (200, "ready\n"));
    s.stop().await;
}

/// A readiness check of the application's own (a CDC relay's stalled slot) turns `/readyz` to
/// 503 with its reason while it fails, and back to ready when it passes.
#[tokio::test]
async fn readyz_asks_the_applications_own_checks() {
    let db = TestDb::new().await;
    let store = PgStore::new(db.pool().clone());
    postbox::migrate(&store).await.unwrap();
    let stalled = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let flag = Arc::clone(&stalled);
    let admin = Admin::builder(Arc::new(store))
        .ready_check(move || {
            flag.load(std::sync::atomic::Ordering::Relaxed)
                .then(|| "CDC slot postbox: stalled".to_owned())
        })
        .bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let url = format!("http://{}/readyz", admin.local_addr());
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(admin.serve(async move {
        let _ = stopped.await;
    }));
    let (code, body) = get(&url, None).await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("CDC slot postbox: stalled"), "{body}");
    stalled.store(false, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(get(&url, None).await, (200, "ready\n".to_owned()));
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

/// Every API route: without a token and with a wrong one a bare 401 (the same for unknown
/// paths), with the right one what the route does.
#[tokio::test]
async fn every_api_route_wants_the_token() {
    let s = Setup::new(true, None).await;
    let id = s.enqueue("OrderPlaced", 1).await[0];
    wait_until("published", Duration::from_secs(10), || async {
        s.sink.published_ids().contains(&id)
    })
    .await;
    let routes: Vec<(&str, String, Option<&str>, u16)> = vec![
        ("GET", "/api/status".into(), None, 200),
        ("GET", "/api/events".into(), None, 200),
        ("GET", format!("/api/events/{id}"), None, 200),
        ("POST", format!("/api/events/{id}/retry"), None, 409),
        ("POST", format!("/api/events/{id}/skip"), None, 409),
        ("GET", "/api/events?parked=true".into(), None, 200),
        (
            "POST",
            "/api/events/retry".into(),
            Some(r#"{"all": true}"#),
            200,
        ),
        (
            "POST",
            "/api/replay".into(),
            Some(r#"{"dry_run": true}"#),
            200,
        ),
        ("GET", "/api/tenants".into(), None, 200),
        ("POST", "/api/tenants/acme/suspend".into(), None, 404),
        ("POST", "/api/tenants/acme/resume".into(), None, 404),
        ("GET", "/api/nothing-here".into(), None, 404),
        ("GET", "/secret".into(), None, 404),
    ];
    for (method, path, body, expected) in routes {
        let url = s.url(&path);
        for token in [None, Some("wrong-token-0123456789"), Some(TOKEN)] {
            let (code, text) = match method {
                "GET" => get(&url, token).await,
                _ => post(&url, token, body).await,
            };
            if token == Some(TOKEN) {
                assert_eq!(code, expected, "{method} {path}: {text}");
            } else {
                assert_eq!(code, 401, "{method} {path} with {token:?}: {text}");
                assert_eq!(text, r#"{"error":"unauthorized"}"#, "{method} {path}");
                assert!(!text.contains("OrderPlaced"));
            }
        }
    }
    // What the routes answer, with the token.
    let (_, body) = get(&s.url(&format!("/api/events/{id}")), Some(TOKEN)).await;
    let event: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(event["status"], "PROCESSED");
    assert_eq!(event["event_type"], "OrderPlaced");
    let (_, body) = get(&s.url("/api/status"), Some(TOKEN)).await;
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status["targets"][0]["tenant"], "default");
    assert_eq!(status["targets"][0]["pending"], 0);
    // The library's status report, as `postbox status` prints it.
    assert_eq!(status["targets"][0]["parked_aggregates"], 0);
    assert!(status["targets"][0]["tenant_status"].is_null());
    assert!(
        status.get("oldest_transaction_age_secs").is_some(),
        "{status}"
    );
    // The public routes need none.
    assert_eq!(get(&s.url("/"), None).await.0, 200);
    assert_eq!(get(&s.url("/app.js"), None).await.0, 200);
    s.stop().await;
}

#[tokio::test]
async fn bad_input_gets_a_4xx_naming_what_is_wrong() {
    let s = Setup::new(true, None).await;
    let t = Some(TOKEN);
    let cases = [
        ("/api/events?limit=0", 400, "limit"),
        ("/api/events?limit=5000", 400, "limit"),
        ("/api/events?status=LOST", 400, "status"),
        ("/api/events?since=yesterday", 400, "since"),
        ("/api/events?since=1h&until=2h", 400, "since/until"),
        ("/api/events?order=sideways", 400, "order"),
        ("/api/events?type=%5B", 400, "type"),
        ("/api/events?bogus=1", 400, "bogus"),
        ("/api/events?tenant=no%20such", 400, "tenant"),
        ("/api/events?tenant=nosuch", 404, "nosuch"),
        ("/api/events/123456", 404, "no event 123456"),
        ("/api/events/abc", 400, "not an event id"),
        ("/api/events/-4", 400, "not an event id"),
    ];
    for (path, code, needle) in cases {
        let (got, body) = get(&s.url(path), t).await;
        assert_eq!(got, code, "{path}: {body}");
        assert!(body.contains(needle), "{path}: {body}");
    }
    let retry = s.url("/api/events/retry");
    let (code, body) = post(&retry, t, Some("{not json")).await;
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("request body"), "{body}");
    let (code, body) = post(&retry, t, Some(r#"{"ids": [1], "all": true}"#)).await;
    assert_eq!(code, 400, "{body}");
    let (code, body) = post(&retry, t, Some(r#"{"ids": "1"}"#)).await;
    assert_eq!(code, 400, "{body}");
    let (code, body) = post(&retry, t, Some(r#"{"idz": [1]}"#)).await;
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("idz"), "{body}");
    let big = format!(r#"{{"ids": [{}]}}"#, vec!["1"; 100_000].join(","));
    let (code, _) = post(&retry, t, Some(&big)).await;
    assert_eq!(code, 413);
    let (code, body) = post(&retry, t, None).await;
    assert_eq!(code, 415, "{body}");
    s.stop().await;
}

#[tokio::test]
async fn a_failed_event_is_retried_from_the_api() {
    let s = Setup::new(true, None).await;
    let id = s.failed_event("Flaky", Behaviour::FailPermanently).await;
    let (_, body) = get(&s.url("/api/events?status=FAILED"), Some(TOKEN)).await;
    let page: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(page["events"][0]["id"], id);
    let (code, body) = post(
        &s.url(&format!("/api/events/{id}/retry")),
        Some(TOKEN),
        None,
    )
    .await;
    assert_eq!((code, body.as_str()), (200, r#"{"retried":1}"#));
    wait_until(
        "the retried event is published",
        Duration::from_secs(10),
        || async { s.sink.published_ids().contains(&id) },
    )
    .await;
    s.stop().await;
}

#[tokio::test]
async fn a_replay_from_the_api_publishes_the_chosen_events_again_marked_as_replays() {
    let s = Setup::new(true, None).await;
    let invoices = s.enqueue("InvoicePaid", 3).await;
    let others = s.enqueue("OrderPlaced", 2).await;
    // Replay chooses PROCESSED events: wait for the marks, not only the acknowledgements.
    wait_until("published and marked", Duration::from_secs(10), || async {
        let mut all = true;
        for id in invoices.iter().chain(&others) {
            all &= s.status_of(*id).await == "PROCESSED";
        }
        all && s.sink.published_ids().len() == 5
    })
    .await;
    let url = s.url("/api/replay");
    let (code, body) = post(
        &url,
        Some(TOKEN),
        Some(r#"{"type": "Invoice*", "dry_run": true}"#),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let dry: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(dry["matched"], 3, "{body}");
    assert_eq!(dry["sample"], serde_json::json!(invoices), "{body}");
    assert_eq!(
        s.sink.published_ids().len(),
        5,
        "a dry run publishes nothing"
    );

    let (code, body) = post(&url, Some(TOKEN), Some(r#"{"type": "Invoice*"}"#)).await;
    assert_eq!(code, 200, "{body}");
    let done: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(done["published"], 3, "{body}");
    let replayed: Vec<_> = s
        .sink
        .published()
        .into_iter()
        .filter(|e| e.headers.contains_key("postbox-replay-of"))
        .collect();
    assert_eq!(replayed.len(), 3);
    assert!(
        replayed
            .iter()
            .all(|e| invoices.contains(&e.id) && !others.contains(&e.id))
    );
    assert!(
        replayed
            .iter()
            .all(|e| e.headers.get("postbox-replay-id").map(String::as_str)
                == done["replay_id"].as_str())
    );

    // Pending events are the relays' to publish; a replay refuses them, naming the parameter.
    let (code, body) = post(&url, Some(TOKEN), Some(r#"{"status": "PENDING"}"#)).await;
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("status"), "{body}");
    let (code, body) = post(&url, Some(TOKEN), Some(r#"{"rate": -1}"#)).await;
    assert_eq!(code, 400, "{body}");
    s.stop().await;
}

#[tokio::test]
async fn a_non_loopback_address_needs_a_token_and_a_taken_port_is_an_error() {
    let db = TestDb::new().await;
    let store: Arc<dyn Store> = Arc::new(PgStore::new(db.pool().clone()));
    let err = Admin::builder(Arc::clone(&store))
        .bind("0.0.0.0:0".parse().unwrap())
        .await
        .err()
        .unwrap();
    assert!(matches!(err, AdminError::NoToken(_)), "{err}");
    assert!(err.to_string().contains("POSTBOX_ADMIN_TOKEN"), "{err}");
    let taken = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = Admin::builder(store)
        .bind(taken.local_addr().unwrap())
        .await
        .err()
        .unwrap();
    assert!(matches!(err, AdminError::Bind { .. }), "{err}");
}

/// A webhook of our own that records what it is sent.
async fn webhook() -> (SocketAddr, Arc<Mutex<Vec<serde_json::Value>>>) {
    use axum::routing::post;
    let got = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&got);
    let app = axum::Router::new().route(
        "/hook",
        post(move |axum::Json(body): axum::Json<serde_json::Value>| {
            let record = Arc::clone(&record);
            async move {
                record.lock().unwrap().push(body);
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, got)
}

#[tokio::test]
async fn failed_events_send_one_alert_to_the_webhook_not_one_each() {
    let (hook, got) = webhook().await;
    let mut config = AlertConfig::default();
    config.webhook = Some(format!("http://{hook}/hook"));
    let s = Setup::new(true, Some(Alerts::new(config).unwrap())).await;
    s.sink.script("Rejected", Behaviour::FailPermanently);
    let ids = s.enqueue("Rejected", 10).await;
    wait_until("10 events FAILED", Duration::from_secs(10), || async {
        let mut all = true;
        for id in &ids {
            all &= s.status_of(*id).await == "FAILED";
        }
        all
    })
    .await;
    wait_until("an alert arrives", Duration::from_secs(10), || async {
        !got.lock().unwrap().is_empty()
    })
    .await;
    // Four more refresh rounds, seen as points of the page's history (one per round, after
    // each round's alert checks): nothing more comes (the rest wait for alert_repeat_after).
    let rounds = s.history_points().await;
    wait_until(
        "four more refresh rounds",
        Duration::from_secs(10),
        || async { s.history_points().await >= rounds + 4 },
    )
    .await;
    let alerts = got.lock().unwrap().clone();
    assert_eq!(alerts.len(), 1, "{alerts:#?}");
    assert_eq!(alerts[0]["kind"], "event_failed");
    assert_eq!(alerts[0]["subject"], "default");
    let text = alerts[0]["text"].as_str().unwrap();
    assert!(
        text.contains("Rejected") && text.contains("FAILED"),
        "{text}"
    );
    s.stop().await;
}

/// The page as HTTP sees it: without a session, the sign-in form and no data; a wrong token is
/// refused with 401; the right one sets an `HttpOnly`, `SameSite=Strict` cookie that is not the
/// token; with it the page is rendered on the server and escapes what events carry; a Retry
/// posted from another site is refused, one from the page puts the event back.
#[tokio::test]
async fn the_page_needs_a_session_escapes_what_it_shows_and_refuses_other_sites() {
    let s = Setup::new(true, None).await;
    let evil = "<img src=x onerror=alert(1)>";
    let id = s
        .failed_event(
            "InvoiceRejected",
            Behaviour::FailWith(postbox::PublishError::permanent(evil)),
        )
        .await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();

    let page = http.get(s.url("/")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let csp = page.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("form-action 'self'"),
        "{csp}"
    );
    let body = page.text().await.unwrap();
    assert!(body.contains("login-form"), "the sign-in form: {body}");
    assert!(
        !body.contains("InvoiceRejected"),
        "no data without a session"
    );

    let wrong = http
        .post(s.url("/login"))
        .form(&[("token", "not-the-token-0123456789")])
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    assert!(wrong.headers().get("set-cookie").is_none());
    let body = wrong.text().await.unwrap();
    assert!(body.contains("The token was refused."), "{body}");

    let right = http
        .post(s.url("/login"))
        .form(&[("token", TOKEN)])
        .send()
        .await
        .unwrap();
    assert_eq!(right.status(), 303);
    let cookie = right.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    assert!(
        !cookie.contains(TOKEN),
        "the cookie is not the token: {cookie}"
    );
    let session = cookie.split(';').next().unwrap().to_owned();
    // The cookie opens the page, not the API.
    let api = http
        .get(s.url("/api/status"))
        .header("cookie", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(api.status(), 401);

    let body = http
        .get(s.url("/"))
        .header("cookie", &session)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        body.contains("InvoiceRejected"),
        "the FAILED event is listed"
    );
    assert!(
        !body.contains(evil),
        "an event's text is never markup: {body}"
    );
    assert!(
        body.contains("&#60;img") || body.contains("&lt;img"),
        "it is shown escaped"
    );

    let retry = |origin: String| {
        http.post(s.url("/retry"))
            .header("cookie", &session)
            .header("origin", origin)
            .form(&[("tenant", "default".to_owned()), ("id", id.to_string())])
            .send()
    };
    let forged = retry("http://evil.example".to_owned()).await.unwrap();
    assert_eq!(forged.status(), 403, "a form from another site");
    assert_eq!(s.status_of(id).await, "FAILED");
    let done = retry(format!("http://{}", s.addr)).await.unwrap();
    assert_eq!(done.status(), 200);
    let body = done.text().await.unwrap();
    assert!(
        body.contains(&format!("Event {id} is back in the queue.")),
        "{body}"
    );
    wait_until(
        "the retried event is published",
        Duration::from_secs(10),
        || async { s.sink.published_ids().contains(&id) },
    )
    .await;
    // Without the session, a retry is a sign-in page.
    let anonymous = http
        .post(s.url("/retry"))
        .form(&[("tenant", "default"), ("id", "1")])
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
    s.stop().await;
}

/// The page in headless Chromium (Debian's chromium and chromium-driver, driven by Selenium):
/// it asks for the token (refusing a wrong one), shows the backlog and the FAILED event, and
/// its Retry button puts the event back in the queue.
#[tokio::test]
async fn the_page_shows_a_person_the_failed_event_and_retries_it() {
    let s = Setup::new(true, None).await;
    s.enqueue("OrderPlaced", 30).await;
    let id = s
        .failed_event("InvoiceRejected", Behaviour::FailPermanently)
        .await;
    let screenshot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("admin-page.png");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/admin/browser/page.py");
    let base = s.url("");
    let id_text = id.to_string();
    let shot = screenshot.display().to_string();
    let out = tokio::process::Command::new("python3")
        .args([
            script,
            base.as_str(),
            TOKEN,
            id_text.as_str(),
            shot.as_str(),
        ])
        .output()
        .await
        .expect("python3 runs the browser test (scripts/install-deps installs selenium)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the browser test failed:\n{stderr}");
    let seen: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(seen["asks_for_token"], true, "{seen}");
    assert_eq!(
        seen["rows_without_token"], 0,
        "no data without the token: {seen}"
    );
    assert!(
        seen["wrong_token"].as_str().unwrap().contains("refused"),
        "{seen}"
    );
    assert_eq!(seen["rows_after_wrong_token"], 0, "{seen}");
    assert_eq!(
        seen["session_cookie_http_only"], true,
        "the session cookie is HttpOnly: {seen}"
    );
    assert_eq!(
        seen["script_sees_cookie"], false,
        "no script reads the session: {seen}"
    );
    assert!(
        !seen["address_after_sign_in"]
            .as_str()
            .unwrap()
            .contains(TOKEN),
        "the token stays out of the address bar: {seen}"
    );
    let backlog = seen["backlog"][0].as_str().unwrap();
    assert!(backlog.starts_with("default"), "{seen}");
    let failed_row = seen["failed_row"].as_str().unwrap();
    assert!(
        failed_row.contains("InvoiceRejected") && failed_row.contains("Retry"),
        "{seen}"
    );
    assert!(
        seen["rates"].as_str().unwrap().contains("events/s"),
        "{seen}"
    );
    assert!(
        seen["notice"].as_str().unwrap().contains(&id_text),
        "{seen}"
    );
    wait_until(
        "the retried event is published",
        Duration::from_secs(10),
        || async { s.sink.published_ids().contains(&id) },
    )
    .await;
    assert!(std::fs::metadata(&screenshot).unwrap().len() > 10_000);
    s.stop().await;
}

/// Log lines captured for one test (its runtime is single-threaded, so the server's tasks log
/// through the test thread's subscriber).
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

/// A tenant is suspended and resumed through the API (the registry says so after each call), and
/// each write is one line under `postbox::audit` naming the action and the tenant — never the
/// token.
#[tokio::test]
async fn tenants_are_suspended_and_resumed_and_every_write_is_audited() {
    let logs = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(logs.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    // tracing-core takes a lone registered dispatcher for the global one: a log call site first
    // reached by another test's thread (which has none) would then be cached as disabled for
    // every thread, this one's included. A second live dispatcher makes it ask each of them.
    let _second = tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default());
    let s = Setup::new(true, None).await;
    let acme = postbox::schema::TenantId::new("acme").unwrap();
    s.store
        .tenant_add(&postbox::store::TenantAddParams::new(&acme))
        .await
        .unwrap();
    let status = |s: &Setup| {
        let store = Arc::clone(&s.store);
        async move {
            store
                .tenant_list()
                .await
                .unwrap()
                .into_iter()
                .find(|t| t.id.as_str() == "acme")
                .map(|t| t.status)
        }
    };

    let (code, body) = post(&s.url("/api/tenants/acme/suspend"), Some(TOKEN), None).await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("SUSPENDED"), "{body}");
    assert_eq!(
        status(&s).await,
        Some(postbox::store::TenantStatus::Suspended)
    );
    let (code, body) = post(&s.url("/api/tenants/acme/resume"), Some(TOKEN), None).await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("ACTIVE"), "{body}");
    assert_eq!(status(&s).await, Some(postbox::store::TenantStatus::Active));
    let failed = s.enqueue("Audited", 1).await[0];
    sqlx::query("UPDATE outbox_events SET status = 'FAILED' WHERE id = $1")
        .bind(failed)
        .execute(s.db.pool())
        .await
        .unwrap();
    let (code, body) = post(
        &s.url(&format!("/api/events/{failed}/retry")),
        Some(TOKEN),
        None,
    )
    .await;
    assert_eq!(code, 200, "{body}");
    s.stop().await;

    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let audit: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("postbox::audit"))
        .collect();
    assert_eq!(audit.len(), 3, "one line per write: {text}");
    assert!(
        audit[0].contains("tenant_status")
            && audit[0].contains("acme")
            && audit[0].contains("Suspended")
    );
    assert!(audit[1].contains("tenant_status") && audit[1].contains("Active"));
    assert!(audit[2].contains("retry") && audit[2].contains(&format!("event_id={failed}")));
    assert!(!text.contains(TOKEN), "the token never reaches the log");
}

/// A CDC relay's replication slot, not read and holding WAL back, shows in `/api/status` and on
/// the page, marked as needing attention.
#[tokio::test]
async fn status_and_page_show_the_databases_replication_slots() {
    let s = Setup::new(true, None).await;
    // Slot names are the server's: the test database's own name keeps it apart.
    let slot: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(s.db.pool())
        .await
        .unwrap();
    sqlx::query("SELECT pg_create_logical_replication_slot($1, 'pgoutput')")
        .bind(&slot)
        .execute(s.db.pool())
        .await
        .unwrap();
    let (_, body) = get(&s.url("/api/status"), Some(TOKEN)).await;
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    let slots = status["replication_slots"].as_array().expect("slots");
    assert_eq!(slots.len(), 1, "{status}");
    assert_eq!(slots[0]["name"], slot.as_str());
    assert_eq!(slots[0]["active"], false);
    assert!(slots[0]["lag_bytes"].is_number(), "{status}");

    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let login = http
        .post(s.url("/login"))
        .form(&[("token", TOKEN)])
        .send()
        .await
        .unwrap();
    let cookie = login.headers()["set-cookie"].to_str().unwrap().to_owned();
    let cookie = cookie.split(';').next().unwrap().to_owned();
    let page = http
        .get(s.url("/"))
        .header("cookie", cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("Replication slots (CDC)"), "{page}");
    assert!(
        page.contains(&format!("<td>{slot}</td><td class=\"down\">not read</td>")),
        "{page}"
    );
    s.stop().await;
}
