//! PostgreSQL functions (`sql/postgres/functions/`): each defined once, in a file of its own,
//! and installed in a schema with `CREATE OR REPLACE` when its file's checksum differs from the
//! one recorded in the schema's `postbox_functions` table. Migrations hold what must change once
//! (tables, indexes, data); a function that changes from release to release changes in place.

use sha2::{Digest, Sha256};
use sqlx::postgres::PgConnection;

use super::sql::{render, safe};
use crate::error::Result;
use crate::schema::SchemaName;

/// One function's file: the function's name (the file's), and its SQL template.
#[derive(Clone, Copy, Debug)]
pub(super) struct Function {
    pub(super) name: &'static str,
    pub(super) sql: &'static str,
}

macro_rules! function {
    ($name:literal) => {
        Function {
            name: $name,
            sql: include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/sql/postgres/functions/",
                $name,
                ".sql"
            )),
        }
    };
}

/// Every function, in the order they are installed: a SQL (not PL/pgSQL) function's body is
/// checked when it is created, so what it calls comes first.
pub(super) const FUNCTIONS: &[Function] = &[
    function!("postbox_parse_bytes"),
    function!("postbox_parse_millis"),
    function!("postbox_payload_limit"),
    function!("postbox_event_key"),
    function!("postbox_notify"),
    function!("postbox_enqueue"),
    function!("postbox_enqueue_many"),
    function!("postbox_backlog"),
    function!("postbox_status"),
    function!("postbox_archive_partition"),
    function!("postbox_archive"),
    function!("postbox_archive_count"),
    function!("postbox_archive_purge"),
    function!("postbox_is_ordered"),
    function!("postbox_waiting"),
    function!("postbox_waits_in_order"),
    function!("postbox_id_mark"),
    function!("postbox_id_truncate"),
    function!("postbox_id_sequence"),
    function!("postbox_horizon"),
    function!("postbox_floor"),
    function!("postbox_claim_take"),
    function!("postbox_claim"),
    function!("postbox_inbox_receive"),
];

/// The SHA-256 of a function's file, in hex: what `postbox_functions` records.
pub(super) fn checksum(sql: &str) -> String {
    Sha256::digest(sql.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Installs in `schema` every function whose file changed since it was last installed there (or
/// never was), on `conn` inside the migrations' transaction and lock. Returns `function <name>`
/// for each one installed.
pub(super) async fn install(conn: &mut PgConnection, schema: &SchemaName) -> Result<Vec<String>> {
    let read = render(
        include_str!("../../../sql/postgres/queries/functions_read.sql"),
        schema,
    );
    let installed: Vec<(String, String)> =
        sqlx::query_as(safe(&read)).fetch_all(&mut *conn).await?;
    let record = render(
        include_str!("../../../sql/postgres/queries/function_record.sql"),
        schema,
    );
    let mut done = Vec::new();
    for function in FUNCTIONS {
        let sum = checksum(function.sql);
        if installed
            .iter()
            .any(|(name, recorded)| name == function.name && *recorded == sum)
        {
            continue;
        }
        sqlx::raw_sql(safe(&render(function.sql, schema)))
            .execute(&mut *conn)
            .await?;
        sqlx::query(safe(&record))
            .bind(function.name)
            .bind(&sum)
            .execute(&mut *conn)
            .await?;
        done.push(format!("function {}", function.name));
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_function_file_is_installed_and_defines_the_function_it_is_named_for() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("sql/postgres/functions");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .expect("the functions folder")
            .map(|e| {
                let name = e.expect("an entry").file_name();
                name.to_string_lossy().trim_end_matches(".sql").to_owned()
            })
            .collect();
        files.sort();
        let mut listed: Vec<&str> = FUNCTIONS.iter().map(|f| f.name).collect();
        listed.sort_unstable();
        assert_eq!(listed, files, "the files and FUNCTIONS differ");
        for function in FUNCTIONS {
            let own = format!("CREATE OR REPLACE FUNCTION {{schema}}.{}(", function.name);
            assert!(
                function.sql.contains(&own),
                "{}: {own} missing",
                function.name
            );
            let creates = function.sql.matches("CREATE OR REPLACE FUNCTION").count();
            let others = function.sql.matches("CREATE FUNCTION").count();
            assert_eq!(others, 0, "{}: CREATE without OR REPLACE", function.name);
            assert_eq!(
                creates,
                function.sql.matches(&own).count(),
                "{}: defines another function too",
                function.name
            );
        }
    }

    #[test]
    fn a_checksum_is_the_files_sha256_in_hex() {
        assert_eq!(
            checksum("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
