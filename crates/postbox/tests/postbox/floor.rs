//! Claims from a floor (PostgreSQL, migration `0008_claim.sql`): a relay takes new work from an
//! id below which every event is finished or went wrong once, so that its claims cost what the
//! batch costs even while a snapshot held open (a `pg_dump`, a long report) keeps every dead row
//! version a mark left behind — and the floor never passes an event that is still to be
//! published.

use std::time::Duration;

use crate::common::{Running, config, default_target, enqueue, events, pg, table_buffers};
use postbox::StoreExt;
use postbox::store::{ClaimParams, MarkProcessedParams};
use postbox::{PgStore, Relay, Store};
use postbox_testkit::{RecordingSink, TestDb, wait_until};
use sqlx::{Connection, Executor};

/// Buffers of the outbox one claim of 100 touches from `floor` (its work rolled back).
async fn claim_buffers(db: &TestDb, floor: i64) -> i64 {
    table_buffers(
        db,
        &format!(
            "SELECT * FROM postbox_claim(100, 30000, 'probe', gen_random_uuid(), ARRAY[]::text[],
                                         0, 'lease expired', {floor}, 0, false)"
        ),
    )
    .await
}

/// `events` pending events, written by plain SQL in one statement.
async fn insert_pending(db: &TestDb, events: i64) {
    sqlx::query(
        "INSERT INTO outbox_events (event_type, payload)
         SELECT 'InvoiceCreated', jsonb_build_object('i', g) FROM generate_series(1, $1) g",
    )
    .bind(events)
    .execute(db.pool())
    .await
    .expect("insert");
}

/// Waits (10 s at most) until `sink` has published `id`.
async fn published(sink: &RecordingSink, id: i64, what: &str) {
    wait_until(what, Duration::from_secs(10), || async {
        sink.published_ids().contains(&id)
    })
    .await;
}

/// The commit horizon of the default schema, once every transaction writing to it has ended.
async fn settled(store: &PgStore) -> i64 {
    let target = default_target();
    let probe = store.commit_horizon(&target, None).await.expect("probe");
    store
        .commit_horizon(&target, probe.probe.as_ref())
        .await
        .expect("horizon")
        .settled
        .expect("no writer is left")
}

#[tokio::test]
async fn claims_from_the_floor_do_not_walk_the_dead_rows_a_held_snapshot_keeps() {
    let (db, store) = pg().await;
    let events: i32 = 20_000;
    insert_pending(&db, events.into()).await;
    // A report that stays open: its snapshot keeps every row version the marks below replace.
    let mut report = sqlx::PgConnection::connect(db.url())
        .await
        .expect("connect");
    report
        .execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .await
        .expect("begin");
    report
        .execute("SELECT count(*) FROM outbox_events")
        .await
        .expect("snapshot");
    // Drained as a relay drains: each claim from the floor advanced since the last.
    let target = default_target();
    let mut floor = 0;
    loop {
        floor = store
            .claim_floor(&target, floor, settled(&store).await)
            .await
            .expect("floor");
        let claimed = store
            .events_claim(&ClaimParams {
                target: &target,
                batch_size: 100,
                lease: Duration::from_secs(30),
                relay_id: "r1",
                order: Default::default(),
                floor,
            })
            .await
            .expect("claim");
        if claimed.events.is_empty() {
            break;
        }
        let ids: Vec<i64> = claimed.events.iter().map(|e| e.id).collect();
        store
            .events_mark_processed(&MarkProcessedParams {
                target: &target,
                claim_token: claimed.claim_token,
                ids: &ids,
            })
            .await
            .expect("mark");
    }
    assert_eq!(
        crate::common::count(&db, "PROCESSED").await,
        i64::from(events)
    );
    insert_pending(&db, 100).await;
    let floor = store
        .claim_floor(&target, floor, settled(&store).await)
        .await
        .expect("floor");
    assert_eq!(floor, i64::from(events) + 1, "the floor is at the new work");
    let from_floor = claim_buffers(&db, floor).await;
    let from_start = claim_buffers(&db, 0).await;
    // From the start, the claim walks an index entry and a row version for each of the 20,000
    // events the snapshot keeps; from the floor, a batch's worth (taking a row writes its new
    // version and an entry in each of the indexes that hold it: about a dozen buffers).
    assert!(
        from_floor < 30 * 100,
        "a claim of 100 from the floor touched {from_floor} buffers"
    );
    assert!(
        from_start > 5 * from_floor,
        "the snapshot keeps the dead rows (from the start: {from_start} buffers, from the \
         floor: {from_floor}): without it this test shows nothing"
    );
    eprintln!("claim buffers: from the floor {from_floor}, from the start {from_start}");
    report.execute("ROLLBACK").await.expect("rollback");
}

/// Speed needs no opt-out of autovacuum's ANALYZE (migration `0009_ordered_heads` turns
/// it back on): a relay drains while `ANALYZE` of the outbox table
/// runs over and over — each holds a snapshot while it samples, which keeps the dead row
/// versions of the marks made meanwhile — and its claims from the floor still touch a batch's
/// worth of buffers, not the events processed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_drains_while_analyze_runs_and_its_claims_stay_a_batch_wide() {
    let (db, store) = pg().await;
    let events: i32 = 20_000;
    insert_pending(&db, events.into()).await;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let analyzer = tokio::spawn({
        let done = std::sync::Arc::clone(&done);
        let url = db.url().to_owned();
        async move {
            let mut conn = sqlx::PgConnection::connect(&url).await.expect("connect");
            let mut runs = 0_u32;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                conn.execute("ANALYZE outbox_events")
                    .await
                    .expect("analyze");
                runs += 1;
            }
            runs
        }
    });
    let sink = RecordingSink::new();
    let relay = Relay::new(PgStore::new(db.pool().clone()), sink.clone(), config()).expect("relay");
    relay.drain(std::future::pending()).await.expect("drain");
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let analyzed = analyzer.await.expect("analyzer");
    assert_eq!(
        crate::common::count(&db, "PROCESSED").await,
        i64::from(events)
    );
    assert_eq!(sink.published_ids().len(), 20_000);
    assert!(
        analyzed > 1,
        "ANALYZE ran {analyzed} time(s) during the drain: without it this test shows nothing"
    );
    // The statistics are fresh, and a claim from the floor reads a batch's worth.
    let reltuples: f32 =
        sqlx::query_scalar("SELECT reltuples FROM pg_class WHERE relname = 'outbox_events'")
            .fetch_one(db.pool())
            .await
            .expect("statistics");
    assert!(reltuples > 0.0, "ANALYZE counted the table's rows");
    insert_pending(&db, 100).await;
    let floor = store
        .claim_floor(&default_target(), 0, settled(&store).await)
        .await
        .expect("floor");
    assert_eq!(floor, i64::from(events) + 1, "the floor is at the new work");
    let from_floor = claim_buffers(&db, floor).await;
    eprintln!("claim buffers after a drain beside ANALYZE: {from_floor} ({analyzed} ANALYZE)");
    assert!(
        from_floor < 30 * 100,
        "a claim of 100 from the floor touched {from_floor} buffers"
    );
}

#[tokio::test]
async fn an_event_whose_transaction_commits_late_is_not_passed_by_the_floor() {
    let (db, store) = pg().await;
    let sink = RecordingSink::new();
    let relay = Running::start(Relay::new(store, sink.clone(), config()).expect("relay"));
    let outbox = PgStore::new(db.pool().clone()).outbox();
    // A transaction draws the lowest id and stays open while later ones commit and are
    // published: the relay's floor moves past them.
    let mut late = db.pool().begin().await.expect("begin");
    let late_id = outbox
        .enqueue(&mut *late, events("Late", 1).remove(0))
        .await
        .expect("enqueue")
        .id()
        .expect("inserted");
    let mut on_time = Vec::new();
    for _ in 0..5 {
        on_time.extend(enqueue(&db, &outbox, events("OnTime", 50)).await);
    }
    wait_until(
        "the events committed on time are published",
        Duration::from_secs(10),
        || async {
            let published = sink.published_ids();
            on_time.iter().all(|id| published.contains(id))
        },
    )
    .await;
    assert!(on_time.iter().all(|id| *id > late_id));
    late.commit().await.expect("commit");
    // Well before the relay's periodic sweep from the start (a minute): the floor stayed at or
    // below the commit horizon, so the late event is above it.
    published(&sink, late_id, "the late event is published").await;
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_runs_out_behind_a_relay_claiming_past_its_last_claim_is_taken_over() {
    let (db, store) = pg().await;
    let total: i64 = 20_000;
    insert_pending(&db, total).await;
    let first: i64 = sqlx::query_scalar("SELECT min(id) FROM outbox_events")
        .fetch_one(db.pool())
        .await
        .expect("min id");
    // A relay that crashed with 100 events claimed a little way in: its lease runs out after
    // the relay below has claimed past them from its cursor (its claims come back full).
    let target = default_target();
    let crashed = store
        .events_claim(&ClaimParams {
            target: &target,
            batch_size: 100,
            lease: Duration::from_secs(3),
            relay_id: "crashed",
            order: Default::default(),
            floor: first + 1_000,
        })
        .await
        .expect("claim");
    let held: Vec<i64> = crashed.events.iter().map(|e| e.id).collect();
    assert_eq!(held.len(), 100);
    let sink = RecordingSink::new();
    let relay = Running::start(Relay::new(store, sink.clone(), config()).expect("relay"));
    wait_until(
        "every event is published, the crashed relay's too",
        Duration::from_secs(60),
        || async { sink.published_ids().len() as i64 >= total },
    )
    .await;
    relay.stop().await;
    let published = sink.published_ids();
    assert!(held.iter().all(|id| published.contains(id)));
    let taken_over: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox_events
         WHERE id = ANY($1) AND status = 'PROCESSED' AND retry_count = 1
           AND last_error LIKE '%crashed%'",
    )
    .bind(&held)
    .fetch_one(db.pool())
    .await
    .expect("count");
    assert_eq!(
        taken_over, 100,
        "each held event is taken over once, as a failed try"
    );
    let unfinished: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox_events WHERE status <> 'PROCESSED'")
            .fetch_one(db.pool())
            .await
            .expect("count");
    assert_eq!(unfinished, 0);
}

#[tokio::test]
async fn an_outbox_of_the_previous_release_is_upgraded_while_its_relays_still_claim() {
    // The outbox as an earlier release left it: migrations 0001-0007 and their history (under
    // the names that release gave them), with events waiting.
    let db = TestDb::new().await;
    let previous = [
        (
            "outbox_0001_events",
            include_str!("../../sql/postgres/migrations/0001_outbox_events.sql"),
        ),
        (
            "outbox_0002_claim_function",
            include_str!("../../sql/postgres/migrations/0002_claim_function.sql"),
        ),
        (
            "outbox_0003_no_auto_analyze",
            include_str!("../../sql/postgres/migrations/0003_no_auto_analyze.sql"),
        ),
        (
            "outbox_0004_bounded_reads",
            include_str!("../../sql/postgres/migrations/0004_bounded_reads.sql"),
        ),
        (
            "outbox_0005_sql_enqueue",
            include_str!("../../sql/postgres/migrations/0005_sql_enqueue.sql"),
        ),
        (
            "outbox_0006_retention",
            include_str!("../../sql/postgres/migrations/0006_retention.sql"),
        ),
        (
            "outbox_0007_ordering",
            include_str!("../../sql/postgres/migrations/0007_ordering.sql"),
        ),
    ];
    let mut conn = db.pool().acquire().await.expect("connection");
    let history =
        include_str!("../../sql/postgres/queries/history_create.sql").replace("{schema}", "public");
    sqlx::raw_sql(sqlx::AssertSqlSafe(history))
        .execute(&mut *conn)
        .await
        .expect("history");
    for (name, sql) in previous {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.replace("{schema}", "\"public\"")))
            .execute(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        sqlx::query("INSERT INTO postbox_schema_history (name) VALUES ($1)")
            .bind(name)
            .execute(&mut *conn)
            .await
            .expect("record");
    }
    sqlx::query(
        "INSERT INTO outbox_events (event_type, payload)
         SELECT 'InvoiceCreated', '{}' FROM generate_series(1, 300)",
    )
    .execute(&mut *conn)
    .await
    .expect("insert");
    // A relay of the previous release holds a claim while the upgrade runs.
    let old_claim: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM postbox_claim(100, 30000, 'old-relay', gen_random_uuid())",
    )
    .fetch_all(&mut *conn)
    .await
    .expect("the previous release's claim");
    assert_eq!(old_claim.len(), 100);

    let store = PgStore::new(db.pool().clone());
    let applied = postbox::migrate(&store).await.expect("upgrade");
    let recorded: Vec<String> =
        sqlx::query_scalar("SELECT name FROM postbox_schema_history ORDER BY name")
            .fetch_all(&mut *conn)
            .await
            .expect("history");
    assert!(
        recorded.iter().all(|n| !n.starts_with("outbox_"))
            && recorded.iter().any(|n| n == "0001_outbox_events"),
        "the earlier release's records take their files' names: {recorded:?}"
    );
    assert!(
        !applied.iter().any(|a| a == "0001_outbox_events"),
        "a renamed record is not applied again: {applied:?}"
    );
    assert!(
        applied.iter().any(|a| a.ends_with("0008_claim"))
            && applied
                .iter()
                .any(|a| a.ends_with("outbox_events_retry_idx")),
        "{applied:?}"
    );
    let valid: bool = sqlx::query_scalar(
        "SELECT indisvalid FROM pg_index WHERE indexrelid = 'outbox_events_retry_idx'::regclass",
    )
    .fetch_one(&mut *conn)
    .await
    .expect("retry index");
    assert!(valid, "the retry index was built");
    // The previous release's claims still answer, beside this release's relays.
    let old_again: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM postbox_claim(50, 30000, 'old-relay', gen_random_uuid(), ARRAY[]::text[], 0)",
    )
    .fetch_all(&mut *conn)
    .await
    .expect("the previous release's ordered claim");
    assert_eq!(old_again.len(), 50);
    let sink = RecordingSink::new();
    let relay = Running::start(Relay::new(store, sink.clone(), config()).expect("relay"));
    wait_until(
        "the new relay publishes what no relay holds",
        Duration::from_secs(10),
        || async { sink.published_ids().len() == 150 },
    )
    .await;
    let published = sink.published_ids();
    assert!(
        old_claim
            .iter()
            .chain(&old_again)
            .all(|id| !published.contains(id)),
        "events the old relays hold are left to them"
    );
    relay.stop().await;
}

/// Index entries read from the polling index (`outbox_events_due_idx`) by every backend that
/// has reported its statistics: each entry a claim walks, a dead one included.
async fn due_index_reads(db: &TestDb) -> i64 {
    sqlx::query_scalar(
        "SELECT idx_tup_read FROM pg_stat_user_indexes
         WHERE schemaname = 'public' AND indexrelname = 'outbox_events_due_idx'",
    )
    .fetch_one(db.pool())
    .await
    .expect("index statistics")
}

/// A producer transaction that wrote one event with `outbox` and stays open: it, and the
/// event's id.
async fn hold_one(
    outbox: &postbox::Outbox,
    db: &TestDb,
) -> (sqlx::Transaction<'static, sqlx::Postgres>, i64) {
    let mut held = db.pool().begin().await.expect("begin");
    let id = outbox
        .enqueue(&mut *held, events("Held", 1).remove(0))
        .await
        .expect("enqueue")
        .id()
        .expect("inserted");
    (held, id)
}

/// A pool whose connections carry `name`, to know when they have gone (and reported).
async fn named_pool(db: &TestDb, name: &str) -> sqlx::PgPool {
    let options: sqlx::postgres::PgConnectOptions = db.url().parse().expect("url");
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options.application_name(name))
        .await
        .expect("connect")
}

/// The polling index entries read, once `pool` (named `name`) has closed: a backend reports its
/// statistics when it exits.
async fn reads_of(db: &TestDb, pool: sqlx::PgPool, name: &str) -> i64 {
    pool.close().await;
    wait_until(
        "the relay's connections have ended",
        Duration::from_secs(15),
        || async {
            let left: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
            )
            .bind(name)
            .fetch_one(db.pool())
            .await
            .expect("activity");
            left == 0
        },
    )
    .await;
    let last = std::sync::atomic::AtomicI64::new(-1);
    wait_until(
        "the relay's connections have reported their index reads",
        Duration::from_secs(15),
        || async {
            let now = due_index_reads(db).await;
            last.swap(now, std::sync::atomic::Ordering::Relaxed) == now
        },
    )
    .await;
    due_index_reads(db).await
}

/// A producer transaction held open keeps the commit horizon below its event, and keeps the
/// index entries of every event processed since (no backend may remove them while it runs).
/// The relay's floor and cursor go on past it (the ids read past the horizon, with the ones
/// not visible kept aside), so its claims read what they take, not every event done since the
/// transaction began; and the held event is published when it commits, at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_held_open_does_not_make_claims_walk_the_events_done_since_it_began() {
    let (db, _) = pg().await;
    let relay_pool = named_pool(&db, "postbox-held-open").await;
    let store = PgStore::new(relay_pool.clone());
    let sink = RecordingSink::new();
    // The due sweep's backlog probe walks the polling index from its head, through every entry
    // the held transaction keeps: once per poll interval, not per claim (what this test
    // counts). At the tests' 50 ms it would run some 80 times during the drain (the relay
    // looks on while its claims are under way); a second is still twenty times the default's
    // pace.
    let cfg = config().poll_interval(Duration::from_secs(1));
    let mut relay = Running::start(Relay::new(store, sink.clone(), cfg).expect("relay"));
    let outbox = PgStore::new(db.pool().clone()).outbox();
    let (held, held_id) = hold_one(&outbox, &db).await;
    let total = 20_000;
    for _ in 0..total / 200 {
        enqueue(&db, &outbox, events("Passing", 200)).await;
    }
    wait_until(
        "the events committed after the held one are published",
        Duration::from_secs(60),
        || async { sink.published_ids().len() >= total },
    )
    .await;
    // Idle rounds with the transaction still open: each claims from the floor.
    for _ in 0..5 {
        relay.settled("an idle round").await;
    }
    held.commit().await.expect("commit");
    published(
        &sink,
        held_id,
        "the held event is published once it commits",
    )
    .await;
    relay.stop().await;
    let reads = reads_of(&db, relay_pool, "postbox-held-open").await;
    eprintln!(
        "polling index entries read for {total} events with a transaction held open: {reads}"
    );
    // Each claim walking from the held event read every entry done since: about 100 per event
    // here (quadratic in the events passed). Past it: a few per event, as without the held
    // transaction (about 4 per event here, 7 with it).
    assert!(
        reads < 15 * total as i64,
        "claims read {reads} polling index entries for {total} events"
    );
    assert_eq!(sink.published_ids().len(), total + 1, "every event once");
}

/// The same transaction held open, and a relay that starts behind it: its first commit horizon
/// never settles, the table's first ids were removed (a hole the relay cannot tell from ids in
/// flight), and a backlog of 20,000 waits past the held event. The relay's floor and cursor go
/// on past both, keeping the ranges it passed, and the drain reads a few entries per event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_starts_behind_a_transaction_held_open_drains_past_it() {
    let (db, _) = pg().await;
    insert_pending(&db, 5_000).await;
    sqlx::query("DELETE FROM outbox_events")
        .execute(db.pool())
        .await
        .expect("delete");
    let outbox = PgStore::new(db.pool().clone()).outbox();
    let (held, held_id) = hold_one(&outbox, &db).await;
    let total = 20_000;
    insert_pending(&db, total).await;
    let relay_pool = named_pool(&db, "postbox-started-behind").await;
    let sink = RecordingSink::new();
    let relay = Relay::new(
        PgStore::new(relay_pool.clone()),
        sink.clone(),
        postbox::RelayConfig::default(),
    )
    .expect("relay");
    relay.drain(std::future::pending()).await.expect("drain");
    assert_eq!(sink.published_ids().len() as i64, total);
    held.commit().await.expect("commit");
    let relay = Running::start(
        Relay::new(PgStore::new(relay_pool.clone()), sink.clone(), config()).expect("relay"),
    );
    published(
        &sink,
        held_id,
        "the held event is published once it commits",
    )
    .await;
    relay.stop().await;
    let reads = reads_of(&db, relay_pool, "postbox-started-behind").await;
    eprintln!(
        "polling index entries read for a drain of {total} behind a held transaction: {reads}"
    );
    // Alone this reads about 10.5 entries per event; beside the whole suite up to 15.3 (what
    // the marks left is pruned later under load). A drain that walked from the held event at
    // each claim would read about 100 per event.
    assert!(
        reads < 20 * total,
        "the drain read {reads} polling index entries for {total} events"
    );
}

/// A relay that starts behind a transaction held open passes the ids below it as one range —
/// here three million ids (the table's first ids archived, say). That range is read again less
/// often the more ids it spans (every 30 s here, not every second: reading it costs what the
/// table lost, not the batch), and at once when the transaction ends and the horizon moves
/// into it: the held event is published when it commits, not when the range is next due.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_passed_range_is_read_again_rarely_and_at_once_when_the_horizon_reaches_it() {
    let (db, store) = pg().await;
    sqlx::query("SELECT setval(pg_get_serial_sequence('outbox_events', 'id'), 3000000)")
        .execute(db.pool())
        .await
        .expect("setval");
    let outbox = PgStore::new(db.pool().clone()).outbox();
    let (held, held_id) = hold_one(&outbox, &db).await;
    insert_pending(&db, 1_000).await;
    let faulty = postbox_testkit::FaultyStore::new(store);
    let sink = RecordingSink::new();
    let mut relay =
        Running::start(Relay::new(faulty.clone(), sink.clone(), config()).expect("relay"));
    wait_until(
        "the events committed after the held one are published",
        Duration::from_secs(30),
        || async { sink.published_ids().len() >= 1_000 },
    )
    .await;
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(4) {
        relay.settled("an idle round").await;
    }
    let long = |ranges: Vec<std::ops::RangeInclusive<i64>>| {
        ranges.into_iter().filter(|r| r.contains(&held_id)).count()
    };
    assert_eq!(
        long(faulty.passed_read()),
        0,
        "a range of 3,000,000 ids is not read again within 4 s of being passed"
    );
    held.commit().await.expect("commit");
    // Well before the range is next due (30 s after it was passed).
    published(
        &sink,
        held_id,
        "the held event is published once it commits",
    )
    .await;
    assert_eq!(
        long(faulty.passed_read()),
        1,
        "read again once, when the horizon reached it"
    );
    relay.stop().await;
    assert_eq!(sink.published_ids().len(), 1_001, "every event once");
}

/// 150,000 processed events, written past a transaction held open.
async fn history_past_the_held(db: &TestDb) {
    sqlx::query(
        "INSERT INTO outbox_events (event_type, payload, status, processed_at)
         SELECT 'InvoiceCreated', jsonb_build_object('i', g), 'PROCESSED', now()
         FROM generate_series(1, 150000) g",
    )
    .execute(db.pool())
    .await
    .expect("history");
}

/// The held transaction commits: its event is published, and every one of the 1,001 once.
async fn past_the_held_and_every_event_once(
    held: sqlx::Transaction<'static, sqlx::Postgres>,
    held_id: i64,
    sink: &RecordingSink,
    relay: Running,
) {
    held.commit().await.expect("commit");
    published(sink, held_id, "the held event is published once it commits").await;
    relay.stop().await;
    assert_eq!(sink.published_ids().len(), 1_001, "every event once");
}

/// A relay running when a transaction is held open, and a history written past it (150,000
/// processed events) with 1,000 events waiting after: the relay reads the ids present past the
/// horizon 20,000 at first, twice as many after each read that came back full, so that it is
/// past the history in four reads, not eight; after a read that came back short, 20,000 again.
/// The events waiting past the history are published, and the held one when it commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_past_a_held_transaction_double_while_they_come_back_full() {
    let (db, store) = pg().await;
    let faulty = postbox_testkit::FaultyStore::new(store);
    let sink = RecordingSink::new();
    let relay = Running::start(Relay::new(faulty.clone(), sink.clone(), config()).expect("relay"));
    let outbox = PgStore::new(db.pool().clone()).outbox();
    let (held, held_id) = hold_one(&outbox, &db).await;
    // The horizon is found stalled 100 ms after it stopped moving: the reads start then, in
    // the rounds that follow (idle or not), short while only the held event is there.
    wait_until(
        "the relay reads past the held transaction",
        Duration::from_secs(30),
        || async { !faulty.gap_limits().is_empty() },
    )
    .await;
    history_past_the_held(&db).await;
    insert_pending(&db, 1_000).await;
    wait_until(
        "the events committed after the history are published",
        Duration::from_secs(30),
        || async { sink.published_ids().len() >= 1_000 },
    )
    .await;
    let doubled = |limits: &[u32]| {
        let at = limits
            .windows(4)
            .position(|w| w == [20_000, 40_000, 80_000, 160_000]);
        at.is_some_and(|at| limits.len() > at + 5)
    };
    wait_until(
        "the relay is past the history",
        Duration::from_secs(30),
        || async { doubled(&faulty.gap_limits()) },
    )
    .await;
    let limits = faulty.gap_limits();
    let at = limits
        .windows(4)
        .position(|w| w == [20_000, 40_000, 80_000, 160_000])
        .expect("reads that double");
    assert!(
        limits[..at]
            .iter()
            .chain(&limits[at + 4..])
            .all(|&limit| limit == 20_000),
        "20,000 before the history and after a short read: {limits:?}"
    );
    past_the_held_and_every_event_once(held, held_id, &sink, relay).await;
}

/// A relay that starts behind a transaction held open, on a table with a history past it
/// (150,000 processed events committed after the held one): it asks how long that transaction
/// has been open, and before its first claim (which would otherwise walk the history's index
/// entries the transaction keeps) reads past it to the head of the id sequence at once, not in
/// reads that double with claims between them. The events waiting past the history are
/// published, and the held one when it commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_started_beside_a_transaction_open_for_long_reads_past_it_before_it_claims() {
    let (db, store) = pg().await;
    let outbox = PgStore::new(db.pool().clone()).outbox();
    let (held, held_id) = hold_one(&outbox, &db).await;
    history_past_the_held(&db).await;
    insert_pending(&db, 1_000).await;
    let faulty = postbox_testkit::FaultyStore::new(store);
    let sink = RecordingSink::new();
    let relay = Running::start(Relay::new(faulty.clone(), sink.clone(), config()).expect("relay"));
    wait_until(
        "the events committed after the history are published",
        Duration::from_secs(30),
        || async { sink.published_ids().len() >= 1_000 },
    )
    .await;
    assert_eq!(
        faulty.claims_before_gap_reads().first(),
        Some(&0),
        "the first read past the held transaction comes before the first claim"
    );
    let limits = faulty.gap_limits();
    assert!(
        limits.first().is_some_and(|&first| first >= 151_000),
        "the first read goes to the head of the sequence: {limits:?}"
    );
    past_the_held_and_every_event_once(held, held_id, &sink, relay).await;
}

/// A relay draining a backlog alone past a transaction held open knows the ids its claims took
/// are present: it reads the ids past the horizon where its claims went on past the ids it
/// knows (once, past the held event), not at every claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_that_take_every_id_in_their_range_need_no_read_past_the_horizon() {
    let (db, store) = pg().await;
    let outbox = PgStore::new(db.pool().clone()).outbox();
    let (held, held_id) = hold_one(&outbox, &db).await;
    let total = 30_000;
    insert_pending(&db, total).await;
    let faulty = postbox_testkit::FaultyStore::new(store);
    let sink = RecordingSink::new();
    let relay = Relay::new(faulty.clone(), sink.clone(), config()).expect("relay");
    relay.drain(std::future::pending()).await.expect("drain");
    assert_eq!(sink.published_ids().len() as i64, total);
    let claims = faulty.calls(postbox_testkit::StoreOp::Claim);
    let reads = faulty.gap_limits().len() as u64;
    eprintln!("{claims} claims, {reads} reads past the horizon");
    assert!(claims >= 20, "{claims} claims");
    assert!(
        reads * 5 <= claims,
        "{reads} reads past the horizon for {claims} claims"
    );
    held.commit().await.expect("commit");
    let relay = Running::start(Relay::new(faulty, sink.clone(), config()).expect("relay"));
    published(
        &sink,
        held_id,
        "the held event is published once it commits",
    )
    .await;
    relay.stop().await;
}

/// How long the writers of a commit-horizon probe have been open, as PostgreSQL tells it: at
/// least as long as the test held its transaction; nothing once it has ended.
#[tokio::test]
async fn the_age_of_a_probes_writers_is_how_long_they_have_been_open() {
    let (db, store) = pg().await;
    let outbox = PgStore::new(db.pool().clone()).outbox();
    let (held, _) = hold_one(&outbox, &db).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let horizon = store
        .commit_horizon(&default_target(), None)
        .await
        .expect("horizon");
    let probe = horizon
        .probe
        .expect("a probe waits for the held transaction");
    assert_eq!(probe.writers.len(), 1, "{probe:?}");
    let age = store
        .horizon_writers_age(&default_target(), &probe)
        .await
        .expect("age")
        .expect("the writer is open");
    assert!(
        age >= Duration::from_millis(300) && age < Duration::from_secs(60),
        "{age:?}"
    );
    held.rollback().await.expect("rollback");
    assert_eq!(
        store
            .horizon_writers_age(&default_target(), &probe)
            .await
            .expect("age"),
        None,
        "no writer of the probe is open"
    );
}

/// A drain beside a producer transaction held open, after an earlier drain marked 20,000
/// events the transaction keeps (their polling index entries stay): the relay reads its
/// backlog at the end of the drain from its floor and the ids it passed, not from the start of
/// the table through every one of those entries (twice, when nothing is claimable). What it
/// still reads of them is its start: the first sweep of its floor and the first look at the
/// backlog, both from the start (about 43,000 entries; 124,000 when the drain's ends read from
/// the start too). Every event is published, the held one once it commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_past_a_transaction_held_open_reads_its_backlog_from_its_floor() {
    let (db, _) = pg().await;
    let outbox = PgStore::new(db.pool().clone()).outbox();
    let (held, held_id) = hold_one(&outbox, &db).await;
    let history = 20_000;
    insert_pending(&db, history).await;
    let sink = RecordingSink::new();
    let first_pool = named_pool(&db, "postbox-drain-history").await;
    Relay::new(PgStore::new(first_pool.clone()), sink.clone(), config())
        .expect("relay")
        .drain(std::future::pending())
        .await
        .expect("first drain");
    assert_eq!(sink.published_ids().len() as i64, history);
    let before = reads_of(&db, first_pool, "postbox-drain-history").await;
    insert_pending(&db, 500).await;
    let relay_pool = named_pool(&db, "postbox-drain-floor").await;
    // Polling every 50 ms, the due sweep would read the backlog from the start now and then
    // beside the claims: once a minute, only the drain's own reads are counted.
    let cfg = config().poll_interval(Duration::from_secs(60));
    Relay::new(PgStore::new(relay_pool.clone()), sink.clone(), cfg)
        .expect("relay")
        .drain(std::future::pending())
        .await
        .expect("second drain");
    let reads = reads_of(&db, relay_pool, "postbox-drain-floor").await - before;
    eprintln!("polling index entries read by a drain of 500 past {history} kept: {reads}");
    assert_eq!(sink.published_ids().len() as i64, history + 500);
    assert!(
        reads < 3 * history,
        "the drain read {reads} polling index entries; {history} are kept by the held transaction"
    );
    held.commit().await.expect("commit");
    Relay::new(PgStore::new(db.pool().clone()), sink.clone(), config())
        .expect("relay")
        .drain(std::future::pending())
        .await
        .expect("third drain");
    assert!(sink.published_ids().contains(&held_id), "the held event");
    assert_eq!(
        sink.published_ids().len() as i64,
        history + 501,
        "every event once"
    );
}

/// A backlog read from a relay's floor sees past the floor every event still to do, below it
/// the ids the relay passed (looked up by id) and what went wrong (the retry index), and
/// nothing else below it.
#[tokio::test]
async fn a_backlog_read_from_the_floor_sees_the_passed_ids_and_the_retries_below_it() {
    let (db, store) = pg().await;
    insert_pending(&db, 3).await;
    let ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM outbox_events ORDER BY id")
        .fetch_all(db.pool())
        .await
        .expect("ids");
    let (a, b, c) = (ids[0], ids[1], ids[2]);
    let store = &store;
    let due = |floor: i64, passed: Vec<std::ops::RangeInclusive<i64>>| async move {
        store
            .backlog_from(
                &default_target(),
                &postbox::store::BacklogFrom { floor, passed },
            )
            .await
            .expect("backlog")
            .next_due_in
    };
    assert_eq!(due(0, vec![]).await, Some(Duration::ZERO), "from the start");
    assert_eq!(due(c, vec![]).await, Some(Duration::ZERO), "at the floor");
    assert_eq!(
        due(c + 1, vec![]).await,
        None,
        "below the floor: not looked at"
    );
    assert_eq!(
        due(c + 1, vec![a..=a]).await,
        Some(Duration::ZERO),
        "a passed id that is to do"
    );
    // b goes wrong and waits an hour for its retry; a and c are done.
    sqlx::query(
        "UPDATE outbox_events SET last_error = 'down', retry_count = 1,
                locked_until = now() + interval '1 hour'
         WHERE id = $1",
    )
    .bind(b)
    .execute(db.pool())
    .await
    .expect("retry");
    sqlx::query("UPDATE outbox_events SET status = 'PROCESSED' WHERE id = ANY($1)")
        .bind(vec![a, c])
        .execute(db.pool())
        .await
        .expect("processed");
    let retry = due(c + 1, vec![a..=a])
        .await
        .expect("the retry is outstanding");
    assert!(
        retry > Duration::from_secs(3500) && retry <= Duration::from_secs(3600),
        "{retry:?}"
    );
    sqlx::query(
        "UPDATE outbox_events SET locked_until = now() - interval '1 second' WHERE id = $1",
    )
    .bind(b)
    .execute(db.pool())
    .await
    .expect("due");
    assert_eq!(
        due(c + 1, vec![]).await,
        Some(Duration::ZERO),
        "the retry is due"
    );
}
