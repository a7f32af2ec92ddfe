//! The PostgreSQL harness of the store conformance suite.

#![allow(clippy::unwrap_used, reason = "a test suite fails loudly")]

use postbox::inbox::{Inbox, Received};
use postbox::{Event, Outbox, Store, event::Enqueued};

use super::{RowView, StoreHarness, row_view};
use crate::TestDb;

/// The PostgreSQL store on a [`TestDb`] of its own.
pub struct PgHarness {
    db: TestDb,
    store: postbox::PgStore,
}

impl StoreHarness for PgHarness {
    const DEAD_ROWS: bool = true;
    const SEES_TRANSACTIONS: bool = true;

    async fn new() -> Self {
        let db = TestDb::new().await;
        // The smallest work_mem makes large joins spill into batches, as they do on a busy server
        // with big claims; that is where a statement's row order gets lost.
        let options = db
            .url()
            .parse::<sqlx::postgres::PgConnectOptions>()
            .expect("test database URL")
            .options([("work_mem", "64kB")]);
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(8)
            .connect_with(options)
            .await
            .expect("connect");
        let store = postbox::PgStore::new(pool);
        PgHarness { db, store }
    }

    fn store(&self) -> &dyn Store {
        &self.store
    }

    async fn enqueue(&self, outbox: &Outbox, events: Vec<Event>) -> postbox::Result<Vec<Enqueued>> {
        let mut tx = self.db.pool().begin().await?;
        let done = outbox.enqueue_many(&mut tx, events).await?;
        tx.commit().await?;
        Ok(done)
    }

    async fn enqueue_one(&self, outbox: &Outbox, event: Event) -> postbox::Result<Enqueued> {
        let mut tx = self.db.pool().begin().await?;
        let done = outbox.enqueue(&mut tx, event).await?;
        tx.commit().await?;
        Ok(done)
    }

    async fn enqueue_each_then_commit(
        &self,
        outbox: &Outbox,
        events: Vec<Event>,
    ) -> Vec<postbox::Result<Enqueued>> {
        let mut tx = self.db.pool().begin().await.unwrap();
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
             VALUES ($1, 'Invoice', '456', $2::jsonb) RETURNING id",
        )
        .bind(event_type)
        .bind(payload)
        .fetch_one(self.db.pool())
        .await
        .expect("plain insert")
    }

    async fn exec(&self, sql: &str) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(self.db.pool())
            .await
            .expect(sql);
    }

    async fn row(&self, id: i64) -> RowView {
        let r = sqlx::query(
            "SELECT status, event_type, retry_count, max_retries, schema_version, headers::text,
                    last_error, locked_by, claim_token::text,
                    (EXTRACT(EPOCH FROM locked_until - updated_at) * 1000)::float8,
                    (EXTRACT(EPOCH FROM locked_until - now()) * 1000)::float8,
                    processed_at IS NOT NULL
             FROM outbox_events WHERE id = $1",
        )
        .bind(id)
        .fetch_one(self.db.pool())
        .await
        .expect("row");
        row_view(&r)
    }

    async fn row_count(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM outbox_events")
            .fetch_one(self.db.pool())
            .await
            .expect("count")
    }

    async fn rewind_ids(&self) -> bool {
        self.exec("ALTER TABLE outbox_events ALTER COLUMN id RESTART WITH 1")
            .await;
        true
    }

    async fn backdate(&self, table: &str, column: &str, ids: &[i64], days: u32) {
        let sql = format!(
            "UPDATE {table} SET {column} = now() - make_interval(days => $1) WHERE id = ANY($2)"
        );
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(days as i32)
            .bind(ids)
            .execute(self.db.pool())
            .await
            .expect("backdate");
    }

    async fn archived_ids(&self) -> Vec<i64> {
        sqlx::query_scalar("SELECT id FROM outbox_events_archive ORDER BY id")
            .fetch_all(self.db.pool())
            .await
            .expect("archived ids")
    }

    async fn spoil_row(&self, id: i64) -> &'static str {
        // Valid jsonb, nested deeper than serde_json reads.
        self.exec(&format!(
            "UPDATE outbox_events SET headers = ('{{\"a\": ' || repeat('[', 200) || '1' \
             || repeat(']', 200) || '}}')::jsonb WHERE id = {id}"
        ))
        .await;
        "headers"
    }

    type Open = sqlx::Transaction<'static, sqlx::Postgres>;

    async fn open_enqueue(&self, outbox: &Outbox, event: Event) -> (i64, Self::Open) {
        let mut tx = self.db.pool().begin().await.expect("begin");
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
        crate::inbox::handle_in_transaction(self.db.pool(), inbox, outbox, message_id, commit).await
    }

    async fn inbox_open(
        &self,
        inbox: &Inbox,
        outbox: &Outbox,
        message_id: &str,
    ) -> (Received, Self::Open) {
        crate::inbox::handle_in_open_transaction(self.db.pool(), inbox, outbox, message_id)
            .await
            .expect("handle")
    }

    async fn backdate_inbox(&self, message_id: &str, days: u32) {
        sqlx::query("UPDATE inbox_messages SET received_at = now() - make_interval(days => $1) WHERE message_id = $2")
            .bind(i32::try_from(days).unwrap())
            .bind(message_id)
            .execute(self.db.pool())
            .await
            .expect("backdate the inbox");
    }
}
