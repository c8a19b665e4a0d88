//! Kafka Streams with `processing.guarantee=exactly_once_v2` on a three-node gregor cluster
//! (issue 12): the word count of `interop/java/streams/WordCountEos.java` (kafka-streams 4.4
//! from Maven Central) over a known input in a topic of 3 partitions with replication factor 3;
//! the Streams process is killed with SIGKILL in the middle of its processing three times and
//! restarted on the same state directory (so with the same transactional id, whose open
//! transaction the restart fences and aborts). The output topic read with read_committed must
//! hold, for every word, exactly the counts 1, 2, ..., N (N its count in the input): a count
//! from an aborted transaction, or one lost, shows as a repeated or skipped number. The
//! read_uncommitted view must hold records of aborted transactions, which shows that the kills
//! did cut transactions short.
//!
//! A second application's transactions commit no records (Streams does this whenever a commit
//! interval passes with consumer offsets to commit and nothing produced): its topology drops
//! every input line, so each transaction holds only the group's offsets. Killed with SIGKILL
//! once mid-run and restarted, it must end with the group's stable committed offsets at the
//! input's end, its transactional id's last transaction committed, and an output log that is
//! empty (no records and no transaction markers).
//!
//! The same runs on three Apache Kafka JVMs: `cargo test -p gregor --test streams_eos --
//! --ignored`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use gregor_tests::cluster::{Cluster, ClusterConfig, Implementation};
use gregor_tests::wire::{sb, KafkaConn};
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    ApiKey, CreateTopicsRequest, MetadataRequest, MetadataResponse, RequestKind, ResponseKind,
    TopicName,
};

const INPUT: &str = "wc-input";
const OUTPUT: &str = "wc-output";
const APP_ID: &str = "wc-eos";
/// Input lines (two to four words each).
const LINES: u32 = 3000;
/// Milliseconds the topology spends per input line, so that a run is still processing (with a
/// transaction open) when it is killed: about 15 s for the whole input.
const DELAY_MS_PER_LINE: u32 = 5;
/// Kills of the Streams process before the run that is let finish.
const KILLS: usize = 3;
const EMPTY_INPUT: &str = "empty-input";
const EMPTY_OUTPUT: &str = "empty-output";
const EMPTY_APP_ID: &str = "offsets-only-eos";
/// Input lines of the offsets-only application: about 6 s of processing at
/// [`DELAY_MS_PER_LINE`].
const EMPTY_LINES: u32 = 1200;
/// JVM options of the Java programs: small heap, quick start (behaviour, not speed).
const JVM_OPTS: &[&str] = &["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"];

fn gregor() -> Implementation {
    Implementation::Gregor(env!("CARGO_BIN_EXE_gregor").into())
}

/// Creates `topics` with 3 partitions and replication factor 3 and waits until every broker
/// has a leader for each partition in its Metadata (a broker learns of a new topic from the
/// metadata log a moment after the controller acknowledges it).
fn create_topics(bootstrap: &str, topics: &[&str]) -> Result<()> {
    let first = bootstrap.split(',').next().context("a broker")?;
    let mut c = KafkaConn::connect(first, "streams-eos")?;
    let req = CreateTopicsRequest::default()
        .with_timeout_ms(30_000)
        .with_topics(
            topics
                .iter()
                .map(|t| {
                    CreatableTopic::default()
                        .with_name(TopicName(sb(t)))
                        .with_num_partitions(3)
                        .with_replication_factor(3)
                })
                .collect(),
        );
    let ResponseKind::CreateTopics(r) =
        c.call_kind(ApiKey::CreateTopics, 7, &RequestKind::from(req))?
    else {
        bail!("not a CreateTopics response")
    };
    ensure!(r.topics.iter().all(|t| t.error_code == 0), "{r:?}");
    let deadline = Instant::now() + Duration::from_secs(60);
    for broker in bootstrap.split(',') {
        loop {
            let req = MetadataRequest::default().with_topics(Some(
                topics
                    .iter()
                    .map(|t| MetadataRequestTopic::default().with_name(Some(TopicName(sb(t)))))
                    .collect(),
            ));
            let ready = KafkaConn::connect(broker, "streams-eos")
                .and_then(|mut c| c.call::<_, MetadataResponse>(ApiKey::Metadata, 12, &req))
                .is_ok_and(|m| {
                    m.topics.len() == topics.len()
                        && m.topics.iter().all(|t| {
                            t.error_code == 0
                                && t.partitions.len() == 3
                                && t.partitions.iter().all(|p| p.leader_id.0 >= 0)
                        })
                });
            if ready {
                break;
            }
            ensure!(
                Instant::now() < deadline,
                "{topics:?} without leaders at {broker} after 60 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    Ok(())
}

/// The Java program compiled against the cached Kafka jars (kafka-clients, kafka-streams).
struct Program {
    classes: tempfile::TempDir,
    classpath: String,
}

impl Program {
    fn compile() -> Result<Self> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let classes = tempfile::tempdir()?;
        let classpath = gregor_tests::reference::classpath()?;
        let javac = Command::new("javac")
            .arg("-d")
            .arg(classes.path())
            .arg("-cp")
            .arg(&classpath)
            .arg(root.join("interop/java/streams/WordCountEos.java"))
            .stdin(Stdio::null())
            .output()
            .context("running javac")?;
        ensure!(
            javac.status.success(),
            "javac: {}",
            String::from_utf8_lossy(&javac.stderr)
        );
        Ok(Self { classes, classpath })
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new("java");
        c.args(JVM_OPTS)
            .arg("-cp")
            .arg(format!(
                "{}:{}",
                self.classpath,
                self.classes.path().display()
            ))
            .arg("WordCountEos")
            .args(args)
            .stdin(Stdio::null());
        c
    }

    /// Runs a mode that exits (`produce`, `check`) and returns its standard output, which
    /// must end with an "ok" line.
    fn run_to_end(&self, args: &[&str], ok: &str) -> Result<String> {
        let out = self.command(args).output().context("running java")?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        ensure!(
            out.status.success() && stdout.contains(ok),
            "WordCountEos {args:?} failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(stdout)
    }
}

/// A running Streams process: its standard output line by line through a channel, its
/// standard error in a file (shown when something fails).
struct StreamsRun {
    child: Child,
    lines: Receiver<String>,
    stderr: PathBuf,
}

impl StreamsRun {
    fn start(program: &Program, bootstrap: &str, state_dir: &Path, run: usize) -> Result<Self> {
        let state = state_dir.display().to_string();
        let delay = DELAY_MS_PER_LINE.to_string();
        Self::spawn(
            program,
            &["run", bootstrap, APP_ID, INPUT, OUTPUT, &state, "3", &delay],
            state_dir,
            run,
        )
    }

    /// Starts `WordCountEos` with `args` (a mode that runs until killed).
    fn spawn(program: &Program, args: &[&str], state_dir: &Path, run: usize) -> Result<Self> {
        let stderr = state_dir.with_file_name(format!("streams-run-{run}.err"));
        let mut child = program
            .command(args)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr)?)
            .spawn()
            .context("starting the Streams process")?;
        let stdout = child
            .stdout
            .take()
            .context("the Streams process's stdout")?;
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Self {
            child,
            lines,
            stderr,
        })
    }

    fn stderr_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Waits until the run reports counts sent to the output ("counted <n>", every 20): the
    /// process is then in the middle of a transaction with output records in the log (its
    /// producer sends without delay). Counts come from the repartition topic, which Streams
    /// reads with read_committed, so they follow a commit of this run or of an earlier one.
    /// Fails on a "FAIL" line, on the process's exit, or after `timeout`.
    fn wait_counting(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        self.wait_line(deadline, |line| line.starts_with("counted "))
    }

    /// Waits for a line of standard output that satisfies `want`.
    fn wait_line(&mut self, deadline: Instant, want: impl Fn(&str) -> bool) -> Result<()> {
        let mut last = String::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if line.starts_with("FAIL") {
                        bail!("the Streams process: {line}\n{}", self.stderr_tail());
                    }
                    if want(&line) {
                        return Ok(());
                    }
                    last = line;
                }
                Err(RecvTimeoutError::Timeout) => bail!(
                    "the Streams process did not get this far in time (its last line: {last:?})\n{}",
                    self.stderr_tail()
                ),
                Err(RecvTimeoutError::Disconnected) => bail!(
                    "the Streams process exited ({:?})\n{}",
                    self.child.try_wait(),
                    self.stderr_tail()
                ),
            }
        }
    }

    /// SIGKILL, and reaps the process.
    fn kill9(mut self) -> Result<()> {
        self.child
            .kill()
            .context("kill -9 of the Streams process")?;
        self.child.wait()?;
        Ok(())
    }

    /// Fails if the process exited or reported a failure.
    fn check_alive(&mut self) -> Result<()> {
        while let Ok(line) = self.lines.try_recv() {
            ensure!(
                !line.starts_with("FAIL"),
                "the Streams process: {line}\n{}",
                self.stderr_tail()
            );
        }
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "the Streams process exited ({status})\n{}",
                self.stderr_tail()
            );
        }
        Ok(())
    }
}

impl Drop for StreamsRun {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn word_count_survives_kill9(implementation: Implementation) -> Result<()> {
    let program = Program::compile()?;
    let cluster = Cluster::start(
        &ClusterConfig::combined(implementation, 3)
            // Kafka's own default is 3 s; a group of one member need not wait.
            .with("group.initial.rebalance.delay.ms", "0"),
    )?;
    let bootstrap = cluster.bootstrap();
    create_topics(&bootstrap, &[INPUT, OUTPUT])?;
    let lines = LINES.to_string();
    let produced = program.run_to_end(&["produce", &bootstrap, INPUT, &lines], "ok produced")?;
    ensure!(
        produced.contains("partitions [0, 1, 2]"),
        "the input did not reach all three partitions: {produced}"
    );

    let work = tempfile::tempdir()?;
    let state_dir = work.path().join("state");
    for run in 0..KILLS {
        let mut streams = StreamsRun::start(&program, &bootstrap, &state_dir, run)
            .with_context(|| format!("run {run}"))?;
        streams
            .wait_counting(Duration::from_secs(120))
            .with_context(|| format!("run {run}"))?;
        streams.kill9()?;
        eprintln!("run {run}: killed with SIGKILL while it was sending counts");
    }
    let mut last = StreamsRun::start(&program, &bootstrap, &state_dir, KILLS)?;
    let checked = program.run_to_end(&["check", &bootstrap, OUTPUT, &lines], "ok done");
    last.check_alive()
        .context("the Streams process that was let run")?;
    let checked = checked.with_context(|| format!("\n{}", last.stderr_tail()))?;
    eprintln!("{checked}");
    let aborted: u64 = checked
        .lines()
        .find_map(|l| l.strip_prefix("aborted "))
        .and_then(|n| n.trim().parse().ok())
        .context("no 'aborted' line from the check")?;
    ensure!(
        aborted > 0,
        "no record of an aborted transaction in the output: the kills did not cut a \
         transaction short, so the test did not test what it should\n{checked}"
    );
    drop(last);
    Ok(())
}

/// The application of [`EMPTY_APP_ID`], whose transactions hold only consumer offsets.
fn offsets_only_transactions_survive_kill9(implementation: Implementation) -> Result<()> {
    let program = Program::compile()?;
    let cluster = Cluster::start(
        &ClusterConfig::combined(implementation, 3).with("group.initial.rebalance.delay.ms", "0"),
    )?;
    let bootstrap = cluster.bootstrap();
    create_topics(&bootstrap, &[EMPTY_INPUT, EMPTY_OUTPUT])?;
    let lines = EMPTY_LINES.to_string();
    program.run_to_end(&["produce", &bootstrap, EMPTY_INPUT, &lines], "ok produced")?;
    let work = tempfile::tempdir()?;
    let state_dir = work.path().join("state");
    let state = state_dir.display().to_string();
    let delay = DELAY_MS_PER_LINE.to_string();
    let args = [
        "runempty",
        &bootstrap,
        EMPTY_APP_ID,
        EMPTY_INPUT,
        EMPTY_OUTPUT,
        &state,
        "3",
        &delay,
    ];
    let mut first = StreamsRun::spawn(&program, &args, &state_dir, 0)?;
    // Past the first commits (every 300 ms): "processed 400" comes about 2 s in.
    first.wait_line(Instant::now() + Duration::from_secs(120), |l| {
        l == "processed 400"
    })?;
    first.kill9()?;
    eprintln!("offsets-only run 0: killed with SIGKILL mid-run");
    let mut last = StreamsRun::spawn(&program, &args, &state_dir, 1)?;
    let checked = program.run_to_end(
        &[
            "committed",
            &bootstrap,
            EMPTY_APP_ID,
            EMPTY_INPUT,
            EMPTY_OUTPUT,
        ],
        "ok done",
    );
    last.check_alive()
        .context("the Streams process that was let run")?;
    let checked = checked.with_context(|| format!("\n{}", last.stderr_tail()))?;
    eprintln!("{checked}");
    drop(last);
    Ok(())
}

/// The word count on three gregor nodes, replication factor 3 (see the module doc).
#[test]
fn streams_exactly_once_v2_word_count_survives_kill9() -> Result<()> {
    word_count_survives_kill9(gregor())
}

/// Transactions that commit only offsets, on three gregor nodes (see the module doc).
#[test]
fn streams_transactions_without_records_commit_offsets_only() -> Result<()> {
    offsets_only_transactions_survive_kill9(gregor())
}

/// The same on three Apache Kafka 4.4 JVMs.
#[test]
#[ignore = "the reference run on three Kafka JVMs; run by hand"]
fn streams_transactions_without_records_commit_offsets_only_on_kafka() -> Result<()> {
    if !gregor_tests::reference::jars_or_skip() {
        return Ok(());
    }
    offsets_only_transactions_survive_kill9(Implementation::Kafka)
}

/// The same on three Apache Kafka 4.4 JVMs, the reference for the test itself.
#[test]
#[ignore = "the reference run on three Kafka JVMs; run by hand"]
fn streams_exactly_once_v2_word_count_survives_kill9_on_kafka() -> Result<()> {
    if !gregor_tests::reference::jars_or_skip() {
        return Ok(());
    }
    word_count_survives_kill9(Implementation::Kafka)
}
