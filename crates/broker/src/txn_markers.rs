//! Transaction markers on a partition leader (WriteTxnMarkers, API 27, v1; Kafka's
//! `KafkaApis.handleWriteTxnMarkersRequest`): the transaction coordinator ends a transaction
//! by asking each partition leader to append a COMMIT or ABORT control batch for the
//! producer. Each partition's marker is appended as the coordinator's write (origin
//! Coordinator: the producer epoch and the coordinator epoch are checked against the
//! partition's producer state, INVALID_PRODUCER_EPOCH and TRANSACTION_COORDINATOR_FENCED),
//! with acks=all semantics: the answer waits until the high watermark passes the marker or
//! `request.timeout.ms` expires (REQUEST_TIMED_OUT), so a coordinator that saw success knows
//! every in-sync replica has it. A partition not hosted here is UNKNOWN_TOPIC_OR_PARTITION, one
//! hosted but not led NOT_LEADER_OR_FOLLOWER.
//!
//! Markers for `__consumer_offsets` partitions also end the transaction's pending offset
//! commits (TxnOffsetCommit, KIP-98/447): once such a marker is written and replicated, the
//! broker calls the [`TxnOffsetsCompletion`] installed in
//! [`crate::broker::Broker::txn_offsets_completion`] (the group coordinator: it makes the
//! pending offsets of that producer committed, or drops them, as Kafka's
//! `GroupCoordinator.onTransactionCompleted`). Until one is installed nothing is pending and
//! nothing is called.

use std::collections::BTreeMap;
use std::sync::Arc;

use gregor_log::TopicPartition;
use gregor_protocol::control::{EndTxnMarker, TransactionResult};
use gregor_protocol::kafka_protocol::messages::write_txn_markers_request::WritableTxnMarker;
use gregor_protocol::kafka_protocol::messages::write_txn_markers_response::{
    WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
};
use gregor_protocol::kafka_protocol::messages::{ProducerId, TopicName};

use crate::broker::Broker;
use crate::error_codes as ec;
use crate::replica_manager::{AppendOrigin, AppendOutcome, AppendWork, PartitionAppendResult};

/// The topic whose markers end pending transactional offset commits.
pub const GROUP_METADATA_TOPIC: &str = "__consumer_offsets";

pub use crate::broker::TxnOffsetsCompletion;

/// Where one partition of the request stands: an error found before the append, or the index
/// of its append.
enum Slot {
    Refused(i16),
    Appended(usize),
}

/// WriteTxnMarkers after its appends: the answer comes once they are replicated.
pub struct PendingMarkers {
    markers: Vec<WritableTxnMarker>,
    /// Per marker, topic and partition.
    slots: Vec<Vec<Vec<Slot>>>,
    outcome: Option<AppendOutcome>,
}

/// Appends every marker of `markers` as the coordinator's write with acks=all, in request
/// order and in one I/O job (the request's immediate part); [`PendingMarkers::complete`] waits
/// for them (up to `request.timeout.ms`).
pub async fn append_txn_markers(
    broker: &Arc<Broker>,
    markers: Vec<WritableTxnMarker>,
) -> PendingMarkers {
    let mut slots: Vec<Vec<Vec<Slot>>> = Vec::with_capacity(markers.len());
    let mut entries: Vec<(TopicPartition, AppendWork)> = Vec::new();
    for m in &markers {
        let marker = EndTxnMarker {
            result: TransactionResult::from_commit_flag(m.transaction_result),
            coordinator_epoch: m.coordinator_epoch,
        };
        let mut topics = Vec::with_capacity(m.topics.len());
        for t in &m.topics {
            let mut parts = Vec::with_capacity(t.partition_indexes.len());
            for &p in &t.partition_indexes {
                let tp = TopicPartition::new(t.name.0.as_str(), p);
                // Kafka's `replicaManager.getMagic`: a partition with no local log is unknown.
                if broker.replica_manager.hosted(&tp).is_err() {
                    parts.push(Slot::Refused(ec::UNKNOWN_TOPIC_OR_PARTITION));
                    continue;
                }
                entries.push((
                    tp,
                    AppendWork::TxnMarker {
                        producer_id: m.producer_id.0,
                        producer_epoch: m.producer_epoch,
                        marker,
                    },
                ));
                parts.push(Slot::Appended(entries.len() - 1));
            }
            topics.push(parts);
        }
        slots.push(topics);
    }
    let outcome = if entries.is_empty() {
        None
    } else {
        let timeout_ms = broker.config.request_timeout_ms();
        Some(
            broker
                .replica_manager
                .append_entries(timeout_ms, -1, AppendOrigin::Coordinator, entries)
                .await,
        )
    };
    PendingMarkers {
        markers,
        slots,
        outcome,
    }
}

impl PendingMarkers {
    /// Waits for the markers' replication, calls the [`TxnOffsetsCompletion`] for the
    /// `__consumer_offsets` partitions that succeeded, and returns the answer per marker and
    /// partition, in the request's order.
    pub async fn complete(self, broker: &Arc<Broker>) -> Vec<WritableTxnMarkerResult> {
        let results: Vec<PartitionAppendResult> = match self.outcome {
            None => Vec::new(),
            Some(AppendOutcome::Complete(r)) => r,
            Some(AppendOutcome::Delayed(d)) => d.complete().await,
        };
        answer(broker, &self.markers, &self.slots, &results)
    }
}

/// Kafka's error response of WriteTxnMarkers: `code` for every partition.
pub fn error_response(markers: &[WritableTxnMarker], code: i16) -> Vec<WritableTxnMarkerResult> {
    markers
        .iter()
        .map(|m| {
            WritableTxnMarkerResult::default()
                .with_producer_id(ProducerId(m.producer_id.0))
                .with_topics(
                    m.topics
                        .iter()
                        .map(|t| {
                            WritableTxnMarkerTopicResult::default()
                                .with_name(TopicName(t.name.0.clone()))
                                .with_partitions(
                                    t.partition_indexes
                                        .iter()
                                        .map(|p| {
                                            WritableTxnMarkerPartitionResult::default()
                                                .with_partition_index(*p)
                                                .with_error_code(code)
                                        })
                                        .collect(),
                                )
                        })
                        .collect(),
                )
        })
        .collect()
}

fn answer(
    broker: &Arc<Broker>,
    markers: &[WritableTxnMarker],
    slots: &[Vec<Vec<Slot>>],
    results: &[PartitionAppendResult],
) -> Vec<WritableTxnMarkerResult> {
    let code_of = |slot: &Slot| match slot {
        Slot::Refused(code) => *code,
        Slot::Appended(i) => results
            .get(*i)
            .map_or(ec::UNKNOWN_SERVER_ERROR, |r| r.error_code),
    };
    let mut out = Vec::with_capacity(markers.len());
    for (m, topics) in markers.iter().zip(slots) {
        let mut codes: Vec<Vec<i16>> = topics
            .iter()
            .map(|parts| parts.iter().map(&code_of).collect())
            .collect();
        completed_offsets(broker, m, &mut codes);
        out.push(
            WritableTxnMarkerResult::default()
                .with_producer_id(ProducerId(m.producer_id.0))
                .with_topics(
                    m.topics
                        .iter()
                        .zip(codes)
                        .map(|(t, codes)| {
                            WritableTxnMarkerTopicResult::default()
                                .with_name(TopicName(t.name.0.clone()))
                                .with_partitions(
                                    t.partition_indexes
                                        .iter()
                                        .zip(codes)
                                        .map(|(p, code)| {
                                            WritableTxnMarkerPartitionResult::default()
                                                .with_partition_index(*p)
                                                .with_error_code(code)
                                        })
                                        .collect(),
                                )
                        })
                        .collect(),
                ),
        );
    }
    out
}

/// Tells the group coordinator about the `__consumer_offsets` partitions of `m` whose marker
/// succeeded (`codes` per topic and partition, updated with its error if it fails).
fn completed_offsets(broker: &Arc<Broker>, m: &WritableTxnMarker, codes: &mut [Vec<i16>]) {
    let Some(hook) = broker.txn_offsets_completion() else {
        return;
    };
    let mut done: BTreeMap<i32, (usize, usize)> = BTreeMap::new();
    for (ti, t) in m.topics.iter().enumerate() {
        if t.name.0.as_str() != GROUP_METADATA_TOPIC {
            continue;
        }
        for (pi, p) in t.partition_indexes.iter().enumerate() {
            if codes[ti][pi] == ec::NONE {
                done.insert(*p, (ti, pi));
            }
        }
    }
    if done.is_empty() {
        return;
    }
    let partitions: Vec<i32> = done.keys().copied().collect();
    let result = TransactionResult::from_commit_flag(m.transaction_result);
    if let Err(code) =
        hook.on_transaction_completed(m.producer_id.0, m.producer_epoch, &partitions, result)
    {
        tracing::error!(
            producer_id = m.producer_id.0,
            code,
            "the group coordinator failed to complete the transaction's offsets"
        );
        for (ti, pi) in done.values() {
            codes[*ti][*pi] = code;
        }
    }
}
