//! The page-cache state of `cargo xtask bench`'s runs (issue 15, item 5): with gigabytes dirty
//! and a full cache, the same broker's system time per GB written was seen to rise 7× within
//! minutes, so every run starts from the same state: `sync`, then, where the bench runs as root,
//! `echo 3 > /proc/sys/vm/drop_caches`. The cold-read workload also evicts the broker's own
//! files with `posix_fadvise(POSIX_FADV_DONTNEED)` after a `sync`, which needs no root: clean
//! pages of a file that no one maps are dropped, so the next read comes from the disk.

use anyhow::{Context, Result};
use std::path::Path;

const DROP_CACHES: &str = "/proc/sys/vm/drop_caches";

/// Whether the caches can be dropped, decided by the first attempt.
pub struct PageCache {
    /// `None` until tried; then whether writing [`DROP_CACHES`] worked.
    can_drop: Option<bool>,
    /// Why not, when it did not.
    reason: String,
    /// `--no-drop-caches`: never try.
    disabled: bool,
}

impl PageCache {
    pub fn new(disabled: bool) -> Self {
        Self {
            can_drop: None,
            reason: if disabled {
                "--no-drop-caches".to_string()
            } else {
                String::new()
            },
            disabled,
        }
    }

    /// `sync`, then drop the page cache, dentries and inodes where allowed (root, a writable
    /// `/proc/sys`); otherwise `sync` alone, and [`PageCache::describe`] says why.
    pub fn settle(&mut self) {
        rustix::fs::sync();
        if self.disabled || self.can_drop == Some(false) {
            return;
        }
        if !rustix::process::geteuid().is_root() {
            self.can_drop = Some(false);
            self.reason = "not running as root".to_string();
            return;
        }
        match std::fs::write(DROP_CACHES, b"3") {
            Ok(()) => self.can_drop = Some(true),
            Err(e) => {
                self.can_drop = Some(false);
                self.reason = format!("writing {DROP_CACHES}: {e}");
                eprintln!(
                    "warning: cannot drop the page cache ({}); sync only",
                    self.reason
                );
            }
        }
    }

    /// What [`PageCache::settle`] did, for the report.
    pub fn describe(&self) -> String {
        match self.can_drop {
            Some(true) => format!("sync, then echo 3 > {DROP_CACHES}"),
            _ => format!("sync only (caches not dropped: {})", self.reason),
        }
    }

    /// Whether the caches were dropped (`None`: never tried).
    pub fn dropped(&self) -> Option<bool> {
        self.can_drop
    }
}

/// `sync`, then `posix_fadvise(DONTNEED)` on every regular file under `dirs`: their clean pages
/// leave the page cache. Returns the bytes of the files advised.
///
/// # Errors
/// When a directory cannot be listed or a file cannot be opened or advised.
pub fn evict_files(dirs: &[&Path]) -> Result<u64> {
    rustix::fs::sync();
    let mut bytes = 0;
    let mut stack: Vec<std::path::PathBuf> = dirs.iter().map(|d| d.to_path_buf()).collect();
    while let Some(dir) = stack.pop() {
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))?
        {
            let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
            let kind = entry.file_type()?;
            let path = entry.path();
            if kind.is_dir() {
                stack.push(path);
            } else if kind.is_file() {
                // A file deleted meanwhile (a segment rolled away) has no pages to drop.
                let Ok(file) = std::fs::File::open(&path) else {
                    continue;
                };
                bytes += file.metadata().map_or(0, |m| m.len());
                rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed)
                    .with_context(|| format!("posix_fadvise(DONTNEED) on {}", path.display()))?;
            }
        }
    }
    Ok(bytes)
}
