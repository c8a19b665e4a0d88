//! DescribeTopicPartitions (key 75, v0, KIP-966), answered from the metadata image as Kafka's
//! `DescribeTopicPartitionsRequestHandler` and `KRaftMetadataCache.getTopicMetadataForDescribeTopicResponse`:
//!
//! - **Topics**: the requested names, or every topic when the list is empty; only names at or
//!   after the cursor's topic, sorted. A requested topic that does not exist is
//!   UNKNOWN_TOPIC_OR_PARTITION (INVALID_TOPIC_EXCEPTION for an invalid name); with the empty
//!   list such topics are not reported. A requested topic without Describe is
//!   TOPIC_AUTHORIZATION_FAILED with the zero topic id, listed after the others; with the
//!   empty list it is left out.
//! - **Paging**: at most min(`max.request.partition.size.limit` (2000),
//!   `ResponsePartitionLimit`) partitions, at least 1. The cursor's topic starts at the
//!   cursor's partition, later topics at 0. When a topic does not fit, `NextCursor` names it
//!   and its first partition not sent; when the limit is reached exactly at the end of a topic
//!   and more topics follow, `NextCursor` is the next topic at partition 0.
//! - **Errors for the whole request** (Kafka's `getErrorResponse`: every requested topic with
//!   the error, no partitions): INVALID_REQUEST when a topic list is given without the cursor's
//!   topic, or the cursor's partition is negative.
//! - **Partitions**: leader (-1 when the leader is not alive on the request's listener),
//!   leader epoch, replicas, ISR, ELR and last known ELR (KIP-966), offline replicas (as
//!   Metadata); `TopicAuthorizedOperations` is the bit field of the topic operations the
//!   principal may do, for unknown topics too (not for unauthorized ones), as Kafka.
//!
//! Served on broker listeners only (the controller listener does not advertise it).

use std::sync::Arc;

use gregor_metadata::MetadataImage;
use gregor_network::RequestContext;
use gregor_protocol::kafka_protocol::messages::describe_topic_partitions_response::{
    Cursor, DescribeTopicPartitionsResponsePartition, DescribeTopicPartitionsResponseTopic,
};
use gregor_protocol::kafka_protocol::messages::{
    BrokerId, DescribeTopicPartitionsRequest, DescribeTopicPartitionsResponse, TopicName,
};
use uuid::Uuid;

use super::metadata::is_replica_offline;
use super::sb;
use crate::authorizer::{AclOperation, ResourceType};
use crate::broker::Broker;
use crate::error_codes as ec;

/// Kafka's `Topic.isInternal`.
fn is_internal(name: &str) -> bool {
    matches!(
        name,
        "__consumer_offsets" | "__transaction_state" | "__share_group_state"
    )
}

/// The operations Kafka lists for a topic (`AclEntry.supportedOperations(TOPIC)`).
const TOPIC_OPERATIONS: &[AclOperation] = &[
    AclOperation::Read,
    AclOperation::Write,
    AclOperation::Create,
    AclOperation::Delete,
    AclOperation::Alter,
    AclOperation::Describe,
    AclOperation::DescribeConfigs,
    AclOperation::AlterConfigs,
];

fn authorized_operations(broker: &Broker, ctx: &RequestContext, topic: &str) -> i32 {
    TOPIC_OPERATIONS
        .iter()
        .filter(|op| broker.authorize(ctx, **op, ResourceType::Topic, topic))
        .fold(0i32, |bits, op| bits | (1i32 << op.code()))
}

fn ids(v: &[i32]) -> Vec<BrokerId> {
    v.iter().map(|b| BrokerId(*b)).collect()
}

/// Partitions `start..` of `topic`, at most `max`, and the first partition left out (-1 when
/// none is).
fn partitions(
    image: &MetadataImage,
    topic: &gregor_metadata::TopicImage,
    listener: &str,
    start: i32,
    max: i32,
) -> (Vec<DescribeTopicPartitionsResponsePartition>, i32) {
    let count = i32::try_from(topic.partitions.len()).unwrap_or(i32::MAX);
    let upper = count.min(start.saturating_add(max));
    let next = if upper < count { upper } else { -1 };
    let out = (start..upper)
        .filter_map(|idx| topic.partitions.get(&idx).map(|p| (idx, p)))
        .map(|(idx, p)| {
            let leader_alive = image
                .brokers
                .get(&p.leader)
                .is_some_and(|b| !b.fenced && b.endpoint(listener).is_some());
            DescribeTopicPartitionsResponsePartition::default()
                .with_partition_index(idx)
                .with_leader_id(BrokerId(if leader_alive { p.leader } else { -1 }))
                .with_leader_epoch(p.leader_epoch)
                .with_replica_nodes(ids(&p.replicas))
                .with_isr_nodes(ids(&p.isr))
                .with_eligible_leader_replicas(Some(ids(&p.elr)))
                .with_last_known_elr(Some(ids(&p.last_known_elr)))
                .with_offline_replicas(
                    p.replicas
                        .iter()
                        .filter(|r| is_replica_offline(image, p, **r, listener))
                        .map(|b| BrokerId(*b))
                        .collect(),
                )
        })
        .collect();
    (out, next)
}

fn request_error(
    req: &DescribeTopicPartitionsRequest,
    code: i16,
) -> DescribeTopicPartitionsResponse {
    crate::observability::record_error(
        gregor_protocol::kafka_protocol::messages::ApiKey::DescribeTopicPartitions,
        code,
    );
    DescribeTopicPartitionsResponse::default().with_topics(
        req.topics
            .iter()
            .map(|t| {
                DescribeTopicPartitionsResponseTopic::default()
                    .with_error_code(code)
                    .with_name(Some(t.name.clone()))
                    .with_is_internal(false)
            })
            .collect(),
    )
}

/// Answers DescribeTopicPartitions from this broker's metadata image.
pub fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: &DescribeTopicPartitionsRequest,
) -> DescribeTopicPartitionsResponse {
    let image = broker.controller.image();
    let listener = ctx.listener_name.as_str();
    let fetch_all = req.topics.is_empty();
    let cursor_topic = req
        .cursor
        .as_ref()
        .map_or(String::new(), |c| c.topic_name.0.to_string());
    let mut topics: Vec<String> = if fetch_all {
        image
            .topic_ids
            .keys()
            .filter(|n| n.as_str() >= cursor_topic.as_str())
            .cloned()
            .collect()
    } else {
        req.topics
            .iter()
            .map(|t| t.name.0.to_string())
            .filter(|n| n.as_str() >= cursor_topic.as_str())
            .collect()
    };
    topics.sort();
    topics.dedup();
    if let Some(c) = &req.cursor {
        if !fetch_all && !topics.contains(&cursor_topic) {
            return request_error(req, ec::INVALID_REQUEST);
        }
        if c.partition_index < 0 {
            return request_error(req, ec::INVALID_REQUEST);
        }
    }
    let mut unauthorized = Vec::new();
    let authorized: Vec<String> = topics
        .into_iter()
        .filter(|name| {
            let ok = broker.authorize(ctx, AclOperation::Describe, ResourceType::Topic, name);
            if !ok && !fetch_all {
                unauthorized.push(
                    DescribeTopicPartitionsResponseTopic::default()
                        .with_error_code(ec::TOPIC_AUTHORIZATION_FAILED)
                        .with_name(Some(TopicName(sb(name))))
                        .with_topic_id(Uuid::nil())
                        .with_is_internal(false),
                );
            }
            ok
        })
        .collect();
    let limit = broker
        .config
        .max_request_partition_size_limit()
        .min(req.response_partition_limit)
        .max(1);
    let mut remaining = limit;
    let mut out = Vec::new();
    let mut next_cursor = None;
    for name in authorized {
        if remaining <= 0 {
            next_cursor = Some(
                Cursor::default()
                    .with_topic_name(TopicName(sb(&name)))
                    .with_partition_index(0),
            );
            break;
        }
        let Some(t) = image.topic(&name) else {
            if !fetch_all {
                let code = match gregor_metadata::controller::validate_topic_name(&name) {
                    Ok(()) => ec::UNKNOWN_TOPIC_OR_PARTITION,
                    Err(_) => ec::INVALID_TOPIC_EXCEPTION,
                };
                crate::observability::record_error(
                    gregor_protocol::kafka_protocol::messages::ApiKey::DescribeTopicPartitions,
                    code,
                );
                out.push(
                    DescribeTopicPartitionsResponseTopic::default()
                        .with_error_code(code)
                        .with_name(Some(TopicName(sb(&name))))
                        .with_topic_id(Uuid::nil())
                        .with_is_internal(is_internal(&name))
                        // As Kafka: every topic of the image's answer gets the bit field.
                        .with_topic_authorized_operations(authorized_operations(
                            broker, ctx, &name,
                        )),
                );
            }
            continue;
        };
        let start = match &req.cursor {
            Some(c) if name == cursor_topic => c.partition_index,
            _ => 0,
        };
        let (parts, next) = partitions(&image, t, listener, start, remaining);
        let sent = i32::try_from(parts.len()).unwrap_or(i32::MAX);
        out.push(
            DescribeTopicPartitionsResponseTopic::default()
                .with_name(Some(TopicName(sb(&name))))
                .with_topic_id(t.topic_id)
                .with_is_internal(is_internal(&name))
                .with_partitions(parts)
                .with_topic_authorized_operations(authorized_operations(broker, ctx, &name)),
        );
        if next != -1 {
            next_cursor = Some(
                Cursor::default()
                    .with_topic_name(TopicName(sb(&name)))
                    .with_partition_index(next),
            );
            break;
        }
        remaining -= sent;
    }
    out.extend(unauthorized);
    DescribeTopicPartitionsResponse::default()
        .with_topics(out)
        .with_next_cursor(next_cursor)
}
