//! Cases of claims from a floor ([`Store::claim_floor`]) and of the ids a relay passed on its
//! way up ([`Store::claim_gaps`]): what went wrong below the floor is still claimed, and what
//! became of the passed ids is read back. Stores that do not claim from a floor pass them too.

#![allow(
    clippy::unwrap_used,
    clippy::missing_panics_doc,
    reason = "a test suite fails loudly on the first unexpected error"
)]

use std::time::Duration;

use postbox::backoff::Backoff;
use postbox::store::MarkFailedParams;
// For the links of the docs only.
#[cfg(doc)]
use postbox::Store;

use super::StoreHarness;
use super::helpers::{
    claim, claim_from, enqueue_n, failed, lease_expired, mark_failed, mark_processed, ready,
    settled_past, target,
};

/// A conformance case; see the module docs.
///
/// A claim from a floor (see [`Store::claim_floor`]) takes new work at or above it, and below it
/// every event that went wrong once: a failed try once its backoff is over, an event put back
/// while its destination was down, an operator's retry, and a lease taken over from a relay that
/// claimed such an event and stopped. Stores that do not claim from a floor pass it as well.
pub async fn claims_from_a_floor_still_take_what_went_wrong_below_it<B: StoreHarness>() {
    let b = ready::<B>().await;
    let ids = enqueue_n(&b, 6).await;
    let (backing_off, released, retried) = (ids[0], ids[1], ids[2]);
    let c = claim(&b, "r1", 10, Duration::from_secs(30)).await;
    assert_eq!(c.events.len(), 6);
    // A backoff long enough to outlast the claims below, whatever the store's horizon takes.
    b.store()
        .events_mark_failed(&MarkFailedParams {
            target: &target(&b),
            claim_token: c.claim_token,
            tries: &[failed(backing_off, "timeout", false)],
            retry: Backoff {
                base: Duration::from_millis(1500),
                cap: Duration::from_millis(1500),
            },
        })
        .await
        .unwrap();
    mark_failed(&b, c.claim_token, &[failed(retried, "bad payload", true)]).await;
    b.store()
        .events_release(&postbox::store::ReleaseParams {
            target: &target(&b),
            claim_token: c.claim_token,
            releases: &[postbox::store::Release {
                id: released,
                error: "unavailable: broker down".to_owned(),
                delay: Duration::ZERO,
            }],
        })
        .await
        .unwrap();
    assert_eq!(mark_processed(&b, c.claim_token, &ids[3..]).await, 3);
    let operator = b
        .store()
        .events_retry_failed(&postbox::store::RetryFailedParams {
            target: &target(&b),
            ids: Some(&[retried]),
        })
        .await
        .unwrap();
    assert_eq!(operator, 1);
    let fresh = enqueue_n(&b, 2).await;
    let settled = settled_past(&b, fresh[1]).await;
    let floor = b
        .store()
        .claim_floor(&target(&b), 0, settled)
        .await
        .expect("floor");
    if b.store().capabilities().claims_from_floor {
        assert_eq!(
            floor, fresh[0],
            "the floor passes what is done and what went wrong, and stops at new work"
        );
    } else {
        assert_eq!(floor, 0, "a store without floors answers 0");
    }
    // The released event and the operator's retry are due now, the new ones above the floor
    // too; the failed try waits for its backoff.
    let c = claim_from(&b, "r2", 10, Duration::from_millis(200), floor).await;
    let mut got: Vec<i64> = c.events.iter().map(|e| e.id).collect();
    got.sort_unstable();
    assert_eq!(got, [released, retried, fresh[0], fresh[1]]);
    assert_eq!(
        mark_processed(&b, c.claim_token, &[retried, fresh[0], fresh[1]]).await,
        3
    );
    // r2 stops before it publishes the released event: its lease runs out below the floor.
    lease_expired(&b, released).await;
    lease_expired(&b, backing_off).await;
    let c = claim_from(&b, "r3", 10, Duration::from_secs(30), floor).await;
    let got: Vec<i64> = c.events.iter().map(|e| e.id).collect();
    assert_eq!(got, [backing_off, released]);
    assert_eq!(c.recovered, 1, "the lease r2 lost is counted");
    assert_eq!(mark_processed(&b, c.claim_token, &got).await, 2);
    assert!(
        claim_from(&b, "r4", 10, Duration::from_secs(30), floor)
            .await
            .events
            .is_empty()
    );
}

/// A conformance case; see the module docs.
///
/// [`Store::claim_gaps`] reads the next ids present (any status), answering how far it read and
/// the ranges of ids missing there, and the rows now in the ranges of ids a relay passed:
/// whether each is still to do, and claimable. Stores that do not claim from a floor answer
/// nothing.
pub async fn gaps_name_the_ids_missing_and_what_became_of_the_ids_passed<B: StoreHarness>() {
    let b = ready::<B>().await;
    let ids = enqueue_n(&b, 3).await;
    let (waiting, claimed, done) = (ids[0], ids[1], ids[2]);
    // A lease that outlasts the first look below, and runs out soon after.
    let c = claim_from(&b, "r1", 10, Duration::from_millis(1500), 0).await;
    assert_eq!(c.events.len(), 3);
    b.store()
        .events_release(&postbox::store::ReleaseParams {
            target: &target(&b),
            claim_token: c.claim_token,
            releases: &[postbox::store::Release {
                id: waiting,
                error: "unavailable: broker down".to_owned(),
                delay: Duration::ZERO,
            }],
        })
        .await
        .unwrap();
    assert_eq!(mark_processed(&b, c.claim_token, &[done]).await, 1);
    let never = done + 1_000;
    let gaps = b
        .store()
        .claim_gaps(&postbox::store::GapParams {
            target: &target(&b),
            passed: &[waiting..=claimed, done..=never],
            after: waiting - 1,
            limit: 10,
        })
        .await
        .expect("gaps");
    if !b.store().capabilities().claims_from_floor {
        assert_eq!(
            gaps,
            postbox::store::Gaps::default(),
            "no floor, nothing passed"
        );
        return;
    }
    assert_eq!(
        gaps.read_through,
        Some(done),
        "read up to the last id present"
    );
    assert_eq!(gaps.read, 3, "every id present, whatever its status");
    assert!(gaps.missing.is_empty(), "{:?}", gaps.missing);
    let mut found = gaps.found.clone();
    found.sort_unstable_by_key(|f| f.id);
    let flags: Vec<(i64, bool, bool)> = found
        .iter()
        .map(|f| (f.id, f.unfinished, f.claimable))
        .collect();
    assert_eq!(
        flags,
        [
            // Put back with last_error set: the retry path finds it, not the passed ids.
            (waiting, false, false),
            // In flight under r1's lease.
            (claimed, true, false),
            (done, false, false),
        ],
        "the rows in the ranges, no more"
    );
    // r1 stops: its lease runs out, and the event is claimable again.
    lease_expired(&b, claimed).await;
    let gaps = b
        .store()
        .claim_gaps(&postbox::store::GapParams {
            target: &target(&b),
            passed: &[claimed..=claimed],
            after: done,
            limit: 0,
        })
        .await
        .expect("gaps");
    let flags: Vec<(i64, bool, bool)> = gaps
        .found
        .iter()
        .map(|f| (f.id, f.unfinished, f.claimable))
        .collect();
    assert_eq!(flags, [(claimed, true, true)]);
    let none = b
        .store()
        .claim_gaps(&postbox::store::GapParams {
            target: &target(&b),
            passed: &[],
            after: waiting - 1,
            limit: 0,
        })
        .await
        .expect("gaps");
    assert_eq!(none, postbox::store::Gaps::default(), "limit 0 reads no id");
    let next = b
        .store()
        .claim_gaps(&postbox::store::GapParams {
            target: &target(&b),
            passed: &[],
            after: waiting,
            limit: 1,
        })
        .await
        .expect("gaps");
    assert_eq!(
        (next.read_through, next.read),
        (Some(claimed), 1),
        "the next id present, one"
    );
    // Ids missing among those read (in flight, rolled back, removed) come back as ranges: one
    // right after the read's start, two in the middle; none past the last id read.
    let more = enqueue_n(&b, 5).await;
    b.exec(&format!(
        "DELETE FROM outbox_events WHERE id IN ({}, {}, {})",
        more[0], more[2], more[3]
    ))
    .await;
    let read = |limit| {
        let b = &b;
        async move {
            b.store()
                .claim_gaps(&postbox::store::GapParams {
                    target: &target(b),
                    passed: &[],
                    after: done,
                    limit,
                })
                .await
                .expect("gaps")
        }
    };
    let all = read(10).await;
    assert_eq!((all.read_through, all.read), (Some(more[4]), 2));
    assert_eq!(all.missing, [more[0]..=more[0], more[2]..=more[3]]);
    let first = read(1).await;
    assert_eq!((first.read_through, first.read), (Some(more[1]), 1));
    assert_eq!(
        first.missing,
        [more[0]..=more[0]],
        "none past the last id read"
    );
}
