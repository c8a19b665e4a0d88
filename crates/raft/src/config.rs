//! The quorum configuration, with Kafka's property names and defaults (`QuorumConfig.java`).

use crate::types::{NodeId, VoterSet};

/// Largest batch a leader appends and largest Fetch response (bytes): Kafka's
/// `KafkaRaftClient.MAX_BATCH_SIZE_BYTES` / `MAX_FETCH_SIZE_BYTES`, 8 MiB.
pub const MAX_BATCH_SIZE_BYTES: usize = 8 * 1024 * 1024;

/// Largest FetchSnapshot chunk a follower asks for and a leader returns (bytes): Kafka's
/// `KafkaRaftClient` sends `MAX_FETCH_SIZE_BYTES` (8 MiB) as `MaxBytes`; there is no config.
pub const MAX_FETCH_SNAPSHOT_BYTES: usize = MAX_BATCH_SIZE_BYTES;

/// How long a leader parks a Fetch with no new data (ms): Kafka's
/// `KafkaRaftClient.MAX_FETCH_WAIT_MS`, 500.
pub const MAX_FETCH_WAIT_MS: u64 = 500;

/// Base of the binary exponential election backoff (ms): Kafka's `RETRY_BACKOFF_BASE_MS`.
pub const RETRY_BACKOFF_BASE_MS: u64 = 100;

/// The leader resigns when a majority of voters has not fetched within this factor of
/// `controller.quorum.fetch.timeout.ms` (Kafka's `LeaderState.CHECK_QUORUM_TIMEOUT_FACTOR`).
pub const CHECK_QUORUM_TIMEOUT_FACTOR: f64 = 1.5;

/// An observer that has not fetched for this long (ms) is forgotten by the leader
/// (Kafka's `LeaderState.OBSERVER_SESSION_TIMEOUT_MS`).
pub const OBSERVER_SESSION_TIMEOUT_MS: u64 = 300_000;

/// A rule of the protocol deliberately broken, so that the simulator's checker can be shown to
/// catch it (`tests/sim.rs`). Never set outside that test: every variant makes the quorum unsafe.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokenRule {
    /// Grant a standard Vote to any candidate with an up-to-date log, even after voting for
    /// another one in the same epoch (breaks "one vote per epoch").
    GrantTwoVotesPerEpoch,
    /// Let the leader advance the high watermark on records of older epochs, without first
    /// replicating a record of its own epoch to a majority (breaks Raft's commit rule, §5.4.2).
    CommitOldEpochRecords,
    /// Grant votes without comparing logs (breaks "the log of a winner is at least as up to
    /// date as a majority's").
    IgnoreLogUpToDate,
}

/// Configuration of one node of the quorum.
#[derive(Debug, Clone)]
pub struct QuorumConfig {
    /// This node's `node.id`. A node outside [`QuorumConfig::voters`] is an observer.
    pub node_id: NodeId,
    /// The voters (`controller.quorum.voters`, static: `kraft.version` 0).
    pub voters: VoterSet,
    /// The cluster id sent in every request; a request with another (non-null) cluster id is
    /// answered with INCONSISTENT_CLUSTER_ID. `None` sends null and accepts any.
    pub cluster_id: Option<String>,
    /// `controller.quorum.election.timeout.ms` (default 1000): a voter without a leader starts
    /// an election after a random time in `[t, 2t)`.
    pub election_timeout_ms: u64,
    /// `controller.quorum.fetch.timeout.ms` (default 2000): a follower that has not heard from
    /// its leader for this long starts an election (voters) or asks another voter (observers).
    pub fetch_timeout_ms: u64,
    /// `controller.quorum.election.backoff.max.ms` (default 1000): cap of the election backoff.
    pub election_backoff_max_ms: u64,
    /// `controller.quorum.request.timeout.ms` (default 2000): an unanswered request is given up.
    pub request_timeout_ms: u64,
    /// `controller.quorum.retry.backoff.ms` (default 20): wait before re-sending to a node whose
    /// request failed or timed out.
    pub retry_backoff_ms: u64,
    /// Longest a follower asks the leader to park a Fetch (ms); Kafka sends 500.
    pub fetch_max_wait_ms: u64,
    /// Largest Fetch response the leader builds (bytes); the first batch is sent whole (KIP-74).
    pub max_fetch_bytes: usize,
    /// Largest batch [`crate::RaftNode::propose`] accepts (bytes, encoded).
    pub max_batch_bytes: usize,
    /// Largest FetchSnapshot chunk (bytes): the `MaxBytes` a follower sends, and the most a
    /// leader returns whatever the request asks. Kafka's fixed 8 MiB
    /// ([`MAX_FETCH_SNAPSHOT_BYTES`]); smaller in tests and the simulator to exercise chunking.
    pub max_fetch_snapshot_bytes: usize,
    /// Bound on Fetch requests parked at the leader at once; one more is answered at once.
    pub max_parked_fetches: usize,
    /// Bound on observers the leader tracks; fetches from more are served but not tracked.
    pub max_tracked_observers: usize,
    /// Test only, see [`BrokenRule`].
    #[doc(hidden)]
    pub broken_rule: Option<BrokenRule>,
}

impl QuorumConfig {
    /// A configuration with Kafka's defaults.
    pub fn new(node_id: NodeId, voters: VoterSet) -> Self {
        Self {
            node_id,
            voters,
            cluster_id: None,
            election_timeout_ms: 1000,
            fetch_timeout_ms: 2000,
            election_backoff_max_ms: 1000,
            request_timeout_ms: 2000,
            retry_backoff_ms: 20,
            fetch_max_wait_ms: MAX_FETCH_WAIT_MS,
            max_fetch_bytes: MAX_BATCH_SIZE_BYTES,
            max_batch_bytes: MAX_BATCH_SIZE_BYTES,
            max_fetch_snapshot_bytes: MAX_FETCH_SNAPSHOT_BYTES,
            max_parked_fetches: 1024,
            max_tracked_observers: 1024,
            broken_rule: None,
        }
    }

    /// True when this node votes.
    pub fn is_voter(&self) -> bool {
        self.voters.contains(self.node_id)
    }

    /// The check-quorum interval (ms): `fetch_timeout_ms * 1.5`.
    pub fn check_quorum_timeout_ms(&self) -> u64 {
        (self.fetch_timeout_ms as f64 * CHECK_QUORUM_TIMEOUT_FACTOR) as u64
    }
}
