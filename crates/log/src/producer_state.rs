//! Idempotent-producer state (Kafka's `ProducerStateManager`, KIP-98): per producer id the
//! epoch and the last five batches' sequence and offset ranges, used to reject gaps and stale
//! epochs and to answer retried batches with their original offsets.
//!
//! # Snapshot files
//!
//! `<20-digit offset>.snapshot` holds the state as of that offset (exclusive), in Kafka's own
//! format (`ProducerStateManager.writeSnapshot`, version 1), so Kafka can read gregor's snapshots
//! and vice versa. All integers big-endian:
//!
//! ```text
//! version i16 (= 1) | crc u32 (CRC-32C of every byte after this field) | count i32 |
//! count x { producer_id i64 | epoch i16 | last_sequence i32 | last_offset i64 |
//!           offset_delta i32 | timestamp i64 | coordinator_epoch i32 |
//!           current_txn_first_offset i64 }
//! ```
//!
//! Like Kafka, a snapshot keeps only the last batch of each producer; batches after the snapshot
//! are replayed from the log's batch headers on load, which restores up to five per producer.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};

use gregor_protocol::batch::{BatchHeader, NO_PRODUCER_EPOCH};

use crate::checkpoint::write_atomically;
use crate::error::{LogError, Result};
use crate::segment::file_name;

/// Batches remembered per producer for duplicate detection (Kafka's
/// `NUM_BATCHES_TO_RETAIN`, matching `max.in.flight.requests.per.connection` <= 5).
pub(crate) const NUM_BATCHES_TO_RETAIN: usize = 5;

const SNAPSHOT_VERSION: i16 = 1;
const SNAPSHOT_ENTRY_BYTES: usize = 46;

/// One appended batch of a producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BatchMetadata {
    pub first_seq: i32,
    pub last_seq: i32,
    pub first_offset: i64,
    pub last_offset: i64,
    pub timestamp_ms: i64,
}

/// State of one producer id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProducerEntry {
    pub producer_epoch: i16,
    pub batches: VecDeque<BatchMetadata>,
    pub coordinator_epoch: i32,
    pub current_txn_first_offset: i64,
}

impl ProducerEntry {
    fn empty() -> Self {
        Self {
            producer_epoch: NO_PRODUCER_EPOCH,
            batches: VecDeque::new(),
            coordinator_epoch: -1,
            current_txn_first_offset: -1,
        }
    }

    fn last_seq(&self) -> i32 {
        self.batches.back().map_or(-1, |b| b.last_seq)
    }

    fn push(&mut self, b: BatchMetadata) {
        if self.batches.len() == NUM_BATCHES_TO_RETAIN {
            self.batches.pop_front();
        }
        self.batches.push_back(b);
    }

    /// Applies a batch without checks (log replay, or after validation).
    fn apply(&mut self, h: &BatchHeader) {
        if h.producer_epoch != self.producer_epoch {
            self.batches.clear();
            self.producer_epoch = h.producer_epoch;
        }
        if h.is_control() {
            self.current_txn_first_offset = -1;
            return;
        }
        if h.is_transactional() && self.current_txn_first_offset < 0 {
            self.current_txn_first_offset = h.base_offset;
        }
        self.push(BatchMetadata {
            first_seq: h.base_sequence,
            last_seq: h.last_sequence(),
            first_offset: h.base_offset,
            last_offset: h.last_offset(),
            timestamp_ms: h.max_timestamp,
        });
    }
}

fn next_sequence(last_seq: i32) -> i32 {
    if last_seq == i32::MAX {
        0
    } else {
        last_seq + 1
    }
}

/// Producer state of one partition.
pub(crate) struct ProducerStateManager {
    dir: PathBuf,
    producers: HashMap<i64, ProducerEntry>,
}

/// Result of checking an append against producer state.
pub(crate) enum ProducerCheck {
    /// A retry of a batch already in the log.
    Duplicate(BatchMetadata),
    /// Valid: the entries to install once the batches are written.
    Valid(HashMap<i64, ProducerEntry>),
}

impl ProducerStateManager {
    pub(crate) fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
            producers: HashMap::new(),
        }
    }

    /// Number of known producers.
    pub(crate) fn len(&self) -> usize {
        self.producers.len()
    }

    /// Checks client batches (with offsets already assigned in `headers`) as Kafka's
    /// `ProducerAppendInfo` does: a retried batch (same producer, epoch and sequence range as
    /// one of the last five) is a duplicate; an older epoch is `InvalidProducerEpoch`; a new
    /// epoch must start at sequence 0 and a known producer continue at last + 1 (wrapping at
    /// `i32::MAX`), else `OutOfOrderSequence`. A producer with no state here may start at any
    /// sequence, as in Kafka.
    pub(crate) fn check_client_batches(&self, headers: &[BatchHeader]) -> Result<ProducerCheck> {
        for h in headers.iter().filter(|h| h.has_producer_id()) {
            if let Some(e) = self.producers.get(&h.producer_id) {
                if e.producer_epoch == h.producer_epoch {
                    if let Some(b) = e
                        .batches
                        .iter()
                        .find(|b| b.first_seq == h.base_sequence && b.last_seq == h.last_sequence())
                    {
                        return Ok(ProducerCheck::Duplicate(*b));
                    }
                }
            }
        }
        let mut updated: HashMap<i64, ProducerEntry> = HashMap::new();
        for h in headers.iter().filter(|h| h.has_producer_id()) {
            let entry = updated.entry(h.producer_id).or_insert_with(|| {
                self.producers
                    .get(&h.producer_id)
                    .cloned()
                    .unwrap_or_else(ProducerEntry::empty)
            });
            if h.producer_epoch < entry.producer_epoch {
                return Err(LogError::InvalidProducerEpoch {
                    producer_id: h.producer_id,
                    producer_epoch: h.producer_epoch,
                    current_epoch: entry.producer_epoch,
                });
            }
            // Kafka's `ProducerAppendInfo.checkSequence`: a new epoch starts at 0, except for a
            // producer with no state here (new, or whose batches were all removed by retention
            // or DeleteRecords), which may start anywhere.
            let unknown = entry.producer_epoch == NO_PRODUCER_EPOCH;
            let expected = if h.producer_epoch != entry.producer_epoch {
                0
            } else {
                next_sequence(entry.last_seq())
            };
            if !unknown && h.base_sequence != expected {
                return Err(LogError::OutOfOrderSequence {
                    producer_id: h.producer_id,
                    producer_epoch: h.producer_epoch,
                    first_sequence: h.base_sequence,
                    expected_sequence: expected,
                });
            }
            entry.apply(h);
        }
        Ok(ProducerCheck::Valid(updated))
    }

    /// Installs entries produced by [`ProducerStateManager::check_client_batches`].
    pub(crate) fn commit(&mut self, updated: HashMap<i64, ProducerEntry>) {
        self.producers.extend(updated);
    }

    /// Applies a batch read back from the log (no checks).
    pub(crate) fn replay(&mut self, h: &BatchHeader) {
        if h.has_producer_id() {
            self.producers
                .entry(h.producer_id)
                .or_insert_with(ProducerEntry::empty)
                .apply(h);
        }
    }

    /// Drops every producer (before a full rebuild).
    /// Forgets producers whose last batch timestamp is `expiration_ms` or more before
    /// `now_ms` and that have no open transaction (Kafka's `isProducerExpired`). Returns how
    /// many were removed.
    pub(crate) fn remove_expired(&mut self, now_ms: i64, expiration_ms: i64) -> usize {
        let before = self.producers.len();
        self.producers.retain(|_, e| {
            let last_ts = e.batches.back().map_or(-1, |b| b.timestamp_ms);
            e.current_txn_first_offset >= 0 || now_ms.saturating_sub(last_ts) < expiration_ms
        });
        before - self.producers.len()
    }

    /// Last offset of the newest batch of each producer that has one.
    pub(crate) fn last_data_offsets(&self) -> HashMap<i64, i64> {
        self.producers
            .iter()
            .filter_map(|(pid, e)| e.batches.back().map(|b| (*pid, b.last_offset)))
            .collect()
    }

    pub(crate) fn clear(&mut self) {
        self.producers.clear();
    }

    /// Snapshot offsets present in the directory, ascending.
    pub(crate) fn list_snapshots(&self) -> Result<Vec<i64>> {
        let mut out = Vec::new();
        let rd = std::fs::read_dir(&self.dir).map_err(|e| LogError::io("listing", &self.dir, e))?;
        for entry in rd {
            let entry = entry.map_err(|e| LogError::io("listing", &self.dir, e))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if let Some(stem) = name.strip_suffix(".snapshot") {
                if stem.len() == 20 {
                    if let Ok(o) = stem.parse::<i64>() {
                        out.push(o);
                    }
                }
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    fn snapshot_path(&self, offset: i64) -> PathBuf {
        self.dir.join(file_name(offset, "snapshot"))
    }

    /// Deletes the snapshot at `offset` (missing is fine).
    pub(crate) fn delete_snapshot(&self, offset: i64) -> Result<()> {
        let p = self.snapshot_path(offset);
        match std::fs::remove_file(&p) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(LogError::io("deleting", &p, e)),
        }
    }

    /// Writes `<offset>.snapshot` and keeps only the newest three snapshots.
    pub(crate) fn take_snapshot(&self, offset: i64, sync: bool) -> Result<()> {
        let mut body = Vec::with_capacity(4 + self.producers.len() * SNAPSHOT_ENTRY_BYTES);
        let mut ids: Vec<_> = self.producers.keys().copied().collect();
        ids.sort_unstable();
        body.extend_from_slice(&(ids.len() as i32).to_be_bytes());
        for pid in ids {
            let e = &self.producers[&pid];
            let last = e.batches.back().copied().unwrap_or(BatchMetadata {
                first_seq: -1,
                last_seq: -1,
                first_offset: -1,
                last_offset: -1,
                timestamp_ms: -1,
            });
            body.extend_from_slice(&pid.to_be_bytes());
            body.extend_from_slice(&e.producer_epoch.to_be_bytes());
            body.extend_from_slice(&last.last_seq.to_be_bytes());
            body.extend_from_slice(&last.last_offset.to_be_bytes());
            let offset_delta = (last.last_offset - last.first_offset) as i32;
            body.extend_from_slice(&offset_delta.to_be_bytes());
            body.extend_from_slice(&last.timestamp_ms.to_be_bytes());
            body.extend_from_slice(&e.coordinator_epoch.to_be_bytes());
            body.extend_from_slice(&e.current_txn_first_offset.to_be_bytes());
        }
        let mut file = Vec::with_capacity(6 + body.len());
        file.extend_from_slice(&SNAPSHOT_VERSION.to_be_bytes());
        file.extend_from_slice(&crc32c::crc32c(&body).to_be_bytes());
        file.extend_from_slice(&body);
        write_atomically(&self.snapshot_path(offset), &file, sync)?;
        let snaps = self.list_snapshots()?;
        if snaps.len() > 3 {
            for o in &snaps[..snaps.len() - 3] {
                self.delete_snapshot(*o)?;
            }
        }
        Ok(())
    }

    /// Replaces the state with the snapshot at `offset`.
    ///
    /// # Errors
    /// [`LogError::CorruptFile`] for a bad version, length or CRC (the caller deletes the file
    /// and falls back to an older snapshot or a full replay).
    pub(crate) fn load_snapshot(&mut self, offset: i64) -> Result<()> {
        let path = self.snapshot_path(offset);
        let raw = std::fs::read(&path).map_err(|e| LogError::io("reading", &path, e))?;
        let corrupt = |reason: &str| LogError::CorruptFile {
            path: path.display().to_string(),
            reason: reason.to_string(),
        };
        if raw.len() < 10 {
            return Err(corrupt("shorter than the snapshot header"));
        }
        let version = i16::from_be_bytes([raw[0], raw[1]]);
        if version != SNAPSHOT_VERSION {
            return Err(corrupt("unsupported snapshot version"));
        }
        let crc = u32::from_be_bytes([raw[2], raw[3], raw[4], raw[5]]);
        if crc32c::crc32c(&raw[6..]) != crc {
            return Err(corrupt("CRC mismatch"));
        }
        let count = i32::from_be_bytes([raw[6], raw[7], raw[8], raw[9]]);
        let entries = &raw[10..];
        if count < 0 || entries.len() != count as usize * SNAPSHOT_ENTRY_BYTES {
            return Err(corrupt("entry count does not match the file length"));
        }
        let mut producers = HashMap::with_capacity(count as usize);
        for e in entries.chunks_exact(SNAPSHOT_ENTRY_BYTES) {
            let i64_at = |at: usize| {
                let mut a = [0u8; 8];
                a.copy_from_slice(&e[at..at + 8]);
                i64::from_be_bytes(a)
            };
            let i32_at = |at: usize| i32::from_be_bytes([e[at], e[at + 1], e[at + 2], e[at + 3]]);
            let pid = i64_at(0);
            let epoch = i16::from_be_bytes([e[8], e[9]]);
            let last_seq = i32_at(10);
            let last_offset = i64_at(14);
            let offset_delta = i32_at(22);
            let timestamp_ms = i64_at(26);
            let mut entry = ProducerEntry {
                producer_epoch: epoch,
                batches: VecDeque::new(),
                coordinator_epoch: i32_at(34),
                current_txn_first_offset: i64_at(38),
            };
            if last_offset >= 0 {
                let first_seq = i64::from(last_seq) - i64::from(offset_delta);
                let first_seq = if first_seq < 0 {
                    (first_seq + i64::from(i32::MAX) + 1) as i32
                } else {
                    first_seq as i32
                };
                entry.batches.push_back(BatchMetadata {
                    first_seq,
                    last_seq,
                    first_offset: last_offset - i64::from(offset_delta),
                    last_offset,
                    timestamp_ms,
                });
            }
            producers.insert(pid, entry);
        }
        self.producers = producers;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gregor_protocol::batch::{set_base_offset, validate_batch, BatchBuilder};

    fn header(pid: i64, epoch: i16, seq: i32, n: usize, base_offset: i64) -> BatchHeader {
        let mut b = BatchBuilder::new(0, 1).producer(pid, epoch, seq);
        for _ in 0..n {
            b = b.record(1, None, Some(b"v"), &[]);
        }
        let mut v = b.build();
        set_base_offset(&mut v, base_offset);
        validate_batch(&v).unwrap()
    }

    fn append(m: &mut ProducerStateManager, h: BatchHeader) -> Result<Option<BatchMetadata>> {
        match m.check_client_batches(&[h])? {
            ProducerCheck::Duplicate(b) => Ok(Some(b)),
            ProducerCheck::Valid(u) => {
                m.commit(u);
                Ok(None)
            }
        }
    }

    #[test]
    fn sequences_epochs_duplicates() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = ProducerStateManager::new(dir.path());
        // A producer with no state may start at any sequence (Kafka's checkSequence).
        assert_eq!(append(&mut m, header(2, 0, 5, 1, 0)).unwrap(), None);
        assert!(matches!(
            append(&mut m, header(2, 0, 7, 1, 1)),
            Err(LogError::OutOfOrderSequence {
                expected_sequence: 6,
                ..
            })
        ));
        assert_eq!(append(&mut m, header(1, 0, 0, 3, 0)).unwrap(), None);
        assert_eq!(append(&mut m, header(1, 0, 3, 2, 3)).unwrap(), None);
        let dup = append(&mut m, header(1, 0, 0, 3, 99)).unwrap().unwrap();
        assert_eq!((dup.first_offset, dup.last_offset), (0, 2));
        assert!(matches!(
            append(&mut m, header(1, 0, 6, 1, 5)),
            Err(LogError::OutOfOrderSequence {
                expected_sequence: 5,
                ..
            })
        ));
        // New epoch must start at 0; then the old one is fenced.
        assert!(append(&mut m, header(1, 1, 5, 1, 5)).is_err());
        assert_eq!(append(&mut m, header(1, 1, 0, 1, 5)).unwrap(), None);
        assert!(matches!(
            append(&mut m, header(1, 0, 5, 1, 6)),
            Err(LogError::InvalidProducerEpoch {
                current_epoch: 1,
                ..
            })
        ));
        // Only the last five batches are remembered.
        for i in 1..=5 {
            append(&mut m, header(1, 1, i, 1, 5 + i64::from(i))).unwrap();
        }
        assert!(append(&mut m, header(1, 1, 0, 1, 0)).is_err());
        assert!(append(&mut m, header(1, 1, 1, 1, 0)).unwrap().is_some());
    }

    #[test]
    fn sequence_wraps_at_max() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = ProducerStateManager::new(dir.path());
        m.replay(&header(2, 0, i32::MAX - 1, 2, 0));
        assert_eq!(append(&mut m, header(2, 0, 0, 1, 2)).unwrap(), None);
    }

    #[test]
    fn snapshot_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = ProducerStateManager::new(dir.path());
        append(&mut m, header(1, 0, 0, 3, 0)).unwrap();
        append(&mut m, header(2, 4, 0, 2, 3)).unwrap();
        m.take_snapshot(5, true).unwrap();
        let mut n = ProducerStateManager::new(dir.path());
        assert_eq!(n.list_snapshots().unwrap(), vec![5]);
        n.load_snapshot(5).unwrap();
        assert_eq!(n.len(), 2);
        let dup = append(&mut n, header(2, 4, 0, 2, 9)).unwrap().unwrap();
        assert_eq!((dup.first_offset, dup.last_offset), (3, 4));
        assert!(append(&mut n, header(1, 0, 3, 1, 5)).unwrap().is_none());
        // Corruption is detected.
        let p = dir.path().join(file_name(5, "snapshot"));
        let mut raw = std::fs::read(&p).unwrap();
        raw[12] ^= 1;
        std::fs::write(&p, raw).unwrap();
        assert!(n.load_snapshot(5).is_err());
    }
}
