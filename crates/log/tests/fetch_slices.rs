//! `PartitionLog::read_for_fetch` (zero-copy fetch, issue 15): the batches it returns as a
//! pinned file slice or in memory are the bytes `PartitionLog::read` (the copying read)
//! returns, for every fetch offset, size limit, upper bound and KIP-74 setting, over batches
//! small and large and across segments; a slice keeps its bytes when its segment is deleted,
//! and tells when its segment was truncated in place.

use std::path::Path;

use gregor_log::{FetchRecords, LogConfig, PartitionLog, TopicPartition};
use gregor_protocol::batch::{BatchBuilder, Batches};

const NOW_MS: i64 = 1_700_000_000_000;

/// A batch of `n` records of `value_len` bytes each.
fn batch(n: usize, value_len: usize, seed: u8) -> Vec<u8> {
    let mut b = BatchBuilder::new(0, NOW_MS);
    for i in 0..n {
        let value: Vec<u8> = (0..value_len)
            .map(|j| seed.wrapping_add((i * 31 + j) as u8))
            .collect();
        b = b.record(NOW_MS + i as i64, None, Some(&value), &[]);
    }
    b.build()
}

fn open(dir: &Path) -> PartitionLog {
    let config = LogConfig {
        segment_bytes: 200_000,
        index_interval_bytes: 4096,
        ..LogConfig::default()
    };
    PartitionLog::open(dir, TopicPartition::new("t", 0), config, true).expect("open")
}

/// Batches of 1 to 40 KiB and of a few hundred bytes, mixed, over several segments.
fn fill(log: &PartitionLog) {
    for i in 0..120usize {
        let (n, len) = match i % 5 {
            0 => (4, 10_000),
            1 => (1, 300),
            2 => (2, 150),
            3 => (1, 20_000),
            _ => (8, 90),
        };
        log.append_as_leader(&mut batch(n, len, i as u8), 0, NOW_MS)
            .expect("append");
    }
}

fn record_count(bytes: &[u8]) -> i64 {
    Batches::new(bytes)
        .map(|b| i64::from(b.expect("whole batches").1.records_count))
        .sum()
}

#[test]
fn slices_and_memory_hold_the_bytes_the_copying_read_returns() {
    let dir = tempfile::tempdir().expect("dir");
    let log = open(dir.path());
    fill(&log);
    let end = log.log_end_offset();
    assert!(log.log_end_offset() > 200);
    let (mut files, mut memory) = (0, 0);
    for fetch_offset in 0..=end {
        for max_bytes in [0usize, 1, 700, 16_384, 16_385, 50_000, 150_000, 1 << 20] {
            for upper in [end, end / 2, fetch_offset + 3] {
                for min_one_batch in [true, false] {
                    let copy = log
                        .read(fetch_offset, max_bytes, upper, min_one_batch)
                        .expect("read");
                    for from_file in [true, false] {
                        let got = log
                            .read_for_fetch(
                                fetch_offset,
                                max_bytes,
                                upper,
                                min_one_batch,
                                from_file,
                            )
                            .expect("read_for_fetch");
                        match &got.records {
                            FetchRecords::File(_) => files += 1,
                            FetchRecords::Memory(_) => memory += 1,
                        }
                        assert!(
                            from_file || matches!(got.records, FetchRecords::Memory(_)),
                            "a slice although the read asked for memory"
                        );
                        let bytes = got.records.to_bytes().expect("slice bytes");
                        assert!(
                            bytes == copy.records,
                            "offset {fetch_offset} max {max_bytes} upper {upper} \
                             min_one_batch {min_one_batch} from_file {from_file}: {} bytes, \
                             the copying read {}",
                            bytes.len(),
                            copy.records.len()
                        );
                        assert_eq!(got.record_count, record_count(&copy.records));
                        assert_eq!(got.log_start_offset, copy.log_start_offset);
                        assert_eq!(got.log_end_offset, copy.log_end_offset);
                    }
                }
            }
        }
    }
    assert!(
        files > 1000 && memory > 1000,
        "{files} slices, {memory} in memory"
    );
}

/// The first slice of a read from `offset`.
fn slice_at(log: &PartitionLog, offset: i64) -> gregor_log::FileSlice {
    match log
        .read_for_fetch(offset, 1 << 20, i64::MAX, true, true)
        .expect("read")
        .records
    {
        FetchRecords::File(f) => f,
        FetchRecords::Memory(m) => panic!("{} bytes in memory, not a slice", m.len()),
    }
}

#[test]
fn a_slice_keeps_its_bytes_when_its_segments_are_deleted() {
    let dir = tempfile::tempdir().expect("dir");
    let log = open(dir.path());
    fill(&log);
    let slice = slice_at(&log, 0);
    let before = slice.read_to_vec().expect("read");
    let copy = log.read(0, 1 << 20, i64::MAX, true).expect("read").records;
    assert_eq!(before, copy);
    // Every segment file is deleted (as a follower does when its log is behind the
    // leader's start): the descriptor still reads the old bytes.
    log.truncate_fully_and_start_at(10_000, NOW_MS)
        .expect("truncate fully");
    assert!(slice.is_intact());
    assert_eq!(slice.read_to_vec().expect("read after deletion"), before);
}

#[test]
fn a_truncation_in_place_breaks_the_slices_of_its_segment_only() {
    let dir = tempfile::tempdir().expect("dir");
    let log = open(dir.path());
    fill(&log);
    // A large last batch: it is in the active segment, and a read of it is a slice.
    log.append_as_leader(&mut batch(1, 30_000, 7), 0, NOW_MS)
        .expect("append");
    let first = slice_at(&log, 0);
    let end = log.log_end_offset();
    let last = slice_at(&log, end - 1);
    // A follower's truncation cuts the active segment where that batch starts.
    log.truncate_to(end - 1).expect("truncate");
    assert!(first.is_intact(), "the first segment was not truncated");
    assert!(!last.is_intact(), "the active segment was truncated");
    assert!(last.read_to_vec().is_err());
    assert!(first.read_to_vec().is_ok());
}
