//! The test harness, in one place for every test crate and for `cargo xtask`:
//! - [`Gregor`]: runs the real `gregor` binary as a child process on a free 127.0.0.1 port with
//!   its own data directory, waits until it accepts connections, and restarts it gracefully
//!   (SIGTERM) or by crashing it (SIGKILL). The integration tests that use it live in
//!   `crates/cli/tests/` so that cargo builds the binary for them.
//! - [`process`]: free ports, ApiVersions readiness probes, signals, child processes that never
//!   outlive their test.
//! - [`wire`]: a raw Kafka protocol client for tests that control every byte.
//! - [`reference`]: the reference Apache Kafka broker and tools from Maven Central.
//! - `clients` (feature `rdkafka`, on by default): rdkafka admin/producer/consumer helpers.
//! - [`cluster`]: a multi-node KRaft cluster of gregor or Kafka processes,
//!   with kill -9, SIGSTOP/SIGCONT, graceful stop and restart per node.
//! - [`history`]: records operations and their outcomes, and checks the final state against
//!   them (acknowledged but lost, duplicated, reordered).
//! - `scenarios` (feature `rdkafka`): fault scenarios on a three-node cluster, generic over
//!   the implementation.
//! - [`proxy`]: in-process TCP proxies in front of every listener of a cluster, to cut and
//!   heal single links between nodes without root.
//! - `chaos` (feature `rdkafka`): the replication fault test: librdkafka and Java acks=all
//!   producers, a live consumer, a seeded schedule of faults, the history check.
//! - `mixed` (feature `rdkafka`): a partition replicated across gregor and Apache Kafka
//!   brokers of one cluster (issue 11), with the history check.

#[cfg(feature = "rdkafka")]
pub mod chaos;
#[cfg(feature = "rdkafka")]
pub mod clients;
pub mod cluster;
pub mod history;
#[cfg(feature = "rdkafka")]
pub mod mixed;
pub mod process;
pub mod proxy;
pub mod reference;
#[cfg(feature = "rdkafka")]
pub mod scenarios;
pub mod wire;

pub use process::free_port;

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// A running gregor broker process.
pub struct Gregor {
    bin: PathBuf,
    child: Option<Child>,
    /// Client port on 127.0.0.1.
    pub port: u16,
    /// Admin HTTP port (`/metrics`, `/health`, `/ready`) on 127.0.0.1.
    pub admin_port: u16,
    data: tempfile::TempDir,
    extra: Vec<String>,
    env: Vec<(String, String)>,
    /// `RLIMIT_NOFILE` (soft and hard) for the process, set with util-linux's `prlimit`.
    nofile: Option<u64>,
}

impl Gregor {
    /// Starts `bin` with a fresh data dir, a free port and `extra` as `--set` overrides
    /// (`key=value`).
    ///
    /// # Errors
    /// When the process cannot start or does not listen within 60 s.
    pub fn start(bin: impl AsRef<Path>, extra: &[&str]) -> Result<Self> {
        let mut g = Self {
            bin: bin.as_ref().to_path_buf(),
            child: None,
            port: free_port()?,
            admin_port: free_port()?,
            data: tempfile::tempdir().context("creating a data dir")?,
            extra: extra.iter().map(|s| (*s).to_string()).collect(),
            env: Vec::new(),
            nofile: None,
        };
        g.spawn()?;
        Ok(g)
    }

    /// Like [`Gregor::start`] with the process's open-file limit (soft and hard, so the broker
    /// cannot raise it) set to `nofile`, here and on every restart.
    ///
    /// # Errors
    /// As [`Gregor::start`].
    pub fn start_with_nofile(bin: impl AsRef<Path>, extra: &[&str], nofile: u64) -> Result<Self> {
        let mut g = Self {
            bin: bin.as_ref().to_path_buf(),
            child: None,
            port: free_port()?,
            admin_port: free_port()?,
            data: tempfile::tempdir().context("creating a data dir")?,
            extra: extra.iter().map(|s| (*s).to_string()).collect(),
            env: Vec::new(),
            nofile: Some(nofile),
        };
        g.spawn()?;
        Ok(g)
    }

    /// [`Gregor::start_with_nofile`] with extra environment variables (test hooks of the
    /// broker), here and on every restart.
    ///
    /// # Errors
    /// As [`Gregor::start`].
    pub fn start_with_nofile_and_env(
        bin: impl AsRef<Path>,
        extra: &[&str],
        nofile: u64,
        env: &[(&str, &str)],
    ) -> Result<Self> {
        let mut g = Self {
            bin: bin.as_ref().to_path_buf(),
            child: None,
            port: free_port()?,
            admin_port: free_port()?,
            data: tempfile::tempdir().context("creating a data dir")?,
            extra: extra.iter().map(|s| (*s).to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect(),
            nofile: Some(nofile),
        };
        g.spawn()?;
        Ok(g)
    }

    /// Like [`Gregor::start`] with more listeners beside the PLAINTEXT one the harness
    /// waits on (`extra_listeners`, e.g. `SSL://127.0.0.1:<port>`), and extra environment
    /// variables, here and on every restart.
    ///
    /// # Errors
    /// As [`Gregor::start`].
    pub fn start_with_listeners(
        bin: impl AsRef<Path>,
        extra_listeners: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Self> {
        let port = free_port()?;
        let mut all = vec![format!(
            "listeners=PLAINTEXT://127.0.0.1:{port},{extra_listeners}"
        )];
        all.extend(extra.iter().map(|s| (*s).to_string()));
        let mut g = Self {
            bin: bin.as_ref().to_path_buf(),
            child: None,
            port,
            admin_port: free_port()?,
            data: tempfile::tempdir().context("creating a data dir")?,
            extra: all,
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect(),
            nofile: None,
        };
        g.spawn()?;
        Ok(g)
    }

    /// Like [`Gregor::start`] with extra environment variables, and without waiting for the
    /// client listener (for tests of start-up itself).
    ///
    /// # Errors
    /// When the process cannot be spawned.
    pub fn spawn_with_env(
        bin: impl AsRef<Path>,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Self> {
        let mut g = Self {
            bin: bin.as_ref().to_path_buf(),
            child: None,
            port: free_port()?,
            admin_port: free_port()?,
            data: tempfile::tempdir().context("creating a data dir")?,
            extra: extra.iter().map(|s| (*s).to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect(),
            nofile: None,
        };
        g.spawn_process()?;
        Ok(g)
    }

    /// Waits until the client listener answers ApiVersions.
    ///
    /// # Errors
    /// When the process exits or does not listen within 60 s.
    pub fn wait_ready(&mut self) -> Result<()> {
        self.wait_listening(Duration::from_secs(60))
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `127.0.0.1:<port>`.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// GETs `path` from the admin listener; returns (status code, body).
    ///
    /// # Errors
    /// When the listener cannot be reached or answers something that is not HTTP.
    pub fn admin_get(&self, path: &str) -> Result<(u16, String)> {
        process::http_get(self.admin_port, path).context("GET from the admin listener")
    }

    /// The data directory (`log.dirs`).
    pub fn data_dir(&self) -> &Path {
        self.data.path()
    }

    fn spawn(&mut self) -> Result<()> {
        self.spawn_process()?;
        self.wait_listening(Duration::from_secs(60))
    }

    fn spawn_process(&mut self) -> Result<()> {
        // prlimit sets the limit and execs the broker (same pid).
        let mut cmd = match self.nofile {
            Some(n) => {
                let mut c = Command::new("prlimit");
                c.arg(format!("--nofile={n}:{n}")).arg(&self.bin);
                c
            }
            None => Command::new(&self.bin),
        };
        cmd.envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        cmd.arg("serve")
            .arg("--set")
            .arg(format!("listeners=PLAINTEXT://127.0.0.1:{}", self.port))
            .arg("--set")
            .arg(format!("log.dirs={}", self.data.path().display()))
            .arg("--set")
            .arg(format!("admin.listener=127.0.0.1:{}", self.admin_port));
        for e in &self.extra {
            cmd.arg("--set").arg(e);
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.data.path().join("gregor-test.log"))
            .context("opening the server log")?;
        cmd.stdout(Stdio::null()).stderr(Stdio::from(log));
        let child = cmd
            .spawn()
            .with_context(|| format!("spawning {}", self.bin.display()))?;
        self.child = Some(child);
        Ok(())
    }

    fn wait_listening(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], self.port));
        loop {
            // Answering ApiVersions, not only accepting TCP: the listener is bound before the
            // broker has registered (after a crash that waits out the old incarnation's
            // session, broker.session.timeout.ms), and connections wait in the backlog.
            if TcpStream::connect(addr).is_ok() && process::api_versions_ok(addr, 1_000).is_ok() {
                return Ok(());
            }
            if let Some(c) = self.child.as_mut() {
                if let Some(status) = c.try_wait()? {
                    bail!(
                        "gregor exited with {status} before listening; log:\n{}",
                        self.server_log()
                    );
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "gregor did not listen within {timeout:?}; log:\n{}",
                    self.server_log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The server's stderr so far.
    pub fn server_log(&self) -> String {
        std::fs::read_to_string(self.data.path().join("gregor-test.log")).unwrap_or_default()
    }

    fn signal(&mut self, sig: &str) -> Result<Option<std::process::ExitStatus>> {
        let Some(mut child) = self.child.take() else {
            return Ok(None);
        };
        let status = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(child.id().to_string())
            .status()
            .context("running kill")?;
        if !status.success() {
            bail!("kill -{sig} failed");
        }
        Ok(Some(child.wait().context("waiting for gregor to exit")?))
    }

    /// Graceful stop (SIGTERM), waiting for the process to exit. Fails if it exits non-zero.
    ///
    /// # Errors
    /// When the process cannot be signalled or exits unsuccessfully.
    pub fn stop(&mut self) -> Result<()> {
        if let Some(status) = self.signal("TERM")? {
            if !status.success() {
                bail!(
                    "gregor exited with {status} on SIGTERM; log:\n{}",
                    self.server_log()
                );
            }
        }
        Ok(())
    }

    /// Crash (SIGKILL): no flush, no clean-shutdown marker.
    ///
    /// # Errors
    /// When the process cannot be signalled.
    pub fn kill9(&mut self) -> Result<()> {
        self.signal("KILL").map(|_| ())
    }

    /// Starts the process again on the same port and data dir.
    ///
    /// # Errors
    /// As [`Gregor::start`].
    pub fn restart(&mut self) -> Result<()> {
        if self.child.is_some() {
            self.stop()?;
        }
        self.spawn()
    }

    /// [`Gregor::restart`] with `extra` replacing the `--set` overrides, here and on later
    /// restarts (the same data dir, served with other settings).
    ///
    /// # Errors
    /// As [`Gregor::start`].
    pub fn restart_with(&mut self, extra: &[&str]) -> Result<()> {
        if self.child.is_some() {
            self.stop()?;
        }
        self.extra = extra.iter().map(|s| (*s).to_string()).collect();
        self.spawn()
    }
}

impl Drop for Gregor {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
