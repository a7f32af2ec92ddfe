//! Reading and keeping the SQLite history: listing events, archiving and purging them.

use std::borrow::Cow;

use chrono::{DateTime, Utc};
use sqlx::Row;

use super::{SqliteStore, ids_json, map_missing_table};
use crate::error::{Error, Result};
use crate::glob::Glob;
use crate::store::list::{ListDialect, list_query};
use crate::store::row::stored_event;
use crate::store::{
    ArchiveBatch, ArchiveParams, EventStatus, ListParams, PurgeBatch, PurgeKind, PurgeParams,
    StoredEvent,
};

/// The list statement's SQLite words (`store/list.rs`): JSON arrays read with `json_each` for
/// lists, `GLOB` for globs (case-sensitive like the globs themselves), times compared through
/// `julianday`, which reads every date form SQLite knows.
struct SqliteList;

impl ListDialect for SqliteList {
    type Db = sqlx::Sqlite;
    const BRANCH: &'static str = "SELECT * FROM (";
    const COLUMNS: &'static str = include_str!("../../../sql/sqlite/queries/list_columns.sql");
    const NULL_ARCHIVED_AT: &'static str = "NULL AS archived_at";

    fn table(&self, table: &'static str) -> Cow<'static, str> {
        Cow::Borrowed(table)
    }

    fn parked(&self) -> Cow<'static, str> {
        Cow::Borrowed(include_str!("../../../sql/sqlite/queries/list_parked.sql"))
    }

    fn ids(&self, q: &mut sqlx::QueryBuilder<Self::Db>, ids: &[i64]) {
        q.push("id IN (SELECT value FROM json_each(");
        q.push_bind(ids_json(ids)).push("))");
    }

    fn statuses(&self, q: &mut sqlx::QueryBuilder<Self::Db>, statuses: &[EventStatus]) {
        let statuses: Vec<&str> = statuses.iter().map(|s| s.as_str()).collect();
        q.push("status IN (SELECT value FROM json_each(");
        q.push_bind(serde_json::to_string(&statuses).unwrap_or_default());
        q.push("))");
    }

    fn glob(&self, q: &mut sqlx::QueryBuilder<Self::Db>, column: &'static str, glob: &Glob) {
        q.push(column).push(" GLOB ");
        q.push_bind(glob.to_sqlite_glob().to_owned());
    }

    fn created(&self, q: &mut sqlx::QueryBuilder<Self::Db>, op: &'static str, t: DateTime<Utc>) {
        let t = t.format("%Y-%m-%dT%H:%M:%S%.fZ").to_string();
        q.push("julianday(created_at) ").push(op);
        q.push(" julianday(").push_bind(t).push(")");
    }
}

impl SqliteStore {
    /// [`StoreOps::events_list`](crate::ops::StoreOps::events_list).
    pub(super) async fn list(&self, p: &ListParams<'_>) -> Result<Vec<StoredEvent>> {
        Self::check_target(p.target)?;
        p.filter.validate()?;
        let rows = list_query(&SqliteList, p)
            .build()
            .fetch_all(&self.pool)
            .await
            .map_err(map_missing_table)?;
        rows.iter()
            .map(|row| stored_event(row, None).map_err(Error::from))
            .collect()
    }

    /// [`StoreOps::events_archive`](crate::ops::StoreOps::events_archive).
    pub(super) async fn archive(&self, p: &ArchiveParams<'_>) -> Result<Option<ArchiveBatch>> {
        Self::check_target(p.target)?;
        // One writer at a time is SQLite's own rule: no lock of Postbox's is needed.
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let walked = sqlx::query(include_str!("../../../sql/sqlite/queries/archive_walk.sql"))
            .bind(p.older_than.as_secs_f64())
            .bind(p.after_id)
            .bind(i64::from(p.batch_size))
            .fetch_all(&mut *tx)
            .await
            .map_err(map_missing_table)?;
        let mut last_id = p.after_id;
        let mut old = Vec::new();
        let mut reached_young = false;
        for row in &walked {
            // NULL: a created_at SQLite cannot read as a date; such a row is left where it is.
            let young: Option<bool> = row.try_get(1)?;
            if young == Some(true) {
                reached_young = true;
                break;
            }
            last_id = row.try_get(0)?;
            if row.try_get::<bool, _>(2)? && young.is_some() {
                old.push(last_id);
            }
        }
        let done = reached_young || walked.len() < p.batch_size as usize;
        let moved = if old.is_empty() {
            0
        } else if p.dry_run {
            old.len() as u64
        } else {
            let ids = ids_json(&old);
            sqlx::query(include_str!("../../../sql/sqlite/queries/archive_move.sql"))
                .bind(&ids)
                .execute(&mut *tx)
                .await?;
            sqlx::query(include_str!(
                "../../../sql/sqlite/queries/archive_delete.sql"
            ))
            .bind(&ids)
            .execute(&mut *tx)
            .await?
            .rows_affected()
        };
        tx.commit().await?;
        Ok(Some(ArchiveBatch {
            last_id,
            moved,
            done,
        }))
    }

    /// [`StoreOps::events_purge`](crate::ops::StoreOps::events_purge).
    pub(super) async fn purge(&self, p: &PurgeParams<'_>) -> Result<Option<PurgeBatch>> {
        Self::check_target(p.target)?;
        let age = p.older_than.as_secs_f64();
        let (statement, count) = match p.kind {
            PurgeKind::Archive => (
                include_str!("../../../sql/sqlite/queries/archive_purge.sql"),
                include_str!("../../../sql/sqlite/queries/archive_purge_count.sql"),
            ),
            PurgeKind::Failed => (
                include_str!("../../../sql/sqlite/queries/purge_failed.sql"),
                include_str!("../../../sql/sqlite/queries/purge_failed_count.sql"),
            ),
            PurgeKind::Inbox => (
                include_str!("../../../sql/sqlite/queries/inbox_purge.sql"),
                include_str!("../../../sql/sqlite/queries/inbox_purge_count.sql"),
            ),
        };
        if p.dry_run {
            let n: i64 = sqlx::query_scalar(count)
                .bind(age)
                .fetch_one(&self.pool)
                .await
                .map_err(map_missing_table)?;
            return Ok(Some(PurgeBatch {
                purged: u64::try_from(n).unwrap_or(0),
                done: true,
            }));
        }
        let gone = sqlx::query(statement)
            .bind(age)
            .bind(i64::from(p.batch_size))
            .execute(&self.pool)
            .await
            .map_err(map_missing_table)?
            .rows_affected();
        Ok(Some(PurgeBatch {
            purged: gone,
            done: gone < u64::from(p.batch_size),
        }))
    }
}
