//! The store conformance suite: every behaviour the relay relies on, written once and run
//! against every [`Store`] — PostgreSQL, SQLite and MySQL/MariaDB here, and any
//! store of a user's own — each case on a fresh database.
//!
//! A store passes when every case passes for its [`StoreHarness`]: a fresh database, the store
//! on it, plain SQL access to its `outbox_events` table, and a transaction it can hold open.
//! Each case is a public function of this module, and [`CASES`] names them all, from the one
//! list that [`store_conformance!`] expands: one line per store runs every case as a
//! `#[tokio::test]` of its own, named `<store>::<case>`, and a case added to the suite runs for
//! every store without another line:
//!
//! ```ignore
//! postbox_testkit::store_conformance!(my_store, MyHarness);
//! ```
//!
//! Where stores legitimately differ (SQLite settles the whole commit horizon at once, MySQL
//! reads an id only once it is a moment old, only PostgreSQL serves tenants), a case states the
//! contract every store meets and waits for it with a deadline, never for a fixed time.
//!
//! [`store_conformance!`]: crate::store_conformance

#![allow(
    clippy::unwrap_used,
    clippy::missing_panics_doc,
    reason = "a test suite fails loudly on the first unexpected error"
)]

use std::time::Duration;

use postbox::inbox::{Inbox, Received};
use postbox::store::{
    ClaimParams, Claimed, FailedTry, MarkFailedParams, MarkProcessedParams, RenewParams,
};
use postbox::{Error, Event, Outbox, Store, Target, backoff::Backoff, event::Enqueued};
use sqlx::Row;
use uuid::Uuid;

use crate::wait_until;
use postbox::StoreExt;

mod horizon;
mod inbox;
#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
mod sink_health;
#[cfg(feature = "sqlite")]
mod sqlite;
mod tenants;
mod upkeep;

pub use horizon::{
    an_id_rolled_back_does_not_hold_the_commit_horizon_back,
    the_commit_horizon_settles_committed_ids_and_never_one_still_open,
    the_head_of_the_outbox_moves_with_every_id_handed_out,
};
pub use inbox::{
    a_concurrent_delivery_waits_for_the_first_and_never_runs_twice,
    an_inbox_handles_each_message_once_per_consumer,
    inbox_records_past_the_dedup_window_are_purged,
};
pub use sink_health::sink_reports_keep_each_relays_latest;
pub use tenants::tenants_are_served_or_plainly_unsupported;
pub use upkeep::{
    marks_leave_dead_rows_that_a_vacuum_removes,
    the_oldest_open_transaction_is_seen_where_the_database_tells,
    wakeups_come_with_commits_or_the_store_has_none,
};

#[cfg(feature = "mysql")]
pub use mysql::MySqlHarness;
#[cfg(feature = "postgres")]
pub use postgres::PgHarness;
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteHarness;

/// One row of `outbox_events` as the tests inspect it; times are differences computed by the
/// database, on its clock.
#[derive(Debug)]
#[non_exhaustive]
pub struct RowView {
    /// `status`.
    pub status: String,
    /// `event_type`.
    pub event_type: String,
    /// `retry_count`.
    pub retry_count: i32,
    /// `max_retries`.
    pub max_retries: i32,
    /// `schema_version`.
    pub schema_version: i32,
    /// `headers` (null when they cannot be read).
    pub headers: serde_json::Value,
    /// `last_error`.
    pub last_error: Option<String>,
    /// `locked_by`.
    pub locked_by: Option<String>,
    /// `claim_token`, as text.
    pub claim_token: Option<String>,
    /// `locked_until - updated_at` in ms: the backoff or lease granted by the last write.
    pub granted_ms: Option<f64>,
    /// `locked_until - now()` in ms.
    pub left_ms: Option<f64>,
    /// Whether `processed_at` is set.
    pub processed: bool,
}

/// What a back-end must offer the suite besides its [`Store`]: plain SQL access to its table.
#[allow(
    async_fn_in_trait,
    reason = "the suite awaits the harness on the test's own task"
)]
pub trait StoreHarness: Sized {
    /// A fresh, empty, unmigrated database.
    async fn new() -> Self;
    /// The store under test.
    fn store(&self) -> &dyn Store;
    /// Writes `events` with `outbox` in one transaction, committed if the enqueue succeeded.
    async fn enqueue(&self, outbox: &Outbox, events: Vec<Event>) -> postbox::Result<Vec<Enqueued>>;
    /// Writes one event with `outbox` in its own committed transaction.
    async fn enqueue_one(&self, outbox: &Outbox, event: Event) -> postbox::Result<Enqueued>;
    /// Enqueues `events` one by one in a single transaction, whatever each result, then commits.
    async fn enqueue_each_then_commit(
        &self,
        outbox: &Outbox,
        events: Vec<Event>,
    ) -> Vec<postbox::Result<Enqueued>>;
    /// Inserts an event by plain SQL, naming only the four columns a non-Rust producer must give.
    async fn insert_plain(&self, event_type: &str, payload: &str) -> i64;
    /// Runs a statement valid on every back-end.
    async fn exec(&self, sql: &str);
    /// Event `id`'s row.
    async fn row(&self, id: i64) -> RowView;
    /// How many rows `outbox_events` holds.
    async fn row_count(&self) -> i64;
    /// Sets the table's id sequence back to its start, as a restore or a replication cut-over
    /// can leave it, so that the next ids handed out are taken; `false` where ids cannot be
    /// handed out twice (SQLite's AUTOINCREMENT always goes past the highest id).
    async fn rewind_ids(&self) -> bool;
    /// Writes into event `id`'s row what a careless plain-SQL producer can write and the store
    /// cannot read back; returns the column.
    async fn spoil_row(&self, id: i64) -> &'static str;
    /// Sets `column` (`created_at`, `updated_at`, `archived_at`) of rows `ids` of `table`
    /// (`outbox_events` or `outbox_events_archive`) to `days` days ago.
    async fn backdate(&self, table: &str, column: &str, ids: &[i64], days: u32);
    /// The ids in `outbox_events_archive`, in order.
    async fn archived_ids(&self) -> Vec<i64>;
    /// Whether marks leave dead row versions in the store's table that it counts
    /// ([`StoreOps::outbox_dead_rows`](postbox::ops::StoreOps::outbox_dead_rows)) and a vacuum removes (PostgreSQL).
    const DEAD_ROWS: bool;
    /// Whether the store can tell the age of the database's oldest open transaction
    /// ([`StoreOps::oldest_transaction_age`](postbox::ops::StoreOps::oldest_transaction_age): PostgreSQL, MySQL).
    const SEES_TRANSACTIONS: bool;
    /// A transaction of the store's database left open by [`StoreHarness::open_enqueue`].
    type Open;
    /// Writes `event` with `outbox` in a transaction left open: its id is handed out, its row
    /// not committed until [`StoreHarness::commit_open`] (or never, after
    /// [`StoreHarness::rollback_open`]).
    async fn open_enqueue(&self, outbox: &Outbox, event: Event) -> (i64, Self::Open);
    /// Commits a transaction of [`StoreHarness::open_enqueue`].
    async fn commit_open(&self, open: Self::Open);
    /// Rolls back a transaction of [`StoreHarness::open_enqueue`].
    async fn rollback_open(&self, open: Self::Open);
    /// Handles message `message_id` as a consumer does, in one transaction of its own:
    /// [`handle_message`](crate::handle_message), then a commit, or a rollback without `commit`.
    async fn inbox_handle(
        &self,
        inbox: &Inbox,
        outbox: &Outbox,
        message_id: &str,
        commit: bool,
    ) -> postbox::Result<Received>;
    /// The same, with the transaction left open (for [`StoreHarness::commit_open`] or
    /// [`StoreHarness::rollback_open`]).
    async fn inbox_open(
        &self,
        inbox: &Inbox,
        outbox: &Outbox,
        message_id: &str,
    ) -> (Received, Self::Open);
    /// Sets `received_at` of the inbox records of `message_id` to `days` days ago.
    async fn backdate_inbox(&self, message_id: &str, days: u32);
}

pub(crate) fn row_view<R: Row>(r: &R) -> RowView
where
    usize: sqlx::ColumnIndex<R>,
    for<'a> String: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
    for<'a> Option<String>: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
    for<'a> i32: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
    for<'a> Option<f64>: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
    for<'a> bool: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
{
    let headers: String = r.get(5);
    RowView {
        status: r.get(0),
        event_type: r.get(1),
        retry_count: r.get(2),
        max_retries: r.get(3),
        schema_version: r.get(4),
        // Null for headers serde cannot read (a spoiled row).
        headers: serde_json::from_str(&headers).unwrap_or_default(),
        last_error: r.get(6),
        locked_by: r.get(7),
        claim_token: r.get(8),
        granted_ms: r.get(9),
        left_ms: r.get(10),
        processed: r.get(11),
    }
}

// ---- helpers -------------------------------------------------------------------------------

async fn ready<B: StoreHarness>() -> B {
    let b = B::new().await;
    let applied = postbox::migrate(b.store()).await.expect("migrate");
    assert!(!applied.is_empty(), "a fresh database gets migrations");
    b
}

fn target<B: StoreHarness>(b: &B) -> Target {
    Target::default_schema(b.store().default_schema())
}

async fn claim<B: StoreHarness>(b: &B, relay: &str, batch_size: u32, lease: Duration) -> Claimed {
    claim_from(b, relay, batch_size, lease, 0).await
}

async fn claim_from<B: StoreHarness>(
    b: &B,
    relay: &str,
    batch_size: u32,
    lease: Duration,
    floor: i64,
) -> Claimed {
    b.store()
        .events_claim(&ClaimParams {
            target: &target(b),
            batch_size,
            lease,
            relay_id: relay,
            floor,
            order: Default::default(),
        })
        .await
        .expect("claim")
}

/// The commit horizon once it has passed `id` (no transaction writes to the table here).
async fn settled_past<B: StoreHarness>(b: &B, id: i64) -> i64 {
    let probe = tokio::sync::Mutex::new(None);
    crate::wait_until(
        &format!("the commit horizon passes {id}"),
        Duration::from_secs(5),
        || async {
            let mut probe = probe.lock().await;
            let horizon = b
                .store()
                .commit_horizon(&target(b), probe.as_ref())
                .await
                .expect("commit horizon");
            *probe = horizon.probe;
            horizon.settled.filter(|settled| *settled >= id)
        },
    )
    .await
}

async fn mark_processed<B: StoreHarness>(b: &B, token: Uuid, ids: &[i64]) -> u64 {
    b.store()
        .events_mark_processed(&MarkProcessedParams {
            target: &target(b),
            claim_token: token,
            ids,
        })
        .await
        .expect("mark processed")
}

const POLICY: Backoff = Backoff {
    base: Duration::from_millis(100),
    cap: Duration::from_millis(1000),
};

async fn mark_failed<B: StoreHarness>(
    b: &B,
    token: Uuid,
    tries: &[FailedTry],
) -> Vec<postbox::store::FailedMark> {
    b.store()
        .events_mark_failed(&MarkFailedParams {
            target: &target(b),
            claim_token: token,
            tries,
            retry: POLICY,
        })
        .await
        .expect("mark failed")
}

fn failed(id: i64, error: &str, permanent: bool) -> FailedTry {
    FailedTry {
        id,
        error: error.to_owned(),
        permanent,
        max_retries: None,
    }
}

async fn renew<B: StoreHarness>(b: &B, token: Uuid, ids: &[i64], lease: Duration) -> u64 {
    b.store()
        .leases_renew(&RenewParams {
            target: &target(b),
            claim_token: token,
            ids,
            lease,
        })
        .await
        .expect("renew")
}

/// `n` unkeyed events `E0`, `E1`, …
fn events(n: usize) -> Vec<Event> {
    (0..n)
        .map(|i| {
            Event::new(format!("E{i}"), &serde_json::json!({ "i": i }))
                .expect("event")
                .without_idempotency_key()
        })
        .collect()
}

async fn enqueue_n<B: StoreHarness>(b: &B, n: usize) -> Vec<i64> {
    b.enqueue(&b.store().outbox(), events(n))
        .await
        .expect("enqueue")
        .into_iter()
        .map(|e| e.id().expect("inserted"))
        .collect()
}

async fn enqueue_with_max_retries<B: StoreHarness>(b: &B, max_retries: i32) -> i64 {
    let event = Event::new("Flaky", &1)
        .expect("event")
        .without_idempotency_key()
        .max_retries(max_retries);
    b.enqueue_one(&b.store().outbox(), event)
        .await
        .expect("enqueue")
        .id()
        .expect("inserted")
}

/// Waits, on the database clock, until the lease of `id` has run out.
async fn lease_expired<B: StoreHarness>(b: &B, id: i64) {
    wait_until("the lease has expired", Duration::from_secs(5), || async {
        b.row(id).await.left_ms.is_some_and(|ms| ms < 0.0)
    })
    .await;
}

fn assert_ms(actual: Option<f64>, expected: f64, what: &str) {
    let actual = actual.unwrap_or_else(|| panic!("{what}: locked_until is NULL"));
    assert!(
        (actual - expected).abs() < 2.0,
        "{what}: granted {actual} ms, expected {expected} ms"
    );
}

// ---- cases ---------------------------------------------------------------------------------

/// A conformance case; see the module docs.
pub async fn migrate_is_idempotent<B: StoreHarness>() {
    let b = B::new().await;
    let err = b.store().status_counts(&target(&b)).await.unwrap_err();
    assert!(matches!(err, Error::NotMigrated { .. }), "{err:?}");

    // Several relays starting at once all migrate.
    let (x, y, z) = tokio::join!(
        postbox::migrate(b.store()),
        postbox::migrate(b.store()),
        postbox::migrate(b.store())
    );
    let applied: Vec<Vec<String>> = vec![x.unwrap(), y.unwrap(), z.unwrap()];
    assert_eq!(
        applied.iter().filter(|a| !a.is_empty()).count(),
        1,
        "exactly one migration run applies the migrations: {applied:?}"
    );
    let id = enqueue_n(&b, 1).await[0];
    assert_eq!(
        postbox::migrate(b.store()).await.unwrap(),
        Vec::<String>::new()
    );
    assert_eq!(
        b.row(id).await.status,
        "PENDING",
        "migrating again keeps the data"
    );
    assert_eq!(b.row_count().await, 1);
}

/// A conformance case; see the module docs.
pub async fn plain_sql_insert_is_a_valid_pending_event<B: StoreHarness>() {
    let b = ready::<B>().await;
    let id = b
        .insert_plain("InvoiceCreated", r#"{"invoice_id": 456}"#)
        .await;
    let row = b.row(id).await;
    assert_eq!(row.status, "PENDING");
    assert_eq!(row.retry_count, 0);
    assert_eq!(row.max_retries, 5);
    assert_eq!(row.schema_version, 1);
    assert_eq!(row.headers, serde_json::json!({}));
    assert_eq!(row.claim_token, None);

    let claimed = claim(&b, "r1", 10, Duration::from_secs(30)).await;
    assert_eq!(claimed.events.len(), 1);
    let e = &claimed.events[0];
    assert_eq!(e.id, id);
    assert_eq!(e.tenant, None);
    assert_eq!(e.event_type, "InvoiceCreated");
    assert_eq!(e.aggregate_type.as_deref(), Some("Invoice"));
    assert_eq!(e.aggregate_id.as_deref(), Some("456"));
    assert_eq!(e.idempotency_key, None);
    assert_eq!(e.dedup_id(), id.to_string());
    assert!(e.headers.is_empty());
    assert_eq!((e.retry_count, e.max_retries, e.schema_version), (0, 5, 1));
    assert_eq!(e.claim_token, claimed.claim_token);
    let payload: serde_json::Value = e.payload_as().unwrap();
    assert_eq!(payload, serde_json::json!({"invoice_id": 456}));
    let age = chrono::Utc::now() - e.created_at;
    assert!(
        age.num_seconds().abs() < 60,
        "created_at is UTC now: {}",
        e.created_at
    );
}

/// A conformance case; see the module docs.
pub async fn enqueued_event_keeps_its_fields<B: StoreHarness>() {
    let b = ready::<B>().await;
    let event = Event::new(
        "InvoiceCreated",
        &serde_json::json!({"invoice_id": 456, "n": [1, 2]}),
    )
    .unwrap()
    .aggregate("Invoice", "456")
    .event_class("billing::InvoiceCreated")
    .schema_version(3)
    .header("traceparent", "00-abc-01")
    .max_retries(7);
    let id = b
        .enqueue_one(&b.store().outbox(), event)
        .await
        .unwrap()
        .id()
        .unwrap();
    let claimed = claim(&b, "r1", 10, Duration::from_secs(30)).await;
    let e = &claimed.events[0];
    assert_eq!(e.id, id);
    let today = chrono::Utc::now().date_naive();
    assert_eq!(
        e.idempotency_key.as_deref(),
        Some(
            postbox::event::daily_idempotency_key("Invoice", "456", "InvoiceCreated", today)
                .as_str()
        )
    );
    assert_eq!(e.event_class.as_deref(), Some("billing::InvoiceCreated"));
    assert_eq!((e.schema_version, e.max_retries), (3, 7));
    assert_eq!(
        e.headers.get("traceparent").map(String::as_str),
        Some("00-abc-01")
    );
    let payload: serde_json::Value = e.payload_as().unwrap();
    assert_eq!(payload, serde_json::json!({"invoice_id": 456, "n": [1, 2]}));
}

/// A conformance case; see the module docs.
pub async fn claim_takes_due_events_in_id_order_up_to_batch_size<B: StoreHarness>() {
    let b = ready::<B>().await;
    let ids = enqueue_n(&b, 3000).await;
    // Rewrite every third row so the physical order of rows is no longer the id order, and give
    // the planner statistics, so that a claim of thousands is planned as it is in production.
    b.exec(r#"UPDATE outbox_events SET headers = '{"touched": "yes"}' WHERE id % 3 = 0"#)
        .await;
    b.exec("ANALYZE outbox_events").await;

    let first = claim(&b, "relay-1", 2000, Duration::from_secs(30)).await;
    let got: Vec<i64> = first.events.iter().map(|e| e.id).collect();
    assert!(got == ids[..2000], "the first 2000 due events, in id order");
    assert_eq!(first.recovered, 0);
    for id in ids[..2000].iter().step_by(97) {
        let row = b.row(*id).await;
        assert_eq!(row.status, "PROCESSING");
        assert_eq!(row.locked_by.as_deref(), Some("relay-1"));
        assert_eq!(row.claim_token, Some(first.claim_token.to_string()));
        assert_ms(row.granted_ms, 30_000.0, "lease");
    }
    assert_eq!(b.row(ids[2000]).await.status, "PENDING");

    let rest = claim(&b, "relay-2", 100, Duration::from_secs(30)).await;
    let got: Vec<i64> = rest.events.iter().map(|e| e.id).collect();
    assert!(got == ids[2000..2100], "the next 100, in id order");
    let rest = claim(&b, "relay-2", 10_000, Duration::from_secs(30)).await;
    let got: Vec<i64> = rest.events.iter().map(|e| e.id).collect();
    assert!(got == ids[2100..], "the remaining 900, in id order");
    assert_ne!(
        rest.claim_token, first.claim_token,
        "every claim has a fresh token"
    );
    assert!(
        claim(&b, "relay-3", 1000, Duration::from_secs(30))
            .await
            .events
            .is_empty()
    );
}

/// A conformance case; see the module docs.
pub async fn claimed_events_are_not_claimed_again_before_the_lease_expires<B: StoreHarness>() {
    let b = ready::<B>().await;
    let ids = enqueue_n(&b, 3).await;
    let first = claim(&b, "r1", 10, Duration::from_secs(30)).await;
    assert_eq!(first.events.len(), 3);
    let again = claim(&b, "r2", 10, Duration::from_secs(30)).await;
    assert!(again.events.is_empty(), "{:?}", again.events);
    assert_eq!(again.recovered, 0);
    for id in ids {
        let row = b.row(id).await;
        assert_eq!(row.locked_by.as_deref(), Some("r1"));
        assert_eq!(row.claim_token, Some(first.claim_token.to_string()));
        assert_eq!(row.retry_count, 0);
    }
}

/// A conformance case; see the module docs.
pub async fn an_expired_lease_is_reclaimed_and_counted_as_recovered<B: StoreHarness>() {
    let b = ready::<B>().await;
    let ids = enqueue_n(&b, 2).await;
    let first = claim(&b, "crashed-relay", 10, Duration::from_millis(50)).await;
    assert_eq!(first.events.len(), 2);
    lease_expired(&b, ids[1]).await;

    let second = claim(&b, "r2", 10, Duration::from_secs(30)).await;
    assert_eq!(second.events.iter().map(|e| e.id).collect::<Vec<_>>(), ids);
    assert_eq!(second.recovered, 2);
    assert!(second.exhausted.is_empty());
    for e in &second.events {
        assert_eq!(e.retry_count, 1, "a lost lease counts as a failed try");
    }
    for id in ids {
        let row = b.row(id).await;
        assert_eq!(row.status, "PROCESSING");
        assert_eq!(row.retry_count, 1);
        assert_eq!(row.locked_by.as_deref(), Some("r2"));
        assert_eq!(row.claim_token, Some(second.claim_token.to_string()));
        let error = row.last_error.expect("last_error");
        assert!(
            error.contains("lease") && error.contains("crashed-relay"),
            "{error}"
        );
    }
}

/// A conformance case; see the module docs.
pub async fn a_stale_event_on_its_last_try_goes_failed<B: StoreHarness>() {
    let b = ready::<B>().await;
    let last_try = enqueue_with_max_retries(&b, 1).await;
    let has_more = enqueue_with_max_retries(&b, 2).await;
    claim(&b, "crashed-relay", 10, Duration::from_millis(50)).await;
    lease_expired(&b, has_more).await;

    let second = claim(&b, "r2", 10, Duration::from_secs(30)).await;
    assert_eq!(
        second.events.iter().map(|e| e.id).collect::<Vec<_>>(),
        [has_more]
    );
    assert_eq!(second.recovered, 1);
    assert_eq!(second.exhausted.len(), 1);
    let gone = &second.exhausted[0];
    assert_eq!((gone.id, gone.retry_count), (last_try, 1));
    assert_eq!(gone.event_type, "Flaky");
    assert!(gone.last_error.contains("lease"), "{}", gone.last_error);

    let row = b.row(last_try).await;
    assert_eq!(row.status, "FAILED");
    assert_eq!(row.retry_count, 1);
    assert_eq!(row.left_ms, None, "a FAILED event holds no lease");
    assert!(row.last_error.unwrap().contains("lease"));
    assert!(
        claim(&b, "r3", 10, Duration::from_secs(30))
            .await
            .events
            .is_empty()
    );
}

/// A conformance case; see the module docs.
pub async fn late_writes_of_a_fenced_claim_change_nothing<B: StoreHarness>() {
    let b = ready::<B>().await;
    let ids = enqueue_n(&b, 2).await;
    let a = claim(&b, "relay-a", 10, Duration::from_millis(50)).await;
    lease_expired(&b, ids[1]).await;
    let bb = claim(&b, "relay-b", 10, Duration::from_secs(30)).await;
    assert_eq!(bb.events.len(), 2);

    // Relay A wakes up and reports: none of it may land.
    assert_eq!(mark_processed(&b, a.claim_token, &ids).await, 0);
    let marks = mark_failed(&b, a.claim_token, &[failed(ids[0], "late", false)]).await;
    assert!(marks.is_empty(), "{marks:?}");
    let marks = mark_failed(&b, a.claim_token, &[failed(ids[1], "late", true)]).await;
    assert!(marks.is_empty(), "{marks:?}");
    assert_eq!(
        renew(&b, a.claim_token, &ids, Duration::from_secs(60)).await,
        0
    );
    assert_eq!(
        mark_processed(&b, Uuid::new_v4(), &ids).await,
        0,
        "a made-up token"
    );

    for id in &ids {
        let row = b.row(*id).await;
        assert_eq!(row.status, "PROCESSING");
        assert_eq!(row.claim_token, Some(bb.claim_token.to_string()));
        assert_eq!(row.locked_by.as_deref(), Some("relay-b"));
        assert_eq!(row.retry_count, 1, "only the take-over counted");
        assert!(!row.processed);
        assert_ms(row.granted_ms, 30_000.0, "relay B's lease is untouched");
    }
    assert_eq!(mark_processed(&b, bb.claim_token, &ids).await, 2);
    assert_eq!(
        mark_processed(&b, bb.claim_token, &ids).await,
        0,
        "marking twice is a no-op"
    );
}

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
    lease_expired(&b, ids[0]).await;
    let again = claim(&b, "r2", 10, Duration::from_secs(30)).await;
    let again: Vec<i64> = again.events.iter().map(|e| e.id).collect();
    assert_eq!(again, ids[..2]);
}

/// A conformance case; see the module docs.
///
/// A claim from a floor (see [`Store::claim_floor`]) takes new work at or above it, and below it
/// every event that went wrong once: a failed try once its backoff is over, an event put back
/// while its destination was down, an operator's retry, and a lease taken over from a relay that
/// claimed such an event and stopped. Stores that do not claim from a floor pass it as well.
pub async fn claims_from_a_floor_still_take_what_went_wrong_below_it<B: StoreHarness>() {
    let b = ready::<B>().await;
    let ids = enqueue_n(&b, 6).await;
    let (backing_off, released, retried) = (ids[0], ids[1], ids[2]);
    let c = claim(&b, "r1", 10, Duration::from_secs(30)).await;
    assert_eq!(c.events.len(), 6);
    // A backoff long enough to outlast the claims below, whatever the store's horizon takes.
    b.store()
        .events_mark_failed(&MarkFailedParams {
            target: &target(&b),
            claim_token: c.claim_token,
            tries: &[failed(backing_off, "timeout", false)],
            retry: Backoff {
                base: Duration::from_millis(1500),
                cap: Duration::from_millis(1500),
            },
        })
        .await
        .unwrap();
    mark_failed(&b, c.claim_token, &[failed(retried, "bad payload", true)]).await;
    b.store()
        .events_release(&postbox::store::ReleaseParams {
            target: &target(&b),
            claim_token: c.claim_token,
            releases: &[postbox::store::Release {
                id: released,
                error: "unavailable: broker down".to_owned(),
                delay: Duration::ZERO,
            }],
        })
        .await
        .unwrap();
    assert_eq!(mark_processed(&b, c.claim_token, &ids[3..]).await, 3);
    let operator = b
        .store()
        .events_retry_failed(&postbox::store::RetryFailedParams {
            target: &target(&b),
            ids: Some(&[retried]),
        })
        .await
        .unwrap();
    assert_eq!(operator, 1);
    let fresh = enqueue_n(&b, 2).await;
    let settled = settled_past(&b, fresh[1]).await;
    let floor = b
        .store()
        .claim_floor(&target(&b), 0, settled)
        .await
        .expect("floor");
    if b.store().capabilities().claims_from_floor {
        assert_eq!(
            floor, fresh[0],
            "the floor passes what is done and what went wrong, and stops at new work"
        );
    } else {
        assert_eq!(floor, 0, "a store without floors answers 0");
    }
    // The released event and the operator's retry are due now, the new ones above the floor
    // too; the failed try waits for its backoff.
    let c = claim_from(&b, "r2", 10, Duration::from_millis(200), floor).await;
    let mut got: Vec<i64> = c.events.iter().map(|e| e.id).collect();
    got.sort_unstable();
    assert_eq!(got, [released, retried, fresh[0], fresh[1]]);
    assert_eq!(
        mark_processed(&b, c.claim_token, &[retried, fresh[0], fresh[1]]).await,
        3
    );
    // r2 stops before it publishes the released event: its lease runs out below the floor.
    lease_expired(&b, released).await;
    lease_expired(&b, backing_off).await;
    let c = claim_from(&b, "r3", 10, Duration::from_secs(30), floor).await;
    let got: Vec<i64> = c.events.iter().map(|e| e.id).collect();
    assert_eq!(got, [backing_off, released]);
    assert_eq!(c.recovered, 1, "the lease r2 lost is counted");
    assert_eq!(mark_processed(&b, c.claim_token, &got).await, 2);
    assert!(
        claim_from(&b, "r4", 10, Duration::from_secs(30), floor)
            .await
            .events
            .is_empty()
    );
}

/// A conformance case; see the module docs.
///
/// [`Store::claim_gaps`] reads the next ids present (any status) and the rows now in the ranges
/// of ids a relay passed: whether each is still to do, and claimable. Stores that do not claim
/// from a floor answer nothing.
pub async fn gaps_name_the_ids_present_and_what_became_of_the_ids_passed<B: StoreHarness>() {
    let b = ready::<B>().await;
    let ids = enqueue_n(&b, 3).await;
    let (waiting, claimed, done) = (ids[0], ids[1], ids[2]);
    // A lease that outlasts the first look below, and runs out soon after.
    let c = claim_from(&b, "r1", 10, Duration::from_millis(1500), 0).await;
    assert_eq!(c.events.len(), 3);
    b.store()
        .events_release(&postbox::store::ReleaseParams {
            target: &target(&b),
            claim_token: c.claim_token,
            releases: &[postbox::store::Release {
                id: waiting,
                error: "unavailable: broker down".to_owned(),
                delay: Duration::ZERO,
            }],
        })
        .await
        .unwrap();
    assert_eq!(mark_processed(&b, c.claim_token, &[done]).await, 1);
    let never = done + 1_000;
    let gaps = b
        .store()
        .claim_gaps(&postbox::store::GapParams {
            target: &target(&b),
            passed: &[waiting..=claimed, done..=never],
            after: waiting - 1,
            limit: 10,
        })
        .await
        .expect("gaps");
    if !b.store().capabilities().claims_from_floor {
        assert_eq!(
            gaps,
            postbox::store::Gaps::default(),
            "no floor, nothing passed"
        );
        return;
    }
    assert_eq!(gaps.present, ids, "every id present, whatever its status");
    let mut found = gaps.found.clone();
    found.sort_unstable_by_key(|f| f.id);
    let flags: Vec<(i64, bool, bool)> = found
        .iter()
        .map(|f| (f.id, f.unfinished, f.claimable))
        .collect();
    assert_eq!(
        flags,
        [
            // Put back with last_error set: the retry path finds it, not the passed ids.
            (waiting, false, false),
            // In flight under r1's lease.
            (claimed, true, false),
            (done, false, false),
        ],
        "the rows in the ranges, no more"
    );
    // r1 stops: its lease runs out, and the event is claimable again.
    lease_expired(&b, claimed).await;
    let gaps = b
        .store()
        .claim_gaps(&postbox::store::GapParams {
            target: &target(&b),
            passed: &[claimed..=claimed],
            after: done,
            limit: 0,
        })
        .await
        .expect("gaps");
    let flags: Vec<(i64, bool, bool)> = gaps
        .found
        .iter()
        .map(|f| (f.id, f.unfinished, f.claimable))
        .collect();
    assert_eq!(flags, [(claimed, true, true)]);
    let none = b
        .store()
        .claim_gaps(&postbox::store::GapParams {
            target: &target(&b),
            passed: &[],
            after: waiting - 1,
            limit: 0,
        })
        .await
        .expect("gaps");
    assert_eq!(none, postbox::store::Gaps::default(), "limit 0 reads no id");
    let next = b
        .store()
        .claim_gaps(&postbox::store::GapParams {
            target: &target(&b),
            passed: &[],
            after: waiting,
            limit: 1,
        })
        .await
        .expect("gaps");
    assert_eq!(next.present, [claimed], "the next id present, one");
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
pub async fn renew_extends_the_lease_of_the_token_holder_only<B: StoreHarness>() {
    let b = ready::<B>().await;
    let ids = enqueue_n(&b, 3).await;
    let c = claim(&b, "r1", 10, Duration::from_millis(500)).await;
    assert_eq!(
        renew(&b, c.claim_token, &ids[..2], Duration::from_secs(60)).await,
        2
    );
    for id in &ids[..2] {
        let row = b.row(*id).await;
        assert_ms(row.granted_ms, 60_000.0, "renewed lease");
        assert!(row.left_ms.unwrap() > 59_000.0);
    }
    assert!(
        b.row(ids[2]).await.left_ms.unwrap() < 1_000.0,
        "not asked, not renewed"
    );
    assert_eq!(
        renew(&b, Uuid::new_v4(), &ids, Duration::from_secs(60)).await,
        0
    );
    assert!(b.row(ids[2]).await.left_ms.unwrap() < 1_000.0);
    assert_eq!(mark_processed(&b, c.claim_token, &ids[..1]).await, 1);
    assert_eq!(
        renew(&b, c.claim_token, &ids, Duration::from_secs(60)).await,
        2,
        "a processed event is not renewed"
    );
    assert_eq!(b.row(ids[0]).await.left_ms, None);
}

/// A conformance case; see the module docs.
pub async fn status_counts_and_backlog_are_right<B: StoreHarness>() {
    let b = ready::<B>().await;
    let t = target(&b);
    let counts = b.store().status_counts(&t).await.unwrap();
    assert_eq!(
        (
            counts.pending,
            counts.processing,
            counts.processed,
            counts.failed,
            counts.oldest_pending_age
        ),
        (0, 0, 0, 0, None)
    );
    assert!(counts.processed_exact);
    // PostgreSQL reports its statistics (0 on a new table); SQLite has none.
    assert!(counts.dead_tuples.is_none_or(|d| d >= 0));
    let backlog = b.store().backlog(&t, &[]).await.unwrap();
    assert_eq!(backlog, postbox::store::Backlog::default());

    let ids = enqueue_n(&b, 6).await;
    let c = claim(&b, "r1", 3, Duration::from_secs(30)).await;
    assert_eq!(mark_processed(&b, c.claim_token, &ids[..1]).await, 1);
    mark_failed(&b, c.claim_token, &[failed(ids[1], "bad", true)]).await;

    let counts = b.store().status_counts(&t).await.unwrap();
    assert_eq!(
        (
            counts.pending,
            counts.processing,
            counts.processed,
            counts.failed
        ),
        (3, 1, 1, 1)
    );
    assert!(
        counts.processed_exact,
        "a small table's processed events are counted"
    );
    let age = counts
        .oldest_pending_age
        .expect("an outstanding event has an age");
    assert!(age < Duration::from_secs(60), "{age:?}");
    let backlog = b.store().backlog(&t, &[]).await.unwrap();
    assert_eq!(
        backlog.next_due_in,
        Some(Duration::ZERO),
        "pending events are due now"
    );

    claim(&b, "r1", 10, Duration::from_secs(30)).await;
    let backlog = b.store().backlog(&t, &[]).await.unwrap();
    let due = backlog.next_due_in.expect("due when the leases run out");
    assert!(
        due > Duration::from_secs(28) && due <= Duration::from_secs(30),
        "{due:?}"
    );
    let counts = b.store().status_counts(&t).await.unwrap();
    assert_eq!((counts.pending, counts.processing), (0, 4));
}

/// A conformance case; see the module docs.
pub async fn duplicates_are_reported_and_stored_once<B: StoreHarness>() {
    let b = ready::<B>().await;
    let outbox = b.store().outbox();
    let keyed = |key: &str| Event::new("Paid", &1).unwrap().idempotency_key(key);
    let first = b.enqueue_one(&outbox, keyed("k1")).await.unwrap();
    assert!(matches!(first, Enqueued::Inserted(_)));
    assert_eq!(
        b.enqueue_one(&outbox, keyed("k1")).await.unwrap(),
        Enqueued::Duplicate
    );

    let daily = || {
        Event::new("InvoiceCreated", &1)
            .unwrap()
            .aggregate("Invoice", "456")
    };
    assert!(
        b.enqueue_one(&outbox, daily())
            .await
            .unwrap()
            .id()
            .is_some()
    );
    assert_eq!(
        b.enqueue_one(&outbox, daily()).await.unwrap(),
        Enqueued::Duplicate
    );

    let many = b
        .enqueue(
            &outbox,
            vec![keyed("k2"), keyed("k1"), keyed("k2"), daily(), keyed("k3")],
        )
        .await
        .unwrap();
    assert!(matches!(many[0], Enqueued::Inserted(_)), "{many:?}");
    assert_eq!(many[1..4], [Enqueued::Duplicate; 3], "{many:?}");
    assert!(matches!(many[4], Enqueued::Inserted(_)), "{many:?}");
    assert_eq!(b.row_count().await, 4);
}

/// A conformance case; see the module docs.
pub async fn an_unreadable_row_is_reported_alone_and_the_rest_is_claimed<B: StoreHarness>() {
    let b = ready::<B>().await;
    let ids = enqueue_n(&b, 5).await;
    let column = b.spoil_row(ids[2]).await;
    let c = claim(&b, "r1", 10, Duration::from_secs(30)).await;
    let claimed: Vec<i64> = c.events.iter().map(|e| e.id).collect();
    assert_eq!(claimed, [ids[0], ids[1], ids[3], ids[4]]);
    assert_eq!(c.undecodable.len(), 1, "{:?}", c.undecodable);
    assert_eq!(c.undecodable[0].id, ids[2]);
    assert!(
        c.undecodable[0].reason.contains(column),
        "the reason names the column: {}",
        c.undecodable[0].reason
    );
    // It is claimed like the others, so only this claim's token can fail it.
    let marks = mark_failed(
        &b,
        c.claim_token,
        &[failed(ids[2], &c.undecodable[0].reason, true)],
    )
    .await;
    assert!(marks[0].gave_up);
    assert_eq!(b.row(ids[2]).await.status, "FAILED");
}

/// A conformance case; see the module docs.
pub async fn an_id_that_is_taken_is_an_error_never_a_duplicate<B: StoreHarness>() {
    let b = ready::<B>().await;
    let outbox = b.store().outbox();
    let ids = enqueue_n(&b, 3).await;
    if b.rewind_ids().await {
        let keyed = Event::new("Paid", &1).unwrap().idempotency_key("fresh-key");
        for event in [events(1).remove(0), keyed] {
            let err = b.enqueue_one(&outbox, event).await.unwrap_err();
            assert!(matches!(err, Error::IdTaken { .. }), "{err:?}");
            assert!(err.to_string().contains("id sequence"), "{err}");
        }
        let err = b.enqueue(&outbox, events(2)).await.unwrap_err();
        assert!(matches!(err, Error::IdTaken { .. }), "{err:?}");
        assert_eq!(b.row_count().await, 3, "nothing was written");
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(
                b.row(*id).await.event_type,
                format!("E{i}"),
                "rows untouched"
            );
        }
    }
    // An idempotency key that exists is still a duplicate, whatever the ids.
    b.exec("UPDATE outbox_events SET idempotency_key = 'k' WHERE id = 1")
        .await;
    let again = Event::new("Paid", &1).unwrap().idempotency_key("k");
    assert_eq!(
        b.enqueue_one(&outbox, again).await.unwrap(),
        Enqueued::Duplicate
    );
}

/// A conformance case; see the module docs.
pub async fn enqueue_many_returns_results_in_input_order<B: StoreHarness>() {
    let b = ready::<B>().await;
    let outbox = b.store().outbox();
    b.enqueue_one(
        &outbox,
        Event::new("Seed", &0).unwrap().idempotency_key("dup-7"),
    )
    .await
    .unwrap();
    let batch: Vec<Event> = (0..40)
        .map(|i| {
            let e = Event::new(format!("E{i}"), &i).unwrap();
            match i % 4 {
                0 => e.without_idempotency_key(),
                1 => e.idempotency_key(format!("key-{i}")),
                2 => e.aggregate("Order", i.to_string()),
                _ if i == 7 => e.idempotency_key("dup-7"),
                _ => e.without_idempotency_key(),
            }
        })
        .collect();
    let results = b.enqueue(&outbox, batch).await.unwrap();
    assert_eq!(results.len(), 40);
    let mut last_id = 0;
    for (i, result) in results.iter().enumerate() {
        if i == 7 {
            assert_eq!(*result, Enqueued::Duplicate);
            continue;
        }
        let id = result
            .id()
            .unwrap_or_else(|| panic!("event {i} was inserted"));
        assert_eq!(
            b.row(id).await.event_type,
            format!("E{i}"),
            "result {i} names its row"
        );
        assert!(id > last_id, "ids follow the input order");
        last_id = id;
    }
    assert_eq!(b.row_count().await, 40);
    assert_eq!(
        b.enqueue(&outbox, Vec::new()).await.unwrap(),
        Vec::<Enqueued>::new()
    );
}

/// A conformance case; see the module docs.
pub async fn oversized_events_are_refused_and_nothing_is_written<B: StoreHarness>() {
    let b = ready::<B>().await;
    let outbox = b.store().outbox_builder().payload_limit(1024).build();
    let long = "x".repeat(101);
    let cases: Vec<(&str, Event)> = vec![
        ("payload", Event::new("Big", &"y".repeat(1100)).unwrap()),
        ("event_type", Event::new(long.clone(), &1).unwrap()),
        (
            "aggregate_type",
            Event::new("T", &1).unwrap().aggregate(long.clone(), "1"),
        ),
        (
            "aggregate_id",
            Event::new("T", &1).unwrap().aggregate("A", long.clone()),
        ),
        (
            "event_class",
            Event::new("T", &1).unwrap().event_class("c".repeat(256)),
        ),
        (
            "idempotency_key",
            Event::new("T", &1)
                .unwrap()
                .idempotency_key("k".repeat(256)),
        ),
    ];
    for (field, event) in cases {
        let err = b.enqueue_one(&outbox, event.clone()).await.unwrap_err();
        match &err {
            Error::InvalidEvent { field: f, .. } => assert_eq!(*f, field),
            other => panic!("{field}: expected InvalidEvent, got {other:?}"),
        }
        assert!(err.to_string().contains(field), "{err}");
        // One bad event refuses the whole batch, before anything is written.
        let batch = vec![Event::new("Good", &1).unwrap(), event];
        let err = b.enqueue(&outbox, batch).await.unwrap_err();
        assert!(matches!(err, Error::InvalidEvent { .. }), "{err:?}");
    }
    assert_eq!(b.row_count().await, 0);

    // The limits are inclusive, and count characters, not bytes.
    let at_limit = "é".repeat(100);
    let fits = Event::new(at_limit.clone(), &"y".repeat(1022))
        .unwrap()
        .aggregate(at_limit.clone(), "1");
    let id = b.enqueue_one(&outbox, fits).await.unwrap().id().unwrap();
    assert_eq!(b.row(id).await.event_type.chars().count(), 100);
    let fits = Event::new("T", &1)
        .unwrap()
        .aggregate("A", at_limit)
        .without_idempotency_key();
    assert!(b.enqueue_one(&outbox, fits).await.unwrap().id().is_some());
}

/// A conformance case; see the module docs.
pub async fn a_refused_event_leaves_the_callers_transaction_usable<B: StoreHarness>() {
    let b = ready::<B>().await;
    let outbox = b.store().outbox_builder().payload_limit(1024).build();
    let good = |n: i32| Event::new("Good", &n).unwrap().without_idempotency_key();
    let bad: Vec<(&str, Event)> = vec![
        ("payload", Event::new("T", &"y".repeat(2000)).unwrap()),
        ("payload", Event::new("T", &"nul \0 inside").unwrap()),
        ("event_type", Event::new("Nul\0Type", &1).unwrap()),
        ("aggregate_id", good(0).aggregate("Invoice", "4\0 56")),
        ("event_class", good(0).event_class("a\0b")),
        ("headers", good(0).header("traceparent", "00-\0")),
        ("headers", good(0).header("bad\0name", "v")),
        ("idempotency_key", good(0).idempotency_key("k\0")),
    ];
    let mut events = vec![good(1)];
    let fields: Vec<&str> = bad.iter().map(|(f, _)| *f).collect();
    events.extend(bad.into_iter().map(|(_, e)| e));
    events.push(good(2));
    let results = b.enqueue_each_then_commit(&outbox, events).await;
    assert!(results[0].as_ref().is_ok_and(|r| r.id().is_some()));
    for (result, field) in results[1..=fields.len()].iter().zip(&fields) {
        match result {
            Err(Error::InvalidEvent { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: expected InvalidEvent, got {other:?}"),
        }
    }
    assert!(
        results
            .last()
            .unwrap()
            .as_ref()
            .is_ok_and(|r| r.id().is_some())
    );
    assert_eq!(
        b.row_count().await,
        2,
        "the good events around the refused ones committed"
    );

    // A backslash followed by the text `u0000` is no NUL, and is stored as given.
    let lookalike = serde_json::json!({ "path": "C:\\u0000dir", "odd": "\\\\u0000" });
    let id = b
        .enqueue_one(&outbox, Event::new("Path", &lookalike).unwrap())
        .await
        .unwrap()
        .id()
        .unwrap();
    let claimed = claim(&b, "r1", 10, Duration::from_secs(30)).await;
    let e = claimed.events.iter().find(|e| e.id == id).unwrap();
    assert_eq!(e.payload_as::<serde_json::Value>().unwrap(), lookalike);
}

/// A conformance case; see the module docs.
pub async fn an_operator_retry_puts_failed_events_back_in_the_queue<B: StoreHarness>() {
    let b = ready::<B>().await;
    let t = target(&b);
    let ids = enqueue_n(&b, 4).await;
    let c = claim(&b, "r1", 10, Duration::from_secs(30)).await;
    mark_failed(
        &b,
        c.claim_token,
        &[
            failed(ids[0], "gone", true),
            failed(ids[1], "gone too", true),
            failed(ids[2], "try again later", false),
        ],
    )
    .await;
    assert_eq!(mark_processed(&b, c.claim_token, &ids[3..]).await, 1);

    // By id: only FAILED events move; a PENDING or PROCESSED one named too is left alone.
    let only_first = [ids[0], ids[2], ids[3]];
    let n = b
        .store()
        .events_retry_failed(&postbox::store::RetryFailedParams {
            target: &t,
            ids: Some(&only_first),
        })
        .await
        .unwrap();
    assert_eq!(n, 1);
    let row = b.row(ids[0]).await;
    assert_eq!((row.status.as_str(), row.retry_count), ("PENDING", 0));
    assert_eq!(row.left_ms, None, "due at once");
    assert_eq!(b.row(ids[1]).await.status, "FAILED");
    assert_eq!(b.row(ids[3]).await.status, "PROCESSED");

    // All of them.
    let n = b
        .store()
        .events_retry_failed(&postbox::store::RetryFailedParams {
            target: &t,
            ids: None,
        })
        .await
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!(b.row(ids[1]).await.status, "PENDING");
    let claimed: Vec<i64> = claim(&b, "r2", 10, Duration::from_secs(30))
        .await
        .events
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(claimed, [ids[0], ids[1]], "retried events are claimable");
}

/// Archives every batch of `target` older than `days`, `batch` rows at a time; returns the
/// total moved (or counted) and the number of batches.
async fn archive_all<B: StoreHarness>(b: &B, days: u64, batch: u32, dry_run: bool) -> (u64, u32) {
    let t = target(b);
    let (mut after_id, mut moved, mut batches) = (0, 0, 0);
    loop {
        let done = b
            .store()
            .events_archive(&postbox::store::ArchiveParams {
                target: &t,
                older_than: Duration::from_secs(days * 86_400),
                after_id,
                batch_size: batch,
                dry_run,
            })
            .await
            .unwrap()
            .expect("nobody else archives");
        batches += 1;
        moved += done.moved;
        assert!(done.last_id >= after_id, "the walk goes forward");
        after_id = done.last_id;
        if done.done {
            return (moved, batches);
        }
        assert!(batches < 100, "the walk ends");
    }
}

/// Purges every batch of `kind` older than `days`; returns the total.
async fn purge_all<B: StoreHarness>(
    b: &B,
    kind: postbox::store::PurgeKind,
    days: u64,
    dry_run: bool,
) -> u64 {
    let t = target(b);
    let mut purged = 0;
    for _ in 0..100 {
        let done = b
            .store()
            .events_purge(&postbox::store::PurgeParams {
                target: &t,
                kind,
                older_than: Duration::from_secs(days * 86_400),
                batch_size: 2,
                dry_run,
            })
            .await
            .unwrap()
            .expect("nobody else purges");
        purged += done.purged;
        if done.done {
            return purged;
        }
    }
    panic!("the purge never ends")
}

/// A conformance case; see the module docs.
pub async fn retention_archives_old_processed_events_and_nothing_else<B: StoreHarness>() {
    let b = ready::<B>().await;
    let keyed = || {
        Event::new("Keyed", &serde_json::json!({}))
            .expect("event")
            .idempotency_key("order-1:created")
    };
    let outbox = b.store().outbox();
    let first = b.enqueue_one(&outbox, keyed()).await.unwrap();
    let mut ids = vec![first.id().expect("inserted")];
    ids.extend(enqueue_n(&b, 7).await);
    assert_eq!(
        b.enqueue_one(&outbox, keyed()).await.unwrap(),
        Enqueued::Duplicate
    );
    let c = claim(&b, "r1", 7, Duration::from_secs(30)).await;
    let processed = [ids[0], ids[2], ids[4], ids[5], ids[6]];
    assert_eq!(mark_processed(&b, c.claim_token, &processed).await, 5);
    mark_failed(&b, c.claim_token, &[failed(ids[1], "gone", true)]).await;
    // ids[3] stays PROCESSING (claimed), ids[7] PENDING (never claimed).
    // Created 40 days ago: all but ids[5]. The walk follows ids and stops at the first young
    // row, so ids[6] (old, but after a young one) waits for a later run.
    let old: Vec<i64> = ids.iter().copied().filter(|id| *id != ids[5]).collect();
    b.backdate("outbox_events", "created_at", &old, 40).await;

    for batch in [1, 2, 100] {
        assert_eq!(
            archive_all(&b, 30, batch, true).await.0,
            3,
            "dry run, batches of {batch}"
        );
    }
    assert_eq!(
        b.archived_ids().await,
        Vec::<i64>::new(),
        "a dry run moves nothing"
    );
    assert_eq!(b.row_count().await, 8);

    let (moved, batches) = archive_all(&b, 30, 2, false).await;
    assert_eq!(moved, 3);
    assert!(batches >= 3, "{batches} batches");
    assert_eq!(b.archived_ids().await, [ids[0], ids[2], ids[4]]);
    assert_eq!(b.row_count().await, 5);
    for id in [ids[1], ids[3], ids[5], ids[6], ids[7]] {
        b.row(id).await;
    }
    assert_eq!(
        archive_all(&b, 30, 2, false).await.0,
        0,
        "nothing left to move"
    );
    // Younger than the cutoff: nothing moves, whatever the status.
    assert_eq!(archive_all(&b, 50, 100, false).await.0, 0);

    // Once the young row is archived too, the walk reaches the old one behind it.
    b.backdate("outbox_events", "created_at", &[ids[5]], 40)
        .await;
    assert_eq!(archive_all(&b, 30, 100, false).await.0, 2);
    assert_eq!(
        b.archived_ids().await,
        [ids[0], ids[2], ids[4], ids[5], ids[6]]
    );
    // An archived event's idempotency key is free again: the dedup window is the hot table.
    let again = b.enqueue_one(&outbox, keyed()).await.unwrap();
    assert!(matches!(again, Enqueued::Inserted(_)), "{again:?}");
}

/// A conformance case; see the module docs.
pub async fn purge_removes_old_archived_and_failed_events_only<B: StoreHarness>() {
    use postbox::store::PurgeKind;
    let b = ready::<B>().await;
    let ids = enqueue_n(&b, 9).await;
    let c = claim(&b, "r1", 9, Duration::from_secs(30)).await;
    mark_processed(&b, c.claim_token, &ids[..5]).await;
    mark_failed(
        &b,
        c.claim_token,
        &[
            failed(ids[5], "a", true),
            failed(ids[6], "b", true),
            failed(ids[7], "c", true),
        ],
    )
    .await;
    b.backdate("outbox_events", "created_at", &ids, 40).await;
    assert_eq!(archive_all(&b, 30, 100, false).await.0, 5);
    b.backdate("outbox_events_archive", "archived_at", &ids[..3], 100)
        .await;
    b.backdate("outbox_events", "updated_at", &ids[5..7], 10)
        .await;

    assert_eq!(purge_all(&b, PurgeKind::Archive, 90, true).await, 3);
    assert_eq!(purge_all(&b, PurgeKind::Failed, 7, true).await, 2);
    assert_eq!(b.archived_ids().await.len(), 5, "a dry run deletes nothing");

    assert_eq!(purge_all(&b, PurgeKind::Archive, 90, false).await, 3);
    assert_eq!(b.archived_ids().await, ids[3..5]);
    assert_eq!(purge_all(&b, PurgeKind::Failed, 7, false).await, 2);
    assert_eq!(b.row(ids[7]).await.status, "FAILED", "failed lately: kept");
    assert_eq!(b.row(ids[8]).await.status, "PROCESSING", "not failed: kept");
    assert_eq!(b.row_count().await, 2);
    assert_eq!(purge_all(&b, PurgeKind::Archive, 90, false).await, 0);
    assert_eq!(purge_all(&b, PurgeKind::Failed, 7, false).await, 0);
}

/// Lists `filter`'s events of the default target, `limit` at a time, following the pages.
async fn list_all<B: StoreHarness>(
    b: &B,
    filter: &postbox::store::EventFilter,
    order: postbox::store::Order,
    limit: u32,
) -> Vec<i64> {
    let t = target(b);
    let mut ids = Vec::new();
    let mut after = None;
    loop {
        let page = b
            .store()
            .events_list(&postbox::store::ListParams {
                target: &t,
                filter,
                order,
                after,
                limit,
            })
            .await
            .unwrap();
        assert!(page.len() <= limit as usize);
        ids.extend(page.iter().map(|e| e.id));
        match page.last() {
            Some(last) if page.len() == limit as usize => after = Some(last.id),
            _ => return ids,
        }
    }
}

/// A conformance case; see the module docs.
pub async fn events_are_listed_by_filter_and_read_back_whole<B: StoreHarness>() {
    use postbox::store::{EventFilter, EventStatus, Order};
    let b = ready::<B>().await;
    let outbox = b.store().outbox();
    let event = |ty: &str, agg: &str, id: &str| {
        Event::new(ty, &serde_json::json!({ "agg": id }))
            .expect("event")
            .aggregate(agg, id)
            .header("traceparent", "00-abc-def-01")
    };
    let ids: Vec<i64> = b
        .enqueue(
            &outbox,
            vec![
                event("InvoiceCreated", "Invoice", "1"),
                event("InvoiceCreated", "Invoice", "2"),
                event("InvoicePaid", "Invoice", "2"),
                event("OrderPlaced", "Order", "9"),
                event("A_B", "Odd", "x"),
                event("AxB", "Odd", "y"),
            ],
        )
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.id().expect("inserted"))
        .collect();
    let c = claim(&b, "r1", 4, Duration::from_secs(30)).await;
    mark_processed(&b, c.claim_token, &ids[..2]).await;
    mark_failed(&b, c.claim_token, &[failed(ids[2], "broker said no", true)]).await;
    // ids[0] moves to the archive.
    b.backdate("outbox_events", "created_at", &ids[..1], 40)
        .await;
    assert_eq!(archive_all(&b, 30, 100, false).await.0, 1);

    let all = EventFilter::default();
    let newest: Vec<i64> = ids[1..].iter().rev().copied().collect();
    assert_eq!(
        list_all(&b, &all, Order::NewestFirst, 100).await,
        newest,
        "hot table only"
    );
    assert_eq!(
        list_all(&b, &all, Order::NewestFirst, 2).await,
        newest,
        "in pages"
    );
    let mut with_archive = EventFilter::default();
    with_archive.archive = true;
    assert_eq!(
        list_all(&b, &with_archive, Order::OldestFirst, 2).await,
        ids,
        "archive too"
    );

    let mut f = EventFilter::default();
    f.archive = true;
    f.event_type = Some("Invoice*".parse().unwrap());
    assert_eq!(list_all(&b, &f, Order::OldestFirst, 10).await, ids[..3]);
    f.aggregate_id = Some("2".into());
    assert_eq!(list_all(&b, &f, Order::OldestFirst, 10).await, ids[1..3]);
    f.statuses = vec![EventStatus::Failed];
    assert_eq!(list_all(&b, &f, Order::OldestFirst, 10).await, [ids[2]]);
    let mut f = EventFilter::default();
    f.archive = true;
    f.statuses = vec![EventStatus::Processed];
    assert_eq!(
        list_all(&b, &f, Order::OldestFirst, 10).await,
        ids[..2],
        "archived are PROCESSED"
    );
    f.statuses = vec![EventStatus::Pending, EventStatus::Processing];
    assert_eq!(list_all(&b, &f, Order::OldestFirst, 10).await, ids[3..]);
    // Globs: `_` is literal, `?` is one character, case counts.
    let mut f = EventFilter::default();
    f.event_type = Some("A_B".parse().unwrap());
    assert_eq!(list_all(&b, &f, Order::OldestFirst, 10).await, [ids[4]]);
    f.event_type = Some("A?B".parse().unwrap());
    assert_eq!(list_all(&b, &f, Order::OldestFirst, 10).await, ids[4..]);
    f.event_type = Some("invoice*".parse().unwrap());
    assert!(list_all(&b, &f, Order::OldestFirst, 10).await.is_empty());
    let mut f = EventFilter::default();
    f.aggregate_type = Some("Ord*".parse().unwrap());
    assert_eq!(list_all(&b, &f, Order::OldestFirst, 10).await, [ids[3]]);
    // Time ranges, on created_at.
    let now = chrono::Utc::now();
    let mut f = EventFilter::default();
    f.archive = true;
    f.until = Some(now - chrono::Duration::days(10));
    assert_eq!(list_all(&b, &f, Order::OldestFirst, 10).await, [ids[0]]);
    f.until = None;
    f.since = Some(now - chrono::Duration::days(10));
    assert_eq!(list_all(&b, &f, Order::OldestFirst, 10).await, ids[1..]);
    f.until = Some(now - chrono::Duration::days(20));
    let err = b
        .store()
        .events_list(&postbox::store::ListParams {
            target: &target(&b),
            filter: &f,
            order: Order::NewestFirst,
            after: None,
            limit: 10,
        })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidFilter { .. }), "{err}");

    // One event, every column, from the table or the archive.
    let t = target(&b);
    let failed_event = b
        .store()
        .event_get(&t, ids[2])
        .await
        .unwrap()
        .expect("found");
    assert_eq!(failed_event.status, "FAILED");
    assert_eq!(failed_event.event_type, "InvoicePaid");
    assert_eq!(failed_event.aggregate_id.as_deref(), Some("2"));
    assert_eq!(failed_event.last_error.as_deref(), Some("broker said no"));
    assert!(failed_event.archived_at.is_none());
    let payload: serde_json::Value = serde_json::from_str(&failed_event.payload).unwrap();
    assert_eq!(payload, serde_json::json!({ "agg": "2" }));
    let event = failed_event.to_outbox_event().unwrap();
    assert_eq!(event.headers["traceparent"], "00-abc-def-01");
    let archived = b
        .store()
        .event_get(&t, ids[0])
        .await
        .unwrap()
        .expect("found");
    assert_eq!(archived.status, "PROCESSED");
    assert!(archived.archived_at.is_some() && archived.processed_at.is_some());
    assert!(b.store().event_get(&t, 999_999).await.unwrap().is_none());
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

/// A conformance case; see the module docs. With ordering, a claim takes an ordered aggregate's
/// due events as one run in id order, nothing of an aggregate whose earlier event is in flight,
/// FAILED (until skipped) or backing off; unordered events and other aggregates as usual. The
/// backlog counts a parked aggregate's events as nothing to wait for.
pub async fn ordered_claims_take_an_aggregate_only_past_its_unfinished_events<B: StoreHarness>() {
    let b = ready::<B>().await;
    let outbox = b.store().outbox();
    let ev = |kind: &str, aggregate: &str| {
        Event::new(kind, &serde_json::json!({}))
            .expect("event")
            .aggregate("Invoice", aggregate)
            .without_idempotency_key()
    };
    let ids: Vec<i64> = b
        .enqueue(
            &outbox,
            vec![
                ev("A", "1"),
                ev("B", "1"),
                ev("A", "2"),
                ev("C", "1"),
                ev("B", "2"),
                ev("A", "3"),
            ],
        )
        .await
        .expect("enqueue")
        .into_iter()
        .map(|e| e.id().expect("inserted"))
        .collect();
    let types = vec!["Invoice".to_owned()];
    let t = target(&b);
    let ordered_claim = |batch_size: u32| claim_ordered(&b, &types, batch_size, batch_size, false);
    // Invoice 1's first two: the batch ends inside its run.
    let first = ordered_claim(2).await;
    let got: Vec<i64> = first.events.iter().map(|e| e.id).collect();
    assert_eq!(got, [ids[0], ids[1]]);
    // Invoice 1 is in flight: its third event waits; invoices 2 and 3 go.
    let second = ordered_claim(100).await;
    let got: Vec<i64> = second.events.iter().map(|e| e.id).collect();
    assert_eq!(got, [ids[2], ids[4], ids[5]]);
    // Invoice 1's first event fails for good: its aggregate is parked.
    mark_processed(&b, first.claim_token, &[ids[0]]).await;
    mark_failed(&b, first.claim_token, &[failed(ids[1], "rejected", true)]).await;
    assert!(ordered_claim(100).await.events.is_empty(), "parked");
    let backlog = b.store().backlog(&t, &types).await.expect("backlog");
    assert_eq!(
        backlog.next_due_in.map(|d| d.as_secs() > 0),
        Some(true),
        "only the leases of invoices 2 and 3 are waited for, not the parked event"
    );
    let skipped = b
        .store()
        .events_skip(&t, &[ids[0], ids[1]])
        .await
        .expect("skip");
    assert_eq!(skipped, [ids[1]], "only the FAILED head is skipped");
    let third = ordered_claim(100).await;
    let got: Vec<i64> = third.events.iter().map(|e| e.id).collect();
    assert_eq!(
        got,
        [ids[3]],
        "the rest of invoice 1 flows once its head is skipped"
    );
    assert_eq!(b.row(ids[3]).await.status, "PROCESSING");
}

/// An ordered claim of `types` from the start of the table, every commit settled.
async fn claim_ordered<B: StoreHarness>(
    b: &B,
    types: &[String],
    batch_size: u32,
    walk: u32,
    sweep: bool,
) -> Claimed {
    b.store()
        .events_claim(&ClaimParams {
            target: &target(b),
            batch_size,
            lease: Duration::from_secs(30),
            relay_id: "ordered",
            floor: 0,
            order: postbox::store::ClaimOrder {
                aggregate_types: types,
                settled_through: i64::MAX,
                walk,
                sweep,
            },
        })
        .await
        .expect("ordered claim")
}

/// A conformance case; see the module docs. An ordered claim that reads only a few due events
/// in id order (its walk) still finds the ready aggregates behind more waiting events than that,
/// takes events that are not ordered when it sweeps for them, and a drain by such claims takes
/// every event once, each aggregate's in id order.
pub async fn ordered_claims_find_ready_aggregates_behind_more_waiting_events_than_they_read<
    B: StoreHarness,
>() {
    let b = ready::<B>().await;
    let outbox = b.store().outbox();
    let ev = |aggregate: Option<&str>| {
        let e = Event::new("Changed", &serde_json::json!({}))
            .expect("event")
            .without_idempotency_key();
        match aggregate {
            Some(id) => e.aggregate("Invoice", id),
            None => e,
        }
    };
    let mut events: Vec<Event> = (0..10).map(|_| ev(Some("1"))).collect();
    events.extend((0..3).map(|_| ev(Some("2"))));
    events.push(ev(None));
    events.push(ev(Some("3")));
    let ids: Vec<i64> = b
        .enqueue(&outbox, events)
        .await
        .expect("enqueue")
        .into_iter()
        .map(|e| e.id().expect("inserted"))
        .collect();
    let (invoice_1, invoice_2, unordered, invoice_3) = (&ids[..10], &ids[10..13], ids[13], ids[14]);
    let types = vec!["Invoice".to_owned()];
    let claim = |batch_size: u32, walk: u32, sweep: bool| {
        claim_ordered(&b, &types, batch_size, walk, sweep)
    };
    let ids_of = |c: &postbox::store::Claimed| c.events.iter().map(|e| e.id).collect::<Vec<_>>();
    // Invoice 1's head goes in flight: its nine other events wait.
    let first = claim(1, 1, false).await;
    assert_eq!(ids_of(&first), [invoice_1[0]]);
    // A walk of two reads two of invoice 1's waiting events; the claim still finds invoice 2.
    let second = claim(2, 2, false).await;
    let got = ids_of(&second);
    assert_eq!(
        got.len(),
        2,
        "a full claim past the waiting events: {got:?}"
    );
    assert_eq!(got[0], invoice_2[0], "invoice 2's head first");
    assert!(
        got.iter().all(|id| !invoice_1.contains(id)),
        "nothing of invoice 1 while its head is in flight: {got:?}"
    );
    // A sweep for events that are not ordered finds the one behind them.
    let third = claim(10, 2, true).await;
    let got = ids_of(&third);
    assert!(got.contains(&unordered), "the unordered event: {got:?}");
    assert!(
        got.iter().all(|id| !invoice_1.contains(id)),
        "nothing of invoice 1 while its head is in flight: {got:?}"
    );
    // The rest drains by small claims, each aggregate in id order, every event once.
    let mut taken: Vec<i64> = [ids_of(&first), ids_of(&second), ids_of(&third)].concat();
    for c in [&first, &second, &third] {
        mark_processed(&b, c.claim_token, &ids_of(c)).await;
    }
    for _ in 0..ids.len() {
        let next = claim(3, 2, true).await;
        if next.events.is_empty() {
            break;
        }
        mark_processed(&b, next.claim_token, &ids_of(&next)).await;
        taken.extend(ids_of(&next));
    }
    let mut once = taken.clone();
    once.sort_unstable();
    once.dedup();
    assert_eq!(once.len(), taken.len(), "an event claimed twice: {taken:?}");
    assert_eq!(once, ids, "every event claimed");
    for aggregate in [invoice_1, invoice_2, &[invoice_3][..]] {
        let order: Vec<i64> = taken
            .iter()
            .copied()
            .filter(|id| aggregate.contains(id))
            .collect();
        assert_eq!(order, aggregate, "an aggregate out of order: {taken:?}");
    }
}

// ---- the list of cases ---------------------------------------------------------------------

/// The one list of the suite's cases: expands to `$callback! { $args [case, case, …] }`, for
/// [`store_conformance!`](crate::store_conformance) and [`CASES`]. A case is a `pub async fn`
/// of this module (or one it re-exports); the test `every_case_is_listed` fails while one is
/// missing here, so that no case can exist without running for every store.
#[doc(hidden)]
#[macro_export]
macro_rules! __store_suite_cases {
    (($($callback:tt)*) $($args:tt)*) => {
        $($callback)*! { $($args)* [
            migrate_is_idempotent,
            plain_sql_insert_is_a_valid_pending_event,
            enqueued_event_keeps_its_fields,
            claim_takes_due_events_in_id_order_up_to_batch_size,
            claimed_events_are_not_claimed_again_before_the_lease_expires,
            an_expired_lease_is_reclaimed_and_counted_as_recovered,
            a_stale_event_on_its_last_try_goes_failed,
            late_writes_of_a_fenced_claim_change_nothing,
            mark_failed_backs_off_exponentially_on_the_database_clock,
            the_backoff_of_an_event_retried_for_a_long_time_stays_at_the_cap,
            an_error_text_that_cannot_be_stored_as_is_is_cleaned_and_capped,
            a_release_puts_events_back_after_a_delay_without_spending_a_try,
            claims_from_a_floor_still_take_what_went_wrong_below_it,
            gaps_name_the_ids_present_and_what_became_of_the_ids_passed,
            mark_failed_at_max_retries_goes_failed,
            a_permanent_error_fails_at_once,
            renew_extends_the_lease_of_the_token_holder_only,
            status_counts_and_backlog_are_right,
            duplicates_are_reported_and_stored_once,
            an_unreadable_row_is_reported_alone_and_the_rest_is_claimed,
            an_id_that_is_taken_is_an_error_never_a_duplicate,
            enqueue_many_returns_results_in_input_order,
            oversized_events_are_refused_and_nothing_is_written,
            a_refused_event_leaves_the_callers_transaction_usable,
            an_operator_retry_puts_failed_events_back_in_the_queue,
            the_slow_lane_gives_failed_events_one_more_try_at_a_time,
            a_retry_policy_overrides_the_events_max_retries,
            retention_archives_old_processed_events_and_nothing_else,
            purge_removes_old_archived_and_failed_events_only,
            events_are_listed_by_filter_and_read_back_whole,
            ordered_claims_take_an_aggregate_only_past_its_unfinished_events,
            ordered_claims_find_ready_aggregates_behind_more_waiting_events_than_they_read,
            the_commit_horizon_settles_committed_ids_and_never_one_still_open,
            an_id_rolled_back_does_not_hold_the_commit_horizon_back,
            the_head_of_the_outbox_moves_with_every_id_handed_out,
            sink_reports_keep_each_relays_latest,
            tenants_are_served_or_plainly_unsupported,
            wakeups_come_with_commits_or_the_store_has_none,
            marks_leave_dead_rows_that_a_vacuum_removes,
            the_oldest_open_transaction_is_seen_where_the_database_tells,
            an_inbox_handles_each_message_once_per_consumer,
            a_concurrent_delivery_waits_for_the_first_and_never_runs_twice,
            inbox_records_past_the_dedup_window_are_purged,
        ] }
    };
}

macro_rules! case_names {
    ([$($case:ident),* $(,)?]) => {
        &[$(stringify!($case)),*]
    };
}

/// The names of every case, in the order [`store_conformance!`](crate::store_conformance) runs
/// them.
pub const CASES: &[&str] = __store_suite_cases!((case_names));

/// One `#[tokio::test]` per store conformance case, in a module `$module`, for `$harness` (a
/// [`StoreHarness`](crate::store_suite::StoreHarness)): every case of the suite, from its one
/// list ([`CASES`](crate::store_suite::CASES)), so a case added to the suite runs for every
/// store without a line more where the stores are tested. A failure names the store's module
/// and the case, e.g. `postgres::a_permanent_error_fails_at_once`.
#[macro_export]
macro_rules! store_conformance {
    ($module:ident, $harness:ty) => {
        $crate::__store_suite_cases!(($crate::store_conformance) @tests $module, $harness,);
    };
    (@tests $module:ident, $harness:ty, [$($case:ident),* $(,)?]) => {
        mod $module {
            $(
                #[tokio::test]
                async fn $case() {
                    $crate::store_suite::$case::<$harness>().await;
                }
            )*
        }
    };
}

#[cfg(test)]
mod tests {
    use super::CASES;

    /// Every `pub async fn` of the suite's files is a case, and every case is in the one list:
    /// a case left out would never run. Reads the files at test time, so a new file of cases is
    /// checked without naming it here.
    #[test]
    fn every_case_is_listed() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/store_suite");
        let mut found = Vec::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "rs") {
                let source = std::fs::read_to_string(&path).unwrap();
                found.extend(source.lines().filter_map(|line| {
                    let rest = line.trim_start().strip_prefix("pub async fn ")?;
                    Some(rest.split(['<', '(']).next()?.trim().to_owned())
                }));
            }
        }
        let mut listed: Vec<&str> = CASES.to_vec();
        listed.sort_unstable();
        let twice: Vec<&&str> = listed
            .windows(2)
            .filter(|w| w[0] == w[1])
            .map(|w| &w[0])
            .collect();
        assert!(twice.is_empty(), "listed twice: {twice:?}");
        let unlisted: Vec<&String> = found
            .iter()
            .filter(|f| !listed.contains(&f.as_str()))
            .collect();
        assert!(
            unlisted.is_empty(),
            "cases that never run: add them to __store_suite_cases! in store_suite/mod.rs: {unlisted:?}"
        );
        let unknown: Vec<&&str> = listed
            .iter()
            .filter(|l| !found.iter().any(|f| f == *l))
            .collect();
        assert!(
            unknown.is_empty(),
            "listed, but no `pub async fn` case: {unknown:?}"
        );
    }
}
