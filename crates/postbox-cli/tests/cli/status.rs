//! `postbox status`: counts per status and target.

use crate::support::{Pg, run};

#[tokio::test]
async fn status_reports_counts_per_target() {
    let pg = Pg::new().await;
    pg.ok(&["migrate"]);
    pg.ok(&["tenants", "add", "acme"]);
    pg.insert_events("outbox_events", "A", 6, true).await;
    pg.insert_events("s_acme.outbox_events", "B", 2, true).await;
    pg.sql(
        "UPDATE outbox_events SET status = 'PROCESSED', processed_at = now() WHERE id IN (1, 2);
         UPDATE outbox_events SET status = 'FAILED', last_error = 'boom' WHERE id = 3;
         UPDATE outbox_events SET status = 'PROCESSING', locked_until = now() + interval '1 hour'
             WHERE id = 4;
         UPDATE outbox_events SET created_at = now() - interval '90 seconds' WHERE id = 5;",
    )
    .await;
    pg.ok(&["tenants", "suspend", "acme"]);

    let report: serde_json::Value =
        serde_json::from_str(&pg.ok(&["status", "--json"]).stdout).expect("json");
    let targets = report["targets"].as_array().expect("targets");
    assert_eq!(targets.len(), 2);
    let default = &targets[0];
    assert!(default["tenant"].is_null());
    assert_eq!(default["schema"], "public");
    assert_eq!(default["pending"], 2);
    assert_eq!(default["processing"], 1);
    assert_eq!(default["processed"], 2);
    assert_eq!(default["failed"], 1);
    let age = default["oldest_pending_age_secs"].as_f64().expect("an age");
    assert!(
        (89.0..600.0).contains(&age),
        "oldest pending is event 5: {age}"
    );
    let acme = &targets[1];
    assert_eq!(acme["tenant"], "acme");
    assert_eq!(acme["schema"], "s_acme");
    assert_eq!(acme["tenant_status"], "SUSPENDED");
    assert_eq!(acme["pending"], 2);
    assert_eq!(acme["processed"], 0);

    let table = pg.ok(&["status"]).stdout;
    assert!(
        table.contains("PENDING") && table.contains("(default)"),
        "{table}"
    );
    assert!(table.contains("1m 3"), "age shown for humans: {table}");
}

#[tokio::test]
async fn status_of_an_unmigrated_database_says_to_migrate() {
    let pg = Pg::new().await;
    let out = run(pg.cmd(&["status"]));
    assert!(!out.status.success());
    assert!(out.stderr.contains("postbox migrate"), "{}", out.stderr);
}

#[tokio::test]
async fn retry_puts_failed_events_back_and_a_relay_publishes_them() {
    let pg = Pg::new().await;
    pg.ok(&["migrate"]);
    pg.ok(&["tenants", "add", "acme"]);
    pg.insert_events("outbox_events", "A", 4, true).await;
    pg.insert_events("s_acme.outbox_events", "B", 1, true).await;
    pg.sql(
        "UPDATE outbox_events SET status = 'FAILED', retry_count = 5, last_error = 'boom'
             WHERE id IN (1, 2, 3);
         UPDATE s_acme.outbox_events SET status = 'FAILED', retry_count = 5 WHERE id = 1;",
    )
    .await;

    let out = pg.ok(&["retry", "1", "4"]);
    assert!(
        out.stdout.contains("1 FAILED event(s) of default"),
        "{}",
        out.stdout
    );
    assert!(out.stderr.contains("1 of the 2 ids"), "{}", out.stderr);
    assert_eq!(pg.ids("outbox_events", Some("FAILED")).await, [2, 3]);
    assert!(pg.ok(&["retry", "--all"]).stdout.contains("2 FAILED"));
    assert!(pg.ids("outbox_events", Some("FAILED")).await.is_empty());
    assert_eq!(pg.ids("s_acme.outbox_events", Some("FAILED")).await, [1]);
    assert!(
        pg.ok(&["retry", "--all", "--tenant", "acme"])
            .stdout
            .contains("1 FAILED event(s) of acme")
    );
    let unknown = run(pg.cmd(&["retry", "--all", "--tenant", "nobody"]));
    assert!(!unknown.status.success());
    assert!(unknown.stderr.contains("nobody"), "{}", unknown.stderr);

    let drained = pg.ok(&["relay", "--drain", "--sink", "stdout"]);
    assert_eq!(drained.stdout.lines().count(), 5, "{}", drained.stdout);
    assert_eq!(
        pg.ids("outbox_events", Some("PROCESSED")).await,
        [1, 2, 3, 4]
    );
}

#[tokio::test]
async fn status_lists_a_tenant_row_it_cannot_serve_and_fails() {
    let pg = Pg::new().await;
    pg.ok(&["migrate"]);
    pg.ok(&["tenants", "add", "acme"]);
    pg.sql(
        "ALTER TABLE postbox_tenants DROP CONSTRAINT postbox_tenants_id_format;
         INSERT INTO postbox_tenants (id, schema_name) VALUES ('Acme Corp', 's_acme_corp');",
    )
    .await;
    let out = run(pg.cmd(&["status", "--json"]));
    assert!(
        !out.status.success(),
        "a row that cannot be served fails status"
    );
    let report: serde_json::Value = serde_json::from_str(&out.stdout).expect("json");
    let targets = report["targets"].as_array().expect("targets");
    assert_eq!(targets.len(), 3, "{report}");
    assert_eq!(targets[1]["tenant"], "acme");
    assert!(targets[1]["error"].is_null());
    assert_eq!(targets[2]["tenant"], "Acme Corp");
    assert!(
        targets[2]["error"]
            .as_str()
            .is_some_and(|e| e.contains("not served")),
        "{report}"
    );
}

/// A relay started while its database is away waits for it, saying so, then publishes; one
/// whose database refuses it for good (no such role) stops at once with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_waits_for_a_database_that_is_not_up_yet() {
    use postbox_testkit::proxy::Proxy;
    let pg = Pg::new().await;
    pg.ok(&["migrate"]);
    pg.insert_events("outbox_events", "A", 5, true).await;
    let proxy = Proxy::start("127.0.0.1:5432".parse().expect("address")).await;
    proxy.down();
    let url = pg
        .db
        .url()
        .replace("127.0.0.1:5432", &format!("127.0.0.1:{}", proxy.port()));
    let mut cmd = pg.cmd(&["relay", "--drain", "--sink", "null"]);
    cmd.env("POSTBOX_DATABASE_URL", &url);
    let mut relay = crate::support::Running::spawn(cmd);
    // Away until the relay says it waits for the database.
    let relay = tokio::task::spawn_blocking(move || {
        relay.wait_for_stderr("the database does not answer yet", crate::support::DEADLINE);
        relay
    })
    .await
    .expect("relay");
    proxy.up();
    let out = tokio::task::spawn_blocking(move || relay.finish(crate::support::DEADLINE))
        .await
        .expect("relay");
    assert!(out.status.success(), "{}", out.stderr);
    assert!(
        out.stderr.contains("the database does not answer yet"),
        "{}",
        out.stderr
    );
    assert_eq!(pg.ids("outbox_events", Some("PROCESSED")).await.len(), 5);

    let mut cmd = pg.cmd(&["relay", "--drain", "--sink", "null"]);
    let no_role = pg.db.url().replace("postgres@", "no_such_role@");
    cmd.env("POSTBOX_DATABASE_URL", &no_role);
    let started = std::time::Instant::now();
    let out = run(cmd);
    assert!(!out.status.success());
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    assert!(out.stderr.contains("no_such_role"), "{}", out.stderr);
}

/// Past 50 outboxes the report is a summary: totals, and the targets with the largest and oldest
/// backlogs and the most FAILED events; `--all` still lists every one.
#[tokio::test]
async fn status_of_many_tenants_is_a_summary_and_all_lists_every_one() {
    let pg = Pg::new().await;
    pg.ok(&["migrate"]);
    let ids: Vec<String> = (0..60).map(|i| format!("t{i}")).collect();
    let mut args = vec!["tenants", "add"];
    args.extend(ids.iter().map(String::as_str));
    pg.ok(&args);
    pg.insert_events("s_t7.outbox_events", "Busy", 30, true)
        .await;
    pg.insert_events("s_t42.outbox_events", "Some", 3, true)
        .await;
    pg.insert_events("s_t42.outbox_events", "Bad", 1, true)
        .await;
    pg.sql("UPDATE s_t42.outbox_events SET status = 'FAILED', last_error = 'boom' WHERE event_type = 'Bad';")
        .await;
    pg.ok(&["tenants", "suspend", "t3"]);

    let table = pg.ok(&["status"]).stdout;
    assert!(
        table.contains("61 outboxes (the default schema and 60 tenant(s), 1 suspended)"),
        "{table}"
    );
    assert!(
        table.contains("33 pending, 0 processing, 1 FAILED"),
        "{table}"
    );
    assert!(
        table.contains("2 with a backlog, 1 with FAILED events"),
        "{table}"
    );
    let backlogs = table
        .split("largest backlogs:")
        .nth(1)
        .expect("a list of the largest backlogs");
    let first = backlogs.lines().nth(2).expect("a first line");
    assert!(first.trim_start().starts_with("t7 "), "{table}");
    assert!(table.contains("most FAILED events:"), "{table}");
    assert!(
        table.lines().count() < 40,
        "a summary, not a line each:\n{table}"
    );

    let json: serde_json::Value =
        serde_json::from_str(&pg.ok(&["status", "--json"]).stdout).expect("json");
    assert_eq!(json["summary"]["targets"], 61);
    assert_eq!(json["summary"]["busiest"][0]["tenant"], "t7");
    assert_eq!(json["summary"]["busiest"][0]["pending"], 30);
    assert_eq!(json["summary"]["failing"][0]["tenant"], "t42");

    let all: serde_json::Value =
        serde_json::from_str(&pg.ok(&["status", "--all", "--json"]).stdout).expect("json");
    assert_eq!(all["targets"].as_array().map(Vec::len), Some(61));
    assert!(all.get("summary").is_none());
}
