//! The binary on MySQL/MariaDB (`mysql://…`): migrate, status, a draining relay, events and a
//! retry, and a clear refusal of what needs PostgreSQL.

use postbox_testkit::TestMySql;

use crate::support::{postbox, run};

struct My {
    db: TestMySql,
    dir: tempfile::TempDir,
}

impl My {
    fn cmd(&self, args: &[&str]) -> std::process::Command {
        let mut cmd = postbox(self.dir.path(), args);
        cmd.env("POSTBOX_DATABASE_URL", self.db.url());
        cmd
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = run(self.cmd(args));
        assert!(
            out.status.success(),
            "postbox {args:?} failed:\n{}\n{}",
            out.stdout,
            out.stderr
        );
        out.stdout
    }
}

#[tokio::test]
async fn migrate_relay_status_and_retry_on_mysql() {
    let my = My {
        db: TestMySql::new().await,
        dir: tempfile::tempdir().expect("tempdir"),
    };
    assert!(my.ok(&["migrate"]).contains("5 migration(s) applied"));
    assert!(my.ok(&["migrate"]).contains("up to date"));
    let store = my.db.store().await;
    // Producers in other languages write plain SQL; one of the rows is a poison pill.
    sqlx::query(
        "INSERT INTO outbox_events (event_type, aggregate_type, aggregate_id, payload)
         VALUES ('OrderPlaced', 'Order', '1', '{\"n\": 1}'),
                ('OrderPlaced', 'Order', '2', '{\"n\": 2}'),
                ('OrderPlaced', 'Order', '3', '{\"n\": 3}')",
    )
    .execute(store.pool())
    .await
    .expect("plain insert");
    sqlx::query("UPDATE outbox_events SET headers = '[]' WHERE id = 3")
        .execute(store.pool())
        .await
        .expect("spoil a row");
    let status: serde_json::Value =
        serde_json::from_str(&my.ok(&["status", "--json"])).expect("status json");
    assert_eq!(status["targets"][0]["pending"], 3, "{status}");

    let drained = my.ok(&["relay", "--drain", "--sink", "stdout"]);
    let published: Vec<serde_json::Value> = drained
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let ids: Vec<i64> = published.iter().filter_map(|e| e["id"].as_i64()).collect();
    assert_eq!(ids, [1, 2], "{drained}");
    assert_eq!(published[0]["payload"]["n"], 1);

    let status: serde_json::Value =
        serde_json::from_str(&my.ok(&["status", "--json"])).expect("status json");
    assert_eq!(status["targets"][0]["processed"], 2, "{status}");
    assert_eq!(status["targets"][0]["failed"], 1, "{status}");
    let failed = my.ok(&["events", "list", "--status", "failed"]);
    assert!(
        failed.contains("headers"),
        "the reason names the column: {failed}"
    );

    sqlx::query("UPDATE outbox_events SET headers = '{}' WHERE id = 3")
        .execute(store.pool())
        .await
        .expect("repair the row");
    my.ok(&["retry", "3"]);
    let drained = my.ok(&["relay", "--drain", "--sink", "stdout"]);
    assert!(drained.contains("\"id\":3"), "{drained}");

    let refused = run(my.cmd(&["tenants", "add", "acme"]));
    assert!(!refused.status.success());
    assert!(
        refused.stderr.contains("tenants need PostgreSQL"),
        "{}",
        refused.stderr
    );
}

/// One relay serves three databases (`database_urls`): PostgreSQL, MariaDB and one that is down.
/// The two that answer are migrated and their events published, each in its own turn, while the
/// third is retried with the reason logged; a signal stops the relay cleanly. A drain over a
/// database that stays down gives up on it after `drain_patience` and says which.
#[tokio::test]
async fn one_relay_serves_several_databases_and_a_down_one_stops_none() {
    let pg = postbox_testkit::TestDb::new().await;
    let my = TestMySql::new().await;
    let dir = tempfile::tempdir().expect("tempdir");
    // Nothing listens on port 9: a database that is down.
    let down = "mysql://root@127.0.0.1:9/gone";
    let urls = format!("{},{},{down}", pg.url(), my.url());
    let cmd = |args: &[&str]| {
        let mut cmd = postbox(dir.path(), args);
        cmd.env("POSTBOX_DATABASE_URLS", &urls);
        cmd
    };
    let both = format!("{},{}", pg.url(), my.url());
    let mut migrate = postbox(dir.path(), &["migrate"]);
    migrate.env("POSTBOX_DATABASE_URLS", &both);
    let out = run(migrate);
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(
        out.stdout.matches("migration(s) applied").count(),
        2,
        "{}",
        out.stdout
    );

    let pg_store = postbox::PgStore::new(pg.pool().clone());
    let my_store = my.store().await;
    for n in 0..50 {
        sqlx::query(
            "INSERT INTO outbox_events (event_type, aggregate_type, aggregate_id, payload)
             VALUES ('FromPostgres', 'Shard', 'pg', '{}')",
        )
        .execute(pg_store.pool())
        .await
        .expect("insert pg");
        sqlx::query(
            "INSERT INTO outbox_events (event_type, aggregate_type, aggregate_id, payload)
             VALUES ('FromMySql', 'Shard', 'my', ?)",
        )
        .bind(format!("{{\"n\": {n}}}"))
        .execute(my_store.pool())
        .await
        .expect("insert mysql");
    }
    let mut relay = crate::support::Running::spawn(cmd(&["relay", "--sink", "stdout"]));
    relay.wait_for_lines(100, std::time::Duration::from_secs(60));
    relay.signal("TERM");
    let done = relay.finish(std::time::Duration::from_secs(30));
    assert!(done.status.success(), "{}", done.stderr);
    let events = done.json_lines();
    for kind in ["FromPostgres", "FromMySql"] {
        assert_eq!(
            events.iter().filter(|e| e["event_type"] == kind).count(),
            50,
            "every {kind} event once"
        );
    }
    assert!(
        done.stderr.contains("127.0.0.1:9"),
        "the database that is down is named: {}",
        done.stderr
    );

    let status = run(cmd(&["status", "--json"]));
    assert_eq!(
        status.status.code(),
        Some(1),
        "the down database fails the status"
    );
    let status: serde_json::Value = serde_json::from_str(&status.stdout).expect("json");
    let processed: Vec<i64> = status["databases"]
        .as_array()
        .expect("databases")
        .iter()
        .map(|d| d["targets"][0]["processed"].as_i64().unwrap_or(-1))
        .collect();
    assert_eq!(processed, [50, 50], "{status}");
    assert_eq!(
        status["unreachable"].as_array().map(Vec::len),
        Some(1),
        "{status}"
    );

    let mut drain = cmd(&["relay", "--drain", "--sink", "stdout"]);
    drain.env("POSTBOX_DRAIN_PATIENCE", "2s");
    let drained = run(drain);
    assert_eq!(drained.status.code(), Some(1), "{}", drained.stderr);
    assert!(
        drained.stderr.contains("1 database(s) were not drained")
            && drained.stderr.contains("drain_patience"),
        "{}",
        drained.stderr
    );
}
