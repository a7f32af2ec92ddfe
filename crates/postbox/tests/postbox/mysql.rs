//! Relays on MySQL/MariaDB: what the store conformance suite cannot show with one store alone.
//! Several relays share one outbox while producers commit and roll back business transactions;
//! ordered aggregates wait for an earlier id's open transaction (the commit horizon, found from
//! the ids handed out and the row locks of those not yet committed). Needs MySQL 8.0+ or MariaDB 10.6+ on 127.0.0.1:3306
//! (`POSTBOX_TEST_MYSQL_URL`).

#![allow(clippy::unwrap_used, reason = "tests")]

use std::collections::HashMap;
use std::time::Duration;

use postbox::StoreExt;
use postbox::ops::StoreOps;
use postbox::store::Horizon;
use postbox::{Event, MySqlStore, Relay, RelayConfig, Store, backoff::Backoff};
use postbox_testkit::{Behaviour, RecordingSink, TestMySql, wait_until};
use tokio::sync::oneshot;

fn config() -> RelayConfig {
    RelayConfig::default()
        .batch_size(50)
        .poll_interval(Duration::from_millis(50))
        .lease(Duration::from_secs(5))
        .retry(Backoff {
            base: Duration::from_millis(5),
            cap: Duration::from_millis(20),
        })
        .publish_timeout(Duration::from_secs(2))
}

/// A relay running on its own task until stopped.
struct Running {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<postbox::Result<postbox::relay::RelayStats>>,
    rounds: postbox::relay::Rounds,
}

impl Running {
    fn start(relay: Relay) -> Running {
        let rounds = relay.rounds();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            relay
                .run(async move {
                    let _ = stopped.await;
                })
                .await
        });
        Running { stop, task, rounds }
    }

    /// Waits until the relay has finished a round begun now and is waiting for its next.
    async fn settled(&mut self, what: &str) {
        postbox_testkit::settled(&mut self.rounds, what, Duration::from_secs(10)).await;
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap().unwrap();
    }
}

async fn migrated() -> (TestMySql, MySqlStore) {
    let db = TestMySql::new().await;
    let store = db.store().await;
    postbox::migrate(&store).await.unwrap();
    sqlx::query("CREATE TABLE invoices (id BIGINT PRIMARY KEY, aggregate VARCHAR(20))")
        .execute(store.pool())
        .await
        .unwrap();
    (db, store)
}

/// Asks `store` for its commit horizon of `t`, from `from` on, until `done` holds for it;
/// returns that horizon. Panics after `within`, naming `what` and the last horizon.
async fn horizon_until(
    store: &MySqlStore,
    t: &postbox::Target,
    from: Horizon,
    what: &str,
    within: Duration,
    done: impl Fn(&Horizon) -> bool,
) -> Horizon {
    if done(&from) {
        return from;
    }
    let last = tokio::sync::Mutex::new(from);
    wait_until(what, within, || async {
        let mut last = last.lock().await;
        *last = store.commit_horizon(t, last.probe.as_ref()).await.unwrap();
        if done(&last) {
            Ok(last.clone())
        } else {
            Err(format!("{:?}", *last))
        }
    })
    .await
}

async fn processed(store: &MySqlStore) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox_events WHERE status = 'PROCESSED'")
        .fetch_one(store.pool())
        .await
        .unwrap()
}

/// A thousand events committed by one plain-SQL statement.
async fn insert_thousand(store: &MySqlStore) {
    sqlx::query(
        "INSERT INTO outbox_events (event_type, aggregate_type, aggregate_id, payload)
         WITH RECURSIVE s (n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < 1000)
         SELECT 'Bulk', 'Invoice', CAST(n AS CHAR), JSON_OBJECT('n', n) FROM s",
    )
    .execute(store.pool())
    .await
    .unwrap();
}

fn invoice(event_type: &str, aggregate: &str, n: u64) -> Event {
    Event::new(event_type, &serde_json::json!({ "n": n }))
        .unwrap()
        .aggregate("Invoice", aggregate)
        .without_idempotency_key()
}

/// Four producers write a business row and its event in one transaction each, linger a moment
/// (so that an aggregate's ids commit out of order), and roll back one in ten; three relays, each
/// with its own pool, publish through a sink that fails every event's first try. The consumer
/// gets exactly the committed events — none rolled back — and, per ordered aggregate, in id
/// order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_share_an_outbox_and_keep_each_aggregates_order() {
    let (db, store) = migrated().await;
    let sink = RecordingSink::new();
    sink.script("InvoiceChanged", Behaviour::FailTimes(1));
    let cfg = config().ordered_aggregate_types(["Invoice"]);
    let mut relays = Vec::new();
    for _ in 0..3 {
        let relay = Relay::new(db.store().await, sink.clone(), cfg.clone()).unwrap();
        relays.push(Running::start(relay));
    }
    let producers: Vec<_> = (0..4u64)
        .map(|p| {
            let pool = store.pool().clone();
            let outbox = store.outbox();
            tokio::spawn(async move {
                let mut committed = Vec::new();
                for i in 0..60u64 {
                    let aggregate = ((i * 7 + p * 3) % 15 + 1).to_string();
                    let mut tx = pool.begin().await.unwrap();
                    sqlx::query("INSERT INTO invoices (id, aggregate) VALUES (?, ?)")
                        .bind(i64::try_from(p * 1000 + i).unwrap())
                        .bind(&aggregate)
                        .execute(&mut *tx)
                        .await
                        .unwrap();
                    let id = outbox
                        .enqueue(&mut tx, invoice("InvoiceChanged", &aggregate, i))
                        .await
                        .unwrap()
                        .id()
                        .unwrap();
                    // 0-6 ms, the subject: later ids of the same aggregate commit first.
                    tokio::time::sleep(Duration::from_millis((p * 5 + i * 3) % 7)).await;
                    if i % 10 == 9 {
                        tx.rollback().await.unwrap();
                    } else {
                        tx.commit().await.unwrap();
                        committed.push(id);
                    }
                }
                committed
            })
        })
        .collect();
    let mut committed = Vec::new();
    for p in producers {
        committed.extend(p.await.unwrap());
    }
    assert_eq!(committed.len(), 4 * 54);
    wait_until(
        "every committed event is published",
        Duration::from_secs(60),
        || async { processed(&store).await == 4 * 54 },
    )
    .await;
    for r in relays {
        r.stop().await;
    }
    let published = sink.published();
    let mut per: HashMap<String, Vec<i64>> = HashMap::new();
    for e in &published {
        per.entry(e.aggregate_id.clone().unwrap())
            .or_default()
            .push(e.id);
    }
    for (aggregate, ids) in &per {
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "invoice {aggregate} out of order (or twice): {ids:?}"
        );
    }
    let mut delivered: Vec<i64> = published.iter().map(|e| e.id).collect();
    delivered.sort_unstable();
    committed.sort_unstable();
    assert_eq!(delivered, committed, "exactly the committed events, once");
    let business: i64 = sqlx::query_scalar("SELECT count(*) FROM invoices")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(business, 4 * 54, "every event has its business row");
}

/// Transaction A takes the lower id and commits last: nothing of its aggregate is published
/// while A is open, though the later event is committed; events of types not ordered flow; once
/// A commits, both go out in id order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_id_waits_for_an_earlier_open_transaction_on_mysql() {
    let (db, store) = migrated().await;
    let outbox = store.outbox();
    let sink = RecordingSink::new();
    let relay = Relay::new(
        db.store().await,
        sink.clone(),
        config().ordered_aggregate_types(["Invoice"]),
    )
    .unwrap();
    let mut running = Running::start(relay);

    let mut a = store.pool().begin().await.unwrap();
    let first = outbox
        .enqueue(&mut a, invoice("InvoiceCreated", "1", 0))
        .await
        .unwrap()
        .id()
        .unwrap();
    let mut b = store.pool().begin().await.unwrap();
    let second = outbox
        .enqueue(&mut b, invoice("InvoicePaid", "1", 1))
        .await
        .unwrap()
        .id()
        .unwrap();
    b.commit().await.unwrap();
    assert!(first < second);
    let mut c = store.pool().begin().await.unwrap();
    let unordered = Event::new("CustomerMoved", &serde_json::json!({}))
        .unwrap()
        .aggregate("Customer", "7")
        .without_idempotency_key();
    let unordered = outbox
        .enqueue(&mut c, unordered)
        .await
        .unwrap()
        .id()
        .unwrap();
    c.commit().await.unwrap();
    wait_until(
        "the event of a type not ordered is published",
        Duration::from_secs(10),
        || async { sink.published_ids().contains(&unordered) },
    )
    .await;
    // A relay that let the later event pass the open one would publish it in its next round,
    // or (a horizon that passed the open id) in a round once the horizon reads its ids: MySQL's
    // horizon checks an id only once it is 100 ms old. That wait is the subject here.
    running.settled("a round after the unordered event").await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    running
        .settled("a round with the horizon read past the open id")
        .await;
    assert!(
        !sink.published_ids().contains(&second),
        "nothing of invoice 1 while its first event's transaction is open"
    );
    a.commit().await.unwrap();
    wait_until(
        "invoice 1 is published",
        Duration::from_secs(10),
        || async {
            let ids = sink.published_ids();
            ids.contains(&first) && ids.contains(&second)
        },
    )
    .await;
    running.stop().await;
    let order: Vec<i64> = sink
        .published_ids()
        .into_iter()
        .filter(|id| *id == first || *id == second)
        .collect();
    assert_eq!(order, [first, second]);
}

/// URLs that name no database or cannot be read are refused naming `database_url`; the store
/// answers tenants with what they need. (The refusal of servers without `SKIP LOCKED` is the
/// version parser's unit test: no such server runs here.)
#[tokio::test]
async fn bad_urls_are_named_and_tenants_need_postgres() {
    let db = TestMySql::new().await;
    let err = postbox::connect("mysql://root@127.0.0.1:3306")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("names no database"), "{err}");
    let err = postbox::connect("mysql://root@127.0.0.1:notaport/x")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("database_url"), "{err}");
    let any = postbox::connect(db.url()).await.unwrap();
    assert_eq!(any.kind(), postbox::connect::DatabaseKind::MySql);
    assert!(
        any.tenant_list()
            .await
            .is_err_and(|e| e.to_string().contains("PostgreSQL"))
    );
}

/// The commit horizon stops right below the id of a transaction still open, past an id whose
/// transaction rolled back, and its probe names the transaction it waits for; once that commits,
/// every id is settled. (That an open id is never settled, and a committed one always is, is the
/// store conformance suite's, for every store.)
#[tokio::test]
async fn the_commit_horizon_names_the_open_transaction_it_stops_below() {
    let (_db, store) = migrated().await;
    let outbox = store.outbox();
    let t = postbox::Target::default_schema(store.default_schema());
    let horizon = store.commit_horizon(&t, None).await.unwrap();
    let mut rolled_back = store.pool().begin().await.unwrap();
    let gone = outbox
        .enqueue(&mut rolled_back, invoice("X", "1", 0))
        .await
        .unwrap()
        .id()
        .unwrap();
    rolled_back.rollback().await.unwrap();
    let mut open = store.pool().begin().await.unwrap();
    let held = outbox
        .enqueue(&mut open, invoice("X", "1", 1))
        .await
        .unwrap()
        .id()
        .unwrap();
    let mut committed = store.pool().begin().await.unwrap();
    let after = outbox
        .enqueue(&mut committed, invoice("X", "1", 2))
        .await
        .unwrap()
        .id()
        .unwrap();
    committed.commit().await.unwrap();
    assert!(gone < held && held < after);
    let horizon = horizon_until(
        &store,
        &t,
        horizon,
        &format!(
            "the horizon reaches {} (past the rolled-back id, below the open one)",
            held - 1
        ),
        Duration::from_secs(5),
        |h| h.settled == Some(held - 1),
    )
    .await;
    let waits_for = horizon.probe.as_ref().unwrap().writers.clone();
    assert_eq!(
        waits_for,
        [format!("the transaction that inserted id {held}")]
    );
    open.commit().await.unwrap();
    horizon_until(
        &store,
        &t,
        horizon,
        "every id is settled once it commits",
        Duration::from_secs(5),
        |h| h.settled >= Some(after),
    )
    .await;
}

/// A relay that starts while a producer transaction is open far behind the head — more than
/// 100,000 ids drawn and committed after it — does not settle past it: its first horizon is as
/// safe as the later ones (it used to take everything up to the head less 100,000 unchecked).
/// Once the transaction commits, the horizon passes the head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_starts_behind_an_open_transaction_waits_for_it() {
    let (db, store) = migrated().await;
    let outbox = store.outbox();
    let mut open = store.pool().begin().await.unwrap();
    let held = outbox
        .enqueue(&mut open, invoice("Held", "1", 0))
        .await
        .unwrap()
        .id()
        .unwrap();
    // 101,000 rows committed after it, by plain SQL, a thousand at a time.
    for _ in 0..101 {
        insert_thousand(&store).await;
    }
    let head: i64 = sqlx::query_scalar("SELECT MAX(id) FROM outbox_events")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert!(head - held > 100_000, "{held} {head}");

    // A relay's store, new: its first horizon, and the ones after it.
    let relay_store = db.store().await;
    let t = postbox::Target::default_schema(relay_store.default_schema());
    let mut horizon = relay_store.commit_horizon(&t, None).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    while tokio::time::Instant::now() < deadline {
        assert!(
            horizon.settled.is_none_or(|s| s < held),
            "settled past id {held}, which an open transaction holds: {horizon:?}"
        );
        // The subject is a period: for three seconds no horizon passes the open id. The horizon
        // checks ids read 100 ms before; asked every 20 ms, as a busy relay asks.
        tokio::time::sleep(Duration::from_millis(20)).await;
        horizon = relay_store
            .commit_horizon(&t, horizon.probe.as_ref())
            .await
            .unwrap();
    }
    assert_eq!(horizon.settled, Some(held - 1), "{horizon:?}");
    open.commit().await.unwrap();
    horizon_until(
        &relay_store,
        &t,
        horizon,
        "every id is settled once it commits",
        Duration::from_secs(10),
        |h| h.settled >= Some(head),
    )
    .await;
}

/// An outbox of the previous release (migration 0001 only), with events that went wrong there
/// (backing off, below everything still waiting) and a processed history, is migrated: the retry
/// column and its index are added without rewriting the table, `SELECT *` sees the table as
/// before, and a relay of this release — claiming new work from its floor — still finds the
/// events that went wrong below it and publishes every unfinished event once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_of_the_previous_release_is_upgraded_and_its_retries_still_found() {
    let db = TestMySql::new().await;
    let store = db.store().await;
    let pool = store.pool();
    for statement in [
        include_str!("../../sql/mysql/queries/history_create.sql"),
        include_str!("../../sql/mysql/migrations/0001_outbox_events.sql"),
    ] {
        sqlx::raw_sql(statement).execute(pool).await.unwrap();
    }
    sqlx::query(include_str!("../../sql/mysql/queries/history_record.sql"))
        .bind("0001_outbox_events")
        .execute(pool)
        .await
        .unwrap();
    for n in 1..=30 {
        sqlx::query(
            "INSERT INTO outbox_events (event_type, aggregate_type, aggregate_id, payload)
             VALUES ('Upgraded', 'Invoice', ?, JSON_OBJECT('n', ?))",
        )
        .bind(n.to_string())
        .bind(n)
        .execute(pool)
        .await
        .unwrap();
    }
    // 1–5 went wrong under the old release and are due again; 6–20 were published; 21–30 wait.
    sqlx::query(
        "UPDATE outbox_events SET retry_count = 1, last_error = 'broker down',
                locked_until = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND
         WHERE id <= 5",
    )
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE outbox_events SET status = 'PROCESSED', processed_at = UTC_TIMESTAMP(6)
         WHERE id BETWEEN 6 AND 20",
    )
    .execute(pool)
    .await
    .unwrap();

    async fn star_columns(pool: &sqlx::MySqlPool) -> usize {
        use sqlx::Row;
        sqlx::query("SELECT * FROM outbox_events LIMIT 1")
            .fetch_one(pool)
            .await
            .unwrap()
            .len()
    }
    let before = star_columns(pool).await;
    let applied = postbox::migrate(&store).await.unwrap();
    // The floor's two migrations, once, and whatever later releases added after them.
    assert!(
        applied.len() >= 2
            && applied[0].ends_with("0002_retry_due")
            && applied[1].ends_with("0003_retry_index")
            && applied[2..].iter().all(|m| !m.contains("retry")),
        "the migrations since 0001, once: {applied:?}"
    );
    let index: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM information_schema.STATISTICS
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox_events'
           AND INDEX_NAME = 'outbox_events_retry_idx'",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(index, 2, "the retry index on (retry_due, id)");
    let visible: Vec<String> = sqlx::query_scalar(
        "SELECT COLUMN_NAME FROM information_schema.COLUMNS
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox_events'
           AND EXTRA NOT LIKE '%INVISIBLE%'",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert!(
        !visible.iter().any(|c| c == "retry_due"),
        "the retry column is invisible to SELECT * and INSERT without a column list: {visible:?}"
    );
    assert_eq!(
        star_columns(pool).await,
        before,
        "SELECT * sees the table as before the upgrade"
    );

    let sink = RecordingSink::new();
    let relay = Running::start(Relay::new(db.store().await, sink.clone(), config()).unwrap());
    wait_until(
        "every unfinished event is published",
        Duration::from_secs(20),
        || async { sink.published().len() >= 15 },
    )
    .await;
    relay.stop().await;
    let mut ids = sink.published_ids();
    ids.sort_unstable();
    let want: Vec<i64> = (1..=5).chain(21..=30).collect();
    assert_eq!(
        ids, want,
        "the retried events below the floor and the waiting ones, once each"
    );
    assert_eq!(processed(&store).await, 30);
}

/// A producer transaction held open while 20,000 events commit after it, and one that rolls
/// back: the relay's floor and cursor go on past both (ids read past the commit horizon, the
/// ones not visible kept aside), every later event is published, and the held one is published
/// as soon as it commits — not at the relay's sweep from the start, a minute later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_held_open_is_passed_by_the_claims_and_published_when_it_commits() {
    let (db, store) = migrated().await;
    let sink = RecordingSink::new();
    let relay_store = db.store().await;
    let relay = Running::start(Relay::new(relay_store, sink.clone(), config()).unwrap());
    let outbox = store.outbox();
    let mut open = store.pool().begin().await.unwrap();
    let held = outbox
        .enqueue(&mut open, invoice("Held", "1", 0))
        .await
        .unwrap()
        .id()
        .unwrap();
    let mut rolled_back = store.pool().begin().await.unwrap();
    outbox
        .enqueue(&mut rolled_back, invoice("RolledBack", "2", 0))
        .await
        .unwrap();
    rolled_back.rollback().await.unwrap();
    for _ in 0..20 {
        insert_thousand(&store).await;
    }
    wait_until(
        "the events committed after the held one are published",
        Duration::from_secs(60),
        || async { sink.published_ids().len() >= 20_000 },
    )
    .await;
    open.commit().await.unwrap();
    wait_until(
        "the held event is published once it commits",
        Duration::from_secs(10),
        || async { sink.published_ids().contains(&held) },
    )
    .await;
    relay.stop().await;
    let published = sink.published_ids();
    assert_eq!(
        published.len(),
        20_001,
        "every committed event once, none rolled back"
    );
    assert_eq!(processed(&store).await, 20_001);
}

/// A dedup id is never handed out twice on MySQL/MariaDB either: `TRUNCATE TABLE outbox_events`
/// would restart the AUTO_INCREMENT counter, so that new events took the ids (the dedup ids) of
/// events already relayed; it is refused, the error naming the guard. Emptied by `DELETE`, the
/// table goes on from the ids it handed out.
#[tokio::test]
async fn a_truncate_that_would_hand_out_ids_again_is_refused_on_mysql() {
    let (_db, store) = migrated().await;
    insert_thousand(&store).await;
    let before: i64 = sqlx::query_scalar("SELECT max(id) FROM outbox_events")
        .fetch_one(store.pool())
        .await
        .unwrap();
    let err = sqlx::query("TRUNCATE TABLE outbox_events")
        .execute(store.pool())
        .await
        .expect_err("TRUNCATE refused");
    assert!(
        err.to_string().contains("postbox_truncate_guard"),
        "the error names what refuses it: {err}"
    );
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_events")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(left, 1000, "nothing was removed");
    sqlx::query("DELETE FROM outbox_events")
        .execute(store.pool())
        .await
        .unwrap();
    insert_thousand(&store).await;
    let after: i64 = sqlx::query_scalar("SELECT min(id) FROM outbox_events")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert!(
        after > before,
        "ids after the table was emptied ({after}…) follow the ones before ({before})"
    );
}
