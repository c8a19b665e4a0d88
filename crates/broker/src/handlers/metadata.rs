//! Metadata (key 3) and DescribeCluster (key 60),
//! <https://kafka.apache.org/protocol#The_Messages_Metadata>; topic ids from KIP-516, leader
//! epochs from KIP-320, auto-creation as `auto.create.topics.enable` and
//! `allow_auto_topic_creation` (v4+) say.

use std::sync::Arc;

use gregor_metadata::record::{DIRECTORY_LOST, DIRECTORY_MIGRATING, DIRECTORY_UNASSIGNED};
use gregor_metadata::{MetadataImage, PartitionRegistration, TopicImage};
use gregor_protocol::kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use gregor_protocol::kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use gregor_protocol::kafka_protocol::messages::{
    BrokerId, DescribeClusterRequest, DescribeClusterResponse, MetadataRequest, MetadataResponse,
    TopicName,
};
use uuid::Uuid;

use super::sb;
use crate::authorizer::{AclOperation, ResourceType, CLUSTER_NAME};
use crate::broker::Broker;
use crate::error_codes as ec;
use gregor_network::RequestContext;

/// "Authorized operations not requested" (Kafka's `Integer.MIN_VALUE` sentinel).
const AUTHORIZED_OPERATIONS_OMITTED: i32 = i32::MIN;

/// Kafka's `KRaftMetadataCache.isReplicaOffline`: a replica is offline when its broker is not
/// registered, is fenced, has no endpoint on `listener`, or its log directory is not among the
/// broker's online ones (`DirectoryId.isOnline`: unassigned and migrating directories count as
/// online, lost ones do not, and a broker that reported no directories is trusted).
pub(super) fn is_replica_offline(
    image: &MetadataImage,
    p: &PartitionRegistration,
    replica: i32,
    listener: &str,
) -> bool {
    let Some(b) = image.brokers.get(&replica) else {
        return true;
    };
    if b.fenced || b.endpoint(listener).is_none() {
        return true;
    }
    let dir = p
        .replicas
        .iter()
        .position(|r| *r == replica)
        .and_then(|i| p.directories.get(i))
        .copied()
        .unwrap_or(DIRECTORY_UNASSIGNED);
    let online = dir == DIRECTORY_UNASSIGNED
        || dir == DIRECTORY_MIGRATING
        || (dir != DIRECTORY_LOST && (b.directories.is_empty() || b.directories.contains(&dir)));
    !online
}

/// One topic as Kafka's `KRaftMetadataCache.getPartitionMetadata` answers it: a partition whose
/// leader is not alive on `listener` (not registered, fenced, or without that listener) has
/// leader -1 and LEADER_NOT_AVAILABLE (LISTENER_NOT_FOUND from v6 when only the listener is
/// missing); offline replicas per [`is_replica_offline`].
fn topic_entry(
    t: &TopicImage,
    image: &MetadataImage,
    listener: &str,
    version: i16,
) -> MetadataResponseTopic {
    let partitions = t
        .partitions
        .iter()
        .map(|(idx, p)| {
            let leader = image.brokers.get(&p.leader);
            let leader_alive = leader.is_some_and(|b| !b.fenced && b.endpoint(listener).is_some());
            let error = if leader_alive {
                ec::NONE
            } else if leader.is_some_and(|b| !b.fenced) && version >= 6 {
                ec::LISTENER_NOT_FOUND
            } else {
                ec::LEADER_NOT_AVAILABLE
            };
            MetadataResponsePartition::default()
                .with_error_code(error)
                .with_partition_index(*idx)
                .with_leader_id(BrokerId(if leader_alive { p.leader } else { -1 }))
                .with_leader_epoch(p.leader_epoch)
                .with_replica_nodes(p.replicas.iter().map(|b| BrokerId(*b)).collect())
                .with_isr_nodes(p.isr.iter().map(|b| BrokerId(*b)).collect())
                .with_offline_replicas(
                    p.replicas
                        .iter()
                        .filter(|r| is_replica_offline(image, p, **r, listener))
                        .map(|b| BrokerId(*b))
                        .collect(),
                )
        })
        .collect();
    MetadataResponseTopic::default()
        .with_name(Some(TopicName(sb(&t.name))))
        .with_topic_id(t.topic_id)
        .with_is_internal(t.name.starts_with("__"))
        .with_partitions(partitions)
        .with_topic_authorized_operations(AUTHORIZED_OPERATIONS_OMITTED)
}

fn error_entry(name: Option<&str>, topic_id: Uuid, code: i16) -> MetadataResponseTopic {
    crate::observability::record_error(
        gregor_protocol::kafka_protocol::messages::ApiKey::Metadata,
        code,
    );
    MetadataResponseTopic::default()
        .with_error_code(code)
        .with_name(name.map(|n| TopicName(sb(n))))
        .with_topic_id(topic_id)
        .with_topic_authorized_operations(AUTHORIZED_OPERATIONS_OMITTED)
}

/// The brokers with an endpoint on `listener` (the listener the request came in on), as
/// Kafka's `MetadataCache.getAliveBrokerNodes`: fenced brokers are left out.
fn brokers(image: &MetadataImage, listener: &str) -> Vec<MetadataResponseBroker> {
    image
        .unfenced_brokers()
        .filter_map(|b| {
            let e = b.endpoint(listener)?;
            Some(
                MetadataResponseBroker::default()
                    .with_node_id(BrokerId(b.broker_id))
                    .with_host(sb(&e.host))
                    .with_port(i32::from(e.port))
                    .with_rack(b.rack.as_deref().map(sb)),
            )
        })
        .collect()
}

/// Answers Metadata: null topics = all topics, an empty list = none (v1+; in v0 an empty
/// list means all). Unknown topics are created when the request allows it (v4+, always
/// before v4) and `auto.create.topics.enable` is on.
/// Answers Metadata. Topics the principal may not `Describe` are left out of an all-topics
/// answer and get TOPIC_AUTHORIZATION_FAILED when named; auto-creation also needs `Create` on
/// the Cluster or the topic.
pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: MetadataRequest,
    version: i16,
) -> MetadataResponse {
    let describe =
        |name: &str| broker.authorize(ctx, AclOperation::Describe, ResourceType::Topic, name);
    let mut image = broker.controller.image();
    let all = match &req.topics {
        None => true,
        Some(t) => t.is_empty() && version == 0,
    };
    let mut topics = Vec::new();
    if all {
        // By name: `topic_ids` is sorted already.
        for (n, id) in &image.topic_ids {
            if let Some(t) = image.topic_by_id(id) {
                if describe(n) {
                    topics.push(topic_entry(t, &image, &ctx.listener_name, version));
                }
            }
        }
    } else {
        let allow_auto = version < 4 || req.allow_auto_topic_creation;
        for rt in req.topics.unwrap_or_default() {
            match rt.name.as_ref().map(|n| n.0.to_string()) {
                None => {
                    // Lookup by topic id (v10+).
                    match image.topic_by_id(&rt.topic_id) {
                        Some(t) if describe(&t.name) => {
                            topics.push(topic_entry(t, &image, &ctx.listener_name, version))
                        }
                        Some(_) => topics.push(error_entry(
                            None,
                            rt.topic_id,
                            ec::TOPIC_AUTHORIZATION_FAILED,
                        )),
                        None => topics.push(error_entry(None, rt.topic_id, ec::UNKNOWN_TOPIC_ID)),
                    }
                }
                Some(name) => {
                    if !describe(&name) {
                        topics.push(error_entry(
                            Some(&name),
                            Uuid::nil(),
                            ec::TOPIC_AUTHORIZATION_FAILED,
                        ));
                        continue;
                    }
                    if let Some(t) = image.topic(&name) {
                        topics.push(topic_entry(t, &image, &ctx.listener_name, version));
                        continue;
                    }
                    if let Err(e) = gregor_metadata::controller::validate_topic_name(&name) {
                        topics.push(error_entry(Some(&name), Uuid::nil(), e.kafka_error_code()));
                        continue;
                    }
                    let may_create = || {
                        broker.authorize(
                            ctx,
                            AclOperation::Create,
                            ResourceType::Cluster,
                            CLUSTER_NAME,
                        ) || broker.authorize(ctx, AclOperation::Create, ResourceType::Topic, &name)
                    };
                    if allow_auto && broker.config.auto_create_topics_enable && !may_create() {
                        topics.push(error_entry(
                            Some(&name),
                            Uuid::nil(),
                            ec::TOPIC_AUTHORIZATION_FAILED,
                        ));
                    } else if allow_auto && broker.config.auto_create_topics_enable {
                        match super::topics::auto_create(broker, &name).await {
                            Ok(()) => {
                                image = broker.controller.image();
                                match image.topic(&name) {
                                    Some(t) => topics.push(topic_entry(
                                        t,
                                        &image,
                                        &ctx.listener_name,
                                        version,
                                    )),
                                    None => topics.push(error_entry(
                                        Some(&name),
                                        Uuid::nil(),
                                        ec::LEADER_NOT_AVAILABLE,
                                    )),
                                }
                            }
                            Err(code) => {
                                topics.push(error_entry(Some(&name), Uuid::nil(), code));
                            }
                        }
                    } else {
                        topics.push(error_entry(
                            Some(&name),
                            Uuid::nil(),
                            ec::UNKNOWN_TOPIC_OR_PARTITION,
                        ));
                    }
                }
            }
        }
    }
    // KIP-430, as Kafka's `handleTopicMetadataRequest`: every topic answered (not those
    // refused for Describe) gets its operations; the cluster's (v8-10) are 0 without
    // Describe on the Cluster.
    if req.include_topic_authorized_operations {
        for t in &mut topics {
            if t.error_code == ec::TOPIC_AUTHORIZATION_FAILED {
                continue;
            }
            if let Some(name) = &t.name {
                t.topic_authorized_operations =
                    broker.authorized_operations(ctx, ResourceType::Topic, name);
            }
        }
    }
    let cluster_authorized_operations = if !req.include_cluster_authorized_operations {
        AUTHORIZED_OPERATIONS_OMITTED
    } else if broker.authorize(
        ctx,
        AclOperation::Describe,
        ResourceType::Cluster,
        CLUSTER_NAME,
    ) {
        broker.authorized_operations(ctx, ResourceType::Cluster, CLUSTER_NAME)
    } else {
        0
    };
    MetadataResponse::default()
        .with_brokers(brokers(&image, &ctx.listener_name))
        .with_cluster_id(Some(sb(&broker.cluster_id)))
        .with_controller_id(BrokerId(broker.config.node_id))
        .with_topics(topics)
        .with_cluster_authorized_operations(cluster_authorized_operations)
}

/// Answers DescribeCluster (KIP-700).
pub fn describe_cluster(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: &DescribeClusterRequest,
    version: i16,
) -> DescribeClusterResponse {
    // Kafka authorises nothing here (`AuthHelper.computeDescribeClusterResponse`): the
    // cluster's authorized operations (KIP-430) are 0 without Describe on the Cluster.
    let cluster_authorized_operations = if !req.include_cluster_authorized_operations {
        AUTHORIZED_OPERATIONS_OMITTED
    } else if broker.authorize(
        ctx,
        AclOperation::Describe,
        ResourceType::Cluster,
        CLUSTER_NAME,
    ) {
        broker.authorized_operations(ctx, ResourceType::Cluster, CLUSTER_NAME)
    } else {
        0
    };
    let image = broker.controller.image();
    let mut resp = DescribeClusterResponse::default()
        .with_cluster_id(sb(&broker.cluster_id))
        .with_controller_id(BrokerId(broker.config.node_id))
        .with_cluster_authorized_operations(cluster_authorized_operations)
        .with_endpoint_type(1)
        .with_brokers(
            image
                .brokers
                .values()
                // Fenced brokers only when asked for (v2, KIP-1073), as Kafka.
                .filter(|b| !b.fenced || req.include_fenced_brokers)
                .filter_map(|b| {
                    let e = b.endpoint(&ctx.listener_name)?;
                    Some(
                        DescribeClusterBroker::default()
                            .with_broker_id(BrokerId(b.broker_id))
                            .with_host(sb(&e.host))
                            .with_port(i32::from(e.port))
                            .with_rack(b.rack.as_deref().map(sb))
                            .with_is_fenced(b.fenced),
                    )
                })
                .collect(),
        );
    // KIP-919: only the broker endpoint type (1) is served by brokers.
    if version >= 1 && req.endpoint_type != 1 {
        resp.error_code = ec::UNSUPPORTED_ENDPOINT_TYPE;
        resp.error_message = Some(sb(
            "The target does not support the requested endpoint type.",
        ));
        resp.brokers.clear();
    }
    resp
}
