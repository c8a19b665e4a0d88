//! ListOffsets (key 2), <https://kafka.apache.org/protocol#The_Messages_ListOffsets>:
//! -2 earliest, -1 latest (high watermark, or last stable offset for read_committed),
//! -3 max timestamp (KIP-734, the exact record), -4 earliest local (KIP-405), -5 earliest
//! pending upload and -6 latest tiered (KIP-1005; no tiered storage: offset -1), otherwise the
//! first offset whose timestamp is at or after the target (KIP-79).

use std::sync::Arc;

use gregor_protocol::kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use gregor_protocol::kafka_protocol::messages::{ListOffsetsRequest, ListOffsetsResponse};

use crate::authorizer::{AclOperation, ResourceType};
use crate::broker::Broker;
use crate::error_codes as ec;
use crate::observability::record_error;
use crate::replica_manager::Partition;
use gregor_network::RequestContext;
use gregor_protocol::kafka_protocol::messages::ApiKey;

/// Earliest offset.
pub const EARLIEST_TIMESTAMP: i64 = -2;
/// Latest offset.
pub const LATEST_TIMESTAMP: i64 = -1;
/// Offset of the record with the largest timestamp.
pub const MAX_TIMESTAMP: i64 = -3;
/// Earliest offset in local storage.
pub const EARLIEST_LOCAL_TIMESTAMP: i64 = -4;
/// Earliest offset not yet uploaded to tiered storage.
pub const EARLIEST_PENDING_UPLOAD_TIMESTAMP: i64 = -5;
/// Latest offset in tiered storage.
pub const LATEST_TIERED_TIMESTAMP: i64 = -6;

fn lookup(p: &Partition, timestamp: i64, isolation_level: i8) -> Result<(i64, i64, i32), i16> {
    let epoch = p.log.latest_leader_epoch().unwrap_or(-1);
    match timestamp {
        LATEST_TIMESTAMP => {
            let off = if isolation_level == 1 {
                p.last_stable_offset()
            } else {
                p.high_watermark()
            };
            Ok((-1, off, epoch))
        }
        EARLIEST_TIMESTAMP | EARLIEST_LOCAL_TIMESTAMP => Ok((-1, p.log.log_start_offset(), epoch)),
        EARLIEST_PENDING_UPLOAD_TIMESTAMP | LATEST_TIERED_TIMESTAMP => Ok((-1, -1, -1)),
        MAX_TIMESTAMP => match p.log.max_timestamp_and_offset() {
            Ok(Some(t)) if t.offset < p.high_watermark() => {
                Ok((t.timestamp_ms, t.offset, t.leader_epoch.unwrap_or(-1)))
            }
            Ok(_) => Ok((-1, -1, -1)),
            Err(e) => Err(e.kafka_error_code()),
        },
        ts if ts < 0 => Err(ec::INVALID_REQUEST),
        ts => match p.log.fetch_offset_by_timestamp(ts) {
            Ok(Some(t)) if t.offset < p.high_watermark() => {
                Ok((t.timestamp_ms, t.offset, t.leader_epoch.unwrap_or(-1)))
            }
            Ok(_) => Ok((-1, -1, -1)),
            Err(e) => Err(e.kafka_error_code()),
        },
    }
}

/// Answers ListOffsets. Needs `Describe` on each topic (TOPIC_AUTHORIZATION_FAILED).
pub fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: ListOffsetsRequest,
    version: i16,
) -> ListOffsetsResponse {
    let rm = &broker.replica_manager;
    let topics = req
        .topics
        .into_iter()
        .map(|t| {
            let authorized =
                broker.authorize(ctx, AclOperation::Describe, ResourceType::Topic, &t.name);
            let partitions = t
                .partitions
                .iter()
                .map(|rp| {
                    let resp = ListOffsetsPartitionResponse::default()
                        .with_partition_index(rp.partition_index)
                        .with_timestamp(-1)
                        .with_offset(-1)
                        .with_leader_epoch(-1);
                    if !authorized {
                        record_error(ApiKey::ListOffsets, ec::TOPIC_AUTHORIZATION_FAILED);
                        return resp.with_error_code(ec::TOPIC_AUTHORIZATION_FAILED);
                    }
                    let Some(p) = rm.partition(&t.name, rp.partition_index) else {
                        record_error(ApiKey::ListOffsets, ec::UNKNOWN_TOPIC_OR_PARTITION);
                        return resp.with_error_code(ec::UNKNOWN_TOPIC_OR_PARTITION);
                    };
                    if let Err(code) = p.check_leader(rp.current_leader_epoch) {
                        record_error(ApiKey::ListOffsets, code);
                        return resp.with_error_code(code);
                    }
                    match lookup(&p, rp.timestamp, req.isolation_level) {
                        // leader_epoch exists from v4 (KIP-320); before that it must stay -1.
                        Ok((ts, off, epoch)) => resp
                            .with_timestamp(ts)
                            .with_offset(off)
                            .with_leader_epoch(if version >= 4 { epoch } else { -1 }),
                        Err(code) => {
                            record_error(ApiKey::ListOffsets, code);
                            resp.with_error_code(code)
                        }
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
