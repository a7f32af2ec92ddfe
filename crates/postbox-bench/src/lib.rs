//! The benchmarks behind `postbox bench`: enqueue overhead (beside a second business row, the
//! floor of any second statement), drain against the raw-SQL ceiling of the relay's own
//! statements, commit-to-publish latency with debounced NOTIFY, NOTIFY on every commit and
//! polling only, a soak, and (PostgreSQL) the CDC relay beside the polling relay and a relay
//! serving hundreds or thousands of tenant schemas.
//!
//! Everything runs in a scratch database of its own (PostgreSQL: a new database on the server
//! given, dropped afterwards; SQLite: a temporary file).

mod cdc;
mod claims;
mod db;
mod history;
mod phases;
mod report;
mod scratch;
mod tenants;

use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use postbox::{RelayConfig, StoreExt};

pub use report::{
    BenchReport, CdcOutcome, CdcRun, CdcWal, ClaimTimes, DrainCase, DrainRun, EnqueueOverhead,
    HeldDrain, HistoryDrain, HistoryRun, HistoryWindow, LatencyRun, OrderingRun, Percentiles, Soak,
    TenantLatency, TenantsRun, Throughput,
};

use db::Extra;
use report::{Variants, human};
use scratch::Scratch;

/// What went wrong in a benchmark run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// A Postbox call failed.
    #[error(transparent)]
    Postbox(#[from] postbox::Error),
    /// Setting up the scratch database failed.
    #[error("benchmark setup failed: {0}")]
    Setup(String),
    /// A result did not add up (events lost or duplicated): the run is void.
    #[error("benchmark check failed: {0}")]
    Check(String),
}

impl BenchError {
    fn db(e: sqlx::Error) -> Self {
        BenchError::Setup(e.to_string())
    }
}

/// Benchmark settings.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// A PostgreSQL server URL (a scratch database is created next to the one named), or `None`
    /// for SQLite.
    pub database_url: Option<String>,
    /// Events preloaded for each drain and ceiling run.
    pub events: u64,
    /// Relay counts to drain with.
    pub relays: Vec<usize>,
    /// Producer counts for the enqueue overhead.
    pub producers: Vec<usize>,
    /// How long each enqueue-overhead measurement runs.
    pub enqueue_duration: Duration,
    /// Business rows each business transaction of the enqueue-overhead phase inserts (at least
    /// one; default 1, the smallest transaction and so the worst case for the overhead).
    pub business_statements: u32,
    /// Producer rate for the latency runs, events/s.
    pub rate: u64,
    /// How long each latency run produces.
    pub latency_duration: Duration,
    /// Poll interval of the polling-only latency run.
    pub poll_interval: Duration,
    /// Aggregate counts of the ordering phase: the backlog of `events` spread over this many
    /// aggregates, drained with and without ordering; empty skips it.
    pub ordered_aggregates: Vec<u64>,
    /// Events of the soak; 0 skips it.
    pub soak_events: u64,
    /// Events per soak window.
    pub soak_window: u64,
    /// Processed events in the table at the start of the history phase (PostgreSQL); 0 skips
    /// it.
    pub history_rows: u64,
    /// How long the history phase's producers and relays run.
    pub history_duration: Duration,
    /// The history phase's producer rate, events/s.
    pub history_rate: u64,
    /// The history phase's measurement window.
    pub history_window: Duration,
    /// Events in each backlog of the CDC comparison (PostgreSQL); 0 skips it.
    pub cdc_events: u64,
    /// Producer rate of the CDC comparison's latency runs, events/s.
    pub cdc_rate: u64,
    /// How long the CDC comparison watches the slot while other tables churn.
    pub cdc_churn: Duration,
    /// How long the CDC relay then stays stopped while they churn on.
    pub cdc_stopped: Duration,
    /// Tenant counts of the tenants phase (PostgreSQL); empty skips it.
    pub tenants: Vec<usize>,
    /// Producer rates of the tenants phase, events/s; the first is also the rate of its slow
    /// destination and backlog runs.
    pub tenant_rates: Vec<u64>,
    /// How long each latency run of the tenants phase produces.
    pub tenant_duration: Duration,
    /// How long each latency run of the tenants phase produces before it measures (a relay
    /// that has run a while: its connections have met the tenants' tables); one more run
    /// measures from a relay's start. Zero measures every run from the start.
    pub tenant_warmup: Duration,
    /// How long the tenants phase watches an idle relay.
    pub tenant_idle: Duration,
    /// Events of the one tenant's backlog beside which the others' latency is measured; 0
    /// skips that run.
    pub tenant_backlog: u64,
    /// Relay counts of the tenants phase's latency runs.
    pub tenant_relays: Vec<usize>,
    /// Relay batch size.
    pub batch_size: u32,
    /// Dead rows that make the relays vacuum the outbox table (`RelayConfig::vacuum_threshold`);
    /// `None`: never. Applies to drain, soak and latency runs.
    pub vacuum_threshold: Option<u64>,
    /// Show progress bars (on stderr).
    pub progress: bool,
}

impl BenchOptions {
    /// The full run: 100k events, 1 and 4 relays, latency at 2k events/s, a 1M-event soak.
    pub fn full(database_url: Option<String>) -> Self {
        BenchOptions {
            database_url,
            events: 100_000,
            relays: vec![1, 4],
            producers: vec![1, 8],
            enqueue_duration: Duration::from_secs(5),
            business_statements: 1,
            rate: 2000,
            latency_duration: Duration::from_secs(10),
            poll_interval: Duration::from_millis(100),
            ordered_aggregates: vec![10_000, 100],
            soak_events: 1_000_000,
            soak_window: 100_000,
            history_rows: 1_000_000,
            history_duration: Duration::from_secs(300),
            history_rate: 1000,
            history_window: Duration::from_secs(30),
            cdc_events: 500_000,
            cdc_rate: 1000,
            cdc_churn: Duration::from_secs(60),
            cdc_stopped: Duration::from_secs(30),
            tenants: vec![1000],
            tenant_rates: vec![50, 1000],
            tenant_duration: Duration::from_secs(20),
            tenant_warmup: Duration::from_secs(30),
            tenant_idle: Duration::from_secs(20),
            tenant_backlog: 1_000_000,
            tenant_relays: vec![1, 2],
            batch_size: 100,
            vacuum_threshold: RelayConfig::default().vacuum_threshold,
            progress: true,
        }
    }

    /// A smoke run that finishes in seconds (no meaning as a measurement).
    pub fn quick(database_url: Option<String>) -> Self {
        BenchOptions {
            events: 2_000,
            enqueue_duration: Duration::from_millis(300),
            rate: 500,
            latency_duration: Duration::from_millis(500),
            ordered_aggregates: vec![1_000, 10],
            soak_events: 4_000,
            soak_window: 1_000,
            history_rows: 20_000,
            history_duration: Duration::from_secs(6),
            history_rate: 200,
            history_window: Duration::from_secs(2),
            cdc_events: 2_000,
            cdc_rate: 200,
            cdc_churn: Duration::from_secs(3),
            cdc_stopped: Duration::from_secs(1),
            tenants: vec![20],
            tenant_rates: vec![50],
            tenant_duration: Duration::from_secs(1),
            tenant_warmup: Duration::from_millis(500),
            tenant_idle: Duration::from_millis(500),
            tenant_backlog: 2_000,
            tenant_relays: vec![1],
            vacuum_threshold: RelayConfig::default().vacuum_threshold,
            ..Self::full(database_url)
        }
    }
}

fn bar(opts: &BenchOptions, len: u64, what: &str) -> ProgressBar {
    if !opts.progress {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    let style =
        ProgressStyle::with_template("{msg:<32} [{bar:30}] {pos:>8}/{len:<8} {per_sec:>12}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
    bar.set_style(style);
    bar.set_message(what.to_owned());
    bar
}

/// One enqueue-overhead measurement on a reset scratch database.
/// Slices each enqueue measurement is cut into. The variants take turns slice by slice and each
/// reports its median slice, so a burst of noise on a shared machine hits every variant alike
/// rather than one of them.
const ENQUEUE_SLICES: u32 = 5;

/// Business transactions per second of each of `variants` at `producers` producers: the median
/// of [`ENQUEUE_SLICES`] interleaved slices.
async fn enqueue_rates(
    scratch: &Scratch,
    db: &db::Db,
    opts: &BenchOptions,
    producers: usize,
    statements: u32,
    variants: &[(&str, Extra<'_>)],
) -> Result<Vec<Throughput>, BenchError> {
    scratch.reset().await?;
    let slice = (opts.enqueue_duration / ENQUEUE_SLICES).max(Duration::from_millis(50));
    let mut slices: Vec<Vec<Throughput>> = vec![Vec::new(); variants.len()];
    for round in 1..=ENQUEUE_SLICES {
        for ((what, extra), done) in variants.iter().zip(&mut slices) {
            let b = bar(
                opts,
                0,
                &format!("enqueue: {producers} producers, {what} ({round}/{ENQUEUE_SLICES})"),
            );
            let rate = phases::enqueue_rate(db, producers, slice, statements, *extra, &b).await;
            b.finish_and_clear();
            done.push(rate?);
        }
    }
    Ok(slices
        .into_iter()
        .map(|mut v| {
            v.sort_by(|a, b| a.per_second.total_cmp(&b.per_second));
            v[v.len() / 2]
        })
        .collect())
}

/// Runs the benchmark and returns its report.
pub async fn run(opts: &BenchOptions) -> Result<BenchReport, BenchError> {
    let scratch = Scratch::create(opts.database_url.as_deref()).await?;
    let result = run_in(&scratch, opts).await;
    scratch.drop_now().await;
    result
}

async fn run_in(scratch: &Scratch, opts: &BenchOptions) -> Result<BenchReport, BenchError> {
    let max_parallel = opts
        .relays
        .iter()
        .chain(&opts.producers)
        .copied()
        .max()
        .unwrap_or(1);
    let db = scratch.open(max_parallel as u32 + 2).await?;
    let outbox = db.store().outbox();
    let config = RelayConfig::default()
        .batch_size(opts.batch_size)
        .poll_interval(Duration::from_millis(50))
        .vacuum_threshold(opts.vacuum_threshold);

    let mut enqueue = Vec::new();
    // A business transaction has at least its one business row.
    let statements = opts.business_statements.max(1);
    let notify_each = db
        .store()
        .outbox_builder()
        .notify_interval(Duration::ZERO)
        .build();
    for &producers in &opts.producers {
        let mut variants = vec![
            ("no event", Extra::Nothing),
            ("2nd row", Extra::SecondRow),
            ("event", Extra::Event(&outbox)),
        ];
        if scratch.is_postgres() {
            variants.push(("event in statement", Extra::EventInStatement(&outbox)));
            variants.push(("NOTIFY each", Extra::Event(&notify_each)));
        }
        let rates = enqueue_rates(scratch, &db, opts, producers, statements, &variants).await?;
        enqueue.push(EnqueueOverhead::new(
            producers,
            statements,
            Variants {
                without_event: rates[0],
                second_row: rates[1],
                with_event: rates[2],
                in_statement: rates.get(3).copied(),
                notify_each: rates.get(4).copied(),
            },
        ));
    }

    let mut drain = Vec::new();
    for &relays in &opts.relays {
        let mut dbs = Vec::with_capacity(relays);
        for _ in 0..relays {
            dbs.push(scratch.open(4).await?);
        }
        scratch.reset().await?;
        let b = bar(opts, opts.events, "preload");
        phases::preload(&db, &outbox, opts.events, None, &b).await?;
        b.finish_and_clear();
        let b = bar(opts, opts.events, &format!("ceiling: {relays} workers"));
        let ceiling = phases::ceiling(&dbs, &config, opts.events, &b).await?;
        b.finish_and_clear();

        scratch.reset().await?;
        let b = bar(opts, opts.events, "preload");
        phases::preload(&db, &outbox, opts.events, None, &b).await?;
        b.finish_and_clear();
        let b = bar(opts, opts.events, &format!("drain: {relays} relays"));
        let (relay, claims) = phases::drain(&dbs, &config, opts.events, &b).await?;
        b.finish_and_clear();
        drain.push(DrainRun {
            relays,
            ratio: relay.per_second / ceiling.per_second,
            relay,
            claims,
            ceiling,
        });
    }

    let mut latency = Vec::new();
    if scratch.is_postgres() {
        let relay_db = scratch.open(4).await?;
        let expected = (opts.rate as f64 * opts.latency_duration.as_secs_f64()) as u64;
        let runs = [
            (
                format!(
                    "NOTIFY ≤{} + busy poll {}",
                    human(postbox::outbox::DEFAULT_NOTIFY_INTERVAL),
                    human(config.busy_poll_interval)
                ),
                outbox.clone(),
                config.clone(),
            ),
            (
                "NOTIFY each commit".to_owned(),
                notify_each.clone(),
                config.clone().busy_period(Duration::ZERO),
            ),
            (
                format!(
                    "no NOTIFY (plain SQL), from idle: head check {} + busy poll {}",
                    config.head_poll_interval.map_or("off".to_owned(), human),
                    human(config.busy_poll_interval)
                ),
                db.store().outbox_builder().notify(false).build(),
                config.clone(),
            ),
            (
                format!("poll every {}", human(opts.poll_interval)),
                db.store().outbox_builder().notify(false).build(),
                config
                    .clone()
                    .notifications(false)
                    .head_poll_interval(None)
                    .busy_period(Duration::ZERO)
                    .poll_interval(opts.poll_interval)
                    // Unused without busy polling, but it may not exceed `poll_interval`.
                    .busy_poll_interval(config.busy_poll_interval.min(opts.poll_interval)),
            ),
        ];
        for (mode, producer, relay_config) in runs {
            scratch.reset().await?;
            let b = bar(opts, expected, &format!("latency: {mode}"));
            let percentiles = phases::latency(
                &db,
                relay_db.store(),
                &producer,
                &relay_config,
                opts.rate,
                opts.latency_duration,
                &b,
            )
            .await?;
            b.finish_and_clear();
            latency.push(LatencyRun { mode, percentiles });
        }
    }

    // Ordering (G6): the same backlog spread over few or many aggregates, drained by the most
    // relays of --relays with and without ordering.
    let mut ordering = Vec::new();
    for &aggregates in &opts.ordered_aggregates {
        let relays = opts.relays.iter().copied().max().unwrap_or(1);
        let mut dbs = Vec::with_capacity(relays);
        for _ in 0..relays {
            dbs.push(scratch.open(4).await?);
        }
        let mut runs = Vec::with_capacity(2);
        for ordered in [false, true] {
            scratch.reset().await?;
            let b = bar(opts, opts.events, "preload");
            phases::preload(&db, &outbox, opts.events, Some(aggregates), &b).await?;
            b.finish_and_clear();
            let what = if ordered { "ordered" } else { "unordered" };
            let b = bar(
                opts,
                opts.events,
                &format!("{aggregates} aggregates, {what}: {relays} relays"),
            );
            let run_config = if ordered {
                config.clone().ordered_aggregate_types(["Invoice"])
            } else {
                config.clone()
            };
            runs.push(phases::drain(&dbs, &run_config, opts.events, &b).await?.0);
            b.finish_and_clear();
        }
        ordering.push(OrderingRun {
            aggregates,
            relays,
            ratio: runs[1].per_second / runs[0].per_second,
            unordered: runs[0],
            ordered: runs[1],
        });
    }

    let mut soak = None;
    if opts.soak_events > 0 {
        let relays = opts.relays.iter().copied().max().unwrap_or(1);
        let mut dbs = Vec::with_capacity(relays);
        for _ in 0..relays {
            dbs.push(scratch.open(4).await?);
        }
        scratch.reset().await?;
        let b = bar(opts, opts.soak_events, "soak: preload");
        phases::preload(&db, &outbox, opts.soak_events, None, &b).await?;
        b.finish_and_clear();
        let b = bar(opts, opts.soak_events, &format!("soak: {relays} relays"));
        let (windows, rss) =
            phases::soak(&dbs, &config, opts.soak_events, opts.soak_window, &b).await?;
        b.finish_and_clear();
        let first = windows.first().copied().unwrap_or(0.0);
        let last = windows.last().copied().unwrap_or(0.0);
        soak = Some(Soak {
            events: opts.soak_events,
            window: opts.soak_window,
            vacuum_threshold: config.vacuum_threshold,
            last_over_first: if first > 0.0 { last / first } else { 0.0 },
            peak_rss_kib: rss.iter().copied().max().unwrap_or(0),
            rss_kib: rss,
            windows_per_second: windows,
        });
    }

    let mut history = None;
    if opts.history_rows > 0 && scratch.is_postgres() {
        let relays = opts.relays.iter().copied().max().unwrap_or(1).min(2);
        let mut dbs = Vec::with_capacity(relays);
        for _ in 0..relays {
            dbs.push(scratch.open(4).await?);
        }
        scratch.reset().await?;
        let plan = history::HistoryPlan {
            rows: opts.history_rows,
            duration: opts.history_duration,
            rate: opts.history_rate,
            window: opts.history_window,
            relays,
            drain_events: opts.events,
        };
        let bars = |len: u64, what: &str| bar(opts, len, what);
        history = Some(history::run(&db, &dbs, &config, &plan, &bars).await?);
    }

    let mut held_drain = None;
    if opts.history_rows > 0 && opts.events > 0 && scratch.backend() == "mysql" {
        let relay = scratch.open(4).await?;
        scratch.reset().await?;
        let bars = |len: u64, what: &str| bar(opts, len, what);
        let case = history::held_and_quiet(
            &db,
            std::slice::from_ref(&relay),
            &config,
            opts.events,
            &bars,
        )
        .await?;
        held_drain = Some(HeldDrain {
            events: opts.events,
            case,
        });
    }

    let mut cdc = None;
    if opts.cdc_events > 0 && scratch.is_postgres() {
        let bars = |len: u64, what: &str| bar(opts, len, what);
        cdc = Some(cdc::run(scratch, &db, opts, &bars).await?);
    }

    let mut tenants = Vec::new();
    if scratch.is_postgres() {
        let plan = tenants::TenantsPlan {
            rates: opts.tenant_rates.clone(),
            duration: opts.tenant_duration,
            warmup: opts.tenant_warmup,
            idle: opts.tenant_idle,
            backlog: opts.tenant_backlog,
            relays: opts.tenant_relays.clone(),
        };
        for &n in &opts.tenants {
            let bars = |len: u64, what: &str| bar(opts, len, what);
            tenants.push(tenants::run(scratch, n, &plan, &bars).await?);
        }
    }

    Ok(BenchReport {
        backend: scratch.backend(),
        batch_size: opts.batch_size,
        enqueue,
        drain,
        latency,
        ordering,
        soak,
        history,
        held_drain,
        cdc,
        tenants,
    })
}
