//! The partition leader's side of KIP-890 (transaction server-side defense), Kafka's
//! `AddPartitionsToTxnManager` and `ReplicaManager.maybeStartTransactionVerificationForPartitions`:
//! before a producer's first transactional write to a partition, the leader creates a
//! verification guard in the partition's producer state and asks the producer's transaction
//! coordinator with **AddPartitionsToTxn v4+** whether the partition is part of the open
//! transaction (`VerifyOnly` true: transaction.version 1, Produce v11 and below) or adds it
//! (`VerifyOnly` false: transaction.version 2, Produce v12+). The append then presents the
//! guard; an answer other than success refuses the partition's batch.
//!
//! [`AddPartitionsToTxnSender`] is the seam: the broker installs
//! [`NetworkAddPartitionsToTxnSender`] (AddPartitionsToTxn to the leader of the transactional
//! id's `__transaction_state` partition on the inter-broker listener); tests install their
//! own. The coordinator's answer is the transaction coordinator's business.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use gregor_log::TopicPartition;
use gregor_metadata::MetadataImage;
use gregor_protocol::kafka_protocol::messages::add_partitions_to_txn_request::{
    AddPartitionsToTxnTopic, AddPartitionsToTxnTransaction,
};
use gregor_protocol::kafka_protocol::messages::{
    AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, ApiKey, ProducerId, RequestKind,
    ResponseKind, TopicName, TransactionalId,
};

use crate::replica_fetcher::connection::BrokerConnection;
use gregor_protocol::kafka_protocol::protocol::StrBytes;

/// The error codes of transactions, from the typed enum (as `crate::error_codes` does for the
/// others).
pub(crate) mod ec {
    pub use crate::error_codes::*;
    use gregor_protocol::error::ErrorCode as E;
    /// NETWORK_EXCEPTION (13).
    pub const NETWORK_EXCEPTION: i16 = E::NetworkException.code();
    /// COORDINATOR_LOAD_IN_PROGRESS (14).
    pub const COORDINATOR_LOAD_IN_PROGRESS: i16 = E::CoordinatorLoadInProgress.code();
    /// COORDINATOR_NOT_AVAILABLE (15).
    pub const COORDINATOR_NOT_AVAILABLE: i16 = E::CoordinatorNotAvailable.code();
    /// NOT_COORDINATOR (16).
    pub const NOT_COORDINATOR: i16 = E::NotCoordinator.code();
    /// INVALID_PRODUCER_EPOCH (47).
    pub const INVALID_PRODUCER_EPOCH: i16 = E::InvalidProducerEpoch.code();
    /// INVALID_TXN_STATE (48).
    pub const INVALID_TXN_STATE: i16 = E::InvalidTxnState.code();
    /// CONCURRENT_TRANSACTIONS (51).
    pub const CONCURRENT_TRANSACTIONS: i16 = E::ConcurrentTransactions.code();
    /// PRODUCER_FENCED (90).
    pub const PRODUCER_FENCED: i16 = E::ProducerFenced.code();
    /// TRANSACTION_ABORTABLE (120).
    pub const TRANSACTION_ABORTABLE: i16 = E::TransactionAbortable.code();
    /// INVALID_PRODUCER_ID_MAPPING (49).
    pub const INVALID_PRODUCER_ID_MAPPING: i16 = E::InvalidProducerIdMapping.code();

    /// Kafka's name of `code`.
    pub fn name(code: i16) -> &'static str {
        E::from_code(code).map_or("UNKNOWN", E::name)
    }
}

/// The topic of the transaction coordinators' state (Kafka's `TRANSACTION_STATE_TOPIC_NAME`).
pub const TRANSACTION_STATE_TOPIC: &str = "__transaction_state";

/// What the client's request version lets the leader do (Kafka's
/// `TransactionSupportedOperation`, from `produceRequestVersionToTransactionSupportedOperation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransactionSupportedOperation {
    /// Produce v10 and below: verify only; TRANSACTION_ABORTABLE is answered as
    /// INVALID_TXN_STATE, which old clients know.
    DefaultError,
    /// Produce v11: verify only; TRANSACTION_ABORTABLE passes through.
    GenericErrorSupported,
    /// Produce v12+ (transaction.version 2, KIP-890 part 2): the leader adds the partition to
    /// the transaction.
    AddPartition,
}

impl TransactionSupportedOperation {
    /// The operation a Produce request of `version` allows.
    pub fn for_produce_version(version: i16) -> Self {
        if version > 11 {
            Self::AddPartition
        } else if version > 10 {
            Self::GenericErrorSupported
        } else {
            Self::DefaultError
        }
    }

    /// Whether the producer uses transaction.version 2, whose coordinator bumps the epoch
    /// on every EndTxn (Kafka's `supportsEpochBump`): Produce v12+.
    pub fn supports_epoch_bump(self) -> bool {
        self == Self::AddPartition
    }

    /// AddPartitionsToTxn's `VerifyOnly`: true unless the partition is added.
    pub fn verify_only(self) -> bool {
        self != Self::AddPartition
    }
}

/// One verification: the partitions of one producer's transactional batches in a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnVerificationRequest {
    /// The request's transactional id.
    pub transactional_id: String,
    /// The batches' producer id.
    pub producer_id: i64,
    /// The batches' producer epoch.
    pub producer_epoch: i16,
    /// The partitions to verify (or add).
    pub partitions: Vec<TopicPartition>,
    /// Verify or add, and how errors are answered.
    pub operation: TransactionSupportedOperation,
}

/// Per partition, the Kafka error code the coordinator's answer gives it, already mapped as
/// Kafka's `AddPartitionsToTxnManager` maps it; a partition absent from the map is verified.
pub type VerificationErrors = HashMap<TopicPartition, i16>;

/// A boxed verification.
pub type VerificationFuture = Pin<Box<dyn Future<Output = VerificationErrors> + Send>>;

/// How the leader asks the transaction coordinator (AddPartitionsToTxn v4+).
pub trait AddPartitionsToTxnSender: Send + Sync {
    /// Verifies (or adds) `request`'s partitions. Never fails as a whole: a failure to reach
    /// the coordinator is an error per partition (COORDINATOR_NOT_AVAILABLE,
    /// NETWORK_EXCEPTION, ...).
    fn add_or_verify(&self, request: TxnVerificationRequest) -> VerificationFuture;
}

/// Kafka's `ReplicaManager.handleProduceAppend` post-verification mapping: the error a
/// produce answers for a partition whose verification failed with `code`, and its message.
/// Retriable coordinator errors become NOT_ENOUGH_REPLICAS (old clients retry it without a
/// metadata refresh); INVALID_TXN_STATE says the partition was not added.
pub fn produce_error_for_verification(code: i16) -> (i16, Option<String>) {
    match code {
        ec::INVALID_TXN_STATE => (
            ec::INVALID_TXN_STATE,
            Some("Partition was not added to the transaction".into()),
        ),
        ec::CONCURRENT_TRANSACTIONS
        | ec::NETWORK_EXCEPTION
        | ec::COORDINATOR_LOAD_IN_PROGRESS
        | ec::COORDINATOR_NOT_AVAILABLE
        | ec::NOT_COORDINATOR => (
            ec::NOT_ENOUGH_REPLICAS,
            Some(format!(
                "Unable to verify the partition has been added to the transaction. Underlying error: {}",
                ec::name(code)
            )),
        ),
        other => (other, None),
    }
}

/// Kafka's `AddPartitionsToTxnHandler.onComplete` for a response: a top-level error applies
/// to every partition (CLUSTER_AUTHORIZATION_FAILED as INVALID_TXN_STATE: the client must not
/// see the broker's own authorization); per partition, PRODUCER_FENCED becomes
/// INVALID_PRODUCER_EPOCH (what producers expect here) and TRANSACTION_ABORTABLE becomes
/// INVALID_TXN_STATE for old clients. A partition the response does not mention is an error
/// too (UNKNOWN_SERVER_ERROR): only an explicit success verifies.
pub fn errors_from_response(
    request: &TxnVerificationRequest,
    response: &AddPartitionsToTxnResponse,
) -> VerificationErrors {
    let all = |code: i16| -> VerificationErrors {
        request
            .partitions
            .iter()
            .map(|tp| (tp.clone(), code))
            .collect()
    };
    if response.error_code != ec::NONE {
        return all(if response.error_code == ec::CLUSTER_AUTHORIZATION_FAILED {
            ec::INVALID_TXN_STATE
        } else {
            response.error_code
        });
    }
    let mut answered: HashMap<TopicPartition, i16> = HashMap::new();
    for txn in response
        .results_by_transaction
        .iter()
        .filter(|t| t.transactional_id.0.as_str() == request.transactional_id)
    {
        for topic in &txn.topic_results {
            for p in &topic.results_by_partition {
                let code = match p.partition_error_code {
                    ec::PRODUCER_FENCED => ec::INVALID_PRODUCER_EPOCH,
                    ec::TRANSACTION_ABORTABLE
                        if request.operation == TransactionSupportedOperation::DefaultError =>
                    {
                        ec::INVALID_TXN_STATE
                    }
                    c => c,
                };
                answered.insert(
                    TopicPartition::new(topic.name.0.as_str(), p.partition_index),
                    code,
                );
            }
        }
    }
    request
        .partitions
        .iter()
        .filter_map(|tp| match answered.get(tp) {
            Some(&ec::NONE) => None,
            Some(code) => Some((tp.clone(), *code)),
            None => Some((tp.clone(), ec::UNKNOWN_SERVER_ERROR)),
        })
        .collect()
}

/// The AddPartitionsToTxn request (v4+, one transaction) for `request`.
pub fn build_request(request: &TxnVerificationRequest) -> AddPartitionsToTxnRequest {
    let mut by_topic: std::collections::BTreeMap<&str, Vec<i32>> = Default::default();
    for tp in &request.partitions {
        by_topic.entry(&tp.topic).or_default().push(tp.partition);
    }
    let topics = by_topic
        .into_iter()
        .map(|(name, partitions)| {
            AddPartitionsToTxnTopic::default()
                .with_name(TopicName(sb(name)))
                .with_partitions(partitions)
        })
        .collect();
    AddPartitionsToTxnRequest::default().with_transactions(vec![
        AddPartitionsToTxnTransaction::default()
            .with_transactional_id(TransactionalId(sb(&request.transactional_id)))
            .with_producer_id(ProducerId(request.producer_id))
            .with_producer_epoch(request.producer_epoch)
            .with_verify_only(request.operation.verify_only())
            .with_topics(topics),
    ])
}

/// The `__transaction_state` partition of `transactional_id` (Kafka's
/// `TransactionStateManager.partitionFor`: `abs(hashCode) % partition count`), `None` before
/// the topic exists.
pub fn transaction_state_partition(image: &MetadataImage, transactional_id: &str) -> Option<i32> {
    let topic = image.topic(TRANSACTION_STATE_TOPIC)?;
    let count = i32::try_from(topic.partitions.len())
        .ok()
        .filter(|c| *c > 0)?;
    let hash = gregor_coordinator::group::java_string_hash_code(transactional_id);
    let abs = if hash == i32::MIN { 0 } else { hash.abs() };
    Some(abs % count)
}

/// AddPartitionsToTxn v5 (v4 is the same message with fewer error codes; Kafka's broker sends
/// its latest).
const ADD_PARTITIONS_TO_TXN_VERSION: i16 = 5;
/// Bound on a response (bytes): one transaction's partitions.
const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// [`AddPartitionsToTxnSender`] over the network: finds the leader of the transactional id's
/// `__transaction_state` partition in the current metadata image and sends it
/// AddPartitionsToTxn v5 on the inter-broker listener, one connection per request (a
/// verification happens once per producer, partition and transaction), within
/// `request.timeout.ms`.
pub struct NetworkAddPartitionsToTxnSender {
    image: Arc<dyn Fn() -> Arc<MetadataImage> + Send + Sync>,
    listener_name: Option<String>,
    client_id: String,
    timeout: Duration,
    security: gregor_network::client::ClientSecurity,
}

impl NetworkAddPartitionsToTxnSender {
    /// A sender reading the metadata from `image`, reaching coordinators on `listener_name`
    /// (the first endpoint when `None`), as `client_id`, within `timeout_ms`.
    pub fn new(
        image: Arc<dyn Fn() -> Arc<MetadataImage> + Send + Sync>,
        listener_name: Option<String>,
        client_id: String,
        timeout_ms: i64,
    ) -> Self {
        Self {
            image,
            listener_name,
            client_id,
            timeout: Duration::from_millis(u64::try_from(timeout_ms).unwrap_or(30_000)),
            security: gregor_network::client::ClientSecurity::plaintext(),
        }
    }

    /// Secures the connections to the coordinators as the inter-broker listener asks.
    #[must_use]
    pub fn with_security(mut self, security: gregor_network::client::ClientSecurity) -> Self {
        self.security = security;
        self
    }

    fn coordinator_address(&self, transactional_id: &str) -> Option<String> {
        let image = (self.image)();
        let partition = transaction_state_partition(&image, transactional_id)?;
        let leader = image
            .topic(TRANSACTION_STATE_TOPIC)?
            .partitions
            .get(&partition)?
            .leader;
        let reg = image.brokers.get(&leader).filter(|b| !b.fenced)?;
        let endpoint = match &self.listener_name {
            Some(name) => reg.endpoint(name),
            None => reg.endpoints.first(),
        }?;
        Some(format!("{}:{}", endpoint.host, endpoint.port))
    }
}

impl AddPartitionsToTxnSender for NetworkAddPartitionsToTxnSender {
    fn add_or_verify(&self, request: TxnVerificationRequest) -> VerificationFuture {
        let address = self.coordinator_address(&request.transactional_id);
        let client_id = self.client_id.clone();
        let timeout = self.timeout;
        let security = self.security.clone();
        Box::pin(async move {
            let all = |code: i16| -> VerificationErrors {
                request
                    .partitions
                    .iter()
                    .map(|tp| (tp.clone(), code))
                    .collect()
            };
            let Some(address) = address else {
                return all(ec::COORDINATOR_NOT_AVAILABLE);
            };
            let body = RequestKind::AddPartitionsToTxn(build_request(&request));
            let answer = async {
                let mut conn = BrokerConnection::connect(
                    &security,
                    &address,
                    client_id,
                    timeout,
                    MAX_RESPONSE_BYTES,
                )
                .await?;
                conn.request(
                    ApiKey::AddPartitionsToTxn,
                    ADD_PARTITIONS_TO_TXN_VERSION,
                    body,
                )
                .await
            }
            .await;
            match answer {
                Ok(ResponseKind::AddPartitionsToTxn(resp)) => errors_from_response(&request, &resp),
                Ok(_) => all(ec::UNKNOWN_SERVER_ERROR),
                Err(e) => {
                    tracing::warn!(%address, error = %e, transactional_id = %request.transactional_id,
                        "AddPartitionsToTxn to the transaction coordinator failed");
                    all(ec::NETWORK_EXCEPTION)
                }
            }
        })
    }
}

/// A `StrBytes` from a `&str` (as `handlers::sb`, which this module does not import: the
/// handlers depend on the replica manager, not the other way round).
fn sb(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gregor_protocol::kafka_protocol::messages::add_partitions_to_txn_response::{
        AddPartitionsToTxnPartitionResult, AddPartitionsToTxnResult, AddPartitionsToTxnTopicResult,
    };

    fn request(op: TransactionSupportedOperation) -> TxnVerificationRequest {
        TxnVerificationRequest {
            transactional_id: "t".into(),
            producer_id: 5,
            producer_epoch: 1,
            partitions: vec![TopicPartition::new("a", 0), TopicPartition::new("a", 1)],
            operation: op,
        }
    }

    fn response(codes: &[(i32, i16)]) -> AddPartitionsToTxnResponse {
        AddPartitionsToTxnResponse::default().with_results_by_transaction(vec![
            AddPartitionsToTxnResult::default()
                .with_transactional_id(TransactionalId(sb("t")))
                .with_topic_results(vec![AddPartitionsToTxnTopicResult::default()
                    .with_name(TopicName(sb("a")))
                    .with_results_by_partition(
                        codes
                            .iter()
                            .map(|(p, c)| {
                                AddPartitionsToTxnPartitionResult::default()
                                    .with_partition_index(*p)
                                    .with_partition_error_code(*c)
                            })
                            .collect(),
                    )]),
        ])
    }

    #[test]
    fn operation_follows_the_produce_version() {
        use TransactionSupportedOperation::*;
        assert_eq!(
            TransactionSupportedOperation::for_produce_version(9),
            DefaultError
        );
        assert_eq!(
            TransactionSupportedOperation::for_produce_version(10),
            DefaultError
        );
        assert_eq!(
            TransactionSupportedOperation::for_produce_version(11),
            GenericErrorSupported
        );
        assert_eq!(
            TransactionSupportedOperation::for_produce_version(12),
            AddPartition
        );
        let r = build_request(&request(AddPartition));
        assert!(!r.transactions[0].verify_only);
        assert_eq!(r.transactions[0].topics[0].partitions, vec![0, 1]);
        assert!(build_request(&request(DefaultError)).transactions[0].verify_only);
    }

    #[test]
    fn answers_are_mapped_as_kafkas_manager_maps_them() {
        use TransactionSupportedOperation::*;
        let tp = |p| TopicPartition::new("a", p);
        // Success for both.
        assert!(
            errors_from_response(&request(DefaultError), &response(&[(0, 0), (1, 0)])).is_empty()
        );
        // Fenced producer: INVALID_PRODUCER_EPOCH; an unanswered partition is not verified.
        let e = errors_from_response(
            &request(DefaultError),
            &response(&[(0, ec::PRODUCER_FENCED)]),
        );
        assert_eq!(e.get(&tp(0)), Some(&ec::INVALID_PRODUCER_EPOCH));
        assert_eq!(e.get(&tp(1)), Some(&ec::UNKNOWN_SERVER_ERROR));
        // TRANSACTION_ABORTABLE only reaches clients that know it.
        let abortable = response(&[(0, ec::TRANSACTION_ABORTABLE), (1, 0)]);
        assert_eq!(
            errors_from_response(&request(DefaultError), &abortable).get(&tp(0)),
            Some(&ec::INVALID_TXN_STATE)
        );
        assert_eq!(
            errors_from_response(&request(GenericErrorSupported), &abortable).get(&tp(0)),
            Some(&ec::TRANSACTION_ABORTABLE)
        );
        // A top-level error applies to all; the broker's own authorization is hidden.
        let top =
            AddPartitionsToTxnResponse::default().with_error_code(ec::CLUSTER_AUTHORIZATION_FAILED);
        let e = errors_from_response(&request(AddPartition), &top);
        assert_eq!(e.len(), 2);
        assert!(e.values().all(|c| *c == ec::INVALID_TXN_STATE));
        // The produce answer.
        assert_eq!(
            produce_error_for_verification(ec::NOT_COORDINATOR).0,
            ec::NOT_ENOUGH_REPLICAS
        );
        assert_eq!(
            produce_error_for_verification(ec::INVALID_TXN_STATE).0,
            ec::INVALID_TXN_STATE
        );
        assert_eq!(
            produce_error_for_verification(ec::INVALID_PRODUCER_EPOCH),
            (ec::INVALID_PRODUCER_EPOCH, None)
        );
    }
}
