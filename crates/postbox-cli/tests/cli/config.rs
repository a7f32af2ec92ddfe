//! Configuration precedence and errors, through the binary (`postbox config`).

use crate::support::{postbox, run};

/// The line of `postbox config` output for `key`.
fn value_of(stdout: &str, key: &str) -> String {
    stdout
        .lines()
        .find(|l| l.starts_with(&format!("{key} ")))
        .unwrap_or_else(|| panic!("{key} missing:\n{stdout}"))
        .to_owned()
}

#[test]
fn flag_beats_environment_beats_file_beats_default() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("postbox.toml"),
        "batch_size = 10\nlease = \"45s\"\nconcurrency = 8\n",
    )
    .expect("write postbox.toml");

    let file_only = run(postbox(dir.path(), &["config"]));
    assert!(file_only.status.success(), "{}", file_only.stderr);
    assert!(value_of(&file_only.stdout, "batch_size").contains("= 10"));
    assert!(value_of(&file_only.stdout, "batch_size").contains("postbox.toml"));
    assert!(value_of(&file_only.stdout, "poll_interval").contains("built-in default"));

    let mut with_env = postbox(dir.path(), &["config"]);
    with_env.env("POSTBOX_BATCH_SIZE", "20");
    let with_env = run(with_env);
    assert!(value_of(&with_env.stdout, "batch_size").contains("= 20  # POSTBOX_BATCH_SIZE"));
    assert!(value_of(&with_env.stdout, "lease").contains("\"45s\""));

    let mut with_flag = postbox(dir.path(), &["config", "--batch-size", "30"]);
    with_flag.env("POSTBOX_BATCH_SIZE", "20");
    let with_flag = run(with_flag);
    assert!(value_of(&with_flag.stdout, "batch_size").contains("= 30  # --batch-size"));
    assert!(value_of(&with_flag.stdout, "concurrency").contains("= 8"));
}

#[test]
fn invalid_configuration_names_the_key_and_fails() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cmd = postbox(dir.path(), &["relay", "--drain"]);
    cmd.env("POSTBOX_BATCH_SIZE", "0");
    let out = run(cmd);
    assert!(!out.status.success());
    assert!(out.stderr.contains("batch_size"), "{}", out.stderr);

    let out = run(postbox(dir.path(), &["relay", "--lease", "1s"]));
    assert!(!out.status.success());
    assert!(
        out.stderr.contains("publish_timeout") && out.stderr.contains("--lease"),
        "{}",
        out.stderr
    );

    std::fs::write(dir.path().join("postbox.toml"), "batch_sise = 10\n").expect("write");
    let out = run(postbox(dir.path(), &["status"]));
    assert!(!out.status.success());
    assert!(out.stderr.contains("batch_sise"), "{}", out.stderr);

    let out = run(postbox(dir.path(), &["status", "--config", "nowhere.toml"]));
    assert!(!out.status.success());
    assert!(out.stderr.contains("nowhere.toml"), "{}", out.stderr);
}

#[test]
fn every_subcommand_has_help() {
    let dir = tempfile::tempdir().expect("tempdir");
    for args in [
        &["--help"][..],
        &["migrate", "--help"],
        &["relay", "--help"],
        &["status", "--help"],
        &["tenants", "--help"],
        &["tenants", "add", "--help"],
        &["tenants", "list", "--help"],
        &["tenants", "suspend", "--help"],
        &["tenants", "resume", "--help"],
        &["demo", "--help"],
        &["config", "--help"],
        #[cfg(feature = "bench")]
        &["bench", "--help"],
    ] {
        let out = run(postbox(dir.path(), args));
        assert!(out.status.success(), "{args:?}");
        assert!(
            out.stdout.contains("Usage: postbox"),
            "{args:?}: {}",
            out.stdout
        );
    }
    #[cfg(feature = "bench")]
    {
        let bench = run(postbox(dir.path(), &["bench", "--help"])).stdout;
        assert!(bench.contains("--vacuum-threshold"), "{bench}");
    }
    let root = run(postbox(dir.path(), &["--help"])).stdout;
    for key in [
        "batch_size",
        "POSTBOX_LEASE",
        "default \"5s\"",
        "payload_limit",
    ] {
        assert!(root.contains(key), "{key} not in --help");
    }
}

#[test]
fn config_says_which_retry_policy_an_event_type_gets() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("postbox.toml"),
        r#"
[[retry_policies]]
event_type = "Validation*"
max_retries = 1
slow_lane = false

[[retry_policies]]
event_type = "Partner.*"
max_retries = 20
backoff_cap = "1h"
"#,
    )
    .expect("write postbox.toml");
    let out = run(postbox(
        dir.path(),
        &["config", "--event-type", "Partner.OrderSent"],
    ));
    assert!(out.status.success(), "{}", out.stderr);
    assert!(
        out.stdout.contains(
            "1: event_type \"Validation*\": tries 1, backoff min(5m, 1s x 2^n), slow lane off"
        ),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains(
            "# event type \"Partner.OrderSent\": [[retry_policies]] event_type = \"Partner.*\""
        ),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains("tries 20, backoff min(1h, 1s x 2^n), slow lane on"),
        "{}",
        out.stdout
    );
    let out = run(postbox(
        dir.path(),
        &["config", "--event-type", "OrderPlaced"],
    ));
    assert!(
        out.stdout.contains("no [[retry_policies]] table matches"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("the event's own max_retries"),
        "{}",
        out.stdout
    );

    // A bad table is refused, naming what is wrong.
    for (table, needle) in [
        ("event_type = \"A[\"\n", "event_type"),
        (
            "event_type = \"A*\"\nmax_retries = 0\n",
            "max_retries must be 1 or more",
        ),
        (
            "event_type = \"A*\"\nbackoff_base = \"1h\"\nbackoff_cap = \"1s\"\n",
            "backoff base",
        ),
        ("event_type = \"A*\"\nretries = 3\n", "retries"),
    ] {
        std::fs::write(
            dir.path().join("postbox.toml"),
            format!("[[retry_policies]]\n{table}"),
        )
        .expect("write postbox.toml");
        let out = run(postbox(dir.path(), &["config"]));
        assert!(!out.status.success(), "{table}");
        assert!(
            out.stderr.contains("retry_policies") && out.stderr.contains(needle),
            "{table}: {}",
            out.stderr
        );
    }
}
