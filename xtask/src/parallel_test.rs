//! The `test` suite of `cargo xtask test`: `cargo test --workspace`, with the test binaries run
//! side by side instead of one after another.
//!
//! Most of gregor's integration tests wait (for elections, session timeouts, a JVM to start)
//! rather than compute, so on a 2-core machine running a few binaries at once roughly halves
//! the wall time. The binaries are built once (`cargo test --no-run`), then run by `jobs`
//! workers, longest first by the durations the previous run recorded in
//! `target/xtask-test-timings.json`, else in the committed `xtask/test-timings.json` (binaries
//! without a record go first). Each binary runs in
//! its package's directory, as `cargo test` runs it, with its output kept in
//! `target/xtask-test-logs/<binary>.log` and printed when it ends. A binary that has not ended
//! after [`BINARY_TIMEOUT`] is killed and fails. Doc tests run afterwards with `cargo test
//! --doc`.

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// How long one test binary may run (the slowest, `cluster_kafka`, takes about two minutes).
pub const BINARY_TIMEOUT: Duration = Duration::from_secs(900);

/// Durations (seconds) of each test binary in one full run on a 2-core machine, committed in
/// `xtask/` so that a fresh checkout starts its longest binaries first too; the run's own
/// record in `target/` takes precedence. Refresh it by copying `target/xtask-test-timings.json`
/// after a full run when binaries are added or change much.
const SEED_TIMINGS: &str = "test-timings.json";

/// Default number of test binaries run at once (`XTASK_TEST_JOBS` overrides it).
pub const DEFAULT_JOBS: usize = 3;

/// A binary's name, outcome and duration in seconds.
type BinaryResult = (String, Result<()>, f64);

/// One test executable cargo built.
#[derive(Debug, Clone)]
struct TestBinary {
    /// `<package>::<target>` (`gregor::cluster`, `gregor-broker::gregor_broker`).
    name: String,
    executable: PathBuf,
    /// The package directory, the working directory `cargo test` gives it.
    package_dir: PathBuf,
}

/// Builds and runs every test of the workspace; `Err` names the binaries that failed.
pub fn run(root: &Path, cargo: &str) -> Result<()> {
    let jobs = std::env::var("XTASK_TEST_JOBS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|j| *j > 0)
        .unwrap_or(DEFAULT_JOBS);
    let binaries = build(root, cargo)?;
    // The Kafka jars once, before binaries run side by side: each would otherwise resolve a
    // fresh cache itself at the same time (Maven copying into the same `libs/` another is
    // emptying), and a test whose fetch failed skips its Kafka half.
    if let Err(e) = crate::kafka::fetch() {
        eprintln!("warning: the Kafka jars could not be fetched ({e:#}); tests that need them skip that part");
    }
    let timings_file = root.join("target").join("xtask-test-timings.json");
    // A fresh checkout (CI) has no record of its own: the committed one orders its first run.
    let mut timings = read_timings(&root.join("xtask").join(SEED_TIMINGS));
    timings.extend(read_timings(&timings_file));
    let logs = root.join("target").join("xtask-test-logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    let mut queue: Vec<TestBinary> = binaries;
    // Longest first; unknown ones (new binaries) before everything.
    queue.sort_by(|a, b| {
        let ta = timings.get(&a.name).copied().unwrap_or(f64::MAX);
        let tb = timings.get(&b.name).copied().unwrap_or(f64::MAX);
        tb.total_cmp(&ta).then_with(|| a.name.cmp(&b.name))
    });
    println!(
        "running {} test binaries, {jobs} at a time (XTASK_TEST_JOBS)",
        queue.len()
    );
    let queue = Arc::new(Mutex::new(VecDeque::from(queue)));
    let results: Arc<Mutex<Vec<BinaryResult>>> = Arc::default();
    let started = Instant::now();
    let workers: Vec<_> = (0..jobs)
        .map(|_| {
            let (queue, results, logs) = (queue.clone(), results.clone(), logs.clone());
            std::thread::spawn(move || loop {
                let next = queue.lock().map(|mut q| q.pop_front()).unwrap_or(None);
                let Some(binary) = next else { return };
                let start = Instant::now();
                let result = run_binary(&binary, &logs);
                let seconds = start.elapsed().as_secs_f64();
                if let Ok(mut r) = results.lock() {
                    r.push((binary.name.clone(), result, seconds));
                }
            })
        })
        .collect();
    for w in workers {
        let _ = w.join();
    }
    let results = std::mem::take(&mut *results.lock().map_err(|_| anyhow::anyhow!("poisoned"))?);
    for (name, _, seconds) in &results {
        timings.insert(name.clone(), *seconds);
    }
    if let Ok(text) = serde_json::to_string_pretty(&timings) {
        let _ = std::fs::write(&timings_file, text);
    }
    println!(
        "\n{} test binaries in {:.1}s",
        results.len(),
        started.elapsed().as_secs_f64()
    );
    let doc = crate::proc::run_checked(
        Command::new(cargo)
            .args(["test", "--workspace", "--doc"])
            .current_dir(root),
    );
    // The CI summary is often all that is kept of a run: it carries each failed binary's
    // panics, not only its name.
    let failed: Vec<String> = results
        .iter()
        .filter_map(|(n, r, _)| r.as_ref().err().map(|e| format!("{n} ({e:#})")))
        .collect();
    if !failed.is_empty() {
        bail!("test binaries failed: {}", failed.join("; "));
    }
    doc.context("doc tests")
}

/// `cargo test --workspace --no-run`, returning the test executables it built.
fn build(root: &Path, cargo: &str) -> Result<Vec<TestBinary>> {
    let mut child = Command::new(cargo)
        .args([
            "test",
            "--workspace",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ])
        .current_dir(root)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("running cargo test --no-run")?;
    let stdout = child.stdout.take().context("cargo's stdout")?;
    let mut binaries = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.context("reading cargo's messages")?;
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if msg["reason"] != "compiler-artifact" || msg["profile"]["test"] != true {
            continue;
        }
        let Some(executable) = msg["executable"].as_str() else {
            continue;
        };
        let manifest = PathBuf::from(msg["manifest_path"].as_str().unwrap_or_default());
        let package_dir = manifest
            .parent()
            .map_or_else(|| root.to_path_buf(), Path::to_path_buf);
        let package = package_dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("?")
            .to_string();
        let target = msg["target"]["name"].as_str().unwrap_or("?");
        binaries.push(TestBinary {
            name: format!("{package}::{target}"),
            executable: PathBuf::from(executable),
            package_dir,
        });
    }
    let status = child.wait().context("waiting for cargo test --no-run")?;
    if !status.success() {
        bail!("cargo test --no-run failed ({status})");
    }
    if binaries.is_empty() {
        bail!("cargo test --no-run built no test binary");
    }
    Ok(binaries)
}

/// Runs one binary with its output in `logs/<name>.log`, printed when it ends.
fn run_binary(binary: &TestBinary, logs: &Path) -> Result<()> {
    let log_path = logs.join(format!("{}.log", binary.name.replace("::", "__")));
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    let start = Instant::now();
    let result = (|| -> Result<()> {
        let mut child = Command::new(&binary.executable)
            .current_dir(&binary.package_dir)
            .env("CARGO_MANIFEST_DIR", &binary.package_dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            // Its own process group, so a timeout kills the nodes it started too.
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting {}", binary.executable.display()))?;
        loop {
            if let Some(status) = child.try_wait()? {
                if status.success() {
                    return Ok(());
                }
                bail!("{status}");
            }
            if start.elapsed() > BINARY_TIMEOUT {
                let _ = Command::new("kill")
                    .args(["-KILL", "--", &format!("-{}", child.id())])
                    .status();
                let _ = child.kill();
                let _ = child.wait();
                bail!("killed after {BINARY_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    })();
    let output = std::fs::read_to_string(&log_path).unwrap_or_default();
    let result = result.map_err(|e| match failure_excerpt(&output) {
        excerpt if excerpt.is_empty() => e,
        excerpt => e.context(excerpt),
    });
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "\n---- {} ({:.1}s): {} ----",
        binary.name,
        start.elapsed().as_secs_f64(),
        match &result {
            Ok(()) => "ok".to_string(),
            Err(e) => format!("FAILED: {e:#}"),
        }
    );
    let _ = out.write_all(output.as_bytes());
    result
}

/// The panics in a failed test binary's output, short: each `thread '<test>' panicked at
/// <place>:` line with the message line after it, at most [`EXCERPT_CHARS`] in all.
fn failure_excerpt(output: &str) -> String {
    let mut parts = Vec::new();
    let mut lines = output.lines();
    while let Some(line) = lines.next() {
        if line.starts_with("thread '") && line.contains("panicked at") {
            let message = lines.next().unwrap_or_default().trim();
            parts.push(format!("{} {message}", line.trim_end_matches(':')));
        }
    }
    let mut excerpt = parts.join(" | ");
    if excerpt.len() > EXCERPT_CHARS {
        let mut end = EXCERPT_CHARS;
        while !excerpt.is_char_boundary(end) {
            end -= 1;
        }
        excerpt.truncate(end);
        excerpt.push_str("...");
    }
    excerpt
}

/// How much of a failed binary's panics its error carries (see [`failure_excerpt`]).
const EXCERPT_CHARS: usize = 600;

fn read_timings(path: &Path) -> BTreeMap<String, f64> {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_excerpt_names_each_panic_with_its_message() {
        let output = "running 2 tests\n\
            thread 'a_test' panicked at crates/cli/tests/x.rs:10:5:\n\
            assertion `left == right` failed\n  left: 1\n right: 2\n\
            test a_test ... FAILED\n\
            thread 'b_test' panicked at crates/cli/tests/x.rs:20:9:\n\
            connect: refused\n";
        assert_eq!(
            failure_excerpt(output),
            "thread 'a_test' panicked at crates/cli/tests/x.rs:10:5 assertion `left == right` failed \
             | thread 'b_test' panicked at crates/cli/tests/x.rs:20:9 connect: refused"
        );
        assert_eq!(failure_excerpt("test result: ok"), "");
        let long = format!("thread 'c' panicked at f.rs:1:1:\n{}\n", "é".repeat(1000));
        let e = failure_excerpt(&long);
        assert!(e.len() <= EXCERPT_CHARS + 3 && e.ends_with("..."), "{e}");
    }
}
