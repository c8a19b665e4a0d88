//! The controller listeners (`controller.listener.names`), served as Kafka's
//! `ControllerServer` serves them: separately from the broker listeners and before the broker
//! is up, since a quorum of nodes that are all starting must elect a leader before any of them
//! can load its metadata. They answer ApiVersions (listing the controller APIs), the KRaft
//! APIs (Vote, BeginQuorumEpoch, EndQuorumEpoch, Fetch of `__cluster_metadata`,
//! DescribeQuorum; the last needs `Describe` on the Cluster, as Kafka's
//! `ControllerApis.handleDescribeQuorum` checks) through this node's [`RaftManager`], and DescribeCluster with
//! `EndpointType` 2 (KIP-919: the controllers and the active one, which
//! `kafka-metadata-quorum --bootstrap-controller` asks first).
//!
//! The active controller also answers the brokers' controller RPCs (Kafka's `ControllerApis`):
//! BrokerRegistration (62), BrokerHeartbeat (63), UnregisterBroker (64),
//! AllocateProducerIds (67), AlterPartition (56, from partition leaders) and
//! AssignReplicasToDirs (73, KIP-858) through this
//! node's [`ControllerHandle`]; CreateTopics, DeleteTopics, CreatePartitions, AlterConfigs,
//! IncrementalAlterConfigs, ElectLeaders, UpdateFeatures, AlterPartitionReassignments and
//! ListPartitionReassignments sent by a broker
//! (its own topic creations) or forwarded in an Envelope (58, KIP-590: the client's request
//! with its principal, `DefaultPrincipalData`, and address) through this node's broker
//! handlers, which validate and commit through the same handle; a DescribeQuorum forwarded in
//! an Envelope is answered by this node's quorum member, authorised as the client's. A node whose controller is not
//! the active one answers NOT_CONTROLLER, and the broker's channel re-sends to the new one.

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use gregor_metadata::controller::BrokerHeartbeatRequest;
use gregor_metadata::{ControllerError, ControllerHandle};
use gregor_network::{respond, Handled, RequestContext};
use gregor_protocol::kafka_protocol::messages::api_versions_response::ApiVersion;
use gregor_protocol::kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use gregor_protocol::kafka_protocol::messages::{
    self as m, ApiKey, ApiVersionsResponse, BrokerId, DescribeClusterResponse, RequestKind,
    ResponseKind,
};
use gregor_raft::driver::RaftManager;

use crate::broker::Broker;
use crate::handlers::{forwarding, kraft, sb};
use gregor_protocol::error::ErrorCode;

/// The APIs of a controller listener besides the KRaft ones.
const CONTROLLER_API_KEYS: &[ApiKey] = &[
    ApiKey::ApiVersions,
    ApiKey::DescribeCluster,
    ApiKey::Fetch,
    ApiKey::CreateTopics,
    ApiKey::DeleteTopics,
    ApiKey::CreatePartitions,
    ApiKey::AlterConfigs,
    ApiKey::IncrementalAlterConfigs,
    ApiKey::DescribeConfigs,
    ApiKey::Envelope,
    ApiKey::BrokerRegistration,
    ApiKey::BrokerHeartbeat,
    ApiKey::UnregisterBroker,
    ApiKey::AllocateProducerIds,
    ApiKey::AlterPartition,
    ApiKey::AssignReplicasToDirs,
    ApiKey::ElectLeaders,
    ApiKey::UpdateFeatures,
    ApiKey::AlterPartitionReassignments,
    ApiKey::ListPartitionReassignments,
    // Answered by the SASL authenticator on a SASL listener (Kafka lists them on every
    // controller listener; the Java client picks its SaslHandshake and SaslAuthenticate
    // versions from this list, and falls back to handshake v0 without them).
    ApiKey::SaslHandshake,
    ApiKey::SaslAuthenticate,
];

/// Kafka 4.4's version ranges of the broker-to-controller RPCs (`BrokerRegistration` 0-4,
/// `BrokerHeartbeat` 0-2 (v2: cordoned log dirs, KIP-1066), `UnregisterBroker` 0, `AllocateProducerIds` 0, `Envelope` 0,
/// `AlterPartition` 2-3: topic ids, and from v3 the broker epochs of the new ISR, KIP-903;
/// `AssignReplicasToDirs` 0, KIP-858).
pub fn controller_rpc_versions(api_key: ApiKey) -> Option<(i16, i16)> {
    match api_key {
        ApiKey::BrokerRegistration => Some((0, 4)),
        ApiKey::BrokerHeartbeat => Some((0, 2)),
        ApiKey::AlterPartition => Some((2, 3)),
        ApiKey::UnregisterBroker
        | ApiKey::AllocateProducerIds
        | ApiKey::Envelope
        | ApiKey::AssignReplicasToDirs => Some((0, 0)),
        _ => None,
    }
}

/// [`gregor_network::RequestHandler`] of the controller listeners.
pub struct ControllerApis {
    raft: Arc<RaftManager>,
    cluster_id: String,
    /// This node's controller, once the metadata is loaded.
    controller: OnceLock<ControllerHandle>,
    /// This node's broker, once it serves (handles forwarded admin requests).
    broker: OnceLock<Arc<Broker>>,
    /// The quorum's `kraft.version` (KIP-853), finalized in ApiVersions when above 0.
    kraft_version: i16,
    /// Decides DescribeQuorum (`Describe` on the Cluster); the broker's authorizer.
    authorizer: Arc<dyn crate::authorizer::Authorizer>,
}

impl ControllerApis {
    /// The handler answering for `raft` in cluster `cluster_id`.
    pub fn new(raft: Arc<RaftManager>, cluster_id: String) -> Self {
        Self {
            raft,
            cluster_id,
            controller: OnceLock::new(),
            broker: OnceLock::new(),
            kraft_version: 0,
            authorizer: Arc::new(crate::authorizer::AllowEverythingAuthorizer),
        }
    }

    /// The handler deciding with `authorizer` (default: allow everything, Kafka without
    /// `authorizer.class.name`).
    #[must_use]
    pub fn with_authorizer(mut self, authorizer: Arc<dyn crate::authorizer::Authorizer>) -> Self {
        self.authorizer = authorizer;
        self
    }

    /// The handler for a quorum at `kraft_version` (1: a dynamic quorum, KIP-853).
    #[must_use]
    pub fn with_kraft_version(mut self, kraft_version: i16) -> Self {
        self.kraft_version = kraft_version;
        self
    }

    /// Hands over this node's controller (start-up, once the metadata is loaded). Before,
    /// the controller RPCs are answered NOT_CONTROLLER.
    pub fn set_controller(&self, controller: ControllerHandle) {
        let _ = self.controller.set(controller);
    }

    /// Hands over this node's broker (start-up, once it serves). Before, admin requests are
    /// answered NOT_CONTROLLER.
    pub fn set_broker(&self, broker: Arc<Broker>) {
        let _ = self.broker.set(broker);
    }

    /// True when this node leads the metadata quorum.
    fn is_active(&self) -> bool {
        self.raft.leader_and_epoch().borrow().leader_id == Some(self.raft.node_id())
    }

    fn api_versions(&self) -> ApiVersionsResponse {
        let mut keys: Vec<ApiVersion> = CONTROLLER_API_KEYS
            .iter()
            .chain(gregor_raft::driver::KRAFT_API_KEYS)
            .filter_map(|k| {
                self.versions(*k).map(|(min, max)| {
                    ApiVersion::default()
                        .with_api_key(*k as i16)
                        .with_min_version(min)
                        .with_max_version(max)
                })
            })
            .collect();
        keys.sort_by_key(|k| k.api_key);
        let image = self.controller.get().map(ControllerHandle::image);
        crate::handlers::api_versions::with_features(
            ApiVersionsResponse::default().with_api_keys(keys),
            image.as_deref(),
            self.kraft_version,
        )
    }

    fn versions(&self, api_key: ApiKey) -> Option<(i16, i16)> {
        match api_key {
            // KRaft fetchers use v13+ (topic ids).
            ApiKey::Fetch => {
                crate::handlers::supported_versions(ApiKey::Fetch).map(|(_, max)| (13, max))
            }
            ApiKey::ApiVersions
            | ApiKey::DescribeCluster
            | ApiKey::CreateTopics
            | ApiKey::DeleteTopics
            | ApiKey::CreatePartitions
            | ApiKey::AlterConfigs
            | ApiKey::IncrementalAlterConfigs
            | ApiKey::DescribeConfigs
            | ApiKey::ElectLeaders
            | ApiKey::UpdateFeatures
            | ApiKey::AlterPartitionReassignments
            | ApiKey::ListPartitionReassignments
            | ApiKey::AlterUserScramCredentials
            | ApiKey::CreateAcls
            | ApiKey::DeleteAcls
            | ApiKey::SaslHandshake
            | ApiKey::SaslAuthenticate => crate::handlers::supported_versions(api_key),
            other => controller_rpc_versions(other).or_else(|| kraft::versions(other)),
        }
    }

    /// DescribeCluster as Kafka's `ControllerApis` answers it (`AuthHelper.computeDescribeClusterResponse`):
    /// the voters at their controller endpoints and the leader as `ControllerId` (-1 when
    /// unknown); a request for another endpoint type gets MISMATCHED_ENDPOINT_TYPE (an unknown
    /// type UNSUPPORTED_ENDPOINT_TYPE), INVALID_REQUEST at v0.
    fn describe_cluster(&self, endpoint_type: i8, version: i16) -> DescribeClusterResponse {
        let error = |code: ErrorCode, message: String| {
            let code = if version == 0 {
                ErrorCode::InvalidRequest
            } else {
                code
            };
            DescribeClusterResponse::default()
                .with_error_code(code.code())
                .with_error_message(Some(sb(&message)))
        };
        match endpoint_type {
            2 => {}
            1 => {
                return error(
                    ErrorCode::MismatchedEndpointType,
                    "The request was sent to an endpoint of type CONTROLLER, but we wanted an endpoint of type BROKER".into(),
                )
            }
            other => {
                return error(
                    ErrorCode::UnsupportedEndpointType,
                    format!("Unsupported endpoint type {other}"),
                )
            }
        }
        let leader = self.raft.leader_and_epoch().borrow().leader_id;
        DescribeClusterResponse::default()
            .with_cluster_id(sb(&self.cluster_id))
            .with_controller_id(BrokerId(leader.unwrap_or(-1)))
            .with_cluster_authorized_operations(i32::MIN)
            .with_endpoint_type(2)
            .with_brokers(
                self.raft
                    .config()
                    .voter_endpoints
                    .iter()
                    .map(|(&id, (host, port))| {
                        DescribeClusterBroker::default()
                            .with_broker_id(BrokerId(id))
                            .with_host(sb(host))
                            .with_port(i32::from(*port))
                    })
                    .collect(),
            )
    }
}

impl gregor_network::RequestHandler for ControllerApis {
    fn supported_versions(&self, api_key: ApiKey) -> Option<(i16, i16)> {
        self.versions(api_key)
    }

    async fn handle(&self, ctx: &RequestContext, body: RequestKind) -> Handled {
        let header = ctx.header.clone();
        let api_key = ctx.api_key;
        let version = header.request_api_version;
        if let Some(operation) = kraft::required_cluster_operation(api_key) {
            let action = crate::authorizer::Action::new(
                operation,
                crate::authorizer::ResourcePattern::cluster(),
            );
            let allowed = self
                .authorizer
                .authorize(ctx, std::slice::from_ref(&action))
                .first()
                .is_some_and(|r| *r == crate::authorizer::AuthorizationResult::Allowed);
            if !allowed {
                if let Some(response) =
                    kraft::cluster_authorization_failed(api_key, &ctx.principal.to_string())
                {
                    return Handled::Ready(respond(&header, api_key, response));
                }
            }
        }
        match body {
            RequestKind::ApiVersions(_) => Handled::Ready(respond(
                &header,
                api_key,
                ResponseKind::ApiVersions(self.api_versions()),
            )),
            RequestKind::DescribeCluster(r) => Handled::Ready(respond(
                &header,
                api_key,
                ResponseKind::DescribeCluster(self.describe_cluster(r.endpoint_type, version)),
            )),
            RequestKind::BrokerRegistration(r) => {
                let response = self.broker_registration(&r).await;
                Handled::Ready(respond(&header, api_key, response.into()))
            }
            RequestKind::BrokerHeartbeat(r) => {
                let response = self.broker_heartbeat(&r).await;
                Handled::Ready(respond(&header, api_key, response.into()))
            }
            RequestKind::UnregisterBroker(r) => {
                let response = self.unregister_broker(&r).await;
                Handled::Ready(respond(&header, api_key, response.into()))
            }
            RequestKind::AllocateProducerIds(r) => {
                let response = self.allocate_producer_ids(&r).await;
                Handled::Ready(respond(&header, api_key, response.into()))
            }
            RequestKind::AlterPartition(r) => {
                let response = self.alter_partition(r).await;
                Handled::Ready(respond(&header, api_key, response.into()))
            }
            RequestKind::AssignReplicasToDirs(r) => {
                let response = self.assign_replicas_to_dirs(r).await;
                Handled::Ready(respond(&header, api_key, response.into()))
            }
            RequestKind::Envelope(r) => {
                let response = self.envelope(ctx, r).await;
                Handled::Ready(respond(&header, api_key, response.into()))
            }
            // Any controller answers from its own metadata and config (Kafka's
            // `ControllerApis.handleDescribeConfigsRequest`), as `kafka-configs
            // --bootstrap-controller --describe` expects.
            RequestKind::DescribeConfigs(r) => {
                let response = match self.broker.get() {
                    Some(broker) => {
                        crate::handlers::configs::describe_configs(broker, ctx, &r, version).into()
                    }
                    // Not reachable in practice: the listener is served before the metadata
                    // loads, so a request can arrive that early.
                    None => m::DescribeConfigsResponse::default()
                        .with_results(
                            r.resources
                                .iter()
                                .map(|res| {
                                    m::describe_configs_response::DescribeConfigsResult::default()
                                        .with_error_code(ErrorCode::NotController.code())
                                        .with_error_message(Some(
                                            "the controller has not loaded its metadata yet"
                                                .to_string()
                                                .into(),
                                        ))
                                        .with_resource_type(res.resource_type)
                                        .with_resource_name(res.resource_name.clone())
                                })
                                .collect(),
                        )
                        .into(),
                };
                Handled::Ready(respond(&header, api_key, response))
            }
            body @ (RequestKind::CreateTopics(_)
            | RequestKind::DeleteTopics(_)
            | RequestKind::CreatePartitions(_)
            | RequestKind::AlterConfigs(_)
            | RequestKind::IncrementalAlterConfigs(_)
            | RequestKind::ElectLeaders(_)
            | RequestKind::UpdateFeatures(_)
            | RequestKind::AlterPartitionReassignments(_)
            | RequestKind::ListPartitionReassignments(_)
            | RequestKind::AlterUserScramCredentials(_)
            | RequestKind::CreateAcls(_)
            | RequestKind::DeleteAcls(_)) => {
                let response = match self.broker.get() {
                    Some(broker) if self.is_active() => {
                        forwarding::handle_local(broker, ctx, body).await
                    }
                    _ => forwarding::error_response(
                        &body,
                        ErrorCode::NotController,
                        Some(ControllerError::NotController { leader_id: None }.to_string()),
                    ),
                };
                Handled::Ready(respond(&header, api_key, response))
            }
            // Kafka's `handleSaslHandshakeRequest`/`handleSaslAuthenticateRequest`: a SASL
            // request that reaches the API layer (a listener without SASL, or one already
            // authenticated) is out of place.
            RequestKind::SaslHandshake(_) => Handled::Ready(respond(
                &header,
                api_key,
                m::SaslHandshakeResponse::default()
                    .with_error_code(ErrorCode::IllegalSaslState.code())
                    .into(),
            )),
            RequestKind::SaslAuthenticate(_) => Handled::Ready(respond(
                &header,
                api_key,
                m::SaslAuthenticateResponse::default()
                    .with_error_code(ErrorCode::IllegalSaslState.code())
                    .with_error_message(Some(sb(
                        "SaslAuthenticate request received after successful authentication",
                    )))
                    .into(),
            )),
            RequestKind::DescribeQuorum(r) => {
                let (raft, authorizer, ctx) =
                    (self.raft.clone(), self.authorizer.clone(), ctx.clone());
                Handled::Deferred(Box::pin(async move {
                    let response =
                        kraft::describe_quorum(&raft, authorizer.as_ref(), &ctx, &r).await;
                    respond(&header, api_key, response.into())
                }))
            }
            body => {
                let raft = self.raft.clone();
                Handled::Deferred(Box::pin(async move {
                    let response = raft.handle_kafka_request(&body, version).await?;
                    respond(&header, api_key, response)
                }))
            }
        }
    }

    fn unsupported_api_versions(&self, correlation_id: i32) -> Option<Bytes> {
        crate::handlers::api_versions::unsupported_version_response(correlation_id)
    }
}

impl ControllerApis {
    /// This node's controller when it is the active one.
    fn active_controller(&self) -> Result<&ControllerHandle, ControllerError> {
        match self.controller.get() {
            Some(c) if self.is_active() => Ok(c),
            _ => Err(ControllerError::NotController {
                leader_id: self.raft.leader_and_epoch().borrow().leader_id,
            }),
        }
    }

    /// BrokerRegistration (62, KIP-631): INCONSISTENT_CLUSTER_ID for another cluster's broker,
    /// otherwise the controller's answer (the broker epoch).
    pub async fn broker_registration(
        &self,
        r: &m::BrokerRegistrationRequest,
    ) -> m::BrokerRegistrationResponse {
        let reply = m::BrokerRegistrationResponse::default().with_broker_epoch(-1);
        if r.cluster_id.as_str() != self.cluster_id {
            return reply.with_error_code(ErrorCode::InconsistentClusterId.code());
        }
        let controller = match self.active_controller() {
            Ok(c) => c,
            Err(e) => return reply.with_error_code(e.kafka_error_code()),
        };
        match controller
            .register_broker(crate::controller_channel::from_registration_request(r))
            .await
        {
            Ok(epoch) => reply.with_broker_epoch(epoch),
            Err(e) => reply.with_error_code(e.kafka_error_code()),
        }
    }

    /// BrokerHeartbeat (63, KIP-631).
    pub async fn broker_heartbeat(
        &self,
        r: &m::BrokerHeartbeatRequest,
    ) -> m::BrokerHeartbeatResponse {
        let reply = m::BrokerHeartbeatResponse::default().with_is_fenced(true);
        let controller = match self.active_controller() {
            Ok(c) => c,
            Err(e) => return reply.with_error_code(e.kafka_error_code()),
        };
        match controller
            .broker_heartbeat(BrokerHeartbeatRequest {
                broker_id: r.broker_id.0,
                broker_epoch: r.broker_epoch,
                current_metadata_offset: r.current_metadata_offset,
                want_fence: r.want_fence,
                want_shut_down: r.want_shut_down,
                cordoned_log_dirs: r.cordoned_log_dirs.clone(),
                offline_log_dirs: r.offline_log_dirs.clone(),
            })
            .await
        {
            Ok(h) => reply
                .with_is_caught_up(h.is_caught_up)
                .with_is_fenced(h.is_fenced)
                .with_should_shut_down(h.should_shut_down),
            Err(e) => reply.with_error_code(e.kafka_error_code()),
        }
    }

    /// UnregisterBroker (64, KIP-631).
    pub async fn unregister_broker(
        &self,
        r: &m::UnregisterBrokerRequest,
    ) -> m::UnregisterBrokerResponse {
        let reply = m::UnregisterBrokerResponse::default();
        let result = match self.active_controller() {
            Ok(c) => c.unregister_broker(r.broker_id.0).await,
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => reply,
            Err(e) => reply
                .with_error_code(e.kafka_error_code())
                .with_error_message(Some(sb(&e.to_string()))),
        }
    }

    /// AllocateProducerIds (67, KIP-730): a block of
    /// [`PRODUCER_ID_BLOCK_SIZE`](gregor_metadata::controller::PRODUCER_ID_BLOCK_SIZE) ids;
    /// STALE_BROKER_EPOCH when the epoch is not the broker's registration's.
    pub async fn allocate_producer_ids(
        &self,
        r: &m::AllocateProducerIdsRequest,
    ) -> m::AllocateProducerIdsResponse {
        let reply =
            m::AllocateProducerIdsResponse::default().with_producer_id_start(m::ProducerId(-1));
        let controller = match self.active_controller() {
            Ok(c) => c,
            Err(e) => return reply.with_error_code(e.kafka_error_code()),
        };
        let epoch = controller
            .image()
            .brokers
            .get(&r.broker_id.0)
            .map(|b| b.epoch);
        match epoch {
            None => {
                return reply.with_error_code(ErrorCode::BrokerIdNotRegistered.code());
            }
            Some(e) if r.broker_epoch != -1 && e != r.broker_epoch => {
                return reply.with_error_code(ErrorCode::StaleBrokerEpoch.code());
            }
            Some(_) => {}
        }
        match controller.allocate_producer_ids(r.broker_id.0).await {
            Ok(start) => reply
                .with_producer_id_start(m::ProducerId(start))
                .with_producer_id_len(gregor_metadata::controller::PRODUCER_ID_BLOCK_SIZE as i32),
            Err(e) => reply.with_error_code(e.kafka_error_code()),
        }
    }

    /// AlterPartition (56, KIP-497) from a partition leader: the controller's answer per
    /// partition ([`ControllerHandle::alter_partition`]); NOT_CONTROLLER or STALE_BROKER_EPOCH
    /// (or the log's failure) as the top-level error.
    pub async fn alter_partition(&self, r: m::AlterPartitionRequest) -> m::AlterPartitionResponse {
        let result = match self.active_controller() {
            Ok(c) => c.alter_partition(r).await,
            Err(e) => Err(e),
        };
        match result {
            Ok(response) => response,
            Err(e) => m::AlterPartitionResponse::default().with_error_code(e.kafka_error_code()),
        }
    }

    /// AssignReplicasToDirs (73, KIP-858) from a broker: the controller's answer per
    /// partition ([`ControllerHandle::assign_replicas_to_dirs`]); NOT_CONTROLLER,
    /// UNSUPPORTED_VERSION (`metadata.version` below 3.7-IV2) or STALE_BROKER_EPOCH (or the
    /// log's failure) as the top-level error, with no partitions, as Kafka's
    /// `AssignReplicasToDirsRequest.getErrorResponse`.
    pub async fn assign_replicas_to_dirs(
        &self,
        r: m::AssignReplicasToDirsRequest,
    ) -> m::AssignReplicasToDirsResponse {
        let result = match self.active_controller() {
            Ok(c) => c.assign_replicas_to_dirs(r).await,
            Err(e) => Err(e),
        };
        match result {
            Ok(response) => response,
            Err(e) => {
                m::AssignReplicasToDirsResponse::default().with_error_code(e.kafka_error_code())
            }
        }
    }

    /// Envelope (58, KIP-590): runs the forwarded request as its client's (principal and
    /// address from the envelope) and wraps the answer. NOT_CONTROLLER when this node is not
    /// the active controller; INVALID_REQUEST for a request that cannot be forwarded or does
    /// not decode; PRINCIPAL_DESERIALIZATION_FAILURE for a bad principal.
    pub async fn envelope(
        &self,
        ctx: &RequestContext,
        r: m::EnvelopeRequest,
    ) -> m::EnvelopeResponse {
        let fail = |code: ErrorCode| m::EnvelopeResponse::default().with_error_code(code.code());
        let Some(broker) = self.broker.get().filter(|_| self.is_active()) else {
            return fail(ErrorCode::NotController);
        };
        // Only brokers may forward (Kafka: CLUSTER_ACTION on the cluster).
        if !broker.authorize(
            ctx,
            crate::authorizer::AclOperation::ClusterAction,
            crate::authorizer::ResourceType::Cluster,
            crate::authorizer::CLUSTER_NAME,
        ) {
            return fail(ErrorCode::ClusterAuthorizationFailed);
        }
        let principal = match r
            .request_principal
            .clone()
            .map(crate::controller_channel::deserialize_principal)
        {
            Some(Ok(p)) => p,
            _ => return fail(ErrorCode::PrincipalDeserializationFailure),
        };
        let ip: Option<std::net::IpAddr> = match r.client_host_address.len() {
            4 => <[u8; 4]>::try_from(&r.client_host_address[..])
                .ok()
                .map(|a| a.into()),
            16 => <[u8; 16]>::try_from(&r.client_host_address[..])
                .ok()
                .map(|a| a.into()),
            _ => None,
        };
        let Some(ip) = ip else {
            return fail(ErrorCode::InvalidRequest);
        };
        let decoded = gregor_protocol::frame::decode_request(r.request_data.clone(), &|k| {
            if forwarding::FORWARDED.contains(&k) {
                crate::handlers::supported_versions(k)
            } else {
                None
            }
        });
        let (header, api_key, body) = match decoded {
            Ok(gregor_protocol::frame::DecodedRequest::Request {
                header,
                api_key,
                body,
            }) => (header, api_key, *body),
            Ok(_) => return fail(ErrorCode::UnsupportedVersion),
            Err(_) => return fail(ErrorCode::InvalidRequest),
        };
        let inner_ctx = RequestContext {
            header: header.clone(),
            api_key,
            principal,
            client_address: std::net::SocketAddr::new(ip, 0),
            // Not the forwarding broker's connection: quotas mute the client's, on its broker.
            throttle: Default::default(),
            ..ctx.clone()
        };
        let response = forwarding::handle_local(broker, &inner_ctx, body).await;
        if crate::controller_channel::is_not_controller(&response) {
            // Leadership moved while the request ran: the forwarding broker re-sends it to
            // the new controller, so the client never sees NOT_CONTROLLER.
            return fail(ErrorCode::NotController);
        }
        match gregor_protocol::frame::encode_response(
            api_key,
            header.request_api_version,
            header.correlation_id,
            &response,
        ) {
            // Without the size prefix.
            Ok(frame) => m::EnvelopeResponse::default().with_response_data(Some(frame.slice(4..))),
            Err(_) => fail(ErrorCode::UnknownServerError),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gregor_protocol::kafka_protocol::messages::BrokerId;
    use gregor_raft::driver::{RaftManagerConfig, Transport};
    use gregor_raft::{Message, MetadataLogConfig, NodeId, QuorumConfig, VoterSet};

    struct NoPeers;

    impl Transport for NoPeers {
        fn send(&self, _to: NodeId, _message: Message) {}
    }

    /// A one-voter quorum in `dir`, once this node leads it.
    async fn single_voter_leader(dir: &std::path::Path) -> Arc<RaftManager> {
        let raft = RaftManager::start(
            RaftManagerConfig {
                quorum: QuorumConfig::new(1, VoterSet::new([1]).unwrap()),
                metadata_log_dir: dir.to_path_buf(),
                log: MetadataLogConfig::default(),
                voter_endpoints: [(1, ("127.0.0.1".to_string(), 9093))].into_iter().collect(),
                controller_listener_name: "CONTROLLER".into(),
            },
            |_| NoPeers,
        )
        .unwrap();
        let mut leader = raft.leader_and_epoch();
        leader.wait_for(|l| l.leader_id == Some(1)).await.unwrap();
        raft
    }

    #[tokio::test]
    async fn describe_cluster_lists_the_controllers_and_refuses_the_broker_endpoint_type() {
        let dir = tempfile::tempdir().unwrap();
        let raft = single_voter_leader(dir.path()).await;
        let apis = ControllerApis::new(raft.clone(), "c1".into());
        let ok = apis.describe_cluster(2, 1);
        assert_eq!(ok.error_code, 0);
        assert_eq!((ok.controller_id.0, ok.endpoint_type), (1, 2));
        assert_eq!(ok.brokers.len(), 1);
        assert_eq!(
            (ok.brokers[0].host.as_str(), ok.brokers[0].port),
            ("127.0.0.1", 9093)
        );
        assert_eq!(
            apis.describe_cluster(1, 1).error_code,
            ErrorCode::MismatchedEndpointType.code()
        );
        assert_eq!(
            apis.describe_cluster(1, 0).error_code,
            ErrorCode::InvalidRequest.code()
        );
        assert_eq!(
            apis.describe_cluster(7, 1).error_code,
            ErrorCode::UnsupportedEndpointType.code()
        );
        let versions = apis.api_versions();
        let keys: Vec<i16> = versions.api_keys.iter().map(|k| k.api_key).collect();
        for k in [1, 18, 52, 53, 54, 55, 60] {
            assert!(keys.contains(&k), "api key {k} in {keys:?}");
        }
        assert!(!keys.contains(&0), "no Produce on a controller listener");
        for k in [19, 20, 33, 37, 44, 58, 62, 63, 64, 67] {
            assert!(keys.contains(&k), "api key {k} in {keys:?}");
        }
        let range = |k: i16| {
            let v = versions.api_keys.iter().find(|v| v.api_key == k).unwrap();
            (v.min_version, v.max_version)
        };
        assert_eq!(range(62), (0, 4), "BrokerRegistration");
        assert_eq!(range(63), (0, 2), "BrokerHeartbeat");
        assert_eq!(range(58), (0, 0), "Envelope");
        // SaslHandshake and SaslAuthenticate, as Kafka lists them on controller listeners.
        assert_eq!(range(17), (0, 1), "SaslHandshake");
        assert_eq!(range(36), (0, 2), "SaslAuthenticate");
        // No controller handed over yet: NOT_CONTROLLER, never a hang.
        let hb = apis
            .broker_heartbeat(&m::BrokerHeartbeatRequest::default().with_broker_id(BrokerId(1)))
            .await;
        assert_eq!(hb.error_code, ErrorCode::NotController.code());
        let env = apis
            .envelope(
                &RequestContext::local(ApiKey::Envelope, 0),
                m::EnvelopeRequest::default(),
            )
            .await;
        assert_eq!(env.error_code, ErrorCode::NotController.code());
        raft.shutdown().await;
    }

    /// DescribeQuorum through [`ControllerApis`]' request handler, as `principal`.
    async fn describe_quorum_as(
        apis: &ControllerApis,
        principal: &str,
        version: i16,
    ) -> m::DescribeQuorumResponse {
        use gregor_network::RequestHandler;
        let mut ctx = RequestContext::local(ApiKey::DescribeQuorum, version);
        ctx.principal = gregor_network::KafkaPrincipal {
            principal_type: "User".into(),
            name: principal.into(),
        };
        let Handled::Deferred(answer) = apis.handle(&ctx, metadata_describe_quorum().into()).await
        else {
            panic!("DescribeQuorum is answered by a deferred task")
        };
        let frame = answer.await.expect("a response");
        let (_, r) = crate::controller_channel::decode_response(
            ApiKey::DescribeQuorum,
            version,
            frame.slice(4..),
        )
        .unwrap();
        let ResponseKind::DescribeQuorum(r) = r else {
            panic!("a DescribeQuorum response")
        };
        r
    }

    fn metadata_describe_quorum() -> m::DescribeQuorumRequest {
        m::DescribeQuorumRequest::default().with_topics(vec![
            m::describe_quorum_request::TopicData::default()
                .with_topic_name(m::TopicName(sb("__cluster_metadata")))
                .with_partitions(vec![
                    m::describe_quorum_request::PartitionData::default().with_partition_index(0)
                ]),
        ])
    }

    #[tokio::test]
    async fn describe_quorum_on_the_controller_listener_needs_describe_on_the_cluster() {
        let dir = tempfile::tempdir().unwrap();
        let raft = single_voter_leader(dir.path()).await;
        let authorizer = Arc::new(DenyBob(parking_lot::Mutex::new(Vec::new())));
        let apis = ControllerApis::new(raft.clone(), "c1".into()).with_authorizer(authorizer);
        for version in [0, 2] {
            let ok = describe_quorum_as(&apis, "alice", version).await;
            assert_eq!(ok.error_code, 0, "v{version}");
            let p = &ok.topics[0].partitions[0];
            assert_eq!((p.error_code, p.leader_id.0), (0, 1), "v{version}");
            assert_eq!(p.current_voters.len(), 1);

            let denied = describe_quorum_as(&apis, "bob", version).await;
            assert_eq!(
                denied.error_code,
                ErrorCode::ClusterAuthorizationFailed.code(),
                "v{version}"
            );
            assert!(
                denied.topics.is_empty(),
                "nothing from the quorum: {denied:?}"
            );
            // The message is carried from v2 on.
            if version >= 2 {
                assert!(
                    denied
                        .error_message
                        .as_deref()
                        .is_some_and(|m| m.contains("User:bob")),
                    "{denied:?}"
                );
            }
        }
        raft.shutdown().await;
    }

    /// Denies `ClusterAction` and `Alter` on the Cluster to `User:mallory`, allows the rest.
    struct DenyMallory;

    impl crate::authorizer::Authorizer for DenyMallory {
        fn authorize(
            &self,
            ctx: &RequestContext,
            actions: &[crate::authorizer::Action],
        ) -> Vec<crate::authorizer::AuthorizationResult> {
            use crate::authorizer::{AclOperation, AuthorizationResult};
            actions
                .iter()
                .map(|a| {
                    let cluster =
                        a.resource_pattern == crate::authorizer::ResourcePattern::cluster();
                    let op = matches!(
                        a.operation,
                        AclOperation::ClusterAction | AclOperation::Alter
                    );
                    if ctx.principal.name == "mallory" && cluster && op {
                        AuthorizationResult::Denied
                    } else {
                        AuthorizationResult::Allowed
                    }
                })
                .collect()
        }
    }

    /// `body` through [`ControllerApis`]' request handler as `User:principal`, decoded.
    async fn call_as(
        apis: &ControllerApis,
        principal: &str,
        api_key: ApiKey,
        body: RequestKind,
    ) -> ResponseKind {
        use gregor_network::RequestHandler;
        let (_, version) = apis.versions(api_key).expect("served");
        let mut ctx = RequestContext::local(api_key, version);
        ctx.principal = gregor_network::KafkaPrincipal {
            principal_type: "User".into(),
            name: principal.into(),
        };
        let frame = match apis.handle(&ctx, body).await {
            Handled::Ready(Some(frame)) => frame,
            Handled::Deferred(answer) => answer.await.expect("a response"),
            _ => panic!("{api_key:?}: no response"),
        };
        crate::controller_channel::decode_response(api_key, version, frame.slice(4..))
            .unwrap()
            .1
    }

    /// The top-level error code of a controller-listener answer.
    fn top_level_error(r: &ResponseKind) -> i16 {
        match r {
            ResponseKind::Fetch(r) => r.error_code,
            ResponseKind::FetchSnapshot(r) => r.error_code,
            ResponseKind::Vote(r) => r.error_code,
            ResponseKind::BeginQuorumEpoch(r) => r.error_code,
            ResponseKind::EndQuorumEpoch(r) => r.error_code,
            ResponseKind::BrokerRegistration(r) => r.error_code,
            ResponseKind::BrokerHeartbeat(r) => r.error_code,
            ResponseKind::AlterPartition(r) => r.error_code,
            ResponseKind::AllocateProducerIds(r) => r.error_code,
            ResponseKind::AssignReplicasToDirs(r) => r.error_code,
            ResponseKind::UnregisterBroker(r) => r.error_code,
            ResponseKind::DescribeCluster(r) => r.error_code,
            other => panic!("unexpected {other:?}"),
        }
    }

    #[tokio::test]
    async fn inter_node_requests_need_cluster_action_and_unregister_broker_alter() {
        let dir = tempfile::tempdir().unwrap();
        let raft = single_voter_leader(dir.path()).await;
        let apis =
            ControllerApis::new(raft.clone(), "c1".into()).with_authorizer(Arc::new(DenyMallory));
        let epoch = raft.leader_and_epoch().borrow().epoch;
        let metadata_fetch = m::FetchRequest::default()
            .with_replica_state(
                m::fetch_request::ReplicaState::default().with_replica_id(BrokerId(2)),
            )
            .with_topics(vec![m::fetch_request::FetchTopic::default()
                .with_topic_id(gregor_raft::convert::METADATA_TOPIC_ID)
                .with_partitions(vec![
                    m::fetch_request::FetchPartition::default().with_current_leader_epoch(epoch)
                ])]);
        // A Vote for a later epoch: refused, it must not move the quorum.
        let vote =
            m::VoteRequest::default().with_topics(vec![m::vote_request::TopicData::default()
                .with_topic_name(m::TopicName(sb("__cluster_metadata")))
                .with_partitions(vec![m::vote_request::PartitionData::default()
                    .with_replica_epoch(epoch + 100)
                    .with_replica_id(BrokerId(2))])]);
        let requests: Vec<(ApiKey, RequestKind)> = vec![
            (ApiKey::Vote, vote.into()),
            (
                ApiKey::BeginQuorumEpoch,
                m::BeginQuorumEpochRequest::default().into(),
            ),
            (
                ApiKey::EndQuorumEpoch,
                m::EndQuorumEpochRequest::default().into(),
            ),
            (
                ApiKey::FetchSnapshot,
                m::FetchSnapshotRequest::default().into(),
            ),
            (ApiKey::Fetch, metadata_fetch.into()),
            (
                ApiKey::BrokerRegistration,
                m::BrokerRegistrationRequest::default()
                    .with_cluster_id(sb("c1"))
                    .into(),
            ),
            (
                ApiKey::BrokerHeartbeat,
                m::BrokerHeartbeatRequest::default().into(),
            ),
            (
                ApiKey::AlterPartition,
                m::AlterPartitionRequest::default().into(),
            ),
            (
                ApiKey::AllocateProducerIds,
                m::AllocateProducerIdsRequest::default().into(),
            ),
            (
                ApiKey::AssignReplicasToDirs,
                m::AssignReplicasToDirsRequest::default().into(),
            ),
            (
                ApiKey::UnregisterBroker,
                m::UnregisterBrokerRequest::default().into(),
            ),
            (
                ApiKey::DescribeCluster,
                m::DescribeClusterRequest::default()
                    .with_endpoint_type(2)
                    .into(),
            ),
        ];
        let denied = ErrorCode::ClusterAuthorizationFailed.code();
        for (key, body) in requests {
            let before = raft.leader_and_epoch().borrow().epoch;
            let r = call_as(&apis, "mallory", key, body.clone()).await;
            assert_eq!(top_level_error(&r), denied, "{key:?} as mallory: {r:?}");
            // Refused before the quorum saw it: a later epoch's Vote moved nothing.
            assert_eq!(raft.leader_and_epoch().borrow().epoch, before, "{key:?}");
            let r = call_as(&apis, "alice", key, body).await;
            assert_ne!(top_level_error(&r), denied, "{key:?} as alice: {r:?}");
        }
        // ApiVersions needs nothing.
        let r = call_as(
            &apis,
            "mallory",
            ApiKey::ApiVersions,
            m::ApiVersionsRequest::default().into(),
        )
        .await;
        assert!(matches!(r, ResponseKind::ApiVersions(v) if v.error_code == 0));
        raft.shutdown().await;
    }

    /// Denies creating topics and describing the cluster to `User:bob` (and records every
    /// principal it saw).
    struct DenyBob(parking_lot::Mutex<Vec<String>>);

    impl crate::authorizer::Authorizer for DenyBob {
        fn authorize(
            &self,
            ctx: &RequestContext,
            actions: &[crate::authorizer::Action],
        ) -> Vec<crate::authorizer::AuthorizationResult> {
            use crate::authorizer::{AclOperation, AuthorizationResult};
            self.0.lock().push(ctx.principal.to_string());
            actions
                .iter()
                .map(|a| {
                    let describe_cluster = a.operation == AclOperation::Describe
                        && a.resource_pattern == crate::authorizer::ResourcePattern::cluster();
                    if ctx.principal.name == "bob"
                        && (a.operation == AclOperation::Create || describe_cluster)
                    {
                        AuthorizationResult::Denied
                    } else {
                        AuthorizationResult::Allowed
                    }
                })
                .collect()
        }
    }

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    #[tokio::test]
    async fn the_active_controller_answers_broker_rpcs_and_envelopes() {
        use crate::controller_channel::{decode_response, serialize_principal, ControllerChannel};
        use gregor_network::KafkaPrincipal;
        use gregor_protocol::kafka_protocol::messages::create_topics_request::CreatableTopic;
        use gregor_protocol::kafka_protocol::messages::TopicName;
        use std::time::Duration;

        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let props: std::collections::BTreeMap<String, String> = [
            ("node.id", "1".to_string()),
            ("process.roles", "broker,controller".into()),
            ("log.dirs", dir.path().display().to_string()),
            (
                "listeners",
                format!("PLAINTEXT://127.0.0.1:0,CONTROLLER://127.0.0.1:{port}"),
            ),
            ("controller.listener.names", "CONTROLLER".into()),
            ("controller.quorum.voters", format!("1@127.0.0.1:{port}")),
            ("admin.listener", String::new()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let (config, _) = crate::config::BrokerConfig::from_properties(props).unwrap();
        let authorizer = Arc::new(DenyBob(parking_lot::Mutex::new(Vec::new())));
        let running = crate::server::start_with_authorizer(config, authorizer.clone())
            .await
            .unwrap();
        let cluster_id = running.broker.cluster_id.clone();
        let (_tx, rx) = tokio::sync::watch::channel(gregor_raft::driver::LeaderAndEpoch {
            epoch: 1,
            leader_id: Some(1),
        });
        let channel = ControllerChannel::new(
            rx,
            [(1, ("127.0.0.1".to_string(), port))].into_iter().collect(),
            9,
            "test",
        );
        let t = Duration::from_secs(10);
        let call = |api_key: ApiKey, version: i16, body: RequestKind| {
            let channel = &channel;
            async move { channel.send(api_key, version, &body, t).await.unwrap() }
        };

        // BrokerRegistration of another broker (id 2): an epoch; another cluster's: refused.
        let mut reg = crate::controller_channel::to_registration_request(
            &cluster_id,
            &gregor_metadata::controller::BrokerRegistrationRequest {
                broker_id: 2,
                incarnation_id: uuid::Uuid::new_v4(),
                listeners: vec![],
                features:
                    gregor_metadata::controller::BrokerRegistrationRequest::supported_features(),
                rack: None,
                log_dirs: vec![uuid::Uuid::new_v4()],
                previous_broker_epoch: -1,
            },
        );
        let ResponseKind::BrokerRegistration(r) =
            call(ApiKey::BrokerRegistration, 4, reg.clone().into()).await
        else {
            panic!("a BrokerRegistration response")
        };
        assert_eq!(r.error_code, 0);
        let epoch = r.broker_epoch;
        assert!(epoch > 0);
        reg.cluster_id = sb("another-cluster");
        let ResponseKind::BrokerRegistration(r) =
            call(ApiKey::BrokerRegistration, 4, reg.into()).await
        else {
            panic!("a BrokerRegistration response")
        };
        assert_eq!(r.error_code, ErrorCode::InconsistentClusterId.code());

        // BrokerHeartbeat: caught up with its registration, so unfenced.
        let ResponseKind::BrokerHeartbeat(h) = call(
            ApiKey::BrokerHeartbeat,
            1,
            m::BrokerHeartbeatRequest::default()
                .with_broker_id(BrokerId(2))
                .with_broker_epoch(epoch)
                .with_current_metadata_offset(epoch)
                .into(),
        )
        .await
        else {
            panic!("a BrokerHeartbeat response")
        };
        assert_eq!(
            (h.error_code, h.is_caught_up, h.is_fenced),
            (0, true, false)
        );

        // AssignReplicasToDirs (KIP-858): partition errors in the answer, a stale broker epoch
        // as the top-level error.
        let assign = |epoch: i64| -> RequestKind {
            use m::assign_replicas_to_dirs_request::{DirectoryData, PartitionData, TopicData};
            m::AssignReplicasToDirsRequest::default()
                .with_broker_id(BrokerId(2))
                .with_broker_epoch(epoch)
                .with_directories(vec![DirectoryData::default()
                    .with_id(uuid::Uuid::new_v4())
                    .with_topics(vec![TopicData::default()
                        .with_topic_id(uuid::Uuid::new_v4())
                        .with_partitions(vec![
                            PartitionData::default().with_partition_index(0)
                        ])])])
                .into()
        };
        let ResponseKind::AssignReplicasToDirs(a) =
            call(ApiKey::AssignReplicasToDirs, 0, assign(epoch)).await
        else {
            panic!("an AssignReplicasToDirs response")
        };
        assert_eq!(a.error_code, 0);
        assert_eq!(
            a.directories[0].topics[0].partitions[0].error_code,
            ErrorCode::UnknownTopicId.code()
        );
        let ResponseKind::AssignReplicasToDirs(a) =
            call(ApiKey::AssignReplicasToDirs, 0, assign(epoch + 1000)).await
        else {
            panic!("an AssignReplicasToDirs response")
        };
        assert_eq!(a.error_code, ErrorCode::StaleBrokerEpoch.code());
        assert!(a.directories.is_empty());
        let ResponseKind::BrokerHeartbeat(h) = call(
            ApiKey::BrokerHeartbeat,
            1,
            m::BrokerHeartbeatRequest::default()
                .with_broker_id(BrokerId(2))
                .with_broker_epoch(epoch + 1000)
                .into(),
        )
        .await
        else {
            panic!("a BrokerHeartbeat response")
        };
        assert_eq!(h.error_code, ErrorCode::StaleBrokerEpoch.code());

        // AllocateProducerIds: consecutive blocks.
        let mut starts = Vec::new();
        for _ in 0..2 {
            let ResponseKind::AllocateProducerIds(a) = call(
                ApiKey::AllocateProducerIds,
                0,
                m::AllocateProducerIdsRequest::default()
                    .with_broker_id(BrokerId(2))
                    .with_broker_epoch(epoch)
                    .into(),
            )
            .await
            else {
                panic!("an AllocateProducerIds response")
            };
            assert_eq!((a.error_code, a.producer_id_len), (0, 1000));
            starts.push(a.producer_id_start.0);
        }
        assert_eq!(starts[1], starts[0] + 1000);

        // Envelope: the forwarded CreateTopics runs as the envelope's principal.
        let envelope = |principal: &str, topic: &str| {
            let inner = RequestKind::CreateTopics(m::CreateTopicsRequest::default().with_topics(
                vec![CreatableTopic::default()
                    .with_name(TopicName(sb(topic)))
                    .with_num_partitions(1)
                    .with_replication_factor(1)],
            ));
            let frame = crate::controller_channel::encode_request(
                ApiKey::CreateTopics,
                7,
                41,
                "the-client",
                &inner,
            )
            .unwrap();
            m::EnvelopeRequest::default()
                .with_request_data(frame.slice(4..))
                .with_request_principal(Some(serialize_principal(&KafkaPrincipal {
                    principal_type: "User".into(),
                    name: principal.into(),
                })))
                .with_client_host_address(Bytes::from_static(&[10, 0, 0, 7]))
        };
        for (who, topic, expected) in [
            ("alice", "from-alice", 0),
            (
                "bob",
                "from-bob",
                ErrorCode::TopicAuthorizationFailed.code(),
            ),
        ] {
            let ResponseKind::Envelope(e) =
                call(ApiKey::Envelope, 0, envelope(who, topic).into()).await
            else {
                panic!("an Envelope response")
            };
            assert_eq!(e.error_code, 0);
            let (correlation_id, inner) =
                decode_response(ApiKey::CreateTopics, 7, e.response_data.unwrap()).unwrap();
            assert_eq!(correlation_id, 41, "the client's correlation id");
            let ResponseKind::CreateTopics(c) = inner else {
                panic!("a CreateTopics response inside")
            };
            assert_eq!(c.topics[0].error_code, expected, "{who}");
        }
        assert!(running
            .broker
            .controller
            .image()
            .topic("from-alice")
            .is_some());
        assert!(running
            .broker
            .controller
            .image()
            .topic("from-bob")
            .is_none());
        let seen = authorizer.0.lock().clone();
        assert!(seen.contains(&"User:alice".to_string()), "{seen:?}");
        assert!(seen.contains(&"User:bob".to_string()), "{seen:?}");
        // DescribeQuorum forwarded in an Envelope: the quorum's answer for alice, refused
        // for bob (Describe on the Cluster, checked as the envelope's principal).
        for (who, expected) in [
            ("alice", 0),
            ("bob", ErrorCode::ClusterAuthorizationFailed.code()),
        ] {
            let frame = crate::controller_channel::encode_request(
                ApiKey::DescribeQuorum,
                2,
                42,
                "kafka-metadata-quorum",
                &metadata_describe_quorum().into(),
            )
            .unwrap();
            let ResponseKind::Envelope(e) = call(
                ApiKey::Envelope,
                0,
                envelope(who, "unused")
                    .with_request_data(frame.slice(4..))
                    .into(),
            )
            .await
            else {
                panic!("an Envelope response")
            };
            assert_eq!(e.error_code, 0);
            let (correlation_id, inner) =
                decode_response(ApiKey::DescribeQuorum, 2, e.response_data.unwrap()).unwrap();
            assert_eq!(correlation_id, 42);
            let ResponseKind::DescribeQuorum(q) = inner else {
                panic!("a DescribeQuorum response inside")
            };
            assert_eq!(q.error_code, expected, "{who}: {q:?}");
            if expected == 0 {
                let p = &q.topics[0].partitions[0];
                assert_eq!((p.error_code, p.leader_id.0), (0, 1), "{q:?}");
            }
        }
        // DescribeQuorum on the broker listener of the node that leads: answered here, with
        // the same check.
        for (who, expected) in [
            ("alice", 0),
            ("bob", ErrorCode::ClusterAuthorizationFailed.code()),
        ] {
            let mut ctx = RequestContext::local(ApiKey::DescribeQuorum, 1);
            ctx.principal = KafkaPrincipal {
                principal_type: "User".into(),
                name: who.into(),
            };
            let Handled::Ready(Some(frame)) =
                crate::handlers::handle(&running.broker, &ctx, metadata_describe_quorum().into())
                    .await
            else {
                panic!("an immediate answer")
            };
            let (_, r) = decode_response(ApiKey::DescribeQuorum, 1, frame.slice(4..)).unwrap();
            let ResponseKind::DescribeQuorum(q) = r else {
                panic!("a DescribeQuorum response")
            };
            assert_eq!(q.error_code, expected, "{who}: {q:?}");
            if expected == 0 {
                assert_eq!(q.topics[0].partitions[0].leader_id.0, 1, "{q:?}");
            }
        }
        // A principal that does not decode.
        let ResponseKind::Envelope(e) = call(
            ApiKey::Envelope,
            0,
            envelope("alice", "x")
                .with_request_principal(Some(Bytes::from_static(&[0, 9])))
                .into(),
        )
        .await
        else {
            panic!("an Envelope response")
        };
        assert_eq!(
            e.error_code,
            ErrorCode::PrincipalDeserializationFailure.code()
        );

        running.shutdown().await.unwrap();
    }
}
