//! Produce (key 0), <https://kafka.apache.org/protocol#The_Messages_Produce>. acks=0 gets no
//! response; acks=1 answers once the batch is in the leader's log; acks=-1 (all) waits until
//! the high watermark passes the batch (every in-sync replica has it) or `timeout_ms` expires
//! (REQUEST_TIMED_OUT). Topics are named by id from v13 (KIP-516).

use std::sync::Arc;

use gregor_log::TopicPartition;

use gregor_protocol::batch::{Batches, MAGIC_V2};
use gregor_protocol::kafka_protocol::messages::produce_response::{
    BatchIndexAndErrorMessage, PartitionProduceResponse, TopicProduceResponse,
};
use gregor_protocol::kafka_protocol::messages::{
    ApiKey, ProduceRequest, ProduceResponse, ResponseKind, TopicName,
};

use super::sb;
use crate::authorizer::{AclOperation, ResourceType};
use crate::broker::Broker;
use crate::error_codes as ec;
use crate::observability::record_error;
use crate::replica_manager::{AppendOrigin, AppendOutcome, PartitionAppendResult};
use gregor_network::RequestContext;
use gregor_network::{respond, Handled};

fn partition_error(index: i32, code: i16, message: Option<String>) -> PartitionProduceResponse {
    record_error(ApiKey::Produce, code);
    PartitionProduceResponse::default()
        .with_index(index)
        .with_error_code(code)
        .with_base_offset(-1)
        .with_log_append_time_ms(-1)
        .with_log_start_offset(-1)
        .with_error_message(message.map(|m| sb(&m)))
}

/// The client id Kafka's admin tools use (`AdminUtils.ADMIN_CLIENT_ID`); its produce requests
/// may write internal topics.
pub const ADMIN_CLIENT_ID: &str = "__admin_client";

/// Kafka's `Topic.isInternal`: the topics coordinators own.
pub fn is_internal_topic(name: &str) -> bool {
    matches!(
        name,
        "__consumer_offsets" | "__transaction_state" | "__share_group_state"
    )
}

/// Kafka's `ProduceRequest.validateRecords`: from v3 a partition carries exactly one v2 batch,
/// and (`LogValidator`) its base offset is 0.
fn check_single_v2_batch(records: &[u8], version: i16) -> Result<(), String> {
    let mut it = Batches::new(records);
    let first = match it.next() {
        None => {
            return Err(format!(
                "Produce requests with version {version} must have at least one record batch per partition"
            ))
        }
        Some(Err(e)) => return Err(e.to_string()),
        Some(Ok((_, h))) => h,
    };
    if first.magic != MAGIC_V2 {
        return Err(format!(
            "Produce requests with version {version} are only allowed to contain record batches with magic version 2"
        ));
    }
    if it.next().is_some() {
        return Err(format!(
            "Produce requests with version {version} are only allowed to contain exactly one record batch per partition"
        ));
    }
    // Kafka's LogValidator: a client's batch starts at offset 0 (the broker assigns offsets).
    if first.base_offset != 0 {
        return Err(format!(
            "The baseOffset of the record batch in the append should be 0, but it is {}",
            first.base_offset
        ));
    }
    Ok(())
}

/// Handles Produce: decodes, checks what is the request's business (topic ids, one v2 batch
/// per partition, no transactions yet), hands the batches to
/// [`ReplicaManager::append_records`](crate::replica_manager::ReplicaManager::append_records)
/// and encodes its results. The appends happen before this returns (request order); an
/// acks=all wait is deferred. Needs `Write` on each topic (TOPIC_AUTHORIZATION_FAILED).
pub async fn handle(broker: &Arc<Broker>, ctx: &RequestContext, req: ProduceRequest) -> Handled {
    let header = ctx.header.clone();
    let version = header.request_api_version;
    let acks = req.acks;
    let image = broker.controller.image();
    // Per partition, in request order: an error found here, or the entry to append.
    let mut slots: Vec<Vec<(i32, Result<usize, PartitionProduceResponse>)>> = Vec::new();
    let mut entries: Vec<(TopicPartition, Vec<u8>)> = Vec::new();
    let mut topics = Vec::with_capacity(req.topic_data.len());
    for td in req.topic_data {
        let name = if version >= 13 {
            image.topic_by_id(&td.topic_id).map(|t| t.name.clone())
        } else {
            Some(td.name.0.to_string())
        };
        let internal_refused =
            name.as_deref().is_some_and(is_internal_topic) && ctx.client_id() != ADMIN_CLIENT_ID;
        let authorized = name
            .as_deref()
            .is_none_or(|n| broker.authorize(ctx, AclOperation::Write, ResourceType::Topic, n));
        let mut parts = Vec::with_capacity(td.partition_data.len());
        for pd in td.partition_data {
            let idx = pd.index;
            let slot = if !matches!(acks, -1..=1) {
                Err(partition_error(idx, ec::INVALID_REQUIRED_ACKS, None))
            } else if !authorized {
                Err(partition_error(idx, ec::TOPIC_AUTHORIZATION_FAILED, None))
            } else if internal_refused {
                // Kafka's ReplicaManager: only coordinators (and the admin client id) write
                // internal topics; a producer's batch there would corrupt their state.
                Err(partition_error(
                    idx,
                    ec::INVALID_TOPIC_EXCEPTION,
                    Some(format!(
                        "Cannot append to internal topic {}",
                        name.as_deref().unwrap_or_default()
                    )),
                ))
            } else if req.transactional_id.is_some() {
                Err(partition_error(
                    idx,
                    ec::TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                    Some("transactions are not supported yet".into()),
                ))
            } else if let Some(name) = name.as_deref() {
                let records = pd.records.unwrap_or_default();
                match check_single_v2_batch(&records, version) {
                    Err(msg) if broker.replica_manager.partition(name, idx).is_some() => {
                        Err(partition_error(idx, ec::INVALID_RECORD, Some(msg)))
                    }
                    _ => {
                        entries.push((TopicPartition::new(name, idx), records.to_vec()));
                        Ok(entries.len() - 1)
                    }
                }
            } else {
                Err(partition_error(idx, ec::UNKNOWN_TOPIC_ID, None))
            };
            parts.push((idx, slot));
        }
        slots.push(parts);
        topics.push(
            TopicProduceResponse::default()
                .with_name(if version >= 13 {
                    TopicName::default()
                } else {
                    td.name
                })
                .with_topic_id(td.topic_id),
        );
    }
    let timeout_ms = i64::from(req.timeout_ms);
    let outcome = if entries.is_empty() {
        AppendOutcome::Complete(Vec::new())
    } else {
        broker
            .replica_manager
            .append_records(timeout_ms, acks, AppendOrigin::Client, entries)
            .await
    };
    let encode = move |results: Vec<PartitionAppendResult>| -> Vec<TopicProduceResponse> {
        topics
            .into_iter()
            .zip(slots)
            .map(|(topic, parts)| {
                let responses = parts
                    .into_iter()
                    .map(|(idx, slot)| match slot {
                        Err(resp) => resp,
                        Ok(i) => partition_response(idx, &results[i]),
                    })
                    .collect();
                topic.with_partition_responses(responses)
            })
            .collect()
    };
    let build = move |topics: Vec<TopicProduceResponse>| {
        respond(
            &header,
            ApiKey::Produce,
            ResponseKind::Produce(ProduceResponse::default().with_responses(topics)),
        )
    };
    match outcome {
        AppendOutcome::Complete(results) => {
            let topics = encode(results);
            if acks == 0 {
                let failed = topics
                    .iter()
                    .flat_map(|t| &t.partition_responses)
                    .any(|p| p.error_code != ec::NONE);
                return if failed {
                    Handled::CloseConnection
                } else {
                    Handled::Ready(None)
                };
            }
            Handled::Ready(build(topics))
        }
        AppendOutcome::Delayed(delayed) => Handled::Deferred(Box::pin(async move {
            let results = delayed.complete().await;
            build(encode(results))
        })),
    }
}

/// The response for a partition the replica manager handled (errors are counted here). A
/// batch refused for some of its records names them in `record_errors` (KIP-467, v8+) with
/// the log start offset, as Kafka's `RecordValidationException` answer does.
fn partition_response(index: i32, r: &PartitionAppendResult) -> PartitionProduceResponse {
    if r.error_code != ec::NONE {
        return partition_error(index, r.error_code, r.error_message.clone())
            .with_log_start_offset(if r.record_errors.is_empty() {
                -1
            } else {
                r.log_start_offset
            })
            .with_record_errors(
                r.record_errors
                    .iter()
                    .map(|e| {
                        BatchIndexAndErrorMessage::default()
                            .with_batch_index(e.batch_index)
                            .with_batch_index_error_message(Some(sb(&e.message)))
                    })
                    .collect(),
            );
    }
    PartitionProduceResponse::default()
        .with_index(index)
        .with_base_offset(r.base_offset)
        .with_log_append_time_ms(r.log_append_time_ms)
        .with_log_start_offset(r.log_start_offset)
}
