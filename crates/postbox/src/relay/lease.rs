//! Keeping the leases of a batch alive while it is being published: a task renews them every
//! [`renew_interval`] (a third of a lease), by the claim's token, until the batch is done
//! (docs/architecture.md, "The contract"). Events whose outcome is known are dropped from the renewals as they
//! finish; their results must then be written in time (the invariant of [`super::timing`]).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::task::JoinHandle;
use tracing::warn;
use uuid::Uuid;

use super::timing::renew_interval;
use crate::schema::Target;
use crate::store::{RenewParams, Store};

/// The lease renewer of one claim; stops renewing when dropped.
pub(super) struct LeaseKeeper {
    ids: Arc<Mutex<Vec<i64>>>,
    task: JoinHandle<()>,
}

impl LeaseKeeper {
    /// Starts renewing the leases of `ids`, claimed with `token`, every
    /// [`renew_interval`]`(lease)`.
    pub(super) fn start(
        store: Arc<dyn Store>,
        target: Target,
        token: Uuid,
        ids: Vec<i64>,
        lease: Duration,
    ) -> LeaseKeeper {
        let ids = Arc::new(Mutex::new(ids));
        let held = Arc::clone(&ids);
        let every = renew_interval(lease);
        let task = tokio::spawn(async move {
            let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticker.tick().await;
                let ids = held.lock().unwrap_or_else(PoisonError::into_inner).clone();
                if ids.is_empty() {
                    continue;
                }
                let params = RenewParams {
                    target: &target,
                    claim_token: token,
                    ids: &ids,
                    lease,
                };
                match store.leases_renew(&params).await {
                    Ok(n) if (n as usize) < ids.len() => warn!(
                        tenant = target.label(),
                        renewed = n,
                        claimed = ids.len(),
                        "some leases were lost to another relay; their results will not be recorded"
                    ),
                    Ok(_) => {}
                    Err(e) => warn!(
                        tenant = target.label(),
                        error = %e,
                        "lease renewal failed; retrying at the next tick"
                    ),
                }
            }
        });
        LeaseKeeper { ids, task }
    }

    /// Stops renewing the lease of `id` (its outcome is known).
    pub(super) fn release(&self, id: i64) {
        self.ids
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|held| *held != id);
    }
}

impl Drop for LeaseKeeper {
    fn drop(&mut self) {
        self.task.abort();
    }
}
