//! UpdateFeatures (key 57, v0-2, KIP-584, KIP-778, KIP-1022): changes finalized feature levels
//! (`kafka-features upgrade/downgrade/disable`), decided and committed by the active
//! controller ([`gregor_metadata::ControllerHandle::update_features`], Kafka's
//! `FeatureControlManager`). Brokers forward it there (`forwarding`); controllers answer it on
//! their listener too (`--bootstrap-controller`). Needs `Alter` on the Cluster
//! (CLUSTER_AUTHORIZATION_FAILED otherwise).
//!
//! The answer is Kafka's `QuorumController.updateFeatures`: one top-level error for the whole
//! request (an error's message prefixed with "The update failed for all features since the
//! following feature had an error: ", and no per-feature results); on success v0-1 list one
//! result per feature (error 0, message "NONE"), v2 none.
//! <https://kafka.apache.org/protocol#The_Messages_UpdateFeatures>

use std::sync::Arc;

use gregor_metadata::features::{FeatureUpdate, UpgradeType};
use gregor_network::RequestContext;
use gregor_protocol::error::ErrorCode;
use gregor_protocol::kafka_protocol::error::ResponseError;
use gregor_protocol::kafka_protocol::messages::update_features_response::UpdatableFeatureResult;
use gregor_protocol::kafka_protocol::messages::{UpdateFeaturesRequest, UpdateFeaturesResponse};

use super::sb;
use crate::authorizer::{AclOperation, ResourceType, CLUSTER_NAME};
use crate::broker::Broker;

/// Kafka's `Errors.message()`: the default message of a code (its name, NONE, for 0).
fn default_message(code: i16) -> String {
    match ResponseError::try_from_code(code) {
        None => "NONE".to_string(),
        Some(e) => e.to_string(),
    }
}

/// The response to `req` (at `version`) with the request's outcome: `Ok` or the error code and
/// message that failed it (then without per-feature results, as Kafka answers).
pub fn response(
    req: &UpdateFeaturesRequest,
    version: i16,
    outcome: Result<(), (i16, String)>,
) -> UpdateFeaturesResponse {
    let (code, message) = match &outcome {
        Ok(()) => (0, None),
        Err((code, message)) => (
            *code,
            Some(format!(
                "The update failed for all features since the following feature had an error: \
                 {message}"
            )),
        ),
    };
    let mut resp = UpdateFeaturesResponse::default()
        .with_error_code(code)
        .with_error_message(message.as_deref().map(sb));
    if outcome.is_ok() && version <= 1 {
        resp.results = req
            .feature_updates
            .iter()
            .map(|u| {
                UpdatableFeatureResult::default()
                    .with_feature(u.feature.clone())
                    .with_error_code(code)
                    .with_error_message(Some(sb(&default_message(code))))
            })
            .collect();
    }
    resp
}

/// Kafka's `UpdateFeaturesRequest.getErrorResponse` (a failure before the controller
/// answered, e.g. forwarding): the top-level error only.
pub fn error_response(code: i16, message: Option<&str>) -> UpdateFeaturesResponse {
    UpdateFeaturesResponse::default()
        .with_error_code(code)
        .with_error_message(message.map(sb))
}

/// Answers UpdateFeatures through this node's controller (the caller forwards when it is not
/// the active one).
pub async fn update_features(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: UpdateFeaturesRequest,
    version: i16,
) -> UpdateFeaturesResponse {
    if !broker.authorize(
        ctx,
        AclOperation::Alter,
        ResourceType::Cluster,
        CLUSTER_NAME,
    ) {
        let code = ErrorCode::ClusterAuthorizationFailed.code();
        return error_response(code, Some(&default_message(code)));
    }
    let updates = req
        .feature_updates
        .iter()
        .map(|u| FeatureUpdate {
            feature: u.feature.to_string(),
            max_version_level: u.max_version_level,
            // v0 has no upgrade type; Kafka's controller reads the field's default, UPGRADE.
            upgrade_type: UpgradeType::from_code(if version == 0 { 1 } else { u.upgrade_type }),
        })
        .collect();
    let outcome = broker
        .controller
        .update_features(updates, req.validate_only)
        .await
        .map_err(|e| (e.kafka_error_code(), e.to_string()));
    response(&req, version, outcome)
}
