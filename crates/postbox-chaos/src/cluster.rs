//! A PostgreSQL cluster of the run's own: `initdb` into the run directory, on a free loopback
//! port, stopped when dropped. Restarting it is a fault; no other cluster is ever touched.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tracing::{info, warn};

/// A running private cluster.
pub(crate) struct Cluster {
    bin: PathBuf,
    data: PathBuf,
    log: PathBuf,
    port: u16,
    /// The OS user PostgreSQL runs as when this process is root (`runuser -u`), else none.
    run_as: Option<String>,
}

impl Cluster {
    /// Creates and starts a cluster in `dir` (created, and given to `pg_user` when running as
    /// root, since initdb refuses root).
    pub(crate) async fn start(dir: &Path, bin: PathBuf, pg_user: &str) -> anyhow::Result<Cluster> {
        let run_as = rustix::process::geteuid()
            .is_root()
            .then(|| pg_user.to_owned());
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        if let Some(user) = &run_as {
            let status = std::process::Command::new("chown")
                .arg(format!("{user}:"))
                .arg(dir)
                .status()
                .context("run chown")?;
            if !status.success() {
                bail!(
                    "cannot give {} to the OS user {user:?} (chown: {status}); as root the kit runs \
                     PostgreSQL as --pg-user, which must exist",
                    dir.display()
                );
            }
        }
        let data = dir.join("data");
        let log = dir.join("postgresql.log");
        let mut cluster = Cluster {
            bin,
            data,
            log,
            port: 0,
            run_as,
        };
        let started = Instant::now();
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
        // A free port can be taken by someone else between this probe and the start: try a few.
        let mut last_error = None;
        for _ in 0..5 {
            cluster.port = free_port()?;
            match cluster.pg_ctl_start().await {
                Ok(()) => {
                    info!(port = cluster.port, elapsed = ?started.elapsed(), data = %cluster.data.display(),
                        "private PostgreSQL cluster started");
                    return Ok(cluster);
                }
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow::anyhow!("PostgreSQL did not start")))
    }

    /// The cluster's URL (database `postgres`, user `postgres`, trust authentication).
    pub(crate) fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The server log.
    pub(crate) fn log(&self) -> &Path {
        &self.log
    }

    /// Stops the server (`-m immediate`: a crash, recovered at the next start; else `-m fast`),
    /// keeps it down for `down`, starts it again. Returns how long it was unreachable.
    pub(crate) async fn restart(
        &self,
        immediate: bool,
        down: Duration,
    ) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let mode = if immediate { "immediate" } else { "fast" };
        let data = self.data.display().to_string();
        self.tool(
            "pg_ctl",
            &["-D", &data, "-m", mode, "-w", "-t", "60", "stop"],
        )
        .await?;
        tokio::time::sleep(down).await;
        self.pg_ctl_start().await?;
        Ok(started.elapsed())
    }

    async fn pg_ctl_start(&self) -> anyhow::Result<()> {
        // fsync off: the kit crashes PostgreSQL, never the machine, and a commit still reaches
        // the operating system before it returns (synchronous_commit stays on), so nothing
        // committed is lost to an immediate stop. No Unix socket: only this port.
        let options = format!(
            "-c port={} -c listen_addresses=127.0.0.1 -c unix_socket_directories='' \
             -c fsync=off -c max_connections=300 -c shared_buffers=256MB",
            self.port
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

    /// Runs one of the server's tools, as the cluster's OS user; fails with its output.
    async fn tool(&self, name: &str, args: &[&str]) -> anyhow::Result<()> {
        let program = self.bin.join(name);
        let mut command = match &self.run_as {
            Some(user) => {
                let mut c = tokio::process::Command::new("runuser");
                c.arg("-u").arg(user).arg("--").arg(&program);
                c
            }
            None => tokio::process::Command::new(&program),
        };
        // Its own process group: a Ctrl-C in the terminal is the kit's to handle, and the kit
        // then stops the server itself.
        let output = command
            .args(args)
            .stdin(Stdio::null())
            .process_group(0)
            .output()
            .await
            .with_context(|| format!("run {}", program.display()))?;
        if !output.status.success() {
            bail!(
                "{} {} failed ({}): {}{}",
                program.display(),
                args.last().unwrap_or(&""),
                output.status,
                String::from_utf8_lossy(&output.stderr).trim(),
                String::from_utf8_lossy(&output.stdout).trim()
            );
        }
        Ok(())
    }
}

impl Drop for Cluster {
    /// Stops the server at once; the run directory is removed by its owner.
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
        let stopped = command
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "-w", "-t", "30", "stop"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        match stopped {
            Ok(status) if status.success() => info!("private PostgreSQL cluster stopped"),
            // Already stopped (a restart that failed half-way, say) is fine.
            Ok(_) => {}
            Err(e) => {
                warn!(error = %e, data = %self.data.display(), "cannot stop the private PostgreSQL cluster")
            }
        }
    }
}

/// The directory of `initdb` and `pg_ctl`: the newest `/usr/lib/postgresql/*/bin` (Debian's
/// layout), else whatever `PATH` finds.
pub(crate) fn find_bin_dir() -> anyhow::Result<PathBuf> {
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
        .context(
            "no PostgreSQL server binaries (initdb, pg_ctl) in /usr/lib/postgresql/*/bin or PATH; \
             install the server or pass --pg-bin-dir",
        )
}

fn free_port() -> anyhow::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("find a free port")?;
    Ok(listener.local_addr()?.port())
}
