//! One log segment (Kafka's `LogSegment`): `<base>.log` holding whole v2 batches and nothing
//! else, plus its `.index` and `.timeindex`.
//!
//! The appender (holding the partition's append lock) writes batches at the published size and
//! then publishes the new size with release ordering; readers load the size with acquire
//! ordering and never look past it, so they need no lock.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use gregor_protocol::batch::{
    validate_batch, BatchError, BatchHeader, BATCH_HEADER_LEN, LOG_OVERHEAD,
};
use parking_lot::Mutex;

use crate::error::{LogError, Result};
use crate::files::SegmentFile;
use crate::index::{OffsetEntry, OffsetIndex, TimeEntry, TimeIndex};

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

/// One segment of a partition log.
pub(crate) struct LogSegment {
    base_offset: i64,
    /// The `.log` file, open while in use ([`crate::files`]).
    log: SegmentFile,
    size_bytes: AtomicU64,
    pub(crate) offset_index: OffsetIndex,
    pub(crate) time_index: TimeIndex,
    /// Largest batch max timestamp so far and the last offset of the batch holding it.
    max_timestamp: Mutex<TimestampOffset>,
    bytes_since_last_index_entry: AtomicU64,
    /// Max timestamp of the first batch: segment.ms counts from it (Kafka's
    /// `rollingBasedTimestamp`).
    rolling_based_timestamp: Mutex<Option<i64>>,
    /// Wall-clock ms when this segment was created or loaded.
    created_ms: i64,
    /// Test hook: the fault the next appends meet.
    #[cfg(test)]
    fail_at: Mutex<Option<FailAt>>,
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
        now_ms: i64,
    ) -> Result<Self> {
        Self::create_with_suffix(dir, base_offset, segment_index_bytes, now_ms, "")
    }

    /// Creates an empty segment whose three files carry `suffix` after their usual names (the
    /// cleaner writes `<base>.log.cleaned`, Kafka's `CleanedFileSuffix`).
    pub(crate) fn create_with_suffix(
        dir: &Path,
        base_offset: i64,
        segment_index_bytes: u64,
        now_ms: i64,
        suffix: &str,
    ) -> Result<Self> {
        let log_path = dir.join(file_name(base_offset, "log") + suffix);
        let log = SegmentFile::open(&log_path, true, "creating segment")?;
        let offset_index = OffsetIndex::create(
            &dir.join(file_name(base_offset, "index") + suffix),
            segment_index_bytes,
        )?;
        let time_index = TimeIndex::create(
            &dir.join(file_name(base_offset, "timeindex") + suffix),
            segment_index_bytes,
        )?;
        Ok(Self {
            base_offset,
            log,
            size_bytes: AtomicU64::new(0),
            offset_index,
            time_index,
            max_timestamp: Mutex::new(NO_TIMESTAMP),
            bytes_since_last_index_entry: AtomicU64::new(0),
            rolling_based_timestamp: Mutex::new(None),
            created_ms: now_ms,
            #[cfg(test)]
            fail_at: Mutex::new(None),
        })
    }

    /// Opens an existing segment. Returns it and whether its indexes looked sane; when not, the
    /// caller must [`LogSegment::recover`] it.
    pub(crate) fn open(
        dir: &Path,
        base_offset: i64,
        segment_index_bytes: u64,
        now_ms: i64,
    ) -> Result<(Self, bool)> {
        let log_path = dir.join(file_name(base_offset, "log"));
        let log = SegmentFile::open(&log_path, false, "opening segment")?;
        let size = log
            .get("opening segment")?
            .metadata()
            .map_err(|e| LogError::io("reading metadata of", &log_path, e))?
            .len();
        let (offset_index, offsets_sane) = OffsetIndex::open(
            &dir.join(file_name(base_offset, "index")),
            segment_index_bytes,
            |e| u64::from(e.position) < size,
        )?;
        let (time_index, times_sane) = TimeIndex::open(
            &dir.join(file_name(base_offset, "timeindex")),
            segment_index_bytes,
            |e| e.timestamp_ms >= 0,
        )?;
        let max_timestamp = match time_index.last() {
            Some(e) => TimestampOffset {
                timestamp_ms: e.timestamp_ms,
                offset: base_offset + i64::from(e.relative_offset),
            },
            None => NO_TIMESTAMP,
        };
        let seg = Self {
            base_offset,
            log,
            size_bytes: AtomicU64::new(size),
            offset_index,
            time_index,
            max_timestamp: Mutex::new(max_timestamp),
            bytes_since_last_index_entry: AtomicU64::new(0),
            rolling_based_timestamp: Mutex::new(None),
            created_ms: now_ms,
            #[cfg(test)]
            fail_at: Mutex::new(None),
        };
        let mut sane = offsets_sane && times_sane;
        // The last offset-index entry must point at a batch ending at its offset.
        if sane {
            if let Some(e) = seg.offset_index.last() {
                let mut hdr = [0u8; BATCH_HEADER_LEN];
                let ok = seg
                    .file()?
                    .read_exact_at(&mut hdr, u64::from(e.position))
                    .is_ok()
                    && BatchHeader::parse(&hdr)
                        .map(|h| h.last_offset() == base_offset + i64::from(e.relative_offset))
                        .unwrap_or(false);
                sane = ok;
            }
        }
        if sane && size > 0 {
            seg.load_rolling_based_timestamp();
        }
        Ok((seg, sane))
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
        self.offset_index
            .file()
            .set_path(dir.join(file_name(self.base_offset, "index") + suffix));
        self.time_index
            .file()
            .set_path(dir.join(file_name(self.base_offset, "timeindex") + suffix));
    }

    /// Keeps the `.log` file readable by the readers that still hold this segment while it
    /// is renamed and deleted ([`SegmentFile::pin`]); its index files close (their entries
    /// are in memory).
    ///
    /// # Errors
    /// [`LogError::Io`] when the file cannot be opened.
    pub(crate) fn pin_for_deletion(&self) -> Result<()> {
        self.log.pin("opening segment")?;
        self.offset_index.file().close();
        self.time_index.file().close();
        Ok(())
    }

    /// Closes the segment's descriptors now (a later use reopens them).
    pub(crate) fn close_files(&self) {
        self.log.close();
        self.offset_index.file().close();
        self.time_index.file().close();
    }

    /// Published size in bytes: readers never look past it.
    pub(crate) fn size(&self) -> u64 {
        self.size_bytes.load(Ordering::Acquire)
    }

    /// Largest timestamp and the last offset of the batch that holds it.
    pub(crate) fn max_timestamp(&self) -> TimestampOffset {
        *self.max_timestamp.lock()
    }

    /// Kafka's `LogSegment.largestTimestamp`: the largest record timestamp, or the file's
    /// modification time (ms) when no batch has a timestamp. Retention by time compares it
    /// with `retention.ms`.
    pub(crate) fn largest_timestamp_ms(&self) -> i64 {
        let max = self.max_timestamp().timestamp_ms;
        if max > 0 {
            return max;
        }
        self.last_modified_ms()
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
        let max = {
            let mut max = self.max_timestamp.lock();
            if h.max_timestamp > max.timestamp_ms {
                *max = TimestampOffset {
                    timestamp_ms: h.max_timestamp,
                    offset: h.last_offset(),
                };
            }
            *max
        };
        if self.bytes_since_last_index_entry.load(Ordering::Relaxed) > index_interval_bytes {
            self.offset_index.append(OffsetEntry {
                relative_offset: self.relative(h.last_offset()),
                position: position as u32,
            })?;
            if max.timestamp_ms >= 0 {
                self.time_index.append(TimeEntry {
                    timestamp_ms: max.timestamp_ms,
                    relative_offset: self.relative(max.offset),
                })?;
            }
            self.bytes_since_last_index_entry
                .store(0, Ordering::Relaxed);
        }
        self.bytes_since_last_index_entry
            .fetch_add(size, Ordering::Relaxed);
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
        let start = self.size();
        let saved = self.save_append_state();
        match self.append_unrolled(start, buf, headers, index_interval_bytes) {
            Ok(()) => Ok(()),
            Err(error) => {
                let rolled_back = match self.rollback(start, &saved) {
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
        start: u64,
        buf: &[u8],
        headers: &[BatchHeader],
        index_interval_bytes: u64,
    ) -> Result<()> {
        let file = self.file()?;
        self.write_at(&file, buf, start)
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
            offset_entries: self.offset_index.len(),
            time_entries: self.time_index.len(),
            max_timestamp: self.max_timestamp(),
            bytes_since_last_index_entry: self.bytes_since_last_index_entry.load(Ordering::Relaxed),
        }
    }

    /// Undoes a failed append that started at `size`: cuts the file (ftruncate needs no free
    /// space), drops the index entries added since `saved` and restores the bookkeeping.
    fn rollback(&self, size: u64, saved: &AppendState) -> Result<()> {
        self.file()?
            .set_len(size)
            .map_err(|e| LogError::io("truncating a failed append in", &self.log_path(), e))?;
        self.offset_index.truncate_entries(saved.offset_entries)?;
        self.time_index.truncate_entries(saved.time_entries)?;
        *self.max_timestamp.lock() = saved.max_timestamp;
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
        mut position: u64,
        end: u64,
        chunk_bytes: usize,
        mut f: impl FnMut(u64, &BatchHeader) -> Result<bool>,
    ) -> Result<u64> {
        let path = self.log_path();
        let file = self.file()?;
        let mut reader = ChunkReader::new(&file, &path, end, chunk_bytes);
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
            if position + total as u64 > end {
                return Err(corrupt(format!("torn batch at position {position}")));
            }
            if !f(position, &h)? {
                return Ok(position);
            }
            position += total as u64;
        }
        Ok(position)
    }

    /// The position and header of the first batch whose last offset is `>= offset`, looking no
    /// further than `end`: the offset index gives the starting point, then headers are walked.
    pub(crate) fn translate_offset(
        &self,
        offset: i64,
        end: u64,
    ) -> Result<Option<(u64, BatchHeader)>> {
        let rel = offset - self.base_offset;
        let start = if rel <= 0 {
            0
        } else {
            self.offset_index
                .floor_by(|e| i64::from(e.relative_offset) <= rel)
                .map_or(0, |e| u64::from(e.position))
        };
        let mut found = None;
        self.walk_headers(start, end, WALK_CHUNK_BYTES, |pos, h| {
            if h.last_offset() >= offset {
                found = Some((pos, *h));
                Ok(false)
            } else {
                Ok(true)
            }
        })?;
        Ok(found)
    }

    /// The position to start a timestamp search from (Kafka's `findOffsetByTimestamp`): the
    /// time index gives an offset, the offset index its position.
    pub(crate) fn position_for_timestamp(&self, target_ms: i64) -> u64 {
        let Some(t) = self.time_index.floor_by(|e| e.timestamp_ms <= target_ms) else {
            return 0;
        };
        self.offset_index
            .floor_by(|e| e.relative_offset <= t.relative_offset)
            .map_or(0, |e| u64::from(e.position))
    }

    /// Validates every batch from the start (CRC included), rebuilds both indexes and the max
    /// timestamp, and truncates the file at the first invalid or torn batch (Kafka's
    /// `LogSegment.recover`). `expected_first_offset` is the lowest offset the first batch may
    /// have; `on_batch` sees every valid header.
    pub(crate) fn recover(
        &self,
        expected_first_offset: i64,
        index_interval_bytes: u64,
        mut on_batch: impl FnMut(&BatchHeader),
    ) -> Result<RecoverResult> {
        self.offset_index.reset()?;
        self.time_index.reset()?;
        *self.max_timestamp.lock() = NO_TIMESTAMP;
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
            let (torn, what) = stop.unwrap_or((true, "unreadable bytes".into()));
            let removed = file_len - position;
            if torn {
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
    /// fsyncs on its next flush.
    pub(crate) fn truncate_to(&self, offset: i64, index_interval_bytes: u64) -> Result<i64> {
        let position = match self.translate_offset(offset, self.size())? {
            Some((pos, _)) => pos,
            None => self.size(),
        };
        self.file()?
            .set_len(position)
            .map_err(|e| LogError::io("truncating", &self.log_path(), e))?;
        self.size_bytes.store(position, Ordering::Release);
        let r = self.recover(self.base_offset, index_interval_bytes, |_| {})?;
        Ok(r.next_offset.unwrap_or(self.base_offset))
    }

    /// The offset after the last batch, walking from the last offset-index entry. `None` for an
    /// empty segment.
    ///
    /// # Errors
    /// [`LogError::CorruptFile`] when the tail is torn (the caller then recovers the segment).
    pub(crate) fn read_next_offset(&self) -> Result<Option<i64>> {
        let start = self
            .offset_index
            .last()
            .map_or(0, |e| u64::from(e.position));
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
        let max = self.max_timestamp();
        if max.timestamp_ms >= 0 {
            self.time_index.append(TimeEntry {
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
        self.offset_index.flush()?;
        self.time_index.flush()
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
        let seg = LogSegment::create(dir.path(), 100, 1024, 0).unwrap();
        let mut next = 100;
        let mut positions = Vec::new();
        for i in 0..50 {
            let b = batch(next, 3, 1_000 + i);
            let h = validate_batch(&b).unwrap();
            positions.push((seg.size(), h));
            seg.append(&b, &[h], 256).unwrap();
            next = h.next_offset();
        }
        assert!(seg.offset_index.len() > 5);
        for (pos, h) in &positions {
            for o in h.base_offset..=h.last_offset() {
                let (p, found) = seg.translate_offset(o, seg.size()).unwrap().unwrap();
                assert_eq!((p, found.base_offset), (*pos, h.base_offset));
            }
        }
        assert_eq!(seg.read_next_offset().unwrap(), Some(next));
        let entries = seg.offset_index.len();
        let r = seg.recover(100, 256, |_| {}).unwrap();
        assert_eq!(r.batches, 50);
        assert_eq!(r.next_offset, Some(next));
        assert_eq!(seg.offset_index.len(), entries);
        assert_eq!(seg.max_timestamp().timestamp_ms, 1_000 + 49 + 2);
    }
}
