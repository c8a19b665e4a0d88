//! ListOffsets (key 2), <https://kafka.apache.org/protocol#The_Messages_ListOffsets>:
//! -2 earliest, -1 latest (high watermark, or last stable offset for read_committed),
//! -3 max timestamp (KIP-734, the exact record), -4 earliest local (KIP-405), -5 latest
//! tiered (KIP-1005) and -6 earliest pending upload (KIP-1023; no tiered storage: offset -1), otherwise the
//! first offset whose timestamp is at or after the target (KIP-79). The lookups are
//! [`ReplicaManager::fetch_offsets`](crate::replica_manager::ReplicaManager::fetch_offsets)
//! (`Partition::fetch_offset_for_timestamp`).
//!
//! OffsetForLeaderEpoch (key 23, KIP-101/KIP-320) lives here too: the end offset of a leader
//! epoch from the leader's epoch cache, for followers and for consumers validating their
//! position after a leader change.

use std::sync::Arc;

use gregor_log::TopicPartition;
use gregor_protocol::kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use gregor_protocol::kafka_protocol::messages::offset_for_leader_epoch_response::{
    EpochEndOffset, OffsetForLeaderTopicResult,
};
use gregor_protocol::kafka_protocol::messages::ApiKey;
use gregor_protocol::kafka_protocol::messages::{ListOffsetsRequest, ListOffsetsResponse};
use gregor_protocol::kafka_protocol::messages::{
    OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse,
};

use crate::authorizer::{AclOperation, ResourceType, CLUSTER_NAME};
use crate::broker::Broker;
use crate::error_codes as ec;
use crate::observability::record_error;
use gregor_network::RequestContext;

pub use crate::replica_manager::partition::{
    EARLIEST_LOCAL_TIMESTAMP, EARLIEST_PENDING_UPLOAD_TIMESTAMP, EARLIEST_TIMESTAMP,
    LATEST_TIERED_TIMESTAMP, LATEST_TIMESTAMP, MAX_TIMESTAMP,
};

/// ListOffsets' `ReplicaId` of a debugging client (Kafka's `DEBUGGING_REPLICA_ID`), which a
/// follower may answer.
const DEBUGGING_REPLICA_ID: i32 = -2;

/// Answers ListOffsets. Needs `Describe` on each topic (TOPIC_AUTHORIZATION_FAILED).
pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: ListOffsetsRequest,
    version: i16,
) -> ListOffsetsResponse {
    let authorized =
        |name: &str| broker.authorize(ctx, AclOperation::Describe, ResourceType::Topic, name);
    let lookups: Vec<(TopicPartition, i64, i32)> = req
        .topics
        .iter()
        .filter(|t| authorized(&t.name))
        .flat_map(|t| {
            t.partitions.iter().map(|rp| {
                (
                    TopicPartition::new(t.name.to_string(), rp.partition_index),
                    rp.timestamp,
                    rp.current_leader_epoch,
                )
            })
        })
        .collect();
    let mut results = broker
        .replica_manager
        // ReplicaId -1 is a consumer (its isolation level applies); a follower (>= 0) or a
        // debugging client (-2) reads to the log end offset (Kafka's ReplicaManager). Only
        // the debugging client may be answered by a follower (KIP-392 leaves ListOffsets to
        // the leader).
        .fetch_offsets_from(
            (req.replica_id.0 == -1).then_some(req.isolation_level),
            req.replica_id.0 != DEBUGGING_REPLICA_ID,
            lookups,
        )
        .await
        .into_iter();
    let topics = req
        .topics
        .into_iter()
        .map(|t| {
            let partitions = t
                .partitions
                .iter()
                .map(|rp| {
                    let resp = ListOffsetsPartitionResponse::default()
                        .with_partition_index(rp.partition_index)
                        .with_timestamp(-1)
                        .with_offset(-1)
                        .with_leader_epoch(-1);
                    if !authorized(&t.name) {
                        record_error(ApiKey::ListOffsets, ec::TOPIC_AUTHORIZATION_FAILED);
                        return resp.with_error_code(ec::TOPIC_AUTHORIZATION_FAILED);
                    }
                    match results.next() {
                        // leader_epoch exists from v4 (KIP-320); before that it must stay -1.
                        Some(Ok((ts, off, epoch))) => resp
                            .with_timestamp(ts)
                            .with_offset(off)
                            .with_leader_epoch(if version >= 4 { epoch } else { -1 }),
                        Some(Err(code)) => {
                            record_error(ApiKey::ListOffsets, code);
                            resp.with_error_code(code)
                        }
                        None => resp.with_error_code(crate::error_codes::UNKNOWN_SERVER_ERROR),
                    }
                })
                .collect();
            ListOffsetsTopicResponse::default()
                .with_name(t.name)
                .with_partitions(partitions)
        })
        .collect();
    ListOffsetsResponse::default().with_topics(topics)
}

/// Answers OffsetForLeaderEpoch (Kafka's `KafkaApis.handleOffsetForLeaderEpochRequest`):
/// `ClusterAction` on the Cluster allows every topic, else `Describe` on each
/// (TOPIC_AUTHORIZATION_FAILED). Per partition, as the leader only (Kafka's
/// `Partition.lastOffsetForLeaderEpoch` with `fetchOnlyFromLeader`): the largest epoch `<=`
/// the requested one and its end offset (the log end offset for the latest epoch; -1 and -1
/// when unknown), or UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER_OR_FOLLOWER (known topic, not
/// hosted or not led here), KAFKA_STORAGE_ERROR (its log could not be created here), FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH (KIP-320).
pub fn offset_for_leader_epoch(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: &OffsetForLeaderEpochRequest,
) -> OffsetForLeaderEpochResponse {
    let cluster_action = broker.authorize(
        ctx,
        AclOperation::ClusterAction,
        ResourceType::Cluster,
        CLUSTER_NAME,
    );
    let image = broker.controller.image();
    let topics = req
        .topics
        .iter()
        .map(|t| {
            let authorized = cluster_action
                || broker.authorize(ctx, AclOperation::Describe, ResourceType::Topic, &t.topic);
            let partitions = t
                .partitions
                .iter()
                .map(|p| {
                    let resp = EpochEndOffset::default()
                        .with_partition(p.partition)
                        .with_leader_epoch(-1)
                        .with_end_offset(-1);
                    let result = if !authorized {
                        Err(ec::TOPIC_AUTHORIZATION_FAILED)
                    } else {
                        let tp = TopicPartition::new(t.topic.as_str(), p.partition);
                        match broker.replica_manager.hosted(&tp) {
                            Ok(part) => part.last_offset_for_leader_epoch(
                                p.current_leader_epoch,
                                p.leader_epoch,
                            ),
                            Err((code, _)) if code == ec::KAFKA_STORAGE_ERROR => Err(code),
                            // A lookup by name, not a walk over every topic.
                            Err(_)
                                if image
                                    .topic(t.topic.as_str())
                                    .is_some_and(|ti| ti.partitions.contains_key(&p.partition)) =>
                            {
                                Err(ec::NOT_LEADER_OR_FOLLOWER)
                            }
                            Err(_) => Err(ec::UNKNOWN_TOPIC_OR_PARTITION),
                        }
                    };
                    match result {
                        Ok((epoch, end_offset)) => {
                            resp.with_leader_epoch(epoch).with_end_offset(end_offset)
                        }
                        Err(code) => {
                            record_error(ApiKey::OffsetForLeaderEpoch, code);
                            resp.with_error_code(code)
                        }
                    }
                })
                .collect();
            OffsetForLeaderTopicResult::default()
                .with_topic(t.topic.clone())
                .with_partitions(partitions)
        })
        .collect();
    OffsetForLeaderEpochResponse::default().with_topics(topics)
}
