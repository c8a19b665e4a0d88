//! Authorization: Kafka's `Authorizer` interface (KIP-504, `org.apache.kafka.server.authorizer`)
//! in its shape: `authorize(context, actions) -> results`, one result per action, where an
//! action is an operation on a resource pattern (type, name, pattern type).
//!
//! Without `authorizer.class.name` the broker runs [`AllowEverythingAuthorizer`] (what Kafka
//! does then); with Kafka's `StandardAuthorizer` class name it runs
//! [`crate::standard_authorizer::StandardAuthorizer`] (ACLs from the metadata log); start-up
//! refuses any other class. Handlers call it where Kafka's `KafkaApis` does (the ACL matrix
//! in `crates/cli/tests/acls.rs` checks these against Kafka 4.4.0):
//!
//! | API | action | error when denied |
//! |---|---|---|
//! | Produce | `Write` on each Topic; `Write` on the TransactionalId when set | TOPIC_AUTHORIZATION_FAILED / TRANSACTIONAL_ID_AUTHORIZATION_FAILED |
//! | Fetch (consumer) | `Read` on each Topic | TOPIC_AUTHORIZATION_FAILED |
//! | Fetch (follower, `replica_id >= 0`) | `ClusterAction` on the Cluster | CLUSTER_AUTHORIZATION_FAILED |
//! | Metadata, ListOffsets | `Describe` on each Topic (auto-creation also needs `Create` on the Cluster or Topic) | TOPIC_AUTHORIZATION_FAILED |
//! | CreateTopics | `Create` on the Cluster, else on each Topic | TOPIC_AUTHORIZATION_FAILED |
//! | DeleteTopics | `Delete` on the Cluster, else `Describe` (else the name's existence is not told) and `Delete` on each Topic | TOPIC_AUTHORIZATION_FAILED |
//! | DeleteRecords | `Delete` on each Topic | TOPIC_AUTHORIZATION_FAILED |
//! | CreatePartitions | `Alter` on each Topic | TOPIC_AUTHORIZATION_FAILED |
//! | DescribeConfigs / (Incremental)AlterConfigs | `DescribeConfigs` / `AlterConfigs` on the Topic or the Cluster (broker resources) | TOPIC_ / CLUSTER_AUTHORIZATION_FAILED |
//! | DescribeCluster | nothing (KIP-430: the cluster's operations are 0 without `Describe` on it) | |
//! | InitProducerId | `Write` on the TransactionalId, or without one `IdempotentWrite` on the Cluster or `Write` on some Topic (KIP-679, [`Authorizer::authorize_by_resource_type`]) | TRANSACTIONAL_ID_ / CLUSTER_AUTHORIZATION_FAILED |
//! | CreateAcls, DeleteAcls / DescribeAcls | `Alter` / `Describe` on the Cluster | CLUSTER_AUTHORIZATION_FAILED |
//! | DescribeLogDirs, ListPartitionReassignments / ElectLeaders, AlterPartitionReassignments, UpdateFeatures | `Describe` / `Alter` on the Cluster | CLUSTER_AUTHORIZATION_FAILED |
//! | DescribeProducers | `Read` on each Topic | TOPIC_AUTHORIZATION_FAILED |
//! | WriteTxnMarkers | `ClusterAction` (or `Alter`) on the Cluster | CLUSTER_AUTHORIZATION_FAILED |
//! | Vote, BeginQuorumEpoch, EndQuorumEpoch, FetchSnapshot, Fetch of the metadata log, BrokerRegistration, BrokerHeartbeat, AlterPartition, AllocateProducerIds, AssignReplicasToDirs, Envelope (any listener that serves them) | `ClusterAction` on the Cluster | CLUSTER_AUTHORIZATION_FAILED |
//! | UnregisterBroker, DescribeCluster on a controller listener | `Alter` on the Cluster | CLUSTER_AUTHORIZATION_FAILED |
//! | FindCoordinator, DescribeGroups, ConsumerGroupDescribe | `Describe` on the Group | GROUP_AUTHORIZATION_FAILED |
//! | JoinGroup, SyncGroup, Heartbeat, LeaveGroup, ConsumerGroupHeartbeat | `Read` on the Group | GROUP_AUTHORIZATION_FAILED |
//! | OffsetCommit | `Read` on the Group, `Read` on each Topic | GROUP_ / TOPIC_AUTHORIZATION_FAILED |
//! | OffsetFetch | `Describe` on the Group | GROUP_AUTHORIZATION_FAILED |
//! | DeleteGroups, OffsetDelete | `Delete` on the Group | GROUP_AUTHORIZATION_FAILED |
//! | ListGroups | `Describe` on the Cluster, else only the groups with `Describe` | (filtered) |
//! | FindCoordinator (transactional id) | `Describe` on the TransactionalId | TRANSACTIONAL_ID_AUTHORIZATION_FAILED |
//! | AddPartitionsToTxn v0-3 | `Write` on the TransactionalId, `Write` on each (non-internal) Topic | TRANSACTIONAL_ID_ / TOPIC_AUTHORIZATION_FAILED |
//! | AddPartitionsToTxn v4+ (brokers) | `ClusterAction` on the Cluster | CLUSTER_AUTHORIZATION_FAILED |
//! | AddOffsetsToTxn | `Write` on the TransactionalId, `Read` on the Group | TRANSACTIONAL_ID_ / GROUP_AUTHORIZATION_FAILED |
//! | EndTxn | `Write` on the TransactionalId | TRANSACTIONAL_ID_AUTHORIZATION_FAILED |
//! | TxnOffsetCommit | `Write` on the TransactionalId, `Read` on the Group and each Topic | TRANSACTIONAL_ID_ / GROUP_ / TOPIC_AUTHORIZATION_FAILED |
//! | DescribeTransactions | `Describe` on the TransactionalId (topics without `Describe` left out) | TRANSACTIONAL_ID_AUTHORIZATION_FAILED |
//! | ListTransactions | only the transactional ids with `Describe` | (filtered) |

use gregor_network::RequestContext;

/// The name of the one Cluster resource (Kafka's `Resource.CLUSTER_NAME`).
pub const CLUSTER_NAME: &str = "kafka-cluster";

/// Kafka's `ResourceType` (codes as in DescribeAcls).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResourceType {
    /// TOPIC (2).
    Topic,
    /// GROUP (3).
    Group,
    /// CLUSTER (4).
    Cluster,
    /// TRANSACTIONAL_ID (5).
    TransactionalId,
    /// DELEGATION_TOKEN (6).
    DelegationToken,
    /// USER (7).
    User,
}

impl ResourceType {
    /// The wire code.
    pub fn code(self) -> i8 {
        match self {
            Self::Topic => 2,
            Self::Group => 3,
            Self::Cluster => 4,
            Self::TransactionalId => 5,
            Self::DelegationToken => 6,
            Self::User => 7,
        }
    }
}

/// Kafka's `PatternType` for a resource pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PatternType {
    /// LITERAL (3): the exact name (`*` is the wildcard).
    Literal,
    /// PREFIXED (4): every name starting with the pattern's name.
    Prefixed,
}

/// Kafka's `AclOperation` (codes as in DescribeAcls).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AclOperation {
    /// ALL (2).
    All,
    /// READ (3).
    Read,
    /// WRITE (4).
    Write,
    /// CREATE (5).
    Create,
    /// DELETE (6).
    Delete,
    /// ALTER (7).
    Alter,
    /// DESCRIBE (8).
    Describe,
    /// CLUSTER_ACTION (9).
    ClusterAction,
    /// DESCRIBE_CONFIGS (10).
    DescribeConfigs,
    /// ALTER_CONFIGS (11).
    AlterConfigs,
    /// IDEMPOTENT_WRITE (12).
    IdempotentWrite,
    /// CREATE_TOKENS (13).
    CreateTokens,
    /// DESCRIBE_TOKENS (14).
    DescribeTokens,
}

impl AclOperation {
    /// The wire code.
    pub fn code(self) -> i8 {
        match self {
            Self::All => 2,
            Self::Read => 3,
            Self::Write => 4,
            Self::Create => 5,
            Self::Delete => 6,
            Self::Alter => 7,
            Self::Describe => 8,
            Self::ClusterAction => 9,
            Self::DescribeConfigs => 10,
            Self::AlterConfigs => 11,
            Self::IdempotentWrite => 12,
            Self::CreateTokens => 13,
            Self::DescribeTokens => 14,
        }
    }

    /// The operation of a wire code; None for UNKNOWN, ANY and codes Kafka does not define.
    pub fn from_code(code: i8) -> Option<Self> {
        Some(match code {
            2 => Self::All,
            3 => Self::Read,
            4 => Self::Write,
            5 => Self::Create,
            6 => Self::Delete,
            7 => Self::Alter,
            8 => Self::Describe,
            9 => Self::ClusterAction,
            10 => Self::DescribeConfigs,
            11 => Self::AlterConfigs,
            12 => Self::IdempotentWrite,
            13 => Self::CreateTokens,
            14 => Self::DescribeTokens,
            _ => return None,
        })
    }
}

/// Kafka's `ResourcePattern`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ResourcePattern {
    /// The resource's type.
    pub resource_type: ResourceType,
    /// Its name (or prefix).
    pub name: String,
    /// How `name` matches.
    pub pattern_type: PatternType,
}

impl ResourcePattern {
    /// The resource named exactly `name`.
    pub fn literal(resource_type: ResourceType, name: &str) -> Self {
        Self {
            resource_type,
            name: name.to_string(),
            pattern_type: PatternType::Literal,
        }
    }

    /// The Cluster resource.
    pub fn cluster() -> Self {
        Self::literal(ResourceType::Cluster, CLUSTER_NAME)
    }
}

/// Kafka's `Action`: an operation on a resource, with audit hints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Action {
    /// What is done.
    pub operation: AclOperation,
    /// To what.
    pub resource_pattern: ResourcePattern,
    /// How many times the request refers to the resource (for audit logs).
    pub resource_reference_count: i32,
    /// Log when allowed (an explicit request, as opposed to a filter).
    pub log_if_allowed: bool,
    /// Log when denied.
    pub log_if_denied: bool,
}

impl Action {
    /// One reference, logged either way.
    pub fn new(operation: AclOperation, resource_pattern: ResourcePattern) -> Self {
        Self {
            operation,
            resource_pattern,
            resource_reference_count: 1,
            log_if_allowed: true,
            log_if_denied: true,
        }
    }
}

/// Kafka's `AuthorizationResult`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthorizationResult {
    /// The action may proceed.
    Allowed,
    /// The action is refused.
    Denied,
}

/// Decides whether a request's principal may perform actions (Kafka's `Authorizer.authorize`).
pub trait Authorizer: Send + Sync {
    /// One result per action, in the same order.
    fn authorize(&self, ctx: &RequestContext, actions: &[Action]) -> Vec<AuthorizationResult>;

    /// Kafka's `Authorizer.authorizeByResourceType` (KIP-679): whether the principal may do
    /// `op` on at least one resource of `resource_type`. This default asks about one made-up
    /// name, as Kafka's default does first; ACL authorizers look at their ACLs.
    fn authorize_by_resource_type(
        &self,
        ctx: &RequestContext,
        op: AclOperation,
        resource_type: ResourceType,
    ) -> AuthorizationResult {
        let probe = Action {
            resource_reference_count: 0,
            log_if_denied: false,
            ..Action::new(op, ResourcePattern::literal(resource_type, "hardcode"))
        };
        self.authorize(ctx, std::slice::from_ref(&probe))
            .first()
            .copied()
            .unwrap_or(AuthorizationResult::Denied)
    }

    /// Whether this authorizer keeps ACLs (CreateAcls, DeleteAcls and DescribeAcls answer
    /// SECURITY_DISABLED otherwise).
    fn keeps_acls(&self) -> bool {
        false
    }

    /// The ACLs matching `filter` (DescribeAcls, Kafka's `Authorizer.acls`); None when this
    /// authorizer keeps no ACLs (DescribeAcls/CreateAcls/DeleteAcls answer SECURITY_DISABLED,
    /// as Kafka without `authorizer.class.name`).
    fn acls(
        &self,
        _filter: &gregor_metadata::acl::AclBindingFilter,
    ) -> Option<Vec<gregor_metadata::acl::AclBinding>> {
        None
    }

    /// The publisher that keeps this authorizer's ACLs up to date with the metadata log,
    /// installed on the loader at start-up; None when it keeps none.
    fn metadata_publisher(
        self: std::sync::Arc<Self>,
    ) -> Option<std::sync::Arc<dyn gregor_metadata::MetadataPublisher>> {
        None
    }
}

/// Allows everything: Kafka's behaviour without `authorizer.class.name`.
#[derive(Debug, Default, Clone, Copy)]
pub struct AllowEverythingAuthorizer;

impl Authorizer for AllowEverythingAuthorizer {
    fn authorize(&self, _ctx: &RequestContext, actions: &[Action]) -> Vec<AuthorizationResult> {
        vec![AuthorizationResult::Allowed; actions.len()]
    }
}

#[cfg(test)]
mod tests {
    //! Handlers consult the authorizer: a broker in this process with an authorizer that
    //! denies chosen resources, driven through `handlers::handle` with a `RequestContext`.

    use std::collections::BTreeMap;
    use std::net::SocketAddr;
    use std::sync::Arc;
    use std::time::Instant;

    use gregor_network::{KafkaPrincipal, SecurityProtocol};
    use gregor_protocol::kafka_protocol::messages::create_topics_request::CreatableTopic;
    use gregor_protocol::kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    use gregor_protocol::kafka_protocol::messages::TopicName;
    use gregor_protocol::kafka_protocol::messages::{
        ApiKey, CreateTopicsRequest, DescribeGroupsRequest, GroupId, HeartbeatRequest,
        MetadataRequest, RequestHeader, RequestKind, ResponseKind,
    };
    use gregor_protocol::kafka_protocol::protocol::{Decodable, StrBytes};

    use super::*;
    use crate::config::BrokerConfig;
    use crate::error_codes as ec;
    use crate::handlers::{self, Handled};

    /// Denies every action on resources whose name starts with `secret`, and `Create` on the
    /// Cluster (which would allow creating any topic).
    struct DenySecret;

    impl Authorizer for DenySecret {
        fn authorize(&self, ctx: &RequestContext, actions: &[Action]) -> Vec<AuthorizationResult> {
            assert_eq!(ctx.principal, KafkaPrincipal::anonymous());
            actions
                .iter()
                .map(|a| {
                    let cluster_create = a.resource_pattern.resource_type == ResourceType::Cluster
                        && a.operation == AclOperation::Create;
                    if cluster_create || a.resource_pattern.name.starts_with("secret") {
                        AuthorizationResult::Denied
                    } else {
                        AuthorizationResult::Allowed
                    }
                })
                .collect()
        }
    }

    fn ctx(api_key: ApiKey, version: i16) -> RequestContext {
        RequestContext {
            header: RequestHeader::default()
                .with_request_api_key(api_key as i16)
                .with_request_api_version(version)
                .with_correlation_id(7),
            api_key,
            principal: KafkaPrincipal::anonymous(),
            listener_name: "PLAINTEXT".into(),
            security_protocol: SecurityProtocol::Plaintext,
            client_address: SocketAddr::from(([127, 0, 0, 1], 40000)),
            client_software_name: "unknown".into(),
            client_software_version: "unknown".into(),
            received_at: Instant::now(),
            sends_files: false,
            size_in_bytes: 0,
            throttle: Default::default(),
        }
    }

    fn decode(api_key: ApiKey, version: i16, handled: Handled) -> ResponseKind {
        let Handled::Ready(Some(mut bytes)) = handled else {
            panic!("expected a ready response");
        };
        let _size = bytes.split_to(4);
        let header_version = api_key.response_header_version(version);
        gregor_protocol::kafka_protocol::messages::ResponseHeader::decode(
            &mut bytes,
            header_version,
        )
        .expect("header");
        ResponseKind::decode(api_key, &mut bytes, version).expect("body")
    }

    #[tokio::test]
    async fn handlers_answer_authorization_failures() {
        let dir = tempfile::tempdir().expect("tempdir");
        let props: BTreeMap<String, String> = [
            ("log.dirs", dir.path().display().to_string()),
            ("listeners", "PLAINTEXT://127.0.0.1:0".into()),
            ("admin.listener", String::new()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let (config, _) = BrokerConfig::from_properties(props).expect("config");
        let running = crate::server::start_with_authorizer(config, Arc::new(DenySecret))
            .await
            .expect("start");
        let broker = running.broker.clone();

        // CreateTopics: denied for secret-*, allowed otherwise.
        let req = CreateTopicsRequest::default().with_topics(vec![
            CreatableTopic::default()
                .with_name(TopicName(StrBytes::from_static_str("secret-a")))
                .with_num_partitions(1)
                .with_replication_factor(1),
            CreatableTopic::default()
                .with_name(TopicName(StrBytes::from_static_str("open-a")))
                .with_num_partitions(1)
                .with_replication_factor(1),
        ]);
        let c = ctx(ApiKey::CreateTopics, 7);
        let h = handlers::handle(&broker, &c, RequestKind::CreateTopics(req)).await;
        let ResponseKind::CreateTopics(r) = decode(ApiKey::CreateTopics, 7, h) else {
            panic!("CreateTopics response expected");
        };
        let codes: Vec<(String, i16)> = r
            .topics
            .iter()
            .map(|t| (t.name.to_string(), t.error_code))
            .collect();
        assert_eq!(
            codes,
            vec![
                ("secret-a".to_string(), ec::TOPIC_AUTHORIZATION_FAILED),
                ("open-a".to_string(), ec::NONE)
            ]
        );

        // Metadata: a named secret topic is refused (and not auto-created); all-topics omits it.
        let req = MetadataRequest::default()
            .with_topics(Some(vec![MetadataRequestTopic::default()
                .with_name(Some(TopicName(StrBytes::from_static_str("secret-b"))))]));
        let c = ctx(ApiKey::Metadata, 12);
        let h = handlers::handle(&broker, &c, RequestKind::Metadata(req)).await;
        let ResponseKind::Metadata(r) = decode(ApiKey::Metadata, 12, h) else {
            panic!("Metadata response expected");
        };
        assert_eq!(r.topics[0].error_code, ec::TOPIC_AUTHORIZATION_FAILED);
        assert!(broker.controller.image().topic("secret-b").is_none());

        // Groups: entry checks.
        let req = HeartbeatRequest::default()
            .with_group_id(GroupId(StrBytes::from_static_str("secret-g")));
        let c = ctx(ApiKey::Heartbeat, 4);
        let h = handlers::handle(&broker, &c, RequestKind::Heartbeat(req)).await;
        let ResponseKind::Heartbeat(r) = decode(ApiKey::Heartbeat, 4, h) else {
            panic!("Heartbeat response expected");
        };
        assert_eq!(r.error_code, ec::GROUP_AUTHORIZATION_FAILED);
        let req = DescribeGroupsRequest::default().with_groups(vec![
            GroupId(StrBytes::from_static_str("secret-g")),
            GroupId(StrBytes::from_static_str("open-g")),
        ]);
        let c = ctx(ApiKey::DescribeGroups, 5);
        let h = handlers::handle(&broker, &c, RequestKind::DescribeGroups(req)).await;
        let ResponseKind::DescribeGroups(r) = decode(ApiKey::DescribeGroups, 5, h) else {
            panic!("DescribeGroups response expected");
        };
        assert_eq!(r.groups[0].error_code, ec::GROUP_AUTHORIZATION_FAILED);
        // Allowed: whatever the coordinator says (NOT_COORDINATOR before `__consumer_offsets`).
        assert_ne!(r.groups[1].error_code, ec::GROUP_AUTHORIZATION_FAILED);

        running.shutdown().await.expect("shutdown");
    }
}
