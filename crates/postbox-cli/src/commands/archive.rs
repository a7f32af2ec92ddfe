//! `postbox archive`: processed events past their retention move to the archive.

use std::process::ExitCode;

use anyhow::{Context, bail};
use postbox::store::{ArchiveParams, archive_all};

use std::time::Duration;

use clap::Args;

use crate::cli::SchemaArg;
use crate::commands::progress::Progress;
use crate::config::{Config, show};
use crate::database::{Create, Database};

/// Archives (or with `--dry-run` counts) the processed events of each target created longer
/// ago than `--older-than` or the `retention` key.
pub(crate) async fn run(config: &Config, args: &ArchiveArgs) -> anyhow::Result<ExitCode> {
    let Some(older_than) = args.older_than.or(config.retention()) else {
        bail!(
            "retention is off (retention = \"0s\") and no --older-than was given: say how old \
             the processed events to archive must be, e.g. --older-than 30days"
        );
    };
    let db = Database::connect(&config.location()?, config.schema.clone(), Create::Never).await?;
    db.ensure_migrated().await?;
    let verb = if args.dry_run {
        "would be archived"
    } else {
        "archived"
    };
    let mut total = 0;
    for target in db.targets(args.tenant.as_deref()).await? {
        let progress = Progress::start(format!("{}: {verb}", target.label()));
        let params = ArchiveParams {
            target: &target,
            older_than,
            after_id: 0,
            batch_size: args.batch_size,
            dry_run: args.dry_run,
            lock_wait: None,
        };
        let moved = archive_all(&*db.store, params, true, |n| progress.add(n))
            .await
            .with_context(|| format!("archiving {} stopped", target.label()))?
            .unwrap_or(0);
        progress.finish();
        total += moved;
        println!(
            "{}: {moved} processed event(s) created more than {} ago {verb}",
            target.label(),
            show(older_than)
        );
    }
    if args.dry_run {
        println!("dry run: {total} event(s) in all; nothing was moved");
    }
    Ok(ExitCode::SUCCESS)
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
