//! Errors of building a sink: bad configuration, an unreachable broker.
//!
//! A configuration mistake is a [`ConfigError`] wherever it is found: checking a table, a route
//! or a key before anything connects, or building a sink ([`Error::Config`]). Errors of
//! publishing one event are [`postbox::PublishError`]s, classed retryable or permanent.

use postbox::redact::redact;

use crate::template::TemplateError;

/// A configuration mistake: `at` names where it is, `message` what is wrong. It shows as
/// `at: message` (just `message` when `at` is empty).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.shown())]
pub struct ConfigError {
    /// Where the mistake is. From a sink's table ([`SinkConfig::from_table`](crate::SinkConfig::from_table)): the key (`kind`,
    /// `url`, `publish_timeout`), or empty when it is the table as a whole (not a table, an
    /// unknown key). From [`SinkConfig::from_single`](crate::SinkConfig::from_single): the single-sink key (`sink_url`,
    /// `topic`, …). From a routing configuration ([`crate::RoutingConfig::check`]): the table
    /// or rule (`sinks.billing`, `routes[2]`, `routing.default_route`, `routing`).
    pub at: String,
    /// What is wrong, and what to do; secrets in it are hidden.
    pub message: String,
}

impl ConfigError {
    pub(crate) fn new(at: impl Into<String>, message: impl AsRef<str>) -> ConfigError {
        ConfigError {
            at: at.into(),
            message: redact(message.as_ref()),
        }
    }

    /// The same mistake, placed in the table or rule `at`: the key it named becomes part of
    /// the message (`sinks.billing: url: …`).
    pub(crate) fn within(self, at: impl Into<String>) -> ConfigError {
        ConfigError {
            message: self.shown(),
            at: at.into(),
        }
    }

    fn shown(&self) -> String {
        if self.at.is_empty() {
            self.message.clone()
        } else {
            format!("{}: {}", self.at, self.message)
        }
    }
}

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
