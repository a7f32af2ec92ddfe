//! Upgrades in place: a database made by the release before the SQL tree (its migrations
//! recorded as `outbox_0008_claim`, `registry_0001_tenants`; its functions defined only by
//! migrations), dumped into `tests/fixtures/previous-release/` (how: the README there), is
//! migrated by this release through `postbox::connect(url)` and relayed: every store renames
//! the records without running a migration twice, and the events the earlier release left
//! pending are published once, each aggregate in order, the one it had published not again.

#![allow(clippy::unwrap_used, reason = "tests")]

use std::time::Duration;

use postbox::{Relay, RelayConfig};
use postbox_testkit::RecordingSink;
use sqlx::AssertSqlSafe;

/// What every fixture holds: one event the earlier release's relay published, then four its
/// producers wrote by plain SQL and left pending (three of aggregate `invoice/inv-1`).
const PENDING: [&str; 4] = ["InvoiceCreated", "InvoiceSent", "InvoicePaid", "Heartbeat"];

/// The dump, without psql's own commands (`\restrict`, `\connect`): plain SQL for sqlx.
fn fixture(name: &str) -> String {
    let path = format!(
        "{}/tests/fixtures/previous-release/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .lines()
        .filter(|line| !line.starts_with('\\'))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Migrates the database at `url` with this release and relays it; returns what `migrate`
/// applied.
async fn upgrade_and_relay(url: &str) -> Vec<String> {
    let store = postbox::connect(url).await.unwrap();
    let applied = postbox::migrate(&store).await.unwrap();
    assert!(
        !applied.iter().any(|a| a.contains("0001_")),
        "a migration ran twice: {applied:?}"
    );
    assert!(
        postbox::migrate(&store).await.unwrap().is_empty(),
        "a second migrate has nothing to do"
    );
    let sink = RecordingSink::new();
    let config = RelayConfig::default()
        .poll_interval(Duration::from_millis(20))
        .ordered_aggregate_types(["invoice"]);
    let relay = Relay::new(store, sink.clone(), config).unwrap();
    relay.drain(std::future::pending()).await.unwrap();
    let published: Vec<String> = sink
        .published()
        .iter()
        .map(|e| e.event_type.clone())
        .collect();
    let mut sorted = published.clone();
    sorted.sort();
    let mut expected = PENDING.map(str::to_owned).to_vec();
    expected.sort();
    assert_eq!(
        sorted, expected,
        "each pending event once, the published one not again"
    );
    let invoice: Vec<&String> = published.iter().filter(|t| *t != "Heartbeat").collect();
    assert_eq!(invoice, ["InvoiceCreated", "InvoiceSent", "InvoicePaid"]);
    applied
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn a_postgresql_outbox_of_the_previous_release_is_migrated_and_relayed() {
    use sqlx::Connection;
    let db = postbox_testkit::TestDb::new().await;
    let mut conn = sqlx::PgConnection::connect(db.url()).await.unwrap();
    sqlx::raw_sql(AssertSqlSafe(fixture("postgres.sql")))
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    let applied = upgrade_and_relay(db.url()).await;
    assert_eq!(
        applied.first().map(String::as_str),
        Some("public: 0018_function_checksums")
    );
    assert!(
        applied
            .iter()
            .any(|a| a.ends_with(": function postbox_claim")),
        "functions installed from their files: {applied:?}"
    );
    let names: Vec<String> =
        sqlx::query_scalar("SELECT name FROM postbox_schema_history ORDER BY name")
            .fetch_all(db.pool())
            .await
            .unwrap();
    let expected: Vec<String> = (1..=21).map(|n| format!("{n:04}")).collect();
    let numbers: Vec<String> = names.iter().map(|n| n[..4].to_owned()).collect();
    assert_eq!(
        numbers, expected,
        "every migration recorded once, by its file: {names:?}"
    );
}

#[cfg(feature = "mysql")]
#[tokio::test]
async fn a_mysql_outbox_of_the_previous_release_is_migrated_and_relayed() {
    use sqlx::Connection;
    let db = postbox_testkit::TestMySql::new().await;
    let mut conn = sqlx::MySqlConnection::connect(db.url()).await.unwrap();
    sqlx::raw_sql(AssertSqlSafe(fixture("mysql.sql")))
        .execute(&mut conn)
        .await
        .unwrap();
    let applied = upgrade_and_relay(db.url()).await;
    assert!(
        applied.len() == 1 && applied[0].ends_with(": 0005_truncate_guard"),
        "the truncate guard, nothing else new on MySQL: {applied:?}"
    );
    let names: Vec<String> =
        sqlx::query_scalar("SELECT name FROM postbox_schema_history ORDER BY name")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    assert_eq!(
        names,
        [
            "0001_outbox_events",
            "0002_retry_due",
            "0003_retry_index",
            "0004_inbox",
            "0005_truncate_guard"
        ]
    );
    conn.close().await.unwrap();
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn an_sqlite_outbox_of_the_previous_release_is_migrated_and_relayed() {
    use sqlx::Connection;
    let db = postbox_testkit::TestSqlite::new();
    let path = db.path().to_str().unwrap().to_owned();
    let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{path}?mode=rwc"))
        .await
        .unwrap();
    sqlx::raw_sql(AssertSqlSafe(fixture("sqlite.sql")))
        .execute(&mut conn)
        .await
        .unwrap();
    let applied = upgrade_and_relay(&path).await;
    assert!(applied.is_empty(), "nothing new on SQLite: {applied:?}");
    let names: Vec<String> =
        sqlx::query_scalar("SELECT name FROM postbox_schema_history ORDER BY name")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    assert_eq!(
        names,
        [
            "0001_outbox_events",
            "0002_sink_health",
            "0003_retention",
            "0004_ordering",
            "0005_inbox"
        ]
    );
    conn.close().await.unwrap();
}
