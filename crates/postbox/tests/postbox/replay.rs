//! Replays on PostgreSQL: chosen by filter from the table and the archive, marked as replays,
//! with the dedup id asked for; originals untouched; no long transaction; failures reported.

#![allow(
    clippy::unwrap_used,
    reason = "tests fail loudly on the first unexpected error"
)]

use std::sync::Arc;
use std::time::Duration;

use crate::common::{default_target, pg};
use postbox::replay::{REPLAY_ID_HEADER, REPLAY_OF_HEADER, Replay, ReplayDedup, ReplayOptions};
use postbox::store::{EventFilter, EventStatus};
use postbox::{PublishError, Store};
use postbox_testkit::{Behaviour, RecordingSink, TestDb, wait_until};

async fn sql(db: &TestDb, sql: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(db.pool())
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

#[tokio::test]
async fn a_replay_publishes_the_chosen_events_again_marked_as_replays() {
    let (db, store) = pg().await;
    sql(
        &db,
        "INSERT INTO outbox_events (event_type, aggregate_type, aggregate_id, payload, status,
                                    processed_at, idempotency_key, headers, created_at)
         SELECT 'InvoiceCreated', 'Invoice', g::text, jsonb_build_object('n', g),
                CASE WHEN g % 3 = 0 THEN 'FAILED' ELSE 'PROCESSED' END, now(), 'inv-' || g,
                '{\"traceparent\": \"00-t-01\"}',
                CASE WHEN g <= 10 THEN now() - interval '40 days' ELSE now() END
         FROM generate_series(1, 30) AS g;
         INSERT INTO outbox_events (event_type, aggregate_type, aggregate_id, payload)
         SELECT 'OrderPlaced', 'Order', g::text, '{}' FROM generate_series(1, 5) AS g;",
    )
    .await;
    let target = default_target();
    let archived = postbox::store::archive_all(
        &store,
        postbox::store::ArchiveParams {
            target: &target,
            older_than: Duration::from_secs(30 * 86_400),
            after_id: 0,
            batch_size: 100,
            dry_run: false,
            lock_wait: None,
        },
        true,
        |_| {},
    )
    .await
    .unwrap();
    assert_eq!(archived, Some(7), "the PROCESSED ones of 1-10");
    let before: Vec<(i64, String)> =
        sqlx::query_as("SELECT id, updated_at::text FROM outbox_events ORDER BY id")
            .fetch_all(db.pool())
            .await
            .unwrap();

    let store: Arc<dyn Store> = Arc::new(store);
    let sink = RecordingSink::new();
    let options = ReplayOptions::default().replay_id("r-1").page_size(4);
    let replay = Replay::new(Arc::clone(&store), Arc::new(sink.clone()), options);

    // Every invoice, archive included, PROCESSED and FAILED (the default statuses).
    let mut filter = EventFilter::default();
    filter.event_type = Some("Invoice*".parse().unwrap());
    filter.archive = true;
    let (count, sample) = replay.preview(&target, &filter, 3).await.unwrap();
    assert_eq!(count, 30);
    assert_eq!(sample.iter().map(|e| e.id).collect::<Vec<_>>(), [1, 2, 3]);
    assert!(sink.published().is_empty(), "a preview publishes nothing");
    let mut pages = Vec::new();
    let report = replay
        .run(&target, &filter, |n| pages.push(n))
        .await
        .unwrap();
    assert_eq!(report.published, 30, "{report:?}");
    assert!(report.failed.is_empty());
    assert_eq!(pages.iter().sum::<u64>(), 30);
    let published = sink.published();
    let ids: Vec<i64> = published.iter().map(|e| e.id).collect();
    assert_eq!(ids, (1..=30).collect::<Vec<_>>(), "oldest first, each once");
    for event in &published {
        assert_eq!(event.headers[REPLAY_OF_HEADER], event.id.to_string());
        assert_eq!(event.headers[REPLAY_ID_HEADER], "r-1");
        assert_eq!(
            event.headers["traceparent"], "00-t-01",
            "original headers kept"
        );
        assert_eq!(
            event.idempotency_key.as_deref(),
            Some(format!("inv-{}:replay:r-1", event.id).as_str()),
            "a dedup id of this replay"
        );
    }
    // The originals are untouched: same rows, same updated_at, nothing PENDING again.
    let after: Vec<(i64, String)> =
        sqlx::query_as("SELECT id, updated_at::text FROM outbox_events ORDER BY id")
            .fetch_all(db.pool())
            .await
            .unwrap();
    assert_eq!(before, after);

    // FAILED only, original dedup ids.
    let sink = RecordingSink::new();
    let options = ReplayOptions::default().dedup(ReplayDedup::Original);
    let replay = Replay::new(Arc::clone(&store), Arc::new(sink.clone()), options);
    let mut failed = EventFilter::default();
    failed.statuses = vec![EventStatus::Failed];
    failed.archive = true;
    let report = replay.run(&target, &failed, |_| {}).await.unwrap();
    assert_eq!(report.published, 10);
    assert!(
        sink.published()
            .iter()
            .all(|e| e.idempotency_key.as_deref() == Some(&format!("inv-{}", e.id)))
    );

    // Pending events are the relays' to publish: refused, nothing published.
    let mut pending = EventFilter::default();
    pending.statuses = vec![EventStatus::Pending];
    let err = replay.run(&target, &pending, |_| {}).await.unwrap_err();
    assert!(err.to_string().contains("published by the relays"), "{err}");
    // A glob that matches nothing: 0 events, not an error.
    let mut nothing = EventFilter::default();
    nothing.event_type = Some("Nope*".parse().unwrap());
    assert_eq!(replay.count(&target, &nothing).await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_reports_what_it_could_not_publish_and_holds_no_long_transaction() {
    let (db, store) = pg().await;
    sql(
        &db,
        "INSERT INTO outbox_events (event_type, payload, status, processed_at)
         SELECT CASE WHEN g = 7 THEN 'Poison' ELSE 'Slow' END, '{}', 'PROCESSED', now()
         FROM generate_series(1, 40) AS g",
    )
    .await;
    let sink = RecordingSink::new();
    sink.script(
        "Poison",
        Behaviour::FailWith(PublishError::permanent("schema rejected")),
    );
    sink.script("Slow", Behaviour::Slow(Duration::from_millis(50)));
    let options = ReplayOptions::default()
        .page_size(10)
        .concurrency(2)
        .rate_limit(Some(40.0));
    let replay = Replay::new(Arc::new(store), Arc::new(sink.clone()), options);
    let target = default_target();
    let started = std::time::Instant::now();
    let running =
        tokio::spawn(async move { replay.run(&target, &EventFilter::default(), |_| {}).await });
    // While it runs, no session of this database keeps a transaction open for long: sampled at
    // each look until it ends.
    let longest = std::cell::Cell::new(0.0f64);
    wait_until(
        "the replay has finished",
        Duration::from_secs(60),
        || async {
            let age: Option<f64> = sqlx::query_scalar(
                "SELECT max(extract(epoch FROM now() - xact_start))::float8 FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid()
               AND xact_start IS NOT NULL",
            )
            .fetch_one(db.pool())
            .await
            .unwrap();
            longest.set(longest.get().max(age.unwrap_or(0.0)));
            running.is_finished()
        },
    )
    .await;
    let longest = longest.get();
    let report = running.await.unwrap().unwrap();
    assert!(longest < 0.5, "a transaction stayed open {longest}s");
    assert_eq!(report.published, 39);
    assert_eq!(report.failed.len(), 1);
    assert_eq!(report.failed[0].0, 7);
    assert!(report.failed[0].1.contains("schema rejected"), "{report:?}");
    // 40 events at 40/s: about a second, not the 1 s / 50 ms × 2 the sink alone allows.
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
}
