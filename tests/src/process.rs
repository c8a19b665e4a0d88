//! Processes, ports and paths shared by the integration tests and `cargo xtask` (the reference
//! Kafka, difftest, bench): free ports, readiness probes, signals, child processes that never
//! outlive their test.

use anyhow::{bail, Context, Result};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

/// The workspace root (the parent of `tests/`, where this crate lives).
pub fn repo_root() -> PathBuf {
    let manifest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .map_or_else(|| manifest_dir.clone(), Path::to_path_buf)
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> Result<u16> {
    Ok(free_ports(1)?[0])
}

/// Where ports handed out by [`free_ports`] are recorded across processes: the test binaries
/// run side by side (`cargo xtask test`), and a port one of them picked but has not bound yet
/// (a JVM takes seconds to start) must not be picked by another.
const PORT_REGISTRY: &str = "gregor-test-ports";

/// How long a recorded port stays reserved.
const PORT_RESERVATION: Duration = Duration::from_secs(600);

/// Records `port` as taken unless another process took it within [`PORT_RESERVATION`].
fn reserve(port: u16) -> bool {
    let dir = std::env::temp_dir().join(PORT_REGISTRY);
    if std::fs::create_dir_all(&dir).is_err() {
        return true; // no registry: as before, the kernel's choice alone
    }
    let path = dir.join(port.to_string());
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
    {
        Ok(_) => true,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let stale = std::fs::metadata(&path)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_none_or(|age| age > PORT_RESERVATION);
            // An old record is taken over (rewritten, so its time is now).
            stale && std::fs::write(&path, b"").is_ok()
        }
        Err(_) => true,
    }
}

/// The lowest port the kernel hands out as the local port of an outgoing connection
/// (`net.ipv4.ip_local_port_range`; 32768 by default).
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768)
}

/// The ports [`free_ports`] picks from: below the ephemeral range, so that no outgoing
/// connection (a client, a JVM tool, a broker connecting to another) can take a picked port
/// before its server binds it — a port the kernel chose with `bind(0)` is in that range, and
/// such a race failed a proxy's bind in CI. Empty when the ephemeral range starts too low.
fn picking_range() -> std::ops::Range<u16> {
    const LOWEST: u16 = 10_000;
    LOWEST..ephemeral_low().max(LOWEST)
}

/// `n` distinct free ports on 127.0.0.1 (the listeners are held until all are picked, so they
/// differ), none handed to another test process in the last ten minutes. They come from
/// [`picking_range`], starting at a place that differs per process and call; when that range
/// has none left, from the kernel (`bind(0)`).
pub fn free_ports(n: usize) -> Result<Vec<u16>> {
    let mut held = Vec::new();
    let mut ports = Vec::new();
    let range = picking_range();
    let width = u32::from(range.end - range.start);
    if width > 0 {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos())
            ^ std::process::id().wrapping_mul(2_654_435_761);
        let start = seed % width;
        for i in 0..width {
            if ports.len() == n {
                break;
            }
            let Ok(port) = u16::try_from(u32::from(range.start) + (start + i) % width) else {
                continue;
            };
            let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) else {
                continue;
            };
            if reserve(port) {
                ports.push(port);
                held.push(listener);
            }
        }
    }
    while ports.len() < n {
        let listener =
            TcpListener::bind("127.0.0.1:0").context("binding 127.0.0.1:0 to find a free port")?;
        let port = listener.local_addr()?.port();
        if held.len() > 10_000 {
            bail!("no free port found that is not reserved by another test process");
        }
        if reserve(port) {
            ports.push(port);
        }
        held.push(listener);
    }
    Ok(ports)
}

/// Sends one ApiVersions v0 request and checks that a well-formed, error-free answer comes back.
///
/// This is the cheapest request every Kafka broker answers once its listener is ready.
pub fn api_versions_ok(addr: SocketAddr, timeout_ms: u64) -> Result<()> {
    let timeout = Duration::from_millis(timeout_ms);
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let client_id = b"xtask";
    let correlation_id: i32 = 0x6772_6567; // "greg"
    let mut body = Vec::new();
    body.extend_from_slice(&18i16.to_be_bytes()); // api key: ApiVersions
    body.extend_from_slice(&0i16.to_be_bytes()); // api version 0 (request header v1)
    body.extend_from_slice(&correlation_id.to_be_bytes());
    body.extend_from_slice(&i16::try_from(client_id.len())?.to_be_bytes());
    body.extend_from_slice(client_id);
    let mut frame = i32::try_from(body.len())?.to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    stream.write_all(&frame)?;

    let mut len = [0u8; 4];
    stream.read_exact(&mut len)?;
    let len = i32::from_be_bytes(len);
    if !(6..=1 << 20).contains(&len) {
        bail!("ApiVersions response has implausible size {len}");
    }
    let mut resp = vec![0u8; usize::try_from(len)?];
    stream.read_exact(&mut resp)?;
    let got_correlation = i32::from_be_bytes(resp[0..4].try_into()?);
    let error_code = i16::from_be_bytes(resp[4..6].try_into()?);
    if got_correlation != correlation_id {
        bail!("ApiVersions response correlation id {got_correlation}, expected {correlation_id}");
    }
    if error_code != 0 {
        bail!("ApiVersions response error code {error_code}");
    }
    Ok(())
}

/// Polls `addr` with ApiVersions until it answers, the process `alive` says it died, or
/// `deadline_ms` passes.
pub fn wait_for_broker(
    addr: SocketAddr,
    deadline_ms: u64,
    mut alive: impl FnMut() -> Result<()>,
) -> Result<()> {
    let start = Instant::now();
    let mut last_err = None;
    while start.elapsed() < Duration::from_millis(deadline_ms) {
        alive()?;
        match api_versions_ok(addr, 1_000) {
            Ok(()) => return Ok(()),
            Err(e) => last_err = Some(e),
        }
        // Bounded polling of a port: the broker gives us no other readiness signal.
        std::thread::sleep(Duration::from_millis(200));
    }
    let last = last_err.map_or_else(String::new, |e| format!(": last error: {e:#}"));
    bail!("broker at {addr} did not answer ApiVersions within {deadline_ms} ms{last}")
}

/// Whether a process with this pid exists and is not a zombie.
pub fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// The command line of a live process, NUL separators replaced by spaces.
pub fn pid_cmdline(pid: u32) -> Option<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .ok()
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
}

/// Sends `signal` (a name such as TERM or KILL) to `pid` with kill(1).
pub fn signal(pid: u32, signal: &str) -> Result<()> {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .context("running kill")?;
    if !status.success() && pid_alive(pid) {
        bail!("kill -{signal} {pid} failed: {status}");
    }
    Ok(())
}

/// Waits until every thread of `pid` is stopped (`T` or `t` in `/proc/<pid>/task/*/stat`).
/// `kill -STOP` returns once the signal is queued; one thread takes it and then stops the
/// others, and until it runs (on a busy machine, many milliseconds later) the other threads go
/// on working: a follower may still fetch and answer. A test that needs the process frozen
/// waits for this.
///
/// # Errors
/// When some thread still runs after `timeout`, naming it and its state.
pub fn wait_stopped(pid: u32, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let running = running_thread(pid)?;
        let Some((tid, state)) = running else {
            return Ok(());
        };
        if Instant::now() > deadline {
            bail!(
                "thread {tid} of process {pid} is still in state {state} {timeout:?} after SIGSTOP"
            );
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A thread of `pid` that is not stopped, with its state letter; `None` when all are.
fn running_thread(pid: u32) -> Result<Option<(String, char)>> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .with_context(|| format!("listing the threads of process {pid}"))?;
    for task in tasks {
        let task = task.with_context(|| format!("listing the threads of process {pid}"))?;
        // A thread that exited between the listing and the read is not running.
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        // `tid (comm) S ...`: the state follows the last ')' (comm may hold one).
        let state = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].trim_start().chars().next())
            .unwrap_or('?');
        if !matches!(state, 'T' | 't' | 'Z' | 'X') {
            return Ok(Some((
                task.file_name().to_string_lossy().into_owned(),
                state,
            )));
        }
    }
    Ok(None)
}

/// Stops `pid`: SIGTERM, up to `grace_ms` for it to exit, then SIGKILL.
pub fn terminate_pid(pid: u32, grace_ms: u64) -> Result<()> {
    if !pid_alive(pid) {
        return Ok(());
    }
    signal(pid, "TERM")?;
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(grace_ms) {
        if !pid_alive(pid) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    signal(pid, "KILL")?;
    let start = Instant::now();
    while pid_alive(pid) && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// A child process that is stopped (SIGTERM, then SIGKILL) when dropped, so servers started
/// by a test never outlive it, whatever path the test leaves by.
pub struct ChildGuard {
    name: String,
    child: Option<Child>,
}

impl ChildGuard {
    /// Guards `child`, named `name` in messages.
    pub fn new(name: impl Into<String>, child: Child) -> Self {
        Self {
            name: name.into(),
            child: Some(child),
        }
    }

    /// The process id (0 once stopped).
    pub fn id(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Errors if the process has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        if let Some(child) = self.child.as_mut() {
            if let Some(status) = child.try_wait()? {
                bail!("{} exited early with {status}", self.name);
            }
        }
        Ok(())
    }

    /// The exit status if the process has exited (it is then reaped), `None` while it runs or
    /// once stopped.
    ///
    /// # Errors
    /// When the status cannot be read.
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>> {
        match self.child.as_mut() {
            Some(child) => Ok(child.try_wait()?),
            None => Ok(None),
        }
    }

    /// Stops the process and reaps it.
    pub fn stop(&mut self) -> Result<Option<ExitStatus>> {
        let Some(mut child) = self.child.take() else {
            return Ok(None);
        };
        if child.try_wait()?.is_none() {
            terminate_pid(child.id(), 15_000)?;
        }
        Ok(Some(
            child
                .wait()
                .with_context(|| format!("reaping {}", self.name))?,
        ))
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            eprintln!("warning: stopping {}: {e:#}", self.name);
        }
    }
}

/// Runs `cmd` to completion with inherited stdio, printing it first.
pub fn run_status(cmd: &mut Command) -> Result<ExitStatus> {
    eprintln!("$ {}", display_command(cmd));
    cmd.status()
        .with_context(|| format!("starting {}", display_command(cmd)))
}

/// Like [`run_status`] but fails on a non-zero exit.
pub fn run_checked(cmd: &mut Command) -> Result<()> {
    let status = run_status(cmd)?;
    if !status.success() {
        bail!("{} failed: {status}", display_command(cmd));
    }
    Ok(())
}

/// The command line of `cmd`, for logs.
pub fn display_command(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        s.push(' ');
        s.push_str(&arg.to_string_lossy());
    }
    s
}

/// Reads the last `max_lines` lines of a file, for error messages about a server that died.
pub fn tail(path: &Path, max_lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(max_lines)..].join("\n")
}

/// A gregor server process for `cargo xtask` (interop suites, difftest, bench): `gregor serve`
/// of `binary` on 127.0.0.1:`port` with its admin listener on `admin_port`, a fresh data dir
/// and a log file in `work`, stopped when dropped. Integration tests use [`crate::Gregor`],
/// which manages a temporary directory and restarts.
pub struct GregorServer {
    /// `127.0.0.1:<port>`.
    pub bootstrap: String,
    /// `log.dirs`.
    pub log_dir: PathBuf,
    /// stdout and stderr of the server.
    pub log_file: PathBuf,
    /// The process.
    pub guard: ChildGuard,
}

impl GregorServer {
    /// Starts the server with `sets` as `--set key=value` overrides and waits until it answers
    /// ApiVersions (60 s).
    ///
    /// # Errors
    /// When the data dir cannot be prepared, the process cannot start, or it does not come up;
    /// the error carries the last lines of its log.
    pub fn start(
        binary: &Path,
        work: &Path,
        port: u16,
        admin_port: u16,
        sets: &[String],
    ) -> Result<Self> {
        let log_dir = work.join(format!("gregor-data-{port}"));
        if log_dir.exists() {
            std::fs::remove_dir_all(&log_dir)
                .with_context(|| format!("wiping {}", log_dir.display()))?;
        }
        std::fs::create_dir_all(&log_dir)
            .with_context(|| format!("creating {}", log_dir.display()))?;
        let log_file = work.join(format!("gregor-{port}.log"));
        let mut server = Self::spawn(binary, &log_dir, &log_file, port, admin_port, sets)?;
        server.wait_ready()?;
        Ok(server)
    }

    /// Starts `gregor serve` on an existing `log_dir` (kept as it is: a restart) with its
    /// output in `log_file` (created, or truncated), and returns at once without waiting for
    /// it to answer (`cargo xtask scale` times the restart itself).
    ///
    /// # Errors
    /// When the log file cannot be created or the process cannot start.
    pub fn spawn(
        binary: &Path,
        log_dir: &Path,
        log_file: &Path,
        port: u16,
        admin_port: u16,
        sets: &[String],
    ) -> Result<Self> {
        let log = std::fs::File::create(log_file)
            .with_context(|| format!("creating {}", log_file.display()))?;
        let bootstrap = format!("127.0.0.1:{port}");
        let mut cmd = Command::new(binary);
        cmd.arg("serve");
        for set in [
            format!("listeners=PLAINTEXT://{bootstrap}"),
            format!("log.dirs={}", log_dir.display()),
            // A free port rather than the default 9644, which another gregor may hold.
            format!("admin.listener=127.0.0.1:{admin_port}"),
        ]
        .iter()
        .chain(sets)
        {
            cmd.arg("--set").arg(set);
        }
        cmd.stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        eprintln!("$ {} (log: {})", display_command(&cmd), log_file.display());
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        Ok(Self {
            bootstrap,
            log_dir: log_dir.to_path_buf(),
            log_file: log_file.to_path_buf(),
            guard: ChildGuard::new("gregor", child),
        })
    }

    /// Waits (60 s) until the server answers ApiVersions.
    ///
    /// # Errors
    /// When it exits or does not answer in time; the error carries the last lines of its log.
    pub fn wait_ready(&mut self) -> Result<()> {
        let addr: SocketAddr = self.bootstrap.parse()?;
        let guard = &mut self.guard;
        wait_for_broker(addr, 60_000, || guard.check_alive()).with_context(|| {
            format!(
                "gregor did not come up; last lines of {}:\n{}",
                self.log_file.display(),
                tail(&self.log_file, 30)
            )
        })
    }

    /// Errors (with the last lines of its log) if the server has exited.
    ///
    /// # Errors
    /// When the process has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        self.guard.check_alive().with_context(|| {
            format!(
                "gregor died; last lines of {}:\n{}",
                self.log_file.display(),
                tail(&self.log_file, 30)
            )
        })
    }
}

/// Polls `check` every 100 ms until it returns `Some`, for at most `timeout`; `None` after.
/// For state of other processes, read over the wire or from disk, with no event to wait on.
pub fn poll<T>(timeout: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// [`poll`], panicking "timed out waiting for `what`" when `timeout` passes (tests).
pub fn wait_for<T>(timeout: Duration, what: &str, check: impl FnMut() -> Option<T>) -> T {
    poll(timeout, check).unwrap_or_else(|| panic!("timed out waiting for {what}"))
}

/// Prometheus' `promtool` or `prometheus` binary: on PATH, else where `cargo xtask test`
/// extracts Debian's `prometheus` package (`.cache/promtool/root/usr/bin`).
pub fn prometheus_tool(name: &str) -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    });
    on_path.or_else(|| {
        let cached = repo_root().join(".cache/promtool/root/usr/bin").join(name);
        cached.is_file().then_some(cached)
    })
}

/// GETs `path` from an HTTP server on 127.0.0.1:`port` (HTTP/1.1, `Connection: close`, 10 s
/// read timeout); returns (status code, body). A chunked body of one chunk (Prometheus' API) is
/// unwrapped.
///
/// # Errors
/// When the server cannot be reached or answers something that is not HTTP.
pub fn http_get(port: u16, path: &str) -> Result<(u16, String)> {
    http_get_timeout(port, path, Duration::from_secs(10))
}

/// [`http_get`] with a read timeout of `timeout` instead of 10 s.
///
/// # Errors
/// As [`http_get`]; a server silent for `timeout` is an error.
pub fn http_get_timeout(port: u16, path: &str, timeout: Duration) -> Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))
        .with_context(|| format!("connecting to 127.0.0.1:{port}"))?;
    s.set_read_timeout(Some(timeout))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    let status: u16 = raw
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("no HTTP status line")?;
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((raw.as_str(), ""));
    let chunked = head
        .lines()
        .any(|l| l.eq_ignore_ascii_case("transfer-encoding: chunked"));
    let body = if chunked {
        body.split_once("\r\n").map_or("", |(_, b)| b)
    } else {
        body
    };
    Ok((status, body.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Picked ports are distinct, bindable, and outside the kernel's ephemeral range, so no
    /// outgoing connection can take one before its server binds it.
    #[test]
    fn free_ports_are_distinct_and_below_the_ephemeral_range() {
        let ports = free_ports(20).unwrap();
        let distinct: std::collections::BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), 20, "{ports:?}");
        let range = picking_range();
        assert!(
            !range.is_empty(),
            "ephemeral ports start at {}",
            ephemeral_low()
        );
        for p in &ports {
            assert!(range.contains(p), "{p} not in {range:?}");
            TcpListener::bind(("127.0.0.1", *p)).unwrap();
        }
    }
}
