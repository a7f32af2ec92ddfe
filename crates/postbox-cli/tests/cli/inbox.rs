//! The consumer's end of the wire: a consumer reads what `postbox relay` publishes to a Redis
//! stream and applies each event's effect once — in another language (`inbox_consumer.py`:
//! Python, psycopg 3, redis-py) through the SQL inbox (`postbox_inbox_receive`), and in Rust
//! (`examples/inbox_consumer.rs`) through `postbox::inbox::Inbox` — while the test kills the
//! consumer 20 times (SIGKILL, mid-batch or between its commit and its acknowledgement), kills
//! the relay mid-drain (its claims are taken over and published again) and replays events with
//! their original dedup ids.

use std::collections::HashMap;
use std::process::Command;

use crate::support::{DEADLINE, Pg, Running};
use postbox_testkit::wait_until;

/// Events committed.
const EVENTS: i64 = 100_000;
/// Of which the first are of a type the test replays with their original dedup ids.
const REPLAYED: i64 = 5_000;
/// How often the consumer is killed.
const CONSUMER_KILLS: i64 = 20;
/// The relays' lease: a killed relay's claims are taken over this long after (and its publish
/// timeout, which must be shorter).
const LEASE: &str = "3s";
const PUBLISH_TIMEOUT: &str = "2s";

async fn scalar(pg: &Pg, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(pg.db.pool())
        .await
        .expect(sql)
}

/// The consumer group's `pending` and `lag` (`XINFO GROUPS`), as integers by name.
async fn group_info(
    redis: &mut redis::aio::MultiplexedConnection,
    stream: &str,
) -> HashMap<String, i64> {
    let info: redis::Value = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(stream)
        .query_async(redis)
        .await
        .unwrap_or(redis::Value::Nil);
    let mut out = HashMap::new();
    if let redis::Value::Array(groups) = info
        && let Some(redis::Value::Array(fields)) = groups.first()
    {
        for pair in fields.chunks(2) {
            if let [redis::Value::BulkString(name), redis::Value::Int(n)] = pair {
                out.insert(String::from_utf8_lossy(name).into_owned(), *n);
            }
        }
    }
    out
}

/// The Python consumer: `inbox_consumer.py`, through the SQL function.
fn python_consumer(url: &str, stream: &str) -> Command {
    let mut cmd = Command::new("python3");
    cmd.arg(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/cli/inbox_consumer.py"
    ))
    .args([url, stream, "ledger"]);
    cmd
}

/// The Rust consumer: `examples/inbox_consumer.rs`, through `postbox::inbox::Inbox`. `cargo test`
/// builds the package's examples beside its tests, in `examples/` next to `deps/`.
fn rust_consumer(url: &str, stream: &str) -> Command {
    let exe = std::env::current_exe().expect("the test's path");
    let built = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|dir| dir.join("examples").join("inbox_consumer"))
        .filter(|path| path.is_file())
        .unwrap_or_else(|| {
            panic!(
                "the inbox_consumer example is not built beside {}: run the whole package's \
                 tests (cargo test -p postbox-cli), or cargo build -p postbox-cli --example \
                 inbox_consumer",
                exe.display()
            )
        });
    let mut cmd = Command::new(built);
    cmd.args([url, stream, "ledger"]);
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_consumer_killed_20_times_applies_every_event_once_through_the_sql_inbox() {
    consumer_killed_20_times(python_consumer).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rust_consumer_killed_20_times_applies_every_event_once_through_its_inbox() {
    consumer_killed_20_times(rust_consumer).await;
}

/// Runs the consumer `consumer(database url, stream)` gives through 100,000 events, killing it
/// 20 times, a relay mid-drain, and replaying 5,000 events with their dedup ids; every event's
/// effect must be in `ledger` once.
async fn consumer_killed_20_times(consumer: fn(&str, &str) -> Command) {
    let pg = Pg::new().await;
    pg.ok(&["migrate"]);
    pg.sql(
        "CREATE TABLE ledger (dedup_id text NOT NULL, event_id bigint NOT NULL);
         INSERT INTO outbox_events (event_type, aggregate_type, aggregate_id, payload)
         SELECT CASE WHEN g <= 5000 THEN 'Replayed' ELSE 'Placed' END, 'Order', g::text,
                jsonb_build_object('order', g)
         FROM generate_series(1, 100000) AS g;",
    )
    .await;
    let stream = format!("postbox_test_{}", postbox_testkit::consumers::suffix());
    let sink = [
        "--sink",
        "redis",
        "--sink-url",
        "redis://127.0.0.1:6379",
        "--topic",
        stream.as_str(),
    ];
    let relay = || {
        let mut cmd = pg.cmd(&[&["relay"][..], &sink[..]].concat());
        cmd.env("POSTBOX_LEASE", LEASE)
            .env("POSTBOX_PUBLISH_TIMEOUT", PUBLISH_TIMEOUT);
        Running::spawn(cmd)
    };
    let consumer = || Running::spawn(consumer(pg.db.url(), &stream));
    let processed = || {
        scalar(
            &pg,
            "SELECT count(*) FROM outbox_events WHERE status = 'PROCESSED'",
        )
    };
    let handled = || scalar(&pg, "SELECT count(*) FROM ledger");

    let mut reader = consumer();
    // A relay killed mid-drain: what it had claimed and not marked is published again by its
    // successor once the lease runs out.
    let first = relay();
    wait_until("the relay is draining", DEADLINE, || async {
        processed().await >= 10_000
    })
    .await;
    first.kill();
    let second = relay();
    wait_until("the replayed type is published", DEADLINE, || async {
        scalar(
            &pg,
            "SELECT count(*) FROM outbox_events WHERE event_type = 'Replayed' AND status = 'PROCESSED'",
        )
        .await
            == REPLAYED
    })
    .await;
    // Replays with the original dedup ids: to the consumer, the same messages again.
    pg.ok(&[
        &["replay", "--type", "Replayed", "--keep-dedup-id"][..],
        &sink[..],
    ]
    .concat());

    // The consumer dies 20 times while it works through the stream.
    for kill in 0..CONSUMER_KILLS {
        let at = (kill + 1) * EVENTS / (CONSUMER_KILLS + 2);
        wait_until(
            &format!("the consumer handled {at} events (kill {kill})"),
            DEADLINE,
            || async { handled().await >= at },
        )
        .await;
        reader.kill();
        reader = consumer();
    }
    wait_until("every event is published", DEADLINE, || async {
        processed().await == EVENTS
    })
    .await;
    second.signal("TERM");
    second.finish(DEADLINE);

    let mut redis = postbox_testkit::consumers::redis::connect().await;
    wait_until(
        "the consumer has read and acknowledged the whole stream",
        DEADLINE,
        || {
            let (mut redis, stream) = (redis.clone(), &stream);
            async move {
                let info = group_info(&mut redis, stream).await;
                if info.get("pending") == Some(&0) && info.get("lag") == Some(&0) {
                    Ok(())
                } else {
                    Err(format!("{info:?}"))
                }
            }
        },
    )
    .await;
    // Nothing more comes; the consumer stops here.
    reader.kill();

    let entries: i64 = redis::cmd("XLEN")
        .arg(&stream)
        .query_async(&mut redis)
        .await
        .expect("XLEN");
    let _: i64 = redis::cmd("DEL")
        .arg(&stream)
        .query_async(&mut redis)
        .await
        .expect("DEL");
    assert!(
        entries >= EVENTS + REPLAYED,
        "the stream holds every event and the replayed copies: {entries}"
    );
    let (rows, distinct, events): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT dedup_id),
                count(DISTINCT event_id) FILTER (WHERE dedup_id = event_id::text)
         FROM ledger",
    )
    .fetch_one(pg.db.pool())
    .await
    .expect("the ledger");
    assert_eq!(
        (rows, distinct, events),
        (EVENTS, EVENTS, EVENTS),
        "every event's effect once ({entries} stream entries for {EVENTS} events)"
    );
    let (messages, duplicates): (i64, i64) = sqlx::query_as(
        "SELECT count(*), sum(duplicates)::bigint FROM inbox_messages WHERE consumer = 'ledger'",
    )
    .fetch_one(pg.db.pool())
    .await
    .expect("the inbox");
    assert_eq!(messages, EVENTS);
    assert!(
        duplicates >= REPLAYED,
        "the replayed copies were skipped and counted: {duplicates} duplicates"
    );
    eprintln!(
        "{entries} stream entries for {EVENTS} events; {duplicates} repeats skipped by the inbox"
    );
}
