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
