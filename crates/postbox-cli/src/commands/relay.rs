//! `postbox relay`: the daemon that publishes committed events.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{anyhow, bail};
use postbox::Relay;
use tracing::{info, warn};

use crate::cli::RelayArgs;
use crate::config::{Config, SinkKind, show};
use crate::database::{Create, Database};
use crate::shutdown::Shutdown;
use crate::sinks::{self, SinkPlan};

/// The exit status of a drain that gave up on destinations that stayed down.
const EXIT_UNAVAILABLE: u8 = 3;

/// Runs the relay until a signal (or, with `--drain`, until the outbox is drained).
pub(crate) async fn run(config: &Config, args: &RelayArgs) -> anyhow::Result<ExitCode> {
    // Before anything else, so a signal during start-up is a graceful stop, not a kill.
    let shutdown = Shutdown::install()?;
    let create = if args.migrate {
        Create::IfMissing
    } else {
        Create::Never
    };
    let Some(db) = connect_waiting(config, create, &shutdown).await? else {
        info!("stopped by a signal before the database answered");
        return Ok(ExitCode::SUCCESS);
    };
    if args.migrate {
        for migration in super::migrate::apply(&db).await? {
            info!(migration, "applied");
        }
    }
    db.ensure_migrated().await?;

    // Checked when the configuration loaded; an error here would be a bug.
    let plan = sinks::plan(config).map_err(|e| anyhow!("invalid sink configuration: {e:?}"))?;
    let sink_description = describe(config, &plan);
    let opened = sinks::open(plan).await?;
    let stdout_broken = opened.stdout.map(|s| s.broken());
    let relay = Relay::from_parts(Arc::clone(&db.store), opened.sink, config.relay_config())?;
    info!(
        relay = relay.id(),
        database = %db.location,
        sink = %sink_description,
        mode = if args.drain { "drain" } else { "run" },
        batch_size = config.batch_size,
        lease = %show(config.lease),
        poll_interval = %show(config.poll_interval),
        publish_timeout = %show(config.publish_timeout),
        "relay starting"
    );

    let (broken_tx, mut broken_rx) = tokio::sync::watch::channel(None::<String>);
    let stop = {
        let requested = shutdown.requested();
        async move {
            match stdout_broken {
                Some(broken) => tokio::select! {
                    () = requested => {}
                    error = broken => { broken_tx.send_replace(Some(error)); }
                },
                None => requested.await,
            }
        }
    };
    let stats = if args.drain {
        match relay.drain(stop).await {
            Err(e @ postbox::Error::Unavailable { .. }) => {
                eprintln!("error: drain gave up: {e}");
                return Ok(ExitCode::from(EXIT_UNAVAILABLE));
            }
            result => result?,
        }
    } else {
        relay.run(stop).await?
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

/// Connects to the database, waiting while it is not up yet (a relay started before its
/// database, or while it restarts), as relays wait for their brokers; `None` when a signal came
/// first. Only what a wait can cure is waited for: refused or reset connections, a server
/// starting up or shutting down. Anything else (authentication, no such database, a bad URL)
/// stops the relay at once.
async fn connect_waiting(
    config: &Config,
    create: Create,
    shutdown: &Shutdown,
) -> anyhow::Result<Option<Database>> {
    let location = config.location()?;
    let schema = config.schema_name()?;
    let mut waits = postbox::Backoff {
        base: std::time::Duration::from_millis(250),
        cap: std::time::Duration::from_secs(5),
    }
    .attempts();
    loop {
        match Database::connect(&location, schema.clone(), create).await {
            Ok(db) => return Ok(Some(db)),
            Err(e) if database_not_up(&e) => {
                let wait = waits.next_delay();
                warn!(database = %location, error = %crate::describe(&e), retry_in = ?wait,
                    "the database does not answer yet; waiting for it");
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = shutdown.requested() => return Ok(None),
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// Whether connecting failed because the database is not up (yet): worth waiting for.
fn database_not_up(error: &anyhow::Error) -> bool {
    error
        .chain()
        .any(|cause| match cause.downcast_ref::<sqlx::Error>() {
            Some(sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut) => true,
            // cannot_connect_now (starting up), admin_shutdown, crash_shutdown
            Some(sqlx::Error::Database(db)) => {
                matches!(db.code().as_deref(), Some("57P03" | "57P01" | "57P02"))
            }
            _ => false,
        })
}

/// The sink for the start-up log (addresses without passwords, never secrets); logs the routes.
fn describe(config: &Config, plan: &SinkPlan) -> String {
    match plan {
        SinkPlan::Single(spec) => {
            if !config.routes.is_empty() {
                info!(
                    routes = config.routes.len(),
                    "--sink given: the [[routes]] of the configuration are not used"
                );
            }
            let mut text = spec.kind().to_string();
            let address = spec.address();
            if !address.is_empty() {
                text.push_str(&format!(" {address}"));
            }
            // The webhook's URL is its address, shown above without its password.
            if let Some(topic) = spec
                .own_destination()
                .filter(|_| spec.kind() != SinkKind::Webhook)
            {
                text.push_str(&format!(" topic {:?}", topic.as_str()));
            }
            text
        }
        SinkPlan::Routed(routed) => {
            for (name, spec) in &routed.sinks {
                info!(sink = %name, kind = %spec.kind(), address = %spec.address(), "sink");
            }
            for name in &routed.unused {
                warn!(sink = %name, "sink defined but used by no route; not opened");
            }
            for route in routed.routes.iter().chain(&routed.default_route) {
                info!(
                    route = %route.label,
                    event_type = route.event_type.as_ref().map_or("*", |g| g.as_str()),
                    aggregate_type = route.aggregate_type.as_ref().map_or("(any)", |g| g.as_str()),
                    sink = %route.sink,
                    topic = %route.shown_topic(),
                    "route"
                );
            }
            let unmatched = if routed.default_route.is_some() {
                "default route"
            } else {
                "fail"
            };
            format!(
                "{} routes to {} sinks, unmatched: {unmatched}",
                routed.routes.len(),
                routed.sinks.len()
            )
        }
    }
}
