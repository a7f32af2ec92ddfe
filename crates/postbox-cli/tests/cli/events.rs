//! `postbox events list|show`.

use crate::support::{Pg, run};

#[tokio::test]
async fn events_are_listed_by_filter_and_shown_whole() {
    let pg = Pg::new().await;
    pg.ok(&["migrate"]);
    pg.insert_events("outbox_events", "InvoiceCreated", 3, true)
        .await;
    pg.insert_events("outbox_events", "OrderPlaced", 2, true)
        .await;
    pg.sql(
        "UPDATE outbox_events SET status = 'FAILED', retry_count = 5,
                last_error = 'broker said: no
second line', headers = '{\"traceparent\": \"00-abc-01\"}'
             WHERE id = 2;
         UPDATE outbox_events SET status = 'PROCESSED', processed_at = now(),
                created_at = now() - interval '40 days' WHERE id = 1;",
    )
    .await;
    pg.ok(&["archive"]);

    let table = pg.ok(&["events", "list"]).stdout;
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with("ID") && lines[0].contains("LAST ERROR"),
        "{table}"
    );
    assert_eq!(
        lines.len(),
        5,
        "the four events of the table, newest first: {table}"
    );
    assert!(lines[1].starts_with('5'), "{table}");
    assert!(
        table.contains("broker said: no second line"),
        "errors on one line: {table}"
    );
    let with_archive = pg.ok(&["events", "list", "--archive"]).stdout;
    assert!(
        with_archive.contains("PROCESSED (archived)"),
        "{with_archive}"
    );

    let failed: serde_json::Value = serde_json::from_str(
        &pg.ok(&["events", "list", "--status", "failed", "--json"])
            .stdout,
    )
    .expect("json");
    let failed = failed.as_array().expect("array");
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0]["id"], 2);
    assert_eq!(failed[0]["payload"]["note"], "plain SQL", "payload as JSON");
    assert_eq!(failed[0]["headers"]["traceparent"], "00-abc-01");

    let orders = pg
        .ok(&[
            "events", "list", "--type", "Order*", "--since", "1h", "--limit", "1",
        ])
        .stdout;
    assert_eq!(orders.lines().count(), 2, "{orders}");
    assert!(
        orders.contains("OrderPlaced") && orders.lines().nth(1).expect("a row").starts_with('5')
    );
    let none = pg.ok(&["events", "list", "--type", "Nope*"]).stdout;
    assert_eq!(none.trim(), "0 events");

    let shown = pg.ok(&["events", "show", "2"]).stdout;
    for expected in [
        "status           FAILED",
        "retry_count      5 of 5",
        "\"traceparent\": \"00-abc-01\"",
        "\"note\": \"plain SQL\"",
        "broker said: no",
    ] {
        assert!(shown.contains(expected), "{expected:?} in:\n{shown}");
    }
    let archived = pg.ok(&["events", "show", "1"]).stdout;
    assert!(archived.contains("archived_at      20"), "{archived}");
    // Tries past max_retries are the slow lane's, and are shown as such.
    pg.sql("UPDATE outbox_events SET retry_count = 8 WHERE id = 2")
        .await;
    let slow = pg.ok(&["events", "show", "2"]).stdout;
    assert!(
        slow.contains("retry_count      8 (5 of 5, then 3 in the slow lane)"),
        "{slow}"
    );

    // Bad input: a clear error naming the flag, never a panic.
    for (args, expected) in [
        (
            &["events", "show", "999"][..],
            "event 999 is not in default",
        ),
        (&["events", "list", "--status", "done"][..], "--status"),
        (
            &["events", "list", "--since", "1d", "--until", "2d"][..],
            "swap",
        ),
        (&["events", "list", "--type", "Inv[0-9]"][..], "only `*`"),
        (&["events", "list", "--since", "yesterday"][..], "RFC 3339"),
        (
            &["events", "list", "--tenant", "nope"][..],
            "not registered",
        ),
    ] {
        let out = run(pg.cmd(args));
        assert!(!out.status.success(), "{args:?}");
        assert!(out.stderr.contains(expected), "{args:?}: {}", out.stderr);
        assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
    }
}

/// `postbox replay` to a real broker: the chosen events, archive included, marked as replays,
/// the originals untouched; dry runs, and refusals for what cannot be meant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_publishes_chosen_events_to_a_broker_again() {
    use postbox_testkit::consumers::RedisStreams;
    let pg = Pg::new().await;
    pg.ok(&["migrate"]);
    pg.insert_events("outbox_events", "InvoiceCreated", 12, true)
        .await;
    pg.insert_events("outbox_events", "OrderPlaced", 3, true)
        .await;
    pg.sql(
        "UPDATE outbox_events SET status = 'PROCESSED', processed_at = now() WHERE id <= 10;
         UPDATE outbox_events SET status = 'FAILED', last_error = 'gone' WHERE id = 11;
         UPDATE outbox_events SET idempotency_key = 'inv-' || id WHERE id <= 12;
         UPDATE outbox_events SET created_at = now() - interval '40 days' WHERE id <= 4;",
    )
    .await;
    pg.ok(&["archive"]);
    let before = pg.ids("outbox_events", Some("PROCESSED")).await;

    let refused = run(pg.cmd(&["replay"]));
    assert!(!refused.status.success());
    assert!(refused.stderr.contains("--all"), "{}", refused.stderr);
    let refused = run(pg.cmd(&["replay", "--status", "pending"]));
    assert!(
        refused.stderr.contains("published by the relays"),
        "{}",
        refused.stderr
    );

    let dry = pg
        .ok(&["replay", "--type", "Invoice*", "--archive", "--dry-run"])
        .stdout;
    assert!(
        dry.contains("dry run: 11 event(s) of default would be replayed"),
        "{dry}"
    );
    assert!(
        dry.lines()
            .nth(1)
            .is_some_and(|l| l.trim_start().starts_with("1 PROCESSED InvoiceCreated")),
        "{dry}"
    );
    let none = pg.ok(&["replay", "--type", "Nope*", "--dry-run"]).stdout;
    assert!(none.contains("dry run: 0 event(s)"), "{none}");

    let streams = RedisStreams::start().await;
    let topic = format!("{}:{{event_type}}", streams.prefix);
    let out = pg.ok(&[
        "replay",
        "--type",
        "Invoice*",
        "--archive",
        "--replay-id",
        "fix-42",
        "--sink",
        "redis",
        "--topic",
        &topic,
        "--rate",
        "200",
    ]);
    assert!(
        out.stdout
            .contains("11 event(s) of default replayed (replay id fix-42"),
        "{}",
        out.stdout
    );
    let ids: Vec<i64> = (1..=11).collect();
    let got = streams
        .received(&ids, std::time::Duration::from_secs(20))
        .await;
    assert_eq!(got.len(), 11, "each once");
    for r in &got {
        let id = r.header("postbox-event-id").expect("event id");
        assert_eq!(r.header("postbox-replay-of"), Some(id));
        assert_eq!(r.header("postbox-replay-id"), Some("fix-42"));
        assert_eq!(
            r.header("postbox-dedup-id"),
            Some(format!("inv-{id}:replay:fix-42").as_str()),
            "{r:?}"
        );
    }
    // By id, with the original dedup id.
    pg.ok(&[
        "replay",
        "2",
        "--keep-dedup-id",
        "--sink",
        "redis",
        "--topic",
        &topic,
    ]);
    let again = streams
        .received(&[2], std::time::Duration::from_secs(20))
        .await;
    assert!(
        again
            .iter()
            .any(|r| r.header("postbox-dedup-id") == Some("inv-2")),
        "{again:?}"
    );
    assert_eq!(
        pg.ids("outbox_events", Some("PROCESSED")).await,
        before,
        "originals untouched"
    );
    streams.cleanup().await;
}

/// An ordered aggregate parked by a FAILED event: `status` counts it, `events list --parked`
/// shows its head, `events skip` releases the rest, and a drain with ordering on publishes it
/// in order (and does not wait for a parked aggregate).
#[tokio::test]
async fn a_parked_aggregate_is_shown_skipped_and_drained_in_order() {
    let pg = Pg::new().await;
    pg.ok(&["migrate"]);
    pg.sql(
        "INSERT INTO outbox_events (event_type, aggregate_type, aggregate_id, payload)
         SELECT e, 'Invoice', a, '{}'
         FROM (VALUES (1, 'InvoiceCreated', '7'), (2, 'InvoiceSent', '7'),
                      (3, 'InvoicePaid', '7'), (4, 'InvoiceCreated', '8'),
                      (5, 'InvoicePaid', '8')) AS v(n, e, a)
         ORDER BY n;
         UPDATE outbox_events SET status = 'PROCESSED', processed_at = now() WHERE id = 1;
         UPDATE outbox_events SET status = 'FAILED', retry_count = 5, last_error = 'rejected'
          WHERE id IN (2, 4);",
    )
    .await;
    let ordered = |args: &[&str]| {
        let mut cmd = pg.cmd(args);
        cmd.env("POSTBOX_ORDERED_AGGREGATE_TYPES", "Invoice");
        let out = crate::support::run(cmd);
        assert!(out.status.success(), "{args:?}: {}", out.stderr);
        out
    };
    let status = pg.ok(&["status"]).stdout;
    assert!(status.contains("2 (2 parked)"), "{status}");
    let parked: serde_json::Value =
        serde_json::from_str(&pg.ok(&["events", "list", "--parked", "--json"]).stdout)
            .expect("json");
    let heads: Vec<i64> = parked
        .as_array()
        .expect("array")
        .iter()
        .map(|e| e["id"].as_i64().expect("id"))
        .collect();
    assert_eq!(heads, [4, 2], "newest first");

    // Parked: the drain publishes nothing of either aggregate, and ends.
    assert!(ordered(&["relay", "--drain"]).stdout.is_empty());

    let skip = pg.ok(&["events", "skip", "2", "1"]);
    assert!(skip.stdout.contains("1 event(s)"), "{}", skip.stdout);
    assert!(skip.stderr.contains("left alone"), "{}", skip.stderr);
    let drained = ordered(&["relay", "--drain"]).json_lines();
    let ids: Vec<i64> = drained
        .iter()
        .map(|e| e["id"].as_i64().expect("id"))
        .collect();
    assert_eq!(ids, [3], "invoice 7 flows; invoice 8 stays parked");
    pg.ok(&["retry", "4"]);
    let drained = ordered(&["relay", "--drain"]).json_lines();
    let ids: Vec<i64> = drained
        .iter()
        .map(|e| e["id"].as_i64().expect("id"))
        .collect();
    assert_eq!(ids, [4, 5], "a retried head goes first");
    let status = pg.ok(&["status"]).stdout;
    assert!(!status.contains("parked"), "{status}");
}

/// Long commands draw a progress line on a terminal (`script` gives the command one) and none
/// into a pipe, where only their summary line is printed.
#[test]
fn progress_is_drawn_on_a_terminal_and_not_into_a_pipe() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("outbox.db");
    let db = db.to_str().expect("utf-8 path");
    let out = crate::support::run(crate::support::postbox(
        dir.path(),
        &["--database-url", db, "migrate"],
    ));
    assert!(out.status.success(), "{}", out.stderr);
    let fail_all = || {
        let conn = std::process::Command::new("sqlite3")
            .arg(db)
            .arg(
                "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 2000)
                 INSERT INTO outbox_events (event_type, payload, status)
                 SELECT 'X', '{}', 'FAILED' FROM c",
            )
            .status()
            .expect("sqlite3 (Debian package sqlite3)");
        assert!(conn.success());
    };
    fail_all();
    let piped = crate::support::run(crate::support::postbox(
        dir.path(),
        &["--database-url", db, "retry", "--all"],
    ));
    assert!(piped.status.success(), "{}", piped.stderr);
    assert!(
        piped.stdout.contains("2000 FAILED event(s)"),
        "{}",
        piped.stdout
    );
    assert!(
        !piped.stderr.contains("retrying FAILED events") && !piped.stdout.contains("event(s) ("),
        "no progress line into a pipe: {}{}",
        piped.stdout,
        piped.stderr
    );

    fail_all();
    let command = format!(
        "{} --database-url {db} retry --all",
        env!("CARGO_BIN_EXE_postbox")
    );
    let mut on_tty = std::process::Command::new("script");
    on_tty
        .args(["-qec", &command, "/dev/null"])
        .current_dir(dir.path());
    for (var, _) in std::env::vars_os() {
        if var.to_string_lossy().starts_with("POSTBOX_") {
            on_tty.env_remove(var);
        }
    }
    let tty = on_tty.output().expect("script (util-linux)");
    let text = String::from_utf8_lossy(&tty.stdout);
    assert!(tty.status.success(), "{text}");
    assert!(
        text.contains("retrying FAILED events of default"),
        "a progress line on a terminal: {text}"
    );
    assert!(
        text.contains("FAILED event(s) of default put back"),
        "{text}"
    );
}
