//! The statement of [`StoreOps::events_list`](crate::ops::StoreOps::events_list), written once for every
//! database over a [`ListDialect`]: each store says only what its database says differently.

use std::borrow::Cow;

use chrono::{DateTime, Utc};
use sqlx::{Database, Encode, QueryBuilder, Type};

use super::{EventStatus, ListParams, Order};
use crate::glob::Glob;

/// The live table, read by every list.
const EVENTS: &str = "outbox_events";
/// The archive, read too when the filter asks for it.
const ARCHIVE: &str = "outbox_events_archive";

/// What a list statement says differently on each database; [`list_query`] writes the rest.
///
/// Each method pushes a condition (no leading `AND`) made of fixed SQL text and bound values:
/// never a value formatted into SQL. The columns and the parked condition are the dialect's
/// `sql/<dialect>/list_columns.sql` and `list_parked.sql`.
pub(crate) trait ListDialect {
    /// The database the statement is for.
    type Db: Database<Arguments: Default>;
    /// What opens a table's part of the statement, closed by `)`: `(`, or a subquery where a
    /// member of a `UNION` may not be parenthesised (SQLite).
    const BRANCH: &'static str;
    /// `SELECT` and every column of a listed row but `archived_at` (`list_columns.sql`).
    const COLUMNS: &'static str;
    /// The `archived_at` column of a row still in `outbox_events`: a NULL of the column's type.
    const NULL_ARCHIVED_AT: &'static str;

    /// `table` as written in `FROM` (schema-qualified on PostgreSQL).
    fn table(&self, table: &'static str) -> Cow<'static, str>;
    /// The row of `outbox_events` is the head of a parked aggregate (`list_parked.sql`).
    fn parked(&self) -> Cow<'static, str>;
    /// `id` is one of `ids` (never empty).
    fn ids(&self, q: &mut QueryBuilder<Self::Db>, ids: &[i64]);
    /// `status` is one of `statuses` (never empty).
    fn statuses(&self, q: &mut QueryBuilder<Self::Db>, statuses: &[EventStatus]);
    /// `column` matches `glob`, case-sensitively.
    fn glob(&self, q: &mut QueryBuilder<Self::Db>, column: &'static str, glob: &Glob);
    /// `created_at <op> t`, `op` being `>=` or `<`.
    fn created(&self, q: &mut QueryBuilder<Self::Db>, op: &'static str, t: DateTime<Utc>);
}

/// The list statement of `p` on `d`'s database: the page of `outbox_events` matching the filter
/// and, when the filter reads the archive, the page of `outbox_events_archive`, merged in the
/// page's order and cut to its limit. Each part is cut to the limit too, so that the database
/// stops reading each table after one page.
pub(crate) fn list_query<D>(d: &D, p: &ListParams<'_>) -> QueryBuilder<D::Db>
where
    D: ListDialect,
    for<'t> i64: Encode<'t, D::Db> + Type<D::Db>,
    for<'t> String: Encode<'t, D::Db> + Type<D::Db>,
{
    let mut q = QueryBuilder::new("SELECT * FROM (");
    push_branch(d, &mut q, EVENTS, p);
    if p.filter.reads_archive() {
        q.push(" UNION ALL ");
        push_branch(d, &mut q, ARCHIVE, p);
    }
    q.push(match p.order {
        Order::NewestFirst => ") AS listed ORDER BY id DESC LIMIT ",
        Order::OldestFirst => ") AS listed ORDER BY id ASC LIMIT ",
    });
    q.push_bind(i64::from(p.limit));
    q
}

/// One table's part of the list statement: its rows matching the filter, in the page's range
/// and order, at most one page of them.
fn push_branch<D>(d: &D, q: &mut QueryBuilder<D::Db>, table: &'static str, p: &ListParams<'_>)
where
    D: ListDialect,
    for<'t> i64: Encode<'t, D::Db> + Type<D::Db>,
    for<'t> String: Encode<'t, D::Db> + Type<D::Db>,
{
    let f = p.filter;
    q.push(D::BRANCH).push(D::COLUMNS).push(", ");
    q.push(if table == EVENTS {
        D::NULL_ARCHIVED_AT
    } else {
        "archived_at"
    });
    q.push(" FROM ").push(d.table(table)).push(" WHERE TRUE");
    if !f.ids.is_empty() {
        q.push(" AND ");
        d.ids(q, &f.ids);
    }
    if !f.statuses.is_empty() {
        q.push(" AND ");
        d.statuses(q, &f.statuses);
    }
    if let Some(glob) = &f.event_type {
        q.push(" AND ");
        d.glob(q, "event_type", glob);
    }
    if let Some(glob) = &f.aggregate_type {
        q.push(" AND ");
        d.glob(q, "aggregate_type", glob);
    }
    if let Some(id) = &f.aggregate_id {
        q.push(" AND aggregate_id = ").push_bind(id.clone());
    }
    if f.parked && table == EVENTS {
        q.push(" AND ").push(d.parked());
    }
    if let Some(since) = f.since {
        q.push(" AND ");
        d.created(q, ">=", since);
    }
    if let Some(until) = f.until {
        q.push(" AND ");
        d.created(q, "<", until);
    }
    let newest_first = p.order == Order::NewestFirst;
    if let Some(after) = p.after {
        q.push(if newest_first {
            " AND id < "
        } else {
            " AND id > "
        });
        q.push_bind(after);
    }
    q.push(if newest_first {
        " ORDER BY id DESC LIMIT "
    } else {
        " ORDER BY id ASC LIMIT "
    });
    q.push_bind(i64::from(p.limit)).push(")");
}
