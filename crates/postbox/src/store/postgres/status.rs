//! The state of a PostgreSQL outbox table and its upkeep: status counts, the backlog, the oldest
//! transaction, dead rows and vacuum.

use std::time::Duration;

use sqlx::Row;
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Connection};

use super::sql::{render, safe};
use super::{PgStore, map_missing_table, pg_locks};
use crate::error::{Error, Result};
use crate::schema::Target;
use crate::store::{Backlog, BacklogFrom, EXACT_PROCESSED_COUNT, Outstanding, StatusCounts, secs};

impl PgStore {
    /// [`StoreOps::status_counts`](crate::ops::StoreOps::status_counts).
    pub(super) async fn count_statuses(&self, target: &Target) -> Result<StatusCounts> {
        let sql = self.sql.get(&target.schema);
        let row = sqlx::query(safe(&sql.status_counts))
            .bind(target.schema.as_str())
            .bind(EXACT_PROCESSED_COUNT)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| map_missing_table(e, &target.schema))?;
        Ok(StatusCounts {
            pending: row.try_get(0)?,
            processing: row.try_get(1)?,
            processed: row.try_get(2)?,
            failed: row.try_get(3)?,
            oldest_pending_age: secs(row.try_get(4)?),
            dead_tuples: row.try_get(5)?,
            processed_exact: row.try_get(6)?,
        })
    }

    /// [`Store::backlog`](crate::Store::backlog).
    pub(super) async fn read_backlog(
        &self,
        target: &Target,
        ordered: &[String],
    ) -> Result<Backlog> {
        let sql = self.sql.get(&target.schema);
        let query = if ordered.is_empty() {
            sqlx::query(safe(&sql.backlog))
        } else {
            sqlx::query(safe(&sql.backlog_ordered)).bind(ordered)
        };
        let row = query
            .fetch_one(&self.pool)
            .await
            .map_err(|e| map_missing_table(e, &target.schema))?;
        Ok(Backlog {
            next_due_in: secs(row.try_get(0)?),
        })
    }

    /// [`Store::backlog_from`](crate::Store::backlog_from).
    pub(super) async fn read_backlog_from(
        &self,
        target: &Target,
        from: &BacklogFrom,
    ) -> Result<Backlog> {
        let sql = self.sql.get(&target.schema);
        let lo: Vec<i64> = from.passed.iter().map(|r| *r.start()).collect();
        let hi: Vec<i64> = from.passed.iter().map(|r| *r.end()).collect();
        let secs_due: Option<f64> = sqlx::query_scalar(safe(&sql.backlog_from))
            .bind(from.floor)
            .bind(&lo)
            .bind(&hi)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| map_missing_table(e, &target.schema))?;
        Ok(Backlog {
            next_due_in: secs(secs_due),
        })
    }

    /// [`Store::outbox_due`](crate::Store::outbox_due): one statement per
    /// [`DUE_PER_STATEMENT`] targets, each target's backlog function called in it.
    pub(super) async fn read_due(
        &self,
        targets: &[Target],
        ordered: &[String],
    ) -> Result<Vec<Option<Duration>>> {
        let mut due = vec![None; targets.len()];
        for (c, chunk) in targets.chunks(DUE_PER_STATEMENT).enumerate() {
            let ordered_arg = if ordered.is_empty() { "" } else { "$1::text[]" };
            let sql = per_target(
                include_str!("../../../sql/postgres/queries/outbox_due.sql"),
                chunk,
                &[("{ordered}", ordered_arg)],
            );
            let query = sqlx::query_as::<_, (i32, Option<f64>)>(AssertSqlSafe(sql));
            let query = if ordered.is_empty() {
                query
            } else {
                query.bind(ordered)
            };
            for (n, secs_due) in query.fetch_all(&self.pool).await? {
                let at = c * DUE_PER_STATEMENT + usize::try_from(n).unwrap_or(usize::MAX);
                if let Some(slot) = due.get_mut(at) {
                    *slot = secs(secs_due);
                }
            }
        }
        Ok(due)
    }

    /// [`StoreOps::status_outstanding`](crate::ops::StoreOps::status_outstanding): one statement
    /// per [`DUE_PER_STATEMENT`] targets, in a transaction of its own that keeps the planner on
    /// the partial indexes.
    pub(super) async fn read_outstanding(&self, targets: &[Target]) -> Result<Vec<Outstanding>> {
        let mut out = vec![Outstanding::default(); targets.len()];
        let template = include_str!("../../../sql/postgres/queries/status_outstanding.sql");
        for (c, chunk) in targets.chunks(DUE_PER_STATEMENT).enumerate() {
            let sql = per_target(template, chunk, &[]);
            let mut tx = self.pool.begin().await?;
            sqlx::raw_sql("SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off")
                .execute(&mut *tx)
                .await?;
            let rows: Vec<(i32, i64, i64, i64, Option<f64>)> = sqlx::query_as(AssertSqlSafe(sql))
                .fetch_all(&mut *tx)
                .await?;
            tx.commit().await?;
            for (n, pending, processing, failed, oldest) in rows {
                let at = c * DUE_PER_STATEMENT + usize::try_from(n).unwrap_or(usize::MAX);
                if let Some(slot) = out.get_mut(at) {
                    *slot = Outstanding {
                        pending,
                        processing,
                        failed,
                        oldest_pending_age: secs(oldest),
                    };
                }
            }
        }
        Ok(out)
    }

    /// [`StoreOps::oldest_transaction_age`](crate::ops::StoreOps::oldest_transaction_age).
    pub(super) async fn oldest_transaction(&self) -> Result<Option<Duration>> {
        let age: Option<f64> = sqlx::query_scalar(include_str!(
            "../../../sql/postgres/queries/oldest_transaction.sql"
        ))
        .fetch_one(&self.pool)
        .await?;
        Ok(secs(age))
    }

    /// [`StoreOps::replication_slots`](crate::ops::StoreOps::replication_slots).
    pub(super) async fn read_replication_slots(
        &self,
    ) -> Result<Vec<crate::store::ReplicationSlot>> {
        let rows = sqlx::query(include_str!(
            "../../../sql/postgres/queries/replication_slots.sql"
        ))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let pid: Option<i32> = row.try_get(6)?;
                let pinned_by = match pid {
                    Some(pid) => Some(crate::store::OpenTransaction {
                        pid,
                        database: row.try_get(7)?,
                        user: row.try_get(8)?,
                        application: row.try_get(9)?,
                        age_secs: row.try_get::<Option<f64>, _>(10)?.unwrap_or(0.0),
                        state: row.try_get(11)?,
                        query: row.try_get(12)?,
                    }),
                    None => None,
                };
                Ok(crate::store::ReplicationSlot {
                    name: row.try_get(0)?,
                    active: row.try_get(1)?,
                    lag_bytes: row.try_get(2)?,
                    wal_status: row.try_get(3)?,
                    safe_wal_bytes: row.try_get(4)?,
                    kept_bytes: row.try_get(5)?,
                    pinned_by,
                })
            })
            .collect()
    }

    /// [`StoreOps::outbox_dead_rows`](crate::ops::StoreOps::outbox_dead_rows).
    pub(super) async fn dead_rows(&self, targets: &[Target]) -> Result<Vec<u64>> {
        let schemas: Vec<&str> = targets.iter().map(|t| t.schema.as_str()).collect();
        let rows: Vec<(String, i64)> =
            sqlx::query_as(include_str!("../../../sql/postgres/queries/dead_rows.sql"))
                .bind(&schemas)
                .fetch_all(&self.pool)
                .await?;
        Ok(schemas
            .iter()
            .map(|s| {
                rows.iter()
                    .find(|(name, _)| name == s)
                    .map_or(0, |(_, dead)| u64::try_from(*dead).unwrap_or(0))
            })
            .collect())
    }

    /// [`StoreOps::outbox_vacuum`](crate::ops::StoreOps::outbox_vacuum).
    pub(super) async fn vacuum(&self, target: &Target) -> Result<()> {
        // VACUUM cannot run in a transaction and may take a while on a large table, so it gets
        // a connection of its own rather than holding one of the relay's.
        let mut conn = PgConnection::connect_with(&self.pool.connect_options()).await?;
        // Only the owner (or a superuser) may vacuum; anyone else gets a warning and nothing
        // done, so ask first.
        let may: Option<bool> =
            sqlx::query_scalar(include_str!("../../../sql/postgres/queries/may_vacuum.sql"))
                .bind(target.schema.as_str())
                .fetch_optional(&mut conn)
                .await?;
        match may {
            None => {
                return Err(Error::NotMigrated {
                    schema: target.schema.as_str().to_owned(),
                });
            }
            Some(false) => {
                return Err(Error::NotOwner {
                    schema: target.schema.as_str().to_owned(),
                });
            }
            Some(true) => {}
        }
        let ours: bool = sqlx::query_scalar(include_str!(
            "../../../sql/postgres/queries/vacuum_lock.sql"
        ))
        .bind(target.schema.as_str())
        .bind(pg_locks::VACUUM)
        .fetch_one(&mut conn)
        .await?;
        if !ours {
            return Ok(());
        }
        sqlx::raw_sql(include_str!(
            "../../../sql/postgres/queries/vacuum_wait.sql"
        ))
        .execute(&mut conn)
        .await?;
        let sql = self.sql.get(&target.schema);
        sqlx::raw_sql(safe(&sql.vacuum)).execute(&mut conn).await?;
        conn.close().await.ok();
        Ok(())
    }
}

/// Targets one statement of [`PgStore::read_due`] or [`PgStore::read_outstanding`] reads: each
/// takes locks on the schema's table and its indexes, held to the statement's end, and the
/// server's lock table is shared (`max_locks_per_transaction` × connections).
pub(super) const DUE_PER_STATEMENT: usize = 100;

/// One statement over many targets: `template` (a statement of one target, `{n}` its place,
/// `{schema}` its schema) once per target, comments left out, joined by `UNION ALL`, with each
/// of `fixed` (a marker, and the text that takes its place) put in.
fn per_target(template: &str, targets: &[Target], fixed: &[(&str, &str)]) -> String {
    let mut line: String = template
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join(" ");
    for (marker, text) in fixed {
        line = line.replace(marker, text);
    }
    targets
        .iter()
        .enumerate()
        // The schema goes in through `render`, the one function that quotes it; the number is
        // the target's place, written here.
        .map(|(n, t)| render(&line, &t.schema).replace("{n}", &n.to_string()))
        .collect::<Vec<_>>()
        .join(" UNION ALL ")
}
