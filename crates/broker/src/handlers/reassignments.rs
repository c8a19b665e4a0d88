//! AlterPartitionReassignments (key 45, v0-1) and ListPartitionReassignments (key 46, v0),
//! KIP-455: the active controller starts, cancels and lists replica reassignments
//! ([`gregor_metadata::ControllerHandle::alter_partition_reassignments`]); brokers forward both
//! there (`forwarding`), as Kafka's brokers do. Altering needs `Alter` on the Cluster, listing
//! `Describe` (CLUSTER_AUTHORIZATION_FAILED otherwise).
//! <https://kafka.apache.org/protocol#The_Messages_AlterPartitionReassignments>

use std::sync::Arc;

use gregor_network::RequestContext;
use gregor_protocol::error::ErrorCode;
use gregor_protocol::kafka_protocol::messages::alter_partition_reassignments_response::{
    ReassignablePartitionResponse, ReassignableTopicResponse,
};
use gregor_protocol::kafka_protocol::messages::{
    AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse,
    ListPartitionReassignmentsRequest, ListPartitionReassignmentsResponse,
};

use super::sb;
use crate::authorizer::{AclOperation, ResourceType, CLUSTER_NAME};
use crate::broker::Broker;

/// The answer with `code` as the top-level error and for every partition named (Kafka's
/// `AlterPartitionReassignmentsRequest.getErrorResponse`).
pub fn alter_error_response(
    req: &AlterPartitionReassignmentsRequest,
    code: i16,
    message: Option<&str>,
) -> AlterPartitionReassignmentsResponse {
    AlterPartitionReassignmentsResponse::default()
        .with_allow_replication_factor_change(req.allow_replication_factor_change)
        .with_error_code(code)
        .with_error_message(message.map(sb))
        .with_responses(
            req.topics
                .iter()
                .map(|t| {
                    ReassignableTopicResponse::default()
                        .with_name(t.name.clone())
                        .with_partitions(
                            t.partitions
                                .iter()
                                .map(|p| {
                                    ReassignablePartitionResponse::default()
                                        .with_partition_index(p.partition_index)
                                        .with_error_code(code)
                                        .with_error_message(message.map(sb))
                                })
                                .collect(),
                        )
                })
                .collect(),
        )
}

/// The answer with `code` as the top-level error.
pub fn list_error_response(code: i16, message: Option<&str>) -> ListPartitionReassignmentsResponse {
    ListPartitionReassignmentsResponse::default()
        .with_error_code(code)
        .with_error_message(message.map(sb))
}

/// Answers AlterPartitionReassignments through this node's controller.
pub async fn alter_partition_reassignments(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: AlterPartitionReassignmentsRequest,
) -> AlterPartitionReassignmentsResponse {
    if !broker.authorize(
        ctx,
        AclOperation::Alter,
        ResourceType::Cluster,
        CLUSTER_NAME,
    ) {
        return alter_error_response(&req, ErrorCode::ClusterAuthorizationFailed.code(), None);
    }
    match broker
        .controller
        .alter_partition_reassignments(req.clone())
        .await
    {
        Ok(response) => response,
        Err(e) => alter_error_response(&req, e.kafka_error_code(), Some(&e.to_string())),
    }
}

/// Answers ListPartitionReassignments through this node's controller.
pub async fn list_partition_reassignments(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: ListPartitionReassignmentsRequest,
) -> ListPartitionReassignmentsResponse {
    if !broker.authorize(
        ctx,
        AclOperation::Describe,
        ResourceType::Cluster,
        CLUSTER_NAME,
    ) {
        return list_error_response(ErrorCode::ClusterAuthorizationFailed.code(), None);
    }
    let topics = req.topics.map(|ts| {
        ts.into_iter()
            .map(|t| (t.name.to_string(), t.partition_indexes))
            .collect()
    });
    match broker.controller.list_partition_reassignments(topics).await {
        Ok(response) => response,
        Err(e) => list_error_response(e.kafka_error_code(), Some(&e.to_string())),
    }
}
