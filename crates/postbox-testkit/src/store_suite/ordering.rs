//! Cases of ordered claims: an ordered aggregate's due events go as one run in id order, and
//! never past an earlier event in flight, FAILED or backing off; a claim that reads only a few
//! due events still finds the aggregates ready behind more waiting ones.

#![allow(
    clippy::unwrap_used,
    clippy::missing_panics_doc,
    reason = "a test suite fails loudly on the first unexpected error"
)]

use std::time::Duration;

use postbox::Event;
use postbox::store::{ClaimParams, Claimed};

use super::StoreHarness;
use super::helpers::{failed, mark_failed, mark_processed, ready, target};
use postbox::StoreExt;

/// A conformance case; see the module docs. With ordering, a claim takes an ordered aggregate's
/// due events as one run in id order, nothing of an aggregate whose earlier event is in flight,
/// FAILED (until skipped) or backing off; unordered events and other aggregates as usual. The
/// backlog counts a parked aggregate's events as nothing to wait for.
pub async fn ordered_claims_take_an_aggregate_only_past_its_unfinished_events<B: StoreHarness>() {
    let b = ready::<B>().await;
    let outbox = b.store().outbox();
    let ev = |kind: &str, aggregate: &str| {
        Event::new(kind, &serde_json::json!({}))
            .expect("event")
            .aggregate("Invoice", aggregate)
            .without_idempotency_key()
    };
    let ids: Vec<i64> = b
        .enqueue(
            &outbox,
            vec![
                ev("A", "1"),
                ev("B", "1"),
                ev("A", "2"),
                ev("C", "1"),
                ev("B", "2"),
                ev("A", "3"),
            ],
        )
        .await
        .expect("enqueue")
        .into_iter()
        .map(|e| e.id().expect("inserted"))
        .collect();
    let types = vec!["Invoice".to_owned()];
    let t = target(&b);
    let ordered_claim = |batch_size: u32| claim_ordered(&b, &types, batch_size, batch_size, false);
    // Invoice 1's first two: the batch ends inside its run.
    let first = ordered_claim(2).await;
    let got: Vec<i64> = first.events.iter().map(|e| e.id).collect();
    assert_eq!(got, [ids[0], ids[1]]);
    // Invoice 1 is in flight: its third event waits; invoices 2 and 3 go.
    let second = ordered_claim(100).await;
    let got: Vec<i64> = second.events.iter().map(|e| e.id).collect();
    assert_eq!(got, [ids[2], ids[4], ids[5]]);
    // Invoice 1's first event fails for good: its aggregate is parked.
    mark_processed(&b, first.claim_token, &[ids[0]]).await;
    mark_failed(&b, first.claim_token, &[failed(ids[1], "rejected", true)]).await;
    assert!(ordered_claim(100).await.events.is_empty(), "parked");
    let backlog = b.store().backlog(&t, &types).await.expect("backlog");
    assert_eq!(
        backlog.next_due_in.map(|d| d.as_secs() > 0),
        Some(true),
        "only the leases of invoices 2 and 3 are waited for, not the parked event"
    );
    let skipped = b
        .store()
        .events_skip(&t, &[ids[0], ids[1]])
        .await
        .expect("skip");
    assert_eq!(skipped, [ids[1]], "only the FAILED head is skipped");
    let third = ordered_claim(100).await;
    let got: Vec<i64> = third.events.iter().map(|e| e.id).collect();
    assert_eq!(
        got,
        [ids[3]],
        "the rest of invoice 1 flows once its head is skipped"
    );
    assert_eq!(b.row(ids[3]).await.status, "PROCESSING");
}

/// An ordered claim of `types` from the start of the table, every commit settled.
async fn claim_ordered<B: StoreHarness>(
    b: &B,
    types: &[String],
    batch_size: u32,
    walk: u32,
    sweep: bool,
) -> Claimed {
    b.store()
        .events_claim(&ClaimParams {
            target: &target(b),
            batch_size,
            lease: Duration::from_secs(30),
            relay_id: "ordered",
            floor: 0,
            order: postbox::store::ClaimOrder {
                aggregate_types: types,
                settled_through: i64::MAX,
                walk,
                sweep,
            },
        })
        .await
        .expect("ordered claim")
}

/// A conformance case; see the module docs. An ordered claim that reads only a few due events
/// in id order (its walk) still finds the ready aggregates behind more waiting events than that,
/// takes events that are not ordered when it sweeps for them, and a drain by such claims takes
/// every event once, each aggregate's in id order.
pub async fn ordered_claims_find_ready_aggregates_behind_more_waiting_events_than_they_read<
    B: StoreHarness,
>() {
    let b = ready::<B>().await;
    let outbox = b.store().outbox();
    let ev = |aggregate: Option<&str>| {
        let e = Event::new("Changed", &serde_json::json!({}))
            .expect("event")
            .without_idempotency_key();
        match aggregate {
            Some(id) => e.aggregate("Invoice", id),
            None => e,
        }
    };
    let mut events: Vec<Event> = (0..10).map(|_| ev(Some("1"))).collect();
    events.extend((0..3).map(|_| ev(Some("2"))));
    events.push(ev(None));
    events.push(ev(Some("3")));
    let ids: Vec<i64> = b
        .enqueue(&outbox, events)
        .await
        .expect("enqueue")
        .into_iter()
        .map(|e| e.id().expect("inserted"))
        .collect();
    let (invoice_1, invoice_2, unordered, invoice_3) = (&ids[..10], &ids[10..13], ids[13], ids[14]);
    let types = vec!["Invoice".to_owned()];
    let claim = |batch_size: u32, walk: u32, sweep: bool| {
        claim_ordered(&b, &types, batch_size, walk, sweep)
    };
    let ids_of = |c: &postbox::store::Claimed| c.events.iter().map(|e| e.id).collect::<Vec<_>>();
    // Invoice 1's head goes in flight: its nine other events wait.
    let first = claim(1, 1, false).await;
    assert_eq!(ids_of(&first), [invoice_1[0]]);
    // A walk of two reads two of invoice 1's waiting events; the claim still finds invoice 2.
    let second = claim(2, 2, false).await;
    let got = ids_of(&second);
    assert_eq!(
        got.len(),
        2,
        "a full claim past the waiting events: {got:?}"
    );
    assert_eq!(got[0], invoice_2[0], "invoice 2's head first");
    assert!(
        got.iter().all(|id| !invoice_1.contains(id)),
        "nothing of invoice 1 while its head is in flight: {got:?}"
    );
    // A sweep for events that are not ordered finds the one behind them.
    let third = claim(10, 2, true).await;
    let got = ids_of(&third);
    assert!(got.contains(&unordered), "the unordered event: {got:?}");
    assert!(
        got.iter().all(|id| !invoice_1.contains(id)),
        "nothing of invoice 1 while its head is in flight: {got:?}"
    );
    // The rest drains by small claims, each aggregate in id order, every event once.
    let mut taken: Vec<i64> = [ids_of(&first), ids_of(&second), ids_of(&third)].concat();
    for c in [&first, &second, &third] {
        mark_processed(&b, c.claim_token, &ids_of(c)).await;
    }
    for _ in 0..ids.len() {
        let next = claim(3, 2, true).await;
        if next.events.is_empty() {
            break;
        }
        mark_processed(&b, next.claim_token, &ids_of(&next)).await;
        taken.extend(ids_of(&next));
    }
    let mut once = taken.clone();
    once.sort_unstable();
    once.dedup();
    assert_eq!(once.len(), taken.len(), "an event claimed twice: {taken:?}");
    assert_eq!(once, ids, "every event claimed");
    for aggregate in [invoice_1, invoice_2, &[invoice_3][..]] {
        let order: Vec<i64> = taken
            .iter()
            .copied()
            .filter(|id| aggregate.contains(id))
            .collect();
        assert_eq!(order, aggregate, "an aggregate out of order: {taken:?}");
    }
}
