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

/// [`Gaps`] from a store's rows of [`Store::claim_gaps`](super::Store::claim_gaps): (id, one of the passed ids,
/// unfinished, claimable), the range's rows in id order.
pub(crate) fn gaps_from(rows: Vec<(i64, bool, bool, bool)>) -> Gaps {
    let mut gaps = Gaps::default();
    for (id, passed, unfinished, claimable) in rows {
        if passed {
            gaps.found.push(PassedEvent {
                id,
                unfinished,
                claimable,
            });
        } else {
            gaps.present.push(id);
        }
    }
    gaps.present.sort_unstable();
    gaps
}

/// Opens one connection alone and closes it: a server that refuses it says why at once, where
/// a pool would retry until its acquire timeout and report only that.
pub(crate) async fn probe<C: sqlx::Connection>(options: &C::Options) -> Result<()> {
    C::connect_with(options).await?.close().await.ok();
    Ok(())
}
