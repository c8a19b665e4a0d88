//! The controller (Kafka's `QuorumController`): validates metadata changes against the
//! committed image, turns them into records, proposes them to the metadata log and answers
//! once they are committed.
//!
//! [`Controller`] is the state machine: it generates the records of a change
//! ([`ControllerResult`]) and replays committed batches; it does no I/O. [`start_controller`]
//! runs it as one task that takes requests from a bounded queue one at a time (the KRaft
//! controller's event queue), so changes are serialised and each is validated against an image
//! that includes every change before it. Its image comes only from the committed stream of the
//! log, so a controller that is not the quorum leader keeps up and answers NOT_CONTROLLER.
//!
//! Handlers reach it through a [`ControllerHandle`], whose calls return once the change is
//! committed *and* applied on this node by the loader ([`crate::loader`]), so a CreateTopics
//! followed by a Metadata request on the same broker sees the topic.
//!
//! The requests and answers of the handle are defined here (topics, broker registration and
//! heartbeats, feature updates). The other parts of the state machine extend [`Controller`] in
//! their own modules and import this one, never the reverse: brokers in `cluster_control`,
//! partition changes in `replication_control`, UpdateFeatures in `features`; the brokers'
//! heartbeat sessions and the controller's clock are in [`crate::broker_sessions`].

use std::collections::BTreeMap;
use std::sync::Arc;

use gregor_protocol::error::ErrorCode;
use gregor_protocol::metadata_records::{
    BrokerEndpoint, BrokerFeature, ConfigRecord, PartitionRecord, ProducerIdsRecord,
    RemoveTopicRecord, TopicRecord,
};
use rand::rngs::StdRng;
use rand::SeedableRng;
use thiserror::Error;
use tokio::sync::{mpsc, oneshot, watch};
use uuid::Uuid;

use crate::broker_sessions::BrokerSessions;
pub use crate::broker_sessions::{
    ControllerClock, ManualClock, SystemClock, DEFAULT_BROKER_SESSION_TIMEOUT_MS,
};
use crate::image::MetadataImage;
use crate::loader::{LoaderError, LoaderHandle};
use crate::log::{
    Committed, CommittedBatch, CommittedBatches, MetadataLog, MetadataLogError, MetadataSnapshot,
};
use crate::placement::{place, UsableBroker};
use crate::record::{ConfigResource, MetadataRecord};
use crate::txn_replay::TransactionalReplay;

/// Longest legal topic name (Kafka's `Topic.MAX_NAME_LENGTH`).
pub const MAX_TOPIC_NAME_LENGTH: usize = 249;

/// Number of producer ids a broker takes from the controller at a time (Kafka hands out
/// blocks of 1000, `ProducerIdManager`).
pub const PRODUCER_ID_BLOCK_SIZE: i64 = 1000;

/// Why a metadata change was refused. [`ControllerError::kafka_error_code`] gives the code Kafka
/// returns for it.
#[derive(Debug, Clone, Error)]
pub enum ControllerError {
    /// INVALID_TOPIC_EXCEPTION (17).
    #[error("{0}")]
    InvalidTopic(String),
    /// TOPIC_ALREADY_EXISTS (36).
    #[error("Topic '{0}' already exists.")]
    TopicAlreadyExists(String),
    /// UNKNOWN_TOPIC_OR_PARTITION (3).
    #[error("This server does not host this topic-partition.")]
    UnknownTopicOrPartition,
    /// UNKNOWN_TOPIC_OR_PARTITION (3) with a message.
    #[error("{0}")]
    UnknownTopicOrPartitionWithMessage(String),
    /// INVALID_REQUEST (42).
    #[error("{0}")]
    InvalidRequest(String),
    /// NO_REASSIGNMENT_IN_PROGRESS (85).
    #[error("{0}")]
    NoReassignmentInProgress(String),
    /// UNKNOWN_TOPIC_ID (100).
    #[error("This server does not host this topic ID.")]
    UnknownTopicId,
    /// INVALID_PARTITIONS (37).
    #[error("{0}")]
    InvalidPartitions(String),
    /// INVALID_REPLICATION_FACTOR (38).
    #[error("{0}")]
    InvalidReplicationFactor(String),
    /// INVALID_REPLICA_ASSIGNMENT (39).
    #[error("{0}")]
    InvalidReplicaAssignment(String),
    /// INVALID_CONFIG (40).
    #[error("{0}")]
    InvalidConfig(String),
    /// This node's controller is not the active one (it does not lead the metadata quorum, or
    /// is shutting down): NOT_CONTROLLER (41); clients retry on the active controller.
    #[error("This is not the correct controller for this cluster.")]
    NotController {
        /// The active controller's node id, when known.
        leader_id: Option<i32>,
    },
    /// The change was committed but this node failed to apply it (creating or deleting a
    /// partition log): KAFKA_STORAGE_ERROR (56).
    #[error("{0}")]
    ApplyFailed(String),
    /// The metadata log could not make the change durable: UNKNOWN_SERVER_ERROR (-1).
    #[error("{0}")]
    Log(Arc<MetadataLogError>),
    /// Another live incarnation holds this broker id: DUPLICATE_BROKER_REGISTRATION (101).
    #[error("{0}")]
    DuplicateBrokerRegistration(String),
    /// The broker does not support a finalized feature level: UNSUPPORTED_VERSION (35).
    #[error("{0}")]
    UnsupportedVersion(String),
    /// The broker epoch is not the registration's current one: STALE_BROKER_EPOCH (77).
    #[error("{0}")]
    StaleBrokerEpoch(String),
    /// No broker with this id is registered: BROKER_ID_NOT_REGISTERED (102).
    #[error("{0}")]
    BrokerIdNotRegistered(String),
    /// The registration's log directories are invalid: INVALID_REGISTRATION (119).
    #[error("{0}")]
    InvalidRegistration(String),
    /// A feature update is refused (UpdateFeatures, KIP-584): INVALID_UPDATE_VERSION (95).
    #[error("{0}")]
    InvalidUpdateVersion(String),
    /// An error the active controller answered with (through the broker's controller channel)
    /// that has no variant above, or a failure to reach it (REQUEST_TIMED_OUT): the code and
    /// its message.
    #[error("{1}")]
    Remote(ErrorCode, String),
}

impl From<MetadataLogError> for ControllerError {
    fn from(e: MetadataLogError) -> Self {
        match e {
            MetadataLogError::NotLeader { leader_id, .. } => Self::NotController { leader_id },
            MetadataLogError::Closed | MetadataLogError::Stopped(_) => {
                Self::NotController { leader_id: None }
            }
            MetadataLogError::Storage(m) => Self::Remote(
                ErrorCode::KafkaStorageError,
                format!("the metadata log cannot be written: {m}"),
            ),
            e => Self::Log(Arc::new(e)),
        }
    }
}

impl From<LoaderError> for ControllerError {
    fn from(e: LoaderError) -> Self {
        match e {
            LoaderError::Stopped => Self::NotController { leader_id: None },
            LoaderError::Publish(message) => Self::ApplyFailed(message),
        }
    }
}

impl ControllerError {
    /// Kafka's error for this error.
    pub fn error_code(&self) -> ErrorCode {
        match self {
            Self::InvalidTopic(_) => ErrorCode::InvalidTopicException,
            Self::TopicAlreadyExists(_) => ErrorCode::TopicAlreadyExists,
            Self::UnknownTopicOrPartition => ErrorCode::UnknownTopicOrPartition,
            Self::UnknownTopicId => ErrorCode::UnknownTopicId,
            Self::UnknownTopicOrPartitionWithMessage(_) => ErrorCode::UnknownTopicOrPartition,
            Self::InvalidRequest(_) => ErrorCode::InvalidRequest,
            Self::NoReassignmentInProgress(_) => ErrorCode::NoReassignmentInProgress,
            Self::InvalidPartitions(_) => ErrorCode::InvalidPartitions,
            Self::InvalidReplicationFactor(_) => ErrorCode::InvalidReplicationFactor,
            Self::InvalidReplicaAssignment(_) => ErrorCode::InvalidReplicaAssignment,
            Self::InvalidConfig(_) => ErrorCode::InvalidConfig,
            Self::Log(_) => ErrorCode::UnknownServerError,
            Self::NotController { .. } => ErrorCode::NotController,
            Self::ApplyFailed(_) => ErrorCode::KafkaStorageError,
            Self::DuplicateBrokerRegistration(_) => ErrorCode::DuplicateBrokerRegistration,
            Self::UnsupportedVersion(_) => ErrorCode::UnsupportedVersion,
            Self::StaleBrokerEpoch(_) => ErrorCode::StaleBrokerEpoch,
            Self::BrokerIdNotRegistered(_) => ErrorCode::BrokerIdNotRegistered,
            Self::InvalidRegistration(_) => ErrorCode::InvalidRegistration,
            Self::InvalidUpdateVersion(_) => ErrorCode::InvalidUpdateVersion,
            Self::Remote(code, _) => *code,
        }
    }

    /// The error for a wire error `code` and its message (the active controller's answer,
    /// read by a broker): the variant of that code, with `message` or Kafka's default
    /// message of the code. Unknown codes become UNKNOWN_SERVER_ERROR.
    pub fn from_code(code: i16, message: Option<String>) -> Self {
        let error = ErrorCode::from_code(code).unwrap_or(ErrorCode::UnknownServerError);
        let msg = message.unwrap_or_else(|| format!("{} from the active controller", error.name()));
        match error {
            ErrorCode::InvalidTopicException => Self::InvalidTopic(msg),
            ErrorCode::TopicAlreadyExists => Self::TopicAlreadyExists(msg),
            ErrorCode::UnknownTopicOrPartition => Self::UnknownTopicOrPartition,
            ErrorCode::UnknownTopicId => Self::UnknownTopicId,
            ErrorCode::InvalidPartitions => Self::InvalidPartitions(msg),
            ErrorCode::InvalidReplicationFactor => Self::InvalidReplicationFactor(msg),
            ErrorCode::InvalidReplicaAssignment => Self::InvalidReplicaAssignment(msg),
            ErrorCode::InvalidConfig => Self::InvalidConfig(msg),
            ErrorCode::NotController => Self::NotController { leader_id: None },
            ErrorCode::KafkaStorageError => Self::ApplyFailed(msg),
            ErrorCode::DuplicateBrokerRegistration => Self::DuplicateBrokerRegistration(msg),
            ErrorCode::UnsupportedVersion => Self::UnsupportedVersion(msg),
            ErrorCode::StaleBrokerEpoch => Self::StaleBrokerEpoch(msg),
            ErrorCode::BrokerIdNotRegistered => Self::BrokerIdNotRegistered(msg),
            ErrorCode::InvalidRegistration => Self::InvalidRegistration(msg),
            ErrorCode::InvalidUpdateVersion => Self::InvalidUpdateVersion(msg),
            ErrorCode::InvalidRequest => Self::InvalidRequest(msg),
            ErrorCode::NoReassignmentInProgress => Self::NoReassignmentInProgress(msg),
            other => Self::Remote(other, msg),
        }
    }

    /// The wire code of [`ControllerError::error_code`].
    pub fn kafka_error_code(&self) -> i16 {
        self.error_code().code()
    }
}

/// A topic to create.
#[derive(Debug, Clone)]
pub struct NewTopic {
    /// Topic name.
    pub name: String,
    /// Number of partitions (already resolved from -1 to the broker default).
    pub num_partitions: i32,
    /// Replication factor (already resolved from -1 to the broker default).
    pub replication_factor: i16,
    /// Manual assignment: replica ids per partition, in partition order. Overrides the two
    /// counts above when non-empty.
    pub assignments: Vec<Vec<i32>>,
    /// Topic configs (already validated by the broker).
    pub configs: BTreeMap<String, String>,
}

/// Validates a topic name as Kafka's `Topic.validate` does.
///
/// # Errors
/// [`ControllerError::InvalidTopic`] with Kafka's message.
pub fn validate_topic_name(name: &str) -> Result<(), ControllerError> {
    if name.is_empty() {
        return Err(ControllerError::InvalidTopic(
            "Topic name is illegal, it can't be empty".into(),
        ));
    }
    if name == "." || name == ".." {
        return Err(ControllerError::InvalidTopic(
            "Topic name cannot be \".\" or \"..\"".into(),
        ));
    }
    if name.len() > MAX_TOPIC_NAME_LENGTH {
        return Err(ControllerError::InvalidTopic(format!(
            "Topic name is illegal, it can't be longer than {MAX_TOPIC_NAME_LENGTH} characters, topic name: {name}"
        )));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
    {
        return Err(ControllerError::InvalidTopic(format!(
            "Topic name \"{name}\" is illegal, it contains a character other than ASCII alphanumerics, '.', '_' and '-'"
        )));
    }
    Ok(())
}

/// Topic names that collide in metric names ('.' and '_' are interchangeable), as Kafka's
/// `Topic.unifyCollisionChars`.
fn unify_collision_chars(name: &str) -> String {
    name.replace('.', "_")
}

/// The records of a change and the answer to give once they are committed (Kafka's
/// `ControllerResult`). No records: nothing to commit (validate-only, or no change).
#[derive(Debug)]
pub struct ControllerResult<T> {
    /// Records to commit, all in one batch.
    pub records: Vec<MetadataRecord>,
    /// The answer.
    pub response: T,
}

/// One topic of a CreatePartitions request.
#[derive(Debug, Clone)]
pub struct PartitionsIncrease {
    /// Topic name.
    pub topic: String,
    /// The partition count wanted.
    pub total_count: i32,
    /// Manual assignment of the new partitions (replica ids each); empty to let the controller
    /// place them.
    pub assignments: Vec<Vec<i32>>,
}

/// A BrokerRegistration request (API 62, KIP-631), the fields the controller uses.
#[derive(Debug, Clone, PartialEq)]
pub struct BrokerRegistrationRequest {
    /// `node.id`.
    pub broker_id: i32,
    /// A new random id per broker process start.
    pub incarnation_id: Uuid,
    /// The broker's advertised listeners (name, host, port, security protocol id).
    pub listeners: Vec<BrokerEndpoint>,
    /// The features it supports (name, min, max level).
    pub features: Vec<BrokerFeature>,
    /// `broker.rack`.
    pub rack: Option<String>,
    /// The directory ids of its online log dirs (KIP-858).
    pub log_dirs: Vec<Uuid>,
    /// Its epoch before a clean shutdown, -1 if none (KIP-966: any other value than its
    /// registration's epoch makes the registration leave every ISR and ELR).
    pub previous_broker_epoch: i64,
}

/// A BrokerHeartbeat request (API 63).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerHeartbeatRequest {
    /// `node.id`.
    pub broker_id: i32,
    /// The epoch its registration returned.
    pub broker_epoch: i64,
    /// The offset of the last metadata record it applied.
    pub current_metadata_offset: i64,
    /// It wants to be fenced.
    pub want_fence: bool,
    /// It wants to shut down (controlled shutdown).
    pub want_shut_down: bool,
    /// Its cordoned log directories (KIP-1066, BrokerHeartbeat v2): `None` until the broker
    /// reports them (Kafka 4.4's brokers do once recovered; gregor's brokers never cordon a
    /// directory and send `None`).
    pub cordoned_log_dirs: Option<Vec<Uuid>>,
    /// The ids of its offline log directories (`OfflineLogDirs`, KIP-858, BrokerHeartbeat
    /// v1+): from `metadata.version` 3.7-IV2 the controller moves leadership and ISR
    /// membership off the replicas in them ([`Controller::broker_heartbeat`]).
    pub offline_log_dirs: Vec<Uuid>,
}

/// The answer to a heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BrokerHeartbeatReply {
    /// Its metadata has reached its registration's offset.
    pub is_caught_up: bool,
    /// It is fenced.
    pub is_fenced: bool,
    /// It is in controlled shutdown.
    pub in_controlled_shutdown: bool,
    /// It may shut down now.
    pub should_shut_down: bool,
}

/// How a feature may move (`FeatureUpdate.UpgradeType`, the request's `UpgradeType` code).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpgradeType {
    /// 1: the level may only go up (or stay).
    Upgrade,
    /// 2: a downgrade that loses no metadata.
    SafeDowngrade,
    /// 3: a downgrade that may lose metadata.
    UnsafeDowngrade,
    /// Any other code.
    Unknown,
}

impl UpgradeType {
    /// The upgrade type of a wire code (Kafka's `UpgradeType.fromCode`).
    pub fn from_code(code: i8) -> Self {
        match code {
            1 => Self::Upgrade,
            2 => Self::SafeDowngrade,
            3 => Self::UnsafeDowngrade,
            _ => Self::Unknown,
        }
    }
}

/// One update of an UpdateFeatures request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeatureUpdate {
    /// The feature's name (`metadata.version`, `group.version`, ...).
    pub feature: String,
    /// The new level; 0 removes the feature (negative levels are refused).
    pub max_version_level: i16,
    /// How it may move.
    pub upgrade_type: UpgradeType,
}

/// A new partition's replicas (leader first) and its ISR.
type Placed = (Vec<i32>, Vec<i32>);

/// How the controller is run: the broker session timeout, the clock it is measured on, and the
/// seed of the replica placer's randomness.
#[derive(Clone)]
pub struct ControllerConfig {
    /// `broker.session.timeout.ms` (Kafka's default 9000): a broker that has not heartbeaten
    /// for longer is fenced.
    pub session_timeout_ms: u64,
    /// The clock sessions are measured on.
    pub clock: Arc<dyn ControllerClock>,
    /// Seed of the replica placer's random start (None: from the OS).
    pub placement_seed: Option<u64>,
    /// The bootstrap metadata records (the feature levels of the bootstrap snapshot that
    /// `storage format` wrote): committed by the first active controller of a cluster whose
    /// log has no `metadata.version` yet, before any other change (Kafka's activation
    /// records). Empty: nothing is bootstrapped.
    pub bootstrap_records: Vec<MetadataRecord>,
    /// `unclean.leader.election.enable` of this node's static config (Kafka's default false):
    /// used for a topic whose own config and the cluster default do not set it.
    pub unclean_leader_election_enable: bool,
    /// `auto.leader.rebalance.enable` (Kafka's default true): the periodic preferred leader
    /// elections ([`Controller::balance_partition_leaders`]).
    pub auto_leader_rebalance_enable: bool,
    /// `leader.imbalance.check.interval.seconds` in ms (Kafka's default 300 s).
    pub leader_imbalance_check_interval_ms: u64,
    /// `leader.imbalance.per.broker.percentage` (Kafka's default 10): a broker's partitions are
    /// rebalanced once more than this percentage of those it is the preferred replica of are
    /// led by another broker.
    pub leader_imbalance_per_broker_percentage: u32,
    /// This controller's `node.id` (UpdateFeatures names it: "Local controller N").
    pub node_id: i32,
    /// Whether this node is also a broker (`process.roles=broker,controller`). Its broker's
    /// incarnations live in this process, so a registration of `node_id` with a new incarnation
    /// means the one registered before died with an earlier process: it is replaced at once
    /// rather than after `broker.session.timeout.ms` (Kafka waits, which makes a combined node
    /// restarted after a crash unavailable for the session timeout).
    pub colocated_broker: bool,
    /// The quorum's `kraft.version` (KIP-853: 1 for a dynamic quorum, 0 for static voters),
    /// which UpdateFeatures compares against (gregor does not change it).
    pub kraft_version: i16,
    /// `min.insync.replicas` of this node's static config (Kafka's default 1): the cluster
    /// default written when `eligible.leader.replicas.version` is enabled (KIP-966).
    pub min_insync_replicas: i32,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        Self {
            session_timeout_ms: DEFAULT_BROKER_SESSION_TIMEOUT_MS,
            clock: Arc::new(SystemClock::new()),
            placement_seed: None,
            bootstrap_records: Vec::new(),
            unclean_leader_election_enable: false,
            auto_leader_rebalance_enable: true,
            leader_imbalance_check_interval_ms: 300_000,
            leader_imbalance_per_broker_percentage: 10,
            node_id: -1,
            colocated_broker: false,
            kraft_version: 0,
            min_insync_replicas: 1,
        }
    }
}

/// The active controller's state machine: the committed image, the brokers' heartbeat
/// sessions (kept in memory, as Kafka's `BrokerHeartbeatManager`), and the generation of the
/// records of each change. No I/O; time comes from the injected clock.
pub struct Controller {
    pub(crate) image: MetadataImage,
    pub(crate) sessions: BrokerSessions,
    pub(crate) config: ControllerConfig,
    pub(crate) rng: StdRng,
    /// The offset the log gives the next proposed batch, as the controller task last heard
    /// ([`MetadataLog::next_write_offset`]); never below `image.offset`.
    pub(crate) next_write_offset: u64,
    /// The controller mutation quota (KIP-599) of the request being handled, if any.
    pub(crate) partition_change_quota: Option<PartitionChangeQuota>,
    /// Metadata transactions (KIP-868) in the replayed log: an aborted one's records are
    /// taken back out of `image`.
    pub(crate) txn: TransactionalReplay,
}

/// The controller mutation quota of one request (KIP-599; Kafka's
/// `ControllerRequestContext.applyPartitionChangeQuota`): called with the number of partitions
/// a topic creation, deletion or partition creation would change, once it is otherwise
/// valid; an error (THROTTLING_QUOTA_EXCEEDED) refuses that topic.
pub type PartitionChangeQuota = Arc<dyn Fn(u32) -> Result<(), ControllerError> + Send + Sync>;

impl Default for Controller {
    fn default() -> Self {
        Self::with_config(MetadataImage::default(), ControllerConfig::default())
    }
}

impl Controller {
    /// A controller at `image`.
    pub fn new(image: MetadataImage) -> Self {
        Self::with_config(image, ControllerConfig::default())
    }

    /// A controller at `image` with `config`.
    pub fn with_config(image: MetadataImage, config: ControllerConfig) -> Self {
        let rng = match config.placement_seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_entropy(),
        };
        Self {
            image,
            sessions: BrokerSessions::default(),
            config,
            rng,
            next_write_offset: 0,
            partition_change_quota: None,
            txn: TransactionalReplay::default(),
        }
    }

    /// The committed image the controller validates against.
    pub fn image(&self) -> &MetadataImage {
        &self.image
    }

    /// Applies a committed batch. Offsets the batch skips (a KRaft log's control records,
    /// which are not metadata records) are skipped in the image too, so a new broker epoch,
    /// the offset of its `RegisterBrokerRecord`, is the record's offset in the log.
    ///
    /// Records of a metadata transaction (KIP-868) apply as they come and are taken back by
    /// its `AbortTransactionRecord` ([`TransactionalReplay`]); a broker registration offset
    /// an aborted record left in the sessions is replaced by the broker's next registration.
    pub fn replay(&mut self, batch: &CommittedBatch) {
        debug_assert!(self.image.offset <= batch.base_offset, "batches in order");
        let sessions = &mut self.sessions;
        self.txn.replay(&mut self.image, batch, None, |offset, r| {
            sessions.replayed(offset, r)
        });
    }

    /// Whether this controller, once active, has records to write before any other change
    /// (Kafka's activation records, [`activation_event`]): an abort of the metadata
    /// transaction a previous controller left open, or the bootstrap records of a log without
    /// `metadata.version`.
    fn needs_activation(&self) -> bool {
        let committed = self.txn.image_before_open().unwrap_or(&self.image);
        self.txn.open_since().is_some()
            || (!self.config.bootstrap_records.is_empty() && committed.metadata_version().is_none())
    }

    /// Replaces the controller's image with `snapshot` (Kafka's `handleLoadSnapshot`): every
    /// `RegisterBrokerRecord` in it counts as at the snapshot's last offset, as Kafka's
    /// `registerBrokerRecordOffsets` after a snapshot load.
    pub fn load_snapshot(&mut self, snapshot: &MetadataSnapshot) {
        let mut image = MetadataImage::default();
        let last = snapshot.end_offset.saturating_sub(1);
        self.sessions.register_offsets_clear();
        for r in snapshot.records.iter() {
            self.sessions.replayed(last, r);
            image.apply(r);
        }
        image.offset = snapshot.end_offset;
        self.image = image;
        self.txn.reset();
    }

    /// Applies what the committed stream delivered: a batch ([`Controller::replay`]) or a
    /// snapshot ([`Controller::load_snapshot`]).
    pub fn apply_committed(&mut self, committed: &Committed) {
        match committed {
            Committed::Batch(b) => self.replay(b),
            Committed::Snapshot(s) => self.load_snapshot(s),
        }
    }

    /// The offset a record proposed now would get: a new broker epoch.
    pub(crate) fn write_offset(&self) -> u64 {
        self.next_write_offset.max(self.image.offset)
    }

    /// The brokers replicas may go to (Kafka's `usableBrokers`: registered and not shutting
    /// down; a fenced broker's controlled shutdown is over), with their fencing.
    fn usable_brokers(image: &MetadataImage) -> Vec<UsableBroker> {
        image
            .brokers
            .values()
            .filter(|b| b.fenced || !b.in_controlled_shutdown)
            .map(|b| UsableBroker {
                id: b.broker_id,
                rack: b.rack.clone(),
                fenced: b.fenced,
            })
            .collect()
    }

    /// Whether a broker can lead and be in an ISR (`ClusterControlManager.isActive`):
    /// registered, unfenced, not in controlled shutdown.
    pub(crate) fn is_active(image: &MetadataImage, broker: i32) -> bool {
        image
            .brokers
            .get(&broker)
            .is_some_and(|b| !b.fenced && !b.in_controlled_shutdown)
    }

    /// Whether `broker`'s replica of `p` is in one of its online log directories
    /// (`ClusterControlManager.hasOnlineDir` with the partition's directory for it, KIP-858):
    /// an unassigned or migrating directory counts as online, a lost one as offline, a
    /// broker that registered no directories has them all online, and a directory its last
    /// heartbeat reported offline is offline (the registration keeps its only directory).
    pub(crate) fn replica_dir_online(
        &self,
        p: &crate::image::PartitionRegistration,
        broker: i32,
    ) -> bool {
        if !self.image.brokers.contains_key(&broker) {
            return false;
        }
        p.replicas
            .iter()
            .position(|r| *r == broker)
            .and_then(|i| p.directories.get(i))
            .is_none_or(|dir| self.broker_dir_online(broker, dir))
    }

    /// Whether `dir` is an online log directory of `broker` (`BrokerRegistration.hasOnlineDir`,
    /// KIP-858): UNASSIGNED and MIGRATING count as online, LOST as offline; otherwise the
    /// registration must list it (a registration without directories has them all online)
    /// and the broker's last heartbeat must not have reported it offline (the registration
    /// keeps a broker's directories when all of them are offline). False for a broker that is
    /// not registered.
    pub(crate) fn broker_dir_online(&self, broker: i32, dir: &Uuid) -> bool {
        let Some(b) = self.image.brokers.get(&broker) else {
            return false;
        };
        if *dir == crate::record::DIRECTORY_UNASSIGNED || *dir == crate::record::DIRECTORY_MIGRATING
        {
            return true;
        }
        if *dir == crate::record::DIRECTORY_LOST {
            return false;
        }
        let reported_offline = self
            .sessions
            .sessions
            .get(&broker)
            .is_some_and(|s| s.offline_dirs.contains(dir));
        (b.directories.is_empty() || b.directories.contains(dir)) && !reported_offline
    }

    /// Kafka's `LeaderAcceptor`: `broker` may lead `p` (and stay in its ISR) when it is
    /// active ([`Controller::is_active`]) and its replica's directory is online.
    pub(crate) fn is_acceptable_leader(
        &self,
        p: &crate::image::PartitionRegistration,
        broker: i32,
    ) -> bool {
        Self::is_active(&self.image, broker) && self.replica_dir_online(p, broker)
    }

    /// Kafka's `ClusterControlManager.defaultDir`: the broker's only log directory; MIGRATING
    /// when it registered none; UNASSIGNED when it has several or is not registered.
    pub(crate) fn default_dir(image: &MetadataImage, broker: i32) -> Uuid {
        match image.brokers.get(&broker).map(|b| b.directories.as_slice()) {
            None => crate::record::DIRECTORY_UNASSIGNED,
            Some([]) => crate::record::DIRECTORY_MIGRATING,
            Some([one]) => *one,
            Some(_) => crate::record::DIRECTORY_UNASSIGNED,
        }
    }

    /// Placed partitions: replicas from the striped placer, ISR = the active replicas, leader
    /// the first of them (`ReplicationControlManager.createTopic`).
    fn place_replicas(
        &mut self,
        image: &MetadataImage,
        count: i32,
        replication_factor: i16,
    ) -> Result<Vec<Placed>, ControllerError> {
        let unable = |why: String| {
            ControllerError::InvalidReplicationFactor(format!(
                "Unable to replicate the partition {replication_factor} time(s): {why}"
            ))
        };
        let placed = place(
            &Self::usable_brokers(image),
            usize::try_from(count).unwrap_or(0),
            i32::from(replication_factor),
            &mut self.rng,
        )
        .map_err(|e| unable(e.to_string()))?;
        placed
            .into_iter()
            .map(|replicas| {
                let isr: Vec<i32> = replicas
                    .iter()
                    .copied()
                    .filter(|r| Self::is_active(image, *r))
                    .collect();
                if isr.is_empty() {
                    return Err(unable(
                        "All brokers are currently fenced or in controlled shutdown.".into(),
                    ));
                }
                Ok((replicas, isr))
            })
            .collect()
    }

    /// Validates a manual assignment as Kafka's `validateManualPartitionAssignment`, partition
    /// by partition; the ISR of each is its active replicas.
    fn check_assignments(
        &self,
        image: &MetadataImage,
        first_partition: i32,
        assignments: &[Vec<i32>],
        mut replication_factor: Option<usize>,
    ) -> Result<Vec<Placed>, ControllerError> {
        let invalid = ControllerError::InvalidReplicaAssignment;
        let mut out = Vec::with_capacity(assignments.len());
        for (i, a) in assignments.iter().enumerate() {
            if a.is_empty() {
                return Err(invalid(
                    "The manual partition assignment includes an empty replica list.".into(),
                ));
            }
            let mut sorted = a.clone();
            sorted.sort_unstable();
            for (j, b) in sorted.iter().enumerate() {
                if !image.brokers.contains_key(b) {
                    return Err(invalid(format!(
                        "The manual partition assignment includes broker {b}, but no such broker is registered."
                    )));
                }
                if j > 0 && sorted[j - 1] == *b {
                    return Err(invalid(format!(
                        "The manual partition assignment includes the broker {b} more than once."
                    )));
                }
            }
            if let Some(rf) = replication_factor {
                if a.len() != rf {
                    return Err(invalid(format!(
                        "The manual partition assignment includes a partition with {} replica(s), but this is not consistent with previous partitions, which have {rf} replica(s).",
                        a.len()
                    )));
                }
            }
            replication_factor = Some(a.len());
            let isr: Vec<i32> = a
                .iter()
                .copied()
                .filter(|r| Self::is_active(image, *r))
                .collect();
            if isr.is_empty() {
                return Err(invalid(format!(
                    "All brokers specified in the manual partition assignment for partition {} are fenced or in controlled shutdown.",
                    first_partition + i as i32
                )));
            }
            out.push((a.clone(), isr));
        }
        Ok(out)
    }

    /// The PartitionRecords of new partitions: leader the first ISR member, leader and
    /// partition epoch 0, each replica's default directory (as Kafka at `metadata.version` 33).
    fn partition_records(
        image: &MetadataImage,
        topic_id: Uuid,
        first_partition: i32,
        placed: Vec<Placed>,
    ) -> Vec<MetadataRecord> {
        placed
            .into_iter()
            .enumerate()
            .map(|(i, (replicas, isr))| {
                PartitionRecord {
                    partition_id: first_partition + i as i32,
                    topic_id,
                    leader: isr.first().copied().unwrap_or(crate::image::NO_LEADER),
                    directories: replicas
                        .iter()
                        .map(|r| Self::default_dir(image, *r))
                        .collect(),
                    isr,
                    replicas,
                    leader_recovery_state: 0,
                    leader_epoch: 0,
                    partition_epoch: 0,
                    ..PartitionRecord::default()
                }
                .into()
            })
            .collect()
    }

    /// Applies the request's controller mutation quota to `partitions` (none: no quota).
    ///
    /// # Errors
    /// THROTTLING_QUOTA_EXCEEDED when the quota is exhausted.
    fn apply_partition_change_quota(&self, partitions: i32) -> Result<(), ControllerError> {
        match &self.partition_change_quota {
            Some(q) => q(u32::try_from(partitions).unwrap_or(0)),
            None => Ok(()),
        }
    }

    /// Creates topics (or only validates, with `validate_only`); one answer per topic, in
    /// order: its id, or why it was refused. Topics are checked one after the other against the
    /// image with the topics before them, so two colliding names in one request do not both
    /// pass. The records of every accepted topic are committed as one batch.
    ///
    /// Per-topic errors: INVALID_TOPIC_EXCEPTION for a bad or colliding name,
    /// TOPIC_ALREADY_EXISTS, INVALID_PARTITIONS for fewer than one partition,
    /// INVALID_REPLICATION_FACTOR for more replicas than registered brokers,
    /// INVALID_REPLICA_ASSIGNMENT for a bad manual assignment.
    pub fn create_topics(
        &mut self,
        topics: Vec<NewTopic>,
        validate_only: bool,
    ) -> ControllerResult<Vec<Result<Uuid, ControllerError>>> {
        let mut scratch = self.image.clone();
        let mut records = Vec::new();
        let response = topics
            .into_iter()
            .map(|t| {
                let (topic_id, topic_records) = self.create_topic(&scratch, t)?;
                for r in &topic_records {
                    scratch.apply(r);
                }
                if !validate_only {
                    records.extend(topic_records);
                }
                Ok(topic_id)
            })
            .collect();
        ControllerResult { records, response }
    }

    fn create_topic(
        &mut self,
        image: &MetadataImage,
        t: NewTopic,
    ) -> Result<(Uuid, Vec<MetadataRecord>), ControllerError> {
        validate_topic_name(&t.name)?;
        if image.topic_ids.contains_key(&t.name) {
            return Err(ControllerError::TopicAlreadyExists(t.name));
        }
        let unified = unify_collision_chars(&t.name);
        if let Some(other) = image
            .topic_ids
            .keys()
            .find(|n| unify_collision_chars(n) == unified)
        {
            return Err(ControllerError::InvalidTopic(format!(
                "Topic '{}' collides with existing topic: {other}",
                t.name
            )));
        }
        let assignments = if t.assignments.is_empty() {
            if t.num_partitions < 1 {
                return Err(ControllerError::InvalidPartitions(
                    "Number of partitions was set to an invalid non-positive value.".into(),
                ));
            }
            if t.replication_factor < 1 {
                return Err(ControllerError::InvalidReplicationFactor(
                    "Replication factor must be larger than 0, or -1 to use the default value."
                        .into(),
                ));
            }
            self.place_replicas(image, t.num_partitions, t.replication_factor)?
        } else {
            self.check_assignments(image, 0, &t.assignments, None)?
        };
        self.apply_partition_change_quota(assignments.len() as i32)?;
        let topic_id = Uuid::new_v4();
        // Kafka's order: the topic, its configs, then its partitions.
        let mut records: Vec<MetadataRecord> = vec![TopicRecord {
            name: t.name.clone(),
            topic_id,
            ..TopicRecord::default()
        }
        .into()];
        records.extend(t.configs.into_iter().map(|(name, value)| {
            MetadataRecord::from(ConfigRecord {
                resource_type: ConfigResource::Topic.resource_type(),
                resource_name: t.name.clone(),
                name,
                value: Some(value),
                ..ConfigRecord::default()
            })
        }));
        records.extend(Self::partition_records(image, topic_id, 0, assignments));
        Ok((topic_id, records))
    }

    /// Deletes topics by id; one answer per id: the topic's name, or UNKNOWN_TOPIC_ID.
    pub fn delete_topics(
        &self,
        topic_ids: Vec<Uuid>,
    ) -> ControllerResult<Vec<Result<String, ControllerError>>> {
        let mut records = Vec::new();
        let mut deleted = std::collections::HashSet::new();
        let response = topic_ids
            .into_iter()
            .map(|topic_id| {
                let name = self
                    .image
                    .topic_by_id(&topic_id)
                    .filter(|_| deleted.insert(topic_id))
                    .map(|t| (t.name.clone(), t.partitions.len()))
                    .ok_or(ControllerError::UnknownTopicId);
                let (name, partitions) = name?;
                if let Err(e) = self.apply_partition_change_quota(partitions as i32) {
                    deleted.remove(&topic_id);
                    return Err(e);
                }
                records.push(
                    RemoveTopicRecord {
                        topic_id,
                        ..RemoveTopicRecord::default()
                    }
                    .into(),
                );
                Ok(name)
            })
            .collect();
        ControllerResult { records, response }
    }

    /// Grows topics (CreatePartitions); one answer per topic.
    ///
    /// Per-topic errors: UNKNOWN_TOPIC_OR_PARTITION for an unknown topic; INVALID_PARTITIONS
    /// when the count is not larger than the current one; INVALID_REPLICA_ASSIGNMENT for a
    /// bad assignment.
    pub fn create_partitions(
        &mut self,
        increases: Vec<PartitionsIncrease>,
        validate_only: bool,
    ) -> ControllerResult<Vec<Result<(), ControllerError>>> {
        let mut records = Vec::new();
        let response = increases
            .into_iter()
            .map(|inc| {
                let new = self.create_partitions_of(inc)?;
                if !validate_only {
                    records.extend(new);
                }
                Ok(())
            })
            .collect();
        ControllerResult { records, response }
    }

    fn create_partitions_of(
        &mut self,
        inc: PartitionsIncrease,
    ) -> Result<Vec<MetadataRecord>, ControllerError> {
        let image = self.image.clone();
        let image = &image;
        let t = image
            .topic(&inc.topic)
            .ok_or(ControllerError::UnknownTopicOrPartition)?;
        let total_count = inc.total_count;
        let current = t.partitions.len() as i32;
        if total_count < current {
            return Err(ControllerError::InvalidPartitions(format!(
                "Topic currently has {current} partitions, which is higher than the requested {total_count}."
            )));
        }
        if total_count == current {
            return Err(ControllerError::InvalidPartitions(format!(
                "Topic already has {current} partition(s)."
            )));
        }
        let added = total_count - current;
        let rf = t
            .partitions
            .values()
            .next()
            .map_or(1, |p| p.replicas.len() as i16);
        let assignments = if inc.assignments.is_empty() {
            self.place_replicas(image, added, rf)?
        } else {
            if inc.assignments.len() as i32 != added {
                return Err(ControllerError::InvalidReplicaAssignment(format!(
                    "Attempted to add {added} additional partition(s), but only {} assignment(s) were specified.",
                    inc.assignments.len()
                )));
            }
            self.check_assignments(image, current, &inc.assignments, Some(rf as usize))?
        };
        self.apply_partition_change_quota(added)?;
        Ok(Self::partition_records(
            image,
            t.topic_id,
            current,
            assignments,
        ))
    }

    /// Sets (Some) or removes (None) configs of one resource, all at once. The broker has
    /// validated names and values.
    ///
    /// # Errors
    /// UNKNOWN_TOPIC_OR_PARTITION for an unknown topic.
    pub fn alter_configs(
        &self,
        resource: ConfigResource,
        resource_name: &str,
        changes: Vec<(String, Option<String>)>,
    ) -> Result<ControllerResult<()>, ControllerError> {
        if resource == ConfigResource::Topic && self.image.topic(resource_name).is_none() {
            return Err(ControllerError::UnknownTopicOrPartition);
        }
        let records = changes
            .into_iter()
            .map(|(name, value)| {
                ConfigRecord {
                    resource_type: resource.resource_type(),
                    resource_name: resource_name.to_string(),
                    name,
                    value,
                    ..ConfigRecord::default()
                }
                .into()
            })
            .collect();
        Ok(ControllerResult {
            records,
            response: (),
        })
    }

    /// Hands out a block of [`PRODUCER_ID_BLOCK_SIZE`] producer ids to `broker_id`
    /// (AllocateProducerIds, KIP-730); the answer is the first id of the block. The block is
    /// committed before it is answered, so ids are never reused, even after a crash.
    pub fn allocate_producer_ids(&self, broker_id: i32) -> ControllerResult<i64> {
        let start = self.image.next_producer_id;
        let broker_epoch = self.image.brokers.get(&broker_id).map_or(-1, |b| b.epoch);
        ControllerResult {
            records: vec![ProducerIdsRecord {
                broker_id,
                broker_epoch,
                next_producer_id: start + PRODUCER_ID_BLOCK_SIZE,
                ..ProducerIdsRecord::default()
            }
            .into()],
            response: start,
        }
    }
}

/// Requests that may wait in the controller's queue before callers wait to enqueue (Kafka's
/// controller event queue; the bound keeps a burst of admin requests from growing memory).
pub const CONTROLLER_QUEUE_CAPACITY: usize = 1024;

/// Where the controller's answer to a request stands in the log.
#[derive(Debug, Clone, Copy)]
enum Outcome {
    /// Its records were committed; the last one is at this offset.
    Committed(u64),
    /// It committed nothing; the controller had seen every record below this offset.
    Unchanged(u64),
}

/// A change waiting for its commit: the records, and what to do with the outcome.
struct Pending {
    records: Vec<MetadataRecord>,
    complete: Box<dyn FnOnce(Result<Outcome, ControllerError>) + Send>,
}

type Event = Box<dyn FnOnce(&mut Controller) -> Pending + Send>;

/// Starts the controller task on `log`. It replays the log's committed batches, then serves
/// requests from the returned handle one at a time, until `shutdown` turns true or every
/// handle is dropped.
///
/// # Errors
/// [`ControllerError::Log`] when the log cannot be subscribed to.
pub fn start_controller(
    log: Arc<dyn MetadataLog>,
    loader: LoaderHandle,
    shutdown: watch::Receiver<bool>,
) -> Result<(ControllerHandle, tokio::task::JoinHandle<()>), ControllerError> {
    start_controller_with(log, loader, shutdown, ControllerConfig::default())
}

/// How often the controller task looks for brokers whose session expired, in ms of the
/// system clock (Kafka schedules the check at the next expiry; this bounds the delay).
pub const SESSION_CHECK_INTERVAL_MS: u64 = 500;

/// [`start_controller`] with a [`ControllerConfig`] (session timeout, clock, placement seed).
///
/// # Errors
/// [`ControllerError::Log`] when the log cannot be subscribed to.
pub fn start_controller_with(
    log: Arc<dyn MetadataLog>,
    loader: LoaderHandle,
    shutdown: watch::Receiver<bool>,
    config: ControllerConfig,
) -> Result<(ControllerHandle, tokio::task::JoinHandle<()>), ControllerError> {
    let committed = log.subscribe()?;
    let (tx, rx) = mpsc::channel(CONTROLLER_QUEUE_CAPACITY);
    let task = tokio::spawn(run_controller(log, committed, rx, shutdown, config));
    Ok((ControllerHandle { events: tx, loader }, task))
}

/// The activation event (Kafka's `ActivationRecordsGenerator`), committed before any other
/// change of an active controller: an `AbortTransactionRecord` for a metadata transaction
/// (KIP-868) a previous controller began and did not end, then the bootstrap records if the
/// log, without that transaction, has no `metadata.version` (a new cluster's log). One
/// atomic batch; nothing when neither is needed.
fn activation_event(bootstrap: Vec<MetadataRecord>) -> Event {
    Box::new(move |c: &mut Controller| {
        let mut records = Vec::new();
        if let Some(begin_offset) = c.txn.open_since() {
            tracing::warn!(
                begin_offset,
                "aborting the metadata transaction a previous controller left open"
            );
            records.push(
                gregor_protocol::metadata_records::AbortTransactionRecord {
                    reason: Some("Controller failover".into()),
                    ..Default::default()
                }
                .into(),
            );
        }
        let committed = c.txn.image_before_open().unwrap_or(&c.image);
        let bootstrapped = !bootstrap.is_empty() && committed.metadata_version().is_none();
        if bootstrapped {
            records.extend(bootstrap);
        }
        Pending {
            records,
            complete: Box::new(move |outcome| match outcome {
                Ok(Outcome::Committed(offset)) if bootstrapped => {
                    tracing::info!(offset, "committed the bootstrap metadata records")
                }
                Ok(Outcome::Committed(offset)) => {
                    tracing::info!(offset, "committed the metadata transaction's abort")
                }
                Ok(Outcome::Unchanged(_)) => {}
                Err(e) => tracing::warn!(error = %e, "committing the activation records failed"),
            }),
        }
    })
}

/// A periodic event of the controller task: fence the brokers whose session expired, one at
/// a time, each committed before the next is decided.
fn fence_stale_brokers_event() -> Event {
    Box::new(|c: &mut Controller| {
        let result = c.fence_stale_broker();
        Pending {
            records: result.records,
            complete: Box::new(|outcome| {
                if let Err(e) = outcome {
                    tracing::warn!(error = %e, "fencing a broker whose session expired failed");
                }
            }),
        }
    })
}

/// A periodic event of the controller task: a result of the controller that commits records
/// and answers a count (leader balancing, unclean elections), logged under `what`.
fn periodic_event(what: &'static str, op: fn(&Controller) -> ControllerResult<usize>) -> Event {
    Box::new(move |c: &mut Controller| {
        let result = op(c);
        let n = result.response;
        Pending {
            records: result.records,
            complete: Box::new(move |outcome| match outcome {
                Ok(Outcome::Committed(_)) => tracing::info!(elections = n, "{what}"),
                Ok(Outcome::Unchanged(_)) => {}
                Err(e) => tracing::warn!(error = %e, "{what} failed"),
            }),
        }
    })
}

async fn run_controller(
    log: Arc<dyn MetadataLog>,
    mut committed: CommittedBatches,
    mut events: mpsc::Receiver<Event>,
    mut shutdown: watch::Receiver<bool>,
    config: ControllerConfig,
) {
    let bootstrap_records = config.bootstrap_records.clone();
    let mut balance_check = tokio::time::interval(std::time::Duration::from_millis(
        config.leader_imbalance_check_interval_ms.max(1),
    ));
    balance_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is immediate: the first balancing waits one interval, as Kafka's.
    balance_check.tick().await;
    let mut controller = Controller::with_config(MetadataImage::default(), config);
    let mut session_check =
        tokio::time::interval(std::time::Duration::from_millis(SESSION_CHECK_INTERVAL_MS));
    session_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            // Committed batches first: every request is validated against all that is committed.
            biased;
            _ = shutdown.changed() => return,
            batch = committed.next() => match batch {
                Some(b) => controller.apply_committed(&b),
                None => return,
            },
            event = events.recv() => {
                let Some(event) = event else { return };
                if controller.needs_activation()
                    && log.is_leader()
                    && !process_event(&log, &mut committed, &mut controller, activation_event(bootstrap_records.clone())).await
                {
                    return;
                }
                if !process_event(&log, &mut committed, &mut controller, event).await {
                    return;
                }
            }
            _ = balance_check.tick() => {
                if log.is_leader()
                    && !process_event(&log, &mut committed, &mut controller, periodic_event("preferred leader elections to balance leadership", Controller::balance_partition_leaders)).await
                {
                    return;
                }
            }
            _ = session_check.tick() => {
                // Only the active controller fences. Sessions are its own: a controller that is
                // not active forgets them, so on becoming active it gives every broker a full
                // session (Kafka's BrokerHeartbeatManager is created on activation).
                if !log.is_leader() {
                    controller.forget_sessions();
                    continue;
                }
                if controller.needs_activation()
                    && !process_event(&log, &mut committed, &mut controller, activation_event(bootstrap_records.clone())).await
                {
                    return;
                }
                if controller.image.topics.values().any(|t| t.partitions.values().any(|p| p.leader == crate::image::NO_LEADER))
                    && !process_event(&log, &mut committed, &mut controller, periodic_event("unclean leader elections", Controller::elect_unclean_leaders)).await
                {
                    return;
                }
                if controller.image.brokers.values().any(|b| !b.fenced) {
                    loop {
                        let before = controller.image.offset;
                        if !process_event(&log, &mut committed, &mut controller, fence_stale_brokers_event()).await {
                            return;
                        }
                        if controller.image.offset == before {
                            break;
                        }
                    }
                }
            }
        }
    }
}

/// Runs one event against the committed image: its records are proposed and the controller's
/// image follows the committed stream past them. An active controller that has activation
/// records to write ([`activation_event`]) writes them first. False when the log closed.
async fn process_event(
    log: &Arc<dyn MetadataLog>,
    committed: &mut CommittedBatches,
    controller: &mut Controller,
    event: Event,
) -> bool {
    // Batches committed by another leader, not yet read from the stream.
    while controller.image.offset < log.high_watermark() {
        let Some(b) = committed.next().await else {
            return false;
        };
        controller.apply_committed(&b);
    }
    if log.is_leader() && controller.needs_activation() {
        let activation = activation_event(controller.config.bootstrap_records.clone());
        if !run_event(log, committed, controller, activation).await {
            return false;
        }
    }
    run_event(log, committed, controller, event).await
}

/// [`process_event`] once the controller has replayed what is committed.
async fn run_event(
    log: &Arc<dyn MetadataLog>,
    committed: &mut CommittedBatches,
    controller: &mut Controller,
    event: Event,
) -> bool {
    {
        {
            controller.next_write_offset = log.next_write_offset();
            let pending = event(controller);
            if pending.records.is_empty() {
                (pending.complete)(Ok(Outcome::Unchanged(controller.image.offset)));
                return true;
            }
            match log.propose(pending.records).await {
                Ok(offset) => {
                    // The controller's image follows the committed stream only.
                    while controller.image.offset <= offset {
                        let Some(b) = committed.next().await else {
                            (pending.complete)(Err(MetadataLogError::Closed.into()));
                            return false;
                        };
                        controller.apply_committed(&b);
                    }
                    (pending.complete)(Ok(Outcome::Committed(offset)));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "metadata change not committed");
                    (pending.complete)(Err(e.into()));
                }
            }
            true
        }
    }
}

/// A change that was not completed, with the controller's answer when it had one.
struct Failed<T> {
    response: Option<T>,
    error: ControllerError,
}

/// How handlers ask the controller for changes (Kafka's `ControllerChannelManager` /
/// forwarding to the active controller). Each call returns once the change is committed and
/// applied on this node; cheap to clone.
#[derive(Clone)]
pub struct ControllerHandle {
    events: mpsc::Sender<Event>,
    loader: LoaderHandle,
}

impl ControllerHandle {
    /// The metadata image this node has applied (the loader's latest): what handlers answer
    /// from. It includes every change a call of this handle has returned.
    pub fn image(&self) -> Arc<MetadataImage> {
        self.loader.image()
    }

    /// The loader this handle waits on.
    pub fn loader(&self) -> &LoaderHandle {
        &self.loader
    }

    /// Runs `op` on the controller, commits its records, waits until this node has applied
    /// them, and returns its answer. A failure after `op` answered (not committed, or not
    /// applied here) comes with that answer, so per-item errors of `op` are kept.
    async fn submit<T, F>(&self, op: F) -> Result<T, Failed<T>>
    where
        T: Send + 'static,
        F: FnOnce(&mut Controller) -> Result<ControllerResult<T>, ControllerError> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let event: Event = Box::new(move |c| match op(c) {
            Ok(ControllerResult { records, response }) => Pending {
                records,
                complete: Box::new(move |outcome| {
                    let _ = tx.send(match outcome {
                        Ok(o) => Ok((response, o)),
                        Err(error) => Err(Failed {
                            response: Some(response),
                            error,
                        }),
                    });
                }),
            },
            Err(error) => Pending {
                records: Vec::new(),
                complete: Box::new(move |_| {
                    let _ = tx.send(Err(Failed {
                        response: None,
                        error,
                    }));
                }),
            },
        });
        let not_controller = || Failed {
            response: None,
            error: ControllerError::NotController { leader_id: None },
        };
        self.events
            .send(event)
            .await
            .map_err(|_| not_controller())?;
        let (response, outcome) = rx.await.map_err(|_| not_controller())??;
        // Also an answer that changed nothing waits for what the controller had seen (a topic
        // that "already exists" is then visible in this node's image too).
        let applied = match outcome {
            Outcome::Committed(offset) => self.loader.wait_for_offset(offset).await.map(|_| ()),
            Outcome::Unchanged(offset) => self.loader.wait_for_catch_up(offset).await,
        };
        match applied {
            Ok(()) => Ok(response),
            Err(e) => Err(Failed {
                response: Some(response),
                error: e.into(),
            }),
        }
    }

    /// [`ControllerHandle::submit`] for one change with one answer.
    async fn submit_one<T, F>(&self, op: F) -> Result<T, ControllerError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Controller) -> Result<ControllerResult<T>, ControllerError> + Send + 'static,
    {
        self.submit(op).await.map_err(|f| f.error)
    }

    /// [`ControllerHandle::submit`] for a change of many items, each with its own answer: a
    /// failure to commit or apply becomes the answer of every item that had none of its own.
    async fn submit_each<V, F>(
        &self,
        op: F,
    ) -> Result<Vec<Result<V, ControllerError>>, ControllerError>
    where
        V: Send + 'static,
        F: FnOnce(&mut Controller) -> ControllerResult<Vec<Result<V, ControllerError>>>
            + Send
            + 'static,
    {
        match self.submit(move |c| Ok(op(c))).await {
            Ok(answers) => Ok(answers),
            Err(Failed {
                response: Some(answers),
                error,
            }) => Ok(answers
                .into_iter()
                .map(|a| a.and_then(|_| Err(error.clone())))
                .collect()),
            Err(Failed {
                response: None,
                error,
            }) => Err(error),
        }
    }

    /// Registers a broker (BrokerRegistration, KIP-631); see [`Controller::register_broker`].
    /// Returns the broker epoch.
    ///
    /// # Errors
    /// DUPLICATE_BROKER_REGISTRATION, UNSUPPORTED_VERSION, INVALID_REGISTRATION,
    /// NOT_CONTROLLER, or the log's or the loader's failure.
    pub async fn register_broker(
        &self,
        request: BrokerRegistrationRequest,
    ) -> Result<i64, ControllerError> {
        self.submit_one(move |c| c.register_broker(request)).await
    }

    /// A broker heartbeat (BrokerHeartbeat); see [`Controller::broker_heartbeat`].
    ///
    /// # Errors
    /// STALE_BROKER_EPOCH, NOT_CONTROLLER, or the log's or the loader's failure.
    pub async fn broker_heartbeat(
        &self,
        request: BrokerHeartbeatRequest,
    ) -> Result<BrokerHeartbeatReply, ControllerError> {
        self.submit_one(move |c| c.broker_heartbeat(request)).await
    }

    /// Unregisters a broker (UnregisterBroker); see [`Controller::unregister_broker`].
    ///
    /// # Errors
    /// BROKER_ID_NOT_REGISTERED, NOT_CONTROLLER, or the log's or the loader's failure.
    pub async fn unregister_broker(&self, broker_id: i32) -> Result<(), ControllerError> {
        self.submit_one(move |c| c.unregister_broker(broker_id))
            .await
    }

    /// Creates topics; see [`Controller::create_topics`]. When the batch is not committed or
    /// not applied here, that error is the answer of every topic that had no error of its own.
    ///
    /// # Errors
    /// NOT_CONTROLLER when the controller stopped before answering.
    pub async fn create_topics(
        &self,
        topics: Vec<NewTopic>,
        validate_only: bool,
    ) -> Result<Vec<Result<Uuid, ControllerError>>, ControllerError> {
        self.create_topics_with_quota(topics, validate_only, None)
            .await
    }

    /// [`ControllerHandle::create_topics`] under a controller mutation quota (KIP-599).
    ///
    /// # Errors
    /// As [`ControllerHandle::create_topics`].
    pub async fn create_topics_with_quota(
        &self,
        topics: Vec<NewTopic>,
        validate_only: bool,
        quota: Option<PartitionChangeQuota>,
    ) -> Result<Vec<Result<Uuid, ControllerError>>, ControllerError> {
        self.submit_each(move |c| {
            c.partition_change_quota = quota;
            let r = c.create_topics(topics, validate_only);
            c.partition_change_quota = None;
            r
        })
        .await
    }

    /// Deletes topics by id; see [`Controller::delete_topics`].
    ///
    /// # Errors
    /// As [`ControllerHandle::create_topics`].
    pub async fn delete_topics(
        &self,
        topic_ids: Vec<Uuid>,
    ) -> Result<Vec<Result<String, ControllerError>>, ControllerError> {
        self.delete_topics_with_quota(topic_ids, None).await
    }

    /// [`ControllerHandle::delete_topics`] under a controller mutation quota (KIP-599).
    ///
    /// # Errors
    /// As [`ControllerHandle::create_topics`].
    pub async fn delete_topics_with_quota(
        &self,
        topic_ids: Vec<Uuid>,
        quota: Option<PartitionChangeQuota>,
    ) -> Result<Vec<Result<String, ControllerError>>, ControllerError> {
        self.submit_each(move |c| {
            c.partition_change_quota = quota;
            let r = c.delete_topics(topic_ids);
            c.partition_change_quota = None;
            r
        })
        .await
    }

    /// Adds partitions; see [`Controller::create_partitions`].
    ///
    /// # Errors
    /// As [`ControllerHandle::create_topics`].
    pub async fn create_partitions(
        &self,
        increases: Vec<PartitionsIncrease>,
        validate_only: bool,
    ) -> Result<Vec<Result<(), ControllerError>>, ControllerError> {
        self.create_partitions_with_quota(increases, validate_only, None)
            .await
    }

    /// [`ControllerHandle::create_partitions`] under a controller mutation quota (KIP-599).
    ///
    /// # Errors
    /// As [`ControllerHandle::create_topics`].
    pub async fn create_partitions_with_quota(
        &self,
        increases: Vec<PartitionsIncrease>,
        validate_only: bool,
        quota: Option<PartitionChangeQuota>,
    ) -> Result<Vec<Result<(), ControllerError>>, ControllerError> {
        self.submit_each(move |c| {
            c.partition_change_quota = quota;
            let r = c.create_partitions(increases, validate_only);
            c.partition_change_quota = None;
            r
        })
        .await
    }

    /// Creates ACLs (CreateAcls); see [`Controller::create_acls`]. One answer per binding.
    ///
    /// # Errors
    /// As [`ControllerHandle::create_topics`].
    pub async fn create_acls(
        &self,
        bindings: Vec<crate::acl::AclBinding>,
    ) -> Result<Vec<Result<(), ControllerError>>, ControllerError> {
        self.submit_each(move |c| c.create_acls(bindings)).await
    }

    /// Deletes the ACLs matching each filter (DeleteAcls); see [`Controller::delete_acls`].
    /// One answer per filter: the bindings it removed.
    ///
    /// # Errors
    /// As [`ControllerHandle::create_topics`].
    pub async fn delete_acls(
        &self,
        filters: Vec<crate::acl::AclBindingFilter>,
    ) -> Result<Vec<Result<Vec<crate::acl::AclBinding>, ControllerError>>, ControllerError> {
        self.submit_each(move |c| c.delete_acls(filters)).await
    }

    /// Sets or removes configs of one resource; see [`Controller::alter_configs`].
    ///
    /// # Errors
    /// UNKNOWN_TOPIC_OR_PARTITION, NOT_CONTROLLER, or the log's or the loader's failure.
    pub async fn alter_configs(
        &self,
        resource: ConfigResource,
        resource_name: &str,
        changes: Vec<(String, Option<String>)>,
    ) -> Result<(), ControllerError> {
        let resource_name = resource_name.to_string();
        self.submit_one(move |c| c.alter_configs(resource, &resource_name, changes))
            .await
    }

    /// AlterClientQuotas (API 49, KIP-546); see [`Controller::alter_client_quotas`]. Each
    /// entity's answer; when the batch is not committed or not applied here, that error is the
    /// answer of every entity that had none of its own.
    ///
    /// # Errors
    /// NOT_CONTROLLER when the controller stopped before answering.
    pub async fn alter_client_quotas(
        &self,
        alterations: Vec<crate::client_quota_control::ClientQuotaAlteration>,
        validate_only: bool,
    ) -> Result<Vec<(crate::image::QuotaEntity, Result<(), ControllerError>)>, ControllerError>
    {
        match self
            .submit(move |c| Ok(c.alter_client_quotas(alterations, validate_only)))
            .await
        {
            Ok(answers) => Ok(answers),
            Err(Failed {
                response: Some(answers),
                error,
            }) => Ok(answers
                .into_iter()
                .map(|(e, a)| (e, a.and_then(|_| Err(error.clone()))))
                .collect()),
            Err(Failed {
                response: None,
                error,
            }) => Err(error),
        }
    }

    /// AlterPartition (API 56, KIP-497) from a partition leader; see
    /// [`Controller::alter_partition`]. Returns once the change is committed and applied on
    /// this node, with each partition's new state (leader, leader epoch, ISR, partition epoch)
    /// or its error.
    ///
    /// # Errors
    /// STALE_BROKER_EPOCH, NOT_CONTROLLER, or the log's or the loader's failure.
    pub async fn alter_partition(
        &self,
        request: gregor_protocol::kafka_protocol::messages::AlterPartitionRequest,
    ) -> Result<gregor_protocol::kafka_protocol::messages::AlterPartitionResponse, ControllerError>
    {
        self.submit_one(move |c| c.alter_partition(request)).await
    }

    /// AssignReplicasToDirs (API 73, KIP-858) from a broker; see
    /// [`Controller::assign_replicas_to_dirs`]. Returns once the directories are committed
    /// and applied on this node, with each partition's error code.
    ///
    /// # Errors
    /// UNSUPPORTED_VERSION, STALE_BROKER_EPOCH, NOT_CONTROLLER, or the log's or the loader's
    /// failure.
    pub async fn assign_replicas_to_dirs(
        &self,
        request: gregor_protocol::kafka_protocol::messages::AssignReplicasToDirsRequest,
    ) -> Result<
        gregor_protocol::kafka_protocol::messages::AssignReplicasToDirsResponse,
        ControllerError,
    > {
        self.submit_one(move |c| c.assign_replicas_to_dirs(&request))
            .await
    }

    /// ElectLeaders (API 43, KIP-460); see [`Controller::elect_leaders`]. `topic_partitions`
    /// None: every partition.
    ///
    /// # Errors
    /// INVALID_REQUEST (unknown election type), NOT_CONTROLLER, or the log's or the loader's
    /// failure.
    pub async fn elect_leaders(
        &self,
        election_type: i8,
        topic_partitions: Option<Vec<(String, Vec<i32>)>>,
    ) -> Result<gregor_protocol::kafka_protocol::messages::ElectLeadersResponse, ControllerError>
    {
        self.submit_one(move |c| c.elect_leaders(election_type, topic_partitions))
            .await
    }

    /// AlterPartitionReassignments (API 45, KIP-455); see
    /// [`Controller::alter_partition_reassignments`].
    ///
    /// # Errors
    /// NOT_CONTROLLER, or the log's or the loader's failure.
    pub async fn alter_partition_reassignments(
        &self,
        request: gregor_protocol::kafka_protocol::messages::AlterPartitionReassignmentsRequest,
    ) -> Result<
        gregor_protocol::kafka_protocol::messages::AlterPartitionReassignmentsResponse,
        ControllerError,
    > {
        self.submit_one(move |c| Ok(c.alter_partition_reassignments(&request)))
            .await
    }

    /// ListPartitionReassignments (API 46, KIP-455), answered by the controller from the
    /// committed image; see [`Controller::list_partition_reassignments`].
    ///
    /// # Errors
    /// NOT_CONTROLLER.
    pub async fn list_partition_reassignments(
        &self,
        topics: Option<Vec<(String, Vec<i32>)>>,
    ) -> Result<
        gregor_protocol::kafka_protocol::messages::ListPartitionReassignmentsResponse,
        ControllerError,
    > {
        self.submit_one(move |c| {
            Ok(ControllerResult {
                records: Vec::new(),
                response: c.list_partition_reassignments(topics),
            })
        })
        .await
    }

    /// UpdateFeatures (API 57, KIP-584); see [`Controller::update_features`]. Returns once the
    /// new levels are committed and applied on this node (at once when `validate_only`).
    ///
    /// # Errors
    /// INVALID_UPDATE_VERSION, NOT_CONTROLLER, or the log's or the loader's failure.
    pub async fn update_features(
        &self,
        updates: Vec<FeatureUpdate>,
        validate_only: bool,
    ) -> Result<(), ControllerError> {
        self.submit_one(move |c| c.update_features(updates, validate_only))
            .await
    }

    /// AlterUserScramCredentials (API 51, KIP-554); see
    /// [`Controller::alter_user_scram_credentials`]. Returns one result per user once the
    /// accepted changes are committed and applied on this node.
    ///
    /// # Errors
    /// NOT_CONTROLLER, or the log's or the loader's failure.
    pub async fn alter_user_scram_credentials(
        &self,
        deletions: Vec<crate::scram_control::ScramDeletion>,
        upsertions: Vec<crate::scram_control::ScramUpsertion>,
    ) -> Result<Vec<crate::scram_control::ScramAlterResult>, ControllerError> {
        self.submit_one(move |c| Ok(c.alter_user_scram_credentials(deletions, upsertions)))
            .await
    }

    /// Takes a block of [`PRODUCER_ID_BLOCK_SIZE`] producer ids for `broker_id`; returns its
    /// first id.
    ///
    /// # Errors
    /// NOT_CONTROLLER, or the log's or the loader's failure.
    pub async fn allocate_producer_ids(&self, broker_id: i32) -> Result<i64, ControllerError> {
        self.submit_one(move |c| Ok(c.allocate_producer_ids(broker_id)))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_codes_map_back_to_their_errors() {
        for e in [
            ControllerError::InvalidReplicationFactor("x".into()),
            ControllerError::DuplicateBrokerRegistration("x".into()),
            ControllerError::StaleBrokerEpoch("x".into()),
            ControllerError::NotController { leader_id: None },
            ControllerError::UnknownTopicId,
        ] {
            assert_eq!(
                ControllerError::from_code(e.kafka_error_code(), Some("x".into())).error_code(),
                e.error_code()
            );
        }
        let timeout = ControllerError::from_code(ErrorCode::RequestTimedOut.code(), None);
        assert!(matches!(
            timeout,
            ControllerError::Remote(ErrorCode::RequestTimedOut, _)
        ));
        assert_eq!(
            ControllerError::from_code(-12345, None).error_code(),
            ErrorCode::UnknownServerError
        );
    }
    use crate::loader::{start_loader, MetadataDelta, MetadataPublisher};
    use crate::log::FileMetadataLog;
    use gregor_protocol::metadata_records::FeatureLevelRecord;
    use parking_lot::Mutex;

    struct Node {
        controller: ControllerHandle,
        shutdown: watch::Sender<bool>,
        tasks: Vec<tokio::task::JoinHandle<()>>,
    }

    impl Node {
        async fn stop(self) {
            let _ = self.shutdown.send(true);
            for t in self.tasks {
                t.await.unwrap();
            }
        }
    }

    async fn start_on(log: Arc<dyn MetadataLog>) -> Node {
        let (shutdown, rx) = watch::channel(false);
        let (loader, loader_task) = start_loader(log.subscribe().unwrap(), rx.clone());
        let (controller, controller_task) = start_controller(log, loader, rx).unwrap();
        Node {
            controller,
            shutdown,
            tasks: vec![loader_task, controller_task],
        }
    }

    /// A broker registration of `broker_id` on 127.0.0.1:9092.
    pub(crate) fn registration(broker_id: i32) -> BrokerRegistrationRequest {
        BrokerRegistrationRequest {
            broker_id,
            incarnation_id: Uuid::new_v4(),
            listeners: vec![gregor_protocol::metadata_records::BrokerEndpoint {
                name: "PLAINTEXT".into(),
                host: "127.0.0.1".into(),
                port: 9092,
                security_protocol: crate::record::SECURITY_PROTOCOL_PLAINTEXT,
                ..Default::default()
            }],
            features: BrokerRegistrationRequest::supported_features(),
            rack: None,
            log_dirs: vec![Uuid::new_v4()],
            previous_broker_epoch: -1,
        }
    }

    /// Registers broker 1 and heartbeats until it is unfenced, as a starting broker does.
    async fn register_and_unfence(c: &ControllerHandle, broker_id: i32) {
        let epoch = c.register_broker(registration(broker_id)).await.unwrap();
        let offset = c.image().offset as i64 - 1;
        let reply = c
            .broker_heartbeat(BrokerHeartbeatRequest {
                broker_id,
                broker_epoch: epoch,
                current_metadata_offset: offset,
                want_fence: false,
                want_shut_down: false,
                cordoned_log_dirs: None,
                offline_log_dirs: Vec::new(),
            })
            .await
            .unwrap();
        assert!(reply.is_caught_up && !reply.is_fenced, "{reply:?}");
        assert!(!c.image().brokers[&broker_id].fenced);
    }

    async fn start(dir: &std::path::Path) -> Node {
        let log = Arc::new(FileMetadataLog::open(dir).unwrap());
        let high_watermark = log.high_watermark();
        let node = start_on(log).await;
        node.controller
            .loader()
            .wait_for_catch_up(high_watermark)
            .await
            .unwrap();
        // A restarted node's earlier incarnation was shut down (fenced) first.
        if let Some(b) = node.controller.image().brokers.get(&1).cloned() {
            if !b.fenced {
                let reply = node
                    .controller
                    .broker_heartbeat(BrokerHeartbeatRequest {
                        broker_id: 1,
                        broker_epoch: b.epoch,
                        current_metadata_offset: node.controller.image().offset as i64 - 1,
                        want_fence: true,
                        want_shut_down: true,
                        cordoned_log_dirs: None,
                        offline_log_dirs: Vec::new(),
                    })
                    .await
                    .unwrap();
                assert!(reply.should_shut_down);
            }
        }
        register_and_unfence(&node.controller, 1).await;
        node
    }

    fn topic(name: &str, partitions: i32, rf: i16) -> NewTopic {
        NewTopic {
            name: name.into(),
            num_partitions: partitions,
            replication_factor: rf,
            assignments: vec![],
            configs: BTreeMap::from([("retention.ms".into(), "1000".into())]),
        }
    }

    async fn create(c: &ControllerHandle, t: NewTopic) -> Result<Uuid, ControllerError> {
        c.create_topics(vec![t], false).await.unwrap().remove(0)
    }

    #[tokio::test]
    async fn topics_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let node = start(dir.path()).await;
        let c = &node.controller;
        let id = create(c, topic("orders", 3, 1)).await.unwrap();
        let grow = PartitionsIncrease {
            topic: "orders".into(),
            total_count: 5,
            assignments: vec![],
        };
        c.create_partitions(vec![grow], false).await.unwrap()[0]
            .as_ref()
            .unwrap();
        assert_eq!(c.allocate_producer_ids(1).await.unwrap(), 0);
        node.stop().await;

        let node = start(dir.path()).await;
        let c = &node.controller;
        let img = c.image();
        let t = img.topic("orders").unwrap();
        assert_eq!(t.topic_id, id);
        assert_eq!(t.partitions.len(), 5);
        assert_eq!(
            img.configs_of(ConfigResource::Topic, "orders")["retention.ms"],
            "1000"
        );
        assert_eq!(
            c.allocate_producer_ids(1).await.unwrap(),
            PRODUCER_ID_BLOCK_SIZE
        );
        assert_eq!(
            c.delete_topics(vec![id]).await.unwrap()[0]
                .as_ref()
                .unwrap(),
            "orders"
        );
        assert!(c.image().topic("orders").is_none());
        assert!(c
            .image()
            .configs_of(ConfigResource::Topic, "orders")
            .is_empty());
        node.stop().await;
    }

    #[tokio::test]
    async fn kafka_errors() {
        let dir = tempfile::tempdir().unwrap();
        let node = start(dir.path()).await;
        let c = &node.controller;
        let code = |r: Result<Uuid, ControllerError>| r.unwrap_err().kafka_error_code();
        assert_eq!(code(create(c, topic("", 1, 1)).await), 17);
        assert_eq!(code(create(c, topic("a/b", 1, 1)).await), 17);
        assert_eq!(code(create(c, topic(&"x".repeat(250), 1, 1)).await), 17);
        assert_eq!(code(create(c, topic("t", 0, 1)).await), 37);
        assert_eq!(code(create(c, topic("t", 1, 3)).await), 38);
        create(c, topic("a.b", 1, 1)).await.unwrap();
        assert_eq!(code(create(c, topic("a.b", 1, 1)).await), 36);
        assert_eq!(code(create(c, topic("a_b", 1, 1)).await), 17);
        let v = c.create_topics(vec![topic("v", 1, 1)], true).await.unwrap();
        assert!(v[0].is_ok());
        assert!(
            c.image().topic("v").is_none(),
            "validate_only creates nothing"
        );
        let shrink = PartitionsIncrease {
            topic: "a.b".into(),
            total_count: 1,
            assignments: vec![],
        };
        let r = c.create_partitions(vec![shrink], false).await.unwrap();
        assert_eq!(r[0].as_ref().unwrap_err().kafka_error_code(), 37);
        let r = c
            .alter_configs(ConfigResource::Topic, "nope", vec![])
            .await
            .unwrap_err();
        assert_eq!(r.kafka_error_code(), 3);
        assert_eq!(
            c.delete_topics(vec![Uuid::new_v4()]).await.unwrap()[0]
                .as_ref()
                .unwrap_err()
                .kafka_error_code(),
            100
        );
        node.stop().await;
    }

    #[tokio::test]
    async fn colliding_names_in_one_request_and_one_batch_per_request() {
        let dir = tempfile::tempdir().unwrap();
        let node = start(dir.path()).await;
        let c = &node.controller;
        let before = c.image().offset;
        let r = c
            .create_topics(
                vec![topic("x.y", 2, 1), topic("x_y", 1, 1), topic("z", 1, 1)],
                false,
            )
            .await
            .unwrap();
        assert!(r[0].is_ok() && r[2].is_ok());
        assert_eq!(r[1].as_ref().unwrap_err().kafka_error_code(), 17);
        // Topic + config + 2 partitions, then topic + config + partition: one batch.
        assert_eq!(c.image().offset, before + 7);
        node.stop().await;
        let log = FileMetadataLog::open(dir.path()).unwrap();
        let mut s = log.subscribe().unwrap();
        let _register = s.next().await.unwrap();
        let _unfence = s.next().await.unwrap();
        let batch = s.next().await.unwrap().into_batch().unwrap();
        assert_eq!(batch.records.len(), 7);
    }

    /// Partitions get as many replicas as there are brokers (Kafka's placement); more is
    /// INVALID_REPLICATION_FACTOR with Kafka's message, and a manual assignment may name
    /// every registered broker.
    #[test]
    fn replication_factor_up_to_the_registered_brokers() {
        let mut c = Controller::with_config(MetadataImage::default(), ControllerConfig::default());
        for id in 1..=3 {
            let r = c.register_broker(registration(id)).unwrap();
            let batch = CommittedBatch {
                base_offset: c.image.offset,
                epoch: 1,
                records: r.records.into(),
            };
            c.replay(&batch);
            let r = c
                .broker_heartbeat(BrokerHeartbeatRequest {
                    broker_id: id,
                    broker_epoch: r.response,
                    current_metadata_offset: c.image.offset as i64,
                    want_fence: false,
                    want_shut_down: false,
                    cordoned_log_dirs: None,
                    offline_log_dirs: Vec::new(),
                })
                .unwrap();
            let batch = CommittedBatch {
                base_offset: c.image.offset,
                epoch: 1,
                records: r.records.into(),
            };
            c.replay(&batch);
        }
        let image = c.image.clone();
        let (_, records) = c.create_topic(&image, topic("three", 2, 3)).unwrap();
        let partitions: Vec<_> = records
            .iter()
            .filter_map(|r| match r {
                MetadataRecord::Partition(p) => Some(p.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(partitions.len(), 2);
        for p in &partitions {
            let mut replicas = p.replicas.clone();
            replicas.sort_unstable();
            assert_eq!(replicas, vec![1, 2, 3]);
            assert_eq!(p.isr.len(), 3);
            assert_eq!(p.leader, p.replicas[0]);
        }
        let err = c.create_topic(&image, topic("four", 1, 4)).unwrap_err();
        assert_eq!(err.kafka_error_code(), 38, "{err}");
        assert!(
            err.to_string()
                .contains("cannot be reached because only 3 broker(s) are registered"),
            "{err}"
        );
        let mut manual = topic("manual", -1, -1);
        manual.assignments = vec![vec![3, 1, 2]];
        assert!(c.create_topic(&image, manual).is_ok());
    }

    /// A new cluster's first change is preceded by the bootstrap records, in their own batch,
    /// committed once: a restarted controller on the same log does not repeat them.
    #[tokio::test]
    async fn the_bootstrap_records_are_committed_first_and_once() {
        let dir = tempfile::tempdir().unwrap();
        let bootstrap: Vec<MetadataRecord> = vec![FeatureLevelRecord {
            name: "metadata.version".into(),
            feature_level: 33,
            ..FeatureLevelRecord::default()
        }
        .into()];
        for round in 0..2 {
            let log: Arc<dyn MetadataLog> = Arc::new(FileMetadataLog::open(dir.path()).unwrap());
            let high_watermark = log.high_watermark();
            let (shutdown, rx) = watch::channel(false);
            let (loader, loader_task) = start_loader(log.subscribe().unwrap(), rx.clone());
            let config = ControllerConfig {
                bootstrap_records: bootstrap.clone(),
                ..ControllerConfig::default()
            };
            let (c, controller_task) =
                start_controller_with(log.clone(), loader, rx, config).unwrap();
            c.loader().wait_for_catch_up(high_watermark).await.unwrap();
            c.register_broker(registration(round + 1)).await.unwrap();
            assert_eq!(c.image().metadata_version(), Some(33));
            shutdown.send(true).unwrap();
            controller_task.await.unwrap();
            loader_task.await.unwrap();
        }
        let log = FileMetadataLog::open(dir.path()).unwrap();
        let records = log.read_all().unwrap();
        let features = records
            .iter()
            .filter(|r| matches!(r, MetadataRecord::FeatureLevel(_)))
            .count();
        assert_eq!(features, 1, "{records:?}");
        assert!(matches!(records[0], MetadataRecord::FeatureLevel(_)));
    }

    /// A metadata transaction (KIP-868) a previous controller began and did not end (here:
    /// Kafka's bootstrap records in a transaction, cut short) is aborted by the next active
    /// controller before anything else; the bootstrap records are then committed again, and
    /// no publisher ever sees a record of the aborted transaction.
    #[tokio::test]
    async fn an_open_metadata_transaction_is_aborted_on_activation() {
        use gregor_protocol::metadata_records::{BeginTransactionRecord, ConfigRecord};
        let dir = tempfile::tempdir().unwrap();
        let feature = |level: i16| -> MetadataRecord {
            FeatureLevelRecord {
                name: "metadata.version".into(),
                feature_level: level,
                ..FeatureLevelRecord::default()
            }
            .into()
        };
        let partial: MetadataRecord = ConfigRecord {
            resource_type: ConfigResource::Broker.resource_type(),
            resource_name: String::new(),
            name: "from.the.aborted.transaction".into(),
            value: Some("1".into()),
            ..Default::default()
        }
        .into();
        let log: Arc<dyn MetadataLog> = Arc::new(FileMetadataLog::open(dir.path()).unwrap());
        let begin: MetadataRecord = BeginTransactionRecord {
            name: Some("Bootstrap records".into()),
            ..Default::default()
        }
        .into();
        log.propose(vec![begin, feature(25), partial])
            .await
            .unwrap();
        let (shutdown, rx) = watch::channel(false);
        let (loader, loader_task) = start_loader(log.subscribe().unwrap(), rx.clone());
        /// Every config name and metadata.version a publisher was shown.
        type Shown = Arc<Mutex<Vec<(Vec<String>, Option<i16>)>>>;
        struct Watch(Shown);
        impl MetadataPublisher for Watch {
            fn name(&self) -> &str {
                "watch"
            }
            fn on_metadata_update(
                &self,
                _delta: &MetadataDelta<'_>,
                image: &Arc<MetadataImage>,
            ) -> Result<(), String> {
                let names = image
                    .configs_of(ConfigResource::Broker, "")
                    .keys()
                    .cloned()
                    .collect();
                self.0.lock().push((names, image.metadata_version()));
                Ok(())
            }
        }
        let shown: Shown = Arc::default();
        loader
            .install_publisher(Arc::new(Watch(shown.clone())))
            .await
            .unwrap();
        let config = ControllerConfig {
            bootstrap_records: vec![feature(33)],
            ..ControllerConfig::default()
        };
        let (c, controller_task) = start_controller_with(log.clone(), loader, rx, config).unwrap();
        c.register_broker(registration(1)).await.unwrap();
        assert_eq!(c.image().metadata_version(), Some(33));
        assert!(c.image().configs_of(ConfigResource::Broker, "").is_empty());
        let shown = shown.lock().clone();
        assert!(
            shown
                .iter()
                .all(|(names, mv)| names.is_empty() && *mv != Some(25)),
            "{shown:?}"
        );
        shutdown.send(true).unwrap();
        controller_task.await.unwrap();
        loader_task.await.unwrap();
        let records = FileMetadataLog::open(dir.path())
            .unwrap()
            .read_all()
            .unwrap();
        let kinds: Vec<&str> = records
            .iter()
            .map(|r| match r {
                MetadataRecord::BeginTransaction(_) => "begin",
                MetadataRecord::AbortTransaction(_) => "abort",
                MetadataRecord::FeatureLevel(_) => "feature",
                MetadataRecord::Config(_) => "config",
                _ => "other",
            })
            .take(5)
            .collect();
        assert_eq!(kinds, ["begin", "feature", "config", "abort", "feature"]);
    }

    /// The controller task fences a broker whose session expired on its clock, by itself, and
    /// elects the other replica: what the periodic session check commits reaches the loader.
    /// (The task's check runs every SESSION_CHECK_INTERVAL_MS of real time; the session is
    /// measured on the manual clock.)
    #[tokio::test]
    async fn the_controller_task_fences_brokers_whose_session_expired() {
        let dir = tempfile::tempdir().unwrap();
        let log: Arc<dyn MetadataLog> = Arc::new(FileMetadataLog::open(dir.path()).unwrap());
        let clock = Arc::new(ManualClock::default());
        let (shutdown, rx) = watch::channel(false);
        let (loader, loader_task) = start_loader(log.subscribe().unwrap(), rx.clone());
        let config = ControllerConfig {
            session_timeout_ms: DEFAULT_BROKER_SESSION_TIMEOUT_MS,
            clock: clock.clone(),
            placement_seed: Some(3),
            ..ControllerConfig::default()
        };
        let (c, controller_task) = start_controller_with(log, loader, rx, config).unwrap();
        register_and_unfence(&c, 1).await;
        register_and_unfence(&c, 2).await;
        let t = NewTopic {
            assignments: vec![vec![1, 2]],
            num_partitions: -1,
            replication_factor: -1,
            ..topic("t", 1, 2)
        };
        create(&c, t).await.unwrap();
        clock.advance(5_000);
        let e2 = c.image().brokers[&2].epoch;
        let offset = c.image().offset as i64 - 1;
        c.broker_heartbeat(BrokerHeartbeatRequest {
            broker_id: 2,
            broker_epoch: e2,
            current_metadata_offset: offset,
            want_fence: false,
            want_shut_down: false,
            cordoned_log_dirs: None,
            offline_log_dirs: Vec::new(),
        })
        .await
        .unwrap();
        clock.advance(4_001);
        // The next records are the fencing of broker 1 (its session ended 4001 ms after broker
        // 2's last heartbeat).
        let next = c.image().offset;
        let image = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            c.loader().wait_for_offset(next + 1),
        )
        .await
        .expect("the session check fenced broker 1")
        .unwrap();
        assert!(image.brokers[&1].fenced);
        assert!(!image.brokers[&2].fenced);
        let p = &image.topic("t").unwrap().partitions[&0];
        assert_eq!((p.leader, p.isr.clone()), (2, vec![2]));
        let _ = shutdown.send(true);
        loader_task.await.unwrap();
        controller_task.await.unwrap();
    }

    /// The controller task's periodic leader balancing (`auto.leader.rebalance.enable`) gives
    /// leadership back to the preferred replica once the leader took it back into the ISR
    /// (AlterPartition through the handle).
    #[tokio::test]
    async fn the_controller_task_balances_leaders_periodically() {
        use gregor_protocol::kafka_protocol::messages::alter_partition_request::{
            BrokerState, PartitionData, TopicData,
        };
        use gregor_protocol::kafka_protocol::messages::{AlterPartitionRequest, BrokerId};
        let dir = tempfile::tempdir().unwrap();
        let log: Arc<dyn MetadataLog> = Arc::new(FileMetadataLog::open(dir.path()).unwrap());
        let (shutdown, rx) = watch::channel(false);
        let (loader, loader_task) = start_loader(log.subscribe().unwrap(), rx.clone());
        let config = ControllerConfig {
            leader_imbalance_check_interval_ms: 100,
            ..ControllerConfig::default()
        };
        let (c, controller_task) = start_controller_with(log, loader, rx, config).unwrap();
        register_and_unfence(&c, 1).await;
        register_and_unfence(&c, 2).await;
        let t = NewTopic {
            assignments: vec![vec![1, 2]],
            num_partitions: -1,
            replication_factor: -1,
            ..topic("t", 1, 2)
        };
        let topic_id = create(&c, t).await.unwrap();
        let beat = |want_fence| BrokerHeartbeatRequest {
            broker_id: 1,
            broker_epoch: c.image().brokers[&1].epoch,
            current_metadata_offset: c.image().offset as i64,
            want_fence,
            want_shut_down: false,
            cordoned_log_dirs: None,
            offline_log_dirs: Vec::new(),
        };
        c.broker_heartbeat(beat(true)).await.unwrap();
        c.broker_heartbeat(beat(false)).await.unwrap();
        let p = c.image().topic("t").unwrap().partitions[&0].clone();
        assert_eq!((p.leader, p.isr.clone()), (2, vec![2]));
        let e1 = c.image().brokers[&1].epoch;
        let e2 = c.image().brokers[&2].epoch;
        let answer = c
            .alter_partition(
                AlterPartitionRequest::default()
                    .with_broker_id(BrokerId(2))
                    .with_broker_epoch(e2)
                    .with_topics(vec![TopicData::default()
                        .with_topic_id(topic_id)
                        .with_partitions(vec![PartitionData::default()
                            .with_partition_index(0)
                            .with_leader_epoch(p.leader_epoch)
                            .with_partition_epoch(p.partition_epoch)
                            .with_new_isr_with_epochs(vec![
                                BrokerState::default()
                                    .with_broker_id(BrokerId(2))
                                    .with_broker_epoch(e2),
                                BrokerState::default()
                                    .with_broker_id(BrokerId(1))
                                    .with_broker_epoch(e1),
                            ])])]),
            )
            .await
            .unwrap();
        assert_eq!(answer.topics[0].partitions[0].error_code, 0, "{answer:?}");
        // The next committed change is the balancing election.
        let next = c.image().offset;
        let image = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            c.loader().wait_for_offset(next),
        )
        .await
        .expect("the periodic balancing elected the preferred replica")
        .unwrap();
        let p = &image.topic("t").unwrap().partitions[&0];
        assert_eq!((p.leader, p.isr.clone()), (1, vec![2, 1]));
        let _ = shutdown.send(true);
        loader_task.await.unwrap();
        controller_task.await.unwrap();
    }

    /// The log of a node that follows the quorum: commits nothing itself.
    struct FollowerLog {
        streams: Mutex<Vec<mpsc::Sender<Committed>>>,
        high_watermark: std::sync::atomic::AtomicU64,
    }

    impl MetadataLog for FollowerLog {
        fn propose(&self, _records: Vec<MetadataRecord>) -> crate::log::ProposeFuture<'_> {
            Box::pin(async {
                Err(MetadataLogError::NotLeader {
                    leader_id: Some(2),
                    leader_epoch: 7,
                })
            })
        }

        fn subscribe(&self) -> Result<CommittedBatches, MetadataLogError> {
            let (tx, rx) = mpsc::channel(4);
            self.streams.lock().push(tx);
            Ok(CommittedBatches::new(vec![], rx))
        }

        fn high_watermark(&self) -> u64 {
            self.high_watermark
                .load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    #[tokio::test]
    async fn a_controller_that_does_not_lead_answers_not_controller_with_the_leader() {
        let follower = Arc::new(FollowerLog {
            streams: Mutex::new(Vec::new()),
            high_watermark: std::sync::atomic::AtomicU64::new(0),
        });
        let node = start_on(follower.clone()).await;
        let c = &node.controller.clone();
        let e = c.allocate_producer_ids(1).await.unwrap_err();
        assert!(
            matches!(e, ControllerError::NotController { leader_id: Some(2) }),
            "{e:?}"
        );
        assert_eq!(e.kafka_error_code(), 41);
        // It follows what the leader commits: broker 1 registered by the leader.
        let batch = CommittedBatch {
            base_offset: 0,
            epoch: 7,
            records: vec![gregor_protocol::metadata_records::RegisterBrokerRecord {
                broker_id: 1,
                fenced: false,
                ..Default::default()
            }
            .into()]
            .into(),
        };
        let streams = follower.streams.lock().clone();
        for s in streams {
            s.send(batch.clone().into()).await.unwrap();
        }
        follower
            .high_watermark
            .store(1, std::sync::atomic::Ordering::SeqCst);
        c.loader().wait_for_offset(0).await.unwrap();
        // Valid topics get NOT_CONTROLLER (only the leader commits); the others keep their
        // own error.
        let r = c
            .create_topics(vec![topic("t", 1, 1), topic("bad/name", 1, 1)], false)
            .await
            .unwrap();
        let codes: Vec<i16> = r
            .iter()
            .map(|r| r.as_ref().unwrap_err().kafka_error_code())
            .collect();
        assert_eq!(codes, vec![41, 17]);
        // A request that commits nothing is answered without the leader.
        let r = c.delete_topics(vec![Uuid::new_v4()]).await.unwrap();
        assert_eq!(r[0].as_ref().unwrap_err().kafka_error_code(), 100);
        node.stop().await;
        // With the controller gone, calls fail with NOT_CONTROLLER instead of hanging.
        let e = c.allocate_producer_ids(1).await.unwrap_err();
        assert_eq!(e.kafka_error_code(), 41);
    }

    struct Recorder {
        name: &'static str,
        calls: Arc<Mutex<Vec<(&'static str, u64)>>>,
    }

    impl MetadataPublisher for Recorder {
        fn name(&self) -> &str {
            self.name
        }

        fn on_metadata_update(
            &self,
            _delta: &MetadataDelta<'_>,
            image: &Arc<MetadataImage>,
        ) -> Result<(), String> {
            self.calls.lock().push((self.name, image.offset));
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_change_returns_after_every_publisher_applied_it_and_changes_are_serialised() {
        let dir = tempfile::tempdir().unwrap();
        let node = start(dir.path()).await;
        let c = node.controller.clone();
        let calls = Arc::new(Mutex::new(Vec::new()));
        for name in ["replica manager", "coordinators"] {
            c.loader()
                .install_publisher(Arc::new(Recorder {
                    name,
                    calls: calls.clone(),
                }))
                .await
                .unwrap();
        }
        // Many concurrent requests: each is validated against all before it (ids never repeat)
        // and, when it returns, both publishers have seen its batch.
        let mut tasks = Vec::new();
        for _ in 0..16 {
            let c = c.clone();
            let calls = calls.clone();
            tasks.push(tokio::spawn(async move {
                let start = c.allocate_producer_ids(1).await.unwrap();
                let offset = c.image().offset;
                let seen = calls.lock().clone();
                assert!(seen.contains(&("replica manager", offset)));
                assert!(seen.contains(&("coordinators", offset)));
                start
            }));
        }
        let mut starts = Vec::new();
        for t in tasks {
            starts.push(t.await.unwrap());
        }
        starts.sort_unstable();
        let expected: Vec<i64> = (0..16).map(|i| i * PRODUCER_ID_BLOCK_SIZE).collect();
        assert_eq!(starts, expected);
        // Publishers are called in install order, batch by batch.
        let seen = calls.lock().clone();
        for pair in seen.chunks(2) {
            assert_eq!(pair[0].0, "replica manager");
            assert_eq!(pair[1].0, "coordinators");
            assert_eq!(pair[0].1, pair[1].1);
        }
        node.stop().await;
    }
}
