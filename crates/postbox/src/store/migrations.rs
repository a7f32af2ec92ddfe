//! The one migration runner: every store keeps its migrations as numbered SQL files
//! (`sql/<dialect>/migrations/`), recorded by file name in a history table of its own (never
//! the application's), and applies the missing ones in order, inside the caller's transaction,
//! so that a failed script leaves nothing half done. A shipped migration never changes
//! (`sql/checksums.txt`); what changes from release to release lives in `sql/postgres/functions/`.

use sqlx::{AssertSqlSafe, Database, Decode, Encode, Executor, Type};

use crate::error::Result;

/// One migration: its name in the history table (its file's name without `.sql`), the name an
/// earlier release recorded it under, and its SQL (a template where a store renders the schema
/// in).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Migration {
    pub(crate) name: &'static str,
    pub(crate) was: Option<&'static str>,
    pub(crate) sql: &'static str,
}

/// `migration!("postgres", "0001_outbox_events", was "outbox_0001_events")`: the migration of
/// `sql/postgres/migrations/0001_outbox_events.sql`, named after its file, and recorded as
/// `outbox_0001_events` by releases before the SQL tree (renamed in place on the next migrate).
macro_rules! migration {
    ($dialect:literal, $name:literal) => {
        $crate::store::migrations::Migration {
            name: $name,
            was: None,
            sql: include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/sql/",
                $dialect,
                "/migrations/",
                $name,
                ".sql"
            )),
        }
    };
    ($dialect:literal, $name:literal, was $was:literal) => {
        $crate::store::migrations::Migration {
            was: Some($was),
            ..$crate::store::migrations::migration!($dialect, $name)
        }
    };
}
pub(crate) use migration;

/// The statements of a dialect's history table (`history_*.sql`), rendered for the schema.
#[derive(Clone, Debug)]
pub(crate) struct History {
    /// Creates the table if missing.
    pub(crate) create: String,
    /// Reads the names applied.
    pub(crate) read: String,
    /// Records one name (its one parameter).
    pub(crate) record: String,
    /// Renames one record: the new name, then the old one.
    pub(crate) rename: String,
}

/// Creates the history table if missing, renames the records of earlier releases, then applies
/// each of `migrations` it does not record yet, rendered by `render`, recording it. Returns the
/// names applied.
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
    let mut done: Vec<String> = sqlx::query_as(AssertSqlSafe(history.read.clone()))
        .fetch_all(&mut *conn)
        .await?
        .into_iter()
        .map(|(name,)| name)
        .collect();
    for migration in migrations {
        let Some(was) = migration.was else { continue };
        if done.iter().any(|d| d == was) && !done.iter().any(|d| d == migration.name) {
            sqlx::query(AssertSqlSafe(history.rename.clone()))
                .bind(migration.name)
                .bind(was)
                .execute(&mut *conn)
                .await?;
            done.push(migration.name.to_owned());
        }
    }
    let mut applied = Vec::new();
    for migration in migrations {
        if done.iter().any(|d| d == migration.name) {
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

/// Asserts that `listed` holds every file of `sql/<dialect>/migrations/` once, in the order of
/// their numbers, and that the numbers run 1, 2, 3… without a gap or a repeat.
#[cfg(test)]
pub(crate) fn assert_listed(dialect: &str, listed: &[Migration]) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("sql")
        .join(dialect)
        .join("migrations");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .expect("the migrations folder")
        .map(|entry| {
            let name = entry.expect("an entry").file_name();
            let name = name.to_str().expect("a UTF-8 name").to_owned();
            name.strip_suffix(".sql")
                .unwrap_or_else(|| panic!("{name}: not an .sql file"))
                .to_owned()
        })
        .collect();
    files.sort();
    for (n, file) in files.iter().enumerate() {
        let number: usize = file[..4]
            .parse()
            .unwrap_or_else(|_| panic!("{file}: no four-digit number first"));
        assert_eq!(
            number,
            n + 1,
            "{dialect}: {file} should be number {}",
            n + 1
        );
    }
    let mut names: Vec<&str> = listed.iter().map(|m| m.name).collect();
    names.sort_unstable();
    assert_eq!(names, files, "{dialect}: the files and the list differ");
    let in_order = listed.windows(2).all(|w| w[0].name < w[1].name);
    assert!(
        in_order,
        "{dialect}: listed out of the order of their numbers"
    );
}
