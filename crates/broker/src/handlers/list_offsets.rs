//! ListOffsets (key 2), <https://kafka.apache.org/protocol#The_Messages_ListOffsets>:
//! -2 earliest, -1 latest (high watermark, or last stable offset for read_committed),
//! -3 max timestamp (KIP-734, the exact record), -4 earliest local (KIP-405), -5 earliest
//! pending upload and -6 latest tiered (KIP-1005; no tiered storage: offset -1), otherwise the
//! first offset whose timestamp is at or after the target (KIP-79). The lookups are
//! [`ReplicaManager::fetch_offsets`](crate::replica_manager::ReplicaManager::fetch_offsets)
//! (`Partition::fetch_offset_for_timestamp`).

use std::sync::Arc;

use gregor_log::TopicPartition;
use gregor_protocol::kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use gregor_protocol::kafka_protocol::messages::ApiKey;
use gregor_protocol::kafka_protocol::messages::{ListOffsetsRequest, ListOffsetsResponse};

use crate::authorizer::{AclOperation, ResourceType};
use crate::broker::Broker;
use crate::error_codes as ec;
use crate::observability::record_error;
use gregor_network::RequestContext;

pub use crate::replica_manager::partition::{
    EARLIEST_LOCAL_TIMESTAMP, EARLIEST_PENDING_UPLOAD_TIMESTAMP, EARLIEST_TIMESTAMP,
    LATEST_TIERED_TIMESTAMP, LATEST_TIMESTAMP, MAX_TIMESTAMP,
};

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
        .fetch_offsets(req.isolation_level, lookups)
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
