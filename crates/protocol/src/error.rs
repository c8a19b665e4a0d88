//! Kafka's error codes as one typed enum, [`ErrorCode`], named as Kafka's
//! `org.apache.kafka.common.protocol.Errors` (the protocol guide's "Error Codes" table,
//! <https://kafka.apache.org/protocol#protocol_error_codes>), up to Kafka 4.1.
//!
//! Responses carry the `i16` of [`ErrorCode::code`]; [`ErrorCode::from_code`] reads one back.
//! Every crate maps its own errors to this enum in one function (`LogError::error_code`,
//! `ControllerError::error_code`, the coordinator's `CoordinatorError::error_code`), so no
//! integer literal for an error code appears elsewhere.

use std::fmt;

macro_rules! error_codes {
    ($( ($variant:ident, $name:ident, $code:literal, $retriable:literal) ),* $(,)?) => {
        /// A Kafka error code. The discriminant is the code on the wire.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(i16)]
        pub enum ErrorCode {
            $(
                #[doc = concat!("`", stringify!($name), "` (", stringify!($code), ").")]
                $variant = $code,
            )*
        }

        impl ErrorCode {
            /// Every code Kafka 4.1 defines, in code order.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant),*];

            /// The code as sent on the wire.
            pub const fn code(self) -> i16 {
                self as i16
            }

            /// The error with wire code `code`, or None for a code Kafka does not define.
            pub const fn from_code(code: i16) -> Option<Self> {
                match code {
                    $( $code => Some(ErrorCode::$variant), )*
                    _ => None,
                }
            }

            /// Kafka's name of the error (`Errors.name()`), e.g. `NOT_COORDINATOR`.
            pub const fn name(self) -> &'static str {
                match self {
                    $( ErrorCode::$variant => stringify!($name), )*
                }
            }

            /// True when Kafka's exception for the error is a `RetriableException`: a client
            /// may retry the request as it is.
            pub const fn is_retriable(self) -> bool {
                match self {
                    $( ErrorCode::$variant => $retriable, )*
                }
            }
        }
    };
}

error_codes! {
    (UnknownServerError, UNKNOWN_SERVER_ERROR, -1, false),
    (None, NONE, 0, false),
    (OffsetOutOfRange, OFFSET_OUT_OF_RANGE, 1, false),
    (CorruptMessage, CORRUPT_MESSAGE, 2, true),
    (UnknownTopicOrPartition, UNKNOWN_TOPIC_OR_PARTITION, 3, true),
    (InvalidFetchSize, INVALID_FETCH_SIZE, 4, false),
    (LeaderNotAvailable, LEADER_NOT_AVAILABLE, 5, true),
    (NotLeaderOrFollower, NOT_LEADER_OR_FOLLOWER, 6, true),
    (RequestTimedOut, REQUEST_TIMED_OUT, 7, true),
    (BrokerNotAvailable, BROKER_NOT_AVAILABLE, 8, false),
    (ReplicaNotAvailable, REPLICA_NOT_AVAILABLE, 9, true),
    (MessageTooLarge, MESSAGE_TOO_LARGE, 10, false),
    (StaleControllerEpoch, STALE_CONTROLLER_EPOCH, 11, false),
    (OffsetMetadataTooLarge, OFFSET_METADATA_TOO_LARGE, 12, false),
    (NetworkException, NETWORK_EXCEPTION, 13, true),
    (CoordinatorLoadInProgress, COORDINATOR_LOAD_IN_PROGRESS, 14, true),
    (CoordinatorNotAvailable, COORDINATOR_NOT_AVAILABLE, 15, true),
    (NotCoordinator, NOT_COORDINATOR, 16, true),
    (InvalidTopicException, INVALID_TOPIC_EXCEPTION, 17, false),
    (RecordListTooLarge, RECORD_LIST_TOO_LARGE, 18, false),
    (NotEnoughReplicas, NOT_ENOUGH_REPLICAS, 19, true),
    (NotEnoughReplicasAfterAppend, NOT_ENOUGH_REPLICAS_AFTER_APPEND, 20, true),
    (InvalidRequiredAcks, INVALID_REQUIRED_ACKS, 21, false),
    (IllegalGeneration, ILLEGAL_GENERATION, 22, false),
    (InconsistentGroupProtocol, INCONSISTENT_GROUP_PROTOCOL, 23, false),
    (InvalidGroupId, INVALID_GROUP_ID, 24, false),
    (UnknownMemberId, UNKNOWN_MEMBER_ID, 25, false),
    (InvalidSessionTimeout, INVALID_SESSION_TIMEOUT, 26, false),
    (RebalanceInProgress, REBALANCE_IN_PROGRESS, 27, false),
    (InvalidCommitOffsetSize, INVALID_COMMIT_OFFSET_SIZE, 28, false),
    (TopicAuthorizationFailed, TOPIC_AUTHORIZATION_FAILED, 29, false),
    (GroupAuthorizationFailed, GROUP_AUTHORIZATION_FAILED, 30, false),
    (ClusterAuthorizationFailed, CLUSTER_AUTHORIZATION_FAILED, 31, false),
    (InvalidTimestamp, INVALID_TIMESTAMP, 32, false),
    (UnsupportedSaslMechanism, UNSUPPORTED_SASL_MECHANISM, 33, false),
    (IllegalSaslState, ILLEGAL_SASL_STATE, 34, false),
    (UnsupportedVersion, UNSUPPORTED_VERSION, 35, false),
    (TopicAlreadyExists, TOPIC_ALREADY_EXISTS, 36, false),
    (InvalidPartitions, INVALID_PARTITIONS, 37, false),
    (InvalidReplicationFactor, INVALID_REPLICATION_FACTOR, 38, false),
    (InvalidReplicaAssignment, INVALID_REPLICA_ASSIGNMENT, 39, false),
    (InvalidConfig, INVALID_CONFIG, 40, false),
    (NotController, NOT_CONTROLLER, 41, true),
    (InvalidRequest, INVALID_REQUEST, 42, false),
    (UnsupportedForMessageFormat, UNSUPPORTED_FOR_MESSAGE_FORMAT, 43, false),
    (PolicyViolation, POLICY_VIOLATION, 44, false),
    (OutOfOrderSequenceNumber, OUT_OF_ORDER_SEQUENCE_NUMBER, 45, false),
    (DuplicateSequenceNumber, DUPLICATE_SEQUENCE_NUMBER, 46, false),
    (InvalidProducerEpoch, INVALID_PRODUCER_EPOCH, 47, false),
    (InvalidTxnState, INVALID_TXN_STATE, 48, false),
    (InvalidProducerIdMapping, INVALID_PRODUCER_ID_MAPPING, 49, false),
    (InvalidTransactionTimeout, INVALID_TRANSACTION_TIMEOUT, 50, false),
    (ConcurrentTransactions, CONCURRENT_TRANSACTIONS, 51, false),
    (TransactionCoordinatorFenced, TRANSACTION_COORDINATOR_FENCED, 52, false),
    (TransactionalIdAuthorizationFailed, TRANSACTIONAL_ID_AUTHORIZATION_FAILED, 53, false),
    (SecurityDisabled, SECURITY_DISABLED, 54, false),
    (OperationNotAttempted, OPERATION_NOT_ATTEMPTED, 55, false),
    (KafkaStorageError, KAFKA_STORAGE_ERROR, 56, true),
    (LogDirNotFound, LOG_DIR_NOT_FOUND, 57, false),
    (SaslAuthenticationFailed, SASL_AUTHENTICATION_FAILED, 58, false),
    (UnknownProducerId, UNKNOWN_PRODUCER_ID, 59, false),
    (ReassignmentInProgress, REASSIGNMENT_IN_PROGRESS, 60, false),
    (DelegationTokenAuthDisabled, DELEGATION_TOKEN_AUTH_DISABLED, 61, false),
    (DelegationTokenNotFound, DELEGATION_TOKEN_NOT_FOUND, 62, false),
    (DelegationTokenOwnerMismatch, DELEGATION_TOKEN_OWNER_MISMATCH, 63, false),
    (DelegationTokenRequestNotAllowed, DELEGATION_TOKEN_REQUEST_NOT_ALLOWED, 64, false),
    (DelegationTokenAuthorizationFailed, DELEGATION_TOKEN_AUTHORIZATION_FAILED, 65, false),
    (DelegationTokenExpired, DELEGATION_TOKEN_EXPIRED, 66, false),
    (InvalidPrincipalType, INVALID_PRINCIPAL_TYPE, 67, false),
    (NonEmptyGroup, NON_EMPTY_GROUP, 68, false),
    (GroupIdNotFound, GROUP_ID_NOT_FOUND, 69, false),
    (FetchSessionIdNotFound, FETCH_SESSION_ID_NOT_FOUND, 70, true),
    (InvalidFetchSessionEpoch, INVALID_FETCH_SESSION_EPOCH, 71, true),
    (ListenerNotFound, LISTENER_NOT_FOUND, 72, true),
    (TopicDeletionDisabled, TOPIC_DELETION_DISABLED, 73, false),
    (FencedLeaderEpoch, FENCED_LEADER_EPOCH, 74, true),
    (UnknownLeaderEpoch, UNKNOWN_LEADER_EPOCH, 75, true),
    (UnsupportedCompressionType, UNSUPPORTED_COMPRESSION_TYPE, 76, false),
    (StaleBrokerEpoch, STALE_BROKER_EPOCH, 77, false),
    (OffsetNotAvailable, OFFSET_NOT_AVAILABLE, 78, true),
    (MemberIdRequired, MEMBER_ID_REQUIRED, 79, false),
    (PreferredLeaderNotAvailable, PREFERRED_LEADER_NOT_AVAILABLE, 80, true),
    (GroupMaxSizeReached, GROUP_MAX_SIZE_REACHED, 81, false),
    (FencedInstanceId, FENCED_INSTANCE_ID, 82, false),
    (EligibleLeadersNotAvailable, ELIGIBLE_LEADERS_NOT_AVAILABLE, 83, true),
    (ElectionNotNeeded, ELECTION_NOT_NEEDED, 84, true),
    (NoReassignmentInProgress, NO_REASSIGNMENT_IN_PROGRESS, 85, false),
    (GroupSubscribedToTopic, GROUP_SUBSCRIBED_TO_TOPIC, 86, false),
    (InvalidRecord, INVALID_RECORD, 87, false),
    (UnstableOffsetCommit, UNSTABLE_OFFSET_COMMIT, 88, true),
    (ThrottlingQuotaExceeded, THROTTLING_QUOTA_EXCEEDED, 89, true),
    (ProducerFenced, PRODUCER_FENCED, 90, false),
    (ResourceNotFound, RESOURCE_NOT_FOUND, 91, false),
    (DuplicateResource, DUPLICATE_RESOURCE, 92, false),
    (UnacceptableCredential, UNACCEPTABLE_CREDENTIAL, 93, false),
    (InconsistentVoterSet, INCONSISTENT_VOTER_SET, 94, false),
    (InvalidUpdateVersion, INVALID_UPDATE_VERSION, 95, false),
    (FeatureUpdateFailed, FEATURE_UPDATE_FAILED, 96, false),
    (PrincipalDeserializationFailure, PRINCIPAL_DESERIALIZATION_FAILURE, 97, false),
    (SnapshotNotFound, SNAPSHOT_NOT_FOUND, 98, false),
    (PositionOutOfRange, POSITION_OUT_OF_RANGE, 99, false),
    (UnknownTopicId, UNKNOWN_TOPIC_ID, 100, true),
    (DuplicateBrokerRegistration, DUPLICATE_BROKER_REGISTRATION, 101, false),
    (BrokerIdNotRegistered, BROKER_ID_NOT_REGISTERED, 102, false),
    (InconsistentTopicId, INCONSISTENT_TOPIC_ID, 103, true),
    (InconsistentClusterId, INCONSISTENT_CLUSTER_ID, 104, false),
    (TransactionalIdNotFound, TRANSACTIONAL_ID_NOT_FOUND, 105, false),
    (FetchSessionTopicIdError, FETCH_SESSION_TOPIC_ID_ERROR, 106, true),
    (IneligibleReplica, INELIGIBLE_REPLICA, 107, false),
    (NewLeaderElected, NEW_LEADER_ELECTED, 108, false),
    (OffsetMovedToTieredStorage, OFFSET_MOVED_TO_TIERED_STORAGE, 109, false),
    (FencedMemberEpoch, FENCED_MEMBER_EPOCH, 110, false),
    (UnreleasedInstanceId, UNRELEASED_INSTANCE_ID, 111, false),
    (UnsupportedAssignor, UNSUPPORTED_ASSIGNOR, 112, false),
    (StaleMemberEpoch, STALE_MEMBER_EPOCH, 113, false),
    (MismatchedEndpointType, MISMATCHED_ENDPOINT_TYPE, 114, false),
    (UnsupportedEndpointType, UNSUPPORTED_ENDPOINT_TYPE, 115, false),
    (UnknownControllerId, UNKNOWN_CONTROLLER_ID, 116, false),
    (UnknownSubscriptionId, UNKNOWN_SUBSCRIPTION_ID, 117, false),
    (TelemetryTooLarge, TELEMETRY_TOO_LARGE, 118, false),
    (InvalidRegistration, INVALID_REGISTRATION, 119, false),
    (TransactionAbortable, TRANSACTION_ABORTABLE, 120, false),
    (InvalidRecordState, INVALID_RECORD_STATE, 121, false),
    (ShareSessionNotFound, SHARE_SESSION_NOT_FOUND, 122, true),
    (InvalidShareSessionEpoch, INVALID_SHARE_SESSION_EPOCH, 123, true),
    (FencedStateEpoch, FENCED_STATE_EPOCH, 124, false),
    (InvalidVoterKey, INVALID_VOTER_KEY, 125, false),
    (DuplicateVoter, DUPLICATE_VOTER, 126, false),
    (VoterNotFound, VOTER_NOT_FOUND, 127, false),
    (InvalidRegularExpression, INVALID_REGULAR_EXPRESSION, 128, false),
    (RebootstrapRequired, REBOOTSTRAP_REQUIRED, 129, false),
    (StreamsInvalidTopology, STREAMS_INVALID_TOPOLOGY, 130, false),
    (StreamsInvalidTopologyEpoch, STREAMS_INVALID_TOPOLOGY_EPOCH, 131, false),
    (StreamsTopologyFenced, STREAMS_TOPOLOGY_FENCED, 132, false),
    (ShareSessionLimitReached, SHARE_SESSION_LIMIT_REACHED, 133, true),
}

impl ErrorCode {
    /// True for [`ErrorCode::None`].
    pub const fn is_none(self) -> bool {
        matches!(self, ErrorCode::None)
    }

    /// The error for wire code `code`; a code Kafka does not define reads as
    /// [`ErrorCode::UnknownServerError`], as Kafka's `Errors.forCode` does.
    pub const fn for_code(code: i16) -> Self {
        match Self::from_code(code) {
            Some(e) => e,
            None => ErrorCode::UnknownServerError,
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.code())
    }
}

impl From<ErrorCode> for i16 {
    fn from(e: ErrorCode) -> i16 {
        e.code()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_names_are_kafkas() {
        assert_eq!(ErrorCode::None.code(), 0);
        assert_eq!(ErrorCode::UnknownServerError.code(), -1);
        assert_eq!(ErrorCode::NotCoordinator.code(), 16);
        assert_eq!(ErrorCode::NotCoordinator.name(), "NOT_COORDINATOR");
        assert_eq!(ErrorCode::CoordinatorLoadInProgress.code(), 14);
        assert_eq!(ErrorCode::CoordinatorNotAvailable.code(), 15);
        assert_eq!(
            ErrorCode::InvalidTopicException.name(),
            "INVALID_TOPIC_EXCEPTION"
        );
        assert_eq!(ErrorCode::FencedLeaderEpoch.code(), 74);
        // Kafka: UNKNOWN_LEADER_EPOCH is 75 and UNSUPPORTED_COMPRESSION_TYPE 76 (gregor's
        // broker once used 76 for the former).
        assert_eq!(ErrorCode::UnknownLeaderEpoch.code(), 75);
        assert_eq!(ErrorCode::UnsupportedCompressionType.code(), 76);
        // UNSUPPORTED_ENDPOINT_TYPE is 115 (KIP-919); 120 is TRANSACTION_ABORTABLE.
        assert_eq!(ErrorCode::UnsupportedEndpointType.code(), 115);
        assert_eq!(ErrorCode::TransactionAbortable.code(), 120);
        assert_eq!(ErrorCode::StaleMemberEpoch.code(), 113);
        assert!(ErrorCode::NotCoordinator.is_retriable());
        assert!(!ErrorCode::IllegalGeneration.is_retriable());
        assert_eq!(
            ErrorCode::NotCoordinator.to_string(),
            "NOT_COORDINATOR (16)"
        );
    }

    #[test]
    fn from_code_round_trips_every_code() {
        let mut last = i16::MIN;
        for e in ErrorCode::ALL {
            assert!(e.code() > last, "codes are in order and unique");
            last = e.code();
            assert_eq!(ErrorCode::from_code(e.code()), Some(*e));
            assert_eq!(i16::from(*e), e.code());
        }
        assert_eq!(ErrorCode::ALL.len(), 135);
        assert_eq!(ErrorCode::from_code(-2), None);
        assert_eq!(ErrorCode::from_code(i16::MAX), None);
        assert_eq!(ErrorCode::for_code(9999), ErrorCode::UnknownServerError);
        // Every code from -1 to the highest is defined: no gaps.
        assert_eq!(i32::from(last) + 2, ErrorCode::ALL.len() as i32);
    }
}
