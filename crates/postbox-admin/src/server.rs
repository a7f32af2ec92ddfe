//! The admin server: one port, public probes and metrics, everything else behind the token.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::routing::{get, post};
use metrics_exporter_prometheus::PrometheusHandle;
use postbox::{Relay, Store};
use tokio::net::TcpListener;
use tracing::{info, warn};

use crate::alerts::Alerts;
use crate::auth::{Token, require_token};
use crate::error::AdminError;
use crate::history::History;
use crate::monitor;
use crate::state::Shared;
use crate::{api, health, page};

/// How often the backlog gauges, the page's history and the alert checks are refreshed.
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(5);

/// Largest request body the API reads (its bodies are short JSON objects).
const BODY_LIMIT: usize = 64 * 1024;

/// Builds an [`Admin`] server; see the [crate] example.
pub struct AdminBuilder {
    store: Arc<dyn Store>,
    relay: Option<Relay>,
    token: Option<Token>,
    metrics: Option<PrometheusHandle>,
    alerts: Option<Alerts>,
    refresh: Duration,
    ready_checks: Vec<crate::state::ReadyCheck>,
}

impl AdminBuilder {
    /// The relay this server reports on (its sinks, its throughput) and whose `FAILED` events
    /// it alerts on. Without one, the server still serves the database's side.
    pub fn relay(mut self, relay: Relay) -> Self {
        self.relay = Some(relay);
        self
    }

    /// The token `/api` requires. Without one the API answers 401 to everyone, and the server
    /// refuses a non-loopback address.
    pub fn token(mut self, token: Token) -> Self {
        self.token = Some(token);
        self
    }

    /// Serves `/metrics` from this recorder ([`install_metrics`](crate::install_metrics));
    /// without one, `/metrics` is 404.
    pub fn metrics(mut self, handle: PrometheusHandle) -> Self {
        self.metrics = Some(handle);
        self
    }

    /// Sends these alerts (see [`alerts`](crate::alerts)).
    pub fn alerts(mut self, alerts: Alerts) -> Self {
        self.alerts = Some(alerts);
        self
    }

    /// A readiness check of the application's own: while it answers `Some(reason)`, `/readyz`
    /// answers 503 with the reason among the others (a CDC relay's stalled slot, say:
    /// `postbox_cdc::CdcStore::stall_check`).
    ///
    /// ```no_run
    /// # fn example(store: std::sync::Arc<dyn postbox::Store>) {
    /// let paused = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    /// let flag = std::sync::Arc::clone(&paused);
    /// let admin = postbox_admin::Admin::builder(store).ready_check(move || {
    ///     flag.load(std::sync::atomic::Ordering::Relaxed).then(|| "paused by hand".to_owned())
    /// });
    /// # let _ = admin; }
    /// ```
    pub fn ready_check(
        mut self,
        check: impl Fn() -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.ready_checks.push(Arc::new(check));
        self
    }

    /// How often gauges, history and alert checks refresh ([`DEFAULT_REFRESH`]).
    pub fn refresh(mut self, every: Duration) -> Self {
        self.refresh = every.max(Duration::from_millis(100));
        self
    }

    /// Runs the gauges and the alerts without serving HTTP, until `shutdown` completes: for a
    /// relay that sends alerts but opens no port.
    pub async fn run_without_server(self, shutdown: impl Future<Output = ()> + Send) {
        let shared = Arc::new(Shared {
            store: self.store,
            relay: self.relay,
            token: None,
            metrics: self.metrics,
            history: Mutex::new(History::default()),
            ready_checks: self.ready_checks.clone(),
        });
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let monitor = tokio::spawn(monitor::run(shared, self.alerts, self.refresh, stop_rx));
        shutdown.await;
        let _ = stop_tx.send(true);
        let _ = monitor.await;
    }

    /// The server's routes alone, without a port and without the monitor (gauges, the page's
    /// history, alerts): to mount in an application's own axum server, or to call in a test
    /// with `tower::ServiceExt::oneshot`. The token rules are those of [`bind`](Self::bind)'s
    /// server: without a token every `/api` route answers 401.
    ///
    /// ```no_run
    /// # async fn example(
    /// #     store: std::sync::Arc<dyn postbox::Store>,
    /// # ) -> Result<(), Box<dyn std::error::Error>> {
    /// let token = postbox_admin::Token::new("a-long-random-token-0123")?;
    /// let admin = postbox_admin::Admin::builder(store).token(token).into_router();
    /// let app = axum::Router::new().nest("/outbox", admin);
    /// # let _ = app;
    /// # Ok(()) }
    /// ```
    pub fn into_router(self) -> Router {
        router(Arc::new(Shared {
            store: self.store,
            relay: self.relay,
            token: self.token,
            metrics: self.metrics,
            history: Mutex::new(History::default()),
            ready_checks: self.ready_checks.clone(),
        }))
    }

    /// Binds `addr`. Fails if it cannot, or if it is not a loopback address and no token is
    /// set.
    pub async fn bind(self, addr: SocketAddr) -> Result<Admin, AdminError> {
        if !addr.ip().is_loopback() && self.token.is_none() {
            return Err(AdminError::NoToken(addr));
        }
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| AdminError::Bind { addr, source })?;
        let local_addr = listener
            .local_addr()
            .map_err(|source| AdminError::Bind { addr, source })?;
        if self.token.is_none() {
            warn!(%local_addr, "admin API without a token: /api answers 401; set POSTBOX_ADMIN_TOKEN to use it");
        }
        Ok(Admin {
            listener,
            local_addr,
            shared: Arc::new(Shared {
                store: self.store,
                relay: self.relay,
                token: self.token,
                metrics: self.metrics,
                history: Mutex::new(History::default()),
                ready_checks: self.ready_checks.clone(),
            }),
            alerts: self.alerts,
            refresh: self.refresh,
        })
    }
}

/// The admin server, bound and ready to [`serve`](Admin::serve).
pub struct Admin {
    listener: TcpListener,
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    alerts: Option<Alerts>,
    refresh: Duration,
}

impl Admin {
    /// A builder over the store whose events the server shows.
    pub fn builder(store: Arc<dyn Store>) -> AdminBuilder {
        AdminBuilder {
            store,
            relay: None,
            token: None,
            metrics: None,
            alerts: None,
            refresh: DEFAULT_REFRESH,
            ready_checks: Vec::new(),
        }
    }

    /// The address bound (with the port the system chose for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Serves until `shutdown` completes; the monitor (gauges, history, alerts) runs beside.
    pub async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), AdminError> {
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let monitor = tokio::spawn(monitor::run(
            Arc::clone(&self.shared),
            self.alerts,
            self.refresh,
            stop_rx,
        ));
        info!(addr = %self.local_addr, "admin server listening");
        let served = axum::serve(self.listener, router(Arc::clone(&self.shared)))
            .with_graceful_shutdown(shutdown)
            .await;
        let _ = stop_tx.send(true);
        let _ = monitor.await;
        served.map_err(AdminError::Serve)
    }
}

/// Every route. Probes and metrics are public; the page shows data only to a signed-in session
/// (else its sign-in form); the API and every unknown path need the token, so a caller without
/// it learns nothing of what exists.
pub(crate) fn router(shared: Arc<Shared>) -> Router {
    let private = Router::new()
        .route("/api/status", get(api::status))
        .route("/api/events", get(api::list_events))
        .route("/api/events/retry", post(api::retry_events))
        .route("/api/events/{id}", get(api::show_event))
        .route("/api/events/{id}/retry", post(api::retry_event))
        .route("/api/events/{id}/skip", post(api::skip_event))
        .route("/api/replay", post(api::replay))
        .route("/api/tenants", get(api::tenants))
        .route("/api/tenants/{id}/suspend", post(api::suspend_tenant))
        .route("/api/tenants/{id}/resume", post(api::resume_tenant))
        .fallback(api::not_found)
        .layer(middleware::from_fn_with_state(
            shared.token.clone(),
            require_token,
        ))
        .layer(DefaultBodyLimit::max(BODY_LIMIT));
    Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(health::metrics))
        .route("/", get(page::index))
        .route("/app.js", get(page::script))
        .route("/login", post(page::login))
        .route("/logout", post(page::logout))
        .route("/retry", post(page::retry))
        .merge(private)
        .with_state(shared)
}
