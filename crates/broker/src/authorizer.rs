//! Authorization: Kafka's `Authorizer` interface (KIP-504, `org.apache.kafka.server.authorizer`)
//! in its shape: `authorize(context, actions) -> results`, one result per action, where an
//! action is an operation on a resource pattern (type, name, pattern type).
//!
//! Today the broker runs [`AllowEverythingAuthorizer`] (what Kafka does with no
//! `authorizer.class.name`); start-up refuses `authorizer.class.name` until an ACL authorizer
//! exists, so nobody believes ACLs are enforced. Handlers call it where Kafka's `KafkaApis`
//! does:
//!
//! | API | action | error when denied |
//! |---|---|---|
//! | Produce | `Write` on each Topic; `Write` on the TransactionalId when set | TOPIC_AUTHORIZATION_FAILED / TRANSACTIONAL_ID_AUTHORIZATION_FAILED |
//! | Fetch (consumer) | `Read` on each Topic | TOPIC_AUTHORIZATION_FAILED |
//! | Fetch (follower, `replica_id >= 0`) | `ClusterAction` on the Cluster | CLUSTER_AUTHORIZATION_FAILED |
//! | Metadata, ListOffsets | `Describe` on each Topic (auto-creation also needs `Create` on the Cluster or Topic) | TOPIC_AUTHORIZATION_FAILED |
//! | CreateTopics | `Create` on the Cluster, else on each Topic | TOPIC_AUTHORIZATION_FAILED |
//! | DeleteTopics, DeleteRecords | `Delete` on each Topic | TOPIC_AUTHORIZATION_FAILED |
//! | CreatePartitions | `Alter` on each Topic | TOPIC_AUTHORIZATION_FAILED |
//! | DescribeConfigs / (Incremental)AlterConfigs | `DescribeConfigs` / `AlterConfigs` on the Topic or the Cluster (broker resources) | TOPIC_ / CLUSTER_AUTHORIZATION_FAILED |
//! | DescribeCluster | `Describe` on the Cluster | CLUSTER_AUTHORIZATION_FAILED |
//! | InitProducerId | `Write` on the TransactionalId, or `IdempotentWrite` on the Cluster without one | TRANSACTIONAL_ID_ / CLUSTER_AUTHORIZATION_FAILED |
//! | FindCoordinator, DescribeGroups, ConsumerGroupDescribe | `Describe` on the Group | GROUP_AUTHORIZATION_FAILED |
//! | JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, ConsumerGroupHeartbeat | `Read` on the Group | GROUP_AUTHORIZATION_FAILED |
//! | OffsetFetch | `Describe` on the Group | GROUP_AUTHORIZATION_FAILED |
//! | DeleteGroups, OffsetDelete | `Delete` on the Group | GROUP_AUTHORIZATION_FAILED |
//! | ListGroups | `Describe` on the Cluster, else only the groups with `Describe` | (filtered) |

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
        }
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
}

/// Allows everything: Kafka's behaviour without `authorizer.class.name`.
#[derive(Debug, Default, Clone, Copy)]
pub struct AllowEverythingAuthorizer;

impl Authorizer for AllowEverythingAuthorizer {
    fn authorize(&self, _ctx: &RequestContext, actions: &[Action]) -> Vec<AuthorizationResult> {
        vec![AuthorizationResult::Allowed; actions.len()]
    }
}
