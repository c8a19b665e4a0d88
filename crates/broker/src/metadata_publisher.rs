//! The broker's side of the metadata log: start-up of the metadata log, loader and controller
//! ([`start_metadata`]), and the publishers the loader calls for each committed batch
//! ([`install_publishers`]): ReplicaManager first (Kafka's `BrokerMetadataPublisher` applies
//! the partition changes before the coordinators hear of them), then the coordinators.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use gregor_coordinator::group::GROUP_METADATA_TOPIC_NAME;
use gregor_metadata::controller::{start_controller_with, ControllerConfig};
use gregor_metadata::loader::{start_loader, LoaderError};
use gregor_metadata::log::{
    FileMetadataLog, MetadataLog, MetadataLogError, RaftMetadataLog, METADATA_LOG_FILE,
};
use gregor_metadata::publisher::{CoordinatorLeadership, CoordinatorPublisher};
use gregor_metadata::snapshot::SnapshotGenerator;
use gregor_metadata::{ControllerHandle, MetadataDelta, MetadataImage, MetadataPublisher};
use gregor_raft::driver::transport::{SocketTransport, TransportConfig};
use gregor_raft::driver::{RaftManager, RaftManagerConfig};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::broker::Broker;
use crate::config::BrokerConfig;
use crate::start_error::StartError;

/// Starts this node's member of the metadata quorum (KRaft, KIP-595) on
/// `<metadata_log_dir>/__cluster_metadata-0/`, with the socket transport to the other voters
/// (`controller.quorum.voters`) and `cluster_id` in its requests.
///
/// # Errors
/// [`StartError::Metadata`] when `__cluster_metadata-0` or `quorum-state` cannot be opened.
pub fn start_quorum(
    config: &BrokerConfig,
    metadata_log_dir: &Path,
    cluster_id: &str,
) -> Result<Arc<RaftManager>, StartError> {
    start_quorum_with(
        config,
        metadata_log_dir,
        cluster_id,
        gregor_network::client::ClientSecurity::plaintext(),
    )
}

/// The raft transport's connector: gregor's client connector to the controller listener.
struct SecureRaftConnector(gregor_network::client::ClientSecurity);

impl gregor_raft::driver::transport::Connector for SecureRaftConnector {
    fn connect<'a>(
        &'a self,
        address: &'a str,
        client_id: &'a str,
        timeout: std::time::Duration,
    ) -> gregor_raft::driver::transport::ConnectFuture<'a> {
        Box::pin(async move {
            let stream = self.0.connect(address, client_id, timeout).await?;
            Ok(Box::new(stream) as Box<dyn gregor_raft::driver::transport::PeerStream>)
        })
    }
}

/// [`start_quorum`] with the raft transport's connections to the other voters secured by
/// `security` (the controller listener's TLS and SASL).
///
/// # Errors
/// As [`start_quorum`].
pub fn start_quorum_with(
    config: &BrokerConfig,
    metadata_log_dir: &Path,
    cluster_id: &str,
    security: gregor_network::client::ClientSecurity,
) -> Result<Arc<RaftManager>, StartError> {
    let q = &config.quorum;
    let listener_name = q
        .controller_listener_names
        .first()
        .cloned()
        .or_else(|| config.listeners.first().map(|l| l.name.clone()))
        .unwrap_or_else(|| "CONTROLLER".into());
    let mut quorum = q.quorum_config(config.node_id);
    quorum.cluster_id = Some(cluster_id.to_string());
    let mut endpoints = q.endpoints.clone();
    // A dynamic quorum (KIP-853: `controller.quorum.bootstrap.servers` instead of
    // `controller.quorum.voters`): its voters are those of the bootstrap snapshot that
    // `storage format --standalone/--initial-controllers` wrote. Adding and removing voters
    // (AddRaftVoter/RemoveRaftVoter) is not implemented, so the set stays that one.
    let voters_configured = config
        .raw
        .get("controller.quorum.voters")
        .is_some_and(|v| !v.trim().is_empty());
    if let Some(bootstrap) = config
        .raw
        .get("controller.quorum.bootstrap.servers")
        .filter(|v| !v.trim().is_empty() && !voters_configured)
    {
        let voters = crate::storage::read_snapshot_voters(metadata_log_dir, &listener_name)
            .map_err(|e| StartError::Metadata(e.to_string()))?
            .ok_or_else(|| {
                StartError::Metadata(format!(
                    "controller.quorum.bootstrap.servers={bootstrap}: the metadata log in {} names no voters (it was formatted without --standalone or --initial-controllers); joining a dynamic quorum through AddRaftVoter (KIP-853) is not implemented: format every controller with --initial-controllers, or set controller.quorum.voters",
                    metadata_log_dir.display()
                ))
            })?;
        let set = gregor_raft::VoterSet::new(voters.keys().copied())
            .map_err(|e| StartError::Metadata(e.to_string()))?;
        if q.controller && !set.contains(config.node_id) {
            return Err(StartError::Metadata(format!(
                "node {} has the controller role but is not among the voters {:?} of the bootstrap snapshot in {}; adding a controller (AddRaftVoter, KIP-853) is not implemented",
                config.node_id,
                voters.keys().collect::<Vec<_>>(),
                metadata_log_dir.display()
            )));
        }
        quorum.voters = set;
        endpoints = voters;
    }
    let raft_config = RaftManagerConfig {
        quorum,
        metadata_log_dir: metadata_log_dir.to_path_buf(),
        log: q.metadata_log.clone(),
        voter_endpoints: endpoints.clone(),
        controller_listener_name: listener_name,
    };
    let transport = TransportConfig {
        node_id: config.node_id,
        endpoints,
        request_timeout_ms: q.request_timeout_ms,
        retry_backoff_ms: q.retry_backoff_ms,
    };
    RaftManager::start(raft_config, |inbound| {
        SocketTransport::with_connector(transport, inbound, Arc::new(SecureRaftConnector(security)))
    })
    .map_err(|e| StartError::Metadata(e.to_string()))
}

/// The quorum's `kraft.version` (KIP-853): 1 for a dynamic quorum
/// (`controller.quorum.bootstrap.servers` without `controller.quorum.voters`, whose voters the
/// bootstrap snapshot names, as [`start_quorum`] reads them), 0 for a static one. gregor does
/// not change it while running (no KRaftVersion upgrade), so the start-up value stays true.
pub fn kraft_version(config: &BrokerConfig) -> i16 {
    let set = |key: &str| config.raw.get(key).is_some_and(|v| !v.trim().is_empty());
    i16::from(!set("controller.quorum.voters") && set("controller.quorum.bootstrap.servers"))
}

/// Starts the [`RaftMetadataLog`] on the quorum member `manager`, the loader and the
/// controller, and waits until the loader has applied everything committed (the quorum's high
/// watermark must be known first: a one-voter quorum elects itself at once, a larger one waits
/// for a majority, so the controller listeners must already be served). Then migrates the
/// records of a pre-KRaft `legacy_dir/metadata.log` ([`migrate_file_log`]). Returns the
/// controller channel and the tasks (which end when `shutdown` turns true; the last one
/// resigns and closes the quorum member then).
///
/// # Errors
/// [`StartError::Metadata`] when the log cannot be read or the quorum stops.
pub async fn start_metadata(
    manager: Arc<RaftManager>,
    legacy_dir: &Path,
    shutdown: &watch::Receiver<bool>,
    controller_config: ControllerConfig,
) -> Result<
    (
        ControllerHandle,
        Arc<RaftMetadataLog>,
        Vec<tokio::task::JoinHandle<()>>,
    ),
    StartError,
> {
    let err = |e: &dyn std::fmt::Display| StartError::Metadata(e.to_string());
    let voters: Vec<_> = manager.config().quorum.voters.ids().collect();
    let raft_log = Arc::new(RaftMetadataLog::start(manager.clone()));
    info!(
        node = manager.node_id(),
        ?voters,
        "waiting for the metadata quorum's high watermark"
    );
    let high_watermark = {
        // A quorum waits for a majority of its voters; say so every 10 s, naming them, so an
        // operator who started one node of three sees why nothing happens.
        let catch_up = raft_log.catch_up();
        tokio::pin!(catch_up);
        let started = std::time::Instant::now();
        let mut every = tokio::time::interval(std::time::Duration::from_secs(10));
        every.tick().await;
        loop {
            tokio::select! {
                r = &mut catch_up => break r.map_err(|e| err(&e))?,
                _ = every.tick() => {
                    let leader = manager.leader_and_epoch().borrow().leader_id;
                    warn!(
                        node = manager.node_id(),
                        ?voters,
                        ?leader,
                        waited_s = started.elapsed().as_secs(),
                        "still waiting for the metadata quorum: a majority of the voters ({} of {}) \
                         must be running and reachable on their controller listeners",
                        voters.len() / 2 + 1,
                        voters.len()
                    );
                }
            }
        }
    };
    let log: Arc<dyn MetadataLog> = raft_log.clone();
    let (loader, loader_task) =
        start_loader(log.subscribe().map_err(|e| err(&e))?, shutdown.clone());
    loader
        .install_publisher(Arc::new(SnapshotGenerator::new(
            raft_log.clone(),
            manager.config().log.clone(),
        )))
        .await
        .map_err(|e| err(&e))?;
    let bootstrap_records =
        crate::storage::read_bootstrap_records(&manager.config().metadata_log_dir)
            .map_err(|e| err(&e))?;
    let (controller, controller_task) = start_controller_with(
        log,
        loader.clone(),
        shutdown.clone(),
        ControllerConfig {
            bootstrap_records,
            ..controller_config
        },
    )
    .map_err(|e| err(&e))?;
    loader
        .wait_for_catch_up(high_watermark)
        .await
        .map_err(|e| err(&e))?;
    migrate_file_log(&raft_log, legacy_dir).await?;
    loader
        .wait_for_catch_up(raft_log.high_watermark())
        .await
        .map_err(|e| err(&e))?;
    info!(
        offset = raft_log.high_watermark(),
        "metadata loaded from {}",
        manager.config().metadata_log_dir.display()
    );
    let mut stop = shutdown.clone();
    let closing = raft_log.clone();
    let closer = tokio::spawn(async move {
        let _ = stop.wait_for(|s| *s).await;
        closing.shutdown().await;
    });
    Ok((
        controller,
        raft_log,
        vec![loader_task, controller_task, closer],
    ))
}

/// File name the pre-KRaft metadata log gets once its records are in the quorum.
pub const MIGRATED_FILE: &str = "metadata.log.migrated";

/// Moves a pre-KRaft metadata log (`<dir>/metadata.log`, [`FileMetadataLog`]) into the quorum:
/// when the quorum holds no metadata record yet and this node leads it, every record of the
/// file is proposed once as one batch, and the file is then renamed `metadata.log.migrated`.
/// A node that does not lead leaves the file for a later start (and logs it).
///
/// # Errors
/// [`StartError::Metadata`] when the file cannot be read or renamed or the batch does not
/// commit.
pub async fn migrate_file_log(log: &RaftMetadataLog, dir: &Path) -> Result<(), StartError> {
    let err = |e: &dyn std::fmt::Display| StartError::Metadata(e.to_string());
    let path = dir.join(METADATA_LOG_FILE);
    if !path.exists() {
        return Ok(());
    }
    if log.high_watermark() > 0 {
        warn!(path = %path.display(), "the metadata quorum already holds records; the old metadata log is not migrated");
        return Ok(());
    }
    let records = FileMetadataLog::open(dir)
        .and_then(|f| f.read_all())
        .map_err(|e| err(&e))?;
    if !records.is_empty() {
        let count = records.len();
        match log.propose(records).await {
            Ok(_) => {
                info!(records = count, path = %path.display(), "migrated the metadata log into the KRaft quorum")
            }
            Err(MetadataLogError::NotLeader { leader_id, .. }) => {
                warn!(?leader_id, path = %path.display(), "not the quorum leader: the old metadata log is migrated by a later start on the leader");
                return Ok(());
            }
            Err(e) => return Err(err(&e)),
        }
    }
    std::fs::rename(&path, dir.join(MIGRATED_FILE)).map_err(|e| err(&e))?;
    Ok(())
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
            installed: AtomicBool::new(false),
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
        .await?;
    loader
        .install_publisher(Arc::new(CoordinatorPublisher::new(
            gregor_coordinator::transaction::TRANSACTION_STATE_TOPIC_NAME,
            broker.config.node_id,
            Arc::new(TransactionCoordinatorLeadership {
                broker: Arc::downgrade(broker),
            }),
        )))
        .await
}

/// Turns leadership of `__transaction_state` partitions into the transaction coordinator's
/// `on_became_leader` (load the partition's transactional ids; the leader epoch is the
/// coordinator epoch of its markers) and `on_resigned` (unload).
struct TransactionCoordinatorLeadership {
    broker: Weak<Broker>,
}

impl CoordinatorLeadership for TransactionCoordinatorLeadership {
    fn on_became_leader(&self, partition: i32, leader_epoch: i32) {
        if let Some(b) = self.broker.upgrade() {
            b.transaction_coordinator
                .on_became_leader(partition, leader_epoch);
        }
    }

    fn on_resigned(&self, partition: i32, _leader_epoch: Option<i32>) {
        if let Some(b) = self.broker.upgrade() {
            b.transaction_coordinator.on_resigned(partition);
        }
    }
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
/// creates and deletes logs, sets leadership and configs; then queues the directory
/// assignments of the logs whose directory the registration does not name
/// ([`crate::assignments::AssignmentsManager::on_metadata`]).
///
/// At start-up (the first image, when the publisher is installed) a replica whose log cannot
/// be created (a file where its directory goes, no permission, a full disk) does not stop the
/// broker: the failure is logged, the other partitions are served, that replica answers
/// KAFKA_STORAGE_ERROR and its creation is retried every
/// [`crate::replica_manager::LOG_CREATION_RETRY_INTERVAL`] (Kafka takes the whole log
/// directory offline instead, and with a single directory stops). A log that cannot be deleted
/// still fails the start.
struct ReplicaManagerPublisher {
    /// Weak: the loader must not keep a stopped broker alive.
    broker: Weak<Broker>,
    /// Whether the first image (start-up) was applied.
    installed: AtomicBool,
}

impl MetadataPublisher for ReplicaManagerPublisher {
    fn name(&self) -> &str {
        "ReplicaManager"
    }

    fn on_metadata_update(
        &self,
        delta: &MetadataDelta<'_>,
        image: &Arc<MetadataImage>,
    ) -> Result<(), String> {
        let Some(broker) = self.broker.upgrade() else {
            return Ok(());
        };
        let had_creation_failures = broker.replica_manager.has_log_creation_failures();
        let applied = broker.replica_manager.apply_metadata(image, delta.snapshot);
        // Logs created or loaded in another directory than their registration names are
        // assigned to theirs (KIP-858); also after an error, which leaves the rest applied.
        if let Some(assignments) = broker.assignments.get() {
            assignments.on_metadata(image, &broker.replica_manager);
            // A log that failed to be created under an earlier image may have been created
            // now, in a topic this image did not change (the apply after a failure covers
            // everything), which the scan of what changed leaves out: look at every one.
            if had_creation_failures {
                assignments.on_logs_created(image, &broker.replica_manager);
            }
        }
        let first = !self.installed.swap(true, Ordering::AcqRel);
        match applied {
            Ok(()) => Ok(()),
            Err(e) if first && e.not_deleted.is_empty() => {
                tracing::error!(error = %e,
                    "starting without these partitions: their replicas answer KAFKA_STORAGE_ERROR until their logs can be created; fix the cause (remove what is in the way, permissions, space)");
                Ok(())
            }
            Err(e) => Err(format!("applying metadata to partition logs failed: {e}")),
        }
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

    /// A one-node broker and controller with its log in `dir`, on a free port, no admin
    /// listener.
    fn one_node_config(dir: &std::path::Path) -> BrokerConfig {
        let props: BTreeMap<String, String> = [
            ("log.dirs", dir.display().to_string()),
            ("listeners", "PLAINTEXT://127.0.0.1:0".into()),
            ("admin.listener", String::new()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        BrokerConfig::from_properties(props).expect("config").0
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
        let config = one_node_config(dir.path());
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

    /// A broker that restarts and cannot create the log of one of its replicas (a file where
    /// the partition's directory should be) starts anyway: that replica answers
    /// KAFKA_STORAGE_ERROR, the others are served, and once the fault is gone the retry
    /// creates it.
    #[tokio::test]
    async fn a_replica_whose_log_cannot_be_created_does_not_stop_the_start() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = one_node_config(dir.path());
        let running = crate::server::start(config.clone()).await.expect("start");
        let req = CreateTopicsRequest::default().with_topics(vec![creatable("a", 2)]);
        let resp =
            topics::create_topics(&running.broker, &ctx(ApiKey::CreateTopics, 7), req, 7).await;
        assert_eq!(resp.topics[0].error_code, ec::NONE);
        running.shutdown().await.expect("shutdown");

        let in_the_way = dir.path().join("a-1");
        std::fs::remove_dir_all(&in_the_way).expect("remove a-1");
        std::fs::write(&in_the_way, b"not a directory").expect("fault");
        let running = crate::server::start(config)
            .await
            .expect("starts without a-1");
        let rm = &running.broker.replica_manager;
        assert!(rm.partition("a", 0).is_some_and(|p| p.is_leader()));
        let Err((code, message)) = rm.hosted(&gregor_log::TopicPartition::new("a", 1)) else {
            panic!("a-1 is not hosted");
        };
        assert_eq!(code, ec::KAFKA_STORAGE_ERROR);
        assert!(message.contains("a-1"), "{message}");

        std::fs::remove_file(&in_the_way).expect("remove the fault");
        assert_eq!(rm.retry_log_creation().expect("created"), 1);
        assert!(rm.partition("a", 1).is_some_and(|p| p.is_leader()));
        running.shutdown().await.expect("shutdown");
    }

    /// A topic whose log this broker cannot create (a file where a partition's directory
    /// should be) is deleted again and answered KAFKA_STORAGE_ERROR naming the partition, the
    /// directory and the cause, while the other topic of the request is created; once the
    /// fault is gone it is created. New partitions that cannot be created are answered
    /// KAFKA_STORAGE_ERROR, stay in the topic, and appear when the retry creates them.
    #[tokio::test]
    async fn a_topic_whose_log_cannot_be_created_here_is_not_created() {
        use gregor_protocol::kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
        use gregor_protocol::kafka_protocol::messages::CreatePartitionsRequest;

        let dir = tempfile::tempdir().expect("tempdir");
        let config = one_node_config(dir.path());
        let running = crate::server::start(config).await.expect("start");
        let b = &running.broker;
        let in_the_way = dir.path().join("x-1");
        std::fs::write(&in_the_way, b"not a directory").expect("fault");

        let req = CreateTopicsRequest::default()
            .with_topics(vec![creatable("x", 3), creatable("fine", 2)]);
        let resp = topics::create_topics(b, &ctx(ApiKey::CreateTopics, 7), req, 7).await;
        let x = &resp.topics[0];
        assert_eq!(x.error_code, ec::KAFKA_STORAGE_ERROR, "{x:?}");
        let message = x.error_message.as_deref().unwrap_or_default();
        for part in [
            "x-1",
            &dir.path().display().to_string(),
            "File exists",
            "not created",
        ] {
            assert!(message.contains(part), "{part} in {message}");
        }
        assert_eq!(resp.topics[1].error_code, ec::NONE, "{:?}", resp.topics[1]);
        assert!(!resp.topics[1].topic_id.is_nil());
        assert!(b.controller.image().topic("x").is_none());
        assert!(b.replica_manager.partition("x", 0).is_none());
        for p in [0, 2] {
            assert!(!dir.path().join(format!("x-{p}")).exists(), "x-{p} deleted");
        }
        assert!(in_the_way.is_file(), "what was in the way is not ours");
        assert!(!b.replica_manager.has_log_creation_failures());
        for p in 0..2 {
            assert!(b.replica_manager.partition("fine", p).is_some());
        }

        std::fs::remove_file(&in_the_way).expect("remove the fault");
        let req = CreateTopicsRequest::default().with_topics(vec![creatable("x", 3)]);
        let resp = topics::create_topics(b, &ctx(ApiKey::CreateTopics, 7), req, 7).await;
        assert_eq!(resp.topics[0].error_code, ec::NONE, "{:?}", resp.topics[0]);
        assert!(b.replica_manager.partition("x", 1).is_some());

        // CreatePartitions: the new partition stays and is created by the retry.
        let in_the_way = dir.path().join("fine-2");
        std::fs::write(&in_the_way, b"not a directory").expect("fault");
        let req =
            CreatePartitionsRequest::default().with_topics(vec![CreatePartitionsTopic::default()
                .with_name(TopicName(sb("fine")))
                .with_count(3)]);
        let resp = topics::create_partitions(b, &ctx(ApiKey::CreatePartitions, 3), req, 3).await;
        let r = &resp.results[0];
        assert_eq!(r.error_code, ec::KAFKA_STORAGE_ERROR, "{r:?}");
        let message = r.error_message.as_deref().unwrap_or_default();
        assert!(
            message.contains("fine-2") && message.contains("File exists"),
            "{message}"
        );
        let partitions = b
            .controller
            .image()
            .topic("fine")
            .map(|t| t.partitions.len());
        assert_eq!(partitions, Some(3), "the new partition stays");
        assert!(b.replica_manager.partition("fine", 2).is_none());
        std::fs::remove_file(&in_the_way).expect("remove the fault");
        let deadline =
            tokio::time::Instant::now() + crate::replica_manager::LOG_CREATION_RETRY_INTERVAL * 3;
        while b.replica_manager.partition("fine", 2).is_none() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "fine-2 created by the retry"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert!(!b.replica_manager.has_log_creation_failures());
        running.shutdown().await.expect("shutdown");
    }
}

#[cfg(test)]
mod migration_tests {
    use std::collections::BTreeMap;

    use gregor_metadata::log::{FileMetadataLog, MetadataLog, METADATA_LOG_FILE};
    use gregor_metadata::MetadataRecord;
    use tokio::sync::watch;

    use super::{start_metadata, start_quorum, MIGRATED_FILE};
    use crate::config::BrokerConfig;

    fn topic(name: &str, id: u128) -> MetadataRecord {
        MetadataRecord::Topic(gregor_protocol::metadata_records::TopicRecord {
            name: name.into(),
            topic_id: uuid::Uuid::from_u128(id),
            ..Default::default()
        })
    }

    async fn start_and_stop(
        config: &BrokerConfig,
        root: &std::path::Path,
    ) -> std::sync::Arc<gregor_metadata::MetadataImage> {
        let (tx, rx) = watch::channel(false);
        let raft = start_quorum(config, &root.join("meta"), "cluster").unwrap();
        let (controller, _, tasks) = start_metadata(
            raft,
            &root.join("legacy"),
            &rx,
            gregor_metadata::controller::ControllerConfig::default(),
        )
        .await
        .unwrap();
        let image = controller.image();
        tx.send(true).unwrap();
        for t in tasks {
            t.await.unwrap();
        }
        image
    }

    #[tokio::test]
    async fn the_old_file_log_is_proposed_once_as_one_batch_and_renamed() {
        let root = tempfile::tempdir().unwrap();
        let legacy = root.path().join("legacy");
        {
            let old = FileMetadataLog::open(&legacy).unwrap();
            old.propose(vec![topic("a", 1)]).await.unwrap();
            old.propose(vec![topic("b", 2), topic("c", 3)])
                .await
                .unwrap();
        }
        let props: BTreeMap<String, String> = [(
            "log.dirs".to_string(),
            root.path().join("data").display().to_string(),
        )]
        .into_iter()
        .collect();
        let (config, _) = BrokerConfig::from_properties(props).unwrap();
        let image = start_and_stop(&config, root.path()).await;
        for name in ["a", "b", "c"] {
            assert!(image.topic(name).is_some(), "{name} migrated");
        }
        // Raft offsets: the batch of 3 comes after epoch 1's LeaderChange control record.
        let migrated_offset = image.offset;
        assert!(migrated_offset >= 4, "{migrated_offset}");
        assert!(!legacy.join(METADATA_LOG_FILE).exists());
        assert!(legacy.join(MIGRATED_FILE).exists());
        // The next start reads them from __cluster_metadata-0 and migrates nothing again,
        // even if an old file shows up.
        {
            let old = FileMetadataLog::open(&legacy).unwrap();
            old.propose(vec![topic("z", 9)]).await.unwrap();
        }
        let image = start_and_stop(&config, root.path()).await;
        // The restarted voter leads epoch 2 from a LeaderChange control record at the end of
        // the log; whether the image shows it yet depends on timing (one more Raft offset).
        assert!(
            image.offset == migrated_offset || image.offset == migrated_offset + 1,
            "{} after {migrated_offset}",
            image.offset
        );
        assert!(image.topic("z").is_none());
        assert!(root
            .path()
            .join("meta/__cluster_metadata-0/quorum-state")
            .exists());
    }
}
