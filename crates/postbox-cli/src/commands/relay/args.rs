//! The flags of `postbox relay`, and the relay tuning flags `postbox config` shares.

use std::time::Duration;

use clap::Args;

use crate::cli::SchemaArg;
use crate::sinks::SinkArgs;

/// `postbox relay`.
#[derive(Debug, Args)]
pub(crate) struct RelayArgs {
    /// Stop once every event is PROCESSED or FAILED (waiting out retries and dead relays'
    /// leases), and exit 0; without it the relay runs until SIGINT/SIGTERM
    #[arg(long)]
    pub(crate) drain: bool,

    /// Run the migrations first (by default a relay waits for the outbox tables, saying to run
    /// `postbox migrate`, and a --drain stops at once)
    #[arg(long)]
    pub(crate) migrate: bool,

    /// The default schema.
    #[command(flatten)]
    pub(crate) schema: SchemaArg,

    /// Where events are published.
    #[command(flatten)]
    pub(crate) sink: SinkArgs,

    /// Relay tuning.
    #[command(flatten)]
    pub(crate) tuning: RelayTuning,

    /// Serve /metrics, /healthz, /readyz, the admin API and page on this address, e.g.
    /// 127.0.0.1:9187 [config: admin_listen; default: off]. The API needs POSTBOX_ADMIN_TOKEN;
    /// a non-loopback address is refused without it
    #[arg(long, value_name = "ADDR")]
    pub(crate) admin_listen: Option<std::net::SocketAddr>,

    /// How the relay learns of committed events: poll the outbox table, or (PostgreSQL) read
    /// its inserts from a logical replication slot, polling kept as the safety net [config:
    /// source; default: poll]. cdc needs wal_level = logical and a role with REPLICATION
    #[arg(long, value_enum, value_name = "SOURCE")]
    pub(crate) source: Option<crate::config::RelaySource>,

    /// The replication slot of --source cdc, created on first use [config: cdc_slot; default:
    /// postbox]
    #[arg(long, value_name = "NAME")]
    pub(crate) cdc_slot: Option<String>,

    /// With --source cdc, claim each event before publishing it, as polling does: for pollers
    /// beside it that do not leave it the events (postbox relays do, while it reads the slot).
    /// By default the events the slot names are read, published and marked: one write per
    /// event instead of two [config: cdc_claim; default: false]
    #[arg(long)]
    pub(crate) cdc_claim: bool,
}

/// Relay settings that also exist as configuration keys.
#[derive(Debug, Args, Default)]
#[command(next_help_heading = "Relay tuning (flags override postbox.toml and POSTBOX_*)")]
pub(crate) struct RelayTuning {
    /// Events claimed per batch, 1 to 10000 [config: batch_size; default: 100]
    #[arg(long, value_name = "N")]
    pub(crate) batch_size: Option<u32>,

    /// Polling interval when idle; NOTIFY wakes the relay sooner on PostgreSQL [config:
    /// poll_interval; default: 5s]
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub(crate) poll_interval: Option<Duration>,

    /// How long a claim lasts before another relay may take the events over [config: lease;
    /// default: 30s]
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub(crate) lease: Option<Duration>,

    /// Backoff unit: the n-th retry waits min(cap, base × 2^n) [config: backoff_base;
    /// default: 1s]
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub(crate) backoff_base: Option<Duration>,

    /// Longest wait between tries [config: backoff_cap; default: 300s]
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub(crate) backoff_cap: Option<Duration>,

    /// Time allowed for one publish; shorter than the lease [config: publish_timeout;
    /// default: 10s]
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub(crate) publish_timeout: Option<Duration>,

    /// Events of a batch published at once [config: concurrency; default: 64]
    #[arg(long, value_name = "N")]
    pub(crate) concurrency: Option<usize>,
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::Parser;

    use crate::cli::Cli;

    #[test]
    fn flags_become_overrides() {
        let cli = Cli::try_parse_from([
            "postbox",
            "relay",
            "--batch-size",
            "7",
            "--lease",
            "2s",
            "--schema",
            "app",
            "--database-url",
            "postgres://x/y",
        ])
        .expect("parses");
        let o = cli.overrides();
        assert_eq!(o.batch_size, Some(7));
        assert_eq!(o.lease, Some(Duration::from_secs(2)));
        assert_eq!(o.schema.as_deref(), Some("app"));
        assert_eq!(o.database_url.as_deref(), Some("postgres://x/y"));
        assert_eq!(o.poll_interval, None);
    }
}
