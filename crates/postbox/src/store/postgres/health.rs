//! Sink health on PostgreSQL: what each relay last reported of its sinks.

use super::sql::safe;
use super::{PgStore, map_missing_table};
use crate::error::Result;
use crate::sink::SinkHealth;
use crate::store::{ReportedSink, storable_error};

impl PgStore {
    /// [`StoreOps::sinks_report`](crate::ops::StoreOps::sinks_report).
    pub(super) async fn record_sink_health(
        &self,
        relay_id: &str,
        sinks: &[SinkHealth],
    ) -> Result<()> {
        let sql = self.sql.get(&self.default_schema);
        let mut tx = self.pool.begin().await?;
        sqlx::query(safe(&sql.sinks_forget))
            .bind(relay_id)
            .execute(&mut *tx)
            .await
            .map_err(|e| map_missing_table(e, &self.default_schema))?;
        for sink in sinks {
            sqlx::query(safe(&sql.sinks_report))
                .bind(relay_id)
                .bind(&sink.name)
                .bind(sink.up)
                .bind(sink.since)
                .bind(sink.last_error.as_deref().map(storable_error))
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// [`StoreOps::sinks_reported`](crate::ops::StoreOps::sinks_reported).
    pub(super) async fn read_sink_health(&self) -> Result<Vec<ReportedSink>> {
        let sql = self.sql.get(&self.default_schema);
        let rows: Vec<crate::store::ReportedRow> = sqlx::query_as(safe(&sql.sinks_reported))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| map_missing_table(e, &self.default_schema))?;
        Ok(crate::store::reported_sinks(rows))
    }
}
