//! The KRaft APIs (KIP-595): Vote (52), BeginQuorumEpoch (53), EndQuorumEpoch (54),
//! DescribeQuorum (55), FetchSnapshot (59, KIP-630) and Fetch (1) of `__cluster_metadata`, handed to this node's
//! [`gregor_raft::driver::RaftManager`]. Advertised in ApiVersions on controller listeners
//! (`controller.listener.names`); answered on any
//! listener that receives them, except DescribeQuorum on a broker listener: there it is
//! advertised too and goes to the active controller, as Kafka's `KafkaApis` forwards it
//! (see [`crate::handlers::forwarding`]), so `kafka-metadata-quorum --bootstrap-server` works.

use std::sync::Arc;

use gregor_protocol::error::ErrorCode;
use gregor_protocol::kafka_protocol::messages::{
    self as m, ApiKey, DescribeQuorumRequest, DescribeQuorumResponse, FetchRequest, RequestKind,
};
use gregor_raft::convert::{METADATA_TOPIC_ID, METADATA_TOPIC_NAME};
use gregor_raft::driver::RaftManager;

use crate::authorizer::{AclOperation, Action, AuthorizationResult, Authorizer, ResourcePattern};

use crate::broker::Broker;
use gregor_network::{respond, Handled, RequestContext};

/// The KRaft-only APIs and the versions gregor serves (Kafka 4.4's: Vote 0-2,
/// BeginQuorumEpoch 0-1, EndQuorumEpoch 0-1, DescribeQuorum 0-2).
pub fn versions(api_key: ApiKey) -> Option<(i16, i16)> {
    match api_key {
        ApiKey::Vote | ApiKey::DescribeQuorum => Some((0, 2)),
        ApiKey::BeginQuorumEpoch | ApiKey::EndQuorumEpoch | ApiKey::FetchSnapshot => Some((0, 1)),
        _ => None,
    }
}

/// True when a Fetch names the metadata topic (by id from v13, by name before).
pub fn is_metadata_fetch(r: &FetchRequest) -> bool {
    r.topics
        .iter()
        .any(|t| t.topic_id == METADATA_TOPIC_ID || t.topic.0.as_str() == METADATA_TOPIC_NAME)
}

/// Hands `body` to the quorum member once its principal has `ClusterAction` on the Cluster
/// (CLUSTER_AUTHORIZATION_FAILED otherwise, see
/// [`required_cluster_operation`]); the answer comes when the node
/// gives it (a parked Fetch later). A node without one yet (start-up) closes the connection, as for an API it
/// does not serve.
pub fn handle(broker: &Arc<Broker>, ctx: &RequestContext, body: RequestKind) -> Handled {
    let Some(raft) = broker.raft.get().cloned() else {
        return Handled::CloseConnection;
    };
    let header = ctx.header.clone();
    let api_key = ctx.api_key;
    // Only brokers and controllers send these: ClusterAction on the Cluster, as on a
    // controller listener (Kafka's `ControllerApis`).
    if let Some(operation) = required_cluster_operation(api_key) {
        if !broker.authorize(
            ctx,
            operation,
            crate::authorizer::ResourceType::Cluster,
            crate::authorizer::CLUSTER_NAME,
        ) {
            if let Some(response) =
                cluster_authorization_failed(api_key, &ctx.principal.to_string())
            {
                return Handled::Ready(respond(&header, api_key, response));
            }
        }
    }
    Handled::Deferred(Box::pin(async move {
        let version = header.request_api_version;
        let response = raft.handle_kafka_request(&body, version).await?;
        respond(&header, api_key, response)
    }))
}

/// DescribeQuorum (55; KIP-595, KIP-836 v1, KIP-853 v2) as a controller answers it (Kafka's
/// `ControllerApis.handleDescribeQuorum`), on a controller listener or forwarded from a broker
/// listener: the request's principal needs `Describe` on the Cluster (else a top-level
/// CLUSTER_AUTHORIZATION_FAILED, with nothing from the quorum), then `raft`'s answer
/// (NOT_LEADER_OR_FOLLOWER in the partition unless this node leads; INVALID_REQUEST for
/// anything but `__cluster_metadata-0`) at the request's version.
pub async fn describe_quorum(
    raft: &RaftManager,
    authorizer: &dyn Authorizer,
    ctx: &RequestContext,
    request: &DescribeQuorumRequest,
) -> DescribeQuorumResponse {
    let version = ctx.api_version();
    let action = Action::new(AclOperation::Describe, ResourcePattern::cluster());
    let allowed = authorizer
        .authorize(ctx, std::slice::from_ref(&action))
        .first()
        .is_some_and(|r| *r == AuthorizationResult::Allowed);
    if !allowed {
        return describe_quorum_error(
            ErrorCode::ClusterAuthorizationFailed,
            Some(format!(
                "{} may not describe the cluster (DESCRIBE on the cluster resource)",
                ctx.principal
            )),
        );
    }
    raft.describe_quorum(request, version).await
}

/// A DescribeQuorum answer with only a top-level error (Kafka's
/// `DescribeQuorumRequest.getTopLevelErrorResponse`): `message` is sent from v2 on.
pub fn describe_quorum_error(code: ErrorCode, message: Option<String>) -> DescribeQuorumResponse {
    DescribeQuorumResponse::default()
        .with_error_code(code.code())
        .with_error_message(message.map(|m| m.into()))
}

/// The operation on the Cluster a controller-listener request needs before anything else
/// (Kafka's `ControllerApis`, `authHelper.authorizeClusterOperation`): `ClusterAction` for
/// the requests only brokers and controllers send (Fetch of the metadata log, FetchSnapshot,
/// Vote, BeginQuorumEpoch, EndQuorumEpoch, BrokerRegistration, BrokerHeartbeat,
/// AlterPartition, AllocateProducerIds, AssignReplicasToDirs), `Alter` for UnregisterBroker
/// and DescribeCluster (on a controller listener, unlike a broker's). None for the requests
/// whose handlers check their own resources (and Envelope, which checks `ClusterAction`
/// itself), and for ApiVersions.
///
/// With an ACL authorizer the principal of brokers and controllers therefore needs
/// `ClusterAction` on the Cluster, in practice by being listed in `super.users`: before its
/// first metadata image the authorizer denies everyone else (KIP-801), and a quorum of
/// several controllers cannot elect a leader without Vote.
pub fn required_cluster_operation(api_key: ApiKey) -> Option<crate::authorizer::AclOperation> {
    use crate::authorizer::AclOperation;
    match api_key {
        ApiKey::Fetch
        | ApiKey::FetchSnapshot
        | ApiKey::Vote
        | ApiKey::BeginQuorumEpoch
        | ApiKey::EndQuorumEpoch
        | ApiKey::BrokerRegistration
        | ApiKey::BrokerHeartbeat
        | ApiKey::AlterPartition
        | ApiKey::AllocateProducerIds
        | ApiKey::AssignReplicasToDirs => Some(AclOperation::ClusterAction),
        ApiKey::UnregisterBroker | ApiKey::DescribeCluster => Some(AclOperation::Alter),
        _ => None,
    }
}

/// The answer to a request of `api_key` refused with CLUSTER_AUTHORIZATION_FAILED (Kafka's
/// `getErrorResponse` of each request: the top-level error code, nothing else but the
/// defaults it sets, e.g. a fenced heartbeat and broker epoch -1). None for APIs
/// [`required_cluster_operation`] does not cover.
pub fn cluster_authorization_failed(api_key: ApiKey, principal: &str) -> Option<m::ResponseKind> {
    let code = ErrorCode::ClusterAuthorizationFailed.code();
    Some(match api_key {
        ApiKey::Fetch => m::FetchResponse::default().with_error_code(code).into(),
        ApiKey::FetchSnapshot => m::FetchSnapshotResponse::default()
            .with_error_code(code)
            .into(),
        ApiKey::Vote => m::VoteResponse::default().with_error_code(code).into(),
        ApiKey::BeginQuorumEpoch => m::BeginQuorumEpochResponse::default()
            .with_error_code(code)
            .into(),
        ApiKey::EndQuorumEpoch => m::EndQuorumEpochResponse::default()
            .with_error_code(code)
            .into(),
        ApiKey::BrokerRegistration => m::BrokerRegistrationResponse::default()
            .with_error_code(code)
            .with_broker_epoch(-1)
            .into(),
        ApiKey::BrokerHeartbeat => m::BrokerHeartbeatResponse::default()
            .with_error_code(code)
            .with_is_fenced(true)
            .into(),
        ApiKey::AlterPartition => m::AlterPartitionResponse::default()
            .with_error_code(code)
            .into(),
        ApiKey::AllocateProducerIds => m::AllocateProducerIdsResponse::default()
            .with_error_code(code)
            .with_producer_id_start(m::ProducerId(-1))
            .into(),
        ApiKey::AssignReplicasToDirs => m::AssignReplicasToDirsResponse::default()
            .with_error_code(code)
            .into(),
        ApiKey::UnregisterBroker => m::UnregisterBrokerResponse::default()
            .with_error_code(code)
            .with_error_message(Some(super::sb(&format!(
                "{principal} may not unregister brokers (ALTER on the cluster resource)"
            ))))
            .into(),
        ApiKey::DescribeCluster => m::DescribeClusterResponse::default()
            .with_error_code(code)
            .with_error_message(Some(super::sb(&format!(
                "{principal} may not describe the controllers (ALTER on the cluster resource)"
            ))))
            .with_cluster_authorized_operations(i32::MIN)
            .into(),
        _ => return None,
    })
}
