//! The PostgreSQL claim: due events from a floor, by ids (the CDC relay), the floor itself and
//! the gaps a relay passed.

use sqlx::Row;
use sqlx::postgres::PgRow;
use uuid::Uuid;

use super::sql::safe;
use super::{PgStore, map_missing_table, ms};
use crate::error::Result;
use crate::schema::Target;
use crate::store::row::add_claimed_row;
use crate::store::{ClaimParams, Claimed, GapParams, Gaps, LEASE_EXPIRED};

/// A claim's rows as [`Claimed`], in id order: UPDATE … RETURNING does not keep the order of
/// the picked rows (a join that spills into batches reorders them); the contract is id order.
fn claimed_from(rows: &[PgRow], token: Uuid, target: &Target) -> Result<Claimed> {
    let mut claimed = Claimed {
        claim_token: token,
        events: Vec::with_capacity(rows.len()),
        ..Claimed::default()
    };
    for row in rows {
        add_claimed_row(&mut claimed, row, target.tenant.as_ref())?;
    }
    claimed.events.sort_unstable_by_key(|e| e.id);
    Ok(claimed)
}

impl PgStore {
    /// [`Store::events_claim`](crate::Store::events_claim).
    pub(super) async fn claim(&self, p: &ClaimParams<'_>) -> Result<Claimed> {
        let sql = self.sql.get(&p.target.schema);
        let token = Uuid::new_v4();
        let ordered = p.order.is_on();
        let text = if ordered {
            &sql.claim
        } else {
            &sql.claim_unordered
        };
        let mut query = sqlx::query(safe(text))
            .bind(i32::try_from(p.batch_size).unwrap_or(i32::MAX))
            .bind(ms(p.lease))
            .bind(p.relay_id)
            .bind(token)
            .bind(p.order.aggregate_types)
            .bind(p.order.settled_through)
            .bind(LEASE_EXPIRED)
            .bind(p.floor);
        if ordered {
            query = query
                .bind(i32::try_from(p.order.walk).unwrap_or(i32::MAX))
                .bind(p.order.sweep);
        }
        let rows = query
            .fetch_all(&self.pool)
            .await
            .map_err(|e| map_missing_table(e, &p.target.schema))?;
        claimed_from(&rows, token, p.target)
    }

    /// Claims the events of `ids` that are still `PENDING` and never tried, as
    /// [`Store::events_claim`](crate::Store::events_claim) claims (lease, token, per-aggregate order of
    /// `params.order.aggregate_types`); `params.batch_size` and `params.floor` are not used. For
    /// a relay that learns of committed events elsewhere — the CDC relay reads them from the
    /// WAL — and leaves what it does not get (taken, finished, waiting behind its aggregate, a
    /// retry) to the polling claim.
    ///
    /// ```no_run
    /// # async fn example(store: postbox::PgStore, target: postbox::Target) -> postbox::Result<()> {
    /// use postbox::store::{ClaimOrder, ClaimParams};
    /// let claimed = store
    ///     .events_claim_ids(
    ///         &ClaimParams {
    ///             target: &target,
    ///             batch_size: 100,
    ///             lease: std::time::Duration::from_secs(30),
    ///             relay_id: "relay-1",
    ///             order: ClaimOrder::default(),
    ///             floor: 0,
    ///         },
    ///         &[41, 42],
    ///     )
    ///     .await?;
    /// println!("claimed {} of 2", claimed.events.len());
    /// # Ok(()) }
    /// ```
    pub async fn events_claim_ids(&self, p: &ClaimParams<'_>, ids: &[i64]) -> Result<Claimed> {
        let sql = self.sql.get(&p.target.schema);
        let token = Uuid::new_v4();
        let rows = sqlx::query(safe(&sql.claim_ids))
            .bind(ids)
            .bind(ms(p.lease))
            .bind(p.relay_id)
            .bind(token)
            .bind(p.order.aggregate_types)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| map_missing_table(e, &p.target.schema))?;
        claimed_from(&rows, token, p.target)
    }

    /// Reads, without claiming them, the events of `ids` that are still `PENDING`, never tried
    /// and of no aggregate type in `params.order.aggregate_types`, in id order, as a claim
    /// returns them (`claim_token` is a new token that no row holds). Nothing is written: the
    /// caller publishes them and records them with [`PgStore::events_mark_unclaimed`]; a relay
    /// polling beside it may claim one of them meanwhile and publish it too. For the CDC relay,
    /// which learns of committed events from the WAL and so needs no claim to find them.
    ///
    /// ```no_run
    /// # async fn example(store: postbox::PgStore, target: postbox::Target) -> postbox::Result<()> {
    /// use postbox::store::{ClaimOrder, ClaimParams};
    /// let params = ClaimParams {
    ///     target: &target,
    ///     batch_size: 100,
    ///     lease: std::time::Duration::from_secs(30),
    ///     relay_id: "relay-1",
    ///     order: ClaimOrder::default(),
    ///     floor: 0,
    /// };
    /// let read = store.events_read_ids(&params, &[41, 42]).await?;
    /// let ids: Vec<i64> = read.events.iter().map(|e| e.id).collect();
    /// // ... publish them, then:
    /// store.events_mark_unclaimed(&target, &ids).await?;
    /// # Ok(()) }
    /// ```
    pub async fn events_read_ids(&self, p: &ClaimParams<'_>, ids: &[i64]) -> Result<Claimed> {
        let sql = self.sql.get(&p.target.schema);
        let rows = sqlx::query(safe(&sql.read_ids))
            .bind(ids)
            .bind(p.order.aggregate_types)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| map_missing_table(e, &p.target.schema))?;
        claimed_from(&rows, Uuid::new_v4(), p.target)
    }

    /// Marks `PROCESSED` the events of `ids` read by [`PgStore::events_read_ids`] and published,
    /// those still as that read found them (one claimed since by another relay is that relay's
    /// to mark, or its retry's); returns the ids it marked.
    pub async fn events_mark_unclaimed(&self, target: &Target, ids: &[i64]) -> Result<Vec<i64>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let sql = self.sql.get(&target.schema);
        sqlx::query_scalar(safe(&sql.mark_unclaimed))
            .bind(ids)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| map_missing_table(e, &target.schema))
    }

    /// Of `ids`, which a claim by id ([`PgStore::events_claim_ids`]) did not get, those another
    /// claim took or that are finished or were tried: nothing to look at again for the caller.
    /// A row not visible yet, or still `PENDING` and untried, is not returned. For the CDC
    /// relay, which looks again at the ids its slot delivered that it could not claim.
    ///
    /// ```no_run
    /// # async fn example(store: postbox::PgStore, target: postbox::Target) -> postbox::Result<()> {
    /// let settled = store.events_ids_taken(&target, &[41, 42]).await?;
    /// // look again later at the ids not in `settled`
    /// # Ok(()) }
    /// ```
    pub async fn events_ids_taken(&self, target: &Target, ids: &[i64]) -> Result<Vec<i64>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let sql = self.sql.get(&target.schema);
        sqlx::query_scalar(safe(&sql.ids_taken))
            .bind(ids)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| map_missing_table(e, &target.schema))
    }

    /// Puts back, as they were before the claim and with no try spent, the events of `ids` that
    /// a claim under `token` just took whose aggregate type is ordered
    /// (`params.order.aggregate_types`) and whose aggregate has another event in flight under
    /// another claim, or `FAILED` and not skipped, whatever its id; returns their ids. A polling
    /// claim holds an aggregate's events in id order; beside a CDC relay, which goes by commit
    /// order, producers committing out of id order would otherwise see an event with a lower id
    /// published while a later one of its aggregate is.
    ///
    /// ```no_run
    /// # async fn example(store: postbox::PgStore, params: postbox::store::ClaimParams<'_>) -> postbox::Result<()> {
    /// use postbox::Store;
    /// let claimed = store.events_claim(&params).await?;
    /// let ids: Vec<i64> = claimed.events.iter().map(|e| e.id).collect();
    /// let back = store
    ///     .events_ordered_put_back(&params, claimed.claim_token, &ids)
    ///     .await?;
    /// // publish the claimed events not in `back`
    /// # Ok(()) }
    /// ```
    pub async fn events_ordered_put_back(
        &self,
        p: &ClaimParams<'_>,
        token: Uuid,
        ids: &[i64],
    ) -> Result<Vec<i64>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let sql = self.sql.get(&p.target.schema);
        sqlx::query_scalar(safe(&sql.ordered_put_back))
            .bind(ids)
            .bind(token)
            .bind(p.order.aggregate_types)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| map_missing_table(e, &p.target.schema))
    }

    /// [`Store::claim_floor`](crate::Store::claim_floor).
    pub(super) async fn floor(&self, target: &Target, from: i64, settled: i64) -> Result<i64> {
        let sql = self.sql.get(&target.schema);
        let floor: Option<i64> = sqlx::query_scalar(safe(&sql.floor))
            .bind(from)
            .bind(settled.saturating_add(1))
            .fetch_one(&self.pool)
            .await
            .map_err(|e| map_missing_table(e, &target.schema))?;
        Ok(floor.unwrap_or(from))
    }

    /// [`Store::claim_gaps`](crate::Store::claim_gaps).
    pub(super) async fn gaps(&self, p: &GapParams<'_>) -> Result<Gaps> {
        let sql = self.sql.get(&p.target.schema);
        let lo: Vec<i64> = p.passed.iter().map(|r| *r.start()).collect();
        let hi: Vec<i64> = p.passed.iter().map(|r| *r.end()).collect();
        let rows = sqlx::query(safe(&sql.gaps))
            .bind(&lo)
            .bind(&hi)
            .bind(p.after)
            .bind(i32::try_from(p.limit).unwrap_or(i32::MAX))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| map_missing_table(e, &p.target.schema))?;
        let rows = rows
            .iter()
            .map(|r| -> Result<crate::store::server::GapRow> {
                Ok(crate::store::server::GapRow {
                    id: r.try_get(0)?,
                    passed: r.try_get(1)?,
                    unfinished: r.try_get(2)?,
                    claimable: r.try_get(3)?,
                    prev: r.try_get(4)?,
                    n: r.try_get(5)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(crate::store::server::gaps_from(rows))
    }
}
