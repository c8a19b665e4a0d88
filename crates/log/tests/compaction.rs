//! The log cleaner against a model (property test), interrupted swaps at every step, and the
//! cleaner's throughput (`cargo test -p gregor-log --test compaction -- --ignored
//! --nocapture cleaner_throughput`).

use std::collections::BTreeMap;
use std::path::Path;

use gregor_log::{CleanerConfig, LogCleaner, LogConfig, LogError, PartitionLog, TopicPartition};
use gregor_protocol::batch::{BatchBuilder, BatchHeader, Batches, Compression};
use gregor_protocol::records::decode_records;
use proptest::prelude::*;

const NOW_MS: i64 = 1_700_000_000_000;
const DELETE_RETENTION_MS: i64 = 60_000;

fn config(segment_bytes: u64) -> LogConfig {
    LogConfig {
        segment_bytes,
        index_interval_bytes: 128,
        cleanup_compact: true,
        cleanup_delete: false,
        min_cleanable_dirty_ratio: 0.0,
        delete_retention_ms: DELETE_RETENTION_MS,
        ..LogConfig::default()
    }
}

/// A record as read back: offset, key, value (None = tombstone).
type Rec = (i64, Vec<u8>, Option<Vec<u8>>);

fn append(log: &PartitionLog, records: &[(u8, Option<u16>)], codec: Compression) {
    let mut b = BatchBuilder::new(0, NOW_MS).compression(codec);
    for (k, v) in records {
        let key = format!("key-{k}");
        let value = v.map(|v| format!("value-{v}-{}", "x".repeat(usize::from(v % 40))));
        b = b.record(
            NOW_MS,
            Some(key.as_bytes()),
            value.as_deref().map(str::as_bytes),
            &[],
        );
    }
    log.append_as_leader(&mut b.build(), 0, NOW_MS).unwrap();
}

fn read_all(log: &PartitionLog) -> (Vec<Rec>, Vec<BatchHeader>) {
    let mut out = Vec::new();
    let mut headers = Vec::new();
    let mut offset = log.log_start_offset();
    let leo = log.log_end_offset();
    while offset < leo {
        let r = log.read(offset, 1 << 20, i64::MAX, true).unwrap();
        if r.records.is_empty() {
            break;
        }
        for b in Batches::new(&r.records) {
            let (at, h) = b.unwrap();
            let raw = &r.records[at..at + h.total_size()];
            for rec in decode_records(raw).unwrap() {
                out.push((
                    h.base_offset + i64::from(rec.offset_delta),
                    rec.key.unwrap().to_vec(),
                    rec.value.map(|v| v.to_vec()),
                ));
            }
            headers.push(h);
            offset = h.next_offset();
        }
    }
    (out, headers)
}

fn cleaner() -> LogCleaner {
    LogCleaner::new(CleanerConfig::default())
}

/// Latest record per key among `records` with offset below `below`, plus every record at or
/// above it (the active segment is never cleaned); tombstones dropped when `drop_tombstones`.
fn model(records: &[Rec], below: i64, drop_tombstones: bool) -> Vec<Rec> {
    let mut latest: BTreeMap<&[u8], i64> = BTreeMap::new();
    for (o, k, _) in records.iter().filter(|r| r.0 < below) {
        latest.insert(k, *o);
    }
    records
        .iter()
        .filter(|(o, k, v)| {
            *o >= below || (latest[k.as_slice()] == *o && !(drop_tombstones && v.is_none()))
        })
        .cloned()
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    #[test]
    fn cleaned_log_matches_latest_per_key(
        batches in prop::collection::vec(
            (prop::collection::vec((0u8..12, prop::option::weighted(0.8, 0u16..1000)), 1..6),
             prop::sample::select(vec![Compression::None, Compression::Gzip, Compression::Lz4,
                                       Compression::Snappy, Compression::Zstd])),
            5..60),
        dedupe_entries in prop::sample::select(vec![3u64, 20, 100_000]),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let log = PartitionLog::open(dir.path(), TopicPartition::new("c", 0), config(1024), true)
            .unwrap();
        for (records, codec) in &batches {
            append(&log, records, *codec);
        }
        let (original, _) = read_all(&log);
        let active_base = *log.segment_base_offsets().last().unwrap();
        let cleaner = LogCleaner::new(CleanerConfig {
            dedupe_buffer_bytes: dedupe_entries * 24,
            io_buffer_load_factor: 1.0,
            ..CleanerConfig::default()
        });
        // Clean until the checkpoint reaches the active segment (small maps need rounds).
        let mut rounds = 0;
        while cleaner.clean(&log, log.log_end_offset(), NOW_MS).unwrap().is_some() {
            rounds += 1;
            prop_assert!(rounds < 200);
        }
        let (cleaned, headers) = read_all(&log);
        let offsets: Vec<i64> = cleaned.iter().map(|r| r.0).collect();
        prop_assert!(offsets.windows(2).all(|w| w[0] < w[1]), "offsets increase");
        for w in headers.windows(2) {
            prop_assert!(w[0].next_offset() <= w[1].base_offset);
        }
        // Every kept record is the original at that offset.
        let by_offset: BTreeMap<i64, &Rec> = original.iter().map(|r| (r.0, r)).collect();
        for r in &cleaned {
            prop_assert_eq!(by_offset[&r.0], r);
        }
        if log.cleaner_checkpoint() == Some(active_base) {
            prop_assert_eq!(&cleaned, &model(&original, active_base, false));
        }
        // Tombstones survive until delete.retention.ms after cleaning, then go.
        let still = cleaner.clean(&log, log.log_end_offset(), NOW_MS + DELETE_RETENTION_MS - 1)
            .unwrap();
        prop_assert!(still.is_none());
        while cleaner
            .clean(&log, log.log_end_offset(), NOW_MS + DELETE_RETENTION_MS + 1)
            .unwrap()
            .is_some()
        {
            rounds += 1;
            prop_assert!(rounds < 400);
        }
        let (final_records, _) = read_all(&log);
        prop_assert_eq!(&final_records, &model(&original, active_base, true));
        // The log reopens (recovery validates every stored batch) to the same records.
        drop(log);
        let log = PartitionLog::open(dir.path(), TopicPartition::new("c", 0), config(1024), false)
            .unwrap();
        prop_assert_eq!(log.load_stats().truncated_bytes, 0);
        prop_assert_eq!(read_all(&log).0, final_records);
    }
}

#[test]
fn keyless_records_are_rejected_on_compacted_topics() {
    let dir = tempfile::tempdir().unwrap();
    let log = PartitionLog::open(
        dir.path(),
        TopicPartition::new("c", 0),
        config(1 << 20),
        true,
    )
    .unwrap();
    let mut b = BatchBuilder::new(0, NOW_MS)
        .record(NOW_MS, Some(b"k"), Some(b"v"), &[])
        .record(NOW_MS, None, Some(b"v"), &[])
        .build();
    let e = log.append_as_leader(&mut b, 0, NOW_MS).unwrap_err();
    assert_eq!(e.kafka_error_code(), 87);
    // Kafka 4.4's LogValidator texts; the record errors name the keyless record (KIP-467).
    let key_error = "Compacted topic cannot accept message without key in topic partition c-0";
    assert_eq!(
        e.to_string(),
        format!("One or more records have been rejected due to 1 record errors in total, and only showing the first three errors at most: [RecordError(batchIndex=1, message='{key_error}')]")
    );
    let gregor_log::LogError::RecordValidation { record_errors, .. } = e else {
        panic!("not a record validation error: {e:?}");
    };
    assert_eq!(
        record_errors,
        vec![gregor_log::RecordError {
            batch_index: 1,
            message: key_error.to_string()
        }]
    );
    assert_eq!(log.log_end_offset(), 0, "nothing of the batch is appended");
}

#[test]
fn idempotent_producer_keeps_its_last_sequence_after_cleaning() {
    let dir = tempfile::tempdir().unwrap();
    let log =
        PartitionLog::open(dir.path(), TopicPartition::new("c", 0), config(1024), true).unwrap();
    let mut seq = 0;
    for i in 0..40 {
        let mut b = BatchBuilder::new(0, NOW_MS)
            .producer(5, 0, seq)
            .record(NOW_MS, Some(b"same"), Some(format!("v{i}").as_bytes()), &[])
            .record(NOW_MS, Some(b"same"), Some(&[b'x'; 80]), &[])
            .build();
        seq += 2;
        log.append_as_leader(&mut b, 0, NOW_MS).unwrap();
    }
    // A plain producer's batches make the idempotent one's last batch sit in a closed segment.
    for _ in 0..20 {
        append(&log, &[(1, Some(1))], Compression::None);
    }
    while cleaner()
        .clean(&log, log.log_end_offset(), NOW_MS)
        .unwrap()
        .is_some()
    {}
    let (_, headers) = read_all(&log);
    let last = headers.iter().rfind(|h| h.producer_id == 5).unwrap();
    assert_eq!(last.last_sequence(), seq - 1);
    // Reopened (producer state rebuilt from the log), the next sequence is accepted and a
    // retry of the last batch is not.
    drop(log);
    let log =
        PartitionLog::open(dir.path(), TopicPartition::new("c", 0), config(1024), false).unwrap();
    let mut next = BatchBuilder::new(0, NOW_MS)
        .producer(5, 0, seq)
        .record(NOW_MS, Some(b"same"), Some(b"new"), &[])
        .build();
    log.append_as_leader(&mut next, 0, NOW_MS).unwrap();
    let mut gap = BatchBuilder::new(0, NOW_MS)
        .producer(5, 0, seq + 5)
        .record(NOW_MS, Some(b"same"), Some(b"gap"), &[])
        .build();
    assert!(matches!(
        log.append_as_leader(&mut gap, 0, NOW_MS),
        Err(LogError::OutOfOrderSequence { .. })
    ));
}

/// A simulated crash point: its name, the cleaned files present as `(extension, suffix)`, and
/// whether recovery completes the swap.
type Step = (&'static str, &'static [(&'static str, &'static str)], bool);

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

fn name(base: i64, ext: &str) -> String {
    format!("{base:020}.{ext}")
}

/// Simulates kill -9 at each step of the cleaner's swap: the directory is left as the swap
/// protocol would leave it, then reopened without a clean shutdown.
#[test]
fn crash_at_every_swap_step_leaves_a_log_that_recovers() {
    let original = tempfile::tempdir().unwrap();
    let tp = TopicPartition::new("c", 0);
    {
        let log = PartitionLog::open(original.path(), tp.clone(), config(4096), true).unwrap();
        for i in 0..120u16 {
            append(&log, &[((i % 7) as u8, Some(i))], Compression::Gzip);
        }
        log.close().unwrap();
    }
    let cleaned = tempfile::tempdir().unwrap();
    copy_dir(original.path(), cleaned.path());
    let (before, after) = {
        let log = PartitionLog::open(cleaned.path(), tp.clone(), config(4096), true).unwrap();
        let before = read_all(&log).0;
        cleaner()
            .clean(&log, log.log_end_offset(), NOW_MS)
            .unwrap()
            .unwrap();
        log.delete_due_files(i64::MAX);
        log.close().unwrap();
        (before, read_all(&log).0)
    };
    assert!(after.len() < before.len());
    // The first group of the original log was cleaned into segment 0 of `cleaned`.
    let reopened = |dir: &Path| {
        let log = PartitionLog::open(dir, tp.clone(), config(4096), false).unwrap();
        let leftovers: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".cleaned") || n.ends_with(".swap") || n.ends_with(".deleted"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        read_all(&log).0
    };
    let cleaned_segment_end = {
        let log = PartitionLog::open(cleaned.path(), tp.clone(), config(4096), true).unwrap();
        log.segment_base_offsets()[1]
    };
    let expected_after_swap: Vec<Rec> = after
        .iter()
        .filter(|r| r.0 < cleaned_segment_end)
        .chain(before.iter().filter(|r| r.0 >= cleaned_segment_end))
        .cloned()
        .collect();
    let steps: [Step; 5] = [
        // Cleaned files written (maybe partly): the round never started swapping.
        (
            "cleaned",
            &[("log", ".cleaned"), ("index", ".cleaned")],
            false,
        ),
        // Indexes renamed to .swap, log still .cleaned.
        (
            "index-swapped",
            &[
                ("log", ".cleaned"),
                ("index", ".swap"),
                ("timeindex", ".swap"),
            ],
            false,
        ),
        // Everything .swap, old segments intact.
        (
            "swapped",
            &[("log", ".swap"), ("index", ".swap"), ("timeindex", ".swap")],
            true,
        ),
        // Everything .swap, old segments renamed .deleted.
        (
            "old-deleted",
            &[("log", ".swap"), ("index", ".swap"), ("timeindex", ".swap")],
            true,
        ),
        // Index renamed into place, log still .swap.
        (
            "index-final",
            &[("log", ".swap"), ("index", ""), ("timeindex", "")],
            true,
        ),
    ];
    let old_bases: Vec<i64> = {
        let log = PartitionLog::open(original.path(), tp.clone(), config(4096), true).unwrap();
        log.segment_base_offsets()
            .into_iter()
            .filter(|b| *b < cleaned_segment_end)
            .collect()
    };
    for (step, files, completes) in steps {
        let dir = tempfile::tempdir().unwrap();
        copy_dir(original.path(), dir.path());
        let _ = std::fs::remove_file(dir.path().join(".kafka_cleanshutdown"));
        if step == "old-deleted" || step == "index-final" {
            for b in &old_bases {
                for ext in ["log", "index", "timeindex"] {
                    let _ = std::fs::rename(
                        dir.path().join(name(*b, ext)),
                        dir.path().join(name(*b, ext) + ".deleted"),
                    );
                }
            }
        }
        for (ext, suffix) in files {
            std::fs::copy(
                cleaned.path().join(name(0, ext)),
                dir.path().join(name(0, ext) + suffix),
            )
            .unwrap();
        }
        let got = reopened(dir.path());
        if completes {
            assert_eq!(got, expected_after_swap, "step {step}");
        } else {
            assert_eq!(got, before, "step {step}");
        }
    }
}

/// Cleaner throughput on a 64 MiB log of 1 KiB records over 10,000 keys (uncompressed),
/// reported in MB/s of log cleaned. Run in release or debug:
/// `cargo test -p gregor-log --test compaction -- --ignored --nocapture cleaner_throughput`.
#[test]
#[ignore = "benchmark; run explicitly"]
fn cleaner_throughput() {
    let dir = tempfile::tempdir().unwrap();
    let log = PartitionLog::open(
        dir.path(),
        TopicPartition::new("bench", 0),
        config(16 * 1024 * 1024),
        true,
    )
    .unwrap();
    let value = vec![b'v'; 1000];
    let mut written = 0u64;
    let mut i = 0u64;
    while written < 64 * 1024 * 1024 {
        let mut b = BatchBuilder::new(0, NOW_MS);
        for _ in 0..16 {
            b = b.record(
                NOW_MS,
                Some(format!("key-{}", i % 10_000).as_bytes()),
                Some(&value),
                &[],
            );
            i += 1;
        }
        let mut raw = b.build();
        written += raw.len() as u64;
        log.append_as_leader(&mut raw, 0, NOW_MS).unwrap();
    }
    let size = log.size_in_bytes();
    let started = std::time::Instant::now();
    let stats = cleaner()
        .clean(&log, log.log_end_offset(), NOW_MS)
        .unwrap()
        .unwrap();
    let secs = started.elapsed().as_secs_f64();
    let mb = (stats.bytes_read + stats.map_bytes_read) as f64 / 1e6;
    println!(
        "cleaned {:.1} MB log ({} records read, {} kept, {} -> {} bytes) in {secs:.2} s: {:.1} MB/s of log cleaned ({:.1} MB/s counting the map pass)",
        stats.bytes_read as f64 / 1e6,
        stats.records_read,
        stats.records_retained,
        size,
        log.size_in_bytes(),
        stats.bytes_read as f64 / 1e6 / secs,
        mb / secs,
    );
}

/// Transactions on a compacted topic: an aborted value does not make the cleaner drop the
/// committed value of its key (Kafka's offset map skips aborted records), the aborted records
/// and markers it keeps stay listed in the cleaned segment's `.txnindex`, so read_committed
/// still skips them.
#[test]
fn aborted_values_do_not_shadow_committed_ones_when_cleaning() {
    use gregor_protocol::control::{EndTxnMarker, TransactionResult};
    let dir = tempfile::tempdir().unwrap();
    let log =
        PartitionLog::open(dir.path(), TopicPartition::new("c", 0), config(1024), true).unwrap();
    append(&log, &[(1, Some(1))], Compression::None);
    let mut aborted = BatchBuilder::new(0, NOW_MS)
        .producer(9, 0, 0)
        .transactional(true, false)
        .record(NOW_MS, Some(b"key-1"), Some(b"aborted"), &[])
        .build();
    log.append_as_leader(&mut aborted, 0, NOW_MS).unwrap();
    let marker = EndTxnMarker {
        result: TransactionResult::Abort,
        coordinator_epoch: 0,
    };
    log.append_txn_marker(9, 0, marker, 0, NOW_MS).unwrap();
    // Other keys until the transaction sits in closed segments.
    for i in 0..30u8 {
        append(&log, &[(10 + i, Some(2))], Compression::None);
    }
    let hw = log.log_end_offset();
    log.on_high_watermark_updated(hw);
    while cleaner().clean(&log, hw, NOW_MS).unwrap().is_some() {}
    let (records, _) = read_all(&log);
    let key1: Vec<_> = records
        .iter()
        .filter(|(_, k, _)| k.as_slice() == b"key-1")
        .map(|(o, _, v)| (*o, v.clone()))
        .collect();
    assert_eq!(
        key1.first().map(|(o, _)| *o),
        Some(0),
        "the committed value of key-1 was cleaned away: {key1:?}"
    );
    // The aborted record, if kept, is still known to be aborted.
    if key1.iter().any(|(o, _)| *o == 1) {
        let txns = log.collect_aborted_transactions(0, hw).unwrap();
        assert!(
            txns.iter()
                .any(|t| t.producer_id == 9 && t.first_offset == 1),
            "{txns:?}"
        );
    }
}

/// One batch of a transactional producer: `records` as (key, value).
fn append_txn(log: &PartitionLog, pid: i64, epoch: i16, seq: i32, records: &[(&str, &str)]) {
    let mut b = BatchBuilder::new(0, NOW_MS)
        .producer(pid, epoch, seq)
        .transactional(true, false);
    for (k, v) in records {
        b = b.record(NOW_MS, Some(k.as_bytes()), Some(v.as_bytes()), &[]);
    }
    log.append_as_leader(&mut b.build(), 0, NOW_MS).unwrap();
}

fn append_marker(log: &PartitionLog, pid: i64, epoch: i16, commit: bool) -> i64 {
    use gregor_protocol::control::{EndTxnMarker, TransactionResult};
    let marker = EndTxnMarker {
        result: TransactionResult::from_commit_flag(commit),
        coordinator_epoch: 0,
    };
    log.append_txn_marker(pid, epoch, marker, 0, NOW_MS)
        .unwrap()
        .first_offset
}

/// What consumers read, as the latest value of each key: read_uncommitted takes every data
/// record; read_committed skips the batches of the aborted transactions the log reports for
/// the range (Kafka's consumer with `AbortedTransactions`). Also the control batches' (base
/// offset, record count, has a delete horizon).
#[allow(clippy::type_complexity)]
fn consumer_views(
    log: &PartitionLog,
) -> (
    BTreeMap<Vec<u8>, Vec<u8>>,
    BTreeMap<Vec<u8>, Vec<u8>>,
    Vec<(i64, i32, bool)>,
) {
    let leo = log.log_end_offset();
    let aborted = log.collect_aborted_transactions(0, leo).unwrap();
    let (mut uncommitted, mut committed, mut markers) =
        (BTreeMap::new(), BTreeMap::new(), Vec::new());
    let mut offset = log.log_start_offset();
    while offset < leo {
        let r = log.read(offset, 1 << 20, i64::MAX, true).unwrap();
        if r.records.is_empty() {
            break;
        }
        for b in Batches::new(&r.records) {
            let (at, h) = b.unwrap();
            offset = h.next_offset();
            if h.is_control() {
                markers.push((h.base_offset, h.records_count, h.has_delete_horizon()));
                continue;
            }
            let is_aborted = h.is_transactional()
                && aborted.iter().any(|a| {
                    a.producer_id == h.producer_id
                        && a.first_offset <= h.base_offset
                        && h.base_offset <= a.last_offset
                });
            let raw = &r.records[at..at + h.total_size()];
            for rec in decode_records(raw).unwrap() {
                let (k, v) = (rec.key.unwrap().to_vec(), rec.value.unwrap().to_vec());
                uncommitted.insert(k.clone(), v.clone());
                if !is_aborted {
                    committed.insert(k, v);
                }
            }
        }
    }
    (uncommitted, committed, markers)
}

/// Kafka's cleaner and transactions (`CleanedTransactionMetadata`, KIP-98 and KIP-534): the
/// first pass removes the aborted batches and keeps their ABORT marker with its `.txnindex`
/// entry; a later pass finds markers whose transaction has no batch left (the aborted one, and
/// a committed one whose only record was superseded) and sets their delete horizon; the first
/// pass after `delete.retention.ms` removes them, and their index entry with them. Markers
/// whose transaction still has data, or that are their producer's last record, stay.
/// read_committed reads the same latest values throughout.
#[test]
fn aborted_transactions_and_then_their_markers_are_cleaned() {
    let dir = tempfile::tempdir().unwrap();
    let log =
        PartitionLog::open(dir.path(), TopicPartition::new("c", 0), config(1024), true).unwrap();
    append(&log, &[(1, Some(1))], Compression::None); // 0
    append_txn(&log, 9, 0, 0, &[("key-1", "aborted"), ("key-2", "aborted")]); // 1-2
    assert_eq!(append_marker(&log, 9, 1, false), 3); // transaction.version 2: bumped epoch
    append_txn(&log, 8, 0, 0, &[("key-3", "committed")]); // 4
    assert_eq!(append_marker(&log, 8, 1, true), 5);
    append_txn(&log, 9, 1, 0, &[("key-5", "committed")]); // 6
    assert_eq!(append_marker(&log, 9, 2, true), 7);
    append_txn(&log, 8, 1, 0, &[("key-3", "committed-2")]); // 8
    assert_eq!(append_marker(&log, 8, 2, true), 9);
    let fill = |from: u8| {
        for i in 0..30u8 {
            append(&log, &[(from + i, Some(2))], Compression::None);
        }
        let hw = log.log_end_offset();
        log.on_high_watermark_updated(hw);
        hw
    };
    let hw = fill(20);
    let (uncommitted, committed_before, markers) = consumer_views(&log);
    assert_eq!(uncommitted[b"key-1".as_slice()], b"aborted");
    assert_eq!(
        markers,
        vec![(3, 1, false), (5, 1, false), (7, 1, false), (9, 1, false)]
    );
    assert_eq!(
        log.collect_aborted_transactions(0, hw)
            .unwrap()
            .iter()
            .map(|a| (a.producer_id, a.first_offset, a.last_offset))
            .collect::<Vec<_>>(),
        vec![(9, 1, 3)]
    );

    // Pass 1: the aborted batch goes; every marker stays (each transaction had a batch in the
    // pass), the ABORT marker with its index entry.
    cleaner().clean(&log, hw, NOW_MS).unwrap().unwrap();
    let (uncommitted, committed, markers) = consumer_views(&log);
    assert_eq!(committed, committed_before);
    assert_eq!(uncommitted, committed, "no aborted record is left");
    assert_eq!(
        markers,
        vec![(3, 1, false), (5, 1, false), (7, 1, false), (9, 1, false)]
    );
    assert_eq!(
        log.collect_aborted_transactions(0, hw)
            .unwrap()
            .iter()
            .map(|a| (a.producer_id, a.first_offset, a.last_offset))
            .collect::<Vec<_>>(),
        vec![(9, 1, 3)]
    );

    // Pass 2 (new dirty data): markers 3 and 5 have no batch left; they get a delete horizon.
    let hw = fill(60);
    let now = NOW_MS + 1;
    cleaner().clean(&log, hw, now).unwrap().unwrap();
    let (_, committed, markers) = consumer_views(&log);
    let mut expected = committed_before.clone();
    for i in 60..90u8 {
        expected.insert(
            format!("key-{i}").into_bytes(),
            format!("value-2-{}", "x".repeat(2)).into_bytes(),
        );
    }
    assert_eq!(committed, expected);
    assert_eq!(
        markers,
        vec![(3, 1, true), (5, 1, true), (7, 1, false), (9, 1, false)]
    );
    // Before the horizon nothing more goes, even when cleaned again.
    let hw = fill(100);
    cleaner()
        .clean(&log, hw, now + DELETE_RETENTION_MS - 1)
        .unwrap();
    assert_eq!(consumer_views(&log).2.len(), 4);

    // Pass 3, past the horizon: the log is due for cleaning without new data (KIP-534), and
    // both markers go with the ABORT's index entry. Producer 9's and 8's last markers stay.
    let later = now + DELETE_RETENTION_MS;
    let c = LogCleaner::cleanability(&log, hw, later).unwrap();
    assert!(c.must_clean, "{c:?}");
    cleaner().clean(&log, hw, later).unwrap().unwrap();
    let (_, committed_after, markers) = consumer_views(&log);
    assert_eq!(markers, vec![(7, 1, false), (9, 1, false)]);
    assert!(log.collect_aborted_transactions(0, hw).unwrap().is_empty());
    assert_eq!(committed_after[b"key-1".as_slice()], b"value-1-x");
    assert_eq!(committed_after[b"key-3".as_slice()], b"committed-2");
    assert_eq!(committed_after[b"key-5".as_slice()], b"committed");
    assert!(!committed_after.contains_key(b"key-2".as_slice()));

    // The cleaned log reopens with the same producer state (epochs from the kept markers).
    drop(log);
    let log =
        PartitionLog::open(dir.path(), TopicPartition::new("c", 0), config(1024), false).unwrap();
    assert_eq!(consumer_views(&log).1, committed_after);
    log.on_high_watermark_updated(log.log_end_offset());
    assert_eq!(log.first_unstable_offset(), None);
}
