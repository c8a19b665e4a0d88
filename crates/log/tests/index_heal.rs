//! Index files that pass every sanity check of a load but point reads to the wrong place
//! (gregor issue 14): the middle of an inactive segment's `.index` moved by a few bytes, or the
//! middle of its `.timeindex` pointing at later batches. A read that an entry misleads rebuilds
//! the segment's indexes from its log once, then answers right; the files on disk end up as
//! they were before the damage.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};

use gregor_log::{
    index_cache, LogConfig, LogError, PartitionLog, ReadInfo, TimestampAndOffset, TopicPartition,
};
use gregor_protocol::batch::{BatchBuilder, Batches};

const NOW_MS: i64 = 1_700_000_000_000;
/// Batches written: several segments of a few dozen index entries each.
const BATCHES: i64 = 600;

fn config() -> LogConfig {
    LogConfig {
        segment_bytes: 32 * 1024,
        index_interval_bytes: 512,
        ..LogConfig::default()
    }
}

fn open(dir: &Path) -> PartitionLog {
    PartitionLog::open(dir, TopicPartition::new("t", 0), config(), true).unwrap()
}

/// The create time of batch `i`: rising, with a jitter that goes back and forth.
fn timestamp(i: i64) -> i64 {
    NOW_MS + i * 10 + (i * 37 % 50)
}

/// Appends batches `from..to` (three records each).
fn fill(log: &PartitionLog, from: i64, to: i64) {
    for i in from..to {
        let ts = timestamp(i);
        let mut b = BatchBuilder::new(0, ts);
        for r in 0..3 {
            b = b.record(ts + r, Some(b"k"), Some(&[b'v'; 60]), &[]);
        }
        log.append_as_leader(&mut b.build(), 0, NOW_MS).unwrap();
    }
}

/// What a log answers: a read of every offset, ListOffsets for every timestamp around the
/// data, and the max timestamp.
#[derive(Debug, PartialEq)]
struct Answers {
    reads: Vec<ReadInfo>,
    times: Vec<Option<TimestampAndOffset>>,
    max: Option<TimestampAndOffset>,
}

fn targets(batches: i64) -> std::ops::RangeInclusive<i64> {
    NOW_MS - 1..=timestamp(batches) + 60
}

fn answers(log: &PartitionLog, batches: i64) -> Answers {
    let offsets = log.log_start_offset()..log.log_end_offset();
    Answers {
        reads: offsets
            .map(|o| log.read(o, 1, i64::MAX, true).unwrap())
            .collect(),
        times: targets(batches)
            .map(|t| log.fetch_offset_by_timestamp(t).unwrap())
            .collect(),
        max: log.max_timestamp_and_offset().unwrap(),
    }
}

/// Writes `batches` batches to a log in `dir`, closes it, and returns what the intact log
/// answers after a restart.
fn build(dir: &Path, batches: i64) -> Answers {
    let log = open(dir);
    fill(&log, 0, batches);
    log.close().unwrap();
    let log = open(dir);
    let a = answers(&log, batches);
    log.close().unwrap();
    a
}

fn file(dir: &Path, base: i64, ext: &str) -> PathBuf {
    dir.join(format!("{base:020}.{ext}"))
}

fn segment_bases(dir: &Path) -> Vec<i64> {
    let log = open(dir);
    let bases = log.segment_base_offsets();
    log.close().unwrap();
    bases
}

/// Adds `delta` to the positions of the middle third of the `.index` entries: still
/// increasing, the last entry untouched, every position inside the segment.
fn shift_offset_index(path: &Path, delta: u32) {
    let mut b = std::fs::read(path).unwrap();
    let n = b.len() / 8;
    assert!(n >= 6, "{} holds {n} entries", path.display());
    for e in b.chunks_exact_mut(8).take(2 * n / 3).skip(n / 3) {
        let pos = u32::from_be_bytes([e[4], e[5], e[6], e[7]]) + delta;
        e[4..8].copy_from_slice(&pos.to_be_bytes());
    }
    std::fs::write(path, b).unwrap();
}

/// Points the middle third of the `.timeindex` entries at the offset of the entry after each
/// (timestamps untouched, so still increasing; offsets still not decreasing; the last entry
/// untouched).
fn shift_time_index(path: &Path) {
    let mut b = std::fs::read(path).unwrap();
    let n = b.len() / 12;
    assert!(n >= 6, "{} holds {n} entries", path.display());
    let offset = |b: &[u8], i: usize| b[i * 12 + 8..i * 12 + 12].to_vec();
    for i in n / 3..2 * n / 3 {
        let next = offset(&b, i + 1);
        b[i * 12 + 8..i * 12 + 12].copy_from_slice(&next);
    }
    std::fs::write(path, b).unwrap();
}

fn assert_answers(log: &PartitionLog, expected: &Answers, batches: i64) {
    let got = answers(log, batches);
    for (o, (g, e)) in got.reads.iter().zip(&expected.reads).enumerate() {
        assert_eq!(g, e, "read of offset {o}");
    }
    for (t, (g, e)) in targets(batches).zip(got.times.iter().zip(&expected.times)) {
        assert_eq!(g, e, "ListOffsets for timestamp {t}");
    }
    assert_eq!(got, *expected);
}

#[test]
fn a_misleading_offset_index_is_rebuilt_once_and_every_read_is_right() {
    let dir = tempfile::tempdir().unwrap();
    let expected = build(dir.path(), BATCHES);
    let bases = segment_bases(dir.path());
    assert!(bases.len() >= 4, "{bases:?}");
    let index = file(dir.path(), bases[1], "index");
    let original = std::fs::read(&index).unwrap();
    shift_offset_index(&index, 61);
    let before = index_cache::stats().rebuilds_total;
    let log = open(dir.path());
    assert_answers(&log, &expected, BATCHES);
    // Twice: the rebuilt index answers without another rebuild.
    assert_answers(&log, &expected, BATCHES);
    assert_eq!(log.index_rebuilds(), 1);
    assert!(index_cache::stats().rebuilds_total > before);
    assert_eq!(std::fs::read(&index).unwrap(), original);
    log.close().unwrap();
}

#[test]
fn a_misleading_time_index_is_rebuilt_once_and_every_lookup_is_right() {
    let dir = tempfile::tempdir().unwrap();
    let expected = build(dir.path(), BATCHES);
    let bases = segment_bases(dir.path());
    let index = file(dir.path(), bases[1], "timeindex");
    let original = std::fs::read(&index).unwrap();
    shift_time_index(&index);
    let log = open(dir.path());
    assert_answers(&log, &expected, BATCHES);
    assert_answers(&log, &expected, BATCHES);
    assert_eq!(log.index_rebuilds(), 1);
    assert_eq!(std::fs::read(&index).unwrap(), original);
    log.close().unwrap();
}

/// A follower's truncation looks up where to cut through the same index: it cuts at the batch
/// holding the offset, not where a moved entry points.
#[test]
fn truncation_through_a_misleading_index_cuts_at_the_right_batch() {
    let dir = tempfile::tempdir().unwrap();
    let expected = build(dir.path(), BATCHES);
    let bases = segment_bases(dir.path());
    shift_offset_index(&file(dir.path(), bases[1], "index"), 61);
    let log = open(dir.path());
    // An offset in the middle of the damaged segment, inside a batch.
    let offset = (bases[1] + bases[2]) / 2 + 1;
    let batch_base = Batches::new(&expected.reads[offset as usize].records)
        .next()
        .unwrap()
        .unwrap()
        .1
        .base_offset;
    assert!(batch_base < offset);
    assert_eq!(log.truncate_to(offset).unwrap(), batch_base);
    assert_eq!(log.log_end_offset(), batch_base);
    for o in 0..batch_base {
        let got = log.read(o, 1, i64::MAX, true).unwrap();
        assert_eq!(
            got.records, expected.reads[o as usize].records,
            "offset {o}"
        );
    }
    assert_eq!(log.index_rebuilds(), 1);
    log.close().unwrap();
}

/// The active segment's `.index` damaged the same way: readers heal it while a producer keeps
/// appending, and afterwards every index file is exactly what a log that was never damaged
/// (nor restarted) holds after the same appends.
#[test]
fn the_active_segment_heals_while_appends_go_on() {
    const MORE: i64 = 300;
    let (damaged, reference) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // Batches up to an active segment about a third full: a few dozen index entries, and room
    // for the appends that race the heal before it rolls.
    let batches = {
        let log = open(reference.path());
        let mut n = 0;
        while log.num_segments() < 3
            || *log.segment_sizes().last().unwrap() < config().segment_bytes / 3
        {
            fill(&log, n, n + 1);
            n += 1;
        }
        fill(&log, n, n + MORE);
        log.close().unwrap();
        n
    };
    let expected = build(damaged.path(), batches);
    let active = *segment_bases(damaged.path()).last().unwrap();
    let index = file(damaged.path(), active, "index");
    shift_offset_index(&index, 61);
    // Readers start at a damaged entry, so the first read heals while the first appends go.
    let damaged_offset = {
        let b = std::fs::read(&index).unwrap();
        let e = &b[(b.len() / 8 / 2) * 8..][..8];
        active + i64::from(u32::from_be_bytes([e[0], e[1], e[2], e[3]])) + 1
    };
    let log = Arc::new(open(damaged.path()));
    let leo = log.log_end_offset();
    let done = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(3));
    let appender = {
        let (log, done, start) = (log.clone(), done.clone(), start.clone());
        std::thread::spawn(move || {
            start.wait();
            fill(&log, batches, batches + MORE);
            done.store(true, Ordering::Release);
        })
    };
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (log, done, start) = (log.clone(), done.clone(), start.clone());
            let reads = expected.reads.clone();
            std::thread::spawn(move || {
                start.wait();
                let mut passes = 0;
                while passes < 2 || !done.load(Ordering::Acquire) {
                    for o in (damaged_offset..leo).chain(active..damaged_offset) {
                        let got = log.read(o, 1, i64::MAX, true).unwrap();
                        assert_eq!(got.records, reads[o as usize].records, "offset {o}");
                    }
                    passes += 1;
                }
            })
        })
        .collect();
    appender.join().unwrap();
    for r in readers {
        r.join().unwrap();
    }
    assert_eq!(log.index_rebuilds(), 1);
    log.close().unwrap();
    let bases = segment_bases(reference.path());
    assert!(
        bases.contains(&active) && *bases.last().unwrap() > active,
        "{bases:?}"
    );
    assert_eq!(segment_bases(damaged.path()), bases);
    for base in bases {
        for ext in ["log", "index", "timeindex"] {
            assert!(
                std::fs::read(file(damaged.path(), base, ext)).unwrap()
                    == std::fs::read(file(reference.path(), base, ext)).unwrap(),
                "{base} .{ext} differs from the undamaged log's"
            );
        }
    }
}

/// Once rebuilt by a read, a segment whose index still misleads (here its log changed under
/// the rebuilt index) fails those reads with a storage error and is not rebuilt again.
#[test]
fn a_segment_that_still_misleads_after_its_rebuild_fails_without_rebuilding_again() {
    let dir = tempfile::tempdir().unwrap();
    let expected = build(dir.path(), BATCHES);
    let bases = segment_bases(dir.path());
    let index = file(dir.path(), bases[1], "index");
    shift_offset_index(&index, 61);
    let log = open(dir.path());
    assert_answers(&log, &expected, BATCHES);
    assert_eq!(log.index_rebuilds(), 1);
    // The batch a middle entry of the rebuilt index points at loses its magic byte.
    let entries = std::fs::read(&index).unwrap();
    let e = &entries[(entries.len() / 8 / 2) * 8..][..8];
    let entry_offset = bases[1] + i64::from(u32::from_be_bytes([e[0], e[1], e[2], e[3]]));
    let position = u64::from(u32::from_be_bytes([e[4], e[5], e[6], e[7]]));
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(file(dir.path(), bases[1], "log"))
            .unwrap();
        f.write_all_at(&[0], position + 16).unwrap();
    }
    // The next offset is in the following batch, found from that entry.
    for _ in 0..3 {
        match log.read(entry_offset + 1, 1, i64::MAX, true) {
            Err(LogError::CorruptFile { reason, .. }) => {
                assert!(reason.contains("magic"), "{reason}");
            }
            other => panic!("expected a corrupt-file error, got {other:?}"),
        }
    }
    assert_eq!(log.index_rebuilds(), 1);
    // The other segments read as before.
    for o in bases[2]..log.log_end_offset() {
        let got = log.read(o, 1, i64::MAX, true).unwrap();
        assert_eq!(got, expected.reads[o as usize], "offset {o}");
    }
    log.close().unwrap();
}
