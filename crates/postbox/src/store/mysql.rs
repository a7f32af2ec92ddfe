//! The MySQL store: MySQL 8.0+ and MariaDB 10.6+, the first versions with `SKIP LOCKED`. One
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
//! - the commit horizon of ordered claims comes from `information_schema.INNODB_TRX` (the
//!   `PROCESS` privilege), as it comes from `pg_locks` on PostgreSQL.
//!
//! Sessions run at `READ COMMITTED`, so that each statement of a claim sees what other relays
//! committed before it.

use std::collections::{HashMap, HashSet};
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::mysql::{MySql, MySqlConnectOptions, MySqlConnection, MySqlPool, MySqlPoolOptions};
use sqlx::{Executor, QueryBuilder, Row};
use uuid::Uuid;

use super::migrations::{self, Migration};
use super::row::{add_claimed_row, stored_event};
use super::{
    ArchiveBatch, ArchiveParams, Backlog, ClaimParams, Claimed, EXACT_PROCESSED_COUNT, FailedMark,
    Horizon, HorizonProbe, ListParams, MarkFailedParams, MarkProcessedParams, Order, PurgeBatch,
    PurgeKind, PurgeParams, ReleaseParams, RenewParams, ReportedSink, RetryFailedParams,
    SlowLaneParams, StatusCounts, Store, StoredEvent, Tenant, TenantAddParams, TenantStatus,
    Wakeups, secs, storable_error,
};
use crate::error::{Error, Result};
use crate::schema::{SchemaName, Target, TenantId};
use crate::sink::SinkHealth;

const MIGRATIONS: &[Migration] = &[Migration {
    name: "outbox_0001_events",
    sql: include_str!("../../sql/mysql/0001_outbox_events.sql"),
}];

const NO_TENANTS: &str = "tenants need PostgreSQL: a MySQL database holds one outbox (use one \
                          database per tenant, and list them in the relay's database_urls)";

/// The columns a claim reads back, by the names `store/row.rs` decodes.
const CLAIMED_COLUMNS: &str = "id, status = 'FAILED' AS exhausted, event_type, aggregate_type, \
     aggregate_id, idempotency_key, payload, headers, event_class, schema_version, retry_count, \
     max_retries, created_at, last_error";

/// Every column of a list row, by name (`archived_at` is added per table).
const LIST_COLUMNS: &str = "id, status, event_type, aggregate_type, aggregate_id, \
     idempotency_key, event_class, schema_version, headers, payload, retry_count, max_retries, \
     last_error, processed_at, locked_until, locked_by, created_at, updated_at";

/// The oldest servers with `FOR UPDATE SKIP LOCKED`.
const NEEDED: &str = "MySQL 8.0 or later, or MariaDB 10.6 or later (the first versions with \
                      FOR UPDATE SKIP LOCKED)";

/// A [`Store`] on MySQL 8.0+ or MariaDB 10.6+.
///
/// ```no_run
/// use postbox::{Event, Store};
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

/// How far back the first probe of a relay looks for ids of transactions still open.
const FIRST_PROBE_SPAN: i64 = 100_000;

/// Which server answers: MySQL or MariaDB, and its version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ServerVersion {
    mariadb: bool,
    major: u32,
    minor: u32,
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
        Some(ServerVersion {
            mariadb,
            major,
            minor,
        })
    }

    /// Whether the server has what the store needs.
    pub(crate) fn supported(&self) -> bool {
        if self.mariadb {
            (self.major, self.minor) >= (10, 6)
        } else {
            self.major >= 8
        }
    }
}

/// Refuses a server without `SKIP LOCKED`, naming the versions needed.
async fn check_version(conn: &mut MySqlConnection) -> Result<ServerVersion> {
    let version: String = sqlx::query_scalar("SELECT VERSION()")
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
    /// than MySQL 8.0 or MariaDB 10.6. The URL must name the database.
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
        let database: Option<String> = sqlx::query_scalar("SELECT DATABASE()")
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

    fn missing(&self, err: sqlx::Error) -> Error {
        // 1146: table doesn't exist.
        if let sqlx::Error::Database(db) = &err
            && db.code().as_deref() == Some("42S02")
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
    conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        .await?;
    let version: String = sqlx::query_scalar("SELECT VERSION()")
        .fetch_one(&mut *conn)
        .await?;
    if ServerVersion::parse(&version).is_some_and(|v| !v.mariadb) {
        conn.execute("SET SESSION information_schema_stats_expiry = 0")
            .await?;
    }
    Ok(())
}

/// `, ?` for each of `ids`, inside parentheses: `(?, ?, ?)`.
fn push_ids(query: &mut QueryBuilder<MySql>, ids: &[i64]) {
    query.push("(");
    let mut list = query.separated(", ");
    for id in ids {
        list.push_bind(*id);
    }
    list.push_unseparated(")");
}

/// Microseconds of a duration, for `INTERVAL ? MICROSECOND`.
fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// The claimable part of one status range, in id order: `?` status, then (ordered) the ordered
/// types and the horizon, then the limit.
fn pick_query<'a>(status: &'static str, p: &'a ClaimParams<'a>) -> QueryBuilder<MySql> {
    let mut q = QueryBuilder::new(
        "SELECT e.id, e.status = 'PROCESSING' AS stale, e.aggregate_type, e.aggregate_id \
         FROM outbox_events e WHERE e.status = ",
    );
    q.push_bind(status);
    q.push(" AND (e.locked_until IS NULL OR e.locked_until < UTC_TIMESTAMP(6))");
    if p.order.is_on() {
        // An ordered event is claimable only at or below the commit horizon, and when no earlier
        // event of its aggregate is unfinished and not claimable now (FAILED and not skipped,
        // in flight, backing off, or stale on its last try). Earlier claimable ones come first
        // in id order; the claim then checks they are really its own (see `events_claim`).
        q.push(" AND (e.aggregate_id IS NULL OR e.aggregate_type IS NULL OR NOT ");
        push_ordered(&mut q, p.order.aggregate_types);
        q.push(" OR (e.id <= ");
        q.push_bind(p.order.settled_through);
        q.push(
            " AND NOT EXISTS (SELECT 1 FROM outbox_events b \
             WHERE b.aggregate_type = e.aggregate_type AND b.aggregate_id = e.aggregate_id \
             AND b.status IN ('PENDING', 'PROCESSING', 'FAILED') AND b.id < e.id \
             AND b.skipped_at IS NULL \
             AND NOT (b.status = 'PENDING' \
                      AND (b.locked_until IS NULL OR b.locked_until < UTC_TIMESTAMP(6))) \
             AND NOT (b.status = 'PROCESSING' AND b.locked_until < UTC_TIMESTAMP(6) \
                      AND b.retry_count + 1 < b.max_retries))))",
        );
    }
    q.push(" ORDER BY e.id LIMIT ");
    q.push_bind(i64::from(p.batch_size));
    q.push(" FOR UPDATE SKIP LOCKED");
    q
}

/// `(e.aggregate_type IN (…))`, or `(TRUE)` when `*` orders every type.
fn push_ordered(q: &mut QueryBuilder<MySql>, types: &[String]) {
    if types.iter().any(|t| t == "*") {
        q.push("(TRUE)");
        return;
    }
    q.push("(e.aggregate_type IN (");
    let mut list = q.separated(", ");
    for t in types {
        list.push_bind(t.clone());
    }
    list.push_unseparated("))");
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
            (Some(at), Some(aid)) if super::orders_type(types, at) => blocked_from
                .get(&(at.as_str(), aid.as_str()))
                .is_none_or(|first| first > id),
            _ => true,
        })
        .collect()
}

fn list_branch(query: &mut QueryBuilder<MySql>, table: &'static str, p: &ListParams<'_>) {
    let f = p.filter;
    query.push(format_args!("(SELECT {LIST_COLUMNS}, "));
    query.push(if table == "outbox_events" {
        "CAST(NULL AS DATETIME(6)) AS archived_at"
    } else {
        "archived_at"
    });
    query.push(format_args!(" FROM {table} WHERE TRUE"));
    if !f.ids.is_empty() {
        query.push(" AND id IN ");
        push_ids(query, &f.ids);
    }
    if !f.statuses.is_empty() {
        query.push(" AND status IN (");
        let mut list = query.separated(", ");
        for s in &f.statuses {
            list.push_bind(s.as_str());
        }
        list.push_unseparated(")");
    }
    // The table's collation is binary: LIKE is case-sensitive, as the globs are.
    if let Some(glob) = &f.event_type {
        query.push(" AND event_type LIKE ");
        query.push_bind(glob.to_like());
    }
    if let Some(glob) = &f.aggregate_type {
        query.push(" AND aggregate_type LIKE ");
        query.push_bind(glob.to_like());
    }
    if let Some(id) = &f.aggregate_id {
        query.push(" AND aggregate_id = ");
        query.push_bind(id.clone());
    }
    if f.parked && table == "outbox_events" {
        query.push(
            " AND status = 'FAILED' AND skipped_at IS NULL AND aggregate_id IS NOT NULL \
             AND EXISTS (SELECT 1 FROM outbox_events l \
             WHERE l.aggregate_type = outbox_events.aggregate_type \
             AND l.aggregate_id = outbox_events.aggregate_id AND l.id > outbox_events.id \
             AND l.status IN ('PENDING', 'PROCESSING'))",
        );
    }
    if let Some(since) = f.since {
        query.push(" AND created_at >= ");
        query.push_bind(since.naive_utc());
    }
    if let Some(until) = f.until {
        query.push(" AND created_at < ");
        query.push_bind(until.naive_utc());
    }
    let newest_first = p.order == Order::NewestFirst;
    if let Some(after) = p.after {
        query.push(if newest_first {
            " AND id < "
        } else {
            " AND id > "
        });
        query.push_bind(after);
    }
    query.push(if newest_first {
        " ORDER BY id DESC LIMIT "
    } else {
        " ORDER BY id ASC LIMIT "
    });
    query.push_bind(i64::from(p.limit));
    query.push(")");
}

/// Takes the named lock of this database's outbox for `what` on `conn`'s session, without
/// waiting. False when another session holds it.
async fn try_lock(conn: &mut MySqlConnection, what: &str) -> Result<bool> {
    let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(CONCAT(?, DATABASE()), 0)")
        .bind(what)
        .fetch_one(&mut *conn)
        .await?;
    Ok(got == Some(1))
}

async fn unlock(conn: &mut MySqlConnection, what: &str) -> Result<()> {
    sqlx::query("DO RELEASE_LOCK(CONCAT(?, DATABASE()))")
        .bind(what)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

#[async_trait]
impl Store for MySqlStore {
    async fn schema_migrate(&self, _schema: &SchemaName, _registry: bool) -> Result<Vec<String>> {
        // MySQL commits each DDL statement at once: a named lock keeps migrations one at a time.
        let mut conn = self.pool.acquire().await?;
        let got: Option<i64> =
            sqlx::query_scalar("SELECT GET_LOCK(CONCAT('postbox_migrate:', DATABASE()), 60)")
                .fetch_one(&mut *conn)
                .await?;
        if got != Some(1) {
            return Err(Error::Unsupported(
                "another `postbox migrate` has held the migration lock of this database for a \
                 minute; try again when it is done",
            ));
        }
        let applied = migrations::apply::<MySql>(
            &mut conn,
            "postbox_schema_history",
            "DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6))",
            MIGRATIONS,
            str::to_owned,
        )
        .await;
        unlock(&mut conn, "postbox_migrate:").await?;
        applied
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
        let mut tx = self.pool.begin().await?;
        // Due rows of both ranges, in id order; the first batch_size of them.
        let mut picked: Vec<Picked> = Vec::new();
        for status in ["PENDING", "PROCESSING"] {
            let rows: Vec<Picked> = pick_query(status, p)
                .build_query_as()
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
        let stale: Vec<i64> = picked.iter().filter(|r| r.1).map(|r| r.0).collect();
        // Each expression reads the old values of the columns assigned after it (MySQL assigns
        // left to right). A stale row (still PROCESSING) lost its lease: a failed try; on its
        // last try it goes FAILED instead.
        let mut take = QueryBuilder::<MySql>::new(
            "UPDATE outbox_events SET \
             last_error = IF(status = 'PROCESSING', CONCAT('lease expired: relay ', \
                 COALESCE(locked_by, '?'), \
                 ' did not finish publishing in time (crashed or stalled)'), last_error), \
             locked_until = IF(status = 'PROCESSING' AND retry_count + 1 >= max_retries, NULL, \
                 UTC_TIMESTAMP(6) + INTERVAL ",
        );
        take.push_bind(micros(p.lease));
        take.push(" MICROSECOND), locked_by = ");
        take.push_bind(p.relay_id);
        take.push(", claim_token = ");
        take.push_bind(token.to_string());
        take.push(
            ", updated_at = UTC_TIMESTAMP(6), \
             retry_count = retry_count + (status = 'PROCESSING'), \
             status = IF(status = 'PROCESSING' AND retry_count >= max_retries, 'FAILED', \
                 'PROCESSING') \
             WHERE id IN ",
        );
        push_ids(&mut take, &ids);
        take.build().execute(&mut *tx).await?;
        let mut read = QueryBuilder::<MySql>::new(format!("SELECT {CLAIMED_COLUMNS}, id IN "));
        if stale.is_empty() {
            read.push("(-1)");
        } else {
            push_ids(&mut read, &stale);
        }
        read.push(" AS stale FROM outbox_events WHERE id IN ");
        push_ids(&mut read, &ids);
        read.push(" ORDER BY id");
        let rows = read.build().fetch_all(&mut *tx).await?;
        tx.commit().await?;
        for row in &rows {
            add_claimed_row(&mut claimed, row, None)?;
        }
        Ok(claimed)
    }

    async fn leases_renew(&self, p: &RenewParams<'_>) -> Result<u64> {
        Self::check_target(p.target)?;
        if p.ids.is_empty() {
            return Ok(0);
        }
        let mut q = QueryBuilder::<MySql>::new(
            "UPDATE outbox_events SET locked_until = UTC_TIMESTAMP(6) + INTERVAL ",
        );
        q.push_bind(micros(p.lease));
        q.push(" MICROSECOND, updated_at = UTC_TIMESTAMP(6) WHERE claim_token = ");
        q.push_bind(p.claim_token.to_string());
        q.push(" AND status = 'PROCESSING' AND id IN ");
        push_ids(&mut q, p.ids);
        Ok(q.build().execute(&self.pool).await?.rows_affected())
    }

    async fn events_mark_processed(&self, p: &MarkProcessedParams<'_>) -> Result<u64> {
        Self::check_target(p.target)?;
        if p.ids.is_empty() {
            return Ok(0);
        }
        let mut q = QueryBuilder::<MySql>::new(
            "UPDATE outbox_events SET status = 'PROCESSED', processed_at = UTC_TIMESTAMP(6), \
             locked_until = NULL, updated_at = UTC_TIMESTAMP(6) WHERE claim_token = ",
        );
        q.push_bind(p.claim_token.to_string());
        q.push(" AND status = 'PROCESSING' AND id IN ");
        push_ids(&mut q, p.ids);
        Ok(q.build().execute(&self.pool).await?.rows_affected())
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
            let (retry_count, gave_up): (i32, bool) = sqlx::query_as(
                "SELECT retry_count, status = 'FAILED' FROM outbox_events WHERE id = ?",
            )
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
            released += sqlx::query(
                "UPDATE outbox_events
                 SET status = 'PENDING',
                     locked_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
                     last_error = ?, updated_at = UTC_TIMESTAMP(6)
                 WHERE id = ? AND claim_token = ? AND status = 'PROCESSING'",
            )
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

    async fn events_retry_failed(&self, p: &RetryFailedParams<'_>) -> Result<u64> {
        Self::check_target(p.target)?;
        let mut q = QueryBuilder::<MySql>::new(
            "UPDATE outbox_events SET status = 'PENDING', retry_count = 0, locked_until = NULL, \
             skipped_at = NULL, updated_at = UTC_TIMESTAMP(6) WHERE status = 'FAILED'",
        );
        if let Some(ids) = p.ids {
            if ids.is_empty() {
                return Ok(0);
            }
            q.push(" AND id IN ");
            push_ids(&mut q, ids);
        }
        Ok(q.build()
            .execute(&self.pool)
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
        let candidates: Vec<(i64, String)> = sqlx::query_as(
            "SELECT id, event_type FROM outbox_events
             WHERE status = 'FAILED'
               AND updated_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
               AND retry_count < max_retries + ?
               AND skipped_at IS NULL
             ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED",
        )
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
        let mut q = QueryBuilder::<MySql>::new(
            "UPDATE outbox_events SET retry_count = GREATEST(retry_count, max_retries), \
             status = 'PENDING', locked_until = NULL, updated_at = UTC_TIMESTAMP(6) \
             WHERE status = 'FAILED' AND id IN ",
        );
        push_ids(&mut q, &ids);
        let done = q.build().execute(&mut *tx).await?.rows_affected();
        tx.commit().await?;
        Ok(done)
    }

    async fn events_list(&self, p: &ListParams<'_>) -> Result<Vec<StoredEvent>> {
        Self::check_target(p.target)?;
        p.filter.validate()?;
        let mut query = QueryBuilder::<MySql>::new("SELECT * FROM (");
        list_branch(&mut query, "outbox_events", p);
        if p.filter.reads_archive() {
            query.push(" UNION ALL ");
            list_branch(&mut query, "outbox_events_archive", p);
        }
        query.push(") listed ORDER BY id ");
        query.push(match p.order {
            Order::NewestFirst => "DESC",
            Order::OldestFirst => "ASC",
        });
        query.push(" LIMIT ");
        query.push_bind(i64::from(p.limit));
        let rows = query
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
        if !p.dry_run && !try_lock(&mut conn, "postbox_retention:").await? {
            return Ok(None);
        }
        let batch = self.archive_batch(&mut conn, p).await;
        if !p.dry_run {
            unlock(&mut conn, "postbox_retention:").await?;
        }
        batch.map(Some)
    }

    async fn events_purge(&self, p: &PurgeParams<'_>) -> Result<Option<PurgeBatch>> {
        Self::check_target(p.target)?;
        let age = micros(p.older_than);
        let (table, column, status) = match p.kind {
            PurgeKind::Archive => ("outbox_events_archive", "archived_at", ""),
            PurgeKind::Failed => ("outbox_events", "updated_at", " AND status = 'FAILED'"),
        };
        let filter = format!("WHERE {column} < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND{status}");
        if p.dry_run {
            let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "SELECT count(*) FROM {table} {filter}"
            )))
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
        if !try_lock(&mut conn, "postbox_retention:").await? {
            return Ok(None);
        }
        // Safe: table, column and status are constants of this function.
        let gone = sqlx::query(sqlx::AssertSqlSafe(format!(
            "DELETE FROM {table} {filter} ORDER BY {column} LIMIT ?"
        )))
        .bind(age)
        .bind(i64::from(p.batch_size))
        .execute(&mut *conn)
        .await
        .map_err(|e| self.missing(e));
        unlock(&mut conn, "postbox_retention:").await?;
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
            let estimate: Option<i64> = sqlx::query_scalar(
                "SELECT CAST(TABLE_ROWS AS SIGNED) FROM information_schema.TABLES
                 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox_events'",
            )
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

    async fn backlog(&self, target: &Target, ordered: &[String]) -> Result<Backlog> {
        Self::check_target(target)?;
        let mut q = QueryBuilder::<MySql>::new(
            "SELECT CASE WHEN EXISTS (SELECT 1 FROM outbox_events e \
             WHERE e.status IN ('PENDING', 'PROCESSING') \
             AND (e.locked_until IS NULL OR e.locked_until < UTC_TIMESTAMP(6))",
        );
        if !ordered.is_empty() {
            q.push(" AND (e.aggregate_id IS NULL OR e.aggregate_type IS NULL OR NOT ");
            push_ordered(&mut q, ordered);
            q.push(
                " OR NOT EXISTS (SELECT 1 FROM outbox_events b \
                 WHERE b.aggregate_type = e.aggregate_type AND b.aggregate_id = e.aggregate_id \
                 AND b.status IN ('PENDING', 'PROCESSING', 'FAILED') AND b.id < e.id \
                 AND b.skipped_at IS NULL))",
            );
        }
        q.push(
            ") THEN 0.0 ELSE (SELECT GREATEST(0.0, \
             TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), MIN(locked_until)) / 1e6) \
             FROM outbox_events WHERE status IN ('PENDING', 'PROCESSING') \
             AND locked_until >= UTC_TIMESTAMP(6)) END",
        );
        let due: Option<f64> = q
            .build_query_scalar()
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
            None => now_head.map_or(0, |h| (h - FIRST_PROBE_SPAN).max(0)),
        };
        let upto = pending.map_or(floor, |(_, last)| last);
        *self
            .pending_probe
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            now_head.map(|h| (std::time::Instant::now(), h));
        let mut settled = upto.max(floor);
        let mut waiting_for = None;
        if upto > floor {
            let present: HashSet<i64> = sqlx::query_scalar(
                "SELECT id FROM outbox_events WHERE id > ? AND id <= ?
                 UNION ALL SELECT id FROM outbox_events_archive WHERE id > ? AND id <= ?",
            )
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
                let locked =
                    sqlx::query("SELECT id FROM outbox_events WHERE id = ? FOR UPDATE NOWAIT")
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

    async fn events_skip(&self, target: &Target, ids: &[i64]) -> Result<Vec<i64>> {
        Self::check_target(target)?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.pool.begin().await?;
        let mut pick = QueryBuilder::<MySql>::new(
            "SELECT id FROM outbox_events WHERE skipped_at IS NULL \
             AND status IN ('PENDING', 'FAILED') AND id IN ",
        );
        push_ids(&mut pick, ids);
        pick.push(" ORDER BY id FOR UPDATE");
        let skipped: Vec<i64> = pick
            .build_query_scalar()
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| self.missing(e))?;
        if !skipped.is_empty() {
            let mut q = QueryBuilder::<MySql>::new(
                "UPDATE outbox_events SET status = 'FAILED', skipped_at = UTC_TIMESTAMP(6), \
                 locked_until = NULL, last_error = COALESCE(last_error, 'skipped by an operator'), \
                 updated_at = UTC_TIMESTAMP(6) WHERE id IN ",
            );
            push_ids(&mut q, &skipped);
            q.build().execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(skipped)
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

    async fn oldest_transaction_age(&self) -> Result<Option<Duration>> {
        // A long transaction keeps InnoDB's purge from removing old row versions.
        let age: Option<f64> = sqlx::query_scalar(
            "SELECT MAX(TIMESTAMPDIFF(MICROSECOND, trx_started, NOW(6))) / 1e6
             FROM information_schema.INNODB_TRX WHERE trx_mysql_thread_id <> CONNECTION_ID()",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(secs(age))
    }

    async fn sinks_report(&self, relay_id: &str, sinks: &[SinkHealth]) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "DELETE FROM postbox_sink_health WHERE relay_id = ?
                OR reported_at < UTC_TIMESTAMP(6) - INTERVAL 1 DAY",
        )
        .bind(relay_id)
        .execute(&mut *tx)
        .await
        .map_err(|e| self.missing(e))?;
        for sink in sinks {
            sqlx::query(
                "INSERT INTO postbox_sink_health (relay_id, sink, up, since, last_error)
                 VALUES (?, ?, ?, ?, ?)",
            )
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

    async fn sinks_reported(&self) -> Result<Vec<ReportedSink>> {
        let rows: Vec<super::ReportedRow> = sqlx::query_as(
            "SELECT relay_id, sink, up, since, last_error,
                    TIMESTAMPDIFF(MICROSECOND, reported_at, UTC_TIMESTAMP(6)) / 1e6
             FROM postbox_sink_health ORDER BY sink, relay_id",
        )
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

    async fn wakeups(&self) -> Result<Option<Box<dyn Wakeups>>> {
        Ok(None)
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
                (Some(at), Some(aid)) if super::orders_type(types, at) => {
                    Some((at.as_str(), aid.as_str()))
                }
                _ => None,
            })
            .collect();
        if aggregates.is_empty() {
            return Ok(picked);
        }
        let last = picked.last().map_or(0, |p| p.0);
        let mut q = QueryBuilder::<MySql>::new(
            "SELECT id, aggregate_type, aggregate_id FROM outbox_events \
             WHERE status IN ('PENDING', 'PROCESSING', 'FAILED') AND skipped_at IS NULL \
             AND id < ",
        );
        q.push_bind(last);
        q.push(" AND (aggregate_type, aggregate_id) IN (");
        let mut list = q.separated(", ");
        for (at, aid) in &aggregates {
            list.push("(");
            list.push_bind_unseparated(at.to_string());
            list.push_unseparated(", ");
            list.push_bind_unseparated(aid.to_string());
            list.push_unseparated(")");
        }
        list.push_unseparated(")");
        let unfinished: Vec<(i64, String, String)> = q.build_query_as().fetch_all(&mut *tx).await?;
        Ok(keep_own_heads(picked, types, &unfinished))
    }

    async fn archive_batch(
        &self,
        conn: &mut MySqlConnection,
        p: &ArchiveParams<'_>,
    ) -> Result<ArchiveBatch> {
        let walked: Vec<(i64, bool, bool)> = sqlx::query_as(
            "SELECT id, created_at >= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND AS young,
                    status = 'PROCESSED' AS processed
             FROM outbox_events WHERE id > ? ORDER BY id LIMIT ?",
        )
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
            let mut copy = QueryBuilder::<MySql>::new(
                "INSERT INTO outbox_events_archive (id, status, event_type, aggregate_type, \
                 aggregate_id, payload, event_class, schema_version, headers, idempotency_key, \
                 retry_count, max_retries, last_error, processed_at, locked_until, locked_by, \
                 claim_token, skipped_at, created_at, updated_at) \
                 SELECT id, status, event_type, aggregate_type, aggregate_id, payload, \
                 event_class, schema_version, headers, idempotency_key, retry_count, \
                 max_retries, last_error, processed_at, locked_until, locked_by, claim_token, \
                 skipped_at, created_at, updated_at FROM outbox_events \
                 WHERE status = 'PROCESSED' AND id IN ",
            );
            push_ids(&mut copy, &old);
            copy.build().execute(&mut *tx).await?;
            let mut delete = QueryBuilder::<MySql>::new(
                "DELETE FROM outbox_events WHERE status = 'PROCESSED' AND id IN ",
            );
            push_ids(&mut delete, &old);
            let moved = delete.build().execute(&mut *tx).await?.rows_affected();
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
    fn versions_without_skip_locked_are_refused() {
        let v = |s: &str| ServerVersion::parse(s).map(|v| v.supported());
        assert_eq!(v("8.0.36"), Some(true));
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
