//! The SQL API (`postbox_enqueue`, `postbox_enqueue_many`, migration `0005_sql_enqueue`)
//! agrees with the Rust `Outbox`: the same rows, the same daily key, the same duplicates, the
//! same refusals, the same wake-ups. Each test has a database of its own.

#![allow(
    clippy::unwrap_used,
    reason = "tests fail loudly on the first unexpected error"
)]

use std::time::Duration;

use crate::common::{Running, config, enqueue, events, own_store, pg, publish_marker};
use chrono::{NaiveDate, Utc};
use postbox::StoreExt;
use postbox::ops::StoreOps;
use postbox::{Error, Event, PgStore, Relay, event::Enqueued, schema::TenantId};
use postbox_testkit::{RecordingSink, TestDb};
use sqlx::postgres::{PgConnection, PgDatabaseError, PgListener};
use sqlx::{AssertSqlSafe, Connection};

/// The `bigint` (or NULL) that `sql` selects.
async fn scalar(conn: &mut PgConnection, sql: &str) -> Option<i64> {
    sqlx::query_scalar(AssertSqlSafe(sql.to_owned()))
        .fetch_one(conn)
        .await
        .unwrap()
}

async fn outbox_rows(db: &TestDb) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox_events")
        .fetch_one(db.pool())
        .await
        .unwrap()
}

/// The id sequence's last value (NULL before its first use). Sequences are not transactional:
/// an INSERT that was attempted and then undone would still have moved it.
async fn id_sequence(db: &TestDb) -> Option<i64> {
    sqlx::query_scalar(
        "SELECT pg_sequence_last_value(pg_get_serial_sequence('outbox_events', 'id')::regclass)",
    )
    .fetch_one(db.pool())
    .await
    .unwrap()
}

/// A database error's SQLSTATE, the column (argument) it names, its message and its hint.
#[derive(Debug)]
struct SqlError {
    code: String,
    column: Option<String>,
    message: String,
    hint: Option<String>,
    constraint: Option<String>,
}

fn sql_error(err: sqlx::Error) -> SqlError {
    let sqlx::Error::Database(db) = &err else {
        panic!("expected a database error, got {err}")
    };
    let pg = db.try_downcast_ref::<PgDatabaseError>().unwrap();
    SqlError {
        code: pg.code().to_owned(),
        column: pg.column().map(str::to_owned),
        message: pg.message().to_owned(),
        hint: pg.hint().map(str::to_owned),
        constraint: pg.constraint().map(str::to_owned),
    }
}

/// Runs `SELECT <call>` and returns the id it gave, or the database's error.
async fn call(conn: &mut PgConnection, call: &str) -> Result<Option<i64>, SqlError> {
    sqlx::query_scalar(AssertSqlSafe(format!("SELECT {call}")))
        .fetch_one(conn)
        .await
        .map_err(sql_error)
}

/// Runs `SELECT <call>` for `postbox_enqueue_many`.
async fn call_many(conn: &mut PgConnection, events: &serde_json::Value) -> Vec<Option<i64>> {
    sqlx::query_scalar("SELECT postbox_enqueue_many($1)")
        .bind(events)
        .fetch_one(conn)
        .await
        .unwrap()
}

/// The idempotency key stored with event `id`.
async fn key_of(db: &TestDb, id: i64) -> Option<String> {
    sqlx::query_scalar("SELECT idempotency_key FROM outbox_events WHERE id = $1")
        .bind(id)
        .fetch_one(db.pool())
        .await
        .unwrap()
}

fn invoice_created(id: &str) -> Event {
    Event::new("InvoiceCreated", &serde_json::json!({ "invoice_id": id }))
        .unwrap()
        .aggregate("Invoice", id)
}

/// Counts the notifications on Postbox's channel that arrive within `within`, with payloads.
async fn notifications_during(listener: &mut PgListener, within: Duration) -> Vec<String> {
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + within;
    while let Ok(n) = tokio::time::timeout_at(deadline, listener.recv()).await {
        got.push(n.unwrap().payload().to_owned());
    }
    got
}

async fn listener(db: &TestDb) -> PgListener {
    let mut listener = PgListener::connect_with(db.pool()).await.unwrap();
    listener.listen("postbox_events").await.unwrap();
    listener
}

/// Commits one SQL enqueue of an unkeyed event on `conn`.
async fn commit_one(conn: &mut PgConnection) -> i64 {
    let mut tx = conn.begin().await.unwrap();
    let id = call(
        &mut tx,
        "postbox_enqueue('E', NULL, NULL, '{}', without_idempotency_key => true)",
    )
    .await
    .unwrap()
    .unwrap();
    tx.commit().await.unwrap();
    id
}

// ---- agreement with the Rust Outbox ---------------------------------------------------------

#[tokio::test]
async fn the_default_key_is_the_rust_daily_key_in_utc_whatever_the_session_time_zone() {
    let (db, _store) = pg().await;
    let mut conn = db.pool().acquire().await.unwrap();
    let mut local_dates_differ = false;
    // UTC+14 and UTC-11: at any moment one of them is on another calendar day than UTC.
    for (n, zone) in ["Pacific/Kiritimati", "Pacific/Pago_Pago"]
        .into_iter()
        .enumerate()
    {
        sqlx::query(AssertSqlSafe(format!("SET TIME ZONE '{zone}'")))
            .execute(&mut *conn)
            .await
            .unwrap();
        let aggregate = format!("zone-{n}");
        let before = Utc::now().date_naive();
        let id = sqlx::query_scalar::<_, Option<i64>>(
            "SELECT postbox_enqueue('InvoiceCreated', 'Invoice', $1, '{}')",
        )
        .bind(&aggregate)
        .fetch_one(&mut *conn)
        .await
        .unwrap()
        .unwrap();
        let after = Utc::now().date_naive();
        let local: NaiveDate = sqlx::query_scalar("SELECT now()::date")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        local_dates_differ |= local != before;

        let key = key_of(&db, id).await;
        let rust = |day| invoice_created(&aggregate).resolved_idempotency_key(day);
        assert!(
            key == rust(before) || key == rust(after),
            "{zone}: SQL wrote {key:?}, Rust makes {:?}",
            rust(before)
        );
        // The Rust Outbox, same event, same day: a duplicate of the SQL one.
        let again = db
            .outbox()
            .enqueue(&mut *conn, invoice_created(&aggregate))
            .await
            .unwrap();
        assert_eq!(again, Enqueued::Duplicate, "{zone}");
    }
    assert!(
        local_dates_differ,
        "one of the zones is on another day than UTC, so the keys above prove the date is UTC"
    );
}

#[tokio::test]
async fn a_sql_event_is_the_row_the_rust_outbox_writes() {
    let (db, _store) = pg().await;
    let mut conn = db.pool().acquire().await.unwrap();
    let rust_event = |key: &str| {
        Event::new(
            "InvoiceCreated",
            &serde_json::json!({ "invoice_id": 456, "lines": [1, 2] }),
        )
        .unwrap()
        .aggregate("Invoice", "456")
        .event_class("billing::InvoiceCreated")
        .schema_version(3)
        .max_retries(9)
        .header(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )
        .idempotency_key(key)
    };
    let rust_id = db
        .outbox()
        .enqueue(&mut *conn, rust_event("from-rust"))
        .await
        .unwrap()
        .id()
        .unwrap();
    let sql_id = call(
        &mut conn,
        r#"postbox_enqueue('InvoiceCreated', 'Invoice', '456', '{"invoice_id": 456, "lines": [1, 2]}',
               headers => '{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}',
               idempotency_key => 'from-sql', event_class => 'billing::InvoiceCreated',
               schema_version => 3, max_retries => 9)"#,
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(sql_id, rust_id + 1);

    // Every column but the id, the key and the clocks.
    const COLUMNS: &str = "SELECT to_jsonb(e) - 'id' - 'idempotency_key' - 'created_at' \
                           - 'updated_at' FROM outbox_events e WHERE id = $1";
    let row = |id: i64| {
        sqlx::query_scalar::<_, serde_json::Value>(COLUMNS)
            .bind(id)
            .fetch_one(db.pool())
    };
    let (rust_row, sql_row) = (row(rust_id).await.unwrap(), row(sql_id).await.unwrap());
    assert_eq!(sql_row, rust_row);
    assert_eq!(sql_row["status"], "PENDING");

    // Defaults: the Rust Outbox's max_retries (5), schema version 1, no headers, no class.
    let rust_plain = db
        .outbox()
        .enqueue(&mut *conn, invoice_created("1"))
        .await
        .unwrap()
        .id()
        .unwrap();
    let sql_plain = call(
        &mut conn,
        r#"postbox_enqueue('InvoiceCreated', 'Invoice', '2', '{"invoice_id": "2"}')"#,
    )
    .await
    .unwrap()
    .unwrap();
    let mut rust_row = row(rust_plain).await.unwrap();
    let mut sql_row = row(sql_plain).await.unwrap();
    for r in [&mut rust_row, &mut sql_row] {
        r["aggregate_id"] = "*".into();
        r["payload"] = "*".into();
    }
    assert_eq!(sql_row, rust_row);
}

#[tokio::test]
async fn duplicates_are_recognised_across_sql_and_rust() {
    let (db, _store) = pg().await;
    let outbox = db.outbox();
    let mut conn = db.pool().acquire().await.unwrap();

    // Rust first, then SQL: the daily key.
    outbox
        .enqueue(&mut *conn, invoice_created("1"))
        .await
        .unwrap();
    let dup = call(
        &mut conn,
        "postbox_enqueue('InvoiceCreated', 'Invoice', '1', '{}')",
    )
    .await
    .unwrap();
    assert_eq!(
        dup, None,
        "a duplicate is NULL, as Rust's Enqueued::Duplicate"
    );

    // SQL first, then Rust: the daily key, and a caller's own key.
    call(
        &mut conn,
        "postbox_enqueue('InvoiceCreated', 'Invoice', '2', '{}')",
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(
        outbox
            .enqueue(&mut *conn, invoice_created("2"))
            .await
            .unwrap(),
        Enqueued::Duplicate
    );
    call(
        &mut conn,
        "postbox_enqueue('Ping', NULL, NULL, '{}', idempotency_key => 'ping-1')",
    )
    .await
    .unwrap()
    .unwrap();
    let keyed = Event::new("Ping", &1).unwrap().idempotency_key("ping-1");
    assert_eq!(
        outbox.enqueue(&mut *conn, keyed).await.unwrap(),
        Enqueued::Duplicate
    );
    assert_eq!(
        call(
            &mut conn,
            "postbox_enqueue('Other', 'X', '9', '{}', idempotency_key => 'ping-1')"
        )
        .await
        .unwrap(),
        None,
        "a caller's key is the key, whatever the event"
    );

    // No key: never a duplicate, in either.
    for _ in 0..2 {
        let id = call(
            &mut conn,
            "postbox_enqueue('InvoiceCreated', 'Invoice', '1', '{}', without_idempotency_key => true)",
        )
        .await
        .unwrap();
        assert!(id.is_some());
        let unkeyed = invoice_created("1").without_idempotency_key();
        assert!(matches!(
            outbox.enqueue(&mut *conn, unkeyed).await.unwrap(),
            Enqueued::Inserted(_)
        ));
    }
    // An event without an aggregate has no daily key, in either.
    for _ in 0..2 {
        let id = call(&mut conn, "postbox_enqueue('Ping', NULL, NULL, '{}')")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(key_of(&db, id).await, None);
    }
    assert_eq!(outbox_rows(&db).await, 9);
}

/// One invalid event: the SQL call, and the same event built in Rust where Rust can express it.
struct Invalid {
    sql: String,
    rust: Option<Event>,
    code: &'static str,
    argument: &'static str,
    says: &'static str,
}

fn invalid_cases() -> Vec<Invalid> {
    let long = |c: &str, n: usize| c.repeat(n);
    let case = |sql: String, rust: Option<Event>, code, argument, says| Invalid {
        sql,
        rust,
        code,
        argument,
        says,
    };
    let payload = serde_json::json!({});
    vec![
        case(
            "postbox_enqueue(NULL, 'Invoice', '1', '{}')".into(),
            None,
            "22004",
            "event_type",
            "event_type is NULL",
        ),
        case(
            "postbox_enqueue('', 'Invoice', '1', '{}')".into(),
            Some(Event::new("", &payload).unwrap()),
            "22023",
            "event_type",
            "event_type is empty",
        ),
        // Characters, not bytes: 101 two-byte characters.
        case(
            format!("postbox_enqueue('{}', NULL, NULL, '{{}}')", long("é", 101)),
            Some(Event::new(long("é", 101), &payload).unwrap()),
            "22001",
            "event_type",
            "event_type is 101 characters long; the limit is 100",
        ),
        case(
            format!("postbox_enqueue('E', '{}', '1', '{{}}')", long("a", 101)),
            Some(
                Event::new("E", &payload)
                    .unwrap()
                    .aggregate(long("a", 101), "1"),
            ),
            "22001",
            "aggregate_type",
            "aggregate_type is 101 characters long",
        ),
        case(
            format!("postbox_enqueue('E', 'A', '{}', '{{}}')", long("1", 101)),
            Some(
                Event::new("E", &payload)
                    .unwrap()
                    .aggregate("A", long("1", 101)),
            ),
            "22001",
            "aggregate_id",
            "aggregate_id is 101 characters long",
        ),
        case(
            format!(
                "postbox_enqueue('E', NULL, NULL, '{{}}', event_class => '{}')",
                long("c", 256)
            ),
            Some(
                Event::new("E", &payload)
                    .unwrap()
                    .event_class(long("c", 256)),
            ),
            "22001",
            "event_class",
            "event_class is 256 characters long; the limit is 255",
        ),
        case(
            format!(
                "postbox_enqueue('E', NULL, NULL, '{{}}', idempotency_key => '{}')",
                long("k", 256)
            ),
            Some(
                Event::new("E", &payload)
                    .unwrap()
                    .idempotency_key(long("k", 256)),
            ),
            "22001",
            "idempotency_key",
            "idempotency_key is 256 characters long; the limit is 255",
        ),
        // The daily key of three names that each fit: 100 + 100 + 50 + 3 colons + a date.
        case(
            format!(
                "postbox_enqueue('{}', '{}', '{}', '{{}}')",
                long("e", 50),
                long("a", 100),
                long("1", 100)
            ),
            Some(
                Event::new(long("e", 50), &payload)
                    .unwrap()
                    .aggregate(long("a", 100), long("1", 100)),
            ),
            "22001",
            "idempotency_key",
            "idempotency_key is 263 characters long; the limit is 255",
        ),
        case(
            "postbox_enqueue('E', NULL, NULL, NULL)".into(),
            None,
            "22004",
            "payload",
            "payload is NULL",
        ),
        // One byte over the default limit of both: 1 MiB of JSON text.
        case(
            format!(
                "postbox_enqueue('E', NULL, NULL, to_jsonb(repeat('x', {})))",
                1024 * 1024 - 1
            ),
            Some(Event::new("E", &"x".repeat(1024 * 1024 - 1)).unwrap()),
            "54000",
            "payload",
            "payload is 1048577 bytes; the limit is 1048576 bytes",
        ),
        case(
            "postbox_enqueue('E', NULL, NULL, '{}', max_retries => -1)".into(),
            Some(Event::new("E", &payload).unwrap().max_retries(-1)),
            "22023",
            "max_retries",
            "max_retries is -1; it must be 0 or more",
        ),
        case(
            "postbox_enqueue('E', NULL, NULL, '{}', headers => '[\"traceparent\"]')".into(),
            None,
            "22023",
            "headers",
            "headers is a JSON array; it must be an object",
        ),
        case(
            "postbox_enqueue('E', NULL, NULL, '{}', headers => '{\"attempt\": 1}')".into(),
            None,
            "22023",
            "headers",
            "headers value of \"attempt\" is a JSON number; header values are strings",
        ),
        case(
            "postbox_enqueue('E', 'A', '1', '{}', idempotency_key => 'k', \
             without_idempotency_key => true)"
                .into(),
            None,
            "22023",
            "without_idempotency_key",
            "idempotency_key and without_idempotency_key are both given",
        ),
    ]
}

#[tokio::test]
async fn invalid_arguments_are_refused_naming_the_argument_and_nothing_is_written() {
    let (db, _store) = pg().await;
    sqlx::query("CREATE TABLE invoices (id BIGINT PRIMARY KEY)")
        .execute(db.pool())
        .await
        .unwrap();
    let sequence = id_sequence(&db).await;
    for case in invalid_cases() {
        let mut tx = db.pool().begin().await.unwrap();
        sqlx::query("INSERT INTO invoices VALUES (1)")
            .execute(&mut *tx)
            .await
            .unwrap();
        let err = call(&mut tx, &case.sql).await.unwrap_err();
        assert_eq!(err.code, case.code, "{}: {err:?}", case.sql);
        assert_eq!(err.column.as_deref(), Some(case.argument), "{err:?}");
        assert!(
            err.message.starts_with("invalid event: ") && err.message.contains(case.says),
            "{err:?} should say {:?}",
            case.says
        );
        assert!(err.hint.is_some(), "{err:?} has a hint");
        tx.rollback().await.unwrap();

        // The Rust Outbox refuses the same event, naming the same field.
        if let Some(event) = case.rust {
            let mut conn = db.pool().acquire().await.unwrap();
            let err = db.outbox().enqueue(&mut *conn, event).await.unwrap_err();
            assert!(
                matches!(&err, Error::InvalidEvent { field, .. } if *field == case.argument),
                "Rust: {err}"
            );
            assert!(err.to_string().contains(case.says), "Rust: {err}");
        }
    }
    assert_eq!(outbox_rows(&db).await, 0);
    assert_eq!(
        id_sequence(&db).await,
        sequence,
        "no insert was even attempted: validation comes first"
    );
    let invoices: i64 = sqlx::query_scalar("SELECT count(*) FROM invoices")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(invoices, 0);

    // At the limits, both accept.
    let mut conn = db.pool().acquire().await.unwrap();
    for sql in [
        format!("postbox_enqueue('{}', NULL, NULL, '{{}}')", "é".repeat(100)),
        format!(
            "postbox_enqueue('E', NULL, NULL, to_jsonb(repeat('x', {})))",
            1024 * 1024 - 2
        ),
        "postbox_enqueue('E', NULL, NULL, '{}', max_retries => 0, headers => NULL)".into(),
    ] {
        assert!(call(&mut conn, &sql).await.unwrap().is_some(), "{sql}");
    }
    let at_limit = Event::new("E", &"x".repeat(1024 * 1024 - 2)).unwrap();
    db.outbox().enqueue(&mut *conn, at_limit).await.unwrap();
}

#[tokio::test]
async fn nul_characters_are_refused_by_postgresql_before_the_function_runs() {
    let (db, _store) = pg().await;
    let mut conn = db.pool().acquire().await.unwrap();
    // A NUL in a text argument: the server refuses the value itself (invalid byte sequence).
    let err = sqlx::query("SELECT postbox_enqueue($1, NULL, NULL, '{}')")
        .bind("Invoice\0Created")
        .fetch_one(&mut *conn)
        .await
        .map_err(sql_error)
        .unwrap_err();
    assert_eq!(err.code, "22021", "{err:?}");
    // \u0000 in JSON: jsonb cannot hold it.
    let err = call(
        &mut conn,
        r#"postbox_enqueue('E', NULL, NULL, '{"note": "a\u0000b"}')"#,
    )
    .await
    .unwrap_err();
    assert_eq!(err.code, "22P05", "{err:?}");
    let err = sqlx::query("SELECT postbox_enqueue_many($1::jsonb)")
        .bind(r#"[{"event_type": "E", "payload": "\u0000"}]"#)
        .fetch_one(&mut *conn)
        .await
        .map_err(sql_error)
        .unwrap_err();
    assert_eq!(err.code, "22P05", "{err:?}");
    assert_eq!(outbox_rows(&db).await, 0);
    assert_eq!(id_sequence(&db).await, None);
}

#[tokio::test]
async fn the_payload_limit_is_the_setting_postbox_payload_limit() {
    let (db, _store) = pg().await;
    let mut conn = db.pool().acquire().await.unwrap();
    let payload_of = |bytes: usize| {
        // A JSON string: its quotes and `bytes - 2` characters.
        format!(
            "postbox_enqueue('E', NULL, NULL, to_jsonb(repeat('x', {})))",
            bytes - 2
        )
    };
    for (setting, limit) in [
        ("1KiB", 1024),
        ("1 kb", 1000),
        ("64", 64),
        ("2MiB", 2 * 1024 * 1024),
        ("1MB", 1_000_000),
    ] {
        sqlx::query("SELECT set_config('postbox.payload_limit', $1, false)")
            .bind(setting)
            .execute(&mut *conn)
            .await
            .unwrap();
        assert!(
            call(&mut conn, &payload_of(limit)).await.unwrap().is_some(),
            "{setting}: {limit} bytes are accepted"
        );
        let err = call(&mut conn, &payload_of(limit + 1)).await.unwrap_err();
        assert_eq!(
            (err.code.as_str(), err.column.as_deref()),
            ("54000", Some("payload"))
        );
        assert!(
            err.message.contains(&format!("the limit is {limit} bytes")),
            "{err:?}"
        );
        assert!(err.hint.unwrap().contains("postbox.payload_limit"));
    }
    // The same limit for a whole batch; the error names the event.
    sqlx::query("SET postbox.payload_limit = '16'")
        .execute(&mut *conn)
        .await
        .unwrap();
    let err = sqlx::query("SELECT postbox_enqueue_many($1)")
        .bind(serde_json::json!([
            {"event_type": "E", "payload": "small"},
            {"event_type": "E", "payload": "far too large for sixteen bytes"},
        ]))
        .fetch_one(&mut *conn)
        .await
        .map_err(sql_error)
        .unwrap_err();
    assert!(
        err.message
            .starts_with("invalid event events[1]: payload is 33 bytes; the limit is 16 bytes"),
        "{err:?}"
    );

    // A setting that is not a size is an error naming the setting, not a silent default.
    sqlx::query("SET postbox.payload_limit = 'plenty'")
        .execute(&mut *conn)
        .await
        .unwrap();
    let err = call(&mut conn, "postbox_enqueue('E', NULL, NULL, '1')")
        .await
        .unwrap_err();
    assert_eq!(err.code, "22023");
    assert!(
        err.message.contains("postbox.payload_limit") && err.message.contains("'plenty'"),
        "{err:?}"
    );
    // Unset again: the default, 1 MiB.
    sqlx::query("RESET postbox.payload_limit")
        .execute(&mut *conn)
        .await
        .unwrap();
    assert!(
        call(&mut conn, &payload_of(1024 * 1024))
            .await
            .unwrap()
            .is_some()
    );
    assert!(call(&mut conn, &payload_of(1024 * 1024 + 1)).await.is_err());
}

// ---- tenants, transactions, notifications ---------------------------------------------------

#[tokio::test]
async fn each_tenant_schema_gets_its_own_function_writing_to_its_own_table() {
    let (db, store) = pg().await;
    store
        .tenant_add(&postbox::store::TenantAddParams {
            id: &TenantId::new("acme").unwrap(),
            schema: None,
        })
        .await
        .unwrap();
    let applied: Vec<String> =
        sqlx::query_scalar("SELECT name FROM s_acme.postbox_schema_history ORDER BY name")
            .fetch_all(db.pool())
            .await
            .unwrap();
    assert!(
        applied.iter().any(|n| n == "0005_sql_enqueue"),
        "{applied:?}"
    );

    let mut listener = listener(&db).await;
    let mut conn = db.pool().acquire().await.unwrap();
    let id = call(
        &mut conn,
        "s_acme.postbox_enqueue('InvoiceCreated', 'Invoice', '7', '{\"invoice_id\": 7}')",
    )
    .await
    .unwrap()
    .unwrap();
    let ids = call_many(
        &mut conn,
        &serde_json::json!([{"event_type": "Second", "payload": {}}]),
    )
    .await;
    assert!(ids[0].is_some());
    assert_eq!(
        outbox_rows(&db).await,
        1,
        "the default schema got the batch only"
    );
    let tenant_rows: i64 = sqlx::query_scalar("SELECT count(*) FROM s_acme.outbox_events")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(tenant_rows, 1);
    assert_eq!(
        notifications_during(&mut listener, Duration::from_millis(300)).await,
        ["s_acme", "public"],
        "each function wakes the relays for its own schema"
    );

    // The tenant's key space is its own: the same event is new in the default schema.
    assert!(
        call(
            &mut conn,
            "postbox_enqueue('InvoiceCreated', 'Invoice', '7', '{\"invoice_id\": 7}')"
        )
        .await
        .unwrap()
        .is_some()
    );
    // A relay publishes it as the tenant's.
    let sink = RecordingSink::new();
    Relay::new(store, sink.clone(), config())
        .unwrap()
        .drain(std::future::pending())
        .await
        .unwrap();
    let published = sink.published();
    let ours = published.iter().find(|e| e.tenant.is_some()).unwrap();
    assert_eq!((ours.id, ours.tenant.as_deref()), (id, Some("acme")));
    assert_eq!(published.len(), 3);
}

#[tokio::test]
async fn a_rollback_writes_nothing_and_sends_nothing() {
    let (db, _store) = pg().await;
    sqlx::query("CREATE TABLE invoices (id BIGINT PRIMARY KEY)")
        .execute(db.pool())
        .await
        .unwrap();
    let mut listener = listener(&db).await;
    let mut conn = db.pool().acquire().await.unwrap();

    let mut tx = conn.begin().await.unwrap();
    sqlx::query("INSERT INTO invoices VALUES (1)")
        .execute(&mut *tx)
        .await
        .unwrap();
    let id = call(
        &mut tx,
        "postbox_enqueue('InvoiceCreated', 'Invoice', '1', '{}')",
    )
    .await
    .unwrap();
    assert!(id.is_some(), "inside the transaction the event exists");
    let many = call_many(
        &mut tx,
        &serde_json::json!([{"event_type": "A", "payload": 1}, {"event_type": "B", "payload": 2}]),
    )
    .await;
    assert!(many.iter().all(Option::is_some));
    tx.rollback().await.unwrap();
    assert_eq!(outbox_rows(&db).await, 0);
    assert!(
        notifications_during(&mut listener, Duration::from_millis(300))
            .await
            .is_empty()
    );

    // A savepoint rolled back takes its event with it; the rest of the transaction commits.
    let mut tx = conn.begin().await.unwrap();
    let mut inner = tx.begin().await.unwrap();
    call(&mut inner, "postbox_enqueue('Ghost', NULL, NULL, '{}')")
        .await
        .unwrap();
    inner.rollback().await.unwrap();
    call(&mut tx, "postbox_enqueue('Kept', NULL, NULL, '{}')")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let types: Vec<String> = sqlx::query_scalar("SELECT event_type FROM outbox_events")
        .fetch_all(db.pool())
        .await
        .unwrap();
    assert_eq!(types, ["Kept"]);
    // The same key can be used again: the rolled-back event never existed.
    assert!(
        call(
            &mut conn,
            "postbox_enqueue('InvoiceCreated', 'Invoice', '1', '{}')"
        )
        .await
        .unwrap()
        .is_some()
    );
}

#[tokio::test]
async fn notifications_are_debounced_per_session_and_delivered_only_on_commit() {
    let (db, _store) = pg().await;
    let mut listener = listener(&db).await;
    let mut a = db.pool().acquire().await.unwrap();
    let mut b = db.pool().acquire().await.unwrap();
    for conn in [&mut a, &mut b] {
        sqlx::query("SET postbox.notify_interval = '60s'")
            .execute(&mut **conn)
            .await
            .unwrap();
    }

    // Delivered on commit, not before.
    let mut tx = a.begin().await.unwrap();
    call(&mut tx, "postbox_enqueue('E', NULL, NULL, '{}')")
        .await
        .unwrap();
    assert!(
        notifications_during(&mut listener, Duration::from_millis(200))
            .await
            .is_empty(),
        "nothing is delivered while the transaction is open"
    );
    tx.commit().await.unwrap();
    assert_eq!(
        notifications_during(&mut listener, Duration::from_millis(300)).await,
        ["public"]
    );

    // Within the interval a session stays quiet; another session has a turn of its own.
    for _ in 0..5 {
        commit_one(&mut a).await;
    }
    commit_one(&mut b).await;
    commit_one(&mut b).await;
    assert_eq!(
        notifications_during(&mut listener, Duration::from_millis(300)).await,
        ["public"],
        "session a had used its turn; session b notified once for two commits"
    );

    // Interval zero: every call notifies.
    sqlx::query("SET postbox.notify_interval = '0'")
        .execute(&mut *a)
        .await
        .unwrap();
    for _ in 0..3 {
        commit_one(&mut a).await;
    }
    assert_eq!(
        notifications_during(&mut listener, Duration::from_millis(300))
            .await
            .len(),
        3
    );

    // The default, 50 ms: commits further apart than that each notify.
    let mut c = db.pool().acquire().await.unwrap();
    for _ in 0..3 {
        commit_one(&mut c).await;
        // The subject: commits further apart than the 50 ms notify interval.
        tokio::time::sleep(Duration::from_millis(80)).await;
    }
    assert_eq!(
        notifications_during(&mut listener, Duration::from_millis(300))
            .await
            .len(),
        3
    );

    // An invalid interval is an error naming the setting.
    sqlx::query("SET postbox.notify_interval = 'soon'")
        .execute(&mut *c)
        .await
        .unwrap();
    let err = call(&mut c, "postbox_enqueue('E', NULL, NULL, '{}')")
        .await
        .unwrap_err();
    assert!(err.message.contains("postbox.notify_interval"), "{err:?}");
}

#[tokio::test]
async fn a_rolled_back_notification_does_not_use_the_sessions_turn() {
    let (db, _store) = pg().await;
    let mut listener = listener(&db).await;
    let mut conn = db.pool().acquire().await.unwrap();
    sqlx::query("SET postbox.notify_interval = '60s'")
        .execute(&mut *conn)
        .await
        .unwrap();
    let mut tx = conn.begin().await.unwrap();
    call(&mut tx, "postbox_enqueue('E', NULL, NULL, '{}')")
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    // Had the turn been used, this commit would send nothing and wait for the relays' poll.
    commit_one(&mut conn).await;
    assert_eq!(
        notifications_during(&mut listener, Duration::from_millis(300)).await,
        ["public"]
    );
}

#[tokio::test]
async fn a_session_whose_turn_it_is_notifies_even_for_a_duplicate() {
    let (db, _store) = pg().await;
    let mut conn = db.pool().acquire().await.unwrap();
    call(
        &mut conn,
        "postbox_enqueue('E', NULL, NULL, '{}', idempotency_key => 'k')",
    )
    .await
    .unwrap()
    .unwrap();
    let mut listener = listener(&db).await;
    let mut other = db.pool().acquire().await.unwrap();
    let dup = call(
        &mut other,
        "postbox_enqueue('E', NULL, NULL, '{}', idempotency_key => 'k')",
    )
    .await
    .unwrap();
    assert_eq!(dup, None);
    assert_eq!(
        notifications_during(&mut listener, Duration::from_millis(300)).await,
        ["public"],
        "as the Rust Outbox: the events this session enqueues next must not wait for the poll"
    );
}

#[tokio::test]
async fn an_id_collision_is_an_error_not_a_duplicate() {
    let (db, _store) = pg().await;
    enqueue(&db, &db.outbox(), events("Existing", 3)).await;
    sqlx::query("ALTER TABLE outbox_events ALTER COLUMN id RESTART WITH 1")
        .execute(db.pool())
        .await
        .unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    for sql in [
        "postbox_enqueue('New', 'Invoice', '1', '{}')",
        "postbox_enqueue('New', NULL, NULL, '{}', without_idempotency_key => true)",
        r#"postbox_enqueue_many('[{"event_type": "New", "payload": {}}]')"#,
    ] {
        let result = sqlx::query(AssertSqlSafe(format!("SELECT {sql}")))
            .fetch_one(&mut *conn)
            .await
            .map_err(sql_error);
        let err = result.expect_err("an id that is taken must fail, never pass for a duplicate");
        assert_eq!(err.code, "23505", "{sql}: {err:?}");
        assert_eq!(err.constraint.as_deref(), Some("outbox_events_pkey"));
    }
    assert_eq!(outbox_rows(&db).await, 3);
}

// ---- postbox_enqueue_many -------------------------------------------------------------------

#[tokio::test]
async fn enqueue_many_returns_ids_in_input_order_with_null_for_duplicates() {
    let (db, _store) = pg().await;
    let mut conn = db.pool().acquire().await.unwrap();
    db.outbox()
        .enqueue(&mut *conn, invoice_created("1"))
        .await
        .unwrap();
    let batch = serde_json::json!([
        {"event_type": "InvoiceCreated", "aggregate_type": "Invoice", "aggregate_id": "2",
         "payload": {"invoice_id": "2"}},
        // A duplicate of the Rust event's daily key.
        {"event_type": "InvoiceCreated", "aggregate_type": "Invoice", "aggregate_id": "1",
         "payload": {"invoice_id": "1"}},
        {"event_type": "Ping", "payload": null, "idempotency_key": "p"},
        // A duplicate of an earlier event of the same batch.
        {"event_type": "Pong", "payload": 2, "idempotency_key": "p"},
        {"event_type": "InvoiceCreated", "aggregate_type": "Invoice", "aggregate_id": "1",
         "payload": {}, "without_idempotency_key": true, "headers": {"traceparent": "t"},
         "event_class": "billing::InvoiceCreated", "schema_version": 2, "max_retries": 0},
        {"event_type": "Last", "payload": [], "headers": null, "max_retries": null},
    ]);
    let ids = call_many(&mut conn, &batch).await;
    assert_eq!(ids.len(), 6);
    assert_eq!(
        ids.iter().map(Option::is_some).collect::<Vec<_>>(),
        [true, false, true, false, true, true]
    );
    let inserted: Vec<i64> = ids.iter().flatten().copied().collect();
    assert!(inserted.windows(2).all(|w| w[0] < w[1]), "{ids:?}");

    // Each id is its own event's.
    let rows: Vec<(i64, String, Option<String>, serde_json::Value, i32, i32)> = sqlx::query_as(
        "SELECT id, event_type, idempotency_key, headers, schema_version, max_retries \
         FROM outbox_events WHERE id = ANY($1) ORDER BY id",
    )
    .bind(&inserted)
    .fetch_all(db.pool())
    .await
    .unwrap();
    let types: Vec<&str> = rows.iter().map(|r| r.1.as_str()).collect();
    assert_eq!(types, ["InvoiceCreated", "Ping", "InvoiceCreated", "Last"]);
    let rust_key = invoice_created("2").resolved_idempotency_key(Utc::now().date_naive());
    assert_eq!(rows[0].2, rust_key);
    assert_eq!(rows[1].2.as_deref(), Some("p"));
    assert_eq!(
        (&rows[2].2, &rows[2].3, rows[2].4, rows[2].5),
        (&None, &serde_json::json!({"traceparent": "t"}), 2, 0)
    );
    assert_eq!(
        (&rows[3].3, rows[3].4, rows[3].5),
        (&serde_json::json!({}), 1, 5)
    );

    // The Rust Outbox's enqueue_many agrees on the same two duplicates.
    let rust = db
        .outbox()
        .enqueue_many(
            &mut *conn,
            [
                invoice_created("2"),
                Event::new("Ping", &1).unwrap().idempotency_key("p"),
                invoice_created("3"),
            ],
        )
        .await
        .unwrap();
    assert_eq!(
        rust.iter().map(|e| e.id().is_some()).collect::<Vec<_>>(),
        [false, false, true]
    );
    assert_eq!(call_many(&mut conn, &serde_json::json!([])).await, []);
}

#[tokio::test]
async fn enqueue_many_validates_every_event_before_writing_any() {
    let (db, _store) = pg().await;
    let mut conn = db.pool().acquire().await.unwrap();
    let good = serde_json::json!({"event_type": "E", "payload": {}});
    let cases = [
        (
            serde_json::json!([good, good, {"event_type": "", "payload": {}}]),
            "invalid event events[2]: event_type is empty",
            "event_type",
        ),
        (
            serde_json::json!([good, {"event_type": "E", "aggregate_type": "A",
                                      "aggregate_id": 456, "payload": {}}]),
            "invalid event events[1]: aggregate_id is a JSON number 456; it must be a JSON string",
            "aggregate_id",
        ),
        (
            serde_json::json!([good, {"event_type": "E", "payload": {}, "idempotencyKey": "k"}]),
            "invalid event events[1]: unknown field \"idempotencyKey\"",
            "idempotencyKey",
        ),
        (
            serde_json::json!([good, {"event_type": "E", "payload": {}, "max_retries": -1}]),
            "invalid event events[1]: max_retries is -1; it must be 0 or more",
            "max_retries",
        ),
        (
            serde_json::json!([good, {"event_type": "E"}]),
            "invalid event events[1]: payload is NULL",
            "payload",
        ),
        (
            serde_json::json!([good, "E"]),
            "invalid event events[1]: the event is a JSON string; it must be an object",
            "events",
        ),
        (
            serde_json::json!({"event_type": "E", "payload": {}}),
            "invalid events: events is a JSON object",
            "events",
        ),
    ];
    for (batch, says, argument) in cases {
        let err = sqlx::query("SELECT postbox_enqueue_many($1)")
            .bind(&batch)
            .fetch_one(&mut *conn)
            .await
            .map_err(sql_error)
            .unwrap_err();
        assert!(err.message.starts_with(says), "{err:?} should say {says:?}");
        assert_eq!(err.column.as_deref(), Some(argument), "{err:?}");
        assert!(err.code == "22023" || err.code == "22004", "{err:?}");
    }
    assert_eq!(outbox_rows(&db).await, 0);
    assert_eq!(
        id_sequence(&db).await,
        None,
        "the events before the invalid one were never inserted, not merely rolled back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_sql_event_is_never_published_while_a_relay_runs() {
    let (db, _store) = pg().await;
    let store: PgStore = own_store(&db, 3).await;
    let sink = RecordingSink::new();
    let relay = Running::start(Relay::new(store, sink.clone(), config()).unwrap());
    let outbox = db.outbox();
    let mut ghost_tx = db.pool().begin().await.unwrap();
    let ghost = call(&mut ghost_tx, "postbox_enqueue('Ghost', NULL, NULL, '{}')")
        .await
        .unwrap()
        .unwrap();
    // The relay keeps claiming meanwhile: a marker committed after the ghost gets through.
    publish_marker(&db, &outbox, &sink, "Marker").await;
    ghost_tx.rollback().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    let committed = call(&mut conn, "postbox_enqueue('Committed', NULL, NULL, '{}')")
        .await
        .unwrap()
        .unwrap();
    publish_marker(&db, &outbox, &sink, "AfterRollback").await;
    relay.stop().await;
    let published = sink.published_ids();
    assert!(!published.contains(&ghost));
    assert!(published.contains(&committed));
    assert_eq!(
        scalar(&mut conn, "SELECT count(*) FROM outbox_events").await,
        Some(3)
    );
}

/// `postbox_inbox_receive` answers as the Rust `Inbox` does (they share the records), and
/// refuses a consumer name or message id that is NULL, empty or too long with SQLSTATE 22023
/// and a hint, writing nothing.
#[tokio::test]
async fn the_sql_inbox_answers_as_the_rust_inbox_and_refuses_bad_ids_by_name() {
    let (db, store) = pg().await;
    let mut conn = db.pool().acquire().await.unwrap();
    let receive = |consumer: Option<String>, id: Option<String>| {
        sqlx::query_scalar::<_, bool>("SELECT postbox_inbox_receive($1, $2)")
            .bind(consumer)
            .bind(id)
    };
    let some = |s: &str| Some(s.to_owned());
    assert!(
        receive(some("billing"), some("m-1"))
            .fetch_one(&mut *conn)
            .await
            .unwrap()
    );
    assert!(
        !receive(some("billing"), some("m-1"))
            .fetch_one(&mut *conn)
            .await
            .unwrap()
    );
    // Named arguments, as the docs call it.
    let named: bool = sqlx::query_scalar(
        "SELECT postbox_inbox_receive(consumer => 'shipping', message_id => 'm-1')",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    assert!(named);
    // The Rust inbox reads the same records.
    let mut tx = db.pool().begin().await.unwrap();
    let billing = store.inbox("billing").unwrap();
    assert_eq!(
        billing.receive(&mut tx, "m-1").await.unwrap(),
        postbox::inbox::Received::Duplicate
    );
    tx.commit().await.unwrap();

    let cases = [
        (None, some("m"), "consumer"),
        (some(""), some("m"), "consumer"),
        (Some("c".repeat(101)), some("m"), "consumer"),
        (some("billing"), None, "message_id"),
        (some("billing"), some(""), "message_id"),
        (some("billing"), Some("x".repeat(256)), "message_id"),
    ];
    for (consumer, id, named) in cases {
        let err = sql_error(
            receive(consumer, id)
                .fetch_one(&mut *conn)
                .await
                .unwrap_err(),
        );
        assert_eq!(err.code, "22023", "{err:?}");
        assert!(err.message.contains(named), "{err:?}");
        assert!(err.hint.is_some(), "{err:?}");
    }
    // The longest name and id fit, in characters.
    assert!(
        receive(Some("é".repeat(100)), Some("ü".repeat(255)))
            .fetch_one(&mut *conn)
            .await
            .unwrap()
    );
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM inbox_messages")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(rows, 3, "the refused calls wrote nothing");
}
