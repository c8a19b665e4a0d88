//! The metadata log: an ordered, durable sequence of [`MetadataRecord`]s.
//!
//! [`FileMetadataLog`] keeps them in one local file of frames
//! `[length: u32 BE][crc32c: u32 BE][JSON array of records]`, one frame per append, so a
//! group of records is all-or-nothing. Each append is written
//! and fsynced before it returns, so a change acknowledged to a client survives a crash. On open
//! a torn or corrupt tail (a crash during append) is truncated away; everything before it is
//! kept.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use thiserror::Error;

use crate::record::MetadataRecord;

/// Errors of the metadata log.
#[derive(Debug, Error)]
pub enum MetadataLogError {
    /// File system error.
    #[error("metadata log {path}: {context}: {source}")]
    Io {
        /// The log file.
        path: PathBuf,
        /// What was being done.
        context: &'static str,
        /// The cause.
        source: io::Error,
    },
    /// A record could not be serialised (a bug).
    #[error("cannot encode metadata record: {0}")]
    Encode(String),
}

/// A durable, ordered log of metadata records. Implementations: [`FileMetadataLog`] (one node);
/// a Raft log later. `append` returns only once the records are durable (committed).
pub trait MetadataLog: Send + Sync {
    /// Appends `records` atomically (all or none) and returns the offset of the last one.
    ///
    /// # Errors
    /// [`MetadataLogError`] when the records could not be made durable.
    fn append(&self, records: &[MetadataRecord]) -> Result<u64, MetadataLogError>;

    /// All committed records in order, for building the image at start-up.
    ///
    /// # Errors
    /// [`MetadataLogError`] on I/O errors.
    fn read_all(&self) -> Result<Vec<MetadataRecord>, MetadataLogError>;
}

/// [`MetadataLog`] in a local file.
pub struct FileMetadataLog {
    path: PathBuf,
    inner: Mutex<Inner>,
}

struct Inner {
    file: File,
    next_offset: u64,
}

/// File name of the metadata log inside its directory.
pub const METADATA_LOG_FILE: &str = "metadata.log";

impl FileMetadataLog {
    /// Opens (creating if missing) `<dir>/metadata.log`, truncating a torn or corrupt tail.
    ///
    /// # Errors
    /// [`MetadataLogError::Io`] when the directory or file cannot be created or read.
    pub fn open(dir: &Path) -> Result<Self, MetadataLogError> {
        let path = dir.join(METADATA_LOG_FILE);
        let io = |context: &'static str| {
            let path = path.clone();
            move |source| MetadataLogError::Io {
                path,
                context,
                source,
            }
        };
        std::fs::create_dir_all(dir).map_err(io("creating directory"))?;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io("opening"))?;
        let mut data = Vec::new();
        file.read_to_end(&mut data).map_err(io("reading"))?;
        let (frames, valid_len) = scan(&data);
        if valid_len < data.len() {
            tracing::warn!(
                path = %path.display(),
                kept_bytes = valid_len,
                dropped_bytes = data.len() - valid_len,
                "metadata log had a torn or corrupt tail (unclean shutdown during an append); truncated it"
            );
            file.set_len(valid_len as u64).map_err(io("truncating"))?;
            file.sync_all().map_err(io("syncing"))?;
        }
        file.seek(SeekFrom::End(0)).map_err(io("seeking"))?;
        Ok(Self {
            path,
            inner: Mutex::new(Inner {
                file,
                next_offset: frames.len() as u64,
            }),
        })
    }
}

/// Returns the decodable records and the length of the valid prefix.
fn scan(data: &[u8]) -> (Vec<MetadataRecord>, usize) {
    let mut out = Vec::new();
    let mut pos = 0;
    while data.len() - pos >= 8 {
        let len =
            u32::from_be_bytes([data[pos], data[pos + 1], data[pos + 2], data[pos + 3]]) as usize;
        let crc = u32::from_be_bytes([data[pos + 4], data[pos + 5], data[pos + 6], data[pos + 7]]);
        let Some(body) = data.get(pos + 8..pos + 8 + len) else {
            break;
        };
        if crc32c::crc32c(body) != crc {
            break;
        }
        let Ok(records) = serde_json::from_slice::<Vec<MetadataRecord>>(body) else {
            break;
        };
        out.extend(records);
        pos += 8 + len;
    }
    (out, pos)
}

impl MetadataLog for FileMetadataLog {
    fn append(&self, records: &[MetadataRecord]) -> Result<u64, MetadataLogError> {
        // One frame per append, so a torn write drops the whole group of records.
        let body =
            serde_json::to_vec(records).map_err(|e| MetadataLogError::Encode(e.to_string()))?;
        let mut buf = Vec::with_capacity(body.len() + 8);
        buf.extend_from_slice(&(body.len() as u32).to_be_bytes());
        buf.extend_from_slice(&crc32c::crc32c(&body).to_be_bytes());
        buf.extend_from_slice(&body);
        let mut inner = self.inner.lock();
        let io = |context: &'static str| {
            let path = self.path.clone();
            move |source| MetadataLogError::Io {
                path,
                context,
                source,
            }
        };
        inner.file.write_all(&buf).map_err(io("appending"))?;
        inner.file.sync_data().map_err(io("syncing"))?;
        inner.next_offset += records.len() as u64;
        Ok(inner.next_offset.saturating_sub(1))
    }

    fn read_all(&self) -> Result<Vec<MetadataRecord>, MetadataLogError> {
        let _guard = self.inner.lock();
        let data = std::fs::read(&self.path).map_err(|source| MetadataLogError::Io {
            path: self.path.clone(),
            context: "reading",
            source,
        })?;
        Ok(scan(&data).0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::ConfigResource;

    fn rec(i: usize) -> MetadataRecord {
        MetadataRecord::Config {
            resource: ConfigResource::Topic,
            resource_name: format!("t{i}"),
            name: "retention.ms".into(),
            value: Some(i.to_string()),
        }
    }

    #[test]
    fn records_survive_reopen_and_torn_tail_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        {
            let log = FileMetadataLog::open(dir.path()).unwrap();
            log.append(&[rec(1), rec(2)]).unwrap();
            log.append(&[rec(3)]).unwrap();
        }
        let path = dir.path().join(METADATA_LOG_FILE);
        let full = std::fs::read(&path).unwrap();
        for cut in 0..full.len() {
            std::fs::write(&path, &full[..cut]).unwrap();
            let log = FileMetadataLog::open(dir.path()).unwrap();
            let got = log.read_all().unwrap();
            assert!(matches!(got.len(), 0 | 2 | 3), "atomic groups");
            assert_eq!(got, (1..=got.len()).map(rec).collect::<Vec<_>>());
            log.append(&[rec(got.len() + 1)]).unwrap();
            assert_eq!(log.read_all().unwrap().len(), got.len() + 1);
        }
    }
}
