//! A PostgreSQL cluster of a test's (or a chaos run's) own: `initdb` into a directory, on a free
//! loopback port, stopped when dropped. Restarting it is what a test of a server restart needs;
//! no other cluster is ever touched.
//!
//! ```no_run
//! # async fn example() -> std::io::Result<()> {
//! let dir = tempfile::tempdir()?;
//! let pg = postbox_testkit::cluster::Cluster::start(
//!     dir.path(),
//!     postbox_testkit::cluster::find_bin_dir()?,
//!     "postgres",
//!     &[("max_prepared_transactions", "10")],
//! )
//! .await?;
//! let url = pg.url();
//! pg.restart(false, std::time::Duration::ZERO).await?;
//! # let _ = url; Ok(()) }
//! ```

use std::io;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// A running private cluster.
pub struct Cluster {
    bin: PathBuf,
    data: PathBuf,
    log: PathBuf,
    port: u16,
    /// Server settings beside the cluster's own (`-c name=value`).
    settings: String,
    /// The OS user PostgreSQL runs as when this process is root (`runuser -u`), else none.
    run_as: Option<String>,
}

fn failed(what: impl std::fmt::Display) -> io::Error {
    io::Error::other(what.to_string())
}

impl Cluster {
    /// Creates and starts a cluster in `dir` (created, and given to `pg_user` when running as
    /// root, since initdb refuses root), with `settings` on top of its own (trust
    /// authentication, loopback only, `fsync=off`, 300 connections).
    pub async fn start(
        dir: &Path,
        bin: PathBuf,
        pg_user: &str,
        settings: &[(&str, &str)],
    ) -> io::Result<Cluster> {
        let run_as = rustix::process::geteuid()
            .is_root()
            .then(|| pg_user.to_owned());
        std::fs::create_dir_all(dir)
            .map_err(|e| failed(format!("create {}: {e}", dir.display())))?;
        if let Some(user) = &run_as {
            let status = std::process::Command::new("chown")
                .arg(format!("{user}:"))
                .arg(dir)
                .status()?;
            if !status.success() {
                return Err(failed(format!(
                    "cannot give {} to the OS user {user:?} (chown: {status}); as root PostgreSQL \
                     runs as that user, which must exist",
                    dir.display()
                )));
            }
        }
        let mut cluster = Cluster {
            bin,
            data: dir.join("data"),
            log: dir.join("postgresql.log"),
            port: 0,
            settings: settings
                .iter()
                .map(|(name, value)| format!(" -c {name}={value}"))
                .collect(),
            run_as,
        };
        let data_arg = cluster.data.display().to_string();
        cluster
            .tool(
                "initdb",
                &[
                    "-D",
                    &data_arg,
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                    "--no-sync",
                    "--no-instructions",
                ],
            )
            .await?;
        let mut last_error = None;
        for _ in 0..5 {
            cluster.port = free_port()?;
            match cluster.pg_ctl_start().await {
                Ok(()) => return Ok(cluster),
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.unwrap_or_else(|| failed("PostgreSQL did not start")))
    }

    /// The URL of its `postgres` database, as the `postgres` superuser.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The server's log file.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Stops the server (`immediate`: a crash, no checkpoint; else a fast shutdown), waits
    /// `down`, and starts it again on the same port and data. Returns how long it took.
    pub async fn restart(&self, immediate: bool, down: Duration) -> io::Result<Duration> {
        let started = Instant::now();
        let mode = if immediate { "immediate" } else { "fast" };
        let data = self.data.display().to_string();
        self.tool(
            "pg_ctl",
            &["-D", &data, "-m", mode, "-w", "-t", "60", "stop"],
        )
        .await?;
        // The outage itself, as long as the caller asked.
        tokio::time::sleep(down).await;
        self.pg_ctl_start().await?;
        Ok(started.elapsed())
    }

    async fn pg_ctl_start(&self) -> io::Result<()> {
        let options = format!(
            "-c port={} -c listen_addresses=127.0.0.1 -c unix_socket_directories='' \
             -c fsync=off -c max_connections=300 -c shared_buffers=256MB{}",
            self.port, self.settings
        );
        let data = self.data.display().to_string();
        let log = self.log.display().to_string();
        self.tool(
            "pg_ctl",
            &[
                "-D", &data, "-l", &log, "-w", "-t", "120", "-o", &options, "start",
            ],
        )
        .await
    }

    async fn tool(&self, name: &str, args: &[&str]) -> io::Result<()> {
        let program = self.bin.join(name);
        let mut command = match &self.run_as {
            Some(user) => {
                let mut c = tokio::process::Command::new("runuser");
                c.arg("-u").arg(user).arg("--").arg(&program);
                c
            }
            None => tokio::process::Command::new(&program),
        };
        // Its own process group: a Ctrl-C in the terminal is the caller's to handle, and it
        // then stops the server itself.
        let output = command
            .args(args)
            .stdin(Stdio::null())
            .process_group(0)
            .output()
            .await
            .map_err(|e| failed(format!("run {}: {e}", program.display())))?;
        if !output.status.success() {
            return Err(failed(format!(
                "{} {} failed ({}): {}{}",
                program.display(),
                args.last().unwrap_or(&""),
                output.status,
                String::from_utf8_lossy(&output.stderr).trim(),
                String::from_utf8_lossy(&output.stdout).trim()
            )));
        }
        Ok(())
    }
}

impl Drop for Cluster {
    /// Stops the server at once; the directory is removed by its owner.
    fn drop(&mut self) {
        let pg_ctl = self.bin.join("pg_ctl");
        let mut command = match &self.run_as {
            Some(user) => {
                let mut c = std::process::Command::new("runuser");
                c.arg("-u").arg(user).arg("--").arg(&pg_ctl);
                c
            }
            None => std::process::Command::new(&pg_ctl),
        };
        // Already stopped (a restart that failed half-way, say) is fine.
        let _ = command
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "-w", "-t", "30", "stop"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// The directory of `initdb` and `pg_ctl`: the newest `/usr/lib/postgresql/*/bin` (Debian's
/// layout), else whatever `PATH` finds.
pub fn find_bin_dir() -> io::Result<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    if let Some((_, bin)) = found.pop() {
        return Ok(bin);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .find(|dir| dir.join("initdb").exists() && dir.join("pg_ctl").exists())
        .ok_or_else(|| {
            failed(
                "no PostgreSQL server binaries (initdb, pg_ctl) in /usr/lib/postgresql/*/bin or \
                 PATH; install the server or pass --pg-bin-dir",
            )
        })
}

fn free_port() -> io::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}
