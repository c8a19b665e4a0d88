//! Log directory health (Kafka's offline log dirs, KIP-112 / KIP-858), with one difference:
//! a directory that ran out of space comes back by itself.
//!
//! A write that fails with ENOSPC or EDQUOT marks its directory *full*; any other write
//! failure marks it *failed*. While a directory is offline (full or failed), appends to its
//! partitions fail at once with KAFKA_STORAGE_ERROR ([`LogError::LogDirOffline`]) instead of
//! each trying the disk; reads, retention and DeleteRecords keep working, so space can be
//! freed through Kafka's APIs. [`LogDirHealth::check`] (the broker calls it every few seconds)
//! finds out when a full directory has room again ([`MIN_FREE_BYTES_TO_RESUME`] free per
//! `statvfs`, and a probe file of [`PROBE_BYTES`] can be written) and brings it back online
//! without a restart. A failed directory stays offline until the broker restarts, as in Kafka.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use crate::error::LogError;

/// Free bytes (`statvfs` `f_bavail * f_frsize`) a full directory needs before appends resume:
/// 1 MiB.
pub const MIN_FREE_BYTES_TO_RESUME: u64 = 1 << 20;

/// Size in bytes of the probe file a full directory must accept before appends resume (it
/// also catches a quota, EDQUOT, that `statvfs` does not show): 64 KiB.
pub const PROBE_BYTES: usize = 64 * 1024;

const PROBE_FILE: &str = ".gregor-space-check";

/// A log directory's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DirState {
    /// Appends are accepted.
    Online,
    /// A write failed for lack of space; appends fail until a check finds room again.
    Full {
        /// The failed write ("appending to /data/t-0/000…0.log: No space left on device").
        reason: String,
    },
    /// A write failed with another I/O error; offline until the broker restarts.
    Failed {
        /// The failed write.
        reason: String,
    },
}

impl DirState {
    /// Whether appends are refused.
    pub fn is_offline(&self) -> bool {
        !matches!(self, DirState::Online)
    }
}

/// The health of one log directory, shared by the [`LogManager`](crate::LogManager) and every
/// partition log in the directory.
#[derive(Debug)]
pub struct LogDirHealth {
    dir: PathBuf,
    state: Mutex<DirState>,
    /// Mirrors `state.is_offline()` for the append path's check.
    offline: AtomicBool,
    /// Whether this is `metadata.log.dir` as the metadata log sees it (only the log lines
    /// differ: what fails is metadata changes, not partitions).
    metadata: bool,
}

impl LogDirHealth {
    /// An online directory.
    pub fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
            state: Mutex::new(DirState::Online),
            offline: AtomicBool::new(false),
            metadata: false,
        }
    }

    /// An online `metadata.log.dir`, as the metadata log (`__cluster_metadata-0`) finds it:
    /// the same states, with log lines that say metadata changes fail.
    pub fn for_metadata_log(dir: &Path) -> Self {
        Self {
            metadata: true,
            ..Self::new(dir)
        }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its current state.
    pub fn state(&self) -> DirState {
        self.state.lock().clone()
    }

    /// Whether appends to its partitions are refused.
    pub fn is_offline(&self) -> bool {
        self.offline.load(Ordering::Acquire)
    }

    /// `Ok` when online.
    ///
    /// # Errors
    /// [`LogError::LogDirOffline`] naming the directory and why.
    pub fn ensure_online(&self) -> Result<(), LogError> {
        if !self.is_offline() {
            return Ok(());
        }
        let reason = match self.state() {
            DirState::Online => return Ok(()),
            DirState::Full { reason } => {
                format!("full since a write failed ({reason}); appends resume once space is free")
            }
            DirState::Failed { reason } => {
                format!("failed ({reason}); restart the broker once the disk is repaired")
            }
        };
        Err(LogError::LogDirOffline {
            dir: self.dir.display().to_string(),
            reason,
        })
    }

    /// Records a failed write: full for ENOSPC/EDQUOT ([`LogError::is_out_of_space`]), nothing
    /// for EMFILE/ENFILE ([`LogError::is_out_of_descriptors`]), failed otherwise. Logs one WARN
    /// (full) or ERROR (failed) line when the state changes, and a WARN for every
    /// EMFILE/ENFILE (not rate-limited here); a failed directory does not become full.
    pub fn record_write_error(&self, error: &LogError) {
        // Running out of descriptors says nothing about the disk (clients can cause it by
        // opening connections): the write fails alone.
        if error.is_out_of_descriptors() {
            tracing::warn!(log_dir = %self.dir.display(), error = %error,
                "a write failed for lack of file descriptors; the directory stays online \
                 (raise the open-file limit or lower max.connections)");
            return;
        }
        let mut state = self.state.lock();
        let next = if error.is_out_of_space() {
            match &*state {
                DirState::Online => DirState::Full {
                    reason: error.to_string(),
                },
                _ => return,
            }
        } else {
            match &*state {
                DirState::Failed { .. } => return,
                _ => DirState::Failed {
                    reason: error.to_string(),
                },
            }
        };
        match &next {
            DirState::Full { reason } if self.metadata => tracing::error!(
                metadata_log_dir = %self.dir.display(),
                error = %reason,
                "metadata log directory is full: metadata changes (creating or deleting \
                 topics, leader and ISR changes, configs) fail with KAFKA_STORAGE_ERROR and \
                 /ready reports it; free space on its file system and they resume within \
                 seconds, without a restart"
            ),
            DirState::Failed { reason } if self.metadata => tracing::error!(
                metadata_log_dir = %self.dir.display(),
                error = %reason,
                "metadata log directory failed: metadata changes fail with \
                 KAFKA_STORAGE_ERROR; repair the disk and restart the broker"
            ),
            DirState::Full { reason } => tracing::warn!(
                log_dir = %self.dir.display(),
                error = %reason,
                "log directory is full: appends to its partitions fail with KAFKA_STORAGE_ERROR \
                 (clients retry) and it reports itself offline to the controller and on /ready; \
                 free space: remove other files on the disk, or grow it, and appends resume \
                 within seconds, without a restart; kafka-delete-records or a lower \
                 retention.ms / retention.bytes free the segments they delete only at the next \
                 retention check (log.retention.check.interval.ms) plus file.delete.delay.ms"
            ),
            DirState::Failed { reason } => tracing::error!(
                log_dir = %self.dir.display(),
                error = %reason,
                "log directory failed: appends to its partitions fail with KAFKA_STORAGE_ERROR \
                 and it reports itself offline; repair the disk and restart the broker"
            ),
            DirState::Online => {}
        }
        *state = next;
        self.offline.store(true, Ordering::Release);
    }

    /// Marks the directory failed for `reason` (it could not be opened, locked or loaded at
    /// start-up, KIP-112's offline log dir): its partitions are not served, it is reported
    /// offline, and it stays so until the broker restarts. Logs one ERROR naming the
    /// directory and the cause; nothing when it had already failed.
    pub fn mark_failed(&self, reason: String) {
        let mut state = self.state.lock();
        if matches!(*state, DirState::Failed { .. }) {
            return;
        }
        tracing::error!(
            log_dir = %self.dir.display(),
            error = %reason,
            "log directory failed and is offline: its partitions are not served by this \
             broker and it is reported offline to the controller (leadership of its partitions \
             moves to other replicas); the other log directories stay in service; repair the \
             disk and restart the broker"
        );
        *state = DirState::Failed { reason };
        self.offline.store(true, Ordering::Release);
    }

    /// Whether the directory failed ([`DirState::Failed`]): unlike a full one, it does not
    /// come back before a restart.
    pub fn is_failed(&self) -> bool {
        self.is_offline() && matches!(*self.state.lock(), DirState::Failed { .. })
    }

    /// For a full directory, checks whether it has room again ([`MIN_FREE_BYTES_TO_RESUME`]
    /// free and a [`PROBE_BYTES`] probe file written, then removed) and if so brings it back
    /// online. Returns whether the state changed. Cheap when online (no system call).
    pub fn check(&self) -> bool {
        if !matches!(*self.state.lock(), DirState::Full { .. }) {
            return false;
        }
        if let Err(why) = self.has_room() {
            tracing::debug!(log_dir = %self.dir.display(), %why, "log directory still full");
            return false;
        }
        let mut state = self.state.lock();
        if !matches!(*state, DirState::Full { .. }) {
            return false;
        }
        *state = DirState::Online;
        self.offline.store(false, Ordering::Release);
        tracing::info!(log_dir = %self.dir.display(),
            "log directory has room again: appends to its partitions resume");
        true
    }

    fn has_room(&self) -> Result<(), String> {
        let st = rustix::fs::statvfs(&self.dir).map_err(|e| format!("statvfs: {e}"))?;
        let free = st.f_bavail.saturating_mul(st.f_frsize);
        if free < MIN_FREE_BYTES_TO_RESUME {
            return Err(format!(
                "{free} bytes free, {MIN_FREE_BYTES_TO_RESUME} needed"
            ));
        }
        if st.f_files > 0 && st.f_favail == 0 {
            return Err("no free inodes".into());
        }
        let probe = self.dir.join(PROBE_FILE);
        let written = std::fs::File::create(&probe).and_then(|mut f| {
            f.write_all(&[0u8; PROBE_BYTES])?;
            f.sync_data()
        });
        let removed = std::fs::remove_file(&probe);
        written.map_err(|e| format!("probe write: {e}"))?;
        removed.map_err(|e| format!("removing the probe file: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_space() -> LogError {
        LogError::io(
            "appending to",
            Path::new("/x"),
            std::io::Error::from_raw_os_error(rustix::io::Errno::NOSPC.raw_os_error()),
        )
    }

    #[test]
    fn running_out_of_descriptors_leaves_the_dir_online() {
        let dir = tempfile::tempdir().unwrap();
        let h = LogDirHealth::new(dir.path());
        for errno in [rustix::io::Errno::MFILE, rustix::io::Errno::NFILE] {
            h.record_write_error(&LogError::io(
                "opening segment",
                Path::new("/x"),
                std::io::Error::from_raw_os_error(errno.raw_os_error()),
            ));
            assert_eq!(h.state(), DirState::Online);
            assert!(!h.is_offline());
        }
    }

    #[test]
    fn full_heals_failed_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let h = LogDirHealth::new(dir.path());
        assert!(h.ensure_online().is_ok());
        h.record_write_error(&no_space());
        assert!(h.is_offline());
        let e = h.ensure_online().unwrap_err();
        assert_eq!(e.kafka_error_code(), 56);
        assert!(matches!(h.state(), DirState::Full { .. }));
        // A temp dir has room: the check brings it back.
        assert!(h.check());
        assert_eq!(h.state(), DirState::Online);
        assert!(!dir.path().join(PROBE_FILE).exists());
        h.record_write_error(&LogError::io(
            "appending to",
            Path::new("/x"),
            std::io::Error::other("EIO"),
        ));
        assert!(matches!(h.state(), DirState::Failed { .. }));
        assert!(!h.check());
        // Failed stays failed, even on a later ENOSPC.
        h.record_write_error(&no_space());
        assert!(matches!(h.state(), DirState::Failed { .. }));
        assert!(h.is_offline());
    }
}
