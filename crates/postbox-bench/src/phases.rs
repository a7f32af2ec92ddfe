//! The benchmark's phases. Each starts from an empty outbox.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::future::try_join_all;
use hdrhistogram::Histogram;
use indicatif::ProgressBar;
use postbox::{
    Outbox, OutboxEvent, PublishError, Relay, RelayConfig, Sink, Store, Target,
    store::{ClaimParams, MarkProcessedParams},
};

use crate::BenchError;
use crate::claims;
use crate::db::{Db, Extra};
use crate::report::{ClaimTimes, Percentiles, Throughput};

/// Events are preloaded in transactions of this many, with one multi-row INSERT each.
const PRELOAD_CHUNK: u64 = 1000;

/// A sink that counts and drops (the `null` sink, with a counter for progress).
#[derive(Default)]
pub(crate) struct CountingSink {
    pub(crate) published: AtomicU64,
}

#[async_trait]
impl Sink for CountingSink {
    async fn publish(&self, _event: &OutboxEvent) -> Result<(), PublishError> {
        self.published.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// Business transactions of `statements` business rows per second, with `extra` (nothing, a
/// second row or an event) in each.
pub(crate) async fn enqueue_rate(
    db: &Db,
    producers: usize,
    duration: Duration,
    statements: u32,
    extra: Extra<'_>,
    bar: &ProgressBar,
) -> Result<Throughput, BenchError> {
    db.create_business_table().await?;
    let counter = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + duration;
    let tasks = (0..producers).map(|p| {
        let db = db.clone();
        let counter = Arc::clone(&counter);
        let bar = bar.clone();
        async move {
            let mut i = (p as u64) << 40;
            while Instant::now() < deadline {
                db.business_tx(i, statements, extra).await?;
                counter.fetch_add(1, Ordering::Relaxed);
                bar.inc(1);
                i += 1;
            }
            Ok::<_, BenchError>(())
        }
    });
    try_join_all(tasks).await?;
    Ok(Throughput::new(
        counter.load(Ordering::Relaxed),
        started.elapsed(),
    ))
}

/// Writes `count` events with `enqueue_many`, a few loaders at once.
pub(crate) async fn preload(
    db: &Db,
    outbox: &Outbox,
    count: u64,
    aggregates: Option<u64>,
    bar: &ProgressBar,
) -> Result<(), BenchError> {
    let next = Arc::new(AtomicU64::new(0));
    let loaders = (0..4).map(|_| {
        let next = Arc::clone(&next);
        let bar = bar.clone();
        async move {
            loop {
                let first = next.fetch_add(PRELOAD_CHUNK, Ordering::Relaxed);
                if first >= count {
                    return Ok::<_, BenchError>(());
                }
                let n = PRELOAD_CHUNK.min(count - first);
                db.preload(outbox, first, n, aggregates).await?;
                bar.inc(n);
            }
        }
    });
    try_join_all(loaders).await?;
    Ok(())
}

/// Drains a preloaded backlog with `relays` relays (each with its own pool) to a null sink;
/// the relays' claim durations beside the throughput.
pub(crate) async fn drain(
    dbs: &[Db],
    config: &RelayConfig,
    expected: u64,
    bar: &ProgressBar,
) -> Result<(Throughput, Option<ClaimTimes>), BenchError> {
    let sink = Arc::new(CountingSink::default());
    claims::reset();
    let started = Instant::now();
    let watcher = watch_progress(Arc::clone(&sink), bar.clone());
    let relays = dbs.iter().map(|db| {
        let sink: Arc<dyn Sink> = sink.clone();
        let relay = Relay::from_parts(db.store(), sink, config.clone());
        async move { relay?.drain(std::future::pending()).await }
    });
    let result = try_join_all(relays).await;
    watcher.abort();
    result?;
    let published = sink.published.load(Ordering::Relaxed);
    if published != expected {
        return Err(BenchError::Check(format!(
            "drain published {published} events, expected {expected}"
        )));
    }
    let throughput = Throughput::new(published, started.elapsed());
    Ok((throughput, claims::take()))
}

/// How long a running relay may publish nothing before [`drain_running`] calls the run void.
const STALL: Duration = Duration::from_secs(60);

/// Drains a backlog with one relay on `store` that runs as a service does (`Relay::run`, not
/// `drain`: a CDC relay's claim can come back empty while its slot is still being read), stopped
/// once `expected` events are published.
pub(crate) async fn drain_running(
    store: Arc<dyn Store>,
    config: &RelayConfig,
    expected: u64,
    bar: &ProgressBar,
) -> Result<Throughput, BenchError> {
    let sink = Arc::new(CountingSink::default());
    let started = Instant::now();
    let relay = Relay::from_parts(store, sink.clone() as Arc<dyn Sink>, config.clone())?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let relay_task = tokio::spawn(async move {
        relay
            .run(async {
                let _ = stop_rx.await;
            })
            .await
    });
    let mut seen = (0, Instant::now());
    let outcome = loop {
        let published = sink.published.load(Ordering::Relaxed);
        bar.set_position(published);
        if published >= expected {
            break Ok(Throughput::new(published, started.elapsed()));
        }
        if relay_task.is_finished() {
            break Err(BenchError::Check(format!(
                "the relay stopped after publishing {published} of {expected} events"
            )));
        }
        if published > seen.0 {
            seen = (published, Instant::now());
        } else if seen.1.elapsed() > STALL {
            break Err(BenchError::Check(format!(
                "the relay published nothing for {} s ({published} of {expected} events)",
                STALL.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let _ = stop_tx.send(());
    relay_task
        .await
        .map_err(|e| BenchError::Check(format!("relay task failed: {e}")))??;
    let throughput = outcome?;
    let published = sink.published.load(Ordering::Relaxed);
    if published != expected {
        return Err(BenchError::Check(format!(
            "drain published {published} events, expected {expected}"
        )));
    }
    Ok(throughput)
}

fn watch_progress(sink: Arc<CountingSink>, bar: ProgressBar) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            bar.set_position(sink.published.load(Ordering::Relaxed));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

/// The ceiling: the relay's own claim and mark statements in a minimal loop, `workers` at once.
/// Each worker claims from a floor as a relay does: the first id of its last batch, below which
/// every event is processed or in another worker's batch (claims take ids in order, skipping
/// only rows other claims hold). From 0 each time, a claim on a long backlog walks the dead
/// versions every mark leaves in the polling index, and the "ceiling" falls below one relay.
pub(crate) async fn ceiling(
    dbs: &[Db],
    config: &RelayConfig,
    expected: u64,
    bar: &ProgressBar,
) -> Result<Throughput, BenchError> {
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let workers = dbs.iter().enumerate().map(|(w, db)| {
        let store = db.store();
        let done = Arc::clone(&done);
        let bar = bar.clone();
        let relay_id = format!("ceiling-{w}");
        let config = config.clone();
        async move {
            let target = Target::default_schema(store.default_schema());
            let mut floor = 0;
            loop {
                let claimed = store
                    .events_claim(&ClaimParams {
                        target: &target,
                        batch_size: config.batch_size,
                        lease: config.lease,
                        relay_id: &relay_id,
                        floor,
                        order: Default::default(),
                    })
                    .await?;
                if claimed.events.is_empty() {
                    return Ok::<_, BenchError>(());
                }
                floor = claimed
                    .events
                    .iter()
                    .map(|e| e.id)
                    .min()
                    .map_or(floor, |first| first.max(floor));
                let ids: Vec<i64> = claimed.events.iter().map(|e| e.id).collect();
                let n = store
                    .events_mark_processed(&MarkProcessedParams {
                        target: &target,
                        claim_token: claimed.claim_token,
                        ids: &ids,
                    })
                    .await?;
                done.fetch_add(n, Ordering::Relaxed);
                bar.inc(n);
            }
        }
    });
    try_join_all(workers).await?;
    let n = done.load(Ordering::Relaxed);
    if n != expected {
        return Err(BenchError::Check(format!(
            "ceiling loop processed {n} events, expected {expected}"
        )));
    }
    Ok(Throughput::new(n, started.elapsed()))
}

/// Records when each event was first published, and how many publishes were repeats.
#[derive(Default)]
pub(crate) struct LatencySink {
    published: Mutex<HashMap<i64, Instant>>,
    repeats: AtomicU64,
}

impl LatencySink {
    /// Events published so far.
    pub(crate) fn count(&self) -> usize {
        self.published.lock().map(|m| m.len()).unwrap_or(0)
    }

    /// Publishes of an event already published.
    pub(crate) fn repeats(&self) -> u64 {
        self.repeats.load(Ordering::Relaxed)
    }
}

#[async_trait]
impl Sink for LatencySink {
    async fn publish(&self, event: &OutboxEvent) -> Result<(), PublishError> {
        let now = Instant::now();
        let mut published = self
            .published
            .lock()
            .map_err(|_| PublishError::retryable("latency map poisoned"))?;
        match published.entry(event.id) {
            std::collections::hash_map::Entry::Vacant(first) => {
                first.insert(now);
            }
            std::collections::hash_map::Entry::Occupied(_) => {
                self.repeats.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }
}

/// When each event a producer committed was committed.
pub(crate) type Committed = HashMap<i64, Instant>;

/// Commit-to-publish latency: producers commit one event per transaction through `outbox` at
/// `rate` events/s in total while one relay with `config` runs.
pub(crate) async fn latency(
    db: &Db,
    store: Arc<dyn Store>,
    outbox: &Outbox,
    config: &RelayConfig,
    rate: u64,
    duration: Duration,
    bar: &ProgressBar,
) -> Result<Percentiles, BenchError> {
    db.create_business_table().await?;
    let sink = Arc::new(LatencySink::default());
    let relay = Relay::from_parts(store, sink.clone() as Arc<dyn Sink>, config.clone())?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let relay_task = tokio::spawn(async move {
        relay
            .run(async {
                let _ = stop_rx.await;
            })
            .await
    });
    // Let the relay connect its listener before the first commit.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let committed = produce(db, outbox, rate, duration, bar).await?;
    caught_up(&sink, committed.len()).await;
    let _ = stop_tx.send(());
    relay_task
        .await
        .map_err(|e| BenchError::Check(format!("relay task failed: {e}")))??;
    percentiles(&committed, &sink, rate, duration)
}

/// Eight producers committing one event per transaction through `outbox` (the business table
/// made first) at `rate` events/s in total for `duration`; when each event committed.
pub(crate) async fn produce(
    db: &Db,
    outbox: &Outbox,
    rate: u64,
    duration: Duration,
    bar: &ProgressBar,
) -> Result<Committed, BenchError> {
    let producers = 8u64;
    let per_producer = Duration::from_secs_f64(producers as f64 / rate as f64);
    let committed = Arc::new(Mutex::new(HashMap::<i64, Instant>::new()));
    let deadline = Instant::now() + duration;
    let tasks = (0..producers).map(|p| {
        let db = db.clone();
        let committed = Arc::clone(&committed);
        let bar = bar.clone();
        async move {
            let mut tick = tokio::time::interval(per_producer);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let mut i = p << 40;
            while Instant::now() < deadline {
                tick.tick().await;
                if let Some(id) = db.business_tx(i, 1, Extra::Event(outbox)).await? {
                    let at = Instant::now();
                    committed
                        .lock()
                        .map_err(|_| BenchError::Check("latency map poisoned".into()))?
                        .insert(id, at);
                }
                bar.inc(1);
                i += 1;
            }
            Ok::<_, BenchError>(())
        }
    });
    try_join_all(tasks).await?;
    let committed = committed
        .lock()
        .map_err(|_| BenchError::Check("latency map poisoned".into()))?;
    Ok(committed.clone())
}

/// Waits (30 s at most) until `sink` has published `want` events.
pub(crate) async fn caught_up(sink: &LatencySink, want: usize) {
    let catch_up = Instant::now() + Duration::from_secs(30);
    while Instant::now() < catch_up && sink.count() < want {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The commit-to-publish percentiles of `committed` as `sink` published them; an error if any
/// was not published.
pub(crate) fn percentiles(
    committed: &Committed,
    sink: &LatencySink,
    rate: u64,
    duration: Duration,
) -> Result<Percentiles, BenchError> {
    let published = sink
        .published
        .lock()
        .map_err(|_| BenchError::Check("latency map poisoned".into()))?;
    let mut hist = Histogram::<u64>::new(3).map_err(|e| BenchError::Check(e.to_string()))?;
    let mut missing = 0;
    for (id, at) in committed {
        match published.get(id) {
            // The relay may publish before the producer took its timestamp: count that as 0.
            Some(p) => {
                let us = p.saturating_duration_since(*at).as_micros() as u64;
                hist.record(us.max(1)).ok();
            }
            None => missing += 1,
        }
    }
    if missing > 0 {
        return Err(BenchError::Check(format!(
            "{missing} committed events were not published within 30 s"
        )));
    }
    Ok(Percentiles::from_hist(&hist, rate, duration))
}

/// The soak: a large backlog drained by `relays` relays, throughput per window of `window`
/// events, and the process's resident memory at each window.
pub(crate) async fn soak(
    dbs: &[Db],
    config: &RelayConfig,
    total: u64,
    window: u64,
    bar: &ProgressBar,
) -> Result<(Vec<f64>, Vec<u64>), BenchError> {
    let sink = Arc::new(CountingSink::default());
    let relays = dbs.iter().map(|db| {
        let sink: Arc<dyn Sink> = sink.clone();
        let relay = Relay::from_parts(db.store(), sink, config.clone());
        async move { relay?.drain(std::future::pending()).await }
    });
    let monitor = {
        let sink = Arc::clone(&sink);
        let bar = bar.clone();
        tokio::spawn(async move {
            let mut windows = Vec::new();
            let mut rss = Vec::new();
            let mut last = Instant::now();
            let mut next = window;
            loop {
                let n = sink.published.load(Ordering::Relaxed);
                bar.set_position(n);
                while n >= next {
                    let now = Instant::now();
                    windows.push(window as f64 / now.duration_since(last).as_secs_f64());
                    rss.push(crate::report::rss_kib());
                    last = now;
                    next += window;
                }
                if n >= total {
                    return (windows, rss);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    try_join_all(relays).await?;
    let published = sink.published.load(Ordering::Relaxed);
    if published != total {
        monitor.abort();
        return Err(BenchError::Check(format!(
            "soak published {published} events, expected {total}"
        )));
    }
    monitor
        .await
        .map_err(|e| BenchError::Check(format!("soak monitor failed: {e}")))
}
