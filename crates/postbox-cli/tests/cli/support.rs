//! Running the real `postbox` binary: a clean environment, a working directory of its own, output
//! collected as it arrives, and waits with deadlines instead of sleeps.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use postbox_testkit::TestDb;
use sqlx::AssertSqlSafe;

/// How long any one command may take before the test fails.
pub(crate) const DEADLINE: Duration = Duration::from_secs(120);

/// `postbox` with `args`, in `dir`, with no configuration from the test's environment.
pub(crate) fn postbox(dir: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_postbox"));
    cmd.args(args).current_dir(dir);
    // Every configuration variable of the caller's environment, whatever keys exist by now.
    for (var, _) in std::env::vars_os() {
        if var.to_string_lossy().starts_with("POSTBOX_") {
            cmd.env_remove(var);
        }
    }
    cmd.env_remove("RUST_LOG");
    cmd
}

/// A fresh PostgreSQL database and a working directory, for one test.
pub(crate) struct Pg {
    /// The database.
    pub(crate) db: TestDb,
    /// The working directory of every command.
    pub(crate) dir: tempfile::TempDir,
}

impl Pg {
    /// A new database (dropped at the end of the test) and directory.
    pub(crate) async fn new() -> Pg {
        Pg {
            db: TestDb::new().await,
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    /// `postbox` pointed at this database through `POSTBOX_DATABASE_URL`.
    pub(crate) fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = postbox(self.dir.path(), args);
        cmd.env("POSTBOX_DATABASE_URL", self.db.url());
        cmd
    }

    /// A replication slot name of this test's own: its database's name.
    pub(crate) fn slot_name(&self) -> String {
        (self.db.url().rsplit('/').next())
            .expect("a database name")
            .to_owned()
    }

    /// Runs a command to completion and asserts it succeeded.
    pub(crate) fn ok(&self, args: &[&str]) -> Finished {
        let out = run(self.cmd(args));
        assert!(
            out.status.success(),
            "postbox {args:?} failed ({}):\nstdout:\n{}\nstderr:\n{}",
            out.status,
            out.stdout,
            out.stderr
        );
        out
    }

    /// Runs plain SQL (several statements allowed).
    pub(crate) async fn sql(&self, sql: &str) {
        sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
            .execute(self.db.pool())
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// Inserts `n` events into `table` in one transaction, giving only the four columns a
    /// plain-SQL producer must give; committed, or rolled back.
    pub(crate) async fn insert_events(
        &self,
        table: &str,
        event_type: &str,
        n: usize,
        commit: bool,
    ) {
        let mut tx = self.db.pool().begin().await.expect("begin");
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {table} (event_type, aggregate_type, aggregate_id, payload)
             SELECT $1, 'Order', 'order-' || g, jsonb_build_object('n', g, 'note', 'plain SQL')
             FROM generate_series(1, $2) AS g"
        )))
        .bind(event_type)
        .bind(n as i64)
        .execute(&mut *tx)
        .await
        .expect("insert events");
        if commit {
            tx.commit().await.expect("commit");
        } else {
            tx.rollback().await.expect("rollback");
        }
    }

    /// Event ids of `table`.
    pub(crate) async fn ids(&self, table: &str, status: Option<&str>) -> Vec<i64> {
        let sql = match status {
            Some(s) => format!("SELECT id FROM {table} WHERE status = '{s}' ORDER BY id"),
            None => format!("SELECT id FROM {table} ORDER BY id"),
        };
        sqlx::query_scalar(AssertSqlSafe(sql))
            .fetch_all(self.db.pool())
            .await
            .expect("ids")
    }
}

/// What a finished command printed.
pub(crate) struct Finished {
    /// How it exited.
    pub(crate) status: ExitStatus,
    /// Stdout, lines joined by `\n`.
    pub(crate) stdout: String,
    /// Stderr.
    pub(crate) stderr: String,
}

impl Finished {
    /// Stdout's lines, each parsed as JSON (the test fails on a line that is not).
    pub(crate) fn json_lines(&self) -> Vec<serde_json::Value> {
        parse_lines(self.stdout.lines())
    }
}

/// Parses JSON lines; panics with the offending line.
pub(crate) fn parse_lines<'a>(lines: impl Iterator<Item = &'a str>) -> Vec<serde_json::Value> {
    lines
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect()
}

/// Runs `cmd` to completion within [`DEADLINE`].
pub(crate) fn run(cmd: Command) -> Finished {
    Running::spawn(cmd).finish(DEADLINE)
}

/// What a running process printed on one pipe so far, shared with the thread reading it.
#[derive(Default)]
struct Output {
    lines: Vec<String>,
    /// The pipe reached its end: the process exited.
    closed: bool,
}

/// An [`Output`] and the signal of each line (and of the end) arriving.
type Shared = Arc<(Mutex<Output>, Condvar)>;

/// Reads `pipe` line by line into `into` on a thread of its own, signalling each line.
fn read_lines(pipe: impl Read + Send + 'static, into: Shared) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let (output, arrived) = &*into;
        let mut pipe = BufReader::new(pipe);
        let mut line = Vec::new();
        while pipe.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
            if line.last() == Some(&b'\n') {
                line.pop();
            }
            let text = String::from_utf8_lossy(&line).into_owned();
            output.lock().expect("lock").lines.push(text);
            arrived.notify_all();
            line.clear();
        }
        output.lock().expect("lock").closed = true;
        arrived.notify_all();
    })
}

/// Waits until `done` holds for `output` or its pipe is closed; returns whether `done` held.
/// Panics after `within`, saying `what`.
fn wait_on(shared: &Shared, within: Duration, what: &str, done: impl Fn(&Output) -> bool) -> bool {
    let deadline = Instant::now() + within;
    let (output, arrived) = &**shared;
    let mut out = output.lock().expect("lock");
    loop {
        if done(&out) {
            return true;
        }
        if out.closed {
            return false;
        }
        let now = Instant::now();
        assert!(now < deadline, "{what} after {within:?}");
        out = arrived.wait_timeout(out, deadline - now).expect("lock").0;
    }
}

/// A running `postbox`, its output collected by reader threads as it arrives.
pub(crate) struct Running {
    child: Child,
    stdout: Shared,
    stderr: Shared,
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl Running {
    /// Starts `cmd` with stdout and stderr captured.
    pub(crate) fn spawn(cmd: Command) -> Running {
        Running::start(cmd, None)
    }

    /// Starts `cmd` with stdout written to `file` (output too large to keep in memory) and
    /// stderr captured.
    pub(crate) fn spawn_to_file(cmd: Command, file: std::fs::File) -> Running {
        Running::start(cmd, Some(file))
    }

    fn start(mut cmd: Command, stdout_file: Option<std::fs::File>) -> Running {
        let to_file = stdout_file.is_some();
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(stdout_file.map_or_else(Stdio::piped, Stdio::from))
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn postbox");
        let stdout = Shared::default();
        let stderr = Shared::default();
        let mut readers = vec![read_lines(
            child.stderr.take().expect("stderr"),
            Arc::clone(&stderr),
        )];
        if !to_file {
            readers.push(read_lines(
                child.stdout.take().expect("stdout"),
                Arc::clone(&stdout),
            ));
        }
        Running {
            child,
            stdout,
            stderr,
            readers,
        }
    }

    /// The process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The process's resident memory now and at its peak (`VmRSS`, `VmHWM`), in bytes.
    pub(crate) fn memory(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("read /proc/<pid>/status");
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .unwrap_or_else(|| panic!("no {name} in {status}"))
                * 1024
        };
        (field("VmRSS:"), field("VmHWM:"))
    }

    /// Waits until stdout has at least `n` lines; panics after `within`, or if the process
    /// exits before printing them.
    pub(crate) fn wait_for_lines(&mut self, n: usize, within: Duration) {
        let what = format!("fewer than {n} lines");
        if !wait_on(&self.stdout, within, &what, |out| out.lines.len() >= n) {
            let status = self.child.wait().expect("wait");
            panic!("postbox exited ({status}) before printing {n} lines");
        }
    }

    /// Waits until stderr has a line containing `needle`; panics after `within`, or if the
    /// process exits without printing it.
    pub(crate) fn wait_for_stderr(&mut self, needle: &str, within: Duration) {
        let what = format!("no line of stderr contains {needle:?}");
        let found = wait_on(&self.stderr, within, &what, |out| {
            out.lines.iter().any(|l| l.contains(needle))
        });
        if !found {
            let status = self.child.wait().expect("wait");
            panic!(
                "postbox exited ({status}) without printing {needle:?}; stderr:\n{}",
                text(&self.stderr)
            );
        }
    }

    /// Sends a signal with `kill(1)`.
    pub(crate) fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{name} failed");
    }

    /// Kills the process with SIGKILL and collects what it printed.
    pub(crate) fn kill(mut self) -> Finished {
        self.child.kill().expect("SIGKILL");
        self.finish(DEADLINE)
    }

    /// Waits for exit within `within` (killing it and failing the test otherwise).
    pub(crate) fn finish(mut self, within: Duration) -> Finished {
        // The exit is signalled to a thread that waits for it without a deadline; the deadline
        // is this thread's wait for that thread's word.
        let pid = self.pid().to_string();
        let mut child = self.child;
        let (exited_tx, exited) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let _ = exited_tx.send(child.wait().expect("wait"));
        });
        let Ok(status) = exited.recv_timeout(within) else {
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
            let _ = waiter.join();
            panic!(
                "postbox did not exit within {within:?}; stderr:\n{}",
                text(&self.stderr)
            );
        };
        waiter.join().expect("waiter thread");
        for reader in self.readers.drain(..) {
            reader.join().expect("reader thread");
        }
        let stdout = self.stdout.0.lock().expect("lock").lines.join("\n");
        Finished {
            status,
            stdout,
            stderr: text(&self.stderr),
        }
    }
}

/// The lines of `shared` so far, each ended by a newline.
fn text(shared: &Shared) -> String {
    let out = shared.0.lock().expect("lock");
    out.lines.iter().map(|l| format!("{l}\n")).collect()
}
