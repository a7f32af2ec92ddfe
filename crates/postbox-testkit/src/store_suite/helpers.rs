//! What the cases share: a fresh migrated store, claims, marks and renewals as a relay makes
//! them (with the suite's backoff), events to enqueue, and waits on the database clock.

use std::time::Duration;

use postbox::store::{
    ClaimParams, Claimed, FailedTry, MarkFailedParams, MarkProcessedParams, RenewParams,
};
use postbox::{Event, Target, backoff::Backoff};
use uuid::Uuid;

use super::StoreHarness;
use crate::wait_until;
use postbox::StoreExt;

pub(super) async fn ready<B: StoreHarness>() -> B {
    let b = B::new().await;
    let applied = postbox::migrate(b.store()).await.expect("migrate");
    assert!(!applied.is_empty(), "a fresh database gets migrations");
    b
}

pub(super) fn target<B: StoreHarness>(b: &B) -> Target {
    Target::default_schema(b.store().default_schema())
}

pub(super) async fn claim<B: StoreHarness>(
    b: &B,
    relay: &str,
    batch_size: u32,
    lease: Duration,
) -> Claimed {
    claim_from(b, relay, batch_size, lease, 0).await
}

pub(super) async fn claim_from<B: StoreHarness>(
    b: &B,
    relay: &str,
    batch_size: u32,
    lease: Duration,
    floor: i64,
) -> Claimed {
    b.store()
        .events_claim(&ClaimParams {
            target: &target(b),
            batch_size,
            lease,
            relay_id: relay,
            floor,
            order: Default::default(),
        })
        .await
        .expect("claim")
}

/// The commit horizon once it has passed `id` (no transaction writes to the table here).
pub(super) async fn settled_past<B: StoreHarness>(b: &B, id: i64) -> i64 {
    let probe = tokio::sync::Mutex::new(None);
    crate::wait_until(
        &format!("the commit horizon passes {id}"),
        Duration::from_secs(5),
        || async {
            let mut probe = probe.lock().await;
            let horizon = b
                .store()
                .commit_horizon(&target(b), probe.as_ref())
                .await
                .expect("commit horizon");
            *probe = horizon.probe;
            horizon.settled.filter(|settled| *settled >= id)
        },
    )
    .await
}

pub(super) async fn mark_processed<B: StoreHarness>(b: &B, token: Uuid, ids: &[i64]) -> u64 {
    b.store()
        .events_mark_processed(&MarkProcessedParams {
            target: &target(b),
            claim_token: token,
            ids,
        })
        .await
        .expect("mark processed")
}

pub(super) const POLICY: Backoff = Backoff {
    base: Duration::from_millis(100),
    cap: Duration::from_millis(1000),
};

pub(super) async fn mark_failed<B: StoreHarness>(
    b: &B,
    token: Uuid,
    tries: &[FailedTry],
) -> Vec<postbox::store::FailedMark> {
    b.store()
        .events_mark_failed(&MarkFailedParams {
            target: &target(b),
            claim_token: token,
            tries,
            retry: POLICY,
        })
        .await
        .expect("mark failed")
}

pub(super) fn failed(id: i64, error: &str, permanent: bool) -> FailedTry {
    FailedTry {
        id,
        error: error.to_owned(),
        permanent,
        max_retries: None,
    }
}

pub(super) async fn renew<B: StoreHarness>(
    b: &B,
    token: Uuid,
    ids: &[i64],
    lease: Duration,
) -> u64 {
    b.store()
        .leases_renew(&RenewParams {
            target: &target(b),
            claim_token: token,
            ids,
            lease,
        })
        .await
        .expect("renew")
}

/// `n` unkeyed events `E0`, `E1`, …
pub(super) fn events(n: usize) -> Vec<Event> {
    (0..n)
        .map(|i| {
            Event::new(format!("E{i}"), &serde_json::json!({ "i": i }))
                .expect("event")
                .without_idempotency_key()
        })
        .collect()
}

pub(super) async fn enqueue_n<B: StoreHarness>(b: &B, n: usize) -> Vec<i64> {
    b.enqueue(&b.store().outbox(), events(n))
        .await
        .expect("enqueue")
        .into_iter()
        .map(|e| e.id().expect("inserted"))
        .collect()
}

pub(super) async fn enqueue_with_max_retries<B: StoreHarness>(b: &B, max_retries: i32) -> i64 {
    let event = Event::new("Flaky", &1)
        .expect("event")
        .without_idempotency_key()
        .max_retries(max_retries);
    b.enqueue_one(&b.store().outbox(), event)
        .await
        .expect("enqueue")
        .id()
        .expect("inserted")
}

/// Waits, on the database clock, until the lease of `id` has run out.
pub(super) async fn lease_expired<B: StoreHarness>(b: &B, id: i64) {
    wait_until("the lease has expired", Duration::from_secs(5), || async {
        b.row(id).await.left_ms.is_some_and(|ms| ms < 0.0)
    })
    .await;
}

pub(super) fn assert_ms(actual: Option<f64>, expected: f64, what: &str) {
    let actual = actual.unwrap_or_else(|| panic!("{what}: locked_until is NULL"));
    assert!(
        (actual - expected).abs() < 2.0,
        "{what}: granted {actual} ms, expected {expected} ms"
    );
}
