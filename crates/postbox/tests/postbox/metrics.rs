//! The relay records exactly the metrics `postbox::metrics::ALL` lists as the relay's, with the
//! labels listed there: a relay runs against PostgreSQL through publishing, a failed try, an
//! event going `FAILED`, a destination down, a stale take-over, a fenced mark, the slow lane,
//! archiving, purging, vacuuming and sink health, with a recorder that notes every metric
//! registered. (`docs/operations.md` and `deploy/` are checked against the same list by
//! `postbox-admin`'s tests; the metrics only `postbox-admin` records are not the relay's.)
//!
//! The recorder is this process's global one, installed once; the other tests of the binary run
//! relays beside this one, so it notes only what the threads of this test's own runtime register.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::common::{Running, config, enqueue, events, pg};
use async_trait::async_trait;
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use postbox::store::ClaimParams;
use postbox::{Event, OutboxEvent, PublishError, Relay, Sink, Store, sink::SinkHealth};
use postbox_testkit::{Behaviour, RecordingSink, TestDb, wait_until};
use tokio::sync::Semaphore;

/// Every metric registered so far: its name, and the label keys of each registration.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<BTreeMap<String, BTreeSet<Vec<String>>>>>);

impl Seen {
    fn note(&self, key: &Key) {
        let mut labels: Vec<String> = key.labels().map(|l| l.key().to_owned()).collect();
        labels.sort_unstable();
        self.0
            .lock()
            .expect("lock")
            .entry(key.name().to_owned())
            .or_default()
            .insert(labels);
    }

    fn snapshot(&self) -> BTreeMap<String, BTreeSet<Vec<String>>> {
        self.0.lock().expect("lock").clone()
    }

    fn names(&self) -> BTreeSet<String> {
        self.snapshot().into_keys().collect()
    }
}

thread_local! {
    /// Where the registrations made on this thread are noted: set on the threads of the test's
    /// own runtime, none elsewhere.
    static NOTED: RefCell<Option<Seen>> = const { RefCell::new(None) };
}

/// Notes every metric registered on a thread of the test's runtime (each `counter!`, `gauge!`,
/// `histogram!` call registers its key); records no values.
struct NameRecorder;

impl NameRecorder {
    fn note(key: &Key) {
        NOTED.with(|noted| {
            if let Some(seen) = &*noted.borrow() {
                seen.note(key);
            }
        });
    }

    /// Installs the recorder as the process's global one, once.
    fn install() {
        static INSTALLED: OnceLock<()> = OnceLock::new();
        INSTALLED.get_or_init(|| {
            metrics::set_global_recorder(NameRecorder).expect("the only recorder");
        });
    }
}

impl Recorder for NameRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Self::note(key);
        Counter::noop()
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Self::note(key);
        Gauge::noop()
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Self::note(key);
        Histogram::noop()
    }
}

/// A recording sink that reports a healthy destination (for `postbox_sink_up`) and holds the
/// publishes of `Fenced` events until the gate opens.
#[derive(Clone)]
struct GatedSink {
    inner: RecordingSink,
    entered: Arc<AtomicBool>,
    gate: Arc<Semaphore>,
}

#[async_trait]
impl Sink for GatedSink {
    async fn publish(&self, event: &OutboxEvent) -> Result<(), PublishError> {
        if event.event_type == "Fenced" {
            self.entered.store(true, Ordering::SeqCst);
            let _open = self.gate.acquire().await.expect("gate");
        }
        self.inner.publish(event).await
    }

    fn health(&self) -> Vec<SinkHealth> {
        vec![SinkHealth::new("test", true, chrono::Utc::now(), None)]
    }
}

async fn sql(db: &TestDb, sql: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(db.pool())
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// Runs `test` on a multi-threaded runtime of its own (two workers, as `#[tokio::test]` would
/// make) whose threads, and this one, note the metrics they register into `seen`.
fn noted_into<F: std::future::Future<Output = ()>>(seen: &Seen, test: F) {
    let set = |seen: Option<Seen>| NOTED.with(|noted| *noted.borrow_mut() = seen);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .on_thread_start({
            let seen = seen.clone();
            move || set(Some(seen.clone()))
        })
        .build()
        .expect("runtime");
    set(Some(seen.clone()));
    runtime.block_on(test);
    set(None);
}

#[test]
fn the_relay_records_exactly_the_listed_metrics_with_their_labels() {
    let seen = Seen::default();
    NameRecorder::install();
    noted_into(&seen, the_relay_records_the_listed_metrics(seen.clone()));
}

async fn the_relay_records_the_listed_metrics(seen: Seen) {
    let (db, store) = pg().await;

    // For retention: a PROCESSED event of 40 days ago (archived), an event archived 100 days
    // ago (purged) and an inbox record past the dedup window (purged). None is claimable.
    sql(
        &db,
        "INSERT INTO outbox_events (event_type, payload, status, processed_at, created_at)
         VALUES ('Old', '{}', 'PROCESSED', now() - interval '39 days', now() - interval '40 days');
         INSERT INTO outbox_events_archive (id, event_type, payload, status, archived_at)
         VALUES (1000000, 'Ancient', '{}', 'PROCESSED', now() - interval '100 days');
         INSERT INTO inbox_messages (consumer, message_id, received_at)
         VALUES ('billing', 'm-1', now() - interval '8 days');",
    )
    .await;
    // A stale claim: taken by a relay that is gone, its lease already over.
    let stale = enqueue(&db, &db.outbox(), events("Stale", 1)).await[0];
    let gone = store
        .events_claim(&ClaimParams {
            target: &crate::common::default_target(),
            batch_size: 1,
            lease: Duration::from_millis(1),
            relay_id: "gone",
            floor: 0,
            order: Default::default(),
        })
        .await
        .expect("claim");
    assert_eq!(
        gone.events.iter().map(|e| e.id).collect::<Vec<_>>(),
        [stale]
    );

    let inner = RecordingSink::new();
    // A failed try, then a success; a try at its limit (FAILED); a destination down.
    inner.script("Flaky", Behaviour::FailTimes(1));
    inner.script("Poison", Behaviour::Fail);
    inner.script(
        "Down",
        Behaviour::FailWith(PublishError::unavailable("scripted outage")),
    );
    let sink = GatedSink {
        inner: inner.clone(),
        entered: Arc::default(),
        gate: Arc::new(Semaphore::new(0)),
    };
    let fenced = enqueue(&db, &db.outbox(), events("Fenced", 1)).await[0];
    let mut batch = events("Ok", 3);
    batch.extend(events("Flaky", 1));
    batch.extend(events("Down", 1));
    batch.push(
        Event::new("Poison", &serde_json::json!({}))
            .expect("event")
            .max_retries(1),
    );
    enqueue(&db, &db.outbox(), batch).await;

    let cfg = config()
        // Any dead row calls for a vacuum (once the statistics report it).
        .vacuum_threshold(Some(1))
        // The FAILED event gets its slow-lane try at once.
        .dead_letter_retry_interval(Some(Duration::from_millis(200)))
        .dead_letter_max_retries(1);
    let relay = Running::start(Relay::new(store, sink.clone(), cfg).expect("relay"));

    // Another relay takes the gated event over while it publishes: the mark is fenced off.
    wait_until(
        "the Fenced event is publishing",
        Duration::from_secs(10),
        || async { sink.entered.load(Ordering::SeqCst) },
    )
    .await;
    sqlx::query(
        "UPDATE outbox_events SET claim_token = gen_random_uuid(), locked_by = 'thief'
         WHERE id = $1",
    )
    .bind(fenced)
    .execute(db.pool())
    .await
    .expect("take over");
    sink.gate.add_permits(Semaphore::MAX_PERMITS / 2);

    let want: BTreeSet<String> = postbox::metrics::ALL
        .iter()
        .filter(|m| m.by_relay())
        .map(|m| m.name.to_owned())
        .collect();
    // Waits for the metrics, not for a time: the vacuum waits for the database's statistics,
    // which backends report up to seconds late.
    let missing = || {
        let names = seen.names();
        want.difference(&names).cloned().collect::<Vec<_>>()
    };
    wait_until(
        "the relay has registered every listed metric",
        Duration::from_secs(60),
        || async {
            let missing = missing();
            if missing.is_empty() {
                Ok(())
            } else {
                Err(format!("not registered yet: {missing:?}"))
            }
        },
    )
    .await;
    relay.stop().await;

    let recorded = seen.snapshot();
    let names: BTreeSet<String> = recorded.keys().cloned().collect();
    assert_eq!(
        names,
        want,
        "the relay recorded {:?} that are not listed, and did not record {:?}",
        names.difference(&want).collect::<Vec<_>>(),
        want.difference(&names).collect::<Vec<_>>(),
    );
    for m in postbox::metrics::ALL.iter().filter(|m| m.by_relay()) {
        let mut labels: Vec<String> = m.labels.iter().map(|l| (*l).to_owned()).collect();
        labels.sort_unstable();
        assert_eq!(
            recorded[m.name],
            BTreeSet::from([labels]),
            "{} is recorded with the labels listed",
            m.name
        );
    }
}
