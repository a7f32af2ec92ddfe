//! The interleaving tier: seeded random schedules of real producer connections and relays, on
//! every store, checked after each schedule against G1, G2 and G6 (docs/guarantees.md).
//!
//! A schedule is a list of steps run one after another — a producer begins, inserts an event of
//! one of a few aggregates, sets or rolls back to a savepoint, commits, rolls back, holds its
//! transaction open across later steps, prepares it (PostgreSQL, two-phase commit) and later
//! commits or rolls back the prepared transaction; a relay starts (a second one joins), stops,
//! or is killed mid-work; the server restarts (PostgreSQL, on a cluster of the test's own); time
//! passes — while the relays, each on a store of its own from `postbox::connect(url)` (the path
//! users take), publish concurrently with ordering on. In half of the schedules a producer writes
//! to an aggregate only while no other open or prepared transaction has written to it (the
//! aggregate's row lock, as applications hold it), and the promise is each aggregate's commit
//! order; in the other half producers write side by side, and the promise is id order. After
//! the schedule every transaction ends, the relays finish the outbox, and the check is: every
//! committed event published, none that rolled back, each aggregate's first deliveries in the
//! promised order, nothing left `PENDING`, `PROCESSING` or `FAILED`.
//!
//! Seeded and replayable: a failure names its seed and store and prints the schedule;
//! `POSTBOX_INTERLEAVE_SEED=N` runs that one schedule alone. `POSTBOX_INTERLEAVINGS=N` sets how
//! many schedules each store runs (default 300; a tenth of them with server restarts).

#![allow(clippy::unwrap_used, reason = "tests")]

use std::time::Duration;

use crate::any::Conn;
use postbox::ops::StoreOps;
use postbox::{Event, Relay, RelayConfig, Store, StoreExt, backoff::Backoff, relay::RelayStats};
use postbox_testkit::ledger::{self, Ledger, Order};
use postbox_testkit::producers::{Producers, Settings, Step as P};
use postbox_testkit::{RecordingSink, wait_until};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Producer connections in a schedule.
const PRODUCERS: usize = 3;
/// Aggregates a schedule's events belong to.
const AGGREGATES: usize = 3;
/// Steps in a schedule (and as many again to end what is open).
const STEPS: usize = 30;

fn relay_config() -> RelayConfig {
    RelayConfig::default()
        .batch_size(8)
        .poll_interval(Duration::from_millis(10))
        .busy_poll_interval(Duration::from_millis(5))
        .lease(Duration::from_secs(1))
        .publish_timeout(Duration::from_millis(300))
        .retry(Backoff {
            base: Duration::from_millis(10),
            cap: Duration::from_millis(50),
        })
        .ordered_aggregate_types(["Acct"])
}

/// The database a tier runs on: how to open a producer connection and where relays connect.
struct Db {
    url: String,
    store: postbox::AnyStore,
    /// Two-phase commit (PostgreSQL).
    prepares: bool,
    /// One writer at a time (SQLite): a producer begins only while no other is in a transaction.
    one_writer: bool,
    /// A server of the test's own that schedules restart (PostgreSQL).
    #[cfg(feature = "postgres")]
    server: Option<postbox_testkit::cluster::Cluster>,
    _keep: Box<dyn std::any::Any + Send>,
}

impl Db {
    fn restarts(&self) -> bool {
        #[cfg(feature = "postgres")]
        return self.server.is_some();
        #[cfg(not(feature = "postgres"))]
        false
    }

    async fn restart(&self) {
        #[cfg(feature = "postgres")]
        if let Some(server) = &self.server {
            server.restart(false, Duration::ZERO).await.unwrap();
        }
    }

    async fn conn(&self) -> Conn {
        Conn::of(&self.store).await
    }
}

/// One step of a schedule.
#[derive(Clone, Debug)]
enum Step {
    /// A producer's step.
    Producer(P),
    StartRelay,
    StopRelay,
    KillRelay,
    Pause(u64),
    /// The database server restarts: open transactions roll back, prepared ones stay.
    RestartServer,
}

/// What a producer is doing.
enum Producer {
    Idle,
    InTx {
        conn: Conn,
        /// Events inserted (their token), with their aggregate, in order.
        inserted: Vec<(u64, usize)>,
        savepoint: Option<usize>,
    },
    Prepared {
        gid: String,
        inserted: Vec<(u64, usize)>,
    },
}

struct Relays {
    running: Vec<(JoinHandle<postbox::Result<RelayStats>>, watch::Sender<bool>)>,
    /// Relays told to stop, finishing what they hold while the schedule goes on (a producer's
    /// open transaction may hold what they wait for: SQLite's write lock).
    stopping: Vec<JoinHandle<postbox::Result<RelayStats>>>,
}

impl Relays {
    async fn start(&mut self, db: &Db, sink: &RecordingSink) {
        let store = postbox::connect(&db.url).await.unwrap();
        let relay = Relay::new(store, sink.clone(), relay_config()).unwrap();
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            relay
                .run(async move {
                    let _ = stopped.wait_for(|s| *s).await;
                })
                .await
        });
        self.running.push((task, stop));
    }

    fn stop(&mut self) {
        if let Some((task, stop)) = self.running.pop() {
            let _ = stop.send(true);
            self.stopping.push(task);
        }
    }

    /// Stops every relay and waits for each to end cleanly.
    async fn stop_all(&mut self) {
        while !self.running.is_empty() {
            self.stop();
        }
        for task in self.stopping.drain(..) {
            task.await.unwrap().unwrap();
        }
    }

    /// A crash: the task is dropped wherever it is; its claims stay leased until they expire.
    async fn kill(&mut self) {
        if let Some((task, _)) = self.running.pop() {
            task.abort();
            let _ = task.await;
        }
    }
}

/// A schedule drawn from `seed`, of the steps `db` can take, and whether its producers lock
/// the aggregates they write (half of the schedules): without, two open transactions write to
/// one aggregate, and the promise is id order. Steps are drawn against a model of the
/// producers' states, so each one is valid when it runs.
fn schedule(seed: u64, db: &Db) -> (bool, Vec<Step>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let locks = rng.random_bool(0.5);
    let mut producers = Producers::new(Settings {
        producers: PRODUCERS,
        aggregates: AGGREGATES,
        locks,
        prepares: db.prepares,
        one_writer: db.one_writer,
        many: false,
    });
    let mut relays = 1usize;
    let mut steps = vec![];
    for _ in 0..STEPS {
        if rng.random_bool(0.12) {
            let step = match rng.random_range(0..4) {
                0 if relays < 2 => Step::StartRelay,
                1 if relays > 0 => Step::StopRelay,
                2 if relays > 0 => Step::KillRelay,
                _ => Step::Pause(rng.random_range(1..30)),
            };
            match step {
                Step::StartRelay => relays += 1,
                Step::StopRelay | Step::KillRelay => relays -= 1,
                _ => {}
            }
            steps.push(step);
        } else if db.restarts() && rng.random_bool(0.04) {
            producers.server_restarted();
            steps.push(Step::RestartServer);
        } else if let Some(step) = producers.next(&mut rng) {
            steps.push(Step::Producer(step));
        }
    }
    steps.extend(producers.end(&mut rng).into_iter().map(Step::Producer));
    if relays == 0 {
        steps.push(Step::StartRelay);
    }
    (locks, steps)
}

/// Runs schedule `seed` on `db`; panics with the seed, the store and the schedule when a
/// guarantee does not hold.
async fn run(seed: u64, db: &Db, name: &str) {
    let (locks, steps) = schedule(seed, db);
    run_steps(seed, locks, steps, db, name).await;
}

/// Runs `steps` (`seed` names the schedule's aggregates); see [`run`].
async fn run_steps(seed: u64, locks: bool, steps: Vec<Step>, db: &Db, name: &str) {
    let outbox = db.store.outbox_builder().notify(false).build();
    let sink = RecordingSink::new();
    let mut relays = Relays {
        running: vec![],
        stopping: vec![],
    };
    relays.start(db, &sink).await;
    let mut producers: Vec<Producer> = (0..PRODUCERS).map(|_| Producer::Idle).collect();
    let mut ledger = Ledger::default();
    let fail = |why: String| -> ! {
        panic!("{name}, seed {seed}: {why}\nschedule: {steps:?}");
    };
    for step in &steps {
        match *step {
            Step::Producer(P::Begin(p)) => {
                let mut conn = db.conn().await;
                conn.exec("BEGIN").await;
                producers[p] = Producer::InTx {
                    conn,
                    inserted: vec![],
                    savepoint: None,
                };
            }
            Step::Producer(P::Insert(p, a)) => {
                let Producer::InTx { conn, inserted, .. } = &mut producers[p] else {
                    fail(format!("{step:?} outside a transaction"));
                };
                let token = ledger.token();
                let event = Event::new("E", &serde_json::json!({ "token": token }))
                    .unwrap()
                    .aggregate("Acct", format!("{seed}-{a}"))
                    .without_idempotency_key();
                let id = conn.enqueue(&outbox, event).await;
                ledger.record(token, id);
                inserted.push((token, a));
            }
            Step::Producer(P::InsertMany(..)) => {
                fail(format!(
                    "{step:?}: statements of many events are not drawn here"
                ));
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
                conn.exec("SAVEPOINT s").await;
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
                conn.exec("ROLLBACK TO SAVEPOINT s").await;
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
                conn.exec(if commit { "COMMIT" } else { "ROLLBACK" }).await;
                ledger.end(inserted, commit);
            }
            Step::Producer(P::Prepare(p)) => {
                let Producer::InTx {
                    mut conn, inserted, ..
                } = std::mem::replace(&mut producers[p], Producer::Idle)
                else {
                    fail(format!("{step:?} outside a transaction"));
                };
                let gid = format!("interleave-{seed}-{p}-{}", uuid::Uuid::new_v4().simple());
                conn.exec(&format!("PREPARE TRANSACTION '{gid}'")).await;
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
                db.conn()
                    .await
                    .exec(&format!("{verb} PREPARED '{gid}'"))
                    .await;
                ledger.end(inserted, commit);
            }
            Step::StartRelay => relays.start(db, &sink).await,
            Step::StopRelay => relays.stop(),
            Step::KillRelay => relays.kill().await,
            // Time for the relays to work between the producers' steps.
            Step::Pause(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
            Step::RestartServer => {
                for producer in &mut producers {
                    if matches!(producer, Producer::InTx { .. })
                        && let Producer::InTx { inserted, .. } =
                            std::mem::replace(producer, Producer::Idle)
                    {
                        ledger.end(inserted, false);
                    }
                }
                db.restart().await;
            }
        }
    }

    // Every transaction has ended: the relays finish the outbox.
    let target = postbox::Target::default_schema(db.store.default_schema());
    let finished = wait_until(
        &format!("{name}, seed {seed}: the relays finish the outbox\nschedule: {steps:?}"),
        Duration::from_secs(30),
        || async {
            let c = db.store.status_counts(&target).await.unwrap();
            (c.pending == 0 && c.processing == 0).then_some(c)
        },
    )
    .await;
    relays.stop_all().await;
    if finished.failed != 0 {
        fail(format!("{} events FAILED", finished.failed));
    }

    // One writer at a time per aggregate: its commit order; writers side by side: id order,
    // never an id while an earlier one may commit.
    let order = if locks { Order::Commit } else { Order::Id };
    if let Err(why) = ledger.check(&sink.published(), &format!("{seed}-"), order) {
        fail(why);
    }
}

/// The seeds to run: `POSTBOX_INTERLEAVE_SEED` alone, or `POSTBOX_INTERLEAVINGS` (default 300)
/// from a base that differs per store.
fn seeds(base: u64) -> Vec<u64> {
    ledger::seeds(
        "POSTBOX_INTERLEAVE_SEED",
        "POSTBOX_INTERLEAVINGS",
        base,
        300,
    )
}

async fn tier(db: Db, name: &str, base: u64) {
    for seed in seeds(base) {
        run(seed, &db, name).await;
    }
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_keep_every_guarantee_on_postgres() {
    let test = postbox_testkit::TestDb::new().await;
    let store = postbox::connect(test.url()).await.unwrap();
    postbox::migrate(&store).await.unwrap();
    let db = Db {
        url: test.url().to_owned(),
        store,
        prepares: true,
        one_writer: false,
        server: None,
        _keep: Box::new(test),
    };
    tier(db, "PostgreSQL", 1_000_000).await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_keep_every_guarantee_on_mysql() {
    let test = postbox_testkit::TestMySql::new().await;
    let store = postbox::connect(test.url()).await.unwrap();
    postbox::migrate(&store).await.unwrap();
    let db = Db {
        url: test.url().to_owned(),
        store,
        prepares: false,
        one_writer: false,
        #[cfg(feature = "postgres")]
        server: None,
        _keep: Box::new(test),
    };
    tier(db, "MySQL/MariaDB", 2_000_000).await;
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_keep_every_guarantee_on_sqlite() {
    let test = postbox_testkit::TestSqlite::new();
    let url = test.path().to_str().unwrap().to_owned();
    let store = postbox::connect(&url).await.unwrap();
    postbox::migrate(&store).await.unwrap();
    let db = Db {
        url,
        store,
        prepares: false,
        one_writer: true,
        #[cfg(feature = "postgres")]
        server: None,
        _keep: Box::new(test),
    };
    tier(db, "SQLite", 3_000_000).await;
}

/// The same on a PostgreSQL server of the test's own that schedules restart: open transactions
/// roll back, prepared ones come back (under `-1/<xid>`), relays reconnect. A tenth as many
/// schedules, each restart taking about a second.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_with_server_restarts_keep_every_guarantee_on_postgres() {
    use postbox_testkit::cluster::{Cluster, find_bin_dir};
    let dir = tempfile::tempdir().unwrap();
    let server = Cluster::start(
        dir.path(),
        find_bin_dir().unwrap(),
        "postgres",
        &[("max_prepared_transactions", "8")],
    )
    .await
    .unwrap();
    let url = server.url();
    let store = postbox::connect(&url).await.unwrap();
    postbox::migrate(&store).await.unwrap();
    let db = Db {
        url,
        store,
        prepares: true,
        one_writer: false,
        server: Some(server),
        _keep: Box::new(dir),
    };
    // The schedule that found a prepared transaction lost across a restart: the relay's probe
    // saw both writers of aggregate 0; after the restart the prepared one holds its locks as
    // `-1/<xid>`, and the horizon settled past its id, publishing the later id first.
    use P::*;
    use Step::*;
    let found = vec![
        StopRelay,
        Producer(Begin(0)),
        Producer(Insert(0, 0)),
        Producer(Begin(1)),
        Producer(Insert(1, 0)),
        StartRelay,
        Pause(100),
        Producer(Commit(1)),
        Pause(50),
        Producer(Prepare(0)),
        RestartServer,
        Pause(500),
        Producer(CommitPrepared(0)),
    ];
    run_steps(4_999_999, false, found, &db, "PostgreSQL with restarts").await;
    let seeds = seeds(4_000_000);
    let n = if seeds.len() == 1 {
        1
    } else {
        seeds.len() / 10
    };
    for seed in seeds.into_iter().take(n.max(1)) {
        run(seed, &db, "PostgreSQL with restarts").await;
    }
}
