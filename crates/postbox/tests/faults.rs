//! Production faults around the claim: rows nobody validated, error texts that cannot be stored,
//! events retried for a very long time. None of them may lose an event or fail events that had
//! nothing to do with the fault.

#![cfg(feature = "postgres")]
#![allow(
    clippy::unwrap_used,
    reason = "tests fail loudly on the first unexpected error"
)]

mod common;

use common::{config, default_target, enqueue, events, pg, row};
use postbox::{PublishError, Relay};
use postbox_testkit::{Behaviour, RecordingSink};

/// Plain-SQL producers can store what PostgreSQL accepts and serde cannot read: headers nested
/// deeper than 128 levels, numbers like `1e400`. Each such row fails at once, alone, with a
/// reason naming the column; the rest of its batch is published in the same round. A payload
/// is forwarded as the JSON text stored, however deep it nests.
#[tokio::test]
async fn a_row_that_cannot_be_read_fails_alone_and_the_rest_of_its_batch_is_published() {
    let (db, store) = pg().await;
    let ids = enqueue(&db, &db.outbox(), events("E", 100)).await;
    let spoiled = [
        (
            ids[10],
            "headers",
            "headers = ('{\"a\": ' || repeat('[', 200) || '1' || repeat(']', 200) || '}')::jsonb",
        ),
        (ids[50], "headers", "headers = '{\"n\": 1e400}'::jsonb"),
    ];
    let deep_payload = ids[90];
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "UPDATE outbox_events SET payload = (repeat('[', 200) || '1' || repeat(']', 200))::jsonb \
         WHERE id = {deep_payload}"
    )))
    .execute(db.pool())
    .await
    .unwrap();
    for (id, _, set) in &spoiled {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "UPDATE outbox_events SET {set} WHERE id = {id}"
        )))
        .execute(db.pool())
        .await
        .unwrap();
    }
    let sink = RecordingSink::new();
    let relay = Relay::new(store, sink.clone(), config().batch_size(100)).unwrap();
    let (stats, _) = relay.batch(&default_target()).await.unwrap();
    assert_eq!(stats.published, 98, "{stats:?}");
    assert_eq!(stats.gave_up, 2, "{stats:?}");
    assert_eq!(sink.published_ids().len(), 98);
    assert!(sink.published_ids().contains(&deep_payload));
    for (id, column, _) in spoiled {
        let r = row(&db, "public", id).await;
        assert_eq!(r.status, "FAILED", "event {id}");
        let error = r.last_error.unwrap_or_default();
        assert!(error.contains(column), "event {id}: {error}");
        assert!(!sink.published_ids().contains(&id));
    }
}

/// A destination that answers with NUL bytes in its error (a binary body) or a very long one
/// still gets each failed try recorded and backed off, not left to the lease.
#[tokio::test]
async fn error_texts_with_nul_bytes_or_megabytes_are_recorded_and_backed_off() {
    let (db, store) = pg().await;
    let ids = enqueue(&db, &db.outbox(), events("Bad", 2)).await;
    let sink = RecordingSink::new();
    sink.script(
        "Bad",
        Behaviour::FailWith(PublishError::retryable(format!(
            "500 Internal Server Error: \u{0}\u{1}binary\u{0} {}",
            "x".repeat(1 << 20)
        ))),
    );
    let relay = Relay::new(store, sink.clone(), config()).unwrap();
    let (stats, _) = relay.batch(&default_target()).await.unwrap();
    assert_eq!(stats.failed_tries, 2, "{stats:?}");
    for id in ids {
        let r = row(&db, "public", id).await;
        assert_eq!((r.status.as_str(), r.retry_count), ("PENDING", 1));
        let error = r.last_error.unwrap_or_default();
        assert!(
            error.starts_with("500 Internal Server Error: \u{1}binary"),
            "{error:.60}"
        );
        assert!(error.len() <= postbox::store::MAX_ERROR_BYTES);
    }
}
