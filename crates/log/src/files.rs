//! Segment files opened on demand: a process-wide, bounded set of open file descriptors.
//!
//! Kafka keeps one descriptor per segment for as long as the segment exists, so a broker's
//! partitions are bounded by `ulimit -n`. gregor's segments hold a [`SegmentFile`] instead: a
//! path and, while the file is in use, an open descriptor. Every segment file of every partition
//! shares one budget ([`set_max_open_files`]); when opening a file would exceed it, the file
//! least recently used is closed (the CLOCK "second chance" algorithm: a hit sets a flag without
//! any shared lock, the eviction sweep clears flags and closes the first file whose flag is
//! clear). Files not used for a while are closed too ([`close_idle_files`], which the broker
//! calls every minute), so an idle partition holds no descriptor, whatever the budget; a closed
//! file is reopened by its path on its next use.
//!
//! Durability is unchanged by a close: data written through a descriptor stays in the page
//! cache, and `fsync` through a later descriptor of the same file flushes it (Linux keeps dirty
//! pages and write-back errors per inode, and reports an error no descriptor has seen yet to
//! the next `fsync`).
//!
//! Readers hold an `Arc<File>` only for the duration of one read or write, so the number of
//! descriptors open at once exceeds the budget by at most the number of operations in flight.
//!
//! A fetch response sent from the file (zero-copy, [`SendPin`]) holds its descriptor until its
//! bytes are on the socket, which may take as long as the client takes to read them. Such a
//! file is *pinned*: the CLOCK hand, [`close_idle_files`] and [`SegmentFile::close`] pass it
//! by, so its descriptor
//! stays counted in the budget and is never closed under the sender. At most
//! [`max_send_pinned_files`] files (half the budget) are pinned at once, so eviction always
//! has unpinned files to close; a read that finds no room for a pin copies the bytes instead.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::error::{LogError, Result};

/// The budget when the broker sets none: half of a typical `ulimit -n` of 1024.
const DEFAULT_MAX_OPEN_FILES: usize = 512;
/// The smallest budget accepted (a partition's active segment needs three files at once).
pub const MIN_MAX_OPEN_FILES: usize = 16;

/// The process-wide set of open segment files.
struct OpenFiles {
    max: AtomicUsize,
    /// Slots that hold an open file, in the order the CLOCK hand visits them.
    ring: Mutex<VecDeque<Weak<Slot>>>,
    /// Descriptors held by slots (not counting those only readers still hold).
    open: AtomicUsize,
    /// Files opened since start (for the `gregor_log_segment_files_opened_total` counter).
    opened_total: AtomicU64,
    /// Files closed by the budget since start.
    evicted_total: AtomicU64,
    /// Files with at least one [`SendPin`].
    send_pinned: AtomicUsize,
    /// Files closed by [`close_idle_files`] since start.
    idle_closed_total: AtomicU64,
}

static OPEN_FILES: OpenFiles = OpenFiles {
    max: AtomicUsize::new(DEFAULT_MAX_OPEN_FILES),
    ring: Mutex::new(VecDeque::new()),
    open: AtomicUsize::new(0),
    opened_total: AtomicU64::new(0),
    evicted_total: AtomicU64::new(0),
    send_pinned: AtomicUsize::new(0),
    idle_closed_total: AtomicU64::new(0),
};

/// Sets how many segment files (`.log`, `.index`, `.timeindex`) the process keeps open at once,
/// at least [`MIN_MAX_OPEN_FILES`]. The broker derives it from its open-file limit at start-up;
/// files above a lowered budget are closed as they are next evicted.
pub fn set_max_open_files(max: usize) {
    OPEN_FILES
        .max
        .store(max.max(MIN_MAX_OPEN_FILES), Ordering::Relaxed);
}

/// The budget [`set_max_open_files`] set.
pub fn max_open_files() -> usize {
    OPEN_FILES.max.load(Ordering::Relaxed)
}

/// The most files that fetch responses being sent may pin at once ([`SendPin`]): half the
/// budget, so that the CLOCK hand always finds files it may close.
pub fn max_send_pinned_files() -> usize {
    max_open_files() / 2
}

/// Files pinned by responses being sent now.
pub fn send_pinned_files() -> usize {
    OPEN_FILES.send_pinned.load(Ordering::Relaxed)
}

/// What [`size_from_process_limit`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFileLimit {
    /// `RLIMIT_NOFILE`'s soft limit before start-up raised it.
    pub soft_before: u64,
    /// The soft limit now (the hard limit, when raising it was allowed).
    pub soft: u64,
    /// The hard limit.
    pub hard: Option<u64>,
    /// The segment file budget set ([`max_open_files`]): half the soft limit, the other half
    /// left for connections, sockets between nodes and everything else.
    pub budget: usize,
}

/// Raises the process's soft open-file limit (`RLIMIT_NOFILE`) to its hard limit, as Kafka's
/// documentation advises operators to do by hand, and sets the segment file budget to half of
/// the result. An unlimited hard limit is capped at 1,048,576 (Linux's default `nr_open`).
pub fn size_from_process_limit() -> OpenFileLimit {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    const NR_OPEN: u64 = 1 << 20;
    let current = getrlimit(Resource::Nofile);
    let soft_before = current.current.unwrap_or(NR_OPEN);
    let target = current.maximum.unwrap_or(NR_OPEN);
    let mut soft = soft_before;
    if target > soft_before {
        let raised = Rlimit {
            current: Some(target),
            maximum: current.maximum,
        };
        if setrlimit(Resource::Nofile, raised).is_ok() {
            soft = target;
        }
    }
    let budget = usize::try_from(soft / 2).unwrap_or(usize::MAX);
    set_max_open_files(budget);
    OpenFileLimit {
        soft_before,
        soft,
        hard: current.maximum,
        budget: max_open_files(),
    }
}

/// Open-file figures of the segment file budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFileStats {
    /// Segment files open now.
    pub open: usize,
    /// The budget ([`max_open_files`]).
    pub max: usize,
    /// Files opened since the process started.
    pub opened_total: u64,
    /// Files closed to stay within the budget since the process started.
    pub evicted_total: u64,
    /// Files closed because they were idle ([`close_idle_files`]) since the process started.
    pub idle_closed_total: u64,
}

/// The budget's current figures.
pub fn open_file_stats() -> OpenFileStats {
    OpenFileStats {
        open: OPEN_FILES.open.load(Ordering::Relaxed),
        max: max_open_files(),
        opened_total: OPEN_FILES.opened_total.load(Ordering::Relaxed),
        evicted_total: OPEN_FILES.evicted_total.load(Ordering::Relaxed),
        idle_closed_total: OPEN_FILES.idle_closed_total.load(Ordering::Relaxed),
    }
}

/// Closes every open file not used since the previous call (its CLOCK flag is clear) and
/// clears the flag of the others, so that a file idle for between one and two periods of the
/// caller's schedule is closed: descriptors follow the partitions in use, not the budget.
/// Files held by a reader stay open until it drops them; a closed file reopens on its next use.
/// Returns how many files it closed.
pub fn close_idle_files() -> usize {
    let mut closing = Vec::new();
    {
        let mut ring = OPEN_FILES.ring.lock();
        for _ in 0..ring.len() {
            let Some(weak) = ring.pop_front() else {
                break;
            };
            let Some(slot) = weak.upgrade() else {
                continue;
            };
            if slot.referenced.swap(false, Ordering::Relaxed) {
                ring.push_back(weak);
                continue;
            }
            let taken = {
                let mut file = slot.file.lock();
                // A file a response is being sent from stays open (see `evict`).
                if slot.send_pins.load(Ordering::Acquire) > 0 {
                    drop(file);
                    ring.push_back(weak);
                    continue;
                }
                // As in `evict`: leave the ring before giving up the file, so that a
                // concurrent reopen puts the slot back into the ring.
                slot.in_ring.store(false, Ordering::Relaxed);
                file.take()
            };
            if let Some(f) = taken {
                OPEN_FILES.open.fetch_sub(1, Ordering::Relaxed);
                closing.push(f);
            }
        }
    }
    OPEN_FILES
        .idle_closed_total
        .fetch_add(closing.len() as u64, Ordering::Relaxed);
    // Close outside the ring lock.
    let closed = closing.len();
    drop(closing);
    closed
}

struct Slot {
    path: Mutex<PathBuf>,
    file: Mutex<Option<Arc<File>>>,
    /// A descriptor kept outside the budget ([`SegmentFile::pin`]): the file is being
    /// deleted and readers that still hold its segment must keep reading it.
    pinned: Mutex<Option<Arc<File>>>,
    /// Set on every use; the CLOCK hand clears it once before closing the file.
    referenced: AtomicBool,
    /// Whether the ring holds an entry for this slot.
    in_ring: AtomicBool,
    /// Live [`SendPin`]s: while above 0 the descriptor is neither evicted nor closed.
    send_pins: AtomicUsize,
    /// Times the file was cut shorter while the log was served
    /// ([`SegmentFile::note_truncation`]).
    truncations: AtomicU64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.file.get_mut().take().is_some() {
            OPEN_FILES.open.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// One segment file, open while in use (see the module docs). Opened for reading and writing;
/// never created by a reopen.
pub(crate) struct SegmentFile {
    slot: Arc<Slot>,
}

impl SegmentFile {
    /// Opens `path` (creating it, or truncating an existing file, when `create` is set) and
    /// keeps the descriptor within the budget.
    ///
    /// # Errors
    /// [`LogError::Io`] naming `what` and the path.
    pub(crate) fn open(path: &Path, create: bool, what: &'static str) -> Result<Self> {
        let mut opts = OpenOptions::new();
        opts.read(true).write(true);
        if create {
            opts.create(true).truncate(true);
        }
        let file = opts.open(path).map_err(|e| LogError::io(what, path, e))?;
        OPEN_FILES.opened_total.fetch_add(1, Ordering::Relaxed);
        let f = Self {
            slot: Arc::new(Slot {
                path: Mutex::new(path.to_path_buf()),
                file: Mutex::new(None),
                pinned: Mutex::new(None),
                referenced: AtomicBool::new(false),
                in_ring: AtomicBool::new(false),
                send_pins: AtomicUsize::new(0),
                truncations: AtomicU64::new(0),
            }),
        };
        f.install(Arc::new(file));
        Ok(f)
    }

    /// Refers to `path` without opening it: the first [`SegmentFile::get`] opens it.
    pub(crate) fn closed(path: &Path) -> Self {
        Self {
            slot: Arc::new(Slot {
                path: Mutex::new(path.to_path_buf()),
                file: Mutex::new(None),
                pinned: Mutex::new(None),
                referenced: AtomicBool::new(false),
                in_ring: AtomicBool::new(false),
                send_pins: AtomicUsize::new(0),
                truncations: AtomicU64::new(0),
            }),
        }
    }

    /// The file's current path.
    pub(crate) fn path(&self) -> PathBuf {
        self.slot.path.lock().clone()
    }

    /// Records that the file was renamed to `path` (the descriptor, if open, stays valid).
    pub(crate) fn set_path(&self, path: PathBuf) {
        *self.slot.path.lock() = path;
    }

    /// Whether a descriptor is open now.
    #[cfg(test)]
    pub(crate) fn is_open(&self) -> bool {
        self.slot.file.lock().is_some()
    }

    /// The open descriptor, reopening the file by its path if the budget closed it.
    ///
    /// # Errors
    /// [`LogError::Io`] naming `what` when the file cannot be reopened (e.g. it was deleted).
    pub(crate) fn get(&self, what: &'static str) -> Result<Arc<File>> {
        if let Some(f) = self.slot.file.lock().as_ref() {
            self.slot.referenced.store(true, Ordering::Relaxed);
            return Ok(Arc::clone(f));
        }
        if let Some(f) = self.slot.pinned.lock().as_ref() {
            return Ok(Arc::clone(f));
        }
        let path = self.path();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| LogError::io(what, &path, e))?;
        OPEN_FILES.opened_total.fetch_add(1, Ordering::Relaxed);
        Ok(self.install(Arc::new(file)))
    }

    /// [`SegmentFile::get`], creating the file (empty) if it is missing.
    ///
    /// # Errors
    /// [`LogError::Io`] naming `what` when the file cannot be opened or created.
    pub(crate) fn get_creating(&self, what: &'static str) -> Result<Arc<File>> {
        match self.get(what) {
            Err(LogError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                let path = self.path();
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(&path)
                    .map_err(|e| LogError::io(what, &path, e))?;
                OPEN_FILES.opened_total.fetch_add(1, Ordering::Relaxed);
                Ok(self.install(Arc::new(file)))
            }
            other => other,
        }
    }

    /// Keeps a descriptor open, outside the budget, for as long as this `SegmentFile` lives:
    /// called before the file is renamed for deletion, so that readers still holding the
    /// segment read it to the end (as Kafka keeps a deleted segment's channel open until
    /// `file.delete.delay.ms`), though its name changes and then disappears.
    ///
    /// # Errors
    /// [`LogError::Io`] naming `what` when the file cannot be opened.
    pub(crate) fn pin(&self, what: &'static str) -> Result<()> {
        let f = self.get(what)?;
        *self.slot.pinned.lock() = Some(f);
        Ok(())
    }

    /// Closes the descriptor now (the file stays; the next use reopens it). A file pinned by a
    /// response being sent keeps its descriptor until the last pin goes (then the CLOCK hand or
    /// the end of this `SegmentFile` closes it).
    pub(crate) fn close(&self) {
        let mut file = self.slot.file.lock();
        if self.slot.send_pins.load(Ordering::Acquire) > 0 {
            return;
        }
        if file.take().is_some() {
            OPEN_FILES.open.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Records that the file is about to be cut shorter (a follower's truncation): a
    /// [`SendPin`] taken before sees it ([`SendPin::is_intact`]).
    pub(crate) fn note_truncation(&self) {
        self.slot.truncations.fetch_add(1, Ordering::AcqRel);
    }

    /// How many times the file was cut shorter so far; read before deciding which bytes a
    /// [`SendPin`] taken afterwards will send.
    pub(crate) fn truncations(&self) -> u64 {
        self.slot.truncations.load(Ordering::Acquire)
    }

    /// Pins the file for a response that will send its bytes from the descriptor
    /// ([`SendPin`]); `truncations` is what [`SegmentFile::truncations`] said before the bytes
    /// to send were chosen. `Ok(None)` when [`max_send_pinned_files`] files are pinned
    /// already (the caller copies the bytes instead).
    ///
    /// # Errors
    /// [`LogError::Io`] naming `what` when the file cannot be reopened.
    pub(crate) fn send_pin(&self, truncations: u64, what: &'static str) -> Result<Option<SendPin>> {
        if self.slot.send_pins.fetch_add(1, Ordering::AcqRel) == 0 {
            let max = max_send_pinned_files();
            let taken =
                OPEN_FILES
                    .send_pinned
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                        (n < max).then_some(n + 1)
                    });
            if taken.is_err() {
                self.slot.send_pins.fetch_sub(1, Ordering::AcqRel);
                return Ok(None);
            }
        }
        let counted = PinCount(Arc::clone(&self.slot));
        // From here the CLOCK hand passes the slot by, so the descriptor `get` returns (or
        // reopens and installs) stays in it until the pin is dropped.
        let file = self.get(what)?;
        Ok(Some(SendPin {
            counted,
            file,
            truncations,
        }))
    }

    /// Stores `file` in the slot (unless another thread was first) and evicts beyond the budget.
    fn install(&self, file: Arc<File>) -> Arc<File> {
        let file = {
            let mut slot_file = self.slot.file.lock();
            if let Some(existing) = slot_file.as_ref() {
                return Arc::clone(existing);
            }
            // A newly opened file starts without its second chance: a file used once (a scan
            // at start-up, a read of an old segment) goes before the files in steady use.
            *slot_file = Some(Arc::clone(&file));
            file
        };
        let open = OPEN_FILES.open.fetch_add(1, Ordering::Relaxed) + 1;
        let mut closing = Vec::new();
        {
            let mut ring = OPEN_FILES.ring.lock();
            if !self.slot.in_ring.swap(true, Ordering::Relaxed) {
                ring.push_back(Arc::downgrade(&self.slot));
            }
            let max = max_open_files();
            if open > max {
                evict(&mut ring, open - max, &self.slot, &mut closing);
            }
            // Entries of dropped or already closed slots are skipped by the hand; keep the ring
            // from growing with them when nothing is evicted for a long time.
            if ring.len() > 2 * max.max(OPEN_FILES.open.load(Ordering::Relaxed)) + 64 {
                ring.retain(|w| match w.upgrade() {
                    Some(s) if s.file.lock().is_some() => true,
                    Some(s) => {
                        s.in_ring.store(false, Ordering::Relaxed);
                        false
                    }
                    None => false,
                });
            }
        }
        // Close outside the ring lock.
        drop(closing);
        file
    }
}

/// A segment file's descriptor held open for a response that sends bytes from it (zero-copy
/// fetch): the file is pinned (see the module docs) until every `SendPin` of it is dropped.
/// The bytes stay those the response was built from even if the file is renamed, deleted
/// (retention, DeleteRecords) or replaced (compaction), since the descriptor keeps the old
/// file; only a truncation in place changes them, which [`SendPin::is_intact`] tells.
pub struct SendPin {
    counted: PinCount,
    file: Arc<File>,
    truncations: u64,
}

/// One count in a slot's `send_pins` (and the slot in `send_pinned` while it has any).
struct PinCount(Arc<Slot>);

impl Drop for PinCount {
    fn drop(&mut self) {
        if self.0.send_pins.fetch_sub(1, Ordering::AcqRel) == 1 {
            OPEN_FILES.send_pinned.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl SendPin {
    /// The open file.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// False once the file was cut shorter (a follower's truncation) after the bytes to send
    /// were chosen: they may be gone or replaced, and the response must not be sent from it.
    pub fn is_intact(&self) -> bool {
        self.counted.0.truncations.load(Ordering::Acquire) == self.truncations
    }
}

impl Clone for SendPin {
    fn clone(&self) -> Self {
        // The slot already counts in `send_pinned`: another pin of it only adds to its count.
        self.counted.0.send_pins.fetch_add(1, Ordering::AcqRel);
        Self {
            counted: PinCount(Arc::clone(&self.counted.0)),
            file: Arc::clone(&self.file),
            truncations: self.truncations,
        }
    }
}

impl std::fmt::Debug for SendPin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendPin")
            .field("path", &*self.counted.0.path.lock())
            .field("intact", &self.is_intact())
            .finish()
    }
}

/// Moves the CLOCK hand until `want` files are closed (or every entry was visited twice),
/// never closing `keep`. Closed descriptors go to `closing`, dropped after the lock.
fn evict(
    ring: &mut VecDeque<Weak<Slot>>,
    want: usize,
    keep: &Arc<Slot>,
    closing: &mut Vec<Arc<File>>,
) {
    let mut closed = 0;
    let mut visits = 2 * ring.len();
    while closed < want && visits > 0 {
        visits -= 1;
        let Some(weak) = ring.pop_front() else {
            return;
        };
        let Some(slot) = weak.upgrade() else {
            continue;
        };
        if Arc::ptr_eq(&slot, keep)
            || slot.send_pins.load(Ordering::Acquire) > 0
            || slot.referenced.swap(false, Ordering::Relaxed)
        {
            ring.push_back(weak);
            continue;
        }
        let taken = {
            let mut file = slot.file.lock();
            // Checked again under the file's lock, which a new pin's `get` takes after
            // counting itself: a file pinned meanwhile is not closed.
            if slot.send_pins.load(Ordering::Acquire) > 0 {
                drop(file);
                ring.push_back(weak);
                continue;
            }
            // Leave the ring before giving up the file, so that a concurrent reopen (which
            // installs under this lock) puts the slot back into the ring.
            slot.in_ring.store(false, Ordering::Relaxed);
            file.take()
        };
        if let Some(f) = taken {
            OPEN_FILES.open.fetch_sub(1, Ordering::Relaxed);
            OPEN_FILES.evicted_total.fetch_add(1, Ordering::Relaxed);
            closing.push(f);
            closed += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    /// The budget is process-wide: tests that change it run one at a time.
    pub(crate) static BUDGET_LOCK: Mutex<()> = Mutex::new(());

    #[test]
    fn files_beyond_the_budget_are_closed_and_reopened_on_use() {
        let _serial = BUDGET_LOCK.lock();
        let before = max_open_files();
        set_max_open_files(MIN_MAX_OPEN_FILES);
        let dir = tempfile::tempdir().unwrap();
        let files: Vec<SegmentFile> = (0..64)
            .map(|i| {
                let f = SegmentFile::open(&dir.path().join(format!("{i}.log")), true, "t").unwrap();
                f.get("t").unwrap().write_all_at(&[i as u8], 0).unwrap();
                f
            })
            .collect();
        let open = files.iter().filter(|f| f.is_open()).count();
        assert!(open <= MIN_MAX_OPEN_FILES, "{open} open");
        // Every file reads back through a reopened descriptor.
        for (i, f) in files.iter().enumerate() {
            let mut b = [0u8; 1];
            f.get("t").unwrap().read_exact_at(&mut b, 0).unwrap();
            assert_eq!(b[0], i as u8);
        }
        assert!(files.iter().filter(|f| f.is_open()).count() <= MIN_MAX_OPEN_FILES);
        // A renamed file is reopened by its new name.
        let f = &files[0];
        f.close();
        let new = dir.path().join("0.log.deleted");
        std::fs::rename(f.path(), &new).unwrap();
        assert!(f.get("t").is_err());
        f.set_path(new);
        assert!(f.get("t").is_ok());
        drop(files);
        set_max_open_files(before);
    }

    #[test]
    fn a_file_in_use_keeps_its_descriptor() {
        let _serial = BUDGET_LOCK.lock();
        let before = max_open_files();
        set_max_open_files(MIN_MAX_OPEN_FILES);
        let dir = tempfile::tempdir().unwrap();
        let hot = SegmentFile::open(&dir.path().join("hot.log"), true, "t").unwrap();
        let mut cold = Vec::new();
        for i in 0..200 {
            cold.push(SegmentFile::open(&dir.path().join(format!("{i}.log")), true, "t").unwrap());
            // Used between every open: the second chance keeps it.
            hot.get("t").unwrap();
        }
        assert!(hot.is_open());
        drop(cold);
        set_max_open_files(before);
    }

    #[test]
    fn a_pinned_file_is_never_closed_and_pins_are_bounded() {
        let _serial = BUDGET_LOCK.lock();
        let before = max_open_files();
        set_max_open_files(MIN_MAX_OPEN_FILES);
        let dir = tempfile::tempdir().unwrap();
        let pinned = SegmentFile::open(&dir.path().join("pinned.log"), true, "t").unwrap();
        pinned.get("t").unwrap().write_all_at(b"kept", 0).unwrap();
        let pin = pinned.send_pin(pinned.truncations(), "t").unwrap().unwrap();
        // Never used again, and many files opened after it: the hand passes it by.
        let others: Vec<SegmentFile> = (0..100)
            .map(|i| SegmentFile::open(&dir.path().join(format!("{i}.log")), true, "t").unwrap())
            .collect();
        assert!(pinned.is_open(), "evicted while pinned");
        assert!(open_file_stats().open <= MIN_MAX_OPEN_FILES + 1);
        // Nor does the idle sweep (twice: the first only clears the flags), or an explicit
        // close.
        close_idle_files();
        close_idle_files();
        assert!(pinned.is_open(), "swept while pinned");
        pinned.close();
        assert!(pinned.is_open(), "closed while pinned");
        let mut b = [0u8; 4];
        pin.file().read_exact_at(&mut b, 0).unwrap();
        assert_eq!(&b, b"kept");
        // A second pin of the same file counts once; half the budget may be pinned.
        let again = pin.clone();
        assert_eq!(send_pinned_files(), 1);
        let max = max_send_pinned_files();
        assert_eq!(max, MIN_MAX_OPEN_FILES / 2);
        let mut pins: Vec<SendPin> = others[..max - 1]
            .iter()
            .map(|f| {
                f.send_pin(f.truncations(), "t")
                    .unwrap()
                    .expect("a free pin")
            })
            .collect();
        assert_eq!(send_pinned_files(), max);
        let full = &others[max];
        assert!(
            full.send_pin(full.truncations(), "t").unwrap().is_none(),
            "beyond the bound"
        );
        pins.pop();
        assert!(
            full.send_pin(full.truncations(), "t").unwrap().is_some(),
            "a pin was freed"
        );
        drop((pin, again, pins));
        assert_eq!(send_pinned_files(), 0);
        // Unpinned, it is closed like any other file.
        pinned.close();
        assert!(!pinned.is_open());
        drop(others);
        set_max_open_files(before);
    }

    #[test]
    fn a_truncation_after_the_pin_was_decided_breaks_it() {
        // Pins are counted process-wide: not beside the test that counts them.
        let _serial = BUDGET_LOCK.lock();
        let dir = tempfile::tempdir().unwrap();
        let f = SegmentFile::open(&dir.path().join("t.log"), true, "t").unwrap();
        let seen = f.truncations();
        f.note_truncation();
        let late = f.send_pin(seen, "t").unwrap().unwrap();
        assert!(!late.is_intact());
        let fresh = f.send_pin(f.truncations(), "t").unwrap().unwrap();
        assert!(fresh.is_intact());
    }

    #[test]
    fn idle_files_are_closed_and_reopen_on_use() {
        let _serial = BUDGET_LOCK.lock();
        let dir = tempfile::tempdir().unwrap();
        let hot = SegmentFile::open(&dir.path().join("hot.log"), true, "t").unwrap();
        let cold = SegmentFile::open(&dir.path().join("cold.log"), true, "t").unwrap();
        cold.get("t").unwrap().write_all_at(b"c", 0).unwrap();
        let closed_before = open_file_stats().idle_closed_total;
        hot.get("t").unwrap().write_all_at(b"h", 0).unwrap();
        close_idle_files();
        // Both were used since they were opened: the first sweep only clears their flags.
        assert!(hot.is_open() && cold.is_open());
        let held = hot.get("t").unwrap();
        close_idle_files();
        assert!(hot.is_open(), "used since the last sweep");
        assert!(!cold.is_open(), "idle for a whole period");
        close_idle_files();
        assert!(!hot.is_open());
        assert!(open_file_stats().idle_closed_total >= closed_before + 2);
        // A reader that still holds the descriptor keeps reading through it.
        let mut b = [0u8; 1];
        held.read_exact_at(&mut b, 0).unwrap();
        assert_eq!(&b, b"h");
        // A closed file reopens on its next use.
        cold.get("t").unwrap().read_exact_at(&mut b, 0).unwrap();
        assert_eq!(&b, b"c");
        assert!(cold.is_open());
    }
}
