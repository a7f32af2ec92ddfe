//! What every kind of sink's configuration offers ([`SinkSettings`], implemented once per sink
//! module), and the pieces those modules share: secrets, `%XX` decoding, the default publish
//! timeout. The [`SinkConfig`](crate::SinkConfig) enum that dispatches over every kind lives in
//! `config/`, which depends on the sink modules; they depend on this module only.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use postbox::redact::redact;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::error::ConfigError;
use crate::open::Shared;
use crate::{Result, RoutableSink, Template};

/// The publish timeout a sink gets when none is configured: the sinks' default (5 s), but at
/// most four fifths of the relay's `publish_timeout`, so that the sink gives up (with its own,
/// more telling error) before the relay does.
pub fn default_publish_timeout(relay_publish_timeout: Duration) -> Duration {
    crate::defaults::publish_timeout().min(relay_publish_timeout * 4 / 5)
}

/// What the configuration of one kind of sink offers. Each sink module implements it once; the
/// [`SinkConfig`](crate::SinkConfig) enum dispatches to it.
#[async_trait]
pub trait SinkSettings: Clone + fmt::Debug + Send + Sync + 'static {
    /// The key of the sink's own destination in its table (`subject`, `routing_key`, `topic`,
    /// `stream`, `url`); `None` for a sink that takes no destination (stdout, null).
    const DESTINATION_KEY: Option<&'static str>;
    /// What the destination is called in messages: `subject`, `routing key`, `URL`, …
    const DESTINATION_NAME: &'static str = "destination";
    /// A destination to show in messages, e.g. `billing.{aggregate_type}.{event_type}`.
    const EXAMPLE_DESTINATION: &'static str = "billing.{aggregate_type}.{event_type}";

    /// Turns the table's `url` (every kind takes one) into this kind's own keys before the table
    /// is deserialized, e.g. MQTT's `host` and `port`. By default `url` is a key of the kind's
    /// own. Errors say what is wrong with the table.
    fn read_url(_table: &mut Map<String, Value>) -> std::result::Result<(), ConfigError> {
        Ok(())
    }

    /// Settles what deserializing cannot check, e.g. credentials moved out of a URL.
    fn settle(&mut self) -> std::result::Result<(), ConfigError> {
        Ok(())
    }

    /// Where the sink publishes, for logs and `postbox config`: never a password or secret.
    fn address(&self) -> String;

    /// The sink's own destination template, if it has one.
    fn destination(&self) -> Option<&Template>;

    /// Checks a route's destination template (its `topic`) for this sink.
    fn check_destination(&self, _destination: &Template) -> std::result::Result<(), ConfigError> {
        Ok(())
    }

    /// How long one publish may take; `None` for a sink that bounds nothing.
    fn publish_timeout(&self) -> Option<Duration>;

    /// Sets how long one publish may take.
    fn set_publish_timeout(&mut self, _timeout: Duration) {}

    /// The longest wait between connection attempts, for a sink that connects to a broker;
    /// `None` for one that has nothing to connect to first.
    fn reconnect_max_delay(&self) -> Option<Duration> {
        None
    }

    /// Opens the sink. A broker that cannot be reached fails with [`crate::Error::Connect`]
    /// (the caller keeps trying in the background, see [`SinkConfig::open`](crate::SinkConfig::open)); any other error
    /// is a configuration mistake.
    async fn connect(&self, shared: &Shared) -> Result<Arc<dyn RoutableSink>>;
}

/// Decodes `%XX` escapes (a password with `@` or `:` is written `%40`, `%3A` in a URL).
#[allow(dead_code, reason = "used only by some sink features")]
pub(crate) fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied().and_then(hex),
            bytes.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(high), Some(low)) => {
                // Two hex digits make a byte.
                out.push(u8::try_from(high * 16 + low).unwrap_or(b'?'));
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A secret setting (a password, a token, a signing key): it deserializes from a string, shows
/// as `***` in `Debug`, and gives itself up only through [`Secret::expose`].
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// A secret holding `value`.
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The secret itself: for the broker or the signature, never for logs.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"***\"")
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Secret {
        Secret(value.to_owned())
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Secret {
        Secret(value)
    }
}

/// The `Debug` of a map whose values may be secrets (client properties): the values of keys
/// that look secret hidden, the others cleaned of passwords in URLs.
#[allow(dead_code, reason = "used only by some sink features")]
pub(crate) fn debug_map(map: &BTreeMap<String, String>) -> BTreeMap<&str, String> {
    map.iter()
        .map(|(k, v)| {
            let shown = if postbox::redact::is_secret_key(k) {
                postbox::redact::MASK.to_owned()
            } else {
                redact(v)
            };
            (k.as_str(), shown)
        })
        .collect()
}
