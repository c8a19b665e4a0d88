//! One log segment (Kafka's `LogSegment`): `<base>.log` holding whole v2 batches and nothing
//! else, plus its `.index` and `.timeindex`.
//!
//! The appender (holding the partition's append lock) writes batches at the published size and
//! then publishes the new size with release ordering; readers load the size with acquire
//! ordering and never look past it, so they need no lock.
//!
//! # Indexes loaded on first use
//!
//! The active segment's indexes are read and checked when its log opens
//! ([`LogSegment::open`]) and stay loaded. Every other segment opened with its log
//! ([`LogSegment::open_lazy`]) reads nothing of its index files until a lookup, the cleaner or a
//! truncation needs them ([`LogSegment::with_indexes`]); then both files are read once (one
//! thread loads, the others wait for it), checked as the active segment's are, and held within
//! the budget of [`crate::index_cache`], which may drop them again. A segment's max timestamp
//! comes from the last entry of its time index alone ([`LogSegment::max_timestamp`]), so
//! time-based retention keeps a segment without loading its indexes; it loads (and so checks)
//! them before deleting one, and lookups by timestamp check the segment they answer from.
//!
//! Kafka 4.4 (`LazyIndex`, `LogSegment.sanityCheck`, KIP-263) checks only that the offset index
//! file exists when a log loads, never the entries of a segment below the recovery point, and
//! maps an index on first use without checking it: a corrupt inactive index answers lookups
//! (`CorruptIndexException` is thrown only by the explicit sanity checks that recovery and
//! `kafka-dump-log` run). gregor checks an inactive segment's index files when it first loads
//! them (the same checks as at open: whole entries, increasing, plausible positions and
//! timestamps, the last offset entry pointing at the batch that ends at its offset, the last
//! time entry being the max timestamp of the batch ending at its offset, no empty time index
//! beside batches that have timestamps); when they
//! are not sane it logs a warning naming the file, rebuilds both indexes from the segment's
//! batch headers (as recovery does, but without validating CRCs or cutting the segment: that
//! is recovery's job at start-up, and data below the recovery point is not truncated while
//! the log is served) and answers from the rebuilt entries. A missing index file is rebuilt
//! the same way, as Kafka's loader does (`NoSuchFileException`).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use gregor_protocol::batch::{
    validate_batch, BatchError, BatchHeader, BATCH_HEADER_LEN, LOG_OVERHEAD,
};
use parking_lot::Mutex;

use crate::error::{LogError, Result};
use crate::files::SegmentFile;
use crate::index::{
    floor_by, push_if_follows, OffsetEntry, OffsetIndex, Tail, TimeEntry, TimeIndex,
};
use crate::index_cache::{self, CacheSlot, Evict};
use crate::txn_index::{AbortedTxn, TransactionIndex};

/// Chunk size for header walks on the read path (a walk starts at an index entry, so it spans
/// about `index.interval.bytes` plus one batch).
pub(crate) const WALK_CHUNK_BYTES: usize = 16 * 1024;
/// Chunk size for whole-segment scans (recovery, index rebuild, producer-state replay).
pub(crate) const SCAN_CHUNK_BYTES: usize = 1024 * 1024;

/// `<20-digit zero-padded offset>.<ext>`, Kafka's file naming.
pub(crate) fn file_name(offset: i64, ext: &str) -> String {
    format!("{offset:020}.{ext}")
}

/// Renames the files of the segment with `base_offset` (`.log`, `.index`, `.timeindex`,
/// `.txnindex`) from `<name><from>` to `<name><to>`, indexes first and the `.log` file last (so
/// that the log file's suffix tells how far the rename got), skipping missing files. The caller
/// fsyncs the directory.
pub(crate) fn rename_segment_files(
    dir: &Path,
    base_offset: i64,
    from: &str,
    to: &str,
) -> Result<()> {
    for ext in ["index", "timeindex", "txnindex", "log"] {
        let name = file_name(base_offset, ext);
        let src = dir.join(format!("{name}{from}"));
        let dst = dir.join(format!("{name}{to}"));
        match std::fs::rename(&src, &dst) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(LogError::io("renaming", &src, e)),
        }
    }
    Ok(())
}

/// Total size in bytes of the batch `h` heads, or `None` if its length field is impossible.
pub(crate) fn checked_total_size(h: &BatchHeader) -> Option<usize> {
    if h.batch_length < (BATCH_HEADER_LEN - LOG_OVERHEAD) as i32 {
        None
    } else {
        Some(h.batch_length as usize + LOG_OVERHEAD)
    }
}

/// Validates one stored batch at the start of `buf`: the framing checks of
/// [`validate_batch`] (length, magic 2, CRC-32C, defined codec) but, unlike a produced batch, a
/// stored batch may have fewer records than `lastOffsetDelta + 1` (the cleaner leaves offset gaps
/// and keeps empty batches for producer state, as Kafka's `MemoryRecords.filterTo` does).
pub(crate) fn validate_stored_batch(buf: &[u8]) -> std::result::Result<BatchHeader, BatchError> {
    match validate_batch(buf) {
        Ok(h) => Ok(h),
        Err(BatchError::Invalid(_)) => {
            let h = BatchHeader::parse(buf)?;
            if h.records_count < 0
                || h.last_offset_delta < 0
                || h.last_offset_delta < h.records_count - 1
            {
                return Err(BatchError::Invalid(format!(
                    "last offset delta {} with {} records",
                    h.last_offset_delta, h.records_count
                )));
            }
            Ok(h)
        }
        Err(e) => Err(e),
    }
}

/// A timestamp and the offset it belongs to (`TimestampOffset` in Kafka).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TimestampOffset {
    pub timestamp_ms: i64,
    pub offset: i64,
}

/// Where a segment being recovered stands in its log ([`LogSegment::recover`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecoveryTail {
    /// The log's recovery point, when known: offsets below it had been flushed.
    pub recovery_point: Option<i64>,
    /// The segment is the last of the log.
    pub last_segment: bool,
}

impl Default for RecoveryTail {
    /// The last segment of a log whose recovery point is unknown.
    fn default() -> Self {
        Self {
            recovery_point: None,
            last_segment: true,
        }
    }
}

/// What a full scan of a segment found.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RecoverResult {
    /// Valid batches.
    pub batches: u64,
    /// Bytes cut from the end of the file.
    pub truncated_bytes: u64,
    /// Offset after the last valid batch, `None` if the segment holds none.
    pub next_offset: Option<i64>,
    /// When bytes were cut: whether they were only a write cut short at the end of the file
    /// (a crash), rather than corruption before its end.
    pub torn_tail: bool,
    /// Bytes of the file the scan read (the file's length when it began).
    pub scanned_bytes: u64,
}

/// Reads a file through a reusable buffer.
pub(crate) struct ChunkReader<'a> {
    file: &'a File,
    path: &'a Path,
    end: u64,
    chunk_bytes: usize,
    buf: Vec<u8>,
    buf_start: u64,
}

impl<'a> ChunkReader<'a> {
    pub(crate) fn new(file: &'a File, path: &'a Path, end: u64, chunk_bytes: usize) -> Self {
        Self {
            file,
            path,
            end,
            chunk_bytes,
            buf: Vec::new(),
            buf_start: 0,
        }
    }

    /// `len` bytes at `pos`, or `None` if they extend past the end.
    pub(crate) fn get(&mut self, pos: u64, len: usize) -> Result<Option<&[u8]>> {
        let Some(stop) = pos.checked_add(len as u64) else {
            return Ok(None);
        };
        if stop > self.end {
            return Ok(None);
        }
        let buffered = pos >= self.buf_start && stop <= self.buf_start + self.buf.len() as u64;
        if !buffered {
            let want = (len.max(self.chunk_bytes) as u64).min(self.end - pos) as usize;
            self.buf.resize(want, 0);
            self.file
                .read_exact_at(&mut self.buf, pos)
                .map_err(|e| LogError::io("reading", self.path, e))?;
            self.buf_start = pos;
        }
        let at = (pos - self.buf_start) as usize;
        Ok(Some(&self.buf[at..at + len]))
    }
}

/// What [`LogSegment::fetch_extent`] found.
pub(crate) struct FetchExtent {
    /// Where the last batch returned ends (the start position when none is).
    pub end: u64,
    /// Records in the batches returned (their headers' record counts).
    pub records: i64,
    /// The bytes, when the header reads covered them all.
    pub bytes: Option<Vec<u8>>,
}

/// One segment of a partition log.
pub(crate) struct LogSegment {
    base_offset: i64,
    /// The `.log` file, open while in use ([`crate::files`]).
    log: SegmentFile,
    size_bytes: AtomicU64,
    /// The `.index` and `.timeindex`, loaded or not (see the module docs).
    indexes: Arc<SegmentIndexes>,
    /// `index.interval.bytes` when the segment was opened or created: what a rebuild of its
    /// indexes uses.
    index_interval_bytes: u64,
    /// Largest batch max timestamp so far and the last offset of the batch holding it; `None`
    /// until read for a segment opened without its indexes.
    max_timestamp: Mutex<Option<TimestampOffset>>,
    bytes_since_last_index_entry: AtomicU64,
    /// Max timestamp of the first batch: segment.ms counts from it (Kafka's
    /// `rollingBasedTimestamp`).
    rolling_based_timestamp: Mutex<Option<i64>>,
    /// Wall-clock ms when this segment was created or loaded.
    created_ms: i64,
    /// Set when the segment is being deleted: its index files may disappear, and are never
    /// written again.
    deleted: AtomicBool,
    /// The `.txnindex` (aborted transactions whose marker is in this segment).
    txn_index: TransactionIndex,
    /// Test hook: the fault the next appends meet.
    #[cfg(test)]
    fail_at: Mutex<Option<FailAt>>,
}

/// A segment's two indexes and their place in the index cache.
pub(crate) struct SegmentIndexes {
    offset: OffsetIndex,
    time: TimeIndex,
    /// Held while the entries are read (or rebuilt) and installed, and while recovery rebuilds
    /// them: one thread loads, the others wait and then find them loaded.
    load_lock: Mutex<()>,
    slot: CacheSlot,
    /// Bytes of the index files read (loads, and the time index's tail).
    bytes_read: AtomicU64,
    /// Bumped (under `load_lock`) whenever the entries are replaced: installed after a load or
    /// a rebuild, or reset by recovery. A lookup that an entry misled reports the generation
    /// it used ([`Misled`]), so a heal can tell whether someone replaced the entries since.
    generation: AtomicU64,
    /// Held by a reader healing the indexes ([`LogSegment::heal_scan`]): the others wait for
    /// it and then retry with the rebuilt entries. Taken before the partition's append lock,
    /// never under it.
    heal_lock: Mutex<()>,
    /// A read that an entry misled rebuilt the indexes once: if they mislead again, reads fail
    /// instead of rebuilding again (until the log is reopened).
    healed: AtomicBool,
    /// A read failure of this segment was logged (once per segment).
    failure_logged: AtomicBool,
    /// Times the indexes were rebuilt from the log while the segment was served.
    rebuilds: AtomicU64,
}

impl Evict for SegmentIndexes {
    fn slot(&self) -> &CacheSlot {
        &self.slot
    }

    fn drop_entries(&self) {
        self.offset.unload();
        self.time.unload();
    }
}

impl SegmentIndexes {
    fn new(offset: OffsetIndex, time: TimeIndex, evictable: bool) -> Self {
        Self {
            offset,
            time,
            load_lock: Mutex::new(()),
            slot: CacheSlot::new(evictable),
            bytes_read: AtomicU64::new(0),
            generation: AtomicU64::new(0),
            heal_lock: Mutex::new(()),
            healed: AtomicBool::new(false),
            failure_logged: AtomicBool::new(false),
            rebuilds: AtomicU64::new(0),
        }
    }
}

/// Both indexes' entries as read from their files (or rebuilt), with the files' lengths.
struct LoadedIndexes {
    offsets: Vec<OffsetEntry>,
    offsets_file_len: u64,
    times: Vec<TimeEntry>,
    times_file_len: u64,
}

/// Index entries built from a walk over batches: Kafka's `LogSegment.append` loop (an offset
/// entry, and a time entry for the largest timestamp so far, after more than
/// `index.interval.bytes` since the last entry).
struct IndexBuilder {
    base_offset: i64,
    index_interval_bytes: u64,
    bytes_since_last_index_entry: u64,
    max: TimestampOffset,
    offsets: Vec<OffsetEntry>,
    times: Vec<TimeEntry>,
}

/// One step of Kafka's `LogSegment.append` loop for the batch `h` at `position`: updates the
/// max timestamp and the bytes since the last entry, and returns the entries due, if any.
fn index_step(
    base_offset: i64,
    max: &mut TimestampOffset,
    bytes_since_last_index_entry: &mut u64,
    h: &BatchHeader,
    position: u64,
    size: u64,
    index_interval_bytes: u64,
) -> Option<(OffsetEntry, Option<TimeEntry>)> {
    if h.max_timestamp > max.timestamp_ms {
        *max = TimestampOffset {
            timestamp_ms: h.max_timestamp,
            offset: h.last_offset(),
        };
    }
    let due = (*bytes_since_last_index_entry > index_interval_bytes).then(|| {
        *bytes_since_last_index_entry = 0;
        let offset = OffsetEntry {
            relative_offset: (h.last_offset() - base_offset) as u32,
            position: position as u32,
        };
        let time = (max.timestamp_ms >= 0).then(|| TimeEntry {
            timestamp_ms: max.timestamp_ms,
            relative_offset: (max.offset - base_offset) as u32,
        });
        (offset, time)
    });
    *bytes_since_last_index_entry += size;
    due
}

impl IndexBuilder {
    fn add(&mut self, h: &BatchHeader, position: u64, size: u64) {
        if let Some((offset, time)) = index_step(
            self.base_offset,
            &mut self.max,
            &mut self.bytes_since_last_index_entry,
            h,
            position,
            size,
            self.index_interval_bytes,
        ) {
            push_if_follows(&mut self.offsets, offset);
            if let Some(t) = time {
                push_if_follows(&mut self.times, t);
            }
        }
    }

    /// The entries, with the final max-timestamp entry an inactive segment's time index ends
    /// with ([`LogSegment::on_become_inactive`]).
    fn finish(mut self) -> (Vec<OffsetEntry>, Vec<TimeEntry>, TimestampOffset) {
        if self.max.timestamp_ms >= 0 {
            push_if_follows(
                &mut self.times,
                TimeEntry {
                    timestamp_ms: self.max.timestamp_ms,
                    relative_offset: (self.max.offset - self.base_offset) as u32,
                },
            );
        }
        self.offsets.shrink_to_fit();
        self.times.shrink_to_fit();
        (self.offsets, self.times, self.max)
    }

    /// The entries of a segment still written: no final max-timestamp entry (it is added when
    /// the segment rolls), and the bytes since the last entry, which the next append goes on
    /// counting from.
    fn finish_active(mut self) -> (Vec<OffsetEntry>, Vec<TimeEntry>, TimestampOffset, u64) {
        self.offsets.shrink_to_fit();
        self.times.shrink_to_fit();
        (
            self.offsets,
            self.times,
            self.max,
            self.bytes_since_last_index_entry,
        )
    }
}

/// A walk over a segment's batch headers that builds its indexes (a rebuild), which may stop
/// and go on later from where it stopped ([`LogSegment::scan_headers`]).
pub(crate) struct IndexScan {
    builder: IndexBuilder,
    /// Where the next batch starts.
    position: u64,
    /// The lowest offset the next batch may have.
    next_offset: i64,
    /// Why the walk stopped before the end, if it did: the indexes cover the batches before.
    stopped: Option<String>,
}

/// An index entry that did not lead where it promised: at the position an offset-index entry
/// gives there is no batch holding the entry's offset, or the batches from there contradict
/// the time-index entry used. The segment's indexes are then not to be trusted
/// ([`LogSegment::heal_exclusive`], [`LogSegment::heal_scan`]).
#[derive(Debug, Clone)]
pub(crate) struct Misled {
    /// What was wrong, naming the index file, the entry and what was found.
    pub problem: String,
    /// [`SegmentIndexes::generation`] of the entries that misled.
    generation: u64,
}

/// The answer of a lookup through the indexes, or how an entry misled it.
pub(crate) type Lookup<T> = std::result::Result<T, Misled>;

/// How many times a lookup is tried before it fails: a heal rebuilds at most once, but the
/// entries may also be replaced meanwhile by a load, another reader's rebuild or recovery.
const MAX_LOOKUP_ATTEMPTS: usize = 4;

/// Runs the lookup `f` on `seg`; when an index entry misleads it, calls `heal` (which rebuilds
/// the indexes, or finds them replaced since, or gives up with an error) and tries again.
/// Errors of `f` itself (an unreadable log) are returned, and logged once per segment.
///
/// # Errors
/// `f`'s errors; `heal`'s; [`LogError::CorruptFile`] when the entries keep misleading.
pub(crate) fn lookup_healing<T>(
    seg: &LogSegment,
    partition: &dyn std::fmt::Display,
    mut f: impl FnMut(&LogSegment) -> Result<Lookup<T>>,
    mut heal: impl FnMut(Misled) -> Result<()>,
) -> Result<T> {
    let mut attempts = 0;
    loop {
        let misled = match f(seg) {
            Ok(Ok(found)) => return Ok(found),
            Ok(Err(misled)) => misled,
            Err(e) => {
                if matches!(e, LogError::CorruptFile { .. } | LogError::Batch(_)) {
                    seg.log_failure_once(&partition.to_string(), &e);
                }
                return Err(e);
            }
        };
        attempts += 1;
        if attempts >= MAX_LOOKUP_ATTEMPTS {
            return Err(seg.give_up(&partition.to_string(), &misled));
        }
        heal(misled)?;
    }
}

/// A fault a test injects into [`LogSegment::append`].
#[cfg(test)]
#[derive(Debug, Clone, Copy)]
pub(crate) enum FailAt {
    /// The data write stops after `after_bytes` bytes with OS error `errno`.
    LogWrite {
        /// Bytes written before the failure.
        after_bytes: usize,
        /// The raw OS error (e.g. ENOSPC).
        errno: i32,
    },
    /// Data and index entries are written, then the append fails with ENOSPC.
    AfterIndexing,
}

/// What [`LogSegment::append`] restores when an append fails.
struct AppendState {
    offset_entries: usize,
    time_entries: usize,
    max_timestamp: TimestampOffset,
    bytes_since_last_index_entry: u64,
}

/// A failed [`LogSegment::append`]: the error, and whether the segment was rolled back to
/// where the append began (else it may hold part of the batches: only recovery may decide).
#[derive(Debug)]
pub(crate) struct SegmentAppendError {
    pub error: LogError,
    pub rolled_back: bool,
}

const NO_TIMESTAMP: TimestampOffset = TimestampOffset {
    timestamp_ms: -1,
    offset: -1,
};

impl LogSegment {
    /// The `.log` file's descriptor (reopened if the open-file budget closed it).
    fn file(&self) -> Result<std::sync::Arc<File>> {
        self.log.get("opening segment")
    }

    /// Creates an empty segment in `dir` (truncating leftovers with the same base offset).
    pub(crate) fn create(
        dir: &Path,
        base_offset: i64,
        segment_index_bytes: u64,
        index_interval_bytes: u64,
        now_ms: i64,
    ) -> Result<Self> {
        Self::create_with_suffix(
            dir,
            base_offset,
            segment_index_bytes,
            index_interval_bytes,
            now_ms,
            "",
        )
    }

    /// Creates an empty segment whose three files carry `suffix` after their usual names (the
    /// cleaner writes `<base>.log.cleaned`, Kafka's `CleanedFileSuffix`). Its indexes are
    /// loaded (empty) and pinned: it is written to.
    pub(crate) fn create_with_suffix(
        dir: &Path,
        base_offset: i64,
        segment_index_bytes: u64,
        index_interval_bytes: u64,
        now_ms: i64,
        suffix: &str,
    ) -> Result<Self> {
        let log_path = dir.join(file_name(base_offset, "log") + suffix);
        let log = SegmentFile::open(&log_path, true, "creating segment")?;
        // A leftover transaction index of an earlier segment with this base offset (a log
        // truncated to it) is not this segment's.
        let txn_path = dir.join(file_name(base_offset, "txnindex") + suffix);
        match std::fs::remove_file(&txn_path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(LogError::io("removing", &txn_path, e)),
        }
        let offset_index = OffsetIndex::create(
            &dir.join(file_name(base_offset, "index") + suffix),
            segment_index_bytes,
        )?;
        let time_index = TimeIndex::create(
            &dir.join(file_name(base_offset, "timeindex") + suffix),
            segment_index_bytes,
        )?;
        Ok(Self::new(
            base_offset,
            log,
            0,
            SegmentIndexes::new(offset_index, time_index, false),
            index_interval_bytes,
            Some(NO_TIMESTAMP),
            now_ms,
        ))
    }

    fn new(
        base_offset: i64,
        log: SegmentFile,
        size: u64,
        indexes: SegmentIndexes,
        index_interval_bytes: u64,
        max_timestamp: Option<TimestampOffset>,
        now_ms: i64,
    ) -> Self {
        Self {
            base_offset,
            log,
            size_bytes: AtomicU64::new(size),
            indexes: Arc::new(indexes),
            index_interval_bytes,
            max_timestamp: Mutex::new(max_timestamp),
            bytes_since_last_index_entry: AtomicU64::new(0),
            rolling_based_timestamp: Mutex::new(None),
            created_ms: now_ms,
            deleted: AtomicBool::new(false),
            txn_index: TransactionIndex::new(),
            #[cfg(test)]
            fail_at: Mutex::new(None),
        }
    }

    /// Opens an existing segment without reading its index files: an inactive segment of a
    /// log being loaded (or swapped in by the cleaner). Its indexes are read and checked on
    /// first use ([`LogSegment::with_indexes`]) and held within the index cache's budget.
    ///
    /// # Errors
    /// [`LogError::Io`] when the `.log` file cannot be opened.
    pub(crate) fn open_lazy(
        dir: &Path,
        base_offset: i64,
        segment_index_bytes: u64,
        index_interval_bytes: u64,
        now_ms: i64,
    ) -> Result<Self> {
        Self::open_unloaded(
            dir,
            base_offset,
            segment_index_bytes,
            index_interval_bytes,
            now_ms,
            true,
        )
    }

    fn open_unloaded(
        dir: &Path,
        base_offset: i64,
        segment_index_bytes: u64,
        index_interval_bytes: u64,
        now_ms: i64,
        evictable: bool,
    ) -> Result<Self> {
        let log_path = dir.join(file_name(base_offset, "log"));
        let log = SegmentFile::open(&log_path, false, "opening segment")?;
        let size = log
            .get("opening segment")?
            .metadata()
            .map_err(|e| LogError::io("reading metadata of", &log_path, e))?
            .len();
        let indexes = SegmentIndexes::new(
            OffsetIndex::unloaded(
                &dir.join(file_name(base_offset, "index")),
                segment_index_bytes,
            ),
            TimeIndex::unloaded(
                &dir.join(file_name(base_offset, "timeindex")),
                segment_index_bytes,
            ),
            evictable,
        );
        Ok(Self::new(
            base_offset,
            log,
            size,
            indexes,
            index_interval_bytes,
            None,
            now_ms,
        ))
    }

    /// Opens an existing segment that is to be written (the active segment of a log being
    /// loaded), reading and checking its indexes now. Returns it and, when its indexes are not
    /// sane, what is wrong (naming the file): the caller must then [`LogSegment::recover`] it,
    /// which rebuilds them.
    ///
    /// # Errors
    /// [`LogError::Io`] when a file cannot be opened or read.
    pub(crate) fn open(
        dir: &Path,
        base_offset: i64,
        segment_index_bytes: u64,
        index_interval_bytes: u64,
        now_ms: i64,
    ) -> Result<(Self, Option<String>)> {
        let seg = Self::open_unloaded(
            dir,
            base_offset,
            segment_index_bytes,
            index_interval_bytes,
            now_ms,
            false,
        )?;
        let loaded = match seg.read_indexes()? {
            Ok(loaded) => loaded,
            Err(problem) => return Ok((seg, Some(problem))),
        };
        seg.install_indexes(loaded);
        if seg.size() > 0 {
            seg.load_rolling_based_timestamp();
        }
        Ok((seg, None))
    }

    /// Reads both index files and checks them (see the module docs). Returns the entries, or
    /// what is wrong with them.
    ///
    /// # Errors
    /// [`LogError::Io`] when a file cannot be read.
    fn read_indexes(&self) -> Result<std::result::Result<LoadedIndexes, String>> {
        let size = self.size();
        let trim = !self.deleted.load(Ordering::Acquire);
        let offsets = self
            .indexes
            .offset
            .read_file(|e| u64::from(e.position) < size, trim)?;
        self.indexes
            .bytes_read
            .fetch_add(offsets.bytes_read, Ordering::Relaxed);
        if let Some(problem) = offsets.problem {
            return Ok(Err(problem));
        }
        let times = self.indexes.time.read_file(|e| e.timestamp_ms >= 0, trim)?;
        self.indexes
            .bytes_read
            .fetch_add(times.bytes_read, Ordering::Relaxed);
        if let Some(problem) = times.problem {
            return Ok(Err(problem));
        }
        // The last offset-index entry must point at a batch ending at its offset.
        if let Some(e) = offsets.entries.last() {
            let mut hdr = [0u8; BATCH_HEADER_LEN];
            let expected = self.base_offset + i64::from(e.relative_offset);
            let found = self
                .file()?
                .read_exact_at(&mut hdr, u64::from(e.position))
                .ok()
                .and_then(|()| BatchHeader::parse(&hdr).ok());
            if found.map(|h| h.last_offset()) != Some(expected) {
                return Ok(Err(format!(
                    "{}: the last entry points at position {}, where no batch ends at offset \
                     {expected}",
                    self.indexes.offset.path().display(),
                    e.position
                )));
            }
            // A time entry goes with every offset entry once a batch had a timestamp.
            if times.entries.is_empty() && found.is_some_and(|h| h.max_timestamp >= 0) {
                return Ok(Err(format!(
                    "{} is empty, but the batch ending at offset {expected} has a timestamp",
                    self.indexes.time.path().display()
                )));
            }
        }
        // The last time entry must be the max timestamp of the batch ending at its offset.
        if let Some(t) = times.entries.last() {
            let target = self.base_offset + i64::from(t.relative_offset);
            let start = floor_by(&offsets.entries, |e| e.relative_offset <= t.relative_offset)
                .map_or(0, |e| u64::from(e.position));
            let mut found = None;
            let walked = self.walk_headers(start, size, WALK_CHUNK_BYTES, |_, h| {
                if h.last_offset() >= target {
                    found = Some((h.last_offset(), h.max_timestamp));
                    Ok(false)
                } else {
                    Ok(true)
                }
            });
            if walked.is_err() || found != Some((target, t.timestamp_ms)) {
                return Ok(Err(format!(
                    "{}: the last entry ({} ms at offset {target}) is not the max timestamp of \
                     the batch ending at that offset",
                    self.indexes.time.path().display(),
                    t.timestamp_ms
                )));
            }
        }
        Ok(Ok(LoadedIndexes {
            offsets: offsets.entries,
            offsets_file_len: offsets.file_len,
            times: times.entries,
            times_file_len: times.file_len,
        }))
    }

    /// Stores loaded entries in both indexes (charging them to the index cache when the
    /// segment is inactive) and the max timestamp they give, and bumps the entries'
    /// generation. Called under `load_lock` (or before the segment is shared).
    fn install_indexes(&self, loaded: LoadedIndexes) {
        let last = loaded.times.last().copied();
        index_cache::install(&self.indexes, || {
            self.indexes
                .offset
                .install(loaded.offsets, loaded.offsets_file_len)
                + self
                    .indexes
                    .time
                    .install(loaded.times, loaded.times_file_len)
        });
        // Checked: it replaces what the time index's tail alone gave.
        *self.max_timestamp.lock() = Some(self.timestamp_offset(last));
        // After both installs: a lookup that saw the old entries reads the old generation.
        self.indexes.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Loads the indexes if they are not (see [`LogSegment::with_indexes`]), which checks the
    /// max timestamp read from the time index's tail.
    ///
    /// # Errors
    /// As [`LogSegment::with_indexes`].
    pub(crate) fn load_indexes(&self) -> Result<()> {
        self.with_indexes(|_, _| ())
    }

    fn timestamp_offset(&self, e: Option<TimeEntry>) -> TimestampOffset {
        e.map_or(NO_TIMESTAMP, |e| TimestampOffset {
            timestamp_ms: e.timestamp_ms,
            offset: self.base_offset + i64::from(e.relative_offset),
        })
    }

    /// Runs `f` on the offset and time index entries, loading them first if they are not (see
    /// the module docs): read and checked, or rebuilt from the log when not sane. `f` runs
    /// under the entries' read locks and must not call back into the segment's indexes.
    ///
    /// # Errors
    /// [`LogError::Io`] when the files cannot be read, or a rebuild cannot read the log or
    /// write the index files.
    pub(crate) fn with_indexes<R>(
        &self,
        f: impl FnOnce(&[OffsetEntry], &[TimeEntry]) -> R,
    ) -> Result<R> {
        self.with_indexes_gen(|o, t, _| f(o, t))
    }

    /// [`LogSegment::with_indexes`], also passing `f` the generation of the entries it sees
    /// (what a [`Misled`] reports).
    fn with_indexes_gen<R>(
        &self,
        f: impl FnOnce(&[OffsetEntry], &[TimeEntry], u64) -> R,
    ) -> Result<R> {
        let generation = || self.indexes.generation.load(Ordering::Acquire);
        {
            let offsets = self.indexes.offset.entries();
            let times = self.indexes.time.entries();
            if let (Some(o), Some(t)) = (offsets.as_deref(), times.as_deref()) {
                self.indexes.slot.touch();
                return Ok(f(o, t, generation()));
            }
        }
        let _load = self.indexes.load_lock.lock();
        {
            let offsets = self.indexes.offset.entries();
            let times = self.indexes.time.entries();
            if let (Some(o), Some(t)) = (offsets.as_deref(), times.as_deref()) {
                self.indexes.slot.touch();
                return Ok(f(o, t, generation()));
            }
        }
        index_cache::record_load(&self.indexes.slot);
        let loaded = match self.read_indexes()? {
            Ok(loaded) => loaded,
            Err(problem) if self.is_deleted() => {
                // Being deleted: its files may be gone. A reader that still holds it walks
                // from the start of the segment; nothing is written or kept.
                tracing::debug!(segment = %self.log_path().display(), %problem,
                    "index of a segment being deleted is unusable; reading without it");
                return Ok(f(&[], &[], generation()));
            }
            Err(problem) => {
                tracing::warn!(segment = %self.log_path().display(), %problem,
                    "index files of an inactive segment are not sane; rebuilding them from \
                     the log");
                let rebuilt = self.rebuild_indexes()?;
                self.count_rebuild();
                rebuilt
            }
        };
        // Under `load_lock`, the install below is the only bump: these entries are its.
        let r = f(&loaded.offsets, &loaded.times, generation() + 1);
        self.install_indexes(loaded);
        Ok(r)
    }

    /// Rebuilds both indexes of an inactive segment from its batch headers and writes them to
    /// their files (not for a segment being deleted). Walks headers without validating CRCs;
    /// stops at the first header that cannot be read or whose offsets go backwards (logging
    /// it), so the indexes cover the batches before it. Sets the max timestamp to what the
    /// batches hold.
    ///
    /// # Errors
    /// [`LogError::Io`] when the log cannot be read or an index file written.
    fn rebuild_indexes(&self) -> Result<LoadedIndexes> {
        let mut scan = self.new_scan();
        self.scan_headers(&mut scan, self.size())?;
        let (offsets, times, max) = self.finish_scan(scan).finish();
        let loaded = self.write_rebuilt(offsets, times)?;
        *self.max_timestamp.lock() = Some(max);
        Ok(loaded)
    }

    fn new_scan(&self) -> IndexScan {
        IndexScan {
            builder: IndexBuilder {
                base_offset: self.base_offset,
                index_interval_bytes: self.index_interval_bytes,
                bytes_since_last_index_entry: 0,
                max: NO_TIMESTAMP,
                offsets: Vec::new(),
                times: Vec::new(),
            },
            position: 0,
            next_offset: self.base_offset,
            stopped: None,
        }
    }

    /// Goes on with `scan` up to `end` (a published size), unless it stopped before.
    ///
    /// # Errors
    /// [`LogError::Io`] when the log cannot be read.
    pub(crate) fn scan_headers(&self, scan: &mut IndexScan, end: u64) -> Result<()> {
        if scan.stopped.is_some() || scan.position >= end {
            return Ok(());
        }
        let path = self.log_path();
        let file = self.file()?;
        let mut reader = ChunkReader::new(&file, &path, end, SCAN_CHUNK_BYTES);
        while scan.position < end {
            let position = scan.position;
            let Some(raw) = reader.get(position, BATCH_HEADER_LEN)? else {
                scan.stopped = Some("a batch header cut short".to_string());
                break;
            };
            let h = match BatchHeader::parse(raw) {
                Ok(h) => h,
                Err(e) => {
                    scan.stopped = Some(format!("an unreadable batch header ({e})"));
                    break;
                }
            };
            let total = match checked_total_size(&h) {
                Some(t) if position + t as u64 <= end => t as u64,
                _ => {
                    scan.stopped = Some(format!("an impossible batch length {}", h.batch_length));
                    break;
                }
            };
            if h.base_offset < scan.next_offset
                || !self.can_convert_to_relative_offset(h.last_offset())
            {
                scan.stopped = Some(format!(
                    "a batch at offset {} where offset {} or later was expected",
                    h.base_offset, scan.next_offset
                ));
                break;
            }
            scan.builder.add(&h, position, total);
            scan.next_offset = h.next_offset();
            scan.position += total;
        }
        Ok(())
    }

    /// The builder of a finished scan, logging where it stopped if it did.
    fn finish_scan(&self, scan: IndexScan) -> IndexBuilder {
        if let Some(what) = scan.stopped {
            tracing::warn!(segment = %self.log_path().display(), position = scan.position,
                next_offset = scan.next_offset,
                "rebuilding the indexes stopped at {what}; reads past it fail");
        }
        scan.builder
    }

    /// Writes rebuilt entries to the index files (unless the segment is being deleted).
    fn write_rebuilt(
        &self,
        offsets: Vec<OffsetEntry>,
        times: Vec<TimeEntry>,
    ) -> Result<LoadedIndexes> {
        let (mut offsets_file_len, mut times_file_len) = (0, 0);
        if !self.is_deleted() {
            offsets_file_len = self.indexes.offset.rewrite(&offsets)?;
            times_file_len = self.indexes.time.rewrite(&times)?;
        }
        Ok(LoadedIndexes {
            offsets,
            offsets_file_len,
            times,
            times_file_len,
        })
    }

    fn count_rebuild(&self) {
        self.indexes.rebuilds.fetch_add(1, Ordering::Relaxed);
        index_cache::record_rebuild(&self.indexes.slot);
    }

    /// Times this segment's indexes were rebuilt from its log while it was served (found not
    /// sane on load, or misleading a read).
    pub(crate) fn index_rebuilds(&self) -> u64 {
        self.indexes.rebuilds.load(Ordering::Relaxed)
    }

    /// Decides what to do about `misled` (under `load_lock`): `None` when the entries were
    /// replaced since the lookup (try again), a new scan when they are to be rebuilt (logging
    /// a warning).
    ///
    /// # Errors
    /// [`LogError::CorruptFile`] when a read already rebuilt them once ([`Self::give_up`]).
    fn heal_decision(&self, partition: &str, misled: &Misled) -> Result<Option<IndexScan>> {
        if self.indexes.generation.load(Ordering::Acquire) != misled.generation {
            return Ok(None);
        }
        if self.indexes.healed.load(Ordering::Acquire) {
            return Err(self.give_up(partition, misled));
        }
        tracing::warn!(
            partition,
            base_offset = self.base_offset,
            segment = %self.log_path().display(),
            problem = %misled.problem,
            "an index entry misled a read; rebuilding the segment's offset and time indexes \
             from its log and reading again"
        );
        Ok(Some(self.new_scan()))
    }

    /// Installs the indexes `scan` (finished up to the published size) built, writing their
    /// files. `active`: the segment is still written (the caller holds the partition's append
    /// lock), so the entries stop where appends go on. Called under `load_lock`.
    fn install_rebuilt(&self, scan: IndexScan, active: bool) -> Result<()> {
        let builder = self.finish_scan(scan);
        if active {
            let (offsets, times, max, since) = builder.finish_active();
            let loaded = self.write_rebuilt(offsets, times)?;
            self.install_indexes(loaded);
            *self.max_timestamp.lock() = Some(max);
            self.bytes_since_last_index_entry
                .store(since, Ordering::Relaxed);
        } else {
            let (offsets, times, max) = builder.finish();
            let loaded = self.write_rebuilt(offsets, times)?;
            self.install_indexes(loaded);
            *self.max_timestamp.lock() = Some(max);
        }
        self.indexes.healed.store(true, Ordering::Release);
        self.count_rebuild();
        Ok(())
    }

    /// Heals the indexes after `misled` when nothing appends to the segment meanwhile (it is
    /// inactive, or the caller holds the partition's append lock; `active` says whether
    /// appends go on afterwards): rebuilds them from the log under `load_lock`, so that lazy
    /// loads and other healers wait for the result. Returns when the lookup is to be tried
    /// again.
    ///
    /// # Errors
    /// [`LogError::CorruptFile`] when a read rebuilt them once already; [`LogError::Io`].
    pub(crate) fn heal_exclusive(
        &self,
        partition: &str,
        misled: &Misled,
        active: bool,
    ) -> Result<()> {
        let _load = self.indexes.load_lock.lock();
        let Some(mut scan) = self.heal_decision(partition, misled)? else {
            return Ok(());
        };
        self.scan_headers(&mut scan, self.size())?;
        self.install_rebuilt(scan, active)
    }

    /// The first half of healing the active segment's indexes while appends go on: decides
    /// (as [`LogSegment::heal_exclusive`]) and scans the log up to its published size without
    /// any lock over the log. `None`: try the lookup again. The caller holds
    /// [`LogSegment::heal_guard`], then takes the append lock and calls
    /// [`LogSegment::heal_finish`].
    ///
    /// # Errors
    /// As [`LogSegment::heal_exclusive`].
    pub(crate) fn heal_scan(&self, partition: &str, misled: &Misled) -> Result<Option<IndexScan>> {
        let scan = {
            let _load = self.indexes.load_lock.lock();
            self.heal_decision(partition, misled)?
        };
        let Some(mut scan) = scan else {
            return Ok(None);
        };
        self.scan_headers(&mut scan, self.size())?;
        Ok(Some(scan))
    }

    /// The second half: with appends excluded (the caller holds the append lock; `active`
    /// says whether the segment is still the one written), scans what was appended since
    /// [`LogSegment::heal_scan`] and installs the result, unless the entries were replaced
    /// meanwhile (a truncation's recovery).
    ///
    /// # Errors
    /// As [`LogSegment::heal_exclusive`].
    pub(crate) fn heal_finish(
        &self,
        misled: &Misled,
        mut scan: IndexScan,
        active: bool,
    ) -> Result<()> {
        let _load = self.indexes.load_lock.lock();
        if self.indexes.generation.load(Ordering::Acquire) != misled.generation {
            return Ok(());
        }
        self.scan_headers(&mut scan, self.size())?;
        self.install_rebuilt(scan, active)
    }

    /// Held by a reader for the whole of a heal, so that readers misled at once rebuild once.
    pub(crate) fn heal_guard(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.indexes.heal_lock.lock()
    }

    /// The error a lookup answers when the indexes keep misleading (logged once).
    fn give_up(&self, partition: &str, misled: &Misled) -> LogError {
        let e = LogError::CorruptFile {
            path: self.log_path().display().to_string(),
            reason: format!(
                "the segment's index misleads reads even after it was rebuilt from the log: {}",
                misled.problem
            ),
        };
        self.log_failure_once(partition, &e);
        e
    }

    /// Logs the first failure of a read of this segment (the log or its rebuilt index is
    /// unusable: the read fails, and a restart's recovery is what can repair it).
    fn log_failure_once(&self, partition: &str, e: &LogError) {
        if !self.indexes.failure_logged.swap(true, Ordering::AcqRel) {
            tracing::error!(partition, base_offset = self.base_offset,
                segment = %self.log_path().display(), error = %e,
                "a read of this segment failed; the segment's files need repair (further \
                 failures of this segment are not logged)");
        }
    }

    /// The number of offset and time index entries (loading them if needed).
    ///
    /// # Errors
    /// As [`LogSegment::with_indexes`].
    pub(crate) fn index_entry_counts(&self) -> Result<(usize, usize)> {
        self.with_indexes(|o, t| (o.len(), t.len()))
    }

    /// Whether the offset or time index holds `segment.index.bytes` of entries (the active
    /// segment must roll).
    pub(crate) fn indexes_full(&self) -> bool {
        self.indexes.offset.is_full() || self.indexes.time.is_full()
    }

    /// Bytes of this segment's index files read so far.
    pub(crate) fn index_bytes_read(&self) -> u64 {
        self.indexes.bytes_read.load(Ordering::Relaxed)
    }

    /// Marks the segment as no longer written (after a roll, or once its log has loaded):
    /// closes its index files' descriptors and lets the index cache hold and drop its entries.
    pub(crate) fn set_inactive(&self) {
        self.indexes.offset.file().close();
        self.indexes.time.file().close();
        index_cache::make_evictable(&self.indexes, || {
            self.indexes.offset.shrink() + self.indexes.time.shrink()
        });
    }

    /// Whether the index entries are loaded now (tests).
    #[cfg(test)]
    pub(crate) fn indexes_loaded(&self) -> bool {
        self.indexes.offset.entries().is_some() && self.indexes.time.entries().is_some()
    }

    fn load_rolling_based_timestamp(&self) {
        let mut hdr = [0u8; BATCH_HEADER_LEN];
        if self.size() >= BATCH_HEADER_LEN as u64
            && self
                .file()
                .is_ok_and(|f| f.read_exact_at(&mut hdr, 0).is_ok())
        {
            if let Ok(h) = BatchHeader::parse(&hdr) {
                *self.rolling_based_timestamp.lock() = Some(h.max_timestamp);
            }
        }
    }

    /// First offset this segment may hold (its file name).
    pub(crate) fn base_offset(&self) -> i64 {
        self.base_offset
    }

    /// Path of the `.txnindex` file: the `.log` file's name with `txnindex` for `log`, the
    /// same suffix (it follows the segment's renames).
    pub(crate) fn txn_index_path(&self) -> PathBuf {
        let log_path = self.log_path();
        let log_name = file_name(self.base_offset, "log");
        let suffix = log_path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix(log_name.as_str()))
            .unwrap_or("")
            .to_string();
        log_path.with_file_name(file_name(self.base_offset, "txnindex") + &suffix)
    }

    /// Records an aborted transaction whose marker is in this segment.
    ///
    /// # Errors
    /// As [`TransactionIndex::append`].
    pub(crate) fn append_aborted_txn(&self, txn: &AbortedTxn) -> Result<()> {
        self.txn_index.append(&self.txn_index_path(), txn)
    }

    /// Kafka's `LogSegment.collectAbortedTxns` (see [`TransactionIndex::collect`]).
    ///
    /// # Errors
    /// As [`TransactionIndex::collect`].
    pub(crate) fn collect_aborted_txns(
        &self,
        fetch_offset: i64,
        upper_bound_offset: i64,
        out: &mut Vec<AbortedTxn>,
    ) -> Result<bool> {
        self.txn_index.collect(
            &self.txn_index_path(),
            fetch_offset,
            upper_bound_offset,
            out,
        )
    }

    /// Every aborted transaction of this segment's index.
    ///
    /// # Errors
    /// As [`TransactionIndex::all`].
    pub(crate) fn aborted_txns(&self) -> Result<Vec<AbortedTxn>> {
        self.txn_index.all(&self.txn_index_path())
    }

    /// Removes the transaction-index entries of markers at or after `offset`.
    ///
    /// # Errors
    /// As [`TransactionIndex::truncate_to`].
    pub(crate) fn truncate_txn_index(&self, offset: i64) -> Result<()> {
        self.txn_index.truncate_to(&self.txn_index_path(), offset)
    }

    /// Empties the transaction index (recovery rebuilds it).
    ///
    /// # Errors
    /// [`LogError::Io`].
    pub(crate) fn reset_txn_index(&self) -> Result<()> {
        self.txn_index.reset(&self.txn_index_path())
    }

    /// Path of the `.log` file (its current name: a segment being deleted carries the
    /// `.deleted` suffix).
    pub(crate) fn log_path(&self) -> PathBuf {
        self.log.path()
    }

    /// Records that the segment's files were renamed to carry `suffix` (see
    /// [`rename_segment_files`]), so that a descriptor the open-file budget closed is reopened
    /// by the new names.
    pub(crate) fn set_suffix(&self, dir: &Path, suffix: &str) {
        self.log
            .set_path(dir.join(file_name(self.base_offset, "log") + suffix));
        self.indexes
            .offset
            .file()
            .set_path(dir.join(file_name(self.base_offset, "index") + suffix));
        self.indexes
            .time
            .file()
            .set_path(dir.join(file_name(self.base_offset, "timeindex") + suffix));
    }

    /// Keeps the `.log` file readable by the readers that still hold this segment while it
    /// is renamed and deleted ([`SegmentFile::pin`]); its index files close and are never
    /// written again: a reader that needs entries not loaded reads them from the renamed files
    /// while they exist, and walks the segment from its start once they are gone.
    ///
    /// # Errors
    /// [`LogError::Io`] when the file cannot be opened.
    pub(crate) fn pin_for_deletion(&self) -> Result<()> {
        self.deleted.store(true, Ordering::Release);
        self.log.pin("opening segment")?;
        self.indexes.offset.file().close();
        self.indexes.time.file().close();
        Ok(())
    }

    /// Records that the segment's files are being deleted without
    /// [`LogSegment::pin_for_deletion`] (the whole log is replaced): its index files are never
    /// written again.
    pub(crate) fn mark_deleted(&self) {
        self.deleted.store(true, Ordering::Release);
    }

    /// Whether the segment is being deleted: marked so, or its `.log` file is no longer where
    /// it should be (its partition's directory was renamed for deletion). Asked only when an
    /// index file is found unusable.
    fn is_deleted(&self) -> bool {
        self.deleted.load(Ordering::Acquire) || !self.log_path().exists()
    }

    /// Closes the segment's descriptors now (a later use reopens them).
    pub(crate) fn close_files(&self) {
        self.log.close();
        self.indexes.offset.file().close();
        self.indexes.time.file().close();
    }

    /// Published size in bytes: readers never look past it.
    pub(crate) fn size(&self) -> u64 {
        self.size_bytes.load(Ordering::Acquire)
    }

    /// Largest timestamp and the last offset of the batch that holds it (Kafka's
    /// `readMaxTimestampAndOffsetSoFar`). For an inactive segment opened without its indexes
    /// the first call reads only the time index's last entry (its final entry is the
    /// segment's max timestamp, [`LogSegment::on_become_inactive`]): one small read, without
    /// loading the entries. A file whose end cannot be trusted that way (missing, a partial
    /// entry, zeros of preallocation, entries out of order) is loaded and checked whole. A
    /// corrupt last entry that still follows the one before it is trusted until the indexes
    /// are loaded, which replaces it with the checked value (Kafka trusts it always); callers
    /// that act on it irreversibly load first ([`LogSegment::load_indexes`]).
    ///
    /// # Errors
    /// [`LogError::Io`] when the time index cannot be read (or, loaded whole, rebuilt).
    pub(crate) fn max_timestamp(&self) -> Result<TimestampOffset> {
        if let Some(max) = *self.max_timestamp.lock() {
            return Ok(max);
        }
        let (tail, bytes_read) = self.indexes.time.read_tail()?;
        self.indexes
            .bytes_read
            .fetch_add(bytes_read, Ordering::Relaxed);
        let max = match tail {
            Tail::Empty => NO_TIMESTAMP,
            Tail::Last(e)
                if e.timestamp_ms >= 0
                    && self.can_convert_to_relative_offset(
                        self.base_offset + i64::from(e.relative_offset),
                    ) =>
            {
                self.timestamp_offset(Some(e))
            }
            _ => {
                let last = self.with_indexes(|_, t| t.last().copied())?;
                self.timestamp_offset(last)
            }
        };
        Ok(*self.max_timestamp.lock().get_or_insert(max))
    }

    /// The max timestamp as the appender knows it (the active segment's is always known).
    fn known_max_timestamp(&self) -> TimestampOffset {
        self.max_timestamp.lock().unwrap_or(NO_TIMESTAMP)
    }

    /// Kafka's `LogSegment.largestTimestamp`: the largest record timestamp, or the file's
    /// modification time (ms) when no batch has a timestamp. Retention by time compares it
    /// with `retention.ms`.
    ///
    /// # Errors
    /// As [`LogSegment::max_timestamp`].
    pub(crate) fn largest_timestamp_ms(&self) -> Result<i64> {
        let max = self.max_timestamp()?.timestamp_ms;
        if max > 0 {
            return Ok(max);
        }
        Ok(self.last_modified_ms())
    }

    /// The `.log` file's modification time in ms since the epoch (0 if unknown).
    pub(crate) fn last_modified_ms(&self) -> i64 {
        std::fs::metadata(self.log.path())
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    }

    /// Max timestamp of the first batch (Kafka's `rollingBasedTimestamp`), if known: the
    /// cleaner's `max.compaction.lag.ms` check uses it.
    pub(crate) fn first_batch_timestamp_ms(&self) -> Option<i64> {
        if self.rolling_based_timestamp.lock().is_none() && self.size() > 0 {
            self.load_rolling_based_timestamp();
        }
        *self.rolling_based_timestamp.lock()
    }

    /// Calls `f` with the position, header and bytes of every whole batch in `[start, end)`,
    /// reading through a buffer of `chunk_bytes` (grown for larger batches), until `f` returns
    /// `false`.
    ///
    /// # Errors
    /// [`LogError::CorruptFile`] for a torn or unreadable batch; `f`'s errors.
    pub(crate) fn for_each_batch(
        &self,
        start: u64,
        end: u64,
        chunk_bytes: usize,
        mut f: impl FnMut(u64, &BatchHeader, &[u8]) -> Result<bool>,
    ) -> Result<()> {
        let path = self.log_path();
        let file = self.file()?;
        let mut reader = ChunkReader::new(&file, &path, end, chunk_bytes);
        let mut position = start;
        while position < end {
            let corrupt = |reason: String| LogError::CorruptFile {
                path: path.display().to_string(),
                reason,
            };
            let Some(raw) = reader.get(position, BATCH_HEADER_LEN)? else {
                return Err(corrupt(format!("torn batch header at position {position}")));
            };
            let h = BatchHeader::parse(raw)?;
            let Some(total) = checked_total_size(&h) else {
                return Err(corrupt(format!("bad batch length at position {position}")));
            };
            let Some(raw) = reader.get(position, total)? else {
                return Err(corrupt(format!("torn batch at position {position}")));
            };
            if !f(position, &h, raw)? {
                return Ok(());
            }
            position += total as u64;
        }
        Ok(())
    }

    /// Kafka's `timeWaitedForRoll`: ms since the first batch's timestamp (measured with the
    /// timestamp of the incoming batch), or since creation when no batch has a timestamp.
    pub(crate) fn time_waited_for_roll_ms(&self, now_ms: i64, message_timestamp_ms: i64) -> i64 {
        match *self.rolling_based_timestamp.lock() {
            Some(ts) if ts >= 0 => message_timestamp_ms.saturating_sub(ts),
            _ => now_ms.saturating_sub(self.created_ms),
        }
    }

    fn relative(&self, offset: i64) -> u32 {
        (offset - self.base_offset) as u32
    }

    /// Whether `offset` fits the 32-bit relative offsets of the indexes.
    pub(crate) fn can_convert_to_relative_offset(&self, offset: i64) -> bool {
        let rel = offset - self.base_offset;
        (0..=i64::from(i32::MAX)).contains(&rel)
    }

    /// Updates indexes and the max timestamp for a batch at `position` (Kafka's
    /// `LogSegment.append` loop).
    fn index_batch(
        &self,
        h: &BatchHeader,
        position: u64,
        size: u64,
        index_interval_bytes: u64,
    ) -> Result<()> {
        let due = {
            let mut max = self.max_timestamp.lock();
            let max = max.get_or_insert(NO_TIMESTAMP);
            let mut since = self.bytes_since_last_index_entry.load(Ordering::Relaxed);
            let due = index_step(
                self.base_offset,
                max,
                &mut since,
                h,
                position,
                size,
                index_interval_bytes,
            );
            self.bytes_since_last_index_entry
                .store(since, Ordering::Relaxed);
            due
        };
        if let Some((offset, time)) = due {
            self.indexes.offset.append(offset)?;
            if let Some(t) = time {
                self.indexes.time.append(t)?;
            }
        }
        Ok(())
    }

    /// Appends `buf`, which holds exactly the batches `headers` (in order), at the end of the
    /// segment, indexes them and publishes the new size. Called under the append lock.
    ///
    /// A failed append leaves nothing behind when it can: the file is cut back to the size it
    /// had ([`LogSegment::rollback`]), the index entries it added are dropped and the max
    /// timestamp and index bookkeeping restored, so the segment is exactly as before and
    /// further appends may follow. Readers never saw the bytes (the size was not published).
    /// The cut is not fsynced: until the next flush a crash may leave the partial batch after
    /// the last complete one, beyond the recovery point, where recovery validates every batch
    /// and truncates the torn tail.
    ///
    /// # Errors
    /// [`SegmentAppendError`]: the write or index error, and whether the rollback succeeded.
    pub(crate) fn append(
        &self,
        buf: &[u8],
        headers: &[BatchHeader],
        index_interval_bytes: u64,
    ) -> std::result::Result<(), SegmentAppendError> {
        // The descriptor is taken first: when it cannot be opened (the process is out of
        // descriptors, EMFILE), nothing was written and there is nothing to roll back. The
        // rollback cuts the file through the same descriptor, so it needs no other.
        let file = self.file().map_err(|error| SegmentAppendError {
            error,
            rolled_back: true,
        })?;
        let start = self.size();
        let saved = self.save_append_state();
        match self.append_unrolled(&file, start, buf, headers, index_interval_bytes) {
            Ok(()) => Ok(()),
            Err(error) => {
                let rolled_back = match self.rollback(&file, start, &saved) {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::error!(segment = %self.log_path().display(), error = %e,
                            "could not roll back a failed append");
                        false
                    }
                };
                Err(SegmentAppendError { error, rolled_back })
            }
        }
    }

    fn append_unrolled(
        &self,
        file: &File,
        start: u64,
        buf: &[u8],
        headers: &[BatchHeader],
        index_interval_bytes: u64,
    ) -> Result<()> {
        self.write_at(file, buf, start)
            .map_err(|e| LogError::io("appending to", &self.log_path(), e))?;
        let mut pos = start;
        for h in headers {
            let size = h.total_size() as u64;
            self.index_batch(h, pos, size, index_interval_bytes)?;
            pos += size;
        }
        #[cfg(test)]
        if let Some(FailAt::AfterIndexing) = *self.fail_at.lock() {
            return Err(LogError::io(
                "appending to",
                &self.log_path(),
                std::io::Error::from_raw_os_error(rustix::io::Errno::NOSPC.raw_os_error()),
            ));
        }
        if start == 0 {
            if let Some(first) = headers.first() {
                *self.rolling_based_timestamp.lock() = Some(first.max_timestamp);
            }
        }
        debug_assert_eq!(pos, start + buf.len() as u64);
        self.size_bytes.store(pos, Ordering::Release);
        Ok(())
    }

    fn write_at(&self, file: &File, buf: &[u8], at: u64) -> std::io::Result<()> {
        #[cfg(test)]
        if let Some(FailAt::LogWrite { after_bytes, errno }) = *self.fail_at.lock() {
            let n = after_bytes.min(buf.len());
            file.write_all_at(&buf[..n], at)?;
            return Err(std::io::Error::from_raw_os_error(errno));
        }
        file.write_all_at(buf, at)
    }

    fn save_append_state(&self) -> AppendState {
        AppendState {
            offset_entries: self.indexes.offset.len(),
            time_entries: self.indexes.time.len(),
            max_timestamp: self.known_max_timestamp(),
            bytes_since_last_index_entry: self.bytes_since_last_index_entry.load(Ordering::Relaxed),
        }
    }

    /// Undoes a failed append that started at `size`: cuts the file (ftruncate needs no free
    /// space), drops the index entries added since `saved` and restores the bookkeeping.
    fn rollback(&self, file: &File, size: u64, saved: &AppendState) -> Result<()> {
        file.set_len(size)
            .map_err(|e| LogError::io("truncating a failed append in", &self.log_path(), e))?;
        self.indexes.offset.truncate_entries(saved.offset_entries)?;
        self.indexes.time.truncate_entries(saved.time_entries)?;
        *self.max_timestamp.lock() = Some(saved.max_timestamp);
        self.bytes_since_last_index_entry
            .store(saved.bytes_since_last_index_entry, Ordering::Relaxed);
        self.size_bytes.store(size, Ordering::Release);
        Ok(())
    }

    /// Test hook: makes the next appends fail as `fail` says (None: no fault).
    #[cfg(test)]
    pub(crate) fn inject_fault(&self, fail: Option<FailAt>) {
        *self.fail_at.lock() = fail;
    }

    /// How many times the `.log` file was truncated in place so far (see
    /// [`crate::files::SendPin::is_intact`]).
    pub(crate) fn truncations(&self) -> u64 {
        self.log.truncations()
    }

    /// Pins the `.log` file for a response that sends bytes of it from the descriptor;
    /// `truncations` is [`LogSegment::truncations`] from before the bytes were chosen. `None`
    /// when no pin is free ([`crate::files::max_send_pinned_files`]).
    ///
    /// # Errors
    /// [`LogError::Io`] when the file cannot be reopened.
    pub(crate) fn send_pin(&self, truncations: u64) -> Result<Option<crate::files::SendPin>> {
        self.log.send_pin(truncations, "opening segment")
    }

    /// The `.log` file's descriptor, for [`LogSegment::fetch_extent`].
    ///
    /// # Errors
    /// [`LogError::Io`] when the file cannot be reopened.
    pub(crate) fn log_file(&self) -> Result<std::sync::Arc<File>> {
        self.file()
    }

    /// The bytes a fetch returns from this segment, found from the batch headers alone: the
    /// whole batches from `position` (where the batch `first` starts) that end by `limit` and
    /// whose last offsets are below `upper`, stopping at the first that does not, or at a
    /// header that does not parse. This is the rule the copying read applies to the bytes
    /// `[position, limit)` it read ([`gregor_protocol::batch::Batches`]), so both send the same
    /// bytes. After a batch of at least [`WALK_CHUNK_BYTES`] only the next header is read;
    /// after a smaller one, the next chunk, appended to the previous one (so a walk over small
    /// batches reads each byte once, one read per chunk). When those reads covered the whole
    /// range, its bytes come back too: sending them from the file would save nothing.
    ///
    /// # Errors
    /// [`LogError::Io`] when the file cannot be read.
    pub(crate) fn fetch_extent(
        &self,
        file: &File,
        position: u64,
        first: &BatchHeader,
        limit: u64,
        upper: i64,
    ) -> Result<FetchExtent> {
        let mut buf: Vec<u8> = Vec::new();
        let mut buf_start = position;
        let mut at = position;
        let mut records: i64 = 0;
        // The first header is known; a large first batch needs no read at all.
        let mut known = Some(*first);
        let mut next_read = WALK_CHUNK_BYTES;
        while at < limit {
            let header_end = at + BATCH_HEADER_LEN as u64;
            if header_end > limit {
                break;
            }
            let h = match known.take() {
                Some(h) if h.total_size() >= WALK_CHUNK_BYTES => h,
                _ => {
                    let buf_end = buf_start + buf.len() as u64;
                    let buffered = at >= buf_start && header_end <= buf_end;
                    if !buffered {
                        // Small batches read on where the buffer ends, so that a range of
                        // them is read whole, once; after a large batch the buffer restarts.
                        let from = if at >= buf_start && at <= buf_end && !buf.is_empty() {
                            buf_end
                        } else {
                            buf.clear();
                            buf_start = at;
                            at
                        };
                        let want = (next_read.max(BATCH_HEADER_LEN) as u64).min(limit - from);
                        let old_len = buf.len();
                        buf.resize(old_len + want as usize, 0);
                        file.read_exact_at(&mut buf[old_len..], from)
                            .map_err(|e| LogError::io("reading", &self.log_path(), e))?;
                    }
                    let from = (at - buf_start) as usize;
                    match BatchHeader::parse(&buf[from..]) {
                        Ok(h) => h,
                        Err(_) => break,
                    }
                }
            };
            let Some(total) = checked_total_size(&h) else {
                break;
            };
            if at + total as u64 > limit || h.last_offset() >= upper {
                break;
            }
            records += i64::from(h.records_count.max(0));
            at += total as u64;
            next_read = if total >= WALK_CHUNK_BYTES {
                BATCH_HEADER_LEN
            } else {
                WALK_CHUNK_BYTES
            };
        }
        let covered = buf_start == position && buf.len() as u64 >= at - position;
        let bytes = covered.then(|| {
            buf.truncate((at - position) as usize);
            buf
        });
        Ok(FetchExtent {
            end: at,
            records,
            bytes,
        })
    }

    /// Reads `len` bytes at `position`.
    pub(crate) fn read_range(&self, position: u64, len: usize) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; len];
        self.file()?
            .read_exact_at(&mut buf, position)
            .map_err(|e| LogError::io("reading", &self.log_path(), e))?;
        Ok(buf)
    }

    /// Walks batch headers from `position` up to `end` (a published size), calling `f` with
    /// each position and header until it returns `false`. Returns the position where the walk
    /// stopped (the batch `f` refused, or `end`).
    ///
    /// # Errors
    /// [`LogError::CorruptFile`] if a header inside `[position, end)` is unreadable.
    pub(crate) fn walk_headers(
        &self,
        position: u64,
        end: u64,
        chunk_bytes: usize,
        f: impl FnMut(u64, &BatchHeader) -> Result<bool>,
    ) -> Result<u64> {
        self.walk_headers_checking(position, None, end, chunk_bytes, f)?
            .map_err(|reason| LogError::CorruptFile {
                path: self.log_path().display().to_string(),
                reason,
            })
    }

    /// [`LogSegment::walk_headers`] from where the offset-index entry `entry` points (from the
    /// start of the segment when `None`), checking the entry's promise on the walk's first
    /// header, before `f` sees it: a whole batch (magic 2, a possible length, ending by `end`)
    /// starts at the entry's position and holds its offset. The check reads nothing of its
    /// own. `Ok(Err(_))` when the entry misled: what was found there, naming the index file.
    ///
    /// # Errors
    /// [`LogError::Io`] when the log cannot be read; [`LogError::CorruptFile`] if a header
    /// after the first one is unreadable (as in [`LogSegment::walk_headers`]).
    fn walk_from_entry(
        &self,
        entry: Option<OffsetEntry>,
        end: u64,
        f: impl FnMut(u64, &BatchHeader) -> Result<bool>,
    ) -> Result<std::result::Result<u64, String>> {
        let start = entry.map_or(0, |e| u64::from(e.position));
        self.walk_headers_checking(start, entry, end, WALK_CHUNK_BYTES, f)
    }

    /// The walk of [`LogSegment::walk_headers`] and [`LogSegment::walk_from_entry`]: with
    /// `promise` (the offset-index entry pointing at `position`), a first header that does not
    /// keep it gives `Ok(Err(_))` describing it; any other unreadable header is an error.
    fn walk_headers_checking(
        &self,
        mut position: u64,
        mut promise: Option<OffsetEntry>,
        end: u64,
        chunk_bytes: usize,
        mut f: impl FnMut(u64, &BatchHeader) -> Result<bool>,
    ) -> Result<std::result::Result<u64, String>> {
        let path = self.log_path();
        let file = self.file()?;
        let mut reader = ChunkReader::new(&file, &path, end, chunk_bytes);
        // A promise is checked even at or past `end` (no header fits there).
        while position < end || promise.is_some() {
            let corrupt = |reason: String| LogError::CorruptFile {
                path: path.display().to_string(),
                reason,
            };
            let parsed = reader
                .get(position, BATCH_HEADER_LEN)?
                .map(BatchHeader::parse);
            if let Some(e) = promise.take() {
                if let Some(what) = self.broken_promise(e, parsed.as_ref(), end) {
                    let offset = self.base_offset + i64::from(e.relative_offset);
                    return Ok(Err(format!(
                        "{}: the entry for offset {offset} points at position {position}, \
                         where {what}",
                        self.indexes.offset.path().display()
                    )));
                }
            }
            let Some(parsed) = parsed else {
                return Err(corrupt(format!("torn batch header at position {position}")));
            };
            let h = parsed?;
            let Some(total) = checked_total_size(&h) else {
                return Err(corrupt(format!("bad batch length at position {position}")));
            };
            if position + total as u64 > end {
                return Err(corrupt(format!("torn batch at position {position}")));
            }
            if !f(position, &h)? {
                return Ok(Ok(position));
            }
            position += total as u64;
        }
        Ok(Ok(position))
    }

    /// What breaks the promise of the offset-index entry `e` given `parsed`, the batch header
    /// read at its position (`None` when no header fits before `end`): `None` when a whole
    /// batch (magic 2, a possible length, ending by `end`) starts there and holds its offset.
    fn broken_promise(
        &self,
        e: OffsetEntry,
        parsed: Option<&std::result::Result<BatchHeader, BatchError>>,
        end: u64,
    ) -> Option<String> {
        let position = u64::from(e.position);
        let offset = self.base_offset + i64::from(e.relative_offset);
        let h = match parsed {
            None => {
                return Some(format!(
                    "no batch header fits before the end of the segment ({end} bytes)"
                ));
            }
            Some(Err(err)) => return Some(format!("the batch header does not parse ({err})")),
            Some(Ok(h)) => h,
        };
        if h.magic != gregor_protocol::batch::MAGIC_V2 {
            return Some(format!("the bytes have magic {}, not a batch", h.magic));
        }
        match checked_total_size(h) {
            Some(total) if position + total as u64 <= end => {}
            _ => {
                return Some(format!(
                    "the batch length {} does not fit the segment ({end} bytes)",
                    h.batch_length
                ));
            }
        }
        if h.base_offset > offset || h.last_offset() < offset {
            return Some(format!(
                "the batch holds offsets {} to {}",
                h.base_offset,
                h.last_offset()
            ));
        }
        None
    }

    /// The position and header of the first batch whose last offset is `>= offset`, looking no
    /// further than `end`: the offset index gives the starting point (loaded if needed), then
    /// headers are walked. The entry used is checked on the walk's first header, which is read
    /// anyway ([`LogSegment::walk_from_entry`]); entries at or past `end` are not used (the append that wrote them is not published yet:
    /// at load, entries past the segment's size are refused).
    ///
    /// # Errors
    /// [`LogError::Io`] / [`LogError::CorruptFile`] when the log or the index cannot be read;
    /// `Ok(Err(_))` when the entry misled.
    pub(crate) fn translate_offset(
        &self,
        offset: i64,
        end: u64,
    ) -> Result<Lookup<Option<(u64, BatchHeader)>>> {
        let rel = offset - self.base_offset;
        let (entry, generation) = if rel <= 0 {
            (None, 0)
        } else {
            self.with_indexes_gen(|o, _, g| {
                let entry = floor_by(o, |e| {
                    i64::from(e.relative_offset) <= rel && u64::from(e.position) < end
                });
                (entry, g)
            })?
        };
        let mut found = None;
        let walked = self.walk_from_entry(entry, end, |pos, h| {
            if h.last_offset() >= offset {
                found = Some((pos, *h));
                Ok(false)
            } else {
                Ok(true)
            }
        })?;
        if let Err(problem) = walked {
            return Ok(Err(Misled {
                problem,
                generation,
            }));
        }
        Ok(Ok(found))
    }

    /// Kafka's `LogSegment.findOffsetByTimestamp` up to the batch: the position and header of
    /// the first batch, from where the time index says to start, whose max timestamp is
    /// `>= target_ms`, looking no further than `end`. The time index gives the entry
    /// `(timestamp, offset)` with the largest timestamp `<= target_ms`, the offset index the
    /// position to walk from (checked as in [`LogSegment::translate_offset`]); the walk checks
    /// the time entry too: every batch before the one holding its offset has a smaller max
    /// timestamp, and that batch's max timestamp is the entry's (what the entry promises: the
    /// largest timestamp so far, first reached there).
    ///
    /// # Errors
    /// As [`LogSegment::translate_offset`].
    pub(crate) fn find_timestamp(
        &self,
        target_ms: i64,
        end: u64,
    ) -> Result<Lookup<Option<(u64, BatchHeader)>>> {
        let (time_entry, entry, generation) = self.with_indexes_gen(|o, t, g| {
            let time_entry = floor_by(t, |e| e.timestamp_ms <= target_ms);
            let entry = time_entry.and_then(|te| {
                floor_by(o, |e| {
                    e.relative_offset <= te.relative_offset && u64::from(e.position) < end
                })
            });
            (time_entry, entry, g)
        })?;
        let misled = |problem: String| {
            Ok(Err(Misled {
                problem,
                generation,
            }))
        };
        // The time entry, until the batch holding its offset is reached.
        let mut promise = time_entry.map(|te| TimestampOffset {
            timestamp_ms: te.timestamp_ms,
            offset: self.base_offset + i64::from(te.relative_offset),
        });
        let mut broken = None;
        let mut found = None;
        let walked = self.walk_from_entry(entry, end, |pos, h| {
            if let Some(p) = promise {
                let what = if h.last_offset() < p.offset {
                    (h.max_timestamp >= p.timestamp_ms).then(|| {
                        format!(
                            "the batch at position {pos} before it has max timestamp {}",
                            h.max_timestamp
                        )
                    })
                } else if h.base_offset > p.offset {
                    Some(format!(
                        "no batch holds offset {} (the next one starts at {} at position {pos})",
                        p.offset, h.base_offset
                    ))
                } else {
                    promise = None;
                    (h.max_timestamp != p.timestamp_ms).then(|| {
                        format!(
                            "the batch holding it, at position {pos}, has max timestamp {}",
                            h.max_timestamp
                        )
                    })
                };
                if let Some(what) = what {
                    broken = Some(format!(
                        "{}: the entry ({} ms at offset {}) is not the largest timestamp so far \
                         first reached at its offset: {what}",
                        self.indexes.time.path().display(),
                        p.timestamp_ms,
                        p.offset
                    ));
                    return Ok(false);
                }
            }
            if h.max_timestamp >= target_ms {
                found = Some((pos, *h));
                Ok(false)
            } else {
                Ok(true)
            }
        })?;
        if let Some(problem) = walked.err().or(broken) {
            return misled(problem);
        }
        Ok(Ok(found))
    }

    /// Validates every batch from the start (CRC included), rebuilds both indexes and the max
    /// timestamp, and truncates the file at the first invalid or torn batch (Kafka's
    /// `LogSegment.recover`). `expected_first_offset` is the lowest offset the first batch may
    /// have; `on_batch` sees every valid header. The indexes stay loaded and pinned (not
    /// charged to the index cache) until [`LogSegment::set_inactive`]. `tail` says where the
    /// segment stands in the log, so that what is removed is called what it is: a crash can
    /// cut short only writes that were not yet flushed, at the end of the log.
    pub(crate) fn recover(
        &self,
        expected_first_offset: i64,
        index_interval_bytes: u64,
        tail: RecoveryTail,
        mut on_batch: impl FnMut(&BatchHeader),
    ) -> Result<RecoverResult> {
        // Written from here on: no lazy load runs meanwhile, and the cache keeps its hands off.
        let _load = self.indexes.load_lock.lock();
        index_cache::pin(&self.indexes.slot);
        self.indexes.offset.reset()?;
        self.indexes.time.reset()?;
        // Whatever misled a lookup before is gone; a heal under way finds nothing to install.
        self.indexes.generation.fetch_add(1, Ordering::AcqRel);
        // The entries are rebuilt from a validated scan: a later misleading entry is new
        // damage, which may be healed once more rather than failing every read.
        self.indexes.healed.store(false, Ordering::Release);
        *self.max_timestamp.lock() = Some(NO_TIMESTAMP);
        *self.rolling_based_timestamp.lock() = None;
        self.bytes_since_last_index_entry
            .store(0, Ordering::Relaxed);
        let path = self.log_path();
        let file = self.file()?;
        let file_len = file
            .metadata()
            .map_err(|e| LogError::io("reading metadata of", &path, e))?
            .len();
        let mut result = RecoverResult {
            scanned_bytes: file_len,
            ..RecoverResult::default()
        };
        let mut reader = ChunkReader::new(&file, &path, file_len, SCAN_CHUNK_BYTES);
        let mut position = 0u64;
        let mut next_offset = expected_first_offset.max(self.base_offset);
        // Why the scan stopped before the end of the file, and whether what stopped it is the
        // last thing in the file (a write cut short by a crash) or not (corruption).
        let mut stop: Option<(bool, String)> = None;
        while position < file_len {
            let Some(raw) = reader.get(position, BATCH_HEADER_LEN)? else {
                stop = Some((true, "a batch header cut short".into()));
                break;
            };
            let h = match BatchHeader::parse(raw) {
                Ok(h) => h,
                Err(e) => {
                    stop = Some((false, format!("an unreadable batch header ({e})")));
                    break;
                }
            };
            let Some(total) = checked_total_size(&h) else {
                stop = Some((
                    false,
                    format!("an impossible batch length {}", h.batch_length),
                ));
                break;
            };
            let Some(raw) = reader.get(position, total)? else {
                stop = Some((true, "a batch cut short".into()));
                break;
            };
            let h = match validate_stored_batch(raw) {
                Ok(h) => h,
                Err(e) => {
                    let last = position + total as u64 == file_len;
                    stop = Some((last, format!("an invalid batch ({e})")));
                    break;
                }
            };
            if h.base_offset < next_offset || !self.can_convert_to_relative_offset(h.last_offset())
            {
                stop = Some((
                    false,
                    format!(
                        "a batch at offset {} where offset {next_offset} or later was expected",
                        h.base_offset
                    ),
                ));
                break;
            }
            if position == 0 {
                *self.rolling_based_timestamp.lock() = Some(h.max_timestamp);
            }
            self.index_batch(&h, position, total as u64, index_interval_bytes)?;
            on_batch(&h);
            next_offset = h.next_offset();
            result.next_offset = Some(next_offset);
            result.batches += 1;
            position += total as u64;
        }
        if position < file_len {
            let (at_end, what) = stop.unwrap_or((true, "unreadable bytes".into()));
            let removed = file_len - position;
            let flushed = tail.recovery_point.is_some_and(|rp| next_offset < rp);
            let torn = at_end && !flushed && tail.last_segment;
            if at_end && flushed {
                tracing::warn!(
                    segment = %path.display(),
                    position,
                    removed_bytes = removed,
                    next_offset,
                    recovery_point = tail.recovery_point,
                    "recovery truncates the segment at corruption: {what} below the recovery \
                     point (these offsets had been flushed, so a crash cannot have cut them \
                     short); everything from there on is removed"
                );
            } else if at_end && !tail.last_segment {
                tracing::warn!(
                    segment = %path.display(),
                    position,
                    removed_bytes = removed,
                    next_offset,
                    recovery_point = tail.recovery_point,
                    "recovery truncates a segment that ends short of the segments after it: \
                     {what}; corruption, or a crash that lost writes not yet flushed; \
                     everything from there on is removed"
                );
            } else if torn {
                tracing::warn!(
                    segment = %path.display(),
                    position,
                    removed_bytes = removed,
                    next_offset,
                    "recovery removes a write cut short by a crash at the end of the segment: {what}"
                );
            } else {
                tracing::warn!(
                    segment = %path.display(),
                    position,
                    removed_bytes = removed,
                    next_offset,
                    "recovery truncates the segment at corruption before its end: {what}; \
                     everything from there on is removed"
                );
            }
            result.torn_tail = torn;
            drop(reader);
            file.set_len(position)
                .map_err(|e| LogError::io("truncating", &path, e))?;
            result.truncated_bytes = file_len - position;
        }
        self.size_bytes.store(position, Ordering::Release);
        Ok(result)
    }

    /// Kafka's `LogSegment.truncateTo`: removes the batch holding `offset` and everything
    /// after it, then rebuilds the indexes and the max timestamp from what is left. Returns the
    /// offset after the last remaining batch (the base offset when none is left). The caller
    /// holds the partition's append lock (`partition` names it in logs); an index entry that
    /// misleads the lookup of `offset` is healed first ([`LogSegment::heal_exclusive`]), so
    /// the cut is where the batch holding `offset` starts. The caller fsyncs on its next
    /// flush.
    pub(crate) fn truncate_to(
        &self,
        offset: i64,
        index_interval_bytes: u64,
        partition: &str,
    ) -> Result<i64> {
        let found = lookup_healing(
            self,
            &partition,
            |s| s.translate_offset(offset, s.size()),
            |misled| self.heal_exclusive(partition, &misled, true),
        )?;
        let position = match found {
            Some((pos, _)) => pos,
            None => self.size(),
        };
        // Before the cut: a response about to send bytes from this file sees it and closes
        // its connection instead of sending what replaces them.
        self.log.note_truncation();
        self.file()?
            .set_len(position)
            .map_err(|e| LogError::io("truncating", &self.log_path(), e))?;
        self.size_bytes.store(position, Ordering::Release);
        let r = self.recover(
            self.base_offset,
            index_interval_bytes,
            RecoveryTail::default(),
            |_| {},
        )?;
        let next = r.next_offset.unwrap_or(self.base_offset);
        self.txn_index.truncate_to(&self.txn_index_path(), next)?;
        Ok(next)
    }

    /// The offset after the last batch, walking from the last offset-index entry. `None` for an
    /// empty segment.
    ///
    /// # Errors
    /// [`LogError::CorruptFile`] when the tail is torn (the caller then recovers the segment).
    pub(crate) fn read_next_offset(&self) -> Result<Option<i64>> {
        let start = self.with_indexes(|o, _| o.last().map_or(0, |e| u64::from(e.position)))?;
        let mut next = None;
        self.walk_headers(start, self.size(), WALK_CHUNK_BYTES, |_, h| {
            next = Some(h.next_offset());
            Ok(true)
        })?;
        Ok(next)
    }

    /// Makes the segment read-only: records the final max timestamp in the time index (Kafka's
    /// `onBecomeInactiveSegment`). The index files already hold exactly their entries (Kafka
    /// trims its preallocated files here).
    pub(crate) fn on_become_inactive(&self) -> Result<()> {
        let max = self.known_max_timestamp();
        if max.timestamp_ms >= 0 {
            self.indexes.time.append(TimeEntry {
                timestamp_ms: max.timestamp_ms,
                relative_offset: self.relative(max.offset),
            })?;
        }
        Ok(())
    }

    /// fsyncs the log and both indexes.
    pub(crate) fn flush(&self) -> Result<()> {
        self.file()?
            .sync_data()
            .map_err(|e| LogError::io("syncing", &self.log_path(), e))?;
        self.indexes.offset.flush()?;
        self.indexes.time.flush()?;
        self.txn_index.flush(&self.txn_index_path())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gregor_protocol::batch::{set_base_offset, BatchBuilder};

    fn batch(base: i64, n: usize, ts: i64) -> Vec<u8> {
        let mut b = BatchBuilder::new(0, ts);
        for i in 0..n {
            b = b.record(ts + i as i64, None, Some(&[7u8; 100]), &[]);
        }
        let mut v = b.build();
        set_base_offset(&mut v, base);
        v
    }

    #[test]
    fn append_index_translate_and_recover() {
        let dir = tempfile::tempdir().unwrap();
        let seg = LogSegment::create(dir.path(), 100, 1024, 256, 0).unwrap();
        let mut next = 100;
        let mut positions = Vec::new();
        for i in 0..50 {
            let b = batch(next, 3, 1_000 + i);
            let h = validate_batch(&b).unwrap();
            positions.push((seg.size(), h));
            seg.append(&b, &[h], 256).unwrap();
            next = h.next_offset();
        }
        assert!(seg.index_entry_counts().unwrap().0 > 5);
        for (pos, h) in &positions {
            for o in h.base_offset..=h.last_offset() {
                let (p, found) = seg
                    .translate_offset(o, seg.size())
                    .unwrap()
                    .unwrap()
                    .unwrap();
                assert_eq!((p, found.base_offset), (*pos, h.base_offset));
            }
        }
        assert_eq!(seg.read_next_offset().unwrap(), Some(next));
        let entries = seg.index_entry_counts().unwrap();
        let r = seg
            .recover(100, 256, RecoveryTail::default(), |_| {})
            .unwrap();
        assert_eq!(r.batches, 50);
        assert_eq!(r.next_offset, Some(next));
        assert_eq!(seg.index_entry_counts().unwrap(), entries);
        assert_eq!(seg.max_timestamp().unwrap().timestamp_ms, 1_000 + 49 + 2);
    }

    /// An inactive segment opened lazily reads nothing of its indexes until used; its max
    /// timestamp comes from the time index's last entry alone; many threads looking up at
    /// once load the files once and all answer right.
    #[test]
    fn lazy_indexes_load_once_on_first_use() {
        let dir = tempfile::tempdir().unwrap();
        let mut expected = Vec::new();
        let max = {
            let seg = LogSegment::create(dir.path(), 100, 1024, 256, 0).unwrap();
            let mut next = 100;
            for i in 0..50 {
                let b = batch(next, 3, 1_000 + (i * 7) % 20);
                let h = validate_batch(&b).unwrap();
                expected.push((seg.size(), h));
                seg.append(&b, &[h], 256).unwrap();
                next = h.next_offset();
            }
            seg.on_become_inactive().unwrap();
            seg.max_timestamp().unwrap()
        };
        let len = |ext| {
            std::fs::metadata(dir.path().join(file_name(100, ext)))
                .unwrap()
                .len()
        };
        let files = len("index") + len("timeindex");
        let seg = Arc::new(LogSegment::open_lazy(dir.path(), 100, 1024, 256, 0).unwrap());
        assert!(!seg.indexes_loaded());
        assert_eq!(seg.index_bytes_read(), 0);
        assert_eq!(seg.max_timestamp().unwrap(), max);
        assert!(!seg.indexes_loaded());
        let tail = seg.index_bytes_read();
        assert_eq!(tail, 24);
        let expected = Arc::new(expected);
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (seg, expected) = (Arc::clone(&seg), Arc::clone(&expected));
                std::thread::spawn(move || {
                    for (pos, h) in expected.iter() {
                        for o in h.base_offset..=h.last_offset() {
                            let (p, found) = seg
                                .translate_offset(o, seg.size())
                                .unwrap()
                                .unwrap()
                                .unwrap();
                            assert_eq!((p, found.base_offset), (*pos, h.base_offset));
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(seg.indexes_loaded());
        assert_eq!(seg.index_bytes_read(), tail + files);
    }

    /// The active segment's heal in two halves with appends between them (what the append
    /// lock allows): the rebuilt entries, and those appended afterwards, are exactly what a
    /// segment never damaged holds; the time index does not get the final entry of a segment
    /// that rolled.
    #[test]
    fn the_active_segment_heals_in_two_halves_around_appends() {
        let (dir, reference) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let append_all = |seg: &LogSegment, from: usize, to: usize| {
            for i in from..to {
                let base = 100 + 3 * i as i64;
                let b = batch(base, 3, 1_000 + (i as i64 * 7) % 20 + i as i64);
                let h = validate_batch(&b).unwrap();
                seg.append(&b, &[h], 256).unwrap();
            }
        };
        let seg = LogSegment::create(reference.path(), 100, 1 << 20, 256, 0).unwrap();
        append_all(&seg, 0, 90);
        drop(seg);
        {
            let seg = LogSegment::create(dir.path(), 100, 1 << 20, 256, 0).unwrap();
            append_all(&seg, 0, 50);
        }
        // The middle third of the entries moved by 61 bytes; the load's checks pass.
        let index = dir.path().join(file_name(100, "index"));
        let mut b = std::fs::read(&index).unwrap();
        let n = b.len() / 8;
        for e in b.chunks_exact_mut(8).take(2 * n / 3).skip(n / 3) {
            let pos = u32::from_be_bytes([e[4], e[5], e[6], e[7]]) + 61;
            e[4..8].copy_from_slice(&pos.to_be_bytes());
        }
        std::fs::write(&index, b).unwrap();
        let (seg, problem) = LogSegment::open(dir.path(), 100, 1 << 20, 256, 0).unwrap();
        assert!(problem.is_none());
        let e = n / 2;
        let at = 100
            + i64::from(u32::from_be_bytes(
                std::fs::read(&index).unwrap()[e * 8..e * 8 + 4]
                    .try_into()
                    .unwrap(),
            ));
        let Err(misled) = seg.translate_offset(at + 1, seg.size()).unwrap() else {
            panic!("the moved entry was trusted");
        };
        assert!(
            misled.problem.contains("points at position"),
            "{}",
            misled.problem
        );
        let scan = seg.heal_scan("t-0", &misled).unwrap().unwrap();
        append_all(&seg, 50, 60);
        seg.heal_finish(&misled, scan, true).unwrap();
        assert_eq!(seg.index_rebuilds(), 1);
        append_all(&seg, 60, 90);
        let (p, h) = seg
            .translate_offset(at + 1, seg.size())
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(
            h.base_offset <= at + 1 && h.last_offset() > at,
            "{h:?} at {p}"
        );
        // Misled again by the same (now replaced) entries: nothing more to do.
        assert!(seg.heal_scan("t-0", &misled).unwrap().is_none());
        for ext in ["log", "index", "timeindex"] {
            assert_eq!(
                std::fs::read(dir.path().join(file_name(100, ext))).unwrap(),
                std::fs::read(reference.path().join(file_name(100, ext))).unwrap(),
                ".{ext}"
            );
        }
    }

    /// Recovery (here through a follower's truncation) rebuilds the entries from a validated
    /// scan, so a segment whose indexes were healed once may heal again afterwards instead of
    /// failing every read that new damage misleads.
    #[test]
    fn recovery_lets_a_healed_segment_heal_again() {
        let dir = tempfile::tempdir().unwrap();
        {
            let seg = LogSegment::create(dir.path(), 100, 1 << 20, 256, 0).unwrap();
            for i in 0..40 {
                let b = batch(100 + 3 * i, 3, 1_000 + i);
                let h = validate_batch(&b).unwrap();
                seg.append(&b, &[h], 256).unwrap();
            }
        }
        let index = dir.path().join(file_name(100, "index"));
        let mut b = std::fs::read(&index).unwrap();
        let n = b.len() / 8;
        for e in b.chunks_exact_mut(8).take(2 * n / 3).skip(n / 3) {
            let pos = u32::from_be_bytes([e[4], e[5], e[6], e[7]]) + 61;
            e[4..8].copy_from_slice(&pos.to_be_bytes());
        }
        let e = n / 2;
        let at = 100 + i64::from(u32::from_be_bytes(b[e * 8..e * 8 + 4].try_into().unwrap()));
        std::fs::write(&index, b).unwrap();
        let (seg, problem) = LogSegment::open(dir.path(), 100, 1 << 20, 256, 0).unwrap();
        assert!(problem.is_none());
        let Err(misled) = seg.translate_offset(at + 1, seg.size()).unwrap() else {
            panic!("the moved entry was trusted");
        };
        seg.heal_exclusive("t-0", &misled, false).unwrap();
        assert_eq!(seg.index_rebuilds(), 1);
        assert!(seg.indexes.healed.load(Ordering::Acquire));
        // A healed segment whose entries mislead again gives up ...
        let stale = Misled {
            generation: seg.indexes.generation.load(Ordering::Acquire),
            ..misled.clone()
        };
        assert!(seg.heal_decision("t-0", &stale).is_err());
        // ... until recovery rebuilds them from the log.
        assert_eq!(seg.truncate_to(100 + 3 * 30, 256, "t-0").unwrap(), 190);
        let fresh = Misled {
            generation: seg.indexes.generation.load(Ordering::Acquire),
            ..misled
        };
        assert!(matches!(seg.heal_decision("t-0", &fresh), Ok(Some(_))));
    }

    /// What an offset-index entry promises is checked on the walk's first header: a batch that
    /// does not fit, or no header at all, where the entry points is a misleading entry (the
    /// indexes heal); the same damage to a batch the walk reaches later is an unreadable log.
    #[test]
    fn only_the_first_header_of_a_walk_answers_for_the_entry() {
        let dir = tempfile::tempdir().unwrap();
        let seg = LogSegment::create(dir.path(), 100, 1 << 20, 2048, 0).unwrap();
        let mut batches = Vec::new();
        for i in 0..60 {
            let b = batch(100 + 3 * i, 3, 1_000 + i);
            let h = validate_batch(&b).unwrap();
            batches.push((seg.size(), h));
            seg.append(&b, &[h], 2048).unwrap();
        }
        let entries = seg.with_indexes(|o, _| o.to_vec()).unwrap();
        // An entry with at least two more batches before the next one.
        let (e, next) = entries
            .windows(2)
            .map(|w| (w[0], u64::from(w[1].position)))
            .find(|(e, next)| {
                batches
                    .iter()
                    .filter(|(p, _)| *p > u64::from(e.position) && p < next)
                    .count()
                    >= 2
            })
            .expect("entries a few batches apart");
        let i = batches
            .iter()
            .position(|(p, _)| *p == u64::from(e.position))
            .expect("entries point at batches");
        let (first, second, third) = (batches[i], batches[i + 1], batches[i + 2]);
        assert!(third.0 < next);
        let log = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.path().join(file_name(100, "log")))
            .unwrap();
        let set_length = |pos: u64, len: i32| {
            use std::os::unix::fs::FileExt;
            log.write_all_at(&len.to_be_bytes(), pos + 8).unwrap();
        };
        let end = seg.size();

        // The batch after the entry's is cut: an unreadable log, not a misleading entry.
        set_length(second.0, i32::MAX - 100);
        match seg.translate_offset(third.1.base_offset, end) {
            Err(LogError::CorruptFile { reason, .. }) => {
                assert!(reason.contains(&second.0.to_string()), "{reason}");
            }
            other => panic!("{:?}", other.map(|l| l.map_err(|m| m.problem))),
        }
        set_length(second.0, second.1.batch_length);

        // The entry's own batch is cut: the entry misled.
        set_length(first.0, i32::MAX - 100);
        let Err(misled) = seg.translate_offset(third.1.base_offset, end).unwrap() else {
            panic!("a batch that does not fit was trusted");
        };
        assert!(
            misled.problem.contains("does not fit"),
            "{}",
            misled.problem
        );
        set_length(first.0, first.1.batch_length);

        // A lookup that sees the segment end just after the entry's position: no header fits.
        let Err(misled) = seg
            .translate_offset(first.1.last_offset(), first.0 + 10)
            .unwrap()
        else {
            panic!("an entry pointing past the end was trusted");
        };
        assert!(
            misled.problem.contains("no batch header fits"),
            "{}",
            misled.problem
        );

        // Repaired, every answer is right again.
        let (p, h) = seg
            .translate_offset(third.1.base_offset, end)
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!((p, h.base_offset), (third.0, third.1.base_offset));
    }
}
