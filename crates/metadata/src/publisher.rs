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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::MetadataRecord;
    use gregor_protocol::metadata_records::{PartitionRecord, RemoveTopicRecord, TopicRecord};
    use parking_lot::Mutex;
    use uuid::Uuid;

    #[derive(Default)]
    struct Events(Mutex<Vec<String>>);

    impl CoordinatorLeadership for Events {
        fn on_became_leader(&self, partition: i32, leader_epoch: i32) {
            self.0
                .lock()
                .push(format!("lead {partition}@{leader_epoch}"));
        }
        fn on_resigned(&self, partition: i32, leader_epoch: Option<i32>) {
            self.0
                .lock()
                .push(format!("resign {partition}@{leader_epoch:?}"));
        }
    }

    fn partition(topic_id: Uuid, partition: i32, leader: i32, leader_epoch: i32) -> MetadataRecord {
        PartitionRecord {
            topic_id,
            partition_id: partition,
            replicas: vec![1, 2],
            isr: vec![1, 2],
            leader,
            leader_epoch,
            partition_epoch: leader_epoch,
            ..PartitionRecord::default()
        }
        .into()
    }

    fn topic(name: &str, topic_id: Uuid) -> MetadataRecord {
        TopicRecord {
            name: name.into(),
            topic_id,
            ..TopicRecord::default()
        }
        .into()
    }

    /// Applies `records` to `image` through the publisher, as the loader does.
    fn step(
        p: &CoordinatorPublisher,
        image: &mut Arc<MetadataImage>,
        records: Vec<MetadataRecord>,
    ) {
        let mut next = (**image).clone();
        for r in &records {
            next.apply(r);
        }
        let next = Arc::new(next);
        let delta = MetadataDelta {
            snapshot: false,
            epoch: 1,
            previous: image,
            records: &records,
        };
        p.on_metadata_update(&delta, &next).unwrap();
        *image = next;
    }

    #[test]
    fn leadership_changes_of_the_coordinator_topic_reach_the_coordinator() {
        let events = Arc::new(Events::default());
        let p = CoordinatorPublisher::new("__consumer_offsets", 1, events.clone());
        let mut image = Arc::new(MetadataImage::default());
        let id = Uuid::new_v4();
        let other = Uuid::new_v4();
        step(
            &p,
            &mut image,
            vec![
                topic("__consumer_offsets", id),
                partition(id, 0, 1, 0),
                partition(id, 1, 2, 0),
                // Another topic led by this node is not the coordinator's business.
                topic("orders", other),
                partition(other, 0, 1, 0),
            ],
        );
        assert_eq!(
            events.0.lock().drain(..).collect::<Vec<_>>(),
            vec!["lead 0@0"]
        );
        // Leadership moves: 0 to node 2, 1 to this node; then 1 is re-elected at a new epoch.
        step(
            &p,
            &mut image,
            vec![partition(id, 0, 2, 1), partition(id, 1, 1, 1)],
        );
        assert_eq!(
            events.0.lock().drain(..).collect::<Vec<_>>(),
            vec!["resign 0@Some(1)", "lead 1@1"]
        );
        step(&p, &mut image, vec![partition(id, 1, 1, 2)]);
        assert_eq!(
            events.0.lock().drain(..).collect::<Vec<_>>(),
            vec!["lead 1@2"]
        );
        // Nothing changes for this topic: no event.
        step(&p, &mut image, vec![partition(other, 0, 2, 1)]);
        assert!(events.0.lock().is_empty());
        // The topic is deleted: resign without an epoch.
        step(
            &p,
            &mut image,
            vec![RemoveTopicRecord {
                topic_id: id,
                ..RemoveTopicRecord::default()
            }
            .into()],
        );
        assert_eq!(
            events.0.lock().drain(..).collect::<Vec<_>>(),
            vec!["resign 1@None"]
        );
    }
}
