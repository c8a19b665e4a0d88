//! The fault test of partition replication (issue 11), in the spirit of Jepsen's Kafka queue
//! workload: a three-node cluster behind [`crate::proxy`] proxies, a topic with replication
//! factor 3 and `min.insync.replicas=2`, idempotent acks=all producers of two clients
//! (librdkafka through rdkafka, and the Java client through
//! `interop/java/workload/ProducerWorkload.java`), a consumer reading during the faults, and
//! every few seconds one fault from a seeded schedule:
//! - kill -9 of the leader of a partition, or of the active controller;
//! - SIGSTOP of a broker, SIGCONT later (a long GC pause);
//! - a cut link between two nodes, or a node isolated from the others (the proxies);
//! - a full-cluster crash (kill -9 of every node) and restart;
//! - a follower's disk full (its data directory is a size-limited tmpfs, filled to the last
//!   byte and freed later; needs `mount`, see [`disk_full_supported`]).
//!
//! Each fault is held for a few seconds, then healed (restart, SIGCONT, links up, disk freed,
//! and a node that exited is restarted), and the next one starts once the cluster is ready
//! again. After the last one the producers stop, a consumer reads every partition to its end,
//! and [`History::check_reads`] checks: every acknowledged record read back exactly once, in
//! its partition, in real-time order, at contiguous offsets; nothing the consumer saw during
//! the faults is gone; unacknowledged records may or may not be there.
//!
//! The schedule is a function of the seed alone (which fault, which partition or node index,
//! how long): [`ChaosOutcome`] prints it, and `cargo xtask chaos --seed S` replays it (the node
//! a "leader of partition p" resolves to depends on the run).

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use crate::cluster::{Cluster, ClusterConfig, ClusterOptions, Implementation, READY_TIMEOUT};
use crate::history::{FinalState, Found, History, OpId, OpKind, Outcome, Report};
use crate::process::{self, ChildGuard};
use crate::reference;
use crate::scenarios::{admin, create_topic_recorded, partition_leaders, read_topic};

/// The topic the workload writes.
pub const TOPIC: &str = "chaos";

/// One kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fault {
    /// kill -9 of the leader of a partition; restarted after the hold.
    KillLeader,
    /// kill -9 of the active controller (the metadata quorum leader); restarted after.
    KillController,
    /// SIGSTOP of a broker, SIGCONT after the hold.
    PauseBroker,
    /// The link between two nodes cut, both directions.
    CutLink,
    /// A node cut from the other nodes (clients still reach it).
    IsolateNode,
    /// kill -9 of every node, then all started again.
    FullRestart,
    /// A follower's data directory filled to the last byte, freed after the hold.
    DiskFull,
}

impl Fault {
    /// Every fault.
    pub const ALL: [Self; 7] = [
        Self::KillLeader,
        Self::KillController,
        Self::PauseBroker,
        Self::CutLink,
        Self::IsolateNode,
        Self::FullRestart,
        Self::DiskFull,
    ];

    /// The fault's name on the command line (`kill-leader`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Self::KillLeader => "kill-leader",
            Self::KillController => "kill-controller",
            Self::PauseBroker => "pause-broker",
            Self::CutLink => "cut-link",
            Self::IsolateNode => "isolate-node",
            Self::FullRestart => "full-restart",
            Self::DiskFull => "disk-full",
        }
    }

    /// Parses a comma-separated list of [`Fault::name`]s.
    ///
    /// # Errors
    /// On an unknown name (the message lists the known ones).
    pub fn parse_list(list: &str) -> Result<Vec<Self>> {
        list.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|name| {
                Self::ALL
                    .into_iter()
                    .find(|f| f.name() == name)
                    .with_context(|| {
                        format!(
                            "unknown fault {name:?}; known: {}",
                            Self::ALL.map(Self::name).join(",")
                        )
                    })
            })
            .collect()
    }

    /// How long the fault is held, ms: (min, max).
    fn hold_ms(self) -> (u64, u64) {
        match self {
            // Longer than broker.session.timeout.ms (4 s), so the controller fences the
            // broker and fail-over happens while it is down.
            Self::KillLeader | Self::KillController | Self::IsolateNode => (5_000, 8_000),
            Self::PauseBroker | Self::CutLink | Self::DiskFull => (3_000, 7_000),
            Self::FullRestart => (500, 2_000),
        }
    }
}

/// A small deterministic generator (SplitMix64): the schedule depends on the seed alone.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }
}

/// One step of the seeded schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// The fault.
    pub fault: Fault,
    /// Which partition (for leader kills and disk full) or node index (pause, isolate), or
    /// the first of a pair (cut); taken modulo the count.
    pub pick: u64,
    /// The second node of a cut link (an offset added to the first, 1 or 2 on three nodes).
    pub pick2: u64,
    /// How long the fault is held, ms.
    pub hold_ms: u64,
    /// How long to wait after the cluster is ready again before the next fault, ms.
    pub quiet_ms: u64,
}

/// The first `n` steps of the schedule of `seed` over `faults`.
pub fn schedule(seed: u64, faults: &[Fault], n: usize) -> Vec<Step> {
    let mut rng = SplitMix64::new(seed);
    (0..n)
        .map(|_| {
            // A full restart takes the longest (every JVM starts again): half as often.
            let weights: Vec<u64> = faults
                .iter()
                .map(|f| if *f == Fault::FullRestart { 1 } else { 2 })
                .collect();
            let mut ticket = rng.next_u64() % weights.iter().sum::<u64>().max(1);
            let mut fault = faults[0];
            for (f, w) in faults.iter().zip(&weights) {
                if ticket < *w {
                    fault = *f;
                    break;
                }
                ticket -= w;
            }
            let (lo, hi) = fault.hold_ms();
            Step {
                fault,
                pick: rng.next_u64() % 1024,
                pick2: rng.range(1, 2),
                hold_ms: rng.range(lo, hi),
                quiet_ms: rng.range(1_000, 3_000),
            }
        })
        .collect()
}

/// What to run.
#[derive(Debug, Clone)]
pub struct ChaosConfig {
    /// gregor or Kafka.
    pub implementation: Implementation,
    /// How long faults are injected (the last fault may end a little later).
    pub duration: Duration,
    /// The schedule's seed.
    pub seed: u64,
    /// The faults to choose from.
    pub faults: Vec<Fault>,
    /// Partitions of the topic.
    pub partitions: i32,
    /// Also drive the Java client (needs `javac`).
    pub java: bool,
    /// Records per second per producer (about).
    pub rate: u32,
}

impl ChaosConfig {
    /// Every fault (disk full only where [`disk_full_supported`]), four partitions, both
    /// clients, 100 records per second each.
    pub fn new(implementation: Implementation, duration: Duration, seed: u64) -> Self {
        Self {
            implementation,
            duration,
            seed,
            faults: Fault::ALL.to_vec(),
            partitions: 4,
            java: true,
            rate: 100,
        }
    }
}

/// A fault as it happened.
#[derive(Debug, Clone)]
pub struct FaultEvent {
    /// The step of the schedule.
    pub step: Step,
    /// What it hit, e.g. `node 2 (leader of chaos-1)`.
    pub target: String,
    /// When it began, ms on the history's clock.
    pub at_ms: u64,
    /// When it was healed, ms on the history's clock.
    pub healed_ms: u64,
    /// When the cluster was ready again, ms.
    pub ready_ms: u64,
    /// Partitions the faulted node led when the fault began (their writes must fail over).
    pub led: BTreeSet<i32>,
    /// From the fault to the first acknowledged write to one of `led` sent after it, when
    /// that came before the heal (a new leader took over), ms.
    pub failover_ms: Option<u64>,
}

/// What a run found.
#[derive(Debug, Clone)]
pub struct ChaosOutcome {
    /// gregor or kafka.
    pub implementation: &'static str,
    /// The seed.
    pub seed: u64,
    /// Every fault injected.
    pub events: Vec<FaultEvent>,
    /// The checker's findings.
    pub report: Report,
    /// Records acknowledged to librdkafka and to the Java client.
    pub acknowledged_rdkafka: usize,
    /// Records acknowledged to the Java client.
    pub acknowledged_java: usize,
    /// Records consumers saw during the faults (with repeats).
    pub observed_reads: usize,
    /// Seconds with producers sending and nothing acknowledged.
    pub unavailable_seconds: u64,
    /// Faults of the configuration that could not be used, and why.
    pub skipped: Vec<String>,
    /// Epoch bumps (or producer id resets) of librdkafka's idempotent producer. After one,
    /// librdkafka resends possibly-persisted records with new sequence numbers, which the
    /// broker cannot deduplicate (librdkafka issue #4953, also on Apache Kafka): duplicates of
    /// librdkafka records in such a run are reported apart and do not fail the check.
    pub rdkafka_epoch_bumps: u64,
    /// Wall time of the whole run, s.
    pub seconds: u64,
}

impl ChaosOutcome {
    /// Whether the checker found nothing wrong, apart from duplicates of librdkafka records
    /// in a run where librdkafka bumped its producer epoch ([`Self::client_duplicates`]) and
    /// the misplacements of those duplicates while the acknowledged offset holds the record
    /// (one copy acknowledged, the others elsewhere). A record acknowledged at an offset that
    /// holds another record or none ([`Report::acked_elsewhere`]), and acknowledgement
    /// conflicts ([`Report::ack_conflicts`]), are never excused.
    pub fn is_valid(&self) -> bool {
        let excused = self.client_duplicates();
        let mut report = self.report.clone();
        report
            .records_duplicated
            .retain(|(v, _)| !excused.contains(v.as_str()));
        // A misplaced copy of an excused duplicate is excused only while the offset the
        // record was acknowledged at holds the record itself (another copy): librdkafka's
        // resend after the epoch bump, acknowledged with that copy's offsets. An
        // acknowledgement naming an offset that holds something else is not #4953.
        let elsewhere: BTreeSet<&str> = report
            .acked_elsewhere
            .iter()
            .map(|(f, _)| f.value.as_str())
            .collect();
        report.records_misplaced.retain(|(f, _)| {
            !excused.contains(f.value.as_str()) || elsewhere.contains(f.value.as_str())
        });
        report.is_valid()
    }

    /// Duplicated librdkafka records (`r-...`) when librdkafka bumped its epoch during the
    /// run: a known client behaviour (librdkafka issue #4953), not the broker's doing.
    /// Duplicates of the Java client's records are never excused.
    ///
    /// What librdkafka 2.12 does (seen with `GREGOR_CHAOS_RDKAFKA_DEBUG`): a ProduceRequest
    /// that fails with "Local: Timed out" (actions `Retry,MsgPossiblyPersisted`), or messages
    /// expired by `message.timeout.ms`, make it drain the partitions and bump its epoch
    /// locally (`rd_kafka_idemp_drain_epoch_bump`, "All partitions drained, bumped epoch");
    /// `rd_kafka_toppar_pid_change` then resets the partition's sequence base to the first
    /// queued message, so the possibly persisted messages are sent again with the new epoch
    /// and sequence 0: the broker cannot tell them from new records and writes them again. The
    /// delivery report carries the offsets of that second write (`rd_kafka_msgq_set_metadata`:
    /// the response's base offset plus the message's position in the batch), so the first
    /// copy is found at another offset than acknowledged (misplaced) while the acknowledged
    /// offset holds the record. [`Self::is_valid`] excuses exactly that shape.
    pub fn client_duplicates(&self) -> BTreeSet<&str> {
        if self.rdkafka_epoch_bumps == 0 {
            return BTreeSet::new();
        }
        self.report
            .records_duplicated
            .iter()
            .map(|(v, _)| v.as_str())
            .filter(|v| v.starts_with("r-"))
            .collect()
    }

    /// Fail-over times measured, ms.
    pub fn failovers_ms(&self) -> Vec<u64> {
        self.events.iter().filter_map(|e| e.failover_ms).collect()
    }
}

impl fmt::Display for ChaosOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "chaos on {} (seed {}, {} s, {} faults; replay: cargo xtask chaos --impl {} --seed {}):",
            self.implementation,
            self.seed,
            self.seconds,
            self.events.len(),
            self.implementation,
            self.seed
        )?;
        for (i, e) in self.events.iter().enumerate() {
            writeln!(
                f,
                "  {i:>3}. {:>7.1}s {:?} {} held {} ms, ready {:.1} s after the heal, \
                 fail-over {}",
                e.at_ms as f64 / 1000.0,
                e.step.fault,
                e.target,
                e.step.hold_ms,
                e.ready_ms.saturating_sub(e.healed_ms) as f64 / 1000.0,
                match (e.led.is_empty(), e.failover_ms) {
                    (true, _) => "-".to_string(),
                    (false, Some(ms)) => format!("{ms} ms"),
                    (false, None) => "none before the heal".to_string(),
                }
            )?;
        }
        for s in &self.skipped {
            writeln!(f, "  skipped: {s}")?;
        }
        let failovers = self.failovers_ms();
        writeln!(
            f,
            "acknowledged {} (librdkafka {}, Java {}), lost {}, duplicated {} ({} of them by \
             librdkafka after {} epoch bumps, librdkafka#4953), reordered {}, offset gaps {}, \
             reads gone {}; unavailable {} s; fail-over ms {:?} (max {:?}); {} reads during the \
             faults",
            self.report.records_acknowledged,
            self.acknowledged_rdkafka,
            self.acknowledged_java,
            self.report.records_lost.len(),
            self.report.records_duplicated.len(),
            self.client_duplicates().len(),
            self.rdkafka_epoch_bumps,
            self.report.records_reordered.len(),
            self.report.offset_gaps.len(),
            self.report.reads_gone.len(),
            self.unavailable_seconds,
            failovers,
            failovers.iter().max(),
            self.observed_reads
        )?;
        write!(f, "{}", self.report)
    }
}

/// Whether a size-limited tmpfs can be mounted here (the disk-full fault): `Err` says why
/// not. Mounting needs root or CAP_SYS_ADMIN; without it, the fault would need a
/// pre-made small filesystem (a loop device or tmpfs mounted by an administrator) or a FUSE
/// filesystem with a quota.
pub fn disk_full_supported() -> std::result::Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let out = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(dir.path())
        .output()
        .map_err(|e| format!("cannot run mount: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "mount -t tmpfs is not permitted ({}: {}); a full disk needs root or \
             CAP_SYS_ADMIN to mount a size-limited filesystem",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Command::new("umount")
        .arg(dir.path())
        .status()
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// Runs the workload and the faults, then checks the history.
///
/// # Errors
/// When the cluster cannot be started, a fault cannot be injected or healed, or the
/// cluster does not become ready again; with the nodes' logs. A history that fails the check
/// is not an error: see [`ChaosOutcome::is_valid`].
pub fn run(config: &ChaosConfig) -> Result<ChaosOutcome> {
    let started = Instant::now();
    let mut skipped = Vec::new();
    let mut faults = config.faults.clone();
    let disk = faults.contains(&Fault::DiskFull);
    let disk = disk
        && match disk_full_supported() {
            Ok(()) => true,
            Err(why) => {
                faults.retain(|f| *f != Fault::DiskFull);
                skipped.push(format!("disk full: {why}"));
                false
            }
        };
    ensure!(!faults.is_empty(), "no fault to inject");
    let cluster_config = ClusterConfig::combined(config.implementation.clone(), 3)
        .with("broker.session.timeout.ms", "4000")
        .with("broker.heartbeat.interval.ms", "500")
        .with("replica.lag.time.max.ms", "5000")
        .with("unclean.leader.election.enable", "false");
    let mut options = ClusterOptions::default().with_proxies();
    if disk {
        options = options.with_disk_limit_mib(256);
    }
    let mut cluster = Cluster::start_with(&cluster_config, &options)?;
    let result = run_on(&mut cluster, config, &faults, disk, skipped, started);
    result.with_context(|| format!("cluster logs:{}", cluster.logs(30)))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Every client error is an unknown outcome: with retries, an earlier attempt of a record
/// whose last attempt failed may have been written.
fn unknown(e: &KafkaError) -> Outcome {
    Outcome::Unknown(e.to_string())
}

struct Recorder {
    history: Arc<History>,
    /// librdkafka's log lines (`debug=eos,msg`), when `GREGOR_CHAOS_RDKAFKA_DEBUG` is set.
    log: Option<Mutex<std::fs::File>>,
    /// librdkafka's epoch bumps and producer id resets (`debug=eos`, "All partitions
    /// drained").
    epoch_bumps: Arc<std::sync::atomic::AtomicU64>,
}

impl ClientContext for Recorder {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        // librdkafka (rdkafka_idempotence.c) logs this when it has drained its partitions
        // to bump the epoch ("..., bumped epoch to ...") or to fetch a new producer id: both
        // resend the unacknowledged records with new sequence numbers.
        if message.contains("All partitions drained") {
            self.epoch_bumps.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(f) = &self.log {
            let _ = writeln!(lock(f), "{level:?} {fac} {message}");
        }
    }
}

impl ProducerContext for Recorder {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, op: usize) {
        let outcome = match result {
            Ok(m) => Outcome::Ok {
                offset: Some(m.offset()),
            },
            Err((e, _)) => unknown(e),
        };
        self.history.complete(OpId(op), outcome);
    }
}

/// The workers: producers and the consumer, stopped together.
struct Workload {
    stop: Arc<AtomicBool>,
    epoch_bumps: Arc<std::sync::atomic::AtomicU64>,
    rdkafka: Option<std::thread::JoinHandle<Result<ThreadedProducer<Recorder>>>>,
    java: Option<JavaProducer>,
    consumer: Option<std::thread::JoinHandle<Result<()>>>,
    observed: Arc<Mutex<Vec<Found>>>,
}

impl Drop for Workload {
    /// On an error path the threads stop too (the Java process is killed by its guard).
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn run_on(
    cluster: &mut Cluster,
    config: &ChaosConfig,
    faults: &[Fault],
    disk: bool,
    skipped: Vec<String>,
    started: Instant,
) -> Result<ChaosOutcome> {
    let history = Arc::new(History::new());
    let bootstrap = cluster.bootstrap();
    {
        let rt = crate::clients::runtime()?;
        let outcome = create_topic_recorded(
            &rt,
            &admin(&bootstrap)?,
            &history,
            TOPIC,
            config.partitions,
            3,
            &[("min.insync.replicas", "2")],
        );
        ensure!(
            matches!(outcome, Outcome::Ok { .. }),
            "creating {TOPIC}: {outcome:?}"
        );
    }
    partition_leaders(&bootstrap, TOPIC, config.partitions)?;
    let mut workload = start_workload(&bootstrap, config, &history)?;
    // Writes flow before the first fault.
    let deadline = Instant::now() + Duration::from_secs(60);
    while history.acknowledged(|k| matches!(k, OpKind::Produce { .. })) < 100 {
        ensure!(
            Instant::now() < deadline,
            "fewer than 100 records acknowledged within 60 s of the start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let plan = schedule(config.seed, faults, 10_000);
    eprintln!(
        "chaos on {} seed {}: faults {:?}{}",
        cluster.implementation.name(),
        config.seed,
        faults,
        if disk || !config.faults.contains(&Fault::DiskFull) {
            ""
        } else {
            " (disk full skipped: mount not permitted)"
        }
    );
    let end = Instant::now() + config.duration;
    let mut events = Vec::new();
    let mut fault_result = Ok(());
    for step in plan {
        if Instant::now() >= end {
            break;
        }
        match inject(cluster, &history, config, &step) {
            Ok(e) => {
                eprintln!(
                    "chaos {:>7.1}s: {:?} {} (hold {} ms), ready again {:.1} s after the heal",
                    e.at_ms as f64 / 1000.0,
                    step.fault,
                    e.target,
                    step.hold_ms,
                    e.ready_ms.saturating_sub(e.healed_ms) as f64 / 1000.0
                );
                events.push(e);
            }
            Err(e) => {
                fault_result = Err(e.context(format!("fault {step:?}")));
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(step.quiet_ms));
    }
    // Whatever happened: every link up, every node running, then stop the clients.
    if let Some(net) = cluster.network() {
        net.heal();
    }
    for id in cluster.broker_ids() {
        let n = cluster.node_mut(id);
        n.free_disk().ok();
        if n.is_paused() {
            n.resume()?;
        }
        if !n.is_running()? {
            n.spawn()?;
        }
    }
    cluster.wait_ready(READY_TIMEOUT)?;
    fault_result?;
    // A little traffic on the healed cluster, then stop.
    std::thread::sleep(Duration::from_secs(2));
    let end_ms = history.now_ms();
    let observed = stop_workload(&mut workload, &history)?;

    let state = FinalState {
        topics: BTreeSet::from([TOPIC.to_string()]),
        records: read_topic(&bootstrap, TOPIC, config.partitions)?,
    };
    let report = history.check_reads(&state, &observed);
    // The history also for a run whose only findings are excused (duplicated or misplaced
    // librdkafka records), to tell the client's doing from the broker's.
    if !report.is_valid()
        || !report.records_duplicated.is_empty()
        || !report.records_misplaced.is_empty()
    {
        dump(&history, &state, cluster.implementation.name(), config.seed);
    }
    if !report.is_valid() {
        keep_server_logs(cluster, config.seed);
    }
    for e in &mut events {
        if e.led.is_empty() {
            continue;
        }
        let led = e.led.clone();
        e.failover_ms = history
            .first_ack_invoked_after(
                e.at_ms,
                |k| matches!(k, OpKind::Produce { partition, .. } if led.contains(partition)),
            )
            .filter(|ack| *ack < e.healed_ms)
            .map(|ack| ack - e.at_ms);
    }
    let is_java =
        |k: &OpKind| matches!(k, OpKind::Produce { value, .. } if value.starts_with("j-"));
    let is_rdkafka =
        |k: &OpKind| matches!(k, OpKind::Produce { value, .. } if value.starts_with("r-"));
    Ok(ChaosOutcome {
        implementation: cluster.implementation.name(),
        seed: config.seed,
        events,
        acknowledged_rdkafka: history.acknowledged(is_rdkafka),
        acknowledged_java: history.acknowledged(is_java),
        report,
        observed_reads: observed.len(),
        unavailable_seconds: history.unavailable_seconds(end_ms),
        skipped,
        rdkafka_epoch_bumps: workload.epoch_bumps.load(Ordering::Relaxed),
        seconds: started.elapsed().as_secs(),
    })
}

/// Writes the history and the final log to `target/chaos/<impl>-<seed>.txt`, for a failed
/// check or one with duplicated or misplaced records (best effort: a failure to write is printed, not returned).
fn dump(history: &History, state: &FinalState, implementation: &str, seed: u64) {
    let dir = process::repo_root().join("target/chaos");
    let path = dir.join(format!("{implementation}-{seed}.txt"));
    let mut text = String::new();
    for op in history.ops() {
        text.push_str(&format!(
            "op {} {:?} {:?} {:?}\n",
            op.invoke_ms, op.complete_ms, op.kind, op.outcome
        ));
    }
    for ((topic, partition), records) in &state.records {
        for (offset, value) in records {
            text.push_str(&format!("log {topic}-{partition} {offset} {value}\n"));
        }
    }
    match std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, text)) {
        Ok(()) => eprintln!("chaos: history and final log in {}", path.display()),
        Err(e) => eprintln!("warning: writing {}: {e}", path.display()),
    }
}

/// Copies every node's `server.log` next to the history (`target/chaos/<impl>-<seed>-node-<id>.log`)
/// so a failed run can be read after the cluster's directory is removed.
fn keep_server_logs(cluster: &Cluster, seed: u64) {
    let dir = process::repo_root().join("target/chaos");
    for node in cluster.nodes() {
        let path = dir.join(format!(
            "{}-{seed}-node-{}.log",
            cluster.implementation.name(),
            node.node_id
        ));
        match std::fs::create_dir_all(&dir).and_then(|()| std::fs::copy(node.log_file(), &path)) {
            Ok(_) => eprintln!("chaos: node {} log in {}", node.node_id, path.display()),
            Err(e) => eprintln!("warning: keeping {}: {e}", path.display()),
        }
    }
}

/// Injects one fault, holds it, heals it and waits until the cluster is ready again.
fn inject(
    cluster: &mut Cluster,
    history: &History,
    config: &ChaosConfig,
    step: &Step,
) -> Result<FaultEvent> {
    let bootstrap = cluster.bootstrap();
    let nodes = cluster.broker_ids();
    let count = |n: usize| u64::try_from(n).unwrap_or(1).max(1);
    let node_at = |i: u64| nodes[usize::try_from(i % count(nodes.len())).unwrap_or(0)];
    let leaders = partition_leaders(&bootstrap, TOPIC, config.partitions)?;
    let partition = i32::try_from(step.pick % u64::try_from(config.partitions)?)?;
    let led_by = |node: i32| -> BTreeSet<i32> {
        leaders
            .iter()
            .filter(|(_, l)| **l == node)
            .map(|(p, _)| *p)
            .collect()
    };
    let at = Instant::now();
    let at_ms = history.ms_at(at);
    let hold = Duration::from_millis(step.hold_ms);
    let (target, led) = match step.fault {
        Fault::KillLeader => {
            let node = *leaders
                .get(&partition)
                .with_context(|| format!("no leader of {TOPIC}-{partition}: {leaders:?}"))?;
            cluster.node_mut(node).kill9()?;
            std::thread::sleep(hold);
            cluster.node_mut(node).spawn()?;
            (
                format!("node {node} (leader of {TOPIC}-{partition})"),
                led_by(node),
            )
        }
        Fault::KillController => {
            let node = cluster.active_controller()?;
            cluster.node_mut(node).kill9()?;
            std::thread::sleep(hold);
            cluster.node_mut(node).spawn()?;
            (format!("node {node} (active controller)"), led_by(node))
        }
        Fault::PauseBroker => {
            let node = node_at(step.pick);
            cluster.node_mut(node).pause()?;
            std::thread::sleep(hold);
            cluster.node_mut(node).resume()?;
            (format!("node {node}"), led_by(node))
        }
        Fault::CutLink => {
            let a = node_at(step.pick);
            let b = node_at(step.pick + step.pick2);
            let net = cluster.network().context("the cluster has no proxies")?;
            net.cut(a, b);
            std::thread::sleep(hold);
            net.heal();
            (format!("link {a} <-> {b}"), BTreeSet::new())
        }
        Fault::IsolateNode => {
            let node = node_at(step.pick);
            let net = cluster.network().context("the cluster has no proxies")?;
            net.isolate(node, &nodes, false);
            std::thread::sleep(hold);
            net.heal();
            (format!("node {node} isolated"), led_by(node))
        }
        Fault::FullRestart => {
            cluster.kill_all()?;
            std::thread::sleep(hold);
            for id in cluster.broker_ids() {
                cluster.node_mut(id).spawn()?;
            }
            ("every node".to_string(), BTreeSet::new())
        }
        Fault::DiskFull => {
            let leader = leaders.get(&partition).copied().unwrap_or(-1);
            let node = nodes
                .iter()
                .copied()
                .filter(|n| *n != leader)
                .nth(usize::try_from(step.pick2 - 1)?)
                .unwrap_or(nodes[0]);
            let bytes = cluster.node(node).fill_disk()?;
            std::thread::sleep(hold);
            cluster.node(node).free_disk()?;
            let n = cluster.node_mut(node);
            let exited = !n.is_running()?;
            if exited {
                n.spawn()?;
            }
            (
                format!(
                    "node {node} (follower of {TOPIC}-{partition}) disk full ({} MiB filler){}",
                    bytes >> 20,
                    if exited {
                        ", it exited and was restarted"
                    } else {
                        ""
                    }
                ),
                BTreeSet::new(),
            )
        }
    };
    let healed_ms = history.now_ms();
    cluster.wait_ready(READY_TIMEOUT)?;
    // Every partition led again before the next fault.
    partition_leaders(&bootstrap, TOPIC, config.partitions)?;
    Ok(FaultEvent {
        step: step.clone(),
        target,
        at_ms,
        healed_ms,
        ready_ms: history.now_ms(),
        led,
        failover_ms: None,
    })
}

fn start_workload(
    bootstrap: &str,
    config: &ChaosConfig,
    history: &Arc<History>,
) -> Result<Workload> {
    let stop = Arc::new(AtomicBool::new(false));
    let pause = Duration::from_micros(1_000_000 / u64::from(config.rate.max(1)));
    let partitions = config.partitions;

    let debug_log = match std::env::var_os("GREGOR_CHAOS_RDKAFKA_DEBUG") {
        Some(path) => Some(Mutex::new(
            std::fs::File::create(&path).context("creating the librdkafka debug log")?,
        )),
        None => None,
    };
    let mut producer_config = ClientConfig::new();
    // debug=eos: the idempotence state changes, to count epoch bumps (see
    // ChaosOutcome::rdkafka_epoch_bumps).
    producer_config
        .set("bootstrap.servers", bootstrap)
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .set("message.timeout.ms", "10000")
        .set("debug", "eos")
        .set("log_level", "7")
        // rdkafka sets the client's log level from this, not from the property above.
        .set_log_level(rdkafka::config::RDKafkaLogLevel::Debug);
    if debug_log.is_some() {
        producer_config.set("debug", "eos,msg");
    }
    let epoch_bumps = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let producer: ThreadedProducer<Recorder> = producer_config.create_with_context(Recorder {
        history: history.clone(),
        log: debug_log,
        epoch_bumps: epoch_bumps.clone(),
    })?;
    let rdkafka = {
        let (history, stop) = (history.clone(), stop.clone());
        std::thread::spawn(move || -> Result<ThreadedProducer<Recorder>> {
            let mut i = 0i64;
            while !stop.load(Ordering::Relaxed) {
                let partition = i32::try_from(i % i64::from(partitions))?;
                let value = format!("r-{i}");
                crate::scenarios::send_recorded(&producer, &history, TOPIC, partition, &value);
                i += 1;
                std::thread::sleep(pause);
            }
            Ok(producer)
        })
    };

    let java = if config.java {
        Some(JavaProducer::start(
            bootstrap,
            history.clone(),
            stop.clone(),
            partitions,
            pause,
        )?)
    } else {
        None
    };

    let observed = Arc::new(Mutex::new(Vec::new()));
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "chaos-live-reader")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("log_level", "3")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(TOPIC, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let consumer = {
        let (observed, stop) = (observed.clone(), stop.clone());
        std::thread::spawn(move || -> Result<()> {
            while !stop.load(Ordering::Relaxed) {
                // Errors during faults (leaders moving, brokers gone) are expected.
                if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
                    lock(&observed).push(Found {
                        topic: m.topic().to_string(),
                        partition: m.partition(),
                        offset: m.offset(),
                        value: String::from_utf8_lossy(m.payload().unwrap_or_default())
                            .into_owned(),
                    });
                }
            }
            Ok(())
        })
    };
    Ok(Workload {
        stop,
        epoch_bumps,
        rdkafka: Some(rdkafka),
        java,
        consumer: Some(consumer),
        observed,
    })
}

/// Stops the producers (waiting for every outcome) and the consumer; returns what the
/// consumer saw.
fn stop_workload(w: &mut Workload, history: &History) -> Result<Vec<Found>> {
    w.stop.store(true, Ordering::Relaxed);
    if let Some(t) = w.rdkafka.take() {
        let producer = t
            .join()
            .map_err(|_| anyhow::anyhow!("the rdkafka producer thread panicked"))??;
        producer.flush(Duration::from_secs(30))?;
    }
    if let Some(mut j) = w.java.take() {
        j.finish(history)?;
    }
    if let Some(t) = w.consumer.take() {
        t.join()
            .map_err(|_| anyhow::anyhow!("the consumer thread panicked"))??;
    }
    Ok(std::mem::take(&mut *lock(&w.observed)))
}

/// The Java client's producer: `ProducerWorkload` in a JVM, fed through stdin.
struct JavaProducer {
    child: ChildGuard,
    writer: Option<std::thread::JoinHandle<Result<()>>>,
    reader: Option<std::thread::JoinHandle<Result<()>>>,
}

/// Compiles `interop/java/workload/ProducerWorkload.java` into `target/chaos-java/` (when
/// the class is missing or older than the source) and returns that directory.
///
/// # Errors
/// When the Kafka jars cannot be fetched or `javac` fails.
pub fn compile_java_workload() -> Result<PathBuf> {
    let root = process::repo_root();
    let source = root.join("interop/java/workload/ProducerWorkload.java");
    let out = root.join("target/chaos-java");
    let class = out.join("ProducerWorkload.class");
    let modified = |p: &PathBuf| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    if modified(&class).is_some() && modified(&class) >= modified(&source) {
        return Ok(out);
    }
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let mut cmd = Command::new("javac");
    cmd.arg("-d")
        .arg(&out)
        .arg("-cp")
        .arg(reference::classpath()?)
        .arg(&source);
    process::run_checked(&mut cmd).context("compiling the Java workload (is javac installed?)")?;
    Ok(out)
}

impl JavaProducer {
    fn start(
        bootstrap: &str,
        history: Arc<History>,
        stop: Arc<AtomicBool>,
        partitions: i32,
        pause: Duration,
    ) -> Result<Self> {
        let classes = compile_java_workload()?;
        let mut child = Command::new("java")
            .args([
                "-Xmx256m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-cp",
            ])
            .arg(format!("{}:{}", reference::classpath()?, classes.display()))
            .arg("ProducerWorkload")
            .args([bootstrap, TOPIC, "10000"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the Java producer")?;
        let mut stdin = child.stdin.take().context("the Java producer's stdin")?;
        let stdout = child.stdout.take().context("the Java producer's stdout")?;
        let child = ChildGuard::new("java-producer", child);
        let pending: Arc<Mutex<HashMap<String, OpId>>> = Arc::new(Mutex::new(HashMap::new()));
        let mut lines = BufReader::new(stdout).lines();
        match lines.next() {
            Some(Ok(l)) if l == "ready" => {}
            other => bail!("the Java producer did not start: {other:?}"),
        }
        let reader = {
            let (history, pending) = (history.clone(), pending.clone());
            std::thread::spawn(move || -> Result<()> {
                for line in lines {
                    let line = line.context("reading the Java producer's output")?;
                    let mut f = line.splitn(4, ' ');
                    let (kind, value) = (f.next(), f.next());
                    let Some(value) = value else {
                        if kind == Some("closed") {
                            return Ok(());
                        }
                        continue;
                    };
                    let Some(op) = lock(&pending).remove(value) else {
                        continue;
                    };
                    let outcome = match kind {
                        Some("ack") => {
                            let _partition = f.next();
                            Outcome::Ok {
                                offset: f.next().and_then(|o| o.parse().ok()),
                            }
                        }
                        _ => Outcome::Unknown(f.collect::<Vec<_>>().join(" ")),
                    };
                    history.complete(op, outcome);
                }
                bail!("the Java producer's output ended before \"closed\"")
            })
        };
        let writer = std::thread::spawn(move || -> Result<()> {
            let mut i = 0i64;
            while !stop.load(Ordering::Relaxed) {
                let partition = i32::try_from(i % i64::from(partitions))?;
                let value = format!("j-{i}");
                // Registered before it is sent, so the reader always finds it.
                let op = history.invoke(OpKind::Produce {
                    topic: TOPIC.to_string(),
                    partition,
                    value: value.clone(),
                });
                lock(&pending).insert(value.clone(), op);
                writeln!(stdin, "{partition} {value}").context("writing to the Java producer")?;
                stdin.flush()?;
                i += 1;
                std::thread::sleep(pause);
            }
            // Closing stdin: the producer flushes, prints every outcome and "closed".
            drop(stdin);
            Ok(())
        });
        Ok(Self {
            child,
            writer: Some(writer),
            reader: Some(reader),
        })
    }

    fn finish(&mut self, _history: &History) -> Result<()> {
        if let Some(w) = self.writer.take() {
            w.join()
                .map_err(|_| anyhow::anyhow!("the Java writer thread panicked"))??;
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        if let Some(r) = self.reader.take() {
            while !r.is_finished() {
                if Instant::now() > deadline {
                    self.child.stop().ok();
                    bail!("the Java producer did not finish within 60 s of its stdin closing");
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            r.join()
                .map_err(|_| anyhow::anyhow!("the Java reader thread panicked"))??;
        }
        self.child.stop()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(records: &[(i64, &str)], epoch_bumps: u64) -> ChaosOutcome {
        let h = History::new();
        for (i, v) in ["r-1", "j-1"].iter().enumerate() {
            h.record(
                OpKind::Produce {
                    topic: TOPIC.into(),
                    partition: 0,
                    value: (*v).into(),
                },
                0,
                5,
                Outcome::Ok {
                    offset: Some(i64::try_from(i).unwrap()),
                },
            );
        }
        // A librdkafka record whose outcome the client never learnt (timed out).
        h.record(
            OpKind::Produce {
                topic: TOPIC.into(),
                partition: 0,
                value: "r-2".into(),
            },
            0,
            5,
            Outcome::Unknown("timed out".into()),
        );
        let mut state = FinalState::default();
        state.records.insert(
            (TOPIC.into(), 0),
            records
                .iter()
                .map(|(o, v)| (*o, (*v).to_string()))
                .collect(),
        );
        ChaosOutcome {
            implementation: "test",
            seed: 0,
            events: Vec::new(),
            report: h.check(&state),
            acknowledged_rdkafka: 1,
            acknowledged_java: 1,
            observed_reads: 0,
            unavailable_seconds: 0,
            skipped: Vec::new(),
            rdkafka_epoch_bumps: epoch_bumps,
            seconds: 0,
        }
    }

    #[test]
    fn librdkafka_duplicates_after_an_epoch_bump_are_reported_apart() {
        let clean = outcome(&[(0, "r-1"), (1, "j-1")], 0);
        assert!(clean.is_valid(), "{clean}");
        // A librdkafka record twice: a failure without an epoch bump, excused after one.
        let dup = [(0, "r-1"), (1, "j-1"), (2, "r-1")];
        assert!(!outcome(&dup, 0).is_valid());
        let excused = outcome(&dup, 1);
        assert!(excused.is_valid(), "{excused}");
        assert_eq!(excused.report.records_misplaced.len(), 1, "{excused}");
        // A duplicate acknowledged at an offset that holds neither copy is not excused.
        let elsewhere = outcome(&[(0, "r-2"), (1, "j-1"), (2, "r-1"), (3, "r-1")], 1);
        assert!(elsewhere.report.ack_conflicts.is_empty(), "{elsewhere}");
        assert_eq!(elsewhere.report.acked_elsewhere.len(), 1, "{elsewhere}");
        assert!(!elsewhere.is_valid(), "{elsewhere}");
        assert_eq!(excused.client_duplicates(), BTreeSet::from(["r-1"]));
        // The Java client's duplicates never are.
        assert!(!outcome(&[(0, "r-1"), (1, "j-1"), (2, "j-1")], 1).is_valid());
        // Nor a lost record.
        assert!(!outcome(&[(0, "r-1"), (1, "r-1")], 1).is_valid());
        // Nor acknowledgements contradicted by the log: r-1 acknowledged at 0 and j-1 at 1,
        // each offset holding the other.
        let swapped = outcome(&[(0, "j-1"), (1, "r-1")], 1);
        assert_eq!(swapped.report.ack_conflicts.len(), 2, "{swapped}");
        assert!(!swapped.is_valid());
    }

    #[test]
    fn the_schedule_is_a_function_of_the_seed() {
        let a = schedule(7, &Fault::ALL, 50);
        assert_eq!(a, schedule(7, &Fault::ALL, 50));
        assert_ne!(a, schedule(8, &Fault::ALL, 50));
        let kinds: BTreeSet<Fault> = a.iter().map(|s| s.fault).collect();
        assert!(kinds.len() >= 5, "{kinds:?}");
        for s in &a {
            let (lo, hi) = s.fault.hold_ms();
            assert!((lo..=hi).contains(&s.hold_ms));
            assert!((1..=2).contains(&s.pick2));
        }
        assert_eq!(
            Fault::parse_list("cut-link, full-restart").unwrap(),
            [Fault::CutLink, Fault::FullRestart]
        );
        assert!(Fault::parse_list("cut-links").is_err());
        let only = schedule(7, &[Fault::CutLink], 10);
        assert!(only.iter().all(|s| s.fault == Fault::CutLink));
    }
}
