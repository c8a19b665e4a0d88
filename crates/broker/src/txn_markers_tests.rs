//! The partition side of transactions against a real broker in this process:
//! - WriteTxnMarkers: markers on `__consumer_offsets` partitions reach the installed
//!   [`TxnOffsetsCompletion`] once written (with the producer, its epoch, the partitions and
//!   the result), its error becomes the partitions' answer, and a partition with no log here
//!   is UNKNOWN_TOPIC_OR_PARTITION;
//! - KIP-890 verification in the produce path, through a fake
//!   [`AddPartitionsToTxnSender`]: what it is asked (verify only or add, by Produce version),
//!   that a producer's open transaction is not verified again, and how its answers become
//!   produce errors.

use std::collections::BTreeMap;
use std::sync::Arc;

use gregor_protocol::batch::Batches;
use gregor_protocol::control::{parse_end_txn_marker, TransactionResult};
use gregor_protocol::kafka_protocol::messages::write_txn_markers_request::{
    WritableTxnMarker, WritableTxnMarkerTopic,
};
use gregor_protocol::kafka_protocol::messages::{ProducerId, TopicName};
use parking_lot::Mutex;

use crate::config::BrokerConfig;
use crate::error_codes as ec;
use crate::server;
use crate::txn_markers::{append_txn_markers, TxnOffsetsCompletion, GROUP_METADATA_TOPIC};
use crate::txn_verification::{
    AddPartitionsToTxnSender, TxnVerificationRequest, VerificationErrors, VerificationFuture,
};

type Call = (i64, i16, Vec<i32>, TransactionResult);

#[derive(Default)]
struct Recorder {
    calls: Mutex<Vec<Call>>,
    fail_with: Mutex<Option<i16>>,
}

impl TxnOffsetsCompletion for Recorder {
    fn on_transaction_completed(
        &self,
        producer_id: i64,
        producer_epoch: i16,
        partitions: &[i32],
        result: TransactionResult,
    ) -> Result<(), i16> {
        self.calls
            .lock()
            .push((producer_id, producer_epoch, partitions.to_vec(), result));
        match *self.fail_with.lock() {
            Some(code) => Err(code),
            None => Ok(()),
        }
    }
}

fn marker(producer_id: i64, commit: bool, topics: &[(&str, i32)]) -> WritableTxnMarker {
    WritableTxnMarker::default()
        .with_producer_id(ProducerId(producer_id))
        .with_producer_epoch(0)
        .with_transaction_result(commit)
        .with_coordinator_epoch(0)
        .with_topics(
            topics
                .iter()
                .map(|(t, p)| {
                    WritableTxnMarkerTopic::default()
                        .with_name(TopicName(crate::handlers::sb(t)))
                        .with_partition_indexes(vec![*p])
                })
                .collect(),
        )
}

#[tokio::test]
async fn markers_on_consumer_offsets_reach_the_group_coordinator() {
    let dir = tempfile::tempdir().expect("tempdir");
    let props: BTreeMap<String, String> = [
        ("log.dirs", dir.path().display().to_string()),
        ("listeners", "PLAINTEXT://127.0.0.1:0".into()),
        ("admin.listener", String::new()),
        ("offsets.topic.num.partitions", "1".into()),
        ("offsets.topic.replication.factor", "1".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let (config, _) = BrokerConfig::from_properties(props).expect("config");
    let running = server::start(config).await.expect("start");
    let b = &running.broker;
    crate::coordinator_writer::ensure_offsets_topic(b)
        .await
        .expect("topic");
    let recorder = Arc::new(Recorder::default());
    b.set_txn_offsets_completion(recorder.clone());

    let out = append_txn_markers(
        b,
        vec![marker(
            42,
            true,
            &[(GROUP_METADATA_TOPIC, 0), ("not-here", 0)],
        )],
    )
    .await
    .complete(b)
    .await;
    let codes: Vec<i16> = out[0]
        .topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| p.error_code))
        .collect();
    assert_eq!(codes, vec![ec::NONE, ec::UNKNOWN_TOPIC_OR_PARTITION]);
    assert_eq!(
        *recorder.calls.lock(),
        vec![(42, 0, vec![0], TransactionResult::Commit)]
    );

    // The group coordinator's failure is the partition's answer; the marker is written.
    *recorder.fail_with.lock() = Some(ec::UNKNOWN_SERVER_ERROR);
    let out = append_txn_markers(b, vec![marker(43, false, &[(GROUP_METADATA_TOPIC, 0)])])
        .await
        .complete(b)
        .await;
    assert_eq!(
        out[0].topics[0].partitions[0].error_code,
        ec::UNKNOWN_SERVER_ERROR
    );
    assert_eq!(recorder.calls.lock().len(), 2);
    let p = b
        .replica_manager
        .partition(GROUP_METADATA_TOPIC, 0)
        .expect("hosted");
    let end = p.log.log_end_offset();
    let read = p.log.read(0, 1 << 20, end, true).expect("read");
    let markers: Vec<_> = Batches::new(&read.records)
        .filter_map(Result::ok)
        .filter(|(_, h)| h.is_control())
        .map(|(at, h)| {
            let m = parse_end_txn_marker(&h, &read.records[at..at + h.total_size()])
                .expect("marker")
                .expect("an end-transaction marker");
            (h.producer_id, m.result)
        })
        .collect();
    assert_eq!(
        markers,
        vec![
            (42, TransactionResult::Commit),
            (43, TransactionResult::Abort)
        ]
    );
    running.shutdown().await.expect("shutdown");
}

/// Answers every verification with `answer` for each partition (absent: verified) and
/// records the requests.
#[derive(Default)]
struct FakeCoordinator {
    requests: Mutex<Vec<TxnVerificationRequest>>,
    answer: Mutex<Option<i16>>,
    /// Requests answered CONCURRENT_TRANSACTIONS before `answer` applies.
    concurrent_first: Mutex<usize>,
}

impl AddPartitionsToTxnSender for FakeCoordinator {
    fn add_or_verify(&self, request: TxnVerificationRequest) -> VerificationFuture {
        let concurrent = {
            let mut left = self.concurrent_first.lock();
            let c = *left > 0;
            *left = left.saturating_sub(1);
            c
        };
        let answer = if concurrent {
            Some(crate::txn_verification::ec::CONCURRENT_TRANSACTIONS)
        } else {
            *self.answer.lock()
        };
        let errors: VerificationErrors = match answer {
            Some(code) => request
                .partitions
                .iter()
                .map(|tp| (tp.clone(), code))
                .collect(),
            None => VerificationErrors::new(),
        };
        self.requests.lock().push(request);
        Box::pin(async move { errors })
    }
}

mod wire {
    use bytes::{Bytes, BytesMut};
    use gregor_protocol::kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
    use gregor_protocol::kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    pub async fn call<Req: Encodable, Resp: Decodable>(
        s: &mut TcpStream,
        key: ApiKey,
        version: i16,
        req: &Req,
    ) -> Resp {
        let mut buf = BytesMut::new();
        RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(7)
            .with_client_id(Some(StrBytes::from_static_str("txn-test")))
            .encode(&mut buf, key.request_header_version(version))
            .expect("header");
        req.encode(&mut buf, version).expect("body");
        let mut out = (buf.len() as i32).to_be_bytes().to_vec();
        out.extend_from_slice(&buf);
        s.write_all(&out).await.expect("send");
        let mut len = [0u8; 4];
        s.read_exact(&mut len).await.expect("length");
        let mut body = vec![0u8; i32::from_be_bytes(len) as usize];
        s.read_exact(&mut body).await.expect("body");
        let mut b = Bytes::from(body);
        ResponseHeader::decode(&mut b, key.response_header_version(version)).expect("header");
        Resp::decode(&mut b, version).expect("response")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_produce_path_verifies_first_transactional_writes() {
    use bytes::Bytes;
    use gregor_protocol::batch::BatchBuilder;
    use gregor_protocol::kafka_protocol::messages::produce_request::{
        PartitionProduceData, TopicProduceData,
    };
    use gregor_protocol::kafka_protocol::messages::{
        ApiKey, ProduceRequest, ProduceResponse, TransactionalId,
    };

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
    let running = server::start(config).await.expect("start");
    let b = running.broker.clone();
    let created = b
        .create_topics_internal(vec![gregor_metadata::controller::NewTopic {
            name: "t".into(),
            num_partitions: 2,
            replication_factor: 1,
            assignments: vec![],
            configs: BTreeMap::new(),
        }])
        .await
        .expect("create t");
    created[0].as_ref().expect("create t");
    let coordinator = Arc::new(FakeCoordinator::default());
    b.replica_manager.set_txn_verifier(coordinator.clone());
    let mut s = tokio::net::TcpStream::connect(b.bound[0])
        .await
        .expect("connect");
    let pid = 4_000;
    // Produce v11 (verify only) or v12 (add the partition) of one transactional batch per
    // partition in `parts`, sequence `seq`; the error code per partition.
    let mut produce = async |version: i16, parts: &[i32], seq: i32| -> Vec<i16> {
        let batch = BatchBuilder::new(0, crate::replica_manager::now_ms())
            .producer(pid, 0, seq)
            .transactional(true, false)
            .record(crate::replica_manager::now_ms(), None, Some(b"v"), &[])
            .build();
        let req = ProduceRequest::default()
            .with_transactional_id(Some(TransactionalId(crate::handlers::sb("tx"))))
            .with_acks(-1)
            .with_timeout_ms(5_000)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(gregor_protocol::kafka_protocol::messages::TopicName(
                    crate::handlers::sb("t"),
                ))
                .with_partition_data(
                    parts
                        .iter()
                        .map(|p| {
                            PartitionProduceData::default()
                                .with_index(*p)
                                .with_records(Some(Bytes::from(batch.clone())))
                        })
                        .collect(),
                )]);
        let r: ProduceResponse = wire::call(&mut s, ApiKey::Produce, version, &req).await;
        r.responses[0]
            .partition_responses
            .iter()
            .map(|p| p.error_code)
            .collect()
    };
    // The coordinator cannot answer now: NOT_ENOUGH_REPLICAS (retriable), nothing written.
    *coordinator.answer.lock() = Some(crate::txn_verification::ec::NOT_COORDINATOR);
    assert_eq!(produce(11, &[0], 0).await, vec![ec::NOT_ENOUGH_REPLICAS]);
    // Not part of the transaction: INVALID_TXN_STATE.
    *coordinator.answer.lock() = Some(crate::txn_verification::ec::INVALID_TXN_STATE);
    assert_eq!(
        produce(11, &[0], 0).await,
        vec![crate::txn_verification::ec::INVALID_TXN_STATE]
    );
    // Verified: written.
    *coordinator.answer.lock() = None;
    assert_eq!(produce(11, &[0], 0).await, vec![ec::NONE]);
    {
        let requests = coordinator.requests.lock();
        assert_eq!(requests.len(), 3);
        let last = &requests[2];
        assert!(last.operation.verify_only());
        assert_eq!(
            (
                last.transactional_id.as_str(),
                last.producer_id,
                last.producer_epoch
            ),
            ("tx", pid, 0)
        );
        assert_eq!(
            last.partitions,
            vec![gregor_log::TopicPartition::new("t", 0)]
        );
    }
    // The transaction is open on partition 0: only partition 1 is asked about, and with
    // Produce v12 the partition is added rather than verified (KIP-890 part 2).
    assert_eq!(produce(12, &[0, 1], 1).await, vec![ec::NONE, ec::NONE]);
    {
        let requests = coordinator.requests.lock();
        assert_eq!(requests.len(), 4);
        assert!(!requests[3].operation.verify_only());
        assert_eq!(
            requests[3].partitions,
            vec![gregor_log::TopicPartition::new("t", 1)]
        );
    }
    let p0 = b.replica_manager.partition("t", 0).expect("hosted");
    assert_eq!(p0.log.log_end_offset(), 2);
    assert_eq!(p0.last_stable_offset(), 0);
    drop(s);
    running.shutdown().await.expect("shutdown");
}

/// KIP-890 part 2 (Kafka's `maybeRetryOnConcurrentTransactions`): while the producer's previous
/// transaction is still completing the coordinator answers CONCURRENT_TRANSACTIONS; the leader
/// asks again every `add.partitions.to.txn.retry.backoff.ms` until
/// `add.partitions.to.txn.retry.backoff.max.ms` has passed, then answers the producer with the
/// retriable error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_retries_concurrent_transactions() {
    use bytes::Bytes;
    use gregor_protocol::batch::BatchBuilder;
    use gregor_protocol::kafka_protocol::messages::produce_request::{
        PartitionProduceData, TopicProduceData,
    };
    use gregor_protocol::kafka_protocol::messages::{
        ApiKey, ProduceRequest, ProduceResponse, TransactionalId,
    };

    let dir = tempfile::tempdir().expect("tempdir");
    let props: BTreeMap<String, String> = [
        ("log.dirs", dir.path().display().to_string()),
        ("listeners", "PLAINTEXT://127.0.0.1:0".into()),
        ("admin.listener", String::new()),
        ("add.partitions.to.txn.retry.backoff.ms", "10".into()),
        ("add.partitions.to.txn.retry.backoff.max.ms", "2000".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let (config, _) = BrokerConfig::from_properties(props).expect("config");
    let running = server::start(config).await.expect("start");
    let b = running.broker.clone();
    let created = b
        .create_topics_internal(vec![gregor_metadata::controller::NewTopic {
            name: "t".into(),
            num_partitions: 2,
            replication_factor: 1,
            assignments: vec![],
            configs: BTreeMap::new(),
        }])
        .await
        .expect("create t");
    created[0].as_ref().expect("create t");
    let coordinator = Arc::new(FakeCoordinator::default());
    b.replica_manager.set_txn_verifier(coordinator.clone());
    let mut s = tokio::net::TcpStream::connect(b.bound[0])
        .await
        .expect("connect");
    let mut produce = async |partition: i32| -> i16 {
        let batch = BatchBuilder::new(0, crate::replica_manager::now_ms())
            .producer(5_000, 0, 0)
            .transactional(true, false)
            .record(crate::replica_manager::now_ms(), None, Some(b"v"), &[])
            .build();
        let req = ProduceRequest::default()
            .with_transactional_id(Some(TransactionalId(crate::handlers::sb("tx"))))
            .with_acks(-1)
            .with_timeout_ms(5_000)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(gregor_protocol::kafka_protocol::messages::TopicName(
                    crate::handlers::sb("t"),
                ))
                .with_partition_data(vec![PartitionProduceData::default()
                    .with_index(partition)
                    .with_records(Some(Bytes::from(batch)))])]);
        let r: ProduceResponse = wire::call(&mut s, ApiKey::Produce, 12, &req).await;
        r.responses[0].partition_responses[0].error_code
    };
    // Three CONCURRENT_TRANSACTIONS, then the partition is added: the producer sees success.
    *coordinator.concurrent_first.lock() = 3;
    assert_eq!(produce(0).await, ec::NONE);
    assert_eq!(coordinator.requests.lock().len(), 4);
    // Still completing after the retry time (2 s): the producer gets the retriable error.
    *coordinator.concurrent_first.lock() = usize::MAX;
    let started = std::time::Instant::now();
    assert_eq!(produce(1).await, ec::NOT_ENOUGH_REPLICAS);
    assert!(started.elapsed() >= std::time::Duration::from_millis(2_000));
    let asked = coordinator.requests.lock().len() - 4;
    assert!(
        (2..=201).contains(&asked),
        "{asked} requests in 2 s at 10 ms"
    );
    let p1 = b.replica_manager.partition("t", 1).expect("hosted");
    assert_eq!(p1.log.log_end_offset(), 0);
    drop(s);
    running.shutdown().await.expect("shutdown");
}
