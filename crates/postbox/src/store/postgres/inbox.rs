//! The PostgreSQL inbox: its consumers' statistics.

use super::{PgStore, map_missing_table};
use crate::error::Result;
use crate::inbox::InboxStats;
use crate::schema::Target;
use crate::sql::safe;

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
