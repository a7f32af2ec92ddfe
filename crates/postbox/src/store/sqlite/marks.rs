//! What SQLite relays and operators write on claimed or failed events: leases renewed, events
//! processed, failed, released, retried and skipped.

use super::{SqliteStore, ids_json, map_missing_table, ms};
use crate::error::Result;
use crate::schema::Target;
use crate::store::{
    FailedMark, MarkFailedParams, MarkProcessedParams, ReleaseParams, RenewParams,
    RetryFailedParams, SlowLaneParams, storable_error,
};

impl SqliteStore {
    /// [`Store::leases_renew`](crate::Store::leases_renew).
    pub(super) async fn renew(&self, p: &RenewParams<'_>) -> Result<u64> {
        Self::check_target(p.target)?;
        let done = sqlx::query(include_str!("../../../sql/sqlite/queries/renew.sql"))
            .bind(ids_json(p.ids))
            .bind(p.claim_token.to_string())
            .bind(ms(p.lease))
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    /// [`Store::events_mark_processed`](crate::Store::events_mark_processed).
    pub(super) async fn mark_processed(&self, p: &MarkProcessedParams<'_>) -> Result<u64> {
        Self::check_target(p.target)?;
        if p.ids.is_empty() {
            return Ok(0);
        }
        let done = sqlx::query(include_str!(
            "../../../sql/sqlite/queries/mark_processed.sql"
        ))
        .bind(ids_json(p.ids))
        .bind(p.claim_token.to_string())
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    /// [`Store::events_mark_failed`](crate::Store::events_mark_failed).
    pub(super) async fn mark_failed(&self, p: &MarkFailedParams<'_>) -> Result<Vec<FailedMark>> {
        Self::check_target(p.target)?;
        if p.tries.is_empty() {
            return Ok(Vec::new());
        }
        let token = p.claim_token.to_string();
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let mut marks = Vec::with_capacity(p.tries.len());
        for t in p.tries {
            let row: Option<(i64, i32, bool)> =
                sqlx::query_as(include_str!("../../../sql/sqlite/queries/mark_failed.sql"))
                    .bind(t.id)
                    .bind(storable_error(&t.error))
                    .bind(t.permanent)
                    .bind(&token)
                    .bind(ms(p.retry.base))
                    .bind(ms(p.retry.cap))
                    .bind(t.max_retries)
                    .fetch_optional(&mut *tx)
                    .await?;
            if let Some((id, retry_count, gave_up)) = row {
                marks.push(FailedMark {
                    id,
                    retry_count,
                    gave_up,
                });
            }
        }
        tx.commit().await?;
        Ok(marks)
    }

    /// [`Store::events_release`](crate::Store::events_release).
    pub(super) async fn release(&self, p: &ReleaseParams<'_>) -> Result<u64> {
        Self::check_target(p.target)?;
        if p.releases.is_empty() {
            return Ok(0);
        }
        let token = p.claim_token.to_string();
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let mut released = 0;
        for r in p.releases {
            released += sqlx::query(include_str!("../../../sql/sqlite/queries/release.sql"))
                .bind(r.id)
                .bind(storable_error(&r.error))
                .bind(ms(r.delay))
                .bind(&token)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        }
        tx.commit().await?;
        Ok(released)
    }

    /// [`StoreOps::events_retry_failed`](crate::ops::StoreOps::events_retry_failed).
    pub(super) async fn retry_failed(&self, p: &RetryFailedParams<'_>) -> Result<u64> {
        Self::check_target(p.target)?;
        let done = sqlx::query(include_str!("../../../sql/sqlite/queries/retry_failed.sql"))
            .bind(p.ids.map(ids_json))
            .execute(&self.pool)
            .await
            .map_err(map_missing_table)?;
        Ok(done.rows_affected())
    }

    /// [`StoreOps::events_retry_slow_lane`](crate::ops::StoreOps::events_retry_slow_lane).
    pub(super) async fn retry_slow_lane(&self, p: &SlowLaneParams<'_>) -> Result<u64> {
        Self::check_target(p.target)?;
        let exclude: Vec<&str> = p.exclude.iter().map(|g| g.to_sqlite_glob()).collect();
        let done = sqlx::query(include_str!(
            "../../../sql/sqlite/queries/retry_slow_lane.sql"
        ))
        .bind(p.after.as_secs_f64())
        .bind(i64::from(p.max_tries))
        .bind(i64::from(p.batch_size))
        .bind(serde_json::to_string(&exclude)?)
        .execute(&self.pool)
        .await
        .map_err(map_missing_table)?;
        Ok(done.rows_affected())
    }

    /// [`StoreOps::events_skip`](crate::ops::StoreOps::events_skip).
    pub(super) async fn skip(&self, target: &Target, ids: &[i64]) -> Result<Vec<i64>> {
        Self::check_target(target)?;
        let mut skipped: Vec<i64> =
            sqlx::query_scalar(include_str!("../../../sql/sqlite/queries/skip.sql"))
                .bind(ids_json(ids))
                .fetch_all(&self.pool)
                .await
                .map_err(map_missing_table)?;
        skipped.sort_unstable();
        Ok(skipped)
    }
}
