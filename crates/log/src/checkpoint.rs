//! Small files written atomically (temp file, fsync, rename, fsync of the directory) or, when
//! no fsync is wanted, overwritten in place ([`write_in_place`]: the reader must detect a torn
//! file), and Kafka's text checkpoint format.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
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

/// Overwrites `path` with `contents` in place, without a temporary file, a rename or an
/// `fsync`: the file's block is rewritten where it is, and shortened (never to zero) when the
/// new contents are shorter. For a small checkpoint that is rewritten often and validated on
/// load (the leader epoch checkpoint), this avoids what the atomic replacement costs on ext4:
/// allocating an inode for the temporary file, writing it back at once when it is renamed over
/// the old one (`auto_da_alloc`), and freeing the old file's blocks (a synchronous discard on
/// a file system mounted with `discard`).
///
/// A crash while the page is written back can leave the old contents, the new ones, or a mix
/// (new bytes at the old length, old bytes at the new length with zeros after): the reader must
/// detect such a file (the count line against the entries, every line, the final newline) and
/// rebuild what it holds.
///
/// # Errors
/// [`LogError::Io`] naming the file.
pub(crate) fn write_in_place(path: &Path, contents: &[u8]) -> Result<()> {
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| LogError::io("opening", path, e))?;
    f.write_all_at(contents, 0)
        .map_err(|e| LogError::io("writing", path, e))?;
    let len = f
        .metadata()
        .map_err(|e| LogError::io("reading the size of", path, e))?
        .len();
    let want = contents.len() as u64;
    if len > want {
        f.set_len(want)
            .map_err(|e| LogError::io("shortening", path, e))?;
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
/// on whitespace and handed to `line`. Nothing may follow the last entry (Kafka's
/// `CheckpointFile` refuses more entries than the count line says).
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
    if let Some(extra) = lines.next() {
        return Err(corrupt(format!(
            "more than the {count} entries the count line says (next: {extra:?})"
        )));
    }
    Ok(out)
}
