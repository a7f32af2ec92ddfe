//! Reading and keeping the PostgreSQL history: listing events, archiving and purging them under
//! the retention lock.

use std::borrow::Cow;

use chrono::{DateTime, Utc};
use sqlx::Row;

use super::sql::{render, safe};
use super::{PgStore, batch_size, count, map_missing_table, pg_locks};
use crate::error::{Error, Result};
use crate::glob::Glob;
use crate::schema::SchemaName;
use crate::store::list::{ListDialect, list_query};
use crate::store::row::stored_event;
use crate::store::{
    ArchiveBatch, ArchiveParams, EventStatus, ListParams, PurgeBatch, PurgeParams, StoredEvent,
};

/// The list statement's PostgreSQL words (`store/list.rs`): tables in the schema, arrays for
/// lists, `LIKE` with an escape for globs.
struct PgList<'a>(&'a SchemaName);

impl ListDialect for PgList<'_> {
    type Db = sqlx::Postgres;
    const BRANCH: &'static str = "(";
    const COLUMNS: &'static str = include_str!("../../../sql/postgres/queries/list_columns.sql");
    const NULL_ARCHIVED_AT: &'static str = "NULL::timestamptz AS archived_at";

    fn table(&self, table: &'static str) -> Cow<'static, str> {
        Cow::Owned(render(&format!("{{schema}}.{table}"), self.0).to_string())
    }

    fn parked(&self) -> Cow<'static, str> {
        let sql = render(
            include_str!("../../../sql/postgres/queries/list_parked.sql"),
            self.0,
        );
        Cow::Owned(sql.to_string())
    }

    fn ids(&self, q: &mut sqlx::QueryBuilder<Self::Db>, ids: &[i64]) {
        q.push("id = ANY(").push_bind(ids.to_vec()).push(")");
    }

    fn statuses(&self, q: &mut sqlx::QueryBuilder<Self::Db>, statuses: &[EventStatus]) {
        let statuses: Vec<&'static str> = statuses.iter().map(|s| s.as_str()).collect();
        q.push("status = ANY(").push_bind(statuses).push(")");
    }

    fn glob(&self, q: &mut sqlx::QueryBuilder<Self::Db>, column: &'static str, glob: &Glob) {
        q.push(column).push(" LIKE ").push_bind(glob.to_like());
        q.push(" ESCAPE '\\'");
    }

    fn created(&self, q: &mut sqlx::QueryBuilder<Self::Db>, op: &'static str, t: DateTime<Utc>) {
        q.push("created_at ").push(op).push(" ").push_bind(t);
    }
}

/// Takes the retention lock of `schema`'s outbox for the rest of `tx`: archiving and purging run
/// one at a time per table (relays and commands alike). False when another session holds it.
pub(super) async fn retention_lock(
    tx: &mut sqlx::PgConnection,
    schema: &SchemaName,
) -> Result<bool> {
    Ok(sqlx::query_scalar(include_str!(
        "../../../sql/postgres/queries/retention_lock.sql"
    ))
    .bind(schema.as_str())
    .bind(pg_locks::RETENTION)
    .fetch_one(tx)
    .await?)
}

/// Bounds how long the rest of `tx` waits for a lock (`None`: as long as it is held), with
/// `set_config` rather than `SET LOCAL`, which takes no parameter.
pub(super) async fn lock_wait(
    tx: &mut sqlx::PgConnection,
    wait: Option<std::time::Duration>,
) -> Result<()> {
    if let Some(wait) = wait {
        // At least a millisecond: 0 would mean no limit.
        let ms = wait.as_millis().max(1);
        sqlx::query("SELECT set_config('lock_timeout', $1, true)")
            .bind(format!("{ms}ms"))
            .execute(tx)
            .await?;
    }
    Ok(())
}

impl PgStore {
    /// [`StoreOps::events_list`](crate::ops::StoreOps::events_list).
    pub(super) async fn list(&self, p: &ListParams<'_>) -> Result<Vec<StoredEvent>> {
        p.filter.validate()?;
        let schema = &p.target.schema;
        let rows = list_query(&PgList(schema), p)
            .build()
            .fetch_all(&self.pool)
            .await
            .map_err(|e| map_missing_table(e, schema))?;
        rows.iter()
            .map(|row| stored_event(row, p.target.tenant.as_ref()).map_err(Error::from))
            .collect()
    }

    /// [`StoreOps::events_archive`](crate::ops::StoreOps::events_archive).
    pub(super) async fn archive(&self, p: &ArchiveParams<'_>) -> Result<Option<ArchiveBatch>> {
        let schema = &p.target.schema;
        let sql = self.sql.get(schema);
        let mut tx = self.pool.begin().await?;
        if !p.dry_run && !retention_lock(&mut tx, schema).await? {
            return Ok(None);
        }
        lock_wait(&mut tx, p.lock_wait).await?;
        let statement = if p.dry_run {
            &sql.archive_count
        } else {
            &sql.archive
        };
        let row = sqlx::query(safe(statement))
            .bind(p.older_than.as_secs_f64())
            .bind(p.after_id)
            .bind(batch_size(p.batch_size))
            .fetch_one(&mut *tx)
            .await
            .map_err(|e| map_missing_table(e, schema))?;
        tx.commit().await?;
        Ok(Some(ArchiveBatch {
            last_id: row.try_get(0)?,
            moved: count(row.try_get(1)?),
            done: row.try_get(2)?,
        }))
    }

    /// [`StoreOps::events_purge`](crate::ops::StoreOps::events_purge).
    pub(super) async fn purge(&self, p: &PurgeParams<'_>) -> Result<Option<PurgeBatch>> {
        let schema = &p.target.schema;
        let sql = self.sql.get(schema);
        let mut tx = self.pool.begin().await?;
        if !p.dry_run && !retention_lock(&mut tx, schema).await? {
            return Ok(None);
        }
        lock_wait(&mut tx, p.lock_wait).await?;
        let age = p.older_than.as_secs_f64();
        let batch = match sql.row_purge(p.kind) {
            None => {
                let row = sqlx::query(safe(&sql.archive_purge))
                    .bind(age)
                    .bind(batch_size(p.batch_size))
                    .bind(p.dry_run)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(|e| map_missing_table(e, schema))?;
                let rest = count(row.try_get(1)?);
                PurgeBatch {
                    purged: count(row.try_get(0)?),
                    done: p.dry_run || rest < u64::from(p.batch_size),
                }
            }
            Some((_, counting)) if p.dry_run => PurgeBatch {
                purged: count(
                    sqlx::query_scalar(safe(counting))
                        .bind(age)
                        .fetch_one(&mut *tx)
                        .await
                        .map_err(|e| map_missing_table(e, schema))?,
                ),
                done: true,
            },
            Some((delete, _)) => {
                let gone = sqlx::query(safe(delete))
                    .bind(age)
                    .bind(i64::from(p.batch_size))
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| map_missing_table(e, schema))?
                    .rows_affected();
                PurgeBatch {
                    purged: gone,
                    done: gone < u64::from(p.batch_size),
                }
            }
        };
        tx.commit().await?;
        Ok(Some(batch))
    }
}
