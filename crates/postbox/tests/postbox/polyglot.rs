//! The SQL API from other languages: a Java program (plain JDBC) and a Python program (psycopg 3),
//! in `tests/postbox/polyglot/`, write business rows and events through `postbox_enqueue` inside
//! their own transactions, commit some and roll back others, while a Rust relay runs in this
//! process. The relay publishes exactly the committed events; duplicates come back as NULL /
//! `None` where Rust says `Enqueued::Duplicate`; and the commit's notification wakes an idle relay
//! as fast as a Rust producer's does.
//!
//! The programs read one command per line on stdin and answer each with one line:
//! - `enqueue <order> <key>`: a row in `orders` and an `OrderPlaced` event of aggregate
//!   `Order`/`<order>`, in the open transaction (one begins if none is open). `<key>` is `-` for
//!   the daily key, `none` for no key, anything else for that key. → `enqueued <id>`, or
//!   `enqueued null` for a duplicate.
//! - `many <k1,k2,…>`: one `postbox_enqueue_many` of `OrderNoted` events with these keys.
//!   → `ids <id or null>,…`
//! - `invalid`: `postbox_enqueue` with an empty event type. → `error <SQLSTATE> <argument>`; the
//!   transaction is then aborted and must be rolled back.
//! - `commit` → `committed <µs since the Unix epoch, read once the commit returned>`;
//!   `rollback` → `rolledback`; `quit`.
//!
//! Java (`javac`, `java`, `/usr/share/java/postgresql.jar`) and Python 3 with psycopg are
//! required: without them the test fails, it never skips. `scripts/install-deps` installs them.
//!
//! The latency figures:
//! `cargo test -p postbox --all-features --test postbox polyglot -- --nocapture`.

#![allow(
    clippy::unwrap_used,
    reason = "tests fail loudly on the first unexpected error"
)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::common::{Running, config, own_store, pg, tally};
use async_trait::async_trait;
use postbox::StoreExt;
use postbox::ops::StoreOps;
use postbox::{Event, Outbox, OutboxEvent, PublishError, Relay, Sink, Store, event::Enqueued};
use postbox_testkit::{RecordingSink, TestDb, wait_until};
use tokio::sync::mpsc;

const JDBC_JAR: &str = "/usr/share/java/postgresql.jar";
const SOURCES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/postbox/polyglot");
/// Latency samples per producer, after one round to warm up.
const ROUNDS: usize = 10;

/// A producer program, driven line by line.
struct Producer {
    name: &'static str,
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::UnboundedReceiver<String>,
}

impl Producer {
    fn spawn(name: &'static str, mut command: Command) -> Producer {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start the {name} producer ({command:?}): {e}; run scripts/install-deps"
                )
            });
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        // A thread of its own reads the answers, so that the runtime never blocks on a pipe.
        let (tx, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Producer {
            name,
            child,
            stdin,
            lines,
        }
    }

    async fn ask(&mut self, command: &str) -> String {
        if let Err(e) = writeln!(self.stdin, "{command}").and_then(|()| self.stdin.flush()) {
            panic!(
                "the {} producer is gone ({e}), exit status {:?}",
                self.name,
                self.child.try_wait()
            );
        }
        match tokio::time::timeout(Duration::from_secs(60), self.lines.recv()).await {
            Ok(Some(line)) => line,
            Ok(None) => panic!(
                "the {} producer exited ({:?}) instead of answering {command:?}; its error is above",
                self.name,
                self.child.wait()
            ),
            Err(_) => panic!(
                "the {} producer did not answer {command:?} within 60 s",
                self.name
            ),
        }
    }

    /// A business row and its event in the open transaction: the new id, `None` for a duplicate.
    async fn enqueue(&mut self, order: i64, key: &str) -> Option<i64> {
        let answer = self.ask(&format!("enqueue {order} {key}")).await;
        let id = answer
            .strip_prefix("enqueued ")
            .unwrap_or_else(|| panic!("{}: unexpected answer {answer:?}", self.name));
        parse_id(id)
    }

    async fn many(&mut self, keys: &[&str]) -> Vec<Option<i64>> {
        let answer = self.ask(&format!("many {}", keys.join(","))).await;
        let ids = answer
            .strip_prefix("ids ")
            .unwrap_or_else(|| panic!("{}: unexpected answer {answer:?}", self.name));
        ids.split(',').map(parse_id).collect()
    }

    /// Commits; the wall-clock time once the commit returned.
    async fn commit(&mut self) -> SystemTime {
        let answer = self.ask("commit").await;
        let micros: u64 = answer
            .strip_prefix("committed ")
            .and_then(|m| m.parse().ok())
            .unwrap_or_else(|| panic!("{}: unexpected answer {answer:?}", self.name));
        UNIX_EPOCH + Duration::from_micros(micros)
    }

    async fn rollback(&mut self) {
        assert_eq!(self.ask("rollback").await, "rolledback", "{}", self.name);
    }

    fn quit(mut self) {
        writeln!(self.stdin, "quit").unwrap();
        let status = self.child.wait().unwrap();
        assert!(
            status.success(),
            "the {} producer ended with {status}",
            self.name
        );
    }
}

fn parse_id(text: &str) -> Option<i64> {
    match text {
        "null" => None,
        id => Some(id.parse().unwrap_or_else(|_| panic!("not an id: {text:?}"))),
    }
}

/// The Java producer, compiled into `classes`.
fn java(db: &TestDb, classes: &Path) -> Producer {
    assert!(
        Path::new(JDBC_JAR).exists(),
        "{JDBC_JAR} is missing: run scripts/install-deps (Debian package libpostgresql-jdbc-java)"
    );
    let status = Command::new("javac")
        .arg("-d")
        .arg(classes)
        .args(["-cp", JDBC_JAR])
        .arg(format!("{SOURCES}/Producer.java"))
        .status()
        .unwrap_or_else(|e| panic!("javac cannot run ({e}): install a JDK, 17 or later"));
    assert!(status.success(), "javac failed on {SOURCES}/Producer.java");
    let mut command = Command::new("java");
    command
        .arg("-cp")
        .arg(format!("{}:{JDBC_JAR}", classes.display()))
        .arg("Producer")
        .arg(jdbc_url(db.url()));
    Producer::spawn("Java", command)
}

/// The Python producer (`python3` on the PATH, with psycopg 3).
fn python(db: &TestDb) -> Producer {
    let mut command = Command::new("python3");
    command.arg(format!("{SOURCES}/producer.py")).arg(db.url());
    Producer::spawn("Python", command)
}

/// `postgres://user[:password]@host:port/db` as a JDBC URL.
fn jdbc_url(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let (auth, place) = rest.rsplit_once('@').unwrap_or(("", rest));
    let mut jdbc = format!("jdbc:postgresql://{place}");
    let mut params = Vec::new();
    match auth.split_once(':') {
        Some((user, password)) => {
            params.push(format!("user={user}"));
            params.push(format!("password={password}"));
        }
        None if !auth.is_empty() => params.push(format!("user={auth}")),
        None => {}
    }
    if !params.is_empty() {
        jdbc.push(if place.contains('?') { '&' } else { '?' });
        jdbc.push_str(&params.join("&"));
    }
    jdbc
}

/// Records when each event reached the sink, and what it published.
#[derive(Clone, Default)]
struct TimedSink {
    recording: RecordingSink,
    reached: Arc<Mutex<HashMap<i64, SystemTime>>>,
}

impl TimedSink {
    fn reached(&self, id: i64) -> Option<SystemTime> {
        self.reached.lock().unwrap().get(&id).copied()
    }
}

#[async_trait]
impl Sink for TimedSink {
    async fn publish(&self, event: &OutboxEvent) -> Result<(), PublishError> {
        self.reached
            .lock()
            .unwrap()
            .entry(event.id)
            .or_insert_with(SystemTime::now);
        self.recording.publish(event).await
    }
}

fn order_placed(order: i64) -> Event {
    Event::new(
        "OrderPlaced",
        &serde_json::json!({ "order_id": order, "producer": "rust" }),
    )
    .unwrap()
    .aggregate("Order", order.to_string())
}

/// The Rust producer: a business row and `event` in one transaction. The enqueue's result and
/// the wall-clock time once the commit returned.
async fn rust_commit(
    db: &TestDb,
    outbox: &Outbox,
    order: i64,
    event: Event,
) -> (Enqueued, SystemTime) {
    let mut tx = db.pool().begin().await.unwrap();
    sqlx::query("INSERT INTO orders (order_id, producer) VALUES ($1, 'rust')")
        .bind(order)
        .execute(&mut *tx)
        .await
        .unwrap();
    let done = outbox.enqueue(&mut tx, event).await.unwrap();
    tx.commit().await.unwrap();
    (done, SystemTime::now())
}

async fn wait_published(sink: &TimedSink, who: &str, id: i64) {
    wait_until(
        &format!("{who}'s event {id} is published (busy polling is off and the poll is 30 s away: only its notification can wake the relay)"),
        Duration::from_secs(5),
        || async { sink.reached(id).is_some() },
    )
    .await;
}

fn median(samples: &[Duration]) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    sorted[sorted.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn java_and_python_producers_get_the_rust_producers_guarantees_and_latency() {
    let (db, _store) = pg().await;
    sqlx::query(
        "CREATE TABLE orders (id BIGSERIAL PRIMARY KEY, order_id BIGINT NOT NULL, \
         producer TEXT NOT NULL)",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let classes = tempfile::tempdir().unwrap();
    let mut java = java(&db, classes.path());
    let mut python = python(&db);

    // Idle means idle: no busy polling after a round, no look at the id sequences, and the poll
    // 30 s away. Only a commit's notification can make the relay publish within the waits below.
    let sink = TimedSink::default();
    let cfg = config()
        .poll_interval(Duration::from_secs(30))
        .busy_period(Duration::ZERO)
        .head_poll_interval(None);
    let relay = Running::start(Relay::new(own_store(&db, 4).await, sink.clone(), cfg).unwrap());
    // The Rust producer with its defaults (a notification at most every 50 ms), and one that
    // notifies on every commit, for markers.
    let outbox = db.outbox();
    let every = db.outbox_builder().notify_interval(Duration::ZERO).build();

    let mut committed: Vec<i64> = Vec::new();
    let mut rolled_back: Vec<i64> = Vec::new();
    let mut orders: HashMap<&str, Vec<i64>> = HashMap::new();
    let mut order = 0;
    let mut next_order = || {
        order += 1;
        order
    };

    // A transaction held open while the relay publishes an event committed after it, then
    // rolled back: the relay never sees it.
    for p in [&mut java, &mut python] {
        let ghost = p.enqueue(next_order(), "-").await.unwrap();
        let marker_order = next_order();
        let (marker, _) = rust_commit(&db, &every, marker_order, order_placed(marker_order)).await;
        let marker = marker.id().unwrap();
        wait_published(&sink, "the marker", marker).await;
        committed.push(marker);
        orders.entry("rust").or_default().push(marker_order);
        p.rollback().await;
        rolled_back.push(ghost);
    }

    // Commit → published from an idle relay, rounds interleaved so that the machine's load
    // falls on the three producers alike; round 0 warms up (class loading, first statements).
    let mut latency: HashMap<&str, Vec<Duration>> = HashMap::new();
    for round in 0..=ROUNDS {
        for who in ["rust", "java", "python"] {
            // The wait is the subject: the relay goes idle before each commit.
            tokio::time::sleep(Duration::from_millis(100)).await;
            let order = next_order();
            let (id, at) = match who {
                "rust" => {
                    let (done, at) = rust_commit(&db, &outbox, order, order_placed(order)).await;
                    (done.id().unwrap(), at)
                }
                _ => {
                    let p = if who == "java" {
                        &mut java
                    } else {
                        &mut python
                    };
                    let id = p.enqueue(order, "-").await.unwrap();
                    (id, p.commit().await)
                }
            };
            wait_published(&sink, who, id).await;
            committed.push(id);
            orders.entry(who).or_default().push(order);
            let took = sink
                .reached(id)
                .unwrap()
                .duration_since(at)
                .unwrap_or_default();
            if round > 0 {
                latency.entry(who).or_default().push(took);
            }
        }
        // And a transaction of each program that rolls back.
        for p in [&mut java, &mut python] {
            rolled_back.push(p.enqueue(next_order(), "-").await.unwrap());
            p.rollback().await;
        }
    }

    // Duplicates: NULL / None in Java and Python where Rust says Enqueued::Duplicate.
    let shared = next_order();
    committed.push(java.enqueue(shared, "-").await.unwrap());
    java.commit().await;
    assert_eq!(
        python.enqueue(shared, "-").await,
        None,
        "Python: Java's event"
    );
    python.commit().await;
    let (rust, _) = rust_commit(&db, &outbox, shared, order_placed(shared)).await;
    assert_eq!(rust, Enqueued::Duplicate, "Rust: Java's event");
    for who in ["java", "python", "rust"] {
        orders.entry(who).or_default().push(shared);
    }

    let rust_first = next_order();
    let (rust, _) = rust_commit(&db, &outbox, rust_first, order_placed(rust_first)).await;
    committed.push(rust.id().unwrap());
    for p in [&mut java, &mut python] {
        assert_eq!(
            p.enqueue(rust_first, "-").await,
            None,
            "{}: Rust's event",
            p.name
        );
        p.commit().await;
    }
    for who in ["rust", "java", "python"] {
        orders.entry(who).or_default().push(rust_first);
    }

    // A caller's own key, whatever the event's aggregate.
    let (a, b) = (next_order(), next_order());
    committed.push(python.enqueue(a, "invoice-run-7").await.unwrap());
    python.commit().await;
    assert_eq!(
        java.enqueue(b, "invoice-run-7").await,
        None,
        "Java: Python's key"
    );
    java.commit().await;
    let keyed = order_placed(b).idempotency_key("invoice-run-7");
    let (rust, _) = rust_commit(&db, &outbox, b, keyed).await;
    assert_eq!(rust, Enqueued::Duplicate, "Rust: Python's key");
    orders.entry("python").or_default().push(a);
    orders.entry("java").or_default().push(b);
    orders.entry("rust").or_default().push(b);

    // No key: never a duplicate.
    let unkeyed = next_order();
    for p in [&mut java, &mut python] {
        for _ in 0..2 {
            committed.push(p.enqueue(unkeyed, "none").await.unwrap());
        }
        p.commit().await;
    }
    for who in ["java", "python"] {
        orders.entry(who).or_default().extend([unkeyed, unkeyed]);
    }

    // Batches: ids in input order, null for a duplicate within the batch or of an earlier one.
    let ids = java.many(&["batch-1", "batch-2", "batch-1"]).await;
    java.commit().await;
    assert!(
        ids[0].is_some() && ids[1].is_some() && ids[2].is_none(),
        "{ids:?}"
    );
    committed.extend(ids.iter().flatten());
    let ids = python.many(&["batch-2", "batch-3"]).await;
    python.commit().await;
    assert!(ids[0].is_none() && ids[1].is_some(), "{ids:?}");
    committed.extend(ids.iter().flatten());

    // An invalid event: the SQLSTATE and the argument reach the driver.
    for p in [&mut java, &mut python] {
        assert_eq!(
            p.ask("invalid").await,
            "error 22023 event_type",
            "{}",
            p.name
        );
        p.rollback().await;
    }

    // A last event behind all the others, then the relay finishes what it claimed and stops.
    let last_order = next_order();
    let (last, _) = rust_commit(&db, &every, last_order, order_placed(last_order)).await;
    let last = last.id().unwrap();
    wait_published(&sink, "the last marker", last).await;
    committed.push(last);
    orders.entry("rust").or_default().push(last_order);
    relay.stop().await;
    java.quit();
    python.quit();

    // Exactly the committed events, each once; never a rolled-back one.
    let published = tally(sink.recording.published_ids());
    assert!(published.values().all(|n| *n == 1), "{published:?}");
    let mut published: Vec<i64> = published.into_keys().collect();
    published.sort_unstable();
    committed.sort_unstable();
    assert_eq!(published, committed);
    for ghost in &rolled_back {
        assert!(
            !published.contains(ghost),
            "rolled-back event {ghost} was published"
        );
    }
    // The business rows are the committed transactions' rows.
    for (who, mut expected) in orders {
        let mut rows: Vec<i64> =
            sqlx::query_scalar("SELECT order_id FROM orders WHERE producer = $1")
                .bind(who)
                .fetch_all(db.pool())
                .await
                .unwrap();
        rows.sort_unstable();
        expected.sort_unstable();
        assert_eq!(rows, expected, "{who}'s business rows");
    }

    // Latency: as low from Java and Python as from Rust. Loose bounds: the machine is shared.
    let rust = median(&latency["rust"]);
    eprintln!("commit → published from an idle relay, median of {ROUNDS} (slowest):");
    for who in ["rust", "java", "python"] {
        let samples = &latency[who];
        let slowest = samples.iter().max().copied().unwrap_or_default();
        eprintln!("  {who:>6}: {:?} ({slowest:?})", median(samples));
    }
    for who in ["java", "python"] {
        let m = median(&latency[who]);
        assert!(
            m <= rust * 3 + Duration::from_millis(25),
            "{who}: median {m:?} against Rust's {rust:?}"
        );
    }
}

/// The Python consumer (`tests/postbox/polyglot/consumer.py`), on the same line protocol.
fn python_consumer(db: &TestDb) -> Producer {
    let mut command = Command::new("python3");
    command.arg(format!("{SOURCES}/consumer.py")).arg(db.url());
    Producer::spawn("Python consumer", command)
}

/// A Python consumer applies each message's effect once through `postbox_inbox_receive`: a
/// repeat is skipped; a consumer killed (SIGKILL) with its transaction open leaves neither the
/// record nor the effect, and the next instance handles the message; the records are the ones
/// a Rust `Inbox` of the same consumer name reads.
#[tokio::test]
async fn a_python_consumer_applies_each_message_once_through_the_sql_inbox() {
    let (db, store) = pg().await;
    sqlx::query("CREATE TABLE ledger (message_id text NOT NULL, amount bigint, consumer text)")
        .execute(db.pool())
        .await
        .unwrap();
    let mut consumer = python_consumer(&db);
    assert_eq!(
        consumer.ask("handle Invoice:1:InvoiceCreated 100").await,
        "new"
    );
    assert_eq!(
        consumer.ask("handle Invoice:1:InvoiceCreated 100").await,
        "duplicate"
    );
    assert_eq!(consumer.ask("handle 42 7").await, "new");
    // A crash between the effect and the commit.
    assert_eq!(consumer.ask("hold 43 5").await, "held new");
    consumer.child.kill().unwrap();
    consumer.child.wait().unwrap();
    // Its successor: the message comes again and is handled (its call waits, if need be, until
    // the server has rolled the dead session's transaction back).
    let mut consumer = python_consumer(&db);
    assert_eq!(consumer.ask("handle 43 5").await, "new");
    assert_eq!(consumer.ask("handle 43 5").await, "duplicate");
    consumer.quit();

    // A Rust consumer of the same name shares the records.
    let inbox = store.inbox("python-ledger").unwrap();
    let mut tx = db.pool().begin().await.unwrap();
    assert_eq!(
        inbox.receive(&mut tx, "42").await.unwrap(),
        postbox::inbox::Received::Duplicate
    );
    assert_eq!(
        inbox.receive(&mut tx, "44").await.unwrap(),
        postbox::inbox::Received::New
    );
    tx.commit().await.unwrap();

    let ledger: Vec<(String, i64)> =
        sqlx::query_as("SELECT message_id, amount FROM ledger ORDER BY message_id")
            .fetch_all(db.pool())
            .await
            .unwrap();
    let expected = [("42", 7), ("43", 5), ("Invoice:1:InvoiceCreated", 100)]
        .map(|(id, amount)| (id.to_owned(), amount));
    assert_eq!(ledger, expected, "each message's effect once");
    let target = postbox::Target::default_schema(store.default_schema());
    let stats = store.inbox_stats(&target).await.unwrap();
    assert_eq!(stats.len(), 1);
    assert_eq!((stats[0].messages, stats[0].duplicates), (4, 3));
}
