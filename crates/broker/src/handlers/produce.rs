//! Produce (key 0), <https://kafka.apache.org/protocol#The_Messages_Produce>. acks=0 gets no
//! response; acks=1 answers once the batch is in the leader's log; acks=-1 (all) waits until
//! the high watermark passes the batch (every in-sync replica has it) or `timeout_ms` expires
//! (REQUEST_TIMED_OUT). Topics are named by id from v13 (KIP-516).
//!
//! Transactions (KIP-98, KIP-890): a request with transactional batches needs a
//! `transactional_id` the principal may `Write` (else TRANSACTIONAL_ID_AUTHORIZATION_FAILED for
//! the whole request) and one producer id and epoch (else INVALID_PRODUCER_ID_MAPPING). With
//! `transaction.partition.verification.enable` (default true), a producer's first
//! transactional write to a partition is first verified with its transaction coordinator
//! (AddPartitionsToTxn v4+: verify only up to Produce v11, add the partition from v12;
//! [`crate::txn_verification`]); a failed verification answers the coordinator's error as
//! Kafka does (INVALID_TXN_STATE, INVALID_PRODUCER_EPOCH, or NOT_ENOUGH_REPLICAS for a
//! coordinator that cannot answer now).

use std::sync::Arc;

use gregor_log::{TopicPartition, VerificationGuard};

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
use crate::replica_manager::{AppendOrigin, AppendOutcome, AppendWork, PartitionAppendResult};
use crate::txn_verification::{
    ec as txn_ec, produce_error_for_verification, TransactionSupportedOperation,
    TxnVerificationRequest,
};
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
/// per partition, the transactional id and KIP-890 verification of transactional batches),
/// hands the batches to
/// [`ReplicaManager::append_entries`](crate::replica_manager::ReplicaManager::append_entries)
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
    // Transactional batches (Kafka's `KafkaApis.handleProduceRequest` and
    // `ReplicaManager.handleProduceAppend`).
    let txn = match transactional_producer(&entries) {
        Ok(txn) => txn,
        Err(()) => {
            return whole_request_error(
                &header,
                topics,
                slots,
                acks,
                txn_ec::INVALID_PRODUCER_ID_MAPPING,
                "Transactional records contained more than one producer ID",
            )
        }
    };
    let mut guards: Vec<Option<VerificationGuard>> = vec![None; entries.len()];
    let mut refused: Vec<Option<PartitionAppendResult>> = vec![None; entries.len()];
    if let Some((producer_id, producer_epoch)) = txn {
        let allowed = req.transactional_id.as_ref().is_some_and(|id| {
            broker.authorize(ctx, AclOperation::Write, ResourceType::TransactionalId, id)
        });
        let Some(transactional_id) = req.transactional_id.as_ref().filter(|_| allowed) else {
            return whole_request_error(
                &header,
                topics,
                slots,
                acks,
                ec::TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                "",
            );
        };
        let rm = &broker.replica_manager;
        if broker
            .config
            .transaction_partition_verification_enable(&rm.dynamic_configs())
        {
            let mut to_verify = Vec::new();
            for (i, (tp, records)) in entries.iter().enumerate() {
                let Some(h) = transactional_header(records) else {
                    continue;
                };
                match rm.maybe_start_transaction_verification(
                    tp,
                    producer_id,
                    h.base_sequence,
                    producer_epoch,
                    TransactionSupportedOperation::for_produce_version(version)
                        .supports_epoch_bump(),
                ) {
                    Ok(guard) => {
                        guards[i] = Some(guard);
                        if !guard.is_sentinel() {
                            to_verify.push(i);
                        }
                    }
                    Err(code) => refused[i] = Some(PartitionAppendResult::error(code, None)),
                }
            }
            if !to_verify.is_empty() {
                let request = TxnVerificationRequest {
                    transactional_id: transactional_id.0.to_string(),
                    producer_id,
                    producer_epoch,
                    partitions: to_verify.iter().map(|i| entries[*i].0.clone()).collect(),
                    operation: TransactionSupportedOperation::for_produce_version(version),
                };
                let errors = match rm.txn_verifier() {
                    Some(sender) => {
                        // Kafka's `maybeRetryOnConcurrentTransactions`: the previous
                        // transaction is still completing; ask again after a backoff until
                        // add.partitions.to.txn.retry.backoff.max.ms has passed.
                        let (backoff_ms, max_ms) = broker
                            .config
                            .add_partitions_to_txn_retry_ms(&rm.dynamic_configs());
                        let started = std::time::Instant::now();
                        loop {
                            let errors = sender.add_or_verify(request.clone()).await;
                            let concurrent = errors
                                .values()
                                .any(|c| *c == txn_ec::CONCURRENT_TRANSACTIONS);
                            if !concurrent
                                || started.elapsed() >= std::time::Duration::from_millis(max_ms)
                            {
                                break errors;
                            }
                            tokio::time::sleep(std::time::Duration::from_millis(backoff_ms)).await;
                        }
                    }
                    None => request
                        .partitions
                        .iter()
                        .map(|tp| (tp.clone(), txn_ec::COORDINATOR_NOT_AVAILABLE))
                        .collect(),
                };
                for i in to_verify {
                    if let Some(code) = errors.get(&entries[i].0) {
                        let (code, message) = produce_error_for_verification(*code);
                        refused[i] = Some(PartitionAppendResult::error(code, message));
                    }
                }
            }
        }
    }
    let mut work = Vec::with_capacity(entries.len());
    for (i, (tp, records)) in entries.into_iter().enumerate() {
        if refused[i].is_none() {
            work.push((tp, AppendWork::Records(records, guards[i])));
        }
    }
    let outcome = if work.is_empty() {
        AppendOutcome::Complete(Vec::new())
    } else {
        broker
            .replica_manager
            .append_entries(timeout_ms, acks, AppendOrigin::Client, work)
            .await
    };
    // Results in the entries' order: the verification's refusals, the appends' in between.
    let merge = move |appended: Vec<PartitionAppendResult>| -> Vec<PartitionAppendResult> {
        let mut appended = appended.into_iter();
        refused
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    appended.next().unwrap_or_else(|| {
                        PartitionAppendResult::error(ec::UNKNOWN_SERVER_ERROR, None)
                    })
                })
            })
            .collect()
    };
    let encode = move |results: Vec<PartitionAppendResult>| -> Vec<TopicProduceResponse> {
        let results = merge(results);
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

/// The producer of the request's transactional batches (Kafka's `handleProduceAppend`):
/// `Ok(None)` when there are none, `Err` when they carry more than one (producer id, epoch).
fn transactional_producer(entries: &[(TopicPartition, Vec<u8>)]) -> Result<Option<(i64, i16)>, ()> {
    let mut found: Option<(i64, i16)> = None;
    for (_, records) in entries {
        for (_, h) in Batches::new(records).filter_map(Result::ok) {
            if !(h.is_transactional() && h.has_producer_id()) {
                continue;
            }
            let this = (h.producer_id, h.producer_epoch);
            match found {
                Some(f) if f != this => return Err(()),
                _ => found = Some(this),
            }
        }
    }
    Ok(found)
}

/// The header of the first transactional batch of `records`, if any.
fn transactional_header(records: &[u8]) -> Option<gregor_protocol::batch::BatchHeader> {
    Batches::new(records)
        .filter_map(Result::ok)
        .map(|(_, h)| h)
        .find(|h| h.is_transactional() && h.has_producer_id())
}

/// Kafka's error response to a whole Produce request: `code` for every partition (acks=0
/// gets no response: the connection is closed, as for a failed acks=0 append).
fn whole_request_error(
    header: &gregor_protocol::kafka_protocol::messages::RequestHeader,
    topics: Vec<TopicProduceResponse>,
    slots: Vec<Vec<(i32, Result<usize, PartitionProduceResponse>)>>,
    acks: i16,
    code: i16,
    message: &str,
) -> Handled {
    if acks == 0 {
        return Handled::CloseConnection;
    }
    let message = (!message.is_empty()).then(|| message.to_string());
    let topics = topics
        .into_iter()
        .zip(slots)
        .map(|(topic, parts)| {
            topic.with_partition_responses(
                parts
                    .into_iter()
                    .map(|(idx, _)| partition_error(idx, code, message.clone()))
                    .collect(),
            )
        })
        .collect();
    Handled::Ready(respond(
        header,
        ApiKey::Produce,
        ResponseKind::Produce(ProduceResponse::default().with_responses(topics)),
    ))
}
