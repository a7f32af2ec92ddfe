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
    assert!(my.ok(&["migrate"]).contains("1 migration(s) applied"));
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
