//! Scenario tests of `RaftNode`, message by message: the rules of KIP-595/KIP-996 that the
//! simulator exercises at random, pinned here one at a time.

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;
use gregor_protocol::error::ErrorCode;
use gregor_raft::batches::build_data_batch;
use gregor_raft::config::BrokenRule;
use gregor_raft::message::{
    BeginQuorumEpochRequest, FetchRequest, FetchResponse, FetchSnapshotRequest,
    FetchSnapshotResponse, Request, Response, VoteRequest, VoteResponse,
};
use gregor_raft::{
    Action, ElectionState, MemoryLog, Message, NodeId, OffsetAndEpoch, QuorumConfig, RaftLog,
    RaftNode, Rng, Role, VoterSet,
};

fn config(id: NodeId, voters: &[NodeId]) -> QuorumConfig {
    QuorumConfig::new(id, VoterSet::new(voters.iter().copied()).unwrap())
}

fn log_with(epochs: &[i32]) -> MemoryLog {
    let mut log = MemoryLog::new();
    for &epoch in epochs {
        let b = build_data_batch(log.log_end_offset(), epoch, 0, &[Bytes::from("old")]);
        log.append_as_leader(b, epoch).unwrap();
    }
    log
}

/// The requests in `actions`: (destination, correlation id, request).
fn requests(actions: &[Action]) -> Vec<(NodeId, i32, Request)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Send {
                to,
                message:
                    Message::Request {
                        correlation_id,
                        request,
                    },
            } => Some((*to, *correlation_id, request.clone())),
            _ => None,
        })
        .collect()
}

fn responses(actions: &[Action]) -> Vec<Response> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Send {
                message: Message::Response { response, .. },
                ..
            } => Some(response.clone()),
            _ => None,
        })
        .collect()
}

fn vote_response(actions: &[Action]) -> VoteResponse {
    match responses(actions).as_slice() {
        [Response::Vote(v)] => v.clone(),
        other => panic!("expected one vote response, got {other:?}"),
    }
}

fn fetch_response(actions: &[Action]) -> FetchResponse {
    match responses(actions).as_slice() {
        [Response::Fetch(f)] => f.clone(),
        other => panic!("expected one fetch response, got {other:?}"),
    }
}

fn vote(from: NodeId, epoch: i32, last: OffsetAndEpoch, pre_vote: bool) -> Message {
    Message::Request {
        correlation_id: 1,
        request: Request::Vote(VoteRequest {
            cluster_id: None,
            voter_id: None,
            replica_epoch: epoch,
            replica_id: from,
            last_offset_epoch: last.epoch,
            last_offset: last.offset,
            pre_vote,
        }),
    }
}

fn fetch(from: NodeId, epoch: i32, end: OffsetAndEpoch) -> Message {
    Message::Request {
        correlation_id: 7,
        request: Request::Fetch(FetchRequest {
            cluster_id: None,
            replica_id: from,
            max_wait_ms: 0,
            current_leader_epoch: epoch,
            fetch_offset: end.offset,
            last_fetched_epoch: end.epoch,
            high_watermark: -1,
        }),
    }
}

fn position(actions: &[Action], pred: impl Fn(&Action) -> bool) -> usize {
    actions.iter().position(pred).expect("action present")
}

/// A loss-free synchronous network of nodes, for the end-to-end scenarios.
struct Net {
    nodes: BTreeMap<NodeId, RaftNode<MemoryLog>>,
    queue: VecDeque<(NodeId, NodeId, Message)>,
    now: u64,
    /// `SnapshotInstalled` actions by node.
    installed: Vec<(NodeId, OffsetAndEpoch)>,
    /// FetchSnapshot requests delivered: (from, position).
    snapshot_requests: Vec<(NodeId, i64)>,
}

impl Net {
    fn new(voters: &[NodeId], observers: &[NodeId]) -> Self {
        Self::with_config(voters, observers, |_| {})
    }

    fn with_config(
        voters: &[NodeId],
        observers: &[NodeId],
        tweak: impl Fn(&mut QuorumConfig),
    ) -> Self {
        let mut net = Net {
            nodes: BTreeMap::new(),
            queue: VecDeque::new(),
            now: 0,
            installed: Vec::new(),
            snapshot_requests: Vec::new(),
        };
        for &id in voters.iter().chain(observers) {
            let mut cfg = config(id, voters);
            tweak(&mut cfg);
            let (node, actions) =
                RaftNode::new(cfg, MemoryLog::new(), None, Rng::new(id as u64), 0);
            net.nodes.insert(id, node);
            net.execute(id, actions);
        }
        net
    }

    fn execute(&mut self, id: NodeId, actions: Vec<Action>) {
        for a in actions {
            match a {
                Action::FlushLog { end_offset } => {
                    self.nodes.get_mut(&id).unwrap().log_mut().flush(end_offset)
                }
                Action::Send { to, message } => self.queue.push_back((id, to, message)),
                Action::SnapshotInstalled { snapshot_id } => self.installed.push((id, snapshot_id)),
                _ => {}
            }
        }
    }

    fn deliver(&mut self) {
        for _ in 0..100_000 {
            let Some((from, to, message)) = self.queue.pop_front() else {
                return;
            };
            let now = self.now;
            if let Some(node) = self.nodes.get_mut(&to) {
                if let Message::Request {
                    request: Request::FetchSnapshot(r),
                    ..
                } = &message
                {
                    self.snapshot_requests.push((from, r.position));
                }
                let actions = node.handle_message(from, message, now);
                self.execute(to, actions);
            }
        }
        panic!("messages never settled");
    }

    fn advance(&mut self, ms: u64) {
        self.now += ms;
        let ids: Vec<NodeId> = self.nodes.keys().copied().collect();
        for id in ids {
            let now = self.now;
            let actions = self.nodes.get_mut(&id).unwrap().tick(now);
            self.execute(id, actions);
        }
        self.deliver();
    }

    fn leader(&self) -> Option<NodeId> {
        self.nodes
            .iter()
            .find(|(_, n)| n.role() == Role::Leader)
            .map(|(&id, _)| id)
    }
}

#[test]
fn a_single_voter_elects_itself_and_commits_at_once() {
    let (mut node, _) = RaftNode::new(config(1, &[1]), MemoryLog::new(), None, Rng::new(1), 0);
    assert_eq!(node.role(), Role::Unattached);
    let actions = node.tick(2_000);
    assert_eq!(node.role(), Role::Leader);
    assert_eq!(node.epoch(), 1);
    assert!(actions.iter().any(
        |a| matches!(a, Action::PersistElectionState(s) if s.leader_id == Some(1) && s.epoch == 1)
    ));
    // The LeaderChange record is only written on the next call, once the election is durable.
    assert_eq!(node.log().log_end_offset(), 0);
    let actions = node.tick(2_001);
    let flush = position(&actions, |a| {
        matches!(a, Action::FlushLog { end_offset: 1 })
    });
    let commit = position(&actions, |a| matches!(a, Action::HighWatermark(1)));
    assert!(flush < commit, "{actions:?}");
    assert!(node.log().batches()[0].bytes.len() > 61);

    let (proposed, actions) = node
        .propose(&[Bytes::from("r1"), Bytes::from("r2")], 2_002)
        .unwrap();
    assert_eq!(
        (proposed.epoch, proposed.base_offset, proposed.last_offset),
        (1, 1, 2)
    );
    let flush = position(&actions, |a| {
        matches!(a, Action::FlushLog { end_offset: 3 })
    });
    let commit = position(&actions, |a| matches!(a, Action::HighWatermark(3)));
    assert!(flush < commit);
    assert_eq!(node.high_watermark(), Some(3));
}

#[test]
fn three_voters_and_an_observer_elect_a_leader_and_replicate() {
    let mut net = Net::new(&[1, 2, 3], &[101]);
    for _ in 0..100 {
        net.advance(100);
        if net.leader().is_some() {
            break;
        }
    }
    let leader = net.leader().expect("a leader within 10 s");
    let epoch = net.nodes[&leader].epoch();
    let now = net.now;
    let (proposed, actions) = net
        .nodes
        .get_mut(&leader)
        .unwrap()
        .propose(&[Bytes::from("hello")], now)
        .unwrap();
    net.execute(leader, actions);
    for _ in 0..20 {
        net.advance(50);
    }
    for (id, node) in &net.nodes {
        assert_eq!(node.epoch(), epoch, "node {id}");
        assert_eq!(node.leader_id(), Some(leader), "node {id}");
        assert!(
            node.high_watermark() > Some(proposed.last_offset),
            "node {id} hw {:?}",
            node.high_watermark()
        );
        assert_eq!(node.log().log_end_offset(), proposed.last_offset + 1);
    }
    assert_eq!(net.nodes[&101].role(), Role::Follower);
}

#[test]
fn a_vote_is_persisted_before_it_is_answered_and_granted_once_per_epoch() {
    let (mut node, _) = RaftNode::new(
        config(1, &[1, 2, 3]),
        MemoryLog::new(),
        None,
        Rng::new(1),
        0,
    );
    let actions = node.handle_message(2, vote(2, 1, OffsetAndEpoch::new(0, 0), false), 10);
    assert!(vote_response(&actions).vote_granted);
    let persist = position(&actions, |a| {
        *a == Action::PersistElectionState(ElectionState {
            epoch: 1,
            leader_id: None,
            voted_id: Some(2),
        })
    });
    let send = position(&actions, |a| matches!(a, Action::Send { .. }));
    assert!(persist < send);
    // Another candidate of the same epoch: rejected, nothing persisted.
    let actions = node.handle_message(3, vote(3, 1, OffsetAndEpoch::new(0, 0), false), 11);
    assert!(!vote_response(&actions).vote_granted);
    assert!(!actions
        .iter()
        .any(|a| matches!(a, Action::PersistElectionState(_))));
    // The same candidate again (a retry): granted again.
    let actions = node.handle_message(2, vote(2, 1, OffsetAndEpoch::new(0, 0), false), 12);
    assert!(vote_response(&actions).vote_granted);
    assert_eq!(node.voted_id(), Some(2));
}

#[test]
fn the_broken_rule_grants_a_second_vote() {
    let mut cfg = config(1, &[1, 2, 3]);
    cfg.broken_rule = Some(BrokenRule::GrantTwoVotesPerEpoch);
    let (mut node, _) = RaftNode::new(cfg, MemoryLog::new(), None, Rng::new(1), 0);
    node.handle_message(2, vote(2, 1, OffsetAndEpoch::new(0, 0), false), 10);
    let actions = node.handle_message(3, vote(3, 1, OffsetAndEpoch::new(0, 0), false), 11);
    assert!(vote_response(&actions).vote_granted);
}

#[test]
fn a_pre_vote_changes_no_state() {
    let (mut node, _) = RaftNode::new(
        config(1, &[1, 2, 3]),
        MemoryLog::new(),
        None,
        Rng::new(1),
        0,
    );
    let actions = node.handle_message(2, vote(2, 0, OffsetAndEpoch::new(0, 0), true), 10);
    assert!(vote_response(&actions).vote_granted);
    assert!(!actions
        .iter()
        .any(|a| matches!(a, Action::PersistElectionState(_))));
    assert_eq!((node.epoch(), node.voted_id()), (0, None));
    // A standard vote in the same epoch is still free.
    let actions = node.handle_message(3, vote(3, 1, OffsetAndEpoch::new(0, 0), false), 11);
    assert!(vote_response(&actions).vote_granted);
}

#[test]
fn votes_go_only_to_logs_at_least_as_up_to_date() {
    let (mut node, _) = RaftNode::new(
        config(1, &[1, 2, 3]),
        log_with(&[1, 1, 1]),
        None,
        Rng::new(1),
        0,
    );
    assert_eq!(node.epoch(), 1);
    // Same last epoch, shorter log: rejected (but the newer epoch is adopted).
    let actions = node.handle_message(2, vote(2, 2, OffsetAndEpoch::new(2, 1), false), 10);
    assert!(!vote_response(&actions).vote_granted);
    assert_eq!((node.epoch(), node.voted_id()), (2, None));
    // A higher last epoch wins even with fewer records.
    let actions = node.handle_message(3, vote(3, 3, OffsetAndEpoch::new(1, 2), false), 11);
    assert!(vote_response(&actions).vote_granted);
    // Equal logs: granted.
    let (mut node, _) = RaftNode::new(
        config(1, &[1, 2, 3]),
        log_with(&[1, 1, 1]),
        None,
        Rng::new(1),
        0,
    );
    let actions = node.handle_message(2, vote(2, 2, OffsetAndEpoch::new(3, 1), false), 10);
    assert!(vote_response(&actions).vote_granted);
}

#[test]
fn vote_requests_are_validated_as_kafka_does() {
    let (mut node, _) = RaftNode::new(
        config(1, &[1, 2, 3]),
        MemoryLog::new(),
        None,
        Rng::new(1),
        0,
    );
    node.handle_message(2, vote(2, 5, OffsetAndEpoch::new(0, 0), false), 1);
    assert_eq!(node.epoch(), 5);
    // Stale epoch.
    let r = vote_response(&node.handle_message(3, vote(3, 4, OffsetAndEpoch::new(0, 0), false), 2));
    assert_eq!((r.error, r.leader_epoch), (ErrorCode::FencedLeaderEpoch, 5));
    // A candidate that is not a voter.
    let r = vote_response(&node.handle_message(9, vote(9, 6, OffsetAndEpoch::new(0, 0), false), 3));
    assert_eq!(r.error, ErrorCode::InconsistentVoterSet);
    // A last epoch not below the candidate epoch.
    let r = vote_response(&node.handle_message(3, vote(3, 6, OffsetAndEpoch::new(0, 6), false), 4));
    assert_eq!(r.error, ErrorCode::InvalidRequest);
    // Addressed to another voter.
    let misaddressed = Message::Request {
        correlation_id: 1,
        request: Request::Vote(VoteRequest {
            cluster_id: None,
            voter_id: Some(3),
            replica_epoch: 6,
            replica_id: 2,
            last_offset_epoch: 0,
            last_offset: 0,
            pre_vote: false,
        }),
    };
    let r = vote_response(&node.handle_message(2, misaddressed, 5));
    assert_eq!(r.error, ErrorCode::InvalidVoterKey);
    // A cluster id of another cluster.
    let mut cfg = config(1, &[1, 2, 3]);
    cfg.cluster_id = Some("ours".into());
    let (mut node, _) = RaftNode::new(cfg, MemoryLog::new(), None, Rng::new(1), 0);
    let other = Message::Request {
        correlation_id: 1,
        request: Request::Vote(VoteRequest {
            cluster_id: Some("theirs".into()),
            voter_id: None,
            replica_epoch: 1,
            replica_id: 2,
            last_offset_epoch: 0,
            last_offset: 0,
            pre_vote: false,
        }),
    };
    let r = vote_response(&node.handle_message(2, other, 1));
    assert_eq!(r.error, ErrorCode::InconsistentClusterId);
    assert_eq!(node.epoch(), 0);
}

/// Node 1 with `log` wins epoch `epoch + 1` against voters 2 and 3 (who grant everything).
fn elect(log: MemoryLog, broken: Option<BrokenRule>) -> (RaftNode<MemoryLog>, u64) {
    let mut cfg = config(1, &[1, 2, 3]);
    cfg.broken_rule = broken;
    elect_with(cfg, log)
}

/// Node 1 with `cfg` and `log` wins the next epoch against voters 2 and 3.
fn elect_with(cfg: QuorumConfig, log: MemoryLog) -> (RaftNode<MemoryLog>, u64) {
    let (mut node, _) = RaftNode::new(cfg, log, None, Rng::new(9), 0);
    let mut now = 0;
    let mut actions = node.tick(now);
    for _ in 0..10 {
        now += 1_000;
        actions.extend(node.tick(now));
        if node.role() == Role::Prospective {
            break;
        }
    }
    assert_eq!(node.role(), Role::Prospective);
    for _ in 0..2 {
        let mut replies = Vec::new();
        for (to, cid, request) in requests(&actions) {
            if let Request::Vote(v) = request {
                replies.push((to, cid, v.replica_epoch));
            }
        }
        actions = Vec::new();
        for (to, cid, epoch) in replies {
            let reply = Message::Response {
                correlation_id: cid,
                response: Response::Vote(VoteResponse {
                    error: ErrorCode::None,
                    leader_id: None,
                    leader_epoch: epoch,
                    vote_granted: true,
                }),
            };
            actions.extend(node.handle_message(to, reply, now));
        }
    }
    assert_eq!(node.role(), Role::Leader);
    (node, now)
}

#[test]
fn the_leader_commits_old_records_only_with_one_of_its_own_epoch() {
    // Three records of epoch 1 that a previous leader did not commit.
    let (mut node, t) = elect(log_with(&[1, 1, 1]), None);
    assert_eq!(node.epoch(), 2);
    assert_eq!(node.log().log_end_offset(), 4); // LeaderChange at offset 3
                                                // Voter 2 holds the same epoch-1 records, not yet the LeaderChange: a majority holds
                                                // offset 3, but no record of epoch 2.
    let r = fetch_response(&node.handle_message(2, fetch(2, 2, OffsetAndEpoch::new(3, 1)), t));
    assert_eq!(r.error, ErrorCode::None);
    assert_eq!(r.high_watermark, -1);
    assert_eq!(node.high_watermark(), None);
    assert!(!r.records.is_empty());
    // Once voter 2 has the LeaderChange, everything up to it commits.
    let r = fetch_response(&node.handle_message(2, fetch(2, 2, OffsetAndEpoch::new(4, 2)), t + 1));
    assert_eq!(r.high_watermark, 4);
    assert_eq!(node.high_watermark(), Some(4));

    // With the rule broken, the old records commit without one of the new epoch.
    let (mut broken, t) = elect(
        log_with(&[1, 1, 1]),
        Some(BrokenRule::CommitOldEpochRecords),
    );
    let r = fetch_response(&broken.handle_message(2, fetch(2, 2, OffsetAndEpoch::new(3, 1)), t));
    assert_eq!(r.high_watermark, 3);
}

#[test]
fn fetches_are_validated_against_the_leader_epoch() {
    let (mut node, t) = elect(MemoryLog::new(), None);
    let epoch = node.epoch();
    let r =
        fetch_response(&node.handle_message(2, fetch(2, epoch - 1, OffsetAndEpoch::new(0, 0)), t));
    assert_eq!(r.error, ErrorCode::FencedLeaderEpoch);
    assert_eq!(
        (r.current_leader_id, r.current_leader_epoch),
        (Some(1), epoch)
    );
    let r = fetch_response(&node.handle_message(
        2,
        fetch(2, epoch + 1, OffsetAndEpoch::new(0, 0)),
        t + 1,
    ));
    assert_eq!(r.error, ErrorCode::UnknownLeaderEpoch);
    // A fetcher ahead of the leader in the leader's epoch, or with an epoch the leader never
    // wrote, is told where to truncate.
    let r = fetch_response(&node.handle_message(
        2,
        fetch(2, epoch, OffsetAndEpoch::new(9, epoch)),
        t + 2,
    ));
    assert_eq!(r.diverging_epoch, Some(OffsetAndEpoch::new(1, epoch)));
    // A non-leader answers NOT_LEADER_OR_FOLLOWER with the leader it knows.
    let (mut follower, _) = RaftNode::new(
        config(2, &[1, 2, 3]),
        MemoryLog::new(),
        Some(ElectionState {
            epoch: 4,
            leader_id: Some(1),
            voted_id: None,
        }),
        Rng::new(1),
        0,
    );
    let r =
        fetch_response(&follower.handle_message(101, fetch(101, 4, OffsetAndEpoch::new(0, 0)), 1));
    assert_eq!(r.error, ErrorCode::NotLeaderOrFollower);
    assert_eq!((r.current_leader_id, r.current_leader_epoch), (Some(1), 4));
}

#[test]
fn a_follower_truncates_to_the_diverging_epoch() {
    // Epoch 1 at [0, 3), then two records of epoch 2 the new leader (epoch 3) never had.
    let log = log_with(&[1, 1, 1, 2, 2]);
    let (mut node, actions) = RaftNode::new(
        config(2, &[1, 2, 3]),
        log,
        Some(ElectionState {
            epoch: 3,
            leader_id: Some(1),
            voted_id: None,
        }),
        Rng::new(1),
        0,
    );
    assert_eq!(node.role(), Role::Follower);
    let (to, cid, request) = requests(&actions).remove(0);
    assert_eq!(to, 1);
    let Request::Fetch(f) = request else {
        panic!("expected a fetch")
    };
    assert_eq!(
        (f.fetch_offset, f.last_fetched_epoch, f.current_leader_epoch),
        (5, 2, 3)
    );
    let response = Message::Response {
        correlation_id: cid,
        response: Response::Fetch(FetchResponse {
            error: ErrorCode::None,
            high_watermark: 3,
            log_start_offset: 0,
            diverging_epoch: Some(OffsetAndEpoch::new(3, 1)),
            snapshot_id: None,
            current_leader_id: Some(1),
            current_leader_epoch: 3,
            records: Bytes::new(),
        }),
    };
    let actions = node.handle_message(1, response.clone(), 10);
    assert_eq!(node.log().end_offset(), OffsetAndEpoch::new(3, 1));
    // The next fetch starts from the truncated end.
    let (_, _, request) = requests(&actions).remove(0);
    let Request::Fetch(f) = request else {
        panic!("expected a fetch")
    };
    assert_eq!((f.fetch_offset, f.last_fetched_epoch), (3, 1));
    // The same response again (a duplicate) is ignored: its correlation id is spent.
    node.handle_message(1, response, 11);
    assert_eq!(node.log().log_end_offset(), 3);
    assert_eq!(node.anomalies(), 0);
}

#[test]
fn a_restarted_leader_comes_back_resigned_and_never_leads_that_epoch_again() {
    let stored = ElectionState {
        epoch: 7,
        leader_id: Some(1),
        voted_id: Some(1),
    };
    let (mut node, actions) = RaftNode::new(
        config(1, &[1, 2, 3]),
        log_with(&[7]),
        Some(stored),
        Rng::new(1),
        0,
    );
    assert_eq!((node.role(), node.epoch()), (Role::Resigned, 7));
    // It tells the other voters with EndQuorumEpoch.
    let ends = requests(&actions)
        .into_iter()
        .filter(|(_, _, r)| matches!(r, Request::EndQuorumEpoch(_)))
        .count();
    assert_eq!(ends, 2);
    // It grants no vote in its own epoch.
    let r = vote_response(&node.handle_message(2, vote(2, 7, OffsetAndEpoch::new(5, 7), true), 1));
    assert!(!r.vote_granted);
    // After its election timeout it moves on to a new epoch without leading.
    node.tick(5_000);
    assert!(node.epoch() > 7);
    assert_ne!(node.role(), Role::Leader);
}

#[test]
fn a_leader_without_a_fetching_majority_resigns_and_ends_its_epoch() {
    let (mut node, t) = elect(MemoryLog::new(), None);
    let epoch = node.epoch();
    // Voter 3 keeps fetching; that alone is a majority with the leader.
    node.tick(t + 1);
    node.handle_message(3, fetch(3, epoch, OffsetAndEpoch::new(1, epoch)), t + 2_000);
    node.tick(t + 3_500);
    assert_eq!(node.role(), Role::Leader);
    // Then nobody fetches for 1.5 x the fetch timeout.
    let actions = node.tick(t + 2_000 + 3_000);
    assert_eq!(node.role(), Role::Resigned);
    assert_eq!(node.epoch(), epoch);
    let ends: Vec<_> = requests(&actions)
        .into_iter()
        .filter_map(|(to, _, r)| match r {
            Request::EndQuorumEpoch(e) => Some((to, e.preferred_successors)),
            _ => None,
        })
        .collect();
    // Voter 3, which fetched furthest, comes first among the preferred successors.
    assert_eq!(ends, vec![(2, vec![3, 2]), (3, vec![3, 2])]);
}

fn follower_of_1(id: NodeId, epoch: i32) -> (RaftNode<MemoryLog>, Vec<Action>) {
    RaftNode::new(
        config(id, &[1, 2, 3]),
        MemoryLog::new(),
        Some(ElectionState {
            epoch,
            leader_id: Some(1),
            voted_id: None,
        }),
        Rng::new(id as u64),
        0,
    )
}

fn end_epoch(leader: NodeId, epoch: i32, preferred: Vec<NodeId>) -> Message {
    Message::Request {
        correlation_id: 3,
        request: Request::EndQuorumEpoch(gregor_raft::message::EndQuorumEpochRequest {
            cluster_id: None,
            leader_id: leader,
            leader_epoch: epoch,
            preferred_successors: preferred,
        }),
    }
}

#[test]
fn end_quorum_epoch_hurries_the_preferred_successor() {
    // First in the list: no wait at all.
    let (mut first, _) = follower_of_1(2, 4);
    first.handle_message(1, end_epoch(1, 4, vec![2, 3]), 10);
    first.tick(10);
    assert_eq!(first.role(), Role::Prospective);
    assert_eq!(first.epoch(), 4);
    // Second of two: waits election.backoff.max.ms >> 1 = 500 ms.
    let (mut second, _) = follower_of_1(3, 4);
    second.handle_message(1, end_epoch(1, 4, vec![2, 3]), 10);
    second.tick(400);
    assert_eq!(second.role(), Role::Follower);
    second.tick(510);
    assert_eq!(second.role(), Role::Prospective);
}

#[test]
fn a_prospective_that_loses_goes_back_to_its_leader_without_persisting() {
    let (mut node, _) = follower_of_1(2, 4);
    let actions = node.tick(2_000);
    assert_eq!(node.role(), Role::Prospective);
    assert!(!actions
        .iter()
        .any(|a| matches!(a, Action::PersistElectionState(_))));
    let mut outcome = Vec::new();
    for (to, cid, request) in requests(&actions) {
        let Request::Vote(v) = request else { continue };
        assert!(v.pre_vote);
        assert_eq!(v.replica_epoch, 4);
        let reply = Message::Response {
            correlation_id: cid,
            response: Response::Vote(VoteResponse {
                error: ErrorCode::None,
                leader_id: Some(1),
                leader_epoch: 4,
                vote_granted: false,
            }),
        };
        outcome.extend(node.handle_message(to, reply, 2_001));
    }
    assert_eq!(
        (node.role(), node.epoch(), node.leader_id()),
        (Role::Follower, 4, Some(1))
    );
    assert!(!outcome
        .iter()
        .any(|a| matches!(a, Action::PersistElectionState(_))));
}

#[test]
fn observers_never_count_towards_the_high_watermark() {
    let (mut node, t) = elect(MemoryLog::new(), None);
    let epoch = node.epoch();
    node.tick(t + 1); // LeaderChange at offset 0
    let r = fetch_response(&node.handle_message(
        101,
        fetch(101, epoch, OffsetAndEpoch::new(1, epoch)),
        t + 2,
    ));
    assert_eq!(r.error, ErrorCode::None);
    assert_eq!(node.high_watermark(), None);
    let r = fetch_response(&node.handle_message(
        2,
        fetch(2, epoch, OffsetAndEpoch::new(1, epoch)),
        t + 3,
    ));
    assert_eq!(r.high_watermark, 1);
}

#[test]
fn fetches_wait_at_the_leader_until_new_data_or_a_newer_high_watermark() {
    let (mut node, t) = elect(MemoryLog::new(), None);
    let epoch = node.epoch();
    node.tick(t + 1);
    fetch_response(&node.handle_message(2, fetch(2, epoch, OffsetAndEpoch::new(1, epoch)), t + 2));
    assert_eq!(node.high_watermark(), Some(1));
    let long_poll = |offset: i64, hw: i64| Message::Request {
        correlation_id: 21,
        request: Request::Fetch(FetchRequest {
            cluster_id: None,
            replica_id: 3,
            max_wait_ms: 500,
            current_leader_epoch: epoch,
            fetch_offset: offset,
            last_fetched_epoch: epoch,
            high_watermark: hw,
        }),
    };
    // A fetcher behind on the high watermark is answered at once (KIP-1166).
    let r = fetch_response(&node.handle_message(3, long_poll(1, 0), t + 3));
    assert_eq!((r.high_watermark, r.records.len()), (1, 0));
    // One that is up to date waits...
    let actions = node.handle_message(3, long_poll(1, 1), t + 4);
    assert!(responses(&actions).is_empty());
    // ...until there is something new.
    let (_, actions) = node.propose(&[Bytes::from("x")], t + 5).unwrap();
    let r = fetch_response(&actions);
    assert!(!r.records.is_empty());
    // Or until its deadline, answered empty.
    node.handle_message(3, fetch(3, epoch, OffsetAndEpoch::new(2, epoch)), t + 6);
    assert_eq!(node.high_watermark(), Some(2));
    let actions = node.handle_message(3, long_poll(2, 2), t + 7);
    assert!(responses(&actions).is_empty());
    assert!(responses(&node.tick(t + 7 + 499)).is_empty());
    let r = fetch_response(&node.tick(t + 7 + 500));
    assert_eq!(
        (r.error, r.records.len(), r.high_watermark),
        (ErrorCode::None, 0, 2)
    );
}

#[test]
fn a_resigning_leader_names_its_most_caught_up_voter_first() {
    let (mut node, t) = elect(MemoryLog::new(), None);
    let epoch = node.epoch();
    node.tick(t + 1);
    node.handle_message(2, fetch(2, epoch, OffsetAndEpoch::new(1, epoch)), t + 2);
    let actions = node.resign(t + 3);
    assert_eq!((node.role(), node.epoch()), (Role::Resigned, epoch));
    let successors: Vec<_> = requests(&actions)
        .into_iter()
        .filter_map(|(_, _, r)| match r {
            Request::EndQuorumEpoch(e) => Some(e.preferred_successors),
            _ => None,
        })
        .collect();
    assert_eq!(successors, vec![vec![2, 3], vec![2, 3]]);
    // No election state changes: Resigned is not persisted.
    assert!(!actions
        .iter()
        .any(|a| matches!(a, Action::PersistElectionState(_))));
}

#[test]
fn a_voter_without_pre_vote_support_counts_as_a_pre_vote_grant() {
    let (mut node, _) = RaftNode::new(
        config(1, &[1, 2, 3]),
        MemoryLog::new(),
        None,
        Rng::new(1),
        0,
    );
    let actions = node.tick(2_000);
    assert_eq!(node.role(), Role::Prospective);
    let (to, cid, _) = requests(&actions)
        .into_iter()
        .find(|(_, _, r)| matches!(r, Request::Vote(v) if v.pre_vote))
        .unwrap();
    // What a transport answers for a voter that only knows Vote v0-1.
    let unsupported = Message::Response {
        correlation_id: cid,
        response: Response::Vote(VoteResponse {
            error: ErrorCode::UnsupportedVersion,
            leader_id: None,
            leader_epoch: -1,
            vote_granted: false,
        }),
    };
    let actions = node.handle_message(to, unsupported, 2_001);
    assert_eq!((node.role(), node.epoch()), (Role::Candidate, 1));
    assert!(requests(&actions)
        .iter()
        .any(|(_, _, r)| matches!(r, Request::Vote(v) if !v.pre_vote && v.replica_epoch == 1)));
}

#[test]
fn the_leader_describes_the_quorum() {
    let (mut node, t) = elect(MemoryLog::new(), None);
    let epoch = node.epoch();
    node.tick(t + 1);
    node.handle_message(2, fetch(2, epoch, OffsetAndEpoch::new(1, epoch)), t + 2);
    node.handle_message(101, fetch(101, epoch, OffsetAndEpoch::new(0, 0)), t + 3);
    let d = node.describe_quorum(t + 4).unwrap();
    assert_eq!(
        (d.leader_id, d.leader_epoch, d.high_watermark),
        (1, epoch, 1)
    );
    let voters: Vec<_> = d
        .voters
        .iter()
        .map(|r| {
            (
                r.replica_id,
                r.log_end_offset,
                r.last_fetch_ms,
                r.last_caught_up_ms,
            )
        })
        .collect();
    assert_eq!(
        voters,
        vec![
            (1, 1, Some(t + 4), Some(t + 4)),
            (2, 1, Some(t + 2), Some(t + 2)),
            (3, -1, None, None)
        ]
    );
    assert_eq!(d.observers.len(), 1);
    assert_eq!(
        (d.observers[0].replica_id, d.observers[0].log_end_offset),
        (101, 0)
    );
    let (follower, _) = follower_of_1(2, 4);
    assert!(follower.describe_quorum(0).is_none());
}

// ----- KIP-630: snapshots -----

fn fetch_snapshot(from: NodeId, epoch: i32, id: OffsetAndEpoch, position: i64) -> Message {
    Message::Request {
        correlation_id: 9,
        request: Request::FetchSnapshot(FetchSnapshotRequest {
            cluster_id: None,
            replica_id: from,
            max_bytes: 100,
            current_leader_epoch: epoch,
            snapshot_id: id,
            position,
        }),
    }
}

fn fetch_snapshot_response(actions: &[Action]) -> FetchSnapshotResponse {
    match responses(actions).as_slice() {
        [Response::FetchSnapshot(f)] => f.clone(),
        other => panic!("expected one FetchSnapshot response, got {other:?}"),
    }
}

/// Leader 1 of epoch 2 over five records of epoch 1 and its LeaderChange (offset 5), all
/// committed, with a snapshot at 6 (epoch 2) and the log before it deleted.
fn leader_with_snapshot() -> (RaftNode<MemoryLog>, u64, OffsetAndEpoch) {
    let (mut node, t) = elect(log_with(&[1, 1, 1, 1, 1]), None);
    let r = fetch_response(&node.handle_message(2, fetch(2, 2, OffsetAndEpoch::new(6, 2)), t));
    assert_eq!(r.high_watermark, 6);
    let id = OffsetAndEpoch::new(6, 2);
    let values: Vec<Bytes> = (0..40).map(|i| Bytes::from(format!("image-{i}"))).collect();
    node.log_mut().write_snapshot(id, &values, 0).unwrap();
    assert!(node.log_mut().delete_before(id, 0).unwrap());
    (node, t, id)
}

#[test]
fn a_fetch_below_the_log_start_is_answered_with_the_snapshot_id() {
    let (mut node, t, id) = leader_with_snapshot();
    // Below the log start: the latest snapshot, at once (a long-poll fetch is not parked).
    let mut below = fetch(3, 2, OffsetAndEpoch::new(2, 1));
    if let Message::Request {
        request: Request::Fetch(f),
        ..
    } = &mut below
    {
        f.max_wait_ms = 500;
    }
    let r = fetch_response(&node.handle_message(3, below, t));
    assert_eq!(r.error, ErrorCode::None);
    assert_eq!(r.snapshot_id, Some(id));
    assert_eq!(r.diverging_epoch, None);
    assert!(r.records.is_empty());
    assert_eq!(r.log_start_offset, 6);
    // An empty fetcher too.
    let r = fetch_response(&node.handle_message(3, fetch(3, 2, OffsetAndEpoch::new(0, 0)), t));
    assert_eq!(r.snapshot_id, Some(id));
    // At the log start with another epoch than the snapshot's.
    let r = fetch_response(&node.handle_message(3, fetch(3, 2, OffsetAndEpoch::new(6, 1)), t));
    assert_eq!(r.snapshot_id, Some(id));
    // At the log start with the snapshot's epoch: records, no snapshot.
    let r = fetch_response(&node.handle_message(3, fetch(3, 2, OffsetAndEpoch::new(6, 2)), t));
    assert_eq!((r.snapshot_id, r.diverging_epoch), (None, None));
    // A fetch that does not need the snapshot still diverges as before.
    let mut log = log_with(&[1, 1, 1, 1, 1]);
    log.update_high_watermark(0);
    let (mut plain, t) = elect(log, None);
    let r = fetch_response(&plain.handle_message(2, fetch(2, 2, OffsetAndEpoch::new(7, 1)), t));
    assert_eq!(r.snapshot_id, None);
    assert_eq!(r.diverging_epoch, Some(OffsetAndEpoch::new(5, 1)));
}

#[test]
fn fetch_snapshot_serves_chunks_and_checks_id_position_and_epoch() {
    let (mut node, t, id) = leader_with_snapshot();
    let size = node.log().snapshot_size(id).unwrap();
    assert!(size > 300, "the snapshot spans several chunks: {size}");
    let mut whole = Vec::new();
    while (whole.len() as u64) < size {
        let r = fetch_snapshot_response(&node.handle_message(
            3,
            fetch_snapshot(3, 2, id, whole.len() as i64),
            t,
        ));
        assert_eq!(r.error, ErrorCode::None);
        assert_eq!(r.snapshot_id, id);
        assert_eq!(r.size, size as i64);
        assert_eq!(r.position, whole.len() as i64);
        assert!(!r.unaligned_records.is_empty() && r.unaligned_records.len() <= 100);
        assert_eq!((r.current_leader_id, r.current_leader_epoch), (Some(1), 2));
        whole.extend_from_slice(&r.unaligned_records);
    }
    assert_eq!(
        Bytes::from(whole),
        node.log().read_snapshot_chunk(id, 0, usize::MAX).unwrap()
    );
    let error = |node: &mut RaftNode<MemoryLog>, m: Message| {
        fetch_snapshot_response(&node.handle_message(3, m, t)).error
    };
    assert_eq!(
        error(&mut node, fetch_snapshot(3, 2, id, size as i64)),
        ErrorCode::PositionOutOfRange
    );
    assert_eq!(
        error(&mut node, fetch_snapshot(3, 2, id, -1)),
        ErrorCode::PositionOutOfRange
    );
    assert_eq!(
        error(
            &mut node,
            fetch_snapshot(3, 2, OffsetAndEpoch::new(5, 2), 0)
        ),
        ErrorCode::SnapshotNotFound
    );
    assert_eq!(
        error(&mut node, fetch_snapshot(3, 1, id, 0)),
        ErrorCode::FencedLeaderEpoch
    );
    assert_eq!(
        error(&mut node, fetch_snapshot(3, 3, id, 0)),
        ErrorCode::UnknownLeaderEpoch
    );
    // Only the leader serves snapshots.
    let (mut follower, _) = follower_of_1(2, 2);
    assert_eq!(
        error(&mut follower, fetch_snapshot(3, 2, id, 0)),
        ErrorCode::NotLeaderOrFollower
    );
}

/// The bytes of a snapshot `id` (what a leader would serve) and a follower 2 of leader 1 in
/// epoch 4 that was told by a Fetch response to fetch it; returns its FetchSnapshot request.
fn follower_told_to_fetch(
    id: OffsetAndEpoch,
) -> (RaftNode<MemoryLog>, Bytes, i32, FetchSnapshotRequest) {
    follower_told_to_fetch_with(id, 2_000)
}

fn follower_told_to_fetch_with(
    id: OffsetAndEpoch,
    request_timeout_ms: u64,
) -> (RaftNode<MemoryLog>, Bytes, i32, FetchSnapshotRequest) {
    let values: Vec<Bytes> = (0..30).map(|i| Bytes::from(format!("state-{i}"))).collect();
    let bytes = gregor_raft::snapshot::encode_snapshot(id, 0, &values, 0).unwrap();
    let mut cfg = config(2, &[1, 2, 3]);
    cfg.max_fetch_snapshot_bytes = 100;
    cfg.request_timeout_ms = request_timeout_ms;
    let (mut node, actions) = RaftNode::new(
        cfg,
        log_with(&[1, 1]),
        Some(ElectionState {
            epoch: 4,
            leader_id: Some(1),
            voted_id: None,
        }),
        Rng::new(2),
        0,
    );
    let (to, cid, request) = requests(&actions).remove(0);
    assert!(matches!((to, request), (1, Request::Fetch(_))));
    let response = Message::Response {
        correlation_id: cid,
        response: Response::Fetch(FetchResponse {
            error: ErrorCode::None,
            high_watermark: id.offset + 2,
            log_start_offset: id.offset,
            diverging_epoch: None,
            snapshot_id: Some(id),
            current_leader_id: Some(1),
            current_leader_epoch: 4,
            records: Bytes::new(),
        }),
    };
    let actions = node.handle_message(1, response, 5);
    // Nothing installed yet, no high watermark from a snapshot answer.
    assert!(!actions.iter().any(|a| matches!(
        a,
        Action::SnapshotInstalled { .. } | Action::HighWatermark(_)
    )));
    match requests(&actions).as_slice() {
        [(1, cid, Request::FetchSnapshot(r))] => (node, bytes, *cid, r.clone()),
        other => panic!("expected a FetchSnapshot, got {other:?}"),
    }
}

fn chunk_response(
    cid: i32,
    id: OffsetAndEpoch,
    bytes: &Bytes,
    position: i64,
    max: usize,
) -> Message {
    let start = position as usize;
    let end = (start + max).min(bytes.len());
    Message::Response {
        correlation_id: cid,
        response: Response::FetchSnapshot(FetchSnapshotResponse {
            error: ErrorCode::None,
            snapshot_id: id,
            current_leader_id: Some(1),
            current_leader_epoch: 4,
            size: bytes.len() as i64,
            position,
            unaligned_records: bytes.slice(start..end),
        }),
    }
}

#[test]
fn a_follower_fetches_a_snapshot_in_chunks_and_installs_it() {
    let id = OffsetAndEpoch::new(10, 3);
    let (mut node, bytes, mut cid, mut request) = follower_told_to_fetch(id);
    let mut chunks = 0;
    let mut now = 10;
    let installed = loop {
        assert_eq!(request.snapshot_id, id);
        assert_eq!(request.max_bytes, 100);
        assert_eq!(request.current_leader_epoch, 4);
        let m = chunk_response(cid, id, &bytes, request.position, 100);
        chunks += 1;
        now += 1;
        let actions = node.handle_message(1, m, now);
        if let Some(i) = actions
            .iter()
            .position(|a| matches!(a, Action::SnapshotInstalled { .. }))
        {
            assert_eq!(actions[i], Action::SnapshotInstalled { snapshot_id: id });
            let hw = position(&actions, |a| matches!(a, Action::HighWatermark(10)));
            assert!(i < hw, "{actions:?}");
            break actions;
        }
        match requests(&actions).as_slice() {
            [(1, c, Request::FetchSnapshot(r))] => {
                assert_eq!(r.position, request.position + 100);
                cid = *c;
                request = r.clone();
            }
            other => panic!("expected the next FetchSnapshot, got {other:?}"),
        }
    };
    assert_eq!(chunks, bytes.len().div_ceil(100));
    assert_eq!(node.log().log_start_offset(), 10);
    assert_eq!(node.log().end_offset(), OffsetAndEpoch::new(10, 3));
    assert_eq!(node.high_watermark(), Some(10));
    assert_eq!(node.log().latest_snapshot_id(), Some(id));
    // Fetching resumes from the snapshot's end.
    let next = node.tick(now + 1);
    let all: Vec<_> = requests(&installed)
        .into_iter()
        .chain(requests(&next))
        .collect();
    match all.as_slice() {
        [(1, _, Request::Fetch(f))] => {
            assert_eq!((f.fetch_offset, f.last_fetched_epoch), (10, 3));
        }
        other => panic!("expected a Fetch from 10, got {other:?}"),
    }
    assert_eq!(node.anomalies(), 0);
}

#[test]
fn a_snapshot_the_leader_no_longer_has_or_a_bad_chunk_starts_over() {
    let id = OffsetAndEpoch::new(10, 3);
    // SNAPSHOT_NOT_FOUND after one chunk: the partial snapshot goes, the next request is a
    // Fetch (which will name the leader's newer snapshot).
    let (mut node, bytes, cid, request) = follower_told_to_fetch(id);
    let actions = node.handle_message(
        1,
        chunk_response(cid, id, &bytes, request.position, 100),
        10,
    );
    let (_, cid, _) = requests(&actions).remove(0);
    assert_eq!(node.log().fetched_snapshot(), Some((id, 100)));
    let not_found = Message::Response {
        correlation_id: cid,
        response: Response::FetchSnapshot(FetchSnapshotResponse {
            error: ErrorCode::SnapshotNotFound,
            snapshot_id: OffsetAndEpoch::new(-1, -1),
            current_leader_id: Some(1),
            current_leader_epoch: 4,
            size: -1,
            position: -1,
            unaligned_records: Bytes::new(),
        }),
    };
    let actions = node.handle_message(1, not_found, 11);
    assert_eq!(node.log().fetched_snapshot(), None);
    assert!(matches!(
        requests(&actions).as_slice(),
        [(1, _, Request::Fetch(_))]
    ));
    // A chunk at the wrong position: abandoned too, retried after the backoff with a Fetch.
    let (mut node, bytes, cid, _) = follower_told_to_fetch(id);
    let actions = node.handle_message(1, chunk_response(cid, id, &bytes, 100, 100), 10);
    assert_eq!(node.log().fetched_snapshot(), None);
    // The leader is backed off (a Fetch may go to another voter to learn the leader).
    assert!(requests(&actions)
        .iter()
        .all(|(to, _, r)| *to != 1 && matches!(r, Request::Fetch(_))));
    // Voter 3 answers that 1 leads; after the backoff the follower fetches from 1 again.
    let mut later = Vec::new();
    for (to, cid, _) in requests(&actions) {
        let reply = Message::Response {
            correlation_id: cid,
            response: Response::Fetch(FetchResponse {
                error: ErrorCode::NotLeaderOrFollower,
                high_watermark: -1,
                log_start_offset: 0,
                diverging_epoch: None,
                snapshot_id: None,
                current_leader_id: Some(1),
                current_leader_epoch: 4,
                records: Bytes::new(),
            }),
        };
        later.extend(requests(&node.handle_message(to, reply, 11)));
    }
    let to_leader = later
        .into_iter()
        .chain((12..200).step_by(5).flat_map(|t| requests(&node.tick(t))))
        .find(|(to, _, _)| *to == 1);
    assert!(
        matches!(to_leader, Some((1, _, Request::Fetch(_)))),
        "{to_leader:?}"
    );
    // A request that times out is sent again from the same position.
    // (request timeout 300 ms, within the fetch timeout of 2 s).
    let (mut node, _, _, request) = follower_told_to_fetch_with(id, 300);
    let again = (10..1_000)
        .step_by(10)
        .flat_map(|t| requests(&node.tick(t)))
        .find(|(to, _, _)| *to == 1);
    match again {
        Some((1, _, Request::FetchSnapshot(r))) => assert_eq!(r.position, request.position),
        other => panic!("expected the FetchSnapshot again, got {other:?}"),
    }
    assert_eq!(node.role(), Role::Follower);
    assert_eq!(node.anomalies(), 0);
}

#[test]
fn an_epoch_change_abandons_a_partial_snapshot() {
    let id = OffsetAndEpoch::new(10, 3);
    let (mut node, bytes, cid, request) = follower_told_to_fetch(id);
    let actions = node.handle_message(
        1,
        chunk_response(cid, id, &bytes, request.position, 100),
        10,
    );
    let (_, late_cid, _) = requests(&actions).remove(0);
    assert_eq!(node.log().fetched_snapshot(), Some((id, 100)));
    // Voter 3 leads epoch 5.
    let begin = Message::Request {
        correlation_id: 4,
        request: Request::BeginQuorumEpoch(BeginQuorumEpochRequest {
            cluster_id: None,
            voter_id: Some(2),
            leader_id: 3,
            leader_epoch: 5,
        }),
    };
    let actions = node.handle_message(3, begin, 11);
    assert_eq!((node.epoch(), node.leader_id()), (5, Some(3)));
    assert_eq!(node.log().fetched_snapshot(), None);
    match requests(&actions).as_slice() {
        [(3, _, Request::Fetch(f))] => assert_eq!(f.fetch_offset, 2),
        other => panic!("expected a Fetch to the new leader, got {other:?}"),
    }
    // A late chunk of the old transfer is ignored.
    let actions = node.handle_message(1, chunk_response(late_cid, id, &bytes, 100, 100), 12);
    assert!(!actions
        .iter()
        .any(|a| matches!(a, Action::SnapshotInstalled { .. })));
    assert_eq!(node.log().fetched_snapshot(), None);
    assert_eq!(node.log().log_end_offset(), 2);
}

#[test]
fn a_lagging_voter_and_an_observer_come_back_through_the_leaders_snapshot() {
    let mut net = Net::with_config(&[1, 2, 3], &[101], |c| c.max_fetch_snapshot_bytes = 200);
    for _ in 0..100 {
        net.advance(100);
        if net.leader().is_some() {
            break;
        }
    }
    let leader = net.leader().expect("a leader");
    let lagging = [1, 2, 3].into_iter().find(|&v| v != leader).unwrap();
    // The lagging voter and the observer are cut off while the leader commits and snapshots.
    let cut: Vec<_> = [lagging, 101]
        .into_iter()
        .map(|id| (id, net.nodes.remove(&id).unwrap()))
        .collect();
    for i in 0..30 {
        let now = net.now;
        let (_, actions) = net
            .nodes
            .get_mut(&leader)
            .unwrap()
            .propose(&[Bytes::from(format!("record-{i}"))], now)
            .unwrap();
        net.execute(leader, actions);
        net.advance(20);
    }
    let node = net.nodes.get_mut(&leader).unwrap();
    let hw = node.high_watermark().unwrap();
    let epoch = node.log().end_offset_for_epoch(node.epoch()).epoch;
    let id = OffsetAndEpoch::new(hw, epoch);
    let values: Vec<Bytes> = (0..hw).map(|i| Bytes::from(format!("state-{i}"))).collect();
    node.log_mut().write_snapshot(id, &values, 0).unwrap();
    assert!(node.log_mut().delete_before(id, 0).unwrap());
    let size = node.log().snapshot_size(id).unwrap();
    let leader_leo = node.log().log_end_offset();
    for (id, n) in cut {
        net.nodes.insert(id, n);
    }
    for _ in 0..100 {
        net.advance(50);
    }
    let mut installed = net.installed.clone();
    installed.sort();
    let mut expected = vec![(lagging, id), (101, id)];
    expected.sort();
    assert_eq!(installed, expected);
    for who in [lagging, 101] {
        let n = &net.nodes[&who];
        assert_eq!(n.log().log_start_offset(), hw, "node {who}");
        assert_eq!(n.log().log_end_offset(), leader_leo, "node {who}");
        assert!(n.high_watermark() >= Some(hw), "node {who}");
        assert_eq!(
            n.log().read(hw, 1 << 20).unwrap(),
            net.nodes[&leader].log().read(hw, 1 << 20).unwrap()
        );
        let chunks = net
            .snapshot_requests
            .iter()
            .filter(|(from, _)| *from == who)
            .count() as u64;
        assert!(chunks >= size.div_ceil(200), "node {who}: {chunks} chunks");
    }
    for (id, n) in &net.nodes {
        assert_eq!(n.anomalies(), 0, "node {id}");
    }
}
