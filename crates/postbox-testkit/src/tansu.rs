//! A real Kafka-protocol broker of its own for one test: [tansu](https://tansu.io), an
//! Apache-licensed broker on crates.io that speaks the Kafka wire protocol, keeping its log in an
//! SQLite file of the test's own (its `libsql` storage: a restart keeps what it acknowledged).
//!
//! `scripts/install-deps` builds the `tansu` binary once into a cache outside the clone;
//! [`binary`] finds it. A test that cannot find or start it fails: it is never skipped.
//!
//! Each test gets its own broker process on a free loopback port, so it may kill, restart or
//! stall it ([`Tansu::kill`], [`Tansu::restart`], [`Tansu::stall`]) without disturbing other
//! tests.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The tansu version `scripts/install-deps` installs and these tests are written against.
pub const VERSION: &str = "0.6.0";

/// Where the `tansu` binary is: `POSTBOX_TANSU`, else the cache `scripts/install-deps` fills
/// (`$XDG_CACHE_HOME` or `~/.cache`, then `postbox/tansu-0.6.0/bin/tansu`), else `tansu` on the
/// `PATH`.
///
/// # Panics
/// When none of them exists: run `scripts/install-deps`.
pub fn binary() -> PathBuf {
    if let Ok(path) = std::env::var("POSTBOX_TANSU") {
        return PathBuf::from(path);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")));
    if let Some(cache) = cache {
        let path = cache.join(format!("postbox/tansu-{VERSION}/bin/tansu"));
        if path.is_file() {
            return path;
        }
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("tansu"))
            .find(|p| p.is_file())
    });
    on_path.unwrap_or_else(|| {
        panic!(
            "the tansu Kafka broker is not installed: run scripts/install-deps (it builds tansu \
             {VERSION} into ~/.cache/postbox), or set POSTBOX_TANSU to its binary"
        )
    })
}

/// The shared broker `scripts/services` starts for the test suite, as `bootstrap.servers`.
pub const SHARED: &str = "127.0.0.1:9092";

/// Creates `topic` with `partitions` partitions on the tansu broker at `bootstrap` (`host:port`;
/// tansu creates no topic on first use).
pub fn create_topic(bootstrap: &str, topic: &str, partitions: u32) {
    let out = Command::new(binary())
        .args(["topic", "create", topic, "--partitions"])
        .arg(partitions.to_string())
        .arg("--broker")
        .arg(format!("tcp://{bootstrap}"))
        .output()
        .expect("run tansu topic create");
    assert!(
        out.status.success(),
        "tansu topic create {topic} on {bootstrap}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One tansu broker process, its port and its storage; killed when dropped.
pub struct Tansu {
    /// The broker's working directory, which holds its storage file and its log.
    dir: tempfile::TempDir,
    port: u16,
    child: Option<Child>,
}

impl Tansu {
    /// Starts a broker on a free loopback port, storing in a fresh SQLite file, and waits until
    /// it listens.
    pub async fn start() -> Tansu {
        let dir = tempfile::tempdir().expect("tansu directory");
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut broker = Tansu {
            dir,
            port,
            child: None,
        };
        broker.spawn().await;
        broker
    }

    /// `host:port` of the broker, for `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Creates `topic` with `partitions` partitions (tansu creates none on first use).
    pub fn create_topic(&self, topic: &str, partitions: u32) {
        create_topic(&self.bootstrap(), topic, partitions);
    }

    /// Kills the broker (`SIGKILL`): what it acknowledged is in its storage.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().ok();
            child.wait().ok();
        }
    }

    /// Kills the broker if it runs and starts it again on the same port and storage.
    pub async fn restart(&mut self) {
        self.kill();
        self.spawn().await;
    }

    /// Stops the broker process (`SIGSTOP`): connections stay open, nothing is answered.
    pub fn stall(&self) {
        self.signal("-STOP");
    }

    /// Lets a stalled broker go on (`SIGCONT`).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// What the broker logged, for a failing test's message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("tansu.log")).unwrap_or_default()
    }

    fn url(&self) -> String {
        format!("tcp://127.0.0.1:{}", self.port)
    }

    fn signal(&self, signal: &str) {
        let Some(child) = &self.child else {
            panic!("the tansu broker is not running");
        };
        let status = Command::new("kill")
            .arg(signal)
            .arg(child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} {}", child.id());
    }

    async fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("tansu.log"))
            .expect("log file");
        let err = log.try_clone().expect("log file");
        // `sqlite://tansu.db` is the file tansu.db in the working directory.
        let child = Command::new(binary())
            .current_dir(self.dir.path())
            .arg("broker")
            .arg("--storage-engine")
            .arg("sqlite://tansu.db")
            .arg("--listener-url")
            .arg(self.url())
            .arg("--advertised-listener-url")
            .arg(self.url())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start tansu ({}): {e}", binary().display()));
        self.child = Some(child);
        // Polling the port: the broker says nothing else when it is ready.
        let (port, log) = (self.port, self.dir.path().join("tansu.log"));
        crate::wait_until(
            &format!("tansu listens on {}", self.bootstrap()),
            Duration::from_secs(30),
            || {
                if let Some(child) = &mut self.child
                    && let Ok(Some(status)) = child.try_wait()
                {
                    panic!(
                        "tansu exited ({status}) before it listened:\n{}",
                        self.log()
                    );
                }
                let log = log.clone();
                async move {
                    tokio::net::TcpStream::connect(("127.0.0.1", port))
                        .await
                        .map_err(|e| {
                            let log = std::fs::read_to_string(log).unwrap_or_default();
                            format!("{e}; its log:\n{log}")
                        })
                }
            },
        )
        .await;
    }
}

impl Drop for Tansu {
    fn drop(&mut self) {
        if self.child.is_some() {
            // A stalled process still dies of SIGKILL.
            self.kill();
        }
    }
}
