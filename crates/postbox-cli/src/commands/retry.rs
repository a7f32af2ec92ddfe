//! `postbox retry`: FAILED events back to PENDING, once an operator fixed their cause.

use std::process::ExitCode;

use postbox::store::RetryFailedParams;

use crate::cli::RetryArgs;
use crate::config::Config;
use crate::database::{Create, Database};

/// Retries the named FAILED events (or all of them) of the default schema or one tenant.
pub(crate) async fn run(config: &Config, args: &RetryArgs) -> anyhow::Result<ExitCode> {
    let db = Database::connect(&config.location()?, config.schema_name()?, Create::Never).await?;
    db.ensure_migrated().await?;
    let target = match args.tenant.as_deref() {
        None => db.default_target(),
        Some(tenant) => db.targets(Some(tenant)).await?.remove(0),
    };
    let ids = (!args.all).then_some(args.ids.as_slice());
    let n = db
        .store
        .events_retry_failed(&RetryFailedParams {
            target: &target,
            ids,
        })
        .await?;
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
