//! The PostgreSQL inbox: what an inbox keeps (its statement for the schema), the record of a
//! message received, and the consumers' statistics.

use std::sync::Arc;

use sqlx::postgres::PgConnection;

use super::sql::{render, safe};
use super::{PgStore, map_missing_table};
use crate::error::Result;
use crate::inbox::{Inbox, InboxStats};
use crate::schema::{SchemaName, Target};

/// What an inbox keeps on PostgreSQL: its statement, rendered for its schema.
#[derive(Clone, Debug)]
pub(crate) struct Prepared {
    receive: Arc<str>,
}

impl Prepared {
    pub(crate) fn new(schema: &SchemaName) -> Self {
        Prepared {
            receive: render(
                include_str!("../../../sql/postgres/queries/inbox_receive.sql"),
                schema,
            ),
        }
    }
}

/// Records that `inbox`'s consumer handles `message_id`, in `conn`'s transaction: whether it is
/// new.
pub(crate) async fn receive(
    inbox: &Inbox,
    prepared: &Prepared,
    conn: &mut PgConnection,
    message_id: &str,
) -> Result<bool> {
    Ok(sqlx::query_scalar::<_, bool>(safe(&prepared.receive))
        .bind(inbox.consumer())
        .bind(message_id)
        .fetch_one(conn)
        .await?)
}

impl PgStore {
    /// [`StoreOps::inbox_stats`](crate::ops::StoreOps::inbox_stats).
    pub(super) async fn read_inbox_stats(&self, target: &Target) -> Result<Vec<InboxStats>> {
        let sql = self.sql.get(&target.schema);
        let rows: Vec<(String, i64, i64)> = sqlx::query_as(safe(&sql.inbox_stats))
            .bind(crate::store::INBOX_COUNT_LIMIT)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| map_missing_table(e, &target.schema))?;
        Ok(crate::store::inbox_stats(rows))
    }
}
