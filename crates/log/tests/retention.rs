//! Retention (time, size, log start offset), DeleteRecords and `.deleted` files, against real
//! files.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use gregor_log::{LogConfig, LogError, LogManager, PartitionLog, TopicPartition};
use gregor_protocol::batch::{validate_batch, BatchBuilder, Batches};

const NOW_MS: i64 = 1_700_000_000_000;

fn config() -> LogConfig {
    LogConfig {
        segment_bytes: 2048,
        index_interval_bytes: 256,
        file_delete_delay_ms: 1_000,
        ..LogConfig::default()
    }
}

fn batch(n: usize, ts: i64) -> Vec<u8> {
    let mut b = BatchBuilder::new(0, ts);
    for i in 0..n {
        b = b.record(
            ts,
            Some(format!("k{i}").as_bytes()),
            Some(&[b'v'; 100]),
            &[],
        );
    }
    b.build()
}

fn fill(log: &PartitionLog, batches: usize, ts: i64) {
    for _ in 0..batches {
        log.append_as_leader(&mut batch(3, ts), 0, NOW_MS).unwrap();
    }
}

fn deleted_files(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".deleted")
        })
        .count()
}

#[test]
fn retention_bytes_deletes_oldest_closed_segments() {
    let dir = tempfile::tempdir().unwrap();
    let log = PartitionLog::open(
        dir.path(),
        TopicPartition::new("t", 0),
        LogConfig {
            retention_bytes: 5000,
            ..config()
        },
        true,
    )
    .unwrap();
    fill(&log, 40, NOW_MS);
    let segments = log.num_segments();
    assert!(segments > 5, "{segments}");
    let size = log.size_in_bytes();
    // The high watermark bounds deletion.
    let r = log.delete_old_segments(NOW_MS, 0).unwrap();
    assert_eq!(r.deleted_segments, 0);
    let r = log
        .delete_old_segments(NOW_MS, log.log_end_offset())
        .unwrap();
    assert!(r.deleted_segments > 0);
    assert!(
        log.size_in_bytes() <= 5000 + 2048,
        "{}",
        log.size_in_bytes()
    );
    assert!(size - r.deleted_bytes >= 5000);
    let start = log.log_start_offset();
    assert_eq!(start, log.segment_base_offsets()[0]);
    assert!(matches!(
        log.read(start - 1, 1000, i64::MAX, true),
        Err(LogError::OffsetOutOfRange { .. })
    ));
    let first = log.read(start, 1000, i64::MAX, true).unwrap();
    let (_, h) = Batches::new(&first.records).next().unwrap().unwrap();
    assert_eq!(h.base_offset, start);
    // Files wait for file.delete.delay.ms.
    assert!(deleted_files(dir.path()) > 0);
    assert_eq!(log.next_file_deletion_due_ms(), Some(NOW_MS + 1_000));
    log.delete_due_files(NOW_MS + 999);
    assert!(deleted_files(dir.path()) > 0);
    log.delete_due_files(NOW_MS + 1_000);
    assert_eq!(deleted_files(dir.path()), 0);
}

#[test]
fn retention_ms_can_delete_everything_and_rolls_a_new_active_segment() {
    let dir = tempfile::tempdir().unwrap();
    let log = PartitionLog::open(
        dir.path(),
        TopicPartition::new("t", 0),
        LogConfig {
            retention_ms: 60_000,
            ..config()
        },
        true,
    )
    .unwrap();
    fill(&log, 10, NOW_MS - 120_000);
    let leo = log.log_end_offset();
    // Young enough: nothing goes.
    assert_eq!(
        log.delete_old_segments(NOW_MS - 100_000, leo)
            .unwrap()
            .deleted_segments,
        0
    );
    let r = log.delete_old_segments(NOW_MS, leo).unwrap();
    assert!(r.deleted_segments >= 2);
    assert_eq!(log.log_start_offset(), leo);
    assert_eq!(log.segment_base_offsets(), vec![leo]);
    assert!(log
        .read(leo, 100, i64::MAX, true)
        .unwrap()
        .records
        .is_empty());
    // Appends continue at the log end offset.
    let info = log
        .append_as_leader(&mut batch(1, NOW_MS), 0, NOW_MS)
        .unwrap();
    assert_eq!(info.first_offset, leo);
    // No delete policy: retention does not apply.
    log.update_config(LogConfig {
        retention_ms: 0,
        cleanup_delete: false,
        cleanup_compact: true,
        ..config()
    });
    assert_eq!(
        log.delete_old_segments(NOW_MS + 10_000_000, log.log_end_offset())
            .unwrap()
            .deleted_segments,
        0
    );
}

#[test]
fn delete_records_moves_the_start_and_survives_restart() {
    let dir = tempfile::tempdir().unwrap();
    let tp = TopicPartition::new("t", 0);
    let (mgr, _) = LogManager::open(&[dir.path().to_path_buf()], config()).unwrap();
    let log = mgr.get_or_create(&tp, [7; 16], config()).unwrap();
    fill(&log, 30, NOW_MS);
    let leo = log.log_end_offset();
    assert!(matches!(
        log.maybe_increment_log_start_offset(leo + 1),
        Err(LogError::OffsetOutOfRange { .. })
    ));
    assert_eq!(log.maybe_increment_log_start_offset(40).unwrap(), 40);
    // Smaller offsets change nothing.
    assert_eq!(log.maybe_increment_log_start_offset(10).unwrap(), 40);
    assert!(matches!(
        log.read(39, 1000, i64::MAX, true),
        Err(LogError::OffsetOutOfRange { .. })
    ));
    log.read(40, 1000, i64::MAX, true).unwrap();
    let before = log.num_segments();
    let r = log.delete_old_segments(NOW_MS, leo).unwrap();
    assert!(r.deleted_segments > 0 && log.num_segments() < before);
    assert!(log.segment_base_offsets()[0] <= 40);
    mgr.checkpoint_log_start_offsets().unwrap();
    let text =
        std::fs::read_to_string(dir.path().join(gregor_log::LOG_START_OFFSET_CHECKPOINT)).unwrap();
    assert_eq!(text, "0\n1\nt 0 40\n");
    drop(log);
    // kill -9: no clean shutdown, the checkpoint restores the start.
    drop(mgr);
    let (mgr, loaded) = LogManager::open(&[dir.path().to_path_buf()], config()).unwrap();
    assert_eq!(loaded.len(), 1);
    let log = mgr.get(&tp).unwrap();
    assert_eq!(log.log_start_offset(), 40);
    assert_eq!(log.log_end_offset(), leo);
    assert!(matches!(
        log.read(39, 1000, i64::MAX, true),
        Err(LogError::OffsetOutOfRange { .. })
    ));
}

#[test]
fn readers_never_see_garbage_while_segments_are_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(
        PartitionLog::open(
            dir.path(),
            TopicPartition::new("t", 0),
            LogConfig {
                retention_bytes: 3000,
                file_delete_delay_ms: 0,
                ..config()
            },
            true,
        )
        .unwrap(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let log = log.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut ok = 0u64;
            let mut out_of_range = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let offset = log.log_start_offset();
                match log.read(offset, 4096, i64::MAX, true) {
                    Ok(r) => {
                        for b in Batches::new(&r.records) {
                            let (at, h) = b.unwrap();
                            validate_batch(&r.records[at..]).unwrap();
                            assert!(h.last_offset() >= offset);
                        }
                        ok += 1;
                    }
                    Err(LogError::OffsetOutOfRange { .. }) => out_of_range += 1,
                    Err(e) => panic!("unexpected error {e}"),
                }
            }
            (ok, out_of_range)
        })
    };
    for round in 0..200 {
        fill(&log, 2, NOW_MS);
        let now = NOW_MS + round;
        log.delete_old_segments(now, log.log_end_offset()).unwrap();
        log.delete_due_files(now);
    }
    stop.store(true, Ordering::Relaxed);
    let (ok, _) = reader.join().unwrap();
    assert!(ok > 0);
    assert_eq!(deleted_files(dir.path()), 0);
}

/// Retention by time keeps a segment on its time index's last entry alone, but deletes one
/// only on its checked index: a last entry corrupted into an older timestamp (still after the
/// entry before it, so it looks plausible) does not delete the segment early.
#[test]
fn a_corrupt_last_time_entry_does_not_delete_a_segment_early() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let retention = LogConfig {
        retention_ms: 60_000,
        ..config()
    };
    let open = || {
        PartitionLog::open(
            dir.path(),
            TopicPartition::new("t", 0),
            retention.clone(),
            true,
        )
        .unwrap()
    };
    let first_max = {
        let log = open();
        // One batch a second: the first segment's time entries are seconds apart.
        for i in 0..20 {
            log.append_as_leader(&mut batch(3, NOW_MS + i * 1_000), 0, NOW_MS)
                .unwrap();
        }
        assert!(log.num_segments() > 2);
        log.close().unwrap();
        let next = log.segment_base_offsets()[1];
        // The first segment's max timestamp: its last batch's.
        let last = log.read(next - 1, 1, i64::MAX, true).unwrap();
        let (_, h) = Batches::new(&last.records).next().unwrap().unwrap();
        h.max_timestamp
    };
    // Replace the first segment's last time entry with one a millisecond after the entry
    // before it.
    let path = dir.path().join(format!("{:020}.timeindex", 0));
    let bytes = std::fs::read(&path).unwrap();
    assert!(bytes.len() >= 24, "{} bytes", bytes.len());
    let prev = &bytes[bytes.len() - 24..bytes.len() - 12];
    let prev_ts = i64::from_be_bytes(prev[..8].try_into().unwrap());
    assert!(prev_ts + 1 < first_max, "{prev_ts} {first_max}");
    let mut forged = (prev_ts + 1).to_be_bytes().to_vec();
    forged.extend_from_slice(&prev[8..12]);
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(&forged, bytes.len() as u64 - 12).unwrap();
    drop(f);
    let log = open();
    // Expired by the forged entry, not by the segment's real max timestamp.
    let now = prev_ts + 1 + 60_001;
    assert!(now - first_max <= 60_000);
    let r = log.delete_old_segments(now, log.log_end_offset()).unwrap();
    assert_eq!(r.deleted_segments, 0);
    assert_eq!(log.log_start_offset(), 0);
    // Checked, the index was rebuilt: the real max timestamp expires it later.
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
    let r = log
        .delete_old_segments(first_max + 60_001, log.log_end_offset())
        .unwrap();
    assert!(r.deleted_segments >= 1);
}
