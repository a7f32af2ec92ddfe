//! `postbox demo`: it runs, it ends with the tally, and it cleans up after itself.

use crate::support::{Pg, postbox, run};

/// Checks that the demo narrated the story and ended with a tally that holds.
fn assert_tally(stdout: &str) {
    for expected in [
        "Tally",
        "committed invoices",
        "events in the outbox",
        "published + failed",
        "rolled-back invoices published",
        "The tally holds",
        "FAILED after 3 tries",
        "last_error: mailbox of Soylent does not exist",
        "rolled back",
        "notification failed (try 1 of 3)",
    ] {
        assert!(
            stdout.contains(expected),
            "{expected:?} missing from:\n{stdout}"
        );
    }
    let ghost_line = stdout
        .lines()
        .find(|l| l.contains("rolled-back invoices published"))
        .expect("ghost line");
    assert!(ghost_line.contains(" 0 "), "{ghost_line}");
}

#[test]
fn demo_on_sqlite_exits_0_with_the_tally_and_leaves_nothing_behind() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = run(postbox(dir.path(), &["demo"]));
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    assert_tally(&out.stdout);
    let left: Vec<_> = std::fs::read_dir(dir.path()).expect("read dir").collect();
    assert!(
        left.is_empty(),
        "the demo wrote into the working directory: {left:?}"
    );
}

#[test]
fn demo_keeps_its_database_when_asked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("kept.db");
    let url = file.display().to_string();
    let out = run(postbox(
        dir.path(),
        &["demo", "--keep", "--database-url", &url],
    ));
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    assert!(file.exists());
    assert!(out.stdout.contains("Kept the demo database"));
    // A second run refuses to reuse it.
    let again = run(postbox(dir.path(), &["demo", "--database-url", &url]));
    assert!(!again.status.success());
    assert!(again.stderr.contains("exists"), "{}", again.stderr);
}

#[tokio::test]
async fn demo_on_postgres_uses_a_schema_of_its_own_and_drops_it() {
    let pg = Pg::new().await;
    let out = run(postbox(
        pg.dir.path(),
        &["demo", "--database-url", pg.db.url()],
    ));
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    assert_tally(&out.stdout);
    let left: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM information_schema.schemata WHERE schema_name LIKE 'postbox_demo_%'",
    )
    .fetch_one(pg.db.pool())
    .await
    .expect("count schemas");
    assert_eq!(left, 0, "the demo schema was dropped");
}
