//! gregor-log: Kafka's partition log with Kafka's on-disk layout.
//!
//! This crate owns everything under `log.dirs`: segments (`<base offset>.log` with their
//! `.index` and `.timeindex`), the partition log that appends, reads, rolls and recovers them
//! ([`PartitionLog`], Kafka's `UnifiedLog`), idempotent-producer state and its snapshots
//! (`ProducerStateManager`), the leader epoch cache (`leader-epoch-checkpoint`), and the
//! [`LogManager`] that loads every partition of every log directory, applies the flush policy
//! and writes the clean-shutdown marker. It stores record batches exactly as produced (after
//! patching base offset, partition leader epoch and LogAppendTime), so `kafka-dump-log` reads its
//! segments. Transactions (KIP-98): producer state tracks each producer's open transaction,
//! the last stable offset follows from it ([`PartitionLog::last_stable_offset`]), markers are
//! appended by [`PartitionLog::append_txn_marker`], and each segment's `.txnindex` lists the
//! aborted transactions whose marker it holds ([`PartitionLog::collect_aborted_transactions`]).
//! [`PartitionLog::append_as_follower`] and [`PartitionLog::truncate_to`] serve a
//! replica that copies a leader's batches as they are (gregor-raft's `__cluster_metadata-0`).
//! It never touches the network and knows nothing of requests, replicas or the
//! high watermark beyond the bounds callers pass in.

#![deny(missing_docs)]

mod checkpoint;
mod cleaner;
pub mod clock;
mod config;
mod epoch;
mod error;
pub mod files;
mod health;
mod index;
pub mod index_cache;
mod log;
mod manager;
mod producer_state;
mod rebuild;
mod segment;
mod timestamps;
mod txn_index;

pub use cleaner::{CleanStats, Cleanability, CleanerConfig, LogCleaner, OFFSET_MAP_ENTRY_BYTES};
pub use clock::{Clock, ManualClock, SharedClock, SystemClock};
pub use config::{LogConfig, TimestampType, TopicPartition};
pub use epoch::EpochEntry;
pub use error::{is_out_of_space, LogError, RecordError, Result};
pub use health::{DirState, LogDirHealth, MIN_FREE_BYTES_TO_RESUME, PROBE_BYTES};
pub use log::{
    AppendInfo, DeletionReason, FetchReadInfo, FetchRecords, FileSlice, LoadStats, PartitionLog,
    ReadInfo, RetentionResult, TimestampAndOffset,
};
pub use manager::{
    lock_dir, read_clean_shutdown_broker_epoch, topic_id_from_string, topic_id_to_string, DirLock,
    LogManager, CLEANER_OFFSET_CHECKPOINT, CLEAN_SHUTDOWN_FILE, LOG_START_OFFSET_CHECKPOINT,
    PARTITION_METADATA_FILE, RECOVERY_POINT_CHECKPOINT, REPLICATION_OFFSET_CHECKPOINT,
};
pub use producer_state::{AppendOrigin, ProducerSummary, VerificationGuard};
pub use txn_index::{AbortedTxn, ABORTED_TXN_BYTES};
