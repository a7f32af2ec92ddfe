//! The MySQL store: MySQL 8.0.23+ and MariaDB 10.6+, the first versions with `SKIP LOCKED`. One
//! outbox per database; no tenants (a relay serves several databases instead).
//!
//! What differs from PostgreSQL, and why the statements look the way they do:
//! - no `RETURNING` on `UPDATE`: a claim locks its rows, updates them and reads them back in one
//!   short transaction;
//! - `UPDATE … SET a = …, b = …` assigns left to right, each expression seeing the values set
//!   before it: every `SET` list below reads a column before assigning it;
//! - no partial indexes: due events are read in id order from the `PENDING` and the
//!   `PROCESSING` range of `(status, id)` and merged;
//! - no `NOTIFY`: relays find new events through the table's `AUTO_INCREMENT` counter (see
//!   [`Store::outbox_heads`]), a cheap read they repeat often when idle;
//! - the commit horizon comes from the ids themselves (see [`Store::commit_horizon`]), not from
//!   a view of open transactions as on PostgreSQL;
//! - claims take new work from a floor, as on PostgreSQL, and find the events below it that went
//!   wrong once through an index on a virtual column (`retry_due`, NULL for every other event),
//!   MySQL's stand-in for a partial index.
//!
//! Sessions run at `READ COMMITTED`, so that each statement of a claim sees what other relays
//! committed before it.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::str::FromStr;
use std::sync::LazyLock;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::mysql::MySqlArguments;
use sqlx::mysql::{MySql, MySqlConnectOptions, MySqlConnection, MySqlPool, MySqlPoolOptions};
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, QueryBuilder, Row};
use uuid::Uuid;

use super::list::{ListDialect, list_query};
use super::migrations::{self, Migration};
use super::row::{add_claimed_row, stored_event};
use super::{
    ArchiveBatch, ArchiveParams, Backlog, Capabilities, ClaimParams, Claimed,
    EXACT_PROCESSED_COUNT, EventStatus, FailedMark, GapParams, Gaps, Horizon, HorizonProbe,
    LEASE_EXPIRED, ListParams, MarkFailedParams, MarkProcessedParams, PurgeBatch, PurgeKind,
    PurgeParams, RETRIED_BY_OPERATOR, RETRIED_BY_SLOW_LANE, RejectedTenant, ReleaseParams,
    RenewParams, ReportedSink, RetryFailedParams, SlowLaneParams, StatusCounts, Store, StoredEvent,
    Tenant, TenantAddParams, TenantStatus, Wakeups, secs, storable_error,
};
use crate::error::{Error, Result};
use crate::glob::Glob;
use crate::inbox::InboxStats;
use crate::ops::StoreOps;
use crate::schema::{SchemaName, Target, TenantId};
use crate::sink::SinkHealth;

const MIGRATIONS: &[Migration] = &[
    Migration {
        name: "outbox_0001_events",
        sql: include_str!("../../sql/mysql/0001_outbox_events.sql"),
    },
    Migration {
        name: "outbox_0002_retry_due",
        sql: include_str!("../../sql/mysql/0002_retry_due.sql"),
    },
    Migration {
        name: "outbox_0003_retry_index",
        sql: include_str!("../../sql/mysql/0003_retry_index.sql"),
    },
    Migration {
        name: "outbox_0004_inbox",
        sql: include_str!("../../sql/mysql/0004_inbox.sql"),
    },
];

const NO_TENANTS: &str = "tenants need PostgreSQL: a MySQL database holds one outbox (use one \
                          database per tenant, and list them in the relay's database_urls)";

/// The oldest servers with `FOR UPDATE SKIP LOCKED` (and on MySQL, invisible columns).
const NEEDED: &str = "MySQL 8.0.23 or later (SKIP LOCKED, invisible columns), or MariaDB \
                      10.6 or later (SKIP LOCKED)";

/// A [`Store`] on MySQL 8.0.23+ or MariaDB 10.6+.
///
/// ```no_run
/// use postbox::{Event, StoreExt};
///
/// # async fn example() -> anyhow::Result<()> {
/// let store = postbox::MySqlStore::connect("mysql://app@127.0.0.1/shop").await?;
/// postbox::migrate(&store).await?;
/// let outbox = store.outbox();
/// let mut tx = store.pool().begin().await?;
/// sqlx::query("INSERT INTO orders (id) VALUES (7)").execute(&mut *tx).await?;
/// outbox
///     .enqueue(&mut tx, Event::new("OrderPlaced", &serde_json::json!({"id": 7}))?.aggregate("Order", "7"))
///     .await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub struct MySqlStore {
    pool: MySqlPool,
    /// The database (MySQL's schema) the outbox lives in.
    database: String,
    /// The last id handed out, and when it was read: the next call of
    /// [`Store::commit_horizon`] checks the ids up to it.
    pending_probe: std::sync::Mutex<Option<(std::time::Instant, i64)>>,
}

/// How long after the last id was read the commit horizon checks the ids up to it. InnoDB hands
/// an id out and writes its row (taking the row's lock) within one statement; this leaves that
/// step ample time.
const ID_SETTLE_DELAY: Duration = Duration::from_millis(100);

/// The most ids one call of [`Store::commit_horizon`] checks: a relay that starts beside a long
/// history settles it in steps of this many ids, one per round.
const CHECK_SPAN: i64 = 100_000;

/// Which server answers: MySQL or MariaDB, and its version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ServerVersion {
    mariadb: bool,
    major: u32,
    minor: u32,
    patch: u32,
}

impl ServerVersion {
    /// Reads `SELECT VERSION()`: `8.0.36`, `8.4.0-log`, `10.11.6-MariaDB-0+deb12u1`,
    /// `5.5.5-10.6.12-MariaDB` (the prefix some proxies add).
    pub(crate) fn parse(version: &str) -> Option<ServerVersion> {
        let mariadb = version.to_ascii_lowercase().contains("mariadb");
        let text = version.strip_prefix("5.5.5-").unwrap_or(version);
        let mut parts = text
            .split(|c: char| !c.is_ascii_digit())
            .filter(|p| !p.is_empty());
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        let patch = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        Some(ServerVersion {
            mariadb,
            major,
            minor,
            patch,
        })
    }

    /// Whether the server has what the store needs.
    pub(crate) fn supported(&self) -> bool {
        if self.mariadb {
            (self.major, self.minor) >= (10, 6)
        } else {
            // 8.0.23: invisible columns (0002_retry_due.sql).
            (self.major, self.minor, self.patch) >= (8, 0, 23)
        }
    }
}

/// Refuses a server without `SKIP LOCKED`, naming the versions needed.
async fn check_version(conn: &mut MySqlConnection) -> Result<ServerVersion> {
    let version: String = sqlx::query_scalar(include_str!("../../sql/mysql/version.sql"))
        .fetch_one(&mut *conn)
        .await?;
    match ServerVersion::parse(&version) {
        Some(v) if v.supported() => Ok(v),
        _ => Err(Error::invalid_config(
            "database_url",
            format!("the server is version {version}; Postbox needs {NEEDED}"),
        )),
    }
}

impl MySqlStore {
    /// Connects to `url` (`mysql://user:password@host:3306/database`), refusing a server older
    /// than MySQL 8.0.23 or MariaDB 10.6. The URL must name the database.
    pub async fn connect(url: &str) -> Result<Self> {
        let options = MySqlConnectOptions::from_str(url.trim())?;
        Self::connect_with(options, 10).await
    }

    /// Connects with `options` and a pool of at most `max_connections`.
    pub async fn connect_with(options: MySqlConnectOptions, max_connections: u32) -> Result<Self> {
        Self::connect_pool(options, max_connections, None).await
    }

    /// [`MySqlStore::connect_with`], with how long a statement waits for a free connection.
    pub(crate) async fn connect_pool(
        options: MySqlConnectOptions,
        max_connections: u32,
        acquire_timeout: Option<std::time::Duration>,
    ) -> Result<Self> {
        let mut pool = MySqlPoolOptions::new()
            .max_connections(max_connections.max(1))
            .after_connect(|conn, _| Box::pin(async move { prepare_session(conn).await }));
        if let Some(timeout) = acquire_timeout {
            pool = pool.acquire_timeout(timeout);
        }
        Self::from_pool(pool.connect_with(options).await?).await
    }

    /// A store over an existing pool. Its sessions should run at `READ COMMITTED`; on MySQL,
    /// with `information_schema_stats_expiry = 0` (the pools of [`MySqlStore::connect`] do).
    pub async fn from_pool(pool: MySqlPool) -> Result<Self> {
        let mut conn = pool.acquire().await?;
        check_version(&mut conn).await?;
        let database: Option<String> =
            sqlx::query_scalar(include_str!("../../sql/mysql/database.sql"))
                .fetch_one(&mut *conn)
                .await?;
        let database = database.ok_or_else(|| {
            Error::invalid_config(
                "database_url",
                "the MySQL URL names no database; add it, e.g. mysql://user@host:3306/app",
            )
        })?;
        drop(conn);
        Ok(MySqlStore {
            pool,
            database,
            pending_probe: std::sync::Mutex::new(None),
        })
    }

    /// The connection pool.
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    fn check_target(target: &Target) -> Result<()> {
        if target.tenant.is_some() {
            return Err(Error::Unsupported(NO_TENANTS));
        }
        Ok(())
    }

    /// Where a relay's first horizon starts, as safe as the later ones: `Ok(id)` when no open
    /// transaction holds an id at or below `id`, from where the ids are checked as usual (the
    /// lowest committed id less one: below it a row of the table can only be one that is not
    /// committed yet, which a locking read that does not wait finds); `Err(id)` with the lowest
    /// id an open transaction holds, when one holds an id below every committed one. A few
    /// locking reads of ranges with no committed row (a binary search), whatever the history.
    async fn first_horizon(&self, head: i64) -> Result<std::result::Result<i64, i64>> {
        let lowest: Option<i64> =
            sqlx::query_scalar(include_str!("../../sql/mysql/horizon_lowest.sql"))
                .fetch_one(&self.pool)
                .await
                .map_err(|e| self.missing(e))?;
        let below = lowest.unwrap_or(head.saturating_add(1));
        let (mut lo, mut hi) = (1, below - 1);
        if hi < lo || !self.held_in(lo, hi).await {
            return Ok(Ok(below - 1));
        }
        // A held id lies in [lo, hi]: halve the range until it is one id.
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.held_in(lo, mid).await {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        Ok(Err(lo))
    }

    /// Whether an open transaction holds an id in `from..=to` (a range with no committed row).
    /// A read that fails for another reason counts as held: the horizon then waits, never
    /// passes an id it could not check.
    async fn held_in(&self, from: i64, to: i64) -> bool {
        sqlx::query(include_str!("../../sql/mysql/horizon_locked_range.sql"))
            .bind(from)
            .bind(to)
            .fetch_optional(&self.pool)
            .await
            .is_err()
    }

    fn missing(&self, err: sqlx::Error) -> Error {
        // 1146: table doesn't exist; 1054: unknown column (a migration of this release
        // missing).
        if let sqlx::Error::Database(db) = &err
            && matches!(db.code().as_deref(), Some("42S02" | "42S22"))
        {
            return Error::NotMigrated {
                schema: self.database.clone(),
            };
        }
        Error::Database(err)
    }
}

/// Every session of a store's pool: `READ COMMITTED`, and on MySQL live `information_schema`
/// table statistics (its `AUTO_INCREMENT` is cached for a day otherwise).
async fn prepare_session(conn: &mut MySqlConnection) -> std::result::Result<(), sqlx::Error> {
    sqlx::query(include_str!("../../sql/mysql/session.sql"))
        .execute(&mut *conn)
        .await?;
    let version: String = sqlx::query_scalar(include_str!("../../sql/mysql/version.sql"))
        .fetch_one(&mut *conn)
        .await?;
    if ServerVersion::parse(&version).is_some_and(|v| !v.mariadb) {
        sqlx::query(include_str!("../../sql/mysql/session_mysql.sql"))
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// `(?, ?, ?)`: one bound `?` for each of `ids`, inside parentheses.
fn push_ids(query: &mut QueryBuilder<MySql>, ids: &[i64]) {
    query.push("(");
    let mut list = query.separated(", ");
    for id in ids {
        list.push_bind(*id);
    }
    list.push_unseparated(")");
}

/// A statement of `sql/mysql/` with its lists spelled out: each `{name}` marker becomes one `?`
/// per item (`?, ?, ?`), or one `(?, ?)` per pair for `pairs`. Only placeholders are added.
///
/// Written by hand because MySQL takes no array parameter, and a list read from one JSON
/// parameter (`JSON_TABLE`) would cost `UPDATE … WHERE id IN (…)` its primary-key lookups on
/// MariaDB before 11.1 (no semi-join in a single-table `UPDATE` or `DELETE`). Every list must
/// hold at least one item (`IN ()` is not SQL): callers return early on an empty one.
fn spelled(
    template: &'static str,
    lists: &[(&str, usize)],
    pairs: &[(&str, usize)],
) -> AssertSqlSafe<String> {
    let mut sql = template.to_owned();
    for (marker, count, one) in lists
        .iter()
        .map(|(m, n)| (m, n, "?"))
        .chain(pairs.iter().map(|(m, n)| (m, n, "(?, ?)")))
    {
        debug_assert!(*count > 0, "an empty list for {{{marker}}}");
        sql = sql.replace(&format!("{{{marker}}}"), &vec![one; *count].join(", "));
    }
    AssertSqlSafe(sql)
}

/// A statement whose one list, `{ids}`, holds `ids`, bound after `binds` (see [`spelled`]).
fn with_ids<'q>(template: &'static str, ids: &'q [i64]) -> Query<'q, MySql, MySqlArguments> {
    sqlx::query(spelled(template, &[("ids", ids.len())], &[]))
}

/// Binds each of `ids`, in order.
fn bind_ids<'q>(
    q: Query<'q, MySql, MySqlArguments>,
    ids: &[i64],
) -> Query<'q, MySql, MySqlArguments> {
    ids.iter().fold(q, |q, id| q.bind(*id))
}

/// The claim's two reads (claim_pick.sql, claim_retried.sql), with the ordering rule they share
/// (claim_in_order.sql) written in.
static CLAIM_PICK: LazyLock<String> = LazyLock::new(|| {
    include_str!("../../sql/mysql/claim_pick.sql").replace(
        "{in_order}",
        include_str!("../../sql/mysql/claim_in_order.sql"),
    )
});
static CLAIM_RETRIED: LazyLock<String> = LazyLock::new(|| {
    include_str!("../../sql/mysql/claim_retried.sql").replace(
        "{in_order}",
        include_str!("../../sql/mysql/claim_in_order.sql"),
    )
});

/// Microseconds of a duration, for `INTERVAL ? MICROSECOND`.
fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// The ordered aggregate types as the claim and the backlog take them: a JSON array.
fn ordered_json(types: &[String]) -> Result<String> {
    Ok(serde_json::to_string(types)?)
}

/// One picked row: id, whether it is a stale claim, and its aggregate.
type Picked = (i64, bool, Option<String>, Option<String>);

/// Keeps of `picked` (in id order) only the ordered events whose every earlier unfinished event
/// (`unfinished`: id and aggregate) was picked too: another claim in flight may hold one, and
/// then the later ones are not this claim's to publish.
fn keep_own_heads(
    picked: Vec<Picked>,
    types: &[String],
    unfinished: &[(i64, String, String)],
) -> Vec<Picked> {
    let ids: HashSet<i64> = picked.iter().map(|p| p.0).collect();
    let mut blocked_from: HashMap<(&str, &str), i64> = HashMap::new();
    for (id, at, aid) in unfinished {
        if !ids.contains(id) {
            let first = blocked_from
                .entry((at.as_str(), aid.as_str()))
                .or_insert(*id);
            *first = (*first).min(*id);
        }
    }
    picked
        .into_iter()
        .filter(|(id, _, at, aid)| match (at, aid) {
            (Some(at), Some(aid)) if crate::ordering::orders_type(types, at) => blocked_from
                .get(&(at.as_str(), aid.as_str()))
                .is_none_or(|first| first > id),
            _ => true,
        })
        .collect()
}

/// The list statement's MySQL words (`store/list.rs`): `IN (?, ?)` for lists, `LIKE` for globs
/// (the table's collation is binary: case-sensitive, as the globs are), UTC times without a zone.
struct MySqlList;

impl ListDialect for MySqlList {
    type Db = MySql;
    const BRANCH: &'static str = "(";
    const COLUMNS: &'static str = include_str!("../../sql/mysql/list_columns.sql");
    const NULL_ARCHIVED_AT: &'static str = "CAST(NULL AS DATETIME(6)) AS archived_at";

    fn table(&self, table: &'static str) -> Cow<'static, str> {
        Cow::Borrowed(table)
    }

    fn parked(&self) -> Cow<'static, str> {
        Cow::Borrowed(include_str!("../../sql/mysql/list_parked.sql"))
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

/// The prefix of retention's named lock (archiving and purging run one at a time per database).
const RETENTION_LOCK: &str = "postbox_retention:";

/// The prefix of the migration's named lock.
const MIGRATION_LOCK: &str = "postbox_migrate:";

/// Takes the named lock of this database's outbox for `what` on `conn`'s session, waiting up to
/// `wait_secs`. False when another session holds it.
async fn try_lock(conn: &mut MySqlConnection, what: &str, wait_secs: i64) -> Result<bool> {
    let got: Option<i64> = sqlx::query_scalar(include_str!("../../sql/mysql/lock.sql"))
        .bind(what)
        .bind(wait_secs)
        .fetch_one(&mut *conn)
        .await?;
    Ok(got == Some(1))
}

async fn unlock(conn: &mut MySqlConnection, what: &str) -> Result<()> {
    sqlx::query(include_str!("../../sql/mysql/unlock.sql"))
        .bind(what)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

#[async_trait]
impl Store for MySqlStore {
    fn capabilities(&self) -> Capabilities {
        Capabilities::SERVER
    }

    fn default_schema(&self) -> SchemaName {
        SchemaName::new(&self.database).unwrap_or_else(|_| SchemaName::public())
    }

    async fn events_claim(&self, p: &ClaimParams<'_>) -> Result<Claimed> {
        Self::check_target(p.target)?;
        let token = Uuid::new_v4();
        let mut claimed = Claimed {
            claim_token: token,
            ..Claimed::default()
        };
        let ordered = ordered_json(p.order.aggregate_types)?;
        let mut tx = self.pool.begin().await?;
        // Due rows of both ranges at or above the floor, and the retried ones below it, in id
        // order; the first batch_size of them (rows locked beyond it are let go at commit).
        let mut picked: Vec<Picked> = Vec::new();
        let mut reads = vec![
            (&**CLAIM_PICK, Some("PENDING")),
            (&**CLAIM_PICK, Some("PROCESSING")),
        ];
        if p.floor > 0 {
            reads.push((&**CLAIM_RETRIED, None));
        }
        for (statement, status) in reads {
            let mut read = sqlx::query_as(AssertSqlSafe(statement));
            if let Some(status) = status {
                read = read.bind(status);
            }
            let rows: Vec<Picked> = read
                .bind(p.floor)
                .bind(&ordered)
                .bind(&ordered)
                .bind(p.order.settled_through)
                .bind(i64::from(p.batch_size))
                .fetch_all(&mut *tx)
                .await
                .map_err(|e| self.missing(e))?;
            picked.extend(rows);
        }
        picked.sort_unstable_by_key(|r| r.0);
        picked.truncate(p.batch_size as usize);
        if p.order.is_on() {
            picked = self
                .own_heads(&mut tx, picked, p.order.aggregate_types)
                .await?;
        }
        if picked.is_empty() {
            tx.commit().await?;
            return Ok(claimed);
        }
        let ids: Vec<i64> = picked.iter().map(|r| r.0).collect();
        let mut stale: Vec<i64> = picked.iter().filter(|r| r.1).map(|r| r.0).collect();
        if stale.is_empty() {
            // No id: `id IN (-1)` is false for every row.
            stale.push(-1);
        }
        let take = with_ids(include_str!("../../sql/mysql/claim_take.sql"), &ids)
            .bind(LEASE_EXPIRED)
            .bind(micros(p.lease))
            .bind(p.relay_id)
            .bind(token.to_string());
        bind_ids(take, &ids).execute(&mut *tx).await?;
        let read = sqlx::query(spelled(
            include_str!("../../sql/mysql/claim_read.sql"),
            &[("stale", stale.len()), ("ids", ids.len())],
            &[],
        ));
        let rows = bind_ids(bind_ids(read, &stale), &ids)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        for row in &rows {
            add_claimed_row(&mut claimed, row, None)?;
        }
        Ok(claimed)
    }

    async fn claim_floor(&self, target: &Target, from: i64, settled: i64) -> Result<i64> {
        Self::check_target(target)?;
        let first: Option<i64> =
            sqlx::query_scalar(include_str!("../../sql/mysql/claim_floor.sql"))
                .bind(from)
                .bind(from)
                .fetch_one(&self.pool)
                .await
                .map_err(|e| self.missing(e))?;
        let up_to = settled.saturating_add(1);
        Ok(first.unwrap_or(up_to).min(up_to))
    }

    async fn claim_gaps(&self, p: &GapParams<'_>) -> Result<Gaps> {
        Self::check_target(p.target)?;
        // Placeholders only, one `id BETWEEN ? AND ?` per range: no value is written into it.
        let ranges = if p.passed.is_empty() {
            "FALSE".to_owned()
        } else {
            vec!["(id BETWEEN ? AND ?)"; p.passed.len()].join(" OR ")
        };
        let text = include_str!("../../sql/mysql/claim_gaps.sql").replace("{ranges}", &ranges);
        let mut query = sqlx::query(AssertSqlSafe(text));
        for range in p.passed {
            query = query.bind(*range.start()).bind(*range.end());
        }
        let rows = query
            .bind(p.after)
            .bind(i64::from(p.limit))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.missing(e))?;
        let rows = rows
            .iter()
            .map(|r| -> Result<(i64, bool, bool, bool)> {
                let flag = |i: usize| -> Result<bool> { Ok(r.try_get::<i64, _>(i)? != 0) };
                Ok((r.try_get(0)?, flag(1)?, flag(2)?, flag(3)?))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(super::gaps_from(rows))
    }

    async fn leases_renew(&self, p: &RenewParams<'_>) -> Result<u64> {
        Self::check_target(p.target)?;
        if p.ids.is_empty() {
            return Ok(0);
        }
        let q = with_ids(include_str!("../../sql/mysql/renew.sql"), p.ids)
            .bind(micros(p.lease))
            .bind(p.claim_token.to_string());
        Ok(bind_ids(q, p.ids)
            .execute(&self.pool)
            .await?
            .rows_affected())
    }

    async fn events_mark_processed(&self, p: &MarkProcessedParams<'_>) -> Result<u64> {
        Self::check_target(p.target)?;
        if p.ids.is_empty() {
            return Ok(0);
        }
        let q = with_ids(include_str!("../../sql/mysql/mark_processed.sql"), p.ids)
            .bind(p.claim_token.to_string());
        Ok(bind_ids(q, p.ids)
            .execute(&self.pool)
            .await?
            .rows_affected())
    }

    async fn events_mark_failed(&self, p: &MarkFailedParams<'_>) -> Result<Vec<FailedMark>> {
        Self::check_target(p.target)?;
        if p.tries.is_empty() {
            return Ok(Vec::new());
        }
        let token = p.claim_token.to_string();
        let mut tx = self.pool.begin().await?;
        let mut marks = Vec::with_capacity(p.tries.len());
        for t in p.tries {
            let done = sqlx::query(include_str!("../../sql/mysql/mark_failed.sql"))
                .bind(t.permanent)
                .bind(t.max_retries)
                .bind(micros(p.retry.cap))
                .bind(micros(p.retry.base))
                .bind(t.permanent)
                .bind(t.max_retries)
                .bind(t.max_retries)
                .bind(storable_error(&t.error))
                .bind(t.id)
                .bind(&token)
                .execute(&mut *tx)
                .await?;
            if done.rows_affected() == 0 {
                continue;
            }
            let (retry_count, gave_up): (i32, bool) =
                sqlx::query_as(include_str!("../../sql/mysql/mark_failed_read.sql"))
                    .bind(t.id)
                    .fetch_one(&mut *tx)
                    .await?;
            marks.push(FailedMark {
                id: t.id,
                retry_count,
                gave_up,
            });
        }
        tx.commit().await?;
        Ok(marks)
    }

    async fn events_release(&self, p: &ReleaseParams<'_>) -> Result<u64> {
        Self::check_target(p.target)?;
        if p.releases.is_empty() {
            return Ok(0);
        }
        let token = p.claim_token.to_string();
        let mut tx = self.pool.begin().await?;
        let mut released = 0;
        for r in p.releases {
            released += sqlx::query(include_str!("../../sql/mysql/release.sql"))
                .bind(micros(r.delay))
                .bind(storable_error(&r.error))
                .bind(r.id)
                .bind(&token)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        }
        tx.commit().await?;
        Ok(released)
    }

    async fn backlog(&self, target: &Target, ordered: &[String]) -> Result<Backlog> {
        Self::check_target(target)?;
        let ordered = ordered_json(ordered)?;
        let due: Option<f64> = sqlx::query_scalar(include_str!("../../sql/mysql/backlog.sql"))
            .bind(&ordered)
            .bind(&ordered)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.missing(e))?;
        Ok(Backlog {
            next_due_in: secs(due),
        })
    }

    async fn commit_horizon(
        &self,
        target: &Target,
        probe: Option<&HorizonProbe>,
    ) -> Result<Horizon> {
        Self::check_target(target)?;
        // MySQL has no view of the transactions writing to a table that can be trusted here
        // (information_schema.INNODB_TRX is served from a cache that frequent readers keep
        // stale), so the horizon is found from the ids themselves: every id up to the last one
        // handed out (read at least ID_SETTLE_DELAY earlier) is committed, rolled back or held
        // by an open transaction — and only the last kind is locked. Ids missing from the table
        // and the archive get a locking read that does not wait: a lock conflict is an open
        // transaction's row, and the horizon stops below it. The probe carries the horizon so
        // far (`last_id`) and the id it waits for (`writers`).
        let pending = *self
            .pending_probe
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((read_at, _)) = pending
            && read_at.elapsed() < ID_SETTLE_DELAY
        {
            // The last id read is too fresh to check: the horizon stays where it is.
            return Ok(Horizon {
                settled: probe.map(|p| p.last_id),
                probe: probe.cloned(),
            });
        }
        let now_head: Option<i64> = sqlx::query_scalar(include_str!("../../sql/mysql/head.sql"))
            .fetch_optional(&self.pool)
            .await?
            .flatten();
        let floor = match probe {
            Some(p) => p.last_id,
            None => match self.first_horizon(now_head.unwrap_or(0)).await? {
                Ok(start) => start,
                // An open transaction holds an id below every committed one: wait for it.
                Err(held) => {
                    return Ok(Horizon {
                        settled: Some(held - 1),
                        probe: Some(HorizonProbe {
                            last_id: held - 1,
                            writers: vec![format!("the transaction that inserted id {held}")],
                        }),
                    });
                }
            },
        };
        let upto = pending.map_or(floor, |(_, last)| {
            last.min(floor.saturating_add(CHECK_SPAN))
        });
        *self
            .pending_probe
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            now_head.map(|h| (std::time::Instant::now(), h));
        let mut settled = upto.max(floor);
        let mut waiting_for = None;
        if upto > floor {
            let present: HashSet<i64> =
                sqlx::query_scalar(include_str!("../../sql/mysql/horizon_present.sql"))
                    .bind(floor)
                    .bind(upto)
                    .bind(floor)
                    .bind(upto)
                    .fetch_all(&self.pool)
                    .await
                    .map_err(|e| self.missing(e))?
                    .into_iter()
                    .collect();
            for id in (floor + 1..=upto).filter(|id| !present.contains(id)) {
                let locked = sqlx::query(include_str!("../../sql/mysql/horizon_locked.sql"))
                    .bind(id)
                    .fetch_optional(&self.pool)
                    .await
                    .is_err();
                if locked {
                    settled = id - 1;
                    waiting_for = Some(id);
                    break;
                }
            }
        }
        Ok(Horizon {
            settled: Some(settled),
            probe: Some(HorizonProbe {
                last_id: settled,
                writers: waiting_for
                    .map(|id| vec![format!("the transaction that inserted id {id}")])
                    .unwrap_or_default(),
            }),
        })
    }

    async fn outbox_heads(&self, targets: &[Target]) -> Result<Vec<Option<i64>>> {
        let head: Option<i64> = sqlx::query_scalar(include_str!("../../sql/mysql/head.sql"))
            .fetch_optional(&self.pool)
            .await?
            .flatten();
        Ok(targets
            .iter()
            .map(|t| if t.tenant.is_none() { head } else { None })
            .collect())
    }

    async fn wakeups(&self) -> Result<Option<Box<dyn Wakeups>>> {
        Ok(None)
    }
}

#[async_trait]
impl StoreOps for MySqlStore {
    async fn tenant_rejected(&self) -> Result<Vec<RejectedTenant>> {
        // Tenant ids and schema names are checked when they are registered; no row can be bad.
        Ok(Vec::new())
    }

    async fn outbox_dead_rows(&self, targets: &[Target]) -> Result<Vec<u64>> {
        // InnoDB purges old row versions by itself; none wait for a vacuum.
        Ok(vec![0; targets.len()])
    }

    async fn outbox_vacuum(&self, _target: &Target) -> Result<()> {
        Ok(())
    }

    async fn schema_migrate(&self, _schema: &SchemaName, _registry: bool) -> Result<Vec<String>> {
        // MySQL commits each DDL statement at once: a named lock keeps migrations one at a time.
        let mut conn = self.pool.acquire().await?;
        if !try_lock(&mut conn, MIGRATION_LOCK, 60).await? {
            return Err(Error::Unsupported(
                "another `postbox migrate` has held the migration lock of this database for a \
                 minute; try again when it is done",
            ));
        }
        let history = migrations::History {
            create: include_str!("../../sql/mysql/history_create.sql").to_owned(),
            read: include_str!("../../sql/mysql/history_read.sql").to_owned(),
            record: include_str!("../../sql/mysql/history_record.sql").to_owned(),
        };
        let applied =
            migrations::apply::<MySql>(&mut conn, &history, MIGRATIONS, str::to_owned).await;
        unlock(&mut conn, MIGRATION_LOCK).await?;
        applied
    }

    async fn events_retry_failed(&self, p: &RetryFailedParams<'_>) -> Result<u64> {
        Self::check_target(p.target)?;
        let q = match p.ids {
            Some([]) => return Ok(0),
            Some(ids) => bind_ids(
                with_ids(include_str!("../../sql/mysql/retry_failed.sql"), ids)
                    .bind(RETRIED_BY_OPERATOR),
                ids,
            ),
            None => sqlx::query(include_str!("../../sql/mysql/retry_failed_all.sql"))
                .bind(RETRIED_BY_OPERATOR),
        };
        Ok(q.execute(&self.pool)
            .await
            .map_err(|e| self.missing(e))?
            .rows_affected())
    }

    async fn events_retry_slow_lane(&self, p: &SlowLaneParams<'_>) -> Result<u64> {
        Self::check_target(p.target)?;
        let mut tx = self.pool.begin().await?;
        // Candidates in id order, a few more than the batch for the excluded types, locked; the
        // retry policies' globs are matched here (MySQL's LIKE has no per-pattern escape that
        // every version reads alike).
        let candidates: Vec<(i64, String)> =
            sqlx::query_as(include_str!("../../sql/mysql/slow_lane_pick.sql"))
                .bind(micros(p.after))
                .bind(i64::from(p.max_tries))
                .bind(i64::from(p.batch_size).saturating_mul(4))
                .fetch_all(&mut *tx)
                .await
                .map_err(|e| self.missing(e))?;
        let ids: Vec<i64> = candidates
            .into_iter()
            .filter(|(_, event_type)| !p.exclude.iter().any(|g| g.matches(event_type)))
            .map(|(id, _)| id)
            .take(p.batch_size as usize)
            .collect();
        if ids.is_empty() {
            tx.commit().await?;
            return Ok(0);
        }
        let take = with_ids(include_str!("../../sql/mysql/slow_lane_take.sql"), &ids)
            .bind(RETRIED_BY_SLOW_LANE);
        let done = bind_ids(take, &ids)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(done)
    }

    async fn events_list(&self, p: &ListParams<'_>) -> Result<Vec<StoredEvent>> {
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

    async fn events_archive(&self, p: &ArchiveParams<'_>) -> Result<Option<ArchiveBatch>> {
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

    async fn events_purge(&self, p: &PurgeParams<'_>) -> Result<Option<PurgeBatch>> {
        Self::check_target(p.target)?;
        let age = micros(p.older_than);
        let (purge, count) = match p.kind {
            PurgeKind::Archive => (
                include_str!("../../sql/mysql/purge_archive.sql"),
                include_str!("../../sql/mysql/purge_archive_count.sql"),
            ),
            PurgeKind::Failed => (
                include_str!("../../sql/mysql/purge_failed.sql"),
                include_str!("../../sql/mysql/purge_failed_count.sql"),
            ),
            PurgeKind::Inbox => (
                include_str!("../../sql/mysql/inbox_purge.sql"),
                include_str!("../../sql/mysql/inbox_purge_count.sql"),
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

    async fn status_counts(&self, target: &Target) -> Result<StatusCounts> {
        Self::check_target(target)?;
        let row = sqlx::query(include_str!("../../sql/mysql/status_counts.sql"))
            .bind(EXACT_PROCESSED_COUNT + 1)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.missing(e))?;
        let counted: i64 = row.try_get(2)?;
        let (processed, processed_exact) = if counted > EXACT_PROCESSED_COUNT {
            // Past the exact limit: the table's row estimate less the other statuses.
            let estimate: Option<i64> =
                sqlx::query_scalar(include_str!("../../sql/mysql/table_rows.sql"))
                    .fetch_optional(&self.pool)
                    .await?
                    .flatten();
            let others: i64 =
                row.try_get::<i64, _>(0)? + row.try_get::<i64, _>(1)? + row.try_get::<i64, _>(3)?;
            (
                estimate.map_or(counted, |e| (e - others).max(counted)),
                false,
            )
        } else {
            (counted, true)
        };
        Ok(StatusCounts {
            pending: row.try_get(0)?,
            processing: row.try_get(1)?,
            processed,
            processed_exact,
            failed: row.try_get(3)?,
            oldest_pending_age: secs(row.try_get(4)?),
            dead_tuples: None,
        })
    }

    async fn events_skip(&self, target: &Target, ids: &[i64]) -> Result<Vec<i64>> {
        Self::check_target(target)?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.pool.begin().await?;
        let pick = sqlx::query_scalar(spelled(
            include_str!("../../sql/mysql/skip_pick.sql"),
            &[("ids", ids.len())],
            &[],
        ));
        let skipped: Vec<i64> = ids
            .iter()
            .fold(pick, |q, id| q.bind(*id))
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| self.missing(e))?;
        if !skipped.is_empty() {
            let skip = with_ids(include_str!("../../sql/mysql/skip.sql"), &skipped);
            bind_ids(skip, &skipped).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(skipped)
    }

    async fn oldest_transaction_age(&self) -> Result<Option<Duration>> {
        // A long transaction keeps InnoDB's purge from removing old row versions.
        let age: Option<f64> =
            sqlx::query_scalar(include_str!("../../sql/mysql/oldest_transaction.sql"))
                .fetch_one(&self.pool)
                .await?;
        Ok(secs(age))
    }

    async fn sinks_report(&self, relay_id: &str, sinks: &[SinkHealth]) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(include_str!("../../sql/mysql/sinks_forget.sql"))
            .bind(relay_id)
            .execute(&mut *tx)
            .await
            .map_err(|e| self.missing(e))?;
        for sink in sinks {
            sqlx::query(include_str!("../../sql/mysql/sinks_report.sql"))
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

    async fn inbox_stats(&self, target: &Target) -> Result<Vec<InboxStats>> {
        Self::check_target(target)?;
        let rows: Vec<(String, i64, i64)> =
            sqlx::query_as(include_str!("../../sql/mysql/inbox_stats.sql"))
                .bind(super::INBOX_COUNT_LIMIT)
                .fetch_all(&self.pool)
                .await
                .map_err(|e| self.missing(e))?;
        Ok(super::inbox_stats(rows))
    }

    async fn sinks_reported(&self) -> Result<Vec<ReportedSink>> {
        let rows: Vec<super::ReportedRow> =
            sqlx::query_as(include_str!("../../sql/mysql/sinks_reported.sql"))
                .fetch_all(&self.pool)
                .await
                .map_err(|e| self.missing(e))?;
        Ok(super::reported_sinks(rows))
    }

    async fn tenant_add(&self, _p: &TenantAddParams<'_>) -> Result<Tenant> {
        Err(Error::Unsupported(NO_TENANTS))
    }

    async fn tenant_list(&self) -> Result<Vec<Tenant>> {
        Err(Error::Unsupported(NO_TENANTS))
    }

    async fn tenant_set_status(&self, _id: &TenantId, _status: TenantStatus) -> Result<Tenant> {
        Err(Error::Unsupported(NO_TENANTS))
    }
}

impl MySqlStore {
    /// The ordered events of `picked` that are this claim's: every earlier unfinished event of
    /// their aggregate was picked too (read committed: an event another claim has locked but
    /// not yet taken still reads `PENDING`, and holds its aggregate back here).
    async fn own_heads(
        &self,
        tx: &mut MySqlConnection,
        picked: Vec<Picked>,
        types: &[String],
    ) -> Result<Vec<Picked>> {
        let aggregates: HashSet<(&str, &str)> = picked
            .iter()
            .filter_map(|(_, _, at, aid)| match (at, aid) {
                (Some(at), Some(aid)) if crate::ordering::orders_type(types, at) => {
                    Some((at.as_str(), aid.as_str()))
                }
                _ => None,
            })
            .collect();
        if aggregates.is_empty() {
            return Ok(picked);
        }
        let last = picked.last().map_or(0, |p| p.0);
        let heads = sqlx::query_as(spelled(
            include_str!("../../sql/mysql/claim_heads.sql"),
            &[],
            &[("aggregates", aggregates.len())],
        ))
        .bind(last);
        let unfinished: Vec<(i64, String, String)> = aggregates
            .iter()
            .fold(heads, |q, (at, aid)| q.bind(*at).bind(*aid))
            .fetch_all(&mut *tx)
            .await?;
        Ok(keep_own_heads(picked, types, &unfinished))
    }

    async fn archive_batch(
        &self,
        conn: &mut MySqlConnection,
        p: &ArchiveParams<'_>,
    ) -> Result<ArchiveBatch> {
        let walked: Vec<(i64, bool, bool)> =
            sqlx::query_as(include_str!("../../sql/mysql/archive_walk.sql"))
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
            let copy = with_ids(include_str!("../../sql/mysql/archive_move.sql"), &old);
            bind_ids(copy, &old).execute(&mut *tx).await?;
            let delete = with_ids(include_str!("../../sql/mysql/archive_delete.sql"), &old);
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_claims_reads_have_the_ordering_rule_written_in_once() {
        let rule = include_str!("../../sql/mysql/claim_in_order.sql");
        for statement in [&*CLAIM_PICK, &*CLAIM_RETRIED] {
            assert!(!statement.contains("{in_order}"), "{statement}");
            assert_eq!(statement.matches(rule).count(), 1, "{statement}");
        }
    }

    #[test]
    fn versions_without_skip_locked_are_refused() {
        let v = |s: &str| ServerVersion::parse(s).map(|v| v.supported());
        assert_eq!(v("8.0.36"), Some(true));
        assert_eq!(v("8.0.22"), Some(false));
        assert_eq!(v("8.0.23-log"), Some(true));
        assert_eq!(v("8.4.0-log"), Some(true));
        assert_eq!(v("5.7.44"), Some(false));
        assert_eq!(v("10.11.19-MariaDB-0+deb12u1"), Some(true));
        assert_eq!(v("10.6.12-MariaDB"), Some(true));
        assert_eq!(v("10.5.23-MariaDB"), Some(false));
        assert_eq!(v("5.5.5-10.6.12-MariaDB"), Some(true));
        assert_eq!(v("nonsense"), None);
    }

    #[test]
    fn an_ordered_event_behind_another_claims_head_is_not_taken() {
        let types = vec!["Invoice".to_owned()];
        let inv = |id: i64, aggregate: &str| -> Picked {
            (id, false, Some("Invoice".into()), Some(aggregate.into()))
        };
        let picked = vec![
            inv(2, "1"),
            inv(3, "2"),
            (4, false, Some("Order".into()), Some("1".into())),
            inv(5, "2"),
        ];
        // Event 1 of invoice 1 is locked by another claim (unfinished, not picked here).
        let unfinished = vec![
            (1, "Invoice".into(), "1".into()),
            (2, "Invoice".into(), "1".into()),
            (3, "Invoice".into(), "2".into()),
        ];
        let kept: Vec<i64> = keep_own_heads(picked, &types, &unfinished)
            .into_iter()
            .map(|p| p.0)
            .collect();
        assert_eq!(kept, [3, 4, 5]);
    }
}
