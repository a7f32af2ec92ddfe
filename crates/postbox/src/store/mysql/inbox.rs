//! The MySQL inbox: its consumers' statistics.

use super::MySqlStore;
use crate::error::Result;
use crate::inbox::InboxStats;
use crate::schema::Target;

impl MySqlStore {
    /// [`StoreOps::inbox_stats`](crate::ops::StoreOps::inbox_stats).
    pub(super) async fn read_inbox_stats(&self, target: &Target) -> Result<Vec<InboxStats>> {
        Self::check_target(target)?;
        let rows: Vec<(String, i64, i64)> =
            sqlx::query_as(include_str!("../../../sql/mysql/inbox_stats.sql"))
                .bind(crate::store::INBOX_COUNT_LIMIT)
                .fetch_all(&self.pool)
                .await
                .map_err(|e| self.missing(e))?;
        Ok(crate::store::inbox_stats(rows))
    }
}
