//! What one sink is, before it is opened: its kind and its settings, read from the single-sink
//! keys (`sink`, `sink_url`, `topic`, `exchange`, `webhook_secret`) or from a `[sinks.NAME]`
//! table of `postbox.toml`.

use std::time::Duration;

use postbox_sinks::{
    AmqpConfig, KafkaConfig, MqttConfig, NatsConfig, RedisConfig, Template, WebhookConfig,
};
use serde::Deserialize;

use crate::config::{SecretUrl, SinkKind};

/// The longest publish timeout a sink gets by default: the sinks' own default.
const SINK_PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);

/// Kafka's bootstrap servers when no URL is given.
pub(crate) const KAFKA_DEFAULT_SERVERS: &str = "127.0.0.1:9092";

/// MQTT's port when the URL gives none.
const MQTT_DEFAULT_PORT: u16 = 1883;

/// One sink's kind and settings.
#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub(crate) enum SinkSpec {
    /// JSON lines on stdout.
    Stdout,
    /// Discard.
    Null,
    /// HTTP webhook.
    Webhook(WebhookConfig),
    /// NATS JetStream.
    Nats(NatsConfig),
    /// RabbitMQ.
    Amqp(AmqpConfig),
    /// Kafka.
    Kafka(KafkaConfig),
    /// Redis Streams.
    Redis(RedisConfig),
    /// MQTT 5.
    Mqtt(MqttConfig),
}

/// The publish timeout a sink gets when none is configured: the sinks' default (5 s), but at
/// most four fifths of the relay's `publish_timeout`, so that the sink gives up (with its own,
/// more telling error) before the relay does.
pub(crate) fn default_publish_timeout(relay: Duration) -> Duration {
    SINK_PUBLISH_TIMEOUT.min(relay * 4 / 5)
}

impl SinkSpec {
    /// The kind.
    pub(crate) fn kind(&self) -> SinkKind {
        match self {
            SinkSpec::Stdout => SinkKind::Stdout,
            SinkSpec::Null => SinkKind::Null,
            SinkSpec::Webhook(_) => SinkKind::Webhook,
            SinkSpec::Nats(_) => SinkKind::Nats,
            SinkSpec::Amqp(_) => SinkKind::Amqp,
            SinkSpec::Kafka(_) => SinkKind::Kafka,
            SinkSpec::Redis(_) => SinkKind::Redis,
            SinkSpec::Mqtt(_) => SinkKind::Mqtt,
        }
    }

    /// Where it publishes, for logs: the address with any password hidden.
    pub(crate) fn address(&self) -> String {
        let redacted = |url: &str| SecretUrl::from(url).to_string();
        match self {
            SinkSpec::Stdout | SinkSpec::Null => String::new(),
            SinkSpec::Webhook(c) => c
                .url
                .as_ref()
                .map_or_else(|| "(URL per route)".to_owned(), |u| redacted(u.as_str())),
            SinkSpec::Nats(c) => redacted(&c.url),
            SinkSpec::Amqp(c) => redacted(&c.url),
            SinkSpec::Kafka(c) => c.bootstrap_servers.clone(),
            SinkSpec::Redis(c) => redacted(&c.url),
            SinkSpec::Mqtt(c) => format!("mqtt://{}:{}", c.host, c.port),
        }
    }

    /// The sink's own destination template, if it has one.
    pub(crate) fn own_destination(&self) -> Option<&Template> {
        match self {
            SinkSpec::Stdout | SinkSpec::Null => None,
            SinkSpec::Webhook(c) => c.url.as_ref(),
            SinkSpec::Nats(c) => c.subject.as_ref(),
            SinkSpec::Amqp(c) => c.routing_key.as_ref(),
            SinkSpec::Kafka(c) => c.topic.as_ref(),
            SinkSpec::Redis(c) => c.stream.as_ref(),
            SinkSpec::Mqtt(c) => c.topic.as_ref(),
        }
    }

    /// Whether every event needs a destination (all but stdout and null).
    pub(crate) fn needs_destination(&self) -> bool {
        !matches!(self, SinkSpec::Stdout | SinkSpec::Null)
    }

    /// The key of the sink's own destination in its table, e.g. `subject`.
    pub(crate) fn destination_key(&self) -> &'static str {
        match self {
            SinkSpec::Stdout | SinkSpec::Null => "topic",
            SinkSpec::Webhook(_) => "url",
            SinkSpec::Nats(_) => "subject",
            SinkSpec::Amqp(_) => "routing_key",
            SinkSpec::Kafka(_) | SinkSpec::Mqtt(_) => "topic",
            SinkSpec::Redis(_) => "stream",
        }
    }

    /// Checks a route's destination template for this sink.
    pub(crate) fn check_destination(&self, destination: &Template) -> Result<(), String> {
        match self {
            SinkSpec::Stdout | SinkSpec::Null => Err(format!(
                "the {} sink takes no topic; leave `topic` out",
                self.kind()
            )),
            SinkSpec::Webhook(_) => postbox_sinks::webhook::check_url(destination)
                .map_err(|e| format!("topic {:?}: {e}", destination.as_str())),
            _ => Ok(()),
        }
    }

    /// How long one publish may take; `None` for stdout and null, which bound nothing.
    pub(crate) fn publish_timeout(&self) -> Option<Duration> {
        match self {
            SinkSpec::Stdout | SinkSpec::Null => None,
            SinkSpec::Webhook(c) => Some(c.publish_timeout),
            SinkSpec::Nats(c) => Some(c.publish_timeout),
            SinkSpec::Amqp(c) => Some(c.publish_timeout),
            SinkSpec::Kafka(c) => Some(c.publish_timeout),
            SinkSpec::Redis(c) => Some(c.publish_timeout),
            SinkSpec::Mqtt(c) => Some(c.publish_timeout),
        }
    }

    fn set_publish_timeout(&mut self, timeout: Duration) {
        match self {
            SinkSpec::Stdout | SinkSpec::Null => {}
            SinkSpec::Webhook(c) => {
                c.publish_timeout = timeout;
                c.connect_timeout = c.connect_timeout.min(timeout);
            }
            SinkSpec::Nats(c) => c.publish_timeout = timeout,
            SinkSpec::Amqp(c) => c.publish_timeout = timeout,
            SinkSpec::Kafka(c) => c.publish_timeout = timeout,
            SinkSpec::Redis(c) => c.publish_timeout = timeout,
            SinkSpec::Mqtt(c) => c.publish_timeout = timeout,
        }
    }

    /// The sink of the single-sink keys. Errors name the key that is wrong.
    pub(crate) fn from_keys(keys: &SingleKeys<'_>) -> Result<SinkSpec, (&'static str, String)> {
        let kind = keys.kind;
        let unused = |key: &'static str, what: &str| -> Result<(), (&'static str, String)> {
            Err((key, format!("is not used by the {kind} sink ({what})")))
        };
        if keys.exchange.is_some() && kind != SinkKind::Amqp {
            unused("exchange", "only the amqp sink has an exchange")?;
        }
        if keys.webhook_secret.is_some() && kind != SinkKind::Webhook {
            unused("webhook_secret", "only the webhook sink signs its requests")?;
        }
        if keys.sink_url.is_some() && matches!(kind, SinkKind::Stdout | SinkKind::Null) {
            unused("sink_url", "it has no address")?;
        }
        if keys.topic.is_some() && matches!(kind, SinkKind::Stdout | SinkKind::Null) {
            unused("topic", "it has no destinations")?;
        }
        if keys.topic.is_some() && kind == SinkKind::Webhook {
            unused(
                "topic",
                "the webhook URL is the destination: put placeholders in sink_url, e.g. \
                 https://hooks.example.com/{event_type}",
            )?;
        }
        let url = keys.sink_url.map(SecretUrl::expose);
        let topic = || {
            keys.topic.cloned().ok_or_else(|| {
                (
                    "topic",
                    format!(
                        "is required with the {kind} sink: the {} template, e.g. --topic '{}'",
                        destination_name(kind),
                        example_topic(kind)
                    ),
                )
            })
        };
        let mut spec = match kind {
            SinkKind::Stdout => SinkSpec::Stdout,
            SinkKind::Null => SinkSpec::Null,
            SinkKind::Webhook => {
                let url = url.ok_or((
                    "sink_url",
                    "is required with the webhook sink: the endpoint, e.g. --sink-url \
                     'https://hooks.example.com/{event_type}' (placeholders allowed)"
                        .to_owned(),
                ))?;
                let template: Template = url
                    .parse()
                    .map_err(|e| ("sink_url", hide(url, &format!("{e}"))))?;
                postbox_sinks::webhook::check_url(&template)
                    .map_err(|e| ("sink_url", hide(url, &e.to_string())))?;
                let mut config = WebhookConfig::new(template);
                config.secret = keys.webhook_secret.map(|s| s.expose().to_owned());
                SinkSpec::Webhook(config)
            }
            SinkKind::Nats => {
                let mut config = NatsConfig::new(topic()?);
                if let Some(url) = url {
                    config.url = url.to_owned();
                }
                move_nats_credentials(&mut config).map_err(|e| ("sink_url", e))?;
                SinkSpec::Nats(config)
            }
            SinkKind::Amqp => {
                let mut config = AmqpConfig::new(topic()?);
                if let Some(url) = url {
                    config.url = url.to_owned();
                }
                if let Some(exchange) = keys.exchange {
                    config.exchange = exchange.to_owned();
                }
                SinkSpec::Amqp(config)
            }
            SinkKind::Kafka => {
                let servers = kafka_servers(url.unwrap_or(KAFKA_DEFAULT_SERVERS))
                    .map_err(|e| ("sink_url", e))?;
                SinkSpec::Kafka(KafkaConfig::new(servers, topic()?))
            }
            SinkKind::Redis => {
                let mut config = RedisConfig::new(topic()?);
                if let Some(url) = url {
                    config.url = url.to_owned();
                }
                SinkSpec::Redis(config)
            }
            SinkKind::Mqtt => {
                let mut config = MqttConfig::new(topic()?);
                if let Some(url) = url {
                    let address = MqttAddress::parse(url).map_err(|e| ("sink_url", e))?;
                    address.apply(&mut config);
                }
                SinkSpec::Mqtt(config)
            }
        };
        spec.set_publish_timeout(default_publish_timeout(keys.relay_publish_timeout));
        Ok(spec)
    }

    /// The sink of a `[sinks.NAME]` table: `kind` and the keys of that kind's configuration
    /// (see docs/sinks.md), plus `url` for every kind (`mqtt://host:port` for MQTT, the
    /// bootstrap servers for Kafka). A table without `publish_timeout` gets
    /// [`default_publish_timeout`]. Returns the spec and whether `publish_timeout` was given.
    pub(crate) fn from_table(
        table: &serde_json::Value,
        relay_publish_timeout: Duration,
    ) -> Result<(SinkSpec, bool), String> {
        let serde_json::Value::Object(map) = table else {
            return Err("must be a table, e.g. [sinks.events] with kind = \"nats\"".to_owned());
        };
        let mut map = map.clone();
        let kind = map.get("kind").and_then(serde_json::Value::as_str);
        let mut mqtt_address = None;
        match kind {
            Some("mqtt") => {
                if let Some(url) = map.remove("url") {
                    let url = url.as_str().ok_or("`url` must be a string")?;
                    for key in ["host", "port"] {
                        if map.contains_key(key) {
                            return Err(format!("give `url` or `{key}`, not both"));
                        }
                    }
                    let address = MqttAddress::parse(url)?;
                    for (key, given) in [
                        ("username", &address.username),
                        ("password", &address.password),
                    ] {
                        if given.is_some() && map.contains_key(key) {
                            return Err(format!(
                                "`url` has a {key} and so has the table; give it once"
                            ));
                        }
                    }
                    mqtt_address = Some(address);
                }
            }
            Some("kafka") => match (map.remove("url"), map.contains_key("bootstrap_servers")) {
                (Some(_), true) => return Err("give `url` or `bootstrap_servers`, not both".into()),
                (Some(url), false) => {
                    let url = url.as_str().ok_or("`url` must be a string")?;
                    map.insert("bootstrap_servers".into(), kafka_servers(url)?.into());
                }
                (None, true) => {}
                (None, false) => {
                    map.insert("bootstrap_servers".into(), KAFKA_DEFAULT_SERVERS.into());
                }
            },
            Some("stdout" | "null") => {
                if let Some(key) = map.keys().find(|k| *k != "kind") {
                    return Err(format!(
                        "unknown field `{key}`: this kind takes no settings"
                    ));
                }
            }
            _ => {}
        }
        let explicit_timeout = map.contains_key("publish_timeout");
        let url = map
            .get("url")
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned);
        let hide_url = |message: String| match &url {
            Some(url) => hide(url, &message),
            None => message,
        };
        let mut spec: SinkSpec = serde_json::from_value(serde_json::Value::Object(map))
            .map_err(|e| hide_url(e.to_string()))?;
        if let (SinkSpec::Mqtt(config), Some(address)) = (&mut spec, mqtt_address) {
            address.apply(config);
        }
        if let SinkSpec::Nats(config) = &mut spec {
            move_nats_credentials(config)?;
        }
        if let SinkSpec::Webhook(config) = &spec
            && let Some(url) = &config.url
        {
            postbox_sinks::webhook::check_url(url).map_err(|e| hide_url(e.to_string()))?;
        }
        if !explicit_timeout {
            spec.set_publish_timeout(default_publish_timeout(relay_publish_timeout));
        }
        Ok((spec, explicit_timeout))
    }
}

/// The single-sink configuration keys.
pub(crate) struct SingleKeys<'a> {
    /// `sink`.
    pub(crate) kind: SinkKind,
    /// `sink_url`.
    pub(crate) sink_url: Option<&'a SecretUrl>,
    /// `topic`.
    pub(crate) topic: Option<&'a Template>,
    /// `exchange`.
    pub(crate) exchange: Option<&'a str>,
    /// `webhook_secret`.
    pub(crate) webhook_secret: Option<&'a crate::config::Secret>,
    /// The relay's `publish_timeout`.
    pub(crate) relay_publish_timeout: Duration,
}

/// `message` with every occurrence of `url` shown without its password.
pub(crate) fn hide(url: &str, message: &str) -> String {
    message.replace(url, &SecretUrl::from(url).to_string())
}

/// What `--topic` names for a kind, for messages.
pub(crate) fn destination_name(kind: SinkKind) -> &'static str {
    match kind {
        SinkKind::Nats => "subject",
        SinkKind::Amqp => "routing key",
        SinkKind::Kafka | SinkKind::Mqtt => "topic",
        SinkKind::Redis => "stream key",
        SinkKind::Webhook => "URL",
        SinkKind::Stdout | SinkKind::Null => "destination",
    }
}

fn example_topic(kind: SinkKind) -> &'static str {
    match kind {
        SinkKind::Mqtt => "billing/{aggregate_type}/{event_type}",
        SinkKind::Redis => "billing:{aggregate_type}",
        SinkKind::Amqp => "{aggregate_type}.{event_type}",
        _ => "billing.{aggregate_type}.{event_type}",
    }
}

/// Moves `user:password@` (or `token@`) out of NATS server URLs into the configuration's
/// `user`/`password` (or `token`): the NATS client logs server addresses at debug level, and
/// they must not carry a password.
fn move_nats_credentials(config: &mut NatsConfig) -> Result<(), String> {
    let mut found: Option<(String, Option<String>)> = None;
    let mut servers = Vec::new();
    for server in config.url.split(',') {
        let server = server.trim();
        let (scheme, rest) = server.split_once("://").unwrap_or(("", server));
        let authority_end = rest.find('/').unwrap_or(rest.len());
        let Some(at) = rest[..authority_end].rfind('@') else {
            servers.push(server.to_owned());
            continue;
        };
        let userinfo = &rest[..at];
        let credentials = match userinfo.split_once(':') {
            Some((user, password)) => (percent_decode(user), Some(percent_decode(password))),
            None => (percent_decode(userinfo), None),
        };
        if found.as_ref().is_some_and(|f| *f != credentials) {
            return Err(
                "the NATS server URLs carry different credentials; give them once".to_owned(),
            );
        }
        found = Some(credentials);
        let bare = &rest[at + 1..];
        servers.push(if scheme.is_empty() {
            bare.to_owned()
        } else {
            format!("{scheme}://{bare}")
        });
    }
    let Some((user, password)) = found else {
        return Ok(());
    };
    if config.user.is_some() || config.password.is_some() || config.token.is_some() {
        return Err(
            "credentials are in `url` and in `user`/`password`/`token`; give them once".to_owned(),
        );
    }
    match password {
        Some(password) => {
            config.user = Some(user);
            config.password = Some(password);
        }
        // `nats://TOKEN@host`: a token alone.
        None => config.token = Some(user),
    }
    config.url = servers.join(",");
    Ok(())
}

/// Kafka bootstrap servers from `kafka://host:port,host:port` or a plain `host:port` list.
pub(crate) fn kafka_servers(url: &str) -> Result<String, String> {
    let mut servers = Vec::new();
    for entry in url.split(',') {
        let entry = entry.trim();
        let entry = entry.strip_prefix("kafka://").unwrap_or(entry);
        let entry = entry.strip_suffix('/').unwrap_or(entry);
        if entry.contains("://") {
            return Err(format!(
                "{url:?}: Kafka bootstrap servers are written kafka://host:port,host:port or \
                 host:port,host:port (TLS and SASL go in the [sinks.NAME] table's properties)"
            ));
        }
        if entry.is_empty() || entry.contains(['/', '@', ' ']) {
            return Err(format!(
                "{url:?} is not a list of Kafka servers; write kafka://host:port,host:port"
            ));
        }
        servers.push(entry);
    }
    Ok(servers.join(","))
}

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
        let shown = SecretUrl::from(url).to_string();
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

    fn apply(self, config: &mut MqttConfig) {
        config.host = self.host;
        config.port = self.port;
        if self.username.is_some() {
            config.username = self.username;
        }
        if self.password.is_some() {
            config.password = self.password;
        }
    }
}

/// Decodes `%XX` escapes (a password with `@` or `:` is written `%40`, `%3A` in a URL).
fn percent_decode(text: &str) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(kind: SinkKind) -> SingleKeys<'static> {
        SingleKeys {
            kind,
            sink_url: None,
            topic: None,
            exchange: None,
            webhook_secret: None,
            relay_publish_timeout: Duration::from_secs(10),
        }
    }

    fn template(s: &str) -> &'static Template {
        Box::leak(Box::new(s.parse().expect("template")))
    }

    fn url(s: &str) -> &'static SecretUrl {
        Box::leak(Box::new(SecretUrl::from(s)))
    }

    #[test]
    fn every_broker_has_its_default_address() {
        let topic = Some(template("events.{event_type}"));
        let spec = |kind| {
            SinkSpec::from_keys(&SingleKeys {
                topic,
                ..keys(kind)
            })
            .expect("spec")
        };
        let SinkSpec::Nats(c) = spec(SinkKind::Nats) else {
            panic!("nats")
        };
        assert_eq!(c.url, "nats://127.0.0.1:4222");
        assert_eq!(c.subject, topic.cloned());
        assert_eq!(c.publish_timeout, Duration::from_secs(5));
        let SinkSpec::Amqp(c) = spec(SinkKind::Amqp) else {
            panic!("amqp")
        };
        assert_eq!(c.url, "amqp://127.0.0.1:5672/%2f");
        assert_eq!(c.exchange, "", "the default exchange");
        let SinkSpec::Redis(c) = spec(SinkKind::Redis) else {
            panic!("redis")
        };
        assert_eq!(c.url, "redis://127.0.0.1:6379");
        let SinkSpec::Mqtt(c) = spec(SinkKind::Mqtt) else {
            panic!("mqtt")
        };
        assert_eq!((c.host.as_str(), c.port), ("127.0.0.1", 1883));
        let SinkSpec::Kafka(c) = spec(SinkKind::Kafka) else {
            panic!("kafka")
        };
        assert_eq!(c.bootstrap_servers, "127.0.0.1:9092");
        assert_eq!(c.topic, topic.cloned());
    }

    #[test]
    fn nats_credentials_leave_the_url() {
        let spec = SinkSpec::from_keys(&SingleKeys {
            sink_url: Some(url(
                "nats://relay:p%40ss@n1:4222, nats://relay:p%40ss@n2:4222",
            )),
            topic: Some(template("x")),
            ..keys(SinkKind::Nats)
        })
        .expect("spec");
        let SinkSpec::Nats(c) = spec else {
            panic!("nats")
        };
        assert_eq!(c.url, "nats://n1:4222,nats://n2:4222");
        assert_eq!(c.user.as_deref(), Some("relay"));
        assert_eq!(c.password.as_deref(), Some("p@ss"));
        let (spec, _) = SinkSpec::from_table(
            &serde_json::json!({"kind": "nats", "url": "nats://s3cr3t-token@n1:4222"}),
            Duration::from_secs(10),
        )
        .expect("token");
        let SinkSpec::Nats(c) = spec else {
            panic!("nats")
        };
        assert_eq!(c.url, "nats://n1:4222");
        assert_eq!(c.token.as_deref(), Some("s3cr3t-token"));
        assert!(c.user.is_none());
        let err = SinkSpec::from_table(
            &serde_json::json!({"kind": "nats", "url": "nats://a:b@n1", "user": "a", "password": "b"}),
            Duration::from_secs(10),
        )
        .expect_err("twice");
        assert!(err.contains("give them once"), "{err}");
    }

    #[test]
    fn kafka_servers_come_from_a_url_or_a_list() {
        assert_eq!(
            kafka_servers("kafka://k1:9092,k2:9093").as_deref(),
            Ok("k1:9092,k2:9093")
        );
        assert_eq!(
            kafka_servers("k1:9092, kafka://k2:9093/").as_deref(),
            Ok("k1:9092,k2:9093")
        );
        assert!(kafka_servers("http://k1:9092").is_err());
        assert!(kafka_servers("k1:9092,,k2").is_err());
        let spec = SinkSpec::from_keys(&SingleKeys {
            sink_url: Some(url("kafka://10.0.0.1:9092,10.0.0.2:9092")),
            topic: Some(template("billing.{aggregate_type}")),
            ..keys(SinkKind::Kafka)
        })
        .expect("spec");
        let SinkSpec::Kafka(c) = spec else {
            panic!("kafka")
        };
        assert_eq!(c.bootstrap_servers, "10.0.0.1:9092,10.0.0.2:9092");
    }

    #[test]
    fn mqtt_urls_give_host_port_and_credentials() {
        let a = MqttAddress::parse("mqtt://relay:p%40ss@broker.internal:1884").expect("url");
        assert_eq!(a.host, "broker.internal");
        assert_eq!(a.port, 1884);
        assert_eq!(a.username.as_deref(), Some("relay"));
        assert_eq!(a.password.as_deref(), Some("p@ss"));
        let a = MqttAddress::parse("127.0.0.1").expect("bare host");
        assert_eq!((a.host.as_str(), a.port), ("127.0.0.1", 1883));
        let a = MqttAddress::parse("tcp://[::1]:1999/").expect("ipv6");
        assert_eq!((a.host.as_str(), a.port), ("::1", 1999));
        for bad in [
            "mqtts://h:8883",
            "mqtt://h:port",
            "mqtt://h/topic",
            "mqtt://:1883",
        ] {
            assert!(MqttAddress::parse(bad).is_err(), "{bad}");
        }
        let err = MqttAddress::parse("ws://u:secret@h:1").expect_err("ws");
        assert!(!err.contains("secret"), "{err}");
        let (_, err) = SinkSpec::from_keys(&SingleKeys {
            sink_url: Some(url("ftp://u:secret@h/{event_type}")),
            ..keys(SinkKind::Webhook)
        })
        .expect_err("ftp");
        assert!(err.contains("u:***@h") && !err.contains("secret"), "{err}");
        let err = SinkSpec::from_table(
            &serde_json::json!({"kind": "webhook", "url": "https://u:secret@h/{nope}"}),
            Duration::from_secs(10),
        )
        .expect_err("placeholder");
        assert!(err.contains("{nope}") && !err.contains("secret"), "{err}");
    }

    #[test]
    fn single_keys_that_do_not_apply_are_refused_by_name() {
        let cases: Vec<(SingleKeys<'static>, &str)> = vec![
            (keys(SinkKind::Nats), "topic"),
            (keys(SinkKind::Webhook), "sink_url"),
            (
                SingleKeys {
                    exchange: Some("billing"),
                    topic: Some(template("x")),
                    ..keys(SinkKind::Nats)
                },
                "exchange",
            ),
            (
                SingleKeys {
                    topic: Some(template("x")),
                    sink_url: Some(url("http://h/x")),
                    ..keys(SinkKind::Webhook)
                },
                "topic",
            ),
            (
                SingleKeys {
                    sink_url: Some(url("http://h/x")),
                    ..keys(SinkKind::Stdout)
                },
                "sink_url",
            ),
            (
                SingleKeys {
                    sink_url: Some(url("ftp://h/{event_type}")),
                    ..keys(SinkKind::Webhook)
                },
                "sink_url",
            ),
        ];
        for (keys, key) in cases {
            let kind = keys.kind;
            let (got, message) = SinkSpec::from_keys(&keys).expect_err("refused");
            assert_eq!(got, key, "{kind}: {message}");
        }
    }

    #[test]
    fn the_sink_gives_up_before_the_relay() {
        assert_eq!(
            default_publish_timeout(Duration::from_secs(10)),
            Duration::from_secs(5)
        );
        assert_eq!(
            default_publish_timeout(Duration::from_secs(2)),
            Duration::from_millis(1600)
        );
    }

    #[test]
    fn tables_take_url_for_every_kind() {
        let relay = Duration::from_secs(10);
        let (spec, explicit) = SinkSpec::from_table(
            &serde_json::json!({"kind": "mqtt", "url": "mqtt://u:pw@h:1999", "topic": "a/{event_type}"}),
            relay,
        )
        .expect("mqtt");
        assert!(!explicit);
        let SinkSpec::Mqtt(c) = spec else {
            panic!("mqtt")
        };
        assert_eq!((c.host.as_str(), c.port), ("h", 1999));
        assert_eq!(c.password.as_deref(), Some("pw"));

        let (spec, _) = SinkSpec::from_table(
            &serde_json::json!({"kind": "kafka", "url": "kafka://k:1"}),
            relay,
        )
        .expect("kafka");
        let SinkSpec::Kafka(c) = spec else {
            panic!("kafka")
        };
        assert_eq!(c.bootstrap_servers, "k:1");
        assert_eq!(c.topic, None);
        let (spec, _) = SinkSpec::from_table(&serde_json::json!({"kind": "kafka"}), relay)
            .expect("kafka default");
        let SinkSpec::Kafka(c) = spec else {
            panic!("kafka")
        };
        assert_eq!(c.bootstrap_servers, KAFKA_DEFAULT_SERVERS);

        let (spec, explicit) = SinkSpec::from_table(
            &serde_json::json!({"kind": "kafka", "bootstrap_servers": "a:1,b:2",
                "topic": "t.{event_type}", "publish_timeout": "2s",
                "properties": {"compression.type": "lz4"}}),
            relay,
        )
        .expect("kafka native keys");
        assert!(explicit);
        let SinkSpec::Kafka(c) = spec else {
            panic!("kafka")
        };
        assert_eq!(c.bootstrap_servers, "a:1,b:2");
        assert_eq!(c.publish_timeout, Duration::from_secs(2));
        assert_eq!(c.properties["compression.type"], "lz4");
    }

    #[test]
    fn bad_tables_are_refused_with_the_reason() {
        let relay = Duration::from_secs(10);
        for (table, expect) in [
            (serde_json::json!({"url": "nats://h"}), "kind"),
            (serde_json::json!({"kind": "natz"}), "natz"),
            (
                serde_json::json!({"kind": "nats", "subjekt": "x"}),
                "subjekt",
            ),
            (
                serde_json::json!({"kind": "nats", "subject": "a.{nope}"}),
                "{nope}",
            ),
            (
                serde_json::json!({"kind": "webhook", "url": "ftp://x"}),
                "scheme",
            ),
            (
                serde_json::json!({"kind": "kafka", "url": "k:1", "bootstrap_servers": "k:2"}),
                "not both",
            ),
            (
                serde_json::json!({"kind": "mqtt", "url": "mqtt://h", "port": 1}),
                "not both",
            ),
            (serde_json::json!({"kind": "stdout", "url": "x"}), "url"),
            (serde_json::json!("nats"), "table"),
        ] {
            let err = SinkSpec::from_table(&table, relay).expect_err("refused");
            assert!(err.contains(expect), "{table}: {err}");
        }
    }
}
