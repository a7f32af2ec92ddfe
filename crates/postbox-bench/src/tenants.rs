//! The tenants phase (PostgreSQL): one schema per tenant, hundreds or thousands of them, one or
//! two relays with the defaults a user starts them with, and plain-SQL producers (no `NOTIFY`)
//! committing events each into a random tenant's outbox. It measures commit → publish, the
//! relays' CPU idle and under load, their server connections, a destination where 2 % of
//! publishes take 2 s, and the others' latency while one tenant drains a large backlog.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use hdrhistogram::Histogram;
use indicatif::ProgressBar;
use postbox::schema::TenantId;
use postbox::store::TenantAddParams;
use postbox::{OutboxEvent, PublishError, Relay, RelayConfig, SchemaName, Sink};
use sqlx::AssertSqlSafe;
use sqlx::postgres::PgPool;

use crate::BenchError;
use crate::db::Db;
use crate::report::{Percentiles, TenantLatency, TenantsRun};
use crate::scratch::Scratch;

/// Tenants added at once while setting up.
const ADD_JOBS: usize = 4;

/// Connections each relay's pool has: as many as the `postbox` binary opens.
const RELAY_CONNECTIONS: u32 = 4;

/// The producers committing the events, each on a connection of its own.
const PRODUCERS: usize = 4;

/// What the tenants phase runs, per tenant count.
#[derive(Clone, Debug)]
pub(crate) struct TenantsPlan {
    pub(crate) rates: Vec<u64>,
    pub(crate) duration: Duration,
    pub(crate) warmup: Duration,
    pub(crate) idle: Duration,
    pub(crate) backlog: u64,
    pub(crate) relays: Vec<usize>,
}

/// Records when each event was published, by tenant and id; every `slow_every`th publish takes
/// `slow` (a destination that answers in seconds now and then).
struct TenantSink {
    published: Mutex<HashMap<(Option<String>, i64), Instant>>,
    count: AtomicU64,
    slow_every: u64,
    slow: Duration,
    slowed: Mutex<Vec<(Option<String>, i64)>>,
}

impl TenantSink {
    fn new(slow_every: u64, slow: Duration) -> Arc<Self> {
        Arc::new(TenantSink {
            published: Mutex::default(),
            count: AtomicU64::new(0),
            slow_every,
            slow,
            slowed: Mutex::default(),
        })
    }
}

#[async_trait]
impl Sink for TenantSink {
    async fn publish(&self, event: &OutboxEvent) -> Result<(), PublishError> {
        let n = self.count.fetch_add(1, Ordering::Relaxed) + 1;
        let key = (event.tenant.as_ref().map(ToString::to_string), event.id);
        if self.slow_every > 0 && n.is_multiple_of(self.slow_every) {
            if let Ok(mut slowed) = self.slowed.lock() {
                slowed.push(key.clone());
            }
            tokio::time::sleep(self.slow).await;
        }
        let now = Instant::now();
        self.published
            .lock()
            .map_err(|_| PublishError::retryable("latency map poisoned"))?
            .entry(key)
            .or_insert(now);
        Ok(())
    }
}

/// The CPU time this process has used so far (user and system).
fn cpu_time() -> Duration {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return Duration::ZERO;
    };
    // Fields after the command name (which may hold spaces, in parentheses): utime and stime
    // are the 12th and 13th of them, in clock ticks (100 a second on Linux).
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

/// Share of one core used over `wall`, in percent.
fn core_pct(cpu: Duration, wall: Duration) -> f64 {
    cpu.as_secs_f64() / wall.as_secs_f64().max(1e-9) * 100.0
}

/// Relays running with defaults, on pools of their own, publishing to `sink`.
struct Relays {
    handles: Vec<postbox::RelayHandle>,
    rounds: Vec<postbox::relay::Rounds>,
}

impl Relays {
    async fn start(
        scratch: &Scratch,
        n: usize,
        sink: Arc<TenantSink>,
    ) -> Result<Relays, BenchError> {
        let mut handles = Vec::with_capacity(n);
        let mut rounds = Vec::with_capacity(n);
        for _ in 0..n {
            let db = scratch.open_named(RELAY_CONNECTIONS, RELAY_APP).await?;
            // Defaults, as a user starts the relay.
            let relay = Relay::from_parts(
                db.store(),
                Arc::clone(&sink) as Arc<dyn Sink>,
                RelayConfig::default(),
            )?;
            rounds.push(relay.rounds());
            handles.push(relay.start());
        }
        Ok(Relays { handles, rounds })
    }

    /// Waits until every relay has looked at every tenant and is waiting (the start-up sweep).
    async fn settle(&mut self, bar: &ProgressBar) -> Result<(), BenchError> {
        for rounds in &mut self.rounds {
            bar.set_message("relays: start-up sweep over every tenant");
            tokio::time::timeout(Duration::from_secs(900), rounds.settle())
                .await
                .map_err(|_| BenchError::Check("the relays did not settle in 15 min".into()))?;
        }
        Ok(())
    }

    async fn stop(self) -> Result<(), BenchError> {
        for handle in self.handles {
            handle.stop().await?;
        }
        Ok(())
    }
}

/// The application name of the relays' connections, to count them on the server.
const RELAY_APP: &str = "postbox-bench-relay";

async fn relay_connections(pool: &PgPool) -> Result<i64, BenchError> {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE datname = current_database() AND application_name = $1",
    )
    .bind(RELAY_APP)
    .fetch_one(pool)
    .await
    .map_err(BenchError::db)
}

/// Adds `n` tenants (`t0`, `t1`, …), a few at once; those an earlier count added are kept.
async fn add_tenants(db: &Db, n: usize, bar: &ProgressBar) -> Result<Vec<SchemaName>, BenchError> {
    let store = db.store();
    let ids: Vec<TenantId> = (0..n)
        .map(|i| TenantId::new(&format!("t{i}")))
        .collect::<Result<_, _>>()?;
    let mut adds = futures::stream::iter(ids.iter().map(|id| {
        let store = Arc::clone(&store);
        async move {
            match store
                .tenant_add(&TenantAddParams { id, schema: None })
                .await
            {
                Ok(tenant) => Ok(tenant.schema),
                Err(postbox::Error::TenantExists(_)) => Ok(id.default_schema()),
                Err(e) => Err(e),
            }
        }
    }))
    .buffer_unordered(ADD_JOBS);
    let mut schemas = Vec::with_capacity(n);
    while let Some(tenant) = adds.next().await {
        schemas.push(tenant?);
        bar.inc(1);
    }
    schemas.sort();
    Ok(schemas)
}

/// Producers commit `rate` events a second for `duration`, each into a random one of
/// `schemas` (but `skip`), by plain SQL; returns when each was committed.
async fn produce(
    pool: &PgPool,
    schemas: &[SchemaName],
    skip: Option<&SchemaName>,
    rate: u64,
    duration: Duration,
    bar: &ProgressBar,
) -> Result<HashMap<(Option<String>, i64), Instant>, BenchError> {
    let targets: Vec<&SchemaName> = schemas.iter().filter(|s| Some(*s) != skip).collect();
    let committed = Arc::new(Mutex::new(HashMap::new()));
    let per_producer = Duration::from_secs_f64(PRODUCERS as f64 / rate.max(1) as f64);
    let deadline = Instant::now() + duration;
    let tasks = (0..PRODUCERS).map(|p| {
        let committed = Arc::clone(&committed);
        let targets = &targets;
        let bar = bar.clone();
        async move {
            let mut tick = tokio::time::interval(per_producer);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let mut state = (p as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            while Instant::now() < deadline {
                tick.tick().await;
                // A small xorshift: which tenant, evenly, without a dependency for it.
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let schema = targets[(state % targets.len() as u64) as usize];
                // The name is a validated schema name, quoted.
                let id: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
                    "INSERT INTO {}.outbox_events (event_type, aggregate_type, aggregate_id, \
                     payload) VALUES ('TenantEvent', 'Invoice', $1, $2) RETURNING id",
                    schema.quoted()
                )))
                .bind(state.to_string())
                .bind(crate::db::payload(state))
                .fetch_one(pool)
                .await
                .map_err(BenchError::db)?;
                let at = Instant::now();
                let tenant = schema.as_str().strip_prefix("s_").map(str::to_owned);
                committed
                    .lock()
                    .map_err(|_| BenchError::Check("latency map poisoned".into()))?
                    .insert((tenant, id), at);
                bar.inc(1);
            }
            Ok::<_, BenchError>(())
        }
    });
    futures::future::try_join_all(tasks).await?;
    let committed = committed
        .lock()
        .map_err(|_| BenchError::Check("latency map poisoned".into()))?
        .clone();
    Ok(committed)
}

/// Waits until `sink` has published every one of `committed` (at most 60 s), then the
/// percentiles of commit → publish, leaving out the events the sink slowed on purpose.
async fn latency_of(
    sink: &TenantSink,
    committed: &HashMap<(Option<String>, i64), Instant>,
    rate: u64,
    duration: Duration,
) -> Result<Percentiles, BenchError> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let missing = {
            let published = sink
                .published
                .lock()
                .map_err(|_| BenchError::Check("latency map poisoned".into()))?;
            committed
                .keys()
                .filter(|k| !published.contains_key(*k))
                .count()
        };
        if missing == 0 {
            break;
        }
        if Instant::now() > deadline {
            return Err(BenchError::Check(format!(
                "{missing} of {} committed events were not published within 60 s",
                committed.len()
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let published = sink
        .published
        .lock()
        .map_err(|_| BenchError::Check("latency map poisoned".into()))?;
    let slowed = sink
        .slowed
        .lock()
        .map_err(|_| BenchError::Check("latency map poisoned".into()))?;
    let mut hist = Histogram::<u64>::new(3).map_err(|e| BenchError::Check(e.to_string()))?;
    for (key, at) in committed {
        if slowed.contains(key) {
            continue;
        }
        if let Some(p) = published.get(key) {
            let us = p.saturating_duration_since(*at).as_micros() as u64;
            hist.record(us.max(1)).ok();
        }
    }
    Ok(Percentiles::from_hist(&hist, rate, duration))
}

/// Commits `events` into `busy`'s outbox by plain SQL, in one statement per 100,000 rows.
async fn fill_backlog(
    pool: &PgPool,
    busy: &SchemaName,
    events: u64,
    bar: &ProgressBar,
) -> Result<(), BenchError> {
    bar.set_message(format!("tenants: {events} events into {busy}"));
    let mut left = events;
    while left > 0 {
        let n = left.min(100_000);
        // The name is a validated schema name, quoted.
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {}.outbox_events (event_type, aggregate_type, aggregate_id, payload) \
             SELECT 'Backlog', 'Invoice', g::text, jsonb_build_object('n', g) \
             FROM generate_series(1, $1) AS g",
            busy.quoted()
        )))
        .bind(i64::try_from(n).unwrap_or(i64::MAX))
        .execute(pool)
        .await
        .map_err(BenchError::db)?;
        left -= n;
    }
    Ok(())
}

/// What every latency run of one tenant count shares.
struct Setting<'a> {
    scratch: &'a Scratch,
    pool: &'a PgPool,
    /// The tenants' schemas.
    schemas: &'a [SchemaName],
    plan: &'a TenantsPlan,
    bar: &'a ProgressBar,
}

/// One latency run of [`Setting::measure`].
struct LatencyRun<'a> {
    what: String,
    relays: usize,
    /// Events per second from the producers.
    rate: u64,
    sink: Arc<TenantSink>,
    /// How long the producers run, unmeasured, before the measured part.
    warmup: Duration,
    /// The tenant whose backlog the run is measured beside (written once the relays are warm);
    /// the producers leave it out.
    backlog: Option<&'a SchemaName>,
}

impl<'a> LatencyRun<'a> {
    /// One relay at the plan's first rate, after the plan's warm-up, publishing at once.
    fn light(plan: &TenantsPlan, what: impl Into<String>) -> Self {
        LatencyRun {
            what: what.into(),
            relays: 1,
            rate: plan.rates.first().copied().unwrap_or(50),
            sink: TenantSink::new(0, Duration::ZERO),
            warmup: plan.warmup,
            backlog: None,
        }
    }
}

impl Setting<'_> {
    /// One latency run: relays started fresh (and settled), producers at `run.rate` for
    /// `run.warmup` unmeasured and then for the plan's duration, the percentiles and the relays'
    /// CPU share of the measured part.
    async fn measure(&self, run: LatencyRun<'_>) -> Result<TenantLatency, BenchError> {
        let (plan, bar, pool) = (self.plan, self.bar, self.pool);
        let LatencyRun {
            what,
            relays,
            rate,
            sink,
            warmup,
            backlog,
        } = run;
        let producing = |duration| produce(pool, self.schemas, backlog, rate, duration, bar);
        let mut running = Relays::start(self.scratch, relays, Arc::clone(&sink)).await?;
        running.settle(bar).await?;
        if !warmup.is_zero() {
            // Unmeasured: the relays' connections meet the tenants' tables (each connection
            // prepares a schema's statements and compiles its functions the first time it
            // claims or marks there), as those of a relay that has run a while have.
            bar.set_message(format!("tenants: {what} (warming up)"));
            let warm = producing(warmup).await?;
            latency_of(&sink, &warm, rate, warmup).await?;
        }
        if let Some(busy) = backlog {
            let before = sink.count.load(Ordering::Relaxed);
            fill_backlog(pool, busy, plan.backlog, bar).await?;
            // The run starts once the drain is under way (a tenth of the backlog published, at
            // most 10,000 events).
            let started_at = before + (plan.backlog / 10).clamp(1, 10_000);
            let deadline = Instant::now() + Duration::from_secs(120);
            while sink.count.load(Ordering::Relaxed) < started_at && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        bar.set_message(format!("tenants: {what}"));
        let cpu = cpu_time();
        let started = Instant::now();
        let published = sink.count.load(Ordering::Relaxed);
        let committed = producing(plan.duration).await?;
        // What the backlog's tenant got meanwhile: everything published while the producers
        // ran, but their own events (counted as if all were out by the end).
        let produced = started.elapsed();
        let backlog_per_s = backlog.map(|_| {
            let during = sink.count.load(Ordering::Relaxed).saturating_sub(published);
            during.saturating_sub(committed.len() as u64) as f64 / produced.as_secs_f64()
        });
        let percentiles = latency_of(&sink, &committed, rate, plan.duration).await?;
        let load_cpu = core_pct(cpu_time().saturating_sub(cpu), started.elapsed()) / relays as f64;
        running.stop().await?;
        Ok(TenantLatency {
            what,
            relays,
            percentiles,
            relay_cpu_pct: load_cpu,
            backlog_per_s,
        })
    }
}

/// The tenants phase for `tenants` tenants.
pub(crate) async fn run(
    scratch: &Scratch,
    tenants: usize,
    plan: &TenantsPlan,
    bars: &dyn Fn(u64, &str) -> ProgressBar,
) -> Result<TenantsRun, BenchError> {
    scratch.reset().await?;
    let db = scratch.open(ADD_JOBS as u32 + 1).await?;
    let Db::Pg(pool) = &db else {
        return Err(BenchError::Setup(
            "the tenants phase needs PostgreSQL".into(),
        ));
    };
    let bar = bars(tenants as u64, &format!("tenants: adding {tenants}"));
    let added = Instant::now();
    let schemas = add_tenants(&db, tenants, &bar).await?;
    let add_seconds = added.elapsed().as_secs_f64();
    bar.finish_and_clear();

    // Idle: one relay, settled, then nothing happens.
    let bar = bars(0, "tenants: idle");
    let sink = TenantSink::new(0, Duration::ZERO);
    let mut idle = Relays::start(scratch, 1, Arc::clone(&sink)).await?;
    let settling = Instant::now();
    idle.settle(&bar).await?;
    let settle_seconds = settling.elapsed().as_secs_f64();
    bar.set_message("tenants: idle");
    let cpu = cpu_time();
    let started = Instant::now();
    tokio::time::sleep(plan.idle).await;
    let idle_cpu_pct = core_pct(cpu_time().saturating_sub(cpu), started.elapsed());
    let connections = relay_connections(pool).await?;
    idle.stop().await?;

    let setting = Setting {
        scratch,
        pool,
        schemas: &schemas,
        plan,
        bar: &bar,
    };
    let light = plan.rates.first().copied().unwrap_or(50);
    let mut latency = Vec::new();
    // The same producers into the default schema alone: what a tenant's event is measured
    // against, in the same run.
    let default = [SchemaName::new("public")?];
    latency.push(
        Setting {
            schemas: &default,
            ..setting
        }
        .measure(LatencyRun::light(
            plan,
            format!("{light}/s, 1 relay, into the default schema only"),
        ))
        .await?,
    );
    if !plan.warmup.is_zero() {
        // A relay restarted (a deploy): its connections meet each tenant's table for the first
        // time while they serve its events.
        latency.push(
            setting
                .measure(LatencyRun {
                    warmup: Duration::ZERO,
                    ..LatencyRun::light(
                        plan,
                        format!("{light}/s, 1 relay, from its start (no warm-up)"),
                    )
                })
                .await?,
        );
    }
    for &relays in &plan.relays {
        for &rate in &plan.rates {
            let what = format!(
                "{rate}/s, {relays} relay{}",
                if relays == 1 { "" } else { "s" }
            );
            latency.push(
                setting
                    .measure(LatencyRun {
                        relays,
                        rate,
                        ..LatencyRun::light(plan, what)
                    })
                    .await?,
            );
        }
    }
    latency.push(
        setting
            .measure(LatencyRun {
                sink: TenantSink::new(50, Duration::from_secs(2)),
                ..LatencyRun::light(
                    plan,
                    format!("{light}/s, 1 relay, every 50th publish takes 2 s (the others)"),
                )
            })
            .await?,
    );
    if plan.backlog > 0
        && let Some(busy) = schemas.first()
    {
        latency.push(
            setting
                .measure(LatencyRun {
                    backlog: Some(busy),
                    ..LatencyRun::light(
                        plan,
                        format!(
                            "{light}/s, 1 relay, beside one tenant's backlog of {} (the others)",
                            plan.backlog
                        ),
                    )
                })
                .await?,
        );
        // What the run left of the backlog would be the next count's.
        sqlx::query(AssertSqlSafe(format!(
            "TRUNCATE {}.outbox_events",
            busy.quoted()
        )))
        .execute(pool)
        .await
        .map_err(BenchError::db)?;
    }
    bar.finish_and_clear();
    Ok(TenantsRun {
        tenants,
        add_seconds,
        settle_seconds,
        idle_cpu_pct,
        connections,
        warmup_seconds: plan.warmup.as_secs_f64(),
        latency,
    })
}
