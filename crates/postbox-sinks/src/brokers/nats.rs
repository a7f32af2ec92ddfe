//! NATS JetStream sink: publishes each event to a subject and waits for the stream's `PubAck`.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, context::PublishErrorKind};
use async_nats::{HeaderMap, HeaderName, HeaderValue};
use async_trait::async_trait;
use bytes::Bytes;
use postbox::{OutboxEvent, PublishError, Sink};
use serde::Deserialize;
use tokio::sync::watch;

use crate::cloudevents::{Binding, CloudEventsConfig, Encoder, Format};
use crate::error::ConfigError;
use crate::open::Shared;
use crate::routing::no_destination;
use crate::settings::{Secret, SinkSettings, percent_decode};
use crate::{Error, Result, RoutableSink, Template, defaults, headers};

/// The JetStream header that carries the dedup id; the stream drops a repeat within its
/// duplicate window.
pub const MSG_ID_HEADER: &str = headers::NATS_MSG_ID;

/// Configuration of a [`NatsSink`].
///
/// ```
/// let config: postbox_sinks::NatsConfig = serde_json::from_value(serde_json::json!({
///     "url": "nats://127.0.0.1:4222",
///     "subject": "billing.{aggregate_type}.{event_type}",
/// })).unwrap();
/// assert_eq!(config.publish_timeout, std::time::Duration::from_secs(5));
/// ```
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct NatsConfig {
    /// Server address(es), comma-separated, e.g. `nats://127.0.0.1:4222`. Default
    /// `nats://127.0.0.1:4222`.
    #[serde(default = "default_url")]
    pub url: String,
    /// The subject template, e.g. `billing.{aggregate_type}.{event_type}`. A JetStream stream must
    /// capture every subject it renders; an event whose subject no stream captures fails
    /// (retryable) until one does. Required, unless the sink is used only through
    /// [`RoutableSink::publish_to`] with a destination (a [`crate::Router`] whose routes each give
    /// one).
    #[serde(default)]
    pub subject: Option<Template>,
    /// Sets `Nats-Expected-Stream`: the publish fails unless this stream stores it. Default none.
    #[serde(default)]
    pub expected_stream: Option<String>,
    /// User name, with `password`. Default none.
    #[serde(default)]
    pub user: Option<String>,
    /// Password, with `user`. Default none.
    #[serde(default)]
    pub password: Option<Secret>,
    /// Authentication token. Default none.
    #[serde(default)]
    pub token: Option<Secret>,
    /// Require TLS. Default `false` (TLS is still used when the server asks for it).
    #[serde(default)]
    pub require_tls: bool,
    /// The client name the server shows. Default `postbox`.
    #[serde(default = "defaults::client_name")]
    pub name: String,
    /// Bound on one publish, waiting for a reconnection included. Default 5 s.
    #[serde(default = "defaults::publish_timeout", with = "humantime_serde")]
    pub publish_timeout: Duration,
    /// Bound on the first connection in [`NatsSink::connect`]. Default 5 s.
    #[serde(default = "defaults::connect_timeout", with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Longest wait between reconnection attempts (they start at 100 ms and double). Default 2 s.
    #[serde(default = "defaults::reconnect_max_delay", with = "humantime_serde")]
    pub reconnect_max_delay: Duration,
    /// How each event is written: `postbox` (default) or `cloudevents` (binary mode: `ce-*` headers
    /// and `content-type`; see [`crate::cloudevents`]).
    #[serde(default)]
    pub format: Format,
    /// The CloudEvents settings (`mode`, `source`, `dataschema`), with `format = "cloudevents"`.
    #[serde(default)]
    pub cloudevents: CloudEventsConfig,
}

fn default_url() -> String {
    "nats://127.0.0.1:4222".to_owned()
}

impl NatsConfig {
    /// A configuration with every default and this subject template.
    pub fn new(subject: Template) -> Self {
        NatsConfig {
            url: default_url(),
            subject: Some(subject),
            expected_stream: None,
            user: None,
            password: None,
            token: None,
            require_tls: false,
            name: defaults::client_name(),
            publish_timeout: defaults::publish_timeout(),
            connect_timeout: defaults::connect_timeout(),
            reconnect_max_delay: defaults::reconnect_max_delay(),
            format: Format::default(),
            cloudevents: CloudEventsConfig::default(),
        }
    }
}

/// Publishes events to NATS JetStream; an event counts as published when the stream's `PubAck`
/// arrives.
///
/// The body is the event payload (JSON). Headers: `Nats-Msg-Id` = the dedup id (JetStream drops a
/// repeat within the stream's duplicate window), the [`crate::headers`] metadata and the event's
/// own headers; with `format = "cloudevents"`, a CloudEvent of the NATS binding
/// ([`crate::cloudevents`]). While the server is away the client reconnects by itself; a publish
/// made meanwhile waits for it up to `publish_timeout`, then fails as retryable. A publish whose
/// connection drops before its `PubAck` arrives is sent again on the next connection (same
/// `Nats-Msg-Id`, so the stream stores it once).
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use postbox_sinks::{NatsConfig, NatsSink};
///
/// let sink = NatsSink::connect(NatsConfig::new("billing.{event_type}".parse()?)).await?;
/// # let _ = sink; Ok(()) }
/// ```
#[derive(Debug)]
pub struct NatsSink {
    jetstream: jetstream::Context,
    /// Counts lost connections; a publish awaiting its ack resends when it changes.
    disconnects: Arc<watch::Sender<u64>>,
    subject: Option<Template>,
    expected_stream: Option<HeaderValue>,
    publish_timeout: Duration,
    encoder: Encoder,
}

impl NatsSink {
    /// Connects to the server(s) in `config.url`; fails if the first connection does not succeed
    /// within `connect_timeout`.
    pub async fn connect(config: NatsConfig) -> Result<NatsSink> {
        let address = postbox::redact::redact(&config.url);
        let servers: Vec<async_nats::ServerAddr> = config
            .url
            .split(',')
            .map(|s| s.trim().parse())
            .collect::<Result<_, _>>()
            .map_err(|e| Error::config("url", format!("{address:?} is not a NATS address: {e}")))?;
        let expected_stream = config
            .expected_stream
            .as_deref()
            .map(HeaderValue::from_str)
            .transpose()
            .map_err(|e| Error::config("expected_stream", e.to_string()))?;
        let max_delay = config.reconnect_max_delay;
        let disconnects = Arc::new(watch::channel(0u64).0);
        let on_event = disconnects.clone();
        let mut options = async_nats::ConnectOptions::new()
            .name(&config.name)
            .connection_timeout(config.connect_timeout)
            .require_tls(config.require_tls)
            .reconnect_delay_callback(move |attempts| reconnect_delay(attempts, max_delay))
            .event_callback(move |event| {
                let disconnects = on_event.clone();
                async move {
                    match event {
                        async_nats::Event::Disconnected => {
                            disconnects.send_modify(|n| *n += 1);
                            tracing::warn!("NATS sink disconnected");
                        }
                        async_nats::Event::Connected => tracing::info!("NATS sink connected"),
                        other => tracing::debug!(event = %other, "NATS sink event"),
                    }
                }
            });
        match (&config.user, &config.password, &config.token) {
            (Some(user), Some(password), _) => {
                options = options.user_and_password(user.clone(), password.expose().to_owned());
            }
            (None, None, Some(token)) => options = options.token(token.expose().to_owned()),
            (None, None, None) => {}
            _ => {
                return Err(Error::config(
                    "user",
                    "give `user` with `password`, or `token` alone",
                ));
            }
        }
        let client = tokio::time::timeout(config.connect_timeout, options.connect(servers))
            .await
            .map_err(|_| {
                Error::connect(
                    "NATS",
                    &address,
                    format!("no connection within {:?}", config.connect_timeout),
                )
            })?
            .map_err(|e| Error::connect("NATS", &address, e))?;
        let mut jetstream = jetstream::new(client);
        jetstream.set_timeout(config.publish_timeout);
        Ok(NatsSink {
            encoder: Encoder::new(config.format, &config.cloudevents),
            jetstream,
            disconnects,
            subject: config.subject,
            expected_stream,
            publish_timeout: config.publish_timeout,
        })
    }

    fn message_headers(
        &self,
        event: &OutboxEvent,
        headers: &[(String, String)],
    ) -> Result<HeaderMap, PublishError> {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.insert(header_name(name)?, header_value(name, value)?);
        }
        map.insert(
            header_name(MSG_ID_HEADER)?,
            header_value(MSG_ID_HEADER, &event.dedup_id())?,
        );
        if let Some(stream) = &self.expected_stream {
            map.insert(header_name("Nats-Expected-Stream")?, stream.clone());
        }
        Ok(map)
    }
}

#[async_trait]
impl Sink for NatsSink {
    async fn publish(&self, event: &OutboxEvent) -> Result<(), PublishError> {
        self.publish_to(event, None).await
    }
}

#[async_trait]
impl RoutableSink for NatsSink {
    /// Publishes to the subject `destination` renders (the configured `subject` when `None`).
    async fn publish_to(
        &self,
        event: &OutboxEvent,
        destination: Option<&Template>,
    ) -> Result<(), PublishError> {
        let template = destination
            .or(self.subject.as_ref())
            .ok_or_else(|| no_destination("NATS", "subject"))?;
        let subject = template.render(event)?;
        check_subject(&subject)?;
        let encoded = self.encoder.encode(event, Binding::Nats)?;
        let message = jetstream::message::PublishMessage::build()
            .payload(Bytes::copy_from_slice(&encoded.body))
            .headers(self.message_headers(event, &encoded.headers)?);
        let publish = async {
            let mut disconnects = self.disconnects.subscribe();
            loop {
                disconnects.borrow_and_update();
                let ack = self
                    .jetstream
                    .send_publish(subject.clone(), message.clone())
                    .await?;
                tokio::select! {
                    ack = ack.into_future() => return ack,
                    // The connection dropped: the message or its ack may be lost. Send it again;
                    // `Nats-Msg-Id` lets the stream drop the copy if the first one got there.
                    _ = disconnects.changed() => {
                        tracing::debug!(%subject, "NATS connection lost before the ack; resending");
                    }
                }
            }
        };
        match tokio::time::timeout(self.publish_timeout, publish).await {
            Ok(Ok(_ack)) => Ok(()),
            Ok(Err(e)) => Err(classify(&subject, &e)),
            Err(_) => Err(PublishError::unavailable(format!(
                "NATS: no JetStream ack for subject {subject:?} within {:?} (server away or slow)",
                self.publish_timeout
            ))),
        }
    }
}

/// The client's wait before its `attempts`-th reconnection: none before the first, then the
/// sinks' reconnect backoff (100 ms, 200 ms, … up to `max`).
fn reconnect_delay(attempts: usize, max: Duration) -> Duration {
    if attempts <= 1 {
        return Duration::ZERO;
    }
    let n = u32::try_from(attempts - 2).unwrap_or(u32::MAX);
    crate::reconnect_backoff(max).delay(n)
}

fn classify(subject: &str, err: &jetstream::context::PublishError) -> PublishError {
    match err.kind() {
        PublishErrorKind::StreamNotFound => PublishError::retryable(format!(
            "NATS: no JetStream stream captures subject {subject:?} (no responders); create a \
             stream whose subjects match it"
        )),
        PublishErrorKind::MaxPayloadExceeded => {
            PublishError::permanent(format!("NATS: {err} (subject {subject:?})"))
        }
        PublishErrorKind::TimedOut | PublishErrorKind::BrokenPipe => {
            PublishError::unavailable(format!("NATS: {err} (subject {subject:?})"))
        }
        _ => PublishError::retryable(format!("NATS: {err} (subject {subject:?})")),
    }
}

/// Refuses subjects NATS cannot publish to: empty tokens, whitespace, wildcards.
fn check_subject(subject: &str) -> Result<(), PublishError> {
    let bad = subject.is_empty()
        || subject.chars().any(|c| c.is_whitespace() || c.is_control())
        || subject
            .split('.')
            .any(|token| token.is_empty() || token == "*" || token == ">");
    if bad {
        return Err(PublishError::permanent(format!(
            "NATS: {subject:?} is not a valid subject to publish to (empty token, whitespace or \
             wildcard); check the subject template and the event's values"
        )));
    }
    Ok(())
}

fn header_name(name: &str) -> Result<HeaderName, PublishError> {
    HeaderName::from_str(name).map_err(|e| {
        PublishError::permanent(format!(
            "NATS: header name {name:?} is not allowed ({e}); rename the event header"
        ))
    })
}

fn header_value(name: &str, value: &str) -> Result<HeaderValue, PublishError> {
    HeaderValue::from_str(value).map_err(|e| {
        PublishError::permanent(format!(
            "NATS: the value of header {name:?} is not allowed ({e})"
        ))
    })
}

impl std::fmt::Debug for NatsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsConfig")
            .field("url", &postbox::redact::redact(&self.url))
            .field("subject", &self.subject)
            .field("expected_stream", &self.expected_stream)
            .field("user", &self.user)
            .field("password", &self.password)
            .field("token", &self.token)
            .field("require_tls", &self.require_tls)
            .field("name", &self.name)
            .field("publish_timeout", &self.publish_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("reconnect_max_delay", &self.reconnect_max_delay)
            .field("format", &self.format)
            .field("cloudevents", &self.cloudevents)
            .finish()
    }
}

#[async_trait]
impl SinkSettings for NatsConfig {
    const DESTINATION_KEY: Option<&'static str> = Some("subject");
    const DESTINATION_NAME: &'static str = "subject";

    fn settle(&mut self) -> std::result::Result<(), ConfigError> {
        move_nats_credentials(self)
    }

    fn address(&self) -> String {
        self.url.clone()
    }

    fn destination(&self) -> Option<&Template> {
        self.subject.as_ref()
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

    async fn connect(&self, shared: &Shared) -> Result<Arc<dyn RoutableSink>> {
        let mut config = self.clone();
        config.cloudevents.set_origin(shared.origin());
        Ok(Arc::new(NatsSink::connect(config).await?))
    }
}

/// Moves `user:password@` (or `token@`) out of NATS server URLs into the configuration's
/// `user`/`password` (or `token`): the NATS client logs server addresses at debug level, and
/// they must not carry a password.
pub(crate) fn move_nats_credentials(config: &mut NatsConfig) -> Result<(), ConfigError> {
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
            return Err(ConfigError::new(
                "url",
                "the NATS server URLs carry different credentials; give them once",
            ));
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
        return Err(ConfigError::new(
            "url",
            "has credentials, and so do `user`/`password`/`token`; give them once",
        ));
    }
    match password {
        Some(password) => {
            config.user = Some(user);
            config.password = Some(Secret::new(password));
        }
        // `nats://TOKEN@host`: a token alone.
        None => config.token = Some(Secret::new(user)),
    }
    config.url = servers.join(",");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_are_checked() {
        assert!(check_subject("billing.Invoice.InvoiceCreated").is_ok());
        for bad in ["", "a..b", "a.", "a b", "a.*", "a.>", ".a"] {
            let err = check_subject(bad).err();
            assert!(err.is_some_and(|e| e.is_permanent()), "{bad:?}");
        }
    }

    #[test]
    fn reconnect_delay_grows_to_the_cap() {
        let max = Duration::from_secs(2);
        assert_eq!(reconnect_delay(1, max), Duration::ZERO);
        assert_eq!(reconnect_delay(2, max), Duration::from_millis(100));
        assert_eq!(reconnect_delay(3, max), Duration::from_millis(200));
        assert_eq!(reconnect_delay(60, max), max);
    }

    #[test]
    fn bad_header_names_are_permanent() {
        assert!(header_name("traceparent").is_ok());
        assert!(header_name("bad name:").is_err_and(|e| e.is_permanent()));
        assert!(header_value("x", "a\r\nb").is_err_and(|e| e.is_permanent()));
    }
}
