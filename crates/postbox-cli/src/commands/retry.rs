//! `postbox retry`: FAILED events back to PENDING, once an operator fixed their cause.

use std::process::ExitCode;

use clap::Args;
use postbox::Target;
use postbox::store::{EventFilter, EventStatus, ListParams, Order, RetryFailedParams};

use crate::cli::SchemaArg;
use crate::config::Config;
use crate::database::{Create, Database};

/// Retries the named FAILED events (or all of them) of the default schema or one tenant.
pub(crate) async fn run(config: &Config, args: &RetryArgs) -> anyhow::Result<ExitCode> {
    let db = Database::connect(&config.location()?, config.schema.clone(), Create::Never).await?;
    db.ensure_migrated().await?;
    let target = db.target(args.tenant.as_deref()).await?;
    let ids = (!args.all).then_some(args.ids.as_slice());
    let n = match ids {
        Some(ids) => {
            db.store
                .events_retry_failed(&RetryFailedParams {
                    target: &target,
                    ids: Some(ids),
                })
                .await?
        }
        None => retry_all(&db, &target).await?,
    };
    println!(
        "{n} FAILED event(s) of {} put back to PENDING; a relay publishes them at its next poll",
        target.label()
    );
    if let Some(ids) = ids
        && (n as usize) < ids.len()
    {
        eprintln!(
            "note: {} of the {} ids named were not FAILED (or do not exist) and were left alone",
            ids.len() - n as usize,
            ids.len()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// FAILED events retried per statement by `--all`: each page a short transaction, however many
/// there are.
const RETRY_PAGE: u32 = 1000;

/// Every FAILED event of `target`, oldest first, a page at a time, with a progress line on a
/// terminal. Events that fail again meanwhile are not retried twice: the walk goes by id.
async fn retry_all(db: &Database, target: &Target) -> anyhow::Result<u64> {
    let mut filter = EventFilter::default();
    filter.statuses.push(EventStatus::Failed);
    let progress =
        super::progress::Progress::start(format!("retrying FAILED events of {}", target.label()));
    let mut after = None;
    let mut total = 0;
    loop {
        let page = db
            .store
            .events_list(&ListParams {
                target,
                filter: &filter,
                order: Order::OldestFirst,
                after,
                limit: RETRY_PAGE,
            })
            .await?;
        let Some(last) = page.last() else { break };
        after = Some(last.id);
        let ids: Vec<i64> = page.iter().map(|e| e.id).collect();
        let n = db
            .store
            .events_retry_failed(&RetryFailedParams {
                target,
                ids: Some(&ids),
            })
            .await?;
        total += n;
        progress.add(n);
        if page.len() < RETRY_PAGE as usize {
            break;
        }
    }
    progress.finish();
    Ok(total)
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
