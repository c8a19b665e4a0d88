//! The replicated log as the core sees it ([`RaftLog`], Kafka's `ReplicatedLog`) and an
//! in-memory implementation for tests and the simulator ([`MemoryLog`]).
//!
//! The log holds Kafka v2 record batches whose `partitionLeaderEpoch` is the epoch of the leader
//! that appended them, so the epoch of every offset is known (the leader epoch cache of
//! `leader-epoch-checkpoint`). The core writes through this trait (leader appends, follower
//! appends, truncation), as Kafka's `KafkaRaftClient` does on its poll thread, and reads its own
//! writes at once. Durability is separate: the core asks for it with
//! [`crate::Action::FlushLog`], which the driver completes before anything after it, and a
//! crash may lose whatever was appended and not flushed. The implementation on gregor-log
//! segments (`__cluster_metadata-0`) is [`crate::KafkaMetadataLog`]; both pass the same
//! contract tests (`tests/metadata_log.rs`).

use std::collections::BTreeMap;
use std::path::Path;

use bytes::{Bytes, BytesMut};
use gregor_protocol::batch::{self, BatchHeader, Batches};

use crate::rng::Rng;
use crate::snapshot::{
    encode_snapshot, parse_snapshot, snapshot_file_name, Snapshot, MAX_SNAPSHOT_BYTES,
};
use crate::types::OffsetAndEpoch;

/// Errors from a [`RaftLog`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RaftLogError {
    /// Records that are not well-formed v2 batches (CRC, lengths, magic).
    #[error("corrupt record batch: {0}")]
    Corrupt(String),
    /// Records that do not start at the log end offset or whose offsets are not contiguous.
    #[error("batch at offset {base_offset} does not follow the log end offset {log_end_offset}")]
    NonContiguous {
        /// First offset of the offending batch.
        base_offset: i64,
        /// The log end offset it should have started at.
        log_end_offset: i64,
    },
    /// A batch whose leader epoch is lower than the log's latest epoch.
    #[error("batch epoch {epoch} is lower than the latest epoch {latest_epoch} of the log")]
    EpochRegression {
        /// The batch's epoch.
        epoch: i32,
        /// The log's latest epoch.
        latest_epoch: i32,
    },
    /// A truncation below the high watermark: committed records would be lost.
    #[error("refusing to truncate to {offset}, below the high watermark {high_watermark}")]
    BelowHighWatermark {
        /// Requested truncation offset.
        offset: i64,
        /// The current high watermark.
        high_watermark: i64,
    },
    /// A read or truncation below the log start offset: what was there is only in the
    /// snapshot at the log start (Kafka answers such a Fetch with the SnapshotId to fetch).
    #[error(
        "offset {offset} is below the log start offset {log_start_offset}; only a snapshot has it"
    )]
    BelowLogStartOffset {
        /// The offset asked for.
        offset: i64,
        /// The log start offset.
        log_start_offset: i64,
    },
    /// An I/O error of the underlying storage.
    #[error("log i/o error: {0}")]
    Io(String),
    /// The log has no snapshot with this id.
    #[error("no snapshot {0:?}")]
    SnapshotNotFound(OffsetAndEpoch),
    /// A snapshot the log does not allow: not committed, not at an offset of the log, an epoch
    /// that is not the log's at that offset, a fetched snapshot that is corrupt, too large, or
    /// not the one being fetched (KIP-630's checks of `createNewSnapshot` and of a fetch).
    #[error("invalid snapshot {id:?}: {reason}")]
    InvalidSnapshot {
        /// The snapshot id.
        id: OffsetAndEpoch,
        /// What is wrong.
        reason: String,
    },
}

/// Offsets of an append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogAppendInfo {
    /// First offset appended.
    pub first_offset: i64,
    /// Last offset appended.
    pub last_offset: i64,
}

/// The log the quorum replicates (`__cluster_metadata-0`), as Kafka's `ReplicatedLog`, with
/// its KIP-630 snapshots: a snapshot `(end offset, epoch)` holds the state of everything below
/// its end offset. Once the state machine above has written one ([`RaftLog::write_snapshot`])
/// the log before it may go ([`RaftLog::delete_before`]): the log start offset moves to the
/// snapshot's end offset and reads below it fail with [`RaftLogError::BelowLogStartOffset`]. A
/// follower behind the leader's log start fetches the leader's latest snapshot in chunks
/// (FetchSnapshot) into a pending snapshot ([`RaftLog::begin_fetched_snapshot`]), and once it
/// is complete replaces its log with it ([`RaftLog::truncate_to_latest_snapshot`]).
///
/// Snapshot writes are durable when they return (a snapshot file is fsynced before it is
/// renamed into place); so are the log start moves of `delete_before` and the full truncation
/// of `truncate_to_latest_snapshot` (a crash in between is repaired when the log is opened).
pub trait RaftLog {
    /// The offset the next record will get (LEO).
    fn log_end_offset(&self) -> i64;

    /// The epoch of the last batch, 0 for an empty log (Kafka's `lastFetchedEpoch`).
    fn last_fetched_epoch(&self) -> i32;

    /// `(log end offset, last fetched epoch)`, what a voter compares candidates' logs with.
    fn end_offset(&self) -> OffsetAndEpoch {
        OffsetAndEpoch::new(self.log_end_offset(), self.last_fetched_epoch())
    }

    /// Kafka's `ReplicatedLog.endOffsetForEpoch`: the largest epoch `<= epoch` in the log and
    /// the offset where it ends (the start of the next epoch, or the LEO for the latest epoch).
    /// An epoch below every epoch in the log gives `(epoch, start of the first epoch)`; an
    /// epoch above the latest, or an empty log, gives `(LEO, last fetched epoch)`.
    fn end_offset_for_epoch(&self, epoch: i32) -> OffsetAndEpoch;

    /// Whole batches starting with the one that contains `from`, up to `max_bytes` (the first
    /// batch is returned whole even when larger, KIP-74). Empty at or past the LEO.
    ///
    /// # Errors
    /// [`RaftLogError::Io`] when the storage fails.
    fn read(&self, from: i64, max_bytes: usize) -> Result<Bytes, RaftLogError>;

    /// The high watermark the log was last told (0 after start: it is not persisted, as in
    /// Kafka's metadata log).
    fn high_watermark(&self) -> i64;

    /// Records a new high watermark (only ever raised by the core).
    fn update_high_watermark(&mut self, high_watermark: i64);

    /// Appends one batch built by the leader at the LEO, with `partitionLeaderEpoch` = `epoch`.
    ///
    /// # Errors
    /// [`RaftLogError::NonContiguous`], [`RaftLogError::EpochRegression`],
    /// [`RaftLogError::Corrupt`] or [`RaftLogError::Io`]; nothing is appended then.
    fn append_as_leader(&mut self, batch: Bytes, epoch: i32)
        -> Result<LogAppendInfo, RaftLogError>;

    /// Appends the batches of a Fetch response. They must start at the LEO, be contiguous, be
    /// valid v2 batches and carry non-decreasing epochs; otherwise nothing is appended.
    ///
    /// # Errors
    /// As [`RaftLog::append_as_leader`].
    fn append_as_follower(&mut self, records: &Bytes) -> Result<LogAppendInfo, RaftLogError>;

    /// Removes every batch holding an offset `>= offset` (a batch containing `offset` goes
    /// whole, as Kafka's `LogSegment.truncateTo`). Returns the new LEO. The truncation must be
    /// durable once a later [`crate::Action::FlushLog`] completes (fsync after the truncate,
    /// as Kafka's `FileChannel.force(true)` after `truncateTo`); before that a crash may undo it.
    ///
    /// # Errors
    /// [`RaftLogError::BelowHighWatermark`] when `offset` is below the high watermark.
    fn truncate_to(&mut self, offset: i64) -> Result<i64, RaftLogError>;

    /// The first offset the log holds records for (Kafka's `startOffset`): 0, or the end offset
    /// of the snapshot the log was last cleaned or fully truncated to.
    fn log_start_offset(&self) -> i64;

    /// The newest complete snapshot (`latestSnapshotId`), if any.
    fn latest_snapshot_id(&self) -> Option<OffsetAndEpoch>;

    /// The oldest complete snapshot (`earliestSnapshotId`), if any; when the log start offset is
    /// past 0 it is the snapshot at the log start.
    fn earliest_snapshot_id(&self) -> Option<OffsetAndEpoch>;

    /// The size in bytes of snapshot `id`, `None` when the log has no such complete snapshot.
    fn snapshot_size(&self, id: OffsetAndEpoch) -> Option<u64>;

    /// Up to `max_bytes` bytes of snapshot `id` from byte `position` (a FetchSnapshot chunk:
    /// raw file bytes, not aligned to batches). Empty at or past the end.
    ///
    /// # Errors
    /// [`RaftLogError::SnapshotNotFound`], [`RaftLogError::Io`].
    fn read_snapshot_chunk(
        &self,
        id: OffsetAndEpoch,
        position: u64,
        max_bytes: usize,
    ) -> Result<Bytes, RaftLogError>;

    /// Reads and checks snapshot `id` whole (SnapshotHeader, batches, SnapshotFooter), for the
    /// state machine to load its state from.
    ///
    /// # Errors
    /// [`RaftLogError::SnapshotNotFound`], [`RaftLogError::Corrupt`], [`RaftLogError::Io`].
    fn read_snapshot(&self, id: OffsetAndEpoch) -> Result<Snapshot, RaftLogError>;

    /// The state machine's snapshot of everything below `id.offset`: `values` as records in
    /// KIP-630 framing, epoch `id.epoch`. `id.offset` must be in `[log start, high watermark]`
    /// and `id.epoch` the epoch of the record at `id.offset - 1` (Kafka's `createNewSnapshot`
    /// checks; at the log start, the epoch of the snapshot there). Writing a snapshot the log
    /// already has does nothing. `now_ms` stamps the batches and is also taken as the
    /// SnapshotHeader's `lastContainedLogTimestamp` (which `metadata.max.retention.ms` reads):
    /// a snapshot written soon after its records were committed, as Kafka's controller does.
    ///
    /// # Errors
    /// [`RaftLogError::InvalidSnapshot`] for an id the log does not allow, [`RaftLogError::Io`].
    fn write_snapshot(
        &mut self,
        id: OffsetAndEpoch,
        values: &[Bytes],
        now_ms: i64,
    ) -> Result<(), RaftLogError>;

    /// Kafka's `deleteBeforeSnapshot`: moves the log start offset to `id.offset` (a snapshot
    /// this log has, at most the log end offset) and deletes the records wholly below it and
    /// the older snapshots; the epoch cache is truncated from the start. Returns whether the log
    /// start offset moved.
    ///
    /// # Errors
    /// [`RaftLogError::Io`].
    fn delete_before(&mut self, id: OffsetAndEpoch, now_ms: i64) -> Result<bool, RaftLogError>;

    /// Starts receiving snapshot `id` from the leader (Kafka's `createNewSnapshotUnchecked`),
    /// dropping any other pending one. Returns `false` (and starts nothing) when the log
    /// already has that snapshot complete.
    ///
    /// # Errors
    /// [`RaftLogError::Io`].
    fn begin_fetched_snapshot(&mut self, id: OffsetAndEpoch) -> Result<bool, RaftLogError>;

    /// The snapshot being fetched and how many bytes of it were received (the next
    /// FetchSnapshot `Position`).
    fn fetched_snapshot(&self) -> Option<(OffsetAndEpoch, u64)>;

    /// Appends a chunk to the snapshot being fetched; returns the bytes received so far.
    ///
    /// # Errors
    /// [`RaftLogError::InvalidSnapshot`] when nothing is being fetched or the snapshot would
    /// pass [`crate::snapshot::MAX_SNAPSHOT_BYTES`], [`RaftLogError::Io`].
    fn append_fetched_snapshot(&mut self, chunk: &[u8]) -> Result<u64, RaftLogError>;

    /// Drops the snapshot being fetched, if any (an epoch change, an error from the leader).
    fn abort_fetched_snapshot(&mut self);

    /// Checks the snapshot being fetched whole and makes it a complete snapshot of the log
    /// (`freeze`). Returns its id. On error the pending snapshot is dropped.
    ///
    /// # Errors
    /// [`RaftLogError::InvalidSnapshot`] when nothing is being fetched or it is corrupt,
    /// [`RaftLogError::Io`].
    fn complete_fetched_snapshot(&mut self) -> Result<OffsetAndEpoch, RaftLogError>;

    /// Kafka's `truncateToLatestSnapshot`: when the log does not hold the latest snapshot's
    /// last record (`end offset - 1` with the snapshot's epoch: the log ends before it or
    /// diverges from it), the log is emptied and starts at the snapshot's end offset
    /// (`truncateFullyAndStartAt`): log start = log end = snapshot end offset, epoch cache
    /// empty (the last fetched epoch is the snapshot's), older snapshots deleted. The high
    /// watermark is left to the core (which raises it to the snapshot's end offset). Returns
    /// whether it truncated.
    ///
    /// # Errors
    /// [`RaftLogError::Io`].
    fn truncate_to_latest_snapshot(&mut self) -> Result<bool, RaftLogError>;

    /// Kafka's `ReplicatedLog.truncateToEndOffset`: truncates to where the leader's
    /// `DivergingEpoch` says this log stops agreeing with it. Returns the new LEO.
    ///
    /// # Errors
    /// As [`RaftLog::truncate_to`].
    fn truncate_to_end_offset(&mut self, diverging: OffsetAndEpoch) -> Result<i64, RaftLogError> {
        let truncation_offset = if diverging.epoch == 0 {
            diverging.offset.min(self.log_end_offset())
        } else {
            let local = self.end_offset_for_epoch(diverging.epoch);
            if local.epoch == diverging.epoch {
                local.offset.min(diverging.offset)
            } else {
                local.offset
            }
        };
        self.truncate_to(truncation_offset)
    }
}

/// One batch held by a [`MemoryLog`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredBatch {
    /// First offset.
    pub base_offset: i64,
    /// Last offset.
    pub last_offset: i64,
    /// `partitionLeaderEpoch`.
    pub epoch: i32,
    /// The batch's CRC-32C (identifies its content).
    pub crc: u32,
    /// The whole batch.
    pub bytes: Bytes,
}

/// A [`RaftLog`] in memory, with a durability point so that the simulator can lose what was
/// appended but not flushed when it crashes a node. Snapshots are held as the bytes of a
/// snapshot file ([`crate::snapshot::encode_snapshot`]); writing one, deleting the log before
/// one and installing a fetched one are durable at once (as the disk log makes them).
#[derive(Debug, Clone, Default)]
pub struct MemoryLog {
    batches: Vec<StoredBatch>,
    /// `(epoch, start offset)` for each epoch in the log, ascending: the leader epoch cache.
    epochs: Vec<(i32, i64)>,
    log_start_offset: i64,
    high_watermark: i64,
    durable_end_offset: i64,
    /// Smallest log end offset since [`MemoryLog::take_truncation_mark`] last ran.
    truncation_mark: Option<i64>,
    /// Durable batches a truncation removed since the last flush: the truncation itself is not
    /// durable yet, so a crash may bring them back (a file truncated but not fsynced).
    resurrectable: Vec<StoredBatch>,
    /// Complete snapshots by `(end offset, epoch)`: the bytes of the snapshot file.
    snapshots: BTreeMap<(i64, i32), Bytes>,
    /// The snapshot being fetched and the bytes received.
    pending: Option<(OffsetAndEpoch, Vec<u8>)>,
}

impl MemoryLog {
    /// An empty log.
    pub fn new() -> Self {
        Self::default()
    }

    /// The batches, in offset order (from the log start offset; the first may start below it).
    pub fn batches(&self) -> &[StoredBatch] {
        &self.batches
    }

    /// The offset up to which appends are durable (survive [`MemoryLog::crash`]).
    pub fn durable_end_offset(&self) -> i64 {
        self.durable_end_offset
    }

    /// Ids of the complete snapshots, oldest first.
    pub fn snapshot_ids(&self) -> Vec<OffsetAndEpoch> {
        self.snapshots
            .keys()
            .map(|&(o, e)| OffsetAndEpoch::new(o, e))
            .collect()
    }

    /// Completes a [`crate::Action::FlushLog`]: everything below `end_offset` is durable, and
    /// so are the truncations made before it.
    pub fn flush(&mut self, end_offset: i64) {
        let end = end_offset.min(self.log_end_offset());
        self.durable_end_offset = self.durable_end_offset.max(end);
        self.resurrectable.clear();
    }

    fn durable_batches(&self) -> usize {
        self.batches
            .iter()
            .take_while(|b| b.last_offset < self.durable_end_offset)
            .count()
    }

    /// A crash: keeps the durable prefix and a random number of the batches appended after it
    /// (the page cache may have written some back); a truncation not yet made durable by a
    /// flush may be undone (half the time); forgets the high watermark and a snapshot being
    /// fetched (its `.part` file is deleted when the log is opened); a log left short of its
    /// latest snapshot starts at it ([`RaftLog::truncate_to_latest_snapshot`], as the disk log
    /// does when opened).
    pub fn crash(&mut self, rng: &mut Rng) {
        let durable_batches = self.durable_batches();
        if !self.resurrectable.is_empty() && rng.chance(0.5) {
            self.batches.truncate(durable_batches);
            self.note_truncation();
            let back = std::mem::take(&mut self.resurrectable);
            self.batches.extend(back);
            self.rebuild_epochs();
        } else {
            let keep = durable_batches
                + rng.below((self.batches.len() - durable_batches) as u64 + 1) as usize;
            if keep < self.batches.len() {
                self.batches.truncate(keep);
                self.rebuild_epochs();
                self.note_truncation();
            }
        }
        self.resurrectable.clear();
        self.pending = None;
        self.durable_end_offset = self.log_end_offset();
        self.high_watermark = 0;
        // As the disk log on open: a snapshot the log no longer reaches (records lost above a
        // snapshot that was written without deleting the log before it) replaces the log.
        if self.truncate_to_latest_snapshot().is_err() {
            unreachable!("the memory log's full truncation cannot fail");
        }
    }

    /// The smallest log end offset since the last call, when a truncation happened since (the
    /// records from it on were removed, and maybe replaced), or `None`.
    pub fn take_truncation_mark(&mut self) -> Option<i64> {
        self.truncation_mark.take()
    }

    fn note_truncation(&mut self) {
        let end = self.log_end_offset();
        self.truncation_mark = Some(self.truncation_mark.map_or(end, |m| m.min(end)));
    }

    fn rebuild_epochs(&mut self) {
        self.epochs.clear();
        for b in &self.batches {
            if self.epochs.last().map(|&(e, _)| e) != Some(b.epoch) {
                self.epochs
                    .push((b.epoch, b.base_offset.max(self.log_start_offset)));
            }
        }
    }

    fn push(&mut self, header: &BatchHeader, bytes: Bytes) {
        let epoch = header.partition_leader_epoch;
        if self.epochs.last().map(|&(e, _)| e) != Some(epoch) {
            self.epochs.push((epoch, header.base_offset));
        }
        self.batches.push(StoredBatch {
            base_offset: header.base_offset,
            last_offset: header.last_offset(),
            epoch,
            crc: header.crc,
            bytes,
        });
    }

    /// The epoch of the record at `offset`, from the epoch cache (or the snapshot at the log
    /// start for the offset just below it).
    fn epoch_of_offset(&self, offset: i64) -> Option<i32> {
        if offset >= self.log_end_offset() {
            return None;
        }
        if offset < self.log_start_offset {
            return self
                .snapshots
                .keys()
                .find(|&&(o, _)| o == self.log_start_offset && offset == o - 1)
                .map(|&(_, e)| e);
        }
        self.epochs
            .iter()
            .rev()
            .find(|&&(_, start)| start <= offset)
            .map(|&(e, _)| e)
    }

    /// Checks that `header` may follow `(next_offset, latest_epoch)`.
    fn check_follows(
        header: &BatchHeader,
        next_offset: i64,
        latest_epoch: i32,
    ) -> Result<(), RaftLogError> {
        if header.base_offset != next_offset {
            return Err(RaftLogError::NonContiguous {
                base_offset: header.base_offset,
                log_end_offset: next_offset,
            });
        }
        if header.partition_leader_epoch < latest_epoch || header.partition_leader_epoch < 0 {
            return Err(RaftLogError::EpochRegression {
                epoch: header.partition_leader_epoch,
                latest_epoch,
            });
        }
        Ok(())
    }
}

impl RaftLog for MemoryLog {
    fn log_end_offset(&self) -> i64 {
        self.batches
            .last()
            .map_or(self.log_start_offset, |b| b.last_offset + 1)
    }

    fn last_fetched_epoch(&self) -> i32 {
        match self.batches.last() {
            Some(b) => b.epoch,
            None => self.latest_snapshot_id().map_or(0, |s| s.epoch),
        }
    }

    fn end_offset_for_epoch(&self, epoch: i32) -> OffsetAndEpoch {
        let leo = self.log_end_offset();
        let Some(&(latest, _)) = self.epochs.last() else {
            return OffsetAndEpoch::new(leo, self.last_fetched_epoch());
        };
        if epoch == latest {
            return OffsetAndEpoch::new(leo, epoch);
        }
        // First epoch entry above the requested one.
        let higher = self.epochs.partition_point(|&(e, _)| e <= epoch);
        if higher >= self.epochs.len() {
            return OffsetAndEpoch::new(leo, latest);
        }
        let higher_start = self.epochs[higher].1;
        if higher == 0 {
            OffsetAndEpoch::new(higher_start, epoch)
        } else {
            OffsetAndEpoch::new(higher_start, self.epochs[higher - 1].0)
        }
    }

    fn read(&self, from: i64, max_bytes: usize) -> Result<Bytes, RaftLogError> {
        if from >= self.log_end_offset() {
            return Ok(Bytes::new());
        }
        if from < self.log_start_offset {
            return Err(RaftLogError::BelowLogStartOffset {
                offset: from,
                log_start_offset: self.log_start_offset,
            });
        }
        let first = self.batches.partition_point(|b| b.last_offset < from);
        let mut out = BytesMut::new();
        for b in &self.batches[first..] {
            if !out.is_empty() && out.len() + b.bytes.len() > max_bytes {
                break;
            }
            out.extend_from_slice(&b.bytes);
        }
        Ok(out.freeze())
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
        let header =
            batch::validate_batch(&batch).map_err(|e| RaftLogError::Corrupt(e.to_string()))?;
        if header.total_size() != batch.len() {
            return Err(RaftLogError::Corrupt(format!(
                "{} trailing bytes after the batch",
                batch.len() - header.total_size()
            )));
        }
        if header.partition_leader_epoch != epoch {
            return Err(RaftLogError::Corrupt(format!(
                "batch epoch {} is not the leader epoch {epoch}",
                header.partition_leader_epoch
            )));
        }
        Self::check_follows(&header, self.log_end_offset(), self.last_fetched_epoch())?;
        self.push(&header, batch);
        Ok(LogAppendInfo {
            first_offset: header.base_offset,
            last_offset: header.last_offset(),
        })
    }

    fn append_as_follower(&mut self, records: &Bytes) -> Result<LogAppendInfo, RaftLogError> {
        let mut headers = Vec::new();
        let mut next = self.log_end_offset();
        let mut latest_epoch = self.last_fetched_epoch();
        for item in Batches::new(records) {
            let (at, _) = item.map_err(|e| RaftLogError::Corrupt(e.to_string()))?;
            let header = batch::validate_batch(&records[at..])
                .map_err(|e| RaftLogError::Corrupt(e.to_string()))?;
            Self::check_follows(&header, next, latest_epoch)?;
            next = header.last_offset() + 1;
            latest_epoch = header.partition_leader_epoch;
            headers.push((at, header));
        }
        let (Some(first), Some(last)) = (headers.first(), headers.last()) else {
            return Err(RaftLogError::Corrupt("no record batch".into()));
        };
        let info = LogAppendInfo {
            first_offset: first.1.base_offset,
            last_offset: last.1.last_offset(),
        };
        for (at, header) in headers {
            let bytes = records.slice(at..at + header.total_size());
            self.push(&header, bytes);
        }
        Ok(info)
    }

    fn truncate_to(&mut self, offset: i64) -> Result<i64, RaftLogError> {
        if offset < self.high_watermark {
            return Err(RaftLogError::BelowHighWatermark {
                offset,
                high_watermark: self.high_watermark,
            });
        }
        if offset < self.log_start_offset {
            return Err(RaftLogError::BelowLogStartOffset {
                offset,
                log_start_offset: self.log_start_offset,
            });
        }
        let keep = self.batches.partition_point(|b| b.last_offset < offset);
        if keep < self.batches.len() {
            let durable = self.durable_batches();
            if keep < durable {
                let mut removed = self.batches[keep..durable].to_vec();
                removed.append(&mut self.resurrectable);
                self.resurrectable = removed;
            }
            self.batches.truncate(keep);
            self.rebuild_epochs();
            self.note_truncation();
        }
        let leo = self.log_end_offset();
        self.durable_end_offset = self.durable_end_offset.min(leo);
        Ok(leo)
    }

    fn log_start_offset(&self) -> i64 {
        self.log_start_offset
    }

    fn latest_snapshot_id(&self) -> Option<OffsetAndEpoch> {
        self.snapshots
            .keys()
            .next_back()
            .map(|&(o, e)| OffsetAndEpoch::new(o, e))
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
            .map(|b| b.len() as u64)
    }

    fn read_snapshot_chunk(
        &self,
        id: OffsetAndEpoch,
        position: u64,
        max_bytes: usize,
    ) -> Result<Bytes, RaftLogError> {
        let bytes = self
            .snapshots
            .get(&(id.offset, id.epoch))
            .ok_or(RaftLogError::SnapshotNotFound(id))?;
        let start = usize::try_from(position)
            .unwrap_or(usize::MAX)
            .min(bytes.len());
        let end = start.saturating_add(max_bytes).min(bytes.len());
        Ok(bytes.slice(start..end))
    }

    fn read_snapshot(&self, id: OffsetAndEpoch) -> Result<Snapshot, RaftLogError> {
        let bytes = self
            .snapshots
            .get(&(id.offset, id.epoch))
            .ok_or(RaftLogError::SnapshotNotFound(id))?;
        parse_snapshot(id, bytes.clone(), Path::new(&snapshot_file_name(id)))
            .map_err(|e| RaftLogError::Corrupt(e.to_string()))
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
        check_new_snapshot(
            id,
            self.log_start_offset,
            self.high_watermark,
            self.epoch_of_offset(id.offset - 1),
        )?;
        let last_ts = now_ms;
        let bytes = encode_snapshot(id, last_ts, values, now_ms)
            .map_err(|e| RaftLogError::Io(e.to_string()))?;
        self.snapshots.insert((id.offset, id.epoch), bytes);
        Ok(())
    }

    fn delete_before(&mut self, id: OffsetAndEpoch, _now_ms: i64) -> Result<bool, RaftLogError> {
        if !self.snapshots.contains_key(&(id.offset, id.epoch))
            || id.offset <= self.log_start_offset
            || id.offset > self.log_end_offset()
        {
            return Ok(false);
        }
        self.log_start_offset = id.offset;
        let gone = self.batches.partition_point(|b| b.last_offset < id.offset);
        self.batches.drain(..gone);
        self.resurrectable.retain(|b| b.last_offset >= id.offset);
        // The snapshot holds what is below its end: a crash never takes the log below it (nor
        // below the end of a batch that straddles it).
        let covered = match self.batches.first() {
            Some(b) if b.base_offset < id.offset => b.last_offset + 1,
            _ => id.offset,
        };
        self.durable_end_offset = self.durable_end_offset.max(covered);
        self.rebuild_epochs();
        self.snapshots.retain(|&(o, _), _| o >= id.offset);
        Ok(true)
    }

    fn begin_fetched_snapshot(&mut self, id: OffsetAndEpoch) -> Result<bool, RaftLogError> {
        if self.snapshots.contains_key(&(id.offset, id.epoch)) {
            self.pending = None;
            return Ok(false);
        }
        self.pending = Some((id, Vec::new()));
        Ok(true)
    }

    fn fetched_snapshot(&self) -> Option<(OffsetAndEpoch, u64)> {
        self.pending
            .as_ref()
            .map(|(id, bytes)| (*id, bytes.len() as u64))
    }

    fn append_fetched_snapshot(&mut self, chunk: &[u8]) -> Result<u64, RaftLogError> {
        let Some((id, bytes)) = self.pending.as_mut() else {
            return Err(RaftLogError::InvalidSnapshot {
                id: OffsetAndEpoch::new(-1, -1),
                reason: "no snapshot is being fetched".into(),
            });
        };
        let size = bytes.len() as u64 + chunk.len() as u64;
        if size > MAX_SNAPSHOT_BYTES {
            return Err(RaftLogError::InvalidSnapshot {
                id: *id,
                reason: format!("larger than {MAX_SNAPSHOT_BYTES} bytes"),
            });
        }
        bytes.extend_from_slice(chunk);
        Ok(size)
    }

    fn abort_fetched_snapshot(&mut self) {
        self.pending = None;
    }

    fn complete_fetched_snapshot(&mut self) -> Result<OffsetAndEpoch, RaftLogError> {
        let Some((id, bytes)) = self.pending.take() else {
            return Err(RaftLogError::InvalidSnapshot {
                id: OffsetAndEpoch::new(-1, -1),
                reason: "no snapshot is being fetched".into(),
            });
        };
        let bytes = Bytes::from(bytes);
        parse_snapshot(id, bytes.clone(), Path::new(&snapshot_file_name(id))).map_err(|e| {
            RaftLogError::InvalidSnapshot {
                id,
                reason: e.to_string(),
            }
        })?;
        self.snapshots.insert((id.offset, id.epoch), bytes);
        Ok(id)
    }

    fn truncate_to_latest_snapshot(&mut self) -> Result<bool, RaftLogError> {
        let Some(id) = self.latest_snapshot_id() else {
            return Ok(false);
        };
        if id.offset <= self.log_start_offset
            || self.epoch_of_offset(id.offset - 1) == Some(id.epoch)
        {
            return Ok(false);
        }
        self.batches.clear();
        self.epochs.clear();
        self.resurrectable.clear();
        self.log_start_offset = id.offset;
        self.durable_end_offset = id.offset;
        self.snapshots.retain(|&(o, _), _| o >= id.offset);
        self.note_truncation();
        Ok(true)
    }
}

/// Kafka's checks of `createNewSnapshot`: the end offset within `[log start, high watermark]`
/// and the epoch the log's at `end offset - 1` (`epoch_before`, `None` when the log does not
/// know it; an empty log with start 0 takes epoch 0 at offset 0).
pub(crate) fn check_new_snapshot(
    id: OffsetAndEpoch,
    log_start_offset: i64,
    high_watermark: i64,
    epoch_before: Option<i32>,
) -> Result<(), RaftLogError> {
    let bad = |reason: String| RaftLogError::InvalidSnapshot { id, reason };
    if id.offset < log_start_offset || id.offset > high_watermark {
        return Err(bad(format!(
            "end offset outside [log start {log_start_offset}, high watermark {high_watermark}]"
        )));
    }
    if id.offset == 0 {
        return if id.epoch == 0 {
            Ok(())
        } else {
            Err(bad("a snapshot at offset 0 has epoch 0".into()))
        };
    }
    if epoch_before != Some(id.epoch) {
        return Err(bad(format!(
            "the epoch of offset {} is {epoch_before:?}",
            id.offset - 1
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batches::build_data_batch;

    fn log_with(epochs_and_counts: &[(i32, usize)]) -> MemoryLog {
        let mut log = MemoryLog::new();
        for &(epoch, count) in epochs_and_counts {
            for _ in 0..count {
                let b = build_data_batch(log.log_end_offset(), epoch, 0, &[Bytes::from("v")]);
                log.append_as_leader(b, epoch).unwrap();
            }
        }
        log
    }

    #[test]
    fn end_offset_for_epoch_is_kafkas() {
        // epoch 1 at [0,3), epoch 3 at [3,5), epoch 4 at [5,6)
        let log = log_with(&[(1, 3), (3, 2), (4, 1)]);
        assert_eq!(log.end_offset_for_epoch(4), OffsetAndEpoch::new(6, 4));
        assert_eq!(log.end_offset_for_epoch(3), OffsetAndEpoch::new(5, 3));
        assert_eq!(log.end_offset_for_epoch(2), OffsetAndEpoch::new(3, 1));
        assert_eq!(log.end_offset_for_epoch(1), OffsetAndEpoch::new(3, 1));
        assert_eq!(log.end_offset_for_epoch(0), OffsetAndEpoch::new(0, 0));
        assert_eq!(log.end_offset_for_epoch(9), OffsetAndEpoch::new(6, 4));
        assert_eq!(
            MemoryLog::new().end_offset_for_epoch(5),
            OffsetAndEpoch::new(0, 0)
        );
    }

    #[test]
    fn truncate_to_end_offset_follows_the_diverging_epoch() {
        // Leader: epoch 1 [0,3), epoch 2 [3,4). Follower: epoch 1 [0,5) (two stale records).
        let mut follower = log_with(&[(1, 5)]);
        let leo = follower
            .truncate_to_end_offset(OffsetAndEpoch::new(3, 1))
            .unwrap();
        assert_eq!(leo, 3);
        assert_eq!(follower.last_fetched_epoch(), 1);
        // A diverging epoch the follower does not have: truncate to the end of its own epoch
        // below it.
        let mut follower = log_with(&[(1, 2), (3, 2)]);
        assert_eq!(
            follower
                .truncate_to_end_offset(OffsetAndEpoch::new(3, 2))
                .unwrap(),
            2
        );
    }

    #[test]
    fn follower_append_checks_contiguity_and_crc() {
        let leader = log_with(&[(1, 3), (2, 1)]);
        let mut follower = MemoryLog::new();
        let all = leader.read(0, usize::MAX).unwrap();
        let info = follower.append_as_follower(&all).unwrap();
        assert_eq!((info.first_offset, info.last_offset), (0, 3));
        assert_eq!(follower.end_offset(), OffsetAndEpoch::new(4, 2));
        // Not at the LEO.
        let again = leader.read(1, usize::MAX).unwrap();
        assert!(matches!(
            follower.append_as_follower(&again),
            Err(RaftLogError::NonContiguous { .. })
        ));
        // Corrupt CRC.
        let mut bad = MemoryLog::new();
        let mut bytes = all.to_vec();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        assert!(matches!(
            bad.append_as_follower(&Bytes::from(bytes)),
            Err(RaftLogError::Corrupt(_))
        ));
        assert_eq!(bad.log_end_offset(), 0);
    }

    #[test]
    fn read_returns_whole_batches_within_max_bytes() {
        let log = log_with(&[(1, 4)]);
        let one = log.batches()[0].bytes.len();
        assert_eq!(log.read(0, 1).unwrap().len(), one);
        assert_eq!(log.read(0, 2 * one).unwrap().len(), 2 * one);
        assert_eq!(log.read(2, usize::MAX).unwrap().len(), 2 * one);
        assert!(log.read(4, usize::MAX).unwrap().is_empty());
    }

    #[test]
    fn truncation_below_the_high_watermark_is_refused() {
        let mut log = log_with(&[(1, 4)]);
        log.update_high_watermark(3);
        assert!(matches!(
            log.truncate_to(2),
            Err(RaftLogError::BelowHighWatermark { .. })
        ));
        assert_eq!(log.truncate_to(3).unwrap(), 3);
    }

    #[test]
    fn crash_keeps_the_durable_prefix() {
        let mut rng = Rng::new(3);
        for _ in 0..50 {
            let mut log = log_with(&[(1, 6)]);
            log.flush(2);
            log.crash(&mut rng);
            assert!(log.log_end_offset() >= 2);
            assert_eq!(log.high_watermark(), 0);
        }
    }

    #[test]
    fn a_crash_may_undo_a_truncation_not_yet_flushed() {
        let mut undone = 0;
        let mut rng = Rng::new(11);
        for _ in 0..40 {
            let mut log = log_with(&[(1, 2), (2, 2)]);
            log.flush(4);
            log.truncate_to(2).unwrap();
            let b = build_data_batch(2, 3, 0, &[Bytes::from("new")]);
            log.append_as_leader(b, 3).unwrap();
            log.crash(&mut rng);
            assert!(log.take_truncation_mark().is_some());
            match log.end_offset() {
                e if e == OffsetAndEpoch::new(4, 2) => undone += 1,
                e => assert!(e == OffsetAndEpoch::new(2, 1) || e == OffsetAndEpoch::new(3, 3)),
            }
        }
        assert!(undone > 0);
        // Once flushed, the truncation stays.
        let mut log = log_with(&[(1, 2), (2, 2)]);
        log.flush(4);
        log.truncate_to(2).unwrap();
        log.flush(2);
        log.crash(&mut rng);
        assert_eq!(log.end_offset(), OffsetAndEpoch::new(2, 1));
    }
}
