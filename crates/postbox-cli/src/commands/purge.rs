//! `postbox purge`: archived events, FAILED events or inbox records past an age are deleted.

use std::process::ExitCode;

use anyhow::Context;
use postbox::store::{PurgeKind, PurgeParams, purge_all};

use std::time::Duration;

use clap::Args;

use crate::cli::SchemaArg;
use crate::commands::progress::Progress;
use crate::config::{Config, show};
use crate::database::{Create, Database};

/// Purges (or with `--dry-run` counts) the archived or FAILED events, or the inbox records, of
/// each target older than `--older-than`.
pub(crate) async fn run(config: &Config, args: &PurgeArgs) -> anyhow::Result<ExitCode> {
    // clap requires it; an age is what keeps a purge from emptying a table by mistake.
    let older_than = args
        .older_than
        .context("--older-than is required: say how old the events to delete must be")?;
    let (kind, what) = if args.failed {
        (PurgeKind::Failed, "FAILED event(s) whose last try is")
    } else if args.inbox {
        (PurgeKind::Inbox, "inbox record(s) received")
    } else {
        (PurgeKind::Archive, "archived event(s) archived")
    };
    let db = Database::connect(&config.location()?, config.schema.clone(), Create::Never).await?;
    db.ensure_migrated().await?;
    let verb = if args.dry_run {
        "would be deleted"
    } else {
        "deleted"
    };
    let mut total = 0;
    for target in db.targets(args.tenant.as_deref()).await? {
        let progress = Progress::start(format!("{}: {verb}", target.label()));
        let params = PurgeParams {
            target: &target,
            kind,
            older_than,
            batch_size: args.batch_size,
            dry_run: args.dry_run,
            lock_wait: None,
        };
        let purged = purge_all(&*db.store, params, true, |n| progress.add(n))
            .await
            .with_context(|| format!("purging {} stopped", target.label()))?
            .unwrap_or(0);
        progress.finish();
        total += purged;
        println!(
            "{}: {purged} {what} more than {} old {verb}",
            target.label(),
            show(older_than)
        );
    }
    if args.dry_run {
        println!("dry run: {total} row(s) in all; nothing was deleted");
    }
    Ok(ExitCode::SUCCESS)
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
