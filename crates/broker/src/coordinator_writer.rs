//! The broker's side of the coordinator runtime (`gregor-coordinator`): the
//! [`PartitionWriter`] over the replica manager, the [`TopicMetadata`] over the metadata image,
//! the creation of `__consumer_offsets` and `__transaction_state`, and the transaction
//! coordinator's services ([`BrokerTransactionServices`]: producer ids from the controller's
//! blocks, WriteTxnMarkers to partition leaders over the inter-broker listener, the finalized
//! `transaction.version`). Everything the coordinators need from the broker goes through this
//! file.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

use bytes::Bytes;
use gregor_coordinator::group::{GroupConfigError, GROUP_METADATA_TOPIC_NAME};
use gregor_coordinator::runtime::{HighWatermarkFuture, PartitionWriter, TopicMetadata};
use gregor_metadata::controller::NewTopic;
use gregor_protocol::error::ErrorCode;
use gregor_protocol::kafka_protocol::protocol::StrBytes;
use tracing::{debug, info, warn};
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

    fn log_end_offset(&self, topic: &str, partition: i32) -> Option<i64> {
        self.partition(topic, partition)
            .map(|p| p.log.log_end_offset())
    }

    fn read_for_load(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
        max_bytes: usize,
    ) -> Result<Bytes, (ErrorCode, String)> {
        let Some(p) = self.partition(topic, partition) else {
            return Err((ErrorCode::NotLeaderOrFollower, String::new()));
        };
        p.read_bounded(offset, max_bytes, p.log.log_end_offset(), true)
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

/// The replication factor and `min.insync.replicas` of `__transaction_state`:
/// `transaction.state.log.replication.factor` and `transaction.state.log.min.isr` (3 and 2,
/// Kafka's defaults; creation fails with COORDINATOR_NOT_AVAILABLE until that many brokers are
/// registered). In a single-node cluster both are capped at the registered brokers, as for
/// `__consumer_offsets` (Kafka's single-node example config sets both to 1).
fn transaction_state_topic_factors(
    broker: &Broker,
    image: &gregor_metadata::MetadataImage,
) -> (i16, i32) {
    let config = &broker.config.transactions;
    let voters = &broker.config.quorum.voters;
    let single_node = voters.len() == 1 && voters.contains(broker.config.node_id);
    if single_node {
        let brokers = image.brokers.len().max(1);
        let rf = config
            .state_log_replication_factor
            .min(i16::try_from(brokers).unwrap_or(i16::MAX));
        (rf, config.state_log_min_isr.min(i32::from(rf)))
    } else {
        (
            config.state_log_replication_factor,
            config.state_log_min_isr,
        )
    }
}

/// Creates `__transaction_state` if it does not exist (Kafka creates it on the first
/// FindCoordinator for a transactional id): `transaction.state.log.num.partitions`
/// partitions, compacted, uncompressed, `min.insync.replicas` from
/// `transaction.state.log.min.isr`, `transaction.state.log.segment.bytes`, no unclean leader
/// election (Kafka's `transactionTopicConfigs`). The metadata loader loads the partitions this
/// broker leads before the creation returns.
///
/// # Errors
/// The Kafka error code to return to the client (COORDINATOR_NOT_AVAILABLE).
pub async fn ensure_transaction_state_topic(broker: &Broker) -> Result<(), i16> {
    use gregor_coordinator::transaction::TRANSACTION_STATE_TOPIC_NAME;
    let config = &broker.config.transactions;
    let image = broker.controller.image();
    if image.topic(TRANSACTION_STATE_TOPIC_NAME).is_some() {
        return Ok(());
    }
    let (rf, min_isr) = transaction_state_topic_factors(broker, &image);
    let mut configs = BTreeMap::new();
    configs.insert("cleanup.policy".to_string(), "compact".to_string());
    configs.insert("compression.type".to_string(), "uncompressed".to_string());
    configs.insert("min.insync.replicas".to_string(), min_isr.to_string());
    configs.insert(
        "segment.bytes".to_string(),
        config.state_log_segment_bytes.to_string(),
    );
    configs.insert(
        "unclean.leader.election.enable".to_string(),
        "false".to_string(),
    );
    let t = NewTopic {
        name: TRANSACTION_STATE_TOPIC_NAME.to_string(),
        num_partitions: config.state_log_num_partitions,
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
                partitions = config.state_log_num_partitions,
                replication_factor = rf,
                "created {TRANSACTION_STATE_TOPIC_NAME}"
            );
        }
        Err(e) if e.error_code() == ErrorCode::TopicAlreadyExists => {}
        Err(e) => {
            warn!(error = %e, "cannot create {TRANSACTION_STATE_TOPIC_NAME}");
            return Err(ErrorCode::CoordinatorNotAvailable.code());
        }
    }
    Ok(())
}

/// The transaction coordinator's services over the broker (Kafka's `ProducerIdManager`,
/// `TransactionMarkerChannelManager` network side and `MetadataCache` feature level).
pub struct BrokerTransactionServices {
    broker: Weak<Broker>,
}

impl BrokerTransactionServices {
    /// Services of the broker behind `broker`.
    pub fn new(broker: Weak<Broker>) -> Arc<Self> {
        Arc::new(Self { broker })
    }
}

/// WriteTxnMarkers version sent (v1: flexible; v0 was removed in Kafka 4).
const WRITE_TXN_MARKERS_VERSION: i16 = 1;
/// Largest WriteTxnMarkers response accepted (bytes): a few bytes per partition.
const MARKER_RESPONSE_MAX_BYTES: usize = 16 * 1024 * 1024;

impl gregor_coordinator::transaction::TransactionServices for BrokerTransactionServices {
    fn generate_producer_id(
        &self,
    ) -> gregor_coordinator::transaction::BoxFuture<Result<i64, ErrorCode>> {
        let broker = self.broker.clone();
        Box::pin(async move {
            let Some(b) = broker.upgrade() else {
                return Err(ErrorCode::CoordinatorNotAvailable);
            };
            b.next_producer_id().await.map_err(|e| {
                warn!(error = %e, "cannot allocate producer ids");
                ErrorCode::CoordinatorNotAvailable
            })
        })
    }

    fn send_markers(
        &self,
        request: gregor_coordinator::transaction::MarkerRequest,
    ) -> gregor_coordinator::transaction::BoxFuture<
        Vec<(gregor_coordinator::transaction::TxnPartition, ErrorCode)>,
    > {
        let broker = self.broker.clone();
        Box::pin(async move {
            let Some(b) = broker.upgrade() else {
                return request
                    .partitions
                    .into_iter()
                    .map(|tp| (tp, ErrorCode::NotLeaderOrFollower))
                    .collect();
            };
            send_markers(&b, request).await
        })
    }

    fn transaction_version(&self) -> i16 {
        self.broker.upgrade().map_or(0, |b| {
            b.controller
                .image()
                .features
                .get("transaction.version")
                .copied()
                .unwrap_or(0)
        })
    }
}

/// Sends `request`'s markers: one WriteTxnMarkers per partition leader, on the inter-broker
/// listener (to this broker too, as Kafka does), concurrently. A partition whose topic is gone
/// is done (Kafka drops its marker); a partition without a live leader, or whose leader did not
/// answer, is NOT_LEADER_OR_FOLLOWER / REQUEST_TIMED_OUT (retried by the coordinator).
async fn send_markers(
    broker: &Arc<Broker>,
    request: gregor_coordinator::transaction::MarkerRequest,
) -> Vec<(gregor_coordinator::transaction::TxnPartition, ErrorCode)> {
    use gregor_protocol::kafka_protocol::messages::write_txn_markers_request::{
        WritableTxnMarker, WritableTxnMarkerTopic,
    };
    use gregor_protocol::kafka_protocol::messages::{
        ApiKey, ProducerId, RequestKind, ResponseKind, TopicName, WriteTxnMarkersRequest,
    };
    let image = broker.controller.image();
    let listener = broker.config.inter_broker_listener_name();
    let (producer_id, producer_epoch, commit, coordinator_epoch) = (
        request.producer_id,
        request.producer_epoch,
        request.commit,
        request.coordinator_epoch,
    );
    let mut out = Vec::new();
    let mut by_leader: BTreeMap<(i32, String), Vec<(String, i32)>> = BTreeMap::new();
    for (topic, partition) in request.partitions {
        let Some(t) = image.topic(&topic) else {
            info!(%topic, partition, "the topic of a transaction marker is gone; the marker is dropped");
            out.push(((topic, partition), ErrorCode::None));
            continue;
        };
        let Some(p) = t.partitions.get(&partition) else {
            out.push(((topic, partition), ErrorCode::None));
            continue;
        };
        let address = image
            .brokers
            .get(&p.leader)
            .filter(|b| !b.fenced)
            .and_then(|b| match &listener {
                Some(name) => b.endpoint(name),
                None => b.endpoints.first(),
            })
            .map(|e| format!("{}:{}", e.host, e.port));
        match address {
            Some(a) => by_leader
                .entry((p.leader, a))
                .or_default()
                .push((topic, partition)),
            None => out.push(((topic, partition), ErrorCode::NotLeaderOrFollower)),
        }
    }
    let timeout = std::time::Duration::from_millis(
        u64::try_from(broker.config.transactions.request_timeout_ms).unwrap_or(30_000),
    );
    let client_id = format!("broker-{}-txn-marker-sender", broker.config.node_id);
    let sends = by_leader.into_iter().map(|((leader, address), partitions)| {
        let client_id = client_id.clone();
        let mut topics: Vec<WritableTxnMarkerTopic> = Vec::new();
        for (t, p) in &partitions {
            match topics.last_mut() {
                Some(last) if last.name.0.as_str() == t => last.partition_indexes.push(*p),
                _ => topics.push(
                    WritableTxnMarkerTopic::default()
                        .with_name(TopicName(StrBytes::from_string(t.to_string())))
                        .with_partition_indexes(vec![*p]),
                ),
            }
        }
        let body = WriteTxnMarkersRequest::default().with_markers(vec![WritableTxnMarker::default()
            .with_producer_id(ProducerId(producer_id))
            .with_producer_epoch(producer_epoch)
            .with_transaction_result(commit)
            .with_topics(topics)
            .with_coordinator_epoch(coordinator_epoch)]);
        let security = broker.inter_broker_security();
        async move {
            let sent = async {
                let mut conn = crate::replica_fetcher::connection::BrokerConnection::connect(
                    &security,
                    &address,
                    client_id,
                    timeout,
                    MARKER_RESPONSE_MAX_BYTES,
                )
                .await?;
                conn.request(
                    ApiKey::WriteTxnMarkers,
                    WRITE_TXN_MARKERS_VERSION,
                    RequestKind::WriteTxnMarkers(body),
                )
                .await
            }
            .await;
            let mut results: Vec<((String, i32), ErrorCode)> = Vec::new();
            match sent {
                Ok(ResponseKind::WriteTxnMarkers(r)) => {
                    let answered: BTreeMap<(String, i32), i16> = r
                        .markers
                        .iter()
                        .filter(|m| m.producer_id.0 == producer_id)
                        .flat_map(|m| {
                            m.topics.iter().flat_map(|t| {
                                t.partitions.iter().map(move |p| {
                                    ((t.name.0.to_string(), p.partition_index), p.error_code)
                                })
                            })
                        })
                        .collect();
                    for tp in partitions {
                        let code = answered
                            .get(&tp)
                            .map_or(ErrorCode::RequestTimedOut, |c| ErrorCode::for_code(*c));
                        results.push((tp, code));
                    }
                }
                Ok(_) => {
                    warn!(leader, "unexpected response kind to WriteTxnMarkers");
                    results.extend(partitions.into_iter().map(|tp| (tp, ErrorCode::RequestTimedOut)));
                }
                Err(e) => {
                    debug!(leader, error = %e, "WriteTxnMarkers failed; the markers are retried");
                    results.extend(partitions.into_iter().map(|tp| (tp, ErrorCode::RequestTimedOut)));
                }
            }
            results
        }
    });
    let handles: Vec<_> = sends.map(tokio::spawn).collect();
    for h in handles {
        match h.await {
            Ok(r) => out.extend(r),
            Err(e) => warn!(error = %e, "a marker send task failed"),
        }
    }
    out
}

/// The group coordinator as the hook of transaction markers written to `__consumer_offsets`
/// partitions ([`crate::txn_markers::TxnOffsetsCompletion`], Kafka's
/// `GroupCoordinator.onTransactionCompleted`): the producer's pending transactional offsets
/// there become committed, or are dropped.
pub struct GroupTxnOffsetsCompletion {
    broker: Weak<Broker>,
}

impl GroupTxnOffsetsCompletion {
    /// The hook of the broker behind `broker`.
    pub fn new(broker: Weak<Broker>) -> Arc<Self> {
        Arc::new(Self { broker })
    }
}

impl crate::txn_markers::TxnOffsetsCompletion for GroupTxnOffsetsCompletion {
    fn on_transaction_completed(
        &self,
        producer_id: i64,
        _producer_epoch: i16,
        partitions: &[i32],
        result: gregor_protocol::control::TransactionResult,
    ) -> Result<(), i16> {
        let Some(b) = self.broker.upgrade() else {
            return Err(ErrorCode::NotCoordinator.code());
        };
        let commit = result == gregor_protocol::control::TransactionResult::Commit;
        for p in partitions {
            b.group_coordinator
                .complete_transaction(*p, producer_id, commit);
        }
        Ok(())
    }
}
