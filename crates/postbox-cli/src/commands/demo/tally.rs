//! The demo's proof: what the database and the handlers say, checked against the outbox's
//! promises (nothing lost, no ghost).

use std::collections::{BTreeMap, BTreeSet};

use sqlx::AssertSqlSafe;

use crate::database::Pool;

use super::handlers::Seen;

/// One row of the outbox, as the tally reads it.
#[derive(Clone, Debug)]
pub(super) struct OutboxRow {
    /// Event id.
    pub(super) id: i64,
    /// The invoice number.
    pub(super) aggregate_id: Option<String>,
    /// `PENDING`, `PROCESSING`, `PROCESSED` or `FAILED`.
    pub(super) status: String,
    /// Failed tries.
    pub(super) retry_count: i32,
    /// The error of the last failed try.
    pub(super) last_error: Option<String>,
}

/// Reads every outbox row; `events_table` is `outbox_events`, schema-qualified on PostgreSQL.
pub(super) async fn outbox_rows(pool: &Pool, events_table: &str) -> anyhow::Result<Vec<OutboxRow>> {
    // The only dynamic part is the table, qualified by a quoted, validated schema name.
    let sql = AssertSqlSafe(format!(
        "SELECT id, aggregate_id, status, retry_count, last_error FROM {events_table} ORDER BY id"
    ));
    type Row = (i64, Option<String>, String, i32, Option<String>);
    let rows: Vec<Row> = match pool {
        Pool::Postgres(p) => sqlx::query_as(sql).fetch_all(p).await?,
        Pool::Sqlite(p) => sqlx::query_as(sql).fetch_all(p).await?,
        Pool::MySql(p) => sqlx::query_as(sql).fetch_all(p).await?,
    };
    Ok(rows
        .into_iter()
        .map(
            |(id, aggregate_id, status, retry_count, last_error)| OutboxRow {
                id,
                aggregate_id,
                status,
                retry_count,
                last_error,
            },
        )
        .collect())
}

/// The counts the demo ends with.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Tally {
    /// Invoices in the `invoices` table.
    pub(super) committed: usize,
    /// Invoices the service rolled back.
    pub(super) rolled_back: usize,
    /// Rows in `outbox_events`.
    pub(super) events: usize,
    /// Committed invoices with exactly one event.
    pub(super) committed_with_one_event: usize,
    /// `PROCESSED` events.
    pub(super) published: usize,
    /// `PROCESSED` events whose customer the notification handler reached.
    pub(super) published_and_notified: usize,
    /// `FAILED` events.
    pub(super) failed: usize,
    /// `PENDING` or `PROCESSING` events.
    pub(super) outstanding: usize,
    /// Rolled-back invoices with an event in the outbox.
    pub(super) rolled_back_in_outbox: usize,
    /// Rolled-back invoices any handler saw.
    pub(super) rolled_back_published: usize,
}

impl Tally {
    /// Counts from the committed invoices, the rolled-back ones, the outbox and the handlers.
    pub(super) fn count(
        committed: &BTreeSet<String>,
        rolled_back: &BTreeSet<String>,
        rows: &[OutboxRow],
        seen: &Seen,
    ) -> Tally {
        let mut per_invoice: BTreeMap<&str, usize> = BTreeMap::new();
        for row in rows {
            if let Some(id) = &row.aggregate_id {
                *per_invoice.entry(id).or_default() += 1;
            }
        }
        let status_is = |s: &str| rows.iter().filter(|r| r.status == s).count();
        let seen_any: BTreeSet<&String> = seen.audited.iter().chain(&seen.notified).collect();
        Tally {
            committed: committed.len(),
            rolled_back: rolled_back.len(),
            events: rows.len(),
            committed_with_one_event: committed
                .iter()
                .filter(|n| per_invoice.get(n.as_str()) == Some(&1))
                .count(),
            published: status_is("PROCESSED"),
            published_and_notified: rows
                .iter()
                .filter(|r| r.status == "PROCESSED")
                .filter(|r| {
                    r.aggregate_id
                        .as_ref()
                        .is_some_and(|id| seen.notified.contains(id))
                })
                .count(),
            failed: status_is("FAILED"),
            outstanding: status_is("PENDING") + status_is("PROCESSING"),
            rolled_back_in_outbox: rolled_back
                .iter()
                .filter(|n| per_invoice.contains_key(n.as_str()))
                .count(),
            rolled_back_published: rolled_back.iter().filter(|n| seen_any.contains(n)).count(),
        }
    }

    /// Nothing lost: one event per committed invoice, each published or FAILED.
    pub(super) fn nothing_lost(&self) -> bool {
        self.events == self.committed
            && self.committed_with_one_event == self.committed
            && self.published + self.failed == self.committed
            && self.outstanding == 0
            && self.published_and_notified == self.published
    }

    /// No ghost: no rolled-back invoice has an event, or reached a handler.
    pub(super) fn no_ghost(&self) -> bool {
        self.rolled_back_in_outbox == 0 && self.rolled_back_published == 0
    }

    /// The tally as printed.
    pub(super) fn render(&self) -> String {
        let mark = |ok: bool| if ok { "✔" } else { "✘" };
        let line = |label: &str, n: usize, note: String| {
            let dots = ".".repeat(44usize.saturating_sub(label.chars().count()));
            format!("  {label} {dots} {n:>3}  {note}")
                .trim_end()
                .to_owned()
                + "\n"
        };
        let mut out = String::from("Tally\n");
        out += &line("committed invoices", self.committed, String::new());
        out += &line(
            "events in the outbox",
            self.events,
            format!(
                "{} one per committed invoice",
                mark(
                    self.events == self.committed
                        && self.committed_with_one_event == self.committed
                )
            ),
        );
        out += &line(
            "published (PROCESSED)",
            self.published,
            format!(
                "{} each one reached the notification handler",
                mark(self.published_and_notified == self.published)
            ),
        );
        out += &line(
            "failed (FAILED, kept for an operator)",
            self.failed,
            String::new(),
        );
        out += &line(
            "published + failed",
            self.published + self.failed,
            format!(
                "{} equals committed invoices: nothing lost",
                mark(self.published + self.failed == self.committed)
            ),
        );
        out += &line(
            "still pending",
            self.outstanding,
            mark(self.outstanding == 0).to_owned(),
        );
        out += &line("rolled-back invoices", self.rolled_back, String::new());
        out += &line(
            "rolled-back invoices published",
            self.rolled_back_published,
            format!(
                "{} no ghost ({} of their events in the outbox)",
                mark(self.no_ghost()),
                self.rolled_back_in_outbox
            ),
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: i64, invoice: &str, status: &str) -> OutboxRow {
        OutboxRow {
            id,
            aggregate_id: Some(invoice.to_owned()),
            status: status.to_owned(),
            retry_count: 0,
            last_error: None,
        }
    }

    fn set(items: &[&str]) -> BTreeSet<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_clean_run_holds_and_a_lost_or_ghost_event_does_not() {
        let committed = set(&["A", "B"]);
        let rolled_back = set(&["X"]);
        let seen = Seen {
            notified: set(&["A"]),
            audited: set(&["A", "B"]),
            ..Seen::default()
        };
        let rows = vec![row(1, "A", "PROCESSED"), row(2, "B", "FAILED")];
        let t = Tally::count(&committed, &rolled_back, &rows, &seen);
        assert!(t.nothing_lost() && t.no_ghost(), "{t:?}");
        assert!(t.render().contains("published + failed"));

        let lost = Tally::count(&committed, &rolled_back, &rows[..1], &seen);
        assert!(!lost.nothing_lost());

        let pending = vec![row(1, "A", "PROCESSED"), row(2, "B", "PENDING")];
        assert!(!Tally::count(&committed, &rolled_back, &pending, &seen).nothing_lost());

        let ghost_seen = Seen {
            audited: set(&["A", "B", "X"]),
            ..seen
        };
        let ghost = Tally::count(&committed, &rolled_back, &rows, &ghost_seen);
        assert!(!ghost.no_ghost());
        assert!(ghost.render().contains('✘'));
    }
}
