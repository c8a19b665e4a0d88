//! The controller side of partition replication over the wire, against a running gregor node
//! (one combined node; the test registers a second, simulated broker with BrokerRegistration
//! and BrokerHeartbeat on the controller listener, as a real broker would, and leads a
//! partition as it): AlterPartition v2 and v3 (KIP-497, KIP-903) shrink and expand the ISR of
//! a partition this broker leads, and the change is visible in Metadata; a new ISR member with
//! another broker epoch is INELIGIBLE_REPLICA, a stale sender epoch STALE_BROKER_EPOCH; the
//! controller listener advertises AlterPartition 2-3.
//!
//! `cargo test -p gregor --test kraft_replication_control -- --nocapture`

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use gregor_tests::cluster::{Cluster, ClusterConfig, Implementation};
use gregor_tests::wire::{sb, KafkaConn};
use kafka_protocol::messages::alter_partition_request::{BrokerState, PartitionData, TopicData};
use kafka_protocol::messages::broker_registration_request::{Feature, Listener};
use kafka_protocol::messages::create_topics_request::{CreatableReplicaAssignment, CreatableTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    AlterPartitionRequest, AlterPartitionResponse, ApiKey, ApiVersionsRequest, ApiVersionsResponse,
    BrokerHeartbeatRequest, BrokerHeartbeatResponse, BrokerId, BrokerRegistrationRequest,
    BrokerRegistrationResponse, CreateTopicsRequest, CreateTopicsResponse, DescribeClusterRequest,
    DescribeClusterResponse, MetadataRequest, MetadataResponse, TopicName,
};
use uuid::Uuid;

/// The simulated broker's id.
const FAKE_BROKER: i32 = 2;

fn gregor() -> Implementation {
    Implementation::Gregor(env!("CARGO_BIN_EXE_gregor").into())
}

fn conn(endpoint: &str) -> KafkaConn {
    let addr: SocketAddr = endpoint.parse().expect("an address");
    KafkaConn::connect_timeout(addr, Duration::from_secs(30), "replication-control")
        .expect("connect")
}

/// The feature ranges a Kafka 4.4 broker registers.
fn features() -> Vec<Feature> {
    [
        ("eligible.leader.replicas.version", 0, 1),
        ("group.version", 0, 1),
        ("kraft.version", 0, 1),
        ("metadata.version", 7, 33),
        ("share.version", 0, 2),
        ("streams.version", 0, 1),
        ("transaction.version", 0, 2),
    ]
    .into_iter()
    .map(|(name, min, max)| {
        Feature::default()
            .with_name(sb(name))
            .with_min_supported_version(min)
            .with_max_supported_version(max)
    })
    .collect()
}

fn heartbeat(controller: &mut KafkaConn, epoch: i64) -> BrokerHeartbeatResponse {
    controller
        .call(
            ApiKey::BrokerHeartbeat,
            1,
            &BrokerHeartbeatRequest::default()
                .with_broker_id(BrokerId(FAKE_BROKER))
                .with_broker_epoch(epoch)
                .with_current_metadata_offset(epoch),
        )
        .expect("BrokerHeartbeat")
}

fn partition_state(bootstrap: &str, topic: &str) -> (i32, i32, Vec<i32>, Uuid) {
    let m: MetadataResponse = conn(bootstrap)
        .call(
            ApiKey::Metadata,
            12,
            &MetadataRequest::default().with_topics(Some(vec![
                MetadataRequestTopic::default().with_name(Some(TopicName(sb(topic))))
            ])),
        )
        .expect("Metadata");
    let t = &m.topics[0];
    assert_eq!(t.error_code, 0, "{m:?}");
    let p = &t.partitions[0];
    (
        p.leader_id.0,
        p.leader_epoch,
        p.isr_nodes.iter().map(|b| b.0).collect(),
        t.topic_id,
    )
}

/// An AlterPartition of partition 0 of `topic_id` from the simulated broker.
fn alter(
    controller: &mut KafkaConn,
    version: i16,
    broker_epoch: i64,
    topic_id: Uuid,
    (leader_epoch, partition_epoch): (i32, i32),
    isr: &[(i32, i64)],
) -> AlterPartitionResponse {
    let mut p = PartitionData::default()
        .with_partition_index(0)
        .with_leader_epoch(leader_epoch)
        .with_partition_epoch(partition_epoch);
    if version >= 3 {
        p = p.with_new_isr_with_epochs(
            isr.iter()
                .map(|(id, e)| {
                    BrokerState::default()
                        .with_broker_id(BrokerId(*id))
                        .with_broker_epoch(*e)
                })
                .collect(),
        );
    } else {
        p = p.with_new_isr(isr.iter().map(|(id, _)| BrokerId(*id)).collect());
    }
    controller
        .call(
            ApiKey::AlterPartition,
            version,
            &AlterPartitionRequest::default()
                .with_broker_id(BrokerId(FAKE_BROKER))
                .with_broker_epoch(broker_epoch)
                .with_topics(vec![TopicData::default()
                    .with_topic_id(topic_id)
                    .with_partitions(vec![p])]),
        )
        .expect("AlterPartition")
}

#[test]
fn alter_partition_over_the_wire_changes_the_isr_of_a_partition() {
    let cluster = Cluster::start(&ClusterConfig::combined(gregor(), 1)).expect("cluster");
    let node = &cluster.nodes()[0];
    let bootstrap = node.bootstrap().expect("a broker");
    let mut controller = conn(&node.controller_endpoint().expect("a controller"));

    let versions: ApiVersionsResponse = controller
        .call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default())
        .expect("ApiVersions");
    let alter_partition = versions
        .api_keys
        .iter()
        .find(|k| k.api_key == ApiKey::AlterPartition as i16)
        .expect("AlterPartition advertised");
    assert_eq!(
        (alter_partition.min_version, alter_partition.max_version),
        (2, 3)
    );

    // Register broker 2 and heartbeat until it is unfenced.
    let cluster_id: DescribeClusterResponse = controller
        .call(
            ApiKey::DescribeCluster,
            1,
            &DescribeClusterRequest::default().with_endpoint_type(2),
        )
        .expect("DescribeCluster");
    let registration: BrokerRegistrationResponse = controller
        .call(
            ApiKey::BrokerRegistration,
            4,
            &BrokerRegistrationRequest::default()
                .with_broker_id(BrokerId(FAKE_BROKER))
                .with_cluster_id(cluster_id.cluster_id.clone())
                .with_incarnation_id(Uuid::new_v4())
                .with_listeners(vec![Listener::default()
                    .with_name(sb("PLAINTEXT"))
                    .with_host(sb("127.0.0.1"))
                    .with_port(9)
                    .with_security_protocol(0)])
                .with_features(features())
                .with_log_dirs(vec![Uuid::new_v4()])
                .with_previous_broker_epoch(-1),
        )
        .expect("BrokerRegistration");
    assert_eq!(registration.error_code, 0, "{registration:?}");
    let epoch = registration.broker_epoch;
    let deadline = Instant::now() + Duration::from_secs(30);
    while heartbeat(&mut controller, epoch).is_fenced {
        assert!(Instant::now() < deadline, "broker 2 never unfenced");
        std::thread::sleep(Duration::from_millis(100));
    }

    // A partition led by broker 2, with broker 1 as follower.
    let created: CreateTopicsResponse = conn(&bootstrap)
        .call(
            ApiKey::CreateTopics,
            7,
            &CreateTopicsRequest::default()
                .with_timeout_ms(30_000)
                .with_topics(vec![CreatableTopic::default()
                    .with_name(TopicName(sb("isr")))
                    .with_num_partitions(-1)
                    .with_replication_factor(-1)
                    .with_assignments(vec![CreatableReplicaAssignment::default()
                        .with_partition_index(0)
                        .with_broker_ids(vec![BrokerId(FAKE_BROKER), BrokerId(1)])])]),
        )
        .expect("CreateTopics");
    assert_eq!(created.topics[0].error_code, 0, "{created:?}");
    let (leader, leader_epoch, isr, topic_id) = partition_state(&bootstrap, "isr");
    assert_eq!((leader, isr.clone()), (FAKE_BROKER, vec![FAKE_BROKER, 1]));

    // v3 shrink to the leader alone: partition epoch 1, the leader epoch unchanged.
    heartbeat(&mut controller, epoch);
    let r = alter(
        &mut controller,
        3,
        epoch,
        topic_id,
        (leader_epoch, 0),
        &[(FAKE_BROKER, epoch)],
    );
    assert_eq!(r.error_code, 0, "{r:?}");
    let p = &r.topics[0].partitions[0];
    assert_eq!(p.error_code, 0, "{r:?}");
    assert_eq!(
        (p.leader_id.0, p.leader_epoch, p.partition_epoch),
        (FAKE_BROKER, leader_epoch, 1)
    );
    assert_eq!(p.isr, vec![BrokerId(FAKE_BROKER)]);
    assert_eq!(
        partition_state(&bootstrap, "isr").2,
        vec![FAKE_BROKER],
        "the broker's Metadata shows the new ISR"
    );

    // Broker 1 with a broker epoch that is not its registration's: INELIGIBLE_REPLICA.
    let r = alter(
        &mut controller,
        3,
        epoch,
        topic_id,
        (leader_epoch, 1),
        &[(FAKE_BROKER, epoch), (1, 1_000_000)],
    );
    assert_eq!(r.topics[0].partitions[0].error_code, 107, "{r:?}");
    // A stale sender epoch: STALE_BROKER_EPOCH for the whole request.
    let r = alter(
        &mut controller,
        3,
        epoch + 1,
        topic_id,
        (leader_epoch, 1),
        &[(FAKE_BROKER, epoch)],
    );
    assert_eq!(r.error_code, 77, "{r:?}");
    // A stale partition epoch: INVALID_UPDATE_VERSION.
    let r = alter(
        &mut controller,
        3,
        epoch,
        topic_id,
        (leader_epoch, 0),
        &[(FAKE_BROKER, epoch), (1, -1)],
    );
    assert_eq!(r.topics[0].partitions[0].error_code, 95, "{r:?}");

    // v2 expand (no broker epochs): back to both replicas, partition epoch 2.
    heartbeat(&mut controller, epoch);
    let r = alter(
        &mut controller,
        2,
        epoch,
        topic_id,
        (leader_epoch, 1),
        &[(FAKE_BROKER, -1), (1, -1)],
    );
    let p = &r.topics[0].partitions[0];
    assert_eq!(p.error_code, 0, "{r:?}");
    assert_eq!(p.partition_epoch, 2);
    assert_eq!(p.isr, vec![BrokerId(FAKE_BROKER), BrokerId(1)]);
    assert_eq!(partition_state(&bootstrap, "isr").2, vec![FAKE_BROKER, 1]);
}
