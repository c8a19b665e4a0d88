//! Publishers that turn image changes into leadership events for coordinators (Kafka's
//! `GroupCoordinator.onElection` / `onResignation`, called from `BrokerMetadataPublisher`):
//! a coordinator keeps its state in the partitions of an internal topic
//! (`__consumer_offsets`, `__transaction_state`) and loads a partition when this node becomes
//! its leader, unloads it when this node stops being its leader.

use std::sync::Arc;

use crate::image::MetadataImage;
use crate::loader::{MetadataDelta, MetadataPublisher};

/// A coordinator that follows leadership of its internal topic's partitions on this node.
pub trait CoordinatorLeadership: Send + Sync {
    /// This node became the leader of `partition` at `leader_epoch` (also called again with a
    /// new epoch when it is re-elected).
    fn on_became_leader(&self, partition: i32, leader_epoch: i32);

    /// This node is no longer the leader of `partition`; `leader_epoch` is the partition's new
    /// leader epoch, None when the partition (its topic) is gone.
    fn on_resigned(&self, partition: i32, leader_epoch: Option<i32>);
}

/// A [`MetadataPublisher`] that calls a [`CoordinatorLeadership`] for the partitions of one
/// topic whose leadership on this node changed.
pub struct CoordinatorPublisher {
    name: String,
    topic: String,
    node_id: i32,
    coordinator: Arc<dyn CoordinatorLeadership>,
}

impl CoordinatorPublisher {
    /// Follows `topic`'s partitions for node `node_id`.
    pub fn new(
        topic: impl Into<String>,
        node_id: i32,
        coordinator: Arc<dyn CoordinatorLeadership>,
    ) -> Self {
        let topic = topic.into();
        Self {
            name: format!("coordinator of {topic}"),
            topic,
            node_id,
            coordinator,
        }
    }

    /// `(partition, leader_epoch)` of the partitions of the topic that `node` leads in `image`.
    fn led(&self, image: &MetadataImage) -> Vec<(i32, i32)> {
        image.topic(&self.topic).map_or_else(Vec::new, |t| {
            t.partitions
                .iter()
                .filter(|(_, p)| p.leader == self.node_id)
                .map(|(i, p)| (*i, p.leader_epoch))
                .collect()
        })
    }
}

impl MetadataPublisher for CoordinatorPublisher {
    fn name(&self) -> &str {
        &self.name
    }

    fn on_metadata_update(
        &self,
        delta: &MetadataDelta<'_>,
        image: &Arc<MetadataImage>,
    ) -> Result<(), String> {
        let before = self.led(delta.previous);
        let after = self.led(image);
        // A topic deleted and re-created with the same name is a new partition: resign first.
        let same_topic =
            delta.previous.topic_ids.get(&self.topic) == image.topic_ids.get(&self.topic);
        for (partition, _) in &before {
            let still = same_topic && after.iter().any(|(p, _)| p == partition);
            if !still {
                let epoch = image
                    .topic(&self.topic)
                    .filter(|_| same_topic)
                    .and_then(|t| t.partitions.get(partition))
                    .map(|p| p.leader_epoch);
                self.coordinator.on_resigned(*partition, epoch);
            }
        }
        for (partition, epoch) in &after {
            if !same_topic || !before.contains(&(*partition, *epoch)) {
                self.coordinator.on_became_leader(*partition, *epoch);
            }
        }
        Ok(())
    }
}
