//! The webhook's endpoint URLs: checked when the sink is configured, parsed and shown without
//! their secrets, and the placeholders' values percent-encoded into them.

use reqwest::Url;

use crate::Template;
use crate::error::ConfigError;

/// Checks that `template` renders `http` or `https` URLs (with placeholder values filled in).
///
/// [`WebhookSink::new`](super::WebhookSink::new) checks its `url` with it; check the URL
/// templates of routes with it too, so that a mistake shows at start-up rather than as failed
/// events.
///
/// ```
/// use postbox_sinks::webhook::check_url;
///
/// assert!(check_url(&"https://hooks.example.com/{event_type}".parse().unwrap()).is_ok());
/// let err = check_url(&"hooks.example.com/{event_type}".parse().unwrap()).unwrap_err();
/// assert!(err.to_string().contains("url"));
/// ```
pub fn check_url(template: &Template) -> std::result::Result<(), ConfigError> {
    fixed_url(template).map(drop)
}

/// Checks `template` as [`check_url`] does; the URL when the template has no placeholders.
pub(super) fn fixed_url(template: &Template) -> std::result::Result<Option<Url>, ConfigError> {
    if template.is_static() {
        return parse_url(template.as_str())
            .map(Some)
            .map_err(|e| ConfigError::new("url", e));
    }
    // Check the scheme and shape with placeholder values filled in.
    let sample = template.as_str().replace(['{', '}'], "");
    parse_url(&sample).map_err(|e| ConfigError::new("url", e))?;
    Ok(None)
}

/// Parses an endpoint URL; messages show it without its password.
pub(super) fn parse_url(text: &str) -> Result<Url, String> {
    let shown = postbox::redact::redact(text);
    let url = Url::parse(text).map_err(|e| format!("{shown:?} is not a URL: {e}"))?;
    match url.scheme() {
        "http" | "https" => Ok(url),
        other => Err(format!("{shown:?} has scheme {other:?}; use http or https")),
    }
}

/// The URL without user name and password, for messages.
pub(super) fn redact_url(url: &Url) -> String {
    let mut shown = url.clone();
    let _ = shown.set_password(None);
    let _ = shown.set_username("");
    // Secret query parameters (`?token=…`) too: messages end up in logs and `last_error`.
    postbox::redact::redact(shown.as_str())
}

/// Whether `value`, percent-decoded, is `.` or `..`.
pub(super) fn is_dot_segment(value: &str) -> bool {
    let decoded = value.to_ascii_lowercase().replace("%2e", ".");
    decoded == "." || decoded == ".."
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
pub(super) fn percent_encode(value: &str, out: &mut String) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in value.as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xf)]));
        }
    }
}
