//! Producers: concurrent tasks committing events the way services do, some through
//! `Outbox::enqueue` and some by plain SQL, each transaction also writing a ledger row per event.
//! The ledger is the truth of what committed: it commits or rolls back with the events. What was
//! rolled back on purpose, or failed before its commit, is remembered here, in memory.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use postbox::store::Tenant;
use postbox::{Event, Outbox, PgStore, SchemaName, Store, StoreExt, event::Enqueued};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sqlx::{AssertSqlSafe, PgPool, Postgres, Transaction};
use tracing::{debug, info};

/// The business table of the run: one row per committed event, in the event's transaction.
pub(crate) const LEDGER_DDL: &str = "CREATE TABLE chaos_ledger (
    marker       text PRIMARY KEY,
    event_id     bigint NOT NULL UNIQUE,
    path         text NOT NULL,
    amount_cents bigint NOT NULL
)";

/// The event type every producer writes.
pub(crate) const EVENT_TYPE: &str = "ChaosEntryPosted";

/// How producers write events.
#[derive(Clone, Debug)]
pub(crate) struct ProducerParams {
    pub(crate) seed: u64,
    pub(crate) producers: u32,
    /// Events to commit, all producers together.
    pub(crate) events: u64,
    /// Over how long to spread them.
    pub(crate) duration: Duration,
    pub(crate) rollback_percent: u8,
    pub(crate) sql_percent: u8,
    /// Aggregates the events share (0: each its own; see `Args::ordered_aggregates`).
    pub(crate) ordered_aggregates: u32,
    /// The tenants beside the default schema (`Args::tenants`); each transaction writes into
    /// one outbox of them all, at random.
    pub(crate) tenants: Vec<Tenant>,
}

/// The aggregate type of every event that has one.
pub(crate) const AGGREGATE_TYPE: &str = "Account";

/// The aggregate id of the event with `marker`: the marker itself, or with `shared` aggregates
/// one of `acct-0` … `acct-{shared - 1}`, drawn from the marker.
pub(crate) fn aggregate_id(marker: &str, shared: u32) -> String {
    if shared == 0 {
        marker.to_owned()
    } else {
        let n = marker
            .bytes()
            .fold(7u64, |a, b| a.wrapping_mul(131).wrapping_add(u64::from(b)));
        format!("acct-{}", n % u64::from(shared))
    }
}

/// What the producers did.
#[derive(Clone, Debug, Default)]
pub(crate) struct Tally {
    /// Transactions committed, and their events.
    pub(crate) committed_transactions: u64,
    pub(crate) committed_events: u64,
    /// Markers of events whose transaction certainly did not commit: rolled back on purpose, or
    /// failed before its commit was sent.
    pub(crate) not_committed: Vec<String>,
    /// How many of those were rolled back on purpose.
    pub(crate) rolled_back_on_purpose: u64,
    /// Markers of events whose commit failed: committed or not, the ledger says which.
    pub(crate) in_doubt: Vec<String>,
    /// Transactions that failed (the database restarting, mostly), and the first errors.
    pub(crate) errors: u64,
    pub(crate) first_errors: Vec<String>,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.committed_transactions += other.committed_transactions;
        self.committed_events += other.committed_events;
        self.not_committed.extend(other.not_committed);
        self.rolled_back_on_purpose += other.rolled_back_on_purpose;
        self.in_doubt.extend(other.in_doubt);
        self.errors += other.errors;
        for e in other.first_errors {
            if self.first_errors.len() < 5 {
                self.first_errors.push(e);
            }
        }
    }

    fn error(&mut self, error: &anyhow::Error) {
        self.errors += 1;
        if self.first_errors.len() < 5 {
            self.first_errors.push(format!("{error:#}"));
        }
    }
}

/// Runs the producers until `params.events` events committed; returns what they did.
pub(crate) async fn run(pool: PgPool, params: ProducerParams) -> anyhow::Result<Tally> {
    let committed = Arc::new(AtomicU64::new(0));
    let reserved = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    // One `Outbox` per schema for all producers: its NOTIFY debounce is shared, as in a
    // service. The store hands them out, so events go to the tables the relays read.
    let store = PgStore::new(pool.clone());
    let mut outboxes = vec![(store.default_schema(), store.outbox())];
    outboxes.extend(
        params
            .tenants
            .iter()
            .map(|t| (t.schema.clone(), store.outbox_builder().tenant(t).build())),
    );
    let outboxes = Arc::new(outboxes);
    let mut tasks = Vec::new();
    for index in 0..params.producers {
        tasks.push(tokio::spawn(produce(
            index,
            pool.clone(),
            Arc::clone(&outboxes),
            params.clone(),
            Arc::clone(&committed),
            Arc::clone(&reserved),
            started,
        )));
    }
    let mut tally = Tally::default();
    for task in tasks {
        tally.merge(task.await.context("a producer panicked")?);
    }
    info!(
        events = tally.committed_events,
        transactions = tally.committed_transactions,
        errors = tally.errors,
        elapsed = ?started.elapsed(),
        "producers done"
    );
    Ok(tally)
}

/// How one transaction writes its events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    /// `Outbox::enqueue` (one event) or `Outbox::enqueue_many`.
    Library,
    /// `INSERT INTO outbox_events (event_type, aggregate_type, aggregate_id, payload)`.
    PlainSql,
}

impl Path {
    fn name(self) -> &'static str {
        match self {
            Path::Library => "library",
            Path::PlainSql => "sql",
        }
    }
}

/// What one transaction is to do, drawn from the producer's seeded stream.
struct Plan {
    path: Path,
    markers: Vec<String>,
    rollback: bool,
    /// Plain SQL: also `pg_notify`, as the README tells non-Rust producers they may.
    notify: bool,
    /// Library, several events: `enqueue_many` rather than one `enqueue` each.
    many: bool,
    /// Aggregates the events share (`ProducerParams::ordered_aggregates`).
    aggregates: u32,
}

async fn produce(
    index: u32,
    pool: PgPool,
    outboxes: Arc<Vec<(SchemaName, Outbox)>>,
    params: ProducerParams,
    committed: Arc<AtomicU64>,
    reserved: Arc<AtomicU64>,
    started: Instant,
) -> Tally {
    let mut rng = ChaCha8Rng::seed_from_u64(
        params
            .seed
            .wrapping_add(0x9e37_79b9_7f4a_7c15_u64.wrapping_mul(u64::from(index) + 1)),
    );
    let mut tally = Tally::default();
    let mut sequence = 0u64;
    let mut failures_in_a_row = 0u32;
    let total = params.events;
    let seconds = params.duration.as_secs_f64();
    loop {
        let done = committed.load(Ordering::Relaxed);
        if done >= total {
            return tally;
        }
        // Spread the events over the run, so faults hit a relay with work in hand rather than an
        // idle one: ahead of the pace, wait until the next event is due.
        let elapsed = started.elapsed().as_secs_f64();
        let due_at = (done + 1) as f64 / total as f64 * seconds;
        if due_at > elapsed {
            tokio::time::sleep(Duration::from_secs_f64((due_at - elapsed).min(0.05))).await;
            continue;
        }
        // Claim the events before writing them, so producers together commit exactly `total`.
        let wanted = rng.random_range(1..=3u64);
        let Ok(before) = reserved.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| {
            (r < total).then(|| r + wanted.min(total - r))
        }) else {
            // Everything is claimed; wait for the transactions in flight to settle.
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let count = wanted.min(total - before);
        let plan = Plan {
            path: if rng.random_range(0..100) < params.sql_percent {
                Path::PlainSql
            } else {
                Path::Library
            },
            markers: (0..count)
                .map(|i| format!("{}-{index}-{sequence}-{i}", params.seed))
                .collect(),
            rollback: rng.random_range(0..100) < params.rollback_percent,
            notify: rng.random_bool(0.5),
            many: rng.random_bool(0.5),
            aggregates: params.ordered_aggregates,
        };
        sequence += 1;
        let (schema, outbox) = &outboxes[rng.random_range(0..outboxes.len())];
        match transaction(&pool, schema, outbox, &plan).await {
            Ok(()) if plan.rollback => {
                reserved.fetch_sub(count, Ordering::Relaxed);
                tally.rolled_back_on_purpose += count;
                tally.not_committed.extend(plan.markers);
                failures_in_a_row = 0;
            }
            Ok(()) => {
                committed.fetch_add(count, Ordering::Relaxed);
                tally.committed_transactions += 1;
                tally.committed_events += count;
                failures_in_a_row = 0;
            }
            Err(Failure::NotCommitted(e)) => {
                reserved.fetch_sub(count, Ordering::Relaxed);
                debug!(producer = index, error = %format!("{e:#}"), "transaction failed before its commit");
                tally.error(&e);
                tally.not_committed.extend(plan.markers);
                failures_in_a_row += 1;
            }
            Err(Failure::InDoubt(e)) => {
                // Committed or not, the ledger will say; writing them again keeps the count of
                // known commits at `total` (so a run may commit a few more than asked).
                reserved.fetch_sub(count, Ordering::Relaxed);
                debug!(producer = index, error = %format!("{e:#}"), "commit failed: outcome unknown");
                tally.error(&e);
                tally.in_doubt.extend(plan.markers);
                failures_in_a_row += 1;
            }
        }
        if failures_in_a_row > 0 {
            // The database is restarting: back off, as a service's retry would.
            let wait = Duration::from_millis(50 << failures_in_a_row.min(5));
            tokio::time::sleep(wait).await;
        }
    }
}

/// Why a transaction did not end as planned.
enum Failure {
    /// Failed before `COMMIT` was sent: nothing of it committed.
    NotCommitted(anyhow::Error),
    /// `COMMIT` failed: it may or may not have committed.
    InDoubt(anyhow::Error),
}

async fn transaction(
    pool: &PgPool,
    schema: &SchemaName,
    outbox: &Outbox,
    plan: &Plan,
) -> Result<(), Failure> {
    let mut tx = pool
        .begin()
        .await
        .context("begin")
        .map_err(Failure::NotCommitted)?;
    write(&mut tx, schema, outbox, plan)
        .await
        .map_err(Failure::NotCommitted)?;
    if plan.rollback {
        // A failed ROLLBACK leaves nothing committed either.
        let _ = tx.rollback().await;
        return Ok(());
    }
    tx.commit()
        .await
        .context("commit")
        .map_err(Failure::InDoubt)
}

async fn write(
    tx: &mut Transaction<'static, Postgres>,
    schema: &SchemaName,
    outbox: &Outbox,
    plan: &Plan,
) -> anyhow::Result<()> {
    let mut ids = Vec::with_capacity(plan.markers.len());
    match plan.path {
        Path::Library => {
            let events = plan
                .markers
                .iter()
                .enumerate()
                .map(|(i, marker)| library_event(marker, i, plan.aggregates))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let results = if plan.many && events.len() > 1 {
                outbox.enqueue_many(&mut **tx, events).await?
            } else {
                let mut results = Vec::new();
                for event in events {
                    results.push(outbox.enqueue(&mut **tx, event).await?);
                }
                results
            };
            for (marker, result) in plan.markers.iter().zip(results) {
                match result {
                    Enqueued::Inserted(id) => ids.push(id),
                    // Every marker is new: a duplicate would be a wrong idempotency verdict.
                    other => bail!("enqueue of {marker} answered {other:?}"),
                }
            }
        }
        Path::PlainSql => {
            for marker in &plan.markers {
                // The schema name is a validated `SchemaName`, quoted.
                let id: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
                    "INSERT INTO {}.outbox_events (event_type, aggregate_type, aggregate_id, \
                     payload) VALUES ($1, $2, $3, $4::jsonb) RETURNING id",
                    schema.quoted()
                )))
                .bind(EVENT_TYPE)
                .bind(AGGREGATE_TYPE)
                .bind(aggregate_id(marker, plan.aggregates))
                .bind(payload(marker).to_string())
                .fetch_one(&mut **tx)
                .await
                .context("plain SQL insert")?;
                ids.push(id);
            }
            if plan.notify {
                sqlx::query("SELECT pg_notify('postbox_events', $1)")
                    .bind(schema.as_str())
                    .execute(&mut **tx)
                    .await
                    .context("pg_notify")?;
            }
        }
    }
    for (marker, id) in plan.markers.iter().zip(ids) {
        sqlx::query(
            "INSERT INTO chaos_ledger (marker, event_id, path, amount_cents) VALUES ($1, $2, $3, $4)",
        )
        .bind(marker)
        .bind(id)
        .bind(plan.path.name())
        .bind(amount(marker))
        .execute(&mut **tx)
        .await
        .context("ledger insert")?;
    }
    Ok(())
}

/// A library event, in one of the three shapes services write: an aggregate with the default
/// daily idempotency key, an aggregate with the producer's own key, no aggregate (and no key).
/// Aggregates shared by many events (`shared` > 0) take the producer's own key: the daily key
/// would make the second event of an aggregate a duplicate.
fn library_event(marker: &str, i: usize, shared: u32) -> anyhow::Result<Event> {
    let event = Event::new(EVENT_TYPE, &payload(marker))?;
    let aggregate = aggregate_id(marker, shared);
    Ok(match (marker.len() + i) % 3 {
        0 if shared == 0 => event.aggregate(AGGREGATE_TYPE, aggregate),
        0 | 1 => event
            .aggregate(AGGREGATE_TYPE, aggregate)
            .idempotency_key(format!("chaos:{marker}")),
        _ => event,
    })
}

/// The payload names its marker, which is how the checker recognises an event on the broker
/// whatever id it got.
pub(crate) fn payload(marker: &str) -> serde_json::Value {
    serde_json::json!({ "marker": marker, "amount_cents": amount(marker) })
}

fn amount(marker: &str) -> i64 {
    marker
        .bytes()
        .fold(0i64, |a, b| (a * 31 + i64::from(b)) % 100_000)
}
