//! Reading and keeping the MySQL history: listing events, archiving and purging them under the
//! retention lock.

use std::borrow::Cow;

use chrono::{DateTime, Utc};
use sqlx::QueryBuilder;
use sqlx::mysql::{MySql, MySqlConnection};

use super::{MySqlStore, RETENTION_LOCK, bind_ids, micros, push_ids, try_lock, unlock, with_ids};
use crate::error::{Error, Result};
use crate::glob::Glob;
use crate::store::list::{ListDialect, list_query};
use crate::store::row::stored_event;
use crate::store::{
    ArchiveBatch, ArchiveParams, EventStatus, ListParams, PurgeBatch, PurgeKind, PurgeParams,
    StoredEvent,
};

/// The list statement's MySQL words (`store/list.rs`): `IN (?, ?)` for lists, `LIKE` for globs
/// (the table's collation is binary: case-sensitive, as the globs are), UTC times without a zone.
struct MySqlList;

impl ListDialect for MySqlList {
    type Db = MySql;
    const BRANCH: &'static str = "(";
    const COLUMNS: &'static str = include_str!("../../../sql/mysql/queries/list_columns.sql");
    const NULL_ARCHIVED_AT: &'static str = "CAST(NULL AS DATETIME(6)) AS archived_at";

    fn table(&self, table: &'static str) -> Cow<'static, str> {
        Cow::Borrowed(table)
    }

    fn parked(&self) -> Cow<'static, str> {
        Cow::Borrowed(include_str!("../../../sql/mysql/queries/list_parked.sql"))
    }

    fn ids(&self, q: &mut QueryBuilder<MySql>, ids: &[i64]) {
        q.push("id IN ");
        push_ids(q, ids);
    }

    fn statuses(&self, q: &mut QueryBuilder<MySql>, statuses: &[EventStatus]) {
        q.push("status IN (");
        let mut list = q.separated(", ");
        for s in statuses {
            list.push_bind(s.as_str());
        }
        list.push_unseparated(")");
    }

    fn glob(&self, q: &mut QueryBuilder<MySql>, column: &'static str, glob: &Glob) {
        q.push(column).push(" LIKE ").push_bind(glob.to_like());
    }

    fn created(&self, q: &mut QueryBuilder<MySql>, op: &'static str, t: DateTime<Utc>) {
        q.push("created_at ")
            .push(op)
            .push(" ")
            .push_bind(t.naive_utc());
    }
}

impl MySqlStore {
    /// [`StoreOps::events_list`](crate::ops::StoreOps::events_list).
    pub(super) async fn list(&self, p: &ListParams<'_>) -> Result<Vec<StoredEvent>> {
        Self::check_target(p.target)?;
        p.filter.validate()?;
        let rows = list_query(&MySqlList, p)
            .build()
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.missing(e))?;
        rows.iter()
            .map(|row| stored_event(row, None).map_err(Error::from))
            .collect()
    }

    /// [`StoreOps::events_archive`](crate::ops::StoreOps::events_archive).
    pub(super) async fn archive(&self, p: &ArchiveParams<'_>) -> Result<Option<ArchiveBatch>> {
        Self::check_target(p.target)?;
        let mut conn = self.pool.acquire().await?;
        if !p.dry_run && !try_lock(&mut conn, RETENTION_LOCK, 0).await? {
            return Ok(None);
        }
        let batch = self.archive_batch(&mut conn, p).await;
        if !p.dry_run {
            unlock(&mut conn, RETENTION_LOCK).await?;
        }
        batch.map(Some)
    }

    async fn archive_batch(
        &self,
        conn: &mut MySqlConnection,
        p: &ArchiveParams<'_>,
    ) -> Result<ArchiveBatch> {
        let walked: Vec<(i64, bool, bool)> =
            sqlx::query_as(include_str!("../../../sql/mysql/queries/archive_walk.sql"))
                .bind(micros(p.older_than))
                .bind(p.after_id)
                .bind(i64::from(p.batch_size))
                .fetch_all(&mut *conn)
                .await
                .map_err(|e| self.missing(e))?;
        let mut last_id = p.after_id;
        let mut old = Vec::new();
        let mut reached_young = false;
        for (id, young, processed) in &walked {
            if *young {
                reached_young = true;
                break;
            }
            last_id = *id;
            if *processed {
                old.push(*id);
            }
        }
        let done = reached_young || walked.len() < p.batch_size as usize;
        let moved = if old.is_empty() {
            0
        } else if p.dry_run {
            old.len() as u64
        } else {
            let mut tx = sqlx::Connection::begin(&mut *conn).await?;
            let copy = with_ids(
                include_str!("../../../sql/mysql/queries/archive_move.sql"),
                &old,
            );
            bind_ids(copy, &old).execute(&mut *tx).await?;
            let delete = with_ids(
                include_str!("../../../sql/mysql/queries/archive_delete.sql"),
                &old,
            );
            let moved = bind_ids(delete, &old)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            tx.commit().await?;
            moved
        };
        Ok(ArchiveBatch {
            last_id,
            moved,
            done,
        })
    }

    /// [`StoreOps::events_purge`](crate::ops::StoreOps::events_purge).
    pub(super) async fn purge(&self, p: &PurgeParams<'_>) -> Result<Option<PurgeBatch>> {
        Self::check_target(p.target)?;
        let age = micros(p.older_than);
        let (purge, count) = match p.kind {
            PurgeKind::Archive => (
                include_str!("../../../sql/mysql/queries/archive_purge.sql"),
                include_str!("../../../sql/mysql/queries/archive_purge_count.sql"),
            ),
            PurgeKind::Failed => (
                include_str!("../../../sql/mysql/queries/purge_failed.sql"),
                include_str!("../../../sql/mysql/queries/purge_failed_count.sql"),
            ),
            PurgeKind::Inbox => (
                include_str!("../../../sql/mysql/queries/inbox_purge.sql"),
                include_str!("../../../sql/mysql/queries/inbox_purge_count.sql"),
            ),
        };
        if p.dry_run {
            let n: i64 = sqlx::query_scalar(count)
                .bind(age)
                .fetch_one(&self.pool)
                .await
                .map_err(|e| self.missing(e))?;
            return Ok(Some(PurgeBatch {
                purged: u64::try_from(n).unwrap_or(0),
                done: true,
            }));
        }
        let mut conn = self.pool.acquire().await?;
        if !try_lock(&mut conn, RETENTION_LOCK, 0).await? {
            return Ok(None);
        }
        let gone = sqlx::query(purge)
            .bind(age)
            .bind(i64::from(p.batch_size))
            .execute(&mut *conn)
            .await
            .map_err(|e| self.missing(e));
        unlock(&mut conn, RETENTION_LOCK).await?;
        let gone = gone?.rows_affected();
        Ok(Some(PurgeBatch {
            purged: gone,
            done: gone < u64::from(p.batch_size),
        }))
    }
}
