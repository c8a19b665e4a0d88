//! A crash while `leader-epoch-checkpoint` is rewritten in place (without fsync) can leave it
//! torn in any way the page cache and the file system allow: cut short, new bytes at the old
//! length, old bytes at the new length with zeros after. Every such file is detected when the
//! log manager loads the log after the crash, the entries are rebuilt from the batches'
//! partition leader epochs (all segments, not only those after the recovery point), and
//! OffsetForLeaderEpoch and follower truncation answer as before the crash.

use std::path::{Path, PathBuf};

use gregor_log::{EpochEntry, LogConfig, LogManager, PartitionLog, TopicPartition};
use gregor_protocol::batch::{set_partition_leader_epoch, BatchBuilder};

const NOW_MS: i64 = 1_000;

fn batch(base: i64, epoch: i32, records: usize) -> Vec<u8> {
    let mut b = BatchBuilder::new(base, NOW_MS);
    for _ in 0..records {
        b = b.record(NOW_MS, Some(&[0, 0, 0, 2]), Some(&[9u8; 50]), &[]);
    }
    let mut v = b.build();
    set_partition_leader_epoch(&mut v, epoch);
    v
}

fn config() -> LogConfig {
    // About one batch per segment: the epochs span several segments, most of them below the
    // recovery point, which recovery after a crash does not scan.
    LogConfig {
        segment_bytes: 400,
        ..LogConfig::default()
    }
}

fn tp() -> TopicPartition {
    TopicPartition::new("epochs", 0)
}

fn open(dirs: &[PathBuf]) -> (LogManager, std::sync::Arc<PartitionLog>) {
    let (mgr, _) = LogManager::open(dirs, config()).unwrap();
    let log = mgr.get(&tp()).unwrap();
    (mgr, log)
}

/// OffsetForLeaderEpoch for every epoch from -1 to 12.
fn answers(log: &PartitionLog) -> Vec<(i32, i64)> {
    (-1..=12)
        .map(|e| log.end_offset_for_leader_epoch(e))
        .collect()
}

fn checkpoint(log_dir: &Path) -> PathBuf {
    log_dir.join("leader-epoch-checkpoint")
}

#[test]
fn a_torn_leader_epoch_checkpoint_is_rebuilt_from_the_batches() {
    let root = tempfile::tempdir().unwrap();
    let dirs = vec![root.path().join("d")];
    let with_records = vec![
        EpochEntry {
            epoch: 0,
            start_offset: 0,
        },
        EpochEntry {
            epoch: 2,
            start_offset: 3,
        },
        EpochEntry {
            epoch: 5,
            start_offset: 9,
        },
    ];
    let (log_dir, synced, torn_from, before_crash) = {
        let (mgr, _) = LogManager::open(&dirs, config()).unwrap();
        let log = mgr.get_or_create(&tp(), [7; 16], config()).unwrap();
        for (base, epoch) in [(0, 0), (3, 2), (6, 2), (9, 5)] {
            log.append_as_follower(&batch(base, epoch, 3), NOW_MS)
                .unwrap();
        }
        assert!(log.segment_base_offsets().len() >= 3);
        // The recovery point passes every batch: recovery will scan only the last segment.
        log.flush().unwrap();
        mgr.checkpoint_recovery_points().unwrap();
        assert_eq!(log.recovery_point(), 12);
        assert_eq!(log.leader_epoch_entries(), with_records);
        let synced = std::fs::read(checkpoint(log.dir())).unwrap();
        // A new leader epoch without records yet, written in place as a restart writes them.
        log.maybe_assign_epoch_start_offset_deferred(7, 12);
        mgr.write_leader_epoch_checkpoints();
        let written = std::fs::read(checkpoint(log.dir())).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&written),
            "0\n4\n0 0\n2 3\n5 9\n7 12\n"
        );
        assert!(log.leader_epoch_checkpoint_dirty());
        (log.dir().to_path_buf(), synced, written, answers(&log))
        // Dropped without shutdown: a crash.
    };

    // What the crash may leave, all at once on disk for the checkpoint, the rest intact.
    let mut outcomes: Vec<(String, Vec<u8>)> = Vec::new();
    for cut in 0..torn_from.len() {
        outcomes.push((format!("new bytes cut at {cut}"), torn_from[..cut].to_vec()));
    }
    let mut zeros = synced.clone();
    zeros.resize(torn_from.len(), 0);
    outcomes.push(("old bytes at the new length".into(), zeros));
    outcomes.push(("garbage".into(), vec![0xff; 7]));

    for (what, bytes) in &outcomes {
        std::fs::write(checkpoint(&log_dir), bytes).unwrap();
        let (mgr, log) = open(&dirs);
        assert!(
            log.load_stats().rebuilt_leader_epochs,
            "{what}: not rebuilt"
        );
        assert_eq!(log.leader_epoch_entries(), with_records, "{what}");
        let now = answers(&log);
        for (i, (want, got)) in before_crash.iter().zip(&now).enumerate() {
            let requested = i as i32 - 1;
            if requested > 5 {
                // Newer than every epoch with records: before the crash epoch 7 (no records)
                // bounded them; now they are unknown until this broker leads again. Only a
                // replica holding records of such an epoch asks, and none exist.
                assert_eq!(*got, (-1, -1), "{what}: epoch {requested}");
            } else {
                assert_eq!(got, want, "{what}: epoch {requested}");
            }
        }
        // Leader again after the restart: a follower with records of epochs 2 and 5 that
        // diverged is truncated where it was before.
        log.maybe_assign_epoch_start_offset_deferred(9, log.log_end_offset());
        assert_eq!(log.end_offset_for_leader_epoch(2), (2, 9));
        assert_eq!(log.end_offset_for_leader_epoch(5), (5, 12));
        assert_eq!(log.end_offset_for_leader_epoch(6), (5, 12));
        assert_eq!(log.end_offset_for_leader_epoch(7), (5, 12));
        drop(log);
        drop(mgr);
        // The rebuilt checkpoint reads back without another rebuild (the deferred epoch 9
        // was never written: a crash).
        let (mgr, log) = open(&dirs);
        assert!(
            !log.load_stats().rebuilt_leader_epochs,
            "{what}: rebuilt twice"
        );
        assert_eq!(log.leader_epoch_entries(), with_records, "{what}");
        let follower_view = log.end_offset_for_leader_epoch(2);
        assert_eq!(follower_view, (2, 9));
        // Follower truncation at the answer keeps the epochs below it.
        log.truncate_to(follower_view.1).unwrap();
        assert_eq!(log.leader_epoch_entries(), &with_records[..2], "{what}");
        // Back to the state before the crash for the next round, then crash again.
        log.append_as_follower(&batch(9, 5, 3), NOW_MS).unwrap();
        log.flush().unwrap();
        mgr.checkpoint_recovery_points().unwrap();
        assert_eq!(log.leader_epoch_entries(), with_records, "{what}");
    }

    // A file the crash left whole (the new contents, or the old ones) is used as it is.
    for (what, bytes) in [("new", &torn_from), ("old", &synced)] {
        std::fs::write(checkpoint(&log_dir), bytes).unwrap();
        let (_mgr, log) = open(&dirs);
        assert!(!log.load_stats().rebuilt_leader_epochs, "{what}");
        // Entries starting at the log end (epoch 7) are dropped at load, as Kafka does.
        assert_eq!(log.leader_epoch_entries(), with_records, "{what}");
        assert_eq!(log.recovery_point(), 12, "{what}");
    }
}

/// The rebuild reads one header per segment where the epoch does not change, and a segment
/// whose batches cannot be read does not stop the log from opening: its epochs are left out
/// with a warning (before, the whole log failed to open and the broker did not start).
#[test]
fn the_rebuild_walks_only_where_the_epoch_changes_and_passes_an_unreadable_segment() {
    let root = tempfile::tempdir().unwrap();
    let dirs = vec![root.path().join("d")];
    let epochs = [1, 1, 1, 1, 1, 3, 3, 3, 3, 3];
    let (log_dir, segments) = {
        let (mgr, _) = LogManager::open(&dirs, config()).unwrap();
        let log = mgr.get_or_create(&tp(), [7; 16], config()).unwrap();
        for (i, epoch) in epochs.iter().enumerate() {
            log.append_as_follower(&batch(3 * i as i64, *epoch, 3), NOW_MS)
                .unwrap();
        }
        // One batch per segment.
        assert_eq!(log.segment_base_offsets().len(), epochs.len());
        log.flush().unwrap();
        mgr.checkpoint_recovery_points().unwrap();
        let entries = vec![
            EpochEntry {
                epoch: 1,
                start_offset: 0,
            },
            EpochEntry {
                epoch: 3,
                start_offset: 15,
            },
        ];
        assert_eq!(log.leader_epoch_entries(), entries);
        (log.dir().to_path_buf(), log.segment_base_offsets())
        // Dropped without shutdown: a crash.
    };
    std::fs::write(checkpoint(&log_dir), b"0\n2\n1 0\n3").unwrap();
    {
        let (_mgr, log) = open(&dirs);
        let stats = log.load_stats();
        assert!(stats.rebuilt_leader_epochs);
        // The segment where epoch 1 ends and the last one; not the eight that hold one epoch.
        assert_eq!(stats.leader_epoch_rebuild_walked_segments, 2);
        assert_eq!(log.leader_epoch_entries().len(), 2);
        assert_eq!(log.end_offset_for_leader_epoch(1), (1, 15));
    }
    // Garbage over the header of an old segment (below the recovery point, so recovery does
    // not read it), and the checkpoint torn again.
    let victim = log_dir.join(format!("{:020}.log", segments[2]));
    let mut bytes = std::fs::read(&victim).unwrap();
    bytes[8..12].copy_from_slice(&[0xff; 4]);
    std::fs::write(&victim, bytes).unwrap();
    std::fs::write(checkpoint(&log_dir), b"0\n2\n1 0\n").unwrap();
    let (_mgr, log) = open(&dirs);
    assert!(log.load_stats().rebuilt_leader_epochs);
    assert_eq!(log.end_offset_for_leader_epoch(1), (1, 15));
    assert_eq!(log.end_offset_for_leader_epoch(3), (3, 30));
    assert_eq!(log.log_end_offset(), 30);
}
