//! Metadata records: the unit of change of cluster metadata. They ARE Kafka's KIP-631 records
//! ([`gregor_protocol::metadata_records::MetadataRecord`], generated from Kafka 4.4.0's
//! `metadata/src/main/resources/common/metadata/*.json`), used directly rather than wrapped:
//! every field Kafka has is there (incarnation ids, endpoints per listener, ELR, directories),
//! tagged fields gregor does not know survive a round trip, and a record read from a Kafka
//! controller's log is replayed as it is. The version each record is written at is not part of
//! the record: [`crate::codec::encode_record`] picks the one Kafka 4.4 writes.
//!
//! [`LegacyMetadataRecord`] is the JSON record of gregor's own metadata log before the switch
//! (`__gregor_metadata/metadata.log`), kept only to read and convert old data dirs
//! ([`from_legacy`]).

use gregor_protocol::metadata_records::{
    config_resource_type, BrokerEndpoint, ConfigRecord, PartitionRecord, ProducerIdsRecord,
    RegisterBrokerRecord, RemoveTopicRecord, TopicRecord,
};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub use gregor_protocol::metadata_records::MetadataRecord;

/// `SecurityProtocol.PLAINTEXT`'s id (Kafka's `SecurityProtocol.id`).
pub const SECURITY_PROTOCOL_PLAINTEXT: i16 = 0;

/// The kind of resource a config belongs to (Kafka's `ConfigResource.Type`, the `ResourceType`
/// of a `ConfigRecord`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ConfigResource {
    /// A topic config (`retention.ms`, ...); the resource name is the topic name.
    Topic,
    /// A broker config; the resource name is the node id, or "" for the cluster default.
    Broker,
    /// Another type (`BROKER_LOGGER` 8, `CLIENT_METRICS` 16, `GROUP` 32, ...), by its id: kept
    /// in the image as Kafka's `ConfigurationsImage` keeps it.
    Other(i8),
}

impl ConfigResource {
    /// The `ConfigRecord.ResourceType` id.
    pub fn resource_type(self) -> i8 {
        match self {
            Self::Topic => config_resource_type::TOPIC,
            Self::Broker => config_resource_type::BROKER,
            Self::Other(t) => t,
        }
    }

    /// The resource of a `ConfigRecord.ResourceType` id.
    pub fn from_resource_type(t: i8) -> Self {
        match t {
            config_resource_type::TOPIC => Self::Topic,
            config_resource_type::BROKER => Self::Broker,
            t => Self::Other(t),
        }
    }
}

/// A record of gregor's JSON metadata log before it held Kafka's records: the six kinds it
/// had. Read from old `__gregor_metadata/metadata.log` files only; convert with
/// [`from_legacy`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum LegacyMetadataRecord {
    /// A broker registered itself.
    RegisterBroker {
        /// `node.id`.
        broker_id: i32,
        /// Advertised host.
        host: String,
        /// Advertised port.
        port: u16,
        /// `broker.rack`, if set.
        rack: Option<String>,
    },
    /// A topic was created.
    Topic {
        /// Topic name.
        name: String,
        /// Topic id (KIP-516).
        topic_id: Uuid,
    },
    /// A partition was created, or its assignment changed (the whole registration).
    Partition {
        /// Topic id of the partition.
        topic_id: Uuid,
        /// Partition index.
        partition: i32,
        /// Replica broker ids, preferred leader first.
        replicas: Vec<i32>,
        /// In-sync replicas.
        isr: Vec<i32>,
        /// Leader broker id, -1 if none.
        leader: i32,
        /// Leader epoch.
        leader_epoch: i32,
        /// Partition epoch.
        partition_epoch: i32,
    },
    /// A topic was deleted together with its partitions and configs.
    RemoveTopic {
        /// Topic id.
        topic_id: Uuid,
    },
    /// A config was set (`value` = Some) or removed (`value` = None).
    Config {
        /// Resource type (`Topic` or `Broker`).
        resource: ConfigResource,
        /// Topic name or broker id.
        resource_name: String,
        /// Config name.
        name: String,
        /// New value, or None to delete.
        value: Option<String>,
    },
    /// A block of producer ids was handed out: ids below `next_producer_id` are used.
    ProducerIds {
        /// Broker that took the block.
        broker_id: i32,
        /// First id not yet handed out.
        next_producer_id: i64,
    },
}

/// Converts the records of an old gregor metadata log, one for one and in order, to the
/// KIP-631 records Kafka would have written for the same changes. `first_offset` is the offset
/// the first converted record will have in the new log: a `RegisterBrokerRecord`'s broker epoch
/// is its own offset (Kafka's rule), so proposing the result as one batch at that offset gives
/// every broker the epoch Kafka would have given it.
///
/// A legacy broker registration becomes a *fenced* registration with one `PLAINTEXT` endpoint,
/// a nil incarnation id (the process that wrote it is gone; it registers anew when it starts,
/// with a new incarnation id, and heartbeats to be unfenced) and no features or log dirs.
/// Partitions keep their replicas, ISR, leader and epochs; their brokers registered no log
/// directories, so each replica's directory is `DirectoryId.MIGRATING`, as Kafka's
/// `ClusterControlManager.defaultDir` gives for such a broker. A producer-id block keeps its broker and gets broker epoch -1 (Kafka's "unknown").
pub fn from_legacy(records: &[LegacyMetadataRecord], first_offset: u64) -> Vec<MetadataRecord> {
    records
        .iter()
        .enumerate()
        .map(|(i, r)| legacy_record(r, first_offset + i as u64))
        .collect()
}

/// Kafka's `DirectoryId.MIGRATING` (`0`): the replica's broker registered no log directories.
pub const DIRECTORY_MIGRATING: Uuid = Uuid::from_u64_pair(0, 0);
/// Kafka's `DirectoryId.UNASSIGNED` (`1`): the broker has several log directories and has not
/// said which holds the replica.
pub const DIRECTORY_UNASSIGNED: Uuid = Uuid::from_u64_pair(0, 1);
/// Kafka's `DirectoryId.LOST` (`2`): the replica's log directory is offline.
pub const DIRECTORY_LOST: Uuid = Uuid::from_u64_pair(0, 2);

fn legacy_record(r: &LegacyMetadataRecord, offset: u64) -> MetadataRecord {
    match r {
        LegacyMetadataRecord::RegisterBroker {
            broker_id,
            host,
            port,
            rack,
        } => RegisterBrokerRecord {
            broker_id: *broker_id,
            incarnation_id: Uuid::nil(),
            broker_epoch: i64::try_from(offset).unwrap_or(i64::MAX),
            end_points: vec![BrokerEndpoint {
                name: "PLAINTEXT".into(),
                host: host.clone(),
                port: *port,
                security_protocol: SECURITY_PROTOCOL_PLAINTEXT,
                ..BrokerEndpoint::default()
            }],
            rack: rack.clone(),
            fenced: true,
            ..RegisterBrokerRecord::default()
        }
        .into(),
        LegacyMetadataRecord::Topic { name, topic_id } => TopicRecord {
            name: name.clone(),
            topic_id: *topic_id,
            ..TopicRecord::default()
        }
        .into(),
        LegacyMetadataRecord::Partition {
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
            directories: vec![DIRECTORY_MIGRATING; replicas.len()],
            ..PartitionRecord::default()
        }
        .into(),
        LegacyMetadataRecord::RemoveTopic { topic_id } => RemoveTopicRecord {
            topic_id: *topic_id,
            ..RemoveTopicRecord::default()
        }
        .into(),
        LegacyMetadataRecord::Config {
            resource,
            resource_name,
            name,
            value,
        } => ConfigRecord {
            resource_type: resource.resource_type(),
            resource_name: resource_name.clone(),
            name: name.clone(),
            value: value.clone(),
            ..ConfigRecord::default()
        }
        .into(),
        LegacyMetadataRecord::ProducerIds {
            broker_id,
            next_producer_id,
        } => ProducerIdsRecord {
            broker_id: *broker_id,
            broker_epoch: -1,
            next_producer_id: *next_producer_id,
            ..ProducerIdsRecord::default()
        }
        .into(),
    }
}
