//! What a relay tells its subscribers as it happens: the raw material of alerts.

/// How many notices a slow subscriber may fall behind before it misses the oldest.
pub(super) const CAPACITY: usize = 1024;

/// Something an operator should hear about, sent by a relay to its subscribers
/// ([`Relay::subscribe`](super::Relay::subscribe)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Notice {
    /// An event went `FAILED`: out of tries, refused for good by its destination, or unreadable.
    Failed(FailedNotice),
}

/// An event that went `FAILED`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct FailedNotice {
    /// Its tenant (`default` for the default outbox).
    pub tenant: String,
    /// Its id.
    pub event_id: i64,
    /// Its type (`(unreadable)` for a row that could not be decoded).
    pub event_type: String,
    /// The tries it had.
    pub retry_count: i32,
    /// The last error (redacted, as stored).
    pub error: String,
}

impl FailedNotice {
    /// A notice (for tests of alert senders; relays make their own).
    pub fn new(
        tenant: impl Into<String>,
        event_id: i64,
        event_type: impl Into<String>,
        retry_count: i32,
        error: impl Into<String>,
    ) -> Self {
        FailedNotice {
            tenant: tenant.into(),
            event_id,
            event_type: event_type.into(),
            retry_count,
            error: error.into(),
        }
    }
}
