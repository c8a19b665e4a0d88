//! ACLs as metadata (Kafka's `AclControlManager`, `StandardAcl`, `AclBinding` and
//! `AclBindingFilter`; KIP-140 for the filters, KIP-290 for PREFIXED patterns): the bindings
//! `CreateAcls` adds and `DeleteAcls` removes, as `AccessControlEntryRecord` and
//! `RemoveAccessControlEntryRecord` committed through the controller, and the filters
//! `DescribeAcls`/`DeleteAcls` match with.
//!
//! Codes are Kafka's wire codes (i8) throughout, so that an unknown code read off the wire is
//! kept and refused by validation, never mapped to something else.

use std::collections::BTreeSet;

use gregor_protocol::metadata_records::{AccessControlEntryRecord, RemoveAccessControlEntryRecord};
use uuid::Uuid;

use crate::controller::{Controller, ControllerError, ControllerResult};

/// Kafka's `ResourceType` codes.
pub mod resource_type {
    /// UNKNOWN: a code this version does not know.
    pub const UNKNOWN: i8 = 0;
    /// ANY: filters only.
    pub const ANY: i8 = 1;
    /// TOPIC.
    pub const TOPIC: i8 = 2;
    /// GROUP.
    pub const GROUP: i8 = 3;
    /// CLUSTER (one resource, `kafka-cluster`).
    pub const CLUSTER: i8 = 4;
    /// TRANSACTIONAL_ID.
    pub const TRANSACTIONAL_ID: i8 = 5;
    /// DELEGATION_TOKEN.
    pub const DELEGATION_TOKEN: i8 = 6;
    /// USER.
    pub const USER: i8 = 7;

    /// The code as Kafka reads it (`ResourceType.fromCode`): an unknown code is UNKNOWN.
    pub fn normalize(code: i8) -> i8 {
        if (ANY..=USER).contains(&code) {
            code
        } else {
            UNKNOWN
        }
    }

    /// Kafka's name of the type (`TOPIC`, ...).
    pub fn name(code: i8) -> &'static str {
        match normalize(code) {
            ANY => "ANY",
            TOPIC => "TOPIC",
            GROUP => "GROUP",
            CLUSTER => "CLUSTER",
            TRANSACTIONAL_ID => "TRANSACTIONAL_ID",
            DELEGATION_TOKEN => "DELEGATION_TOKEN",
            USER => "USER",
            _ => "UNKNOWN",
        }
    }
}

/// Kafka's `PatternType` codes.
pub mod pattern_type {
    /// UNKNOWN.
    pub const UNKNOWN: i8 = 0;
    /// ANY (filters): any pattern type, the name compared exactly.
    pub const ANY: i8 = 1;
    /// MATCH (filters): every pattern that would match the filter's name.
    pub const MATCH: i8 = 2;
    /// LITERAL: the exact name, or `*` for every name.
    pub const LITERAL: i8 = 3;
    /// PREFIXED: every name starting with the pattern's name.
    pub const PREFIXED: i8 = 4;

    /// `PatternType.fromCode`.
    pub fn normalize(code: i8) -> i8 {
        if (ANY..=PREFIXED).contains(&code) {
            code
        } else {
            UNKNOWN
        }
    }

    /// Kafka's name.
    pub fn name(code: i8) -> &'static str {
        match normalize(code) {
            ANY => "ANY",
            MATCH => "MATCH",
            LITERAL => "LITERAL",
            PREFIXED => "PREFIXED",
            _ => "UNKNOWN",
        }
    }
}

/// Kafka's `AclOperation` codes.
pub mod operation {
    /// UNKNOWN.
    pub const UNKNOWN: i8 = 0;
    /// ANY (filters).
    pub const ANY: i8 = 1;
    /// ALL: every operation.
    pub const ALL: i8 = 2;
    /// READ.
    pub const READ: i8 = 3;
    /// WRITE.
    pub const WRITE: i8 = 4;
    /// CREATE.
    pub const CREATE: i8 = 5;
    /// DELETE.
    pub const DELETE: i8 = 6;
    /// ALTER.
    pub const ALTER: i8 = 7;
    /// DESCRIBE.
    pub const DESCRIBE: i8 = 8;
    /// CLUSTER_ACTION.
    pub const CLUSTER_ACTION: i8 = 9;
    /// DESCRIBE_CONFIGS.
    pub const DESCRIBE_CONFIGS: i8 = 10;
    /// ALTER_CONFIGS.
    pub const ALTER_CONFIGS: i8 = 11;
    /// IDEMPOTENT_WRITE.
    pub const IDEMPOTENT_WRITE: i8 = 12;
    /// CREATE_TOKENS.
    pub const CREATE_TOKENS: i8 = 13;
    /// DESCRIBE_TOKENS.
    pub const DESCRIBE_TOKENS: i8 = 14;

    /// `AclOperation.fromCode`.
    pub fn normalize(code: i8) -> i8 {
        if (ANY..=DESCRIBE_TOKENS).contains(&code) {
            code
        } else {
            UNKNOWN
        }
    }

    /// Kafka's name.
    pub fn name(code: i8) -> &'static str {
        match normalize(code) {
            ANY => "ANY",
            ALL => "ALL",
            READ => "READ",
            WRITE => "WRITE",
            CREATE => "CREATE",
            DELETE => "DELETE",
            ALTER => "ALTER",
            DESCRIBE => "DESCRIBE",
            CLUSTER_ACTION => "CLUSTER_ACTION",
            DESCRIBE_CONFIGS => "DESCRIBE_CONFIGS",
            ALTER_CONFIGS => "ALTER_CONFIGS",
            IDEMPOTENT_WRITE => "IDEMPOTENT_WRITE",
            CREATE_TOKENS => "CREATE_TOKENS",
            DESCRIBE_TOKENS => "DESCRIBE_TOKENS",
            _ => "UNKNOWN",
        }
    }
}

/// Kafka's `AclPermissionType` codes.
pub mod permission {
    /// UNKNOWN.
    pub const UNKNOWN: i8 = 0;
    /// ANY (filters).
    pub const ANY: i8 = 1;
    /// DENY.
    pub const DENY: i8 = 2;
    /// ALLOW.
    pub const ALLOW: i8 = 3;

    /// `AclPermissionType.fromCode`.
    pub fn normalize(code: i8) -> i8 {
        if (ANY..=ALLOW).contains(&code) {
            code
        } else {
            UNKNOWN
        }
    }

    /// Kafka's name.
    pub fn name(code: i8) -> &'static str {
        match normalize(code) {
            ANY => "ANY",
            DENY => "DENY",
            ALLOW => "ALLOW",
            _ => "UNKNOWN",
        }
    }
}

/// The wildcard resource name of a LITERAL pattern, and the wildcard host.
pub const WILDCARD: &str = "*";
/// The wildcard principal (`User:*`).
pub const WILDCARD_PRINCIPAL: &str = "User:*";
/// The name of the one Cluster resource (Kafka's `Resource.CLUSTER_NAME`).
pub const CLUSTER_NAME: &str = "kafka-cluster";
/// At most this many records in one CreateAcls or DeleteAcls (Kafka's
/// `QuorumController.MAX_RECORDS_PER_USER_OP`).
pub const MAX_RECORDS_PER_USER_OP: usize = 10_000;

/// Kafka's `AclBinding` (a resource pattern and an access control entry), as stored in an
/// `AccessControlEntryRecord` (Kafka's `StandardAcl`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AclBinding {
    /// [`resource_type`] code.
    pub resource_type: i8,
    /// The resource name, a prefix for PREFIXED, `*` for every resource (LITERAL).
    pub resource_name: String,
    /// [`pattern_type`] code: LITERAL or PREFIXED.
    pub pattern_type: i8,
    /// `<type>:<name>`, e.g. `User:alice`; `User:*` for every principal.
    pub principal: String,
    /// A client IP address as Java's `InetAddress.getHostAddress` writes it, or `*`.
    pub host: String,
    /// [`operation`] code.
    pub operation: i8,
    /// [`permission`] code: ALLOW or DENY.
    pub permission_type: i8,
}

impl AclBinding {
    /// The binding of a record.
    pub fn from_record(r: &AccessControlEntryRecord) -> Self {
        Self {
            resource_type: r.resource_type,
            resource_name: r.resource_name.clone(),
            pattern_type: r.pattern_type,
            principal: r.principal.clone(),
            host: r.host.clone(),
            operation: r.operation,
            permission_type: r.permission_type,
        }
    }

    /// The record of this binding with `id`.
    pub fn to_record(&self, id: Uuid) -> AccessControlEntryRecord {
        AccessControlEntryRecord {
            id,
            resource_type: self.resource_type,
            resource_name: self.resource_name.clone(),
            pattern_type: self.pattern_type,
            principal: self.principal.clone(),
            host: self.host.clone(),
            operation: self.operation,
            permission_type: self.permission_type,
            ..AccessControlEntryRecord::default()
        }
    }

    /// Kafka's checks of a new ACL (`AclApis.handleCreateAcls`, `CreateAclsRequest.validate`
    /// and `AclControlManager.validateNewAcl`), as the INVALID_REQUEST message when it fails.
    ///
    /// # Errors
    /// The reason: an unknown or filter-only code, a Cluster resource not named
    /// `kafka-cluster`, an empty resource name.
    pub fn validate(&self) -> Result<(), String> {
        match resource_type::normalize(self.resource_type) {
            resource_type::UNKNOWN | resource_type::ANY => {
                return Err(format!(
                    "Invalid resourceType {}",
                    resource_type::name(self.resource_type)
                ))
            }
            _ => {}
        }
        match pattern_type::normalize(self.pattern_type) {
            pattern_type::LITERAL | pattern_type::PREFIXED => {}
            _ => {
                return Err(format!(
                    "Invalid patternType {}",
                    pattern_type::name(self.pattern_type)
                ))
            }
        }
        match operation::normalize(self.operation) {
            operation::UNKNOWN | operation::ANY => {
                return Err(format!(
                    "Invalid operation {}",
                    operation::name(self.operation)
                ))
            }
            _ => {}
        }
        match permission::normalize(self.permission_type) {
            permission::ALLOW | permission::DENY => {}
            _ => {
                return Err(format!(
                    "Invalid permissionType {}",
                    permission::name(self.permission_type)
                ))
            }
        }
        if self.resource_type == resource_type::CLUSTER && self.resource_name != CLUSTER_NAME {
            return Err(format!(
                "The only valid name for the CLUSTER resource is {CLUSTER_NAME}"
            ));
        }
        if self.resource_name.is_empty() {
            return Err("Invalid empty resource name".into());
        }
        Ok(())
    }
}

impl std::fmt::Display for AclBinding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "(pattern=ResourcePattern(resourceType={}, name={}, patternType={}), entry=(principal={}, host={}, operation={}, permissionType={}))",
            resource_type::name(self.resource_type),
            self.resource_name,
            pattern_type::name(self.pattern_type),
            self.principal,
            self.host,
            operation::name(self.operation),
            permission::name(self.permission_type)
        )
    }
}

/// Kafka's `AclBindingFilter`: `None` strings and ANY codes match anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AclBindingFilter {
    /// [`resource_type`] code, ANY for every type.
    pub resource_type: i8,
    /// The resource name; None for every name.
    pub resource_name: Option<String>,
    /// [`pattern_type`] code: ANY, MATCH, LITERAL or PREFIXED.
    pub pattern_type: i8,
    /// The principal; None for every principal.
    pub principal: Option<String>,
    /// The host; None for every host.
    pub host: Option<String>,
    /// [`operation`] code, ANY for every operation.
    pub operation: i8,
    /// [`permission`] code, ANY for both.
    pub permission_type: i8,
}

impl AclBindingFilter {
    /// The filter matching every binding (Kafka's `AclBindingFilter.ANY`).
    pub fn any() -> Self {
        Self {
            resource_type: resource_type::ANY,
            resource_name: None,
            pattern_type: pattern_type::ANY,
            principal: None,
            host: None,
            operation: operation::ANY,
            permission_type: permission::ANY,
        }
    }

    /// Kafka's `AclBindingFilter.isUnknown`, as the INVALID_REQUEST message
    /// (`AclControlManager.validateFilter`; `DescribeAclsRequest` refuses the same).
    ///
    /// # Errors
    /// Which part of the filter has an unknown code.
    pub fn validate(&self) -> Result<(), String> {
        if resource_type::normalize(self.resource_type) == resource_type::UNKNOWN
            || pattern_type::normalize(self.pattern_type) == pattern_type::UNKNOWN
        {
            return Err("Unknown patternFilter.".into());
        }
        if operation::normalize(self.operation) == operation::UNKNOWN
            || permission::normalize(self.permission_type) == permission::UNKNOWN
        {
            return Err("Unknown entryFilter.".into());
        }
        Ok(())
    }

    /// Kafka's `AclBindingFilter.matches`: `ResourcePatternFilter.matches` (MATCH finds the
    /// LITERAL, wildcard and PREFIXED patterns that apply to the name) and
    /// `AccessControlEntryFilter.matches` (exact strings, ANY codes).
    pub fn matches(&self, b: &AclBinding) -> bool {
        self.matches_pattern(b) && self.matches_entry(b)
    }

    fn matches_pattern(&self, b: &AclBinding) -> bool {
        if self.resource_type != resource_type::ANY && self.resource_type != b.resource_type {
            return false;
        }
        if self.pattern_type != pattern_type::ANY
            && self.pattern_type != pattern_type::MATCH
            && self.pattern_type != b.pattern_type
        {
            return false;
        }
        let Some(name) = &self.resource_name else {
            return true;
        };
        if self.pattern_type == pattern_type::ANY || self.pattern_type == b.pattern_type {
            return *name == b.resource_name;
        }
        // MATCH.
        match b.pattern_type {
            pattern_type::LITERAL => *name == b.resource_name || b.resource_name == WILDCARD,
            pattern_type::PREFIXED => name.starts_with(&b.resource_name),
            _ => false,
        }
    }

    fn matches_entry(&self, b: &AclBinding) -> bool {
        self.principal.as_ref().is_none_or(|p| *p == b.principal)
            && self.host.as_ref().is_none_or(|h| *h == b.host)
            && (self.operation == operation::ANY || self.operation == b.operation)
            && (self.permission_type == permission::ANY
                || self.permission_type == b.permission_type)
    }
}

impl Controller {
    /// CreateAcls on the active controller (Kafka's `AclControlManager.createAcls`): one
    /// answer per binding, in order; a binding that already exists (or appears twice) is a
    /// success without a record. The records are committed together.
    pub fn create_acls(
        &mut self,
        bindings: Vec<AclBinding>,
    ) -> ControllerResult<Vec<Result<(), ControllerError>>> {
        let mut existing: BTreeSet<AclBinding> = self
            .image
            .acls
            .values()
            .map(AclBinding::from_record)
            .collect();
        let mut ids: BTreeSet<Uuid> = BTreeSet::new();
        let mut records = Vec::new();
        let mut response = Vec::with_capacity(bindings.len());
        for b in bindings {
            if let Err(e) = b.validate() {
                response.push(Err(ControllerError::InvalidRequest(e)));
                continue;
            }
            if records.len() >= MAX_RECORDS_PER_USER_OP {
                response.push(Err(ControllerError::InvalidRequest(format!(
                    "Cannot create more than {MAX_RECORDS_PER_USER_OP} acls in a single operation"
                ))));
                continue;
            }
            if !existing.contains(&b) {
                let id = loop {
                    let id = Uuid::from_bytes(rand::Rng::gen(&mut self.rng));
                    if !id.is_nil() && !self.image.acls.contains_key(&id) && ids.insert(id) {
                        break id;
                    }
                };
                records.push(b.to_record(id).into());
                existing.insert(b);
            }
            response.push(Ok(()));
        }
        ControllerResult { records, response }
    }

    /// DeleteAcls on the active controller (Kafka's `AclControlManager.deleteAcls`): per
    /// filter the bindings it removes; an ACL matched by several filters is removed once (and
    /// reported by each). The records are committed together.
    pub fn delete_acls(
        &self,
        filters: Vec<AclBindingFilter>,
    ) -> ControllerResult<Vec<Result<Vec<AclBinding>, ControllerError>>> {
        let mut removed: BTreeSet<Uuid> = BTreeSet::new();
        let mut response = Vec::with_capacity(filters.len());
        for f in filters {
            if let Err(e) = f.validate() {
                response.push(Err(ControllerError::InvalidRequest(e)));
                continue;
            }
            let matched: Vec<(Uuid, AclBinding)> = self
                .image
                .acls
                .iter()
                .map(|(id, r)| (*id, AclBinding::from_record(r)))
                .filter(|(_, b)| f.matches(b))
                .collect();
            let new = matched
                .iter()
                .filter(|(id, _)| !removed.contains(id))
                .count();
            if removed.len() + new > MAX_RECORDS_PER_USER_OP {
                response.push(Err(ControllerError::Remote(
                    gregor_protocol::error::ErrorCode::UnknownServerError,
                    format!(
                        "Cannot remove more than {MAX_RECORDS_PER_USER_OP} acls in a single delete operation."
                    ),
                )));
                continue;
            }
            removed.extend(matched.iter().map(|(id, _)| *id));
            response.push(Ok(matched.into_iter().map(|(_, b)| b).collect()));
        }
        let records = removed
            .into_iter()
            .map(|id| {
                RemoveAccessControlEntryRecord {
                    id,
                    ..RemoveAccessControlEntryRecord::default()
                }
                .into()
            })
            .collect();
        ControllerResult { records, response }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::MetadataRecord;

    fn binding(rt: i8, name: &str, pt: i8, principal: &str, op: i8, perm: i8) -> AclBinding {
        AclBinding {
            resource_type: rt,
            resource_name: name.into(),
            pattern_type: pt,
            principal: principal.into(),
            host: "*".into(),
            operation: op,
            permission_type: perm,
        }
    }

    fn apply(c: &mut Controller, records: Vec<MetadataRecord>) {
        for r in records {
            c.image.apply(&r);
        }
    }

    #[test]
    fn validation_refuses_what_kafka_refuses() {
        let ok = binding(
            resource_type::TOPIC,
            "t",
            pattern_type::LITERAL,
            "User:a",
            operation::READ,
            permission::ALLOW,
        );
        assert!(ok.validate().is_ok());
        let cases = [
            (
                AclBinding {
                    resource_type: resource_type::ANY,
                    ..ok.clone()
                },
                "Invalid resourceType ANY",
            ),
            (
                AclBinding {
                    resource_type: 42,
                    ..ok.clone()
                },
                "Invalid resourceType UNKNOWN",
            ),
            (
                AclBinding {
                    pattern_type: pattern_type::MATCH,
                    ..ok.clone()
                },
                "Invalid patternType MATCH",
            ),
            (
                AclBinding {
                    pattern_type: pattern_type::ANY,
                    ..ok.clone()
                },
                "Invalid patternType ANY",
            ),
            (
                AclBinding {
                    operation: operation::ANY,
                    ..ok.clone()
                },
                "Invalid operation ANY",
            ),
            (
                AclBinding {
                    operation: 99,
                    ..ok.clone()
                },
                "Invalid operation UNKNOWN",
            ),
            (
                AclBinding {
                    permission_type: permission::ANY,
                    ..ok.clone()
                },
                "Invalid permissionType ANY",
            ),
            (
                AclBinding {
                    resource_name: String::new(),
                    ..ok.clone()
                },
                "Invalid empty resource name",
            ),
            (
                AclBinding {
                    resource_type: resource_type::CLUSTER,
                    resource_name: "c".into(),
                    ..ok.clone()
                },
                "The only valid name for the CLUSTER resource is kafka-cluster",
            ),
        ];
        for (b, msg) in cases {
            assert_eq!(b.validate().unwrap_err(), msg, "{b}");
        }
    }

    #[test]
    fn filters_match_as_kafkas() {
        let lit = binding(
            2,
            "foo",
            pattern_type::LITERAL,
            "User:a",
            operation::READ,
            permission::ALLOW,
        );
        let wild = binding(
            2,
            "*",
            pattern_type::LITERAL,
            "User:a",
            operation::READ,
            permission::ALLOW,
        );
        let pre = binding(
            2,
            "fo",
            pattern_type::PREFIXED,
            "User:a",
            operation::READ,
            permission::ALLOW,
        );
        let other = binding(
            2,
            "bar",
            pattern_type::LITERAL,
            "User:b",
            operation::WRITE,
            permission::DENY,
        );
        let f = |pt: i8, name: Option<&str>| AclBindingFilter {
            resource_type: 2,
            resource_name: name.map(str::to_string),
            pattern_type: pt,
            ..AclBindingFilter::any()
        };
        // MATCH: every pattern that applies to "foo".
        let m = f(pattern_type::MATCH, Some("foo"));
        assert!(m.matches(&lit) && m.matches(&wild) && m.matches(&pre) && !m.matches(&other));
        // ANY: the name exactly, any pattern type.
        let a = f(pattern_type::ANY, Some("fo"));
        assert!(!a.matches(&lit) && !a.matches(&wild) && a.matches(&pre));
        // LITERAL "*" is only the wildcard binding.
        let l = f(pattern_type::LITERAL, Some("*"));
        assert!(!l.matches(&lit) && l.matches(&wild) && !l.matches(&pre));
        // PREFIXED without a name: every prefixed binding.
        let p = f(pattern_type::PREFIXED, None);
        assert!(p.matches(&pre) && !p.matches(&lit));
        // Entry filter.
        let e = AclBindingFilter {
            principal: Some("User:b".into()),
            permission_type: permission::DENY,
            ..AclBindingFilter::any()
        };
        assert!(e.matches(&other) && !e.matches(&lit));
        let e = AclBindingFilter {
            operation: operation::READ,
            host: Some("*".into()),
            ..AclBindingFilter::any()
        };
        assert!(e.matches(&lit) && !e.matches(&other));
        // Other resource types never match.
        let g = AclBindingFilter {
            resource_type: resource_type::GROUP,
            ..AclBindingFilter::any()
        };
        assert!(!g.matches(&lit));
        // Unknown codes are invalid filters.
        assert!(AclBindingFilter {
            pattern_type: 9,
            ..AclBindingFilter::any()
        }
        .validate()
        .is_err());
        assert!(AclBindingFilter {
            resource_type: 0,
            ..AclBindingFilter::any()
        }
        .validate()
        .is_err());
        assert!(AclBindingFilter {
            operation: 0,
            ..AclBindingFilter::any()
        }
        .validate()
        .is_err());
        assert!(AclBindingFilter {
            permission_type: 0,
            ..AclBindingFilter::any()
        }
        .validate()
        .is_err());
        assert!(AclBindingFilter::any().validate().is_ok());
    }

    #[test]
    fn create_is_idempotent_and_delete_removes_each_acl_once() {
        let mut c = Controller::default();
        let a = binding(
            2,
            "t",
            pattern_type::LITERAL,
            "User:a",
            operation::READ,
            permission::ALLOW,
        );
        let b = binding(
            3,
            "g",
            pattern_type::PREFIXED,
            "User:a",
            operation::ALL,
            permission::DENY,
        );
        let bad = AclBinding {
            resource_name: String::new(),
            ..a.clone()
        };
        let r = c.create_acls(vec![a.clone(), b.clone(), a.clone(), bad]);
        assert_eq!(r.records.len(), 2, "the duplicate is one ACL");
        assert!(r.response[0].is_ok() && r.response[1].is_ok() && r.response[2].is_ok());
        assert_eq!(r.response[3].as_ref().unwrap_err().kafka_error_code(), 42);
        apply(&mut c, r.records);
        assert_eq!(c.image.acls.len(), 2);
        // Creating an existing ACL again writes nothing.
        let r = c.create_acls(vec![a.clone()]);
        assert!(r.records.is_empty() && r.response[0].is_ok());

        let by_user = AclBindingFilter {
            principal: Some("User:a".into()),
            ..AclBindingFilter::any()
        };
        let topics = AclBindingFilter {
            resource_type: resource_type::TOPIC,
            ..AclBindingFilter::any()
        };
        let unknown = AclBindingFilter {
            operation: 0,
            ..AclBindingFilter::any()
        };
        let r = c.delete_acls(vec![by_user, topics, unknown]);
        assert_eq!(r.records.len(), 2, "each ACL removed once");
        let first = r.response[0].as_ref().unwrap();
        assert_eq!(first.len(), 2);
        assert_eq!(r.response[1].as_ref().unwrap(), &vec![a]);
        assert_eq!(r.response[2].as_ref().unwrap_err().kafka_error_code(), 42);
        apply(&mut c, r.records);
        assert!(c.image.acls.is_empty());
    }
}
