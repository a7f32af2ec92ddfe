//! What can stop a CDC relay from starting, each naming what to do.

/// Why a CDC relay cannot read the outbox from a replication slot.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The server does not decode its WAL logically.
    #[error(
        "PostgreSQL runs with wal_level = {found}; the CDC relay needs logical: run \
         `ALTER SYSTEM SET wal_level = logical` as a superuser and restart PostgreSQL \
         (or relay by polling: leave out --source cdc)"
    )]
    WalLevel {
        /// The server's `wal_level`.
        found: String,
    },
    /// The role may not open a replication connection.
    #[error(
        "role {role} may not read a replication slot: run `ALTER ROLE \"{role}\" REPLICATION` \
         as a superuser (and allow it a `replication` line in pg_hba.conf where the server needs one)"
    )]
    NoReplication {
        /// The role the relay connects as.
        role: String,
    },
    /// A slot or publication name PostgreSQL would not take as it is.
    #[error("invalid {what} name {name:?}: {problem}")]
    InvalidName {
        /// `slot` or `publication`.
        what: &'static str,
        /// The name given.
        name: String,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// No free replication slot (or WAL sender) on the server.
    #[error(
        "PostgreSQL has no free replication slot for {slot}: raise max_replication_slots and \
         max_wal_senders (a restart), or drop an unused slot (SELECT slot_name, active FROM \
         pg_replication_slots)"
    )]
    NoSlotLeft {
        /// The slot the relay wanted.
        slot: String,
    },
    /// The database answered with an error.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// The outbox store answered with an error.
    #[error(transparent)]
    Store(#[from] postbox::Error),
}

/// The result of a CDC setup step.
pub type Result<T, E = Error> = std::result::Result<T, E>;
