//! Metadata snapshots end to end (KIP-630) on `gregor serve` processes with small
//! `internal.metadata.log.segment.bytes`, `metadata.log.max.record.bytes.between.snapshots`
//! and `metadata.max.retention.bytes`:
//! - one node creates many topics: snapshots of its image appear in `__cluster_metadata-0`,
//!   the segments below the latest are deleted, Apache Kafka 4.4.0's
//!   `kafka-dump-log --cluster-metadata-decoder` decodes the snapshot (skipped without the
//!   jars), and a restart loads the image from the snapshot and serves every topic;
//! - three combined nodes: one is stopped, the others create topics past a snapshot and
//!   delete the log before it, and the stopped one, restarted, catches up through
//!   FetchSnapshot (its log shows the install) and serves every topic in Metadata.
//!
//! The time from a restart to serving every topic is printed.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gregor_tests::process::{free_ports, tail, wait_for_broker, ChildGuard};
use gregor_tests::reference;
use gregor_tests::wire::KafkaConn;
use rdkafka::consumer::{BaseConsumer, Consumer};

const BIN: &str = env!("CARGO_BIN_EXE_gregor");
const CLUSTER_ID: &str = "c25hcHNob3RzLXRlc3QtMQ";

/// Small enough that a few hundred topics make several snapshots and segments.
const SMALL_LOG: &str = "internal.metadata.log.segment.bytes=16384\n\
    metadata.log.max.record.bytes.between.snapshots=8192\n\
    metadata.max.retention.bytes=1\n";

struct Node {
    id: i32,
    client_port: u16,
    props: PathBuf,
    data: PathBuf,
    log: PathBuf,
    guard: Option<ChildGuard>,
}

impl Node {
    fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    fn partition_dir(&self) -> PathBuf {
        self.data.join("__cluster_metadata-0")
    }

    fn start(&mut self) {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log file");
        let child = Command::new(BIN)
            .arg("serve")
            .arg("--config")
            .arg(&self.props)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log file"))
            .stderr(file)
            .spawn()
            .expect("starting gregor serve");
        self.guard = Some(ChildGuard::new(format!("gregor-{}", self.id), child));
    }

    fn wait_serving(&mut self) {
        let addr: SocketAddr = self.bootstrap().parse().expect("addr");
        let log = self.log.clone();
        let guard = self.guard.as_mut().expect("running");
        wait_for_broker(addr, 90_000, || guard.check_alive())
            .unwrap_or_else(|e| panic!("node did not come up: {e:#}\n{}", tail(&log, 40)));
    }

    fn stop(&mut self) {
        if let Some(mut g) = self.guard.take() {
            g.stop().expect("stopping gregor");
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// `n` combined nodes (all voters), formatted, not started; `extra` goes into every file.
fn prepare(root: &Path, n: usize, extra: &str) -> Vec<Node> {
    prepare_quorum(root, n, extra, false)
}

/// As [`prepare`]; with `dynamic`, one node of a dynamic quorum (KIP-853):
/// `controller.quorum.bootstrap.servers` and `storage format --standalone`, so its voters live
/// only in the metadata log (the bootstrap snapshot's KRaftVoters record).
fn prepare_quorum(root: &Path, n: usize, extra: &str, dynamic: bool) -> Vec<Node> {
    assert!(!dynamic || n == 1, "--standalone formats one voter");
    let ports = free_ports(3 * n).expect("free ports");
    let voters: Vec<String> = (0..n)
        .map(|i| format!("{}@127.0.0.1:{}", i + 1, ports[n + i]))
        .collect();
    let quorum = if dynamic {
        format!("controller.quorum.bootstrap.servers=127.0.0.1:{}", ports[n])
    } else {
        format!("controller.quorum.voters={}", voters.join(","))
    };
    (0..n)
        .map(|i| {
            let id = i as i32 + 1;
            let props = root.join(format!("server-{id}.properties"));
            let data = root.join(format!("data-{id}"));
            std::fs::write(
                &props,
                format!(
                    "node.id={id}\nprocess.roles=broker,controller\n\
                     listeners=PLAINTEXT://127.0.0.1:{},CONTROLLER://127.0.0.1:{}\n\
                     controller.listener.names=CONTROLLER\n{quorum}\n\
                     log.dirs={}\nadmin.listener=127.0.0.1:{}\n{extra}",
                    ports[i],
                    ports[n + i],
                    data.display(),
                    ports[2 * n + i],
                ),
            )
            .expect("writing properties");
            let mut format = Command::new(BIN);
            format.args(["storage", "format", "-t", CLUSTER_ID]);
            if dynamic {
                format.arg("--standalone");
            }
            let out = format
                .arg("-c")
                .arg(&props)
                .output()
                .expect("gregor storage format");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            Node {
                id,
                client_port: ports[i],
                props,
                data,
                log: root.join(format!("gregor-{id}.log")),
                guard: None,
            }
        })
        .collect()
}

/// Creates `names` (one partition, replication factor 1) with CreateTopics v7 sent to each of
/// `bootstraps` in turn until one takes them: only the active controller's node commits (the
/// others answer NOT_CONTROLLER; gregor does not forward yet).
fn create_topics(bootstraps: &[String], names: &[String]) {
    use kafka_protocol::messages::create_topics_request::CreatableTopic;
    use kafka_protocol::messages::{ApiKey, CreateTopicsRequest, TopicName};
    use kafka_protocol::protocol::StrBytes;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut errors = Vec::new();
    for chunk in names.chunks(50) {
        'chunk: loop {
            for b in bootstraps {
                let req = CreateTopicsRequest::default()
                    .with_timeout_ms(20_000)
                    .with_topics(
                        chunk
                            .iter()
                            .map(|n| {
                                CreatableTopic::default()
                                    .with_name(TopicName(StrBytes::from_string(n.clone())))
                                    .with_num_partitions(1)
                                    .with_replication_factor(1)
                            })
                            .collect(),
                    );
                let answer =
                    KafkaConn::connect(b.as_str(), "kraft-snapshots-test").and_then(|mut c| {
                        c.call::<_, kafka_protocol::messages::CreateTopicsResponse>(
                            ApiKey::CreateTopics,
                            7,
                            &req,
                        )
                    });
                match answer {
                    // NONE or TOPIC_ALREADY_EXISTS (a retry of a chunk that committed).
                    Ok(r) if r.topics.iter().all(|t| matches!(t.error_code, 0 | 36)) => {
                        break 'chunk
                    }
                    Ok(r) => errors.push(format!(
                        "{b}: {:?}",
                        r.topics
                            .iter()
                            .map(|t| t.error_code)
                            .collect::<BTreeSet<_>>()
                    )),
                    Err(e) => errors.push(format!("{b}: {e:#}")),
                }
            }
            assert!(
                Instant::now() < deadline,
                "creating topics: {:?}",
                &errors[errors.len().saturating_sub(6)..]
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// The topic names `bootstrap` lists in Metadata.
fn listed_topics(bootstrap: &str) -> BTreeSet<String> {
    let c: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("client");
    c.fetch_metadata(None, Duration::from_secs(10))
        .map(|m| m.topics().iter().map(|t| t.name().to_string()).collect())
        .unwrap_or_default()
}

/// Waits until `bootstrap` lists every topic of `names`; the time it took.
fn wait_for_topics(bootstrap: &str, names: &[String], since: Instant) -> Duration {
    let want: BTreeSet<String> = names.iter().cloned().collect();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let got = listed_topics(bootstrap);
        if want.is_subset(&got) {
            return since.elapsed();
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} topics listed by {bootstrap}",
            want.intersection(&got).count(),
            want.len()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Snapshot files and segment files of a `__cluster_metadata-0` directory, names sorted.
fn files(dir: &Path) -> (Vec<PathBuf>, Vec<String>) {
    let mut snapshots = Vec::new();
    let mut segments = Vec::new();
    for e in std::fs::read_dir(dir).expect("reading __cluster_metadata-0") {
        let p = e.expect("entry").path();
        let name = p
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        if name.ends_with(".checkpoint") {
            snapshots.push(p);
        } else if name.ends_with(".log") {
            segments.push(name);
        }
    }
    snapshots.sort();
    segments.sort();
    (snapshots, segments)
}

/// Waits until `dir` has a snapshot and its first segment no longer starts at offset 0;
/// returns the latest snapshot.
fn wait_for_snapshot_and_cleaning(dir: &Path, log: &Path) -> PathBuf {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (snapshots, segments) = files(dir);
        let cleaned = segments
            .first()
            .is_some_and(|s| s != "00000000000000000000.log");
        if let (Some(latest), true) = (snapshots.last(), cleaned) {
            return latest.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no snapshot with the log cleaned before it: snapshots {snapshots:?}, segments {segments:?}\n{}",
            tail(log, 30)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i:04}")).collect()
}

#[test]
fn one_node_writes_snapshots_cleans_its_log_and_restarts_from_a_snapshot() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut nodes = prepare(root.path(), 1, SMALL_LOG);
    let node = &mut nodes[0];
    node.start();
    node.wait_serving();
    let topics = names("snap", 300);
    create_topics(&[node.bootstrap()], &topics);
    let snapshot = wait_for_snapshot_and_cleaning(&node.partition_dir(), &node.log);
    let (snapshots, segments) = files(&node.partition_dir());
    eprintln!(
        "snapshots {:?}, segments {segments:?}",
        snapshots
            .iter()
            .map(|p| p
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned())
            .collect::<Vec<_>>()
    );
    assert!(node.log_text().contains("wrote a metadata snapshot"));
    if reference::jars_or_skip() {
        let dump = reference::dump_cluster_metadata(&snapshot).expect("kafka-dump-log");
        assert!(
            dump.contains("snap-0000"),
            "the first topic is in the snapshot:\n{dump}"
        );
    }
    node.stop();
    let restarted = Instant::now();
    node.start();
    node.wait_serving();
    let took = wait_for_topics(&node.bootstrap(), &topics, restarted);
    eprintln!(
        "restart of one node from a snapshot ({} topics): serving every topic {} ms after the start",
        topics.len(),
        took.as_millis()
    );
    let text = node.log_text();
    let restart_log = &text[text
        .rfind("loading the metadata snapshot")
        .map_or(0, |i| text[..i].rfind('\n').map_or(0, |j| j + 1))..];
    for line in restart_log.lines().filter(|l| {
        l.contains("loading the metadata snapshot") || l.contains("metadata loaded from")
    }) {
        eprintln!("{line}");
    }
    // A restarted combined node waits out its previous incarnation's session
    // (`broker.session.timeout.ms`, 9 s) before its broker registers and serves.
    eprintln!(
        "waited for the previous incarnation's session: {}",
        node.log_text()
            .contains("the previous incarnation of this broker is still registered")
    );
    assert!(
        node.log_text().contains("loading the metadata snapshot"),
        "the restart loads the snapshot:\n{}",
        tail(&node.log, 40)
    );
    node.stop();
}

#[test]
fn a_stopped_voter_catches_up_through_fetch_snapshot() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut nodes = prepare(root.path(), 3, SMALL_LOG);
    for n in &mut nodes {
        n.start();
    }
    for n in &mut nodes {
        n.wait_serving();
    }
    let all_bootstrap: Vec<String> = nodes.iter().map(Node::bootstrap).collect();
    let first = names("before", 20);
    create_topics(&all_bootstrap, &first);
    // A voter that has not led: the others keep a majority and go on committing.
    let stopped = nodes
        .iter()
        .rposition(|n| !n.log_text().contains("elected leader"))
        .expect("a node that does not lead");
    nodes[stopped].stop();
    let stopped_end = files(&nodes[stopped].partition_dir()).1;
    eprintln!(
        "stopped node {} with segments {stopped_end:?}",
        nodes[stopped].id
    );
    let running: Vec<String> = nodes
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != stopped)
        .map(|(_, n)| n.bootstrap())
        .collect();
    let more = names("after", 300);
    create_topics(&running, &more);
    for (i, n) in nodes.iter().enumerate() {
        if i != stopped {
            wait_for_snapshot_and_cleaning(&n.partition_dir(), &n.log);
        }
    }
    let restarted = Instant::now();
    nodes[stopped].start();
    nodes[stopped].wait_serving();
    let every: Vec<String> = first.iter().chain(&more).cloned().collect();
    let took = wait_for_topics(&nodes[stopped].bootstrap(), &every, restarted);
    eprintln!(
        "catch-up of a stopped voter through FetchSnapshot ({} topics): serving every topic {} ms after the start",
        every.len(),
        took.as_millis()
    );
    let text = nodes[stopped].log_text();
    assert!(
        text.contains("installed a metadata snapshot fetched from the leader"),
        "{}",
        tail(&nodes[stopped].log, 60)
    );
    for n in &mut nodes {
        n.stop();
    }
}

/// A dynamic quorum (KIP-853) knows its voters only from the metadata log: the bootstrap
/// snapshot's KRaftVoters record. Once a newer snapshot has replaced it and retention has
/// deleted it, the newer snapshot must carry the voters (Kafka's `RecordsSnapshotWriter` writes
/// KRaftVersion and KRaftVoters after the SnapshotHeader), or the node cannot restart.
#[test]
fn a_dynamic_quorum_keeps_its_voters_in_every_snapshot() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut nodes = prepare_quorum(root.path(), 1, SMALL_LOG, true);
    let node = &mut nodes[0];
    node.start();
    node.wait_serving();
    let topics = names("dyn", 300);
    create_topics(&[node.bootstrap()], &topics);
    let snapshot = wait_for_snapshot_and_cleaning(&node.partition_dir(), &node.log);
    // Wait until retention has removed the bootstrap snapshot: only newer ones hold voters.
    let deadline = Instant::now() + Duration::from_secs(60);
    while files(&node.partition_dir())
        .0
        .iter()
        .any(|p| p.ends_with("00000000000000000000-0000000000.checkpoint"))
    {
        assert!(
            Instant::now() < deadline,
            "the bootstrap snapshot is still there: {:?}",
            files(&node.partition_dir()).0
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    if reference::jars_or_skip() {
        let dump = reference::dump_cluster_metadata(&snapshot).expect("kafka-dump-log");
        assert!(
            dump.contains("KRaftVoters") || dump.contains("KRAFT_VOTERS"),
            "Kafka's decoder finds the voters in {}:\n{dump}",
            snapshot.display()
        );
    }
    node.stop();
    node.start();
    node.wait_serving();
    wait_for_topics(&node.bootstrap(), &topics, Instant::now());
}
