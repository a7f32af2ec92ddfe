//! The targets a relay serves: the default schema and every active tenant, re-read now and
//! then, served in turn so that no tenant always goes first, and tracked as busy while they
//! have events.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{info, warn};

use crate::error::{Error, Result};
use crate::schema::{SchemaName, Target};
use crate::store::{RejectedTenant, Store, TenantStatus};

/// The targets to serve, and when they were last read.
#[derive(Default)]
pub(super) struct Targets {
    list: Vec<Target>,
    read_at: Option<Instant>,
    next_start: usize,
    /// Until when each target (by schema) counts as busy: it had events lately, so it is
    /// polled every `busy_poll_interval`.
    busy_until: HashMap<SchemaName, Instant>,
    /// Targets left out until the next registry read: their tables are missing (a tenant
    /// schema dropped by hand) or otherwise need an operator.
    parked: HashMap<SchemaName, String>,
    /// Registry rows that cannot be served, as last reported.
    rejected: Vec<RejectedTenant>,
}

impl Targets {
    /// The served targets.
    pub(super) fn list(&self) -> &[Target] {
        &self.list
    }

    /// Re-reads the tenant registry when `refresh` has passed since the last read.
    pub(super) async fn refresh(&mut self, store: &dyn Store, refresh: Duration) -> Result<()> {
        if let Some(at) = self.read_at
            && at.elapsed() < refresh
        {
            return Ok(());
        }
        let mut list = vec![Target::default_schema(store.default_schema())];
        match store.tenant_list().await {
            Ok(tenants) => list.extend(
                tenants
                    .iter()
                    .filter(|t| t.status == TenantStatus::Active)
                    .map(|t| t.target()),
            ),
            Err(Error::Unsupported(_)) => {}
            Err(e) => return Err(e),
        }
        let rejected = store.tenant_rejected().await.unwrap_or_default();
        if rejected != self.rejected {
            for r in &rejected {
                warn!(tenant = %r.id, schema = %r.schema, reason = %r.reason,
                    "tenant registry row cannot be served; skipped (fix or remove the row)");
            }
            self.rejected = rejected;
        }
        // Parked targets get another chance with every registry read.
        self.parked.clear();
        if list != self.list {
            info!(targets = ?list.iter().map(Target::label).collect::<Vec<_>>(), "serving");
        }
        self.list = list;
        let now = Instant::now();
        self.read_at = Some(now);
        self.busy_until.retain(|_, until| *until > now);
        Ok(())
    }

    /// The targets of one round, starting one further along each round so that no target
    /// always goes first; with `busy_only`, just the busy ones.
    pub(super) fn round(&mut self, busy_only: bool) -> Vec<Target> {
        let n = self.list.len();
        let start = self.next_start % n.max(1);
        self.next_start = self.next_start.wrapping_add(1);
        let now = Instant::now();
        (0..n)
            .map(|i| &self.list[(start + i) % n])
            .filter(|t| !busy_only || self.is_busy(t, now))
            .filter(|t| !self.parked.contains_key(&t.schema))
            .cloned()
            .collect()
    }

    /// Leaves `target` out until the next registry read; logs it once.
    pub(super) fn park(&mut self, target: &Target, reason: &str) {
        if self
            .parked
            .insert(target.schema.clone(), reason.to_owned())
            .is_none()
        {
            warn!(
                tenant = target.label(),
                reason,
                "target cannot be served; skipped until the tenant registry is read again, other tenants are still served"
            );
        }
    }

    /// Marks `target` busy for `period` from now.
    pub(super) fn mark_busy(&mut self, target: &Target, period: Duration) {
        self.busy_until
            .insert(target.schema.clone(), Instant::now() + period);
    }

    fn is_busy(&self, target: &Target, now: Instant) -> bool {
        self.busy_until
            .get(&target.schema)
            .is_some_and(|until| *until > now)
    }

    /// Whether any target is busy.
    pub(super) fn any_busy(&self) -> bool {
        let now = Instant::now();
        self.busy_until.values().any(|until| *until > now)
    }
}
