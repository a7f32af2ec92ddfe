//! The slow lane of FAILED events (the dead-letter state): relays give a FAILED event one more
//! try every `dead_letter_retry_interval`, `dead_letter_max_retries` times, then leave it to an
//! operator.

#![allow(
    clippy::unwrap_used,
    reason = "tests fail loudly on the first unexpected error"
)]

use std::sync::Arc;
use std::time::Duration;

use crate::common::{Running, config, enqueue, events, pg, row};
use postbox::Relay;
use postbox_testkit::{Behaviour, RecordingSink, TestDb, relay_until, wait_until};

/// Waits until the slow lane has made a whole pass while each of `ids` was `FAILED` for longer
/// than `interval` (the database says so): a try one of them did not get then, the slow lane
/// refused it.
async fn slow_lane_passed_over(
    db: &TestDb,
    running: &mut Running,
    ids: &[i64],
    interval: Duration,
) {
    wait_until(
        "the events are due for the slow lane by the clock",
        Duration::from_secs(10),
        || async {
            sqlx::query_scalar::<_, bool>(
                "SELECT bool_and(status = 'FAILED' AND updated_at < now() - $2::float8 * interval '1 second')
                 FROM outbox_events WHERE id = ANY($1)",
            )
            .bind(ids)
            .bind(interval.as_secs_f64())
            .fetch_one(db.pool())
            .await
            .unwrap()
        },
    )
    .await;
    // The pass under way may have read the rows before they were due; the one after did not.
    let passes = running.rounds().progress().slow_lane_passes;
    relay_until(
        running.rounds(),
        "two passes of the slow lane",
        Duration::from_secs(10),
        |p| p.slow_lane_passes >= passes + 2,
    )
    .await;
}

#[tokio::test]
async fn failed_events_get_their_slow_lane_tries_then_wait_for_an_operator() {
    let (db, store) = pg().await;
    let sink = RecordingSink::new();
    sink.script("Refused", Behaviour::FailPermanently);
    sink.script("Healed", Behaviour::FailPermanently);
    let refused = enqueue(&db, &db.outbox(), events("Refused", 1)).await[0];
    let healed = enqueue(&db, &db.outbox(), events("Healed", 1)).await[0];
    let relay = Relay::from_parts(
        Arc::new(store),
        Arc::new(sink.clone()),
        config()
            .dead_letter_retry_interval(Some(Duration::from_millis(300)))
            .dead_letter_max_retries(3),
    )
    .unwrap();
    let mut running = Running::start(relay);
    wait_until("both FAILED", Duration::from_secs(10), || async {
        row(&db, "public", refused).await.status == "FAILED"
            && row(&db, "public", healed).await.status == "FAILED"
    })
    .await;
    // The destination of one is fixed: its next slow-lane try publishes it.
    sink.unscript("Healed");
    wait_until(
        "the healed event is published by the slow lane",
        Duration::from_secs(10),
        || async { sink.published_ids().contains(&healed) },
    )
    .await;
    // The other has its three slow-lane tries (1 + 3 publishes in all), then stays FAILED.
    wait_until(
        "the refused event used its slow lane",
        Duration::from_secs(15),
        || async { row(&db, "public", refused).await.retry_count == 5 + 3 },
    )
    .await;
    slow_lane_passed_over(&db, &mut running, &[refused], Duration::from_millis(300)).await;
    let r = row(&db, "public", refused).await;
    assert_eq!(
        (r.status.as_str(), r.retry_count),
        ("FAILED", 8),
        "no fourth slow-lane try"
    );
    assert_eq!(sink.attempts(refused), 4);
    running.stop().await;
}

#[tokio::test]
async fn the_slow_lane_can_be_turned_off() {
    let (db, store) = pg().await;
    let sink = RecordingSink::new();
    sink.script("Refused", Behaviour::FailPermanently);
    let id = enqueue(&db, &db.outbox(), events("Refused", 1)).await[0];
    let relay = Relay::from_parts(
        Arc::new(store),
        Arc::new(sink.clone()),
        config()
            .dead_letter_retry_interval(Some(Duration::from_millis(100)))
            .dead_letter_max_retries(0),
    )
    .unwrap();
    let mut running = Running::start(relay);
    wait_until("FAILED", Duration::from_secs(10), || async {
        row(&db, "public", id).await.status == "FAILED"
    })
    .await;
    wait_until(
        "the event is FAILED for longer than the interval",
        Duration::from_secs(10),
        || async {
            sqlx::query_scalar::<_, bool>(
                "SELECT updated_at < now() - interval '200 ms' FROM outbox_events WHERE id = $1",
            )
            .bind(id)
            .fetch_one(db.pool())
            .await
            .unwrap()
        },
    )
    .await;
    // The relay's rounds go on (each would tick the slow lane); the slow lane, off, never passes.
    let rounds = running.rounds().progress().rounds;
    relay_until(
        running.rounds(),
        "two more rounds",
        Duration::from_secs(10),
        |p| p.rounds >= rounds + 2,
    )
    .await;
    assert_eq!(running.rounds().progress().slow_lane_passes, 0);
    assert_eq!(sink.attempts(id), 1);
    assert_eq!(row(&db, "public", id).await.status, "FAILED");
    running.stop().await;
}

/// Retry policies per event type: validation-type events fail at once and skip the slow lane,
/// flaky ones get more tries on a backoff of their own, the rest keep the event's own limit.
#[tokio::test]
async fn retry_policies_apply_per_event_type() {
    use postbox::{backoff::Backoff, relay::RetryPolicy};
    let (db, store) = pg().await;
    let sink = RecordingSink::new();
    for t in ["ValidationFailed", "FlakyPartner", "OrderPlaced"] {
        sink.script(t, Behaviour::Fail);
    }
    let validation = enqueue(&db, &db.outbox(), events("ValidationFailed", 1)).await[0];
    let flaky = enqueue(&db, &db.outbox(), events("FlakyPartner", 1)).await[0];
    let plain = enqueue(&db, &db.outbox(), events("OrderPlaced", 1)).await[0];
    let config = config()
        .dead_letter_retry_interval(Some(Duration::from_millis(200)))
        .dead_letter_max_retries(1)
        .retry_policy(
            RetryPolicy::new("Validation*".parse().unwrap())
                .max_retries(1)
                .slow_lane(false),
        )
        .retry_policy(
            RetryPolicy::new("Flaky*".parse().unwrap())
                .max_retries(8)
                .backoff(Backoff {
                    base: Duration::from_millis(5),
                    cap: Duration::from_millis(20),
                }),
        );
    assert_eq!(config.policy_for("FlakyPartner").max_retries, Some(8));
    assert!(!config.policy_for("ValidationFailed").slow_lane);
    assert!(config.policy_for("OrderPlaced").matched.is_none());
    let relay = Relay::from_parts(Arc::new(store), Arc::new(sink.clone()), config).unwrap();
    let mut running = Running::start(relay);
    // Each gets its tries, then its one slow-lane try where it has the slow lane.
    wait_until(
        "every event used its tries",
        Duration::from_secs(15),
        || async {
            sink.attempts(validation) == 1
                && sink.attempts(flaky) == 8 + 1
                && sink.attempts(plain) == 5 + 1
        },
    )
    .await;
    slow_lane_passed_over(
        &db,
        &mut running,
        &[validation, flaky, plain],
        Duration::from_millis(200),
    )
    .await;
    assert_eq!(
        (
            sink.attempts(validation),
            sink.attempts(flaky),
            sink.attempts(plain)
        ),
        (1, 9, 6),
        "no more tries once FAILED with the slow lane used"
    );
    for (id, tries) in [(validation, 1), (flaky, 9), (plain, 6)] {
        let r = row(&db, "public", id).await;
        assert_eq!(
            (r.status.as_str(), r.retry_count),
            ("FAILED", tries),
            "event {id}"
        );
    }
    running.stop().await;
}
