//! The library's error type.

/// Everything that can go wrong in Postbox's library calls.
///
/// Each variant says what was wrong; the messages tell an operator what to do about it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An event was refused before anything was written, because one of its fields is invalid
    /// (too long, too large, not serializable).
    #[error("invalid event: {field} {reason}")]
    InvalidEvent {
        /// The event field that is wrong, e.g. `event_type` or `payload`.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },

    /// A schema or tenant name was refused; nothing was touched.
    #[error("invalid {kind} name {name:?}: {reason}")]
    InvalidName {
        /// `schema` or `tenant`.
        kind: &'static str,
        /// The name as given (already refused, shown for the operator).
        name: String,
        /// Why it was refused.
        reason: &'static str,
    },

    /// A business statement given to [`Outbox::enqueue_with`](crate::Outbox::enqueue_with) was
    /// refused before anything was sent (empty, or a placeholder without its bound value).
    #[error("invalid business statement: {0}")]
    InvalidStatement(String),

    /// A new event's id was taken already: the outbox table's id sequence is behind its highest
    /// id (a restore or a replication cut-over that left the sequence behind, or a producer that
    /// sets ids by hand). Nothing was written, and the caller's transaction cannot commit the
    /// event; it is never reported as a duplicate.
    #[error(
        "the new event's id is taken in {schema}.outbox_events: the table's id sequence is behind its highest id (after a restore, or a producer that sets ids by hand); nothing was written. Move the sequence past the highest id, e.g. on PostgreSQL: SELECT setval(pg_get_serial_sequence('{schema}.outbox_events', 'id'), (SELECT max(id) FROM {schema}.outbox_events))"
    )]
    IdTaken {
        /// The schema whose outbox table holds the colliding row (`main` on SQLite).
        schema: String,
    },

    /// A consumer name or message id given to an [`Inbox`](crate::inbox::Inbox) was refused
    /// before anything was written (empty, or too long for `inbox_messages`).
    #[error("invalid message: {field} {reason}")]
    InvalidMessage {
        /// `consumer` or `message_id`.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },

    /// A filter over events (list, replay) was refused before anything was read: a status
    /// that does not exist, a time range backwards, an empty value.
    #[error("invalid filter: {field} {reason}")]
    InvalidFilter {
        /// The filter's field, e.g. `status`, `since/until`.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },

    /// A configuration value is out of range or inconsistent with another.
    #[error("invalid configuration: {field} {reason}")]
    InvalidConfig {
        /// The setting, by its configuration key (e.g. `publish_timeout`, `backoff_base`).
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },

    /// A tenant named in a call does not exist in the tenant registry.
    #[error("tenant {0:?} is not registered")]
    UnknownTenant(String),

    /// A tenant was added twice, or two tenants would share one schema.
    #[error("tenant {0:?} already exists (or its schema is taken by another tenant)")]
    TenantExists(String),

    /// The store does not support this operation (for example tenants on SQLite).
    #[error("{0}")]
    Unsupported(&'static str),

    /// The database's schema is older or newer than this version of Postbox expects.
    #[error(
        "the outbox tables in schema {schema:?} are not migrated; run the migrations first (postbox::migrate)"
    )]
    NotMigrated {
        /// The schema that lacks the outbox tables.
        schema: String,
    },

    /// The outbox table's id sequence cannot give ids the relay can rely on: a CACHE above 1 or
    /// an increment other than 1 (ids would not follow commit order), moved back below the
    /// table's ids (setval, `RESTART`), or not readable by the relay's role. Refused at
    /// `migrate` and by relays, rather than publishing out of order.
    #[error("{problem}; fix it with: {fix}")]
    UnsafeSequence {
        /// The schema of the outbox table.
        schema: String,
        /// What is wrong, as the database found it.
        problem: String,
        /// The statement that fixes it.
        fix: String,
    },

    /// The relay's database role may not vacuum a schema's outbox table.
    #[error(
        "the database role does not own {schema}.outbox_events, so it cannot vacuum it; run the relay as the table's owner, or set vacuum_threshold off and let autovacuum keep up"
    )]
    NotOwner {
        /// The schema.
        schema: String,
    },

    /// An index of the outbox table that is built without blocking writes (`CREATE INDEX
    /// CONCURRENTLY`, after the migrations) could not be built, usually because a transaction
    /// stayed open for the whole wait. The outbox works without it, more slowly.
    #[error(
        "the index {index} of {schema}.outbox_events could not be built ({reason}); the outbox works without it, but claims of retried events walk more of the table. A transaction that stays open (a pg_dump, a long report) holds the build back: run `postbox migrate` again once it has ended"
    )]
    IndexNotBuilt {
        /// The schema.
        schema: String,
        /// The index.
        index: &'static str,
        /// Why, as the database said.
        reason: String,
    },

    /// A drain gave up: its events' destinations stayed unavailable for the drain's patience
    /// ([`RelayConfig::drain_patience`](crate::RelayConfig::drain_patience)). Those events are
    /// `PENDING`, with no try spent; nothing was lost.
    #[error(
        "the destination has been unavailable for {waited:?} ({reason}); {deferred} event(s) were put back and stay PENDING with no try spent. Bring the destination back and drain again"
    )]
    Unavailable {
        /// Times events were put back during the wait.
        deferred: u64,
        /// How long the drain waited without progress.
        waited: std::time::Duration,
        /// The last reason the destination gave (redacted).
        reason: String,
    },

    /// The database reported an error (connection lost, constraint, syntax…).
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),

    /// JSON (de)serialization failed.
    #[error("JSON error: {0}")]
    Json(#[from] serde_json::Error),
}

impl Error {
    /// Whether retrying cannot help until an operator acts (tables not migrated, an invalid
    /// name, an unsupported operation), as opposed to a transient database error.
    pub fn needs_operator(&self) -> bool {
        matches!(
            self,
            Error::NotMigrated { .. }
                | Error::UnsafeSequence { .. }
                | Error::InvalidName { .. }
                | Error::Unsupported(_)
                | Error::InvalidConfig { .. }
                | Error::InvalidFilter { .. }
        )
    }

    /// Whether a statement gave up waiting for a lock (PostgreSQL's `lock_timeout`, SQLSTATE
    /// 55P03): its table is locked by another session (a migration's `ALTER TABLE`, `VACUUM
    /// FULL`, `LOCK TABLE`).
    pub(crate) fn is_lock_timeout(&self) -> bool {
        matches!(self, Error::Database(sqlx::Error::Database(db)) if db.code().as_deref() == Some("55P03"))
    }

    pub(crate) fn invalid_config(field: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidConfig {
            field,
            reason: reason.into(),
        }
    }

    pub(crate) fn invalid_event(field: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidEvent {
            field,
            reason: reason.into(),
        }
    }
}

/// `Result` with Postbox's [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
