//! The SQLite harness of the store conformance suite.

#![allow(clippy::unwrap_used, reason = "a test suite fails loudly")]

use postbox::inbox::{Inbox, Received};
use postbox::{Event, Outbox, Store, event::Enqueued};

use super::{RowView, StoreHarness, row_view};
use crate::TestSqlite;

/// The SQLite store on a [`TestSqlite`] file of its own.
pub struct SqliteHarness {
    _file: TestSqlite,
    store: postbox::SqliteStore,
}

impl StoreHarness for SqliteHarness {
    const DEAD_ROWS: bool = false;
    const SEES_TRANSACTIONS: bool = false;

    async fn new() -> Self {
        let file = TestSqlite::new();
        let store = file.store().await;
        SqliteHarness { _file: file, store }
    }

    fn store(&self) -> &dyn Store {
        &self.store
    }

    async fn enqueue(&self, outbox: &Outbox, events: Vec<Event>) -> postbox::Result<Vec<Enqueued>> {
        let mut tx = self.store.pool().begin().await?;
        let done = outbox.enqueue_many(&mut tx, events).await?;
        tx.commit().await?;
        Ok(done)
    }

    async fn enqueue_one(&self, outbox: &Outbox, event: Event) -> postbox::Result<Enqueued> {
        let mut tx = self.store.pool().begin().await?;
        let done = outbox.enqueue(&mut tx, event).await?;
        tx.commit().await?;
        Ok(done)
    }

    async fn enqueue_each_then_commit(
        &self,
        outbox: &Outbox,
        events: Vec<Event>,
    ) -> Vec<postbox::Result<Enqueued>> {
        let mut tx = self.store.pool().begin().await.unwrap();
        let mut results = Vec::new();
        for event in events {
            results.push(outbox.enqueue(&mut tx, event).await);
        }
        tx.commit()
            .await
            .expect("the caller's transaction still commits");
        results
    }

    async fn insert_plain(&self, event_type: &str, payload: &str) -> i64 {
        sqlx::query_scalar(
            "INSERT INTO outbox_events (event_type, aggregate_type, aggregate_id, payload)
             VALUES (?1, 'Invoice', '456', ?2) RETURNING id",
        )
        .bind(event_type)
        .bind(payload)
        .fetch_one(self.store.pool())
        .await
        .expect("plain insert")
    }

    async fn exec(&self, sql: &str) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(self.store.pool())
            .await
            .expect(sql);
    }

    async fn row(&self, id: i64) -> RowView {
        let r = sqlx::query(
            "SELECT status, event_type, retry_count, max_retries, schema_version, headers,
                    last_error, locked_by, claim_token,
                    (julianday(locked_until) - julianday(updated_at)) * 86400000.0,
                    (julianday(locked_until) - julianday('now')) * 86400000.0,
                    processed_at IS NOT NULL
             FROM outbox_events WHERE id = ?1",
        )
        .bind(id)
        .fetch_one(self.store.pool())
        .await
        .expect("row");
        row_view(&r)
    }

    async fn row_count(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM outbox_events")
            .fetch_one(self.store.pool())
            .await
            .expect("count")
    }

    async fn rewind_ids(&self) -> bool {
        false
    }

    async fn backdate(&self, table: &str, column: &str, ids: &[i64], days: u32) {
        let sql = format!(
            "UPDATE {table} SET {column} = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-' || ?1 || ' days')
             WHERE id IN (SELECT value FROM json_each(?2))"
        );
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(days)
            .bind(serde_json::to_string(ids).unwrap())
            .execute(self.store.pool())
            .await
            .expect("backdate");
    }

    async fn archived_ids(&self) -> Vec<i64> {
        sqlx::query_scalar("SELECT id FROM outbox_events_archive ORDER BY id")
            .fetch_all(self.store.pool())
            .await
            .expect("archived ids")
    }

    async fn spoil_row(&self, id: i64) -> &'static str {
        // Text that is not UTF-8.
        self.exec(&format!(
            "UPDATE outbox_events SET aggregate_id = CAST(x'c3ff' AS TEXT) WHERE id = {id}"
        ))
        .await;
        "aggregate_id"
    }

    type Open = sqlx::Transaction<'static, sqlx::Sqlite>;

    async fn open_enqueue(&self, outbox: &Outbox, event: Event) -> (i64, Self::Open) {
        let mut tx = self.store.pool().begin().await.expect("begin");
        let id = outbox
            .enqueue(&mut tx, event)
            .await
            .expect("enqueue")
            .id()
            .expect("inserted");
        (id, tx)
    }

    async fn commit_open(&self, open: Self::Open) {
        open.commit().await.expect("commit");
    }

    async fn rollback_open(&self, open: Self::Open) {
        open.rollback().await.expect("rollback");
    }

    async fn inbox_handle(
        &self,
        inbox: &Inbox,
        outbox: &Outbox,
        message_id: &str,
        commit: bool,
    ) -> postbox::Result<Received> {
        crate::inbox::handle_in_transaction(self.store.pool(), inbox, outbox, message_id, commit)
            .await
    }

    async fn inbox_open(
        &self,
        inbox: &Inbox,
        outbox: &Outbox,
        message_id: &str,
    ) -> (Received, Self::Open) {
        crate::inbox::handle_in_open_transaction(self.store.pool(), inbox, outbox, message_id)
            .await
            .expect("handle")
    }

    async fn backdate_inbox(&self, message_id: &str, days: u32) {
        sqlx::query("UPDATE inbox_messages SET received_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-' || ?1 || ' days') WHERE message_id = ?2")
            .bind(days)
            .bind(message_id)
            .execute(self.store.pool())
            .await
            .expect("backdate the inbox");
    }
}
