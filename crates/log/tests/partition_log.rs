//! End-to-end tests of PartitionLog and LogManager against real files.

use std::path::Path;

use gregor_log::{LogConfig, LogError, LogManager, PartitionLog, TimestampType, TopicPartition};
use gregor_protocol::batch::{validate_batch, BatchBuilder, Batches, Compression};

const NOW_MS: i64 = 1_700_000_000_000;

fn tp(topic: &str, p: i32) -> TopicPartition {
    TopicPartition::new(topic, p)
}

fn small_config() -> LogConfig {
    LogConfig {
        segment_bytes: 4096,
        index_interval_bytes: 256,
        ..LogConfig::default()
    }
}

/// A batch of `n` records with increasing timestamps from `ts`, values of `value_len` bytes.
fn batch(n: usize, ts: i64, value_len: usize) -> Vec<u8> {
    let mut b = BatchBuilder::new(0, ts);
    for i in 0..n {
        b = b.record(
            ts + i as i64,
            Some(format!("k{i}").as_bytes()),
            Some(&vec![b'v'; value_len]),
            &[],
        );
    }
    b.build()
}

fn idempotent(pid: i64, epoch: i16, seq: i32, n: usize) -> Vec<u8> {
    let mut b = BatchBuilder::new(0, NOW_MS).producer(pid, epoch, seq);
    for _ in 0..n {
        b = b.record(NOW_MS, None, Some(b"x"), &[]);
    }
    b.build()
}

fn open(dir: &Path, config: LogConfig, clean: bool) -> PartitionLog {
    PartitionLog::open(dir, tp("t", 0), config, clean).unwrap()
}

/// Reads the whole log by following fetches; returns (base offset, last offset) per batch.
fn read_all(log: &PartitionLog) -> Vec<(i64, i64)> {
    let mut out = Vec::new();
    let mut offset = log.log_start_offset();
    loop {
        let r = log.read(offset, 1000, i64::MAX, true).unwrap();
        if r.records.is_empty() {
            break;
        }
        for item in Batches::new(&r.records) {
            let (_, h) = item.unwrap();
            validate_batch(&r.records[..]).unwrap();
            out.push((h.base_offset, h.last_offset()));
            offset = h.next_offset();
        }
    }
    out
}

#[test]
fn append_read_round_trip_across_rolls_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), small_config(), true);
    let mut expected = Vec::new();
    for i in 0..200 {
        let mut b = batch(1 + i % 4, NOW_MS + i as i64, 20 + (i * 7) % 90);
        let info = log.append_as_leader(&mut b, 3, NOW_MS).unwrap();
        assert_eq!(
            info.first_offset,
            expected.last().map_or(0, |&(_, l): &(i64, i64)| l + 1)
        );
        assert_eq!(info.records, (1 + i % 4) as u64);
        assert!(!info.duplicate);
        expected.push((info.first_offset, info.last_offset));
    }
    assert!(log.num_segments() > 5, "segments: {}", log.num_segments());
    assert_eq!(log.log_end_offset(), expected.last().unwrap().1 + 1);
    // Every segment stays within segment.bytes and holds only whole batches.
    for base in log.segment_base_offsets() {
        let bytes = std::fs::read(dir.path().join(format!("{base:020}.log"))).unwrap();
        assert!(bytes.len() as u64 <= 4096);
        let mut pos = 0;
        for item in Batches::new(&bytes) {
            let (at, h) = item.unwrap();
            validate_batch(&bytes[at..]).unwrap();
            assert_eq!(h.partition_leader_epoch, 3);
            pos = at + h.total_size();
        }
        assert_eq!(pos, bytes.len());
    }
    assert_eq!(read_all(&log), expected);
    // Every offset finds its batch through the index.
    for &(first, last) in &expected {
        for o in first..=last {
            let r = log.read(o, 1, i64::MAX, true).unwrap();
            let h = validate_batch(&r.records).unwrap();
            assert_eq!(
                (h.base_offset, h.last_offset()),
                (first, last),
                "offset {o}"
            );
        }
    }
    log.close().unwrap();
    // Inactive indexes are trimmed to whole entries.
    for base in log.segment_base_offsets() {
        let idx = std::fs::metadata(dir.path().join(format!("{base:020}.index")))
            .unwrap()
            .len();
        let tidx = std::fs::metadata(dir.path().join(format!("{base:020}.timeindex")))
            .unwrap()
            .len();
        assert_eq!(idx % 8, 0);
        assert_eq!(tidx % 12, 0);
    }
    drop(log);
    let log = open(dir.path(), small_config(), true);
    assert_eq!(log.load_stats().recovered_segments, 0);
    assert_eq!(read_all(&log), expected);
    let mut b = batch(2, NOW_MS, 10);
    let info = log.append_as_leader(&mut b, 3, NOW_MS).unwrap();
    assert_eq!(info.first_offset, expected.last().unwrap().1 + 1);
}

#[test]
fn kip74_min_one_batch_and_max_offset() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), LogConfig::default(), true);
    let big = batch(3, NOW_MS, 2000);
    let big_len = big.len();
    for _ in 0..3 {
        log.append_as_leader(&mut big.clone(), 0, NOW_MS).unwrap();
    }
    // Larger than max_bytes: whole first batch with min_one_batch, nothing without.
    let r = log.read(0, 100, i64::MAX, true).unwrap();
    assert_eq!(r.records.len(), big_len);
    assert!(log
        .read(0, 100, i64::MAX, false)
        .unwrap()
        .records
        .is_empty());
    // Offset inside a batch returns the whole batch.
    let r = log.read(4, 100, i64::MAX, true).unwrap();
    assert_eq!(validate_batch(&r.records).unwrap().base_offset, 3);
    // Two and a half batches of room: two whole batches.
    let r = log.read(0, big_len * 5 / 2, i64::MAX, false).unwrap();
    assert_eq!(r.records.len(), 2 * big_len);
    // max_offset (high watermark) bounds the read.
    let r = log.read(0, 1 << 20, 6, false).unwrap();
    assert_eq!(r.records.len(), 2 * big_len);
    assert!(log.read(6, 1 << 20, 6, true).unwrap().records.is_empty());
    // At the log end: empty. Beyond: out of range.
    let r = log.read(9, 1 << 20, i64::MAX, true).unwrap();
    assert!(r.records.is_empty());
    assert_eq!(r.log_end_offset, 9);
    let err = log.read(10, 1 << 20, i64::MAX, true).unwrap_err();
    assert!(matches!(
        err,
        LogError::OffsetOutOfRange {
            offset: 10,
            log_end_offset: 9,
            ..
        }
    ));
    assert_eq!(err.kafka_error_code(), 1);
    assert_eq!(
        log.read(-1, 1, i64::MAX, true)
            .unwrap_err()
            .kafka_error_code(),
        1
    );
}

#[test]
fn invalid_appends_are_rejected_with_kafka_codes() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        max_message_bytes: 1000,
        ..LogConfig::default()
    };
    let log = open(dir.path(), config, true);
    let code = |mut b: Vec<u8>| {
        log.append_as_leader(&mut b, 0, NOW_MS)
            .unwrap_err()
            .kafka_error_code()
    };
    assert_eq!(code(batch(1, NOW_MS, 2000)), 10);
    let mut trailing = batch(1, NOW_MS, 10);
    trailing.extend_from_slice(&[0, 0, 0]);
    assert_eq!(code(trailing), 2);
    let mut bad_crc = batch(1, NOW_MS, 10);
    let last = bad_crc.len() - 1;
    bad_crc[last] ^= 0xff;
    assert_eq!(code(bad_crc), 2);
    assert_eq!(code(Vec::new()), 87);
    let control = BatchBuilder::new(0, NOW_MS)
        .producer(1, 0, 0)
        .transactional(true, true)
        .record(NOW_MS, None, None, &[])
        .build();
    assert_eq!(code(control), 87);
    assert_eq!(code(batch(1, NOW_MS + 2 * 3_600_000, 10)), 32);
    assert_eq!(log.log_end_offset(), 0);
    assert_eq!(log.size_in_bytes(), 0);
}

/// Rewrites `batchLength` and the CRC after a test edited `b`.
fn reseal(b: &mut [u8]) {
    let len = (b.len() - 12) as i32;
    b[8..12].copy_from_slice(&len.to_be_bytes());
    let crc = gregor_protocol::batch::compute_crc(b);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
}

/// A client's batch is checked record by record, as Kafka's `LogValidator` does (new-user trial
/// of issue 9, D2): before, these forged batches were stored with error 0: a count of 2^31 - 1
/// with one record inside moved the log end offset by 2^31 - 1, and garbage inside a gzip
/// batch was stored and broke every consumer of the partition.
#[test]
fn forged_batches_are_refused_record_by_record() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), LogConfig::default(), true);
    let code = |mut b: Vec<u8>| {
        log.append_as_leader(&mut b, 0, NOW_MS)
            .unwrap_err()
            .kafka_error_code()
    };
    // Header count 2^31 - 1 (and a matching lastOffsetDelta), one record inside.
    let mut huge_count = batch(1, NOW_MS, 10);
    huge_count[23..27].copy_from_slice(&(i32::MAX - 1).to_be_bytes());
    huge_count[57..61].copy_from_slice(&i32::MAX.to_be_bytes());
    reseal(&mut huge_count);
    assert_eq!(code(huge_count), 87);
    // Count 1, two records inside.
    let mut extra = batch(2, NOW_MS, 10);
    extra[23..27].copy_from_slice(&0i32.to_be_bytes());
    extra[57..61].copy_from_slice(&1i32.to_be_bytes());
    reseal(&mut extra);
    assert_eq!(code(extra), 87);
    // A gzip batch whose compressed records are garbage.
    let mut garbage = BatchBuilder::new(0, NOW_MS)
        .compression(Compression::Gzip)
        .record(NOW_MS, Some(b"k"), Some(&[7u8; 500]), &[])
        .build();
    for (i, byte) in garbage[61..].iter_mut().enumerate() {
        *byte = (i * 31 + 7) as u8;
    }
    reseal(&mut garbage);
    assert_eq!(code(garbage), 2);
    // An uncompressed record whose key length runs past its end.
    let mut bad_record = batch(1, NOW_MS, 10);
    // Record layout: length varint, attributes, timestamp delta, offset delta, key length.
    bad_record[61 + 4] = 0x7e; // zigzag 63: a 63-byte key in a 20-byte record
    reseal(&mut bad_record);
    assert_eq!(code(bad_record), 2);
    assert_eq!(log.log_end_offset(), 0);
    assert_eq!(log.size_in_bytes(), 0);
    // A well-formed batch of each codec still goes in.
    for codec in [
        Compression::None,
        Compression::Gzip,
        Compression::Lz4,
        Compression::Zstd,
        Compression::Snappy,
    ] {
        let mut ok = BatchBuilder::new(0, NOW_MS)
            .compression(codec)
            .record(NOW_MS, Some(b"k"), Some(b"v"), &[])
            .record(NOW_MS, None, Some(b"w"), &[])
            .build();
        log.append_as_leader(&mut ok, 0, NOW_MS).unwrap();
    }
    assert_eq!(log.log_end_offset(), 10);
}

#[test]
fn log_append_time_is_stamped() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        message_timestamp_type: TimestampType::LogAppendTime,
        ..LogConfig::default()
    };
    let log = open(dir.path(), config, true);
    let info = log
        .append_as_leader(&mut batch(2, 5, 10), 0, NOW_MS)
        .unwrap();
    assert_eq!(info.log_append_time_ms, NOW_MS);
    let r = log.read(0, 1 << 20, i64::MAX, true).unwrap();
    let h = validate_batch(&r.records).unwrap();
    assert_eq!(h.max_timestamp, NOW_MS);
    assert_eq!(h.timestamp_type(), TimestampType::LogAppendTime);
    let found = log.fetch_offset_by_timestamp(NOW_MS).unwrap().unwrap();
    assert_eq!((found.offset, found.timestamp_ms), (0, NOW_MS));
}

/// Writes three batches, then for every cut length of the last batch reopens uncleanly.
#[test]
fn recovery_truncates_torn_last_batch_at_every_byte() {
    let src = tempfile::tempdir().unwrap();
    let log = open(src.path(), LogConfig::default(), true);
    for i in 0..3 {
        log.append_as_leader(&mut batch(2, NOW_MS + i, 30), 1, NOW_MS)
            .unwrap();
    }
    log.flush().unwrap();
    let seg = std::fs::read(src.path().join(format!("{:020}.log", 0))).unwrap();
    let last_start = seg.len() - batch(2, NOW_MS, 30).len();
    drop(log);
    for cut in last_start..seg.len() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(format!("{:020}.log", 0)), &seg[..cut]).unwrap();
        let log = open(dir.path(), LogConfig::default(), false);
        assert_eq!(log.log_end_offset(), 4, "cut at {cut}");
        assert_eq!(log.size_in_bytes(), last_start as u64);
        assert!(log.load_stats().recovered_segments >= 1);
        let info = log
            .append_as_leader(&mut batch(1, NOW_MS, 5), 1, NOW_MS)
            .unwrap();
        assert_eq!(info.first_offset, 4);
        assert_eq!(read_all(&log), vec![(0, 1), (2, 3), (4, 4)]);
    }
    // The whole file survives an unclean open.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(format!("{:020}.log", 0)), &seg).unwrap();
    assert_eq!(
        open(dir.path(), LogConfig::default(), false).log_end_offset(),
        6
    );
}

#[test]
fn corrupt_byte_in_last_segment_truncates_there() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), small_config(), true);
    for i in 0..60 {
        log.append_as_leader(&mut batch(2, NOW_MS + i, 50), 0, NOW_MS)
            .unwrap();
    }
    log.flush().unwrap();
    let bases = log.segment_base_offsets();
    assert!(bases.len() >= 3);
    drop(log);
    let last = dir
        .path()
        .join(format!("{:020}.log", bases[bases.len() - 1]));
    let mut bytes = std::fs::read(&last).unwrap();
    let batches: Vec<_> = Batches::new(&bytes).map(|b| b.unwrap()).collect();
    assert!(batches.len() >= 4);
    let (pos, h) = batches[batches.len() / 2];
    bytes[pos + 70] ^= 0x55;
    std::fs::write(&last, &bytes).unwrap();
    let log = open(dir.path(), small_config(), false);
    assert_eq!(log.log_end_offset(), h.base_offset);
    assert!(log.load_stats().truncated_bytes > 0);
    let info = log
        .append_as_leader(&mut batch(1, NOW_MS, 5), 0, NOW_MS)
        .unwrap();
    assert_eq!(info.first_offset, h.base_offset);
    let all = read_all(&log);
    assert_eq!(all.len(), 60 - (batches.len() - batches.len() / 2) + 1);
    assert!(all.windows(2).all(|w| w[0].1 + 1 == w[1].0));
}

/// The active segment's indexes are checked when the log opens: a corrupt one is rebuilt then.
#[test]
fn corrupt_index_of_the_active_segment_is_rebuilt_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), small_config(), true);
    for i in 0..40 {
        log.append_as_leader(&mut batch(3, NOW_MS + i, 40), 0, NOW_MS)
            .unwrap();
    }
    let expected = read_all(&log);
    log.close().unwrap();
    let active = *log.segment_base_offsets().last().unwrap();
    drop(log);
    let idx = dir.path().join(format!("{active:020}.index"));
    std::fs::write(&idx, [0xAB; 20]).unwrap();
    let log = open(dir.path(), small_config(), true);
    assert_eq!(log.load_stats().rebuilt_indexes, 1);
    assert_eq!(read_all(&log), expected);
    assert_eq!(std::fs::metadata(&idx).unwrap().len() % 8, 0);
}

/// A log of several segments with timestamps that go back and forth (so the time index's
/// running maximum matters), closed cleanly.
fn log_with_segments(dir: &Path) -> PartitionLog {
    let log = open(dir, small_config(), true);
    for i in 0..80i64 {
        let ts = NOW_MS + (i * 37 % 50) * 10;
        log.append_as_leader(&mut batch(3, ts, 60), 0, NOW_MS)
            .unwrap();
    }
    assert!(log.num_segments() >= 6, "{} segments", log.num_segments());
    log.close().unwrap();
    log
}

fn index_path(dir: &Path, base: i64, ext: &str) -> std::path::PathBuf {
    dir.join(format!("{base:020}.{ext}"))
}

/// Opening a log reads the index files of its active segment only (KIP-263); the others are
/// read on first use.
#[test]
fn opening_a_log_reads_only_the_active_segments_index_files() {
    let dir = tempfile::tempdir().unwrap();
    let bases = log_with_segments(dir.path()).segment_base_offsets();
    let active = *bases.last().unwrap();
    let len = |ext| {
        std::fs::metadata(index_path(dir.path(), active, ext))
            .unwrap()
            .len()
    };
    let active_bytes = len("index") + len("timeindex");
    let all_bytes: u64 = bases
        .iter()
        .flat_map(|b| ["index", "timeindex"].map(|ext| index_path(dir.path(), *b, ext)))
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    assert!(
        active_bytes > 0 && all_bytes > 3 * active_bytes,
        "{active_bytes} {all_bytes}"
    );
    let log = open(dir.path(), small_config(), true);
    assert_eq!(
        log.load_stats().index_bytes_read,
        active_bytes,
        "{:?}",
        log.load_stats()
    );
    // A timestamp lookup beyond every record reads only the time indexes' last entries (two
    // entries each).
    let inactive = bases.len() as u64 - 1;
    assert_eq!(log.fetch_offset_by_timestamp(NOW_MS + 1_000).unwrap(), None);
    let tails = log.index_bytes_read() - active_bytes;
    assert!(
        tails > 0 && tails <= inactive * 24,
        "{tails} bytes for {inactive} segments"
    );
    // A read of the first segment loads its indexes, and only its.
    let first_bytes = len_of(dir.path(), bases[0]);
    log.read(1, 1, i64::MAX, true).unwrap();
    assert_eq!(log.index_bytes_read(), active_bytes + tails + first_bytes);
}

fn len_of(dir: &Path, base: i64) -> u64 {
    ["index", "timeindex"]
        .map(|ext| std::fs::metadata(index_path(dir, base, ext)).unwrap().len())
        .iter()
        .sum()
}

/// Garbage written into the index files of inactive segments between close and reopen is not
/// read at open; it is found at the first lookup, the indexes are rebuilt from the log (the
/// files then equal the good ones), and every lookup answers as with the good indexes.
#[test]
fn a_corrupt_inactive_index_is_rebuilt_on_first_use_and_answers_as_a_good_one() {
    let good = tempfile::tempdir().unwrap();
    let bases = log_with_segments(good.path()).segment_base_offsets();
    let bad = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(good.path()).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), bad.path().join(e.file_name())).unwrap();
    }
    // Garbage in the middle of an offset index, of a time index, a torn offset index, and a
    // time index that is all zeros, in four inactive segments.
    let write_at = |path: &Path, at: u64, bytes: &[u8]| {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        f.write_all_at(bytes, at).unwrap();
    };
    let corrupted = [
        index_path(bad.path(), bases[0], "index"),
        index_path(bad.path(), bases[1], "timeindex"),
        index_path(bad.path(), bases[2], "index"),
        index_path(bad.path(), bases[3], "timeindex"),
    ];
    write_at(&corrupted[0], 8, &[0x5A; 8]);
    write_at(&corrupted[1], 12, &[0x7F; 12]);
    let len = std::fs::metadata(&corrupted[2]).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&corrupted[2])
        .unwrap()
        .set_len(len - 3)
        .unwrap();
    let len = std::fs::metadata(&corrupted[3]).unwrap().len();
    write_at(&corrupted[3], 0, &vec![0; len as usize]);
    let garbage: Vec<Vec<u8>> = corrupted
        .iter()
        .map(|p| std::fs::read(p).unwrap())
        .collect();

    let good_log = open(good.path(), small_config(), true);
    let bad_log = open(bad.path(), small_config(), true);
    // Not read at open.
    assert_eq!(bad_log.load_stats().rebuilt_indexes, 0);
    for (p, g) in corrupted.iter().zip(&garbage) {
        assert_eq!(
            &std::fs::read(p).unwrap(),
            g,
            "{} was touched at open",
            p.display()
        );
    }
    // Every offset.
    for offset in good_log.log_start_offset()..good_log.log_end_offset() {
        let want = good_log.read(offset, 1, i64::MAX, true).unwrap();
        assert_eq!(
            bad_log.read(offset, 1, i64::MAX, true).unwrap(),
            want,
            "offset {offset}"
        );
    }
    // Every timestamp, and the largest.
    for target in NOW_MS - 1..=NOW_MS + 500 {
        assert_eq!(
            bad_log.fetch_offset_by_timestamp(target).unwrap(),
            good_log.fetch_offset_by_timestamp(target).unwrap(),
            "timestamp {target}"
        );
    }
    assert_eq!(
        bad_log.max_timestamp_and_offset().unwrap(),
        good_log.max_timestamp_and_offset().unwrap()
    );
    // Rebuilt: the files hold what the good log's hold.
    for p in &corrupted {
        let name = p.file_name().unwrap();
        assert_eq!(
            std::fs::read(p).unwrap(),
            std::fs::read(good.path().join(name)).unwrap(),
            "{}",
            p.display()
        );
    }
}

#[test]
fn timestamp_lookup_finds_exact_records() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), small_config(), true);
    // Batches of 5 records, timestamps NOW + 10*i + j; every 7th batch gzip-compressed.
    for i in 0..50i64 {
        let mut b = BatchBuilder::new(0, NOW_MS + 10 * i);
        if i % 7 == 0 {
            b = b.compression(Compression::Gzip);
        }
        for j in 0..5 {
            b = b.record(NOW_MS + 10 * i + j, None, Some(&[1u8; 40]), &[]);
        }
        log.append_as_leader(&mut b.build(), 2, NOW_MS).unwrap();
    }
    assert!(log.num_segments() > 1);
    for i in 0..50i64 {
        for j in 0..7 {
            let target = NOW_MS + 10 * i + j;
            if i == 49 && j >= 5 {
                assert!(log.fetch_offset_by_timestamp(target).unwrap().is_none());
                continue;
            }
            let found = log.fetch_offset_by_timestamp(target).unwrap().unwrap();
            let (offset, ts) = if j < 5 {
                (5 * i + j, target)
            } else {
                (5 * (i + 1), target + 10 - j)
            };
            assert_eq!(
                (found.offset, found.timestamp_ms),
                (offset, ts),
                "target {target}"
            );
            assert_eq!(found.leader_epoch, Some(2));
        }
    }
    assert_eq!(log.fetch_offset_by_timestamp(0).unwrap().unwrap().offset, 0);
    let max = log.max_timestamp_and_offset().unwrap().unwrap();
    assert_eq!((max.offset, max.timestamp_ms), (249, NOW_MS + 494));
}

#[test]
fn max_timestamp_is_the_earliest_record_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), LogConfig::default(), true);
    let b = BatchBuilder::new(0, NOW_MS)
        .record(NOW_MS, None, None, &[])
        .record(NOW_MS + 50, None, None, &[])
        .record(NOW_MS + 10, None, None, &[])
        .record(NOW_MS + 50, None, None, &[]);
    log.append_as_leader(&mut b.build(), 0, NOW_MS).unwrap();
    log.append_as_leader(&mut batch(1, NOW_MS + 50, 1), 0, NOW_MS)
        .unwrap();
    let max = log.max_timestamp_and_offset().unwrap().unwrap();
    assert_eq!((max.offset, max.timestamp_ms), (1, NOW_MS + 50));
    let f = log.fetch_offset_by_timestamp(NOW_MS + 20).unwrap().unwrap();
    assert_eq!(f.offset, 1);
}

#[test]
fn producer_dedup_gaps_and_fencing() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), LogConfig::default(), true);
    log.append_as_leader(&mut batch(2, NOW_MS, 1), 0, NOW_MS)
        .unwrap();
    let first = log
        .append_as_leader(&mut idempotent(7, 0, 0, 3), 0, NOW_MS)
        .unwrap();
    assert_eq!((first.first_offset, first.last_offset), (2, 4));
    log.append_as_leader(&mut idempotent(7, 0, 3, 2), 0, NOW_MS)
        .unwrap();
    let dup = log
        .append_as_leader(&mut idempotent(7, 0, 0, 3), 0, NOW_MS)
        .unwrap();
    assert!(dup.duplicate);
    assert_eq!((dup.first_offset, dup.last_offset), (2, 4));
    assert_eq!(log.log_end_offset(), 7);
    let gap = log
        .append_as_leader(&mut idempotent(7, 0, 9, 1), 0, NOW_MS)
        .unwrap_err();
    assert_eq!(gap.kafka_error_code(), 45);
    log.append_as_leader(&mut idempotent(7, 1, 0, 1), 0, NOW_MS)
        .unwrap();
    let fenced = log
        .append_as_leader(&mut idempotent(7, 0, 5, 1), 0, NOW_MS)
        .unwrap_err();
    assert_eq!(fenced.kafka_error_code(), 47);
    assert_eq!(log.log_end_offset(), 8);

    // Clean close and reopen: the last batch is still recognised, sequences continue.
    log.close().unwrap();
    drop(log);
    let log = open(dir.path(), LogConfig::default(), true);
    assert_eq!(log.load_stats().producer_snapshot_offset, Some(8));
    let dup = log
        .append_as_leader(&mut idempotent(7, 1, 0, 1), 0, NOW_MS)
        .unwrap();
    assert!(dup.duplicate);
    assert_eq!(dup.first_offset, 7);
    log.append_as_leader(&mut idempotent(7, 1, 1, 2), 0, NOW_MS)
        .unwrap();
    log.flush().unwrap();
    drop(log); // crash: no snapshot at the end

    // Unclean reopen: snapshot at 8 plus replay of the batch after it.
    let log = open(dir.path(), LogConfig::default(), false);
    assert_eq!(log.load_stats().replayed_producer_batches, 1);
    let dup = log
        .append_as_leader(&mut idempotent(7, 1, 1, 2), 0, NOW_MS)
        .unwrap();
    assert!(dup.duplicate);
    assert_eq!((dup.first_offset, dup.last_offset), (8, 9));
    assert_eq!(
        log.append_as_leader(&mut idempotent(7, 1, 5, 1), 0, NOW_MS)
            .unwrap_err()
            .kafka_error_code(),
        45
    );
    drop(log);

    // Without any snapshot the whole log's headers are replayed.
    for e in std::fs::read_dir(dir.path()).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "snapshot") {
            std::fs::remove_file(p).unwrap();
        }
    }
    let log = open(dir.path(), LogConfig::default(), false);
    assert_eq!(log.load_stats().producer_snapshot_offset, None);
    assert!(
        log.append_as_leader(&mut idempotent(7, 1, 1, 2), 0, NOW_MS)
            .unwrap()
            .duplicate
    );
    assert!(
        !log.append_as_leader(&mut idempotent(7, 1, 3, 1), 0, NOW_MS)
            .unwrap()
            .duplicate
    );
}

#[test]
fn leader_epoch_checkpoint_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), LogConfig::default(), true);
    assert_eq!(log.latest_leader_epoch(), None);
    log.append_as_leader(&mut batch(2, NOW_MS, 1), 0, NOW_MS)
        .unwrap();
    log.append_as_leader(&mut batch(2, NOW_MS, 1), 0, NOW_MS)
        .unwrap();
    log.append_as_leader(&mut batch(1, NOW_MS, 1), 4, NOW_MS)
        .unwrap();
    assert_eq!(log.latest_leader_epoch(), Some(4));
    let text = std::fs::read_to_string(dir.path().join("leader-epoch-checkpoint")).unwrap();
    assert_eq!(text, "0\n2\n0 0\n4 4\n");
    assert_eq!(log.end_offset_for_leader_epoch(0), (0, 4));
    assert_eq!(log.end_offset_for_leader_epoch(4), (4, 5));
    drop(log);
    let log = open(dir.path(), LogConfig::default(), false);
    assert_eq!(log.latest_leader_epoch(), Some(4));
}

#[test]
fn flush_policy_moves_the_recovery_point() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        flush_interval_messages: 5,
        flush_interval_ms: 1000,
        ..LogConfig::default()
    };
    let log = open(dir.path(), config, true);
    log.append_as_leader(&mut batch(3, NOW_MS, 1), 0, NOW_MS)
        .unwrap();
    assert_eq!(log.recovery_point(), 0);
    log.append_as_leader(&mut batch(3, NOW_MS, 1), 0, NOW_MS)
        .unwrap();
    assert_eq!(log.recovery_point(), 6);
    log.append_as_leader(&mut batch(1, NOW_MS, 1), 0, NOW_MS)
        .unwrap();
    assert_eq!(log.recovery_point(), 6);
    let now = gregor_log_now();
    log.flush_if_due(now).unwrap();
    assert_eq!(log.recovery_point(), 6);
    log.flush_if_due(now + 5_000).unwrap();
    assert_eq!(log.recovery_point(), 7);
}

fn gregor_log_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[test]
fn log_manager_reload_clean_and_unclean() {
    let root = tempfile::tempdir().unwrap();
    let dirs = vec![root.path().join("d1"), root.path().join("d2")];
    let names = [
        tp("plain", 0),
        tp("with-dash", 3),
        tp("dots.and-dash-9", 12),
        tp("x", 1),
    ];
    let id = |i: u8| [i; 16];
    {
        let (mgr, loaded) = LogManager::open(&dirs, small_config()).unwrap();
        assert!(loaded.is_empty());
        for (i, name) in names.iter().enumerate() {
            let log = mgr
                .get_or_create(name, id(i as u8), small_config())
                .unwrap();
            for _ in 0..=i {
                log.append_as_leader(&mut batch(2, NOW_MS, 10), 0, NOW_MS)
                    .unwrap();
            }
        }
        // Spread over both directories.
        assert!(std::fs::read_dir(&dirs[0]).unwrap().count() > 2);
        assert!(std::fs::read_dir(&dirs[1]).unwrap().count() > 2);
        let again = mgr.get_or_create(&names[0], id(0), small_config()).unwrap();
        assert_eq!(again.log_end_offset(), 2);
        let err = mgr
            .get_or_create(&names[0], id(9), small_config())
            .unwrap_err();
        assert_eq!(err.kafka_error_code(), 103);
        mgr.shutdown().unwrap();
        assert!(dirs[0].join(".kafka_cleanshutdown").exists());
    }
    {
        let (mgr, loaded) = LogManager::open(&dirs, small_config()).unwrap();
        assert_eq!(loaded.len(), 4);
        for log in &loaded {
            assert_eq!(log.load_stats().recovered_segments, 0, "clean: no scan");
        }
        assert!(!dirs[0].join(".kafka_cleanshutdown").exists());
        for (i, name) in names.iter().enumerate() {
            let log = mgr.get(name).unwrap();
            assert_eq!(log.log_end_offset(), 2 * (i as i64 + 1));
            assert_eq!(mgr.topic_id(name), Some(id(i as u8)));
            let meta = std::fs::read_to_string(log.dir().join("partition.metadata")).unwrap();
            // Byte for byte what Kafka's PartitionMetadataFile writes (no final newline).
            assert_eq!(
                meta,
                format!(
                    "version: 0\ntopic_id: {}",
                    gregor_log::topic_id_to_string(&id(i as u8))
                )
            );
        }
        // Delete one partition; the others stay.
        let victim = mgr.get(&names[1]).unwrap();
        let victim_dir = victim.dir().to_path_buf();
        mgr.delete(&names[1]).unwrap();
        assert!(!victim_dir.exists());
        assert!(mgr.get(&names[1]).is_none());
        assert_eq!(
            victim
                .append_as_leader(&mut batch(1, NOW_MS, 1), 0, NOW_MS)
                .unwrap_err()
                .kafka_error_code(),
            6
        );
        // Crash: no shutdown.
        mgr.get(&names[0])
            .unwrap()
            .append_as_leader(&mut batch(1, NOW_MS, 1), 0, NOW_MS)
            .unwrap();
    }
    {
        // Leftover "-delete" directories are finished, stray ones ignored.
        std::fs::create_dir_all(dirs[0].join("gone-0.0123456789abcdef-delete")).unwrap();
        std::fs::create_dir_all(dirs[0].join("not_a_partition")).unwrap();
        let (mgr, loaded) = LogManager::open(&dirs, small_config()).unwrap();
        assert_eq!(loaded.len(), 3);
        assert!(
            loaded.iter().any(|l| l.load_stats().recovered_segments > 0),
            "unclean: scanned"
        );
        assert_eq!(mgr.get(&names[0]).unwrap().log_end_offset(), 3);
        assert!(!dirs[0].join("gone-0.0123456789abcdef-delete").exists());
        mgr.shutdown().unwrap();
    }
}

#[test]
fn log_dir_is_locked() {
    let root = tempfile::tempdir().unwrap();
    let dirs = vec![root.path().join("d")];
    let (mgr, _) = LogManager::open(&dirs, LogConfig::default()).unwrap();
    assert!(matches!(
        LogManager::open(&dirs, LogConfig::default()).map(|_| ()),
        Err(LogError::DirLocked(_))
    ));
    // Another process taking the fcntl record lock Java's FileLock takes (Kafka's `.lock`) is
    // refused while the manager holds the directory, and gets it once the manager is gone.
    let lock = dirs[0].join(".lock");
    let try_fcntl_lock = || {
        let script = "import fcntl, sys\nf = open(sys.argv[1], 'r+')\ntry:\n    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n    print('locked')\nexcept OSError:\n    print('refused')";
        let out = std::process::Command::new("python3")
            .args(["-c", script])
            .arg(&lock)
            .output()
            .expect("python3");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(try_fcntl_lock(), "refused");
    mgr.shutdown().unwrap();
    drop(mgr);
    assert_eq!(try_fcntl_lock(), "locked");
}

#[test]
fn readers_run_concurrently_with_appends() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(open(dir.path(), small_config(), true));
    let done = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let log = Arc::clone(&log);
            let done = Arc::clone(&done);
            std::thread::spawn(move || {
                let mut offset = 0;
                while !done.load(Ordering::Acquire) || offset < log.log_end_offset() {
                    let r = log.read(offset, 700, i64::MAX, true).unwrap();
                    for item in Batches::new(&r.records) {
                        let (at, h) = item.unwrap();
                        validate_batch(&r.records[at..]).unwrap();
                        assert_eq!(h.base_offset, offset);
                        offset = h.next_offset();
                    }
                }
                offset
            })
        })
        .collect();
    for i in 0..300 {
        log.append_as_leader(&mut batch(1 + i % 3, NOW_MS, 30), 0, NOW_MS)
            .unwrap();
    }
    done.store(true, Ordering::Release);
    for r in readers {
        assert_eq!(r.join().unwrap(), log.log_end_offset());
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]
    #[test]
    fn reads_return_whole_batches_from_the_fetch_offset(
        sizes in proptest::collection::vec((1usize..5, 0usize..300), 1..60),
        fetch_pick in 0usize..1000,
        max_bytes in 1usize..3000,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let log = open(dir.path(), small_config(), true);
        let mut ranges = Vec::new();
        for (n, len) in &sizes {
            let info = log.append_as_leader(&mut batch(*n, NOW_MS, *len), 0, NOW_MS).unwrap();
            ranges.push((info.first_offset, info.last_offset));
        }
        let leo = log.log_end_offset();
        let fetch = (fetch_pick as i64) % leo;
        let r = log.read(fetch, max_bytes, i64::MAX, true).unwrap();
        let batches: Vec<_> = Batches::new(&r.records).map(|b| b.unwrap().1).collect();
        proptest::prop_assert!(!batches.is_empty());
        proptest::prop_assert!(batches[0].base_offset <= fetch && fetch <= batches[0].last_offset());
        proptest::prop_assert!(batches.len() == 1 || r.records.len() <= max_bytes);
        for w in batches.windows(2) {
            proptest::prop_assert_eq!(w[0].next_offset(), w[1].base_offset);
        }
    }
}

#[test]
fn producer_without_state_may_start_at_any_sequence() {
    // Kafka's ProducerAppendInfo.checkSequence accepts any first sequence from a producer it has
    // no state for (its batches may have been removed by retention), then enforces order.
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), LogConfig::default(), true);
    log.append_as_leader(&mut idempotent(8, 0, 4, 1), 0, NOW_MS)
        .unwrap();
    let gap = log
        .append_as_leader(&mut idempotent(8, 0, 6, 1), 0, NOW_MS)
        .unwrap_err();
    assert_eq!(gap.kafka_error_code(), 45);
    log.append_as_leader(&mut idempotent(8, 0, 5, 1), 0, NOW_MS)
        .unwrap();
    assert_eq!(log.log_end_offset(), 2);
}

/// `__cluster_metadata-0` (the KRaft metadata log, which `gregor storage format` seeds with its
/// bootstrap snapshot) shares `log.dirs` with data partitions, but the LogManager neither
/// loads it nor writes into it, as Kafka's LogManager leaves it to the Raft layer.
#[test]
fn log_manager_leaves_the_metadata_log_alone() {
    let dir = tempfile::tempdir().unwrap();
    let meta = dir.path().join("__cluster_metadata-0");
    std::fs::create_dir_all(&meta).unwrap();
    let checkpoint = meta.join("00000000000000000000-0000000000.checkpoint");
    std::fs::write(&checkpoint, b"snapshot bytes").unwrap();
    let data = dir.path().join("t-0");
    std::fs::create_dir_all(&data).unwrap();
    let dirs = vec![dir.path().to_path_buf()];
    let (mgr, loaded) = LogManager::open(&dirs, small_config()).unwrap();
    let names: Vec<String> = loaded
        .iter()
        .map(|l| l.topic_partition().to_string())
        .collect();
    assert_eq!(names, vec!["t-0".to_string()]);
    assert!(mgr.get(&tp("__cluster_metadata", 0)).is_none());
    let files: Vec<String> = std::fs::read_dir(&meta)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(
        files,
        vec!["00000000000000000000-0000000000.checkpoint".to_string()]
    );
}

/// Kafka's `LogValidator.validateTimestamp` is per record: a record in the middle of a batch
/// whose first and largest timestamps are fine is refused (INVALID_TIMESTAMP) and named
/// (KIP-467); the whole batch is refused.
#[test]
fn an_old_record_inside_a_batch_fails_the_batch_with_its_index() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        message_timestamp_before_max_ms: 60_000,
        message_timestamp_after_max_ms: 60_000,
        ..LogConfig::default()
    };
    let log = open(dir.path(), config, true);
    let old = NOW_MS - 120_000;
    let mut b = BatchBuilder::new(0, NOW_MS)
        .record(NOW_MS, Some(b"a"), Some(b"v"), &[])
        .record(old, Some(b"b"), Some(b"v"), &[])
        .record(NOW_MS + 1, Some(b"c"), Some(b"v"), &[])
        .build();
    let e = log.append_as_leader(&mut b, 0, NOW_MS).unwrap_err();
    assert_eq!(e.kafka_error_code(), 32, "{e}");
    assert_eq!(
        e.to_string(),
        "One or more records have been rejected due to invalid timestamp"
    );
    let LogError::RecordValidation { record_errors, .. } = e else {
        panic!("not a record validation error: {e:?}");
    };
    assert_eq!(
        record_errors,
        vec![gregor_log::RecordError {
            batch_index: 1,
            message: format!(
                "Timestamp {old} of message with offset 1 is out of range. The timestamp should be within [{}, {}]",
                NOW_MS - 60_000,
                NOW_MS + 60_000
            ),
        }]
    );
    assert_eq!(log.log_end_offset(), 0);
    // Records without a timestamp (-1) are not checked.
    let mut b = BatchBuilder::new(0, -1)
        .record(-1, Some(b"a"), Some(b"v"), &[])
        .build();
    log.append_as_leader(&mut b, 0, NOW_MS).unwrap();
}

/// After a crash, recovery reads only the segments from the one holding the recovery point
/// (`recovery-point-offset-checkpoint`) on, as Kafka's `LogLoader.recoverLog`: the bytes it
/// scanned are counted.
#[test]
fn recovery_reads_only_what_follows_the_recovery_point() {
    let root = tempfile::tempdir().unwrap();
    let dirs = vec![root.path().join("d")];
    let name = tp("recover", 0);
    let (flushed_bytes, total_bytes, tail_bytes, leo) = {
        let (mgr, _) = LogManager::open(&dirs, small_config()).unwrap();
        let log = mgr.get_or_create(&name, [7; 16], small_config()).unwrap();
        // Several full segments, flushed: the recovery point moves to their end.
        for _ in 0..40 {
            log.append_as_leader(&mut batch(2, NOW_MS, 200), 0, NOW_MS)
                .unwrap();
        }
        log.flush().unwrap();
        mgr.checkpoint_recovery_points().unwrap();
        let flushed = log.size_in_bytes();
        assert!(log.num_segments() > 3, "{} segments", log.num_segments());
        assert_eq!(log.recovery_point(), log.log_end_offset());
        // Appends after the checkpoint: never flushed, then a crash (no shutdown).
        for _ in 0..3 {
            log.append_as_leader(&mut batch(2, NOW_MS, 200), 0, NOW_MS)
                .unwrap();
        }
        let bases = log.segment_base_offsets();
        let rp = log.recovery_point();
        let from = bases.iter().rposition(|b| *b <= rp).unwrap();
        let tail: u64 = log.segment_sizes().iter().skip(from).sum();
        (flushed, log.size_in_bytes(), tail, log.log_end_offset())
    };
    let (mgr, _) = LogManager::open(&dirs, small_config()).unwrap();
    let log = mgr.get(&name).unwrap();
    let stats = log.load_stats();
    assert_eq!(log.log_end_offset(), leo);
    assert!(stats.recovered_segments >= 1);
    assert_eq!(stats.recovered_bytes, tail_bytes, "{stats:?}");
    assert!(
        stats.recovered_bytes < total_bytes / 2,
        "read {} of {total_bytes} bytes ({flushed_bytes} flushed)",
        stats.recovered_bytes
    );
}

/// Recovery calls what it removes what it is: a batch cut short at the end of the log past
/// the recovery point is a crash's torn write; the same cut below the recovery point (flushed
/// data), or in a segment with segments after it, is corruption.
#[test]
fn recovery_tells_a_torn_tail_from_corruption() {
    // (what, which segment is cut: from the end, recovery point is past the cut)
    for (what, from_end, below_recovery_point) in [
        ("torn tail", 1, false),
        ("flushed tail", 1, true),
        ("short of later segments", 3, false),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let log = open(dir.path(), small_config(), true);
        for i in 0..150 {
            log.append_as_leader(&mut batch(2, NOW_MS + i, 50), 0, NOW_MS)
                .unwrap();
        }
        log.flush().unwrap();
        let bases = log.segment_base_offsets();
        let end = log.log_end_offset();
        assert!(bases.len() >= 4);
        drop(log);
        let victim = dir
            .path()
            .join(format!("{:020}.log", bases[bases.len() - from_end]));
        let len = std::fs::metadata(&victim).unwrap().len();
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&victim)
            .unwrap();
        f.set_len(len - 10).unwrap();
        drop(f);
        let recovery_point = if below_recovery_point {
            Some(end)
        } else {
            Some(bases[bases.len() - from_end])
        };
        let log = PartitionLog::open_with_recovery_point(
            dir.path(),
            tp("t", 0),
            small_config(),
            false,
            recovery_point,
        )
        .unwrap();
        let stats = log.load_stats();
        assert!(stats.truncated_bytes > 0, "{what}");
        if what == "torn tail" {
            assert_eq!(
                (stats.torn_tails, stats.corrupt_truncations),
                (1, 0),
                "{what}"
            );
        } else {
            assert_eq!(
                (stats.torn_tails, stats.corrupt_truncations),
                (0, 1),
                "{what}"
            );
        }
    }
}
