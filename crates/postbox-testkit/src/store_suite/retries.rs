//! Cases of a try that did not deliver: a failed try backs off exponentially on the database
//! clock up to the cap, an event gives up at its `max_retries` (at once on a permanent error, or
//! when a retry policy says), its error text is stored clean and capped; a release puts events
//! back without spending a try, and the slow lane gives FAILED events one more try at a time.

#![allow(
    clippy::unwrap_used,
    clippy::missing_panics_doc,
    reason = "a test suite fails loudly on the first unexpected error"
)]

use std::time::Duration;

use postbox::store::FailedTry;
use uuid::Uuid;

use super::StoreHarness;
use super::helpers::{
    POLICY, assert_ms, claim, enqueue_n, enqueue_with_max_retries, failed, lease_expired,
    mark_failed, mark_processed, ready, target,
};

/// A conformance case; see the module docs.
pub async fn mark_failed_backs_off_exponentially_on_the_database_clock<B: StoreHarness>() {
    let b = ready::<B>().await;
    let id = enqueue_with_max_retries(&b, 10).await;
    for n in 1..=5 {
        let c = claim(&b, "r1", 10, Duration::from_secs(30)).await;
        assert_eq!(c.events.len(), 1, "try {n}");
        assert_eq!(c.events[0].retry_count, n - 1);
        let marks = mark_failed(
            &b,
            c.claim_token,
            &[failed(id, &format!("broker down {n}"), false)],
        )
        .await;
        assert_eq!(
            marks,
            [postbox::store::FailedMark {
                id,
                retry_count: n,
                gave_up: false
            }]
        );
        let row = b.row(id).await;
        assert_eq!(row.status, "PENDING");
        assert_eq!(row.retry_count, n);
        assert_eq!(
            row.last_error.as_deref(),
            Some(format!("broker down {n}").as_str())
        );
        let expected = (100.0 * 2f64.powi(n)).min(1000.0);
        assert_ms(row.granted_ms, expected, &format!("backoff after try {n}"));
        assert_eq!(expected, POLICY.delay(n as u32).as_secs_f64() * 1000.0);
        assert!(row.left_ms.unwrap() > 0.0);
        assert!(
            claim(&b, "r2", 10, Duration::from_secs(30))
                .await
                .events
                .is_empty(),
            "not due during its backoff"
        );
        // Skip the wait instead of sleeping it out.
        b.exec(&format!(
            "UPDATE outbox_events SET locked_until = NULL WHERE id = {id}"
        ))
        .await;
    }
}

/// A conformance case; see the module docs.
pub async fn the_backoff_of_an_event_retried_for_a_long_time_stays_at_the_cap<B: StoreHarness>() {
    let b = ready::<B>().await;
    let id = enqueue_with_max_retries(&b, 100_000).await;
    for retry_count in [1_013, 1_014, 5_000, 99_990] {
        b.exec(&format!(
            "UPDATE outbox_events SET retry_count = {retry_count}, locked_until = NULL, \
             status = 'PENDING' WHERE id = {id}"
        ))
        .await;
        let c = claim(&b, "r1", 10, Duration::from_secs(30)).await;
        assert_eq!(c.events.len(), 1);
        let marks = mark_failed(&b, c.claim_token, &[failed(id, "down", false)]).await;
        assert_eq!(marks.len(), 1, "try {retry_count} was recorded");
        let row = b.row(id).await;
        assert_eq!(
            (row.status.as_str(), row.retry_count),
            ("PENDING", retry_count + 1)
        );
        assert_ms(
            row.granted_ms,
            1000.0,
            &format!("backoff after try {retry_count}"),
        );
    }
    assert_eq!(POLICY.delay(u32::MAX), POLICY.cap);
}

/// A conformance case; see the module docs.
pub async fn an_error_text_that_cannot_be_stored_as_is_is_cleaned_and_capped<B: StoreHarness>() {
    let b = ready::<B>().await;
    let ids = enqueue_n(&b, 2).await;
    let c = claim(&b, "r1", 10, Duration::from_secs(30)).await;
    let long = format!("500 Internal Server Error: {}", "é".repeat(20_000));
    let marks = mark_failed(
        &b,
        c.claim_token,
        &[
            failed(ids[0], "bad\0gateway\0 body", false),
            failed(ids[1], &long, false),
        ],
    )
    .await;
    assert_eq!(marks.len(), 2, "both tries were recorded: {marks:?}");
    let nul = b.row(ids[0]).await;
    assert_eq!(nul.status, "PENDING", "backing off, not left to its lease");
    assert_eq!(nul.last_error.as_deref(), Some("badgateway body"));
    let capped = b.row(ids[1]).await.last_error.unwrap();
    assert!(
        capped.len() <= postbox::store::MAX_ERROR_BYTES,
        "{}",
        capped.len()
    );
    assert!(
        capped.starts_with("500 Internal Server Error: éé"),
        "{capped:.40}"
    );
    assert!(capped.ends_with('…'), "a cut is marked");
}

/// A conformance case; see the module docs.
pub async fn a_release_puts_events_back_after_a_delay_without_spending_a_try<B: StoreHarness>() {
    let b = ready::<B>().await;
    let ids = enqueue_n(&b, 3).await;
    let c = claim(&b, "r1", 10, Duration::from_secs(30)).await;
    let release = |id: i64| postbox::store::Release {
        id,
        error: "unavailable: broker down since 12:00".to_owned(),
        delay: Duration::from_millis(300),
    };
    let releases = [release(ids[0]), release(ids[1])];
    let fenced = b
        .store()
        .events_release(&postbox::store::ReleaseParams {
            target: &target(&b),
            claim_token: Uuid::new_v4(),
            releases: &releases,
        })
        .await
        .unwrap();
    assert_eq!(fenced, 0, "another claim's token changes nothing");
    let released = b
        .store()
        .events_release(&postbox::store::ReleaseParams {
            target: &target(&b),
            claim_token: c.claim_token,
            releases: &releases,
        })
        .await
        .unwrap();
    assert_eq!(released, 2);
    for id in &ids[..2] {
        let row = b.row(*id).await;
        assert_eq!((row.status.as_str(), row.retry_count), ("PENDING", 0));
        assert_eq!(
            row.last_error.as_deref(),
            Some("unavailable: broker down since 12:00")
        );
        assert_ms(row.granted_ms, 300.0, "the release's delay");
    }
    assert!(
        claim(&b, "r2", 10, Duration::from_secs(30))
            .await
            .events
            .is_empty(),
        "not due during the delay (the third is still claimed)"
    );
    // Both delays have run out: waiting for the first alone once found the second not yet due
    // (MySQL, in CI), the two granted a millisecond or so apart.
    lease_expired(&b, ids[0]).await;
    lease_expired(&b, ids[1]).await;
    let again = claim(&b, "r2", 10, Duration::from_secs(30)).await;
    let again: Vec<i64> = again.events.iter().map(|e| e.id).collect();
    assert_eq!(again, ids[..2]);
}

/// A conformance case; see the module docs.
pub async fn mark_failed_at_max_retries_goes_failed<B: StoreHarness>() {
    let b = ready::<B>().await;
    let id = enqueue_with_max_retries(&b, 2).await;
    let c = claim(&b, "r1", 10, Duration::from_secs(30)).await;
    let marks = mark_failed(&b, c.claim_token, &[failed(id, "first", false)]).await;
    assert!(!marks[0].gave_up);
    b.exec(&format!(
        "UPDATE outbox_events SET locked_until = NULL WHERE id = {id}"
    ))
    .await;
    let c = claim(&b, "r1", 10, Duration::from_secs(30)).await;
    assert_eq!(c.events.len(), 1);
    let marks = mark_failed(&b, c.claim_token, &[failed(id, "second and last", false)]).await;
    assert_eq!(
        marks,
        [postbox::store::FailedMark {
            id,
            retry_count: 2,
            gave_up: true
        }]
    );
    let row = b.row(id).await;
    assert_eq!(row.status, "FAILED");
    assert_eq!(row.retry_count, 2);
    assert_eq!(row.last_error.as_deref(), Some("second and last"));
    assert_eq!(row.left_ms, None);
    assert!(
        claim(&b, "r1", 10, Duration::from_secs(30))
            .await
            .events
            .is_empty()
    );
}

/// A conformance case; see the module docs.
pub async fn a_permanent_error_fails_at_once<B: StoreHarness>() {
    let b = ready::<B>().await;
    let ids = enqueue_n(&b, 2).await;
    let c = claim(&b, "r1", 10, Duration::from_secs(30)).await;
    let marks = mark_failed(
        &b,
        c.claim_token,
        &[
            failed(ids[0], "400 Bad Request", true),
            failed(ids[1], "503", false),
        ],
    )
    .await;
    assert_eq!(marks.len(), 2);
    let by_id = |id| marks.iter().find(|m| m.id == id).expect("mark");
    assert!(by_id(ids[0]).gave_up);
    assert!(!by_id(ids[1]).gave_up);
    let row = b.row(ids[0]).await;
    assert_eq!((row.status.as_str(), row.retry_count), ("FAILED", 1));
    assert_eq!(row.last_error.as_deref(), Some("400 Bad Request"));
    assert_eq!(b.row(ids[1]).await.status, "PENDING");
}

/// A conformance case; see the module docs.
pub async fn the_slow_lane_gives_failed_events_one_more_try_at_a_time<B: StoreHarness>() {
    let b = ready::<B>().await;
    let t = target(&b);
    let slow = |after: Duration, max_tries: u32| {
        let store = b.store();
        let t = t.clone();
        async move {
            store
                .events_retry_slow_lane(&postbox::store::SlowLaneParams {
                    target: &t,
                    after,
                    max_tries,
                    batch_size: 1000,
                    exclude: &[],
                    lock_wait: None,
                })
                .await
                .unwrap()
        }
    };
    let ids = enqueue_n(&b, 3).await;
    let c = claim(&b, "r1", 10, Duration::from_secs(30)).await;
    mark_failed(
        &b,
        c.claim_token,
        &[
            failed(ids[0], "refused", true),
            failed(ids[1], "refused", true),
        ],
    )
    .await;
    assert_eq!(mark_processed(&b, c.claim_token, &ids[2..]).await, 1);
    // Not yet due: they failed less than an hour ago.
    assert_eq!(slow(Duration::from_secs(3600), 24).await, 0);
    assert_eq!(b.row(ids[0]).await.status, "FAILED");
    // Due: the subject is the database clock moving past the failures (SQLite's has
    // millisecond steps).
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(slow(Duration::ZERO, 24).await, 2);
    let row = b.row(ids[0]).await;
    assert_eq!(
        (row.status.as_str(), row.retry_count, row.left_ms),
        ("PENDING", 5, None),
        "one more try, due at once: retry_count at max_retries"
    );
    assert_eq!(b.row(ids[2]).await.status, "PROCESSED", "never touched");
    // The try fails (not even permanently): FAILED again at once, one slow-lane try counted.
    let c = claim(&b, "r1", 10, Duration::from_secs(30)).await;
    assert_eq!(c.events.len(), 2);
    let marks = mark_failed(&b, c.claim_token, &[failed(ids[0], "still down", false)]).await;
    assert!(marks[0].gave_up);
    assert_eq!(mark_processed(&b, c.claim_token, &ids[1..2]).await, 1);
    let row = b.row(ids[0]).await;
    assert_eq!((row.status.as_str(), row.retry_count), ("FAILED", 6));
    // One slow-lane try allowed: it had it. Two: one more. (The database clock moves past the
    // failure first, as above.)
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(slow(Duration::ZERO, 1).await, 0);
    assert_eq!(slow(Duration::ZERO, 2).await, 1);
    assert_eq!(
        b.row(ids[0]).await.retry_count,
        6,
        "raised to max_retries at least, never lowered"
    );

    // A type a retry policy keeps out of the slow lane stays FAILED (the events are `E<i>`).
    let c = claim(&b, "r1", 10, Duration::from_secs(30)).await;
    mark_failed(&b, c.claim_token, &[failed(ids[0], "again", false)]).await;
    // The database clock moves past the failure, as above.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let skip = |pattern: &str| vec![pattern.parse::<postbox::glob::Glob>().unwrap()];
    for (exclude, released) in [(skip("E*"), 0), (skip("E0"), 0), (skip("X*"), 1)] {
        let n = b
            .store()
            .events_retry_slow_lane(&postbox::store::SlowLaneParams {
                target: &t,
                after: Duration::ZERO,
                max_tries: 24,
                batch_size: 1000,
                exclude: &exclude,
                lock_wait: None,
            })
            .await
            .unwrap();
        assert_eq!(n, released, "exclude {:?}", exclude[0].as_str());
    }
}

/// A conformance case; see the module docs.
pub async fn a_retry_policy_overrides_the_events_max_retries<B: StoreHarness>() {
    let b = ready::<B>().await;
    let ids = enqueue_n(&b, 3).await; // max_retries 5 each
    let c = claim(&b, "r1", 10, Duration::from_secs(30)).await;
    let with_max = |id: i64, max: Option<i32>| FailedTry {
        max_retries: max,
        ..failed(id, "nope", false)
    };
    let marks = mark_failed(
        &b,
        c.claim_token,
        &[
            with_max(ids[0], Some(1)),
            with_max(ids[1], None),
            with_max(ids[2], Some(9)),
        ],
    )
    .await;
    let gave_up: Vec<bool> = ids
        .iter()
        .map(|id| {
            marks
                .iter()
                .find(|m| m.id == *id)
                .is_some_and(|m| m.gave_up)
        })
        .collect();
    assert_eq!(
        gave_up,
        [true, false, false],
        "a policy of one try fails at once"
    );
    assert_eq!(b.row(ids[0]).await.status, "FAILED");
    assert_eq!(b.row(ids[1]).await.status, "PENDING");
    // A policy may also allow more tries than the column: at the column's limit it goes on.
    for _ in 0..6 {
        // Due now, not after its backoff.
        b.exec(&format!(
            "UPDATE outbox_events SET locked_until = NULL WHERE id = {}",
            ids[2]
        ))
        .await;
        let c = claim(&b, "r1", 10, Duration::from_secs(30)).await;
        assert!(
            c.events.iter().any(|e| e.id == ids[2]),
            "event {} is claimed again",
            ids[2]
        );
        mark_failed(&b, c.claim_token, &[with_max(ids[2], Some(9))]).await;
    }
    let row = b.row(ids[2]).await;
    assert_eq!(
        (row.status.as_str(), row.retry_count),
        ("PENDING", 7),
        "past the column's 5"
    );
}
