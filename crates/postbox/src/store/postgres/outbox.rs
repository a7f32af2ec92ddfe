//! The PostgreSQL statements of an [`Outbox`]: one event, many, and an event inside the caller's
//! own statement ([`Outbox::enqueue_with`]), each with and without the debounced notification.

use std::sync::Arc;

use chrono::Utc;
use sqlx::postgres::{PgArguments, PgConnection};
use sqlx::query::Query;
use sqlx::{Arguments, AssertSqlSafe, Execute, Postgres};

use super::sql::{max_placeholder, render, safe};
use crate::error::{Error, Result};
use crate::event::{Enqueued, Event};
use crate::outbox::{Checked, Outbox};
use crate::schema::SchemaName;

/// The statements of one outbox, rendered for its schema once.
pub(crate) struct Prepared {
    one: Arc<str>,
    one_notify: Arc<str>,
    many: Arc<str>,
    many_notify: Arc<str>,
    with: Wrapped,
    with_notify: Wrapped,
}

impl Prepared {
    pub(crate) fn new(schema: &SchemaName) -> Self {
        let with = render(
            include_str!("../../../sql/postgres/queries/enqueue_with.sql"),
            schema,
        );
        Prepared {
            one: render(
                include_str!("../../../sql/postgres/queries/enqueue.sql"),
                schema,
            ),
            one_notify: render(
                include_str!("../../../sql/postgres/queries/enqueue_notify.sql"),
                schema,
            ),
            many: render(
                include_str!("../../../sql/postgres/queries/enqueue_many.sql"),
                schema,
            ),
            many_notify: render(
                include_str!("../../../sql/postgres/queries/enqueue_many_notify.sql"),
                schema,
            ),
            with_notify: Wrapped::new(&with),
            with: Wrapped::new(with.split("-- postbox:notify").next().unwrap_or(&with)),
        }
    }
}

/// The statement to run, `plain` or `notifying`, and the notification payload with the latter.
fn statement<'o>(
    outbox: &'o Outbox,
    plain: &Arc<str>,
    notifying: &Arc<str>,
) -> (AssertSqlSafe<Arc<str>>, Option<&'o str>) {
    match outbox.notify_payload() {
        Some(schema) => (safe(notifying), Some(schema)),
        None => (safe(plain), None),
    }
}

/// One event; `None` when its idempotency key exists already.
pub(crate) async fn insert_one(
    outbox: &Outbox,
    pg: &Prepared,
    conn: &mut PgConnection,
    event: &Checked<'_>,
) -> Result<Option<i64>> {
    let (sql, notify) = statement(outbox, &pg.one, &pg.one_notify);
    let mut args = PgArguments::default();
    event.add_to(&mut args, notify)?;
    let rows: Vec<Option<i64>> = sqlx::query_scalar_with(sql, args)
        .fetch_all(conn)
        .await
        .map_err(|e| outbox.write_error(e, outbox.schema().as_str()))?;
    Ok(rows.into_iter().flatten().next())
}

/// Many events in one multi-row `INSERT`; results in input order.
pub(crate) async fn insert_many(
    outbox: &Outbox,
    pg: &Prepared,
    conn: &mut PgConnection,
    checked: &[Checked<'_>],
) -> Result<Vec<Enqueued>> {
    let keys: Vec<Option<String>> = checked.iter().map(|c| c.key.clone()).collect();
    let col = |f: fn(&Event) -> Option<&str>| -> Vec<Option<&str>> {
        checked.iter().map(|c| f(c.event)).collect()
    };
    let (sql, notify) = statement(outbox, &pg.many, &pg.many_notify);
    let mut query = sqlx::query_as(sql)
        .bind(
            checked
                .iter()
                .map(|c| c.event.event_type.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(col(|e| e.aggregate_type.as_deref()))
        .bind(col(|e| e.aggregate_id.as_deref()))
        .bind(
            checked
                .iter()
                .map(|c| c.event.payload.get())
                .collect::<Vec<_>>(),
        )
        .bind(col(|e| e.event_class.as_deref()))
        .bind(
            checked
                .iter()
                .map(|c| c.event.schema_version)
                .collect::<Vec<_>>(),
        )
        .bind(
            checked
                .iter()
                .map(|c| c.headers.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(&keys)
        .bind(checked.iter().map(|c| c.max_retries).collect::<Vec<_>>());
    if let Some(schema) = notify {
        query = query.bind(schema);
    }
    let rows: Vec<(Option<i64>, Option<String>)> = query
        .fetch_all(conn)
        .await
        .map_err(|e| outbox.write_error(e, outbox.schema().as_str()))?;
    // The NULL row of the notification carries no event.
    let rows = rows.into_iter().filter_map(|(id, key)| Some((id?, key)));
    Ok(match_results(&keys, rows))
}

/// Maps the rows a multi-row insert returned back to its inputs: a keyed event was inserted if
/// its key came back (the first of equal keys wins); unkeyed events were all inserted, and
/// identity values are handed out in input order.
fn match_results(
    keys: &[Option<String>],
    rows: impl IntoIterator<Item = (i64, Option<String>)>,
) -> Vec<Enqueued> {
    let mut by_key = std::collections::HashMap::new();
    let mut unkeyed = Vec::new();
    for (id, key) in rows {
        match key {
            Some(k) => {
                by_key.insert(k, id);
            }
            None => unkeyed.push(id),
        }
    }
    unkeyed.sort_unstable();
    let mut unkeyed = unkeyed.into_iter();
    keys.iter()
        .map(|key| match key {
            Some(k) => by_key
                .remove(k)
                .map_or(Enqueued::Duplicate, Enqueued::Inserted),
            None => unkeyed
                .next()
                .map_or(Enqueued::Duplicate, Enqueued::Inserted),
        })
        .collect()
}

impl Outbox {
    /// **Experimental.** Runs a business `statement` and writes `event` as **one** SQL statement
    /// (PostgreSQL): one round trip to the server for both, where [`enqueue`](Self::enqueue)
    /// after the statement takes two. In a short transaction that round trip is a good part of
    /// what an enqueue costs: 1.07–1.20× the business transactions per second of a separate
    /// `enqueue` in `postbox bench` (`docs/performance.md`).
    ///
    /// Its limits, up front: the statement must modify data (a read-only one is not run at
    /// all); the event is written whatever rows it touched; its own result (rows affected,
    /// `RETURNING`) is not returned; and it is spliced in front of the outbox insert as a `WITH`
    /// query, so Postbox counts its `$N` placeholders with a small scanner to number the event's
    /// after them. It may change or go in a later version; [`enqueue`](Self::enqueue) will not.
    ///
    /// `statement` is a data-modifying statement (`INSERT`, `UPDATE` or `DELETE`) built with
    /// [`sqlx::query()`] and its binds; Postbox runs it as a `WITH` query in front of its own
    /// insert (a `;` at its end is dropped; it may not be followed by a comment). Both happen
    /// or neither: an error in either part (a constraint of your table, say) fails the
    /// statement and writes nothing. Returns what [`enqueue`](Self::enqueue) returns; an
    /// invalid event, and a statement with a placeholder it has no bound value for
    /// ([`Error::InvalidStatement`]), are refused before anything is sent.
    ///
    /// Mind that the event is written whatever rows the statement touched, and that the
    /// statement's own result (rows affected, `RETURNING` rows) is not returned. When the event
    /// depends on them — an `UPDATE … WHERE status = 'open'` that may match nothing — run the
    /// statement and check its result first, then [`enqueue`](Self::enqueue). A statement that
    /// only reads (`SELECT`) is not run at all, as PostgreSQL skips an unreferenced read-only
    /// `WITH` query.
    ///
    /// ```no_run
    /// use postbox::{Event, StoreExt};
    ///
    /// # async fn example(pool: sqlx::PgPool) -> anyhow::Result<()> {
    /// let outbox = postbox::PgStore::new(pool.clone()).outbox();
    /// let mut tx = pool.begin().await?;
    /// let invoice = sqlx::query("INSERT INTO invoices (id, amount_cents) VALUES ($1, $2)")
    ///     .bind(456_i64)
    ///     .bind(1200_i64);
    /// let event = Event::new("InvoiceCreated", &serde_json::json!({"invoice_id": 456}))?
    ///     .aggregate("Invoice", "456");
    /// outbox.enqueue_with(&mut tx, invoice, event).await?; // the invoice row and its event
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub async fn enqueue_with(
        &self,
        conn: &mut PgConnection,
        mut statement: Query<'_, Postgres, PgArguments>,
        event: Event,
    ) -> Result<Enqueued> {
        let event = self.check(&event, Utc::now().date_naive())?;
        let mut args = statement
            .take_arguments()
            .map_err(sqlx::Error::Encode)?
            .unwrap_or_default();
        let business = statement.sql();
        // A trailing `;` would end the WITH query early.
        let business = business
            .as_str()
            .trim_end_matches(|c: char| c == ';' || c.is_whitespace());
        if business.trim_start().is_empty() {
            return Err(Error::InvalidStatement(
                "the business statement given to enqueue_with is empty".into(),
            ));
        }
        // The event's parameters follow the caller's: a placeholder without its value would
        // silently take one of the event's.
        let bound = args.len();
        let used = max_placeholder(business);
        if used > bound {
            return Err(Error::InvalidStatement(format!(
                "the business statement uses ${used} but {bound} value(s) are bound to it; \
                 bind one value per placeholder"
            )));
        }
        let first = bound + 1;
        let notify = self.notify_payload();
        let template = match notify {
            Some(_) => &self.prepared().postgres.with_notify,
            None => &self.prepared().postgres.with,
        };
        // Safe: the caller's own statement, and ours around it with a quoted schema name.
        let sql = AssertSqlSafe(template.render(business, first));
        event.add_to(&mut args, notify)?;
        let rows: Vec<Option<i64>> = sqlx::query_scalar_with(sql, args)
            .fetch_all(conn)
            .await
            .map_err(|e| self.write_error(e, self.schema().as_str()))?;
        Ok(rows
            .into_iter()
            .flatten()
            .next()
            .map_or(Enqueued::Duplicate, Enqueued::Inserted))
    }
}

impl Checked<'_> {
    /// Appends the event's nine columns (and the notification's payload, if any) to `args`, in
    /// the order of the PostgreSQL enqueue statements.
    fn add_to(&self, args: &mut PgArguments, notify: Option<&str>) -> Result<()> {
        let e = self.event;
        let add = |r: std::result::Result<(), sqlx::error::BoxDynError>| {
            r.map_err(|err| Error::Database(sqlx::Error::Encode(err)))
        };
        add(args.add(e.event_type.as_str()))?;
        add(args.add(e.aggregate_type.as_deref()))?;
        add(args.add(e.aggregate_id.as_deref()))?;
        add(args.add(e.payload.get()))?;
        add(args.add(e.event_class.as_deref()))?;
        add(args.add(e.schema_version))?;
        add(args.add(self.headers.as_str()))?;
        add(args.add(self.key.as_deref()))?;
        add(args.add(self.max_retries))?;
        if let Some(schema) = notify {
            add(args.add(schema))?;
        }
        Ok(())
    }
}

/// The statement of [`Outbox::enqueue_with`] for one schema, cut where the caller's statement
/// and the event's parameters go: their numbers depend on how many parameters the caller's
/// statement has, so the text is put together for each call (a few string pushes).
struct Wrapped {
    /// Up to the caller's statement.
    head: String,
    /// After it: text, then the event's parameter number `k` (1-based), in turn.
    pieces: Vec<(String, usize)>,
    /// After the last parameter.
    tail: String,
}

impl Wrapped {
    /// Cuts the rendered template `sql` at `{business}` and at each `{eK}`.
    fn new(sql: &str) -> Self {
        let (head, mut rest) = sql.split_once("{business}").unwrap_or((sql, ""));
        let mut pieces = Vec::new();
        while let Some(at) = rest.find("{e") {
            let after = &rest[at + 2..];
            let Some(close) = after.find('}') else { break };
            let Ok(k) = after[..close].parse::<usize>() else {
                break;
            };
            pieces.push((rest[..at].to_owned(), k));
            rest = &after[close + 1..];
        }
        Wrapped {
            head: head.to_owned(),
            pieces,
            tail: rest.to_owned(),
        }
    }

    /// The statement around `business`, the event's parameters numbered from `first`.
    fn render(&self, business: &str, first: usize) -> String {
        use std::fmt::Write;
        let mut sql = String::with_capacity(self.head.len() + business.len() + 640);
        sql.push_str(&self.head);
        sql.push_str(business);
        for (text, k) in &self.pieces {
            sql.push_str(text);
            // Writing to a String cannot fail.
            let _ = write!(sql, "${}", first + k - 1);
        }
        sql.push_str(&self.tail);
        sql
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wrapped_statement_numbers_the_events_parameters_after_the_callers() {
        let statements = Prepared::new(&SchemaName::new("s_acme").expect("a valid name"));
        let business = "INSERT INTO t (a, b) VALUES ($1, $2)";
        for (wrapped, last) in [(&statements.with, 11), (&statements.with_notify, 12)] {
            let sql = wrapped.render(business, 3);
            assert!(!sql.contains('{'), "a marker is left in\n{sql}");
            assert!(
                sql.contains("(\nINSERT INTO t (a, b) VALUES ($1, $2)\n)"),
                "{sql}"
            );
            assert!(sql.contains(r#""s_acme".outbox_events"#), "{sql}");
            assert!(sql.contains("VALUES ($3, $4, $5, $6::jsonb, $7, $8, $9::jsonb, $10, $11)"));
            assert!(sql.contains(&format!("${last}")) && !sql.contains(&format!("${}", last + 1)));
            assert_eq!(sql.contains("pg_notify"), last == 12, "{sql}");
        }
    }

    #[test]
    fn results_map_back_in_input_order() {
        let keys = vec![
            Some("a".to_owned()),
            None,
            Some("a".to_owned()),
            Some("b".to_owned()),
            None,
        ];
        let rows = vec![(11, Some("a".to_owned())), (13, None), (12, None)];
        assert_eq!(
            match_results(&keys, rows),
            vec![
                Enqueued::Inserted(11),
                Enqueued::Inserted(12),
                Enqueued::Duplicate,
                Enqueued::Duplicate,
                Enqueued::Inserted(13),
            ]
        );
    }
}
