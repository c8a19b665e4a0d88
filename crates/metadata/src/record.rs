//! Metadata records: the unit of change of cluster metadata. Modelled on KRaft's records
//! (`TopicRecord`, `PartitionRecord`, `ConfigRecord`, `RemoveTopicRecord`,
//! `ProducerIdsRecord`, `RegisterBrokerRecord`; see the metadata JSON schemas in Apache Kafka's
//! `metadata/src/main/resources/common/metadata/`). gregor serialises them as JSON in its own
//! log frames; the wire format between controllers will be Kafka's RPCs.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The kind of resource a config belongs to (Kafka's `ConfigResource.Type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ConfigResource {
    /// A topic config (`retention.ms`, ...); the resource name is the topic name.
    Topic,
    /// A broker config; the resource name is the node id, or "" for the cluster default.
    Broker,
}

/// One change to cluster metadata.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum MetadataRecord {
    /// A broker registered itself (KIP-631 `RegisterBrokerRecord`).
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
    /// A partition was created, or its assignment changed.
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
        /// Leader epoch; bumps with every leader change.
        leader_epoch: i32,
        /// Partition epoch; bumps with every change of this registration.
        partition_epoch: i32,
    },
    /// A topic was deleted together with its partitions and configs.
    RemoveTopic {
        /// Topic id.
        topic_id: Uuid,
    },
    /// A config was set (`value` = Some) or removed (`value` = None).
    Config {
        /// Resource type.
        resource: ConfigResource,
        /// Topic name or broker id.
        resource_name: String,
        /// Config name, e.g. `retention.ms`.
        name: String,
        /// New value, or None to delete.
        value: Option<String>,
    },
    /// A block of producer ids was handed out: ids below `next_producer_id` are used
    /// (`ProducerIdsRecord`). Persisted so ids are never reused after a restart.
    ProducerIds {
        /// Broker that took the block.
        broker_id: i32,
        /// First id not yet handed out.
        next_producer_id: i64,
    },
}
