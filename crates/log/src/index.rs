//! Kafka's sparse segment indexes: `.index` (OffsetIndex) and `.timeindex` (TimeIndex).
//!
//! Both files are arrays of fixed-size big-endian entries, Kafka's format (so `kafka-dump-log`
//! reads them). Kafka preallocates them to `segment.index.bytes` and memory-maps them; gregor
//! keeps the entries in memory (8 or 12 bytes per `index.interval.bytes` of log), so lookups
//! are binary searches without system calls, and the file holds exactly its entries, appended
//! with positional writes through a descriptor opened on demand ([`crate::files`]). The index
//! still fills at `segment.index.bytes`, which rolls the segment as in Kafka.
//!
//! The active segment's entries are loaded when its log opens and stay in memory. An inactive
//! segment's are read (and checked) on first use and then held within the budget of
//! [`crate::index_cache`], which may drop them again; Kafka memory-maps its index files lazily
//! for the same reason (`LazyIndex`, KIP-263). The segment decides when to load
//! ([`crate::segment`]); this module reads, checks, holds and writes one file.
//!
//! Readers take the entries' read lock only for the binary search; the appender takes the write
//! lock only to push one entry. Neither is the partition's append lock.

use std::fs::OpenOptions;
use std::io;
use std::marker::PhantomData;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::{RwLock, RwLockReadGuard};

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
    /// The entries; `None` while they are not loaded: an inactive segment's index before its
    /// first use, or after the index cache dropped them ([`crate::index_cache`]).
    entries: RwLock<Option<Vec<E>>>,
    /// Entries were written (or the file cut) since the last [`Index::flush`].
    dirty: AtomicBool,
    /// The file's length as this index last left it (bytes), [`UNKNOWN_LEN`] before it is
    /// read: a reset of an empty file touches nothing.
    on_disk_len: AtomicU64,
    _entry: PhantomData<E>,
}

/// The offset index of a segment.
pub(crate) type OffsetIndex = Index<OffsetEntry>;
/// The time index of a segment.
pub(crate) type TimeIndex = Index<TimeEntry>;

/// How much of an index file [`Index::read_file`] reads at a time: it stops at the end of the
/// valid entries, so a file preallocated by Kafka or an older gregor (10 MiB of zeros after a
/// crash) costs one read, not ten megabytes.
const OPEN_READ_BYTES: usize = 64 * 1024;

/// [`Index::on_disk_len`] of a file not read yet.
const UNKNOWN_LEN: u64 = u64::MAX;

/// What [`Index::read_file`] found.
pub(crate) struct ReadIndex<E> {
    /// The valid entries (empty when `problem` is set).
    pub entries: Vec<E>,
    /// Why the file is not a sane index, naming it; the caller rebuilds it from the log.
    pub problem: Option<String>,
    /// The file's length after the read (cut to the entries when it was longer).
    pub file_len: u64,
    /// Bytes read from the file.
    pub bytes_read: u64,
}

/// The end of an index file, as [`Index::read_tail`] found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tail<E> {
    /// The file is empty.
    Empty,
    /// Its last entry (which follows the one before it, if any).
    Last(E),
    /// Missing, not a whole number of entries, or ending in zeros or entries out of order:
    /// only a full read can tell.
    Unknown,
}

/// Appends `e` to `entries` if it follows the last one; whether it did.
pub(crate) fn push_if_follows<E: IndexEntry>(entries: &mut Vec<E>, e: E) -> bool {
    if entries.last().is_some_and(|prev| !e.follows(prev)) {
        return false;
    }
    entries.push(e);
    true
}

/// The last entry of `entries` for which `le(entry)` holds, entries being sorted so that `le`
/// is true for a prefix.
pub(crate) fn floor_by<E: IndexEntry>(entries: &[E], le: impl Fn(&E) -> bool) -> Option<E> {
    let n = entries.partition_point(le);
    n.checked_sub(1).map(|i| entries[i])
}

/// Heap bytes of `entries` (its capacity: what the allocator holds).
pub(crate) fn heap_bytes<E: IndexEntry>(entries: &Vec<E>) -> u64 {
    (entries.capacity() * E::SIZE) as u64
}

impl<E: IndexEntry> Index<E> {
    /// Creates (or truncates) the empty index at `path`, its entries loaded.
    ///
    /// # Errors
    /// [`LogError::Io`] when the file cannot be created.
    pub(crate) fn create(path: &Path, max_index_bytes: u64) -> Result<Self> {
        let file = SegmentFile::open(path, true, "creating index")?;
        Ok(Self::with_entries(
            file,
            max_index_bytes,
            Some(Vec::new()),
            0,
        ))
    }

    /// Refers to the index at `path` without reading it: its entries are not loaded until
    /// [`Index::install`] (after [`Index::read_file`]).
    pub(crate) fn unloaded(path: &Path, max_index_bytes: u64) -> Self {
        Self::with_entries(
            SegmentFile::closed(path),
            max_index_bytes,
            None,
            UNKNOWN_LEN,
        )
    }

    fn with_entries(
        file: SegmentFile,
        max_index_bytes: u64,
        entries: Option<Vec<E>>,
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

    /// Reads the index file and checks it: length a multiple of the entry size, entries
    /// strictly increasing up to the first zero entry, zeros after it as far as the read went,
    /// and every entry accepted by `plausible`. A missing file is not sane either (Kafka's
    /// `LogSegment.sanityCheck` rebuilds a missing offset index too). With `trim`, a sane file
    /// longer than its entries (preallocated, then not trimmed because of a crash) is cut to
    /// them. Reads through a descriptor of its own, closed on return; the entries are not
    /// installed.
    ///
    /// # Errors
    /// [`LogError::Io`] when the file cannot be opened (other than missing), read or cut.
    pub(crate) fn read_file(
        &self,
        plausible: impl Fn(&E) -> bool,
        trim: bool,
    ) -> Result<ReadIndex<E>> {
        let path = self.path();
        let insane = |problem: String, file_len: u64, bytes_read: u64| ReadIndex {
            entries: Vec::new(),
            problem: Some(problem),
            file_len,
            bytes_read,
        };
        let file = match OpenOptions::new().read(true).write(trim).open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Ok(insane(format!("{} is missing", path.display()), 0, 0));
            }
            Err(e) => return Err(LogError::io("opening index", &path, e)),
        };
        let len = file
            .metadata()
            .map_err(|e| LogError::io("reading metadata of index", &path, e))?
            .len();
        if len % E::SIZE as u64 != 0 {
            return Ok(insane(
                format!(
                    "{} is {len} bytes long, not a multiple of its {}-byte entries",
                    path.display(),
                    E::SIZE
                ),
                len,
                0,
            ));
        }
        let mut entries: Vec<E> = Vec::new();
        let mut buf = vec![0u8; OPEN_READ_BYTES];
        let mut at = 0u64;
        'read: while at < len {
            let want = usize::try_from(len - at).map_or(buf.len(), |n| n.min(buf.len()));
            let chunk = &mut buf[..want];
            file.read_exact_at(chunk, at)
                .map_err(|e| LogError::io("reading index", &path, e))?;
            at += want as u64;
            let mut end = 0;
            for raw in chunk.chunks_exact(E::SIZE) {
                let e = E::decode(raw);
                let follows = match entries.last() {
                    None => !(e.is_zero() && len > E::SIZE as u64 && chunk_is_zero(&chunk[end..])),
                    Some(prev) => e.follows(prev),
                };
                if !follows {
                    if !chunk_is_zero(&chunk[end..]) {
                        return Ok(insane(
                            format!(
                                "{}: entry {} ({e:?}) does not follow {:?}",
                                path.display(),
                                entries.len(),
                                entries.last()
                            ),
                            len,
                            at,
                        ));
                    }
                    break 'read;
                }
                if !plausible(&e) {
                    return Ok(insane(
                        format!(
                            "{}: entry {} ({e:?}) is impossible",
                            path.display(),
                            entries.len()
                        ),
                        len,
                        at,
                    ));
                }
                entries.push(e);
                end += E::SIZE;
            }
        }
        let valid = (entries.len() * E::SIZE) as u64;
        let mut file_len = len;
        if trim && len > valid {
            file.set_len(valid)
                .map_err(|e| LogError::io("trimming index", &path, e))?;
            file_len = valid;
        }
        entries.shrink_to_fit();
        Ok(ReadIndex {
            entries,
            problem: None,
            file_len,
            bytes_read: at,
        })
    }

    /// Reads only the end of the file (its last two entries at most, one small read) and
    /// returns the last entry when the file looks like it holds exactly its entries: a whole
    /// number of entries, the last two non-zero and in order. Returns the bytes read too.
    ///
    /// # Errors
    /// [`LogError::Io`] when the file cannot be opened (other than missing) or read.
    pub(crate) fn read_tail(&self) -> Result<(Tail<E>, u64)> {
        let path = self.path();
        let file = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((Tail::Unknown, 0)),
            Err(e) => return Err(LogError::io("opening index", &path, e)),
        };
        let len = file
            .metadata()
            .map_err(|e| LogError::io("reading metadata of index", &path, e))?
            .len();
        let size = E::SIZE as u64;
        if len == 0 {
            return Ok((Tail::Empty, 0));
        }
        if len % size != 0 {
            return Ok((Tail::Unknown, 0));
        }
        let n = if len >= 2 * size { 2 } else { 1 };
        let mut buf = [0u8; 32];
        let buf = &mut buf[..n * E::SIZE];
        file.read_exact_at(buf, len - n as u64 * size)
            .map_err(|e| LogError::io("reading index", &path, e))?;
        let last = E::decode(&buf[(n - 1) * E::SIZE..]);
        let follows = n == 1 || {
            let prev = E::decode(&buf[..E::SIZE]);
            !prev.is_zero() && last.follows(&prev)
        };
        let tail = if last.is_zero() || !follows {
            Tail::Unknown
        } else {
            Tail::Last(last)
        };
        Ok((tail, buf.len() as u64))
    }

    /// Stores entries read by [`Index::read_file`] (or rebuilt and written by
    /// [`Index::rewrite`]) from a file of `file_len` bytes; returns their heap bytes.
    pub(crate) fn install(&self, entries: Vec<E>, file_len: u64) -> u64 {
        let bytes = heap_bytes(&entries);
        let mut slot = self.entries.write();
        self.on_disk_len.store(file_len, Ordering::Release);
        *slot = Some(entries);
        bytes
    }

    /// Drops the loaded entries (the index cache's eviction).
    pub(crate) fn unload(&self) {
        let dropped = self.entries.write().take();
        drop(dropped);
    }

    /// Releases spare capacity of the loaded entries; returns their heap bytes (0 when not
    /// loaded).
    pub(crate) fn shrink(&self) -> u64 {
        let mut entries = self.entries.write();
        entries.as_mut().map_or(0, |v| {
            v.shrink_to_fit();
            heap_bytes(v)
        })
    }

    /// Replaces the file's contents with `entries` (an index rebuilt from the log), creating
    /// it if missing. Written in place through a descriptor of its own: a crash part way
    /// leaves a file the next load checks again. Not fsynced (a lost rebuild is redone).
    ///
    /// # Errors
    /// [`LogError::Io`] when the file cannot be opened, written or cut.
    pub(crate) fn rewrite(&self, entries: &[E]) -> Result<u64> {
        let path = self.path();
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| LogError::io("opening index", &path, e))?;
        let mut buf = vec![0u8; entries.len() * E::SIZE];
        for (e, out) in entries.iter().zip(buf.chunks_exact_mut(E::SIZE)) {
            e.encode(out);
        }
        file.write_all_at(&buf, 0)
            .map_err(|e| LogError::io("writing index", &path, e))?;
        file.set_len(buf.len() as u64)
            .map_err(|e| LogError::io("trimming index", &path, e))?;
        Ok(buf.len() as u64)
    }

    /// The loaded entries (`None` when not loaded), for a lookup under the read lock.
    pub(crate) fn entries(&self) -> RwLockReadGuard<'_, Option<Vec<E>>> {
        self.entries.read()
    }

    /// The index file's current path.
    pub(crate) fn path(&self) -> PathBuf {
        self.file.path()
    }

    /// The segment file behind the index (renames update its path).
    pub(crate) fn file(&self) -> &SegmentFile {
        &self.file
    }

    /// Drops every entry and empties the file (creating it if missing); the entries are
    /// loaded (empty) afterwards.
    ///
    /// # Errors
    /// [`LogError::Io`] when the file cannot be created or cut.
    pub(crate) fn reset(&self) -> Result<()> {
        let mut entries = self.entries.write();
        *entries = Some(Vec::new());
        if self.on_disk_len.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        self.dirty.store(true, Ordering::Relaxed);
        self.file
            .get_creating("creating index")?
            .set_len(0)
            .map_err(|e| LogError::io("resizing index", &self.path(), e))?;
        self.on_disk_len.store(0, Ordering::Release);
        Ok(())
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

    /// Number of loaded entries (0 when not loaded: only the active segment's indexes, which
    /// are always loaded, are asked).
    pub(crate) fn len(&self) -> usize {
        self.entries.read().as_ref().map_or(0, Vec::len)
    }

    /// Whether the index holds `segment.index.bytes` of entries (the segment must roll).
    pub(crate) fn is_full(&self) -> bool {
        self.len() >= self.max_entries
    }

    /// Appends `e` if it follows the last entry (otherwise it is ignored, as Kafka's time
    /// index `maybeAppend` does), writing it at the end of the file. Only for an index whose
    /// entries are loaded and pinned (the active segment's, or one being recovered).
    ///
    /// # Errors
    /// [`LogError::Io`] when the entry cannot be written (the entry is then not added);
    /// [`LogError::CorruptFile`] when the entries are not loaded (a bug).
    pub(crate) fn append(&self, e: E) -> Result<()> {
        let mut guard = self.entries.write();
        let Some(entries) = guard.as_mut() else {
            debug_assert!(false, "append to an index that is not loaded");
            return Err(LogError::CorruptFile {
                path: self.path().display().to_string(),
                reason: "appending to an index whose entries are not loaded".into(),
            });
        };
        if entries.last().is_some_and(|prev| !e.follows(prev)) {
            return Ok(());
        }
        let mut buf = [0u8; 16];
        e.encode(&mut buf[..E::SIZE]);
        let at = (entries.len() * E::SIZE) as u64;
        self.dirty.store(true, Ordering::Relaxed);
        self.file
            .get("opening index")?
            .write_all_at(&buf[..E::SIZE], at)
            .map_err(|err| LogError::io("writing index", &self.path(), err))?;
        let _ = self
            .on_disk_len
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |len| {
                (len == UNKNOWN_LEN || len < at + E::SIZE as u64).then_some(at + E::SIZE as u64)
            });
        entries.push(e);
        Ok(())
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
        let mut guard = self.entries.write();
        let Some(entries) = guard.as_mut() else {
            return Ok(());
        };
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

    fn read<E: IndexEntry>(path: &Path, max: u64) -> (Index<E>, ReadIndex<E>) {
        let idx = Index::<E>::unloaded(path, max);
        let r = idx.read_file(|_| true, true).unwrap();
        (idx, r)
    }

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
        {
            let entries = idx.entries();
            let entries = entries.as_deref().unwrap();
            let e = floor_by(entries, |e| e.relative_offset <= 35).unwrap();
            assert_eq!(e.position, 300);
            assert!(floor_by(entries, |e| e.relative_offset <= 5).is_none());
        }
        // Zeros after the entries (a file Kafka preallocated) are not entries, and are cut.
        idx.file().get("t").unwrap().set_len(80).unwrap();
        assert_eq!(
            OffsetIndex::unloaded(&path, 80).read_tail().unwrap().0,
            Tail::Unknown
        );
        let (re, r) = read::<OffsetEntry>(&path, 80);
        assert!(r.problem.is_none());
        assert_eq!(r.entries.len(), 5);
        assert_eq!(r.file_len, 40);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 40);
        re.install(r.entries, r.file_len);
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
        let (re, r) = read::<OffsetEntry>(&path, 80);
        assert!(r.problem.is_none());
        let last = OffsetEntry {
            relative_offset: 50,
            position: 500,
        };
        assert_eq!(r.entries.last(), Some(&last));
        // The tail alone gives the same last entry, reading two entries.
        assert_eq!(re.read_tail().unwrap(), (Tail::Last(last), 16));
        // Unloaded, the index answers nothing; rewritten, the file holds exactly the entries.
        assert!(re.entries().is_none());
        assert_eq!(re.rewrite(&r.entries[..2]).unwrap(), 16);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 16);
        re.install(r.entries, 16);
        assert_eq!(re.len(), 5);
        re.unload();
        assert!(re.entries().is_none());
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
        let (re, r) = read::<TimeEntry>(&path, 120);
        assert!(r.problem.is_some());
        assert!(r.entries.is_empty());
        // The tail does not follow the entry before it: unknown.
        assert_eq!(re.read_tail().unwrap().0, Tail::Unknown);
        // Garbage past the first read of a large preallocated file is not looked at; a file of
        // zeros that large costs one read and is cut to nothing.
        std::fs::write(&path, vec![0u8; 12 * 873_813]).unwrap();
        let (_, r) = read::<TimeEntry>(&path, 10 * 1024 * 1024);
        assert!(r.problem.is_none());
        assert_eq!(r.entries.len(), 0);
        assert_eq!(r.bytes_read, OPEN_READ_BYTES as u64);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
        assert_eq!(re.read_tail().unwrap().0, Tail::Empty);
        // Odd length.
        std::fs::write(&path, [0u8; 13]).unwrap();
        let (_, r) = read::<TimeEntry>(&path, 120);
        assert!(r.problem.is_some());
        assert_eq!(re.read_tail().unwrap().0, Tail::Unknown);
        // Missing file.
        std::fs::remove_file(&path).unwrap();
        let (re, r) = read::<TimeEntry>(&path, 120);
        assert!(r.problem.is_some_and(|p| p.contains("missing")));
        assert_eq!(re.read_tail().unwrap().0, Tail::Unknown);
        // Reset creates it.
        re.reset().unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
        assert_eq!(re.len(), 0);
    }
}
