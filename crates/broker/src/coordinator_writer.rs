//! The broker's side of the coordinator runtime (`gregor-coordinator`): the
//! [`PartitionWriter`] over the replica manager, the [`TopicMetadata`] over the metadata image,
//! the creation of `__consumer_offsets`, and the leadership events that load and unload
//! coordinator partitions. Everything the coordinators need from the broker goes through this
//! file.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

use bytes::Bytes;
use gregor_coordinator::group::{GroupConfigError, GROUP_METADATA_TOPIC_NAME};
use gregor_coordinator::runtime::{HighWatermarkFuture, PartitionWriter, TopicMetadata};
use gregor_metadata::controller::NewTopic;
use gregor_protocol::error::ErrorCode;
use tracing::{info, warn};
use uuid::Uuid;

use crate::broker::Broker;
use crate::config::ConfigError;
use crate::replica_manager::Partition;

impl From<GroupConfigError> for ConfigError {
    fn from(e: GroupConfigError) -> Self {
        ConfigError {
            name: e.name,
            value: e.value,
            reason: e.reason,
        }
    }
}

/// Writes coordinator records through the broker's replica manager. Holds the broker weakly
/// (the broker owns the coordinators that own this writer).
pub struct BrokerPartitionWriter {
    broker: Weak<Broker>,
}

impl BrokerPartitionWriter {
    /// A writer for the broker behind `broker`.
    pub fn new(broker: Weak<Broker>) -> Arc<Self> {
        Arc::new(Self { broker })
    }

    fn partition(&self, topic: &str, partition: i32) -> Option<Arc<Partition>> {
        self.broker
            .upgrade()?
            .replica_manager
            .partition(topic, partition)
    }
}

impl PartitionWriter for BrokerPartitionWriter {
    fn is_leader(&self, topic: &str, partition: i32) -> bool {
        self.partition(topic, partition)
            .is_some_and(|p| p.is_leader())
    }

    fn append(
        &self,
        topic: &str,
        partition: i32,
        batch: &mut [u8],
    ) -> Result<i64, (ErrorCode, String)> {
        let Some(broker) = self.broker.upgrade() else {
            return Err((ErrorCode::NotLeaderOrFollower, String::new()));
        };
        let Some(p) = broker.replica_manager.partition(topic, partition) else {
            return Err((ErrorCode::NotLeaderOrFollower, String::new()));
        };
        let append = |p: &Partition, batch: &mut [u8]| {
            // Kafka's AppendOrigin.COORDINATOR: no sequence checks (coordinator batches carry
            // none), producer epoch and transaction state checked.
            p.append_records_as_leader_from(batch, -1, gregor_log::AppendOrigin::Coordinator, None)
                .map(|info| info.last_offset + 1)
                .map_err(|r| (ErrorCode::for_code(r.code), r.message))
        };
        // The coordinator appends in state order under its own lock, so this call is
        // synchronous; the write itself runs on the I/O pool like every other log write, and
        // `block_in_place` hands this async worker's other tasks to another thread meanwhile,
        // so a slow disk does not stall the connections it serves. (A current-thread runtime,
        // as in some tests, cannot do that and appends in place.)
        match tokio::runtime::Handle::try_current() {
            Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                let io = broker.replica_manager.io_pool().clone();
                let mut owned = batch.to_vec();
                let result = tokio::task::block_in_place(|| {
                    handle.block_on(io.run(move || {
                        let r = append(&p, &mut owned);
                        (r, owned)
                    }))
                });
                match result {
                    Ok((r, owned)) => {
                        batch.copy_from_slice(&owned);
                        r
                    }
                    Err(e) => Err((ErrorCode::KafkaStorageError, e.to_string())),
                }
            }
            _ => append(&p, batch),
        }
    }

    fn high_watermark(&self, topic: &str, partition: i32) -> Option<i64> {
        self.partition(topic, partition).map(|p| p.high_watermark())
    }

    fn log_start_offset(&self, topic: &str, partition: i32) -> Option<i64> {
        self.partition(topic, partition)
            .map(|p| p.log.log_start_offset())
    }

    fn read(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
        max_bytes: usize,
    ) -> Result<Bytes, (ErrorCode, String)> {
        let Some(p) = self.partition(topic, partition) else {
            return Err((ErrorCode::NotLeaderOrFollower, String::new()));
        };
        p.read(offset, max_bytes, 0, true)
            .map(|r| r.records)
            .map_err(|e| (e.error_code(), e.to_string()))
    }

    fn wait_for_high_watermark(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
        timeout_ms: i64,
    ) -> HighWatermarkFuture {
        let p = self.partition(topic, partition);
        let produce = self
            .broker
            .upgrade()
            .map(|b| b.replica_manager.delayed_operations().produce.clone());
        Box::pin(async move {
            let (Some(p), Some(produce)) = (p, produce) else {
                return Err(ErrorCode::NotLeaderOrFollower);
            };
            // A delayed operation in the produce purgatory, as an acks=all append waits: it
            // completes when the high watermark reaches `offset` or leadership moves, and
            // leaves every watch list when it completes or expires.
            let watched = p.clone();
            let check =
                Box::new(move || watched.high_watermark() >= offset || !watched.is_leader());
            if let Some(op) = produce.try_complete_else_watch(
                vec![p.topic_partition().clone()],
                timeout_ms,
                check,
            ) {
                op.wait().await;
            }
            if p.high_watermark() >= offset {
                Ok(())
            } else if !p.is_leader() {
                Err(ErrorCode::NotLeaderOrFollower)
            } else {
                Err(ErrorCode::RequestTimedOut)
            }
        })
    }
}

/// Topic ids and partition counts from the controller's latest image.
pub struct BrokerTopicMetadata {
    broker: Weak<Broker>,
}

impl BrokerTopicMetadata {
    /// Metadata of the broker behind `broker`.
    pub fn new(broker: Weak<Broker>) -> Arc<Self> {
        Arc::new(Self { broker })
    }
}

impl TopicMetadata for BrokerTopicMetadata {
    fn topic(&self, name: &str) -> Option<(Uuid, i32)> {
        let b = self.broker.upgrade()?;
        let image = b.controller.image();
        image.topic(name).map(|t| {
            (
                t.topic_id,
                i32::try_from(t.partitions.len()).unwrap_or(i32::MAX),
            )
        })
    }

    fn group_config(&self, group_id: &str, name: &str) -> Option<String> {
        let b = self.broker.upgrade()?;
        let image = b.controller.image();
        image
            .configs_of(crate::handlers::configs::GROUP_CONFIG_RESOURCE, group_id)
            .remove(name)
    }
}

/// The replication factor `__consumer_offsets` is created with: `offsets.topic.replication.factor`
/// (Kafka's default 3). As in Kafka, the creation fails (COORDINATOR_NOT_AVAILABLE, the client
/// retries) until that many brokers are registered, so a 3-node cluster never gets an
/// under-replicated offsets topic because its first group came early. One exception, so that
/// a one-node `gregor serve` works without a config file: in a single-node cluster (this node
/// is the only quorum voter) the factor is at most the number of registered brokers (Kafka's
/// own single-node example config sets it to 1 for the same reason).
fn offsets_topic_replication_factor(
    broker: &Broker,
    image: &gregor_metadata::MetadataImage,
) -> i16 {
    let configured = broker
        .group_coordinator
        .config
        .offsets_topic_replication_factor;
    let voters = &broker.config.quorum.voters;
    let single_node = voters.len() == 1 && voters.contains(broker.config.node_id);
    if single_node {
        let brokers = image.brokers.len().max(1);
        configured.min(i16::try_from(brokers).unwrap_or(i16::MAX))
    } else {
        configured
    }
}

/// Creates `__consumer_offsets` if it does not exist (Kafka creates it on the first
/// FindCoordinator for a group): `offsets.topic.num.partitions` partitions,
/// `cleanup.policy=compact`, `offsets.topic.segment.bytes`. The metadata loader loads the
/// partitions this broker leads before the creation returns (`metadata_publisher`).
///
/// # Errors
/// The Kafka error code to return to the client (COORDINATOR_NOT_AVAILABLE).
pub async fn ensure_offsets_topic(broker: &Broker) -> Result<(), i16> {
    let config = &broker.group_coordinator.config;
    let image = broker.controller.image();
    if image.topic(GROUP_METADATA_TOPIC_NAME).is_some() {
        return Ok(());
    }
    let rf = offsets_topic_replication_factor(broker, &image);
    let mut configs = BTreeMap::new();
    configs.insert("cleanup.policy".to_string(), "compact".to_string());
    configs.insert("compression.type".to_string(), "producer".to_string());
    configs.insert(
        "segment.bytes".to_string(),
        config.offsets_topic_segment_bytes.to_string(),
    );
    let t = NewTopic {
        name: GROUP_METADATA_TOPIC_NAME.to_string(),
        num_partitions: config.offsets_topic_num_partitions,
        replication_factor: rf,
        assignments: vec![],
        configs,
    };
    let created = broker.create_topics_internal(vec![t]).await.and_then(|r| {
        r.into_iter().next().unwrap_or(Err(
            gregor_metadata::ControllerError::UnknownTopicOrPartition,
        ))
    });
    match created {
        Ok(_) => {
            info!(
                partitions = config.offsets_topic_num_partitions,
                "created {GROUP_METADATA_TOPIC_NAME}"
            );
        }
        Err(e) if e.error_code() == ErrorCode::TopicAlreadyExists => {}
        Err(e) => {
            warn!(error = %e, "cannot create {GROUP_METADATA_TOPIC_NAME}");
            return Err(ErrorCode::CoordinatorNotAvailable.code());
        }
    }
    Ok(())
}
