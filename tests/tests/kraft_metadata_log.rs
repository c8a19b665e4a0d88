//! Kafka 4.4.0 reads the `__cluster_metadata-0` directory gregor-raft's disk log writes:
//! `kafka-dump-log --cluster-metadata-decoder` decodes our segment and our snapshot, and a
//! combined Kafka node starts on a directory whose segments, snapshots and `quorum-state`
//! were all written by `KafkaMetadataLog`, `SnapshotWriter` and `FileQuorumStateStore` (only
//! `meta.properties` is Kafka's own, from `kafka-storage format`), the log cleaned up to our
//! snapshot (so Kafka must load the snapshot), and describes the topics our snapshot and our
//! log create. Skipped (with a message) when the Kafka jars cannot be fetched.

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use gregor_protocol::metadata_records::log::{build_metadata_batch, MetadataLogBatches};
use gregor_protocol::metadata_records::{
    encode_framed, ApiMessageAndVersion, FeatureLevelRecord, PartitionRecord, TopicRecord,
};
use gregor_raft::batches::build_leader_change_batch;
use gregor_raft::quorum_state::FileQuorumStateStore;
use gregor_raft::{
    ElectionState, KafkaMetadataLog, MetadataLogConfig, OffsetAndEpoch, RaftLog, VoterSet,
};
use gregor_tests::process::{free_port, ChildGuard};
use gregor_tests::reference::{self, Instance};
use uuid::Uuid;

const TOPIC_A: u128 = 0x0a0a_0a0a_0a0a_0a0a_0a0a_0a0a_0a0a_0a0a;
const TOPIC_B: u128 = 0x0b0b_0b0b_0b0b_0b0b_0b0b_0b0b_0b0b_0b0b;

fn now_ms() -> i64 {
    i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_millis(),
    )
    .expect("a timestamp")
}

fn features() -> Vec<ApiMessageAndVersion> {
    [
        ("metadata.version", 33),
        ("eligible.leader.replicas.version", 1),
        ("group.version", 1),
        ("share.version", 2),
        ("streams.version", 1),
        ("transaction.version", 2),
    ]
    .iter()
    .map(|(name, level)| {
        ApiMessageAndVersion::new(
            FeatureLevelRecord {
                name: (*name).into(),
                feature_level: *level,
                ..Default::default()
            },
            0,
        )
    })
    .collect()
}

fn topic(name: &str, id: u128, partitions: i32) -> Vec<ApiMessageAndVersion> {
    let id = Uuid::from_u128(id);
    let mut out = vec![ApiMessageAndVersion::latest(TopicRecord {
        name: name.into(),
        topic_id: id,
        ..Default::default()
    })];
    for partition_id in 0..partitions {
        out.push(ApiMessageAndVersion::latest(PartitionRecord {
            partition_id,
            topic_id: id,
            replicas: vec![1],
            isr: vec![1],
            leader: 1,
            directories: vec![Uuid::nil()],
            ..Default::default()
        }));
    }
    out
}

fn framed(records: &[ApiMessageAndVersion]) -> Vec<Bytes> {
    records
        .iter()
        .map(|r| Bytes::from(encode_framed(r).expect("encodable")))
        .collect()
}

/// Writes, through gregor-raft only, a metadata log directory in `data_dir`: the bootstrap
/// snapshot `0-0` (feature levels), a log of epoch 1 (LeaderChange, feature levels, topic
/// `from-gregor-snapshot`), a snapshot at its end holding the whole image, then more log
/// (topic `from-gregor-log`), and `quorum-state` (epoch 1, leader 1). With `clean`, segments
/// are small, so the log after the snapshot is in its own segment, and the log is cleaned up
/// to the snapshot: the first segment is deleted and a reader must start from the snapshot.
/// Returns the newest segment's path and the snapshot's.
fn write_metadata_dir(data_dir: &Path, clean: bool) -> (std::path::PathBuf, std::path::PathBuf) {
    let now = now_ms();
    let config = MetadataLogConfig {
        segment_bytes: if clean { 600 } else { 1 << 30 },
        ..MetadataLogConfig::default()
    };
    let mut log = KafkaMetadataLog::open(data_dir, config).expect("open");
    let bootstrap = log
        .create_snapshot(OffsetAndEpoch::new(0, 0), -1, now)
        .expect("bootstrap snapshot");
    let mut bootstrap = bootstrap;
    bootstrap.append(&framed(&features()), now).expect("append");
    bootstrap.freeze(now).expect("freeze");
    log.add_snapshot(OffsetAndEpoch::new(0, 0)).expect("add");

    let epoch = 1;
    let lc = build_leader_change_batch(0, epoch, now, 1, &[1], &[1]);
    log.append_as_leader(lc, epoch).expect("leader change");
    let mut image = features();
    image.extend(topic("from-gregor-snapshot", TOPIC_A, 2));
    let b = build_metadata_batch(1, epoch, now, &image).expect("batch");
    log.append_as_leader(Bytes::from(b), epoch).expect("image");
    log.flush().expect("flush");
    let snapshot_end = log.log_end_offset();
    log.update_high_watermark(snapshot_end);
    let id = OffsetAndEpoch::new(snapshot_end, epoch);
    let mut w = log.create_snapshot(id, now, now).expect("snapshot");
    w.append(&framed(&image), now).expect("append");
    let snapshot = w.freeze(now).expect("freeze");
    log.add_snapshot(id).expect("add");

    let more = topic("from-gregor-log", TOPIC_B, 3);
    let b = build_metadata_batch(snapshot_end, epoch, now, &more).expect("batch");
    log.append_as_leader(Bytes::from(b), epoch).expect("more");
    log.flush().expect("flush");
    if clean {
        assert_eq!(
            log.partition_log().segment_base_offsets(),
            vec![0, snapshot_end],
            "the log after the snapshot rolled into its own segment"
        );
        assert!(log.delete_before_snapshot(id, now).expect("clean"));
        assert_eq!(log.log_start_offset(), snapshot_end);
        log.delete_due_files(now + 60_001);
        assert!(!log.dir().join("00000000000000000000.log").exists());
        assert!(!log
            .dir()
            .join("00000000000000000000-0000000000.checkpoint")
            .exists());
    }

    let store = FileQuorumStateStore::new(log.dir());
    store
        .write(
            &ElectionState {
                epoch,
                leader_id: Some(1),
                voted_id: None,
            },
            &VoterSet::new([1]).expect("voters"),
        )
        .expect("quorum-state");
    log.close().expect("close");
    let base = *log
        .partition_log()
        .segment_base_offsets()
        .last()
        .expect("a segment");
    let segment = log.dir().join(format!("{base:020}.log"));
    (segment, snapshot)
}

#[test]
fn kafka_dump_log_reads_our_segment_and_snapshot() {
    if !reference::jars_or_skip() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let (segment, snapshot) = write_metadata_dir(dir.path(), false);
    let dump = reference::dump_cluster_metadata(&segment).expect("kafka-dump-log reads the file");
    eprintln!("{dump}");
    assert!(dump.contains("LeaderChange"), "{dump}");
    assert!(dump.contains("from-gregor-snapshot"), "{dump}");
    assert!(dump.contains("from-gregor-log"), "{dump}");
    assert_eq!(dump.matches("baseOffset:").count(), 3, "{dump}");
    assert!(dump.contains("partitionLeaderEpoch: 1"), "{dump}");
    let dump = reference::dump_cluster_metadata(&snapshot).expect("kafka-dump-log reads the file");
    eprintln!("{dump}");
    assert!(dump.contains("SnapshotHeader"), "{dump}");
    assert!(dump.contains("SnapshotFooter"), "{dump}");
    assert!(dump.contains("from-gregor-snapshot"), "{dump}");
    assert!(!dump.contains("from-gregor-log"), "{dump}");
}

fn tool_output(args: &[&str]) -> String {
    reference::tool_output("kafka-topics", args).expect("kafka-topics")
}

#[test]
fn kafka_starts_on_a_metadata_log_directory_gregor_wrote() {
    if !reference::jars_or_skip() {
        return;
    }
    let port = free_port().expect("a free port");
    let instance = Instance::new(port, None, None).expect("an instance");
    instance.format().expect("kafka-storage format");
    // Keep Kafka's meta.properties; replace everything in __cluster_metadata-0 with ours.
    let kafka_dir = KafkaMetadataLog::partition_dir(&instance.data_dir);
    if kafka_dir.exists() {
        std::fs::remove_dir_all(&kafka_dir).expect("removing Kafka's metadata dir");
    }
    let (segment, _) = write_metadata_dir(&instance.data_dir, true);
    let written = std::fs::read(&segment).expect("our segment");

    let child = instance.start().expect("starting Kafka");
    let mut guard = ChildGuard::new("kafka", child);
    instance
        .wait_ready(|| guard.check_alive())
        .expect("Kafka ready on gregor's metadata log");
    let bs = instance.bootstrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    for (name, partitions) in [("from-gregor-snapshot", 2), ("from-gregor-log", 3)] {
        loop {
            let out = tool_output(&["--bootstrap-server", &bs, "--describe", "--topic", name]);
            if out.contains(&format!("PartitionCount: {partitions}")) && out.contains("Leader: 1") {
                eprintln!("{out}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "Kafka does not describe {name}:\n{out}\n{}",
                std::fs::read_to_string(instance.server_log()).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_secs(1));
        }
    }
    guard.stop().expect("stopping Kafka");
    // Kafka kept our batches and appended its own after them (a new epoch's LeaderChange, the
    // broker's registration); gregor opens the result and reads every batch.
    let after = std::fs::read(&segment).expect("segment after Kafka");
    assert!(after.len() > written.len(), "Kafka appended nothing");
    assert_eq!(&after[..written.len()], &written[..]);
    for b in MetadataLogBatches::new(&after) {
        b.expect("every batch decodes");
    }
    let log = KafkaMetadataLog::open(&instance.data_dir, MetadataLogConfig::default())
        .expect("gregor opens the directory Kafka ran on");
    assert!(
        log.last_fetched_epoch() > 1,
        "Kafka elected itself in a new epoch"
    );
    assert_eq!(log.log_start_offset(), 10);
    let mut at = log.log_start_offset();
    while at < log.log_end_offset() {
        let bytes = log.read(at, 1 << 20).expect("read");
        for b in gregor_protocol::batch::Batches::new(&bytes) {
            let (_, h) = b.expect("batch");
            at = h.next_offset();
        }
    }
    let (state, voters) = FileQuorumStateStore::new(log.dir())
        .read()
        .expect("quorum-state Kafka wrote")
        .expect("present");
    assert!(state.epoch > 1, "{state:?}");
    assert!(voters.is_empty() || voters == vec![1], "{voters:?}");
    let _ = std::fs::remove_dir_all(&instance.data_dir);
}

/// gregor opens the `__cluster_metadata-0` of a fresh Kafka 4.4.0 run (Kafka's own segments,
/// indexes, `leader-epoch-checkpoint`, `partition.metadata`, bootstrap snapshot and
/// `quorum-state`) and reads every batch; the files Kafka keeps there are the ones gregor
/// writes.
#[test]
fn gregor_opens_the_metadata_log_of_a_fresh_kafka_run() {
    if !reference::jars_or_skip() {
        return;
    }
    let port = free_port().expect("a free port");
    let instance = Instance::new(port, None, None).expect("an instance");
    instance.format().expect("kafka-storage format");
    let child = instance.start().expect("starting Kafka");
    let mut guard = ChildGuard::new("kafka", child);
    instance
        .wait_ready(|| guard.check_alive())
        .expect("Kafka ready");
    guard.stop().expect("stopping Kafka");
    let dir = KafkaMetadataLog::partition_dir(&instance.data_dir);
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("Kafka's metadata dir")
        .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
        .collect();
    names.sort();
    eprintln!("{names:?}");
    for f in [
        "00000000000000000000.log",
        "00000000000000000000.index",
        "00000000000000000000.timeindex",
        "leader-epoch-checkpoint",
        "partition.metadata",
        "quorum-state",
        "00000000000000000000-0000000000.checkpoint",
    ] {
        assert!(names.iter().any(|n| n == f), "Kafka has no {f}: {names:?}");
    }
    assert_eq!(
        std::fs::read_to_string(dir.join("partition.metadata")).expect("partition.metadata"),
        "version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAQ"
    );
    let log = KafkaMetadataLog::open(&instance.data_dir, MetadataLogConfig::default())
        .expect("gregor opens Kafka's metadata log");
    assert!(log.log_end_offset() > 0);
    assert!(log.last_fetched_epoch() >= 1);
    assert!(log.snapshot_ids().contains(&OffsetAndEpoch::new(0, 0)));
    let epochs = std::fs::read_to_string(dir.join("leader-epoch-checkpoint")).expect("epochs");
    assert!(
        epochs.starts_with("0\n"),
        "leader-epoch-checkpoint version 0: {epochs}"
    );
    let mut at = 0;
    let mut batches = 0;
    while at < log.log_end_offset() {
        let bytes = log.read(at, 1 << 20).expect("read");
        for b in gregor_protocol::batch::Batches::new(&bytes) {
            let (_, h) = b.expect("batch");
            assert_eq!(h.base_offset, at);
            at = h.next_offset();
            batches += 1;
        }
    }
    assert!(batches > 0);
    let (state, _) = FileQuorumStateStore::new(log.dir())
        .read()
        .expect("Kafka's quorum-state")
        .expect("present");
    assert_eq!(state.leader_id, Some(1));
    let _ = std::fs::remove_dir_all(&instance.data_dir);
}
