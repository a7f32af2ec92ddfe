//! What every handler of the server shares: the store, the relay, the token, the metrics and
//! the page's history.

use std::sync::{Arc, Mutex};

use metrics_exporter_prometheus::PrometheusHandle;
use postbox::{Relay, Store};

use crate::auth::Token;
use crate::history::History;

/// A readiness check of the application's own ([`crate::AdminBuilder::ready_check`]): `Some`
/// reason while not ready.
pub(crate) type ReadyCheck = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// What every handler shares.
pub(crate) struct Shared {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) relay: Option<Relay>,
    pub(crate) token: Option<Token>,
    pub(crate) metrics: Option<PrometheusHandle>,
    pub(crate) history: Mutex<History>,
    pub(crate) ready_checks: Vec<ReadyCheck>,
}
