//! What MySQL relays and operators write on claimed or failed events: leases renewed, events
//! processed, failed, released, retried and skipped.

use super::{MySqlStore, bind_ids, micros, spelled, with_ids};
use crate::error::Result;
use crate::schema::Target;
use crate::store::server::{RETRIED_BY_OPERATOR, RETRIED_BY_SLOW_LANE};
use crate::store::{
    FailedMark, MarkFailedParams, MarkProcessedParams, ReleaseParams, RenewParams,
    RetryFailedParams, SlowLaneParams, storable_error,
};

impl MySqlStore {
    /// [`Store::leases_renew`](crate::Store::leases_renew).
    pub(super) async fn renew(&self, p: &RenewParams<'_>) -> Result<u64> {
        Self::check_target(p.target)?;
        if p.ids.is_empty() {
            return Ok(0);
        }
        let q = with_ids(include_str!("../../../sql/mysql/queries/renew.sql"), p.ids)
            .bind(micros(p.lease))
            .bind(p.claim_token.to_string());
        Ok(bind_ids(q, p.ids)
            .execute(&self.pool)
            .await?
            .rows_affected())
    }

    /// [`Store::events_mark_processed`](crate::Store::events_mark_processed).
    pub(super) async fn mark_processed(&self, p: &MarkProcessedParams<'_>) -> Result<u64> {
        Self::check_target(p.target)?;
        if p.ids.is_empty() {
            return Ok(0);
        }
        let q = with_ids(
            include_str!("../../../sql/mysql/queries/mark_processed.sql"),
            p.ids,
        )
        .bind(p.claim_token.to_string());
        Ok(bind_ids(q, p.ids)
            .execute(&self.pool)
            .await?
            .rows_affected())
    }

    /// [`Store::events_mark_failed`](crate::Store::events_mark_failed).
    pub(super) async fn mark_failed(&self, p: &MarkFailedParams<'_>) -> Result<Vec<FailedMark>> {
        Self::check_target(p.target)?;
        if p.tries.is_empty() {
            return Ok(Vec::new());
        }
        let token = p.claim_token.to_string();
        let mut tx = self.pool.begin().await?;
        let mut marks = Vec::with_capacity(p.tries.len());
        for t in p.tries {
            let done = sqlx::query(include_str!("../../../sql/mysql/queries/mark_failed.sql"))
                .bind(t.permanent)
                .bind(t.max_retries)
                .bind(micros(p.retry.cap))
                .bind(micros(p.retry.base))
                .bind(t.permanent)
                .bind(t.max_retries)
                .bind(t.max_retries)
                .bind(storable_error(&t.error))
                .bind(t.id)
                .bind(&token)
                .execute(&mut *tx)
                .await?;
            if done.rows_affected() == 0 {
                continue;
            }
            let (retry_count, gave_up): (i32, bool) = sqlx::query_as(include_str!(
                "../../../sql/mysql/queries/mark_failed_read.sql"
            ))
            .bind(t.id)
            .fetch_one(&mut *tx)
            .await?;
            marks.push(FailedMark {
                id: t.id,
                retry_count,
                gave_up,
            });
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
        let mut tx = self.pool.begin().await?;
        let mut released = 0;
        for r in p.releases {
            released += sqlx::query(include_str!("../../../sql/mysql/queries/release.sql"))
                .bind(micros(r.delay))
                .bind(storable_error(&r.error))
                .bind(r.id)
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
        let q = match p.ids {
            Some([]) => return Ok(0),
            Some(ids) => bind_ids(
                with_ids(
                    include_str!("../../../sql/mysql/queries/retry_failed.sql"),
                    ids,
                )
                .bind(RETRIED_BY_OPERATOR),
                ids,
            ),
            None => sqlx::query(include_str!(
                "../../../sql/mysql/queries/retry_failed_all.sql"
            ))
            .bind(RETRIED_BY_OPERATOR),
        };
        Ok(q.execute(&self.pool)
            .await
            .map_err(|e| self.missing(e))?
            .rows_affected())
    }

    /// [`StoreOps::events_retry_slow_lane`](crate::ops::StoreOps::events_retry_slow_lane).
    pub(super) async fn retry_slow_lane(&self, p: &SlowLaneParams<'_>) -> Result<u64> {
        Self::check_target(p.target)?;
        let mut tx = self.pool.begin().await?;
        // Candidates in id order, a few more than the batch for the excluded types, locked; the
        // retry policies' globs are matched here (MySQL's LIKE has no per-pattern escape that
        // every version reads alike).
        let candidates: Vec<(i64, String)> = sqlx::query_as(include_str!(
            "../../../sql/mysql/queries/slow_lane_pick.sql"
        ))
        .bind(micros(p.after))
        .bind(i64::from(p.max_tries))
        .bind(i64::from(p.batch_size).saturating_mul(4))
        .fetch_all(&mut *tx)
        .await
        .map_err(|e| self.missing(e))?;
        let ids: Vec<i64> = candidates
            .into_iter()
            .filter(|(_, event_type)| !p.exclude.iter().any(|g| g.matches(event_type)))
            .map(|(id, _)| id)
            .take(p.batch_size as usize)
            .collect();
        if ids.is_empty() {
            tx.commit().await?;
            return Ok(0);
        }
        let take = with_ids(
            include_str!("../../../sql/mysql/queries/slow_lane_take.sql"),
            &ids,
        )
        .bind(RETRIED_BY_SLOW_LANE);
        let done = bind_ids(take, &ids)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(done)
    }

    /// [`StoreOps::events_skip`](crate::ops::StoreOps::events_skip).
    pub(super) async fn skip(&self, target: &Target, ids: &[i64]) -> Result<Vec<i64>> {
        Self::check_target(target)?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.pool.begin().await?;
        let pick = sqlx::query_scalar(spelled(
            include_str!("../../../sql/mysql/queries/skip_pick.sql"),
            &[("ids", ids.len())],
            &[],
        ));
        let skipped: Vec<i64> = ids
            .iter()
            .fold(pick, |q, id| q.bind(*id))
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| self.missing(e))?;
        if !skipped.is_empty() {
            let skip = with_ids(
                include_str!("../../../sql/mysql/queries/skip.sql"),
                &skipped,
            );
            bind_ids(skip, &skipped).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(skipped)
    }
}
