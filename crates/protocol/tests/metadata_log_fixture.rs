//! The metadata log and snapshots a real Apache Kafka 4.4.0 controller wrote
//! (`tests/data/kraft-4.4.0/`), decoded by `gregor_protocol::metadata_records`.
//!
//! The fixture comes from `regenerate_kafka_cluster_metadata_fixture` in
//! `tests/tests/kraft_metadata_records.rs` (run it by name to refresh it): one KRaft node in
//! combined mode, formatted by `kafka-storage format` (static voter 1), then
//! - `kafka-topics --create orders` (3 partitions, `cleanup.policy=compact`,
//!   `retention.ms=86400000`) and `payments` (2 partitions);
//! - `kafka-configs`: `orders` `retention.ms=3600000`, delete `orders` `cleanup.policy`,
//!   cluster default `log.retention.ms=604800000`, user `alice` `producer_byte_rate=1024`
//!   and `SCRAM-SHA-256=[iterations=4096,...]`;
//! - `kafka-acls`: add then remove `User:alice` Read on topic `orders`;
//! - `kafka-topics --delete payments`; one idempotent produce (a producer id block);
//! - a snapshot (`metadata.log.max.snapshot.interval.ms=4000`), then a clean shutdown
//!   (controlled shutdown: ISR emptied into ELR, broker fenced).
//!
//! Files: `00000000000000000000.log` (the segment), `00000000000000000000-0000000000.checkpoint`
//! (the bootstrap snapshot 4.4's `kafka-storage format` writes) and the newest snapshot.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use gregor_protocol::batch::BatchHeader;
use gregor_protocol::metadata_records::log::{
    build_control_batch, build_metadata_batch, BatchRecords, ControlRecord, MetadataBatch,
    MetadataLogBatches,
};
use gregor_protocol::metadata_records::{
    config_resource_type, decode_framed, encode_framed, ApiMessageAndVersion, MetadataRecord,
};
use gregor_protocol::records::decode_records;
use uuid::Uuid;

/// The static-quorum fixture.
const STATIC: &str = "kraft-4.4.0";
/// The dynamic-quorum fixture (KIP-853, `kafka-storage format --standalone`): one topic
/// `events`, KRaftVersion and KRaftVoters control records in the bootstrap snapshot and log.
const STANDALONE: &str = "kraft-4.4.0-standalone";

fn path_in(dir: &str, name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(dir)
        .join(name)
}

fn path(name: &str) -> PathBuf {
    path_in(STATIC, name)
}

fn files_in(dir: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(path_in(dir, ""))
        .expect("the fixture directory")
        .map(|e| e.expect("an entry").path())
        .filter(|p| {
            p.extension()
                .is_some_and(|e| e == "log" || e == "checkpoint")
        })
        .collect();
    out.sort();
    out
}

fn files() -> Vec<PathBuf> {
    files_in(STATIC)
}

/// Every batch of a file; the file must decode to its end.
fn batches(file: &PathBuf) -> Vec<MetadataBatch> {
    let buf = std::fs::read(file).expect("a fixture file");
    let batches: Vec<MetadataBatch> = MetadataLogBatches::new(&buf)
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let end = batches
        .last()
        .map_or(0, |b| b.position + b.header.total_size());
    assert_eq!(
        end,
        buf.len(),
        "{}: bytes after the last batch",
        file.display()
    );
    batches
}

fn metadata(batches: &[MetadataBatch]) -> Vec<MetadataRecord> {
    batches
        .iter()
        .filter_map(|b| match &b.records {
            BatchRecords::Metadata(r) => Some(r.iter().map(|r| r.record.clone())),
            BatchRecords::Control(_) => None,
        })
        .flatten()
        .collect()
}

fn control(batches: &[MetadataBatch]) -> Vec<ControlRecord> {
    batches
        .iter()
        .filter_map(|b| match &b.records {
            BatchRecords::Control(r) => Some(r.iter().cloned()),
            BatchRecords::Metadata(_) => None,
        })
        .flatten()
        .collect()
}

fn feature_levels(records: &[MetadataRecord]) -> BTreeMap<String, i16> {
    records
        .iter()
        .filter_map(|r| match r {
            MetadataRecord::FeatureLevel(f) => Some((f.name.clone(), f.feature_level)),
            _ => None,
        })
        .collect()
}

/// What the records leave behind: topics by name (id, partitions) and the configs.
#[derive(Debug, Default)]
struct Image {
    topics: BTreeMap<Uuid, (String, BTreeSet<i32>)>,
    configs: BTreeMap<(i8, String, String), String>,
}

impl Image {
    fn apply(&mut self, r: &MetadataRecord) {
        match r {
            MetadataRecord::Topic(t) => {
                self.topics
                    .insert(t.topic_id, (t.name.clone(), BTreeSet::new()));
            }
            MetadataRecord::Partition(p) => {
                self.topics
                    .get_mut(&p.topic_id)
                    .expect("a partition of a known topic")
                    .1
                    .insert(p.partition_id);
            }
            MetadataRecord::RemoveTopic(t) => {
                let (name, _) = self.topics.remove(&t.topic_id).expect("a known topic");
                self.configs.retain(|(ty, res, _), _| {
                    !(*ty == config_resource_type::TOPIC && *res == name)
                });
            }
            MetadataRecord::Config(c) => {
                let key = (c.resource_type, c.resource_name.clone(), c.name.clone());
                match &c.value {
                    Some(v) => {
                        self.configs.insert(key, v.clone());
                    }
                    None => {
                        self.configs.remove(&key);
                    }
                }
            }
            _ => {}
        }
    }

    fn topics_by_name(&self) -> BTreeMap<String, Vec<i32>> {
        self.topics
            .values()
            .map(|(n, p)| (n.clone(), p.iter().copied().collect()))
            .collect()
    }

    fn config(&self, ty: i8, resource: &str, name: &str) -> Option<&str> {
        self.configs
            .get(&(ty, resource.to_string(), name.to_string()))
            .map(String::as_str)
    }
}

/// Kafka's bytes, record by record and batch by batch: each framed record re-encodes to the
/// bytes Kafka wrote, and each batch rebuilt from its decoded records is Kafka's batch.
#[test]
fn every_record_and_batch_kafka_wrote_re_encodes_byte_for_byte() {
    let mut records_checked = 0;
    for file in files_in(STATIC).into_iter().chain(files_in(STANDALONE)) {
        let buf = std::fs::read(&file).expect("a fixture file");
        for b in batches(&file) {
            let raw = &buf[b.position..b.position + b.header.total_size()];
            let h: BatchHeader = b.header;
            if !h.is_control() {
                for r in decode_records(raw).expect("records") {
                    let value = r.value.expect("a value");
                    let decoded = decode_framed(&value).expect("a metadata record");
                    assert_eq!(
                        encode_framed(&decoded).expect("re-encodes"),
                        value.as_ref(),
                        "{}: {decoded:?}",
                        file.display()
                    );
                    records_checked += 1;
                }
            }
            let rebuilt = match &b.records {
                BatchRecords::Metadata(r) => build_metadata_batch(
                    h.base_offset,
                    h.partition_leader_epoch,
                    h.base_timestamp,
                    r,
                ),
                BatchRecords::Control(r) => build_control_batch(
                    h.base_offset,
                    h.partition_leader_epoch,
                    h.base_timestamp,
                    r,
                ),
            }
            .expect("rebuilds");
            assert_eq!(
                rebuilt,
                raw,
                "{} batch at offset {} differs from Kafka's",
                file.display(),
                h.base_offset
            );
        }
    }
    assert!(records_checked > 100, "only {records_checked} records");
}

#[test]
fn the_bootstrap_snapshot_holds_the_feature_levels() {
    let b = batches(&path("00000000000000000000-0000000000.checkpoint"));
    let ctl = control(&b);
    assert!(matches!(ctl.first(), Some(ControlRecord::SnapshotHeader(h)) if h.version == 0));
    assert!(matches!(ctl.last(), Some(ControlRecord::SnapshotFooter(_))));
    assert!(b.first().is_some_and(|b| b.header.is_control()));
    assert!(b.last().is_some_and(|b| b.header.is_control()));
    let records = metadata(&b);
    assert!(records
        .iter()
        .all(|r| matches!(r, MetadataRecord::FeatureLevel(_))));
    // Kafka 4.4.0 formats new clusters at metadata.version 33 (4.4-IV2: the constants of
    // MetadataVersion count up from 3.3-IV3 = 7); the others are the
    // finalized levels of the features 4.4 turns on for a new cluster.
    let expected: BTreeMap<String, i16> = [
        ("metadata.version", 33),
        ("eligible.leader.replicas.version", 1),
        ("group.version", 1),
        ("share.version", 2),
        ("streams.version", 1),
        ("transaction.version", 2),
    ]
    .into_iter()
    .map(|(n, l)| (n.to_string(), l))
    .collect();
    assert_eq!(feature_levels(&records), expected);
}

#[test]
fn the_log_holds_what_the_controller_did() {
    let b = batches(&path("00000000000000000000.log"));
    // Offsets are contiguous from 0; KRaft epoch 1 throughout (one election).
    let mut next = 0;
    for batch in &b {
        assert_eq!(batch.header.base_offset, next);
        assert_eq!(batch.header.partition_leader_epoch, 1);
        next += i64::try_from(batch.records.len()).expect("small");
    }
    assert!(next > 100, "{next} records");
    let ctl = control(&b);
    let Some(ControlRecord::LeaderChange(lc)) = ctl.first() else {
        panic!("the log starts with a LeaderChange: {ctl:?}")
    };
    assert_eq!(lc.leader_id.0, 1);
    assert_eq!(
        lc.voters.iter().map(|v| v.voter_id).collect::<Vec<_>>(),
        [1]
    );

    let records = metadata(&b);
    // The bootstrap records are replayed into the log inside a metadata transaction.
    let MetadataRecord::BeginTransaction(begin) = &records[0] else {
        panic!("{:?}", records[0])
    };
    assert_eq!(begin.name.as_deref(), Some("Bootstrap records"));
    assert!(records
        .iter()
        .any(|r| matches!(r, MetadataRecord::EndTransaction(_))));
    assert_eq!(feature_levels(&records)["metadata.version"], 33);

    let controller = records
        .iter()
        .find_map(|r| match r {
            MetadataRecord::RegisterController(c) => Some(c),
            _ => None,
        })
        .expect("the controller registered");
    assert_eq!(controller.controller_id, 1);
    assert_eq!(controller.end_points[0].name, "CONTROLLER");
    assert_eq!(controller.end_points[0].host, "127.0.0.1");

    let broker = records
        .iter()
        .find_map(|r| match r {
            MetadataRecord::RegisterBroker(b) => Some(b),
            _ => None,
        })
        .expect("the broker registered");
    assert_eq!(broker.broker_id, 1);
    assert_eq!(broker.end_points[0].name, "PLAINTEXT");
    assert_eq!(broker.end_points[0].host, "127.0.0.1");
    assert_eq!(broker.log_dirs.len(), 1);
    assert!(broker
        .features
        .iter()
        .any(|f| f.name == "metadata.version" && f.max_supported_version >= 33));

    // Unfenced once caught up (-1), fenced (1) at shutdown, in controlled shutdown before.
    let changes: Vec<(i8, i8)> = records
        .iter()
        .filter_map(|r| match r {
            MetadataRecord::BrokerRegistrationChange(c) if c.broker_id == 1 => {
                Some((c.fenced, c.in_controlled_shutdown))
            }
            _ => None,
        })
        .collect();
    assert!(changes.contains(&(-1, 0)), "{changes:?}");
    assert!(changes.contains(&(0, 1)), "{changes:?}");
    assert_eq!(changes.last(), Some(&(1, 0)), "{changes:?}");

    let mut image = Image::default();
    let mut seen_payments = None;
    for r in &records {
        image.apply(r);
        if let Some(p) = image.topics_by_name().get("payments") {
            seen_payments = Some(p.clone());
        }
    }
    assert_eq!(seen_payments, Some(vec![0, 1]), "payments had 2 partitions");
    assert_eq!(
        image.topics_by_name(),
        BTreeMap::from([("orders".to_string(), vec![0, 1, 2])])
    );
    let topic = config_resource_type::TOPIC;
    let broker_ty = config_resource_type::BROKER;
    assert_eq!(
        image.config(topic, "orders", "retention.ms"),
        Some("3600000")
    );
    assert_eq!(image.config(topic, "orders", "cleanup.policy"), None);
    assert_eq!(
        image.config(broker_ty, "", "log.retention.ms"),
        Some("604800000")
    );
    assert_eq!(
        image.config(broker_ty, "", "min.insync.replicas"),
        Some("1")
    );
    // The creation's configs, then their changes, in order.
    let orders_configs: Vec<(String, Option<String>)> = records
        .iter()
        .filter_map(|r| match r {
            MetadataRecord::Config(c) if c.resource_name == "orders" => {
                Some((c.name.clone(), c.value.clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        orders_configs,
        [
            ("cleanup.policy".to_string(), Some("compact".to_string())),
            ("retention.ms".into(), Some("86400000".into())),
            ("retention.ms".into(), Some("3600000".into())),
            ("cleanup.policy".into(), None),
        ]
    );

    let quota = records
        .iter()
        .find_map(|r| match r {
            MetadataRecord::ClientQuota(q) => Some(q),
            _ => None,
        })
        .expect("a quota");
    assert_eq!(quota.entity.len(), 1);
    assert_eq!(quota.entity[0].entity_type, "user");
    assert_eq!(quota.entity[0].entity_name.as_deref(), Some("alice"));
    assert_eq!(
        (quota.key.as_str(), quota.value, quota.remove),
        ("producer_byte_rate", 1024.0, false)
    );

    let scram = records
        .iter()
        .find_map(|r| match r {
            MetadataRecord::UserScramCredential(s) => Some(s),
            _ => None,
        })
        .expect("a SCRAM credential");
    // Mechanism 1 is SCRAM-SHA-256; SHA-256 keys are 32 bytes.
    assert_eq!(
        (scram.name.as_str(), scram.mechanism, scram.iterations),
        ("alice", 1, 4096)
    );
    assert_eq!((scram.stored_key.len(), scram.server_key.len()), (32, 32));
    assert!(!scram.salt.is_empty());

    let acl = records
        .iter()
        .find_map(|r| match r {
            MetadataRecord::AccessControlEntry(a) => Some(a),
            _ => None,
        })
        .expect("an ACL");
    // TOPIC (2), LITERAL (3), READ (3), ALLOW (3).
    assert_eq!(
        (
            acl.resource_type,
            acl.resource_name.as_str(),
            acl.pattern_type,
            acl.principal.as_str(),
            acl.host.as_str(),
            acl.operation,
            acl.permission_type
        ),
        (2, "orders", 3, "User:alice", "*", 3, 3)
    );
    assert!(records
        .iter()
        .any(|r| matches!(r, MetadataRecord::RemoveAccessControlEntry(x) if x.id == acl.id)));

    let producer_ids: Vec<_> = records
        .iter()
        .filter_map(|r| match r {
            MetadataRecord::ProducerIds(p) => Some((p.broker_id, p.next_producer_id)),
            _ => None,
        })
        .collect();
    assert_eq!(
        producer_ids,
        [(1, 1000)],
        "one block of 1000 ids to broker 1"
    );

    // The controlled shutdown moved every orders partition's ISR into its ELR (KIP-966).
    let orders_id = image
        .topics
        .iter()
        .find(|(_, (n, _))| n == "orders")
        .map(|(id, _)| *id)
        .expect("orders");
    let elr_changes: Vec<i32> = records
        .iter()
        .filter_map(|r| match r {
            MetadataRecord::PartitionChange(c)
                if c.topic_id == orders_id
                    && c.leader == -1
                    && c.isr.as_deref() == Some(&[])
                    && c.eligible_leader_replicas.as_deref() == Some(&[1]) =>
            {
                Some(c.partition_id)
            }
            _ => None,
        })
        .collect();
    assert_eq!(elr_changes, [0, 1, 2]);
    assert!(records.iter().any(|r| matches!(r, MetadataRecord::NoOp(_))));
}

#[test]
fn the_snapshot_holds_the_image() {
    let snapshot = files()
        .into_iter()
        .rfind(|p| {
            p.extension().is_some_and(|e| e == "checkpoint")
                && !p.ends_with("00000000000000000000-0000000000.checkpoint")
        })
        .expect("a snapshot after the changes");
    let b = batches(&snapshot);
    let ctl = control(&b);
    assert!(matches!(
        ctl.first(),
        Some(ControlRecord::SnapshotHeader(_))
    ));
    assert!(matches!(ctl.last(), Some(ControlRecord::SnapshotFooter(_))));
    let records = metadata(&b);
    let mut image = Image::default();
    for r in &records {
        image.apply(r);
    }
    assert_eq!(
        image.topics_by_name(),
        BTreeMap::from([("orders".to_string(), vec![0, 1, 2])])
    );
    assert_eq!(
        image.config(config_resource_type::TOPIC, "orders", "retention.ms"),
        Some("3600000")
    );
    assert_eq!(feature_levels(&records)["metadata.version"], 33);
    assert!(records
        .iter()
        .any(|r| matches!(r, MetadataRecord::UserScramCredential(s) if s.name == "alice")));
    // A snapshot carries state, not history: no removals, no transactions, no no-ops.
    assert!(!records.iter().any(|r| matches!(
        r,
        MetadataRecord::RemoveTopic(_)
            | MetadataRecord::RemoveAccessControlEntry(_)
            | MetadataRecord::NoOp(_)
            | MetadataRecord::BeginTransaction(_)
    )));
}

#[test]
fn kafkas_records_are_written_at_the_versions_metadata_version_33_uses() {
    let records: Vec<ApiMessageAndVersion> = batches(&path("00000000000000000000.log"))
        .into_iter()
        .filter_map(|b| match b.records {
            BatchRecords::Metadata(r) => Some(r),
            BatchRecords::Control(_) => None,
        })
        .flatten()
        .collect();
    let version_of = |name: &str| -> BTreeSet<i16> {
        records
            .iter()
            .filter(|r| r.record.record_type().name == name)
            .map(|r| r.version)
            .collect()
    };
    assert_eq!(version_of("RegisterBrokerRecord"), BTreeSet::from([4]));
    assert_eq!(version_of("PartitionRecord"), BTreeSet::from([2]));
    assert_eq!(version_of("PartitionChangeRecord"), BTreeSet::from([2]));
    // Kafka writes each change at the lowest version that carries its fields.
    assert_eq!(
        version_of("BrokerRegistrationChangeRecord"),
        BTreeSet::from([0, 1, 3])
    );
}

#[test]
fn a_dynamic_quorum_writes_kraft_version_and_voters() {
    let check_voters = |ctl: &[ControlRecord]| -> Uuid {
        let version = ctl
            .iter()
            .find_map(|c| match c {
                ControlRecord::KRaftVersion(v) => Some(v.k_raft_version),
                _ => None,
            })
            .expect("a KRaftVersion record");
        assert_eq!(version, 1, "a dynamic quorum is kraft.version 1");
        let voters = ctl
            .iter()
            .find_map(|c| match c {
                ControlRecord::KRaftVoters(v) => Some(v),
                _ => None,
            })
            .expect("a KRaftVoters record");
        assert_eq!(voters.voters.len(), 1);
        let v = &voters.voters[0];
        assert_eq!(v.voter_id.0, 1);
        assert_eq!(v.endpoints.len(), 1);
        assert_eq!(v.endpoints[0].name.as_str(), "CONTROLLER");
        assert_eq!(v.endpoints[0].host.as_str(), "127.0.0.1");
        assert_eq!(
            (
                v.k_raft_version_feature.min_supported_version,
                v.k_raft_version_feature.max_supported_version
            ),
            (0, 1)
        );
        assert!(!v.voter_directory_id.is_nil());
        v.voter_directory_id
    };
    let bootstrap = batches(&path_in(
        STANDALONE,
        "00000000000000000000-0000000000.checkpoint",
    ));
    let ctl = control(&bootstrap);
    assert!(matches!(ctl[0], ControlRecord::SnapshotHeader(_)));
    let dir_id = check_voters(&ctl);
    assert_eq!(
        feature_levels(&metadata(&bootstrap))["metadata.version"],
        33
    );

    let log = batches(&path_in(STANDALONE, "00000000000000000000.log"));
    let first: Vec<i16> = control(&log[..1])
        .iter()
        .map(ControlRecord::record_type)
        .collect();
    // The new leader's first batch: LeaderChange, then the quorum's version and voters.
    assert_eq!(first, [2, 5, 6]);
    assert_eq!(check_voters(&control(&log)), dir_id);
    let records = metadata(&log);
    let mut image = Image::default();
    for r in &records {
        image.apply(r);
    }
    assert_eq!(
        image.topics_by_name(),
        BTreeMap::from([("events".to_string(), vec![0])])
    );
    // One log dir, shared by the metadata log and the partition: the voter's directory id
    // is the partition's.
    let dirs: Vec<Uuid> = records
        .iter()
        .filter_map(|r| match r {
            MetadataRecord::Partition(p) => Some(p.directories.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(dirs, [dir_id]);
}
