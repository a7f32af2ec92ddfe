//! The admin API's bearer token: compared in constant time, never shown.

use std::fmt;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::AdminError;

/// Shortest token accepted: guessing one must be out of reach.
const MIN_LEN: usize = 16;

/// The bearer token every `/api` route (and every unknown path) requires.
///
/// Kept as its SHA-256 digest and compared digest to digest in constant time, so neither the
/// token's bytes nor its length leak through response timing. Its `Debug` shows `***`.
///
/// ```
/// let token = postbox_admin::Token::new("a-long-random-token-0123").unwrap();
/// assert!(postbox_admin::Token::new("short").is_err());
/// # let _ = token;
/// ```
#[derive(Clone)]
pub struct Token {
    digest: [u8; 32],
    /// What the page's session cookie holds: a digest of the token under another label, so the
    /// cookie opens the page but is not the bearer token of the API.
    session: [u8; 32],
}

/// The label the session digest is taken under.
const SESSION_LABEL: &[u8] = b"postbox-admin-page-session:";

impl Token {
    /// A token of at least 16 characters, with no whitespace or control characters (it travels
    /// in an HTTP header).
    pub fn new(token: &str) -> Result<Self, AdminError> {
        if token.chars().count() < MIN_LEN {
            return Err(AdminError::InvalidToken(format!(
                "is {} characters long; use at least {MIN_LEN} (for example `openssl rand -hex 24`)",
                token.chars().count()
            )));
        }
        if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(AdminError::InvalidToken(
                "contains whitespace or control characters".to_owned(),
            ));
        }
        let mut session = Sha256::new();
        session.update(SESSION_LABEL);
        session.update(token.as_bytes());
        Ok(Token {
            digest: Sha256::digest(token.as_bytes()).into(),
            session: session.finalize().into(),
        })
    }

    /// Whether `candidate` is this token.
    pub fn matches(&self, candidate: &str) -> bool {
        let digest: [u8; 32] = Sha256::digest(candidate.as_bytes()).into();
        self.digest.ct_eq(&digest).into()
    }

    /// The value of the page's session cookie, in hex.
    pub(crate) fn session_value(&self) -> String {
        self.session.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Whether `candidate` is the session cookie's value (compared in constant time).
    pub(crate) fn matches_session(&self, candidate: &str) -> bool {
        let expected = self.session_value();
        candidate.len() == expected.len()
            && bool::from(candidate.as_bytes().ct_eq(expected.as_bytes()))
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(***)")
    }
}

/// The token of an `Authorization: Bearer …` header.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Lets a request through only with the right token. A request without one, or with a wrong
/// one, gets the same bare 401 whatever its path: nothing tells a caller what exists.
pub(crate) async fn require_token(
    State(token): State<Option<Token>>,
    request: Request,
    next: Next,
) -> Response {
    let allowed = match (&token, bearer(request.headers())) {
        (Some(token), Some(candidate)) => token.matches(candidate),
        _ => false,
    };
    if allowed {
        next.run(request).await
    } else {
        unauthorized()
    }
}

fn unauthorized() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        axum::Json(serde_json::json!({ "error": "unauthorized" })),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn tokens_match_only_themselves() {
        let token = Token::new("0123456789abcdef-token").unwrap();
        assert!(token.matches("0123456789abcdef-token"));
        assert!(!token.matches("0123456789abcdef-tokem"));
        assert!(!token.matches(""));
        assert!(!token.matches("0123456789abcdef-token "));
        assert_eq!(format!("{token:?}"), "Token(***)");
    }

    #[test]
    fn the_session_value_is_not_the_token() {
        let token = Token::new("0123456789abcdef-token").unwrap();
        let session = token.session_value();
        assert_eq!(session.len(), 64);
        assert!(token.matches_session(&session));
        assert!(!token.matches(&session), "the cookie is no bearer token");
        assert!(!token.matches_session("0123456789abcdef-token"));
        assert!(!token.matches_session(&session[..63]));
        let other = Token::new("0123456789abcdef-other").unwrap();
        assert!(!other.matches_session(&session));
    }

    #[test]
    fn weak_tokens_are_refused_with_the_reason() {
        let err = Token::new("short").unwrap_err().to_string();
        assert!(err.contains("at least 16"), "{err}");
        let err = Token::new("a token with spaces in it")
            .unwrap_err()
            .to_string();
        assert!(err.contains("whitespace"), "{err}");
    }

    #[test]
    fn bearer_headers_are_read_in_any_case() {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, "bearer abc".parse().unwrap());
        assert_eq!(bearer(&headers), Some("abc"));
        headers.insert(header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(bearer(&headers), None);
    }
}
