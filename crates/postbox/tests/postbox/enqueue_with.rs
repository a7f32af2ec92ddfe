//! `Outbox::enqueue_with` on PostgreSQL: a business statement and its event as one SQL statement.
//! Both are written or neither; bad input is refused before anything is sent.

#![allow(
    clippy::unwrap_used,
    reason = "tests fail loudly on the first unexpected error"
)]

use std::time::Duration;

use crate::common::{Running, config, own_store, pg, publish_marker};
use postbox::{Error, Event, Relay, event::Enqueued};
use postbox_testkit::{RecordingSink, TestDb};

const CREATE_INVOICES: &str =
    "CREATE TABLE invoices (id BIGINT PRIMARY KEY, amount_cents BIGINT NOT NULL, status TEXT)";
const INSERT_INVOICE: &str = "INSERT INTO invoices (id, amount_cents) VALUES ($1, $2)";

/// A migrated database with an `invoices` table.
async fn invoices_db() -> TestDb {
    let (db, _store) = pg().await;
    sqlx::query(CREATE_INVOICES)
        .execute(db.pool())
        .await
        .unwrap();
    db
}

fn invoice_created(id: i64) -> Event {
    Event::new("InvoiceCreated", &serde_json::json!({ "invoice_id": id }))
        .unwrap()
        .aggregate("Invoice", id.to_string())
}

/// The one `bigint` that `sql` selects.
async fn count(db: &TestDb, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(db.pool()).await.unwrap()
}

async fn invoices(db: &TestDb) -> i64 {
    count(db, "SELECT count(*) FROM invoices").await
}

async fn events(db: &TestDb) -> i64 {
    count(db, "SELECT count(*) FROM outbox_events").await
}

#[tokio::test]
async fn the_business_row_and_the_event_are_written_by_one_statement() {
    let db = invoices_db().await;
    let outbox = db.outbox();
    let mut tx = db.pool().begin().await.unwrap();
    // A statement before, so that "one statement" is not true of the whole transaction.
    sqlx::query("INSERT INTO invoices (id, amount_cents) VALUES (1, 100)")
        .execute(&mut *tx)
        .await
        .unwrap();
    let statement = sqlx::query(INSERT_INVOICE).bind(2_i64).bind(1200_i64);
    let done = outbox
        .enqueue_with(&mut tx, statement, invoice_created(2))
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let Enqueued::Inserted(id) = done else {
        panic!("expected an insert, got {done:?}")
    };
    let (event_type, aggregate_id, payload, key): (String, String, serde_json::Value, String) =
        sqlx::query_as(
            "SELECT event_type, aggregate_id, payload, idempotency_key FROM outbox_events \
             WHERE id = $1",
        )
        .bind(id)
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(event_type, "InvoiceCreated");
    assert_eq!(aggregate_id, "2");
    assert_eq!(payload, serde_json::json!({ "invoice_id": 2 }));
    assert!(key.starts_with("Invoice:2:InvoiceCreated:"), "{key}");
    let amount: i64 = sqlx::query_scalar("SELECT amount_cents FROM invoices WHERE id = 2")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(amount, 1200, "the statement's own binds are kept");

    // Rows written by one statement share its command id (cmin); the first statement's differ.
    let event_cmin = count(&db, "SELECT cmin::text::bigint FROM outbox_events").await;
    let first_cmin = count(&db, "SELECT cmin::text::bigint FROM invoices WHERE id = 1").await;
    let second_cmin = count(&db, "SELECT cmin::text::bigint FROM invoices WHERE id = 2").await;
    assert_eq!(event_cmin, second_cmin);
    assert_ne!(event_cmin, first_cmin);
}

#[tokio::test]
async fn a_rolled_back_transaction_keeps_neither_the_row_nor_the_event() {
    let db = invoices_db().await;
    let outbox = db.outbox();
    let mut tx = db.pool().begin().await.unwrap();
    let statement = sqlx::query(INSERT_INVOICE).bind(7_i64).bind(1_i64);
    outbox
        .enqueue_with(&mut tx, statement, invoice_created(7))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!((invoices(&db).await, events(&db).await), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_event_is_never_published_while_a_relay_runs() {
    let db = invoices_db().await;
    let sink = RecordingSink::new();
    let relay =
        Running::start(Relay::new(own_store(&db, 3).await, sink.clone(), config()).unwrap());
    let outbox = db.outbox();
    let mut ghost_tx = db.pool().begin().await.unwrap();
    let statement = sqlx::query(INSERT_INVOICE).bind(1_i64).bind(1_i64);
    let ghost = Event::new("Ghost", &1).unwrap().without_idempotency_key();
    outbox
        .enqueue_with(&mut ghost_tx, statement, ghost)
        .await
        .unwrap();
    // The relay keeps claiming meanwhile: a marker committed after the ghost gets through.
    publish_marker(&db, &outbox, &sink, "Marker").await;
    ghost_tx.rollback().await.unwrap();
    publish_marker(&db, &outbox, &sink, "AfterRollback").await;
    relay.stop().await;
    assert!(sink.published().iter().all(|e| e.event_type != "Ghost"));
    assert_eq!((invoices(&db).await, events(&db).await), (0, 2));
}

#[tokio::test]
async fn a_connection_lost_before_the_statement_writes_nothing_and_says_so() {
    let db = invoices_db().await;
    let mut conn = db.pool().acquire().await.unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .execute(db.pool())
        .await
        .unwrap();
    let statement = sqlx::query(INSERT_INVOICE).bind(1_i64).bind(1_i64);
    let err = db
        .outbox()
        .enqueue_with(&mut conn, statement, invoice_created(1))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Database(_)), "{err}");
    assert_eq!((invoices(&db).await, events(&db).await), (0, 0));
}

#[tokio::test]
async fn a_failing_business_statement_writes_no_event() {
    let db = invoices_db().await;
    sqlx::query("INSERT INTO invoices (id, amount_cents) VALUES (9, 1)")
        .execute(db.pool())
        .await
        .unwrap();
    // Outside a transaction, so a half-written statement would stay.
    let mut conn = db.pool().acquire().await.unwrap();
    let duplicate_row = sqlx::query(INSERT_INVOICE).bind(9_i64).bind(2_i64);
    let err = db
        .outbox()
        .enqueue_with(&mut conn, duplicate_row, invoice_created(9))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Database(e) if e.as_database_error().is_some_and(|d| d.is_unique_violation())),
        "{err}"
    );
    assert_eq!(events(&db).await, 0);
}

#[tokio::test]
async fn an_invalid_event_is_refused_before_the_statement_runs() {
    let db = invoices_db().await;
    let mut conn = db.pool().acquire().await.unwrap();
    let outbox = db.outbox_builder().payload_limit(16).build();
    let big = Event::new("InvoiceCreated", &"x".repeat(100)).unwrap();
    let statement = sqlx::query(INSERT_INVOICE).bind(1_i64).bind(1_i64);
    let err = outbox
        .enqueue_with(&mut conn, statement, big)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidEvent {
                field: "payload",
                ..
            }
        ),
        "{err}"
    );
    assert_eq!((invoices(&db).await, events(&db).await), (0, 0));
}

#[tokio::test]
async fn an_empty_statement_is_refused_with_a_clear_error() {
    let db = invoices_db().await;
    let mut conn = db.pool().acquire().await.unwrap();
    let err = db
        .outbox()
        .enqueue_with(&mut conn, sqlx::query(" ;\n "), invoice_created(1))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidStatement(_)), "{err}");
    assert!(err.to_string().contains("empty"), "{err}");
    assert_eq!(events(&db).await, 0);
}

#[tokio::test]
async fn a_placeholder_without_its_value_is_refused_not_filled_with_the_events() {
    let db = invoices_db().await;
    let mut conn = db.pool().acquire().await.unwrap();
    let one_bind_short = sqlx::query(INSERT_INVOICE).bind(1_i64);
    let err = db
        .outbox()
        .enqueue_with(&mut conn, one_bind_short, invoice_created(1))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidStatement(_)), "{err}");
    assert!(err.to_string().contains("uses $2 but 1 value"), "{err}");
    assert_eq!((invoices(&db).await, events(&db).await), (0, 0));
}

#[tokio::test]
async fn a_duplicate_key_writes_the_row_and_reports_the_duplicate() {
    let db = invoices_db().await;
    let outbox = db.outbox();
    let mut conn = db.pool().acquire().await.unwrap();
    let first = sqlx::query(INSERT_INVOICE).bind(1_i64).bind(1_i64);
    let second = sqlx::query(INSERT_INVOICE).bind(2_i64).bind(1_i64);
    let keyed = || invoice_created(1).idempotency_key("invoice-1");
    let a = outbox
        .enqueue_with(&mut conn, first, keyed())
        .await
        .unwrap();
    let b = outbox
        .enqueue_with(&mut conn, second, keyed())
        .await
        .unwrap();
    assert!(matches!(a, Enqueued::Inserted(_)), "{a:?}");
    assert_eq!(b, Enqueued::Duplicate);
    assert_eq!((invoices(&db).await, events(&db).await), (2, 1));
}

#[tokio::test]
async fn statements_of_every_shape_are_run() {
    let db = invoices_db().await;
    let outbox = db.outbox_builder().notify(false).build();
    let mut conn = db.pool().acquire().await.unwrap();
    let shapes = [
        // No binds, and a line comment at the end.
        sqlx::query("INSERT INTO invoices (id, amount_cents) VALUES (1, 10) -- the first"),
        // A WITH query of its own.
        sqlx::query(
            "WITH v (id, amount) AS (VALUES ($1::bigint, $2::bigint)) \
             INSERT INTO invoices (id, amount_cents) SELECT id, amount FROM v",
        )
        .bind(2_i64)
        .bind(20_i64),
        // A semicolon at the end.
        sqlx::query("UPDATE invoices SET status = $1 WHERE id = $2;\n")
            .bind("paid")
            .bind(1_i64),
        sqlx::query("DELETE FROM invoices WHERE id = $1").bind(2_i64),
    ];
    for (i, statement) in shapes.into_iter().enumerate() {
        let event = Event::new("Changed", &i).unwrap().without_idempotency_key();
        outbox
            .enqueue_with(&mut conn, statement, event)
            .await
            .unwrap();
    }
    let rows: Vec<(i64, i64, Option<String>)> =
        sqlx::query_as("SELECT id, amount_cents, status FROM invoices ORDER BY id")
            .fetch_all(db.pool())
            .await
            .unwrap();
    assert_eq!(rows, [(1, 10, Some("paid".to_owned()))]);
    assert_eq!(events(&db).await, 4);
}

#[tokio::test]
async fn the_event_is_written_even_when_the_statement_matches_no_row() {
    // Documented: the statement's row count is not looked at.
    let db = invoices_db().await;
    let mut conn = db.pool().acquire().await.unwrap();
    let nothing = sqlx::query("UPDATE invoices SET status = 'paid' WHERE id = $1").bind(404_i64);
    let done = db
        .outbox()
        .enqueue_with(&mut conn, nothing, invoice_created(404))
        .await
        .unwrap();
    assert!(matches!(done, Enqueued::Inserted(_)), "{done:?}");
    assert_eq!(events(&db).await, 1);
}

#[tokio::test]
async fn the_commit_notifies_the_relays() {
    let db = invoices_db().await;
    let mut listener = sqlx::postgres::PgListener::connect_with(db.pool())
        .await
        .unwrap();
    listener.listen("postbox_events").await.unwrap();
    let mut tx = db.pool().begin().await.unwrap();
    let statement = sqlx::query(INSERT_INVOICE).bind(1_i64).bind(1_i64);
    db.outbox()
        .enqueue_with(&mut tx, statement, invoice_created(1))
        .await
        .unwrap();
    // Nothing before the commit.
    let early = tokio::time::timeout(Duration::from_millis(200), listener.recv()).await;
    assert!(early.is_err(), "notified before the commit");
    tx.commit().await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("a notification after the commit")
        .unwrap();
    assert_eq!(got.payload(), "public");
}
