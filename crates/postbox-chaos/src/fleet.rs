//! The relays: one `postbox relay` process per slot, each watched by a task that starts a
//! replacement when its process ends. An end the fault schedule did not cause is recorded: a
//! relay must survive everything the kit does to the database and the broker.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context;
use rustix::process::{Pid, Signal, kill_process};
use serde::Serialize;
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

/// How long a relay may take to stop on SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(20);

/// How every relay process is started.
#[derive(Clone, Debug)]
pub(crate) struct RelaySpec {
    pub(crate) bin: PathBuf,
    pub(crate) database_url: String,
    pub(crate) sink_url: String,
    pub(crate) topic: String,
    pub(crate) lease: Duration,
    pub(crate) publish_timeout: Duration,
    pub(crate) batch_size: u32,
    /// Per-aggregate ordering of the `Account` aggregates (`--ordered-aggregates`).
    pub(crate) ordered: bool,
    /// How the relays find events (`--source`).
    pub(crate) source: crate::cli::Source,
    /// Whether CDC relays claim each event (`--cdc-claim`): when several run, the ones that do
    /// not hold the slot poll beside the one that does, as docs/cdc.md says to set it for; a
    /// CDC relay alone reads its events unclaimed.
    pub(crate) cdc_claim: bool,
    /// The relays' working directory (no `postbox.toml` in it), which holds their logs.
    pub(crate) dir: PathBuf,
}

/// The `postbox` binary run in `dir` (which holds no `postbox.toml`) on `database_url`, with none
/// of this process's `POSTBOX_*` or `RUST_LOG` settings: only what the kit gives it.
pub(crate) fn postbox_command(bin: &Path, dir: &Path, database_url: &str) -> Command {
    let mut command = Command::new(bin);
    command.current_dir(dir);
    for (name, _) in std::env::vars_os() {
        if let Some(name) = name.to_str()
            && (name.starts_with("POSTBOX_") || name == "RUST_LOG")
        {
            command.env_remove(name);
        }
    }
    command.env("POSTBOX_DATABASE_URL", database_url);
    command
}

impl RelaySpec {
    fn command(&self, log: &Path, tag: &str) -> anyhow::Result<Command> {
        let log_file =
            std::fs::File::create(log).with_context(|| format!("create {}", log.display()))?;
        let mut command = postbox_command(&self.bin, &self.dir, &self.database_url);
        command
            .args(["relay", "--sink", "redis", "--topic", &self.topic])
            .env("POSTBOX_SINK_URL", &self.sink_url)
            .env(
                "POSTBOX_LEASE",
                humantime::format_duration(self.lease).to_string(),
            )
            .env(
                "POSTBOX_PUBLISH_TIMEOUT",
                humantime::format_duration(self.publish_timeout).to_string(),
            )
            .env("POSTBOX_BATCH_SIZE", self.batch_size.to_string())
            // Claims stay at the batch size, the size the duplicate bound counts with.
            .env("POSTBOX_MAX_BATCH_SIZE", self.batch_size.to_string())
            .env("POSTBOX_LOG_LEVEL", "info")
            // The relay id (`locked_by`) is `{HOSTNAME}-{pid}-{random}`: a tag of the kit's own
            // lets it see in the table which events this relay holds.
            .env("HOSTNAME", tag)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log_file))
            // Its own process group, so a Ctrl-C in the terminal reaches only the kit, which
            // then kills the relays itself; and killed with its task, whatever ends the run.
            .process_group(0)
            .kill_on_drop(true);
        if self.source == crate::cli::Source::Cdc {
            command.args(["--source", "cdc"]);
            if self.cdc_claim {
                command.arg("--cdc-claim");
            }
        }
        if self.ordered {
            command.env(
                "POSTBOX_ORDERED_AGGREGATE_TYPES",
                crate::producers::AGGREGATE_TYPE,
            );
        }
        Ok(command)
    }
}

/// A relay process that ended without the schedule asking for it.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct UnplannedExit {
    pub(crate) slot: u32,
    pub(crate) instance: u32,
    pub(crate) status: String,
    /// It ended before it started serving (it could not reach the database, say), rather than
    /// dying while it served.
    pub(crate) during_start: bool,
    pub(crate) log: PathBuf,
    /// The last lines of its log.
    pub(crate) tail: String,
}

#[derive(Default)]
struct SlotState {
    pid: Option<u32>,
    /// The running relay's `HOSTNAME`, the start of its relay id.
    tag: Option<String>,
    /// The running relay's log.
    log: Option<PathBuf>,
    /// The running process was killed on purpose; start its replacement after `restart_after`.
    kill_planned: bool,
    restart_after: Duration,
}

struct Slot {
    state: Mutex<SlotState>,
}

impl Slot {
    fn lock(&self) -> std::sync::MutexGuard<'_, SlotState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The relay processes of a run.
pub(crate) struct Fleet {
    slots: Vec<Arc<Slot>>,
    tasks: Vec<JoinHandle<()>>,
    stop: watch::Sender<bool>,
    unplanned: Arc<Mutex<Vec<UnplannedExit>>>,
    started: Arc<Mutex<u32>>,
}

impl Fleet {
    /// Starts `count` relays.
    pub(crate) fn start(spec: RelaySpec, count: u32) -> Fleet {
        let (stop, stop_rx) = watch::channel(false);
        let unplanned = Arc::new(Mutex::new(Vec::new()));
        let started = Arc::new(Mutex::new(0));
        let spec = Arc::new(spec);
        let mut slots = Vec::new();
        let mut tasks = Vec::new();
        for index in 0..count {
            let slot = Arc::new(Slot {
                state: Mutex::new(SlotState::default()),
            });
            slots.push(Arc::clone(&slot));
            tasks.push(tokio::spawn(supervise(
                index,
                slot,
                Arc::clone(&spec),
                stop_rx.clone(),
                Arc::clone(&unplanned),
                Arc::clone(&started),
            )));
        }
        Fleet {
            slots,
            tasks,
            stop,
            unplanned,
            started,
        }
    }

    /// SIGKILLs the relay of `slot`; its replacement starts `restart_after` later. False if no
    /// relay was running there.
    pub(crate) fn kill(&self, slot: u32, restart_after: Duration) -> bool {
        let Some(slot) = self.slots.get(slot as usize) else {
            return false;
        };
        let mut state = slot.lock();
        let Some(pid) = state.pid else {
            return false;
        };
        state.kill_planned = true;
        state.restart_after = restart_after;
        // Under the lock: the watcher clears `pid` under it once it reaped the process, so the
        // pid cannot belong to anyone else yet.
        signal(pid, Signal::KILL)
    }

    /// Sends `sig` (SIGSTOP, SIGCONT) to the relay of `slot`; returns its pid, or `None` if none
    /// was running there.
    pub(crate) fn signal(&self, slot: u32, sig: Signal) -> Option<u32> {
        let slot = self.slots.get(slot as usize)?;
        let state = slot.lock();
        let pid = state.pid?;
        signal(pid, sig).then_some(pid)
    }

    /// SIGCONTs `pid` if it is still the relay of `slot`.
    pub(crate) fn resume(&self, slot: u32, pid: u32) {
        if let Some(slot) = self.slots.get(slot as usize) {
            let state = slot.lock();
            if state.pid == Some(pid) {
                signal(pid, Signal::CONT);
            }
        }
    }

    /// The start of the relay id of the relay running in `slot` (its events' `locked_by` is
    /// this, `-`, its pid, `-`, a random suffix).
    pub(crate) fn tag(&self, slot: u32) -> Option<String> {
        self.slots.get(slot as usize)?.lock().tag.clone()
    }

    /// Waits until the relay of `slot` is serving (it logged that its loop started), and is not
    /// the one tagged `not`; false after `timeout`. A relay starting up is not yet resilient
    /// (it exits when it cannot reach the database), so the next fault waits for this.
    pub(crate) async fn wait_serving(
        &self,
        slot: u32,
        not: Option<&str>,
        timeout: Duration,
    ) -> bool {
        let Some(slot) = self.slots.get(slot as usize) else {
            return false;
        };
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let log = {
                let state = slot.lock();
                match (&state.tag, &state.log) {
                    (Some(tag), Some(log)) if Some(tag.as_str()) != not => Some(log.clone()),
                    _ => None,
                }
            };
            if let Some(log) = log
                && std::fs::read_to_string(&log).is_ok_and(|text| text.contains("relay started"))
            {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// How many relays are running now.
    pub(crate) fn running(&self) -> u32 {
        self.slots.iter().filter(|s| s.lock().pid.is_some()).count() as u32
    }

    /// Relay processes started so far (replacements included).
    pub(crate) fn started(&self) -> u32 {
        *self.started.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The relay ends nobody asked for, so far.
    pub(crate) fn unplanned_exits(&self) -> Vec<UnplannedExit> {
        self.unplanned
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Stops every relay gracefully (SIGTERM: finish the batch in flight, exit 0), killing one
    /// that takes longer than its grace period.
    pub(crate) async fn stop(&mut self) {
        self.stop.send_replace(true);
        for task in self.tasks.drain(..) {
            let abort = task.abort_handle();
            if tokio::time::timeout(STOP_GRACE + Duration::from_secs(5), task)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        // The processes die with their tasks (`kill_on_drop`).
        for task in &self.tasks {
            task.abort();
        }
    }
}

fn signal(pid: u32, sig: Signal) -> bool {
    let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
        return false;
    };
    match kill_process(pid, sig) {
        Ok(()) => true,
        Err(e) => {
            warn!(pid = pid.as_raw_nonzero().get(), ?sig, error = %e, "cannot signal a relay");
            false
        }
    }
}

/// Keeps one relay running in `slot` until told to stop.
async fn supervise(
    index: u32,
    slot: Arc<Slot>,
    spec: Arc<RelaySpec>,
    mut stop: watch::Receiver<bool>,
    unplanned: Arc<Mutex<Vec<UnplannedExit>>>,
    started: Arc<Mutex<u32>>,
) {
    let mut instance = 0;
    loop {
        instance += 1;
        let log = spec.dir.join(format!("relay-{index}-{instance}.log"));
        let tag = format!("chaos-relay-{index}-{instance}");
        let mut child = match spec.command(&log, &tag).and_then(|mut c| {
            c.spawn()
                .with_context(|| format!("start {}", spec.bin.display()))
        }) {
            Ok(child) => child,
            Err(e) => {
                record(&unplanned, index, instance, format!("{e:#}"), &log);
                if wait_or_stop(Duration::from_secs(1), &mut stop).await {
                    return;
                }
                continue;
            }
        };
        *started.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        {
            let mut state = slot.lock();
            state.pid = child.id();
            state.tag = Some(tag);
            state.log = Some(log.clone());
        }
        info!(slot = index, instance, pid = child.id(), "relay started");
        let status = tokio::select! {
            status = child.wait() => Some(status),
            _ = stop.wait_for(|s| *s) => None,
        };
        let Some(status) = status else {
            let status = stop_gracefully(&mut child, &slot).await;
            slot.lock().pid = None;
            if status.as_deref() != Some("exit status: 0") {
                record(
                    &unplanned,
                    index,
                    instance,
                    format!(
                        "did not stop cleanly on SIGTERM: {}",
                        status.as_deref().unwrap_or("killed after the grace period")
                    ),
                    &log,
                );
            }
            return;
        };
        let status = status.map_or_else(|e| format!("cannot wait: {e}"), |s| s.to_string());
        let (planned, delay) = {
            let mut state = slot.lock();
            state.pid = None;
            state.tag = None;
            state.log = None;
            let planned = std::mem::take(&mut state.kill_planned);
            (planned, state.restart_after)
        };
        if planned {
            info!(slot = index, instance, %status, "relay killed");
        } else {
            warn!(slot = index, instance, %status, log = %log.display(), "relay ended by itself");
            record(&unplanned, index, instance, status, &log);
        }
        let delay = if planned {
            delay
        } else {
            Duration::from_secs(1)
        };
        if wait_or_stop(delay, &mut stop).await {
            return;
        }
    }
}

/// SIGCONT (a paused relay cannot act on SIGTERM), SIGTERM, then SIGKILL after the grace period.
/// Returns the exit status, or `None` if it had to be killed.
async fn stop_gracefully(child: &mut Child, slot: &Slot) -> Option<String> {
    if let Some(pid) = child.id() {
        let _held = slot.lock();
        signal(pid, Signal::CONT);
        signal(pid, Signal::TERM);
    }
    match tokio::time::timeout(STOP_GRACE, child.wait()).await {
        Ok(status) => Some(status.map_or_else(|e| format!("cannot wait: {e}"), |s| s.to_string())),
        Err(_) => {
            let _ = child.kill().await;
            None
        }
    }
}

fn record(
    unplanned: &Mutex<Vec<UnplannedExit>>,
    slot: u32,
    instance: u32,
    status: String,
    log: &Path,
) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let during_start = !text.contains("relay started");
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(8)..].join("\n");
    unplanned
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(UnplannedExit {
            slot,
            instance,
            status,
            during_start,
            log: log.to_owned(),
            tail,
        });
}

/// Sleeps for `wait` unless the fleet is stopped first; true when stopped.
async fn wait_or_stop(wait: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    if *stop.borrow() {
        return true;
    }
    tokio::select! {
        () = tokio::time::sleep(wait) => false,
        _ = stop.wait_for(|s| *s) => true,
    }
}
