//! gregor's metadata records are Kafka's KIP-631 records: the log a real Apache Kafka 4.4.0
//! controller wrote (`crates/protocol/tests/data/kraft-4.4.0/`, see
//! `crates/protocol/tests/metadata_log_fixture.rs` for what was done to that cluster) replays
//! into a `MetadataImage` with its topics, partitions, brokers and configs; the image's
//! snapshot records (`MetadataImage::to_records`) are the records Kafka's own snapshot of the
//! same point holds, byte for byte; and any image survives the trip through its snapshot.

use std::collections::BTreeMap;
use std::path::PathBuf;

use gregor_metadata::codec::{decode_record, encode_record};
use gregor_metadata::image::MetadataImage;
use gregor_metadata::record::{
    from_legacy, ConfigResource, LegacyMetadataRecord, MetadataRecord, DIRECTORY_MIGRATING,
};
use gregor_protocol::metadata_records::log::{BatchRecords, MetadataLogBatches};
use gregor_protocol::metadata_records::{
    AccessControlEntryRecord, BrokerEndpoint, BrokerFeature, BrokerRegistrationChangeRecord,
    ClearElrRecord, ClientQuotaRecord, ConfigRecord, EntityData, FeatureLevelRecord,
    PartitionChangeRecord, PartitionRecord, ProducerIdsRecord, RegisterBrokerRecord,
    RegisterControllerRecord, RemoveAccessControlEntryRecord, RemoveTopicRecord, TopicRecord,
    UnregisterBrokerRecord, UserScramCredentialRecord,
};
use proptest::prelude::*;
use uuid::Uuid;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../protocol/tests/data/kraft-4.4.0")
        .join(name)
}

/// The metadata records of a log segment or snapshot with their offsets, read through
/// gregor's codec (`decode_record` of each record's value); control batches are left out.
fn records(name: &str) -> Vec<(i64, MetadataRecord)> {
    let buf = std::fs::read(fixture(name)).expect("a fixture file");
    let mut out = Vec::new();
    for batch in MetadataLogBatches::new(&buf) {
        let batch = batch.expect("a batch");
        if let BatchRecords::Metadata(records) = &batch.records {
            for (i, r) in records.iter().enumerate() {
                // Through gregor's codec: decode what encode_record writes.
                let bytes = encode_record(&r.record).expect("encodes");
                let back = decode_record(&bytes).expect("decodes");
                assert_eq!(back, r.record);
                out.push((batch.header.base_offset + i as i64, back));
            }
        }
    }
    out
}

fn replay<'a>(records: impl IntoIterator<Item = &'a MetadataRecord>) -> MetadataImage {
    let mut image = MetadataImage::default();
    for r in records {
        image.apply(r);
    }
    image
}

/// Two images equal but for how many records built them.
fn same(mut a: MetadataImage, mut b: MetadataImage) {
    a.offset = 0;
    b.offset = 0;
    assert_eq!(a, b);
}

#[test]
fn kafkas_log_replays_into_the_image_kafka_had() {
    let log = records("00000000000000000000.log");
    let image = replay(log.iter().map(|(_, r)| r));
    assert_eq!(image.metadata_version(), Some(33));
    assert_eq!(image.features["transaction.version"], 2);
    // Topics: payments was created and deleted; orders has 3 partitions.
    assert!(image.topic("payments").is_none());
    let orders = image.topic("orders").expect("orders");
    assert_eq!(
        orders.partitions.keys().copied().collect::<Vec<_>>(),
        [0, 1, 2]
    );
    // The clean shutdown emptied the ISR into the ELR and left no leader: each
    // PartitionChangeRecord changed only what it carries, and bumped both epochs once.
    for p in orders.partitions.values() {
        assert_eq!(p.replicas, [1]);
        assert_eq!((p.leader, p.isr.clone()), (-1, vec![]));
        assert_eq!(
            (p.elr.clone(), p.last_known_elr.clone()),
            (vec![1], vec![1])
        );
        assert_eq!((p.leader_epoch, p.partition_epoch), (1, 1));
        assert_eq!(p.directories.len(), 1);
        assert_ne!(p.directories[0], DIRECTORY_MIGRATING);
    }
    // Broker 1: epoch = offset of its RegisterBrokerRecord, unfenced, then controlled
    // shutdown, then fenced.
    let b = &image.brokers[&1];
    assert_eq!(b.epoch, 12);
    assert!(b.fenced);
    assert!(
        b.in_controlled_shutdown,
        "fencing (InControlledShutdown 0 = no change) keeps the flag, as Kafka's cloneWith"
    );
    let e = b.endpoint("PLAINTEXT").expect("the PLAINTEXT endpoint");
    assert_eq!(e.host, "127.0.0.1");
    assert_eq!(b.supported("metadata.version"), Some((7, 33)));
    assert_eq!(b.directories, orders.partitions[&0].directories);
    assert_eq!(image.controllers[&1].end_points[0].name, "CONTROLLER");
    // Configs, quotas, SCRAM, producer ids; the ACL was removed.
    assert_eq!(
        image.configs_of(ConfigResource::Topic, "orders"),
        BTreeMap::from([("retention.ms".to_string(), "3600000".to_string())])
    );
    assert_eq!(
        image.configs_of(ConfigResource::Broker, "")["log.retention.ms"],
        "604800000"
    );
    assert_eq!(image.client_quotas.len(), 1);
    assert_eq!(image.scram.len(), 1);
    assert!(image.acls.is_empty());
    assert_eq!(image.next_producer_id, 1000);
}

#[test]
fn kafkas_snapshot_replays_into_the_same_image_as_the_log_and_ours_writes_the_same_records() {
    // The snapshot `00000000000000000089-0000000001` holds the image of every record below
    // offset 89.
    let snapshot = records("00000000000000000089-0000000001.checkpoint");
    let from_snapshot = replay(snapshot.iter().map(|(_, r)| r));
    let log = records("00000000000000000000.log");
    let from_log = replay(log.iter().filter(|(o, _)| *o < 89).map(|(_, r)| r));
    same(from_snapshot.clone(), from_log.clone());

    // Our snapshot of that image: the same records as Kafka's, byte for byte, and
    // metadata.version first. (Kafka orders the rest by hash maps; ours by key.)
    let ours = from_log.to_records();
    assert!(matches!(&ours[0], MetadataRecord::FeatureLevel(f) if f.name == "metadata.version"));
    // Kafka writes a broker's features in hash-map order; compare them by name.
    let encode = |rs: &mut dyn Iterator<Item = &MetadataRecord>| {
        let mut v: Vec<Vec<u8>> = rs
            .map(|r| {
                let mut r = r.clone();
                if let MetadataRecord::RegisterBroker(b) = &mut r {
                    b.features.sort_by(|x, y| x.name.cmp(&y.name));
                }
                encode_record(&r).expect("encodes").to_vec()
            })
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        encode(&mut ours.iter()),
        encode(&mut snapshot.iter().map(|(_, r)| r))
    );
    same(replay(&ours), from_snapshot);
}

#[test]
fn legacy_json_records_convert_one_for_one() {
    let topic_id = Uuid::from_u128(0xfeed);
    let legacy = vec![
        LegacyMetadataRecord::RegisterBroker {
            broker_id: 1,
            host: "localhost".into(),
            port: 9092,
            rack: Some("r1".into()),
        },
        LegacyMetadataRecord::Topic {
            name: "orders".into(),
            topic_id,
        },
        LegacyMetadataRecord::Partition {
            topic_id,
            partition: 0,
            replicas: vec![1],
            isr: vec![1],
            leader: 1,
            leader_epoch: 4,
            partition_epoch: 9,
        },
        LegacyMetadataRecord::Config {
            resource: ConfigResource::Topic,
            resource_name: "orders".into(),
            name: "retention.ms".into(),
            value: Some("1000".into()),
        },
        LegacyMetadataRecord::ProducerIds {
            broker_id: 1,
            next_producer_id: 2000,
        },
    ];
    let converted = from_legacy(&legacy, 100);
    assert_eq!(converted.len(), legacy.len());
    let MetadataRecord::RegisterBroker(b) = &converted[0] else {
        panic!("{:?}", converted[0])
    };
    assert_eq!((b.broker_id, b.broker_epoch, b.fenced), (1, 100, true));
    assert_eq!(b.end_points[0].name, "PLAINTEXT");
    assert_eq!(
        (b.end_points[0].host.as_str(), b.end_points[0].port),
        ("localhost", 9092)
    );
    assert_eq!(b.rack.as_deref(), Some("r1"));
    let image = replay(&converted);
    let p = &image.topic("orders").expect("orders").partitions[&0];
    assert_eq!((p.leader, p.leader_epoch, p.partition_epoch), (1, 4, 9));
    assert_eq!(p.directories, [DIRECTORY_MIGRATING]);
    assert_eq!(
        image.configs_of(ConfigResource::Topic, "orders")["retention.ms"],
        "1000"
    );
    assert_eq!(image.next_producer_id, 2000);
    // Every converted record is writable in Kafka's format.
    for r in &converted {
        decode_record(&encode_record(r).expect("encodes")).expect("decodes");
    }
    // And the old log's JSON reads as before.
    let json = r#"[{"type":"RemoveTopic","topic_id":"00000000-0000-0000-0000-00000000feed"}]"#;
    let old: Vec<LegacyMetadataRecord> = serde_json::from_str(json).expect("legacy JSON");
    assert!(matches!(
        &from_legacy(&old, 0)[0],
        MetadataRecord::RemoveTopic(r) if r.topic_id == topic_id
    ));
}

// --- Property: an image survives its snapshot. ---

const TOPICS: u128 = 3;

fn topic_id(i: u8) -> Uuid {
    Uuid::from_u128(0x1000 + u128::from(i) % TOPICS)
}

fn ids() -> impl Strategy<Value = Vec<i32>> {
    prop::collection::vec(0..4i32, 0..4)
}

fn dirs() -> impl Strategy<Value = Vec<Uuid>> {
    prop::collection::vec((0u128..4).prop_map(Uuid::from_u128), 0..3)
}

/// Records over a few topics, partitions and brokers, so that they refer to each other.
fn record() -> impl Strategy<Value = MetadataRecord> {
    prop_oneof![
        (0u8..3).prop_map(|t| TopicRecord {
            name: format!("t{}", u128::from(t) % TOPICS),
            topic_id: topic_id(t),
            ..Default::default()
        }
        .into()),
        (
            0u8..3,
            0..3i32,
            ids(),
            ids(),
            -1..4i32,
            0..5i32,
            dirs(),
            ids()
        )
            .prop_map(|(t, p, replicas, isr, leader, epoch, directories, elr)| {
                PartitionRecord {
                    topic_id: topic_id(t),
                    partition_id: p,
                    replicas,
                    isr,
                    leader,
                    leader_epoch: epoch,
                    partition_epoch: epoch,
                    directories,
                    eligible_leader_replicas: (!elr.is_empty()).then_some(elr),
                    ..Default::default()
                }
                .into()
            }),
        (
            0u8..3,
            0..3i32,
            prop::option::of(ids()),
            -2..4i32,
            prop::option::of(ids()),
            prop::option::of(dirs()),
            prop::option::of(ids()),
            -1..2i8
        )
            .prop_map(|(t, p, isr, leader, replicas, directories, elr, lrs)| {
                PartitionChangeRecord {
                    topic_id: topic_id(t),
                    partition_id: p,
                    isr,
                    leader,
                    replicas,
                    directories,
                    eligible_leader_replicas: elr.clone(),
                    last_known_elr: elr,
                    leader_recovery_state: lrs,
                    ..Default::default()
                }
                .into()
            }),
        (0u8..3).prop_map(|t| RemoveTopicRecord {
            topic_id: topic_id(t),
            ..Default::default()
        }
        .into()),
        (
            0..3i32,
            0..20i64,
            any::<bool>(),
            prop::option::of("[a-c]"),
            dirs()
        )
            .prop_map(|(id, epoch, fenced, rack, log_dirs)| RegisterBrokerRecord {
                broker_id: id,
                incarnation_id: Uuid::from_u128(epoch as u128),
                broker_epoch: epoch,
                end_points: vec![BrokerEndpoint {
                    name: "PLAINTEXT".into(),
                    host: format!("h{id}"),
                    port: 9092,
                    ..Default::default()
                }],
                features: vec![BrokerFeature {
                    name: "metadata.version".into(),
                    min_supported_version: 7,
                    max_supported_version: 33,
                    ..Default::default()
                }],
                rack,
                fenced,
                log_dirs,
                ..Default::default()
            }
            .into()),
        (0..3i32, 0..20i64, -1..2i8, 0..2i8, prop::option::of(dirs())).prop_map(
            |(id, epoch, fenced, ics, cordoned)| BrokerRegistrationChangeRecord {
                broker_id: id,
                broker_epoch: epoch,
                fenced,
                in_controlled_shutdown: ics,
                cordoned_log_dirs: cordoned,
                ..Default::default()
            }
            .into()
        ),
        (0..3i32, 0..20i64).prop_map(|(id, epoch)| UnregisterBrokerRecord {
            broker_id: id,
            broker_epoch: epoch,
            ..Default::default()
        }
        .into()),
        (0..2i32).prop_map(|id| RegisterControllerRecord {
            controller_id: id,
            ..Default::default()
        }
        .into()),
        (
            prop::sample::select(vec!["metadata.version", "kraft.version", "group.version"]),
            0..3i16
        )
            .prop_map(|(name, level)| FeatureLevelRecord {
                name: name.into(),
                feature_level: level,
                ..Default::default()
            }
            .into()),
        (
            prop::sample::select(vec![2i8, 4, 16]),
            "[ab]?",
            "[xy]",
            prop::option::of("[0-9]")
        )
            .prop_map(|(ty, res, name, value)| ConfigRecord {
                resource_type: ty,
                resource_name: res,
                name,
                value,
                ..Default::default()
            }
            .into()),
        ("[uv]", "[kq]", 0.0..10.0f64, any::<bool>()).prop_map(|(user, key, value, remove)| {
            ClientQuotaRecord {
                entity: vec![EntityData {
                    entity_type: "user".into(),
                    entity_name: Some(user),
                    ..Default::default()
                }],
                key,
                value,
                remove,
                ..Default::default()
            }
            .into()
        }),
        (0..5000i64).prop_map(|next| ProducerIdsRecord {
            broker_id: 1,
            broker_epoch: 2,
            next_producer_id: next,
            ..Default::default()
        }
        .into()),
        (0u128..3, any::<bool>()).prop_map(|(id, add)| if add {
            AccessControlEntryRecord {
                id: Uuid::from_u128(id + 1),
                principal: "User:a".into(),
                host: "*".into(),
                ..Default::default()
            }
            .into()
        } else {
            RemoveAccessControlEntryRecord {
                id: Uuid::from_u128(id + 1),
                ..Default::default()
            }
            .into()
        }),
        ("[ab]", 1..3i8).prop_map(|(name, mechanism)| UserScramCredentialRecord {
            name,
            mechanism,
            iterations: 4096,
            ..Default::default()
        }
        .into()),
        "t[0-2]?".prop_map(|topic_name| ClearElrRecord {
            topic_name,
            ..Default::default()
        }
        .into()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Applying an image's snapshot records to an empty image gives the same image, and every
    /// snapshot record is writable in Kafka's format.
    #[test]
    fn an_image_survives_its_snapshot(records in prop::collection::vec(record(), 0..60)) {
        let image = replay(&records);
        let snapshot = image.to_records();
        for r in &snapshot {
            let bytes = encode_record(r).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(&decode_record(&bytes).map_err(|e| TestCaseError::fail(e.to_string()))?, r);
        }
        let mut back = replay(&snapshot);
        back.offset = image.offset;
        prop_assert_eq!(back, image);
    }
}

/// gregor's controller, at the image Kafka's controller had just before the broker asked for
/// a controlled shutdown (offset 95 of the fixture log), writes the records Kafka wrote: the
/// broker enters controlled shutdown, then each partition's ISR empties into the ELR (KIP-966,
/// `min.insync.replicas` 1) with no leader and the last leader remembered; once it leads
/// nothing it may shut down and is fenced.
#[test]
fn the_controlled_shutdown_kafka_did_is_the_one_gregor_does() {
    use gregor_metadata::controller::{
        BrokerHeartbeatRequest, Controller, ControllerConfig, ManualClock,
    };
    use gregor_metadata::log::CommittedBatch;
    use std::sync::Arc;

    let log = records("00000000000000000000.log");
    let mut image = replay(log.iter().filter(|(o, _)| *o < 95).map(|(_, r)| r));
    image.offset = 95;
    let mut controller = Controller::with_config(
        image,
        ControllerConfig {
            clock: Arc::new(ManualClock::default()),
            ..ControllerConfig::default()
        },
    );
    let shut_down = BrokerHeartbeatRequest {
        broker_id: 1,
        broker_epoch: 12,
        current_metadata_offset: 94,
        want_fence: false,
        want_shut_down: true,
        cordoned_log_dirs: None,
        offline_log_dirs: Vec::new(),
    };
    let r = controller
        .broker_heartbeat(shut_down.clone())
        .expect("a heartbeat");
    assert!(r.response.in_controlled_shutdown && !r.response.should_shut_down);
    let kafkas: Vec<MetadataRecord> = log
        .iter()
        .filter(|(o, _)| (95..=98).contains(o))
        .map(|(_, r)| r.clone())
        .collect();
    assert_eq!(r.records, kafkas);
    let encoded = |rs: &[MetadataRecord]| -> Vec<Vec<u8>> {
        rs.iter()
            .map(|r| encode_record(r).expect("encodes").to_vec())
            .collect()
    };
    assert_eq!(encoded(&r.records), encoded(&kafkas), "the same bytes");
    controller.replay(&CommittedBatch {
        base_offset: 95,
        epoch: 1,
        records: r.records.into(),
    });
    let r = controller
        .broker_heartbeat(BrokerHeartbeatRequest {
            current_metadata_offset: 98,
            ..shut_down
        })
        .expect("a heartbeat");
    assert!(r.response.should_shut_down);
    // Kafka's next records: a NoOpRecord (its periodic one), then the fencing.
    let MetadataRecord::BrokerRegistrationChange(fence) = &log[log.len() - 1].1 else {
        panic!("the log ends with the fencing")
    };
    assert_eq!(
        r.records,
        vec![MetadataRecord::BrokerRegistrationChange(fence.clone())]
    );
}
