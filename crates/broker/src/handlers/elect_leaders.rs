//! ElectLeaders (key 43, v0-2, KIP-460): preferred or unclean leader elections, decided and
//! committed by the active controller ([`gregor_metadata::ControllerHandle::elect_leaders`]).
//! Brokers forward it there (`forwarding`), as Kafka's brokers do. Needs `Alter` on the
//! Cluster (CLUSTER_AUTHORIZATION_FAILED for every partition otherwise).
//! <https://kafka.apache.org/protocol#The_Messages_ElectLeaders>

use std::sync::Arc;

use gregor_network::RequestContext;
use gregor_protocol::error::ErrorCode;
use gregor_protocol::kafka_protocol::messages::elect_leaders_response::{
    PartitionResult, ReplicaElectionResult,
};
use gregor_protocol::kafka_protocol::messages::{ElectLeadersRequest, ElectLeadersResponse};

use super::sb;
use crate::authorizer::{AclOperation, ResourceType, CLUSTER_NAME};
use crate::broker::Broker;

/// The answer with `code` (and `message`) for every partition the request names, and as the
/// top-level error (v1+) - Kafka's `ElectLeadersRequest.getErrorResponse`.
pub fn error_response(
    req: &ElectLeadersRequest,
    code: i16,
    message: Option<&str>,
) -> ElectLeadersResponse {
    let results = req
        .topic_partitions
        .iter()
        .flatten()
        .map(|t| {
            ReplicaElectionResult::default()
                .with_topic(t.topic.clone())
                .with_partition_result(
                    t.partitions
                        .iter()
                        .map(|p| {
                            PartitionResult::default()
                                .with_partition_id(*p)
                                .with_error_code(code)
                                .with_error_message(message.map(sb))
                        })
                        .collect(),
                )
        })
        .collect();
    ElectLeadersResponse::default()
        .with_error_code(code)
        .with_replica_election_results(results)
}

/// Answers ElectLeaders through this node's controller (the caller forwards when it is not
/// the active one). v0 requests are preferred elections.
pub async fn elect_leaders(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: ElectLeadersRequest,
    version: i16,
) -> ElectLeadersResponse {
    if !broker.authorize(
        ctx,
        AclOperation::Alter,
        ResourceType::Cluster,
        CLUSTER_NAME,
    ) {
        return error_response(&req, ErrorCode::ClusterAuthorizationFailed.code(), None);
    }
    let election_type = if version == 0 { 0 } else { req.election_type };
    let topic_partitions = req.topic_partitions.as_ref().map(|ts| {
        ts.iter()
            .map(|t| (t.topic.to_string(), t.partitions.clone()))
            .collect()
    });
    match broker
        .controller
        .elect_leaders(election_type, topic_partitions)
        .await
    {
        Ok(response) => response,
        Err(e) => error_response(&req, e.kafka_error_code(), Some(&e.to_string())),
    }
}
