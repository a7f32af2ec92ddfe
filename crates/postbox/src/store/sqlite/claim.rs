//! The SQLite claim, which scans from the first due event, and the table's head.

use uuid::Uuid;

use super::{SqliteStore, ids_json, map_missing_table, ms};
use crate::error::Result;
use crate::schema::Target;
use crate::store::row::add_claimed_row;
use crate::store::{ClaimParams, Claimed, LEASE_EXPIRED};

impl SqliteStore {
    /// [`Store::events_claim`](crate::Store::events_claim).
    pub(super) async fn claim(&self, p: &ClaimParams<'_>) -> Result<Claimed> {
        Self::check_target(p.target)?;
        let token = Uuid::new_v4();
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let pick = sqlx::query_as(include_str!("../../../sql/sqlite/queries/claim_pick.sql"))
            .bind(i64::from(p.batch_size))
            .bind(serde_json::to_string(p.order.aggregate_types)?);
        let picked: Vec<(i64, bool)> = pick.fetch_all(&mut *tx).await.map_err(map_missing_table)?;
        let mut claimed = Claimed {
            claim_token: token,
            ..Claimed::default()
        };
        if picked.is_empty() {
            tx.commit().await?;
            return Ok(claimed);
        }
        let ids: Vec<i64> = picked.iter().map(|(id, _)| *id).collect();
        let stale: Vec<i64> = picked
            .iter()
            .filter(|(_, stale)| *stale)
            .map(|(id, _)| *id)
            .collect();
        let rows = sqlx::query(include_str!("../../../sql/sqlite/queries/claim_take.sql"))
            .bind(ids_json(&ids))
            .bind(ms(p.lease))
            .bind(p.relay_id)
            .bind(token.to_string())
            .bind(ids_json(&stale))
            .bind(LEASE_EXPIRED)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        for row in &rows {
            add_claimed_row(&mut claimed, row, None)?;
        }
        // RETURNING does not promise an order; the contract is id order.
        claimed.events.sort_unstable_by_key(|e| e.id);
        Ok(claimed)
    }

    /// [`Store::outbox_heads`](crate::Store::outbox_heads).
    pub(super) async fn heads(
        &self,
        targets: &[Target],
        known: &[Option<i64>],
    ) -> Result<Vec<(usize, Option<i64>)>> {
        let head: Option<i64> =
            sqlx::query_scalar(include_str!("../../../sql/sqlite/queries/head.sql"))
                .fetch_optional(&self.pool)
                .await?;
        let heads = targets.iter().map(|t| {
            if t.tenant.is_none() {
                Some(head.unwrap_or(0))
            } else {
                None
            }
        });
        Ok(crate::store::moved_heads(heads, known))
    }
}
