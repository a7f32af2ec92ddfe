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

use postbox::inbox::{Inbox, Received};
use postbox::{Event, Outbox, Store, event::Enqueued};
use sqlx::Row;

mod claims;
mod enqueue;
mod floor;
mod helpers;
mod horizon;
mod inbox;
#[cfg(feature = "mysql")]
mod mysql;
mod operator;
mod ordering;
#[cfg(feature = "postgres")]
mod postgres;
mod retention;
mod retries;
mod sink_health;
#[cfg(feature = "sqlite")]
mod sqlite;
mod tenants;
mod upkeep;

pub use claims::{
    a_stale_event_on_its_last_try_goes_failed,
    an_expired_lease_is_reclaimed_and_counted_as_recovered,
    an_unreadable_row_is_reported_alone_and_the_rest_is_claimed,
    claim_takes_due_events_in_id_order_up_to_batch_size,
    claimed_events_are_not_claimed_again_before_the_lease_expires,
    late_writes_of_a_fenced_claim_change_nothing, renew_extends_the_lease_of_the_token_holder_only,
};
pub use enqueue::{
    a_refused_event_leaves_the_callers_transaction_usable,
    an_id_that_is_taken_is_an_error_never_a_duplicate, duplicates_are_reported_and_stored_once,
    enqueue_many_returns_results_in_input_order, enqueued_event_keeps_its_fields,
    migrate_is_idempotent, oversized_events_are_refused_and_nothing_is_written,
    plain_sql_insert_is_a_valid_pending_event,
};
pub use floor::{
    claims_from_a_floor_still_take_what_went_wrong_below_it,
    gaps_name_the_ids_missing_and_what_became_of_the_ids_passed,
};
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
pub use operator::{
    an_operator_retry_puts_failed_events_back_in_the_queue,
    events_are_listed_by_filter_and_read_back_whole, status_counts_and_backlog_are_right,
};
pub use ordering::{
    ordered_claims_find_ready_aggregates_behind_more_waiting_events_than_they_read,
    ordered_claims_take_an_aggregate_only_past_its_unfinished_events,
};
pub use retention::{
    purge_removes_old_archived_and_failed_events_only,
    retention_archives_old_processed_events_and_nothing_else,
};
pub use retries::{
    a_permanent_error_fails_at_once,
    a_release_puts_events_back_after_a_delay_without_spending_a_try,
    a_retry_policy_overrides_the_events_max_retries,
    an_error_text_that_cannot_be_stored_as_is_is_cleaned_and_capped,
    mark_failed_at_max_retries_goes_failed,
    mark_failed_backs_off_exponentially_on_the_database_clock,
    the_backoff_of_an_event_retried_for_a_long_time_stays_at_the_cap,
    the_slow_lane_gives_failed_events_one_more_try_at_a_time,
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
            gaps_name_the_ids_missing_and_what_became_of_the_ids_passed,
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
