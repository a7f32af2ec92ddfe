//! `postbox tenants add|list|suspend|resume`.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use postbox::store::TenantAddParams;
use postbox::{SchemaName, schema::TenantId, store::Tenant, store::TenantStatus};

use crate::cli::SchemaArg;
use crate::config::Config;
use crate::database::{Create, Database, Location};

/// Runs one tenants subcommand. Names are validated before the database is touched.
pub(crate) async fn run(config: &Config, command: &TenantsCommand) -> anyhow::Result<ExitCode> {
    match command {
        TenantsCommand::Add(args) => {
            let id = TenantId::new(&args.id)?;
            let schema = args.schema.as_deref().map(SchemaName::new).transpose()?;
            let db = connect(config).await?;
            let tenant = db
                .store
                .tenant_add(&TenantAddParams {
                    id: &id,
                    schema: schema.as_ref(),
                })
                .await?;
            println!(
                "added tenant {} (schema {}, {}); relays serve it within 10s",
                tenant.id,
                tenant.schema,
                tenant.status.as_str()
            );
        }
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
                assert_eq!(a.schema.as_deref(), Some("s_x"))
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}
