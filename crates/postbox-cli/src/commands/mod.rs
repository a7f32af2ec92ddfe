//! One module per subcommand; [`run`] loads the configuration, starts logging and dispatches.

mod archive;
#[cfg(feature = "bench")]
mod bench;
mod demo;
mod effective_config;
mod events;
mod filter;
mod migrate;
mod progress;
mod purge;
mod relay;
mod replay;
mod retry;
mod status;
mod tenants;

use std::process::ExitCode;

pub(crate) use archive::ArchiveArgs;
#[cfg(feature = "bench")]
pub(crate) use bench::BenchArgs;
pub(crate) use demo::DemoArgs;
pub(crate) use effective_config::ConfigArgs;
pub(crate) use events::EventsCommand;
pub(crate) use migrate::MigrateArgs;
pub(crate) use purge::PurgeArgs;
pub(crate) use relay::RelayArgs;
pub(crate) use replay::ReplayArgs;
pub(crate) use retry::RetryArgs;
pub(crate) use status::StatusArgs;
pub(crate) use tenants::TenantsCommand;

use crate::cli::{Cli, Command};
use crate::config::{self, Config};
use crate::logging;

/// Runs the command line's subcommand.
pub(crate) async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let defaults = match cli.command {
        Command::Demo(_) => demo::defaults(),
        #[cfg(feature = "bench")]
        Command::Bench(_) => bench::defaults(),
        _ => Config::default(),
    };
    let loaded = config::load(defaults, cli.global.config.as_deref(), &cli.overrides())?;
    crate::sinks::check(&loaded)?;
    let filter = logging::filter(cli.global.log_level.as_deref(), &loaded.config.log_level);
    logging::init(&filter, loaded.config.log_format)?;
    match &cli.command {
        Command::Migrate(_) => migrate::run(&loaded.config).await,
        Command::Relay(args) => relay::run(&loaded.config, args).await,
        Command::Status(args) => status::run(&loaded.config, args).await,
        Command::Retry(args) => retry::run(&loaded.config, args).await,
        Command::Events(command) => events::run(&loaded.config, command).await,
        Command::Replay(args) => replay::run(&loaded.config, args).await,
        Command::Archive(args) => archive::run(&loaded.config, args).await,
        Command::Purge(args) => purge::run(&loaded.config, args).await,
        Command::Tenants(command) => tenants::run(&loaded.config, command).await,
        Command::Demo(args) => {
            demo::run(&loaded.config, cli.global.database_url.as_deref(), args).await
        }
        #[cfg(feature = "bench")]
        Command::Bench(args) => bench::run(&loaded.config, args).await,
        Command::Config(a) => effective_config::run(&loaded, a.event_type.as_deref()),
    }
}
