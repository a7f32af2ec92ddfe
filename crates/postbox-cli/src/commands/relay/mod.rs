//! `postbox relay`: the daemon that publishes committed events — from one database here, from
//! several in [`many`], with what both share in [`parts`].

mod args;
mod many;
mod parts;

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, anyhow, bail};
use postbox::{PgStore, Relay, Store};
use postbox_cdc::{CdcConfig, CdcStore};
use tracing::info;

use parts::{
    EXIT_UNAVAILABLE, connect_waiting, describe, start_admin, stop_admin, stop_when, wait_migrated,
};

pub(crate) use args::{RelayArgs, RelayTuning};

use crate::config::{Config, RelaySource, show};
use crate::database::{Create, Database, Location, Pool};
use crate::shutdown::Shutdown;
use crate::sinks;

/// Runs the relay until a signal (or, with `--drain`, until the outbox is drained).
pub(crate) async fn run(config: &Config, args: &RelayArgs) -> anyhow::Result<ExitCode> {
    // Before anything else, so a signal during start-up is a graceful stop, not a kill.
    let shutdown = Shutdown::install()?;
    let create = if args.migrate {
        Create::IfMissing
    } else {
        Create::Never
    };
    let mut locations = config.locations()?;
    let cdc = config.source == RelaySource::Cdc;
    if cdc && args.drain {
        bail!("--drain finishes a backlog by polling: run it without --source cdc");
    }
    if cdc && locations.len() > 1 {
        bail!(
            "source = \"cdc\" reads one database's replication slot: run one relay per \
             database (or use source = \"poll\" for database_urls)"
        );
    }
    if locations.len() > 1 {
        return many::run(config, args, locations, create, shutdown).await;
    }
    let location = locations.pop().context("no database to serve")?;
    if cdc && !matches!(location, Location::Postgres(..)) {
        bail!(
            "source = \"cdc\" reads a PostgreSQL replication slot, and {location} is not \
             PostgreSQL: use source = \"poll\""
        );
    }
    let Some(db) = connect_waiting(&location, config, create, &shutdown).await? else {
        info!("stopped by a signal before the database answered");
        return Ok(ExitCode::SUCCESS);
    };
    if args.migrate {
        for migration in crate::commands::migrate::apply(&db).await? {
            info!(migration, "applied");
        }
    }

    // Checked when the configuration loaded; an error here would be a bug.
    let plan = sinks::plan(config).map_err(|e| anyhow!("invalid sink configuration: {e:?}"))?;
    let sink_description = describe(config, &plan);
    let opened = sinks::open(plan, Some(location.origin(&config.schema))).await?;
    let stdout_broken = opened.stdout.map(|s| s.broken());
    // The slot's publication needs the outbox table: a CDC relay waits for it first.
    if cdc && !wait_migrated(&db, &shutdown).await? {
        info!("stopped by a signal before the outbox tables were created");
        return Ok(ExitCode::SUCCESS);
    }
    let mut ready_checks: Vec<Box<dyn Fn() -> Option<String> + Send + Sync>> = Vec::new();
    let store: Arc<dyn Store> = if cdc {
        let store = cdc_store(&location, &db, config).await?;
        ready_checks.push(Box::new(store.stall_check()));
        Arc::new(store)
    } else {
        Arc::clone(&db.store)
    };
    let relay = Relay::from_parts(store, opened.sink, config.relay_config())?;
    // Before the migrations are checked, so that /readyz can say they are missing.
    let (admin_stop, admin_stopped) = tokio::sync::watch::channel(false);
    let admin = start_admin(config, &db, &relay, ready_checks, admin_stopped).await?;

    if args.drain {
        db.ensure_migrated().await?;
    } else if !wait_migrated(&db, &shutdown).await? {
        info!("stopped by a signal before the outbox tables were created");
        stop_admin(admin_stop, admin).await;
        return Ok(ExitCode::SUCCESS);
    }
    info!(
        relay = relay.id(),
        database = %db.location,
        sink = %sink_description,
        mode = if args.drain { "drain" } else { "run" },
        source = if cdc { "cdc" } else { "poll" },
        batch_size = config.batch_size,
        lease = %show(config.lease),
        poll_interval = %show(config.poll_interval),
        publish_timeout = %show(config.publish_timeout),
        "relay starting"
    );

    let (stop, mut broken_rx) = stop_when(&shutdown, stdout_broken);
    let result = if args.drain {
        let progress = drain_progress(&db, &relay).await;
        let result = relay.drain(stop).await;
        if let Some(progress) = progress {
            progress.abort();
        }
        result
    } else {
        relay.run(stop).await
    };
    stop_admin(admin_stop, admin).await;
    let stats = match result {
        Err(e @ postbox::Error::Unavailable { .. }) if args.drain => {
            eprintln!("error: drain gave up: {e}");
            return Ok(ExitCode::from(EXIT_UNAVAILABLE));
        }
        result => result?,
    };

    if let Some(error) = broken_rx.borrow_and_update().clone() {
        bail!(
            "stopped because stdout cannot be written ({error}); unacknowledged events stay in \
             the outbox for the next relay"
        );
    }
    if args.drain
        && let Some(signal) = shutdown.received()
    {
        bail!(
            "drain interrupted by {signal}: {} event(s) published; the rest stay in the outbox \
             for the next relay",
            stats.published
        );
    }
    info!(
        published = stats.published,
        failed_tries = stats.failed_tries,
        gave_up = stats.gave_up,
        recovered = stats.recovered,
        "relay finished"
    );
    Ok(ExitCode::SUCCESS)
}

/// The store of `--source cdc`: the PostgreSQL store reading its slot.
async fn cdc_store(
    location: &Location,
    db: &Database,
    config: &Config,
) -> anyhow::Result<postbox_cdc::CdcStore> {
    let (Location::Postgres(_, url), Pool::Postgres(pool)) = (location, &db.pool) else {
        bail!(
            "source = \"cdc\" reads a PostgreSQL replication slot, and {} is not PostgreSQL: \
             use source = \"poll\"",
            db.location
        );
    };
    let pg = PgStore::with_schema(pool.clone(), config.schema.clone());
    let cdc = CdcConfig::default()
        .slot(config.cdc_slot.as_str())
        .publication(config.cdc_publication.as_str())
        .claim(config.cdc_claim);
    let store = CdcStore::start(pg, url, cdc)
        .await
        .context("cannot start the CDC relay")?;
    info!(slot = %config.cdc_slot, publication = %config.cdc_publication, claim = config.cdc_claim,
        "relay source: cdc (the polling claim stays on as the safety net)");
    Ok(store)
}

/// A progress bar of the drain on a terminal (nothing when stderr is not one): events finished
/// (published or FAILED) of those outstanding at the start.
async fn drain_progress(db: &Database, relay: &Relay) -> Option<tokio::task::JoinHandle<()>> {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let mut total = 0;
    for target in db.targets(None).await.ok()? {
        if let Ok(counts) = db.store.status_counts(&target).await {
            total += u64::try_from(counts.pending + counts.processing).unwrap_or(0);
        }
    }
    let relay = relay.clone();
    Some(tokio::spawn(async move {
        let progress = crate::commands::progress::Progress::bounded("draining".to_owned(), total);
        loop {
            let stats = relay.stats();
            progress.set(stats.published + stats.gave_up);
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }))
}
