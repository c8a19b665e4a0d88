//! The ACL authorizer: Kafka's `StandardAuthorizer` (`authorizer.class.name=
//! org.apache.kafka.metadata.authorizer.StandardAuthorizer`), over the ACLs of the metadata log
//! (`AccessControlEntryRecord` / `RemoveAccessControlEntryRecord`, applied by the loader to
//! this authorizer as a [`MetadataPublisher`]).
//!
//! Decisions, as Kafka's `StandardAuthorizerData.authorize`:
//! - a principal listed in `super.users` (`User:alice;User:bob`) may do everything;
//! - before the first metadata image is applied, everyone else is denied (Kafka throws
//!   `AuthorizerNotReadyException`; gregor's broker listeners only accept once the metadata is
//!   loaded, so this only concerns the controller listener, Kafka's `early.start.listeners`);
//! - otherwise the ACLs of the resource are those whose pattern applies to its name: LITERAL
//!   with the same name, LITERAL `*`, and PREFIXED whose name starts the resource's name. Of
//!   those, the ones whose principal is the request's or `User:*`, whose host is the client's
//!   IP address (as Java writes it) or `*`, and whose operation is the requested one or ALL
//!   decide: any DENY denies; else any ALLOW allows. An ALLOW of READ, WRITE, DELETE or ALTER
//!   also allows DESCRIBE, and ALTER_CONFIGS allows DESCRIBE_CONFIGS (DENY implies nothing);
//! - a resource with no ACL at all gets `allow.everyone.if.no.acl.found` (default false);
//!   one with ACLs none of which match is denied.
//!
//! The index finds a resource's ACLs without scanning the others: per resource type, a hash
//! map of LITERAL names and one of PREFIXED names, looked up for each length a PREFIXED
//! pattern of that type has. It is copied on write and swapped, so requests never wait for a
//! metadata update.

use std::collections::{BTreeMap, HashMap};

/// Denials before the metadata is loaded: at most 10 lines per 10 s.
static NOT_READY_LOGS: gregor_network::log_limit::LogLimiter =
    gregor_network::log_limit::LogLimiter::new(10, std::time::Duration::from_secs(10));
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use gregor_metadata::acl::{
    operation, pattern_type, permission, AclBinding, AclBindingFilter, WILDCARD, WILDCARD_PRINCIPAL,
};
use gregor_metadata::loader::{MetadataDelta, MetadataPublisher};
use gregor_metadata::{MetadataImage, MetadataRecord};
use gregor_network::RequestContext;
use parking_lot::RwLock;
use uuid::Uuid;

use crate::authorizer::{Action, AuthorizationResult, Authorizer, PatternType};

/// The `authorizer.class.name` that selects this authorizer.
pub const STANDARD_AUTHORIZER_CLASS: &str =
    "org.apache.kafka.metadata.authorizer.StandardAuthorizer";

/// The ACLs of one resource type.
#[derive(Clone, Default)]
struct TypeIndex {
    literal: HashMap<String, Vec<(Uuid, Arc<AclBinding>)>>,
    prefixed: HashMap<String, Vec<(Uuid, Arc<AclBinding>)>>,
    /// Lengths (bytes) of the PREFIXED names, with how many names have each.
    prefix_lengths: BTreeMap<usize, usize>,
}

/// Every ACL, by id and by resource.
#[derive(Clone, Default)]
struct AclIndex {
    by_id: HashMap<Uuid, Arc<AclBinding>>,
    by_type: HashMap<i8, TypeIndex>,
}

impl AclIndex {
    fn add(&mut self, id: Uuid, b: AclBinding) {
        self.remove(id);
        let b = Arc::new(b);
        let t = self.by_type.entry(b.resource_type).or_default();
        let map = if b.pattern_type == pattern_type::PREFIXED {
            *t.prefix_lengths.entry(b.resource_name.len()).or_default() += 1;
            &mut t.prefixed
        } else {
            &mut t.literal
        };
        map.entry(b.resource_name.clone())
            .or_default()
            .push((id, b.clone()));
        self.by_id.insert(id, b);
    }

    fn remove(&mut self, id: Uuid) {
        let Some(b) = self.by_id.remove(&id) else {
            return;
        };
        let Some(t) = self.by_type.get_mut(&b.resource_type) else {
            return;
        };
        let prefixed = b.pattern_type == pattern_type::PREFIXED;
        let map = if prefixed {
            &mut t.prefixed
        } else {
            &mut t.literal
        };
        if let Some(v) = map.get_mut(&b.resource_name) {
            v.retain(|(i, _)| *i != id);
            if v.is_empty() {
                map.remove(&b.resource_name);
                if prefixed {
                    let len = b.resource_name.len();
                    if let Some(n) = t.prefix_lengths.get_mut(&len) {
                        *n -= 1;
                        if *n == 0 {
                            t.prefix_lengths.remove(&len);
                        }
                    }
                }
            }
        }
    }

    /// Calls `f` with every ACL whose pattern applies to the literal resource `name`.
    fn for_each_applicable(&self, resource_type: i8, name: &str, mut f: impl FnMut(&AclBinding)) {
        let Some(t) = self.by_type.get(&resource_type) else {
            return;
        };
        let mut visit = |v: Option<&Vec<(Uuid, Arc<AclBinding>)>>| {
            for (_, b) in v.into_iter().flatten() {
                f(b);
            }
        };
        visit(t.literal.get(name));
        if name != WILDCARD {
            visit(t.literal.get(WILDCARD));
        }
        for len in t.prefix_lengths.keys().take_while(|l| **l <= name.len()) {
            if let Some(prefix) = name.get(..*len) {
                visit(t.prefixed.get(prefix));
            }
        }
    }
}

/// Java's `InetAddress.getHostAddress` of the client address, as ACL hosts are written
/// (IPv4 dotted; IPv6 as eight groups of lower-case hex without leading zeros, no `::`).
pub fn java_host_address(ip: IpAddr) -> String {
    match ip.to_canonical() {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => v6
            .segments()
            .iter()
            .map(|s| format!("{s:x}"))
            .collect::<Vec<_>>()
            .join(":"),
    }
}

/// Kafka's `StandardAuthorizer`; see the module documentation.
pub struct StandardAuthorizer {
    super_users: Vec<String>,
    allow_if_no_acl: bool,
    loaded: AtomicBool,
    index: RwLock<Arc<AclIndex>>,
}

impl StandardAuthorizer {
    /// An authorizer with `super.users` (Kafka's `;`-separated principals) and
    /// `allow.everyone.if.no.acl.found`, not ready until it has applied a metadata image.
    pub fn new(super_users: &str, allow_everyone_if_no_acl_found: bool) -> Self {
        Self {
            super_users: parse_super_users(super_users),
            allow_if_no_acl: allow_everyone_if_no_acl_found,
            loaded: AtomicBool::new(false),
            index: RwLock::new(Arc::new(AclIndex::default())),
        }
    }

    /// Whether the first metadata image has been applied.
    pub fn is_ready(&self) -> bool {
        self.loaded.load(Ordering::Acquire)
    }

    /// How many ACLs are held.
    pub fn acl_count(&self) -> usize {
        self.index.read().by_id.len()
    }

    fn snapshot(&self) -> Arc<AclIndex> {
        self.index.read().clone()
    }

    fn is_super_user(&self, principal: &str) -> bool {
        self.super_users.iter().any(|s| s == principal)
    }

    fn authorize_one(
        &self,
        index: &AclIndex,
        principal: &str,
        host: &str,
        action: &Action,
    ) -> AuthorizationResult {
        if self.is_super_user(principal) {
            return AuthorizationResult::Allowed;
        }
        if !self.is_ready() {
            // Only the controller listener serves before the metadata is loaded; what it is
            // asked then (votes, the quorum's fetches, registrations) needs the nodes'
            // principals in super.users, or no quorum forms. Say so, naming the principal.
            if let Some(suppressed) = NOT_READY_LOGS.check(std::time::Instant::now()) {
                tracing::warn!(
                    target: "kafka.authorizer.logger",
                    principal,
                    host,
                    operation = ?action.operation,
                    resource = ?action.resource_pattern,
                    suppressed,
                    "denied: the authorizer has not loaded the metadata yet, so only super.users are allowed (list the nodes' own principals there, e.g. User:CN=node1 for mTLS between controllers)"
                );
            }
            return AuthorizationResult::Denied;
        }
        if action.resource_pattern.pattern_type != PatternType::Literal {
            return AuthorizationResult::Denied;
        }
        let op = action.operation.code();
        let mut has_resource_acls = false;
        let mut allow = false;
        let mut deny = false;
        index.for_each_applicable(
            action.resource_pattern.resource_type.code(),
            &action.resource_pattern.name,
            |acl| {
                has_resource_acls = true;
                match acl_result(acl, principal, host, op) {
                    Some(AuthorizationResult::Denied) => deny = true,
                    Some(AuthorizationResult::Allowed) => allow = true,
                    None => {}
                }
            },
        );
        // Any DENY wins; then any ALLOW; a resource without any ACL gets the default.
        let allowed = !deny && (allow || (!has_resource_acls && self.allow_if_no_acl));
        let result = if allowed {
            AuthorizationResult::Allowed
        } else {
            AuthorizationResult::Denied
        };
        if result == AuthorizationResult::Denied && action.log_if_denied {
            tracing::info!(
                target: "kafka.authorizer.logger",
                principal,
                host,
                operation = ?action.operation,
                resource = ?action.resource_pattern,
                "denied"
            );
        }
        result
    }
}

/// Kafka's `StandardAuthorizer.getConfiguredSuperUsers`: `;`-separated, trimmed, empty
/// entries skipped.
fn parse_super_users(value: &str) -> Vec<String> {
    value
        .split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// Kafka's `StandardAuthorizerData.findResult`: whether `acl` (whose pattern applies to the
/// resource) decides for `principal` at `host` doing `op`; None when it does not apply.
fn acl_result(
    acl: &AclBinding,
    principal: &str,
    host: &str,
    op: i8,
) -> Option<AuthorizationResult> {
    if acl.principal != principal && acl.principal != WILDCARD_PRINCIPAL {
        return None;
    }
    if acl.host != WILDCARD && acl.host != host {
        return None;
    }
    if acl.operation != operation::ALL {
        if acl.permission_type == permission::ALLOW {
            let applies = match op {
                operation::DESCRIBE => matches!(
                    acl.operation,
                    operation::DESCRIBE
                        | operation::READ
                        | operation::WRITE
                        | operation::DELETE
                        | operation::ALTER
                ),
                operation::DESCRIBE_CONFIGS => matches!(
                    acl.operation,
                    operation::DESCRIBE_CONFIGS | operation::ALTER_CONFIGS
                ),
                _ => acl.operation == op,
            };
            if !applies {
                return None;
            }
        } else if acl.operation != op {
            return None;
        }
    }
    match acl.permission_type {
        permission::ALLOW => Some(AuthorizationResult::Allowed),
        permission::DENY => Some(AuthorizationResult::Denied),
        _ => None,
    }
}

impl Authorizer for StandardAuthorizer {
    fn authorize(&self, ctx: &RequestContext, actions: &[Action]) -> Vec<AuthorizationResult> {
        let index = self.snapshot();
        let principal = ctx.principal.to_string();
        let host = java_host_address(ctx.client_address.ip());
        actions
            .iter()
            .map(|a| self.authorize_one(&index, &principal, &host, a))
            .collect()
    }

    /// Kafka's `Authorizer.authorizeByResourceType` (KIP-679): whether the principal may do
    /// `op` on some resource of the type (a super user, an ALLOW on `*`, or a LITERAL or
    /// PREFIXED ALLOW not covered by a DENY of the same literal name or of a prefix of it).
    fn authorize_by_resource_type(
        &self,
        ctx: &RequestContext,
        op: crate::authorizer::AclOperation,
        resource_type: crate::authorizer::ResourceType,
    ) -> AuthorizationResult {
        let probe = Action {
            resource_reference_count: 0,
            log_if_allowed: true,
            log_if_denied: false,
            ..Action::new(
                op,
                crate::authorizer::ResourcePattern::literal(resource_type, "hardcode"),
            )
        };
        if self.authorize(ctx, std::slice::from_ref(&probe))[0] == AuthorizationResult::Allowed {
            return AuthorizationResult::Allowed;
        }
        let principal = ctx.principal.to_string();
        let host = java_host_address(ctx.client_address.ip());
        let index = self.snapshot();
        let Some(t) = index.by_type.get(&resource_type.code()) else {
            return AuthorizationResult::Denied;
        };
        let op = op.code();
        let mut deny_literal = std::collections::HashSet::new();
        let mut deny_prefixed = std::collections::HashSet::new();
        let mut allow: Vec<(bool, &str)> = Vec::new();
        let all = t
            .literal
            .values()
            .chain(t.prefixed.values())
            .flatten()
            .map(|(_, b)| b);
        for b in all {
            if b.host != host && b.host != WILDCARD {
                continue;
            }
            if b.principal != principal && b.principal != WILDCARD_PRINCIPAL {
                continue;
            }
            if b.operation != op && b.operation != operation::ALL {
                continue;
            }
            let prefixed = b.pattern_type == pattern_type::PREFIXED;
            match b.permission_type {
                permission::DENY => {
                    if !prefixed && b.resource_name == WILDCARD {
                        return AuthorizationResult::Denied;
                    }
                    if prefixed {
                        deny_prefixed.insert(b.resource_name.as_str());
                    } else {
                        deny_literal.insert(b.resource_name.as_str());
                    }
                }
                permission::ALLOW => allow.push((prefixed, b.resource_name.as_str())),
                _ => {}
            }
        }
        if allow
            .iter()
            .any(|(prefixed, name)| !prefixed && *name == WILDCARD)
        {
            return AuthorizationResult::Allowed;
        }
        for (prefixed, name) in allow {
            if !prefixed && deny_literal.contains(name) {
                continue;
            }
            let dominated = name
                .char_indices()
                .map(|(i, c)| &name[..i + c.len_utf8()])
                .any(|p| deny_prefixed.contains(p));
            if !dominated {
                return AuthorizationResult::Allowed;
            }
        }
        AuthorizationResult::Denied
    }

    fn keeps_acls(&self) -> bool {
        true
    }

    fn acls(&self, filter: &AclBindingFilter) -> Option<Vec<AclBinding>> {
        let index = self.snapshot();
        let mut out: Vec<AclBinding> = index
            .by_id
            .values()
            .filter(|b| filter.matches(b))
            .map(|b| (**b).clone())
            .collect();
        out.sort();
        Some(out)
    }

    fn metadata_publisher(self: Arc<Self>) -> Option<Arc<dyn MetadataPublisher>> {
        Some(self)
    }
}

impl MetadataPublisher for StandardAuthorizer {
    fn name(&self) -> &str {
        "StandardAuthorizer"
    }

    fn on_metadata_update(
        &self,
        delta: &MetadataDelta<'_>,
        image: &Arc<MetadataImage>,
    ) -> Result<(), String> {
        let first = !self.is_ready();
        if first || delta.snapshot {
            let mut index = AclIndex::default();
            for (id, r) in &image.acls {
                index.add(*id, AclBinding::from_record(r));
            }
            let n = index.by_id.len();
            *self.index.write() = Arc::new(index);
            if first {
                tracing::info!(acls = n, "StandardAuthorizer initialized");
            }
            self.loaded.store(true, Ordering::Release);
            return Ok(());
        }
        let changes: Vec<&MetadataRecord> = delta
            .records
            .iter()
            .filter(|r| {
                matches!(
                    r,
                    MetadataRecord::AccessControlEntry(_)
                        | MetadataRecord::RemoveAccessControlEntry(_)
                )
            })
            .collect();
        if changes.is_empty() {
            return Ok(());
        }
        let mut index = (*self.snapshot()).clone();
        for r in changes {
            match r {
                MetadataRecord::AccessControlEntry(a) => {
                    index.add(a.id, AclBinding::from_record(a))
                }
                MetadataRecord::RemoveAccessControlEntry(a) => index.remove(a.id),
                _ => {}
            }
        }
        *self.index.write() = Arc::new(index);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! StandardAuthorizer's rules over request contexts with other principals and hosts
    //! (Kafka's `StandardAuthorizerTest`/`AclAuthorizerTest` cases, rewritten).

    use std::net::SocketAddr;
    use std::time::Instant;

    use gregor_metadata::acl::{operation as op, pattern_type as pt, permission as perm};
    use gregor_network::{KafkaPrincipal, SecurityProtocol};
    use gregor_protocol::kafka_protocol::messages::{ApiKey, RequestHeader};
    use gregor_protocol::metadata_records::RemoveAccessControlEntryRecord;

    use super::*;
    use crate::authorizer::{AclOperation, ResourcePattern, ResourceType};

    fn ctx(principal: &str, host: &str) -> RequestContext {
        let (t, n) = principal.split_once(':').expect("type:name");
        RequestContext {
            header: RequestHeader::default(),
            api_key: ApiKey::Metadata,
            principal: KafkaPrincipal {
                principal_type: t.into(),
                name: n.into(),
            },
            listener_name: "PLAINTEXT".into(),
            security_protocol: SecurityProtocol::Plaintext,
            client_address: SocketAddr::new(host.parse().expect("ip"), 5000),
            client_software_name: "t".into(),
            client_software_version: "t".into(),
            received_at: Instant::now(),
            sends_files: false,
            size_in_bytes: 0,
            throttle: Default::default(),
        }
    }

    fn acl(
        rt: ResourceType,
        name: &str,
        pattern: i8,
        who: &str,
        host: &str,
        o: i8,
        p: i8,
    ) -> AclBinding {
        AclBinding {
            resource_type: rt.code(),
            resource_name: name.into(),
            pattern_type: pattern,
            principal: who.into(),
            host: host.into(),
            operation: o,
            permission_type: p,
        }
    }

    /// An authorizer that has loaded an image with `acls`.
    fn loaded(super_users: &str, allow_if_no_acl: bool, acls: &[AclBinding]) -> StandardAuthorizer {
        let a = StandardAuthorizer::new(super_users, allow_if_no_acl);
        let mut image = MetadataImage::default();
        for (i, b) in acls.iter().enumerate() {
            image.acls.insert(
                Uuid::from_u128(i as u128 + 1),
                b.to_record(Uuid::from_u128(i as u128 + 1)),
            );
        }
        let previous = MetadataImage::default();
        a.on_metadata_update(
            &MetadataDelta {
                previous: &previous,
                records: &[],
                snapshot: false,
                epoch: 0,
            },
            &Arc::new(image),
        )
        .expect("load");
        a
    }

    fn allowed(
        a: &StandardAuthorizer,
        who: &str,
        host: &str,
        o: AclOperation,
        rt: ResourceType,
        name: &str,
    ) -> bool {
        let action = Action::new(o, ResourcePattern::literal(rt, name));
        a.authorize(&ctx(who, host), &[action])[0] == AuthorizationResult::Allowed
    }

    const ALICE: &str = "User:alice";
    const BOB: &str = "User:bob";
    const H1: &str = "192.168.0.1";
    const H2: &str = "192.168.0.2";

    #[test]
    fn literal_allow_and_the_default_deny() {
        let a = loaded(
            "",
            false,
            &[acl(
                ResourceType::Topic,
                "foo",
                pt::LITERAL,
                ALICE,
                "*",
                op::READ,
                perm::ALLOW,
            )],
        );
        assert!(allowed(
            &a,
            ALICE,
            H1,
            AclOperation::Read,
            ResourceType::Topic,
            "foo"
        ));
        assert!(!allowed(
            &a,
            ALICE,
            H1,
            AclOperation::Write,
            ResourceType::Topic,
            "foo"
        ));
        assert!(!allowed(
            &a,
            BOB,
            H1,
            AclOperation::Read,
            ResourceType::Topic,
            "foo"
        ));
        // Another name, another type: no ACL at all, and allow.everyone.if.no.acl.found=false.
        assert!(!allowed(
            &a,
            ALICE,
            H1,
            AclOperation::Read,
            ResourceType::Topic,
            "foo2"
        ));
        assert!(!allowed(
            &a,
            ALICE,
            H1,
            AclOperation::Read,
            ResourceType::Group,
            "foo"
        ));
        // A literal name is not a prefix.
        assert!(!allowed(
            &a,
            ALICE,
            H1,
            AclOperation::Read,
            ResourceType::Topic,
            "fo"
        ));
    }

    #[test]
    fn allow_everyone_if_no_acl_found_applies_only_to_resources_without_acls() {
        let a = loaded(
            "",
            true,
            &[acl(
                ResourceType::Topic,
                "foo",
                pt::LITERAL,
                ALICE,
                "*",
                op::READ,
                perm::ALLOW,
            )],
        );
        // No ACL on "bar": allowed to anyone.
        assert!(allowed(
            &a,
            BOB,
            H1,
            AclOperation::Write,
            ResourceType::Topic,
            "bar"
        ));
        // "foo" has an ACL (for alice, READ): bob and alice's WRITE are denied.
        assert!(!allowed(
            &a,
            BOB,
            H1,
            AclOperation::Read,
            ResourceType::Topic,
            "foo"
        ));
        assert!(!allowed(
            &a,
            ALICE,
            H1,
            AclOperation::Write,
            ResourceType::Topic,
            "foo"
        ));
        // A wildcard or prefixed ACL counts as an ACL of the resource.
        let a = loaded(
            "",
            true,
            &[acl(
                ResourceType::Topic,
                "ba",
                pt::PREFIXED,
                ALICE,
                "*",
                op::READ,
                perm::ALLOW,
            )],
        );
        assert!(!allowed(
            &a,
            BOB,
            H1,
            AclOperation::Read,
            ResourceType::Topic,
            "bar"
        ));
        assert!(allowed(
            &a,
            BOB,
            H1,
            AclOperation::Read,
            ResourceType::Topic,
            "qux"
        ));
        let a = loaded(
            "",
            true,
            &[acl(
                ResourceType::Topic,
                "*",
                pt::LITERAL,
                ALICE,
                "*",
                op::READ,
                perm::ALLOW,
            )],
        );
        assert!(!allowed(
            &a,
            BOB,
            H1,
            AclOperation::Read,
            ResourceType::Topic,
            "anything"
        ));
        assert!(allowed(
            &a,
            BOB,
            H1,
            AclOperation::Read,
            ResourceType::Group,
            "anything"
        ));
    }

    #[test]
    fn any_matching_deny_wins() {
        let a = loaded(
            "",
            false,
            &[
                acl(
                    ResourceType::Topic,
                    "*",
                    pt::LITERAL,
                    "User:*",
                    "*",
                    op::ALL,
                    perm::ALLOW,
                ),
                acl(
                    ResourceType::Topic,
                    "secret",
                    pt::PREFIXED,
                    BOB,
                    "*",
                    op::READ,
                    perm::DENY,
                ),
                acl(
                    ResourceType::Topic,
                    "public",
                    pt::LITERAL,
                    ALICE,
                    H2,
                    op::ALL,
                    perm::DENY,
                ),
            ],
        );
        assert!(allowed(
            &a,
            BOB,
            H1,
            AclOperation::Read,
            ResourceType::Topic,
            "public"
        ));
        assert!(allowed(
            &a,
            BOB,
            H1,
            AclOperation::Write,
            ResourceType::Topic,
            "secret-1"
        ));
        assert!(!allowed(
            &a,
            BOB,
            H1,
            AclOperation::Read,
            ResourceType::Topic,
            "secret-1"
        ));
        assert!(allowed(
            &a,
            ALICE,
            H1,
            AclOperation::Read,
            ResourceType::Topic,
            "secret-1"
        ));
        // DENY ALL from one host.
        assert!(!allowed(
            &a,
            ALICE,
            H2,
            AclOperation::Describe,
            ResourceType::Topic,
            "public"
        ));
        assert!(allowed(
            &a,
            ALICE,
            H1,
            AclOperation::Describe,
            ResourceType::Topic,
            "public"
        ));
        // A DENY of READ does not deny DESCRIBE (implication is for ALLOW only).
        assert!(allowed(
            &a,
            BOB,
            H1,
            AclOperation::Describe,
            ResourceType::Topic,
            "secret-1"
        ));
        // A wildcard DENY denies every name.
        let a = loaded(
            "",
            false,
            &[
                acl(
                    ResourceType::Group,
                    "g",
                    pt::LITERAL,
                    ALICE,
                    "*",
                    op::READ,
                    perm::ALLOW,
                ),
                acl(
                    ResourceType::Group,
                    "*",
                    pt::LITERAL,
                    ALICE,
                    "*",
                    op::READ,
                    perm::DENY,
                ),
            ],
        );
        assert!(!allowed(
            &a,
            ALICE,
            H1,
            AclOperation::Read,
            ResourceType::Group,
            "g"
        ));
    }

    #[test]
    fn implied_operations() {
        for (granted, implied) in [
            (op::READ, AclOperation::Describe),
            (op::WRITE, AclOperation::Describe),
            (op::DELETE, AclOperation::Describe),
            (op::ALTER, AclOperation::Describe),
            (op::ALTER_CONFIGS, AclOperation::DescribeConfigs),
        ] {
            let a = loaded(
                "",
                false,
                &[acl(
                    ResourceType::Topic,
                    "t",
                    pt::LITERAL,
                    ALICE,
                    "*",
                    granted,
                    perm::ALLOW,
                )],
            );
            assert!(
                allowed(&a, ALICE, H1, implied, ResourceType::Topic, "t"),
                "{granted} implies {implied:?}"
            );
        }
        for (granted, not_implied) in [
            (op::CREATE, AclOperation::Describe),
            (op::DESCRIBE, AclOperation::Read),
            (op::DESCRIBE_CONFIGS, AclOperation::AlterConfigs),
            (op::READ, AclOperation::DescribeConfigs),
            (op::ALTER, AclOperation::AlterConfigs),
            (op::WRITE, AclOperation::Read),
            (op::CLUSTER_ACTION, AclOperation::Describe),
            (op::IDEMPOTENT_WRITE, AclOperation::Describe),
        ] {
            let a = loaded(
                "",
                false,
                &[acl(
                    ResourceType::Topic,
                    "t",
                    pt::LITERAL,
                    ALICE,
                    "*",
                    granted,
                    perm::ALLOW,
                )],
            );
            assert!(
                !allowed(&a, ALICE, H1, not_implied, ResourceType::Topic, "t"),
                "{granted} does not imply {not_implied:?}"
            );
        }
        // ALL allows every operation, and DENY ALL denies every one.
        let every = [
            AclOperation::Read,
            AclOperation::Write,
            AclOperation::Create,
            AclOperation::Delete,
            AclOperation::Alter,
            AclOperation::Describe,
            AclOperation::ClusterAction,
            AclOperation::DescribeConfigs,
            AclOperation::AlterConfigs,
            AclOperation::IdempotentWrite,
            AclOperation::CreateTokens,
            AclOperation::DescribeTokens,
        ];
        let a = loaded(
            "",
            false,
            &[acl(
                ResourceType::Cluster,
                "kafka-cluster",
                pt::LITERAL,
                ALICE,
                "*",
                op::ALL,
                perm::ALLOW,
            )],
        );
        for o in every {
            assert!(
                allowed(&a, ALICE, H1, o, ResourceType::Cluster, "kafka-cluster"),
                "{o:?}"
            );
        }
        let a = loaded(
            "",
            false,
            &[
                acl(
                    ResourceType::Cluster,
                    "kafka-cluster",
                    pt::LITERAL,
                    ALICE,
                    "*",
                    op::ALL,
                    perm::ALLOW,
                ),
                acl(
                    ResourceType::Cluster,
                    "kafka-cluster",
                    pt::LITERAL,
                    ALICE,
                    "*",
                    op::ALL,
                    perm::DENY,
                ),
            ],
        );
        for o in every {
            assert!(
                !allowed(&a, ALICE, H1, o, ResourceType::Cluster, "kafka-cluster"),
                "{o:?}"
            );
        }
    }

    #[test]
    fn prefixed_patterns_and_wildcards() {
        let a = loaded(
            "",
            false,
            &[
                acl(
                    ResourceType::Topic,
                    "fo",
                    pt::PREFIXED,
                    ALICE,
                    "*",
                    op::READ,
                    perm::ALLOW,
                ),
                acl(
                    ResourceType::Topic,
                    "foobar",
                    pt::PREFIXED,
                    ALICE,
                    "*",
                    op::READ,
                    perm::DENY,
                ),
                acl(
                    ResourceType::Topic,
                    "*",
                    pt::LITERAL,
                    BOB,
                    "*",
                    op::WRITE,
                    perm::ALLOW,
                ),
                acl(
                    ResourceType::TransactionalId,
                    "tx-",
                    pt::PREFIXED,
                    "User:*",
                    "*",
                    op::WRITE,
                    perm::ALLOW,
                ),
                // A PREFIXED "*" is a prefix, not a wildcard.
                acl(
                    ResourceType::Group,
                    "*",
                    pt::PREFIXED,
                    ALICE,
                    "*",
                    op::READ,
                    perm::ALLOW,
                ),
            ],
        );
        assert!(allowed(
            &a,
            ALICE,
            H1,
            AclOperation::Read,
            ResourceType::Topic,
            "fo"
        ));
        assert!(allowed(
            &a,
            ALICE,
            H1,
            AclOperation::Read,
            ResourceType::Topic,
            "foo"
        ));
        assert!(allowed(
            &a,
            ALICE,
            H1,
            AclOperation::Read,
            ResourceType::Topic,
            "foobaz"
        ));
        assert!(!allowed(
            &a,
            ALICE,
            H1,
            AclOperation::Read,
            ResourceType::Topic,
            "foobar"
        ));
        assert!(!allowed(
            &a,
            ALICE,
            H1,
            AclOperation::Read,
            ResourceType::Topic,
            "foobar2"
        ));
        assert!(!allowed(
            &a,
            ALICE,
            H1,
            AclOperation::Read,
            ResourceType::Topic,
            "f"
        ));
        assert!(allowed(
            &a,
            BOB,
            H1,
            AclOperation::Write,
            ResourceType::Topic,
            "anything"
        ));
        assert!(allowed(
            &a,
            BOB,
            H1,
            AclOperation::Write,
            ResourceType::Topic,
            "*"
        ));
        assert!(allowed(
            &a,
            BOB,
            H2,
            AclOperation::Write,
            ResourceType::TransactionalId,
            "tx-1"
        ));
        assert!(!allowed(
            &a,
            BOB,
            H2,
            AclOperation::Write,
            ResourceType::TransactionalId,
            "tx"
        ));
        assert!(!allowed(
            &a,
            ALICE,
            H1,
            AclOperation::Read,
            ResourceType::Group,
            "g"
        ));
        assert!(allowed(
            &a,
            ALICE,
            H1,
            AclOperation::Read,
            ResourceType::Group,
            "*g"
        ));
        // Multi-byte names: prefixes are compared on bytes at character boundaries.
        let a = loaded(
            "",
            false,
            &[acl(
                ResourceType::Topic,
                "é",
                pt::PREFIXED,
                ALICE,
                "*",
                op::READ,
                perm::ALLOW,
            )],
        );
        assert!(allowed(
            &a,
            ALICE,
            H1,
            AclOperation::Read,
            ResourceType::Topic,
            "éa"
        ));
        assert!(!allowed(
            &a,
            ALICE,
            H1,
            AclOperation::Read,
            ResourceType::Topic,
            "e"
        ));
    }

    #[test]
    fn principals_hosts_and_super_users() {
        let a = loaded(
            " User:admin ;; User:ops",
            false,
            &[
                acl(
                    ResourceType::Topic,
                    "t",
                    pt::LITERAL,
                    "User:*",
                    H1,
                    op::READ,
                    perm::ALLOW,
                ),
                acl(
                    ResourceType::Topic,
                    "t",
                    pt::LITERAL,
                    "User:admin",
                    "*",
                    op::ALL,
                    perm::DENY,
                ),
                acl(
                    ResourceType::Topic,
                    "v6",
                    pt::LITERAL,
                    ALICE,
                    "0:0:0:0:0:0:0:1",
                    op::READ,
                    perm::ALLOW,
                ),
                acl(
                    ResourceType::Topic,
                    "k",
                    pt::LITERAL,
                    "Group:alice",
                    "*",
                    op::READ,
                    perm::ALLOW,
                ),
            ],
        );
        assert!(allowed(
            &a,
            ALICE,
            H1,
            AclOperation::Read,
            ResourceType::Topic,
            "t"
        ));
        assert!(allowed(
            &a,
            "User:ANONYMOUS",
            H1,
            AclOperation::Read,
            ResourceType::Topic,
            "t"
        ));
        assert!(!allowed(
            &a,
            ALICE,
            H2,
            AclOperation::Read,
            ResourceType::Topic,
            "t"
        ));
        // Super users pass even a DENY, on any resource.
        assert!(allowed(
            &a,
            "User:admin",
            H2,
            AclOperation::Write,
            ResourceType::Topic,
            "t"
        ));
        assert!(allowed(
            &a,
            "User:ops",
            H2,
            AclOperation::ClusterAction,
            ResourceType::Cluster,
            "kafka-cluster"
        ));
        assert!(!allowed(
            &a,
            "User:Admin",
            H2,
            AclOperation::Write,
            ResourceType::Topic,
            "t"
        ));
        // Hosts as Java writes them: IPv6 uncompressed; IPv4-mapped addresses are IPv4.
        assert!(allowed(
            &a,
            ALICE,
            "::1",
            AclOperation::Read,
            ResourceType::Topic,
            "v6"
        ));
        assert_eq!(java_host_address("::ffff:192.168.0.1".parse().unwrap()), H1);
        assert_eq!(
            java_host_address("fe80::a:0:b".parse().unwrap()),
            "fe80:0:0:0:0:a:0:b"
        );
        // The principal type matters.
        assert!(!allowed(
            &a,
            ALICE,
            H1,
            AclOperation::Read,
            ResourceType::Topic,
            "k"
        ));
        assert!(allowed(
            &a,
            "Group:alice",
            H1,
            AclOperation::Read,
            ResourceType::Topic,
            "k"
        ));
    }

    #[test]
    fn not_ready_until_the_first_image_then_follows_the_records() {
        let a = StandardAuthorizer::new("User:admin", true);
        assert!(!a.is_ready());
        assert!(
            !allowed(&a, ALICE, H1, AclOperation::Read, ResourceType::Topic, "t"),
            "denied before load"
        );
        assert!(
            allowed(
                &a,
                "User:admin",
                H1,
                AclOperation::Read,
                ResourceType::Topic,
                "t"
            ),
            "super users before load"
        );
        let a = loaded("", false, &[]);
        assert!(a.is_ready());
        let id = Uuid::from_u128(77);
        let b = acl(
            ResourceType::Topic,
            "t",
            pt::LITERAL,
            ALICE,
            "*",
            op::READ,
            perm::ALLOW,
        );
        let previous = MetadataImage::default();
        let add: Vec<MetadataRecord> = vec![b.to_record(id).into()];
        let update = |records: &[MetadataRecord]| {
            a.on_metadata_update(
                &MetadataDelta {
                    previous: &previous,
                    records,
                    snapshot: false,
                    epoch: 1,
                },
                &Arc::new(MetadataImage::default()),
            )
            .expect("update");
        };
        update(&add);
        assert!(allowed(
            &a,
            ALICE,
            H1,
            AclOperation::Read,
            ResourceType::Topic,
            "t"
        ));
        assert_eq!(a.acl_count(), 1);
        let remove: Vec<MetadataRecord> = vec![RemoveAccessControlEntryRecord {
            id,
            ..Default::default()
        }
        .into()];
        update(&remove);
        assert!(!allowed(
            &a,
            ALICE,
            H1,
            AclOperation::Read,
            ResourceType::Topic,
            "t"
        ));
        assert_eq!(a.acl_count(), 0);
        // Removing an unknown id is harmless; a snapshot replaces everything.
        update(&remove);
        let mut image = MetadataImage::default();
        image.acls.insert(id, b.to_record(id));
        a.on_metadata_update(
            &MetadataDelta {
                previous: &previous,
                records: &[],
                snapshot: true,
                epoch: 2,
            },
            &Arc::new(image),
        )
        .expect("snapshot");
        assert!(allowed(
            &a,
            ALICE,
            H1,
            AclOperation::Read,
            ResourceType::Topic,
            "t"
        ));
    }

    #[test]
    fn authorize_by_resource_type_as_kip_679() {
        let by_type = |a: &StandardAuthorizer, who: &str| {
            a.authorize_by_resource_type(&ctx(who, H1), AclOperation::Write, ResourceType::Topic)
                == AuthorizationResult::Allowed
        };
        let a = loaded("User:admin", false, &[]);
        assert!(!by_type(&a, ALICE));
        assert!(by_type(&a, "User:admin"));
        let a = loaded(
            "",
            false,
            &[acl(
                ResourceType::Topic,
                "t",
                pt::LITERAL,
                ALICE,
                "*",
                op::WRITE,
                perm::ALLOW,
            )],
        );
        assert!(by_type(&a, ALICE));
        assert!(!by_type(&a, BOB));
        // A literal allow denied by the same literal, or by a prefix of it: not allowed.
        let a = loaded(
            "",
            false,
            &[
                acl(
                    ResourceType::Topic,
                    "abc",
                    pt::LITERAL,
                    ALICE,
                    "*",
                    op::WRITE,
                    perm::ALLOW,
                ),
                acl(
                    ResourceType::Topic,
                    "ab",
                    pt::PREFIXED,
                    ALICE,
                    "*",
                    op::WRITE,
                    perm::DENY,
                ),
            ],
        );
        assert!(!by_type(&a, ALICE));
        // A wildcard DENY denies; a wildcard ALLOW allows.
        let a = loaded(
            "",
            false,
            &[
                acl(
                    ResourceType::Topic,
                    "x",
                    pt::PREFIXED,
                    ALICE,
                    "*",
                    op::ALL,
                    perm::ALLOW,
                ),
                acl(
                    ResourceType::Topic,
                    "*",
                    pt::LITERAL,
                    ALICE,
                    "*",
                    op::WRITE,
                    perm::DENY,
                ),
            ],
        );
        assert!(!by_type(&a, ALICE));
        let a = loaded(
            "",
            false,
            &[acl(
                ResourceType::Topic,
                "*",
                pt::LITERAL,
                "User:*",
                "*",
                op::WRITE,
                perm::ALLOW,
            )],
        );
        assert!(by_type(&a, BOB));
        // allow.everyone.if.no.acl.found: the probe resource has no ACL.
        let a = loaded("", true, &[]);
        assert!(by_type(&a, BOB));
    }

    #[test]
    fn describe_filters_the_held_acls() {
        let a = loaded(
            "",
            false,
            &[
                acl(
                    ResourceType::Topic,
                    "t",
                    pt::LITERAL,
                    ALICE,
                    "*",
                    op::READ,
                    perm::ALLOW,
                ),
                acl(
                    ResourceType::Topic,
                    "t",
                    pt::PREFIXED,
                    BOB,
                    "*",
                    op::READ,
                    perm::ALLOW,
                ),
                acl(
                    ResourceType::Group,
                    "g",
                    pt::LITERAL,
                    ALICE,
                    "*",
                    op::READ,
                    perm::ALLOW,
                ),
            ],
        );
        assert_eq!(a.acls(&AclBindingFilter::any()).unwrap().len(), 3);
        let f = AclBindingFilter {
            resource_type: ResourceType::Topic.code(),
            resource_name: Some("t".into()),
            pattern_type: pt::LITERAL,
            ..AclBindingFilter::any()
        };
        assert_eq!(a.acls(&f).unwrap().len(), 1);
        assert!(crate::authorizer::AllowEverythingAuthorizer
            .acls(&f)
            .is_none());
    }
}
