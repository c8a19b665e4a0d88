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
    ApiKey, DescribeQuorumRequest, DescribeQuorumResponse, FetchRequest, RequestKind,
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
/// [`crate::controller_server::required_cluster_operation`]); the answer comes when the node
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
    if let Some(operation) = crate::controller_server::required_cluster_operation(api_key) {
        if !broker.authorize(
            ctx,
            operation,
            crate::authorizer::ResourceType::Cluster,
            crate::authorizer::CLUSTER_NAME,
        ) {
            if let Some(response) = crate::controller_server::cluster_authorization_failed(
                api_key,
                &ctx.principal.to_string(),
            ) {
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
