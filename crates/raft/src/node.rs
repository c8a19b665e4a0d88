//! [`RaftNode`]: one node of the quorum as a sans-I/O state machine, with the semantics of
//! Kafka's `KafkaRaftClient` and `QuorumState` (KIP-595, KIP-996 pre-vote).
//!
//! The node is driven by three calls, each given the time in ms of a monotonic clock:
//! [`RaftNode::handle_message`], [`RaftNode::tick`] and [`RaftNode::propose`]. Each returns the
//! [`Action`]s the driver must execute in order. Two of them are barriers,
//! [`Action::PersistElectionState`] and [`Action::FlushLog`]: the driver completes them
//! durably before executing anything after them (Kafka writes `quorum-state` before answering
//! a Vote, and a voter flushes its log before its next Fetch reports the new end offset).
//!
//! States (`QuorumState`'s transitions):
//! - Unattached: knows an epoch but no leader; may have voted in it. A voter goes Prospective
//!   when its election timeout expires.
//! - Prospective (KIP-996): asks for pre-votes without bumping the epoch or changing anyone's
//!   state; with a majority it becomes Candidate, otherwise it goes back to Unattached (or
//!   Follower, if it knew a leader).
//! - Candidate: bumped the epoch, voted for itself, asks for votes; a majority makes it Leader;
//!   a rejection or timeout sends it back to Prospective after a random backoff.
//! - Leader: appends a `LeaderChange` control record at the start of its epoch, serves Fetch,
//!   advances the high watermark, resigns when a majority has not fetched within 1.5 x
//!   `controller.quorum.fetch.timeout.ms` (check quorum).
//! - Follower: fetches from the leader; a voter goes Prospective when the leader is silent for
//!   `controller.quorum.fetch.timeout.ms`. When the leader answers a Fetch with `SnapshotId`
//!   (KIP-630: the follower is behind the leader's log start) it fetches that snapshot in
//!   FetchSnapshot chunks, then replaces its log with it ([`Action::SnapshotInstalled`]).
//! - Resigned: a leader that gave up its epoch (or restarted as leader), telling the voters
//!   with EndQuorumEpoch; it never leads that epoch again.
//!
//! Observers (nodes outside the voter set, e.g. brokers) are only Unattached or Follower.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use gregor_protocol::error::ErrorCode;

use crate::batches::{build_data_batch, build_leader_change_batch};
use crate::config::{BrokenRule, QuorumConfig, OBSERVER_SESSION_TIMEOUT_MS, RETRY_BACKOFF_BASE_MS};
use crate::log::{RaftLog, RaftLogError};
use crate::message::{
    BeginQuorumEpochRequest, BeginQuorumEpochResponse, EndQuorumEpochRequest,
    EndQuorumEpochResponse, FetchRequest, FetchResponse, FetchSnapshotRequest,
    FetchSnapshotResponse, Message, Request, Response, VoteRequest, VoteResponse,
};
use crate::rng::Rng;
use crate::types::{ElectionState, NodeId, OffsetAndEpoch};

/// What the driver must do, in order. See the module docs for the two barriers.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Write this election state durably (Kafka's `quorum-state` file) before executing the
    /// actions after it. A write that does not complete must be treated as not made.
    PersistElectionState(ElectionState),
    /// Make the log durable up to `end_offset`, and every truncation made before it (fsync),
    /// before executing the actions after it.
    FlushLog {
        /// Offset below which everything must be durable.
        end_offset: i64,
    },
    /// Send a message.
    Send {
        /// Destination node.
        to: NodeId,
        /// The message.
        message: Message,
    },
    /// The high watermark rose: records below this offset are committed and may be applied
    /// (published to the metadata loader). Never decreases within a node's lifetime.
    HighWatermark(i64),
    /// A snapshot fetched from the leader (KIP-630 FetchSnapshot) is complete and the log now
    /// starts at its end offset (Kafka's `onSnapshotFetchComplete` / `truncateToLatestSnapshot`):
    /// the state machine reloads its state from this snapshot ([`RaftLog::read_snapshot`]) and
    /// applies committed records from `snapshot_id.offset` on. A [`Action::HighWatermark`] of
    /// at least that offset follows. Durable when emitted.
    SnapshotInstalled {
        /// End offset and epoch of the installed snapshot.
        snapshot_id: OffsetAndEpoch,
    },
    /// The known leader or the epoch changed (`LeaderAndEpoch`).
    LeaderChange {
        /// The new epoch.
        epoch: i32,
        /// The leader of that epoch, if known.
        leader_id: Option<NodeId>,
    },
}

impl Action {
    /// True for the actions a driver must complete durably before the ones after them.
    pub fn is_barrier(&self) -> bool {
        matches!(
            self,
            Action::PersistElectionState(_) | Action::FlushLog { .. }
        )
    }
}

/// The state a node is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Knows an epoch, not its leader.
    Unattached,
    /// Collecting pre-votes (KIP-996).
    Prospective,
    /// Collecting votes in a bumped epoch.
    Candidate,
    /// Leads the epoch.
    Leader,
    /// Fetches from the leader.
    Follower,
    /// A former leader of the epoch.
    Resigned,
}

/// Where a proposal landed in the log. It is committed once the high watermark passes
/// `last_offset` while the log still holds this batch (same offsets, same epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proposed {
    /// The leader epoch of the batch.
    pub epoch: i32,
    /// Offset of its first record.
    pub base_offset: i64,
    /// Offset of its last record.
    pub last_offset: i64,
}

/// One replica in [`QuorumDescription`] (DescribeQuorum's `ReplicaState`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaDescription {
    /// `ReplicaId`.
    pub replica_id: NodeId,
    /// `LogEndOffset`: its last fetch offset, -1 before its first fetch in this epoch.
    pub log_end_offset: i64,
    /// `LastFetchTimestamp` (ms of the driver's clock), if it fetched in this epoch.
    pub last_fetch_ms: Option<u64>,
    /// `LastCaughtUpTimestamp`: its last fetch that reached the leader's log end (ms).
    pub last_caught_up_ms: Option<u64>,
}

/// The leader's view of the quorum (DescribeQuorum's partition data).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuorumDescription {
    /// `LeaderId`: this node.
    pub leader_id: NodeId,
    /// `LeaderEpoch`.
    pub leader_epoch: i32,
    /// `HighWatermark`, -1 until a record of this epoch is committed.
    pub high_watermark: i64,
    /// `CurrentVoters`, the leader included.
    pub voters: Vec<ReplicaDescription>,
    /// `Observers` that fetched within the observer session timeout (5 min).
    pub observers: Vec<ReplicaDescription>,
}

/// Why [`RaftNode::propose`] refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProposeError {
    /// Only the leader appends.
    #[error("not the leader of epoch {epoch} (leader {leader_id:?})")]
    NotLeader {
        /// The node's epoch.
        epoch: i32,
        /// The leader it knows, if any.
        leader_id: Option<NodeId>,
    },
    /// No record.
    #[error("a proposal needs at least one record")]
    Empty,
    /// The batch would exceed the configured maximum.
    #[error("batch of {size_bytes} bytes exceeds the maximum of {max_bytes}")]
    TooLarge {
        /// Size of the records (bytes).
        size_bytes: usize,
        /// The maximum (bytes).
        max_bytes: usize,
    },
    /// The log refused the append.
    #[error(transparent)]
    Log(#[from] RaftLogError),
}

impl ProposeError {
    /// The Kafka error code a request handler answers with.
    pub fn error_code(&self) -> ErrorCode {
        match self {
            ProposeError::NotLeader { .. } => ErrorCode::NotLeaderOrFollower,
            ProposeError::Empty => ErrorCode::InvalidRequest,
            ProposeError::TooLarge { .. } => ErrorCode::RecordListTooLarge,
            ProposeError::Log(_) => ErrorCode::KafkaStorageError,
        }
    }
}

/// Votes collected in one election (Kafka's `EpochElection`).
#[derive(Debug, Clone, Default)]
struct EpochElection {
    granted: BTreeSet<NodeId>,
    rejected: BTreeSet<NodeId>,
}

impl EpochElection {
    fn new(local_id: NodeId) -> Self {
        let mut e = Self::default();
        e.granted.insert(local_id);
        e
    }

    fn record(&mut self, id: NodeId, granted: bool) {
        if self.granted.contains(&id) || self.rejected.contains(&id) {
            return;
        }
        if granted {
            self.granted.insert(id);
        } else {
            self.rejected.insert(id);
        }
    }

    fn is_granted(&self, majority: usize) -> bool {
        self.granted.len() >= majority
    }

    fn is_rejected(&self, voters: usize, majority: usize) -> bool {
        self.rejected.len() > voters - majority
    }
}

#[derive(Debug, Clone)]
struct LeaderState {
    epoch: i32,
    epoch_start_offset: i64,
    /// Fetch offset of each remote voter in this epoch (`None` until its first valid fetch).
    voter_end_offsets: BTreeMap<NodeId, Option<i64>>,
    /// Each remote voter's last fetch and last fetch that reached the leader's log end (ms).
    voter_fetch_times: BTreeMap<NodeId, (u64, Option<u64>)>,
    /// Observers: fetch offset and time of their last fetch (ms).
    observers: BTreeMap<NodeId, (i64, u64)>,
    granting_voters: BTreeSet<NodeId>,
    /// Voters that fetched in the current check-quorum interval.
    fetched_voters: BTreeSet<NodeId>,
    check_quorum_deadline_ms: u64,
    begin_quorum_deadline_ms: u64,
    /// Voters that answered BeginQuorumEpoch or fetched in this epoch.
    acknowledged: BTreeSet<NodeId>,
    /// The LeaderChange record is still to be appended (on the next call).
    epoch_start_pending: bool,
}

#[derive(Debug, Clone)]
enum State {
    Unattached {
        epoch: i32,
        leader_id: Option<NodeId>,
        voted_id: Option<NodeId>,
        election_deadline_ms: u64,
    },
    Prospective {
        epoch: i32,
        leader_id: Option<NodeId>,
        voted_id: Option<NodeId>,
        election: EpochElection,
        retries: u32,
        election_deadline_ms: u64,
    },
    Candidate {
        epoch: i32,
        election: EpochElection,
        retries: u32,
        election_deadline_ms: u64,
        backoff_until_ms: Option<u64>,
    },
    Leader(Box<LeaderState>),
    Follower {
        epoch: i32,
        leader_id: NodeId,
        voted_id: Option<NodeId>,
        fetch_deadline_ms: u64,
        has_fetched_from_leader: bool,
        /// The leader's snapshot being fetched (Kafka's `FollowerState.fetchingSnapshot`);
        /// its bytes are the log's pending snapshot. A new state abandons it.
        fetching_snapshot: Option<OffsetAndEpoch>,
    },
    Resigned {
        epoch: i32,
        election_deadline_ms: u64,
        unacked_voters: BTreeSet<NodeId>,
        preferred_successors: Vec<NodeId>,
    },
}

impl State {
    fn epoch(&self) -> i32 {
        match self {
            State::Unattached { epoch, .. }
            | State::Prospective { epoch, .. }
            | State::Candidate { epoch, .. }
            | State::Follower { epoch, .. }
            | State::Resigned { epoch, .. } => *epoch,
            State::Leader(l) => l.epoch,
        }
    }

    fn role(&self) -> Role {
        match self {
            State::Unattached { .. } => Role::Unattached,
            State::Prospective { .. } => Role::Prospective,
            State::Candidate { .. } => Role::Candidate,
            State::Leader(_) => Role::Leader,
            State::Follower { .. } => Role::Follower,
            State::Resigned { .. } => Role::Resigned,
        }
    }
}

/// A Fetch parked at the leader until new data, a high-watermark move, its deadline or a
/// change of state.
#[derive(Debug, Clone)]
struct ParkedFetch {
    from: NodeId,
    correlation_id: i32,
    request: FetchRequest,
    deadline_ms: u64,
}

/// In-flight requests per destination and backoffs (Kafka's `RequestManager`): at most one
/// request in flight per node; a response with another correlation id is ignored.
#[derive(Debug, Clone, Default)]
struct RequestManager {
    inflight: BTreeMap<NodeId, (i32, u64)>,
    backoff_until_ms: BTreeMap<NodeId, u64>,
}

impl RequestManager {
    fn can_send(&self, to: NodeId, now_ms: u64) -> bool {
        !self.inflight.contains_key(&to) && !self.is_backing_off(to, now_ms)
    }

    fn is_backing_off(&self, to: NodeId, now_ms: u64) -> bool {
        self.backoff_until_ms.get(&to).is_some_and(|&b| now_ms < b)
    }

    fn on_sent(&mut self, to: NodeId, correlation_id: i32, now_ms: u64) {
        self.inflight.insert(to, (correlation_id, now_ms));
        self.backoff_until_ms.remove(&to);
    }

    /// True when the response answers the request in flight to `from`.
    fn on_response(&mut self, from: NodeId, correlation_id: i32) -> bool {
        match self.inflight.get(&from) {
            Some(&(cid, _)) if cid == correlation_id => {
                self.inflight.remove(&from);
                true
            }
            _ => false,
        }
    }

    fn on_failure(&mut self, to: NodeId, now_ms: u64, backoff_ms: u64) {
        self.backoff_until_ms
            .insert(to, now_ms.saturating_add(backoff_ms));
    }

    fn expire(&mut self, now_ms: u64, timeout_ms: u64, backoff_ms: u64) {
        let expired: Vec<NodeId> = self
            .inflight
            .iter()
            .filter(|(_, &(_, sent))| now_ms >= sent.saturating_add(timeout_ms))
            .map(|(&n, _)| n)
            .collect();
        for n in expired {
            self.inflight.remove(&n);
            self.on_failure(n, now_ms, backoff_ms);
        }
    }

    fn has_any_inflight(&self) -> bool {
        !self.inflight.is_empty()
    }

    fn reset_all(&mut self) {
        self.inflight.clear();
        self.backoff_until_ms.clear();
    }
}

/// One node of the KRaft quorum. See the module documentation.
#[derive(Debug)]
pub struct RaftNode<L: RaftLog> {
    config: QuorumConfig,
    log: L,
    rng: Rng,
    state: State,
    /// The high watermark of the current state (Kafka's `EpochState.highWatermark`): carried
    /// across transitions except into Leader, which starts without one.
    high_watermark: Option<i64>,
    /// The last election state handed to the driver to persist.
    persisted: ElectionState,
    requests: RequestManager,
    next_correlation_id: i32,
    parked: Vec<ParkedFetch>,
    actions: Vec<Action>,
    notified_leader: Option<(i32, Option<NodeId>)>,
    anomalies: u64,
    last_anomaly: Option<String>,
    /// Occurrences of each kind of anomaly or misconfiguration error, to log the 1st, 2nd, 4th, 8th, ... of each.
    anomaly_counts: BTreeMap<&'static str, u64>,
}

impl<L: RaftLog> RaftNode<L> {
    /// A node starting from its log and the election state it last persisted (`None` for a
    /// fresh node), as Kafka's `QuorumState.initialize`: a node that was leader comes back
    /// Resigned (it never leads an epoch twice), one that voted for itself comes back Candidate,
    /// and an election state older than the log's last epoch is replaced by that epoch.
    /// Returns the node and its first actions.
    pub fn new(
        config: QuorumConfig,
        log: L,
        stored: Option<ElectionState>,
        mut rng: Rng,
        now_ms: u64,
    ) -> (Self, Vec<Action>) {
        let election = stored.unwrap_or_default();
        let local = config.node_id;
        let voter = config.is_voter();
        let timeout = random_timeout(&mut rng, config.election_timeout_ms);
        let log_epoch = log.last_fetched_epoch();
        let state = if election.epoch < log_epoch {
            State::Unattached {
                epoch: log_epoch,
                leader_id: None,
                voted_id: None,
                election_deadline_ms: deadline(voter, now_ms, timeout),
            }
        } else if voter && election.leader_id == Some(local) {
            State::Resigned {
                epoch: election.epoch,
                election_deadline_ms: now_ms.saturating_add(timeout),
                unacked_voters: config.voters.ids().filter(|&v| v != local).collect(),
                preferred_successors: Vec::new(),
            }
        } else if voter && election.leader_id.is_none() && election.voted_id == Some(local) {
            State::Candidate {
                epoch: election.epoch,
                election: EpochElection::new(local),
                retries: 1,
                election_deadline_ms: now_ms.saturating_add(timeout),
                backoff_until_ms: None,
            }
        } else if let Some(leader) = election
            .leader_id
            .filter(|&l| l != local && config.voters.contains(l))
        {
            State::Follower {
                epoch: election.epoch,
                leader_id: leader,
                voted_id: election.voted_id.filter(|_| voter),
                fetch_deadline_ms: now_ms.saturating_add(config.fetch_timeout_ms),
                has_fetched_from_leader: false,
                fetching_snapshot: None,
            }
        } else {
            State::Unattached {
                epoch: election.epoch,
                leader_id: None,
                voted_id: election.voted_id.filter(|&v| voter && v != local),
                election_deadline_ms: deadline(voter, now_ms, timeout),
            }
        };
        let mut node = Self {
            config,
            log,
            rng,
            state,
            high_watermark: None,
            persisted: stored.unwrap_or_default(),
            requests: RequestManager::default(),
            next_correlation_id: 0,
            parked: Vec::new(),
            actions: Vec::new(),
            notified_leader: None,
            anomalies: 0,
            last_anomaly: None,
            anomaly_counts: BTreeMap::new(),
        };
        tracing::info!(node = local, state = ?node.state.role(), epoch = node.epoch(), "raft node starting");
        node.after_transition();
        node.poll(now_ms);
        let actions = std::mem::take(&mut node.actions);
        (node, actions)
    }

    // ----- inspection -----

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.config.node_id
    }

    /// The configuration.
    pub fn config(&self) -> &QuorumConfig {
        &self.config
    }

    /// The current state.
    pub fn role(&self) -> Role {
        self.state.role()
    }

    /// The current epoch.
    pub fn epoch(&self) -> i32 {
        self.state.epoch()
    }

    /// The leader of the current epoch, if known (this node when Leader or Resigned).
    pub fn leader_id(&self) -> Option<NodeId> {
        let local = self.config.node_id;
        match &self.state {
            State::Unattached { leader_id, .. } | State::Prospective { leader_id, .. } => {
                *leader_id
            }
            State::Candidate { .. } => None,
            State::Leader(_) | State::Resigned { .. } => Some(local),
            State::Follower { leader_id, .. } => Some(*leader_id),
        }
    }

    /// The candidate this node voted for in the current epoch, if any.
    pub fn voted_id(&self) -> Option<NodeId> {
        let local = self.config.node_id;
        match &self.state {
            State::Unattached { voted_id, .. }
            | State::Prospective { voted_id, .. }
            | State::Follower { voted_id, .. } => *voted_id,
            State::Candidate { .. } | State::Leader(_) | State::Resigned { .. } => Some(local),
        }
    }

    /// The election state of the current state (what [`Action::PersistElectionState`] writes).
    pub fn election_state(&self) -> ElectionState {
        ElectionState {
            epoch: self.epoch(),
            leader_id: self.leader_id(),
            voted_id: self.voted_id(),
        }
    }

    /// The high watermark of the current state, if known.
    pub fn high_watermark(&self) -> Option<i64> {
        self.high_watermark
    }

    /// The log.
    pub fn log(&self) -> &L {
        &self.log
    }

    /// The log, for the driver to complete [`Action::FlushLog`].
    pub fn log_mut(&mut self) -> &mut L {
        &mut self.log
    }

    /// Gives the log back (a driver shutting the node down).
    pub fn into_log(self) -> L {
        self.log
    }

    /// Messages seen that the protocol says cannot happen in a correct quorum (two leaders in
    /// one epoch, a leader asking to truncate committed records, a high watermark going back).
    /// Each is logged at error level and otherwise ignored; the simulator fails on any.
    pub fn anomalies(&self) -> u64 {
        self.anomalies
    }

    /// The last anomaly, with the state the node was in.
    pub fn last_anomaly(&self) -> Option<&str> {
        self.last_anomaly.as_deref()
    }

    // ----- events -----

    /// Handles a message from `from` at `now_ms`.
    pub fn handle_message(&mut self, from: NodeId, message: Message, now_ms: u64) -> Vec<Action> {
        self.begin_epoch_if_pending(now_ms);
        if from == self.config.node_id {
            self.anomaly("message from itself");
        } else {
            match message {
                Message::Request {
                    correlation_id,
                    request,
                } => self.handle_request(from, correlation_id, request, now_ms),
                Message::Response {
                    correlation_id,
                    response,
                } => self.handle_response(from, correlation_id, response, now_ms),
            }
        }
        self.poll(now_ms);
        std::mem::take(&mut self.actions)
    }

    /// Advances timers to `now_ms`: election and fetch timeouts, request timeouts, check quorum,
    /// parked fetches, retries.
    pub fn tick(&mut self, now_ms: u64) -> Vec<Action> {
        self.begin_epoch_if_pending(now_ms);
        self.poll(now_ms);
        std::mem::take(&mut self.actions)
    }

    /// Appends `values` as one batch of records (null keys) in the leader's epoch. The records
    /// are opaque to the quorum.
    ///
    /// # Errors
    /// [`ProposeError::NotLeader`] unless Leader; [`ProposeError::Empty`],
    /// [`ProposeError::TooLarge`] (over `max_batch_bytes`), [`ProposeError::Log`].
    pub fn propose(
        &mut self,
        values: &[Bytes],
        now_ms: u64,
    ) -> Result<(Proposed, Vec<Action>), ProposeError> {
        self.begin_epoch_if_pending(now_ms);
        let epoch = match &self.state {
            State::Leader(l) => l.epoch,
            _ => {
                return Err(ProposeError::NotLeader {
                    epoch: self.epoch(),
                    leader_id: self.leader_id(),
                })
            }
        };
        if values.is_empty() {
            return Err(ProposeError::Empty);
        }
        let size_bytes: usize = values.iter().map(|v| v.len()).sum();
        if size_bytes > self.config.max_batch_bytes {
            return Err(ProposeError::TooLarge {
                size_bytes,
                max_bytes: self.config.max_batch_bytes,
            });
        }
        let base = self.log.log_end_offset();
        let batch = build_data_batch(base, epoch, millis(now_ms), values);
        if batch.len() > self.config.max_batch_bytes {
            return Err(ProposeError::TooLarge {
                size_bytes: batch.len(),
                max_bytes: self.config.max_batch_bytes,
            });
        }
        let info = self.log.append_as_leader(batch, epoch)?;
        self.actions.push(Action::FlushLog {
            end_offset: self.log.log_end_offset(),
        });
        self.on_leader_append(now_ms);
        self.poll(now_ms);
        Ok((
            Proposed {
                epoch,
                base_offset: info.first_offset,
                last_offset: info.last_offset,
            },
            std::mem::take(&mut self.actions),
        ))
    }

    /// What the leader knows of every replica, for DescribeQuorum (API 55, KIP-595/KIP-836):
    /// `None` unless Leader (Kafka answers NOT_LEADER_OR_FOLLOWER). Times are the driver's
    /// clock in ms (`now_ms` for the leader itself); offsets -1 when not known yet.
    pub fn describe_quorum(&self, now_ms: u64) -> Option<QuorumDescription> {
        let State::Leader(l) = &self.state else {
            return None;
        };
        let local = self.config.node_id;
        let voters = self
            .config
            .voters
            .ids()
            .map(|id| {
                if id == local {
                    ReplicaDescription {
                        replica_id: id,
                        log_end_offset: self.log.log_end_offset(),
                        last_fetch_ms: Some(now_ms),
                        last_caught_up_ms: Some(now_ms),
                    }
                } else {
                    let times = l.voter_fetch_times.get(&id);
                    ReplicaDescription {
                        replica_id: id,
                        log_end_offset: l
                            .voter_end_offsets
                            .get(&id)
                            .copied()
                            .flatten()
                            .unwrap_or(-1),
                        last_fetch_ms: times.map(|t| t.0),
                        last_caught_up_ms: times.and_then(|t| t.1),
                    }
                }
            })
            .collect();
        let observers = l
            .observers
            .iter()
            .map(|(&id, &(end, last))| ReplicaDescription {
                replica_id: id,
                log_end_offset: end,
                last_fetch_ms: Some(last),
                last_caught_up_ms: None,
            })
            .collect();
        Some(QuorumDescription {
            leader_id: local,
            leader_epoch: l.epoch,
            high_watermark: self.high_watermark.unwrap_or(-1),
            voters,
            observers,
        })
    }

    /// Gives up leadership of the current epoch, as Kafka's leader does on a graceful shutdown:
    /// the node goes Resigned and sends EndQuorumEpoch to the voters with the preferred
    /// successors (voters by descending fetch offset), so the most caught-up one stands first.
    /// Nothing happens unless Leader.
    pub fn resign(&mut self, now_ms: u64) -> Vec<Action> {
        self.begin_epoch_if_pending(now_ms);
        if self.role() == Role::Leader {
            let preferred = self.voters_by_descending_fetch_offset();
            self.transition_to_resigned(preferred, now_ms);
        }
        self.poll(now_ms);
        std::mem::take(&mut self.actions)
    }

    // ----- requests -----

    fn handle_request(&mut self, from: NodeId, correlation_id: i32, request: Request, now: u64) {
        let response = match request {
            Request::Vote(r) => Response::Vote(self.handle_vote_request(&r, now)),
            Request::BeginQuorumEpoch(r) => {
                Response::BeginQuorumEpoch(self.handle_begin_quorum_epoch_request(&r, now))
            }
            Request::EndQuorumEpoch(r) => {
                Response::EndQuorumEpoch(self.handle_end_quorum_epoch_request(&r, now))
            }
            Request::Fetch(r) => match self.handle_fetch_request(from, correlation_id, r, now) {
                Some(resp) => Response::Fetch(resp),
                None => return,
            },
            Request::FetchSnapshot(r) => {
                Response::FetchSnapshot(self.handle_fetch_snapshot_request(&r, now))
            }
        };
        self.send_response(from, correlation_id, response);
    }

    fn cluster_id_mismatch(&self, cluster_id: &Option<String>) -> bool {
        match (cluster_id, &self.config.cluster_id) {
            (Some(theirs), Some(ours)) => theirs != ours,
            _ => false,
        }
    }

    /// Kafka's `validateVoterOnlyRequest` for a static voter set.
    fn validate_voter_only_request(&self, remote: NodeId, epoch: i32) -> Option<ErrorCode> {
        if epoch < self.epoch() {
            Some(ErrorCode::FencedLeaderEpoch)
        } else if remote < 0 {
            Some(ErrorCode::InvalidRequest)
        } else if !self.config.is_voter() || !self.config.voters.contains(remote) {
            Some(ErrorCode::InconsistentVoterSet)
        } else {
            None
        }
    }

    fn vote_response(&self, error: ErrorCode, vote_granted: bool) -> VoteResponse {
        VoteResponse {
            error,
            leader_id: self.leader_id(),
            leader_epoch: self.epoch(),
            vote_granted,
        }
    }

    fn handle_vote_request(&mut self, r: &VoteRequest, now: u64) -> VoteResponse {
        if self.cluster_id_mismatch(&r.cluster_id) {
            return self.vote_response(ErrorCode::InconsistentClusterId, false);
        }
        // A candidate bumped its epoch past its last record's; a prospective did not.
        let illegal_epoch = if r.pre_vote {
            r.last_offset_epoch > r.replica_epoch
        } else {
            r.last_offset_epoch >= r.replica_epoch
        };
        if r.last_offset < 0 || r.last_offset_epoch < 0 || illegal_epoch {
            return self.vote_response(ErrorCode::InvalidRequest, false);
        }
        if let Some(error) = self.validate_voter_only_request(r.replica_id, r.replica_epoch) {
            return self.vote_response(error, false);
        }
        if r.replica_epoch > self.epoch() {
            self.transition_to_unattached(r.replica_epoch, now);
        }
        if r.voter_id.is_some_and(|v| v != self.config.node_id) {
            return self.vote_response(ErrorCode::InvalidVoterKey, false);
        }
        let candidate_end = OffsetAndEpoch::new(r.last_offset, r.last_offset_epoch);
        let up_to_date = candidate_end >= self.log.end_offset()
            || self.config.broken_rule == Some(BrokenRule::IgnoreLogUpToDate);
        let granted = self.can_grant_vote(r.replica_id, up_to_date, r.pre_vote);
        if granted && !r.pre_vote {
            self.add_vote(r.replica_id, now);
        }
        tracing::debug!(
            node = self.config.node_id,
            candidate = r.replica_id,
            epoch = r.replica_epoch,
            pre_vote = r.pre_vote,
            granted,
            "vote request"
        );
        self.vote_response(ErrorCode::None, granted)
    }

    /// Kafka's `EpochState.canGrantVote` of each state.
    fn can_grant_vote(&self, candidate: NodeId, up_to_date: bool, pre_vote: bool) -> bool {
        let two_votes = self.config.broken_rule == Some(BrokenRule::GrantTwoVotesPerEpoch);
        match &self.state {
            State::Unattached {
                leader_id,
                voted_id,
                ..
            }
            | State::Prospective {
                leader_id,
                voted_id,
                ..
            } => {
                if pre_vote {
                    up_to_date
                } else if let Some(voted) = voted_id {
                    *voted == candidate || (two_votes && up_to_date)
                } else if leader_id.is_some() {
                    false
                } else {
                    up_to_date
                }
            }
            State::Candidate { .. } => (pre_vote || two_votes) && up_to_date,
            State::Follower {
                has_fetched_from_leader,
                ..
            } => pre_vote && !has_fetched_from_leader && up_to_date,
            State::Leader(_) | State::Resigned { .. } => false,
        }
    }

    /// Records a granted standard vote durably (one vote per epoch).
    fn add_vote(&mut self, candidate: NodeId, now: u64) {
        let timeout = self.random_election_timeout();
        match &mut self.state {
            State::Unattached {
                voted_id: voted @ None,
                election_deadline_ms,
                ..
            } => {
                *voted = Some(candidate);
                *election_deadline_ms = now.saturating_add(timeout);
            }
            State::Prospective {
                voted_id: voted @ None,
                election,
                election_deadline_ms,
                ..
            } => {
                *voted = Some(candidate);
                *election = EpochElection::new(self.config.node_id);
                *election_deadline_ms = now.saturating_add(timeout);
                self.requests.reset_all();
            }
            _ => return,
        }
        self.after_transition();
    }

    fn begin_response(&self, error: ErrorCode) -> BeginQuorumEpochResponse {
        BeginQuorumEpochResponse {
            error,
            leader_id: self.leader_id(),
            leader_epoch: self.epoch(),
        }
    }

    fn handle_begin_quorum_epoch_request(
        &mut self,
        r: &BeginQuorumEpochRequest,
        now: u64,
    ) -> BeginQuorumEpochResponse {
        if self.cluster_id_mismatch(&r.cluster_id) {
            return self.begin_response(ErrorCode::InconsistentClusterId);
        }
        if let Some(error) = self.validate_voter_only_request(r.leader_id, r.leader_epoch) {
            return self.begin_response(error);
        }
        self.maybe_transition(Some(r.leader_id), r.leader_epoch, now);
        if r.voter_id.is_some_and(|v| v != self.config.node_id) {
            return self.begin_response(ErrorCode::InvalidVoterKey);
        }
        self.begin_response(ErrorCode::None)
    }

    fn end_response(&self, error: ErrorCode) -> EndQuorumEpochResponse {
        EndQuorumEpochResponse {
            error,
            leader_id: self.leader_id(),
            leader_epoch: self.epoch(),
        }
    }

    fn handle_end_quorum_epoch_request(
        &mut self,
        r: &EndQuorumEpochRequest,
        now: u64,
    ) -> EndQuorumEpochResponse {
        if self.cluster_id_mismatch(&r.cluster_id) {
            return self.end_response(ErrorCode::InconsistentClusterId);
        }
        if let Some(error) = self.validate_voter_only_request(r.leader_id, r.leader_epoch) {
            return self.end_response(error);
        }
        self.maybe_transition(Some(r.leader_id), r.leader_epoch, now);
        let backoff = self.end_epoch_election_backoff(&r.preferred_successors);
        if let State::Follower {
            leader_id,
            fetch_deadline_ms,
            ..
        } = &mut self.state
        {
            if *leader_id == r.leader_id {
                // Voters earlier in the list wait less, so the most caught-up one is likely
                // to win (Kafka's `endEpochElectionBackoff`).
                *fetch_deadline_ms = now.saturating_add(backoff);
            }
        }
        self.end_response(ErrorCode::None)
    }

    /// Kafka's strict exponential backoff by position in the preferred successors.
    fn end_epoch_election_backoff(&self, preferred: &[NodeId]) -> u64 {
        let max = self.config.election_backoff_max_ms;
        let total = preferred.len();
        let position = preferred
            .iter()
            .position(|&c| c == self.config.node_id)
            .unwrap_or(total);
        if position == 0 && total > 0 {
            return 0;
        }
        if position >= total {
            return max;
        }
        let base = max.checked_shr((total - 1) as u32).unwrap_or(0);
        base.checked_shl((position - 1) as u32)
            .unwrap_or(max)
            .min(max)
    }

    fn fetch_error(&self, error: ErrorCode) -> FetchResponse {
        FetchResponse {
            error,
            high_watermark: -1,
            log_start_offset: self.log.log_start_offset(),
            diverging_epoch: None,
            snapshot_id: None,
            current_leader_id: self.leader_id(),
            current_leader_epoch: self.epoch(),
            records: Bytes::new(),
        }
    }

    /// Answers at once (`Some`) or parks the fetch (`None`).
    fn handle_fetch_request(
        &mut self,
        from: NodeId,
        correlation_id: i32,
        r: FetchRequest,
        now: u64,
    ) -> Option<FetchResponse> {
        if self.cluster_id_mismatch(&r.cluster_id) {
            return Some(self.fetch_error(ErrorCode::InconsistentClusterId));
        }
        if r.max_wait_ms < 0
            || r.fetch_offset < 0
            || r.last_fetched_epoch < 0
            || r.last_fetched_epoch > r.current_leader_epoch
        {
            return Some(self.fetch_error(ErrorCode::InvalidRequest));
        }
        let response = self.try_complete_fetch(&r, now);
        let park = response.error.is_none()
            && response.records.is_empty()
            && response.diverging_epoch.is_none()
            && response.snapshot_id.is_none()
            && r.max_wait_ms > 0
            // KIP-1166: a fetcher behind on the high watermark is answered at once.
            && !(response.high_watermark >= 0 && r.high_watermark < response.high_watermark);
        if !park {
            return Some(response);
        }
        self.parked.retain(|p| p.from != from);
        if self.parked.len() >= self.config.max_parked_fetches {
            return Some(response);
        }
        let wait = u64::try_from(r.max_wait_ms)
            .unwrap_or(0)
            .min(self.config.fetch_max_wait_ms.max(1));
        self.parked.push(ParkedFetch {
            from,
            correlation_id,
            request: r,
            deadline_ms: now.saturating_add(wait),
        });
        None
    }

    /// Kafka's `tryCompleteFetchRequest`.
    fn try_complete_fetch(&mut self, r: &FetchRequest, now: u64) -> FetchResponse {
        let epoch = self.epoch();
        if r.current_leader_epoch < epoch {
            return self.fetch_error(ErrorCode::FencedLeaderEpoch);
        } else if r.current_leader_epoch > epoch {
            return self.fetch_error(ErrorCode::UnknownLeaderEpoch);
        } else if self.role() != Role::Leader {
            return self.fetch_error(ErrorCode::NotLeaderOrFollower);
        }
        if r.replica_id == self.config.node_id {
            return self.fetch_error(ErrorCode::InvalidRequest);
        }
        let (diverging, snapshot_id) = self.validate_offset_and_epoch(r);
        let valid = diverging.is_none() && snapshot_id.is_none();
        let records = if valid {
            match self.log.read(r.fetch_offset, self.config.max_fetch_bytes) {
                Ok(records) => records,
                Err(e) => {
                    tracing::error!(node = self.config.node_id, error = %e, "reading the log for a fetch");
                    return self.fetch_error(ErrorCode::UnknownServerError);
                }
            }
        } else {
            Bytes::new()
        };
        if valid && self.update_replica_state(r.replica_id, r.fetch_offset, now) {
            self.on_high_watermark_changed(now);
        }
        FetchResponse {
            error: ErrorCode::None,
            high_watermark: self.high_watermark.unwrap_or(-1),
            log_start_offset: self.log.log_start_offset(),
            diverging_epoch: diverging,
            snapshot_id,
            current_leader_id: Some(self.config.node_id),
            current_leader_epoch: epoch,
            records,
        }
    }

    /// Kafka's `ReplicatedLog.validateOffsetAndEpoch`: `(DivergingEpoch, SnapshotId)` for a
    /// fetch position, at most one of them set. A position the log start has passed, at the
    /// log start with another epoch than the snapshot there, or with an epoch older than the
    /// oldest snapshot's needs the latest snapshot; one that does not match the epoch cache
    /// diverges; offset 0 of a log starting at 0 is always valid.
    fn validate_offset_and_epoch(
        &self,
        r: &FetchRequest,
    ) -> (Option<OffsetAndEpoch>, Option<OffsetAndEpoch>) {
        let start = self.log.log_start_offset();
        if start == 0 && r.fetch_offset == 0 {
            return (None, None);
        }
        if let Some(earliest) = self.log.earliest_snapshot_id() {
            if r.fetch_offset < start
                || (r.fetch_offset == start && r.last_fetched_epoch != earliest.epoch)
                || r.last_fetched_epoch < earliest.epoch
            {
                return (None, self.log.latest_snapshot_id());
            }
        }
        let end = self.log.end_offset_for_epoch(r.last_fetched_epoch);
        if end.epoch != r.last_fetched_epoch || end.offset < r.fetch_offset {
            (Some(end), None)
        } else {
            (None, None)
        }
    }

    /// Kafka's `handleFetchSnapshotRequest`: a chunk of at most `MaxBytes` (and
    /// `max_fetch_snapshot_bytes`) of the snapshot from `Position`; SNAPSHOT_NOT_FOUND for a
    /// snapshot the leader does not have (or the bootstrap snapshot `(0, 0)`),
    /// POSITION_OUT_OF_RANGE for a position outside `[0, size)`. A voter fetching a snapshot
    /// counts as fetching for check quorum.
    fn handle_fetch_snapshot_request(
        &mut self,
        r: &FetchSnapshotRequest,
        now: u64,
    ) -> FetchSnapshotResponse {
        let error = |node: &Self, error: ErrorCode| FetchSnapshotResponse {
            error,
            snapshot_id: OffsetAndEpoch::new(-1, -1),
            current_leader_id: node.leader_id(),
            current_leader_epoch: node.epoch(),
            size: -1,
            position: -1,
            unaligned_records: Bytes::new(),
        };
        if self.cluster_id_mismatch(&r.cluster_id) {
            return error(self, ErrorCode::InconsistentClusterId);
        }
        let epoch = self.epoch();
        if r.current_leader_epoch < epoch {
            return error(self, ErrorCode::FencedLeaderEpoch);
        } else if r.current_leader_epoch > epoch {
            return error(self, ErrorCode::UnknownLeaderEpoch);
        } else if self.role() != Role::Leader {
            return error(self, ErrorCode::NotLeaderOrFollower);
        }
        let id = r.snapshot_id;
        let size = match self.log.snapshot_size(id) {
            Some(size) if id != OffsetAndEpoch::new(0, 0) => size,
            _ => return error(self, ErrorCode::SnapshotNotFound),
        };
        let position = match u64::try_from(r.position) {
            Ok(p) if p < size => p,
            _ => return error(self, ErrorCode::PositionOutOfRange),
        };
        let max = usize::try_from(r.max_bytes.max(0))
            .unwrap_or(0)
            .min(self.config.max_fetch_snapshot_bytes)
            .max(1);
        let chunk = match self.log.read_snapshot_chunk(id, position, max) {
            Ok(c) => c,
            Err(RaftLogError::SnapshotNotFound(_)) => {
                return error(self, ErrorCode::SnapshotNotFound)
            }
            Err(e) => {
                tracing::error!(node = self.config.node_id, error = %e, "reading a snapshot chunk");
                return error(self, ErrorCode::UnknownServerError);
            }
        };
        self.note_voter_fetch(r.replica_id, now);
        FetchSnapshotResponse {
            error: ErrorCode::None,
            snapshot_id: id,
            current_leader_id: Some(self.config.node_id),
            current_leader_epoch: epoch,
            size: i64::try_from(size).unwrap_or(i64::MAX),
            position: r.position,
            unaligned_records: chunk,
        }
    }

    /// Kafka's `updateCheckQuorumForFollowingVoter`: a voter that fetched (here: a snapshot)
    /// counts towards the check-quorum majority.
    fn note_voter_fetch(&mut self, replica: NodeId, now: u64) {
        let majority = self.config.voters.majority();
        let check_quorum_timeout = self.config.check_quorum_timeout_ms();
        let State::Leader(l) = &mut self.state else {
            return;
        };
        if !l.voter_end_offsets.contains_key(&replica) {
            return;
        }
        l.acknowledged.insert(replica);
        l.fetched_voters.insert(replica);
        if l.fetched_voters.len() + 1 >= majority {
            l.fetched_voters.clear();
            l.check_quorum_deadline_ms = now.saturating_add(check_quorum_timeout);
        }
    }

    /// Records a replica's fetch offset at the leader; true when the high watermark moved.
    fn update_replica_state(&mut self, replica: NodeId, fetch_offset: i64, now: u64) -> bool {
        let leo = self.log.log_end_offset();
        let majority = self.config.voters.majority();
        let check_quorum_timeout = self.config.check_quorum_timeout_ms();
        let max_observers = self.config.max_tracked_observers;
        let State::Leader(l) = &mut self.state else {
            return false;
        };
        if let Some(end) = l.voter_end_offsets.get_mut(&replica) {
            *end = Some(fetch_offset);
            let caught_up = fetch_offset >= leo;
            let times = l.voter_fetch_times.entry(replica).or_insert((now, None));
            times.0 = now;
            if caught_up {
                times.1 = Some(now);
            }
            l.acknowledged.insert(replica);
            l.fetched_voters.insert(replica);
            // The leader counts towards the majority itself.
            if l.fetched_voters.len() + 1 >= majority {
                l.fetched_voters.clear();
                l.check_quorum_deadline_ms = now.saturating_add(check_quorum_timeout);
            }
            self.maybe_update_leader_high_watermark()
        } else {
            if replica >= 0
                && (l.observers.contains_key(&replica) || l.observers.len() < max_observers)
            {
                l.observers.insert(replica, (fetch_offset, now));
            }
            false
        }
    }

    /// Kafka's `LeaderState.maybeUpdateHighWatermark`: the largest offset a majority of voters
    /// holds, once it is past the epoch's start (a record of this epoch is committed).
    fn maybe_update_leader_high_watermark(&mut self) -> bool {
        let leo = self.log.log_end_offset();
        let commit_old = self.config.broken_rule == Some(BrokenRule::CommitOldEpochRecords);
        let State::Leader(l) = &self.state else {
            return false;
        };
        let mut offsets: Vec<Option<i64>> = l.voter_end_offsets.values().copied().collect();
        offsets.push(Some(leo));
        // Descending, unknown last.
        offsets.sort_by(|a, b| b.cmp(a));
        let index = self.config.voters.len() / 2;
        let Some(Some(candidate)) = offsets.get(index).copied() else {
            return false;
        };
        if candidate <= l.epoch_start_offset && !commit_old {
            return false;
        }
        match self.high_watermark {
            Some(current) if candidate <= current => false,
            _ => {
                self.high_watermark = Some(candidate);
                true
            }
        }
    }

    fn on_leader_append(&mut self, now: u64) {
        if self.maybe_update_leader_high_watermark() {
            self.on_high_watermark_changed(now);
        }
        self.complete_parked_fetches(now, false);
    }

    /// Publishes a risen high watermark and wakes fetches waiting for it (KIP-1166).
    fn on_high_watermark_changed(&mut self, now: u64) {
        let Some(hw) = self.high_watermark else {
            return;
        };
        if hw > self.log.high_watermark() {
            self.log.update_high_watermark(hw);
            self.actions.push(Action::HighWatermark(hw));
        }
        if self.role() == Role::Leader {
            self.complete_parked_fetches(now, false);
        }
    }

    /// Answers parked fetches that can complete (all of them when `force`).
    fn complete_parked_fetches(&mut self, now: u64, force: bool) {
        if self.parked.is_empty() {
            return;
        }
        let parked = std::mem::take(&mut self.parked);
        let mut keep = Vec::new();
        for p in parked {
            let leader = self.role() == Role::Leader;
            let hw = self.high_watermark.unwrap_or(-1);
            let ready = force
                || !leader
                || now >= p.deadline_ms
                || self.log.log_end_offset() > p.request.fetch_offset
                || (hw >= 0 && p.request.high_watermark < hw);
            if ready {
                let response = self.try_complete_fetch(&p.request, now);
                self.send_response(p.from, p.correlation_id, Response::Fetch(response));
            } else {
                keep.push(p);
            }
        }
        keep.append(&mut self.parked);
        self.parked = keep;
    }

    // ----- responses -----

    fn handle_response(&mut self, from: NodeId, correlation_id: i32, response: Response, now: u64) {
        if !self.requests.on_response(from, correlation_id) {
            tracing::trace!(
                node = self.config.node_id,
                from,
                correlation_id,
                "ignoring unexpected response"
            );
            return;
        }
        let ok = match response {
            Response::Vote(r) => self.handle_vote_response(from, &r, now),
            Response::BeginQuorumEpoch(r) => {
                match self.handle_common_response(r.error, r.leader_id, r.leader_epoch, now) {
                    Some(handled) => handled,
                    None if r.error.is_none() => {
                        if let State::Leader(l) = &mut self.state {
                            l.acknowledged.insert(from);
                        }
                        true
                    }
                    None => false,
                }
            }
            Response::EndQuorumEpoch(r) => {
                match self.handle_common_response(r.error, r.leader_id, r.leader_epoch, now) {
                    Some(handled) => handled,
                    None if r.error.is_none() => {
                        if let State::Resigned { unacked_voters, .. } = &mut self.state {
                            unacked_voters.remove(&from);
                        }
                        true
                    }
                    None => false,
                }
            }
            Response::Fetch(r) => self.handle_fetch_response(from, r, now),
            Response::FetchSnapshot(r) => self.handle_fetch_snapshot_response(from, r, now),
        };
        if !ok {
            self.requests
                .on_failure(from, now, self.config.retry_backoff_ms);
        }
    }

    /// Kafka's `maybeHandleCommonResponse`: `Some(ok)` when the response was fully handled
    /// here (stale epoch, or an epoch or leader change), `None` when its own handler runs.
    fn handle_common_response(
        &mut self,
        error: ErrorCode,
        leader_id: Option<NodeId>,
        epoch: i32,
        now: u64,
    ) -> Option<bool> {
        if error == ErrorCode::InconsistentClusterId || error == ErrorCode::InconsistentVoterSet {
            let (kind, cause) = if error == ErrorCode::InconsistentClusterId {
                (
                    "INCONSISTENT_CLUSTER_ID",
                    "a peer was formatted with another cluster.id (meta.properties); format \
                     every node with the same cluster id",
                )
            } else {
                (
                    "INCONSISTENT_VOTER_SET",
                    "a peer has another controller.quorum.voters; every node needs the same voters",
                )
            };
            if let Some(occurrences) = self.count_repeated(kind) {
                tracing::error!(node = self.config.node_id, %error, occurrences,
                    "quorum misconfigured: {cause}");
            }
            return Some(false);
        }
        if epoch < self.epoch() || error == ErrorCode::UnknownLeaderEpoch {
            Some(true)
        } else if epoch > self.epoch()
            || error == ErrorCode::FencedLeaderEpoch
            || error == ErrorCode::NotLeaderOrFollower
        {
            let before = (self.role(), self.epoch(), self.leader_id());
            self.maybe_transition(leader_id, epoch, now);
            // Kafka retries at once; when nothing changed (a follower of a leader that has
            // resigned) gregor waits `retry_backoff_ms` first, so the pair does not ping-pong.
            Some((self.role(), self.epoch(), self.leader_id()) != before)
        } else if leader_id.is_some_and(|l| l != self.config.node_id) && !self.has_leader() {
            if let Some(leader) = leader_id {
                self.transition_to_follower(epoch, leader, now);
            }
            if error.is_none() {
                None
            } else {
                Some(true)
            }
        } else if error == ErrorCode::BrokerNotAvailable {
            Some(false)
        } else if error == ErrorCode::InvalidVoterKey {
            Some(true)
        } else if error == ErrorCode::InvalidRequest {
            self.anomaly("peer answered INVALID_REQUEST");
            Some(false)
        } else {
            None
        }
    }

    fn handle_vote_response(&mut self, from: NodeId, r: &VoteResponse, now: u64) -> bool {
        // A voter too old for Vote v2 cannot answer a PreVote: as Kafka, count it as granted,
        // so the prospective stands as a candidate and asks that voter for a real vote.
        if r.error == ErrorCode::UnsupportedVersion && self.role() == Role::Prospective {
            let majority = self.config.voters.majority();
            let voter = self.config.voters.contains(from);
            let mut granted = false;
            if let State::Prospective { election, .. } = &mut self.state {
                if voter {
                    election.record(from, true);
                }
                granted = election.is_granted(majority);
            }
            if granted {
                self.transition_to_candidate(now);
            }
            return true;
        }
        if let Some(handled) =
            self.handle_common_response(r.error, r.leader_id, r.leader_epoch, now)
        {
            return handled;
        }
        if !r.error.is_none() {
            return false;
        }
        if !self.config.voters.contains(from) {
            return true;
        }
        let voters = self.config.voters.len();
        let majority = self.config.voters.majority();
        match &mut self.state {
            State::Prospective { election, .. } => {
                election.record(from, r.vote_granted);
                if election.is_granted(majority) {
                    self.transition_to_candidate(now);
                } else if election.is_rejected(voters, majority) {
                    self.lose_prospective(now);
                }
            }
            State::Candidate {
                election, retries, ..
            } => {
                election.record(from, r.vote_granted);
                if election.is_granted(majority) {
                    self.transition_to_leader(now);
                } else if election.is_rejected(voters, majority) {
                    let retries = *retries;
                    self.start_candidate_backoff(retries, now);
                }
            }
            _ => {}
        }
        true
    }

    fn handle_fetch_response(&mut self, from: NodeId, r: FetchResponse, now: u64) -> bool {
        if let Some(handled) =
            self.handle_common_response(r.error, r.current_leader_id, r.current_leader_epoch, now)
        {
            return handled;
        }
        if !r.error.is_none() {
            return false;
        }
        match &self.state {
            State::Follower { leader_id, .. } if *leader_id == from => {}
            _ => return true,
        }
        if let Some(snapshot_id) = r.snapshot_id {
            if snapshot_id.epoch < 0 || snapshot_id.offset < 0 {
                tracing::error!(
                    node = self.config.node_id,
                    ?snapshot_id,
                    "leader sent an invalid snapshot id"
                );
                return false;
            }
            if !self.start_fetching_snapshot(from, snapshot_id, now) {
                return false;
            }
        } else if let Some(diverging) = r.diverging_epoch {
            if diverging.epoch < 0 || diverging.offset < 0 {
                return false;
            }
            match self.log.truncate_to_end_offset(diverging) {
                Ok(leo) => {
                    tracing::info!(
                        node = self.config.node_id,
                        leader = from,
                        leo,
                        "truncated on diverging epoch"
                    );
                }
                Err(RaftLogError::BelowHighWatermark { .. }) => {
                    self.anomaly("leader asked to truncate below the high watermark");
                    return false;
                }
                Err(e) => {
                    tracing::error!(node = self.config.node_id, error = %e, "truncating the log");
                    return false;
                }
            }
        } else {
            if !r.records.is_empty() {
                if let Err(e) = self.log.append_as_follower(&r.records) {
                    // Retried every retry backoff (a full disk: until it has room): logged the
                    // 1st, 2nd, 4th, 8th, ... time.
                    if let Some(count) = self.count_repeated("fetched records not appended") {
                        tracing::warn!(node = self.config.node_id, error = %e, count, "fetched records not appended; fetching them again");
                    }
                    return false;
                }
                if self.config.is_voter() {
                    // The leader counts a voter's fetch offset towards the high watermark, so
                    // the records must be durable before the next Fetch reports them.
                    self.actions.push(Action::FlushLog {
                        end_offset: self.log.log_end_offset(),
                    });
                }
            }
            if r.high_watermark >= 0 {
                let new = r.high_watermark.min(self.log.log_end_offset());
                match self.high_watermark {
                    Some(current) if new < current => {
                        self.anomaly("leader's high watermark is below ours");
                    }
                    Some(current) if new == current => {}
                    _ => {
                        self.high_watermark = Some(new);
                        self.on_high_watermark_changed(now);
                    }
                }
            }
        }
        let fetch_timeout = self.config.fetch_timeout_ms;
        if let State::Follower {
            fetch_deadline_ms,
            has_fetched_from_leader,
            ..
        } = &mut self.state
        {
            *fetch_deadline_ms = now.saturating_add(fetch_timeout);
            *has_fetched_from_leader = true;
        }
        true
    }

    /// The leader answered a Fetch with its latest snapshot's id: start fetching it (Kafka's
    /// `createNewSnapshotUnchecked` into `FollowerState.fetchingSnapshot`), or, when the log
    /// already has it complete (a crash after completing it), install it at once.
    fn start_fetching_snapshot(&mut self, leader: NodeId, id: OffsetAndEpoch, now: u64) -> bool {
        match self.log.begin_fetched_snapshot(id) {
            Ok(true) => {
                tracing::info!(node = self.config.node_id, leader, snapshot = ?id, "fetching snapshot");
                if let State::Follower {
                    fetching_snapshot, ..
                } = &mut self.state
                {
                    *fetching_snapshot = Some(id);
                }
                true
            }
            Ok(false) => self.install_snapshot(id, now),
            Err(e) => {
                tracing::error!(node = self.config.node_id, error = %e, "starting a snapshot fetch");
                false
            }
        }
    }

    /// Replaces the log with the latest snapshot once it is complete (Kafka's
    /// `onSnapshotFetchComplete`): truncates fully when the log does not hold it, tells the
    /// driver, and raises the high watermark to the snapshot's end offset.
    fn install_snapshot(&mut self, id: OffsetAndEpoch, now: u64) -> bool {
        match self.log.truncate_to_latest_snapshot() {
            Ok(truncated) => {
                tracing::info!(
                    node = self.config.node_id,
                    snapshot = ?id,
                    truncated,
                    log_start_offset = self.log.log_start_offset(),
                    "installed a fetched snapshot"
                );
            }
            Err(e) => {
                tracing::error!(node = self.config.node_id, error = %e, "installing a fetched snapshot");
                return false;
            }
        }
        // The log starts at its latest snapshot: the fetched one, or a newer one of its own.
        let id = match self.log.latest_snapshot_id() {
            Some(latest) if latest.offset > id.offset => latest,
            _ => id,
        };
        self.actions
            .push(Action::SnapshotInstalled { snapshot_id: id });
        let new = id.offset.min(self.log.log_end_offset());
        if self.high_watermark.is_none_or(|hw| hw < new) {
            self.high_watermark = Some(new);
            self.on_high_watermark_changed(now);
        }
        true
    }

    /// Kafka's `handleFetchSnapshotResponse`: appends the chunk at the position the pending
    /// snapshot has reached; once all `Size` bytes are in, checks and installs it. The leader
    /// no longer having the snapshot, a position error or a chunk that does not fit abandons
    /// the pending snapshot: the next Fetch asks the leader again.
    fn handle_fetch_snapshot_response(
        &mut self,
        from: NodeId,
        r: FetchSnapshotResponse,
        now: u64,
    ) -> bool {
        if let Some(handled) =
            self.handle_common_response(r.error, r.current_leader_id, r.current_leader_epoch, now)
        {
            return handled;
        }
        let fetching = match &self.state {
            State::Follower {
                leader_id,
                fetching_snapshot: Some(id),
                ..
            } if *leader_id == from => *id,
            _ => return true,
        };
        if r.error == ErrorCode::SnapshotNotFound
            || r.snapshot_id.offset < 0
            || r.snapshot_id.epoch < 0
        {
            tracing::info!(node = self.config.node_id, snapshot = ?fetching, error = %r.error, "leader no longer has the snapshot; fetching again");
            self.abandon_snapshot_fetch(now);
            return true;
        }
        if !r.error.is_none() {
            tracing::warn!(node = self.config.node_id, snapshot = ?fetching, error = %r.error, "snapshot fetch failed; starting over");
            self.abandon_snapshot_fetch(now);
            return false;
        }
        let position = self.log.fetched_snapshot().map(|(_, p)| p);
        let fits = r.snapshot_id == fetching
            && position.is_some_and(|p| i64::try_from(p).ok() == Some(r.position))
            && r.size > 0
            && u64::try_from(r.size).is_ok_and(|s| s <= crate::snapshot::MAX_SNAPSHOT_BYTES)
            && !r.unaligned_records.is_empty()
            && r.position
                .checked_add(r.unaligned_records.len() as i64)
                .is_some_and(|end| end <= r.size);
        if !fits {
            tracing::warn!(node = self.config.node_id, snapshot = ?fetching, got = ?r.snapshot_id, position = r.position, size = r.size, "unexpected snapshot chunk; starting over");
            self.abandon_snapshot_fetch(now);
            return false;
        }
        let received = match self.log.append_fetched_snapshot(&r.unaligned_records) {
            Ok(n) => n,
            Err(e) => {
                tracing::error!(node = self.config.node_id, error = %e, "writing a snapshot chunk");
                self.abandon_snapshot_fetch(now);
                return false;
            }
        };
        self.reset_fetch_timeout(now);
        if i64::try_from(received).ok() != Some(r.size) {
            return true;
        }
        if let State::Follower {
            fetching_snapshot, ..
        } = &mut self.state
        {
            *fetching_snapshot = None;
        }
        match self.log.complete_fetched_snapshot() {
            Ok(id) => self.install_snapshot(id, now),
            Err(e) => {
                tracing::error!(node = self.config.node_id, error = %e, "fetched snapshot rejected");
                false
            }
        }
    }

    fn abandon_snapshot_fetch(&mut self, now: u64) {
        self.log.abort_fetched_snapshot();
        if let State::Follower {
            fetching_snapshot, ..
        } = &mut self.state
        {
            *fetching_snapshot = None;
        }
        self.reset_fetch_timeout(now);
    }

    fn reset_fetch_timeout(&mut self, now: u64) {
        let fetch_timeout = self.config.fetch_timeout_ms;
        if let State::Follower {
            fetch_deadline_ms,
            has_fetched_from_leader,
            ..
        } = &mut self.state
        {
            *fetch_deadline_ms = now.saturating_add(fetch_timeout);
            *has_fetched_from_leader = true;
        }
    }

    // ----- polling -----

    fn poll(&mut self, now: u64) {
        self.requests.expire(
            now,
            self.config.request_timeout_ms,
            self.config.retry_backoff_ms,
        );
        // A transition may enable another at once (a single voter elects itself in one poll).
        for _ in 0..8 {
            let before = (self.role(), self.epoch());
            match self.role() {
                Role::Leader => self.poll_leader(now),
                Role::Candidate => self.poll_candidate(now),
                Role::Prospective => self.poll_prospective(now),
                Role::Follower => self.poll_follower(now),
                Role::Unattached => self.poll_unattached(now),
                Role::Resigned => self.poll_resigned(now),
            }
            if (self.role(), self.epoch()) == before {
                break;
            }
        }
    }

    fn poll_leader(&mut self, now: u64) {
        let single_voter = self.config.voters.len() == 1;
        let begin_interval = self.config.fetch_timeout_ms / 2;
        let (expired, begin_due) = match &self.state {
            State::Leader(l) => (
                !single_voter && now >= l.check_quorum_deadline_ms,
                now >= l.begin_quorum_deadline_ms,
            ),
            _ => return,
        };
        if expired {
            tracing::info!(
                node = self.config.node_id,
                epoch = self.epoch(),
                "a majority of voters has not fetched within the check-quorum timeout; resigning"
            );
            let preferred = self.voters_by_descending_fetch_offset();
            self.transition_to_resigned(preferred, now);
            return;
        }
        self.complete_parked_fetches(now, false);
        if let State::Leader(l) = &mut self.state {
            l.observers
                .retain(|_, (_, last)| now < last.saturating_add(OBSERVER_SESSION_TIMEOUT_MS));
        }
        if begin_due {
            let targets: Vec<NodeId> = match &self.state {
                State::Leader(l) => l
                    .voter_end_offsets
                    .keys()
                    .copied()
                    .filter(|v| !l.acknowledged.contains(v))
                    .collect(),
                _ => Vec::new(),
            };
            let epoch = self.epoch();
            for v in targets {
                if self.requests.can_send(v, now) {
                    let request = Request::BeginQuorumEpoch(BeginQuorumEpochRequest {
                        cluster_id: self.config.cluster_id.clone(),
                        voter_id: Some(v),
                        leader_id: self.config.node_id,
                        leader_epoch: epoch,
                    });
                    self.send_request(v, request, now);
                }
            }
            if let State::Leader(l) = &mut self.state {
                l.begin_quorum_deadline_ms = now.saturating_add(begin_interval);
            }
        }
    }

    fn voters_by_descending_fetch_offset(&self) -> Vec<NodeId> {
        let State::Leader(l) = &self.state else {
            return Vec::new();
        };
        let mut voters: Vec<(Option<i64>, NodeId)> = l
            .voter_end_offsets
            .iter()
            .map(|(&v, &end)| (end, v))
            .collect();
        voters.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        voters.into_iter().map(|(_, v)| v).collect()
    }

    fn poll_candidate(&mut self, now: u64) {
        let majority = self.config.voters.majority();
        let voters = self.config.voters.len();
        let (epoch, granted, rejected, timed_out, backoff, retries) = match &self.state {
            State::Candidate {
                epoch,
                election,
                retries,
                election_deadline_ms,
                backoff_until_ms,
            } => (
                *epoch,
                election.is_granted(majority),
                election.is_rejected(voters, majority),
                now >= *election_deadline_ms,
                *backoff_until_ms,
                *retries,
            ),
            _ => return,
        };
        if let Some(until) = backoff {
            if now >= until {
                self.transition_to_prospective(now);
            }
            return;
        }
        if granted {
            self.transition_to_leader(now);
            return;
        }
        if rejected || timed_out {
            self.start_candidate_backoff(retries, now);
            return;
        }
        let end = self.log.end_offset();
        self.send_votes(epoch, end, false, now);
    }

    fn start_candidate_backoff(&mut self, retries: u32, now: u64) {
        let backoff = self.binary_exponential_backoff(retries);
        if let State::Candidate {
            backoff_until_ms: b @ None,
            ..
        } = &mut self.state
        {
            *b = Some(now.saturating_add(backoff));
        }
    }

    /// Sends (pre-)votes to the voters that have not answered yet.
    fn send_votes(&mut self, epoch: i32, end: OffsetAndEpoch, pre_vote: bool, now: u64) {
        let recorded: BTreeSet<NodeId> = match &self.state {
            State::Candidate { election, .. } | State::Prospective { election, .. } => election
                .granted
                .iter()
                .chain(election.rejected.iter())
                .copied()
                .collect(),
            _ => return,
        };
        let targets: Vec<NodeId> = self
            .config
            .voters
            .ids()
            .filter(|v| !recorded.contains(v) && *v != self.config.node_id)
            .collect();
        for v in targets {
            if self.requests.can_send(v, now) {
                let request = Request::Vote(VoteRequest {
                    cluster_id: self.config.cluster_id.clone(),
                    voter_id: Some(v),
                    replica_epoch: epoch,
                    replica_id: self.config.node_id,
                    last_offset_epoch: end.epoch,
                    last_offset: end.offset,
                    pre_vote,
                });
                self.send_request(v, request, now);
            }
        }
    }

    fn poll_prospective(&mut self, now: u64) {
        let majority = self.config.voters.majority();
        let voters = self.config.voters.len();
        let (epoch, granted, lost) = match &self.state {
            State::Prospective {
                epoch,
                election,
                election_deadline_ms,
                ..
            } => (
                *epoch,
                election.is_granted(majority),
                election.is_rejected(voters, majority) || now >= *election_deadline_ms,
            ),
            _ => return,
        };
        if granted {
            self.transition_to_candidate(now);
        } else if lost {
            self.lose_prospective(now);
        } else {
            let end = self.log.end_offset();
            self.send_votes(epoch, end, true, now);
        }
    }

    fn poll_follower(&mut self, now: u64) {
        let (leader, expired) = match &self.state {
            State::Follower {
                leader_id,
                fetch_deadline_ms,
                ..
            } => (*leader_id, now >= *fetch_deadline_ms),
            _ => return,
        };
        if expired {
            if self.config.is_voter() {
                tracing::info!(
                    node = self.config.node_id,
                    leader,
                    "fetch timeout; asking for pre-votes"
                );
                self.transition_to_prospective(now);
            } else {
                self.send_fetch_to_any_voter(None, now);
            }
            return;
        }
        if self.requests.is_backing_off(leader, now) {
            // The leader may be gone: ask another voter who leads.
            self.send_fetch_to_any_voter(Some(leader), now);
        } else if !self.requests.has_any_inflight() {
            match &self.state {
                State::Follower {
                    fetching_snapshot: Some(id),
                    ..
                } => {
                    let id = *id;
                    self.send_fetch_snapshot(leader, id, now);
                }
                _ => self.send_fetch(leader, now),
            }
        }
    }

    fn send_fetch_snapshot(&mut self, to: NodeId, id: OffsetAndEpoch, now: u64) {
        if !self.requests.can_send(to, now) {
            return;
        }
        let Some((pending, position)) = self.log.fetched_snapshot() else {
            // The log lost the pending snapshot (it cannot in one lifetime): start over.
            self.abandon_snapshot_fetch(now);
            return;
        };
        if pending != id {
            self.abandon_snapshot_fetch(now);
            return;
        }
        let request = Request::FetchSnapshot(FetchSnapshotRequest {
            cluster_id: self.config.cluster_id.clone(),
            replica_id: self.config.node_id,
            max_bytes: i32::try_from(self.config.max_fetch_snapshot_bytes).unwrap_or(i32::MAX),
            current_leader_epoch: self.epoch(),
            snapshot_id: id,
            position: i64::try_from(position).unwrap_or(i64::MAX),
        });
        self.send_request(to, request, now);
    }

    fn poll_unattached(&mut self, now: u64) {
        let expired = match &self.state {
            State::Unattached {
                election_deadline_ms,
                ..
            } => now >= *election_deadline_ms,
            _ => return,
        };
        if expired && self.config.is_voter() {
            self.transition_to_prospective(now);
            return;
        }
        if !self.requests.has_any_inflight() {
            self.send_fetch_to_any_voter(None, now);
        }
    }

    fn poll_resigned(&mut self, now: u64) {
        let (epoch, expired, unacked, preferred) = match &self.state {
            State::Resigned {
                epoch,
                election_deadline_ms,
                unacked_voters,
                preferred_successors,
            } => (
                *epoch,
                now >= *election_deadline_ms,
                unacked_voters.clone(),
                preferred_successors.clone(),
            ),
            _ => return,
        };
        if expired {
            self.transition_to_unattached(epoch.saturating_add(1), now);
            return;
        }
        for v in unacked {
            if self.requests.can_send(v, now) {
                let request = Request::EndQuorumEpoch(EndQuorumEpochRequest {
                    cluster_id: self.config.cluster_id.clone(),
                    leader_id: self.config.node_id,
                    leader_epoch: epoch,
                    preferred_successors: preferred.clone(),
                });
                self.send_request(v, request, now);
            }
        }
    }

    fn send_fetch_to_any_voter(&mut self, exclude: Option<NodeId>, now: u64) {
        let local = self.config.node_id;
        let candidates: Vec<NodeId> = self
            .config
            .voters
            .ids()
            .filter(|&v| v != local && Some(v) != exclude && self.requests.can_send(v, now))
            .collect();
        if candidates.is_empty() {
            return;
        }
        let pick = candidates[self.rng.below(candidates.len() as u64) as usize];
        self.send_fetch(pick, now);
    }

    fn send_fetch(&mut self, to: NodeId, now: u64) {
        if !self.requests.can_send(to, now) {
            return;
        }
        let request = Request::Fetch(FetchRequest {
            cluster_id: self.config.cluster_id.clone(),
            replica_id: self.config.node_id,
            max_wait_ms: i32::try_from(self.config.fetch_max_wait_ms).unwrap_or(i32::MAX),
            current_leader_epoch: self.epoch(),
            fetch_offset: self.log.log_end_offset(),
            last_fetched_epoch: self.log.last_fetched_epoch(),
            high_watermark: self.high_watermark.unwrap_or(-1),
        });
        self.send_request(to, request, now);
    }

    // ----- transitions -----

    fn has_leader(&self) -> bool {
        self.leader_id().is_some()
    }

    /// Kafka's `hasConsistentLeader`.
    fn has_consistent_leader(&self, epoch: i32, leader_id: Option<NodeId>) -> bool {
        if leader_id == Some(self.config.node_id) {
            epoch < self.epoch()
                || (epoch == self.epoch() && matches!(self.role(), Role::Leader | Role::Resigned))
        } else {
            epoch != self.epoch()
                || leader_id.is_none()
                || self.leader_id().is_none()
                || leader_id == self.leader_id()
        }
    }

    /// Kafka's `maybeTransition`: follow a newer epoch, or learn the leader of ours.
    fn maybe_transition(&mut self, leader_id: Option<NodeId>, epoch: i32, now: u64) {
        if !self.has_consistent_leader(epoch, leader_id) {
            self.anomaly("message names another leader for our epoch");
            return;
        }
        if epoch > self.epoch() {
            match leader_id {
                Some(l) if l != self.config.node_id => self.transition_to_follower(epoch, l, now),
                Some(_) => self.anomaly("a newer epoch names this node leader"),
                None => self.transition_to_unattached(epoch, now),
            }
        } else if let Some(l) = leader_id {
            if l != self.config.node_id && !self.has_leader() {
                self.transition_to_follower(epoch, l, now);
            }
        }
    }

    fn transition_to_unattached(&mut self, epoch: i32, now: u64) {
        let current = self.epoch();
        let from_prospective = self.role() == Role::Prospective;
        if epoch < current || (epoch == current && !from_prospective) {
            self.anomaly("invalid transition to Unattached");
            return;
        }
        let timeout = self.random_election_timeout();
        let voter = self.config.is_voter();
        let election_deadline_ms = if !voter {
            u64::MAX
        } else {
            match &self.state {
                State::Candidate {
                    election_deadline_ms,
                    ..
                }
                | State::Unattached {
                    election_deadline_ms,
                    ..
                }
                | State::Resigned {
                    election_deadline_ms,
                    ..
                } => *election_deadline_ms,
                State::Prospective {
                    election,
                    election_deadline_ms,
                    ..
                } if !election
                    .is_rejected(self.config.voters.len(), self.config.voters.majority()) =>
                {
                    *election_deadline_ms
                }
                _ => now.saturating_add(timeout),
            }
        };
        // Within the same epoch (from Prospective) the vote is kept: one vote per epoch.
        let voted_id = if epoch == current {
            self.voted_id()
        } else {
            None
        };
        self.set_state(State::Unattached {
            epoch,
            leader_id: None,
            voted_id,
            election_deadline_ms,
        });
    }

    fn transition_to_follower(&mut self, epoch: i32, leader: NodeId, now: u64) {
        let current = self.epoch();
        if leader == self.config.node_id || !self.config.voters.contains(leader) {
            self.anomaly("leader is this node or not a voter");
            return;
        }
        if epoch < current
            || (epoch == current && matches!(self.role(), Role::Follower | Role::Leader))
        {
            self.anomaly("invalid transition to Follower");
            return;
        }
        let voted_id = if epoch == current {
            self.voted_id()
        } else {
            None
        };
        self.set_state(State::Follower {
            epoch,
            leader_id: leader,
            voted_id,
            fetch_deadline_ms: now.saturating_add(self.config.fetch_timeout_ms),
            has_fetched_from_leader: false,
            fetching_snapshot: None,
        });
    }

    fn transition_to_prospective(&mut self, now: u64) {
        if !self.config.is_voter() || matches!(self.role(), Role::Leader | Role::Prospective) {
            self.anomaly("invalid transition to Prospective");
            return;
        }
        let retries = match &self.state {
            State::Candidate { retries, .. } => retries.saturating_add(1),
            _ => 1,
        };
        let timeout = self.random_election_timeout();
        let (leader_id, voted_id) = match self.role() {
            Role::Candidate | Role::Resigned => (None, self.voted_id()),
            _ => (self.leader_id(), self.voted_id()),
        };
        self.set_state(State::Prospective {
            epoch: self.epoch(),
            leader_id,
            voted_id,
            election: EpochElection::new(self.config.node_id),
            retries,
            election_deadline_ms: now.saturating_add(timeout),
        });
    }

    /// A prospective that lost (or timed out) its pre-vote goes back to following the leader it
    /// knew, or to Unattached.
    fn lose_prospective(&mut self, now: u64) {
        let (epoch, leader) = match &self.state {
            State::Prospective {
                epoch, leader_id, ..
            } => (*epoch, *leader_id),
            _ => return,
        };
        match leader {
            Some(l) => self.transition_to_follower(epoch, l, now),
            None => self.transition_to_unattached(epoch, now),
        }
    }

    fn transition_to_candidate(&mut self, now: u64) {
        let retries = match &self.state {
            State::Prospective { retries, .. } => *retries,
            _ => {
                self.anomaly("invalid transition to Candidate");
                return;
            }
        };
        let timeout = self.random_election_timeout();
        let epoch = self.epoch().saturating_add(1);
        tracing::info!(
            node = self.config.node_id,
            epoch,
            "pre-vote won; standing as candidate"
        );
        self.set_state(State::Candidate {
            epoch,
            election: EpochElection::new(self.config.node_id),
            retries,
            election_deadline_ms: now.saturating_add(timeout),
            backoff_until_ms: None,
        });
    }

    fn transition_to_leader(&mut self, now: u64) {
        let (epoch, granting) = match &self.state {
            State::Candidate {
                epoch, election, ..
            } if election.is_granted(self.config.voters.majority()) => {
                (*epoch, election.granted.clone())
            }
            _ => {
                self.anomaly("invalid transition to Leader");
                return;
            }
        };
        let local = self.config.node_id;
        let epoch_start_offset = self.log.log_end_offset();
        let leader = LeaderState {
            epoch,
            epoch_start_offset,
            voter_end_offsets: self
                .config
                .voters
                .ids()
                .filter(|&v| v != local)
                .map(|v| (v, None))
                .collect(),
            voter_fetch_times: BTreeMap::new(),
            observers: BTreeMap::new(),
            granting_voters: granting,
            fetched_voters: BTreeSet::new(),
            check_quorum_deadline_ms: now.saturating_add(self.config.check_quorum_timeout_ms()),
            begin_quorum_deadline_ms: now,
            acknowledged: BTreeSet::new(),
            epoch_start_pending: true,
        };
        tracing::info!(node = local, epoch, epoch_start_offset, "elected leader");
        // The leader does not keep the high watermark it knew: it only exposes one once a
        // majority holds a record of its own epoch (Kafka's `transitionToLeader`).
        self.high_watermark = None;
        self.set_state(State::Leader(Box::new(leader)));
        // The LeaderChange record is appended at the start of the next call, once the driver
        // has made the Leader election state durable (see `begin_epoch_if_pending`).
    }

    /// Appends the LeaderChange control record of a new leader's epoch: the high watermark can
    /// only advance past a record of the leader's epoch, so one is written at once.
    ///
    /// This runs at the start of the call after the one that elected the leader, never in the
    /// same one: log writes reach the log (and may reach the disk) at once, while the
    /// `PersistElectionState` of the election is only complete once the driver has executed
    /// the actions of that call. Were the record appended in the same call, a crash that tore
    /// the persist could restart the node as Candidate of an epoch it already wrote records in
    /// (found by the simulator, seed 1000204 with 5 voters and 2 observers).
    fn begin_epoch_if_pending(&mut self, now: u64) {
        let (epoch, epoch_start_offset, granting) = match &self.state {
            State::Leader(l) if l.epoch_start_pending => (
                l.epoch,
                l.epoch_start_offset,
                l.granting_voters.iter().copied().collect::<Vec<_>>(),
            ),
            _ => return,
        };
        if let State::Leader(l) = &mut self.state {
            l.epoch_start_pending = false;
        }
        let local = self.config.node_id;
        let voters: Vec<NodeId> = self.config.voters.ids().collect();
        let batch = build_leader_change_batch(
            epoch_start_offset,
            epoch,
            millis(now),
            local,
            &voters,
            &granting,
        );
        match self.log.append_as_leader(batch, epoch) {
            Ok(_) => {
                self.actions.push(Action::FlushLog {
                    end_offset: self.log.log_end_offset(),
                });
                self.on_leader_append(now);
            }
            Err(e) => {
                tracing::error!(node = local, error = %e, "appending the LeaderChange record; resigning");
                self.transition_to_resigned(Vec::new(), now);
            }
        }
    }

    fn transition_to_resigned(&mut self, preferred_successors: Vec<NodeId>, now: u64) {
        let epoch = match &self.state {
            State::Leader(l) => l.epoch,
            _ => {
                self.anomaly("invalid transition to Resigned");
                return;
            }
        };
        let timeout = self.random_election_timeout();
        let local = self.config.node_id;
        self.set_state(State::Resigned {
            epoch,
            election_deadline_ms: now.saturating_add(timeout),
            unacked_voters: self.config.voters.ids().filter(|&v| v != local).collect(),
            preferred_successors,
        });
    }

    fn set_state(&mut self, new: State) {
        let was_leader = self.role() == Role::Leader;
        tracing::debug!(node = self.config.node_id, from = ?self.role(), to = ?new.role(), epoch = new.epoch(), "transition");
        self.state = new;
        self.requests.reset_all();
        // Any new state abandons a snapshot being fetched (Kafka closes the writer with the
        // FollowerState): a new epoch may have another leader and another latest snapshot.
        if self.log.fetched_snapshot().is_some() {
            self.log.abort_fetched_snapshot();
        }
        self.after_transition();
        if was_leader && self.role() != Role::Leader {
            // Parked fetches are answered now, with the error of the new state.
            self.complete_parked_fetches(0, true);
        }
    }

    /// Persists a changed election state and announces a changed leader.
    fn after_transition(&mut self) {
        let election = self.election_state();
        if election != self.persisted {
            if election.epoch < self.persisted.epoch {
                self.anomaly("epoch going backwards");
            }
            self.persisted = election;
            self.actions.push(Action::PersistElectionState(election));
        }
        let leader = (self.epoch(), self.leader_id());
        if self.notified_leader != Some(leader) {
            self.notified_leader = Some(leader);
            self.actions.push(Action::LeaderChange {
                epoch: leader.0,
                leader_id: leader.1,
            });
        }
    }

    // ----- helpers -----

    fn send_request(&mut self, to: NodeId, request: Request, now: u64) {
        self.next_correlation_id = self.next_correlation_id.wrapping_add(1);
        let correlation_id = self.next_correlation_id;
        self.requests.on_sent(to, correlation_id, now);
        self.actions.push(Action::Send {
            to,
            message: Message::Request {
                correlation_id,
                request,
            },
        });
    }

    fn send_response(&mut self, to: NodeId, correlation_id: i32, response: Response) {
        self.actions.push(Action::Send {
            to,
            message: Message::Response {
                correlation_id,
                response,
            },
        });
    }

    fn random_election_timeout(&mut self) -> u64 {
        random_timeout(&mut self.rng, self.config.election_timeout_ms)
    }

    /// Kafka's `binaryExponentialElectionBackoffMs`.
    fn binary_exponential_backoff(&mut self, retries: u32) -> u64 {
        let exp = retries.clamp(1, 21) - 1;
        let draws = 2u64 << exp;
        (RETRY_BACKOFF_BASE_MS * self.rng.below(draws)).min(self.config.election_backoff_max_ms)
    }

    /// Counts one more occurrence of a repeated error `kind`; returns the count when it is the
    /// 1st, 2nd, 4th, 8th, ... occurrence, the ones worth logging.
    fn count_repeated(&mut self, kind: &'static str) -> Option<u64> {
        let count = self.anomaly_counts.entry(kind).or_insert(0);
        *count += 1;
        count.is_power_of_two().then_some(*count)
    }

    /// Records an anomaly: a message or transition a correct quorum never produces. Logged at
    /// error level the 1st, 2nd, 4th, 8th, ... time each kind occurs (a misconfigured cluster
    /// repeats the same anomaly many times a second), with the likely cause.
    fn anomaly(&mut self, what: &'static str) {
        self.anomalies += 1;
        self.last_anomaly = Some(format!(
            "{what} (node {} {:?} in epoch {}, leader {:?})",
            self.config.node_id,
            self.role(),
            self.epoch(),
            self.leader_id()
        ));
        if let Some(count) = self.count_repeated(what) {
            let node = self.config.node_id;
            tracing::error!(
                node,
                epoch = self.epoch(),
                role = ?self.role(),
                occurrences = count,
                "{what}: {}",
                anomaly_cause(what, node)
            );
        }
    }
}

/// The likely cause of an anomaly, for the operator.
fn anomaly_cause(what: &str, node: NodeId) -> String {
    match what {
        "message from itself"
        | "message names another leader for our epoch"
        | "a newer epoch names this node leader"
        | "leader is this node or not a voter" => format!(
            "another process may be running with node.id={node}, or the nodes disagree on \
             controller.quorum.voters; every node needs its own node.id and the same voters"
        ),
        "leader asked to truncate below the high watermark"
        | "leader's high watermark is below ours" => format!(
            "node {node}'s metadata log may come from another cluster or have been restored \
             from an older copy; check cluster.id in meta.properties of every node"
        ),
        _ => "logged with its occurrence count (1st, 2nd, 4th, ...)".to_string(),
    }
}

fn random_timeout(rng: &mut Rng, base_ms: u64) -> u64 {
    if base_ms == 0 {
        0
    } else {
        base_ms + rng.below(base_ms)
    }
}

fn deadline(voter: bool, now: u64, timeout: u64) -> u64 {
    if voter {
        now.saturating_add(timeout)
    } else {
        u64::MAX
    }
}

fn millis(now_ms: u64) -> i64 {
    i64::try_from(now_ms).unwrap_or(i64::MAX)
}
