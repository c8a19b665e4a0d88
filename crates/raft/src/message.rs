//! The KRaft RPCs as the core sees them: one struct per request and response, with the fields
//! of Kafka's JSON schemas that a single-partition quorum (`__cluster_metadata-0`) uses, in
//! Kafka's names and meanings. [`crate::convert`] maps them to and from
//! `kafka_protocol::messages::{VoteRequest, ...}`, so a socket transport is only framing.
//!
//! - Vote (key 52, v0-2; `PreVote` is KIP-996, v2)
//! - BeginQuorumEpoch (53), EndQuorumEpoch (54) (KIP-595)
//! - Fetch (1, v13+ for KRaft; `HighWatermark` in the request is KIP-1166, v18; `SnapshotId`
//!   in the response is KIP-630)
//! - FetchSnapshot (59, v0-1, KIP-630)

use bytes::Bytes;
use gregor_protocol::error::ErrorCode;

use crate::types::{NodeId, OffsetAndEpoch};

/// A message between two nodes. Responses carry the correlation id of their request; a node
/// ignores a response it is not waiting for (Kafka's `RequestManager`), which keeps duplicated
/// or reordered responses harmless.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// A request.
    Request {
        /// Chosen by the sender, echoed in the response.
        correlation_id: i32,
        /// The request.
        request: Request,
    },
    /// A response.
    Response {
        /// The correlation id of the request answered.
        correlation_id: i32,
        /// The response.
        response: Response,
    },
}

/// A KRaft request.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    /// Vote or PreVote.
    Vote(VoteRequest),
    /// A new leader announces its epoch to the voters.
    BeginQuorumEpoch(BeginQuorumEpochRequest),
    /// A resigning leader tells the voters.
    EndQuorumEpoch(EndQuorumEpochRequest),
    /// A follower or observer replicates the log.
    Fetch(FetchRequest),
    /// A follower or observer fetches a chunk of the leader's snapshot (KIP-630).
    FetchSnapshot(FetchSnapshotRequest),
}

/// A KRaft response.
#[derive(Debug, Clone, PartialEq)]
pub enum Response {
    /// Answer to [`Request::Vote`].
    Vote(VoteResponse),
    /// Answer to [`Request::BeginQuorumEpoch`].
    BeginQuorumEpoch(BeginQuorumEpochResponse),
    /// Answer to [`Request::EndQuorumEpoch`].
    EndQuorumEpoch(EndQuorumEpochResponse),
    /// Answer to [`Request::Fetch`].
    Fetch(FetchResponse),
    /// Answer to [`Request::FetchSnapshot`].
    FetchSnapshot(FetchSnapshotResponse),
}

/// `VoteRequest` for the metadata partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VoteRequest {
    /// `ClusterId` (nullable).
    pub cluster_id: Option<String>,
    /// `VoterId` (v1+): the voter the request is meant for, or `None` (-1).
    pub voter_id: Option<NodeId>,
    /// `ReplicaEpoch` (`CandidateEpoch` before v2): the candidate's bumped epoch, or for a
    /// PreVote the prospective's current epoch (not bumped).
    pub replica_epoch: i32,
    /// `ReplicaId` (`CandidateId`): the candidate.
    pub replica_id: NodeId,
    /// `LastOffsetEpoch`: epoch of the candidate's last record.
    pub last_offset_epoch: i32,
    /// `LastOffset`: the candidate's log end offset.
    pub last_offset: i64,
    /// `PreVote` (v2, KIP-996): a non-binding probe that changes no state on the receiver.
    pub pre_vote: bool,
}

/// `VoteResponse` for the metadata partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VoteResponse {
    /// The error (top level for INCONSISTENT_CLUSTER_ID, partition level otherwise).
    pub error: ErrorCode,
    /// `LeaderId`: the responder's known leader of `leader_epoch`, `None` for -1.
    pub leader_id: Option<NodeId>,
    /// `LeaderEpoch`: the responder's current epoch.
    pub leader_epoch: i32,
    /// `VoteGranted`.
    pub vote_granted: bool,
}

/// `BeginQuorumEpochRequest`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BeginQuorumEpochRequest {
    /// `ClusterId` (nullable).
    pub cluster_id: Option<String>,
    /// `VoterId` (v1+): the receiving voter, or `None`.
    pub voter_id: Option<NodeId>,
    /// `LeaderId`: the new leader.
    pub leader_id: NodeId,
    /// `LeaderEpoch`: its epoch.
    pub leader_epoch: i32,
}

/// `BeginQuorumEpochResponse`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BeginQuorumEpochResponse {
    /// The error.
    pub error: ErrorCode,
    /// `LeaderId` as the responder knows it.
    pub leader_id: Option<NodeId>,
    /// `LeaderEpoch`: the responder's epoch.
    pub leader_epoch: i32,
}

/// `EndQuorumEpochRequest`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndQuorumEpochRequest {
    /// `ClusterId` (nullable).
    pub cluster_id: Option<String>,
    /// `LeaderId`: the resigning leader.
    pub leader_id: NodeId,
    /// `LeaderEpoch`: the epoch it resigns.
    pub leader_epoch: i32,
    /// `PreferredSuccessors` (`PreferredCandidates` in v1): voters by descending fetch offset;
    /// earlier entries wait less before their election.
    pub preferred_successors: Vec<NodeId>,
}

/// `EndQuorumEpochResponse`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndQuorumEpochResponse {
    /// The error.
    pub error: ErrorCode,
    /// `LeaderId` as the responder knows it.
    pub leader_id: Option<NodeId>,
    /// `LeaderEpoch`: the responder's epoch.
    pub leader_epoch: i32,
}

/// `FetchRequest` for `__cluster_metadata-0`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchRequest {
    /// `ClusterId` (nullable).
    pub cluster_id: Option<String>,
    /// `ReplicaState.ReplicaId`: the fetching replica (voter or observer); negative for a
    /// consumer, whose fetches never count towards the high watermark.
    pub replica_id: NodeId,
    /// `MaxWaitMs`: how long the leader may park the fetch when it has no new data.
    pub max_wait_ms: i32,
    /// `CurrentLeaderEpoch`: the fetcher's epoch.
    pub current_leader_epoch: i32,
    /// `FetchOffset`: the fetcher's log end offset.
    pub fetch_offset: i64,
    /// `LastFetchedEpoch`: the epoch of the fetcher's last record (0 when empty).
    pub last_fetched_epoch: i32,
    /// `HighWatermark` (v18, KIP-1166): the fetcher's high watermark, -1 when unknown. The
    /// leader answers at once instead of parking when its own is higher.
    pub high_watermark: i64,
}

/// `FetchResponse` for `__cluster_metadata-0`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchResponse {
    /// The error (top level for INCONSISTENT_CLUSTER_ID, partition level otherwise).
    pub error: ErrorCode,
    /// `HighWatermark`: the leader's, -1 while unknown (a new leader before it commits a record
    /// of its own epoch).
    pub high_watermark: i64,
    /// `LogStartOffset`.
    pub log_start_offset: i64,
    /// `DivergingEpoch`: the fetcher must truncate to this end offset of this epoch before
    /// fetching again (`None` is epoch -1, end offset -1 on the wire).
    pub diverging_epoch: Option<OffsetAndEpoch>,
    /// `SnapshotId` (KIP-630): the fetch offset is below what the leader's log holds; the
    /// fetcher must fetch this snapshot (the leader's latest) with FetchSnapshot (`None` is
    /// end offset -1, epoch -1 on the wire).
    pub snapshot_id: Option<OffsetAndEpoch>,
    /// `CurrentLeader.LeaderId`.
    pub current_leader_id: Option<NodeId>,
    /// `CurrentLeader.LeaderEpoch`.
    pub current_leader_epoch: i32,
    /// `Records`: whole v2 record batches starting at the fetch offset (empty when none).
    pub records: Bytes,
}

/// `FetchSnapshotRequest` (API 59) for `__cluster_metadata-0`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchSnapshotRequest {
    /// `ClusterId` (nullable, tagged).
    pub cluster_id: Option<String>,
    /// `ReplicaId`: the fetching replica.
    pub replica_id: NodeId,
    /// `MaxBytes`: most bytes of snapshot to return.
    pub max_bytes: i32,
    /// `CurrentLeaderEpoch`: the fetcher's epoch.
    pub current_leader_epoch: i32,
    /// `SnapshotId`: end offset and epoch of the snapshot.
    pub snapshot_id: OffsetAndEpoch,
    /// `Position`: byte position in the snapshot to return from.
    pub position: i64,
}

/// `FetchSnapshotResponse` for `__cluster_metadata-0`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchSnapshotResponse {
    /// The error (top level for INCONSISTENT_CLUSTER_ID, partition level otherwise):
    /// SNAPSHOT_NOT_FOUND, POSITION_OUT_OF_RANGE, or the leader-only errors of Fetch.
    pub error: ErrorCode,
    /// `SnapshotId`: the snapshot the bytes are of ((-1, -1) with an error).
    pub snapshot_id: OffsetAndEpoch,
    /// `CurrentLeader.LeaderId`.
    pub current_leader_id: Option<NodeId>,
    /// `CurrentLeader.LeaderEpoch`.
    pub current_leader_epoch: i32,
    /// `Size`: the snapshot's total size in bytes (-1 with an error).
    pub size: i64,
    /// `Position`: where `unaligned_records` starts in the snapshot (-1 with an error).
    pub position: i64,
    /// `UnalignedRecords`: raw snapshot bytes, not aligned to batches.
    pub unaligned_records: Bytes,
}
