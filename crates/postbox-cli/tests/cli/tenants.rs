//! `postbox tenants`: registry commands, tenant isolation on the wire, suspended tenants wait,
//! hostile names are refused.

use crate::support::{Pg, run};

#[tokio::test]
async fn tenants_are_served_as_themselves_and_suspended_ones_wait() {
    let pg = Pg::new().await;
    pg.ok(&["migrate"]);
    let added = pg.ok(&["tenants", "add", "acme"]);
    assert!(added.stdout.contains("s_acme"), "{}", added.stdout);
    pg.ok(&["tenants", "add", "globex", "--schema", "globex_events"]);

    let list: serde_json::Value =
        serde_json::from_str(&pg.ok(&["tenants", "list", "--json"]).stdout).expect("json");
    let list = list.as_array().expect("array");
    assert_eq!(list.len(), 2);
    assert_eq!(list[0]["id"], "acme");
    assert_eq!(list[0]["schema"], "s_acme");
    assert_eq!(list[1]["id"], "globex");
    assert_eq!(list[1]["schema"], "globex_events");
    assert!(list.iter().all(|t| t["status"] == "ACTIVE"));

    pg.insert_events("outbox_events", "DefaultEvent", 3, true)
        .await;
    pg.insert_events("s_acme.outbox_events", "AcmeEvent", 4, true)
        .await;
    pg.insert_events("globex_events.outbox_events", "GlobexEvent", 5, true)
        .await;

    let suspended = pg.ok(&["tenants", "suspend", "globex"]);
    assert!(suspended.stdout.contains("SUSPENDED"));
    let table = pg.ok(&["tenants", "list"]).stdout;
    let globex_row = table
        .lines()
        .find(|l| l.starts_with("globex"))
        .expect("globex listed");
    assert!(globex_row.contains("SUSPENDED"), "{table}");

    let lines = pg.ok(&["relay", "--drain"]).json_lines();
    let of = |tenant: serde_json::Value| {
        lines
            .iter()
            .filter(|l| l["tenant"] == tenant)
            .map(|l| l["event_type"].as_str().expect("event_type").to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(of(serde_json::Value::Null), vec!["DefaultEvent"; 3]);
    assert_eq!(of("acme".into()), vec!["AcmeEvent"; 4]);
    assert!(
        of("globex".into()).is_empty(),
        "a suspended tenant was served"
    );
    assert_eq!(lines.len(), 7);
    assert_eq!(
        pg.ids("globex_events.outbox_events", Some("PENDING"))
            .await
            .len(),
        5
    );

    pg.ok(&["tenants", "resume", "globex"]);
    let lines = pg.ok(&["relay", "--drain"]).json_lines();
    assert_eq!(lines.len(), 5);
    assert!(
        lines
            .iter()
            .all(|l| l["tenant"] == "globex" && l["event_type"] == "GlobexEvent")
    );
}

#[tokio::test]
async fn hostile_names_are_refused_with_the_name_in_the_error() {
    let pg = Pg::new().await;
    pg.ok(&["migrate"]);
    for args in [
        &["tenants", "add", "bad;name"][..],
        &["tenants", "add", "with space"],
        &["tenants", "add", "Robert'); DROP TABLE outbox_events;--"],
        &["tenants", "suspend", "bad;name"],
        &[
            "tenants",
            "add",
            "fine",
            "--schema",
            "x; drop schema public cascade",
        ],
        &["tenants", "add", "fine", "--schema", "pg_catalog"],
    ] {
        let out = run(pg.cmd(args));
        assert!(!out.status.success(), "{args:?} was accepted");
        let name = args
            .iter()
            .rev()
            .find(|a| !a.starts_with("--"))
            .expect("a name");
        assert!(
            out.stderr.contains(name),
            "{args:?}: the error should name {name:?}: {}",
            out.stderr
        );
        assert!(out.stderr.contains("invalid"), "{}", out.stderr);
    }
    let unknown = run(pg.cmd(&["tenants", "resume", "nobody"]));
    assert!(!unknown.status.success());
    assert!(
        unknown.stderr.contains("not registered"),
        "{}",
        unknown.stderr
    );
    assert!(pg.ok(&["tenants", "list"]).stdout.contains("no tenants"));
    // And nothing was created by the refused commands.
    assert_eq!(
        pg.ids("outbox_events", None).await.len(),
        0,
        "the default outbox is intact"
    );
}

#[tokio::test]
async fn tenants_on_sqlite_are_unsupported() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = run(crate::support::postbox(
        dir.path(),
        &["tenants", "add", "acme"],
    ));
    assert!(!out.status.success());
    assert!(out.stderr.contains("PostgreSQL"), "{}", out.stderr);
    assert!(
        !dir.path().join("postbox.db").exists(),
        "no database file is created just to refuse"
    );
}
