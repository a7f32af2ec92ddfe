//! The SQL tree (`sql/<dialect>/{migrations,queries,functions}`, described in `sql/README.md`):
//! a shipped migration never changes, and a PostgreSQL function is installed again exactly when
//! its file changed.
//!
//! `sql/migrations.sha256` lists the checksum of every shipped migration (`sha256sum -c` reads
//! it). A new migration is added to it with
//!
//! ```text
//! POSTBOX_UPDATE_MIGRATIONS=1 cargo test -p postbox --all-features sql_tree
//! ```
//!
//! which appends lines and never changes one: a migration that changed after it shipped fails
//! until the change is undone (and made in a new migration, or in the function's file).

use std::collections::BTreeMap;
use std::path::Path;

use sha2::{Digest, Sha256};

const MANIFEST: &str = "sql/migrations.sha256";
const UPDATE: &str = "POSTBOX_UPDATE_MIGRATIONS=1 cargo test -p postbox --all-features sql_tree";

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn a_shipped_migration_never_changes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(root.join(MANIFEST)).expect("the manifest");
    let mut recorded = BTreeMap::new();
    for line in manifest.lines() {
        let (sum, path) = line
            .split_once("  ")
            .unwrap_or_else(|| panic!("{MANIFEST}: not `<sha256>  <path>`: {line}"));
        assert!(
            recorded.insert(path.to_owned(), sum.to_owned()).is_none(),
            "{MANIFEST}: {path} twice"
        );
    }
    let mut files = Vec::new();
    for dialect in ["postgres", "mysql", "sqlite"] {
        let dir = root.join("sql").join(dialect).join("migrations");
        for entry in std::fs::read_dir(&dir).expect("a migrations folder") {
            let name = entry.expect("an entry").file_name();
            files.push(format!("{dialect}/migrations/{}", name.to_string_lossy()));
        }
    }
    files.sort();
    let mut changed = Vec::new();
    let mut new = Vec::new();
    for path in &files {
        let sum = sha256(&std::fs::read(root.join("sql").join(path)).expect("a migration"));
        match recorded.remove(path) {
            Some(shipped) if shipped == sum => {}
            Some(_) => changed.push(path.clone()),
            None => new.push(format!("{sum}  {path}")),
        }
    }
    assert!(
        changed.is_empty(),
        "shipped migrations changed: {changed:?}. Undo the change and make it in a new \
         migration (or, for a PostgreSQL function, in sql/postgres/functions/)"
    );
    assert!(
        recorded.is_empty(),
        "shipped migrations are gone: {:?}",
        recorded.keys()
    );
    if !new.is_empty() {
        if std::env::var_os("POSTBOX_UPDATE_MIGRATIONS").is_some() {
            let mut text = manifest;
            for line in &new {
                text.push_str(line);
                text.push('\n');
            }
            std::fs::write(root.join(MANIFEST), text).expect("write the manifest");
        } else {
            panic!("new migrations not in {MANIFEST}: {new:?}; add them with `{UPDATE}`");
        }
    }
}

/// Each PostgreSQL function is installed from its file once, and again only when the file's
/// checksum differs from the one the schema records: a release that changes a function changes
/// it on the next `postbox migrate`, and a migrate that changes nothing touches none.
#[cfg(feature = "postgres")]
#[tokio::test]
async fn a_postgresql_function_is_installed_again_only_when_its_file_changed() {
    use postbox::PgStore;
    use postbox_testkit::TestDb;

    let db = TestDb::new().await;
    let store = PgStore::new(db.pool().clone());
    let first = postbox::migrate(&store).await.expect("migrate");
    assert!(
        first
            .iter()
            .any(|a| a.ends_with(": function postbox_claim")),
        "a new schema gets every function from its file: {first:?}"
    );
    let recorded: i64 = sqlx::query_scalar("SELECT count(*) FROM postbox_functions")
        .fetch_one(db.pool())
        .await
        .expect("postbox_functions");
    let files =
        std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("sql/postgres/functions"))
            .expect("the functions folder")
            .count();
    assert_eq!(recorded as usize, files, "one record per function file");
    let again = postbox::migrate(&store).await.expect("migrate again");
    assert!(
        again.is_empty(),
        "nothing changed, nothing installed: {again:?}"
    );

    // As if a new release changed the floor's file: the schema holds another body (one that
    // would stall every relay) and the checksum of another file.
    sqlx::raw_sql(
        "CREATE OR REPLACE FUNCTION postbox_floor(from_id bigint, up_to bigint)
         RETURNS bigint LANGUAGE sql AS 'SELECT 0::bigint';
         UPDATE postbox_functions SET checksum = repeat('0', 64) WHERE name = 'postbox_floor'",
    )
    .execute(db.pool())
    .await
    .expect("an older postbox_floor");
    let upgraded = postbox::migrate(&store)
        .await
        .expect("migrate after the change");
    assert_eq!(upgraded, ["public: function postbox_floor"]);
    let floor: i64 = sqlx::query_scalar("SELECT postbox_floor(0, 1000)")
        .fetch_one(db.pool())
        .await
        .expect("the floor");
    assert_eq!(
        floor, 1000,
        "the file's body again: nothing in flight, the floor is up_to"
    );
}
