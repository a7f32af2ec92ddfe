//! The CDC relay against the PostgreSQL on this machine (`wal_level = logical`, set by
//! scripts/services): each test has its own database, slot and publication.
#![allow(clippy::unwrap_used, reason = "tests")]

mod schedules;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use postbox::{PgStore, Relay, RelayConfig, RelayHandle, Store};
use postbox_cdc::{CdcConfig, CdcStore, Error};
use postbox_testkit::{Behaviour, RecordingSink, TestDb, wait_until};
use sqlx::{Executor, PgPool};

const PATIENCE: Duration = Duration::from_secs(20);

/// A migrated database and a CDC store on it, its slot named after the database.
async fn cdc(db: &TestDb, config: CdcConfig) -> Arc<CdcStore> {
    let pg = PgStore::new(db.pool().clone());
    postbox::migrate(&pg).await.unwrap();
    let slot = slot_name(db);
    Arc::new(
        CdcStore::start(pg, db.url(), config.slot(slot))
            .await
            .unwrap(),
    )
}

fn slot_name(db: &TestDb) -> String {
    db.url().rsplit('/').next().unwrap().to_owned()
}

/// A CDC store on a migrated database and a relay on it as the binary starts it (the slot's
/// events read and published unclaimed), started, once the slot is read.
async fn running(db: &TestDb, config: CdcConfig) -> (Arc<CdcStore>, RecordingSink, RelayHandle) {
    let store = cdc(db, config).await;
    let sink = RecordingSink::new();
    let handle = relay(&store, &sink).start();
    wait_until("the slot is read", PATIENCE, || async {
        store.status().streaming
    })
    .await;
    (store, sink, handle)
}

/// The relay as the binary starts it: without ordered aggregate types, the slot's events are
/// read and published unclaimed.
fn relay(store: &Arc<CdcStore>, sink: &RecordingSink) -> Relay {
    relay_with(store, sink, RelayConfig::default())
}

/// A relay with ordering on for every aggregate: the slot's events are claimed by id, so that
/// an event waits while an earlier one of its aggregate is in flight.
fn ordered(store: &Arc<CdcStore>, sink: &RecordingSink) -> Relay {
    relay_with(
        store,
        sink,
        RelayConfig::default().ordered_aggregate_types(vec!["*".to_owned()]),
    )
}

/// A relay with `config` as given: without ordered aggregate types, the slot's events are read
/// and published unclaimed (`CdcConfig::claim`).
fn relay_with(store: &Arc<CdcStore>, sink: &RecordingSink, config: RelayConfig) -> Relay {
    Relay::from_parts(
        Arc::clone(store) as Arc<dyn Store>,
        Arc::new(sink.clone()),
        config,
    )
    .unwrap()
}

/// Inserts one event as a producer in another language would, in its own transaction.
async fn insert(pool: &PgPool, event_type: &str, aggregate: &str) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO outbox_events (event_type, aggregate_type, aggregate_id, payload) \
         VALUES ($1, 'Order', $2, '{}') RETURNING id",
    )
    .bind(event_type)
    .bind(aggregate)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn processed(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox_events WHERE status = 'PROCESSED'")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The slot's confirmed position and the server's current one.
async fn slot_position(pool: &PgPool, slot: &str) -> (i64, i64) {
    sqlx::query_as(
        "SELECT (confirmed_flush_lsn - '0/0')::bigint, (pg_current_wal_lsn() - '0/0')::bigint \
         FROM pg_replication_slots WHERE slot_name = $1",
    )
    .bind(slot)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slot_delivers_committed_events_in_commit_order_and_never_a_rolled_back_one() {
    let db = TestDb::new().await;
    // The polling claim runs once at start, then not for an hour: what is published below came
    // through the slot.
    let (store, sink, handle) = running(
        &db,
        CdcConfig::default().poll_interval(Duration::from_secs(3600)),
    )
    .await;

    // Two transactions on one aggregate, committed against their id order; a third rolled back.
    let mut first = db.pool().begin().await.unwrap();
    let mut second = db.pool().begin().await.unwrap();
    let mut ghost = db.pool().begin().await.unwrap();
    let insert_in = "INSERT INTO outbox_events (event_type, aggregate_type, aggregate_id, payload) \
                     VALUES ($1, 'Order', 'o-1', '{}') RETURNING id";
    let first_id: i64 = sqlx::query_scalar(insert_in)
        .bind("First")
        .fetch_one(&mut *first)
        .await
        .unwrap();
    let second_id: i64 = sqlx::query_scalar(insert_in)
        .bind("Second")
        .fetch_one(&mut *second)
        .await
        .unwrap();
    sqlx::query_scalar::<_, i64>(insert_in)
        .bind("Ghost")
        .fetch_one(&mut *ghost)
        .await
        .unwrap();
    assert!(first_id < second_id);
    second.commit().await.unwrap();
    wait_until("the second commit is published", PATIENCE, || async {
        sink.published_ids().contains(&second_id)
    })
    .await;
    ghost.rollback().await.unwrap();
    first.commit().await.unwrap();
    wait_until("the first commit is published", PATIENCE, || async {
        sink.published_ids().contains(&first_id)
    })
    .await;
    assert_eq!(
        sink.published_ids(),
        vec![second_id, first_id],
        "commit order"
    );
    wait_until("both are PROCESSED", PATIENCE, || async {
        processed(db.pool()).await == 2
    })
    .await;
    assert!(store.status().received_lsn > 0);
    // The publication the relay made sends the id alone (PostgreSQL 15+): all it reads.
    let columns: Vec<String> = sqlx::query_scalar(
        "SELECT attnames::text[] FROM pg_publication_tables \
         WHERE pubname = 'postbox_outbox' AND tablename = 'outbox_events'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(columns, ["id"]);
    handle.stop().await.unwrap();
}

/// An ordered event whose aggregate's previous event is still in flight (here: held by
/// another relay) when the slot delivers it is not claimable yet; the relay looks at it again
/// shortly, rather than leaving it to the polling claim (here: never, the poll being an hour
/// away). The same look again covers a row delivered a moment before its transaction is
/// visible to other sessions (the server sends a commit to the slot once its WAL is flushed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordered_event_behind_one_in_flight_goes_out_by_the_slot_when_that_one_is_done() {
    let db = TestDb::new().await;
    postbox::migrate(&PgStore::new(db.pool().clone()))
        .await
        .unwrap();
    // Another relay holds the aggregate's first event (written before the slot exists).
    let first: i64 = sqlx::query_scalar(
        "INSERT INTO outbox_events (event_type, aggregate_type, aggregate_id, payload, status, \
         locked_until, locked_by, claim_token) \
         VALUES ('First', 'Order', 'o-1', '{}', 'PROCESSING', now() + interval '1 hour', \
         'other', gen_random_uuid()) RETURNING id",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    let store = cdc(
        &db,
        CdcConfig::default().poll_interval(Duration::from_secs(3600)),
    )
    .await;
    let sink = RecordingSink::new();
    let handle = ordered(&store, &sink).start();
    wait_until("the slot is read", PATIENCE, || async {
        store.status().streaming
    })
    .await;
    let second = insert(db.pool(), "Second", "o-1").await;
    // The slot delivered it and the relay's claim found its aggregate busy: it waits to be
    // looked at again. Then the other relay records the first.
    let deadline = std::time::Instant::now() + PATIENCE;
    while store.status().rechecking == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the second event was never looked at again"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    sqlx::query(
        "UPDATE outbox_events SET status = 'PROCESSED', processed_at = now() WHERE id = $1",
    )
    .bind(first)
    .execute(db.pool())
    .await
    .unwrap();
    wait_until("the second is published", PATIENCE, || async {
        sink.published_ids().contains(&second)
    })
    .await;
    assert_eq!(sink.published_ids(), vec![second]);
    handle.stop().await.unwrap();
}

/// A CDC store and a relay ordering every aggregate on it, started, once the slot is read.
async fn running_ordered(db: &TestDb) -> (Arc<CdcStore>, RecordingSink, RelayHandle) {
    let store = cdc(db, CdcConfig::default()).await;
    let sink = RecordingSink::new();
    let handle = ordered(&store, &sink).start();
    wait_until("the slot is read", PATIENCE, || async {
        store.status().streaming
    })
    .await;
    (store, sink, handle)
}

/// An event of aggregate `o-1` inserted in a transaction left open (the caller commits it).
async fn held_insert(
    pool: &PgPool,
    event_type: &str,
) -> (sqlx::Transaction<'static, sqlx::Postgres>, i64) {
    let mut tx = pool.begin().await.unwrap();
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO outbox_events (event_type, aggregate_type, aggregate_id, payload) \
         VALUES ($1, 'Order', 'o-1', '{}') RETURNING id",
    )
    .bind(event_type)
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    (tx, id)
}

/// Producers that commit out of id order: event A (the lower id) commits while B1, committed
/// before it, is being published, and B2 commits after A. The slot delivers A while B1 is in
/// flight; an id-order check alone finds nothing before A and takes it: two events of one
/// aggregate in flight, A acknowledged first. Neither the claim by id nor the polling claim
/// beside it (A is left to it after its rechecks, B1 taking longer) may take A before B1 is
/// done; B2 waits for both. Published in commit order, one at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordered_event_committed_behind_a_later_id_in_flight_waits_for_it() {
    let db = TestDb::new().await;
    let (_store, sink, handle) = running_ordered(&db).await;
    sink.script("B1", Behaviour::Slow(Duration::from_secs(3)));
    let (late, a) = held_insert(db.pool(), "A").await;
    let b1 = insert(db.pool(), "B1", "o-1").await;
    assert!(a < b1);
    wait_until("B1 is being published", PATIENCE, || async {
        sink.calls() == 1
    })
    .await;
    late.commit().await.unwrap();
    let b2 = insert(db.pool(), "B2", "o-1").await;
    wait_until("all three are published", PATIENCE, || async {
        sink.published_ids().len() == 3
    })
    .await;
    assert_eq!(
        sink.published_ids(),
        vec![b1, a, b2],
        "commit order, one at a time"
    );
    assert_eq!(sink.calls(), 3, "each published once");
    handle.stop().await.unwrap();
}

/// The same with the later event held by another relay (a second host, a poller beside): the
/// lower id that commits meanwhile waits through the claim by id, its rechecks and the polling
/// claim beside the slot, whose id order finds nothing before it, until that relay is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordered_event_with_a_lower_id_waits_while_another_relay_publishes_a_later_one() {
    let db = TestDb::new().await;
    let (_store, sink, handle) = running_ordered(&db).await;
    let (late, a) = held_insert(db.pool(), "A").await;
    // Committed before A, and being published by another relay.
    let b1: i64 = sqlx::query_scalar(
        "INSERT INTO outbox_events (event_type, aggregate_type, aggregate_id, payload, status, \
         locked_until, locked_by, claim_token) \
         VALUES ('B1', 'Order', 'o-1', '{}', 'PROCESSING', now() + interval '1 hour', \
         'other', gen_random_uuid()) RETURNING id",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert!(a < b1);
    late.commit().await.unwrap();
    // Past its rechecks and the polls of the claim beside the slot (a second apart; without
    // the put-back, one took A about 4.5 s after its commit).
    let seen = std::time::Instant::now();
    while seen.elapsed() < Duration::from_millis(8_000) {
        assert!(
            sink.published_ids().is_empty(),
            "A went out while B1 was in flight"
        );
        // The subject is a period: nothing is published while B1 is in flight.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    sqlx::query(
        "UPDATE outbox_events SET status = 'PROCESSED', processed_at = now() WHERE id = $1",
    )
    .bind(b1)
    .execute(db.pool())
    .await
    .unwrap();
    wait_until("A is published", PATIENCE, || async {
        sink.published_ids() == vec![a]
    })
    .await;
    assert_eq!(sink.calls(), 1);
    handle.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slot_is_confirmed_only_once_the_events_are_recorded() {
    let db = TestDb::new().await;
    let (store, sink, handle) = running(
        &db,
        CdcConfig::default().poll_interval(Duration::from_secs(3600)),
    )
    .await;
    let slot = slot_name(&db);
    sink.script("Slow", Behaviour::Slow(Duration::from_secs(3)));

    insert(db.pool(), "Slow", "o-1").await;
    let (_, committed) = slot_position(db.pool(), &slot).await;
    wait_until("the event is delivered", PATIENCE, || async {
        store.status().unrecorded == 1
    })
    .await;
    // While its publish lasts, the server is never told the slot is past it.
    for _ in 0..10 {
        let (confirmed, _) = slot_position(db.pool(), &slot).await;
        assert!(
            confirmed < committed,
            "confirmed {confirmed} past the unpublished commit at {committed}"
        );
        assert_eq!(processed(db.pool()).await, 0);
        // The subject is a period: nothing is confirmed while the publish lasts. Looks spread
        // over a second of the three it takes.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_until(
        "the slot is confirmed past the commit",
        PATIENCE,
        || async { slot_position(db.pool(), &slot).await.0 >= committed },
    )
    .await;
    let row: (String, i32, Option<String>) =
        sqlx::query_as("SELECT status, retry_count, last_error FROM outbox_events")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(
        row.0,
        "PROCESSED",
        "the slot was confirmed past the event, which is {row:?}; relay status {:?}",
        store.status()
    );
    handle.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_restarted_on_the_slot_publishes_every_event_and_repeats_only_what_was_in_flight() {
    restarted_on_the_slot(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_reads_unclaimed_restarted_on_the_slot_loses_nothing_and_repeats_only_what_was_in_flight()
 {
    restarted_on_the_slot(false).await;
}

/// A relay killed mid-stream and started again on its slot: claiming each event (`ordered`:
/// every aggregate ordered) or reading them unclaimed.
async fn restarted_on_the_slot(ordered: bool) {
    // The relay's room (`concurrency.max(batch_size) + batch_size`) and a claim of up to two
    // batches under way: the most it holds claimed or read and unrecorded.
    const BATCH: usize = 10;
    const IN_FLIGHT: usize = 2 * BATCH + 2 * BATCH;
    let db = TestDb::new().await;
    let sink = RecordingSink::new();
    // Leases of 2 s: what the killed relay held is taken over by the polling claim soon after.
    // Small batches, so that what may be repeated (what the killed relay had in flight) is a
    // small share of the 400 events.
    let config = || {
        let config = RelayConfig::default()
            .batch_size(BATCH as u32)
            .max_batch_size(BATCH as u32)
            .concurrency(BATCH)
            .lease(Duration::from_secs(2))
            .publish_timeout(Duration::from_secs(1));
        if ordered {
            config.ordered_aggregate_types(vec!["*".to_owned()])
        } else {
            config
        }
    };
    let cdc_config = || CdcConfig::default().poll_interval(Duration::from_millis(500));
    let store = cdc(&db, cdc_config()).await;
    let killed = relay_with(&store, &sink, config());
    let task = tokio::spawn(async move { killed.run(std::future::pending()).await });
    wait_until("the slot is read", PATIENCE, || async {
        store.status().streaming
    })
    .await;
    for i in 0..300 {
        insert(db.pool(), "Placed", &format!("o-{}", i % 7)).await;
    }
    wait_until("some are published", PATIENCE, || async {
        sink.published_ids().len() >= 50
    })
    .await;
    // Killed mid-stream: the relay's task and the slot's reader end without recording more.
    task.abort();
    let _ = task.await;
    drop(store);

    let store = cdc(&db, cdc_config()).await;
    let handle = relay_with(&store, &sink, config()).start();
    for i in 300..400 {
        insert(db.pool(), "Placed", &format!("o-{}", i % 7)).await;
    }
    wait_until(
        "every event is PROCESSED",
        Duration::from_secs(60),
        || async { processed(db.pool()).await == 400 },
    )
    .await;
    let mut times: HashMap<i64, u32> = HashMap::new();
    for id in sink.published_ids() {
        *times.entry(id).or_default() += 1;
    }
    assert_eq!(times.len(), 400, "each event published");
    let repeated = times.values().filter(|&&n| n > 1).count();
    eprintln!("{repeated} of 400 repeated after the kill");
    assert!(
        repeated <= IN_FLIGHT,
        "{repeated} repeated, more than the {IN_FLIGHT} the killed relay could have in flight"
    );
    handle.stop().await.unwrap();
}

/// A relay restarted with its slot far behind — stopped while a polling relay did the work —
/// reads back every insert it missed before it reaches new commits. A new event meanwhile goes
/// out by the timed poll (`poll_interval`), not after the catch-up; what the poller finished is
/// not published again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_far_behind_its_slot_publishes_new_events_while_it_catches_up() {
    let db = TestDb::new().await;
    let slot = slot_name(&db);
    let store = cdc(&db, CdcConfig::default()).await;
    wait_until("the slot is read", PATIENCE, || async {
        store.status().streaming
    })
    .await;
    drop(store);
    wait_until("the slot is let go", PATIENCE, || async {
        !sqlx::query_scalar::<_, bool>(
            "SELECT active FROM pg_replication_slots WHERE slot_name = $1",
        )
        .bind(&slot)
        .fetch_one(db.pool())
        .await
        .unwrap()
    })
    .await;
    // While the CDC relay was stopped, a polling relay published 200,000 events (written here
    // as it leaves them), committed in transactions of 1,000.
    const MISSED: i64 = 200_000;
    for from in (0..MISSED).step_by(1000) {
        sqlx::query(
            "INSERT INTO outbox_events (event_type, aggregate_type, aggregate_id, payload, \
             status, processed_at) \
             SELECT 'Missed', 'Order', 'o-' || g, '{}', 'PROCESSED', now() \
             FROM generate_series($1::bigint, $1::bigint + 999) g",
        )
        .bind(from)
        .execute(db.pool())
        .await
        .unwrap();
    }

    let store = cdc(&db, CdcConfig::default()).await;
    let sink = RecordingSink::new();
    let handle = relay(&store, &sink).start();
    wait_until("the slot is read", PATIENCE, || async {
        store.status().streaming
    })
    .await;
    // Where the WAL stood inside the new event's transaction: before its commit.
    let mut tx = db.pool().begin().await.unwrap();
    let new: i64 = sqlx::query_scalar(
        "INSERT INTO outbox_events (event_type, aggregate_type, aggregate_id, payload) \
         VALUES ('New', 'Order', 'o-new', '{}') RETURNING id",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    let before_commit: i64 = sqlx::query_scalar("SELECT (pg_current_wal_lsn() - '0/0')::bigint")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let committed = std::time::Instant::now();
    while !sink.published_ids().contains(&new) {
        assert!(
            committed.elapsed() < PATIENCE,
            "the new event was not published"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Published while the slot had not delivered its commit yet, or had a long queue before it.
    let status = store.status();
    assert!(
        status.received_lsn < u64::try_from(before_commit).unwrap() || status.unrecorded > 1000,
        "the new event went out only once the slot had caught up ({status:?}, {:?} after its \
         commit)",
        committed.elapsed()
    );
    wait_until(
        "the slot has caught up",
        Duration::from_secs(120),
        || async { store.status().unrecorded == 0 },
    )
    .await;
    // The poll's mark of the new event is written after its publish, on its own time.
    wait_until("the new event is marked", PATIENCE, || async {
        processed(db.pool()).await == MISSED + 1
    })
    .await;
    assert_eq!(sink.published_ids(), vec![new], "only the new event");
    handle.stop().await.unwrap();
}

/// A polling relay beside a CDC relay on the same table: the claim is the same for both (a
/// lease and a token on each row), so each event is published once, by one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_polling_relay_beside_a_cdc_relay_that_claims_publishes_each_event_once() {
    let (ids, published) = beside_a_poller(true).await;
    assert_eq!(published, ids, "each event once, by one relay or the other");
}

/// A polling relay beside a CDC relay that reads (the defaults of both): the poller leaves the
/// default schema's events to the CDC relay while it reads, so none goes out twice (both took
/// each new event at the same moment before: about half of them were published twice), and
/// it claims them again once the CDC relay stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_polling_relay_beside_a_cdc_relay_that_reads_leaves_it_the_events_and_takes_over_when_it_stops()
 {
    let (ids, published) = beside_a_poller(false).await;
    let mut times: HashMap<i64, u32> = HashMap::new();
    for id in published {
        *times.entry(id).or_default() += 1;
    }
    let mut seen: Vec<i64> = times.keys().copied().collect();
    seen.sort_unstable();
    assert_eq!(seen, ids, "every event published");
    let repeated = times.values().filter(|&&n| n > 1).count();
    assert_eq!(repeated, 0, "{repeated} of {} published twice", ids.len());
}

/// 500 events committed one by one while a CDC relay (claiming each event or not) and a polling
/// relay run on the table, then 20 more once the CDC relay has stopped; returns their ids and
/// every publish of either relay, sorted.
async fn beside_a_poller(claim: bool) -> (Vec<i64>, Vec<i64>) {
    let db = TestDb::new().await;
    let store = cdc(
        &db,
        CdcConfig::default()
            .poll_interval(Duration::from_millis(100))
            .claim(claim),
    )
    .await;
    let cdc_sink = RecordingSink::new();
    let cdc_handle = relay_with(&store, &cdc_sink, RelayConfig::default()).start();
    wait_until("the slot is read", PATIENCE, || async {
        store.status().streaming
    })
    .await;
    let poll_sink = RecordingSink::new();
    let poller = Relay::from_parts(
        Arc::new(PgStore::new(db.pool().clone())) as Arc<dyn Store>,
        Arc::new(poll_sink.clone()),
        RelayConfig::default().poll_interval(Duration::from_millis(20)),
    )
    .unwrap()
    .start();
    let mut ids = Vec::new();
    for i in 0..500 {
        ids.push(insert(db.pool(), "Placed", &format!("o-{}", i % 13)).await);
    }
    wait_until("every event is PROCESSED", PATIENCE, || async {
        processed(db.pool()).await == 500
    })
    .await;
    cdc_handle.stop().await.unwrap();
    drop(store);
    for i in 500..520 {
        ids.push(insert(db.pool(), "Placed", &format!("o-{}", i % 13)).await);
    }
    wait_until(
        "the poller publishes what is committed once the CDC relay has stopped",
        PATIENCE,
        || async { processed(db.pool()).await == 520 },
    )
    .await;
    poller.stop().await.unwrap();
    let mut published = cdc_sink.published_ids();
    published.extend(poll_sink.published_ids());
    published.sort_unstable();
    (ids, published)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slot_advances_while_the_outbox_is_idle_and_other_tables_churn() {
    let db = TestDb::new().await;
    let (_store, _sink, handle) = running(
        &db,
        CdcConfig::default().heartbeat(Duration::from_millis(200)),
    )
    .await;
    let slot = slot_name(&db);
    db.pool()
        .execute("CREATE TABLE churn (id bigserial PRIMARY KEY, body text)")
        .await
        .unwrap();
    for _ in 0..20 {
        db.pool()
            .execute(
                "INSERT INTO churn (body) SELECT repeat('x', 500) FROM generate_series(1, 2000)",
            )
            .await
            .unwrap();
    }
    let (_, written) = slot_position(db.pool(), &slot).await;
    wait_until("the slot is confirmed past the churn", PATIENCE, || async {
        slot_position(db.pool(), &slot).await.0 >= written
    })
    .await;
    handle.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_slot_is_polled_around_and_made_again() {
    let db = TestDb::new().await;
    let (store, sink, handle) = running(
        &db,
        CdcConfig::default().poll_interval(Duration::from_millis(200)),
    )
    .await;
    let slot = slot_name(&db);
    // An operator drops the slot from under the relay: its reader is ended first, as
    // pg_drop_replication_slot refuses an active slot.
    wait_until("the slot is dropped", PATIENCE, || async {
        sqlx::query(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
             WHERE slot_name = $1 AND active_pid IS NOT NULL",
        )
        .bind(&slot)
        .execute(db.pool())
        .await
        .unwrap();
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM (SELECT pg_drop_replication_slot(slot_name) \
             FROM pg_replication_slots WHERE slot_name = $1 AND NOT active) d",
        )
        .bind(&slot)
        .fetch_one(db.pool())
        .await
        .map(|n| n == 1)
        .unwrap_or(false)
    })
    .await;
    // Events committed now are claimed whether or not the new slot sees them.
    let mut ids = Vec::new();
    for i in 0..20 {
        ids.push(insert(db.pool(), "Placed", &format!("o-{i}")).await);
    }
    wait_until("every event is PROCESSED", PATIENCE, || async {
        processed(db.pool()).await == 20
    })
    .await;
    wait_until("the slot is made again and read", PATIENCE, || async {
        store.status().streaming
            && sqlx::query_scalar::<_, bool>(
                "SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND active)",
            )
            .bind(&slot)
            .fetch_one(db.pool())
            .await
            .unwrap()
    })
    .await;
    let late = insert(db.pool(), "Placed", "o-late").await;
    wait_until(
        "an event after the new slot is published",
        PATIENCE,
        || async { sink.published_ids().contains(&late) },
    )
    .await;
    for id in ids {
        assert!(sink.published_ids().contains(&id));
    }
    handle.stop().await.unwrap();
}

/// `DROP PUBLICATION` under a running relay: the slot cannot decode past it (not even once the
/// publication is back), so the relay creates the publication again and a new slot; what was
/// committed meanwhile is claimed by the polling claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_publication_is_made_again_with_a_new_slot() {
    let db = TestDb::new().await;
    // No heartbeat: the received position moves with delivered commits alone.
    let (store, sink, handle) = running(
        &db,
        CdcConfig::default()
            .poll_interval(Duration::from_millis(200))
            .heartbeat(Duration::from_secs(3600)),
    )
    .await;
    let slot = slot_name(&db);
    let before = insert(db.pool(), "Placed", "o-before").await;
    wait_until("the first event is published", PATIENCE, || async {
        sink.published_ids().contains(&before)
    })
    .await;
    let old_slot: i64 = sqlx::query_scalar(
        "SELECT (restart_lsn - '0/0')::bigint FROM pg_replication_slots WHERE slot_name = $1",
    )
    .bind(&slot)
    .fetch_one(db.pool())
    .await
    .unwrap();
    db.pool()
        .execute("DROP PUBLICATION postbox_outbox")
        .await
        .unwrap();
    let mut ids = vec![before];
    for i in 0..20 {
        ids.push(insert(db.pool(), "Placed", &format!("o-{i}")).await);
    }
    wait_until("every event is PROCESSED", PATIENCE, || async {
        processed(db.pool()).await == 21
    })
    .await;
    wait_until(
        "the publication and a new slot are made, and read",
        PATIENCE,
        || async {
            let (publication, restart): (bool, Option<i64>) = sqlx::query_as(
                "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'postbox_outbox'), \
                 (SELECT (restart_lsn - '0/0')::bigint FROM pg_replication_slots \
                  WHERE slot_name = $1 AND active)",
            )
            .bind(&slot)
            .fetch_one(db.pool())
            .await
            .unwrap();
            publication && restart.is_some_and(|lsn| lsn > old_slot) && store.status().streaming
        },
    )
    .await;
    let received = store.status().received_lsn;
    let late = insert(db.pool(), "Placed", "o-late").await;
    wait_until("an event after it is published", PATIENCE, || async {
        sink.published_ids().contains(&late)
    })
    .await;
    wait_until("the new slot delivered it", PATIENCE, || async {
        store.status().received_lsn > received
    })
    .await;
    ids.push(late);
    let mut published = sink.published_ids();
    published.sort_unstable();
    assert_eq!(published, ids, "each event once");
    handle.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_that_may_not_replicate_is_told_the_statement_that_fixes_it() {
    let db = TestDb::new().await;
    let pg = PgStore::new(db.pool().clone());
    postbox::migrate(&pg).await.unwrap();
    let role = format!(
        "norepl_{}",
        slot_name(&db).trim_start_matches("postbox_test_")
    );
    db.pool()
        .execute(sqlx::AssertSqlSafe(format!("CREATE ROLE \"{role}\" LOGIN")))
        .await
        .unwrap();
    let url = format!("{}?user={role}", db.url());
    let pool = PgPool::connect(&url).await.unwrap();
    let err = CdcStore::start(
        PgStore::new(pool.clone()),
        &url,
        CdcConfig::default().slot(slot_name(&db)),
    )
    .await
    .err()
    .expect("a role without REPLICATION is refused");
    pool.close().await;
    db.pool()
        .execute(sqlx::AssertSqlSafe(format!("DROP ROLE \"{role}\"")))
        .await
        .unwrap();
    assert!(matches!(err, Error::NoReplication { .. }), "{err}");
    assert!(
        err.to_string()
            .contains(&format!("ALTER ROLE \"{role}\" REPLICATION")),
        "{err}"
    );
    let wal = Error::WalLevel {
        found: "replica".to_owned(),
    };
    assert!(
        wal.to_string()
            .contains("ALTER SYSTEM SET wal_level = logical"),
        "{wal}"
    );
}

/// A PostgreSQL cluster of the test's own in `dir` (`wal_level = logical` and `settings`), a
/// pool on it, and a CDC store on the migrated database, started.
async fn private_cluster(
    dir: &tempfile::TempDir,
    settings: &[(&str, &str)],
) -> (postbox_testkit::cluster::Cluster, PgPool, Arc<CdcStore>) {
    use postbox_testkit::cluster::{Cluster, find_bin_dir};
    let mut all = vec![("wal_level", "logical")];
    all.extend_from_slice(settings);
    let server = Cluster::start(dir.path(), find_bin_dir().unwrap(), "postgres", &all)
        .await
        .unwrap();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect(&server.url())
        .await
        .unwrap();
    let pg = PgStore::new(pool.clone());
    postbox::migrate(&pg).await.unwrap();
    let store = Arc::new(
        CdcStore::start(pg, &server.url(), CdcConfig::default())
            .await
            .unwrap(),
    );
    (server, pool, store)
}

/// A fast shutdown of PostgreSQL waits until every logical reader has confirmed all the WAL sent
/// to it, which a relay holding an event in flight cannot do; the relay lets go of the slot as
/// soon as its other connections find the server going away. Here: `pg_ctl stop -m fast` (60 s
/// timeout) finishes with an event in flight, and after the restart the relay reads the slot
/// again and publishes everything. (The chaos kit's CDC run, with producers busy and three
/// relays, is where a held-up shutdown showed before the relay let go.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_restart_of_postgresql_with_an_event_in_flight_loses_nothing_and_the_slot_is_read_again()
 {
    let dir = tempfile::tempdir().unwrap();
    let (server, pool, store) = private_cluster(&dir, &[]).await;
    let sink = RecordingSink::new();
    let handle = relay(&store, &sink).start();
    wait_until("the slot is read", PATIENCE, || async {
        store.status().streaming
    })
    .await;
    sink.script("Slow", Behaviour::Slow(Duration::from_secs(3)));
    insert(&pool, "Slow", "o-1").await;
    wait_until("the event is in flight", PATIENCE, || async {
        store.status().unrecorded == 1
    })
    .await;

    let took = server
        .restart(false, Duration::from_millis(500))
        .await
        .expect("a fast shutdown finishes while the CDC relay holds an event in flight");
    // A shutdown held up by a reader that does not let go waits for wal_sender_timeout (60 s
    // by default); a loaded CI machine has taken 34 s to restart this cluster without one.
    assert!(
        took < Duration::from_secs(45),
        "the restart took {took:?}: the shutdown waited for the slot's reader"
    );
    wait_until(
        "the slot is read again",
        Duration::from_secs(60),
        || async { store.status().streaming },
    )
    .await;
    insert(&pool, "After", "o-2").await;
    wait_until(
        "both events are processed",
        Duration::from_secs(120),
        || async {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM outbox_events WHERE status = 'PROCESSED'",
            )
            .fetch_one(&pool)
            .await
            .is_ok_and(|n| n == 2)
        },
    )
    .await;
    let published = sink.published();
    for event_type in ["Slow", "After"] {
        assert!(
            published.iter().any(|e| e.event_type == event_type),
            "{event_type} not published: {published:?}"
        );
    }
    handle.stop().await.unwrap();
}

/// Checks that every transaction the CDC slot's confirmed position has passed (its commit's
/// end, from the `oracle` test_decoding slot) has each of its outbox events recorded: none
/// still pending and untouched. Returns how many events it checked.
async fn behind_the_slot_all_recorded(pool: &PgPool, round: u64) -> usize {
    unrecorded_behind_the_slot(
        pool,
        "postbox",
        "oracle",
        0,
        &[&postbox::SchemaName::public()],
    )
    .await
    .unwrap_or_else(|why| panic!("round {round}: {why}"))
}

/// Whether every transaction that committed after WAL position `since` and that slot `slot`'s
/// confirmed position has passed (its commit's end, from the test_decoding slot `oracle`) has
/// each of its events in the outboxes of `schemas` recorded in the table — none still pending
/// and untouched. Returns how many events it checked, or the ones that are not.
async fn unrecorded_behind_the_slot(
    pool: &PgPool,
    slot: &str,
    oracle: &str,
    since: i64,
    schemas: &[&postbox::SchemaName],
) -> Result<usize, String> {
    // A slot being made (or dropped) has passed nothing.
    let confirmed: i64 = sqlx::query_scalar(
        "SELECT coalesce(max(pg_wal_lsn_diff(confirmed_flush_lsn, '0/0')), 0)::bigint \
         FROM pg_replication_slots WHERE slot_name = $1",
    )
    .bind(slot)
    .fetch_one(pool)
    .await
    .unwrap();
    // Read after the position: whatever it passed was recorded before it was confirmed.
    let mut untouched = std::collections::HashSet::new();
    for schema in schemas {
        let ids: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT id FROM {}.outbox_events WHERE status = 'PENDING' AND retry_count = 0 \
             AND last_error IS NULL AND (locked_until IS NULL OR locked_until < now())",
            schema.quoted()
        )))
        .fetch_all(pool)
        .await
        .unwrap();
        untouched.extend(ids.into_iter().map(|id| (schema.as_str().to_owned(), id)));
    }
    let changes: Vec<(i64, String)> = sqlx::query_as(
        "SELECT pg_wal_lsn_diff(lsn, '0/0')::bigint, data \
         FROM pg_logical_slot_peek_changes($1, NULL, NULL)",
    )
    .bind(oracle)
    .fetch_all(pool)
    .await
    .unwrap();
    let mut checked = 0;
    let mut ids = Vec::new();
    for (lsn, data) in changes {
        if data.starts_with("BEGIN") {
            ids.clear();
        } else if let Some((schema, rest)) = data
            .strip_prefix("table ")
            .and_then(|t| t.split_once(".outbox_events: INSERT: id[bigint]:"))
        {
            let id = rest.split(' ').next().unwrap().parse::<i64>().unwrap();
            ids.push((schema.to_owned(), id));
        } else if data.starts_with("COMMIT") && lsn > since && lsn <= confirmed {
            checked += ids.len();
            let unrecorded: Vec<&(String, i64)> =
                ids.iter().filter(|key| untouched.contains(*key)).collect();
            if !unrecorded.is_empty() {
                return Err(format!(
                    "the slot is confirmed at {confirmed}, past the commit at {lsn} of events \
                     {unrecorded:?}, which are not recorded"
                ));
            }
        }
    }
    Ok(checked)
}

/// PostgreSQL stopped `-m immediate` 20 times while a producer commits one event per transaction
/// and a CDC relay reads them through publishes of 100 ms: just before each stop (the position
/// the relay last reported) and just after it (the position the server saved), every
/// transaction the slot's confirmed position has passed (its commit's end, from an independent
/// `test_decoding` slot) has each of its events recorded in the table — never one still pending
/// and untouched — and in the end every committed event is published. (A relay that confirmed
/// each commit on arrival fails it in the first rounds.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_confirmed_position_never_passes_an_unrecorded_event_across_immediate_stops() {
    let dir = tempfile::tempdir().unwrap();
    let (server, pool, store) = private_cluster(&dir, &[]).await;
    sqlx::query("SELECT pg_create_logical_replication_slot('oracle', 'test_decoding')")
        .execute(&pool)
        .await
        .unwrap();
    let sink = RecordingSink::new();
    // Publishes that take a while: events are in flight, unrecorded, whenever the position is
    // looked at.
    sink.script("Placed", Behaviour::Slow(Duration::from_millis(100)));
    let handle = relay(&store, &sink).start();
    wait_until("the slot is read", PATIENCE, || async {
        store.status().streaming
    })
    .await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let producer = tokio::spawn({
        let (pool, stop) = (pool.clone(), Arc::clone(&stop));
        async move {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                n += 1;
                // A failed insert (the server is down) is tried again with the next number.
                let _ = sqlx::query(
                    "INSERT INTO outbox_events (event_type, aggregate_type, aggregate_id, payload) \
                     VALUES ('Placed', 'Order', $1, '{}')",
                )
                .bind(format!("o-{n}"))
                .execute(&pool)
                .await;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    });
    let mut passed_checked = 0;
    for round in 0..20_u64 {
        // Within a status update's interval (200 ms) of the last one, at a different point
        // each round.
        tokio::time::sleep(Duration::from_millis(300 + (round * 37) % 200)).await;
        passed_checked += behind_the_slot_all_recorded(&pool, round).await;
        server
            .restart(true, Duration::from_millis(100))
            .await
            .unwrap();
        // After the crash the slot is back at the position last saved; it must be safe too.
        wait_until("the server answers", PATIENCE, || async {
            sqlx::query("SELECT 1").execute(&pool).await.is_ok()
        })
        .await;
        passed_checked += behind_the_slot_all_recorded(&pool, round).await;
        wait_until("the slot is read again", PATIENCE, || async {
            store.status().streaming
        })
        .await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    producer.await.unwrap();
    let committed: Vec<i64> = sqlx::query_scalar("SELECT id FROM outbox_events ORDER BY id")
        .fetch_all(&pool)
        .await
        .unwrap();
    wait_until(
        "every event is processed",
        Duration::from_secs(120),
        || async { processed(&pool).await == committed.len() as i64 },
    )
    .await;
    let published: std::collections::HashSet<i64> = sink.published_ids().into_iter().collect();
    assert!(
        committed.iter().all(|id| published.contains(id)),
        "every committed event published"
    );
    assert!(
        passed_checked > 0,
        "no transaction was behind the confirmed position"
    );
    eprintln!(
        "{} events committed across 20 immediate stops; {passed_checked} checked behind the \
         confirmed position",
        committed.len()
    );
    handle.stop().await.unwrap();
}

/// A slot invalidated by `max_slot_wal_keep_size` under a running relay (a producer
/// transaction held open while other tables write more WAL than the slot may keep): the server
/// ends the relay's reading, the relay finds the slot lost, drops it and reads a new one within
/// 10 s of the transaction's end; what was committed meanwhile is polled. Every event goes out
/// once, through the default read path.
#[tokio::test]
async fn a_slot_invalidated_under_a_running_relay_is_rebuilt_and_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let (server, pool, store) = private_cluster(&dir, &[("max_slot_wal_keep_size", "1MB")]).await;
    let sink = RecordingSink::new();
    let handle = relay_with(&store, &sink, RelayConfig::default()).start();
    wait_until("the slot is read", PATIENCE, || async {
        store.status().streaming
    })
    .await;
    insert(&pool, "Before", "o-1").await;
    wait_until("the first event is out", PATIENCE, || async {
        sink.published().len() == 1
    })
    .await;

    // A producer transaction left open: the slot's restart_lsn cannot pass it.
    let mut held = pool.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO outbox_events (event_type, aggregate_type, aggregate_id, payload) \
         VALUES ('Held', 'Order', 'o-2', '{}')",
    )
    .execute(&mut *held)
    .await
    .unwrap();
    pool.execute(
        "CREATE TABLE churn (x text); \
         INSERT INTO churn SELECT repeat('x', 1000) FROM generate_series(1, 50000); \
         SELECT pg_switch_wal(); CHECKPOINT;",
    )
    .await
    .unwrap();
    // The checkpoint invalidated the slot and ended its reader's connection.
    wait_until(
        "the relay stops reading the lost slot",
        PATIENCE,
        || async { !store.status().streaming },
    )
    .await;
    insert(&pool, "Meanwhile", "o-3").await;
    held.commit().await.unwrap();
    let ended = std::time::Instant::now();
    wait_until("a new slot is read", PATIENCE, || async {
        store.status().streaming
            && sqlx::query_scalar::<_, Option<String>>(
                "SELECT wal_status FROM pg_replication_slots \
                 WHERE slot_name = 'postbox' AND active",
            )
            .fetch_optional(&pool)
            .await
            .is_ok_and(|s| s.flatten().is_some_and(|s| s != "lost"))
    })
    .await;
    let rebuilt = ended.elapsed();
    let log = std::fs::read_to_string(server.log()).unwrap();
    assert!(
        log.contains("invalidating") && log.contains("max_slot_wal_keep_size"),
        "the server invalidated the slot:\n{log}"
    );
    insert(&pool, "After", "o-4").await;
    wait_until("every event is out", PATIENCE, || async {
        sink.published().len() >= 4
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut published: Vec<String> = sink
        .published()
        .iter()
        .map(|e| e.event_type.clone())
        .collect();
    published.sort();
    assert_eq!(
        published,
        ["After", "Before", "Held", "Meanwhile"],
        "each once"
    );
    assert!(
        rebuilt < Duration::from_secs(10),
        "the new slot was read {rebuilt:?} after the transaction that held the old one ended"
    );
    let processed: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox_events WHERE status = 'PROCESSED'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(processed, 4);
    handle.stop().await.unwrap();
}

/// Inserts `n` events of `event_type` in one transaction, as a producer in another language
/// would; returns their ids.
async fn insert_many(pool: &PgPool, event_type: &str, n: i64) -> Vec<i64> {
    sqlx::query_scalar(
        "INSERT INTO outbox_events (event_type, aggregate_type, aggregate_id, payload) \
         SELECT $1, 'Order', 'o-' || g, '{}' FROM generate_series(1, $2) g RETURNING id",
    )
    .bind(event_type)
    .bind(n)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// An event published unclaimed meets its own relay's polling claim: a poll that claims events
/// a read is publishing leaves them out of its batch, and the read's outcome is recorded under
/// the poll's token — each event goes out once. Driven step by step through the store, as the
/// relay's rounds call it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_being_read_that_the_relays_own_poll_claims_are_left_to_the_read() {
    let db = TestDb::new().await;
    let (store, target) = by_hand(&db, Duration::from_millis(200)).await;
    let params = round(&target);
    // The first claim polls (none ran yet): nothing there.
    assert!(store.events_claim(&params).await.unwrap().events.is_empty());
    let ids = insert_many(db.pool(), "Placed", 10).await;
    wait_until("the slot delivered them", PATIENCE, || async {
        store.status().unrecorded == 10
    })
    .await;
    // The poll is not due: the delivered events are read, not claimed.
    let read = store.events_claim(&params).await.unwrap();
    let got: Vec<i64> = read.events.iter().map(|e| e.id).collect();
    assert_eq!(got, ids);
    let claimed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox_events WHERE status <> 'PENDING' OR claim_token IS NOT NULL",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(claimed, 0, "a read writes nothing");
    // While they are published, the timed poll comes and claims them from the floor.
    tokio::time::sleep(Duration::from_millis(250)).await;
    let polled = store.events_claim(&params).await.unwrap();
    assert!(
        polled.events.is_empty(),
        "the poll left the events being read out of its batch"
    );
    let marked = mark(&store, &target, read.claim_token, &ids).await;
    assert_eq!(marked, 10);
    let tokens: Vec<Option<uuid::Uuid>> = sqlx::query_scalar(
        "SELECT claim_token FROM outbox_events WHERE status = 'PROCESSED' ORDER BY id",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    // One claim's token on every row: the poll's, under which the read recorded them.
    assert!(
        tokens[0].is_some() && tokens.iter().all(|t| *t == tokens[0]),
        "recorded under the poll's claim: {tokens:?}"
    );
}

/// Events read unclaimed, published by a relay: marked without a claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_without_ordered_types_publishes_what_the_slot_delivers_without_claiming_it() {
    let db = TestDb::new().await;
    let store = cdc(&db, CdcConfig::default()).await;
    let sink = RecordingSink::new();
    let handle = relay_with(&store, &sink, RelayConfig::default()).start();
    wait_until("the slot is read", PATIENCE, || async {
        store.status().streaming
    })
    .await;
    let mut ids = Vec::new();
    for _ in 0..10 {
        ids.extend(insert_many(db.pool(), "Placed", 20).await);
    }
    wait_until("every event is PROCESSED", PATIENCE, || async {
        processed(db.pool()).await == 200
    })
    .await;
    handle.stop().await.unwrap();
    let mut published = sink.published_ids();
    published.sort_unstable();
    assert_eq!(published, ids, "each event once");
    let never_claimed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox_events WHERE status = 'PROCESSED' AND claim_token IS NULL",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    // The relay's polls (its first claim, then one each poll interval) may find transactions
    // before the slot names them: one or two here, more on a machine loaded by other tests
    // (160 seen there). A relay whose slot's events were claimed would mark none without one.
    assert!(
        never_claimed >= 120,
        "{never_claimed} of 200 marked without a claim"
    );
}

/// A read event whose publish fails is claimed for its failed try: backed off and counted as a
/// claimed event's, then published again; one whose destination is down is put back without
/// spending a try.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_event_that_fails_is_retried_and_its_try_counted_as_a_claimed_ones_is() {
    let db = TestDb::new().await;
    let store = cdc(
        &db,
        CdcConfig::default().poll_interval(Duration::from_millis(50)),
    )
    .await;
    let sink = RecordingSink::new();
    sink.script("Flaky", Behaviour::FailTimes(1));
    sink.script(
        "Down",
        Behaviour::FailWith(postbox::PublishError::unavailable("broker restarting")),
    );
    let config = RelayConfig::default().retry(postbox::backoff::Backoff::new(
        Duration::from_millis(20),
        Duration::from_millis(50),
    ));
    let handle = relay_with(&store, &sink, config).start();
    wait_until("the slot is read", PATIENCE, || async {
        store.status().streaming
    })
    .await;
    let flaky = insert(db.pool(), "Flaky", "o-1").await;
    let down = insert(db.pool(), "Down", "o-2").await;
    wait_until("the flaky event is PROCESSED", PATIENCE, || async {
        processed(db.pool()).await == 1
    })
    .await;
    assert_eq!(sink.attempts(flaky), 2);
    let (retries, error): (i32, Option<String>) =
        sqlx::query_as("SELECT retry_count, last_error FROM outbox_events WHERE id = $1")
            .bind(flaky)
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(retries, 1, "the failed try is counted");
    assert!(error.is_some_and(|e| e.contains("scripted failure")));
    wait_until("the put-back event is tried again", PATIENCE, || async {
        sink.attempts(down) >= 2
    })
    .await;
    let (retries, status): (i32, String) =
        sqlx::query_as("SELECT retry_count, status FROM outbox_events WHERE id = $1")
            .bind(down)
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(retries, 0, "an unavailable destination spends no try");
    assert_ne!(status, "PROCESSED");
    handle.stop().await.unwrap();
}

/// The slot names events the relay's poll already took (the slot started behind them): they are
/// left to the poll's claim at once, not read and looked at again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_a_poll_took_are_left_to_it_when_the_slot_names_them() {
    let db = TestDb::new().await;
    let (store, target) = by_hand(&db, Duration::from_secs(3600)).await;
    let params = round(&target);
    let ids = insert_many(db.pool(), "Placed", 10).await;
    // The first claim polls (none ran yet), and takes them before the slot names them.
    let polled = store.events_claim(&params).await.unwrap();
    assert_eq!(polled.events.len(), 10);
    wait_until("the slot named them", PATIENCE, || async {
        store.status().unrecorded == 10
    })
    .await;
    let next = store.events_claim(&params).await.unwrap();
    assert!(next.events.is_empty());
    let status = store.status();
    assert_eq!(
        (status.unrecorded, status.rechecking),
        (0, 0),
        "left to the poll's claim at once, none looked at again"
    );
    let marked = mark(&store, &target, polled.claim_token, &ids).await;
    assert_eq!(marked, 10);
}

/// A CDC store on a migrated database, once its slot is read, to be driven by hand as a relay's
/// rounds drive it; and the default schema's target.
async fn by_hand(db: &TestDb, poll_interval: Duration) -> (Arc<CdcStore>, postbox::Target) {
    let store = cdc(db, CdcConfig::default().poll_interval(poll_interval)).await;
    wait_until("the slot is read", PATIENCE, || async {
        store.status().streaming
    })
    .await;
    let target = postbox::Target::default_schema(store.default_schema());
    (store, target)
}

/// A claim of `target` as a relay's round asks for one.
fn round(target: &postbox::Target) -> postbox::store::ClaimParams<'_> {
    postbox::store::ClaimParams {
        target,
        batch_size: 100,
        lease: Duration::from_secs(30),
        relay_id: "relay-1",
        order: postbox::store::ClaimOrder::default(),
        floor: 0,
    }
}

/// Marks `ids` PROCESSED through the store under `token`, as a relay does once they are
/// published; returns how many rows it marked.
async fn mark(store: &CdcStore, target: &postbox::Target, token: uuid::Uuid, ids: &[i64]) -> u64 {
    store
        .events_mark_processed(&postbox::store::MarkProcessedParams {
            target,
            claim_token: token,
            ids,
        })
        .await
        .unwrap()
}

/// A tenant's ids come from a sequence of its own, so a tenant's event can have the id of an
/// event the slot delivered: its mark must not let the slot pass the default schema's event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_mark_never_confirms_the_default_schemas_event_of_the_same_id() {
    use postbox::ops::StoreOps;
    let db = TestDb::new().await;
    let (store, default) = by_hand(&db, Duration::from_secs(3600)).await;
    let tenant = PgStore::new(db.pool().clone())
        .tenant_add(&postbox::store::TenantAddParams {
            id: &postbox::schema::TenantId::new("acme").unwrap(),
            schema: None,
        })
        .await
        .unwrap();
    let id = insert(db.pool(), "Placed", "a").await;
    wait_until("the slot named it", PATIENCE, || async {
        store.status().unrecorded == 1
    })
    .await;
    let tenants_id: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {}.outbox_events (event_type, aggregate_type, aggregate_id, payload) \
         VALUES ('Placed', 'Order', 't', '{{}}') RETURNING id",
        tenant.schema.quoted()
    )))
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(tenants_id, id, "each outbox numbers its own events");
    let target = tenant.target();
    let claimed = store.events_claim(&round(&target)).await.unwrap();
    assert_eq!(claimed.events.len(), 1);
    assert_eq!(
        mark(&store, &target, claimed.claim_token, &[tenants_id]).await,
        1
    );
    let status = store.status();
    assert_eq!(
        status.unrecorded, 1,
        "the default schema's event {id} is still unrecorded"
    );
    assert!(status.confirmed_lsn < status.received_lsn);
    // The default schema's own mark lets the slot pass it.
    let read = store.events_claim(&round(&default)).await.unwrap();
    assert_eq!(read.events.len(), 1);
    assert_eq!(mark(&store, &default, read.claim_token, &[id]).await, 1);
    let status = store.status();
    assert_eq!(status.unrecorded, 0);
    assert_eq!(status.confirmed_lsn, status.received_lsn);
}

/// From now on every mark of an event as `PROCESSED` fails, as on a full disk.
async fn refuse_marks(pool: &PgPool) {
    pool.execute(
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN RAISE EXCEPTION 'could not extend file: No space left on device'; END $$; \
         CREATE TRIGGER refuse BEFORE UPDATE ON outbox_events FOR EACH ROW \
         WHEN (NEW.status = 'PROCESSED') EXECUTE FUNCTION refuse()",
    )
    .await
    .unwrap();
}

/// Marks work again ([`refuse_marks`]).
async fn allow_marks(pool: &PgPool) {
    pool.execute("DROP TRIGGER refuse ON outbox_events")
        .await
        .unwrap();
}

/// A mark that fails for good (a constraint, a full disk) is no outcome: the slot's position
/// stays before the event, no poll of the relay waits for the read's outcome, and once marks
/// work again the polling claim publishes the event and records it, and the slot passes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mark_that_fails_for_good_never_lets_the_slot_pass_the_event() {
    let db = TestDb::new().await;
    let (store, target) = by_hand(&db, Duration::from_secs(2)).await;
    // The first claim polls (none ran yet): done before the event, it is read from the slot.
    assert!(
        store
            .events_claim(&round(&target))
            .await
            .unwrap()
            .events
            .is_empty()
    );
    refuse_marks(db.pool()).await;
    let id = insert(db.pool(), "Placed", "a").await;
    wait_until("the slot named it", PATIENCE, || async {
        store.status().unrecorded == 1
    })
    .await;
    let read = wait_until("the slot's event is read", PATIENCE, || async {
        let read = store.events_claim(&round(&target)).await.unwrap();
        (!read.events.is_empty()).then_some(read)
    })
    .await;
    assert_eq!(read.events[0].id, id);
    let failed = store
        .events_mark_processed(&postbox::store::MarkProcessedParams {
            target: &target,
            claim_token: read.claim_token,
            ids: &[id],
        })
        .await;
    assert!(failed.is_err(), "the mark is refused");
    let status = store.status();
    assert_eq!(status.unrecorded, 1, "a failed mark is no outcome");
    assert!(status.confirmed_lsn < status.received_lsn);
    allow_marks(db.pool()).await;
    // The relay gave up on that mark: the row is PENDING, and the poll publishes it itself.
    let polled = wait_until("the poll takes the event", PATIENCE, || async {
        let polled = store.events_claim(&round(&target)).await.unwrap();
        (!polled.events.is_empty()).then_some(polled)
    })
    .await;
    assert_eq!(polled.events[0].id, id);
    assert_eq!(mark(&store, &target, polled.claim_token, &[id]).await, 1);
    let status = store.status();
    assert_eq!(status.unrecorded, 0);
    assert_eq!(status.confirmed_lsn, status.received_lsn);
}

/// The WAL the server keeps for a slot is more than how far its confirmation trails: its
/// `restart_lsn` cannot pass a transaction that was open when the slot last moved. With one
/// producer transaction held open while another table takes 40 MB of writes, the store reports
/// both figures and names the transaction that holds the WAL; once it ends, the WAL goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_kept_behind_an_open_transaction_is_reported_with_the_transaction() {
    use postbox::ops::StoreOps;
    const MIB: i64 = 1024 * 1024;
    let db = TestDb::new().await;
    let store = cdc(
        &db,
        CdcConfig::default().heartbeat(Duration::from_millis(100)),
    )
    .await;
    wait_until("the slot is read", PATIENCE, || async {
        store.status().streaming
    })
    .await;
    db.pool()
        .execute("CREATE TABLE churn (id bigint, pad text)")
        .await
        .unwrap();
    let mut held = db.pool().begin().await.unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *held)
        .await
        .unwrap();
    (&mut *held)
        .execute("INSERT INTO churn VALUES (0, 'held open')")
        .await
        .unwrap();
    db.pool()
        .execute("INSERT INTO churn SELECT g, repeat('x', 1000) FROM generate_series(1, 40000) g")
        .await
        .unwrap();
    // (On a busy server another transaction with an older xid is named at first, rightly: it
    // holds the WAL too, until it ends.)
    let slot = wait_until(
        "the slot's confirmation passed the churn, and the transaction holds what it keeps",
        Duration::from_secs(60),
        || async {
            let slots = store.replication_slots().await.unwrap();
            slots
                .into_iter()
                .find(|s| s.pinned_by.as_ref().is_some_and(|p| p.pid == pid))
        },
    )
    .await;
    let (kept, lag) = (slot.kept_bytes.unwrap(), slot.lag_bytes.unwrap());
    assert!(kept > lag + 16 * MIB, "kept {kept} B, behind {lag} B");
    let pin = slot.pinned_by.unwrap();
    assert_eq!(pin.state.as_deref(), Some("idle in transaction"));
    held.rollback().await.unwrap();
    wait_until("the WAL is let go", Duration::from_secs(60), || async {
        // A checkpoint writes the running transactions to the WAL: the slot's reader learns
        // that the held one ended.
        db.pool().execute("CHECKPOINT").await.unwrap();
        let slots = store.replication_slots().await.unwrap();
        slots
            .into_iter()
            .find(|s| s.pinned_by.is_none() && s.kept_bytes.is_some_and(|k| k < 16 * MIB))
    })
    .await;
}

/// A confirmed position that stands still while the server's WAL grows (every mark refused)
/// is found: `CdcStatus::stalled` and the readiness check say so, and stop saying it once
/// the events are recorded and the position moves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_whose_confirmation_stands_still_while_wal_grows_is_reported_stalled() {
    let db = TestDb::new().await;
    let config = CdcConfig::default()
        .heartbeat(Duration::from_millis(100))
        .lag_check(Duration::from_millis(100))
        .stall_after(Duration::from_secs(1))
        // No poll after the first: the event is read from the slot, and only the retries of its
        // mark can record it.
        .poll_interval(Duration::from_secs(3600));
    let store = cdc(&db, config).await;
    wait_until("the slot is read", PATIENCE, || async {
        store.status().streaming
    })
    .await;
    let check = store.stall_check();
    refuse_marks(db.pool()).await;
    let sink = RecordingSink::new();
    let relay = relay_with(&store, &sink, RelayConfig::default());
    let mut rounds = relay.rounds();
    let handle = relay.start();
    postbox_testkit::settled(&mut rounds, "the relay's first poll", PATIENCE).await;
    insert(db.pool(), "Placed", "a").await;
    wait_until("the slot is reported stalled", PATIENCE, || async {
        store.status().stalled
    })
    .await;
    let reason = check().expect("not ready while stalled");
    assert!(reason.contains("has not moved"), "{reason}");
    allow_marks(db.pool()).await;
    wait_until("the event is recorded", PATIENCE, || async {
        processed(db.pool()).await == 1
    })
    .await;
    wait_until("the slot moves again", PATIENCE, || async {
        !store.status().stalled
    })
    .await;
    assert_eq!(check(), None);
    handle.stop().await.unwrap();
}

/// A rolling deploy: a second CDC relay on the same slot (the new pod) waits for it as a
/// standby and leaves the slot's events to the relay that reads it — no event published twice
/// while both run (before, the standby polled every round and took a share of the traffic, each
/// also read by the other) — and takes the slot over, losing nothing, when that relay stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_cdc_relay_on_the_slot_waits_as_a_standby_and_takes_over() {
    let db = TestDb::new().await;
    let first = cdc(&db, CdcConfig::default()).await;
    wait_until("the slot is read", PATIENCE, || async {
        first.status().streaming
    })
    .await;
    let first_sink = RecordingSink::new();
    let first_relay = relay_with(&first, &first_sink, RelayConfig::default()).start();
    let second = Arc::new(
        CdcStore::start(
            PgStore::new(db.pool().clone()),
            db.url(),
            CdcConfig::default().slot(slot_name(&db)),
        )
        .await
        .unwrap(),
    );
    wait_until("the second relay is a standby", PATIENCE, || async {
        second.status().standby
    })
    .await;
    let second_sink = RecordingSink::new();
    let second_relay = relay_with(&second, &second_sink, RelayConfig::default()).start();
    let first_ids = insert_one_by_one(db.pool(), 300).await;
    wait_until("every event is published", PATIENCE, || async {
        processed(db.pool()).await == 300
    })
    .await;
    let both: Vec<i64> = (first_sink.published_ids().into_iter())
        .chain(second_sink.published_ids())
        .collect();
    let distinct: std::collections::HashSet<i64> = both.iter().copied().collect();
    assert!(first_ids.iter().all(|id| distinct.contains(id)));
    assert_eq!(
        both.len(),
        distinct.len(),
        "no event published twice while one relay reads and the other waits"
    );
    // The first relay goes (the old pod): the standby reads the slot and publishes what comes.
    first_relay.stop().await.unwrap();
    drop(first);
    wait_until("the standby reads the slot", PATIENCE, || async {
        second.status().streaming
    })
    .await;
    let later = insert_one_by_one(db.pool(), 20).await;
    wait_until("the new events are published", PATIENCE, || async {
        processed(db.pool()).await == 320
    })
    .await;
    let published: std::collections::HashSet<i64> =
        second_sink.published_ids().into_iter().collect();
    assert!(later.iter().all(|id| published.contains(id)));
    second_relay.stop().await.unwrap();
}

/// A standby that has waited a while (its tries of the slot 5 s apart by then) reads the slot
/// within a moment of the reader's stop: it looks every 100 ms whether the slot was let go.
/// (Before, it waited out its retry's backoff: up to 5 s without a publish after a handover.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_the_slot_over_within_a_moment_of_the_readers_stop() {
    let db = TestDb::new().await;
    let (first, _first_sink, first_relay) = running(&db, CdcConfig::default()).await;
    let second = Arc::new(
        CdcStore::start(
            PgStore::new(db.new_pool(4).await),
            db.url(),
            CdcConfig::default().slot(slot_name(&db)),
        )
        .await
        .unwrap(),
    );
    let second_sink = RecordingSink::new();
    let second_relay = relay(&second, &second_sink).start();
    // Tries at 0.1, 0.2, 0.4, 0.8, 1.6 and 3.2 s: the next ones 5 s apart.
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert!(second.status().standby);
    first_relay.stop().await.unwrap();
    drop(first);
    let stopped = std::time::Instant::now();
    wait_until("the standby reads the slot", PATIENCE, || async {
        second.status().streaming
    })
    .await;
    let took = stopped.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "the standby took {took:?} to read the slot after the reader stopped"
    );
    let id = insert(db.pool(), "Placed", "o-1").await;
    wait_until("the new reader publishes", PATIENCE, || async {
        second_sink.published_ids().contains(&id)
    })
    .await;
    second_relay.stop().await.unwrap();
}

/// A rolling deploy's new pod starts its CDC relay while the old one is publishing events it
/// read (unclaimed, still `PENDING` in the table): the new relay is a standby from its first
/// claim and takes none of them. (Before, it polled until its reader had found the slot held,
/// and published the events in flight a second time: the seeded CDC tier's seed 5000075.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cdc_relay_started_beside_a_reading_one_takes_none_of_its_events_in_flight() {
    let db = TestDb::new().await;
    let (first, first_sink, first_relay) = running(&db, CdcConfig::default()).await;
    first_sink.script("Placed", Behaviour::Slow(Duration::from_millis(1500)));
    let ids = insert_one_by_one(db.pool(), 20).await;
    wait_until("the events are in flight", PATIENCE, || async {
        first.status().unrecorded == 20
    })
    .await;
    // As the binary starts it: the store, then the relay at once.
    let second = Arc::new(
        CdcStore::start(
            PgStore::new(db.new_pool(4).await),
            db.url(),
            CdcConfig::default().slot(slot_name(&db)),
        )
        .await
        .unwrap(),
    );
    let second_sink = RecordingSink::new();
    let second_relay = relay(&second, &second_sink).start();
    wait_until("every event is published", PATIENCE, || async {
        processed(db.pool()).await == 20
    })
    .await;
    assert!(
        second.status().standby,
        "the second relay waits as a standby"
    );
    assert_eq!(
        second_sink.published_ids(),
        Vec::<i64>::new(),
        "the standby took none of the events the reading relay had in flight"
    );
    let published: std::collections::HashSet<i64> =
        first_sink.published_ids().into_iter().collect();
    assert!(ids.iter().all(|id| published.contains(id)));
    second_relay.stop().await.unwrap();
    first_relay.stop().await.unwrap();
}

/// Inserts `n` events, each in a transaction of its own, as a service commits them.
async fn insert_one_by_one(pool: &PgPool, n: usize) -> Vec<i64> {
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        ids.push(insert(pool, "Placed", &format!("o-{i}")).await);
    }
    ids
}

/// Adds tenant `id` (its schema made and migrated) to the registry.
async fn add_tenant(pool: &PgPool, id: &str) -> postbox::schema::Tenant {
    use postbox::ops::StoreOps;
    PgStore::new(pool.clone())
        .tenant_add(&postbox::store::TenantAddParams {
            id: &postbox::schema::TenantId::new(id).unwrap(),
            schema: None,
        })
        .await
        .unwrap()
}

/// One event of `event_type` committed on its own in the outbox of `schema`.
async fn insert_into(pool: &PgPool, schema: &postbox::SchemaName, event_type: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {}.outbox_events (event_type, aggregate_type, aggregate_id, payload) \
         VALUES ($1, 'Order', 'o-1', '{{}}') RETURNING id",
        schema.quoted()
    )))
    .bind(event_type)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The schemas whose outbox table the relay's publication holds.
async fn published_schemas(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT schemaname::text FROM pg_publication_tables \
         WHERE pubname = 'postbox_outbox' AND tablename = 'outbox_events' ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Events of `schema`'s outbox marked PROCESSED without ever being claimed (read from the slot).
async fn read_unclaimed(pool: &PgPool, schema: &postbox::SchemaName) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {}.outbox_events WHERE status = 'PROCESSED' AND claim_token IS NULL",
        schema.quoted()
    )))
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Every active tenant's outbox is read from the slot as the default schema's is: a tenant
/// added before the relay starts and one added while it runs join the publication (within
/// two seconds), and their events, committed one by one, are published without a claim, each
/// once — ids equal across outboxes and told apart. A suspended tenant's table leaves the
/// publication; resumed, it joins again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_active_tenants_outbox_is_read_from_the_slot() {
    use postbox::ops::StoreOps;
    let db = TestDb::new().await;
    postbox::migrate(&PgStore::new(db.pool().clone()))
        .await
        .unwrap();
    let acme = add_tenant(db.pool(), "acme").await;
    let store = cdc(&db, CdcConfig::default()).await;
    let sink = RecordingSink::new();
    let handle = relay_with(
        &store,
        &sink,
        RelayConfig::default().tenant_refresh(Duration::from_millis(200)),
    )
    .start();
    wait_until("the slot is read", PATIENCE, || async {
        store.status().streaming
    })
    .await;
    let beta = add_tenant(db.pool(), "beta").await;
    wait_until("both tenants are in the publication", PATIENCE, || async {
        published_schemas(db.pool()).await == ["public", acme.schema.as_str(), beta.schema.as_str()]
    })
    .await;
    let public = postbox::SchemaName::public();
    let outboxes = [
        (&public, "Default"),
        (&acme.schema, "Acme"),
        (&beta.schema, "Beta"),
    ];
    let mut want: HashMap<&str, Vec<i64>> = HashMap::new();
    for _ in 0..30 {
        for (schema, event_type) in outboxes {
            let id = insert_into(db.pool(), schema, event_type).await;
            want.entry(event_type).or_default().push(id);
        }
    }
    assert_eq!(
        want["Acme"], want["Beta"],
        "each outbox numbers its own events"
    );
    wait_until("every event is published", PATIENCE, || async {
        sink.published().len() >= 90
    })
    .await;
    // Let a repeat, if any, show.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for (schema, event_type) in outboxes {
        let mut got: Vec<i64> = (sink.published().iter())
            .filter(|e| e.event_type == event_type)
            .map(|e| e.id)
            .collect();
        got.sort_unstable();
        assert_eq!(got, want[event_type], "{event_type}: each once");
        // A relay that polled the tenants' outboxes would mark none without a claim; the
        // relay's own polls (one a second per outbox) may take a few before the slot names
        // them.
        let unclaimed = read_unclaimed(db.pool(), schema).await;
        assert!(
            unclaimed >= 20,
            "{event_type}: {unclaimed} of 30 read from the slot"
        );
    }
    wait_until(
        "the slot is confirmed past every event",
        PATIENCE,
        || async {
            let status = store.status();
            status.unrecorded == 0 && status.confirmed_lsn == status.received_lsn
        },
    )
    .await;

    // Suspended: out of the publication, and its events wait in its table.
    let pg = PgStore::new(db.pool().clone());
    pg.tenant_set_status(&beta.id, postbox::schema::TenantStatus::Suspended)
        .await
        .unwrap();
    wait_until(
        "the suspended tenant leaves the publication",
        PATIENCE,
        || async { published_schemas(db.pool()).await == ["public", acme.schema.as_str()] },
    )
    .await;
    let waits = insert_into(db.pool(), &beta.schema, "Beta").await;
    pg.tenant_set_status(&beta.id, postbox::schema::TenantStatus::Active)
        .await
        .unwrap();
    wait_until(
        "the resumed tenant's event is published",
        PATIENCE,
        || async { sink.published_ids().contains(&waits) },
    )
    .await;
    wait_until(
        "the resumed tenant joins the publication again",
        PATIENCE,
        || async { published_schemas(db.pool()).await.len() == 3 },
    )
    .await;
    assert_eq!(sink.published().len(), 91, "nothing twice");
    handle.stop().await.unwrap();
}

/// A polling relay beside a CDC relay that reads a tenant's outbox from the slot leaves that
/// tenant's events to it, as it leaves the default schema's: none goes out twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_polling_relay_beside_a_cdc_relay_leaves_it_the_tenants_it_reads() {
    let db = TestDb::new().await;
    postbox::migrate(&PgStore::new(db.pool().clone()))
        .await
        .unwrap();
    let acme = add_tenant(db.pool(), "acme").await;
    let store = cdc(
        &db,
        CdcConfig::default().poll_interval(Duration::from_millis(100)),
    )
    .await;
    let fast_tenants = RelayConfig::default().tenant_refresh(Duration::from_millis(200));
    let cdc_sink = RecordingSink::new();
    let cdc_handle = relay_with(&store, &cdc_sink, fast_tenants.clone()).start();
    wait_until("the tenant is read from the slot", PATIENCE, || async {
        store.status().streaming && published_schemas(db.pool()).await.len() == 2
    })
    .await;
    let poll_sink = RecordingSink::new();
    let poller = Relay::from_parts(
        Arc::new(PgStore::new(db.pool().clone())) as Arc<dyn Store>,
        Arc::new(poll_sink.clone()),
        fast_tenants.poll_interval(Duration::from_millis(20)),
    )
    .unwrap()
    .start();
    let mut ids = Vec::new();
    for _ in 0..300 {
        ids.push(insert_into(db.pool(), &acme.schema, "Placed").await);
    }
    wait_until("every event is published", PATIENCE, || async {
        cdc_sink.published().len() + poll_sink.published().len() >= 300
    })
    .await;
    // Let a repeat, if any, show.
    tokio::time::sleep(Duration::from_millis(500)).await;
    cdc_handle.stop().await.unwrap();
    poller.stop().await.unwrap();
    let mut published = cdc_sink.published_ids();
    published.extend(poll_sink.published_ids());
    published.sort_unstable();
    let repeats = published.len() - 300;
    published.dedup();
    assert_eq!(published, ids, "every event published");
    assert_eq!(repeats, 0, "{repeats} of 300 published twice");
}
