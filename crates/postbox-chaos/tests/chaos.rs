//! The CI chaos run: two minutes of faults (relays killed and paused past their lease,
//! PostgreSQL restarted, the broker stalled and cut off, a snapshot held open) while producers commit 20,000 events,
//! against the real PostgreSQL binaries and Redis of this machine. The checker must pass: nothing
//! lost, no ghost, duplicates within their bound, nothing FAILED, no relay dead on its own.
//!
//! The relays are the real `postbox` binary. A test can only name the binaries of its own
//! package (`CARGO_BIN_EXE_*`), so this one builds `postbox` itself with the cargo that runs it
//! (`cargo build -p postbox-cli --bin postbox`, the same profile, fresh after any change to the
//! library) and asks cargo where the executable is. Set `POSTBOX_CHAOS_POSTBOX_BIN` to use a
//! binary built beforehand instead; `POSTBOX_CHAOS_SEED` replays another schedule.
//!
//! Correctness is checked strictly; timing is loose, for a slow, shared machine: the drain may
//! take up to ten minutes, and the duplicate bound counts every fault at its worst.

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// The schedule CI replays (printed with the report); any seed must pass.
const SEED: &str = "20260424";

/// One chaos run at a time: each starts a PostgreSQL cluster and relays of its own, and two at
/// once on a small machine would time each other out.
static ONE_RUN: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn two_minutes_of_faults_lose_nothing_and_publish_no_ghost() {
    chaos(&["--minutes", "2", "--events", "20000"], 20_000, true);
}

/// The same faults with the relays ordering per aggregate (G6): 10,000 events over 50
/// aggregates, each aggregate's events first delivered in id order, nothing lost or FAILED.
#[test]
fn a_minute_of_faults_keeps_every_aggregates_order() {
    chaos(
        &[
            "--minutes",
            "1",
            "--events",
            "10000",
            "--ordered-aggregates",
            "50",
        ],
        10_000,
        false,
    );
}

/// CDC relays (`--source cdc`, wal_level = logical in the private cluster) through the same
/// faults and their replication slot dropped under them: nothing lost, no ghost, duplicates
/// within their bound, and after every drop a relay read the slot again.
#[test]
fn a_minute_of_faults_and_dropped_slots_with_cdc_relays_loses_nothing() {
    let report = chaos(
        &["--minutes", "1", "--events", "8000", "--source", "cdc"],
        8_000,
        false,
    );
    assert!(
        report["faults"]["slot-drop"].as_u64() >= Some(1),
        "the schedule dropped no slot: {}",
        report["faults"]
    );
    assert!(
        report["relay_logs"]["slot_reads"].as_u64() >= Some(2),
        "the slot was read once at most: {}",
        report["relay_logs"]
    );
}

/// One CDC relay, which reads the events its slot names and publishes them unclaimed (no poller
/// beside it), through the same faults: nothing lost, no ghost, duplicates within their bound.
#[test]
fn a_minute_of_faults_with_one_cdc_relay_reading_unclaimed_loses_nothing() {
    chaos(
        &[
            "--minutes",
            "1",
            "--events",
            "8000",
            "--source",
            "cdc",
            "--relays",
            "1",
        ],
        8_000,
        false,
    );
}

/// The same faults with the events spread over the default schema and 50 tenant schemas, each
/// transaction writing into one of them at random: every event of every tenant accounted for,
/// nothing lost, no ghost, duplicates within their bound.
#[test]
fn a_minute_of_faults_across_fifty_tenants_loses_nothing() {
    chaos(
        &["--minutes", "1", "--events", "8000", "--tenants", "50"],
        8_000,
        false,
    );
}

/// Runs the chaos kit with `args` and asserts that every check passed, that `events` events
/// committed and (`every_kind`) that the schedule injected every kind of fault.
fn chaos(args: &[&str], events: u64, every_kind: bool) -> serde_json::Value {
    let _one = ONE_RUN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let postbox = postbox_binary();
    let seed = std::env::var("POSTBOX_CHAOS_SEED").unwrap_or_else(|_| SEED.to_owned());
    let output = Command::new(env!("CARGO_BIN_EXE_postbox-chaos"))
        .args(["--seed", &seed])
        .args(args)
        .args(["--drain-timeout", "10m", "--json", "--postbox-bin"])
        .arg(&postbox)
        .stdin(Stdio::null())
        .output()
        .expect("run postbox-chaos");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "postbox-chaos did not print a report ({e}; {}); its stderr:\n{stderr}",
            output.status
        )
    });
    let checks = report["checks"].as_array().expect("checks");
    let failed: Vec<String> = checks
        .iter()
        .filter(|c| c["ok"] != true)
        .map(|c| format!("{}: {} (bound {})", c["name"], c["value"], c["bound"]))
        .collect();
    let context = || {
        format!(
            "seed {seed}; replay with: scripts/chaos --seed {seed} {}\n\
             failed checks: {failed:#?}\nlost: {}\nghosts: {}\nFAILED: {}\nunfinished: {}\n\
             out of order: {}\n\
             relays that died: {}\nlast stderr lines:\n{}",
            args.join(" "),
            report["lost_sample"],
            report["ghost_sample"],
            report["failed_sample"],
            report["unfinished_sample"],
            report["out_of_order_sample"],
            report["unplanned_exits"],
            tail(&stderr, 40)
        )
    };
    assert!(
        report["drained_in_s"].is_number(),
        "the outbox did not drain within 10 minutes\n{}",
        context()
    );
    assert!(failed.is_empty(), "chaos checks failed\n{}", context());
    assert_eq!(report["passed"], true, "{}", context());
    assert!(
        output.status.success(),
        "exit {}\n{}",
        output.status,
        context()
    );
    // The run really did what it says: every event committed and every kind of fault injected.
    assert!(
        report["committed"].as_u64() >= Some(events),
        "{}",
        context()
    );
    if !every_kind {
        return report;
    }
    for kind in [
        "kill",
        "pause",
        "pg-restart",
        "broker-stall",
        "broker-down",
        "long-transaction",
    ] {
        assert!(
            report["faults"][kind].as_u64() >= Some(1),
            "no {kind} fault was injected\n{}",
            context()
        );
    }
    report
}

/// `POSTBOX_CHAOS_POSTBOX_BIN`, or `postbox` built now by the cargo running this test.
fn postbox_binary() -> PathBuf {
    if let Ok(path) = std::env::var("POSTBOX_CHAOS_POSTBOX_BIN") {
        return PathBuf::from(path);
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut command = Command::new(cargo);
    command
        .args(["build", "-p", "postbox-cli", "--bin", "postbox"])
        .args(["--message-format", "json-render-diagnostics"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stderr(Stdio::inherit());
    if !cfg!(debug_assertions) {
        command.arg("--release");
    }
    let output = command.output().expect("run cargo build -p postbox-cli");
    assert!(
        output.status.success(),
        "cargo build -p postbox-cli failed: {}",
        output.status
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "postbox")
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .expect("cargo named no postbox executable")
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
