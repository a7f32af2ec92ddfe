//! `postbox tenants add|list|suspend|resume`.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use postbox::store::TenantAddParams;
use postbox::{SchemaName, schema::TenantId, store::Tenant, store::TenantStatus};

use futures::StreamExt;

use super::progress::Progress;
use crate::cli::SchemaArg;
use crate::config::Config;
use crate::database::{Create, Database, Location};

/// Runs one tenants subcommand. Names are validated before the database is touched.
pub(crate) async fn run(config: &Config, command: &TenantsCommand) -> anyhow::Result<ExitCode> {
    match command {
        TenantsCommand::Add(args) => return add(config, args).await,
        TenantsCommand::List(args) => {
            let db = connect(config).await?;
            let tenants = db.store.tenant_list().await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&tenants)?);
            } else {
                print!("{}", table(&tenants));
            }
        }
        TenantsCommand::Suspend(args) => {
            let tenant = set_status(config, &args.id, TenantStatus::Suspended).await?;
            println!(
                "tenant {} is SUSPENDED: relays stop serving it within 10s; its events wait in \
                 schema {}",
                tenant.id, tenant.schema
            );
        }
        TenantsCommand::Resume(args) => {
            let tenant = set_status(config, &args.id, TenantStatus::Active).await?;
            println!(
                "tenant {} is ACTIVE: relays serve it again within 10s",
                tenant.id
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `postbox tenants add`: one tenant, or many (ids as arguments, or one per line of a file),
/// all checked before the database is touched, added a few at once with a progress bar. Adding
/// many is safe to run again: tenants already registered are counted and left as they are.
async fn add(config: &Config, args: &TenantAddArgs) -> anyhow::Result<ExitCode> {
    let ids = args.ids()?;
    if ids.is_empty() {
        anyhow::bail!("no tenant to add: name one or more ids, or --file with one id per line");
    }
    let schema = args.schema.as_deref().map(SchemaName::new).transpose()?;
    if schema.is_some() && ids.len() > 1 {
        anyhow::bail!(
            "--schema names the schema of one tenant; it cannot be given with {} ids",
            ids.len()
        );
    }
    let db = connect(config).await?;
    if let [id] = ids.as_slice() {
        let tenant = db
            .store
            .tenant_add(&TenantAddParams {
                id,
                schema: schema.as_ref(),
            })
            .await?;
        println!(
            "added tenant {} (schema {}, {}); relays serve it within 10s",
            tenant.id,
            tenant.schema,
            tenant.status.as_str()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let started = std::time::Instant::now();
    let progress = Progress::bounded_of("adding tenants".to_owned(), ids.len() as u64, "tenant(s)");
    let store = &db.store;
    let mut added = 0_u64;
    let mut existing = 0_u64;
    let mut failed: Vec<(TenantId, postbox::Error)> = Vec::new();
    let mut adds = futures::stream::iter(ids.iter().map(|id| async move {
        let result = store
            .tenant_add(&TenantAddParams { id, schema: None })
            .await;
        (id, result)
    }))
    .buffer_unordered(args.jobs.max(1));
    while let Some((id, result)) = adds.next().await {
        match result {
            Ok(_) => added += 1,
            Err(postbox::Error::TenantExists(_)) => existing += 1,
            Err(e) => failed.push((id.clone(), e)),
        }
        progress.add(1);
    }
    progress.finish();
    println!(
        "added {added} tenant(s) in {:.1}s ({existing} already registered, left as they were); \
         relays serve them within 10s",
        started.elapsed().as_secs_f64()
    );
    if failed.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    for (id, e) in failed.iter().take(20) {
        eprintln!("tenant {id}: {e}");
    }
    anyhow::bail!(
        "{} tenant(s) could not be added (the first are listed above); fix the cause and run the \
         same command again: the tenants added are kept",
        failed.len()
    )
}

/// Connects to the configured database; SQLite answers with the library's "unsupported" error.
async fn connect(config: &Config) -> anyhow::Result<Database> {
    let mut location = config.location()?;
    if let Location::Sqlite {
        file: Some(file), ..
    } = &location
        && !file.exists()
    {
        // SQLite has no tenants, and the library says so without reading anything: ask an
        // in-memory store rather than create a database file just to be told.
        location = Location::Sqlite {
            url: "sqlite::memory:".to_owned(),
            file: None,
        };
    }
    Database::connect(&location, config.schema.clone(), Create::Never).await
}

/// Validates `id`, then suspends or resumes the tenant.
async fn set_status(config: &Config, id: &str, status: TenantStatus) -> anyhow::Result<Tenant> {
    let id = TenantId::new(id)?;
    let db = connect(config).await?;
    db.store
        .tenant_set_status(&id, status)
        .await
        .with_context(|| format!("cannot set tenant {id} to {}", status.as_str()))
}

/// Tenants as an aligned table.
fn table(tenants: &[Tenant]) -> String {
    if tenants.is_empty() {
        return "no tenants (add one with `postbox tenants add <id>`)\n".to_owned();
    }
    let id_w = tenants
        .iter()
        .map(|t| t.id.as_str().len())
        .max()
        .unwrap_or(0)
        .max(6);
    let schema_w = tenants
        .iter()
        .map(|t| t.schema.as_str().len())
        .max()
        .unwrap_or(0)
        .max(6);
    let mut out = format!(
        "{:<id_w$}  {:<schema_w$}  {:<9}  ADDED\n",
        "TENANT", "SCHEMA", "STATUS"
    );
    for t in tenants {
        out.push_str(&format!(
            "{:<id_w$}  {:<schema_w$}  {:<9}  {}\n",
            t.id.as_str(),
            t.schema.as_str(),
            t.status.as_str(),
            t.created_at.format("%Y-%m-%d %H:%M:%S UTC")
        ));
    }
    out
}

/// `postbox tenants …`.
#[derive(Debug, Subcommand)]
pub(crate) enum TenantsCommand {
    /// Register tenants and create their schemas and outbox tables
    #[command(
        long_about = "Register tenants and create their schemas and outbox_events tables. Their \
                      services then enqueue into <schema>.outbox_events, and relays start serving \
                      them within 10 s. The registry lives in the default schema (config key \
                      `schema`, POSTBOX_SCHEMA; default public). Many at once: \
                      `postbox tenants add a b c`, or `--file tenants.txt` (one id per line); \
                      every id is checked first, tenants already registered are left as they \
                      are, so the command can be run again after an interruption."
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
    /// Tenant ids: lower-case ASCII letters, digits and '_', starting with a letter or '_', at
    /// most 61 bytes; not `default`, which names the default schema
    pub(crate) id: Vec<String>,

    /// Also add the ids in FILE, one per line ('-': standard input; blank lines and lines
    /// starting with '#' are skipped)
    #[arg(long, value_name = "FILE")]
    pub(crate) file: Option<std::path::PathBuf>,

    /// The tenant's schema, with one id [default: s_<id>]
    #[arg(long, value_name = "NAME")]
    pub(crate) schema: Option<String>,

    /// Tenants added at once when adding many
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub(crate) jobs: usize,
}

impl TenantAddArgs {
    /// Every id given, in order, each once; every id that cannot be a tenant id is named (with
    /// its line in the file) before anything is added.
    fn ids(&self) -> anyhow::Result<Vec<TenantId>> {
        let mut given: Vec<(String, String)> = self
            .id
            .iter()
            .map(|id| (id.clone(), format!("argument {id:?}")))
            .collect();
        if let Some(file) = &self.file {
            let text = if file.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin()).context("cannot read standard input")?
            } else {
                std::fs::read_to_string(file)
                    .with_context(|| format!("cannot read {}", file.display()))?
            };
            for (n, line) in text.lines().enumerate() {
                let line = line.trim();
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                given.push((line.to_owned(), format!("{}:{}", file.display(), n + 1)));
            }
        }
        let mut seen = std::collections::HashSet::new();
        let mut ids = Vec::with_capacity(given.len());
        let mut bad = Vec::new();
        for (id, at) in given {
            match TenantId::new(&id) {
                Ok(id) if seen.insert(id.clone()) => ids.push(id),
                Ok(_) => {}
                Err(e) => bad.push(format!("{at}: {e}")),
            }
        }
        if !bad.is_empty() {
            let more = bad.len().saturating_sub(20);
            let mut message = bad.into_iter().take(20).collect::<Vec<_>>().join("\n");
            if more > 0 {
                message.push_str(&format!("\n… and {more} more"));
            }
            anyhow::bail!("invalid tenant ids; nothing was added:\n{message}");
        }
        Ok(ids)
    }
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

#[cfg(test)]
mod tests {
    use crate::cli::{Cli, Command};
    use crate::commands::TenantsCommand;
    use clap::Parser;

    #[test]
    fn tenants_add_schema_is_the_tenants_own() {
        let cli = Cli::try_parse_from(["postbox", "tenants", "add", "acme", "--schema", "s_x"])
            .expect("parses");
        assert_eq!(cli.overrides().schema, None);
        match cli.command {
            Command::Tenants(TenantsCommand::Add(a)) => {
                assert_eq!(a.schema.as_deref(), Some("s_x"));
                assert_eq!(a.id, ["acme"]);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}
