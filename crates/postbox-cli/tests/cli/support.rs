//! Running the real `postbox` binary: a clean environment, a working directory of its own, output
//! collected as it arrives, and waits with deadlines instead of sleeps.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
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

/// A running `postbox`, its output collected by reader threads.
pub(crate) struct Running {
    child: Child,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<String>>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl Running {
    /// Starts `cmd` with stdout and stderr captured.
    pub(crate) fn spawn(mut cmd: Command) -> Running {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn postbox");
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        let out_pipe = child.stdout.take().expect("stdout");
        let err_pipe = child.stderr.take().expect("stderr");
        let out = Arc::clone(&stdout);
        let err = Arc::clone(&stderr);
        let readers = vec![
            std::thread::spawn(move || {
                for line in BufReader::new(out_pipe).lines() {
                    let Ok(line) = line else { break };
                    out.lock().expect("lock").push(line);
                }
            }),
            std::thread::spawn(move || {
                let mut text = String::new();
                let _ = BufReader::new(err_pipe).read_to_string(&mut text);
                err.lock().expect("lock").push_str(&text);
            }),
        ];
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

    /// Waits until stdout has at least `n` lines; panics after `within`.
    pub(crate) fn wait_for_lines(&mut self, n: usize, within: Duration) {
        let deadline = Instant::now() + within;
        while self.stdout.lock().expect("lock").len() < n {
            if let Ok(Some(status)) = self.child.try_wait() {
                // Let the reader catch up with what the process wrote before it exited.
                std::thread::sleep(Duration::from_millis(100));
                assert!(
                    self.stdout.lock().expect("lock").len() >= n,
                    "postbox exited ({status}) before printing {n} lines"
                );
                return;
            }
            assert!(
                Instant::now() < deadline,
                "fewer than {n} lines after {within:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
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
        let deadline = Instant::now() + within;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "postbox did not exit within {within:?}; stderr:\n{}",
                    self.stderr.lock().expect("lock")
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        for reader in self.readers.drain(..) {
            reader.join().expect("reader thread");
        }
        let stdout = self.stdout.lock().expect("lock").join("\n");
        let stderr = self.stderr.lock().expect("lock").clone();
        Finished {
            status,
            stdout,
            stderr,
        }
    }
}
