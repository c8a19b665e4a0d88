//! Kafka's sparse segment indexes: `.index` (OffsetIndex) and `.timeindex` (TimeIndex).
//!
//! Both files are arrays of fixed-size big-endian entries, Kafka's format (so `kafka-dump-log`
//! reads them). Kafka preallocates them to `segment.index.bytes` and memory-maps them; gregor
//! keeps the entries in memory (8 or 12 bytes per `index.interval.bytes` of log), so lookups
//! are binary searches without system calls, and the file holds exactly its entries, appended
//! with positional writes through a descriptor opened on demand ([`crate::files`]). The index
//! still fills at `segment.index.bytes`, which rolls the segment as in Kafka.
//!
//! Readers take the entries' read lock only for the binary search; the appender takes the write
//! lock only to push one entry. Neither is the partition's append lock.

use std::fs::OpenOptions;
use std::io;
use std::marker::PhantomData;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::RwLock;

use crate::error::{LogError, Result};
use crate::files::SegmentFile;

/// One fixed-size index entry.
pub(crate) trait IndexEntry: Copy + std::fmt::Debug + Send + Sync + 'static {
    /// Bytes per entry on disk.
    const SIZE: usize;
    /// Decodes from exactly `SIZE` bytes.
    fn decode(b: &[u8]) -> Self;
    /// Encodes into exactly `SIZE` bytes.
    fn encode(&self, out: &mut [u8]);
    /// Whether `self` may follow `prev` (strictly increasing key).
    fn follows(&self, prev: &Self) -> bool;
    /// An all-zero entry: what preallocated, never written space decodes to.
    fn is_zero(&self) -> bool;
}

/// `.index` entry: offset relative to the segment's base offset, and the byte position in the
/// `.log` file of the batch whose *last* offset that is (Kafka's `LogSegment.append`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OffsetEntry {
    pub relative_offset: u32,
    pub position: u32,
}

impl IndexEntry for OffsetEntry {
    const SIZE: usize = 8;
    fn decode(b: &[u8]) -> Self {
        Self {
            relative_offset: u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
            position: u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
        }
    }
    fn encode(&self, out: &mut [u8]) {
        out[..4].copy_from_slice(&self.relative_offset.to_be_bytes());
        out[4..8].copy_from_slice(&self.position.to_be_bytes());
    }
    fn follows(&self, prev: &Self) -> bool {
        self.relative_offset > prev.relative_offset && self.position > prev.position
    }
    fn is_zero(&self) -> bool {
        self.relative_offset == 0 && self.position == 0
    }
}

/// `.timeindex` entry: the largest timestamp seen so far in the segment (ms) and the offset,
/// relative to the base offset, of the batch that holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TimeEntry {
    pub timestamp_ms: i64,
    pub relative_offset: u32,
}

impl IndexEntry for TimeEntry {
    const SIZE: usize = 12;
    fn decode(b: &[u8]) -> Self {
        let mut ts = [0u8; 8];
        ts.copy_from_slice(&b[..8]);
        Self {
            timestamp_ms: i64::from_be_bytes(ts),
            relative_offset: u32::from_be_bytes([b[8], b[9], b[10], b[11]]),
        }
    }
    fn encode(&self, out: &mut [u8]) {
        out[..8].copy_from_slice(&self.timestamp_ms.to_be_bytes());
        out[8..12].copy_from_slice(&self.relative_offset.to_be_bytes());
    }
    fn follows(&self, prev: &Self) -> bool {
        self.timestamp_ms > prev.timestamp_ms && self.relative_offset >= prev.relative_offset
    }
    fn is_zero(&self) -> bool {
        self.timestamp_ms == 0 && self.relative_offset == 0
    }
}

/// A sparse index file of `E` entries.
pub(crate) struct Index<E: IndexEntry> {
    file: SegmentFile,
    /// Entries the index may hold before its segment must roll (`segment.index.bytes / SIZE`).
    max_entries: usize,
    max_index_bytes: u64,
    entries: RwLock<Vec<E>>,
    /// Entries were written (or the file cut) since the last [`Index::flush`].
    dirty: AtomicBool,
    /// The file's length as this index last left it (bytes): a reset of an empty file
    /// touches nothing.
    on_disk_len: AtomicU64,
    _entry: PhantomData<E>,
}

/// The offset index of a segment.
pub(crate) type OffsetIndex = Index<OffsetEntry>;
/// The time index of a segment.
pub(crate) type TimeIndex = Index<TimeEntry>;

/// How much of an index file [`Index::open`] reads at a time: it stops at the end of the valid
/// entries, so a file preallocated by Kafka or an older gregor (10 MiB of zeros after a crash)
/// costs one read, not ten megabytes.
const OPEN_READ_BYTES: usize = 64 * 1024;

impl<E: IndexEntry> Index<E> {
    /// Creates (or truncates) the empty index at `path`.
    ///
    /// # Errors
    /// [`LogError::Io`] when the file cannot be created.
    pub(crate) fn create(path: &Path, max_index_bytes: u64) -> Result<Self> {
        let file = SegmentFile::open(path, true, "creating index")?;
        Ok(Self::with_entries(file, max_index_bytes, Vec::new(), 0))
    }

    fn with_entries(
        file: SegmentFile,
        max_index_bytes: u64,
        entries: Vec<E>,
        on_disk_len: u64,
    ) -> Self {
        Self {
            file,
            max_entries: (max_index_bytes / E::SIZE as u64) as usize,
            max_index_bytes,
            entries: RwLock::new(entries),
            dirty: AtomicBool::new(false),
            on_disk_len: AtomicU64::new(on_disk_len),
            _entry: PhantomData,
        }
    }

    /// Opens an existing index (creating an empty one if missing). Returns the index and
    /// whether its contents looked sane: length a multiple of the entry size, entries strictly
    /// increasing up to the first zero entry, zeros after it as far as the read went, and every
    /// entry accepted by `plausible`. When not sane the caller must [`Index::reset`] and rebuild
    /// it from the log. A sane file longer than its entries (preallocated, then not trimmed
    /// because of a crash) is cut to them. The descriptor is closed again: the index is read
    /// from memory and its file opened only to append.
    ///
    /// # Errors
    /// [`LogError::Io`] when the file cannot be opened, read or cut.
    pub(crate) fn open(
        path: &Path,
        max_index_bytes: u64,
        plausible: impl Fn(&E) -> bool,
    ) -> Result<(Self, bool)> {
        let existed = path.exists();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| LogError::io("opening index", path, e))?;
        let len = file
            .metadata()
            .map_err(|e| LogError::io("reading metadata of index", path, e))?
            .len();
        let mut sane = existed && len % E::SIZE as u64 == 0;
        let mut entries: Vec<E> = Vec::new();
        let mut buf = vec![0u8; OPEN_READ_BYTES];
        let mut at = 0u64;
        'read: while at < len {
            let want = usize::try_from(len - at).map_or(buf.len(), |n| n.min(buf.len()));
            let chunk = &mut buf[..want];
            file.read_exact_at(chunk, at)
                .map_err(|e| LogError::io("reading index", path, e))?;
            let mut end = 0;
            for raw in chunk.chunks_exact(E::SIZE) {
                let e = E::decode(raw);
                let follows = match entries.last() {
                    None => !(e.is_zero() && len > E::SIZE as u64 && chunk_is_zero(&chunk[end..])),
                    Some(prev) => e.follows(prev),
                };
                if !follows {
                    if !chunk_is_zero(&chunk[end..]) {
                        sane = false;
                    }
                    break 'read;
                }
                if !plausible(&e) {
                    sane = false;
                    break 'read;
                }
                entries.push(e);
                end += E::SIZE;
            }
            at += want as u64;
        }
        let valid = (entries.len() * E::SIZE) as u64;
        let mut on_disk_len = len;
        if sane && len > valid {
            file.set_len(valid)
                .map_err(|e| LogError::io("trimming index", path, e))?;
            on_disk_len = valid;
        }
        drop(file);
        let idx = Self::with_entries(
            SegmentFile::closed(path),
            max_index_bytes,
            entries,
            on_disk_len,
        );
        Ok((idx, sane))
    }

    /// The index file's current path.
    pub(crate) fn path(&self) -> PathBuf {
        self.file.path()
    }

    /// The segment file behind the index (renames update its path).
    pub(crate) fn file(&self) -> &SegmentFile {
        &self.file
    }

    /// Drops every entry and empties the file.
    ///
    /// # Errors
    /// [`LogError::Io`] when the file cannot be cut.
    pub(crate) fn reset(&self) -> Result<()> {
        let mut entries = self.entries.write();
        entries.clear();
        if self.on_disk_len.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        self.set_file_len(0)
    }

    fn set_file_len(&self, len: u64) -> Result<()> {
        self.dirty.store(true, Ordering::Relaxed);
        self.file
            .get("opening index")?
            .set_len(len)
            .map_err(|e| LogError::io("resizing index", &self.path(), e))?;
        self.on_disk_len.store(len, Ordering::Release);
        Ok(())
    }

    /// Number of entries.
    pub(crate) fn len(&self) -> usize {
        self.entries.read().len()
    }

    /// Whether the index holds `segment.index.bytes` of entries (the segment must roll).
    pub(crate) fn is_full(&self) -> bool {
        self.len() >= self.max_entries
    }

    /// The newest entry.
    pub(crate) fn last(&self) -> Option<E> {
        self.entries.read().last().copied()
    }

    /// Appends `e` if it follows the last entry (otherwise it is ignored, as Kafka's time
    /// index `maybeAppend` does), writing it at the end of the file.
    ///
    /// # Errors
    /// [`LogError::Io`] when the entry cannot be written (the entry is then not added).
    pub(crate) fn append(&self, e: E) -> Result<()> {
        let mut entries = self.entries.write();
        if let Some(prev) = entries.last() {
            if !e.follows(prev) {
                return Ok(());
            }
        }
        let mut buf = [0u8; 16];
        e.encode(&mut buf[..E::SIZE]);
        let at = (entries.len() * E::SIZE) as u64;
        self.dirty.store(true, Ordering::Relaxed);
        self.file
            .get("opening index")?
            .write_all_at(&buf[..E::SIZE], at)
            .map_err(|err| LogError::io("writing index", &self.path(), err))?;
        self.on_disk_len
            .fetch_max(at + E::SIZE as u64, Ordering::AcqRel);
        entries.push(e);
        Ok(())
    }

    /// The last entry for which `le(entry)` holds, entries being sorted so that `le` is true
    /// for a prefix.
    pub(crate) fn floor_by(&self, le: impl Fn(&E) -> bool) -> Option<E> {
        let entries = self.entries.read();
        let n = entries.partition_point(le);
        if n == 0 {
            None
        } else {
            Some(entries[n - 1])
        }
    }

    /// fsyncs the file if entries were written since the last flush.
    ///
    /// # Errors
    /// [`LogError::Io`] when the file cannot be opened or synced (it stays dirty).
    pub(crate) fn flush(&self) -> Result<()> {
        if !self.dirty.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        let synced = self.file.get("opening index").and_then(|f| {
            f.sync_data()
                .map_err(|e| LogError::io("syncing index", &self.path(), e))
        });
        if synced.is_err() {
            self.dirty.store(true, Ordering::Release);
        }
        synced
    }

    /// Drops the entries after the first `keep` (the rollback of a failed append) and cuts
    /// the file to the entries left (ftruncate needs no free space).
    ///
    /// # Errors
    /// [`LogError::Io`] when the file cannot be resized.
    pub(crate) fn truncate_entries(&self, keep: usize) -> Result<()> {
        let mut entries = self.entries.write();
        if entries.len() <= keep {
            return Ok(());
        }
        self.set_file_len((keep * E::SIZE) as u64)?;
        entries.truncate(keep);
        Ok(())
    }

    /// The configured `segment.index.bytes`.
    #[allow(dead_code)]
    pub(crate) fn max_index_bytes(&self) -> u64 {
        self.max_index_bytes
    }
}

fn chunk_is_zero(b: &[u8]) -> bool {
    b.iter().all(|&x| x == 0)
}

/// Reads a whole file, for tests and checks.
#[allow(dead_code)]
pub(crate) fn read_all(path: &Path) -> io::Result<Vec<u8>> {
    std::fs::read(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_lookup_trim_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.index");
        let idx = OffsetIndex::create(&path, 80).unwrap();
        // Never preallocated: the file holds exactly its entries.
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
        for i in 1..=5u32 {
            idx.append(OffsetEntry {
                relative_offset: i * 10,
                position: i * 100,
            })
            .unwrap();
        }
        // Not increasing: ignored.
        idx.append(OffsetEntry {
            relative_offset: 50,
            position: 600,
        })
        .unwrap();
        assert_eq!(idx.len(), 5);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 40);
        let e = idx.floor_by(|e| e.relative_offset <= 35).unwrap();
        assert_eq!(e.position, 300);
        assert!(idx.floor_by(|e| e.relative_offset <= 5).is_none());
        // Zeros after the entries (a file Kafka preallocated) are not entries, and are cut.
        idx.file().get("t").unwrap().set_len(80).unwrap();
        let (re, sane) = OffsetIndex::open(&path, 80, |_| true).unwrap();
        assert!(sane);
        assert_eq!(re.len(), 5);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 40);
        // Full at segment.index.bytes.
        assert!(!re.is_full());
        for i in 6..=10u32 {
            re.append(OffsetEntry {
                relative_offset: i * 10,
                position: i * 100,
            })
            .unwrap();
        }
        assert!(re.is_full());
        re.truncate_entries(5).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 40);
        let (re, sane) = OffsetIndex::open(&path, 80, |_| true).unwrap();
        assert!(sane);
        assert_eq!(
            re.last(),
            Some(OffsetEntry {
                relative_offset: 50,
                position: 500
            })
        );
    }

    #[test]
    fn garbage_is_detected() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.timeindex");
        let idx = TimeIndex::create(&path, 120).unwrap();
        idx.append(TimeEntry {
            timestamp_ms: 10,
            relative_offset: 1,
        })
        .unwrap();
        idx.append(TimeEntry {
            timestamp_ms: 20,
            relative_offset: 2,
        })
        .unwrap();
        // Garbage after the entries.
        idx.file()
            .get("t")
            .unwrap()
            .write_all_at(&[1; 12], 36)
            .unwrap();
        let (_, sane) = TimeIndex::open(&path, 120, |_| true).unwrap();
        assert!(!sane);
        // Garbage past the first read of a large preallocated file is not looked at; a file of
        // zeros that large costs one read and is cut to nothing.
        std::fs::write(&path, vec![0u8; 12 * 873_813]).unwrap();
        let (re, sane) = TimeIndex::open(&path, 10 * 1024 * 1024, |_| true).unwrap();
        assert!(sane);
        assert_eq!(re.len(), 0);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
        // Odd length.
        std::fs::write(&path, [0u8; 13]).unwrap();
        let (_, sane) = TimeIndex::open(&path, 120, |_| true).unwrap();
        assert!(!sane);
        // Missing file.
        std::fs::remove_file(&path).unwrap();
        let (re, sane) = TimeIndex::open(&path, 120, |_| true).unwrap();
        assert!(!sane);
        assert_eq!(re.len(), 0);
    }
}
