//! `cargo xtask rdkafka-suite`: librdkafka's own integration test suite (`tests/` of the
//! librdkafka source in the `rdkafka-sys` crate, driven by its `test-runner`) against gregor
//! and, with `--broker kafka|both`, against the reference Apache Kafka configured the same.
//!
//! - The runner is built once per librdkafka version ([`build`]).
//! - The tests are the suite's table in `test.c` ([`table`]) less the local (mock-cluster)
//!   and manual ones; `--tests` and `--ci` narrow them. Each gregor test has an entry in
//!   `xtask/rdkafka-suite/expectations.json` ([`expectations`]); a result that differs from
//!   it fails the command.
//! - One `test-runner` process per test number and scenario (`TESTS=0011`; the runner selects
//!   by number, so the `0045_*` tests of one scenario share a process), with `-L` (no local
//!   tests), `-p1`, and a time-out after which its whole process group is killed. Its
//!   environment: `TEST_KAFKA_VERSION` (the suite gates features on it), `RDKAFKA_TEST_CONF`
//!   (a `test.conf` with `bootstrap.servers`), `BROKERS` and `KAFKA_PATH` (a directory whose
//!   `bin/kafka-*.sh` run Kafka's tools from the jars of `cargo xtask kafka`, for the tests
//!   that call them), and `CI` removed (with it the runner skips some tests and stretches
//!   time-outs, so results would depend on where the command runs).
//! - The broker is configured as the suite's own clusters (trivup's `scenarios/*.json` and
//!   `KafkaBrokerApp`): `num.partitions=4`, topic auto-creation on (`default` scenario) or off
//!   (`noautocreate`), Kafka's default `group.initial.rebalance.delay.ms` of 3000, a rack and
//!   the rack-aware replica selector; Kafka also gets trivup's authorizer (with
//!   `allow.everyone.if.no.acl.found=true`), which gregor refuses until its security work
//!   lands. One node, where trivup starts three: tests that need more brokers skip or fail
//!   on both.
//!
//! One broker serves all the tests of a scenario, as in the suite's own runs: its tests
//! use unique (mostly random) topic and group names and expect a long-lived cluster, and a
//! fresh broker per test would add a JVM start (about 10 s) to each of a hundred Kafka
//! tests. A broker that dies is reported against the test that was running and restarted
//! fresh for the next.
//!
//! Output: a table per broker (test, result, seconds), the counts, the tests that pass on
//! Kafka and fail on gregor, the differences from the expectations, and a JSON report in
//! `target/librdkafka-suite/report.json`; the runners' logs are in
//! `target/librdkafka-suite/runs/<broker>/`.

pub mod build;
pub mod expectations;
pub mod outcome;
pub mod table;

use crate::kafka;
use crate::proc::{self, repo_root, ChildGuard, GregorServer};
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use expectations::{Expect, Expectations};
use outcome::{Exit, Outcome};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use table::SuiteTest;

/// The expectations file, relative to the workspace root.
pub const EXPECTATIONS: &str = "xtask/rdkafka-suite/expectations.json";

/// Default time-out of one runner process, in seconds (a test's `timeout` entry wins).
pub const DEFAULT_TIMEOUT_SECS: u64 = 300;

/// The scenarios (trivup cluster set-ups of the suite's `scenarios/`) this command can give
/// a broker for, in the order they run.
const SCENARIOS: &[&str] = &["default", "noautocreate"];

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum, Debug)]
pub enum BrokerChoice {
    /// gregor (the release binary).
    Gregor,
    /// The reference Apache Kafka 4.4.0 (jars of `cargo xtask kafka`).
    Kafka,
    /// gregor, then Kafka, and the tests that pass on Kafka and fail on gregor.
    Both,
}

#[derive(Args, Clone)]
pub struct RdkafkaSuiteArgs {
    /// The broker(s) to run the tests against.
    #[arg(long, value_enum, default_value_t = BrokerChoice::Gregor)]
    pub broker: BrokerChoice,
    /// Same as `--broker both`.
    #[arg(long)]
    pub against_kafka: bool,
    /// Tests to run, by number (`0045`: every broker test of that number) or name
    /// (comma-separated or repeated); default: all the suite's broker tests.
    #[arg(long, value_delimiter = ',')]
    pub tests: Vec<String>,
    /// Only the bounded subset the expectations file lists for CI (`cargo xtask test`).
    #[arg(long)]
    pub ci: bool,
    /// Also run on gregor the tests the expectations file defers (`skip`), to see whether
    /// they pass now (their results are shown, not held against the expectations).
    #[arg(long)]
    pub include_skipped: bool,
    /// The runner's quick mode (`-Q`): quick sub-tests only, fewer messages.
    #[arg(long)]
    pub quick: bool,
    /// Time-out of one runner process in seconds (an expectations entry's `timeout` wins).
    #[arg(long, default_value_t = DEFAULT_TIMEOUT_SECS)]
    pub timeout: u64,
    /// The gregor binary; default `target/release/gregor` (built when missing).
    #[arg(long)]
    pub binary: Option<PathBuf>,
    /// Build the test-runner (and check the expectations file), run nothing.
    #[arg(long)]
    pub build_only: bool,
    /// Build librdkafka itself from the crate's source (`./configure`, `make libs`) rather
    /// than reuse the library an rdkafka-sys build left in target/.
    #[arg(long)]
    pub from_source: bool,
}

impl Default for RdkafkaSuiteArgs {
    fn default() -> Self {
        Self {
            broker: BrokerChoice::Gregor,
            against_kafka: false,
            tests: Vec::new(),
            ci: false,
            include_skipped: false,
            quick: false,
            timeout: DEFAULT_TIMEOUT_SECS,
            binary: None,
            build_only: false,
            from_source: false,
        }
    }
}

/// A broker the suite runs against.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Broker {
    Gregor,
    Kafka,
}

impl Broker {
    pub fn name(self) -> &'static str {
        match self {
            Broker::Gregor => "gregor",
            Broker::Kafka => "kafka",
        }
    }
}

/// One test's result on one broker.
#[derive(Debug, Clone)]
pub struct TestResult {
    pub name: String,
    pub outcome: Outcome,
    pub seconds: f64,
}

/// Everything one invocation learned.
pub struct Report {
    pub librdkafka: String,
    pub results: Vec<(Broker, Vec<TestResult>)>,
}

pub fn run(args: &RdkafkaSuiteArgs) -> Result<i32> {
    let root = repo_root();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let suite = build::ensure(&root, &cargo, args.from_source)?;
    let test_c = std::fs::read_to_string(suite.tests_dir.join("test.c"))
        .context("reading the suite's test.c")?;
    let table = table::parse(&test_c)?;
    let expectations = Expectations::load(&root.join(EXPECTATIONS), &table, &suite.version)?;
    if args.build_only {
        println!("{}", suite.runner().display());
        return Ok(0);
    }
    let selected = select(&table, &expectations, args)?;
    let brokers: Vec<Broker> = match (args.broker, args.against_kafka) {
        (BrokerChoice::Both, _) | (BrokerChoice::Gregor, true) => {
            vec![Broker::Gregor, Broker::Kafka]
        }
        (BrokerChoice::Gregor, false) => vec![Broker::Gregor],
        (BrokerChoice::Kafka, _) => vec![Broker::Kafka],
    };
    eprintln!(
        "librdkafka {} suite: {} test(s) on {}",
        suite.version,
        selected.len(),
        brokers
            .iter()
            .map(|b| b.name())
            .collect::<Vec<_>>()
            .join(" and ")
    );
    let work = root.join("target").join("librdkafka-suite");
    let kafka_path = kafka_path_wrapper(&work)?;
    let gregor_binary = if brokers.contains(&Broker::Gregor) {
        Some(gregor_binary(&root, &cargo, args.binary.as_deref())?)
    } else {
        None
    };
    let mut report = Report {
        librdkafka: suite.version.clone(),
        results: Vec::new(),
    };
    for broker in brokers {
        let ctx = RunContext {
            broker,
            suite: &suite,
            expectations: &expectations,
            args,
            kafka_path: &kafka_path,
            gregor_binary: gregor_binary.as_deref(),
            dir: work.join("runs").join(broker.name()),
        };
        let results = ctx.run_all(&selected)?;
        report.results.push((broker, results));
    }
    let text = render(&report, &expectations, args.include_skipped);
    print!("{text}");
    let json = report_json(&report, &expectations);
    let path = work.join("report.json");
    std::fs::write(&path, serde_json::to_string_pretty(&json)? + "\n")
        .with_context(|| format!("writing {}", path.display()))?;
    println!("JSON report: {}", path.display());
    let mismatches = mismatches(&report, &expectations, args.include_skipped);
    Ok(i32::from(!mismatches.is_empty()))
}

/// The broker tests to run, in table order.
fn select<'a>(
    table: &'a [SuiteTest],
    expectations: &Expectations,
    args: &RdkafkaSuiteArgs,
) -> Result<Vec<&'a SuiteTest>> {
    let broker_tests: Vec<&SuiteTest> = table
        .iter()
        .filter(|t| expectations::is_broker_test(t))
        .collect();
    if args.tests.is_empty() && !args.ci {
        return Ok(broker_tests);
    }
    let mut wanted: Vec<String> = args.tests.clone();
    if args.ci {
        if expectations.ci.is_empty() {
            bail!("--ci: the expectations file lists no CI tests");
        }
        wanted.extend(expectations.ci.iter().cloned());
    }
    for w in &wanted {
        if !broker_tests.iter().any(|t| t.name == *w || t.number() == w) {
            bail!("--tests {w}: no broker test of the suite has that name or number");
        }
    }
    Ok(broker_tests
        .into_iter()
        .filter(|t| wanted.iter().any(|w| t.name == *w || t.number() == w))
        .collect())
}

/// `target/release/gregor` (or `binary`), built when missing.
fn gregor_binary(root: &Path, cargo: &str, binary: Option<&Path>) -> Result<PathBuf> {
    if let Some(b) = binary {
        if !b.exists() {
            bail!("--binary {} does not exist", b.display());
        }
        return Ok(b.to_path_buf());
    }
    let b = root.join("target").join("release").join("gregor");
    if !b.exists() {
        eprintln!("{} is missing: building it", b.display());
        proc::run_checked(
            Command::new(cargo)
                .args(["build", "--release", "-p", "gregor"])
                .current_dir(root),
        )?;
    }
    Ok(b)
}

/// Single-quotes `s` for sh.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// `<work>/kafka-path`: what the suite expects under `KAFKA_PATH` (a Kafka distribution):
/// `libs/` (the jars, for the Java helper programs its Makefile compiles) and `bin/` with
/// `kafka-run-class.sh` and a `kafka-<tool>.sh` for each of Kafka's tools, running the main
/// class from the jars of `cargo xtask kafka`.
fn kafka_path_wrapper(work: &Path) -> Result<PathBuf> {
    let jars = kafka::fetch()?.join("libs");
    let dir = work.join("kafka-path");
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).with_context(|| format!("creating {}", bin.display()))?;
    let libs = dir.join("libs");
    let _ = std::fs::remove_file(&libs);
    std::os::unix::fs::symlink(&jars, &libs)
        .with_context(|| format!("linking {} to {}", libs.display(), jars.display()))?;
    let opts: Vec<String> = gregor_tests::reference::tool_jvm_options()?
        .iter()
        .map(|o| sh_quote(o))
        .collect();
    let mut scripts: Vec<(String, String)> = vec![(
        "kafka-run-class.sh".into(),
        format!(
            "#!/bin/sh\n# Generated by `cargo xtask rdkafka-suite`: Kafka's kafka-run-class.sh over the\n\
             # jars of `cargo xtask kafka` ($CLASSPATH first, as Kafka's script does).\n\
             exec java {} -cp \"${{CLASSPATH:+$CLASSPATH:}}{}/*\" \"$@\"\n",
            opts.join(" "),
            jars.display()
        ),
    )];
    for (alias, class) in gregor_tests::reference::TOOL_ALIASES {
        scripts.push((
            format!("{alias}.sh"),
            format!(
                "#!/bin/sh\n# Generated by `cargo xtask rdkafka-suite`.\n\
                 exec \"$(dirname \"$0\")/kafka-run-class.sh\" {class} \"$@\"\n"
            ),
        ));
    }
    for (name, text) in scripts {
        let path = bin.join(name);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        let mut perms = std::fs::metadata(&path)?.permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
        std::fs::set_permissions(&path, perms)?;
    }
    Ok(dir)
}

/// A running broker for one scenario.
enum Server {
    Gregor(GregorServer),
    Kafka {
        instance: kafka::Instance,
        guard: ChildGuard,
    },
}

impl Server {
    fn bootstrap(&self) -> String {
        match self {
            Server::Gregor(s) => s.bootstrap.clone(),
            Server::Kafka { instance, .. } => instance.bootstrap(),
        }
    }

    fn log_file(&self) -> PathBuf {
        match self {
            Server::Gregor(s) => s.log_file.clone(),
            Server::Kafka { instance, .. } => instance.server_log(),
        }
    }

    fn check_alive(&mut self) -> Result<()> {
        match self {
            Server::Gregor(s) => s.guard.check_alive(),
            Server::Kafka { guard, .. } => guard.check_alive(),
        }
    }

    fn stop(self) {
        let (name, mut guard) = match self {
            Server::Gregor(s) => ("gregor", s.guard),
            Server::Kafka { guard, .. } => ("kafka", guard),
        };
        if let Err(e) = guard.stop() {
            eprintln!("warning: stopping {name}: {e:#}");
        }
    }
}

/// Broker properties of the suite's scenarios that both brokers take.
fn scenario_properties(scenario: &str) -> Vec<String> {
    vec![
        // scenarios/default.json and noautocreate.json: num_partitions 4.
        "num.partitions=4".into(),
        format!("auto.create.topics.enable={}", scenario != "noautocreate"),
        // trivup leaves it at Kafka's default (`cargo xtask kafka` sets 0 for its own use).
        "group.initial.rebalance.delay.ms=3000".into(),
        // trivup gives each broker a rack and the rack-aware selector (Kafka >= 2.4).
        "broker.rack=RACK1".into(),
        "replica.selector.class=org.apache.kafka.common.replica.RackAwareReplicaSelector".into(),
    ]
}

struct RunContext<'a> {
    broker: Broker,
    suite: &'a build::Suite,
    expectations: &'a Expectations,
    args: &'a RdkafkaSuiteArgs,
    kafka_path: &'a Path,
    gregor_binary: Option<&'a Path>,
    dir: PathBuf,
}

impl RunContext<'_> {
    fn start(&self, scenario: &str) -> Result<Server> {
        let ports = proc::free_ports(2)?;
        let data = self.dir.join("data");
        std::fs::create_dir_all(&data).with_context(|| format!("creating {}", data.display()))?;
        match self.broker {
            Broker::Gregor => {
                let binary = self
                    .gregor_binary
                    .context("no gregor binary (internal error)")?;
                let server = GregorServer::start(
                    binary,
                    &data,
                    ports[0],
                    ports[1],
                    &scenario_properties(scenario),
                )?;
                Ok(Server::Gregor(server))
            }
            Broker::Kafka => {
                let mut instance = kafka::Instance::new(
                    ports[0],
                    Some(ports[1]),
                    Some(data.join(format!("kafka-{}", ports[0]))),
                )?;
                instance.extra_properties = scenario_properties(scenario);
                instance.extra_properties.extend([
                    // trivup's KafkaBrokerApp: an ACL authorizer that allows what no ACL
                    // denies (0109, 0115, 0119 add deny ACLs with kafka-acls.sh).
                    "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer"
                        .into(),
                    "allow.everyone.if.no.acl.found=true".into(),
                ]);
                let mut guard = ChildGuard::new("kafka", instance.spawn()?);
                instance.wait_ready(|| guard.check_alive())?;
                Ok(Server::Kafka { instance, guard })
            }
        }
    }

    /// Runs `tests` scenario by scenario, one runner per test number.
    fn run_all(&self, tests: &[&SuiteTest]) -> Result<Vec<TestResult>> {
        if self.dir.exists() {
            std::fs::remove_dir_all(&self.dir)
                .with_context(|| format!("removing {}", self.dir.display()))?;
        }
        std::fs::create_dir_all(&self.dir)
            .with_context(|| format!("creating {}", self.dir.display()))?;
        let mut results: BTreeMap<String, TestResult> = BTreeMap::new();
        for t in tests {
            if !SCENARIOS.iter().any(|s| t.in_scenario(s)) {
                results.insert(
                    t.name.clone(),
                    TestResult {
                        name: t.name.clone(),
                        outcome: Outcome::NotRun(format!(
                            "needs test scenario {} (this command sets up {})",
                            t.scenario,
                            SCENARIOS.join(", ")
                        )),
                        seconds: 0.0,
                    },
                );
            }
        }
        for scenario in SCENARIOS {
            let in_scenario: Vec<&SuiteTest> = tests
                .iter()
                .copied()
                .filter(|t| t.in_scenario(scenario) && !results.contains_key(&t.name))
                .collect();
            if in_scenario.is_empty() {
                continue;
            }
            // Groups of one test number, in table order.
            let mut groups: Vec<Vec<&SuiteTest>> = Vec::new();
            for t in in_scenario {
                match groups.last_mut() {
                    Some(g) if g[0].number() == t.number() => g.push(t),
                    _ => groups.push(vec![t]),
                }
            }
            let mut server: Option<Server> = None;
            for group in groups {
                let (to_run, deferred): (Vec<&SuiteTest>, Vec<&SuiteTest>) =
                    group.iter().partition(|t| self.runs(t));
                for t in &deferred {
                    let reason = self
                        .expectations
                        .get(&t.name)
                        .and_then(|e| e.reason.clone())
                        .unwrap_or_default();
                    results.insert(
                        t.name.clone(),
                        TestResult {
                            name: t.name.clone(),
                            outcome: Outcome::NotRun(format!("deferred: {reason}")),
                            seconds: 0.0,
                        },
                    );
                }
                if to_run.is_empty() {
                    continue;
                }
                if server.is_none() {
                    eprintln!("[{}] starting for scenario {scenario}", self.broker.name());
                    server = Some(self.start(scenario)?);
                }
                let Some(srv) = server.as_mut() else {
                    continue;
                };
                let group_results = self.run_group(srv, scenario, &group, &to_run)?;
                let died = srv.check_alive().err();
                for mut r in group_results {
                    if let Some(e) = &died {
                        if matches!(r.outcome, Outcome::Failed(_) | Outcome::TimedOut) {
                            r.outcome = Outcome::Failed(format!(
                                "{} died during the test ({e:#}); see {}",
                                self.broker.name(),
                                srv.log_file().display()
                            ));
                        }
                    }
                    if !deferred.iter().any(|d| d.name == r.name) {
                        results.insert(r.name.clone(), r);
                    }
                }
                if died.is_some() {
                    let log = srv.log_file();
                    let kept = self.dir.join(format!(
                        "{}-died-during-{}.log",
                        self.broker.name(),
                        group[0].number()
                    ));
                    let _ = std::fs::copy(&log, &kept);
                    eprintln!(
                        "[{}] died during {}; its log is kept in {}; starting a fresh one",
                        self.broker.name(),
                        group[0].number(),
                        kept.display()
                    );
                    if let Some(s) = server.take() {
                        s.stop();
                    }
                }
            }
            if let Some(s) = server.take() {
                let log = s.log_file();
                let kept = self
                    .dir
                    .join(format!("{}-{scenario}.log", self.broker.name()));
                s.stop();
                let _ = std::fs::copy(&log, &kept);
            }
        }
        Ok(tests
            .iter()
            .filter_map(|t| results.remove(&t.name))
            .collect())
    }

    /// Whether `t` runs on this broker (gregor skips the deferred tests unless asked).
    fn runs(&self, t: &SuiteTest) -> bool {
        self.broker == Broker::Kafka
            || self.args.include_skipped
            || self
                .expectations
                .get(&t.name)
                .is_none_or(|e| e.expect != Expect::Skip)
    }

    /// One runner process for the tests of one number (`group`) in `scenario`; results for
    /// `to_run` (the group's other tests run too, their results are not kept).
    fn run_group(
        &self,
        server: &Server,
        scenario: &str,
        group: &[&SuiteTest],
        to_run: &[&SuiteTest],
    ) -> Result<Vec<TestResult>> {
        let number = group[0].number();
        let entries: Vec<_> = to_run
            .iter()
            .filter_map(|t| self.expectations.get(&t.name))
            .collect();
        let timeout_secs: u64 = to_run
            .iter()
            .map(|t| {
                self.expectations
                    .get(&t.name)
                    .and_then(|e| e.timeout)
                    .unwrap_or(self.args.timeout)
            })
            .sum();
        let subtests = entries.iter().find_map(|e| e.subtests.clone());
        let conf = self.dir.join(format!("test-{scenario}.conf"));
        std::fs::write(
            &conf,
            format!(
                "# Generated by `cargo xtask rdkafka-suite`.\nbootstrap.servers={}\nsecurity.protocol=PLAINTEXT\n",
                server.bootstrap()
            ),
        )
        .with_context(|| format!("writing {}", conf.display()))?;
        let log_path = self.dir.join(format!("{number}-{scenario}.log"));
        let log = std::fs::File::create(&log_path)
            .with_context(|| format!("creating {}", log_path.display()))?;
        let mut cmd = Command::new(self.suite.runner());
        cmd.arg("-p1").arg("-L").arg("-s").arg(scenario);
        if self.args.quick {
            cmd.arg("-Q");
        }
        // It links librdkafka and librdkafka++ dynamically, from the build tree (as the
        // suite's run-test.sh sets it).
        let lib_path = [
            self.suite.tests_dir.join("../src"),
            self.suite.tests_dir.join("../src-cpp"),
        ]
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(":");
        cmd.current_dir(&self.suite.tests_dir)
            .env("LD_LIBRARY_PATH", lib_path)
            .env("TESTS", number)
            .env("TEST_KAFKA_VERSION", kafka::KAFKA_VERSION)
            .env("TEST_SCENARIO", scenario)
            .env("RDKAFKA_TEST_CONF", &conf)
            .env("BROKERS", server.bootstrap())
            .env("KAFKA_PATH", self.kafka_path)
            .env_remove("CI")
            .env_remove("TESTS_SKIP")
            .env_remove("TESTS_SKIP_BEFORE")
            .env_remove("TEST_REPORT")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        match &subtests {
            Some(s) => cmd.env("SUBTESTS", s),
            None => cmd.env_remove("SUBTESTS"),
        };
        // Its own process group: on time-out the runner goes with what it started (Kafka's
        // tools, the Java helper programs).
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let started = Instant::now();
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", self.suite.runner().display()))?;
        let deadline = started + Duration::from_secs(timeout_secs);
        let exit = loop {
            if let Some(status) = child.try_wait()? {
                break if status.success() {
                    Exit::Exited
                } else {
                    Exit::Failed
                };
            }
            if Instant::now() > deadline {
                let group_id = format!("-{}", child.id());
                let _ = Command::new("kill")
                    .args(["-KILL", "--", &group_id])
                    .status();
                let _ = child.wait();
                break Exit::Killed;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let wall = started.elapsed().as_secs_f64();
        self.remove_stats_files();
        let output = outcome::strip_ansi(&String::from_utf8_lossy(
            &std::fs::read(&log_path).unwrap_or_default(),
        ));
        let mut results = Vec::new();
        for t in to_run {
            let (mut outcome, secs) = outcome::outcome_of(&output, &t.name, exit);
            if outcome == Outcome::TimedOut {
                outcome = Outcome::Failed(format!(
                    "timed out: the runner was killed after {timeout_secs} s"
                ));
            }
            let seconds = secs.unwrap_or(wall / to_run.len() as f64);
            eprintln!(
                "[{}] {:<50} {:<8} {:>7.1}s {}",
                self.broker.name(),
                t.name,
                outcome.label(),
                seconds,
                one_line(outcome.detail(), 100)
            );
            results.push(TestResult {
                name: t.name.clone(),
                outcome,
                seconds,
            });
        }
        Ok(results)
    }

    /// The runner writes `stats_<test>_<id>.json` into its directory for each test.
    fn remove_stats_files(&self) {
        if let Ok(entries) = std::fs::read_dir(&self.suite.tests_dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with("stats_") && name.ends_with(".json") {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
    }
}

/// `s` on one line, cut to `max` characters.
fn one_line(s: &str, max: usize) -> String {
    let flat = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() > max {
        let cut: String = flat.chars().take(max.saturating_sub(1)).collect();
        format!("{cut}…")
    } else {
        flat
    }
}

/// A difference between a result and the expectations file.
#[derive(Debug, Clone, PartialEq)]
pub struct Mismatch {
    pub broker: Broker,
    pub test: String,
    pub expected: String,
    pub got: String,
}

/// gregor's results against each test's `expect`; Kafka's against the reasons that say Kafka
/// fails a test too. With `include_skipped`, deferred tests that ran are not held against
/// their `skip`.
pub fn mismatches(
    report: &Report,
    expectations: &Expectations,
    include_skipped: bool,
) -> Vec<Mismatch> {
    let mut out = Vec::new();
    let kafka_too = expectations::kafka_fails_too_prefix();
    for (broker, results) in &report.results {
        for r in results {
            let Some(entry) = expectations.get(&r.name) else {
                continue;
            };
            let reason = entry.reason.as_deref().unwrap_or("");
            match broker {
                Broker::Gregor => {
                    if include_skipped && entry.expect == Expect::Skip {
                        continue;
                    }
                    if !r.outcome.matches(entry.expect) {
                        out.push(Mismatch {
                            broker: *broker,
                            test: r.name.clone(),
                            expected: entry.expect.as_str().to_string(),
                            got: format!("{} {}", r.outcome.label(), r.outcome.detail())
                                .trim()
                                .to_string(),
                        });
                    }
                }
                Broker::Kafka => {
                    if reason.starts_with(kafka_too.as_str()) && r.outcome == Outcome::Passed {
                        out.push(Mismatch {
                            broker: *broker,
                            test: r.name.clone(),
                            expected: format!("not a pass (the reason says: {reason})"),
                            got: "PASS".into(),
                        });
                    }
                }
            }
        }
    }
    out
}

/// Tests that pass on Kafka and do not pass on gregor (run or deferred).
pub fn kafka_only_passes(report: &Report) -> Vec<(String, Outcome)> {
    let get = |b: Broker| {
        report
            .results
            .iter()
            .find(|(broker, _)| *broker == b)
            .map(|(_, r)| r)
    };
    let (Some(gregor), Some(kafka)) = (get(Broker::Gregor), get(Broker::Kafka)) else {
        return Vec::new();
    };
    kafka
        .iter()
        .filter(|k| k.outcome == Outcome::Passed)
        .filter_map(|k| {
            gregor
                .iter()
                .find(|g| g.name == k.name && g.outcome != Outcome::Passed)
                .map(|g| (g.name.clone(), g.outcome.clone()))
        })
        .collect()
}

/// Counts of each outcome label.
fn counts(results: &[TestResult]) -> BTreeMap<&'static str, usize> {
    let mut c = BTreeMap::new();
    for r in results {
        *c.entry(r.outcome.label()).or_insert(0) += 1;
    }
    c
}

fn counts_line(results: &[TestResult]) -> String {
    let c = counts(results);
    let mut parts = vec![format!("{} tests", results.len())];
    for label in ["PASS", "FAIL", "SKIP", "NOT RUN"] {
        let n = c.get(label).copied().unwrap_or(0);
        parts.push(format!(
            "{n} {}",
            match label {
                "PASS" => "passed",
                "FAIL" => "failed",
                "SKIP" => "skipped by the suite",
                _ => "not run",
            }
        ));
    }
    parts.join(", ")
}

/// The tables, counts, Kafka-only passes and differences from the expectations.
pub fn render(report: &Report, expectations: &Expectations, include_skipped: bool) -> String {
    let mut s = String::new();
    for (broker, results) in &report.results {
        let _ = writeln!(
            s,
            "\n==== librdkafka {} suite on {} ====",
            report.librdkafka,
            broker.name()
        );
        let _ = writeln!(s, "{:<50} {:<8} {:>8}  detail", "test", "result", "seconds");
        for r in results {
            let _ = writeln!(
                s,
                "{:<50} {:<8} {:>8.1}  {}",
                r.name,
                r.outcome.label(),
                r.seconds,
                one_line(r.outcome.detail(), 110)
            );
        }
        let _ = writeln!(s, "{}: {}", broker.name(), counts_line(results));
    }
    let kafka_only = kafka_only_passes(report);
    if report.results.len() > 1 {
        let _ = writeln!(
            s,
            "\n==== pass on Kafka {}, not on gregor: {} ====",
            kafka::KAFKA_VERSION,
            kafka_only.len()
        );
        for (name, outcome) in &kafka_only {
            let why = expectations
                .get(name)
                .and_then(|e| e.reason.as_deref())
                .unwrap_or("");
            let _ = writeln!(
                s,
                "{name:<50} gregor: {:<8} {}",
                outcome.label(),
                one_line(
                    if why.is_empty() {
                        outcome.detail()
                    } else {
                        why
                    },
                    100
                )
            );
        }
    }
    let mismatches = mismatches(report, expectations, include_skipped);
    let _ = writeln!(
        s,
        "\n==== differences from {EXPECTATIONS}: {} ====",
        mismatches.len()
    );
    for m in &mismatches {
        let _ = writeln!(
            s,
            "{:<6} {:<50} expected {}, got {}",
            m.broker.name(),
            m.test,
            m.expected,
            one_line(&m.got, 120)
        );
    }
    s
}

/// The JSON report: per broker, each test's result, seconds and detail, the counts; the
/// Kafka-only passes and the differences from the expectations.
pub fn report_json(report: &Report, expectations: &Expectations) -> serde_json::Value {
    let brokers: serde_json::Map<String, serde_json::Value> = report
        .results
        .iter()
        .map(|(broker, results)| {
            let tests: Vec<serde_json::Value> = results
                .iter()
                .map(|r| {
                    serde_json::json!({
                        "test": r.name,
                        "result": r.outcome.label(),
                        "seconds": (r.seconds * 10.0).round() / 10.0,
                        "detail": r.outcome.detail(),
                        "expect": expectations.get(&r.name).map(|e| e.expect.as_str()),
                    })
                })
                .collect();
            let counts: serde_json::Map<String, serde_json::Value> = counts(results)
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.into()))
                .collect();
            (
                broker.name().to_string(),
                serde_json::json!({ "tests": tests, "counts": counts }),
            )
        })
        .collect();
    let kafka_only: Vec<serde_json::Value> = kafka_only_passes(report)
        .into_iter()
        .map(|(name, o)| {
            serde_json::json!({"test": name, "gregor": o.label(), "detail": o.detail()})
        })
        .collect();
    let mismatches: Vec<serde_json::Value> = mismatches(report, expectations, false)
        .into_iter()
        .map(|m| {
            serde_json::json!({
                "broker": m.broker.name(), "test": m.test, "expected": m.expected, "got": m.got
            })
        })
        .collect();
    serde_json::json!({
        "librdkafka": report.librdkafka,
        "kafka_version": kafka::KAFKA_VERSION,
        "brokers": brokers,
        "pass_on_kafka_not_on_gregor": kafka_only,
        "differences_from_expectations": mismatches,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expectations() -> Expectations {
        serde_json::from_str(
            r#"{
            "librdkafka": "2.12.1",
            "ci": ["0001_multiobj"],
            "tests": {
                "0001_multiobj": {"expect": "pass"},
                "0011_produce_batch": {"expect": "fail", "reason": "gregor bug: x"},
                "0016_client_swname": {"expect": "suite-skips", "reason": "skipped on Kafka 4.4.0 too: 3 brokers"},
                "0028_long_topicnames": {"expect": "skip", "reason": "fails on Kafka 4.4.0 too: y"},
                "0103_transactions": {"expect": "skip", "reason": "issue 12 transactions"}
            }
        }"#,
        )
        .unwrap()
    }

    fn r(name: &str, outcome: Outcome) -> TestResult {
        TestResult {
            name: name.into(),
            outcome,
            seconds: 1.0,
        }
    }

    #[test]
    fn differences_and_kafka_only_passes() {
        let e = expectations();
        let report = Report {
            librdkafka: "2.12.1".into(),
            results: vec![
                (
                    Broker::Gregor,
                    vec![
                        r("0001_multiobj", Outcome::Failed("boom".into())),
                        r("0011_produce_batch", Outcome::Failed("known".into())),
                        r("0016_client_swname", Outcome::Skipped("no".into())),
                        r("0028_long_topicnames", Outcome::NotRun("deferred".into())),
                        r("0103_transactions", Outcome::NotRun("deferred".into())),
                    ],
                ),
                (
                    Broker::Kafka,
                    vec![
                        r("0001_multiobj", Outcome::Passed),
                        r("0011_produce_batch", Outcome::Passed),
                        r("0016_client_swname", Outcome::Skipped("no".into())),
                        r("0028_long_topicnames", Outcome::Passed),
                        r("0103_transactions", Outcome::Passed),
                    ],
                ),
            ],
        };
        let m = mismatches(&report, &e, false);
        let got: Vec<(&str, &str)> = m
            .iter()
            .map(|m| (m.broker.name(), m.test.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("gregor", "0001_multiobj"),
                ("kafka", "0028_long_topicnames")
            ]
        );
        assert_eq!(m[0].got, "FAIL boom");
        let only: Vec<String> = kafka_only_passes(&report)
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(
            only,
            [
                "0001_multiobj",
                "0011_produce_batch",
                "0028_long_topicnames",
                "0103_transactions"
            ]
        );
        let text = render(&report, &e, false);
        assert!(
            text.contains("==== pass on Kafka 4.4.0, not on gregor: 4 ===="),
            "{text}"
        );
        assert!(
            text.contains("==== differences from xtask/rdkafka-suite/expectations.json: 2 ====")
        );
        assert!(
            text.contains("gregor: 5 tests, 0 passed, 2 failed, 1 skipped by the suite, 2 not run")
        );
        let json = report_json(&report, &e);
        assert_eq!(json["brokers"]["kafka"]["counts"]["PASS"], 4);
        assert_eq!(
            json["differences_from_expectations"]
                .as_array()
                .unwrap()
                .len(),
            2
        );
    }

    #[test]
    fn a_deferred_test_that_ran_is_not_held_against_skip_when_asked() {
        let e = expectations();
        let report = Report {
            librdkafka: "2.12.1".into(),
            results: vec![(
                Broker::Gregor,
                vec![r("0103_transactions", Outcome::Failed("no txn".into()))],
            )],
        };
        assert_eq!(mismatches(&report, &e, false).len(), 1);
        assert!(mismatches(&report, &e, true).is_empty());
    }

    #[test]
    fn selection_by_number_name_and_ci() {
        let table = vec![
            SuiteTest {
                name: "0001_multiobj".into(),
                local: false,
                manual: false,
                known_issue: false,
                sockem: false,
                scenario: "default".into(),
            },
            SuiteTest {
                name: "0004_conf".into(),
                local: true,
                manual: false,
                known_issue: false,
                sockem: false,
                scenario: "default".into(),
            },
            SuiteTest {
                name: "0011_produce_batch".into(),
                local: false,
                manual: false,
                known_issue: false,
                sockem: false,
                scenario: "default".into(),
            },
        ];
        let e = expectations();
        let names = |args: &RdkafkaSuiteArgs| -> Vec<String> {
            select(&table, &e, args)
                .unwrap()
                .iter()
                .map(|t| t.name.clone())
                .collect()
        };
        let mut args = RdkafkaSuiteArgs::default();
        assert_eq!(names(&args), ["0001_multiobj", "0011_produce_batch"]);
        args.tests = vec!["0011".into()];
        assert_eq!(names(&args), ["0011_produce_batch"]);
        args.tests = vec![];
        args.ci = true;
        assert_eq!(names(&args), ["0001_multiobj"]);
        args.tests = vec!["0004_conf".into()];
        assert!(select(&table, &e, &args).is_err());
    }

    #[test]
    fn quoting_for_sh() {
        assert_eq!(sh_quote("a b"), "'a b'");
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
    }
}
