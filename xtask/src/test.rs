//! `cargo xtask test`: everything CI runs, in order, installing what it needs.
//!
//! Suites: fmt, clippy, test (cargo test --workspace), build (release gregor), then the interop
//! suites (python, java, kcat, go) against a `gregor` this command starts on a free port, and a
//! secured twin with a listener per security protocol (`secure.rs`; or, with
//! `--against-kafka`, against the reference Apache Kafka broker, to check the suites
//! themselves). Every suite runs even if an earlier one failed, except that the interop suites
//! need the release build. Then `difftest` (gregor against the reference Apache Kafka, see
//! `difftest.rs`) and `bench-quick` (`cargo xtask bench --quick`, the benchmark harness on tiny
//! sizes), which also need the release build and fetch Kafka's jars themselves, and
//! `rdkafka-suite` (`cargo xtask rdkafka-suite --ci`: the CI subset of librdkafka's own test
//! suite listed in `xtask/rdkafka-suite/expectations.json`, on the release build; it builds
//! librdkafka's test-runner on the library the `test` suite's rdkafka-sys build left in
//! `target/debug/build/`, or from source, and installs the C toolchain when missing). The `fuzz`
//! suite (after `build`) runs each cargo-fuzz target for [`FUZZ_SECONDS_PER_TARGET`] on its
//! committed corpus. The last line
//! is `N passed, N failed` (suites).
//!
//! The process-level cluster tests are part of `test`: `tests/tests/cluster_kafka.rs` runs the
//! fault scenarios (`gregor_tests::scenarios`) on three Apache Kafka nodes with the other
//! reference-Kafka tests (one cluster at a time, each under a minute), and
//! `crates/cli/tests/cluster.rs` and `dev_cluster.rs` run them on gregor (the multi-node
//! ones ignored until gregor is a KRaft cluster). `tests/tests/chaos.rs` runs the replication
//! fault test (`gregor_tests::chaos`, 90 s of faults, about 2.5 minutes in all) on Kafka;
//! its gregor twin `gregor_chaos_bounded` in `crates/cli/tests/cluster.rs` is ignored until
//! partition replication lands. `--only cluster` runs just those files,
//! ignored tests included, within [`CLUSTER_SUITE_TIMEOUT_SECS`].

use crate::kafka;
use crate::proc::{self, repo_root, ChildGuard};
use crate::secure::SecureTarget;
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use gregor_tests::process::GregorServer;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum, Debug)]
pub enum Suite {
    /// cargo fmt --all -- --check
    Fmt,
    /// cargo clippy --workspace --all-targets -- -D warnings
    Clippy,
    /// cargo test --workspace --no-fail-fast
    Test,
    /// cargo build --release -p gregor
    Build,
    /// cargo xtask fuzz --dev --seconds 10: every fuzz target briefly on its committed corpus
    /// (nightly toolchain; installs cargo-fuzz when missing)
    Fuzz,
    /// The interop suites: python, java, kcat, go (and the release build they need).
    Interop,
    /// interop/python (pytest with confluent-kafka and kafka-python)
    Python,
    /// interop/java (Kafka's own command-line tools)
    Java,
    /// interop/kcat (Debian's kcat, librdkafka 2.0.2; installed with apt-get when missing)
    Kcat,
    /// interop/go (`go test` with franz-go: groups, transactions, SCRAM over TLS; needs Go)
    Go,
    /// The python and java interop suites again, against a 3-node gregor cluster
    /// (`gregor dev cluster --nodes 3`, replication factor 3)
    InteropCluster,
    /// cargo xtask difftest (gregor vs the reference Apache Kafka, field by field)
    Difftest,
    /// cargo xtask bench --quick (the benchmark harness, tiny sizes)
    Bench,
    /// cargo xtask rdkafka-suite --ci: the CI subset of librdkafka's own test suite against
    /// the release gregor (with --against-kafka: against Kafka), checked against
    /// xtask/rdkafka-suite/expectations.json (builds librdkafka's test-runner first)
    #[value(name = "rdkafka-suite")]
    Rdkafka,
    /// Only when asked for (`test` runs these files already): the cluster fault tests alone,
    /// on Kafka (tests/tests/cluster_kafka.rs) and on gregor (crates/cli/tests/cluster.rs,
    /// dev_cluster.rs, ignored tests included), bounded in time
    Cluster,
}

#[derive(Args)]
pub struct TestArgs {
    /// Run only these suites (repeat or comma-separate). `interop` means python, java, kcat and go.
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Suite>,
    /// Skip the interop, difftest and bench suites (they need Java and the release build).
    #[arg(long)]
    skip_interop: bool,
    /// Run the interop suites against the reference Apache Kafka broker instead of gregor
    /// (checks the suites themselves; no release build).
    #[arg(long)]
    against_kafka: bool,
    /// Run the interop suites against a 3-node gregor cluster (`gregor dev cluster --nodes 3`:
    /// replication factor 3, min.insync.replicas 2) instead of one node.
    #[arg(long)]
    cluster: bool,
}

/// Fuzzing time per target in the `fuzz` suite, in seconds. The suite builds the targets
/// without optimizations (`--dev`), the fastest build from scratch; see README "Fuzzing".
const FUZZ_SECONDS_PER_TARGET: u64 = 10;

/// Wall-time bound of the `cluster` suite, in seconds: each scenario takes under a minute on
/// Kafka, and a hung cluster must not hold CI. On expiry the whole process group (cargo, the
/// test binaries and their nodes) is killed.
const CLUSTER_SUITE_TIMEOUT_SECS: u64 = 900;

struct Outcome {
    name: &'static str,
    result: Result<()>,
    seconds: f64,
}

pub fn run(args: &TestArgs) -> Result<i32> {
    let root = repo_root();
    let selected = |s: Suite| -> bool {
        let interop = matches!(
            s,
            Suite::Python | Suite::Java | Suite::Kcat | Suite::Go | Suite::InteropCluster
        );
        // Like the interop suites, these need Java, Kafka's jars and the release build.
        let reference = matches!(s, Suite::Difftest | Suite::Bench);
        if (interop || reference || s == Suite::Rdkafka) && args.skip_interop {
            return false;
        }
        if reference && args.against_kafka {
            return false;
        }
        if s == Suite::Cluster {
            // `test` runs the same files; alone only on request.
            return args.only.contains(&s);
        }
        if args.only.is_empty() {
            return true;
        }
        args.only.contains(&s)
            || (interop && args.only.contains(&Suite::Interop))
            || (s == Suite::Build
                && !args.against_kafka
                && (args.only.contains(&Suite::Interop)
                    || args.only.contains(&Suite::InteropCluster)
                    || args.only.contains(&Suite::Difftest)
                    || args.only.contains(&Suite::Bench)
                    || args.only.contains(&Suite::Rdkafka)))
    };
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut outcomes: Vec<Outcome> = Vec::new();
    let mut skipped = 0usize;

    let cargo_suites: [(Suite, &'static str, &[&str]); 4] = [
        (Suite::Fmt, "fmt", &["fmt", "--all", "--", "--check"]),
        (
            Suite::Clippy,
            "clippy",
            &[
                "clippy",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ],
        ),
        (
            Suite::Test,
            "test",
            &["test", "--workspace", "--no-fail-fast"],
        ),
        (
            Suite::Build,
            "build",
            &["build", "--release", "-p", "gregor"],
        ),
    ];
    for (suite, name, cargo_args) in cargo_suites {
        if suite == Suite::Build && args.against_kafka && args.only.is_empty() {
            skipped += 1;
            continue;
        }
        if !selected(suite) {
            skipped += 1;
            continue;
        }
        banner(name);
        let start = Instant::now();
        if suite == Suite::Test {
            // crates/cli/tests/metrics.rs checks /metrics with Prometheus' promtool.
            if let Err(e) = ensure_promtool() {
                eprintln!("warning: promtool is not available: {e:#}");
            }
        }
        let result = if suite == Suite::Test {
            crate::parallel_test::run(&root, &cargo)
        } else {
            proc::run_checked(Command::new(&cargo).args(cargo_args).current_dir(&root))
        };
        outcomes.push(Outcome {
            name,
            result,
            seconds: start.elapsed().as_secs_f64(),
        });
    }

    if selected(Suite::Cluster) {
        banner("cluster");
        let start = Instant::now();
        let result = cluster_suite(&root, &cargo);
        outcomes.push(Outcome {
            name: "cluster",
            result,
            seconds: start.elapsed().as_secs_f64(),
        });
    } else {
        skipped += 1;
    }

    if selected(Suite::Fuzz) {
        banner("fuzz");
        let start = Instant::now();
        let fuzz_args = crate::fuzz::FuzzArgs {
            seconds: FUZZ_SECONDS_PER_TARGET,
            target: Vec::new(),
            jobs: 1,
            dev: true,
            seed_corpus: false,
        };
        let result = crate::fuzz::run(&fuzz_args).and_then(|code| {
            if code == 0 {
                Ok(())
            } else {
                bail!("a fuzz target found a crash (see fuzz/artifacts/)")
            }
        });
        outcomes.push(Outcome {
            name: "fuzz",
            result,
            seconds: start.elapsed().as_secs_f64(),
        });
    } else {
        skipped += 1;
    }

    // The interop suites against one node, then (python and java) against a 3-node cluster
    // (`--cluster` runs only the latter).
    let cluster_run = !args.against_kafka && (args.cluster || selected(Suite::InteropCluster));
    if !args.against_kafka && !args.cluster && !selected(Suite::InteropCluster) {
        skipped += 1;
    }
    let runs: Vec<bool> = if args.cluster && !args.against_kafka {
        vec![true]
    } else if cluster_run {
        vec![false, true]
    } else {
        vec![false]
    };
    for cluster in runs {
        let interop: Vec<(Suite, &'static str)> = [
            (Suite::Python, "interop-python"),
            (Suite::Java, "interop-java"),
            (Suite::Kcat, "interop-kcat"),
            (Suite::Go, "interop-go"),
        ]
        .into_iter()
        .filter(|(s, _)| {
            let keep = if cluster {
                // kcat's checks name the one broker's id in partition listings; the Go suite
                // runs against one node only, to keep CI's time.
                !matches!(s, Suite::Kcat | Suite::Go) && (!args.cluster || selected(*s))
            } else {
                selected(*s)
            };
            if !keep && !cluster {
                skipped += 1;
            }
            keep
        })
        .map(|(s, name)| {
            let name = match (cluster, s) {
                (true, Suite::Python) => "interop-python-cluster",
                (true, _) => "interop-java-cluster",
                _ => name,
            };
            (s, name)
        })
        .collect();
        if interop.is_empty() {
            continue;
        }
        let build_failed = outcomes
            .iter()
            .any(|o| o.name == "build" && o.result.is_err());
        let target = if build_failed {
            Err(anyhow::anyhow!("the release build failed"))
        } else if cluster {
            Target::start_cluster(&root)
        } else {
            Target::start(&root, args.against_kafka)
        };
        // The one-node runs also get the secured broker (issue 13), whose endpoints and
        // credentials the suites read from the environment; cluster runs do without (their
        // suites skip the security checks).
        let target = target.and_then(|mut t| {
            if !cluster {
                let binary = root.join("target").join("release").join("gregor");
                let work = root.join("target").join("interop");
                let secure =
                    SecureTarget::start(&work, (!args.against_kafka).then_some(binary.as_path()))
                        .context("starting the secured broker");
                match secure {
                    Ok(s) => t.secure = Some(s),
                    Err(e) => {
                        t.stop();
                        return Err(e);
                    }
                }
            }
            Ok(t)
        });
        match target {
            Err(e) => {
                let msg = format!("{e:#}");
                for (_, name) in interop {
                    outcomes.push(Outcome {
                        name,
                        result: Err(anyhow::anyhow!("no server to test against: {msg}")),
                        seconds: 0.0,
                    });
                }
            }
            Ok(mut target) => {
                for (suite, name) in interop {
                    banner(name);
                    let start = Instant::now();
                    let result = match suite {
                        Suite::Python => python_suite(&root, &target),
                        Suite::Kcat => kcat_suite(&root, &target),
                        Suite::Go => go_suite(&root, &target),
                        _ => java_suite(&root, &target),
                    }
                    .and_then(|()| target.check_alive());
                    outcomes.push(Outcome {
                        name,
                        result,
                        seconds: start.elapsed().as_secs_f64(),
                    });
                }
                target.stop();
            }
        }
    }

    // gregor against the reference broker: both start their own servers on free ports.
    for (suite, name) in [(Suite::Difftest, "difftest"), (Suite::Bench, "bench-quick")] {
        if !selected(suite) {
            skipped += 1;
            continue;
        }
        banner(name);
        let start = Instant::now();
        let build_failed = outcomes
            .iter()
            .any(|o| o.name == "build" && o.result.is_err());
        let binary = root.join("target").join("release").join("gregor");
        let result = if build_failed {
            Err(anyhow::anyhow!("the release build failed"))
        } else if suite == Suite::Difftest {
            crate::difftest::run(&crate::difftest::DifftestArgs {
                binary: Some(binary),
                filter: None,
                verbose: false,
            })
            .and_then(|code| match code {
                0 => Ok(()),
                _ => Err(anyhow::anyhow!(
                    "undocumented differences (see above and docs/compatibility.md)"
                )),
            })
        } else {
            crate::bench::run(&crate::bench::BenchArgs {
                quick: true,
                repeat: None,
                only: vec![],
                binary: Some(binary),
                baseline: None,
                no_kafka: false,
                render: false,
                no_drop_caches: false,
            })
            .map(|_| ())
        };
        outcomes.push(Outcome {
            name,
            result,
            seconds: start.elapsed().as_secs_f64(),
        });
    }

    if selected(Suite::Rdkafka) {
        banner("rdkafka-suite");
        let start = Instant::now();
        let build_failed = outcomes
            .iter()
            .any(|o| o.name == "build" && o.result.is_err());
        let result = if build_failed && !args.against_kafka {
            Err(anyhow::anyhow!("the release build failed"))
        } else {
            crate::rdkafka_suite::run(&crate::rdkafka_suite::RdkafkaSuiteArgs {
                broker: if args.against_kafka {
                    crate::rdkafka_suite::BrokerChoice::Kafka
                } else {
                    crate::rdkafka_suite::BrokerChoice::Gregor
                },
                ci: true,
                binary: (!args.against_kafka)
                    .then(|| root.join("target").join("release").join("gregor")),
                ..Default::default()
            })
            .and_then(|code| match code {
                0 => Ok(()),
                _ => Err(anyhow::anyhow!(
                    "results differ from xtask/rdkafka-suite/expectations.json (see above)"
                )),
            })
        };
        outcomes.push(Outcome {
            name: "rdkafka-suite",
            result,
            seconds: start.elapsed().as_secs_f64(),
        });
    } else {
        skipped += 1;
    }

    println!();
    println!("==== summary ====");
    for o in &outcomes {
        match &o.result {
            Ok(()) => println!("PASS  {:<16} {:>7.1}s", o.name, o.seconds),
            Err(e) => println!("FAIL  {:<16} {:>7.1}s  {e:#}", o.name, o.seconds),
        }
    }
    let failed = outcomes.iter().filter(|o| o.result.is_err()).count();
    let passed = outcomes.len() - failed;
    if skipped > 0 {
        println!("{passed} passed, {failed} failed, {skipped} skipped");
    } else {
        println!("{passed} passed, {failed} failed");
    }
    Ok(i32::from(failed > 0 || outcomes.is_empty()))
}

fn banner(name: &str) {
    println!("\n==== {name} ====");
}

/// The server the interop suites talk to, stopped when dropped.
struct Target {
    name: &'static str,
    bootstrap: String,
    log_dir: PathBuf,
    log_file: PathBuf,
    guard: ChildGuard,
    /// The secured broker of the one-node runs.
    secure: Option<SecureTarget>,
}

impl Target {
    fn start(root: &Path, against_kafka: bool) -> Result<Self> {
        let ports = proc::free_ports(2)?;
        let work = root.join("target").join("interop");
        std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
        if against_kafka {
            kafka::fetch()?;
            let instance = kafka::Instance::new(
                ports[0],
                Some(ports[1]),
                Some(work.join(format!("kafka-data-{}", ports[0]))),
            )?;
            let mut guard = ChildGuard::new("kafka", instance.spawn()?);
            instance.wait_ready(|| guard.check_alive())?;
            Ok(Self {
                name: "kafka",
                bootstrap: instance.bootstrap(),
                log_dir: instance.data_dir.clone(),
                log_file: instance.server_log(),
                guard,
                secure: None,
            })
        } else {
            let binary = root.join("target").join("release").join("gregor");
            if !binary.exists() {
                bail!(
                    "{} is missing: run `cargo build --release -p gregor`",
                    binary.display()
                );
            }
            let server = GregorServer::start(&binary, &work, ports[0], ports[1], &[])?;
            Ok(Self {
                name: "gregor",
                bootstrap: server.bootstrap,
                log_dir: server.log_dir,
                log_file: server.log_file,
                guard: server.guard,
                secure: None,
            })
        }
    }

    /// `gregor dev cluster --nodes 3` with the release binary: the bootstrap servers are the
    /// three brokers, `GREGOR_LOG_DIR` the three data dirs joined with ':'.
    fn start_cluster(root: &Path) -> Result<Self> {
        let binary = root.join("target").join("release").join("gregor");
        if !binary.exists() {
            bail!(
                "{} is missing: run `cargo build --release -p gregor`",
                binary.display()
            );
        }
        let work = root.join("target").join("interop");
        let dir = work.join(format!("cluster-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let out_path = dir.join("dev-cluster.out");
        let out = std::fs::File::create(&out_path)
            .with_context(|| format!("creating {}", out_path.display()))?;
        let child = Command::new(&binary)
            .args(["dev", "cluster", "--nodes", "3", "--dir"])
            .arg(&dir)
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .context("starting gregor dev cluster")?;
        let mut guard = ChildGuard::new("gregor dev cluster", child);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        let bootstrap = loop {
            guard.check_alive().with_context(|| {
                format!(
                    "gregor dev cluster exited:\n{}",
                    std::fs::read_to_string(&out_path).unwrap_or_default()
                )
            })?;
            let text = std::fs::read_to_string(&out_path).unwrap_or_default();
            if text.contains("running;") {
                let line = text
                    .lines()
                    .find_map(|l| l.strip_prefix("bootstrap servers:"))
                    .context("no bootstrap servers line")?;
                break line.trim().to_string();
            }
            if std::time::Instant::now() > deadline {
                bail!("gregor dev cluster did not start within 120 s:\n{text}");
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        };
        let log_dir = (1..=3)
            .map(|i| {
                dir.join(format!("node-{i}"))
                    .join("data")
                    .display()
                    .to_string()
            })
            .collect::<Vec<_>>()
            .join(":");
        Ok(Self {
            name: "gregor",
            bootstrap,
            log_dir: PathBuf::from(log_dir),
            log_file: dir.join("node-1").join("server.log"),
            guard,
            secure: None,
        })
    }

    fn check_alive(&mut self) -> Result<()> {
        if let Some(secure) = self.secure.as_mut() {
            secure.check_alive()?;
        }
        self.guard.check_alive().with_context(|| {
            format!(
                "{} died during the suite; last lines of {}:\n{}",
                self.name,
                self.log_file.display(),
                proc::tail(&self.log_file, 30)
            )
        })
    }

    fn stop(mut self) {
        if let Some(secure) = self.secure.take() {
            secure.stop();
        }
        eprintln!("Stopping {} (pid {})", self.name, self.guard.id());
        if let Err(e) = self.guard.stop() {
            eprintln!("warning: stopping {}: {e:#}", self.name);
        }
    }

    fn env(&self, cmd: &mut Command) {
        cmd.env("GREGOR_BOOTSTRAP", &self.bootstrap)
            .env("GREGOR_LOG_DIR", &self.log_dir)
            .env("GREGOR_SERVER", self.name);
        if self.bootstrap.contains(',') {
            cmd.env("GREGOR_REPLICATION_FACTOR", "3")
                .env("GREGOR_BROKERS", "3");
        }
        if let Some(secure) = &self.secure {
            secure.env(cmd);
        }
    }
}

/// Creates `interop/python/.venv` and installs requirements.txt into it when it changed.
fn python_venv(root: &Path) -> Result<PathBuf> {
    let dir = root.join("interop").join("python");
    let venv = dir.join(".venv");
    let python = venv.join("bin").join("python");
    let requirements = std::fs::read_to_string(dir.join("requirements.txt"))
        .context("reading interop/python/requirements.txt")?;
    let stamp = venv.join(".installed-requirements.txt");
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(requirements.as_str())
        && python.exists()
    {
        return Ok(python);
    }
    if !python.exists() {
        let system_python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
        let create =
            || proc::run_checked(Command::new(&system_python).args(["-m", "venv"]).arg(&venv));
        if let Err(first) = create() {
            // Debian's own python3 ships `venv` without ensurepip; python3-venv adds it.
            let _ = std::fs::remove_dir_all(&venv);
            if !is_root() || which("apt-get").is_none() {
                return Err(first)
                    .context("creating the Python venv (on Debian, install python3-venv)");
            }
            eprintln!("python3 -m venv failed ({first:#}); installing python3-venv with apt-get");
            proc::run_checked(Command::new("apt-get").args(["update", "-qq"]))?;
            proc::run_checked(Command::new("apt-get").args([
                "install",
                "-y",
                "-qq",
                "python3-venv",
            ]))?;
            create().context("creating the Python venv after installing python3-venv")?;
        }
    }
    proc::run_checked(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "-q",
                "-r",
            ])
            .arg(dir.join("requirements.txt")),
    )
    .context("installing interop/python/requirements.txt")?;
    std::fs::write(&stamp, requirements)?;
    Ok(python)
}

fn python_suite(root: &Path, target: &Target) -> Result<()> {
    let python = python_venv(root)?;
    let mut cmd = Command::new(python);
    cmd.args(["-m", "pytest", "-v", "-p", "no:cacheprovider"])
        .arg(root.join("interop").join("python"))
        .current_dir(root);
    target.env(&mut cmd);
    let status = proc::run_status(&mut cmd)?;
    match status.code() {
        Some(0) => Ok(()),
        Some(5) => bail!("pytest collected no tests"),
        _ => bail!("pytest failed: {status}"),
    }
}

fn java_suite(root: &Path, target: &Target) -> Result<()> {
    kafka::fetch()?;
    let mut cmd = Command::new("bash");
    cmd.arg(root.join("interop").join("java").join("run.sh"))
        .current_dir(root);
    // The script runs Kafka's tools through this same binary, without a cargo round trip.
    if let Ok(exe) = std::env::current_exe() {
        cmd.env("XTASK", exe);
    }
    target.env(&mut cmd);
    proc::run_checked(&mut cmd)
}

fn kcat_suite(root: &Path, target: &Target) -> Result<()> {
    apt_install("kcat", "kcat")?;
    // The script creates its multi-partition topics with Kafka's kafka-topics.
    kafka::fetch()?;
    let mut cmd = Command::new("bash");
    cmd.arg(root.join("interop").join("kcat").join("run.sh"))
        .current_dir(root);
    if let Ok(exe) = std::env::current_exe() {
        cmd.env("XTASK", exe);
    }
    target.env(&mut cmd);
    proc::run_checked(&mut cmd)
}

/// interop/go: `go test` of the franz-go package against the broker (and its secured twin).
/// Modules come from the Go module proxy, pinned by the committed go.sum (`go mod download`
/// first, so that a download failure is told apart from a test failure).
fn go_suite(root: &Path, target: &Target) -> Result<()> {
    let go = which("go")
        .or_else(|| {
            let p = PathBuf::from("/usr/local/go/bin/go");
            p.is_file().then_some(p)
        })
        .context("Go is not installed (interop/go needs the Go toolchain named in its go.mod)")?;
    let dir = root.join("interop").join("go");
    proc::run_checked(
        Command::new(&go)
            .args(["mod", "download"])
            .current_dir(&dir),
    )
    .context("go mod download in interop/go")?;
    let mut cmd = Command::new(&go);
    cmd.args(["test", "-count=1", "-v", "-timeout", "300s", "./..."])
        .current_dir(&dir);
    target.env(&mut cmd);
    proc::run_checked(&mut cmd)
}

/// The cluster fault tests: on Kafka, then on gregor with the ignored ones, one test at a
/// time, all within [`CLUSTER_SUITE_TIMEOUT_SECS`].
fn cluster_suite(root: &Path, cargo: &str) -> Result<()> {
    let deadline = Instant::now() + std::time::Duration::from_secs(CLUSTER_SUITE_TIMEOUT_SECS);
    let runs: [&[&str]; 2] = [
        &[
            "test",
            "-p",
            "gregor-tests",
            "--test",
            "cluster_kafka",
            "--test",
            "chaos",
            "--",
            "--test-threads=1",
        ],
        &[
            "test",
            "-p",
            "gregor",
            "--test",
            "cluster",
            "--test",
            "dev_cluster",
            "--",
            "--include-ignored",
            "--test-threads=1",
        ],
    ];
    let mut failed = Vec::new();
    for args in runs {
        let mut cmd = Command::new(cargo);
        cmd.args(args).current_dir(root);
        // Its own process group, so that on time-out the test binaries and the nodes they
        // started go with cargo.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        eprintln!("$ {}", proc::display_command(&cmd));
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", proc::display_command(&cmd)))?;
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if Instant::now() > deadline {
                let group = format!("-{}", child.id());
                let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
                let _ = child.wait();
                bail!("the cluster suite took over {CLUSTER_SUITE_TIMEOUT_SECS} s and was killed");
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        };
        if !status.success() {
            failed.push(format!("{}: {status}", proc::display_command(&cmd)));
        }
    }
    if !failed.is_empty() {
        bail!("{}", failed.join("; "));
    }
    Ok(())
}

/// Makes `promtool` available to the tests: from PATH, or else extracted from Debian's
/// `prometheus` package into `.cache/promtool` without installing the package (installing it
/// would also install and start the Prometheus server as a service). The directory holding it
/// is put first on PATH for the test processes.
fn ensure_promtool() -> Result<()> {
    if which("promtool").is_some() {
        return Ok(());
    }
    let cache = repo_root().join(".cache/promtool");
    let bin_dir = cache.join("root/usr/bin");
    if !bin_dir.join("promtool").is_file() {
        if which("apt-get").is_none() || which("dpkg-deb").is_none() {
            bail!("promtool is missing: install Debian's `prometheus` package, or put promtool on PATH");
        }
        eprintln!(
            "promtool is missing; downloading Debian's `prometheus` package into {} and \
             extracting promtool from it (nothing is installed, no service is started)",
            cache.display()
        );
        std::fs::create_dir_all(&cache)?;
        let download = || {
            proc::run_checked(
                Command::new("apt-get")
                    .args(["download", "-qq", "prometheus"])
                    .current_dir(&cache),
            )
        };
        if download().is_err() {
            if !is_root() {
                bail!("apt-get download prometheus failed; run `apt-get update` as root first");
            }
            proc::run_checked(Command::new("apt-get").args(["update", "-qq"]))?;
            download().context("apt-get download prometheus")?;
        }
        let deb = std::fs::read_dir(&cache)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|x| x == "deb"))
            .context("apt-get download left no .deb")?;
        proc::run_checked(
            Command::new("dpkg-deb")
                .arg("-x")
                .arg(&deb)
                .arg(cache.join("root")),
        )?;
        std::fs::remove_file(&deb)?;
    }
    if !bin_dir.join("promtool").is_file() {
        bail!("the prometheus package held no usr/bin/promtool");
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let joined =
        std::env::join_paths(std::iter::once(bin_dir).chain(std::env::split_paths(&path)))?;
    std::env::set_var("PATH", joined);
    Ok(())
}

/// Runs `apt-get install PACKAGE` (after `apt-get update` when the first try fails) unless
/// `program` is already on PATH.
fn apt_install(program: &str, package: &str) -> Result<()> {
    if which(program).is_some() {
        return Ok(());
    }
    eprintln!("{program} is missing; installing `{package}` with apt-get");
    apt_get_install(&[package])?;
    if which(program).is_none() {
        bail!("`{package}` is installed but {program} is still not on PATH");
    }
    Ok(())
}

/// `apt-get install -y --no-install-recommends PACKAGES` (after `apt-get update` when the
/// first try fails); callers say what they install and why before calling.
///
/// # Errors
/// When not root, without apt-get, or when the install fails.
pub(crate) fn apt_get_install(packages: &[&str]) -> Result<()> {
    if !is_root() || which("apt-get").is_none() {
        bail!(
            "missing Debian packages: install {} (needs root and apt-get)",
            packages.join(" ")
        );
    }
    let install = || {
        proc::run_checked(
            Command::new("apt-get")
                .args(["install", "-y", "-qq", "--no-install-recommends"])
                .args(packages)
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )
    };
    if install().is_err() {
        proc::run_checked(Command::new("apt-get").args(["update", "-qq"]))?;
        install().with_context(|| format!("apt-get install {}", packages.join(" ")))?;
    }
    Ok(())
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// The path of `program` on PATH, if any.
pub(crate) fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|p| p.is_file())
    })
}
