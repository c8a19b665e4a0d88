//! The transaction index (`<base offset>.txnindex`): the aborted transactions whose ABORT
//! marker is in a segment, in Kafka's format (`TransactionIndex`, `AbortedTxn`), so that
//! `kafka-dump-log --files x.txnindex` reads gregor's and gregor reads Kafka's.
//!
//! The file is a sequence of 34-byte entries, in the order the markers were written, all
//! integers big-endian:
//!
//! ```text
//! version i16 (0) | producer_id i64 | first_offset i64 | last_offset i64 | last_stable_offset i64
//! ```
//!
//! `first_offset` is the transaction's first offset in this partition, `last_offset` the
//! offset of its ABORT marker, and `last_stable_offset` the partition's LSO once the marker
//! was written (the first offset of the earliest other open transaction, or the marker's
//! offset + 1): a read_committed fetch whose upper bound is at or below it need not look at
//! later segments. The file exists only once a segment has an aborted transaction; it is
//! written by the append path under the partition's append lock, opened per operation (it
//! is not counted in [`crate::files`]' descriptor budget: appends are one per aborted
//! transaction and reads one per read_committed fetch that reaches a segment with one), and
//! read in chunks of [`READ_CHUNK_ENTRIES`] entries, never whole.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;

use parking_lot::Mutex;

use crate::error::{LogError, Result};

/// Bytes of one entry (Kafka's `AbortedTxn.TOTAL_SIZE`).
pub const ABORTED_TXN_BYTES: usize = 34;
/// The entry version written (Kafka's `AbortedTxn.CURRENT_VERSION`).
pub const ABORTED_TXN_VERSION: i16 = 0;
/// Entries read per chunk: bounds the buffer of a read (34 KiB).
pub const READ_CHUNK_ENTRIES: usize = 1024;

/// One aborted transaction (Kafka's `AbortedTxn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AbortedTxn {
    /// The transaction's producer id.
    pub producer_id: i64,
    /// The transaction's first offset in the partition.
    pub first_offset: i64,
    /// The offset of its ABORT marker.
    pub last_offset: i64,
    /// The partition's last stable offset after the marker.
    pub last_stable_offset: i64,
}

impl AbortedTxn {
    /// The 34 bytes of the entry.
    pub fn encode(&self) -> [u8; ABORTED_TXN_BYTES] {
        let mut b = [0u8; ABORTED_TXN_BYTES];
        b[0..2].copy_from_slice(&ABORTED_TXN_VERSION.to_be_bytes());
        b[2..10].copy_from_slice(&self.producer_id.to_be_bytes());
        b[10..18].copy_from_slice(&self.first_offset.to_be_bytes());
        b[18..26].copy_from_slice(&self.last_offset.to_be_bytes());
        b[26..34].copy_from_slice(&self.last_stable_offset.to_be_bytes());
        b
    }

    /// Decodes one entry.
    ///
    /// # Errors
    /// A description when `b` is not 34 bytes or its version is newer than 0 (Kafka refuses
    /// those too).
    pub fn decode(b: &[u8]) -> std::result::Result<Self, String> {
        if b.len() != ABORTED_TXN_BYTES {
            return Err(format!(
                "aborted transaction entry of {} bytes, {ABORTED_TXN_BYTES} expected",
                b.len()
            ));
        }
        let version = i16::from_be_bytes([b[0], b[1]]);
        if !(0..=ABORTED_TXN_VERSION).contains(&version) {
            return Err(format!("unexpected aborted transaction version {version}"));
        }
        let i64_at = |at: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[at..at + 8]);
            i64::from_be_bytes(a)
        };
        Ok(Self {
            producer_id: i64_at(2),
            first_offset: i64_at(10),
            last_offset: i64_at(18),
            last_stable_offset: i64_at(26),
        })
    }
}

/// What a segment knows of its `.txnindex` (loaded on first use).
#[derive(Debug, Default)]
struct State {
    loaded: bool,
    /// Bytes of whole entries in the file.
    len: u64,
    /// The last entry's `last_offset`.
    last_offset: Option<i64>,
    /// Entries were appended since the last fsync.
    unsynced: bool,
}

/// One segment's transaction index. The file's path is passed in by the segment (it follows
/// the segment's renames).
#[derive(Debug, Default)]
pub(crate) struct TransactionIndex {
    state: Mutex<State>,
}

fn io(context: &str, path: &Path, e: std::io::Error) -> LogError {
    LogError::io(context, path, e)
}

fn corrupt(path: &Path, reason: String) -> LogError {
    LogError::CorruptFile {
        path: path.display().to_string(),
        reason,
    }
}

impl TransactionIndex {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Reads the file's length and last entry once. A torn last entry (a crash during an
    /// append) is cut off.
    fn load(&self, state: &mut State, path: &Path) -> Result<()> {
        if state.loaded {
            return Ok(());
        }
        let file = match File::options().read(true).write(true).open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                *state = State {
                    loaded: true,
                    ..State::default()
                };
                return Ok(());
            }
            Err(e) => return Err(io("opening", path, e)),
        };
        let raw_len = file
            .metadata()
            .map_err(|e| io("reading metadata of", path, e))?
            .len();
        let len = raw_len - raw_len % ABORTED_TXN_BYTES as u64;
        if len != raw_len {
            tracing::warn!(path = %path.display(), bytes = raw_len - len,
                "cutting a torn entry off the transaction index");
            file.set_len(len).map_err(|e| io("truncating", path, e))?;
        }
        let last_offset = if len == 0 {
            None
        } else {
            let mut b = [0u8; ABORTED_TXN_BYTES];
            file.read_exact_at(&mut b, len - ABORTED_TXN_BYTES as u64)
                .map_err(|e| io("reading", path, e))?;
            Some(
                AbortedTxn::decode(&b)
                    .map_err(|r| corrupt(path, r))?
                    .last_offset,
            )
        };
        *state = State {
            loaded: true,
            len,
            last_offset,
            unsynced: false,
        };
        Ok(())
    }

    /// Appends `txn` (Kafka's `TransactionIndex.append`): its last offset must be above the
    /// last entry's.
    ///
    /// # Errors
    /// [`LogError::InvalidRecord`] for an entry out of order, [`LogError::Io`].
    pub(crate) fn append(&self, path: &Path, txn: &AbortedTxn) -> Result<()> {
        let mut state = self.state.lock();
        self.load(&mut state, path)?;
        if let Some(last) = state.last_offset {
            if last >= txn.last_offset {
                return Err(LogError::InvalidRecord(format!(
                    "The last offset of appended transactions must increase sequentially, but {} is not greater than current last offset {last} of index {}",
                    txn.last_offset,
                    path.display()
                )));
            }
        }
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| io("opening", path, e))?;
        // A torn write of an earlier append was cut at load; this one lands at `len`.
        file.write_all(&txn.encode())
            .map_err(|e| io("appending to", path, e))?;
        state.len += ABORTED_TXN_BYTES as u64;
        state.last_offset = Some(txn.last_offset);
        state.unsynced = true;
        Ok(())
    }

    /// Reads the entries, at most [`READ_CHUNK_ENTRIES`] at a time, passing each to `f` until
    /// it returns false.
    fn for_each(&self, path: &Path, mut f: impl FnMut(u64, AbortedTxn) -> bool) -> Result<()> {
        let len = {
            let mut state = self.state.lock();
            self.load(&mut state, path)?;
            state.len
        };
        if len == 0 {
            return Ok(());
        }
        let file = match File::open(path) {
            Ok(f) => f,
            // Deleted meanwhile (retention): nothing to report from it.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io("opening", path, e)),
        };
        let mut buf = vec![0u8; READ_CHUNK_ENTRIES * ABORTED_TXN_BYTES];
        let mut pos = 0u64;
        while pos < len {
            let want = ((len - pos) as usize).min(buf.len());
            let mut got = 0;
            while got < want {
                match file.read_at(&mut buf[got..want], pos + got as u64) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(io("reading", path, e)),
                }
            }
            // Cut by a truncation meanwhile: what is there is all there is.
            let whole = got - got % ABORTED_TXN_BYTES;
            for (i, chunk) in buf[..whole].chunks_exact(ABORTED_TXN_BYTES).enumerate() {
                let txn = AbortedTxn::decode(chunk).map_err(|r| corrupt(path, r))?;
                if !f(pos + (i * ABORTED_TXN_BYTES) as u64, txn) {
                    return Ok(());
                }
            }
            if whole < want {
                return Ok(());
            }
            pos += whole as u64;
        }
        Ok(())
    }

    /// Every entry (tests, tools).
    ///
    /// # Errors
    /// [`LogError::Io`], [`LogError::CorruptFile`] for an entry of an unknown version.
    pub(crate) fn all(&self, path: &Path) -> Result<Vec<AbortedTxn>> {
        let mut out = Vec::new();
        self.for_each(path, |_, t| {
            out.push(t);
            true
        })?;
        Ok(out)
    }

    /// Kafka's `TransactionIndex.collectAbortedTxns`: the entries overlapping
    /// `[fetch_offset, upper_bound_offset)` (last offset at or after the first, first offset
    /// before the bound), and whether the search is complete (an entry's last stable offset
    /// reached the bound, so later segments cannot hold a transaction overlapping the range).
    ///
    /// # Errors
    /// As [`TransactionIndex::all`].
    pub(crate) fn collect(
        &self,
        path: &Path,
        fetch_offset: i64,
        upper_bound_offset: i64,
        out: &mut Vec<AbortedTxn>,
    ) -> Result<bool> {
        let mut complete = false;
        self.for_each(path, |_, t| {
            if t.last_offset >= fetch_offset && t.first_offset < upper_bound_offset {
                out.push(t);
            }
            if t.last_stable_offset >= upper_bound_offset {
                complete = true;
                return false;
            }
            true
        })?;
        Ok(complete)
    }

    /// Kafka's `TransactionIndex.truncateTo`: removes the entries whose marker is at or after
    /// `offset`.
    ///
    /// # Errors
    /// As [`TransactionIndex::all`].
    pub(crate) fn truncate_to(&self, path: &Path, offset: i64) -> Result<()> {
        let mut cut = None;
        let mut last = None;
        self.for_each(path, |pos, t| {
            if t.last_offset >= offset {
                cut = Some(pos);
                return false;
            }
            last = Some(t.last_offset);
            true
        })?;
        let Some(pos) = cut else {
            return Ok(());
        };
        let mut state = self.state.lock();
        let file = File::options()
            .write(true)
            .open(path)
            .map_err(|e| io("opening", path, e))?;
        file.set_len(pos).map_err(|e| io("truncating", path, e))?;
        state.len = pos;
        state.last_offset = last;
        state.unsynced = true;
        Ok(())
    }

    /// Removes every entry (Kafka's `reset`, before recovery rebuilds them): the file is
    /// deleted.
    ///
    /// # Errors
    /// [`LogError::Io`].
    pub(crate) fn reset(&self, path: &Path) -> Result<()> {
        let mut state = self.state.lock();
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("removing", path, e)),
        }
        *state = State {
            loaded: true,
            ..State::default()
        };
        Ok(())
    }

    /// Whether the index holds no entry (loading it if needed).
    ///
    /// # Errors
    /// As [`TransactionIndex::all`].
    #[cfg(test)]
    pub(crate) fn is_empty(&self, path: &Path) -> Result<bool> {
        let mut state = self.state.lock();
        self.load(&mut state, path)?;
        Ok(state.len == 0)
    }

    /// fsyncs the file if entries were written since the last sync.
    ///
    /// # Errors
    /// [`LogError::Io`].
    pub(crate) fn flush(&self, path: &Path) -> Result<()> {
        let mut state = self.state.lock();
        if !state.unsynced {
            return Ok(());
        }
        match File::open(path) {
            Ok(f) => f.sync_all().map_err(|e| io("syncing", path, e))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("opening", path, e)),
        }
        state.unsynced = false;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn txn(pid: i64, first: i64, last: i64, lso: i64) -> AbortedTxn {
        AbortedTxn {
            producer_id: pid,
            first_offset: first,
            last_offset: last,
            last_stable_offset: lso,
        }
    }

    proptest! {
        #[test]
        fn entries_round_trip(pid in any::<i64>(), first in any::<i64>(), last in any::<i64>(), lso in any::<i64>()) {
            let t = txn(pid, first, last, lso);
            let b = t.encode();
            prop_assert_eq!(b.len(), 34);
            prop_assert_eq!(&b[0..2], &[0u8, 0][..]);
            prop_assert_eq!(AbortedTxn::decode(&b).unwrap(), t);
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            let _ = AbortedTxn::decode(&bytes);
        }

        /// Whatever was appended is read back in order, and collect selects exactly the
        /// overlapping entries.
        #[test]
        fn index_file_round_trip(spans in proptest::collection::vec((0i64..50, 1i64..50), 1..40),
                                 fetch in 0i64..2000, width in 1i64..500) {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("00000000000000000000.txnindex");
            let idx = TransactionIndex::new();
            let mut expected = Vec::new();
            let mut last = 0i64;
            for (i, (gap, len)) in spans.iter().enumerate() {
                let first = last + gap;
                last = first + len;
                let t = txn(i as i64, first, last, last + 1);
                idx.append(&path, &t).unwrap();
                expected.push(t);
            }
            prop_assert_eq!(idx.all(&path).unwrap(), expected.clone());
            // A second reader of the file (a reopened log) reads the same.
            prop_assert_eq!(TransactionIndex::new().all(&path).unwrap(), expected.clone());
            let upper = fetch + width;
            let mut got = Vec::new();
            idx.collect(&path, fetch, upper, &mut got).unwrap();
            let mut want = Vec::new();
            for t in &expected {
                if t.last_offset >= fetch && t.first_offset < upper {
                    want.push(*t);
                }
                if t.last_stable_offset >= upper {
                    break;
                }
            }
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn out_of_order_append_torn_tail_truncate_and_reset() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("00000000000000000000.txnindex");
        let idx = TransactionIndex::new();
        assert!(idx.is_empty(&path).unwrap());
        idx.append(&path, &txn(1, 0, 5, 6)).unwrap();
        idx.append(&path, &txn(2, 3, 9, 10)).unwrap();
        assert!(idx.append(&path, &txn(3, 7, 9, 10)).is_err());
        // A torn third entry is cut when the file is opened again.
        let mut raw = std::fs::read(&path).unwrap();
        raw.extend_from_slice(&[0u8; 10]);
        std::fs::write(&path, &raw).unwrap();
        let reopened = TransactionIndex::new();
        assert_eq!(reopened.all(&path).unwrap().len(), 2);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 68);
        reopened.append(&path, &txn(3, 10, 12, 13)).unwrap();
        reopened.truncate_to(&path, 9).unwrap();
        assert_eq!(reopened.all(&path).unwrap(), vec![txn(1, 0, 5, 6)]);
        assert!(reopened.append(&path, &txn(4, 6, 5, 6)).is_err());
        reopened.append(&path, &txn(4, 6, 8, 9)).unwrap();
        reopened.reset(&path).unwrap();
        assert!(!path.exists());
        assert!(reopened.all(&path).unwrap().is_empty());
        // An entry of an unknown version is corruption.
        let mut bad = txn(1, 0, 1, 2).encode();
        bad[1] = 1;
        std::fs::write(&path, bad).unwrap();
        assert!(matches!(
            TransactionIndex::new().all(&path),
            Err(LogError::CorruptFile { .. })
        ));
    }
}
