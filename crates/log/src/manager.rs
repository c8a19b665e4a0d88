//! [`LogManager`]: every partition log under `log.dirs` (Kafka's `LogManager`).
//!
//! Per log directory it keeps Kafka's files: `.lock` (one broker per directory, [`lock_dir`]),
//! `.kafka_cleanshutdown` (written after a clean shutdown, removed once the logs are loaded so
//! that a later crash is seen as unclean) and `recovery-point-offset-checkpoint`
//! (`0\n<count>\n<topic> <partition> <offset>\n...`, offsets below which each log is fsynced;
//! recovery after a crash starts there).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::checkpoint::{parse_checkpoint, sync_dir, write_atomically};
use crate::clock::SharedClock;
use crate::config::{LogConfig, TopicPartition};
use crate::error::{LogError, Result};
use crate::health::{DirState, LogDirHealth};
use crate::log::PartitionLog;

/// Kafka's clean-shutdown marker file in each log directory.
pub const CLEAN_SHUTDOWN_FILE: &str = ".kafka_cleanshutdown";
/// Kafka's per-directory recovery point checkpoint.
pub const RECOVERY_POINT_CHECKPOINT: &str = "recovery-point-offset-checkpoint";
/// Kafka's per-directory log start offset checkpoint (retention and DeleteRecords move it).
pub const LOG_START_OFFSET_CHECKPOINT: &str = "log-start-offset-checkpoint";
/// Kafka's per-directory cleaner checkpoint: each compacted log's first dirty offset.
pub const CLEANER_OFFSET_CHECKPOINT: &str = "cleaner-offset-checkpoint";
/// Kafka's per-directory high watermark checkpoint (`ReplicaManager`'s
/// `replication-offset-checkpoint`, written every `replica.high.watermark.checkpoint.interval.ms`).
pub const REPLICATION_OFFSET_CHECKPOINT: &str = "replication-offset-checkpoint";
/// Kafka's per-partition topic id file.
pub const PARTITION_METADATA_FILE: &str = "partition.metadata";
const LOCK_FILE: &str = ".lock";

struct Entry {
    log: Arc<PartitionLog>,
    dir_index: usize,
    topic_id: Option<[u8; 16]>,
}

/// The directories whose `.lock` this process holds ([`lock_dir`]): a second lock of one of
/// them is refused without opening the file, because closing any descriptor of a file drops
/// every `fcntl` lock the process holds on it.
static HELD_DIRS: std::sync::Mutex<std::collections::BTreeSet<PathBuf>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// A held `<dir>/.lock` ([`lock_dir`]); released when dropped.
#[derive(Debug)]
pub struct DirLock {
    file: Option<File>,
    key: PathBuf,
}

impl Drop for DirLock {
    fn drop(&mut self) {
        // Close (releasing both locks) before another thread may open the file again.
        drop(self.file.take());
        HELD_DIRS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&self.key);
    }
}

/// Takes `dir`'s `.lock` (Kafka's `FileLock` on `<dir>/.lock`): one process per log
/// directory, until the returned [`DirLock`] is dropped. Two locks are held on the file:
/// - an `fcntl` record lock on the whole file (`F_SETLK`), the lock Java's `FileLock` takes on
///   Linux, so a Kafka broker or tool (kafka-metadata-shell, kafka-storage) and gregor exclude
///   each other on one directory;
/// - an `flock`, the lock earlier gregor versions took alone.
///
/// Within this process a directory already held is refused before its file is opened
/// (`fcntl` locks belong to the process, and closing any descriptor of the file drops them).
///
/// # Errors
/// [`LogError::DirLocked`] when this or another process holds it; [`LogError::Io`] when the
/// file cannot be opened or created.
pub fn lock_dir(dir: &Path) -> Result<DirLock> {
    let key = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let mut held = HELD_DIRS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if held.contains(&key) {
        return Err(LogError::DirLocked(dir.display().to_string()));
    }
    let lock_path = dir.join(LOCK_FILE);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock_path)
        .map_err(|e| LogError::io("opening", &lock_path, e))?;
    rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive)
        .map_err(|_| LogError::DirLocked(dir.display().to_string()))?;
    rustix::fs::fcntl_lock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive)
        .map_err(|_| LogError::DirLocked(dir.display().to_string()))?;
    held.insert(key.clone());
    Ok(DirLock {
        file: Some(file),
        key,
    })
}

/// Owns the log directories and the partition logs in them.
pub struct LogManager {
    log_dirs: Vec<PathBuf>,
    default_config: LogConfig,
    logs: Mutex<HashMap<TopicPartition, Entry>>,
    /// Holds each directory's `.lock` ([`lock_dir`]) for the manager's lifetime.
    _locks: Vec<DirLock>,
    /// The clock handed to every log it opens.
    clock: SharedClock,
    /// This broker's epoch, written into `.kafka_cleanshutdown` at a clean shutdown (-1 until
    /// set); see [`read_clean_shutdown_broker_epoch`].
    broker_epoch: std::sync::atomic::AtomicI64,
    /// Each log directory's health, in `log_dirs` order, shared with the logs in it.
    health: Vec<Arc<LogDirHealth>>,
    /// Threads per log directory that load logs at start-up and close them at shutdown
    /// (`num.recovery.threads.per.data.dir`).
    recovery_threads: usize,
    /// Each log directory's id (`directory.id` of its `meta.properties`, KIP-858), in
    /// `log_dirs` order, when the broker told ([`LogManager::set_dir_ids`]).
    dir_ids: Mutex<Vec<Option<[u8; 16]>>>,
}

/// A log opened at start-up and its `partition.metadata` topic id.
type LoadedLog = (Option<[u8; 16]>, Arc<PartitionLog>);

/// A log [`LogManager::load_dir`] opened: its partition, topic id and log.
type DirLog = (TopicPartition, Option<[u8; 16]>, Arc<PartitionLog>);

/// Kafka's default `num.recovery.threads.per.data.dir`.
pub const DEFAULT_RECOVERY_THREADS_PER_DATA_DIR: usize = 2;

/// Runs `f` on every item with up to `threads` threads; the results are in item order.
fn parallel_map<T: Sync, R: Send>(
    items: &[T],
    threads: usize,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    let threads = threads.min(items.len());
    if threads <= 1 {
        return items.iter().map(f).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut done: Vec<(usize, R)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut out = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(item) = items.get(i) else {
                            return out;
                        };
                        out.push((i, f(item)));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| match w.join() {
                Ok(out) => out,
                Err(panic) => std::panic::resume_unwind(panic),
            })
            .collect()
    });
    done.sort_unstable_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, r)| r).collect()
}

/// The broker epoch a clean shutdown left in every log dir's `.kafka_cleanshutdown`
/// (`{"version":0,"brokerEpoch":N}`, Kafka's `CleanShutdownFileHandler`), for the
/// `PreviousBrokerEpoch` of the next BrokerRegistration (KIP-966: a broker that did not shut
/// down cleanly leaves every ISR and ELR when it registers again). -1 when any dir lacks the
/// file or has an unreadable one, or the dirs disagree (Kafka's
/// `readBrokerEpochFromCleanShutdownFiles`). Read before the logs are loaded: loading removes
/// the files.
pub fn read_clean_shutdown_broker_epoch(log_dirs: &[PathBuf]) -> i64 {
    let mut epoch = None;
    for dir in log_dirs {
        let Ok(text) = std::fs::read_to_string(dir.join(CLEAN_SHUTDOWN_FILE)) else {
            return -1;
        };
        let Some(this) = parse_clean_shutdown_epoch(&text) else {
            return -1;
        };
        if epoch.is_some_and(|e| e != this) {
            return -1;
        }
        epoch = Some(this);
    }
    epoch.unwrap_or(-1)
}

/// The `brokerEpoch` of a `.kafka_cleanshutdown` file's JSON (None when absent or not a
/// number; an empty file from an older gregor or Kafka has none).
fn parse_clean_shutdown_epoch(text: &str) -> Option<i64> {
    let rest = &text[text.find("\"brokerEpoch\"")? + "\"brokerEpoch\"".len()..];
    let rest = rest.trim_start().strip_prefix(':')?.trim_start();
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '-'))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// Encodes a topic id as Kafka's `Uuid.toString`: URL-safe base64 without padding.
pub fn topic_id_to_string(id: &[u8; 16]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(22);
    for chunk in id.chunks(3) {
        let mut n = 0u32;
        for (i, b) in chunk.iter().enumerate() {
            n |= u32::from(*b) << (16 - 8 * i);
        }
        let chars = chunk.len() + 1;
        for i in 0..chars {
            out.push(ALPHABET[((n >> (18 - 6 * i)) & 0x3f) as usize] as char);
        }
    }
    out
}

/// Decodes [`topic_id_to_string`]'s format; `None` if it is not 22 base64url characters.
pub fn topic_id_from_string(s: &str) -> Option<[u8; 16]> {
    fn val(c: u8) -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' => 62,
            b'_' => 63,
            _ => return None,
        } as u32)
    }
    let s = s.as_bytes();
    if s.len() != 22 {
        return None;
    }
    let mut out = [0u8; 16];
    let mut o = 0;
    for chunk in s.chunks(4) {
        let mut n = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            n |= val(*c)? << (18 - 6 * i);
        }
        for i in 0..chunk.len() - 1 {
            out[o] = (n >> (16 - 8 * i)) as u8;
            o += 1;
        }
    }
    Some(out)
}

fn read_partition_metadata(dir: &Path) -> Result<Option<[u8; 16]>> {
    let path = dir.join(PARTITION_METADATA_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(LogError::io("reading", &path, e)),
    };
    let corrupt = |reason: &str| LogError::CorruptFile {
        path: path.display().to_string(),
        reason: reason.to_string(),
    };
    let mut lines = text.lines();
    if lines.next().map(str::trim) != Some("version: 0") {
        return Err(corrupt("expected \"version: 0\""));
    }
    let id = lines
        .next()
        .and_then(|l| l.trim().strip_prefix("topic_id: "))
        .and_then(|s| topic_id_from_string(s.trim()))
        .ok_or_else(|| corrupt("expected \"topic_id: <base64url uuid>\""))?;
    Ok(Some(id))
}

/// The KRaft metadata topic (`__cluster_metadata`, KIP-500), whose one partition lives in a log
/// dir beside the data partitions but is opened by gregor-raft, never by the [`LogManager`].
pub const CLUSTER_METADATA_TOPIC: &str = "__cluster_metadata";

fn write_partition_metadata(dir: &Path, topic_id: &[u8; 16]) -> Result<()> {
    let text = format!("version: 0\ntopic_id: {}", topic_id_to_string(topic_id));
    write_atomically(&dir.join(PARTITION_METADATA_FILE), text.as_bytes(), true)
}

fn read_recovery_points(dir: &Path) -> Result<HashMap<TopicPartition, i64>> {
    read_offset_checkpoint(dir, RECOVERY_POINT_CHECKPOINT)
}

/// Reads one of Kafka's offset checkpoint files (`0\n<count>\n<topic> <partition> <offset>`);
/// a missing file is empty.
fn read_offset_checkpoint(dir: &Path, file: &str) -> Result<HashMap<TopicPartition, i64>> {
    let path = dir.join(file);
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(parse_checkpoint(&path, &text, 0, |f| match f {
            [t, p, o] => Some((TopicPartition::new(*t, p.parse().ok()?), o.parse().ok()?)),
            _ => None,
        })?
        .into_iter()
        .collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(HashMap::new()),
        Err(e) => Err(LogError::io("reading", &path, e)),
    }
}

impl std::fmt::Debug for LogManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogManager")
            .field("log_dirs", &self.log_dirs)
            .field("partitions", &self.logs.lock().len())
            .finish_non_exhaustive()
    }
}

impl LogManager {
    /// Opens every log directory: creates missing ones, checks each is writable, locks it
    /// (`.lock`), finishes interrupted deletions (`*-delete` directories), and loads every
    /// `<topic>-<partition>` directory with `default_config`. A directory without
    /// `.kafka_cleanshutdown` was not shut down cleanly: its logs are recovered from their
    /// recovery points. The marker is removed once everything is loaded.
    ///
    /// A directory where any of this fails with an I/O error (read-only, EIO, not a
    /// directory, ...) is not loaded and starts failed ([`DirState::Failed`], one ERROR line
    /// naming it and the cause), as Kafka's `LogManager` takes it offline (KIP-112); the
    /// other directories are served.
    ///
    /// # Errors
    /// [`LogError::NoLogDirOnline`] when every directory failed, [`LogError::DirLocked`]
    /// when another process holds a directory, [`LogError::CorruptFile`] when a partition
    /// appears in two directories, and the non-I/O errors of
    /// [`PartitionLog::open_with_recovery_point`].
    pub fn open(
        log_dirs: &[PathBuf],
        default_config: LogConfig,
    ) -> Result<(Self, Vec<Arc<PartitionLog>>)> {
        Self::open_with_clock(log_dirs, default_config, crate::clock::system_clock())
    }

    /// As [`LogManager::open`], with every log reading `clock` (tests and simulations pass a
    /// [`ManualClock`](crate::ManualClock)).
    ///
    /// # Errors
    /// As [`LogManager::open`].
    pub fn open_with_clock(
        log_dirs: &[PathBuf],
        default_config: LogConfig,
        clock: SharedClock,
    ) -> Result<(Self, Vec<Arc<PartitionLog>>)> {
        Self::open_inner(
            log_dirs,
            None,
            default_config,
            clock,
            DEFAULT_RECOVERY_THREADS_PER_DATA_DIR,
        )
    }

    /// As [`LogManager::open`], with the directories' `.lock`s already taken by the caller
    /// ([`lock_dir`], one per entry of `log_dirs`, in order): a broker takes them before it
    /// opens anything else in them (the metadata log), so that a second process on the same
    /// directories stops before it can touch them. The manager holds them from then on.
    /// `recovery_threads_per_data_dir` (`num.recovery.threads.per.data.dir`, at least 1)
    /// threads per directory load the logs now and close them at [`LogManager::shutdown`].
    /// An `Err(reason)` in place of a lock is a directory that already failed (its lock or
    /// its `meta.properties` could not be read): it starts offline
    /// ([`DirState::Failed`]).
    ///
    /// # Errors
    /// As [`LogManager::open`], except [`LogError::DirLocked`].
    pub fn open_with_locks(
        log_dirs: &[PathBuf],
        locks: Vec<std::result::Result<DirLock, String>>,
        default_config: LogConfig,
        recovery_threads_per_data_dir: usize,
    ) -> Result<(Self, Vec<Arc<PartitionLog>>)> {
        Self::open_inner(
            log_dirs,
            Some(locks),
            default_config,
            crate::clock::system_clock(),
            recovery_threads_per_data_dir,
        )
    }

    fn open_inner(
        log_dirs: &[PathBuf],
        held: Option<Vec<std::result::Result<DirLock, String>>>,
        default_config: LogConfig,
        clock: SharedClock,
        recovery_threads: usize,
    ) -> Result<(Self, Vec<Arc<PartitionLog>>)> {
        let recovery_threads = recovery_threads.max(1);
        let mut locks = Vec::new();
        let mut logs = HashMap::new();
        let mut loaded = Vec::new();
        let health: Vec<Arc<LogDirHealth>> = log_dirs
            .iter()
            .map(|d| Arc::new(LogDirHealth::new(d)))
            .collect();
        let mut held = held.map(|h| h.into_iter().map(Some).collect::<Vec<_>>());
        for (dir_index, dir) in log_dirs.iter().enumerate() {
            // A directory that failed before (its lock or meta.properties) is offline.
            if let Some(Err(reason)) = held
                .as_mut()
                .and_then(|h| h.get_mut(dir_index))
                .and_then(Option::take)
                .map(|r| r.map(|lock| locks.push(lock)))
            {
                health[dir_index].mark_failed(reason);
                continue;
            }
            let opened = Self::load_dir(
                dir,
                held.is_none(),
                &logs,
                &default_config,
                &clock,
                recovery_threads,
            );
            match opened {
                Ok((lock, dir_logs, full)) => {
                    locks.extend(lock);
                    if let Some(e) = full {
                        health[dir_index].record_write_error(&e);
                    }
                    for (tp, topic_id, log) in dir_logs {
                        log.set_dir_health(Arc::clone(&health[dir_index]));
                        loaded.push(Arc::clone(&log));
                        logs.insert(
                            tp,
                            Entry {
                                log,
                                dir_index,
                                topic_id,
                            },
                        );
                    }
                }
                // Kafka's LogManager takes a directory offline for an IOException while
                // creating, locking or loading it (`maybeAddOfflineLogDir`); another process
                // holding it, a partition in two directories or a corrupt file stop the start.
                Err(e) if Self::fails_dir_at_load(&e) => {
                    health[dir_index].mark_failed(e.to_string());
                }
                Err(e) => return Err(e),
            }
        }
        if health.iter().all(|h| h.is_failed()) {
            return Err(LogError::NoLogDirOnline(
                health
                    .iter()
                    .map(|h| match h.state() {
                        DirState::Failed { reason } => reason,
                        _ => h.dir().display().to_string(),
                    })
                    .collect::<Vec<_>>()
                    .join("; "),
            ));
        }
        let manager = Self {
            log_dirs: log_dirs.to_vec(),
            default_config,
            logs: Mutex::new(logs),
            _locks: locks,
            clock,
            broker_epoch: std::sync::atomic::AtomicI64::new(-1),
            health,
            recovery_threads,
            dir_ids: Mutex::new(Vec::new()),
        };
        // A directory whose checkpoint cannot be written is marked failed by the write.
        if let Err(e) = manager.checkpoint_recovery_points() {
            tracing::debug!(error = %e, "recovery point checkpoint at start-up failed");
        }
        Ok((manager, loaded))
    }

    /// Whether an error met while opening a log directory takes only that directory offline:
    /// an I/O error (other than running out of descriptors, which is the process's), as
    /// Kafka's `IOException`.
    fn fails_dir_at_load(e: &LogError) -> bool {
        match e {
            LogError::Io { .. } => !e.is_out_of_descriptors(),
            _ => false,
        }
    }

    /// Opens one log directory: creates it if missing, checks it is writable, locks it
    /// (`lock`), finishes interrupted deletions and loads (after a crash: recovers) its logs
    /// with `recovery_threads` threads, then removes its clean-shutdown marker. `others` are
    /// the logs of the directories before it (a partition in two is refused). The last item
    /// is the write check's error when the directory has no space: it is loaded all the same
    /// and starts *full* (it comes back once it has room).
    fn load_dir(
        dir: &Path,
        lock: bool,
        others: &HashMap<TopicPartition, Entry>,
        default_config: &LogConfig,
        clock: &SharedClock,
        recovery_threads: usize,
    ) -> Result<(Option<DirLock>, Vec<DirLog>, Option<LogError>)> {
        std::fs::create_dir_all(dir).map_err(|e| LogError::io("creating log directory", dir, e))?;
        let probe = dir.join(".gregor-write-check");
        let full = match std::fs::write(&probe, b"ok").and_then(|()| std::fs::remove_file(&probe)) {
            Ok(()) => None,
            Err(e) => {
                let _ = std::fs::remove_file(&probe);
                let e = LogError::io("checking that the log directory is writable:", dir, e);
                // Full, not broken: its logs are loaded and served for reads, and the dir
                // comes back once it has room, as one that fills at run time does.
                if !e.is_out_of_space() {
                    return Err(e);
                }
                Some(e)
            }
        };
        let held = if lock { Some(lock_dir(dir)?) } else { None };

        let marker = dir.join(CLEAN_SHUTDOWN_FILE);
        let clean = marker.exists();
        let log_start_offsets = read_offset_checkpoint(dir, LOG_START_OFFSET_CHECKPOINT)
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, "ignoring unreadable log start offset checkpoint");
                HashMap::new()
            });
        let cleaner_offsets = read_offset_checkpoint(dir, CLEANER_OFFSET_CHECKPOINT)
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, "ignoring unreadable cleaner offset checkpoint");
                HashMap::new()
            });
        let recovery_points = if clean {
            HashMap::new()
        } else {
            read_recovery_points(dir).unwrap_or_else(|e| {
                tracing::warn!(error = %e, "ignoring unreadable recovery point checkpoint; recovering whole logs");
                HashMap::new()
            })
        };
        if !clean && has_partition_dirs(dir) {
            tracing::info!(log_dir = %dir.display(), "no clean shutdown marker; logs will be recovered");
        }
        let rd = std::fs::read_dir(dir).map_err(|e| LogError::io("listing", dir, e))?;
        let mut names = Vec::new();
        for entry in rd {
            let entry = entry.map_err(|e| LogError::io("listing", dir, e))?;
            if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                if let Ok(name) = entry.file_name().into_string() {
                    names.push(name);
                }
            }
        }
        names.sort();
        let mut jobs = Vec::new();
        for name in names {
            let path = dir.join(&name);
            if name.ends_with("-delete") {
                tracing::info!(dir = %path.display(), "finishing deletion of partition directory");
                std::fs::remove_dir_all(&path).map_err(|e| LogError::io("deleting", &path, e))?;
                continue;
            }
            if name.ends_with(".deleted") || name.ends_with("-future") || name.ends_with("-stray") {
                continue;
            }
            let Some(tp) = TopicPartition::parse_dir_name(&name) else {
                tracing::debug!(dir = %path.display(), "not a partition directory; ignored");
                continue;
            };
            if tp.topic == CLUSTER_METADATA_TOPIC {
                // The KRaft metadata log (gregor-raft's `KafkaMetadataLog`) shares a log dir
                // with data partitions but is never one of them, as in Kafka's LogManager.
                continue;
            }
            if others.contains_key(&tp) {
                return Err(LogError::CorruptFile {
                    path: path.display().to_string(),
                    reason: format!("partition {tp} exists in more than one log directory"),
                });
            }
            jobs.push((path, tp));
        }
        // Kafka's LogManager.loadLogs: num.recovery.threads.per.data.dir threads load (and
        // after a crash, recover) the directory's logs.
        let started = std::time::Instant::now();
        let opened: Vec<Result<LoadedLog>> = parallel_map(&jobs, recovery_threads, |(path, tp)| {
            let topic_id = read_partition_metadata(path)?;
            let log = PartitionLog::open_impl(
                path,
                tp.clone(),
                default_config.clone(),
                clean,
                recovery_points.get(tp).copied(),
                log_start_offsets.get(tp).copied(),
                clock.clone(),
                false,
            )?;
            Ok((topic_id, Arc::new(log)))
        });
        let mut recovered = crate::log::LoadStats::default();
        let mut recovered_logs = 0usize;
        let mut out = Vec::with_capacity(jobs.len());
        for ((_, tp), result) in jobs.into_iter().zip(opened) {
            let (topic_id, log) = result?;
            let stats = log.load_stats();
            if stats.recovered_segments > 0 {
                recovered_logs += 1;
                recovered.recovered_segments += stats.recovered_segments;
                recovered.recovered_batches += stats.recovered_batches;
                recovered.truncated_bytes += stats.truncated_bytes;
            }
            if let Some(o) = cleaner_offsets.get(&tp) {
                log.set_cleaner_checkpoint(*o);
            }
            out.push((tp, topic_id, log));
        }
        if recovered_logs > 0 {
            // What recovery rewrote (truncated tails, rebuilt indexes, epochs) is not
            // synced here: the recovered logs keep their checkpointed recovery points
            // (Kafka's LogLoader), so a crash before their next flush recovers them again.
            // A syncfs here would wait for every dirty page of the file system.
            tracing::info!(
                log_dir = %dir.display(),
                logs = recovered_logs,
                segments = recovered.recovered_segments,
                batches = recovered.recovered_batches,
                truncated_bytes = recovered.truncated_bytes,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "recovered logs after an unclean shutdown"
            );
        }
        if clean {
            std::fs::remove_file(&marker).map_err(|e| LogError::io("removing", &marker, e))?;
            sync_dir(dir)?;
        }
        Ok((held, out, full))
    }

    /// The log directories, in configuration order.
    pub fn log_dirs(&self) -> &[PathBuf] {
        &self.log_dirs
    }

    /// Each log directory's health, in [`LogManager::log_dirs`] order.
    pub fn dir_health(&self) -> &[Arc<LogDirHealth>] {
        &self.health
    }

    /// The offline log directories (full or failed) and their states, in configuration order.
    pub fn offline_dirs(&self) -> Vec<(PathBuf, DirState)> {
        self.health
            .iter()
            .filter(|h| h.is_offline())
            .map(|h| (h.dir().to_path_buf(), h.state()))
            .collect()
    }

    /// Checks every full directory for room again ([`LogDirHealth::check`]), bringing those
    /// that have it back online. Returns whether any state changed. Blocking (a `statvfs` and
    /// a probe write per full directory; nothing for online ones); call it every few seconds.
    pub fn check_dir_health(&self) -> bool {
        let mut changed = false;
        for h in &self.health {
            changed |= h.check();
        }
        changed
    }

    /// The configuration new logs get when none is given.
    pub fn default_config(&self) -> &LogConfig {
        &self.default_config
    }

    /// The clock the logs read.
    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }

    /// The log of `tp`, creating it (in the directory with the fewest partitions, as Kafka
    /// does) with `config` and writing `partition.metadata` with `topic_id` (Kafka's
    /// `version: 0\ntopic_id: <base64url>`, no final newline). An existing log keeps its configuration; a missing
    /// `partition.metadata` is written.
    ///
    /// A log that cannot be created leaves nothing behind: the partition directory, if this
    /// call made it, is removed again, so that a later call (or the deletion of the topic)
    /// starts from nothing. A creation that failed for lack of space (ENOSPC, EDQUOT) marks
    /// the directory full ([`LogDirHealth::record_write_error`]), as a failed append does, so
    /// the next creation prefers another directory and the dir comes back by itself once it
    /// has room. One that failed with an error of the directory's file system
    /// ([`LogError::is_dir_failure`]: read-only, EIO, ...) marks it failed, so new logs go
    /// to the other directories. Other creation errors leave the directory's state alone:
    /// unlike Kafka, which takes the whole directory offline for any `IOException` while
    /// creating a log (`LogDirFailureChannel`), one partition's trouble (a file where its
    /// directory should be, a permission on it) does not stop the directory's other
    /// partitions.
    ///
    /// # Errors
    /// [`LogError::InconsistentTopicId`] when the partition exists with another topic id;
    /// [`LogError::Io`] writing a missing `partition.metadata` of an existing log;
    /// [`LogError::CreateLog`] (naming the partition, the directory and the cause) when a new
    /// log could not be created.
    pub fn get_or_create(
        &self,
        tp: &TopicPartition,
        topic_id: [u8; 16],
        config: LogConfig,
    ) -> Result<Arc<PartitionLog>> {
        self.get_or_create_in(tp, topic_id, config, None)
    }

    /// Records each log directory's id (`directory.id` of its `meta.properties`, KIP-858),
    /// by configured path, for [`LogManager::get_or_create_in`].
    pub fn set_dir_ids(&self, ids: &[(PathBuf, [u8; 16])]) {
        *self.dir_ids.lock() = self
            .log_dirs
            .iter()
            .map(|d| ids.iter().find(|(p, _)| p == d).map(|(_, id)| *id))
            .collect();
    }

    /// As [`LogManager::get_or_create`] for a partition whose metadata places this broker's
    /// replica in directory `registered_dir` (None: unassigned). While a directory of this
    /// broker has failed ([`DirState::Failed`]: its logs were not loaded, or are out of
    /// service), a missing log is created only when `registered_dir` is unassigned or an
    /// online directory of this broker: a log registered in the failed directory, or in a
    /// directory this broker cannot name (its `meta.properties` was unreadable), may be
    /// there, and an empty one elsewhere would lose its records (Kafka's `getOrCreateLog`
    /// refuses any log that is not new while a directory is offline).
    ///
    /// # Errors
    /// As [`LogManager::get_or_create`]; [`LogError::LogDirOffline`] for a log that may be
    /// in a failed directory.
    pub fn get_or_create_in(
        &self,
        tp: &TopicPartition,
        topic_id: [u8; 16],
        config: LogConfig,
        registered_dir: Option<[u8; 16]>,
    ) -> Result<Arc<PartitionLog>> {
        let mut logs = self.logs.lock();
        if !logs.contains_key(tp) {
            if let Some(dir_id) = registered_dir {
                self.ensure_not_in_failed_dir(dir_id)?;
            }
        }
        if let Some(entry) = logs.get_mut(tp) {
            match entry.topic_id {
                Some(existing) if existing != topic_id => {
                    return Err(LogError::InconsistentTopicId {
                        partition: tp.to_string(),
                        on_disk: topic_id_to_string(&existing),
                        requested: topic_id_to_string(&topic_id),
                    });
                }
                Some(_) => {}
                None => {
                    write_partition_metadata(entry.log.dir(), &topic_id)?;
                    entry.topic_id = Some(topic_id);
                }
            }
            return Ok(Arc::clone(&entry.log));
        }
        // Counting logs per directory visits every log, so only where there is a choice.
        let mut counts = vec![0usize; self.log_dirs.len()];
        if counts.len() > 1 {
            for e in logs.values() {
                counts[e.dir_index] += 1;
            }
        }
        // An offline directory gets no new log while another one is online.
        let dir_index = counts
            .iter()
            .enumerate()
            .min_by_key(|(i, c)| (self.health.get(*i).is_some_and(|h| h.is_offline()), **c))
            .map_or(0, |(i, _)| i);
        let parent = self
            .log_dirs
            .get(dir_index)
            .ok_or_else(|| LogError::CorruptFile {
                path: String::new(),
                reason: "no log directories configured".into(),
            })?;
        let path = parent.join(tp.dir_name());
        // Something already at the path (not a log this manager loaded) is not ours to remove.
        let existed = path.symlink_metadata().is_ok();
        let created = PartitionLog::open_with_clock(
            &path,
            tp.clone(),
            config,
            true,
            None,
            None,
            self.clock.clone(),
        )
        .map(Arc::new)
        .and_then(|log| {
            #[cfg(test)]
            if let Some(errno) = tests::CREATION_FAULT.get() {
                return Err(LogError::io(
                    "writing",
                    &path.join(PARTITION_METADATA_FILE),
                    std::io::Error::from_raw_os_error(errno),
                ));
            }
            write_partition_metadata(&path, &topic_id)?;
            sync_dir(parent)?;
            Ok(log)
        });
        let log = match created {
            Ok(log) => log,
            Err(e) => {
                if !existed {
                    if let Err(rm) = std::fs::remove_dir_all(&path) {
                        if rm.kind() != std::io::ErrorKind::NotFound {
                            tracing::warn!(dir = %path.display(), error = %rm,
                                "removing the partially created log directory failed");
                        }
                    }
                }
                if e.is_out_of_space() || e.is_dir_failure() {
                    if let Some(h) = self.health.get(dir_index) {
                        h.record_write_error(&e);
                    }
                }
                return Err(LogError::CreateLog {
                    partition: tp.to_string(),
                    dir: parent.display().to_string(),
                    source: Box::new(e),
                });
            }
        };
        if let Some(h) = self.health.get(dir_index) {
            log.set_dir_health(Arc::clone(h));
        }
        logs.insert(
            tp.clone(),
            Entry {
                log: Arc::clone(&log),
                dir_index,
                topic_id: Some(topic_id),
            },
        );
        Ok(log)
    }

    /// `Ok` unless a directory failed and `dir_id` is not one of this broker's online
    /// directories (see [`LogManager::get_or_create_in`]).
    fn ensure_not_in_failed_dir(&self, dir_id: [u8; 16]) -> Result<()> {
        let Some(failed) = self.health.iter().find(|h| h.is_failed()) else {
            return Ok(());
        };
        let ids = self.dir_ids.lock();
        let online = ids
            .iter()
            .zip(&self.health)
            .any(|(id, h)| *id == Some(dir_id) && !h.is_failed());
        if online {
            return Ok(());
        }
        let dir = ids
            .iter()
            .zip(&self.health)
            .find(|(id, _)| **id == Some(dir_id))
            .map_or(failed, |(_, h)| h);
        Err(LogError::LogDirOffline {
            dir: dir.dir().display().to_string(),
            reason: format!(
                "the partition's replica is registered in directory {} and its log may be in \
                 this failed directory; restart the broker once the disk is repaired",
                topic_id_to_string(&dir_id)
            ),
        })
    }

    /// The log of `tp`, if loaded.
    pub fn get(&self, tp: &TopicPartition) -> Option<Arc<PartitionLog>> {
        self.logs.lock().get(tp).map(|e| Arc::clone(&e.log))
    }

    /// The topic id recorded for `tp` in its `partition.metadata`.
    pub fn topic_id(&self, tp: &TopicPartition) -> Option<[u8; 16]> {
        self.logs.lock().get(tp).and_then(|e| e.topic_id)
    }

    /// Every loaded log.
    pub fn all(&self) -> Vec<Arc<PartitionLog>> {
        self.logs
            .lock()
            .values()
            .map(|e| Arc::clone(&e.log))
            .collect()
    }

    /// Deletes the log of `tp`: refuses further appends, renames its directory to
    /// `<topic>-<partition>.<uuid>-delete` (so a crash midway finishes the deletion at the next
    /// start) and removes it. Readers holding the log keep reading the unlinked files. Missing
    /// partitions are ignored.
    ///
    /// # Errors
    /// [`LogError::Io`].
    pub fn delete(&self, tp: &TopicPartition) -> Result<()> {
        let Some(entry) = self.logs.lock().remove(tp) else {
            return Ok(());
        };
        entry.log.mark_closed();
        let dir = entry.log.dir().to_path_buf();
        let doomed = dir.with_file_name(format!(
            "{}.{}-delete",
            tp.dir_name(),
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::rename(&dir, &doomed)
            .map_err(|e| LogError::io("renaming for deletion", &dir, e))?;
        if let Some(parent) = dir.parent() {
            sync_dir(parent)?;
        }
        std::fs::remove_dir_all(&doomed).map_err(|e| LogError::io("deleting", &doomed, e))?;
        self.checkpoint_recovery_points()
    }

    /// Applies every log's flush policy ([`PartitionLog::flush_if_due`]) and checkpoints the
    /// recovery points when they moved. Errors are logged, not returned: one failing partition
    /// must not stop the others from being flushed.
    pub fn flush_if_due(&self, now_ms: i64) {
        let logs = self.all();
        let mut moved = false;
        for log in &logs {
            let before = log.recovery_point();
            if let Err(e) = log.flush_if_due(now_ms) {
                tracing::error!(partition = %log.topic_partition(), error = %e, "flush failed");
            }
            moved |= log.recovery_point() != before;
        }
        if moved {
            if let Err(e) = self.checkpoint_recovery_points() {
                tracing::error!(error = %e, "writing recovery point checkpoint failed");
            }
        }
    }

    /// Writes, in parallel, in place and without `fsync`, every `leader-epoch-checkpoint` whose
    /// new epochs are only in memory ([`PartitionLog::maybe_assign_epoch_start_offset_deferred`]):
    /// a broker that becomes leader of thousands of partitions at once (a restart, a topic
    /// creation) writes them together instead of one after another with two `fsync`s each, as
    /// Kafka's `LeaderEpochFileCache.assign` does. The checkpoint needs no `fsync` here: a
    /// flush syncs it before the recovery point passes records of the epoch, recovery rebuilds
    /// the entries of epochs with records after the recovery point from their batches, and an
    /// epoch without records answers OffsetForLeaderEpoch as its predecessor does; a file a
    /// crash tore mid-write is rebuilt from the batches at load. Errors are logged; the
    /// entries stay and the log's next flush writes (or fails) again.
    pub fn write_leader_epoch_checkpoints(&self) {
        let pending: Vec<Arc<PartitionLog>> = self
            .logs
            .lock()
            .values()
            .filter(|e| e.log.leader_epochs_unwritten())
            .map(|e| Arc::clone(&e.log))
            .collect();
        if pending.is_empty() {
            return;
        }
        let threads = (self.recovery_threads * self.log_dirs.len().max(1)).max(8);
        let written = parallel_map(&pending, threads, |l| l.write_pending_leader_epochs());
        for (log, result) in pending.iter().zip(written) {
            if let Err(e) = result {
                tracing::error!(partition = %log.topic_partition(), error = %e,
                    "writing the leader epoch checkpoint failed");
            }
        }
    }

    /// Writes `recovery-point-offset-checkpoint` in every log directory.
    ///
    /// # Errors
    /// [`LogError::Io`].
    pub fn checkpoint_recovery_points(&self) -> Result<()> {
        self.write_offset_checkpoint(RECOVERY_POINT_CHECKPOINT, |log| Some(log.recovery_point()))
    }

    /// Writes `log-start-offset-checkpoint` in every log directory, for the logs whose log
    /// start offset is above their first segment's base offset (Kafka's
    /// `checkpointLogStartOffsetsInDir`). Call it after retention or DeleteRecords moved a log
    /// start offset; the next start restores the offsets from it.
    ///
    /// # Errors
    /// [`LogError::Io`].
    pub fn checkpoint_log_start_offsets(&self) -> Result<()> {
        self.write_offset_checkpoint(LOG_START_OFFSET_CHECKPOINT, |log| {
            let first_base = log.segment_base_offsets().first().copied().unwrap_or(0);
            (log.log_start_offset() > first_base).then(|| log.log_start_offset())
        })
    }

    /// Writes `cleaner-offset-checkpoint` in every log directory: the first dirty offset of
    /// each log the cleaner has worked on.
    ///
    /// # Errors
    /// [`LogError::Io`].
    pub fn checkpoint_cleaner_offsets(&self) -> Result<()> {
        self.write_offset_checkpoint(CLEANER_OFFSET_CHECKPOINT, PartitionLog::cleaner_checkpoint)
    }

    /// Writes `replication-offset-checkpoint` in every log directory: the high watermark
    /// `high_watermark` gives for each log (None leaves the log out), in Kafka's format
    /// (`0`, count, `topic partition offset` lines).
    ///
    /// # Errors
    /// [`LogError::Io`].
    pub fn checkpoint_high_watermarks(
        &self,
        high_watermark: impl Fn(&TopicPartition) -> Option<i64>,
    ) -> Result<()> {
        self.write_offset_checkpoint(REPLICATION_OFFSET_CHECKPOINT, |log| {
            high_watermark(log.topic_partition())
        })
    }

    /// The high watermarks of every log directory's `replication-offset-checkpoint`. A missing
    /// file is empty; an unreadable one is logged and ignored (the high watermarks then start
    /// at the log start offsets and followers learn them again from their leaders).
    pub fn read_high_watermark_checkpoints(&self) -> HashMap<TopicPartition, i64> {
        let mut out = HashMap::new();
        for dir in &self.log_dirs {
            match read_offset_checkpoint(dir, REPLICATION_OFFSET_CHECKPOINT) {
                Ok(hws) => out.extend(hws),
                Err(e) => {
                    tracing::warn!(error = %e, "ignoring unreadable high watermark checkpoint")
                }
            }
        }
        out
    }

    /// Writes checkpoint `file` in every directory that has not failed; the first error.
    fn write_offset_checkpoint(
        &self,
        file: &str,
        offset: impl Fn(&PartitionLog) -> Option<i64>,
    ) -> Result<()> {
        self.write_offset_checkpoint_per_dir(file, offset)
            .into_iter()
            .collect()
    }

    /// Writes checkpoint `file` in each directory, in `log_dirs` order: a failed directory
    /// is skipped (`Ok`), and a directory whose write fails is marked full or failed
    /// ([`LogDirHealth::record_write_error`]), as Kafka takes a directory offline when a
    /// checkpoint cannot be written in it; the other directories are written all the same.
    fn write_offset_checkpoint_per_dir(
        &self,
        file: &str,
        offset: impl Fn(&PartitionLog) -> Option<i64>,
    ) -> Vec<Result<()>> {
        let logs = self.logs.lock();
        let mut results = Vec::with_capacity(self.log_dirs.len());
        for (i, dir) in self.log_dirs.iter().enumerate() {
            let health = self.health.get(i);
            if health.is_some_and(|h| h.is_failed()) {
                results.push(Ok(()));
                continue;
            }
            let mut lines: Vec<String> = logs
                .iter()
                .filter(|(_, e)| e.dir_index == i)
                .filter_map(|(tp, e)| {
                    offset(&e.log).map(|o| format!("{} {} {}", tp.topic, tp.partition, o))
                })
                .collect();
            lines.sort();
            let mut text = format!("0\n{}\n", lines.len());
            for l in lines {
                text.push_str(&l);
                text.push('\n');
            }
            let written = write_atomically(&dir.join(file), text.as_bytes(), true);
            if let (Err(e), Some(h)) = (&written, health) {
                h.record_write_error(e);
            }
            results.push(written);
        }
        results
    }

    /// Removes the `.deleted` segment files of every log whose `file.delete.delay.ms` passed
    /// ([`PartitionLog::delete_due_files`]); returns when the next one is due (wall-clock ms),
    /// if any, so the caller can sleep until then.
    pub fn delete_due_files(&self, now_ms: i64) -> Option<i64> {
        let logs = self.all();
        for log in &logs {
            log.delete_due_files(now_ms);
        }
        logs.iter()
            .filter_map(|l| l.next_file_deletion_due_ms())
            .min()
    }

    /// Sets the broker epoch a clean shutdown records (see
    /// [`read_clean_shutdown_broker_epoch`]).
    pub fn set_broker_epoch(&self, epoch: i64) {
        self.broker_epoch
            .store(epoch, std::sync::atomic::Ordering::Release);
    }

    /// Closes every log (final time-index entry, producer snapshot) with
    /// `num.recovery.threads.per.data.dir` threads per directory, makes all of it durable with
    /// one `syncfs` per directory rather than several `fsync`s per partition, checkpoints
    /// recovery points (now each log's end), then writes `.kafka_cleanshutdown` in each
    /// directory whose logs all closed and synced and whose checkpoints were written.
    ///
    /// Each directory stands alone: a failed one ([`DirState::Failed`]) is skipped with a
    /// WARN (its logs are not closed, nothing is written in it), and one whose close, sync or
    /// checkpoint fails gets no marker (the next start recovers it from its recovery points);
    /// the other directories get theirs.
    ///
    /// # Errors
    /// The first error met in a directory that had not failed before.
    pub fn shutdown(&self) -> Result<()> {
        let mut first_error = None;
        let mut failed_dirs: Vec<bool> = (0..self.log_dirs.len())
            .map(|i| self.health.get(i).is_some_and(|h| h.is_failed()))
            .collect();
        for (dir, failed) in self.log_dirs.iter().zip(&failed_dirs) {
            if *failed {
                tracing::warn!(log_dir = %dir.display(),
                    "the log directory failed: its logs are not closed and it gets no clean \
                     shutdown marker (they are recovered when it is back)");
            }
        }
        let entries: Vec<(TopicPartition, Arc<PartitionLog>, usize)> = self
            .logs
            .lock()
            .iter()
            .filter(|(_, e)| !failed_dirs.get(e.dir_index).copied().unwrap_or(false))
            .map(|(tp, e)| (tp.clone(), Arc::clone(&e.log), e.dir_index))
            .collect();
        let threads = self.recovery_threads * self.log_dirs.len().max(1);
        let closed = parallel_map(&entries, threads, |(_, log, _)| log.close_unsynced());
        for ((tp, _, dir_index), result) in entries.iter().zip(closed) {
            if let Err(err) = result {
                tracing::error!(partition = %tp, error = %err, "closing log failed");
                failed_dirs[*dir_index] = true;
                first_error.get_or_insert(err);
            }
        }
        for (dir_index, dir) in self.log_dirs.iter().enumerate() {
            if failed_dirs[dir_index] {
                continue;
            }
            if let Err(err) = sync_file_system(dir) {
                tracing::error!(log_dir = %dir.display(), error = %err, "syncing the log directory's file system failed");
                failed_dirs[dir_index] = true;
                first_error.get_or_insert(err);
            }
        }
        for (_, log, dir_index) in &entries {
            if !failed_dirs[*dir_index] {
                log.mark_synced();
            }
        }
        let checkpoints = [
            self.write_offset_checkpoint_per_dir(RECOVERY_POINT_CHECKPOINT, |log| {
                Some(log.recovery_point())
            }),
            self.write_offset_checkpoint_per_dir(LOG_START_OFFSET_CHECKPOINT, |log| {
                let first_base = log.segment_base_offsets().first().copied().unwrap_or(0);
                (log.log_start_offset() > first_base).then(|| log.log_start_offset())
            }),
            self.write_offset_checkpoint_per_dir(
                CLEANER_OFFSET_CHECKPOINT,
                PartitionLog::cleaner_checkpoint,
            ),
        ];
        for results in checkpoints {
            for (dir_index, result) in results.into_iter().enumerate() {
                if let Err(err) = result {
                    if !failed_dirs[dir_index] {
                        tracing::error!(log_dir = %self.log_dirs[dir_index].display(),
                            error = %err, "writing a checkpoint at shutdown failed");
                    }
                    failed_dirs[dir_index] = true;
                    first_error.get_or_insert(err);
                }
            }
        }
        for (dir, failed) in self.log_dirs.iter().zip(failed_dirs) {
            if failed {
                continue;
            }
            let marker = dir.join(CLEAN_SHUTDOWN_FILE);
            let body = format!(
                r#"{{"version":0,"brokerEpoch":{}}}"#,
                self.broker_epoch.load(std::sync::atomic::Ordering::Acquire)
            );
            if let Err(err) = write_atomically(&marker, body.as_bytes(), true) {
                first_error.get_or_insert(err);
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// `syncfs(2)` on the file system holding `dir`: every write to it so far is durable.
fn sync_file_system(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| rustix::fs::syncfs(&d).map_err(std::io::Error::from))
        .map_err(|e| LogError::io("syncing the file system of", dir, e))
}

/// True when `dir` holds at least one partition directory (a fresh log dir has none, and so
/// nothing to recover).
fn has_partition_dirs(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|rd| {
        rd.filter_map(std::result::Result::ok).any(|e| {
            e.file_name()
                .to_str()
                .and_then(TopicPartition::parse_dir_name)
                .is_some()
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        /// Test hook: the errno that writing `partition.metadata` of a new log fails with on
        /// this thread (None: no fault).
        pub(super) static CREATION_FAULT: std::cell::Cell<Option<i32>> =
            const { std::cell::Cell::new(None) };
    }

    /// A log that cannot be created (here: `partition.metadata` cannot be written, after its
    /// directory and segment files were made) leaves no directory behind and an error naming
    /// the partition, the log dir and the cause; for lack of space the dir is marked full. The
    /// next attempt creates it.
    #[test]
    fn a_log_that_cannot_be_created_leaves_nothing_behind() {
        let a = tempfile::tempdir().unwrap();
        let dirs = vec![a.path().to_path_buf()];
        let (m, _) = LogManager::open(&dirs, LogConfig::default()).unwrap();
        let tp = TopicPartition::new("full", 0);
        CREATION_FAULT.set(Some(rustix::io::Errno::NOSPC.raw_os_error()));
        let err = m
            .get_or_create(&tp, [3; 16], LogConfig::default())
            .map(|_| ())
            .unwrap_err();
        CREATION_FAULT.set(None);
        let LogError::CreateLog { partition, dir, .. } = &err else {
            panic!("{err:?}")
        };
        assert_eq!(partition, "full-0");
        assert_eq!(dir, &a.path().display().to_string());
        assert!(err.is_out_of_space(), "{err}");
        assert_eq!(
            err.error_code(),
            gregor_protocol::error::ErrorCode::KafkaStorageError
        );
        assert!(err.to_string().contains("partition.metadata"), "{err}");
        assert!(
            !a.path().join("full-0").exists(),
            "the partial log dir is removed"
        );
        assert!(m.get(&tp).is_none());
        assert!(
            matches!(m.dir_health()[0].state(), DirState::Full { .. }),
            "{:?}",
            m.dir_health()[0].state()
        );
        // Another cause does not mark the dir; something in the way is not removed.
        let b = tempfile::tempdir().unwrap();
        let (m, _) = LogManager::open(&[b.path().to_path_buf()], LogConfig::default()).unwrap();
        std::fs::write(b.path().join("full-0"), b"not a directory").unwrap();
        let err = m
            .get_or_create(&tp, [3; 16], LogConfig::default())
            .map(|_| ())
            .unwrap_err();
        assert!(matches!(err, LogError::CreateLog { .. }), "{err:?}");
        assert!(b.path().join("full-0").is_file());
        assert_eq!(m.dir_health()[0].state(), DirState::Online);
        std::fs::remove_file(b.path().join("full-0")).unwrap();
        let log = m.get_or_create(&tp, [3; 16], LogConfig::default()).unwrap();
        assert_eq!(log.dir(), b.path().join("full-0"));
        assert_eq!(m.topic_id(&tp), Some([3; 16]));
    }

    /// A log dir that cannot be opened (here: a file in its place) starts failed and the
    /// others are served; a clean shutdown then marks the healthy dir only, whose logs the
    /// next start does not recover; every dir failing fails the open.
    #[test]
    fn a_failed_dir_starts_offline_and_the_others_shut_down_cleanly() {
        let root = tempfile::tempdir().unwrap();
        let (good, bad) = (root.path().join("d1"), root.path().join("d2"));
        let dirs = vec![good.clone(), bad.clone()];
        let tp = |p| TopicPartition::new("t", p);
        {
            let (m, _) = LogManager::open(&dirs, LogConfig::default()).unwrap();
            for p in 0..4 {
                m.get_or_create(&tp(p), [5; 16], LogConfig::default())
                    .unwrap();
            }
            m.shutdown().unwrap();
        }
        let in_bad: Vec<i32> = (0..4)
            .filter(|p| bad.join(format!("t-{p}")).exists())
            .collect();
        assert_eq!(in_bad.len(), 2, "two logs per dir");
        std::fs::rename(&bad, root.path().join("aside")).unwrap();
        std::fs::write(&bad, b"a file").unwrap();

        let (m, loaded) = LogManager::open(&dirs, LogConfig::default()).unwrap();
        assert_eq!(loaded.len(), 2);
        assert_eq!(m.dir_health()[0].state(), DirState::Online);
        let DirState::Failed { reason } = m.dir_health()[1].state() else {
            panic!("{:?}", m.dir_health()[1].state())
        };
        assert!(reason.contains("d2"), "{reason}");
        assert_eq!(m.offline_dirs().len(), 1);
        // New logs go to the healthy dir.
        let created = m
            .get_or_create(&tp(9), [5; 16], LogConfig::default())
            .unwrap();
        assert_eq!(created.dir(), good.join("t-9"));
        // A log registered in the failed dir is not created elsewhere; unassigned ones are,
        // and so are those registered in the healthy dir.
        m.set_dir_ids(&[(good.clone(), [1; 16]), (bad.clone(), [2; 16])]);
        let p = in_bad[0];
        let err = m
            .get_or_create_in(&tp(p), [5; 16], LogConfig::default(), Some([2; 16]))
            .map(|_| ())
            .unwrap_err();
        assert!(matches!(err, LogError::LogDirOffline { .. }), "{err}");
        let err = m
            .get_or_create_in(&tp(p), [5; 16], LogConfig::default(), Some([3; 16]))
            .map(|_| ())
            .unwrap_err();
        assert!(
            matches!(err, LogError::LogDirOffline { .. }),
            "an unknown dir: {err}"
        );
        assert!(!good.join(format!("t-{p}")).exists());
        m.get_or_create_in(&tp(10), [5; 16], LogConfig::default(), Some([1; 16]))
            .unwrap();
        m.get_or_create_in(&tp(11), [5; 16], LogConfig::default(), None)
            .unwrap();
        m.shutdown().unwrap();
        assert!(good.join(CLEAN_SHUTDOWN_FILE).exists());
        drop(m);

        let (m, loaded) = LogManager::open(&dirs, LogConfig::default()).unwrap();
        assert_eq!(loaded.len(), 5);
        assert!(
            loaded
                .iter()
                .all(|l| l.load_stats().recovered_segments == 0),
            "the healthy dir was shut down cleanly"
        );
        drop(m);

        std::fs::remove_dir_all(&good).unwrap();
        std::fs::write(&good, b"a file").unwrap();
        let err = LogManager::open(&dirs, LogConfig::default())
            .map(|_| ())
            .unwrap_err();
        assert!(matches!(err, LogError::NoLogDirOnline(_)), "{err}");
    }

    /// A log whose creation fails with an error of the dir's file system (EROFS, EIO)
    /// takes the dir offline, and the next log goes to the other dir; a checkpoint that
    /// cannot be written in a dir takes it offline too, and the other dirs' checkpoints and
    /// clean-shutdown markers are still written.
    #[test]
    fn dir_errors_take_the_dir_offline() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let dirs = vec![a.path().to_path_buf(), b.path().to_path_buf()];
        let (m, _) = LogManager::open(&dirs, LogConfig::default()).unwrap();
        CREATION_FAULT.set(Some(rustix::io::Errno::ROFS.raw_os_error()));
        let err = m
            .get_or_create(&TopicPartition::new("ro", 0), [3; 16], LogConfig::default())
            .map(|_| ())
            .unwrap_err();
        CREATION_FAULT.set(None);
        assert!(err.is_dir_failure(), "{err}");
        assert!(m.dir_health()[0].is_failed());
        for p in 1..4 {
            let log = m
                .get_or_create(&TopicPartition::new("ro", p), [3; 16], LogConfig::default())
                .unwrap();
            assert!(log.dir().starts_with(b.path()));
        }
        drop(m);

        let (m, _) = LogManager::open(&dirs, LogConfig::default()).unwrap();
        for p in 0..4 {
            m.get_or_create(&TopicPartition::new("c", p), [4; 16], LogConfig::default())
                .unwrap();
        }
        // The recovery point checkpoint of the second dir cannot be written.
        let tmp = b.path().join(format!("{RECOVERY_POINT_CHECKPOINT}.tmp"));
        std::fs::create_dir(&tmp).unwrap();
        assert!(m.checkpoint_recovery_points().is_err());
        assert!(
            m.dir_health()[1].is_failed(),
            "{:?}",
            m.dir_health()[1].state()
        );
        assert!(!m.dir_health()[0].is_offline());
        // Skipped from now on: no error every time.
        m.checkpoint_recovery_points().unwrap();
        let _ = std::fs::remove_file(a.path().join(CLEAN_SHUTDOWN_FILE));
        m.shutdown().unwrap();
        assert!(a.path().join(CLEAN_SHUTDOWN_FILE).exists());
        assert!(!b.path().join(CLEAN_SHUTDOWN_FILE).exists());
    }

    /// `replication-offset-checkpoint` in Kafka's format, one file per log dir holding that
    /// dir's partitions, read back whole; a corrupt file reads as empty.
    #[test]
    fn high_watermark_checkpoint_round_trip() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let dirs = vec![a.path().to_path_buf(), b.path().to_path_buf()];
        let (m, _) = LogManager::open(&dirs, LogConfig::default()).unwrap();
        let t0 = TopicPartition::new("orders", 0);
        let t1 = TopicPartition::new("orders", 1);
        let t2 = TopicPartition::new("other", 3);
        for tp in [&t0, &t1, &t2] {
            m.get_or_create(tp, [7; 16], LogConfig::default()).unwrap();
        }
        m.checkpoint_high_watermarks(|tp| (tp != &t2).then_some(40 + i64::from(tp.partition)))
            .unwrap();
        let texts: Vec<String> = dirs
            .iter()
            .map(|d| std::fs::read_to_string(d.join(REPLICATION_OFFSET_CHECKPOINT)).unwrap())
            .collect();
        let joined = texts.concat();
        assert!(texts.iter().all(|t| t.starts_with("0\n")), "{texts:?}");
        assert!(joined.contains("orders 0 40\n") && joined.contains("orders 1 41\n"));
        assert!(!joined.contains("other"));
        let read = m.read_high_watermark_checkpoints();
        assert_eq!(read.len(), 2);
        assert_eq!(read.get(&t0), Some(&40));
        assert_eq!(read.get(&t1), Some(&41));
        for d in &dirs {
            std::fs::write(d.join(REPLICATION_OFFSET_CHECKPOINT), "0\n5\norders 0 1\n").unwrap();
        }
        assert!(m.read_high_watermark_checkpoints().is_empty());
    }

    #[test]
    fn topic_id_base64url() {
        let id: [u8; 16] = [
            0xfb, 0xff, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c,
            0x0d, 0xfe,
        ];
        let s = topic_id_to_string(&id);
        assert_eq!(s.len(), 22);
        assert_eq!(&s[..4], "-_8B");
        assert_eq!(topic_id_from_string(&s), Some(id));
        assert_eq!(topic_id_to_string(&[0; 16]), "AAAAAAAAAAAAAAAAAAAAAA");
        assert_eq!(topic_id_from_string("short"), None);
    }
}

#[cfg(test)]
mod clean_shutdown_epoch_tests {
    use super::*;

    #[test]
    fn the_broker_epoch_of_a_clean_shutdown_is_read_back_from_every_dir() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let dirs = vec![a.path().to_path_buf(), b.path().to_path_buf()];
        // No marker anywhere: a crash.
        assert_eq!(read_clean_shutdown_broker_epoch(&dirs), -1);
        {
            let (m, _) = LogManager::open(&dirs, LogConfig::default()).unwrap();
            m.set_broker_epoch(42);
            m.shutdown().unwrap();
        }
        let text = std::fs::read_to_string(a.path().join(CLEAN_SHUTDOWN_FILE)).unwrap();
        assert_eq!(text, r#"{"version":0,"brokerEpoch":42}"#);
        assert_eq!(read_clean_shutdown_broker_epoch(&dirs), 42);
        // One dir without it (or disagreeing) is not a clean shutdown of the broker.
        std::fs::write(
            b.path().join(CLEAN_SHUTDOWN_FILE),
            r#"{"version":0,"brokerEpoch":7}"#,
        )
        .unwrap();
        assert_eq!(read_clean_shutdown_broker_epoch(&dirs), -1);
        std::fs::remove_file(b.path().join(CLEAN_SHUTDOWN_FILE)).unwrap();
        assert_eq!(read_clean_shutdown_broker_epoch(&dirs), -1);
        // Loading the logs removes the marker.
        let _ = LogManager::open(&dirs[..1], LogConfig::default()).unwrap();
        assert_eq!(read_clean_shutdown_broker_epoch(&dirs[..1]), -1);
        assert_eq!(parse_clean_shutdown_epoch(""), None);
        assert_eq!(
            parse_clean_shutdown_epoch(r#"{"brokerEpoch" : -1}"#),
            Some(-1)
        );
    }
}
