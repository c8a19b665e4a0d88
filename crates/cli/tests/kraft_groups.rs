//! Consumer groups on three combined gregor nodes: FindCoordinator names the leader of the
//! group's `__consumer_offsets` partition from whichever node is asked, and a group consumes
//! every record of a topic whose partitions are led by the three brokers, commits, and a new
//! member of the group resumes at the committed offsets.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use gregor_protocol::kafka_protocol::messages::{
    ApiKey, FindCoordinatorRequest, FindCoordinatorResponse,
};
use gregor_protocol::kafka_protocol::protocol::StrBytes;
use gregor_tests::clients::{self, create_topic};
use gregor_tests::cluster::{Cluster, ClusterConfig, Implementation};
use gregor_tests::wire::KafkaConn;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::{BaseRecord, Producer};
use rdkafka::Message;

const BIN: &str = env!("CARGO_BIN_EXE_gregor");
const TOPIC: &str = "grouped";
const RECORDS: usize = 30;

fn find_coordinator(bootstrap: &str, group: &str) -> FindCoordinatorResponse {
    let addr = bootstrap.parse().expect("an address");
    let mut conn =
        KafkaConn::connect_timeout(addr, Duration::from_secs(30), "kraft-groups").expect("connect");
    conn.call(
        ApiKey::FindCoordinator,
        4,
        &FindCoordinatorRequest::default()
            .with_key_type(0)
            .with_coordinator_keys(vec![StrBytes::from_string(group.to_string())]),
    )
    .expect("FindCoordinator")
}

fn consume(bootstrap: &str, group: &str, want: usize) -> Vec<String> {
    let consumer: BaseConsumer = clients::consumer(
        bootstrap,
        &[
            ("group.id", group),
            ("auto.offset.reset", "earliest"),
            ("enable.auto.commit", "false"),
        ],
    )
    .expect("a consumer");
    consumer.subscribe(&[TOPIC]).expect("subscribe");
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while got.len() < want && Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(500)) {
            got.push(String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned());
        }
    }
    if want > 0 {
        consumer
            .commit_consumer_state(CommitMode::Sync)
            .expect("offsets committed");
    } else {
        // Nothing left: a short poll must bring nothing.
        let until = Instant::now() + Duration::from_secs(3);
        while Instant::now() < until {
            if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
                got.push(String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned());
            }
        }
    }
    got
}

#[test]
fn a_group_consumes_and_commits_across_three_brokers() {
    let cluster = Cluster::start(&ClusterConfig::combined(
        Implementation::Gregor(PathBuf::from(BIN)),
        3,
    ))
    .unwrap_or_else(|e| panic!("{e:#}"));
    let bootstrap = cluster.bootstrap();
    create_topic(&bootstrap, TOPIC, 3).expect("topic");

    // The same coordinator, at a live broker's endpoint, from every node.
    let group = "kraft-group";
    let mut coordinators = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    for n in cluster.nodes() {
        let b = n.bootstrap().expect("broker listener");
        loop {
            let r = find_coordinator(&b, group);
            let c = &r.coordinators[0];
            if c.error_code == 0 {
                coordinators.insert((c.node_id.0, c.host.to_string(), c.port));
                break;
            }
            assert!(Instant::now() < deadline, "FindCoordinator at {b}: {c:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    assert_eq!(coordinators.len(), 1, "{coordinators:?}");
    let (node, host, port) = coordinators.into_iter().next().expect("one");
    let expected = cluster
        .node(node)
        .bootstrap()
        .expect("the coordinator's listener");
    assert_eq!(format!("{host}:{port}"), expected);

    let producer = clients::producer(&bootstrap, &[("acks", "all")]).expect("producer");
    for i in 0..RECORDS {
        let v = format!("v{i}");
        let p = i32::try_from(i % 3).expect("small");
        producer
            .send(BaseRecord::<(), _>::to(TOPIC).payload(&v).partition(p))
            .map_err(|(e, _)| e)
            .expect("send");
    }
    producer
        .flush(Duration::from_secs(30))
        .expect("acknowledged");

    let mut got = consume(&bootstrap, group, RECORDS);
    got.sort();
    let mut want: Vec<String> = (0..RECORDS).map(|i| format!("v{i}")).collect();
    want.sort();
    assert_eq!(got, want);
    // A new member of the group starts at the committed offsets: nothing left to read.
    let rest = consume(&bootstrap, group, 0);
    assert!(rest.is_empty(), "read again after the commit: {rest:?}");
}
