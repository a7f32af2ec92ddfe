//! No secret shape reaches a log line, `postbox config`, an error message or `last_error`.
//!
//! Generated passwords hold `/`, `?`, `#`, `@`; webhook URLs carry `?token=`; libpq strings say
//! `password=`. Each is given to the binary where an operator would, and every output it
//! produces is searched for it.

use crate::support::{Pg, Running, postbox, run};

/// Secrets that must never be printed, each unique so a leak names its source.
const DB_PASSWORD: &str = "Db/pa?ss#w0rd@1";
const AMQP_PASSWORD: &str = "Am/qp?pa#ss2";
const WEBHOOK_TOKEN: &str = "Wh0kTok3nX9";
const WEBHOOK_SECRET: &str = "sig-s3cret/#?";

fn assert_clean(what: &str, text: &str) {
    for secret in [DB_PASSWORD, AMQP_PASSWORD, WEBHOOK_TOKEN, WEBHOOK_SECRET] {
        assert!(!text.contains(secret), "{what} shows {secret:?}:\n{text}");
    }
}

/// A database URL whose password has every awkward character (PostgreSQL here trusts loopback,
/// so any password connects).
fn db_url_with_password(pg: &Pg) -> String {
    let url = pg.db.url();
    let encoded: String = DB_PASSWORD
        .chars()
        .map(|c| match c {
            '/' => "%2F".to_owned(),
            '?' => "%3F".to_owned(),
            '#' => "%23".to_owned(),
            '@' => "%40".to_owned(),
            c => c.to_string(),
        })
        .collect();
    url.replacen(
        "postgres://postgres@",
        &format!("postgres://postgres:{encoded}@"),
        1,
    )
}

#[tokio::test]
async fn no_secret_reaches_config_logs_errors_or_last_error() {
    let pg = Pg::new().await;
    pg.ok(&["migrate"]);

    // `postbox config` with every secret set the way an operator would.
    let mut config = postbox(pg.dir.path(), &["config"]);
    config
        .env("POSTBOX_DATABASE_URL", db_url_with_password(&pg))
        .env("POSTBOX_SINK", "amqp")
        .env(
            "POSTBOX_SINK_URL",
            format!("amqp://guest:{AMQP_PASSWORD}@127.0.0.1:1/%2f"),
        )
        .env("POSTBOX_TOPIC", "events");
    let out = run(config);
    assert!(out.status.success(), "{}", out.stderr);
    assert_clean("postbox config", &format!("{}{}", out.stdout, out.stderr));

    // Several databases (database_urls): shown hidden too, and a relay over them logs none.
    let urls = format!("{},sqlite:shard.db", db_url_with_password(&pg));
    let mut config = postbox(pg.dir.path(), &["config"]);
    config.env("POSTBOX_DATABASE_URLS", &urls);
    let out = run(config);
    assert!(out.status.success(), "{}", out.stderr);
    assert!(out.stdout.contains("database_urls"), "{}", out.stdout);
    assert_clean("postbox config (database_urls)", &out.stdout);
    let mut relay = postbox(
        pg.dir.path(),
        &[
            "relay",
            "--drain",
            "--migrate",
            "--sink",
            "null",
            "--log-level",
            "debug",
        ],
    );
    relay.env("POSTBOX_DATABASE_URLS", &urls);
    let out = run(relay);
    assert!(out.status.success(), "{}", out.stderr);
    assert_clean(
        "a relay over database_urls",
        &format!("{}{}", out.stdout, out.stderr),
    );

    // Unparseable URLs with raw (unencoded) secrets: the errors name the URL, hidden.
    for url in [
        format!("postgres://postgres:{DB_PASSWORD}@127.0.0.1:99999/x"),
        format!("host=127.0.0.1 user=postgres password={DB_PASSWORD}"),
    ] {
        let mut status = postbox(pg.dir.path(), &["status"]);
        status.env("POSTBOX_DATABASE_URL", &url);
        let out = run(status);
        assert!(!out.status.success());
        assert_clean("an invalid database URL's error", &out.stderr);
    }
    let mut relay = postbox(pg.dir.path(), &["relay", "--drain", "--log-level", "debug"]);
    relay
        .env("POSTBOX_DATABASE_URL", pg.db.url())
        .env("POSTBOX_SINK", "amqp")
        .env(
            "POSTBOX_SINK_URL",
            format!("amqp://guest:{AMQP_PASSWORD}@/%2f"),
        )
        .env("POSTBOX_TOPIC", "events");
    let out = run(relay);
    assert_clean(
        "a bad broker URL's error",
        &format!("{}{}", out.stdout, out.stderr),
    );

    // A webhook nobody listens to, with a token in its URL and a signing secret: the relay's
    // debug log and the events' last_error stay clean.
    let mut relay = pg.cmd(&["relay", "--log-level", "debug"]);
    relay
        .env("POSTBOX_SINK", "webhook")
        .env(
            "POSTBOX_SINK_URL",
            format!("http://127.0.0.1:1/hooks/{{event_type}}?token={WEBHOOK_TOKEN}"),
        )
        .env("POSTBOX_WEBHOOK_SECRET", WEBHOOK_SECRET)
        .env("POSTBOX_MAX_RETRIES", "1")
        .env("POSTBOX_PUBLISH_TIMEOUT", "1s");
    let child = Running::spawn(relay);
    let last_errors = || async {
        let errors: Vec<Option<String>> =
            sqlx::query_scalar("SELECT last_error FROM outbox_events ORDER BY id")
                .fetch_all(pg.db.pool())
                .await
                .expect("last_error");
        errors
    };
    postbox_testkit::wait_until(
        "every event has a last_error",
        crate::support::DEADLINE,
        || async { last_errors().await.iter().all(Option::is_some) },
    )
    .await;
    let errors: Vec<String> = last_errors().await.into_iter().flatten().collect();
    child.signal("TERM");
    let finished = child.finish(std::time::Duration::from_secs(30));
    let logs = format!("{}{}", finished.stdout, finished.stderr);
    for error in &errors {
        assert!(error.contains("token=***"), "{error}");
        assert_clean("last_error", error);
    }
    assert_clean("the relay's debug log", &logs);
}
