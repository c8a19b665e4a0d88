//! OffsetForLeaderEpoch (API 23, KIP-101/KIP-320) on a 2-node gregor cluster, asked of a
//! broker that hosts one partition of a topic and not the other: the hosted one answers its
//! epoch's end offset, the other NOT_LEADER_OR_FOLLOWER (a partition the metadata knows,
//! Kafka's `ReplicaManager.lastOffsetForLeaderEpoch`), and a partition or topic the metadata
//! does not know UNKNOWN_TOPIC_OR_PARTITION. The handler finds the topic by name (it used to
//! walk every topic of the image for each partition not hosted).

use std::time::Duration;

use gregor_tests::cluster::{Cluster, ClusterConfig, Implementation};
use gregor_tests::wire::{sb, KafkaConn};
use kafka_protocol::messages::create_topics_request::{CreatableReplicaAssignment, CreatableTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::offset_for_leader_epoch_request::{
    OffsetForLeaderPartition, OffsetForLeaderTopic,
};
use kafka_protocol::messages::{
    ApiKey, BrokerId, CreateTopicsRequest, CreateTopicsResponse, MetadataRequest, MetadataResponse,
    OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse, TopicName,
};

const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const NOT_LEADER_OR_FOLLOWER: i16 = 6;

fn conn(addr: &str) -> KafkaConn {
    KafkaConn::connect_timeout(
        addr.parse().expect("an address"),
        Duration::from_secs(10),
        "ofle-test",
    )
    .expect("connect")
}

#[test]
fn a_partition_hosted_elsewhere_is_not_leader_and_an_unknown_one_is_unknown() {
    let cluster = Cluster::start(&ClusterConfig::combined(
        Implementation::Gregor(env!("CARGO_BIN_EXE_gregor").into()),
        2,
    ))
    .expect("a 2-node cluster");
    let b1 = cluster.node(1).bootstrap().expect("broker 1");
    // Partition 0 on node 1 only, partition 1 on node 2 only.
    let created: CreateTopicsResponse = conn(&b1)
        .call(
            ApiKey::CreateTopics,
            7,
            &CreateTopicsRequest::default()
                .with_timeout_ms(30_000)
                .with_topics(vec![CreatableTopic::default()
                    .with_name(TopicName(sb("ofle")))
                    .with_num_partitions(-1)
                    .with_replication_factor(-1)
                    .with_assignments(vec![
                        CreatableReplicaAssignment::default()
                            .with_partition_index(0)
                            .with_broker_ids(vec![BrokerId(1)]),
                        CreatableReplicaAssignment::default()
                            .with_partition_index(1)
                            .with_broker_ids(vec![BrokerId(2)]),
                    ])]),
        )
        .expect("CreateTopics");
    assert_eq!(created.topics[0].error_code, 0, "{created:?}");
    // Node 1 has applied the topic: both partitions have their leader in its Metadata.
    cluster.wait_for(Duration::from_secs(30), "ofle in node 1's metadata", || {
        let r: MetadataResponse = conn(&b1)
            .call(
                ApiKey::Metadata,
                12,
                &MetadataRequest::default().with_topics(Some(vec![MetadataRequestTopic::default(
                )
                .with_name(Some(TopicName(sb("ofle"))))])),
            )
            .ok()?;
        let t = r.topics.first()?;
        (t.partitions.len() == 2 && t.partitions.iter().all(|p| p.leader_id.0 >= 0)).then_some(())
    });
    let partition = |p: i32| {
        OffsetForLeaderPartition::default()
            .with_partition(p)
            .with_current_leader_epoch(-1)
            .with_leader_epoch(0)
    };
    let r: OffsetForLeaderEpochResponse =
        cluster.wait_for(Duration::from_secs(30), "node 1 leading ofle-0", || {
            let r: OffsetForLeaderEpochResponse = conn(&b1)
                .call(
                    ApiKey::OffsetForLeaderEpoch,
                    4,
                    &OffsetForLeaderEpochRequest::default()
                        .with_replica_id(BrokerId(-1))
                        .with_topics(vec![
                            OffsetForLeaderTopic::default()
                                .with_topic(TopicName(sb("ofle")))
                                .with_partitions(vec![partition(0), partition(1), partition(7)]),
                            OffsetForLeaderTopic::default()
                                .with_topic(TopicName(sb("ofle-nope")))
                                .with_partitions(vec![partition(0)]),
                        ]),
                )
                .ok()?;
            (r.topics[0].partitions[0].error_code == 0).then_some(r)
        });
    let got: Vec<(String, i32, i16)> = r
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(|p| (t.topic.0.to_string(), p.partition, p.error_code))
        })
        .collect();
    assert_eq!(
        got,
        [
            ("ofle".to_string(), 0, 0),
            ("ofle".to_string(), 1, NOT_LEADER_OR_FOLLOWER),
            ("ofle".to_string(), 7, UNKNOWN_TOPIC_OR_PARTITION),
            ("ofle-nope".to_string(), 0, UNKNOWN_TOPIC_OR_PARTITION),
        ]
    );
    let p0 = &r.topics[0].partitions[0];
    // An empty log: epoch 0 ends at the log end offset, 0.
    assert_eq!((p0.leader_epoch, p0.end_offset), (0, 0), "{p0:?}");
}
