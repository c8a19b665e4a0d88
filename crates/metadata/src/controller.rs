//! The controller: validates metadata changes against the current image, writes them to the
//! metadata log as records, and publishes the resulting image. Changes are serialised (one
//! writer at a time), as the active KRaft controller does.

use std::collections::BTreeMap;
use std::sync::Arc;

use gregor_protocol::error::ErrorCode;
use parking_lot::{Mutex, RwLock};
use thiserror::Error;
use uuid::Uuid;

use crate::image::MetadataImage;
use crate::log::{MetadataLog, MetadataLogError};
use crate::record::{ConfigResource, MetadataRecord};

/// Longest legal topic name (Kafka's `Topic.MAX_NAME_LENGTH`).
pub const MAX_TOPIC_NAME_LENGTH: usize = 249;

/// Number of producer ids a broker takes from the controller at a time (Kafka hands out
/// blocks of 1000, `ProducerIdManager`).
pub const PRODUCER_ID_BLOCK_SIZE: i64 = 1000;

/// Why a metadata change was refused. [`ControllerError::kafka_error_code`] gives the code Kafka
/// returns for it.
#[derive(Debug, Error)]
pub enum ControllerError {
    /// INVALID_TOPIC_EXCEPTION (17).
    #[error("{0}")]
    InvalidTopic(String),
    /// TOPIC_ALREADY_EXISTS (36).
    #[error("Topic '{0}' already exists.")]
    TopicAlreadyExists(String),
    /// UNKNOWN_TOPIC_OR_PARTITION (3).
    #[error("This server does not host this topic-partition.")]
    UnknownTopicOrPartition,
    /// UNKNOWN_TOPIC_ID (100).
    #[error("This server does not host this topic ID.")]
    UnknownTopicId,
    /// INVALID_PARTITIONS (37).
    #[error("{0}")]
    InvalidPartitions(String),
    /// INVALID_REPLICATION_FACTOR (38).
    #[error("{0}")]
    InvalidReplicationFactor(String),
    /// INVALID_REPLICA_ASSIGNMENT (39).
    #[error("{0}")]
    InvalidReplicaAssignment(String),
    /// INVALID_CONFIG (40).
    #[error("{0}")]
    InvalidConfig(String),
    /// The metadata log could not make the change durable: UNKNOWN_SERVER_ERROR (-1).
    #[error(transparent)]
    Log(#[from] MetadataLogError),
}

impl ControllerError {
    /// Kafka's error for this error.
    pub fn error_code(&self) -> ErrorCode {
        match self {
            Self::InvalidTopic(_) => ErrorCode::InvalidTopicException,
            Self::TopicAlreadyExists(_) => ErrorCode::TopicAlreadyExists,
            Self::UnknownTopicOrPartition => ErrorCode::UnknownTopicOrPartition,
            Self::UnknownTopicId => ErrorCode::UnknownTopicId,
            Self::InvalidPartitions(_) => ErrorCode::InvalidPartitions,
            Self::InvalidReplicationFactor(_) => ErrorCode::InvalidReplicationFactor,
            Self::InvalidReplicaAssignment(_) => ErrorCode::InvalidReplicaAssignment,
            Self::InvalidConfig(_) => ErrorCode::InvalidConfig,
            Self::Log(_) => ErrorCode::UnknownServerError,
        }
    }

    /// The wire code of [`ControllerError::error_code`].
    pub fn kafka_error_code(&self) -> i16 {
        self.error_code().code()
    }
}

/// A topic to create.
#[derive(Debug, Clone)]
pub struct NewTopic {
    /// Topic name.
    pub name: String,
    /// Number of partitions (already resolved from -1 to the broker default).
    pub num_partitions: i32,
    /// Replication factor (already resolved from -1 to the broker default).
    pub replication_factor: i16,
    /// Manual assignment: replica ids per partition, in partition order. Overrides the two
    /// counts above when non-empty.
    pub assignments: Vec<Vec<i32>>,
    /// Topic configs (already validated by the broker).
    pub configs: BTreeMap<String, String>,
}

/// Validates a topic name as Kafka's `Topic.validate` does.
///
/// # Errors
/// [`ControllerError::InvalidTopic`] with Kafka's message.
pub fn validate_topic_name(name: &str) -> Result<(), ControllerError> {
    if name.is_empty() {
        return Err(ControllerError::InvalidTopic(
            "Topic name is illegal, it can't be empty".into(),
        ));
    }
    if name == "." || name == ".." {
        return Err(ControllerError::InvalidTopic(
            "Topic name cannot be \".\" or \"..\"".into(),
        ));
    }
    if name.len() > MAX_TOPIC_NAME_LENGTH {
        return Err(ControllerError::InvalidTopic(format!(
            "Topic name is illegal, it can't be longer than {MAX_TOPIC_NAME_LENGTH} characters, topic name: {name}"
        )));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
    {
        return Err(ControllerError::InvalidTopic(format!(
            "Topic name \"{name}\" is illegal, it contains a character other than ASCII alphanumerics, '.', '_' and '-'"
        )));
    }
    Ok(())
}

/// Topic names that collide in metric names ('.' and '_' are interchangeable), as Kafka's
/// `Topic.unifyCollisionChars`.
fn unify_collision_chars(name: &str) -> String {
    name.replace('.', "_")
}

/// Validates and applies metadata changes.
pub struct Controller {
    log: Box<dyn MetadataLog>,
    image: RwLock<Arc<MetadataImage>>,
    write: Mutex<()>,
}

impl Controller {
    /// Builds the image by replaying `log`.
    ///
    /// # Errors
    /// [`ControllerError::Log`] when the log cannot be read.
    pub fn open(log: Box<dyn MetadataLog>) -> Result<Self, ControllerError> {
        let mut image = MetadataImage::default();
        for r in log.read_all()? {
            image.apply(&r);
        }
        Ok(Self {
            log,
            image: RwLock::new(Arc::new(image)),
            write: Mutex::new(()),
        })
    }

    /// The current image.
    pub fn image(&self) -> Arc<MetadataImage> {
        self.image.read().clone()
    }

    /// Makes `records` durable and publishes the new image. Call with the write lock held.
    fn commit(&self, records: &[MetadataRecord]) -> Result<Arc<MetadataImage>, ControllerError> {
        if records.is_empty() {
            return Ok(self.image());
        }
        self.log.append(records)?;
        let mut next = (*self.image()).clone();
        for r in records {
            next.apply(r);
        }
        let next = Arc::new(next);
        *self.image.write() = next.clone();
        Ok(next)
    }

    /// Registers (or re-registers) a broker. Writes a record only when something changed.
    ///
    /// # Errors
    /// [`ControllerError::Log`].
    pub fn register_broker(
        &self,
        broker_id: i32,
        host: &str,
        port: u16,
        rack: Option<String>,
    ) -> Result<(), ControllerError> {
        let _w = self.write.lock();
        let image = self.image();
        let same = image
            .brokers
            .get(&broker_id)
            .is_some_and(|b| b.host == host && b.port == port && b.rack == rack);
        if !same {
            self.commit(&[MetadataRecord::RegisterBroker {
                broker_id,
                host: host.to_string(),
                port,
                rack,
            }])?;
        }
        Ok(())
    }

    fn place_replicas(
        image: &MetadataImage,
        first_partition: i32,
        count: i32,
        replication_factor: i16,
    ) -> Result<Vec<Vec<i32>>, ControllerError> {
        let brokers: Vec<i32> = image.brokers.keys().copied().collect();
        if replication_factor < 1 {
            return Err(ControllerError::InvalidReplicationFactor(
                "Replication factor must be larger than 0, or -1 to use the default value.".into(),
            ));
        }
        if brokers.len() < replication_factor as usize {
            return Err(ControllerError::InvalidReplicationFactor(format!(
                "Unable to replicate the partition {replication_factor} time(s): The target replication factor of {replication_factor} cannot be reached because only {} broker(s) are registered.",
                brokers.len()
            )));
        }
        let n = brokers.len();
        Ok((0..count)
            .map(|i| {
                let start = (first_partition + i) as usize;
                (0..replication_factor as usize)
                    .map(|r| brokers[(start + r) % n])
                    .collect()
            })
            .collect())
    }

    fn check_assignments(
        image: &MetadataImage,
        assignments: &[Vec<i32>],
    ) -> Result<(), ControllerError> {
        let rf = assignments.first().map_or(0, Vec::len);
        for (i, a) in assignments.iter().enumerate() {
            if a.is_empty() {
                return Err(ControllerError::InvalidReplicaAssignment(format!(
                    "The manual partition assignment includes a partition ({i}) with no replicas."
                )));
            }
            if a.len() != rf {
                return Err(ControllerError::InvalidReplicaAssignment(format!(
                    "The manual partition assignment includes the partition {i} with {} replica(s), but this is not consistent with previous partitions, which have {rf} replica(s).",
                    a.len()
                )));
            }
            let mut seen = a.clone();
            seen.sort_unstable();
            seen.dedup();
            if seen.len() != a.len() {
                return Err(ControllerError::InvalidReplicaAssignment(format!(
                    "The manual partition assignment includes the partition {i} with duplicate replicas."
                )));
            }
            if let Some(b) = a.iter().find(|b| !image.brokers.contains_key(b)) {
                return Err(ControllerError::InvalidReplicaAssignment(format!(
                    "The manual partition assignment includes broker {b}, but no such broker is registered."
                )));
            }
        }
        Ok(())
    }

    fn partition_records(
        topic_id: Uuid,
        first_partition: i32,
        assignments: Vec<Vec<i32>>,
    ) -> impl Iterator<Item = MetadataRecord> {
        assignments
            .into_iter()
            .enumerate()
            .map(move |(i, replicas)| MetadataRecord::Partition {
                topic_id,
                partition: first_partition + i as i32,
                leader: replicas.first().copied().unwrap_or(-1),
                isr: replicas.clone(),
                replicas,
                leader_epoch: 0,
                partition_epoch: 0,
            })
    }

    /// Creates a topic (or only validates, with `validate_only`). Returns its id.
    ///
    /// # Errors
    /// INVALID_TOPIC_EXCEPTION for a bad or colliding name, TOPIC_ALREADY_EXISTS,
    /// INVALID_PARTITIONS for fewer than one partition, INVALID_REPLICATION_FACTOR for more
    /// replicas than registered brokers, INVALID_REPLICA_ASSIGNMENT for a bad manual assignment.
    pub fn create_topic(&self, t: NewTopic, validate_only: bool) -> Result<Uuid, ControllerError> {
        validate_topic_name(&t.name)?;
        let _w = self.write.lock();
        let image = self.image();
        if image.topic_ids.contains_key(&t.name) {
            return Err(ControllerError::TopicAlreadyExists(t.name));
        }
        let unified = unify_collision_chars(&t.name);
        if let Some(other) = image
            .topic_ids
            .keys()
            .find(|n| unify_collision_chars(n) == unified)
        {
            return Err(ControllerError::InvalidTopic(format!(
                "Topic '{}' collides with existing topic: {other}",
                t.name
            )));
        }
        let assignments = if t.assignments.is_empty() {
            if t.num_partitions < 1 {
                return Err(ControllerError::InvalidPartitions(
                    "Number of partitions was set to an invalid non-positive value.".into(),
                ));
            }
            Self::place_replicas(&image, 0, t.num_partitions, t.replication_factor)?
        } else {
            Self::check_assignments(&image, &t.assignments)?;
            t.assignments
        };
        let topic_id = Uuid::new_v4();
        if validate_only {
            return Ok(topic_id);
        }
        let mut records = vec![MetadataRecord::Topic {
            name: t.name.clone(),
            topic_id,
        }];
        records.extend(Self::partition_records(topic_id, 0, assignments));
        records.extend(
            t.configs
                .into_iter()
                .map(|(name, value)| MetadataRecord::Config {
                    resource: ConfigResource::Topic,
                    resource_name: t.name.clone(),
                    name,
                    value: Some(value),
                }),
        );
        self.commit(&records)?;
        Ok(topic_id)
    }

    /// Deletes a topic by id.
    ///
    /// # Errors
    /// UNKNOWN_TOPIC_ID when no such topic exists.
    pub fn delete_topic(&self, topic_id: Uuid) -> Result<String, ControllerError> {
        let _w = self.write.lock();
        let image = self.image();
        let name = image
            .topic_by_id(&topic_id)
            .map(|t| t.name.clone())
            .ok_or(ControllerError::UnknownTopicId)?;
        self.commit(&[MetadataRecord::RemoveTopic { topic_id }])?;
        Ok(name)
    }

    /// Grows a topic to `total_count` partitions (CreatePartitions).
    ///
    /// # Errors
    /// UNKNOWN_TOPIC_OR_PARTITION for an unknown topic; INVALID_PARTITIONS when `total_count`
    /// is not larger than the current count; INVALID_REPLICA_ASSIGNMENT for a bad assignment.
    pub fn create_partitions(
        &self,
        topic: &str,
        total_count: i32,
        assignments: Vec<Vec<i32>>,
        validate_only: bool,
    ) -> Result<(), ControllerError> {
        let _w = self.write.lock();
        let image = self.image();
        let t = image
            .topic(topic)
            .ok_or(ControllerError::UnknownTopicOrPartition)?;
        let current = t.partitions.len() as i32;
        if total_count < current {
            return Err(ControllerError::InvalidPartitions(format!(
                "Topic currently has {current} partitions, which is higher than the requested {total_count}."
            )));
        }
        if total_count == current {
            return Err(ControllerError::InvalidPartitions(format!(
                "Topic already has {current} partition(s)."
            )));
        }
        let added = total_count - current;
        let rf = t
            .partitions
            .values()
            .next()
            .map_or(1, |p| p.replicas.len() as i16);
        let assignments = if assignments.is_empty() {
            Self::place_replicas(&image, current, added, rf)?
        } else {
            if assignments.len() as i32 != added {
                return Err(ControllerError::InvalidReplicaAssignment(format!(
                    "Attempted to add {added} additional partition(s), but only {} assignment(s) were specified.",
                    assignments.len()
                )));
            }
            Self::check_assignments(&image, &assignments)?;
            assignments
        };
        if validate_only {
            return Ok(());
        }
        let records: Vec<_> = Self::partition_records(t.topic_id, current, assignments).collect();
        self.commit(&records)?;
        Ok(())
    }

    /// Sets (Some) or removes (None) configs of one resource, all at once. The broker has
    /// validated names and values.
    ///
    /// # Errors
    /// [`ControllerError::Log`]; UNKNOWN_TOPIC_OR_PARTITION for an unknown topic.
    pub fn alter_configs(
        &self,
        resource: ConfigResource,
        resource_name: &str,
        changes: Vec<(String, Option<String>)>,
    ) -> Result<(), ControllerError> {
        let _w = self.write.lock();
        if resource == ConfigResource::Topic && self.image().topic(resource_name).is_none() {
            return Err(ControllerError::UnknownTopicOrPartition);
        }
        let records: Vec<_> = changes
            .into_iter()
            .map(|(name, value)| MetadataRecord::Config {
                resource,
                resource_name: resource_name.to_string(),
                name,
                value,
            })
            .collect();
        self.commit(&records)?;
        Ok(())
    }

    /// Hands out a block of [`PRODUCER_ID_BLOCK_SIZE`] producer ids to `broker_id`; returns
    /// the first id of the block. The block is durable before it is returned, so ids are never
    /// reused, even after a crash.
    ///
    /// # Errors
    /// [`ControllerError::Log`].
    pub fn allocate_producer_ids(&self, broker_id: i32) -> Result<i64, ControllerError> {
        let _w = self.write.lock();
        let start = self.image().next_producer_id;
        self.commit(&[MetadataRecord::ProducerIds {
            broker_id,
            next_producer_id: start + PRODUCER_ID_BLOCK_SIZE,
        }])?;
        Ok(start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::FileMetadataLog;

    fn controller(dir: &std::path::Path) -> Controller {
        let c = Controller::open(Box::new(FileMetadataLog::open(dir).unwrap())).unwrap();
        c.register_broker(1, "127.0.0.1", 9092, None).unwrap();
        c
    }

    fn topic(name: &str, partitions: i32, rf: i16) -> NewTopic {
        NewTopic {
            name: name.into(),
            num_partitions: partitions,
            replication_factor: rf,
            assignments: vec![],
            configs: BTreeMap::from([("retention.ms".into(), "1000".into())]),
        }
    }

    #[test]
    fn topics_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let id = {
            let c = controller(dir.path());
            let id = c.create_topic(topic("orders", 3, 1), false).unwrap();
            c.create_partitions("orders", 5, vec![], false).unwrap();
            assert_eq!(c.allocate_producer_ids(1).unwrap(), 0);
            id
        };
        let c = controller(dir.path());
        let img = c.image();
        let t = img.topic("orders").unwrap();
        assert_eq!(t.topic_id, id);
        assert_eq!(t.partitions.len(), 5);
        assert_eq!(
            img.configs_of(ConfigResource::Topic, "orders")["retention.ms"],
            "1000"
        );
        assert_eq!(c.allocate_producer_ids(1).unwrap(), PRODUCER_ID_BLOCK_SIZE);
        c.delete_topic(id).unwrap();
        assert!(c.image().topic("orders").is_none());
        assert!(c
            .image()
            .configs_of(ConfigResource::Topic, "orders")
            .is_empty());
    }

    #[test]
    fn kafka_errors() {
        let dir = tempfile::tempdir().unwrap();
        let c = controller(dir.path());
        let code = |r: Result<Uuid, ControllerError>| r.unwrap_err().kafka_error_code();
        assert_eq!(code(c.create_topic(topic("", 1, 1), false)), 17);
        assert_eq!(code(c.create_topic(topic("a/b", 1, 1), false)), 17);
        assert_eq!(
            code(c.create_topic(topic(&"x".repeat(250), 1, 1), false)),
            17
        );
        assert_eq!(code(c.create_topic(topic("t", 0, 1), false)), 37);
        assert_eq!(code(c.create_topic(topic("t", 1, 3), false)), 38);
        c.create_topic(topic("a.b", 1, 1), false).unwrap();
        assert_eq!(code(c.create_topic(topic("a.b", 1, 1), false)), 36);
        assert_eq!(code(c.create_topic(topic("a_b", 1, 1), false)), 17);
        c.create_topic(topic("v", 1, 1), true).unwrap();
        assert!(c.image().topic("v").is_none());
        assert_eq!(
            c.create_partitions("a.b", 1, vec![], false)
                .unwrap_err()
                .kafka_error_code(),
            37
        );
    }
}
