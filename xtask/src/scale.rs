//! `cargo xtask scale`: many partitions on one broker, gregor (release build) and the reference
//! Apache Kafka broker (a one-node KRaft combined broker and controller, `-Xmx1g -Xms256m`,
//! as `cargo xtask bench` runs it) in turn on the same machine, with the same open-file limit
//! (this process raises its soft `RLIMIT_NOFILE` to the hard limit; both brokers inherit it).
//!
//! For each partition count N of `--partitions` (default 10,000), on a fresh broker:
//! - **create**: topics of [`PARTITIONS_PER_TOPIC`] partitions (replication factor 1), through
//!   CreateTopics requests of [`TOPICS_PER_REQUEST`] topics each, until Metadata shows a leader
//!   for every partition;
//! - **produce**: one record to every partition, acks=all, [`TOPICS_PER_REQUEST`] topics per
//!   Produce request, until every partition acknowledged its record (retriable errors are
//!   retried: Kafka shows leaders before it has made the logs, so its partitions become
//!   writable during this phase, and the sum of the two is what compares);
//! - **idle** RSS (`VmRSS`) and open descriptors (`/proc/<pid>/fd`) after `--settle-secs`, also
//!   per partition above those of the same broker before it had any topic;
//! - **Metadata** for all topics and for one topic: the median latency of
//!   [`METADATA_REPETITIONS`] requests (a client of our own on `kafka-protocol`, one
//!   connection); then the time to create one more topic of one partition (CreateTopics until
//!   its answer): work per request that grows with the partitions already there shows in these;
//! - gregor only: the time to scrape `/metrics`, and how many series it has;
//! - **shutdown**: SIGTERM until the process exited;
//! - **restart** after that clean shutdown, then after `kill -9`: from starting the process
//!   until Metadata shows a leader for every partition.
//!
//! Then, once per broker (fresh again): produce throughput to a topic of 6 partitions and to one
//! of 1,000, the same records (1 KiB, acks=all, `--throughput-records` each) through the same
//! load generator as the bench (`gregor perf produce`, librdkafka), with librdkafka's sticky
//! partitioner off so that records spread over all partitions at once.
//!
//! A broker that fails a phase (it runs out of descriptors, say) is reported with the phase and
//! error, and the run goes on with the next one. Output: `target/scale/report.json` and
//! `report.md`; data directories live under `target/scale/work/` and are removed after each
//! broker, also on error, Ctrl-C or SIGTERM (which stop the broker first). Broker logs stay in `target/scale/work/` (gregor) and
//! `.cache/kafka/instances/<port>/` (Kafka).

use crate::bench::{self, fmt_num, round, Produce};
use crate::difftest::Gregor;
use crate::kafka;
use crate::proc::{self, repo_root, ChildGuard, GregorServer};
use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use clap::{Args, ValueEnum};
use gregor_protocol::batch::BatchBuilder;
use gregor_tests::wire::{sb, KafkaConn};
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, CreateTopicsRequest, CreateTopicsResponse, MetadataRequest, MetadataResponse,
    ProduceRequest, ProduceResponse, TopicName,
};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct ScaleArgs {
    /// Partition counts to measure, each on a fresh broker: `--partitions 1000,10000,100000`.
    #[arg(long, value_delimiter = ',', default_value = "10000", value_parser = parse_count)]
    pub partitions: Vec<u32>,
    /// Which brokers to run.
    #[arg(long = "impl", value_enum, default_value_t = Which::Both)]
    pub which: Which,
    /// Run gregor alone (as `--impl gregor`).
    #[arg(long)]
    pub no_kafka: bool,
    /// The gregor binary (also the load generator of the throughput phase); default
    /// target/release/gregor.
    #[arg(long)]
    pub binary: Option<PathBuf>,
    /// Records of 1 KiB produced to each of the 6- and the 1,000-partition topics; 0 skips the
    /// throughput phase.
    #[arg(long, default_value_t = 200_000)]
    pub throughput_records: u64,
    /// Seconds to let a broker settle before its idle RSS and descriptors are read.
    #[arg(long, default_value_t = 10)]
    pub settle_secs: u64,
    /// Seconds each phase (create, produce, shutdown, each restart) may take before the broker
    /// is reported as failing it.
    #[arg(long, default_value_t = 900)]
    pub timeout_secs: u64,
    /// Only re-render report.md from target/scale/report.json.
    #[arg(long)]
    pub render: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Which {
    Gregor,
    Kafka,
    Both,
}

/// Partitions of each topic the run creates (the last topic takes the remainder).
const PARTITIONS_PER_TOPIC: u32 = 100;
/// Topics per CreateTopics and per Produce request: 1,000 partitions, well within Kafka's
/// limit of records per controller operation.
const TOPICS_PER_REQUEST: usize = 10;
/// Metadata requests whose median latency is reported.
const METADATA_REPETITIONS: usize = 5;
/// Partitions of the two throughput topics.
const THROUGHPUT_PARTITIONS: [u32; 2] = [6, 1000];
/// Prefix of every topic the run creates.
const TOPIC_PREFIX: &str = "scale-";

/// `10000`, `10k`, `100_000`, `1m`.
fn parse_count(s: &str) -> Result<u32, String> {
    let t = s.trim().replace('_', "").to_ascii_lowercase();
    let (digits, mult) = match t.strip_suffix('k') {
        Some(d) => (d.to_string(), 1_000),
        None => match t.strip_suffix('m') {
            Some(d) => (d.to_string(), 1_000_000),
            None => (t.clone(), 1),
        },
    };
    let n: u32 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a partition count"))?;
    n.checked_mul(mult)
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{s:?}: a partition count is 1 to {}", u32::MAX))
}

/// The topics holding `n` partitions: (name, partitions), [`PARTITIONS_PER_TOPIC`] each.
fn topics_for(n: u32, tag: &str) -> Vec<(String, i32)> {
    let mut out = Vec::new();
    let mut left = n;
    let mut i = 0;
    while left > 0 {
        let p = left.min(PARTITIONS_PER_TOPIC);
        out.push((
            format!("{TOPIC_PREFIX}{tag}-{i:05}"),
            i32::try_from(p).unwrap_or(i32::MAX),
        ));
        left -= p;
        i += 1;
    }
    out
}

/// One of the measured brokers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Impl {
    Gregor,
    Kafka,
}

impl Impl {
    fn key(self) -> &'static str {
        match self {
            Self::Gregor => "gregor",
            Self::Kafka => "kafka",
        }
    }
}

/// The metrics of one partition count, in table order: (key, label, digits).
const METRICS: &[(&str, &str, usize)] = &[
    ("create_s", "create all partitions, s", 1),
    (
        "produce_s",
        "then 1 record to every partition (acks=all), s",
        2,
    ),
    (
        "produce_retried_partitions",
        "partitions not writable at first",
        0,
    ),
    ("create_and_produce_s", "create and produce, s", 1),
    ("empty_rss_mb", "RSS before any topic, MB", 1),
    ("idle_rss_mb", "idle RSS, MB", 1),
    (
        "rss_kib_per_partition",
        "(idle RSS - before) / partitions, KiB",
        2,
    ),
    ("empty_fds", "open descriptors before any topic", 0),
    ("idle_fds", "idle open descriptors", 0),
    (
        "fds_per_partition",
        "(idle descriptors - before) / partitions",
        2,
    ),
    ("metadata_ms", "Metadata (all topics), median ms", 1),
    ("metadata_kib", "Metadata response size, KiB", 0),
    ("metadata_one_ms", "Metadata (one topic), median ms", 2),
    ("create_one_ms", "CreateTopics of one more topic, ms", 1),
    ("metrics_ms", "/metrics scrape, ms", 1),
    ("metrics_series", "/metrics series", 0),
    ("shutdown_s", "clean shutdown (SIGTERM to exit), s", 2),
    ("restart_clean_s", "restart after SIGTERM, s", 2),
    ("restart_kill9_s", "restart after kill -9, s", 2),
];

/// The metrics of the throughput phase: (key, label, digits).
const THROUGHPUT_METRICS: &[(&str, &str, usize)] = &[
    ("mb_per_sec_6", "produce to 6 partitions, MB/s", 1),
    ("mb_per_sec_1000", "produce to 1,000 partitions, MB/s", 1),
    ("ratio_1000_over_6", "1,000 / 6 partitions", 2),
];

pub fn run(args: &ScaleArgs) -> Result<i32> {
    let root = repo_root();
    let out_dir = root.join("target").join("scale");
    if args.render {
        let report: Value =
            serde_json::from_str(&std::fs::read_to_string(out_dir.join("report.json"))?)?;
        println!("{}", markdown(&report));
        return Ok(0);
    }
    let binary = args
        .binary
        .clone()
        .unwrap_or_else(|| root.join("target").join("release").join("gregor"));
    if !binary.is_file() {
        bail!(
            "{} is missing: run `cargo build --release -p gregor`",
            binary.display()
        );
    }
    let mut impls = Vec::new();
    if args.which != Which::Kafka {
        impls.push(Impl::Gregor);
    }
    if args.which != Which::Gregor && !args.no_kafka {
        impls.push(Impl::Kafka);
    }
    if impls.is_empty() {
        bail!("--impl kafka with --no-kafka leaves nothing to run");
    }
    if impls.contains(&Impl::Kafka) {
        kafka::fetch()?;
    }
    watch_interrupts();
    let (soft, hard) = raise_nofile_limit()?;
    eprintln!("open-file limit (RLIMIT_NOFILE) for both brokers: soft {soft}, hard {hard}");
    let work = out_dir.join("work");
    // Logs of an earlier run (its data directories are gone already).
    if work.exists() {
        std::fs::remove_dir_all(&work).with_context(|| format!("wiping {}", work.display()))?;
    }
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let timeout = Duration::from_secs(args.timeout_secs);
    let settle = Duration::from_secs(args.settle_secs);
    let started = Instant::now();
    let mut limits = json!({});
    let mut runs = Vec::new();
    for &n in &args.partitions {
        let mut run = json!({"partitions": n, "topics": topics_for(n, "x").len()});
        for &which in &impls {
            eprintln!("==== scale: {n} partitions on {}", which.key());
            let mut r = json!({});
            if let Err(e) = measure(
                which,
                &binary,
                &work,
                n,
                timeout,
                settle,
                &mut r,
                &mut limits,
            ) {
                eprintln!("     {} failed: {e:#}", which.key());
                r["error"] = json!(format!("{e:#}"));
            }
            eprintln!("     {r}");
            run[which.key()] = r;
        }
        if impls.len() == 2 {
            run["ratio_gregor_over_kafka"] = ratios(&run["gregor"], &run["kafka"], METRICS);
        }
        runs.push(run);
    }
    let mut throughput = json!({});
    if args.throughput_records > 0 {
        for &which in &impls {
            eprintln!("==== scale: produce throughput on {}", which.key());
            let mut r = json!({});
            if let Err(e) =
                measure_throughput(which, &binary, &work, args.throughput_records, &mut r)
            {
                eprintln!("     {} failed: {e:#}", which.key());
                r["error"] = json!(format!("{e:#}"));
            }
            eprintln!("     {r}");
            throughput[which.key()] = r;
        }
        if impls.len() == 2 {
            throughput["ratio_gregor_over_kafka"] = ratios(
                &throughput["gregor"],
                &throughput["kafka"],
                THROUGHPUT_METRICS,
            );
        }
        throughput["records"] = json!(args.throughput_records);
    }
    let mut report = json!({
        "command": command_line(args),
        "machine": {"cores": bench::nproc()},
        "nofile_limit": {"soft": soft, "hard": hard, "brokers": limits},
        "partitions_per_topic": PARTITIONS_PER_TOPIC,
        "topics_per_request": TOPICS_PER_REQUEST,
        "settle_secs": args.settle_secs,
        "impls": impls.iter().map(|i| i.key()).collect::<Vec<_>>(),
        "runs": runs,
        "throughput": throughput,
        "seconds": started.elapsed().as_secs(),
    });
    if impls.contains(&Impl::Kafka) {
        report["kafka"] = json!({"version": kafka::KAFKA_VERSION, "jvm": "-Xmx1g -Xms256m"});
    }
    std::fs::write(
        out_dir.join("report.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    let md = markdown(&report);
    std::fs::write(out_dir.join("report.md"), &md)?;
    println!("{md}");
    println!(
        "scale: {} s; report in {}",
        started.elapsed().as_secs(),
        out_dir.display()
    );
    Ok(0)
}

fn command_line(args: &ScaleArgs) -> String {
    let mut s = format!(
        "cargo xtask scale --partitions {}",
        args.partitions
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    );
    match args.which {
        Which::Gregor => s.push_str(" --impl gregor"),
        Which::Kafka => s.push_str(" --impl kafka"),
        Which::Both => {}
    }
    if args.no_kafka {
        s.push_str(" --no-kafka");
    }
    let _ = write!(s, " --throughput-records {}", args.throughput_records);
    s
}

/// Raises this process's soft open-file limit to its hard limit (children inherit it), as
/// Kafka's documentation advises for brokers; returns (soft, hard) after.
fn raise_nofile_limit() -> Result<(u64, u64)> {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut lim = getrlimit(Resource::Nofile);
    if lim.current != lim.maximum {
        lim.current = lim.maximum;
        setrlimit(Resource::Nofile, lim).context("raising RLIMIT_NOFILE to the hard limit")?;
    }
    let lim = getrlimit(Resource::Nofile);
    let show = |v: Option<u64>| v.unwrap_or(u64::MAX);
    Ok((show(lim.current), show(lim.maximum)))
}

/// `Max open files` (soft) of a running process, from `/proc/<pid>/limits`.
fn process_nofile(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3).map(str::to_string)
}

/// Resident set size (`VmRSS`) in MB.
fn rss_mb(pid: u32) -> Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .ok_or_else(|| anyhow!("no VmRSS in /proc/{pid}/status"))?
        .parse()?;
    Ok(kb * 1024.0 / 1e6)
}

/// Open descriptors of `pid`.
fn fd_count(pid: u32) -> Result<usize> {
    Ok(std::fs::read_dir(format!("/proc/{pid}/fd"))
        .with_context(|| format!("listing /proc/{pid}/fd"))?
        .count())
}

/// A directory removed when dropped (a broker's data).
struct DataDir(PathBuf);

impl Drop for DataDir {
    fn drop(&mut self) {
        if self.0.exists() {
            if let Err(e) = std::fs::remove_dir_all(&self.0) {
                eprintln!("warning: removing {}: {e}", self.0.display());
            }
        }
    }
}

enum Process {
    Gregor(GregorServer),
    Kafka(ChildGuard),
}

/// The broker running now and its data directory, for [`watch_interrupts`].
#[derive(Default)]
struct Live {
    pid: Option<u32>,
    data: Option<PathBuf>,
}

static LIVE: std::sync::Mutex<Live> = std::sync::Mutex::new(Live {
    pid: None,
    data: None,
});

fn set_live(pid: Option<u32>, data: Option<PathBuf>) {
    if let Ok(mut live) = LIVE.lock() {
        *live = Live { pid, data };
    }
}

/// On Ctrl-C or SIGTERM, kills the broker running now and removes its data before exiting
/// (130). A gregor shares this process's group and sees Ctrl-C itself, but Kafka runs in a
/// group of its own (`kafka::Instance::start`) and would outlive the run.
fn watch_interrupts() {
    std::thread::spawn(|| {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async {
            use tokio::signal::unix::{signal, SignalKind};
            let mut term = signal(SignalKind::terminate()).ok();
            let terminated = async {
                match term.as_mut() {
                    Some(t) => {
                        t.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                () = terminated => {}
            }
        });
        let live = LIVE.lock().map(|l| (l.pid, l.data.clone()));
        if let Ok((pid, data)) = live {
            if let Some(pid) = pid {
                let _ = proc::signal(pid, "KILL");
                let t0 = Instant::now();
                while proc::pid_alive(pid) && t0.elapsed() < Duration::from_secs(10) {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            if let Some(d) = data {
                let _ = std::fs::remove_dir_all(d);
            }
        }
        eprintln!("scale: interrupted; the broker is stopped and its data removed");
        std::process::exit(130);
    });
}

/// One broker under measurement: its process (restartable on the same data), then its data
/// directory, which is removed after the process has been stopped (fields drop in order).
struct Node {
    which: Impl,
    binary: PathBuf,
    addr: SocketAddr,
    /// gregor's admin listener (`/metrics`).
    admin_port: u16,
    work: PathBuf,
    kafka: Option<kafka::Instance>,
    starts: u32,
    process: Process,
    _data: DataDir,
}

impl Drop for Node {
    fn drop(&mut self) {
        // Stopped here, before the interrupt watcher forgets it (the fields drop after).
        if let Err(e) = self.guard().stop() {
            eprintln!("warning: stopping {}: {e:#}", self.which.key());
        }
        set_live(None, None);
    }
}

impl Node {
    /// A fresh broker, answering ApiVersions.
    fn start(which: Impl, binary: &Path, work: &Path) -> Result<Self> {
        let ports = proc::free_ports(2)?;
        let addr: SocketAddr = format!("127.0.0.1:{}", ports[0]).parse()?;
        match which {
            Impl::Gregor => {
                let g = Gregor::start(binary, work, ports[0], ports[1])?;
                set_live(Some(g.guard.id()), Some(g.log_dir.clone()));
                let data = DataDir(g.log_dir.clone());
                Ok(Self {
                    which,
                    binary: binary.to_path_buf(),
                    addr,
                    admin_port: ports[1],
                    work: work.to_path_buf(),
                    kafka: None,
                    starts: 1,
                    process: Process::Gregor(g),
                    _data: data,
                })
            }
            Impl::Kafka => {
                let data_dir = work.join(format!("kafka-data-{}", ports[0]));
                let data = DataDir(data_dir.clone());
                let instance = kafka::Instance::new(ports[0], Some(ports[1]), Some(data_dir))?;
                let mut guard = ChildGuard::new("kafka", instance.spawn()?);
                set_live(Some(guard.id()), Some(data.0.clone()));
                instance.wait_ready(|| guard.check_alive())?;
                Ok(Self {
                    which,
                    binary: binary.to_path_buf(),
                    addr,
                    admin_port: 0,
                    work: work.to_path_buf(),
                    kafka: Some(instance),
                    starts: 1,
                    process: Process::Kafka(guard),
                    _data: data,
                })
            }
        }
    }

    fn guard(&mut self) -> &mut ChildGuard {
        match &mut self.process {
            Process::Gregor(g) => &mut g.guard,
            Process::Kafka(g) => g,
        }
    }

    fn pid(&mut self) -> u32 {
        self.guard().id()
    }

    fn log_file(&self) -> PathBuf {
        match (&self.process, &self.kafka) {
            (Process::Gregor(g), _) => g.log_file.clone(),
            (_, Some(k)) => k.server_log(),
            (Process::Kafka(_), None) => PathBuf::new(),
        }
    }

    /// The last lines of the broker's log, kept in the report when it fails.
    fn log_tail(&self) -> String {
        proc::tail(&self.log_file(), 20)
    }

    /// Errors if the broker has exited.
    fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.guard().try_wait()? {
            bail!("{} exited with {status}", self.which.key());
        }
        Ok(())
    }

    /// Sends `signal` and waits until the process has exited; returns the seconds it took.
    fn signal_and_wait(&mut self, signal: &str, timeout: Duration) -> Result<f64> {
        let pid = self.pid();
        let t0 = Instant::now();
        proc::signal(pid, signal)?;
        loop {
            if self.guard().try_wait()?.is_some() {
                return Ok(t0.elapsed().as_secs_f64());
            }
            if t0.elapsed() > timeout {
                proc::signal(pid, "KILL")?;
                bail!(
                    "{} did not exit within {} s of SIG{signal} (killed)",
                    self.which.key(),
                    timeout.as_secs()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Starts the broker again on its data; does not wait.
    fn restart(&mut self) -> Result<()> {
        self.starts += 1;
        let port = self.addr.port();
        match (&self.process, &self.kafka) {
            (Process::Gregor(g), _) => {
                let log_file = self
                    .work
                    .join(format!("gregor-{port}-start{}.log", self.starts));
                let log_dir = g.log_dir.clone();
                let g = GregorServer::spawn(
                    &self.binary,
                    &log_dir,
                    &log_file,
                    port,
                    self.admin_port,
                    &Gregor::reference_settings(),
                )?;
                set_live(Some(g.guard.id()), Some(log_dir));
                self.process = Process::Gregor(g);
            }
            (_, Some(k)) => {
                let child = k.start()?;
                set_live(Some(child.id()), Some(k.data_dir.clone()));
                self.process = Process::Kafka(ChildGuard::new("kafka", child));
            }
            (Process::Kafka(_), None) => bail!("a Kafka node without its instance"),
        }
        Ok(())
    }

    /// Starts the broker again and returns the seconds until Metadata shows a leader for
    /// every partition of `topics`.
    fn restart_until_led(&mut self, topics: &[(String, i32)], timeout: Duration) -> Result<f64> {
        let t0 = Instant::now();
        self.restart()?;
        wait_all_led(self, topics, timeout)?;
        Ok(t0.elapsed().as_secs_f64())
    }
}

/// A client connection that is re-made after any error.
fn connect(addr: SocketAddr, timeout: Duration) -> Result<KafkaConn> {
    let mut c = KafkaConn::connect_timeout(addr, Duration::from_secs(5), "xtask-scale")?;
    c.stream().set_read_timeout(Some(timeout))?;
    c.stream().set_write_timeout(Some(timeout))?;
    Ok(c)
}

/// Kafka's name of an error code.
fn error_name(code: i16) -> String {
    kafka_protocol::error::ResponseError::try_from_code(code)
        .map_or_else(|| format!("error {code}"), |e| format!("{e:?}"))
}

/// "3 x UnknownServerError (message)" lines for errors counted by (code, message).
fn summarize(errors: &BTreeMap<(i16, String), usize>) -> String {
    errors
        .iter()
        .map(|((code, msg), n)| {
            if msg.is_empty() {
                format!("{n} x {}", error_name(*code))
            } else {
                format!("{n} x {} ({msg})", error_name(*code))
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Creates `topics` (replication factor 1) in requests of [`TOPICS_PER_REQUEST`] topics.
fn create_topics(node: &mut Node, topics: &[(String, i32)], timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut conn = connect(node.addr, timeout)?;
    let mut errors: BTreeMap<(i16, String), usize> = BTreeMap::new();
    let mut created = 0usize;
    for chunk in topics.chunks(TOPICS_PER_REQUEST) {
        if Instant::now() > deadline {
            bail!(
                "{created} of {} topics created within {} s",
                topics.len(),
                timeout.as_secs()
            );
        }
        let req = CreateTopicsRequest::default()
            .with_timeout_ms(60_000)
            .with_topics(
                chunk
                    .iter()
                    .map(|(name, p)| {
                        CreatableTopic::default()
                            .with_name(TopicName(sb(name)))
                            .with_num_partitions(*p)
                            .with_replication_factor(1)
                    })
                    .collect(),
            );
        let resp: CreateTopicsResponse = conn
            .call(ApiKey::CreateTopics, 7, &req)
            .with_context(|| format!("CreateTopics after {created} topics"))?;
        for t in resp.topics {
            if t.error_code == 0 {
                created += 1;
            } else {
                let msg = t.error_message.map(|m| m.to_string()).unwrap_or_default();
                *errors.entry((t.error_code, msg)).or_default() += 1;
            }
        }
        node.check_alive()?;
    }
    if !errors.is_empty() {
        bail!(
            "{created} of {} topics created; the others failed: {}",
            topics.len(),
            summarize(&errors)
        );
    }
    Ok(())
}

/// (partitions of `topics` with a leader and no error, all partitions of `topics`) in an
/// all-topics Metadata answer.
fn count_led(resp: &MetadataResponse, topics: &HashMap<&str, i32>) -> (usize, usize) {
    let mut led = 0;
    for t in &resp.topics {
        let Some(name) = t.name.as_ref() else {
            continue;
        };
        if t.error_code != 0 || !topics.contains_key(name.0.as_str()) {
            continue;
        }
        led += t
            .partitions
            .iter()
            .filter(|p| p.error_code == 0 && p.leader_id.0 >= 0)
            .count();
    }
    let total = topics
        .values()
        .map(|p| usize::try_from(*p).unwrap_or(0))
        .sum();
    (led, total)
}

fn metadata_all() -> MetadataRequest {
    MetadataRequest::default()
        .with_topics(None)
        .with_allow_auto_topic_creation(false)
}

/// Waits until an all-topics Metadata answer shows a leader for every partition of `topics`.
fn wait_all_led(node: &mut Node, topics: &[(String, i32)], timeout: Duration) -> Result<()> {
    let want: HashMap<&str, i32> = topics.iter().map(|(n, p)| (n.as_str(), *p)).collect();
    let t0 = Instant::now();
    let mut conn: Option<KafkaConn> = None;
    let mut last = String::from("no answer yet");
    loop {
        node.check_alive()?;
        if conn.is_none() {
            conn = connect(node.addr, Duration::from_secs(30)).ok();
        }
        if let Some(c) = conn.as_mut() {
            match c.call::<_, MetadataResponse>(ApiKey::Metadata, 12, &metadata_all()) {
                Ok(resp) => {
                    let (led, total) = count_led(&resp, &want);
                    if led == total {
                        return Ok(());
                    }
                    last = format!("{led} of {total} partitions led");
                }
                Err(e) => {
                    last = format!("{e:#}");
                    conn = None;
                }
            }
        }
        if t0.elapsed() > timeout {
            bail!(
                "Metadata did not show a leader for every partition within {} s ({last})",
                timeout.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Errors a fresh partition may answer while its leadership settles.
fn retriable(code: i16) -> bool {
    // NOT_LEADER_OR_FOLLOWER, LEADER_NOT_AVAILABLE, UNKNOWN_TOPIC_OR_PARTITION,
    // REQUEST_TIMED_OUT, NOT_ENOUGH_REPLICAS, NOT_ENOUGH_REPLICAS_AFTER_APPEND.
    matches!(code, 6 | 5 | 3 | 7 | 19 | 20)
}

/// Produces one record (acks=all) to every partition of `topics`, retrying retriable errors
/// until `timeout`. Returns how many partitions answered a retriable error at first.
fn produce_one_each(node: &mut Node, topics: &[(String, i32)], timeout: Duration) -> Result<usize> {
    let deadline = Instant::now() + timeout;
    let now_ms = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis(),
    )?;
    let batch = Bytes::from(
        BatchBuilder::new(0, now_ms)
            .record(now_ms, None, Some(b"scale: one record per partition"), &[])
            .build(),
    );
    let mut pending: Vec<(String, Vec<i32>)> = topics
        .iter()
        .map(|(n, p)| (n.clone(), (0..*p).collect()))
        .collect();
    let mut conn = connect(node.addr, timeout)?;
    let mut first_round = true;
    let mut retried_partitions = 0;
    loop {
        let mut failed: Vec<(String, Vec<i32>)> = Vec::new();
        let mut fatal: BTreeMap<(i16, String), usize> = BTreeMap::new();
        let mut retried: BTreeMap<(i16, String), usize> = BTreeMap::new();
        for chunk in pending.chunks(TOPICS_PER_REQUEST) {
            let req = ProduceRequest::default()
                .with_acks(-1)
                .with_timeout_ms(30_000)
                .with_topic_data(
                    chunk
                        .iter()
                        .map(|(name, parts)| {
                            TopicProduceData::default()
                                .with_name(TopicName(sb(name)))
                                .with_partition_data(
                                    parts
                                        .iter()
                                        .map(|i| {
                                            PartitionProduceData::default()
                                                .with_index(*i)
                                                .with_records(Some(batch.clone()))
                                        })
                                        .collect(),
                                )
                        })
                        .collect(),
                );
            let resp: ProduceResponse = conn.call(ApiKey::Produce, 9, &req).context("Produce")?;
            for t in resp.responses {
                let mut again = Vec::new();
                for p in t.partition_responses {
                    if p.error_code == 0 {
                        continue;
                    }
                    let key = (
                        p.error_code,
                        p.error_message.map(|m| m.to_string()).unwrap_or_default(),
                    );
                    if retriable(p.error_code) {
                        again.push(p.index);
                        *retried.entry(key).or_default() += 1;
                    } else {
                        *fatal.entry(key).or_default() += 1;
                    }
                }
                if !again.is_empty() {
                    failed.push((t.name.0.to_string(), again));
                }
            }
            node.check_alive()?;
        }
        if !fatal.is_empty() {
            bail!("Produce failed: {}", summarize(&fatal));
        }
        if first_round {
            retried_partitions = failed.iter().map(|(_, p)| p.len()).sum();
            first_round = false;
        }
        if failed.is_empty() {
            return Ok(retried_partitions);
        }
        if Instant::now() > deadline {
            bail!(
                "Produce still failing after {} s: {}",
                timeout.as_secs(),
                summarize(&retried)
            );
        }
        pending = failed;
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The median latency (ms) of [`METADATA_REPETITIONS`] Metadata requests (`req`) on one
/// connection, and the size of the last answer's frame (KiB).
fn metadata_latency(node: &Node, req: &MetadataRequest) -> Result<(f64, f64)> {
    let mut conn = connect(node.addr, Duration::from_secs(60))?;
    let mut ms = Vec::new();
    let mut size = 0usize;
    for _ in 0..METADATA_REPETITIONS {
        let t0 = Instant::now();
        let id = conn.send(ApiKey::Metadata, 12, req)?;
        let body = conn.expect_response(ApiKey::Metadata, 12, id)?;
        ms.push(t0.elapsed().as_secs_f64() * 1e3);
        size = body.len();
    }
    Ok((median(&mut ms), size as f64 / 1024.0))
}

fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    match xs.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => xs[n / 2],
        n => (xs[n / 2 - 1] + xs[n / 2]) / 2.0,
    }
}

/// Seconds since `t0`, rounded to ms.
fn secs(t0: Instant) -> f64 {
    round(t0.elapsed().as_secs_f64(), 3)
}

/// The measurements of one partition count on one broker, written into `r` as they are made
/// (a failure leaves those before it).
#[allow(clippy::too_many_arguments)]
fn measure(
    which: Impl,
    binary: &Path,
    work: &Path,
    n: u32,
    timeout: Duration,
    settle: Duration,
    r: &mut Value,
    limits: &mut Value,
) -> Result<()> {
    let topics = topics_for(n, which.key());
    let mut node = Node::start(which, binary, work)?;
    let pid = node.pid();
    let limit = process_nofile(pid).unwrap_or_else(|| "?".into());
    eprintln!("     {} pid {pid}, open-file limit {limit}", which.key());
    limits[which.key()] = json!(limit);
    std::thread::sleep(settle);
    let empty_rss = rss_mb(pid)?;
    let empty_fds = fd_count(pid)?;
    r["empty_rss_mb"] = json!(round(empty_rss, 1));
    r["empty_fds"] = json!(empty_fds);

    let run_t0 = Instant::now();
    let result = (|| -> Result<()> {
        let t0 = Instant::now();
        create_topics(&mut node, &topics, timeout).context("create")?;
        wait_all_led(&mut node, &topics, timeout).context("create: waiting for leaders")?;
        r["create_s"] = json!(secs(t0));
        eprintln!("     created {n} partitions in {} s", r["create_s"]);

        let t0 = Instant::now();
        let retried = produce_one_each(&mut node, &topics, timeout).context("produce")?;
        r["produce_s"] = json!(secs(t0));
        r["produce_retried_partitions"] = json!(retried);
        r["create_and_produce_s"] = json!(round(
            r["create_s"].as_f64().unwrap_or(0.0) + r["produce_s"].as_f64().unwrap_or(0.0),
            3
        ));
        eprintln!("     produced to {n} partitions in {} s", r["produce_s"]);

        std::thread::sleep(settle);
        node.check_alive()?;
        let rss = rss_mb(pid)?;
        let fds = fd_count(pid)?;
        r["idle_rss_mb"] = json!(round(rss, 1));
        r["idle_fds"] = json!(fds);
        r["rss_kib_per_partition"] =
            json!(round((rss - empty_rss) * 1e6 / 1024.0 / f64::from(n), 2));
        r["fds_per_partition"] = json!(round((fds as f64 - empty_fds as f64) / f64::from(n), 2));

        let (ms, kib) = metadata_latency(&node, &metadata_all()).context("Metadata")?;
        r["metadata_ms"] = json!(round(ms, 2));
        r["metadata_kib"] = json!(round(kib, 0));
        let one = MetadataRequest::default()
            .with_topics(Some(vec![
                MetadataRequestTopic::default().with_name(Some(TopicName(sb(&topics[0].0))))
            ]))
            .with_allow_auto_topic_creation(false);
        let (ms, _) = metadata_latency(&node, &one).context("Metadata of one topic")?;
        r["metadata_one_ms"] = json!(round(ms, 3));
        // Work per request that grows with the partitions already there shows here.
        let extra = [(format!("{TOPIC_PREFIX}{}-extra", which.key()), 1)];
        let t0 = Instant::now();
        create_topics(&mut node, &extra, timeout).context("one more topic")?;
        r["create_one_ms"] = json!(round(t0.elapsed().as_secs_f64() * 1e3, 1));

        if which == Impl::Gregor {
            let t0 = Instant::now();
            let (status, body) =
                proc::http_get_timeout(node.admin_port, "/metrics", Duration::from_secs(120))
                    .context("/metrics")?;
            if status != 200 {
                bail!("/metrics answered HTTP {status}");
            }
            r["metrics_ms"] = json!(round(t0.elapsed().as_secs_f64() * 1e3, 1));
            r["metrics_series"] = json!(body
                .lines()
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .count());
        }

        r["shutdown_s"] = json!(round(node.signal_and_wait("TERM", timeout)?, 3));
        eprintln!("     clean shutdown in {} s", r["shutdown_s"]);
        r["restart_clean_s"] = json!(round(
            node.restart_until_led(&topics, timeout)
                .context("restart after SIGTERM")?,
            3
        ));
        eprintln!(
            "     restarted (after SIGTERM) in {} s",
            r["restart_clean_s"]
        );
        node.signal_and_wait("KILL", timeout)?;
        r["restart_kill9_s"] = json!(round(
            node.restart_until_led(&topics, timeout)
                .context("restart after kill -9")?,
            3
        ));
        eprintln!(
            "     restarted (after kill -9) in {} s",
            r["restart_kill9_s"]
        );
        Ok(())
    })();
    if result.is_err() {
        r["failed_after_s"] = json!(round(run_t0.elapsed().as_secs_f64(), 1));
        r["log_file"] = json!(node.log_file().display().to_string());
        r["log_tail"] = json!(node.log_tail());
        // What the broker holds when it failed, if it still runs.
        let pid = node.pid();
        if proc::pid_alive(pid) {
            if let (Ok(rss), Ok(fds)) = (rss_mb(pid), fd_count(pid)) {
                r["rss_mb_at_error"] = json!(round(rss, 1));
                r["fds_at_error"] = json!(fds);
            }
        }
    }
    result
}

/// Produce throughput to 6 and to 1,000 partitions on one fresh broker.
fn measure_throughput(
    which: Impl,
    binary: &Path,
    work: &Path,
    records: u64,
    r: &mut Value,
) -> Result<()> {
    let mut node = Node::start(which, binary, work)?;
    let result = throughput_on(&mut node, binary, records, r);
    if result.is_err() {
        r["log_file"] = json!(node.log_file().display().to_string());
        r["log_tail"] = json!(node.log_tail());
    }
    result
}

fn throughput_on(node: &mut Node, binary: &Path, records: u64, r: &mut Value) -> Result<()> {
    let bootstrap = node.addr.to_string();
    let warmup = format!("{TOPIC_PREFIX}tp-warmup");
    let mut topics = vec![(warmup.clone(), 6)];
    for p in THROUGHPUT_PARTITIONS {
        topics.push((format!("{TOPIC_PREFIX}tp-{p}"), i32::try_from(p)?));
    }
    let timeout = Duration::from_secs(300);
    create_topics(node, &topics, timeout)?;
    wait_all_led(node, &topics, timeout)?;
    // Kafka shows leaders in Metadata before it has made their logs: one acknowledged record
    // per partition says every log exists, so no creation overlaps the measurement.
    produce_one_each(node, &topics, timeout)?;
    let produce = |topic: &str, records: u64| -> Result<Value> {
        let p = Produce {
            records,
            record_size: 1024,
            acks: "all",
            compression: "none",
            throughput: -1,
            transaction_records: None,
        };
        let mut c = bench::produce_command(binary, &bootstrap, topic, &p, false);
        // Records without a key spread over every partition instead of one at a time.
        c.args(["-X", "sticky.partitioning.linger.ms=0"]);
        bench::perf(&mut c)
    };
    // A warm JIT for Kafka, the same page cache state for both.
    produce(&warmup, (records / 4).max(1000))?;
    for p in THROUGHPUT_PARTITIONS {
        let v = produce(&format!("{TOPIC_PREFIX}tp-{p}"), records)?;
        r[format!("mb_per_sec_{p}")] = json!(round(v["mb_per_sec"].as_f64().unwrap_or(0.0), 2));
        r[format!("records_per_sec_{p}")] =
            json!(round(v["records_per_sec"].as_f64().unwrap_or(0.0), 0));
        node.check_alive()?;
    }
    if let (Some(a), Some(b)) = (r["mb_per_sec_1000"].as_f64(), r["mb_per_sec_6"].as_f64()) {
        if b > 0.0 {
            r["ratio_1000_over_6"] = json!(round(a / b, 3));
        }
    }
    Ok(())
}

/// gregor/Kafka for every metric both have (Kafka's > 0).
fn ratios(a: &Value, b: &Value, metrics: &[(&str, &str, usize)]) -> Value {
    let mut out = json!({});
    for (m, _, _) in metrics {
        if let (Some(x), Some(y)) = (a[*m].as_f64(), b[*m].as_f64()) {
            if y > 0.0 && x >= 0.0 {
                out[*m] = json!(round(x / y, 3));
            }
        }
    }
    out
}

/// The columns of the report's tables: (heading, key) for the brokers it has.
fn columns(report: &Value) -> Vec<(&'static str, &'static str)> {
    let impls: Vec<&str> = report["impls"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let mut cols = Vec::new();
    if impls.contains(&"gregor") {
        cols.push(("gregor", "gregor"));
    }
    if impls.contains(&"kafka") {
        cols.push(("Kafka", "kafka"));
    }
    if cols.len() == 2 {
        cols.push(("gregor/Kafka", "ratio_gregor_over_kafka"));
    }
    cols
}

/// One table: a row per metric, a column per broker (and the ratio).
fn table(s: &mut String, entry: &Value, metrics: &[(&str, &str, usize)], cols: &[(&str, &str)]) {
    let _ = writeln!(
        s,
        "| | {} |",
        cols.iter().map(|c| c.0).collect::<Vec<_>>().join(" | ")
    );
    let _ = writeln!(s, "|---|{}", "---:|".repeat(cols.len()));
    for (key, label, digits) in metrics {
        if cols.iter().all(|(_, c)| entry[*c][*key].is_null()) {
            continue;
        }
        let cells: Vec<String> = cols
            .iter()
            .map(|(_, c)| {
                let d = if c.starts_with("ratio") { 2 } else { *digits };
                fmt_num(&entry[*c][*key], d)
            })
            .collect();
        let _ = writeln!(s, "| {label} | {} |", cells.join(" | "));
    }
    for (name, c) in cols {
        if let Some(e) = entry[*c]["error"].as_str() {
            let after = entry[*c]["failed_after_s"]
                .as_f64()
                .map(|s| format!(" after {s:.1} s"))
                .unwrap_or_default();
            let mut line = format!(
                "\n{name} failed{after}: {}",
                e.lines().next().unwrap_or(e).trim()
            );
            if let (Some(fds), Some(rss)) = (
                entry[*c]["fds_at_error"].as_u64(),
                entry[*c]["rss_mb_at_error"].as_f64(),
            ) {
                let _ = write!(line, " (then: {fds} open descriptors, RSS {rss:.1} MB)");
            }
            if let Some(log) = entry[*c]["log_file"].as_str() {
                let _ = write!(line, "; its log: {log}");
            }
            let _ = writeln!(s, "{line}");
        }
    }
}

fn markdown(report: &Value) -> String {
    let mut s = String::new();
    let cols = columns(report);
    let brokers = if report["kafka"].is_null() {
        "gregor alone".to_string()
    } else {
        format!(
            "gregor and Apache Kafka {} ({}, one KRaft node, broker and controller) in turn",
            report["kafka"]["version"].as_str().unwrap_or_default(),
            report["kafka"]["jvm"].as_str().unwrap_or_default()
        )
    };
    let limits = &report["nofile_limit"]["brokers"];
    let limit_of = |k: &str| limits[k].as_str().unwrap_or("?").to_string();
    let _ = writeln!(
        s,
        "`{}`: {brokers} on {} core(s); open-file limit {} (soft = hard; as the \
         brokers saw it: {}). Topics of {} partitions, replication factor 1, created {} per \
         CreateTopics request; one record per partition (acks=all). Idle figures after {} s; \
         per partition is above the same broker before it had any topic. Restarts count from \
         starting the process until Metadata shows a leader for every partition. Kafka shows \
         leaders in Metadata before it has made their logs, and makes them while the first \
         records wait: compare the sum of create and produce.\n",
        report["command"].as_str().unwrap_or_default(),
        report["machine"]["cores"],
        report["nofile_limit"]["soft"],
        cols.iter()
            .filter(|c| !c.1.starts_with("ratio"))
            .map(|c| format!("{} {}", c.0, limit_of(c.1)))
            .collect::<Vec<_>>()
            .join(", "),
        report["partitions_per_topic"],
        report["topics_per_request"],
        report["settle_secs"],
    );
    for run in report["runs"].as_array().into_iter().flatten() {
        let _ = writeln!(
            s,
            "**{} partitions** ({} topics)\n",
            fmt_num(&run["partitions"], 0),
            run["topics"]
        );
        table(&mut s, run, METRICS, &cols);
        s.push('\n');
    }
    let tp = &report["throughput"];
    if tp["records"].is_u64() {
        let _ = writeln!(
            s,
            "**Produce throughput**: {} records of 1 KiB (acks=all, `gregor perf produce`, \
             librdkafka, sticky partitioning off) to each topic\n",
            fmt_num(&tp["records"], 0)
        );
        table(&mut s, tp, THROUGHPUT_METRICS, &cols);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_counts_parse_with_suffixes_and_reject_nonsense() {
        assert_eq!(parse_count("10000"), Ok(10_000));
        assert_eq!(parse_count("10k"), Ok(10_000));
        assert_eq!(parse_count("100_000"), Ok(100_000));
        assert_eq!(parse_count("1M"), Ok(1_000_000));
        assert!(parse_count("0").is_err());
        assert!(parse_count("ten").is_err());
        assert!(parse_count("5000000k").is_err());
    }

    #[test]
    fn topics_hold_exactly_the_partitions_asked_for() {
        let t = topics_for(1050, "g");
        assert_eq!(t.len(), 11);
        assert_eq!(t.iter().map(|x| x.1).sum::<i32>(), 1050);
        assert_eq!(t[10], ("scale-g-00010".to_string(), 50));
        assert_eq!(topics_for(6, "k"), [("scale-k-00000".to_string(), 6)]);
    }

    #[test]
    fn table_has_both_brokers_the_ratio_and_the_failure() {
        let mut report = json!({
            "command": "cargo xtask scale --partitions 1000",
            "machine": {"cores": 2},
            "nofile_limit": {"soft": 20000, "hard": 20000,
                             "brokers": {"gregor": "20000", "kafka": "20000"}},
            "partitions_per_topic": 100,
            "topics_per_request": 10,
            "settle_secs": 10,
            "impls": ["gregor", "kafka"],
            "kafka": {"version": "4.4.0", "jvm": "-Xmx1g"},
            "runs": [{
                "partitions": 10000, "topics": 100,
                "gregor": {"create_s": 2.0, "empty_fds": 40, "error": "restart after kill -9: \
                           Metadata did not show a leader\nmore", "fds_at_error": 19990,
                           "rss_mb_at_error": 80.0},
                "kafka": {"create_s": 8.0, "empty_fds": 200},
            }],
            "throughput": {"records": 1000,
                           "gregor": {"mb_per_sec_6": 50.0, "mb_per_sec_1000": 40.0,
                                      "ratio_1000_over_6": 0.8},
                           "kafka": {"mb_per_sec_6": 25.0, "mb_per_sec_1000": 20.0,
                                     "ratio_1000_over_6": 0.8}},
        });
        let run = &report["runs"][0];
        report["runs"][0]["ratio_gregor_over_kafka"] =
            ratios(&run["gregor"], &run["kafka"], METRICS);
        let tp = &report["throughput"];
        report["throughput"]["ratio_gregor_over_kafka"] =
            ratios(&tp["gregor"], &tp["kafka"], THROUGHPUT_METRICS);
        let md = markdown(&report);
        assert!(md.contains("| | gregor | Kafka | gregor/Kafka |"), "{md}");
        assert!(md.contains("**10,000 partitions** (100 topics)"), "{md}");
        assert!(
            md.contains("| create all partitions, s | 2.0 | 8.0 | 0.25 |"),
            "{md}"
        );
        assert!(
            md.contains("| open descriptors before any topic | 40 | 200 | 0.20 |"),
            "{md}"
        );
        // Rows nobody measured are left out; a side that did not measure one shows a dash.
        assert!(!md.contains("/metrics scrape"), "{md}");
        assert!(
            md.contains(
                "gregor failed: restart after kill -9: Metadata did not show a leader \
                 (then: 19990 open descriptors, RSS 80.0 MB)"
            ),
            "{md}"
        );
        assert!(md.contains("| produce to 6 partitions, MB/s | 50.0 | 25.0 | 2.00 |"));
        assert!(md.contains("| 1,000 / 6 partitions | 0.80 | 0.80 | 1.00 |"));
        assert!(md.contains("gregor 20000, Kafka 20000"), "{md}");

        report["impls"] = json!(["gregor"]);
        let md = markdown(&report);
        assert!(md.contains("| | gregor |\n|---|---:|\n"), "{md}");
        assert!(!md.contains("Kafka failed"), "{md}");
    }
}
