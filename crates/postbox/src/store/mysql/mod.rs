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
//!
//! This file holds the store type, the statement helpers and named locks its files share, and
//! the two trait impls, which hand each call to the file of its concern: connecting
//! (`connect.rs`), migrations (`migrate.rs`), the claim (`claim.rs`), the commit horizon and the
//! head (`horizon.rs`), marks (`marks.rs`), listing and retention (`history.rs`), status
//! (`status.rs`), sink health (`health.rs`) and the inbox (`inbox.rs`).

mod claim;
mod connect;
mod health;
mod history;
mod horizon;
pub(crate) mod inbox;
mod marks;
mod migrate;
pub(crate) mod outbox;
mod status;

use std::time::Duration;

use async_trait::async_trait;
use sqlx::mysql::MySqlArguments;
use sqlx::mysql::{MySql, MySqlConnection, MySqlPool};
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, QueryBuilder};

use super::{
    ArchiveBatch, ArchiveParams, Backlog, Capabilities, ClaimParams, Claimed, FailedMark,
    GapParams, Gaps, Horizon, HorizonProbe, ListParams, MarkFailedParams, MarkProcessedParams,
    PurgeBatch, PurgeParams, RejectedTenant, ReleaseParams, RenewParams, ReportedSink,
    RetryFailedParams, SlowLaneParams, StatusCounts, Store, StoredEvent, Tenant, TenantAddParams,
    TenantStatus, Wakeups,
};
use crate::error::{Error, Result};
use crate::inbox::InboxStats;
use crate::ops::StoreOps;
use crate::schema::{SchemaName, Target, TenantId};
use crate::sink::SinkHealth;

const NO_TENANTS: &str = "tenants need PostgreSQL: a MySQL database holds one outbox (use one \
                          database per tenant, and list them in the relay's database_urls)";

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

/// Microseconds of a duration, for `INTERVAL ? MICROSECOND`.
fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// The ordered aggregate types as the claim and the backlog take them: a JSON array.
fn ordered_json(types: &[String]) -> Result<String> {
    Ok(serde_json::to_string(types)?)
}

/// The prefix of retention's named lock (archiving and purging run one at a time per database).
const RETENTION_LOCK: &str = "postbox_retention:";

/// The prefix of the migration's named lock.
const MIGRATION_LOCK: &str = "postbox_migrate:";

/// Takes the named lock of this database's outbox for `what` on `conn`'s session, waiting up to
/// `wait_secs`. False when another session holds it.
async fn try_lock(conn: &mut MySqlConnection, what: &str, wait_secs: i64) -> Result<bool> {
    let got: Option<i64> = sqlx::query_scalar(include_str!("../../../sql/mysql/queries/lock.sql"))
        .bind(what)
        .bind(wait_secs)
        .fetch_one(&mut *conn)
        .await?;
    Ok(got == Some(1))
}

async fn unlock(conn: &mut MySqlConnection, what: &str) -> Result<()> {
    sqlx::query(include_str!("../../../sql/mysql/queries/unlock.sql"))
        .bind(what)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

impl MySqlStore {
    fn check_target(target: &Target) -> Result<()> {
        if target.tenant.is_some() {
            return Err(Error::Unsupported(NO_TENANTS));
        }
        Ok(())
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

#[async_trait]
impl Store for MySqlStore {
    fn capabilities(&self) -> Capabilities {
        Capabilities::SERVER
    }

    fn default_schema(&self) -> SchemaName {
        SchemaName::new(&self.database).unwrap_or_else(|_| SchemaName::public())
    }

    async fn events_claim(&self, p: &ClaimParams<'_>) -> Result<Claimed> {
        self.claim(p).await
    }

    async fn claim_floor(&self, target: &Target, from: i64, settled: i64) -> Result<i64> {
        self.floor(target, from, settled).await
    }

    async fn claim_gaps(&self, p: &GapParams<'_>) -> Result<Gaps> {
        self.gaps(p).await
    }

    async fn leases_renew(&self, p: &RenewParams<'_>) -> Result<u64> {
        self.renew(p).await
    }

    async fn events_mark_processed(&self, p: &MarkProcessedParams<'_>) -> Result<u64> {
        self.mark_processed(p).await
    }

    async fn events_mark_failed(&self, p: &MarkFailedParams<'_>) -> Result<Vec<FailedMark>> {
        self.mark_failed(p).await
    }

    async fn events_release(&self, p: &ReleaseParams<'_>) -> Result<u64> {
        self.release(p).await
    }

    async fn backlog(&self, target: &Target, ordered: &[String]) -> Result<Backlog> {
        self.read_backlog(target, ordered).await
    }

    async fn outbox_due(
        &self,
        targets: &[Target],
        ordered: &[String],
    ) -> Result<Vec<Option<Duration>>> {
        crate::store::due_each(self, targets, ordered).await
    }

    async fn commit_horizon(
        &self,
        target: &Target,
        probe: Option<&HorizonProbe>,
    ) -> Result<Horizon> {
        self.horizon(target, probe).await
    }

    async fn outbox_heads(
        &self,
        targets: &[Target],
        known: &[Option<i64>],
    ) -> Result<Vec<(usize, Option<i64>)>> {
        self.heads(targets, known).await
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
        // One outbox per database: no schema to name, no registry.
        self.apply_migrations().await
    }

    async fn events_retry_failed(&self, p: &RetryFailedParams<'_>) -> Result<u64> {
        self.retry_failed(p).await
    }

    async fn events_retry_slow_lane(&self, p: &SlowLaneParams<'_>) -> Result<u64> {
        self.retry_slow_lane(p).await
    }

    async fn events_list(&self, p: &ListParams<'_>) -> Result<Vec<StoredEvent>> {
        self.list(p).await
    }

    async fn events_archive(&self, p: &ArchiveParams<'_>) -> Result<Option<ArchiveBatch>> {
        self.archive(p).await
    }

    async fn events_purge(&self, p: &PurgeParams<'_>) -> Result<Option<PurgeBatch>> {
        self.purge(p).await
    }

    async fn status_counts(&self, target: &Target) -> Result<StatusCounts> {
        self.count_statuses(target).await
    }

    async fn status_outstanding(
        &self,
        targets: &[Target],
    ) -> Result<Vec<crate::store::Outstanding>> {
        crate::store::outstanding_each(self, targets).await
    }

    async fn events_skip(&self, target: &Target, ids: &[i64]) -> Result<Vec<i64>> {
        self.skip(target, ids).await
    }

    async fn oldest_transaction_age(&self) -> Result<Option<Duration>> {
        self.oldest_transaction().await
    }

    async fn replication_slots(&self) -> Result<Vec<super::ReplicationSlot>> {
        // MySQL's binary log has no slots: a CDC relay is PostgreSQL's.
        Ok(Vec::new())
    }

    async fn sinks_report(&self, relay_id: &str, sinks: &[SinkHealth]) -> Result<()> {
        self.record_sink_health(relay_id, sinks).await
    }

    async fn inbox_stats(&self, target: &Target) -> Result<Vec<InboxStats>> {
        self.read_inbox_stats(target).await
    }

    async fn sinks_reported(&self) -> Result<Vec<ReportedSink>> {
        self.read_sink_health().await
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
