//! DescribeUserScramCredentials (API 50) and AlterUserScramCredentials (API 51), KIP-554, as
//! Kafka's `KafkaApis`/`ControllerApis`: Describe is answered from this node's metadata image
//! (`ScramImage.describe`: every user when none is named, RESOURCE_NOT_FOUND for a user with no
//! credential, DUPLICATE_RESOURCE for a user named twice), authorised with DESCRIBE on the
//! cluster; Alter is forwarded to the active controller (`forwarding`), authorised with ALTER
//! on the cluster, the keys derived here from the client's salted password
//! (`ScramFormatter.storedKey`/`serverKey`) and the rules applied by
//! `gregor_metadata::scram_control`. `kafka-configs --entity-type users --alter --add-config
//! 'SCRAM-SHA-256=[password=...]'` and `--describe` use them.

use std::collections::BTreeMap;
use std::sync::Arc;

use gregor_metadata::scram_control::{ScramDeletion, ScramUpsertion};
use gregor_network::sasl::{ScramCredential, ScramMechanism};
use gregor_network::RequestContext;
use gregor_protocol::error::ErrorCode;
use gregor_protocol::kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
use gregor_protocol::kafka_protocol::messages::describe_user_scram_credentials_response::{
    CredentialInfo, DescribeUserScramCredentialsResult,
};
use gregor_protocol::kafka_protocol::messages::{
    AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse,
    DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse,
};

use super::sb;
use crate::authorizer::{AclOperation, ResourceType, CLUSTER_NAME};
use crate::broker::Broker;

/// Answers DescribeUserScramCredentials from the image.
pub fn describe(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: &DescribeUserScramCredentialsRequest,
) -> DescribeUserScramCredentialsResponse {
    if !broker.authorize(
        ctx,
        AclOperation::Describe,
        ResourceType::Cluster,
        CLUSTER_NAME,
    ) {
        return DescribeUserScramCredentialsResponse::default()
            .with_error_code(ErrorCode::ClusterAuthorizationFailed.code())
            .with_error_message(Some(sb("Cluster authorization failed.")));
    }
    let image = broker.controller.image();
    // user -> named more than once
    let mut users: BTreeMap<String, bool> = BTreeMap::new();
    match &req.users {
        Some(named) if !named.is_empty() => {
            for u in named {
                users
                    .entry(u.name.to_string())
                    .and_modify(|twice| *twice = true)
                    .or_insert(false);
            }
        }
        _ => {
            for (name, _) in image.scram.keys() {
                users.insert(name.clone(), false);
            }
        }
    }
    let results = users
        .into_iter()
        .map(|(user, twice)| {
            let r = DescribeUserScramCredentialsResult::default().with_user(sb(&user));
            if twice {
                return r
                    .with_error_code(ErrorCode::DuplicateResource.code())
                    .with_error_message(Some(sb(&format!(
                        "Cannot describe SCRAM credentials for the same user twice in a single request: {user}"
                    ))));
            }
            let infos: Vec<CredentialInfo> = ScramMechanism::ALL
                .iter()
                .filter_map(|m| image.scram.get(&(user.clone(), m.type_code())))
                .map(|c| {
                    CredentialInfo::default()
                        .with_mechanism(c.mechanism)
                        .with_iterations(c.iterations)
                })
                .collect();
            if infos.is_empty() {
                r.with_error_code(ErrorCode::ResourceNotFound.code())
                    .with_error_message(Some(sb(&format!(
                        "Attempt to describe a user credential that does not exist: {user}"
                    ))))
            } else {
                r.with_credential_infos(infos)
            }
        })
        .collect();
    DescribeUserScramCredentialsResponse::default().with_results(results)
}

/// Kafka's `AlterUserScramCredentialsRequest.getErrorResponse`: `code` for every user named.
pub fn alter_error_response(
    req: &AlterUserScramCredentialsRequest,
    code: ErrorCode,
    message: Option<&str>,
) -> AlterUserScramCredentialsResponse {
    let mut names: Vec<String> = req.deletions.iter().map(|d| d.name.to_string()).collect();
    names.extend(req.upsertions.iter().map(|u| u.name.to_string()));
    names.sort();
    names.dedup();
    AlterUserScramCredentialsResponse::default().with_results(
        names
            .into_iter()
            .map(|n| {
                AlterUserScramCredentialsResult::default()
                    .with_user(sb(&n))
                    .with_error_code(code.code())
                    .with_error_message(message.map(sb))
            })
            .collect(),
    )
}

/// Answers AlterUserScramCredentials through this node's controller (the caller forwards when
/// it is not the active one).
pub async fn alter(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: AlterUserScramCredentialsRequest,
) -> AlterUserScramCredentialsResponse {
    if !broker.authorize(
        ctx,
        AclOperation::Alter,
        ResourceType::Cluster,
        CLUSTER_NAME,
    ) {
        return alter_error_response(
            &req,
            ErrorCode::ClusterAuthorizationFailed,
            Some("Cluster authorization failed."),
        );
    }
    let deletions = req
        .deletions
        .iter()
        .map(|d| ScramDeletion {
            name: d.name.to_string(),
            mechanism: d.mechanism,
        })
        .collect();
    let upsertions = req
        .upsertions
        .iter()
        .map(|u| {
            let keys = ScramMechanism::from_type_code(u.mechanism).map(|m| {
                ScramCredential::from_salted_password(m, &u.salted_password, &u.salt, u.iterations)
            });
            ScramUpsertion {
                name: u.name.to_string(),
                mechanism: u.mechanism,
                iterations: u.iterations,
                salt: u.salt.to_vec(),
                stored_key: keys
                    .as_ref()
                    .map(|k| k.stored_key.clone())
                    .unwrap_or_default(),
                server_key: keys.map(|k| k.server_key).unwrap_or_default(),
            }
        })
        .collect();
    match broker
        .controller
        .alter_user_scram_credentials(deletions, upsertions)
        .await
    {
        Ok(results) => AlterUserScramCredentialsResponse::default().with_results(
            results
                .into_iter()
                .map(|(user, code, message)| {
                    AlterUserScramCredentialsResult::default()
                        .with_user(sb(&user))
                        .with_error_code(code.code())
                        .with_error_message(message.as_deref().map(sb))
                })
                .collect(),
        ),
        Err(e) => alter_error_response(&req, e.error_code(), Some(&e.to_string())),
    }
}
