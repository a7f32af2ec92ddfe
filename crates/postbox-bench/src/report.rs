//! The benchmark's results: a table for people, JSON for machines.

use std::fmt::Write as _;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Events (or transactions) per second over a measured span.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Throughput {
    /// How many were done.
    pub count: u64,
    /// In how long, in seconds.
    pub seconds: f64,
    /// `count / seconds`.
    pub per_second: f64,
}

impl Throughput {
    pub(crate) fn new(count: u64, elapsed: Duration) -> Self {
        let seconds = elapsed.as_secs_f64().max(1e-9);
        Throughput {
            count,
            seconds,
            per_second: count as f64 / seconds,
        }
    }
}

/// Commit-to-publish latency percentiles, in milliseconds.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Percentiles {
    /// Target rate of the producers, events/s.
    pub rate: u64,
    /// How long the producers ran, seconds.
    pub seconds: f64,
    /// Events measured.
    pub samples: u64,
    /// Median.
    pub p50_ms: f64,
    /// 95th percentile.
    pub p95_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Slowest.
    pub max_ms: f64,
}

impl Percentiles {
    pub(crate) fn from_hist(h: &Histogram<u64>, rate: u64, duration: Duration) -> Self {
        let ms = |us: u64| us as f64 / 1000.0;
        Percentiles {
            rate,
            seconds: duration.as_secs_f64(),
            samples: h.len(),
            p50_ms: ms(h.value_at_quantile(0.50)),
            p95_ms: ms(h.value_at_quantile(0.95)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            max_ms: ms(h.max()),
        }
    }
}

/// Enqueue overhead at one level of concurrency.
#[derive(Clone, Debug, Serialize)]
pub struct EnqueueOverhead {
    /// Concurrent producers.
    pub producers: usize,
    /// Business transactions without an event.
    pub without_event: Throughput,
    /// The same transactions with one `enqueue` each.
    pub with_event: Throughput,
    /// How much longer a transaction takes with the event: `without / with - 1`, in percent.
    pub overhead_pct: f64,
    /// The same transactions with an enqueue that sends no `NOTIFY` (PostgreSQL).
    pub with_event_no_notify: Option<Throughput>,
    /// Overhead of the enqueue without `NOTIFY`, in percent.
    pub overhead_no_notify_pct: Option<f64>,
}

/// Drain and ceiling at one level of parallelism.
#[derive(Clone, Debug, Serialize)]
pub struct DrainRun {
    /// Relays (drain) and loop workers (ceiling).
    pub relays: usize,
    /// `postbox` relays draining to the null sink.
    pub relay: Throughput,
    /// The relay's own claim and mark statements in a minimal loop.
    pub ceiling: Throughput,
    /// `relay / ceiling`.
    pub ratio: f64,
}

/// The soak: throughput per window of events over a long drain.
#[derive(Clone, Debug, Serialize)]
pub struct Soak {
    /// Events drained.
    pub events: u64,
    /// Events per window.
    pub window: u64,
    /// Events/s of each window, in order.
    pub windows_per_second: Vec<f64>,
    /// Last window over first.
    pub last_over_first: f64,
    /// Resident memory of the benchmark process (relays included) at each window, KiB.
    pub rss_kib: Vec<u64>,
    /// Peak resident memory, KiB.
    pub peak_rss_kib: u64,
}

/// Everything one `postbox bench` run measured.
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    /// `postgres` or `sqlite`.
    pub backend: &'static str,
    /// Batch size used by relays and the ceiling loop.
    pub batch_size: u32,
    /// Enqueue overhead, per producer count.
    pub enqueue: Vec<EnqueueOverhead>,
    /// Drain vs. ceiling, per relay count.
    pub drain: Vec<DrainRun>,
    /// Commit-to-publish latency with NOTIFY wake-ups (PostgreSQL only).
    pub latency_notify: Option<Percentiles>,
    /// The same with polling only.
    pub latency_poll: Option<Percentiles>,
    /// Poll interval used for the polling-only latency run, ms.
    pub poll_interval_ms: u64,
    /// The soak, when run.
    pub soak: Option<Soak>,
}

impl BenchReport {
    /// The report as an aligned text table.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "postbox bench — {} (batch size {})",
            self.backend, self.batch_size
        );
        let _ = writeln!(out);
        let _ = writeln!(out, "enqueue overhead (business transactions/s)");
        let _ = writeln!(
            out,
            "  {:>9}  {:>12}  {:>12}  {:>9}  {:>16}  {:>9}",
            "producers", "without", "with event", "overhead", "event, no NOTIFY", "overhead"
        );
        for e in &self.enqueue {
            let (quiet, quiet_pct) = match (e.with_event_no_notify, e.overhead_no_notify_pct) {
                (Some(t), Some(p)) => (format!("{:.0}", t.per_second), format!("{p:.1}%")),
                _ => ("-".to_owned(), "-".to_owned()),
            };
            let _ = writeln!(
                out,
                "  {:>9}  {:>12.0}  {:>12.0}  {:>8.1}%  {:>16}  {:>9}",
                e.producers,
                e.without_event.per_second,
                e.with_event.per_second,
                e.overhead_pct,
                quiet,
                quiet_pct
            );
        }
        let _ = writeln!(out);
        let _ = writeln!(out, "drain to the null sink (events/s)");
        let _ = writeln!(
            out,
            "  {:>9}  {:>12}  {:>12}  {:>9}",
            "relays", "relay", "ceiling", "ratio"
        );
        for d in &self.drain {
            let _ = writeln!(
                out,
                "  {:>9}  {:>12.0}  {:>12.0}  {:>8.2}x",
                d.relays, d.relay.per_second, d.ceiling.per_second, d.ratio
            );
        }
        let _ = writeln!(out);
        let _ = writeln!(out, "commit-to-publish latency (ms)");
        let _ = writeln!(
            out,
            "  {:>18}  {:>7}  {:>8}  {:>8}  {:>8}  {:>8}",
            "mode", "rate/s", "p50", "p95", "p99", "max"
        );
        let rows = [
            ("NOTIFY".to_owned(), self.latency_notify),
            (
                format!("poll every {}ms", self.poll_interval_ms),
                self.latency_poll,
            ),
        ];
        for (name, p) in rows {
            if let Some(p) = p {
                let _ = writeln!(
                    out,
                    "  {:>18}  {:>7}  {:>8.2}  {:>8.2}  {:>8.2}  {:>8.2}",
                    name, p.rate, p.p50_ms, p.p95_ms, p.p99_ms, p.max_ms
                );
            }
        }
        if let Some(s) = &self.soak {
            let _ = writeln!(out);
            let _ = writeln!(out, "soak: {} events, windows of {}", s.events, s.window);
            let windows: Vec<String> = s
                .windows_per_second
                .iter()
                .map(|w| format!("{w:.0}"))
                .collect();
            let _ = writeln!(out, "  events/s per window: {}", windows.join(" "));
            let _ = writeln!(
                out,
                "  last/first: {:.2}   peak RSS: {:.1} MiB",
                s.last_over_first,
                s.peak_rss_kib as f64 / 1024.0
            );
        }
        out
    }
}

/// The process's resident memory in KiB (Linux), 0 where unknown.
pub(crate) fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}
