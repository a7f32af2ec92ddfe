//! What running one relay and running one per database (`database_urls`) share: connecting and
//! waiting for the database and its tables, the admin server, what stops a relay, and the
//! start-up description of the sinks.

use std::sync::Arc;

use anyhow::Context;
use postbox::Relay;
use tracing::{info, warn};

use crate::config::{Config, SinkKind};
use crate::database::{Create, Database};
use crate::shutdown::Shutdown;
use crate::sinks::SinkPlan;

/// The exit status of a drain that gave up on destinations that stayed down.
pub(super) const EXIT_UNAVAILABLE: u8 = 3;

/// What stops a relay: a signal, or stdout (of the stdout sink) that can no longer be written —
/// whose error the receiver then holds.
pub(super) fn stop_when(
    shutdown: &Shutdown,
    stdout_broken: Option<impl Future<Output = String> + Send + 'static>,
) -> (
    impl Future<Output = ()> + Send + 'static,
    tokio::sync::watch::Receiver<Option<String>>,
) {
    let (broken_tx, broken_rx) = tokio::sync::watch::channel(None::<String>);
    let requested = shutdown.requested();
    let stop = async move {
        match stdout_broken {
            Some(broken) => tokio::select! {
                () = requested => {}
                error = broken => { broken_tx.send_replace(Some(error)); }
            },
            None => requested.await,
        }
    };
    (stop, broken_rx)
}

/// The admin server (metrics, probes, API, page) when `admin_listen` is set, or only the
/// alerts when `alert_webhook` is; it runs until `stopped` turns true. Failing to bind stops
/// the relay: it must not run without the endpoints it was asked for. `/readyz` also asks
/// `ready_checks` (a CDC relay's stalled slot).
pub(super) async fn start_admin(
    config: &Config,
    db: &Database,
    relay: &Relay,
    ready_checks: Vec<Box<dyn Fn() -> Option<String> + Send + Sync>>,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<Option<tokio::task::JoinHandle<anyhow::Result<()>>>> {
    use postbox_admin::{Admin, Token};
    if config.admin_listen.is_none() && config.alert_webhook.is_none() {
        return Ok(None);
    }
    let stop = async move {
        let _ = stopped.wait_for(|stop| *stop).await;
    };
    let mut builder = Admin::builder(Arc::clone(&db.store)).relay(relay.clone());
    for check in ready_checks {
        builder = builder.ready_check(check);
    }
    if config.alert_webhook.is_some() || config.admin_listen.is_some() {
        let alerts = postbox_admin::alerts::Alerts::new(config.alert_config())
            .context("invalid alert configuration")?;
        builder = builder.alerts(alerts);
    }
    let Some(addr) = config.admin_listen else {
        return Ok(Some(tokio::spawn(async move {
            builder.run_without_server(stop).await;
            Ok(())
        })));
    };
    builder = builder.metrics(postbox_admin::install_metrics()?);
    if let Some(token) = &config.admin_token {
        builder = builder.token(Token::new(token.expose()).context("admin_token")?);
    }
    let admin = builder
        .bind(addr)
        .await
        .context("cannot start the admin server (admin_listen)")?;
    info!(addr = %admin.local_addr(), "admin server: /metrics /healthz /readyz /api /");
    Ok(Some(tokio::spawn(async move {
        admin.serve(stop).await.map_err(anyhow::Error::new)
    })))
}

/// Stops the admin server after the relay.
pub(super) async fn stop_admin(
    stop: tokio::sync::watch::Sender<bool>,
    admin: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
) {
    let _ = stop.send(true);
    if let Some(admin) = admin {
        match admin.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(error = %format!("{e:#}"), "admin server failed"),
            Err(e) => warn!(error = %e, "admin server task failed"),
        }
    }
}

/// Waits until the outbox tables exist (a relay deployed beside its first migration), saying
/// every 30 s what to run; `false` when a signal came first. Other errors stop the relay.
pub(super) async fn wait_migrated(db: &Database, shutdown: &Shutdown) -> anyhow::Result<bool> {
    let mut said = None::<tokio::time::Instant>;
    loop {
        match db.migrated().await {
            Ok(_) => return Ok(true),
            Err(postbox::Error::NotMigrated { schema }) => {
                if said.is_none_or(|t| t.elapsed() >= std::time::Duration::from_secs(30)) {
                    warn!(database = %db.location, schema,
                        "the outbox tables do not exist yet; waiting for them: run `postbox migrate` (or start the relay with --migrate)");
                    said = Some(tokio::time::Instant::now());
                }
                tokio::select! {
                    () = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                    () = shutdown.requested() => return Ok(false),
                }
            }
            Err(e) => {
                return Err(anyhow::Error::new(e)
                    .context(format!("cannot read the outbox in {}", db.location)));
            }
        }
    }
}

/// Connects to the database, waiting while it is not up yet (a relay started before its
/// database, or while it restarts), as relays wait for their brokers; `None` when a signal came
/// first. Only what a wait can cure is waited for: refused or reset connections, a server
/// starting up or shutting down. Anything else (authentication, no such database, a bad URL)
/// stops the relay at once.
pub(super) async fn connect_waiting(
    location: &crate::database::Location,
    config: &Config,
    create: Create,
    shutdown: &Shutdown,
) -> anyhow::Result<Option<Database>> {
    let schema = config.schema.clone();
    let mut waits = postbox::backoff::Backoff {
        base: std::time::Duration::from_millis(250),
        cap: std::time::Duration::from_secs(5),
    }
    .attempts();
    loop {
        match Database::connect(location, schema.clone(), create).await {
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
pub(super) fn describe(config: &Config, plan: &SinkPlan) -> String {
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
