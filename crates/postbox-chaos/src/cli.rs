//! The command line.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::schedule::FaultKind;

/// `postbox-chaos`: relays killed, paused and cut off while producers commit events; then every
/// event is accounted for.
#[derive(Clone, Debug, Parser)]
#[command(
    name = "postbox-chaos",
    version,
    about = "A seeded chaos run: kill, pause and cut off relays, restart PostgreSQL, hold a \
             snapshot open, then account for every event",
    long_about = "A seeded, replayable chaos run against real processes. It starts a PostgreSQL \
                  cluster of its own (initdb in a temporary directory, on a free port; removed \
                  afterwards), migrates it with `postbox migrate`, and runs --relays `postbox \
                  relay` processes publishing to a fresh Redis stream through a TCP fault proxy. \
                  Producers commit --events events (through Outbox::enqueue with a ledger row in \
                  the same transaction, and by plain SQL), rolling back a share of transactions \
                  on purpose. Meanwhile a schedule drawn from --seed kills relays (SIGKILL, then \
                  a replacement), pauses them past their lease (SIGSTOP, SIGCONT), restarts \
                  PostgreSQL, stalls or cuts off the broker, and holds a REPEATABLE READ \
                  snapshot open for minutes (long-transaction). Then it waits for the outbox to \
                  drain, reads back everything the broker received, and prints a table: \
                  committed, published, lost, ghosts, duplicates against their bound, FAILED \
                  events, faults injected.\n\n\
                  The same --seed gives the same schedule and the same producer choices (the \
                  timing of processes is the machine's). Needs Redis (--redis-url) and the \
                  PostgreSQL server binaries (--pg-bin-dir); as root, PostgreSQL runs as \
                  --pg-user. Never touches any other PostgreSQL cluster.",
    after_long_help = "Exit status: 0 when every check passed, 1 when a check failed, 2 when \
                       the run could not be carried out (a service missing, a binary not built, \
                       interrupted)."
)]
pub(crate) struct Args {
    /// Seed of the fault schedule and the producers' choices [default: random, printed]
    #[arg(long)]
    pub(crate) seed: Option<u64>,

    /// Minutes of faults; producers spread their events over the same time
    #[arg(long, default_value_t = 2.0, value_parser = positive_minutes)]
    pub(crate) minutes: f64,

    /// Events to commit (the rolled-back ones come on top)
    #[arg(long, default_value_t = 20_000)]
    pub(crate) events: u64,

    /// Relay processes running at once
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=32))]
    pub(crate) relays: u32,

    /// Producer tasks committing events concurrently
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub(crate) producers: u32,

    /// The relays' lease (POSTBOX_LEASE); pauses last longer than this
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    pub(crate) lease: Duration,

    /// The relays' publish timeout (POSTBOX_PUBLISH_TIMEOUT); shorter than the lease
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub(crate) publish_timeout: Duration,

    /// The relays' batch size (POSTBOX_BATCH_SIZE, and POSTBOX_MAX_BATCH_SIZE: claims do not
    /// grow past it); the duplicate bound grows with it
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(crate) batch_size: u32,

    /// Spread the events over this many aggregates (`Account` `acct-0` …) and run the relays
    /// with per-aggregate ordering (POSTBOX_ORDERED_AGGREGATE_TYPES=Account); the report then
    /// checks that each aggregate's events were first delivered in id order (G6). 0: every
    /// event is an aggregate of its own and the relays do not order
    #[arg(long, default_value_t = 0)]
    pub(crate) ordered_aggregates: u32,

    /// Tenants (`t0` … schemas `s_t0` …) whose outboxes share the events with the default
    /// schema, each transaction writing into one of them at random: the relays serve every
    /// tenant through the same faults, and the report counts every event of every schema (each
    /// tenant's ids start in a range of their own). 0: the default schema only
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=10_000))]
    pub(crate) tenants: u32,

    /// Percent of producer transactions rolled back on purpose
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u8).range(0..=90))]
    pub(crate) rollback_percent: u8,

    /// Percent of transactions that write their events by plain SQL instead of Outbox::enqueue
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub(crate) sql_percent: u8,

    /// How the relays find events: `poll` (the claim) or `cdc` (a logical replication slot,
    /// `postbox relay --source cdc`; the private cluster then runs wal_level = logical and
    /// slot-drop faults join the schedule)
    #[arg(long, value_enum, default_value_t = Source::Poll)]
    pub(crate) source: Source,

    /// Fault kinds to draw from, comma-separated [default: all; slot-drop only with
    /// --source cdc]
    #[arg(long, value_enum, value_delimiter = ',')]
    pub(crate) faults: Vec<FaultKind>,

    /// Mean quiet time between two faults (each gap is drawn from half to one and a half times it)
    #[arg(long, default_value = "4s", value_parser = humantime::parse_duration)]
    pub(crate) fault_gap: Duration,

    /// Delay the proxy adds to every answer of the broker, as a network would; it keeps batches
    /// in flight long enough for kills and pauses to catch them
    #[arg(long, default_value = "20ms", value_parser = humantime::parse_duration)]
    pub(crate) broker_latency: Duration,

    /// Let faults of different kinds of target overlap: relays (kill, pause), PostgreSQL, the
    /// broker. By default faults come one at a time
    #[arg(long)]
    pub(crate) overlap: bool,

    /// Longest broker stall or outage
    #[arg(long, default_value = "8s", value_parser = humantime::parse_duration)]
    pub(crate) max_outage: Duration,

    /// Longest time PostgreSQL stays down during a restart
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    pub(crate) max_pg_downtime: Duration,

    /// How long to wait, after the faults and producers stop, for no event to be left
    /// PENDING or PROCESSING
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    pub(crate) drain_timeout: Duration,

    /// The `postbox` binary [default: `postbox` next to this binary]
    #[arg(long, value_name = "PATH")]
    pub(crate) postbox_bin: Option<PathBuf>,

    /// Directory of initdb, pg_ctl and postgres [default: the newest /usr/lib/postgresql/*/bin,
    /// else PATH]
    #[arg(long, value_name = "DIR")]
    pub(crate) pg_bin_dir: Option<PathBuf>,

    /// OS user that runs the private PostgreSQL cluster when this runs as root (initdb refuses
    /// root)
    #[arg(long, default_value = "postgres")]
    pub(crate) pg_user: String,

    /// The Redis server the relays publish to (through the fault proxy)
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    pub(crate) redis_url: String,

    /// Print the report as JSON on stdout (the schedule and progress go to stderr)
    #[arg(long)]
    pub(crate) json: bool,

    /// Keep the run directory (PostgreSQL data, relay logs) and the Redis stream afterwards; by
    /// default both are removed, except the relay logs of a failed run
    #[arg(long)]
    pub(crate) keep: bool,

    /// Print the schedule for the seed and exit
    #[arg(long)]
    pub(crate) schedule_only: bool,

    /// Log filter of this binary (the relays log at info into the run directory)
    #[arg(long, default_value = "info")]
    pub(crate) log_level: String,
}

/// How the relays find events.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Source {
    /// The polling claim.
    Poll,
    /// A logical replication slot, the polling claim as its safety net.
    Cdc,
}

fn positive_minutes(s: &str) -> Result<f64, String> {
    let minutes: f64 = s.parse().map_err(|e| format!("{s:?}: {e}"))?;
    if minutes.is_finite() && minutes > 0.0 && minutes <= 24.0 * 60.0 {
        Ok(minutes)
    } else {
        Err(format!("{s} must be above 0 and at most a day (1440)"))
    }
}

impl Args {
    /// How long faults are injected (and producers spread their events).
    pub(crate) fn duration(&self) -> Duration {
        Duration::from_secs_f64(self.minutes * 60.0)
    }

    /// The fault kinds to draw from.
    pub(crate) fn fault_kinds(&self) -> Vec<FaultKind> {
        if self.faults.is_empty() {
            match self.source {
                Source::Poll => FaultKind::POLLING.to_vec(),
                Source::Cdc => FaultKind::ALL.to_vec(),
            }
        } else {
            let mut kinds = self.faults.clone();
            kinds.sort();
            kinds.dedup();
            kinds
        }
    }
}
