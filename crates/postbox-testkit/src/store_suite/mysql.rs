//! The MySQL/MariaDB harness of the store conformance suite.

#![allow(clippy::unwrap_used, reason = "a test suite fails loudly")]

use postbox::inbox::{Inbox, Received};
use postbox::{Event, Outbox, Store, event::Enqueued};

use super::{RowView, StoreHarness, row_view};
use crate::TestMySql;

/// The MySQL store on a [`TestMySql`] database of its own.
pub struct MySqlHarness {
    _db: TestMySql,
    store: postbox::MySqlStore,
}

impl StoreHarness for MySqlHarness {
    const DEAD_ROWS: bool = false;
    const SEES_TRANSACTIONS: bool = true;

    async fn new() -> Self {
        let db = TestMySql::new().await;
        let store = db.store().await;
        MySqlHarness { _db: db, store }
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
        let done = sqlx::query(
            "INSERT INTO outbox_events (event_type, aggregate_type, aggregate_id, payload)
             VALUES (?, 'Invoice', '456', ?)",
        )
        .bind(event_type)
        .bind(payload)
        .execute(self.store.pool())
        .await
        .expect("plain insert");
        i64::try_from(done.last_insert_id()).unwrap()
    }

    async fn exec(&self, sql: &str) {
        // The suite's statements are PostgreSQL's and SQLite's common SQL; MySQL spells
        // statistics gathering ANALYZE TABLE.
        let sql = match sql.strip_prefix("ANALYZE ") {
            Some(table) => format!("ANALYZE TABLE {table}"),
            None => sql.to_owned(),
        };
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.clone()))
            .execute(self.store.pool())
            .await
            .expect(&sql);
    }

    async fn row(&self, id: i64) -> RowView {
        let r = sqlx::query(
            "SELECT status, event_type, retry_count, max_retries, schema_version, headers,
                    last_error, locked_by, claim_token,
                    TIMESTAMPDIFF(MICROSECOND, updated_at, locked_until) / 1e3,
                    TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), locked_until) / 1e3,
                    processed_at IS NOT NULL
             FROM outbox_events WHERE id = ?",
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
        // InnoDB's counter never goes back below the highest id.
        false
    }

    async fn backdate(&self, table: &str, column: &str, ids: &[i64], days: u32) {
        let list = ids
            .iter()
            .map(i64::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        let sql = format!(
            "UPDATE {table} SET {column} = UTC_TIMESTAMP(6) - INTERVAL ? DAY WHERE id IN ({list})"
        );
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(days)
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
        // Valid JSON, but not an object of header names.
        self.exec(&format!(
            "UPDATE outbox_events SET headers = '[1, 2]' WHERE id = {id}"
        ))
        .await;
        "headers"
    }

    type Open = sqlx::Transaction<'static, sqlx::MySql>;

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
        sqlx::query("UPDATE inbox_messages SET received_at = UTC_TIMESTAMP(6) - INTERVAL ? DAY WHERE message_id = ?")
            .bind(days)
            .bind(message_id)
            .execute(self.store.pool())
            .await
            .expect("backdate the inbox");
    }
}
