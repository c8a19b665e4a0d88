//! KRaft snapshots on disk (KIP-630, Kafka's `FileRawSnapshotWriter`/`FileRawSnapshotReader`
//! and `Snapshots`): `<20-digit end offset>-<10-digit epoch>.checkpoint` in
//! `__cluster_metadata-0/`, written as `.checkpoint.part` and renamed when complete. A snapshot
//! is record batches with offsets from 0 and `partitionLeaderEpoch` = the snapshot's epoch: a
//! SnapshotHeader control batch, the batches of the image, a SnapshotFooter control batch.
//!
//! The snapshot id `(end offset, epoch)` says the snapshot holds everything below `end offset`,
//! whose last record has leader epoch `epoch`.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use gregor_protocol::batch::{self, Batches};
use gregor_protocol::metadata_records::log::{
    build_control_batch, decode_batch, BatchRecords, ControlRecord,
};
use kafka_protocol::messages::{SnapshotFooterRecord, SnapshotHeaderRecord};

use crate::batches::build_data_batch;
use crate::types::OffsetAndEpoch;

/// Suffix of a complete snapshot (`Snapshots.SUFFIX`).
pub const SNAPSHOT_SUFFIX: &str = ".checkpoint";
/// Suffix of a snapshot being written (`Snapshots.PARTIAL_SUFFIX`).
pub const PARTIAL_SUFFIX: &str = ".checkpoint.part";
/// Suffix of a snapshot waiting for deletion (`Snapshots.DELETE_SUFFIX`).
pub const DELETED_SUFFIX: &str = ".checkpoint.deleted";

/// Largest snapshot file gregor reads into memory (a sanity bound on a length read off disk;
/// Kafka's metadata images are far smaller).
pub const MAX_SNAPSHOT_BYTES: u64 = 1 << 30;

/// Errors of snapshot files.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
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
    /// A snapshot file that is not a well-formed snapshot.
    #[error("snapshot {path} is corrupt: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> SnapshotError {
    let path = path.to_path_buf();
    move |source| SnapshotError::Io { op, path, source }
}

/// `<20-digit end offset>-<10-digit epoch>.checkpoint`.
pub fn snapshot_file_name(id: OffsetAndEpoch) -> String {
    format!("{:020}-{:010}{SNAPSHOT_SUFFIX}", id.offset, id.epoch)
}

/// What a file name in the log directory says about a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotFileKind {
    /// A complete snapshot.
    Complete,
    /// One being written (a crash left it): deleted on open.
    Partial,
    /// One marked for deletion: deleted on open.
    Deleted,
}

/// Parses a snapshot file name (`Snapshots.parse`); `None` for any other file.
pub fn parse_snapshot_file_name(name: &str) -> Option<(OffsetAndEpoch, SnapshotFileKind)> {
    let (stem, kind) = if let Some(s) = name.strip_suffix(PARTIAL_SUFFIX) {
        (s, SnapshotFileKind::Partial)
    } else if let Some(s) = name.strip_suffix(DELETED_SUFFIX) {
        (s, SnapshotFileKind::Deleted)
    } else {
        (
            name.strip_suffix(SNAPSHOT_SUFFIX)?,
            SnapshotFileKind::Complete,
        )
    };
    let (offset, epoch) = stem.split_once('-')?;
    if offset.len() != 20 || epoch.len() != 10 {
        return None;
    }
    if !offset
        .bytes()
        .chain(epoch.bytes())
        .all(|b| b.is_ascii_digit())
    {
        return None;
    }
    Some((
        OffsetAndEpoch::new(offset.parse().ok()?, epoch.parse().ok()?),
        kind,
    ))
}

/// fsyncs a directory so that a rename in it is durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), SnapshotError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("syncing directory", dir))
}

/// Writes one snapshot: the header at creation, batches with [`SnapshotWriter::append`], the
/// footer and the rename at [`SnapshotWriter::freeze`]. Dropped unfrozen, the `.part` file is
/// left behind and removed when the log is next opened (as Kafka does).
#[derive(Debug)]
pub struct SnapshotWriter {
    id: OffsetAndEpoch,
    file: File,
    part_path: PathBuf,
    final_path: PathBuf,
    dir: PathBuf,
    next_offset: i64,
}

impl SnapshotWriter {
    /// Creates `<id>.checkpoint.part` in `dir` and writes the first control batch: the
    /// SnapshotHeader (version 0, `lastContainedLogTimestamp` = `last_contained_log_timestamp_ms`,
    /// the append time of the last record the snapshot covers) followed by `quorum_records`,
    /// the KRaftVersion and KRaftVoters control records in force at `id.offset` (KIP-853; empty
    /// for a static quorum, `kraft.version` 0), as Kafka's `RecordsSnapshotWriter` writes them.
    ///
    /// # Errors
    /// [`SnapshotError::Io`]; [`SnapshotError::Corrupt`] when the batch cannot be built.
    pub fn create(
        dir: &Path,
        id: OffsetAndEpoch,
        last_contained_log_timestamp_ms: i64,
        quorum_records: &[ControlRecord],
        now_ms: i64,
    ) -> Result<Self, SnapshotError> {
        let final_path = dir.join(snapshot_file_name(id));
        let part_path = dir.join(format!(
            "{:020}-{:010}{PARTIAL_SUFFIX}",
            id.offset, id.epoch
        ));
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&part_path)
            .map_err(io("creating", &part_path))?;
        let mut w = Self {
            id,
            file,
            part_path,
            final_path,
            dir: dir.to_path_buf(),
            next_offset: 0,
        };
        let mut first = vec![ControlRecord::SnapshotHeader(
            SnapshotHeaderRecord::default()
                .with_version(0)
                .with_last_contained_log_timestamp(last_contained_log_timestamp_ms),
        )];
        first.extend(quorum_records.iter().cloned());
        w.write_control(&first, now_ms)?;
        Ok(w)
    }

    /// The snapshot's id.
    pub fn id(&self) -> OffsetAndEpoch {
        self.id
    }

    fn write_control(
        &mut self,
        records: &[ControlRecord],
        now_ms: i64,
    ) -> Result<(), SnapshotError> {
        let b =
            build_control_batch(self.next_offset, self.id.epoch, now_ms, records).map_err(|e| {
                SnapshotError::Corrupt {
                    path: self.part_path.clone(),
                    reason: format!("building a control batch: {e}"),
                }
            })?;
        self.write_batch(&b)
    }

    fn write_batch(&mut self, b: &[u8]) -> Result<(), SnapshotError> {
        let h = batch::validate_batch(b).map_err(|e| SnapshotError::Corrupt {
            path: self.part_path.clone(),
            reason: e.to_string(),
        })?;
        self.file
            .write_all(b)
            .map_err(io("writing", &self.part_path))?;
        self.next_offset = h.next_offset();
        Ok(())
    }

    /// Appends one batch holding `values` (framed metadata records, opaque here) as records.
    ///
    /// # Errors
    /// [`SnapshotError::Io`].
    pub fn append(&mut self, values: &[Bytes], now_ms: i64) -> Result<(), SnapshotError> {
        if values.is_empty() {
            return Ok(());
        }
        let b = build_data_batch(self.next_offset, self.id.epoch, now_ms, values);
        self.write_batch(&b)
    }

    /// Writes the SnapshotFooter, fsyncs, renames the file to `.checkpoint` and fsyncs the
    /// directory (`FileRawSnapshotWriter.freeze`). Returns the final path.
    ///
    /// # Errors
    /// [`SnapshotError::Io`]; the `.part` file is then left for the next open to delete.
    pub fn freeze(mut self, now_ms: i64) -> Result<PathBuf, SnapshotError> {
        self.write_control(
            &[ControlRecord::SnapshotFooter(
                SnapshotFooterRecord::default().with_version(0),
            )],
            now_ms,
        )?;
        self.file
            .sync_all()
            .map_err(io("syncing", &self.part_path))?;
        std::fs::rename(&self.part_path, &self.final_path)
            .map_err(io("renaming into place", &self.final_path))?;
        sync_dir(&self.dir)?;
        Ok(self.final_path)
    }
}

/// A snapshot read back whole.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// Its id, from the file name.
    pub id: OffsetAndEpoch,
    /// `lastContainedLogTimestamp` of its SnapshotHeader (ms).
    pub last_contained_log_timestamp_ms: i64,
    /// Every batch between the header and the footer, whole (data batches and control batches
    /// such as KRaftVersion and KRaftVoters).
    pub batches: Vec<Bytes>,
    /// Size of the file in bytes.
    pub size_bytes: u64,
}

/// Reads and checks `path`: every batch CRC-valid and contiguous from offset 0, the first a
/// SnapshotHeader control batch, the last a SnapshotFooter, nothing after it.
///
/// # Errors
/// [`SnapshotError::Corrupt`] (naming the file) or [`SnapshotError::Io`].
pub fn read_snapshot(path: &Path) -> Result<Snapshot, SnapshotError> {
    let corrupt = |reason: String| SnapshotError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let Some((id, SnapshotFileKind::Complete)) = parse_snapshot_file_name(name) else {
        return Err(corrupt(
            "not a <offset>-<epoch>.checkpoint file name".into(),
        ));
    };
    let len = std::fs::metadata(path)
        .map_err(io("reading metadata of", path))?
        .len();
    if len > MAX_SNAPSHOT_BYTES {
        return Err(corrupt(format!(
            "{len} bytes, more than the {MAX_SNAPSHOT_BYTES} gregor reads"
        )));
    }
    let buf = Bytes::from(std::fs::read(path).map_err(io("reading", path))?);
    parse_snapshot(id, buf, path)
}

/// Checks the bytes of a whole snapshot `id` (as [`read_snapshot`] does a file): every batch
/// CRC-valid and contiguous from offset 0, a SnapshotHeader first, a SnapshotFooter last and
/// nothing after it. `path` only names the snapshot in errors.
///
/// # Errors
/// [`SnapshotError::Corrupt`].
pub fn parse_snapshot(
    id: OffsetAndEpoch,
    buf: Bytes,
    path: &Path,
) -> Result<Snapshot, SnapshotError> {
    let corrupt = |reason: String| SnapshotError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    let len = buf.len() as u64;
    let mut batches = Vec::new();
    let mut header_ts = None;
    let mut footer = false;
    let mut next = 0;
    let mut consumed = 0usize;
    for item in Batches::new(&buf) {
        let (at, h) = item.map_err(|e| corrupt(e.to_string()))?;
        let raw = buf.slice(at..at + h.total_size());
        consumed = at + h.total_size();
        batch::validate_batch(&raw).map_err(|e| corrupt(format!("batch at {at}: {e}")))?;
        if footer {
            return Err(corrupt(format!("batch at {at} after the SnapshotFooter")));
        }
        if h.base_offset != next {
            return Err(corrupt(format!(
                "batch at {at} has offset {}, expected {next}",
                h.base_offset
            )));
        }
        next = h.next_offset();
        let control = if h.is_control() {
            match decode_batch(&raw).map_err(|e| corrupt(format!("batch at {at}: {e}")))? {
                (_, BatchRecords::Control(records)) => records,
                (_, BatchRecords::Metadata(_)) => Vec::new(),
            }
        } else {
            Vec::new()
        };
        match (header_ts, control.first()) {
            (None, Some(ControlRecord::SnapshotHeader(hdr))) => {
                header_ts = Some(hdr.last_contained_log_timestamp);
            }
            (None, _) => return Err(corrupt("does not start with a SnapshotHeader".into())),
            (Some(_), Some(ControlRecord::SnapshotFooter(_))) => footer = true,
            (Some(_), _) => batches.push(raw),
        }
    }
    let Some(last_contained_log_timestamp_ms) = header_ts else {
        return Err(corrupt("empty".into()));
    };
    if !footer {
        return Err(corrupt("no SnapshotFooter (torn or unfinished)".into()));
    }
    if consumed != buf.len() {
        return Err(corrupt(format!(
            "{} bytes after the SnapshotFooter",
            buf.len() - consumed
        )));
    }
    Ok(Snapshot {
        id,
        last_contained_log_timestamp_ms,
        batches,
        size_bytes: len,
    })
}

/// Folds the KRaftVersion and KRaftVoters control records of the control batches in `buf`
/// (whole batches: a snapshot or a read of the log) into `state`: a later record of a kind
/// replaces an earlier one, so `state` ends as the records in force after `buf`, in Kafka's
/// order (KRaftVersion, then KRaftVoters). Data batches are skipped without being decoded.
/// Only batches with a base offset below `before` count.
///
/// # Errors
/// A description of the first batch that does not decode.
pub fn fold_quorum_records(
    buf: &[u8],
    before: i64,
    state: &mut QuorumRecords,
) -> Result<(), String> {
    for item in Batches::new(buf) {
        let (pos, header) = item.map_err(|e| e.to_string())?;
        if !header.is_control() || header.base_offset >= before {
            continue;
        }
        let end = pos.saturating_add(header.total_size()).min(buf.len());
        let (_, records) = decode_batch(&buf[pos..end]).map_err(|e| e.to_string())?;
        if let BatchRecords::Control(records) = records {
            for r in records {
                match r {
                    ControlRecord::KRaftVersion(_) => state.kraft_version = Some(r),
                    ControlRecord::KRaftVoters(_) => state.voters = Some(r),
                    _ => {}
                }
            }
        }
    }
    Ok(())
}

/// Largest first batch [`read_first_batch`] reads (bytes): a SnapshotHeader, a KRaftVersion and
/// a KRaftVoters record; a voter set of thousands of voters still fits.
const MAX_FIRST_BATCH_BYTES: usize = 1 << 20;

/// The first batch of the snapshot file at `path`, whole (its SnapshotHeader batch, where a
/// dynamic quorum's KRaftVersion and KRaftVoters records also are).
///
/// # Errors
/// [`SnapshotError::Io`]; [`SnapshotError::Corrupt`] for a short file or a batch length outside
/// `[61, 1 MiB]`.
pub fn read_first_batch(path: &Path) -> Result<Vec<u8>, SnapshotError> {
    use std::io::Read;
    let corrupt = |reason: String| SnapshotError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    let mut f = File::open(path).map_err(io("opening", path))?;
    // baseOffset (8 bytes), then batchLength (4): the bytes that follow the length field.
    let mut head = [0u8; 12];
    f.read_exact(&mut head)
        .map_err(|e| corrupt(format!("reading the first batch header: {e}")))?;
    let length = i32::from_be_bytes([head[8], head[9], head[10], head[11]]);
    let total = usize::try_from(length)
        .ok()
        .and_then(|l| l.checked_add(12))
        .filter(|t| (batch::BATCH_HEADER_LEN..=MAX_FIRST_BATCH_BYTES).contains(t))
        .ok_or_else(|| corrupt(format!("first batch length {length} is out of bounds")))?;
    let mut buf = vec![0u8; total];
    buf[..12].copy_from_slice(&head);
    f.read_exact(&mut buf[12..])
        .map_err(|e| corrupt(format!("reading the first batch: {e}")))?;
    Ok(buf)
}

/// The KRaftVersion and KRaftVoters control records in force at some offset of the metadata
/// log (KIP-853). Both absent for a static quorum (`kraft.version` 0).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QuorumRecords {
    /// The latest KRaftVersion record.
    pub kraft_version: Option<ControlRecord>,
    /// The latest KRaftVoters record.
    pub voters: Option<ControlRecord>,
}

impl QuorumRecords {
    /// The records, KRaftVersion first, as a snapshot's first batch carries them.
    pub fn records(&self) -> Vec<ControlRecord> {
        self.kraft_version
            .iter()
            .chain(self.voters.iter())
            .cloned()
            .collect()
    }
}

/// Most records put in one data batch of a snapshot by [`encode_snapshot`].
pub const SNAPSHOT_RECORDS_PER_BATCH: usize = 512;

/// The bytes of snapshot `id` holding `values` as records (in batches of at most
/// [`SNAPSHOT_RECORDS_PER_BATCH`]), framed as [`SnapshotWriter`] frames a file: SnapshotHeader,
/// data batches with `partitionLeaderEpoch` = `id.epoch`, SnapshotFooter. What an in-memory log
/// stores and serves.
///
/// # Errors
/// [`SnapshotError::Corrupt`] if a control batch cannot be built.
pub fn encode_snapshot(
    id: OffsetAndEpoch,
    last_contained_log_timestamp_ms: i64,
    values: &[Bytes],
    now_ms: i64,
) -> Result<Bytes, SnapshotError> {
    let corrupt = |e: String| SnapshotError::Corrupt {
        path: PathBuf::from(snapshot_file_name(id)),
        reason: format!("building a control batch: {e}"),
    };
    let mut out = Vec::new();
    let header = ControlRecord::SnapshotHeader(
        SnapshotHeaderRecord::default()
            .with_version(0)
            .with_last_contained_log_timestamp(last_contained_log_timestamp_ms),
    );
    let b =
        build_control_batch(0, id.epoch, now_ms, &[header]).map_err(|e| corrupt(e.to_string()))?;
    out.extend_from_slice(&b);
    let mut next: i64 = 1;
    for chunk in values.chunks(SNAPSHOT_RECORDS_PER_BATCH) {
        let b = build_data_batch(next, id.epoch, now_ms, chunk);
        out.extend_from_slice(&b);
        next += chunk.len() as i64;
    }
    let footer = ControlRecord::SnapshotFooter(SnapshotFooterRecord::default().with_version(0));
    let b = build_control_batch(next, id.epoch, now_ms, &[footer])
        .map_err(|e| corrupt(e.to_string()))?;
    out.extend_from_slice(&b);
    Ok(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_kafkas() {
        let id = OffsetAndEpoch::new(89, 1);
        assert_eq!(
            snapshot_file_name(id),
            "00000000000000000089-0000000001.checkpoint"
        );
        assert_eq!(
            parse_snapshot_file_name("00000000000000000089-0000000001.checkpoint"),
            Some((id, SnapshotFileKind::Complete))
        );
        assert_eq!(
            parse_snapshot_file_name("00000000000000000089-0000000001.checkpoint.part"),
            Some((id, SnapshotFileKind::Partial))
        );
        assert_eq!(parse_snapshot_file_name("00000000000000000089.log"), None);
        assert_eq!(parse_snapshot_file_name("0089-0001.checkpoint"), None);
    }

    #[test]
    fn write_then_read_and_reject_torn() {
        let dir = tempfile::tempdir().unwrap();
        let id = OffsetAndEpoch::new(10, 3);
        let mut w = SnapshotWriter::create(dir.path(), id, 77, &[], 100).unwrap();
        w.append(&[Bytes::from("a"), Bytes::from("b")], 100)
            .unwrap();
        w.append(&[Bytes::from("c")], 100).unwrap();
        assert!(dir
            .path()
            .join("00000000000000000010-0000000003.checkpoint.part")
            .exists());
        let path = w.freeze(101).unwrap();
        let s = read_snapshot(&path).unwrap();
        assert_eq!(s.id, id);
        assert_eq!(s.last_contained_log_timestamp_ms, 77);
        assert_eq!(s.batches.len(), 2);
        for b in &s.batches {
            assert_eq!(batch::validate_batch(b).unwrap().partition_leader_epoch, 3);
        }
        // Torn at every byte: never read as a snapshot.
        let bytes = std::fs::read(&path).unwrap();
        for cut in 0..bytes.len() {
            std::fs::write(&path, &bytes[..cut]).unwrap();
            assert!(read_snapshot(&path).is_err(), "cut at {cut}");
        }
    }
}
