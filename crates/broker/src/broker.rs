//! The broker's shared state: configuration, the controller, the [`ReplicaManager`], the group
//! coordinator and the [`Authorizer`], wired together once at start-up
//! ([`crate::server::start`]) and shared by every handler through `Arc<Broker>`. Services
//! reach each other through it; none of them imports a handler or the server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gregor_metadata::Controller;
use gregor_network::RequestContext;
use parking_lot::Mutex;

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
    /// The metadata controller (one-voter quorum).
    pub controller: Controller,
    /// Hosted partitions.
    pub replica_manager: ReplicaManager,
    /// Consumer groups and committed offsets (`__consumer_offsets`).
    pub group_coordinator: GroupCoordinator,
    publish_lock: Mutex<()>,
    producer_ids: Mutex<ProducerIdBlock>,
    /// Bound listener addresses (the real ports when a listener asked for port 0).
    pub bound: Vec<SocketAddr>,
    /// Decides what each request's principal may do (allows everything until ACLs land).
    pub authorizer: Arc<dyn Authorizer>,
    started: Instant,
}

impl Broker {
    /// Wires the broker's services together. Called once by [`crate::server::start`].
    pub(crate) fn new(
        config: BrokerConfig,
        cluster_id: String,
        controller: Controller,
        replica_manager: ReplicaManager,
        group_coordinator: GroupCoordinator,
        bound: Vec<SocketAddr>,
        authorizer: Arc<dyn Authorizer>,
    ) -> Self {
        Self {
            config,
            cluster_id,
            controller,
            replica_manager,
            group_coordinator,
            publish_lock: Mutex::new(()),
            producer_ids: Mutex::new(ProducerIdBlock { next: 0, end: 0 }),
            bound,
            authorizer,
            started: Instant::now(),
        }
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

    /// Applies the controller's latest image to the hosted partitions. Called after every
    /// metadata change (and, with Raft, whenever a committed record arrives).
    ///
    /// # Errors
    /// A log error while creating or deleting partition logs.
    pub fn publish_metadata(&self) -> Result<(), gregor_log::LogError> {
        let _g = self.publish_lock.lock();
        self.replica_manager.apply_image(&self.controller.image())
    }

    /// A fresh producer id (InitProducerId). Ids come from durable blocks of 1000, so they are
    /// never reused across restarts.
    ///
    /// # Errors
    /// The controller's error when a new block cannot be allocated.
    pub fn next_producer_id(&self) -> Result<i64, gregor_metadata::ControllerError> {
        let mut b = self.producer_ids.lock();
        if b.next >= b.end {
            let start = self.controller.allocate_producer_ids(self.config.node_id)?;
            b.next = start;
            b.end = start + gregor_metadata::controller::PRODUCER_ID_BLOCK_SIZE;
        }
        let id = b.next;
        b.next += 1;
        Ok(id)
    }

    /// Seconds since start-up.
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }
}
