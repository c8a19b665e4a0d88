//! The leader epoch cache (Kafka's `LeaderEpochFileCache`, KIP-101/KIP-279): the first offset
//! each leader epoch wrote, persisted in `leader-epoch-checkpoint` as
//! `0\n<count>\n<epoch> <start offset>\n...`.
//!
//! The checkpoint is written atomically (temporary file, `fsync`, rename) only when it must be
//! durable at once. Otherwise (a new leader's epoch, a truncation) it is overwritten in place
//! without `fsync` ([`write_in_place`]), and a flush syncs it before the recovery point passes
//! records of its epochs. A crash during such a write can leave a torn file:
//! [`LeaderEpochCache::load`] detects one (version and count lines, exactly `count`
//! well-formed entries, each line ended by a newline, epochs strictly increasing, start offsets
//! not decreasing) and the log rebuilds the entries from its batches' partition leader epochs
//! ([`LeaderEpochCache::rebuild_start`]).

use std::path::{Path, PathBuf};

use crate::checkpoint::{parse_checkpoint, write_atomically, write_in_place};
use crate::error::{LogError, Result};

/// File name of the checkpoint inside a partition directory.
pub(crate) const LEADER_EPOCH_CHECKPOINT: &str = "leader-epoch-checkpoint";

/// One leader epoch and the first offset appended in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochEntry {
    /// The leader epoch.
    pub epoch: i32,
    /// First offset written by a leader in this epoch.
    pub start_offset: i64,
}

pub(crate) struct LeaderEpochCache {
    path: PathBuf,
    entries: Vec<EpochEntry>,
    /// The checkpoint was rewritten without `fsync` ([`LeaderEpochCache::assign_deferred`],
    /// [`LeaderEpochCache::truncate_from_end`]); [`LeaderEpochCache::sync`] makes it durable.
    dirty: bool,
    /// Entries were assigned that the file does not hold yet
    /// ([`LeaderEpochCache::assign_deferred`]).
    unwritten: bool,
    /// Why the checkpoint found at load could not be used (torn or corrupt); the entries are
    /// empty and must be rebuilt from the log's batches.
    unusable: Option<String>,
}

impl LeaderEpochCache {
    /// Loads `dir/leader-epoch-checkpoint` (empty if missing). A file that is torn or corrupt
    /// (see the module) loads as empty and [`LeaderEpochCache::unusable`] says why: the caller
    /// rebuilds the entries from the log.
    ///
    /// # Errors
    /// [`LogError::Io`] if the file exists but cannot be read.
    pub(crate) fn load(dir: &Path) -> Result<Self> {
        let path = dir.join(LEADER_EPOCH_CHECKPOINT);
        let (entries, unusable) = match std::fs::read(&path) {
            Ok(bytes) => match parse_entries(&path, &bytes) {
                Ok(entries) => (entries, None),
                Err(reason) => (Vec::new(), Some(reason)),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (Vec::new(), None),
            Err(e) => return Err(LogError::io("reading", &path, e)),
        };
        Ok(Self {
            path,
            entries,
            dirty: false,
            unwritten: false,
            unusable,
        })
    }

    /// Why the checkpoint found at load was unusable, until [`LeaderEpochCache::rebuild_start`].
    pub(crate) fn unusable(&self) -> Option<&str> {
        self.unusable.as_deref()
    }

    /// Starts rebuilding an unusable checkpoint: the entries are dropped (the caller assigns
    /// every batch's partition leader epoch, oldest first, with [`LeaderEpochCache::assign`]
    /// and then persists the cache).
    pub(crate) fn rebuild_start(&mut self) {
        self.entries.clear();
        self.unusable = None;
    }

    fn write(&mut self) -> Result<()> {
        self.write_with(true)
    }

    fn write_with(&mut self, sync: bool) -> Result<()> {
        use std::fmt::Write as _;
        let mut s = format!("0\n{}\n", self.entries.len());
        for e in &self.entries {
            let _ = writeln!(s, "{} {}", e.epoch, e.start_offset);
        }
        if sync {
            write_atomically(&self.path, s.as_bytes(), true)?;
        } else {
            write_in_place(&self.path, s.as_bytes())?;
        }
        self.dirty = !sync;
        self.unwritten = false;
        Ok(())
    }

    /// Whether the checkpoint is not durable: assigned entries not yet written, or written
    /// without `fsync` since the last sync.
    pub(crate) fn is_dirty(&self) -> bool {
        self.dirty || self.unwritten
    }

    /// Whether entries were assigned that the file does not hold yet.
    pub(crate) fn is_unwritten(&self) -> bool {
        self.unwritten
    }

    /// Writes entries [`LeaderEpochCache::assign_deferred`] added, without `fsync`.
    ///
    /// # Errors
    /// [`LogError::Io`] (the entries stay, to be written by the next sync).
    pub(crate) fn write_pending(&mut self) -> Result<()> {
        if self.unwritten {
            self.write_with(false)?;
        }
        Ok(())
    }

    /// fsyncs the checkpoint and its directory if it was rewritten without.
    ///
    /// # Errors
    /// [`LogError::Io`] (it stays dirty).
    pub(crate) fn sync(&mut self) -> Result<()> {
        if self.unwritten {
            return self.write_with(true);
        }
        if !self.dirty {
            return Ok(());
        }
        std::fs::File::open(&self.path)
            .and_then(|f| f.sync_all())
            .map_err(|e| LogError::io("syncing", &self.path, e))?;
        if let Some(dir) = self.path.parent() {
            crate::checkpoint::sync_dir(dir)?;
        }
        self.dirty = false;
        Ok(())
    }

    /// [`LeaderEpochCache::assign`] in memory only: the caller writes the checkpoint later
    /// ([`LeaderEpochCache::write_pending`]; a leader elected for many partitions at once
    /// writes all their checkpoints in parallel), and a flush syncs it
    /// ([`LeaderEpochCache::sync`]) before it advances the recovery point.
    pub(crate) fn assign_deferred(&mut self, epoch: i32, start_offset: i64) -> bool {
        if epoch < 0 || self.latest_epoch().is_some_and(|l| l >= epoch) {
            return false;
        }
        self.replace_empty_epochs(start_offset);
        self.entries.push(EpochEntry {
            epoch,
            start_offset,
        });
        self.unwritten = true;
        true
    }

    /// The newest epoch.
    pub(crate) fn latest_epoch(&self) -> Option<i32> {
        self.entries.last().map(|e| e.epoch)
    }

    /// All entries, oldest first.
    pub(crate) fn entries(&self) -> &[EpochEntry] {
        &self.entries
    }

    /// Records that `epoch` starts at `start_offset` if it is newer than the latest epoch
    /// (Kafka's `assign`). With `persist` the checkpoint is rewritten.
    pub(crate) fn assign(&mut self, epoch: i32, start_offset: i64, persist: bool) -> Result<bool> {
        if epoch < 0 || self.latest_epoch().is_some_and(|l| l >= epoch) {
            return Ok(false);
        }
        let replaced = self.replace_empty_epochs(start_offset);
        self.entries.push(EpochEntry {
            epoch,
            start_offset,
        });
        if persist {
            if let Err(e) = self.write() {
                // Not on disk, so not in memory either: the next append persists it again
                // (a full disk refuses the checkpoint until space is free).
                self.entries.pop();
                self.entries.extend(replaced);
                return Err(e);
            }
        }
        Ok(true)
    }

    /// Removes the newest entries that start at or after `start_offset`, where a newer epoch
    /// is about to start: epochs in which no record was written (a leader elected again before
    /// anything was appended, every restart of an idle partition). Kafka's `assign` does the
    /// same (`maybeTruncateNonMonotonicEntries`), so OffsetForLeaderEpoch for such an epoch
    /// answers with the epoch before it, as Kafka's does, and the checkpoint does not grow by
    /// one line per election. Returns the removed entries, oldest first.
    fn replace_empty_epochs(&mut self, start_offset: i64) -> Vec<EpochEntry> {
        let keep = self
            .entries
            .iter()
            .rposition(|e| e.start_offset < start_offset)
            .map_or(0, |i| i + 1);
        self.entries.split_off(keep)
    }

    /// Drops epochs starting at or after `end_offset` (the log was truncated there). The
    /// checkpoint is rewritten without `fsync` (Kafka's `truncateFromEndAsyncFlush`): if a
    /// crash loses the rewrite, the stale entries start at or after the log end and are
    /// dropped again when the log loads.
    pub(crate) fn truncate_from_end(&mut self, end_offset: i64) -> Result<()> {
        let before = self.entries.len();
        self.entries.retain(|e| e.start_offset < end_offset);
        if self.entries.len() != before {
            self.write_with(false)?;
        }
        Ok(())
    }

    /// Drops every epoch and rewrites the checkpoint (Kafka's `clearAndFlush`).
    pub(crate) fn clear(&mut self) -> Result<()> {
        self.entries.clear();
        self.write()
    }

    /// Rewrites the checkpoint, with `fsync` when `sync`.
    pub(crate) fn persist(&mut self, sync: bool) -> Result<()> {
        self.write_with(sync)
    }

    /// Kafka's `endOffsetFor` (OffsetForLeaderEpoch): the largest epoch `<= requested` and the
    /// start offset of the first epoch after it (`log_end_offset` when `requested` is the
    /// latest); `(-1, -1)` when `requested` is unknown or newer than every epoch.
    pub(crate) fn end_offset_for(&self, requested: i32, log_end_offset: i64) -> (i32, i64) {
        if requested < 0 {
            return (-1, -1);
        }
        if self.latest_epoch() == Some(requested) {
            return (requested, log_end_offset);
        }
        let Some(higher) = self.entries.iter().find(|e| e.epoch > requested) else {
            return (-1, -1);
        };
        match self.entries.iter().rev().find(|e| e.epoch <= requested) {
            Some(floor) => (floor.epoch, higher.start_offset),
            None => (requested, higher.start_offset),
        }
    }
}

/// Parses and checks the checkpoint's bytes; `Err` says why the file is unusable.
fn parse_entries(path: &Path, bytes: &[u8]) -> std::result::Result<Vec<EpochEntry>, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "not text (torn or corrupt)".to_string())?;
    // Every line Kafka or gregor writes ends with a newline: a file cut inside its last line
    // could otherwise pass for one with a smaller start offset.
    if !text.ends_with('\n') {
        return Err("the last line has no newline (cut short)".into());
    }
    let entries = parse_checkpoint(path, text, 0, |f| match f {
        [e, o] => Some(EpochEntry {
            epoch: e.parse().ok()?,
            start_offset: o.parse().ok()?,
        }),
        _ => None,
    })
    .map_err(|e| match e {
        LogError::CorruptFile { reason, .. } => reason,
        other => other.to_string(),
    })?;
    for pair in entries.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if b.epoch <= a.epoch || b.start_offset < a.start_offset {
            return Err(format!(
                "entries out of order: epoch {} at {} then epoch {} at {}",
                a.epoch, a.start_offset, b.epoch, b.start_offset
            ));
        }
    }
    if let Some(bad) = entries.iter().find(|e| e.epoch < 0 || e.start_offset < 0) {
        return Err(format!(
            "negative entry: epoch {} at {}",
            bad.epoch, bad.start_offset
        ));
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_round_trip_and_truncate() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = LeaderEpochCache::load(dir.path()).unwrap();
        assert!(c.assign(0, 0, true).unwrap());
        assert!(!c.assign(0, 5, true).unwrap());
        assert!(c.assign(3, 10, true).unwrap());
        let text = std::fs::read_to_string(dir.path().join(LEADER_EPOCH_CHECKPOINT)).unwrap();
        assert_eq!(text, "0\n2\n0 0\n3 10\n");
        let mut c = LeaderEpochCache::load(dir.path()).unwrap();
        assert_eq!(c.latest_epoch(), Some(3));
        assert_eq!(c.end_offset_for(0, 20), (0, 10));
        assert_eq!(c.end_offset_for(2, 20), (0, 10));
        assert_eq!(c.end_offset_for(3, 20), (3, 20));
        assert_eq!(c.end_offset_for(4, 20), (-1, -1));
        c.truncate_from_end(10).unwrap();
        assert_eq!(
            LeaderEpochCache::load(dir.path()).unwrap().latest_epoch(),
            Some(0)
        );
    }

    /// An epoch in which nothing was written is replaced by the next one starting at the
    /// same offset (Kafka's `assign`): an idle partition elected again and again keeps one
    /// entry, and OffsetForLeaderEpoch for the replaced epoch answers the epoch before it.
    #[test]
    fn a_new_epoch_at_the_same_offset_replaces_the_empty_ones() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = LeaderEpochCache::load(dir.path()).unwrap();
        assert!(c.assign(0, 0, true).unwrap());
        assert!(c.assign(2, 10, true).unwrap());
        assert!(c.assign(3, 10, true).unwrap());
        assert!(c.assign_deferred(5, 10));
        c.write_pending().unwrap();
        let text = std::fs::read_to_string(dir.path().join(LEADER_EPOCH_CHECKPOINT)).unwrap();
        assert_eq!(text, "0\n2\n0 0\n5 10\n");
        let c = LeaderEpochCache::load(dir.path()).unwrap();
        assert_eq!(c.end_offset_for(3, 20), (0, 10));
        assert_eq!(c.end_offset_for(5, 20), (5, 20));
    }

    #[test]
    fn deferred_assignments_stay_dirty_until_synced() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = LeaderEpochCache::load(dir.path()).unwrap();
        assert!(c.assign_deferred(3, 10));
        assert!(c.is_dirty());
        // In memory only until written.
        assert!(LeaderEpochCache::load(dir.path())
            .unwrap()
            .entries()
            .is_empty());
        c.write_pending().unwrap();
        assert!(c.is_dirty());
        assert_eq!(
            LeaderEpochCache::load(dir.path()).unwrap().entries(),
            c.entries()
        );
        assert!(c.assign_deferred(4, 20));
        c.write_pending().unwrap();
        c.sync().unwrap();
        assert!(!c.is_dirty());
        c.truncate_from_end(20).unwrap();
        assert!(c.is_dirty());
        c.sync().unwrap();
        assert!(!c.is_dirty());
        assert!(!c.assign_deferred(3, 30));
        assert!(!c.is_dirty());
        // A sync writes what was only assigned.
        assert!(c.assign_deferred(5, 40));
        c.sync().unwrap();
        assert!(!c.is_dirty());
        assert_eq!(
            LeaderEpochCache::load(dir.path()).unwrap().entries(),
            c.entries()
        );
    }

    #[test]
    fn torn_or_corrupt_checkpoints_load_as_unusable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LEADER_EPOCH_CHECKPOINT);
        let good = "0\n3\n0 0\n3 10\n5 200\n";
        std::fs::write(&path, good).unwrap();
        let c = LeaderEpochCache::load(dir.path()).unwrap();
        assert_eq!(c.unusable(), None);
        assert_eq!(c.entries().len(), 3);
        // Every proper prefix of the file (a write cut short, new bytes at an old length) is
        // refused, including "5 20" (the last line cut inside its offset).
        for cut in 0..good.len() {
            std::fs::write(&path, &good[..cut]).unwrap();
            let c = LeaderEpochCache::load(dir.path()).unwrap();
            assert!(c.unusable().is_some(), "prefix of {cut} bytes was accepted");
            assert!(c.entries().is_empty());
        }
        let torn: &[&[u8]] = &[
            // Old contents at a new length: zeros after them.
            b"0\n2\n0 0\n3 10\n\0\0\0\0\0\0",
            // More entries than the count line says.
            b"0\n1\n0 0\n3 10\n",
            // Fewer.
            b"0\n2\n1 0\n",
            // Out of order.
            b"0\n2\n3 10\n0 0\n",
            b"0\n2\n0 10\n3 0\n",
            b"0\n1\n-1 0\n",
            b"1\n0\n",
            b"\xff\xfe\n",
        ];
        for bytes in torn {
            std::fs::write(&path, bytes).unwrap();
            let c = LeaderEpochCache::load(dir.path()).unwrap();
            assert!(c.unusable().is_some(), "{bytes:?} was accepted");
        }
    }

    #[test]
    fn unsynced_writes_are_in_place_and_shorten_the_file() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LEADER_EPOCH_CHECKPOINT);
        let mut c = LeaderEpochCache::load(dir.path()).unwrap();
        assert!(c.assign(0, 0, true).unwrap());
        let inode = std::fs::metadata(&path).unwrap().ino();
        for (epoch, offset) in [(1, 5), (2, 6), (10, 1000)] {
            assert!(c.assign_deferred(epoch, offset));
            c.write_pending().unwrap();
        }
        assert_eq!(
            std::fs::metadata(&path).unwrap().ino(),
            inode,
            "rewritten in place"
        );
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "0\n4\n0 0\n1 5\n2 6\n10 1000\n"
        );
        c.truncate_from_end(5).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "0\n1\n0 0\n");
        assert_eq!(std::fs::metadata(&path).unwrap().ino(), inode);
        assert!(c.is_dirty());
        c.sync().unwrap();
        assert!(!c.is_dirty());
        let loaded = LeaderEpochCache::load(dir.path()).unwrap();
        assert_eq!(loaded.unusable(), None);
        assert_eq!(loaded.entries(), c.entries());
        // A synced write replaces the file atomically.
        assert!(c.assign(4, 7, true).unwrap());
        assert_ne!(std::fs::metadata(&path).unwrap().ino(), inode);
        assert!(!dir.path().join("leader-epoch-checkpoint.tmp").exists());
    }
}
