//! Responses as a connection's writer sends them: one frame made of parts, bytes in memory
//! and regions of files (a Fetch response's record sets, sent from the segment file without
//! copying them, DESIGN principle 3).
//!
//! On a plain TCP connection the writer sends a response with file regions from a blocking
//! thread ([`crate::RequestHandler::run_blocking`]: moving a region reads the file, which may
//! wait for the disk when it is not in the page cache), one hop per time the socket's send
//! buffer fills: memory parts with `send` and file regions with `splice` (through a pipe of the
//! response's own, `sendfile` as the fallback), in order, each resumed where a partial write
//! stopped. Any other transport (TLS will be one) reads a region into memory on that
//! thread and writes it as bytes: the copying path.
//!
//! A region's length is in the frame before its bytes are sent. When the file turns out
//! shorter (truncated in place after the response was built, [`RegionFile::is_intact`], or
//! its end reached before the region's), the frame cannot be completed: the connection is closed, so
//! the client retries, rather than sending padding or leaving the stream out of frame.

use std::fs::File;
use std::io;

use bytes::Bytes;

/// Bytes of responses sent from files without a copy, `splice` or `sendfile` (counter).
pub const ZERO_COPY_BYTES_TOTAL: &str = "gregor_network_zero_copy_bytes_total";

/// A file whose bytes a [`FileRegion`] sends, held open until the response is dropped.
pub trait RegionFile: Send + Sync + 'static {
    /// The open file.
    fn file(&self) -> &File;

    /// False once the file was cut shorter in place after the region was chosen: its bytes
    /// may be gone or replaced, and the connection is closed instead of sending them.
    fn is_intact(&self) -> bool;
}

/// `len` bytes of a file from `position`, sent as they are.
pub struct FileRegion {
    file: Box<dyn RegionFile>,
    position: u64,
    len: usize,
}

impl FileRegion {
    /// The region `[position, position + len)` of `file`.
    pub fn new(file: Box<dyn RegionFile>, position: u64, len: usize) -> Self {
        Self {
            file,
            position,
            len,
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where the region starts in the file (bytes).
    pub fn position(&self) -> u64 {
        self.position
    }

    /// The file.
    pub fn file(&self) -> &dyn RegionFile {
        &*self.file
    }

    /// Reads the region into memory (the copying path).
    ///
    /// # Errors
    /// The read's error; `UnexpectedEof` when the file is shorter than the region,
    /// `InvalidData` when it was truncated since the region was chosen.
    pub fn read_to_vec(&self) -> io::Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        if !self.file.is_intact() {
            return Err(truncated());
        }
        let mut buf = vec![0u8; self.len];
        self.file.file().read_exact_at(&mut buf, self.position)?;
        Ok(buf)
    }
}

impl std::fmt::Debug for FileRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileRegion")
            .field("position", &self.position)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

/// The error for a region whose file was truncated under it.
pub(crate) fn truncated() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        "the file was truncated after the response was built",
    )
}

/// One part of a response frame.
#[derive(Debug)]
pub enum ResponsePart {
    /// Bytes in memory.
    Bytes(Bytes),
    /// Bytes of a file.
    File(FileRegion),
}

impl ResponsePart {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Self::Bytes(b) => b.len(),
            Self::File(f) => f.len(),
        }
    }

    /// Whether the part is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A whole response frame (size prefix included) in parts, written in order.
#[derive(Debug)]
pub struct Response {
    parts: Vec<ResponsePart>,
    len: usize,
}

impl Response {
    /// A response of `parts`; empty parts are dropped.
    pub fn new(parts: Vec<ResponsePart>) -> Self {
        let parts: Vec<ResponsePart> = parts.into_iter().filter(|p| !p.is_empty()).collect();
        let len = parts.iter().map(ResponsePart::len).sum();
        Self { parts, len }
    }

    /// Bytes on the wire.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the response has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes sent from files.
    pub fn file_bytes(&self) -> usize {
        self.parts
            .iter()
            .map(|p| match p {
                ResponsePart::File(f) => f.len(),
                ResponsePart::Bytes(_) => 0,
            })
            .sum()
    }

    /// Whether any part is a file region.
    pub fn has_files(&self) -> bool {
        self.parts
            .iter()
            .any(|p| matches!(p, ResponsePart::File(_)))
    }

    /// The parts, in wire order.
    pub fn parts(&self) -> &[ResponsePart] {
        &self.parts
    }

    /// The parts, in wire order, taken out.
    pub fn into_parts(self) -> Vec<ResponsePart> {
        self.parts
    }

    /// The whole frame in memory, reading every file region (the copying path; tests).
    ///
    /// # Errors
    /// As [`FileRegion::read_to_vec`].
    pub fn to_vec(&self) -> io::Result<Vec<u8>> {
        let mut out = Vec::with_capacity(self.len);
        for p in &self.parts {
            match p {
                ResponsePart::Bytes(b) => out.extend_from_slice(b),
                ResponsePart::File(f) => out.extend_from_slice(&f.read_to_vec()?),
            }
        }
        Ok(out)
    }
}

impl From<Bytes> for Response {
    fn from(b: Bytes) -> Self {
        Self::new(vec![ResponsePart::Bytes(b)])
    }
}
