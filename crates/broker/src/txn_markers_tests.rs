//! WriteTxnMarkers against a real broker in this process: markers on `__consumer_offsets`
//! partitions reach the installed [`TxnOffsetsCompletion`] once written (with the producer,
//! its epoch, the partitions and the result), its error becomes the partitions' answer, and a
//! partition with no log here is UNKNOWN_TOPIC_OR_PARTITION.

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
    assert!(b.txn_offsets_completion.set(recorder.clone()).is_ok());

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
