//! Many tenants on one relay (PostgreSQL): a relay claims from the tenants something says have
//! work — a notification naming the tenant, a moved head, the due sweep — not from every tenant
//! at every wake-up; a wake-up that never comes is made good by the due sweep; tenants added,
//! suspended or dropped while it runs are served or cost nothing; and a publish that hangs holds
//! up only itself, in every tenant.

#![allow(
    clippy::unwrap_used,
    reason = "tests fail loudly on the first unexpected error"
)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::common::{Running, config, pg};
use postbox::ops::StoreOps;
use postbox::store::{Tenant, TenantAddParams, TenantStatus};
use postbox::{Event, PgStore, Relay, RelayConfig, SchemaName, schema::TenantId};
use postbox_testkit::{Behaviour, FaultyStore, RecordingSink, TestDb, wait_until};

async fn add_tenants(store: &PgStore, n: usize) -> Vec<Tenant> {
    let mut tenants = Vec::with_capacity(n);
    for i in 0..n {
        let id = TenantId::new(&format!("t{i}")).unwrap();
        tenants.push(
            store
                .tenant_add(&TenantAddParams {
                    id: &id,
                    schema: None,
                })
                .await
                .unwrap(),
        );
    }
    tenants
}

/// Inserts one event by plain SQL (no notification) into `schema`'s outbox; returns its id.
async fn insert_plain(db: &TestDb, schema: &SchemaName, event_type: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {}.outbox_events (event_type, payload) VALUES ($1, '{{}}') RETURNING id",
        schema.quoted()
    )))
    .bind(event_type)
    .fetch_one(db.pool())
    .await
    .unwrap()
}

/// Inserts an event of `event_type` into `schema` by plain SQL, waits (up to `patience`) until
/// `sink` has published it (`tenant`: its tenant, `None` for the default schema), and returns how
/// long that took.
async fn time_to_publish(
    db: &TestDb,
    sink: &RecordingSink,
    (schema, tenant): (&SchemaName, Option<&str>),
    event_type: &str,
    patience: Duration,
) -> Duration {
    let started = Instant::now();
    insert_plain(db, schema, event_type).await;
    wait_until("a plain-SQL event is published", patience, || async {
        published_of(sink, tenant, event_type) == 1
    })
    .await;
    started.elapsed()
}

/// Takes an `ACCESS EXCLUSIVE` lock on `schema`'s outbox table (what a `VACUUM FULL` or a
/// migration's `ALTER TABLE` holds), held until the transaction returned ends.
async fn lock_table(
    db: &TestDb,
    schema: &SchemaName,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut locker = db.pool().begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "LOCK TABLE {}.outbox_events IN ACCESS EXCLUSIVE MODE",
        schema.quoted()
    )))
    .execute(&mut *locker)
    .await
    .unwrap();
    locker
}

/// The status of event `id` in `schema`'s outbox.
async fn status_of(db: &TestDb, schema: &SchemaName, id: i64) -> String {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT status FROM {}.outbox_events WHERE id = $1",
        schema.quoted()
    )))
    .bind(id)
    .fetch_one(db.pool())
    .await
    .unwrap()
}

/// How many times `sink` published an event of `event_type` of `tenant` (`None`: the default
/// schema).
fn published_of(sink: &RecordingSink, tenant: Option<&str>, event_type: &str) -> usize {
    sink.published()
        .iter()
        .filter(|e| e.event_type == event_type && e.tenant.as_deref() == tenant)
        .count()
}

/// The claims each schema got, from `store`'s count.
fn claims(store: &FaultyStore) -> HashMap<SchemaName, u64> {
    store.claims_by_schema()
}

/// A notification names its tenant: the relay claims from that tenant, not from the 59 others;
/// and an idle relay claims from none of them while nothing happens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notification_is_claimed_in_its_tenant_alone() {
    let (db, store) = pg().await;
    let tenants = add_tenants(&store, 60).await;
    let faulty = FaultyStore::new(PgStore::new(db.pool().clone()));
    let sink = RecordingSink::new();
    let relay = Relay::new(faulty.clone(), sink.clone(), config()).unwrap();
    let mut relay = Running::start(relay);
    relay.settled("the start-up sweep").await;
    let before = claims(&faulty);
    // The relay is idle: its looks read heads and backlogs, and claim nothing.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(claims(&faulty), before, "an idle relay claimed");
    let t7 = &tenants[7];
    let outbox = db.outbox_builder().tenant(t7).build();
    crate::common::enqueue(
        &db,
        &outbox,
        vec![
            Event::new("Named", &serde_json::json!({}))
                .unwrap()
                .without_idempotency_key(),
        ],
    )
    .await;
    wait_until(
        "the notified event is published",
        Duration::from_secs(10),
        || async { published_of(&sink, Some("t7"), "Named") == 1 },
    )
    .await;
    let after = claims(&faulty);
    let claimed: Vec<&SchemaName> = after
        .iter()
        .filter(|(schema, n)| before.get(*schema) != Some(*n))
        .map(|(schema, _)| schema)
        .collect();
    assert_eq!(
        claimed,
        vec![&t7.schema],
        "only the named tenant was claimed from"
    );
    relay.stop().await;
}

/// A wake-up that never comes — a producer that does not notify, and a relay that does not
/// read heads — is made good by the due sweep: the event is published within a poll interval,
/// once, among 40 tenants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_wake_up_is_made_good_by_the_due_sweep() {
    let (db, store) = pg().await;
    let tenants = add_tenants(&store, 40).await;
    let sink = RecordingSink::new();
    let cfg = config()
        .notifications(false)
        .head_poll_interval(None)
        .busy_period(Duration::ZERO)
        .poll_interval(Duration::from_millis(500));
    let mut relay = Running::start(Relay::new(store, sink.clone(), cfg).unwrap());
    relay.settled("the start-up sweep").await;
    let took = time_to_publish(
        &db,
        &sink,
        (&tenants[33].schema, Some("t33")),
        "Unannounced",
        Duration::from_secs(10),
    )
    .await;
    assert!(
        took < Duration::from_secs(3),
        "{took:?}: the due sweep reads every tenant once per poll interval (500 ms)"
    );
    // The settled relay looked everywhere again: still once.
    relay.settled("a sweep after it").await;
    assert_eq!(published_of(&sink, Some("t33"), "Unannounced"), 1);
    relay.stop().await;
}

/// A tenant table locked for long (a `VACUUM FULL`) does not stop the due sweep: the sweep's
/// read of that tenant gives up on the lock after half a second, the sweep does not wait for
/// maintenance stuck on the lock (here the slow lane, which visits every tenant each 100 ms),
/// and what the other tenants committed unannounced is still found within a few poll intervals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_tenant_table_does_not_stop_the_due_sweep() {
    let (db, store) = pg().await;
    let tenants = add_tenants(&store, 40).await;
    let sink = RecordingSink::new();
    let cfg = config()
        .notifications(false)
        .head_poll_interval(None)
        .busy_period(Duration::ZERO)
        .poll_interval(Duration::from_millis(500))
        .dead_letter_retry_interval(Some(Duration::from_secs(1)));
    let mut relay = Running::start(Relay::new(store, sink.clone(), cfg).unwrap());
    relay.settled("the start-up sweep").await;
    let locker = lock_table(&db, &tenants[3].schema).await;
    // A sweep now waits for the lock, and so does the slow lane's run.
    tokio::time::sleep(Duration::from_millis(700)).await;
    for round in 0..2 {
        let event_type = format!("Unannounced{round}");
        let took = time_to_publish(
            &db,
            &sink,
            (&tenants[33].schema, Some("t33")),
            &event_type,
            Duration::from_secs(20),
        )
        .await;
        assert!(
            took < Duration::from_secs(5),
            "{took:?}: the due sweep waited for a locked tenant table"
        );
    }
    locker.commit().await.unwrap();
    relay.settled("a sweep after the lock").await;
    assert_eq!(published_of(&sink, Some("t33"), "Unannounced0"), 1);
    assert_eq!(published_of(&sink, Some("t33"), "Unannounced1"), 1);
    relay.stop().await;
}

/// Maintenance's statements on a locked table give up after their `lock_wait`, with the
/// database's lock-timeout error, instead of waiting for the lock (and holding the relay's one
/// background connection) as long as it is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_statements_give_a_locked_table_up_after_their_lock_wait() {
    let (db, store) = pg().await;
    let tenants = add_tenants(&store, 1).await;
    let target = postbox::Target {
        tenant: Some(tenants[0].id.clone()),
        schema: tenants[0].schema.clone(),
    };
    let locker = lock_table(&db, &target.schema).await;
    let wait = Some(Duration::from_millis(200));
    let gave_up = |what: &str, result: Result<postbox::Result<()>, tokio::time::error::Elapsed>| {
        let error = result
            .unwrap_or_else(|_| panic!("{what} waited for the lock"))
            .expect_err(what)
            .to_string();
        assert!(error.contains("lock timeout"), "{what}: {error}");
    };
    let patience = Duration::from_secs(5);
    let archive = postbox::store::ArchiveParams {
        target: &target,
        older_than: Duration::from_secs(86_400),
        after_id: 0,
        batch_size: 100,
        dry_run: false,
        lock_wait: wait,
    };
    gave_up(
        "archive",
        tokio::time::timeout(patience, async {
            store.events_archive(&archive).await.map(|_| ())
        })
        .await,
    );
    let slow_lane = postbox::store::SlowLaneParams {
        target: &target,
        after: Duration::from_secs(1),
        max_tries: 1,
        batch_size: 100,
        exclude: &[],
        lock_wait: wait,
    };
    gave_up(
        "slow lane",
        tokio::time::timeout(patience, async {
            store.events_retry_slow_lane(&slow_lane).await.map(|_| ())
        })
        .await,
    );
    locker.commit().await.unwrap();
    // Unlocked, the same statements go through.
    assert!(store.events_archive(&archive).await.unwrap().is_some());
    assert_eq!(store.events_retry_slow_lane(&slow_lane).await.unwrap(), 0);
}

/// A tenant table locked for long (a `VACUUM FULL`, a migration) holds up no other tenant's
/// maintenance: its retention and slow-lane statements give the table up after a second, the
/// due sweep and maintenance leave it alone for a while, and the other tenants' processed events
/// are archived and their `FAILED` events tried again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_tenant_table_holds_up_no_other_tenants_maintenance() {
    let (db, store) = pg().await;
    let tenants = add_tenants(&store, 10).await;
    let (old, failed) = (&tenants[7].schema, &tenants[8].schema);
    let archived = insert_plain(&db, old, "Old").await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE {}.outbox_events SET status = 'PROCESSED', processed_at = now(), \
         created_at = now() - interval '2 days' WHERE id = $1",
        old.quoted()
    )))
    .bind(archived)
    .execute(db.pool())
    .await
    .unwrap();
    let retried = insert_plain(&db, failed, "Failed").await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE {}.outbox_events SET status = 'FAILED', retry_count = max_retries, \
         last_error = 'boom', updated_at = now() - interval '1 hour' WHERE id = $1",
        failed.quoted()
    )))
    .bind(retried)
    .execute(db.pool())
    .await
    .unwrap();
    // Locked before the relay starts: its first retention run and slow-lane pass meet it (t3
    // comes before t7 and t8 in every pass).
    let locker = lock_table(&db, &tenants[3].schema).await;
    let sink = RecordingSink::new();
    // The due sweep (every poll_interval) gives the locked table up after 500 ms each time,
    // holding maintenance's connection meanwhile: at the default's pace, not the tests' 50 ms.
    let cfg = config()
        .poll_interval(Duration::from_secs(1))
        .retention(Some(Duration::from_secs(86_400)))
        .dead_letter_retry_interval(Some(Duration::from_secs(10)));
    let mut relay = Running::start(Relay::new(store, sink.clone(), cfg).unwrap());
    wait_until(
        "t7's processed event is archived while t3's table is locked",
        Duration::from_secs(10),
        || async {
            sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(format!(
                "SELECT count(*) FROM {}.outbox_events_archive WHERE id = $1",
                old.quoted()
            )))
            .bind(archived)
            .fetch_one(db.pool())
            .await
            .unwrap()
                == 1
        },
    )
    .await;
    wait_until(
        "t8's FAILED event gets its slow-lane try while t3's table is locked",
        Duration::from_secs(10),
        || async { published_of(&sink, Some("t8"), "Failed") == 1 },
    )
    .await;
    locker.commit().await.unwrap();
    relay.settled("a sweep after the lock").await;
    assert_eq!(published_of(&sink, Some("t8"), "Failed"), 1);
    assert_eq!(status_of(&db, failed, retried).await, "PROCESSED");
    relay.stop().await;
}

/// A relay restarted finds what was committed while it was down, in every tenant, at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_started_late_finds_what_every_tenant_committed_meanwhile() {
    let (db, store) = pg().await;
    let tenants = add_tenants(&store, 30).await;
    for t in tenants.iter().step_by(3) {
        insert_plain(&db, &t.schema, "WhileDown").await;
    }
    let sink = RecordingSink::new();
    let mut relay = Running::start(Relay::new(store, sink.clone(), config()).unwrap());
    wait_until(
        "every event committed while the relay was down is published",
        Duration::from_secs(10),
        || async { sink.published().len() == 10 },
    )
    .await;
    relay.settled("a sweep after them").await;
    assert_eq!(sink.published().len(), 10, "each once");
    relay.stop().await;
}

/// A tenant added while the relay runs is served, its first event found without a
/// notification; a suspended tenant and one whose schema was dropped by hand cost the relay no
/// claim; the others go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_added_suspended_and_dropped_while_the_relay_runs() {
    let (db, store) = pg().await;
    let tenants = add_tenants(&store, 3).await;
    let faulty = FaultyStore::new(PgStore::new(db.pool().clone()));
    let sink = RecordingSink::new();
    let mut relay = Running::start(Relay::new(faulty.clone(), sink.clone(), config()).unwrap());
    relay.settled("the start-up sweep").await;

    let late = store
        .tenant_add(&TenantAddParams {
            id: &TenantId::new("late").unwrap(),
            schema: None,
        })
        .await
        .unwrap();
    insert_plain(&db, &late.schema, "Late").await;
    wait_until(
        "the event of a tenant added while the relay runs is published",
        Duration::from_secs(10),
        || async { published_of(&sink, Some("late"), "Late") == 1 },
    )
    .await;

    store
        .tenant_set_status(&tenants[1].id, TenantStatus::Suspended)
        .await
        .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA {} CASCADE",
        tenants[2].schema.quoted()
    )))
    .execute(db.pool())
    .await
    .unwrap();
    // The registry is read every 100 ms; a few of them, and every look since.
    for _ in 0..3 {
        relay
            .settled("a sweep without the suspended and dropped tenants")
            .await;
    }
    let before = claims(&faulty);
    insert_plain(&db, &tenants[1].schema, "Waits").await;
    insert_plain(&db, &tenants[0].schema, "Served").await;
    wait_until(
        "the active tenant's event is published",
        Duration::from_secs(10),
        || async { published_of(&sink, Some("t0"), "Served") == 1 },
    )
    .await;
    for _ in 0..3 {
        relay.settled("sweeps over the tenants served").await;
    }
    let after = claims(&faulty);
    for t in [&tenants[1], &tenants[2]] {
        assert_eq!(
            after.get(&t.schema),
            before.get(&t.schema),
            "tenant {} ({:?}) was claimed from",
            t.id,
            t.status
        );
    }
    assert_eq!(published_of(&sink, Some("t1"), "Waits"), 0);
    assert_eq!(published_of(&sink, Some("late"), "Late"), 1, "once");
    relay.stop().await;
}

/// A publish that hangs holds up only itself, under light load, in every tenant: while one
/// event of tenant `a` hangs in its sink, events of `a`, of tenant `b` and of the default
/// schema, committed one by one, are each published within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_publish_holds_up_only_itself_in_every_tenant() {
    let (db, store) = pg().await;
    let tenants = add_tenants(&store, 2).await;
    let sink = RecordingSink::new();
    sink.script("Hang", Behaviour::Slow(Duration::from_secs(60)));
    let cfg: RelayConfig = config()
        .lease(Duration::from_secs(90))
        .publish_timeout(Duration::from_secs(80));
    let mut relay = Running::start(Relay::new(store, sink.clone(), cfg).unwrap());
    relay.settled("the start-up sweep").await;
    let hung = insert_plain(&db, &tenants[0].schema, "Hang").await;
    wait_until(
        "the hanging publish has begun",
        Duration::from_secs(10),
        || async { sink.attempts(hung) == 1 },
    )
    .await;
    let targets = [
        (Some("t0"), Some(&tenants[0].schema)),
        (Some("t1"), Some(&tenants[1].schema)),
        (None, None),
    ];
    for round in 0..3 {
        for (tenant, schema) in &targets {
            let started = Instant::now();
            let default = SchemaName::new("public").unwrap();
            let event_type = format!("Light{round}");
            insert_plain(&db, schema.unwrap_or(&default), &event_type).await;
            wait_until(
                "an event committed beside the hanging publish is published",
                Duration::from_secs(10),
                || async { published_of(&sink, *tenant, &event_type) == 1 },
            )
            .await;
            let took = started.elapsed();
            assert!(
                took < Duration::from_secs(1),
                "{took:?} for an event of {tenant:?} beside a hanging publish"
            );
        }
    }
    assert_eq!(
        published_of(&sink, Some("t0"), "Hang"),
        0,
        "the hanging publish is still hanging"
    );
    relay.abort();
}

/// A tenant whose outbox table is locked (a migration's `ALTER TABLE` waiting behind a long
/// query, `VACUUM FULL`, a `LOCK TABLE` in an operator's transaction) holds up only itself:
/// while a transaction holds `t0`'s table in ACCESS EXCLUSIVE mode, with an event of its own
/// written there, events of `t1` and of the default schema are each published within a couple
/// of seconds; once the lock is gone, `t0`'s event is published, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_tenant_table_holds_up_only_itself() {
    let (db, store) = pg().await;
    let tenants = add_tenants(&store, 2).await;
    let sink = RecordingSink::new();
    let mut relay = Running::start(Relay::new(store, sink.clone(), config()).unwrap());
    relay.settled("the start-up sweep").await;
    // The lock, and an event written under it: its id moves the table's head, so the relay
    // claims from the locked table.
    let mut locker = lock_table(&db, &tenants[0].schema).await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {}.outbox_events (event_type, payload) VALUES ('UnderLock', '{{}}')",
        tenants[0].schema.quoted()
    )))
    .execute(&mut *locker)
    .await
    .unwrap();
    // The relay's claims of t0 now wait for the lock.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let public = SchemaName::new("public").unwrap();
    for round in 0..3 {
        for (tenant, schema) in [(Some("t1"), &tenants[1].schema), (None, &public)] {
            let event_type = format!("Beside{round}");
            let took = time_to_publish(
                &db,
                &sink,
                (schema, tenant),
                &event_type,
                Duration::from_secs(20),
            )
            .await;
            assert!(
                took < Duration::from_secs(3),
                "{took:?} for an event of {tenant:?} beside a locked tenant table"
            );
        }
    }
    locker.commit().await.unwrap();
    wait_until(
        "the event written under the lock is published once the lock is gone",
        Duration::from_secs(20),
        || async { published_of(&sink, Some("t0"), "UnderLock") == 1 },
    )
    .await;
    relay.settled("a sweep after it").await;
    assert_eq!(published_of(&sink, Some("t0"), "UnderLock"), 1, "once");
    relay.stop().await;
}

/// A tenant table locked while its event publishes (a `VACUUM FULL` or a migration begun
/// meanwhile) holds up only that tenant: the event's failed try (here a publish that times out)
/// waits for the lock to be written, and the other tenants' and the default schema's events are
/// claimed, published and recorded meanwhile. Once the lock is gone, the try is written and the
/// event published again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_table_locked_while_its_event_publishes_holds_up_only_itself() {
    let (db, store) = pg().await;
    let tenants = add_tenants(&store, 2).await;
    let sink = RecordingSink::new();
    // Longer than the publish timeout (2 s): a failed try, written to the locked table.
    sink.script("Hangs", Behaviour::Slow(Duration::from_secs(60)));
    let mut relay = Running::start(Relay::new(store, sink.clone(), config()).unwrap());
    relay.settled("the start-up sweep").await;
    let hangs = insert_plain(&db, &tenants[0].schema, "Hangs").await;
    let t0 = tenants[0].schema.quoted();
    wait_until("the event is claimed", Duration::from_secs(20), || async {
        status_of(&db, &tenants[0].schema, hangs).await == "PROCESSING"
    })
    .await;
    let locker = lock_table(&db, &tenants[0].schema).await;
    // The publish times out and its try waits for the lock.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let public = SchemaName::new("public").unwrap();
    for round in 0..3 {
        for (tenant, schema) in [(Some("t1"), &tenants[1].schema), (None, &public)] {
            let event_type = format!("Beside{round}");
            let started = Instant::now();
            let id = insert_plain(&db, schema, &event_type).await;
            wait_until(
                "an event committed beside a locked tenant table is published and recorded",
                Duration::from_secs(20),
                || async { status_of(&db, schema, id).await == "PROCESSED" },
            )
            .await;
            let took = started.elapsed();
            assert!(
                took < Duration::from_secs(3),
                "{took:?} for an event of {tenant:?} beside a locked tenant table"
            );
            assert_eq!(published_of(&sink, tenant, &event_type), 1, "once");
        }
    }
    sink.unscript("Hangs");
    locker.commit().await.unwrap();
    wait_until(
        "the event whose try waited for the lock is published again and recorded",
        Duration::from_secs(30),
        || async { status_of(&db, &tenants[0].schema, hangs).await == "PROCESSED" },
    )
    .await;
    let retries: i32 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT retry_count FROM {t0}.outbox_events WHERE id = $1"
    )))
    .bind(hangs)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(retries, 1, "the timed-out try is counted once");
    relay.stop().await;
}

/// A quiet tenant's event does not wait for another tenant's backlog: while `t0` drains 3,000
/// events through a slow destination (each publish 200 ms, so its claims of up to 500 events,
/// two side by side, queue far more than the pipeline publishes at once), each event committed
/// into `t1` is claimed at once and published with the next free publish slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_tenants_event_does_not_wait_for_another_tenants_backlog() {
    let (db, store) = pg().await;
    let tenants = add_tenants(&store, 2).await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {}.outbox_events (event_type, payload)
         SELECT 'Bulk', jsonb_build_object('i', g) FROM generate_series(1, 3000) g",
        tenants[0].schema.quoted()
    )))
    .execute(db.pool())
    .await
    .unwrap();
    let sink = RecordingSink::new();
    sink.script("Bulk", Behaviour::Slow(Duration::from_millis(200)));
    let relay = Running::start(Relay::new(store, sink.clone(), config()).unwrap());
    // The backlog's claims have grown: a few waves of publishes are done.
    wait_until(
        "the backlog is draining",
        Duration::from_secs(30),
        || async { published_of(&sink, Some("t0"), "Bulk") >= 600 },
    )
    .await;
    let mut took = Vec::new();
    for round in 0..5 {
        let event_type = format!("Quiet{round}");
        took.push(
            time_to_publish(
                &db,
                &sink,
                (&tenants[1].schema, Some("t1")),
                &event_type,
                Duration::from_secs(20),
            )
            .await,
        );
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let backlog_left = 3000 - published_of(&sink, Some("t0"), "Bulk");
    assert!(
        backlog_left > 0,
        "the backlog drained before the quiet events were measured"
    );
    // Claimed at once, published with the next free slot (a backlog publish takes 200 ms).
    // Waiting behind the backlog's queued batches took 1–3 s each.
    let slowest = took.iter().max().copied().unwrap_or_default();
    assert!(
        slowest < Duration::from_millis(900),
        "a quiet tenant's events beside a backlog took {took:?}"
    );
    relay.abort();
}
