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
