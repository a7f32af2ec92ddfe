//! The command line: the subcommands, the flags every command accepts, and the configuration
//! layer they make. Each subcommand's own flags live beside it in `commands/`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[cfg(feature = "bench")]
use crate::commands::BenchArgs;
use crate::commands::{
    ArchiveArgs, ConfigArgs, DemoArgs, EventsCommand, MigrateArgs, PurgeArgs, RelayArgs,
    ReplayArgs, RetryArgs, StatusArgs, TenantsCommand,
};
use crate::config::{LogFormat, Overrides, keys_help};

/// `postbox`: the transactional outbox relay and its admin commands.
#[derive(Debug, Parser)]
#[command(
    name = "postbox",
    version,
    about = "Transactional outbox: publish the events your service committed, at least once",
    long_about = "Postbox publishes the events a service wrote to its outbox_events table in the \
                  same transaction as its business rows: every committed event at least once \
                  (or FAILED with a reason), never an event of a rolled-back transaction.\n\n\
                  Start with `postbox demo` to see it work, then `postbox migrate` and \
                  `postbox relay` against your database.",
    after_long_help = keys_help(),
    propagate_version = true
)]
pub(crate) struct Cli {
    /// Options every command accepts.
    #[command(flatten)]
    pub(crate) global: GlobalArgs,
    /// What to do.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Options every command accepts.
#[derive(Debug, Args)]
pub(crate) struct GlobalArgs {
    /// Configuration file [default: postbox.toml in the working directory, if present]
    #[arg(long, global = true, env = "POSTBOX_CONFIG", value_name = "PATH")]
    pub(crate) config: Option<PathBuf>,

    /// Database: postgres://… or postgresql://… for PostgreSQL, mysql://… (or mariadb://…) for
    /// MySQL 8.0.23+ / MariaDB 10.6+, sqlite:… or a path ending in .db for SQLite [config: database_url; default: SQLite file postbox.db in the working
    /// directory]. A password on the command line is visible to other users: prefer
    /// POSTBOX_DATABASE_URL.
    #[arg(long, global = true, value_name = "URL")]
    pub(crate) database_url: Option<String>,

    /// Log filter, e.g. "debug" or "warn,postbox=debug"; overrides RUST_LOG [config:
    /// log_level; default: info]
    #[arg(long, global = true, value_name = "FILTER")]
    pub(crate) log_level: Option<String>,

    /// Log format on stderr [config: log_format; default: text]
    #[arg(long, global = true, value_enum, value_name = "FORMAT")]
    pub(crate) log_format: Option<LogFormat>,
}

/// The default schema flag, on the commands that use one.
#[derive(Debug, Args, Default)]
pub(crate) struct SchemaArg {
    /// PostgreSQL schema of the default outbox and the tenant registry [config: schema;
    /// default: public]
    #[arg(long, value_name = "NAME")]
    pub(crate) schema: Option<String>,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Create or upgrade the outbox tables: the default schema, then every tenant's
    #[command(
        long_about = "Create or upgrade the outbox tables: the default schema (outbox_events, \
                      outbox_events_archive, the tenant registry) and then every registered \
                      tenant's schema. Prints each migration applied (and, on PostgreSQL, each \
                      function installed because its definition changed), or \"up to date\". \
                      Safe to run repeatedly and from several processes at once. On SQLite it creates \
                      the database file if needed."
    )]
    Migrate(MigrateArgs),

    /// Publish committed events (the relay daemon)
    #[command(
        long_about = "Publish committed events: claim due events in short transactions, publish \
                      them to the sink, mark them PROCESSED, retry failures with exponential \
                      backoff, and take over the events of relays that died (after their lease). \
                      Serves the default schema and every ACTIVE tenant. Run as many relays as \
                      you like: they never publish an event twice unless one dies or stalls past \
                      its lease.\n\n\
                      Sinks: stdout (the default), null, or a broker: --sink nats|amqp|kafka|\
                      redis|mqtt with --topic (the subject, routing key, topic or stream key, a \
                      template) and --sink-url (default: the broker on 127.0.0.1), or --sink \
                      webhook with --sink-url (the endpoint, a template). An event counts as \
                      published only once the broker acknowledged it. A broker that is away at \
                      start-up does not stop the relay: its events are retried until it is back. \
                      Several sinks with routing rules by event and aggregate type (globs) go in \
                      postbox.toml as [sinks.NAME] and [[routes]] tables (see the README).\n\n\
                      SIGINT or SIGTERM: stop claiming, finish the batch in flight, exit 0 (a \
                      second signal exits at once). Logs go to stderr; with --sink stdout, \
                      stdout carries only event lines.",
        after_long_help = "Stdout sink: one JSON object per line and per event, written and \
                           flushed before the event is marked PROCESSED:\n  \
                           {\"id\":42,\"tenant\":null,\"event_type\":\"InvoiceCreated\",\
                           \"aggregate_type\":\"Invoice\",\"aggregate_id\":\"456\",\
                           \"idempotency_key\":\"Invoice:456:InvoiceCreated:2026-04-24\",\
                           \"event_class\":null,\"schema_version\":1,\"retry_count\":0,\
                           \"created_at\":\"2026-04-24T09:30:00.123456Z\",\"headers\":{},\
                           \"payload\":{\"invoice_id\":456}}\n\
                           Delivery is at least once: drop repeats by id or idempotency_key.\n\n\
                           Exit status: 0 after a graceful stop or a complete drain; 1 on \
                           errors, a drain interrupted by a signal, or a stdout that cannot be \
                           written; 3 when a drain gave up on destinations that stayed down \
                           for drain_patience (their events stay PENDING, no try spent)."
    )]
    Relay(RelayArgs),

    /// Show event counts per status for the default schema and every tenant
    #[command(
        long_about = "Show, for the default schema and every tenant, how many events are \
                      PENDING, PROCESSING, PROCESSED and FAILED, and the age of the oldest \
                      event not yet done (PENDING or PROCESSING). A table for humans, or JSON \
                      with --json. It reads only the events not yet done and the FAILED ones: \
                      past 100,000 processed events the PROCESSED column is the database's \
                      estimate, shown as ~N (processed_exact: false in JSON). Exits 1 if a \
                      target cannot be read."
    )]
    Status(StatusArgs),

    /// Put FAILED events back in the queue once their cause is fixed
    #[command(
        long_about = "Put FAILED events back to PENDING with a fresh retry budget (retry_count 0), \
                      once the cause of their failure is fixed; a relay publishes them at its next \
                      poll. Name the events by id, or give --all for every FAILED event of the \
                      target (the default schema, or --tenant). Events in any other state are \
                      left alone. Prints how many events were put back."
    )]
    Retry(RetryArgs),

    /// List events, or show one whole
    #[command(subcommand)]
    Events(EventsCommand),

    /// Publish chosen events again: by id or filter, archive included, to any sink
    #[command(
        long_about = "Publish again the events chosen by id, or by filter (--type and \
                      --aggregate-type globs, --aggregate-id, --since/--until, --status \
                      processed and/or failed: both by default), from outbox_events and, with \
                      --archive (implied by ids), outbox_events_archive; oldest first, to the \
                      configured sink or routes, or to --sink/--sink-url/--topic. Nothing in the \
                      outbox changes. Each delivery carries the original event id and the headers \
                      postbox-replay-of (that id) and postbox-replay-id; its dedup id \
                      (idempotency key) is '<original>:replay:<replay id>', so consumers that \
                      drop repeats take it (--keep-dedup-id keeps the original). --dry-run \
                      counts and shows the first events; --rate limits events per second. Reads \
                      a page at a time: no transaction stays open. Exit status 1 if any event \
                      could not be published (they are listed)."
    )]
    Replay(ReplayArgs),

    /// Move processed events past their retention to the archive
    #[command(
        long_about = "Move PROCESSED events created more than --older-than ago (default: the \
                      `retention` key, 30 days) from outbox_events to outbox_events_archive, in \
                      short batches (no long transaction, no lock that stops relays), for the \
                      default schema and every tenant, or --tenant. PENDING, PROCESSING and \
                      FAILED events stay. Relays do the same every minute; this command is for \
                      a first clean-up or a shorter age. --dry-run counts and moves nothing. \
                      An archived event's idempotency key no longer blocks a duplicate: the \
                      dedup window is the time an event spends in outbox_events."
    )]
    Archive(ArchiveArgs),

    /// Delete archived events, or FAILED events, older than an age
    #[command(
        long_about = "Delete, in short batches, the archived events archived more than \
                      --older-than ago (--archive; on PostgreSQL whole weeks of the archive are \
                      dropped at once), or the FAILED events whose last try is more than \
                      --older-than ago (--failed; relays never delete FAILED events). The age \
                      is required. For the default schema and every tenant, or --tenant. \
                      --dry-run counts and deletes nothing."
    )]
    Purge(PurgeArgs),

    /// Add, list, suspend and resume tenants (PostgreSQL only)
    #[command(
        subcommand,
        long_about = "Manage tenants: each tenant has its own schema (s_<tenant> by default) \
                      with its own outbox_events table; relays serve every ACTIVE tenant fairly \
                      and leave SUSPENDED ones alone. Tenant ids and schema names are lower-case \
                      ASCII letters, digits and '_' (anything else is refused). PostgreSQL only."
    )]
    Tenants(TenantsCommand),

    /// Watch the outbox work: an invoice service, a flaky handler, retries and a tally
    #[command(
        long_about = "A self-contained demonstration. An invoice service writes invoices and \
                      their InvoiceCreated events in one transaction each, rolling some back on \
                      purpose; a relay publishes the outbox to a notification handler that fails \
                      now and then (and always for one invoice, which ends FAILED) and to an \
                      audit handler. It ends with a tally proving that no committed event was \
                      lost and no rolled-back one was published, and exits 1 if the tally does \
                      not hold.\n\n\
                      Runs on SQLite in a temporary directory, or on --database-url (a new SQLite \
                      file, or PostgreSQL, where it uses a schema of its own, dropped afterwards \
                      unless --keep). It never uses the configured database_url. Its own \
                      defaults keep it quick: max_retries 3, backoff_base 100ms, backoff_cap 2s, \
                      poll_interval 100ms, log_level off (postbox.toml, POSTBOX_* and flags \
                      still override them)."
    )]
    Demo(DemoArgs),

    /// Measure enqueue overhead, drain speed against the raw-SQL ceiling, latency, a soak and a
    /// month of history
    #[cfg(feature = "bench")]
    #[command(
        long_about = "Benchmark Postbox on this database server, in a scratch database of its \
                      own (dropped afterwards): PostgreSQL, or MySQL/MariaDB (no latency or \
                      history phase there); without a database_url, on a temporary SQLite \
                      file.\n\n\
                      Phases: enqueue overhead (business transactions without an event, with a \
                      second business row instead, the floor of any second statement, with an \
                      enqueue, with the event written by the business statement itself \
                      (enqueue_with, PostgreSQL), and with an enqueue that notifies on every \
                      commit (PostgreSQL), at 1 and 8 producers); drain (a preloaded backlog \
                      drained by 1 and 4 relays to the null sink, with the p50/p99 of every \
                      claim the relays made) beside the ceiling (the relay's own claim and mark \
                      statements in a minimal loop, same run); commit-to-publish latency at a \
                      steady rate with debounced NOTIFY and busy polling, with NOTIFY on every \
                      commit, with no NOTIFY at all (plain SQL) from idle, and with polling \
                      only (PostgreSQL); per-aggregate ordering (the --events backlog over \
                      --ordered-aggregates aggregates, drained with and without ordering); a \
                      soak (a large backlog, events/s per window, last/first \
                      ratio, peak RSS); history (PostgreSQL: first one relay drains an --events \
                      backlog of plain-SQL events, ANALYZEd while pending, on the empty table \
                      and again on the table with its history, each quiet, with a snapshot \
                      held open, and beside a producer transaction held open that wrote an \
                      event before the backlog, each drain on the table vacuumed of the one \
                      before and after a CHECKPOINT (a superuser or pg_checkpoint), events/s \
                      and claims of each; \
                      then a table that starts with \
                      --history-rows processed events written by plain SQL and VACUUM ANALYZEd, \
                      retention a third of --history-duration so archiving runs all along, \
                      producers at --history-rate, relays with every maintenance task on; per \
                      window: events/s, latency, claim cost, table, index and archive sizes, \
                      RSS; MySQL/MariaDB: the --events drain only, quiet, with a snapshot held \
                      open, and beside a producer transaction held open). Relays vacuum the outbox table at --vacuum-threshold dead rows.\n\n\
                      Progress bars on stderr; a table (or JSON with --json) on stdout. --quick \
                      runs every phase on a tiny scale in seconds: a smoke test, not a \
                      measurement. The machine's noise is real: compare ratios within one run, \
                      and medians across runs."
    )]
    Bench(BenchArgs),

    /// Show the effective configuration and where each value comes from
    #[command(after_long_help = keys_help())]
    Config(ConfigArgs),
}

impl Cli {
    /// The command-line layer of the configuration.
    pub(crate) fn overrides(&self) -> Overrides {
        let g = &self.global;
        let mut o = Overrides {
            database_url: g.database_url.clone(),
            log_format: g.log_format,
            log_level: g.log_level.clone(),
            ..Overrides::default()
        };
        let (schema, tuning, sink) = match &self.command {
            Command::Migrate(a) => (Some(&a.schema), None, None),
            Command::Relay(a) => (Some(&a.schema), Some(&a.tuning), Some(&a.sink)),
            Command::Status(a) => (Some(&a.schema), None, None),
            Command::Retry(a) => (Some(&a.schema), None, None),
            Command::Events(EventsCommand::List(a)) => (Some(&a.schema), None, None),
            Command::Events(EventsCommand::Show(a)) => (Some(&a.schema), None, None),
            Command::Events(EventsCommand::Skip(a)) => (Some(&a.schema), None, None),
            Command::Replay(a) => (Some(&a.schema), None, Some(&a.sink)),
            Command::Archive(a) => (Some(&a.schema), None, None),
            Command::Purge(a) => (Some(&a.schema), None, None),
            Command::Tenants(TenantsCommand::Add(_)) => (None, None, None),
            Command::Tenants(TenantsCommand::List(a)) => (Some(&a.schema), None, None),
            Command::Tenants(TenantsCommand::Suspend(a) | TenantsCommand::Resume(a)) => {
                (Some(&a.schema), None, None)
            }
            Command::Demo(_) => (None, None, None),
            #[cfg(feature = "bench")]
            Command::Bench(_) => (None, None, None),
            Command::Config(a) => (Some(&a.schema), Some(&a.tuning), Some(&a.sink)),
        };
        o.schema = schema.and_then(|s| s.schema.clone());
        if let Some(s) = sink {
            o.sink = s.sink;
            o.sink_url = s.sink_url.clone();
            o.topic = s.topic.clone();
            o.exchange = s.exchange.clone();
            o.sink_format = s.sink_format.clone();
        }
        if let Some(t) = tuning {
            o.batch_size = t.batch_size;
            o.poll_interval = t.poll_interval;
            o.lease = t.lease;
            o.backoff_base = t.backoff_base;
            o.backoff_cap = t.backoff_cap;
            o.publish_timeout = t.publish_timeout;
            o.concurrency = t.concurrency;
        }
        if let Command::Relay(a) = &self.command {
            o.admin_listen = a.admin_listen;
            o.source = a.source;
            o.cdc_slot = a.cdc_slot.clone();
            o.cdc_claim = a.cdc_claim.then_some(true);
        }
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }
}
