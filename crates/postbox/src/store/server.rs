//! What the stores of the server databases, PostgreSQL and MySQL/MariaDB, share: the texts an
//! operator's and the slow lane's retries leave for the claim below a relay's floor, the gaps a
//! relay passed, and the connection opened alone before the pool.

use super::{Gaps, PassedEvent};
use crate::error::Result;

/// What an operator's retry writes to `last_error` when it is empty: below a relay's floor a
/// retried event is found by its `last_error` (every store's claim). Bound into each store's
/// statement, one text for every store that claims from a floor (SQLite claims without one).
pub(crate) const RETRIED_BY_OPERATOR: &str = "retried by an operator";

/// What the slow lane writes to `last_error` when it is empty (see `RETRIED_BY_OPERATOR`).
pub(crate) const RETRIED_BY_SLOW_LANE: &str = "retried by the slow lane";

/// One row of a store's answer to [`Store::claim_gaps`](super::Store::claim_gaps) (the
/// `claim_gaps.sql` of each server store): a row in one of the passed ranges (`passed`, with
/// its flags); the last id present the read reached, with how many it read (`n`); or an id
/// present that ends a gap (it follows `prev`).
pub(crate) struct GapRow {
    pub id: i64,
    pub passed: bool,
    pub unfinished: bool,
    pub claimable: bool,
    pub prev: Option<i64>,
    pub n: Option<i64>,
}

/// [`Gaps`] from a store's [`GapRow`]s.
pub(crate) fn gaps_from(rows: Vec<GapRow>) -> Gaps {
    let mut gaps = Gaps::default();
    for row in rows {
        if row.passed {
            gaps.found.push(PassedEvent {
                id: row.id,
                unfinished: row.unfinished,
                claimable: row.claimable,
            });
        } else if let Some(n) = row.n {
            gaps.read_through = Some(row.id);
            gaps.read = u64::try_from(n).unwrap_or(0);
        } else if let Some(prev) = row.prev
            && row.id > prev.saturating_add(1)
        {
            gaps.missing.push(prev + 1..=row.id - 1);
        }
    }
    gaps.missing.sort_unstable_by_key(|range| *range.start());
    gaps
}

/// Opens one connection alone and closes it: a server that refuses it says why at once, where
/// a pool would retry until its acquire timeout and report only that.
pub(crate) async fn probe<C: sqlx::Connection>(options: &C::Options) -> Result<()> {
    C::connect_with(options).await?.close().await.ok();
    Ok(())
}
