//! `PartitionLog::append_as_follower` (batches keep their offsets and epochs, control batches
//! allowed) and `PartitionLog::truncate_to` (whole batches, segments, epoch cache, durability
//! across a reopen).

use gregor_log::{LogConfig, LogError, PartitionLog, TopicPartition};
use gregor_protocol::batch::{set_partition_leader_epoch, BatchBuilder};

fn batch(base: i64, epoch: i32, records: usize, control: bool) -> Vec<u8> {
    let mut b = BatchBuilder::new(base, 1_000);
    if control {
        b = b.transactional(false, true);
    }
    for _ in 0..records {
        b = b.record(1_000, Some(&[0, 0, 0, 2]), Some(&[9u8; 50]), &[]);
    }
    let mut v = b.build();
    set_partition_leader_epoch(&mut v, epoch);
    v
}

fn config() -> LogConfig {
    LogConfig {
        segment_bytes: 400,
        ..LogConfig::default()
    }
}

fn open(dir: &std::path::Path, clean: bool) -> PartitionLog {
    PartitionLog::open(
        dir,
        TopicPartition::new("__cluster_metadata", 0),
        config(),
        clean,
    )
    .unwrap()
}

#[test]
fn follower_batches_keep_offsets_and_epochs_across_segments() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), true);
    log.append_as_follower(&batch(0, 1, 1, true), 0).unwrap();
    let mut next = 1;
    for epoch in [1, 1, 2, 2, 2, 4] {
        let b = batch(next, epoch, 2, false);
        let info = log.append_as_follower(&b, 0).unwrap();
        assert_eq!((info.first_offset, info.last_offset), (next, next + 1));
        next += 2;
    }
    assert_eq!(log.log_end_offset(), next);
    assert!(log.num_segments() > 1, "segment.bytes 400 must roll");
    let epochs: Vec<_> = log
        .leader_epoch_entries()
        .iter()
        .map(|e| (e.epoch, e.start_offset))
        .collect();
    assert_eq!(epochs, vec![(1, 0), (2, 5), (4, 11)]);
    // Not at the log end offset: refused, nothing written.
    assert!(matches!(
        log.append_as_follower(&batch(next + 1, 4, 1, false), 0),
        Err(LogError::InvalidRecord(_))
    ));
    let mut corrupt = batch(next, 4, 1, false);
    let last = corrupt.len() - 1;
    corrupt[last] ^= 1;
    assert!(log.append_as_follower(&corrupt, 0).is_err());
    assert_eq!(log.log_end_offset(), next);
    log.close().unwrap();
    let log = open(dir.path(), false);
    assert_eq!(log.log_end_offset(), next);
    assert_eq!(log.latest_leader_epoch(), Some(4));
    let all = log.read(0, usize::MAX, i64::MAX, true).unwrap();
    assert!(!all.records.is_empty());
}

#[test]
fn truncate_to_removes_whole_batches_segments_and_epochs_durably() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), true);
    let mut next = 0;
    for epoch in [1, 1, 1, 2, 2, 3, 3, 3] {
        log.append_as_follower(&batch(next, epoch, 3, false), 0)
            .unwrap();
        next += 3;
    }
    log.flush().unwrap();
    let segments_before = log.num_segments();
    assert!(segments_before > 2);
    // Offset 13 is inside the batch [12, 14] of epoch 2: that batch goes whole.
    assert_eq!(log.truncate_to(13).unwrap(), 12);
    assert_eq!(log.log_end_offset(), 12);
    assert!(log.num_segments() < segments_before);
    assert_eq!(log.latest_leader_epoch(), Some(2));
    assert_eq!(log.end_offset_for_leader_epoch(2), (2, 12));
    // Appending after the truncation continues at the new end.
    log.append_as_follower(&batch(12, 5, 1, false), 0).unwrap();
    assert_eq!(log.latest_leader_epoch(), Some(5));
    log.truncate_to(12).unwrap();
    assert_eq!(log.latest_leader_epoch(), Some(2));
    log.flush().unwrap();
    drop(log);
    let log = open(dir.path(), false);
    assert_eq!(log.log_end_offset(), 12);
    assert_eq!(log.latest_leader_epoch(), Some(2));
    // Reads (one segment at a time) see the four batches [0, 12), in order.
    let mut at = 0;
    let mut count = 0;
    while at < 12 {
        let read = log.read(at, usize::MAX, i64::MAX, true).unwrap();
        for item in gregor_protocol::batch::Batches::new(&read.records) {
            let (_, h) = item.unwrap();
            assert_eq!(h.base_offset, at);
            at = h.next_offset();
            count += 1;
        }
    }
    assert_eq!(count, 4);
    // Truncating at the end or beyond changes nothing; to 0 empties the log.
    assert_eq!(log.truncate_to(100).unwrap(), 12);
    assert_eq!(log.truncate_to(0).unwrap(), 0);
    assert_eq!(log.num_segments(), 1);
    assert_eq!(log.latest_leader_epoch(), None);
}

/// A follower whose log ends below the leader's log start offset drops everything and starts
/// at the leader's log start offset (Kafka's `truncateFullyAndStartAt`): both offsets move
/// there, the epoch cache empties, appends continue at the new offset, and a reopen agrees.
#[test]
fn truncate_fully_and_start_at_restarts_the_log_durably() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), true);
    let mut next = 0;
    for epoch in [1, 1, 2, 2, 3] {
        log.append_as_follower(&batch(next, epoch, 3, false), 0)
            .unwrap();
        next += 3;
    }
    assert!(log.num_segments() > 1);
    assert!(log.truncate_fully_and_start_at(-1, 0).is_err());
    log.truncate_fully_and_start_at(100, 0).unwrap();
    assert_eq!(log.log_start_offset(), 100);
    assert_eq!(log.log_end_offset(), 100);
    assert_eq!(log.num_segments(), 1);
    assert_eq!(log.segment_base_offsets(), vec![100]);
    assert_eq!(log.latest_leader_epoch(), None);
    assert!(log.read(99, usize::MAX, i64::MAX, true).is_err());
    log.append_as_follower(&batch(100, 7, 2, false), 0).unwrap();
    assert_eq!(log.log_end_offset(), 102);
    assert_eq!(log.leader_epoch_entries().len(), 1);
    log.flush().unwrap();
    drop(log);
    let log = open(dir.path(), false);
    assert_eq!(log.log_start_offset(), 100);
    assert_eq!(log.log_end_offset(), 102);
    assert_eq!(log.latest_leader_epoch(), Some(7));
    let read = log.read(100, usize::MAX, i64::MAX, true).unwrap();
    assert!(!read.records.is_empty());
}
