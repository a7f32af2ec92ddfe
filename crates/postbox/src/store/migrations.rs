//! The one migration runner: every store keeps its migrations as named SQL scripts, recorded in
//! a history table of its own (never the application's), and applies the missing ones in order,
//! inside the caller's transaction, so that a failed script leaves nothing half done.

use sqlx::{AssertSqlSafe, Database, Decode, Executor, Type};

use crate::error::Result;

/// One migration: its name in the history table, and its SQL (a template where a store renders
/// the schema in).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Migration {
    pub(crate) name: &'static str,
    pub(crate) sql: &'static str,
}

/// Creates the history table `history` (a qualified, quoted name) if missing, then applies each
/// of `migrations` it does not record yet, rendered by `render`, recording it. Returns the names
/// applied.
pub(crate) async fn apply<DB>(
    conn: &mut DB::Connection,
    history: &str,
    timestamp_column: &str,
    migrations: &[Migration],
    render: impl Fn(&str) -> String,
) -> Result<Vec<String>>
where
    DB: Database,
    for<'e> &'e mut DB::Connection: Executor<'e, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    (String,): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    // Safe: the table name is a quoted identifier of a validated schema and a constant.
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE TABLE IF NOT EXISTS {history} (
             name VARCHAR(255) PRIMARY KEY,
             applied_at {timestamp_column}
         )"
    )))
    .execute(&mut *conn)
    .await?;
    let done: Vec<(String,)> = sqlx::query_as(AssertSqlSafe(format!("SELECT name FROM {history}")))
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
        // Migration names are constants of this crate: plain identifiers, no quotes.
        sqlx::raw_sql(AssertSqlSafe(format!(
            "INSERT INTO {history} (name) VALUES ('{}')",
            migration.name
        )))
        .execute(&mut *conn)
        .await?;
        applied.push(migration.name.to_owned());
    }
    Ok(applied)
}
