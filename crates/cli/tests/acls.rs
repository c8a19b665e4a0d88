//! ACLs (issue 13): `authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer`
//! on gregor and on Apache Kafka 4.4.0, configured the same way, driven the same way.
//!
//! - The ACL matrix: for every API and every resource and operation it checks, the request is
//!   sent once with the operation allowed and once with a DENY ACL for it (added and removed
//!   with CreateAcls/DeleteAcls); the error codes of both runs are compared with Kafka's
//!   (same list), and on gregor no denied run may succeed. The matrix is parameterised by the
//!   principal the ACLs name ([`Matrix::principal`]); until SASL lands every connection is
//!   `User:ANONYMOUS`, so that is the principal here. Both brokers run with
//!   `allow.everyone.if.no.acl.found=true` and the principal holds ALLOW ALL on the Cluster
//!   (a single KRaft node's own broker-to-controller requests are `User:ANONYMOUS` too, so
//!   the Cluster's ClusterAction is never denied).
//! - Kafka's own `kafka-acls` adds, lists and removes ACLs on gregor, and librdkafka's
//!   producer and consumer are refused and admitted by them (DENY, ALLOW, PREFIXED, wildcard,
//!   host rules, super.users).
//!
//! `cargo test -p gregor --test acls -- --nocapture`

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use bytes::Bytes;
use gregor_protocol::batch::BatchBuilder;
use gregor_tests::process::{free_port, ChildGuard};
use gregor_tests::reference::{self, Instance};
use gregor_tests::wire::{sb, KafkaConn};
use gregor_tests::Gregor;
use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::delete_acls_request::DeleteAclsFilter;
use kafka_protocol::messages::delete_records_request::{
    DeleteRecordsPartition, DeleteRecordsTopic,
};
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::describe_producers_request::TopicRequest;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::incremental_alter_configs_request::{
    AlterConfigsResource, AlterableConfig,
};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestGroup;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, CreateAclsRequest, CreatePartitionsRequest, CreateTopicsRequest, DeleteAclsRequest,
    DeleteGroupsRequest, DeleteRecordsRequest, DeleteTopicsRequest, DescribeAclsRequest,
    DescribeClusterRequest, DescribeConfigsRequest, DescribeGroupsRequest, DescribeLogDirsRequest,
    DescribeProducersRequest, FetchRequest, FindCoordinatorRequest, GroupId, HeartbeatRequest,
    IncrementalAlterConfigsRequest, InitProducerIdRequest, ListGroupsRequest, ListOffsetsRequest,
    ListPartitionReassignmentsRequest, MetadataRequest, OffsetFetchRequest, ProduceRequest,
    RequestKind, ResponseKind, TopicName, TransactionalId,
};

const BIN: &str = env!("CARGO_BIN_EXE_gregor");
const STANDARD_AUTHORIZER: &str = "org.apache.kafka.metadata.authorizer.StandardAuthorizer";

// Kafka's codes.
const TOPIC: i8 = 2;
const GROUP: i8 = 3;
const CLUSTER: i8 = 4;
const TRANSACTIONAL_ID: i8 = 5;
const LITERAL: i8 = 3;
const PREFIXED: i8 = 4;
const ALL: i8 = 2;
const READ: i8 = 3;
const WRITE: i8 = 4;
const CREATE: i8 = 5;
const DELETE: i8 = 6;
const ALTER: i8 = 7;
const DESCRIBE: i8 = 8;
const DESCRIBE_CONFIGS: i8 = 10;
const ALTER_CONFIGS: i8 = 11;
const IDEMPOTENT_WRITE: i8 = 12;
const DENY: i8 = 2;
const ALLOW: i8 = 3;

/// The topic every case reads or writes (created before the matrix).
const T: &str = "acl-t";

/// The broker properties both implementations run with.
fn properties() -> Vec<String> {
    vec![
        format!("authorizer.class.name={STANDARD_AUTHORIZER}"),
        "allow.everyone.if.no.acl.found=true".into(),
        "super.users=User:admin".into(),
    ]
}

/// One ACL: (resource type, name, pattern type, operation, permission).
type Acl = (i8, &'static str, i8, i8, i8);

/// One row of the matrix: a request, what it checks, and where its answer's error code is.
struct Case {
    /// What the row is, for the report.
    name: &'static str,
    /// The DENY ACLs that take the needed permission away (for the matrix's principal).
    deny: &'static [(i8, &'static str, i8)],
    /// The request.
    request: fn() -> (ApiKey, i16, RequestKind),
    /// The error code that answers for the checked resource.
    code: fn(&ResponseKind) -> i16,
    /// Kafka's error when denied.
    denied_code: i16,
}

/// The matrix, parameterised by the principal its ACLs name.
struct Matrix {
    principal: String,
    /// `(user, password)` to log in with SASL/PLAIN (the broker address is then its
    /// SASL_PLAINTEXT listener), or None for a PLAINTEXT connection (`User:ANONYMOUS`).
    sasl: Option<(&'static str, &'static str)>,
}

impl Matrix {
    /// The matrix as `User:ANONYMOUS` on a PLAINTEXT listener.
    fn anonymous() -> Self {
        Self {
            principal: "User:ANONYMOUS".into(),
            sasl: None,
        }
    }

    /// The matrix as `User:alice`, authenticated with SASL/PLAIN.
    fn alice() -> Self {
        Self {
            principal: "User:alice".into(),
            sasl: Some(("alice", "alice-secret")),
        }
    }

    fn connect(&self, addr: &str) -> Result<KafkaConn> {
        match self.sasl {
            Some((user, password)) => plain_login(addr, user, password),
            None => KafkaConn::connect(addr, "acl-matrix"),
        }
    }
}

/// A connection to the SASL_PLAINTEXT listener at `addr`, logged in as `user` with SASL/PLAIN
/// (SaslHandshake v1, SaslAuthenticate v2).
fn plain_login(addr: &str, user: &str, password: &str) -> Result<KafkaConn> {
    use kafka_protocol::messages::{
        SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
        SaslHandshakeResponse,
    };
    let mut c = KafkaConn::connect(addr, "acl-sasl")?;
    let h: SaslHandshakeResponse = c.call(
        ApiKey::SaslHandshake,
        1,
        &SaslHandshakeRequest::default().with_mechanism(sb("PLAIN")),
    )?;
    ensure!(h.error_code == 0, "SaslHandshake PLAIN on {addr}: {h:?}");
    let token = format!("\0{user}\0{password}");
    let a: SaslAuthenticateResponse = c.call(
        ApiKey::SaslAuthenticate,
        2,
        &SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(token.into_bytes())),
    )?;
    ensure!(
        a.error_code == 0,
        "SaslAuthenticate as {user} on {addr}: {} {:?}",
        a.error_code,
        a.error_message
    );
    Ok(c)
}

/// The PLAIN users of the SASL listener (Kafka's `PlainLoginModule` options, which gregor
/// reads the same way).
const PLAIN_JAAS: &str = r#"org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="alice-secret" user_bob="bob-secret" user_admin="admin-secret";"#;

/// The broker properties of the SASL runs, besides the listeners: [`properties`] with the
/// nodes' own principal (`User:ANONYMOUS`, on the PLAINTEXT and controller listeners) among
/// the super users, as a deployment must (brokers register and heartbeat with ClusterAction,
/// which an ACL for alice on the Cluster would otherwise take from them), and SASL/PLAIN on
/// the SASL_PLAINTEXT listener.
fn sasl_properties() -> Vec<String> {
    vec![
        format!("authorizer.class.name={STANDARD_AUTHORIZER}"),
        "allow.everyone.if.no.acl.found=true".into(),
        "super.users=User:admin;User:ANONYMOUS".into(),
        "sasl.enabled.mechanisms=PLAIN".into(),
        format!("listener.name.sasl_plaintext.plain.sasl.jaas.config={PLAIN_JAAS}"),
    ]
}

/// gregor with a SASL_PLAINTEXT listener beside its PLAINTEXT one; returns it and the SASL
/// listener's address.
fn start_gregor_sasl() -> Result<(Gregor, String)> {
    let sasl = free_port()?;
    let mut sets = vec![
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT"
            .to_string(),
    ];
    sets.extend(sasl_properties());
    let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
    let g = Gregor::start_with_listeners(
        BIN,
        &format!("SASL_PLAINTEXT://127.0.0.1:{sasl}"),
        &sets,
        &[],
    )?;
    Ok((g, format!("127.0.0.1:{sasl}")))
}

/// Kafka 4.4.0 configured as [`start_gregor_sasl`]; returns it and the SASL listener's address.
fn start_kafka_sasl() -> Result<(Instance, ChildGuard, String)> {
    let mut last = None;
    for _ in 0..5 {
        let sasl = free_port()?;
        let mut instance = Instance::new(free_port()?, None, None)?;
        let mut extra = vec![
            format!(
                "listeners=PLAINTEXT://127.0.0.1:{},CONTROLLER://127.0.0.1:{},SASL_PLAINTEXT://127.0.0.1:{sasl}",
                instance.port, instance.controller_port
            ),
            format!(
                "advertised.listeners=PLAINTEXT://127.0.0.1:{},SASL_PLAINTEXT://127.0.0.1:{sasl}",
                instance.port
            ),
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT".into(),
        ];
        extra.extend(sasl_properties());
        instance.extra_properties = extra;
        match instance.spawn() {
            Ok(child) => {
                let mut guard = ChildGuard::new("kafka", child);
                instance.wait_ready(|| guard.check_alive())?;
                return Ok((instance, guard, format!("127.0.0.1:{sasl}")));
            }
            Err(e) if format!("{e:#}").contains("is not free") => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("no free port")))
}

fn topic_name(s: &str) -> TopicName {
    TopicName(sb(s))
}

fn produce_request() -> (ApiKey, i16, RequestKind) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let batch = BatchBuilder::new(0, now)
        .record(now, None, Some(b"v"), &[])
        .build();
    let req = ProduceRequest::default()
        .with_acks(1)
        .with_timeout_ms(10_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(topic_name(T))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(0)
                .with_records(Some(Bytes::from(batch)))])]);
    (ApiKey::Produce, 9, req.into())
}

fn offset_commit_request() -> (ApiKey, i16, RequestKind) {
    use kafka_protocol::messages::offset_commit_request::{
        OffsetCommitRequestPartition, OffsetCommitRequestTopic,
    };
    let r = kafka_protocol::messages::OffsetCommitRequest::default()
        .with_group_id(GroupId(sb("acl-g")))
        .with_generation_id_or_member_epoch(-1)
        .with_member_id(sb(""))
        .with_group_instance_id(None)
        .with_topics(vec![OffsetCommitRequestTopic::default()
            .with_name(topic_name(T))
            .with_partitions(vec![OffsetCommitRequestPartition::default()
                .with_partition_index(0)
                .with_committed_offset(0)
                .with_committed_metadata(None)])]);
    (ApiKey::OffsetCommit, 8, r.into())
}

fn offset_commit_code(r: &ResponseKind) -> i16 {
    match r {
        ResponseKind::OffsetCommit(o) => o
            .topics
            .first()
            .and_then(|t| t.partitions.first())
            .map_or(-1, |p| p.error_code),
        _ => -2,
    }
}

fn cases() -> Vec<Case> {
    use ResponseKind as R;
    const TOPIC_AUTH: i16 = 29;
    const GROUP_AUTH: i16 = 30;
    const CLUSTER_AUTH: i16 = 31;
    const TXN_AUTH: i16 = 53;
    vec![
        Case {
            name: "Metadata: Describe Topic",
            deny: &[(TOPIC, T, DESCRIBE)],
            request: || {
                let r = MetadataRequest::default()
                    .with_topics(Some(vec![
                        MetadataRequestTopic::default().with_name(Some(topic_name(T)))
                    ]))
                    .with_allow_auto_topic_creation(false);
                (ApiKey::Metadata, 12, r.into())
            },
            code: |r| match r {
                R::Metadata(m) => m.topics.first().map_or(-1, |t| t.error_code),
                _ => -2,
            },
            denied_code: TOPIC_AUTH,
        },
        Case {
            name: "Produce: Write Topic",
            deny: &[(TOPIC, T, WRITE)],
            request: produce_request,
            code: |r| match r {
                R::Produce(p) => p
                    .responses
                    .first()
                    .and_then(|t| t.partition_responses.first())
                    .map_or(-1, |p| p.error_code),
                _ => -2,
            },
            denied_code: TOPIC_AUTH,
        },
        Case {
            name: "Fetch: Read Topic",
            deny: &[(TOPIC, T, READ)],
            request: || {
                let r = FetchRequest::default()
                    .with_replica_id(kafka_protocol::messages::BrokerId(-1))
                    .with_max_wait_ms(0)
                    .with_max_bytes(1 << 20)
                    .with_topics(vec![FetchTopic::default()
                        .with_topic(topic_name(T))
                        .with_partitions(vec![FetchPartition::default()
                            .with_partition(0)
                            .with_fetch_offset(0)
                            .with_partition_max_bytes(1 << 20)])]);
                (ApiKey::Fetch, 12, r.into())
            },
            code: |r| match r {
                R::Fetch(f) => {
                    if f.error_code != 0 {
                        f.error_code
                    } else {
                        f.responses
                            .first()
                            .and_then(|t| t.partitions.first())
                            .map_or(-1, |p| p.error_code)
                    }
                }
                _ => -2,
            },
            denied_code: TOPIC_AUTH,
        },
        Case {
            name: "ListOffsets: Describe Topic",
            deny: &[(TOPIC, T, DESCRIBE)],
            request: || {
                let r = ListOffsetsRequest::default()
                    .with_replica_id(kafka_protocol::messages::BrokerId(-1))
                    .with_topics(vec![ListOffsetsTopic::default()
                        .with_name(topic_name(T))
                        .with_partitions(vec![ListOffsetsPartition::default()
                            .with_partition_index(0)
                            .with_timestamp(-1)])]);
                (ApiKey::ListOffsets, 7, r.into())
            },
            code: |r| match r {
                R::ListOffsets(l) => l
                    .topics
                    .first()
                    .and_then(|t| t.partitions.first())
                    .map_or(-1, |p| p.error_code),
                _ => -2,
            },
            denied_code: TOPIC_AUTH,
        },
        Case {
            name: "DescribeProducers: Read Topic",
            deny: &[(TOPIC, T, READ)],
            request: || {
                let r =
                    DescribeProducersRequest::default().with_topics(vec![TopicRequest::default()
                        .with_name(topic_name(T))
                        .with_partition_indexes(vec![0])]);
                (ApiKey::DescribeProducers, 0, r.into())
            },
            code: |r| match r {
                R::DescribeProducers(d) => d
                    .topics
                    .first()
                    .and_then(|t| t.partitions.first())
                    .map_or(-1, |p| p.error_code),
                _ => -2,
            },
            denied_code: TOPIC_AUTH,
        },
        Case {
            name: "CreateTopics: Create Cluster, else Create Topic",
            deny: &[
                (CLUSTER, "kafka-cluster", CREATE),
                (TOPIC, "acl-new", CREATE),
            ],
            request: || {
                let r = CreateTopicsRequest::default()
                    .with_topics(vec![CreatableTopic::default()
                        .with_name(topic_name("acl-new"))
                        .with_num_partitions(1)
                        .with_replication_factor(1)])
                    .with_validate_only(true)
                    .with_timeout_ms(10_000);
                (ApiKey::CreateTopics, 7, r.into())
            },
            code: |r| match r {
                R::CreateTopics(c) => c.topics.first().map_or(-1, |t| t.error_code),
                _ => -2,
            },
            denied_code: TOPIC_AUTH,
        },
        Case {
            name: "CreatePartitions: Alter Topic",
            deny: &[(TOPIC, T, ALTER)],
            request: || {
                let r = CreatePartitionsRequest::default()
                    .with_topics(vec![CreatePartitionsTopic::default()
                        .with_name(topic_name(T))
                        .with_count(2)
                        .with_assignments(None)])
                    .with_validate_only(true)
                    .with_timeout_ms(10_000);
                (ApiKey::CreatePartitions, 3, r.into())
            },
            code: |r| match r {
                R::CreatePartitions(c) => c.results.first().map_or(-1, |t| t.error_code),
                _ => -2,
            },
            denied_code: TOPIC_AUTH,
        },
        Case {
            name: "DeleteRecords: Delete Topic",
            deny: &[(TOPIC, T, DELETE)],
            request: || {
                let r = DeleteRecordsRequest::default()
                    .with_topics(vec![DeleteRecordsTopic::default()
                        .with_name(topic_name(T))
                        .with_partitions(vec![DeleteRecordsPartition::default()
                            .with_partition_index(0)
                            .with_offset(0)])])
                    .with_timeout_ms(10_000);
                (ApiKey::DeleteRecords, 2, r.into())
            },
            code: |r| match r {
                R::DeleteRecords(d) => d
                    .topics
                    .first()
                    .and_then(|t| t.partitions.first())
                    .map_or(-1, |p| p.error_code),
                _ => -2,
            },
            denied_code: TOPIC_AUTH,
        },
        Case {
            name: "DescribeConfigs: DescribeConfigs Topic",
            deny: &[(TOPIC, T, DESCRIBE_CONFIGS)],
            request: || {
                let r = DescribeConfigsRequest::default().with_resources(vec![
                    DescribeConfigsResource::default()
                        .with_resource_type(2)
                        .with_resource_name(sb(T))
                        .with_configuration_keys(Some(vec![sb("retention.ms")])),
                ]);
                (ApiKey::DescribeConfigs, 4, r.into())
            },
            code: |r| match r {
                R::DescribeConfigs(d) => d.results.first().map_or(-1, |t| t.error_code),
                _ => -2,
            },
            denied_code: TOPIC_AUTH,
        },
        Case {
            name: "DescribeConfigs: DescribeConfigs Cluster (broker)",
            deny: &[(CLUSTER, "kafka-cluster", DESCRIBE_CONFIGS)],
            request: || {
                let r = DescribeConfigsRequest::default().with_resources(vec![
                    DescribeConfigsResource::default()
                        .with_resource_type(4)
                        .with_resource_name(sb("1"))
                        .with_configuration_keys(Some(vec![sb("num.io.threads")])),
                ]);
                (ApiKey::DescribeConfigs, 4, r.into())
            },
            code: |r| match r {
                R::DescribeConfigs(d) => d.results.first().map_or(-1, |t| t.error_code),
                _ => -2,
            },
            denied_code: CLUSTER_AUTH,
        },
        Case {
            name: "IncrementalAlterConfigs: AlterConfigs Topic",
            deny: &[(TOPIC, T, ALTER_CONFIGS)],
            request: || {
                let r = IncrementalAlterConfigsRequest::default()
                    .with_resources(vec![AlterConfigsResource::default()
                        .with_resource_type(2)
                        .with_resource_name(sb(T))
                        .with_configs(vec![AlterableConfig::default()
                            .with_name(sb("retention.ms"))
                            .with_config_operation(0)
                            .with_value(Some(sb("3600000")))])])
                    .with_validate_only(true);
                (ApiKey::IncrementalAlterConfigs, 1, r.into())
            },
            code: |r| match r {
                R::IncrementalAlterConfigs(d) => d.responses.first().map_or(-1, |t| t.error_code),
                _ => -2,
            },
            denied_code: TOPIC_AUTH,
        },
        Case {
            name: "DescribeCluster: nothing (KIP-430 operations only)",
            deny: &[(CLUSTER, "kafka-cluster", DESCRIBE)],
            request: || {
                (
                    ApiKey::DescribeCluster,
                    1,
                    DescribeClusterRequest::default().into(),
                )
            },
            code: |r| match r {
                R::DescribeCluster(d) => d.error_code,
                _ => -2,
            },
            denied_code: 0,
        },
        Case {
            name: "DescribeLogDirs: Describe Cluster",
            deny: &[(CLUSTER, "kafka-cluster", DESCRIBE)],
            request: || {
                (
                    ApiKey::DescribeLogDirs,
                    4,
                    DescribeLogDirsRequest::default().with_topics(None).into(),
                )
            },
            code: |r| match r {
                R::DescribeLogDirs(d) => d.error_code,
                _ => -2,
            },
            denied_code: CLUSTER_AUTH,
        },
        Case {
            name: "ListPartitionReassignments: Describe Cluster",
            deny: &[(CLUSTER, "kafka-cluster", DESCRIBE)],
            request: || {
                (
                    ApiKey::ListPartitionReassignments,
                    0,
                    ListPartitionReassignmentsRequest::default()
                        .with_timeout_ms(10_000)
                        .with_topics(None)
                        .into(),
                )
            },
            code: |r| match r {
                R::ListPartitionReassignments(d) => d.error_code,
                _ => -2,
            },
            denied_code: CLUSTER_AUTH,
        },
        Case {
            name: "InitProducerId (idempotent): IdempotentWrite Cluster or Write on some Topic",
            deny: &[
                (CLUSTER, "kafka-cluster", IDEMPOTENT_WRITE),
                (TOPIC, "*", WRITE),
            ],
            request: || {
                let r = InitProducerIdRequest::default()
                    .with_transactional_id(None)
                    .with_transaction_timeout_ms(60_000)
                    .with_producer_id(kafka_protocol::messages::ProducerId(-1))
                    .with_producer_epoch(-1);
                (ApiKey::InitProducerId, 4, r.into())
            },
            code: |r| match r {
                R::InitProducerId(d) => d.error_code,
                _ => -2,
            },
            denied_code: CLUSTER_AUTH,
        },
        Case {
            name: "InitProducerId (transactional): Write TransactionalId",
            deny: &[(TRANSACTIONAL_ID, "acl-tx", WRITE)],
            request: || {
                let r = InitProducerIdRequest::default()
                    .with_transactional_id(Some(TransactionalId(sb("acl-tx"))))
                    .with_transaction_timeout_ms(60_000)
                    .with_producer_id(kafka_protocol::messages::ProducerId(-1))
                    .with_producer_epoch(-1);
                (ApiKey::InitProducerId, 4, r.into())
            },
            code: |r| match r {
                R::InitProducerId(d) => d.error_code,
                _ => -2,
            },
            denied_code: TXN_AUTH,
        },
        Case {
            name: "FindCoordinator (group): Describe Group",
            deny: &[(GROUP, "acl-g", DESCRIBE)],
            request: || {
                let r = FindCoordinatorRequest::default()
                    .with_key_type(0)
                    .with_coordinator_keys(vec![sb("acl-g")]);
                (ApiKey::FindCoordinator, 4, r.into())
            },
            code: |r| match r {
                R::FindCoordinator(d) => d.coordinators.first().map_or(-1, |c| c.error_code),
                _ => -2,
            },
            denied_code: GROUP_AUTH,
        },
        Case {
            name: "OffsetFetch: Describe Group",
            deny: &[(GROUP, "acl-g", DESCRIBE)],
            request: || {
                let r = OffsetFetchRequest::default().with_groups(vec![
                    OffsetFetchRequestGroup::default()
                        .with_group_id(GroupId(sb("acl-g")))
                        .with_topics(None),
                ]);
                (ApiKey::OffsetFetch, 8, r.into())
            },
            code: |r| match r {
                R::OffsetFetch(d) => d.groups.first().map_or(-1, |g| g.error_code),
                _ => -2,
            },
            denied_code: GROUP_AUTH,
        },
        Case {
            name: "DescribeGroups: Describe Group",
            deny: &[(GROUP, "acl-g", DESCRIBE)],
            request: || {
                (
                    ApiKey::DescribeGroups,
                    5,
                    DescribeGroupsRequest::default()
                        .with_groups(vec![GroupId(sb("acl-g"))])
                        .into(),
                )
            },
            code: |r| match r {
                R::DescribeGroups(d) => d.groups.first().map_or(-1, |g| g.error_code),
                _ => -2,
            },
            denied_code: GROUP_AUTH,
        },
        Case {
            name: "Heartbeat: Read Group",
            deny: &[(GROUP, "acl-g", READ)],
            request: || {
                let r = HeartbeatRequest::default()
                    .with_group_id(GroupId(sb("acl-g")))
                    .with_generation_id(1)
                    .with_member_id(sb("m"));
                (ApiKey::Heartbeat, 4, r.into())
            },
            code: |r| match r {
                R::Heartbeat(d) => d.error_code,
                _ => -2,
            },
            denied_code: GROUP_AUTH,
        },
        Case {
            name: "OffsetCommit: Read Group",
            deny: &[(GROUP, "acl-g", READ)],
            request: offset_commit_request,
            code: offset_commit_code,
            denied_code: GROUP_AUTH,
        },
        Case {
            name: "OffsetCommit: Read Topic",
            deny: &[(TOPIC, T, READ)],
            request: offset_commit_request,
            code: offset_commit_code,
            denied_code: TOPIC_AUTH,
        },
        Case {
            name: "DeleteGroups: Delete Group",
            deny: &[(GROUP, "acl-g", DELETE)],
            request: || {
                (
                    ApiKey::DeleteGroups,
                    2,
                    DeleteGroupsRequest::default()
                        .with_groups_names(vec![GroupId(sb("acl-g"))])
                        .into(),
                )
            },
            code: |r| match r {
                R::DeleteGroups(d) => d.results.first().map_or(-1, |g| g.error_code),
                _ => -2,
            },
            denied_code: GROUP_AUTH,
        },
        Case {
            name: "ListGroups: Describe Cluster, else only groups with Describe",
            deny: &[(CLUSTER, "kafka-cluster", DESCRIBE)],
            request: || (ApiKey::ListGroups, 4, ListGroupsRequest::default().into()),
            code: |r| match r {
                R::ListGroups(d) => d.error_code,
                _ => -2,
            },
            // Filtered, never refused.
            denied_code: 0,
        },
        Case {
            name: "DescribeAcls: Describe Cluster",
            deny: &[(CLUSTER, "kafka-cluster", DESCRIBE)],
            request: || {
                let r = DescribeAclsRequest::default()
                    .with_resource_type_filter(1)
                    .with_pattern_type_filter(1)
                    .with_operation(1)
                    .with_permission_type(1);
                (ApiKey::DescribeAcls, 3, r.into())
            },
            code: |r| match r {
                R::DescribeAcls(d) => d.error_code,
                _ => -2,
            },
            denied_code: CLUSTER_AUTH,
        },
        Case {
            name: "DeleteTopics: Delete Cluster, else Delete Topic",
            deny: &[
                (CLUSTER, "kafka-cluster", DELETE),
                (TOPIC, "acl-doomed", DELETE),
            ],
            request: || {
                let r = DeleteTopicsRequest::default()
                    .with_topic_names(vec![topic_name("acl-doomed")])
                    .with_timeout_ms(10_000);
                (ApiKey::DeleteTopics, 5, r.into())
            },
            code: |r| match r {
                R::DeleteTopics(d) => d.responses.first().map_or(-1, |t| t.error_code),
                _ => -2,
            },
            denied_code: TOPIC_AUTH,
        },
        // Last: with Alter on the Cluster denied, DeleteAcls cannot remove the DENY.
        Case {
            name: "CreateAcls: Alter Cluster",
            deny: &[(CLUSTER, "kafka-cluster", ALTER)],
            request: || {
                let r = CreateAclsRequest::default().with_creations(vec![acl_creation(
                    "User:x",
                    (TOPIC, "x", LITERAL, READ, ALLOW),
                )]);
                (ApiKey::CreateAcls, 3, r.into())
            },
            code: |r| match r {
                R::CreateAcls(d) => d.results.first().map_or(-1, |t| t.error_code),
                _ => -2,
            },
            denied_code: CLUSTER_AUTH,
        },
    ]
}

fn acl_creation(principal: &str, (rt, name, pt, op, perm): Acl) -> AclCreation {
    AclCreation::default()
        .with_resource_type(rt)
        .with_resource_name(sb(name))
        .with_resource_pattern_type(pt)
        .with_principal(sb(principal))
        .with_host(sb("*"))
        .with_operation(op)
        .with_permission_type(perm)
}

fn create_acls(c: &mut KafkaConn, principal: &str, acls: &[Acl]) -> Result<()> {
    let req = CreateAclsRequest::default()
        .with_creations(acls.iter().map(|a| acl_creation(principal, *a)).collect());
    let r: kafka_protocol::messages::CreateAclsResponse = c.call(ApiKey::CreateAcls, 3, &req)?;
    for res in &r.results {
        ensure!(
            res.error_code == 0,
            "CreateAcls {acls:?}: {} {:?}",
            res.error_code,
            res.error_message
        );
    }
    Ok(())
}

fn delete_acls(c: &mut KafkaConn, principal: &str, acls: &[Acl]) -> Result<()> {
    let req = DeleteAclsRequest::default().with_filters(
        acls.iter()
            .map(|(rt, name, pt, op, perm)| {
                DeleteAclsFilter::default()
                    .with_resource_type_filter(*rt)
                    .with_resource_name_filter(Some(sb(name)))
                    .with_pattern_type_filter(*pt)
                    .with_principal_filter(Some(sb(principal)))
                    .with_host_filter(Some(sb("*")))
                    .with_operation(*op)
                    .with_permission_type(*perm)
            })
            .collect(),
    );
    let r: kafka_protocol::messages::DeleteAclsResponse = c.call(ApiKey::DeleteAcls, 3, &req)?;
    for res in &r.filter_results {
        ensure!(
            res.error_code == 0,
            "DeleteAcls {acls:?}: {}",
            res.error_code
        );
    }
    Ok(())
}

/// Waits until `check` holds on a fresh answer (ACLs reach a broker's authorizer through its
/// metadata; Kafka's broker applies them shortly after the controller answers).
fn eventually(what: &str, mut check: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if check()? {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether an allowed run's answer is final: not the denial, and not a coordinator that is
/// still loading or not yet available (COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE:
/// `__consumer_offsets` and `__transaction_state` are being created).
fn settled(code: i16, denied_code: i16) -> bool {
    (code != denied_code || denied_code == 0) && code != 14 && code != 15
}

impl Matrix {
    /// KIP-430's authorized operations with ALLOW Read and DENY Write on the topic, ALLOW ALL
    /// on the Cluster and no ACL on the group (allow.everyone.if.no.acl.found): Metadata
    /// (v10: topic and cluster), DescribeCluster and DescribeGroups.
    fn kip430(&self, c: &mut KafkaConn) -> Result<Vec<String>> {
        let p = self.principal.as_str();
        let acls = [
            (TOPIC, T, LITERAL, READ, ALLOW),
            (TOPIC, T, LITERAL, WRITE, DENY),
        ];
        create_acls(c, p, &acls)?;
        let mut lines = Vec::new();
        let mut topic_ops = 0;
        eventually("the topic's ACLs", || {
            let r: kafka_protocol::messages::MetadataResponse = c.call(
                ApiKey::Metadata,
                10,
                &MetadataRequest::default()
                    .with_topics(Some(vec![
                        MetadataRequestTopic::default().with_name(Some(topic_name(T)))
                    ]))
                    .with_allow_auto_topic_creation(false)
                    .with_include_topic_authorized_operations(true)
                    .with_include_cluster_authorized_operations(true),
            )?;
            topic_ops = r
                .topics
                .first()
                .map_or(-1, |t| t.topic_authorized_operations);
            if topic_ops == 264 {
                lines.push(format!("KIP-430 Metadata topic operations: {topic_ops}"));
                lines.push(format!(
                    "KIP-430 Metadata cluster operations: {}",
                    r.cluster_authorized_operations
                ));
            }
            Ok(topic_ops == 264)
        })
        .with_context(|| format!("topic operations {topic_ops}"))?;
        let r: kafka_protocol::messages::DescribeClusterResponse = c.call(
            ApiKey::DescribeCluster,
            1,
            &DescribeClusterRequest::default().with_include_cluster_authorized_operations(true),
        )?;
        lines.push(format!(
            "KIP-430 DescribeCluster operations: {}",
            r.cluster_authorized_operations
        ));
        // Once the group coordinator is available (`__consumer_offsets` is being created):
        // operations come only with a group described without error.
        let mut group_ops = (-1, -1);
        eventually("the group coordinator", || {
            // Creates `__consumer_offsets` on first use (one node: the coordinator is here).
            let _: kafka_protocol::messages::FindCoordinatorResponse = c.call(
                ApiKey::FindCoordinator,
                4,
                &FindCoordinatorRequest::default()
                    .with_key_type(0)
                    .with_coordinator_keys(vec![sb("acl-g")]),
            )?;
            let r: kafka_protocol::messages::DescribeGroupsResponse = c.call(
                ApiKey::DescribeGroups,
                5,
                &DescribeGroupsRequest::default()
                    .with_groups(vec![GroupId(sb("acl-g"))])
                    .with_include_authorized_operations(true),
            )?;
            group_ops = r
                .groups
                .first()
                .map_or((-1, -1), |g| (g.error_code, g.authorized_operations));
            Ok(group_ops.0 == 0)
        })
        .with_context(|| format!("DescribeGroups {group_ops:?}"))?;
        lines.push(format!(
            "KIP-430 DescribeGroups operations: {}",
            group_ops.1
        ));
        delete_acls(c, p, &acls)?;
        Ok(lines)
    }

    /// Runs every case on the broker at `bootstrap`: one line per case, `name: allowed=<code>
    /// denied=<code>`.
    fn run(&self, bootstrap: &str) -> Result<Vec<String>> {
        let mut c = self.connect(bootstrap)?;
        let p = self.principal.as_str();
        // The principal may do everything on the Cluster (its Alter is what CreateAcls needs).
        create_acls(
            &mut c,
            p,
            &[(CLUSTER, "kafka-cluster", LITERAL, ALL, ALLOW)],
        )?;
        // The topics the cases use.
        let req = CreateTopicsRequest::default()
            .with_topics(
                [T, "acl-doomed"]
                    .iter()
                    .map(|n| {
                        CreatableTopic::default()
                            .with_name(topic_name(n))
                            .with_num_partitions(1)
                            .with_replication_factor(1)
                    })
                    .collect(),
            )
            .with_timeout_ms(30_000);
        let r: kafka_protocol::messages::CreateTopicsResponse =
            c.call(ApiKey::CreateTopics, 7, &req)?;
        for t in &r.topics {
            ensure!(t.error_code == 0, "creating {}: {}", t.name.0, t.error_code);
        }
        let kip430 = self.kip430(&mut c)?;
        let mut lines = Vec::new();
        for case in cases() {
            let (key, version, req) = (case.request)();
            let deny: Vec<Acl> = case
                .deny
                .iter()
                .map(|(rt, name, op)| (*rt, *name, LITERAL, *op, DENY))
                .collect();
            // With Alter on the Cluster denied the DENY cannot be removed: that case runs
            // allowed first (and last in the matrix); the others denied first, so that the
            // allowed run (which may delete or create) leaves nothing for the denied one.
            let final_case = deny
                .iter()
                .any(|(rt, _, _, op, _)| *rt == CLUSTER && *op == ALTER);
            // The answer once the ACLs have reached the broker that answers (and, for
            // forwarded requests, the controller): up to 15 s for `want(code)`, else the
            // last answer, reported.
            let answer = |c: &mut KafkaConn, want: &dyn Fn(i16) -> bool| -> Result<i16> {
                let mut code = -3;
                if let Err(e) = eventually(case.name, || {
                    code = (case.code)(&c.call_kind(key, version, &req)?);
                    Ok(want(code))
                }) {
                    eprintln!("{}: {e:#}", case.name);
                }
                Ok(code)
            };
            let denied_code = case.denied_code;
            let (allowed, denied) = if final_case {
                let allowed = answer(&mut c, &|code| settled(code, denied_code))?;
                create_acls(&mut c, p, &deny)?;
                (allowed, answer(&mut c, &|code| code == denied_code)?)
            } else {
                create_acls(&mut c, p, &deny)?;
                let denied = answer(&mut c, &|code| code == denied_code || denied_code == 0)?;
                delete_acls(&mut c, p, &deny)?;
                (answer(&mut c, &|code| settled(code, denied_code))?, denied)
            };
            let line = format!("{}: allowed={allowed} denied={denied}", case.name);
            eprintln!("{line}");
            lines.push(line);
            if case.name.starts_with("DeleteGroups") {
                lines.extend(kip430.iter().cloned());
            }
        }
        Ok(lines)
    }
}

/// Kafka 4.4.0's answers to the matrix (`cases`' `denied_code`s, and the allowed codes Kafka
/// gives, checked by `acl_matrix_kafka`).
fn expected() -> Vec<String> {
    [
        "Metadata: Describe Topic: allowed=0 denied=29",
        "Produce: Write Topic: allowed=0 denied=29",
        "Fetch: Read Topic: allowed=0 denied=29",
        "ListOffsets: Describe Topic: allowed=0 denied=29",
        "DescribeProducers: Read Topic: allowed=0 denied=29",
        "CreateTopics: Create Cluster, else Create Topic: allowed=0 denied=29",
        "CreatePartitions: Alter Topic: allowed=0 denied=29",
        "DeleteRecords: Delete Topic: allowed=0 denied=29",
        "DescribeConfigs: DescribeConfigs Topic: allowed=0 denied=29",
        "DescribeConfigs: DescribeConfigs Cluster (broker): allowed=0 denied=31",
        "IncrementalAlterConfigs: AlterConfigs Topic: allowed=0 denied=29",
        "DescribeCluster: nothing (KIP-430 operations only): allowed=0 denied=0",
        "DescribeLogDirs: Describe Cluster: allowed=0 denied=31",
        "ListPartitionReassignments: Describe Cluster: allowed=0 denied=31",
        "InitProducerId (idempotent): IdempotentWrite Cluster or Write on some Topic: allowed=0 denied=31",
        "InitProducerId (transactional): Write TransactionalId: allowed=16 denied=53",
        "FindCoordinator (group): Describe Group: allowed=0 denied=30",
        "OffsetFetch: Describe Group: allowed=0 denied=30",
        "DescribeGroups: Describe Group: allowed=0 denied=30",
        "Heartbeat: Read Group: allowed=25 denied=30",
        "OffsetCommit: Read Group: allowed=0 denied=30",
        "OffsetCommit: Read Topic: allowed=0 denied=29",
        "DeleteGroups: Delete Group: allowed=0 denied=30",
        "KIP-430 Metadata topic operations: 264",
        "KIP-430 Metadata cluster operations: 8096",
        "KIP-430 DescribeCluster operations: 8096",
        "KIP-430 DescribeGroups operations: 3400",
        "ListGroups: Describe Cluster, else only groups with Describe: allowed=0 denied=0",
        "DescribeAcls: Describe Cluster: allowed=0 denied=31",
        "DeleteTopics: Delete Cluster, else Delete Topic: allowed=0 denied=29",
        "CreateAcls: Alter Cluster: allowed=0 denied=31",
    ]
    .iter()
    .map(|s| (*s).to_string())
    .collect()
}

fn check_matrix(got: &[String], who: &str) -> Result<()> {
    let want = expected();
    let diff: Vec<String> = got
        .iter()
        .zip(&want)
        .filter(|(g, w)| g != w)
        .map(|(g, w)| format!("  got  {g}\n  want {w}"))
        .collect();
    ensure!(
        diff.is_empty() && got.len() == want.len(),
        "{who}: the ACL matrix differs from Kafka's:\n{}",
        diff.join("\n")
    );
    Ok(())
}

fn start_kafka(extra: &[String]) -> Result<(Instance, ChildGuard)> {
    let mut last = None;
    for _ in 0..5 {
        let mut instance = Instance::new(free_port()?, None, None)?;
        instance.extra_properties = extra.to_vec();
        match instance.spawn() {
            Ok(child) => {
                let mut guard = ChildGuard::new("kafka", child);
                instance.wait_ready(|| guard.check_alive())?;
                return Ok((instance, guard));
            }
            Err(e) if format!("{e:#}").contains("is not free") => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("no free port")))
}

fn start_gregor(extra: &[String]) -> Result<Gregor> {
    let sets: Vec<&str> = extra.iter().map(String::as_str).collect();
    Gregor::start(BIN, &sets)
}

#[test]
fn acl_matrix_gregor() -> Result<()> {
    let g = start_gregor(&properties())?;
    let matrix = Matrix::anonymous();
    let got = matrix.run(&g.bootstrap())?;
    check_matrix(&got, "gregor")
}

#[test]
fn acl_matrix_kafka() -> Result<()> {
    if !reference::jars_or_skip() {
        return Ok(());
    }
    let (instance, _guard) = start_kafka(&properties())?;
    let matrix = Matrix::anonymous();
    let got = matrix.run(&instance.bootstrap())?;
    check_matrix(&got, "kafka")
}

/// The matrix with a principal SASL authenticated (`User:alice` over SASL/PLAIN), not
/// ANONYMOUS: the same answers as Kafka's.
#[test]
fn acl_matrix_sasl_gregor() -> Result<()> {
    let (_g, sasl) = start_gregor_sasl()?;
    let got = Matrix::alice().run(&sasl)?;
    check_matrix(&got, "gregor (User:alice over SASL/PLAIN)")
}

#[test]
fn acl_matrix_sasl_kafka() -> Result<()> {
    if !reference::jars_or_skip() {
        return Ok(());
    }
    let (_instance, _guard, sasl) = start_kafka_sasl()?;
    let got = Matrix::alice().run(&sasl)?;
    check_matrix(&got, "kafka (User:alice over SASL/PLAIN)")
}

/// ACLs naming SASL principals, with host filters, DENY beating ALLOW, PREFIXED patterns, the
/// `User:*` wildcard and a super user: each row changes the ACLs of the topic (as `admin`, a
/// super user) and reads the Metadata error code of the topic as alice, bob and admin, each
/// logged in with SASL/PLAIN. One line per row, `row: alice=<code> bob=<code> admin=<code>`.
fn sasl_rows(sasl: &str) -> Result<Vec<String>> {
    let mut admin = plain_login(sasl, "admin", "admin-secret")?;
    let mut alice = plain_login(sasl, "alice", "alice-secret")?;
    let mut bob = plain_login(sasl, "bob", "bob-secret")?;
    let topic = "sasl-acl-t";
    let req = CreateTopicsRequest::default()
        .with_topics(vec![CreatableTopic::default()
            .with_name(topic_name(topic))
            .with_num_partitions(1)
            .with_replication_factor(1)])
        .with_timeout_ms(30_000);
    let r: kafka_protocol::messages::CreateTopicsResponse =
        admin.call(ApiKey::CreateTopics, 7, &req)?;
    ensure!(r.topics[0].error_code == 0, "creating: {:?}", r.topics[0]);
    let metadata_code = |c: &mut KafkaConn| -> Result<i16> {
        let r: kafka_protocol::messages::MetadataResponse = c.call(
            ApiKey::Metadata,
            12,
            &MetadataRequest::default()
                .with_topics(Some(vec![
                    MetadataRequestTopic::default().with_name(Some(topic_name(topic)))
                ]))
                .with_allow_auto_topic_creation(false),
        )?;
        Ok(r.topics.first().map_or(-1, |t| t.error_code))
    };
    // (principal, host, pattern type, name, permission) on Describe of the topic.
    type Rule = (&'static str, &'static str, i8, &'static str, i8);
    let change = |c: &mut KafkaConn, add: bool, rule: Rule| -> Result<()> {
        let (principal, host, pt, name, perm) = rule;
        if add {
            let req = CreateAclsRequest::default().with_creations(vec![AclCreation::default()
                .with_resource_type(TOPIC)
                .with_resource_name(sb(name))
                .with_resource_pattern_type(pt)
                .with_principal(sb(principal))
                .with_host(sb(host))
                .with_operation(DESCRIBE)
                .with_permission_type(perm)]);
            let r: kafka_protocol::messages::CreateAclsResponse =
                c.call(ApiKey::CreateAcls, 3, &req)?;
            ensure!(
                r.results.iter().all(|x| x.error_code == 0),
                "{rule:?}: {r:?}"
            );
        } else {
            let req = DeleteAclsRequest::default().with_filters(vec![DeleteAclsFilter::default()
                .with_resource_type_filter(TOPIC)
                .with_resource_name_filter(Some(sb(name)))
                .with_pattern_type_filter(pt)
                .with_principal_filter(Some(sb(principal)))
                .with_host_filter(Some(sb(host)))
                .with_operation(DESCRIBE)
                .with_permission_type(perm)]);
            let r: kafka_protocol::messages::DeleteAclsResponse =
                c.call(ApiKey::DeleteAcls, 3, &req)?;
            ensure!(
                r.filter_results.iter().all(|x| x.error_code == 0),
                "{rule:?}: {r:?}"
            );
        }
        Ok(())
    };
    // Each row: the ACL changes, then the codes it must settle at (alice, bob, admin).
    let alice_elsewhere: Rule = ("User:alice", "10.0.0.1", LITERAL, topic, ALLOW);
    let alice_here: Rule = ("User:alice", "127.0.0.1", LITERAL, topic, ALLOW);
    let deny_everyone: Rule = ("User:*", "*", LITERAL, topic, DENY);
    let bob_prefix: Rule = ("User:bob", "*", PREFIXED, "sasl-", ALLOW);
    let deny_bob_prefix: Rule = ("User:bob", "*", PREFIXED, "sasl-acl", DENY);
    // (row, ACL changes (true: add), the codes of alice, bob and admin).
    type Row = (&'static str, Vec<(bool, Rule)>, [i16; 3]);
    let rows: Vec<Row> = vec![
        ("no ACL (allow.everyone.if.no.acl.found)", vec![], [0, 0, 0]),
        (
            "ALLOW alice from another host",
            vec![(true, alice_elsewhere)],
            [29, 29, 0],
        ),
        (
            "and ALLOW alice from 127.0.0.1",
            vec![(true, alice_here)],
            [0, 29, 0],
        ),
        (
            "and DENY User:* from any host",
            vec![(true, deny_everyone)],
            [29, 29, 0],
        ),
        (
            "DENY removed, PREFIXED ALLOW bob on sasl-",
            vec![(false, deny_everyone), (true, bob_prefix)],
            [0, 0, 0],
        ),
        (
            "and PREFIXED DENY bob on sasl-acl",
            vec![(true, deny_bob_prefix)],
            [0, 29, 0],
        ),
        (
            "every ACL removed",
            vec![
                (false, alice_elsewhere),
                (false, alice_here),
                (false, bob_prefix),
                (false, deny_bob_prefix),
            ],
            [0, 0, 0],
        ),
    ];
    let mut lines = Vec::new();
    for (name, changes, want) in rows {
        for (add, rule) in changes {
            change(&mut admin, add, rule)?;
        }
        let mut got = [-3; 3];
        let settled = eventually(name, || {
            got = [
                metadata_code(&mut alice)?,
                metadata_code(&mut bob)?,
                metadata_code(&mut admin)?,
            ];
            Ok(got == want)
        });
        if let Err(e) = settled {
            eprintln!("{name}: {e:#}");
        }
        let line = format!("{name}: alice={} bob={} admin={}", got[0], got[1], got[2]);
        eprintln!("{line}");
        lines.push(line);
    }
    Ok(lines)
}

/// Kafka 4.4.0's answers to [`sasl_rows`].
fn sasl_rows_expected() -> Vec<String> {
    [
        "no ACL (allow.everyone.if.no.acl.found): alice=0 bob=0 admin=0",
        "ALLOW alice from another host: alice=29 bob=29 admin=0",
        "and ALLOW alice from 127.0.0.1: alice=0 bob=29 admin=0",
        "and DENY User:* from any host: alice=29 bob=29 admin=0",
        "DENY removed, PREFIXED ALLOW bob on sasl-: alice=0 bob=0 admin=0",
        "and PREFIXED DENY bob on sasl-acl: alice=0 bob=29 admin=0",
        "every ACL removed: alice=0 bob=0 admin=0",
    ]
    .iter()
    .map(|s| (*s).to_string())
    .collect()
}

#[test]
fn sasl_principals_hosts_prefixes_and_super_users_gregor() -> Result<()> {
    let (_g, sasl) = start_gregor_sasl()?;
    let got = sasl_rows(&sasl)?;
    ensure!(got == sasl_rows_expected(), "gregor: {got:#?}");
    Ok(())
}

#[test]
fn sasl_principals_hosts_prefixes_and_super_users_kafka() -> Result<()> {
    if !reference::jars_or_skip() {
        return Ok(());
    }
    let (_instance, _guard, sasl) = start_kafka_sasl()?;
    let got = sasl_rows(&sasl)?;
    ensure!(got == sasl_rows_expected(), "kafka: {got:#?}");
    Ok(())
}

#[test]
fn unknown_authorizers_are_refused_and_acl_apis_need_an_authorizer() -> Result<()> {
    // Without authorizer.class.name: SECURITY_DISABLED (Kafka's answer).
    let g = Gregor::start(BIN, &[])?;
    let mut c = KafkaConn::connect(g.bootstrap(), "acl")?;
    let r: kafka_protocol::messages::DescribeAclsResponse = c.call(
        ApiKey::DescribeAcls,
        3,
        &DescribeAclsRequest::default()
            .with_resource_type_filter(1)
            .with_pattern_type_filter(1)
            .with_operation(1)
            .with_permission_type(1),
    )?;
    ensure!(r.error_code == 54, "DescribeAcls: {}", r.error_code);
    let r: kafka_protocol::messages::CreateAclsResponse = c.call(
        ApiKey::CreateAcls,
        3,
        &CreateAclsRequest::default().with_creations(vec![acl_creation(
            "User:a",
            (TOPIC, "t", LITERAL, READ, ALLOW),
        )]),
    )?;
    ensure!(
        r.results[0].error_code == 54,
        "CreateAcls: {}",
        r.results[0].error_code
    );
    drop(g);
    // Another authorizer class stops start-up with a message naming the key.
    let out = std::process::Command::new(BIN)
        .args([
            "serve",
            "--set",
            "authorizer.class.name=kafka.security.authorizer.AclAuthorizer",
        ])
        .output()
        .context("running gregor serve")?;
    ensure!(
        !out.status.success(),
        "gregor started with an unknown authorizer"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(
        err.contains("authorizer.class.name") && err.contains("StandardAuthorizer"),
        "{err}"
    );
    Ok(())
}

/// Invalid ACLs and filters get Kafka's INVALID_REQUEST; ACLs survive a restart (they are
/// metadata records).
#[test]
fn acl_validation_and_persistence_gregor() -> Result<()> {
    let mut g = start_gregor(&properties())?;
    let mut c = KafkaConn::connect(g.bootstrap(), "acl")?;
    let p = "User:ANONYMOUS";
    create_acls(
        &mut c,
        p,
        &[(CLUSTER, "kafka-cluster", LITERAL, ALL, ALLOW)],
    )?;
    let bad = [
        (CLUSTER, "not-the-cluster", LITERAL, ALL, ALLOW),
        (TOPIC, "", LITERAL, READ, ALLOW),
        (TOPIC, "t", 1, READ, ALLOW),
        (TOPIC, "t", LITERAL, 1, ALLOW),
        (TOPIC, "t", LITERAL, READ, 1),
        (1, "t", LITERAL, READ, ALLOW),
    ];
    let req = CreateAclsRequest::default()
        .with_creations(bad.iter().map(|a| acl_creation(p, *a)).collect());
    let r: kafka_protocol::messages::CreateAclsResponse = c.call(ApiKey::CreateAcls, 3, &req)?;
    let codes: Vec<i16> = r.results.iter().map(|r| r.error_code).collect();
    ensure!(
        codes == vec![42; bad.len()],
        "CreateAcls of invalid ACLs: {codes:?}"
    );
    let r: kafka_protocol::messages::DescribeAclsResponse = c.call(
        ApiKey::DescribeAcls,
        3,
        &DescribeAclsRequest::default()
            .with_resource_type_filter(1)
            .with_pattern_type_filter(0)
            .with_operation(1)
            .with_permission_type(1),
    )?;
    ensure!(
        r.error_code == 42,
        "DescribeAcls with an UNKNOWN pattern type: {}",
        r.error_code
    );
    create_acls(&mut c, p, &[(TOPIC, "pre-", PREFIXED, READ, ALLOW)])?;
    let r: kafka_protocol::messages::DescribeAclsResponse = c.call(
        ApiKey::DescribeAcls,
        3,
        &DescribeAclsRequest::default()
            .with_resource_type_filter(TOPIC)
            .with_resource_name_filter(Some(sb("pre-x")))
            .with_pattern_type_filter(2)
            .with_principal_filter(None)
            .with_host_filter(None)
            .with_operation(1)
            .with_permission_type(1),
    )?;
    ensure!(r.resources.len() == 1, "before restart: {r:?}");
    drop(c);
    g.restart()?;
    let mut c = KafkaConn::connect(g.bootstrap(), "acl")?;
    let r: kafka_protocol::messages::DescribeAclsResponse = c.call(
        ApiKey::DescribeAcls,
        3,
        &DescribeAclsRequest::default()
            .with_resource_type_filter(TOPIC)
            .with_resource_name_filter(Some(sb("pre-x")))
            .with_pattern_type_filter(2)
            .with_principal_filter(None)
            .with_host_filter(None)
            .with_operation(1)
            .with_permission_type(1),
    )?;
    ensure!(r.error_code == 0, "{}", r.error_code);
    let found: Vec<(String, i8)> = r
        .resources
        .iter()
        .map(|res| (res.resource_name.to_string(), res.pattern_type))
        .collect();
    ensure!(
        found == vec![("pre-".to_string(), PREFIXED)],
        "after restart: {found:?}"
    );
    Ok(())
}

const ACL_COMMAND: &str = "org.apache.kafka.tools.AclCommand";

/// `kafka-acls --bootstrap-server <b> <args>`; fails when the tool reports an error.
fn kafka_acls(bootstrap: &str, args: &[&str]) -> Result<String> {
    let mut all = vec!["--bootstrap-server", bootstrap];
    all.extend_from_slice(args);
    let out = reference::tool_output(ACL_COMMAND, &all)?;
    ensure!(
        !out.contains("Error") && !out.contains("Exception"),
        "kafka-acls {args:?}:\n{out}"
    );
    Ok(out)
}

/// Produces one record to `topic` with librdkafka's idempotent producer; the delivery's
/// error, if any.
fn rdkafka_produce(bootstrap: &str, topic: &str) -> Result<Option<String>> {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let p: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("message.timeout.ms", "10000")
        .set("enable.idempotence", "true")
        .create()?;
    let sent = gregor_tests::clients::runtime()?.block_on(p.send(
        FutureRecord::<(), str>::to(topic).payload("v"),
        Duration::from_secs(10),
    ));
    Ok(sent.err().map(|(e, _)| e.to_string()))
}

/// Whether a librdkafka consumer in group `group` can read `topic` from the start: Ok(count)
/// or the first error it reports.
fn rdkafka_consume(bootstrap: &str, topic: &str, group: &str) -> Result<Result<usize, String>> {
    use rdkafka::consumer::Consumer;
    let c = gregor_tests::clients::consumer(
        bootstrap,
        &[("group.id", group), ("auto.offset.reset", "earliest")],
    )?;
    c.subscribe(&[topic])?;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut n = 0;
    while Instant::now() < deadline {
        match c.poll(Duration::from_millis(200)) {
            Some(Ok(_)) => {
                n += 1;
                return Ok(Ok(n));
            }
            Some(Err(e)) => return Ok(Err(e.to_string())),
            None => {}
        }
    }
    Ok(Ok(n))
}

/// Kafka's `kafka-acls` adds, lists and removes ACLs on gregor; librdkafka clients are admitted
/// and refused by them: PREFIXED ALLOW, a DENY that beats it, a wildcard ALLOW limited to
/// another host (which takes allow.everyone.if.no.acl.found away from every topic), a group
/// ALLOW.
#[test]
fn kafka_acls_and_librdkafka_on_gregor() -> Result<()> {
    if !reference::jars_or_skip() {
        return Ok(());
    }
    let g = start_gregor(&properties())?;
    let b = g.bootstrap();
    for t in ["app-data", "app-secret", "other"] {
        gregor_tests::clients::create_topic(&b, t, 1)?;
    }
    let anon = "User:ANONYMOUS";
    kafka_acls(
        &b,
        &[
            "--add",
            "--allow-principal",
            anon,
            "--operation",
            "All",
            "--cluster",
        ],
    )?;
    kafka_acls(
        &b,
        &[
            "--add",
            "--allow-principal",
            anon,
            "--producer",
            "--topic",
            "app-",
            "--resource-pattern-type",
            "prefixed",
        ],
    )?;
    kafka_acls(
        &b,
        &[
            "--add",
            "--allow-principal",
            anon,
            "--allow-host",
            "127.0.0.1",
            "--operation",
            "Read",
            "--topic",
            "app-",
            "--resource-pattern-type",
            "prefixed",
            "--group",
            "g",
        ],
    )?;
    kafka_acls(
        &b,
        &[
            "--add",
            "--deny-principal",
            anon,
            "--operation",
            "Read",
            "--topic",
            "app-secret",
        ],
    )?;
    kafka_acls(
        &b,
        &[
            "--add",
            "--allow-principal",
            "User:*",
            "--allow-host",
            "10.0.0.1",
            "--operation",
            "All",
            "--topic",
            "*",
        ],
    )?;
    let listed = kafka_acls(&b, &["--list"])?;
    for want in [
        "ResourcePattern(resourceType=TOPIC, name=app-, patternType=PREFIXED)",
        "ResourcePattern(resourceType=TOPIC, name=app-secret, patternType=LITERAL)",
        "ResourcePattern(resourceType=TOPIC, name=*, patternType=LITERAL)",
        "ResourcePattern(resourceType=GROUP, name=g, patternType=PREFIXED)",
        "ResourcePattern(resourceType=CLUSTER, name=kafka-cluster, patternType=LITERAL)",
        "(principal=User:ANONYMOUS, host=*, operation=READ, permissionType=DENY)",
        "(principal=User:*, host=10.0.0.1, operation=ALL, permissionType=ALLOW)",
    ] {
        ensure!(
            listed.contains(want),
            "kafka-acls --list lacks {want}:\n{listed}"
        );
    }
    let topic_only = kafka_acls(&b, &["--list", "--topic", "app-secret"])?;
    ensure!(
        topic_only.contains("app-secret") && !topic_only.contains("name=g,"),
        "{topic_only}"
    );

    // Produce: app-data (PREFIXED Write) yes; other (only the 10.0.0.1 wildcard) no.
    let mut c = KafkaConn::connect(b.as_str(), "acl")?;
    let produce_to = |c: &mut KafkaConn, topic: &'static str| -> Result<i16> {
        let (k, v, req) = produce_request();
        let RequestKind::Produce(mut req) = req else {
            bail!("produce")
        };
        req.topic_data[0].name = topic_name(topic);
        let r = c.call_kind(k, v, &RequestKind::Produce(req))?;
        let ResponseKind::Produce(r) = r else {
            bail!("produce response")
        };
        Ok(r.responses[0].partition_responses[0].error_code)
    };
    ensure!(produce_to(&mut c, "app-data")? == 0, "produce to app-data");
    ensure!(
        produce_to(&mut c, "app-secret")? == 0,
        "produce to app-secret"
    );
    ensure!(produce_to(&mut c, "other")? == 29, "produce to other");
    // librdkafka: an idempotent producer (InitProducerId by KIP-679's Write on some topic).
    let sent = rdkafka_produce(&b, "app-data")?;
    ensure!(sent.is_none(), "librdkafka produce to app-data: {sent:?}");
    let sent = rdkafka_produce(&b, "other")?;
    ensure!(
        matches!(&sent, Some(e) if e.contains("uthoriz")),
        "librdkafka produce to other: {sent:?}"
    );
    // Consume: app-data with group g yes; app-secret (DENY Read) no.
    let got = rdkafka_consume(&b, "app-data", "g")?;
    ensure!(matches!(got, Ok(n) if n > 0), "consume app-data: {got:?}");
    let got = rdkafka_consume(&b, "app-secret", "g")?;
    ensure!(
        matches!(&got, Err(e) if e.contains("uthoriz")),
        "consume app-secret: {got:?}"
    );
    // Group g2 is covered by the PREFIXED "g" ALLOW, so the refusal is the topic's (only the
    // 10.0.0.1 wildcard applies to it).
    let got = rdkafka_consume(&b, "other", "g2")?;
    ensure!(
        matches!(&got, Err(e) if e.contains("uthoriz")),
        "consume other: {got:?}"
    );

    // Remove the DENY: app-secret is readable.
    kafka_acls(
        &b,
        &[
            "--remove",
            "--force",
            "--deny-principal",
            anon,
            "--operation",
            "Read",
            "--topic",
            "app-secret",
        ],
    )?;
    let got = rdkafka_consume(&b, "app-secret", "g")?;
    ensure!(
        matches!(got, Ok(n) if n > 0),
        "consume app-secret after removal: {got:?}"
    );
    let listed = kafka_acls(&b, &["--list", "--topic", "app-secret"])?;
    ensure!(!listed.contains("DENY"), "{listed}");
    Ok(())
}

/// Runs `gregor acl <args> -b <bootstrap>`; stdout, or the failure with stderr.
fn gregor_acl(bootstrap: &str, args: &[&str]) -> Result<String> {
    let out = std::process::Command::new(BIN)
        .arg("acl")
        .args(args)
        .args(["-b", bootstrap])
        .output()
        .context("running gregor acl")?;
    ensure!(
        out.status.success(),
        "gregor acl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `gregor acl add|list|remove` on gregor, and its refusals: without an authorizer
/// (SECURITY_DISABLED) and without a principal type.
#[test]
fn gregor_acl_command() -> Result<()> {
    let g = start_gregor(&properties())?;
    let b = g.bootstrap();
    gregor_acl(
        &b,
        &[
            "add",
            "--allow-principal",
            "User:ANONYMOUS",
            "--operation",
            "all",
            "--cluster",
        ],
    )?;
    let added = gregor_acl(
        &b,
        &[
            "add",
            "--allow-principal",
            "User:bob",
            "--deny-principal",
            "User:eve",
            "--deny-host",
            "10.0.0.9",
            "--operation",
            "read",
            "--operation",
            "describe",
            "--topic",
            "orders-",
            "--group",
            "billing",
            "--resource-pattern-type",
            "prefixed",
        ],
    )?;
    ensure!(added.contains("Added 8 ACL(s)"), "{added}");
    let listed = gregor_acl(&b, &["list", "--output", "json"])?;
    let v: serde_json::Value = serde_json::from_str(listed.trim())?;
    let acls = v.as_array().context("a JSON array")?;
    ensure!(acls.len() == 9, "{listed}");
    ensure!(
        acls.iter().any(|a| a["principal"] == "User:eve"
            && a["host"] == "10.0.0.9"
            && a["permission_type"] == "DENY"
            && a["resource_type"] == "GROUP"
            && a["pattern_type"] == "PREFIXED"
            && a["operation"] == "DESCRIBE"),
        "{listed}"
    );
    // list --resource-pattern-type match: what applies to topic orders-eu.
    let matching = gregor_acl(
        &b,
        &[
            "list",
            "--topic",
            "orders-eu",
            "--resource-pattern-type",
            "match",
        ],
    )?;
    ensure!(
        matching.contains("TOPIC orders- (PREFIXED)") && !matching.contains("GROUP"),
        "{matching}"
    );
    let removed = gregor_acl(
        &b,
        &[
            "remove",
            "--deny-principal",
            "User:eve",
            "--deny-host",
            "10.0.0.9",
            "--operation",
            "read",
            "--operation",
            "describe",
            "--topic",
            "orders-",
            "--group",
            "billing",
            "--resource-pattern-type",
            "prefixed",
        ],
    )?;
    ensure!(removed.contains("Removed 4 ACL(s)"), "{removed}");
    let listed = gregor_acl(&b, &["list", "--principal", "User:eve"])?;
    ensure!(listed.trim().is_empty(), "{listed}");
    ensure!(
        gregor_acl(
            &b,
            &[
                "add",
                "--allow-principal",
                "bob",
                "--operation",
                "read",
                "--topic",
                "t"
            ]
        )
        .is_err(),
        "a principal without its type"
    );
    drop(g);
    let plain = Gregor::start(BIN, &[])?;
    let e = gregor_acl(&plain.bootstrap(), &["list"]).unwrap_err();
    ensure!(format!("{e:#}").contains("SECURITY_DISABLED"), "{e:#}");
    Ok(())
}

/// Three combined gregor nodes: CreateAcls and DeleteAcls sent to any node reach the active
/// controller (forwarded in an Envelope from the others), and every node's authorizer follows
/// the committed ACLs.
#[test]
fn acls_in_a_three_node_cluster() -> Result<()> {
    use gregor_tests::cluster::Layout;
    use gregor_tests::cluster::{Cluster, ClusterConfig, Implementation};
    // One voter: the nodes talk to each other as User:ANONYMOUS, which is not in super.users,
    // and controllers that are not super users cannot elect a leader among several voters
    // (Vote needs ClusterAction, denied by every authorizer until it has loaded the
    // metadata: KIP-801, as Kafka). The two other nodes are brokers, whose registrations,
    // heartbeats and follower fetches are allowed by ALLOW ALL on the Cluster.
    let mut config = ClusterConfig::new(
        Implementation::Gregor(BIN.into()),
        Layout::CombinedAndBrokers {
            combined: 1,
            brokers: 2,
        },
    );
    for p in properties() {
        let (k, v) = p.split_once('=').context("key=value")?;
        config.properties.push((k.to_string(), v.to_string()));
    }
    let mut cluster = Cluster::start(&config)?;
    cluster.wait_ready(Duration::from_secs(60))?;
    let nodes: Vec<String> = cluster
        .nodes()
        .iter()
        .filter_map(|n| n.bootstrap())
        .collect();
    ensure!(nodes.len() == 3, "{nodes:?}");
    let p = "User:ANONYMOUS";
    let mut first = KafkaConn::connect(nodes[0].as_str(), "acl")?;
    create_acls(
        &mut first,
        p,
        &[(CLUSTER, "kafka-cluster", LITERAL, ALL, ALLOW)],
    )?;
    let req = CreateTopicsRequest::default()
        .with_topics(vec![CreatableTopic::default()
            .with_name(topic_name(T))
            .with_num_partitions(1)
            .with_replication_factor(3)])
        .with_timeout_ms(30_000);
    let r: kafka_protocol::messages::CreateTopicsResponse =
        first.call(ApiKey::CreateTopics, 7, &req)?;
    ensure!(
        r.topics[0].error_code == 0,
        "CreateTopics: {}",
        r.topics[0].error_code
    );
    let metadata_code = |bootstrap: &str| -> Result<i16> {
        let mut c = KafkaConn::connect(bootstrap, "acl")?;
        let r: kafka_protocol::messages::MetadataResponse = c.call(
            ApiKey::Metadata,
            12,
            &MetadataRequest::default()
                .with_topics(Some(vec![
                    MetadataRequestTopic::default().with_name(Some(topic_name(T)))
                ]))
                .with_allow_auto_topic_creation(false),
        )?;
        Ok(r.topics.first().map_or(-1, |t| t.error_code))
    };
    // A DENY added through each node in turn is enforced by every node, then removed.
    for via in &nodes {
        let mut c = KafkaConn::connect(via.as_str(), "acl")?;
        let deny = [(TOPIC, T, LITERAL, DESCRIBE, DENY)];
        create_acls(&mut c, p, &deny)?;
        for n in &nodes {
            eventually("the DENY on every node", || Ok(metadata_code(n)? == 29))
                .with_context(|| format!("added via {via}, read on {n}"))?;
        }
        delete_acls(&mut c, p, &deny)?;
        for n in &nodes {
            eventually("the DENY removed on every node", || {
                Ok(metadata_code(n)? == 0)
            })
            .with_context(|| format!("removed via {via}, read on {n}"))?;
        }
    }
    Ok(())
}
