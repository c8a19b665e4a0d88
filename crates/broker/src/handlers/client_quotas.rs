//! DescribeClientQuotas (48) and AlterClientQuotas (49), KIP-546: `kafka-configs
//! --entity-type users|clients|ips` and `kafka-client-quotas`-style admin calls.
//!
//! - DescribeClientQuotas is answered from this node's metadata image (Kafka's
//!   `ClientQuotasImage.describe`): each filter component matches an entity type exactly
//!   (MATCH_TYPE_EXACT 0, a name), its default (MATCH_TYPE_DEFAULT 1) or any name
//!   (MATCH_TYPE_SPECIFIED 2); `strict` keeps only entities with no other component. A bad
//!   filter is INVALID_REQUEST (empty or repeated type, a match string where none belongs or
//!   none where one does, `ip` with `user` or `client-id`), an unknown entity type
//!   UNSUPPORTED_VERSION, with Kafka's messages; the response then has no entries.
//! - AlterClientQuotas is forwarded to the active controller
//!   ([`super::forwarding`]), which validates and commits ClientQuotaRecords
//!   ([`gregor_metadata::client_quota_control`]).
//!
//! Both need the principal to have `DescribeConfigs` (resp. `AlterConfigs`) on the Cluster
//! (CLUSTER_AUTHORIZATION_FAILED otherwise).

use std::collections::BTreeMap;
use std::sync::Arc;

use gregor_metadata::client_quota_control::{ClientQuotaAlteration, CLIENT_ID, IP, USER};
use gregor_metadata::image::MetadataImage;
use gregor_protocol::error::ErrorCode;
use gregor_protocol::kafka_protocol::messages::{
    alter_client_quotas_response, describe_client_quotas_response, AlterClientQuotasRequest,
    AlterClientQuotasResponse, DescribeClientQuotasRequest, DescribeClientQuotasResponse,
};

use super::sb;
use crate::authorizer::{AclOperation, ResourceType, CLUSTER_NAME};
use crate::broker::Broker;
use gregor_network::RequestContext;

/// `MATCH_TYPE_EXACT`.
pub const MATCH_TYPE_EXACT: i8 = 0;
/// `MATCH_TYPE_DEFAULT`.
pub const MATCH_TYPE_DEFAULT: i8 = 1;
/// `MATCH_TYPE_SPECIFIED`.
pub const MATCH_TYPE_SPECIFIED: i8 = 2;

fn describe_error(code: ErrorCode, message: &str) -> DescribeClientQuotasResponse {
    DescribeClientQuotasResponse::default()
        .with_error_code(code.code())
        .with_error_message(Some(sb(message)))
        .with_entries(None)
}

/// DescribeClientQuotas on this node's image.
pub fn describe_client_quotas(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: &DescribeClientQuotasRequest,
) -> DescribeClientQuotasResponse {
    if !broker.authorize(
        ctx,
        AclOperation::DescribeConfigs,
        ResourceType::Cluster,
        CLUSTER_NAME,
    ) {
        return DescribeClientQuotasResponse::default()
            .with_error_code(ErrorCode::ClusterAuthorizationFailed.code())
            .with_entries(None);
    }
    let image = broker.controller.image();
    match describe(&image, req) {
        Ok(r) => r,
        Err((code, message)) => describe_error(code, &message),
    }
}

/// Kafka's `ClientQuotasImage.describe`.
///
/// # Errors
/// (INVALID_REQUEST or UNSUPPORTED_VERSION, Kafka's message) for a bad filter.
pub fn describe(
    image: &MetadataImage,
    req: &DescribeClientQuotasRequest,
) -> Result<DescribeClientQuotasResponse, (ErrorCode, String)> {
    let invalid = |m: String| (ErrorCode::InvalidRequest, m);
    let mut exact: BTreeMap<String, Option<String>> = BTreeMap::new();
    let mut specified: Vec<String> = Vec::new();
    for c in &req.components {
        let t = c.entity_type.to_string();
        if t.is_empty() {
            return Err(invalid("Invalid empty entity type.".into()));
        }
        if exact.contains_key(&t) || specified.contains(&t) {
            return Err(invalid(format!(
                "Entity type {t} cannot appear more than once in the filter."
            )));
        }
        if ![IP, USER, CLIENT_ID].contains(&t.as_str()) {
            return Err((
                ErrorCode::UnsupportedVersion,
                format!("Unsupported entity type {t}"),
            ));
        }
        match c.match_type {
            MATCH_TYPE_EXACT => match &c._match {
                Some(m) => {
                    exact.insert(t, Some(m.to_string()));
                }
                None => {
                    return Err(invalid(
                        "Request specified MATCH_TYPE_EXACT, but set match string to null.".into(),
                    ))
                }
            },
            MATCH_TYPE_DEFAULT => {
                if c._match.is_some() {
                    return Err(invalid(
                        "Request specified MATCH_TYPE_DEFAULT, but also specified a match string."
                            .into(),
                    ));
                }
                exact.insert(t, None);
            }
            MATCH_TYPE_SPECIFIED => {
                if c._match.is_some() {
                    return Err(invalid(
                        "Request specified MATCH_TYPE_SPECIFIED, but also specified a match string."
                            .into(),
                    ));
                }
                specified.push(t);
            }
            other => return Err(invalid(format!("Unknown match type {other}"))),
        }
    }
    let named = |t: &str| exact.contains_key(t) || specified.iter().any(|s| s == t);
    if named(IP) && (named(USER) || named(CLIENT_ID)) {
        return Err(invalid(
            "Invalid entity filter component combination. IP filter component should not be used with user or clientId filter component."
                .into(),
        ));
    }
    let entries = image
        .client_quotas
        .iter()
        .filter(|(entity, _)| {
            if req.strict && entity.len() != exact.len() + specified.len() {
                return false;
            }
            let get = |t: &str| entity.iter().find(|(et, _)| et == t).map(|(_, n)| n);
            exact.iter().all(|(t, name)| get(t) == Some(name))
                && specified.iter().all(|t| get(t).is_some())
        })
        .map(|(entity, values)| {
            describe_client_quotas_response::EntryData::default()
                .with_entity(
                    entity
                        .iter()
                        .map(|(t, n)| {
                            describe_client_quotas_response::EntityData::default()
                                .with_entity_type(sb(t))
                                .with_entity_name(n.as_deref().map(sb))
                        })
                        .collect(),
                )
                .with_values(
                    values
                        .iter()
                        .map(|(k, v)| {
                            describe_client_quotas_response::ValueData::default()
                                .with_key(sb(k))
                                .with_value(*v)
                        })
                        .collect(),
                )
        })
        .collect();
    Ok(DescribeClientQuotasResponse::default().with_entries(Some(entries)))
}

/// AlterClientQuotas on the node whose controller is active (reached through
/// [`super::forwarding`]).
pub async fn alter_client_quotas(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: &AlterClientQuotasRequest,
) -> AlterClientQuotasResponse {
    let alterations: Vec<ClientQuotaAlteration> = req
        .entries
        .iter()
        .map(|e| ClientQuotaAlteration {
            entity: e
                .entity
                .iter()
                .map(|c| {
                    (
                        c.entity_type.to_string(),
                        c.entity_name.as_ref().map(ToString::to_string),
                    )
                })
                .collect(),
            ops: e
                .ops
                .iter()
                .map(|o| (o.key.to_string(), (!o.remove).then_some(o.value)))
                .collect(),
        })
        .collect();
    if !broker.authorize(
        ctx,
        AclOperation::AlterConfigs,
        ResourceType::Cluster,
        CLUSTER_NAME,
    ) {
        return alter_error(req, ErrorCode::ClusterAuthorizationFailed, None);
    }
    match broker
        .controller
        .alter_client_quotas(alterations, req.validate_only)
        .await
    {
        Ok(answers) => AlterClientQuotasResponse::default().with_entries(
            answers
                .into_iter()
                .map(|(entity, r)| {
                    let (code, message) = match r {
                        Ok(()) => (ErrorCode::None.code(), None),
                        Err(e) => (e.error_code().code(), Some(sb(&e.to_string()))),
                    };
                    alter_client_quotas_response::EntryData::default()
                        .with_error_code(code)
                        .with_error_message(message)
                        .with_entity(alter_entity(&entity))
                })
                .collect(),
        ),
        Err(e) => alter_error(req, e.error_code(), Some(e.to_string())),
    }
}

fn alter_entity(
    entity: &[(String, Option<String>)],
) -> Vec<alter_client_quotas_response::EntityData> {
    entity
        .iter()
        .map(|(t, n)| {
            alter_client_quotas_response::EntityData::default()
                .with_entity_type(sb(t))
                .with_entity_name(n.as_deref().map(sb))
        })
        .collect()
}

/// Kafka's `AlterClientQuotasRequest.getErrorResponse`: `code` for every entry.
pub fn alter_error(
    req: &AlterClientQuotasRequest,
    code: ErrorCode,
    message: Option<String>,
) -> AlterClientQuotasResponse {
    AlterClientQuotasResponse::default().with_entries(
        req.entries
            .iter()
            .map(|e| {
                let alteration = ClientQuotaAlteration {
                    entity: e
                        .entity
                        .iter()
                        .map(|c| {
                            (
                                c.entity_type.to_string(),
                                c.entity_name.as_ref().map(ToString::to_string),
                            )
                        })
                        .collect(),
                    ops: Vec::new(),
                };
                alter_client_quotas_response::EntryData::default()
                    .with_error_code(code.code())
                    .with_error_message(message.as_deref().map(sb))
                    .with_entity(alter_entity(&alteration.quota_entity()))
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use gregor_protocol::kafka_protocol::messages::describe_client_quotas_request::ComponentData;

    use super::*;

    fn image() -> MetadataImage {
        let mut image = MetadataImage::default();
        let mut add = |entity: &[(&str, Option<&str>)], key: &str, v: f64| {
            let mut e: Vec<(String, Option<String>)> = entity
                .iter()
                .map(|(t, n)| (t.to_string(), n.map(str::to_string)))
                .collect();
            e.sort();
            image
                .client_quotas
                .entry(e)
                .or_default()
                .insert(key.to_string(), v);
        };
        add(&[(USER, Some("alice"))], "producer_byte_rate", 1024.0);
        add(
            &[(USER, Some("alice")), (CLIENT_ID, Some("app"))],
            "consumer_byte_rate",
            2048.0,
        );
        add(&[(USER, None)], "producer_byte_rate", 100.0);
        add(&[(CLIENT_ID, Some("app"))], "request_percentage", 50.0);
        add(&[(IP, Some("10.0.0.1"))], "connection_creation_rate", 5.0);
        image
    }

    fn component(t: &str, match_type: i8, m: Option<&str>) -> ComponentData {
        ComponentData::default()
            .with_entity_type(sb(t))
            .with_match_type(match_type)
            .with_match(m.map(sb))
    }

    fn names(r: &DescribeClientQuotasResponse) -> Vec<Vec<(String, Option<String>)>> {
        r.entries
            .as_ref()
            .expect("entries")
            .iter()
            .map(|e| {
                e.entity
                    .iter()
                    .map(|c| {
                        (
                            c.entity_type.to_string(),
                            c.entity_name.as_ref().map(ToString::to_string),
                        )
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn filters_match_as_kafkas_client_quotas_image() {
        let image = image();
        // kafka-configs --describe --entity-type users --entity-name alice: exact, strict.
        let req = DescribeClientQuotasRequest::default()
            .with_components(vec![component(USER, MATCH_TYPE_EXACT, Some("alice"))])
            .with_strict(true);
        let r = describe(&image, &req).expect("ok");
        assert_eq!(
            names(&r),
            vec![vec![(USER.to_string(), Some("alice".to_string()))]]
        );
        // Not strict: also alice's client-id entity.
        let r = describe(&image, &req.clone().with_strict(false)).expect("ok");
        assert_eq!(names(&r).len(), 2);
        // The default user.
        let req = DescribeClientQuotasRequest::default()
            .with_components(vec![component(USER, MATCH_TYPE_DEFAULT, None)])
            .with_strict(true);
        assert_eq!(
            names(&describe(&image, &req).expect("ok")),
            vec![vec![(USER.to_string(), None)]]
        );
        // Every client-id entity (specified).
        let req = DescribeClientQuotasRequest::default().with_components(vec![component(
            CLIENT_ID,
            MATCH_TYPE_SPECIFIED,
            None,
        )]);
        assert_eq!(names(&describe(&image, &req).expect("ok")).len(), 2);
        // No components, not strict: everything.
        let r = describe(&image, &DescribeClientQuotasRequest::default()).expect("ok");
        assert_eq!(names(&r).len(), 5);
    }

    #[test]
    fn bad_filters_get_kafkas_errors() {
        let image = image();
        let cases = [
            (vec![component("", MATCH_TYPE_EXACT, Some("x"))], ErrorCode::InvalidRequest, "Invalid empty entity type."),
            (
                vec![component(USER, MATCH_TYPE_EXACT, Some("a")), component(USER, MATCH_TYPE_DEFAULT, None)],
                ErrorCode::InvalidRequest,
                "Entity type user cannot appear more than once in the filter.",
            ),
            (vec![component("group", MATCH_TYPE_EXACT, Some("a"))], ErrorCode::UnsupportedVersion, "Unsupported entity type group"),
            (
                vec![component(USER, MATCH_TYPE_EXACT, None)],
                ErrorCode::InvalidRequest,
                "Request specified MATCH_TYPE_EXACT, but set match string to null.",
            ),
            (
                vec![component(USER, MATCH_TYPE_DEFAULT, Some("a"))],
                ErrorCode::InvalidRequest,
                "Request specified MATCH_TYPE_DEFAULT, but also specified a match string.",
            ),
            (vec![component(USER, 7, None)], ErrorCode::InvalidRequest, "Unknown match type 7"),
            (
                vec![component(IP, MATCH_TYPE_SPECIFIED, None), component(USER, MATCH_TYPE_SPECIFIED, None)],
                ErrorCode::InvalidRequest,
                "Invalid entity filter component combination. IP filter component should not be used with user or clientId filter component.",
            ),
        ];
        for (components, code, message) in cases {
            let req = DescribeClientQuotasRequest::default().with_components(components);
            assert_eq!(
                describe(&image, &req).err(),
                Some((code, message.to_string()))
            );
        }
    }
}
