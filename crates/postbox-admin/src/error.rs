//! What can go wrong starting the admin server, and how an API error reaches the caller.

use std::net::SocketAddr;

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// An error starting or running the admin server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// The address could not be bound (in use, not this host's, no permission).
    #[error("cannot listen on {addr}: {source}; pick another address or stop what holds it")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// A non-loopback address without a token: anyone who can reach it could act on events.
    #[error(
        "refusing to serve the admin API on {0}, which is not a loopback address, without a token; \
         set POSTBOX_ADMIN_TOKEN (or listen on 127.0.0.1)"
    )]
    NoToken(SocketAddr),
    /// A token too weak to guard anything.
    #[error("the admin token {0}")]
    InvalidToken(String),
    /// The alert configuration is wrong (the message names the key).
    #[error("invalid alert configuration: {0}")]
    InvalidAlerts(String),
    /// The metrics recorder could not be installed (another one is).
    #[error("cannot install the Prometheus metrics recorder: {0}")]
    Metrics(String),
    /// The server stopped on an I/O error.
    #[error("the admin server stopped: {0}")]
    Serve(#[source] std::io::Error),
}

/// An API error: a status and a message the caller can act on, as `{"error": "…"}`.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
        }
    }

    /// What went wrong, as the API's `error` field says it.
    pub(crate) fn message(&self) -> &str {
        &self.message
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }
}

impl From<postbox::Error> for ApiError {
    fn from(e: postbox::Error) -> Self {
        match &e {
            postbox::Error::InvalidFilter { field, reason } => {
                ApiError::bad_request(format!("parameter {field}: {reason}"))
            }
            postbox::Error::UnknownTenant(id) => {
                ApiError::not_found(format!("no tenant {id:?} in the registry"))
            }
            postbox::Error::InvalidName { .. } => ApiError::bad_request(e.to_string()),
            postbox::Error::NotMigrated { .. } | postbox::Error::Unsupported(_) => {
                ApiError::new(StatusCode::CONFLICT, e.to_string())
            }
            _ => {
                tracing::warn!(error = %e, "admin API request failed");
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(serde_json::json!({ "error": self.message })),
        )
            .into_response()
    }
}
