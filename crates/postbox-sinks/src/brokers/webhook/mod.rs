//! HTTP webhook sink: POSTs each event as a signed JSON envelope; a 2xx answer is the
//! acknowledgement. The request body and its signature are in `envelope`, the endpoint URLs in
//! `url`.

mod envelope;
mod url;

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use postbox::{OutboxEvent, PublishError, Sink};
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use reqwest::{StatusCode, Url};
use serde::Deserialize;
use tokio::time::Instant;

use std::sync::Arc;

use crate::cloudevents::{Binding, CloudEventsConfig, Encoder, Format};
use crate::error::ConfigError;
use crate::open::Shared;
use crate::routing::no_destination;
use crate::settings::{Secret, SinkSettings};
use crate::{Error, Result, RoutableSink, Template, defaults, headers};

pub use envelope::{Envelope, TIMESTAMP_HEADER, sign};
pub use url::check_url;
use url::{fixed_url, is_dot_segment, parse_url, percent_encode, redact_url};

/// The header that carries the dedup id.
pub const IDEMPOTENCY_KEY_HEADER: &str = headers::IDEMPOTENCY_KEY;

/// The default signature header: `sha256=<hex HMAC-SHA256 of the body>`.
pub const DEFAULT_SIGNATURE_HEADER: &str = "X-Postbox-Signature";

/// How much of an error response's body goes into the error message.
const ERROR_BODY_LIMIT: usize = 512;

/// Configuration of a [`WebhookSink`].
///
/// ```
/// let config: postbox_sinks::WebhookConfig = serde_json::from_value(serde_json::json!({
///     "url": "https://hooks.example.com/billing/{event_type}",
///     "secret": "s3cr3t",
///     "headers": {"Authorization": "Bearer abc"},
/// })).unwrap();
/// assert_eq!(config.signature_header, "X-Postbox-Signature");
/// ```
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct WebhookConfig {
    /// The endpoint, an `http` or `https` URL template, e.g.
    /// `https://hooks.example.com/{tenant}/events`. Placeholder values are percent-encoded.
    /// Required, unless the sink is used only through [`RoutableSink::publish_to`] with a
    /// destination (a [`crate::Router`] whose routes each give their URL).
    #[serde(default)]
    pub url: Option<Template>,
    /// Key of the HMAC-SHA256 signature over the body; without one, no signature header is sent.
    /// Default none.
    #[serde(default)]
    pub secret: Option<Secret>,
    /// The header carrying the signature. Default `X-Postbox-Signature`.
    #[serde(default = "default_signature_header")]
    pub signature_header: String,
    /// Further headers sent with every request (e.g. `Authorization`). Default none.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Bound on one request, connecting and reading the answer included. Default 5 s.
    #[serde(default = "defaults::publish_timeout", with = "humantime_serde")]
    pub publish_timeout: Duration,
    /// Bound on opening a connection. Default 5 s (still within `publish_timeout`).
    #[serde(default = "defaults::connect_timeout", with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Statuses that say the endpoint is down, not the event bad: the event waits without
    /// spending a try. Default [`DEFAULT_UNAVAILABLE_STATUSES`] (401, 403, 408, 429, 502, 503,
    /// 504).
    #[serde(default = "default_unavailable_statuses")]
    pub unavailable_statuses: Vec<u16>,
    /// How each event is written: `postbox` (default) or `cloudevents` (binary mode: `ce-*` headers
    /// and the payload as the body; structured mode: `application/cloudevents+json`; see
    /// [`crate::cloudevents`]).
    #[serde(default)]
    pub format: Format,
    /// The CloudEvents settings (`mode`, `source`, `dataschema`), with `format = "cloudevents"`.
    #[serde(default)]
    pub cloudevents: CloudEventsConfig,
}

impl std::fmt::Debug for WebhookConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookConfig")
            .field("url", &self.url)
            .field("secret", &self.secret)
            .field("signature_header", &self.signature_header)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("publish_timeout", &self.publish_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("unavailable_statuses", &self.unavailable_statuses)
            .field("format", &self.format)
            .field("cloudevents", &self.cloudevents)
            .finish()
    }
}

fn default_signature_header() -> String {
    DEFAULT_SIGNATURE_HEADER.to_owned()
}

impl WebhookConfig {
    /// A configuration with every default and this URL template.
    pub fn new(url: Template) -> Self {
        WebhookConfig {
            url: Some(url),
            secret: None,
            signature_header: default_signature_header(),
            headers: BTreeMap::new(),
            publish_timeout: defaults::publish_timeout(),
            connect_timeout: defaults::connect_timeout(),
            unavailable_statuses: default_unavailable_statuses(),
            format: Format::default(),
            cloudevents: CloudEventsConfig::default(),
        }
    }
}

/// POSTs events to an HTTP endpoint; an event counts as published when the endpoint answers
/// 2xx.
///
/// The body is an [`Envelope`] (JSON). Headers: `Content-Type: application/json`,
/// `Idempotency-Key` = the dedup id, the signature header (with a `secret`), the
/// [`crate::headers`] metadata, the event's own headers (`traceparent`, …) and the configured
/// ones. With `format = "cloudevents"` the request is a CloudEvent of the HTTP binding
/// ([`crate::cloudevents`]): `ce-*` headers and the payload as the body (binary mode), or the
/// whole event as `application/cloudevents+json` (structured mode); the signature covers the
/// body sent, and `Idempotency-Key` is still set.
///
/// Answers: 2xx acknowledges. The statuses of `unavailable_statuses` (by default 401, 403, 408,
/// 429, 502, 503 and 504) and timeouts and connection errors say the destination is down: the
/// event waits for it without spending a try (a `Retry-After` in seconds sets the pause).
/// Other 5xx are the event's failed try. Other 4xx are permanent (the message has the status
/// and the start of the body); 3xx is permanent (redirects are not followed: a POST must not
/// turn into a GET). A request that got no answer because the connection failed is sent up to
/// twice more within `publish_timeout`.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use postbox_sinks::{WebhookConfig, WebhookSink};
///
/// let mut config = WebhookConfig::new("https://hooks.example.com/{event_type}".parse()?);
/// config.secret = Some("s3cr3t".into());
/// let sink = WebhookSink::new(config)?;
/// # let _ = sink; Ok(()) }
/// ```
pub struct WebhookSink {
    client: reqwest::Client,
    url: Option<Template>,
    /// The parsed URL when the template has no placeholders.
    fixed_url: Option<Url>,
    secret: Option<Vec<u8>>,
    signature_header: HeaderName,
    publish_timeout: Duration,
    unavailable_statuses: Vec<u16>,
    encoder: Encoder,
}

impl std::fmt::Debug for WebhookSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookSink")
            .field("url", &self.url)
            .field("signed", &self.secret.is_some())
            .finish_non_exhaustive()
    }
}

impl WebhookSink {
    /// Builds the HTTP client (rustls). Nothing is sent until the first publish.
    pub fn new(config: WebhookConfig) -> Result<WebhookSink> {
        let fixed_url = match &config.url {
            Some(url) => fixed_url(url)?,
            None => None,
        };
        let signature_header = HeaderName::from_bytes(config.signature_header.as_bytes())
            .map_err(|e| Error::config("signature_header", e.to_string()))?;
        let mut default_headers = HeaderMap::new();
        for (name, value) in &config.headers {
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|e| Error::config("headers", format!("{name:?}: {e}")))?;
            let mut value = HeaderValue::from_str(value)
                .map_err(|e| Error::config("headers", format!("value of {name}: {e}")))?;
            value.set_sensitive(true);
            default_headers.insert(name, value);
        }
        let client = reqwest::Client::builder()
            .user_agent(concat!("postbox/", env!("CARGO_PKG_VERSION")))
            .default_headers(default_headers)
            .redirect(reqwest::redirect::Policy::none())
            .timeout(config.publish_timeout)
            .connect_timeout(config.connect_timeout)
            .build()
            .map_err(|e| Error::config("url", format!("cannot build the HTTP client: {e}")))?;
        Ok(WebhookSink {
            client,
            encoder: Encoder::new(config.format, &config.cloudevents),
            url: config.url,
            fixed_url,
            secret: config.secret.map(|s| s.expose().as_bytes().to_vec()),
            unavailable_statuses: config.unavailable_statuses,
            signature_header,
            publish_timeout: config.publish_timeout,
        })
    }

    /// The URL of `event`: from `destination`, else from the configured `url`.
    fn url(
        &self,
        event: &OutboxEvent,
        destination: Option<&Template>,
    ) -> Result<Url, PublishError> {
        let template = match destination {
            Some(template) => template,
            None => {
                if let Some(url) = &self.fixed_url {
                    return Ok(url.clone());
                }
                self.url
                    .as_ref()
                    .ok_or_else(|| no_destination("webhook", "url"))?
            }
        };
        // A value that is a dot segment (`.`, `..`, or one written with `%2e`) would send the
        // request to another path: the event is refused, whatever else the URL holds.
        let dot_segment = std::cell::Cell::new(None);
        let rendered = template.render_with(event, |value, out| {
            if is_dot_segment(value) {
                dot_segment.set(Some(value.to_owned()));
            }
            percent_encode(value, out);
        })?;
        if let Some(value) = dot_segment.take() {
            return Err(PublishError::permanent(format!(
                "webhook: event {} has the value {value:?} in its URL template, a dot segment \
                 that would send the request to another path; refused",
                event.id
            )));
        }
        parse_url(&rendered).map_err(|e| PublishError::permanent(format!("webhook: {e}")))
    }

    /// The body and headers of `event`'s request: the [`Envelope`] and the Postbox headers, or a
    /// CloudEvent of the HTTP binding.
    fn request(&self, event: &OutboxEvent) -> Result<(HeaderMap, Vec<u8>), PublishError> {
        let message = self.encoder.encode(event, Binding::Http)?;
        let body = if self.encoder.is_cloudevents() {
            message.body.into_owned()
        } else {
            serde_json::to_vec(&Envelope::of(event)).map_err(|e| {
                PublishError::permanent(format!("webhook: cannot encode event: {e}"))
            })?
        };
        let headers = self.request_headers(event, &message.headers, message.content_type, &body)?;
        Ok((headers, body))
    }

    fn request_headers(
        &self,
        event: &OutboxEvent,
        headers: &[(String, String)],
        content_type: &'static str,
        body: &[u8],
    ) -> Result<HeaderMap, PublishError> {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            let header = HeaderName::from_bytes(name.as_bytes()).map_err(|e| {
                PublishError::permanent(format!(
                    "webhook: event header {name:?} is not a valid HTTP header name ({e})"
                ))
            })?;
            let value = HeaderValue::from_str(value).map_err(|e| {
                PublishError::permanent(format!(
                    "webhook: the value of event header {name:?} is not a valid HTTP header value ({e})"
                ))
            })?;
            map.insert(header, value);
        }
        map.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        let dedup = HeaderValue::from_str(&event.dedup_id()).map_err(|e| {
            PublishError::permanent(format!(
                "webhook: the dedup id of event {} is not a valid header value ({e})",
                event.id
            ))
        })?;
        map.insert(IDEMPOTENCY_KEY_HEADER, dedup);
        if let Some(secret) = &self.secret {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let signature = HeaderValue::from_str(&sign(secret, now, body))
                .map_err(|e| PublishError::retryable(format!("webhook: signature: {e}")))?;
            map.insert(self.signature_header.clone(), signature);
            map.insert(TIMESTAMP_HEADER, HeaderValue::from(now));
        }
        Ok(map)
    }
}

#[async_trait]
impl Sink for WebhookSink {
    async fn publish(&self, event: &OutboxEvent) -> Result<(), PublishError> {
        self.publish_to(event, None).await
    }
}

#[async_trait]
impl RoutableSink for WebhookSink {
    /// POSTs to the URL `destination` renders (the configured `url` when `None`); the route's
    /// template is checked by [`check_url`] at start-up, its rendered URL at each publish.
    async fn publish_to(
        &self,
        event: &OutboxEvent,
        destination: Option<&Template>,
    ) -> Result<(), PublishError> {
        let url = self.url(event, destination)?;
        let (headers, body) = self.request(event)?;
        let body = bytes::Bytes::from(body);
        let deadline = Instant::now() + self.publish_timeout;
        let mut attempt = 0;
        let response = loop {
            attempt += 1;
            let remaining = deadline.saturating_duration_since(Instant::now());
            let sent = self
                .client
                .post(url.clone())
                .headers(headers.clone())
                .timeout(remaining)
                .body(body.clone())
                .send()
                .await;
            match sent {
                Ok(response) => break response,
                // A kept-alive connection the server closed meanwhile, or a refused connection:
                // no answer came, so send once more while time is left (the endpoint drops a
                // repeat by its Idempotency-Key).
                Err(e)
                    if attempt < 3
                        && !e.is_timeout()
                        && Instant::now() + Duration::from_millis(100) < deadline =>
                {
                    tracing::debug!(error = %error_chain(&e), "webhook request failed; sending again");
                    tokio::time::sleep(Duration::from_millis(20 * attempt)).await;
                }
                Err(e) => return Err(self.transport_error(&url, &e)),
            }
        };
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let shown_retry_after = retry_after
            .as_deref()
            .map(|v| format!(" (Retry-After: {v})"))
            .unwrap_or_default();
        let body = error_body(response).await;
        let message = format!(
            "webhook {} answered {status}{shown_retry_after}: {body}",
            redact_url(&url)
        );
        let error = classify(status, &self.unavailable_statuses, message);
        // Only the delta-seconds form; an HTTP date is rare and read as no hint.
        Err(
            match retry_after.and_then(|v| v.trim().parse::<u64>().ok()) {
                Some(secs) => error.with_retry_after(Duration::from_secs(secs.min(3600))),
                None => error,
            },
        )
    }
}

impl WebhookSink {
    fn transport_error(&self, url: &Url, e: &reqwest::Error) -> PublishError {
        let url = redact_url(url);
        // No answer at all: the endpoint is down, slow or unreachable, not the event's fault.
        if e.is_timeout() {
            PublishError::unavailable(format!(
                "webhook {url}: no answer within {:?}",
                self.publish_timeout
            ))
        } else if e.is_connect() {
            PublishError::unavailable(format!("webhook {url}: cannot connect: {}", error_chain(e)))
        } else {
            PublishError::unavailable(format!("webhook {url}: {}", error_chain(e)))
        }
    }
}

/// Classes a non-2xx status: one of `unavailable` says the destination is down; other 5xx are
/// the event's failed try; other 4xx and 3xx are permanent.
fn classify(status: StatusCode, unavailable: &[u16], message: String) -> PublishError {
    match status.as_u16() {
        code if unavailable.contains(&code) => PublishError::unavailable(message),
        300..=499 => PublishError::permanent(message),
        _ => PublishError::retryable(message),
    }
}

/// The statuses that say a webhook endpoint is down rather than the event bad: an expired or
/// rotated credential (401, 403, usually fixed for every event at once), a timeout or throttling
/// (408, 429), a gateway or the service unavailable (502, 503, 504).
pub const DEFAULT_UNAVAILABLE_STATUSES: &[u16] = &[401, 403, 408, 429, 502, 503, 504];

fn default_unavailable_statuses() -> Vec<u16> {
    DEFAULT_UNAVAILABLE_STATUSES.to_vec()
}

/// The start of a response body, for an error message.
async fn error_body(mut response: reqwest::Response) -> String {
    let mut bytes = Vec::new();
    while bytes.len() <= ERROR_BODY_LIMIT {
        match response.chunk().await {
            Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    let truncated = bytes.len() > ERROR_BODY_LIMIT;
    bytes.truncate(ERROR_BODY_LIMIT);
    let text = String::from_utf8_lossy(&bytes);
    let text = text.trim();
    match (text.is_empty(), truncated) {
        (true, _) => "(empty body)".to_owned(),
        (false, true) => format!("{text}…"),
        (false, false) => text.to_owned(),
    }
}

/// An error and its causes, `: `-separated, secrets hidden (the HTTP client names the URL,
/// query and all).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    postbox::redact::redact(&out)
}

#[async_trait]
impl SinkSettings for WebhookConfig {
    const DESTINATION_KEY: Option<&'static str> = Some("url");
    const DESTINATION_NAME: &'static str = "URL";
    const EXAMPLE_DESTINATION: &'static str = "https://hooks.example.com/{event_type}";

    fn settle(&mut self) -> std::result::Result<(), ConfigError> {
        match &self.url {
            Some(url) => check_url(url),
            None => Ok(()),
        }
    }

    fn address(&self) -> String {
        self.url
            .as_ref()
            .map_or_else(|| "(URL per route)".to_owned(), |u| u.as_str().to_owned())
    }

    fn destination(&self) -> Option<&Template> {
        self.url.as_ref()
    }

    fn check_destination(&self, destination: &Template) -> std::result::Result<(), ConfigError> {
        check_url(destination).map_err(|e| ConfigError::new("topic", e.message))
    }

    fn publish_timeout(&self) -> Option<Duration> {
        Some(self.publish_timeout)
    }

    fn set_publish_timeout(&mut self, timeout: Duration) {
        self.publish_timeout = timeout;
        self.connect_timeout = self.connect_timeout.min(timeout);
    }

    async fn connect(&self, shared: &Shared) -> Result<Arc<dyn RoutableSink>> {
        let mut config = self.clone();
        config.cloudevents.set_origin(shared.origin());
        Ok(Arc::new(WebhookSink::new(config)?))
    }
}

#[cfg(test)]
mod tests;
