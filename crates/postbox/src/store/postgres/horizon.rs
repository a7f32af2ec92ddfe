//! The PostgreSQL commit horizon (probes of the table's writers) and the outbox tables' heads.

use std::time::Duration;

use super::sql::safe;
use super::{PgStore, map_missing_table};
use crate::error::Result;
use crate::schema::Target;
use crate::store::{Horizon, HorizonProbe};

impl PgStore {
    /// [`Store::commit_horizon`](crate::Store::commit_horizon).
    pub(super) async fn horizon(
        &self,
        target: &Target,
        probe: Option<&HorizonProbe>,
    ) -> Result<Horizon> {
        let sql = self.sql.get(&target.schema);
        let (last, writers, settled): (Option<i64>, Option<Vec<String>>, Option<i64>) =
            sqlx::query_as(safe(&sql.horizon))
                .bind(probe.map(|p| p.last_id))
                .bind(probe.map(|p| &p.writers))
                .fetch_one(&self.pool)
                .await
                .map_err(|e| map_missing_table(e, &target.schema))?;
        Ok(Horizon {
            settled,
            probe: last.map(|last_id| HorizonProbe {
                last_id,
                writers: writers.unwrap_or_default(),
            }),
        })
    }

    /// [`Store::horizon_writers_age`](crate::Store::horizon_writers_age).
    pub(super) async fn writers_age(&self, probe: &HorizonProbe) -> Result<Option<Duration>> {
        if probe.writers.is_empty() {
            return Ok(None);
        }
        let age: Option<f64> = sqlx::query_scalar(include_str!(
            "../../../sql/postgres/queries/horizon_writers_age.sql"
        ))
        .bind(&probe.writers)
        .fetch_one(&self.pool)
        .await?;
        Ok(crate::store::secs(age))
    }

    /// [`Store::outbox_heads`](crate::Store::outbox_heads).
    pub(super) async fn heads(
        &self,
        targets: &[Target],
        known: &[Option<i64>],
    ) -> Result<Vec<(usize, Option<i64>)>> {
        let schemas: Vec<&str> = targets.iter().map(|t| t.schema.as_str()).collect();
        let known: Vec<Option<i64>> = (0..targets.len())
            .map(|i| known.get(i).copied().flatten())
            .collect();
        let moved: Vec<(i64, Option<i64>)> = sqlx::query_as(include_str!(
            "../../../sql/postgres/queries/horizon_heads.sql"
        ))
        .bind(&schemas)
        .bind(&known)
        .fetch_all(&self.pool)
        .await?;
        Ok(moved
            .into_iter()
            .filter_map(|(n, head)| Some((usize::try_from(n - 1).ok()?, head)))
            .collect())
    }
}
