//! gregor's KIP-631 metadata records (`gregor_protocol::metadata_records`) against the
//! reference Apache Kafka (gregor issue 10, item 1): Kafka's own tools are the oracle.
//!
//! - `kafka_dump_log_reads_every_record_we_write`: a `__cluster_metadata` segment and a
//!   snapshot holding every metadata record type at every version, plus KRaft control records,
//!   written by gregor and read by `kafka-dump-log --cluster-metadata-decoder`: every record
//!   shows with its fields, and no decode error.
//! - `a_kafka_controller_starts_from_a_log_gregor_wrote`: Kafka starts on a metadata log
//!   gregor wrote, serves the topic it holds, and appends to it.
//! - `regenerate_kafka_cluster_metadata_fixture` (ignored; run it by name to refresh the
//!   fixture): starts Kafka, creates, alters and deletes topics, configs, quotas, SCRAM
//!   credentials and ACLs, produces once, stops Kafka and copies its metadata log, its
//!   bootstrap snapshot (`00000000000000000000-0000000000.checkpoint`, what 4.4's
//!   `kafka-storage format` writes) and newest snapshot to
//!   `crates/protocol/tests/data/kraft-4.4.0/`, which
//!   `crates/protocol/tests/metadata_log_fixture.rs` decodes.
//!
//! - `regenerate_kafka_standalone_quorum_fixture` (ignored): the same for a dynamic quorum
//!   (`kafka-storage format --standalone`), into `crates/protocol/tests/data/kraft-4.4.0-standalone/`.
//!
//! They skip, saying so, only when the Kafka jars cannot be fetched (`cargo xtask kafka fetch`
//! needs Maven and Maven Central or a filled `~/.m2`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gregor_protocol::kafka_protocol::messages::voters_record::{
    Endpoint, KRaftVersionFeature, Voter,
};
use gregor_protocol::kafka_protocol::messages::{
    KRaftVersionRecord, LeaderChangeMessage, SnapshotFooterRecord, SnapshotHeaderRecord,
    VotersRecord,
};
use gregor_protocol::kafka_protocol::protocol::StrBytes;
use gregor_protocol::metadata_records::log::{
    build_control_batch, build_metadata_batch, BatchRecords, ControlRecord, MetadataLogBatches,
};
use gregor_protocol::metadata_records::*;
use gregor_tests::process::{free_port, repo_root, ChildGuard};
use gregor_tests::reference::{self, tool_command, Instance};
use uuid::Uuid;

const TOPIC_ID: u128 = 0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10;
const TOPIC_ID_JSON: &str = "AQIDBAUGBwgJCgsMDQ4PEA";
const DIR_A: u128 = 0x1111_1111_2222_2222_3333_3333_4444_4444;
const DIR_A_JSON: &str = "ERERESIiIiIzMzMzRERERA";
const DIR_B: u128 = 0x5555_5555_6666_6666_7777_7777_8888_8888;
const DIR_B_JSON: &str = "VVVVVWZmZmZ3d3d3iIiIiA";
const ACL_ID: u128 = 0x9999_9999_aaaa_aaaa_bbbb_bbbb_cccc_cccc;
const ACL_ID_JSON: &str = "mZmZmaqqqqq7u7u7zMzMzA";

fn uuid(n: u128) -> Uuid {
    Uuid::from_u128(n)
}

/// One record with distinctive values, and what Kafka's JSON converter must print for it:
/// `(fragment, lowest version that has the field)`.
type Sample = (MetadataRecord, Vec<(String, i16)>);

fn frags(all: &[(&str, i16)]) -> Vec<(String, i16)> {
    all.iter().map(|(f, v)| ((*f).to_string(), *v)).collect()
}

#[allow(clippy::too_many_lines)]
fn samples() -> Vec<Sample> {
    let dirs_json = format!("[\"{DIR_A_JSON}\",\"{DIR_B_JSON}\",\"{DIR_A_JSON}\"]");
    vec![
        (
            RegisterBrokerRecord {
                broker_id: 7,
                incarnation_id: uuid(DIR_A),
                broker_epoch: 42,
                end_points: vec![BrokerEndpoint {
                    name: "PLAINTEXT".into(),
                    host: "broker7.example".into(),
                    port: 9092,
                    security_protocol: 0,
                    ..BrokerEndpoint::default()
                }],
                features: vec![BrokerFeature {
                    name: "metadata.version".into(),
                    min_supported_version: 7,
                    max_supported_version: 27,
                    ..BrokerFeature::default()
                }],
                rack: Some("rack-a".into()),
                fenced: false,
                in_controlled_shutdown: true,
                log_dirs: vec![uuid(DIR_B)],
                cordoned_log_dirs: Some(vec![uuid(DIR_B)]),
                ..RegisterBrokerRecord::default()
            }
            .into(),
            frags(&[
                ("\"brokerId\":7", 0),
                (&format!("\"incarnationId\":\"{DIR_A_JSON}\""), 0),
                ("\"brokerEpoch\":42", 0),
                ("\"name\":\"PLAINTEXT\"", 0),
                ("\"host\":\"broker7.example\"", 0),
                ("\"port\":9092", 0),
                ("\"securityProtocol\":0", 0),
                ("\"minSupportedVersion\":7", 0),
                ("\"maxSupportedVersion\":27", 0),
                ("\"rack\":\"rack-a\"", 0),
                ("\"fenced\":false", 0),
                ("\"inControlledShutdown\":true", 1),
                ("\"isMigratingZkBroker\":false", 2),
                (&format!("\"logDirs\":[\"{DIR_B_JSON}\"]"), 3),
                (&format!("\"cordonedLogDirs\":[\"{DIR_B_JSON}\"]"), 4),
            ]),
        ),
        (
            UnregisterBrokerRecord {
                broker_id: 7,
                broker_epoch: 42,
                ..Default::default()
            }
            .into(),
            frags(&[("\"brokerId\":7", 0), ("\"brokerEpoch\":42", 0)]),
        ),
        (
            TopicRecord {
                name: "gregor-orders".into(),
                topic_id: uuid(TOPIC_ID),
                ..Default::default()
            }
            .into(),
            frags(&[
                ("\"name\":\"gregor-orders\"", 0),
                (&format!("\"topicId\":\"{TOPIC_ID_JSON}\""), 0),
            ]),
        ),
        (
            PartitionRecord {
                partition_id: 2,
                topic_id: uuid(TOPIC_ID),
                replicas: vec![7, 8, 9],
                isr: vec![7, 8],
                removing_replicas: vec![9],
                adding_replicas: vec![10],
                leader: 7,
                leader_recovery_state: 1,
                leader_epoch: 5,
                partition_epoch: 11,
                directories: vec![uuid(DIR_A), uuid(DIR_B), uuid(DIR_A)],
                eligible_leader_replicas: Some(vec![8]),
                last_known_elr: Some(vec![9]),
                ..Default::default()
            }
            .into(),
            frags(&[
                ("\"partitionId\":2", 0),
                (&format!("\"topicId\":\"{TOPIC_ID_JSON}\""), 0),
                ("\"replicas\":[7,8,9]", 0),
                ("\"isr\":[7,8]", 0),
                ("\"removingReplicas\":[9]", 0),
                ("\"addingReplicas\":[10]", 0),
                ("\"leader\":7", 0),
                ("\"leaderRecoveryState\":1", 0),
                ("\"leaderEpoch\":5", 0),
                ("\"partitionEpoch\":11", 0),
                (&format!("\"directories\":{dirs_json}"), 1),
                ("\"eligibleLeaderReplicas\":[8]", 2),
                ("\"lastKnownElr\":[9]", 2),
            ]),
        ),
        (
            ConfigRecord {
                resource_type: config_resource_type::TOPIC,
                resource_name: "gregor-orders".into(),
                name: "retention.ms".into(),
                value: Some("3600000".into()),
                ..Default::default()
            }
            .into(),
            frags(&[
                ("\"resourceType\":2", 0),
                ("\"resourceName\":\"gregor-orders\"", 0),
                ("\"name\":\"retention.ms\"", 0),
                ("\"value\":\"3600000\"", 0),
            ]),
        ),
        (
            PartitionChangeRecord {
                partition_id: 2,
                topic_id: uuid(TOPIC_ID),
                isr: Some(vec![7]),
                leader: 8,
                replicas: Some(vec![7, 8]),
                removing_replicas: Some(vec![]),
                adding_replicas: None,
                leader_recovery_state: 0,
                directories: Some(vec![uuid(DIR_A), uuid(DIR_B), uuid(DIR_A)]),
                eligible_leader_replicas: Some(vec![7]),
                last_known_elr: Some(vec![]),
                ..Default::default()
            }
            .into(),
            frags(&[
                ("\"partitionId\":2", 0),
                (&format!("\"topicId\":\"{TOPIC_ID_JSON}\""), 0),
                ("\"isr\":[7]", 0),
                ("\"leader\":8", 0),
                ("\"replicas\":[7,8]", 0),
                ("\"removingReplicas\":[]", 0),
                ("\"leaderRecoveryState\":0", 0),
                (&format!("\"directories\":{dirs_json}"), 1),
                ("\"eligibleLeaderReplicas\":[7]", 2),
                ("\"lastKnownElr\":[]", 2),
            ]),
        ),
        (
            FenceBrokerRecord {
                id: 7,
                epoch: 42,
                ..Default::default()
            }
            .into(),
            frags(&[("\"id\":7", 0), ("\"epoch\":42", 0)]),
        ),
        (
            UnfenceBrokerRecord {
                id: 8,
                epoch: 43,
                ..Default::default()
            }
            .into(),
            frags(&[("\"id\":8", 0), ("\"epoch\":43", 0)]),
        ),
        (
            RemoveTopicRecord {
                topic_id: uuid(TOPIC_ID),
                ..Default::default()
            }
            .into(),
            frags(&[(&format!("\"topicId\":\"{TOPIC_ID_JSON}\""), 0)]),
        ),
        (
            DelegationTokenRecord {
                owner: "User:alice".into(),
                requester: "User:bob".into(),
                renewers: vec!["User:carol".into()],
                issue_timestamp: 1_000,
                max_timestamp: 2_000,
                expiration_timestamp: 1_500,
                token_id: "token-1".into(),
                ..Default::default()
            }
            .into(),
            frags(&[
                ("\"owner\":\"User:alice\"", 0),
                ("\"requester\":\"User:bob\"", 0),
                ("\"renewers\":[\"User:carol\"]", 0),
                ("\"issueTimestamp\":1000", 0),
                ("\"maxTimestamp\":2000", 0),
                ("\"expirationTimestamp\":1500", 0),
                ("\"tokenId\":\"token-1\"", 0),
            ]),
        ),
        (
            UserScramCredentialRecord {
                name: "alice".into(),
                mechanism: 1,
                salt: b"salt".to_vec(),
                stored_key: b"stored-key".to_vec(),
                server_key: b"server-key".to_vec(),
                iterations: 4096,
                ..Default::default()
            }
            .into(),
            frags(&[
                ("\"name\":\"alice\"", 0),
                ("\"mechanism\":1", 0),
                ("\"salt\":\"c2FsdA==\"", 0),
                ("\"storedKey\":\"c3RvcmVkLWtleQ==\"", 0),
                ("\"serverKey\":\"c2VydmVyLWtleQ==\"", 0),
                ("\"iterations\":4096", 0),
            ]),
        ),
        (
            FeatureLevelRecord {
                name: "metadata.version".into(),
                feature_level: 27,
                ..Default::default()
            }
            .into(),
            frags(&[
                ("\"name\":\"metadata.version\"", 0),
                ("\"featureLevel\":27", 0),
            ]),
        ),
        (
            ClientQuotaRecord {
                entity: vec![
                    EntityData {
                        entity_type: "user".into(),
                        entity_name: Some("alice".into()),
                        ..Default::default()
                    },
                    EntityData {
                        entity_type: "client-id".into(),
                        entity_name: None,
                        ..Default::default()
                    },
                ],
                key: "producer_byte_rate".into(),
                value: 1024.5,
                remove: false,
                ..Default::default()
            }
            .into(),
            frags(&[
                ("\"entityType\":\"user\"", 0),
                ("\"entityName\":\"alice\"", 0),
                ("\"entityType\":\"client-id\"", 0),
                ("\"entityName\":null", 0),
                ("\"key\":\"producer_byte_rate\"", 0),
                ("\"value\":1024.5", 0),
                ("\"remove\":false", 0),
            ]),
        ),
        (
            ProducerIdsRecord {
                broker_id: 7,
                broker_epoch: 42,
                next_producer_id: 5_000,
                ..Default::default()
            }
            .into(),
            frags(&[
                ("\"brokerId\":7", 0),
                ("\"brokerEpoch\":42", 0),
                ("\"nextProducerId\":5000", 0),
            ]),
        ),
        (
            BrokerRegistrationChangeRecord {
                broker_id: 7,
                broker_epoch: 42,
                fenced: -1,
                in_controlled_shutdown: 1,
                log_dirs: vec![uuid(DIR_A)],
                cordoned_log_dirs: Some(vec![uuid(DIR_B)]),
                ..Default::default()
            }
            .into(),
            frags(&[
                ("\"brokerId\":7", 0),
                ("\"brokerEpoch\":42", 0),
                ("\"fenced\":-1", 0),
                ("\"inControlledShutdown\":1", 1),
                (&format!("\"logDirs\":[\"{DIR_A_JSON}\"]"), 2),
                (&format!("\"cordonedLogDirs\":[\"{DIR_B_JSON}\"]"), 3),
            ]),
        ),
        (
            AccessControlEntryRecord {
                id: uuid(ACL_ID),
                resource_type: 2,
                resource_name: "gregor-orders".into(),
                pattern_type: 3,
                principal: "User:alice".into(),
                host: "*".into(),
                operation: 3,
                permission_type: 3,
                ..Default::default()
            }
            .into(),
            frags(&[
                (&format!("\"id\":\"{ACL_ID_JSON}\""), 0),
                ("\"resourceType\":2", 0),
                ("\"resourceName\":\"gregor-orders\"", 0),
                ("\"patternType\":3", 0),
                ("\"principal\":\"User:alice\"", 0),
                ("\"host\":\"*\"", 0),
                ("\"operation\":3", 0),
                ("\"permissionType\":3", 0),
            ]),
        ),
        (
            RemoveAccessControlEntryRecord {
                id: uuid(ACL_ID),
                ..Default::default()
            }
            .into(),
            frags(&[(&format!("\"id\":\"{ACL_ID_JSON}\""), 0)]),
        ),
        (NoOpRecord::default().into(), frags(&[("\"data\":{}", 0)])),
        (
            ZkMigrationStateRecord {
                zk_migration_state: 3,
                ..Default::default()
            }
            .into(),
            frags(&[("\"zkMigrationState\":3", 0)]),
        ),
        (
            RemoveUserScramCredentialRecord {
                name: "alice".into(),
                mechanism: 2,
                ..Default::default()
            }
            .into(),
            frags(&[("\"name\":\"alice\"", 0), ("\"mechanism\":2", 0)]),
        ),
        (
            BeginTransactionRecord {
                name: Some("txn-1".into()),
                ..Default::default()
            }
            .into(),
            frags(&[("\"name\":\"txn-1\"", 0)]),
        ),
        (
            EndTransactionRecord::default().into(),
            frags(&[("\"data\":{}", 0)]),
        ),
        (
            AbortTransactionRecord {
                reason: Some("aborted by a test".into()),
                ..Default::default()
            }
            .into(),
            frags(&[("\"reason\":\"aborted by a test\"", 0)]),
        ),
        (
            RemoveDelegationTokenRecord {
                token_id: "token-1".into(),
                ..Default::default()
            }
            .into(),
            frags(&[("\"tokenId\":\"token-1\"", 0)]),
        ),
        (
            RegisterControllerRecord {
                controller_id: 3000,
                incarnation_id: uuid(DIR_A),
                zk_migration_ready: false,
                end_points: vec![ControllerEndpoint {
                    name: "CONTROLLER".into(),
                    host: "controller.example".into(),
                    port: 9093,
                    security_protocol: 0,
                    ..Default::default()
                }],
                features: vec![ControllerFeature {
                    name: "kraft.version".into(),
                    min_supported_version: 0,
                    max_supported_version: 1,
                    ..Default::default()
                }],
                ..Default::default()
            }
            .into(),
            frags(&[
                ("\"controllerId\":3000", 0),
                (&format!("\"incarnationId\":\"{DIR_A_JSON}\""), 0),
                ("\"zkMigrationReady\":false", 0),
                ("\"name\":\"CONTROLLER\"", 0),
                ("\"host\":\"controller.example\"", 0),
                ("\"port\":9093", 0),
                ("\"name\":\"kraft.version\"", 0),
                ("\"maxSupportedVersion\":1", 0),
            ]),
        ),
        (
            ClearElrRecord {
                topic_name: "gregor-orders".into(),
                ..Default::default()
            }
            .into(),
            frags(&[("\"topicName\":\"gregor-orders\"", 0)]),
        ),
        (
            UnregisterControllerRecord {
                controller_id: 3000,
                ..Default::default()
            }
            .into(),
            frags(&[("\"controllerId\":3000", 0)]),
        ),
    ]
}

/// `TopicRecord` -> `TOPIC_RECORD`, as Kafka's `MetadataRecordType` names it.
fn kafka_type_name(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

/// Every sample at every version of its schema, with the fragments that version must show.
fn every_record_at_every_version() -> Vec<(ApiMessageAndVersion, Vec<String>)> {
    let samples = samples();
    let types: Vec<u16> = samples.iter().map(|(r, _)| r.api_key()).collect();
    for t in &METADATA_RECORD_TYPES {
        assert!(
            types.contains(&t.api_key),
            "no sample of {} (api key {})",
            t.name,
            t.api_key
        );
    }
    let mut out = Vec::new();
    for (record, fragments) in samples {
        let t = record.record_type();
        for version in t.lowest_version..=t.highest_version {
            let mut r = record.clone();
            r.clear_absent_fields(version);
            let mut expected = vec![
                format!("\"type\":\"{}\"", kafka_type_name(t.name)),
                format!("\"version\":{version}"),
            ];
            expected.extend(
                fragments
                    .iter()
                    .filter(|(_, since)| *since <= version)
                    .map(|(f, _)| f.clone()),
            );
            out.push((ApiMessageAndVersion::new(r, version), expected));
        }
    }
    out
}

fn voters_record() -> VotersRecord {
    VotersRecord::default().with_voters(vec![Voter::default()
        .with_voter_id(3000.into())
        .with_voter_directory_id(uuid(DIR_B))
        .with_endpoints(vec![Endpoint::default()
            .with_name(StrBytes::from_static_str("CONTROLLER"))
            .with_host(StrBytes::from_static_str("controller.example"))
            .with_port(9093)])
        .with_k_raft_version_feature(
            KRaftVersionFeature::default()
                .with_min_supported_version(0)
                .with_max_supported_version(1),
        )])
}

/// The payload lines of a dump, in offset order.
fn payloads(dump: &str) -> Vec<&str> {
    dump.lines()
        .filter_map(|l| l.split_once(" payload: ").map(|(_, p)| p))
        .collect()
}

fn check_payloads(dump: &str, expected: &[(ApiMessageAndVersion, Vec<String>)]) {
    let got = payloads(dump);
    assert_eq!(
        got.len(),
        expected.len(),
        "kafka-dump-log shows {} metadata records, we wrote {}:\n{dump}",
        got.len(),
        expected.len()
    );
    for (line, (record, fragments)) in got.iter().zip(expected) {
        for f in fragments {
            assert!(
                line.contains(f.as_str()),
                "{} v{}: kafka-dump-log's {line} lacks {f}",
                record.record.record_type().name,
                record.version
            );
        }
    }
}

#[test]
fn kafka_dump_log_reads_every_record_we_write() {
    if !reference::jars_or_skip() {
        return;
    }
    let records = every_record_at_every_version();
    let dir = tempfile::tempdir().expect("a temp dir");
    let log_dir = dir.path().join("__cluster_metadata-0");
    std::fs::create_dir_all(&log_dir).expect("the log dir");

    // A segment: a leader's control batch, then one data batch per record type.
    let control = vec![
        ControlRecord::LeaderChange(LeaderChangeMessage::default().with_leader_id(3000.into())),
        ControlRecord::KRaftVersion(KRaftVersionRecord::default().with_k_raft_version(1)),
        ControlRecord::KRaftVoters(voters_record()),
    ];
    let mut segment = build_control_batch(0, 1, 1_700_000_000_000, &control).expect("control");
    let mut offset = i64::try_from(control.len()).expect("a small count");
    let mut start = 0;
    while start < records.len() {
        let api_key = records[start].0.record.api_key();
        let end = records[start..]
            .iter()
            .position(|(r, _)| r.record.api_key() != api_key)
            .map_or(records.len(), |n| start + n);
        let batch: Vec<ApiMessageAndVersion> =
            records[start..end].iter().map(|(r, _)| r.clone()).collect();
        segment.extend(
            build_metadata_batch(offset, 1, 1_700_000_000_001, &batch).expect("a data batch"),
        );
        offset += i64::try_from(batch.len()).expect("a small count");
        start = end;
    }
    let log = log_dir.join("00000000000000000000.log");
    std::fs::write(&log, &segment).expect("writing the segment");
    let dump = reference::dump_cluster_metadata(&log).expect("kafka-dump-log reads the file");
    check_payloads(&dump, &records);
    assert!(
        dump.contains("LeaderChange: {\"version\":0,\"leaderId\":3000"),
        "{dump}"
    );
    assert!(
        dump.contains("KRaftVersion {\"version\":0,\"kRaftVersion\":1}"),
        "{dump}"
    );
    assert!(
        dump.contains("KRaftVoters") && dump.contains("\"voterId\":3000"),
        "{dump}"
    );
    assert!(dump.contains("\"host\":\"controller.example\""), "{dump}");

    // A snapshot: header, the records, footer.
    let mut snapshot = build_control_batch(
        0,
        1,
        1_700_000_000_000,
        &[ControlRecord::SnapshotHeader(
            SnapshotHeaderRecord::default().with_last_contained_log_timestamp(1_700_000_000_000),
        )],
    )
    .expect("header");
    let all: Vec<ApiMessageAndVersion> = records.iter().map(|(r, _)| r.clone()).collect();
    snapshot.extend(build_metadata_batch(1, 1, 1_700_000_000_000, &all).expect("records"));
    let end = 1 + i64::try_from(all.len()).expect("a small count");
    snapshot.extend(
        build_control_batch(
            end,
            1,
            1_700_000_000_000,
            &[ControlRecord::SnapshotFooter(
                SnapshotFooterRecord::default(),
            )],
        )
        .expect("footer"),
    );
    let checkpoint = log_dir.join(format!("{end:020}-{:010}.checkpoint", 1));
    std::fs::write(&checkpoint, &snapshot).expect("writing the snapshot");
    let dump =
        reference::dump_cluster_metadata(&checkpoint).expect("kafka-dump-log reads the file");
    check_payloads(&dump, &records);
    assert!(
        dump.contains("SnapshotHeader {\"version\":0,\"lastContainedLogTimestamp\":1700000000000}"),
        "{dump}"
    );
    assert!(dump.contains("SnapshotFooter {\"version\":0}"), "{dump}");
}

/// A Kafka controller and broker start on a `__cluster_metadata` log gregor wrote (a leader's
/// LeaderChange, the bootstrap feature levels in a metadata transaction, a topic with two
/// partitions and a config), serve that topic as described, and append to the log; the whole
/// log, gregor's batches and Kafka's, then decodes.
#[test]
fn a_kafka_controller_starts_from_a_log_gregor_wrote() {
    if !reference::jars_or_skip() {
        return;
    }
    let port = free_port().expect("a free port");
    let instance = Instance::new(port, None, None).expect("an instance");
    instance.format().expect("kafka-storage format");
    let log_dir = instance.data_dir.join("__cluster_metadata-0");
    assert!(
        log_dir.is_dir(),
        "kafka-storage format made {}",
        log_dir.display()
    );

    let now_ms = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_millis(),
    )
    .expect("a timestamp");
    let epoch = 1;
    let voter = |id: i32| {
        gregor_protocol::kafka_protocol::messages::leader_change_message::Voter::default()
            .with_voter_id(id)
    };
    let mut segment = build_control_batch(
        0,
        epoch,
        now_ms,
        &[ControlRecord::LeaderChange(
            LeaderChangeMessage::default()
                .with_leader_id(1.into())
                .with_voters(vec![voter(1)])
                .with_granting_voters(vec![voter(1)]),
        )],
    )
    .expect("control batch");
    let feature = |name: &str, level: i16| {
        ApiMessageAndVersion::new(
            FeatureLevelRecord {
                name: name.into(),
                feature_level: level,
                ..Default::default()
            },
            0,
        )
    };
    let bootstrap = vec![
        ApiMessageAndVersion::new(
            BeginTransactionRecord {
                name: Some("Bootstrap records".into()),
                ..Default::default()
            },
            0,
        ),
        feature("metadata.version", 33),
        feature("eligible.leader.replicas.version", 1),
        feature("group.version", 1),
        feature("share.version", 2),
        feature("streams.version", 1),
        feature("transaction.version", 2),
        ApiMessageAndVersion::new(EndTransactionRecord::default(), 0),
    ];
    segment.extend(build_metadata_batch(1, epoch, now_ms, &bootstrap).expect("bootstrap"));
    let mut topic = vec![ApiMessageAndVersion::latest(TopicRecord {
        name: "made-by-gregor".into(),
        topic_id: uuid(TOPIC_ID),
        ..Default::default()
    })];
    for partition_id in 0..2 {
        topic.push(ApiMessageAndVersion::latest(PartitionRecord {
            partition_id,
            topic_id: uuid(TOPIC_ID),
            replicas: vec![1],
            isr: vec![1],
            leader: 1,
            leader_epoch: 0,
            partition_epoch: 0,
            // DirectoryId.UNASSIGNED: the broker picks its log dir and reports it.
            directories: vec![Uuid::nil()],
            ..Default::default()
        }));
    }
    topic.push(ApiMessageAndVersion::latest(ConfigRecord {
        resource_type: config_resource_type::TOPIC,
        resource_name: "made-by-gregor".into(),
        name: "retention.ms".into(),
        value: Some("123456789".into()),
        ..Default::default()
    }));
    let base = 1 + i64::try_from(bootstrap.len()).expect("small");
    segment.extend(build_metadata_batch(base, epoch, now_ms, &topic).expect("topic"));
    let log = log_dir.join("00000000000000000000.log");
    std::fs::write(&log, &segment).expect("writing the segment");

    let child = instance.start().expect("starting Kafka");
    let mut guard = ChildGuard::new("kafka", child);
    instance
        .wait_ready(|| guard.check_alive())
        .expect("Kafka ready on gregor's metadata log");
    let bs = instance.bootstrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let describe = loop {
        let out = reference::tool_output(
            "kafka-topics",
            &[
                "--bootstrap-server",
                &bs,
                "--describe",
                "--topic",
                "made-by-gregor",
            ],
        )
        .expect("kafka-topics");
        if out.contains("PartitionCount: 2") && out.contains("Leader: 1") {
            break out;
        }
        assert!(
            Instant::now() < deadline,
            "Kafka does not describe gregor's topic:\n{out}\n{}",
            std::fs::read_to_string(instance.server_log()).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_secs(1));
    };
    eprintln!("{describe}");
    assert!(
        describe.contains(&format!("TopicId: {TOPIC_ID_JSON}")),
        "{describe}"
    );
    assert!(describe.contains("retention.ms=123456789"), "{describe}");
    guard.stop().expect("stopping Kafka");

    // Kafka appended to gregor's log: the broker's registration, its own leader change.
    let buf = std::fs::read(&log).expect("the log after Kafka ran");
    assert!(buf.len() > segment.len(), "Kafka appended nothing");
    assert_eq!(
        &buf[..segment.len()],
        &segment[..],
        "Kafka kept gregor's batches"
    );
    let mut kinds = Vec::new();
    for batch in MetadataLogBatches::new(&buf) {
        let batch = batch.expect("every batch of the log decodes");
        if let BatchRecords::Metadata(records) = batch.records {
            kinds.extend(records.into_iter().map(|r| r.record.record_type().name));
        }
    }
    assert!(kinds.contains(&"RegisterBrokerRecord"), "{kinds:?}");
    let _ = std::fs::remove_dir_all(&instance.data_dir);
}

fn run_tool(tool: &str, args: &[&str], stdin: Option<&str>) {
    let mut cmd = tool_command(
        tool,
        &args.iter().map(|a| (*a).to_string()).collect::<Vec<_>>(),
    )
    .expect("a Kafka tool command");
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("starting a Kafka tool");
    if let Some(input) = stdin {
        use std::io::Write as _;
        let mut pipe = child.stdin.take().expect("stdin");
        pipe.write_all(input.as_bytes()).expect("writing stdin");
    }
    let out = child.wait_with_output().expect("the tool finishes");
    assert!(
        out.status.success(),
        "{tool} {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn fixture_dir() -> PathBuf {
    repo_root().join("crates/protocol/tests/data/kraft-4.4.0")
}

/// Refreshes `crates/protocol/tests/data/kraft-4.4.0/` from a real Kafka controller:
/// `cargo test -p gregor-tests --test kraft_metadata_records -- --ignored regenerate`.
/// The operations below are what `crates/protocol/tests/metadata_log_fixture.rs` expects.
#[test]
#[ignore = "rewrites a committed fixture; run by name"]
fn regenerate_kafka_cluster_metadata_fixture() {
    assert!(
        reference::jars_or_skip(),
        "the Kafka jars are needed to regenerate the fixture"
    );
    let port = free_port().expect("a free port");
    let mut instance = Instance::new(port, None, None).expect("an instance");
    instance.extra_properties = vec![
        // ACLs are records only with KRaft's authorizer; the tools connect as ANONYMOUS.
        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer".into(),
        "super.users=User:ANONYMOUS".into(),
        // A snapshot soon after the changes, so the fixture has one.
        "metadata.log.max.snapshot.interval.ms=4000".into(),
    ];
    let child = instance.spawn().expect("starting Kafka");
    let mut guard = ChildGuard::new("kafka", child);
    instance
        .wait_ready(|| guard.check_alive())
        .expect("Kafka ready");
    let bs = instance.bootstrap();
    let bs = bs.as_str();
    run_tool(
        "kafka-topics",
        &[
            "--bootstrap-server",
            bs,
            "--create",
            "--topic",
            "orders",
            "--partitions",
            "3",
            "--replication-factor",
            "1",
            "--config",
            "cleanup.policy=compact",
            "--config",
            "retention.ms=86400000",
        ],
        None,
    );
    run_tool(
        "kafka-topics",
        &[
            "--bootstrap-server",
            bs,
            "--create",
            "--topic",
            "payments",
            "--partitions",
            "2",
            "--replication-factor",
            "1",
        ],
        None,
    );
    run_tool(
        "kafka-configs",
        &[
            "--bootstrap-server",
            bs,
            "--alter",
            "--entity-type",
            "topics",
            "--entity-name",
            "orders",
            "--add-config",
            "retention.ms=3600000",
        ],
        None,
    );
    run_tool(
        "kafka-configs",
        &[
            "--bootstrap-server",
            bs,
            "--alter",
            "--entity-type",
            "topics",
            "--entity-name",
            "orders",
            "--delete-config",
            "cleanup.policy",
        ],
        None,
    );
    run_tool(
        "kafka-configs",
        &[
            "--bootstrap-server",
            bs,
            "--alter",
            "--entity-type",
            "brokers",
            "--entity-default",
            "--add-config",
            "log.retention.ms=604800000",
        ],
        None,
    );
    run_tool(
        "kafka-configs",
        &[
            "--bootstrap-server",
            bs,
            "--alter",
            "--entity-type",
            "users",
            "--entity-name",
            "alice",
            "--add-config",
            "producer_byte_rate=1024",
        ],
        None,
    );
    run_tool(
        "kafka-configs",
        &[
            "--bootstrap-server",
            bs,
            "--alter",
            "--entity-type",
            "users",
            "--entity-name",
            "alice",
            "--add-config",
            "SCRAM-SHA-256=[iterations=4096,password=alice-secret]",
        ],
        None,
    );
    run_tool(
        "kafka-acls",
        &[
            "--bootstrap-server",
            bs,
            "--add",
            "--allow-principal",
            "User:alice",
            "--operation",
            "Read",
            "--topic",
            "orders",
        ],
        None,
    );
    run_tool(
        "kafka-acls",
        &[
            "--bootstrap-server",
            bs,
            "--remove",
            "--force",
            "--allow-principal",
            "User:alice",
            "--operation",
            "Read",
            "--topic",
            "orders",
        ],
        None,
    );
    run_tool(
        "kafka-topics",
        &["--bootstrap-server", bs, "--delete", "--topic", "payments"],
        None,
    );
    // An idempotent producer: its InitProducerId makes the controller hand out a block of
    // producer ids (ProducerIdsRecord).
    run_tool(
        "kafka-console-producer",
        &["--bootstrap-server", bs, "--topic", "orders"],
        Some("hello\n"),
    );
    // Let a snapshot cover all of it (metadata.log.max.snapshot.interval.ms above).
    std::thread::sleep(Duration::from_secs(6));
    guard.stop().expect("stopping Kafka");

    copy_fixture(&instance, &fixture_dir(), true);
}

/// Copies a stopped instance's metadata log, its bootstrap snapshot and (`with_snapshot`) its
/// newest snapshot into `out`, replacing what was there, then removes the data dir.
fn copy_fixture(instance: &Instance, out: &Path, with_snapshot: bool) {
    let src = instance.data_dir.join("__cluster_metadata-0");
    if out.exists() {
        std::fs::remove_dir_all(out).expect("clearing the old fixture");
    }
    std::fs::create_dir_all(out).expect("the fixture dir");
    let mut checkpoints: Vec<PathBuf> = std::fs::read_dir(&src)
        .expect("the metadata log dir")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "checkpoint"))
        .collect();
    checkpoints.sort();
    // Kafka 4.4's `kafka-storage format` writes the bootstrap metadata as the snapshot
    // 00000000000000000000-0000000000.checkpoint (older releases wrote bootstrap.checkpoint
    // next to meta.properties, copied too if present); the newest snapshot holds the image.
    let bootstrap = checkpoints.first().expect("the bootstrap snapshot").clone();
    let mut files = vec![src.join("00000000000000000000.log"), bootstrap.clone()];
    if with_snapshot {
        let newest = checkpoints.last().expect("Kafka wrote a snapshot").clone();
        assert_ne!(
            bootstrap, newest,
            "Kafka wrote no snapshot after the changes"
        );
        files.push(newest);
    }
    let legacy = instance.data_dir.join("bootstrap.checkpoint");
    if legacy.exists() {
        files.push(legacy);
    }
    for file in files {
        let to = out.join(file.file_name().expect("a name"));
        std::fs::copy(&file, &to).expect("copying");
        // Kafka makes snapshots read-only; the fixture must stay replaceable.
        let mut perms = std::fs::metadata(&to).expect("metadata").permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o644);
        std::fs::set_permissions(&to, perms).expect("chmod");
    }
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline && instance.data_dir.exists() {
        let _ = std::fs::remove_dir_all(&instance.data_dir);
    }
    eprintln!("fixture written to {}", out.display());
    let _ = Command::new("ls").arg("-l").arg(out).status();
}

/// Refreshes `crates/protocol/tests/data/kraft-4.4.0-standalone/`: a dynamic quorum (KIP-853,
/// `kafka-storage format --standalone`), whose bootstrap snapshot and log carry Kafka's own
/// KRaftVersion and KRaftVoters control records; one topic `events` is created.
/// `cargo test -p gregor-tests --test kraft_metadata_records -- --ignored regenerate`.
#[test]
#[ignore = "rewrites a committed fixture; run by name"]
fn regenerate_kafka_standalone_quorum_fixture() {
    assert!(
        reference::jars_or_skip(),
        "the Kafka jars are needed to regenerate the fixture"
    );
    let port = free_port().expect("a free port");
    let mut instance = Instance::new(port, None, None).expect("an instance");
    instance.standalone = true;
    let child = instance.spawn().expect("starting Kafka");
    let mut guard = ChildGuard::new("kafka", child);
    instance
        .wait_ready(|| guard.check_alive())
        .expect("Kafka ready");
    run_tool(
        "kafka-topics",
        &[
            "--bootstrap-server",
            &instance.bootstrap(),
            "--create",
            "--topic",
            "events",
            "--partitions",
            "1",
            "--replication-factor",
            "1",
        ],
        None,
    );
    guard.stop().expect("stopping Kafka");
    copy_fixture(
        &instance,
        &repo_root().join("crates/protocol/tests/data/kraft-4.4.0-standalone"),
        false,
    );
}
