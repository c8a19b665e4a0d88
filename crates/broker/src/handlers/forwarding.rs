//! Forwarding of the admin requests that change metadata to the active controller (Kafka's
//! `ForwardingManager`, KIP-590): CreateTopics, DeleteTopics, CreatePartitions, AlterConfigs,
//! IncrementalAlterConfigs, ElectLeaders, UpdateFeatures, AlterPartitionReassignments and
//! ListPartitionReassignments, and DescribeQuorum (55: Kafka's brokers forward it too, so
//! `kafka-metadata-quorum --bootstrap-server` works; only the leader of the quorum can answer
//! it). On a node whose controller is the active one they are handled
//! here (the handlers commit through the local controller); on any other node the client's
//! request goes, as it is, in an Envelope (58) with its principal and address to the active
//! controller, whose `ControllerApis` runs the same handlers (authorising the client's
//! principal) and returns the answer, which is relayed to the client once this node has
//! applied what the controller had committed. NOT_CONTROLLER never reaches the client from a
//! node that can forward: a local NOT_CONTROLLER (leadership just moved; for DescribeQuorum
//! NOT_LEADER_OR_FOLLOWER) is forwarded too, and the channel re-sends on NOT_CONTROLLER from a
//! controller. A forwarded request that gets no answer within the forwarding channel's retry
//! timeout (60 s, as Kafka's) is answered REQUEST_TIMED_OUT.

use std::sync::Arc;

use gregor_protocol::error::ErrorCode;
use gregor_protocol::kafka_protocol::messages::{self as m, ApiKey, RequestKind, ResponseKind};

use super::{
    acls, client_quotas, configs, elect_leaders, features, kraft, reassignments, sb, scram, topics,
};
use crate::broker::Broker;
use gregor_network::{respond, Handled, RequestContext};

/// The APIs forwarded to the active controller.
pub const FORWARDED: &[ApiKey] = &[
    ApiKey::CreateTopics,
    ApiKey::DeleteTopics,
    ApiKey::CreatePartitions,
    ApiKey::AlterConfigs,
    ApiKey::IncrementalAlterConfigs,
    ApiKey::ElectLeaders,
    ApiKey::UpdateFeatures,
    ApiKey::AlterPartitionReassignments,
    ApiKey::ListPartitionReassignments,
    ApiKey::DescribeQuorum,
    ApiKey::AlterClientQuotas,
    ApiKey::AlterUserScramCredentials,
    ApiKey::CreateAcls,
    ApiKey::DeleteAcls,
];

/// Handles a request of [`FORWARDED`] received on a broker listener: locally when this node's
/// controller is the active one (or there is no channel), forwarded otherwise.
pub async fn handle(broker: &Arc<Broker>, ctx: &RequestContext, body: RequestKind) -> Handled {
    let client = broker.controller_client.get().cloned();
    let response = match client {
        Some(client) if !client.local_is_active() => forward(&client, ctx, &body).await,
        Some(client) => {
            let local = handle_local(broker, ctx, body.clone()).await;
            if crate::controller_channel::is_not_controller(&local) {
                forward(&client, ctx, &body).await
            } else {
                local
            }
        }
        None => handle_local(broker, ctx, body).await,
    };
    // Kafka's `sendForwardedResponse`: the client's connection is muted for the controller's
    // throttle time (KIP-599's controller mutation quota).
    ctx.throttle
        .throttle(i64::from(response_throttle_time_ms(&response)));
    Handled::Ready(respond(&ctx.header, ctx.api_key, response))
}

async fn forward(
    client: &crate::controller_channel::ControllerClient,
    ctx: &RequestContext,
    body: &RequestKind,
) -> ResponseKind {
    match client.forward(ctx, body).await {
        Ok(response) => response,
        Err(e) => {
            tracing::warn!(api_key = ?ctx.api_key, error = %e, "forwarding to the active controller failed");
            let code = match e.error_code() {
                // A controller that stays unreachable is a timeout to the client, never
                // NOT_CONTROLLER.
                ErrorCode::NotController => ErrorCode::RequestTimedOut,
                other => other,
            };
            error_response(body, code, Some(e.to_string()))
        }
    }
}

/// Runs the handler of a [`FORWARDED`] request on this node (its controller commits).
pub async fn handle_local(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    body: RequestKind,
) -> ResponseKind {
    let v = ctx.api_version();
    match body {
        RequestKind::CreateTopics(r) => topics::create_topics(broker, ctx, r, v).await.into(),
        RequestKind::DeleteTopics(r) => topics::delete_topics(broker, ctx, r, v).await.into(),
        RequestKind::CreatePartitions(r) => {
            topics::create_partitions(broker, ctx, r, v).await.into()
        }
        RequestKind::AlterConfigs(r) => configs::alter_configs(broker, ctx, &r, v).await.into(),
        RequestKind::IncrementalAlterConfigs(r) => {
            configs::incremental_alter_configs(broker, ctx, &r, v)
                .await
                .into()
        }
        RequestKind::ElectLeaders(r) => {
            elect_leaders::elect_leaders(broker, ctx, r, v).await.into()
        }
        RequestKind::UpdateFeatures(r) => features::update_features(broker, ctx, r, v).await.into(),
        RequestKind::AlterPartitionReassignments(r) => {
            reassignments::alter_partition_reassignments(broker, ctx, r)
                .await
                .into()
        }
        RequestKind::ListPartitionReassignments(r) => {
            reassignments::list_partition_reassignments(broker, ctx, r)
                .await
                .into()
        }
        RequestKind::DescribeQuorum(r) => match broker.raft.get() {
            Some(raft) => kraft::describe_quorum(raft, broker.authorizer.as_ref(), ctx, &r)
                .await
                .into(),
            // Not reachable after start-up; forwarded (or retried) like a moved leadership.
            None => kraft::describe_quorum_error(
                ErrorCode::NotController,
                Some("this node's quorum member is not running yet".into()),
            )
            .into(),
        },
        RequestKind::AlterClientQuotas(r) => client_quotas::alter_client_quotas(broker, ctx, &r)
            .await
            .into(),
        RequestKind::AlterUserScramCredentials(r) => scram::alter(broker, ctx, r).await.into(),
        RequestKind::CreateAcls(r) => acls::create_acls(broker, ctx, &r).await.into(),
        RequestKind::DeleteAcls(r) => acls::delete_acls(broker, ctx, &r).await.into(),
        other => error_response(&other, ErrorCode::InvalidRequest, None),
    }
}

/// The `throttle_time_ms` of a forwarded API's response.
fn response_throttle_time_ms(response: &ResponseKind) -> i32 {
    match response {
        ResponseKind::CreateTopics(r) => r.throttle_time_ms,
        ResponseKind::DeleteTopics(r) => r.throttle_time_ms,
        ResponseKind::CreatePartitions(r) => r.throttle_time_ms,
        _ => 0,
    }
}

/// The answer to `body` with `code` for every topic or resource it names (Kafka's
/// `AbstractRequest.getErrorResponse`).
pub fn error_response(
    body: &RequestKind,
    code: ErrorCode,
    message: Option<String>,
) -> ResponseKind {
    let code = code.code();
    let message = message.as_deref().map(sb);
    match body {
        RequestKind::CreateTopics(r) => m::CreateTopicsResponse::default()
            .with_topics(
                r.topics
                    .iter()
                    .map(|t| {
                        m::create_topics_response::CreatableTopicResult::default()
                            .with_name(t.name.clone())
                            .with_error_code(code)
                            .with_error_message(message.clone())
                            .with_num_partitions(-1)
                            .with_replication_factor(-1)
                    })
                    .collect(),
            )
            .into(),
        RequestKind::DeleteTopics(r) => {
            let mut responses: Vec<_> = r
                .topic_names
                .iter()
                .map(|n| {
                    m::delete_topics_response::DeletableTopicResult::default()
                        .with_name(Some(n.clone()))
                        .with_error_code(code)
                        .with_error_message(message.clone())
                })
                .collect();
            responses.extend(r.topics.iter().map(|t| {
                m::delete_topics_response::DeletableTopicResult::default()
                    .with_name(t.name.clone())
                    .with_topic_id(t.topic_id)
                    .with_error_code(code)
                    .with_error_message(message.clone())
            }));
            m::DeleteTopicsResponse::default()
                .with_responses(responses)
                .into()
        }
        RequestKind::CreatePartitions(r) => m::CreatePartitionsResponse::default()
            .with_results(
                r.topics
                    .iter()
                    .map(|t| {
                        m::create_partitions_response::CreatePartitionsTopicResult::default()
                            .with_name(t.name.clone())
                            .with_error_code(code)
                            .with_error_message(message.clone())
                    })
                    .collect(),
            )
            .into(),
        RequestKind::AlterConfigs(r) => m::AlterConfigsResponse::default()
            .with_responses(
                r.resources
                    .iter()
                    .map(|res| {
                        m::alter_configs_response::AlterConfigsResourceResponse::default()
                            .with_resource_type(res.resource_type)
                            .with_resource_name(res.resource_name.clone())
                            .with_error_code(code)
                            .with_error_message(message.clone())
                    })
                    .collect(),
            )
            .into(),
        RequestKind::IncrementalAlterConfigs(r) => m::IncrementalAlterConfigsResponse::default()
            .with_responses(
                r.resources
                    .iter()
                    .map(|res| {
                        m::incremental_alter_configs_response::AlterConfigsResourceResponse::default()
                            .with_resource_type(res.resource_type)
                            .with_resource_name(res.resource_name.clone())
                            .with_error_code(code)
                            .with_error_message(message.clone())
                    })
                    .collect(),
            )
            .into(),
        RequestKind::ElectLeaders(r) => {
            elect_leaders::error_response(r, code, message.as_deref()).into()
        }
        RequestKind::UpdateFeatures(_) => {
            features::error_response(code, message.as_deref()).into()
        }
        RequestKind::AlterPartitionReassignments(r) => {
            reassignments::alter_error_response(r, code, message.as_deref())
                .into()
        }
        RequestKind::ListPartitionReassignments(_) => {
            reassignments::list_error_response(code, message.as_deref()).into()
        }
        // Kafka's `DescribeQuorumRequest.getErrorResponse`: the top-level error only.
        RequestKind::DescribeQuorum(_) => m::DescribeQuorumResponse::default()
            .with_error_code(code)
            .with_error_message(message)
            .into(),
        RequestKind::AlterClientQuotas(r) => {
            client_quotas::alter_error(r, ErrorCode::for_code(code), message.map(|m| m.to_string()))
                .into()
        }
        RequestKind::AlterUserScramCredentials(r) => {
            scram::alter_error_response(r, ErrorCode::from_code(code).unwrap_or(ErrorCode::UnknownServerError), message.as_deref()).into()
        }
        RequestKind::CreateAcls(r) => {
            acls::create_error_response(r, ErrorCode::from_code(code).unwrap_or(ErrorCode::UnknownServerError), message.as_deref()).into()
        }
        RequestKind::DeleteAcls(r) => {
            acls::delete_error_response(r, ErrorCode::from_code(code).unwrap_or(ErrorCode::UnknownServerError), message.as_deref()).into()
        }
        // Only the APIs above are forwarded.
        _ => m::CreateTopicsResponse::default().into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request of each forwarded API (empty: the error answer names what the request
    /// names) and a response of that API.
    fn request_and_response(api_key: ApiKey) -> (RequestKind, ResponseKind) {
        match api_key {
            ApiKey::CreateTopics => (
                m::CreateTopicsRequest::default().into(),
                m::CreateTopicsResponse::default().into(),
            ),
            ApiKey::DeleteTopics => (
                m::DeleteTopicsRequest::default().into(),
                m::DeleteTopicsResponse::default().into(),
            ),
            ApiKey::CreatePartitions => (
                m::CreatePartitionsRequest::default().into(),
                m::CreatePartitionsResponse::default().into(),
            ),
            ApiKey::AlterConfigs => (
                m::AlterConfigsRequest::default().into(),
                m::AlterConfigsResponse::default().into(),
            ),
            ApiKey::IncrementalAlterConfigs => (
                m::IncrementalAlterConfigsRequest::default().into(),
                m::IncrementalAlterConfigsResponse::default().into(),
            ),
            ApiKey::ElectLeaders => (
                m::ElectLeadersRequest::default().into(),
                m::ElectLeadersResponse::default().into(),
            ),
            ApiKey::UpdateFeatures => (
                m::UpdateFeaturesRequest::default().into(),
                m::UpdateFeaturesResponse::default().into(),
            ),
            ApiKey::AlterPartitionReassignments => (
                m::AlterPartitionReassignmentsRequest::default().into(),
                m::AlterPartitionReassignmentsResponse::default().into(),
            ),
            ApiKey::ListPartitionReassignments => (
                m::ListPartitionReassignmentsRequest::default().into(),
                m::ListPartitionReassignmentsResponse::default().into(),
            ),
            ApiKey::DescribeQuorum => (
                m::DescribeQuorumRequest::default().into(),
                m::DescribeQuorumResponse::default().into(),
            ),
            ApiKey::AlterClientQuotas => (
                m::AlterClientQuotasRequest::default().into(),
                m::AlterClientQuotasResponse::default().into(),
            ),
            ApiKey::AlterUserScramCredentials => (
                m::AlterUserScramCredentialsRequest::default().into(),
                m::AlterUserScramCredentialsResponse::default().into(),
            ),
            ApiKey::CreateAcls => (
                m::CreateAclsRequest::default().into(),
                m::CreateAclsResponse::default().into(),
            ),
            ApiKey::DeleteAcls => (
                m::DeleteAclsRequest::default().into(),
                m::DeleteAclsResponse::default().into(),
            ),
            other => panic!("{other:?} is not forwarded"),
        }
    }

    #[test]
    fn a_forwarded_request_that_timed_out_is_answered_request_timed_out_in_its_own_api() {
        for api_key in FORWARDED {
            let (request, response) = request_and_response(*api_key);
            let r = error_response(
                &request,
                ErrorCode::RequestTimedOut,
                Some("timed out".into()),
            );
            // An answer of the request's API (the connection encodes it as such).
            assert_eq!(
                std::mem::discriminant(&r),
                std::mem::discriminant(&response),
                "{api_key:?}: {r:?}"
            );
        }
        // DescribeQuorum: the top-level error only, as Kafka's getErrorResponse.
        let ResponseKind::DescribeQuorum(q) = error_response(
            &request_and_response(ApiKey::DescribeQuorum).0,
            ErrorCode::RequestTimedOut,
            Some("timed out".into()),
        ) else {
            panic!("a DescribeQuorum answer")
        };
        assert_eq!(q.error_code, ErrorCode::RequestTimedOut.code());
        assert!(q.topics.is_empty());
        assert_eq!(q.error_message.as_deref(), Some("timed out"));
    }
}
