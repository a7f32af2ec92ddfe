//! The state of a MySQL outbox: status counts, the backlog and the oldest transaction.

use std::time::Duration;

use sqlx::Row;

use super::{MySqlStore, ordered_json};
use crate::error::Result;
use crate::schema::Target;
use crate::store::{Backlog, EXACT_PROCESSED_COUNT, StatusCounts, secs};

impl MySqlStore {
    /// [`StoreOps::status_counts`](crate::ops::StoreOps::status_counts).
    pub(super) async fn count_statuses(&self, target: &Target) -> Result<StatusCounts> {
        Self::check_target(target)?;
        let row = sqlx::query(include_str!("../../../sql/mysql/queries/status_counts.sql"))
            .bind(EXACT_PROCESSED_COUNT + 1)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.missing(e))?;
        let counted: i64 = row.try_get(2)?;
        let (processed, processed_exact) = if counted > EXACT_PROCESSED_COUNT {
            // Past the exact limit: the table's row estimate less the other statuses.
            let estimate: Option<i64> =
                sqlx::query_scalar(include_str!("../../../sql/mysql/queries/table_rows.sql"))
                    .fetch_optional(&self.pool)
                    .await?
                    .flatten();
            let others: i64 =
                row.try_get::<i64, _>(0)? + row.try_get::<i64, _>(1)? + row.try_get::<i64, _>(3)?;
            (
                estimate.map_or(counted, |e| (e - others).max(counted)),
                false,
            )
        } else {
            (counted, true)
        };
        Ok(StatusCounts {
            pending: row.try_get(0)?,
            processing: row.try_get(1)?,
            processed,
            processed_exact,
            failed: row.try_get(3)?,
            oldest_pending_age: secs(row.try_get(4)?),
            dead_tuples: None,
        })
    }

    /// [`Store::backlog`](crate::Store::backlog).
    pub(super) async fn read_backlog(
        &self,
        target: &Target,
        ordered: &[String],
    ) -> Result<Backlog> {
        Self::check_target(target)?;
        let ordered = ordered_json(ordered)?;
        let due: Option<f64> =
            sqlx::query_scalar(include_str!("../../../sql/mysql/queries/backlog.sql"))
                .bind(&ordered)
                .bind(&ordered)
                .fetch_one(&self.pool)
                .await
                .map_err(|e| self.missing(e))?;
        Ok(Backlog {
            next_due_in: secs(due),
        })
    }

    /// [`StoreOps::oldest_transaction_age`](crate::ops::StoreOps::oldest_transaction_age).
    pub(super) async fn oldest_transaction(&self) -> Result<Option<Duration>> {
        // A long transaction keeps InnoDB's purge from removing old row versions.
        let age: Option<f64> = sqlx::query_scalar(include_str!(
            "../../../sql/mysql/queries/oldest_transaction.sql"
        ))
        .fetch_one(&self.pool)
        .await?;
        Ok(secs(age))
    }
}
