//! Kafka's sparse segment indexes: `.index` (OffsetIndex) and `.timeindex` (TimeIndex).
//!
//! Both files are arrays of fixed-size big-endian entries, preallocated to
//! `segment.index.bytes` while their segment is active and trimmed to the valid entries when it
//! rolls or the log closes, exactly as Kafka does (so `kafka-dump-log` reads them). Entries are
//! also kept in memory (8 or 12 bytes per `index.interval.bytes` of log) so lookups are binary
//! searches without system calls; the file is written with positional writes.
//!
//! Readers take the entries' read lock only for the binary search; the appender takes the write
//! lock only to push one entry. Neither is the partition's append lock.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::marker::PhantomData;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use parking_lot::RwLock;

use crate::error::{LogError, Result};

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
    path: PathBuf,
    file: File,
    /// Entries the preallocated file can hold (`segment.index.bytes / SIZE`).
    max_entries: usize,
    max_index_bytes: u64,
    entries: RwLock<Vec<E>>,
    _entry: PhantomData<E>,
}

/// The offset index of a segment.
pub(crate) type OffsetIndex = Index<OffsetEntry>;
/// The time index of a segment.
pub(crate) type TimeIndex = Index<TimeEntry>;

impl<E: IndexEntry> Index<E> {
    fn open_file(path: &Path) -> Result<File> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| LogError::io("opening index", path, e))
    }

    /// Creates (or truncates) the index at `path`, preallocated to `max_index_bytes`.
    pub(crate) fn create(path: &Path, max_index_bytes: u64) -> Result<Self> {
        let file = Self::open_file(path)?;
        let idx = Self {
            path: path.to_path_buf(),
            file,
            max_entries: (max_index_bytes / E::SIZE as u64) as usize,
            max_index_bytes,
            entries: RwLock::new(Vec::new()),
            _entry: PhantomData,
        };
        idx.reset()?;
        Ok(idx)
    }

    /// Opens an existing index (creating an empty one if missing). Returns the index and
    /// whether its contents looked sane: entries strictly increasing, nothing but zeros after
    /// the last one, length a multiple of the entry size, and every entry accepted by
    /// `plausible`. When not sane the caller must [`Index::reset`] and rebuild it from the log.
    pub(crate) fn open(
        path: &Path,
        max_index_bytes: u64,
        plausible: impl Fn(&E) -> bool,
    ) -> Result<(Self, bool)> {
        let existed = path.exists();
        let mut file = Self::open_file(path)?;
        let mut raw = Vec::new();
        file.read_to_end(&mut raw)
            .map_err(|e| LogError::io("reading index", path, e))?;
        let mut sane = existed && raw.len() % E::SIZE == 0;
        let mut entries: Vec<E> = Vec::with_capacity(raw.len() / E::SIZE);
        let mut end = 0;
        for chunk in raw.chunks_exact(E::SIZE) {
            let e = E::decode(chunk);
            let ok = match entries.last() {
                None => !(e.is_zero() && raw.len() > E::SIZE && chunk_is_zero(&raw[E::SIZE..])),
                Some(prev) => e.follows(prev),
            };
            if !ok {
                break;
            }
            if !plausible(&e) {
                sane = false;
                break;
            }
            entries.push(e);
            end += E::SIZE;
        }
        if !chunk_is_zero(&raw[end.min(raw.len())..]) {
            sane = false;
        }
        let idx = Self {
            path: path.to_path_buf(),
            file,
            max_entries: (max_index_bytes / E::SIZE as u64) as usize,
            max_index_bytes,
            entries: RwLock::new(entries),
            _entry: PhantomData,
        };
        Ok((idx, sane))
    }

    /// Drops every entry and preallocates the file again.
    pub(crate) fn reset(&self) -> Result<()> {
        let mut entries = self.entries.write();
        entries.clear();
        self.file
            .set_len(0)
            .and_then(|()| self.file.set_len(self.preallocated_len()))
            .map_err(|e| LogError::io("resetting index", &self.path, e))
    }

    fn preallocated_len(&self) -> u64 {
        self.max_entries as u64 * E::SIZE as u64
    }

    /// Number of entries.
    pub(crate) fn len(&self) -> usize {
        self.entries.read().len()
    }

    /// Whether the preallocated space is used up (the segment must roll).
    pub(crate) fn is_full(&self) -> bool {
        self.len() >= self.max_entries
    }

    /// The newest entry.
    pub(crate) fn last(&self) -> Option<E> {
        self.entries.read().last().copied()
    }

    /// Appends `e` if it follows the last entry (otherwise it is ignored, as Kafka's time
    /// index `maybeAppend` does). Writes beyond the preallocated size extend the file.
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
        self.file
            .write_all_at(&buf[..E::SIZE], at)
            .map_err(|err| LogError::io("writing index", &self.path, err))?;
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

    /// fsyncs the file.
    pub(crate) fn flush(&self) -> Result<()> {
        self.file
            .sync_data()
            .map_err(|e| LogError::io("syncing index", &self.path, e))
    }

    /// Drops the entries after the first `keep` (the rollback of a failed append): the file is
    /// cut to `keep` entries and grown back to its former length, so the dropped entries read
    /// as zeros (what an index check expects after the last entry) without writing a byte,
    /// which a full disk would refuse.
    ///
    /// # Errors
    /// [`LogError::Io`] when the file cannot be resized.
    pub(crate) fn truncate_entries(&self, keep: usize) -> Result<()> {
        let mut entries = self.entries.write();
        if entries.len() <= keep {
            return Ok(());
        }
        let len = self
            .file
            .metadata()
            .map_err(|e| LogError::io("reading index metadata", &self.path, e))?
            .len();
        self.file
            .set_len((keep * E::SIZE) as u64)
            .and_then(|()| self.file.set_len(len))
            .map_err(|e| LogError::io("truncating index", &self.path, e))?;
        entries.truncate(keep);
        Ok(())
    }

    /// Shrinks the file to its entries (on roll and close), as Kafka's `trimToValidSize`.
    pub(crate) fn trim_to_valid_size(&self) -> Result<()> {
        let len = (self.len() * E::SIZE) as u64;
        self.file
            .set_len(len)
            .map_err(|e| LogError::io("trimming index", &self.path, e))
    }

    /// Grows the file back to the preallocated size (when a trimmed segment becomes active
    /// again after a restart).
    pub(crate) fn preallocate(&self) -> Result<()> {
        let current = self
            .file
            .metadata()
            .map_err(|e| LogError::io("reading index metadata", &self.path, e))?
            .len();
        let want = self.preallocated_len().max((self.len() * E::SIZE) as u64);
        if current < want {
            self.file
                .set_len(want)
                .map_err(|e| LogError::io("preallocating index", &self.path, e))?;
        }
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
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 80);
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
        let e = idx.floor_by(|e| e.relative_offset <= 35).unwrap();
        assert_eq!(e.position, 300);
        assert!(idx.floor_by(|e| e.relative_offset <= 5).is_none());
        // Preallocated zeros are not entries.
        let (re, sane) = OffsetIndex::open(&path, 80, |_| true).unwrap();
        assert!(sane);
        assert_eq!(re.len(), 5);
        idx.trim_to_valid_size().unwrap();
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
        idx.file.write_all_at(&[1, 2, 3], 40).unwrap();
        let (_, sane) = TimeIndex::open(&path, 120, |_| true).unwrap();
        assert!(!sane);
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
