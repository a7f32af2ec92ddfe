//! Errors of building a sink: bad configuration, an unreachable broker.
//!
//! A configuration mistake is a [`ConfigError`] wherever it is found: checking a table, a route
//! or a key before anything connects, or building a sink ([`Error::Config`]). Errors of
//! publishing one event are [`postbox::PublishError`]s, classed retryable or permanent.

use crate::config::ConfigError;
use crate::template::TemplateError;

/// A boxed error from a broker client, kept as the source of an [`Error`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a sink could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A destination template could not be parsed.
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// A configuration value is invalid; the [`ConfigError`] names its key, e.g. `url`.
    #[error("invalid sink configuration: {0}")]
    Config(#[from] ConfigError),
    /// A sink of a routing configuration could not be opened; `sink` names its table.
    #[error("cannot start sink `sinks.{sink}`: {source}")]
    Open {
        /// The sink's name.
        sink: String,
        /// Why it could not be opened.
        #[source]
        source: Box<Error>,
    },
    /// The broker could not be reached, or refused the connection, when the sink was built.
    ///
    /// A sink that is running reconnects by itself; only the first connection is checked here,
    /// so that a wrong address or password shows at start-up.
    #[error("cannot connect to {broker} at {address}: {}", postbox::redact::redact(&.source.to_string()))]
    Connect {
        /// The kind of broker, e.g. `NATS`.
        broker: &'static str,
        /// The address tried (credentials removed).
        address: String,
        /// The client's error.
        #[source]
        source: BoxError,
    },
}

impl Error {
    #[allow(dead_code, reason = "used only by some sink features")]
    pub(crate) fn config(field: &'static str, reason: impl AsRef<str>) -> Self {
        Error::Config(ConfigError::new(field, reason))
    }

    #[allow(dead_code, reason = "used only by some sink features")]
    pub(crate) fn connect(
        broker: &'static str,
        address: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        Error::Connect {
            broker,
            address: address.into(),
            source: source.into(),
        }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
