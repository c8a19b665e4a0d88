//! Three combined gregor nodes, each broker talking to the ACTIVE controller through its
//! controller channel (KIP-631 registration and heartbeats, KIP-590 forwarding): every node
//! registers and is listed by Metadata and DescribeCluster; a CreateTopics sent to a node that
//! does not lead the quorum is forwarded and the topic is visible from every node; leaders are
//! spread over the three brokers, replication factor 3 puts a replica on each, 4 is
//! INVALID_REPLICATION_FACTOR;
//! a broker killed with SIGKILL is fenced once `broker.session.timeout.ms` (3000 here) has run
//! out, and its partitions get other leaders. CreatePartitions, DeleteTopics, Metadata
//! auto-creation, IncrementalAlterConfigs, InitProducerId and FindCoordinator
//! (`__consumer_offsets`) at a non-leader reach the controller too.
//!
//! `cargo test -p gregor --test kraft_forwarding -- --nocapture`

use gregor_tests::process::wait_for;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use gregor_tests::cluster::{Cluster, ClusterConfig, Implementation};
use gregor_tests::wire::{sb, KafkaConn};
use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::incremental_alter_configs_request::{
    AlterConfigsResource, AlterableConfig,
};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    ApiKey, CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicsRequest,
    CreateTopicsResponse, DeleteTopicsRequest, DeleteTopicsResponse, DescribeClusterRequest,
    DescribeClusterResponse, DescribeConfigsRequest, DescribeConfigsResponse,
    FindCoordinatorRequest, FindCoordinatorResponse, IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse, InitProducerIdRequest, InitProducerIdResponse,
    MetadataRequest, MetadataResponse, ProducerId, TopicName,
};

const SESSION_TIMEOUT_MS: u64 = 3000;

fn gregor() -> Implementation {
    Implementation::Gregor(env!("CARGO_BIN_EXE_gregor").into())
}

fn addr(bootstrap: &str) -> SocketAddr {
    bootstrap.parse().expect("a broker address")
}

fn metadata(bootstrap: &str, topics: Option<&[&str]>) -> anyhow::Result<MetadataResponse> {
    let mut conn =
        KafkaConn::connect_timeout(addr(bootstrap), Duration::from_secs(5), "kraft-fwd")?;
    let req = MetadataRequest::default()
        .with_topics(topics.map(|ts| {
            ts.iter()
                .map(|t| MetadataRequestTopic::default().with_name(Some(TopicName(sb(t)))))
                .collect()
        }))
        .with_allow_auto_topic_creation(false);
    conn.call(ApiKey::Metadata, 12, &req)
}

fn describe_cluster(bootstrap: &str) -> anyhow::Result<DescribeClusterResponse> {
    let mut conn =
        KafkaConn::connect_timeout(addr(bootstrap), Duration::from_secs(5), "kraft-fwd")?;
    conn.call(
        ApiKey::DescribeCluster,
        1,
        &DescribeClusterRequest::default().with_endpoint_type(1),
    )
}

fn create_topic(bootstrap: &str, name: &str, partitions: i32, rf: i16) -> CreateTopicsResponse {
    let mut conn =
        KafkaConn::connect_timeout(addr(bootstrap), Duration::from_secs(60), "kraft-fwd")
            .expect("connecting");
    let req = CreateTopicsRequest::default()
        .with_timeout_ms(30_000)
        .with_topics(vec![CreatableTopic::default()
            .with_name(TopicName(sb(name)))
            .with_num_partitions(partitions)
            .with_replication_factor(rf)]);
    conn.call(ApiKey::CreateTopics, 7, &req)
        .expect("CreateTopics answered")
}

fn broker_ids(m: &MetadataResponse) -> BTreeSet<i32> {
    m.brokers.iter().map(|b| b.node_id.0).collect()
}

#[test]
fn brokers_register_and_forward_to_the_active_controller() {
    let config = ClusterConfig::combined(gregor(), 3)
        .with("broker.session.timeout.ms", &SESSION_TIMEOUT_MS.to_string())
        .with("broker.heartbeat.interval.ms", "500");
    let started = Instant::now();
    let mut cluster = Cluster::start(&config).unwrap_or_else(|e| panic!("{e:#}"));
    let all: BTreeSet<i32> = [1, 2, 3].into();

    // Every node lists every broker (Metadata) and DescribeCluster agrees.
    for n in cluster.nodes() {
        let b = n.bootstrap().expect("broker listener");
        wait_for(Duration::from_secs(20), "every broker in Metadata", || {
            metadata(&b, Some(&[]))
                .ok()
                .filter(|m| broker_ids(m) == all)
        });
        let dc = wait_for(
            Duration::from_secs(20),
            "every broker in DescribeCluster",
            || {
                describe_cluster(&b).ok().filter(|d| {
                    d.brokers
                        .iter()
                        .map(|x| x.broker_id.0)
                        .collect::<BTreeSet<_>>()
                        == all
                })
            },
        );
        assert_eq!(dc.error_code, 0);
    }
    println!(
        "all three brokers registered {} ms after the start",
        started.elapsed().as_millis()
    );

    // CreateTopics at a node that does not lead the quorum: forwarded, not NOT_CONTROLLER.
    let leader = cluster
        .active_controller()
        .unwrap_or_else(|e| panic!("{e:#}"));
    let follower = *all.iter().find(|id| **id != leader).expect("a follower");
    let at = cluster.node(follower).bootstrap().expect("broker listener");
    let t0 = Instant::now();
    let r = create_topic(&at, "forwarded-spread", 3, 1);
    let created_ms = t0.elapsed().as_millis();
    assert_eq!(r.topics.len(), 1);
    assert_eq!(
        r.topics[0].error_code,
        0,
        "{:?}\n{}",
        r.topics[0].error_message,
        cluster.logs(30)
    );
    println!("CreateTopics forwarded from node {follower} to controller {leader}: {created_ms} ms");
    // The node that answered sees the topic at once (it waited for its loader).
    let m = metadata(&at, Some(&["forwarded-spread"])).expect("metadata");
    assert_eq!(
        m.topics[0].error_code, 0,
        "visible on the node that forwarded"
    );
    // Every node sees it, one replica per partition (partitions are not replicated between
    // brokers yet), placed on all three brokers.
    for n in cluster.nodes() {
        let b = n.bootstrap().expect("broker listener");
        let m = wait_for(Duration::from_secs(10), "the topic on every node", || {
            metadata(&b, Some(&["forwarded-spread"]))
                .ok()
                .filter(|m| m.topics.first().is_some_and(|t| t.error_code == 0))
        });
        let t = &m.topics[0];
        assert_eq!(t.partitions.len(), 3);
        let mut leaders = BTreeSet::new();
        for p in &t.partitions {
            let replicas: Vec<i32> = p.replica_nodes.iter().map(|r| r.0).collect();
            assert_eq!(
                replicas,
                vec![p.leader_id.0],
                "partition {}",
                p.partition_index
            );
            leaders.insert(p.leader_id.0);
        }
        assert_eq!(leaders, all, "partition leaders spread over the brokers");
    }

    // Replication factor 3: every broker holds a replica; 4 on three brokers is refused with
    // Kafka's placement error.
    let r = create_topic(&at, "forwarded-rf3", 1, 3);
    assert_eq!(r.topics[0].error_code, 0, "{r:?}");
    let m = metadata(&at, Some(&["forwarded-rf3"])).expect("metadata");
    let mut replicas: Vec<i32> = m.topics[0].partitions[0]
        .replica_nodes
        .iter()
        .map(|r| r.0)
        .collect();
    replicas.sort_unstable();
    assert_eq!(replicas, all.iter().copied().collect::<Vec<_>>());
    let r = create_topic(&at, "forwarded-rf4", 1, 4);
    assert_eq!(
        r.topics[0].error_code, 38,
        "INVALID_REPLICATION_FACTOR: {r:?}"
    );
    assert!(
        r.topics[0]
            .error_message
            .as_deref()
            .is_some_and(|m| m.contains("cannot be reached")),
        "{r:?}"
    );

    // CreatePartitions, DeleteTopics and Metadata auto-creation at the follower.
    let mut conn = KafkaConn::connect_timeout(addr(&at), Duration::from_secs(60), "kraft-fwd")
        .expect("connect");
    assert_eq!(
        create_topic(&at, "forwarded-doomed", 1, 1).topics[0].error_code,
        0
    );
    let r: CreatePartitionsResponse = conn
        .call(
            ApiKey::CreatePartitions,
            3,
            &CreatePartitionsRequest::default()
                .with_timeout_ms(30_000)
                .with_topics(vec![CreatePartitionsTopic::default()
                    .with_name(TopicName(sb("forwarded-doomed")))
                    .with_count(4)]),
        )
        .expect("CreatePartitions");
    assert_eq!(
        r.results[0].error_code, 0,
        "{:?}",
        r.results[0].error_message
    );
    let m = metadata(&at, Some(&["forwarded-doomed"])).expect("metadata");
    assert_eq!(m.topics[0].partitions.len(), 4);
    let r: DeleteTopicsResponse = conn
        .call(
            ApiKey::DeleteTopics,
            6,
            &DeleteTopicsRequest::default()
                .with_timeout_ms(30_000)
                .with_topics(vec![
                    DeleteTopicState::default().with_name(Some(TopicName(sb("forwarded-doomed"))))
                ]),
        )
        .expect("DeleteTopics");
    assert_eq!(
        r.responses[0].error_code, 0,
        "{:?}",
        r.responses[0].error_message
    );
    for n in cluster.nodes() {
        let b = n.bootstrap().expect("broker listener");
        wait_for(
            Duration::from_secs(10),
            "the deleted topic gone everywhere",
            || {
                metadata(&b, Some(&["forwarded-doomed"]))
                    .ok()
                    .filter(|m| m.topics[0].error_code == 3)
            },
        );
    }
    let auto: MetadataResponse = conn
        .call(
            ApiKey::Metadata,
            12,
            &MetadataRequest::default()
                .with_topics(Some(vec![
                    MetadataRequestTopic::default().with_name(Some(TopicName(sb("auto-created"))))
                ]))
                .with_allow_auto_topic_creation(true),
        )
        .expect("Metadata");
    // Kafka answers LEADER_NOT_AVAILABLE (5) to the request that triggers the creation; the
    // topic exists once it returns.
    assert!([0, 5].contains(&auto.topics[0].error_code), "{auto:?}");
    let m = metadata(&at, Some(&["auto-created"])).expect("metadata");
    assert_eq!(
        m.topics[0].error_code, 0,
        "auto-created through the controller"
    );

    // IncrementalAlterConfigs at the follower: forwarded, applied on every node.
    let mut conn = KafkaConn::connect_timeout(addr(&at), Duration::from_secs(60), "kraft-fwd")
        .expect("connect");
    let req = IncrementalAlterConfigsRequest::default().with_resources(vec![
        AlterConfigsResource::default()
            .with_resource_type(2)
            .with_resource_name(sb("forwarded-spread"))
            .with_configs(vec![AlterableConfig::default()
                .with_name(sb("retention.ms"))
                .with_config_operation(0)
                .with_value(Some(sb("123456")))]),
    ]);
    let r: IncrementalAlterConfigsResponse = conn
        .call(ApiKey::IncrementalAlterConfigs, 1, &req)
        .expect("IncrementalAlterConfigs");
    assert_eq!(
        r.responses[0].error_code, 0,
        "{:?}",
        r.responses[0].error_message
    );
    for n in cluster.nodes() {
        let b = n.bootstrap().expect("broker listener");
        wait_for(Duration::from_secs(10), "the config on every node", || {
            let mut c =
                KafkaConn::connect_timeout(addr(&b), Duration::from_secs(5), "kraft-fwd").ok()?;
            let d: DescribeConfigsResponse = c
                .call(
                    ApiKey::DescribeConfigs,
                    4,
                    &DescribeConfigsRequest::default().with_resources(vec![
                        DescribeConfigsResource::default()
                            .with_resource_type(2)
                            .with_resource_name(sb("forwarded-spread"))
                            .with_configuration_keys(Some(vec![sb("retention.ms")])),
                    ]),
                )
                .ok()?;
            d.results[0]
                .configs
                .iter()
                .any(|c| c.value.as_deref() == Some("123456"))
                .then_some(())
        });
    }

    // InitProducerId at the follower and at the controller: blocks from the active
    // controller (AllocateProducerIds), so the ids differ.
    let mut ids = BTreeSet::new();
    for b in [
        &at,
        &cluster.node(leader).bootstrap().expect("broker listener"),
    ] {
        let mut c = KafkaConn::connect_timeout(addr(b), Duration::from_secs(60), "kraft-fwd")
            .expect("connect");
        let r: InitProducerIdResponse = c
            .call(
                ApiKey::InitProducerId,
                4,
                &InitProducerIdRequest::default()
                    .with_transactional_id(None)
                    .with_transaction_timeout_ms(-1)
                    .with_producer_id(ProducerId(-1))
                    .with_producer_epoch(-1),
            )
            .expect("InitProducerId");
        assert_eq!(r.error_code, 0, "InitProducerId at {b}");
        assert!(r.producer_id.0 >= 0);
        ids.insert(r.producer_id.0);
    }
    assert_eq!(ids.len(), 2, "distinct producer ids {ids:?}");

    // FindCoordinator at the follower creates `__consumer_offsets` through the controller
    // (the answer itself is COORDINATOR_NOT_AVAILABLE unless this node leads the group's
    // partition: gregor's FindCoordinator only names itself so far).
    let mut c = KafkaConn::connect_timeout(addr(&at), Duration::from_secs(60), "kraft-fwd")
        .expect("connect");
    let r: FindCoordinatorResponse = c
        .call(
            ApiKey::FindCoordinator,
            4,
            &FindCoordinatorRequest::default().with_coordinator_keys(vec![sb("g1")]),
        )
        .expect("FindCoordinator");
    assert!([0, 15].contains(&r.coordinators[0].error_code), "{r:?}");
    let m = metadata(&at, Some(&["__consumer_offsets"])).expect("metadata");
    assert_eq!(
        m.topics[0].error_code, 0,
        "created before FindCoordinator answered"
    );
    for n in cluster.nodes() {
        let b = n.bootstrap().expect("broker listener");
        wait_for(
            Duration::from_secs(10),
            "__consumer_offsets on every node",
            || {
                metadata(&b, Some(&["__consumer_offsets"]))
                    .ok()
                    .filter(|m| m.topics[0].error_code == 0)
            },
        );
    }

    // kill -9 a broker that is not the active controller: fenced after the session timeout.
    let victim = *all
        .iter()
        .find(|id| **id != leader && **id != follower)
        .expect("a third node");
    let observer = cluster.node(leader).bootstrap().expect("broker listener");
    let before = metadata(&observer, Some(&["forwarded-spread"])).expect("metadata");
    let led: Vec<i32> = before.topics[0]
        .partitions
        .iter()
        .filter(|p| p.leader_id.0 == victim)
        .map(|p| p.partition_index)
        .collect();
    assert!(!led.is_empty(), "the victim leads a partition");
    cluster
        .node_mut(victim)
        .kill9()
        .unwrap_or_else(|e| panic!("{e:#}"));
    let killed = Instant::now();
    let after = wait_for(Duration::from_secs(30), "the killed broker fenced", || {
        metadata(&observer, Some(&["forwarded-spread"]))
            .ok()
            .filter(|m| !broker_ids(m).contains(&victim))
    });
    let fenced_ms = killed.elapsed().as_millis() as u64;
    println!("broker {victim} killed; fenced (gone from Metadata) after {fenced_ms} ms");
    // Not before its session ran out (less the heartbeat interval it may have just sent).
    assert!(
        fenced_ms + 500 >= SESSION_TIMEOUT_MS,
        "fenced after {fenced_ms} ms, before broker.session.timeout.ms"
    );
    // Well before the 9000 ms default: the controller reads `broker.session.timeout.ms`.
    assert!(fenced_ms < 7000, "{fenced_ms} ms");
    // Its partitions had no other replica: no leader now (-1), as Kafka's controller leaves
    // them; the others keep theirs.
    for p in &after.topics[0].partitions {
        if led.contains(&p.partition_index) {
            assert_eq!(
                p.leader_id.0, -1,
                "partition {} leaderless",
                p.partition_index
            );
        } else {
            assert_ne!(
                p.leader_id.0, -1,
                "partition {} kept its leader",
                p.partition_index
            );
        }
    }
    // The survivors still create topics, forwarded or not.
    for id in [leader, follower] {
        let b = cluster.node(id).bootstrap().expect("broker listener");
        let name = format!("after-kill-{id}");
        let r = create_topic(&b, &name, 2, 1);
        assert_eq!(r.topics[0].error_code, 0, "{:?}", r.topics[0].error_message);
    }
}
