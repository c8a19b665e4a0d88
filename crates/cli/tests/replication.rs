//! The leader side of partition replication on a gregor cluster (issue 11): one controller and
//! three brokers, a topic with replication factor 3 and `min.insync.replicas=2`. A follower
//! stopped with SIGSTOP leaves the ISR after `replica.lag.time.max.ms` (the leader's
//! AlterPartition, not fencing: the session timeout is far longer), acks=all still works with
//! two in-sync replicas, fails with NOT_ENOUGH_REPLICAS (19) once both followers are stopped and
//! the ISR is the leader alone, and the followers rejoin the ISR after SIGCONT.
//!
//! `cargo test -p gregor --test replication -- --nocapture --test-threads=1`

use std::time::{Duration, Instant};

use bytes::Bytes;
use gregor_protocol::batch::BatchBuilder;
use gregor_tests::cluster::{Cluster, ClusterConfig, Implementation, Layout};
use gregor_tests::reference::tool_output;
use gregor_tests::wire::{sb, KafkaConn};
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, CreateTopicsRequest, CreateTopicsResponse, MetadataRequest, MetadataResponse,
    ProduceRequest, ProduceResponse, TopicName,
};

const TOPIC: &str = "replicated";
const LAG_MS: u64 = 2_000;
const NOT_ENOUGH_REPLICAS: i16 = 19;

fn config() -> ClusterConfig {
    ClusterConfig {
        implementation: Implementation::Gregor(env!("CARGO_BIN_EXE_gregor").into()),
        layout: Layout::Split {
            controllers: 1,
            brokers: 3,
        },
        properties: Vec::new(),
        node_implementations: Vec::new(),
        controller_format_args: Vec::new(),
    }
    .with("replica.lag.time.max.ms", &LAG_MS.to_string())
    // Stopped brokers stay registered and unfenced for the whole test: the ISR changes come
    // from the leader, not from the controller fencing them.
    .with("broker.session.timeout.ms", "120000")
    .with("broker.heartbeat.interval.ms", "500")
    .with("replica.fetch.backoff.ms", "200")
}

fn conn(bootstrap: &str) -> anyhow::Result<KafkaConn> {
    KafkaConn::connect_timeout(
        bootstrap.parse()?,
        Duration::from_secs(5),
        "replication-test",
    )
}

fn create_topic(bootstrap: &str) {
    let req = CreateTopicsRequest::default()
        .with_timeout_ms(30_000)
        .with_topics(vec![CreatableTopic::default()
            .with_name(TopicName(sb(TOPIC)))
            .with_num_partitions(1)
            .with_replication_factor(3)
            .with_configs(vec![CreatableTopicConfig::default()
                .with_name(sb("min.insync.replicas"))
                .with_value(Some(sb("2")))])]);
    let r: CreateTopicsResponse = conn(bootstrap)
        .and_then(|mut c| c.call(ApiKey::CreateTopics, 7, &req))
        .expect("CreateTopics answered");
    assert_eq!(r.topics[0].error_code, 0, "{r:?}");
}

/// (leader, ISR sorted, offline replicas) of partition 0 as `bootstrap` sees it.
fn partition_state(bootstrap: &str) -> Option<(i32, Vec<i32>, Vec<i32>)> {
    let req = MetadataRequest::default()
        .with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(TopicName(sb(TOPIC))))
        ]))
        .with_allow_auto_topic_creation(false);
    let m: MetadataResponse = conn(bootstrap)
        .ok()?
        .call(ApiKey::Metadata, 12, &req)
        .ok()?;
    let p = m.topics.first()?.partitions.first()?;
    let mut isr: Vec<i32> = p.isr_nodes.iter().map(|b| b.0).collect();
    isr.sort_unstable();
    (p.error_code == 0 && p.leader_id.0 >= 0).then(|| {
        (
            p.leader_id.0,
            isr,
            p.offline_replicas.iter().map(|b| b.0).collect(),
        )
    })
}

/// The ISR of partition 0 as Kafka 4.4's `kafka-topics --describe` prints it (`Isr: 4,3`),
/// sorted; None when the tool printed no partition line.
fn describe_isr(bootstrap: &str) -> Option<Vec<i32>> {
    // The admin client sends its Metadata request to any broker it knows, a stopped one too;
    // a short request timeout moves it on to another broker in seconds instead of 30.
    let admin = tempfile::NamedTempFile::new().expect("admin config file");
    std::fs::write(admin.path(), "request.timeout.ms=3000\n").expect("admin config");
    let admin_path = admin.path().display().to_string();
    let out = tool_output(
        "kafka-topics",
        &[
            "--bootstrap-server",
            bootstrap,
            "--command-config",
            &admin_path,
            "--describe",
            "--topic",
            TOPIC,
        ],
    )
    .expect("kafka-topics");
    let line = out.lines().find(|l| l.contains("Partition: 0"))?;
    let isr = line
        .split('\t')
        .find_map(|f| f.trim().strip_prefix("Isr: "))?;
    let mut ids: Vec<i32> = isr
        .split(',')
        .filter_map(|i| i.trim().parse().ok())
        .collect();
    ids.sort_unstable();
    Some(ids)
}

/// One batch of 5 records to partition 0 with `acks`: the base offset or the error code.
fn produce(bootstrap: &str, acks: i16, tag: &str) -> Result<i64, i16> {
    let mut c = conn(bootstrap).map_err(|_| -1i16)?;
    let mut b = BatchBuilder::new(0, 1_000);
    for r in 0..5 {
        let value = format!("{tag}-{r}");
        b = b.record(1_000, None, Some(value.as_bytes()), &[]);
    }
    let req = ProduceRequest::default()
        .with_acks(acks)
        .with_timeout_ms(15_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(sb(TOPIC)))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(0)
                .with_records(Some(Bytes::from(b.build())))])]);
    let resp: ProduceResponse = c.call(ApiKey::Produce, 9, &req).map_err(|_| -1i16)?;
    let p = &resp.responses[0].partition_responses[0];
    if p.error_code != 0 {
        return Err(p.error_code);
    }
    Ok(p.base_offset)
}

#[test]
fn the_isr_shrinks_for_stopped_followers_and_grows_back_and_acks_all_needs_min_isr() {
    let mut cluster = Cluster::start(&config()).unwrap_or_else(|e| panic!("{e:#}"));
    let brokers = cluster.broker_ids();
    assert_eq!(brokers.len(), 3, "{brokers:?}");
    let b0 = cluster
        .node(brokers[0])
        .bootstrap()
        .expect("broker listener");
    create_topic(&b0);
    let all: Vec<i32> = {
        let mut b = brokers.clone();
        b.sort_unstable();
        b
    };
    let (leader, _, _) = cluster.wait_for(Duration::from_secs(30), "ISR of three", || {
        partition_state(&b0).filter(|(_, isr, _)| *isr == all)
    });
    let lb = cluster.node(leader).bootstrap().expect("leader listener");
    let followers: Vec<i32> = all.iter().copied().filter(|b| *b != leader).collect();
    // The leader itself must have applied the topic before it takes records.
    cluster.wait_for(Duration::from_secs(30), "the leader's own view", || {
        partition_state(&lb).filter(|(l, isr, _)| *l == leader && *isr == all)
    });
    assert_eq!(produce(&lb, -1, "all-in-sync"), Ok(0));

    // One follower stops and the leader takes a batch it will not fetch: it leaves the ISR
    // once it lags replica.lag.time.max.ms (a follower with the leader's log end offset is
    // never out of sync, Kafka's `isCaughtUp`); acks=all goes on with two in-sync replicas.
    cluster.node_mut(followers[0]).pause().unwrap();
    let stopped = Instant::now();
    assert_eq!(produce(&lb, 1, "lag-1"), Ok(5));
    let expected: Vec<i32> = {
        let mut v = vec![leader, followers[1]];
        v.sort_unstable();
        v
    };
    cluster.wait_for(
        Duration::from_secs(30),
        "the ISR without the stopped follower",
        || partition_state(&lb).filter(|(_, isr, _)| *isr == expected),
    );
    let shrink_ms = stopped.elapsed().as_millis();
    println!("ISR shrank {shrink_ms} ms after SIGSTOP (replica.lag.time.max.ms {LAG_MS})");
    assert!(
        shrink_ms >= u128::from(LAG_MS),
        "not before the lag time: {shrink_ms} ms"
    );
    // Kafka's own tool sees the same ISR. Its admin client asks any broker for Metadata, and
    // a broker shows the change once it applied the committed record: wait for that.
    cluster.wait_for(
        Duration::from_secs(30),
        "kafka-topics showing the ISR",
        || describe_isr(&lb).filter(|isr| *isr == expected),
    );
    assert_eq!(produce(&lb, -1, "two-in-sync"), Ok(10));

    // Both followers stopped: the ISR is the leader alone, below min.insync.replicas.
    cluster.node_mut(followers[1]).pause().unwrap();
    assert_eq!(produce(&lb, 1, "lag-2"), Ok(15));
    cluster.wait_for(
        Duration::from_secs(30),
        "the ISR of the leader alone",
        || partition_state(&lb).filter(|(_, isr, _)| *isr == vec![leader]),
    );
    assert_eq!(produce(&lb, -1, "alone"), Err(NOT_ENOUGH_REPLICAS));
    // acks=1 is still taken (Kafka checks min ISR for acks=all only).
    assert_eq!(produce(&lb, 1, "acks-one"), Ok(20));

    // Both come back, catch up and rejoin.
    for f in &followers {
        cluster.node_mut(*f).resume().unwrap();
    }
    let resumed = Instant::now();
    cluster.wait_for(Duration::from_secs(30), "the ISR of three again", || {
        partition_state(&lb).filter(|(_, isr, _)| *isr == all)
    });
    println!(
        "ISR of three again {} ms after SIGCONT",
        resumed.elapsed().as_millis()
    );
    assert_eq!(produce(&lb, -1, "back"), Ok(25));
    let (_, _, offline) = partition_state(&lb).expect("metadata");
    assert!(offline.is_empty(), "no offline replica: {offline:?}");
}
