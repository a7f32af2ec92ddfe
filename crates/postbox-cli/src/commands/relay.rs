//! `postbox relay`: the daemon that publishes committed events.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, bail};
use postbox::{Relay, Sink};
use tracing::info;

use crate::cli::{RelayArgs, SinkKind};
use crate::config::{Config, show};
use crate::database::{Create, Database};
use crate::shutdown::Shutdown;
use crate::sinks::{NullSink, StdoutSink};

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

    let (sink, stdout_broken): (Arc<dyn Sink>, _) = match args.sink {
        SinkKind::Stdout => {
            let sink = StdoutSink::start().context("cannot start the stdout writer")?;
            let broken = sink.broken();
            (Arc::new(sink), Some(broken))
        }
        SinkKind::Null => (Arc::new(NullSink), None),
    };
    let relay = Relay::from_parts(Arc::clone(&db.store), sink, config.relay_config())?;
    info!(
        relay = relay.id(),
        database = %db.location,
        sink = %format!("{:?}", args.sink).to_lowercase(),
        mode = if args.drain { "drain" } else { "run" },
        batch_size = config.batch_size,
        lease = %show(config.lease),
        poll_interval = %show(config.poll_interval),
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
