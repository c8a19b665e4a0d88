//! Fetch from follower (KIP-392) on a 3-node gregor cluster: every node has its own
//! `broker.rack` (`rack-<node id>`) and `replica.selector.class` is Kafka's
//! `RackAwareReplicaSelector`. A topic with replication factor 3 and `min.insync.replicas=2`;
//! a librdkafka consumer with `client.rack` set to a follower's rack reads every record
//! exactly once and in order, and the follower served them (the brokers' own
//! `gregor_topic_records_out_total`: the leader sent none); Kafka 4.4's Java consumer
//! (`kafka-console-consumer`) does the same. Then the follower is killed (kill -9) while the
//! librdkafka consumer, and a second Java consumer, are in the middle of the partition: both
//! fall back to the leader and still get everything, including the records produced after the
//! kill (which only the leader and the third replica have).
//!
//! `cargo test -p gregor --test fetch_from_follower -- --nocapture`

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use gregor_protocol::batch::BatchBuilder;
use gregor_tests::cluster::{Cluster, ClusterConfig, Implementation};
use gregor_tests::reference::{jars_or_skip, tool_command, tool_output};
use gregor_tests::wire::{sb, KafkaConn};
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, BrokerId, CreateTopicsRequest, CreateTopicsResponse, FetchRequest, FetchResponse,
    MetadataRequest, MetadataResponse, ProduceRequest, ProduceResponse, TopicName,
};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

const TOPIC: &str = "nearby";
const RACK_AWARE: &str = "org.apache.kafka.common.replica.RackAwareReplicaSelector";
/// Records per produced batch, and batches per phase.
const BATCH: usize = 100;
const BATCHES: usize = 10;
const PHASE: usize = BATCH * BATCHES;
const NOT_LEADER_OR_FOLLOWER: i16 = 6;
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;

fn config() -> ClusterConfig {
    ClusterConfig::combined(
        Implementation::Gregor(env!("CARGO_BIN_EXE_gregor").into()),
        3,
    )
    .with("replica.selector.class", RACK_AWARE)
    // A dead follower stays in the ISR (and so preferred) until the leader drops it.
    .with("replica.lag.time.max.ms", "3000")
    .with("broker.heartbeat.interval.ms", "500")
    .with("replica.fetch.backoff.ms", "200")
}

fn conn(bootstrap: &str) -> anyhow::Result<KafkaConn> {
    KafkaConn::connect_timeout(bootstrap.parse()?, Duration::from_secs(5), "fff-test")
}

fn create_topic(bootstrap: &str, name: &str, replication_factor: i16) {
    let req = CreateTopicsRequest::default()
        .with_timeout_ms(30_000)
        .with_topics(vec![CreatableTopic::default()
            .with_name(TopicName(sb(name)))
            .with_num_partitions(1)
            .with_replication_factor(replication_factor)
            .with_configs(vec![CreatableTopicConfig::default()
                .with_name(sb("min.insync.replicas"))
                .with_value(Some(sb("2")))])]);
    let r: CreateTopicsResponse = conn(bootstrap)
        .and_then(|mut c| c.call(ApiKey::CreateTopics, 7, &req))
        .expect("CreateTopics answered");
    assert_eq!(r.topics[0].error_code, 0, "{r:?}");
}

/// (leader, sorted ISR) of partition 0 of `topic` as `bootstrap` sees it.
fn partition_state_of(bootstrap: &str, topic: &str) -> Option<(i32, Vec<i32>)> {
    let req = MetadataRequest::default()
        .with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(TopicName(sb(topic))))
        ]))
        .with_allow_auto_topic_creation(false);
    let m: MetadataResponse = conn(bootstrap)
        .ok()?
        .call(ApiKey::Metadata, 12, &req)
        .ok()?;
    let p = m.topics.first()?.partitions.first()?;
    let mut isr: Vec<i32> = p.isr_nodes.iter().map(|b| b.0).collect();
    isr.sort_unstable();
    (p.error_code == 0 && p.leader_id.0 >= 0).then_some((p.leader_id.0, isr))
}

fn partition_state(bootstrap: &str) -> Option<(i32, Vec<i32>)> {
    partition_state_of(bootstrap, TOPIC)
}

/// (broker id, rack) of every broker in a Metadata response from `bootstrap`, sorted.
fn broker_racks(bootstrap: &str) -> Vec<(i32, Option<String>)> {
    let m: MetadataResponse = conn(bootstrap)
        .and_then(|mut c| c.call(ApiKey::Metadata, 12, &MetadataRequest::default()))
        .expect("Metadata answered");
    let mut racks: Vec<(i32, Option<String>)> = m
        .brokers
        .iter()
        .map(|b| (b.node_id.0, b.rack.as_ref().map(ToString::to_string)))
        .collect();
    racks.sort();
    racks
}

/// The error code of a consumer's Fetch v12 (with a rack) of partition 0 of `topic` at
/// `bootstrap`.
fn fetch_error(bootstrap: &str, topic: &str) -> i16 {
    let req = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(0)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_rack_id(sb("rack-1"))
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(sb(topic)))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(0)
                .with_fetch_offset(0)
                .with_partition_max_bytes(1 << 20)])]);
    let r: FetchResponse = conn(bootstrap)
        .and_then(|mut c| c.call(ApiKey::Fetch, 12, &req))
        .expect("Fetch answered");
    r.responses[0].partitions[0].error_code
}

fn value(i: usize) -> String {
    format!("record-{i:06}")
}

/// Batch `n` (records `n * BATCH ..`) to partition 0 with acks=all; panics on an error.
fn produce_batch(bootstrap: &str, n: usize) {
    let mut b = BatchBuilder::new(0, 1_000);
    for r in 0..BATCH {
        b = b.record(1_000, None, Some(value(n * BATCH + r).as_bytes()), &[]);
    }
    let req = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(sb(TOPIC)))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(0)
                .with_records(Some(Bytes::from(b.build())))])]);
    let resp: ProduceResponse = conn(bootstrap)
        .and_then(|mut c| c.call(ApiKey::Produce, 9, &req))
        .expect("Produce answered");
    let p = &resp.responses[0].partition_responses[0];
    assert_eq!(
        (p.error_code, p.base_offset),
        (0, (n * BATCH) as i64),
        "batch {n}"
    );
}

/// The value of the metric `name` whose labels include every one of `labels` (`key="value"`)
/// on the node with admin port `port`, 0 when there is none yet.
fn metric(port: u16, name: &str, labels: &[&str]) -> u64 {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("admin listener");
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .expect("request");
    let mut body = String::new();
    s.read_to_string(&mut body).expect("metrics");
    body.lines()
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix('{')?.split_once("} "))
        .find(|(l, _)| {
            labels
                .iter()
                .all(|want| l.split(',').any(|have| have == *want))
        })
        .map_or(0, |(_, v)| {
            v.trim().parse::<f64>().expect("a number") as u64
        })
}

/// `gregor_topic_records_out_total` of the topic on the node with admin port `port`: the
/// records it sent to consumers.
fn records_out(port: u16) -> u64 {
    metric(
        port,
        "gregor_topic_records_out_total",
        &[&format!("topic=\"{TOPIC}\"")],
    )
}

/// `gregor_high_watermark` of partition 0 of the topic on the node with admin port `port`.
fn high_watermark(port: u16) -> u64 {
    metric(
        port,
        "gregor_high_watermark",
        &[&format!("topic=\"{TOPIC}\""), "partition=\"0\""],
    )
}

/// `kafka-console-consumer` reading `max` records of partition 0 from the start with
/// `client.rack`, in small fetches (one batch each), its output collected by a thread; killed
/// when dropped.
struct JavaConsumer {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl JavaConsumer {
    fn start(bootstrap: &str, rack: &str, max: usize) -> Self {
        let args: Vec<String> = [
            "--bootstrap-server",
            bootstrap,
            "--topic",
            TOPIC,
            "--partition",
            "0",
            "--offset",
            "earliest",
            "--max-messages",
            &max.to_string(),
            "--timeout-ms",
            "60000",
            "--consumer-property",
            &format!("client.rack={rack}"),
            "--consumer-property",
            "max.partition.fetch.bytes=2048",
            "--consumer-property",
            "fetch.max.bytes=4096",
        ]
        .iter()
        .map(ToString::to_string)
        .collect();
        let mut child = tool_command("kafka-console-consumer", &args)
            .expect("kafka-console-consumer")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn kafka-console-consumer");
        let stdout = child.stdout.take().expect("stdout");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.starts_with("record-") {
                    sink.lock().expect("lines").push(line);
                }
            }
        });
        Self {
            child,
            lines,
            reader: Some(reader),
        }
    }

    fn lines(&self) -> Vec<String> {
        self.lines.lock().expect("lines").clone()
    }

    /// Waits for the tool to exit (it stops after `max` records, or 60 s without one) and
    /// returns what it printed.
    fn finish(&mut self) -> Vec<String> {
        let status = self.child.wait().expect("kafka-console-consumer exits");
        if let Some(r) = self.reader.take() {
            r.join().expect("the reader thread");
        }
        assert!(status.success(), "kafka-console-consumer: {status}");
        self.lines()
    }
}

impl Drop for JavaConsumer {
    fn drop(&mut self) {
        // Ends a consumer left running by a failed assertion; a finished one is reaped already.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn rack_consumer(bootstrap: &str, rack: &str) -> BaseConsumer {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "fff-assign-only")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("client.rack", rack)
        // Small fetches (one batch each, KIP-74) and a small local queue, so that the
        // consumer is still in the middle of the partition when the follower dies.
        .set("max.partition.fetch.bytes", "2048")
        .set("message.max.bytes", "4096")
        .set("fetch.max.bytes", "4096")
        .set("queued.max.messages.kbytes", "8")
        .set("fetch.wait.max.ms", "100")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(TOPIC, 0, Offset::Beginning)
        .expect("partition");
    c.assign(&tpl).expect("assign");
    c
}

/// Polls until `got` holds `until` records; each must be the next offset with its value.
fn read_until(cluster: &Cluster, c: &BaseConsumer, got: &mut Vec<String>, until: usize) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while got.len() < until {
        assert!(
            Instant::now() < deadline,
            "read {} of {until} records\n{}",
            got.len(),
            cluster.logs(200)
        );
        match c.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                let v = String::from_utf8_lossy(m.payload().unwrap_or_default()).to_string();
                assert_eq!(
                    (m.offset(), v.as_str()),
                    (got.len() as i64, value(got.len()).as_str()),
                    "records in order, each once"
                );
                got.push(v);
            }
            // Transient errors (a dead broker) are the client's to handle.
            Some(Err(e)) => eprintln!("consumer: {e}"),
            None => {}
        }
    }
}

#[test]
fn a_consumer_reads_from_the_follower_in_its_rack_and_falls_back_to_the_leader() {
    run(Implementation::Gregor(env!("CARGO_BIN_EXE_gregor").into()));
}

/// The same on Apache Kafka 4.4 (the reference: same answers, same fallback), without the
/// broker counters gregor has. `cargo test -p gregor --test fetch_from_follower -- --ignored`.
#[test]
#[ignore = "the reference run on three Kafka JVMs; run by hand"]
fn kafka_reference() {
    if jars_or_skip() {
        run(Implementation::Kafka);
    }
}

fn run(implementation: Implementation) {
    let config = ClusterConfig {
        implementation,
        ..config()
    };
    let mut cluster = Cluster::prepare(&config).unwrap_or_else(|e| panic!("{e:#}"));
    for n in cluster.nodes() {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(n.config_file())
            .expect("server.properties");
        writeln!(f, "broker.rack=rack-{}", n.node_id).expect("write");
    }
    cluster.format().unwrap_or_else(|e| panic!("{e:#}"));
    cluster.start_all().unwrap_or_else(|e| panic!("{e:#}"));
    let bootstrap = cluster.bootstrap();
    let any = cluster.node(1).bootstrap().expect("listener");
    // broker.rack reaches the registration and every node's Metadata answer.
    let racks: Vec<(i32, Option<String>)> =
        (1..=3).map(|i| (i, Some(format!("rack-{i}")))).collect();
    for n in 1..=3 {
        let addr = cluster.node(n).bootstrap().expect("listener");
        assert_eq!(broker_racks(&addr), racks, "node {n}");
    }
    create_topic(&any, TOPIC, 3);
    // A broker that is not a replica of a partition refuses to serve it, as Kafka.
    create_topic(&any, "one-replica", 1);
    let (only, _) = cluster.wait_for(Duration::from_secs(30), "a leader", || {
        partition_state_of(&any, "one-replica")
    });
    let elsewhere = if only == 1 { 2 } else { 1 };
    let other_addr = cluster.node(elsewhere).bootstrap().expect("listener");
    cluster.wait_for(Duration::from_secs(30), "the topic on every node", || {
        partition_state_of(&other_addr, "one-replica")
    });
    assert_eq!(
        fetch_error(&other_addr, "one-replica"),
        NOT_LEADER_OR_FOLLOWER
    );
    assert_eq!(
        fetch_error(&other_addr, "no-such-topic"),
        UNKNOWN_TOPIC_OR_PARTITION
    );
    let (leader, _) = cluster.wait_for(Duration::from_secs(30), "an ISR of three", || {
        partition_state(&any).filter(|(_, isr)| isr.len() == 3)
    });
    let leader_addr = cluster.node(leader).bootstrap().expect("listener");
    cluster.wait_for(Duration::from_secs(30), "the leader's view", || {
        partition_state(&leader_addr).filter(|(l, isr)| *l == leader && isr.len() == 3)
    });
    // The follower to read from: not the active controller if there is a choice, so that its
    // death does not also need a new controller.
    let controller = cluster.active_controller().unwrap_or(-1);
    let followers: Vec<i32> = [1, 2, 3].into_iter().filter(|i| *i != leader).collect();
    let follower = followers
        .iter()
        .copied()
        .find(|f| *f != controller)
        .unwrap_or(followers[0]);
    let third = followers
        .iter()
        .copied()
        .find(|f| *f != follower)
        .unwrap_or(-1);
    // gregor's own counters of records sent to consumers, per node (Kafka has none such).
    let admin = |id: i32| cluster.node(id).admin_port;
    let (leader_out, follower_out, third_out) = (admin(leader), admin(follower), admin(third));
    let out = |port: Option<u16>| port.map_or(0, records_out);
    println!("leader {leader}, follower {follower} (rack-{follower}), controller {controller}");

    for n in 0..BATCHES {
        produce_batch(&leader_addr, n);
    }
    // The last batch is acknowledged: the leader's high watermark passed it. The follower
    // learns that from its next fetch, which the leader answers after
    // replica.fetch.wait.max.ms (500) when nothing new comes: the lag of a consumer reading
    // from the follower is bounded by that.
    let acknowledged = Instant::now();
    if let Some(port) = follower_out {
        cluster.wait_for(
            Duration::from_secs(5),
            "the follower's high watermark",
            || (high_watermark(port) == PHASE as u64).then_some(()),
        );
        println!(
            "the follower's high watermark reached the acknowledged end {} ms after the \
             acknowledgement (replica.fetch.wait.max.ms 500)",
            acknowledged.elapsed().as_millis()
        );
    }
    let rack = format!("rack-{follower}");

    // Kafka's Java consumer in the follower's rack: the leader answers PreferredReadReplica,
    // the follower serves the records.
    let mut java_served = 0;
    if jars_or_skip() {
        let printed = tool_output(
            "kafka-console-consumer",
            &[
                "--bootstrap-server",
                &bootstrap,
                "--topic",
                TOPIC,
                "--partition",
                "0",
                "--offset",
                "earliest",
                "--max-messages",
                &PHASE.to_string(),
                "--timeout-ms",
                "60000",
                "--consumer-property",
                &format!("client.rack={rack}"),
            ],
        )
        .expect("kafka-console-consumer");
        let values: Vec<&str> = printed
            .lines()
            .filter(|l| l.starts_with("record-"))
            .collect();
        let expected: Vec<String> = (0..PHASE).map(value).collect();
        assert_eq!(values, expected, "the Java consumer's records:\n{printed}");
        println!("the Java consumer read {PHASE} records");
        if follower_out.is_some() {
            java_served = out(follower_out);
            println!("the follower served {java_served}");
            assert!(java_served >= PHASE as u64, "{java_served}");
            assert_eq!(out(leader_out), 0, "the leader sent no records");
        }
    }

    // librdkafka in the same rack.
    let consumer = rack_consumer(&bootstrap, &rack);
    let mut got = Vec::new();
    read_until(&cluster, &consumer, &mut got, PHASE / 2);
    let served = out(follower_out) - java_served;
    println!(
        "librdkafka read {} records; records out: follower {served}, leader {}, third {}",
        got.len(),
        out(leader_out),
        out(third_out)
    );
    if follower_out.is_some() {
        assert!(served >= got.len() as u64, "the follower served {served}");
        assert_eq!(out(leader_out), 0, "the leader sent no records");
        assert_eq!(out(third_out), 0);
    }

    // Records keep coming while the consumer reads at the head of the partition, and the
    // follower dies in the middle of that.
    let total = 3 * PHASE;
    // A second Java consumer reads the whole partition while the follower dies.
    let java = jars_or_skip().then(|| JavaConsumer::start(&bootstrap, &rack, total));
    if let Some(j) = &java {
        cluster.wait_for(
            Duration::from_secs(60),
            "the Java consumer's first records",
            || (!j.lines().is_empty()).then_some(()),
        );
    }
    let produced = Arc::new(AtomicUsize::new(BATCHES));
    let producer = {
        let leader_addr = leader_addr.clone();
        let produced = produced.clone();
        std::thread::spawn(move || {
            for n in BATCHES..3 * BATCHES {
                produce_batch(&leader_addr, n);
                produced.store(n + 1, Ordering::SeqCst);
                // A steady stream rather than a burst.
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    read_until(&cluster, &consumer, &mut got, PHASE + PHASE / 2);
    let from_follower = out(follower_out) - java_served;
    if follower_out.is_some() {
        assert!(
            from_follower >= got.len() as u64,
            "the follower served what was read: {from_follower}"
        );
        assert_eq!(out(leader_out), 0, "the leader sent no records");
    }
    cluster.node_mut(follower).kill9().expect("kill -9");
    let killed = Instant::now();
    // At most one more batch (in flight) can have reached the follower before it died.
    let acknowledged_at_kill = produced.load(Ordering::SeqCst);
    println!(
        "killed the follower after librdkafka read {} records (the follower had sent \
         {from_follower} to the consumers since the first Java one) and {acknowledged_at_kill} of \
         {} batches were acknowledged",
        got.len(),
        3 * BATCHES
    );
    assert!(
        acknowledged_at_kill < 3 * BATCHES - 1,
        "the follower died while records were still coming"
    );
    cluster.wait_for(
        Duration::from_secs(30),
        "the ISR without the follower",
        || partition_state(&leader_addr).filter(|(_, isr)| !isr.contains(&follower)),
    );
    println!(
        "the follower left the ISR {} ms after the kill",
        killed.elapsed().as_millis()
    );
    // The next record (acknowledged before the kill, so on the leader) after how long?
    let next = got.len() + 1;
    read_until(&cluster, &consumer, &mut got, next);
    println!(
        "librdkafka read its next record {} ms after the kill",
        killed.elapsed().as_millis()
    );
    read_until(&cluster, &consumer, &mut got, total);
    producer.join().expect("the producer thread");
    if let Some(mut j) = java {
        let lines = j.finish();
        let expected: Vec<String> = (0..total).map(value).collect();
        assert_eq!(
            lines, expected,
            "the Java consumer read everything once, in order"
        );
        println!("the Java consumer read all {total} records across the kill");
    }
    let from_leader = out(leader_out);
    println!(
        "all {} records read {} ms after the kill; the leader served {from_leader}",
        got.len(),
        killed.elapsed().as_millis()
    );
    let only_on_the_leader = total - (acknowledged_at_kill + 1) * BATCH;
    if leader_out.is_some() {
        assert!(
            from_leader >= only_on_the_leader as u64,
            "the records produced after the kill ({only_on_the_leader} at least) came from \
             the leader: {from_leader}"
        );
    }
    // Nothing more than everything, exactly once.
    assert!(consumer.poll(Duration::from_millis(500)).is_none());
}
