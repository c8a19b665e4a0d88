//! Fetch (key 1), <https://kafka.apache.org/protocol#The_Messages_Fetch>. Reads are bounded by
//! the high watermark (or the last stable offset for read_committed). A fetch with less than
//! `min_bytes` available waits up to `max_wait_ms`, woken when a high watermark of one of its
//! partitions moves (no polling). `max_bytes` and `partition_max_bytes` are soft for the first
//! batch returned (KIP-74). Empty partitions carry zero-length records, never null. Topic ids
//! from v13 (KIP-516). gregor does not create incremental fetch sessions (KIP-227): it answers
//! session id 0, which tells clients to keep sending full fetch requests.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use gregor_log::LogError;
use gregor_protocol::kafka_protocol::messages::fetch_response::{
    FetchableTopicResponse, PartitionData,
};
use gregor_protocol::kafka_protocol::messages::{
    ApiKey, BrokerId, FetchRequest, FetchResponse, RequestHeader, ResponseKind, TopicName,
};
use tokio::sync::Notify;
use uuid::Uuid;

use crate::error_codes as ec;
use crate::observability::{self, record_error, InFlight};
use crate::replica_manager::Partition;
use crate::server::{respond, Broker, Handled};
use gregor_protocol::batch::Batches;

struct PartitionPlan {
    index: i32,
    fetch_offset: i64,
    partition_max_bytes: i32,
    current_leader_epoch: i32,
    partition: Result<Arc<Partition>, i16>,
}

struct TopicPlan {
    name: TopicName,
    topic_id: Uuid,
    partitions: Vec<PartitionPlan>,
}

fn empty_partition(index: i32, code: i16) -> PartitionData {
    PartitionData::default()
        .with_partition_index(index)
        .with_error_code(code)
        .with_high_watermark(-1)
        .with_last_stable_offset(-1)
        .with_log_start_offset(-1)
        .with_preferred_read_replica(BrokerId(-1))
        .with_records(Some(Bytes::new()))
}

/// One pass over the plan. Returns the response topics, the bytes of records gathered, and
/// whether any partition had an error.
fn read_pass(
    plan: &[TopicPlan],
    max_bytes: i32,
    isolation_level: i8,
    version: i16,
) -> (Vec<FetchableTopicResponse>, usize, bool) {
    let mut remaining = max_bytes.max(0) as usize;
    let mut total = 0usize;
    let mut min_one_batch = true;
    let mut any_error = false;
    let mut topics = Vec::with_capacity(plan.len());
    for t in plan {
        let mut parts = Vec::with_capacity(t.partitions.len());
        for pp in &t.partitions {
            let p = match &pp.partition {
                Ok(p) => p,
                Err(code) => {
                    any_error = true;
                    record_error(ApiKey::Fetch, *code);
                    parts.push(empty_partition(pp.index, *code));
                    continue;
                }
            };
            if let Err(code) = p.check_leader(pp.current_leader_epoch) {
                any_error = true;
                record_error(ApiKey::Fetch, code);
                parts.push(empty_partition(pp.index, code));
                continue;
            }
            let limit = (pp.partition_max_bytes.max(0) as usize).min(remaining);
            let hw = p.high_watermark();
            let lso = p.last_stable_offset();
            let base = PartitionData::default()
                .with_partition_index(pp.index)
                .with_high_watermark(hw)
                .with_last_stable_offset(lso)
                .with_log_start_offset(p.log.log_start_offset())
                .with_preferred_read_replica(BrokerId(-1))
                .with_aborted_transactions((isolation_level == 1).then(Vec::new));
            match p.read(pp.fetch_offset, limit, isolation_level, min_one_batch) {
                Ok(info) => {
                    let n = info.records.len();
                    if n > 0 {
                        min_one_batch = false;
                        let records: i64 = Batches::new(&info.records)
                            .filter_map(Result::ok)
                            .map(|(_, h)| i64::from(h.records_count))
                            .sum();
                        p.metrics.bytes_out.increment(n as u64);
                        p.metrics.records_out.increment(records.max(0) as u64);
                    }
                    remaining = remaining.saturating_sub(n);
                    total += n;
                    parts.push(base.with_records(Some(info.records)));
                }
                Err(e) => {
                    any_error = true;
                    let code = match &e {
                        LogError::OffsetOutOfRange { .. } => ec::OFFSET_OUT_OF_RANGE,
                        other => other.kafka_error_code(),
                    };
                    record_error(ApiKey::Fetch, code);
                    // As Kafka's ReplicaManager on a failed read: offsets unknown (-1).
                    parts.push(
                        base.with_error_code(code)
                            .with_high_watermark(-1)
                            .with_last_stable_offset(-1)
                            .with_log_start_offset(-1)
                            .with_records(Some(Bytes::new())),
                    );
                }
            }
        }
        topics.push(
            FetchableTopicResponse::default()
                .with_topic(if version >= 13 {
                    TopicName::default()
                } else {
                    t.name.clone()
                })
                .with_topic_id(t.topic_id)
                .with_partitions(parts),
        );
    }
    (topics, total, any_error)
}

/// Handles Fetch: the first read runs now; a long poll is deferred.
pub fn handle(broker: &Arc<Broker>, header: RequestHeader, req: FetchRequest) -> Handled {
    let version = header.request_api_version;
    let reply = move |header: &RequestHeader, body: FetchResponse| {
        respond(header, ApiKey::Fetch, ResponseKind::Fetch(body))
    };
    if version >= 7 && req.session_id != 0 {
        // gregor never hands out session ids, so any non-zero id is unknown.
        let body = FetchResponse::default().with_error_code(ec::FETCH_SESSION_ID_NOT_FOUND);
        return Handled::Ready(reply(&header, body));
    }
    let image = broker.controller.image();
    let plan: Vec<TopicPlan> = req
        .topics
        .iter()
        .map(|t| {
            let name = if version >= 13 {
                image.topic_by_id(&t.topic_id).map(|ti| ti.name.clone())
            } else {
                Some(t.topic.0.to_string())
            };
            TopicPlan {
                name: t.topic.clone(),
                topic_id: t.topic_id,
                partitions: t
                    .partitions
                    .iter()
                    .map(|fp| PartitionPlan {
                        index: fp.partition,
                        fetch_offset: fp.fetch_offset,
                        partition_max_bytes: fp.partition_max_bytes,
                        current_leader_epoch: fp.current_leader_epoch,
                        partition: match &name {
                            None => Err(ec::UNKNOWN_TOPIC_ID),
                            Some(n) => broker
                                .replica_manager
                                .partition(n, fp.partition)
                                .ok_or(ec::UNKNOWN_TOPIC_OR_PARTITION),
                        },
                    })
                    .collect(),
            }
        })
        .collect();
    let (max_bytes, isolation, min_bytes) = (req.max_bytes, req.isolation_level, req.min_bytes);
    let (topics, total, any_error) = read_pass(&plan, max_bytes, isolation, version);
    let done = |total: usize, any_error: bool| {
        any_error || total >= min_bytes.max(0) as usize || req.max_wait_ms <= 0 || plan.is_empty()
    };
    if done(total, any_error) {
        return Handled::Ready(reply(
            &header,
            FetchResponse::default().with_responses(topics),
        ));
    }
    let wait = Duration::from_millis(req.max_wait_ms.max(0) as u64);
    drop(topics);
    Handled::Deferred(Box::pin(async move {
        let _delayed = InFlight::new(observability::DELAYED_FETCH_REQUESTS);
        let deadline = tokio::time::Instant::now() + wait;
        let notify = Arc::new(Notify::new());
        let topics = loop {
            for t in &plan {
                for pp in &t.partitions {
                    if let Ok(p) = &pp.partition {
                        p.register_waiter(&notify);
                    }
                }
            }
            // Re-read after registering so a high-watermark move in between is not missed.
            let (topics, total, any_error) = read_pass(&plan, max_bytes, isolation, version);
            if any_error || total >= min_bytes.max(0) as usize {
                break topics;
            }
            if tokio::time::timeout_at(deadline, notify.notified())
                .await
                .is_err()
            {
                // One last read at the deadline; it has what arrived meanwhile.
                break read_pass(&plan, max_bytes, isolation, version).0;
            }
        };
        reply(&header, FetchResponse::default().with_responses(topics))
    }))
}
