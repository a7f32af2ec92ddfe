//! The MySQL claim: due rows of the `PENDING` and `PROCESSING` ranges from a floor and the
//! retried ones below it, per-aggregate order checked against other claims; the floor and the
//! gaps a relay passed.

use std::collections::{HashMap, HashSet};
use std::sync::LazyLock;

use sqlx::mysql::MySqlConnection;
use sqlx::{AssertSqlSafe, Row};
use uuid::Uuid;

use super::{MySqlStore, bind_ids, micros, ordered_json, spelled, with_ids};
use crate::error::Result;
use crate::schema::Target;
use crate::store::row::add_claimed_row;
use crate::store::{ClaimParams, Claimed, GapParams, Gaps, LEASE_EXPIRED};

/// The claim's two reads (claim_pick.sql, claim_retried.sql), with the ordering rule they share
/// (claim_in_order.sql) written in.
static CLAIM_PICK: LazyLock<String> = LazyLock::new(|| {
    include_str!("../../../sql/mysql/queries/claim_pick.sql").replace(
        "{in_order}",
        include_str!("../../../sql/mysql/queries/claim_in_order.sql"),
    )
});

static CLAIM_RETRIED: LazyLock<String> = LazyLock::new(|| {
    include_str!("../../../sql/mysql/queries/claim_retried.sql").replace(
        "{in_order}",
        include_str!("../../../sql/mysql/queries/claim_in_order.sql"),
    )
});

/// One picked row: id, whether it is a stale claim, and its aggregate.
type Picked = (i64, bool, Option<String>, Option<String>);

/// Keeps of `picked` (in id order) only the ordered events whose every earlier unfinished event
/// (`unfinished`: id and aggregate) was picked too: another claim in flight may hold one, and
/// then the later ones are not this claim's to publish.
fn keep_own_heads(
    picked: Vec<Picked>,
    types: &[String],
    unfinished: &[(i64, String, String)],
) -> Vec<Picked> {
    let ids: HashSet<i64> = picked.iter().map(|p| p.0).collect();
    let mut blocked_from: HashMap<(&str, &str), i64> = HashMap::new();
    for (id, at, aid) in unfinished {
        if !ids.contains(id) {
            let first = blocked_from
                .entry((at.as_str(), aid.as_str()))
                .or_insert(*id);
            *first = (*first).min(*id);
        }
    }
    picked
        .into_iter()
        .filter(|(id, _, at, aid)| match (at, aid) {
            (Some(at), Some(aid)) if crate::ordering::orders_type(types, at) => blocked_from
                .get(&(at.as_str(), aid.as_str()))
                .is_none_or(|first| first > id),
            _ => true,
        })
        .collect()
}

impl MySqlStore {
    /// [`Store::events_claim`](crate::Store::events_claim).
    pub(super) async fn claim(&self, p: &ClaimParams<'_>) -> Result<Claimed> {
        Self::check_target(p.target)?;
        let token = Uuid::new_v4();
        let mut claimed = Claimed {
            claim_token: token,
            ..Claimed::default()
        };
        let ordered = ordered_json(p.order.aggregate_types)?;
        let mut tx = self.pool.begin().await?;
        // Due rows of both ranges at or above the floor, and the retried ones below it, in id
        // order; the first batch_size of them (rows locked beyond it are let go at commit).
        let mut picked: Vec<Picked> = Vec::new();
        let mut reads = vec![
            (&**CLAIM_PICK, Some("PENDING")),
            (&**CLAIM_PICK, Some("PROCESSING")),
        ];
        if p.floor > 0 {
            reads.push((&**CLAIM_RETRIED, None));
        }
        for (statement, status) in reads {
            let mut read = sqlx::query_as(AssertSqlSafe(statement));
            if let Some(status) = status {
                read = read.bind(status);
            }
            let rows: Vec<Picked> = read
                .bind(p.floor)
                .bind(&ordered)
                .bind(&ordered)
                .bind(p.order.settled_through)
                .bind(i64::from(p.batch_size))
                .fetch_all(&mut *tx)
                .await
                .map_err(|e| self.missing(e))?;
            picked.extend(rows);
        }
        picked.sort_unstable_by_key(|r| r.0);
        picked.truncate(p.batch_size as usize);
        if p.order.is_on() {
            picked = self
                .own_heads(&mut tx, picked, p.order.aggregate_types)
                .await?;
        }
        if picked.is_empty() {
            tx.commit().await?;
            return Ok(claimed);
        }
        let ids: Vec<i64> = picked.iter().map(|r| r.0).collect();
        let mut stale: Vec<i64> = picked.iter().filter(|r| r.1).map(|r| r.0).collect();
        if stale.is_empty() {
            // No id: `id IN (-1)` is false for every row.
            stale.push(-1);
        }
        let take = with_ids(
            include_str!("../../../sql/mysql/queries/claim_take.sql"),
            &ids,
        )
        .bind(LEASE_EXPIRED)
        .bind(micros(p.lease))
        .bind(p.relay_id)
        .bind(token.to_string());
        bind_ids(take, &ids).execute(&mut *tx).await?;
        let read = sqlx::query(spelled(
            include_str!("../../../sql/mysql/queries/claim_read.sql"),
            &[("stale", stale.len()), ("ids", ids.len())],
            &[],
        ));
        let rows = bind_ids(bind_ids(read, &stale), &ids)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        for row in &rows {
            add_claimed_row(&mut claimed, row, None)?;
        }
        Ok(claimed)
    }

    /// The ordered events of `picked` that are this claim's: every earlier unfinished event of
    /// their aggregate was picked too (read committed: an event another claim has locked but
    /// not yet taken still reads `PENDING`, and holds its aggregate back here).
    async fn own_heads(
        &self,
        tx: &mut MySqlConnection,
        picked: Vec<Picked>,
        types: &[String],
    ) -> Result<Vec<Picked>> {
        let aggregates: HashSet<(&str, &str)> = picked
            .iter()
            .filter_map(|(_, _, at, aid)| match (at, aid) {
                (Some(at), Some(aid)) if crate::ordering::orders_type(types, at) => {
                    Some((at.as_str(), aid.as_str()))
                }
                _ => None,
            })
            .collect();
        if aggregates.is_empty() {
            return Ok(picked);
        }
        let last = picked.last().map_or(0, |p| p.0);
        let heads = sqlx::query_as(spelled(
            include_str!("../../../sql/mysql/queries/claim_heads.sql"),
            &[],
            &[("aggregates", aggregates.len())],
        ))
        .bind(last);
        let unfinished: Vec<(i64, String, String)> = aggregates
            .iter()
            .fold(heads, |q, (at, aid)| q.bind(*at).bind(*aid))
            .fetch_all(&mut *tx)
            .await?;
        Ok(keep_own_heads(picked, types, &unfinished))
    }

    /// [`Store::claim_floor`](crate::Store::claim_floor).
    pub(super) async fn floor(&self, target: &Target, from: i64, settled: i64) -> Result<i64> {
        Self::check_target(target)?;
        let first: Option<i64> =
            sqlx::query_scalar(include_str!("../../../sql/mysql/queries/claim_floor.sql"))
                .bind(from)
                .bind(from)
                .fetch_one(&self.pool)
                .await
                .map_err(|e| self.missing(e))?;
        let up_to = settled.saturating_add(1);
        Ok(first.unwrap_or(up_to).min(up_to))
    }

    /// [`Store::claim_gaps`](crate::Store::claim_gaps).
    pub(super) async fn gaps(&self, p: &GapParams<'_>) -> Result<Gaps> {
        Self::check_target(p.target)?;
        // Placeholders only, one `id BETWEEN ? AND ?` per range: no value is written into it.
        let ranges = if p.passed.is_empty() {
            "FALSE".to_owned()
        } else {
            vec!["(id BETWEEN ? AND ?)"; p.passed.len()].join(" OR ")
        };
        let text =
            include_str!("../../../sql/mysql/queries/claim_gaps.sql").replace("{ranges}", &ranges);
        // The placeholders in the order of the text: the ids read, the ranges, the gaps.
        let limit = i64::from(p.limit);
        let mut query = sqlx::query(AssertSqlSafe(text)).bind(p.after).bind(limit);
        for range in p.passed {
            query = query.bind(*range.start()).bind(*range.end());
        }
        let rows = query
            .bind(p.after)
            .bind(p.after)
            .bind(limit)
            .bind(p.after)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.missing(e))?;
        let rows = rows
            .iter()
            .map(|r| -> Result<crate::store::server::GapRow> {
                let flag = |i: usize| -> Result<bool> { Ok(r.try_get::<i64, _>(i)? != 0) };
                Ok(crate::store::server::GapRow {
                    id: r.try_get(0)?,
                    passed: flag(1)?,
                    unfinished: flag(2)?,
                    claimable: flag(3)?,
                    prev: r.try_get(4)?,
                    n: r.try_get(5)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(crate::store::server::gaps_from(rows))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_claims_reads_have_the_ordering_rule_written_in_once() {
        let rule = include_str!("../../../sql/mysql/queries/claim_in_order.sql");
        for statement in [&*CLAIM_PICK, &*CLAIM_RETRIED] {
            assert!(!statement.contains("{in_order}"), "{statement}");
            assert_eq!(statement.matches(rule).count(), 1, "{statement}");
        }
    }

    #[test]
    fn an_ordered_event_behind_another_claims_head_is_not_taken() {
        let types = vec!["Invoice".to_owned()];
        let inv = |id: i64, aggregate: &str| -> Picked {
            (id, false, Some("Invoice".into()), Some(aggregate.into()))
        };
        let picked = vec![
            inv(2, "1"),
            inv(3, "2"),
            (4, false, Some("Order".into()), Some("1".into())),
            inv(5, "2"),
        ];
        // Event 1 of invoice 1 is locked by another claim (unfinished, not picked here).
        let unfinished = vec![
            (1, "Invoice".into(), "1".into()),
            (2, "Invoice".into(), "1".into()),
            (3, "Invoice".into(), "2".into()),
        ];
        let kept: Vec<i64> = keep_own_heads(picked, &types, &unfinished)
            .into_iter()
            .map(|p| p.0)
            .collect();
        assert_eq!(kept, [3, 4, 5]);
    }
}
