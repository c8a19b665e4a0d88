//! The partition leader's side of transactions (issue 12), driven at the protocol level with
//! our raw wire client, below the transaction coordinator (which these tests do not use): a
//! producer id from an idempotent InitProducerId,
//! Produce with a `transactional_id` and transactional batches, WriteTxnMarkers as the
//! coordinator sends them, then Fetch read_committed and read_uncommitted, ListOffsets and
//! DescribeProducers, across a kill -9 in the middle of an open transaction. KIP-890
//! verification is turned off here (`transaction.partition.verification.enable=false`, as
//! Kafka allows) since no coordinator knows these transactions; one test shows what a
//! producer gets with it on and no coordinator.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use bytes::Bytes;
use gregor_protocol::batch::{BatchBuilder, Batches};
use gregor_protocol::records::decode_records;
use gregor_tests::cluster::{Cluster, ClusterConfig, Implementation, Layout};
use gregor_tests::wire::{sb, KafkaConn};
use gregor_tests::Gregor;
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::describe_producers_request::TopicRequest;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::write_txn_markers_request::{
    WritableTxnMarker, WritableTxnMarkerTopic,
};
use kafka_protocol::messages::{
    ApiKey, BrokerId, CreateTopicsRequest, CreateTopicsResponse, DescribeProducersRequest,
    DescribeProducersResponse, FetchRequest, FetchResponse, InitProducerIdRequest,
    InitProducerIdResponse, ListOffsetsRequest, ListOffsetsResponse, MetadataRequest,
    MetadataResponse, ProduceRequest, ProduceResponse, ProducerId, TopicName, TransactionalId,
    WriteTxnMarkersRequest, WriteTxnMarkersResponse,
};

const BIN: &str = env!("CARGO_BIN_EXE_gregor");
const TOPIC: &str = "txn";
/// Record timestamps: now, so that the markers (stamped with the broker's clock) do not roll
/// a segment by `segment.ms` (which counts from the first batch's timestamp).
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn create_topic(c: &mut KafkaConn, name: &str) -> Result<()> {
    let r: CreateTopicsResponse = c.call(
        ApiKey::CreateTopics,
        7,
        &CreateTopicsRequest::default()
            .with_timeout_ms(10_000)
            .with_topics(vec![CreatableTopic::default()
                .with_name(TopicName(sb(name)))
                .with_num_partitions(1)
                .with_replication_factor(1)]),
    )?;
    ensure!(r.topics[0].error_code == 0, "create: {r:?}");
    Ok(())
}

fn init_producer_id(c: &mut KafkaConn) -> Result<i64> {
    let r: InitProducerIdResponse = c.call(
        ApiKey::InitProducerId,
        4,
        &InitProducerIdRequest::default()
            .with_transactional_id(None)
            .with_transaction_timeout_ms(60_000)
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1),
    )?;
    ensure!(r.error_code == 0, "InitProducerId: {}", r.error_code);
    Ok(r.producer_id.0)
}

/// A batch of `values`; transactional when `pid` is given (producer id, epoch, sequence).
fn batch(pid: Option<(i64, i16, i32)>, values: &[&str]) -> Vec<u8> {
    let mut b = BatchBuilder::new(0, now_ms());
    if let Some((pid, epoch, seq)) = pid {
        b = b.producer(pid, epoch, seq).transactional(true, false);
    }
    for v in values {
        b = b.record(now_ms(), None, Some(v.as_bytes()), &[]);
    }
    b.build()
}

/// Produces `records` (v9) with `transactional_id`; returns (error code, base offset).
fn produce(
    c: &mut KafkaConn,
    transactional_id: Option<&str>,
    records: Vec<u8>,
) -> Result<(i16, i64)> {
    let req = ProduceRequest::default()
        .with_transactional_id(transactional_id.map(|t| TransactionalId(sb(t))))
        .with_acks(-1)
        .with_timeout_ms(10_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(sb(TOPIC)))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(0)
                .with_records(Some(Bytes::from(records)))])]);
    let r: ProduceResponse = c.call(ApiKey::Produce, 9, &req)?;
    let p = &r.responses[0].partition_responses[0];
    Ok((p.error_code, p.base_offset))
}

/// WriteTxnMarkers v1 for one producer on `partitions` of `topic`; the error codes in order.
fn write_marker(
    c: &mut KafkaConn,
    pid: i64,
    epoch: i16,
    commit: bool,
    coordinator_epoch: i32,
    topic: &str,
    partitions: Vec<i32>,
) -> Result<Vec<i16>> {
    let req = WriteTxnMarkersRequest::default().with_markers(vec![WritableTxnMarker::default()
        .with_producer_id(ProducerId(pid))
        .with_producer_epoch(epoch)
        .with_transaction_result(commit)
        .with_coordinator_epoch(coordinator_epoch)
        .with_topics(vec![WritableTxnMarkerTopic::default()
            .with_name(TopicName(sb(topic)))
            .with_partition_indexes(partitions)])]);
    let r: WriteTxnMarkersResponse = c.call(ApiKey::WriteTxnMarkers, 1, &req)?;
    ensure!(
        r.markers.len() == 1 && r.markers[0].producer_id.0 == pid,
        "{r:?}"
    );
    Ok(r.markers[0].topics[0]
        .partitions
        .iter()
        .map(|p| p.error_code)
        .collect())
}

/// One batch of a fetch.
#[derive(Debug, Clone)]
struct FetchedBatch {
    base_offset: i64,
    last_offset: i64,
    producer_id: i64,
    transactional: bool,
    /// For a control batch: its marker, "<COMMIT>" or "<ABORT>".
    control: Option<String>,
    values: Vec<String>,
}

/// What a Fetch (v12) of partition 0 from `offset` returns.
#[derive(Debug)]
struct Fetched {
    high_watermark: i64,
    last_stable_offset: i64,
    /// (producer id, first offset), `None` when the field is null.
    aborted: Option<Vec<(i64, i64)>>,
    batches: Vec<FetchedBatch>,
}

impl Fetched {
    /// Every offset returned, data and markers.
    fn offsets(&self) -> Vec<i64> {
        self.batches
            .iter()
            .flat_map(|b| b.base_offset..=b.last_offset)
            .collect()
    }

    /// What a read_committed consumer delivers (Kafka's `CompletedFetch` logic): the aborted
    /// transactions are consumed up to each batch's last offset; a transactional batch of a
    /// producer with an aborted transaction in progress is skipped, and that producer's ABORT
    /// marker ends it; markers are never delivered.
    fn committed_values(&self) -> Vec<String> {
        let mut pending = self.aborted.clone().unwrap_or_default();
        pending.sort_by_key(|(_, first)| *first);
        let mut next = 0;
        let mut aborting = std::collections::HashSet::new();
        let mut out = Vec::new();
        for b in &self.batches {
            while next < pending.len() && pending[next].1 <= b.last_offset {
                aborting.insert(pending[next].0);
                next += 1;
            }
            match &b.control {
                Some(m) => {
                    if m == "<ABORT>" {
                        aborting.remove(&b.producer_id);
                    }
                }
                None if b.transactional && aborting.contains(&b.producer_id) => {}
                None => out.extend(b.values.iter().cloned()),
            }
        }
        out
    }
}

fn fetch_request(isolation: i8, offset: i64, max_wait_ms: i32) -> FetchRequest {
    FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(max_wait_ms)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_isolation_level(isolation)
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(sb(TOPIC)))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(0)
                .with_fetch_offset(offset)
                .with_partition_max_bytes(1 << 20)])])
}

fn parse_fetch(r: &FetchResponse) -> Result<Fetched> {
    let p = &r.responses[0].partitions[0];
    ensure!(p.error_code == 0, "fetch error {}", p.error_code);
    let mut batches = Vec::new();
    if let Some(raw) = &p.records {
        for item in Batches::new(raw) {
            let (pos, h) = item?;
            let recs = decode_records(&raw[pos..pos + h.total_size()])?;
            let control =
                h.is_control()
                    .then(|| match recs.first().and_then(|r| r.key.as_deref()) {
                        Some([0, 0, 0, 1]) => "<COMMIT>".to_string(),
                        Some([0, 0, 0, 0]) => "<ABORT>".to_string(),
                        other => format!("<control {other:?}>"),
                    });
            batches.push(FetchedBatch {
                base_offset: h.base_offset,
                last_offset: h.last_offset(),
                producer_id: h.producer_id,
                transactional: h.is_transactional(),
                control,
                values: recs
                    .iter()
                    .map(|r| {
                        String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned()
                    })
                    .collect(),
            });
        }
    }
    Ok(Fetched {
        high_watermark: p.high_watermark,
        last_stable_offset: p.last_stable_offset,
        aborted: p.aborted_transactions.as_ref().map(|a| {
            a.iter()
                .map(|t| (t.producer_id.0, t.first_offset))
                .collect()
        }),
        batches,
    })
}

fn fetch(c: &mut KafkaConn, isolation: i8, offset: i64) -> Result<Fetched> {
    let r: FetchResponse = c.call(ApiKey::Fetch, 12, &fetch_request(isolation, offset, 0))?;
    parse_fetch(&r)
}

fn list_latest(c: &mut KafkaConn, isolation: i8) -> Result<i64> {
    let r: ListOffsetsResponse = c.call(
        ApiKey::ListOffsets,
        7,
        &ListOffsetsRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_isolation_level(isolation)
            .with_topics(vec![ListOffsetsTopic::default()
                .with_name(TopicName(sb(TOPIC)))
                .with_partitions(vec![ListOffsetsPartition::default()
                    .with_partition_index(0)
                    .with_timestamp(-1)])]),
    )?;
    let p = &r.topics[0].partitions[0];
    ensure!(p.error_code == 0, "ListOffsets {}", p.error_code);
    Ok(p.offset)
}

/// (producer id, epoch, current transaction start offset) from DescribeProducers.
fn describe_producers(c: &mut KafkaConn) -> Result<Vec<(i64, i32, i64)>> {
    let r: DescribeProducersResponse = c.call(
        ApiKey::DescribeProducers,
        0,
        &DescribeProducersRequest::default().with_topics(vec![TopicRequest::default()
            .with_name(TopicName(sb(TOPIC)))
            .with_partition_indexes(vec![0])]),
    )?;
    let p = &r.topics[0].partitions[0];
    ensure!(p.error_code == 0, "DescribeProducers {}", p.error_code);
    Ok(p.active_producers
        .iter()
        .map(|s| {
            (
                s.producer_id.0,
                s.producer_epoch,
                s.current_txn_start_offset,
            )
        })
        .collect())
}

#[test]
fn markers_lso_read_committed_and_recovery() -> Result<()> {
    let mut g = Gregor::start(BIN, &["transaction.partition.verification.enable=false"])?;
    let bs = g.bootstrap();
    let mut c = KafkaConn::connect(&bs, "txn-partition-test")?;
    create_topic(&mut c, TOPIC)?;
    let pid = init_producer_id(&mut c)?;
    let txid = Some("tx-1");

    // Transaction 1 (aborted): offsets 0-2; a plain record at 3; the ABORT marker at 4.
    ensure!(produce(&mut c, txid, batch(Some((pid, 0, 0)), &["a0", "a1", "a2"]))? == (0, 0));
    ensure!(produce(&mut c, None, batch(None, &["plain-3"]))? == (0, 3));
    ensure!(write_marker(&mut c, pid, 0, false, 0, TOPIC, vec![0])? == vec![0]);
    // Transaction 2 (committed): 5-6, COMMIT at 7.
    ensure!(produce(&mut c, txid, batch(Some((pid, 0, 3)), &["c5", "c6"]))? == (0, 5));
    ensure!(write_marker(&mut c, pid, 0, true, 0, TOPIC, vec![0])? == vec![0]);
    // Transaction 3 stays open: 8; a plain record at 9.
    ensure!(produce(&mut c, txid, batch(Some((pid, 0, 5)), &["open8"]))? == (0, 8));
    ensure!(produce(&mut c, None, batch(None, &["plain-9"]))? == (0, 9));

    // Errors as Kafka's: a marker of an older coordinator epoch is fenced (52), an unknown
    // partition is 3, transactional batches without a transactional id are 53, a client's
    // control batch is 87, a non-transactional write of the producer inside its transaction
    // is INVALID_TXN_STATE (48).
    ensure!(write_marker(&mut c, pid, 0, true, -1, TOPIC, vec![0])? == vec![52]);
    ensure!(write_marker(&mut c, pid, 0, true, 0, "nope", vec![0])? == vec![3]);
    ensure!(produce(&mut c, None, batch(Some((pid, 0, 6)), &["x"]))?.0 == 53);
    let forged = gregor_protocol::control::end_txn_marker_batch(
        pid,
        0,
        gregor_protocol::control::EndTxnMarker {
            result: gregor_protocol::control::TransactionResult::Commit,
            coordinator_epoch: 0,
        },
        now_ms(),
    );
    ensure!(produce(&mut c, txid, forged)?.0 == 87);
    let mut idem = BatchBuilder::new(0, now_ms()).producer(pid, 0, 6);
    idem = idem.record(now_ms(), None, Some(b"idem"), &[]);
    ensure!(produce(&mut c, txid, idem.build())?.0 == 48);

    let check = |c: &mut KafkaConn, when: &str| -> Result<()> {
        // read_committed: up to the LSO (8), with the aborted transaction.
        let rc = fetch(c, 1, 0)?;
        ensure!(
            (rc.high_watermark, rc.last_stable_offset) == (10, 8),
            "{when}: {rc:?}"
        );
        ensure!(rc.aborted == Some(vec![(pid, 0)]), "{when}: {rc:?}");
        ensure!(rc.offsets() == (0..8).collect::<Vec<_>>(), "{when}: {rc:?}");
        let markers: Vec<_> = rc
            .batches
            .iter()
            .filter_map(|b| b.control.clone())
            .collect();
        ensure!(markers == ["<ABORT>", "<COMMIT>"], "{when}: {markers:?}");
        let delivered = rc.committed_values();
        ensure!(
            delivered == ["plain-3", "c5", "c6"],
            "{when}: read_committed delivers {delivered:?}"
        );
        // read_uncommitted: everything to the high watermark, no aborted list (null).
        let ru = fetch(c, 0, 0)?;
        ensure!(
            (ru.high_watermark, ru.last_stable_offset, ru.aborted.clone()) == (10, 8, None),
            "{when}: {ru:?}"
        );
        ensure!(
            ru.offsets() == (0..10).collect::<Vec<_>>(),
            "{when}: {ru:?}"
        );
        // read_committed from the LSO: nothing yet.
        let at_lso = fetch(c, 1, 8)?;
        ensure!(at_lso.batches.is_empty(), "{when}: {at_lso:?}");
        ensure!(
            list_latest(c, 1)? == 8 && list_latest(c, 0)? == 10,
            "{when}"
        );
        let producers = describe_producers(c)?;
        ensure!(producers == vec![(pid, 0, 8)], "{when}: {producers:?}");
        Ok(())
    };
    check(&mut c, "before the crash")?;

    // The transaction index holds the aborted transaction in Kafka's format.
    let index = g
        .data_dir()
        .join(format!("{TOPIC}-0"))
        .join("00000000000000000000.txnindex");
    let raw = std::fs::read(&index).with_context(|| format!("{}", index.display()))?;
    let mut expected = vec![0u8, 0];
    for v in [pid, 0, 4, 5] {
        expected.extend_from_slice(&v.to_be_bytes());
    }
    ensure!(raw == expected, "txnindex {raw:?}");

    // kill -9 with transaction 3 open: the LSO and the aborted list survive recovery.
    g.kill9()?;
    g.restart()?;
    let mut c = KafkaConn::connect(&bs, "txn-partition-test")?;
    check(&mut c, "after kill -9")?;

    // A read_committed long poll at the LSO wakes when the marker moves the LSO.
    let mut poller = KafkaConn::connect(&bs, "txn-poller")?;
    let started = Instant::now();
    let correlation_id = poller.send(ApiKey::Fetch, 12, &fetch_request(1, 8, 20_000))?;
    // The marker goes in on another connection while the poll waits (whichever comes first,
    // the poll must answer with the marker's effect well before its 20 s).
    ensure!(write_marker(&mut c, pid, 0, false, 0, TOPIC, vec![0])? == vec![0]);
    let mut body = poller.expect_response(ApiKey::Fetch, 12, correlation_id)?;
    let r = <FetchResponse as kafka_protocol::protocol::Decodable>::decode(&mut body, 12)?;
    ensure!(
        started.elapsed() < Duration::from_secs(10),
        "the long poll was not woken by the LSO move"
    );
    let woken = parse_fetch(&r)?;
    ensure!(woken.last_stable_offset == 11, "{woken:?}");
    ensure!(woken.aborted == Some(vec![(pid, 8)]), "{woken:?}");
    ensure!(woken.offsets().first() == Some(&8), "{woken:?}");
    ensure!(woken.committed_values() == ["plain-9"], "{woken:?}");
    let all = fetch(&mut c, 1, 0)?;
    ensure!(all.aborted == Some(vec![(pid, 0), (pid, 8)]), "{all:?}");
    ensure!(list_latest(&mut c, 1)? == 11);
    ensure!(describe_producers(&mut c)? == vec![(pid, 0, -1)]);

    // Kafka's own tool reads the index gregor wrote.
    if gregor_tests::reference::jars_or_skip() {
        let out = gregor_tests::reference::tool_output(
            "kafka-dump-log",
            &["--files", &index.display().to_string()],
        )?;
        let line = format!("producerId: {pid} firstOffset: 0 lastOffset: 4 lastStableOffset: 5");
        ensure!(out.contains(&line), "kafka-dump-log: {out}");
        let second =
            format!("producerId: {pid} firstOffset: 8 lastOffset: 10 lastStableOffset: 11");
        ensure!(out.contains(&second), "kafka-dump-log: {out}");
        let log = g
            .data_dir()
            .join(format!("{TOPIC}-0"))
            .join("00000000000000000000.log");
        let out = gregor_tests::reference::tool_output(
            "kafka-dump-log",
            &["--files", &log.display().to_string(), "--deep-iteration"],
        )?;
        ensure!(
            out.contains("endTxnMarker: ABORT coordinatorEpoch: 0")
                && out.contains("endTxnMarker: COMMIT coordinatorEpoch: 0"),
            "kafka-dump-log: {out}"
        );
    }
    Ok(())
}

/// With KIP-890 verification on (the default) and no transaction coordinator (no
/// `__transaction_state` yet: no client asked FindCoordinator for a transactional id), a
/// producer's first transactional write gets Kafka's answer for a coordinator it cannot reach:
/// NOT_ENOUGH_REPLICAS (19, retriable), and nothing is written.
#[test]
fn verification_without_a_coordinator_is_retriable() -> Result<()> {
    let g = Gregor::start(BIN, &[])?;
    let mut c = KafkaConn::connect(g.bootstrap(), "txn-verify-test")?;
    create_topic(&mut c, TOPIC)?;
    let pid = init_producer_id(&mut c)?;
    let (code, _) = produce(&mut c, Some("tx-v"), batch(Some((pid, 0, 0)), &["v"]))?;
    ensure!(code == 19, "got {code}");
    let f = fetch(&mut c, 0, 0)?;
    ensure!(f.batches.is_empty() && f.high_watermark == 0, "{f:?}");
    // Non-transactional batches in a request with a transactional id need no verification.
    ensure!(produce(&mut c, Some("tx-v"), batch(None, &["plain"]))? == (0, 0));
    if f.last_stable_offset != 0 {
        bail!("{f:?}");
    }
    Ok(())
}

/// (leader, ISR sorted) of partition 0 of [`TOPIC`] as `bootstrap` sees it.
fn partition_state(bootstrap: &str) -> Option<(i32, Vec<i32>)> {
    let req = MetadataRequest::default()
        .with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(TopicName(sb(TOPIC))))
        ]))
        .with_allow_auto_topic_creation(false);
    let m: MetadataResponse = KafkaConn::connect(bootstrap, "txn-rf3-test")
        .ok()?
        .call(ApiKey::Metadata, 12, &req)
        .ok()?;
    let p = m.topics.first()?.partitions.first()?;
    let mut isr: Vec<i32> = p.isr_nodes.iter().map(|b| b.0).collect();
    isr.sort_unstable();
    (p.error_code == 0 && p.leader_id.0 >= 0).then_some((p.leader_id.0, isr))
}

/// Replication factor 3 (issue 12 must hold on a replicated cluster): the followers build the
/// same producer state and `.txnindex` from the replicated batches and markers, so after a
/// kill -9 of the leader in the middle of an open transaction, the new leader answers
/// read_committed fetches with the same LSO and aborted transactions, and ends the open
/// transaction with the coordinator's next marker.
#[test]
fn a_new_leader_keeps_the_lso_and_aborted_transactions() -> Result<()> {
    let config = ClusterConfig::new(
        Implementation::Gregor(BIN.into()),
        Layout::Split {
            controllers: 1,
            brokers: 3,
        },
    )
    .with("transaction.partition.verification.enable", "false")
    .with("broker.heartbeat.interval.ms", "500")
    .with("broker.session.timeout.ms", "4000")
    .with("replica.fetch.backoff.ms", "200");
    let mut cluster = Cluster::start(&config)?;
    let brokers = cluster.broker_ids();
    let b0 = cluster.node(brokers[0]).bootstrap().context("listener")?;
    let mut c = KafkaConn::connect(&b0, "txn-rf3-test")?;
    let r: CreateTopicsResponse = c.call(
        ApiKey::CreateTopics,
        7,
        &CreateTopicsRequest::default()
            .with_timeout_ms(30_000)
            .with_topics(vec![CreatableTopic::default()
                .with_name(TopicName(sb(TOPIC)))
                .with_num_partitions(1)
                .with_replication_factor(3)
                .with_configs(vec![CreatableTopicConfig::default()
                    .with_name(sb("min.insync.replicas"))
                    .with_value(Some(sb("2")))])]),
    )?;
    ensure!(r.topics[0].error_code == 0, "{r:?}");
    let mut all = brokers.clone();
    all.sort_unstable();
    let (leader, _) = cluster.wait_for(Duration::from_secs(30), "an ISR of three", || {
        partition_state(&b0).filter(|(_, isr)| *isr == all)
    });
    let lb = cluster
        .node(leader)
        .bootstrap()
        .context("leader listener")?;
    cluster.wait_for(Duration::from_secs(30), "the leader's own view", || {
        partition_state(&lb).filter(|(l, isr)| *l == leader && *isr == all)
    });
    let mut c = KafkaConn::connect(&lb, "txn-rf3-test")?;
    let pid = init_producer_id(&mut c)?;
    let txid = Some("tx-rf3");
    // acks=all: each answer means every in-sync replica has the batch or marker.
    ensure!(produce(&mut c, txid, batch(Some((pid, 0, 0)), &["a0", "a1", "a2"]))? == (0, 0));
    ensure!(produce(&mut c, None, batch(None, &["plain-3"]))? == (0, 3));
    ensure!(write_marker(&mut c, pid, 0, false, 0, TOPIC, vec![0])? == vec![0]);
    ensure!(produce(&mut c, txid, batch(Some((pid, 0, 3)), &["open5"]))? == (0, 5));
    let before = fetch(&mut c, 1, 0)?;
    ensure!(
        (before.high_watermark, before.last_stable_offset) == (6, 5),
        "{before:?}"
    );

    cluster.node_mut(leader).kill9()?;
    let survivor = all
        .iter()
        .copied()
        .find(|b| *b != leader)
        .context("a survivor")?;
    let sb0 = cluster.node(survivor).bootstrap().context("listener")?;
    let (new_leader, _) = cluster.wait_for(Duration::from_secs(60), "a new leader", || {
        partition_state(&sb0).filter(|(l, _)| *l != leader)
    });
    let nb = cluster
        .node(new_leader)
        .bootstrap()
        .context("new leader listener")?;
    let after = cluster.wait_for(
        Duration::from_secs(60),
        "the new leader's high watermark",
        || {
            let mut c = KafkaConn::connect(&nb, "txn-rf3-test").ok()?;
            fetch(&mut c, 1, 0).ok().filter(|f| f.high_watermark == 6)
        },
    );
    ensure!(after.last_stable_offset == 5, "{after:?}");
    ensure!(after.aborted == Some(vec![(pid, 0)]), "{after:?}");
    ensure!(after.committed_values() == ["plain-3"], "{after:?}");
    let mut c = KafkaConn::connect(&nb, "txn-rf3-test")?;
    ensure!(describe_producers(&mut c)? == vec![(pid, 0, 5)]);
    // The coordinator ends the open transaction on the new leader (acks=all with the two
    // replicas left, min.insync.replicas 2).
    ensure!(write_marker(&mut c, pid, 0, false, 0, TOPIC, vec![0])? == vec![0]);
    let ended = fetch(&mut c, 1, 0)?;
    ensure!(
        (ended.high_watermark, ended.last_stable_offset) == (7, 7),
        "{ended:?}"
    );
    ensure!(ended.aborted == Some(vec![(pid, 0), (pid, 5)]), "{ended:?}");
    ensure!(ended.committed_values() == ["plain-3"], "{ended:?}");
    Ok(())
}

/// A keyed batch (compacted topics need keys); transactional when `pid` is given.
fn keyed_batch(pid: Option<(i64, i16, i32)>, records: &[(&str, &str)]) -> Vec<u8> {
    let mut b = BatchBuilder::new(0, now_ms());
    if let Some((pid, epoch, seq)) = pid {
        b = b.producer(pid, epoch, seq).transactional(true, false);
    }
    for (k, v) in records {
        b = b.record(now_ms(), Some(k.as_bytes()), Some(v.as_bytes()), &[]);
    }
    b.build()
}

/// The latest value of each key a read_committed consumer delivers, or a read_uncommitted
/// one (all data records), from offset 0 to the end.
fn latest_per_key(c: &mut KafkaConn, isolation: i8) -> Result<Vec<String>> {
    let f = fetch(c, isolation, 0)?;
    let values = if isolation == 1 {
        f.committed_values()
    } else {
        f.batches
            .iter()
            .filter(|b| b.control.is_none())
            .flat_map(|b| b.values.iter().cloned())
            .collect()
    };
    let mut latest = std::collections::BTreeMap::new();
    for v in values {
        // Values are "<key>=<value>" so that the key is visible here.
        let key = v.split('=').next().unwrap_or_default().to_string();
        latest.insert(key, v);
    }
    Ok(latest.into_values().collect())
}

/// The log cleaner and transactions on a compacted topic, as Kafka's: an aborted
/// transaction's records go first (its ABORT marker stays), then, after `delete.retention.ms`,
/// the marker whose transaction has nothing left; the committed transaction's marker stays
/// while its record does; an aborted batch holding its producer's last sequence is kept empty,
/// and its marker and `.txnindex` entry with it. read_committed consumers read the same values
/// before and after; read_uncommitted ones stop seeing the aborted values. Kafka's
/// `kafka-dump-log` reads the cleaned segment and its transaction index.
#[test]
fn the_cleaner_removes_aborted_transactions_then_their_markers() -> Result<()> {
    let g = Gregor::start(
        BIN,
        &[
            "transaction.partition.verification.enable=false",
            "log.cleaner.backoff.ms=50",
        ],
    )?;
    let bs = g.bootstrap();
    let mut c = KafkaConn::connect(&bs, "txn-cleaner-test")?;
    let configs = [
        ("cleanup.policy", "compact"),
        ("segment.ms", "100"),
        ("min.cleanable.dirty.ratio", "0.01"),
        ("delete.retention.ms", "5000"),
    ];
    let r: CreateTopicsResponse = c.call(
        ApiKey::CreateTopics,
        7,
        &CreateTopicsRequest::default()
            .with_timeout_ms(10_000)
            .with_topics(vec![CreatableTopic::default()
                .with_name(TopicName(sb(TOPIC)))
                .with_num_partitions(1)
                .with_replication_factor(1)
                .with_configs(
                    configs
                        .iter()
                        .map(|(k, v)| {
                            CreatableTopicConfig::default()
                                .with_name(sb(k))
                                .with_value(Some(sb(v)))
                        })
                        .collect(),
                )]),
    )?;
    ensure!(r.topics[0].error_code == 0, "create: {r:?}");
    let pid = init_producer_id(&mut c)?;
    let txid = Some("tx-clean");
    // Aborted: 0-1, ABORT at 2; a plain k1 at 3; committed k3 at 4, COMMIT at 5.
    let aborted = keyed_batch(
        Some((pid, 0, 0)),
        &[("k1", "k1=aborted"), ("k2", "k2=aborted")],
    );
    ensure!(produce(&mut c, txid, aborted)? == (0, 0));
    ensure!(write_marker(&mut c, pid, 0, false, 0, TOPIC, vec![0])? == vec![0]);
    ensure!(produce(&mut c, None, keyed_batch(None, &[("k1", "k1=plain")]))? == (0, 3));
    let committed = keyed_batch(Some((pid, 0, 2)), &[("k3", "k3=committed")]);
    ensure!(produce(&mut c, txid, committed)? == (0, 4));
    ensure!(write_marker(&mut c, pid, 0, true, 0, TOPIC, vec![0])? == vec![0]);
    // Another producer's aborted transaction at 6, ABORT at 7: its batch holds the producer's
    // last sequence, so the cleaner keeps it empty, and the marker and its index entry with it.
    let pid2 = init_producer_id(&mut c)?;
    let last = keyed_batch(Some((pid2, 0, 0)), &[("k4", "k4=aborted")]);
    ensure!(produce(&mut c, Some("tx-clean-2"), last)? == (0, 6));
    ensure!(write_marker(&mut c, pid2, 0, false, 0, TOPIC, vec![0])? == vec![0]);
    let committed_view = latest_per_key(&mut c, 1)?;
    ensure!(
        committed_view == ["k1=plain", "k3=committed"],
        "{committed_view:?}"
    );
    ensure!(latest_per_key(&mut c, 0)? == ["k1=plain", "k2=aborted", "k3=committed", "k4=aborted"]);

    let markers = |c: &mut KafkaConn| -> Result<Vec<String>> {
        Ok(fetch(c, 0, 0)?
            .batches
            .into_iter()
            .filter_map(|b| b.control)
            .collect())
    };
    // Fillers (each in its own segment once segment.ms passes) make the log dirty, so the
    // cleaner runs; `until` is checked after each.
    let mut filler = 0;
    let mut fill_until = |c: &mut KafkaConn,
                          what: &str,
                          until: &mut dyn FnMut(&mut KafkaConn) -> Result<bool>|
     -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let key = format!("f{filler}");
            filler += 1;
            let value = format!("{key}=x");
            ensure!(produce(c, None, keyed_batch(None, &[(&key, &value)]))?.0 == 0);
            if until(c)? {
                return Ok(());
            }
            ensure!(
                Instant::now() < deadline,
                "the cleaner did not {what} within 60 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let fillers =
        |v: Vec<String>| -> Vec<String> { v.into_iter().filter(|v| !v.starts_with('f')).collect() };

    // Pass 1: the aborted records go, both markers stay (the ABORT marker at least until
    // delete.retention.ms after a later pass found its transaction empty). Its index entry
    // stays while the pass that removed its records is the last one; the next pass (the
    // fillers keep the log dirty, so it may already have run) drops it with nothing left to
    // skip.
    fill_until(&mut c, "remove the aborted records", &mut |c| {
        Ok(fetch(c, 0, 0)?.batches.first().map(|b| b.base_offset) != Some(0))
    })?;
    ensure!(fillers(latest_per_key(&mut c, 0)?) == committed_view);
    ensure!(fillers(latest_per_key(&mut c, 1)?) == committed_view);
    ensure!(markers(&mut c)? == ["<ABORT>", "<COMMIT>", "<ABORT>"]);
    let listed = fetch(&mut c, 1, 0)?.aborted.unwrap_or_default();
    ensure!(
        listed == [(pid2, 6)] || listed == [(pid, 0), (pid2, 6)],
        "aborted transactions after the first pass: {listed:?}"
    );
    let dir = g.data_dir().join(format!("{TOPIC}-0"));
    let first_segment = dir.join("00000000000000000000.log");
    let dump = |path: &std::path::Path| -> Result<String> {
        gregor_tests::reference::tool_output(
            "kafka-dump-log",
            &[
                "--files",
                &path.display().to_string(),
                "--deep-iteration",
                "--print-data-log",
            ],
        )
    };
    let jars = gregor_tests::reference::jars_or_skip();
    if jars {
        let out = dump(&first_segment)?;
        ensure!(
            out.contains("endTxnMarker: ABORT coordinatorEpoch: 0")
                && out.contains("endTxnMarker: COMMIT coordinatorEpoch: 0")
                && out.contains("payload: k3=committed")
                && !out.contains("aborted"),
            "kafka-dump-log after the first pass: {out}"
        );
        let empty = format!("baseOffset: 6 lastOffset: 6 count: 0 baseSequence: 0 lastSequence: 0 producerId: {pid2}");
        ensure!(
            out.contains(&empty),
            "the empty batch of producer {pid2}: {out}"
        );
        let out = dump(&dir.join("00000000000000000000.txnindex"))?;
        ensure!(
            out.contains(&format!("producerId: {pid2} firstOffset: 6 lastOffset: 7")),
            "kafka-dump-log of the cleaned .txnindex: {out}"
        );
    }

    // Later passes: the ABORT marker has no record left: it goes after delete.retention.ms;
    // the COMMIT marker's record is still there, so it stays.
    fill_until(&mut c, "remove the ABORT marker", &mut |c| {
        Ok(markers(c)? == ["<COMMIT>", "<ABORT>"])
    })?;
    ensure!(fillers(latest_per_key(&mut c, 1)?) == committed_view);
    ensure!(fillers(latest_per_key(&mut c, 0)?) == committed_view);
    ensure!(fetch(&mut c, 1, 0)?.aborted == Some(vec![(pid2, 6)]));
    if jars {
        let out = dump(&first_segment)?;
        ensure!(
            out.matches("endTxnMarker: ABORT").count() == 1
                && out.contains("endTxnMarker: COMMIT coordinatorEpoch: 0")
                && out.contains("payload: k3=committed"),
            "kafka-dump-log after the marker's removal: {out}"
        );
        let out = dump(&dir.join("00000000000000000000.txnindex"))?;
        ensure!(
            out.contains(&format!("producerId: {pid2} firstOffset: 6 lastOffset: 7"))
                && !out.contains(&format!("producerId: {pid} ")),
            "kafka-dump-log of the cleaned .txnindex: {out}"
        );
    }
    Ok(())
}

/// `kafka-transactions find-hanging` and `abort` (KIP-664) as an operator uses them: a
/// transaction open on a partition that no coordinator knows of (written here with
/// verification off, as a buggy pre-KIP-890 client could) holds the LSO back; the tool finds
/// it (DescribeProducers, then ListTransactions filtered by producer id), aborts it by its
/// start offset (DescribeProducers, then WriteTxnMarkers from Kafka's Admin client), and the
/// LSO moves; afterwards nothing hangs.
#[test]
fn kafka_transactions_finds_and_aborts_a_hanging_transaction() -> Result<()> {
    use gregor_tests::reference::{jars_or_skip, tool_output};
    if !jars_or_skip() {
        return Ok(());
    }
    let g = Gregor::start(BIN, &["transaction.partition.verification.enable=false"])?;
    let bs = g.bootstrap();
    let mut c = KafkaConn::connect(&bs, "txn-hanging-test")?;
    create_topic(&mut c, TOPIC)?;
    let pid = init_producer_id(&mut c)?;
    ensure!(
        produce(
            &mut c,
            Some("hung"),
            batch(Some((pid, 0, 0)), &["h0", "h1"])
        )? == (0, 0)
    );
    ensure!(produce(&mut c, None, batch(None, &["plain-2"]))? == (0, 2));
    ensure!(list_latest(&mut c, 1)? == 0 && list_latest(&mut c, 0)? == 3);

    let tool = "kafka-transactions";
    // Any transaction open longer than 0 minutes is a candidate; one the coordinator does not
    // list for its producer id is hanging.
    let find = || {
        tool_output(
            tool,
            &[
                "--bootstrap-server",
                &bs,
                "find-hanging",
                "--topic",
                TOPIC,
                "--max-transaction-timeout",
                "0",
            ],
        )
    };
    // The candidate must be older than 0 ms: wait until the clock has moved past the batch.
    let written_at = now_ms();
    while now_ms() <= written_at + 1 {
        std::thread::sleep(Duration::from_millis(2));
    }
    let found = find()?;
    let row = found
        .lines()
        .find(|l| l.split_whitespace().next() == Some(TOPIC))
        .with_context(|| format!("find-hanging found nothing: {found}"))?;
    let cols: Vec<&str> = row.split_whitespace().collect();
    // Topic Partition ProducerId ProducerEpoch CoordinatorEpoch StartOffset ...
    ensure!(
        cols.get(1..6) == Some(&["0", &pid.to_string(), "0", "-1", "0"][..]),
        "find-hanging: {found}"
    );

    // No open transaction starts at 1: the tool refuses.
    let refused = tool_output(
        tool,
        &[
            "--bootstrap-server",
            &bs,
            "abort",
            "--topic",
            TOPIC,
            "--partition",
            "0",
            "--start-offset",
            "1",
        ],
    )?;
    ensure!(
        refused.contains("Could not find any open transactions starting at offset 1"),
        "{refused}"
    );
    ensure!(list_latest(&mut c, 1)? == 0);

    let aborted = tool_output(
        tool,
        &[
            "--bootstrap-server",
            &bs,
            "abort",
            "--topic",
            TOPIC,
            "--partition",
            "0",
            "--start-offset",
            "0",
        ],
    )?;
    ensure!(
        !aborted.contains("Failed") && !aborted.contains("Exception"),
        "abort: {aborted}"
    );
    // The ABORT marker is at 3: the LSO is the high watermark again, read_committed skips the
    // aborted records.
    ensure!(list_latest(&mut c, 1)? == 4 && list_latest(&mut c, 0)? == 4);
    let rc = fetch(&mut c, 1, 0)?;
    ensure!(rc.aborted == Some(vec![(pid, 0)]), "{rc:?}");
    ensure!(rc.committed_values() == ["plain-2"], "{rc:?}");
    ensure!(describe_producers(&mut c)? == vec![(pid, 0, -1)]);
    let found = find()?;
    ensure!(
        !found
            .lines()
            .any(|l| l.split_whitespace().next() == Some(TOPIC)),
        "still hanging: {found}"
    );
    Ok(())
}

/// `producer.id.expiration.ms` checked every `producer.id.expiration.check.interval.ms`
/// (Kafka's `PeriodicProducerExpirationCheck`): an idle idempotent producer's state is
/// dropped (DescribeProducers stops listing it); a producer with an open transaction stays.
#[test]
fn idle_producers_expire_unless_their_transaction_is_open() -> Result<()> {
    let g = Gregor::start(
        BIN,
        &[
            "transaction.partition.verification.enable=false",
            "producer.id.expiration.ms=1000",
            "producer.id.expiration.check.interval.ms=100",
        ],
    )?;
    let mut c = KafkaConn::connect(g.bootstrap(), "txn-expiry-test")?;
    create_topic(&mut c, TOPIC)?;
    let idle = init_producer_id(&mut c)?;
    let open = init_producer_id(&mut c)?;
    let started = Instant::now();
    let idempotent = BatchBuilder::new(0, now_ms())
        .producer(idle, 0, 0)
        .record(now_ms(), None, Some(b"i"), &[])
        .build();
    ensure!(produce(&mut c, None, idempotent)? == (0, 0));
    ensure!(produce(&mut c, Some("tx-open"), batch(Some((open, 0, 0)), &["o"]))? == (0, 1));
    let mut both = vec![(idle, 0, -1), (open, 0, 1)];
    both.sort_unstable();
    let mut listed = describe_producers(&mut c)?;
    listed.sort_unstable();
    ensure!(
        listed == both || started.elapsed() >= Duration::from_millis(1000),
        "{listed:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let listed = describe_producers(&mut c)?;
        if listed == [(open, 0, 1)] {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the idle producer never expired: {listed:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    ensure!(
        started.elapsed() >= Duration::from_millis(1000),
        "expired before producer.id.expiration.ms"
    );
    Ok(())
}
