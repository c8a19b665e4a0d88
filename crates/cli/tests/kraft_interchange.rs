//! One data directory, run in turn by gregor and by Apache Kafka 4.4.0, with Kafka's own
//! `server.properties` and `kafka-storage format` output:
//! 1. gregor serves a node Kafka formatted, creates a topic (3 partitions, a topic config) and
//!    stores records; its `__cluster_metadata-0` segment decodes with
//!    `kafka-dump-log --cluster-metadata-decoder` (TopicRecord, PartitionRecords, ConfigRecord,
//!    RegisterBrokerRecord, gregor's LeaderChange);
//! 2. Kafka starts on that directory: it loads gregor's metadata log (the topic, its config)
//!    and serves the records gregor wrote;
//! 3. gregor starts again after Kafka: it reads the batches Kafka appended (Kafka's own
//!    registration, its epoch) and serves the same records, and creates another topic.
//!
//! Needs Java 17+ and the Kafka jars; skipped with a message when they cannot be fetched.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gregor_tests::clients::{self, create_topic_with};
use gregor_tests::process::{free_port, wait_for_broker, ChildGuard};
use gregor_tests::reference::{self, Instance};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, Producer};
use rdkafka::{Message, Offset, TopicPartitionList};

const BIN: &str = env!("CARGO_BIN_EXE_gregor");
const TOPIC: &str = "interchange";
const RECORDS: usize = 9;

fn start_gregor(props: &Path, bootstrap: &str) -> ChildGuard {
    let child = Command::new(BIN)
        .arg("serve")
        .arg("--config")
        .arg(props)
        .arg("--set")
        .arg(format!(
            "admin.listener=127.0.0.1:{}",
            free_port().expect("a free port")
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting gregor");
    let mut guard = ChildGuard::new("gregor", child);
    wait_for_broker(bootstrap.parse().expect("an address"), 60_000, || {
        guard.check_alive()
    })
    .expect("gregor answers ApiVersions");
    guard
}

fn stop_gregor(mut guard: ChildGuard) {
    let status = guard.stop().expect("stopping gregor");
    assert!(
        status.is_some_and(|s| s.success()),
        "gregor exited with {status:?}"
    );
}

/// Every record of `TOPIC` from the start of its 3 partitions, as "key=value".
fn read_all(bootstrap: &str) -> Vec<String> {
    let consumer: BaseConsumer = clients::consumer(
        bootstrap,
        &[
            ("group.id", "interchange-reader"),
            ("enable.auto.commit", "false"),
        ],
    )
    .expect("a consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..3 {
        tpl.add_partition_offset(TOPIC, p, Offset::Beginning)
            .expect("partition");
    }
    consumer.assign(&tpl).expect("assign");
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while got.len() < RECORDS && Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(500)) {
            got.push(format!(
                "{}={}",
                String::from_utf8_lossy(m.key().unwrap_or_default()),
                String::from_utf8_lossy(m.payload().unwrap_or_default())
            ));
        }
    }
    got.sort();
    got
}

fn expected() -> Vec<String> {
    let mut v: Vec<String> = (0..RECORDS).map(|i| format!("k{i}=v{i}")).collect();
    v.sort();
    v
}

/// The `.log` segments of `__cluster_metadata-0`, in offset order.
fn segments(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .expect("the metadata dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    v.sort();
    v
}

fn segments_len(dir: &Path) -> u64 {
    segments(dir)
        .iter()
        .map(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
        .sum()
}

/// `kafka-dump-log --cluster-metadata-decoder` of every segment, concatenated.
fn dump_segments(dir: &Path) -> String {
    segments(dir)
        .iter()
        .map(|p| reference::dump_cluster_metadata(p).expect("kafka-dump-log decodes the segment"))
        .collect()
}

fn kafka_topics(bootstrap: &str, args: &[&str]) -> String {
    let mut all = vec!["--bootstrap-server", bootstrap];
    all.extend_from_slice(args);
    reference::tool_output("kafka-topics", &all).expect("kafka-topics")
}

#[test]
fn gregor_and_kafka_take_turns_on_one_data_directory() {
    if !reference::jars_or_skip() {
        return;
    }
    let port = free_port().expect("a free port");
    let data = tempfile::tempdir().expect("a data dir");
    let instance = Instance::new(port, None, Some(data.path().join("logs"))).expect("instance");
    instance.format().expect("kafka-storage format");
    let props = instance.dir.join("server.properties");
    let bootstrap = instance.bootstrap();

    // 1. gregor on Kafka's formatted storage and configuration.
    let gregor = start_gregor(&props, &bootstrap);
    create_topic_with(&bootstrap, TOPIC, 3, &[("retention.ms", "86400000")])
        .expect("gregor creates the topic");
    let producer = clients::producer(&bootstrap, &[("acks", "all")]).expect("a producer");
    for i in 0..RECORDS {
        let (k, v) = (format!("k{i}"), format!("v{i}"));
        let p = i32::try_from(i % 3).expect("small");
        producer
            .send(BaseRecord::to(TOPIC).key(&k).payload(&v).partition(p))
            .map_err(|(e, _)| e)
            .expect("send");
    }
    producer
        .flush(Duration::from_secs(30))
        .expect("records acknowledged");
    drop(producer);
    assert_eq!(
        read_all(&bootstrap),
        expected(),
        "gregor serves its records"
    );
    stop_gregor(gregor);

    let metadata_dir = instance.data_dir.join("__cluster_metadata-0");
    let dump = dump_segments(&metadata_dir);
    for needle in [
        "\"type\":\"TOPIC_RECORD\"",
        &format!("\"name\":\"{TOPIC}\""),
        "\"type\":\"PARTITION_RECORD\"",
        "\"type\":\"CONFIG_RECORD\"",
        "\"type\":\"REGISTER_BROKER_RECORD\"",
        "LeaderChange",
    ] {
        assert!(dump.contains(needle), "no {needle} in:\n{dump}");
    }
    let before_kafka = segments_len(&metadata_dir);

    // 2. Kafka on what gregor left.
    let child = instance.start().expect("starting Kafka");
    let mut kafka = ChildGuard::new("kafka", child);
    instance
        .wait_ready(|| kafka.check_alive())
        .expect("Kafka starts on gregor's directory");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = kafka_topics(&bootstrap, &["--describe", "--topic", TOPIC]);
        if out.contains("PartitionCount: 3") && out.contains("retention.ms=86400000") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Kafka does not describe {TOPIC} as gregor created it:\n{out}\n{}",
            gregor_tests::process::tail(&instance.server_log(), 40)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(
        read_all(&bootstrap),
        expected(),
        "Kafka serves the records gregor stored"
    );
    kafka.stop().expect("stopping Kafka");
    let after_kafka = segments_len(&metadata_dir);
    assert!(
        after_kafka > before_kafka,
        "Kafka appended its own metadata"
    );

    // 3. gregor again, after Kafka's batches.
    let gregor = start_gregor(&props, &bootstrap);
    assert_eq!(
        read_all(&bootstrap),
        expected(),
        "gregor serves the records after Kafka ran"
    );
    create_topic_with(&bootstrap, "after-kafka", 1, &[]).expect("gregor creates another topic");
    stop_gregor(gregor);
    let dump = dump_segments(&metadata_dir);
    assert!(dump.contains("\"name\":\"after-kafka\""), "{dump}");
}
