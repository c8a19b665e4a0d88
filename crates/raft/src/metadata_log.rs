//! [`KafkaMetadataLog`]: the [`RaftLog`] of `<metadata.log.dir>/__cluster_metadata-0/` on
//! gregor-log segments, in Kafka's layout (Kafka's `KafkaMetadataLog` over `UnifiedLog`):
//! `<base offset>.log` with `.index` and `.timeindex`, `leader-epoch-checkpoint`,
//! `partition.metadata` (the fixed metadata topic id), and the KIP-630 snapshots
//! `<end offset>-<epoch>.checkpoint` ([`crate::snapshot`]).
//!
//! Appends are not fsynced: [`KafkaMetadataLog::flush`] completes the core's
//! [`crate::Action::FlushLog`] barrier, fsyncing the segments written since the last flush and,
//! after a truncation, the truncated segment and the directory. Opening always validates every
//! batch of every segment (CRC, offsets) and cuts a torn tail: the metadata log is small and a
//! vote must never be counted on a batch that is not there.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use gregor_log::{LogConfig, LogDirHealth, LogError, PartitionLog, TopicPartition};
use gregor_protocol::batch::{self, Batches};

use crate::log::{check_new_snapshot, LogAppendInfo, RaftLog, RaftLogError};
use crate::snapshot::{
    fold_quorum_records, parse_snapshot, parse_snapshot_file_name, read_first_batch, read_snapshot,
    snapshot_file_name, QuorumRecords, Snapshot, SnapshotError, SnapshotFileKind, SnapshotWriter,
    MAX_SNAPSHOT_BYTES, PARTIAL_SUFFIX, SNAPSHOT_RECORDS_PER_BATCH,
};
use crate::types::OffsetAndEpoch;

/// The metadata topic (`Topic.CLUSTER_METADATA_TOPIC_NAME`).
pub const METADATA_TOPIC: &str = "__cluster_metadata";
/// The metadata topic's id (`Uuid.METADATA_TOPIC_ID`, `Uuid(0, 1)`), as `partition.metadata`
/// spells it.
pub const METADATA_TOPIC_ID: &str = "AAAAAAAAAAAAAAAAAAAAAQ";
/// `partition.metadata`, which Kafka writes in `__cluster_metadata-0/` too.
pub const PARTITION_METADATA_FILE: &str = "partition.metadata";

/// Configuration of the metadata log, Kafka's property names and defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataLogConfig {
    /// `metadata.log.segment.bytes`: roll size of a segment. Default 1 GiB.
    pub segment_bytes: u64,
    /// `metadata.log.segment.ms`: roll age of a segment. Default 7 days.
    pub segment_ms: i64,
    /// Largest batch the quorum writes (`KafkaRaftClient.MAX_BATCH_SIZE_BYTES`, 8 MiB),
    /// the metadata log's `max.message.bytes`.
    pub max_batch_size_bytes: usize,
    /// `metadata.max.retention.bytes`: snapshots and the log before them are deleted, oldest
    /// first, while log plus snapshots are larger; the latest snapshot always stays. Default
    /// 100 MiB; below 1 no size limit.
    pub retention_max_bytes: i64,
    /// `metadata.max.retention.ms`: snapshots (and the log before the next one) older than
    /// this are deleted, the latest always stays. Default 7 days; below 1 no time limit.
    pub retention_ms: i64,
    /// `metadata.log.max.record.bytes.between.snapshots`: bytes of new records after which a
    /// snapshot is due. Default 20 MiB.
    pub max_record_bytes_between_snapshots: u64,
    /// `metadata.log.max.snapshot.interval.ms`: time after which a snapshot is due if anything
    /// was committed since the last one; 0 disables. Default 1 hour.
    pub max_snapshot_interval_ms: i64,
    /// `file.delete.delay.ms` for deleted segments (Kafka's log default, 60000).
    pub file_delete_delay_ms: i64,
}

impl Default for MetadataLogConfig {
    fn default() -> Self {
        Self {
            segment_bytes: 1024 * 1024 * 1024,
            segment_ms: 7 * 24 * 3600 * 1000,
            max_batch_size_bytes: 8 * 1024 * 1024,
            retention_max_bytes: 100 * 1024 * 1024,
            retention_ms: 7 * 24 * 3600 * 1000,
            max_record_bytes_between_snapshots: 20 * 1024 * 1024,
            max_snapshot_interval_ms: 3600 * 1000,
            file_delete_delay_ms: 60_000,
        }
    }
}

impl MetadataLogConfig {
    /// Whether the controller should write a snapshot now (Kafka's `SnapshotGenerator`):
    /// `bytes_since_last_snapshot` committed record bytes reached
    /// `metadata.log.max.record.bytes.between.snapshots`, or something was committed and
    /// `metadata.log.max.snapshot.interval.ms` passed since the last snapshot.
    pub fn snapshot_due(
        &self,
        bytes_since_last_snapshot: u64,
        ms_since_last_snapshot: i64,
    ) -> bool {
        bytes_since_last_snapshot >= self.max_record_bytes_between_snapshots
            || (self.max_snapshot_interval_ms > 0
                && bytes_since_last_snapshot > 0
                && ms_since_last_snapshot >= self.max_snapshot_interval_ms)
    }

    fn log_config(&self) -> LogConfig {
        LogConfig {
            segment_bytes: self.segment_bytes,
            segment_ms: self.segment_ms,
            max_message_bytes: self.max_batch_size_bytes,
            // KafkaMetadataLog does its own retention through snapshots.
            retention_ms: -1,
            retention_bytes: -1,
            file_delete_delay_ms: self.file_delete_delay_ms,
            ..LogConfig::default()
        }
    }
}

/// Errors opening or maintaining the metadata log directory.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The segmented log failed.
    #[error("metadata log {dir}: {source}")]
    Log {
        /// `__cluster_metadata-0/`.
        dir: PathBuf,
        /// The error.
        source: LogError,
    },
    /// A snapshot failed.
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    /// A file operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The directory is in a state gregor cannot use.
    #[error("metadata log {dir}: {reason}")]
    Inconsistent {
        /// `__cluster_metadata-0/`.
        dir: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// A snapshot known to the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SnapshotEntry {
    size_bytes: u64,
    last_contained_log_timestamp_ms: i64,
}

/// The KRaft metadata log on disk. See the module documentation.
#[derive(Debug)]
pub struct KafkaMetadataLog {
    dir: PathBuf,
    log: PartitionLog,
    config: MetadataLogConfig,
    high_watermark: i64,
    /// Complete snapshots by `(end offset, epoch)`.
    snapshots: BTreeMap<(i64, i32), SnapshotEntry>,
    /// The snapshot being fetched from the leader (`<id>.checkpoint.part`).
    pending: Option<PendingSnapshot>,
    /// The health of `metadata.log.dir` as the metadata log's writes find it: a write that
    /// fails for lack of space marks it full (appends then fail at once until a
    /// [`LogDirHealth::check`] finds room), any other failed write marks it failed.
    dir_health: std::sync::Arc<LogDirHealth>,
}

/// A snapshot being received in FetchSnapshot chunks.
#[derive(Debug)]
struct PendingSnapshot {
    id: OffsetAndEpoch,
    file: std::fs::File,
    path: PathBuf,
    size: u64,
}

fn log_err(dir: &Path) -> impl FnOnce(LogError) -> StorageError + '_ {
    move |source| StorageError::Log {
        dir: dir.to_path_buf(),
        source,
    }
}

fn to_raft(e: LogError) -> RaftLogError {
    match e {
        LogError::Batch(e) => RaftLogError::Corrupt(e.to_string()),
        LogError::InvalidRecord(m) => RaftLogError::Corrupt(m),
        other => RaftLogError::Io(other.to_string()),
    }
}

impl KafkaMetadataLog {
    /// The health of `metadata.log.dir` as this log's writes find it (shared: the broker
    /// reports it on `/ready` and checks a full one for room again).
    pub fn dir_health(&self) -> std::sync::Arc<LogDirHealth> {
        self.dir_health.clone()
    }

    /// The partition directory inside `metadata_log_dir`.
    pub fn partition_dir(metadata_log_dir: &Path) -> PathBuf {
        metadata_log_dir.join(format!("{METADATA_TOPIC}-0"))
    }

    /// Opens (creating if needed) `<metadata_log_dir>/__cluster_metadata-0/`: removes
    /// unfinished and deleted snapshots, opens and recovers the segments (cutting a torn
    /// tail), loads the epoch cache and lists the snapshots (each read and checked whole). The
    /// log start offset is 0 while the first segment starts at 0; otherwise it is the end
    /// offset of the oldest snapshot at or past the first segment's base offset, which must
    /// exist. When the log does not hold the latest snapshot's last record (a crash between
    /// completing a fetched snapshot and replacing the log with it) the log is replaced now
    /// ([`RaftLog::truncate_to_latest_snapshot`]).
    ///
    /// # Errors
    /// [`StorageError`] naming the file for I/O and corruption.
    pub fn open(metadata_log_dir: &Path, config: MetadataLogConfig) -> Result<Self, StorageError> {
        let dir = Self::partition_dir(metadata_log_dir);
        std::fs::create_dir_all(&dir).map_err(|source| StorageError::Io {
            op: "creating",
            path: dir.clone(),
            source,
        })?;
        let meta = dir.join(PARTITION_METADATA_FILE);
        if !meta.exists() {
            // As Kafka 4.4.0 writes it: no newline after the last line.
            let text = format!("version: 0\ntopic_id: {METADATA_TOPIC_ID}");
            write_durably(&meta, text.as_bytes())?;
        }
        let mut snapshots = BTreeMap::new();
        let rd = std::fs::read_dir(&dir).map_err(|source| StorageError::Io {
            op: "listing",
            path: dir.clone(),
            source,
        })?;
        for entry in rd {
            let entry = entry.map_err(|source| StorageError::Io {
                op: "listing",
                path: dir.clone(),
                source,
            })?;
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            match parse_snapshot_file_name(&name) {
                Some((_, SnapshotFileKind::Partial | SnapshotFileKind::Deleted)) => {
                    let p = entry.path();
                    std::fs::remove_file(&p).map_err(|source| StorageError::Io {
                        op: "removing",
                        path: p.clone(),
                        source,
                    })?;
                }
                Some((id, SnapshotFileKind::Complete)) => {
                    let s = read_snapshot(&entry.path())?;
                    snapshots.insert(
                        (id.offset, id.epoch),
                        SnapshotEntry {
                            size_bytes: s.size_bytes,
                            last_contained_log_timestamp_ms: s.last_contained_log_timestamp_ms,
                        },
                    );
                }
                None => {}
            }
        }
        let tp = TopicPartition::new(METADATA_TOPIC, 0);
        let log =
            PartitionLog::open(&dir, tp, config.log_config(), false).map_err(log_err(&dir))?;
        let dir_health = std::sync::Arc::new(LogDirHealth::for_metadata_log(metadata_log_dir));
        log.set_dir_health(dir_health.clone());
        let first_base = log.segment_base_offsets().first().copied().unwrap_or(0);
        if first_base > 0 {
            // Segments were deleted up to a snapshot: the log starts at the oldest snapshot
            // that covers what is missing.
            let start = snapshots
                .keys()
                .map(|&(o, _)| o)
                .find(|&o| o >= first_base)
                .ok_or_else(|| StorageError::Inconsistent {
                    dir: dir.clone(),
                    reason: format!(
                        "the first segment starts at {first_base} and no snapshot covers the \
                         offsets below it"
                    ),
                })?;
            log.maybe_increment_log_start_offset(start.min(log.log_end_offset()))
                .map_err(log_err(&dir))?;
        }
        let mut log = Self {
            dir,
            log,
            config,
            high_watermark: 0,
            snapshots,
            pending: None,
            dir_health,
        };
        // A follower that crashed after completing a fetched snapshot and before (durably)
        // replacing its log with it finishes here (Kafka's `KafkaMetadataLog.apply`).
        log.truncate_to_latest_snapshot()
            .map_err(|e| StorageError::Inconsistent {
                dir: log.dir.clone(),
                reason: format!("truncating to the latest snapshot: {e}"),
            })?;
        Ok(log)
    }

    /// `__cluster_metadata-0/`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The segmented log underneath (for tests and tools).
    pub fn partition_log(&self) -> &PartitionLog {
        &self.log
    }

    /// First offset readable from the log; below it, only the latest snapshot has the data.
    pub fn log_start_offset(&self) -> i64 {
        self.log.log_start_offset()
    }

    /// Completes a [`crate::Action::FlushLog`]: fsyncs what was appended since the last flush
    /// and any truncation since.
    ///
    /// # Errors
    /// [`RaftLogError::Io`]; the driver must then stop (Kafka takes the log dir offline).
    pub fn flush(&self) -> Result<(), RaftLogError> {
        self.log.flush().map_err(to_raft)
    }

    /// A clean shutdown (Kafka's `UnifiedLog.close`): flushes, trims the active segment's
    /// indexes and writes the producer state snapshot `<log end offset>.snapshot`, as Kafka
    /// leaves in `__cluster_metadata-0/`. Later appends fail.
    ///
    /// # Errors
    /// [`RaftLogError::Io`].
    pub fn close(&self) -> Result<(), RaftLogError> {
        self.log.close().map_err(to_raft)
    }

    /// Ids of the complete snapshots, oldest first.
    pub fn snapshot_ids(&self) -> Vec<OffsetAndEpoch> {
        self.snapshots
            .keys()
            .map(|&(o, e)| OffsetAndEpoch::new(o, e))
            .collect()
    }

    /// The newest snapshot's id (`latestSnapshotId`).
    pub fn latest_snapshot_id(&self) -> Option<OffsetAndEpoch> {
        self.snapshots
            .keys()
            .next_back()
            .map(|&(o, e)| OffsetAndEpoch::new(o, e))
    }

    /// Reads a snapshot whole.
    ///
    /// # Errors
    /// [`SnapshotError`] when it cannot be read or is corrupt.
    pub fn read_snapshot(&self, id: OffsetAndEpoch) -> Result<Snapshot, SnapshotError> {
        read_snapshot(&self.dir.join(snapshot_file_name(id)))
    }

    /// Starts a snapshot of the state up to `id.offset` (exclusive), which must be committed
    /// (at most the high watermark) and whose epoch must be the log's epoch at that offset
    /// (Kafka's `createNewSnapshot` checks). Call [`KafkaMetadataLog::add_snapshot`] with the
    /// frozen writer's id.
    ///
    /// # Errors
    /// [`StorageError::Inconsistent`] for an id the log does not allow,
    /// [`StorageError::Snapshot`] for I/O.
    pub fn create_snapshot(
        &self,
        id: OffsetAndEpoch,
        last_contained_log_timestamp_ms: i64,
        now_ms: i64,
    ) -> Result<SnapshotWriter, StorageError> {
        let bad = |reason: String| StorageError::Inconsistent {
            dir: self.dir.clone(),
            reason,
        };
        if id.offset > self.high_watermark || id.offset < self.log_start_offset() {
            return Err(bad(format!(
                "snapshot end offset {} is outside [log start {}, high watermark {}]",
                id.offset,
                self.log_start_offset(),
                self.high_watermark
            )));
        }
        if id.offset > 0 {
            let epoch_at = self.epoch_of_offset(id.offset - 1);
            if epoch_at != Some(id.epoch) {
                return Err(bad(format!(
                    "snapshot epoch {} is not the epoch {epoch_at:?} of offset {}",
                    id.epoch,
                    id.offset - 1
                )));
            }
        }
        let quorum = self.quorum_records_at(id.offset)?;
        Ok(SnapshotWriter::create(
            &self.dir,
            id,
            last_contained_log_timestamp_ms,
            &quorum.records(),
            now_ms,
        )?)
    }

    /// The KRaftVersion and KRaftVoters control records in force at `offset` (those of records
    /// below it; Kafka's `kraftVersionAtOffset`/`voterSetAtOffset`): the newest snapshot ending
    /// at or below `offset` gives the starting point, then the log's control batches from there
    /// up to `offset` are read (data batches are skipped undecoded). What a new snapshot ending
    /// at `offset` carries after its SnapshotHeader, so that a dynamic quorum (KIP-853) still
    /// knows its voters once older snapshots and segments are cleaned away.
    ///
    /// # Errors
    /// [`StorageError::Snapshot`] when the snapshot cannot be read, [`StorageError::Log`] or
    /// [`StorageError::Inconsistent`] when the log cannot be read or decoded.
    pub fn quorum_records_at(&self, offset: i64) -> Result<QuorumRecords, StorageError> {
        let bad = |reason: String| StorageError::Inconsistent {
            dir: self.dir.clone(),
            reason,
        };
        let mut state = QuorumRecords::default();
        let base = self
            .snapshots
            .keys()
            .rev()
            .find(|&&(o, _)| o <= offset)
            .map(|&(o, e)| OffsetAndEpoch::new(o, e));
        let mut from = self.log_start_offset();
        if let Some(id) = base {
            let first = read_first_batch(&self.dir.join(snapshot_file_name(id)))?;
            fold_quorum_records(&first, i64::MAX, &mut state)
                .map_err(|e| bad(format!("snapshot {id:?}: {e}")))?;
            from = from.max(id.offset);
        }
        const CHUNK: usize = 1 << 20;
        while from < offset.min(self.log.log_end_offset()) {
            let read = self
                .log
                .read(from, CHUNK, i64::MAX, true)
                .map_err(log_err(&self.dir))?
                .records;
            let mut next = from;
            for item in Batches::new(&read) {
                let (_, h) = item.map_err(|e| bad(format!("reading offset {from}: {e}")))?;
                next = h.next_offset();
            }
            if next <= from {
                break;
            }
            fold_quorum_records(&read, offset, &mut state)
                .map_err(|e| bad(format!("reading offset {from}: {e}")))?;
            from = next;
        }
        Ok(state)
    }

    /// Records a snapshot frozen by a [`SnapshotWriter`] from [`Self::create_snapshot`].
    ///
    /// # Errors
    /// [`SnapshotError`] when it cannot be read back.
    pub fn add_snapshot(&mut self, id: OffsetAndEpoch) -> Result<(), SnapshotError> {
        let s = self.read_snapshot(id)?;
        self.snapshots.insert(
            (id.offset, id.epoch),
            SnapshotEntry {
                size_bytes: s.size_bytes,
                last_contained_log_timestamp_ms: s.last_contained_log_timestamp_ms,
            },
        );
        Ok(())
    }

    /// The epoch cache `(epoch, start offset)` as Kafka's after `truncateFromStart(log start)`:
    /// entries wholly below the log start dropped, the one spanning it starting at it.
    /// (`leader-epoch-checkpoint` on disk may still list the older entries; they are ignored.)
    fn epoch_entries_from_start(&self) -> Vec<(i32, i64)> {
        let start = self.log.log_start_offset();
        let all = self.log.leader_epoch_entries();
        let mut out = Vec::with_capacity(all.len());
        for (i, e) in all.iter().enumerate() {
            if e.start_offset >= start {
                out.push((e.epoch, e.start_offset));
            } else if all.get(i + 1).is_none_or(|next| next.start_offset > start) {
                out.push((e.epoch, start));
            }
        }
        out
    }

    fn epoch_of_offset(&self, offset: i64) -> Option<i32> {
        self.log
            .leader_epoch_entries()
            .iter()
            .rev()
            .find(|e| e.start_offset <= offset)
            .map(|e| e.epoch)
    }

    /// Kafka's `KafkaMetadataLog.maybeClean`: walking the snapshots oldest first, while a
    /// snapshot is past `metadata.max.retention.ms` (by its `lastContainedLogTimestamp`) or
    /// log plus snapshots exceed `metadata.max.retention.bytes`, the log start offset moves to
    /// the next snapshot's end offset, the segments wholly below it are deleted (renamed
    /// `.deleted`, removed after `file.delete.delay.ms`) and the older snapshots are deleted.
    /// The latest snapshot is never deleted. Returns whether anything was cleaned.
    ///
    /// # Errors
    /// [`StorageError`] for I/O.
    pub fn maybe_clean(&mut self, now_ms: i64) -> Result<bool, StorageError> {
        let ids: Vec<(i64, i32)> = self.snapshots.keys().copied().collect();
        let mut total =
            self.log.size_in_bytes() + self.snapshots.values().map(|s| s.size_bytes).sum::<u64>();
        let mut clean_to = None;
        for pair in ids.windows(2) {
            let (old, next) = (pair[0], pair[1]);
            let entry = self.snapshots[&old];
            let expired = self.config.retention_ms >= 1
                && now_ms.saturating_sub(entry.last_contained_log_timestamp_ms)
                    > self.config.retention_ms;
            let too_big = self.config.retention_max_bytes >= 1
                && total > u64::try_from(self.config.retention_max_bytes).unwrap_or(u64::MAX);
            if !(expired || too_big) {
                break;
            }
            total = total.saturating_sub(entry.size_bytes);
            clean_to = Some(next);
        }
        let Some(next) = clean_to else {
            return Ok(false);
        };
        self.delete_before_snapshot(OffsetAndEpoch::new(next.0, next.1), now_ms)
    }

    /// Moves the log start offset to `id.offset` (a snapshot this log has), deletes the
    /// segments wholly below it and the snapshots older than `id` (Kafka's
    /// `deleteBeforeSnapshot`). Returns whether the log start offset moved.
    ///
    /// # Errors
    /// [`StorageError`] for I/O.
    pub fn delete_before_snapshot(
        &mut self,
        id: OffsetAndEpoch,
        now_ms: i64,
    ) -> Result<bool, StorageError> {
        if !self.snapshots.contains_key(&(id.offset, id.epoch))
            || id.offset <= self.log_start_offset()
            || id.offset > self.log.log_end_offset()
        {
            return Ok(false);
        }
        let dir = self.dir.clone();
        self.log
            .maybe_increment_log_start_offset(id.offset)
            .map_err(log_err(&dir))?;
        self.log
            .delete_old_segments(now_ms, self.high_watermark.max(id.offset))
            .map_err(log_err(&dir))?;
        let older: Vec<_> = self
            .snapshots
            .range(..(id.offset, id.epoch))
            .map(|(k, _)| *k)
            .collect();
        for k in older {
            let path = self
                .dir
                .join(snapshot_file_name(OffsetAndEpoch::new(k.0, k.1)));
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(StorageError::Io {
                        op: "deleting snapshot",
                        path,
                        source,
                    })
                }
            }
            self.snapshots.remove(&k);
        }
        crate::snapshot::sync_dir(&self.dir)?;
        tracing::info!(
            log_start_offset = id.offset,
            "metadata log cleaned up to a snapshot"
        );
        Ok(true)
    }

    /// Removes segment files whose `file.delete.delay.ms` has passed; call it on a timer.
    pub fn delete_due_files(&self, now_ms: i64) -> usize {
        self.log.delete_due_files(now_ms)
    }

    /// Kafka's `truncateFullyAndStartAt`: deletes every segment (newest first, so that a crash
    /// part way leaves a prefix of the log, which [`KafkaMetadataLog::open`] then replaces), the
    /// producer snapshots and the epoch cache, creates an empty segment at `offset` and opens
    /// the log again: log start = log end = `offset`.
    fn truncate_fully_and_start_at(&mut self, offset: i64) -> Result<(), RaftLogError> {
        let io = |op: &str, p: &Path, e: std::io::Error| {
            RaftLogError::Io(format!("{op} {}: {e}", p.display()))
        };
        let mut files: Vec<(i64, PathBuf)> = Vec::new();
        let rd = std::fs::read_dir(&self.dir).map_err(|e| io("listing", &self.dir, e))?;
        for entry in rd {
            let entry = entry.map_err(|e| io("listing", &self.dir, e))?;
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            if name == "leader-epoch-checkpoint" {
                files.push((i64::MIN, entry.path()));
                continue;
            }
            let Some((stem, ext)) = name.split_once('.') else {
                continue;
            };
            let is_log_file = matches!(
                ext,
                "log"
                    | "index"
                    | "timeindex"
                    | "txnindex"
                    | "snapshot"
                    | "log.deleted"
                    | "index.deleted"
                    | "timeindex.deleted"
                    | "txnindex.deleted"
            );
            if stem.len() == 20 && stem.bytes().all(|b| b.is_ascii_digit()) && is_log_file {
                files.push((stem.parse().unwrap_or(i64::MAX), entry.path()));
            }
        }
        // Newest first; the epoch cache last.
        files.sort_by_key(|f| std::cmp::Reverse(f.0));
        for (_, path) in &files {
            match std::fs::remove_file(path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io("deleting", path, e)),
            }
        }
        let segment = self.dir.join(format!("{offset:020}.log"));
        std::fs::File::create(&segment)
            .and_then(|f| f.sync_all())
            .map_err(|e| io("creating", &segment, e))?;
        crate::snapshot::sync_dir(&self.dir).map_err(|e| RaftLogError::Io(e.to_string()))?;
        let tp = TopicPartition::new(METADATA_TOPIC, 0);
        self.log =
            PartitionLog::open(&self.dir, tp, self.config.log_config(), false).map_err(to_raft)?;
        self.log.set_dir_health(self.dir_health.clone());
        if self.log.log_start_offset() != offset || self.log.log_end_offset() != offset {
            return Err(RaftLogError::Io(format!(
                "the log reopened at [{}, {}) after starting it at {offset}",
                self.log.log_start_offset(),
                self.log.log_end_offset()
            )));
        }
        Ok(())
    }

    fn remove_pending(&mut self) {
        if let Some(p) = self.pending.take() {
            drop(p.file);
            if let Err(e) = std::fs::remove_file(&p.path) {
                tracing::warn!(path = %p.path.display(), error = %e, "removing an abandoned snapshot");
            }
        }
    }

    fn headers(records: &Bytes) -> Result<Vec<batch::BatchHeader>, RaftLogError> {
        let mut out = Vec::new();
        for item in Batches::new(records) {
            let (at, _) = item.map_err(|e| RaftLogError::Corrupt(e.to_string()))?;
            out.push(
                batch::validate_batch(&records[at..])
                    .map_err(|e| RaftLogError::Corrupt(e.to_string()))?,
            );
        }
        Ok(out)
    }

    fn check_follows(
        &self,
        headers: &[batch::BatchHeader],
        total_len: usize,
    ) -> Result<(), RaftLogError> {
        let mut next = self.log_end_offset();
        let mut latest_epoch = self.last_fetched_epoch();
        let mut len = 0;
        for h in headers {
            if h.base_offset != next {
                return Err(RaftLogError::NonContiguous {
                    base_offset: h.base_offset,
                    log_end_offset: next,
                });
            }
            if h.partition_leader_epoch < latest_epoch || h.partition_leader_epoch < 0 {
                return Err(RaftLogError::EpochRegression {
                    epoch: h.partition_leader_epoch,
                    latest_epoch,
                });
            }
            next = h.next_offset();
            latest_epoch = h.partition_leader_epoch;
            len += h.total_size();
        }
        if headers.is_empty() {
            return Err(RaftLogError::Corrupt("no record batch".into()));
        }
        if len != total_len {
            return Err(RaftLogError::Corrupt(format!(
                "{} trailing bytes after the batches",
                total_len - len
            )));
        }
        Ok(())
    }

    fn append(&mut self, records: &Bytes) -> Result<LogAppendInfo, RaftLogError> {
        let info = self
            .log
            .append_as_follower(records, self.log.now_ms())
            .map_err(to_raft)?;
        Ok(LogAppendInfo {
            first_offset: info.first_offset,
            last_offset: info.last_offset,
        })
    }
}

/// Writes `contents` to `path` through `path.tmp`, fsync, rename, fsync of the directory.
pub(crate) fn write_durably(path: &Path, contents: &[u8]) -> Result<(), StorageError> {
    use std::io::Write;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let io = |op: &'static str, p: &Path| {
        let p = p.to_path_buf();
        move |source| StorageError::Io {
            op,
            path: p,
            source,
        }
    };
    let mut f = std::fs::File::create(&tmp).map_err(io("creating", &tmp))?;
    f.write_all(contents).map_err(io("writing", &tmp))?;
    f.sync_all().map_err(io("syncing", &tmp))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(io("renaming into place", path))?;
    if let Some(parent) = path.parent() {
        crate::snapshot::sync_dir(parent)?;
    }
    Ok(())
}

impl RaftLog for KafkaMetadataLog {
    fn log_end_offset(&self) -> i64 {
        self.log.log_end_offset()
    }

    fn last_fetched_epoch(&self) -> i32 {
        match self.log.latest_leader_epoch() {
            Some(e) => e,
            None => self.latest_snapshot_id().map_or(0, |s| s.epoch),
        }
    }

    fn end_offset_for_epoch(&self, epoch: i32) -> OffsetAndEpoch {
        let leo = self.log_end_offset();
        let epochs = self.epoch_entries_from_start();
        let Some(&(latest, _)) = epochs.last() else {
            return OffsetAndEpoch::new(leo, self.last_fetched_epoch());
        };
        if epoch == latest {
            return OffsetAndEpoch::new(leo, epoch);
        }
        let higher = epochs.partition_point(|&(e, _)| e <= epoch);
        if higher >= epochs.len() {
            return OffsetAndEpoch::new(leo, latest);
        }
        let higher_start = epochs[higher].1;
        if higher == 0 {
            OffsetAndEpoch::new(higher_start, epoch)
        } else {
            OffsetAndEpoch::new(higher_start, epochs[higher - 1].0)
        }
    }

    fn read(&self, from: i64, max_bytes: usize) -> Result<Bytes, RaftLogError> {
        if from >= self.log_end_offset() {
            return Ok(Bytes::new());
        }
        if from < self.log_start_offset() {
            return Err(RaftLogError::BelowLogStartOffset {
                offset: from,
                log_start_offset: self.log_start_offset(),
            });
        }
        self.log
            .read(from, max_bytes, i64::MAX, true)
            .map(|r| r.records)
            .map_err(to_raft)
    }

    fn high_watermark(&self) -> i64 {
        self.high_watermark
    }

    fn update_high_watermark(&mut self, high_watermark: i64) {
        self.high_watermark = self.high_watermark.max(high_watermark);
    }

    fn append_as_leader(
        &mut self,
        batch: Bytes,
        epoch: i32,
    ) -> Result<LogAppendInfo, RaftLogError> {
        let headers = Self::headers(&batch)?;
        if let Some(h) = headers.iter().find(|h| h.partition_leader_epoch != epoch) {
            return Err(RaftLogError::Corrupt(format!(
                "batch epoch {} is not the leader epoch {epoch}",
                h.partition_leader_epoch
            )));
        }
        self.check_follows(&headers, batch.len())?;
        self.append(&batch)
    }

    fn append_as_follower(&mut self, records: &Bytes) -> Result<LogAppendInfo, RaftLogError> {
        let headers = Self::headers(records)?;
        self.check_follows(&headers, records.len())?;
        self.append(records)
    }

    fn truncate_to(&mut self, offset: i64) -> Result<i64, RaftLogError> {
        if offset < self.high_watermark {
            return Err(RaftLogError::BelowHighWatermark {
                offset,
                high_watermark: self.high_watermark,
            });
        }
        self.log.truncate_to(offset).map_err(to_raft)
    }

    fn log_start_offset(&self) -> i64 {
        self.log.log_start_offset()
    }

    fn latest_snapshot_id(&self) -> Option<OffsetAndEpoch> {
        KafkaMetadataLog::latest_snapshot_id(self)
    }

    fn earliest_snapshot_id(&self) -> Option<OffsetAndEpoch> {
        self.snapshots
            .keys()
            .next()
            .map(|&(o, e)| OffsetAndEpoch::new(o, e))
    }

    fn snapshot_size(&self, id: OffsetAndEpoch) -> Option<u64> {
        self.snapshots
            .get(&(id.offset, id.epoch))
            .map(|s| s.size_bytes)
    }

    fn read_snapshot_chunk(
        &self,
        id: OffsetAndEpoch,
        position: u64,
        max_bytes: usize,
    ) -> Result<Bytes, RaftLogError> {
        use std::io::{Read, Seek, SeekFrom};
        let Some(entry) = self.snapshots.get(&(id.offset, id.epoch)) else {
            return Err(RaftLogError::SnapshotNotFound(id));
        };
        let len = entry
            .size_bytes
            .saturating_sub(position)
            .min(max_bytes as u64);
        let path = self.dir.join(snapshot_file_name(id));
        let io = |e: std::io::Error| RaftLogError::Io(format!("reading {}: {e}", path.display()));
        let mut f = std::fs::File::open(&path).map_err(io)?;
        f.seek(SeekFrom::Start(position)).map_err(io)?;
        // `len` is at most the snapshot's size, itself at most MAX_SNAPSHOT_BYTES (checked when
        // it was listed or written).
        let mut buf = vec![0u8; usize::try_from(len).unwrap_or(0)];
        f.read_exact(&mut buf).map_err(io)?;
        Ok(Bytes::from(buf))
    }

    fn read_snapshot(&self, id: OffsetAndEpoch) -> Result<Snapshot, RaftLogError> {
        if !self.snapshots.contains_key(&(id.offset, id.epoch)) {
            return Err(RaftLogError::SnapshotNotFound(id));
        }
        KafkaMetadataLog::read_snapshot(self, id).map_err(|e| RaftLogError::Corrupt(e.to_string()))
    }

    fn write_snapshot(
        &mut self,
        id: OffsetAndEpoch,
        values: &[Bytes],
        now_ms: i64,
    ) -> Result<(), RaftLogError> {
        if self.snapshots.contains_key(&(id.offset, id.epoch)) {
            return Ok(());
        }
        let epoch_before = if id.offset > 0 && id.offset == self.log_start_offset() {
            self.snapshots
                .keys()
                .find(|&&(o, _)| o == id.offset)
                .map(|&(_, e)| e)
        } else {
            self.epoch_of_offset(id.offset - 1)
        };
        check_new_snapshot(
            id,
            self.log_start_offset(),
            self.high_watermark,
            epoch_before,
        )?;
        let io = |e: SnapshotError| RaftLogError::Io(e.to_string());
        let quorum = self
            .quorum_records_at(id.offset)
            .map_err(|e| RaftLogError::Io(e.to_string()))?;
        let mut w =
            SnapshotWriter::create(&self.dir, id, now_ms, &quorum.records(), now_ms).map_err(io)?;
        for chunk in values.chunks(SNAPSHOT_RECORDS_PER_BATCH) {
            w.append(chunk, now_ms).map_err(io)?;
        }
        w.freeze(now_ms).map_err(io)?;
        self.add_snapshot(id).map_err(io)
    }

    fn delete_before(&mut self, id: OffsetAndEpoch, now_ms: i64) -> Result<bool, RaftLogError> {
        self.delete_before_snapshot(id, now_ms)
            .map_err(|e| RaftLogError::Io(e.to_string()))
    }

    fn begin_fetched_snapshot(&mut self, id: OffsetAndEpoch) -> Result<bool, RaftLogError> {
        self.remove_pending();
        if self.snapshots.contains_key(&(id.offset, id.epoch)) {
            return Ok(false);
        }
        let path = self.dir.join(format!(
            "{:020}-{:010}{PARTIAL_SUFFIX}",
            id.offset, id.epoch
        ));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(|e| RaftLogError::Io(format!("creating {}: {e}", path.display())))?;
        self.pending = Some(PendingSnapshot {
            id,
            file,
            path,
            size: 0,
        });
        Ok(true)
    }

    fn fetched_snapshot(&self) -> Option<(OffsetAndEpoch, u64)> {
        self.pending.as_ref().map(|p| (p.id, p.size))
    }

    fn append_fetched_snapshot(&mut self, chunk: &[u8]) -> Result<u64, RaftLogError> {
        use std::io::Write;
        let Some(p) = self.pending.as_mut() else {
            return Err(RaftLogError::InvalidSnapshot {
                id: OffsetAndEpoch::new(-1, -1),
                reason: "no snapshot is being fetched".into(),
            });
        };
        let size = p.size + chunk.len() as u64;
        if size > MAX_SNAPSHOT_BYTES {
            return Err(RaftLogError::InvalidSnapshot {
                id: p.id,
                reason: format!("larger than {MAX_SNAPSHOT_BYTES} bytes"),
            });
        }
        p.file
            .write_all(chunk)
            .map_err(|e| RaftLogError::Io(format!("writing {}: {e}", p.path.display())))?;
        p.size = size;
        Ok(size)
    }

    fn abort_fetched_snapshot(&mut self) {
        self.remove_pending();
    }

    fn complete_fetched_snapshot(&mut self) -> Result<OffsetAndEpoch, RaftLogError> {
        let Some(p) = self.pending.take() else {
            return Err(RaftLogError::InvalidSnapshot {
                id: OffsetAndEpoch::new(-1, -1),
                reason: "no snapshot is being fetched".into(),
            });
        };
        let id = p.id;
        let final_path = self.dir.join(snapshot_file_name(id));
        let checked = p
            .file
            .sync_all()
            .map_err(|e| RaftLogError::Io(format!("syncing {}: {e}", p.path.display())))
            .and_then(|()| {
                // Checked whole before it is renamed into place (at most MAX_SNAPSHOT_BYTES:
                // every append checked the size).
                let buf = std::fs::read(&p.path)
                    .map_err(|e| RaftLogError::Io(format!("reading {}: {e}", p.path.display())))?;
                parse_snapshot(id, Bytes::from(buf), &p.path).map_err(|e| {
                    RaftLogError::InvalidSnapshot {
                        id,
                        reason: e.to_string(),
                    }
                })
            });
        drop(p.file);
        let snapshot = match checked {
            Ok(s) => s,
            Err(e) => {
                if let Err(rm) = std::fs::remove_file(&p.path) {
                    tracing::warn!(path = %p.path.display(), error = %rm, "removing a bad fetched snapshot");
                }
                return Err(e);
            }
        };
        std::fs::rename(&p.path, &final_path)
            .map_err(|e| RaftLogError::Io(format!("renaming {}: {e}", final_path.display())))?;
        crate::snapshot::sync_dir(&self.dir).map_err(|e| RaftLogError::Io(e.to_string()))?;
        self.snapshots.insert(
            (id.offset, id.epoch),
            SnapshotEntry {
                size_bytes: snapshot.size_bytes,
                last_contained_log_timestamp_ms: snapshot.last_contained_log_timestamp_ms,
            },
        );
        Ok(id)
    }

    fn truncate_to_latest_snapshot(&mut self) -> Result<bool, RaftLogError> {
        let Some(id) = KafkaMetadataLog::latest_snapshot_id(self) else {
            return Ok(false);
        };
        if id.offset <= self.log.log_start_offset()
            || (id.offset <= self.log.log_end_offset()
                && self.epoch_of_offset(id.offset - 1) == Some(id.epoch))
        {
            return Ok(false);
        }
        self.truncate_fully_and_start_at(id.offset)?;
        let older: Vec<(i64, i32)> = self
            .snapshots
            .range(..(id.offset, id.epoch))
            .map(|(k, _)| *k)
            .collect();
        for k in older {
            let path = self
                .dir
                .join(snapshot_file_name(OffsetAndEpoch::new(k.0, k.1)));
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(RaftLogError::Io(format!(
                        "deleting {}: {e}",
                        path.display()
                    )))
                }
            }
            self.snapshots.remove(&k);
        }
        crate::snapshot::sync_dir(&self.dir).map_err(|e| RaftLogError::Io(e.to_string()))?;
        tracing::info!(snapshot = ?id, "metadata log fully truncated to a fetched snapshot");
        Ok(true)
    }
}
