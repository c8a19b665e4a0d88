//! Small files written atomically (temp file, fsync, rename, fsync of the directory), and
//! Kafka's text checkpoint format.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::Path;

use crate::error::{LogError, Result};

/// Writes `contents` to `path` atomically: readers see the old or the new file, never a torn
/// one. With `sync` false the data is not fsynced (for files that are only an optimisation and
/// are validated on load, such as producer snapshots written at roll).
pub(crate) fn write_atomically(path: &Path, contents: &[u8], sync: bool) -> Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = Path::new(&tmp);
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(tmp)
        .map_err(|e| LogError::io("creating", tmp, e))?;
    f.write_all(contents)
        .map_err(|e| LogError::io("writing", tmp, e))?;
    if sync {
        f.sync_all().map_err(|e| LogError::io("syncing", tmp, e))?;
    }
    drop(f);
    fs::rename(tmp, path).map_err(|e| LogError::io("renaming into place", path, e))?;
    if sync {
        if let Some(dir) = path.parent() {
            sync_dir(dir)?;
        }
    }
    Ok(())
}

/// fsyncs a directory so that renames and creations in it are durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| LogError::io("syncing directory", dir, e))
}

/// Parses Kafka's checkpoint text format: `<version>\n<count>\n` then `count` lines, each split
/// on whitespace and handed to `line`.
pub(crate) fn parse_checkpoint<T>(
    path: &Path,
    text: &str,
    expected_version: u32,
    mut line: impl FnMut(&[&str]) -> Option<T>,
) -> Result<Vec<T>> {
    let corrupt = |reason: String| LogError::CorruptFile {
        path: path.display().to_string(),
        reason,
    };
    let mut lines = text.lines();
    let version: u32 = lines
        .next()
        .and_then(|l| l.trim().parse().ok())
        .ok_or_else(|| corrupt("missing version line".into()))?;
    if version != expected_version {
        return Err(corrupt(format!("unsupported version {version}")));
    }
    let count: usize = lines
        .next()
        .and_then(|l| l.trim().parse().ok())
        .ok_or_else(|| corrupt("missing entry count".into()))?;
    let mut out = Vec::with_capacity(count.min(1 << 16));
    for i in 0..count {
        let l = lines
            .next()
            .ok_or_else(|| corrupt(format!("expected {count} entries, found {i}")))?;
        let fields: Vec<&str> = l.split_whitespace().collect();
        out.push(line(&fields).ok_or_else(|| corrupt(format!("bad entry line {l:?}")))?);
    }
    Ok(out)
}
