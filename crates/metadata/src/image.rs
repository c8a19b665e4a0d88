//! [`MetadataImage`]: the state of the cluster after applying every metadata record in order.
//! Images are immutable snapshots shared through `Arc`; a change builds a new image.

use std::collections::{BTreeMap, HashMap};

use uuid::Uuid;

use crate::record::{ConfigResource, MetadataRecord};

/// A registered broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerRegistration {
    /// `node.id`.
    pub broker_id: i32,
    /// Advertised host.
    pub host: String,
    /// Advertised port.
    pub port: u16,
    /// `broker.rack`.
    pub rack: Option<String>,
}

/// Replica assignment and leadership of one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionRegistration {
    /// Replica broker ids, preferred leader first.
    pub replicas: Vec<i32>,
    /// In-sync replicas.
    pub isr: Vec<i32>,
    /// Leader broker id, -1 if none.
    pub leader: i32,
    /// Leader epoch.
    pub leader_epoch: i32,
    /// Partition epoch.
    pub partition_epoch: i32,
}

/// One topic and its partitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicImage {
    /// Topic name.
    pub name: String,
    /// Topic id (KIP-516).
    pub topic_id: Uuid,
    /// Partitions by index.
    pub partitions: BTreeMap<i32, PartitionRegistration>,
}

/// The cluster's metadata at one point of the metadata log.
#[derive(Debug, Clone, Default)]
pub struct MetadataImage {
    /// Number of records applied (the offset after the last one).
    pub offset: u64,
    /// Registered brokers by id.
    pub brokers: BTreeMap<i32, BrokerRegistration>,
    /// Topics by id.
    pub topics: HashMap<Uuid, TopicImage>,
    /// Topic ids by name.
    pub topic_ids: BTreeMap<String, Uuid>,
    /// Non-default configs, by resource and then by config name.
    pub configs: BTreeMap<(ConfigResource, String), BTreeMap<String, String>>,
    /// First producer id not yet handed out.
    pub next_producer_id: i64,
}

impl MetadataImage {
    /// The topic named `name`.
    pub fn topic(&self, name: &str) -> Option<&TopicImage> {
        self.topic_ids.get(name).and_then(|id| self.topics.get(id))
    }

    /// The topic with id `id`.
    pub fn topic_by_id(&self, id: &Uuid) -> Option<&TopicImage> {
        self.topics.get(id)
    }

    /// Non-default configs of a resource (empty if none).
    pub fn configs_of(&self, resource: ConfigResource, name: &str) -> BTreeMap<String, String> {
        self.configs
            .get(&(resource, name.to_string()))
            .cloned()
            .unwrap_or_default()
    }

    /// Applies one record. Records that refer to unknown topics are ignored (they can only
    /// follow a removal that raced with them).
    pub fn apply(&mut self, record: &MetadataRecord) {
        self.offset += 1;
        match record {
            MetadataRecord::RegisterBroker {
                broker_id,
                host,
                port,
                rack,
            } => {
                self.brokers.insert(
                    *broker_id,
                    BrokerRegistration {
                        broker_id: *broker_id,
                        host: host.clone(),
                        port: *port,
                        rack: rack.clone(),
                    },
                );
            }
            MetadataRecord::Topic { name, topic_id } => {
                self.topic_ids.insert(name.clone(), *topic_id);
                self.topics.insert(
                    *topic_id,
                    TopicImage {
                        name: name.clone(),
                        topic_id: *topic_id,
                        partitions: BTreeMap::new(),
                    },
                );
            }
            MetadataRecord::Partition {
                topic_id,
                partition,
                replicas,
                isr,
                leader,
                leader_epoch,
                partition_epoch,
            } => {
                if let Some(t) = self.topics.get_mut(topic_id) {
                    t.partitions.insert(
                        *partition,
                        PartitionRegistration {
                            replicas: replicas.clone(),
                            isr: isr.clone(),
                            leader: *leader,
                            leader_epoch: *leader_epoch,
                            partition_epoch: *partition_epoch,
                        },
                    );
                }
            }
            MetadataRecord::RemoveTopic { topic_id } => {
                if let Some(t) = self.topics.remove(topic_id) {
                    self.topic_ids.remove(&t.name);
                    self.configs.remove(&(ConfigResource::Topic, t.name));
                }
            }
            MetadataRecord::Config {
                resource,
                resource_name,
                name,
                value,
            } => {
                let key = (*resource, resource_name.clone());
                match value {
                    Some(v) => {
                        self.configs
                            .entry(key)
                            .or_default()
                            .insert(name.clone(), v.clone());
                    }
                    None => {
                        if let Some(m) = self.configs.get_mut(&key) {
                            m.remove(name);
                            if m.is_empty() {
                                self.configs.remove(&key);
                            }
                        }
                    }
                }
            }
            MetadataRecord::ProducerIds {
                next_producer_id, ..
            } => {
                self.next_producer_id = self.next_producer_id.max(*next_producer_id);
            }
        }
    }
}
