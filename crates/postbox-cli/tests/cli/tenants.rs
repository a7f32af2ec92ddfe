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

/// A publish that hangs holds up only itself, through the binary, under light load: while a
/// webhook never answers one event of tenant acme, events committed one by one into acme,
/// globex and the default schema each reach the webhook within two seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_webhook_holds_up_only_its_own_event() {
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    let pg = Pg::new().await;
    pg.ok(&["migrate"]);
    pg.ok(&["tenants", "add", "acme", "globex"]);
    // (tenant, event type) of every request, as it arrives; requests for `Hang` never end.
    let arrived: Arc<Mutex<Vec<(serde_json::Value, String)>>> = Arc::default();
    let seen = Arc::clone(&arrived);
    let app = axum::Router::new().route(
        "/hook/{event_type}",
        axum::routing::post(
            move |axum::extract::Path(event_type): axum::extract::Path<String>,
                  body: axum::Json<serde_json::Value>| {
                let seen = Arc::clone(&seen);
                async move {
                    seen.lock()
                        .expect("lock")
                        .push((body["tenant"].clone(), event_type.clone()));
                    if event_type == "Hang" {
                        std::future::pending::<()>().await;
                    }
                    "ok"
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    let url = format!("http://{addr}/hook/{{event_type}}");
    let mut relay = crate::support::Running::spawn(pg.cmd(&[
        "relay",
        "--sink",
        "webhook",
        "--sink-url",
        &url,
        "--log-level",
        "info",
    ]));
    relay.wait_for_stderr("relay started", Duration::from_secs(30));
    let count = |tenant: &serde_json::Value, event_type: &str| {
        arrived
            .lock()
            .expect("lock")
            .iter()
            .filter(|(t, e)| t == tenant && e == event_type)
            .count()
    };
    pg.insert_events("s_acme.outbox_events", "Hang", 1, true)
        .await;
    let wait = |tenant: serde_json::Value, event_type: &'static str, within: Duration| {
        let count = &count;
        async move {
            let deadline = Instant::now() + within;
            while count(&tenant, event_type) == 0 {
                assert!(
                    Instant::now() < deadline,
                    "no {event_type} of {tenant} within {within:?}"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    wait("acme".into(), "Hang", Duration::from_secs(15)).await;
    for (table, tenant) in [
        ("s_acme.outbox_events", serde_json::json!("acme")),
        ("s_globex.outbox_events", serde_json::json!("globex")),
        ("outbox_events", serde_json::Value::Null),
    ] {
        for event_type in ["Light1", "Light2"] {
            let started = Instant::now();
            pg.insert_events(table, event_type, 1, true).await;
            wait(tenant.clone(), event_type, Duration::from_secs(2)).await;
            assert!(started.elapsed() < Duration::from_secs(2));
        }
    }
    assert_eq!(
        count(&"acme".into(), "Hang"),
        1,
        "the hanging publish is still the one"
    );
    relay.kill();
}

/// Many tenants from a file and the command line: every id checked before anything is added (a
/// bad one named with its line), the rest added, and the same command again adds nothing and
/// fails nothing.
#[tokio::test]
async fn many_tenants_are_added_from_a_file_and_again_without_harm() {
    let pg = Pg::new().await;
    pg.ok(&["migrate"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("bad.txt");
    std::fs::write(&bad, "fine1\nNot Fine\n").expect("write");
    let refused = run(pg.cmd(&["tenants", "add", "--file", bad.to_str().expect("path")]));
    assert!(!refused.status.success());
    assert!(
        refused.stderr.contains("bad.txt:2") && refused.stderr.contains("Not Fine"),
        "{}",
        refused.stderr
    );
    assert!(
        !pg.ok(&["tenants", "list"]).stdout.contains("fine1"),
        "nothing is added when one id is bad"
    );

    let file = dir.path().join("tenants.txt");
    std::fs::write(&file, "# our customers\nacme\n\nglobex\ninitech\nacme\n").expect("write");
    let path = file.to_str().expect("path");
    let added = pg.ok(&["tenants", "add", "--file", path, "umbrella"]);
    assert!(
        added.stdout.contains("added 4 tenant(s)"),
        "{}",
        added.stdout
    );
    let list = pg.ok(&["tenants", "list"]).stdout;
    for id in ["acme", "globex", "initech", "umbrella"] {
        assert!(list.contains(&format!("s_{id}")), "{list}");
    }
    let again = pg.ok(&["tenants", "add", "--file", path, "umbrella"]);
    assert!(
        again.stdout.contains("added 0 tenant(s)") && again.stdout.contains("4 already"),
        "{}",
        again.stdout
    );
}
