//! A connection's writer: sends [`Response`]s in order, file regions without a copy on plain
//! TCP (see [`crate::response`]).

use std::io;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncWriteExt, Interest, WriteHalf};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::oneshot;

use crate::handler::RequestHandler;
use crate::response::{Response, ResponsePart, ZERO_COPY_BYTES_TOTAL};
use crate::transport::Transport;

/// The most bytes one `sendfile` call is asked for (Linux moves at most 0x7ffff000 anyway).
const MAX_SENDFILE_BYTES: usize = 1 << 30;

/// Why a response could not be sent; the connection is closed.
#[derive(Debug)]
pub(crate) enum SendError {
    /// The socket failed (the peer went away, usually).
    Io(io::Error),
    /// A file region's file was truncated before its bytes were sent: the frame cannot be
    /// completed.
    Truncated,
    /// The blocking pool dropped the transfer (the broker is shutting down).
    Offload,
}

impl From<io::Error> for SendError {
    fn from(e: io::Error) -> Self {
        if matches!(
            e.kind(),
            io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof
        ) {
            Self::Truncated
        } else {
            Self::Io(e)
        }
    }
}

/// The write side of a connection.
pub(crate) enum ResponseWriter {
    /// A plain TCP stream: file regions go out with `splice` (or `sendfile`).
    Tcp(Arc<OwnedWriteHalf>),
    /// Any other transport: file regions are read into memory and written.
    Stream(WriteHalf<Box<dyn Transport>>),
}

/// What a response's pipe may hold (`F_SETPIPE_SZ`; Linux's default `pipe-max-size`).
const PIPE_BYTES: usize = 1 << 20;

/// A pipe that moves a file region's pages to the socket (`splice` file -> pipe -> socket) up
/// to [`PIPE_BYTES`] at a time. `sendfile` does the same through a pipe of 64 KiB, and pushes
/// the socket once per 64 KiB; measured here, that cost more CPU than it saved. Created for one
/// response and closed with it (two descriptors while a response with file regions is sent).
struct Pipe {
    read: std::os::fd::OwnedFd,
    write: std::os::fd::OwnedFd,
    capacity: usize,
}

impl Pipe {
    /// A new pipe, grown to [`PIPE_BYTES`] where the system allows; `None` when no pipe can be
    /// had (out of descriptors): the region goes out with `sendfile` instead.
    fn new() -> Option<Self> {
        let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).ok()?;
        let capacity = rustix::pipe::fcntl_setpipe_size(&write, PIPE_BYTES)
            .or_else(|_| rustix::pipe::fcntl_getpipe_size(&write))
            .ok()?;
        Some(Self {
            read,
            write,
            capacity,
        })
    }
}

/// Where a partly sent response stands: the part and the bytes of it already on the socket,
/// and the bytes of the current file region that wait in the pipe.
#[derive(Default)]
struct Cursor {
    part: usize,
    offset: usize,
    pipe: Option<Pipe>,
    /// Bytes in `pipe`: the region's `[offset, offset + in_pipe)`.
    in_pipe: usize,
    /// No pipe could be had, or `splice` refused the file: `sendfile` from here on.
    no_pipe: bool,
}

/// What one turn of [`send_some`] ended with.
#[derive(Debug)]
enum Turn {
    /// Every part is sent.
    Done,
    /// The socket's send buffer is full.
    WouldBlock,
    /// A file region's file ends before the region does, or was truncated in place.
    Truncated,
    /// The socket failed.
    Failed(io::Error),
}

impl ResponseWriter {
    /// Sends `response` whole. Blocking work (reading files, `splice`) runs through
    /// `handler`'s [`RequestHandler::run_blocking`].
    ///
    /// # Errors
    /// [`SendError`]; the caller closes the connection. On a plain TCP stream a truncated
    /// region shuts the socket down at once (both ways), so the client sees the connection
    /// end, not a frame that never completes.
    pub(crate) async fn send<H: RequestHandler>(
        &mut self,
        response: Response,
        handler: &Arc<H>,
    ) -> Result<(), SendError> {
        match self {
            Self::Tcp(half) => {
                let stream: &TcpStream = (**half).as_ref();
                if !response.has_files() {
                    for p in response.parts() {
                        if let ResponsePart::Bytes(b) = p {
                            write_all_tcp(stream, b).await?;
                        }
                    }
                    return Ok(());
                }
                let result = send_with_files(half, response, handler).await;
                if matches!(result, Err(SendError::Truncated)) {
                    let _ = rustix::net::shutdown(stream.as_fd(), rustix::net::Shutdown::Both);
                }
                result
            }
            Self::Stream(wr) => {
                for p in response.into_parts() {
                    match p {
                        ResponsePart::Bytes(b) => wr.write_all(&b).await?,
                        ResponsePart::File(region) => {
                            let bytes = offload(&**handler, move || region.read_to_vec())
                                .await
                                .ok_or(SendError::Offload)??;
                            wr.write_all(&bytes).await?;
                        }
                    }
                }
                // A TLS stream takes the plaintext and may keep some of its records unsent when
                // the socket's buffer fills; only a flush (or a later write) sends them. Without
                // this a large Fetch response over TLS could stay partly unsent until the
                // client timed out (librdkafka: 60 s, REQTMOUT).
                wr.flush().await?;
                Ok(())
            }
        }
    }
}

/// Runs `f` on the handler's blocking pool; `None` if the pool dropped it.
async fn offload<H: RequestHandler, T: Send + 'static>(
    handler: &H,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = oneshot::channel();
    handler.run_blocking(Box::new(move || {
        let _ = tx.send(f());
    }));
    rx.await.ok()
}

/// `write_all` on a TCP stream shared with the blocking pool (no `&mut` needed).
async fn write_all_tcp(stream: &TcpStream, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        stream.writable().await?;
        match stream.try_write(buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The longest one wait for the client to drain the socket's send buffer inside a transfer
/// job, before the job gives its thread back (see [`send_with_files`]).
const DRAIN_WAIT: Duration = Duration::from_millis(2);

/// The longest one transfer job holds its thread waiting for the client in all.
const JOB_WAIT_BUDGET: Duration = Duration::from_millis(20);

/// Sends a response with file regions: each time the socket is writable, one job on the
/// blocking pool writes as much as the send buffer takes ([`send_some`]), and the writer
/// awaits writability again where it stopped. So a slow client holds no thread.
///
/// A fast client (a consumer on the same host or a fast link) drains the send buffer within
/// microseconds, and handing the job back to the async writer each time the buffer fills
/// costs two thread wake-ups per buffer (about 2.5 MB on loopback): a 6 MB response took
/// three round trips through the pool. So while the pool has another idle thread
/// ([`RequestHandler::transfer_may_wait`]: no other work waits behind this one), the job
/// waits for the socket with `poll` itself, up to [`DRAIN_WAIT`] at a time and
/// [`JOB_WAIT_BUDGET`] in all; a client that drains nothing in [`DRAIN_WAIT`] gets the
/// asynchronous wait. The last attempt before giving up goes through tokio's readiness
/// (`try_io`), so the writer's `writable()` waits for the next edge, not a stale one.
async fn send_with_files<H: RequestHandler>(
    half: &Arc<OwnedWriteHalf>,
    mut response: Response,
    handler: &Arc<H>,
) -> Result<(), SendError> {
    let mut cursor = Cursor::default();
    loop {
        let stream: &TcpStream = (**half).as_ref();
        stream.writable().await?;
        let job_half = Arc::clone(half);
        let gate = Arc::clone(handler);
        let (r, c, sent_from_files, turn) = offload(&**handler, move || {
            let mut c = cursor;
            let mut from_files = 0u64;
            let stream: &TcpStream = (*job_half).as_ref();
            let turn = send_waiting(stream, &response, &mut c, &mut from_files, || {
                gate.transfer_may_wait()
            });
            (response, c, from_files, turn)
        })
        .await
        .ok_or(SendError::Offload)?;
        metrics::counter!(ZERO_COPY_BYTES_TOTAL).increment(sent_from_files);
        response = r;
        cursor = c;
        match turn {
            Turn::Done => return Ok(()),
            Turn::WouldBlock => {}
            Turn::Truncated => return Err(SendError::Truncated),
            Turn::Failed(e) => return Err(SendError::Io(e)),
        }
    }
}

/// One transfer job: [`send_some`] until the response is sent, the socket fails, or the
/// client stops draining; while `may_wait` allows, waits in `poll` for the socket to become
/// writable instead of returning [`Turn::WouldBlock`] (see [`send_with_files`]).
fn send_waiting(
    stream: &TcpStream,
    response: &Response,
    cursor: &mut Cursor,
    from_files: &mut u64,
    may_wait: impl Fn() -> bool,
) -> Turn {
    let started = Instant::now();
    // Whether the socket is written directly, after a `poll` that tokio's readiness has not
    // seen yet (`try_io` would not even try).
    let mut direct = false;
    let mut waiting = true;
    loop {
        let turn = send_some(stream, response, cursor, from_files, direct);
        if !matches!(turn, Turn::WouldBlock) {
            return turn;
        }
        if waiting {
            let left = JOB_WAIT_BUDGET.saturating_sub(started.elapsed());
            if !left.is_zero() && may_wait() && wait_writable(stream, left.min(DRAIN_WAIT)) {
                direct = true;
                continue;
            }
            waiting = false;
        }
        if direct {
            // Once more through tokio's readiness, which a full buffer then clears.
            direct = false;
            continue;
        }
        return Turn::WouldBlock;
    }
}

/// Waits up to `timeout` for `stream` to take more bytes; true when it does (or failed: the
/// next write reports why).
fn wait_writable(stream: &TcpStream, timeout: Duration) -> bool {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let Ok(timeout) = Timespec::try_from(timeout) else {
        return false;
    };
    let mut fds = [PollFd::new(stream, PollFlags::OUT)];
    match poll(&mut fds, Some(&timeout)) {
        Ok(0) => false,
        Ok(_) => true,
        Err(rustix::io::Errno::INTR) => true,
        Err(_) => false,
    }
}

/// Writes `response` from `cursor` on until it is all sent or the socket's send buffer is
/// full, advancing `cursor` (and `from_files` by the bytes moved from files). Runs on a
/// blocking thread: `splice` and `sendfile` read the file, which may wait for the disk. A
/// read of the file that moves nothing means the file ends before the region:
/// [`Turn::Truncated`] (never a retry, which would spin).
fn send_some(
    stream: &TcpStream,
    response: &Response,
    cursor: &mut Cursor,
    from_files: &mut u64,
    direct: bool,
) -> Turn {
    let parts = response.parts();
    while let Some(part) = parts.get(cursor.part) {
        let more = cursor.part + 1 < parts.len();
        let done = match part {
            ResponsePart::Bytes(b) => {
                let rest = &b[cursor.offset..];
                let mut flags = rustix::net::SendFlags::NOSIGNAL;
                if more {
                    // A file region follows: let the kernel coalesce the small header with it.
                    flags |= rustix::net::SendFlags::MORE;
                }
                on_socket(stream, direct, || {
                    rustix::net::send(stream.as_fd(), rest, flags).map_err(io::Error::from)
                })
            }
            ResponsePart::File(region) => {
                if !region.file().is_intact() {
                    return Turn::Truncated;
                }
                if cursor.pipe.is_none() && !cursor.no_pipe {
                    cursor.pipe = Pipe::new();
                    cursor.no_pipe = cursor.pipe.is_none();
                }
                if let Some(pipe) = &cursor.pipe {
                    let step = SpliceStep {
                        sent: cursor.offset,
                        in_pipe: cursor.in_pipe,
                        more,
                        direct,
                    };
                    match splice_step(stream, region, pipe, step) {
                        Splice::Filled(n) => {
                            cursor.in_pipe = n;
                            continue;
                        }
                        Splice::Sent(n) => {
                            cursor.in_pipe -= n;
                            *from_files += n as u64;
                            Ok(n)
                        }
                        Splice::Unsupported => {
                            // Nothing is in the pipe when the file side refuses.
                            cursor.pipe = None;
                            cursor.no_pipe = true;
                            continue;
                        }
                        Splice::Truncated => return Turn::Truncated,
                        Splice::Error(e) => Err(e),
                    }
                } else {
                    let position = region.position() + cursor.offset as u64;
                    let count = (region.len() - cursor.offset).min(MAX_SENDFILE_BYTES);
                    let file = region.file().file();
                    let mut offset = position;
                    match on_socket(stream, direct, || {
                        rustix::fs::sendfile(stream.as_fd(), file.as_fd(), Some(&mut offset), count)
                            .map_err(io::Error::from)
                    }) {
                        Ok(0) => return Turn::Truncated,
                        Ok(n) => {
                            *from_files += n as u64;
                            Ok(n)
                        }
                        // A file system whose files cannot be spliced: copy this piece.
                        Err(e) if sendfile_unsupported(&e) => {
                            match copy_piece(stream, file, position, count, more, direct) {
                                Ok(0) => return Turn::Truncated,
                                other => other,
                            }
                        }
                        Err(e) => Err(e),
                    }
                }
            }
        };
        match done {
            Ok(0) => return Turn::Failed(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                cursor.offset += n;
                if cursor.offset >= part.len() {
                    cursor.part += 1;
                    cursor.offset = 0;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Turn::WouldBlock,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Turn::Failed(e),
        }
    }
    Turn::Done
}

/// Whether `sendfile` refused the file itself (not the socket): then the bytes are copied.
fn sendfile_unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error().map(rustix::io::Errno::from_raw_os_error),
        Some(rustix::io::Errno::INVAL | rustix::io::Errno::NOSYS | rustix::io::Errno::OPNOTSUPP)
    )
}

/// Reads up to `count` bytes (at most 256 KiB) of `file` at `position` and sends what the
/// socket takes: the copying fallback of [`send_some`]. `Ok(0)` when the file ends there.
fn copy_piece(
    stream: &TcpStream,
    file: &std::fs::File,
    position: u64,
    count: usize,
    more: bool,
    direct: bool,
) -> io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; count.min(256 * 1024)];
    let n = file.read_at(&mut buf, position)?;
    if n == 0 {
        return Ok(0);
    }
    let mut flags = rustix::net::SendFlags::NOSIGNAL;
    if more || n < count {
        flags |= rustix::net::SendFlags::MORE;
    }
    on_socket(stream, direct, || {
        rustix::net::send(stream.as_fd(), &buf[..n], flags).map_err(io::Error::from)
    })
}

/// Runs a non-blocking write `f` on `stream`: through tokio's readiness (`try_io`, which
/// clears it on `WouldBlock`), or `direct`ly after a `poll` of the job's own.
fn on_socket<R>(
    stream: &TcpStream,
    direct: bool,
    f: impl FnOnce() -> io::Result<R>,
) -> io::Result<R> {
    if direct {
        f()
    } else {
        stream.try_io(Interest::WRITABLE, f)
    }
}

/// What one [`splice_step`] did.
enum Splice {
    /// The empty pipe took this many bytes of the region from the file.
    Filled(usize),
    /// This many bytes went from the pipe to the socket.
    Sent(usize),
    /// The file cannot be spliced (nothing was moved): use `sendfile`.
    Unsupported,
    /// The file ends before the region does.
    Truncated,
    /// The socket failed, or it is full (`WouldBlock`).
    Error(io::Error),
}

/// Where a [`splice_step`] starts: `sent` bytes of the region are on the socket, `in_pipe`
/// wait in the pipe, `more` parts follow the region, and whether the socket is written
/// `direct`ly ([`on_socket`]).
struct SpliceStep {
    sent: usize,
    in_pipe: usize,
    more: bool,
    direct: bool,
}

/// One step of moving `region` to the socket through `pipe`: fills the pipe from the file when
/// it is empty (`in_pipe` = 0), else moves what it holds to the socket, which may take part of
/// it or nothing (`WouldBlock`, readiness cleared through `try_io` unless `direct`).
fn splice_step(
    stream: &TcpStream,
    region: &crate::response::FileRegion,
    pipe: &Pipe,
    step: SpliceStep,
) -> Splice {
    let SpliceStep {
        sent,
        in_pipe,
        more,
        direct,
    } = step;
    use rustix::pipe::{splice, SpliceFlags};
    if in_pipe == 0 {
        let mut offset = region.position() + sent as u64;
        let want = (region.len() - sent).min(pipe.capacity);
        return match splice(
            region.file().file(),
            Some(&mut offset),
            &pipe.write,
            None,
            want,
            SpliceFlags::MOVE,
        ) {
            Ok(0) => Splice::Truncated,
            Ok(n) => Splice::Filled(n),
            Err(
                rustix::io::Errno::INVAL | rustix::io::Errno::NOSYS | rustix::io::Errno::OPNOTSUPP,
            ) => Splice::Unsupported,
            Err(e) => Splice::Error(e.into()),
        };
    }
    let mut flags = SpliceFlags::MOVE | SpliceFlags::NONBLOCK;
    if more || sent + in_pipe < region.len() {
        flags |= SpliceFlags::MORE;
    }
    match on_socket(stream, direct, || {
        splice(&pipe.read, None, stream, None, in_pipe, flags).map_err(io::Error::from)
    }) {
        Ok(n) => Splice::Sent(n),
        Err(e) => Splice::Error(e),
    }
}
