//! The `RaftLog` contract, checked on `MemoryLog` and on the disk log `KafkaMetadataLog` with
//! the same code; crash recovery of the disk log; snapshots and their retention; the quorum
//! core running on the disk log; and a `__cluster_metadata-0` written by Kafka 4.4.0.

use std::path::Path;

use bytes::Bytes;
use gregor_protocol::batch::Batches;
use gregor_raft::batches::{build_data_batch, build_leader_change_batch};
use gregor_raft::quorum_state::FileQuorumStateStore;
use gregor_raft::{
    Action, KafkaMetadataLog, MemoryLog, MetadataLogConfig, OffsetAndEpoch, QuorumConfig, RaftLog,
    RaftLogError, RaftNode, Rng, Role, VoterSet,
};

fn open_disk(dir: &Path) -> KafkaMetadataLog {
    KafkaMetadataLog::open(
        dir,
        MetadataLogConfig {
            segment_bytes: 1024,
            ..MetadataLogConfig::default()
        },
    )
    .unwrap()
}

fn fill<L: RaftLog>(log: &mut L, epochs_and_counts: &[(i32, usize)]) {
    for &(epoch, count) in epochs_and_counts {
        for _ in 0..count {
            let b = build_data_batch(log.log_end_offset(), epoch, 0, &[Bytes::from("v")]);
            log.append_as_leader(b, epoch).unwrap();
        }
    }
}

/// Every batch of the log, following reads from offset 0 (a read may stop at a segment end).
fn all_batches<L: RaftLog>(log: &L) -> Vec<(i64, i32, u32)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < log.log_end_offset() {
        let bytes = log.read(at, 1 << 20).unwrap();
        assert!(!bytes.is_empty(), "read at {at} returned nothing");
        for item in Batches::new(&bytes) {
            let (_, h) = item.unwrap();
            assert_eq!(h.base_offset, at);
            at = h.next_offset();
            out.push((h.base_offset, h.partition_leader_epoch, h.crc));
        }
    }
    out
}

// The contract, written once.

fn contract_end_offset_for_epoch<L: RaftLog>(mut log: L, empty: L) {
    fill(&mut log, &[(1, 3), (3, 2), (4, 1)]);
    assert_eq!(log.end_offset_for_epoch(4), OffsetAndEpoch::new(6, 4));
    assert_eq!(log.end_offset_for_epoch(3), OffsetAndEpoch::new(5, 3));
    assert_eq!(log.end_offset_for_epoch(2), OffsetAndEpoch::new(3, 1));
    assert_eq!(log.end_offset_for_epoch(1), OffsetAndEpoch::new(3, 1));
    assert_eq!(log.end_offset_for_epoch(0), OffsetAndEpoch::new(0, 0));
    assert_eq!(log.end_offset_for_epoch(9), OffsetAndEpoch::new(6, 4));
    assert_eq!(empty.end_offset_for_epoch(5), OffsetAndEpoch::new(0, 0));
}

fn contract_truncate_to_end_offset<L: RaftLog>(mut a: L, mut b: L) {
    fill(&mut a, &[(1, 5)]);
    assert_eq!(
        a.truncate_to_end_offset(OffsetAndEpoch::new(3, 1)).unwrap(),
        3
    );
    assert_eq!(a.last_fetched_epoch(), 1);
    fill(&mut b, &[(1, 2), (3, 2)]);
    assert_eq!(
        b.truncate_to_end_offset(OffsetAndEpoch::new(3, 2)).unwrap(),
        2
    );
    assert_eq!(b.end_offset(), OffsetAndEpoch::new(2, 1));
}

fn contract_follower_append<L: RaftLog>(mut leader: L, mut follower: L, mut bad: L) {
    fill(&mut leader, &[(1, 3), (2, 1)]);
    let all = leader.read(0, usize::MAX).unwrap();
    let info = follower.append_as_follower(&all).unwrap();
    assert_eq!((info.first_offset, info.last_offset), (0, 3));
    assert_eq!(follower.end_offset(), OffsetAndEpoch::new(4, 2));
    let again = leader.read(1, usize::MAX).unwrap();
    assert!(matches!(
        follower.append_as_follower(&again),
        Err(RaftLogError::NonContiguous { .. })
    ));
    // An older epoch after a newer one.
    let old = build_data_batch(4, 1, 0, &[Bytes::from("x")]);
    assert!(matches!(
        follower.append_as_follower(&old),
        Err(RaftLogError::EpochRegression { .. })
    ));
    let mut bytes = all.to_vec();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    assert!(matches!(
        bad.append_as_follower(&Bytes::from(bytes)),
        Err(RaftLogError::Corrupt(_))
    ));
    assert_eq!(bad.log_end_offset(), 0);
    // A leader batch with another epoch than the leader's.
    let b = build_data_batch(0, 2, 0, &[Bytes::from("x")]);
    assert!(bad.append_as_leader(b, 3).is_err());
    assert_eq!(bad.log_end_offset(), 0);
}

fn contract_read_whole_batches<L: RaftLog>(mut log: L) {
    fill(&mut log, &[(1, 4)]);
    let one = log.read(0, 1).unwrap().len();
    assert!(one > 61);
    assert_eq!(log.read(0, 2 * one).unwrap().len(), 2 * one);
    assert_eq!(log.read(2, usize::MAX).unwrap().len(), 2 * one);
    assert!(log.read(4, usize::MAX).unwrap().is_empty());
    assert!(log.read(40, usize::MAX).unwrap().is_empty());
}

fn contract_high_watermark_guards_truncation<L: RaftLog>(mut log: L) {
    fill(&mut log, &[(1, 4)]);
    log.update_high_watermark(3);
    log.update_high_watermark(1);
    assert_eq!(log.high_watermark(), 3);
    assert!(matches!(
        log.truncate_to(2),
        Err(RaftLogError::BelowHighWatermark { .. })
    ));
    assert_eq!(log.truncate_to(3).unwrap(), 3);
    assert_eq!(log.truncate_to(30).unwrap(), 3);
}

#[test]
fn the_contract_holds_for_memory_and_disk() {
    contract_end_offset_for_epoch(MemoryLog::new(), MemoryLog::new());
    contract_truncate_to_end_offset(MemoryLog::new(), MemoryLog::new());
    contract_follower_append(MemoryLog::new(), MemoryLog::new(), MemoryLog::new());
    contract_read_whole_batches(MemoryLog::new());
    contract_high_watermark_guards_truncation(MemoryLog::new());

    let d: Vec<_> = (0..9).map(|_| tempfile::tempdir().unwrap()).collect();
    contract_end_offset_for_epoch(open_disk(d[0].path()), open_disk(d[1].path()));
    contract_truncate_to_end_offset(open_disk(d[2].path()), open_disk(d[3].path()));
    contract_follower_append(
        open_disk(d[4].path()),
        open_disk(d[5].path()),
        open_disk(d[6].path()),
    );
    contract_read_whole_batches(open_disk(d[7].path()));
    contract_high_watermark_guards_truncation(open_disk(d[8].path()));
}

/// Random leader appends, follower appends, truncations (to an offset and to a diverging
/// epoch) and flush+reopen, on both logs: they must hold the same batches and answer the same.
#[test]
fn disk_log_behaves_as_memory_log_under_random_operations() {
    for seed in 0..6u64 {
        let dir = tempfile::tempdir().unwrap();
        let mut rng = Rng::new(seed);
        let mut mem = MemoryLog::new();
        let mut disk = open_disk(dir.path());
        let mut epoch = 1;
        for step in 0..100 {
            match rng.below(10) {
                0..=4 => {
                    let n = 1 + rng.below(3) as usize;
                    let values: Vec<Bytes> = (0..n)
                        .map(|i| Bytes::from(format!("{seed}-{step}-{i}")))
                        .collect();
                    let b = build_data_batch(mem.log_end_offset(), epoch, step, &values);
                    let m = mem.append_as_leader(b.clone(), epoch);
                    let d = disk.append_as_leader(b, epoch);
                    assert_eq!(m, d);
                }
                5 => {
                    epoch += 1 + rng.below(2) as i32;
                    let b = build_leader_change_batch(
                        mem.log_end_offset(),
                        epoch,
                        step,
                        1,
                        &[1, 2, 3],
                        &[1, 2],
                    );
                    assert_eq!(mem.append_as_follower(&b), disk.append_as_follower(&b));
                }
                6 => {
                    let to = rng.below(mem.log_end_offset() as u64 + 2) as i64;
                    assert_eq!(mem.truncate_to(to), disk.truncate_to(to));
                }
                7 => {
                    let d = OffsetAndEpoch::new(
                        rng.below(mem.log_end_offset() as u64 + 2) as i64,
                        rng.below(epoch as u64 + 1) as i32,
                    );
                    assert_eq!(
                        mem.truncate_to_end_offset(d),
                        disk.truncate_to_end_offset(d)
                    );
                }
                8 => {
                    let hw = rng.below(mem.log_end_offset() as u64 + 1) as i64;
                    mem.update_high_watermark(hw);
                    disk.update_high_watermark(hw);
                }
                _ => {
                    disk.flush().unwrap();
                    let hw = disk.high_watermark();
                    drop(disk);
                    disk = open_disk(dir.path());
                    disk.update_high_watermark(hw);
                }
            }
            assert_eq!(
                mem.end_offset(),
                disk.end_offset(),
                "seed {seed} step {step}"
            );
            for e in 0..=epoch + 1 {
                assert_eq!(
                    mem.end_offset_for_epoch(e),
                    disk.end_offset_for_epoch(e),
                    "seed {seed} step {step} epoch {e}"
                );
            }
        }
        assert_eq!(all_batches(&mem), all_batches(&disk), "seed {seed}");
    }
}

/// A crash tearing the last batch at any byte: reopening keeps every whole batch before it
/// and nothing of the torn one, and the log takes appends again.
#[test]
fn a_torn_last_batch_is_cut_at_every_byte() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = KafkaMetadataLog::open(dir.path(), MetadataLogConfig::default()).unwrap();
    fill(&mut log, &[(1, 3), (2, 2)]);
    log.flush().unwrap();
    let before = all_batches(&log);
    let last_start = log.read(4, 1).unwrap();
    let last_len = last_start.len() as u64;
    drop(log);
    let segment = KafkaMetadataLog::partition_dir(dir.path()).join("00000000000000000000.log");
    let full = std::fs::read(&segment).unwrap();
    let start = full.len() as u64 - last_len;
    for cut in start..full.len() as u64 {
        std::fs::write(&segment, &full[..cut as usize]).unwrap();
        let mut log = KafkaMetadataLog::open(dir.path(), MetadataLogConfig::default()).unwrap();
        assert_eq!(log.end_offset(), OffsetAndEpoch::new(4, 2), "cut {cut}");
        assert_eq!(all_batches(&log), before[..4].to_vec());
        let b = build_data_batch(4, 3, 0, &[Bytes::from("after")]);
        log.append_as_leader(b, 3).unwrap();
        assert_eq!(log.end_offset(), OffsetAndEpoch::new(5, 3));
        drop(log);
        std::fs::write(&segment, &full).unwrap();
        // Put the epoch checkpoint back in step with the full segment.
        let epochs = KafkaMetadataLog::partition_dir(dir.path()).join("leader-epoch-checkpoint");
        std::fs::write(&epochs, "0\n2\n1 0\n2 3\n").unwrap();
    }
    // Garbage in the middle: everything from the bad batch on goes.
    let mut bad = full.clone();
    let second = before[1].0 as usize; // offset 1 starts after one batch
    let pos = (last_len as usize) * second + 30;
    bad[pos] ^= 0x55;
    std::fs::write(&segment, &bad).unwrap();
    let log = KafkaMetadataLog::open(dir.path(), MetadataLogConfig::default()).unwrap();
    assert_eq!(log.log_end_offset(), 1);
}

#[test]
fn layout_is_kafkas() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open_disk(dir.path());
    fill(&mut log, &[(1, 2), (5, 1)]);
    log.flush().unwrap();
    let p = KafkaMetadataLog::partition_dir(dir.path());
    assert!(p.ends_with("__cluster_metadata-0"));
    assert_eq!(
        std::fs::read_to_string(p.join("partition.metadata")).unwrap(),
        "version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAQ"
    );
    assert_eq!(
        std::fs::read_to_string(p.join("leader-epoch-checkpoint")).unwrap(),
        "0\n2\n1 0\n5 2\n"
    );
    for f in [
        "00000000000000000000.log",
        "00000000000000000000.index",
        "00000000000000000000.timeindex",
    ] {
        assert!(p.join(f).exists(), "{f}");
    }
}

#[test]
fn snapshots_are_written_read_and_move_the_log_start_offset() {
    let dir = tempfile::tempdir().unwrap();
    let config = MetadataLogConfig {
        segment_bytes: 400,
        retention_max_bytes: 1,
        ..MetadataLogConfig::default()
    };
    let mut log = KafkaMetadataLog::open(dir.path(), config.clone()).unwrap();
    fill(&mut log, &[(1, 10), (2, 10)]);
    log.flush().unwrap();
    log.update_high_watermark(15);
    // A snapshot must be committed and carry the epoch of its last offset.
    assert!(log
        .create_snapshot(OffsetAndEpoch::new(16, 2), 0, 0)
        .is_err());
    assert!(log
        .create_snapshot(OffsetAndEpoch::new(15, 1), 0, 0)
        .is_err());
    // A bootstrap snapshot 0-0, then one at 15 (epoch of offset 14 is 2).
    let w = log
        .create_snapshot(OffsetAndEpoch::new(0, 0), -1, 0)
        .unwrap();
    let id0 = w.id();
    w.freeze(0).unwrap();
    log.add_snapshot(id0).unwrap();
    let id = OffsetAndEpoch::new(15, 2);
    let mut w = log.create_snapshot(id, 1_000, 2_000).unwrap();
    w.append(&[Bytes::from("image-1"), Bytes::from("image-2")], 2_000)
        .unwrap();
    w.freeze(2_000).unwrap();
    log.add_snapshot(id).unwrap();
    assert_eq!(log.latest_snapshot_id(), Some(id));
    let s = log.read_snapshot(id).unwrap();
    assert_eq!(s.batches.len(), 1);
    assert_eq!(s.last_contained_log_timestamp_ms, 1_000);
    let segments_before = log.partition_log().num_segments();
    assert!(segments_before > 2);
    // metadata.max.retention.bytes = 1: the 0-0 snapshot and the log below 15 go.
    assert!(log.maybe_clean(3_000).unwrap());
    assert_eq!(log.log_start_offset(), 15);
    assert_eq!(log.snapshot_ids(), vec![id]);
    assert!(log.partition_log().num_segments() < segments_before);
    assert!(log.partition_log().segment_base_offsets()[0] <= 15);
    // The latest snapshot is never deleted.
    assert!(!log.maybe_clean(4_000).unwrap());
    let leo = log.log_end_offset();
    drop(log);
    // A crash leaves a .part: removed on open; the log start offset comes back.
    let p = KafkaMetadataLog::partition_dir(dir.path());
    std::fs::write(
        p.join("00000000000000000017-0000000002.checkpoint.part"),
        b"x",
    )
    .unwrap();
    let log = KafkaMetadataLog::open(dir.path(), config).unwrap();
    assert!(!p
        .join("00000000000000000017-0000000002.checkpoint.part")
        .exists());
    assert_eq!(log.log_start_offset(), 15);
    assert_eq!(log.log_end_offset(), leo);
    assert_eq!(log.latest_snapshot_id(), Some(id));
    assert!(!log.read(15, 1).unwrap().is_empty());
    assert!(matches!(
        log.read(3, 1),
        Err(RaftLogError::BelowLogStartOffset {
            offset: 3,
            log_start_offset: 15
        })
    ));
}

#[test]
fn snapshot_due_follows_kafkas_two_limits() {
    let c = MetadataLogConfig::default();
    assert!(!c.snapshot_due(0, i64::MAX));
    assert!(!c.snapshot_due(1, 3_599_999));
    assert!(c.snapshot_due(1, 3_600_000));
    assert!(c.snapshot_due(20 * 1024 * 1024, 0));
}

/// One voter on the disk log, its election state in `quorum-state`: elected, a few hundred
/// proposals committed with every `FlushLog` executed on the disk, a restart (log and
/// quorum-state read back) and more proposals in a new epoch.
#[test]
fn raft_node_runs_on_the_disk_log_and_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let voters = VoterSet::new([1]).unwrap();
    let config = || QuorumConfig::new(1, voters.clone());
    let mut now = 0u64;
    let mut committed = 0;
    let mut last_epoch = 0;
    for run in 0..2 {
        let log = open_disk(dir.path());
        let store = FileQuorumStateStore::new(&KafkaMetadataLog::partition_dir(dir.path()));
        let stored = store.read().unwrap().map(|(s, _)| s);
        assert_eq!(stored.is_some(), run == 1);
        let (mut node, actions) = RaftNode::new(config(), log, stored, Rng::new(run), now);
        let exec = |node: &mut RaftNode<KafkaMetadataLog>, actions: Vec<Action>| {
            for a in actions {
                match a {
                    Action::PersistElectionState(s) => store.write(&s, &voters).unwrap(),
                    Action::FlushLog { .. } => node.log().flush().unwrap(),
                    _ => {}
                }
            }
        };
        exec(&mut node, actions);
        for _ in 0..100 {
            now += 100;
            let a = node.tick(now);
            exec(&mut node, a);
            if node.role() == Role::Leader && node.high_watermark().is_some() {
                break;
            }
        }
        assert_eq!(node.role(), Role::Leader);
        assert!(node.epoch() > last_epoch, "a restart elects in a new epoch");
        last_epoch = node.epoch();
        for i in 0..150 {
            now += 1;
            let (p, a) = node
                .propose(&[Bytes::from(format!("record {run} {i}"))], now)
                .unwrap();
            exec(&mut node, a);
            assert_eq!(node.high_watermark(), Some(p.last_offset + 1));
            committed = p.last_offset + 1;
        }
        let log = node.into_log();
        assert_eq!(log.log_end_offset(), committed);
    }
    let log = open_disk(dir.path());
    assert_eq!(log.log_end_offset(), committed);
    assert_eq!(log.last_fetched_epoch(), last_epoch);
    assert_eq!(
        all_batches(&log).iter().filter(|b| b.1 == 1).count(),
        151,
        "epoch 1: LeaderChange and 150 proposals"
    );
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().into_string().unwrap();
        if name.ends_with(".log") || name.ends_with(".checkpoint") {
            std::fs::copy(e.path(), to.join(name)).unwrap();
        }
    }
}

/// gregor opens the `__cluster_metadata-0` Kafka 4.4.0 wrote (the fixture's segment and
/// snapshots; Kafka's index files are rebuilt) and reads all its batches, epochs and the
/// snapshots.
#[test]
fn opens_the_metadata_log_kafka_wrote() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../protocol/tests/data/kraft-4.4.0");
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&fixture, &KafkaMetadataLog::partition_dir(dir.path()));
    let log = open_disk(dir.path());
    assert_eq!(log.log_end_offset(), 101);
    assert_eq!(log.last_fetched_epoch(), 1);
    assert_eq!(log.end_offset_for_epoch(1), OffsetAndEpoch::new(101, 1));
    let batches = all_batches(&log);
    assert_eq!(batches.len(), 81);
    assert!(batches.iter().all(|b| b.1 == 1));
    assert_eq!(
        log.snapshot_ids(),
        vec![OffsetAndEpoch::new(0, 0), OffsetAndEpoch::new(89, 1)]
    );
    let s = log.read_snapshot(OffsetAndEpoch::new(89, 1)).unwrap();
    assert_eq!(s.batches.len(), 1);
    // The segment as Kafka wrote it is what gregor reads back, byte for byte.
    let segment = std::fs::read(fixture.join("00000000000000000000.log")).unwrap();
    let mut read = Vec::new();
    let mut at = 0;
    while at < 101 {
        let b = log.read(at, 1 << 20).unwrap();
        at = Batches::new(&b)
            .last()
            .unwrap()
            .map(|(_, h)| h.next_offset())
            .unwrap();
        read.extend_from_slice(&b);
    }
    assert_eq!(read, segment);
}

struct DiskNode {
    node: Option<RaftNode<KafkaMetadataLog>>,
    store: FileQuorumStateStore,
    dir: tempfile::TempDir,
}

/// Three voters, each on its own disk log and `quorum-state`, on a network that loses 10% of
/// messages, with a client proposing at random and nodes crashing (dropped without a clean
/// close) and restarting from their directories, for 400 steps of 50 ms. After every step,
/// logs agree below their high watermarks and every batch a leader ever reported committed is
/// still in the log of every node whose high watermark covers it; after the faults stop, a
/// last proposal commits on all three.
#[test]
fn three_voters_on_disk_logs_survive_loss_and_restarts() {
    let ids = [1, 2, 3];
    let voters = VoterSet::new(ids).unwrap();
    let mut rng = Rng::new(2024);
    let mut now = 0u64;
    let mut nodes: std::collections::BTreeMap<i32, DiskNode> = std::collections::BTreeMap::new();
    let start = |id: i32, dir: &Path, store: &FileQuorumStateStore, now: u64, seed: u64| {
        let stored = store.read().unwrap().map(|(s, _)| s);
        RaftNode::new(
            QuorumConfig::new(id, voters.clone()),
            open_disk(dir),
            stored,
            Rng::new(seed),
            now,
        )
    };
    let mut queue: std::collections::VecDeque<(i32, i32, gregor_raft::Message)> =
        std::collections::VecDeque::new();
    let execute =
        |id: i32,
         n: &mut DiskNode,
         actions: Vec<Action>,
         queue: &mut std::collections::VecDeque<(i32, i32, gregor_raft::Message)>| {
            for a in actions {
                match a {
                    Action::PersistElectionState(s) => n.store.write(&s, &voters).unwrap(),
                    Action::FlushLog { .. } => n.node.as_ref().unwrap().log().flush().unwrap(),
                    Action::Send { to, message } => queue.push_back((id, to, message)),
                    _ => {}
                }
            }
        };
    for &id in &ids {
        let dir = tempfile::tempdir().unwrap();
        let store = FileQuorumStateStore::new(&KafkaMetadataLog::partition_dir(dir.path()));
        let (node, actions) = start(id, dir.path(), &store, now, id as u64);
        let mut n = DiskNode {
            node: Some(node),
            store,
            dir,
        };
        execute(id, &mut n, actions, &mut queue);
        nodes.insert(id, n);
    }
    // offset -> (epoch, crc) of every batch reported committed.
    let mut committed: std::collections::BTreeMap<i64, (i32, u32)> = Default::default();
    let mut restarts = 0;
    let mut proposals = 0;
    for step in 0..460 {
        let faults = step < 400;
        now += 50;
        for &id in &ids {
            let n = nodes.get_mut(&id).unwrap();
            let actions = n.node.as_mut().unwrap().tick(now);
            execute(id, n, actions, &mut queue);
        }
        let mut delivered = 0;
        while let Some((from, to, message)) = queue.pop_front() {
            delivered += 1;
            assert!(delivered < 100_000, "messages never settle");
            if faults && rng.chance(0.1) {
                continue;
            }
            let n = nodes.get_mut(&to).unwrap();
            let actions = n.node.as_mut().unwrap().handle_message(from, message, now);
            execute(to, n, actions, &mut queue);
        }
        if rng.chance(0.3) {
            if let Some(&leader) = ids
                .iter()
                .find(|id| nodes[id].node.as_ref().unwrap().role() == Role::Leader)
            {
                let n = nodes.get_mut(&leader).unwrap();
                let value = Bytes::from(format!("step {step}"));
                if let Ok((_, actions)) = n.node.as_mut().unwrap().propose(&[value], now) {
                    proposals += 1;
                    execute(leader, n, actions, &mut queue);
                }
            }
        }
        if faults && rng.chance(0.03) {
            let id = ids[rng.below(3) as usize];
            let n = nodes.get_mut(&id).unwrap();
            drop(n.node.take());
            let (node, actions) = start(id, n.dir.path(), &n.store, now, 100 + step);
            n.node = Some(node);
            execute(id, n, actions, &mut queue);
            restarts += 1;
        }
        // Invariants.
        let mut views = Vec::new();
        for &id in &ids {
            let node = nodes[&id].node.as_ref().unwrap();
            let hw = node.high_watermark().unwrap_or(0);
            let batches = all_batches(node.log());
            for &(offset, epoch, crc) in batches.iter() {
                if let Some(&(e, c)) = committed.get(&offset) {
                    if offset < hw {
                        assert_eq!(
                            (e, c),
                            (epoch, crc),
                            "node {id} step {step} offset {offset}"
                        );
                    }
                }
            }
            if node.role() == Role::Leader {
                for &(offset, epoch, crc) in batches.iter().filter(|b| b.0 < hw) {
                    committed.entry(offset).or_insert((epoch, crc));
                }
                for (offset, c) in &committed {
                    assert!(
                        batches.iter().any(|b| b.0 == *offset && (b.1, b.2) == *c),
                        "leader {id} lost committed batch {offset} at step {step}"
                    );
                }
            }
            views.push((hw, batches));
        }
        for a in &views {
            for b in &views {
                let below = a.0.min(b.0);
                let pa: Vec<_> = a.1.iter().filter(|x| x.0 < below).collect();
                let pb: Vec<_> = b.1.iter().filter(|x| x.0 < below).collect();
                assert_eq!(pa, pb, "logs disagree below {below} at step {step}");
            }
        }
    }
    assert!(restarts >= 5, "{restarts} restarts");
    assert!(proposals >= 50, "{proposals} proposals");
    assert!(committed.len() >= 20, "{} committed", committed.len());
    // Healed: every node has the leader's whole committed log.
    let leader_hw = ids
        .iter()
        .filter_map(|id| {
            let n = nodes[id].node.as_ref().unwrap();
            (n.role() == Role::Leader).then(|| n.high_watermark().unwrap_or(0))
        })
        .next()
        .expect("a leader after the faults stop");
    for id in ids {
        let n = nodes[&id].node.as_ref().unwrap();
        assert_eq!(n.high_watermark(), Some(leader_hw), "node {id}");
        assert_eq!(n.log().log_end_offset(), leader_hw, "node {id}");
    }
}

#[test]
fn a_corrupt_snapshot_or_quorum_state_is_an_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let log = open_disk(dir.path());
    let p = log.dir().to_path_buf();
    drop(log);
    std::fs::write(
        p.join("00000000000000000005-0000000001.checkpoint"),
        b"not a batch",
    )
    .unwrap();
    let err = KafkaMetadataLog::open(dir.path(), MetadataLogConfig::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("00000000000000000005-0000000001.checkpoint"),
        "{err}"
    );
    std::fs::remove_file(p.join("00000000000000000005-0000000001.checkpoint")).unwrap();
    // A snapshot past the log end offset (a follower that crashed after fetching it, before
    // replacing its log): the log starts at it.
    let mut w =
        gregor_raft::snapshot::SnapshotWriter::create(&p, OffsetAndEpoch::new(5, 1), 0, &[], 0)
            .unwrap();
    w.append(&[Bytes::from("x")], 0).unwrap();
    w.freeze(0).unwrap();
    let log = KafkaMetadataLog::open(dir.path(), MetadataLogConfig::default()).unwrap();
    assert_eq!(log.log_start_offset(), 5);
    assert_eq!(log.end_offset(), OffsetAndEpoch::new(5, 1));
}

// ----- KIP-630 snapshots through the RaftLog trait -----

/// Writing a snapshot, deleting the log before it, and the epoch cache after that.
fn contract_snapshot_and_delete_before<L: RaftLog>(mut log: L) {
    fill(&mut log, &[(1, 4), (2, 4), (3, 2)]);
    log.update_high_watermark(8);
    // Kafka's createNewSnapshot checks: committed, and the epoch of the offset before.
    assert!(matches!(
        log.write_snapshot(OffsetAndEpoch::new(9, 2), &[], 0),
        Err(RaftLogError::InvalidSnapshot { .. })
    ));
    assert!(matches!(
        log.write_snapshot(OffsetAndEpoch::new(6, 1), &[], 0),
        Err(RaftLogError::InvalidSnapshot { .. })
    ));
    let id = OffsetAndEpoch::new(6, 2);
    let values = [Bytes::from("state-a"), Bytes::from("state-b")];
    log.write_snapshot(id, &values, 1_000).unwrap();
    assert_eq!(log.latest_snapshot_id(), Some(id));
    assert_eq!(log.earliest_snapshot_id(), Some(id));
    assert_eq!(log.log_start_offset(), 0);
    let s = log.read_snapshot(id).unwrap();
    assert_eq!(s.batches.len(), 1);
    let size = log.snapshot_size(id).unwrap();
    assert_eq!(size, s.size_bytes);
    // Chunks concatenate to the whole file.
    let mut whole = Vec::new();
    while (whole.len() as u64) < size {
        let chunk = log.read_snapshot_chunk(id, whole.len() as u64, 37).unwrap();
        assert!(!chunk.is_empty() && chunk.len() <= 37);
        whole.extend_from_slice(&chunk);
    }
    assert!(log.read_snapshot_chunk(id, size, 37).unwrap().is_empty());
    assert!(matches!(
        log.read_snapshot_chunk(OffsetAndEpoch::new(5, 2), 0, 10),
        Err(RaftLogError::SnapshotNotFound(_))
    ));
    assert!(log.delete_before(id, 2_000).unwrap());
    assert!(!log.delete_before(id, 2_000).unwrap());
    assert_eq!(log.log_start_offset(), 6);
    assert_eq!(log.log_end_offset(), 10);
    assert!(matches!(
        log.read(5, 1 << 20),
        Err(RaftLogError::BelowLogStartOffset { .. })
    ));
    assert!(!log.read(6, 1 << 20).unwrap().is_empty());
    // The epoch cache is truncated from the start: epoch 2 now begins at 6, epoch 1 is gone.
    assert_eq!(log.end_offset_for_epoch(1), OffsetAndEpoch::new(6, 1));
    assert_eq!(log.end_offset_for_epoch(2), OffsetAndEpoch::new(8, 2));
    assert_eq!(log.end_offset_for_epoch(3), OffsetAndEpoch::new(10, 3));
    // A snapshot at the log start takes the epoch of the snapshot there.
    log.write_snapshot(id, &values, 3_000).unwrap();
    assert!(matches!(
        log.truncate_to(5),
        Err(RaftLogError::BelowHighWatermark { .. } | RaftLogError::BelowLogStartOffset { .. })
    ));
}

/// A snapshot fetched in chunks replaces a log that does not reach it.
fn contract_fetched_snapshot<L: RaftLog>(mut leader: L, mut follower: L) {
    fill(&mut leader, &[(1, 5), (2, 5)]);
    leader.update_high_watermark(10);
    let id = OffsetAndEpoch::new(8, 2);
    leader
        .write_snapshot(id, &[Bytes::from("image")], 0)
        .unwrap();
    leader.delete_before(id, 0).unwrap();
    let size = leader.snapshot_size(id).unwrap();
    // The follower holds three records of epoch 1 and a stale one of epoch 1.
    fill(&mut follower, &[(1, 4)]);
    assert!(matches!(
        follower.append_fetched_snapshot(b"x"),
        Err(RaftLogError::InvalidSnapshot { .. })
    ));
    assert!(follower.begin_fetched_snapshot(id).unwrap());
    assert_eq!(follower.fetched_snapshot(), Some((id, 0)));
    // An abandoned transfer leaves nothing; a new one starts from 0.
    follower
        .append_fetched_snapshot(&leader.read_snapshot_chunk(id, 0, 10).unwrap())
        .unwrap();
    follower.abort_fetched_snapshot();
    assert_eq!(follower.fetched_snapshot(), None);
    assert!(follower.begin_fetched_snapshot(id).unwrap());
    let mut position = 0;
    while position < size {
        let chunk = leader.read_snapshot_chunk(id, position, 50).unwrap();
        position = follower.append_fetched_snapshot(&chunk).unwrap();
    }
    assert_eq!(follower.complete_fetched_snapshot().unwrap(), id);
    assert_eq!(follower.latest_snapshot_id(), Some(id));
    assert!(
        !follower.begin_fetched_snapshot(id).unwrap(),
        "already complete"
    );
    assert!(follower.truncate_to_latest_snapshot().unwrap());
    assert!(!follower.truncate_to_latest_snapshot().unwrap());
    assert_eq!(follower.log_start_offset(), 8);
    assert_eq!(follower.log_end_offset(), 8);
    assert_eq!(follower.end_offset(), OffsetAndEpoch::new(8, 2));
    assert_eq!(follower.end_offset_for_epoch(2), OffsetAndEpoch::new(8, 2));
    // It continues from the leader's log above the snapshot.
    let rest = leader.read(8, 1 << 20).unwrap();
    follower.append_as_follower(&rest).unwrap();
    assert_eq!(follower.end_offset(), leader.end_offset());
    assert_eq!(
        follower.read(8, 1 << 20).unwrap(),
        leader.read(8, 1 << 20).unwrap()
    );
    // A corrupt transfer is refused and leaves no snapshot.
    let bad = OffsetAndEpoch::new(9, 2);
    assert!(follower.begin_fetched_snapshot(bad).unwrap());
    follower.append_fetched_snapshot(b"not a snapshot").unwrap();
    assert!(matches!(
        follower.complete_fetched_snapshot(),
        Err(RaftLogError::InvalidSnapshot { .. })
    ));
    assert_eq!(follower.latest_snapshot_id(), Some(id));
    assert_eq!(follower.fetched_snapshot(), None);
}

#[test]
fn snapshots_follow_the_contract_in_memory_and_on_disk() {
    contract_snapshot_and_delete_before(MemoryLog::new());
    contract_fetched_snapshot(MemoryLog::new(), MemoryLog::new());
    let d: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    contract_snapshot_and_delete_before(open_disk(d[0].path()));
    contract_fetched_snapshot(open_disk(d[1].path()), open_disk(d[2].path()));
}

/// Disk only: a fetched snapshot installed on disk survives a reopen with the log starting at
/// it, an unfinished transfer's `.part` is removed on open, and a crash between completing the
/// snapshot and replacing the log is finished by the next open.
#[test]
fn a_fetched_snapshot_installs_on_disk_and_survives_reopen() {
    let mut leader = MemoryLog::new();
    fill(&mut leader, &[(1, 20), (4, 20)]);
    leader.update_high_watermark(40);
    let id = OffsetAndEpoch::new(30, 4);
    leader
        .write_snapshot(id, &[Bytes::from("a"), Bytes::from("b")], 0)
        .unwrap();
    let size = leader.snapshot_size(id).unwrap();
    let transfer = |log: &mut KafkaMetadataLog| {
        assert!(log.begin_fetched_snapshot(id).unwrap());
        let mut position = 0;
        while position < size {
            let chunk = leader.read_snapshot_chunk(id, position, 64).unwrap();
            position = log.append_fetched_snapshot(&chunk).unwrap();
        }
        log.complete_fetched_snapshot().unwrap();
    };

    let dir = tempfile::tempdir().unwrap();
    let p = KafkaMetadataLog::partition_dir(dir.path());
    let mut log = open_disk(dir.path());
    fill(&mut log, &[(1, 12), (2, 3)]); // diverges from the leader at 12
    log.flush().unwrap();
    assert!(log.partition_log().num_segments() > 1);
    transfer(&mut log);
    assert!(log.truncate_to_latest_snapshot().unwrap());
    assert_eq!((log.log_start_offset(), log.log_end_offset()), (30, 30));
    assert_eq!(log.partition_log().segment_base_offsets(), vec![30]);
    log.append_as_follower(&leader.read(30, 1 << 20).unwrap())
        .unwrap();
    log.flush().unwrap();
    // An unfinished transfer of a newer snapshot.
    assert!(log
        .begin_fetched_snapshot(OffsetAndEpoch::new(35, 4))
        .unwrap());
    log.append_fetched_snapshot(b"partial").unwrap();
    drop(log);
    let log = open_disk(dir.path());
    assert!(!p
        .join("00000000000000000035-0000000004.checkpoint.part")
        .exists());
    assert_eq!(log.log_start_offset(), 30);
    assert_eq!(log.log_end_offset(), 40);
    assert_eq!(log.end_offset(), OffsetAndEpoch::new(40, 4));
    assert_eq!(log.latest_snapshot_id(), Some(id));
    assert_eq!(log.read_snapshot(id).unwrap().batches.len(), 1);
    assert_eq!(
        log.read(30, 1 << 20).unwrap(),
        leader.read(30, 1 << 20).unwrap()
    );
    for entry in std::fs::read_dir(&p).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if let Some(base) = name.strip_suffix(".log") {
            assert!(base.parse::<i64>().unwrap() >= 30, "segment {name} left");
        }
    }
    drop(log);

    // A crash after the snapshot was complete, before the log was replaced: open finishes.
    let dir = tempfile::tempdir().unwrap();
    let mut log = open_disk(dir.path());
    fill(&mut log, &[(1, 5)]);
    log.flush().unwrap();
    transfer(&mut log);
    drop(log);
    let log = open_disk(dir.path());
    assert_eq!((log.log_start_offset(), log.log_end_offset()), (30, 30));
    assert_eq!(log.last_fetched_epoch(), 4);
}

/// Disk only: after `delete_before` and a restart, the log starts at the snapshot and the
/// segments wholly below it are gone.
#[test]
fn the_log_start_offset_comes_back_at_the_snapshot_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let config = MetadataLogConfig {
        segment_bytes: 100, // one batch per segment
        file_delete_delay_ms: 0,
        ..MetadataLogConfig::default()
    };
    let mut log = KafkaMetadataLog::open(dir.path(), config.clone()).unwrap();
    fill(&mut log, &[(1, 10), (2, 10)]);
    log.flush().unwrap();
    log.update_high_watermark(20);
    let id = OffsetAndEpoch::new(12, 2);
    log.write_snapshot(id, &[Bytes::from("image")], 0).unwrap();
    assert!(RaftLog::delete_before(&mut log, id, 0).unwrap());
    log.delete_due_files(i64::MAX);
    assert_eq!(log.partition_log().segment_base_offsets()[0], 12);
    drop(log);
    let log = KafkaMetadataLog::open(dir.path(), config).unwrap();
    assert_eq!(log.log_start_offset(), 12);
    assert_eq!(log.log_end_offset(), 20);
    assert_eq!(log.end_offset_for_epoch(2), OffsetAndEpoch::new(20, 2));
    assert_eq!(log.end_offset_for_epoch(1), OffsetAndEpoch::new(12, 1));
    assert_eq!(log.partition_log().segment_base_offsets()[0], 12);
    assert_eq!(RaftLog::earliest_snapshot_id(&log), Some(id));
    let p = KafkaMetadataLog::partition_dir(dir.path());
    assert!(!p.join("00000000000000000000.log").exists());
}

/// A KRaftVersion record and a KRaftVoters record naming `ids`, as a dynamic quorum's
/// (KIP-853) bootstrap snapshot or a voter change carries them.
fn quorum_records(ids: &[i32]) -> Vec<gregor_protocol::metadata_records::log::ControlRecord> {
    use gregor_protocol::metadata_records::log::ControlRecord;
    use kafka_protocol::messages::k_raft_version_record::KRaftVersionRecord;
    use kafka_protocol::messages::voters_record::{
        Endpoint, KRaftVersionFeature, Voter, VotersRecord,
    };
    use kafka_protocol::protocol::StrBytes;
    let voters = ids
        .iter()
        .map(|&id| {
            Voter::default()
                .with_voter_id(id.into())
                .with_voter_directory_id(uuid::Uuid::from_u128(u128::try_from(id).unwrap()))
                .with_endpoints(vec![Endpoint::default()
                    .with_name(StrBytes::from_static_str("CONTROLLER"))
                    .with_host(StrBytes::from_static_str("127.0.0.1"))
                    .with_port(9000 + u16::try_from(id).unwrap())])
                .with_k_raft_version_feature(
                    KRaftVersionFeature::default()
                        .with_min_supported_version(0)
                        .with_max_supported_version(1),
                )
        })
        .collect();
    vec![
        ControlRecord::KRaftVersion(KRaftVersionRecord::default().with_k_raft_version(1)),
        ControlRecord::KRaftVoters(VotersRecord::default().with_voters(voters)),
    ]
}

/// The control records of the first batch of snapshot `id`.
fn first_control_batch(
    log: &KafkaMetadataLog,
    id: OffsetAndEpoch,
) -> Vec<gregor_protocol::metadata_records::log::ControlRecord> {
    use gregor_protocol::metadata_records::log::{decode_batch, BatchRecords};
    let bytes = std::fs::read(
        log.dir()
            .join(gregor_raft::snapshot::snapshot_file_name(id)),
    )
    .unwrap();
    let (_, h) = Batches::new(&bytes).next().unwrap().unwrap();
    match decode_batch(&bytes[..h.total_size()]).unwrap().1 {
        BatchRecords::Control(r) => r,
        BatchRecords::Metadata(_) => panic!("the first batch of {id:?} is not a control batch"),
    }
}

#[test]
fn snapshots_carry_the_quorum_records_in_force_at_their_offset() {
    use gregor_protocol::metadata_records::log::{build_control_batch, ControlRecord};
    let dir = tempfile::tempdir().unwrap();
    let config = MetadataLogConfig {
        segment_bytes: 400,
        retention_max_bytes: 1,
        ..MetadataLogConfig::default()
    };
    let mut log = KafkaMetadataLog::open(dir.path(), config.clone()).unwrap();
    // A static quorum: no quorum records, a snapshot has its header alone.
    assert!(log.quorum_records_at(0).unwrap().records().is_empty());
    // The bootstrap snapshot of `format --standalone`: voters {1}.
    let one = quorum_records(&[1]);
    let mut w = gregor_raft::snapshot::SnapshotWriter::create(
        log.dir(),
        OffsetAndEpoch::new(0, 0),
        -1,
        &one,
        0,
    )
    .unwrap();
    w.append(&[Bytes::from("features")], 0).unwrap();
    w.freeze(0).unwrap();
    log.add_snapshot(OffsetAndEpoch::new(0, 0)).unwrap();
    assert_eq!(log.quorum_records_at(5).unwrap().records(), one);
    // Data, then a voter change at offset 4 (voters {1, 2}), then more data.
    fill(&mut log, &[(1, 4)]);
    let three = quorum_records(&[1, 2]);
    let b = build_control_batch(4, 1, 0, &three[1..]).unwrap();
    log.append_as_leader(Bytes::from(b), 1).unwrap();
    fill(&mut log, &[(1, 5)]);
    log.flush().unwrap();
    log.update_high_watermark(log.log_end_offset());
    // Below the change the bootstrap voters are in force, from it on the new ones.
    assert_eq!(log.quorum_records_at(4).unwrap().records(), one);
    let after = vec![one[0].clone(), three[1].clone()];
    assert_eq!(log.quorum_records_at(5).unwrap().records(), after);
    // A snapshot at 8 carries them after its header, in one control batch, as Kafka writes it.
    let id = OffsetAndEpoch::new(8, 1);
    log.write_snapshot(id, &[Bytes::from("image")], 1_000)
        .unwrap();
    let first = first_control_batch(&log, id);
    assert!(matches!(first[0], ControlRecord::SnapshotHeader(_)));
    assert_eq!(first[1..].to_vec(), after);
    // The bootstrap snapshot and the segments below 8 are cleaned away; a reopened log still
    // finds the voters, in the new snapshot.
    assert!(log.maybe_clean(3_000).unwrap());
    assert_eq!(log.snapshot_ids(), vec![id]);
    drop(log);
    let log = KafkaMetadataLog::open(dir.path(), config).unwrap();
    assert_eq!(log.quorum_records_at(10).unwrap().records(), after);
}
