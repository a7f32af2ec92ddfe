//! Retention on PostgreSQL: relays archive and purge while they publish, one table at a time;
//! purging drops whole weeks of the partitioned archive.

#![allow(
    clippy::unwrap_used,
    reason = "tests fail loudly on the first unexpected error"
)]

use std::time::Duration;

use crate::common::{Running, config, count, default_target, pg};
use postbox::Relay;
use postbox::store::{PurgeKind, PurgeParams, purge_all};
use postbox_testkit::{RecordingSink, TestDb, wait_until};

async fn sql(db: &TestDb, sql: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(db.pool())
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

async fn scalar(db: &TestDb, sql: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_one(db.pool())
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// `n` events inserted by plain SQL, `PROCESSED` and created 40 days ago.
async fn month_old_history(db: &TestDb, n: i64) {
    sql(
        db,
        &format!(
            "INSERT INTO outbox_events (event_type, aggregate_type, aggregate_id, payload, status,
                                        processed_at, created_at, idempotency_key)
             SELECT 'Old', 'Order', g::text, jsonb_build_object('n', g), 'PROCESSED',
                    now() - interval '39 days', now() - interval '40 days', 'old-' || g
             FROM generate_series(1, {n}) AS g"
        ),
    )
    .await;
}

/// Two relays with retention on archive the month-old history in batches while they publish new
/// events; archived events of 100 days ago are purged; FAILED events are left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_archive_and_purge_while_they_publish() {
    let (db, store) = pg().await;
    month_old_history(&db, 5_000).await;
    sql(
        &db,
        "UPDATE outbox_events SET status = 'FAILED', last_error = 'boom' WHERE id <= 10;
         INSERT INTO outbox_events_archive (id, event_type, payload, status, archived_at)
         SELECT 1000000 + g, 'Ancient', '{}', 'PROCESSED', now() - interval '100 days'
         FROM generate_series(1, 300) AS g;
         INSERT INTO inbox_messages (consumer, message_id, received_at)
         SELECT 'billing', 'm-' || g, now() - interval '8 days' - g * interval '1 second'
         FROM generate_series(1, 1500) AS g;
         INSERT INTO inbox_messages (consumer, message_id) VALUES ('billing', 'fresh');",
    )
    .await;
    let fresh =
        crate::common::enqueue(&db, &db.outbox(), crate::common::events("New", 2_000)).await;
    let store = std::sync::Arc::new(store);
    let sink = RecordingSink::new();
    let relay = |id: &str| {
        Relay::from_parts(
            store.clone(),
            std::sync::Arc::new(sink.clone()),
            config().relay_id(id),
        )
        .unwrap()
    };
    let (a, b) = (Running::start(relay("a")), Running::start(relay("b")));
    wait_until(
        "the history is archived",
        Duration::from_secs(30),
        || async {
            scalar(
                &db,
                "SELECT count(*) FROM outbox_events WHERE event_type = 'Old'",
            )
            .await
                == 10
        },
    )
    .await;
    wait_until(
        "the new events are published",
        Duration::from_secs(30),
        || async { count(&db, "PROCESSED").await == fresh.len() as i64 },
    )
    .await;
    wait_until(
        "the ancient archive is purged",
        Duration::from_secs(30),
        || async {
            scalar(
                &db,
                "SELECT count(*) FROM outbox_events_archive WHERE event_type = 'Ancient'",
            )
            .await
                == 0
        },
    )
    .await;
    // The inbox's records past its dedup window (7 days by default) go in the same runs.
    wait_until(
        "the inbox's old records are purged",
        Duration::from_secs(30),
        || async { scalar(&db, "SELECT count(*) FROM inbox_messages").await == 1 },
    )
    .await;
    a.stop().await;
    b.stop().await;
    assert_eq!(
        scalar(
            &db,
            "SELECT count(*) FROM inbox_messages WHERE message_id = 'fresh'"
        )
        .await,
        1
    );
    assert_eq!(
        scalar(
            &db,
            "SELECT count(*) FROM outbox_events_archive WHERE event_type = 'Old'"
        )
        .await,
        4_990
    );
    assert_eq!(count(&db, "FAILED").await, 10, "FAILED events stay");
    // The new events were created now: they stay in the table, PROCESSED.
    assert_eq!(
        scalar(
            &db,
            "SELECT count(*) FROM outbox_events WHERE event_type = 'New'"
        )
        .await,
        2_000
    );
    // Archived rows keep every column.
    assert_eq!(
        scalar(
            &db,
            "SELECT count(*) FROM outbox_events_archive
             WHERE event_type = 'Old' AND idempotency_key = 'old-' || aggregate_id
               AND payload ->> 'n' = aggregate_id AND processed_at IS NOT NULL"
        )
        .await,
        4_990
    );
}

/// Purging a week that is wholly past the cutoff drops its partition; the week the cutoff falls
/// in loses only its older rows; a dry run counts both and touches nothing.
#[tokio::test]
async fn purging_drops_whole_weeks_of_the_archive() {
    let (db, store) = pg().await;
    sql(
        &db,
        "SELECT postbox_archive_partition(now() - interval '100 days');
         INSERT INTO outbox_events_archive (id, event_type, payload, status, archived_at)
         SELECT g, 'Old', '{}', 'PROCESSED', now() - interval '100 days'
         FROM generate_series(1, 1000) AS g;
         INSERT INTO outbox_events_archive (id, event_type, payload, status, archived_at)
         SELECT 5000 + g, 'Recent', '{}', 'PROCESSED', now() - interval '1 hour'
         FROM generate_series(1, 10) AS g;",
    )
    .await;
    let week = |days: i64| {
        (chrono::Utc::now() - chrono::Duration::days(days))
            .date_naive()
            .week(chrono::Weekday::Mon)
            .first_day()
            .format("outbox_events_archive_p%Y%m%d")
            .to_string()
    };
    let old_week = week(100);
    let exists = |name: String| {
        let db = &db;
        async move {
            scalar(
                db,
                &format!("SELECT count(*) FROM pg_class WHERE relname = '{name}'"),
            )
            .await
                == 1
        }
    };
    assert!(
        exists(old_week.clone()).await,
        "the week of the old rows has its partition"
    );
    let target = default_target();
    let purge = |older_than_days: u64, dry_run: bool| PurgeParams {
        target: &target,
        kind: PurgeKind::Archive,
        older_than: Duration::from_secs(older_than_days * 86_400),
        batch_size: 100,
        dry_run,
        lock_wait: None,
    };
    let dry = purge_all(&store, purge(90, true), true, |_| {})
        .await
        .unwrap();
    assert_eq!(dry, Some(1_000));
    assert!(exists(old_week.clone()).await, "a dry run drops nothing");
    let gone = purge_all(&store, purge(90, false), true, |_| {})
        .await
        .unwrap();
    assert_eq!(gone, Some(1_000));
    assert!(!exists(old_week).await, "the old week was dropped");
    assert_eq!(
        scalar(&db, "SELECT count(*) FROM outbox_events_archive").await,
        10
    );

    // The current week: only its rows past the cutoff go, by rows.
    sql(
        &db,
        "UPDATE outbox_events_archive SET archived_at = now() - interval '30 minutes' WHERE id <= 5003",
    )
    .await;
    let gone = purge_all(
        &store,
        PurgeParams {
            older_than: Duration::from_secs(45 * 60),
            ..purge(0, false)
        },
        true,
        |_| {},
    )
    .await
    .unwrap();
    assert_eq!(gone, Some(7));
    assert_eq!(
        scalar(&db, "SELECT count(*) FROM outbox_events_archive").await,
        3
    );
}

/// An outbox migrated before the archive was partitioned keeps its archived events: the upgrade
/// moves each into the partition of its week.
#[tokio::test]
async fn upgrading_moves_an_existing_archive_into_weekly_partitions() {
    let db = TestDb::new().await;
    let before = [
        include_str!("../../sql/postgres/migrations/0001_outbox_events.sql"),
        include_str!("../../sql/postgres/migrations/0002_claim_function.sql"),
        include_str!("../../sql/postgres/migrations/0003_no_auto_analyze.sql"),
        include_str!("../../sql/postgres/migrations/0004_bounded_reads.sql"),
        include_str!("../../sql/postgres/migrations/0005_sql_enqueue.sql"),
    ];
    sql(&db, "CREATE SCHEMA old_outbox").await;
    for migration in before {
        sql(&db, &migration.replace("{schema}", "\"old_outbox\"")).await;
    }
    sql(
        &db,
        "INSERT INTO old_outbox.outbox_events_archive (id, event_type, payload, status, archived_at,
                                                       idempotency_key)
         SELECT g, 'Old', jsonb_build_object('n', g), 'PROCESSED',
                now() - g * interval '1 day', 'key-' || g
         FROM generate_series(1, 30) AS g",
    )
    .await;
    sql(
        &db,
        &include_str!("../../sql/postgres/migrations/0006_retention.sql")
            .replace("{schema}", "\"old_outbox\""),
    )
    .await;
    assert_eq!(
        scalar(
            &db,
            "SELECT count(*) FROM old_outbox.outbox_events_archive
             WHERE idempotency_key = 'key-' || id AND payload ->> 'n' = id::text"
        )
        .await,
        30
    );
    assert_eq!(
        scalar(
            &db,
            "SELECT count(*) FROM old_outbox.outbox_events_archive_default"
        )
        .await,
        0,
        "every row is in the partition of its week"
    );
    assert!(
        scalar(
            &db,
            "SELECT count(*) FROM pg_inherits
             WHERE inhparent = 'old_outbox.outbox_events_archive'::regclass"
        )
        .await
            >= 5
    );
}

/// A run that lost the retention lock between two batches — to another relay's purge batch,
/// say, which does not archive — waits for it and finishes, instead of leaving the rest of the
/// history for the next run a minute later (two relays starting together did that).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_loses_the_lock_midway_finishes_the_work() {
    let (db, store) = pg().await;
    month_old_history(&db, 500).await;
    let target = default_target();
    let pool = db.pool().clone();
    let mut batches = 0;
    let moved = postbox::store::archive_all(
        &store,
        postbox::store::ArchiveParams {
            target: &target,
            older_than: Duration::from_secs(30 * 86_400),
            after_id: 0,
            batch_size: 100,
            dry_run: false,
            lock_wait: None,
        },
        false,
        |_| {
            batches += 1;
            if batches == 1 {
                // Someone else's batch takes the lock for a moment.
                let (held_tx, held_rx) = std::sync::mpsc::channel();
                let pool = pool.clone();
                tokio::spawn(async move {
                    let mut tx = pool.begin().await.unwrap();
                    sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1), hashtext('public'))")
                        .bind(postbox::store::pg_locks::RETENTION)
                        .execute(&mut *tx)
                        .await
                        .unwrap();
                    held_tx.send(()).unwrap();
                    // The subject: the lock is held for a while, and retention waits it out.
                    tokio::time::sleep(Duration::from_millis(400)).await;
                    tx.commit().await.unwrap();
                });
                held_rx.recv_timeout(Duration::from_secs(10)).unwrap();
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(moved, Some(500), "every old event archived in this run");
    assert_eq!(
        scalar(&db, "SELECT count(*) FROM outbox_events_archive").await,
        500
    );
}
