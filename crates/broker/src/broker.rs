//! The broker's shared state: configuration, the controller, the [`ReplicaManager`], the group
//! coordinator and the [`Authorizer`], wired together once at start-up
//! ([`crate::server::start`]) and shared by every handler through `Arc<Broker>`. Services
//! reach each other through it; none of them imports a handler or the server.

use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use gregor_metadata::ControllerHandle;
use gregor_network::RequestContext;

use crate::authorizer::{
    AclOperation, Action, AuthorizationResult, Authorizer, ResourcePattern, ResourceType,
};
use crate::config::BrokerConfig;
use crate::group_coordinator::GroupCoordinator;
use crate::replica_manager::ReplicaManager;

/// Hands out producer ids from blocks the controller allocates durably.
struct ProducerIdBlock {
    next: i64,
    end: i64,
}

/// Shared state of a running broker.
pub struct Broker {
    /// Configuration.
    pub config: BrokerConfig,
    /// `cluster.id` from `meta.properties`.
    pub cluster_id: String,
    /// The channel to the metadata controller (one-voter quorum); its `image()` is the
    /// metadata this node has applied.
    pub controller: ControllerHandle,
    /// Hosted partitions.
    pub replica_manager: ReplicaManager,
    /// This node's member of the metadata quorum (KRaft), set once at start-up; the KRaft
    /// APIs (Vote, BeginQuorumEpoch, EndQuorumEpoch, DescribeQuorum, Fetch of
    /// `__cluster_metadata`) are handed to it.
    pub raft: std::sync::OnceLock<std::sync::Arc<gregor_raft::driver::RaftManager>>,
    /// The way to the active controller (local when this node leads the quorum, the
    /// controller channel otherwise), set once at start-up; unset (in-process tests of one
    /// node), the local controller is used.
    pub controller_client: std::sync::OnceLock<Arc<crate::controller_channel::ControllerClient>>,
    /// The replica fetchers of the partitions this broker follows, set once at start-up on a
    /// node with the broker role (the replica manager drives them through
    /// [`crate::replica_manager::ReplicaFetchers`]); shutdown stops them, the checkpoints read
    /// them.
    pub replica_fetchers: std::sync::OnceLock<Arc<crate::replica_fetcher::ReplicaFetcherManager>>,
    /// The TLS listeners' dynamic config publisher, set once at start-up when there are TLS
    /// listeners: AlterConfigs validates `listener.name.<l>.ssl.*` changes with it.
    pub tls_listeners: std::sync::OnceLock<Arc<crate::listener_security::TlsConfigPublisher>>,
    /// Tells the active controller which log directory holds each replica (KIP-858), set
    /// once at start-up on a node with the broker role; the metadata publisher queues the
    /// assignments.
    pub assignments: std::sync::OnceLock<Arc<crate::assignments::AssignmentsManager>>,
    /// How this broker's own connections to the inter-broker listener of other brokers are
    /// secured (transaction markers and verification), set once at start-up; unset:
    /// plaintext.
    pub inter_broker_client: std::sync::OnceLock<gregor_network::client::ClientSecurity>,
    /// This incarnation's broker epoch (-1 before registration).
    pub broker_epoch: std::sync::atomic::AtomicI64,
    /// Consumer groups and committed offsets (`__consumer_offsets`).
    pub group_coordinator: GroupCoordinator,
    /// Transactional ids and their transactions (`__transaction_state`).
    pub transaction_coordinator: Arc<gregor_coordinator::transaction::TransactionCoordinator>,
    /// Incremental fetch sessions (KIP-227), sized by
    /// `max.incremental.fetch.session.cache.slots`.
    pub fetch_sessions: crate::fetch_session::FetchSessionCache,
    producer_ids: tokio::sync::Mutex<ProducerIdBlock>,
    /// Bound listener addresses (the real ports when a listener asked for port 0).
    pub bound: Vec<SocketAddr>,
    /// Decides what each request's principal may do (allows everything until ACLs land).
    pub authorizer: Arc<dyn Authorizer>,
    /// What the group coordinator does when a transaction with offset commits ends (called
    /// after the markers of WriteTxnMarkers reach `__consumer_offsets` partitions,
    /// [`crate::txn_markers`]): the group coordinator's, installed at start-up
    /// ([`Broker::set_txn_offsets_completion`]; an in-process test may replace it).
    txn_offsets_completion: parking_lot::RwLock<Option<Arc<dyn TxnOffsetsCompletion>>>,
    /// Client quotas (KIP-13, KIP-124, KIP-599): the rates recorded per user and client id
    /// and the throttle times they give ([`crate::client_quota`]).
    pub client_quotas: crate::client_quota::ClientQuotaManagers,
    started: Instant,
}

impl Broker {
    /// The connector of this broker's own inter-broker connections (plaintext until set).
    pub fn inter_broker_security(&self) -> gregor_network::client::ClientSecurity {
        self.inter_broker_client.get().cloned().unwrap_or_default()
    }

    /// Wires the broker's services together. Called once by [`crate::server::start`]. The
    /// coordinators reach the broker's partitions and metadata through weak handles
    /// (`coordinator_writer`), so the broker is built cyclically: `coordinators` builds the
    /// group and the transaction coordinator from the broker's weak handle.
    pub(crate) fn new(
        config: BrokerConfig,
        cluster_id: String,
        controller: ControllerHandle,
        replica_manager: ReplicaManager,
        bound: Vec<SocketAddr>,
        authorizer: Arc<dyn Authorizer>,
        coordinators: impl FnOnce(
            &Weak<Broker>,
        ) -> (
            GroupCoordinator,
            Arc<gregor_coordinator::transaction::TransactionCoordinator>,
        ),
    ) -> Arc<Self> {
        Arc::new_cyclic(|weak| {
            let (group_coordinator, transaction_coordinator) = coordinators(weak);
            Self {
                group_coordinator,
                transaction_coordinator,
                client_quotas: crate::client_quota::ClientQuotaManagers::new(
                    config.quota_window_num(),
                    config.quota_window_size_seconds(),
                    config.controller_quota_window_num(),
                    config.controller_quota_window_size_seconds(),
                ),
                fetch_sessions: crate::fetch_session::FetchSessionCache::new(
                    config.max_incremental_fetch_session_cache_slots(),
                    config.min_incremental_fetch_session_eviction_ms(),
                ),
                config,
                cluster_id,
                controller,
                replica_manager,
                raft: std::sync::OnceLock::new(),
                controller_client: std::sync::OnceLock::new(),
                replica_fetchers: std::sync::OnceLock::new(),
                tls_listeners: std::sync::OnceLock::new(),
                assignments: std::sync::OnceLock::new(),
                inter_broker_client: std::sync::OnceLock::new(),
                broker_epoch: std::sync::atomic::AtomicI64::new(-1),
                producer_ids: tokio::sync::Mutex::new(ProducerIdBlock { next: 0, end: 0 }),
                bound,
                authorizer,
                txn_offsets_completion: parking_lot::RwLock::new(None),
                started: Instant::now(),
            }
        })
    }

    /// Installs what ends transactional offset commits when markers reach
    /// `__consumer_offsets` (replacing the one installed before, if any).
    pub fn set_txn_offsets_completion(&self, hook: Arc<dyn TxnOffsetsCompletion>) {
        *self.txn_offsets_completion.write() = Some(hook);
    }

    /// The installed [`TxnOffsetsCompletion`], if any.
    pub fn txn_offsets_completion(&self) -> Option<Arc<dyn TxnOffsetsCompletion>> {
        self.txn_offsets_completion.read().clone()
    }

    /// Whether `ctx`'s principal may perform `operation` on the named resource (one literal
    /// resource; see [`Authorizer::authorize`] for batches).
    pub fn authorize(
        &self,
        ctx: &RequestContext,
        operation: AclOperation,
        resource_type: ResourceType,
        name: &str,
    ) -> bool {
        let action = Action::new(operation, ResourcePattern::literal(resource_type, name));
        self.authorizer
            .authorize(ctx, std::slice::from_ref(&action))
            .first()
            .is_some_and(|r| *r == AuthorizationResult::Allowed)
    }

    /// KIP-430's authorized operations of one resource: a bit field with bit `code` set for
    /// each operation of the resource type (Kafka's `AclEntry.supportedOperations`) that
    /// `ctx`'s principal may perform (Kafka's `AuthHelper.authorizedOperations`). Nothing is
    /// logged for these checks.
    pub fn authorized_operations(
        &self,
        ctx: &RequestContext,
        resource_type: ResourceType,
        name: &str,
    ) -> i32 {
        use AclOperation as O;
        let supported: &[AclOperation] = match resource_type {
            ResourceType::Topic => &[
                O::Read,
                O::Write,
                O::Create,
                O::Describe,
                O::Delete,
                O::Alter,
                O::DescribeConfigs,
                O::AlterConfigs,
            ],
            ResourceType::Group => &[
                O::Read,
                O::Describe,
                O::Delete,
                O::DescribeConfigs,
                O::AlterConfigs,
            ],
            ResourceType::Cluster => &[
                O::Create,
                O::ClusterAction,
                O::DescribeConfigs,
                O::AlterConfigs,
                O::IdempotentWrite,
                O::Alter,
                O::Describe,
            ],
            ResourceType::TransactionalId => &[O::Describe, O::Write],
            ResourceType::DelegationToken => &[O::Describe],
            ResourceType::User => &[O::CreateTokens, O::DescribeTokens],
        };
        let actions: Vec<Action> = supported
            .iter()
            .map(|op| Action {
                log_if_allowed: false,
                log_if_denied: false,
                ..Action::new(*op, ResourcePattern::literal(resource_type, name))
            })
            .collect();
        self.authorizer
            .authorize(ctx, &actions)
            .iter()
            .zip(supported)
            .filter(|(r, _)| **r == AuthorizationResult::Allowed)
            .fold(0i32, |bits, (_, op)| bits | (1 << op.code()))
    }

    /// Whether `ctx`'s principal may perform `operation` on some resource of `resource_type`
    /// (Kafka's `authorizeByResourceType`, KIP-679).
    pub fn authorize_by_resource_type(
        &self,
        ctx: &RequestContext,
        operation: AclOperation,
        resource_type: ResourceType,
    ) -> bool {
        self.authorizer
            .authorize_by_resource_type(ctx, operation, resource_type)
            == AuthorizationResult::Allowed
    }

    /// A fresh producer id (InitProducerId). Ids come from durable blocks of 1000, so they are
    /// never reused across restarts.
    ///
    /// # Errors
    /// The controller's error when a new block cannot be allocated.
    pub async fn next_producer_id(&self) -> Result<i64, gregor_metadata::ControllerError> {
        let mut b = self.producer_ids.lock().await;
        if b.next >= b.end {
            let start = match self.controller_client.get() {
                Some(client) => {
                    client
                        .allocate_producer_ids(
                            self.config.node_id,
                            self.broker_epoch.load(std::sync::atomic::Ordering::Relaxed),
                        )
                        .await?
                }
                None => {
                    self.controller
                        .allocate_producer_ids(self.config.node_id)
                        .await?
                }
            };
            b.next = start;
            b.end = start + gregor_metadata::controller::PRODUCER_ID_BLOCK_SIZE;
        }
        let id = b.next;
        b.next += 1;
        Ok(id)
    }

    /// Creates topics the broker itself needs (`__consumer_offsets`, Metadata
    /// auto-creation) on the active controller; returns once this node has applied them. One
    /// answer per topic.
    ///
    /// # Errors
    /// NOT_CONTROLLER when the local controller stopped, REQUEST_TIMED_OUT when the active
    /// controller could not be reached.
    pub async fn create_topics_internal(
        &self,
        topics: Vec<gregor_metadata::controller::NewTopic>,
    ) -> Result<
        Vec<Result<uuid::Uuid, gregor_metadata::ControllerError>>,
        gregor_metadata::ControllerError,
    > {
        match self.controller_client.get() {
            Some(client) => client.create_topics(topics).await,
            None => self.controller.create_topics(topics, false).await,
        }
    }

    /// Seconds since start-up.
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }
}

/// What the group coordinator does when a transaction that committed offsets ends (Kafka's
/// `GroupCoordinator.onTransactionCompleted`): the marker for `producer_id` was written and
/// replicated on each of `partitions` (all `__consumer_offsets` partitions led here); with
/// `TransactionResult::Commit` ([`gregor_protocol::control::TransactionResult`]) the producer's
/// pending offsets there become committed, with `Abort` they are dropped. An `Err` carries the
/// Kafka error code the
/// coordinator answers for those partitions (Kafka answers UNKNOWN_SERVER_ERROR when this
/// throws).
pub trait TxnOffsetsCompletion: Send + Sync {
    /// See the trait.
    ///
    /// # Errors
    /// A Kafka error code for all of `partitions`.
    fn on_transaction_completed(
        &self,
        producer_id: i64,
        producer_epoch: i16,
        partitions: &[i32],
        result: gregor_protocol::control::TransactionResult,
    ) -> Result<(), i16>;
}
