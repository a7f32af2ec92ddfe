//! The command line: subcommands, flags and their help.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::config::{LogFormat, Overrides, SinkKind, keys_help};

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
                      tenant's schema. Prints each migration applied, or \"up to date\". Safe to \
                      run repeatedly and from several processes at once. On SQLite it creates \
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
                      event before the backlog, after a CHECKPOINT (a superuser or pg_checkpoint), events/s \
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

/// `postbox migrate`.
#[derive(Debug, Args)]
pub(crate) struct MigrateArgs {
    /// The default schema.
    #[command(flatten)]
    pub(crate) schema: SchemaArg,
}

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
}

/// The sink kinds this build has, with their help, for `--sink`.
fn sink_kinds() -> impl clap::builder::TypedValueParser<Value = SinkKind> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    let values = SinkKind::ALL
        .iter()
        .map(|k| PossibleValue::new(k.name()).help(k.description().trim_end_matches('.')));
    // Only the names above get through the parser, and each is a kind.
    PossibleValuesParser::new(values).map(|name| name.parse().unwrap_or(SinkKind::Stdout))
}

/// The relay's one sink, from the command line.
#[derive(Debug, Args, Default)]
#[command(next_help_heading = "Sink (flags override postbox.toml and POSTBOX_*)")]
pub(crate) struct SinkArgs {
    /// Where events are published [config: sink; default: stdout, or the [[routes]] of
    /// postbox.toml when it has some (a --sink flag overrides them)]
    #[arg(long, value_parser = sink_kinds(), value_name = "KIND")]
    pub(crate) sink: Option<SinkKind>,

    /// The sink's address [config: sink_url; defaults: nats://127.0.0.1:4222,
    /// amqp://127.0.0.1:5672/%2f (guest/guest), kafka://127.0.0.1:9092 (or a host:port list),
    /// redis://127.0.0.1:6379, mqtt://127.0.0.1:1883]. For webhooks, required: the endpoint, a
    /// template like https://hooks.example.com/{event_type}. Passwords in it are never logged;
    /// prefer POSTBOX_SINK_URL to the flag for URLs with a password
    #[arg(long, value_name = "URL")]
    pub(crate) sink_url: Option<String>,

    /// Destination template, required for brokers: the NATS subject, the AMQP routing key, the
    /// Kafka topic, the Redis stream key or the MQTT topic, e.g. 'billing.{aggregate_type}.{event_type}'.
    /// Placeholders: {event_type}, {aggregate_type}, {aggregate_id}, {tenant}, {schema_version} [config: topic]
    #[arg(long, value_name = "TEMPLATE")]
    pub(crate) topic: Option<String>,

    /// AMQP exchange to publish to [config: exchange; default: "", the default exchange, which
    /// delivers to the queue named by the routing key]
    #[arg(long, value_name = "NAME")]
    pub(crate) exchange: Option<String>,

    /// How the sink writes each event: postbox, or cloudevents (CloudEvents 1.0, binary mode)
    /// [config: sink_format; default: postbox]
    #[arg(long, value_name = "FORMAT", value_parser = ["postbox", "cloudevents"])]
    pub(crate) sink_format: Option<String>,
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

/// `postbox status`.
#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// Print JSON instead of a table
    #[arg(long)]
    pub(crate) json: bool,

    /// The default schema.
    #[command(flatten)]
    pub(crate) schema: SchemaArg,
}

/// `postbox retry`.
#[derive(Debug, Args)]
pub(crate) struct RetryArgs {
    /// Ids of the FAILED events to retry
    #[arg(
        value_name = "ID",
        required_unless_present = "all",
        conflicts_with = "all"
    )]
    pub(crate) ids: Vec<i64>,

    /// Retry every FAILED event of the target
    #[arg(long)]
    pub(crate) all: bool,

    /// The tenant whose events to retry (`default`: the default schema) [default: the default schema]
    #[arg(long, value_name = "TENANT")]
    pub(crate) tenant: Option<String>,

    /// The default schema.
    #[command(flatten)]
    pub(crate) schema: SchemaArg,
}

/// `postbox events …`.
#[derive(Debug, Subcommand)]
pub(crate) enum EventsCommand {
    /// List events, newest first, by status, type, aggregate, time; the archive too
    #[command(
        long_about = "List the events of the default schema (or --tenant) that match every \
                      filter given, newest first: id, status, type, aggregate, creation time, \
                      tries and last error, as a table or with --json. --archive reads \
                      outbox_events_archive too. A filter that matches nothing prints \
                      \"0 events\"; a filter that cannot match (a time range backwards, an \
                      unknown status, a glob with [ ]) is refused."
    )]
    List(EventsListArgs),

    /// Show one event: every column, headers, last error, the payload pretty-printed
    Show(EventsShowArgs),

    /// Skip the held-back head of an ordered aggregate: it stays FAILED, the rest flows
    #[command(
        long_about = "Skip events that hold back the later events of their ordered aggregate \
                      (ordered_aggregate_types): each goes FAILED, if it was waiting for a \
                      retry, and is marked skipped, so that the rest of its aggregate is \
                      published; `postbox events list --parked` lists the candidates. Events in \
                      flight or already PROCESSED are left alone (and named). `postbox retry \
                      ID` undoes a skip: the event is published again, after the events that \
                      overtook it."
    )]
    Skip(EventsSkipArgs),
}

/// `postbox events skip`.
#[derive(Debug, Args)]
pub(crate) struct EventsSkipArgs {
    /// Ids of the events to skip
    #[arg(value_name = "ID", required = true)]
    pub(crate) ids: Vec<i64>,

    /// The tenant the events belong to (`default`: the default schema) [default: the default schema]
    #[arg(long, value_name = "TENANT")]
    pub(crate) tenant: Option<String>,

    /// The default schema.
    #[command(flatten)]
    pub(crate) schema: SchemaArg,
}

/// Which events: the filters shared by `events list` and `replay`.
#[derive(Debug, Args)]
pub(crate) struct FilterArgs {
    /// Only events with this status (repeat for several): pending, processing, processed,
    /// failed
    #[arg(long, value_name = "STATUS")]
    pub(crate) status: Vec<String>,

    /// Event types matching this glob (`*` any run, `?` one character), e.g. 'Invoice*'
    #[arg(long = "type", value_name = "GLOB")]
    pub(crate) event_type: Option<String>,

    /// Aggregate types matching this glob
    #[arg(long, value_name = "GLOB")]
    pub(crate) aggregate_type: Option<String>,

    /// This aggregate id exactly
    #[arg(long, value_name = "ID")]
    pub(crate) aggregate_id: Option<String>,

    /// Created at or after this time: RFC 3339 (2026-11-30T12:00:00Z), a date (2026-11-30,
    /// UTC) or an age (2h, 7d: that long ago)
    #[arg(long, value_name = "TIME")]
    pub(crate) since: Option<String>,

    /// Created before this time (same forms as --since)
    #[arg(long, value_name = "TIME")]
    pub(crate) until: Option<String>,

    /// Read outbox_events_archive too
    #[arg(long)]
    pub(crate) archive: bool,

    /// The tenant whose events to read (`default`: the default schema) [default: the default schema]
    #[arg(long, value_name = "TENANT")]
    pub(crate) tenant: Option<String>,
}

/// `postbox events list`.
#[derive(Debug, Args)]
pub(crate) struct EventsListArgs {
    /// Which events.
    #[command(flatten)]
    pub(crate) filter: FilterArgs,

    /// Only the heads of parked aggregates: FAILED events (not skipped) that hold back later
    /// events of their aggregate (ordered_aggregate_types)
    #[arg(long)]
    pub(crate) parked: bool,

    /// At most this many events
    #[arg(long, value_name = "N", default_value_t = 50,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) limit: u32,

    /// Print JSON (an array of events, payloads and headers as JSON) instead of a table
    #[arg(long)]
    pub(crate) json: bool,

    /// The default schema.
    #[command(flatten)]
    pub(crate) schema: SchemaArg,
}

/// `postbox events show`.
#[derive(Debug, Args)]
pub(crate) struct EventsShowArgs {
    /// The event id
    #[arg(value_name = "ID")]
    pub(crate) id: i64,

    /// The tenant the event belongs to (`default`: the default schema) [default: the default schema]
    #[arg(long, value_name = "TENANT")]
    pub(crate) tenant: Option<String>,

    /// Print JSON instead of text
    #[arg(long)]
    pub(crate) json: bool,

    /// The default schema.
    #[command(flatten)]
    pub(crate) schema: SchemaArg,
}

/// `postbox replay`.
#[derive(Debug, Args)]
pub(crate) struct ReplayArgs {
    /// Ids of the events to replay (the archive is read too)
    #[arg(value_name = "ID")]
    pub(crate) ids: Vec<i64>,

    /// Which events.
    #[command(flatten)]
    pub(crate) filter: FilterArgs,

    /// Replay every PROCESSED and FAILED event (needed when no id and no filter is given)
    #[arg(long)]
    pub(crate) all: bool,

    /// Count the events and show the first ones; publish nothing
    #[arg(long)]
    pub(crate) dry_run: bool,

    /// At most this many events per second
    #[arg(long, value_name = "EVENTS_PER_SECOND")]
    pub(crate) rate: Option<f64>,

    /// The replay's id [default: a new UUID]; give an interrupted replay's id to run it again
    /// without new duplicates for consumers that drop repeats
    #[arg(long, value_name = "ID")]
    pub(crate) replay_id: Option<String>,

    /// Deliver with the original dedup id (idempotency key): consumers that drop repeats then
    /// drop events they already have
    #[arg(long)]
    pub(crate) keep_dedup_id: bool,

    /// Events published at once
    #[arg(long, value_name = "N", default_value_t = 32,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub(crate) concurrency: u32,

    /// The default schema.
    #[command(flatten)]
    pub(crate) schema: SchemaArg,

    /// Where events are published.
    #[command(flatten)]
    pub(crate) sink: SinkArgs,
}

/// `postbox archive`.
#[derive(Debug, Args)]
pub(crate) struct ArchiveArgs {
    /// Archive processed events created longer ago than this [default: the `retention` key,
    /// 30days]
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub(crate) older_than: Option<Duration>,

    /// Only this tenant (`default`: the default schema) [default: the default schema and every
    /// tenant]
    #[arg(long, value_name = "TENANT")]
    pub(crate) tenant: Option<String>,

    /// Count what would move; move nothing
    #[arg(long)]
    pub(crate) dry_run: bool,

    /// Rows per batch (each batch is one short transaction)
    #[arg(long, value_name = "N", default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) batch_size: u32,

    /// The default schema.
    #[command(flatten)]
    pub(crate) schema: SchemaArg,
}

/// `postbox purge`.
#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("what").required(true).args(["archive", "failed", "inbox"]))]
pub(crate) struct PurgeArgs {
    /// Delete archived events archived longer ago than --older-than
    #[arg(long)]
    pub(crate) archive: bool,

    /// Delete FAILED events whose last try is older than --older-than
    #[arg(long)]
    pub(crate) failed: bool,

    /// Delete inbox records received longer ago than --older-than (past the dedup window, a
    /// repeat of their message is handled again)
    #[arg(long)]
    pub(crate) inbox: bool,

    /// The age past which events are deleted (required), e.g. 7d, 90days
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration,
          required = true)]
    pub(crate) older_than: Option<Duration>,

    /// Only this tenant (`default`: the default schema) [default: the default schema and every
    /// tenant]
    #[arg(long, value_name = "TENANT")]
    pub(crate) tenant: Option<String>,

    /// Count what would be deleted; delete nothing
    #[arg(long)]
    pub(crate) dry_run: bool,

    /// Rows per batch (each batch is one short transaction)
    #[arg(long, value_name = "N", default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) batch_size: u32,

    /// The default schema.
    #[command(flatten)]
    pub(crate) schema: SchemaArg,
}

/// `postbox tenants …`.
#[derive(Debug, Subcommand)]
pub(crate) enum TenantsCommand {
    /// Register a tenant and create its schema and outbox table
    #[command(
        long_about = "Register a tenant and create its schema and outbox_events table. Its \
                      services then enqueue into <schema>.outbox_events, and relays start serving \
                      it within 10 s. The registry lives in the default schema (config key \
                      `schema`, POSTBOX_SCHEMA; default public)."
    )]
    Add(TenantAddArgs),

    /// List tenants with their schema and status
    List(TenantListArgs),

    /// Stop serving a tenant: its events wait (relays notice within 10 s)
    Suspend(TenantIdArgs),

    /// Serve a suspended tenant again
    Resume(TenantIdArgs),
}

/// `postbox tenants add`.
#[derive(Debug, Args)]
pub(crate) struct TenantAddArgs {
    /// Tenant id: lower-case ASCII letters, digits and '_', starting with a letter or '_', at
    /// most 61 bytes; not `default`, which names the default schema
    pub(crate) id: String,

    /// The tenant's schema [default: s_<id>]
    #[arg(long, value_name = "NAME")]
    pub(crate) schema: Option<String>,
}

/// `postbox tenants list`.
#[derive(Debug, Args)]
pub(crate) struct TenantListArgs {
    /// Print JSON instead of a table
    #[arg(long)]
    pub(crate) json: bool,

    /// The default schema.
    #[command(flatten)]
    pub(crate) schema: SchemaArg,
}

/// `postbox tenants suspend|resume`.
#[derive(Debug, Args)]
pub(crate) struct TenantIdArgs {
    /// Tenant id
    pub(crate) id: String,

    /// The default schema.
    #[command(flatten)]
    pub(crate) schema: SchemaArg,
}

/// `postbox demo`.
#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Keep the demo's database afterwards (its location is printed) to look around in it
    #[arg(long)]
    pub(crate) keep: bool,
}

/// `postbox config`.
#[derive(Debug, Args)]
pub(crate) struct ConfigArgs {
    /// The default schema.
    #[command(flatten)]
    pub(crate) schema: SchemaArg,

    /// The sink, to preview its effect.
    #[command(flatten)]
    pub(crate) sink: SinkArgs,

    /// Relay tuning, to preview its effect.
    #[command(flatten)]
    pub(crate) tuning: RelayTuning,

    /// Also say how events of this type are retried: which [[retry_policies]] table applies,
    /// its tries, backoff and slow lane
    #[arg(long, value_name = "TYPE")]
    pub(crate) event_type: Option<String>,
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

    #[test]
    fn sink_flags_become_overrides() {
        let cli = Cli::try_parse_from([
            "postbox",
            "relay",
            "--sink",
            "amqp",
            "--sink-url",
            "amqp://guest:guest@127.0.0.1:5672/%2f",
            "--topic",
            "{aggregate_type}.{event_type}",
            "--exchange",
            "billing",
        ])
        .expect("parses");
        let o = cli.overrides();
        assert_eq!(o.sink, Some(SinkKind::Amqp));
        assert_eq!(o.topic.as_deref(), Some("{aggregate_type}.{event_type}"));
        assert_eq!(o.exchange.as_deref(), Some("billing"));
        assert!(o.sink_url.is_some());
        for kind in SinkKind::ALL {
            let name = kind.name();
            Cli::try_parse_from(["postbox", "relay", "--sink", name]).expect(name);
        }
        assert!(Cli::try_parse_from(["postbox", "relay", "--sink", "sqs"]).is_err());
    }

    #[cfg(feature = "bench")]
    #[test]
    fn bench_takes_a_vacuum_threshold() {
        let cli = Cli::try_parse_from(["postbox", "bench", "--quick", "--vacuum-threshold", "0"])
            .expect("parses");
        match cli.command {
            Command::Bench(a) => {
                assert!(a.quick);
                assert_eq!(a.vacuum_threshold, Some(0));
            }
            other => panic!("unexpected {other:?}"),
        }
        match Cli::try_parse_from(["postbox", "bench"])
            .expect("parses")
            .command
        {
            Command::Bench(a) => assert_eq!(a.vacuum_threshold, None),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[cfg(feature = "bench")]
    #[test]
    fn bench_business_statements_are_at_least_one() {
        match Cli::try_parse_from(["postbox", "bench", "--business-statements", "3"])
            .expect("parses")
            .command
        {
            Command::Bench(a) => assert_eq!(a.business_statements, Some(3)),
            other => panic!("unexpected {other:?}"),
        }
        let err = Cli::try_parse_from(["postbox", "bench", "--business-statements", "0"])
            .expect_err("zero statements is no business transaction");
        assert!(err.to_string().contains("--business-statements"), "{err}");
    }

    #[test]
    fn tenants_add_schema_is_the_tenants_own() {
        let cli = Cli::try_parse_from(["postbox", "tenants", "add", "acme", "--schema", "s_x"])
            .expect("parses");
        assert_eq!(cli.overrides().schema, None);
        match cli.command {
            Command::Tenants(TenantsCommand::Add(a)) => {
                assert_eq!(a.schema.as_deref(), Some("s_x"))
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// `postbox bench`.
#[cfg(feature = "bench")]
#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    /// Tiny scale, finishes in seconds (a smoke test; its figures mean nothing)
    #[arg(long)]
    pub(crate) quick: bool,

    /// Print the report as JSON instead of a table
    #[arg(long)]
    pub(crate) json: bool,

    /// Events preloaded for each drain and ceiling run [default: 100000; quick: 2000]
    #[arg(long, value_name = "N")]
    pub(crate) events: Option<u64>,

    /// Relay counts to drain with, comma-separated [default: 1,4]
    #[arg(long, value_name = "N,N", value_delimiter = ',')]
    pub(crate) relays: Option<Vec<usize>>,

    /// Producer counts for the enqueue overhead, comma-separated [default: 1,8]
    #[arg(long, value_name = "N,N", value_delimiter = ',')]
    pub(crate) producers: Option<Vec<usize>>,

    /// Producer rate of the latency runs, events/s [default: 2000; quick: 500]
    #[arg(long, value_name = "EVENTS_PER_SEC")]
    pub(crate) rate: Option<u64>,

    /// How long each latency run produces [default: 10s; quick: 500ms]
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub(crate) latency_duration: Option<Duration>,

    /// How long each enqueue-overhead measurement runs [default: 5s; quick: 300ms]
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub(crate) enqueue_duration: Option<Duration>,

    /// Business rows (one INSERT each) in each business transaction of the enqueue overhead
    /// [default: 1, the smallest transaction]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) business_statements: Option<u32>,

    /// Aggregate counts of the ordering phase, comma-separated, 0 to skip it: --events spread
    /// over that many aggregates, drained with and without ordering [default: 10000,100;
    /// quick: 1000,10]
    #[arg(long, value_name = "N,N", value_delimiter = ',')]
    pub(crate) ordered_aggregates: Option<Vec<u64>>,

    /// Events of the soak, 0 to skip it [default: 1000000; quick: 4000]
    #[arg(long, value_name = "N")]
    pub(crate) soak_events: Option<u64>,

    /// Events per soak window [default: 100000; quick: 1000]
    #[arg(long, value_name = "N")]
    pub(crate) soak_window: Option<u64>,

    /// Processed events in the table at the start of the history phase, 0 to skip it
    /// (PostgreSQL; on MySQL any other value runs its held-transaction drain) [default: 1000000;
    /// quick: 20000]
    #[arg(long, value_name = "N")]
    pub(crate) history_rows: Option<u64>,

    /// How long the history phase runs [default: 5m; quick: 6s]
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub(crate) history_duration: Option<Duration>,

    /// Producer rate of the history phase, events/s [default: 1000; quick: 200]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) history_rate: Option<u64>,

    /// Measurement window of the history phase [default: 30s; quick: 2s]
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub(crate) history_window: Option<Duration>,

    /// Events in each backlog of the CDC comparison, 0 to skip it (PostgreSQL; needs
    /// wal_level = logical, else the report says why it was not measured) [default: 500000;
    /// quick: 2000]
    #[arg(long, value_name = "N")]
    pub(crate) cdc_events: Option<u64>,

    /// Producer rate of the CDC comparison's latency runs, events/s [default: 1000; quick: 200]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) cdc_rate: Option<u64>,

    /// How long the CDC comparison watches the slot's retained WAL while 20 other tables churn
    /// [default: 1m; quick: 3s]
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub(crate) cdc_churn: Option<Duration>,

    /// How long the CDC relay then stays stopped while they churn on [default: 30s; quick: 1s]
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub(crate) cdc_stopped: Option<Duration>,

    /// Relay and ceiling batch size [config: batch_size; default: 100]
    #[arg(long, value_name = "N")]
    pub(crate) batch_size: Option<u32>,

    /// Dead rows that make the relays vacuum the outbox table, 0 for never [config:
    /// vacuum_threshold; default: 50000]
    #[arg(long, value_name = "N")]
    pub(crate) vacuum_threshold: Option<u64>,
}
