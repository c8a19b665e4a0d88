//! Conversions between the core's messages ([`crate::message`]) and `kafka-protocol`'s
//! `VoteRequest`, `BeginQuorumEpochRequest`, `EndQuorumEpochRequest`, `FetchRequest` and
//! their responses, for the one partition KRaft replicates, `__cluster_metadata-0` (topic id
//! `AAAAAAAAAAAAAAAAAAAAAQ`, Kafka's `Uuid.METADATA_TOPIC_ID`). The socket transport encodes
//! the `kafka-protocol` structs at the negotiated version; only Fetch has fields whose place
//! depends on the version (`ReplicaId` moved into `ReplicaState` in v15, topics are named by id
//! from v13, `HighWatermark` is v18), so only its conversion takes the version.
//!
//! FetchSnapshot (API 59, v0-1) has no version-dependent fields in the core's use (v1 adds
//! tagged fields: the replica directory id and the leader's endpoints).
//!
//! Incoming messages that do not name exactly `__cluster_metadata-0` are rejected with
//! [`ConvertError`], which Kafka answers with INVALID_REQUEST (`hasValidTopicPartition`); so
//! is a FetchSnapshot response whose chunk does not fit in the snapshot it describes.

use bytes::Bytes;
use gregor_protocol::error::ErrorCode;
use kafka_protocol::messages::{self as kp, BrokerId, TopicName};
use kafka_protocol::protocol::StrBytes;
use uuid::Uuid;

use crate::message::{
    BeginQuorumEpochRequest, BeginQuorumEpochResponse, EndQuorumEpochRequest,
    EndQuorumEpochResponse, FetchRequest, FetchResponse, FetchSnapshotRequest,
    FetchSnapshotResponse, VoteRequest, VoteResponse,
};
use crate::types::{NodeId, OffsetAndEpoch};

/// Name of the metadata topic (`Topic.CLUSTER_METADATA_TOPIC_NAME`).
pub const METADATA_TOPIC_NAME: &str = "__cluster_metadata";
/// Id of the metadata topic (`Uuid.METADATA_TOPIC_ID`, the UUID with value 1).
pub const METADATA_TOPIC_ID: Uuid = Uuid::from_u128(1);
/// The metadata partition.
pub const METADATA_PARTITION: i32 = 0;

/// A Kafka message that the core cannot take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConvertError {
    /// The message is not about exactly one partition, `__cluster_metadata-0`.
    #[error("expected exactly the partition __cluster_metadata-0")]
    NotMetadataPartition,
    /// A field out of its range (a snapshot chunk outside its snapshot).
    #[error("invalid {field}: {reason}")]
    InvalidField {
        /// The field.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
}

impl ConvertError {
    /// The error code Kafka answers with.
    pub fn error_code(&self) -> ErrorCode {
        ErrorCode::InvalidRequest
    }
}

fn topic_name() -> TopicName {
    TopicName(StrBytes::from_static_str(METADATA_TOPIC_NAME))
}

fn is_metadata_topic(name: &TopicName) -> bool {
    name.0.as_str() == METADATA_TOPIC_NAME
}

fn opt_id(id: Option<NodeId>) -> BrokerId {
    BrokerId(id.unwrap_or(-1))
}

fn id_opt(id: BrokerId) -> Option<NodeId> {
    (id.0 >= 0).then_some(id.0)
}

fn cluster_to_kafka(c: &Option<String>) -> Option<StrBytes> {
    c.as_ref().map(|s| StrBytes::from_string(s.clone()))
}

fn cluster_from_kafka(c: &Option<StrBytes>) -> Option<String> {
    c.as_ref().map(|s| s.as_str().to_string())
}

/// The only element of `items`, or [`ConvertError::NotMetadataPartition`].
fn single<T>(items: &[T]) -> Result<&T, ConvertError> {
    match items {
        [one] => Ok(one),
        _ => Err(ConvertError::NotMetadataPartition),
    }
}

// ----- Vote -----

/// Our VoteRequest as Kafka's (v0-2; `PreVote` needs v2, `VoterId` v1).
pub fn vote_request_to_kafka(r: &VoteRequest) -> kp::VoteRequest {
    let partition = kp::vote_request::PartitionData::default()
        .with_partition_index(METADATA_PARTITION)
        .with_replica_epoch(r.replica_epoch)
        .with_replica_id(BrokerId(r.replica_id))
        .with_last_offset_epoch(r.last_offset_epoch)
        .with_last_offset(r.last_offset)
        .with_pre_vote(r.pre_vote);
    kp::VoteRequest::default()
        .with_cluster_id(cluster_to_kafka(&r.cluster_id))
        .with_voter_id(opt_id(r.voter_id))
        .with_topics(vec![kp::vote_request::TopicData::default()
            .with_topic_name(topic_name())
            .with_partitions(vec![partition])])
}

/// Kafka's VoteRequest as ours.
///
/// # Errors
/// [`ConvertError::NotMetadataPartition`].
pub fn vote_request_from_kafka(r: &kp::VoteRequest) -> Result<VoteRequest, ConvertError> {
    let topic = single(&r.topics)?;
    let p = single(&topic.partitions)?;
    if !is_metadata_topic(&topic.topic_name) || p.partition_index != METADATA_PARTITION {
        return Err(ConvertError::NotMetadataPartition);
    }
    Ok(VoteRequest {
        cluster_id: cluster_from_kafka(&r.cluster_id),
        voter_id: id_opt(r.voter_id),
        replica_epoch: p.replica_epoch,
        replica_id: p.replica_id.0,
        last_offset_epoch: p.last_offset_epoch,
        last_offset: p.last_offset,
        pre_vote: p.pre_vote,
    })
}

/// Our VoteResponse as Kafka's. INCONSISTENT_CLUSTER_ID goes at the top level with no topics,
/// as Kafka answers it.
pub fn vote_response_to_kafka(r: &VoteResponse) -> kp::VoteResponse {
    if r.error == ErrorCode::InconsistentClusterId {
        return kp::VoteResponse::default().with_error_code(r.error.code());
    }
    let partition = kp::vote_response::PartitionData::default()
        .with_partition_index(METADATA_PARTITION)
        .with_error_code(r.error.code())
        .with_leader_id(opt_id(r.leader_id))
        .with_leader_epoch(r.leader_epoch)
        .with_vote_granted(r.vote_granted);
    kp::VoteResponse::default().with_topics(vec![kp::vote_response::TopicData::default()
        .with_topic_name(topic_name())
        .with_partitions(vec![partition])])
}

/// Kafka's VoteResponse as ours (a top-level error becomes the error, epoch -1).
///
/// # Errors
/// [`ConvertError::NotMetadataPartition`].
pub fn vote_response_from_kafka(r: &kp::VoteResponse) -> Result<VoteResponse, ConvertError> {
    if r.error_code != 0 {
        return Ok(VoteResponse {
            error: ErrorCode::for_code(r.error_code),
            leader_id: None,
            leader_epoch: -1,
            vote_granted: false,
        });
    }
    let topic = single(&r.topics)?;
    let p = single(&topic.partitions)?;
    if !is_metadata_topic(&topic.topic_name) || p.partition_index != METADATA_PARTITION {
        return Err(ConvertError::NotMetadataPartition);
    }
    Ok(VoteResponse {
        error: ErrorCode::for_code(p.error_code),
        leader_id: id_opt(p.leader_id),
        leader_epoch: p.leader_epoch,
        vote_granted: p.vote_granted,
    })
}

// ----- BeginQuorumEpoch -----

/// Our BeginQuorumEpochRequest as Kafka's (v0-1).
pub fn begin_quorum_epoch_request_to_kafka(
    r: &BeginQuorumEpochRequest,
) -> kp::BeginQuorumEpochRequest {
    let partition = kp::begin_quorum_epoch_request::PartitionData::default()
        .with_partition_index(METADATA_PARTITION)
        .with_leader_id(BrokerId(r.leader_id))
        .with_leader_epoch(r.leader_epoch);
    kp::BeginQuorumEpochRequest::default()
        .with_cluster_id(cluster_to_kafka(&r.cluster_id))
        .with_voter_id(opt_id(r.voter_id))
        .with_topics(vec![kp::begin_quorum_epoch_request::TopicData::default()
            .with_topic_name(topic_name())
            .with_partitions(vec![partition])])
}

/// Kafka's BeginQuorumEpochRequest as ours.
///
/// # Errors
/// [`ConvertError::NotMetadataPartition`].
pub fn begin_quorum_epoch_request_from_kafka(
    r: &kp::BeginQuorumEpochRequest,
) -> Result<BeginQuorumEpochRequest, ConvertError> {
    let topic = single(&r.topics)?;
    let p = single(&topic.partitions)?;
    if !is_metadata_topic(&topic.topic_name) || p.partition_index != METADATA_PARTITION {
        return Err(ConvertError::NotMetadataPartition);
    }
    Ok(BeginQuorumEpochRequest {
        cluster_id: cluster_from_kafka(&r.cluster_id),
        voter_id: id_opt(r.voter_id),
        leader_id: p.leader_id.0,
        leader_epoch: p.leader_epoch,
    })
}

/// Our BeginQuorumEpochResponse as Kafka's.
pub fn begin_quorum_epoch_response_to_kafka(
    r: &BeginQuorumEpochResponse,
) -> kp::BeginQuorumEpochResponse {
    if r.error == ErrorCode::InconsistentClusterId {
        return kp::BeginQuorumEpochResponse::default().with_error_code(r.error.code());
    }
    let partition = kp::begin_quorum_epoch_response::PartitionData::default()
        .with_partition_index(METADATA_PARTITION)
        .with_error_code(r.error.code())
        .with_leader_id(opt_id(r.leader_id))
        .with_leader_epoch(r.leader_epoch);
    kp::BeginQuorumEpochResponse::default().with_topics(vec![
        kp::begin_quorum_epoch_response::TopicData::default()
            .with_topic_name(topic_name())
            .with_partitions(vec![partition]),
    ])
}

/// Kafka's BeginQuorumEpochResponse as ours.
///
/// # Errors
/// [`ConvertError::NotMetadataPartition`].
pub fn begin_quorum_epoch_response_from_kafka(
    r: &kp::BeginQuorumEpochResponse,
) -> Result<BeginQuorumEpochResponse, ConvertError> {
    if r.error_code != 0 {
        return Ok(BeginQuorumEpochResponse {
            error: ErrorCode::for_code(r.error_code),
            leader_id: None,
            leader_epoch: -1,
        });
    }
    let topic = single(&r.topics)?;
    let p = single(&topic.partitions)?;
    if !is_metadata_topic(&topic.topic_name) || p.partition_index != METADATA_PARTITION {
        return Err(ConvertError::NotMetadataPartition);
    }
    Ok(BeginQuorumEpochResponse {
        error: ErrorCode::for_code(p.error_code),
        leader_id: id_opt(p.leader_id),
        leader_epoch: p.leader_epoch,
    })
}

// ----- EndQuorumEpoch -----

/// Our EndQuorumEpochRequest as Kafka's (v0-1: `PreferredSuccessors` is v0; v1 sends
/// `PreferredCandidates` with directory ids, filled here without them).
pub fn end_quorum_epoch_request_to_kafka(r: &EndQuorumEpochRequest) -> kp::EndQuorumEpochRequest {
    let candidates = r
        .preferred_successors
        .iter()
        .map(|&id| {
            kp::end_quorum_epoch_request::ReplicaInfo::default().with_candidate_id(BrokerId(id))
        })
        .collect();
    let partition = kp::end_quorum_epoch_request::PartitionData::default()
        .with_partition_index(METADATA_PARTITION)
        .with_leader_id(BrokerId(r.leader_id))
        .with_leader_epoch(r.leader_epoch)
        .with_preferred_successors(r.preferred_successors.clone())
        .with_preferred_candidates(candidates);
    kp::EndQuorumEpochRequest::default()
        .with_cluster_id(cluster_to_kafka(&r.cluster_id))
        .with_topics(vec![kp::end_quorum_epoch_request::TopicData::default()
            .with_topic_name(topic_name())
            .with_partitions(vec![partition])])
}

/// Kafka's EndQuorumEpochRequest as ours (successors from v1's `PreferredCandidates` when
/// present, else v0's `PreferredSuccessors`).
///
/// # Errors
/// [`ConvertError::NotMetadataPartition`].
pub fn end_quorum_epoch_request_from_kafka(
    r: &kp::EndQuorumEpochRequest,
) -> Result<EndQuorumEpochRequest, ConvertError> {
    let topic = single(&r.topics)?;
    let p = single(&topic.partitions)?;
    if !is_metadata_topic(&topic.topic_name) || p.partition_index != METADATA_PARTITION {
        return Err(ConvertError::NotMetadataPartition);
    }
    let preferred_successors = if p.preferred_candidates.is_empty() {
        p.preferred_successors.clone()
    } else {
        p.preferred_candidates
            .iter()
            .map(|c| c.candidate_id.0)
            .collect()
    };
    Ok(EndQuorumEpochRequest {
        cluster_id: cluster_from_kafka(&r.cluster_id),
        leader_id: p.leader_id.0,
        leader_epoch: p.leader_epoch,
        preferred_successors,
    })
}

/// Our EndQuorumEpochResponse as Kafka's.
pub fn end_quorum_epoch_response_to_kafka(
    r: &EndQuorumEpochResponse,
) -> kp::EndQuorumEpochResponse {
    if r.error == ErrorCode::InconsistentClusterId {
        return kp::EndQuorumEpochResponse::default().with_error_code(r.error.code());
    }
    let partition = kp::end_quorum_epoch_response::PartitionData::default()
        .with_partition_index(METADATA_PARTITION)
        .with_error_code(r.error.code())
        .with_leader_id(opt_id(r.leader_id))
        .with_leader_epoch(r.leader_epoch);
    kp::EndQuorumEpochResponse::default().with_topics(vec![
        kp::end_quorum_epoch_response::TopicData::default()
            .with_topic_name(topic_name())
            .with_partitions(vec![partition]),
    ])
}

/// Kafka's EndQuorumEpochResponse as ours.
///
/// # Errors
/// [`ConvertError::NotMetadataPartition`].
pub fn end_quorum_epoch_response_from_kafka(
    r: &kp::EndQuorumEpochResponse,
) -> Result<EndQuorumEpochResponse, ConvertError> {
    if r.error_code != 0 {
        return Ok(EndQuorumEpochResponse {
            error: ErrorCode::for_code(r.error_code),
            leader_id: None,
            leader_epoch: -1,
        });
    }
    let topic = single(&r.topics)?;
    let p = single(&topic.partitions)?;
    if !is_metadata_topic(&topic.topic_name) || p.partition_index != METADATA_PARTITION {
        return Err(ConvertError::NotMetadataPartition);
    }
    Ok(EndQuorumEpochResponse {
        error: ErrorCode::for_code(p.error_code),
        leader_id: id_opt(p.leader_id),
        leader_epoch: p.leader_epoch,
    })
}

// ----- Fetch -----

/// Our FetchRequest as Kafka's at `version` (KRaft uses v13+): the replica id goes into
/// `ReplicaState` from v15 and into the top-level `ReplicaId` before; the topic is named by id
/// from v13 and by name before; the fetcher's high watermark is sent from v18 (KIP-1166).
pub fn fetch_request_to_kafka(r: &FetchRequest, version: i16) -> kp::FetchRequest {
    let mut partition = kp::fetch_request::FetchPartition::default()
        .with_partition(METADATA_PARTITION)
        .with_current_leader_epoch(r.current_leader_epoch)
        .with_fetch_offset(r.fetch_offset)
        .with_last_fetched_epoch(r.last_fetched_epoch)
        .with_log_start_offset(-1)
        .with_partition_max_bytes(i32::MAX);
    if version >= 18 {
        partition = partition.with_high_watermark(r.high_watermark);
    }
    let mut topic = kp::fetch_request::FetchTopic::default().with_partitions(vec![partition]);
    if version >= 13 {
        topic = topic.with_topic_id(METADATA_TOPIC_ID);
    } else {
        topic = topic.with_topic(topic_name());
    }
    let mut request = kp::FetchRequest::default()
        .with_cluster_id(cluster_to_kafka(&r.cluster_id))
        .with_max_wait_ms(r.max_wait_ms)
        .with_min_bytes(0)
        .with_max_bytes(i32::try_from(crate::config::MAX_BATCH_SIZE_BYTES).unwrap_or(i32::MAX))
        .with_topics(vec![topic]);
    if version >= 15 {
        request = request.with_replica_id(BrokerId(-1)).with_replica_state(
            kp::fetch_request::ReplicaState::default().with_replica_id(BrokerId(r.replica_id)),
        );
    } else {
        request = request.with_replica_id(BrokerId(r.replica_id));
    }
    request
}

/// Kafka's FetchRequest as ours, whatever the version it was decoded at.
///
/// # Errors
/// [`ConvertError::NotMetadataPartition`].
pub fn fetch_request_from_kafka(r: &kp::FetchRequest) -> Result<FetchRequest, ConvertError> {
    let topic = single(&r.topics)?;
    let p = single(&topic.partitions)?;
    let named = is_metadata_topic(&topic.topic) || topic.topic_id == METADATA_TOPIC_ID;
    if !named || p.partition != METADATA_PARTITION {
        return Err(ConvertError::NotMetadataPartition);
    }
    let replica_id = if r.replica_state.replica_id.0 >= 0 {
        r.replica_state.replica_id.0
    } else {
        r.replica_id.0
    };
    Ok(FetchRequest {
        cluster_id: cluster_from_kafka(&r.cluster_id),
        replica_id,
        max_wait_ms: r.max_wait_ms,
        current_leader_epoch: p.current_leader_epoch,
        fetch_offset: p.fetch_offset,
        last_fetched_epoch: p.last_fetched_epoch,
        high_watermark: p.high_watermark,
    })
}

/// Our FetchResponse as Kafka's at `version` (v12+ for `DivergingEpoch` and `CurrentLeader`):
/// records are always present (zero-length when none, never null), the topic named by id from
/// v13 and by name before.
pub fn fetch_response_to_kafka(r: &FetchResponse, version: i16) -> kp::FetchResponse {
    if r.error == ErrorCode::InconsistentClusterId {
        return kp::FetchResponse::default().with_error_code(r.error.code());
    }
    let mut partition = kp::fetch_response::PartitionData::default()
        .with_partition_index(METADATA_PARTITION)
        .with_error_code(r.error.code())
        .with_high_watermark(r.high_watermark)
        .with_log_start_offset(r.log_start_offset)
        .with_current_leader(
            kp::fetch_response::LeaderIdAndEpoch::default()
                .with_leader_id(opt_id(r.current_leader_id))
                .with_leader_epoch(r.current_leader_epoch),
        )
        .with_records(Some(r.records.clone()));
    if let Some(d) = r.diverging_epoch {
        partition = partition.with_diverging_epoch(
            kp::fetch_response::EpochEndOffset::default()
                .with_epoch(d.epoch)
                .with_end_offset(d.offset),
        );
    }
    if let Some(s) = r.snapshot_id {
        partition = partition.with_snapshot_id(
            kp::fetch_response::SnapshotId::default()
                .with_end_offset(s.offset)
                .with_epoch(s.epoch),
        );
    }
    let mut topic =
        kp::fetch_response::FetchableTopicResponse::default().with_partitions(vec![partition]);
    if version >= 13 {
        topic = topic.with_topic_id(METADATA_TOPIC_ID);
    } else {
        topic = topic.with_topic(topic_name());
    }
    kp::FetchResponse::default().with_responses(vec![topic])
}

/// Kafka's FetchResponse as ours (a top-level error becomes the error, epoch -1).
///
/// # Errors
/// [`ConvertError::NotMetadataPartition`].
pub fn fetch_response_from_kafka(r: &kp::FetchResponse) -> Result<FetchResponse, ConvertError> {
    if r.error_code != 0 {
        return Ok(FetchResponse {
            error: ErrorCode::for_code(r.error_code),
            high_watermark: -1,
            log_start_offset: -1,
            diverging_epoch: None,
            snapshot_id: None,
            current_leader_id: None,
            current_leader_epoch: -1,
            records: Bytes::new(),
        });
    }
    let topic = single(&r.responses)?;
    let p = single(&topic.partitions)?;
    let named = is_metadata_topic(&topic.topic) || topic.topic_id == METADATA_TOPIC_ID;
    if !named || p.partition_index != METADATA_PARTITION {
        return Err(ConvertError::NotMetadataPartition);
    }
    let d = &p.diverging_epoch;
    let snap = &p.snapshot_id;
    Ok(FetchResponse {
        error: ErrorCode::for_code(p.error_code),
        high_watermark: p.high_watermark,
        log_start_offset: p.log_start_offset,
        diverging_epoch: (d.epoch >= 0 || d.end_offset >= 0)
            .then_some(OffsetAndEpoch::new(d.end_offset, d.epoch)),
        snapshot_id: (snap.epoch >= 0 || snap.end_offset >= 0)
            .then_some(OffsetAndEpoch::new(snap.end_offset, snap.epoch)),
        current_leader_id: id_opt(p.current_leader.leader_id),
        current_leader_epoch: p.current_leader.leader_epoch,
        records: p.records.clone().unwrap_or_default(),
    })
}

// ----- FetchSnapshot -----

/// Our FetchSnapshotRequest as Kafka's (v0-1).
pub fn fetch_snapshot_request_to_kafka(r: &FetchSnapshotRequest) -> kp::FetchSnapshotRequest {
    use kp::fetch_snapshot_request as fsr;
    let partition = fsr::PartitionSnapshot::default()
        .with_partition(METADATA_PARTITION)
        .with_current_leader_epoch(r.current_leader_epoch)
        .with_snapshot_id(
            fsr::SnapshotId::default()
                .with_end_offset(r.snapshot_id.offset)
                .with_epoch(r.snapshot_id.epoch),
        )
        .with_position(r.position);
    kp::FetchSnapshotRequest::default()
        .with_cluster_id(cluster_to_kafka(&r.cluster_id))
        .with_replica_id(BrokerId(r.replica_id))
        .with_max_bytes(r.max_bytes)
        .with_topics(vec![fsr::TopicSnapshot::default()
            .with_name(topic_name())
            .with_partitions(vec![partition])])
}

/// Kafka's FetchSnapshotRequest as ours.
///
/// # Errors
/// [`ConvertError::NotMetadataPartition`].
pub fn fetch_snapshot_request_from_kafka(
    r: &kp::FetchSnapshotRequest,
) -> Result<FetchSnapshotRequest, ConvertError> {
    let topic = single(&r.topics)?;
    let p = single(&topic.partitions)?;
    if !is_metadata_topic(&topic.name) || p.partition != METADATA_PARTITION {
        return Err(ConvertError::NotMetadataPartition);
    }
    Ok(FetchSnapshotRequest {
        cluster_id: cluster_from_kafka(&r.cluster_id),
        replica_id: r.replica_id.0,
        max_bytes: r.max_bytes,
        current_leader_epoch: p.current_leader_epoch,
        snapshot_id: OffsetAndEpoch::new(p.snapshot_id.end_offset, p.snapshot_id.epoch),
        position: p.position,
    })
}

/// Our FetchSnapshotResponse as Kafka's (v0-1). INCONSISTENT_CLUSTER_ID goes at the top
/// level with no topics, as Kafka answers it.
pub fn fetch_snapshot_response_to_kafka(r: &FetchSnapshotResponse) -> kp::FetchSnapshotResponse {
    use kp::fetch_snapshot_response as fsr;
    if r.error == ErrorCode::InconsistentClusterId {
        return kp::FetchSnapshotResponse::default().with_error_code(r.error.code());
    }
    let partition = fsr::PartitionSnapshot::default()
        .with_index(METADATA_PARTITION)
        .with_error_code(r.error.code())
        .with_snapshot_id(
            fsr::SnapshotId::default()
                .with_end_offset(r.snapshot_id.offset)
                .with_epoch(r.snapshot_id.epoch),
        )
        .with_current_leader(
            fsr::LeaderIdAndEpoch::default()
                .with_leader_id(opt_id(r.current_leader_id))
                .with_leader_epoch(r.current_leader_epoch),
        )
        .with_size(r.size)
        .with_position(r.position)
        .with_unaligned_records(r.unaligned_records.clone());
    kp::FetchSnapshotResponse::default().with_topics(vec![fsr::TopicSnapshot::default()
        .with_name(topic_name())
        .with_partitions(vec![partition])])
}

/// Kafka's FetchSnapshotResponse as ours (a top-level error becomes the error, epoch -1).
///
/// # Errors
/// [`ConvertError::NotMetadataPartition`]; [`ConvertError::InvalidField`] for a response
/// without error whose `Position` or `Size` is negative or whose bytes end past `Size`.
pub fn fetch_snapshot_response_from_kafka(
    r: &kp::FetchSnapshotResponse,
) -> Result<FetchSnapshotResponse, ConvertError> {
    if r.error_code != 0 {
        return Ok(FetchSnapshotResponse {
            error: ErrorCode::for_code(r.error_code),
            snapshot_id: OffsetAndEpoch::new(-1, -1),
            current_leader_id: None,
            current_leader_epoch: -1,
            size: -1,
            position: -1,
            unaligned_records: Bytes::new(),
        });
    }
    let topic = single(&r.topics)?;
    let p = single(&topic.partitions)?;
    if !is_metadata_topic(&topic.name) || p.index != METADATA_PARTITION {
        return Err(ConvertError::NotMetadataPartition);
    }
    if p.error_code == 0 {
        let len = i64::try_from(p.unaligned_records.len()).unwrap_or(i64::MAX);
        if p.position < 0 || p.size < 0 {
            return Err(ConvertError::InvalidField {
                field: "Position/Size",
                reason: format!("position {} size {}", p.position, p.size),
            });
        }
        if p.position.checked_add(len).is_none_or(|end| end > p.size) {
            return Err(ConvertError::InvalidField {
                field: "UnalignedRecords",
                reason: format!(
                    "{len} bytes at position {} pass the snapshot size {}",
                    p.position, p.size
                ),
            });
        }
    }
    Ok(FetchSnapshotResponse {
        error: ErrorCode::for_code(p.error_code),
        snapshot_id: OffsetAndEpoch::new(p.snapshot_id.end_offset, p.snapshot_id.epoch),
        current_leader_id: id_opt(p.current_leader.leader_id),
        current_leader_epoch: p.current_leader.leader_epoch,
        size: p.size,
        position: p.position,
        unaligned_records: p.unaligned_records.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use kafka_protocol::protocol::{Decodable, Encodable};

    /// Encodes at `version`, decodes back: what a socket transport does.
    fn wire<T: Encodable + Decodable>(m: &T, version: i16) -> T {
        let mut buf = BytesMut::new();
        m.encode(&mut buf, version).unwrap();
        let mut bytes = buf.freeze();
        T::decode(&mut bytes, version).unwrap()
    }

    #[test]
    fn vote_round_trips_through_the_wire() {
        let r = VoteRequest {
            cluster_id: Some("c1".into()),
            voter_id: Some(2),
            replica_epoch: 7,
            replica_id: 1,
            last_offset_epoch: 6,
            last_offset: 42,
            pre_vote: true,
        };
        let back = vote_request_from_kafka(&wire(&vote_request_to_kafka(&r), 2)).unwrap();
        assert_eq!(back, r);
        // v0 has neither VoterId nor PreVote; a standard vote survives without the voter id.
        let standard = VoteRequest {
            pre_vote: false,
            ..r.clone()
        };
        let back = vote_request_from_kafka(&wire(&vote_request_to_kafka(&standard), 0)).unwrap();
        assert_eq!(back.voter_id, None);
        assert_eq!(back.replica_epoch, 7);
        // A PreVote cannot be encoded below v2.
        assert!(vote_request_to_kafka(&r)
            .encode(&mut BytesMut::new(), 1)
            .is_err());

        let resp = VoteResponse {
            error: ErrorCode::FencedLeaderEpoch,
            leader_id: Some(3),
            leader_epoch: 9,
            vote_granted: false,
        };
        assert_eq!(
            vote_response_from_kafka(&wire(&vote_response_to_kafka(&resp), 2)).unwrap(),
            resp
        );
        let no_leader = VoteResponse {
            error: ErrorCode::None,
            leader_id: None,
            leader_epoch: 4,
            vote_granted: true,
        };
        let k = vote_response_to_kafka(&no_leader);
        assert_eq!(k.topics[0].partitions[0].leader_id, BrokerId(-1));
        assert_eq!(vote_response_from_kafka(&wire(&k, 1)).unwrap(), no_leader);
        let cluster = VoteResponse {
            error: ErrorCode::InconsistentClusterId,
            leader_id: None,
            leader_epoch: -1,
            vote_granted: false,
        };
        let k = vote_response_to_kafka(&cluster);
        assert_eq!(k.error_code, ErrorCode::InconsistentClusterId.code());
        assert!(k.topics.is_empty());
        assert_eq!(
            vote_response_from_kafka(&k).unwrap().error,
            ErrorCode::InconsistentClusterId
        );
    }

    #[test]
    fn quorum_epoch_messages_round_trip() {
        let begin = BeginQuorumEpochRequest {
            cluster_id: None,
            voter_id: Some(3),
            leader_id: 1,
            leader_epoch: 5,
        };
        assert_eq!(
            begin_quorum_epoch_request_from_kafka(&wire(
                &begin_quorum_epoch_request_to_kafka(&begin),
                1
            ))
            .unwrap(),
            begin
        );
        let begin_resp = BeginQuorumEpochResponse {
            error: ErrorCode::None,
            leader_id: Some(1),
            leader_epoch: 5,
        };
        assert_eq!(
            begin_quorum_epoch_response_from_kafka(&wire(
                &begin_quorum_epoch_response_to_kafka(&begin_resp),
                0
            ))
            .unwrap(),
            begin_resp
        );
        let end = EndQuorumEpochRequest {
            cluster_id: Some("c".into()),
            leader_id: 2,
            leader_epoch: 8,
            preferred_successors: vec![3, 1],
        };
        for version in [0, 1] {
            assert_eq!(
                end_quorum_epoch_request_from_kafka(&wire(
                    &end_quorum_epoch_request_to_kafka(&end),
                    version
                ))
                .unwrap(),
                end,
                "version {version}"
            );
        }
        let end_resp = EndQuorumEpochResponse {
            error: ErrorCode::InconsistentVoterSet,
            leader_id: None,
            leader_epoch: 8,
        };
        assert_eq!(
            end_quorum_epoch_response_from_kafka(&wire(
                &end_quorum_epoch_response_to_kafka(&end_resp),
                1
            ))
            .unwrap(),
            end_resp
        );
    }

    #[test]
    fn fetch_round_trips_at_kraft_versions() {
        let r = FetchRequest {
            cluster_id: Some("c".into()),
            replica_id: 101,
            max_wait_ms: 500,
            current_leader_epoch: 4,
            fetch_offset: 17,
            last_fetched_epoch: 3,
            high_watermark: 12,
        };
        for version in [13, 15, 17, 18] {
            let k = fetch_request_to_kafka(&r, version);
            let back = fetch_request_from_kafka(&wire(&k, version)).unwrap();
            let expected_hw = if version >= 18 { 12 } else { i64::MAX };
            assert_eq!(
                back,
                FetchRequest {
                    high_watermark: expected_hw,
                    ..r.clone()
                },
                "version {version}"
            );
        }
        let records = crate::batches::build_data_batch(17, 4, 0, &[Bytes::from("x")]);
        let resp = FetchResponse {
            error: ErrorCode::None,
            high_watermark: 15,
            log_start_offset: 0,
            diverging_epoch: None,
            snapshot_id: None,
            current_leader_id: Some(1),
            current_leader_epoch: 4,
            records: records.clone(),
        };
        for version in [13, 16, 18] {
            let back =
                fetch_response_from_kafka(&wire(&fetch_response_to_kafka(&resp, version), version))
                    .unwrap();
            assert_eq!(back, resp, "version {version}");
        }
        let diverging = FetchResponse {
            diverging_epoch: Some(OffsetAndEpoch::new(10, 2)),
            records: Bytes::new(),
            ..resp.clone()
        };
        let k = fetch_response_to_kafka(&diverging, 17);
        // An empty partition carries zero-length records, not null.
        assert_eq!(
            k.responses[0].partitions[0]
                .records
                .as_ref()
                .map(Bytes::len),
            Some(0)
        );
        assert_eq!(fetch_response_from_kafka(&wire(&k, 17)).unwrap(), diverging);
    }

    #[test]
    fn other_partitions_are_rejected() {
        let mut k = vote_request_to_kafka(&VoteRequest {
            cluster_id: None,
            voter_id: None,
            replica_epoch: 1,
            replica_id: 1,
            last_offset_epoch: 0,
            last_offset: 0,
            pre_vote: false,
        });
        k.topics[0].partitions[0].partition_index = 1;
        assert_eq!(
            vote_request_from_kafka(&k),
            Err(ConvertError::NotMetadataPartition)
        );
        k.topics.clear();
        assert_eq!(
            vote_request_from_kafka(&k).map_err(|e| e.error_code()),
            Err(ErrorCode::InvalidRequest)
        );
        let mut f = fetch_request_to_kafka(
            &FetchRequest {
                cluster_id: None,
                replica_id: 1,
                max_wait_ms: 0,
                current_leader_epoch: 1,
                fetch_offset: 0,
                last_fetched_epoch: 0,
                high_watermark: -1,
            },
            17,
        );
        f.topics[0].topic_id = Uuid::from_u128(7);
        assert!(fetch_request_from_kafka(&f).is_err());
    }
    #[test]
    fn fetch_snapshot_round_trips_through_the_wire() {
        let r = FetchSnapshotRequest {
            cluster_id: Some("c".into()),
            replica_id: 3,
            max_bytes: 1024,
            current_leader_epoch: 7,
            snapshot_id: OffsetAndEpoch::new(120, 6),
            position: 2048,
        };
        let resp = FetchSnapshotResponse {
            error: ErrorCode::None,
            snapshot_id: OffsetAndEpoch::new(120, 6),
            current_leader_id: Some(1),
            current_leader_epoch: 7,
            size: 4096,
            position: 2048,
            unaligned_records: Bytes::from(vec![7u8; 1024]),
        };
        for version in [0, 1] {
            let k = fetch_snapshot_request_to_kafka(&r);
            assert_eq!(k.topics[0].name.0.as_str(), METADATA_TOPIC_NAME);
            assert_eq!(
                fetch_snapshot_request_from_kafka(&wire(&k, version)).unwrap(),
                r
            );
            let k = fetch_snapshot_response_to_kafka(&resp);
            assert_eq!(
                fetch_snapshot_response_from_kafka(&wire(&k, version)).unwrap(),
                resp
            );
        }
        // Errors of the partition, and INCONSISTENT_CLUSTER_ID at the top level.
        for error in [
            ErrorCode::SnapshotNotFound,
            ErrorCode::PositionOutOfRange,
            ErrorCode::FencedLeaderEpoch,
        ] {
            let e = FetchSnapshotResponse {
                error,
                snapshot_id: OffsetAndEpoch::new(-1, -1),
                size: -1,
                position: -1,
                unaligned_records: Bytes::new(),
                ..resp.clone()
            };
            let k = fetch_snapshot_response_to_kafka(&e);
            assert_eq!(k.topics[0].partitions[0].error_code, error.code());
            assert_eq!(fetch_snapshot_response_from_kafka(&wire(&k, 1)).unwrap(), e);
        }
        assert_eq!(ErrorCode::SnapshotNotFound.code(), 98);
        assert_eq!(ErrorCode::PositionOutOfRange.code(), 99);
        let k = fetch_snapshot_response_to_kafka(&FetchSnapshotResponse {
            error: ErrorCode::InconsistentClusterId,
            ..resp.clone()
        });
        assert!(k.topics.is_empty());
        assert_eq!(
            fetch_snapshot_response_from_kafka(&wire(&k, 0))
                .unwrap()
                .error,
            ErrorCode::InconsistentClusterId
        );
        // SnapshotId in a Fetch response (a tagged field of v12+).
        let f = FetchResponse {
            error: ErrorCode::None,
            high_watermark: 30,
            log_start_offset: 20,
            diverging_epoch: None,
            snapshot_id: Some(OffsetAndEpoch::new(20, 4)),
            current_leader_id: Some(1),
            current_leader_epoch: 5,
            records: Bytes::new(),
        };
        for version in [13, 17, 18] {
            let k = fetch_response_to_kafka(&f, version);
            assert_eq!(k.responses[0].partitions[0].snapshot_id.end_offset, 20);
            assert_eq!(fetch_response_from_kafka(&wire(&k, version)).unwrap(), f);
        }
        let none = FetchResponse {
            snapshot_id: None,
            ..f.clone()
        };
        let k = fetch_response_to_kafka(&none, 17);
        assert_eq!(k.responses[0].partitions[0].snapshot_id.end_offset, -1);
        assert_eq!(fetch_response_from_kafka(&wire(&k, 17)).unwrap(), none);
    }

    #[test]
    fn bad_fetch_snapshot_messages_are_rejected() {
        let resp = FetchSnapshotResponse {
            error: ErrorCode::None,
            snapshot_id: OffsetAndEpoch::new(10, 1),
            current_leader_id: Some(1),
            current_leader_epoch: 1,
            size: 100,
            position: 90,
            unaligned_records: Bytes::from(vec![0u8; 10]),
        };
        assert!(
            fetch_snapshot_response_from_kafka(&fetch_snapshot_response_to_kafka(&resp)).is_ok()
        );
        // Bytes past the snapshot's size, a negative position or size.
        for bad in [
            FetchSnapshotResponse {
                position: 91,
                ..resp.clone()
            },
            FetchSnapshotResponse {
                position: -1,
                ..resp.clone()
            },
            FetchSnapshotResponse {
                size: -5,
                ..resp.clone()
            },
            FetchSnapshotResponse {
                position: i64::MAX,
                ..resp.clone()
            },
        ] {
            let err = fetch_snapshot_response_from_kafka(&fetch_snapshot_response_to_kafka(&bad))
                .unwrap_err();
            assert!(matches!(err, ConvertError::InvalidField { .. }), "{bad:?}");
            assert_eq!(err.error_code(), ErrorCode::InvalidRequest);
        }
        // Another partition or topic, or not exactly one.
        let mut k = fetch_snapshot_response_to_kafka(&resp);
        k.topics[0].partitions[0].index = 1;
        assert_eq!(
            fetch_snapshot_response_from_kafka(&k),
            Err(ConvertError::NotMetadataPartition)
        );
        let mut k = fetch_snapshot_request_to_kafka(&FetchSnapshotRequest {
            cluster_id: None,
            replica_id: 2,
            max_bytes: 10,
            current_leader_epoch: 1,
            snapshot_id: OffsetAndEpoch::new(10, 1),
            position: 0,
        });
        k.topics[0].name = TopicName(StrBytes::from_static_str("other"));
        assert_eq!(
            fetch_snapshot_request_from_kafka(&k),
            Err(ConvertError::NotMetadataPartition)
        );
        k.topics.clear();
        assert_eq!(
            fetch_snapshot_request_from_kafka(&k),
            Err(ConvertError::NotMetadataPartition)
        );
    }

    /// Random bytes decoded as FetchSnapshot responses: whatever kafka-protocol accepts, the
    /// conversion either refuses with a ConvertError or gives a chunk inside its snapshot.
    #[test]
    fn random_fetch_snapshot_responses_never_give_a_chunk_outside_its_snapshot() {
        let valid = fetch_snapshot_response_to_kafka(&FetchSnapshotResponse {
            error: ErrorCode::None,
            snapshot_id: OffsetAndEpoch::new(10, 1),
            current_leader_id: Some(1),
            current_leader_epoch: 1,
            size: 100,
            position: 0,
            unaligned_records: Bytes::from(vec![1u8; 20]),
        });
        let mut rng = crate::rng::Rng::new(630);
        let mut decoded = 0;
        for version in [0i16, 1] {
            let mut base = bytes::BytesMut::new();
            valid.encode(&mut base, version).unwrap();
            for _ in 0..5_000 {
                let mut b = base.to_vec();
                for _ in 0..rng.between(1, 4) {
                    let i = rng.below(b.len() as u64) as usize;
                    b[i] = rng.below(256) as u8;
                }
                let Ok(k) = kp::FetchSnapshotResponse::decode(&mut Bytes::from(b), version) else {
                    continue;
                };
                decoded += 1;
                if let Ok(r) = fetch_snapshot_response_from_kafka(&k) {
                    if r.error.is_none() {
                        assert!(r.position >= 0 && r.size >= 0);
                        assert!(r.position + r.unaligned_records.len() as i64 <= r.size);
                    }
                }
            }
        }
        assert!(decoded > 1_000, "{decoded}");
    }
}
