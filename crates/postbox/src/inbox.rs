//! The consumers' end of the wire: an inbox that makes handling a message effectively once.
//!
//! Postbox publishes at least once, so a consumer can see a message again: a broker's
//! redelivery, an operator's replay (which keeps the original dedup id), a relay that took over
//! an expired lease and published a batch a second time. An [`Inbox`] records, in the
//! consumer's own database transaction, that the consumer handled a message; the record and
//! whatever handling the message changed commit together or not at all. So a repeat finds the
//! record and is skipped, and a consumer that dies before its commit leaves no record: the
//! message is handled when it comes again. See `docs/guarantees.md` (I1) for what this covers
//! and what it does not (effects outside the consumer's database).
//!
//! Records live in `inbox_messages` beside the outbox tables (created by
//! [`StoreOps::schema_migrate`](crate::ops::StoreOps::schema_migrate) and `postbox migrate`), keyed by
//! consumer name and message id, and are kept for the dedup window: relays purge them past
//! [`RelayConfig::inbox_retention`](crate::RelayConfig::inbox_retention) (7 days by default),
//! `postbox purge --inbox` does it by hand. Services in other languages call the SQL function
//! `postbox_inbox_receive(consumer, message_id)` inside their transaction (PostgreSQL;
//! `docs/sql-api.md`).

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::outbox::{InboxPrepared, OutboxConnection};
use crate::schema::{SchemaName, Tenant};

/// The longest consumer name, in characters (`inbox_messages.consumer`).
pub const MAX_CONSUMER_LEN: usize = 100;

/// The longest message id, in characters (`inbox_messages.message_id`): the longest dedup id
/// Postbox sends, an idempotency key of 255 characters.
pub const MAX_MESSAGE_ID_LEN: usize = 255;

/// What [`Inbox::receive`] found: whether the consumer is to handle the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a duplicate must be skipped: check whether the message is new"]
pub enum Received {
    /// The first delivery this consumer sees (within the dedup window): handle it in the same
    /// transaction, then commit.
    New,
    /// A repeat of a message whose handling has committed: skip it (commit or drop the
    /// transaction, and acknowledge the message).
    Duplicate,
}

impl Received {
    /// Whether the message is to be handled.
    pub fn is_new(self) -> bool {
        self == Received::New
    }
}

/// A consumer's inbox: records the messages it has handled, in its own transactions.
///
/// Get one from the store of the database the consumer writes its business rows to
/// ([`StoreExt::inbox`](crate::StoreExt::inbox)); [`tenant`](Self::tenant) points it at a tenant's
/// schema. Cheap to clone.
///
/// ```no_run
/// use postbox::inbox::Received;
/// use postbox::StoreExt;
///
/// # #[cfg(feature = "postgres")]
/// # async fn example(pool: sqlx::PgPool, message_id: &str, amount: i64) -> anyhow::Result<()> {
/// let inbox = postbox::PgStore::new(pool.clone()).inbox("billing.invoice-created")?;
/// // For each message (its dedup id from the postbox-dedup-id header, Nats-Msg-Id, …):
/// let mut tx = pool.begin().await?;
/// if inbox.receive(&mut tx, message_id).await? == Received::New {
///     sqlx::query("UPDATE accounts SET balance = balance + $1 WHERE id = 7")
///         .bind(amount)
///         .execute(&mut *tx)
///         .await?;
/// }
/// tx.commit().await?; // the effect and the record, or neither
/// // … then acknowledge the message to the broker.
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Inbox {
    consumer: Arc<str>,
    schema: SchemaName,
    /// What each database keeps for this inbox (its statement for the schema).
    prepared: InboxPrepared,
}

impl Inbox {
    /// The inbox of `consumer` in `schema`; refuses an empty or too long name.
    pub(crate) fn new(consumer: &str, schema: SchemaName) -> Result<Self> {
        check("consumer", consumer, MAX_CONSUMER_LEN)?;
        Ok(Inbox::in_schema(&Arc::from(consumer), schema))
    }

    /// The same consumer's inbox in `tenant`'s schema, as the tenant registry has it.
    pub fn tenant(self, tenant: &Tenant) -> Self {
        Inbox::in_schema(&self.consumer, tenant.schema.clone())
    }

    fn in_schema(consumer: &Arc<str>, schema: SchemaName) -> Self {
        Inbox {
            consumer: Arc::clone(consumer),
            prepared: InboxPrepared::new(&schema),
            schema,
        }
    }

    /// The consumer's name.
    pub fn consumer(&self) -> &str {
        &self.consumer
    }

    /// What each database keeps for this inbox.
    pub(crate) fn prepared(&self) -> &InboxPrepared {
        &self.prepared
    }

    /// The schema whose `inbox_messages` this inbox writes to (PostgreSQL; SQLite has one per
    /// file, MySQL one per database).
    pub fn schema(&self) -> &SchemaName {
        &self.schema
    }

    /// Records that this consumer handles `message_id`, through `conn`: the transaction in
    /// which the consumer applies the message's effect. Returns [`Received::New`] the first
    /// time, [`Received::Duplicate`] when a transaction that recorded the same message has
    /// committed (its count of duplicates goes up).
    ///
    /// A concurrent first delivery of the same message (two consumer instances, say) waits
    /// here until the other transaction ends, and gets [`Received::Duplicate`] if that one
    /// committed, [`Received::New`] if it rolled back. An id that is empty or longer than
    /// [`MAX_MESSAGE_ID_LEN`] is refused ([`Error::InvalidMessage`]) before anything is sent.
    pub async fn receive<C>(&self, conn: &mut C, message_id: &str) -> Result<Received>
    where
        C: OutboxConnection + ?Sized,
    {
        check("message_id", message_id, MAX_MESSAGE_ID_LEN)?;
        let new = conn.outbox_connection().receive(self, message_id).await?;
        Ok(if new {
            Received::New
        } else {
            Received::Duplicate
        })
    }
}

/// Refuses an empty `value`, or one longer than `max` characters.
fn check(field: &'static str, value: &str, max: usize) -> Result<()> {
    let len = value.chars().count();
    if len == 0 || len > max {
        return Err(Error::InvalidMessage {
            field,
            reason: format!("must be 1 to {max} characters, got {len}"),
        });
    }
    Ok(())
}

/// One consumer of an inbox, as the status report shows it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct InboxStats {
    /// The consumer's name.
    pub consumer: String,
    /// Messages recorded (within the dedup window), counted up to
    /// [`INBOX_COUNT_LIMIT`]: at the limit, at least that many.
    pub messages: i64,
    /// Repeats skipped (by transactions that committed).
    pub duplicates: i64,
}

impl InboxStats {
    /// One consumer's figures (for stores outside this crate).
    pub fn new(consumer: String, messages: i64, duplicates: i64) -> Self {
        InboxStats {
            consumer,
            messages,
            duplicates,
        }
    }

    /// Whether [`messages`](Self::messages) is exact (below [`INBOX_COUNT_LIMIT`]).
    pub fn messages_exact(&self) -> bool {
        self.messages < INBOX_COUNT_LIMIT
    }
}

/// The count of an inbox's messages past which the status report stops counting (one
/// consumer's rows are read up to this many).
pub const INBOX_COUNT_LIMIT: i64 = 100_000;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn names_and_ids_are_checked_by_length_in_characters() {
        assert!(check("consumer", "", 100).is_err());
        assert!(check("consumer", &"é".repeat(100), 100).is_ok());
        let err = check("message_id", &"x".repeat(256), 255).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid message: message_id must be 1 to 255 characters, got 256"
        );
    }
}
