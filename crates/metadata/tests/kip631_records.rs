//! Every kind of gregor's `MetadataRecord` is expressible as a KIP-631 record of
//! `gregor_protocol::metadata_records`, in Kafka's binary format, and comes back unchanged:
//! the mapping the switch of the metadata log to Kafka's `__cluster_metadata` format will use
//! (the log itself still writes gregor's JSON frames).

use gregor_metadata::record::{ConfigResource, MetadataRecord};
use gregor_protocol::metadata_records::log::{build_metadata_batch, decode_batch, BatchRecords};
use gregor_protocol::metadata_records::{
    config_resource_type, decode_framed, encode_framed, ApiMessageAndVersion, BrokerEndpoint,
    ConfigRecord, MetadataRecord as Kip631, PartitionRecord, ProducerIdsRecord,
    RegisterBrokerRecord, RemoveTopicRecord, TopicRecord,
};
use uuid::Uuid;

/// `SecurityProtocol.PLAINTEXT`'s id.
const PLAINTEXT: i16 = 0;

fn to_kip631(r: &MetadataRecord) -> Kip631 {
    match r {
        MetadataRecord::RegisterBroker {
            broker_id,
            host,
            port,
            rack,
        } => RegisterBrokerRecord {
            broker_id: *broker_id,
            end_points: vec![BrokerEndpoint {
                name: "PLAINTEXT".into(),
                host: host.clone(),
                port: *port,
                security_protocol: PLAINTEXT,
                ..BrokerEndpoint::default()
            }],
            rack: rack.clone(),
            fenced: false,
            ..RegisterBrokerRecord::default()
        }
        .into(),
        MetadataRecord::Topic { name, topic_id } => TopicRecord {
            name: name.clone(),
            topic_id: *topic_id,
            ..TopicRecord::default()
        }
        .into(),
        MetadataRecord::Partition {
            topic_id,
            partition,
            replicas,
            isr,
            leader,
            leader_epoch,
            partition_epoch,
        } => PartitionRecord {
            partition_id: *partition,
            topic_id: *topic_id,
            replicas: replicas.clone(),
            isr: isr.clone(),
            leader: *leader,
            leader_epoch: *leader_epoch,
            partition_epoch: *partition_epoch,
            ..PartitionRecord::default()
        }
        .into(),
        MetadataRecord::RemoveTopic { topic_id } => RemoveTopicRecord {
            topic_id: *topic_id,
            ..RemoveTopicRecord::default()
        }
        .into(),
        MetadataRecord::Config {
            resource,
            resource_name,
            name,
            value,
        } => ConfigRecord {
            resource_type: match resource {
                ConfigResource::Topic => config_resource_type::TOPIC,
                ConfigResource::Broker => config_resource_type::BROKER,
            },
            resource_name: resource_name.clone(),
            name: name.clone(),
            value: value.clone(),
            ..ConfigRecord::default()
        }
        .into(),
        MetadataRecord::ProducerIds {
            broker_id,
            next_producer_id,
        } => ProducerIdsRecord {
            broker_id: *broker_id,
            next_producer_id: *next_producer_id,
            ..ProducerIdsRecord::default()
        }
        .into(),
    }
}

fn from_kip631(r: &Kip631) -> Option<MetadataRecord> {
    Some(match r {
        Kip631::RegisterBroker(b) => {
            let ep = b.end_points.first()?;
            MetadataRecord::RegisterBroker {
                broker_id: b.broker_id,
                host: ep.host.clone(),
                port: ep.port,
                rack: b.rack.clone(),
            }
        }
        Kip631::Topic(t) => MetadataRecord::Topic {
            name: t.name.clone(),
            topic_id: t.topic_id,
        },
        Kip631::Partition(p) => MetadataRecord::Partition {
            topic_id: p.topic_id,
            partition: p.partition_id,
            replicas: p.replicas.clone(),
            isr: p.isr.clone(),
            leader: p.leader,
            leader_epoch: p.leader_epoch,
            partition_epoch: p.partition_epoch,
        },
        Kip631::RemoveTopic(t) => MetadataRecord::RemoveTopic {
            topic_id: t.topic_id,
        },
        Kip631::Config(c) => MetadataRecord::Config {
            resource: match c.resource_type {
                config_resource_type::TOPIC => ConfigResource::Topic,
                config_resource_type::BROKER => ConfigResource::Broker,
                _ => return None,
            },
            resource_name: c.resource_name.clone(),
            name: c.name.clone(),
            value: c.value.clone(),
        },
        Kip631::ProducerIds(p) => MetadataRecord::ProducerIds {
            broker_id: p.broker_id,
            next_producer_id: p.next_producer_id,
        },
        _ => return None,
    })
}

fn every_kind() -> Vec<MetadataRecord> {
    let topic_id = Uuid::from_u128(0xfeed);
    vec![
        MetadataRecord::RegisterBroker {
            broker_id: 1,
            host: "localhost".into(),
            port: 9092,
            rack: Some("rack-1".into()),
        },
        MetadataRecord::RegisterBroker {
            broker_id: 2,
            host: "b2".into(),
            port: 19092,
            rack: None,
        },
        MetadataRecord::Topic {
            name: "orders".into(),
            topic_id,
        },
        MetadataRecord::Partition {
            topic_id,
            partition: 2,
            replicas: vec![1, 2],
            isr: vec![1],
            leader: 1,
            leader_epoch: 4,
            partition_epoch: 9,
        },
        MetadataRecord::Config {
            resource: ConfigResource::Topic,
            resource_name: "orders".into(),
            name: "retention.ms".into(),
            value: Some("1000".into()),
        },
        MetadataRecord::Config {
            resource: ConfigResource::Broker,
            resource_name: String::new(),
            name: "log.retention.ms".into(),
            value: None,
        },
        MetadataRecord::ProducerIds {
            broker_id: 1,
            next_producer_id: 2_000,
        },
        MetadataRecord::RemoveTopic { topic_id },
    ]
}

#[test]
fn every_gregor_record_kind_round_trips_through_kafkas_format() {
    for r in every_kind() {
        let kip631 = to_kip631(&r);
        let t = kip631.record_type();
        // At every version a Kafka 4.x controller may write, not only the newest.
        for version in t.lowest_version..=t.highest_version {
            let framed = encode_framed(&ApiMessageAndVersion::new(kip631.clone(), version))
                .unwrap_or_else(|e| panic!("{r:?} at v{version}: {e}"));
            let back = decode_framed(&framed).expect("decodes");
            assert_eq!(from_kip631(&back.record).as_ref(), Some(&r), "v{version}");
        }
    }
}

#[test]
fn a_batch_of_gregor_records_reads_back_in_order() {
    let records: Vec<ApiMessageAndVersion> = every_kind()
        .iter()
        .map(|r| ApiMessageAndVersion::latest(to_kip631(r)))
        .collect();
    let batch = build_metadata_batch(10, 3, 1_700_000_000_000, &records).expect("a batch");
    let (header, decoded) = decode_batch(&batch).expect("decodes");
    assert_eq!(header.base_offset, 10);
    assert_eq!(header.partition_leader_epoch, 3);
    let BatchRecords::Metadata(decoded) = decoded else {
        panic!("a data batch")
    };
    let back: Vec<MetadataRecord> = decoded
        .iter()
        .map(|r| from_kip631(&r.record).expect("a gregor kind"))
        .collect();
    assert_eq!(back, every_kind());
}
