//! The relay-level guarantee suite: G1–G6 (docs/guarantees.md) shown by relays at work, written
//! once and run on every store — PostgreSQL, MySQL/MariaDB and SQLite — through
//! `postbox::connect(url)`, the path users take. Each case is a function of a fresh database
//! ([`TestStore`]); `relay_suite!` runs every case on every store of the build, as a test named
//! `<store>::<case>`. The PostgreSQL-only tests beside it (guarantees.rs, floor.rs, faults.rs)
//! measure what only PostgreSQL has.

#![allow(clippy::unwrap_used, reason = "tests")]

use std::collections::HashMap;
use std::time::Duration;

use crate::any::TestStore;
use postbox::ops::StoreOps;
use postbox::store::ClaimParams;
use postbox::{Event, Relay, RelayConfig, Store, StoreExt, Target, backoff::Backoff};
use postbox_testkit::{Behaviour, FaultyStore, RecordingSink, StoreOp, wait_until};

/// Short leases and backoffs, so the suite is fast.
fn config() -> RelayConfig {
    RelayConfig::default()
        .batch_size(50)
        .poll_interval(Duration::from_millis(20))
        .lease(Duration::from_secs(5))
        .retry(Backoff {
            base: Duration::from_millis(20),
            cap: Duration::from_millis(200),
        })
        .publish_timeout(Duration::from_secs(2))
}

fn events(event_type: &str, n: usize) -> Vec<Event> {
    (0..n)
        .map(|i| {
            Event::new(event_type, &serde_json::json!({ "i": i }))
                .unwrap()
                .without_idempotency_key()
        })
        .collect()
}

fn target(t: &TestStore) -> Target {
    Target::default_schema(t.store.default_schema())
}

/// How many times each id was published.
fn tally(ids: Vec<i64>) -> HashMap<i64, usize> {
    let mut counts = HashMap::new();
    for id in ids {
        *counts.entry(id).or_default() += 1;
    }
    counts
}

async fn event(t: &TestStore, id: i64) -> Option<postbox::store::StoredEvent> {
    t.store.event_get(&target(t), id).await.unwrap()
}

/// G2: the events of a transaction that rolled back — whole, or to a savepoint — are never
/// published, while relays publish everything committed around them.
async fn g2_rolled_back_events_are_never_published(t: TestStore) {
    let outbox = t.store.outbox();
    let sink = RecordingSink::new();
    let relay = Relay::new(t.connect().await, sink.clone(), config()).unwrap();
    let mut ghosts = Vec::new();
    let mut kept = Vec::new();
    for _ in 0..5 {
        let mut conn = t.conn().await;
        conn.exec("BEGIN").await;
        ghosts.push(conn.enqueue(&outbox, events("Ghost", 1).remove(0)).await);
        conn.exec("ROLLBACK").await;
        conn.exec("BEGIN").await;
        kept.push(conn.enqueue(&outbox, events("Kept", 1).remove(0)).await);
        conn.exec("SAVEPOINT half").await;
        ghosts.push(conn.enqueue(&outbox, events("Ghost", 1).remove(0)).await);
        conn.exec("ROLLBACK TO SAVEPOINT half").await;
        conn.exec("COMMIT").await;
    }
    let stats = relay.drain(std::future::pending()).await.unwrap();
    let mut published = sink.published_ids();
    published.sort_unstable();
    assert_eq!(
        published, kept,
        "{}: the committed events, no ghost",
        t.name
    );
    assert_eq!(stats.published, 5);
    assert!(
        sink.published().iter().all(|e| e.event_type == "Kept"),
        "{}: a ghost was published",
        t.name
    );
    // Nothing else is stored (SQLite hands a rolled-back id out again: count, not ids).
    let counts = t.store.status_counts(&target(&t)).await.unwrap();
    assert_eq!(
        (
            counts.processed,
            counts.pending,
            counts.processing,
            counts.failed
        ),
        (5, 0, 0, 0),
        "{}",
        t.name
    );
    assert_eq!(ghosts.len(), 10);
}

/// G1/G3: three relays, each on a store of its own, drain 1,500 events: each published once.
async fn g3_relays_side_by_side_publish_each_event_once(t: TestStore) {
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.extend(t.commit(events("Order", 500)).await);
    }
    let sink = RecordingSink::new();
    let mut relays = Vec::new();
    for n in 0..3 {
        let relay = Relay::new(
            t.connect().await,
            sink.clone(),
            config().relay_id(format!("relay-{n}")),
        )
        .unwrap();
        relays.push(tokio::spawn(async move {
            relay.drain(std::future::pending()).await
        }));
    }
    let mut published = 0;
    for relay in relays {
        published += relay.await.unwrap().unwrap().published;
    }
    let counts = tally(sink.published_ids());
    assert_eq!(counts.len(), ids.len(), "{}: every event", t.name);
    assert!(
        ids.iter().all(|id| counts[id] == 1),
        "{}: each event once",
        t.name
    );
    assert_eq!(published, 1_500);
    assert_eq!(
        t.store.status_counts(&target(&t)).await.unwrap().processed,
        1_500
    );
}

/// G1/G3: a relay drains a backlog with two claims in flight where the store allows it (the
/// rows one locks the other skips), one at a time where it does not (SQLite): each event
/// published once, every one of them.
async fn g3_a_backlog_is_claimed_two_batches_at_once_each_event_once(t: TestStore) {
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.extend(t.commit(events("Order", 500)).await);
    }
    let store = FaultyStore::new(t.connect().await);
    let pairs = store.capabilities().concurrent_claims;
    let sink = RecordingSink::new();
    let relay = Relay::new(store.clone(), sink.clone(), config()).unwrap();
    let stats = relay.drain(std::future::pending()).await.unwrap();
    let counts = tally(sink.published_ids());
    assert_eq!(counts.len(), ids.len(), "{}: every event", t.name);
    assert!(
        ids.iter().all(|id| counts[id] == 1),
        "{}: each event once",
        t.name
    );
    assert_eq!(stats.published, 2_000, "{}", t.name);
    assert_eq!(
        store.most_claims_at_once(),
        if pairs { 2 } else { 1 },
        "{}: claims in flight at once",
        t.name
    );
}

/// G3: a relay whose pair of claims spans several ids per event it takes (other relays claim
/// most of its range; here three ids of every four are gone, which its claims pass over the
/// same way) claims one batch at a time for 5 s, then tries a pair again; each event is still
/// published once. The same backlog without the missing ids is claimed in pairs throughout.
async fn g3_a_crowded_relay_claims_one_batch_at_a_time(t: TestStore) {
    let store = FaultyStore::new(t.connect().await);
    let pairs = store.capabilities().concurrent_claims;
    let sink = RecordingSink::new();
    let relay = Relay::new(store.clone(), sink.clone(), config()).unwrap();
    let dense = {
        let mut ids = Vec::new();
        for _ in 0..4 {
            ids.extend(t.commit(events("Order", 500)).await);
        }
        relay.drain(std::future::pending()).await.unwrap();
        ids
    };
    let beside_dense = store.claims_beside_another();
    let mut ids = Vec::new();
    for _ in 0..16 {
        ids.extend(t.commit(events("Order", 500)).await);
    }
    t.conn()
        .await
        .exec(&format!(
            "DELETE FROM outbox_events WHERE id > {} AND id % 4 <> 0",
            dense.iter().max().unwrap()
        ))
        .await;
    ids.retain(|id| id % 4 == 0);
    let started = std::time::Instant::now();
    let sink_before = sink.published_ids().len();
    relay.drain(std::future::pending()).await.unwrap();
    let took = started.elapsed();
    let beside_crowded = store.claims_beside_another() - beside_dense;
    let counts = tally(sink.published_ids());
    assert_eq!(
        sink.published_ids().len() - sink_before,
        ids.len(),
        "{}",
        t.name
    );
    assert!(
        ids.iter().chain(&dense).all(|id| counts[id] == 1),
        "{}: each event once",
        t.name
    );
    if !pairs {
        assert_eq!(beside_dense + beside_crowded, 0, "{}", t.name);
        return;
    }
    assert!(
        beside_dense >= 2,
        "{}: a dense backlog is claimed in pairs ({beside_dense})",
        t.name
    );
    // One pair finds the range crowded; then one every 5 s at most.
    let allowed = 1 + took.as_secs() / 5;
    assert!(
        beside_crowded <= allowed,
        "{}: {beside_crowded} pairs in {took:?} on a crowded range (at most {allowed})",
        t.name
    );
}

/// G1: a relay dropped with its whole batch in flight loses nothing: once its lease runs out
/// another relay takes the batch over (a failed try each) and publishes it.
async fn g1_a_relay_dropped_mid_batch_loses_nothing(t: TestStore) {
    let mut ids = t.commit(events("Order", 30)).await;
    ids.sort_unstable();
    let cfg = config()
        .lease(Duration::from_secs(1))
        .publish_timeout(Duration::from_millis(900));
    let stuck = RecordingSink::new();
    stuck.script("Order", Behaviour::Slow(Duration::from_secs(30)));
    let doomed = Relay::new(
        t.connect().await,
        stuck.clone(),
        cfg.clone().relay_id("doomed"),
    )
    .unwrap();
    let task = tokio::spawn(async move { doomed.run(std::future::pending()).await });
    wait_until(
        "the whole batch is in flight",
        Duration::from_secs(5),
        || async { stuck.calls() == 30 },
    )
    .await;
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    for id in &ids {
        let e = event(&t, *id).await.unwrap();
        assert_eq!(e.status, "PROCESSING", "{}", t.name);
        assert_eq!(e.locked_by.as_deref(), Some("doomed"), "{}", t.name);
    }
    let sink = RecordingSink::new();
    let rescuer = Relay::new(t.connect().await, sink.clone(), cfg).unwrap();
    let stats = rescuer.drain(std::future::pending()).await.unwrap();
    assert_eq!((stats.recovered, stats.published), (30, 30), "{}", t.name);
    let mut got = sink.published_ids();
    got.sort_unstable();
    assert_eq!(got, ids, "{}", t.name);
    for id in &ids {
        let e = event(&t, *id).await.unwrap();
        assert_eq!(
            (e.status.as_str(), e.retry_count),
            ("PROCESSED", 1),
            "{}",
            t.name
        );
    }
    assert!(stuck.published().is_empty());
}

/// G4: a relay that stalls past its lease before recording its results changes nothing once
/// another relay has taken its events over: every late write is fenced by the claim token.
async fn g4_a_late_mark_from_a_relay_that_lost_its_lease_changes_nothing(t: TestStore) {
    let ids = [
        t.commit(events("Good", 3)).await,
        t.commit(events("Bad", 2)).await,
    ]
    .concat();
    let stalled = FaultyStore::new(t.connect().await);
    let sink = RecordingSink::new();
    sink.script("Bad", Behaviour::Fail);
    let relay_a = Relay::new(
        stalled.clone(),
        sink.clone(),
        config()
            .relay_id("relay-a")
            // The shortest lease a relay accepts (its timing needs 600 ms, see `relay::timing`).
            .lease(Duration::from_millis(600))
            .publish_timeout(Duration::from_millis(200)),
    )
    .unwrap();
    stalled.hold_marks();
    let tgt = target(&t);
    let batch = tokio::spawn({
        let tgt = tgt.clone();
        async move { relay_a.batch(&tgt).await }
    });
    wait_until(
        "relay A is about to mark",
        Duration::from_secs(5),
        || async { stalled.marks_held() >= 1 },
    )
    .await;
    wait_until(
        "relay A's leases have expired",
        Duration::from_secs(5),
        || async {
            let mut expired = true;
            for id in &ids {
                let e = event(&t, *id).await.unwrap();
                expired &= e.locked_until.is_some_and(|at| at < chrono::Utc::now());
            }
            expired
        },
    )
    .await;
    let b = t
        .store
        .events_claim(&ClaimParams {
            target: &tgt,
            batch_size: 100,
            lease: Duration::from_secs(30),
            relay_id: "relay-b",
            floor: 0,
            order: Default::default(),
        })
        .await
        .unwrap();
    assert_eq!((b.events.len(), b.recovered), (5, 5), "{}", t.name);
    stalled.release_marks();
    let (stats, _) = batch.await.unwrap().unwrap();
    assert_eq!(sink.published().len(), 3, "{}: relay A did publish", t.name);
    assert_eq!((stats.published, stats.failed_tries), (0, 0), "{}", t.name);
    assert_eq!(
        stats.fenced, 5,
        "{}: every late result was fenced off",
        t.name
    );
    for id in ids {
        let e = event(&t, id).await.unwrap();
        assert_eq!(e.status, "PROCESSING", "{}", t.name);
        assert_eq!(e.locked_by.as_deref(), Some("relay-b"), "{}", t.name);
        assert_eq!(e.retry_count, 1, "{}", t.name);
        assert!(e.last_error.unwrap().contains("lease"), "{}", t.name);
    }
}

/// G5: a failing event is tried `max_retries` times and ends `FAILED` with its last error; the
/// events beside it are published once each, without waiting for it.
async fn g5_a_failing_event_is_tried_max_retries_times_then_failed(t: TestStore) {
    let poison = t
        .commit(vec![Event::new("Poison", &0).unwrap().max_retries(3)])
        .await[0];
    let fine = t.commit(events("Fine", 20)).await;
    let sink = RecordingSink::new();
    sink.script("Poison", Behaviour::Fail);
    let relay = Relay::new(t.connect().await, sink.clone(), config()).unwrap();
    let stats = relay.drain(std::future::pending()).await.unwrap();
    let e = event(&t, poison).await.unwrap();
    assert_eq!(
        (e.status.as_str(), e.retry_count),
        ("FAILED", 3),
        "{}",
        t.name
    );
    assert!(e.last_error.is_some(), "{}: the reason is kept", t.name);
    assert_eq!(
        sink.attempts(poison),
        3,
        "{}: tried exactly max_retries times",
        t.name
    );
    let counts = tally(sink.published_ids());
    assert!(
        fine.iter().all(|id| counts.get(id) == Some(&1)),
        "{}",
        t.name
    );
    assert_eq!(
        (stats.published, stats.failed_tries, stats.gave_up),
        (20, 3, 1),
        "{}",
        t.name
    );
}

/// G1/G3: a relay rides out failed claims, marks and renewals: every event published once,
/// every event `PROCESSED`.
async fn g1_the_relay_rides_out_database_errors_and_loses_nothing(t: TestStore) {
    let ids = t.commit(events("E", 50)).await;
    let faulty = FaultyStore::new(t.connect().await);
    faulty.fail_next(StoreOp::Claim, 3);
    faulty.fail_next(StoreOp::MarkProcessed, 2);
    faulty.fail_next(StoreOp::Renew, u64::MAX);
    let sink = RecordingSink::new();
    let cfg = config()
        .lease(Duration::from_secs(1))
        .publish_timeout(Duration::from_millis(500));
    let relay = Relay::new(faulty.clone(), sink.clone(), cfg).unwrap();
    let stats = relay.drain(std::future::pending()).await.unwrap();
    assert_eq!(faulty.injected(StoreOp::Claim), 3, "{}", t.name);
    assert_eq!(faulty.injected(StoreOp::MarkProcessed), 2, "{}", t.name);
    let counts = tally(sink.published_ids());
    assert!(
        ids.iter().all(|id| counts.get(id) == Some(&1)),
        "{}",
        t.name
    );
    assert_eq!(stats.published, 50, "{}", t.name);
    assert_eq!(
        t.store.status_counts(&target(&t)).await.unwrap().processed,
        50
    );
}

/// G6: with ordered aggregate types, each aggregate's events are first delivered in commit
/// order while every event fails its first try and two relays share the work; an aggregate
/// type that is not ordered is not held back.
async fn g6_ordered_aggregates_are_delivered_in_commit_order_through_retries(t: TestStore) {
    let mut committed: HashMap<String, Vec<i64>> = HashMap::new();
    for round in 0..10 {
        for aggregate in ["a", "b", "c"] {
            let event = Event::new("Posted", &serde_json::json!({ "round": round }))
                .unwrap()
                .aggregate("Acct", aggregate)
                .without_idempotency_key();
            let id = t.commit(vec![event]).await[0];
            committed.entry(aggregate.to_owned()).or_default().push(id);
        }
    }
    let loose = t.commit(events("Loose", 10)).await;
    let sink = RecordingSink::new();
    sink.script("Posted", Behaviour::FailTimes(1));
    let cfg = config().ordered_aggregate_types(["Acct"]);
    let relays: Vec<_> = futures::future::join_all((0..2).map(|n| {
        let cfg = cfg.clone().relay_id(format!("relay-{n}"));
        let sink = sink.clone();
        let t = &t;
        async move { Relay::new(t.connect().await, sink, cfg).unwrap() }
    }))
    .await;
    let drained = futures::future::join_all(
        relays
            .into_iter()
            .map(|relay| async move { relay.drain(std::future::pending()).await.unwrap() }),
    )
    .await;
    assert_eq!(
        drained.iter().map(|s| s.published).sum::<u64>(),
        40,
        "{}",
        t.name
    );
    let published = sink.published();
    for (aggregate, ids) in &committed {
        let mut first = Vec::new();
        for e in published
            .iter()
            .filter(|e| e.aggregate_id.as_deref() == Some(aggregate))
        {
            if !first.contains(&e.id) {
                first.push(e.id);
            }
        }
        assert_eq!(
            &first, ids,
            "{}: aggregate {aggregate} in commit order",
            t.name
        );
    }
    let counts = tally(sink.published_ids());
    assert!(
        loose.iter().all(|id| counts.get(id) == Some(&1)),
        "{}",
        t.name
    );
}

/// One test per case and store, named `<store>::<case>`.
macro_rules! relay_suite {
    ($($case:ident),* $(,)?) => {
        #[cfg(feature = "postgres")]
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(super::TestStore::postgres().await).await;
                }
            )*
        }
        #[cfg(feature = "mysql")]
        mod mysql {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(super::TestStore::mysql().await).await;
                }
            )*
        }
        #[cfg(feature = "sqlite")]
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(super::TestStore::sqlite().await).await;
                }
            )*
        }
    };
}

relay_suite!(
    g1_a_relay_dropped_mid_batch_loses_nothing,
    g1_the_relay_rides_out_database_errors_and_loses_nothing,
    g2_rolled_back_events_are_never_published,
    g3_relays_side_by_side_publish_each_event_once,
    g3_a_backlog_is_claimed_two_batches_at_once_each_event_once,
    g3_a_crowded_relay_claims_one_batch_at_a_time,
    g4_a_late_mark_from_a_relay_that_lost_its_lease_changes_nothing,
    g5_a_failing_event_is_tried_max_retries_times_then_failed,
    g6_ordered_aggregates_are_delivered_in_commit_order_through_retries,
);
