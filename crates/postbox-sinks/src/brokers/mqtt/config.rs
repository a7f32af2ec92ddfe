//! The MQTT sink's configuration: [`MqttConfig`], its defaults and the client options it makes,
//! and the broker address of `url` (`mqtt://[user[:password]@]host[:port]`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use rumqttc::v5::MqttOptions;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::MqttSink;
use crate::cloudevents::{CloudEventsConfig, Format};
use crate::error::ConfigError;
use crate::settings::{Secret, SinkSettings, percent_decode};
use crate::{Error, Result, RoutableSink, Template, defaults};

/// Configuration of an [`MqttSink`].
///
/// ```
/// let config: postbox_sinks::MqttConfig = serde_json::from_value(serde_json::json!({
///     "host": "127.0.0.1",
///     "port": 1883,
///     "topic": "billing/{aggregate_type}/{event_type}",
/// })).unwrap();
/// assert_eq!(config.max_inflight, 100);
/// ```
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct MqttConfig {
    /// Broker host. Default `127.0.0.1`.
    #[serde(default = "default_host")]
    pub host: String,
    /// Broker port (plain TCP; TLS is not built in). Default 1883.
    #[serde(default = "default_port")]
    pub port: u16,
    /// The topic template, e.g. `billing/{aggregate_type}/{event_type}`. Required, unless the sink
    /// is used only through [`RoutableSink::publish_to`] with a destination (a [`crate::Router`]
    /// whose routes each give one).
    #[serde(default)]
    pub topic: Option<Template>,
    /// Client id; it must be unique among the broker's clients (a second client with the same id
    /// disconnects the first). Default `postbox-<process id>-<random>`.
    #[serde(default)]
    pub client_id: Option<String>,
    /// User name. Default none.
    #[serde(default)]
    pub username: Option<String>,
    /// Password, with `username`. Default none.
    #[serde(default)]
    pub password: Option<Secret>,
    /// Publish with the retain flag. Default `false`.
    #[serde(default)]
    pub retain: bool,
    /// Keep-alive interval (at least 5 s). Default 30 s.
    #[serde(default = "default_keep_alive", with = "humantime_serde")]
    pub keep_alive: Duration,
    /// Most publishes awaiting their `PUBACK` at once (the broker's receive maximum may lower
    /// it); further publishes wait their turn. Default 100.
    #[serde(default = "default_max_inflight")]
    pub max_inflight: u16,
    /// Bound on one publish, waiting for a reconnection included. Default 5 s.
    #[serde(default = "defaults::publish_timeout", with = "humantime_serde")]
    pub publish_timeout: Duration,
    /// Bound on each connection attempt, the first one in [`MqttSink::connect`] included
    /// (whole seconds, at least 1). Default 5 s.
    #[serde(default = "defaults::connect_timeout", with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Longest wait between reconnection attempts (they start at 50 ms and double). Default 2 s.
    #[serde(default = "defaults::reconnect_max_delay", with = "humantime_serde")]
    pub reconnect_max_delay: Duration,
    /// How each event is written: `postbox` (default) or `cloudevents` (binary mode: user
    /// properties named `id`, `source`, … and no others, the content type in its property; see
    /// [`crate::cloudevents`]).
    #[serde(default)]
    pub format: Format,
    /// The CloudEvents settings (`mode`, `source`, `dataschema`), with `format = "cloudevents"`.
    #[serde(default)]
    pub cloudevents: CloudEventsConfig,
}

fn default_host() -> String {
    "127.0.0.1".to_owned()
}

fn default_port() -> u16 {
    1883
}

fn default_keep_alive() -> Duration {
    Duration::from_secs(30)
}

fn default_max_inflight() -> u16 {
    100
}

impl MqttConfig {
    /// A configuration with every default and this topic template.
    pub fn new(topic: Template) -> Self {
        MqttConfig {
            host: default_host(),
            port: default_port(),
            topic: Some(topic),
            client_id: None,
            username: None,
            password: None,
            retain: false,
            keep_alive: default_keep_alive(),
            max_inflight: default_max_inflight(),
            publish_timeout: defaults::publish_timeout(),
            connect_timeout: defaults::connect_timeout(),
            reconnect_max_delay: defaults::reconnect_max_delay(),
            format: Format::default(),
            cloudevents: CloudEventsConfig::default(),
        }
    }

    pub(super) fn options(&self) -> Result<MqttOptions> {
        if self.keep_alive < Duration::from_secs(5) {
            return Err(Error::config("keep_alive", "must be at least 5 s"));
        }
        if self.max_inflight == 0 {
            return Err(Error::config("max_inflight", "must be at least 1"));
        }
        let client_id = self.client_id.clone().unwrap_or_else(generated_client_id);
        let mut options = MqttOptions::new(client_id, self.host.clone(), self.port);
        options
            .set_keep_alive(self.keep_alive)
            .set_clean_start(true)
            .set_connection_timeout(self.connect_timeout.as_secs().max(1))
            .set_outgoing_inflight_upper_limit(self.max_inflight);
        match (&self.username, &self.password) {
            (Some(user), password) => {
                options.set_credentials(
                    user.clone(),
                    password
                        .as_ref()
                        .map(|p| p.expose().to_owned())
                        .unwrap_or_default(),
                );
            }
            (None, Some(_)) => {
                return Err(Error::config("password", "give `username` with `password`"));
            }
            (None, None) => {}
        }
        Ok(options)
    }
}

pub(super) fn generated_client_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "postbox-{}-{:x}{}",
        std::process::id(),
        nanos,
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

#[async_trait]
impl SinkSettings for MqttConfig {
    const DESTINATION_KEY: Option<&'static str> = Some("topic");
    const EXAMPLE_DESTINATION: &'static str = "billing/{aggregate_type}/{event_type}";

    /// `url` (`mqtt://[user[:password]@]host[:port]`) gives `host`, `port` and the credentials.
    fn read_url(table: &mut Map<String, Value>) -> std::result::Result<(), ConfigError> {
        let Some(url) = table.remove("url") else {
            return Ok(());
        };
        let url = url
            .as_str()
            .ok_or_else(|| ConfigError::new("url", "must be a string"))?;
        for key in ["host", "port"] {
            if table.contains_key(key) {
                return Err(ConfigError::new(
                    "url",
                    format!("give `url` or `{key}`, not both"),
                ));
            }
        }
        let address = MqttAddress::parse(url).map_err(|e| ConfigError::new("url", e))?;
        for (key, given) in [
            ("username", &address.username),
            ("password", &address.password),
        ] {
            if let Some(value) = given {
                if table.contains_key(key) {
                    return Err(ConfigError::new(
                        "url",
                        format!("has a {key} and so has the table; give it once"),
                    ));
                }
                table.insert(key.into(), value.clone().into());
            }
        }
        table.insert("host".into(), address.host.into());
        table.insert("port".into(), address.port.into());
        Ok(())
    }

    fn address(&self) -> String {
        format!("mqtt://{}:{}", self.host, self.port)
    }

    fn destination(&self) -> Option<&Template> {
        self.topic.as_ref()
    }

    fn publish_timeout(&self) -> Option<Duration> {
        Some(self.publish_timeout)
    }

    fn set_publish_timeout(&mut self, timeout: Duration) {
        self.publish_timeout = timeout;
    }

    fn reconnect_max_delay(&self) -> Option<Duration> {
        Some(self.reconnect_max_delay)
    }

    async fn connect(&self, shared: &crate::open::Shared) -> Result<Arc<dyn RoutableSink>> {
        let mut config = self.clone();
        config.cloudevents.set_origin(shared.origin());
        Ok(Arc::new(MqttSink::connect(config).await?))
    }
}

/// MQTT's port when the URL gives none.
const MQTT_DEFAULT_PORT: u16 = 1883;

/// An MQTT broker address: `mqtt://[user[:password]@]host[:port]` (also `tcp://`, or no scheme).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MqttAddress {
    host: String,
    port: u16,
    username: Option<String>,
    password: Option<String>,
}

impl MqttAddress {
    pub(crate) fn parse(url: &str) -> Result<MqttAddress, String> {
        let shown = postbox::redact::redact(url);
        let rest = match url.split_once("://") {
            None => url,
            Some(("mqtt" | "tcp", rest)) => rest,
            Some((scheme, _)) => {
                return Err(format!(
                    "{shown:?}: scheme {scheme:?} is not supported; write mqtt://host:port (TLS \
                     and WebSockets are not built in)"
                ));
            }
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains(['/', '?', '#']) {
            return Err(format!(
                "{shown:?} has a path; write mqtt://host:port (the topic goes in --topic)"
            ));
        }
        let (userinfo, hostport) = match rest.rsplit_once('@') {
            Some((userinfo, hostport)) => (Some(userinfo), hostport),
            None => (None, rest),
        };
        let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
            let (host, after) = v6
                .split_once(']')
                .ok_or_else(|| format!("{shown:?}: unclosed `[` in the host"))?;
            (host, after.strip_prefix(':'))
        } else {
            match hostport.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (hostport, None),
            }
        };
        if host.is_empty() {
            return Err(format!("{shown:?} has no host; write mqtt://host:port"));
        }
        let port = match port {
            None => MQTT_DEFAULT_PORT,
            Some(p) => p
                .parse()
                .map_err(|_| format!("{shown:?}: {p:?} is not a port"))?,
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(info) => match info.split_once(':') {
                Some((user, password)) => {
                    (Some(percent_decode(user)), Some(percent_decode(password)))
                }
                None => (Some(percent_decode(info)), None),
            },
        };
        Ok(MqttAddress {
            host: host.to_owned(),
            port,
            username,
            password,
        })
    }
}
