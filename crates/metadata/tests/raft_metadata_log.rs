//! `RaftMetadataLog`: the `MetadataLog` contract on a KRaft quorum of one voter, across a
//! restart, and NotLeader on a voter without a quorum.

use std::sync::Arc;

use gregor_metadata::log::{
    CommittedBatch, CommittedBatches, MetadataLog, MetadataLogError, RaftMetadataLog,
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
    let offsets = vec![next_batch(&mut s).await, next_batch(&mut s).await]
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
