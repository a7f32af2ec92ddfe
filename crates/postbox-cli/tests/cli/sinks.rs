//! `postbox relay` publishing to the real brokers on 127.0.0.1, from the command line and from
//! `postbox.toml` routes: events inserted by plain SQL arrive at a consumer of each broker with
//! their headers, routes fan out, unmatched events fail with a reason, a broker away at start-up
//! is waited for, and secrets stay out of logs.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use sqlx::Row as _;

use crate::support::{DEADLINE, Finished, Pg, Running, run};
use postbox_testkit::consumers::{
    AmqpQueue, MqttTopics, NatsStream, Received, RedisStreams, Webhook,
};
use postbox_testkit::proxy::Proxy;
use postbox_testkit::wait_until;

/// How long a consumer may take to see what the relay published.
const ARRIVAL: Duration = Duration::from_secs(20);

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// An event row as the relay read it.
#[derive(Debug)]
struct Row {
    event_type: String,
    aggregate_type: String,
    aggregate_id: String,
    idempotency_key: String,
    payload: serde_json::Value,
}

/// Inserts `n` events by plain SQL, with headers and an idempotency key; returns their ids.
async fn insert(
    pg: &Pg,
    event_type: &str,
    aggregate_type: &str,
    n: i64,
    max_retries: i32,
) -> Vec<i64> {
    let tag = postbox_testkit::consumers::suffix();
    sqlx::query_scalar(
        "INSERT INTO outbox_events
             (event_type, aggregate_type, aggregate_id, payload, headers, idempotency_key, max_retries)
         SELECT $1, $2, a.id, jsonb_build_object('n', g, 'note', 'plain SQL ✓'),
                jsonb_build_object('traceparent', $5::text, 'x-request-source', 'checkout'),
                $2 || ':' || a.id || ':' || $1 || ':2026-04-24', $4
         FROM generate_series(1, $3) AS g,
              LATERAL (SELECT lower($2) || '-' || g || '-' || $6 AS id) AS a
         RETURNING id",
    )
    .bind(event_type)
    .bind(aggregate_type)
    .bind(n)
    .bind(max_retries)
    .bind(TRACEPARENT)
    .bind(tag)
    .fetch_all(pg.db.pool())
    .await
    .expect("insert events")
}

/// Every event row, by id.
async fn rows(pg: &Pg) -> HashMap<i64, Row> {
    sqlx::query(
        "SELECT id, event_type, aggregate_type, aggregate_id, idempotency_key, payload
         FROM outbox_events",
    )
    .fetch_all(pg.db.pool())
    .await
    .expect("rows")
    .into_iter()
    .map(|r| {
        (
            r.get("id"),
            Row {
                event_type: r.get("event_type"),
                aggregate_type: r.get("aggregate_type"),
                aggregate_id: r.get("aggregate_id"),
                idempotency_key: r.get("idempotency_key"),
                payload: r.get("payload"),
            },
        )
    })
    .collect()
}

/// (status, retry_count, last_error) of every event, by id.
async fn states(pg: &Pg) -> BTreeMap<i64, (String, i32, Option<String>)> {
    sqlx::query("SELECT id, status, retry_count, last_error FROM outbox_events")
        .fetch_all(pg.db.pool())
        .await
        .expect("states")
        .into_iter()
        .map(|r| {
            (
                r.get("id"),
                (r.get("status"), r.get("retry_count"), r.get("last_error")),
            )
        })
        .collect()
}

/// Runs `postbox` with `args` (and `env`) to completion without blocking the runtime the
/// consumers run on.
async fn postbox(pg: &Pg, args: &[&str], env: &[(&str, &str)]) -> Finished {
    let mut cmd = pg.cmd(args);
    for (name, value) in env {
        cmd.env(name, value);
    }
    tokio::task::spawn_blocking(move || run(cmd))
        .await
        .expect("postbox runner")
}

/// Like [`postbox`], and the command must succeed.
async fn postbox_ok(pg: &Pg, args: &[&str], env: &[(&str, &str)]) -> Finished {
    let out = postbox(pg, args, env).await;
    assert!(
        out.status.success(),
        "postbox {args:?} failed ({}):\nstderr:\n{}",
        out.status,
        out.stderr
    );
    out
}

/// A fresh database with the outbox tables.
async fn migrated() -> Pg {
    let pg = Pg::new().await;
    postbox_ok(&pg, &["migrate"], &[]).await;
    pg
}

/// Checks that `got` holds every event of `ids` exactly once, at the destination `expected`
/// gives, with its payload and metadata; returns the messages by event id.
fn assert_delivered(
    got: &[Received],
    rows: &HashMap<i64, Row>,
    ids: &[i64],
    expected: impl Fn(&Row) -> String,
) -> HashMap<i64, Received> {
    let mut by_id: HashMap<i64, Received> = HashMap::new();
    for r in got {
        let id = r.event_id().unwrap_or_else(|| panic!("no event id: {r:?}"));
        assert!(by_id.insert(id, r.clone()).is_none(), "event {id} twice");
    }
    for id in ids {
        let row = &rows[id];
        let r = by_id
            .get(id)
            .unwrap_or_else(|| panic!("event {id} did not arrive; got {got:?}"));
        assert_eq!(r.destination, expected(row), "destination of {id}");
        assert_eq!(r.body, row.payload, "payload of {id}");
        let header = |name: &str| {
            r.header(name)
                .unwrap_or_else(|| panic!("event {id} lacks {name}: {:?}", r.headers))
        };
        assert_eq!(header("postbox-event-id"), id.to_string());
        assert_eq!(header("postbox-dedup-id"), row.idempotency_key);
        assert_eq!(header("postbox-event-type"), row.event_type);
        assert_eq!(header("postbox-aggregate-type"), row.aggregate_type);
        assert_eq!(header("postbox-aggregate-id"), row.aggregate_id);
        assert_eq!(header("postbox-schema-version"), "1");
        chrono::DateTime::parse_from_rfc3339(header("postbox-created-at")).expect("RFC 3339");
        assert_eq!(header("traceparent"), TRACEPARENT);
        assert_eq!(header("x-request-source"), "checkout");
        assert!(r.header("postbox-tenant").is_none());
    }
    assert_eq!(by_id.len(), ids.len(), "nothing else arrived");
    by_id
}

async fn assert_all_processed(pg: &Pg) {
    for (id, (status, _, error)) in states(pg).await {
        assert_eq!(status, "PROCESSED", "event {id}: {error:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_receives_every_event_with_its_headers() {
    let pg = migrated().await;
    let nats = NatsStream::start().await;
    let mut ids = insert(&pg, "InvoiceCreated", "Invoice", 10, 5).await;
    ids.extend(insert(&pg, "OrderPlaced", "Order", 5, 5).await);
    let topic = format!("{}.{{aggregate_type}}.{{event_type}}", nats.prefix);
    // The default --sink-url: nats://127.0.0.1:4222.
    let out = postbox_ok(
        &pg,
        &["relay", "--drain", "--sink", "nats", "--topic", &topic],
        &[],
    )
    .await;
    assert!(
        out.stderr.contains("nats nats://127.0.0.1:4222"),
        "{}",
        out.stderr
    );
    let got = nats.received(&ids, ARRIVAL).await;
    let rows = rows(&pg).await;
    let by_id = assert_delivered(&got, &rows, &ids, |row| {
        format!("{}.{}.{}", nats.prefix, row.aggregate_type, row.event_type)
    });
    for (id, r) in &by_id {
        assert_eq!(
            r.header("Nats-Msg-Id"),
            Some(rows[id].idempotency_key.as_str())
        );
    }
    assert_all_processed(&pg).await;
    nats.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_publishes_on_the_default_exchange_or_the_configured_one() {
    let pg = migrated().await;
    let mut queue = AmqpQueue::start().await;
    // The default exchange: the routing key is the queue's name.
    let first = insert(&pg, "InvoiceCreated", "Invoice", 8, 5).await;
    postbox_ok(
        &pg,
        &[
            "relay",
            "--drain",
            "--sink",
            "amqp",
            "--sink-url",
            "amqp://guest:guest@127.0.0.1:5672/%2f",
            "--topic",
            &queue.queue,
        ],
        &[],
    )
    .await;
    let got = queue.received(&first, ARRIVAL).await;
    let rows_now = rows(&pg).await;
    let by_id = assert_delivered(&got, &rows_now, &first, |_| queue.queue.clone());
    for (id, r) in &by_id {
        assert_eq!(r.extra["message_id"], rows_now[id].idempotency_key);
        assert_eq!(r.extra["delivery_mode"], "2", "persistent");
        assert_eq!(r.extra["exchange"], "", "the default exchange");
    }

    // An exchange from the environment (config key `exchange`), a routing key template.
    let exchange = queue.bind_exchange().await;
    let second = insert(&pg, "OrderPlaced", "Order", 6, 5).await;
    postbox_ok(
        &pg,
        &[
            "relay",
            "--drain",
            "--sink",
            "amqp",
            "--topic",
            "{aggregate_type}.{event_type}",
        ],
        &[("POSTBOX_EXCHANGE", &exchange)],
    )
    .await;
    let all: Vec<i64> = first.iter().chain(&second).copied().collect();
    let got = queue.received(&all, ARRIVAL).await;
    let got: Vec<Received> = got
        .into_iter()
        .filter(|r| r.event_id().is_some_and(|id| second.contains(&id)))
        .collect();
    let by_id = assert_delivered(&got, &rows(&pg).await, &second, |row| {
        format!("{}.{}", row.aggregate_type, row.event_type)
    });
    assert!(by_id.values().all(|r| r.extra["exchange"] == exchange));
    assert_all_processed(&pg).await;
    queue.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_appends_every_event_to_its_stream() {
    let pg = migrated().await;
    let streams = RedisStreams::start().await;
    let mut ids = insert(&pg, "InvoiceCreated", "Invoice", 10, 5).await;
    ids.extend(insert(&pg, "InvoicePaid", "Invoice", 5, 5).await);
    let topic = format!("{}:{{aggregate_type}}:{{event_type}}", streams.prefix);
    postbox_ok(
        &pg,
        &[
            "relay",
            "--drain",
            "--sink",
            "redis",
            "--sink-url",
            "redis://127.0.0.1:6379",
            "--topic",
            &topic,
        ],
        &[],
    )
    .await;
    let got = streams.received(&ids, ARRIVAL).await;
    assert_delivered(&got, &rows(&pg).await, &ids, |row| {
        format!(
            "{}:{}:{}",
            streams.prefix, row.aggregate_type, row.event_type
        )
    });
    assert_all_processed(&pg).await;
    streams.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_format_cloudevents_writes_cloudevents_named_after_the_database() {
    let pg = migrated().await;
    let streams = RedisStreams::start().await;
    let ids = insert(&pg, "InvoiceCreated", "Invoice", 5, 5).await;
    let topic = format!("{}:{{aggregate_type}}", streams.prefix);
    postbox_ok(
        &pg,
        &[
            "relay",
            "--drain",
            "--sink",
            "redis",
            "--topic",
            &topic,
            "--sink-format",
            "cloudevents",
        ],
        &[],
    )
    .await;
    let got = streams.received(&ids, ARRIVAL).await;
    let database: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(pg.db.pool())
        .await
        .expect("database name");
    let rows = rows(&pg).await;
    assert_eq!(got.len(), ids.len(), "{got:?}");
    for r in &got {
        let id = r
            .event_id()
            .expect("postbox-event-id beside the attributes");
        let row = &rows[&id];
        let expect = |name: &str, value: &str| {
            assert_eq!(r.header(name), Some(value), "{name} of event {id}: {r:?}");
        };
        expect("ce_specversion", "1.0");
        expect("ce_id", &row.idempotency_key);
        expect("ce_source", &format!("/postbox/{database}/public"));
        expect("ce_type", &row.event_type);
        expect("ce_subject", &format!("Invoice/{}", row.aggregate_id));
        expect("ce_traceparent", TRACEPARENT);
        expect("content-type", "application/json");
        let payload: serde_json::Value =
            serde_json::from_str(&r.extra["payload"]).expect("the payload field is the data");
        assert_eq!(payload, row.payload);
    }
    assert_all_processed(&pg).await;

    let refused = postbox(
        &pg,
        &[
            "relay",
            "--drain",
            "--sink",
            "stdout",
            "--sink-format",
            "cloudevents",
        ],
        &[],
    )
    .await;
    assert!(!refused.status.success());
    assert!(
        refused.stderr.contains("sink_format") && refused.stderr.contains("stdout"),
        "{}",
        refused.stderr
    );
    streams.cleanup().await;
}

/// Reads `topic` back with Python's `kafka-python` until it has `expected` events; the records,
/// as the other brokers' consumers hand them over.
async fn read_with_kafka_python(bootstrap: &str, topic: &str, expected: usize) -> Vec<Received> {
    let args = [
        bootstrap.to_owned(),
        topic.to_owned(),
        expected.to_string(),
        "60".to_owned(),
    ];
    let reader = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/cli/kafka_reader.py"
            ))
            .args(&args)
            .output()
            .expect("python3 runs (scripts/install-deps installs kafka-python)")
    })
    .await
    .expect("reader");
    assert!(
        reader.status.success(),
        "kafka-python: {}",
        String::from_utf8_lossy(&reader.stderr)
    );
    let records: Vec<serde_json::Value> =
        serde_json::from_slice(&reader.stdout).expect("the reader's JSON");
    records
        .into_iter()
        .map(|r| Received {
            destination: topic.to_owned(),
            body: serde_json::from_str(r["value"].as_str().expect("value")).expect("JSON value"),
            headers: serde_json::from_value(r["headers"].clone()).expect("text headers"),
            key: r["key"].as_str().map(str::to_owned),
            ..Received::default()
        })
        .collect()
}

/// Checks what `kafka-python` read back from `topic` as [`assert_delivered`] does, and that
/// each record's key is its aggregate id.
fn assert_read_back(got: &[Received], rows: &HashMap<i64, Row>, ids: &[i64], topic: &str) {
    let by_id = assert_delivered(got, rows, ids, |_| topic.to_owned());
    for (id, r) in by_id {
        assert_eq!(
            r.key.as_deref(),
            Some(rows[&id].aggregate_id.as_str()),
            "key of {id}"
        );
    }
}

/// `--sink kafka` without `--sink-url` publishes to the broker on 127.0.0.1:9092 (the one
/// scripts/services starts); Python's `kafka-python` reads every event back with its headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_publishes_to_the_broker_on_127_0_0_1_by_default() {
    let pg = migrated().await;
    let topic = format!("billing_{}", postbox_testkit::consumers::suffix());
    postbox_testkit::tansu::create_topic(postbox_testkit::tansu::SHARED, &topic, 1);
    let ids = insert(&pg, "InvoiceCreated", "Invoice", 20, 5).await;
    postbox_ok(
        &pg,
        &["relay", "--drain", "--sink", "kafka", "--topic", &topic],
        &[],
    )
    .await;
    assert_all_processed(&pg).await;
    let got = read_with_kafka_python(postbox_testkit::tansu::SHARED, &topic, ids.len()).await;
    assert_read_back(&got, &rows(&pg).await, &ids, &topic);
}

/// `postbox relay --drain` to a real Kafka-protocol broker (a tansu process of the test's own,
/// `postbox_testkit::tansu`) killed and started again a third of the way through: a Kafka client
/// not written here (Python `kafka-python`) reads every committed event back, each with its
/// headers (the dedup id among them), its key and its payload; none is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_broker_restarted_mid_drain_loses_nothing_read_back_by_kafka_python() {
    const EVENTS: i64 = 3_000;
    let pg = migrated().await;
    let mut broker = postbox_testkit::tansu::Tansu::start().await;
    let topic = format!("billing_{}", postbox_testkit::consumers::suffix());
    broker.create_topic(&topic, 3);
    let ids = insert(&pg, "InvoiceCreated", "Invoice", EVENTS, 5).await;
    let url = format!("kafka://{}", broker.bootstrap());
    let relay = Running::spawn(pg.cmd(&[
        "relay",
        "--drain",
        "--sink",
        "kafka",
        "--sink-url",
        &url,
        "--topic",
        &topic,
    ]));
    let processed = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM outbox_events WHERE status = 'PROCESSED'",
        )
        .fetch_one(pg.db.pool())
        .await
        .expect("count")
    };
    wait_until("the relay got a third of the way", DEADLINE, || async {
        processed().await >= EVENTS / 3
    })
    .await;
    broker.restart().await;
    let at_restart = processed().await;
    assert!(
        at_restart < EVENTS,
        "the drain was over before the broker restarted; nothing was tested"
    );
    let done = tokio::task::spawn_blocking(move || relay.finish(DEADLINE))
        .await
        .expect("relay");
    assert!(
        done.status.success(),
        "relay: {}\nbroker:\n{}",
        done.stderr,
        broker.log()
    );
    assert_all_processed(&pg).await;

    let got = read_with_kafka_python(&broker.bootstrap(), &topic, ids.len()).await;
    // At least once: a record the broker stored before the restart, whose answer was lost, is
    // sent again after it. Each event is checked once, by its first record.
    let mut seen = std::collections::HashSet::new();
    let first: Vec<Received> = got
        .into_iter()
        .filter(|r| seen.insert(r.event_id()))
        .collect();
    assert_read_back(&first, &rows(&pg).await, &ids, &topic);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_publishes_every_event_at_qos_1() {
    let pg = migrated().await;
    let topics = MqttTopics::start().await;
    let ids = insert(&pg, "InvoiceCreated", "Invoice", 12, 5).await;
    let topic = format!("{}/{{aggregate_type}}/{{aggregate_id}}", topics.prefix);
    postbox_ok(
        &pg,
        &[
            "relay",
            "--drain",
            "--sink",
            "mqtt",
            "--sink-url",
            "mqtt://127.0.0.1:1883",
            "--topic",
            &topic,
        ],
        &[],
    )
    .await;
    let got = topics.received(&ids, ARRIVAL).await;
    let by_id = assert_delivered(&got, &rows(&pg).await, &ids, |row| {
        format!(
            "{}/{}/{}",
            topics.prefix, row.aggregate_type, row.aggregate_id
        )
    });
    assert!(by_id.values().all(|r| r.extra["qos"] == "AtLeastOnce"));
    assert_all_processed(&pg).await;
    topics.cleanup();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_posts_signed_envelopes_and_keeps_the_secret_out_of_logs() {
    const SECRET: &str = "0123-hook-secret";
    let pg = migrated().await;
    let hook = Webhook::start().await;
    let ids = insert(&pg, "InvoiceCreated", "Invoice", 10, 5).await;
    let url = format!(
        "http://{}/hooks/{{aggregate_type}}/{{event_type}}",
        hook.addr
    );
    let out = postbox_ok(
        &pg,
        &[
            "relay",
            "--drain",
            "--sink",
            "webhook",
            "--sink-url",
            &url,
            "--log-level",
            "debug",
        ],
        &[("POSTBOX_WEBHOOK_SECRET", SECRET)],
    )
    .await;
    assert!(!out.stderr.contains(SECRET), "{}", out.stderr);
    let got = hook.received(&ids, ARRIVAL).await;
    let rows = rows(&pg).await;
    let by_id = assert_delivered(&got, &rows, &ids, |row| {
        format!("/hooks/{}/{}", row.aggregate_type, row.event_type)
    });
    for (id, r) in &by_id {
        let raw = &r.extra["raw_body"];
        assert_eq!(
            r.header("x-postbox-signature"),
            Some(
                postbox_sinks::webhook::sign(SECRET.as_bytes(), signed_at(r), raw.as_bytes())
                    .as_str()
            ),
            "signed with the secret as written (not parsed as a number)"
        );
        assert_eq!(
            r.header("idempotency-key"),
            Some(rows[id].idempotency_key.as_str())
        );
    }
    assert_all_processed(&pg).await;

    let mut shown = pg.cmd(&["config", "--sink", "webhook", "--sink-url", &url]);
    shown.env("POSTBOX_WEBHOOK_SECRET", SECRET);
    let shown = tokio::task::spawn_blocking(move || run(shown))
        .await
        .expect("config");
    assert!(shown.status.success(), "{}", shown.stderr);
    assert!(!shown.stdout.contains(SECRET), "{}", shown.stdout);
    assert!(
        shown
            .stdout
            .lines()
            .any(|l| l.starts_with("webhook_secret ") && l.contains("= \"***\"")),
        "{}",
        shown.stdout
    );
    hook.cleanup();
}

/// No Kafka broker runs here: the relay still starts, says it cannot connect, and the events
/// fail with that reason (the Kafka configuration is parsed and used end to end).
#[cfg(feature = "kafka")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_without_a_broker_starts_and_a_drain_gives_up_spending_no_try() {
    let pg = migrated().await;
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("address").port()
    };
    let ids = insert(&pg, "InvoiceCreated", "Invoice", 3, 1).await;
    let url = format!("kafka://127.0.0.1:{port}");
    let out = postbox(
        &pg,
        &[
            "relay",
            "--drain",
            "--sink",
            "kafka",
            "--sink-url",
            &url,
            "--topic",
            "billing.{aggregate_type}",
            "--log-level",
            "warn,postbox=info",
        ],
        &[("POSTBOX_DRAIN_PATIENCE", "2s")],
    )
    .await;
    // The drain waits out its patience, then exits 3 with the reason and what to do.
    assert_eq!(out.status.code(), Some(3), "{}", out.stderr);
    assert!(
        out.stderr.contains("cannot connect") && out.stderr.contains(&format!("127.0.0.1:{port}")),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("drain gave up") && out.stderr.contains("stay PENDING"),
        "{}",
        out.stderr
    );
    // An outage is not the events' fault: they wait, with no try spent, and say why.
    let states = states(&pg).await;
    for id in ids {
        let (status, tries, error) = &states[&id];
        assert_eq!((status.as_str(), *tries), ("PENDING", 0));
        let error = error.as_deref().unwrap_or_default();
        assert!(
            error.contains("kafka sink: not connected yet")
                && error.contains(&format!("cannot connect to Kafka at 127.0.0.1:{port}")),
            "{error}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_fan_out_to_two_sinks_and_unmatched_events_fail() {
    let pg = migrated().await;
    let streams = RedisStreams::start().await;
    // The first invoice request to the webhook fails once: its event is retried and reaches
    // Redis twice (same dedup id), and is PROCESSED only after both routes acknowledged it.
    let hook = Webhook::start().await;
    hook.answer_under("/hooks/invoices/", 500, "");
    let toml = format!(
        r#"
        [sinks.stream]
        kind = "redis"
        url = "redis://127.0.0.1:6379"

        [sinks.hook]
        kind = "webhook"
        url = "http://{addr}/hooks/invoices/{{event_type}}"
        secret = "route-secret-42"

        [[routes]]
        event_type = "Invoice*"
        sink = "stream"
        topic = "{prefix}:{{aggregate_type}}:{{event_type}}"

        [[routes]]
        aggregate_type = "Inv?ice"
        sink = "hook"

        [[routes]]
        event_type = "*Shipped"
        sink = "hook"
        topic = "http://{addr}/hooks/shipping/{{aggregate_id}}"

        [routing]
        unmatched = "fail"
        "#,
        addr = hook.addr,
        prefix = streams.prefix
    );
    std::fs::write(pg.dir.path().join("postbox.toml"), toml).expect("write postbox.toml");
    let invoices = insert(&pg, "InvoiceCreated", "Invoice", 4, 5).await;
    let shipped = insert(&pg, "OrderShipped", "Order", 3, 5).await;
    let orphans = insert(&pg, "Orphan", "Order", 2, 5).await;

    let out = postbox_ok(
        &pg,
        &[
            "relay",
            "--drain",
            "--backoff-base",
            "100ms",
            "--poll-interval",
            "100ms",
            "--log-level",
            "debug",
        ],
        &[],
    )
    .await;
    assert!(!out.stderr.contains("route-secret-42"), "{}", out.stderr);
    assert!(out.stderr.contains("3 routes to 2 sinks"), "{}", out.stderr);

    let rows = rows(&pg).await;
    let states = states(&pg).await;
    for id in invoices.iter().chain(&shipped) {
        assert_eq!(states[id].0, "PROCESSED", "{id}: {:?}", states[id]);
    }
    for id in &orphans {
        let (status, _, error) = &states[id];
        assert_eq!(status, "FAILED");
        let error = error.as_deref().unwrap_or_default();
        assert!(
            error.contains("no route matches") && error.contains("\"Orphan\""),
            "{error}"
        );
    }
    let retried: Vec<i64> = invoices
        .iter()
        .copied()
        .filter(|id| states[id].1 > 0)
        .collect();
    assert_eq!(retried.len(), 1, "one invoice was retried: {states:?}");

    // Redis: every invoice, the retried one twice (same dedup id); nothing else.
    let in_redis = streams.received(&invoices, ARRIVAL).await;
    let mut copies: HashMap<i64, Vec<&Received>> = HashMap::new();
    for r in &in_redis {
        copies.entry(r.event_id().expect("id")).or_default().push(r);
    }
    for id in &invoices {
        let expected = if *id == retried[0] { 2 } else { 1 };
        let got = &copies[id];
        assert_eq!(got.len(), expected, "copies of {id} in Redis");
        for r in got {
            assert_eq!(
                r.header("postbox-dedup-id"),
                Some(rows[id].idempotency_key.as_str())
            );
            assert_eq!(
                r.destination,
                format!("{}:Invoice:InvoiceCreated", streams.prefix)
            );
        }
    }
    assert_eq!(copies.len(), invoices.len(), "only invoices went to Redis");

    // The webhook: every invoice (the sink's own URL) and every shipment (the route's URL).
    let wanted: Vec<i64> = invoices.iter().chain(&shipped).copied().collect();
    let at_hook = hook.received(&wanted, ARRIVAL).await;
    for r in &at_hook {
        let id = r.event_id().expect("id");
        let row = &rows[&id];
        let expected = if invoices.contains(&id) {
            "/hooks/invoices/InvoiceCreated".to_owned()
        } else {
            format!("/hooks/shipping/{}", row.aggregate_id)
        };
        assert_eq!(r.destination, expected);
        assert_eq!(
            r.header("x-postbox-signature"),
            Some(
                postbox_sinks::webhook::sign(
                    b"route-secret-42",
                    signed_at(r),
                    r.extra["raw_body"].as_bytes()
                )
                .as_str()
            )
        );
        assert!(!orphans.contains(&id), "an unmatched event was published");
    }
    assert_eq!(
        at_hook.len(),
        wanted.len() + 1,
        "one failed request, then each once"
    );

    // `postbox config` shows the routes, without the secret.
    let shown = postbox_ok(&pg, &["config"], &[]).await;
    assert!(
        shown.stdout.contains("routes[2]: event_type \"*Shipped\""),
        "{}",
        shown.stdout
    );
    assert!(!shown.stdout.contains("route-secret-42"));
    streams.cleanup().await;
    hook.cleanup();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_away_at_start_up_is_waited_for_and_gets_every_event() {
    let pg = migrated().await;
    let streams = RedisStreams::start().await;
    let proxy = Proxy::start("127.0.0.1:6379".parse().expect("address")).await;
    proxy.down();
    let ids = insert(&pg, "InvoiceCreated", "Invoice", 20, 1000).await;
    let mut tx = pg.db.pool().begin().await.expect("begin");
    sqlx::query(
        "INSERT INTO outbox_events (event_type, aggregate_type, aggregate_id, payload)
         VALUES ('Ghost', 'Invoice', 'ghost', '{}')",
    )
    .execute(&mut *tx)
    .await
    .expect("insert ghost");
    tx.rollback().await.expect("rollback");

    let url = format!("redis://127.0.0.1:{}", proxy.port());
    let topic = format!("{}:{{event_type}}", streams.prefix);
    let relay = Running::spawn(pg.cmd(&[
        "relay",
        "--drain",
        "--sink",
        "redis",
        "--sink-url",
        &url,
        "--topic",
        &topic,
        "--poll-interval",
        "100ms",
        "--backoff-base",
        "100ms",
        "--backoff-cap",
        "400ms",
    ]));

    // Every event is tried and put back while the broker is away, spending no try; none is
    // PROCESSED.
    wait_until("every event was tried", ARRIVAL, || async {
        let states = states(&pg).await;
        assert!(
            states
                .values()
                .all(|(status, tries, _)| status != "PROCESSED" && *tries == 0),
            "published, or tries spent, while the broker was away: {states:?}"
        );
        if states.values().all(|(_, _, error)| {
            error
                .as_deref()
                .is_some_and(|e| e.contains("not connected yet"))
        }) {
            Ok(())
        } else {
            Err(format!("{states:?}"))
        }
    })
    .await;
    assert!(streams.collector.snapshot().is_empty());

    proxy.up();
    let out = tokio::task::spawn_blocking(move || relay.finish(DEADLINE))
        .await
        .expect("relay");
    assert!(out.status.success(), "{}", out.stderr);
    assert!(out.stderr.contains("cannot connect"), "{}", out.stderr);
    assert!(
        out.stderr.contains("attempts="),
        "reconnected: {}",
        out.stderr
    );
    assert_all_processed(&pg).await;
    let got = streams.received(&ids, ARRIVAL).await;
    assert_delivered(&got, &rows(&pg).await, &ids, |row| {
        format!("{}:{}", streams.prefix, row.event_type)
    });
    streams.cleanup().await;
}

/// A broker password never reaches the logs, the events' last_error or `postbox config`, even
/// when connecting fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_passwords_stay_out_of_logs_and_errors() {
    const PASSWORD: &str = "Br0kerPassw0rd";
    let pg = migrated().await;
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("address").port()
    };
    insert(&pg, "InvoiceCreated", "Invoice", 2, 1).await;
    let url = format!("amqp://relay:{PASSWORD}@127.0.0.1:{port}/%2f");
    let env = [
        ("POSTBOX_SINK_URL", url.as_str()),
        ("POSTBOX_DRAIN_PATIENCE", "1s"),
    ];
    let out = postbox(
        &pg,
        &[
            "relay",
            "--drain",
            "--sink",
            "amqp",
            "--topic",
            "q",
            "--log-level",
            "debug",
        ],
        &env,
    )
    .await;
    assert_eq!(out.status.code(), Some(3), "{}", out.stderr);
    assert!(out.stderr.contains("relay:***@"), "{}", out.stderr);
    assert!(!out.stderr.contains(PASSWORD), "{}", out.stderr);
    for (status, _, error) in states(&pg).await.values() {
        assert_eq!(status, "PENDING");
        let error = error.as_deref().unwrap_or_default();
        assert!(error.contains("relay:***@"), "{error}");
        assert!(!error.contains(PASSWORD), "{error}");
    }
    let shown = postbox_ok(
        &pg,
        &["config", "--sink", "amqp", "--topic", "q"],
        &env[..1],
    )
    .await;
    assert!(shown.stdout.contains("relay:***@"), "{}", shown.stdout);
    assert!(!shown.stdout.contains(PASSWORD), "{}", shown.stdout);

    // The NATS client logs server addresses at debug level: the password is not in them.
    insert(&pg, "InvoiceCreated", "Invoice", 1, 1).await;
    let url = format!("nats://relay:{PASSWORD}@127.0.0.1:{port}");
    let out = postbox(
        &pg,
        &[
            "relay",
            "--drain",
            "--sink",
            "nats",
            "--topic",
            "q",
            "--log-level",
            "debug",
        ],
        &[
            ("POSTBOX_SINK_URL", url.as_str()),
            ("POSTBOX_DRAIN_PATIENCE", "1s"),
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(3), "{}", out.stderr);
    assert!(
        out.stderr.contains("cannot connect to NATS"),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains(PASSWORD), "{}", out.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_routes_stop_the_relay_naming_the_rule() {
    let pg = migrated().await;
    for (toml, expect) in [
        (
            "[sinks.a]\nkind = \"redis\"\n[[routes]]\nsink = \"a\"\ntopic = \"x\"\n[[routes]]\nsink = \"b\"\ntopic = \"x\"\n",
            "`routes[1]`",
        ),
        (
            "[sinks.a]\nkind = \"redis\"\n[[routes]]\nevent_type = \"Inv[0-9]\"\nsink = \"a\"\ntopic = \"x\"\n",
            "`routes[0]`",
        ),
        (
            "[sinks.a]\nkind = \"redis\"\n[[routes]]\nsink = \"a\"\ntopic = \"x.{aggregate}\"\n",
            "{aggregate}",
        ),
        (
            "[sinks.a]\nkind = \"sqs\"\n[[routes]]\nsink = \"a\"\ntopic = \"x\"\n",
            "`sinks.a`",
        ),
        (
            "[sinks.a]\nkind = \"webhook\"\n[[routes]]\nsink = \"a\"\n",
            "no `url` of its own",
        ),
    ] {
        std::fs::write(pg.dir.path().join("postbox.toml"), toml).expect("write");
        let out = postbox(&pg, &["relay", "--drain"], &[]).await;
        assert!(!out.status.success(), "{toml}");
        assert!(
            out.stderr.contains(expect) && out.stderr.contains("postbox.toml"),
            "{toml}: {}",
            out.stderr
        );
    }
}

/// The signing time a webhook request carries.
fn signed_at(r: &Received) -> u64 {
    r.header("x-postbox-timestamp")
        .and_then(|t| t.parse().ok())
        .expect("a signed request carries its timestamp")
}

/// A CDC relay (`--source cdc`) publishes through the same sinks and routes as the poller: one
/// relay, routed by event type to NATS, RabbitMQ, Redis, MQTT, Kafka and a webhook, delivers
/// each event committed after it started to its broker once, with the same headers and payload
/// the polling relay's tests check; the slot delivered every one of them to the relay
/// (`postbox_cdc_events_total`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cdc_relay_publishes_to_every_broker_sink_what_the_poller_does() {
    let pg = migrated().await;
    let nats = NatsStream::start().await;
    let queue = AmqpQueue::start().await;
    let streams = RedisStreams::start().await;
    let topics = MqttTopics::start().await;
    let hook = Webhook::start().await;
    let kafka_topic = format!("cdc_{}", postbox_testkit::consumers::suffix());
    postbox_testkit::tansu::create_topic(postbox_testkit::tansu::SHARED, &kafka_topic, 1);
    let toml = format!(
        r#"
        [sinks.nats]
        kind = "nats"
        url = "nats://127.0.0.1:4222"
        [sinks.amqp]
        kind = "amqp"
        url = "amqp://guest:guest@127.0.0.1:5672/%2f"
        [sinks.redis]
        kind = "redis"
        url = "redis://127.0.0.1:6379"
        [sinks.mqtt]
        kind = "mqtt"
        url = "mqtt://127.0.0.1:1883"
        [sinks.kafka]
        kind = "kafka"
        url = "kafka://{kafka}"
        [sinks.hook]
        kind = "webhook"
        url = "http://{hook}/hooks/cdc/{{event_type}}"

        [[routes]]
        event_type = "ToNats"
        sink = "nats"
        topic = "{nats}.{{aggregate_type}}.{{event_type}}"
        [[routes]]
        event_type = "ToAmqp"
        sink = "amqp"
        topic = "{queue}"
        [[routes]]
        event_type = "ToRedis"
        sink = "redis"
        topic = "{redis}:{{aggregate_type}}:{{event_type}}"
        [[routes]]
        event_type = "ToMqtt"
        sink = "mqtt"
        topic = "{mqtt}/{{aggregate_type}}/{{aggregate_id}}"
        [[routes]]
        event_type = "ToKafka"
        sink = "kafka"
        topic = "{kafka_topic}"
        [[routes]]
        event_type = "ToHook"
        sink = "hook"
        "#,
        kafka = postbox_testkit::tansu::SHARED,
        hook = hook.addr,
        nats = nats.prefix,
        queue = queue.queue,
        redis = streams.prefix,
        mqtt = topics.prefix,
    );
    std::fs::write(pg.dir.path().join("postbox.toml"), toml).expect("write postbox.toml");
    let slot = pg.slot_name();
    let admin = crate::admin::free_port().to_string();
    let mut relay = Running::spawn(pg.cmd(&[
        "relay",
        "--source",
        "cdc",
        "--cdc-slot",
        &slot,
        "--admin-listen",
        &admin,
    ]));
    relay.wait_for_stderr("CDC relay reading the slot", DEADLINE);

    let to_nats = insert(&pg, "ToNats", "Invoice", 5, 5).await;
    let to_amqp = insert(&pg, "ToAmqp", "Invoice", 5, 5).await;
    let to_redis = insert(&pg, "ToRedis", "Invoice", 5, 5).await;
    let to_mqtt = insert(&pg, "ToMqtt", "Invoice", 5, 5).await;
    let to_kafka = insert(&pg, "ToKafka", "Invoice", 5, 5).await;
    let to_hook = insert(&pg, "ToHook", "Invoice", 5, 5).await;

    let rows = rows(&pg).await;
    let got = nats.received(&to_nats, ARRIVAL).await;
    assert_delivered(&got, &rows, &to_nats, |row| {
        format!("{}.{}.{}", nats.prefix, row.aggregate_type, row.event_type)
    });
    let got = queue.received(&to_amqp, ARRIVAL).await;
    assert_delivered(&got, &rows, &to_amqp, |_| queue.queue.clone());
    let got = streams.received(&to_redis, ARRIVAL).await;
    assert_delivered(&got, &rows, &to_redis, |row| {
        format!(
            "{}:{}:{}",
            streams.prefix, row.aggregate_type, row.event_type
        )
    });
    let got = topics.received(&to_mqtt, ARRIVAL).await;
    assert_delivered(&got, &rows, &to_mqtt, |row| {
        format!(
            "{}/{}/{}",
            topics.prefix, row.aggregate_type, row.aggregate_id
        )
    });
    let got =
        read_with_kafka_python(postbox_testkit::tansu::SHARED, &kafka_topic, to_kafka.len()).await;
    assert_read_back(&got, &rows, &to_kafka, &kafka_topic);
    let at_hook = hook.received(&to_hook, ARRIVAL).await;
    let mut hooked: Vec<i64> = at_hook.iter().map(|r| r.event_id().expect("id")).collect();
    hooked.sort_unstable();
    let mut to_hook = to_hook;
    to_hook.sort_unstable();
    assert_eq!(hooked, to_hook, "each webhook event once");
    assert!(at_hook.iter().all(|r| r.destination == "/hooks/cdc/ToHook"));

    // The slot delivered every event.
    let total = rows.len();
    let metric = format!("postbox_cdc_events_total{{slot=\"{slot}\"}} {total}");
    crate::admin::wait_for(
        admin.parse().expect("address"),
        "/metrics",
        "every event counted as delivered by the slot",
        |status, body| status == 200 && body.contains(&metric),
    )
    .await;
    wait_until("every event PROCESSED", ARRIVAL, || async {
        let states = states(&pg).await;
        let left = states.values().filter(|s| s.0 != "PROCESSED").count();
        if left == 0 {
            Ok(())
        } else {
            Err(format!("{left} not PROCESSED"))
        }
    })
    .await;
    relay.signal("TERM");
    let out = relay.finish(Duration::from_secs(30));
    assert!(out.status.success(), "{}", out.stderr);
    nats.cleanup().await;
    queue.cleanup().await;
    streams.cleanup().await;
    topics.cleanup();
    hook.cleanup();
}
