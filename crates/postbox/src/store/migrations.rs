//! The one migration runner: every store keeps its migrations as named SQL scripts, recorded in
//! a history table of its own (never the application's), and applies the missing ones in order,
//! inside the caller's transaction, so that a failed script leaves nothing half done.

use sqlx::{AssertSqlSafe, Database, Decode, Encode, Executor, Type};

use crate::error::Result;

/// One migration: its name in the history table, and its SQL (a template where a store renders
/// the schema in).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Migration {
    pub(crate) name: &'static str,
    pub(crate) sql: &'static str,
}

/// The statements of a dialect's history table (`history_*.sql`), rendered for the schema.
#[derive(Clone, Debug)]
pub(crate) struct History {
    /// Creates the table if missing.
    pub(crate) create: String,
    /// Reads the names applied.
    pub(crate) read: String,
    /// Records one name (its one parameter).
    pub(crate) record: String,
}

/// Creates the history table if missing, then applies each of `migrations` it does not record
/// yet, rendered by `render`, recording it. Returns the names applied.
pub(crate) async fn apply<DB>(
    conn: &mut DB::Connection,
    history: &History,
    migrations: &[Migration],
    render: impl Fn(&str) -> String,
) -> Result<Vec<String>>
where
    DB: Database,
    for<'e> &'e mut DB::Connection: Executor<'e, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    (String,): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    // Safe: statements of this crate, the only dynamic part a quoted identifier of a validated
    // schema.
    sqlx::raw_sql(AssertSqlSafe(history.create.clone()))
        .execute(&mut *conn)
        .await?;
    let done: Vec<(String,)> = sqlx::query_as(AssertSqlSafe(history.read.clone()))
        .fetch_all(&mut *conn)
        .await?;
    let mut applied = Vec::new();
    for migration in migrations {
        if done.iter().any(|(d,)| d == migration.name) {
            continue;
        }
        sqlx::raw_sql(AssertSqlSafe(render(migration.sql)))
            .execute(&mut *conn)
            .await?;
        sqlx::query(AssertSqlSafe(history.record.clone()))
            .bind(migration.name)
            .execute(&mut *conn)
            .await?;
        applied.push(migration.name.to_owned());
    }
    Ok(applied)
}
