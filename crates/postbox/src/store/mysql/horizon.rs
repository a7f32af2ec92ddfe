//! The MySQL commit horizon, found from the ids themselves, and the table's head.

use std::collections::HashSet;
use std::time::Duration;

use super::MySqlStore;
use crate::error::Result;
use crate::schema::Target;
use crate::store::{Horizon, HorizonProbe};

/// How long after the last id was read the commit horizon checks the ids up to it. InnoDB hands
/// an id out and writes its row (taking the row's lock) within one statement; this leaves that
/// step ample time.
const ID_SETTLE_DELAY: Duration = Duration::from_millis(100);

/// The most ids one call of [`Store::commit_horizon`] checks: a relay that starts beside a long
/// history settles it in steps of this many ids, one per round.
const CHECK_SPAN: i64 = 100_000;

impl MySqlStore {
    /// [`Store::commit_horizon`](crate::Store::commit_horizon).
    pub(super) async fn horizon(
        &self,
        target: &Target,
        probe: Option<&HorizonProbe>,
    ) -> Result<Horizon> {
        Self::check_target(target)?;
        // MySQL has no view of the transactions writing to a table that can be trusted here
        // (information_schema.INNODB_TRX is served from a cache that frequent readers keep
        // stale), so the horizon is found from the ids themselves: every id up to the last one
        // handed out (read at least ID_SETTLE_DELAY earlier) is committed, rolled back or held
        // by an open transaction — and only the last kind is locked. Ids missing from the table
        // and the archive get a locking read that does not wait: a lock conflict is an open
        // transaction's row, and the horizon stops below it. The probe carries the horizon so
        // far (`last_id`) and the id it waits for (`writers`).
        let pending = *self
            .pending_probe
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((read_at, _)) = pending
            && read_at.elapsed() < ID_SETTLE_DELAY
        {
            // The last id read is too fresh to check: the horizon stays where it is.
            return Ok(Horizon {
                settled: probe.map(|p| p.last_id),
                probe: probe.cloned(),
            });
        }
        let now_head: Option<i64> =
            sqlx::query_scalar(include_str!("../../../sql/mysql/queries/head.sql"))
                .fetch_optional(&self.pool)
                .await?
                .flatten();
        let floor = match probe {
            Some(p) => p.last_id,
            None => match self.first_horizon(now_head.unwrap_or(0)).await? {
                Ok(start) => start,
                // An open transaction holds an id below every committed one: wait for it.
                Err(held) => {
                    return Ok(Horizon {
                        settled: Some(held - 1),
                        probe: Some(HorizonProbe {
                            last_id: held - 1,
                            writers: vec![format!("the transaction that inserted id {held}")],
                        }),
                    });
                }
            },
        };
        let upto = pending.map_or(floor, |(_, last)| {
            last.min(floor.saturating_add(CHECK_SPAN))
        });
        *self
            .pending_probe
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            now_head.map(|h| (std::time::Instant::now(), h));
        let mut settled = upto.max(floor);
        let mut waiting_for = None;
        if upto > floor {
            let present: HashSet<i64> = sqlx::query_scalar(include_str!(
                "../../../sql/mysql/queries/horizon_present.sql"
            ))
            .bind(floor)
            .bind(upto)
            .bind(floor)
            .bind(upto)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.missing(e))?
            .into_iter()
            .collect();
            for id in (floor + 1..=upto).filter(|id| !present.contains(id)) {
                let locked = sqlx::query(include_str!(
                    "../../../sql/mysql/queries/horizon_locked.sql"
                ))
                .bind(id)
                .fetch_optional(&self.pool)
                .await
                .is_err();
                if locked {
                    settled = id - 1;
                    waiting_for = Some(id);
                    break;
                }
            }
        }
        Ok(Horizon {
            settled: Some(settled),
            probe: Some(HorizonProbe {
                last_id: settled,
                writers: waiting_for
                    .map(|id| vec![format!("the transaction that inserted id {id}")])
                    .unwrap_or_default(),
            }),
        })
    }

    /// Where a relay's first horizon starts, as safe as the later ones: `Ok(id)` when no open
    /// transaction holds an id at or below `id`, from where the ids are checked as usual (the
    /// lowest committed id less one: below it a row of the table can only be one that is not
    /// committed yet, which a locking read that does not wait finds); `Err(id)` with the lowest
    /// id an open transaction holds, when one holds an id below every committed one. A few
    /// locking reads of ranges with no committed row (a binary search), whatever the history.
    async fn first_horizon(&self, head: i64) -> Result<std::result::Result<i64, i64>> {
        let lowest: Option<i64> = sqlx::query_scalar(include_str!(
            "../../../sql/mysql/queries/horizon_lowest.sql"
        ))
        .fetch_one(&self.pool)
        .await
        .map_err(|e| self.missing(e))?;
        let below = lowest.unwrap_or(head.saturating_add(1));
        let (mut lo, mut hi) = (1, below - 1);
        if hi < lo || !self.held_in(lo, hi).await {
            return Ok(Ok(below - 1));
        }
        // A held id lies in [lo, hi]: halve the range until it is one id.
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.held_in(lo, mid).await {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        Ok(Err(lo))
    }

    /// Whether an open transaction holds an id in `from..=to` (a range with no committed row).
    /// A read that fails for another reason counts as held: the horizon then waits, never
    /// passes an id it could not check.
    async fn held_in(&self, from: i64, to: i64) -> bool {
        sqlx::query(include_str!(
            "../../../sql/mysql/queries/horizon_locked_range.sql"
        ))
        .bind(from)
        .bind(to)
        .fetch_optional(&self.pool)
        .await
        .is_err()
    }

    /// [`Store::outbox_heads`](crate::Store::outbox_heads).
    pub(super) async fn heads(
        &self,
        targets: &[Target],
        known: &[Option<i64>],
    ) -> Result<Vec<(usize, Option<i64>)>> {
        let head: Option<i64> =
            sqlx::query_scalar(include_str!("../../../sql/mysql/queries/head.sql"))
                .fetch_optional(&self.pool)
                .await?
                .flatten();
        let heads = targets
            .iter()
            .map(|t| if t.tenant.is_none() { head } else { None });
        Ok(crate::store::moved_heads(heads, known))
    }
}
