//! `postbox migrate` and `postbox relay`: exactly-once in the normal case, at-least-once across a
//! crash, graceful stop on SIGTERM.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use crate::support::{DEADLINE, Pg, Running, parse_lines, run};

/// The fields every stdout line carries.
const FIELDS: &[&str] = &[
    "id",
    "tenant",
    "event_type",
    "aggregate_type",
    "aggregate_id",
    "idempotency_key",
    "payload",
    "headers",
    "created_at",
    "event_class",
    "schema_version",
    "retry_count",
];

/// The `id` of each JSON line.
fn ids_of(lines: &[serde_json::Value]) -> Vec<i64> {
    lines
        .iter()
        .map(|l| l["id"].as_i64().expect("id is a number"))
        .collect()
}

#[tokio::test]
async fn drain_prints_every_committed_event_once_and_no_rolled_back_one() {
    let pg = Pg::new().await;
    let migrated = pg.ok(&["migrate"]);
    assert!(
        migrated.stdout.contains("0001_outbox_events"),
        "{}",
        migrated.stdout
    );
    assert!(pg.ok(&["migrate"]).stdout.contains("up to date"));

    pg.insert_events("outbox_events", "OrderPlaced", 40, true)
        .await;
    pg.insert_events("outbox_events", "Ghost", 15, false).await;
    pg.insert_events("outbox_events", "OrderShipped", 25, true)
        .await;
    let committed = pg.ids("outbox_events", None).await;
    assert_eq!(committed.len(), 65);

    let out = pg.ok(&["relay", "--drain", "--sink", "stdout"]);
    let lines = out.json_lines();
    let mut printed = ids_of(&lines);
    printed.sort_unstable();
    assert_eq!(printed, committed, "every committed event exactly once");
    for line in &lines {
        for field in FIELDS {
            assert!(line.get(*field).is_some(), "{field} missing in {line}");
        }
        assert_ne!(
            line["event_type"], "Ghost",
            "a rolled-back event was published"
        );
        assert!(line["tenant"].is_null());
        assert!(line["payload"].is_object(), "payload is JSON: {line}");
        assert_eq!(line["payload"]["note"], "plain SQL");
        assert_eq!(line["aggregate_type"], "Order");
        assert!(line["headers"].is_object());
        assert_eq!(line["retry_count"], 0);
        assert_eq!(line["schema_version"], 1);
        let created = line["created_at"].as_str().expect("created_at is a string");
        chrono::DateTime::parse_from_rfc3339(created).expect("created_at is RFC 3339");
    }
    assert!(
        out.stderr.contains("relay starting"),
        "logs go to stderr: {}",
        out.stderr
    );
    // The binary's store (connect()) claims from the floor on PostgreSQL, as PgStore does.
    assert!(
        out.stderr.contains("claim_path=floor"),
        "the relay names its claim path: {}",
        out.stderr
    );
    assert_eq!(pg.ids("outbox_events", Some("PROCESSED")).await, committed);

    // Nothing left: a second drain prints nothing.
    assert!(pg.ok(&["relay", "--drain"]).stdout.is_empty());
}

#[tokio::test]
async fn three_relays_at_once_publish_each_event_exactly_once() {
    const EVENTS: usize = 20_000;
    let pg = Pg::new().await;
    pg.ok(&["migrate"]);
    pg.insert_events("outbox_events", "OrderPlaced", EVENTS, true)
        .await;
    let args = [
        "relay",
        "--drain",
        "--sink",
        "stdout",
        "--poll-interval",
        "100ms",
        "--log-level",
        "warn",
    ];
    let relays: Vec<Running> = (0..3).map(|_| Running::spawn(pg.cmd(&args))).collect();
    let mut seen: HashMap<i64, usize> = HashMap::new();
    let mut per_relay = Vec::new();
    for relay in relays {
        let out = relay.finish(DEADLINE);
        assert!(out.status.success(), "{}", out.stderr);
        let ids = ids_of(&out.json_lines());
        per_relay.push(ids.len());
        for id in ids {
            *seen.entry(id).or_default() += 1;
        }
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "printed more than once: {twice:?}");
    assert_eq!(
        seen.len(),
        EVENTS,
        "every event printed (per relay: {per_relay:?})"
    );
    assert_eq!(
        pg.ids("outbox_events", Some("PROCESSED")).await.len(),
        EVENTS
    );
}

#[tokio::test]
async fn a_relay_killed_mid_drain_is_taken_over_after_its_lease() {
    const EVENTS: usize = 5_000;
    let pg = Pg::new().await;
    pg.ok(&["migrate"]);
    pg.insert_events("outbox_events", "OrderPlaced", EVENTS, true)
        .await;
    let args = [
        "relay",
        "--drain",
        "--batch-size",
        "10",
        "--concurrency",
        "1",
        "--lease",
        "1s",
        "--publish-timeout",
        "500ms",
        "--poll-interval",
        "100ms",
    ];
    let mut first = Running::spawn(pg.cmd(&args));
    first.wait_for_lines(200, DEADLINE);
    let killed = first.kill();
    assert!(!killed.status.success(), "SIGKILL, not a clean exit");
    let before = parse_lines(killed.stdout.lines());
    let done = pg.ids("outbox_events", Some("PROCESSED")).await.len();
    assert!(
        done < EVENTS,
        "the relay finished before it was killed; the test needs a slower drain"
    );

    let second = pg.ok(&args);
    let after = second.json_lines();
    let printed: BTreeSet<i64> = ids_of(&before).into_iter().chain(ids_of(&after)).collect();
    let all: BTreeSet<i64> = pg.ids("outbox_events", None).await.into_iter().collect();
    assert_eq!(
        printed, all,
        "every event printed at least once across both runs"
    );
    assert_eq!(
        pg.ids("outbox_events", Some("PROCESSED")).await.len(),
        EVENTS,
        "all end PROCESSED"
    );
}

#[tokio::test]
async fn sigterm_stops_a_running_relay_with_exit_0() {
    let pg = Pg::new().await;
    pg.ok(&["migrate"]);
    let mut relay = Running::spawn(pg.cmd(&["relay", "--poll-interval", "100ms"]));
    // Proof that it runs: an event inserted now comes out.
    pg.insert_events("outbox_events", "Ping", 1, true).await;
    relay.wait_for_lines(1, DEADLINE);
    relay.signal("TERM");
    let out = relay.finish(Duration::from_secs(30));
    assert!(
        out.status.success(),
        "exit {:?}; stderr:\n{}",
        out.status,
        out.stderr
    );
    assert_eq!(out.json_lines().len(), 1);
    assert!(out.stderr.contains("SIGTERM"), "{}", out.stderr);
}

#[tokio::test]
async fn relay_with_source_cdc_publishes_from_its_slot_and_stops_cleanly() {
    let pg = Pg::new().await;
    pg.ok(&["migrate"]);
    let slot = pg.slot_name();
    let mut relay = Running::spawn(pg.cmd(&["relay", "--source", "cdc", "--cdc-slot", &slot]));
    relay.wait_for_stderr("CDC relay reading the slot", DEADLINE);
    pg.insert_events("outbox_events", "Placed", 5, true).await;
    pg.insert_events("outbox_events", "Ghost", 3, false).await;
    relay.wait_for_lines(5, DEADLINE);
    // `postbox status` shows the slot, read, and the WAL it holds back.
    let slot_of = |report: &serde_json::Value| {
        report["replication_slots"]
            .as_array()
            .expect("replication_slots")
            .iter()
            .find(|s| s["name"] == slot.as_str())
            .cloned()
            .unwrap_or_else(|| panic!("slot {slot} not in {report}"))
    };
    let report: serde_json::Value =
        serde_json::from_str(&pg.ok(&["status", "--json"]).stdout).expect("json");
    let read = slot_of(&report);
    assert_eq!(read["active"], true, "{read}");
    assert!(read["lag_bytes"].is_number(), "{read}");
    relay.signal("TERM");
    let out = relay.finish(Duration::from_secs(30));
    assert!(out.status.success(), "{}", out.stderr);
    // Stopped, the slot keeps WAL: status says so, and what to do about it.
    let report: serde_json::Value =
        serde_json::from_str(&pg.ok(&["status", "--json"]).stdout).expect("json");
    assert_eq!(slot_of(&report)["active"], false);
    let table = pg.ok(&["status"]).stdout;
    assert!(
        table.contains(&format!("replication slot {slot}: NOT READ"))
            && table.contains("pg_drop_replication_slot"),
        "{table}"
    );
    let lines = out.json_lines();
    assert_eq!(
        lines.len(),
        5,
        "each committed event once, no rolled-back one"
    );
    assert!(lines.iter().all(|l| l["event_type"] == "Placed"));
    assert!(
        out.stderr.contains("source=cdc") || out.stderr.contains("source: cdc"),
        "{}",
        out.stderr
    );
    assert_eq!(pg.ids("outbox_events", Some("PROCESSED")).await.len(), 5);
    // SQLite has no slot: the error says what to use instead.
    let mut sqlite = pg.cmd(&["relay", "--source", "cdc"]);
    sqlite.env("POSTBOX_DATABASE_URL", "sqlite::memory:");
    let out = run(sqlite);
    assert!(!out.status.success());
    assert!(out.stderr.contains("source = \"poll\""), "{}", out.stderr);
}

/// One statement of 10,000 events — one transaction, one commit position for all — read from
/// the slot by a CDC relay SIGKILLed after a random number of publishes, 20 times, then run to
/// the end: every event published, and only those published and not recorded at a kill — what
/// was in flight, never more than the relay holds — published again (the slot delivers the
/// whole transaction again after each kill; the table says which events are done).
#[tokio::test]
async fn a_cdc_relay_killed_twenty_times_in_one_large_transaction_repeats_only_what_was_in_flight()
{
    use rand::{Rng, SeedableRng};
    const EVENTS: usize = 10_000;
    const KILLS: usize = 20;
    const BATCH: usize = 50;
    const CONCURRENCY: usize = 8;
    // The most events a relay holds claimed (or read) and unrecorded: its room
    // (`concurrency.max(batch) + batch`) and a claim of up to two batches under way.
    const IN_FLIGHT: usize = if CONCURRENCY > BATCH {
        CONCURRENCY
    } else {
        BATCH
    } + 3 * BATCH;
    let seed: u64 = std::env::var("POSTBOX_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("seed {seed} (POSTBOX_TEST_SEED={seed} replays these kill times)");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let pg = Pg::new().await;
    pg.ok(&["migrate"]);
    let slot = pg.slot_name();
    let (batch, concurrency) = (BATCH.to_string(), CONCURRENCY.to_string());
    let relay = || {
        let mut cmd = pg.cmd(&[
            "relay",
            "--source",
            "cdc",
            "--cdc-slot",
            &slot,
            "--batch-size",
            &batch,
            "--concurrency",
            &concurrency,
        ]);
        cmd.env("POSTBOX_MAX_BATCH_SIZE", &batch);
        Running::spawn(cmd)
    };
    // The slot exists before the statement commits, so the statement is the slot's to deliver.
    let mut first = relay();
    first.wait_for_stderr("CDC relay reading the slot", DEADLINE);
    let mut printed: HashMap<i64, usize> = HashMap::new();
    let mut runs = vec![first];
    pg.insert_events("outbox_events", "Bulk", EVENTS, true)
        .await;
    let mut kills = Vec::new();
    // Events a killed run published and had not recorded: what it had in flight.
    let mut in_flight: Vec<BTreeSet<i64>> = Vec::new();
    for kill in 0..=KILLS {
        let mut running = match runs.pop() {
            Some(r) => r,
            None => {
                let mut r = relay();
                r.wait_for_stderr("CDC relay reading the slot", DEADLINE);
                r
            }
        };
        let remaining = EVENTS - pg.ids("outbox_events", Some("PROCESSED")).await.len();
        let last = kill == KILLS || remaining == 0;
        let lines = if !last {
            // Killed after a random number of events published in this run.
            running.wait_for_lines(rng.random_range(1..=remaining.min(400)), DEADLINE);
            let lines = running.kill().json_lines();
            kills.push(pg.ids("outbox_events", Some("PROCESSED")).await.len());
            lines
        } else {
            wait_for_processed(&pg, EVENTS).await;
            running.signal("TERM");
            let out = running.finish(Duration::from_secs(30));
            assert!(out.status.success(), "{}", out.stderr);
            out.json_lines()
        };
        let run: BTreeSet<i64> = ids_of(&lines).into_iter().collect();
        for id in ids_of(&lines) {
            *printed.entry(id).or_default() += 1;
        }
        if last {
            break;
        }
        let processed: BTreeSet<i64> = pg
            .ids("outbox_events", Some("PROCESSED"))
            .await
            .into_iter()
            .collect();
        // What this run published and had not recorded when it was killed.
        let unrecorded: BTreeSet<i64> = run.difference(&processed).copied().collect();
        assert!(
            unrecorded.len() <= IN_FLIGHT,
            "{} events published and not recorded at kill {} (at most {IN_FLIGHT} in flight; \
             seed {seed})",
            unrecorded.len(),
            kill + 1
        );
        in_flight.push(unrecorded);
    }
    let repeated: Vec<i64> = (printed.iter())
        .filter(|(_, n)| **n > 1)
        .map(|(id, _)| *id)
        .collect();
    let sizes: Vec<usize> = in_flight.iter().map(BTreeSet::len).collect();
    eprintln!(
        "processed at each kill: {kills:?}; in flight at each kill: {sizes:?}; {} repeated",
        repeated.len()
    );
    let outside: Vec<&i64> = (repeated.iter())
        .filter(|id| !in_flight.iter().any(|s| s.contains(id)))
        .collect();
    assert!(
        outside.is_empty(),
        "published again without having been in flight at a kill: {outside:?} (seed {seed})"
    );
    assert!(
        repeated.len() <= sizes.iter().sum::<usize>(),
        "more repeats than events in flight at the kills (seed {seed})"
    );
    assert_eq!(
        printed.len(),
        EVENTS,
        "every event published (processed at each kill: {kills:?}; seed {seed})"
    );
    assert!(
        kills.iter().any(|&done| done > 0 && done < EVENTS),
        "no kill came mid-transaction (processed at each kill: {kills:?}; seed {seed})"
    );
}

/// Waits until `n` events of the default outbox are `PROCESSED` (10 minutes at most).
async fn wait_for_processed(pg: &Pg, n: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(600);
    loop {
        let processed: i64 =
            sqlx::query_scalar("SELECT count(*) FROM outbox_events WHERE status = 'PROCESSED'")
                .fetch_one(pg.db.pool())
                .await
                .expect("count");
        if processed == n as i64 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{processed} of {n} processed after 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One producer transaction of a million events, through the binary's CDC relay with its
/// defaults: rolled back, nothing is published and the relay's memory stays flat; committed,
/// the first event is out within 2 s of the commit (the transaction's ids are taken as they
/// arrive, not once the last one is decoded), every event once, the relay within 256 MiB.
#[tokio::test]
async fn a_transaction_of_a_million_events_through_cdc_starts_at_once_in_bounded_memory() {
    const EVENTS: usize = 1_000_000;
    const MIB: u64 = 1024 * 1024;
    let pg = Pg::new().await;
    pg.ok(&["migrate"]);
    let slot = pg.slot_name();
    let out_path = pg.dir.path().join("published.jsonl");
    let out = std::fs::File::create(&out_path).expect("create the output file");
    let mut relay = Running::spawn_to_file(
        pg.cmd(&["relay", "--source", "cdc", "--cdc-slot", &slot]),
        out,
    );
    relay.wait_for_stderr("CDC relay reading the slot", DEADLINE);
    let (before, _) = relay.memory();

    pg.insert_events("outbox_events", "Undone", EVENTS, false)
        .await;
    // The slot has nothing to deliver for a rolled-back transaction; a heartbeat or two pass.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (after_rollback, _) = relay.memory();
    assert_eq!(
        std::fs::metadata(&out_path).expect("output").len(),
        0,
        "nothing of a rolled-back transaction is published"
    );
    assert!(
        after_rollback < before + 32 * MIB,
        "a rolled-back million took the relay from {} to {} MiB",
        before / MIB,
        after_rollback / MIB
    );

    pg.insert_events("outbox_events", "Bulk", EVENTS, true)
        .await;
    let committed = std::time::Instant::now();
    while std::fs::metadata(&out_path).expect("output").len() == 0 {
        assert!(
            committed.elapsed() < DEADLINE,
            "nothing published within {DEADLINE:?} of the commit"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let first = committed.elapsed();
    wait_for_processed(&pg, EVENTS).await;
    let (_, peak) = relay.memory();
    relay.signal("TERM");
    let finished = relay.finish(Duration::from_secs(30));
    assert!(finished.status.success(), "{}", finished.stderr);
    let text = std::fs::read_to_string(&out_path).expect("read the output");
    let mut ids: Vec<i64> = text
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("a JSON line");
            assert_eq!(v["event_type"], "Bulk", "{l}");
            v["id"].as_i64().expect("id")
        })
        .collect();
    let published = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(
        (published, ids.len()),
        (EVENTS, EVENTS),
        "each committed event published once (lines, distinct ids)"
    );
    eprintln!(
        "first event {first:?} after the commit; relay memory {} MiB before, {} MiB after the \
         rollback, {} MiB at its peak",
        before / MIB,
        after_rollback / MIB,
        peak / MIB
    );
    assert!(
        first < Duration::from_secs(2),
        "the first event of a committed million went out {first:?} after the commit"
    );
    assert!(
        peak <= 256 * MIB,
        "the relay took {} MiB at its peak publishing a transaction of a million",
        peak / MIB
    );
}

#[tokio::test]
async fn relay_refuses_an_unmigrated_database_unless_asked_to_migrate() {
    let pg = Pg::new().await;
    let out = run(pg.cmd(&["relay", "--drain"]));
    assert!(!out.status.success());
    assert!(
        out.stderr.contains("postbox migrate"),
        "the error says what to do: {}",
        out.stderr
    );
    pg.ok(&["relay", "--drain", "--migrate", "--sink", "null"]);
    pg.insert_events("outbox_events", "A", 3, true).await;
    assert!(
        pg.ok(&["relay", "--drain", "--sink", "null"])
            .stdout
            .is_empty()
    );
    assert_eq!(pg.ids("outbox_events", Some("PROCESSED")).await.len(), 3);
}

/// `url` with a password, and that password: the URL's own if it has one, else a made-up one
/// (the test server trusts local connections and ignores it).
fn with_password(url: &str) -> (String, String) {
    let start = url.find("://").expect("a URL") + 3;
    let at = start + url[start..].find('@').expect("a user in the test URL");
    match url[start..at].split_once(':') {
        Some((_, password)) => (url.to_owned(), password.to_owned()),
        None => {
            let secret = "s3cr3t-pw".to_owned();
            (format!("{}:{secret}{}", &url[..at], &url[at..]), secret)
        }
    }
}

#[tokio::test]
async fn the_database_password_never_reaches_the_logs() {
    let pg = Pg::new().await;
    let (url, secret) = with_password(pg.db.url());
    let mut cmd = pg.cmd(&["relay", "--drain", "--migrate", "--log-level", "debug"]);
    cmd.env("POSTBOX_DATABASE_URL", &url);
    let out = run(cmd);
    assert!(out.status.success(), "{}", out.stderr);
    assert!(out.stderr.contains("relay starting"), "{}", out.stderr);
    assert!(!out.stderr.contains(&secret), "{}", out.stderr);
    let mut shown = pg.cmd(&["config"]);
    shown.env("POSTBOX_DATABASE_URL", &url);
    let shown = run(shown);
    assert!(shown.stdout.contains(":***@"), "{}", shown.stdout);
    assert!(!shown.stdout.contains(&secret));
    // A connection error names the server, not the password.
    let mut refused = pg.cmd(&["status"]);
    refused.env(
        "POSTBOX_DATABASE_URL",
        format!("postgres://nobody:{secret}@127.0.0.1:1/nowhere"),
    );
    let refused = run(refused);
    assert!(!refused.status.success());
    assert!(refused.stderr.contains("127.0.0.1:1"), "{}", refused.stderr);
    assert!(!refused.stderr.contains(&secret), "{}", refused.stderr);
}
