//! The MySQL inbox: the record of a message received, and the consumers' statistics.

use sqlx::mysql::MySqlConnection;

use super::MySqlStore;
use crate::error::Result;
use crate::inbox::{Inbox, InboxStats};
use crate::schema::{SchemaName, Target};

/// What an inbox keeps for MySQL: nothing, its statement names no schema.
#[derive(Clone, Debug)]
pub(crate) struct Prepared;

impl Prepared {
    pub(crate) fn new(_schema: &SchemaName) -> Self {
        Prepared
    }
}

/// Records that `inbox`'s consumer handles `message_id`, in `conn`'s transaction: whether it is
/// new.
pub(crate) async fn receive(
    inbox: &Inbox,
    _prepared: &Prepared,
    conn: &mut MySqlConnection,
    message_id: &str,
) -> Result<bool> {
    Ok(
        sqlx::query(include_str!("../../../sql/mysql/queries/inbox_receive.sql"))
            .bind(inbox.consumer())
            .bind(message_id)
            .execute(conn)
            .await?
            .rows_affected()
            == 1,
    )
}

impl MySqlStore {
    /// [`StoreOps::inbox_stats`](crate::ops::StoreOps::inbox_stats).
    pub(super) async fn read_inbox_stats(&self, target: &Target) -> Result<Vec<InboxStats>> {
        Self::check_target(target)?;
        let rows: Vec<(String, i64, i64)> =
            sqlx::query_as(include_str!("../../../sql/mysql/queries/inbox_stats.sql"))
                .bind(crate::store::INBOX_COUNT_LIMIT)
                .fetch_all(&self.pool)
                .await
                .map_err(|e| self.missing(e))?;
        Ok(crate::store::inbox_stats(rows))
    }
}
