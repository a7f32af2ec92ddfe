//! The PostgreSQL store's statements by id, which a CDC relay runs on the ids its slot
//! delivers (`postbox-cdc`): what a claim by id did not get and need not look at again
//! (`ids_taken.sql`), and ordered events a polling claim took that go back while their
//! aggregate is busy (`ordered_put_back.sql`).

#![allow(clippy::unwrap_used, reason = "tests")]

use std::time::Duration;

use crate::common::{default_target, pg};
use postbox::store::{ClaimOrder, ClaimParams};
use postbox_testkit::TestDb;

/// Inserts an event of `aggregate_type`/`aggregate_id` by plain SQL; returns its id.
async fn insert(db: &TestDb, aggregate_type: &str, aggregate_id: &str) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO outbox_events (event_type, aggregate_type, aggregate_id, payload) \
         VALUES ('E', $1, $2, '{}') RETURNING id",
    )
    .bind(aggregate_type)
    .bind(aggregate_id)
    .fetch_one(db.pool())
    .await
    .unwrap()
}

fn params<'a>(target: &'a postbox::Target, ordered: &'a [String]) -> ClaimParams<'a> {
    ClaimParams {
        target,
        batch_size: 100,
        lease: Duration::from_secs(30),
        relay_id: "by-id",
        order: ClaimOrder {
            aggregate_types: ordered,
            ..ClaimOrder::default()
        },
        floor: 0,
    }
}

#[tokio::test]
async fn ids_taken_are_those_claimed_finished_or_tried_never_an_untried_pending_one() {
    let (db, store) = pg().await;
    let target = default_target();
    let untried = insert(&db, "Order", "o-1").await;
    let processed = insert(&db, "Order", "o-2").await;
    let claimed = insert(&db, "Order", "o-3").await;
    let tried = insert(&db, "Order", "o-4").await;
    sqlx::query(
        "UPDATE outbox_events SET status = 'PROCESSED', processed_at = now() WHERE id = $1",
    )
    .bind(processed)
    .execute(db.pool())
    .await
    .unwrap();
    sqlx::query("UPDATE outbox_events SET retry_count = 1, last_error = 'boom' WHERE id = $1")
        .bind(tried)
        .execute(db.pool())
        .await
        .unwrap();
    let got = store
        .events_claim_ids(&params(&target, &[]), &[claimed])
        .await
        .unwrap();
    assert_eq!(got.events.len(), 1);
    let not_yet_committed = claimed + 100;
    let mut taken = store
        .events_ids_taken(
            &target,
            &[untried, processed, claimed, tried, not_yet_committed],
        )
        .await
        .unwrap();
    taken.sort_unstable();
    assert_eq!(taken, vec![processed, claimed, tried]);
    assert!(
        store
            .events_ids_taken(&target, &[])
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn an_ordered_event_claimed_while_its_aggregate_is_busy_goes_back_untouched() {
    let (db, store) = pg().await;
    let target = default_target();
    let ordered = vec!["Acct".to_owned()];
    // Aggregate a-1 has a later id in flight under another claim; a-2 has one FAILED; a-3 has
    // one FAILED that was skipped; a-4 is free; "Note" is not ordered.
    let busy_later = insert(&db, "Acct", "a-1").await;
    let failed = insert(&db, "Acct", "a-2").await;
    let skipped = insert(&db, "Acct", "a-3").await;
    let in_flight = store
        .events_claim_ids(&params(&target, &[]), &[busy_later])
        .await
        .unwrap();
    assert_eq!(in_flight.events.len(), 1);
    sqlx::query("UPDATE outbox_events SET status = 'FAILED', last_error = 'boom' WHERE id = $1")
        .bind(failed)
        .execute(db.pool())
        .await
        .unwrap();
    sqlx::query(
        "UPDATE outbox_events SET status = 'FAILED', last_error = 'boom', skipped_at = now() \
         WHERE id = $1",
    )
    .bind(skipped)
    .execute(db.pool())
    .await
    .unwrap();
    let behind_busy = insert(&db, "Acct", "a-1").await;
    let behind_failed = insert(&db, "Acct", "a-2").await;
    let behind_skipped = insert(&db, "Acct", "a-3").await;
    let free = insert(&db, "Acct", "a-4").await;
    let unordered = insert(&db, "Note", "a-1").await;
    let ids = [behind_busy, behind_failed, behind_skipped, free, unordered];
    // A polling claim that goes by id alone (ordering off) takes all five.
    let claim = store
        .events_claim_ids(&params(&target, &[]), &ids)
        .await
        .unwrap();
    assert_eq!(claim.events.len(), 5);
    let mut back = store
        .events_ordered_put_back(&params(&target, &ordered), claim.claim_token, &ids)
        .await
        .unwrap();
    back.sort_unstable();
    assert_eq!(back, vec![behind_busy, behind_failed]);
    let rows: Vec<(i64, String, Option<uuid::Uuid>, i32)> = sqlx::query_as(
        "SELECT id, status, claim_token, retry_count FROM outbox_events \
         WHERE id = ANY($1) ORDER BY id",
    )
    .bind(&ids[..])
    .fetch_all(db.pool())
    .await
    .unwrap();
    for (id, status, token, tries) in rows {
        if back.contains(&id) {
            assert_eq!(
                (status.as_str(), token, tries),
                ("PENDING", None, 0),
                "{id}"
            );
        } else {
            assert_eq!(
                (status.as_str(), token),
                ("PROCESSING", Some(claim.claim_token)),
                "{id}"
            );
        }
    }
    // Under another token nothing goes back.
    assert!(
        store
            .events_ordered_put_back(&params(&target, &ordered), uuid::Uuid::new_v4(), &ids)
            .await
            .unwrap()
            .is_empty()
    );
}
