//! Tests that try to break the guarantees of docs/guarantees.md on PostgreSQL, mostly through [`Relay`]:
//! ghosts, duplicate keys, poison and backoff, many relays, crashes, stalls, fencing, database
//! errors, shutdown and wake-ups. Handlers are tried in `handlers.rs`, tenants in `tenants.rs`.
//!
//! Each test has a database of its own and waits on conditions, never on guessed sleeps.

#![allow(
    clippy::unwrap_used,
    reason = "tests fail loudly on the first unexpected error"
)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{
    Running, config, count, default_target, enqueue, events, own_store, pg, publish_marker, row,
    tally,
};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use postbox::ops::StoreOps;
use postbox::store::ClaimParams;
use postbox::{
    Event, OutboxEvent, PublishError, Relay, Sink, Store, backoff::Backoff, event::Enqueued,
    relay::RelayStats,
};
use postbox_testkit::{Behaviour, FaultyStore, RecordingSink, StoreOp, relay_until, wait_until};

// ---- G2: no ghosts -------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g2_a_rolled_back_enqueue_is_never_published_while_relays_run() {
    let (db, _store) = pg().await;
    let sink = RecordingSink::new();
    let relays = [
        Running::start(Relay::new(own_store(&db, 3).await, sink.clone(), config()).unwrap()),
        Running::start(Relay::new(own_store(&db, 3).await, sink.clone(), config()).unwrap()),
    ];
    let outbox = db.outbox();

    // The ghosts sit in an open transaction while both relays keep claiming.
    let mut ghost_tx = db.pool().begin().await.unwrap();
    outbox
        .enqueue_many(&mut ghost_tx, events("Ghost", 50))
        .await
        .unwrap();
    for marker in ["Marker1", "Marker2", "Marker3"] {
        publish_marker(&db, &outbox, &sink, marker).await;
    }
    ghost_tx.rollback().await.unwrap();
    publish_marker(&db, &outbox, &sink, "AfterRollback").await;
    for relay in relays {
        relay.stop().await;
    }

    let published = sink.published();
    assert_eq!(published.len(), 4, "{published:?}");
    assert!(published.iter().all(|e| e.event_type != "Ghost"));
    let ghosts: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox_events WHERE event_type = 'Ghost'")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(ghosts, 0);
}

// ---- idempotency keys under concurrency ----------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_enqueues_of_one_key_store_one_row() {
    let (db, _store) = pg().await;
    const N: usize = 16;
    let barrier = Arc::new(tokio::sync::Barrier::new(N));
    let outbox = db.outbox();
    let tasks: Vec<_> = (0..N)
        .map(|i| {
            let (pool, barrier, outbox) = (db.pool().clone(), barrier.clone(), outbox.clone());
            tokio::spawn(async move {
                let mut tx = pool.begin().await.unwrap();
                let shared = Event::new("OrderPaid", &i)
                    .unwrap()
                    .aggregate("Order", "42");
                barrier.wait().await;
                let results = if i % 2 == 0 {
                    vec![outbox.enqueue(&mut tx, shared).await.unwrap()]
                } else {
                    let own = Event::new("OrderSeen", &i)
                        .unwrap()
                        .aggregate("Order", format!("own-{i}"));
                    outbox.enqueue_many(&mut tx, [shared, own]).await.unwrap()
                };
                tx.commit().await.unwrap();
                results
            })
        })
        .collect();
    let mut shared_inserted = 0;
    for task in tasks {
        let results = task.await.unwrap();
        if results[0].id().is_some() {
            shared_inserted += 1;
        }
        if let Some(own) = results.get(1) {
            assert!(matches!(own, Enqueued::Inserted(_)), "{results:?}");
        }
    }
    assert_eq!(shared_inserted, 1, "exactly one transaction wins the key");
    let rows: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox_events WHERE event_type = 'OrderPaid'")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(rows, 1);
    assert_eq!(count(&db, "PENDING").await, 1 + N as i64 / 2);
}

// ---- G5: bounded poison --------------------------------------------------------------------

/// Fails `Poison` events, acknowledges the rest; notes the database clock at every call.
struct ClockSink {
    pool: sqlx::PgPool,
    calls: Mutex<Vec<(i64, String, DateTime<Utc>)>>,
}

#[async_trait]
impl Sink for ClockSink {
    async fn publish(&self, event: &OutboxEvent) -> Result<(), PublishError> {
        let now: DateTime<Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
            .fetch_one(&self.pool)
            .await
            .map_err(PublishError::retryable)?;
        self.calls
            .lock()
            .unwrap()
            .push((event.id, event.event_type.clone(), now));
        if event.event_type == "Poison" {
            return Err(PublishError::retryable("broker said no"));
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g5_a_failing_event_is_tried_max_retries_times_with_backoff_on_the_database_clock() {
    let (db, store) = pg().await;
    let outbox = db.outbox();
    let poison = enqueue(
        &db,
        &outbox,
        vec![Event::new("Poison", &0).unwrap().max_retries(4)],
    )
    .await[0];
    let fine = enqueue(&db, &outbox, events("Fine", 20)).await;
    let sink = Arc::new(ClockSink {
        pool: db.pool().clone(),
        calls: Mutex::default(),
    });
    let base = Duration::from_millis(50);
    let cfg = config()
        .retry(Backoff {
            base,
            cap: Duration::from_secs(10),
        })
        .poll_interval(Duration::from_millis(20));
    let relay = Relay::new(store, sink.clone(), cfg).unwrap();
    let stats = relay.drain(std::future::pending()).await.unwrap();

    let r = row(&db, "public", poison).await;
    assert_eq!(r.status, "FAILED");
    assert_eq!(r.retry_count, 4);
    assert_eq!(r.last_error.as_deref(), Some("broker said no"));
    let calls = sink.calls.lock().unwrap().clone();
    let tries: Vec<DateTime<Utc>> = calls
        .iter()
        .filter(|(id, ..)| *id == poison)
        .map(|(.., at)| *at)
        .collect();
    assert_eq!(tries.len(), 4, "tried exactly max_retries times");
    for n in 1..tries.len() {
        let gap = (tries[n] - tries[n - 1]).to_std().unwrap();
        let backoff = base * 2u32.pow(n as u32);
        assert!(
            gap >= backoff,
            "try {} came {gap:?} after try {n}; the backoff is {backoff:?}",
            n + 1
        );
        // Generous: the suite runs many relays at once on two cores, and a round can stall for
        // a while; a retry that waited for anything else (the 20 ms poll aside) would be seconds
        // late.
        assert!(
            gap < backoff + Duration::from_secs(2),
            "try {} came {gap:?} after try {n}; the backoff is only {backoff:?}",
            n + 1
        );
    }
    // The poison never held up the others: they went through once each, before its second try.
    let fine_calls: Vec<_> = calls.iter().filter(|(_, t, _)| t == "Fine").collect();
    assert_eq!(fine_calls.len(), 20);
    assert!(fine_calls.iter().all(|(.., at)| *at < tries[1]));
    assert_eq!(count(&db, "PROCESSED").await, fine.len() as i64);
    assert_eq!(
        (stats.published, stats.failed_tries, stats.gave_up),
        (20, 4, 1)
    );
}

// ---- G1/G3: many relays, crashes, stalls -----------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g3_four_relays_draining_10_000_events_publish_each_exactly_once() {
    let (db, _store) = pg().await;
    let outbox = db.outbox();
    let mut ids = Vec::new();
    for _ in 0..10 {
        ids.extend(enqueue(&db, &outbox, events("Bulk", 1000)).await);
    }
    let mut sinks = Vec::new();
    let mut drains = Vec::new();
    for i in 0..4 {
        let sink = RecordingSink::new();
        sinks.push(sink.clone());
        let cfg = config()
            .relay_id(format!("relay-{i}"))
            .poll_interval(Duration::from_millis(20));
        let relay = Relay::new(own_store(&db, 3).await, sink, cfg).unwrap();
        drains.push(tokio::spawn(async move {
            relay.drain(std::future::pending()).await
        }));
    }
    let mut total = RelayStats::default();
    for drain in drains {
        let stats = drain.await.unwrap().unwrap();
        total.published += stats.published;
        total.recovered += stats.recovered;
        total.fenced += stats.fenced;
    }

    let published = tally(sinks.iter().flat_map(|s| s.published_ids()));
    let repeated: Vec<_> = published.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        repeated.is_empty(),
        "published more than once: {repeated:?}"
    );
    assert_eq!(published.len(), 10_000);
    assert!(ids.iter().all(|id| published.contains_key(id)));
    assert_eq!(count(&db, "PROCESSED").await, 10_000);
    assert_eq!(
        (total.published, total.recovered, total.fenced),
        (10_000, 0, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_renewal_keeps_a_batch_slower_than_its_lease() {
    let (db, _store) = pg().await;
    // Renewals come every third of a lease; under a loaded test run one can be a few hundred
    // milliseconds late, so the lease is long enough for a late renewal still to land in time.
    let ids = enqueue(&db, &db.outbox(), events("Slow", 4)).await;
    let cfg = config()
        .lease(Duration::from_millis(1500))
        .publish_timeout(Duration::from_millis(1300))
        .concurrency(1)
        .poll_interval(Duration::from_millis(20));
    let slow_sink = RecordingSink::new();
    slow_sink.script("Slow", Behaviour::Slow(Duration::from_millis(1000)));
    let slow = Relay::new(own_store(&db, 3).await, slow_sink.clone(), cfg.clone()).unwrap();
    let batch = tokio::spawn(async move { slow.batch(&default_target()).await });
    wait_until(
        "the slow batch is claimed",
        Duration::from_secs(5),
        || async { slow_sink.calls() >= 1 },
    )
    .await;

    let thief_sink = RecordingSink::new();
    let thief =
        Running::start(Relay::new(own_store(&db, 3).await, thief_sink.clone(), cfg).unwrap());
    let started = Instant::now();
    let (stats, _) = batch.await.unwrap().unwrap();
    assert!(
        started.elapsed() > Duration::from_millis(3000),
        "the batch outlived two leases"
    );
    let thief_stats = thief.stop().await;

    assert_eq!((stats.published, stats.fenced), (4, 0));
    assert!(thief_sink.published().is_empty(), "nothing was stolen");
    assert_eq!(thief_stats.recovered, 0);
    let mut got = slow_sink.published_ids();
    got.sort_unstable();
    assert_eq!(got, ids);
    for id in ids {
        let r = row(&db, "public", id).await;
        assert_eq!((r.status.as_str(), r.retry_count), ("PROCESSED", 0));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_longer_than_the_relays_patience_republishes_only_the_batch_in_flight() {
    let (db, store) = pg().await;
    let ids = enqueue(&db, &db.outbox(), events("E", 20)).await;
    let faulty = FaultyStore::new(store);
    // Three failures exhaust one batch's patience (half a lease); six exhaust two batches.
    faulty.fail_next(StoreOp::MarkProcessed, 6);
    let sink = RecordingSink::new();
    let cfg = config()
        .lease(Duration::from_millis(600))
        .publish_timeout(Duration::from_millis(300));
    let relay = Relay::new(faulty.clone(), sink.clone(), cfg).unwrap();
    relay.drain(std::future::pending()).await.unwrap();

    assert_eq!(faulty.injected(StoreOp::MarkProcessed), 6);
    assert_eq!(count(&db, "PROCESSED").await, 20, "nothing is lost");
    let published = tally(sink.published_ids());
    assert_eq!(published.len(), 20);
    assert!(
        ids.iter().all(|id| (1..=3).contains(&published[id])),
        "at most once per failed batch, plus the one that stuck: {published:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_survives_its_connections_being_killed() {
    let (db, _store) = pg().await;
    let sink = RecordingSink::new();
    let cfg = config().poll_interval(Duration::from_millis(200));
    let running = Running::start(Relay::new(own_store(&db, 3).await, sink.clone(), cfg).unwrap());
    let mut ids = enqueue(&db, &db.outbox(), events("Before", 50)).await;
    wait_until(
        "the first events are published",
        Duration::from_secs(5),
        || async { sink.published().len() == 50 },
    )
    .await;
    // What a database restart does to a relay: every one of its connections, the notification
    // listener's included, is cut.
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert!(
        killed >= 2,
        "the relay's connections and its listener were cut ({killed})"
    );
    ids.extend(enqueue(&db, &db.outbox(), events("After", 50)).await);
    wait_until(
        "the later events are published",
        Duration::from_secs(5),
        || async { sink.published().len() == 100 },
    )
    .await;
    running.stop().await;
    let published = tally(sink.published_ids());
    assert!(ids.iter().all(|id| published.get(id) == Some(&1)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_on_a_one_connection_pool_still_publishes() {
    let (db, _store) = pg().await;
    let store = own_store(&db, 1).await;
    let sink = RecordingSink::new();
    let running = Running::start(Relay::new(store, sink.clone(), config()).unwrap());
    let id = enqueue(&db, &db.outbox(), events("E", 1)).await[0];
    wait_until("the event is published", Duration::from_secs(5), || async {
        sink.published_ids() == [id]
    })
    .await;
    running.stop().await;
}

// ---- shutdown and wake-ups -----------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_finishes_the_batch_in_flight() {
    let (db, store) = pg().await;
    let ids = enqueue(&db, &db.outbox(), events("Slow", 10)).await;
    let sink = RecordingSink::new();
    sink.script("Slow", Behaviour::Slow(Duration::from_millis(300)));
    let cfg = config().poll_interval(Duration::from_secs(30));
    let running = Running::start(Relay::new(store, sink.clone(), cfg).unwrap());
    wait_until("the batch is in flight", Duration::from_secs(5), || async {
        sink.calls() == 10
    })
    .await;
    assert!(sink.published().is_empty(), "still publishing at shutdown");
    let stats = running.stop().await;

    assert_eq!(stats.published, 10);
    let mut got = sink.published_ids();
    got.sort_unstable();
    assert_eq!(got, ids);
    assert_eq!(count(&db, "PROCESSED").await, 10);
    assert_eq!(count(&db, "PROCESSING").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notification_wakes_an_idle_relay_at_once() {
    let (db, store) = pg().await;
    let sink = RecordingSink::new();
    // No busy polling and no look at the id sequences: only the notification can wake the
    // relay before its 30 s poll.
    let cfg = config()
        .poll_interval(Duration::from_secs(30))
        .busy_period(Duration::ZERO)
        .head_poll_interval(None);
    let running = Running::start(Relay::new(store, sink.clone(), cfg).unwrap());
    let first = enqueue(&db, &db.outbox(), events("First", 1)).await[0];
    wait_until(
        "the first event is published",
        Duration::from_secs(2),
        || async { sink.published_ids() == [first] },
    )
    .await;
    // The relay is now idle for 30 s unless the commit's notification wakes it.
    for n in 0..3 {
        let id = enqueue(&db, &db.outbox(), events("Next", 1)).await[0];
        wait_until(
            &format!("event {n} is published within a second of its commit"),
            Duration::from_secs(1),
            || async { sink.published_ids().contains(&id) },
        )
        .await;
    }
    running.stop().await;
}

#[tokio::test]
async fn an_outbox_without_notify_leaves_the_relay_to_its_poll() {
    let (db, store) = pg().await;
    let sink = RecordingSink::new();
    // Without the look at the id sequences (`head_poll_interval`, tested in idle.rs), which
    // would find the row at once.
    // A poll far enough away that a slow first round on a loaded machine does not reach into
    // the half second watched below.
    let cfg = config()
        .poll_interval(Duration::from_secs(3))
        .busy_period(Duration::ZERO)
        .head_poll_interval(None);
    let relay = Relay::new(store, sink.clone(), cfg).unwrap();
    let mut rounds = relay.rounds();
    let running = Running::start(relay);
    let first = enqueue(&db, &db.outbox(), events("First", 1)).await[0];
    wait_until(
        "the first event is published",
        Duration::from_secs(2),
        || async { sink.published_ids() == [first] },
    )
    .await;
    // The start-up round and the notification's round (one of them published the event) are
    // done, and the relay waits for its poll.
    relay_until(
        &mut rounds,
        "the relay is idle",
        Duration::from_secs(10),
        |p| p.rounds >= 2 && p.waiting,
    )
    .await;
    let idle = rounds.progress().rounds;
    let idle_since = std::time::Instant::now();
    let silent = db.outbox_builder().notify(false).build();
    let id = enqueue(&db, &silent, events("Quiet", 1)).await[0];
    // The relay waits again only once what it claimed is published and recorded, so once the
    // first round after the idle point has ended and the relay waits again, the event must be
    // out: it went out in that round.
    relay_until(
        &mut rounds,
        "the first round after the relay went idle has finished",
        Duration::from_secs(5),
        |p| p.rounds > idle && p.waiting,
    )
    .await;
    assert_eq!(
        sink.published_ids(),
        [first, id],
        "the event went out in the first round after the relay went idle"
    );
    assert!(
        idle_since.elapsed() >= Duration::from_secs(2),
        "no notification was sent, so that round was the 3 s poll, not a wake-up ({:?})",
        idle_since.elapsed()
    );
    running.stop().await;
}

/// Counts the notifications on Postbox's channel that arrive within `within`.
async fn notifications_during(
    listener: &mut sqlx::postgres::PgListener,
    within: Duration,
) -> usize {
    let mut n = 0;
    let deadline = tokio::time::Instant::now() + within;
    while let Ok(got) = tokio::time::timeout_at(deadline, listener.recv()).await {
        got.unwrap();
        n += 1;
    }
    n
}

#[tokio::test]
async fn an_outbox_notifies_at_most_once_per_notify_interval() {
    let (db, _store) = pg().await;
    let mut listener = sqlx::postgres::PgListener::connect_with(db.pool())
        .await
        .unwrap();
    listener.listen("postbox_events").await.unwrap();
    let debounced = db
        .outbox_builder()
        .notify_interval(Duration::from_secs(60))
        .build();
    for _ in 0..5 {
        enqueue(&db, &debounced, events("E", 1)).await;
    }
    // A clone shares the interval.
    enqueue(&db, &debounced.clone(), events("E", 1)).await;
    assert_eq!(
        notifications_during(&mut listener, Duration::from_millis(300)).await,
        1,
        "six commits within the interval, one notification"
    );
    let each = db.outbox_builder().notify_interval(Duration::ZERO).build();
    for _ in 0..3 {
        enqueue(&db, &each, events("E", 1)).await;
    }
    assert_eq!(
        notifications_during(&mut listener, Duration::from_millis(300)).await,
        3,
        "notify_interval zero notifies every commit"
    );
}

#[tokio::test]
async fn an_outbox_whose_turn_it_is_notifies_even_for_a_duplicate() {
    let (db, _store) = pg().await;
    let event = || {
        Event::new("E", &serde_json::json!({}))
            .unwrap()
            .idempotency_key("the-key")
    };
    let mut tx = db.pool().begin().await.unwrap();
    let silent = db.outbox_builder().notify(false).build();
    silent.enqueue(&mut tx, event()).await.unwrap();
    tx.commit().await.unwrap();

    let mut listener = sqlx::postgres::PgListener::connect_with(db.pool())
        .await
        .unwrap();
    listener.listen("postbox_events").await.unwrap();
    let outbox = db
        .outbox_builder()
        .notify_interval(Duration::from_secs(60))
        .build();
    let mut tx = db.pool().begin().await.unwrap();
    assert_eq!(
        outbox.enqueue(&mut tx, event()).await.unwrap(),
        Enqueued::Duplicate
    );
    tx.commit().await.unwrap();
    // The outbox used its turn on the duplicate; had it sent nothing, the events it enqueues
    // in the next minute would wait for the relays' poll.
    assert_eq!(
        notifications_during(&mut listener, Duration::from_millis(300)).await,
        1
    );
}

/// Producers notify at most once per interval; a relay woken by one keeps polling briskly, so
/// the events committed after it without a notification of their own are not left to the poll.
#[tokio::test]
async fn a_busy_relay_finds_events_that_sent_no_notification() {
    for busy in [true, false] {
        let (db, store) = pg().await;
        let sink = RecordingSink::new();
        let cfg = config()
            .poll_interval(Duration::from_secs(30))
            .busy_poll_interval(Duration::from_millis(10))
            .busy_period(if busy {
                Duration::from_secs(10)
            } else {
                Duration::ZERO
            })
            // Busy polling alone; the look at the id sequences is tested in idle.rs.
            .head_poll_interval(None);
        let relay = Relay::new(store, sink.clone(), cfg).unwrap();
        let mut rounds = relay.rounds();
        let running = Running::start(relay);
        let outbox = db
            .outbox_builder()
            .notify_interval(Duration::from_secs(60))
            .build();
        let first = enqueue(&db, &outbox, events("First", 1)).await[0];
        wait_until(
            "the notified event is published",
            Duration::from_secs(2),
            || async { sink.published_ids() == [first] },
        )
        .await;
        // The relay may have published the first event in its start-up round, before its
        // notification arrived; let that notification's round pass, or it would find the second.
        relay_until(
            &mut rounds,
            "the relay is idle",
            Duration::from_secs(40),
            |p| p.rounds >= 2 && p.waiting,
        )
        .await;
        let second = enqueue(&db, &outbox, events("Second", 1)).await[0];
        // The two seconds are the subject: without busy polling, an event that sent no
        // notification waits for the 30 s poll.
        let found = tokio::time::timeout(
            Duration::from_secs(2),
            wait_until(
                "never: bounded by the timeout",
                Duration::from_secs(3),
                || async { sink.published_ids().contains(&second) },
            ),
        )
        .await
        .is_ok();
        assert_eq!(
            found, busy,
            "busy polling {busy}: the un-notified event published within 2 s (the poll is 30 s)"
        );
        running.stop().await;
    }
}

/// Every mark leaves a dead row version; with autovacuum off (as on the test server) nothing
/// removes them unless the relay does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_vacuums_its_outbox_table_past_the_dead_row_threshold() {
    let (db, store) = pg().await;
    let vacuums = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT vacuum_count + autovacuum_count FROM pg_stat_user_tables
             WHERE schemaname = 'public' AND relname = 'outbox_events'",
        )
        .fetch_one(db.pool())
        .await
        .unwrap()
    };
    let before = vacuums().await;
    enqueue(&db, &db.outbox(), events("E", 600)).await;
    let sink = RecordingSink::new();
    let cfg = config().vacuum_threshold(Some(500));
    let running = Running::start(Relay::new(store, sink.clone(), cfg).unwrap());
    wait_until("600 events published", Duration::from_secs(10), || async {
        sink.published().len() == 600
    })
    .await;
    // The database's statistics reach the relay within seconds (backends report them in
    // batches, up to 10 s late when idle), then it vacuums. A backend that reports its share of
    // the dead rows after a vacuum counted them anew pushes the count past the threshold again:
    // the relay vacuums again, so the check is for a state reached, not a single moment.
    let dead = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT n_dead_tup FROM pg_stat_user_tables
             WHERE schemaname = 'public' AND relname = 'outbox_events'",
        )
        .fetch_one(db.pool())
        .await
        .unwrap()
    };
    wait_until(
        "the relay vacuumed the outbox table below 500 dead rows",
        Duration::from_secs(45),
        || async { vacuums().await > before && dead().await < 500 },
    )
    .await;
    running.stop().await;
}

/// A vacuum removes nothing a snapshot still sees: while the transaction that held back the
/// relay's first vacuum stays open, the relay does not vacuum the table again (it would read it
/// whole after every pause, for nothing), nor does a relay started after it (a restart, a
/// rolling deploy: what held the last vacuum back is kept in the database); once it ends, the
/// next vacuum removes the dead rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_does_not_vacuum_again_while_the_same_snapshot_holds_vacuum_back() {
    let (db, store) = pg().await;
    let stat = |column: &'static str| {
        let pool = db.pool().clone();
        async move {
            sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(format!(
                "SELECT {column} FROM pg_stat_user_tables
                 WHERE schemaname = 'public' AND relname = 'outbox_events'"
            )))
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    // A report's snapshot, taken before any event is marked.
    let mut report = db.pool().begin().await.unwrap();
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut *report)
        .await
        .unwrap();
    sqlx::query("SELECT count(*) FROM outbox_events")
        .execute(&mut *report)
        .await
        .unwrap();
    enqueue(&db, &db.outbox(), events("E", 300)).await;
    let sink = RecordingSink::new();
    let cfg = config().vacuum_threshold(Some(100));
    let running = Running::start(Relay::new(store, sink.clone(), cfg).unwrap());
    wait_until("300 events published", Duration::from_secs(10), || async {
        sink.published().len() == 300
    })
    .await;
    wait_until(
        "the relay vacuumed once",
        Duration::from_secs(30),
        || async { stat("vacuum_count").await >= 1 },
    )
    .await;
    // Checks come every second and a vacuum of this table takes milliseconds: without the
    // snapshot's memory the relay would have vacuumed it a few times more by now.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        stat("vacuum_count").await,
        1,
        "no second vacuum while the same snapshot holds vacuum back"
    );
    assert!(
        stat("n_dead_tup").await >= 100,
        "the dead rows are still there"
    );
    // A relay started now (a new process) knows it too.
    running.stop().await;
    let running = Running::start(
        Relay::new(
            own_store(&db, 4).await,
            sink.clone(),
            config().vacuum_threshold(Some(100)),
        )
        .unwrap(),
    );
    // The new relay's first checks come within a second or two.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        stat("vacuum_count").await,
        1,
        "no vacuum by a relay started while the same snapshot holds vacuum back"
    );
    report.rollback().await.unwrap();
    wait_until(
        "the relay vacuumed again once the snapshot ended, and the dead rows are gone",
        Duration::from_secs(45),
        || async { stat("vacuum_count").await >= 2 && stat("n_dead_tup").await < 100 },
    )
    .await;
    running.stop().await;
}

#[tokio::test]
async fn a_table_another_relay_is_vacuuming_is_skipped() {
    let (db, store) = pg().await;
    let vacuums = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT vacuum_count FROM pg_stat_user_tables
             WHERE schemaname = 'public' AND relname = 'outbox_events'",
        )
        .fetch_one(db.pool())
        .await
        .unwrap()
    };
    store.outbox_vacuum(&default_target()).await.unwrap();
    wait_until("the vacuum is counted", Duration::from_secs(15), || async {
        vacuums().await == 1
    })
    .await;
    // Another relay's vacuum holds the table's vacuum lock.
    let mut other = db.pool().acquire().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock($1, hashtext('public'))")
        .bind(postbox::store::pg_locks::VACUUM)
        .execute(&mut *other)
        .await
        .unwrap();
    store.outbox_vacuum(&default_target()).await.unwrap();
    sqlx::query("SELECT pg_advisory_unlock($1, hashtext('public'))")
        .bind(postbox::store::pg_locks::VACUUM)
        .execute(&mut *other)
        .await
        .unwrap();
    drop(other);
    store.outbox_vacuum(&default_target()).await.unwrap();
    wait_until(
        "the third vacuum is counted",
        Duration::from_secs(15),
        || async { vacuums().await >= 2 },
    )
    .await;
    assert_eq!(
        vacuums().await,
        2,
        "the second call found the table taken and skipped it"
    );
}

#[tokio::test]
async fn a_role_that_does_not_own_the_outbox_table_is_told_so_not_vacuumed() {
    let (db, _store) = pg().await;
    let role = format!("postbox_nonowner_{}", uuid::Uuid::new_v4().simple());
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE ROLE {role} LOGIN; GRANT USAGE ON SCHEMA public TO {role};
         GRANT SELECT, UPDATE ON ALL TABLES IN SCHEMA public TO {role}"
    )))
    .execute(db.pool())
    .await
    .unwrap();
    let options = db.pool().connect_options().as_ref().clone().username(&role);
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .unwrap();
    let store = postbox::PgStore::new(pool.clone());
    let result = store.outbox_vacuum(&default_target()).await;
    pool.close().await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP OWNED BY {role}; DROP ROLE {role}"
    )))
    .execute(db.pool())
    .await
    .unwrap();
    let err = result.unwrap_err();
    assert!(matches!(err, postbox::Error::NotOwner { .. }), "{err:?}");
    assert!(err.to_string().contains("vacuum_threshold"), "{err}");
}

#[tokio::test]
async fn a_running_relay_wakes_for_its_own_retry_before_the_next_poll() {
    let (db, store) = pg().await;
    let sink = RecordingSink::new();
    sink.script("Flaky", Behaviour::FailTimes(1));
    // No busy polling and no notification for the retry: only the relay's own retry schedule
    // can wake it before its 30 s poll.
    let cfg = config()
        .poll_interval(Duration::from_secs(30))
        .busy_period(Duration::ZERO)
        .retry(Backoff {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(1),
        });
    let running = Running::start(Relay::new(store, sink.clone(), cfg).unwrap());
    let id = enqueue(&db, &db.outbox(), events("Flaky", 1)).await[0];
    // First try fails; the retry is due 200 ms later. A relay that slept until its next poll
    // would publish it only after 30 s.
    wait_until(
        "the retry is published long before the next poll",
        Duration::from_secs(5),
        || async { sink.published_ids() == [id] },
    )
    .await;
    assert_eq!(sink.attempts(id), 2);
    running.stop().await;
}

/// With statistics that say "empty" (a new or truncated table, no autovacuum), PostgreSQL would
/// plan the claim's pick as a bitmap scan plus a sort, which visits every dead index entry of
/// processed events on every claim. The claim function pins the ordered index scan.
#[tokio::test]
async fn the_claim_reads_the_polling_index_in_order_whatever_the_statistics_say() {
    let (db, store) = pg().await;
    let mut conn = db.pool().acquire().await.unwrap();
    sqlx::query("VACUUM ANALYZE outbox_events")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO outbox_events (event_type, payload, status)
         SELECT 'T', '{}', CASE WHEN g <= 20000 THEN 'PROCESSED' ELSE 'PENDING' END
         FROM generate_series(1, 20010) g",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    let config: Vec<String> =
        sqlx::query_scalar("SELECT unnest(proconfig) FROM pg_proc WHERE proname = 'postbox_claim'")
            .fetch_all(&mut *conn)
            .await
            .unwrap();
    assert!(
        config.contains(&"enable_bitmapscan=off".to_owned())
            && config.contains(&"enable_seqscan=off".to_owned()),
        "{config:?}"
    );
    // The function's settings applied to its pick: an ordered scan of the polling index.
    sqlx::raw_sql("SET enable_bitmapscan = off; SET enable_seqscan = off")
        .execute(&mut *conn)
        .await
        .unwrap();
    let plan: Vec<String> = sqlx::query_scalar(
        "EXPLAIN SELECT id FROM outbox_events
         WHERE status IN ('PENDING', 'PROCESSING')
           AND (locked_until IS NULL OR locked_until < now())
         ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    let plan = plan.join("\n");
    assert!(
        plan.contains("Index Scan using outbox_events_due_idx") && !plan.contains("Sort"),
        "{plan}"
    );
    drop(conn);
    let claimed = store
        .events_claim(&ClaimParams {
            target: &default_target(),
            batch_size: 100,
            lease: Duration::from_secs(30),
            relay_id: "r1",
            floor: 0,
            order: Default::default(),
        })
        .await
        .unwrap();
    assert_eq!(claimed.events.len(), 10);
    assert_eq!(claimed.events[0].id, 20001);
}
