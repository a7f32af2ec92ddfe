//! What PostgreSQL relays and operators write on claimed or failed events: leases renewed,
//! events processed, failed, released, retried and skipped.

use sqlx::Row;

use super::sql::safe;
use super::{PgStore, map_missing_table, ms};
use crate::error::Result;
use crate::schema::Target;
use crate::store::{
    FailedMark, MarkFailedParams, MarkProcessedParams, ReleaseParams, RenewParams,
    RetryFailedParams, SlowLaneParams, storable_error,
};

impl PgStore {
    /// [`Store::leases_renew`](crate::Store::leases_renew).
    pub(super) async fn renew(&self, p: &RenewParams<'_>) -> Result<u64> {
        let sql = self.sql.get(&p.target.schema);
        let done = sqlx::query(safe(&sql.renew))
            .bind(p.ids)
            .bind(p.claim_token)
            .bind(ms(p.lease))
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    /// [`Store::events_mark_processed`](crate::Store::events_mark_processed).
    pub(super) async fn mark_processed(&self, p: &MarkProcessedParams<'_>) -> Result<u64> {
        if p.ids.is_empty() {
            return Ok(0);
        }
        let sql = self.sql.get(&p.target.schema);
        let done = sqlx::query(safe(&sql.mark_processed))
            .bind(p.ids)
            .bind(p.claim_token)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    /// [`Store::events_mark_failed`](crate::Store::events_mark_failed).
    pub(super) async fn mark_failed(&self, p: &MarkFailedParams<'_>) -> Result<Vec<FailedMark>> {
        if p.tries.is_empty() {
            return Ok(Vec::new());
        }
        let sql = self.sql.get(&p.target.schema);
        let ids: Vec<i64> = p.tries.iter().map(|t| t.id).collect();
        let errors: Vec<_> = p.tries.iter().map(|t| storable_error(&t.error)).collect();
        let permanent: Vec<bool> = p.tries.iter().map(|t| t.permanent).collect();
        let max_retries: Vec<Option<i32>> = p.tries.iter().map(|t| t.max_retries).collect();
        let rows = sqlx::query(safe(&sql.mark_failed))
            .bind(&ids)
            .bind(&errors)
            .bind(&permanent)
            .bind(p.claim_token)
            .bind(ms(p.retry.base))
            .bind(ms(p.retry.cap))
            .bind(&max_retries)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                Ok(FailedMark {
                    id: r.try_get(0)?,
                    retry_count: r.try_get(1)?,
                    gave_up: r.try_get(2)?,
                })
            })
            .collect()
    }

    /// [`Store::events_release`](crate::Store::events_release).
    pub(super) async fn release(&self, p: &ReleaseParams<'_>) -> Result<u64> {
        if p.releases.is_empty() {
            return Ok(0);
        }
        let sql = self.sql.get(&p.target.schema);
        let ids: Vec<i64> = p.releases.iter().map(|r| r.id).collect();
        let errors: Vec<_> = p
            .releases
            .iter()
            .map(|r| storable_error(&r.error))
            .collect();
        let delays: Vec<f64> = p.releases.iter().map(|r| ms(r.delay)).collect();
        let done = sqlx::query(safe(&sql.release))
            .bind(&ids)
            .bind(&errors)
            .bind(&delays)
            .bind(p.claim_token)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    /// [`StoreOps::events_retry_failed`](crate::ops::StoreOps::events_retry_failed).
    pub(super) async fn retry_failed(&self, p: &RetryFailedParams<'_>) -> Result<u64> {
        let sql = self.sql.get(&p.target.schema);
        let done = sqlx::query(safe(&sql.retry_failed))
            .bind(p.ids)
            .bind(crate::store::server::RETRIED_BY_OPERATOR)
            .execute(&self.pool)
            .await
            .map_err(|e| map_missing_table(e, &p.target.schema))?;
        Ok(done.rows_affected())
    }

    /// [`StoreOps::events_retry_slow_lane`](crate::ops::StoreOps::events_retry_slow_lane).
    pub(super) async fn retry_slow_lane(&self, p: &SlowLaneParams<'_>) -> Result<u64> {
        let sql = self.sql.get(&p.target.schema);
        let exclude: Vec<String> = p.exclude.iter().map(|g| g.to_like()).collect();
        let mut tx = self.pool.begin().await?;
        super::history::lock_wait(&mut tx, p.lock_wait).await?;
        let done = sqlx::query(safe(&sql.retry_slow_lane))
            .bind(p.after.as_secs_f64())
            .bind(i32::try_from(p.max_tries).unwrap_or(i32::MAX))
            .bind(i64::from(p.batch_size))
            .bind(&exclude)
            .bind(crate::store::server::RETRIED_BY_SLOW_LANE)
            .execute(&mut *tx)
            .await
            .map_err(|e| map_missing_table(e, &p.target.schema))?;
        tx.commit().await?;
        Ok(done.rows_affected())
    }

    /// [`StoreOps::events_skip`](crate::ops::StoreOps::events_skip).
    pub(super) async fn skip(&self, target: &Target, ids: &[i64]) -> Result<Vec<i64>> {
        let sql = self.sql.get(&target.schema);
        let mut skipped: Vec<i64> = sqlx::query_scalar(safe(&sql.skip))
            .bind(ids)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| map_missing_table(e, &target.schema))?;
        skipped.sort_unstable();
        Ok(skipped)
    }
}
