//! CDC against polling, in one run on one server (PostgreSQL with `wal_level = logical`):
//! commit-to-publish latency from plain-SQL producers, the drain of a plain-SQL backlog on a
//! quiet database and with a snapshot held open, beside the 4-client claim + mark ceiling, and
//! the WAL the slot keeps while 20 other tables churn, while the relay is stopped, and until it
//! has caught up again.
//!
//! Both relays run as a user starts them: `RelayConfig::default()` and, for CDC,
//! `CdcConfig::default()` with a slot of the run's own.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::future::try_join_all;
use indicatif::ProgressBar;
use postbox::{PgStore, Relay, RelayConfig, Sink, Store, StoreExt, relay::RelayStats};
use postbox_cdc::{CdcConfig, CdcStore};
use sqlx::PgPool;

use crate::db::Db;
use crate::history::Held;
use crate::phases;
use crate::report::{CdcOutcome, CdcRun, CdcWal, Deploy, Throughput};
use crate::scratch::Scratch;
use crate::{BenchError, BenchOptions};

/// Other tables that take writes while the slot is watched.
const CHURN_TABLES: u32 = 20;
/// Rows in each churning table; every churn statement rewrites all of them.
const CHURN_ROWS: u32 = 1000;
/// Plain-SQL backlogs are written in transactions of this many events.
const BACKLOG_CHUNK: u64 = 1000;
/// How long a slot may take to stream, go idle or catch up before the run is void.
const SLOT_WAIT: Duration = Duration::from_secs(120);

/// What the phase measures: CDC and polling side by side.
pub(crate) async fn run(
    scratch: &Scratch,
    db: &Db,
    opts: &BenchOptions,
    bars: &dyn Fn(u64, &str) -> ProgressBar,
) -> Result<CdcOutcome, BenchError> {
    let (Some(url), Some(slot)) = (scratch.url(), scratch.slot_name()) else {
        return Err(BenchError::Setup(
            "the CDC comparison needs PostgreSQL".into(),
        ));
    };
    let Db::Pg(pool) = db else {
        return Err(BenchError::Setup(
            "the CDC comparison needs PostgreSQL".into(),
        ));
    };
    // The CDC relay's own connections, as the polling relay's (`poll_db`): on the producers'
    // pool (a few connections for 8 producers) its claims and marks waited for theirs.
    let Db::Pg(relay_pool) = scratch.open(4).await? else {
        return Err(BenchError::Setup(
            "the CDC comparison needs PostgreSQL".into(),
        ));
    };
    let cdc = Cdc {
        url,
        pool: relay_pool,
        config: CdcConfig::default().slot(slot.clone()),
    };
    // The first start makes the slot: a server that cannot is a finding, not a failed run.
    match cdc.start().await {
        Ok(store) => {
            // Read once, so the slot exists for the phases to move it.
            cdc.streaming(&store).await?;
            cdc.stop(store).await?;
        }
        Err(
            e @ (postbox_cdc::Error::WalLevel { .. } | postbox_cdc::Error::NoReplication { .. }),
        ) => {
            return Ok(CdcOutcome::Unavailable {
                reason: e.to_string(),
            });
        }
        Err(e) => return Err(BenchError::Setup(format!("CDC relay: {e}"))),
    }
    let relay = RelayConfig::default();
    let poll_db = scratch.open(4).await?;
    let mut ceiling_dbs = Vec::with_capacity(4);
    for _ in 0..4 {
        ceiling_dbs.push(scratch.open(4).await?);
    }

    // Latency: the same plain-SQL producers (no NOTIFY) for both.
    let plain = db.store().outbox_builder().notify(false).build();
    let expected = (opts.cdc_rate as f64 * opts.latency_duration.as_secs_f64()) as u64;
    scratch.reset().await?;
    let bar = bars(expected, "cdc: latency, polling relay");
    let latency_poll = phases::latency(
        db,
        poll_db.store(),
        &plain,
        &relay,
        opts.cdc_rate,
        opts.latency_duration,
        &bar,
    )
    .await?;
    bar.finish_and_clear();
    scratch.reset().await?;
    // The slot still holds the polling phase's inserts (truncated since): a relay started on
    // them would first read back 30,000 events that are gone. A running CDC relay has read
    // what went before; measure that one.
    cdc.skip_to_now().await?;
    let store = cdc.start().await.map_err(cdc_setup)?;
    cdc.streaming(&store).await?;
    let bar = bars(expected, "cdc: latency, CDC relay");
    let latency_cdc = phases::latency(
        db,
        store.clone(),
        &plain,
        &relay,
        opts.cdc_rate,
        opts.latency_duration,
        &bar,
    )
    .await;
    bar.finish_and_clear();
    // The same producers into a tenant's outbox, through the same slot.
    let latency_cdc_tenant = match &latency_cdc {
        Ok(_) => {
            let bar = bars(expected, "cdc: latency, CDC relay, a tenant's outbox");
            let tenant = tenant_latency(&cdc, &store, db, &relay, opts, &bar).await;
            bar.finish_and_clear();
            Some(tenant)
        }
        Err(_) => None,
    };
    cdc.stop(store).await?;
    let latency_cdc = latency_cdc?;
    // Measured whenever the default schema's run was (which returned above otherwise).
    let latency_cdc_tenant = latency_cdc_tenant
        .transpose()?
        .ok_or_else(|| BenchError::Check("the tenant's latency was not measured".into()))?;

    // A rolling deploy under the same load: a new relay process beside the old one, then the
    // old one stopped.
    scratch.reset().await?;
    cdc.skip_to_now().await?;
    let Db::Pg(new_pod) = scratch.open(4).await? else {
        return Err(BenchError::Setup(
            "the CDC comparison needs PostgreSQL".into(),
        ));
    };
    let bar = bars(expected, "cdc: latency, CDC relay, rolling deploy");
    let deploy = rolling_deploy(&cdc, new_pod, db, &relay, opts, &bar).await?;
    bar.finish_and_clear();

    // Drains of the same plain-SQL backlog.
    let events = opts.cdc_events;
    scratch.reset().await?;
    backlog(pool, events, bars).await?;
    let bar = bars(events, "cdc: ceiling, 4 clients");
    let ceiling = phases::ceiling(&ceiling_dbs, &relay, events, &bar).await?;
    bar.finish_and_clear();
    let mut drains = Vec::with_capacity(4);
    for hold in [false, true] {
        scratch.reset().await?;
        backlog(pool, events, bars).await?;
        let held = if hold {
            Some(Held::open(db).await?)
        } else {
            None
        };
        let what = if hold { ", snapshot held" } else { "" };
        let bar = bars(events, &format!("cdc: drain, polling relay{what}"));
        let poll = phases::drain(std::slice::from_ref(&poll_db), &relay, events, &bar).await;
        bar.finish_and_clear();
        if let Some(held) = held {
            held.close().await?;
        }
        drains.push(poll?.0);

        scratch.reset().await?;
        // The slot exists and is idle: the backlog waits in it as in the table, and the relay
        // starts on both, as after a restart. Only the backlog: the polling drain's inserts,
        // claims and marks (all gone with the table's reset) are skipped first, or the CDC
        // relay would be timed decoding the other relay's work too.
        cdc.skip_to_now().await?;
        backlog(pool, events, bars).await?;
        let held = if hold {
            Some(Held::open(db).await?)
        } else {
            None
        };
        let bar = bars(events, &format!("cdc: drain, CDC relay{what}"));
        let started = Instant::now();
        let store = cdc.start().await.map_err(cdc_setup)?;
        let drained = phases::drain_running(store.clone(), &relay, events, &bar).await;
        bar.finish_and_clear();
        cdc.stop(store).await?;
        if let Some(held) = held {
            held.close().await?;
        }
        // From the relay's start, as the polling drain is.
        let drained = drained?;
        drains.push(Throughput::new(drained.count, started.elapsed()));
    }
    let (poll, cdc_quiet, poll_held, cdc_held) = (drains[0], drains[1], drains[2], drains[3]);

    scratch.reset().await?;
    let wal = churn(&cdc, pool, &relay, opts, bars).await?;
    cdc.drop_slot().await?;
    Ok(CdcOutcome::Measured(Box::new(CdcRun {
        slot,
        rate: opts.cdc_rate,
        latency_poll,
        latency_cdc,
        latency_cdc_tenant,
        deploy,
        events,
        ceiling,
        poll,
        cdc: cdc_quiet,
        cdc_over_poll: cdc_quiet.per_second / poll.per_second,
        cdc_over_ceiling: cdc_quiet.per_second / ceiling.per_second,
        poll_held,
        cdc_held,
        cdc_held_over_quiet: cdc_held.per_second / cdc_quiet.per_second,
        poll_held_over_quiet: poll_held.per_second / poll.per_second,
        wal,
    })))
}

/// Commit-to-publish latency of plain-SQL producers writing into a tenant's outbox (tenant
/// `cdc`, added now), read from the slot by the running CDC relay once its table is in the
/// publication.
async fn tenant_latency(
    cdc: &Cdc,
    store: &Arc<CdcStore>,
    db: &Db,
    relay: &RelayConfig,
    opts: &BenchOptions,
    bar: &ProgressBar,
) -> Result<crate::report::Percentiles, BenchError> {
    use postbox::ops::StoreOps;
    let registry = PgStore::new(cdc.pool.clone());
    let id = postbox::schema::TenantId::new("cdc").map_err(|e| BenchError::Setup(e.to_string()))?;
    let tenant = registry
        .tenant_add(&postbox::store::TenantAddParams {
            id: &id,
            schema: None,
        })
        .await
        .map_err(|e| BenchError::Setup(format!("tenant for the CDC latency run: {e}")))?;
    let deadline = Instant::now() + SLOT_WAIT;
    loop {
        let published: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_publication_tables \
             WHERE pubname = $1 AND schemaname = $2 AND tablename = 'outbox_events')",
        )
        .bind(&cdc.config.publication)
        .bind(tenant.schema.as_str())
        .fetch_one(&cdc.pool)
        .await
        .map_err(BenchError::db)?;
        if published {
            break;
        }
        if Instant::now() > deadline {
            return Err(BenchError::Check(format!(
                "the CDC relay did not add tenant {}'s outbox to its publication within {} s",
                tenant.id,
                SLOT_WAIT.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let outbox = db
        .store()
        .outbox_builder()
        .tenant(&tenant)
        .notify(false)
        .build();
    phases::latency(
        db,
        Arc::clone(store) as Arc<dyn Store>,
        &outbox,
        relay,
        opts.cdc_rate,
        opts.latency_duration,
        bar,
    )
    .await
}

/// A rolling deploy of the CDC relay under the latency runs' load, as a user runs one: the old
/// relay reads the slot; after a third of the run a new relay process starts beside it (a
/// store of its own on its own connections, started as the binary starts it: it waits as a
/// standby); after two thirds the old one is stopped (SIGTERM: it finishes what it holds and
/// lets the slot go) and the new one takes the slot over. Commit-to-publish latency across the
/// whole run, and the events published twice.
async fn rolling_deploy(
    cdc: &Cdc,
    new_pod: PgPool,
    db: &Db,
    relay: &RelayConfig,
    opts: &BenchOptions,
    bar: &ProgressBar,
) -> Result<Deploy, BenchError> {
    db.create_business_table().await?;
    let sink = Arc::new(phases::LatencySink::default());
    let old = cdc.start().await.map_err(cdc_setup)?;
    cdc.streaming(&old).await?;
    let old_relay = Relay::from_parts(
        Arc::clone(&old) as Arc<dyn Store>,
        Arc::clone(&sink) as Arc<dyn Sink>,
        relay.clone(),
    )?
    .start();
    let plain = db.store().outbox_builder().notify(false).build();
    let third = opts.latency_duration / 3;
    let new = Cdc {
        url: cdc.url.clone(),
        pool: new_pod,
        config: cdc.config.clone(),
    };
    let deploy = async {
        tokio::time::sleep(third).await;
        let store = new.start().await.map_err(cdc_setup)?;
        let handle = Relay::from_parts(
            Arc::clone(&store) as Arc<dyn Store>,
            Arc::clone(&sink) as Arc<dyn Sink>,
            relay.clone(),
        )?
        .start();
        tokio::time::sleep(third).await;
        let in_flight = old.status().unrecorded;
        let stopping = Instant::now();
        old_relay.stop().await?;
        cdc.stop(old).await?;
        let taken = Instant::now();
        new.streaming(&store).await?;
        Ok::<_, BenchError>((store, handle, in_flight, stopping, taken))
    };
    let (committed, (store, handle, in_flight, stopping, taken)) = tokio::try_join!(
        phases::produce(db, &plain, opts.cdc_rate, opts.latency_duration, bar),
        deploy
    )?;
    phases::caught_up(&sink, committed.len()).await;
    handle.stop().await?;
    new.stop(store).await?;
    Ok(Deploy {
        latency: phases::percentiles(&committed, &sink, opts.cdc_rate, opts.latency_duration)?,
        events: committed.len() as u64,
        repeats: sink.repeats(),
        in_flight: in_flight as u64,
        stop_ms: taken.duration_since(stopping).as_secs_f64() * 1000.0,
    })
}

fn cdc_setup(e: postbox_cdc::Error) -> BenchError {
    BenchError::Setup(format!("CDC relay: {e}"))
}

/// The run's CDC relay: where it connects and with which slot.
struct Cdc {
    url: String,
    pool: PgPool,
    config: CdcConfig,
}

impl Cdc {
    async fn start(&self) -> Result<Arc<CdcStore>, postbox_cdc::Error> {
        let store = PgStore::new(self.pool.clone());
        Ok(Arc::new(
            CdcStore::start(store, &self.url, self.config.clone()).await?,
        ))
    }

    /// Waits until the slot is read, so what commits next is delivered by it.
    async fn streaming(&self, store: &CdcStore) -> Result<(), BenchError> {
        let deadline = Instant::now() + SLOT_WAIT;
        while !store.status().streaming {
            if Instant::now() > deadline {
                return Err(BenchError::Check(format!(
                    "slot {} was not read within {} s",
                    self.config.slot,
                    SLOT_WAIT.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// Stops reading the slot and waits until the server lets it go, so the next start can take
    /// it.
    async fn stop(&self, store: Arc<CdcStore>) -> Result<(), BenchError> {
        match Arc::try_unwrap(store) {
            Ok(mut store) => store.stop().await,
            // Someone still holds it: dropping our share cancels its reader all the same.
            Err(store) => drop(store),
        }
        let deadline = Instant::now() + SLOT_WAIT;
        loop {
            let active: Option<bool> =
                sqlx::query_scalar("SELECT active FROM pg_replication_slots WHERE slot_name = $1")
                    .bind(&self.config.slot)
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(BenchError::db)?;
            if active != Some(true) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(BenchError::Check(format!(
                    "slot {} stayed active {} s after its relay stopped",
                    self.config.slot,
                    SLOT_WAIT.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The slot's WAL, read at one instant: how far it trails (from its confirmed position to
    /// the server's current one), and what the server keeps for it (from its `restart_lsn`,
    /// which an open transaction holds back).
    async fn wal(&self) -> Result<(u64, u64), BenchError> {
        let row: Option<(Option<i64>, Option<i64>)> = sqlx::query_as(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint, \
                    pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint \
             FROM pg_replication_slots WHERE slot_name = $1",
        )
        .bind(&self.config.slot)
        .fetch_optional(&self.pool)
        .await
        .map_err(BenchError::db)?;
        let bytes = |b: Option<i64>| b.map_or(0, |b| u64::try_from(b).unwrap_or(0));
        Ok(row.map_or((0, 0), |(behind, kept)| (bytes(behind), bytes(kept))))
    }

    /// How far the slot trails ([`Cdc::wal`]).
    async fn retained(&self) -> Result<u64, BenchError> {
        Ok(self.wal().await?.0)
    }

    /// Makes the slot again at the server's current WAL position, past everything written so
    /// far (the scratch table was reset: none of it is an event any more). Moving the old slot
    /// there (`pg_replication_slot_advance`) moves where it is confirmed, but where its reader
    /// restarts stays at the last point with no transaction open (seen here a gigabyte back):
    /// the next reader decoded the other relay's drain again, seconds of it, before it reached
    /// the backlog.
    async fn skip_to_now(&self) -> Result<(), BenchError> {
        self.drop_slot().await?;
        sqlx::query("SELECT pg_create_logical_replication_slot($1, 'pgoutput')")
            .bind(&self.config.slot)
            .execute(&self.pool)
            .await
            .map_err(BenchError::db)?;
        Ok(())
    }

    async fn drop_slot(&self) -> Result<(), BenchError> {
        sqlx::query(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
             WHERE slot_name = $1",
        )
        .bind(&self.config.slot)
        .execute(&self.pool)
        .await
        .map_err(BenchError::db)?;
        Ok(())
    }
}

/// `events` pending events written by plain SQL in transactions of [`BACKLOG_CHUNK`] (as
/// producers in another language would), `ANALYZE`d while pending, and no checkpoint owed.
async fn backlog(
    pool: &PgPool,
    events: u64,
    bars: &dyn Fn(u64, &str) -> ProgressBar,
) -> Result<(), BenchError> {
    let bar = bars(events, "cdc: backlog (plain SQL)");
    let mut written = 0;
    while written < events {
        let n = BACKLOG_CHUNK.min(events - written);
        crate::history::pending_by_sql(pool, written + 1, written + n).await?;
        written += n;
        bar.set_position(written);
    }
    bar.finish_and_clear();
    crate::history::analyze_and_checkpoint(pool).await?;
    Ok(())
}

/// The slot's retained WAL while [`CHURN_TABLES`] tables take writes and the outbox is idle:
/// with the relay running (`opts.cdc_churn`), then stopped (`opts.cdc_stopped`), then
/// restarted until the slot has caught up.
async fn churn(
    cdc: &Cdc,
    pool: &PgPool,
    relay: &RelayConfig,
    opts: &BenchOptions,
    bars: &dyn Fn(u64, &str) -> ProgressBar,
) -> Result<CdcWal, BenchError> {
    for t in 0..CHURN_TABLES {
        // `t` is a number below CHURN_TABLES: the name is ours, not input.
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP TABLE IF EXISTS public.bench_churn_{t};
             CREATE TABLE public.bench_churn_{t} (id int PRIMARY KEY, data text NOT NULL);
             INSERT INTO public.bench_churn_{t}
             SELECT g, md5(g::text) FROM generate_series(1, {CHURN_ROWS}) AS g;"
        )))
        .execute(pool)
        .await
        .map_err(BenchError::db)?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let churners: Vec<_> = (0..2u32)
        .map(|c| {
            let pool = pool.clone();
            let stop = Arc::clone(&stop);
            tokio::spawn(async move {
                let mut t = c;
                while !stop.load(Ordering::Relaxed) {
                    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                        "UPDATE public.bench_churn_{} SET data = md5(random()::text)",
                        t % CHURN_TABLES
                    )))
                    .execute(&pool)
                    .await
                    .map_err(BenchError::db)?;
                    t += 2;
                }
                Ok::<_, BenchError>(())
            })
        })
        .collect();
    let outcome = watch_churn(cdc, pool, relay, opts, bars).await;
    stop.store(true, Ordering::Relaxed);
    try_join_all(churners)
        .await
        .map_err(|e| BenchError::Check(format!("churn task failed: {e}")))?
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    for t in 0..CHURN_TABLES {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP TABLE IF EXISTS public.bench_churn_{t}"
        )))
        .execute(pool)
        .await
        .map_err(BenchError::db)?;
    }
    outcome
}

async fn wal_lsn(pool: &PgPool) -> Result<i64, BenchError> {
    sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint")
        .fetch_one(pool)
        .await
        .map_err(BenchError::db)
}

const MIB: f64 = 1024.0 * 1024.0;

async fn watch_churn(
    cdc: &Cdc,
    pool: &PgPool,
    relay: &RelayConfig,
    opts: &BenchOptions,
    bars: &dyn Fn(u64, &str) -> ProgressBar,
) -> Result<CdcWal, BenchError> {
    let sink: Arc<dyn Sink> = Arc::new(phases::CountingSink::default());
    let running = |store: Arc<dyn Store>| {
        let relay = postbox::Relay::from_parts(store, Arc::clone(&sink), relay.clone());
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            relay?
                .run(async {
                    let _ = stop_rx.await;
                })
                .await
        });
        (stop_tx, task)
    };
    let end_relay = |(stop_tx, task): (
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<postbox::Result<RelayStats>>,
    )| async move {
        let _ = stop_tx.send(());
        task.await
            .map_err(|e| BenchError::Check(format!("relay task failed: {e}")))?
            .map(drop)
            .map_err(BenchError::from)
    };

    let store = cdc.start().await.map_err(cdc_setup)?;
    cdc.streaming(&store).await?;
    let handle = running(store.clone());
    let wal_start = wal_lsn(pool).await?;
    let started = Instant::now();
    let (mut retained, mut kept) =
        sample_wal(cdc, opts.cdc_churn, bars, "cdc: slot while 20 tables churn").await?;
    let seconds = started.elapsed().as_secs_f64();
    let written = (wal_lsn(pool).await? - wal_start).max(0) as f64;
    let retained_end = cdc.retained().await?;
    // The same again with one producer transaction held open (it wrote an outbox row and
    // neither commits nor rolls back): the slot's confirmation goes on, what the server keeps
    // for it cannot pass the transaction.
    let mut held = pool.begin().await.map_err(BenchError::db)?;
    sqlx::query(
        "INSERT INTO outbox_events (event_type, aggregate_type, aggregate_id, payload) \
         VALUES ('BenchHeld', 'Bench', 'held', '{}')",
    )
    .execute(&mut *held)
    .await
    .map_err(BenchError::db)?;
    let (mut held_retained, mut held_kept) = sample_wal(
        cdc,
        opts.cdc_churn,
        bars,
        "cdc: slot while 20 tables churn, a producer transaction held open",
    )
    .await?;
    held.rollback().await.map_err(BenchError::db)?;
    end_relay(handle).await?;
    cdc.stop(store).await?;

    let bar = bars(
        opts.cdc_stopped.as_secs(),
        "cdc: relay stopped, tables churn",
    );
    let stopped_at = Instant::now();
    while stopped_at.elapsed() < opts.cdc_stopped {
        tokio::time::sleep(Duration::from_millis(250)).await;
        bar.set_position(stopped_at.elapsed().as_secs());
    }
    bar.finish_and_clear();
    let after_stop = cdc.retained().await?;

    // Restarted: how long until the slot is confirmed past where the server was at the restart.
    let restart_lsn = wal_lsn(pool).await?;
    let restarted = Instant::now();
    let store = cdc.start().await.map_err(cdc_setup)?;
    let handle = running(store.clone());
    let caught_up = loop {
        let confirmed: Option<i64> = sqlx::query_scalar(
            "SELECT pg_wal_lsn_diff(confirmed_flush_lsn, '0/0')::bigint \
             FROM pg_replication_slots WHERE slot_name = $1",
        )
        .bind(&cdc.config.slot)
        .fetch_optional(pool)
        .await
        .map_err(BenchError::db)?
        .flatten();
        if confirmed.is_some_and(|c| c >= restart_lsn) {
            break Ok(restarted.elapsed());
        }
        if restarted.elapsed() > SLOT_WAIT {
            break Err(BenchError::Check(format!(
                "slot {} did not catch up within {} s of its relay's restart",
                cdc.config.slot,
                SLOT_WAIT.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let after_catch_up = cdc.retained().await?;
    end_relay(handle).await?;
    cdc.stop(store).await?;
    let caught_up = caught_up?;

    let (p50, max) = median_and_max(&mut retained);
    let (kept_p50, kept_max) = median_and_max(&mut kept);
    let (_, held_retained_max) = median_and_max(&mut held_retained);
    let (held_kept_p50, held_kept_max) = median_and_max(&mut held_kept);
    Ok(CdcWal {
        kept_p50_mib: kept_p50 as f64 / MIB,
        kept_max_mib: kept_max as f64 / MIB,
        held_retained_max_mib: held_retained_max as f64 / MIB,
        held_kept_p50_mib: held_kept_p50 as f64 / MIB,
        held_kept_max_mib: held_kept_max as f64 / MIB,
        tables: CHURN_TABLES,
        seconds,
        written_mib: written / MIB,
        written_mib_per_second: written / MIB / seconds.max(1e-9),
        retained_p50_mib: p50 as f64 / MIB,
        retained_max_mib: max as f64 / MIB,
        retained_end_mib: retained_end as f64 / MIB,
        stopped_seconds: opts.cdc_stopped.as_secs_f64(),
        retained_after_stop_mib: after_stop as f64 / MIB,
        catch_up_seconds: caught_up.as_secs_f64(),
        retained_after_catch_up_mib: after_catch_up as f64 / MIB,
    })
}

/// The slot's WAL ([`Cdc::wal`]) once a second for `duration`: how far it trailed, and what the
/// server kept for it.
async fn sample_wal(
    cdc: &Cdc,
    duration: Duration,
    bars: &dyn Fn(u64, &str) -> ProgressBar,
    what: &str,
) -> Result<(Vec<u64>, Vec<u64>), BenchError> {
    let started = Instant::now();
    let bar = bars(duration.as_secs(), what);
    let (mut behind, mut kept) = (Vec::new(), Vec::new());
    while started.elapsed() < duration {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (b, k) = cdc.wal().await?;
        behind.push(b);
        kept.push(k);
        bar.set_position(started.elapsed().as_secs());
    }
    bar.finish_and_clear();
    Ok((behind, kept))
}

/// The median and the largest of `samples` (0 when there are none).
fn median_and_max(samples: &mut [u64]) -> (u64, u64) {
    samples.sort_unstable();
    let p50 = samples.get(samples.len() / 2).copied().unwrap_or(0);
    (p50, samples.last().copied().unwrap_or(0))
}
