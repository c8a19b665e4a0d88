//! The AlterPartitionManager (Kafka's `DefaultAlterPartitionManager`, KIP-497): partitions led
//! here propose ISR changes ([`crate::replication::leader::IsrChange`]); this task batches the
//! pending ones into one AlterPartition (56) v3 request at a time (`NewIsrWithEpochs`,
//! KIP-903; topic ids, KIP-841) to the active controller and reports each partition's outcome
//! back to it.
//!
//! - At most one request is in flight; changes submitted meanwhile wait for the next one. A
//!   partition has at most one change queued: a newer one replaces the older (which can only
//!   be stale, since a partition proposes again only after its previous change ended).
//! - Partition errors (Kafka's `Partition.handleAlterPartitionError`): INELIGIBLE_REPLICA and
//!   OPERATION_NOT_ATTEMPTED drop the change ([`AlterPartitionOutcome::Rejected`]);
//!   FENCED_LEADER_EPOCH, INVALID_UPDATE_VERSION, NOT_LEADER_OR_FOLLOWER,
//!   UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_TOPIC_ID, INVALID_REQUEST and NEW_LEADER_ELECTED
//!   leave it waiting for the metadata ([`AlterPartitionOutcome::AwaitMetadata`]); any other
//!   error, a partition missing from the response, a top-level error (NOT_CONTROLLER,
//!   STALE_BROKER_EPOCH, ...) or a failed send is retried after `retry_backoff` (Kafka: 50 ms).
//! - Success is [`AlterPartitionOutcome::Committed`]: the partition's committed ISR changes
//!   only when the metadata image carries the new registration.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use gregor_log::TopicPartition;
use gregor_protocol::kafka_protocol::messages::alter_partition_request::{
    BrokerState, PartitionData, TopicData,
};
use gregor_protocol::kafka_protocol::messages::{
    AlterPartitionRequest, AlterPartitionResponse, BrokerId,
};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::error_codes as ec;
use crate::replication::leader::{AlterPartitionOutcome, IsrChange};

/// Kafka's retry delay after a top-level error (ms).
pub const DEFAULT_RETRY_BACKOFF_MS: u64 = 50;

const INELIGIBLE_REPLICA: i16 = 107;
const NEW_LEADER_ELECTED: i16 = 108;
const OPERATION_NOT_ATTEMPTED: i16 = 55;
const INVALID_UPDATE_VERSION: i16 = 95;
const UNKNOWN_TOPIC_ID: i16 = 100;

/// One partition's ISR change on its way to the controller (Kafka's `AlterPartitionItem`).
pub struct AlterPartitionItem {
    /// The partition's topic id.
    pub topic_id: Uuid,
    /// The partition.
    pub topic_partition: TopicPartition,
    /// The proposed change.
    pub change: IsrChange,
    /// Called once with the outcome (never for a change replaced by a newer one).
    pub on_complete: Box<dyn FnOnce(AlterPartitionOutcome) + Send>,
}

/// Where partitions submit ISR changes.
pub trait AlterPartitionSender: Send + Sync {
    /// Queues `item` for the next AlterPartition request.
    fn submit(&self, item: AlterPartitionItem);
}

/// A boxed AlterPartition call.
pub type AlterPartitionFuture =
    Pin<Box<dyn Future<Output = Result<AlterPartitionResponse, String>> + Send>>;

/// How the manager reaches the active controller (in the broker:
/// [`crate::controller_channel::ControllerClient::alter_partition`]). An `Err` is a failed
/// send (no controller, timeout), retried.
pub trait AlterPartitionClient: Send + Sync + 'static {
    /// Sends one AlterPartition request to the active controller.
    fn alter_partition(&self, request: AlterPartitionRequest) -> AlterPartitionFuture;
}

/// The broker's [`AlterPartitionClient`]: the local controller when it is the active one,
/// else the controller channel.
pub struct ControllerAlterPartition(pub Arc<crate::controller_channel::ControllerClient>);

impl AlterPartitionClient for ControllerAlterPartition {
    fn alter_partition(&self, request: AlterPartitionRequest) -> AlterPartitionFuture {
        let client = self.0.clone();
        Box::pin(async move {
            client
                .alter_partition(request)
                .await
                .map_err(|e| e.to_string())
        })
    }
}

/// The handle partitions submit through; the work happens in the task [`start`] spawns.
pub struct AlterPartitionManager {
    tx: mpsc::UnboundedSender<AlterPartitionItem>,
}

impl AlterPartitionSender for AlterPartitionManager {
    fn submit(&self, item: AlterPartitionItem) {
        if let Err(mpsc::error::SendError(item)) = self.tx.send(item) {
            // The task stopped (shutdown): the change is not attempted.
            (item.on_complete)(AlterPartitionOutcome::Rejected);
        }
    }
}

/// Starts the manager of broker `broker_id`: `broker_epoch` reads this broker's current
/// epoch (KIP-380), `client` sends to the active controller, top-level errors and failed
/// sends are retried after `retry_backoff`. The task ends when `shutdown` turns true or every
/// handle is dropped.
pub fn start(
    broker_id: i32,
    broker_epoch: Arc<dyn Fn() -> i64 + Send + Sync>,
    client: Arc<dyn AlterPartitionClient>,
    retry_backoff: Duration,
    mut shutdown: watch::Receiver<bool>,
) -> (Arc<AlterPartitionManager>, JoinHandle<()>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<AlterPartitionItem>();
    let task = tokio::spawn(async move {
        let mut unsent: BTreeMap<(Uuid, i32), AlterPartitionItem> = BTreeMap::new();
        let insert = |unsent: &mut BTreeMap<(Uuid, i32), AlterPartitionItem>,
                      item: AlterPartitionItem| {
            unsent.insert((item.topic_id, item.topic_partition.partition), item);
        };
        loop {
            if unsent.is_empty() {
                tokio::select! {
                    item = rx.recv() => match item {
                        Some(item) => insert(&mut unsent, item),
                        None => return,
                    },
                    _ = shutdown.changed() => return,
                }
            }
            while let Ok(item) = rx.try_recv() {
                insert(&mut unsent, item);
            }
            let items: Vec<AlterPartitionItem> =
                std::mem::take(&mut unsent).into_values().collect();
            let request = build_request(broker_id, broker_epoch(), &items);
            let result = tokio::select! {
                r = client.alter_partition(request) => r,
                _ = shutdown.changed() => return,
            };
            let retry = handle_response(result, items, &mut unsent);
            if retry {
                tokio::select! {
                    _ = tokio::time::sleep(retry_backoff) => {}
                    _ = shutdown.changed() => return,
                }
            }
        }
    });
    (Arc::new(AlterPartitionManager { tx }), task)
}

/// Kafka's `buildRequest` for v3: partitions grouped by topic id, each with its leader epoch,
/// partition epoch and new ISR with broker epochs.
pub fn build_request(
    broker_id: i32,
    broker_epoch: i64,
    items: &[AlterPartitionItem],
) -> AlterPartitionRequest {
    let mut topics: BTreeMap<Uuid, Vec<PartitionData>> = BTreeMap::new();
    for item in items {
        let c = &item.change;
        topics.entry(item.topic_id).or_default().push(
            PartitionData::default()
                .with_partition_index(item.topic_partition.partition)
                .with_leader_epoch(c.leader_epoch)
                .with_partition_epoch(c.partition_epoch)
                .with_leader_recovery_state(0)
                .with_new_isr_with_epochs(
                    c.new_isr
                        .iter()
                        .map(|(id, epoch)| {
                            BrokerState::default()
                                .with_broker_id(BrokerId(*id))
                                .with_broker_epoch(*epoch)
                        })
                        .collect(),
                ),
        );
    }
    AlterPartitionRequest::default()
        .with_broker_id(BrokerId(broker_id))
        .with_broker_epoch(broker_epoch)
        .with_topics(
            topics
                .into_iter()
                .map(|(topic_id, partitions)| {
                    TopicData::default()
                        .with_topic_id(topic_id)
                        .with_partitions(partitions)
                })
                .collect(),
        )
}

/// The outcome of a partition error code, `None` to retry (Kafka's
/// `Partition.handleAlterPartitionError`).
pub fn outcome_of(error_code: i16) -> Option<AlterPartitionOutcome> {
    match error_code {
        ec::NONE => Some(AlterPartitionOutcome::Committed),
        INELIGIBLE_REPLICA | OPERATION_NOT_ATTEMPTED => Some(AlterPartitionOutcome::Rejected),
        ec::FENCED_LEADER_EPOCH
        | INVALID_UPDATE_VERSION
        | ec::NOT_LEADER_OR_FOLLOWER
        | ec::UNKNOWN_TOPIC_OR_PARTITION
        | UNKNOWN_TOPIC_ID
        | ec::INVALID_REQUEST
        | NEW_LEADER_ELECTED => Some(AlterPartitionOutcome::AwaitMetadata),
        _ => None,
    }
}

/// Completes the items the response answers; returns the others to `unsent` (unless a newer
/// change for the partition is already there). Returns whether to back off before the next
/// send (a failed send or a top-level error).
fn handle_response(
    result: Result<AlterPartitionResponse, String>,
    items: Vec<AlterPartitionItem>,
    unsent: &mut BTreeMap<(Uuid, i32), AlterPartitionItem>,
) -> bool {
    let requeue = |unsent: &mut BTreeMap<(Uuid, i32), AlterPartitionItem>,
                   item: AlterPartitionItem| {
        unsent
            .entry((item.topic_id, item.topic_partition.partition))
            .or_insert(item);
    };
    let response = match result {
        Ok(r) if r.error_code == ec::NONE => r,
        Ok(r) => {
            tracing::warn!(
                error_code = r.error_code,
                "AlterPartition: top-level error, retrying"
            );
            items.into_iter().for_each(|i| requeue(unsent, i));
            return true;
        }
        Err(e) => {
            tracing::warn!(error = %e, "AlterPartition: send failed, retrying");
            items.into_iter().for_each(|i| requeue(unsent, i));
            return true;
        }
    };
    let mut codes: BTreeMap<(Uuid, i32), i16> = BTreeMap::new();
    for t in &response.topics {
        for p in &t.partitions {
            codes.insert((t.topic_id, p.partition_index), p.error_code);
        }
    }
    for item in items {
        let key = (item.topic_id, item.topic_partition.partition);
        match codes.get(&key).copied().map(|c| (c, outcome_of(c))) {
            Some((code, Some(outcome))) => {
                if code != ec::NONE {
                    tracing::info!(partition = %item.topic_partition, code, ?outcome,
                        "AlterPartition refused");
                }
                (item.on_complete)(outcome);
            }
            Some((code, None)) => {
                tracing::warn!(partition = %item.topic_partition, code,
                    "AlterPartition: unexpected error, retrying");
                requeue(unsent, item);
            }
            None => {
                tracing::warn!(partition = %item.topic_partition,
                    "AlterPartition: partition missing from the response, retrying");
                requeue(unsent, item);
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use gregor_protocol::kafka_protocol::messages::alter_partition_response as resp;
    use parking_lot::Mutex;

    use super::*;
    use crate::replication::leader::IsrChangeKind;

    /// Answers each request with the next scripted result and records the requests.
    struct Scripted {
        answers: Mutex<Vec<Result<AlterPartitionResponse, String>>>,
        requests: Arc<Mutex<Vec<AlterPartitionRequest>>>,
        calls: AtomicUsize,
    }

    impl AlterPartitionClient for Scripted {
        fn alter_partition(&self, request: AlterPartitionRequest) -> AlterPartitionFuture {
            self.calls.fetch_add(1, Ordering::SeqCst);
            self.requests.lock().push(request);
            let mut answers = self.answers.lock();
            let next = if answers.is_empty() {
                Err("no more answers".to_string())
            } else {
                answers.remove(0)
            };
            Box::pin(async move { next })
        }
    }

    fn response(topic: Uuid, codes: &[(i32, i16)]) -> AlterPartitionResponse {
        AlterPartitionResponse::default().with_topics(vec![resp::TopicData::default()
            .with_topic_id(topic)
            .with_partitions(
                codes
                    .iter()
                    .map(|(p, c)| {
                        resp::PartitionData::default()
                            .with_partition_index(*p)
                            .with_error_code(*c)
                    })
                    .collect(),
            )])
    }

    fn item(
        topic: Uuid,
        partition: i32,
        outcomes: &Arc<Mutex<Vec<(i32, AlterPartitionOutcome)>>>,
    ) -> AlterPartitionItem {
        let outcomes = outcomes.clone();
        AlterPartitionItem {
            topic_id: topic,
            topic_partition: TopicPartition::new("t", partition),
            change: IsrChange {
                id: 1,
                leader_epoch: 4,
                partition_epoch: 7,
                new_isr: vec![(1, 10), (2, 20)],
                kind: IsrChangeKind::Expand(2),
            },
            on_complete: Box::new(move |o| outcomes.lock().push((partition, o))),
        }
    }

    async fn until(what: &str, f: impl Fn() -> bool) {
        for _ in 0..500 {
            if f() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("timed out waiting for {what}");
    }

    #[test]
    fn request_is_v3_with_broker_epochs() {
        let topic = Uuid::new_v4();
        let outcomes = Arc::new(Mutex::new(Vec::new()));
        let r = build_request(
            1,
            99,
            &[item(topic, 0, &outcomes), item(topic, 3, &outcomes)],
        );
        assert_eq!((r.broker_id.0, r.broker_epoch), (1, 99));
        assert_eq!(r.topics.len(), 1);
        let p = &r.topics[0].partitions[1];
        assert_eq!(
            (p.partition_index, p.leader_epoch, p.partition_epoch),
            (3, 4, 7)
        );
        assert!(p.new_isr.is_empty());
        let isr: Vec<(i32, i64)> = p
            .new_isr_with_epochs
            .iter()
            .map(|b| (b.broker_id.0, b.broker_epoch))
            .collect();
        assert_eq!(isr, vec![(1, 10), (2, 20)]);
    }

    #[test]
    fn partition_errors_map_as_kafka_does() {
        assert_eq!(outcome_of(0), Some(AlterPartitionOutcome::Committed));
        assert_eq!(outcome_of(107), Some(AlterPartitionOutcome::Rejected));
        assert_eq!(outcome_of(55), Some(AlterPartitionOutcome::Rejected));
        for code in [74, 95, 6, 3, 100, 42, 108] {
            assert_eq!(outcome_of(code), Some(AlterPartitionOutcome::AwaitMetadata));
        }
        assert_eq!(outcome_of(ec::UNKNOWN_SERVER_ERROR), None);
    }

    #[tokio::test]
    async fn retries_failed_sends_and_missing_partitions_then_completes() {
        let topic = Uuid::new_v4();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let client = Arc::new(Scripted {
            answers: Mutex::new(vec![
                Err("controller unreachable".into()),
                // Top-level NOT_CONTROLLER: retried.
                Ok(AlterPartitionResponse::default().with_error_code(41)),
                // Partition 1 missing, partition 0 fenced.
                Ok(response(topic, &[(0, ec::FENCED_LEADER_EPOCH)])),
                Ok(response(topic, &[(1, 0)])),
            ]),
            requests: requests.clone(),
            calls: AtomicUsize::new(0),
        });
        let (_stop, shutdown) = watch::channel(false);
        let (manager, task) = start(
            1,
            Arc::new(|| 42),
            client.clone(),
            Duration::from_millis(1),
            shutdown,
        );
        let outcomes = Arc::new(Mutex::new(Vec::new()));
        manager.submit(item(topic, 0, &outcomes));
        manager.submit(item(topic, 1, &outcomes));
        until("both outcomes", || outcomes.lock().len() == 2).await;
        let got = outcomes.lock().clone();
        assert!(got.contains(&(0, AlterPartitionOutcome::AwaitMetadata)));
        assert!(got.contains(&(1, AlterPartitionOutcome::Committed)));
        {
            let requests = requests.lock();
            assert_eq!(
                requests.last().unwrap().topics[0].partitions.len(),
                1,
                "only the missing one resent"
            );
            assert!(requests.iter().all(|r| r.broker_epoch == 42));
        }
        drop(manager);
        task.await.expect("task ends when every handle is gone");
    }
}
