//! CreateAcls (30), DescribeAcls (29), DeleteAcls (31): Kafka's `AclApis` (KIP-140, KIP-290).
//!
//! - All three need the Cluster resource: `Alter` to create or delete, `Describe` to describe;
//!   without it every item (DescribeAcls: the response) is CLUSTER_AUTHORIZATION_FAILED.
//! - Without an ACL authorizer (`authorizer.class.name` unset) they answer SECURITY_DISABLED.
//! - CreateAcls and DeleteAcls change metadata: they are forwarded to the active controller
//!   (`forwarding`), which writes `AccessControlEntryRecord`s / `RemoveAccessControlEntryRecord`s
//!   ([`gregor_metadata::acl`]); the answer comes once this node has applied them, so a
//!   DescribeAcls after it sees the change. DescribeAcls answers from this node's authorizer.
//! - A binding with an unknown or filter-only code, an empty name or a Cluster resource not
//!   named `kafka-cluster` is INVALID_REQUEST; so is a filter with an unknown code (Kafka
//!   refuses such a DescribeAcls request while parsing it and closes the connection; gregor
//!   answers INVALID_REQUEST in the response).

use std::collections::BTreeMap;
use std::sync::Arc;

use gregor_metadata::acl::{AclBinding, AclBindingFilter};
use gregor_protocol::error::ErrorCode;
use gregor_protocol::kafka_protocol::messages::create_acls_response::AclCreationResult;
use gregor_protocol::kafka_protocol::messages::delete_acls_request::DeleteAclsFilter;
use gregor_protocol::kafka_protocol::messages::delete_acls_response::{
    DeleteAclsFilterResult, DeleteAclsMatchingAcl,
};
use gregor_protocol::kafka_protocol::messages::describe_acls_response::{
    AclDescription, DescribeAclsResource,
};
use gregor_protocol::kafka_protocol::messages::{
    CreateAclsRequest, CreateAclsResponse, DeleteAclsRequest, DeleteAclsResponse,
    DescribeAclsRequest, DescribeAclsResponse,
};
use gregor_protocol::kafka_protocol::protocol::StrBytes;

use super::sb;
use crate::authorizer::{AclOperation, ResourceType, CLUSTER_NAME};
use crate::broker::Broker;
use gregor_network::RequestContext;

/// Kafka's message when no authorizer is configured (Create/DeleteAcls).
const NO_AUTHORIZER: &str = "No Authorizer is configured.";

fn opt(s: &Option<StrBytes>) -> Option<String> {
    s.as_ref().map(|s| s.to_string())
}

fn create_error(n: usize, code: ErrorCode, message: Option<&str>) -> CreateAclsResponse {
    CreateAclsResponse::default().with_results(
        (0..n)
            .map(|_| {
                AclCreationResult::default()
                    .with_error_code(code.code())
                    .with_error_message(message.map(sb))
            })
            .collect(),
    )
}

/// The answer to a CreateAcls request with `code` for every creation (Kafka's
/// `CreateAclsRequest.getErrorResponse`).
pub fn create_error_response(
    r: &CreateAclsRequest,
    code: ErrorCode,
    message: Option<&str>,
) -> CreateAclsResponse {
    create_error(r.creations.len(), code, message)
}

/// The answer to a DeleteAcls request with `code` for every filter.
pub fn delete_error_response(
    r: &DeleteAclsRequest,
    code: ErrorCode,
    message: Option<&str>,
) -> DeleteAclsResponse {
    DeleteAclsResponse::default().with_filter_results(
        r.filters
            .iter()
            .map(|_| {
                DeleteAclsFilterResult::default()
                    .with_error_code(code.code())
                    .with_error_message(message.map(sb))
            })
            .collect(),
    )
}

/// CreateAcls, on the node whose controller is active (see the module documentation).
pub async fn create_acls(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    r: &CreateAclsRequest,
) -> CreateAclsResponse {
    if !broker.authorize(
        ctx,
        AclOperation::Alter,
        ResourceType::Cluster,
        CLUSTER_NAME,
    ) {
        return create_error_response(r, ErrorCode::ClusterAuthorizationFailed, None);
    }
    if !broker.authorizer.keeps_acls() {
        return create_error_response(r, ErrorCode::SecurityDisabled, Some(NO_AUTHORIZER));
    }
    let bindings: Vec<AclBinding> = r
        .creations
        .iter()
        .map(|c| AclBinding {
            resource_type: c.resource_type,
            resource_name: c.resource_name.to_string(),
            pattern_type: c.resource_pattern_type,
            principal: c.principal.to_string(),
            host: c.host.to_string(),
            operation: c.operation,
            permission_type: c.permission_type,
        })
        .collect();
    let results = match broker.controller.create_acls(bindings).await {
        Ok(results) => results,
        Err(e) => {
            return create_error_response(r, e.error_code(), Some(&e.to_string()));
        }
    };
    CreateAclsResponse::default().with_results(
        results
            .into_iter()
            .map(|res| match res {
                Ok(()) => AclCreationResult::default().with_error_message(None),
                Err(e) => AclCreationResult::default()
                    .with_error_code(e.kafka_error_code())
                    .with_error_message(Some(sb(&e.to_string()))),
            })
            .collect(),
    )
}

fn delete_filter(f: &DeleteAclsFilter) -> AclBindingFilter {
    AclBindingFilter {
        resource_type: f.resource_type_filter,
        resource_name: opt(&f.resource_name_filter),
        pattern_type: f.pattern_type_filter,
        principal: opt(&f.principal_filter),
        host: opt(&f.host_filter),
        operation: f.operation,
        permission_type: f.permission_type,
    }
}

/// DeleteAcls, on the node whose controller is active (see the module documentation).
pub async fn delete_acls(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    r: &DeleteAclsRequest,
) -> DeleteAclsResponse {
    if !broker.authorize(
        ctx,
        AclOperation::Alter,
        ResourceType::Cluster,
        CLUSTER_NAME,
    ) {
        return delete_error_response(r, ErrorCode::ClusterAuthorizationFailed, None);
    }
    if !broker.authorizer.keeps_acls() {
        return delete_error_response(r, ErrorCode::SecurityDisabled, Some(NO_AUTHORIZER));
    }
    let filters: Vec<AclBindingFilter> = r.filters.iter().map(delete_filter).collect();
    let results = match broker.controller.delete_acls(filters).await {
        Ok(results) => results,
        Err(e) => return delete_error_response(r, e.error_code(), Some(&e.to_string())),
    };
    DeleteAclsResponse::default().with_filter_results(
        results
            .into_iter()
            .map(|res| match res {
                Ok(bindings) => DeleteAclsFilterResult::default()
                    .with_error_message(None)
                    .with_matching_acls(
                        bindings
                            .into_iter()
                            .map(|b| {
                                DeleteAclsMatchingAcl::default()
                                    .with_error_message(None)
                                    .with_resource_type(b.resource_type)
                                    .with_resource_name(sb(&b.resource_name))
                                    .with_pattern_type(b.pattern_type)
                                    .with_principal(sb(&b.principal))
                                    .with_host(sb(&b.host))
                                    .with_operation(b.operation)
                                    .with_permission_type(b.permission_type)
                            })
                            .collect(),
                    ),
                Err(e) => DeleteAclsFilterResult::default()
                    .with_error_code(e.kafka_error_code())
                    .with_error_message(Some(sb(&e.to_string()))),
            })
            .collect(),
    )
}

/// DescribeAcls, from this node's authorizer (see the module documentation). Bindings are
/// grouped by resource pattern, sorted.
pub fn describe_acls(
    broker: &Broker,
    ctx: &RequestContext,
    r: &DescribeAclsRequest,
) -> DescribeAclsResponse {
    let error = |code: ErrorCode, message: Option<&str>| {
        DescribeAclsResponse::default()
            .with_error_code(code.code())
            .with_error_message(message.map(sb))
    };
    if !broker.authorize(
        ctx,
        AclOperation::Describe,
        ResourceType::Cluster,
        CLUSTER_NAME,
    ) {
        return error(ErrorCode::ClusterAuthorizationFailed, None);
    }
    let filter = AclBindingFilter {
        resource_type: r.resource_type_filter,
        resource_name: opt(&r.resource_name_filter),
        pattern_type: r.pattern_type_filter,
        principal: opt(&r.principal_filter),
        host: opt(&r.host_filter),
        operation: r.operation,
        permission_type: r.permission_type,
    };
    if let Err(e) = filter.validate() {
        return error(ErrorCode::InvalidRequest, Some(&e));
    }
    let Some(bindings) = broker.authorizer.acls(&filter) else {
        return error(
            ErrorCode::SecurityDisabled,
            Some("No Authorizer is configured on the broker"),
        );
    };
    let mut by_resource: BTreeMap<(i8, String, i8), Vec<AclDescription>> = BTreeMap::new();
    for b in bindings {
        by_resource
            .entry((b.resource_type, b.resource_name.clone(), b.pattern_type))
            .or_default()
            .push(
                AclDescription::default()
                    .with_principal(sb(&b.principal))
                    .with_host(sb(&b.host))
                    .with_operation(b.operation)
                    .with_permission_type(b.permission_type),
            );
    }
    DescribeAclsResponse::default()
        .with_error_message(None)
        .with_resources(
            by_resource
                .into_iter()
                .map(|((rt, name, pt), acls)| {
                    DescribeAclsResource::default()
                        .with_resource_type(rt)
                        .with_resource_name(sb(&name))
                        .with_pattern_type(pt)
                        .with_acls(acls)
                })
                .collect(),
        )
}
