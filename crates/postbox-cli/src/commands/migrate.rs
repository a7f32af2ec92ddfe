//! `postbox migrate`: create or upgrade the outbox tables.

use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use crate::cli::SchemaArg;
use crate::config::Config;
use crate::database::{Create, Database};

/// Migrates the default schema and every tenant; prints what was applied.
pub(crate) async fn run(config: &Config) -> anyhow::Result<ExitCode> {
    // Every database a relay serves (database_urls), or the one database_url names.
    for location in config.locations()? {
        let db = Database::connect(&location, config.schema.clone(), Create::IfMissing).await?;
        let applied = apply(&db).await?;
        if applied.is_empty() {
            println!("{}: up to date", db.location);
        } else {
            for migration in &applied {
                println!("applied {migration}");
            }
            // PostgreSQL's functions come back as `schema: function name`.
            let functions = applied.iter().filter(|a| a.contains(": function ")).count();
            let migrations = applied.len() - functions;
            if functions == 0 {
                println!("{}: {migrations} migration(s) applied", db.location);
            } else {
                println!(
                    "{}: {migrations} migration(s) applied, {functions} function(s) installed",
                    db.location
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs the migrations; returns them as `schema: name`.
pub(crate) async fn apply(db: &Database) -> anyhow::Result<Vec<String>> {
    postbox::migrate(&*db.store)
        .await
        .with_context(|| format!("migrating {} failed", db.location))
}

/// `postbox migrate`.
#[derive(Debug, Args)]
pub(crate) struct MigrateArgs {
    /// The default schema.
    #[command(flatten)]
    pub(crate) schema: SchemaArg,
}
