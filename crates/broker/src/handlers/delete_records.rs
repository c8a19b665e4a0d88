//! DeleteRecords (key 21), <https://kafka.apache.org/protocol#The_Messages_DeleteRecords>,
//! KIP-107: moves each partition's log start offset (its "low watermark") up to the requested
//! offset, -1 meaning the high watermark. Records below it are no longer served (fetches get
//! OFFSET_OUT_OF_RANGE, ListOffsets earliest returns the new start) and whole segments below
//! it are deleted by the next retention check. The answer waits (up to the request's
//! `TimeoutMs`) until every live replica's log start offset reached the offset (Kafka's
//! `DelayedDeleteRecords`). The work is
//! [`ReplicaManager::delete_records_many`](crate::replica_manager::ReplicaManager::delete_records_many).

use std::sync::Arc;

use gregor_log::TopicPartition;
use gregor_protocol::kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
use gregor_protocol::kafka_protocol::messages::{DeleteRecordsRequest, DeleteRecordsResponse};

use crate::authorizer::{AclOperation, ResourceType};
use crate::broker::Broker;
use crate::error_codes as ec;
use gregor_network::RequestContext;

/// Answers DeleteRecords. Needs `Delete` on each topic (TOPIC_AUTHORIZATION_FAILED).
pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: &DeleteRecordsRequest,
    _version: i16,
) -> DeleteRecordsResponse {
    let authorized =
        |name: &str| broker.authorize(ctx, AclOperation::Delete, ResourceType::Topic, name);
    let offsets: Vec<(TopicPartition, i64)> = req
        .topics
        .iter()
        .filter(|t| authorized(&t.name))
        .flat_map(|t| {
            t.partitions.iter().map(|p| {
                (
                    TopicPartition::new(t.name.to_string(), p.partition_index),
                    p.offset,
                )
            })
        })
        .collect();
    let mut results = broker
        .replica_manager
        .delete_records_many(i64::from(req.timeout_ms), offsets)
        .await
        .into_iter();
    let topics = req
        .topics
        .iter()
        .map(|t| {
            let authorized = authorized(&t.name);
            let partitions = t
                .partitions
                .iter()
                .map(|p| {
                    let result = DeleteRecordsPartitionResult::default()
                        .with_partition_index(p.partition_index);
                    if !authorized {
                        return result
                            .with_low_watermark(-1)
                            .with_error_code(ec::TOPIC_AUTHORIZATION_FAILED);
                    }
                    match results.next() {
                        Some(r) => {
                            if let Some(message) = r.message {
                                tracing::debug!(topic = %&*t.name, partition = p.partition_index,
                                    code = r.error_code, %message, "DeleteRecords refused");
                            }
                            result
                                .with_low_watermark(r.low_watermark)
                                .with_error_code(r.error_code)
                        }
                        None => result
                            .with_low_watermark(-1)
                            .with_error_code(ec::UNKNOWN_SERVER_ERROR),
                    }
                })
                .collect();
            DeleteRecordsTopicResult::default()
                .with_name(t.name.clone())
                .with_partitions(partitions)
        })
        .collect();
    DeleteRecordsResponse::default().with_topics(topics)
}
