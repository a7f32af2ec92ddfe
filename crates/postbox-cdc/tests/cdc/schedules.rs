//! The seeded CDC tier: random schedules of plain-SQL producers and of relays of every kind on
//! one outbox — CDC relays that read the slot's events unclaimed (the default), CDC relays that
//! claim each one (`claim`), and polling relays — checked after each schedule.
//!
//! A schedule is a list of steps run one after another: a producer begins, inserts an event of
//! one of a few aggregates (or many in one statement: one commit position for all), sets or
//! rolls back to a savepoint, commits, rolls back, holds its transaction open across later
//! steps, prepares it and later commits or rolls back the prepared transaction; a relay of
//! some kind starts (a second CDC relay waits as a standby), stops (a CDC relay that holds the
//! slot hands it over), or is killed mid-work; the slot is dropped from under its reader; the
//! server restarts (on a PostgreSQL of the test's own); time passes. One of the aggregates lives
//! in a tenant's outbox, the others in the default schema's: one slot serves both, and their
//! ids collide. In half of the schedules
//! the relays order aggregate type `Acct`, and in half of those the producers write to an
//! aggregate one at a time (its row lock, as applications hold it).
//!
//! After each schedule: every committed event published, none that rolled back, nothing left
//! `PENDING`, `PROCESSING` or `FAILED`; with ordering, never two publishes of one aggregate
//! under way at once, and with one writer at a time each aggregate's first deliveries in commit
//! order; repeats no more than what was in flight at the kills,
//! handovers, slot drops and restarts (counted just before each, plus one batch); and, looked
//! at before each of those and at the end, the slot's confirmed position never past a
//! transaction whose events are still pending and untouched (an independent test_decoding slot
//! tells where each commit ends).
//!
//! Seeded and replayable: a failure names its seed and prints the schedule;
//! `POSTBOX_CDC_SEED=N` runs that one schedule alone, `POSTBOX_CDC_SCHEDULES=N` sets how many
//! run (default 150; a tenth as many with server restarts).

use std::sync::Arc;
use std::time::Duration;

use postbox::backoff::Backoff;
use postbox::relay::RelayStats;
use postbox::{PgStore, Relay, RelayConfig, Store};
use postbox_cdc::{CdcConfig, CdcStore};
use postbox_testkit::ledger::{self, Ledger, Order};
use postbox_testkit::producers::{Producers, Settings, Step as P};
use postbox_testkit::{RecordingSink, TestDb, wait_until};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sqlx::{Connection, PgConnection, PgPool};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::unrecorded_behind_the_slot;

/// Producer connections in a schedule.
const PRODUCERS: usize = 3;
/// Aggregates a schedule's events belong to; the last one's events go into a tenant's outbox,
/// the others' into the default schema's.
const AGGREGATES: usize = 3;
/// Steps in a schedule (and as many again to end what is open).
const STEPS: usize = 30;
/// Relays running at once, at most.
const RELAYS: usize = 3;
/// The relays' batch size: what a relay may take between a look at what is in flight and a
/// kill.
const BATCH: u32 = 8;

/// What a relay reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A CDC relay as the binary starts it: the slot's events read and published unclaimed.
    Reads,
    /// A CDC relay that claims each event the slot delivers (`--cdc-claim`).
    Claims,
    /// A polling relay.
    Polls,
}

/// One step of a schedule.
#[derive(Clone, Debug)]
enum Step {
    /// A producer's step.
    Producer(P),
    Start(Kind),
    /// The relay at this index among those running stops cleanly.
    Stop(usize),
    /// The relay at this index among those running is killed mid-work.
    Kill(usize),
    /// An operator drops the slot from under its reader.
    DropSlot,
    /// The server restarts (`-m immediate` when true): open transactions roll back.
    RestartServer(bool),
    Pause(u64),
}

/// A schedule drawn from `seed`: whether the relays order `Acct`, whether producers write to an
/// aggregate one at a time, and the steps, drawn against a model of the producers and relays
/// so that each one is valid when it runs.
fn schedule(seed: u64, restarts: bool) -> (bool, bool, Vec<Step>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let ordered = rng.random_bool(0.5);
    let locks = ordered && rng.random_bool(0.5);
    let mut producers = Producers::new(Settings {
        producers: PRODUCERS,
        aggregates: AGGREGATES,
        locks,
        prepares: true,
        one_writer: false,
        many: true,
    });
    // The schedule starts with one CDC relay reading the slot.
    let mut relays = 1usize;
    let mut steps = vec![];
    let kind = |rng: &mut StdRng| match rng.random_range(0..3) {
        0 => Kind::Reads,
        1 => Kind::Claims,
        _ => Kind::Polls,
    };
    for _ in 0..STEPS {
        if rng.random_bool(0.15) {
            let step = match rng.random_range(0..8) {
                0 | 1 if relays < RELAYS => Step::Start(kind(&mut rng)),
                2 if relays > 0 => Step::Stop(rng.random_range(0..relays)),
                3 | 4 if relays > 0 => Step::Kill(rng.random_range(0..relays)),
                5 => Step::DropSlot,
                6 if restarts => Step::RestartServer(rng.random_bool(0.5)),
                _ => Step::Pause(rng.random_range(1..60)),
            };
            match step {
                Step::Start(_) => relays += 1,
                Step::Stop(_) | Step::Kill(_) => relays -= 1,
                Step::RestartServer(_) => producers.server_restarted(),
                _ => {}
            }
            steps.push(step);
        } else if let Some(step) = producers.next(&mut rng) {
            steps.push(Step::Producer(step));
        }
    }
    steps.extend(producers.end(&mut rng).into_iter().map(Step::Producer));
    if relays == 0 {
        steps.push(Step::Start(kind(&mut rng)));
    }
    (ordered, locks, steps)
}

/// The database a tier runs on.
struct Db {
    url: String,
    pool: PgPool,
    slot: String,
    /// A test_decoding slot beside the relays' own: where each commit ends.
    oracle: String,
    /// A server of the test's own that schedules restart.
    server: Option<postbox_testkit::cluster::Cluster>,
    /// The outboxes: the default schema's and a tenant's.
    schemas: [postbox::SchemaName; 2],
}

impl Db {
    async fn new(url: String, server: Option<postbox_testkit::cluster::Cluster>) -> Db {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(4)
            .connect(&url)
            .await
            .unwrap();
        postbox::migrate(&PgStore::new(pool.clone())).await.unwrap();
        let tenant = crate::add_tenant(&pool, "tier").await;
        let slot = format!("tier_{}", uuid::Uuid::new_v4().simple());
        let oracle = format!("{slot}_oracle");
        sqlx::query("SELECT pg_create_logical_replication_slot($1, 'test_decoding')")
            .bind(&oracle)
            .execute(&pool)
            .await
            .unwrap();
        Db {
            url,
            pool,
            slot,
            oracle,
            server,
            schemas: [postbox::SchemaName::public(), tenant.schema],
        }
    }

    /// The outbox aggregate `a`'s events go into.
    fn schema_of(&self, a: usize) -> &postbox::SchemaName {
        &self.schemas[usize::from(a == AGGREGATES - 1)]
    }

    /// Every event of both outboxes, for counting.
    fn all_events(&self) -> String {
        format!(
            "(SELECT status FROM {}.outbox_events UNION ALL SELECT status FROM {}.outbox_events) e",
            self.schemas[0].quoted(),
            self.schemas[1].quoted()
        )
    }

    /// Drops both slots, which would otherwise keep the server's WAL after the test.
    async fn drop_slots(&self) {
        for slot in [&self.slot, &self.oracle] {
            wait_until("a slot is dropped", Duration::from_secs(30), || async {
                sqlx::query_scalar::<_, i64>(
                    "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1 \
                     AND (active OR pg_drop_replication_slot(slot_name) IS NOT NULL)",
                )
                .bind(slot)
                .fetch_one(&self.pool)
                .await
                .is_ok_and(|n| n == 0)
            })
            .await;
        }
    }

    async fn wal_position(&self) -> i64 {
        sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint")
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    /// Events the relays hold: claimed, or delivered by a slot and not yet recorded.
    async fn in_flight(&self, relays: &Relays) -> usize {
        let processing: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM {} WHERE status = 'PROCESSING'",
            self.all_events()
        )))
        .fetch_one(&self.pool)
        .await
        .unwrap_or(0);
        let unrecorded: usize = relays
            .running
            .iter()
            .filter_map(|r| r.cdc.as_ref())
            .map(|s| s.status().unrecorded)
            .sum();
        usize::try_from(processing).unwrap_or(0) + unrecorded
    }
}

/// A relay running on a store of its own.
struct Running {
    kind: Kind,
    task: JoinHandle<postbox::Result<RelayStats>>,
    stop: watch::Sender<bool>,
    /// A CDC relay's store, to ask where its slot stands.
    cdc: Option<Arc<CdcStore>>,
}

struct Relays {
    running: Vec<Running>,
    sink: RecordingSink,
    /// Which relay published which id, in order.
    by: Arc<std::sync::Mutex<Vec<(String, i64)>>>,
    in_flight: Arc<InFlight>,
    started: usize,
    ordered: bool,
}

/// A relay's sink: the schedule's recording sink, noting which relay published, and each
/// aggregate's publishes in flight across all relays.
struct Tagged {
    all: RecordingSink,
    by: Arc<std::sync::Mutex<Vec<(String, i64)>>>,
    relay: String,
    in_flight: Arc<InFlight>,
}

/// Each aggregate's publishes under way, and the publishes that began while another of their
/// aggregate was under way (G6: never two events of an ordered aggregate in flight).
#[derive(Default)]
struct InFlight {
    now: std::sync::Mutex<std::collections::HashMap<String, Vec<i64>>>,
    overlaps: std::sync::Mutex<Vec<(String, i64, Vec<i64>)>>,
}

/// One publish under way; ended when dropped, also when its relay is killed mid-publish.
struct Publishing<'a> {
    in_flight: &'a InFlight,
    aggregate: String,
    id: i64,
}

impl Drop for Publishing<'_> {
    fn drop(&mut self) {
        let mut now = self.in_flight.now.lock().unwrap();
        if let Some(ids) = now.get_mut(&self.aggregate) {
            ids.retain(|id| *id != self.id);
        }
    }
}

impl InFlight {
    fn begin(&self, event: &postbox::OutboxEvent) -> Publishing<'_> {
        let aggregate = event.aggregate_id.clone().unwrap_or_default();
        let mut now = self.now.lock().unwrap();
        let ids = now.entry(aggregate.clone()).or_default();
        if !ids.is_empty() {
            let overlap = (aggregate.clone(), event.id, ids.clone());
            self.overlaps.lock().unwrap().push(overlap);
        }
        ids.push(event.id);
        Publishing {
            in_flight: self,
            aggregate,
            id: event.id,
        }
    }
}

#[async_trait::async_trait]
impl postbox::Sink for Tagged {
    async fn publish(&self, event: &postbox::OutboxEvent) -> Result<(), postbox::PublishError> {
        let _publishing = self.in_flight.begin(event);
        // A destination that takes a moment: publishes of one aggregate side by side overlap.
        tokio::time::sleep(Duration::from_millis(event.id.unsigned_abs() % 3)).await;
        self.all.publish(event).await?;
        self.by.lock().unwrap().push((self.relay.clone(), event.id));
        Ok(())
    }
}

impl Relays {
    fn config(&self) -> RelayConfig {
        let config = RelayConfig::default()
            .batch_size(BATCH)
            .poll_interval(Duration::from_millis(20))
            .busy_poll_interval(Duration::from_millis(5))
            .lease(Duration::from_secs(2))
            .publish_timeout(Duration::from_millis(500))
            .retry(Backoff {
                base: Duration::from_millis(10),
                cap: Duration::from_millis(50),
            });
        if self.ordered {
            config.ordered_aggregate_types(["Acct"])
        } else {
            config
        }
    }

    async fn start(&mut self, db: &Db, kind: Kind) {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(4)
            .connect(&db.url)
            .await
            .unwrap();
        let pg = PgStore::new(pool);
        let (store, cdc): (Arc<dyn Store>, _) = match kind {
            Kind::Polls => (Arc::new(pg), None),
            Kind::Reads | Kind::Claims => {
                let config = CdcConfig::default()
                    .slot(db.slot.clone())
                    .poll_interval(Duration::from_millis(100))
                    .claim(kind == Kind::Claims);
                let cdc = Arc::new(CdcStore::start(pg, &db.url, config).await.unwrap());
                (Arc::clone(&cdc) as Arc<dyn Store>, Some(cdc))
            }
        };
        self.started += 1;
        let sink = Tagged {
            all: self.sink.clone(),
            by: Arc::clone(&self.by),
            in_flight: Arc::clone(&self.in_flight),
            relay: format!("{kind:?} {}", self.started),
        };
        let relay = Relay::from_parts(store, Arc::new(sink), self.config()).unwrap();
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            relay
                .run(async move {
                    let _ = stopped.wait_for(|s| *s).await;
                })
                .await
        });
        self.running.push(Running {
            kind,
            task,
            stop,
            cdc,
        });
    }

    /// Stops relay `i` and waits for it to end cleanly.
    async fn stop(&mut self, i: usize) {
        let relay = self.running.remove(i);
        let _ = relay.stop.send(true);
        relay.task.await.unwrap().unwrap();
    }

    async fn stop_all(&mut self) {
        while !self.running.is_empty() {
            self.stop(self.running.len() - 1).await;
        }
    }

    /// A crash: the relay's task and its store are dropped wherever they are; its claims stay
    /// leased until they expire, its slot's position where it was last confirmed.
    async fn kill(&mut self, i: usize) {
        let relay = self.running.remove(i);
        relay.task.abort();
        let _ = relay.task.await;
    }
}

/// What a tier's schedules added up to, to show the checks had something to check.
#[derive(Debug, Default)]
struct Totals {
    committed: usize,
    repeats: usize,
    allowed: usize,
    /// Events of transactions the slot's confirmed position had passed, checked recorded.
    behind_the_slot: usize,
    kills: usize,
    slot_drops: usize,
}

/// Runs schedule `seed` on `db`; panics with the seed and the schedule when a guarantee does
/// not hold.
async fn run(seed: u64, db: &Db, name: &str, totals: &mut Totals) {
    let (ordered, locks, steps) = schedule(seed, db.server.is_some());
    let fail = |why: String| -> ! {
        panic!(
            "{name}, seed {seed} (ordered: {ordered}, one writer per aggregate: {locks}): {why}\n\
             schedule: {steps:?}"
        );
    };
    let mut relays = Relays {
        running: vec![],
        sink: RecordingSink::new(),
        by: Arc::default(),
        in_flight: Arc::default(),
        started: 0,
        ordered,
    };
    relays.start(db, Kind::Reads).await;
    let reading = || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND active)",
        )
        .bind(&db.slot)
        .fetch_one(&db.pool)
        .await
        .unwrap_or(false)
    };
    wait_until("the slot is read", Duration::from_secs(30), reading).await;
    // The tenant's outbox is in the publication (the reader adds it within seconds of the
    // first start): from here on the slot delivers its events too.
    wait_until(
        "the tenant's outbox is published",
        Duration::from_secs(30),
        || async { crate::published_schemas(&db.pool).await.len() == 2 },
    )
    .await;
    // Commits from here on are this schedule's; none may be passed unrecorded until the slot
    // is dropped (a new slot starts where the server is, and the poll claims what it missed).
    // With ordering, an event that waits behind another of its aggregate for longer than the
    // relay's rechecks is left in the table to the polling claim, and the position may pass it:
    // there the check is that each is published in the end.
    let since = db.wal_position().await;
    let mut slot_kept = !ordered;
    let mut allowed = 0usize;
    let mut producers: Vec<Producer> = (0..PRODUCERS).map(|_| Producer::Idle).collect();
    let mut ledger = Ledger::default();
    let mut behind_the_slot = 0;
    let check_slot = |slot_kept: bool| async move {
        if slot_kept {
            let schemas = [&db.schemas[0], &db.schemas[1]];
            unrecorded_behind_the_slot(&db.pool, &db.slot, &db.oracle, since, &schemas).await
        } else {
            Ok(0)
        }
    };
    for step in &steps {
        match *step {
            Step::Producer(P::Begin(p)) => {
                let mut conn = PgConnection::connect(&db.url).await.unwrap();
                sqlx::query("BEGIN").execute(&mut conn).await.unwrap();
                producers[p] = Producer::InTx {
                    conn,
                    inserted: vec![],
                    savepoint: None,
                };
            }
            Step::Producer(P::Insert(p, a) | P::InsertMany(p, a, _)) => {
                let Producer::InTx { conn, inserted, .. } = &mut producers[p] else {
                    fail(format!("{step:?} outside a transaction"));
                };
                let n = match *step {
                    Step::Producer(P::InsertMany(_, _, n)) => n,
                    _ => 1,
                };
                let tokens: Vec<u64> = (0..n).map(|_| ledger.token()).collect();
                // The schema is a validated name, quoted.
                let rows: Vec<(i64, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                    "INSERT INTO {}.outbox_events \
                     (event_type, aggregate_type, aggregate_id, payload) \
                     SELECT 'E', 'Acct', $1, jsonb_build_object('token', $2::bigint + g) \
                     FROM generate_series(0, $3 - 1) g ORDER BY g \
                     RETURNING id, (payload->>'token')::bigint",
                    db.schema_of(a).quoted()
                )))
                .bind(format!("{seed}-{a}"))
                .bind(i64::try_from(tokens[0]).unwrap())
                .bind(i64::try_from(n).unwrap())
                .fetch_all(&mut *conn)
                .await
                .unwrap();
                let mut rows = rows;
                rows.sort_unstable();
                for (id, token) in rows {
                    let token = u64::try_from(token).unwrap();
                    ledger.record(token, id);
                    inserted.push((token, a));
                }
            }
            Step::Producer(P::Savepoint(p)) => {
                let Producer::InTx {
                    conn,
                    inserted,
                    savepoint,
                } = &mut producers[p]
                else {
                    fail(format!("{step:?} outside a transaction"));
                };
                sqlx::query("SAVEPOINT s")
                    .execute(&mut *conn)
                    .await
                    .unwrap();
                *savepoint = Some(inserted.len());
            }
            Step::Producer(P::RollbackToSavepoint(p)) => {
                let Producer::InTx {
                    conn,
                    inserted,
                    savepoint,
                } = &mut producers[p]
                else {
                    fail(format!("{step:?} outside a transaction"));
                };
                sqlx::query("ROLLBACK TO SAVEPOINT s")
                    .execute(&mut *conn)
                    .await
                    .unwrap();
                let mark = savepoint.unwrap_or(inserted.len());
                ledger.roll_back(inserted.drain(mark..).map(|(token, _)| token));
            }
            Step::Producer(P::Commit(p) | P::Rollback(p)) => {
                let Producer::InTx {
                    mut conn, inserted, ..
                } = std::mem::replace(&mut producers[p], Producer::Idle)
                else {
                    fail(format!("{step:?} outside a transaction"));
                };
                let commit = matches!(step, Step::Producer(P::Commit(_)));
                sqlx::query(if commit { "COMMIT" } else { "ROLLBACK" })
                    .execute(&mut conn)
                    .await
                    .unwrap();
                ledger.end(inserted, commit);
            }
            Step::Producer(P::Prepare(p)) => {
                let Producer::InTx {
                    mut conn, inserted, ..
                } = std::mem::replace(&mut producers[p], Producer::Idle)
                else {
                    fail(format!("{step:?} outside a transaction"));
                };
                let gid = format!("cdc-{seed}-{p}-{}", uuid::Uuid::new_v4().simple());
                // The gid is made of digits and hex above: nothing to quote.
                sqlx::query(sqlx::AssertSqlSafe(format!("PREPARE TRANSACTION '{gid}'")))
                    .execute(&mut conn)
                    .await
                    .unwrap();
                producers[p] = Producer::Prepared { gid, inserted };
            }
            Step::Producer(P::CommitPrepared(p) | P::RollbackPrepared(p)) => {
                let Producer::Prepared { gid, inserted } =
                    std::mem::replace(&mut producers[p], Producer::Idle)
                else {
                    fail(format!("{step:?} without a prepared transaction"));
                };
                let commit = matches!(step, Step::Producer(P::CommitPrepared(_)));
                let verb = if commit { "COMMIT" } else { "ROLLBACK" };
                sqlx::query(sqlx::AssertSqlSafe(format!("{verb} PREPARED '{gid}'")))
                    .execute(&db.pool)
                    .await
                    .unwrap();
                ledger.end(inserted, commit);
            }
            Step::Start(kind) => relays.start(db, kind).await,
            Step::Stop(i) | Step::Kill(i) => {
                if relays.running[i].kind != Kind::Polls {
                    // A CDC relay that holds the slot hands it over: count it either way.
                    behind_the_slot += check_slot(slot_kept).await.unwrap_or_else(|why| fail(why));
                    allowed += db.in_flight(&relays).await + BATCH as usize;
                }
                if matches!(step, Step::Kill(_)) {
                    if relays.running[i].kind == Kind::Polls {
                        allowed += db.in_flight(&relays).await + BATCH as usize;
                    }
                    relays.kill(i).await;
                } else {
                    relays.stop(i).await;
                }
            }
            Step::DropSlot => {
                behind_the_slot += check_slot(slot_kept).await.unwrap_or_else(|why| fail(why));
                allowed += db.in_flight(&relays).await + BATCH as usize;
                slot_kept = false;
                sqlx::query(
                    "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
                     WHERE slot_name = $1 AND active_pid IS NOT NULL",
                )
                .bind(&db.slot)
                .execute(&db.pool)
                .await
                .unwrap();
                // The reader may come back first: then the slot stays, and this is a
                // reconnection.
                let _ = sqlx::query(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                     WHERE slot_name = $1 AND NOT active",
                )
                .bind(&db.slot)
                .execute(&db.pool)
                .await;
            }
            Step::RestartServer(immediate) => {
                behind_the_slot += check_slot(slot_kept).await.unwrap_or_else(|why| fail(why));
                allowed += db.in_flight(&relays).await + BATCH as usize;
                // Open transactions roll back; prepared ones stay.
                for producer in &mut producers {
                    if matches!(producer, Producer::InTx { .. })
                        && let Producer::InTx { inserted, .. } =
                            std::mem::replace(producer, Producer::Idle)
                    {
                        ledger.end(inserted, false);
                    }
                }
                let server = db.server.as_ref().unwrap();
                server
                    .restart(immediate, Duration::from_millis(100))
                    .await
                    .unwrap();
                wait_until("the server answers", Duration::from_secs(60), || async {
                    sqlx::query("SELECT 1").execute(&db.pool).await.is_ok()
                })
                .await;
            }
            // Time for the relays to work between the producers' steps.
            Step::Pause(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
        }
    }

    // Every transaction has ended: the relays finish the outbox.
    let left = wait_until(
        &format!("{name}, seed {seed}: the relays finish the outbox\nschedule: {steps:?}"),
        Duration::from_secs(60),
        || async {
            let (pending, processing, failed): (i64, i64, i64) =
                sqlx::query_as(sqlx::AssertSqlSafe(format!(
                    "SELECT count(*) FILTER (WHERE status = 'PENDING'), \
                     count(*) FILTER (WHERE status = 'PROCESSING'), \
                     count(*) FILTER (WHERE status = 'FAILED') FROM {}",
                    db.all_events()
                )))
                .fetch_one(&db.pool)
                .await
                .ok()?;
            (pending == 0 && processing == 0).then_some(failed)
        },
    )
    .await;
    if left != 0 {
        fail(format!("{left} events FAILED"));
    }
    behind_the_slot += check_slot(slot_kept).await.unwrap_or_else(|why| fail(why));
    relays.stop_all().await;
    if ordered {
        let overlaps = relays.in_flight.overlaps.lock().unwrap().clone();
        if !overlaps.is_empty() {
            fail(format!(
                "two events of one ordered aggregate in flight at once (aggregate, the event \
                 begun, those under way): {overlaps:?}"
            ));
        }
    }
    let order = if locks { Order::Commit } else { Order::Any };
    let checked = ledger
        .check(&relays.sink.published(), &format!("{seed}-"), order)
        .unwrap_or_else(|why| fail(why));
    if checked.repeats > allowed {
        let by = relays.by.lock().unwrap().clone();
        let mut count: std::collections::HashMap<i64, usize> = Default::default();
        for (_, id) in &by {
            *count.entry(*id).or_default() += 1;
        }
        let repeated: Vec<&(String, i64)> = by.iter().filter(|(_, id)| count[id] > 1).collect();
        fail(format!(
            "{} events published {} times more than once; at most {allowed} were in flight at \
             the kills, handovers, slot drops and restarts; the repeated ones' publishes: \
             {repeated:?}",
            checked.delivered, checked.repeats
        ));
    }
    totals.committed += ledger.committed();
    totals.repeats += checked.repeats;
    totals.allowed += allowed;
    totals.behind_the_slot += behind_the_slot;
    totals.kills += steps.iter().filter(|s| matches!(s, Step::Kill(_))).count();
    totals.slot_drops += steps.iter().filter(|s| matches!(s, Step::DropSlot)).count();
    // What the oracle holds from here on is the next schedule's.
    sqlx::query("SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())")
        .bind(&db.oracle)
        .execute(&db.pool)
        .await
        .unwrap();
}

/// What a producer is doing.
enum Producer {
    Idle,
    InTx {
        conn: PgConnection,
        /// Events inserted (their token), with their aggregate, in order.
        inserted: Vec<(u64, usize)>,
        savepoint: Option<usize>,
    },
    Prepared {
        gid: String,
        inserted: Vec<(u64, usize)>,
    },
}

async fn tier(db: Db, name: &str, seeds: Vec<u64>) {
    let mut totals = Totals::default();
    for seed in seeds {
        run(seed, &db, name, &mut totals).await;
    }
    db.drop_slots().await;
    eprintln!("{name}: {totals:?}");
}

fn seeds(base: u64) -> Vec<u64> {
    ledger::seeds("POSTBOX_CDC_SEED", "POSTBOX_CDC_SCHEDULES", base, 150)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cdc_schedules_keep_every_guarantee() {
    let test = TestDb::new().await;
    let db = Db::new(test.url().to_owned(), None).await;
    tier(db, "CDC", seeds(5_000_000)).await;
}

/// The same on a PostgreSQL server of the test's own that schedules restart (fast or
/// `-m immediate`): open transactions roll back, prepared ones come back, relays reconnect and
/// read the slot again. A tenth as many schedules.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cdc_schedules_with_server_restarts_keep_every_guarantee() {
    use postbox_testkit::cluster::{Cluster, find_bin_dir};
    let dir = tempfile::tempdir().unwrap();
    let server = Cluster::start(
        dir.path(),
        find_bin_dir().unwrap(),
        "postgres",
        &[("wal_level", "logical"), ("max_prepared_transactions", "8")],
    )
    .await
    .unwrap();
    let url = server.url();
    let db = Db::new(url, Some(server)).await;
    let seeds = seeds(6_000_000);
    let n = if seeds.len() == 1 {
        1
    } else {
        seeds.len() / 10
    };
    tier(
        db,
        "CDC with restarts",
        seeds.into_iter().take(n.max(1)).collect(),
    )
    .await;
}
