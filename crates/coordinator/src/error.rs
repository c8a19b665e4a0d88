//! Coordinator errors and their Kafka codes, mapped in one place.

use gregor_protocol::error::ErrorCode;
use thiserror::Error;

/// Why a coordinator operation failed. [`CoordinatorError::error_code`] is the code a client
/// gets.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CoordinatorError {
    /// This broker does not lead the coordinator partition (or it was never loaded):
    /// NOT_COORDINATOR.
    #[error("this broker is not the coordinator for partition {partition} of {topic}")]
    NotCoordinator {
        /// Internal topic.
        topic: String,
        /// Partition.
        partition: i32,
    },
    /// The partition is being loaded: COORDINATOR_LOAD_IN_PROGRESS.
    #[error("partition {partition} of {topic} is being loaded")]
    LoadInProgress {
        /// Internal topic.
        topic: String,
        /// Partition.
        partition: i32,
    },
    /// The write did not reach the high watermark within `offsets.commit.timeout.ms`:
    /// COORDINATOR_NOT_AVAILABLE, as Kafka maps REQUEST_TIMED_OUT for coordinator writes.
    #[error("the write to partition {partition} of {topic} was not committed in {timeout_ms} ms")]
    CommitTimeout {
        /// Internal topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// The timeout (ms).
        timeout_ms: i64,
    },
    /// The partition writer refused the append with this error (mapped by
    /// [`append_error_code`]).
    #[error("append failed: {code}: {message}")]
    Append {
        /// The writer's error.
        code: ErrorCode,
        /// The writer's message.
        message: String,
    },
}

impl CoordinatorError {
    /// The Kafka error code for this error.
    pub fn error_code(&self) -> ErrorCode {
        match self {
            Self::NotCoordinator { .. } => ErrorCode::NotCoordinator,
            Self::LoadInProgress { .. } => ErrorCode::CoordinatorLoadInProgress,
            Self::CommitTimeout { .. } => ErrorCode::CoordinatorNotAvailable,
            Self::Append { code, .. } => append_error_code(*code),
        }
    }

    /// The wire code of [`CoordinatorError::error_code`].
    pub fn code(&self) -> i16 {
        self.error_code().code()
    }
}

/// How Kafka's coordinators answer a failed write to their partition
/// (`CoordinatorRuntime` / `GroupMetadataManager.appendForGroup`): the client should look for
/// the coordinator again (NOT_COORDINATOR) when this broker lost the partition or its disk,
/// retry (COORDINATOR_NOT_AVAILABLE) when the partition is unavailable or under-replicated,
/// and gets INVALID_COMMIT_OFFSET_SIZE for a batch too large; anything else is
/// UNKNOWN_SERVER_ERROR.
pub fn append_error_code(code: ErrorCode) -> ErrorCode {
    match code {
        ErrorCode::NotLeaderOrFollower
        | ErrorCode::KafkaStorageError
        | ErrorCode::NotCoordinator => ErrorCode::NotCoordinator,
        ErrorCode::UnknownTopicOrPartition
        | ErrorCode::NotEnoughReplicas
        | ErrorCode::NotEnoughReplicasAfterAppend
        | ErrorCode::RequestTimedOut
        | ErrorCode::CoordinatorNotAvailable => ErrorCode::CoordinatorNotAvailable,
        ErrorCode::MessageTooLarge
        | ErrorCode::RecordListTooLarge
        | ErrorCode::InvalidFetchSize => ErrorCode::InvalidCommitOffsetSize,
        ErrorCode::CoordinatorLoadInProgress => ErrorCode::CoordinatorLoadInProgress,
        _ => ErrorCode::UnknownServerError,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_kafkas_codes() {
        let nc = CoordinatorError::NotCoordinator {
            topic: "t".into(),
            partition: 0,
        };
        assert_eq!(nc.code(), 16);
        let loading = CoordinatorError::LoadInProgress {
            topic: "t".into(),
            partition: 0,
        };
        assert_eq!(loading.code(), 14);
        let append = |code| CoordinatorError::Append {
            code,
            message: String::new(),
        };
        assert_eq!(append(ErrorCode::NotLeaderOrFollower).code(), 16);
        assert_eq!(append(ErrorCode::NotEnoughReplicas).code(), 15);
        assert_eq!(append(ErrorCode::RecordListTooLarge).code(), 28);
        assert_eq!(append(ErrorCode::CorruptMessage).code(), -1);
    }
}
