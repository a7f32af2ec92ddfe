//! `postbox relay --admin-listen`: readiness before and after `postbox migrate`, metrics while
//! events flow, the token, a port that cannot be bound; and the deploy files beside the binary.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::support::{Pg, Running, postbox, run};
use postbox_testkit::wait_until;

const TOKEN: &str = "cli-test-token-0123456789";

/// A free loopback port (bound, then released for the relay to take).
pub(crate) fn free_port() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr")
}

/// A plain HTTP/1.1 GET: the status and the body (`None` while nothing listens).
pub(crate) fn get(addr: SocketAddr, path: &str, token: Option<&str>) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split(' ').nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Some((status, body.to_owned()))
}

/// Asks for `path` until `check` holds for the answer, which it returns; panics after 30 s with
/// the last answer.
pub(crate) async fn wait_for(
    addr: SocketAddr,
    path: &str,
    what: &str,
    check: impl Fn(u16, &str) -> bool,
) -> String {
    wait_until(what, Duration::from_secs(30), || async {
        match get(addr, path, None) {
            Some((status, body)) if check(status, &body) => Ok(body),
            last => Err(format!("last answer of {path}: {last:?}")),
        }
    })
    .await
}

#[tokio::test]
async fn the_admin_port_is_ready_once_migrated_and_counts_what_the_relay_publishes() {
    let pg = Pg::new().await;
    let addr = free_port();
    let mut cmd = pg.cmd(&[
        "relay",
        "--sink",
        "null",
        "--poll-interval",
        "100ms",
        "--admin-listen",
        &addr.to_string(),
    ]);
    cmd.env("POSTBOX_ADMIN_TOKEN", TOKEN);
    let relay = Running::spawn(cmd);
    // Up, alive, and not ready: the tables do not exist yet.
    wait_for(addr, "/healthz", "alive", |s, _| s == 200).await;
    let body = wait_for(addr, "/readyz", "not ready before migrating", |s, _| {
        s == 503
    })
    .await;
    assert!(body.contains("not migrated"), "{body}");

    pg.ok(&["migrate"]);
    wait_for(addr, "/readyz", "ready after migrating", |s, b| {
        s == 200 && b == "ready\n"
    })
    .await;
    pg.insert_events("outbox_events", "OrderPlaced", 40, true)
        .await;
    let metrics = wait_for(addr, "/metrics", "40 events counted", |s, b| {
        s == 200
            && b.lines().any(|l| {
                l.starts_with("postbox_events_published_total{tenant=\"default\"}")
                    && l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) >= Some(40.0)
            })
    })
    .await;
    assert!(
        metrics.contains("postbox_publish_latency_seconds_bucket"),
        "{metrics}"
    );
    assert!(metrics.contains("postbox_build_info"), "{metrics}");

    // The API: the token, and nothing without it.
    let (status, body) = get(addr, "/api/status", None).expect("answer");
    assert_eq!(
        (status, body.as_str()),
        (401, r#"{"error":"unauthorized"}"#)
    );
    let (status, body) = get(addr, "/api/status", Some(TOKEN)).expect("answer");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"tenant\":\"default\""), "{body}");

    relay.signal("TERM");
    let out = relay.finish(Duration::from_secs(30));
    assert!(out.status.success(), "{}", out.stderr);
    assert!(!out.stderr.contains(TOKEN), "the token is never logged");
    assert!(
        out.stderr.contains("outbox tables do not exist yet"),
        "{}",
        out.stderr
    );
}

#[tokio::test]
async fn a_relay_whose_admin_port_is_taken_stops_with_the_reason() {
    let pg = Pg::new().await;
    pg.ok(&["migrate"]);
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let out = run(pg.cmd(&["relay", "--sink", "null", "--admin-listen", &addr]));
    assert!(!out.status.success());
    assert!(
        out.stderr.contains("cannot start the admin server"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains(&addr), "{}", out.stderr);
}

#[tokio::test]
async fn a_non_loopback_admin_address_needs_a_token_and_a_weak_token_is_refused() {
    let pg = Pg::new().await;
    let out = run(pg.cmd(&["relay", "--admin-listen", "0.0.0.0:9187"]));
    assert!(!out.status.success());
    assert!(
        out.stderr.contains("admin_listen") && out.stderr.contains("POSTBOX_ADMIN_TOKEN"),
        "{}",
        out.stderr
    );
    // `postbox config` says they are set, never what they are.
    let hook = "https://hooks.example.com/services/T0/B0/s3cr3tp4th";
    let mut cmd = pg.cmd(&["config"]);
    cmd.env("POSTBOX_ADMIN_TOKEN", TOKEN)
        .env("POSTBOX_ALERT_WEBHOOK", hook);
    let out = run(cmd);
    assert!(out.status.success(), "{}", out.stderr);
    assert!(
        !out.stdout.contains(TOKEN) && !out.stdout.contains("s3cr3tp4th"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("admin_token"), "{}", out.stdout);
    let mut cmd = pg.cmd(&["relay", "--admin-listen", "127.0.0.1:0"]);
    cmd.env("POSTBOX_ADMIN_TOKEN", "short");
    let out = run(cmd);
    assert!(!out.status.success());
    assert!(out.stderr.contains("admin_token"), "{}", out.stderr);
    assert!(
        !out.stderr.contains("short\""),
        "the token is not echoed: {}",
        out.stderr
    );
}

/// The systemd unit passes `systemd-analyze verify` with this build's binary in its commands,
/// and every `POSTBOX_*` variable the deploy files set is a configuration key.
#[test]
fn the_deploy_files_name_real_commands_and_keys() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy");
    let unit = std::fs::read_to_string(format!("{root}/postbox-relay.service")).expect("unit");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("postbox.toml");
    std::fs::write(&config, "").expect("config");
    let unit = unit
        .replace("/usr/local/bin/postbox", env!("CARGO_BIN_EXE_postbox"))
        .replace("/etc/postbox/postbox.toml", &config.display().to_string());
    let path = dir.path().join("postbox-relay.service");
    std::fs::write(&path, &unit).expect("write unit");
    let out = std::process::Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&path)
        .output()
        .expect("systemd-analyze (package systemd) runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "systemd-analyze verify:\n{stderr}"
    );
    // The unit's commands parse as the binary's command lines.
    for line in unit.lines().filter(|l| l.starts_with("ExecStart")) {
        let command = line.split_once('=').expect("ExecStart=").1;
        let mut args: Vec<&str> = command.split_whitespace().skip(1).collect();
        args.push("--help");
        let dir = tempfile::tempdir().expect("tempdir");
        let out = postbox(dir.path(), &args).output().expect("postbox");
        assert!(
            out.status.success(),
            "{command}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let help = postbox(dir.path(), &["--help"])
        .output()
        .expect("postbox --help");
    let help = String::from_utf8_lossy(&help.stdout).to_string();
    for file in ["docker-compose.yml", "Dockerfile", "postbox-relay.service"] {
        let text = std::fs::read_to_string(format!("{root}/{file}")).expect("deploy file");
        for var in text
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("POSTBOX_") && *w != "POSTBOX_CONFIG")
        {
            assert!(
                help.contains(&format!("({var}")),
                "{file} sets {var}, which is no key"
            );
        }
    }
}

/// A destination that is down shows in /metrics and /readyz, and both recover when it is back.
/// (Multi-threaded: the endpoint serves while the test thread polls.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_outage_shows_in_metrics_and_readiness_until_it_is_back() {
    let pg = Pg::new().await;
    pg.ok(&["migrate"]);
    let hook = free_port();
    let addr = free_port();
    let url = format!("http://{hook}/hook");
    let relay = Running::spawn(pg.cmd(&[
        "relay",
        "--sink",
        "webhook",
        "--sink-url",
        &url,
        "--poll-interval",
        "100ms",
        "--admin-listen",
        &addr.to_string(),
    ]));
    pg.insert_events("outbox_events", "OrderPlaced", 3, true)
        .await;
    let down = |b: &str| {
        b.lines()
            .any(|l| l.starts_with("postbox_sink_up{") && l.ends_with(" 0"))
    };
    wait_for(addr, "/metrics", "the sink is down", |s, b| {
        s == 200 && down(b)
    })
    .await;
    let body = wait_for(addr, "/readyz", "not ready while down", |s, _| s == 503).await;
    assert!(body.contains("down since"), "{body}");

    // The endpoint comes up: the events go out, the sink is up, the relay ready.
    let app = axum::Router::new().route("/hook", axum::routing::post(|| async { "ok" }));
    let listener = tokio::net::TcpListener::bind(hook)
        .await
        .expect("bind the hook");
    tokio::spawn(async move { axum::serve(listener, app).await });
    wait_for(addr, "/metrics", "the sink is up again", |s, b| {
        s == 200
            && b.lines()
                .any(|l| l.starts_with("postbox_sink_up{") && l.ends_with(" 1"))
            && b.lines().any(|l| {
                l.starts_with("postbox_events_published_total{tenant=\"default\"}")
                    && l.ends_with(" 3")
            })
    })
    .await;
    wait_for(addr, "/readyz", "ready again", |s, _| s == 200).await;
    relay.signal("TERM");
    let out = relay.finish(Duration::from_secs(30));
    assert!(out.status.success(), "{}", out.stderr);
}
