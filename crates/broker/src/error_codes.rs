//! Kafka error codes used by the handlers, as `i16` constants taken from the typed
//! [`ErrorCode`] enum of gregor-protocol (which has the full list). New code uses the enum;
//! these keep existing handlers readable.

pub use gregor_protocol::error::ErrorCode;

/// UNKNOWN_SERVER_ERROR.
pub const UNKNOWN_SERVER_ERROR: i16 = ErrorCode::UnknownServerError.code();
/// NONE.
pub const NONE: i16 = ErrorCode::None.code();
/// OFFSET_OUT_OF_RANGE.
pub const OFFSET_OUT_OF_RANGE: i16 = ErrorCode::OffsetOutOfRange.code();
/// CORRUPT_MESSAGE.
pub const CORRUPT_MESSAGE: i16 = ErrorCode::CorruptMessage.code();
/// UNKNOWN_TOPIC_OR_PARTITION.
pub const UNKNOWN_TOPIC_OR_PARTITION: i16 = ErrorCode::UnknownTopicOrPartition.code();
/// LEADER_NOT_AVAILABLE.
pub const LEADER_NOT_AVAILABLE: i16 = ErrorCode::LeaderNotAvailable.code();
/// The leader has no endpoint on the request's listener (72).
pub const LISTENER_NOT_FOUND: i16 = ErrorCode::ListenerNotFound.code();
/// A new leader's high watermark has not reached its epoch's start offset (78, KIP-207).
pub const OFFSET_NOT_AVAILABLE: i16 = ErrorCode::OffsetNotAvailable.code();
/// NOT_LEADER_OR_FOLLOWER.
pub const NOT_LEADER_OR_FOLLOWER: i16 = ErrorCode::NotLeaderOrFollower.code();
/// REQUEST_TIMED_OUT.
pub const REQUEST_TIMED_OUT: i16 = ErrorCode::RequestTimedOut.code();
/// MESSAGE_TOO_LARGE.
pub const MESSAGE_TOO_LARGE: i16 = ErrorCode::MessageTooLarge.code();
/// INVALID_TOPIC_EXCEPTION.
pub const INVALID_TOPIC_EXCEPTION: i16 = ErrorCode::InvalidTopicException.code();
/// NOT_ENOUGH_REPLICAS.
pub const NOT_ENOUGH_REPLICAS: i16 = ErrorCode::NotEnoughReplicas.code();
/// INVALID_REQUIRED_ACKS.
pub const INVALID_REQUIRED_ACKS: i16 = ErrorCode::InvalidRequiredAcks.code();
/// UNSUPPORTED_FOR_MESSAGE_FORMAT.
pub const UNSUPPORTED_FOR_MESSAGE_FORMAT: i16 = ErrorCode::UnsupportedForMessageFormat.code();
/// UNSUPPORTED_VERSION.
pub const UNSUPPORTED_VERSION: i16 = ErrorCode::UnsupportedVersion.code();
/// TOPIC_ALREADY_EXISTS.
pub const TOPIC_ALREADY_EXISTS: i16 = ErrorCode::TopicAlreadyExists.code();
/// INVALID_PARTITIONS.
pub const INVALID_PARTITIONS: i16 = ErrorCode::InvalidPartitions.code();
/// INVALID_REPLICATION_FACTOR.
pub const INVALID_REPLICATION_FACTOR: i16 = ErrorCode::InvalidReplicationFactor.code();
/// INVALID_CONFIG.
pub const INVALID_CONFIG: i16 = ErrorCode::InvalidConfig.code();
/// INVALID_REQUEST.
pub const INVALID_REQUEST: i16 = ErrorCode::InvalidRequest.code();
/// TOPIC_AUTHORIZATION_FAILED.
pub const TOPIC_AUTHORIZATION_FAILED: i16 = ErrorCode::TopicAuthorizationFailed.code();
/// GROUP_AUTHORIZATION_FAILED.
pub const GROUP_AUTHORIZATION_FAILED: i16 = ErrorCode::GroupAuthorizationFailed.code();
/// CLUSTER_AUTHORIZATION_FAILED.
pub const CLUSTER_AUTHORIZATION_FAILED: i16 = ErrorCode::ClusterAuthorizationFailed.code();
/// TRANSACTIONAL_ID_AUTHORIZATION_FAILED.
pub const TRANSACTIONAL_ID_AUTHORIZATION_FAILED: i16 =
    ErrorCode::TransactionalIdAuthorizationFailed.code();
/// KAFKA_STORAGE_ERROR.
pub const KAFKA_STORAGE_ERROR: i16 = ErrorCode::KafkaStorageError.code();
/// FENCED_LEADER_EPOCH.
pub const FENCED_LEADER_EPOCH: i16 = ErrorCode::FencedLeaderEpoch.code();
/// UNKNOWN_LEADER_EPOCH.
pub const UNKNOWN_LEADER_EPOCH: i16 = ErrorCode::UnknownLeaderEpoch.code();
/// UNKNOWN_TOPIC_ID.
pub const UNKNOWN_TOPIC_ID: i16 = ErrorCode::UnknownTopicId.code();
/// INCONSISTENT_TOPIC_ID.
pub const INCONSISTENT_TOPIC_ID: i16 = ErrorCode::InconsistentTopicId.code();
/// UNSUPPORTED_ENDPOINT_TYPE (KIP-919).
pub const UNSUPPORTED_ENDPOINT_TYPE: i16 = ErrorCode::UnsupportedEndpointType.code();
/// INVALID_REPLICA_ASSIGNMENT.
pub const INVALID_REPLICA_ASSIGNMENT: i16 = ErrorCode::InvalidReplicaAssignment.code();
/// COORDINATOR_NOT_AVAILABLE.
pub const COORDINATOR_NOT_AVAILABLE: i16 = ErrorCode::CoordinatorNotAvailable.code();
/// INVALID_RECORD.
pub const INVALID_RECORD: i16 = ErrorCode::InvalidRecord.code();
/// FETCH_SESSION_ID_NOT_FOUND.
pub const FETCH_SESSION_ID_NOT_FOUND: i16 = ErrorCode::FetchSessionIdNotFound.code();
/// INVALID_FETCH_SESSION_EPOCH (KIP-227).
pub const INVALID_FETCH_SESSION_EPOCH: i16 = ErrorCode::InvalidFetchSessionEpoch.code();
/// FETCH_SESSION_TOPIC_ID_ERROR (KIP-516): a session used with and without topic ids.
pub const FETCH_SESSION_TOPIC_ID_ERROR: i16 = ErrorCode::FetchSessionTopicIdError.code();
/// OFFSET_METADATA_TOO_LARGE (group coordinator).
pub const OFFSET_METADATA_TOO_LARGE: i16 = ErrorCode::OffsetMetadataTooLarge.code();
/// COORDINATOR_LOAD_IN_PROGRESS (group coordinator).
pub const COORDINATOR_LOAD_IN_PROGRESS: i16 = ErrorCode::CoordinatorLoadInProgress.code();
/// NOT_COORDINATOR (group coordinator).
pub const NOT_COORDINATOR: i16 = ErrorCode::NotCoordinator.code();
/// RECORD_LIST_TOO_LARGE (group coordinator).
pub const RECORD_LIST_TOO_LARGE: i16 = ErrorCode::RecordListTooLarge.code();
/// ILLEGAL_GENERATION (group coordinator).
pub const ILLEGAL_GENERATION: i16 = ErrorCode::IllegalGeneration.code();
/// INCONSISTENT_GROUP_PROTOCOL (group coordinator).
pub const INCONSISTENT_GROUP_PROTOCOL: i16 = ErrorCode::InconsistentGroupProtocol.code();
/// INVALID_GROUP_ID (group coordinator).
pub const INVALID_GROUP_ID: i16 = ErrorCode::InvalidGroupId.code();
/// UNKNOWN_MEMBER_ID (group coordinator).
pub const UNKNOWN_MEMBER_ID: i16 = ErrorCode::UnknownMemberId.code();
/// INVALID_SESSION_TIMEOUT (group coordinator).
pub const INVALID_SESSION_TIMEOUT: i16 = ErrorCode::InvalidSessionTimeout.code();
/// REBALANCE_IN_PROGRESS (group coordinator).
pub const REBALANCE_IN_PROGRESS: i16 = ErrorCode::RebalanceInProgress.code();
/// INVALID_COMMIT_OFFSET_SIZE (group coordinator).
pub const INVALID_COMMIT_OFFSET_SIZE: i16 = ErrorCode::InvalidCommitOffsetSize.code();
/// NON_EMPTY_GROUP (group coordinator).
pub const NON_EMPTY_GROUP: i16 = ErrorCode::NonEmptyGroup.code();
/// GROUP_ID_NOT_FOUND (group coordinator).
pub const GROUP_ID_NOT_FOUND: i16 = ErrorCode::GroupIdNotFound.code();
/// MEMBER_ID_REQUIRED (group coordinator).
pub const MEMBER_ID_REQUIRED: i16 = ErrorCode::MemberIdRequired.code();
/// GROUP_MAX_SIZE_REACHED (group coordinator).
pub const GROUP_MAX_SIZE_REACHED: i16 = ErrorCode::GroupMaxSizeReached.code();
/// FENCED_INSTANCE_ID (group coordinator).
pub const FENCED_INSTANCE_ID: i16 = ErrorCode::FencedInstanceId.code();
/// GROUP_SUBSCRIBED_TO_TOPIC (group coordinator).
pub const GROUP_SUBSCRIBED_TO_TOPIC: i16 = ErrorCode::GroupSubscribedToTopic.code();
/// UNSTABLE_OFFSET_COMMIT (group coordinator).
pub const UNSTABLE_OFFSET_COMMIT: i16 = ErrorCode::UnstableOffsetCommit.code();
/// FENCED_MEMBER_EPOCH (group coordinator).
pub const FENCED_MEMBER_EPOCH: i16 = ErrorCode::FencedMemberEpoch.code();
/// UNRELEASED_INSTANCE_ID (group coordinator).
pub const UNRELEASED_INSTANCE_ID: i16 = ErrorCode::UnreleasedInstanceId.code();
/// UNSUPPORTED_ASSIGNOR (group coordinator).
pub const UNSUPPORTED_ASSIGNOR: i16 = ErrorCode::UnsupportedAssignor.code();
/// STALE_MEMBER_EPOCH (group coordinator).
pub const STALE_MEMBER_EPOCH: i16 = ErrorCode::StaleMemberEpoch.code();
/// POLICY_VIOLATION.
pub const POLICY_VIOLATION: i16 = ErrorCode::PolicyViolation.code();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_are_kafkas_codes() {
        // Regressions: these two were 76 and 120, which Kafka uses for
        // UNSUPPORTED_COMPRESSION_TYPE and TRANSACTION_ABORTABLE.
        assert_eq!(UNKNOWN_LEADER_EPOCH, 75);
        assert_eq!(UNSUPPORTED_ENDPOINT_TYPE, 115);
        assert_eq!(NOT_COORDINATOR, 16);
        assert_eq!(UNKNOWN_SERVER_ERROR, -1);
    }
}
