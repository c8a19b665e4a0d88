//! The partition side of transactions (KIP-98, KIP-664):
//! - WriteTxnMarkers (key 27, v1), <https://kafka.apache.org/protocol#The_Messages_WriteTxnMarkers>:
//!   the transaction coordinator's COMMIT/ABORT markers, appended by this leader
//!   ([`crate::txn_markers`]). Needs `Alter` or `ClusterAction` on the cluster, as Kafka's
//!   `handleWriteTxnMarkersRequest` (Kafka's own brokers have both through their principal);
//!   else CLUSTER_AUTHORIZATION_FAILED for every partition.
//! - DescribeProducers (key 61, v0), <https://kafka.apache.org/protocol#The_Messages_DescribeProducers>:
//!   the producers of a partition as its replica's producer state knows them (id, epoch, last
//!   sequence and timestamp, coordinator epoch, open transaction's first offset), what
//!   `kafka-transactions describe-producers` and `find-hanging` show. Needs `Read` on the
//!   topic.

use std::sync::Arc;

use gregor_log::TopicPartition;
use gregor_network::{respond, Handled, RequestContext};
use gregor_protocol::kafka_protocol::messages::describe_producers_response::{
    PartitionResponse, ProducerState, TopicResponse,
};
use gregor_protocol::kafka_protocol::messages::{
    ApiKey, DescribeProducersRequest, DescribeProducersResponse, ProducerId, ResponseKind,
    WriteTxnMarkersRequest, WriteTxnMarkersResponse,
};

use crate::authorizer::{AclOperation, ResourceType, CLUSTER_NAME};
use crate::broker::Broker;
use crate::error_codes as ec;
use crate::observability::record_error;
use crate::txn_markers::{append_txn_markers, error_response};

/// Handles WriteTxnMarkers: the appends run now (request order), the answer waits for their
/// replication (acks=all) in the deferred part.
pub async fn write_txn_markers(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: WriteTxnMarkersRequest,
) -> Handled {
    let header = ctx.header.clone();
    let build = move |markers| {
        respond(
            &header,
            ApiKey::WriteTxnMarkers,
            ResponseKind::WriteTxnMarkers(WriteTxnMarkersResponse::default().with_markers(markers)),
        )
    };
    let authorized = broker.authorize(
        ctx,
        AclOperation::Alter,
        ResourceType::Cluster,
        CLUSTER_NAME,
    ) || broker.authorize(
        ctx,
        AclOperation::ClusterAction,
        ResourceType::Cluster,
        CLUSTER_NAME,
    );
    if !authorized {
        record_error(ApiKey::WriteTxnMarkers, ec::CLUSTER_AUTHORIZATION_FAILED);
        return Handled::Ready(build(error_response(
            &req.markers,
            ec::CLUSTER_AUTHORIZATION_FAILED,
        )));
    }
    let pending = append_txn_markers(broker, req.markers).await;
    let broker = broker.clone();
    Handled::Deferred(Box::pin(async move {
        let markers = pending.complete(&broker).await;
        for code in markers
            .iter()
            .flat_map(|m| &m.topics)
            .flat_map(|t| &t.partitions)
            .map(|p| p.error_code)
            .filter(|c| *c != ec::NONE)
        {
            record_error(ApiKey::WriteTxnMarkers, code);
        }
        build(markers)
    }))
}

/// Handles DescribeProducers (Kafka's `handleDescribeProducersRequest` and
/// `ReplicaManager.activeProducerState`): per partition, TOPIC_AUTHORIZATION_FAILED without
/// `Read` on the topic, UNKNOWN_TOPIC_OR_PARTITION for a topic the metadata does not have,
/// NOT_LEADER_OR_FOLLOWER for a partition with no replica here, KAFKA_STORAGE_ERROR for one
/// whose log could not be created; else the active producers of the replica (leader or
/// follower), by producer id.
pub fn describe_producers(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: &DescribeProducersRequest,
) -> DescribeProducersResponse {
    let image = broker.controller.image();
    let topics = req
        .topics
        .iter()
        .map(|t| {
            let name = t.name.0.as_str();
            let topic_error =
                if !broker.authorize(ctx, AclOperation::Read, ResourceType::Topic, name) {
                    Some(ec::TOPIC_AUTHORIZATION_FAILED)
                } else if image.topic(name).is_none() {
                    Some(ec::UNKNOWN_TOPIC_OR_PARTITION)
                } else {
                    None
                };
            let partitions = t
                .partition_indexes
                .iter()
                .map(|&index| {
                    let error = |code: i16, message: Option<String>| {
                        record_error(ApiKey::DescribeProducers, code);
                        PartitionResponse::default()
                            .with_partition_index(index)
                            .with_error_code(code)
                            .with_error_message(message.map(|m| super::sb(&m)))
                    };
                    if let Some(code) = topic_error {
                        return error(code, None);
                    }
                    match broker
                        .replica_manager
                        .hosted(&TopicPartition::new(name, index))
                    {
                        Ok(p) => PartitionResponse::default()
                            .with_partition_index(index)
                            .with_active_producers(
                                p.log
                                    .producer_summaries()
                                    .into_iter()
                                    .map(|s| {
                                        ProducerState::default()
                                            .with_producer_id(ProducerId(s.producer_id))
                                            .with_producer_epoch(i32::from(s.producer_epoch))
                                            .with_last_sequence(s.last_sequence)
                                            .with_last_timestamp(s.last_timestamp_ms)
                                            .with_coordinator_epoch(s.coordinator_epoch)
                                            .with_current_txn_start_offset(
                                                s.current_txn_start_offset,
                                            )
                                    })
                                    .collect(),
                            ),
                        Err((ec::KAFKA_STORAGE_ERROR, message)) => {
                            error(ec::KAFKA_STORAGE_ERROR, Some(message))
                        }
                        Err(_) => {
                            let known = image
                                .topic(name)
                                .is_some_and(|t| t.partitions.contains_key(&index));
                            error(
                                if known {
                                    ec::NOT_LEADER_OR_FOLLOWER
                                } else {
                                    ec::UNKNOWN_TOPIC_OR_PARTITION
                                },
                                None,
                            )
                        }
                    }
                })
                .collect();
            TopicResponse::default()
                .with_name(t.name.clone())
                .with_partitions(partitions)
        })
        .collect();
    DescribeProducersResponse::default().with_topics(topics)
}
