//! Sink health on MySQL: what each relay last reported of its sinks.

use super::MySqlStore;
use crate::error::Result;
use crate::sink::SinkHealth;
use crate::store::{ReportedSink, storable_error};

impl MySqlStore {
    /// [`StoreOps::sinks_report`](crate::ops::StoreOps::sinks_report).
    pub(super) async fn record_sink_health(
        &self,
        relay_id: &str,
        sinks: &[SinkHealth],
    ) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(include_str!("../../../sql/mysql/queries/sinks_forget.sql"))
            .bind(relay_id)
            .execute(&mut *tx)
            .await
            .map_err(|e| self.missing(e))?;
        for sink in sinks {
            sqlx::query(include_str!("../../../sql/mysql/queries/sinks_report.sql"))
                .bind(relay_id)
                .bind(&sink.name)
                .bind(sink.up)
                .bind(sink.since.naive_utc())
                .bind(sink.last_error.as_deref().map(storable_error))
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// [`StoreOps::sinks_reported`](crate::ops::StoreOps::sinks_reported).
    pub(super) async fn read_sink_health(&self) -> Result<Vec<ReportedSink>> {
        let rows: Vec<crate::store::ReportedRow> = sqlx::query_as(include_str!(
            "../../../sql/mysql/queries/sinks_reported.sql"
        ))
        .fetch_all(&self.pool)
        .await
        .map_err(|e| self.missing(e))?;
        Ok(crate::store::reported_sinks(rows))
    }
}
