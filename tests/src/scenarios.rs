//! Fault scenarios on a three-node combined [`Cluster`], generic over the implementation:
//! `tests/tests/cluster_kafka.rs` runs them on Apache Kafka (validating the harness and the
//! checker), `crates/cli/tests/cluster.rs` on gregor (ignored until gregor is a KRaft
//! cluster). Each records a [`History`] with rdkafka clients, injects its fault, reads the
//! final state back and fails when the checker finds anything wrong; each prints what it
//! measured.
//!
//! The scenarios shorten Kafka's failure-detection timeouts (same names in gregor) so that a
//! run takes well under a minute: `broker.session.timeout.ms` 4000 (default 9000) and
//! `broker.heartbeat.interval.ms` 500 (default 2000). The quorum's own timeouts
//! (`controller.quorum.election.timeout.ms` 1000, `controller.quorum.fetch.timeout.ms` 2000)
//! stay at Kafka's defaults, so the measured fail-over time is Kafka's.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use crate::cluster::{Cluster, ClusterConfig, Implementation};
use crate::history::{FinalState, History, OpId, OpKind, Outcome, PartitionRecords};

/// Properties every scenario sets (see the module docs).
fn scenario_config(implementation: Implementation) -> ClusterConfig {
    ClusterConfig::combined(implementation, 3)
        .with("broker.session.timeout.ms", "4000")
        .with("broker.heartbeat.interval.ms", "500")
}

/// The replication factor a scenario's topics get: `wanted` on Kafka; 1 on gregor, which
/// refuses more (INVALID_REPLICATION_FACTOR) until partitions are replicated between brokers.
fn replication_factor(implementation: &Implementation, wanted: i32) -> i32 {
    match implementation {
        Implementation::Gregor(_) => 1,
        Implementation::Kafka => wanted,
    }
}

/// Kafka error codes after which the operation was definitely not applied. Everything else
/// (timeouts, lost connections, NOT_CONTROLLER after forwarding, ...) counts as unknown.
fn outcome_of_error(e: &KafkaError) -> Outcome {
    use RDKafkaErrorCode as C;
    match e.rdkafka_error_code() {
        Some(
            C::InvalidReplicationFactor
            | C::InvalidPartitions
            | C::InvalidTopic
            | C::PolicyViolation
            | C::InvalidConfig
            | C::MessageSizeTooLarge
            | C::InvalidRecord
            | C::NotEnoughReplicas
            | C::TopicAuthorizationFailed,
        ) => Outcome::Failed(e.to_string()),
        _ => Outcome::Unknown(e.to_string()),
    }
}

pub(crate) fn admin(bootstrap: &str) -> Result<AdminClient<DefaultClientContext>> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("log_level", "3")
        .create()?)
}

/// Creates `name` through `admin`, recording the operation in `history`.
pub(crate) fn create_topic_recorded(
    rt: &tokio::runtime::Runtime,
    admin: &AdminClient<DefaultClientContext>,
    history: &History,
    name: &str,
    partitions: i32,
    replication_factor: i32,
    configs: &[(&str, &str)],
) -> Outcome {
    let mut topic = NewTopic::new(
        name,
        partitions,
        TopicReplication::Fixed(replication_factor),
    );
    for (k, v) in configs {
        topic = topic.set(k, v);
    }
    let opts = AdminOptions::new()
        .operation_timeout(Some(Duration::from_secs(5)))
        .request_timeout(Some(Duration::from_secs(6)));
    let id = history.invoke(OpKind::CreateTopic {
        name: name.to_string(),
    });
    let outcome = match rt.block_on(admin.create_topics(&[topic], &opts)) {
        Err(e) => outcome_of_error(&e),
        Ok(results) => match results.into_iter().next() {
            Some(Ok(_)) => Outcome::Ok { offset: None },
            Some(Err((_, code))) => outcome_of_error(&KafkaError::AdminOp(code)),
            None => Outcome::Unknown("no result for the topic".into()),
        },
    };
    history.complete(id, outcome.clone());
    outcome
}

/// Every topic the cluster lists with its partition count (Metadata for all topics), once
/// every topic `history` saw acknowledged is listed or [`SETTLE_TIMEOUT`] has passed: a
/// broker learns of a topic some time after the controller acknowledged it, so a topic
/// missing at once is not lost; one still missing after the timeout is.
fn list_topics_settled(bootstrap: &str, history: &History) -> Result<BTreeMap<String, i32>> {
    let acknowledged: BTreeSet<String> = history
        .ops()
        .into_iter()
        .filter(|op| matches!(op.outcome, Some(Outcome::Ok { .. })))
        .filter_map(|op| match op.kind {
            OpKind::CreateTopic { name } => Some(name),
            OpKind::Produce { .. } => None,
        })
        .collect();
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("log_level", "3")
        .create()?;
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    loop {
        match consumer.fetch_metadata(None, Duration::from_secs(5)) {
            Ok(m) => {
                let listed: BTreeMap<String, i32> = m
                    .topics()
                    .iter()
                    .filter(|t| t.error().is_none())
                    .map(|t| {
                        (
                            t.name().to_string(),
                            i32::try_from(t.partitions().len()).unwrap_or(-1),
                        )
                    })
                    .collect();
                if acknowledged.iter().all(|t| listed.contains_key(t)) || Instant::now() > deadline
                {
                    return Ok(listed);
                }
            }
            Err(e) if Instant::now() > deadline => return Err(e).context("listing topics"),
            Err(_) => {}
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// How long a read-back waits for metadata to reach the brokers.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(15);

/// Reads every partition of `topic` from its log start up to the high watermark seen at the
/// start of the read, as (offset, value) per partition.
pub(crate) fn read_topic(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
) -> Result<PartitionRecords> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "gregor-history-reader")
        .set("enable.auto.commit", "false")
        .set("log_level", "3")
        .create()?;
    let mut ends = BTreeMap::new();
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        // librdkafka answers a ListOffsets error (NOT_LEADER_OR_FOLLOWER while its metadata
        // still names a leader that moved, as after a broker restart) without retrying; it
        // refreshes its metadata meanwhile, so the next try goes to the current leader.
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        let (_, high) = loop {
            match consumer.fetch_watermarks(topic, p, Duration::from_secs(10)) {
                Ok(w) => break w,
                Err(e) if Instant::now() < deadline => {
                    eprintln!("watermarks of {topic}-{p}: {e}; trying again");
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!("watermarks of {topic}-{p} (for {SETTLE_TIMEOUT:?})")
                    })
                }
            }
        };
        ends.insert(p, high);
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let mut out: PartitionRecords = (0..partitions)
        .map(|p| ((topic.to_string(), p), Vec::new()))
        .collect();
    let mut next: BTreeMap<i32, i64> = (0..partitions).map(|p| (p, 0)).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while next.iter().any(|(p, n)| *n < ends[p]) {
        ensure!(
            Instant::now() < deadline,
            "reading {topic} back took over 60 s: at {next:?}, ends {ends:?}"
        );
        let Some(m) = consumer.poll(Duration::from_millis(500)) else {
            continue;
        };
        let m = m.context("consuming")?;
        let value = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
        out.entry((topic.to_string(), m.partition()))
            .or_default()
            .push((m.offset(), value));
        next.insert(m.partition(), m.offset() + 1);
    }
    Ok(out)
}

/// What [`kill_active_controller_while_creating_topics`] measured.
#[derive(Debug, Clone)]
pub struct ControllerFailover {
    /// The controller killed.
    pub killed: i32,
    /// The controller that took over.
    pub new_leader: i32,
    /// From the kill to a new leader in DescribeQuorum, ms.
    pub to_new_leader_ms: u64,
    /// From the kill to the first acknowledged CreateTopics sent after it, ms.
    pub to_first_create_ms: u64,
    /// What the history checker found.
    pub report: String,
}

/// (a) kill -9 of the active controller while topics are created one after another: a new
/// leader must be elected (measured), CreateTopics must succeed again (measured), and after
/// the killed node is restarted every acknowledged topic must exist.
///
/// # Errors
/// When the cluster misbehaves or the checker finds a lost topic; with the nodes' logs.
pub fn kill_active_controller_while_creating_topics(
    implementation: Implementation,
) -> Result<ControllerFailover> {
    let mut cluster = Cluster::start(&scenario_config(implementation))?;
    let result = controller_failover(&mut cluster);
    result.with_context(|| format!("cluster logs:{}", cluster.logs(40)))
}

fn controller_failover(cluster: &mut Cluster) -> Result<ControllerFailover> {
    let history = Arc::new(History::new());
    let stop = Arc::new(AtomicBool::new(false));
    let bootstrap = cluster.bootstrap();
    let rf = replication_factor(&cluster.implementation, 2);
    let creator = {
        let (history, stop, bootstrap) = (history.clone(), stop.clone(), bootstrap.clone());
        std::thread::spawn(move || -> Result<()> {
            let rt = crate::clients::runtime()?;
            let mut admin_client = admin(&bootstrap)?;
            let mut i = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let outcome = create_topic_recorded(
                    &rt,
                    &admin_client,
                    &history,
                    &format!("failover-{i}"),
                    1,
                    rf,
                    &[],
                );
                if !matches!(outcome, Outcome::Ok { .. }) {
                    // librdkafka's admin client sends CreateTopics to the broker Metadata
                    // named as controller and may keep waiting for that one after it died;
                    // a new client starts from the bootstrap servers.
                    admin_client = admin(&bootstrap)?;
                }
                i += 1;
            }
            Ok(())
        })
    };
    let is_topic = |k: &OpKind| matches!(k, OpKind::CreateTopic { .. });
    let result = (|| -> Result<ControllerFailover> {
        let wait_acks = |n: usize, timeout: Duration| -> Result<()> {
            let deadline = Instant::now() + timeout;
            while history.acknowledged(is_topic) < n {
                ensure!(
                    Instant::now() < deadline,
                    "only {} topics created in {timeout:?}",
                    history.acknowledged(is_topic)
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(())
        };
        wait_acks(10, Duration::from_secs(30))?;
        let before = cluster
            .describe_quorum()?
            .context("no quorum leader before the kill")?;
        let killed = before.leader_id;
        let killed_at = Instant::now();
        cluster.node_mut(killed).kill9()?;
        let kill_ms = history.ms_at(killed_at);
        let after = cluster.wait_for_quorum(Duration::from_secs(30), |s| {
            s.leader_id != killed && s.leader_epoch > before.leader_epoch
        })?;
        let to_new_leader_ms = u64::try_from(killed_at.elapsed().as_millis())?;
        let acked_before = history.acknowledged(is_topic);
        wait_acks(acked_before + 10, Duration::from_secs(30))?;
        let first = history
            .first_ack_invoked_after(kill_ms, is_topic)
            .context("no CreateTopics acknowledged after the kill")?;
        Ok(ControllerFailover {
            killed,
            new_leader: after.leader_id,
            to_new_leader_ms,
            to_first_create_ms: first - kill_ms,
            report: String::new(),
        })
    })();
    stop.store(true, Ordering::Relaxed);
    creator
        .join()
        .map_err(|_| anyhow::anyhow!("the topic creator panicked"))??;
    let mut failover = result?;

    // Kafka's tool agrees on the new leader.
    if crate::reference::fetch().is_ok() {
        let tool = cluster.describe_quorum_tool()?;
        ensure!(
            tool.leader_id == failover.new_leader,
            "kafka-metadata-quorum says the leader is {}, DescribeQuorum said {}",
            tool.leader_id,
            failover.new_leader
        );
        eprintln!("kafka-metadata-quorum describe --status after the kill: {tool:?}");
    }
    cluster.restart_node(failover.killed)?;
    let state = FinalState {
        topics: list_topics_settled(&cluster.bootstrap(), &history)?
            .into_keys()
            .collect(),
        records: BTreeMap::new(),
    };
    let report = history.check(&state);
    failover.report = report.to_string();
    eprintln!(
        "{}: killed active controller {} -> new leader {} after {} ms (DescribeQuorum); first \
         CreateTopics acknowledged {} ms after the kill\n{report}",
        cluster.implementation.name(),
        failover.killed,
        failover.new_leader,
        failover.to_new_leader_ms,
        failover.to_first_create_ms
    );
    ensure!(report.is_valid(), "history check failed:\n{report}");
    ensure!(
        report.topics_acknowledged >= 20,
        "too few topics acknowledged to mean anything: {report}"
    );
    Ok(failover)
}

/// How [`full_cluster_restart_keeps_topics`] stops every node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FullRestart {
    /// SIGTERM to every node at once (Kafka's controlled shutdown), then start them all.
    Graceful,
    /// kill -9 of every node, then start them all.
    Kill9,
}

/// (b) A full-cluster restart keeps every topic: topics created (replication factor 3 on Kafka, 1 on gregor, one
/// to three partitions), every node stopped (gracefully or by kill -9) and started again;
/// every acknowledged topic must be listed with its partition count, and the cluster must
/// create topics again.
///
/// # Errors
/// When the cluster misbehaves or a topic is lost; with the nodes' logs.
pub fn full_cluster_restart_keeps_topics(
    implementation: Implementation,
    how: FullRestart,
) -> Result<()> {
    let mut cluster = Cluster::start(&scenario_config(implementation))?;
    let result = full_restart(&mut cluster, how);
    result.with_context(|| format!("cluster logs:{}", cluster.logs(40)))
}

fn full_restart(cluster: &mut Cluster, how: FullRestart) -> Result<()> {
    let history = History::new();
    let rt = crate::clients::runtime()?;
    let mut partitions_of = BTreeMap::new();
    let rf = replication_factor(&cluster.implementation, 3);
    let create = |cluster: &Cluster,
                  prefix: &str,
                  partitions_of: &mut BTreeMap<String, i32>|
     -> Result<()> {
        let admin = admin(&cluster.bootstrap())?;
        for i in 0..10 {
            let name = format!("{prefix}-{i}");
            let partitions = 1 + i % 3;
            let outcome = create_topic_recorded(&rt, &admin, &history, &name, partitions, rf, &[]);
            ensure!(
                matches!(outcome, Outcome::Ok { .. }),
                "creating {name} on a healthy cluster: {outcome:?}"
            );
            partitions_of.insert(name, partitions);
        }
        Ok(())
    };
    create(cluster, "before", &mut partitions_of)?;
    let t = Instant::now();
    match how {
        FullRestart::Graceful => cluster.stop_all()?,
        FullRestart::Kill9 => cluster.kill_all()?,
    }
    let stopped_ms = t.elapsed().as_millis();
    cluster.start_all()?;
    eprintln!(
        "{}: full restart ({how:?}): stopped in {stopped_ms} ms, ready again {} ms after the \
         stop began",
        cluster.implementation.name(),
        t.elapsed().as_millis()
    );
    // Still a working cluster: it creates topics again.
    create(cluster, "after", &mut partitions_of)?;

    let listed = list_topics_settled(&cluster.bootstrap(), &history)?;
    let report = history.check(&FinalState {
        topics: listed.keys().cloned().collect(),
        records: BTreeMap::new(),
    });
    eprintln!("{}: {report}", cluster.implementation.name());
    ensure!(report.is_valid(), "history check failed:\n{report}");
    for (name, partitions) in &partitions_of {
        ensure!(
            listed.get(name) == Some(partitions),
            "{name} has {:?} partitions, created with {partitions}",
            listed.get(name)
        );
    }
    Ok(())
}

/// Records produce outcomes into the history from rdkafka's delivery reports.
pub(crate) struct Recorder {
    history: Arc<History>,
}

impl Recorder {
    /// A recorder into `history`.
    pub(crate) fn new(history: Arc<History>) -> Self {
        Self { history }
    }
}

impl ClientContext for Recorder {}

impl ProducerContext for Recorder {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, op: usize) {
        let outcome = match result {
            Ok(m) => Outcome::Ok {
                offset: Some(m.offset()),
            },
            Err((e, _)) => outcome_of_error(e),
        };
        self.history.complete(OpId(op), outcome);
    }
}

/// What [`produce_while_killing_a_broker`] measured.
#[derive(Debug, Clone)]
pub struct ProduceUnderFailure {
    /// The broker killed (a partition leader, not the active controller).
    pub killed: i32,
    /// Records acknowledged.
    pub acknowledged: usize,
    /// From the kill to the first acknowledgement of a record sent after it to a partition
    /// the killed broker led, ms.
    pub to_first_ack_on_moved_partition_ms: u64,
    /// What the history checker found.
    pub report: String,
}

/// (c) acks=all (idempotent producer) to a 3-partition topic with replication factor 3 and
/// `min.insync.replicas=2` while a broker leading a partition is killed (-9) and later
/// restarted: no acknowledged record may be lost, duplicated, reordered or misplaced.
///
/// # Errors
/// When the cluster misbehaves or the checker finds a problem; with the nodes' logs.
pub fn produce_while_killing_a_broker(
    implementation: Implementation,
) -> Result<ProduceUnderFailure> {
    let mut cluster = Cluster::start(&scenario_config(implementation))?;
    let result = produce_under_failure(&mut cluster);
    result.with_context(|| format!("cluster logs:{}", cluster.logs(40)))
}

fn produce_under_failure(cluster: &mut Cluster) -> Result<ProduceUnderFailure> {
    const TOPIC: &str = "acks-all";
    const PARTITIONS: i32 = 3;
    let history = Arc::new(History::new());
    {
        let rt = crate::clients::runtime()?;
        let outcome = create_topic_recorded(
            &rt,
            &admin(&cluster.bootstrap())?,
            &history,
            TOPIC,
            PARTITIONS,
            3,
            &[("min.insync.replicas", "2")],
        );
        ensure!(
            matches!(outcome, Outcome::Ok { .. }),
            "creating {TOPIC}: {outcome:?}"
        );
    }
    // The broker to kill: the leader of a partition, not the active controller (this is a
    // broker failure, not a controller fail-over).
    let controller = cluster.active_controller()?;
    let leaders = partition_leaders(&cluster.bootstrap(), TOPIC, PARTITIONS)?;
    let Some((&victim_partition, &killed)) = leaders.iter().find(|(_, l)| **l != controller) else {
        bail!(
            "every partition of {TOPIC} is led by the active controller {controller}: {leaders:?}"
        );
    };
    let moved: BTreeSet<i32> = leaders
        .iter()
        .filter(|(_, l)| **l == killed)
        .map(|(p, _)| *p)
        .collect();

    let producer: ThreadedProducer<Recorder> = ClientConfig::new()
        .set("bootstrap.servers", cluster.bootstrap())
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .set("message.timeout.ms", "20000")
        .set("log_level", "3")
        .create_with_context(Recorder {
            history: history.clone(),
        })?;
    let stop = Arc::new(AtomicBool::new(false));
    let sender = {
        let (history, stop, producer) = (history.clone(), stop.clone(), producer);
        std::thread::spawn(move || -> Result<ThreadedProducer<Recorder>> {
            let mut i = 0i32;
            while !stop.load(Ordering::Relaxed) {
                let partition = i % PARTITIONS;
                let value = format!("v-{i}");
                send_recorded(&producer, &history, TOPIC, partition, &value);
                i += 1;
                // About 250 records a second: enough to span the fail-over densely.
                std::thread::sleep(Duration::from_millis(4));
            }
            Ok(producer)
        })
    };
    let is_produce = |k: &OpKind| matches!(k, OpKind::Produce { .. });
    let on_moved =
        |k: &OpKind| matches!(k, OpKind::Produce { partition, .. } if moved.contains(partition));
    let result = (|| -> Result<(u64, u64)> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while history.acknowledged(is_produce) < 500 {
            ensure!(
                Instant::now() < deadline,
                "fewer than 500 records acknowledged in 30 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let killed_at = Instant::now();
        cluster.node_mut(killed).kill9()?;
        let kill_ms = history.ms_at(killed_at);
        let deadline = Instant::now() + Duration::from_secs(30);
        let first = loop {
            if let Some(first) = history.first_ack_invoked_after(kill_ms, on_moved) {
                break first;
            }
            ensure!(
                Instant::now() < deadline,
                "no record to partitions {moved:?} acknowledged within 30 s of killing broker {killed}"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        // A little more traffic on the new leaders, then the killed broker comes back.
        std::thread::sleep(Duration::from_secs(2));
        Ok((kill_ms, first))
    })();
    stop.store(true, Ordering::Relaxed);
    let producer = sender
        .join()
        .map_err(|_| anyhow::anyhow!("the producer thread panicked"))??;
    // Every record gets its delivery report (or times out) before the read.
    producer.flush(Duration::from_secs(30))?;
    drop(producer);
    let (kill_ms, first) = result?;

    cluster.restart_node(killed)?;
    let state = FinalState {
        topics: list_topics_settled(&cluster.bootstrap(), &history)?
            .into_keys()
            .collect(),
        records: read_topic(&cluster.bootstrap(), TOPIC, PARTITIONS)?,
    };
    let report = history.check(&state);
    eprintln!(
        "{}: killed broker {killed} (leader of partition {victim_partition}, partitions \
         {moved:?} moved); first acknowledgement on a moved partition {} ms after the kill\n{report}",
        cluster.implementation.name(),
        first - kill_ms
    );
    ensure!(report.is_valid(), "history check failed:\n{report}");
    Ok(ProduceUnderFailure {
        killed,
        acknowledged: report.records_acknowledged,
        to_first_ack_on_moved_partition_ms: first - kill_ms,
        report: report.to_string(),
    })
}

/// The leader of each partition of `topic`, from a Metadata response.
pub(crate) fn partition_leaders(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
) -> Result<BTreeMap<i32, i32>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("log_level", "3")
        .create()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let m = consumer.fetch_metadata(Some(topic), Duration::from_secs(5))?;
        let leaders: BTreeMap<i32, i32> = m
            .topics()
            .iter()
            .flat_map(|t| t.partitions())
            .filter(|p| p.leader() >= 0)
            .map(|p| (p.id(), p.leader()))
            .collect();
        if leaders.len() == usize::try_from(partitions)? {
            return Ok(leaders);
        }
        ensure!(
            Instant::now() < deadline,
            "{topic} has no leader for every partition: {leaders:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What [`pause_and_resume_active_controller`] measured.
#[derive(Debug, Clone)]
pub struct PausedController {
    /// The controller paused (SIGSTOP).
    pub paused: i32,
    /// The controller elected while it was paused.
    pub new_leader: i32,
    /// From the SIGSTOP to a new leader in DescribeQuorum, ms.
    pub to_new_leader_ms: u64,
}

/// SIGSTOP of the active controller of three controller-only voters and one broker-only
/// node: the other two elect a new leader; after SIGCONT the cluster is ready again (the
/// paused node rejoins as a follower), and Kafka's `kafka-metadata-quorum describe --status`
/// agrees with DescribeQuorum, listing the broker as an observer.
///
/// # Errors
/// When the cluster misbehaves; with the nodes' logs.
pub fn pause_and_resume_active_controller(
    implementation: Implementation,
) -> Result<PausedController> {
    let mut cluster = Cluster::start(&ClusterConfig {
        implementation,
        layout: crate::cluster::Layout::Split {
            controllers: 3,
            brokers: 1,
        },
        properties: Vec::new(),
        node_implementations: Vec::new(),
        controller_format_args: Vec::new(),
    })?;
    let result = pause_resume(&mut cluster);
    result.with_context(|| format!("cluster logs:{}", cluster.logs(40)))
}

fn pause_resume(cluster: &mut Cluster) -> Result<PausedController> {
    let before = cluster.describe_quorum_tool()?;
    ensure!(before.voters.len() == 3, "three voters: {before:?}");
    ensure!(
        before.observers.contains(&4),
        "the broker observes: {before:?}"
    );
    // Only the broker is a broker: controller-only nodes never register as one.
    let listed = cluster.metadata_broker_ids()?;
    let brokers: BTreeSet<i32> = cluster.broker_ids().into_iter().collect();
    ensure!(
        listed.as_ref() == Some(&brokers),
        "Metadata lists {listed:?}, the brokers are {brokers:?}"
    );
    // ... and partitions are placed on brokers only.
    crate::clients::create_topic(&cluster.bootstrap(), "split-placement", 6)?;
    let consumer: rdkafka::consumer::BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", cluster.bootstrap())
        .create()
        .context("a metadata client")?;
    let m = consumer
        .fetch_metadata(Some("split-placement"), Duration::from_secs(10))
        .context("Metadata of split-placement")?;
    let leaders: BTreeSet<i32> = m
        .topics()
        .iter()
        .flat_map(|t| t.partitions().iter().map(|p| p.leader()))
        .collect();
    ensure!(
        leaders.is_subset(&brokers) && !leaders.is_empty(),
        "partition leaders {leaders:?}, the brokers are {brokers:?}"
    );
    let old = cluster.active_controller()?;
    ensure!(
        old == before.leader_id,
        "the tool says {before:?}, DescribeQuorum says {old}"
    );
    let pid = cluster.node(old).pid();
    let paused_at = Instant::now();
    cluster.node_mut(old).pause()?;
    let after = cluster.wait_for_quorum(Duration::from_secs(20), |s| {
        s.leader_id != old && s.leader_epoch > before.leader_epoch
    })?;
    let to_new_leader_ms = u64::try_from(paused_at.elapsed().as_millis())?;
    cluster.node_mut(old).resume()?;
    ensure!(cluster.node(old).pid() == pid, "SIGCONT keeps the process");
    cluster.wait_ready(Duration::from_secs(60))?;
    let tool = cluster.describe_quorum_tool()?;
    ensure!(
        tool.leader_epoch >= after.leader_epoch,
        "the epoch went back: {tool:?} after {after:?}"
    );
    eprintln!(
        "{}: paused active controller {old}: new leader {} after {to_new_leader_ms} ms; after \
         SIGCONT: {tool:?}",
        cluster.implementation.name(),
        after.leader_id
    );
    Ok(PausedController {
        paused: old,
        new_leader: after.leader_id,
        to_new_leader_ms,
    })
}

/// What [`isolate_active_controller`] measured.
#[derive(Debug, Clone)]
pub struct IsolatedController {
    /// The controller isolated.
    pub isolated: i32,
    /// The leader the other two elected.
    pub new_leader: i32,
    /// From the cut to the new leader answering DescribeQuorum, ms.
    pub to_new_leader_ms: u64,
    /// Connections the proxies refused while the node was isolated.
    pub refused: u64,
}

/// Three combined nodes behind [`crate::proxy`] proxies: the active controller is cut from
/// the other two nodes (its process keeps running; clients still reach it); the other two
/// elect a new leader among themselves; after the links heal the cluster is ready again with
/// the old node back, and topics can be created.
///
/// # Errors
/// When the cluster misbehaves; with the nodes' logs.
pub fn isolate_active_controller(implementation: Implementation) -> Result<IsolatedController> {
    let mut cluster = Cluster::start_with(
        &scenario_config(implementation),
        &crate::cluster::ClusterOptions::default().with_proxies(),
    )?;
    let result = isolate_controller(&mut cluster);
    result.with_context(|| format!("cluster logs:{}", cluster.logs(40)))
}

fn isolate_controller(cluster: &mut Cluster) -> Result<IsolatedController> {
    let before = cluster.wait_for_quorum(Duration::from_secs(30), |s| s.leader_id >= 0)?;
    let old = before.leader_id;
    let others: Vec<i32> = cluster
        .broker_ids()
        .into_iter()
        .filter(|n| *n != old)
        .collect();
    let all = cluster.broker_ids();
    let cut_at = Instant::now();
    cluster
        .network()
        .context("the cluster has proxies")?
        .isolate(old, &all, false);
    // Ask the two that are still connected: the isolated node may still believe it leads.
    let deadline = Instant::now() + Duration::from_secs(30);
    let new_leader = loop {
        let views: Vec<Option<QuorumStatusSummary>> = others
            .iter()
            .map(|n| {
                cluster
                    .describe_quorum_at_node(*n)
                    .map(|s| (s.leader_id, s.leader_epoch))
            })
            .collect();
        if let Some(Some((leader, epoch))) = views.iter().find(|v| v.is_some()) {
            if *leader != old && *epoch > before.leader_epoch {
                break *leader;
            }
        }
        ensure!(
            Instant::now() < deadline,
            "no new leader among {others:?} within 30 s of isolating {old}: {views:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let to_new_leader_ms = u64::try_from(cut_at.elapsed().as_millis())?;
    let net = cluster.network().context("the cluster has proxies")?;
    let refused = net.refused();
    ensure!(
        refused > 0,
        "no connection was refused while node {old} was isolated"
    );
    net.heal();
    cluster.wait_ready(Duration::from_secs(60))?;
    // The old node follows the new leader again, and the cluster takes writes. Right after
    // the heal the old node may still answer with its stale view (itself, the old epoch)
    // until it hears of the new epoch: wait for the new epoch.
    let back = cluster.wait_for_quorum(Duration::from_secs(30), |s| {
        s.leader_id >= 0 && s.leader_epoch > before.leader_epoch
    })?;
    ensure!(
        back.leader_epoch > before.leader_epoch,
        "the epoch went back: {back:?} after {before:?}"
    );
    crate::clients::create_topic(&cluster.bootstrap(), "after-isolation", 3)?;
    eprintln!(
        "{}: isolated active controller {old}: new leader {new_leader} after \
         {to_new_leader_ms} ms ({refused} connections refused); healed: {back:?}",
        cluster.implementation.name()
    );
    Ok(IsolatedController {
        isolated: old,
        new_leader,
        to_new_leader_ms,
        refused,
    })
}

/// (leader id, leader epoch) as one node reports it.
type QuorumStatusSummary = (i32, i32);

/// Records a produce of `value` to `topic`/`partition` in `history` and hands it to
/// `producer` (its delivery callback completes the operation), waiting while librdkafka's
/// queue is full; a record that cannot be queued is recorded as failed.
pub(crate) fn send_recorded<C>(
    producer: &ThreadedProducer<C>,
    history: &History,
    topic: &str,
    partition: i32,
    value: &str,
) where
    C: rdkafka::producer::ProducerContext<DeliveryOpaque = usize>,
{
    let op = history.invoke(OpKind::Produce {
        topic: topic.to_string(),
        partition,
        value: value.to_string(),
    });
    let value = value.to_string();
    let mut record = BaseRecord::<(), String, usize>::with_opaque_to(topic, op.0)
        .partition(partition)
        .payload(&value);
    loop {
        match producer.send(record) {
            Ok(()) => break,
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                record = r;
                std::thread::sleep(Duration::from_millis(5));
            }
            Err((e, _)) => {
                history.complete(op, Outcome::Failed(format!("not sent: {e}")));
                break;
            }
        }
    }
}
