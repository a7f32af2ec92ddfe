//! Which outboxes a command works on, and what state they are in: the one resolver of targets
//! and the one status report, shared by `postbox status`, `postbox events …` and the admin
//! server, so that a tenant name means the same everywhere and every view shows the same facts.

use std::collections::HashSet;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::inbox::InboxStats;
pub use crate::schema::DEFAULT_TENANT;
use crate::schema::{Target, TenantId};
use crate::store::{
    EventFilter, ListParams, Order, Outstanding, ReplicationSlot, ReportedSink, StatusCounts,
    Store, TenantStatus,
};

/// How many parked heads a status report reads at most per target (see
/// [`TargetReport::parked_aggregates`]).
pub const PARKED_COUNT_LIMIT: u32 = 1000;

/// The targets a command works on: with `tenant`, that tenant's ([`DEFAULT_TENANT`] for the
/// default schema); without, the default schema's and every registered tenant's (the default
/// schema's alone on a store without tenants).
///
/// Fails with [`Error::InvalidName`] for a name that cannot be a tenant id,
/// [`Error::UnknownTenant`] for one not in the registry, and [`Error::NotMigrated`] where the
/// registry's tables are missing (run `postbox migrate`).
///
/// ```no_run
/// # async fn example(store: &dyn postbox::Store) -> postbox::Result<()> {
/// for target in postbox::status::targets(store, None).await? {
///     println!("{}: {}", target.label(), target.schema);
/// }
/// let acme = postbox::status::target(store, Some("acme")).await?;
/// # Ok(()) }
/// ```
pub async fn targets<S: Store + ?Sized>(store: &S, tenant: Option<&str>) -> Result<Vec<Target>> {
    let default = Target::default_schema(store.default_schema());
    if tenant == Some(DEFAULT_TENANT) {
        return Ok(vec![default]);
    }
    let id = tenant.map(TenantId::new).transpose()?;
    let tenants = match store.tenant_list().await {
        Ok(tenants) => tenants,
        Err(Error::Unsupported(_)) if id.is_none() => Vec::new(),
        Err(e) => return Err(e),
    };
    let Some(id) = id else {
        let mut all = vec![default];
        all.extend(tenants.iter().map(|t| t.target()));
        return Ok(all);
    };
    tenants
        .into_iter()
        .find(|t| t.id == id)
        .map(|t| vec![t.target()])
        .ok_or_else(|| Error::UnknownTenant(id.to_string()))
}

/// The one target of a command about one outbox's events: `tenant`'s, or the default schema's
/// when none is named (see [`targets`]).
pub async fn target<S: Store + ?Sized>(store: &S, tenant: Option<&str>) -> Result<Target> {
    let mut found = targets(store, Some(tenant.unwrap_or(DEFAULT_TENANT))).await?;
    found
        .pop()
        .ok_or_else(|| Error::UnknownTenant(tenant.unwrap_or(DEFAULT_TENANT).to_owned()))
}

/// The state of one database's outboxes, as `postbox status` prints it and the admin server
/// shows it.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct StatusReport {
    /// Age of the database's oldest open transaction that holds a snapshot, where the database
    /// can tell (PostgreSQL): a long one keeps vacuum from removing processed events' dead rows.
    pub oldest_transaction_age: Option<Duration>,
    /// The default schema first, then tenants by id, then the registry's rows that are not
    /// served (with their reason in [`TargetReport::error`]).
    pub targets: Vec<TargetReport>,
    /// What running relays last reported of their sinks.
    pub sinks: Vec<ReportedSink>,
    /// The database's logical replication slots (PostgreSQL), a CDC relay's, with the WAL each
    /// holds back.
    pub replication_slots: Vec<ReplicationSlot>,
}

/// One outbox's line of a [`StatusReport`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct TargetReport {
    /// The target; `None` for a registry row that is not served (an invalid id or schema).
    pub target: Option<Target>,
    /// The tenant id as stored, `None` for the default schema.
    pub tenant: Option<String>,
    /// The schema holding its events, as stored.
    pub schema: String,
    /// The tenant's state; `None` for the default schema and for rows not served.
    pub tenant_status: Option<TenantStatus>,
    /// The counts by status, if they could be read.
    pub counts: Option<StatusCounts>,
    /// Ordered aggregates parked by a `FAILED` event that holds back later ones, counted up to
    /// [`PARKED_COUNT_LIMIT`] heads (`postbox events list --parked` lists them); 0 without
    /// `FAILED` events.
    pub parked_aggregates: i64,
    /// The consumers of its inbox ([`Inbox`](crate::inbox::Inbox)), by name: messages recorded in
    /// the dedup window and repeats skipped.
    pub inbox: Vec<InboxStats>,
    /// Why the counts (or the inbox) could not be read, or why the tenant is not served.
    pub error: Option<String>,
}

impl StatusReport {
    /// Reads the report of `store`: every target's counts (a target that cannot be read gets
    /// its error, and the others are still read), the tenants the registry holds but that are
    /// not served, the oldest open transaction and the sinks relays reported.
    ///
    /// Fails when the tenant registry or the oldest transaction cannot be read, with
    /// [`Error::NotMigrated`] where the outbox tables are missing.
    ///
    /// ```no_run
    /// # async fn example(store: &dyn postbox::Store) -> postbox::Result<()> {
    /// let report = postbox::status::StatusReport::read(store).await?;
    /// for t in &report.targets {
    ///     let failed = t.counts.as_ref().map_or(0, |c| c.failed);
    ///     println!("{}: {failed} FAILED", t.tenant.as_deref().unwrap_or("default"));
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn read<S: Store + ?Sized>(store: &S) -> Result<StatusReport> {
        let default = Target::default_schema(store.default_schema());
        // The default schema's counts first: a database without the outbox tables is refused
        // as not migrated rather than reported line by line.
        let default_counts = store.status_counts(&default).await?;
        let mut served = vec![(default, None, Some(default_counts))];
        match store.tenant_list().await {
            Ok(tenants) => {
                served.extend(tenants.iter().map(|t| (t.target(), Some(t.status), None)));
            }
            Err(Error::Unsupported(_)) => {}
            Err(e) => return Err(e),
        }
        let oldest_transaction_age = store.oldest_transaction_age().await?;
        let mut targets = Vec::with_capacity(served.len());
        for (target, tenant_status, counts) in served {
            let counts = match counts {
                Some(counts) => Ok(counts),
                None => store.status_counts(&target).await,
            };
            let (counts, parked_aggregates, mut error) = match counts {
                Ok(counts) if counts.failed > 0 => match parked_aggregates(store, &target).await {
                    Ok(parked) => (Some(counts), parked, None),
                    Err(e) => (Some(counts), 0, Some(e.to_string())),
                },
                Ok(counts) => (Some(counts), 0, None),
                Err(e) => (None, 0, Some(e.to_string())),
            };
            let inbox = if counts.is_some() {
                store.inbox_stats(&target).await.unwrap_or_else(|e| {
                    error.get_or_insert_with(|| e.to_string());
                    Vec::new()
                })
            } else {
                Vec::new()
            };
            targets.push(TargetReport {
                tenant: target.tenant.as_ref().map(ToString::to_string),
                schema: target.schema.to_string(),
                target: Some(target),
                tenant_status,
                counts,
                parked_aggregates,
                inbox,
                error,
            });
        }
        for rejected in store.tenant_rejected().await.unwrap_or_default() {
            targets.push(TargetReport {
                target: None,
                tenant: Some(rejected.id),
                schema: rejected.schema,
                tenant_status: None,
                counts: None,
                parked_aggregates: 0,
                inbox: Vec::new(),
                error: Some(format!("not served: {}", rejected.reason)),
            });
        }
        Ok(StatusReport {
            oldest_transaction_age,
            targets,
            sinks: store.sinks_reported().await.unwrap_or_default(),
            replication_slots: store.replication_slots().await.unwrap_or_default(),
        })
    }

    /// Whether every target could be read and is served.
    pub fn all_read(&self) -> bool {
        self.targets.iter().all(|t| t.error.is_none())
    }
}

/// Targets past which `postbox status` and the admin page show a [`StatusSummary`] rather than
/// a line per target.
pub const SUMMARY_ABOVE: usize = 50;

/// The state of many outboxes in a few lines: totals, and the few targets an operator looks at
/// first — the largest backlogs, the oldest, the most `FAILED` events. Read in one statement per
/// hundred tenant schemas ([`StoreOps::status_outstanding`](crate::ops::StoreOps)), so that it
/// stays fast with ten thousand tenants.
#[derive(Clone, Debug, serde::Serialize)]
#[non_exhaustive]
pub struct StatusSummary {
    /// Targets read: the default schema and every registered tenant.
    pub targets: usize,
    /// Of the tenants, those suspended.
    pub suspended: usize,
    /// Registry rows that are not served (an invalid id or schema).
    pub rejected: usize,
    /// The sums over every target; the oldest age is the oldest of all.
    pub totals: Outstanding,
    /// Targets with an event outstanding.
    pub with_backlog: usize,
    /// Targets with a `FAILED` event.
    pub with_failed: usize,
    /// The largest backlogs (`PENDING` and `PROCESSING`), largest first.
    pub busiest: Vec<SummaryLine>,
    /// The oldest outstanding events, oldest first.
    pub oldest: Vec<SummaryLine>,
    /// The most `FAILED` events, most first.
    pub failing: Vec<SummaryLine>,
    /// Age of the database's oldest open transaction that holds a snapshot (PostgreSQL).
    #[serde(skip)]
    pub oldest_transaction_age: Option<Duration>,
}

/// One target of a [`StatusSummary`].
#[derive(Clone, Debug, serde::Serialize)]
#[non_exhaustive]
pub struct SummaryLine {
    /// The tenant id, `None` for the default schema.
    pub tenant: Option<String>,
    /// The schema holding its events.
    pub schema: String,
    /// What waits in it.
    #[serde(flatten)]
    pub outstanding: Outstanding,
}

impl StatusSummary {
    /// Reads the summary of `store`'s targets, with the `top` largest of each list.
    ///
    /// ```no_run
    /// # async fn example(store: &dyn postbox::Store) -> postbox::Result<()> {
    /// let summary = postbox::status::StatusSummary::read(store, 10).await?;
    /// println!("{} events wait in {} of {} outboxes", summary.totals.pending,
    ///     summary.with_backlog, summary.targets);
    /// # Ok(()) }
    /// ```
    pub async fn read<S: Store + ?Sized>(store: &S, top: usize) -> Result<StatusSummary> {
        let default = Target::default_schema(store.default_schema());
        // A database without the outbox tables is refused as not migrated.
        store.status_counts(&default).await?;
        let mut targets = vec![default];
        let mut suspended = 0;
        match store.tenant_list().await {
            Ok(tenants) => {
                suspended = tenants
                    .iter()
                    .filter(|t| t.status == TenantStatus::Suspended)
                    .count();
                targets.extend(tenants.iter().map(|t| t.target()));
            }
            Err(Error::Unsupported(_)) => {}
            Err(e) => return Err(e),
        }
        let outstanding = store.status_outstanding(&targets).await?;
        let lines: Vec<SummaryLine> = targets
            .iter()
            .zip(outstanding)
            .map(|(t, outstanding)| SummaryLine {
                tenant: t.tenant.as_ref().map(ToString::to_string),
                schema: t.schema.to_string(),
                outstanding,
            })
            .collect();
        let mut totals = Outstanding::default();
        for l in &lines {
            let o = &l.outstanding;
            totals.pending += o.pending;
            totals.processing += o.processing;
            totals.failed += o.failed;
            totals.oldest_pending_age = totals.oldest_pending_age.max(o.oldest_pending_age);
        }
        let backlog = |l: &SummaryLine| l.outstanding.pending + l.outstanding.processing;
        let largest = |key: &dyn Fn(&SummaryLine) -> (bool, i64, Duration)| {
            let mut chosen: Vec<&SummaryLine> = lines.iter().filter(|l| key(l).0).collect();
            chosen.sort_by_key(|l| std::cmp::Reverse((key(l).1, key(l).2)));
            chosen.into_iter().take(top).cloned().collect::<Vec<_>>()
        };
        let age = |l: &SummaryLine| l.outstanding.oldest_pending_age.unwrap_or_default();
        Ok(StatusSummary {
            targets: lines.len(),
            suspended,
            rejected: store.tenant_rejected().await.unwrap_or_default().len(),
            with_backlog: lines.iter().filter(|l| backlog(l) > 0).count(),
            with_failed: lines.iter().filter(|l| l.outstanding.failed > 0).count(),
            busiest: largest(&|l| (backlog(l) > 0, backlog(l), Duration::ZERO)),
            oldest: largest(&|l| (age(l) > Duration::ZERO, 0, age(l))),
            failing: largest(&|l| {
                (
                    l.outstanding.failed > 0,
                    l.outstanding.failed,
                    Duration::ZERO,
                )
            }),
            totals,
            oldest_transaction_age: store.oldest_transaction_age().await?,
        })
    }
}

/// Parked ordered aggregates of `target`, counted up to [`PARKED_COUNT_LIMIT`] heads: one read
/// of the `FAILED` events.
async fn parked_aggregates<S: Store + ?Sized>(store: &S, target: &Target) -> Result<i64> {
    let filter = EventFilter {
        parked: true,
        ..EventFilter::default()
    };
    let heads = store
        .events_list(&ListParams {
            target,
            filter: &filter,
            order: Order::OldestFirst,
            after: None,
            limit: PARKED_COUNT_LIMIT,
        })
        .await?;
    let aggregates: HashSet<_> = heads
        .iter()
        .map(|e| (e.aggregate_type.clone(), e.aggregate_id.clone()))
        .collect();
    Ok(aggregates.len() as i64)
}
