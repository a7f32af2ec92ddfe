//! `postbox archive` and `postbox purge`: retention by hand, on PostgreSQL with tenants and on
//! SQLite.

use crate::support::{Pg, postbox, run};

/// 20 events: 1-12 PROCESSED, 13-16 FAILED (last try 10 days ago), 17-20 PENDING; every one
/// created 40 days ago.
async fn month_old(pg: &Pg, table: &str) {
    pg.insert_events(table, "A", 20, true).await;
    pg.sql(&format!(
        "UPDATE {table} SET status = 'PROCESSED', processed_at = now() WHERE id <= 12;
         UPDATE {table} SET status = 'FAILED', retry_count = 5, last_error = 'boom',
                            updated_at = now() - interval '10 days'
             WHERE id BETWEEN 13 AND 16;
         UPDATE {table} SET created_at = now() - interval '40 days';"
    ))
    .await;
}

#[tokio::test]
async fn archive_and_purge_move_and_delete_only_what_is_old_enough() {
    let pg = Pg::new().await;
    pg.ok(&["migrate"]);
    pg.ok(&["tenants", "add", "acme"]);
    month_old(&pg, "outbox_events").await;
    month_old(&pg, "s_acme.outbox_events").await;

    let dry = pg.ok(&["archive", "--dry-run", "--batch-size", "7"]);
    assert!(
        dry.stdout.contains(
            "default: 12 processed event(s) created more than 30days ago would be archived"
        ),
        "{}",
        dry.stdout
    );
    assert!(dry.stdout.contains("acme: 12"), "{}", dry.stdout);
    assert!(
        dry.stdout.contains("dry run: 24 event(s)"),
        "{}",
        dry.stdout
    );
    assert_eq!(pg.ids("outbox_events_archive", None).await.len(), 0);

    // A shorter age than the events': nothing moves.
    let young = pg.ok(&["archive", "--older-than", "50days"]);
    assert!(
        young.stdout.contains("default: 0 processed"),
        "{}",
        young.stdout
    );

    let out = pg.ok(&["archive", "--tenant", "acme", "--batch-size", "5"]);
    assert!(out.stdout.contains("acme: 12 processed"), "{}", out.stdout);
    assert!(!out.stdout.contains("default:"), "{}", out.stdout);
    assert_eq!(
        pg.ids("s_acme.outbox_events_archive", None).await,
        (1..=12).collect::<Vec<_>>()
    );
    assert_eq!(pg.ids("outbox_events_archive", None).await.len(), 0);
    pg.ok(&["archive"]);
    assert_eq!(
        pg.ids("outbox_events_archive", None).await,
        (1..=12).collect::<Vec<_>>()
    );
    assert_eq!(
        pg.ids("outbox_events", None).await,
        (13..=20).collect::<Vec<_>>()
    );
    let status: serde_json::Value =
        serde_json::from_str(&pg.ok(&["status", "--json"]).stdout).expect("json");
    assert_eq!(status["targets"][0]["processed"], 0, "{status}");

    // Purging the archive: only rows archived long enough ago.
    pg.sql(
        "UPDATE outbox_events_archive SET archived_at = now() - interval '100 days' WHERE id <= 5",
    )
    .await;
    let dry = pg.ok(&["purge", "--archive", "--older-than", "90days", "--dry-run"]);
    assert!(
        dry.stdout.contains("default: 5 archived event(s)"),
        "{}",
        dry.stdout
    );
    assert!(dry.stdout.contains("acme: 0 archived"), "{}", dry.stdout);
    assert_eq!(pg.ids("outbox_events_archive", None).await.len(), 12);
    pg.ok(&[
        "purge",
        "--archive",
        "--older-than",
        "90days",
        "--batch-size",
        "2",
    ]);
    assert_eq!(
        pg.ids("outbox_events_archive", None).await,
        (6..=12).collect::<Vec<_>>()
    );

    // FAILED events: only by an explicit age, only those that failed long enough ago.
    let refused = run(pg.cmd(&["purge", "--failed"]));
    assert_eq!(refused.status.code(), Some(2), "{}", refused.stderr);
    assert!(
        refused.stderr.contains("--older-than"),
        "{}",
        refused.stderr
    );
    let refused = run(pg.cmd(&["purge", "--older-than", "7d"]));
    assert!(!refused.status.success());
    assert!(
        refused.stderr.contains("--archive") && refused.stderr.contains("--failed"),
        "{}",
        refused.stderr
    );
    let out = pg.ok(&["purge", "--failed", "--older-than", "30days"]);
    assert!(out.stdout.contains("default: 0 FAILED"), "{}", out.stdout);
    let out = pg.ok(&[
        "purge",
        "--failed",
        "--older-than",
        "7d",
        "--tenant",
        "acme",
    ]);
    assert!(out.stdout.contains("acme: 4 FAILED"), "{}", out.stdout);
    assert_eq!(
        pg.ids("s_acme.outbox_events", Some("FAILED")).await.len(),
        0
    );
    assert_eq!(pg.ids("outbox_events", Some("FAILED")).await.len(), 4);
    assert_eq!(
        pg.ids("s_acme.outbox_events", Some("PENDING")).await.len(),
        4
    );

    // Bad input: a clear error, nothing touched.
    let unknown = run(pg.cmd(&["archive", "--tenant", "nope"]));
    assert!(!unknown.status.success());
    assert!(
        unknown.stderr.contains("tenant \"nope\" is not registered"),
        "{}",
        unknown.stderr
    );
    let bad = run(pg.cmd(&["purge", "--archive", "--older-than", "soon"]));
    assert_eq!(bad.status.code(), Some(2), "{}", bad.stderr);
    let mut off = pg.cmd(&["archive"]);
    off.env("POSTBOX_RETENTION", "0s");
    let off = run(off);
    assert!(!off.status.success());
    assert!(off.stderr.contains("--older-than"), "{}", off.stderr);
}

#[tokio::test]
async fn archive_and_purge_work_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("outbox.db").display());
    let cmd = |args: &[&str]| {
        let mut cmd = postbox(dir.path(), args);
        cmd.env("POSTBOX_DATABASE_URL", &url);
        cmd
    };
    let ok = |args: &[&str]| {
        let out = run(cmd(args));
        assert!(out.status.success(), "{args:?}: {}", out.stderr);
        out
    };
    ok(&["migrate"]);
    let pool = sqlx::SqlitePool::connect(&url).await.expect("sqlite");
    sqlx::raw_sql(
        "INSERT INTO outbox_events (event_type, aggregate_type, aggregate_id, payload)
             VALUES ('A', 'Order', '1', '{}'), ('A', 'Order', '2', '{}'), ('A', 'Order', '3', '{}');
         UPDATE outbox_events SET status = 'PROCESSED' WHERE id <= 2;
         UPDATE outbox_events SET created_at = '2020-01-01 00:00:00';",
    )
    .execute(&pool)
    .await
    .expect("rows");
    let out = ok(&["archive", "--dry-run"]);
    assert!(
        out.stdout.contains("default: 2 processed"),
        "{}",
        out.stdout
    );
    ok(&["archive"]);
    let archived: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_events_archive")
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!(archived, 2);
    let out = ok(&["purge", "--archive", "--older-than", "1h"]);
    assert!(out.stdout.contains("default: 0 archived"), "{}", out.stdout);
    let tenants = run(cmd(&["archive", "--tenant", "acme"]));
    assert!(!tenants.status.success());
    assert!(tenants.stderr.contains("PostgreSQL"), "{}", tenants.stderr);
}
