//! `RaftMetadataLog`: the `MetadataLog` contract on a KRaft quorum of one voter, across a
//! restart, and NotLeader on a voter without a quorum.

use std::sync::Arc;

use gregor_metadata::image::MetadataImage;
use gregor_metadata::loader::{apply_batch, image_from_snapshot};
use gregor_metadata::log::{
    Committed, CommittedBatch, CommittedBatches, MetadataLog, MetadataLogError, MetadataSnapshot,
    RaftMetadataLog, SnapshotSink,
};
use gregor_metadata::record::{ConfigResource, MetadataRecord};
use gregor_raft::driver::{RaftManager, RaftManagerConfig, Transport};
use gregor_raft::{Message, MetadataLogConfig, NodeId, QuorumConfig, VoterSet};

struct NoPeers;

impl Transport for NoPeers {
    fn send(&self, _to: NodeId, _message: Message) {}
}

fn rec(i: usize) -> MetadataRecord {
    MetadataRecord::Config(gregor_protocol::metadata_records::ConfigRecord {
        resource_type: ConfigResource::Topic.resource_type(),
        resource_name: format!("t{i}"),
        name: "retention.ms".into(),
        value: Some(i.to_string()),
        ..Default::default()
    })
}

fn manager(dir: &std::path::Path, voters: &[NodeId]) -> Arc<RaftManager> {
    let mut quorum = QuorumConfig::new(1, VoterSet::new(voters.iter().copied()).unwrap());
    quorum.election_timeout_ms = 100;
    RaftManager::start(
        RaftManagerConfig {
            quorum,
            metadata_log_dir: dir.to_path_buf(),
            log: MetadataLogConfig::default(),
            voter_endpoints: voters
                .iter()
                .map(|&v| (v, ("127.0.0.1".to_string(), 1)))
                .collect(),
            controller_listener_name: "CONTROLLER".into(),
        },
        |_| NoPeers,
    )
    .unwrap()
}

/// The next committed batch of `s` (no snapshot is written in these tests).
async fn next_batch(s: &mut CommittedBatches) -> CommittedBatch {
    s.next().await.unwrap().into_batch().unwrap()
}

#[tokio::test]
async fn one_voter_log_commits_streams_and_survives_a_restart_with_raft_offsets() {
    let dir = tempfile::tempdir().unwrap();
    {
        let log = RaftMetadataLog::start(manager(dir.path(), &[1]));
        // The LeaderChange control batch of epoch 1 is at offset 0: no metadata record.
        assert_eq!(log.catch_up().await.unwrap(), 0);
        let mut early = log.subscribe().unwrap();
        assert_eq!(log.next_write_offset(), 1, "after the LeaderChange record");
        assert_eq!(log.propose(vec![rec(1), rec(2)]).await.unwrap(), 2);
        assert_eq!(log.propose(vec![rec(3)]).await.unwrap(), 3);
        assert!(matches!(
            log.propose(vec![]).await,
            Err(MetadataLogError::EmptyBatch)
        ));
        assert_eq!(log.high_watermark(), 4);
        let a = next_batch(&mut early).await;
        assert_eq!((a.base_offset, a.last_offset()), (1, 2));
        assert_eq!(a.records[..], [rec(1), rec(2)]);
        let b = next_batch(&mut early).await;
        assert_eq!((b.base_offset, b.records[0].clone()), (3, rec(3)));
        log.shutdown().await;
        assert!(early.next().await.is_none(), "streams end at shutdown");
    }
    // Restarted: a new epoch (another LeaderChange record, at offset 4) and the same offsets;
    // the next batch comes after the gap.
    let log = RaftMetadataLog::start(manager(dir.path(), &[1]));
    assert_eq!(log.catch_up().await.unwrap(), 4);
    let mut s = log.subscribe().unwrap();
    let offsets = [next_batch(&mut s).await, next_batch(&mut s).await]
        .iter()
        .map(|b| (b.base_offset, b.last_offset()))
        .collect::<Vec<_>>();
    assert_eq!(offsets, vec![(1, 2), (3, 3)]);
    assert_eq!(log.propose(vec![rec(4)]).await.unwrap(), 5);
    let c = next_batch(&mut s).await;
    assert_eq!((c.base_offset, &c.records[..]), (5, &[rec(4)][..]));
    assert_eq!(log.high_watermark(), 6);
    log.shutdown().await;
}

#[tokio::test]
async fn a_voter_without_a_quorum_answers_not_leader() {
    let dir = tempfile::tempdir().unwrap();
    let log = RaftMetadataLog::start(manager(dir.path(), &[1, 2, 3]));
    match log.propose(vec![rec(1)]).await {
        Err(MetadataLogError::NotLeader { leader_id, .. }) => assert_eq!(leader_id, None),
        other => panic!("{other:?}"),
    }
    log.shutdown().await;
}

fn topic(name: &str, partitions: i32, replicas: &[i32]) -> Vec<MetadataRecord> {
    use gregor_protocol::metadata_records::{PartitionRecord, TopicRecord};
    let topic_id = uuid::Uuid::new_v4();
    let mut out = vec![MetadataRecord::Topic(TopicRecord {
        name: name.to_string(),
        topic_id,
        ..Default::default()
    })];
    for p in 0..partitions {
        out.push(MetadataRecord::Partition(PartitionRecord {
            partition_id: p,
            topic_id,
            replicas: replicas.to_vec(),
            isr: replicas.to_vec(),
            leader: replicas[p as usize % replicas.len()],
            leader_epoch: 0,
            partition_epoch: 0,
            directories: vec![uuid::Uuid::nil(); replicas.len()],
            ..Default::default()
        }));
    }
    out
}

/// The image a stream gives from its start to `high_watermark`, as the loader builds it.
async fn image_of(s: &mut CommittedBatches, high_watermark: u64) -> (MetadataImage, usize) {
    let mut image = MetadataImage::default();
    let mut snapshots = 0;
    while image.offset < high_watermark {
        match s.next().await.unwrap() {
            Committed::Batch(b) => image = apply_batch(&image, &b),
            Committed::Snapshot(snap) => {
                snapshots += 1;
                image = image_from_snapshot(&snap);
            }
        }
    }
    (image, snapshots)
}

/// Kafka's rule that a snapshot plus the log after it is the log: the image loaded from the
/// latest snapshot and the batches after it (after a restart) equals the image of the whole
/// log, offsets included.
#[tokio::test]
async fn image_from_a_snapshot_and_the_tail_equals_the_image_of_the_whole_log() {
    let dir = tempfile::tempdir().unwrap();
    let full = {
        let log = RaftMetadataLog::start(manager(dir.path(), &[1]));
        log.catch_up().await.unwrap();
        // Subscribed before the snapshot: this stream gets every batch of the log.
        let mut whole = log.subscribe().unwrap();
        for i in 0..20 {
            log.propose(topic(&format!("t{i}"), 3, &[1, 2, 3]))
                .await
                .unwrap();
        }
        let mut s = log.subscribe().unwrap();
        let (image, _) = image_of(&mut s, log.high_watermark()).await;
        let epoch = log.manager().leader_and_epoch().borrow().epoch;
        let snapshot = MetadataSnapshot {
            end_offset: image.offset,
            epoch,
            records: image.to_records().into(),
        };
        assert!(log.write_snapshot(snapshot.clone()).await.unwrap());
        assert!(
            !log.write_snapshot(snapshot).await.unwrap(),
            "already there"
        );
        // A new subscriber starts from the snapshot.
        let mut s = log.subscribe().unwrap();
        assert!(matches!(s.next().await, Some(Committed::Snapshot(_))));
        for i in 20..25 {
            log.propose(topic(&format!("t{i}"), 2, &[2, 3, 1]))
                .await
                .unwrap();
        }
        log.propose(vec![MetadataRecord::RemoveTopic(
            gregor_protocol::metadata_records::RemoveTopicRecord {
                topic_id: image.topic_ids["t3"],
                ..Default::default()
            },
        )])
        .await
        .unwrap();
        let (full, snapshots) = image_of(&mut whole, log.high_watermark()).await;
        assert_eq!(snapshots, 0, "the whole log, batch by batch");
        let mut s = log.subscribe().unwrap();
        let (from_snapshot, snapshots) = image_of(&mut s, log.high_watermark()).await;
        assert_eq!(snapshots, 1);
        assert_eq!(from_snapshot, full);
        log.shutdown().await;
        full
    };
    // After a restart the log is read from the snapshot: the same image.
    let log = RaftMetadataLog::start(manager(dir.path(), &[1]));
    log.catch_up().await.unwrap();
    let mut s = log.subscribe().unwrap();
    let (loaded, snapshots) = image_of(&mut s, full.offset).await;
    assert_eq!(snapshots, 1, "the restart loads the snapshot first");
    assert_eq!(loaded, full);
    assert_eq!(loaded.topic_ids.len(), 24);
    log.shutdown().await;
}

/// The size of a snapshot of 10,000 partitions (1,000 topics of 10 partitions, 3 replicas
/// each, with directories as Kafka 4.4 writes them), as written to disk. Printed, not
/// asserted beyond being plausible (each partition record is about 80 bytes).
#[tokio::test]
async fn snapshot_size_of_ten_thousand_partitions() {
    let mut image = MetadataImage::default();
    image.apply(&MetadataRecord::FeatureLevel(
        gregor_protocol::metadata_records::FeatureLevelRecord {
            name: "metadata.version".into(),
            feature_level: 27,
            ..Default::default()
        },
    ));
    for t in 0..1000 {
        for r in topic(&format!("topic-{t:04}"), 10, &[1, 2, 3]) {
            image.apply(&r);
        }
    }
    let records = image.to_records();
    let values: Vec<bytes::Bytes> = records
        .iter()
        .map(|r| gregor_metadata::codec::encode_record(r).unwrap())
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let id = gregor_raft::OffsetAndEpoch::new(image.offset as i64, 1);
    let mut w = gregor_raft::snapshot::SnapshotWriter::create(dir.path(), id, 0, &[], 1).unwrap();
    w.append(&values, 0).unwrap();
    let path = w.freeze(0).unwrap();
    let bytes = std::fs::metadata(&path).unwrap().len();
    println!(
        "snapshot of 1,000 topics x 10 partitions (RF 3): {} records, {bytes} bytes ({:.1} bytes per partition)",
        records.len(),
        bytes as f64 / 10_000.0
    );
    assert_eq!(records.len(), 1 + 1000 + 10_000);
    assert!((500_000..5_000_000).contains(&bytes), "{bytes}");
    // It reads back to the same image.
    let started = std::time::Instant::now();
    let snapshot = gregor_raft::snapshot::read_snapshot(&path).unwrap();
    let mut back = MetadataImage::default();
    for batch in &snapshot.batches {
        let header = gregor_protocol::batch::BatchHeader::parse(batch).unwrap();
        if header.is_control() {
            continue;
        }
        for r in gregor_protocol::records::decode_records(batch).unwrap() {
            back.apply(&gregor_metadata::codec::decode_record(&r.value.unwrap()).unwrap());
        }
    }
    back.offset = image.offset;
    println!(
        "reading, checking and loading it into an image: {} ms (debug build)",
        started.elapsed().as_millis()
    );
    assert_eq!(back, image);
}
