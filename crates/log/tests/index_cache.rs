//! The index cache (`log.index.cache.bytes`) under a budget of a few entries. A test binary of
//! its own: the budget is process-wide, and the tests here run one at a time.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use gregor_log::{index_cache, LogConfig, LogError, PartitionLog, TopicPartition};
use gregor_protocol::batch::{validate_batch, BatchBuilder, Batches};
use parking_lot::Mutex;

const NOW_MS: i64 = 1_700_000_000_000;
/// A few entries: less than one segment's indexes hold here.
const TINY_BUDGET_BYTES: u64 = 40;

static SERIAL: Mutex<()> = Mutex::new(());

fn config() -> LogConfig {
    LogConfig {
        segment_bytes: 4096,
        index_interval_bytes: 256,
        file_delete_delay_ms: 0,
        ..LogConfig::default()
    }
}

fn open(dir: &Path) -> PartitionLog {
    PartitionLog::open(dir, TopicPartition::new("t", 0), config(), true).unwrap()
}

/// A batch of `n` records with timestamps from `ts`.
fn batch(n: usize, ts: i64) -> Vec<u8> {
    let mut b = BatchBuilder::new(0, ts);
    for i in 0..n {
        b = b.record(ts + i as i64, Some(b"k"), Some(&[b'v'; 60]), &[]);
    }
    b.build()
}

/// Appends `batches` batches whose timestamps go back and forth, from `first`.
fn fill(log: &PartitionLog, first: i64, batches: i64) {
    for i in first..first + batches {
        let ts = NOW_MS + (i * 37 % 50) * 10;
        log.append_as_leader(&mut batch(3, ts), 0, NOW_MS).unwrap();
    }
}

/// xorshift64: a fixed pseudo-random order without a dependency.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The largest heap bytes one segment's entries take: its two index files' lengths.
fn largest_segment_index_bytes(dir: &Path) -> u64 {
    let mut per_base: BTreeMap<String, u64> = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().to_string();
        if let Some(base) = name
            .strip_suffix(".index")
            .or_else(|| name.strip_suffix(".timeindex"))
        {
            *per_base.entry(base.to_string()).or_default() += e.metadata().unwrap().len();
        }
    }
    per_base.values().copied().max().unwrap_or(0)
}

/// With a budget smaller than one segment's entries, lookups of every offset and timestamp,
/// in random order from four threads, answer as they did with every index in memory; the
/// cache holds at most the budget plus the one segment being loaded, and entries are dropped
/// and read again.
#[test]
fn lookups_under_a_tiny_budget_stay_correct_and_within_it() {
    let _serial = SERIAL.lock();
    let dir = tempfile::tempdir().unwrap();
    let (offsets, leo) = {
        let log = open(dir.path());
        fill(&log, 0, 240);
        assert!(log.num_segments() >= 10, "{}", log.num_segments());
        log.close().unwrap();
        (
            log.log_start_offset()..log.log_end_offset(),
            log.log_end_offset(),
        )
    };
    // Expected answers, from a log whose indexes all stay loaded.
    let (reads, times, max) = {
        let log = open(dir.path());
        let reads: Vec<_> = offsets
            .clone()
            .map(|o| log.read(o, 1, i64::MAX, true).unwrap())
            .collect();
        let times: Vec<_> = (NOW_MS - 1..=NOW_MS + 500)
            .map(|t| log.fetch_offset_by_timestamp(t).unwrap())
            .collect();
        (reads, times, log.max_timestamp_and_offset().unwrap())
    };
    let bound = TINY_BUDGET_BYTES + largest_segment_index_bytes(dir.path());
    let before = index_cache::stats();
    index_cache::set_max_bytes(TINY_BUDGET_BYTES);
    let log = Arc::new(open(dir.path()));
    assert_eq!(log.log_end_offset(), leo);
    let reads = Arc::new(reads);
    let times = Arc::new(times);
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (log, reads, times) = (log.clone(), reads.clone(), times.clone());
            std::thread::spawn(move || {
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (t + 1));
                for _ in 0..1500 {
                    if rng.below(2) == 0 {
                        let i = rng.below(reads.len() as u64) as usize;
                        let got = log.read(i as i64, 1, i64::MAX, true).unwrap();
                        assert_eq!(got, reads[i], "offset {i}");
                    } else {
                        let i = rng.below(times.len() as u64) as usize;
                        let target = NOW_MS - 1 + i as i64;
                        let got = log.fetch_offset_by_timestamp(target).unwrap();
                        assert_eq!(got, times[i], "timestamp {target}");
                    }
                    let bytes = index_cache::stats().bytes;
                    assert!(
                        bytes <= bound,
                        "{bytes} bytes held, budget {TINY_BUDGET_BYTES}, bound {bound}"
                    );
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(log.max_timestamp_and_offset().unwrap(), max);
    let after = index_cache::stats();
    assert!(after.bytes <= bound, "{after:?}");
    let segments = log.num_segments() as u64;
    assert!(
        after.loads_total - before.loads_total > 2 * segments,
        "{before:?} -> {after:?}"
    );
    assert!(after.dropped_total - before.dropped_total > segments);
    // The active segment's entries are never dropped: it keeps taking appends after all this.
    fill(&log, 240, 5);
    assert!(!log.read(leo, 1, i64::MAX, true).unwrap().records.is_empty());
    index_cache::set_max_bytes(index_cache::DEFAULT_MAX_BYTES);
}

/// Readers holding segments that retention deletes (files renamed, then removed at once) read
/// whole valid batches or get OFFSET_OUT_OF_RANGE, with inactive segments' indexes loaded on
/// use and dropped at once.
#[test]
fn readers_of_lazily_loaded_segments_survive_their_deletion() {
    let _serial = SERIAL.lock();
    let dir = tempfile::tempdir().unwrap();
    {
        let log = open(dir.path());
        fill(&log, 0, 200);
        log.close().unwrap();
    }
    index_cache::set_max_bytes(TINY_BUDGET_BYTES);
    let log = Arc::new(open(dir.path()));
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..3u64)
        .map(|t| {
            let (log, stop) = (log.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut rng = Rng(0xDEAD_BEEF ^ (t + 1));
                let mut ok = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let start = log.log_start_offset();
                    let span = (log.log_end_offset() - start).max(1) as u64;
                    let offset = start + rng.below(span) as i64;
                    match log.read(offset, 4096, i64::MAX, true) {
                        Ok(r) => {
                            for b in Batches::new(&r.records) {
                                let (at, h) = b.unwrap();
                                validate_batch(&r.records[at..]).unwrap();
                                assert!(h.last_offset() >= offset);
                            }
                            ok += 1;
                        }
                        Err(LogError::OffsetOutOfRange { .. }) => {}
                        Err(e) => panic!("unexpected error reading offset {offset}: {e}"),
                    }
                    let _ = log.fetch_offset_by_timestamp(NOW_MS + rng.below(500) as i64);
                }
                ok
            })
        })
        .collect();
    let mut next = 200;
    while log.num_segments() > 2 {
        fill(&log, next, 2);
        next += 2;
        let start = log.log_start_offset() + 10;
        log.maybe_increment_log_start_offset(start).unwrap();
        log.delete_old_segments(NOW_MS, log.log_end_offset())
            .unwrap();
        log.delete_due_files(NOW_MS);
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }
    index_cache::set_max_bytes(index_cache::DEFAULT_MAX_BYTES);
}

/// Truncating into an inactive segment whose indexes are not loaded makes it the active
/// segment: it is loaded, rebuilt, takes appends and reads back, here and after a reopen.
#[test]
fn truncation_into_an_unloaded_segment_makes_it_active() {
    let _serial = SERIAL.lock();
    let dir = tempfile::tempdir().unwrap();
    let bases = {
        let log = open(dir.path());
        fill(&log, 0, 60);
        log.close().unwrap();
        log.segment_base_offsets()
    };
    index_cache::set_max_bytes(TINY_BUDGET_BYTES);
    let log = open(dir.path());
    let target = bases[1] + 4;
    let end = log.truncate_to(target).unwrap();
    assert_eq!(log.num_segments(), 2);
    assert!(end <= target && end > bases[1]);
    // Load every other segment, so the cache drops whatever it can.
    for o in 0..end {
        assert!(!log.read(o, 1, i64::MAX, true).unwrap().records.is_empty());
    }
    fill(&log, 1000, 40);
    let expected: Vec<_> = (0..log.log_end_offset())
        .map(|o| log.read(o, 1, i64::MAX, true).unwrap().records)
        .collect();
    log.close().unwrap();
    drop(log);
    let log = open(dir.path());
    assert_eq!(log.load_stats().rebuilt_indexes, 0);
    for (o, want) in expected.iter().enumerate() {
        assert_eq!(
            &log.read(o as i64, 1, i64::MAX, true).unwrap().records,
            want
        );
    }
    index_cache::set_max_bytes(index_cache::DEFAULT_MAX_BYTES);
}
