//! A store that fails or stalls on demand.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use postbox::store::{
    Backlog, ClaimParams, Claimed, FailedMark, MarkFailedParams, MarkProcessedParams,
    ReleaseParams, RenewParams, Wakeups,
};

/// A [`Store`](postbox::Store) call that [`FaultyStore`] can make fail or hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StoreOp {
    /// `events_claim`.
    Claim,
    /// `leases_renew`.
    Renew,
    /// `events_mark_processed`.
    MarkProcessed,
    /// `events_mark_failed`.
    MarkFailed,
}

/// A [`Store`](postbox::Store) that delegates to another one and injects faults: calls that fail
/// as if the database were unreachable, and marks held back as if the relay had stalled.
///
/// Clones share their faults, so a test keeps one clone and gives another to a relay.
#[derive(Clone)]
pub struct FaultyStore {
    inner: Arc<dyn postbox::Store>,
    faults: Arc<Faults>,
}

struct Faults {
    failing: Mutex<HashMap<StoreOp, u64>>,
    injected: Mutex<HashMap<StoreOp, u64>>,
    calls: Mutex<HashMap<StoreOp, u64>>,
    marks_open: tokio::sync::watch::Sender<bool>,
    marks_held: AtomicU64,
    /// Claims under way now, and the most ever under way at once.
    claiming: AtomicU64,
    most_claiming: AtomicU64,
    /// Claims that started while another was under way.
    claims_beside: AtomicU64,
    /// Every range of passed ids `claim_gaps` was asked to read again, in call order.
    passed_read: Mutex<Vec<std::ops::RangeInclusive<i64>>>,
    /// How many ids present each `claim_gaps` call read past the horizon (its `limit`), 0s left
    /// out, in call order.
    gap_limits: Mutex<Vec<u32>>,
    /// How many claims had been made when each of those reads came.
    claims_before_gap_reads: Mutex<Vec<u64>>,
    /// Claims (`events_claim`) per schema.
    claims_of: Mutex<HashMap<postbox::SchemaName, u64>>,
}

impl FaultyStore {
    /// Wraps `inner`; no faults until scripted.
    pub fn new(inner: impl postbox::Store) -> Self {
        FaultyStore {
            inner: Arc::new(inner),
            faults: Arc::new(Faults {
                failing: Mutex::default(),
                injected: Mutex::default(),
                calls: Mutex::default(),
                marks_open: tokio::sync::watch::Sender::new(true),
                marks_held: AtomicU64::new(0),
                claiming: AtomicU64::new(0),
                most_claiming: AtomicU64::new(0),
                claims_beside: AtomicU64::new(0),
                passed_read: Mutex::default(),
                gap_limits: Mutex::default(),
                claims_before_gap_reads: Mutex::default(),
                claims_of: Mutex::default(),
            }),
        }
    }

    /// Makes the next `n` calls of `op` fail with a connection error (`u64::MAX`: all of them).
    pub fn fail_next(&self, op: StoreOp, n: u64) {
        self.faults.failing.lock().expect("lock").insert(op, n);
    }

    /// Failures injected into `op` so far.
    pub fn injected(&self, op: StoreOp) -> u64 {
        get(&self.faults.injected, op)
    }

    /// Calls of `op` so far, failed ones included.
    pub fn calls(&self, op: StoreOp) -> u64 {
        get(&self.faults.calls, op)
    }

    /// Holds every later mark (processed or failed) until [`FaultyStore::release_marks`]: the
    /// relay has published but stalls before recording it.
    pub fn hold_marks(&self) {
        self.faults.marks_open.send_replace(false);
    }

    /// Lets held marks through.
    pub fn release_marks(&self) {
        self.faults.marks_open.send_replace(true);
    }

    /// Mark calls waiting behind [`FaultyStore::hold_marks`] right now.
    pub fn marks_held(&self) -> u64 {
        self.faults.marks_held.load(Ordering::SeqCst)
    }

    /// How many claims (`events_claim`) each schema's outbox got so far: what a relay spends on
    /// each target.
    pub fn claims_by_schema(&self) -> HashMap<postbox::SchemaName, u64> {
        self.faults.claims_of.lock().expect("lock").clone()
    }

    /// The most claims (`events_claim`) that were under way at once.
    pub fn most_claims_at_once(&self) -> u64 {
        self.faults.most_claiming.load(Ordering::SeqCst)
    }

    /// How many claims started while another claim was under way (a relay's pair of claims
    /// side by side counts one).
    pub fn claims_beside_another(&self) -> u64 {
        self.faults.claims_beside.load(Ordering::SeqCst)
    }

    /// Every range of passed ids the relay read again (`claim_gaps`' `passed`), in call order.
    pub fn passed_read(&self) -> Vec<std::ops::RangeInclusive<i64>> {
        self.faults.passed_read.lock().expect("lock").clone()
    }

    /// How many ids present past the commit horizon each read of the relay's asked for
    /// (`claim_gaps`' `limit`; calls that read none left out), in call order.
    pub fn gap_limits(&self) -> Vec<u32> {
        self.faults.gap_limits.lock().expect("lock").clone()
    }

    /// How many claims (`events_claim`) had been made when each of those reads came, in the
    /// same order.
    pub fn claims_before_gap_reads(&self) -> Vec<u64> {
        self.faults
            .claims_before_gap_reads
            .lock()
            .expect("lock")
            .clone()
    }

    fn enter(&self, op: StoreOp) -> postbox::Result<()> {
        *self
            .faults
            .calls
            .lock()
            .expect("lock")
            .entry(op)
            .or_insert(0) += 1;
        let mut failing = self.faults.failing.lock().expect("lock");
        match failing.get_mut(&op) {
            Some(n) if *n > 0 => {
                if *n != u64::MAX {
                    *n -= 1;
                }
                *self
                    .faults
                    .injected
                    .lock()
                    .expect("lock")
                    .entry(op)
                    .or_insert(0) += 1;
                Err(postbox::Error::Database(sqlx::Error::Io(
                    std::io::Error::new(
                        std::io::ErrorKind::ConnectionRefused,
                        format!("injected fault: {op:?} cannot reach the database"),
                    ),
                )))
            }
            _ => Ok(()),
        }
    }

    async fn gate_marks(&self) {
        let mut open = self.faults.marks_open.subscribe();
        if *open.borrow() {
            return;
        }
        self.faults.marks_held.fetch_add(1, Ordering::SeqCst);
        let _ = open.wait_for(|open| *open).await;
        self.faults.marks_held.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One claim under way, counted until it ends (or is dropped mid-way).
struct Claiming<'a>(&'a Faults);

impl<'a> Claiming<'a> {
    fn start(faults: &'a Faults) -> Self {
        let now = faults.claiming.fetch_add(1, Ordering::SeqCst) + 1;
        faults.most_claiming.fetch_max(now, Ordering::SeqCst);
        if now > 1 {
            faults.claims_beside.fetch_add(1, Ordering::SeqCst);
        }
        Claiming(faults)
    }
}

impl Drop for Claiming<'_> {
    fn drop(&mut self) {
        self.0.claiming.fetch_sub(1, Ordering::SeqCst);
    }
}

fn get(map: &Mutex<HashMap<StoreOp, u64>>, op: StoreOp) -> u64 {
    map.lock().expect("lock").get(&op).copied().unwrap_or(0)
}

// The hot path by hand (claims, renewals and marks fail or wait on demand); every method is
// required, so none can be left to a default that would change what the relay does.
#[async_trait]
impl postbox::Store for FaultyStore {
    fn capabilities(&self) -> postbox::store::Capabilities {
        self.inner.capabilities()
    }

    fn default_schema(&self) -> postbox::SchemaName {
        self.inner.default_schema()
    }

    async fn events_claim(&self, p: &ClaimParams<'_>) -> postbox::Result<Claimed> {
        self.enter(StoreOp::Claim)?;
        *self
            .faults
            .claims_of
            .lock()
            .expect("lock")
            .entry(p.target.schema.clone())
            .or_insert(0) += 1;
        let _under_way = Claiming::start(&self.faults);
        self.inner.events_claim(p).await
    }

    async fn claim_floor(
        &self,
        target: &postbox::Target,
        from: i64,
        settled: i64,
    ) -> postbox::Result<i64> {
        self.inner.claim_floor(target, from, settled).await
    }

    async fn claim_gaps(
        &self,
        p: &postbox::store::GapParams<'_>,
    ) -> postbox::Result<postbox::store::Gaps> {
        self.faults
            .passed_read
            .lock()
            .expect("lock")
            .extend(p.passed.iter().cloned());
        if p.limit > 0 {
            self.faults.gap_limits.lock().expect("lock").push(p.limit);
            self.faults
                .claims_before_gap_reads
                .lock()
                .expect("lock")
                .push(self.calls(StoreOp::Claim));
        }
        self.inner.claim_gaps(p).await
    }

    async fn leases_renew(&self, p: &RenewParams<'_>) -> postbox::Result<u64> {
        self.enter(StoreOp::Renew)?;
        self.inner.leases_renew(p).await
    }

    async fn events_mark_processed(&self, p: &MarkProcessedParams<'_>) -> postbox::Result<u64> {
        self.gate_marks().await;
        self.enter(StoreOp::MarkProcessed)?;
        self.inner.events_mark_processed(p).await
    }

    async fn events_mark_failed(
        &self,
        p: &MarkFailedParams<'_>,
    ) -> postbox::Result<Vec<FailedMark>> {
        self.gate_marks().await;
        self.enter(StoreOp::MarkFailed)?;
        self.inner.events_mark_failed(p).await
    }

    async fn events_release(&self, params: &ReleaseParams<'_>) -> postbox::Result<u64> {
        self.inner.events_release(params).await
    }

    async fn backlog(
        &self,
        target: &postbox::Target,
        ordered: &[String],
    ) -> postbox::Result<Backlog> {
        self.inner.backlog(target, ordered).await
    }

    async fn backlog_from(
        &self,
        target: &postbox::Target,
        from: &postbox::store::BacklogFrom,
    ) -> postbox::Result<Backlog> {
        self.inner.backlog_from(target, from).await
    }

    async fn outbox_due(
        &self,
        targets: &[postbox::Target],
        ordered: &[String],
    ) -> postbox::Result<Vec<Option<std::time::Duration>>> {
        self.inner.outbox_due(targets, ordered).await
    }

    async fn commit_horizon(
        &self,
        target: &postbox::Target,
        probe: Option<&postbox::store::HorizonProbe>,
    ) -> postbox::Result<postbox::store::Horizon> {
        self.inner.commit_horizon(target, probe).await
    }

    async fn horizon_writers_age(
        &self,
        target: &postbox::Target,
        probe: &postbox::store::HorizonProbe,
    ) -> postbox::Result<Option<std::time::Duration>> {
        self.inner.horizon_writers_age(target, probe).await
    }

    async fn wakeups(&self) -> postbox::Result<Option<Box<dyn Wakeups>>> {
        self.inner.wakeups().await
    }

    async fn outbox_heads(
        &self,
        targets: &[postbox::Target],
        known: &[Option<i64>],
    ) -> postbox::Result<Vec<(usize, Option<i64>)>> {
        self.inner.outbox_heads(targets, known).await
    }
}

// The operator's surface goes to the store inside, every method of it.
postbox::forward_store_ops!(FaultyStore, |self| &*self.inner);
