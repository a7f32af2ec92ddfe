//! The state of an SQLite outbox: status counts and the backlog.

use sqlx::Row;

use super::{SqliteStore, map_missing_table};
use crate::error::Result;
use crate::schema::Target;
use crate::store::{Backlog, StatusCounts, secs};

impl SqliteStore {
    /// [`StoreOps::status_counts`](crate::ops::StoreOps::status_counts).
    pub(super) async fn count_statuses(&self, target: &Target) -> Result<StatusCounts> {
        Self::check_target(target)?;
        let row = sqlx::query(include_str!(
            "../../../sql/sqlite/queries/status_counts.sql"
        ))
        .fetch_one(&self.pool)
        .await
        .map_err(map_missing_table)?;
        Ok(StatusCounts {
            pending: row.try_get(0)?,
            processing: row.try_get(1)?,
            processed: row.try_get(2)?,
            failed: row.try_get(3)?,
            oldest_pending_age: secs(row.try_get(4)?),
            dead_tuples: row.try_get(5)?,
            processed_exact: true,
        })
    }

    /// [`Store::backlog`](crate::Store::backlog).
    pub(super) async fn read_backlog(
        &self,
        target: &Target,
        ordered: &[String],
    ) -> Result<Backlog> {
        Self::check_target(target)?;
        let query = if ordered.is_empty() {
            sqlx::query(include_str!("../../../sql/sqlite/queries/backlog.sql"))
        } else {
            sqlx::query(include_str!(
                "../../../sql/sqlite/queries/backlog_ordered.sql"
            ))
            .bind(serde_json::to_string(ordered)?)
        };
        let row = query
            .fetch_one(&self.pool)
            .await
            .map_err(map_missing_table)?;
        Ok(Backlog {
            next_due_in: secs(row.try_get(0)?),
        })
    }
}
