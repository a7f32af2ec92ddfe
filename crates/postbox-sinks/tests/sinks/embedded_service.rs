//! A small Rust service written from the README and `docs/sinks.md` alone: it connects by URL,
//! takes its producer from the store, reads NATS and webhook routes from TOML, runs the relay
//! in its own process, watches its stats, and stops it. Needs PostgreSQL on 127.0.0.1:5432 and
//! NATS with JetStream on 127.0.0.1:4222.

#![allow(clippy::unwrap_used, reason = "tests")]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use axum::extract::State;
use axum::http::Uri;
use axum::routing::post;
use futures::StreamExt;
use postbox::StoreExt;
use postbox::{Event, RelayConfig};
use postbox_sinks::RoutingConfig;
use postbox_testkit::{TestDb, wait_until};
use tokio::net::TcpListener;

/// What the webhook endpoint received: the path and the event type of each request.
type Hooks = Arc<Mutex<Vec<(String, String)>>>;

async fn hook(State(hooks): State<Hooks>, uri: Uri, body: String) -> &'static str {
    let envelope: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    let event_type = envelope["event_type"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    hooks
        .lock()
        .unwrap()
        .push((uri.path().to_owned(), event_type));
    "ok"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_embeds_the_relay_with_nats_and_webhook_routes_from_toml() {
    let db = TestDb::new().await;

    // The webhook endpoint (an audit service) and a JetStream stream for the billing subjects.
    let hooks = Hooks::default();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook_addr = listener.local_addr().unwrap();
    let app = axum::Router::new()
        .route("/audit/{event_type}", post(hook))
        .with_state(Arc::clone(&hooks));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let prefix = format!("billing_{}", &suffix[..12]);
    let nats = async_nats::connect("127.0.0.1:4222").await.unwrap();
    let js = jetstream::new(nats);
    let stream_name = format!("EMBEDDED_{}", &suffix[..12]);
    let mut billing = js
        .create_stream(stream::Config {
            name: stream_name.clone(),
            subjects: vec![format!("{prefix}.>")],
            ..Default::default()
        })
        .await
        .unwrap();

    // Connect by URL; the producer comes from the store, so both use one table.
    let store = postbox::connect(db.url()).await.unwrap();
    postbox::migrate(&store).await.unwrap();
    let outbox = store.outbox();
    let pool = match &store {
        postbox::AnyStore::Postgres(s) => s.pool().clone(),
        other => panic!("not PostgreSQL: {other:?}"),
    };
    sqlx::query("CREATE TABLE invoices (id BIGINT PRIMARY KEY, amount_cents BIGINT)")
        .execute(&pool)
        .await
        .unwrap();

    // Routes as `docs/sinks.md` writes them: Invoice* to NATS, everything to the audit webhook.
    let routing: RoutingConfig = toml::from_str(&format!(
        r#"
        [sinks.billing]
        kind = "nats"
        url = "nats://127.0.0.1:4222"

        [sinks.audit]
        kind = "webhook"
        secret = "an audit secret with odd characters: ;#%&=\""

        [[routes]]
        event_type = "Invoice*"
        sink = "billing"
        topic = "{prefix}.{{aggregate_type}}.{{event_type}}"

        [[routes]]
        sink = "audit"
        topic = "http://{hook_addr}/audit/{{event_type}}"
        "#
    ))
    .unwrap();
    let router = routing
        .check(Duration::from_secs(10))
        .unwrap()
        .open()
        .await
        .unwrap();
    let config = RelayConfig::default().poll_interval(Duration::from_millis(100));
    let relay = postbox::Relay::new(store, router, config).unwrap();
    let handle = relay.start();

    // A business row and its events in one transaction; a rolled-back one never goes out.
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO invoices VALUES (456, 1200)")
        .execute(&mut *tx)
        .await
        .unwrap();
    let invoice = Event::new("InvoiceCreated", &serde_json::json!({"invoice_id": 456}))
        .unwrap()
        .aggregate("Invoice", "456");
    let login = Event::new("UserLoggedIn", &serde_json::json!({"user": 7})).unwrap();
    outbox
        .enqueue_many(&mut tx, vec![invoice, login])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    let ghost = Event::new("InvoiceCreated", &serde_json::json!({"invoice_id": 999}))
        .unwrap()
        .aggregate("Invoice", "999");
    outbox.enqueue(&mut tx, ghost).await.unwrap();
    tx.rollback().await.unwrap();

    // Watch the relay's live stats until both events are out.
    wait_until("both events published", Duration::from_secs(20), || async {
        handle.stats().published >= 2
    })
    .await;
    let stats = handle.stop().await.unwrap();
    assert_eq!(stats.published, 2, "{stats:?}");
    assert_eq!(stats.gave_up, 0, "{stats:?}");

    // NATS got the invoice event on its billing subject, and nothing else.
    let consumer = billing
        .create_consumer(consumer::pull::Config::default())
        .await
        .unwrap();
    let mut messages = consumer
        .fetch()
        .max_messages(10)
        .expires(Duration::from_secs(1))
        .messages()
        .await
        .unwrap();
    let mut subjects = Vec::new();
    while let Some(message) = messages.next().await {
        let message = message.unwrap();
        subjects.push(message.subject.to_string());
        message.ack().await.unwrap();
    }
    assert_eq!(subjects, vec![format!("{prefix}.Invoice.InvoiceCreated")]);
    assert_eq!(billing.info().await.unwrap().state.messages, 1);
    // The audit webhook got both, each at its event type's path.
    let mut got = hooks.lock().unwrap().clone();
    got.sort();
    assert_eq!(
        got,
        vec![
            (
                "/audit/InvoiceCreated".to_owned(),
                "InvoiceCreated".to_owned()
            ),
            ("/audit/UserLoggedIn".to_owned(), "UserLoggedIn".to_owned()),
        ]
    );
    js.delete_stream(&stream_name).await.unwrap();
}
