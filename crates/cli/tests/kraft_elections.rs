//! Leader elections (KIP-460) and replica reassignments (KIP-455) on a 3-node gregor cluster,
//! driven by Apache Kafka 4.4.0's own tools (`LeaderElectionCommand`,
//! `ReassignPartitionsCommand`) through a broker, which forwards to the active controller:
//!
//! - a preferred election where the preferred replica leads is ELECTION_NOT_NEEDED; once the
//!   partition lost its ISR (follower, then leader stopped) the preferred replica is not
//!   available, and an unclean election makes the live out-of-ISR replica the leader (at once,
//!   without the tool, for a topic with `unclean.leader.election.enable=true`);
//! - `--execute` starts a reassignment that `--list` and `--verify` show in progress (adding
//!   and removing replicas; it cannot complete before the broker-side replica fetchers land),
//!   `--cancel` reverts it, and a reassignment that only drops a replica completes at once
//!   (`--execute` reads the current assignment with DescribeLogDirs; `--verify` and `--cancel`
//!   clear the replication throttles, KIP-73, see `replication_throttle.rs`).
//!
//! `cargo test -p gregor --test kraft_elections -- --nocapture` (needs `cargo xtask kafka`).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use gregor_tests::cluster::{Cluster, ClusterConfig, Implementation};
use gregor_tests::reference::tool_output;
use gregor_tests::wire::{sb, KafkaConn};
use kafka_protocol::messages::describe_topic_partitions_request::TopicRequest;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    ApiKey, BrokerId, DescribeClusterRequest, DescribeClusterResponse,
    DescribeTopicPartitionsRequest, DescribeTopicPartitionsResponse, MetadataRequest,
    MetadataResponse, TopicName,
};

const LEADER_ELECTION: &str = "org.apache.kafka.tools.LeaderElectionCommand";
const REASSIGN: &str = "org.apache.kafka.tools.reassign.ReassignPartitionsCommand";

fn gregor() -> Implementation {
    Implementation::Gregor(env!("CARGO_BIN_EXE_gregor").into())
}

fn start() -> Cluster {
    start_with_session_timeout(3000)
}

/// A 3-node cluster whose brokers are fenced `session_timeout_ms` after their last heartbeat.
fn start_with_session_timeout(session_timeout_ms: u64) -> Cluster {
    Cluster::start(
        &ClusterConfig::combined(gregor(), 3)
            .with("broker.session.timeout.ms", &session_timeout_ms.to_string())
            .with("broker.heartbeat.interval.ms", "500"),
    )
    .expect("a 3-node cluster")
}

/// A connection to the broker at `bootstrap` (host:port).
fn connect(bootstrap: &str) -> anyhow::Result<KafkaConn> {
    let addr: SocketAddr = bootstrap.parse()?;
    KafkaConn::connect_timeout(addr, Duration::from_secs(10), "elections")
}

/// Broker ids as numbers.
fn ids(brokers: &[BrokerId]) -> Vec<i32> {
    brokers.iter().map(|b| b.0).collect()
}

/// (leader, replicas, ISR) of partition 0 of `topic`, from the broker at `bootstrap`.
fn partition(bootstrap: &str, topic: &str) -> (i32, Vec<i32>, Vec<i32>) {
    let mut conn = connect(bootstrap).expect("connect");
    let m: MetadataResponse = conn
        .call(
            ApiKey::Metadata,
            12,
            &MetadataRequest::default().with_topics(Some(vec![
                MetadataRequestTopic::default().with_name(Some(TopicName(sb(topic))))
            ])),
        )
        .expect("Metadata");
    let p = &m.topics[0].partitions[0];
    (p.leader_id.0, ids(&p.replica_nodes), ids(&p.isr_nodes))
}

/// What the controller committed for partition 0 of `topic` (DescribeTopicPartitions: leader,
/// leader epoch, ISR, ELR and last known ELR, KIP-966) and which brokers are fenced
/// (DescribeCluster v2), on one line: for the message of a failed assertion, which is all CI
/// keeps of it.
fn state(bootstrap: &str, topic: &str) -> String {
    let describe = || -> anyhow::Result<String> {
        let mut conn = connect(bootstrap)?;
        let d: DescribeTopicPartitionsResponse = conn.call(
            ApiKey::DescribeTopicPartitions,
            0,
            &DescribeTopicPartitionsRequest::default()
                .with_topics(vec![TopicRequest::default().with_name(TopicName(sb(topic)))])
                .with_response_partition_limit(1),
        )?;
        let c: DescribeClusterResponse = conn.call(
            ApiKey::DescribeCluster,
            2,
            &DescribeClusterRequest::default().with_include_fenced_brokers(true),
        )?;
        let partitions: Vec<String> = d
            .topics
            .iter()
            .flat_map(|t| &t.partitions)
            .map(|p| {
                format!(
                    "leader {} epoch {} ISR {:?} ELR {:?} last known ELR {:?}",
                    p.leader_id.0,
                    p.leader_epoch,
                    ids(&p.isr_nodes),
                    p.eligible_leader_replicas.as_deref().map(ids),
                    p.last_known_elr.as_deref().map(ids),
                )
            })
            .collect();
        let brokers: Vec<String> = c
            .brokers
            .iter()
            .map(|b| {
                format!(
                    "{}{}",
                    b.broker_id.0,
                    if b.is_fenced { " fenced" } else { "" }
                )
            })
            .collect();
        Ok(format!(
            "{topic}-0: {}; brokers {} (controller {})",
            partitions.join(", "),
            brokers.join(", "),
            c.controller_id.0
        ))
    };
    describe().unwrap_or_else(|e| format!("{topic}-0: not described: {e:#}"))
}

/// Waits until `check` holds for partition 0 of `topic` as seen from `bootstrap`.
fn wait_partition(
    bootstrap: &str,
    topic: &str,
    what: &str,
    check: impl Fn(&(i32, Vec<i32>, Vec<i32>)) -> bool,
) -> (i32, Vec<i32>, Vec<i32>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let p = partition(bootstrap, topic);
        if check(&p) {
            return p;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: partition is {p:?}; {}",
            state(bootstrap, topic)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn create(bootstrap: &str, topic: &str, assignment: &str) {
    create_with(bootstrap, topic, assignment, &[]);
}

fn create_with(bootstrap: &str, topic: &str, assignment: &str, configs: &[&str]) {
    let mut args = vec![
        "--bootstrap-server",
        bootstrap,
        "--create",
        "--topic",
        topic,
        "--replica-assignment",
        assignment,
    ];
    for c in configs {
        args.push("--config");
        args.push(c);
    }
    let out = tool_output("kafka-topics", &args).expect("kafka-topics");
    assert!(out.contains(&format!("Created topic {topic}")), "{out}");
}

fn elect(bootstrap: &str, election_type: &str, topic: &str) -> String {
    tool_output(
        LEADER_ELECTION,
        &[
            "--bootstrap-server",
            bootstrap,
            "--election-type",
            election_type,
            "--topic",
            topic,
            "--partition",
            "0",
        ],
    )
    .expect("kafka-leader-election")
}

#[test]
fn kafka_leader_election_preferred_and_unclean() {
    let mut cluster = start();
    let b3 = cluster.node(3).bootstrap().expect("broker 3");
    create(&b3, "elect", "1:2");
    create_with(&b3, "auto", "1:2", &["unclean.leader.election.enable=true"]);
    assert_eq!(partition(&b3, "elect"), (1, vec![1, 2], vec![1, 2]));

    let out = elect(&b3, "PREFERRED", "elect");
    assert!(
        out.contains("Valid replica already elected for partitions elect-0"),
        "{out}"
    );
    let out = elect(&b3, "UNCLEAN", "elect");
    assert!(
        out.contains("Valid replica already elected for partitions elect-0"),
        "{out}"
    );

    // Broker 2 stops (controlled shutdown: it leaves the ISR), then the leader 1: no ISR
    // member is left and the partition has no leader. Broker 2 comes back out of the ISR
    // (its partition has no leader to fetch from, so it cannot catch up and rejoin): the topic
    // with unclean.leader.election.enable gets it as leader at once, the other stays
    // leaderless.
    cluster.node_mut(2).stop().expect("stop 2");
    wait_partition(&b3, "elect", "2 out of the ISR", |p| p.2 == vec![1]);
    cluster.node_mut(1).stop().expect("stop 1");
    wait_partition(&b3, "elect", "no leader", |p| p.0 == -1);
    eprintln!("leaderless: {}", state(&b3, "elect"));
    cluster.node_mut(2).spawn().expect("restart 2");
    cluster
        .node_mut(2)
        .wait_listening(Duration::from_secs(60))
        .expect("2 is back");
    let p = wait_partition(&b3, "auto", "unclean election by config", |p| p.0 == 2);
    assert_eq!(
        partition(&b3, "elect").0,
        -1,
        "no clean leader for elect-0; {}; {}",
        state(&b3, "elect"),
        state(&b3, "auto")
    );
    assert_eq!(p.2, vec![2]);

    let out = elect(&b3, "PREFERRED", "elect");
    assert!(
        out.contains("elect-0") && out.contains("PreferredLeaderNotAvailableException"),
        "{out}"
    );
    let out = elect(&b3, "UNCLEAN", "elect");
    assert!(
        out.contains("Successfully completed leader election (UNCLEAN) for partitions elect-0"),
        "{out}"
    );
    let p = wait_partition(&b3, "elect", "2 leads", |p| p.0 == 2);
    assert_eq!(
        p.2,
        vec![2],
        "an unclean election leaves the leader alone in the ISR"
    );

    let out = tool_output(
        LEADER_ELECTION,
        &[
            "--bootstrap-server",
            &b3,
            "--election-type",
            "PREFERRED",
            "--topic",
            "nope",
            "--partition",
            "0",
        ],
    )
    .expect("kafka-leader-election");
    assert!(out.contains("UnknownTopicOrPartitionException"), "{out}");
}

fn reassign(bootstrap: &str, action: &str, json: Option<&str>) -> String {
    let dir = tempfile::tempdir().expect("a temp dir");
    let file = dir.path().join("reassignment.json");
    let mut args = vec!["--bootstrap-server".to_string(), bootstrap.to_string()];
    if let Some(json) = json {
        std::fs::write(&file, json).expect("write the plan");
        args.push("--reassignment-json-file".into());
        args.push(file.display().to_string());
    }
    args.push(format!("--{action}"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    tool_output(REASSIGN, &args).expect("kafka-reassign-partitions")
}

#[test]
fn kafka_reassign_partitions_execute_list_verify_cancel() {
    // A stopped (SIGSTOP) broker stays registered and unfenced for the whole test: the tool
    // refuses a reassignment to a broker it does not see.
    let mut cluster = start_with_session_timeout(120_000);
    let b1 = cluster.node(1).bootstrap().expect("broker 1");
    create(&b1, "move", "1:2");
    let plan = r#"{"version":1,"partitions":[{"topic":"move","partition":0,"replicas":[3,2]}]}"#;

    let out = reassign(&b1, "list", None);
    assert!(out.contains("No partition reassignments found"), "{out}");
    // Broker 3 is stopped (SIGSTOP), so the replica it adds cannot catch up and the
    // reassignment stays in progress until it is cancelled.
    cluster.node_mut(3).pause().expect("SIGSTOP broker 3");
    let out = reassign(&b1, "execute", Some(plan));
    assert!(
        out.contains("Successfully started partition reassignment for move-0"),
        "{out}"
    );
    assert_eq!(partition(&b1, "move").1, vec![3, 2, 1]);
    let out = reassign(&b1, "list", None);
    assert!(
        out.contains("move-0: replicas: 3,2,1. adding: 3. removing: 1."),
        "{out}"
    );
    let out = reassign(&b1, "verify", Some(plan));
    assert!(
        out.contains("Reassignment of partition move-0 is still in progress"),
        "{out}"
    );
    let out = reassign(&b1, "cancel", Some(plan));
    assert!(
        out.contains("Successfully cancelled partition reassignment for: move-0"),
        "{out}"
    );
    assert_eq!(partition(&b1, "move").1, vec![2, 1]);
    let out = reassign(&b1, "list", None);
    assert!(out.contains("No partition reassignments found"), "{out}");

    // With broker 3 running, the same plan completes: 3 fetches the partition, joins the ISR,
    // and broker 1 leaves the replicas.
    cluster.node_mut(3).resume().expect("SIGCONT broker 3");
    let out = reassign(&b1, "execute", Some(plan));
    assert!(
        out.contains("Successfully started partition reassignment for move-0"),
        "{out}"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let out = reassign(&b1, "verify", Some(plan));
        if out.contains("Reassignment of partition move-0 is completed") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the reassignment to [3, 2] did not complete: {out}"
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    let (_, replicas, isr) = partition(&b1, "move");
    assert_eq!(replicas, vec![3, 2]);
    assert!(isr.contains(&3) && !isr.contains(&1), "ISR {isr:?}");

    // Dropping a replica needs no new one to catch up: done at once, and the leader moves off
    // the removed replica.
    let drop = r#"{"version":1,"partitions":[{"topic":"move","partition":0,"replicas":[2]}]}"#;
    let out = reassign(&b1, "execute", Some(drop));
    assert!(
        out.contains("Successfully started partition reassignment for move-0"),
        "{out}"
    );
    let (leader, replicas, isr) = partition(&b1, "move");
    assert_eq!((leader, replicas, isr), (2, vec![2], vec![2]));
    let out = reassign(&b1, "verify", Some(drop));
    assert!(
        out.contains("Reassignment of partition move-0 is completed"),
        "{out}"
    );
}
