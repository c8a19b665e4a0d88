//! Mixed clusters (issue 11): one partition replicated across gregor and Apache Kafka 4.4.0
//! brokers of one KRaft cluster, checked with an idempotent acks=all producer and the
//! [`History`] checker. The same scenario runs on a gregor quorum with a Kafka broker and on a
//! Kafka quorum with a gregor broker (`crates/cli/tests/cluster_mixed.rs`).
//!
//! [`replicate_across_implementations`]: a topic with replication factor 3 and
//! `min.insync.replicas=2` placed by hand (`kafka-topics --replica-assignment`) on a broker of
//! one implementation (the first leader), the broker of the other one and a third broker;
//! records flow while
//! 1. the other implementation's broker follows the first leader and is in the ISR;
//! 2. leadership moves to it (`kafka-reassign-partitions` puts it first, then
//!    `kafka-leader-election --election-type PREFERRED`), and the first leader follows it;
//! 3. it is killed (-9): a follower of the first implementation takes over with every
//!    acknowledged record; it comes back and rejoins the ISR;
//!
//! then every acknowledged record must be read back exactly once, in order, with contiguous
//! offsets, and `kafka-topics --describe` shows the three replicas in the ISR.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{ApiKey, MetadataRequest, MetadataResponse, TopicName};
use rdkafka::config::ClientConfig;
use rdkafka::producer::{Producer, ThreadedProducer};

use crate::cluster::Cluster;
use crate::history::{FinalState, History, OpKind};
use crate::reference::tool_output;
use crate::scenarios::{read_topic, send_recorded, Recorder};
use crate::wire::{sb, KafkaConn};

/// The topic of the scenario.
pub const TOPIC: &str = "mixed";
const LEADER_ELECTION: &str = "org.apache.kafka.tools.LeaderElectionCommand";
const REASSIGN: &str = "org.apache.kafka.tools.reassign.ReassignPartitionsCommand";
/// Records acknowledged in each phase before the next one starts.
const PER_PHASE: usize = 200;
/// How long a phase may wait for leadership, the ISR or acknowledgements.
const PHASE_TIMEOUT: Duration = Duration::from_secs(60);

/// Leader, replicas and ISR of one partition, from a Metadata response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionState {
    /// The leader's node id (-1: none).
    pub leader: i32,
    /// The replicas, in assignment order.
    pub replicas: Vec<i32>,
    /// The in-sync replicas.
    pub isr: Vec<i32>,
}

impl PartitionState {
    /// The ISR as a set.
    pub fn isr_set(&self) -> BTreeSet<i32> {
        self.isr.iter().copied().collect()
    }
}

/// What [`replicate_across_implementations`] measured.
#[derive(Debug, Clone)]
pub struct MixedReplication {
    /// Records acknowledged over the whole run.
    pub acknowledged: usize,
    /// From the moment every replica names the new leader after the preferred election to
    /// the first acknowledgement of a record sent after it, ms.
    pub election_to_first_ack_ms: u64,
    /// From the kill -9 of the other implementation's leader to the first acknowledgement of
    /// a record sent after it, ms.
    pub kill_to_first_ack_ms: u64,
    /// The broker that took over after the kill.
    pub leader_after_kill: i32,
    /// `kafka-topics --describe` at the end.
    pub describe: String,
    /// The history checker's report.
    pub report: String,
}

/// The partition `partition` of `topic` as the broker at `bootstrap` sees it; `None` when
/// the broker cannot be reached or does not know the partition.
pub fn partition_state(bootstrap: &str, topic: &str, partition: i32) -> Option<PartitionState> {
    let addr: SocketAddr = bootstrap.parse().ok()?;
    let mut conn = KafkaConn::connect_timeout(addr, Duration::from_secs(2), "gregor-mixed").ok()?;
    let m: MetadataResponse = conn
        .call(
            ApiKey::Metadata,
            12,
            &MetadataRequest::default().with_topics(Some(vec![
                MetadataRequestTopic::default().with_name(Some(TopicName(sb(topic))))
            ])),
        )
        .ok()?;
    let t = m.topics.first().filter(|t| t.error_code == 0)?;
    let p = t
        .partitions
        .iter()
        .find(|p| p.partition_index == partition)?;
    Some(PartitionState {
        leader: p.leader_id.0,
        replicas: p.replica_nodes.iter().map(|b| b.0).collect(),
        isr: p.isr_nodes.iter().map(|b| b.0).collect(),
    })
}

/// Waits until `accept` takes partition 0 of [`TOPIC`] as every broker in `brokers` sees it
/// (each answering the same), or [`PHASE_TIMEOUT`].
fn wait_partition(
    cluster: &mut Cluster,
    brokers: &[i32],
    what: &str,
    accept: impl Fn(&PartitionState) -> bool,
) -> Result<PartitionState> {
    let deadline = Instant::now() + PHASE_TIMEOUT;
    loop {
        let seen: Vec<Option<PartitionState>> = brokers
            .iter()
            .map(|id| {
                let b = cluster.node(*id).bootstrap()?;
                partition_state(&b, TOPIC, 0)
            })
            .collect();
        if let Some(Some(first)) = seen.first() {
            if accept(first) && seen.iter().all(|s| s.as_ref() == Some(first)) {
                return Ok(first.clone());
            }
        }
        if Instant::now() > deadline {
            bail!("{what}: not within {PHASE_TIMEOUT:?}; brokers {brokers:?} see {seen:?}");
        }
        for id in brokers {
            cluster.node_mut(*id).check_alive()?;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until `n` records invoked after `since_ms` are acknowledged; returns the completion
/// time of the first one (history ms).
fn wait_acks_after(history: &History, since_ms: u64, n: usize, what: &str) -> Result<u64> {
    let deadline = Instant::now() + PHASE_TIMEOUT;
    loop {
        let acked: Vec<u64> = history
            .ops()
            .into_iter()
            .filter(|op| op.invoke_ms >= since_ms && matches!(op.kind, OpKind::Produce { .. }))
            .filter(|op| {
                matches!(
                    op.outcome,
                    Some(crate::history::Outcome::Ok { offset: Some(_) })
                )
            })
            .filter_map(|op| op.complete_ms)
            .collect();
        if acked.len() >= n {
            return Ok(acked.into_iter().min().unwrap_or(since_ms));
        }
        ensure!(
            Instant::now() < deadline,
            "{what}: {} of {n} records sent after {since_ms} ms acknowledged within {PHASE_TIMEOUT:?}",
            acked.len()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The scenario of the module docs on a started `cluster`: `first` leads at first, `other`
/// (a broker of the other implementation) follows, then leads, then is killed; `third` is a
/// broker of `first`'s implementation. Admin tools go through `first`'s broker listener.
///
/// # Errors
/// When a phase does not complete, a tool fails, or the checker finds a problem; with the
/// nodes' logs.
pub fn replicate_across_implementations(
    cluster: &mut Cluster,
    first: i32,
    other: i32,
    third: i32,
) -> Result<MixedReplication> {
    let result = run(cluster, first, other, third);
    result.with_context(|| format!("cluster logs:{}", cluster.logs(40)))
}

fn run(cluster: &mut Cluster, first: i32, other: i32, third: i32) -> Result<MixedReplication> {
    let admin = cluster
        .node(first)
        .bootstrap()
        .context("the first leader must be a broker")?;
    let replicas = [first, other, third];
    let everyone: BTreeSet<i32> = replicas.iter().copied().collect();
    let out = tool_output(
        "kafka-topics",
        &[
            "--bootstrap-server",
            &admin,
            "--create",
            "--topic",
            TOPIC,
            "--replica-assignment",
            &format!("{first}:{other}:{third}"),
            "--config",
            "min.insync.replicas=2",
        ],
    )?;
    ensure!(
        out.contains(&format!("Created topic {TOPIC}")),
        "kafka-topics --create: {out}"
    );
    wait_partition(
        cluster,
        &replicas,
        "the first leader with every replica in the ISR",
        |p| p.leader == first && p.isr_set() == everyone,
    )?;

    let history = Arc::new(History::new());
    let producer: ThreadedProducer<Recorder> = ClientConfig::new()
        .set("bootstrap.servers", cluster.bootstrap())
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .set("message.timeout.ms", "30000")
        .set("log_level", "3")
        .create_with_context(Recorder::new(history.clone()))?;
    let stop = Arc::new(AtomicBool::new(false));
    let sender = {
        let (history, stop) = (history.clone(), stop.clone());
        std::thread::spawn(move || -> ThreadedProducer<Recorder> {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                send_recorded(&producer, &history, TOPIC, 0, &format!("v-{i}"));
                i += 1;
                std::thread::sleep(Duration::from_millis(4));
            }
            producer
        })
    };
    let phases = (|| -> Result<(u64, u64, i32)> {
        // 1. The other implementation follows the first leader.
        wait_acks_after(&history, 0, PER_PHASE, "records led by the first leader")?;
        let p = partition_state(&admin, TOPIC, 0).context("the partition")?;
        ensure!(
            p.leader == first && p.isr_set() == everyone,
            "while {first} leads, every replica is in the ISR: {p:?}"
        );

        // 2. The other implementation leads: it first in the assignment, a preferred election.
        let dir = tempfile::tempdir()?;
        let plan = dir.path().join("reassignment.json");
        std::fs::write(
            &plan,
            format!(
                r#"{{"version":1,"partitions":[{{"topic":"{TOPIC}","partition":0,"replicas":[{other},{first},{third}]}}]}}"#
            ),
        )?;
        let out = tool_output(
            REASSIGN,
            &[
                "--bootstrap-server",
                &admin,
                "--reassignment-json-file",
                &plan.display().to_string(),
                "--execute",
            ],
        )?;
        ensure!(
            out.contains(&format!(
                "Successfully started partition reassignment for {TOPIC}-0"
            )),
            "kafka-reassign-partitions --execute: {out}"
        );
        wait_partition(cluster, &replicas, "the reordered assignment", |p| {
            p.replicas == [other, first, third]
        })?;
        let out = tool_output(
            LEADER_ELECTION,
            &[
                "--bootstrap-server",
                &admin,
                "--election-type",
                "PREFERRED",
                "--topic",
                TOPIC,
                "--partition",
                "0",
            ],
        )?;
        ensure!(
            out.contains(&format!(
                "Successfully completed leader election (PREFERRED) for partitions {TOPIC}-0"
            )),
            "kafka-leader-election: {out}"
        );
        wait_partition(cluster, &replicas, "the other implementation leads", |p| {
            p.leader == other
        })?;
        // From here on every replica names the new leader.
        let elected_at = history.now_ms();
        let first_ack = wait_acks_after(
            &history,
            elected_at,
            PER_PHASE,
            "records after the preferred election",
        )?;
        let p = wait_partition(
            cluster,
            &replicas,
            "every replica in the ISR under the other implementation's leader",
            |p| p.leader == other && p.isr_set() == everyone,
        )?;
        eprintln!("under the other implementation's leader: {p:?}");

        // 3. The other implementation's leader dies; the first implementation takes over.
        let killed_at = history.now_ms();
        cluster.node_mut(other).kill9()?;
        let alive = [first, third];
        let p = wait_partition(cluster, &alive, "a new leader after the kill", |p| {
            p.leader == first || p.leader == third
        })?;
        let first_after_kill = wait_acks_after(
            &history,
            killed_at,
            PER_PHASE,
            "records after killing the leader",
        )?;
        cluster.restart_node(other)?;
        wait_partition(
            cluster,
            &replicas,
            "the killed replica back in the ISR",
            |p| p.isr_set() == everyone,
        )?;
        wait_acks_after(
            &history,
            history.now_ms(),
            PER_PHASE / 3,
            "records after the restart",
        )?;
        Ok((
            first_ack.saturating_sub(elected_at),
            first_after_kill.saturating_sub(killed_at),
            p.leader,
        ))
    })();
    stop.store(true, Ordering::Relaxed);
    let producer = sender
        .join()
        .map_err(|_| anyhow::anyhow!("the producer thread panicked"))?;
    producer.flush(Duration::from_secs(30))?;
    drop(producer);
    let (election_to_first_ack_ms, kill_to_first_ack_ms, leader_after_kill) = phases?;

    let state = FinalState {
        topics: [TOPIC.to_string()].into(),
        records: read_topic(&cluster.bootstrap(), TOPIC, 1)?,
    };
    let report = history.check(&state);
    let describe = tool_output(
        "kafka-topics",
        &["--bootstrap-server", &admin, "--describe", "--topic", TOPIC],
    )?;
    eprintln!(
        "mixed replication: new leader seen by all to first ack {election_to_first_ack_ms} ms; \
         kill -9 of {other} to first ack {kill_to_first_ack_ms} ms (new leader \
         {leader_after_kill})\n{describe}\n{report}"
    );
    eprintln!("{}", error_lines(cluster, 8));
    ensure!(report.is_valid(), "history check failed:\n{report}");
    let isr_line = describe
        .lines()
        .find(|l| l.contains("Partition: 0"))
        .context("no partition line in kafka-topics --describe")?;
    let isr: BTreeSet<i32> = isr_line
        .split("Isr:")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .map(|s| s.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_default();
    ensure!(
        isr == everyone,
        "kafka-topics --describe shows ISR {isr:?}, want {everyone:?}: {isr_line}"
    );
    Ok(MixedReplication {
        acknowledged: report.records_acknowledged,
        election_to_first_ack_ms,
        kill_to_first_ack_ms,
        leader_after_kill,
        describe,
        report: report.to_string(),
    })
}

/// Up to `per_node` distinct ERROR lines of each node's log (timestamps cut), for the report:
/// what either implementation complained about during the run.
pub fn error_lines(cluster: &Cluster, per_node: usize) -> String {
    let mut out = String::new();
    for n in cluster.nodes() {
        let text = std::fs::read_to_string(n.log_file()).unwrap_or_default();
        let mut seen = BTreeSet::new();
        for line in text.lines().filter(|l| l.contains("ERROR")) {
            // Kafka: "[date time] ERROR msg"; gregor: "time ERROR target: msg".
            let msg = line.split_once("ERROR").map_or(line, |(_, m)| m).trim();
            let key: String = msg.chars().take(120).collect();
            if seen.insert(key) && seen.len() <= per_node {
                out.push_str(&format!(
                    "node {} ({}): ERROR {msg}\n",
                    n.node_id,
                    n.implementation().name()
                ));
            }
        }
    }
    if out.is_empty() {
        out.push_str("no ERROR lines in the nodes' logs\n");
    }
    out
}

/// Properties that make a metadata log of a few hundred topics take several snapshots and
/// delete the segments below them (Kafka's names, read by both implementations).
pub const SMALL_METADATA_LOG: &[(&str, &str)] = &[
    ("internal.metadata.log.segment.bytes", "16384"),
    ("metadata.log.max.record.bytes.between.snapshots", "8192"),
    ("metadata.max.retention.bytes", "1"),
];

/// What [`late_broker_catches_up_from_a_snapshot`] measured.
#[derive(Debug, Clone)]
pub struct SnapshotCatchUp {
    /// The first offset still in the log of the voter that led when the late broker started.
    pub leader_log_start: u64,
    /// The snapshots (`<offset>-<epoch>.checkpoint`) in the late broker's metadata log dir.
    pub late_snapshots: Vec<String>,
    /// From the late broker's start to its Metadata listing every topic, ms.
    pub catch_up_ms: u64,
}

/// The first offset of `__cluster_metadata-0` in `data_dir` (the base offset of its first
/// segment), `None` when there is no segment.
fn metadata_log_start(data_dir: &std::path::Path) -> Option<u64> {
    std::fs::read_dir(data_dir.join("__cluster_metadata-0"))
        .ok()?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|n| n.strip_suffix(".log")?.parse::<u64>().ok())
        .min()
}

/// The snapshot files in `data_dir`'s `__cluster_metadata-0`.
fn snapshots(data_dir: &std::path::Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(data_dir.join("__cluster_metadata-0"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.ends_with(".checkpoint"))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// A cluster prepared and formatted (with [`SMALL_METADATA_LOG`]) whose broker-only node
/// `late` is not started: the other nodes start, `topics` topics are created until the
/// active controller's log no longer starts at 0 (its start is behind a snapshot), then
/// `late` starts and must catch up through FetchSnapshot: it serves every topic in Metadata
/// and holds a snapshot of its own.
///
/// # Errors
/// When a step fails or the log never moves past offset 0; with the nodes' logs.
pub fn late_broker_catches_up_from_a_snapshot(
    cluster: &mut Cluster,
    late: i32,
    topics: usize,
) -> Result<SnapshotCatchUp> {
    let result = catch_up(cluster, late, topics);
    result.with_context(|| format!("cluster logs:{}", cluster.logs(40)))
}

fn catch_up(cluster: &mut Cluster, late: i32, topics: usize) -> Result<SnapshotCatchUp> {
    use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
    use rdkafka::consumer::{BaseConsumer, Consumer};

    cluster.format()?;
    let ids: Vec<i32> = cluster.nodes().iter().map(|n| n.node_id).collect();
    for id in ids.iter().filter(|id| **id != late) {
        cluster.node_mut(*id).spawn()?;
    }
    cluster.wait_ready(crate::cluster::READY_TIMEOUT)?;
    let bootstrap = cluster.bootstrap_of_running()?;
    let admin = crate::scenarios::admin(&bootstrap)?;
    let rt = crate::clients::runtime()?;
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let names: Vec<String> = (0..topics).map(|i| format!("snap-{i:04}")).collect();
    for chunk in names.chunks(50) {
        let new: Vec<NewTopic<'_>> = chunk
            .iter()
            .map(|n| NewTopic::new(n, 1, TopicReplication::Fixed(1)))
            .collect();
        for r in rt.block_on(admin.create_topics(&new, &opts))? {
            r.map_err(|(t, e)| anyhow::anyhow!("creating {t}: {e}"))?;
        }
    }
    // Snapshots and log cleaning run in the background: wait for the leader's log to start
    // past 0.
    let deadline = Instant::now() + PHASE_TIMEOUT;
    let (leader, leader_log_start) = loop {
        let leader = cluster.active_controller()?;
        let start = metadata_log_start(&cluster.node(leader).data_dir()).unwrap_or(0);
        if start > 0 {
            break (leader, start);
        }
        ensure!(
            Instant::now() < deadline,
            "the metadata log of controller {leader} still starts at 0 after {topics} topics: {:?}",
            snapshots(&cluster.node(leader).data_dir())
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!(
        "controller {leader}: log starts at {leader_log_start}, snapshots {:?}",
        snapshots(&cluster.node(leader).data_dir())
    );

    let started = Instant::now();
    cluster.node_mut(late).spawn()?;
    cluster.wait_ready(crate::cluster::READY_TIMEOUT)?;
    let late_bootstrap = cluster.node(late).bootstrap().context("a broker")?;
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &late_bootstrap)
        .set("log_level", "3")
        .create()?;
    let deadline = Instant::now() + PHASE_TIMEOUT;
    loop {
        let m = consumer.fetch_metadata(None, Duration::from_secs(5))?;
        let listed = m
            .topics()
            .iter()
            .filter(|t| t.name().starts_with("snap-") && t.error().is_none())
            .count();
        if listed == topics {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "broker {late} lists {listed} of {topics} topics"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let catch_up_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let late_snapshots = snapshots(&cluster.node(late).data_dir());
    ensure!(
        late_snapshots
            .iter()
            .any(|s| s.split('-').next().and_then(|o| o.parse::<u64>().ok())
                >= Some(leader_log_start)),
        "broker {late} holds no snapshot at or past the leader's log start {leader_log_start}: \
         {late_snapshots:?} (it cannot have fetched the log from 0)"
    );
    eprintln!(
        "broker {late} ({}) caught up from a snapshot in {catch_up_ms} ms: {late_snapshots:?}\n{}",
        cluster.node(late).implementation().name(),
        error_lines(cluster, 8)
    );
    Ok(SnapshotCatchUp {
        leader_log_start,
        late_snapshots,
        catch_up_ms,
    })
}
