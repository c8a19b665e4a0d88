//! The crate's error type and its mapping to Kafka error codes.

use std::io;
use std::path::Path;

use gregor_protocol::batch::BatchError;
use gregor_protocol::error::ErrorCode;
use thiserror::Error;

/// Everything that can go wrong in a partition log. [`LogError::kafka_error_code`] maps each
/// variant to the error code Apache Kafka returns for the same condition.
#[derive(Debug, Error)]
pub enum LogError {
    /// A file operation failed; `context` names the operation and the file. Maps to
    /// KAFKA_STORAGE_ERROR (56).
    #[error("{context}: {source}")]
    Io {
        /// What was being done, naming the file ("writing /data/t-0/000…0.log").
        context: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A produced batch failed validation. CRC, size and structure problems map to
    /// CORRUPT_MESSAGE (2); rule violations and a magic other than 2 to INVALID_RECORD (87).
    #[error("invalid record batch: {0}")]
    Batch(#[from] BatchError),
    /// A batch is larger than `max.message.bytes`: MESSAGE_TOO_LARGE (10).
    #[error("record batch of {size_bytes} bytes exceeds max.message.bytes {max_bytes}")]
    MessageTooLarge {
        /// Size of the offending batch in bytes.
        size_bytes: usize,
        /// The configured limit in bytes.
        max_bytes: usize,
    },
    /// The records of one append are larger than `segment.bytes`: RECORD_LIST_TOO_LARGE (18).
    #[error("records of {size_bytes} bytes exceed segment.bytes {segment_bytes}")]
    RecordListTooLarge {
        /// Size of the append in bytes.
        size_bytes: usize,
        /// The configured segment size in bytes.
        segment_bytes: u64,
    },
    /// A read asked for an offset outside `[log_start_offset, log_end_offset]`:
    /// OFFSET_OUT_OF_RANGE (1).
    #[error("offset {offset} is out of range [{log_start_offset}, {log_end_offset}]")]
    OffsetOutOfRange {
        /// The requested offset.
        offset: i64,
        /// First offset in the log.
        log_start_offset: i64,
        /// Offset the next appended record will get.
        log_end_offset: i64,
    },
    /// An idempotent producer skipped or repeated sequence numbers: OUT_OF_ORDER_SEQUENCE_NUMBER
    /// (45).
    #[error(
        "out of order sequence number for producer {producer_id} (epoch {producer_epoch}): \
         got {first_sequence}, expected {expected_sequence}"
    )]
    OutOfOrderSequence {
        /// The producer id.
        producer_id: i64,
        /// The producer epoch of the batch.
        producer_epoch: i16,
        /// `baseSequence` of the rejected batch.
        first_sequence: i32,
        /// The sequence the log expected (last sequence + 1, or 0 for a new epoch/producer).
        expected_sequence: i32,
    },
    /// A batch carries an older producer epoch than the log has seen: INVALID_PRODUCER_EPOCH
    /// (47).
    #[error("producer {producer_id}: epoch {producer_epoch} is older than the current epoch {current_epoch}")]
    InvalidProducerEpoch {
        /// The producer id.
        producer_id: i64,
        /// Epoch in the rejected batch.
        producer_epoch: i16,
        /// Latest epoch the log has seen for this producer.
        current_epoch: i16,
    },
    /// A batch breaks one of Kafka's record rules (control batch from a client, producer id
    /// without a sequence, empty request, trailing bytes, ...): INVALID_RECORD (87).
    #[error("invalid record: {0}")]
    InvalidRecord(String),
    /// A transactional write outside an open transaction, a non-transactional write while the
    /// producer's transaction is open, or a first transactional write the transaction
    /// coordinator did not verify (KIP-890): INVALID_TXN_STATE (48).
    #[error("{0}")]
    InvalidTxnState(String),
    /// A transaction marker from a coordinator epoch older than the one the partition last
    /// saw for the producer: TRANSACTION_COORDINATOR_FENCED (52).
    #[error("{0}")]
    TransactionCoordinatorFenced(String),
    /// Records of a produced batch failed Kafka's per-record checks (`LogValidator`: a null
    /// key on a compacted topic, a timestamp outside `message.timestamp.before.max.ms` /
    /// `after.max.ms`, LogAppendTime set by the producer). The whole batch is refused and
    /// `record_errors` names the records (KIP-467), so a client fails those records with
    /// their own message and the others with a generic one. Maps to INVALID_TIMESTAMP (32) if
    /// any record's timestamp is wrong, else INVALID_RECORD (87); the Produce response carries
    /// `message` and `record_errors`, as Kafka's `RecordValidationException` does.
    #[error("{message}")]
    RecordValidation {
        /// Whether a timestamp was wrong (INVALID_TIMESTAMP) or only other checks failed.
        invalid_timestamp: bool,
        /// Kafka's summary ("One or more records have been rejected due to ...").
        message: String,
        /// The records refused, in batch order.
        record_errors: Vec<RecordError>,
    },
    /// A file on disk is unreadable in a way recovery cannot repair (e.g. a bad checkpoint
    /// file): KAFKA_STORAGE_ERROR (56).
    #[error("corrupt file {path}: {reason}")]
    CorruptFile {
        /// The file.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// `partition.metadata` names another topic id than the one requested: INCONSISTENT_TOPIC_ID
    /// (103).
    #[error("partition {partition} has topic id {on_disk} on disk, but {requested} was requested")]
    InconsistentTopicId {
        /// The partition directory name.
        partition: String,
        /// Topic id in `partition.metadata` (base64url).
        on_disk: String,
        /// The requested topic id (base64url).
        requested: String,
    },
    /// The log was closed or its directory deleted: NOT_LEADER_OR_FOLLOWER (6), as Kafka
    /// answers for a partition that is going away.
    #[error("log {0} is closed")]
    Closed(String),
    /// The log directory is already locked by another process (Kafka's `.lock`):
    /// KAFKA_STORAGE_ERROR (56).
    #[error("log directory {0} is in use by another process")]
    DirLocked(String),
    /// The partition's log directory is offline: full (a write failed with ENOSPC or EDQUOT
    /// and no check has found room since) or failed (another I/O error). Appends fail at
    /// once with KAFKA_STORAGE_ERROR (56), which clients retry, instead of each trying the
    /// disk; see [`crate::LogDirHealth`].
    #[error("log directory {dir} is offline: {reason}")]
    LogDirOffline {
        /// The log directory.
        dir: String,
        /// Why ("full: No space left on device ...").
        reason: String,
    },
    /// A new partition's log could not be created ([`crate::LogManager::get_or_create`]):
    /// its directory, segment files or `partition.metadata` could not be written. What had
    /// been created of it was removed again. The code is that of `source`
    /// (KAFKA_STORAGE_ERROR for an I/O error).
    #[error("creating the log of {partition} in {dir}: {source}")]
    CreateLog {
        /// The partition (`<topic>-<index>`).
        partition: String,
        /// The log directory (an entry of `log.dirs`) it was to be created in.
        dir: String,
        /// What failed.
        #[source]
        source: Box<LogError>,
    },
    /// No log directory could be opened at start-up ([`crate::LogManager::open`]): each
    /// failed (KIP-112; Kafka halts the broker then). KAFKA_STORAGE_ERROR (56).
    #[error("every log directory failed: {0}")]
    NoLogDirOnline(String),
}

impl LogError {
    /// Builds an [`LogError::Io`] whose context names `what` and `path`.
    pub fn io(what: &str, path: &Path, source: io::Error) -> Self {
        LogError::Io {
            context: format!("{what} {}", path.display()),
            source,
        }
    }

    /// The Kafka error for this error (see the variant docs).
    pub fn error_code(&self) -> ErrorCode {
        match self {
            LogError::Io { .. }
            | LogError::CorruptFile { .. }
            | LogError::DirLocked(_)
            | LogError::LogDirOffline { .. }
            | LogError::NoLogDirOnline(_) => ErrorCode::KafkaStorageError,
            LogError::Batch(e) => match e {
                BatchError::Truncated { .. }
                | BatchError::Corrupt(_)
                | BatchError::CrcMismatch { .. } => ErrorCode::CorruptMessage,
                BatchError::UnsupportedMagic(_) | BatchError::Invalid(_) => {
                    ErrorCode::InvalidRecord
                }
            },
            LogError::MessageTooLarge { .. } => ErrorCode::MessageTooLarge,
            LogError::RecordListTooLarge { .. } => ErrorCode::RecordListTooLarge,
            LogError::OffsetOutOfRange { .. } => ErrorCode::OffsetOutOfRange,
            LogError::OutOfOrderSequence { .. } => ErrorCode::OutOfOrderSequenceNumber,
            LogError::InvalidProducerEpoch { .. } => ErrorCode::InvalidProducerEpoch,
            LogError::InvalidRecord(_) => ErrorCode::InvalidRecord,
            LogError::InvalidTxnState(_) => ErrorCode::InvalidTxnState,
            LogError::TransactionCoordinatorFenced(_) => ErrorCode::TransactionCoordinatorFenced,
            LogError::RecordValidation {
                invalid_timestamp: true,
                ..
            } => ErrorCode::InvalidTimestamp,
            LogError::RecordValidation { .. } => ErrorCode::InvalidRecord,
            LogError::InconsistentTopicId { .. } => ErrorCode::InconsistentTopicId,
            LogError::Closed(_) => ErrorCode::NotLeaderOrFollower,
            LogError::CreateLog { source, .. } => source.error_code(),
        }
    }

    /// Whether this is a write that failed for lack of space: ENOSPC (no space left on the
    /// device) or EDQUOT (disk quota exceeded). Such a failure heals once space is freed;
    /// any other I/O error is treated as a failed disk.
    pub fn is_out_of_space(&self) -> bool {
        match self {
            LogError::Io { source, .. } => is_out_of_space(source),
            LogError::CreateLog { source, .. } => source.is_out_of_space(),
            _ => false,
        }
    }

    /// Whether this is the process or the system running out of file descriptors (EMFILE,
    /// ENFILE): not a fault of the disk. An append that fails so fails alone; its log and its
    /// directory stay in service.
    pub fn is_out_of_descriptors(&self) -> bool {
        match self {
            LogError::Io { source, .. } => matches!(
                source.raw_os_error(),
                Some(code) if code == rustix::io::Errno::MFILE.raw_os_error()
                    || code == rustix::io::Errno::NFILE.raw_os_error()
            ),
            _ => false,
        }
    }

    /// Whether this I/O error belongs to the log directory (its file system) rather than to
    /// one file in it: EROFS (read-only file system), EIO (I/O error), ENODEV/ENXIO (the
    /// device is gone), ESTALE, EUCLEAN (a corrupt file system). A log whose creation fails so
    /// takes its directory offline ([`crate::LogDirHealth::record_write_error`]); one that
    /// fails with another error (ENOTDIR or EEXIST for something in the partition's path,
    /// EACCES on it) fails alone.
    pub fn is_dir_failure(&self) -> bool {
        match self {
            LogError::Io { source, .. } => matches!(
                source.raw_os_error(),
                Some(code) if [
                    rustix::io::Errno::ROFS,
                    rustix::io::Errno::IO,
                    rustix::io::Errno::NODEV,
                    rustix::io::Errno::NXIO,
                    rustix::io::Errno::STALE,
                    rustix::io::Errno::UCLEAN,
                ]
                .iter()
                .any(|e| e.raw_os_error() == code)
            ),
            LogError::CreateLog { source, .. } => source.is_dir_failure(),
            _ => false,
        }
    }

    /// The wire code of [`LogError::error_code`].
    pub fn kafka_error_code(&self) -> i16 {
        self.error_code().code()
    }
}

/// One record of a produced batch that failed validation (KIP-467, Kafka's
/// `ProduceResponse.RecordError`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordError {
    /// Position of the record in its batch, from 0.
    pub batch_index: i32,
    /// Why the record was refused.
    pub message: String,
}

/// Whether `e` is ENOSPC or EDQUOT ([`LogError::is_out_of_space`]).
pub fn is_out_of_space(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(code) if code == rustix::io::Errno::NOSPC.raw_os_error()
            || code == rustix::io::Errno::DQUOT.raw_os_error()
    ) || e.kind() == io::ErrorKind::StorageFull
        || e.kind() == io::ErrorKind::QuotaExceeded
}

/// Shorthand used throughout the crate.
pub type Result<T, E = LogError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_follow_kafka() {
        assert_eq!(
            LogError::Batch(BatchError::Corrupt("x".into())).kafka_error_code(),
            2
        );
        assert_eq!(
            LogError::Batch(BatchError::CrcMismatch {
                stored: 1,
                computed: 2
            })
            .kafka_error_code(),
            2
        );
        assert_eq!(
            LogError::Batch(BatchError::Invalid("x".into())).kafka_error_code(),
            87
        );
        assert_eq!(
            LogError::MessageTooLarge {
                size_bytes: 2,
                max_bytes: 1
            }
            .kafka_error_code(),
            10
        );
        assert_eq!(
            LogError::OffsetOutOfRange {
                offset: 5,
                log_start_offset: 0,
                log_end_offset: 1
            }
            .kafka_error_code(),
            1
        );
        assert_eq!(
            LogError::io("x", Path::new("/y"), io::Error::other("z")).kafka_error_code(),
            56
        );
    }
}
