//! The `history` phase (PostgreSQL): day 30 in minutes. A table that starts with a long
//! processed history, written by plain SQL and `VACUUM ANALYZE`d, under a retention short
//! enough that archiving runs all along; producers at a steady rate; relays publishing with
//! every maintenance task on (archiving, purging, vacuuming) and autovacuum at PostgreSQL's
//! defaults. Per window: throughput, commit-to-publish latency, the cost of a claim, the sizes
//! of the table, its indexes and the archive, and the process's memory.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::try_join_all;
use hdrhistogram::Histogram;
use indicatif::ProgressBar;
use postbox::{OutboxEvent, PublishError, Relay, RelayConfig, Sink, StoreExt};
use sqlx::PgPool;
use tokio::time::Instant;

use crate::BenchError;
use crate::db::{Db, Extra};
use crate::phases;
use crate::report::{
    ClaimTimes, DrainCase, HistoryDrain, HistoryRun, HistoryWindow, Throughput, rss_kib,
};

/// What the phase takes.
pub(crate) struct HistoryPlan {
    /// Processed events in the table at the start.
    pub(crate) rows: u64,
    /// How long producers and relays run.
    pub(crate) duration: Duration,
    /// Producer rate, events/s.
    pub(crate) rate: u64,
    /// Length of a measurement window.
    pub(crate) window: Duration,
    /// Relays.
    pub(crate) relays: usize,
    /// A backlog of this many plain-SQL events drained by one relay on the empty table, then
    /// on the table with its history; 0 skips it.
    pub(crate) drain_events: u64,
}

/// Commit and publish instants per event id.
#[derive(Default)]
struct Times {
    committed: HashMap<i64, Instant>,
    published: HashMap<i64, Instant>,
    /// Published before its producer noted the commit (a relay can be that quick): kept until
    /// the commit is noted, counted in the window it was published in.
    early: HashMap<i64, Instant>,
}

struct TimingSink {
    times: Arc<Mutex<Times>>,
}

#[async_trait::async_trait]
impl Sink for TimingSink {
    async fn publish(&self, event: &OutboxEvent) -> Result<(), PublishError> {
        let now = Instant::now();
        self.times
            .lock()
            .map_err(|_| PublishError::retryable("times poisoned"))?
            .published
            .entry(event.id)
            .or_insert(now);
        Ok(())
    }
}

/// Runs the phase on `db` (a reset scratch database) with `relay_dbs` (one pool per relay).
pub(crate) async fn run(
    db: &Db,
    relay_dbs: &[Db],
    config: &RelayConfig,
    plan: &HistoryPlan,
    bars: &dyn Fn(u64, &str) -> ProgressBar,
) -> Result<HistoryRun, BenchError> {
    let Db::Pg(pool) = db else {
        return Err(BenchError::Setup(
            "the history phase needs PostgreSQL".into(),
        ));
    };
    // Retention a third of the run: the history spans two retentions, so half of it is due at
    // once and the rest comes due while the run goes on, as do the new events after a while.
    let retention = plan.duration / 3;
    // The same backlog drained by one relay on the empty table, then on the long one: each time
    // quiet, then with a snapshot held open throughout.
    let drain_both = || held_and_quiet(db, relay_dbs, config, plan.drain_events, bars);
    let on_empty = if plan.drain_events > 0 {
        let drained = drain_both().await?;
        sqlx::query("TRUNCATE outbox_events")
            .execute(pool)
            .await
            .map_err(BenchError::db)?;
        Some(drained)
    } else {
        None
    };
    write_history(pool, plan.rows, retention * 2).await?;
    let drain = match on_empty {
        Some(empty) => {
            let history = drain_both().await?;
            Some(HistoryDrain {
                events: plan.drain_events,
                ratio: history.quiet.per_second / empty.quiet.per_second,
                empty,
                history,
            })
        }
        None => None,
    };
    let bar = &bars(plan.duration.as_secs(), "history (seconds)");
    db.create_business_table().await?;
    let outbox = db.store().outbox();

    let times = Arc::new(Mutex::new(Times::default()));
    let sink: Arc<dyn Sink> = Arc::new(TimingSink {
        times: Arc::clone(&times),
    });
    let config = config
        .clone()
        .retention(Some(retention))
        .archive_retention(Some(retention));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let relays = relay_dbs.iter().map(|rdb| {
        let relay = Relay::from_parts(rdb.store(), Arc::clone(&sink), config.clone());
        let mut stop = stop_rx.clone();
        async move {
            relay?
                .run(async move {
                    let _ = stop.wait_for(|s| *s).await;
                })
                .await
        }
    });
    let relays = tokio::spawn(try_join_all(relays));

    let started = Instant::now();
    let deadline = started + plan.duration;
    let producers = 4u64;
    let every = Duration::from_secs_f64(producers as f64 / plan.rate.max(1) as f64);
    let produce = (0..producers).map(|p| {
        let db = db.clone();
        let times = Arc::clone(&times);
        let outbox = outbox.clone();
        async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let mut i = (p + 1) << 40;
            while Instant::now() < deadline {
                tick.tick().await;
                if let Some(id) = db.business_tx(i, 1, Extra::Event(&outbox)).await? {
                    let at = Instant::now();
                    times
                        .lock()
                        .map_err(|_| BenchError::Check("times poisoned".into()))?
                        .committed
                        .insert(id, at);
                }
                i += 1;
            }
            Ok::<_, BenchError>(())
        }
    });
    let producers = tokio::spawn(try_join_all(produce));

    let mut windows = Vec::new();
    let mut window_start = started;
    while Instant::now() < deadline {
        tokio::time::sleep_until((window_start + plan.window).min(deadline)).await;
        let now = Instant::now();
        let (published, latency) = window_latency(&times)?;
        let claim = claim_probe(pool).await?;
        let sizes = sizes(pool).await?;
        windows.push(HistoryWindow {
            at_secs: now.duration_since(started).as_secs_f64(),
            published_per_second: published as f64 / now.duration_since(window_start).as_secs_f64(),
            latency_p50_ms: latency.0,
            latency_p99_ms: latency.1,
            claim_p50_ms: claim.0,
            claim_p99_ms: claim.1,
            table_mib: sizes.0,
            indexes_mib: sizes.1,
            archive_mib: sizes.2,
            rows: sizes.3,
            dead_rows: sizes.4,
            rss_mib: rss_kib() as f64 / 1024.0,
        });
        bar.set_position(now.duration_since(started).as_secs());
        window_start = now;
    }
    bar.finish_and_clear();
    producers
        .await
        .map_err(|e| BenchError::Check(format!("producers failed: {e}")))??;
    // Let the relays publish what is left, then stop them.
    let unpublished = |t: &Times| {
        t.committed
            .keys()
            .filter(|id| !t.published.contains_key(id) && !t.early.contains_key(id))
            .count()
    };
    let catch_up = Instant::now() + Duration::from_secs(30);
    while Instant::now() < catch_up && times.lock().map(|t| unpublished(&t)).unwrap_or(0) > 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = stop_tx.send(true);
    relays
        .await
        .map_err(|e| BenchError::Check(format!("relays failed: {e}")))??;
    let missing = unpublished(
        &*times
            .lock()
            .map_err(|_| BenchError::Check("times poisoned".into()))?,
    );
    if missing > 0 {
        return Err(BenchError::Check(format!(
            "{missing} committed events were not published within 30 s of the end"
        )));
    }
    let archived: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_events_archive")
        .fetch_one(pool)
        .await
        .map_err(BenchError::db)?;
    let ratio = |f: fn(&HistoryWindow) -> f64| {
        // The first window runs while the first half of the history is archived: the steady
        // state is compared from the second window on.
        let first = windows.get(1).or(windows.first()).map(f).unwrap_or(0.0);
        let last = windows.last().map(f).unwrap_or(0.0);
        if first > 0.0 { last / first } else { 0.0 }
    };
    Ok(HistoryRun {
        history_rows: plan.rows,
        retention_secs: retention.as_secs_f64(),
        rate: plan.rate,
        relays: plan.relays,
        seconds: plan.duration.as_secs_f64(),
        throughput_last_over_first: ratio(|w| w.published_per_second),
        claim_p99_last_over_first: ratio(|w| w.claim_p99_ms),
        table_last_over_first: ratio(|w| w.table_mib + w.indexes_mib),
        archived_at_end: u64::try_from(archived).unwrap_or(0),
        windows,
        drain,
    })
}

/// One relay drains a backlog of `events` plain-SQL events three times: on a quiet database,
/// with a snapshot held open throughout, and beside a producer transaction held open that wrote
/// an event before the backlog (see [`drain_backlog`]). PostgreSQL, and MySQL/MariaDB, where a
/// long transaction keeps InnoDB's purge from removing what the marks delete-marked.
pub(crate) async fn held_and_quiet(
    db: &Db,
    relay_dbs: &[Db],
    config: &RelayConfig,
    events: u64,
    bars: &dyn Fn(u64, &str) -> ProgressBar,
) -> Result<DrainCase, BenchError> {
    let (quiet, quiet_claims) =
        drain_backlog(db, &relay_dbs[..1], config, events, Hold::Nothing, bars).await?;
    let (held, held_claims) =
        drain_backlog(db, &relay_dbs[..1], config, events, Hold::Snapshot, bars).await?;
    let (producer_held, producer_held_claims) =
        drain_backlog(db, &relay_dbs[..1], config, events, Hold::Producer, bars).await?;
    Ok(DrainCase {
        held_over_quiet: held.per_second / quiet.per_second,
        producer_over_quiet: producer_held.per_second / quiet.per_second,
        quiet,
        quiet_claims,
        held,
        held_claims,
        producer_held,
        producer_held_claims,
    })
}

/// What stays open while a backlog drains.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Hold {
    Nothing,
    /// A report's snapshot ([`Held::open`]).
    Snapshot,
    /// A producer's transaction that wrote an event, by plain SQL, before the backlog was
    /// written, and neither commits nor rolls back until the drain is over: the commit horizon
    /// stays below its event all along, and the marks' dead index entries stay.
    Producer,
}

/// A transaction that read the outbox table and stays open: its snapshot keeps every row
/// version the drain's marks replace (PostgreSQL), or keeps InnoDB's purge from removing the
/// index entries they delete-mark (MySQL).
pub(crate) enum Held {
    Pg(sqlx::Transaction<'static, sqlx::Postgres>),
    MySql(sqlx::pool::PoolConnection<sqlx::MySql>),
}

impl Held {
    /// A report's snapshot ([`Hold::Snapshot`]).
    pub(crate) async fn open(db: &Db) -> Result<Held, BenchError> {
        Self::begin(
            db,
            &[
                "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ",
                "SELECT count(*) FROM outbox_events",
            ],
            // The store's sessions run at READ COMMITTED, where a snapshot lasts one statement:
            // a report or a dump runs at REPEATABLE READ.
            &[
                "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ",
                "START TRANSACTION WITH CONSISTENT SNAPSHOT",
                "SELECT count(*) FROM outbox_events",
            ],
        )
        .await
    }

    /// A producer's transaction that wrote one event and stays open ([`Hold::Producer`]).
    async fn producer(db: &Db) -> Result<Held, BenchError> {
        let insert = "INSERT INTO outbox_events (event_type, payload) \
                      VALUES ('HeldOpen', '{\"held\": true}')";
        Self::begin(db, &[insert], &["START TRANSACTION", insert]).await
    }

    /// A transaction that runs `pg` (in a transaction begun for it) or `mysql` (from the first
    /// statement) and stays open.
    async fn begin(
        db: &Db,
        pg: &[&'static str],
        mysql: &[&'static str],
    ) -> Result<Held, BenchError> {
        match db {
            Db::Pg(pool) => {
                let mut tx = pool.begin().await.map_err(BenchError::db)?;
                for statement in pg {
                    sqlx::raw_sql(*statement)
                        .execute(&mut *tx)
                        .await
                        .map_err(BenchError::db)?;
                }
                Ok(Held::Pg(tx))
            }
            Db::MySql(pool, _) => {
                let mut conn = pool.acquire().await.map_err(BenchError::db)?;
                for statement in mysql {
                    sqlx::raw_sql(*statement)
                        .execute(&mut *conn)
                        .await
                        .map_err(BenchError::db)?;
                }
                Ok(Held::MySql(conn))
            }
            Db::Sqlite(_) => Err(BenchError::Setup(
                "a transaction held open needs PostgreSQL or MySQL".into(),
            )),
        }
    }

    pub(crate) async fn close(self) -> Result<(), BenchError> {
        match self {
            Held::Pg(report) => report.rollback().await.map_err(BenchError::db),
            Held::MySql(mut conn) => {
                sqlx::raw_sql("ROLLBACK")
                    .execute(&mut *conn)
                    .await
                    .map_err(BenchError::db)?;
                // Back to the store's isolation level before the pool hands it out again.
                sqlx::raw_sql("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                    .execute(&mut *conn)
                    .await
                    .map_err(BenchError::db)?;
                Ok(())
            }
        }
    }
}

/// Writes `events` pending events by plain SQL, as a producer in another language would, takes
/// statistics while they are pending (the worst moment for a DBA's `ANALYZE`), and drains them
/// with `relay_dbs`' relays; with `hold`, while a transaction that read the table stays open
/// ([`Held`]).
async fn drain_backlog(
    db: &Db,
    relay_dbs: &[Db],
    config: &RelayConfig,
    events: u64,
    hold: Hold,
    bars: &dyn Fn(u64, &str) -> ProgressBar,
) -> Result<(Throughput, Option<ClaimTimes>), BenchError> {
    // Each drain starts from the same table: what the drain before left dead is vacuumed, as
    // autovacuum would have done by the time the next backlog arrives (else the later drains
    // also pay for the earlier ones' dead rows, and the three drains are not alike).
    if let Db::Pg(pool) = db {
        sqlx::query("VACUUM outbox_events")
            .execute(pool)
            .await
            .map_err(BenchError::db)?;
    }
    // The producer's event is drawn before the backlog's: every event of the backlog is above
    // the commit horizon while it stays open.
    let producer = if hold == Hold::Producer {
        Some(Held::producer(db).await?)
    } else {
        None
    };
    match db {
        Db::Pg(pool) => {
            pending_by_sql(pool, 1, events).await?;
            analyze_and_checkpoint(pool).await?;
        }
        Db::MySql(pool, _) => {
            // Rows of 1,000 per statement: MySQL has no generate_series.
            let mut written = 0;
            while written < events {
                let n = (events - written).min(1000);
                let mut insert = sqlx::QueryBuilder::<sqlx::MySql>::new(
                    "INSERT INTO outbox_events (event_type, aggregate_type, aggregate_id, payload) ",
                );
                insert.push_values(written + 1..=written + n, |mut row, g| {
                    row.push_bind("InvoiceCreated")
                        .push_bind("Invoice")
                        .push_bind(g.to_string())
                        .push_bind(crate::db::payload(g).to_string());
                });
                insert.build().execute(pool).await.map_err(BenchError::db)?;
                written += n;
            }
            sqlx::query("ANALYZE TABLE outbox_events")
                .execute(pool)
                .await
                .map_err(BenchError::db)?;
        }
        Db::Sqlite(_) => {
            return Err(BenchError::Setup(
                "the held-snapshot drain needs PostgreSQL or MySQL".into(),
            ));
        }
    }
    let held = match hold {
        Hold::Snapshot => Some(Held::open(db).await?),
        Hold::Producer => producer,
        Hold::Nothing => None,
    };
    let what = match hold {
        Hold::Nothing => "history: drain a backlog",
        Hold::Snapshot => "history: drain a backlog, snapshot held",
        Hold::Producer => "history: drain a backlog, producer transaction held",
    };
    let bar = bars(events, what);
    let drained = phases::drain(relay_dbs, config, events, &bar).await?;
    bar.finish_and_clear();
    if let Some(held) = held {
        held.close().await?;
    }
    Ok(drained)
}

/// Pending events `first..=last` (by number, ~300 bytes each as every phase's), written in one
/// statement by plain SQL, as a producer in another language would.
pub(crate) async fn pending_by_sql(pool: &PgPool, first: u64, last: u64) -> Result<(), BenchError> {
    sqlx::query(
        "INSERT INTO outbox_events (event_type, aggregate_type, aggregate_id, payload)
         SELECT 'InvoiceCreated', 'Invoice', g::text,
                jsonb_build_object('invoice_id', g, 'customer', 'cus_0123456789abcdef',
                                   'amount_cents', 129900 + g % 1000, 'currency', 'EUR',
                                   'lines', $3::jsonb, 'note', $4::text)
         FROM generate_series($1::bigint, $2::bigint) AS g",
    )
    .bind(first as i64)
    .bind(last as i64)
    // The rest of the ~300 bytes every phase's events carry (db::payload).
    .bind(&crate::db::payload(0)["lines"])
    .bind(crate::db::payload(0)["note"].as_str())
    .execute(pool)
    .await
    .map_err(BenchError::db)?;
    Ok(())
}

/// Statistics taken while the backlog is pending (the worst moment for a DBA's `ANALYZE`), and
/// no checkpoint owed when the drain starts.
pub(crate) async fn analyze_and_checkpoint(pool: &PgPool) -> Result<(), BenchError> {
    sqlx::query("ANALYZE outbox_events")
        .execute(pool)
        .await
        .map_err(BenchError::db)?;
    // Each drain starts with no checkpoint owed: the WAL written before it (the history, this
    // backlog) would otherwise start one during some drains and not others, and the full-page
    // images written after a checkpoint starts slow the claims of that moment. The quiet and
    // held drains then differ by the snapshot alone. CHECKPOINT needs a superuser or
    // pg_checkpoint: without either the drains run as they come, and the report's claim p99
    // may then hold a checkpoint's.
    if let Err(e) = sqlx::query("CHECKPOINT").execute(pool).await {
        match e.as_database_error().and_then(|d| d.code()) {
            Some(code) if code == "42501" => tracing::warn!(
                "the bench's role may not CHECKPOINT (grant it pg_checkpoint); the drains start \
                 with whatever checkpoint is owed"
            ),
            _ => return Err(BenchError::db(e)),
        }
    }
    Ok(())
}

/// `rows` processed events, created over the last `span` in id order, written by plain SQL;
/// then `VACUUM ANALYZE`, as a DBA would run it.
async fn write_history(pool: &PgPool, rows: u64, span: Duration) -> Result<(), BenchError> {
    let chunk = 200_000u64;
    let mut first = 1u64;
    while first <= rows {
        let last = (first + chunk - 1).min(rows);
        sqlx::query(
            "INSERT INTO outbox_events (event_type, aggregate_type, aggregate_id, payload, status,
                                        processed_at, created_at, updated_at)
             SELECT 'InvoiceCreated', 'Invoice', g::text,
                    jsonb_build_object('invoice_id', g, 'customer', 'cus_0123456789abcdef',
                                       'amount_cents', 129900 + g % 1000, 'currency', 'EUR',
                                       'note', 'history written by plain SQL'),
                    'PROCESSED', t, t, t
             FROM generate_series($1::bigint, $2::bigint) AS g,
                  LATERAL (SELECT now() - $4::float8 * interval '1 second'
                                  * (1 - g::float8 / $3::float8) AS t) AS c",
        )
        .bind(first as i64)
        .bind(last as i64)
        .bind(rows as f64)
        .bind(span.as_secs_f64())
        .execute(pool)
        .await
        .map_err(BenchError::db)?;
        first = last + 1;
    }
    sqlx::query("VACUUM ANALYZE outbox_events")
        .execute(pool)
        .await
        .map_err(BenchError::db)?;
    Ok(())
}

/// Published events of the window and their commit-to-publish p50 and p99, ms.
fn window_latency(times: &Mutex<Times>) -> Result<(u64, (f64, f64)), BenchError> {
    let mut times = times
        .lock()
        .map_err(|_| BenchError::Check("times poisoned".into()))?;
    let mut hist = Histogram::<u64>::new(3).map_err(|e| BenchError::Check(e.to_string()))?;
    // Taken, not read: the bench's own bookkeeping must stay as flat as the relay's memory it
    // reports (a map of every event of the run would grow the process by tens of MiB).
    let published = std::mem::take(&mut times.published);
    let count = published.len() as u64;
    let early = std::mem::take(&mut times.early);
    for (id, published) in early.into_iter().chain(published) {
        match times.committed.remove(&id) {
            Some(committed) => {
                let us = published.saturating_duration_since(committed).as_micros() as u64;
                hist.record(us.max(1)).ok();
            }
            None => {
                times.early.insert(id, published);
            }
        }
    }
    let ms = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    Ok((count, (ms(0.5), ms(0.99))))
}

/// The cost of a claim of 100 on the table as it is, from the start of the table (a relay's
/// sweep; its other claims start from its floor): 20 claims, each rolled back (nothing is taken
/// from the relays), p50 and p99 in ms.
async fn claim_probe(pool: &PgPool) -> Result<(f64, f64), BenchError> {
    let mut hist = Histogram::<u64>::new(3).map_err(|e| BenchError::Check(e.to_string()))?;
    for _ in 0..20 {
        let mut tx = pool.begin().await.map_err(BenchError::db)?;
        let started = Instant::now();
        sqlx::query(
            "SELECT count(*) FROM postbox_claim(100, 30000, 'bench-probe', gen_random_uuid(),
                                                 ARRAY[]::text[], 0, 'probe', 0, 100, false)",
        )
        .execute(&mut *tx)
        .await
        .map_err(BenchError::db)?;
        hist.record(started.elapsed().as_micros().max(1) as u64)
            .ok();
        tx.rollback().await.map_err(BenchError::db)?;
    }
    let ms = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    Ok((ms(0.5), ms(0.99)))
}

/// Table, indexes and archive sizes in MiB, live and dead rows of the table.
async fn sizes(pool: &PgPool) -> Result<(f64, f64, f64, u64, u64), BenchError> {
    let (table, indexes, archive, live, dead): (i64, i64, Option<i64>, i64, i64) = sqlx::query_as(
        "SELECT pg_table_size('outbox_events'), pg_indexes_size('outbox_events'),
                (SELECT sum(pg_total_relation_size(inhrelid))::bigint FROM pg_inherits
                 WHERE inhparent = 'outbox_events_archive'::regclass),
                coalesce((SELECT n_live_tup FROM pg_stat_user_tables
                          WHERE relid = 'outbox_events'::regclass), 0),
                coalesce((SELECT n_dead_tup FROM pg_stat_user_tables
                          WHERE relid = 'outbox_events'::regclass), 0)",
    )
    .fetch_one(pool)
    .await
    .map_err(BenchError::db)?;
    let mib = |b: i64| b as f64 / (1024.0 * 1024.0);
    Ok((
        mib(table),
        mib(indexes),
        mib(archive.unwrap_or(0)),
        u64::try_from(live).unwrap_or(0),
        u64::try_from(dead).unwrap_or(0),
    ))
}
