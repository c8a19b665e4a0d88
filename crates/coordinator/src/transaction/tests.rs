//! The transaction coordinator driven without a broker: the in-memory log of the group
//! coordinator's tests as `__transaction_state`, a manual clock, and fake broker services
//! (a producer id counter and a marker sender whose answers the test scripts).

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use gregor_log::clock::{ManualClock, SharedClock};
use gregor_protocol::error::ErrorCode;
use parking_lot::Mutex;
use tokio::sync::Notify;

use super::*;
use crate::tests::MemoryWriter;

/// Fake broker services: producer ids from 1000; markers recorded, answered by the script
/// (NONE for every partition when the script is empty).
struct FakeServices {
    next_pid: AtomicI64,
    sent: Mutex<Vec<MarkerRequest>>,
    script: Mutex<VecDeque<ErrorCode>>,
    marker_sent: Notify,
    transaction_version: i16,
}

impl TransactionServices for FakeServices {
    fn generate_producer_id(&self) -> BoxFuture<Result<i64, ErrorCode>> {
        let id = self.next_pid.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move { Ok(id) })
    }

    fn send_markers(&self, request: MarkerRequest) -> BoxFuture<Vec<(TxnPartition, ErrorCode)>> {
        let code = self.script.lock().pop_front().unwrap_or(ErrorCode::None);
        let out = request
            .partitions
            .iter()
            .map(|tp| (tp.clone(), code))
            .collect();
        self.sent.lock().push(request);
        self.marker_sent.notify_waiters();
        Box::pin(async move { out })
    }

    fn transaction_version(&self) -> i16 {
        self.transaction_version
    }
}

struct Harness {
    coordinator: Arc<TransactionCoordinator>,
    writer: Arc<MemoryWriter>,
    services: Arc<FakeServices>,
    clock: Arc<ManualClock>,
}

const PARTITIONS: i32 = 4;

fn harness() -> Harness {
    let writer = MemoryWriter::new(PARTITIONS);
    let clock = ManualClock::new(1_000_000);
    let shared: SharedClock = clock.clone();
    let services = Arc::new(FakeServices {
        next_pid: AtomicI64::new(1000),
        sent: Mutex::new(Vec::new()),
        script: Mutex::new(VecDeque::new()),
        marker_sent: Notify::new(),
        transaction_version: 2,
    });
    let config = TransactionConfig {
        state_log_num_partitions: PARTITIONS,
        ..TransactionConfig::default()
    };
    let coordinator = TransactionCoordinator::new(config, writer.clone(), services.clone(), shared);
    for p in 0..PARTITIONS {
        coordinator.on_became_leader(p, 5);
    }
    Harness {
        coordinator,
        writer,
        services,
        clock,
    }
}

fn tps(list: &[(&str, i32)]) -> BTreeSet<TxnPartition> {
    list.iter().map(|(t, p)| ((*t).to_string(), *p)).collect()
}

impl Harness {
    /// Waits (yielding to the marker sender's task, no sleeping) until `id` is in `state`
    /// with no transition pending.
    async fn settled(&self, id: &str, state: TransactionState) -> TransactionMetadata {
        for _ in 0..10_000 {
            if let Some(md) = self.coordinator.transaction(id) {
                if md.state == state && md.pending_state.is_none() {
                    return md;
                }
            }
            tokio::task::yield_now().await;
        }
        panic!(
            "{id} never reached {state}: {:?}",
            self.coordinator.transaction(id)
        );
    }

    /// Waits until `done` holds: yields to the coordinator's tasks, and between the marker
    /// sender's attempts waits for its next one (it backs off in real time).
    async fn wait_for(&self, done: impl Fn(&Self) -> bool) {
        for _ in 0..50 {
            let next_attempt = self.services.marker_sent.notified();
            tokio::pin!(next_attempt);
            next_attempt.as_mut().enable();
            for _ in 0..1_000 {
                if done(self) {
                    return;
                }
                tokio::task::yield_now().await;
            }
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), next_attempt).await;
        }
        panic!("the condition never held");
    }

    async fn init(&self, id: &str) -> ProducerIdAndEpoch {
        self.coordinator.init_producer_id(id, 60_000, None).await
    }
}

#[tokio::test]
async fn init_producer_id_allocates_then_bumps_the_epoch() {
    let h = harness();
    let r = h.init("t1").await;
    assert_eq!(r, ProducerIdAndEpoch::ok(1000, 0));
    let r = h.init("t1").await;
    assert_eq!(r, ProducerIdAndEpoch::ok(1000, 1));
    // KIP-360: a producer recovering with its current (id, epoch) bumps it.
    let r = h
        .coordinator
        .init_producer_id("t1", 60_000, Some((1000, 1)))
        .await;
    assert_eq!(r, ProducerIdAndEpoch::ok(1000, 2));
    // ... and one with an old epoch that is not the last one is fenced.
    let r = h
        .coordinator
        .init_producer_id("t1", 60_000, Some((1000, 0)))
        .await;
    assert_eq!(r.error, ErrorCode::ProducerFenced);
    // Another producer id than the current one is fenced too.
    let r = h
        .coordinator
        .init_producer_id("t1", 60_000, Some((77, 0)))
        .await;
    assert_eq!(r.error, ErrorCode::ProducerFenced);
    // The records are in the transactional id's partition, in Kafka's schema.
    let p = h.coordinator.partition_for("t1");
    assert_eq!(h.writer.record_count(p), 3);
}

#[tokio::test]
async fn request_errors() {
    let h = harness();
    assert_eq!(
        h.coordinator.init_producer_id("", 60_000, None).await.error,
        ErrorCode::InvalidRequest
    );
    assert_eq!(
        h.coordinator
            .init_producer_id("t", 900_001, None)
            .await
            .error,
        ErrorCode::InvalidTransactionTimeout
    );
    assert_eq!(
        h.coordinator.init_producer_id("t", 0, None).await.error,
        ErrorCode::InvalidTransactionTimeout
    );
    let parts = tps(&[("a", 0)]);
    // Unknown id.
    assert_eq!(
        h.coordinator.add_partitions("nope", 1, 0, &parts, 0).await,
        ErrorCode::InvalidProducerIdMapping
    );
    let r = h.init("t").await;
    assert_eq!(
        h.coordinator
            .add_partitions("t", r.producer_id + 1, 0, &parts, 0)
            .await,
        ErrorCode::InvalidProducerIdMapping
    );
    assert_eq!(
        h.coordinator
            .add_partitions("t", r.producer_id, 3, &parts, 0)
            .await,
        ErrorCode::ProducerFenced
    );
    // EndTxn without a transaction.
    let e = h
        .coordinator
        .end_transaction("t", r.producer_id, 0, true, 0)
        .await;
    assert_eq!(e.error, ErrorCode::InvalidTxnState);
    // Not the coordinator: the partition is led elsewhere.
    let p = h.coordinator.partition_for("t");
    h.writer.set_leader(p, false);
    assert_eq!(h.init("t").await.error, ErrorCode::NotCoordinator);
    h.writer.set_leader(p, true);
    // Loading.
    h.coordinator.on_resigned(p);
    assert_eq!(h.init("t").await.error, ErrorCode::NotCoordinator);
    assert!(h.coordinator.runtime().begin_load(p));
    assert_eq!(
        h.init("t").await.error,
        ErrorCode::CoordinatorLoadInProgress
    );
    assert_eq!(
        h.coordinator.describe("t").error,
        ErrorCode::CoordinatorLoadInProgress
    );
    assert_eq!(
        h.coordinator.list(&ListFilters {
            duration_ms: -1,
            ..ListFilters::default()
        }),
        Err(ErrorCode::CoordinatorLoadInProgress)
    );
}

#[tokio::test]
async fn commit_writes_markers_then_completes() {
    let h = harness();
    let r = h.init("t1").await;
    let parts = tps(&[("a", 0), ("a", 1), ("b", 0)]);
    assert_eq!(
        h.coordinator
            .add_partitions("t1", r.producer_id, 0, &parts, 0)
            .await,
        ErrorCode::None
    );
    // Adding partitions already in the transaction answers at once.
    assert_eq!(
        h.coordinator
            .add_partitions("t1", r.producer_id, 0, &tps(&[("a", 1)]), 0)
            .await,
        ErrorCode::None
    );
    assert_eq!(
        h.coordinator.transaction("t1").unwrap().state,
        TransactionState::Ongoing
    );
    let e = h
        .coordinator
        .end_transaction("t1", r.producer_id, 0, true, 0)
        .await;
    assert_eq!(e, ProducerIdAndEpoch::ok(r.producer_id, 0));
    let md = h.settled("t1", TransactionState::CompleteCommit).await;
    assert!(md.partitions.is_empty());
    let sent = h.services.sent.lock().clone();
    assert_eq!(sent.len(), 1);
    assert_eq!(
        (
            sent[0].producer_id,
            sent[0].producer_epoch,
            sent[0].commit,
            sent[0].coordinator_epoch
        ),
        (r.producer_id, 0, true, 5)
    );
    assert_eq!(
        sent[0].partitions.iter().cloned().collect::<BTreeSet<_>>(),
        parts
    );
    // A retried EndTxn of the completed commit answers NONE; an abort is INVALID_TXN_STATE.
    assert_eq!(
        h.coordinator
            .end_transaction("t1", r.producer_id, 0, true, 0)
            .await
            .error,
        ErrorCode::None
    );
    assert_eq!(
        h.coordinator
            .end_transaction("t1", r.producer_id, 0, false, 0)
            .await
            .error,
        ErrorCode::InvalidTxnState
    );
    // The log holds Empty, Ongoing, PrepareCommit, CompleteCommit (the second add wrote nothing).
    assert_eq!(h.writer.record_count(h.coordinator.partition_for("t1")), 4);
}

#[tokio::test]
async fn transaction_version_2_bumps_the_epoch_with_every_transaction() {
    let h = harness();
    let r = h.init("t2").await;
    // The partition leader adds the partition (KIP-890 part 2).
    assert_eq!(
        h.coordinator
            .add_partitions("t2", r.producer_id, 0, &tps(&[("a", 0)]), 2)
            .await,
        ErrorCode::None
    );
    let e = h
        .coordinator
        .end_transaction("t2", r.producer_id, 0, false, 2)
        .await;
    assert_eq!(e, ProducerIdAndEpoch::ok(r.producer_id, 1));
    h.settled("t2", TransactionState::CompleteAbort).await;
    assert_eq!(h.services.sent.lock()[0].producer_epoch, 1);
    // A retry with the old epoch is recognised as a retry.
    let again = h
        .coordinator
        .end_transaction("t2", r.producer_id, 0, false, 2)
        .await;
    assert_eq!(again, ProducerIdAndEpoch::ok(r.producer_id, 1));
    // The old epoch cannot start a new transaction; the new one can.
    assert_eq!(
        h.coordinator
            .add_partitions("t2", r.producer_id, 0, &tps(&[("a", 0)]), 2)
            .await,
        ErrorCode::ProducerFenced
    );
    assert_eq!(
        h.coordinator
            .add_partitions("t2", r.producer_id, 1, &tps(&[("a", 0)]), 2)
            .await,
        ErrorCode::None
    );
}

#[tokio::test]
async fn a_new_producer_fences_and_aborts_the_ongoing_transaction() {
    let h = harness();
    let old = h.init("t3").await;
    h.coordinator
        .add_partitions("t3", old.producer_id, 0, &tps(&[("a", 0)]), 0)
        .await;
    // The new instance's InitProducerId aborts the transaction and asks it to retry.
    let r = h.init("t3").await;
    assert_eq!(r.error, ErrorCode::ConcurrentTransactions);
    let md = h.settled("t3", TransactionState::CompleteAbort).await;
    assert_eq!(md.producer_epoch, 1);
    let m = h.services.sent.lock()[0].clone();
    assert_eq!((m.commit, m.producer_epoch), (false, 1));
    // The retry gets a newer epoch; the old producer is fenced everywhere.
    let r = h.init("t3").await;
    assert_eq!(r, ProducerIdAndEpoch::ok(old.producer_id, 2));
    assert_eq!(
        h.coordinator
            .end_transaction("t3", old.producer_id, 0, true, 0)
            .await
            .error,
        ErrorCode::ProducerFenced
    );
    assert_eq!(
        h.coordinator
            .verify_partitions("t3", old.producer_id, 0, &[("a".into(), 0)]),
        vec![(("a".to_string(), 0), ErrorCode::ProducerFenced)]
    );
}

#[tokio::test]
async fn verification_says_which_partitions_are_in_the_transaction() {
    let h = harness();
    let r = h.init("v").await;
    h.coordinator
        .add_partitions("v", r.producer_id, 0, &tps(&[("a", 0)]), 0)
        .await;
    let got =
        h.coordinator
            .verify_partitions("v", r.producer_id, 0, &[("a".into(), 0), ("a".into(), 1)]);
    assert_eq!(
        got,
        vec![
            (("a".to_string(), 0), ErrorCode::None),
            (("a".to_string(), 1), ErrorCode::TransactionAbortable)
        ]
    );
    assert_eq!(
        h.coordinator
            .verify_partitions("nope", 1, 0, &[("a".into(), 0)])[0]
            .1,
        ErrorCode::InvalidProducerIdMapping
    );
}

#[tokio::test]
async fn markers_are_retried_until_the_leader_writes_them() {
    let h = harness();
    let r = h.init("r").await;
    h.coordinator
        .add_partitions("r", r.producer_id, 0, &tps(&[("a", 0)]), 0)
        .await;
    h.services
        .script
        .lock()
        .extend([ErrorCode::NotLeaderOrFollower, ErrorCode::RequestTimedOut]);
    h.coordinator
        .end_transaction("r", r.producer_id, 0, true, 0)
        .await;
    // While the markers are pending, the transaction cannot move on.
    assert_eq!(
        h.coordinator
            .end_transaction("r", r.producer_id, 0, true, 0)
            .await
            .error,
        ErrorCode::ConcurrentTransactions
    );
    assert_eq!(h.init("r").await.error, ErrorCode::ConcurrentTransactions);
    // The sender backs off between attempts: wait for them, woken by each attempt.
    h.wait_for(|h| {
        h.coordinator.transaction("r").is_some_and(|m| {
            m.state == TransactionState::CompleteCommit && m.pending_state.is_none()
        })
    })
    .await;
    assert_eq!(h.services.sent.lock().len(), 3);
}

#[tokio::test]
async fn a_fenced_marker_stops_the_sender() {
    let h = harness();
    let r = h.init("f").await;
    h.coordinator
        .add_partitions("f", r.producer_id, 0, &tps(&[("a", 0)]), 0)
        .await;
    h.services
        .script
        .lock()
        .push_back(ErrorCode::TransactionCoordinatorFenced);
    h.coordinator
        .end_transaction("f", r.producer_id, 0, true, 0)
        .await;
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    let md = h.coordinator.transaction("f").unwrap();
    assert_eq!(md.state, TransactionState::PrepareCommit);
    assert_eq!(h.services.sent.lock().len(), 1);
}

#[tokio::test]
async fn state_is_rebuilt_on_load_and_pending_markers_are_sent_again() {
    let h = harness();
    let a = h.init("done").await;
    h.coordinator
        .add_partitions("done", a.producer_id, 0, &tps(&[("x", 0)]), 0)
        .await;
    h.coordinator
        .end_transaction("done", a.producer_id, 0, true, 0)
        .await;
    h.settled("done", TransactionState::CompleteCommit).await;
    let b = h.init("open").await;
    h.coordinator
        .add_partitions("open", b.producer_id, 0, &tps(&[("y", 1)]), 0)
        .await;
    // A commit whose markers never get through before the coordinator moves.
    let c = h.init("moving").await;
    h.coordinator
        .add_partitions("moving", c.producer_id, 0, &tps(&[("z", 2)]), 0)
        .await;
    h.services
        .script
        .lock()
        .push_back(ErrorCode::TransactionCoordinatorFenced);
    h.coordinator
        .end_transaction("moving", c.producer_id, 0, true, 0)
        .await;
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    let before = h.services.sent.lock().len();
    for p in 0..PARTITIONS {
        h.coordinator.on_resigned(p);
    }
    assert!(h.coordinator.transaction("open").is_none());
    for p in 0..PARTITIONS {
        h.coordinator.on_became_leader(p, 6);
    }
    let done = h.coordinator.transaction("done").unwrap();
    assert_eq!(
        (done.state, done.producer_id, done.producer_epoch),
        (TransactionState::CompleteCommit, a.producer_id, 0)
    );
    let open = h.coordinator.transaction("open").unwrap();
    assert_eq!(open.state, TransactionState::Ongoing);
    assert_eq!(open.partitions, tps(&[("y", 1)]));
    // The loaded PrepareCommit is completed with the new coordinator epoch.
    h.settled("moving", TransactionState::CompleteCommit).await;
    let sent = h.services.sent.lock();
    let resent = &sent[before];
    assert_eq!(
        (
            resent.commit,
            resent.coordinator_epoch,
            resent.partitions.clone()
        ),
        (true, 6, vec![("z".to_string(), 2)])
    );
}

#[tokio::test]
async fn timed_out_transactions_are_aborted_and_their_producer_fenced() {
    let h = harness();
    let r = h.coordinator.init_producer_id("slow", 1_000, None).await;
    h.coordinator
        .add_partitions("slow", r.producer_id, 0, &tps(&[("a", 0)]), 0)
        .await;
    h.clock.advance_ms(999);
    assert_eq!(h.coordinator.abort_timed_out_transactions().await, 0);
    h.clock.advance_ms(2);
    assert_eq!(h.coordinator.abort_timed_out_transactions().await, 1);
    let md = h.settled("slow", TransactionState::CompleteAbort).await;
    assert_eq!(md.producer_epoch, 1);
    assert!(!h.services.sent.lock()[0].commit);
    assert_eq!(
        h.coordinator
            .end_transaction("slow", r.producer_id, 0, true, 0)
            .await
            .error,
        ErrorCode::ProducerFenced
    );
}

#[tokio::test]
async fn idle_transactional_ids_expire() {
    let h = harness();
    h.init("idle").await;
    let r = h.init("busy").await;
    h.coordinator
        .add_partitions("busy", r.producer_id, 0, &tps(&[("a", 0)]), 0)
        .await;
    h.clock.advance_ms(604_800_000);
    assert_eq!(h.coordinator.remove_expired_transactional_ids().await, 1);
    assert!(h.coordinator.transaction("idle").is_none());
    assert!(h.coordinator.transaction("busy").is_some());
    // The tombstone keeps it gone after a reload.
    let p = h.coordinator.partition_for("idle");
    h.coordinator.on_resigned(p);
    h.coordinator.on_became_leader(p, 7);
    assert!(h.coordinator.transaction("idle").is_none());
    assert_eq!(
        h.coordinator.describe("idle").error,
        ErrorCode::TransactionalIdNotFound
    );
}

#[tokio::test]
async fn describe_and_list() {
    let h = harness();
    let a = h.init("alpha").await;
    h.coordinator
        .add_partitions(
            "alpha",
            a.producer_id,
            0,
            &tps(&[("t", 1), ("t", 0), ("u", 3)]),
            0,
        )
        .await;
    h.init("beta").await;
    let d = h.coordinator.describe("alpha");
    assert_eq!(d.error, ErrorCode::None);
    assert_eq!(d.state, "Ongoing");
    assert_eq!(
        d.topics,
        vec![("t".to_string(), vec![0, 1]), ("u".to_string(), vec![3])]
    );
    assert_eq!(d.start_time_ms, 1_000_000);
    let all = ListFilters {
        duration_ms: -1,
        ..ListFilters::default()
    };
    let (l, unknown) = h.coordinator.list(&all).unwrap();
    assert_eq!(
        l.iter()
            .map(|t| t.transactional_id.as_str())
            .collect::<Vec<_>>(),
        ["alpha", "beta"]
    );
    assert!(unknown.is_empty());
    let (l, unknown) = h
        .coordinator
        .list(&ListFilters {
            states: vec!["Ongoing".into(), "Bogus".into()],
            ..all.clone()
        })
        .unwrap();
    assert_eq!(l.len(), 1);
    assert_eq!(unknown, vec!["Bogus".to_string()]);
    let (l, _) = h
        .coordinator
        .list(&ListFilters {
            transactional_id_pattern: Some("b.*".into()),
            ..all.clone()
        })
        .unwrap();
    assert_eq!(l[0].transactional_id, "beta");
    // Duration: alpha started at 1_000_000; only transactions running longer are listed.
    h.clock.advance_ms(5_000);
    let (l, _) = h
        .coordinator
        .list(&ListFilters {
            duration_ms: 4_000,
            states: vec!["Ongoing".into()],
            ..all.clone()
        })
        .unwrap();
    assert_eq!(l.len(), 1);
    let (l, _) = h
        .coordinator
        .list(&ListFilters {
            duration_ms: 6_000,
            states: vec!["Ongoing".into()],
            ..all
        })
        .unwrap();
    assert!(l.is_empty());
}

#[tokio::test]
async fn a_write_that_is_not_committed_is_not_applied() {
    let h = harness();
    let r = h.init("w").await;
    h.writer.auto_commit.store(false, Ordering::SeqCst);
    let p = h.coordinator.partition_for("w");
    let c = h.coordinator.clone();
    let pending = tokio::spawn(async move {
        c.add_partitions("w", r.producer_id, 0, &tps(&[("a", 0)]), 0)
            .await
    });
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        h.coordinator.transaction("w").unwrap().state,
        TransactionState::Empty
    );
    // Leadership moves before the high watermark passes it.
    h.writer.drop_waiters();
    assert_eq!(pending.await.unwrap(), ErrorCode::NotCoordinator);
    let md = h.coordinator.transaction("w").unwrap();
    assert_eq!(
        (md.state, md.pending_state),
        (TransactionState::Empty, None)
    );
    h.writer.advance_hw(p);
}

#[test]
fn partition_for_is_kafkas() {
    let h = harness();
    // Java: Math.abs("my-txn".hashCode()) % 4.
    let java = crate::group::java_string_hash_code("my-txn");
    assert_eq!(h.coordinator.partition_for("my-txn"), java.abs() % 4);
    assert_eq!(h.coordinator.partition_for("polygenelubricants"), 0);
}

#[test]
fn config_defaults_are_kafkas() {
    let c = TransactionConfig::default();
    assert_eq!(c.transaction_max_timeout_ms, 900_000);
    assert_eq!(c.transactional_id_expiration_ms, 604_800_000);
    assert_eq!(c.abort_timed_out_transaction_cleanup_interval_ms, 10_000);
    assert_eq!(c.state_log_num_partitions, 50);
    assert_eq!(c.state_log_replication_factor, 3);
    assert_eq!(c.state_log_min_isr, 2);
    let mut props = BTreeMap::new();
    props.insert("transaction.max.timeout.ms".to_string(), "0".to_string());
    assert!(TransactionConfig::from_properties(&props).is_err());
    props.insert("transaction.max.timeout.ms".to_string(), "1000".to_string());
    assert_eq!(
        TransactionConfig::from_properties(&props)
            .unwrap()
            .transaction_max_timeout_ms,
        1000
    );
}

/// Kafka's EndTxn table for transaction.version 2 outside a transaction (KAFKA-14563): a retry
/// of the completed result is NONE, an abort with the current epoch is an empty abort (a new
/// epoch, no markers), the rest INVALID_TXN_STATE or PRODUCER_FENCED.
#[tokio::test]
async fn transaction_version_2_empty_aborts_and_retries() {
    let h = harness();
    let r = h.init("e").await;
    let pid = r.producer_id;
    // Empty: an abort with the current epoch is an empty abort; a commit is invalid.
    assert_eq!(
        h.coordinator
            .end_transaction("e", pid, 0, true, 2)
            .await
            .error,
        ErrorCode::InvalidTxnState
    );
    assert_eq!(
        h.coordinator.end_transaction("e", pid, 0, false, 2).await,
        ProducerIdAndEpoch::ok(pid, 1)
    );
    h.settled("e", TransactionState::CompleteAbort).await;
    assert!(h.services.sent.lock().is_empty(), "no partition, no marker");
    // CompleteAbort: the retry (old epoch) is NONE; a commit with either epoch is invalid.
    assert_eq!(
        h.coordinator.end_transaction("e", pid, 0, false, 2).await,
        ProducerIdAndEpoch::ok(pid, 1)
    );
    assert_eq!(
        h.coordinator
            .end_transaction("e", pid, 1, true, 2)
            .await
            .error,
        ErrorCode::InvalidTxnState
    );
    // A commit of a real transaction, then its retry, then an abort retry is invalid.
    h.coordinator
        .add_partitions("e", pid, 1, &tps(&[("a", 0)]), 2)
        .await;
    assert_eq!(
        h.coordinator.end_transaction("e", pid, 1, true, 2).await,
        ProducerIdAndEpoch::ok(pid, 2)
    );
    h.settled("e", TransactionState::CompleteCommit).await;
    assert_eq!(
        h.coordinator.end_transaction("e", pid, 1, true, 2).await,
        ProducerIdAndEpoch::ok(pid, 2)
    );
    assert_eq!(
        h.coordinator
            .end_transaction("e", pid, 1, false, 2)
            .await
            .error,
        ErrorCode::InvalidTxnState
    );
    // An older epoch than the retry's is fenced.
    assert_eq!(
        h.coordinator
            .end_transaction("e", pid, 0, false, 2)
            .await
            .error,
        ErrorCode::ProducerFenced
    );
}
