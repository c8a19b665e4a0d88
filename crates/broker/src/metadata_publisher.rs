//! The broker's side of the metadata log: start-up of the metadata log, loader and controller
//! ([`start_metadata`]), and the publishers the loader calls for each committed batch
//! ([`install_publishers`]): ReplicaManager first (Kafka's `BrokerMetadataPublisher` applies
//! the partition changes before the coordinators hear of them), then the coordinators.

use std::path::Path;
use std::sync::{Arc, Weak};

use gregor_coordinator::group::GROUP_METADATA_TOPIC_NAME;
use gregor_metadata::controller::start_controller;
use gregor_metadata::loader::{start_loader, LoaderError};
use gregor_metadata::log::{FileMetadataLog, MetadataLog};
use gregor_metadata::publisher::{CoordinatorLeadership, CoordinatorPublisher};
use gregor_metadata::{ControllerHandle, MetadataDelta, MetadataImage, MetadataPublisher};
use tokio::sync::watch;
use tracing::info;

use crate::broker::Broker;
use crate::start_error::StartError;

/// Opens the metadata log in `metadata_dir`, starts the loader and the controller on it, and
/// waits until the loader has applied everything committed before start-up. Returns the
/// controller channel and the two tasks (which end when `shutdown` turns true).
///
/// # Errors
/// [`StartError::Metadata`] when the log cannot be opened or read.
pub async fn start_metadata(
    metadata_dir: &Path,
    shutdown: &watch::Receiver<bool>,
) -> Result<(ControllerHandle, Vec<tokio::task::JoinHandle<()>>), StartError> {
    let err = |e: &dyn std::fmt::Display| StartError::Metadata(e.to_string());
    let log: Arc<dyn MetadataLog> =
        Arc::new(FileMetadataLog::open(metadata_dir).map_err(|e| err(&e))?);
    let high_watermark = log.high_watermark();
    let (loader, loader_task) =
        start_loader(log.subscribe().map_err(|e| err(&e))?, shutdown.clone());
    let (controller, controller_task) =
        start_controller(log, loader.clone(), shutdown.clone()).map_err(|e| err(&e))?;
    loader
        .wait_for_catch_up(high_watermark)
        .await
        .map_err(|e| err(&e))?;
    info!(
        offset = high_watermark,
        "metadata loaded from {}",
        metadata_dir.display()
    );
    Ok((controller, vec![loader_task, controller_task]))
}

/// Installs the broker's publishers on the loader, in the order they must hear of each batch:
/// ReplicaManager, then the coordinators (each as a
/// [`gregor_metadata::publisher::CoordinatorPublisher`] over its internal topic, calling its
/// `on_became_leader` / `on_resigned`). Each first gets the current image, so when this
/// returns the partitions match it.
///
/// # Errors
/// The publisher's failure on the current image.
pub async fn install_publishers(broker: &Arc<Broker>) -> Result<(), LoaderError> {
    let loader = broker.controller.loader();
    loader
        .install_publisher(Arc::new(ReplicaManagerPublisher {
            broker: Arc::downgrade(broker),
        }))
        .await?;
    loader
        .install_publisher(Arc::new(CoordinatorPublisher::new(
            GROUP_METADATA_TOPIC_NAME,
            broker.config.node_id,
            Arc::new(GroupCoordinatorLeadership {
                broker: Arc::downgrade(broker),
            }),
        )))
        .await
}

/// Turns leadership of `__consumer_offsets` partitions into the group coordinator's
/// `on_became_leader` (load the partition's groups and offsets) and `on_resigned` (unload).
/// The coordinator crate knows nothing of metadata, so this adapter lives in the broker.
struct GroupCoordinatorLeadership {
    broker: Weak<Broker>,
}

impl CoordinatorLeadership for GroupCoordinatorLeadership {
    fn on_became_leader(&self, partition: i32, _leader_epoch: i32) {
        if let Some(b) = self.broker.upgrade() {
            b.group_coordinator.on_became_leader(partition);
        }
    }

    fn on_resigned(&self, partition: i32, _leader_epoch: Option<i32>) {
        if let Some(b) = self.broker.upgrade() {
            b.group_coordinator.on_resigned(partition);
        }
    }
}

/// Applies each image to the hosted partitions ([`crate::replica_manager::ReplicaManager::apply_image`]):
/// creates and deletes logs, sets leadership and configs.
struct ReplicaManagerPublisher {
    /// Weak: the loader must not keep a stopped broker alive.
    broker: Weak<Broker>,
}

impl MetadataPublisher for ReplicaManagerPublisher {
    fn name(&self) -> &str {
        "ReplicaManager"
    }

    fn on_metadata_update(
        &self,
        _delta: &MetadataDelta<'_>,
        image: &Arc<MetadataImage>,
    ) -> Result<(), String> {
        let Some(broker) = self.broker.upgrade() else {
            return Ok(());
        };
        broker
            .replica_manager
            .apply_image(image)
            .map_err(|e| format!("applying metadata to partition logs failed: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use gregor_protocol::kafka_protocol::messages::create_topics_request::CreatableTopic;
    use gregor_protocol::kafka_protocol::messages::delete_topics_request::DeleteTopicState;
    use gregor_protocol::kafka_protocol::messages::{
        ApiKey, CreateTopicsRequest, DeleteTopicsRequest, TopicName,
    };

    use crate::config::BrokerConfig;
    use crate::error_codes as ec;
    use crate::handlers::{sb, topics};

    fn ctx(api_key: ApiKey, version: i16) -> gregor_network::RequestContext {
        gregor_network::RequestContext::local(api_key, version)
    }

    fn creatable(name: &str, partitions: i32) -> CreatableTopic {
        CreatableTopic::default()
            .with_name(TopicName(sb(name)))
            .with_num_partitions(partitions)
            .with_replication_factor(-1)
    }

    /// A CreateTopics or DeleteTopics response is sent only after this broker applied the
    /// change: its partitions exist (or are gone) in ReplicaManager when the handler returns,
    /// and per-topic errors stay per topic in a request that also changes something.
    #[tokio::test]
    async fn topic_changes_are_applied_before_the_response() {
        let dir = tempfile::tempdir().expect("tempdir");
        let props: BTreeMap<String, String> = [
            ("log.dirs", dir.path().display().to_string()),
            ("listeners", "PLAINTEXT://127.0.0.1:0".into()),
            ("admin.listener", String::new()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let (config, _) = BrokerConfig::from_properties(props).expect("config");
        let running = crate::server::start(config).await.expect("start");
        let b = &running.broker;

        let req = CreateTopicsRequest::default().with_topics(vec![creatable("a", 3)]);
        let resp = topics::create_topics(b, &ctx(ApiKey::CreateTopics, 7), req, 7).await;
        assert_eq!(resp.topics[0].error_code, ec::NONE);
        let req = CreateTopicsRequest::default().with_topics(vec![
            creatable("a", 1),
            creatable("bad/name", 1),
            creatable("b", 2),
        ]);
        let resp = topics::create_topics(b, &ctx(ApiKey::CreateTopics, 7), req, 7).await;
        let codes: Vec<i16> = resp.topics.iter().map(|t| t.error_code).collect();
        assert_eq!(
            codes,
            vec![
                ec::TOPIC_ALREADY_EXISTS,
                ec::INVALID_TOPIC_EXCEPTION,
                ec::NONE
            ]
        );
        for (topic, partitions) in [("a", 3), ("b", 2)] {
            for p in 0..partitions {
                assert!(
                    b.replica_manager.partition(topic, p).is_some(),
                    "{topic}-{p} hosted when the response is sent"
                );
            }
        }

        let req = DeleteTopicsRequest::default().with_topics(vec![
            DeleteTopicState::default().with_name(Some(TopicName(sb("a"))))
        ]);
        let resp = topics::delete_topics(b, &ctx(ApiKey::DeleteTopics, 6), req, 6).await;
        assert_eq!(resp.responses[0].error_code, ec::NONE);
        assert!(b.replica_manager.partition("a", 0).is_none());
        assert!(b.controller.image().topic("a").is_none());
        running.shutdown().await.expect("shutdown");
    }
}
