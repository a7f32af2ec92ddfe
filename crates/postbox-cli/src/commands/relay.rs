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

/// Runs the relay until a signal (or, with `--drain`, until the outbox is drained).
pub(crate) async fn run(config: &Config, args: &RelayArgs) -> anyhow::Result<ExitCode> {
    // Before anything else, so a signal during start-up is a graceful stop, not a kill.
    let shutdown = Shutdown::install()?;
    let create = if args.migrate {
        Create::IfMissing
    } else {
        Create::Never
    };
    let db = Database::connect(&config.location()?, config.schema_name()?, create).await?;
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
        relay.drain(stop).await?
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
