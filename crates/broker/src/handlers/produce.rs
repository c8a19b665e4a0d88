//! Produce (key 0), <https://kafka.apache.org/protocol#The_Messages_Produce>. acks=0 gets no
//! response; acks=1 answers once the batch is in the leader's log; acks=-1 (all) waits until
//! the high watermark passes the batch (every in-sync replica has it) or `timeout_ms` expires
//! (REQUEST_TIMED_OUT). Topics are named by id from v13 (KIP-516).

use std::sync::Arc;
use std::time::Duration;

use gregor_protocol::batch::{Batches, MAGIC_V2};
use gregor_protocol::kafka_protocol::messages::produce_response::{
    PartitionProduceResponse, TopicProduceResponse,
};
use gregor_protocol::kafka_protocol::messages::{
    ApiKey, ProduceRequest, ProduceResponse, RequestHeader, ResponseKind, TopicName,
};
use tokio::sync::Notify;

use super::sb;
use crate::error_codes as ec;
use crate::observability::{self, record_error, InFlight};
use crate::replica_manager::Partition;
use crate::server::{respond, Broker, Handled};

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

/// Handles Produce: appends run now, in request order; an acks=all wait is deferred.
pub fn handle(broker: &Arc<Broker>, header: RequestHeader, req: ProduceRequest) -> Handled {
    let version = header.request_api_version;
    let acks = req.acks;
    let image = broker.controller.image();
    let mut topics = Vec::with_capacity(req.topic_data.len());
    // (topic index, partition index in response, partition, offset the HW must reach)
    let mut waits: Vec<(usize, usize, Arc<Partition>, i64)> = Vec::new();
    for td in req.topic_data {
        let name = if version >= 13 {
            image.topic_by_id(&td.topic_id).map(|t| t.name.clone())
        } else {
            Some(td.name.0.to_string())
        };
        let mut responses = Vec::with_capacity(td.partition_data.len());
        for pd in td.partition_data {
            let idx = pd.index;
            if !matches!(acks, -1..=1) {
                responses.push(partition_error(idx, ec::INVALID_REQUIRED_ACKS, None));
                continue;
            }
            if req.transactional_id.is_some() {
                responses.push(partition_error(
                    idx,
                    ec::TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                    Some("transactions are not supported yet".into()),
                ));
                continue;
            }
            let Some(name) = name.as_deref() else {
                responses.push(partition_error(idx, ec::UNKNOWN_TOPIC_ID, None));
                continue;
            };
            let Some(p) = broker.replica_manager.partition(name, idx) else {
                responses.push(partition_error(idx, ec::UNKNOWN_TOPIC_OR_PARTITION, None));
                continue;
            };
            let records = pd.records.unwrap_or_default();
            if let Err(msg) = check_single_v2_batch(&records, version) {
                responses.push(partition_error(idx, ec::INVALID_RECORD, Some(msg)));
                continue;
            }
            let mut buf = records.to_vec();
            match p.append_records_as_leader(&mut buf, acks) {
                Ok(info) => {
                    if acks == -1 && !info.duplicate {
                        waits.push((
                            topics.len(),
                            responses.len(),
                            p.clone(),
                            info.last_offset + 1,
                        ));
                    }
                    responses.push(
                        PartitionProduceResponse::default()
                            .with_index(idx)
                            .with_base_offset(info.first_offset)
                            .with_log_append_time_ms(info.log_append_time_ms)
                            .with_log_start_offset(info.log_start_offset),
                    );
                }
                Err((code, msg)) => {
                    tracing::debug!(topic = name, partition = idx, code, %msg, "produce rejected");
                    responses.push(partition_error(idx, code, Some(msg)));
                }
            }
        }
        topics.push(
            TopicProduceResponse::default()
                .with_name(if version >= 13 {
                    TopicName::default()
                } else {
                    td.name
                })
                .with_topic_id(td.topic_id)
                .with_partition_responses(responses),
        );
    }
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
    let build = move |topics: Vec<TopicProduceResponse>| {
        respond(
            &header,
            ApiKey::Produce,
            ResponseKind::Produce(ProduceResponse::default().with_responses(topics)),
        )
    };
    let pending: Vec<_> = waits
        .into_iter()
        .filter(|(_, _, p, target)| p.high_watermark() < *target)
        .collect();
    if pending.is_empty() {
        return Handled::Ready(build(topics));
    }
    let timeout = Duration::from_millis(req.timeout_ms.max(0) as u64);
    Handled::Deferred(Box::pin(async move {
        let _delayed = InFlight::new(observability::DELAYED_PRODUCE_REQUESTS);
        let mut topics = topics;
        let deadline = tokio::time::Instant::now() + timeout;
        for (ti, pi, p, target) in pending {
            let notify = Arc::new(Notify::new());
            loop {
                p.register_waiter(&notify);
                if p.high_watermark() >= target {
                    break;
                }
                if tokio::time::timeout_at(deadline, notify.notified())
                    .await
                    .is_err()
                {
                    if p.high_watermark() < target {
                        let r = &mut topics[ti].partition_responses[pi];
                        r.error_code = ec::REQUEST_TIMED_OUT;
                        record_error(ApiKey::Produce, ec::REQUEST_TIMED_OUT);
                    }
                    break;
                }
            }
        }
        build(topics)
    }))
}
