//! The production driver of the quorum (KIP-595): [`RaftManager`] runs one [`RaftNode`] on
//! `<metadata.log.dir>/__cluster_metadata-0/` ([`KafkaMetadataLog`] and
//! [`FileQuorumStateStore`]) and executes its [`Action`]s, as Kafka's `KafkaRaftClient` poll
//! thread does.
//!
//! - **One thread owns the node.** The node, its log and the `quorum-state` store live on a
//!   dedicated OS thread (`raft-<node id>`) running a current-thread tokio runtime, so the
//!   barrier writes (`quorum-state`, log fsync) are plain blocking calls that never hold an
//!   async worker of the caller's runtime, and actions run strictly in the order the node
//!   returned them: [`Action::PersistElectionState`] completes (written, fsynced, renamed)
//!   before anything after it, [`Action::FlushLog`] fsyncs the log before anything after it.
//!   A failed barrier write stops the driver (Kafka's client dies on a storage error): every
//!   waiting call fails with [`DriverError::Shutdown`] and no later action runs.
//! - **Only voter.** A node that is the only voter gets an election timeout of
//!   [`ONLY_VOTER_ELECTION_TIMEOUT_MS`], so it leads at once as Kafka's does.
//! - **Clock.** Monotonic, ms since the manager started ([`std::time::Instant`]).
//! - **Ticks.** The core exposes no next deadline, so the thread ticks the node every
//!   [`TICK_INTERVAL_MS`] (10 ms) and after every command; timers therefore fire up to 10 ms
//!   late, against Kafka's 1000 ms and 2000 ms timeouts.
//! - **Outbound** requests go to a [`Transport`] (the socket one is [`transport::SocketTransport`]);
//!   their responses come back through the [`InboundSender`] given to it.
//! - **Inbound** requests ([`RaftManager::handle_request`], or
//!   [`RaftManager::handle_kafka_request`] for `kafka-protocol` messages) get a driver-local
//!   correlation id; the node's answer (at once, or later for a parked Fetch) is routed back to
//!   the waiting caller. Observers (brokers that do not vote) fetch the same way.
//! - **Commits.** [`Action::HighWatermark`] moves the [`RaftManager::high_watermark`] watch and
//!   completes the proposals it covers, after checking that the log still holds the batch
//!   proposed (same base offset and epoch); a change of epoch fails every pending proposal with
//!   [`DriverError::NotLeader`] (as Kafka's controller fails its pending writes when it loses
//!   leadership: such a batch may still commit later). [`RaftManager::committed`] reads the
//!   committed data batches from the log (control batches skipped).
//! - **Shutdown** ([`RaftManager::shutdown`]): a leader resigns first (EndQuorumEpoch to the
//!   voters, Kafka's graceful shutdown), then the log is closed cleanly
//!   ([`KafkaMetadataLog::close`]).

pub mod transport;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use gregor_protocol::batch::BatchHeader;
use gregor_protocol::error::ErrorCode;
use gregor_protocol::records::decode_records;
use kafka_protocol::messages::{
    self as kp, ApiKey, BrokerId, RequestKind, ResponseKind, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot, watch};

use crate::config::QuorumConfig;
use crate::convert;
use crate::log::RaftLog;
use crate::message::{Message, Request, Response};
use crate::metadata_log::{KafkaMetadataLog, MetadataLogConfig};
use crate::node::{Action, ProposeError, QuorumDescription, RaftNode};
use crate::quorum_state::FileQuorumStateStore;
use crate::rng::Rng;
use crate::types::{NodeId, OffsetAndEpoch, VoterEndpoints};

/// How often the driver thread ticks the node (ms) when no command arrives.
pub const TICK_INTERVAL_MS: u64 = 10;

/// Election timeout (ms) of a node that is the only voter: it has nobody to wait for, and
/// Kafka elects it at once.
pub const ONLY_VOTER_ELECTION_TIMEOUT_MS: u64 = 1;

/// Beyond the longer of `controller.quorum.request.timeout.ms` and the Fetch long-poll, how
/// long (ms) an inbound request may wait for the node's answer before its caller is released.
pub const PENDING_REQUEST_GRACE_MS: u64 = 1000;

/// Commands that may wait in the driver's queue (proposals, inbound requests and responses,
/// reads); a full queue makes async callers wait and drops responses from the transport (the
/// node times the request out and retries, as for a lost message).
pub const COMMAND_QUEUE_CAPACITY: usize = 1024;

/// Largest read of committed batches per [`CommittedStream`] step (bytes; the first batch is
/// returned whole, KIP-74).
pub const COMMITTED_READ_BYTES: usize = 1024 * 1024;

/// How often the driver applies the metadata log's retention (`maybeClean`) and removes
/// deleted segment files, in ms (Kafka's raft client checks on its poll loop as well).
pub const CLEAN_INTERVAL_MS: u64 = 1_000;

/// Errors of the driver's calls.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DriverError {
    /// This node does not lead (or stopped leading before the batch committed).
    #[error("not the leader of epoch {epoch} (leader {leader_id:?})")]
    NotLeader {
        /// The leader this node knows, if any.
        leader_id: Option<NodeId>,
        /// This node's epoch.
        epoch: i32,
    },
    /// The node refused the proposal (empty, too large, or the log refused the append).
    #[error("proposal refused: {0}")]
    Refused(String),
    /// Reading the log failed.
    #[error("metadata log read failed: {0}")]
    Read(String),
    /// Writing the log failed (a full `metadata.log.dir`, say): the proposal is not in the
    /// log. Appends fail while the directory is offline ([`RaftManager::metadata_dir_health`]).
    #[error("{0}")]
    Storage(String),
    /// The driver stopped (shutdown, or a storage error on a barrier write).
    #[error("the raft driver is stopped")]
    Shutdown,
}

/// Opening the driver failed.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// `__cluster_metadata-0` could not be opened.
    #[error(transparent)]
    Log(#[from] crate::metadata_log::StorageError),
    /// `quorum-state` could not be read.
    #[error(transparent)]
    QuorumState(#[from] crate::quorum_state::QuorumStateStoreError),
    /// The driver thread could not be started.
    #[error("cannot start the raft driver thread: {0}")]
    Thread(std::io::Error),
}

/// The known leader and epoch (Kafka's `LeaderAndEpoch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LeaderAndEpoch {
    /// The epoch.
    pub epoch: i32,
    /// Its leader, if known.
    pub leader_id: Option<NodeId>,
}

/// One committed data batch of `__cluster_metadata-0`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedRecords {
    /// Offset of the first record.
    pub base_offset: i64,
    /// Offset of the last record.
    pub last_offset: i64,
    /// `partitionLeaderEpoch` of the batch.
    pub epoch: i32,
    /// The record values, in order (a null value is empty).
    pub values: Vec<Bytes>,
}

/// A snapshot of the state machine, read whole for loading (KIP-630): the values of its data
/// records in order (control records such as SnapshotHeader/Footer, KRaftVersion and
/// KRaftVoters are left out). The state it holds is everything committed below `id.offset`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedSnapshot {
    /// End offset and epoch of the snapshot.
    pub id: OffsetAndEpoch,
    /// The record values, in order (a null value is empty).
    pub values: Vec<Bytes>,
}

/// What a [`CommittedStream`] delivers: the next committed data batch, or a snapshot that
/// replaces everything the reader applied (Kafka's `handleCommit` and `handleLoadSnapshot`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Committed {
    /// A committed data batch, the next one after what the reader had.
    Batch(CommittedRecords),
    /// The latest snapshot: the reader drops its state and loads this one; batches from
    /// `id.offset` on follow. Delivered first when the log has a snapshot past the stream's
    /// start, and again whenever the log no longer holds the next batch the reader needs (a
    /// snapshot fetched from the leader replaced it, `Action::SnapshotInstalled`).
    Snapshot(LoadedSnapshot),
}

impl Committed {
    /// The batch, or None for a snapshot.
    pub fn into_batch(self) -> Option<CommittedRecords> {
        match self {
            Committed::Batch(b) => Some(b),
            Committed::Snapshot(_) => None,
        }
    }
}

/// Where the transport hands responses (and, for in-process tests, anything addressed to this
/// node) back to the driver.
#[derive(Clone)]
pub struct InboundSender {
    tx: mpsc::Sender<Command>,
}

impl InboundSender {
    /// Delivers `message` from `from`. Responses only: requests go through
    /// [`RaftManager::handle_request`] so that their answer can be routed back. Dropped when
    /// the driver's queue is full or it stopped (the node retries, as for a lost message).
    pub fn deliver(&self, from: NodeId, message: Message) {
        let _ = self.tx.try_send(Command::Inbound { from, message });
    }
}

/// Sends the node's outbound requests. Must not block; a message it cannot send is dropped
/// (the node's request timeout and retry cover it).
pub trait Transport: Send + Sync + 'static {
    /// Sends `message` (a request) to voter `to`.
    fn send(&self, to: NodeId, message: Message);
    /// Stops (closes connections). Called once, when the driver stops.
    fn close(&self) {}
}

/// Configuration of a [`RaftManager`].
#[derive(Debug, Clone)]
pub struct RaftManagerConfig {
    /// The quorum settings (node id, voters, timeouts).
    pub quorum: QuorumConfig,
    /// `metadata.log.dir`: the directory holding `__cluster_metadata-0/`.
    pub metadata_log_dir: PathBuf,
    /// Segment and retention settings of the log.
    pub log: MetadataLogConfig,
    /// Each voter's controller endpoint (`controller.quorum.voters`), for DescribeQuorum v2's
    /// `Nodes`.
    pub voter_endpoints: VoterEndpoints,
    /// Name of the controller listener (`controller.listener.names`' first), for DescribeQuorum.
    pub controller_listener_name: String,
}

enum Command {
    Propose {
        values: Vec<Bytes>,
        reply: oneshot::Sender<Result<i64, DriverError>>,
    },
    Request {
        from: NodeId,
        request: Request,
        reply: oneshot::Sender<Response>,
    },
    Inbound {
        from: NodeId,
        message: Message,
    },
    Describe {
        reply: oneshot::Sender<Option<(QuorumDescription, u64)>>,
    },
    Read {
        from: i64,
        /// Answer with the latest snapshot when it ends past `from` even if the log still
        /// holds `from` (a stream's first read).
        snapshot_first: bool,
        reply: oneshot::Sender<Result<ReadOutcome, DriverError>>,
    },
    WriteSnapshot {
        id: OffsetAndEpoch,
        values: Vec<Bytes>,
        reply: oneshot::Sender<Result<bool, DriverError>>,
    },
    Shutdown {
        graceful: bool,
        reply: oneshot::Sender<()>,
    },
}

/// The answer to a committed-stream read.
enum ReadOutcome {
    /// Whole batches from the offset read, and the high watermark at the time.
    Batches(Bytes, i64),
    /// The latest snapshot, to load before the batches after it.
    Snapshot(LoadedSnapshot),
}

/// The running quorum member. Cheap to share (`Arc`); see the module docs.
pub struct RaftManager {
    node_id: NodeId,
    config: RaftManagerConfig,
    commands: mpsc::Sender<Command>,
    leader: watch::Receiver<LeaderAndEpoch>,
    high_watermark: watch::Receiver<i64>,
    log_end_offset: watch::Receiver<i64>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Why the driver stopped on its own (a storage error), once it has.
    failure: Arc<Mutex<Option<String>>>,
    /// Becomes true when the driver stops on its own ([`RaftManager::stopped_on_failure`]).
    failed: watch::Receiver<bool>,
    /// The health of `metadata.log.dir` as the log's writes find it.
    metadata_dir_health: Arc<gregor_log::LogDirHealth>,
}

impl std::fmt::Debug for RaftManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftManager")
            .field("node_id", &self.node_id)
            .finish()
    }
}

impl RaftManager {
    /// Opens the log and `quorum-state` and starts the driver thread. `transport` is built
    /// from the [`InboundSender`] its responses go to.
    ///
    /// # Errors
    /// [`StartError`] naming the file that cannot be opened or read.
    pub fn start<T: Transport>(
        config: RaftManagerConfig,
        transport: impl FnOnce(InboundSender) -> T,
    ) -> Result<Arc<Self>, StartError> {
        let log = KafkaMetadataLog::open(&config.metadata_log_dir, config.log.clone())?;
        let metadata_dir_health = log.dir_health();
        let store = FileQuorumStateStore::new(log.dir());
        let stored = store.read()?.map(|(state, _voters)| state);
        let (tx, rx) = mpsc::channel(COMMAND_QUEUE_CAPACITY);
        let transport = transport(InboundSender { tx: tx.clone() });
        let (leader_tx, leader_rx) = watch::channel(LeaderAndEpoch::default());
        let (hw_tx, hw_rx) = watch::channel(-1i64);
        let (leo_tx, leo_rx) = watch::channel(log.log_end_offset());
        let node_id = config.quorum.node_id;
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ (u64::from(std::process::id()) << 32)
            ^ node_id as u64;
        let mut quorum = config.quorum.clone();
        if quorum.voters.len() == 1 && quorum.is_voter() {
            // Kafka's `KafkaRaftClient.initialize` makes an only voter candidate at once; the
            // core waits an election timeout, so it gets the shortest one.
            quorum.election_timeout_ms = ONLY_VOTER_ELECTION_TIMEOUT_MS;
        }
        let failure: Arc<Mutex<Option<String>>> = Arc::default();
        let driver_failure = failure.clone();
        let (failed_tx, failed) = watch::channel(false);
        let thread = std::thread::Builder::new()
            .name(format!("raft-{node_id}"))
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build()
                {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::error!(error = %e, "raft driver runtime failed to start");
                        return;
                    }
                };
                let started = Instant::now();
                let (node, actions) = RaftNode::new(quorum, log, stored, Rng::new(seed), 0);
                let mut driver = Driver {
                    node,
                    store,
                    transport,
                    started,
                    leader: leader_tx,
                    high_watermark: hw_tx,
                    log_end_offset: leo_tx,
                    last_clean_ms: 0,
                    pending_requests: BTreeMap::new(),
                    next_correlation_id: 0,
                    proposals: BTreeMap::new(),
                    stopped: false,
                    failure: driver_failure,
                    failed: failed_tx,
                };
                driver.execute(actions);
                runtime.block_on(driver.run(rx));
            })
            .map_err(StartError::Thread)?;
        Ok(Arc::new(Self {
            node_id,
            config,
            commands: tx,
            leader: leader_rx,
            high_watermark: hw_rx,
            log_end_offset: leo_rx,
            thread: Mutex::new(Some(thread)),
            failure,
            failed,
            metadata_dir_health,
        }))
    }

    /// Why the driver stopped on its own, if it did: the storage error (a full disk, say)
    /// that made it stop, as a sentence naming the file. `None` while it runs or after a
    /// shutdown that was asked for.
    pub fn failure(&self) -> Option<String> {
        self.failure.lock().clone()
    }

    /// Resolves when the driver stops on its own for a storage error (writing `quorum-state`
    /// or flushing the log failed: a full disk, say), with [`RaftManager::failure`]'s reason;
    /// never while it runs or after a shutdown that was asked for. The node cannot take part
    /// in the quorum any more: Kafka halts the process then, and so does `gregor serve`.
    pub async fn stopped_on_failure(&self) -> String {
        let mut failed = self.failed.clone();
        if failed.wait_for(|f| *f).await.is_err() {
            // The driver is gone without a failure (a shutdown): nothing to report, ever.
            std::future::pending::<()>().await;
        }
        self.failure().unwrap_or_default()
    }

    /// The health of `metadata.log.dir`: full after an append failed for lack of space
    /// (proposals then fail with [`DriverError::Storage`] until
    /// [`gregor_log::LogDirHealth::check`] finds room again), failed after another write error.
    pub fn metadata_dir_health(&self) -> &Arc<gregor_log::LogDirHealth> {
        &self.metadata_dir_health
    }

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.node_id
    }

    /// The configuration.
    pub fn config(&self) -> &RaftManagerConfig {
        &self.config
    }

    /// The known leader and epoch, as it changes.
    pub fn leader_and_epoch(&self) -> watch::Receiver<LeaderAndEpoch> {
        self.leader.clone()
    }

    /// The high watermark (offset after the last committed record; -1 until known), as it
    /// rises.
    pub fn high_watermark(&self) -> watch::Receiver<i64> {
        self.high_watermark.clone()
    }

    async fn call<R>(&self, make: impl FnOnce(oneshot::Sender<R>) -> Command) -> Option<R> {
        let (tx, rx) = oneshot::channel();
        self.commands.send(make(tx)).await.ok()?;
        rx.await.ok()
    }

    /// Appends `values` as one batch in this leader's epoch and resolves once the high
    /// watermark passes its last record while the log still holds it (same offsets, same
    /// epoch). Returns the offset of the last record.
    ///
    /// # Errors
    /// [`DriverError::NotLeader`] when this node does not lead, or stopped leading before the
    /// commit (the batch may still commit under the new leader); [`DriverError::Refused`] for
    /// an empty or too large batch or a failed append; [`DriverError::Shutdown`].
    pub async fn propose(&self, values: Vec<Bytes>) -> Result<i64, DriverError> {
        self.call(|reply| Command::Propose { values, reply })
            .await
            .unwrap_or(Err(DriverError::Shutdown))
    }

    /// Hands an inbound KRaft request from `from` to the node and waits for its answer (a
    /// parked Fetch answers when data arrives, the high watermark moves or `MaxWaitMs` ends).
    ///
    /// # Errors
    /// [`DriverError::Shutdown`] when the driver stops first, when the request claims this
    /// node's own id, or when no answer comes within the longer of the request timeout and
    /// the Fetch long-poll plus [`PENDING_REQUEST_GRACE_MS`].
    pub async fn handle_request(
        &self,
        from: NodeId,
        request: Request,
    ) -> Result<Response, DriverError> {
        self.call(|reply| Command::Request {
            from,
            request,
            reply,
        })
        .await
        .ok_or(DriverError::Shutdown)
    }

    /// Answers a KRaft request as `kafka-protocol` messages at `version`: Vote (52),
    /// BeginQuorumEpoch (53), EndQuorumEpoch (54), Fetch (1) of `__cluster_metadata-0`, and
    /// DescribeQuorum (55, from [`RaftNode::describe_quorum`]; NOT_LEADER_OR_FOLLOWER unless
    /// this node leads). A request that does not name exactly `__cluster_metadata-0` is
    /// answered with INVALID_REQUEST, as Kafka does (DescribeQuorum: UNKNOWN_TOPIC_OR_PARTITION
    /// per partition named). `None` for any other request.
    pub async fn handle_kafka_request(
        &self,
        request: &RequestKind,
        version: i16,
    ) -> Option<ResponseKind> {
        let invalid = ErrorCode::InvalidRequest.code();
        Some(match request {
            RequestKind::Vote(r) => match convert::vote_request_from_kafka(r) {
                Ok(v) => match self.handle_request(v.replica_id, Request::Vote(v)).await {
                    Ok(Response::Vote(resp)) => {
                        ResponseKind::Vote(convert::vote_response_to_kafka(&resp))
                    }
                    _ => ResponseKind::Vote(
                        kp::VoteResponse::default()
                            .with_error_code(ErrorCode::NotLeaderOrFollower.code()),
                    ),
                },
                Err(_) => ResponseKind::Vote(kp::VoteResponse::default().with_error_code(invalid)),
            },
            RequestKind::BeginQuorumEpoch(r) => {
                match convert::begin_quorum_epoch_request_from_kafka(r) {
                    Ok(b) => match self
                        .handle_request(b.leader_id, Request::BeginQuorumEpoch(b))
                        .await
                    {
                        Ok(Response::BeginQuorumEpoch(resp)) => ResponseKind::BeginQuorumEpoch(
                            convert::begin_quorum_epoch_response_to_kafka(&resp),
                        ),
                        _ => ResponseKind::BeginQuorumEpoch(
                            kp::BeginQuorumEpochResponse::default()
                                .with_error_code(ErrorCode::NotLeaderOrFollower.code()),
                        ),
                    },
                    Err(_) => ResponseKind::BeginQuorumEpoch(
                        kp::BeginQuorumEpochResponse::default().with_error_code(invalid),
                    ),
                }
            }
            RequestKind::EndQuorumEpoch(r) => match convert::end_quorum_epoch_request_from_kafka(r)
            {
                Ok(e) => match self
                    .handle_request(e.leader_id, Request::EndQuorumEpoch(e))
                    .await
                {
                    Ok(Response::EndQuorumEpoch(resp)) => ResponseKind::EndQuorumEpoch(
                        convert::end_quorum_epoch_response_to_kafka(&resp),
                    ),
                    _ => ResponseKind::EndQuorumEpoch(
                        kp::EndQuorumEpochResponse::default()
                            .with_error_code(ErrorCode::NotLeaderOrFollower.code()),
                    ),
                },
                Err(_) => ResponseKind::EndQuorumEpoch(
                    kp::EndQuorumEpochResponse::default().with_error_code(invalid),
                ),
            },
            RequestKind::Fetch(r) => match convert::fetch_request_from_kafka(r) {
                Ok(f) => match self.handle_request(f.replica_id, Request::Fetch(f)).await {
                    Ok(Response::Fetch(resp)) => {
                        ResponseKind::Fetch(convert::fetch_response_to_kafka(&resp, version))
                    }
                    _ => ResponseKind::Fetch(
                        kp::FetchResponse::default()
                            .with_error_code(ErrorCode::NotLeaderOrFollower.code()),
                    ),
                },
                Err(_) => {
                    ResponseKind::Fetch(kp::FetchResponse::default().with_error_code(invalid))
                }
            },
            RequestKind::FetchSnapshot(r) => match convert::fetch_snapshot_request_from_kafka(r) {
                Ok(f) => match self
                    .handle_request(f.replica_id, Request::FetchSnapshot(f))
                    .await
                {
                    Ok(Response::FetchSnapshot(resp)) => ResponseKind::FetchSnapshot(
                        convert::fetch_snapshot_response_to_kafka(&resp),
                    ),
                    _ => ResponseKind::FetchSnapshot(
                        kp::FetchSnapshotResponse::default()
                            .with_error_code(ErrorCode::NotLeaderOrFollower.code()),
                    ),
                },
                Err(_) => ResponseKind::FetchSnapshot(
                    kp::FetchSnapshotResponse::default().with_error_code(invalid),
                ),
            },
            RequestKind::DescribeQuorum(r) => {
                ResponseKind::DescribeQuorum(self.describe_quorum(r, version).await)
            }
            _ => return None,
        })
    }

    /// DescribeQuorum (API 55, KIP-595, KIP-836, KIP-853 `Nodes`) answered from the leader's
    /// view at `version`; NOT_LEADER_OR_FOLLOWER at the partition level unless this node leads.
    /// A request naming anything but exactly `__cluster_metadata-0` gets
    /// UNKNOWN_TOPIC_OR_PARTITION in every partition it names (Kafka's
    /// `DescribeQuorumRequest.getPartitionLevelErrorResponse`). Timestamps are wall-clock ms.
    /// Below v2 the answer has no `Nodes` and no replica directory ids (v2 fields that cannot
    /// be left out silently: the response would not encode).
    pub async fn describe_quorum(
        &self,
        r: &kp::DescribeQuorumRequest,
        version: i16,
    ) -> kp::DescribeQuorumResponse {
        let mut response = self.describe_quorum_v2(r).await;
        if version < 2 {
            response.nodes.clear();
            for p in response
                .topics
                .iter_mut()
                .flat_map(|t| t.partitions.iter_mut())
            {
                for replica in p.current_voters.iter_mut().chain(p.observers.iter_mut()) {
                    replica.replica_directory_id = uuid::Uuid::nil();
                }
            }
        }
        response
    }

    async fn describe_quorum_v2(
        &self,
        r: &kp::DescribeQuorumRequest,
    ) -> kp::DescribeQuorumResponse {
        let names_metadata = matches!(r.topics.as_slice(), [t]
            if t.topic_name.0.as_str() == convert::METADATA_TOPIC_NAME
                && matches!(t.partitions.as_slice(), [p] if p.partition_index == convert::METADATA_PARTITION));
        let topic_name = TopicName(StrBytes::from_static_str(convert::METADATA_TOPIC_NAME));
        if !names_metadata {
            let unknown = ErrorCode::UnknownTopicOrPartition;
            return kp::DescribeQuorumResponse::default().with_topics(
                r.topics
                    .iter()
                    .map(|t| {
                        kp::describe_quorum_response::TopicData::default()
                            .with_topic_name(t.topic_name.clone())
                            .with_partitions(
                                t.partitions
                                    .iter()
                                    .map(|p| {
                                        kp::describe_quorum_response::PartitionData::default()
                                            .with_partition_index(p.partition_index)
                                            .with_error_code(unknown.code())
                                            .with_error_message(Some(StrBytes::from_string(
                                                format!(
                                                    "the quorum's only partition is {}-{}",
                                                    convert::METADATA_TOPIC_NAME,
                                                    convert::METADATA_PARTITION
                                                ),
                                            )))
                                    })
                                    .collect(),
                            )
                    })
                    .collect(),
            );
        }
        let partition = |p: kp::describe_quorum_response::PartitionData| {
            kp::DescribeQuorumResponse::default().with_topics(vec![
                kp::describe_quorum_response::TopicData::default()
                    .with_topic_name(topic_name.clone())
                    .with_partitions(vec![p.with_partition_index(convert::METADATA_PARTITION)]),
            ])
        };
        let Some(Some((d, now_ms))) = self.call(|reply| Command::Describe { reply }).await else {
            let le = *self.leader.borrow();
            return partition(
                kp::describe_quorum_response::PartitionData::default()
                    .with_error_code(ErrorCode::NotLeaderOrFollower.code())
                    .with_leader_id(BrokerId(le.leader_id.unwrap_or(-1)))
                    .with_leader_epoch(le.epoch),
            );
        };
        let wall_now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let wall = |t: Option<u64>| {
            t.map_or(-1, |t| {
                wall_now - i64::try_from(now_ms.saturating_sub(t)).unwrap_or(0)
            })
        };
        let replica = |r: &crate::node::ReplicaDescription| {
            kp::describe_quorum_response::ReplicaState::default()
                .with_replica_id(BrokerId(r.replica_id))
                .with_log_end_offset(r.log_end_offset)
                .with_last_fetch_timestamp(wall(r.last_fetch_ms))
                .with_last_caught_up_timestamp(wall(r.last_caught_up_ms))
        };
        let nodes = self
            .config
            .voter_endpoints
            .iter()
            .map(|(&id, (host, port))| {
                kp::describe_quorum_response::Node::default()
                    .with_node_id(BrokerId(id))
                    .with_listeners(vec![kp::describe_quorum_response::Listener::default()
                        .with_name(StrBytes::from_string(
                            self.config.controller_listener_name.clone(),
                        ))
                        .with_host(StrBytes::from_string(host.clone()))
                        .with_port(*port)])
            })
            .collect();
        partition(
            kp::describe_quorum_response::PartitionData::default()
                .with_leader_id(BrokerId(d.leader_id))
                .with_leader_epoch(d.leader_epoch)
                .with_high_watermark(d.high_watermark)
                .with_current_voters(d.voters.iter().map(replica).collect())
                .with_observers(d.observers.iter().map(replica).collect()),
        )
        .with_nodes(nodes)
    }

    /// The offset after the last record in this node's log (committed or not), as of the
    /// driver's last step. On the leader, with no proposal pending, it is the offset the next
    /// proposed batch gets (Kafka's controller uses it as the next write offset).
    pub fn log_end_offset(&self) -> i64 {
        *self.log_end_offset.borrow()
    }

    /// Writes the state machine's snapshot `id` (its state after every committed record below
    /// `id.offset`: `values`, Kafka's snapshot records) through [`RaftLog::write_snapshot`] on
    /// the driver thread, then applies the log's retention
    /// ([`KafkaMetadataLog::maybe_clean`]: `metadata.max.retention.bytes`/`.ms`, whole
    /// segments below a snapshot). Returns false when the log already had that snapshot.
    ///
    /// # Errors
    /// [`DriverError::Refused`] when the log refuses the id (above the high watermark, wrong
    /// epoch, below the log start) or the write fails; [`DriverError::Shutdown`].
    pub async fn write_snapshot(
        &self,
        id: OffsetAndEpoch,
        values: Vec<Bytes>,
    ) -> Result<bool, DriverError> {
        self.call(|reply| Command::WriteSnapshot { id, values, reply })
            .await
            .unwrap_or(Err(DriverError::Shutdown))
    }

    /// The committed data batches from `from_offset` on (control batches skipped), read from
    /// the log up to the high watermark as it rises; first the latest snapshot when it ends
    /// past `from_offset`, and a snapshot again whenever the log was replaced by a fetched one
    /// ([`Committed::Snapshot`]).
    pub fn committed(self: &Arc<Self>, from_offset: i64) -> CommittedStream {
        CommittedStream {
            manager: self.clone(),
            snapshot_first: true,
            next_offset: from_offset,
            position: watch::channel(from_offset).0,
            high_watermark: self.high_watermark.clone(),
            buffered: std::collections::VecDeque::new(),
        }
    }

    /// Stops the driver: a leader resigns (EndQuorumEpoch to the voters), pending calls fail
    /// with [`DriverError::Shutdown`], the transport closes and the log is closed cleanly.
    /// Waits for the driver thread. Idempotent.
    pub async fn shutdown(&self) {
        self.stop(true).await;
    }

    /// Stops the driver as a crash would (Kafka's `kill -9`): no resignation, no clean close
    /// of the log (what was flushed stays). For failover tests and fatal errors.
    pub async fn halt(&self) {
        self.stop(false).await;
    }

    async fn stop(&self, graceful: bool) {
        let _ = self
            .call(|reply| Command::Shutdown { graceful, reply })
            .await;
        let thread = self.thread.lock().take();
        if let Some(t) = thread {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
    }
}

/// The committed data batches of `__cluster_metadata-0` in offset order
/// ([`RaftManager::committed`]).
pub struct CommittedStream {
    manager: Arc<RaftManager>,
    snapshot_first: bool,
    next_offset: i64,
    position: watch::Sender<i64>,
    high_watermark: watch::Receiver<i64>,
    buffered: std::collections::VecDeque<CommittedRecords>,
}

impl CommittedStream {
    /// The offset the next read starts at.
    pub fn next_offset(&self) -> i64 {
        self.next_offset
    }

    /// The offset after the batches the reader has handled (it called [`CommittedStream::next`]
    /// again after them), control batches included, as it moves: the reader is caught up with
    /// a high watermark once this reaches it.
    pub fn position(&self) -> watch::Receiver<i64> {
        self.position.subscribe()
    }

    /// The next committed data batch or snapshot to load; waits for the high watermark to
    /// pass a batch.
    ///
    /// # Errors
    /// [`DriverError::Shutdown`] once the driver stopped; [`DriverError::Read`] when the log
    /// or a snapshot cannot be read or holds an undecodable batch below the high watermark.
    pub async fn next(&mut self) -> Result<Committed, DriverError> {
        loop {
            if let Some(b) = self.buffered.pop_front() {
                return Ok(Committed::Batch(b));
            }
            // Everything returned before was handled by the caller, which is back for more.
            self.position.send_replace(self.next_offset);
            let from = self.next_offset;
            if !self.snapshot_first {
                self.high_watermark
                    .wait_for(|&hw| hw > from)
                    .await
                    .map_err(|_| DriverError::Shutdown)?;
            }
            let snapshot_first = std::mem::take(&mut self.snapshot_first);
            let outcome = self
                .manager
                .call(|reply| Command::Read {
                    from,
                    snapshot_first,
                    reply,
                })
                .await
                .unwrap_or(Err(DriverError::Shutdown))?;
            match outcome {
                ReadOutcome::Batches(bytes, hw) => {
                    self.next_offset = parse_committed(&bytes, from, hw, &mut self.buffered)?;
                }
                ReadOutcome::Snapshot(s) => {
                    self.next_offset = s.id.offset;
                    return Ok(Committed::Snapshot(s));
                }
            }
        }
    }
}

/// Splits `bytes` (whole batches read at `from`) into data batches below `high_watermark`;
/// returns the offset after the last batch consumed.
fn parse_committed(
    bytes: &[u8],
    from: i64,
    high_watermark: i64,
    out: &mut std::collections::VecDeque<CommittedRecords>,
) -> Result<i64, DriverError> {
    let mut pos = 0usize;
    let mut next = from;
    while pos < bytes.len() {
        let header =
            BatchHeader::parse(&bytes[pos..]).map_err(|e| DriverError::Read(e.to_string()))?;
        let size = header.total_size();
        let Some(batch) = bytes.get(pos..pos + size) else {
            return Err(DriverError::Read(format!(
                "batch at offset {} is cut short",
                header.base_offset
            )));
        };
        if header.next_offset() > high_watermark {
            break;
        }
        if header.last_offset() >= next && !header.is_control() {
            let records = decode_records(batch).map_err(|e| {
                DriverError::Read(format!("batch at offset {}: {e}", header.base_offset))
            })?;
            out.push_back(CommittedRecords {
                base_offset: header.base_offset,
                last_offset: header.last_offset(),
                epoch: header.partition_leader_epoch,
                values: records
                    .into_iter()
                    .map(|r| r.value.unwrap_or_default())
                    .collect(),
            });
        }
        next = next.max(header.next_offset());
        pos += size;
    }
    Ok(next)
}

struct PendingProposal {
    epoch: i32,
    base_offset: i64,
    reply: oneshot::Sender<Result<i64, DriverError>>,
}

struct Driver<T: Transport> {
    node: RaftNode<KafkaMetadataLog>,
    store: FileQuorumStateStore,
    transport: T,
    started: Instant,
    leader: watch::Sender<LeaderAndEpoch>,
    high_watermark: watch::Sender<i64>,
    log_end_offset: watch::Sender<i64>,
    /// When (driver ms) retention was last applied.
    last_clean_ms: u64,
    /// Inbound requests waiting for the node's answer, by (requester, local correlation id),
    /// with the time (ms) after which the caller is given up on.
    pending_requests: BTreeMap<(NodeId, i32), (oneshot::Sender<Response>, u64)>,
    next_correlation_id: i32,
    /// Proposals waiting for their commit, by last offset.
    proposals: BTreeMap<i64, PendingProposal>,
    stopped: bool,
    /// Shared with [`RaftManager::failure`].
    failure: Arc<Mutex<Option<String>>>,
    /// Set once the driver stopped on a failure ([`RaftManager::stopped_on_failure`]).
    failed: watch::Sender<bool>,
}

impl<T: Transport> Driver<T> {
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Command>) {
        let mut tick = tokio::time::interval(Duration::from_millis(TICK_INTERVAL_MS));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut shutdown_reply = None;
        let mut graceful = true;
        while !self.stopped {
            tokio::select! {
                command = rx.recv() => match command {
                    Some(Command::Shutdown { graceful: g, reply }) => {
                        shutdown_reply = Some(reply);
                        graceful = g;
                        break;
                    }
                    Some(c) => self.handle(c),
                    None => break,
                },
                _ = tick.tick() => {}
            }
            if self.stopped {
                break;
            }
            let now = self.now_ms();
            let actions = self.node.tick(now);
            self.execute(actions);
            self.maybe_clean();
            // A caller that went away, or a request the node never answered (it always answers;
            // this only bounds the map), is dropped: the caller gets DriverError::Shutdown.
            self.pending_requests
                .retain(|_, (r, until)| !r.is_closed() && now < *until);
        }
        if !self.stopped && graceful {
            let now = self.now_ms();
            let actions = self.node.resign(now);
            self.execute(actions);
        }
        self.fail_all_proposals(DriverError::Shutdown);
        self.pending_requests.clear();
        self.transport.close();
        if graceful {
            if let Err(e) = self.node.log().close() {
                tracing::error!(error = %e, "closing __cluster_metadata-0 failed");
            }
        }
        tracing::info!(node = self.node.node_id(), "raft driver stopped");
        rx.close();
        while let Ok(c) = rx.try_recv() {
            if let Command::Shutdown { reply, .. } = c {
                let _ = reply.send(());
            }
        }
        if let Some(r) = shutdown_reply {
            let _ = r.send(());
        }
    }

    fn handle(&mut self, command: Command) {
        let now = self.now_ms();
        match command {
            Command::Propose { values, reply } => match self.node.propose(&values, now) {
                Ok((proposed, actions)) => {
                    self.proposals.insert(
                        proposed.last_offset,
                        PendingProposal {
                            epoch: proposed.epoch,
                            base_offset: proposed.base_offset,
                            reply,
                        },
                    );
                    self.execute(actions);
                }
                Err(ProposeError::NotLeader { epoch, leader_id }) => {
                    let _ = reply.send(Err(DriverError::NotLeader { leader_id, epoch }));
                }
                Err(ProposeError::Log(crate::log::RaftLogError::Io(e))) => {
                    let _ = reply.send(Err(DriverError::Storage(format!(
                        "appending to {} failed: {e}",
                        self.node.log().dir().display()
                    ))));
                }
                Err(e) => {
                    let _ = reply.send(Err(DriverError::Refused(e.to_string())));
                }
            },
            Command::Request {
                from,
                request,
                reply,
            } => {
                if from == self.node.node_id() {
                    // The node never answers itself; the caller gets DriverError::Shutdown.
                    tracing::warn!(from, "raft request claiming this node's own id dropped");
                    return;
                }
                let correlation_id = self.next_correlation_id;
                self.next_correlation_id = self.next_correlation_id.wrapping_add(1);
                let config = self.node.config();
                let until = now
                    + config.request_timeout_ms.max(config.fetch_max_wait_ms)
                    + PENDING_REQUEST_GRACE_MS;
                self.pending_requests
                    .insert((from, correlation_id), (reply, until));
                let actions = self.node.handle_message(
                    from,
                    Message::Request {
                        correlation_id,
                        request,
                    },
                    now,
                );
                self.execute(actions);
            }
            Command::Inbound { from, message } => {
                let actions = self.node.handle_message(from, message, now);
                self.execute(actions);
            }
            Command::Describe { reply } => {
                let _ = reply.send(self.node.describe_quorum(now).map(|d| (d, now)));
            }
            Command::Read {
                from,
                snapshot_first,
                reply,
            } => {
                let _ = reply.send(self.read_committed(from, snapshot_first));
            }
            Command::WriteSnapshot { id, values, reply } => {
                let _ = reply.send(self.write_snapshot(id, &values));
            }
            Command::Shutdown { reply, .. } => {
                let _ = reply.send(());
            }
        }
    }

    /// Executes `actions` in order; a failed barrier stops the driver before anything after
    /// it runs.
    fn execute(&mut self, actions: Vec<Action>) {
        // Appends happened in the call that returned the actions: the log end is known before
        // any proposal they complete is answered.
        let leo = self.node.log().log_end_offset();
        self.log_end_offset.send_if_modified(|v| {
            let changed = *v != leo;
            *v = leo;
            changed
        });
        for action in actions {
            if self.stopped {
                return;
            }
            match action {
                Action::PersistElectionState(state) => {
                    if let Err(e) = self.store.write(&state, &self.node.config().voters) {
                        tracing::error!(error = %e, "writing quorum-state failed; stopping the raft driver");
                        self.fail(format!("writing quorum-state failed: {e}"));
                    }
                }
                Action::FlushLog { .. } => {
                    if let Err(e) = self.node.log().flush() {
                        tracing::error!(error = %e, "flushing __cluster_metadata-0 failed; stopping the raft driver");
                        self.fail(format!("flushing __cluster_metadata-0 failed: {e}"));
                    }
                }
                Action::Send { to, message } => match message {
                    Message::Request { .. } => self.transport.send(to, message),
                    Message::Response {
                        correlation_id,
                        response,
                    } => {
                        if let Some((reply, _)) =
                            self.pending_requests.remove(&(to, correlation_id))
                        {
                            let _ = reply.send(response);
                        }
                    }
                },
                Action::SnapshotInstalled { snapshot_id } => {
                    // The log now starts at the snapshot: a committed stream's next read below
                    // it finds the log start past it and is answered with this snapshot,
                    // which the reader loads (Kafka's `handleLoadSnapshot`).
                    tracing::info!(
                        offset = snapshot_id.offset,
                        epoch = snapshot_id.epoch,
                        "installed a metadata snapshot fetched from the leader"
                    );
                    self.log_end_offset
                        .send_replace(self.node.log().log_end_offset());
                }
                Action::HighWatermark(hw) => {
                    self.high_watermark.send_replace(hw);
                    self.complete_proposals(hw);
                }
                Action::LeaderChange { epoch, leader_id } => {
                    self.leader
                        .send_replace(LeaderAndEpoch { epoch, leader_id });
                    let stale: Vec<i64> = self
                        .proposals
                        .iter()
                        .filter(|(_, p)| p.epoch != epoch || leader_id != Some(self.node.node_id()))
                        .map(|(&o, _)| o)
                        .collect();
                    for o in stale {
                        if let Some(p) = self.proposals.remove(&o) {
                            let _ = p
                                .reply
                                .send(Err(DriverError::NotLeader { leader_id, epoch }));
                        }
                    }
                }
            }
        }
    }

    /// Wall-clock ms: snapshot timestamps and `metadata.max.retention.ms` are wall-clock
    /// times, as in Kafka.
    fn wall_ms() -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    }

    /// Kafka's periodic `maybeClean` (every [`CLEAN_INTERVAL_MS`]) and the removal of deleted
    /// segments whose `file.delete.delay.ms` passed.
    fn maybe_clean(&mut self) {
        let now = self.now_ms();
        if now < self.last_clean_ms + CLEAN_INTERVAL_MS {
            return;
        }
        self.last_clean_ms = now;
        self.clean();
    }

    fn clean(&mut self) {
        let wall = Self::wall_ms();
        if let Err(e) = self.node.log_mut().maybe_clean(wall) {
            tracing::warn!(error = %e, "cleaning __cluster_metadata-0 up to a snapshot failed");
        }
        self.node.log().delete_due_files(wall);
    }

    fn read_committed(&self, from: i64, snapshot_first: bool) -> Result<ReadOutcome, DriverError> {
        let log = self.node.log();
        let latest = log.latest_snapshot_id();
        let load = latest.filter(|s| {
            s.offset > from && (snapshot_first || from < RaftLog::log_start_offset(log))
        });
        if let Some(id) = load {
            let snapshot = RaftLog::read_snapshot(log, id)
                .map_err(|e| DriverError::Read(format!("snapshot {id:?}: {e}")))?;
            let mut values = Vec::new();
            for batch in &snapshot.batches {
                let header =
                    BatchHeader::parse(batch).map_err(|e| DriverError::Read(e.to_string()))?;
                if header.is_control() {
                    continue;
                }
                let records = decode_records(batch)
                    .map_err(|e| DriverError::Read(format!("snapshot {id:?}: {e}")))?;
                values.extend(records.into_iter().map(|r| r.value.unwrap_or_default()));
            }
            return Ok(ReadOutcome::Snapshot(LoadedSnapshot { id, values }));
        }
        let hw = *self.high_watermark.borrow();
        log.read(from, COMMITTED_READ_BYTES)
            .map(|b| ReadOutcome::Batches(b, hw))
            .map_err(|e| DriverError::Read(e.to_string()))
    }

    fn write_snapshot(
        &mut self,
        id: OffsetAndEpoch,
        values: &[Bytes],
    ) -> Result<bool, DriverError> {
        if self
            .node
            .log()
            .latest_snapshot_id()
            .is_some_and(|s| s.offset >= id.offset)
        {
            return Ok(false);
        }
        self.node
            .log_mut()
            .write_snapshot(id, values, Self::wall_ms())
            .map_err(|e| DriverError::Refused(e.to_string()))?;
        tracing::info!(
            offset = id.offset,
            epoch = id.epoch,
            records = values.len(),
            "wrote a metadata snapshot"
        );
        self.clean();
        Ok(true)
    }

    fn complete_proposals(&mut self, hw: i64) {
        while let Some(entry) = self.proposals.first_entry() {
            if *entry.key() >= hw {
                break;
            }
            let (last_offset, p) = entry.remove_entry();
            // The batch must still be the one proposed: same base offset, same epoch.
            let still_there = self
                .node
                .log()
                .read(p.base_offset, 1)
                .ok()
                .and_then(|b| BatchHeader::parse(&b).ok())
                .is_some_and(|h| {
                    h.base_offset == p.base_offset
                        && h.last_offset() == last_offset
                        && h.partition_leader_epoch == p.epoch
                });
            let _ = p.reply.send(if still_there {
                Ok(last_offset)
            } else {
                Err(DriverError::NotLeader {
                    leader_id: self.node.leader_id(),
                    epoch: self.node.epoch(),
                })
            });
        }
    }

    fn fail_all_proposals(&mut self, e: DriverError) {
        for (_, p) in std::mem::take(&mut self.proposals) {
            let _ = p.reply.send(Err(e.clone()));
        }
    }

    fn stop(&mut self) {
        self.stopped = true;
    }

    /// Stops after a storage error, keeping `reason` for [`RaftManager::failure`].
    fn fail(&mut self, reason: String) {
        self.failure.lock().get_or_insert(reason);
        self.failed.send_replace(true);
        self.stop();
    }
}

/// The API keys a controller listener serves for the quorum, with the versions gregor speaks
/// (Kafka 4.4's ranges, as `kafka-protocol` decodes them).
pub const KRAFT_API_KEYS: &[ApiKey] = &[
    ApiKey::Vote,
    ApiKey::BeginQuorumEpoch,
    ApiKey::EndQuorumEpoch,
    ApiKey::DescribeQuorum,
    ApiKey::FetchSnapshot,
];

#[cfg(test)]
mod tests;
