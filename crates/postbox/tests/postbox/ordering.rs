//! Per-aggregate ordering (G6): events of an ordered aggregate publish one after another in
//! commit order — never one whose earlier id is still in an open transaction —, a failing event
//! parks only its own aggregate, and an operator's skip or retry releases it. Needs PostgreSQL on
//! 127.0.0.1:5432.

#![allow(clippy::unwrap_used, reason = "tests")]

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::common::{Running, config, count, default_target, enqueue, pg, table_buffers};
use async_trait::async_trait;
use postbox::StoreExt;
use postbox::ops::StoreOps;
use postbox::store::{ClaimOrder, ClaimParams, Claimed, Store};
use postbox::{Event, OutboxEvent, PgStore, PublishError, Relay, Sink};
use postbox_testkit::{Behaviour, RecordingSink, TestDb, wait_until};

fn invoice(event_type: &str, id: &str, n: usize) -> Event {
    Event::new(event_type, &serde_json::json!({ "n": n }))
        .unwrap()
        .aggregate("Invoice", id)
        .without_idempotency_key()
}

fn ordered() -> postbox::RelayConfig {
    config().ordered_aggregate_types(["Invoice"])
}

/// The events `sink` published for aggregate `id`, in the order it published them.
fn published_for(sink: &RecordingSink, id: &str) -> Vec<String> {
    sink.published()
        .into_iter()
        .filter(|e| e.aggregate_id.as_deref() == Some(id))
        .map(|e| e.event_type)
        .collect()
}

/// Transaction A takes the lower id and commits last: the relay publishes nothing of that
/// aggregate while A is open (though the later event is committed and visible), events of
/// types that are not ordered flow, and once A commits both go out in id order, A's first.
/// Ordered events drawn after A's id wait for it whatever their aggregate: the relay cannot
/// read which aggregate an uncommitted row belongs to (docs/guarantees.md, G6).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_id_waits_for_an_earlier_open_transaction() {
    let (db, store) = pg().await;
    let outbox = store.outbox();
    let sink = RecordingSink::new();
    let relay = Relay::new(PgStore::new(db.pool().clone()), sink.clone(), ordered()).unwrap();
    let mut running = Running::start(relay);
    let before = enqueue(&db, &outbox, vec![invoice("InvoiceCreated", "2", 0)]).await[0];
    wait_until(
        "an ordered event is published",
        Duration::from_secs(10),
        || async { sink.published_ids().contains(&before) },
    )
    .await;

    let mut a = db.pool().begin().await.unwrap();
    let first = outbox
        .enqueue(&mut a, invoice("InvoiceCreated", "1", 0))
        .await
        .unwrap()
        .id()
        .unwrap();
    let second = enqueue(&db, &outbox, vec![invoice("InvoicePaid", "1", 1)]).await[0];
    assert!(first < second);
    let unordered = Event::new("CustomerMoved", &serde_json::json!({}))
        .unwrap()
        .aggregate("Customer", "7")
        .without_idempotency_key();
    let unordered = enqueue(&db, &outbox, vec![unordered]).await[0];
    wait_until(
        "the event of a type not ordered is published",
        Duration::from_secs(10),
        || async { sink.published_ids().contains(&unordered) },
    )
    .await;
    running
        .settled("the relay looked past invoice 1's open transaction")
        .await;
    assert!(
        published_for(&sink, "1").is_empty(),
        "nothing of invoice 1 while its first event's transaction is open"
    );
    a.commit().await.unwrap();
    wait_until(
        "invoice 1 is published",
        Duration::from_secs(10),
        || async { published_for(&sink, "1").len() == 2 },
    )
    .await;
    running.stop().await;
    assert_eq!(published_for(&sink, "1"), ["InvoiceCreated", "InvoicePaid"]);
}

/// The earlier transaction rolls back: the later event goes out once the rollback is known.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_id_goes_out_once_the_earlier_transaction_rolled_back() {
    let (db, store) = pg().await;
    let outbox = store.outbox();
    let mut a = db.pool().begin().await.unwrap();
    outbox
        .enqueue(&mut a, invoice("InvoiceDraft", "1", 0))
        .await
        .unwrap();
    let paid = enqueue(&db, &outbox, vec![invoice("InvoicePaid", "1", 1)]).await[0];
    let sink = RecordingSink::new();
    let mut running = Running::start(Relay::new(store, sink.clone(), ordered()).unwrap());
    running
        .settled("the relay looked past the earlier open transaction")
        .await;
    assert!(sink.published().is_empty());
    a.rollback().await.unwrap();
    wait_until(
        "the paid event is published",
        Duration::from_secs(10),
        || async { sink.published_ids() == [paid] },
    )
    .await;
    running.stop().await;
}

/// A failing event parks its aggregate only: the later events of its aggregate wait (not tried),
/// other aggregates flow; a skip releases the rest, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_event_parks_its_aggregate_until_skipped() {
    let (db, store) = pg().await;
    let outbox = store.outbox();
    let ids = enqueue(
        &db,
        &outbox,
        vec![
            invoice("InvoiceCreated", "1", 0),
            invoice("Poison", "1", 1),
            invoice("InvoiceSent", "1", 2),
            invoice("InvoicePaid", "1", 3),
            invoice("InvoiceCreated", "2", 0),
            invoice("InvoicePaid", "2", 1),
        ],
    )
    .await;
    let sink = RecordingSink::new();
    sink.script("Poison", Behaviour::FailPermanently);
    let relay = Relay::new(PgStore::new(db.pool().clone()), sink.clone(), ordered()).unwrap();
    let mut running = Running::start(relay);
    wait_until(
        "the poison event is FAILED",
        Duration::from_secs(10),
        || async { count(&db, "FAILED").await == 1 },
    )
    .await;
    wait_until(
        "invoice 2 is published",
        Duration::from_secs(10),
        || async { published_for(&sink, "2").len() == 2 },
    )
    .await;
    running
        .settled("the relay looked at invoice 1's parked events again")
        .await;
    assert_eq!(published_for(&sink, "1"), ["InvoiceCreated"]);
    assert_eq!(sink.attempts(ids[2]), 0, "a parked event is not tried");
    assert_eq!(count(&db, "PENDING").await, 2);

    // Parked, not lost: the backlog of a drain does not wait for it.
    let backlog = store
        .backlog(&default_target(), &["Invoice".to_owned()])
        .await
        .unwrap();
    assert_eq!(backlog.next_due_in, None, "only parked events are left");

    let skipped = store
        .events_skip(&default_target(), &[ids[0], ids[1]])
        .await
        .unwrap();
    assert_eq!(skipped, [ids[1]], "a published event is not skipped");
    wait_until(
        "the rest of invoice 1 is published",
        Duration::from_secs(10),
        || async { published_for(&sink, "1").len() == 3 },
    )
    .await;
    running.stop().await;
    assert_eq!(
        published_for(&sink, "1"),
        ["InvoiceCreated", "InvoiceSent", "InvoicePaid"]
    );
}

/// A retryable failure holds back its aggregate while it backs off; it succeeds on a later try
/// and the rest follows in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_event_keeps_its_place() {
    let (db, store) = pg().await;
    let outbox = store.outbox();
    enqueue(
        &db,
        &outbox,
        vec![
            invoice("InvoiceCreated", "1", 0),
            invoice("Flaky", "1", 1),
            invoice("InvoiceSent", "1", 2),
            invoice("InvoicePaid", "1", 3),
        ],
    )
    .await;
    let sink = RecordingSink::new();
    sink.script("Flaky", Behaviour::FailTimes(2));
    let running = Running::start(Relay::new(store, sink.clone(), ordered()).unwrap());
    wait_until(
        "invoice 1 is published",
        Duration::from_secs(10),
        || async { published_for(&sink, "1").len() == 4 },
    )
    .await;
    running.stop().await;
    assert_eq!(
        published_for(&sink, "1"),
        ["InvoiceCreated", "Flaky", "InvoiceSent", "InvoicePaid"]
    );
}

/// Without ordering, a claim takes every due event at once; with it, an ordered aggregate's
/// events are taken in id order as one run, and a second relay's claim takes none of them while
/// the first holds the head.
#[tokio::test]
async fn a_second_claim_takes_nothing_of_an_aggregate_in_flight() {
    let (db, store) = pg().await;
    let outbox = store.outbox();
    let ids = enqueue(
        &db,
        &outbox,
        (0..5).map(|i| invoice("InvoiceEvent", "1", i)).collect(),
    )
    .await;
    let first = claim_ordered(&store, 2, i64::MAX).await;
    assert_eq!(
        first.events.iter().map(|e| e.id).collect::<Vec<_>>(),
        ids[..2]
    );
    let second = claim_ordered(&store, 100, i64::MAX).await;
    assert!(second.events.is_empty(), "{:?}", second.events);
    // Above the commit horizon, nothing is claimed either.
    let horizon = claim_ordered(&store, 100, 0).await;
    assert!(horizon.events.is_empty());
    drop(db);
}

/// An aggregate's later event is not taken while its head, still `PENDING`, is held by another
/// transaction at the moment of the claim (a claim of another relay under way): the claim's walk
/// skips the locked head and must not take what follows it (migration
/// `0012_inlined_probes.sql`: the rest of the batch takes only first unfinished events).
#[tokio::test]
async fn a_later_event_waits_while_its_head_is_locked_by_another_claim() {
    let (db, store) = pg().await;
    let outbox = store.outbox();
    // x's head, then seven other aggregates (the first events of a claim's runs), then x's
    // second event, which a claim of 100 reaches past those runs.
    let mut batch = vec![invoice("InvoiceEvent", "x", 0)];
    batch.extend((1..=7).map(|i| invoice("InvoiceEvent", &format!("y{i}"), i)));
    batch.push(invoice("InvoiceEvent", "x", 8));
    let ids = enqueue(&db, &outbox, batch).await;
    let mut other = db.pool().begin().await.unwrap();
    sqlx::query("SELECT id FROM outbox_events WHERE id = $1 FOR UPDATE")
        .bind(ids[0])
        .execute(&mut *other)
        .await
        .unwrap();
    let claim = claim_ordered(&store, 100, i64::MAX).await;
    let taken: Vec<i64> = claim.events.iter().map(|e| e.id).collect();
    assert_eq!(taken, ids[1..8], "x's second event waits for its head");
    other.rollback().await.unwrap();
    let next = claim_ordered(&store, 100, i64::MAX).await;
    let taken: Vec<i64> = next.events.iter().map(|e| e.id).collect();
    assert_eq!(
        taken,
        [ids[0], ids[8]],
        "x's events go out in order once its head is free"
    );
    drop(db);
}

async fn claim_ordered(store: &PgStore, batch_size: u32, settled_through: i64) -> Claimed {
    store
        .events_claim(&ClaimParams {
            target: &default_target(),
            batch_size,
            lease: Duration::from_secs(30),
            relay_id: "r",
            floor: 0,
            order: ClaimOrder {
                aggregate_types: &["Invoice".to_owned()],
                settled_through,
                ..ClaimOrder::default()
            },
        })
        .await
        .unwrap()
}

/// Buffers one claim of 100 over every ordered aggregate touches (its work rolled back) when it
/// reads `walk` due events in id order before it finds the ready aggregates' heads directly (0:
/// it reads on to the end).
async fn ordered_claim_buffers(db: &TestDb, walk: i32) -> i64 {
    least_buffers(
        db,
        &format!(
            "SELECT * FROM postbox_claim(100, 30000, 'probe', gen_random_uuid(), ARRAY['*'],
                                         9223372036854775807, 'lease expired', 0, {walk}, false)"
        ),
    )
    .await
}

/// The fewest buffers of three runs of `sql` (each rolled back): the first may also prune the
/// pages and kill the index entries that earlier claims left, as much as the timing of the
/// tests running beside it allows (up to half as many buffers again on a loaded machine).
async fn least_buffers(db: &TestDb, sql: &str) -> i64 {
    let mut least = i64::MAX;
    for _ in 0..3 {
        least = least.min(table_buffers(db, sql).await);
    }
    least
}

/// Inserts `events` ordered events by plain SQL over `aggregates` aggregates
/// (`{prefix}0`, `{prefix}1`, …) in round robin: ids of one aggregate are `aggregates` apart.
async fn insert_round_robin(db: &TestDb, prefix: &str, aggregates: i32, events: i32) {
    sqlx::query(
        "INSERT INTO outbox_events (event_type, aggregate_type, aggregate_id, payload)
         SELECT 'InvoiceChanged', 'Invoice', $1 || (g % $2), jsonb_build_object('n', g)
         FROM generate_series(1, $3) g",
    )
    .bind(prefix)
    .bind(aggregates)
    .bind(events)
    .execute(db.pool())
    .await
    .unwrap();
}

/// While every aggregate of a long backlog has an event in flight, a claim finds the aggregates
/// that are ready behind it without reading the events that wait (PostgreSQL, migration
/// `0009_ordered_heads.sql`): its cost is the aggregates', not the backlog's.
#[tokio::test]
async fn an_ordered_claim_finds_ready_aggregates_without_reading_what_waits_behind_others() {
    let (db, store) = pg().await;
    insert_round_robin(&db, "busy-", 100, 20_000).await;
    let target = default_target();
    let every = ["*".to_owned()];
    let walk = |n: u32| ClaimParams {
        target: &target,
        batch_size: 100,
        lease: Duration::from_secs(30),
        relay_id: "r",
        floor: 0,
        order: ClaimOrder {
            aggregate_types: &every,
            settled_through: i64::MAX,
            walk: n,
            sweep: false,
        },
    };
    // Claims of 100 take runs of up to 16 events of 7 aggregates (migration
    // 0011_ordered_runs.sql), until every busy aggregate is in flight.
    let mut in_flight = HashSet::new();
    let mut claims = 0;
    loop {
        let claim = store.events_claim(&walk(100)).await.unwrap();
        if claim.events.is_empty() {
            break;
        }
        claims += 1;
        let aggregates: HashSet<String> = claim
            .events
            .iter()
            .map(|e| e.aggregate_id.clone().unwrap())
            .collect();
        assert!(
            aggregates.len() <= 7 && aggregates.is_disjoint(&in_flight),
            "a claim of 100 takes runs of 7 aggregates that were not in flight: {aggregates:?}"
        );
        assert!(
            claim.events.len() == 100 || aggregates.len() < 7,
            "a full batch while 7 aggregates are left: {} events",
            claim.events.len()
        );
        in_flight.extend(aggregates);
    }
    assert_eq!(in_flight.len(), 100, "every busy aggregate is in flight");
    assert_eq!(claims, 15);
    // What a draining relay waits for now: the leases of the heads in flight, found from the
    // heads (migration 0010_ordered_backlog.sql), not by a probe of every waiting event.
    let backlog = store.backlog(&target, &every).await.unwrap();
    assert!(
        backlog
            .next_due_in
            .is_some_and(|d| d > Duration::from_secs(20)),
        "{backlog:?}"
    );
    sqlx::query("ANALYZE outbox_events")
        .execute(db.pool())
        .await
        .unwrap();
    let backlog_buffers = least_buffers(&db, "SELECT postbox_backlog(ARRAY['*'])").await;
    // 100 aggregates that are ready, behind 19,900 events that wait for the ones in flight.
    sqlx::query(
        "INSERT INTO outbox_events (event_type, aggregate_type, aggregate_id, payload)
         SELECT 'InvoiceChanged', 'Invoice', 'ready-' || g, jsonb_build_object('n', g)
         FROM generate_series(1, 100) g",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let reading_on = ordered_claim_buffers(&db, 0).await;
    let finding_heads = ordered_claim_buffers(&db, 100).await;
    eprintln!(
        "ordered claim buffers: reading on {reading_on}, finding heads {finding_heads}; \
         backlog {backlog_buffers}"
    );
    // The backlog still reads the waiting events once, for one that is not ordered, but
    // without a probe of its aggregate each: a twentieth of what the claim that reads on touches
    // on a quiet server, a tenth with the whole suite running beside it (where pruning and the
    // statistics land depends on the other tests), bounded here at a fifth (0007's backlog made
    // the same probes).
    assert!(
        backlog_buffers * 5 < reading_on,
        "the backlog touched {backlog_buffers} buffers, reading on {reading_on}"
    );
    // Finding the heads: a descent for each of the 200 aggregates and one to its head (a few
    // buffers each), the walk of 100 with a probe each, and the 100 rows taken, each writing
    // a new version and its index entries (about a dozen buffers): 5,300 buffers on a quiet
    // server, up to 60 % more when the whole suite runs beside it (what pruning and the killed
    // index entries of the claims before it left depends on when those ran), against the
    // 60,000 of reading on.
    assert!(
        finding_heads < 100 * 100,
        "a claim of 100 that finds the heads touched {finding_heads} buffers"
    );
    assert!(
        reading_on > 5 * finding_heads,
        "reading on touches the waiting events (reading on: {reading_on}, finding heads: \
         {finding_heads}): without it this test shows nothing"
    );
    let second = store.events_claim(&walk(100)).await.unwrap();
    let mut aggregates: Vec<String> = second
        .events
        .iter()
        .map(|e| e.aggregate_id.clone().unwrap())
        .collect();
    aggregates.sort();
    let mut ready: Vec<String> = (1..=100).map(|g| format!("ready-{g}")).collect();
    ready.sort();
    assert_eq!(
        aggregates, ready,
        "each ready aggregate's event, nothing that waits"
    );
    // A relay of the previous release (migration 0008) claims beside it during a rolling
    // upgrade: its claim reads on, and finds nothing either side has not taken.
    let previous: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM postbox_claim(100, 30000, 'old-relay', gen_random_uuid(), ARRAY['*'],
                                      9223372036854775807, 'lease expired', 0)",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert!(previous.is_empty(), "{previous:?}");
    drop(db);
}

/// With few aggregates, claims grow as they do without ordering: a claim beside this relay's
/// own events in flight finds every aggregate busy, and neither shrinks the next claim nor sends
/// the relay to wait for its poll; the relay claims that target again only once those events
/// are recorded, and that claim takes the next run of each aggregate, twice as many as the last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_claims_of_few_aggregates_grow_with_the_backlog() {
    let (db, store) = pg().await;
    // 100 aggregates, 20 events each: a claim of n takes n / 100 of each.
    insert_round_robin(&db, "inv-", 100, 2_000).await;
    let faulty = postbox_testkit::FaultyStore::new(store);
    let sink = RecordingSink::new();
    let cfg = ordered()
        .ordered_aggregate_types(["*"])
        .batch_size(100)
        .max_batch_size(500);
    let relay = Relay::new(faulty.clone(), sink.clone(), cfg).unwrap();
    let stats = tokio::time::timeout(Duration::from_secs(60), relay.drain(std::future::pending()))
        .await
        .expect("the drain ends")
        .unwrap();
    assert_eq!(stats.published, 2000);
    // Claims of 100, 200, 400, 500, 500 and 300, and one beside each full claim that finds its
    // aggregates busy (then the relay waits for its own events instead): 10. Claims that
    // stayed at 100 would make 20 claims of events and 20 beside them.
    let claims = faulty.calls(postbox_testkit::StoreOp::Claim);
    assert!(claims <= 14, "{claims} claims for 2,000 events");
    let mut per_aggregate: HashMap<String, Vec<i64>> = HashMap::new();
    for e in sink.published() {
        per_aggregate
            .entry(e.aggregate_id.clone().unwrap())
            .or_default()
            .push(e.id);
    }
    for (aggregate, ids) in per_aggregate {
        assert!(ids.is_sorted(), "{aggregate} out of order: {ids:?}");
    }
}

/// The commit horizon settles only once the writers that were open at its probe have ended,
/// and not on other transactions.
#[tokio::test]
async fn the_commit_horizon_waits_for_open_writers_only() {
    let (db, store) = pg().await;
    let outbox = store.outbox();
    let t = default_target();
    let committed = enqueue(&db, &outbox, vec![invoice("A", "1", 0)]).await[0];
    let first = store.commit_horizon(&t, None).await.unwrap();
    assert_eq!(first.settled, Some(committed), "{first:?}");

    let mut open = db.pool().begin().await.unwrap();
    let pending = outbox
        .enqueue(&mut open, invoice("B", "1", 1))
        .await
        .unwrap()
        .id()
        .unwrap();
    // A transaction that writes elsewhere does not hold the horizon back.
    let mut other = db.pool().begin().await.unwrap();
    sqlx::query("CREATE TEMP TABLE scratch (x int)")
        .execute(&mut *other)
        .await
        .unwrap();
    let probe = store.commit_horizon(&t, None).await.unwrap();
    assert_eq!(probe.settled, None, "{probe:?}");
    let still = store
        .commit_horizon(&t, probe.probe.as_ref())
        .await
        .unwrap();
    assert_eq!(still.settled, None);
    open.commit().await.unwrap();
    let done = store
        .commit_horizon(&t, still.probe.as_ref())
        .await
        .unwrap();
    assert_eq!(done.settled, Some(pending), "{done:?}");
    other.rollback().await.unwrap();
}

/// A sink that fails one try in `every`, recording what it acknowledged.
#[derive(Clone, Default)]
struct Intermittent {
    calls: Arc<AtomicU64>,
    every: u64,
    acked: Arc<std::sync::Mutex<Vec<OutboxEvent>>>,
}

#[async_trait]
impl Sink for Intermittent {
    async fn publish(&self, event: &OutboxEvent) -> Result<(), PublishError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        if n % self.every == self.every - 1 {
            return Err(PublishError::retryable("intermittent failure"));
        }
        tokio::task::yield_now().await;
        self.acked.lock().unwrap().push(event.clone());
        Ok(())
    }
}

/// Concurrent producers commit the events of 20 aggregates from many transactions that draw
/// their ids, then linger a moment before they commit or roll back (so an aggregate's events
/// are committed out of id order all the time), while three relays publish them through a sink
/// that fails one try in seven. Per aggregate, the consumer sees each committed event once and
/// in id order — which it would not if a relay had published an event while an earlier one of
/// its aggregate was still uncommitted — and no rolled-back one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_producers_and_relays_keep_each_aggregates_order() {
    let (db, store) = pg().await;
    let sink = Intermittent {
        every: 7,
        ..Intermittent::default()
    };
    let cfg = config()
        .ordered_aggregate_types(["*"])
        .retry(postbox::backoff::Backoff {
            base: Duration::from_millis(5),
            cap: Duration::from_millis(20),
        });
    let relays: Vec<Running> = (0..3)
        .map(|_| {
            let relay =
                Relay::new(PgStore::new(db.pool().clone()), sink.clone(), cfg.clone()).unwrap();
            Running::start(relay)
        })
        .collect();

    let producers: Vec<_> = (0..4u64)
        .map(|p| {
            let db = db.pool().clone();
            let outbox = store.outbox();
            tokio::spawn(async move {
                let mut committed = Vec::new();
                for i in 0..100u64 {
                    let aggregate = ((i * 7 + p * 3) % 20 + 1).to_string();
                    let mut tx = db.begin().await.unwrap();
                    let event =
                        Event::new("InvoiceChanged", &serde_json::json!({ "p": p, "i": i }))
                            .unwrap()
                            .aggregate("Invoice", aggregate.as_str())
                            .without_idempotency_key()
                            // The sink's failures are deliberate: none may run out of tries.
                            .max_retries(100);
                    let id = outbox.enqueue(&mut tx, event).await.unwrap().id().unwrap();
                    // 0-6 ms: later ids of the same aggregate commit first. The wait is the
                    // subject: commits out of id order.
                    tokio::time::sleep(Duration::from_millis((p * 5 + i * 3) % 7)).await;
                    if i % 10 == 9 {
                        tx.rollback().await.unwrap();
                    } else {
                        tx.commit().await.unwrap();
                        committed.push(id);
                    }
                }
                committed
            })
        })
        .collect();
    let mut committed = Vec::new();
    for p in producers {
        committed.extend(p.await.unwrap());
    }
    assert_eq!(committed.len(), 4 * 90);
    wait_until(
        "every event is published",
        Duration::from_secs(60),
        || async { count(&db, "PROCESSED").await == 4 * 90 },
    )
    .await;
    for r in relays {
        r.stop().await;
    }
    let acked = sink.acked.lock().unwrap().clone();
    let mut per: HashMap<String, Vec<i64>> = HashMap::new();
    for e in &acked {
        per.entry(e.aggregate_id.clone().unwrap())
            .or_default()
            .push(e.id);
    }
    for (aggregate, ids) in &per {
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "invoice {aggregate} out of order (or twice): {ids:?}"
        );
    }
    let mut delivered: Vec<i64> = acked.iter().map(|e| e.id).collect();
    delivered.sort_unstable();
    committed.sort_unstable();
    assert_eq!(delivered, committed, "exactly the committed events");
}

/// SQLite draws ids in commit order; ordering there needs no horizon, and parks the same way.
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sqlite_parks_an_aggregate_and_keeps_order() {
    let db = postbox_testkit::TestSqlite::new();
    let store = Arc::new(db.store().await);
    postbox::migrate(&*store).await.unwrap();
    let outbox = store.outbox();
    let mut tx = store.pool().begin().await.unwrap();
    let ids: Vec<i64> = outbox
        .enqueue_many(
            &mut tx,
            vec![
                invoice("InvoiceCreated", "1", 0),
                invoice("Poison", "1", 1),
                invoice("InvoicePaid", "1", 2),
                invoice("InvoiceCreated", "2", 0),
                invoice("InvoicePaid", "2", 1),
            ],
        )
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.id().unwrap())
        .collect();
    tx.commit().await.unwrap();
    let sink = RecordingSink::new();
    sink.script("Poison", Behaviour::FailPermanently);
    let relay = Relay::from_parts(store.clone(), Arc::new(sink.clone()), ordered()).unwrap();
    relay.drain(std::future::pending()).await.unwrap();
    assert_eq!(published_for(&sink, "1"), ["InvoiceCreated"]);
    assert_eq!(published_for(&sink, "2"), ["InvoiceCreated", "InvoicePaid"]);
    let t = postbox::Target::default_schema(store.default_schema());
    assert_eq!(store.events_skip(&t, &[ids[1]]).await.unwrap(), [ids[1]]);
    relay.drain(std::future::pending()).await.unwrap();
    assert_eq!(published_for(&sink, "1"), ["InvoiceCreated", "InvoicePaid"]);
}

/// A writer that was open when the horizon's probe was taken and then PREPAREs (two-phase
/// commit) keeps the horizon back until COMMIT PREPARED, and an ordered claim takes neither its
/// event nor the later one of its aggregate until then. (Until a server restart its locks keep
/// the virtual transaction the probe saw; across one, see the next test.)
#[tokio::test]
async fn a_prepared_transaction_keeps_the_horizon_back_until_it_commits() {
    let (db, store) = pg().await;
    // PostgreSQL cannot PREPARE a transaction that sent NOTIFY.
    let outbox = store.outbox_builder().notify(false).build();
    let t = default_target();
    let mut open = db.pool().acquire().await.unwrap();
    sqlx::query("BEGIN").execute(&mut *open).await.unwrap();
    let held = outbox
        .enqueue(&mut *open, invoice("InvoiceCreated", "1", 0))
        .await
        .unwrap()
        .id()
        .unwrap();
    let later = enqueue(&db, &outbox, vec![invoice("InvoicePaid", "1", 1)]).await[0];
    assert!(later > held);
    let probe = store.commit_horizon(&t, None).await.unwrap();
    assert_eq!(probe.settled, None, "{probe:?}");

    let gid = format!("postbox-test-{held}-{}", uuid::Uuid::new_v4());
    sqlx::query(sqlx::AssertSqlSafe(format!("PREPARE TRANSACTION '{gid}'")))
        .execute(&mut *open)
        .await
        .unwrap();
    let after = store
        .commit_horizon(&t, probe.probe.as_ref())
        .await
        .unwrap();
    assert_eq!(
        after.settled, None,
        "the prepared writer still holds id {held}: {after:?}"
    );
    // An ordered claim takes neither: the held id is not settled.
    let claimed = claim_ordered(&store, 10, after.settled.unwrap_or(0)).await;
    assert!(claimed.events.is_empty(), "{:?}", claimed.events);

    sqlx::query(sqlx::AssertSqlSafe(format!("COMMIT PREPARED '{gid}'")))
        .execute(&mut *open)
        .await
        .unwrap();
    let done = store
        .commit_horizon(&t, after.probe.as_ref())
        .await
        .unwrap();
    assert_eq!(done.settled, Some(later), "{done:?}");
    let claimed = claim_ordered(&store, 10, later).await;
    let ids: Vec<i64> = claimed.events.iter().map(|e| e.id).collect();
    assert_eq!(ids, [held, later], "the aggregate's events, its head first");
}

/// The same across a server restart, on a cluster of the test's own (two-phase commit on): the
/// recovered prepared transaction holds its locks under `-1/<xid>`, not the virtual
/// transaction the probe saw, and still keeps the horizon back until COMMIT PREPARED — so the
/// later event of its aggregate does not go first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_transaction_keeps_the_horizon_back_across_a_server_restart() {
    use postbox_testkit::cluster::{Cluster, find_bin_dir};
    let dir = tempfile::tempdir().unwrap();
    let server = Cluster::start(
        dir.path(),
        find_bin_dir().unwrap(),
        "postgres",
        &[("max_prepared_transactions", "4")],
    )
    .await
    .unwrap();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect(&server.url())
        .await
        .unwrap();
    let store = PgStore::new(pool.clone());
    postbox::migrate(&store).await.unwrap();
    // PostgreSQL cannot PREPARE a transaction that sent NOTIFY.
    let outbox = store.outbox_builder().notify(false).build();
    let t = default_target();

    let mut open = pool.acquire().await.unwrap();
    sqlx::query("BEGIN").execute(&mut *open).await.unwrap();
    let held = outbox
        .enqueue(&mut *open, invoice("InvoiceCreated", "1", 0))
        .await
        .unwrap()
        .id()
        .unwrap();
    let mut tx = pool.begin().await.unwrap();
    let later = outbox
        .enqueue(&mut tx, invoice("InvoicePaid", "1", 1))
        .await
        .unwrap()
        .id()
        .unwrap();
    tx.commit().await.unwrap();
    let probe = store.commit_horizon(&t, None).await.unwrap();
    assert_eq!(probe.settled, None, "{probe:?}");
    sqlx::query("PREPARE TRANSACTION 'held-across-restart'")
        .execute(&mut *open)
        .await
        .unwrap();
    drop(open);

    server.restart(false, Duration::ZERO).await.unwrap();
    let after = store
        .commit_horizon(&t, probe.probe.as_ref())
        .await
        .unwrap();
    assert_eq!(
        after.settled, None,
        "the recovered prepared transaction still holds id {held}: {after:?}"
    );
    let claimed = claim_ordered(&store, 10, after.settled.unwrap_or(0)).await;
    assert!(claimed.events.is_empty(), "{:?}", claimed.events);

    sqlx::query("COMMIT PREPARED 'held-across-restart'")
        .execute(&pool)
        .await
        .unwrap();
    let done = store
        .commit_horizon(&t, after.probe.as_ref())
        .await
        .unwrap();
    assert_eq!(done.settled, Some(later), "{done:?}");
    let claimed = claim_ordered(&store, 10, later).await;
    let ids: Vec<i64> = claimed.events.iter().map(|e| e.id).collect();
    assert_eq!(ids, [held, later], "the aggregate's events, its head first");
    pool.close().await;
}

/// The error a relay with defaults stops with at once, draining `db`.
async fn refused_drain(db: &TestDb) -> postbox::Error {
    let relay = Relay::new(
        PgStore::new(db.pool().clone()),
        RecordingSink::new(),
        config(),
    )
    .unwrap();
    relay.drain(std::future::pending()).await.unwrap_err()
}

/// `err` is the refusal of an unsafe id sequence: its text.
fn unsafe_sequence(err: &postbox::Error) -> String {
    assert!(
        matches!(err, postbox::Error::UnsafeSequence { .. }),
        "{err:?}"
    );
    err.to_string()
}

/// The id sequence of the outbox, as `pg_get_serial_sequence` names it.
async fn id_sequence(db: &TestDb) -> String {
    sqlx::query_scalar("SELECT pg_get_serial_sequence('public.outbox_events', 'id')")
        .fetch_one(db.pool())
        .await
        .unwrap()
}

/// A sequence with CACHE > 1 hands each session ids from a block of its own, so ids stop
/// following commit order: `migrate` and the relay refuse it, naming the sequence, its cache
/// and the fix, and publish nothing until it is fixed.
#[tokio::test]
async fn a_cached_id_sequence_is_refused_at_migrate_and_by_the_relay() {
    let (db, store) = pg().await;
    let outbox = store.outbox();
    let seq = id_sequence(&db).await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "ALTER SEQUENCE {seq} CACHE 20"
    )))
    .execute(db.pool())
    .await
    .unwrap();
    let ids = enqueue(&db, &outbox, vec![invoice("A", "1", 0)]).await;

    let err = postbox::migrate(&store).await.unwrap_err();
    let text = unsafe_sequence(&err);
    assert!(text.contains("CACHE 20"), "{text}");
    assert!(
        text.contains(&format!("ALTER SEQUENCE {seq} CACHE 1")),
        "{text}"
    );
    assert!(err.needs_operator());

    for config in [config(), ordered()] {
        let sink = RecordingSink::new();
        let relay = Relay::new(PgStore::new(db.pool().clone()), sink.clone(), config).unwrap();
        let err = relay
            .drain(std::future::pending())
            .await
            .expect_err("a relay refuses a cached sequence");
        assert!(
            matches!(err, postbox::Error::UnsafeSequence { .. }),
            "{err:?}"
        );
        assert!(sink.published_ids().is_empty());
    }

    sqlx::query(sqlx::AssertSqlSafe(format!("ALTER SEQUENCE {seq} CACHE 1")))
        .execute(db.pool())
        .await
        .unwrap();
    postbox::migrate(&store).await.unwrap();
    let sink = RecordingSink::new();
    let relay = Relay::new(PgStore::new(db.pool().clone()), sink.clone(), ordered()).unwrap();
    relay.drain(std::future::pending()).await.unwrap();
    assert_eq!(sink.published_ids(), ids);
}

/// A dedup id (an event's id, without an idempotency key) is never handed out twice for the
/// life of an outbox: `TRUNCATE … RESTART IDENTITY` leaves the sequence where it was (the
/// truncate triggers set it back up to the highest id handed out), and a sequence set back once
/// the table was emptied (archived, then `setval`) is refused by the relay and by `migrate`,
/// naming the fix.
#[tokio::test]
async fn an_id_is_never_handed_out_twice_whatever_happens_to_the_sequence() {
    let (db, store) = pg().await;
    let outbox = store.outbox();
    let seq = id_sequence(&db).await;
    let first = enqueue(&db, &outbox, (0..5).map(|n| invoice("A", "1", n)).collect()).await;
    sqlx::query("TRUNCATE outbox_events RESTART IDENTITY")
        .execute(db.pool())
        .await
        .unwrap();
    let next = enqueue(
        &db,
        &outbox,
        (5..10).map(|n| invoice("A", "1", n)).collect(),
    )
    .await;
    assert!(
        next.iter().min() > first.iter().max(),
        "ids after the truncate {next:?} follow the ones before it {first:?}"
    );
    // Emptied by the archive, then the sequence set back.
    for sql in [
        "UPDATE outbox_events SET status = 'PROCESSED', processed_at = now()",
        "SELECT * FROM postbox_archive(now() + interval '1 hour', 0, 1000)",
    ] {
        sqlx::query(sql).execute(db.pool()).await.unwrap();
    }
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_events")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(left, 0, "the archive emptied the table");
    sqlx::query("SELECT setval($1, 1)")
        .bind(&seq)
        .execute(db.pool())
        .await
        .unwrap();
    let high = next.iter().max().unwrap();
    let err = refused_drain(&db).await;
    let text = unsafe_sequence(&err);
    assert!(text.contains("highest id it ever handed out"), "{text}");
    assert!(
        text.contains(&format!("SELECT setval('{seq}', {high})")),
        "{text}"
    );
    let err = postbox::migrate(&store).await.unwrap_err();
    assert!(
        matches!(err, postbox::Error::UnsafeSequence { .. }),
        "{err:?}"
    );
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT setval('{seq}', {high})"
    )))
    .execute(db.pool())
    .await
    .unwrap();
    postbox::migrate(&store).await.unwrap();
    let after = enqueue(&db, &outbox, vec![invoice("A", "1", 10)]).await;
    assert_eq!(after, vec![high + 1]);
}

/// A sequence moved back below ids still in the table (setval, RESTART) would hand new events
/// ids below ones already relayed: refused with the setval that fixes it. A role that may not
/// read the sequence is told the grant it needs.
#[tokio::test]
async fn a_sequence_moved_back_or_unreadable_is_refused_naming_the_fix() {
    let (db, store) = pg().await;
    let outbox = store.outbox();
    let seq = id_sequence(&db).await;
    enqueue(&db, &outbox, (0..3).map(|n| invoice("A", "1", n)).collect()).await;
    sqlx::query("SELECT setval($1, 1)")
        .bind(&seq)
        .execute(db.pool())
        .await
        .unwrap();
    let err = refused_drain(&db).await;
    let text = err.to_string();
    assert!(
        matches!(err, postbox::Error::UnsafeSequence { .. }),
        "{err:?}"
    );
    assert!(text.contains("moved back"), "{text}");
    assert!(text.contains("SELECT setval("), "{text}");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT setval('{seq}', (SELECT max(id) FROM outbox_events))"
    )))
    .execute(db.pool())
    .await
    .unwrap();

    // A relay role that may use the table but not read its sequence.
    let role = format!("postbox_noseq_{}", uuid::Uuid::new_v4().simple());
    for sql in [
        format!("CREATE ROLE {role} LOGIN"),
        format!("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}"),
        format!("REVOKE ALL ON SEQUENCE {seq} FROM {role}"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(db.pool())
            .await
            .unwrap();
    }
    let url = db.url().replacen("postgres@", &format!("{role}@"), 1);
    assert_ne!(
        url,
        db.url(),
        "the test database's URL names the user postgres"
    );
    let result = tokio::time::timeout(Duration::from_secs(30), async {
        let store = postbox::connect(&url).await?;
        let relay = Relay::new(store, RecordingSink::new(), config())?;
        relay.drain(std::future::pending()).await
    })
    .await
    .expect("the relay stops at once: retrying cannot help");
    // The relay's pool is gone with it; the role's privileges go with DROP OWNED.
    for sql in [format!("DROP OWNED BY {role}"), format!("DROP ROLE {role}")] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(db.pool())
            .await
            .unwrap();
    }
    let err = result.unwrap_err();
    let text = unsafe_sequence(&err);
    assert!(
        text.contains(&format!("GRANT USAGE ON SEQUENCE {seq}")),
        "{text}"
    );
}
