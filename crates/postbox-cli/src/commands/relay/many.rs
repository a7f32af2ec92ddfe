//! `postbox relay` over several databases (`database_urls`): one relay per database, each with
//! its own connections and loop, sharing the sinks. A database that cannot be reached, is not
//! migrated or fails is retried on its own, with the reason logged; the others go on.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail};
use postbox::{Relay, Sink, relay::RelayStats};
use tokio::sync::watch;
use tracing::{error, info, warn};

use super::args::RelayArgs;
use super::parts::{
    EXIT_UNAVAILABLE, connect_waiting, describe, start_admin, stop_admin, stop_when, wait_migrated,
};
use crate::config::Config;
use crate::database::{Create, Location};
use crate::shutdown::Shutdown;
use crate::sinks;

/// How long a database whose relay failed waits before it is served again.
const RETRY_AFTER: Duration = Duration::from_secs(10);

/// Serves every database of `locations` until a signal (or, with `--drain`, until each is
/// drained).
pub(super) async fn run(
    config: &Config,
    args: &RelayArgs,
    locations: Vec<Location>,
    create: Create,
    shutdown: Shutdown,
) -> anyhow::Result<ExitCode> {
    if config.admin_listen.is_some() {
        bail!(
            "the admin server (admin_listen) serves one database, and database_urls lists {}: \
             run one relay with admin_listen per database, or leave admin_listen out",
            locations.len()
        );
    }
    let plan = sinks::plan(config).map_err(|e| anyhow!("invalid sink configuration: {e:?}"))?;
    let sink_description = describe(config, &plan);
    let opened = sinks::open(plan, None).await?;
    // One stop for every database: a signal, or stdout that can no longer be written.
    let (stop_tx, stop_rx) = watch::channel(false);
    let (stop, broken_rx) = stop_when(&shutdown, opened.stdout.map(|s| s.broken()));
    tokio::spawn(async move {
        stop.await;
        stop_tx.send_replace(true);
    });
    info!(
        databases = locations.len(),
        sink = %sink_description,
        mode = if args.drain { "drain" } else { "run" },
        "relay starting over several databases"
    );
    let tasks: Vec<_> = locations
        .into_iter()
        .map(|location| {
            let shard = Shard {
                config: config.clone(),
                location,
                create,
                migrate: args.migrate,
                drain: args.drain,
                sink: Arc::clone(&opened.sink),
                shutdown: shutdown.clone(),
                stop: stop_rx.clone(),
            };
            let shown = shard.location.to_string();
            (shown, tokio::spawn(shard.serve()))
        })
        .collect();
    let mut failed = Vec::new();
    let mut unavailable = false;
    let mut published = 0;
    for (database, task) in tasks {
        match task.await {
            Ok(Ok(stats)) => {
                published += stats.published;
                info!(
                    database,
                    published = stats.published,
                    failed_tries = stats.failed_tries,
                    gave_up = stats.gave_up,
                    recovered = stats.recovered,
                    "database finished"
                );
            }
            Ok(Err(e)) => {
                unavailable |= matches!(
                    e.downcast_ref::<postbox::Error>(),
                    Some(postbox::Error::Unavailable { .. })
                );
                error!(database, error = %format!("{e:#}"), "database failed");
                failed.push(format!("{database}: {e:#}"));
            }
            Err(e) => {
                error!(database, error = %e, "database task failed");
                failed.push(format!("{database}: {e}"));
            }
        }
    }
    if let Some(error) = broken_rx.borrow().clone() {
        bail!(
            "stopped because stdout cannot be written ({error}); unacknowledged events stay in \
             the outbox for the next relay"
        );
    }
    if args.drain
        && let Some(signal) = shutdown.received()
    {
        bail!(
            "drain interrupted by {signal}: {published} event(s) published; the rest stay in \
             the outboxes for the next relay"
        );
    }
    if !failed.is_empty() {
        eprintln!("error: {} database(s) were not drained:", failed.len());
        for f in &failed {
            eprintln!("  {f}");
        }
        return Ok(ExitCode::from(if unavailable {
            EXIT_UNAVAILABLE
        } else {
            1
        }));
    }
    info!(published, "relay finished");
    Ok(ExitCode::SUCCESS)
}

/// One database's relay.
struct Shard {
    config: Config,
    location: Location,
    create: Create,
    migrate: bool,
    drain: bool,
    sink: Arc<dyn Sink>,
    shutdown: Shutdown,
    stop: watch::Receiver<bool>,
}

impl Shard {
    /// Serves the database until the stop: connects (waiting while it is down), migrates if
    /// asked, and runs its relay; in run mode, anything that fails is logged and tried again
    /// after a pause, so one database never stops the others. A drain returns its error.
    async fn serve(self) -> anyhow::Result<RelayStats> {
        let mut total = RelayStats::default();
        loop {
            if *self.stop.borrow() {
                return Ok(total);
            }
            match self.serve_once().await {
                Ok(stats) => {
                    total.published += stats.published;
                    total.failed_tries += stats.failed_tries;
                    total.gave_up += stats.gave_up;
                    total.recovered += stats.recovered;
                    return Ok(total);
                }
                Err(e) if self.drain => return Err(e),
                Err(e) => {
                    warn!(database = %self.location, error = %format!("{e:#}"),
                        retry_in = ?RETRY_AFTER,
                        "this database is not served for now; the others go on");
                    let mut stop = self.stop.clone();
                    tokio::select! {
                        () = tokio::time::sleep(RETRY_AFTER) => {}
                        _ = stop.wait_for(|s| *s) => return Ok(total),
                    }
                }
            }
        }
    }

    async fn serve_once(&self) -> anyhow::Result<RelayStats> {
        let connect = connect_waiting(&self.location, &self.config, self.create, &self.shutdown);
        let connected = if self.drain {
            // A drain does not wait for a database that stays down longer than its patience.
            tokio::time::timeout(self.config.drain_patience, connect)
                .await
                .map_err(|_| {
                    anyhow!(
                        "the database did not answer within drain_patience ({}); its events \
                         stay in its outbox",
                        crate::config::show(self.config.drain_patience)
                    )
                })??
        } else {
            connect.await?
        };
        let Some(db) = connected else {
            return Ok(RelayStats::default());
        };
        if self.migrate {
            for migration in crate::commands::migrate::apply(&db).await? {
                info!(database = %db.location, migration, "applied");
            }
        }
        if self.drain {
            db.ensure_migrated().await?;
        } else if !wait_migrated(&db, &self.shutdown).await? {
            return Ok(RelayStats::default());
        }
        let relay = Relay::from_parts(
            Arc::clone(&db.store),
            Arc::clone(&self.sink),
            self.config.relay_config(),
        )?;
        // Alerts only (admin_listen is refused with several databases).
        let (admin_stop, admin_stopped) = watch::channel(false);
        let admin = start_admin(&self.config, &db, &relay, Vec::new(), admin_stopped).await?;
        info!(relay = relay.id(), database = %db.location, "serving database");
        let mut stop = self.stop.clone();
        let stop = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        let result = if self.drain {
            relay.drain(stop).await
        } else {
            relay.run(stop).await
        };
        stop_admin(admin_stop, admin).await;
        Ok(result?)
    }
}
