//! Unit tests of the driver with an in-process transport: the test plays the peer voters.

use std::time::Duration;

use super::*;
use crate::message::{FetchRequest, VoteRequest, VoteResponse};
use crate::types::VoterSet;
use bytes::BytesMut;

/// Outbound messages, for the test to read.
struct ChannelTransport(std::sync::mpsc::Sender<(NodeId, Message)>);

impl Transport for ChannelTransport {
    fn send(&self, to: NodeId, message: Message) {
        let _ = self.0.send((to, message));
    }
}

fn config(dir: &std::path::Path, voters: &[NodeId]) -> RaftManagerConfig {
    let mut quorum = QuorumConfig::new(1, VoterSet::new(voters.iter().copied()).unwrap());
    quorum.election_timeout_ms = 100;
    quorum.fetch_timeout_ms = 400;
    quorum.election_backoff_max_ms = 100;
    RaftManagerConfig {
        quorum,
        metadata_log_dir: dir.to_path_buf(),
        log: MetadataLogConfig::default(),
        voter_endpoints: voters
            .iter()
            .map(|&v| (v, ("127.0.0.1".to_string(), 9093 + v as u16)))
            .collect(),
        controller_listener_name: "CONTROLLER".into(),
    }
}

type Outbound = std::sync::mpsc::Receiver<(NodeId, Message)>;

fn start(dir: &std::path::Path, voters: &[NodeId]) -> (Arc<RaftManager>, Outbound, InboundSender) {
    let (tx, rx) = std::sync::mpsc::channel();
    let mut inbound = None;
    let m = RaftManager::start(config(dir, voters), |i| {
        inbound = Some(i);
        ChannelTransport(tx)
    })
    .unwrap();
    (m, rx, inbound.unwrap())
}

async fn wait_leader(m: &RaftManager, id: NodeId, above_epoch: i32) -> LeaderAndEpoch {
    let mut rx = m.leader_and_epoch();
    let le = tokio::time::timeout(
        Duration::from_secs(10),
        rx.wait_for(|l| l.leader_id == Some(id) && l.epoch > above_epoch),
    )
    .await
    .expect("leader in time")
    .unwrap();
    *le
}

#[tokio::test]
async fn one_voter_commits_and_streams_committed_batches_without_control_batches() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _out, _in) = start(dir.path(), &[1]);
    let le = wait_leader(&m, 1, 0).await;
    assert!(le.epoch >= 1);
    let a = m.propose(vec![Bytes::from_static(b"a")]).await.unwrap();
    let b = m
        .propose(vec![Bytes::from_static(b"b"), Bytes::from_static(b"c")])
        .await
        .unwrap();
    assert_eq!(b, a + 2);
    assert!(*m.high_watermark().borrow() > b, "resolved at commit");
    let mut s = m.committed(0);
    let first = s.next().await.unwrap().into_batch().unwrap();
    assert_eq!(first.values, vec![Bytes::from_static(b"a")]);
    assert_eq!(first.last_offset, a);
    assert!(
        first.base_offset >= 1,
        "the LeaderChange control batch comes first"
    );
    let second = s.next().await.unwrap().into_batch().unwrap();
    assert_eq!((second.base_offset, second.last_offset), (a + 1, b));
    assert_eq!(second.values.len(), 2);
    assert_eq!(
        m.propose(Vec::new()).await,
        Err(DriverError::Refused(
            "a proposal needs at least one record".into()
        ))
    );
    m.shutdown().await;
    assert_eq!(
        m.propose(vec![Bytes::from_static(b"x")]).await,
        Err(DriverError::Shutdown)
    );
    // Restarted from its directory: the committed batches are read back, and it leads again
    // in a later epoch.
    let (m, _out, _in) = start(dir.path(), &[1]);
    let again = wait_leader(&m, 1, le.epoch).await;
    assert!(again.epoch > le.epoch);
    // It leads only once its new epoch is committed; reading waits for that.
    let mut s = m.committed(0);
    assert_eq!(
        s.next().await.unwrap().into_batch().unwrap().values,
        vec![Bytes::from_static(b"a")]
    );
    m.shutdown().await;
}

#[tokio::test]
async fn committed_stream_starts_from_the_latest_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _out, _in) = start(dir.path(), &[1]);
    let le = wait_leader(&m, 1, 0).await;
    m.propose(vec![Bytes::from_static(b"a")]).await.unwrap();
    let b = m.propose(vec![Bytes::from_static(b"b")]).await.unwrap();
    assert_eq!(m.log_end_offset(), b + 1, "nothing else was appended");
    let id = OffsetAndEpoch::new(b + 1, le.epoch);
    assert!(
        m.write_snapshot(OffsetAndEpoch::new(b + 5, le.epoch), vec![])
            .await
            .is_err(),
        "a snapshot above the high watermark is refused"
    );
    assert!(m
        .write_snapshot(id, vec![Bytes::from_static(b"image")])
        .await
        .unwrap());
    assert!(
        !m.write_snapshot(id, vec![]).await.unwrap(),
        "already there"
    );
    let c = m.propose(vec![Bytes::from_static(b"c")]).await.unwrap();
    let snapshot = Committed::Snapshot(LoadedSnapshot {
        id,
        values: vec![Bytes::from_static(b"image")],
    });
    let mut s = m.committed(0);
    assert_eq!(s.next().await.unwrap(), snapshot);
    let next = s.next().await.unwrap().into_batch().unwrap();
    assert_eq!((next.last_offset, next.values.len()), (c, 1));
    // A stream that starts at the snapshot's end reads the log only.
    let mut s = m.committed(id.offset);
    assert_eq!(s.next().await.unwrap().into_batch().unwrap().last_offset, c);
    m.shutdown().await;
    // After a restart the snapshot still comes first.
    let (m, _out, _in) = start(dir.path(), &[1]);
    let mut s = m.committed(0);
    assert_eq!(s.next().await.unwrap(), snapshot);
    assert_eq!(s.next().await.unwrap().into_batch().unwrap().last_offset, c);
    m.shutdown().await;
}

#[tokio::test]
async fn a_vote_is_on_disk_before_it_is_answered() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _out, _in) = start(dir.path(), &[1, 2, 3]);
    let response = m
        .handle_request(
            2,
            Request::Vote(VoteRequest {
                cluster_id: None,
                voter_id: Some(1),
                replica_epoch: 5,
                replica_id: 2,
                last_offset_epoch: 0,
                last_offset: 0,
                pre_vote: false,
            }),
        )
        .await
        .unwrap();
    // The answer reached this caller (routed by the driver's correlation id) ...
    let Response::Vote(VoteResponse { vote_granted, .. }) = response else {
        panic!("{response:?}")
    };
    assert!(vote_granted);
    // ... and the quorum-state file already held the vote when it did.
    let store = FileQuorumStateStore::new(&KafkaMetadataLog::partition_dir(dir.path()));
    let (state, _) = store.read().unwrap().unwrap();
    assert_eq!((state.epoch, state.voted_id), (5, Some(2)));
    // A request claiming this node's own id is not answered by the node: the caller is released.
    let own = m
        .handle_request(
            1,
            Request::Vote(VoteRequest {
                cluster_id: None,
                voter_id: Some(1),
                replica_epoch: 6,
                replica_id: 1,
                last_offset_epoch: 0,
                last_offset: 0,
                pre_vote: false,
            }),
        )
        .await;
    assert_eq!(own, Err(DriverError::Shutdown));
    // Not the leader: proposals are refused with the leader it knows (none yet).
    let e = m.propose(vec![Bytes::from_static(b"x")]).await.unwrap_err();
    assert!(
        matches!(
            e,
            DriverError::NotLeader {
                epoch: 5,
                leader_id: None
            }
        ),
        "{e:?}"
    );
    m.shutdown().await;
}

/// Answers node 1's (pre-)vote requests as voter 2 until node 1 leads.
fn grant_votes(out: &Outbound, inbound: &InboundSender) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let Ok((to, message)) = out.recv_timeout(Duration::from_millis(50)) else {
            continue;
        };
        if let Message::Request {
            correlation_id,
            request: Request::Vote(v),
        } = message
        {
            if to == 2 {
                inbound.deliver(
                    2,
                    Message::Response {
                        correlation_id,
                        response: Response::Vote(VoteResponse {
                            error: ErrorCode::None,
                            leader_id: None,
                            leader_epoch: v.replica_epoch,
                            vote_granted: true,
                        }),
                    },
                );
                if !v.pre_vote {
                    return;
                }
            }
        }
    }
    panic!("no vote request");
}

#[tokio::test]
async fn a_proposal_resolves_only_when_a_majority_has_fetched_it() {
    let dir = tempfile::tempdir().unwrap();
    let (m, out, inbound) = start(dir.path(), &[1, 2, 3]);
    let out = tokio::task::spawn_blocking(move || {
        grant_votes(&out, &inbound);
        out
    })
    .await
    .unwrap();
    let le = wait_leader(&m, 1, 0).await;
    let m2 = m.clone();
    let proposal = tokio::spawn(async move { m2.propose(vec![Bytes::from_static(b"v")]).await });
    // Nobody fetched: the batch is not committed.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!proposal.is_finished(), "resolved before a majority had it");
    // Voter 2 fetches until it has the batch; its next fetch reports it, which commits it.
    let mut fetch_offset = 0;
    let mut last_epoch = 0;
    for _ in 0..10 {
        let r = m
            .handle_request(
                2,
                Request::Fetch(FetchRequest {
                    cluster_id: None,
                    replica_id: 2,
                    max_wait_ms: 0,
                    current_leader_epoch: le.epoch,
                    fetch_offset,
                    last_fetched_epoch: last_epoch,
                    high_watermark: -1,
                }),
            )
            .await
            .unwrap();
        let Response::Fetch(f) = r else {
            panic!("{r:?}")
        };
        assert_eq!(f.error, ErrorCode::None);
        let mut pos = 0;
        while pos < f.records.len() {
            let h = BatchHeader::parse(&f.records[pos..]).unwrap();
            fetch_offset = h.next_offset();
            last_epoch = h.partition_leader_epoch;
            pos += h.total_size();
        }
        if proposal.is_finished() {
            break;
        }
    }
    let committed = tokio::time::timeout(Duration::from_secs(5), proposal)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(committed < fetch_offset);
    // DescribeQuorum from the leader lists the voters, 2 with its fetch offset.
    let d = m
        .describe_quorum(
            &kp::DescribeQuorumRequest::default().with_topics(vec![
                kp::describe_quorum_request::TopicData::default()
                    .with_topic_name(TopicName(StrBytes::from_static_str("__cluster_metadata")))
                    .with_partitions(vec![kp::describe_quorum_request::PartitionData::default()]),
            ]),
            2,
        )
        .await;
    let p = &d.topics[0].partitions[0];
    assert_eq!(
        (p.error_code, p.leader_id.0, p.leader_epoch),
        (0, 1, le.epoch)
    );
    let voter2 = p
        .current_voters
        .iter()
        .find(|v| v.replica_id.0 == 2)
        .unwrap();
    assert_eq!(voter2.log_end_offset, fetch_offset);
    assert_eq!(p.current_voters.len(), 3);
    assert_eq!(d.nodes.len(), 3);
    // Below v2: no Nodes, no directory ids (v2 fields that would not encode).
    let v1 = m
        .describe_quorum(
            &kp::DescribeQuorumRequest::default().with_topics(vec![
                kp::describe_quorum_request::TopicData::default()
                    .with_topic_name(TopicName(StrBytes::from_static_str("__cluster_metadata")))
                    .with_partitions(vec![kp::describe_quorum_request::PartitionData::default()]),
            ]),
            1,
        )
        .await;
    assert!(v1.nodes.is_empty());
    let mut buf = bytes::BytesMut::new();
    kafka_protocol::protocol::Encodable::encode(&v1, &mut buf, 1).expect("encodes at v1");
    // Another partition or topic: UNKNOWN_TOPIC_OR_PARTITION in each one named (Kafka's
    // partition-level error response), nothing about the quorum.
    let other = m
        .describe_quorum(
            &kp::DescribeQuorumRequest::default().with_topics(vec![
                kp::describe_quorum_request::TopicData::default()
                    .with_topic_name(TopicName(StrBytes::from_static_str("__cluster_metadata")))
                    .with_partitions(vec![
                        kp::describe_quorum_request::PartitionData::default(),
                        kp::describe_quorum_request::PartitionData::default()
                            .with_partition_index(1),
                    ]),
                kp::describe_quorum_request::TopicData::default()
                    .with_topic_name(TopicName(StrBytes::from_static_str("orders")))
                    .with_partitions(vec![kp::describe_quorum_request::PartitionData::default()]),
            ]),
            2,
        )
        .await;
    assert_eq!(other.error_code, 0);
    let errors: Vec<(&str, i32, i16, usize)> = other
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(|p| {
                (
                    t.topic_name.0.as_str(),
                    p.partition_index,
                    p.error_code,
                    p.current_voters.len(),
                )
            })
        })
        .collect();
    let unknown = ErrorCode::UnknownTopicOrPartition.code();
    assert_eq!(
        errors,
        [
            ("__cluster_metadata", 0, unknown, 0),
            ("__cluster_metadata", 1, unknown, 0),
            ("orders", 0, unknown, 0)
        ]
    );
    assert!(other.nodes.is_empty());
    m.shutdown().await;
    // A leader shutting down resigns: EndQuorumEpoch goes to the voters.
    let sent: Vec<_> = out.try_iter().collect();
    assert!(
        sent.iter().any(|(_, msg)| matches!(
            msg,
            Message::Request {
                request: Request::EndQuorumEpoch(_),
                ..
            }
        )),
        "no EndQuorumEpoch on shutdown"
    );
}

#[test]
fn parse_committed_stops_at_the_high_watermark_and_skips_control_batches() {
    let data = crate::batches::build_data_batch(1, 3, 0, &[Bytes::from_static(b"x")]);
    let control = crate::batches::build_leader_change_batch(0, 3, 0, 1, &[1], &[1]);
    let mut all = BytesMut::new();
    all.extend_from_slice(&control);
    all.extend_from_slice(&data);
    let mut out = std::collections::VecDeque::new();
    assert_eq!(parse_committed(&all, 0, 1, &mut out).unwrap(), 1);
    assert!(out.is_empty());
    assert_eq!(parse_committed(&all, 0, 2, &mut out).unwrap(), 2);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].values, vec![Bytes::from_static(b"x")]);
    assert!(parse_committed(&all[..20], 0, 2, &mut out).is_err());
}
