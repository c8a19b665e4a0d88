//! [`PartitionLog`]: one partition's segmented log (Kafka's `UnifiedLog` and `LogLoader`).

use crate::clock::SharedClock;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use gregor_protocol::batch::{
    set_base_offset, set_log_append_time, set_partition_leader_epoch, validate_batch, BatchHeader,
    Batches, TimestampType,
};
use gregor_protocol::compression::DEFAULT_MAX_DECOMPRESSED_BYTES;
use gregor_protocol::control::{
    end_txn_marker_batch, parse_end_txn_marker, EndTxnMarker, MAX_CONTROL_BATCH_BYTES,
};
use gregor_protocol::records::{decode_records, inspect_validated_records_bounded, RecordView};
use parking_lot::{Mutex, RwLock};

use crate::checkpoint::sync_dir;
use crate::config::{LogConfig, TopicPartition};
use crate::epoch::{EpochEntry, LeaderEpochCache};
use crate::error::{LogError, RecordError, Result};
use crate::files::SendPin;
use crate::health::LogDirHealth;
use crate::producer_state::{
    AppendOrigin, ProducerCheck, ProducerStateManager, ProducerSummary, VerificationGuard,
};
use crate::segment::{
    checked_total_size, LogSegment, Lookup, Misled, SegmentAppendError, TimestampOffset,
};
use crate::timestamps::record_timestamps;
use crate::txn_index::AbortedTxn;

/// Result of an append (Kafka's `LogAppendInfo`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppendInfo {
    /// Offset assigned to the first record.
    pub first_offset: i64,
    /// Offset assigned to the last record.
    pub last_offset: i64,
    /// The broker time (ms) stamped on the batches for `LogAppendTime` topics, else -1.
    pub log_append_time_ms: i64,
    /// The log start offset after the append.
    pub log_start_offset: i64,
    /// True when the batch was a retry of one already in the log (idempotent producer): the
    /// offsets are the original ones and nothing was written.
    pub duplicate: bool,
    /// Records appended (0 for a duplicate).
    pub records: u64,
    /// Bytes appended (0 for a duplicate).
    pub bytes: u64,
}

/// Result of a read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadInfo {
    /// Whole batches, the first one containing the fetch offset; empty when there is nothing to
    /// return.
    pub records: Bytes,
    /// The log start offset when the read happened.
    pub log_start_offset: i64,
    /// The log end offset when the read happened.
    pub log_end_offset: i64,
}

/// The batches of a Fetch response for one partition ([`PartitionLog::read_for_fetch`]).
#[derive(Debug, Clone)]
pub enum FetchRecords {
    /// Read into memory.
    Memory(Bytes),
    /// A range of a segment file, sent from its descriptor.
    File(FileSlice),
}

impl FetchRecords {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Self::Memory(b) => b.len(),
            Self::File(f) => f.len(),
        }
    }

    /// Whether there are no batches.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes in memory, reading a file range.
    ///
    /// # Errors
    /// The read's error, or `UnexpectedEof` when the file was truncated meanwhile.
    pub fn to_bytes(&self) -> std::io::Result<Bytes> {
        match self {
            Self::Memory(b) => Ok(b.clone()),
            Self::File(f) => f.read_to_vec().map(Bytes::from),
        }
    }
}

impl Default for FetchRecords {
    fn default() -> Self {
        Self::Memory(Bytes::new())
    }
}

/// A range of a segment's `.log` file whose descriptor is held open ([`SendPin`]) until the
/// slice is dropped, so the bytes can be sent after the read without copying them (splice).
/// Retention, DeleteRecords and compaction may delete or replace the file meanwhile: the
/// descriptor still reads the bytes the slice was made from. A truncation in place (a
/// follower's) may not: [`FileSlice::is_intact`] then turns false.
#[derive(Debug, Clone)]
pub struct FileSlice {
    pin: SendPin,
    position: u64,
    len: usize,
}

impl FileSlice {
    /// The file.
    pub fn file(&self) -> &std::fs::File {
        self.pin.file()
    }

    /// Where the slice starts in the file (bytes).
    pub fn position(&self) -> u64 {
        self.position
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the slice is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// False once the file was truncated in place after the slice was chosen: its bytes may
    /// be gone or replaced, and they must not be sent.
    pub fn is_intact(&self) -> bool {
        self.pin.is_intact()
    }

    /// Reads the slice into memory (for a transport that cannot send from a file).
    ///
    /// # Errors
    /// The read's error; `UnexpectedEof` when the file is shorter than the slice, and
    /// `InvalidData` when it was truncated since the slice was chosen.
    pub fn read_to_vec(&self) -> std::io::Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        if !self.is_intact() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "the segment was truncated after the fetch chose its bytes",
            ));
        }
        let mut buf = vec![0u8; self.len];
        self.file().read_exact_at(&mut buf, self.position)?;
        Ok(buf)
    }
}

/// Result of [`PartitionLog::read_for_fetch`].
#[derive(Debug, Clone, Default)]
pub struct FetchReadInfo {
    /// Whole batches, the first one containing the fetch offset; empty when there is nothing
    /// to return.
    pub records: FetchRecords,
    /// Records in those batches (the sum of their headers' record counts).
    pub record_count: i64,
    /// The log start offset when the read happened.
    pub log_start_offset: i64,
    /// The log end offset when the read happened.
    pub log_end_offset: i64,
}

/// Where a fetch reads ([`PartitionLog::fetch_range`]).
struct FetchRange {
    segment: Arc<LogSegment>,
    /// Position of the first batch.
    position: u64,
    /// Its header.
    first: gregor_protocol::batch::BatchHeader,
    /// Bytes the read may look at from `position` (within the published size).
    len: usize,
    /// Exclusive upper offset: only batches whose last offset is below it.
    upper: i64,
    /// The segment's truncation count before the range was chosen.
    truncations: u64,
}

impl FetchRange {
    /// Reads `len` bytes and keeps the whole batches below `upper` (the copying read); also
    /// their record count.
    fn read_whole_batches(&self) -> Result<(Vec<u8>, i64)> {
        let mut buf = self.segment.read_range(self.position, self.len)?;
        let mut keep = 0;
        let mut records: i64 = 0;
        for item in Batches::new(&buf) {
            match item {
                Ok((at, b)) if b.last_offset() < self.upper => {
                    keep = at + b.total_size();
                    records += i64::from(b.records_count.max(0));
                }
                _ => break,
            }
        }
        buf.truncate(keep);
        Ok((buf, records))
    }

    /// The same batches as [`FetchRange::read_whole_batches`], found from their headers and
    /// returned as a pinned file slice, or in memory when the header reads covered them or no
    /// pin is free.
    fn file_or_memory(&self) -> Result<(FetchRecords, i64)> {
        let file = self.segment.log_file()?;
        let extent = self.segment.fetch_extent(
            &file,
            self.position,
            &self.first,
            self.position + self.len as u64,
            self.upper,
        )?;
        let len = (extent.end - self.position) as usize;
        if let Some(bytes) = extent.bytes {
            return Ok((FetchRecords::Memory(Bytes::from(bytes)), extent.records));
        }
        match self.segment.send_pin(self.truncations)? {
            Some(pin) => Ok((
                FetchRecords::File(FileSlice {
                    pin,
                    position: self.position,
                    len,
                }),
                extent.records,
            )),
            None => Ok((
                FetchRecords::Memory(Bytes::from(self.segment.read_range(self.position, len)?)),
                extent.records,
            )),
        }
    }
}

/// A record found by timestamp (ListOffsets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimestampAndOffset {
    /// The record's timestamp (ms since the epoch).
    pub timestamp_ms: i64,
    /// The record's offset.
    pub offset: i64,
    /// Partition leader epoch of the batch holding the record, if it has one.
    pub leader_epoch: Option<i32>,
}

/// What opening a log had to do; lets callers (and tests) see whether recovery ran.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadStats {
    /// Segments fully scanned and validated (CRC) because of an unclean shutdown or a bad
    /// index.
    pub recovered_segments: usize,
    /// Batches validated during that scan.
    pub recovered_batches: u64,
    /// Bytes that scan read: the segments from the one holding the recovery point on, not
    /// the whole log.
    pub recovered_bytes: u64,
    /// Bytes cut from the log (torn or corrupt tail), including deleted later segments.
    pub truncated_bytes: u64,
    /// Segments cut where a write was cut short by a crash: at the end of the log, past the
    /// recovery point.
    pub torn_tails: u64,
    /// Segments cut for corruption: before their end, below the recovery point, or short of
    /// later segments.
    pub corrupt_truncations: u64,
    /// Segments whose index files were unusable and were rebuilt while opening (only the
    /// active segment's are checked then; an inactive segment's are checked, and rebuilt if
    /// needed, on first use).
    pub rebuilt_indexes: usize,
    /// Bytes of `.index` and `.timeindex` files read while opening: the active segment's, and
    /// any an inactive segment's first use read (replaying producer state from a snapshot
    /// taken before the active segment). Inactive segments' index files are not read at open
    /// (KIP-263).
    pub index_bytes_read: u64,
    /// Batch headers replayed to rebuild producer state.
    pub replayed_producer_batches: u64,
    /// Offset of the producer snapshot loaded, if any.
    pub producer_snapshot_offset: Option<i64>,
    /// `leader-epoch-checkpoint` was torn or corrupt (a crash during an unsynced in-place
    /// rewrite) and its entries were rebuilt from the batches' partition leader epochs.
    pub rebuilt_leader_epochs: bool,
    /// Segments whose every batch header that rebuild read (the others were known from their
    /// first header alone).
    pub leader_epoch_rebuild_walked_segments: u64,
}

impl LoadStats {
    fn count_truncation(&mut self, r: &crate::segment::RecoverResult) {
        if r.truncated_bytes == 0 {
            return;
        }
        if r.torn_tail {
            self.torn_tails += 1;
        } else {
            self.corrupt_truncations += 1;
        }
    }
}

/// Rebuilds the leader epoch entries of `segments` into `epoch_cache` (after
/// [`LeaderEpochCache::rebuild_start`]) from the batches' partition leader epochs. Epochs never
/// decrease along a log, so a segment whose first batch has the epoch of the next non-empty
/// segment's first batch holds that epoch alone: one header stands for it, and only the
/// segments where the epoch changes are walked whole. A segment with an unreadable header is
/// warned about and passed (or its walk kept up to there): the entries then miss what it held,
/// which costs followers a deeper truncation at worst, whereas refusing to open would take the
/// whole partition offline for a file that recovery (which reads from the recovery point) did
/// not need. Returns how many segments were walked whole.
///
/// # Errors
/// [`LogError::Io`] when a segment cannot be read at all.
fn rebuild_leader_epochs(
    topic_partition: &TopicPartition,
    segments: &[Arc<LogSegment>],
    epoch_cache: &mut LeaderEpochCache,
) -> Result<u64> {
    let unreadable = |seg: &LogSegment, reason: &str| {
        tracing::warn!(partition = %topic_partition, segment = %seg.log_path().display(),
            %reason, "unreadable batch header while rebuilding leader epochs; its epochs are \
            left out (followers may truncate further back than needed)");
    };
    let mut firsts: Vec<Option<(i32, i64)>> = Vec::with_capacity(segments.len());
    for seg in segments {
        let mut first = None;
        match seg.walk_headers(0, seg.size(), 4096, |_, h| {
            first = Some((h.partition_leader_epoch, h.base_offset));
            Ok(false)
        }) {
            Ok(_) => {}
            Err(LogError::CorruptFile { reason, .. }) => unreadable(seg, &reason),
            Err(e) => return Err(e),
        }
        firsts.push(first);
    }
    let mut walked = 0;
    for (i, seg) in segments.iter().enumerate() {
        let Some((epoch, base_offset)) = firsts[i] else {
            continue;
        };
        let next_epoch = firsts[i + 1..].iter().flatten().next().map(|(e, _)| *e);
        if next_epoch == Some(epoch) {
            epoch_cache.assign(epoch, base_offset, false)?;
            continue;
        }
        walked += 1;
        let walk = seg.walk_headers(0, seg.size(), crate::segment::SCAN_CHUNK_BYTES, |_, h| {
            epoch_cache.assign(h.partition_leader_epoch, h.base_offset, false)?;
            Ok(true)
        });
        match walk {
            Ok(_) => {}
            Err(LogError::CorruptFile { reason, .. }) => unreadable(seg, &reason),
            Err(e) => return Err(e),
        }
    }
    Ok(walked)
}

struct Inner {
    segments: Vec<Arc<LogSegment>>,
    producer_state: ProducerStateManager,
    unflushed_messages: u64,
    /// Closed, deleted, or failed with an I/O error mid-append (Kafka takes the log dir
    /// offline): appends are refused.
    closed: bool,
}

/// One partition's log. `Send + Sync`; share it through `Arc`. Appends are serialised by an
/// internal lock; reads take no lock shared with appends beyond brief snapshots of the segment
/// list and index entries, and never look past the published log end offset.
pub struct PartitionLog {
    dir: PathBuf,
    topic_partition: TopicPartition,
    config: RwLock<LogConfig>,
    inner: Mutex<Inner>,
    epoch_cache: Mutex<LeaderEpochCache>,
    segments: RwLock<Arc<Vec<Arc<LogSegment>>>>,
    log_end_offset: AtomicI64,
    log_start_offset: AtomicI64,
    recovery_point: AtomicI64,
    latest_epoch: AtomicI32,
    last_flush_ms: AtomicI64,
    flush_lock: Mutex<()>,
    load_stats: LoadStats,
    /// Serialises changes to the set of closed segments: retention deletes and the cleaner's
    /// swaps. Appends (which only add a segment at the end) do not take it.
    maintenance_lock: Mutex<()>,
    /// Files renamed to `.deleted`, with the wall-clock ms after which they may be removed
    /// (`file.delete.delay.ms`).
    pending_deletes: Mutex<Vec<(i64, Vec<PathBuf>)>>,
    /// The cleaner's first dirty offset (Kafka's `cleaner-offset-checkpoint` entry), -1 if never
    /// cleaned.
    cleaner_checkpoint: AtomicI64,
    /// Set while a cleaner thread works on this log.
    cleaning: std::sync::atomic::AtomicBool,
    /// Earliest KIP-534 delete horizon (ms) the cleaner wrote in its last round, `i64::MAX`
    /// when none (or unknown after a restart).
    min_delete_horizon_ms: AtomicI64,
    /// The clock for times the log takes itself (segment creation at open, flush time, the
    /// cleaner's swap); times passed in by the caller come from the caller's clock.
    clock: SharedClock,
    /// Set by [`PartitionLog::truncate_to`]: the next flush fsyncs the truncated segment and
    /// the directory even when the log end offset did not move past the recovery point.
    truncated_since_flush: std::sync::atomic::AtomicBool,
    /// The health of the log directory holding this log, when a [`crate::LogManager`] manages
    /// it: appends fail fast while it is offline, and write failures are recorded there.
    dir_health: std::sync::OnceLock<Arc<LogDirHealth>>,
    /// The first unstable offset (producer state's, at least the log start offset), -1 when
    /// every transaction is decided and replicated: published under the append lock, read by
    /// [`PartitionLog::last_stable_offset`] without it.
    first_unstable_offset: AtomicI64,
    /// A completed transaction waits for the high watermark to pass its marker (so
    /// [`PartitionLog::on_high_watermark_updated`] has work).
    unreplicated_txns: std::sync::atomic::AtomicBool,
}

/// The end-transaction marker of the control batch at `pos` in `seg` (header `h`), read back
/// for producer state; `None` (with a warning) for a batch that holds none or does not decode.
fn read_marker(seg: &LogSegment, pos: u64, h: &BatchHeader) -> Result<Option<EndTxnMarker>> {
    let size = h.total_size();
    if size > MAX_CONTROL_BATCH_BYTES {
        tracing::warn!(segment = %seg.log_path().display(), offset = h.base_offset, size,
            "control batch too large to be a transaction marker; ignored");
        return Ok(None);
    }
    let buf = seg.read_range(pos, size)?;
    Ok(parse_marker_or_warn(h, &buf))
}

fn parse_marker_or_warn(h: &BatchHeader, batch: &[u8]) -> Option<EndTxnMarker> {
    match parse_end_txn_marker(h, batch) {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(offset = h.base_offset, error = %e,
                "control batch without a readable transaction marker; ignored");
            None
        }
    }
}

/// Replays the batch headers of `seg` from `position` into `producer_state` (markers read
/// back from the segment), skipping batches below `from_offset`. With `index_aborts`, the
/// aborted transactions whose marker is replayed are appended to the segment's transaction
/// index (recovery rebuilds it so). Returns the number of batches replayed.
fn replay_segment(
    seg: &LogSegment,
    position: u64,
    from_offset: i64,
    producer_state: &mut ProducerStateManager,
    index_aborts: bool,
) -> Result<u64> {
    let mut replayed = 0u64;
    seg.walk_headers(
        position,
        seg.size(),
        crate::segment::SCAN_CHUNK_BYTES,
        |pos, h| {
            if h.base_offset < from_offset {
                return Ok(true);
            }
            replayed += 1;
            let marker = if h.is_control() && h.has_producer_id() {
                read_marker(seg, pos, h)?
            } else {
                None
            };
            if let Some(c) = producer_state.replay(h, marker) {
                if index_aborts {
                    if let Some(a) = producer_state.aborted_entry(&c) {
                        seg.append_aborted_txn(&a)?;
                    }
                }
                producer_state.complete_txn(&c);
            }
            Ok(true)
        },
    )?;
    Ok(replayed)
}

/// Suffix of segment files waiting for removal (Kafka's `DeletedFileSuffix`).
pub(crate) const DELETED_SUFFIX: &str = ".deleted";
/// Suffix of a segment the cleaner is writing (Kafka's `CleanedFileSuffix`).
pub(crate) const CLEANED_SUFFIX: &str = ".cleaned";
/// Suffix of a cleaned segment being swapped in (Kafka's `SwapFileSuffix`).
pub(crate) const SWAP_SUFFIX: &str = ".swap";

/// Finishes or rolls back a cleaner swap that a crash interrupted (Kafka's
/// `LogLoader.removeTempFilesAndCollectSwapFiles` and `completeSwapOperations`). The cleaner
/// writes `<base>.*.cleaned`, fsyncs, renames them to `.swap` (the `.log` last), renames the
/// replaced segments to `.deleted`, then drops the `.swap` suffix. So:
/// - any `.cleaned` file means the swap of that round never started: its `.cleaned` and `.swap`
///   files with a base offset at or above the smallest `.cleaned` one are removed (by the
///   caller's sweep) and the old segments are intact;
/// - a `<base>.log.swap` without such a `.cleaned` file is a complete cleaned segment: the old
///   segments it replaces (base offsets in `[base, its next offset)`) are removed and the swap
///   files lose their suffix.
fn complete_interrupted_swaps(dir: &Path) -> Result<()> {
    let mut min_cleaned = i64::MAX;
    let mut swaps = Vec::new();
    let mut logs = Vec::new();
    let rd = std::fs::read_dir(dir).map_err(|e| LogError::io("listing", dir, e))?;
    for entry in rd {
        let entry = entry.map_err(|e| LogError::io("listing", dir, e))?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if let Some(stem) = name.strip_suffix(CLEANED_SUFFIX) {
            if let Some(b) = ["log", "index", "timeindex", "txnindex"]
                .iter()
                .find_map(|ext| parse_base_offset(stem, &format!(".{ext}")))
            {
                min_cleaned = min_cleaned.min(b);
            }
        } else if let Some(stem) = name.strip_suffix(SWAP_SUFFIX) {
            if let Some(b) = parse_base_offset(stem, ".log") {
                swaps.push(b);
            }
        } else if let Some(b) = parse_base_offset(&name, ".log") {
            logs.push(b);
        }
    }
    swaps.sort_unstable();
    logs.sort_unstable();
    let mut changed = false;
    for base in swaps.into_iter().filter(|b| *b < min_cleaned) {
        let swap_path = dir.join(crate::segment::file_name(base, "log") + SWAP_SUFFIX);
        let next_offset = swap_next_offset(&swap_path)?.unwrap_or(base + 1);
        for old in logs.iter().filter(|o| **o >= base && **o < next_offset) {
            delete_segment_files(dir, *old)?;
        }
        crate::segment::rename_segment_files(dir, base, SWAP_SUFFIX, "")?;
        tracing::info!(segment = %swap_path.display(), "completed an interrupted cleaner swap");
        changed = true;
    }
    if changed {
        sync_dir(dir)?;
    }
    Ok(())
}

/// The offset after the last batch of a `.swap` log file (fsynced before it was renamed, so
/// its headers are walked without CRC checks), `None` if it has none.
fn swap_next_offset(path: &Path) -> Result<Option<i64>> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(path).map_err(|e| LogError::io("opening", path, e))?;
    let len = file
        .metadata()
        .map_err(|e| LogError::io("reading metadata of", path, e))?
        .len();
    let mut next = None;
    let mut pos = 0u64;
    let mut hdr = [0u8; gregor_protocol::batch::BATCH_HEADER_LEN];
    while pos + hdr.len() as u64 <= len {
        if file.read_exact_at(&mut hdr, pos).is_err() {
            break;
        }
        let Ok(h) = BatchHeader::parse(&hdr) else {
            break;
        };
        let Some(total) = checked_total_size(&h) else {
            break;
        };
        if pos + total as u64 > len {
            break;
        }
        next = Some(h.next_offset());
        pos += total as u64;
    }
    Ok(next)
}

fn parse_base_offset(name: &str, ext: &str) -> Option<i64> {
    let stem = name.strip_suffix(ext)?;
    if stem.len() == 20 && stem.bytes().all(|b| b.is_ascii_digit()) {
        stem.parse().ok()
    } else {
        None
    }
}

impl PartitionLog {
    /// Opens (creating if needed) the log in `dir`. When `had_clean_shutdown` is false every
    /// segment is validated batch by batch (see [`PartitionLog::open_with_recovery_point`]).
    ///
    /// # Errors
    /// [`LogError::Io`] for file errors, [`LogError::CorruptFile`] for an unreadable
    /// `leader-epoch-checkpoint`.
    pub fn open(
        dir: &Path,
        topic_partition: TopicPartition,
        config: LogConfig,
        had_clean_shutdown: bool,
    ) -> Result<Self> {
        Self::open_with_recovery_point(dir, topic_partition, config, had_clean_shutdown, None)
    }

    /// Opens the log, as Kafka's `LogLoader`: deletes temporary files, opens every segment,
    /// rebuilds unusable indexes, and after an unclean shutdown validates every batch (CRC,
    /// offsets) from the segment holding `recovery_point` (all segments when `None`),
    /// truncating at the first torn or corrupt batch and deleting later segments. Then trims the
    /// leader epoch cache to the log end offset and rebuilds producer state from the newest
    /// usable snapshot plus the batch headers after it.
    ///
    /// # Errors
    /// As [`PartitionLog::open`].
    pub fn open_with_recovery_point(
        dir: &Path,
        topic_partition: TopicPartition,
        config: LogConfig,
        had_clean_shutdown: bool,
        recovery_point: Option<i64>,
    ) -> Result<Self> {
        Self::open_with_checkpoints(
            dir,
            topic_partition,
            config,
            had_clean_shutdown,
            recovery_point,
            None,
        )
    }

    /// As [`PartitionLog::open_with_recovery_point`], with the log start offset from Kafka's
    /// `log-start-offset-checkpoint` (moved by retention and DeleteRecords). The log start
    /// offset is the larger of it and the first segment's base offset, capped at the log end
    /// offset. Also finishes or rolls back a cleaner swap a crash interrupted.
    ///
    /// # Errors
    /// As [`PartitionLog::open`].
    pub fn open_with_checkpoints(
        dir: &Path,
        topic_partition: TopicPartition,
        config: LogConfig,
        had_clean_shutdown: bool,
        recovery_point: Option<i64>,
        checkpointed_log_start_offset: Option<i64>,
    ) -> Result<Self> {
        Self::open_with_clock(
            dir,
            topic_partition,
            config,
            had_clean_shutdown,
            recovery_point,
            checkpointed_log_start_offset,
            crate::clock::system_clock(),
        )
    }

    /// As [`PartitionLog::open_with_checkpoints`], reading the time it takes itself (segment
    /// creation, flushes, cleaner swaps) from `clock`.
    ///
    /// # Errors
    /// As [`PartitionLog::open`].
    pub fn open_with_clock(
        dir: &Path,
        topic_partition: TopicPartition,
        config: LogConfig,
        had_clean_shutdown: bool,
        recovery_point: Option<i64>,
        checkpointed_log_start_offset: Option<i64>,
        clock: SharedClock,
    ) -> Result<Self> {
        Self::open_impl(
            dir,
            topic_partition,
            config,
            had_clean_shutdown,
            recovery_point,
            checkpointed_log_start_offset,
            clock,
            true,
        )
    }

    /// [`PartitionLog::open_with_clock`]; with `sync_recovered` false what recovery rewrote is
    /// not fsynced, and after an unclean shutdown the recovery point stays at
    /// `recovery_point` (at most the log end offset) as in Kafka's `LogLoader`: the next flush
    /// makes the recovered records durable and moves it, and a crash before that recovers
    /// them again.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn open_impl(
        dir: &Path,
        topic_partition: TopicPartition,
        config: LogConfig,
        had_clean_shutdown: bool,
        recovery_point: Option<i64>,
        checkpointed_log_start_offset: Option<i64>,
        clock: SharedClock,
        sync_recovered: bool,
    ) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| LogError::io("creating log directory", dir, e))?;
        let now_ms = clock.now_ms();
        let mut stats = LoadStats::default();

        complete_interrupted_swaps(dir)?;

        // Files in the directory.
        let mut bases = Vec::new();
        let mut others = Vec::new();
        let rd = std::fs::read_dir(dir).map_err(|e| LogError::io("listing", dir, e))?;
        for entry in rd {
            let entry = entry.map_err(|e| LogError::io("listing", dir, e))?;
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            if [".tmp", DELETED_SUFFIX, CLEANED_SUFFIX, SWAP_SUFFIX]
                .iter()
                .any(|s| name.ends_with(s))
            {
                let p = entry.path();
                std::fs::remove_file(&p).map_err(|e| LogError::io("removing", &p, e))?;
            } else if let Some(b) = parse_base_offset(&name, ".log") {
                bases.push(b);
            } else {
                others.push(name);
            }
        }
        bases.sort_unstable();
        for name in others {
            let orphan = [".index", ".timeindex", ".txnindex"]
                .iter()
                .filter_map(|ext| parse_base_offset(&name, ext))
                .any(|b| bases.binary_search(&b).is_err());
            if orphan {
                let p = dir.join(&name);
                std::fs::remove_file(&p)
                    .map_err(|e| LogError::io("removing orphan index", &p, e))?;
            }
        }

        let mut epoch_cache = LeaderEpochCache::load(dir)?;
        let mut segments: Vec<Arc<LogSegment>> = Vec::new();
        // Per segment: why its index files are unusable (the active segment's are checked
        // now; the others' on first use).
        let mut sane: Vec<Option<String>> = Vec::new();
        for (i, &b) in bases.iter().enumerate() {
            if i + 1 < bases.len() {
                let seg = LogSegment::open_lazy(
                    dir,
                    b,
                    config.segment_index_bytes,
                    config.index_interval_bytes,
                    now_ms,
                )?;
                segments.push(Arc::new(seg));
                sane.push(None);
            } else {
                let (seg, problem) = LogSegment::open(
                    dir,
                    b,
                    config.segment_index_bytes,
                    config.index_interval_bytes,
                    now_ms,
                )?;
                segments.push(Arc::new(seg));
                sane.push(problem);
            }
        }
        if segments.is_empty() {
            segments.push(Arc::new(LogSegment::create(
                dir,
                0,
                config.segment_index_bytes,
                config.index_interval_bytes,
                now_ms,
            )?));
            sane.push(None);
        }

        let recover_from = if had_clean_shutdown {
            segments.len()
        } else {
            recovery_point.map_or(0, |rp| {
                segments
                    .partition_point(|s| s.base_offset() <= rp)
                    .saturating_sub(1)
            })
        };
        let mut last_next_offset: Option<i64> = None;
        let mut epochs_changed = false;
        // The base offset of the first segment recovery found a transaction marker in: its
        // transaction index and the later ones are rebuilt (the crash may have lost entries).
        let mut first_recovered_marker: Option<i64> = None;
        let mut i = 0;
        while i < segments.len() {
            let seg = Arc::clone(&segments[i]);
            let must_recover = i >= recover_from || sane[i].is_some();
            if !must_recover {
                last_next_offset = None;
                i += 1;
                continue;
            }
            if let Some(problem) = &sane[i] {
                tracing::warn!(segment = %seg.log_path().display(), %problem,
                    "rebuilding unusable index files");
                stats.rebuilt_indexes += 1;
            }
            let expected = last_next_offset.unwrap_or(seg.base_offset());
            let tail = crate::segment::RecoveryTail {
                recovery_point,
                last_segment: i + 1 == segments.len(),
            };
            let unclean = i >= recover_from;
            let r = seg.recover(expected, config.index_interval_bytes, tail, |h| {
                if let Ok(true) = epoch_cache.assign(h.partition_leader_epoch, h.base_offset, false)
                {
                    epochs_changed = true;
                }
                if unclean && h.is_control() && h.has_producer_id() {
                    first_recovered_marker.get_or_insert(seg.base_offset());
                }
            })?;
            stats.recovered_segments += 1;
            stats.recovered_batches += r.batches;
            stats.recovered_bytes += r.scanned_bytes;
            stats.truncated_bytes += r.truncated_bytes;
            stats.count_truncation(&r);
            last_next_offset = Some(r.next_offset.unwrap_or(seg.base_offset()));
            i += 1;
            if r.truncated_bytes > 0 && i < segments.len() {
                // Everything after a corrupt batch is unreliable: drop later segments.
                let later_bytes: u64 = segments[i..].iter().map(|s| s.size()).sum();
                tracing::warn!(
                    partition = %topic_partition,
                    from_offset = last_next_offset.unwrap_or(seg.base_offset()),
                    segments = segments.len() - i,
                    removed_bytes = later_bytes,
                    "recovery removes the segments after a truncated one"
                );
                for later in segments.drain(i..) {
                    stats.truncated_bytes += later.size();
                    delete_segment_files(dir, later.base_offset())?;
                }
                sane.truncate(i);
            }
        }

        // The log end offset.
        let active = Arc::clone(segments.last().ok_or_else(|| LogError::CorruptFile {
            path: dir.display().to_string(),
            reason: "no segments".into(),
        })?);
        let log_end_offset = if recover_from < segments.len() || sane[segments.len() - 1].is_some()
        {
            last_next_offset.unwrap_or(active.base_offset())
        } else {
            match active.read_next_offset() {
                Ok(next) => next.unwrap_or(active.base_offset()),
                Err(LogError::CorruptFile { reason, .. }) => {
                    tracing::warn!(segment = %active.log_path().display(), %reason,
                        "torn active segment despite a clean shutdown; recovering it");
                    let tail = crate::segment::RecoveryTail {
                        recovery_point,
                        last_segment: true,
                    };
                    let r = active.recover(
                        active.base_offset(),
                        config.index_interval_bytes,
                        tail,
                        |h| {
                            if let Ok(true) =
                                epoch_cache.assign(h.partition_leader_epoch, h.base_offset, false)
                            {
                                epochs_changed = true;
                            }
                            if h.is_control() && h.has_producer_id() {
                                first_recovered_marker.get_or_insert(active.base_offset());
                            }
                        },
                    )?;
                    stats.recovered_segments += 1;
                    stats.recovered_batches += r.batches;
                    stats.recovered_bytes += r.scanned_bytes;
                    stats.truncated_bytes += r.truncated_bytes;
                    stats.count_truncation(&r);
                    stats.count_truncation(&r);
                    r.next_offset.unwrap_or(active.base_offset())
                }
                Err(e) => return Err(e),
            }
        };
        let log_start_offset = checkpointed_log_start_offset
            .unwrap_or(i64::MIN)
            .max(segments[0].base_offset())
            .min(log_end_offset);
        if let Some(reason) = epoch_cache.unusable().map(str::to_owned) {
            // The checkpoint is rewritten in place without fsync between flushes, so a crash
            // can tear it: every epoch with records is in the batches' partition leader epoch
            // (an epoch without records answers OffsetForLeaderEpoch as its predecessor would,
            // as after Kafka's recovery of the entries past the recovery point).
            tracing::warn!(partition = %topic_partition, %reason,
                "leader-epoch-checkpoint is unusable; rebuilding it from the log's batches");
            epoch_cache.rebuild_start();
            stats.leader_epoch_rebuild_walked_segments =
                rebuild_leader_epochs(&topic_partition, &segments, &mut epoch_cache)?;
            stats.rebuilt_leader_epochs = true;
            epochs_changed = true;
        }
        if epochs_changed {
            epoch_cache.persist(sync_recovered)?;
        }
        epoch_cache.truncate_from_end(log_end_offset)?;

        // Producer state: the newest usable snapshot, then the batch headers after it. When
        // recovery found transaction markers, the snapshot must be at or below the first
        // segment holding one, and that segment's transaction index and the later ones are
        // rebuilt from the markers replayed (Kafka's `LogSegment.recover`): a crash between a
        // marker's write and its index entry leaves the entry missing. Without markers in the
        // recovered range, only entries past the recovered end could be wrong.
        let rebuild_txn_index_from = first_recovered_marker;
        if rebuild_txn_index_from.is_none() && stats.truncated_bytes > 0 {
            if let Some(last) = segments.last() {
                last.truncate_txn_index(log_end_offset)?;
            }
        }
        let snapshot_limit =
            rebuild_txn_index_from.map_or(log_end_offset, |b| b.min(log_end_offset));
        let mut producer_state = ProducerStateManager::new(dir);
        let mut replay_from = log_start_offset;
        for snap in producer_state.list_snapshots()?.into_iter().rev() {
            if snap > log_end_offset || snap < log_start_offset {
                producer_state.delete_snapshot(snap)?;
                continue;
            }
            if snap > snapshot_limit {
                continue;
            }
            match producer_state.load_snapshot(snap) {
                Ok(()) => {
                    replay_from = snap;
                    stats.producer_snapshot_offset = Some(snap);
                    break;
                }
                Err(LogError::CorruptFile { path, reason }) => {
                    tracing::warn!(%path, %reason, "deleting unusable producer snapshot");
                    producer_state.clear();
                    producer_state.delete_snapshot(snap)?;
                }
                Err(e) => return Err(e),
            }
        }
        if let Some(from) = rebuild_txn_index_from {
            for seg in segments.iter().filter(|s| s.base_offset() >= from) {
                seg.reset_txn_index()?;
            }
        }
        if replay_from < log_end_offset {
            let first = segments
                .partition_point(|s| s.base_offset() <= replay_from)
                .saturating_sub(1);
            let partition = topic_partition.to_string();
            let last = segments.len() - 1;
            for (i, seg) in segments.iter().enumerate().skip(first) {
                // Nothing appends while the log opens: a misleading entry is healed at once.
                let found = crate::segment::lookup_healing(
                    seg,
                    &partition,
                    |s| s.translate_offset(replay_from, s.size()),
                    |misled| seg.heal_exclusive(&partition, &misled, i == last),
                )?;
                let start = match found {
                    Some((pos, _)) => pos,
                    None => continue,
                };
                let index_aborts =
                    rebuild_txn_index_from.is_some_and(|from| seg.base_offset() >= from);
                stats.replayed_producer_batches +=
                    replay_segment(seg, start, replay_from, &mut producer_state, index_aborts)?;
            }
        }
        // Completed transactions are stable once the partition's high watermark passes their
        // markers; the partition tells ([`PartitionLog::on_high_watermark_updated`]).
        producer_state.on_log_start_offset_incremented(log_start_offset);
        let first_unstable = producer_state
            .first_unstable_offset()
            .map_or(-1, |o| o.max(log_start_offset));
        let unreplicated = producer_state.has_unreplicated();

        // Only the active segment is written: the others' entries (those recovery or the
        // producer-state replay loaded) go to the index cache, which may drop them.
        for seg in &segments[..segments.len() - 1] {
            seg.set_inactive();
        }
        stats.index_bytes_read = segments.iter().map(|s| s.index_bytes_read()).sum();

        if stats.recovered_segments > 0 && sync_recovered {
            for seg in &segments[recover_from.min(segments.len() - 1)..] {
                seg.flush()?;
            }
        }
        if stats.truncated_bytes > 0 || (sync_recovered && stats.recovered_segments > 0) {
            tracing::info!(
                partition = %topic_partition,
                recovered_segments = stats.recovered_segments,
                recovered_batches = stats.recovered_batches,
                truncated_bytes = stats.truncated_bytes,
                log_end_offset,
                "recovered log"
            );
        }

        // Kafka's LogLoader: after a crash the recovery point stays where the checkpoint had it
        // (never past the log end) unless what recovery rewrote was synced here, so a second
        // crash before the next flush recovers the same records again; nothing has to be
        // synced before the broker serves.
        let recovery_point = if had_clean_shutdown || sync_recovered {
            log_end_offset
        } else {
            recovery_point.unwrap_or(0).clamp(0, log_end_offset)
        };
        let latest_epoch = epoch_cache.latest_epoch().unwrap_or(-1);
        Ok(Self {
            dir: dir.to_path_buf(),
            topic_partition,
            config: RwLock::new(config),
            inner: Mutex::new(Inner {
                segments: segments.clone(),
                producer_state,
                unflushed_messages: 0,
                closed: false,
            }),
            epoch_cache: Mutex::new(epoch_cache),
            segments: RwLock::new(Arc::new(segments)),
            log_end_offset: AtomicI64::new(log_end_offset),
            log_start_offset: AtomicI64::new(log_start_offset),
            recovery_point: AtomicI64::new(recovery_point),
            latest_epoch: AtomicI32::new(latest_epoch),
            last_flush_ms: AtomicI64::new(now_ms),
            flush_lock: Mutex::new(()),
            load_stats: stats,
            maintenance_lock: Mutex::new(()),
            pending_deletes: Mutex::new(Vec::new()),
            cleaner_checkpoint: AtomicI64::new(-1),
            cleaning: std::sync::atomic::AtomicBool::new(false),
            min_delete_horizon_ms: AtomicI64::new(i64::MAX),
            clock,
            truncated_since_flush: std::sync::atomic::AtomicBool::new(false),
            dir_health: std::sync::OnceLock::new(),
            first_unstable_offset: AtomicI64::new(first_unstable),
            unreplicated_txns: std::sync::atomic::AtomicBool::new(unreplicated),
        })
    }

    /// Now on the log's clock, in ms since the Unix epoch.
    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// The partition this log belongs to.
    pub fn topic_partition(&self) -> &TopicPartition {
        &self.topic_partition
    }

    /// The partition directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A copy of the current configuration.
    pub fn config(&self) -> LogConfig {
        self.config.read().clone()
    }

    /// Replaces the configuration (topic config change); takes effect from the next append.
    pub fn update_config(&self, config: LogConfig) {
        *self.config.write() = config;
    }

    /// Attaches the health of the log directory holding this log (the
    /// [`crate::LogManager`] does for every log it opens): from then on appends fail fast
    /// with [`LogError::LogDirOffline`] while the directory is offline, and a failed write
    /// marks it full or failed. A second call is ignored.
    pub fn set_dir_health(&self, health: Arc<LogDirHealth>) {
        let _ = self.dir_health.set(health);
    }

    /// The health of the log directory holding this log, if attached.
    pub fn dir_health(&self) -> Option<&Arc<LogDirHealth>> {
        self.dir_health.get()
    }

    /// Fails fast while the log directory is offline.
    fn ensure_dir_online(&self) -> Result<()> {
        match self.dir_health.get() {
            Some(h) => h.ensure_online(),
            None => Ok(()),
        }
    }

    /// Records a failed write (roll, epoch checkpoint) in the directory's health and returns
    /// the error.
    fn write_failed(&self, e: LogError) -> LogError {
        if let (Some(h), LogError::Io { .. }) = (self.dir_health.get(), &e) {
            h.record_write_error(&e);
        }
        e
    }

    /// What opening the log had to do.
    pub fn load_stats(&self) -> LoadStats {
        self.load_stats
    }

    /// Bytes of `.index` and `.timeindex` files the current segments have read since the log
    /// opened (at open, and each time an inactive segment's indexes are loaded on use or the
    /// last entry of its time index read); [`LoadStats::index_bytes_read`] is the part read at
    /// open.
    pub fn index_bytes_read(&self) -> u64 {
        self.published_segments()
            .iter()
            .map(|s| s.index_bytes_read())
            .sum()
    }

    /// First offset in the log.
    pub fn log_start_offset(&self) -> i64 {
        self.log_start_offset.load(Ordering::Acquire)
    }

    /// Offset the next appended record will get.
    pub fn log_end_offset(&self) -> i64 {
        self.log_end_offset.load(Ordering::Acquire)
    }

    /// Offsets below this are fsynced (Kafka's recovery point).
    pub fn recovery_point(&self) -> i64 {
        self.recovery_point.load(Ordering::Acquire)
    }

    /// The newest leader epoch recorded in `leader-epoch-checkpoint`.
    pub fn latest_leader_epoch(&self) -> Option<i32> {
        let e = self.latest_epoch.load(Ordering::Acquire);
        (e >= 0).then_some(e)
    }

    /// The leader epoch cache, oldest epoch first.
    pub fn leader_epoch_entries(&self) -> Vec<EpochEntry> {
        self.epoch_cache.lock().entries().to_vec()
    }

    /// OffsetForLeaderEpoch (KIP-101, Kafka's `endOffsetForEpoch`): `(epoch, end offset)` for
    /// the largest epoch `<= requested_epoch`; `(-1, -1)` when unknown.
    pub fn end_offset_for_leader_epoch(&self, requested_epoch: i32) -> (i32, i64) {
        let leo = self.log_end_offset();
        self.epoch_cache.lock().end_offset_for(requested_epoch, leo)
    }

    /// Kafka's `UnifiedLog.maybeAssignEpochStartOffset` (KIP-101): a new leader records that
    /// `leader_epoch` starts at `start_offset` (its log end offset) before any record of that
    /// epoch is written, so followers holding entries of a later epoch than any in this log
    /// can still find where to truncate. A no-op when the cache already has this epoch or a
    /// newer one. Persists `leader-epoch-checkpoint`.
    ///
    /// # Errors
    /// The checkpoint write's I/O error.
    pub fn maybe_assign_epoch_start_offset(
        &self,
        leader_epoch: i32,
        start_offset: i64,
    ) -> Result<()> {
        let mut cache = self.epoch_cache.lock();
        if cache.assign(leader_epoch, start_offset, true)? {
            self.latest_epoch.store(leader_epoch, Ordering::Release);
        }
        Ok(())
    }

    /// [`PartitionLog::maybe_assign_epoch_start_offset`] in memory only: the caller writes it
    /// soon after ([`LogManager::write_leader_epoch_checkpoints`](crate::LogManager::write_leader_epoch_checkpoints)
    /// writes those of many logs in parallel), and a flush writes and syncs it before it moves
    /// the recovery point (see there why no `fsync` is needed before).
    pub fn maybe_assign_epoch_start_offset_deferred(&self, leader_epoch: i32, start_offset: i64) {
        let mut cache = self.epoch_cache.lock();
        if cache.assign_deferred(leader_epoch, start_offset) {
            self.latest_epoch.store(leader_epoch, Ordering::Release);
        }
    }

    /// Writes (without `fsync`) the epochs [`PartitionLog::maybe_assign_epoch_start_offset_deferred`]
    /// recorded only in memory.
    ///
    /// # Errors
    /// [`LogError::Io`].
    pub(crate) fn write_pending_leader_epochs(&self) -> Result<()> {
        self.epoch_cache.lock().write_pending()
    }

    /// Whether `leader-epoch-checkpoint` was rewritten without `fsync` since its last sync.
    pub fn leader_epoch_checkpoint_dirty(&self) -> bool {
        self.epoch_cache.lock().is_dirty()
    }

    /// Whether epochs were assigned that `leader-epoch-checkpoint` does not hold yet.
    pub(crate) fn leader_epochs_unwritten(&self) -> bool {
        self.epoch_cache.lock().is_unwritten()
    }

    /// fsyncs `leader-epoch-checkpoint` if it was rewritten without.
    ///
    /// # Errors
    /// [`LogError::Io`].
    pub fn sync_leader_epoch_checkpoint(&self) -> Result<()> {
        self.epoch_cache.lock().sync()
    }

    pub(crate) fn published_segments(&self) -> Arc<Vec<Arc<LogSegment>>> {
        Arc::clone(&self.segments.read())
    }

    /// Total bytes of all segments.
    pub fn size_in_bytes(&self) -> u64 {
        self.published_segments().iter().map(|s| s.size()).sum()
    }

    /// Number of segments.
    pub fn num_segments(&self) -> usize {
        self.published_segments().len()
    }

    /// Sizes in bytes of the segments, in base offset order.
    pub fn segment_sizes(&self) -> Vec<u64> {
        self.published_segments().iter().map(|s| s.size()).collect()
    }

    /// Base offsets of the segments, ascending.
    pub fn segment_base_offsets(&self) -> Vec<i64> {
        self.published_segments()
            .iter()
            .map(|s| s.base_offset())
            .collect()
    }

    /// Validates `records` (whole v2 batches produced by a client), assigns offsets, stamps
    /// `leader_epoch` (and `now_ms` for LogAppendTime topics), and appends them; Kafka's
    /// `UnifiedLog.appendAsLeader`. `now_ms` is the broker clock in ms since the epoch.
    ///
    /// Rolls the active segment first when the append would make it exceed `segment.bytes`,
    /// when `segment.ms` has passed, or when an index is full. Fsyncs when
    /// `flush.messages` records are unflushed.
    ///
    /// # Errors
    /// - [`LogError::InvalidRecord`]: empty, a control batch, or a producer id without a
    ///   sequence;
    /// - [`LogError::Batch`]: bad CRC, magic, lengths, trailing bytes or record count;
    /// - [`LogError::MessageTooLarge`], [`LogError::RecordListTooLarge`];
    /// - [`LogError::InvalidTimestamp`] (CreateTime outside `message.timestamp.*.max.ms`);
    /// - [`LogError::OutOfOrderSequence`], [`LogError::InvalidProducerEpoch`];
    /// - [`LogError::Closed`] after close/delete or an earlier write failure;
    /// - [`LogError::Io`].
    pub fn append_as_leader(
        &self,
        records: &mut [u8],
        leader_epoch: i32,
        now_ms: i64,
    ) -> Result<AppendInfo> {
        self.append_as_leader_from(records, leader_epoch, now_ms, AppendOrigin::Client, None)
    }

    /// [`PartitionLog::append_as_leader`] for `origin` (Kafka's `appendAsLeader` with its
    /// `AppendOrigin` and `VerificationGuard`). A coordinator's batches may be control batches
    /// (transaction markers) and carry no sequence; only a client's are checked for
    /// duplicates and sequences. `verification` is `None` when
    /// `transaction.partition.verification.enable` is off; otherwise a producer's first
    /// transactional batch on this partition must present the guard
    /// [`PartitionLog::maybe_start_transaction_verification`] gave (KIP-890), or the append is
    /// refused with [`LogError::InvalidTxnState`]. A marker completes its producer's
    /// transaction: an ABORT is recorded in the active segment's `.txnindex`, and the last
    /// stable offset moves once the high watermark passes the marker.
    ///
    /// # Errors
    /// As [`PartitionLog::append_as_leader`], plus [`LogError::InvalidTxnState`] and
    /// [`LogError::TransactionCoordinatorFenced`].
    pub fn append_as_leader_from(
        &self,
        records: &mut [u8],
        leader_epoch: i32,
        now_ms: i64,
        origin: AppendOrigin,
        verification: Option<VerificationGuard>,
    ) -> Result<AppendInfo> {
        let config = self.config.read().clone();
        let mut headers = self.analyze_and_validate(records, &config, now_ms, origin)?;
        let mut recompressed;
        let records: &mut [u8] = match recompress(
            records,
            &headers,
            config.compression,
            config.compression_level,
        )? {
            Some(buf) => {
                recompressed = buf;
                headers = Batches::new(&recompressed)
                    .map(|b| b.map(|(_, h)| h))
                    .collect::<std::result::Result<_, _>>()?;
                &mut recompressed[..]
            }
            None => records,
        };

        let mut inner = self.inner.lock();
        if inner.closed {
            return Err(LogError::Closed(self.topic_partition.to_string()));
        }
        self.ensure_dir_online()?;
        let first_offset = self.log_end_offset();
        let mut next = first_offset;
        for h in &mut headers {
            let count = h.next_offset() - h.base_offset;
            h.base_offset = next;
            next += count;
        }
        // Markers are read from the batches as received (offsets do not change them).
        let mut markers = Vec::with_capacity(headers.len());
        let mut at = 0;
        for h in &headers {
            let size = h.total_size();
            markers.push(if h.is_control() && h.has_producer_id() {
                parse_end_txn_marker(h, &records[at..at + size])?
            } else {
                None
            });
            at += size;
        }
        let updated =
            match inner
                .producer_state
                .check_batches(&headers, &markers, origin, verification)?
            {
                ProducerCheck::Duplicate(b) => {
                    return Ok(AppendInfo {
                        first_offset: b.first_offset,
                        last_offset: b.last_offset,
                        log_append_time_ms: if config.message_timestamp_type
                            == TimestampType::LogAppendTime
                        {
                            b.timestamp_ms
                        } else {
                            -1
                        },
                        log_start_offset: self.log_start_offset(),
                        duplicate: true,
                        records: 0,
                        bytes: 0,
                    });
                }
                ProducerCheck::Valid(u) => u,
            };
        let log_append = config.message_timestamp_type == TimestampType::LogAppendTime;
        let mut pos = 0;
        let mut record_count = 0u64;
        for h in &mut headers {
            let size = h.total_size();
            let b = &mut records[pos..pos + size];
            set_base_offset(b, h.base_offset);
            set_partition_leader_epoch(b, leader_epoch);
            if log_append {
                set_log_append_time(b, now_ms);
            }
            *h = BatchHeader::parse(b)?;
            record_count += u64::try_from(h.records_count).unwrap_or(0);
            pos += size;
        }
        let last_offset = next - 1;
        let max_timestamp = headers.iter().map(|h| h.max_timestamp).max().unwrap_or(-1);

        if self.should_roll(
            &inner,
            &config,
            records.len(),
            last_offset,
            max_timestamp,
            now_ms,
        ) {
            self.roll(&mut inner, first_offset, &config, now_ms)
                .map_err(|e| self.write_failed(e))?;
        }
        if leader_epoch >= 0 {
            let mut cache = self.epoch_cache.lock();
            if cache
                .assign(leader_epoch, first_offset, true)
                .map_err(|e| self.write_failed(e))?
            {
                self.latest_epoch.store(leader_epoch, Ordering::Release);
            }
        }
        self.append_to_active_segment(&mut inner, records, &headers, &config)?;
        let aborted = inner.producer_state.commit(updated);
        debug_assert!(next > self.log_end_offset());
        self.log_end_offset.store(next, Ordering::Release);
        self.index_aborted_txns(&mut inner, &aborted)?;
        inner.unflushed_messages += record_count;
        let flush_now = inner.unflushed_messages >= config.flush_interval_messages;
        drop(inner);
        if flush_now {
            self.flush()?;
        }
        Ok(AppendInfo {
            first_offset,
            last_offset,
            log_append_time_ms: if log_append { now_ms } else { -1 },
            log_start_offset: self.log_start_offset(),
            duplicate: false,
            records: record_count,
            bytes: records.len() as u64,
        })
    }

    /// Records `aborted` (transactions an append's ABORT markers ended) in the active
    /// segment's transaction index, then publishes the first unstable offset. Kafka appends
    /// the entries after the batches too: an entry that fails to be written after its marker
    /// is rebuilt by recovery (the directory is failed, as for any other write error).
    fn index_aborted_txns(&self, inner: &mut Inner, aborted: &[AbortedTxn]) -> Result<()> {
        let result = match inner.segments.last() {
            Some(active) => aborted
                .iter()
                .try_for_each(|a| active.append_aborted_txn(a)),
            None => Ok(()),
        };
        self.publish_txn_state(inner);
        if let Err(e) = result {
            tracing::error!(partition = %self.topic_partition, error = %e,
                "writing the transaction index failed; refusing further appends to this log");
            inner.closed = true;
            return Err(self.write_failed(e));
        }
        Ok(())
    }

    /// Publishes producer state's first unstable offset (never below the log start offset).
    fn publish_txn_state(&self, inner: &Inner) {
        let first = inner
            .producer_state
            .first_unstable_offset()
            .map_or(-1, |o| o.max(self.log_start_offset()));
        self.first_unstable_offset.store(first, Ordering::Release);
        self.unreplicated_txns
            .store(inner.producer_state.has_unreplicated(), Ordering::Release);
    }

    /// The first unstable offset (Kafka's `firstUnstableOffset`): the first offset of the
    /// earliest open transaction, or of the earliest completed one whose marker the high
    /// watermark has not passed; `None` when there is neither.
    pub fn first_unstable_offset(&self) -> Option<i64> {
        let o = self.first_unstable_offset.load(Ordering::Acquire);
        (o >= 0).then_some(o)
    }

    /// Kafka's `UnifiedLog.lastStableOffset`: the first unstable offset if it is below
    /// `high_watermark`, else `high_watermark`. read_committed consumers read below it
    /// (KIP-98).
    pub fn last_stable_offset(&self, high_watermark: i64) -> i64 {
        match self.first_unstable_offset() {
            Some(o) if o < high_watermark => o,
            _ => high_watermark,
        }
    }

    /// Kafka's `ProducerStateManager.onHighWatermarkUpdated`: the partition's high watermark
    /// is now `high_watermark`; completed transactions whose markers are below it become
    /// stable (the LSO may move). Cheap when none waits.
    pub fn on_high_watermark_updated(&self, high_watermark: i64) {
        if !self.unreplicated_txns.load(Ordering::Acquire) {
            return;
        }
        let mut inner = self.inner.lock();
        inner
            .producer_state
            .on_high_watermark_updated(high_watermark);
        self.publish_txn_state(&inner);
    }

    /// Kafka's `UnifiedLog.maybeStartTransactionVerification` (KIP-890): the sentinel when
    /// `producer_id` already has an open transaction of `producer_epoch` here (its writes need
    /// no verification), else the guard its first transactional write must present once the
    /// transaction coordinator confirmed the partition is part of its transaction. `sequence`
    /// is the batch's base sequence; `supports_epoch_bump` is true for transaction.version 2
    /// producers (Produce v12+), whose next transaction's guard survives the marker of the
    /// previous one written with the bumped epoch (KAFKA-18654).
    ///
    /// # Errors
    /// [`LogError::InvalidProducerEpoch`] (INVALID_PRODUCER_EPOCH) when `producer_epoch` is
    /// older than the producer's epoch here.
    pub fn maybe_start_transaction_verification(
        &self,
        producer_id: i64,
        sequence: i32,
        producer_epoch: i16,
        supports_epoch_bump: bool,
    ) -> Result<VerificationGuard> {
        self.inner.lock().producer_state.maybe_start_verification(
            producer_id,
            sequence,
            producer_epoch,
            supports_epoch_bump,
            self.clock.now_ms(),
        )
    }

    /// Appends a transaction marker for `producer_id` (Kafka's WriteTxnMarkers path:
    /// `MemoryRecords.withEndTransactionMarker` appended with origin COORDINATOR): a control
    /// batch of one record with `marker`'s type and coordinator epoch, the producer's id and
    /// `producer_epoch`, stamped `now_ms`. The producer's open transaction completes (an
    /// ABORT is recorded in the `.txnindex`); a producer with no open transaction here gets
    /// the marker too, as in Kafka.
    ///
    /// # Errors
    /// [`LogError::InvalidProducerEpoch`] for an epoch older than the producer's,
    /// [`LogError::TransactionCoordinatorFenced`] for a coordinator epoch older than its last
    /// marker's; the append's other errors.
    pub fn append_txn_marker(
        &self,
        producer_id: i64,
        producer_epoch: i16,
        marker: EndTxnMarker,
        leader_epoch: i32,
        now_ms: i64,
    ) -> Result<AppendInfo> {
        let mut batch = end_txn_marker_batch(producer_id, producer_epoch, marker, now_ms);
        self.append_as_leader_from(
            &mut batch,
            leader_epoch,
            now_ms,
            AppendOrigin::Coordinator,
            None,
        )
    }

    /// Kafka's `LocalLog.collectAbortedTransactions`: the aborted transactions overlapping
    /// `[fetch_offset, upper_bound_offset)`, from the transaction indexes of the segment
    /// holding `fetch_offset` and the later ones, until an entry's last stable offset
    /// reaches the bound (what a read_committed fetch returns as `AbortedTransactions`).
    ///
    /// # Errors
    /// [`LogError::Io`], [`LogError::CorruptFile`] for an unreadable `.txnindex`.
    pub fn collect_aborted_transactions(
        &self,
        fetch_offset: i64,
        upper_bound_offset: i64,
    ) -> Result<Vec<AbortedTxn>> {
        let segments = self.published_segments();
        let first = segments
            .partition_point(|s| s.base_offset() <= fetch_offset)
            .saturating_sub(1);
        let mut out = Vec::new();
        for seg in &segments[first..] {
            if seg.collect_aborted_txns(fetch_offset, upper_bound_offset, &mut out)? {
                break;
            }
        }
        Ok(out)
    }

    /// Every segment's aborted transactions, by segment base offset (tests, tools).
    ///
    /// # Errors
    /// As [`PartitionLog::collect_aborted_transactions`].
    pub fn aborted_transactions_by_segment(&self) -> Result<Vec<(i64, Vec<AbortedTxn>)>> {
        self.published_segments()
            .iter()
            .map(|s| Ok((s.base_offset(), s.aborted_txns()?)))
            .collect()
    }

    /// The producers this partition knows, by id (DescribeProducers, KIP-664).
    pub fn producer_summaries(&self) -> Vec<ProducerSummary> {
        self.inner.lock().producer_state.summaries()
    }

    /// Appends `records` (described by `headers`) to the active segment. A write that fails for
    /// lack of space (ENOSPC, EDQUOT) is rolled back ([`LogSegment::append`]) and the log stays
    /// open: the directory is marked full and the next append after it has room again
    /// succeeds. Any other failure, or a rollback that failed, closes the log to further
    /// appends until a restart (the segment may hold part of the batch, and only recovery on
    /// the next open may decide what of it stays) and marks the directory failed.
    ///
    /// # Errors
    /// [`LogError::Closed`] when there is no segment, or the segment's write error.
    fn append_to_active_segment(
        &self,
        inner: &mut Inner,
        records: &[u8],
        headers: &[BatchHeader],
        config: &LogConfig,
    ) -> Result<()> {
        let active = Arc::clone(
            inner
                .segments
                .last()
                .ok_or_else(|| LogError::Closed(self.topic_partition.to_string()))?,
        );
        match active.append(records, headers, config.index_interval_bytes) {
            Ok(()) => Ok(()),
            Err(SegmentAppendError {
                error,
                rolled_back: true,
            }) if error.is_out_of_space() => {
                tracing::debug!(partition = %self.topic_partition, error = %error,
                    "append failed for lack of space and was rolled back");
                if let Some(h) = self.dir_health.get() {
                    h.record_write_error(&error);
                }
                Err(error)
            }
            // Out of descriptors (clients can open connections until the process limit): the
            // append failed alone and left nothing; the disk is fine, so neither the log nor
            // its directory goes out of service. Kafka keeps every segment open and cannot
            // meet this on append.
            Err(SegmentAppendError {
                error,
                rolled_back: true,
            }) if error.is_out_of_descriptors() => {
                // Clients retry at once, so this can repeat thousands of times a second: one
                // line per 10 s, with how many were not logged.
                static LAST_WARN_MS: AtomicI64 = AtomicI64::new(i64::MIN);
                static SUPPRESSED: AtomicU64 = AtomicU64::new(0);
                let now = self.clock.now_ms();
                let last = LAST_WARN_MS.load(Ordering::Relaxed);
                if now.saturating_sub(last) >= 10_000
                    && LAST_WARN_MS
                        .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                        .is_ok()
                {
                    tracing::warn!(partition = %self.topic_partition, error = %error,
                        suppressed = SUPPRESSED.swap(0, Ordering::Relaxed),
                        "append failed for lack of file descriptors and was rolled back (the log and its directory stay in service); raise the open-file limit or lower max.connections");
                } else {
                    SUPPRESSED.fetch_add(1, Ordering::Relaxed);
                }
                Err(error)
            }
            Err(SegmentAppendError { error, rolled_back }) => {
                tracing::error!(partition = %self.topic_partition, error = %error, rolled_back,
                    "append failed; refusing further appends to this log");
                inner.closed = true;
                if let Some(h) = self.dir_health.get() {
                    if rolled_back {
                        h.record_write_error(&error);
                    } else {
                        h.record_write_error(&LogError::Io {
                            context: format!("rolling back a failed append ({error})"),
                            source: std::io::Error::other("the segment may hold a partial batch"),
                        });
                    }
                }
                Err(error)
            }
        }
    }

    /// Kafka's `analyzeAndValidateRecords` plus the client checks of `LogValidator`.
    fn analyze_and_validate(
        &self,
        records: &[u8],
        config: &LogConfig,
        now_ms: i64,
        origin: AppendOrigin,
    ) -> Result<Vec<BatchHeader>> {
        if records.is_empty() {
            return Err(LogError::InvalidRecord(
                "produce request has no record batch for the partition".into(),
            ));
        }
        if records.len() as u64 > config.segment_bytes {
            return Err(LogError::RecordListTooLarge {
                size_bytes: records.len(),
                segment_bytes: config.segment_bytes,
            });
        }
        let mut headers = Vec::new();
        let mut pos = 0;
        while pos < records.len() {
            let rest = &records[pos..];
            let h = BatchHeader::parse(rest)?;
            if let Some(size) = checked_total_size(&h) {
                if size > config.max_message_bytes {
                    return Err(LogError::MessageTooLarge {
                        size_bytes: size,
                        max_bytes: config.max_message_bytes,
                    });
                }
            }
            let h = validate_batch(rest)?;
            let client = origin == AppendOrigin::Client;
            if client && h.is_control() {
                return Err(LogError::InvalidRecord(format!(
                    "Clients are not allowed to write control records in topic partition {}",
                    self.topic_partition
                )));
            }
            // Kafka's `LogValidator` iterates every record of every batch a client sends: the
            // header's count must match the records, each must decode, and offset deltas must
            // increase (a compressed batch is decompressed, at most
            // DEFAULT_MAX_DECOMPRESSED_BYTES, to check it). Without this a batch claiming
            // 2^31 - 1 records with one inside moved the log end offset by 2^31 - 1, and a
            // gzip batch of garbage was stored and broke every consumer of the partition.
            let mut record_errors = Vec::new();
            let mut invalid_timestamp = false;
            inspect_validated_records_bounded(
                &rest[..h.total_size()],
                DEFAULT_MAX_DECOMPRESSED_BYTES,
                |r| {
                    if let Some((is_timestamp, message)) = self.record_error(&h, &r, config, now_ms)
                    {
                        invalid_timestamp |= is_timestamp;
                        record_errors.push(RecordError {
                            batch_index: i32::try_from(r.index).unwrap_or(i32::MAX),
                            message,
                        });
                    }
                },
            )?;
            if client && h.has_producer_id() && h.base_sequence < 0 {
                return Err(LogError::InvalidRecord(format!(
                    "Invalid sequence number {} in record batch with producerId {} in topic partition {}",
                    h.base_sequence, h.producer_id, self.topic_partition
                )));
            }
            if !record_errors.is_empty() {
                return Err(record_validation_error(invalid_timestamp, record_errors));
            }
            pos += h.total_size();
            headers.push(h);
        }
        Ok(headers)
    }

    /// Kafka's `LogValidator.validateRecord` for one record of a client's v2 batch `h`: a
    /// compacted topic needs a key; with CreateTime a timestamp (other than -1) must lie within
    /// `message.timestamp.before.max.ms` before and `message.timestamp.after.max.ms` after
    /// `now_ms`; a producer may not set LogAppendTime. Returns whether it is a timestamp error,
    /// and Kafka's message, for the first rule the record breaks.
    fn record_error(
        &self,
        h: &BatchHeader,
        r: &RecordView,
        config: &LogConfig,
        now_ms: i64,
    ) -> Option<(bool, String)> {
        if config.cleanup_compact && r.key_len.is_none() {
            return Some((
                false,
                format!(
                    "Compacted topic cannot accept message without key in topic partition {}",
                    self.topic_partition
                ),
            ));
        }
        // Java's `DefaultRecord.timestamp()`: a LogAppendTime batch's records all carry its
        // max timestamp. Arithmetic wraps as Java's longs do.
        let batch_log_append = h.timestamp_type() == TimestampType::LogAppendTime;
        let timestamp = if batch_log_append {
            h.max_timestamp
        } else {
            h.base_timestamp.wrapping_add(r.timestamp_delta)
        };
        let offset = h.base_offset.wrapping_add(i64::from(r.offset_delta));
        if config.message_timestamp_type == TimestampType::CreateTime && timestamp != -1 {
            let diff = now_ms.wrapping_sub(timestamp);
            if diff > config.message_timestamp_before_max_ms
                || diff.wrapping_neg() > config.message_timestamp_after_max_ms
            {
                return Some((
                    true,
                    format!(
                        "Timestamp {timestamp} of message with offset {offset} is out of range. The timestamp should be within [{}, {}]",
                        now_ms.wrapping_sub(config.message_timestamp_before_max_ms),
                        now_ms.wrapping_add(config.message_timestamp_after_max_ms)
                    ),
                ));
            }
        } else if batch_log_append {
            let len = |l: Option<usize>| l.map_or(-1, |l| i64::try_from(l).unwrap_or(i64::MAX));
            return Some((
                true,
                format!(
                    "Invalid timestamp type in message DefaultRecord(offset={offset}, timestamp={timestamp}, key={} bytes, value={} bytes). Producer should not set timestamp type to LogAppendTime.",
                    len(r.key_len),
                    len(r.value_len)
                ),
            ));
        }
        None
    }

    /// Kafka's `LogSegment.shouldRoll`.
    fn should_roll(
        &self,
        inner: &Inner,
        config: &LogConfig,
        append_bytes: usize,
        last_offset: i64,
        max_timestamp_ms: i64,
        now_ms: i64,
    ) -> bool {
        let Some(active) = inner.segments.last() else {
            return false;
        };
        let size = active.size();
        if size == 0 {
            return false;
        }
        // Index positions are 32-bit: Kafka caps segment.bytes at Int.MaxValue.
        let segment_bytes = config.segment_bytes.min(i32::MAX as u64);
        size + append_bytes as u64 > segment_bytes
            || active.time_waited_for_roll_ms(now_ms, max_timestamp_ms) > config.segment_ms
            || active.indexes_full()
            || !active.can_convert_to_relative_offset(last_offset)
    }

    fn roll(
        &self,
        inner: &mut Inner,
        new_base: i64,
        config: &LogConfig,
        now_ms: i64,
    ) -> Result<()> {
        if let Some(active) = inner.segments.last() {
            active.on_become_inactive()?;
        }
        let seg = match LogSegment::create(
            &self.dir,
            new_base,
            config.segment_index_bytes,
            config.index_interval_bytes,
            now_ms,
        ) {
            Ok(seg) => Arc::new(seg),
            Err(e) => {
                // A roll that could not create the new segment (a full disk) leaves the old
                // active segment active: remove what was created.
                if let Err(cleanup) = delete_segment_files(&self.dir, new_base) {
                    tracing::warn!(partition = %self.topic_partition, error = %cleanup,
                        "could not remove the files of a segment that failed to roll");
                }
                return Err(e);
            }
        };
        if let Some(old) = inner.segments.last() {
            // Its indexes are never written again: give their descriptors back now, and their
            // entries to the index cache.
            old.set_inactive();
        }
        inner.segments.push(seg);
        *self.segments.write() = Arc::new(inner.segments.clone());
        tracing::debug!(partition = %self.topic_partition, base_offset = new_base, "rolled segment");
        if let Err(e) = inner.producer_state.take_snapshot(new_base, false) {
            tracing::warn!(partition = %self.topic_partition, error = %e,
                "could not write producer snapshot at roll; it will be rebuilt from the log");
        }
        Ok(())
    }

    /// Appends batches that already carry their offsets and partition leader epochs (Kafka's
    /// `UnifiedLog.appendAsFollower`; the KRaft metadata log also appends its leader's own
    /// batches this way, as they are built at the log end offset). Every batch is validated
    /// (CRC, lengths), must start where the previous one ends, the first at the log end
    /// offset; control batches are allowed. A batch with a partition leader epoch newer than
    /// the latest one starts that epoch in `leader-epoch-checkpoint`. Rolls the active segment
    /// as [`PartitionLog::append_as_leader`] does. Nothing is fsynced: call
    /// [`PartitionLog::flush`].
    ///
    /// # Errors
    /// [`LogError::Batch`] for a malformed batch or trailing bytes, [`LogError::InvalidRecord`]
    /// for no batch or offsets that do not follow the log end offset,
    /// [`LogError::RecordListTooLarge`], [`LogError::Closed`], [`LogError::Io`]; nothing is
    /// appended on error.
    pub fn append_as_follower(&self, records: &[u8], now_ms: i64) -> Result<AppendInfo> {
        let config = self.config.read().clone();
        if records.len() as u64 > config.segment_bytes {
            return Err(LogError::RecordListTooLarge {
                size_bytes: records.len(),
                segment_bytes: config.segment_bytes,
            });
        }
        let mut inner = self.inner.lock();
        if inner.closed {
            return Err(LogError::Closed(self.topic_partition.to_string()));
        }
        self.ensure_dir_online()?;
        let first_offset = self.log_end_offset();
        let mut headers = Vec::new();
        let mut markers = Vec::new();
        let mut next = first_offset;
        let mut pos = 0;
        while pos < records.len() {
            let h = validate_batch(&records[pos..])?;
            markers.push(if h.is_control() && h.has_producer_id() {
                parse_marker_or_warn(&h, &records[pos..pos + h.total_size()])
            } else {
                None
            });
            if h.base_offset != next {
                return Err(LogError::InvalidRecord(format!(
                    "batch at offset {} does not follow offset {next}",
                    h.base_offset
                )));
            }
            next = h.next_offset();
            pos += h.total_size();
            headers.push(h);
        }
        if headers.is_empty() {
            return Err(LogError::InvalidRecord("no record batch to append".into()));
        }
        let last_offset = next - 1;
        let max_timestamp = headers.iter().map(|h| h.max_timestamp).max().unwrap_or(-1);
        if self.should_roll(
            &inner,
            &config,
            records.len(),
            last_offset,
            max_timestamp,
            now_ms,
        ) {
            self.roll(&mut inner, first_offset, &config, now_ms)
                .map_err(|e| self.write_failed(e))?;
        }
        {
            let mut cache = self.epoch_cache.lock();
            let mut changed = false;
            for h in &headers {
                changed |= cache.assign(h.partition_leader_epoch, h.base_offset, false)?;
            }
            if changed {
                cache.persist(true).map_err(|e| self.write_failed(e))?;
                if let Some(latest) = cache.latest_epoch() {
                    self.latest_epoch.store(latest, Ordering::Release);
                }
            }
        }
        self.append_to_active_segment(&mut inner, records, &headers, &config)?;
        let mut record_count = 0u64;
        // Kafka's append with origin REPLICATION: producer state follows the leader's batches
        // unchecked, and ABORT markers are indexed here as on the leader.
        let mut aborted = Vec::new();
        for (h, marker) in headers.iter().zip(markers) {
            if let Some(c) = inner.producer_state.replay(h, marker) {
                if let Some(a) = inner.producer_state.aborted_entry(&c) {
                    aborted.push(a);
                }
                inner.producer_state.complete_txn(&c);
            }
            record_count += u64::try_from(h.next_offset() - h.base_offset).unwrap_or(0);
        }
        debug_assert!(next > self.log_end_offset());
        self.log_end_offset.store(next, Ordering::Release);
        self.index_aborted_txns(&mut inner, &aborted)?;
        inner.unflushed_messages += record_count;
        Ok(AppendInfo {
            first_offset,
            last_offset,
            log_append_time_ms: -1,
            log_start_offset: self.log_start_offset(),
            duplicate: false,
            records: record_count,
            bytes: records.len() as u64,
        })
    }

    /// Kafka's `UnifiedLog.truncateTo`: removes every batch holding an offset `>= offset` (the
    /// batch containing `offset` goes whole), deleting the segments that start above it, and
    /// drops the leader epochs that start at or after the new log end offset. Returns the new
    /// log end offset. The truncation is durable after the next [`PartitionLog::flush`], which
    /// fsyncs the truncated segment and the directory.
    ///
    /// # Errors
    /// [`LogError::OffsetOutOfRange`] below the log start offset, [`LogError::Closed`],
    /// [`LogError::Io`].
    pub fn truncate_to(&self, offset: i64) -> Result<i64> {
        let _maintenance = self.maintenance_lock.lock();
        let mut inner = self.inner.lock();
        if inner.closed {
            return Err(LogError::Closed(self.topic_partition.to_string()));
        }
        let log_end_offset = self.log_end_offset();
        if offset >= log_end_offset {
            // Nothing to remove from the segments, but the epoch cache may end with an epoch
            // that starts at the log end offset and has no record: this broker became leader
            // and lost leadership before appending. Kafka's `UnifiedLog.truncateTo` always
            // truncates the cache for this reason; a follower that kept such an entry would
            // send it as LastFetchedEpoch, be told to truncate to where it already is, and
            // never fetch again (found by the replication simulator).
            let mut cache = self.epoch_cache.lock();
            cache.truncate_from_end(log_end_offset)?;
            self.latest_epoch
                .store(cache.latest_epoch().unwrap_or(-1), Ordering::Release);
            return Ok(log_end_offset);
        }
        let log_start_offset = self.log_start_offset();
        if offset < log_start_offset {
            return Err(LogError::OffsetOutOfRange {
                offset,
                log_start_offset,
                log_end_offset,
            });
        }
        let config = self.config.read().clone();
        // Keep the segments starting at or below `offset`; at least the first one.
        let keep = inner
            .segments
            .partition_point(|s| s.base_offset() <= offset)
            .max(1);
        let removed: Vec<_> = inner.segments.drain(keep..).collect();
        for seg in &removed {
            // Readers still holding the segment read what they loaded the size of.
            seg.pin_for_deletion()?;
            delete_segment_files(&self.dir, seg.base_offset())?;
        }
        let active = Arc::clone(
            inner
                .segments
                .last()
                .ok_or_else(|| LogError::Closed(self.topic_partition.to_string()))?,
        );
        let new_end = active.truncate_to(
            offset,
            config.index_interval_bytes,
            &self.topic_partition.to_string(),
        )?;
        *self.segments.write() = Arc::new(inner.segments.clone());
        self.log_end_offset.store(new_end, Ordering::Release);
        self.recovery_point.fetch_min(new_end, Ordering::AcqRel);
        {
            let mut cache = self.epoch_cache.lock();
            cache.truncate_from_end(new_end)?;
            self.latest_epoch
                .store(cache.latest_epoch().unwrap_or(-1), Ordering::Release);
        }
        let mut producer_state = ProducerStateManager::new(&self.dir);
        for snap in producer_state.list_snapshots()? {
            if snap > new_end {
                producer_state.delete_snapshot(snap)?;
            }
        }
        // Producer state after a truncation: rebuilt from the headers (and markers) that
        // remain; the truncated segment's transaction index lost the entries of the markers
        // cut ([`LogSegment::truncate_to`]).
        for seg in inner.segments.iter() {
            replay_segment(seg, 0, i64::MIN, &mut producer_state, false)?;
        }
        inner.producer_state = producer_state;
        self.publish_txn_state(&inner);
        self.truncated_since_flush.store(true, Ordering::Release);
        tracing::info!(partition = %self.topic_partition, offset, log_end_offset = new_end,
            "truncated log");
        Ok(new_end)
    }

    /// Kafka's `UnifiedLog.truncateFullyAndStartAt`: removes every segment and starts an empty
    /// log at `new_offset`, which becomes both the log start and the log end offset. The leader
    /// epoch cache and producer state are cleared. A follower does this when its log end offset
    /// is below the leader's log start offset (its data is all stale, Kafka's
    /// `AbstractFetcherThread.fetchOffsetAndTruncate`). Durable after the next
    /// [`PartitionLog::flush`], as [`PartitionLog::truncate_to`].
    ///
    /// # Errors
    /// [`LogError::InvalidRecord`] for a negative offset, [`LogError::Closed`],
    /// [`LogError::Io`].
    pub fn truncate_fully_and_start_at(&self, new_offset: i64, now_ms: i64) -> Result<()> {
        if new_offset < 0 {
            return Err(LogError::InvalidRecord(format!(
                "cannot start the log at negative offset {new_offset}"
            )));
        }
        let _maintenance = self.maintenance_lock.lock();
        let mut inner = self.inner.lock();
        if inner.closed {
            return Err(LogError::Closed(self.topic_partition.to_string()));
        }
        let config = self.config.read().clone();
        let removed: Vec<_> = inner.segments.drain(..).collect();
        for seg in &removed {
            seg.mark_deleted();
            delete_segment_files(&self.dir, seg.base_offset())?;
        }
        let seg = Arc::new(LogSegment::create(
            &self.dir,
            new_offset,
            config.segment_index_bytes,
            config.index_interval_bytes,
            now_ms,
        )?);
        inner.segments.push(seg);
        *self.segments.write() = Arc::new(inner.segments.clone());
        self.log_end_offset.store(new_offset, Ordering::Release);
        self.log_start_offset.store(new_offset, Ordering::Release);
        self.recovery_point.store(new_offset, Ordering::Release);
        {
            let mut cache = self.epoch_cache.lock();
            cache.clear()?;
            self.latest_epoch.store(-1, Ordering::Release);
        }
        let producer_state = ProducerStateManager::new(&self.dir);
        for snap in producer_state.list_snapshots()? {
            producer_state.delete_snapshot(snap)?;
        }
        inner.producer_state = producer_state;
        self.publish_txn_state(&inner);
        self.truncated_since_flush.store(true, Ordering::Release);
        tracing::info!(partition = %self.topic_partition, offset = new_offset,
            "truncated the whole log and started it at a new offset");
        Ok(())
    }

    /// Reads whole batches starting with the one containing `fetch_offset`, up to `max_bytes`
    /// in total, only batches entirely below `max_offset` (exclusive; the high watermark or
    /// last stable offset), from one segment. With `min_one_batch` (KIP-74) the first batch is
    /// returned whole even when larger than `max_bytes`. Takes no append lock.
    ///
    /// Returns empty records when `fetch_offset` is the log end offset or `>= max_offset`.
    ///
    /// # Errors
    /// [`LogError::OffsetOutOfRange`] outside `[log_start_offset, log_end_offset]`;
    /// [`LogError::Io`] / [`LogError::CorruptFile`] for unreadable segments.
    pub fn read(
        &self,
        fetch_offset: i64,
        max_bytes: usize,
        max_offset: i64,
        min_one_batch: bool,
    ) -> Result<ReadInfo> {
        let (range, log_start_offset, log_end_offset) =
            self.fetch_range(fetch_offset, max_bytes, max_offset, min_one_batch)?;
        let records = match range {
            None => Bytes::new(),
            Some(r) => Bytes::from(r.read_whole_batches()?.0),
        };
        Ok(ReadInfo {
            records,
            log_start_offset,
            log_end_offset,
        })
    }

    /// [`PartitionLog::read`] for a Fetch response: the same batches, returned in memory
    /// ([`FetchRecords::Memory`]) or, with `from_file`, as a range of the segment file that
    /// the response sends from the descriptor without copying it ([`FetchRecords::File`],
    /// pinning the file until the response is dropped, see [`crate::files::SendPin`]). The
    /// range is found from the batch headers (the offset index gives the first, the others are
    /// read one by one, or a chunk at a time when they are small), by the rule the copying
    /// read applies to the bytes it read, so both return the same bytes. A range that the
    /// header reads covered whole, or one for which no pin is free, comes back in memory.
    ///
    /// # Errors
    /// As [`PartitionLog::read`].
    pub fn read_for_fetch(
        &self,
        fetch_offset: i64,
        max_bytes: usize,
        max_offset: i64,
        min_one_batch: bool,
        from_file: bool,
    ) -> Result<FetchReadInfo> {
        let (range, log_start_offset, log_end_offset) =
            self.fetch_range(fetch_offset, max_bytes, max_offset, min_one_batch)?;
        let (records, record_count) = match range {
            None => (FetchRecords::Memory(Bytes::new()), 0),
            Some(r) if !from_file => {
                let (bytes, count) = r.read_whole_batches()?;
                (FetchRecords::Memory(Bytes::from(bytes)), count)
            }
            Some(r) => r.file_or_memory()?,
        };
        Ok(FetchReadInfo {
            records,
            record_count,
            log_start_offset,
            log_end_offset,
        })
    }

    /// Where a read of [`PartitionLog::read`] looks: the segment holding `fetch_offset`, the
    /// first batch's position and header, how far the read may look (`max_bytes`, or the first
    /// batch whole with `min_one_batch`, KIP-74, within the segment's published size) and the
    /// exclusive upper offset. `None` when there is nothing to return. Also the log start and
    /// end offsets as of the read.
    fn fetch_range(
        &self,
        fetch_offset: i64,
        max_bytes: usize,
        max_offset: i64,
        min_one_batch: bool,
    ) -> Result<(Option<FetchRange>, i64, i64)> {
        let log_end_offset = self.log_end_offset();
        let segments = self.published_segments();
        let log_start_offset = self.log_start_offset();
        if fetch_offset < log_start_offset || fetch_offset > log_end_offset {
            return Err(LogError::OffsetOutOfRange {
                offset: fetch_offset,
                log_start_offset,
                log_end_offset,
            });
        }
        let upper = max_offset.min(log_end_offset);
        if fetch_offset >= upper {
            return Ok((None, log_start_offset, log_end_offset));
        }
        let first = segments
            .partition_point(|s| s.base_offset() <= fetch_offset)
            .saturating_sub(1);
        for seg in &segments[first..] {
            // Read before the bytes are chosen, so a truncation after it is seen by a
            // response that sends them from the file.
            let truncations = seg.truncations();
            let end = seg.size();
            let Some((pos, h)) = self.lookup(seg, |s| s.translate_offset(fetch_offset, end))?
            else {
                continue;
            };
            if h.last_offset() >= upper {
                return Ok((None, log_start_offset, log_end_offset));
            }
            let first_size = h.total_size();
            let want = if min_one_batch {
                max_bytes.max(first_size)
            } else {
                max_bytes
            };
            if first_size > want {
                return Ok((None, log_start_offset, log_end_offset));
            }
            let len = (want as u64).min(end - pos) as usize;
            let range = FetchRange {
                segment: Arc::clone(seg),
                position: pos,
                first: h,
                len,
                upper,
                truncations,
            };
            return Ok((Some(range), log_start_offset, log_end_offset));
        }
        Ok((None, log_start_offset, log_end_offset))
    }

    /// ListOffsets by timestamp: the first record (by offset) whose timestamp is
    /// `>= target_ms`, found through the first segment whose max timestamp reaches the target,
    /// its time index, its offset index, then a header walk and one batch decode. `None` when
    /// no record is that new.
    ///
    /// # Errors
    /// [`LogError::Io`] or [`LogError::CorruptFile`] for unreadable segments.
    pub fn fetch_offset_by_timestamp(&self, target_ms: i64) -> Result<Option<TimestampAndOffset>> {
        let segments = self.published_segments();
        let mut found_seg = None;
        for s in segments.iter() {
            if s.max_timestamp()?.timestamp_ms < target_ms {
                continue;
            }
            // Loads and checks the indexes, which may correct a max timestamp read from the
            // time index's last entry alone.
            s.load_indexes()?;
            if s.max_timestamp()?.timestamp_ms >= target_ms {
                found_seg = Some(s);
                break;
            }
        }
        let Some(seg) = found_seg else {
            return Ok(None);
        };
        let end = seg.size();
        let Some((pos, h)) = self.lookup(seg, |s| s.find_timestamp(target_ms, end))? else {
            return Ok(None);
        };
        self.find_in_batch(seg, pos, &h, |ts| ts >= target_ms)
    }

    /// ListOffsets `-3` (KIP-734): the record with the largest timestamp, the earliest one if
    /// several share it. `None` when no record has a timestamp.
    ///
    /// # Errors
    /// As [`PartitionLog::fetch_offset_by_timestamp`].
    pub fn max_timestamp_and_offset(&self) -> Result<Option<TimestampAndOffset>> {
        let segments = self.published_segments();
        let (seg, max) = loop {
            let mut best: Option<(&Arc<LogSegment>, TimestampOffset)> = None;
            for s in segments.iter() {
                let max = s.max_timestamp()?;
                if best.is_none_or(|(_, b)| max.timestamp_ms > b.timestamp_ms) {
                    best = Some((s, max));
                }
            }
            let Some((seg, max)) = best else {
                return Ok(None);
            };
            // The max may come from the time index's last entry alone: load and check the
            // indexes, and look again if that corrected it (each pass corrects a segment).
            seg.load_indexes()?;
            if seg.max_timestamp()? == max {
                break (seg, max);
            }
        };
        if max.timestamp_ms < 0 {
            return Ok(None);
        }
        let end = seg.size();
        let Some((pos, h)) = self.lookup(seg, |s| s.translate_offset(max.offset, end))? else {
            return Ok(None);
        };
        let found = self.find_in_batch(seg, pos, &h, |ts| ts == max.timestamp_ms)?;
        Ok(found.or(Some(TimestampAndOffset {
            timestamp_ms: max.timestamp_ms,
            offset: max.offset,
            leader_epoch: (h.partition_leader_epoch >= 0).then_some(h.partition_leader_epoch),
        })))
    }

    /// Runs the index lookup `f` on `seg`, healing the segment's indexes when an entry
    /// misleads it ([`PartitionLog::heal_indexes`]) and trying again.
    ///
    /// # Errors
    /// `f`'s errors; [`LogError::CorruptFile`] when the indexes still mislead after a rebuild;
    /// [`LogError::Io`] when a rebuild cannot read the log or write the index files.
    fn lookup<T>(
        &self,
        seg: &Arc<LogSegment>,
        f: impl FnMut(&LogSegment) -> Result<Lookup<T>>,
    ) -> Result<T> {
        // The partition's name is formatted only when something went wrong: lookups are on
        // the fetch path.
        crate::segment::lookup_healing(seg, &self.topic_partition, f, |misled| {
            self.heal_indexes(seg, &self.topic_partition.to_string(), &misled)
        })
    }

    /// Rebuilds `seg`'s indexes from its log after an entry misled a read, once per segment
    /// (see [`LogSegment::heal_exclusive`]). Readers misled at once wait for the one that
    /// rebuilds. An inactive segment is rebuilt without the append lock. The active one is
    /// scanned up to its published size without it, then the append lock is taken only to
    /// scan what was appended meanwhile and install the entries, so appends wait for no more
    /// than that.
    ///
    /// # Errors
    /// As [`LogSegment::heal_exclusive`].
    fn heal_indexes(&self, seg: &Arc<LogSegment>, partition: &str, misled: &Misled) -> Result<()> {
        let _heal = seg.heal_guard();
        let maybe_active = self
            .published_segments()
            .last()
            .is_some_and(|a| Arc::ptr_eq(a, seg));
        if !maybe_active {
            // Only the last segment is appended to; one that is not last never becomes it
            // again but by a truncation, which holds the append lock and recovers it.
            return seg.heal_exclusive(partition, misled, false);
        }
        let Some(scan) = seg.heal_scan(partition, misled)? else {
            return Ok(());
        };
        let inner = self.inner.lock();
        let active = inner.segments.last().is_some_and(|a| Arc::ptr_eq(a, seg));
        seg.heal_finish(misled, scan, active)
    }

    /// Times the indexes of this log's segments were rebuilt from the log while it was served:
    /// found not sane when loaded, or misleading a read (the
    /// `gregor_log_index_rebuilds_total` metric counts these for every log).
    pub fn index_rebuilds(&self) -> u64 {
        self.published_segments()
            .iter()
            .map(|s| s.index_rebuilds())
            .sum()
    }

    fn find_in_batch(
        &self,
        seg: &LogSegment,
        pos: u64,
        h: &BatchHeader,
        matches: impl Fn(i64) -> bool,
    ) -> Result<Option<TimestampAndOffset>> {
        let batch = seg.read_range(pos, h.total_size())?;
        let stamps = record_timestamps(&batch, h).map_err(|e| LogError::CorruptFile {
            path: seg.log_path().display().to_string(),
            reason: format!("batch at position {pos}: {e}"),
        })?;
        let log_start_offset = self.log_start_offset();
        Ok(stamps
            .into_iter()
            .find(|&(o, ts)| o >= log_start_offset && matches(ts))
            .map(|(offset, timestamp_ms)| TimestampAndOffset {
                timestamp_ms,
                offset,
                leader_epoch: (h.partition_leader_epoch >= 0).then_some(h.partition_leader_epoch),
            }))
    }

    /// fsyncs every segment holding offsets at or after the recovery point, then moves the
    /// recovery point to the log end offset.
    ///
    /// # Errors
    /// [`LogError::Io`].
    pub fn flush(&self) -> Result<()> {
        self.flush_at(self.clock.now_ms())
    }

    fn flush_at(&self, now_ms: i64) -> Result<()> {
        let _serial = self.flush_lock.lock();
        let (segments, log_end_offset) = {
            let mut inner = self.inner.lock();
            inner.unflushed_messages = 0;
            (inner.segments.clone(), self.log_end_offset())
        };
        let recovery_point = self.recovery_point();
        let truncated = self.truncated_since_flush.swap(false, Ordering::AcqRel);
        if log_end_offset > recovery_point || truncated {
            let first = segments
                .partition_point(|s| s.base_offset() <= recovery_point)
                .saturating_sub(1);
            for seg in &segments[first..] {
                seg.flush()?;
            }
            // Recovery below the recovery point does not rebuild epochs from the batches: the
            // checkpoint must be durable before the point moves past them.
            self.sync_leader_epoch_checkpoint()?;
            sync_dir(&self.dir)?;
            self.recovery_point.store(log_end_offset, Ordering::Release);
        }
        self.last_flush_ms.store(now_ms, Ordering::Release);
        Ok(())
    }

    /// Flushes when `flush.ms` has passed since the last flush, or when a rolled segment is
    /// not yet flushed (Kafka flushes rolled segments in the background). Call it on a timer.
    ///
    /// # Errors
    /// [`LogError::Io`].
    pub fn flush_if_due(&self, now_ms: i64) -> Result<()> {
        let recovery_point = self.recovery_point();
        if self.log_end_offset() <= recovery_point {
            return Ok(());
        }
        let interval_ms = self.config.read().flush_interval_ms;
        let since_ms = now_ms.saturating_sub(self.last_flush_ms.load(Ordering::Acquire));
        let active_base = self
            .published_segments()
            .last()
            .map_or(0, |s| s.base_offset());
        if since_ms >= interval_ms || active_base > recovery_point {
            self.flush_at(now_ms)?;
        }
        Ok(())
    }

    /// Flushes, records the active segment's final time-index entry, trims the preallocated
    /// indexes and writes a producer snapshot at the log end offset. Later appends fail with
    /// [`LogError::Closed`]; reads keep working. Idempotent.
    ///
    /// # Errors
    /// [`LogError::Io`].
    pub fn close(&self) -> Result<()> {
        self.flush()?;
        let mut inner = self.inner.lock();
        if inner.closed {
            return Ok(());
        }
        inner.closed = true;
        if let Some(active) = inner.segments.last() {
            active.on_become_inactive()?;
            active.flush()?;
        }
        inner
            .producer_state
            .take_snapshot(self.log_end_offset(), true)
    }

    /// [`PartitionLog::close`] without any `fsync`: the caller makes the log durable (the
    /// log manager's shutdown syncs each directory's file system once) and then calls
    /// [`PartitionLog::mark_synced`]. Releases the segments' descriptors. Idempotent.
    ///
    /// # Errors
    /// [`LogError::Io`].
    pub(crate) fn close_unsynced(&self) -> Result<()> {
        let mut inner = self.inner.lock();
        if inner.closed {
            return Ok(());
        }
        inner.closed = true;
        if let Some(active) = inner.segments.last() {
            active.on_become_inactive()?;
        }
        inner
            .producer_state
            .take_snapshot(self.log_end_offset(), false)?;
        for seg in &inner.segments {
            seg.close_files();
        }
        Ok(())
    }

    /// Records that everything up to the log end offset is durable (the caller synced the
    /// file system after [`PartitionLog::close_unsynced`]).
    pub(crate) fn mark_synced(&self) {
        self.recovery_point
            .store(self.log_end_offset(), Ordering::Release);
    }

    /// Refuses further appends without writing anything (the directory is being deleted).
    pub(crate) fn mark_closed(&self) {
        self.inner.lock().closed = true;
    }

    /// Number of producer ids with state.
    pub fn num_producers(&self) -> usize {
        self.inner.lock().producer_state.len()
    }
}

/// `compression.type` other than `producer` (Kafka's `LogValidator`, KIP-390): when some
/// batch's codec differs from `target`, every batch is rebuilt in `target`, keeping producer
/// fields, timestamps and offset deltas. `None` when nothing needs re-compression.
fn recompress(
    records: &[u8],
    headers: &[BatchHeader],
    target: Option<gregor_protocol::batch::Compression>,
    level: Option<i32>,
) -> Result<Option<Vec<u8>>> {
    let Some(codec) = target else {
        return Ok(None);
    };
    // Kafka's LogValidator: control batches (transaction markers) are never re-compressed.
    if headers
        .iter()
        .all(|h| h.compression() == Some(codec) || h.is_control())
    {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(records.len());
    let mut pos = 0;
    for h in headers {
        let raw = &records[pos..pos + h.total_size()];
        pos += h.total_size();
        if h.compression() == Some(codec) || h.is_control() {
            out.extend_from_slice(raw);
            continue;
        }
        let recs = decode_records(raw)?;
        let rebuilt = crate::rebuild::rebuild_batch(h, &recs, codec, level, None)
            .map_err(|e| LogError::InvalidRecord(format!("re-compressing a batch: {e}")))?;
        out.extend_from_slice(&rebuilt);
    }
    Ok(Some(out))
}

/// Why segments were deleted (Kafka's `SegmentDeletionReason`), for logs and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeletionReason {
    /// Newest record older than `retention.ms`.
    RetentionMs,
    /// The log was larger than `retention.bytes`.
    RetentionBytes,
    /// Entirely below the log start offset (DeleteRecords).
    LogStartOffset,
}

/// What one retention pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetentionResult {
    /// Segments deleted.
    pub deleted_segments: usize,
    /// Bytes of those segments.
    pub deleted_bytes: u64,
}

impl PartitionLog {
    /// Kafka's `UnifiedLog.deleteOldSegments`: with `cleanup.policy` containing `delete`, deletes
    /// the oldest segments whose newest record is older than `retention.ms`, then those that
    /// make the log larger than `retention.bytes`; with any policy, segments entirely below the
    /// log start offset. A segment is only deleted once `high_watermark` has passed its end;
    /// the active segment is deleted too when it qualifies and is not empty, after rolling a
    /// new one (so the log is never without a segment). Deleted segments are renamed to
    /// `.deleted` and removed `file.delete.delay.ms` later ([`PartitionLog::delete_due_files`]);
    /// readers holding them keep reading the open files.
    ///
    /// # Errors
    /// [`LogError::Io`].
    pub fn delete_old_segments(&self, now_ms: i64, high_watermark: i64) -> Result<RetentionResult> {
        let config = self.config();
        let mut result = RetentionResult::default();
        if config.cleanup_delete {
            if config.retention_ms >= 0 {
                let r = self.delete_segments_while(
                    high_watermark,
                    now_ms,
                    DeletionReason::RetentionMs,
                    |seg, _| {
                        let expired = |seg: &LogSegment| -> Result<bool> {
                            Ok(now_ms.saturating_sub(seg.largest_timestamp_ms()?)
                                > config.retention_ms)
                        };
                        // Keeping a segment on its time index's last entry alone is
                        // cheap; deleting one is decided on the checked index (loading it
                        // corrects a last entry that is not the segment's max timestamp).
                        Ok(expired(seg)? && {
                            seg.load_indexes()?;
                            expired(seg)?
                        })
                    },
                )?;
                result.deleted_segments += r.deleted_segments;
                result.deleted_bytes += r.deleted_bytes;
            }
            if config.retention_bytes >= 0 {
                let mut diff =
                    i128::from(self.size_in_bytes()) - i128::from(config.retention_bytes);
                let r = self.delete_segments_while(
                    high_watermark,
                    now_ms,
                    DeletionReason::RetentionBytes,
                    |seg, _| {
                        if diff - i128::from(seg.size()) >= 0 {
                            diff -= i128::from(seg.size());
                            Ok(true)
                        } else {
                            Ok(false)
                        }
                    },
                )?;
                result.deleted_segments += r.deleted_segments;
                result.deleted_bytes += r.deleted_bytes;
            }
        }
        let log_start_offset = self.log_start_offset();
        let r = self.delete_segments_while(
            high_watermark,
            now_ms,
            DeletionReason::LogStartOffset,
            |_, next| Ok(next.is_some_and(|n| n.base_offset() <= log_start_offset)),
        )?;
        result.deleted_segments += r.deleted_segments;
        result.deleted_bytes += r.deleted_bytes;
        Ok(result)
    }

    /// Deletes the longest prefix of segments for which `predicate(segment, next segment)`
    /// holds (Kafka's `deletableSegments` + `deleteSegments`).
    fn delete_segments_while(
        &self,
        high_watermark: i64,
        now_ms: i64,
        reason: DeletionReason,
        mut predicate: impl FnMut(&LogSegment, Option<&LogSegment>) -> Result<bool>,
    ) -> Result<RetentionResult> {
        let _maintenance = self.maintenance_lock.lock();
        let segments = self.published_segments();
        let log_end_offset = self.log_end_offset();
        let mut count = 0;
        for (i, seg) in segments.iter().enumerate() {
            let next = segments.get(i + 1).map(|s| &**s);
            let upper = next.map_or(log_end_offset, LogSegment::base_offset);
            let last_and_empty = next.is_none() && seg.size() == 0;
            if high_watermark < upper || last_and_empty || !predicate(seg, next)? {
                break;
            }
            count += 1;
        }
        if count == 0 {
            return Ok(RetentionResult::default());
        }
        let config = self.config();
        let doomed: Vec<Arc<LogSegment>> = {
            let mut inner = self.inner.lock();
            if inner.closed {
                return Ok(RetentionResult::default());
            }
            if count >= inner.segments.len() {
                // Every segment goes: start a new, empty active segment at the log end offset.
                self.roll(&mut inner, log_end_offset, &config, now_ms)?;
            }
            let doomed: Vec<_> = inner.segments.drain(..count).collect();
            let new_start = inner
                .segments
                .first()
                .map_or(log_end_offset, |s| s.base_offset());
            // Readers load the segment list, then the log start offset: publish the offset first
            // so that whoever sees the shorter list also sees the new start.
            self.log_start_offset.fetch_max(new_start, Ordering::AcqRel);
            *self.segments.write() = Arc::new(inner.segments.clone());
            inner
                .producer_state
                .on_log_start_offset_incremented(self.log_start_offset());
            self.publish_txn_state(&inner);
            doomed
        };
        let mut result = RetentionResult::default();
        let mut paths = Vec::new();
        for seg in &doomed {
            result.deleted_segments += 1;
            result.deleted_bytes += seg.size();
            seg.pin_for_deletion()?;
            crate::segment::rename_segment_files(&self.dir, seg.base_offset(), "", DELETED_SUFFIX)?;
            seg.set_suffix(&self.dir, DELETED_SUFFIX);
            paths.extend(deleted_paths(&self.dir, seg.base_offset()));
        }
        sync_dir(&self.dir)?;
        self.schedule_delete(now_ms, config.file_delete_delay_ms, paths);
        tracing::info!(
            partition = %self.topic_partition,
            ?reason,
            segments = result.deleted_segments,
            bytes = result.deleted_bytes,
            log_start_offset = self.log_start_offset(),
            "deleted old segments"
        );
        self.delete_snapshots_below_log_start()?;
        Ok(result)
    }

    fn schedule_delete(&self, now_ms: i64, delay_ms: i64, paths: Vec<PathBuf>) {
        if paths.is_empty() {
            return;
        }
        let due = now_ms.saturating_add(delay_ms.max(0));
        self.pending_deletes.lock().push((due, paths));
    }

    /// Removes the `.deleted` files whose `file.delete.delay.ms` has passed; returns how many
    /// groups are still waiting. Errors are logged: a file that cannot be removed now is
    /// removed at the next start.
    pub fn delete_due_files(&self, now_ms: i64) -> usize {
        let due: Vec<Vec<PathBuf>> = {
            let mut pending = self.pending_deletes.lock();
            let (due, keep): (Vec<_>, Vec<_>) = pending.drain(..).partition(|(t, _)| *t <= now_ms);
            *pending = keep;
            due.into_iter().map(|(_, p)| p).collect()
        };
        for path in due.into_iter().flatten() {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(file = %path.display(), error = %e, "could not remove deleted segment file");
                }
            }
        }
        self.pending_deletes.lock().len()
    }

    /// When the next `.deleted` file of this log may be removed (wall-clock ms), if any.
    pub fn next_file_deletion_due_ms(&self) -> Option<i64> {
        self.pending_deletes.lock().iter().map(|(t, _)| *t).min()
    }

    fn delete_snapshots_below_log_start(&self) -> Result<()> {
        let log_start_offset = self.log_start_offset();
        let inner = self.inner.lock();
        for snap in inner.producer_state.list_snapshots()? {
            if snap < log_start_offset {
                inner.producer_state.delete_snapshot(snap)?;
            }
        }
        Ok(())
    }

    /// DeleteRecords (Kafka's `UnifiedLog.maybeIncrementLogStartOffset`): moves the log start
    /// offset up to `new_log_start_offset`; records below it are no longer readable (fetches get
    /// OFFSET_OUT_OF_RANGE) and the segments entirely below it are deleted by the next
    /// [`PartitionLog::delete_old_segments`]. A smaller offset changes nothing. Returns the log
    /// start offset afterwards. The caller checks the high watermark and persists the new
    /// offset (`log-start-offset-checkpoint`).
    ///
    /// # Errors
    /// [`LogError::OffsetOutOfRange`] beyond the log end offset; [`LogError::Closed`].
    pub fn maybe_increment_log_start_offset(&self, new_log_start_offset: i64) -> Result<i64> {
        let mut inner = self.inner.lock();
        if inner.closed {
            return Err(LogError::Closed(self.topic_partition.to_string()));
        }
        let log_end_offset = self.log_end_offset();
        if new_log_start_offset > log_end_offset || new_log_start_offset < 0 {
            return Err(LogError::OffsetOutOfRange {
                offset: new_log_start_offset,
                log_start_offset: self.log_start_offset(),
                log_end_offset,
            });
        }
        let before = self
            .log_start_offset
            .fetch_max(new_log_start_offset, Ordering::AcqRel);
        if new_log_start_offset > before {
            tracing::info!(partition = %self.topic_partition, log_start_offset = new_log_start_offset,
                "incremented log start offset");
            inner
                .producer_state
                .on_log_start_offset_incremented(new_log_start_offset);
            self.publish_txn_state(&inner);
        }
        Ok(before.max(new_log_start_offset))
    }

    /// Kafka's `ProducerStateManager.removeExpiredProducers`: forgets producers whose last
    /// batch is older than `producer_id_expiration_ms` (`producer.id.expiration.ms`, default one
    /// day). Kafka keeps the state of producers whose batches retention removed until they
    /// expire this way. Returns how many were removed.
    pub fn remove_expired_producers(&self, now_ms: i64, producer_id_expiration_ms: i64) -> usize {
        self.inner
            .lock()
            .producer_state
            .remove_expired(now_ms, producer_id_expiration_ms)
    }

    /// The cleaner's first dirty offset (`cleaner-offset-checkpoint`), `None` if never cleaned.
    pub fn cleaner_checkpoint(&self) -> Option<i64> {
        let o = self.cleaner_checkpoint.load(Ordering::Acquire);
        (o >= 0).then_some(o)
    }

    /// Sets the cleaner's first dirty offset (loaded from `cleaner-offset-checkpoint`).
    pub fn set_cleaner_checkpoint(&self, offset: i64) {
        self.cleaner_checkpoint.store(offset, Ordering::Release);
    }

    /// Earliest delete horizon (ms) among the tombstone batches the cleaner last wrote.
    pub fn min_delete_horizon_ms(&self) -> Option<i64> {
        let t = self.min_delete_horizon_ms.load(Ordering::Acquire);
        (t != i64::MAX).then_some(t)
    }

    pub(crate) fn set_min_delete_horizon_ms(&self, t: Option<i64>) {
        self.min_delete_horizon_ms
            .store(t.unwrap_or(i64::MAX), Ordering::Release);
    }

    /// Claims the log for one cleaner thread; `false` if another one has it.
    pub(crate) fn try_begin_cleaning(&self) -> bool {
        !self.cleaning.swap(true, Ordering::AcqRel)
    }

    pub(crate) fn end_cleaning(&self) {
        self.cleaning.store(false, Ordering::Release);
    }

    /// The last record of each producer with state (Kafka's `lastRecordsOfActiveProducers`):
    /// the cleaner keeps the batch holding its last data offset, or the marker of its current
    /// epoch when it has none, even when empty, so the producer's sequence and epoch survive.
    pub(crate) fn last_records_of_producers(
        &self,
    ) -> std::collections::HashMap<i64, crate::producer_state::LastRecord> {
        self.inner.lock().producer_state.last_records()
    }

    /// Kafka's `UnifiedLog.replaceSegments`: swaps the cleaned segment `cleaned` (files named
    /// `*.cleaned`, complete and fsynced) in for the consecutive closed segments `old`. The
    /// order makes a crash at any point recoverable ([`complete_interrupted_swaps`]): rename the
    /// cleaned files to `.swap` (the `.log` last), rename the old segments to `.deleted`,
    /// drop the `.swap` suffix, fsyncing the directory after each step; then publish the new
    /// segment list. Returns `false` (and removes the cleaned files) when retention changed
    /// the segments meanwhile.
    ///
    /// # Errors
    /// [`LogError::Io`]; the log on disk stays loadable.
    pub(crate) fn replace_segments(
        &self,
        old: &[Arc<LogSegment>],
        cleaned: LogSegment,
        now_ms: i64,
    ) -> Result<bool> {
        let _maintenance = self.maintenance_lock.lock();
        let base = cleaned.base_offset();
        let start = {
            let inner = self.inner.lock();
            let start = inner
                .segments
                .iter()
                .position(|s| old.first().is_some_and(|o| Arc::ptr_eq(s, o)));
            let intact = start.is_some_and(|i| {
                i + old.len() < inner.segments.len()
                    && old
                        .iter()
                        .zip(&inner.segments[i..])
                        .all(|(a, b)| Arc::ptr_eq(a, b))
            });
            if inner.closed || !intact {
                drop(inner);
                drop(cleaned);
                delete_files_with_suffix(&self.dir, base, CLEANED_SUFFIX)?;
                return Ok(false);
            }
            start.unwrap_or(0)
        };
        let config = self.config();
        drop(cleaned);
        crate::segment::rename_segment_files(&self.dir, base, CLEANED_SUFFIX, SWAP_SUFFIX)?;
        sync_dir(&self.dir)?;
        let mut paths = Vec::new();
        for seg in old {
            seg.pin_for_deletion()?;
            crate::segment::rename_segment_files(&self.dir, seg.base_offset(), "", DELETED_SUFFIX)?;
            seg.set_suffix(&self.dir, DELETED_SUFFIX);
            paths.extend(deleted_paths(&self.dir, seg.base_offset()));
        }
        sync_dir(&self.dir)?;
        crate::segment::rename_segment_files(&self.dir, base, SWAP_SUFFIX, "")?;
        sync_dir(&self.dir)?;
        // Inactive: its indexes (just written) are read on first use.
        let seg = LogSegment::open_lazy(
            &self.dir,
            base,
            config.segment_index_bytes,
            config.index_interval_bytes,
            now_ms,
        )?;
        {
            let mut inner = self.inner.lock();
            inner
                .segments
                .splice(start..start + old.len(), [Arc::new(seg)]);
            *self.segments.write() = Arc::new(inner.segments.clone());
        }
        self.schedule_delete(now_ms, config.file_delete_delay_ms, paths);
        Ok(true)
    }
}

fn deleted_paths(dir: &Path, base_offset: i64) -> Vec<PathBuf> {
    ["log", "index", "timeindex", "txnindex"]
        .iter()
        .map(|ext| dir.join(crate::segment::file_name(base_offset, ext) + DELETED_SUFFIX))
        .collect()
}

/// Removes the files of segment `base_offset` that carry `suffix`.
pub(crate) fn delete_files_with_suffix(dir: &Path, base_offset: i64, suffix: &str) -> Result<()> {
    for ext in ["log", "index", "timeindex", "txnindex"] {
        let p = dir.join(crate::segment::file_name(base_offset, ext) + suffix);
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(LogError::io("deleting", &p, e)),
        }
    }
    Ok(())
}

pub(crate) fn delete_segment_files(dir: &Path, base_offset: i64) -> Result<()> {
    for ext in ["log", "index", "timeindex", "txnindex"] {
        let p = dir.join(crate::segment::file_name(base_offset, ext));
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(LogError::io("deleting", &p, e)),
        }
    }
    Ok(())
}

impl std::fmt::Debug for PartitionLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionLog")
            .field("topic_partition", &self.topic_partition)
            .field("dir", &self.dir)
            .field("log_start_offset", &self.log_start_offset())
            .field("log_end_offset", &self.log_end_offset())
            .field("recovery_point", &self.recovery_point())
            .finish_non_exhaustive()
    }
}

/// Kafka's `LogValidator.processRecordErrors`: the error refusing a batch whose records broke
/// the per-record rules, with its summary message.
fn record_validation_error(invalid_timestamp: bool, record_errors: Vec<RecordError>) -> LogError {
    let message = if invalid_timestamp {
        "One or more records have been rejected due to invalid timestamp".to_string()
    } else {
        let shown: Vec<String> = record_errors
            .iter()
            .take(3)
            .map(|e| {
                format!(
                    "RecordError(batchIndex={}, message='{}')",
                    e.batch_index, e.message
                )
            })
            .collect();
        format!(
            "One or more records have been rejected due to {} record errors in total, and only showing the first three errors at most: [{}]",
            record_errors.len(),
            shown.join(", ")
        )
    };
    LogError::RecordValidation {
        invalid_timestamp,
        message,
        record_errors,
    }
}

#[cfg(test)]
mod disk_full_tests {
    use super::*;
    use crate::health::DirState;
    use crate::segment::FailAt;
    use gregor_protocol::batch::BatchBuilder;

    const NOW_MS: i64 = 1_700_000_000_000;
    const ENOSPC: i32 = rustix::io::Errno::NOSPC.raw_os_error();

    fn batch(n: usize, ts: i64) -> Vec<u8> {
        let mut b = BatchBuilder::new(0, ts);
        for i in 0..n {
            b = b.record(ts + i as i64, None, Some(&[b'v'; 200]), &[]);
        }
        b.build()
    }

    fn idempotent(seq: i32, n: usize) -> Vec<u8> {
        let mut b = BatchBuilder::new(0, NOW_MS).producer(7, 0, seq);
        for _ in 0..n {
            b = b.record(NOW_MS, None, Some(&[b'x'; 200]), &[]);
        }
        b.build()
    }

    fn open(dir: &Path) -> (PartitionLog, Arc<LogDirHealth>) {
        let config = LogConfig {
            index_interval_bytes: 256,
            ..LogConfig::default()
        };
        let log = PartitionLog::open(dir, TopicPartition::new("t", 0), config, true).unwrap();
        let health = Arc::new(LogDirHealth::new(dir));
        log.set_dir_health(health.clone());
        (log, health)
    }

    fn active(log: &PartitionLog) -> Arc<LogSegment> {
        Arc::clone(log.published_segments().last().unwrap())
    }

    /// Every batch in the log, read back, as (base offset, next offset).
    fn batches(log: &PartitionLog) -> Vec<(i64, i64)> {
        let mut out = Vec::new();
        let mut offset = log.log_start_offset();
        while offset < log.log_end_offset() {
            let r = log.read(offset, 1 << 20, i64::MAX, true).unwrap();
            for b in Batches::new(&r.records) {
                let (_, h) = b.unwrap();
                out.push((h.base_offset, h.next_offset()));
                offset = h.next_offset();
            }
        }
        out
    }

    #[test]
    fn a_partial_write_for_lack_of_space_is_rolled_back_and_the_log_stays_open() {
        let dir = tempfile::tempdir().unwrap();
        let (log, health) = open(dir.path());
        for i in 0..20 {
            log.append_as_leader(&mut batch(3, NOW_MS + i), 0, NOW_MS)
                .unwrap();
        }
        let seg = active(&log);
        let size = seg.size();
        let file_len = std::fs::metadata(seg.log_path()).unwrap().len();
        assert_eq!(size, file_len);
        let entries = seg.index_entry_counts().unwrap();
        let max = seg.max_timestamp().unwrap();
        let leo = log.log_end_offset();

        // The disk fills in the middle of the batch: 100 of its bytes land.
        seg.inject_fault(Some(FailAt::LogWrite {
            after_bytes: 100,
            errno: ENOSPC,
        }));
        let e = log
            .append_as_leader(&mut batch(3, NOW_MS + 100), 0, NOW_MS)
            .unwrap_err();
        assert!(e.is_out_of_space(), "{e}");
        assert_eq!(e.kafka_error_code(), 56);
        assert_eq!(log.log_end_offset(), leo);
        assert_eq!(seg.size(), size);
        assert_eq!(
            std::fs::metadata(seg.log_path()).unwrap().len(),
            size,
            "no partial batch in the file"
        );
        assert_eq!(seg.index_entry_counts().unwrap(), entries);
        assert_eq!(seg.max_timestamp().unwrap(), max);
        assert!(matches!(health.state(), DirState::Full { .. }));

        // While the directory is full, appends fail fast without touching the disk.
        seg.inject_fault(None);
        let e = log
            .append_as_leader(&mut batch(1, NOW_MS), 0, NOW_MS)
            .unwrap_err();
        assert!(matches!(e, LogError::LogDirOffline { .. }), "{e}");
        assert_eq!(e.kafka_error_code(), 56);
        assert_eq!(seg.size(), size);

        // Room again: appends resume at the same offset, without a restart.
        assert!(health.check());
        let info = log
            .append_as_leader(&mut batch(3, NOW_MS + 200), 0, NOW_MS)
            .unwrap();
        assert_eq!(info.first_offset, leo);
        let all = batches(&log);
        assert_eq!(all.len(), 21);
        assert!(all.windows(2).all(|w| w[0].1 == w[1].0));
        assert_eq!(all.last().unwrap().1, leo + 3);
    }

    #[test]
    fn index_entries_of_a_failed_append_are_dropped_and_the_log_reopens_clean() {
        let dir = tempfile::tempdir().unwrap();
        let (log, health) = open(dir.path());
        log.append_as_leader(&mut batch(5, NOW_MS), 0, NOW_MS)
            .unwrap();
        let seg = active(&log);
        let entries = seg.index_entry_counts().unwrap();
        let size = seg.size();
        // Data and index entries written (the batch is over index.interval.bytes), then the
        // append fails.
        seg.inject_fault(Some(FailAt::AfterIndexing));
        for _ in 0..2 {
            let e = log
                .append_as_leader(&mut batch(5, NOW_MS + 10), 0, NOW_MS)
                .unwrap_err();
            assert!(e.is_out_of_space());
            assert_eq!(seg.index_entry_counts().unwrap(), entries);
            assert_eq!(seg.size(), size);
            assert!(health.check());
        }
        seg.inject_fault(None);
        log.append_as_leader(&mut batch(5, NOW_MS + 20), 0, NOW_MS)
            .unwrap();
        let leo = log.log_end_offset();
        assert_eq!(leo, 10);
        log.close().unwrap();
        drop(seg);
        drop(log);
        // Reopened after a clean shutdown, and after a crash: same batches, sane indexes.
        for clean in [true, false] {
            let log = PartitionLog::open(
                dir.path(),
                TopicPartition::new("t", 0),
                LogConfig {
                    index_interval_bytes: 256,
                    ..LogConfig::default()
                },
                clean,
            )
            .unwrap();
            assert_eq!(log.load_stats().rebuilt_indexes, 0);
            assert_eq!(log.load_stats().truncated_bytes, 0);
            assert_eq!(log.log_end_offset(), leo);
            assert_eq!(batches(&log), vec![(0, 5), (5, 10)]);
            for o in 0..leo {
                let r = log.read(o, 1, i64::MAX, true).unwrap();
                let (_, h) = Batches::new(&r.records).next().unwrap().unwrap();
                assert!(h.base_offset <= o && o < h.next_offset());
            }
        }
    }

    #[test]
    fn a_crash_after_a_partial_write_is_repaired_by_recovery() {
        // What a crash between the failed write and the rollback leaves: a partial batch
        // after the last complete one. Recovery (unclean open) cuts it.
        let dir = tempfile::tempdir().unwrap();
        let (log, _) = open(dir.path());
        log.append_as_leader(&mut batch(3, NOW_MS), 0, NOW_MS)
            .unwrap();
        log.flush().unwrap();
        let seg = active(&log);
        let path = seg.log_path().to_path_buf();
        let size = seg.size();
        drop(seg);
        drop(log);
        let partial = batch(3, NOW_MS + 1);
        {
            use std::os::unix::fs::FileExt;
            let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            f.write_all_at(&partial[..partial.len() / 2], size).unwrap();
        }
        let log = PartitionLog::open(
            dir.path(),
            TopicPartition::new("t", 0),
            LogConfig::default(),
            false,
        )
        .unwrap();
        assert_eq!(log.log_end_offset(), 3);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), size);
    }

    #[test]
    fn an_idempotent_producer_retries_a_failed_append_with_the_same_sequence() {
        let dir = tempfile::tempdir().unwrap();
        let (log, health) = open(dir.path());
        log.append_as_leader(&mut idempotent(0, 2), 0, NOW_MS)
            .unwrap();
        let seg = active(&log);
        seg.inject_fault(Some(FailAt::LogWrite {
            after_bytes: 10,
            errno: ENOSPC,
        }));
        log.append_as_leader(&mut idempotent(2, 2), 0, NOW_MS)
            .unwrap_err();
        seg.inject_fault(None);
        assert!(health.check());
        // The retry is neither a duplicate nor out of order: producer state was not touched.
        let info = log
            .append_as_leader(&mut idempotent(2, 2), 0, NOW_MS)
            .unwrap();
        assert!(!info.duplicate);
        assert_eq!((info.first_offset, info.last_offset), (2, 3));
    }

    /// EMFILE is not a disk fault: the append fails alone (rolled back, KAFKA_STORAGE_ERROR
    /// for the client to retry), the log and its directory stay in service, and the next
    /// append lands at the same offset.
    #[test]
    fn running_out_of_descriptors_fails_the_append_alone() {
        let dir = tempfile::tempdir().unwrap();
        let (log, health) = open(dir.path());
        log.append_as_leader(&mut batch(2, NOW_MS), 0, NOW_MS)
            .unwrap();
        let seg = active(&log);
        let size = seg.size();
        let leo = log.log_end_offset();
        seg.inject_fault(Some(FailAt::LogWrite {
            after_bytes: 10,
            errno: rustix::io::Errno::MFILE.raw_os_error(),
        }));
        let e = log
            .append_as_leader(&mut batch(2, NOW_MS), 0, NOW_MS)
            .unwrap_err();
        assert!(e.is_out_of_descriptors(), "{e}");
        assert_eq!(e.kafka_error_code(), 56);
        assert_eq!(seg.size(), size);
        assert_eq!(std::fs::metadata(seg.log_path()).unwrap().len(), size);
        assert!(
            matches!(health.state(), DirState::Online),
            "{:?}",
            health.state()
        );
        seg.inject_fault(None);
        let info = log
            .append_as_leader(&mut batch(2, NOW_MS), 0, NOW_MS)
            .unwrap();
        assert_eq!(info.first_offset, leo);
    }

    #[test]
    fn any_other_write_error_closes_the_log_and_fails_the_dir() {
        let dir = tempfile::tempdir().unwrap();
        let (log, health) = open(dir.path());
        log.append_as_leader(&mut batch(1, NOW_MS), 0, NOW_MS)
            .unwrap();
        let seg = active(&log);
        seg.inject_fault(Some(FailAt::LogWrite {
            after_bytes: 10,
            errno: rustix::io::Errno::IO.raw_os_error(),
        }));
        let e = log
            .append_as_leader(&mut batch(1, NOW_MS), 0, NOW_MS)
            .unwrap_err();
        assert_eq!(e.kafka_error_code(), 56);
        assert!(matches!(health.state(), DirState::Failed { .. }));
        assert!(!health.check());
        seg.inject_fault(None);
        let e = log
            .append_as_leader(&mut batch(1, NOW_MS), 0, NOW_MS)
            .unwrap_err();
        assert!(matches!(e, LogError::Closed(_)), "{e}");
    }
}
