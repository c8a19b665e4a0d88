//! The transaction coordinator at the wire (issue 12): FindCoordinator for transactional ids,
//! InitProducerId with a transactional id (fencing, KIP-360), AddPartitionsToTxn (client
//! v0-3, and v4+ verify-only from brokers), AddOffsetsToTxn, TxnOffsetCommit (KIP-447
//! fencing, pending until the marker), EndTxn, DescribeTransactions and ListTransactions,
//! each API's errors, and the state surviving a restart.

use anyhow::{bail, ensure, Context, Result};
use gregor_tests::wire::{sb, KafkaConn};
use gregor_tests::Gregor;
use kafka_protocol::messages::add_partitions_to_txn_request::{
    AddPartitionsToTxnTopic, AddPartitionsToTxnTransaction,
};
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::txn_offset_commit_request::{
    TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic,
};
use kafka_protocol::messages::{
    AddOffsetsToTxnRequest, AddPartitionsToTxnRequest, ApiKey, ApiVersionsRequest,
    CreateTopicsRequest, DescribeTransactionsRequest, EndTxnRequest, FindCoordinatorRequest,
    GroupId, InitProducerIdRequest, ListTransactionsRequest, MetadataRequest, OffsetFetchRequest,
    ProducerId, RequestKind, ResponseKind, TopicName, TransactionalId, TxnOffsetCommitRequest,
};

const BIN: &str = env!("CARGO_BIN_EXE_gregor");

fn start() -> Result<Gregor> {
    Gregor::start(BIN, &[])
}

fn call(c: &mut KafkaConn, key: ApiKey, version: i16, req: RequestKind) -> Result<ResponseKind> {
    c.call_kind(key, version, &req)
}

fn create_topic(c: &mut KafkaConn, name: &str, partitions: i32) -> Result<()> {
    let req = CreateTopicsRequest::default()
        .with_timeout_ms(30_000)
        .with_topics(vec![CreatableTopic::default()
            .with_name(TopicName(sb(name)))
            .with_num_partitions(partitions)
            .with_replication_factor(1)]);
    let ResponseKind::CreateTopics(r) = call(c, ApiKey::CreateTopics, 7, req.into())? else {
        bail!("not CreateTopics")
    };
    ensure!(r.topics[0].error_code == 0, "{r:?}");
    Ok(())
}

fn find_txn_coordinator(c: &mut KafkaConn, id: &str) -> Result<(i16, i32)> {
    let req = FindCoordinatorRequest::default()
        .with_key_type(1)
        .with_coordinator_keys(vec![sb(id)]);
    let ResponseKind::FindCoordinator(r) = call(c, ApiKey::FindCoordinator, 4, req.into())? else {
        bail!("not FindCoordinator")
    };
    Ok((r.coordinators[0].error_code, r.coordinators[0].node_id.0))
}

fn init(
    c: &mut KafkaConn,
    id: &str,
    timeout_ms: i32,
    expected: Option<(i64, i16)>,
) -> Result<(i16, i64, i16)> {
    let (pid, epoch) = expected.unwrap_or((-1, -1));
    let req = InitProducerIdRequest::default()
        .with_transactional_id(Some(TransactionalId(sb(id))))
        .with_transaction_timeout_ms(timeout_ms)
        .with_producer_id(ProducerId(pid))
        .with_producer_epoch(epoch);
    // The coordinator may still be loading a new partition: retry that, as clients do.
    for _ in 0..100 {
        let ResponseKind::InitProducerId(r) =
            call(c, ApiKey::InitProducerId, 5, req.clone().into())?
        else {
            bail!("not InitProducerId")
        };
        if r.error_code != 14 {
            return Ok((r.error_code, r.producer_id.0, r.producer_epoch));
        }
        std::thread::yield_now();
    }
    bail!("the coordinator kept loading")
}

fn add_partitions_v3(
    c: &mut KafkaConn,
    version: i16,
    id: &str,
    pid: i64,
    epoch: i16,
    topics: &[(&str, Vec<i32>)],
) -> Result<Vec<(String, i32, i16)>> {
    let req = AddPartitionsToTxnRequest::default()
        .with_v3_and_below_transactional_id(TransactionalId(sb(id)))
        .with_v3_and_below_producer_id(ProducerId(pid))
        .with_v3_and_below_producer_epoch(epoch)
        .with_v3_and_below_topics(
            topics
                .iter()
                .map(|(t, ps)| {
                    AddPartitionsToTxnTopic::default()
                        .with_name(TopicName(sb(t)))
                        .with_partitions(ps.clone())
                })
                .collect(),
        );
    let ResponseKind::AddPartitionsToTxn(r) =
        call(c, ApiKey::AddPartitionsToTxn, version, req.into())?
    else {
        bail!("not AddPartitionsToTxn")
    };
    Ok(r.results_by_topic_v3_and_below
        .iter()
        .flat_map(|t| {
            t.results_by_partition.iter().map(move |p| {
                (
                    t.name.to_string(),
                    p.partition_index,
                    p.partition_error_code,
                )
            })
        })
        .collect())
}

fn describe(
    c: &mut KafkaConn,
    id: &str,
) -> Result<kafka_protocol::messages::describe_transactions_response::TransactionState> {
    let req = DescribeTransactionsRequest::default()
        .with_transactional_ids(vec![TransactionalId(sb(id))]);
    let ResponseKind::DescribeTransactions(r) =
        call(c, ApiKey::DescribeTransactions, 0, req.into())?
    else {
        bail!("not DescribeTransactions")
    };
    Ok(r.transaction_states[0].clone())
}

/// Polls DescribeTransactions until `id` is in `state` (the markers are written by the
/// coordinator's sender after EndTxn answers), for at most 30 s.
fn wait_for_state(c: &mut KafkaConn, id: &str, state: &str) -> Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let d = describe(c, id)?;
        if d.error_code == 0 && d.transaction_state.as_str() == state {
            return Ok(());
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "{id} never reached {state}: {d:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Transactions are on by default: the transaction APIs are advertised, and a transactional
/// id finds its coordinator and gets a producer id.
#[test]
fn transactions_are_on_by_default() -> Result<()> {
    let g = Gregor::start(BIN, &[])?;
    let mut c = KafkaConn::connect(g.bootstrap(), "txn-default")?;
    let ResponseKind::ApiVersions(v) = call(
        &mut c,
        ApiKey::ApiVersions,
        3,
        ApiVersionsRequest::default()
            .with_client_software_name(sb("t"))
            .with_client_software_version(sb("1"))
            .into(),
    )?
    else {
        bail!("not ApiVersions")
    };
    for key in [24, 25, 26, 27, 28, 61, 65, 66] {
        ensure!(
            v.api_keys.iter().any(|k| k.api_key == key),
            "API {key} not advertised: {v:?}"
        );
    }
    let (code, _) = find_txn_coordinator(&mut c, "tx")?;
    ensure!(code == 0, "FindCoordinator: {code}");
    let (code, pid, epoch) = init(&mut c, "tx", 60_000, None)?;
    ensure!(
        code == 0 && pid >= 0 && epoch == 0,
        "InitProducerId: {code}"
    );
    Ok(())
}

#[test]
fn coordinator_apis_and_their_errors() -> Result<()> {
    let mut g = start()?;
    let mut c = KafkaConn::connect(g.bootstrap(), "txn-wire")?;
    // Advertised with Kafka 4's ranges.
    let ResponseKind::ApiVersions(v) = call(
        &mut c,
        ApiKey::ApiVersions,
        3,
        ApiVersionsRequest::default()
            .with_client_software_name(sb("t"))
            .with_client_software_version(sb("1"))
            .into(),
    )?
    else {
        bail!("not ApiVersions")
    };
    let range = |key: i16| {
        v.api_keys
            .iter()
            .find(|k| k.api_key == key)
            .map(|k| (k.min_version, k.max_version))
    };
    ensure!(
        range(24) == Some((0, 5)),
        "AddPartitionsToTxn {:?}",
        range(24)
    );
    ensure!(range(25) == Some((0, 4)), "AddOffsetsToTxn {:?}", range(25));
    ensure!(range(26) == Some((0, 5)), "EndTxn {:?}", range(26));
    ensure!(range(28) == Some((0, 5)), "TxnOffsetCommit {:?}", range(28));
    ensure!(
        range(65) == Some((0, 0)),
        "DescribeTransactions {:?}",
        range(65)
    );
    ensure!(
        range(66).is_some_and(|(min, max)| min == 0 && max >= 1),
        "ListTransactions {:?}",
        range(66)
    );

    // FindCoordinator creates __transaction_state (50 partitions, compacted) and names this node.
    let (code, node) = find_txn_coordinator(&mut c, "app-1")?;
    ensure!(code == 0 && node == 1, "FindCoordinator: {code} {node}");
    let ResponseKind::Metadata(m) = call(
        &mut c,
        ApiKey::Metadata,
        12,
        MetadataRequest::default()
            .with_topics(Some(vec![
                kafka_protocol::messages::metadata_request::MetadataRequestTopic::default()
                    .with_name(Some(TopicName(sb("__transaction_state")))),
            ]))
            .into(),
    )?
    else {
        bail!("not Metadata")
    };
    ensure!(
        m.topics[0].error_code == 0 && m.topics[0].partitions.len() == 50,
        "{:?}",
        m.topics[0]
    );
    ensure!(m.topics[0].is_internal, "__transaction_state is internal");

    create_topic(&mut c, "t", 3)?;
    // InitProducerId: errors first.
    let (code, _, _) = init(&mut c, "app-1", 900_001, None)?;
    ensure!(code == 50, "INVALID_TRANSACTION_TIMEOUT: {code}");
    let (code, pid, epoch) = init(&mut c, "app-1", 60_000, None)?;
    ensure!(code == 0 && pid >= 0 && epoch == 0, "{code} {pid} {epoch}");
    let (code, pid2, epoch2) = init(&mut c, "app-1", 60_000, None)?;
    ensure!(
        code == 0 && pid2 == pid && epoch2 == 1,
        "second init: {code} {pid2} {epoch2}"
    );
    // KIP-360: a recovering producer with a fenced epoch.
    let (code, _, _) = init(&mut c, "app-1", 60_000, Some((pid, 0)))?;
    ensure!(code == 90, "PRODUCER_FENCED: {code}");

    // AddPartitionsToTxn v3: an unknown topic fails the whole request.
    let r = add_partitions_v3(
        &mut c,
        3,
        "app-1",
        pid,
        1,
        &[("t", vec![0]), ("nope", vec![0])],
    )?;
    ensure!(
        r.contains(&("nope".into(), 0, 3)) && r.contains(&("t".into(), 0, 55)),
        "{r:?}"
    );
    // Fenced epoch: PRODUCER_FENCED from v2, INVALID_PRODUCER_EPOCH before.
    let r = add_partitions_v3(&mut c, 3, "app-1", pid, 0, &[("t", vec![0])])?;
    ensure!(r == vec![("t".into(), 0, 90)], "{r:?}");
    let r = add_partitions_v3(&mut c, 1, "app-1", pid, 0, &[("t", vec![0])])?;
    ensure!(r == vec![("t".into(), 0, 47)], "{r:?}");
    let r = add_partitions_v3(&mut c, 3, "app-1", pid + 1000, 1, &[("t", vec![0])])?;
    ensure!(
        r == vec![("t".into(), 0, 49)],
        "INVALID_PRODUCER_ID_MAPPING: {r:?}"
    );
    let r = add_partitions_v3(&mut c, 3, "app-1", pid, 1, &[("t", vec![0, 1])])?;
    ensure!(r.iter().all(|(_, _, e)| *e == 0), "{r:?}");

    // Verify-only from a partition leader (v4+, KIP-890 part 1).
    let req = AddPartitionsToTxnRequest::default().with_transactions(vec![
        AddPartitionsToTxnTransaction::default()
            .with_transactional_id(TransactionalId(sb("app-1")))
            .with_producer_id(ProducerId(pid))
            .with_producer_epoch(1)
            .with_verify_only(true)
            .with_topics(vec![AddPartitionsToTxnTopic::default()
                .with_name(TopicName(sb("t")))
                .with_partitions(vec![1, 2])]),
    ]);
    let ResponseKind::AddPartitionsToTxn(r) =
        call(&mut c, ApiKey::AddPartitionsToTxn, 5, req.into())?
    else {
        bail!("not AddPartitionsToTxn")
    };
    let results = &r.results_by_transaction[0].topic_results[0].results_by_partition;
    let code_of = |p: i32| {
        results
            .iter()
            .find(|x| x.partition_index == p)
            .map(|x| x.partition_error_code)
    };
    ensure!(code_of(1) == Some(0) && code_of(2) == Some(120), "{r:?}");

    // AddOffsetsToTxn, then TxnOffsetCommit to the group coordinator (found first, as clients
    // do): pending until the marker (KIP-447 require_stable).
    let ResponseKind::FindCoordinator(fc) = call(
        &mut c,
        ApiKey::FindCoordinator,
        4,
        FindCoordinatorRequest::default()
            .with_key_type(0)
            .with_coordinator_keys(vec![sb("g")])
            .into(),
    )?
    else {
        bail!("not FindCoordinator")
    };
    ensure!(fc.coordinators[0].error_code == 0, "{fc:?}");
    let ResponseKind::AddOffsetsToTxn(r) = call(
        &mut c,
        ApiKey::AddOffsetsToTxn,
        3,
        AddOffsetsToTxnRequest::default()
            .with_transactional_id(TransactionalId(sb("app-1")))
            .with_producer_id(ProducerId(pid))
            .with_producer_epoch(1)
            .with_group_id(GroupId(sb("g")))
            .into(),
    )?
    else {
        bail!("not AddOffsetsToTxn")
    };
    ensure!(r.error_code == 0, "AddOffsetsToTxn: {}", r.error_code);
    let commit = |generation: i32, member: &str| {
        TxnOffsetCommitRequest::default()
            .with_transactional_id(TransactionalId(sb("app-1")))
            .with_group_id(GroupId(sb("g")))
            .with_producer_id(ProducerId(pid))
            .with_producer_epoch(1)
            .with_generation_id(generation)
            .with_member_id(sb(member))
            .with_topics(vec![TxnOffsetCommitRequestTopic::default()
                .with_name(TopicName(sb("t")))
                .with_partitions(vec![TxnOffsetCommitRequestPartition::default()
                    .with_partition_index(0)
                    .with_committed_offset(42)
                    .with_committed_leader_epoch(-1)])])
    };
    // A zombie with group metadata of a group that does not exist (KIP-447).
    let ResponseKind::TxnOffsetCommit(r) =
        call(&mut c, ApiKey::TxnOffsetCommit, 3, commit(5, "m").into())?
    else {
        bail!("not TxnOffsetCommit")
    };
    ensure!(
        r.topics[0].partitions[0].error_code == 22,
        "ILLEGAL_GENERATION: {r:?}"
    );
    let ResponseKind::TxnOffsetCommit(r) =
        call(&mut c, ApiKey::TxnOffsetCommit, 3, commit(-1, "").into())?
    else {
        bail!("not TxnOffsetCommit")
    };
    ensure!(
        r.topics[0].partitions[0].error_code == 0,
        "{r:?}\n{}",
        g.server_log()
    );
    let fetch = |stable: bool| {
        OffsetFetchRequest::default()
            .with_group_id(GroupId(sb("g")))
            .with_require_stable(stable)
            .with_topics(Some(vec![OffsetFetchRequestTopic::default()
                .with_name(TopicName(sb("t")))
                .with_partition_indexes(vec![0])]))
    };
    let ResponseKind::OffsetFetch(f) = call(&mut c, ApiKey::OffsetFetch, 7, fetch(true).into())?
    else {
        bail!("not OffsetFetch")
    };
    ensure!(
        f.topics[0].partitions[0].error_code == 88,
        "UNSTABLE_OFFSET_COMMIT: {f:?}"
    );
    let ResponseKind::OffsetFetch(f) = call(&mut c, ApiKey::OffsetFetch, 7, fetch(false).into())?
    else {
        bail!("not OffsetFetch")
    };
    let p = &f.topics[0].partitions[0];
    ensure!(
        p.error_code == 0 && p.committed_offset == -1,
        "pending offsets are not visible: {f:?}"
    );

    // Describe and list.
    let d = describe(&mut c, "app-1")?;
    ensure!(
        d.error_code == 0 && d.transaction_state.as_str() == "Ongoing",
        "{d:?}"
    );
    ensure!(
        d.producer_id.0 == pid && d.producer_epoch == 1 && d.transaction_timeout_ms == 60_000,
        "{d:?}"
    );
    let mut parts: Vec<(String, Vec<i32>)> = d
        .topics
        .iter()
        .map(|t| (t.topic.to_string(), t.partitions.clone()))
        .collect();
    parts.sort();
    ensure!(
        parts
            == vec![
                ("__consumer_offsets".to_string(), vec![parts[0].1[0]]),
                ("t".to_string(), vec![0, 1])
            ],
        "{parts:?}"
    );
    let d = describe(&mut c, "never")?;
    ensure!(d.error_code == 105, "TRANSACTIONAL_ID_NOT_FOUND: {d:?}");
    let ResponseKind::ListTransactions(l) = call(
        &mut c,
        ApiKey::ListTransactions,
        1,
        ListTransactionsRequest::default()
            .with_state_filters(vec![sb("Ongoing"), sb("Nonsense")])
            .with_duration_filter(-1)
            .into(),
    )?
    else {
        bail!("not ListTransactions")
    };
    ensure!(
        l.error_code == 0 && l.unknown_state_filters == vec![sb("Nonsense")],
        "{l:?}"
    );
    ensure!(
        l.transaction_states
            .iter()
            .any(|t| t.transactional_id.as_str() == "app-1" && t.producer_id.0 == pid),
        "{l:?}"
    );

    // EndTxn: the old epoch is fenced; the current one commits (v4: no epoch bump).
    let end = |epoch: i16, commit: bool| {
        EndTxnRequest::default()
            .with_transactional_id(TransactionalId(sb("app-1")))
            .with_producer_id(ProducerId(pid))
            .with_producer_epoch(epoch)
            .with_committed(commit)
    };
    let ResponseKind::EndTxn(r) = call(&mut c, ApiKey::EndTxn, 4, end(0, true).into())? else {
        bail!("not EndTxn")
    };
    ensure!(r.error_code == 90, "PRODUCER_FENCED: {r:?}");
    let ResponseKind::EndTxn(r) = call(&mut c, ApiKey::EndTxn, 4, end(1, true).into())? else {
        bail!("not EndTxn")
    };
    ensure!(r.error_code == 0, "EndTxn: {r:?}");
    // Once the commit is decided, an abort is refused (INVALID_TXN_STATE), or the commit is
    // still being completed (CONCURRENT_TRANSACTIONS).
    let ResponseKind::EndTxn(r) = call(&mut c, ApiKey::EndTxn, 4, end(1, false).into())? else {
        bail!("not EndTxn")
    };
    ensure!(r.error_code == 48 || r.error_code == 51, "{r:?}");
    // The markers reach every partition (t-0, t-1 and the group's __consumer_offsets
    // partition), then the commit completes; the offsets are committed with it.
    wait_for_state(&mut c, "app-1", "CompleteCommit")?;
    let d = describe(&mut c, "app-1")?;
    ensure!(d.topics.is_empty(), "{d:?}");
    let ResponseKind::EndTxn(r) = call(&mut c, ApiKey::EndTxn, 4, end(1, false).into())? else {
        bail!("not EndTxn")
    };
    ensure!(r.error_code == 48, "INVALID_TXN_STATE: {r:?}");
    let ResponseKind::OffsetFetch(f) = call(&mut c, ApiKey::OffsetFetch, 7, fetch(true).into())?
    else {
        bail!("not OffsetFetch")
    };
    let p = &f.topics[0].partitions[0];
    ensure!(
        p.error_code == 0 && p.committed_offset == 42,
        "committed with the transaction: {f:?}"
    );

    // The transactional ids survive a restart (replayed from __transaction_state).
    g.restart()?;
    let mut c = KafkaConn::connect(g.bootstrap(), "txn-wire")?;
    let mut state = String::new();
    for _ in 0..200 {
        let d = describe(&mut c, "app-1")?;
        if d.error_code == 0 {
            ensure!(d.producer_id.0 == pid && d.producer_epoch == 1, "{d:?}");
            state = d.transaction_state.to_string();
            break;
        }
        ensure!(d.error_code == 14, "{d:?}");
        std::thread::yield_now();
    }
    ensure!(state == "CompleteCommit", "after restart: {state}");
    let (code, pid3, epoch3) = init(&mut c, "app-1", 60_000, None)?;
    ensure!(
        code == 0 && pid3 == pid && epoch3 == 2,
        "{code} {pid3} {epoch3}"
    );
    // The committed offset survives the restart too (replayed with its marker).
    let ResponseKind::OffsetFetch(f) = call(&mut c, ApiKey::OffsetFetch, 7, fetch(true).into())?
    else {
        bail!("not OffsetFetch")
    };
    ensure!(f.topics[0].partitions[0].committed_offset == 42, "{f:?}");
    Ok(())
}

#[test]
fn a_new_producer_aborts_the_ongoing_transaction() -> Result<()> {
    let g = start()?;
    let mut c = KafkaConn::connect(g.bootstrap(), "txn-fence")?;
    find_txn_coordinator(&mut c, "z")?;
    create_topic(&mut c, "zt", 1)?;
    let (_, pid, epoch) = init(&mut c, "z", 60_000, None)?;
    let r = add_partitions_v3(&mut c, 3, "z", pid, epoch, &[("zt", vec![0])])?;
    ensure!(r == vec![("zt".into(), 0, 0)], "{r:?}");
    // The second instance: the ongoing transaction is fenced and aborted, the client retries.
    let (code, _, _) = init(&mut c, "z", 60_000, None)?;
    ensure!(code == 51, "CONCURRENT_TRANSACTIONS: {code}");
    let d = describe(&mut c, "z")?;
    ensure!(
        d.producer_epoch == 1,
        "the fenced epoch is the abort's: {d:?}"
    );
    wait_for_state(&mut c, "z", "CompleteAbort")?;
    // The zombie can neither commit nor add partitions.
    let ResponseKind::EndTxn(r) = call(
        &mut c,
        ApiKey::EndTxn,
        3,
        EndTxnRequest::default()
            .with_transactional_id(TransactionalId(sb("z")))
            .with_producer_id(ProducerId(pid))
            .with_producer_epoch(epoch)
            .with_committed(true)
            .into(),
    )?
    else {
        bail!("not EndTxn")
    };
    ensure!(r.error_code == 90, "PRODUCER_FENCED: {r:?}");
    let r = add_partitions_v3(&mut c, 3, "z", pid, epoch, &[("zt", vec![0])])?;
    ensure!(r == vec![("zt".into(), 0, 90)], "PRODUCER_FENCED: {r:?}");
    Ok(())
}

/// Kafka's own tools read what the coordinator writes and serves: `kafka-dump-log
/// --transaction-log-decoder` decodes gregor's `__transaction_state` records, and
/// `kafka-transactions` lists and describes the transactions (ListTransactions,
/// FindCoordinator + DescribeTransactions from Kafka's Admin client).
#[test]
fn kafka_tools_read_the_transaction_state() -> Result<()> {
    use gregor_tests::reference::tool_output;
    let g = start()?;
    let mut c = KafkaConn::connect(g.bootstrap(), "txn-tools")?;
    find_txn_coordinator(&mut c, "tool-txn")?;
    create_topic(&mut c, "tt", 2)?;
    let (code, pid, epoch) = init(&mut c, "tool-txn", 45_000, None)?;
    ensure!(code == 0, "{code}");
    let r = add_partitions_v3(&mut c, 3, "tool-txn", pid, epoch, &[("tt", vec![1])])?;
    ensure!(r == vec![("tt".into(), 1, 0)], "{r:?}");

    // Java's String.hashCode("tool-txn") % 50 is the partition; find the segment holding the id.
    let mut dumped = String::new();
    for entry in std::fs::read_dir(g.data_dir())? {
        let dir = entry?.path();
        if !dir
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("__transaction_state-"))
        {
            continue;
        }
        let seg = dir.join("00000000000000000000.log");
        if std::fs::metadata(&seg).map(|m| m.len()).unwrap_or(0) == 0 {
            continue;
        }
        dumped.push_str(&tool_output(
            "kafka-dump-log",
            &[
                "--files",
                &seg.display().to_string(),
                "--transaction-log-decoder",
            ],
        )?);
    }
    ensure!(!dumped.contains("Exception"), "{dumped}");
    // The decoder's lines name the id, the producer, the state, the partitions and the timeout
    // (Kafka's `TransactionLog` formatter); check each field is decoded, not just present.
    let ongoing = dumped
        .lines()
        .find(|l| l.contains("tool-txn") && l.contains("Ongoing"))
        .with_context(|| format!("no Ongoing record for tool-txn: {dumped}"))?;
    for want in [pid.to_string(), "45000".to_string(), "tt".to_string()] {
        ensure!(ongoing.contains(&want), "{want} missing from {ongoing}");
    }
    ensure!(
        dumped
            .lines()
            .any(|l| l.contains("tool-txn") && l.contains("Empty")),
        "the InitProducerId record: {dumped}"
    );
    let tool = "org.apache.kafka.tools.TransactionsCommand";
    let bs = g.bootstrap();
    let listed = tool_output(tool, &["--bootstrap-server", &bs, "list"])?;
    ensure!(
        listed.contains("tool-txn") && listed.contains("Ongoing"),
        "{listed}"
    );
    let described = tool_output(
        tool,
        &[
            "--bootstrap-server",
            &bs,
            "describe",
            "--transactional-id",
            "tool-txn",
        ],
    )?;
    ensure!(
        described.contains(&pid.to_string())
            && described.contains("Ongoing")
            && described.contains("tt-1"),
        "{described}"
    );
    Ok(())
}

/// The Java client's transactional producer end to end (kafka-clients 4.4 from Maven, with
/// `transaction.version` 2: implicit partition adds, TxnOffsetCommit v5, EndTxn v5): commit
/// and abort interleaved over 3 partitions, offsets in the transaction, read_committed and
/// read_uncommitted consumers, requireStable offsets, and zombie fencing
/// (`interop/java/transactions/TxnCheck.java`).
#[test]
fn java_transactional_producer_end_to_end() -> Result<()> {
    use std::process::{Command, Stdio};
    let g = start()?;
    let mut c = KafkaConn::connect(g.bootstrap(), "txn-java")?;
    create_topic(&mut c, "jtx", 3)?;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let source = root.join("interop/java/transactions/TxnCheck.java");
    let classes = tempfile::tempdir()?;
    let classpath = gregor_tests::reference::classpath()?;
    let javac = Command::new("javac")
        .arg("-d")
        .arg(classes.path())
        .arg("-cp")
        .arg(&classpath)
        .arg(&source)
        .stdin(Stdio::null())
        .output()?;
    ensure!(
        javac.status.success(),
        "javac: {}",
        String::from_utf8_lossy(&javac.stderr)
    );
    let out = Command::new("java")
        .args([
            "-Xmx256m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-cp",
        ])
        .arg(format!("{classpath}:{}", classes.path().display()))
        .arg("TxnCheck")
        .args([g.bootstrap().as_str(), "jtx", "jtx-group"])
        .stdin(Stdio::null())
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success() && stdout.contains("ok done"),
        "TxnCheck failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// A transaction open longer than its `transaction.timeout.ms` is fenced and aborted by the
/// coordinator (checked every `transaction.abort.timed.out.transaction.cleanup.interval.ms`,
/// here 100 ms): its markers are written, and the producer that opened it is fenced.
#[test]
fn a_timed_out_transaction_is_aborted() -> Result<()> {
    let g = Gregor::start(
        BIN,
        &["transaction.abort.timed.out.transaction.cleanup.interval.ms=100"],
    )?;
    let mut c = KafkaConn::connect(g.bootstrap(), "txn-timeout")?;
    find_txn_coordinator(&mut c, "slow")?;
    create_topic(&mut c, "st", 1)?;
    let (code, pid, epoch) = init(&mut c, "slow", 500, None)?;
    ensure!(code == 0, "{code}");
    let r = add_partitions_v3(&mut c, 3, "slow", pid, epoch, &[("st", vec![0])])?;
    ensure!(r == vec![("st".into(), 0, 0)], "{r:?}");
    wait_for_state(&mut c, "slow", "CompleteAbort")?;
    let d = describe(&mut c, "slow")?;
    ensure!(
        d.producer_epoch == epoch + 1,
        "fenced with a new epoch: {d:?}"
    );
    let r = add_partitions_v3(&mut c, 3, "slow", pid, epoch, &[("st", vec![0])])?;
    ensure!(r == vec![("st".into(), 0, 90)], "PRODUCER_FENCED: {r:?}");
    Ok(())
}

/// librdkafka's transactional producer (rdkafka 0.39, librdkafka 2.12: AddPartitionsToTxn from
/// the client, KIP-890 part 1 verification on the leader): commit, abort, commit over 3
/// partitions with offsets sent to the transaction; a read_committed consumer sees exactly the
/// committed records, a read_uncommitted one all of them, and the group's offset is the one
/// committed with the transaction.
#[test]
fn librdkafka_transactional_producer() -> Result<()> {
    use rdkafka::consumer::{Consumer, ConsumerGroupMetadata};
    use rdkafka::producer::{BaseRecord, Producer};
    use rdkafka::{Message, Offset, TopicPartitionList};
    use std::time::Duration;
    let g = start()?;
    let bs = g.bootstrap();
    gregor_tests::clients::create_topic(&bs, "rtx", 3)?;
    let p = gregor_tests::clients::producer(
        &bs,
        &[
            ("transactional.id", "rdkafka-txn"),
            ("transaction.timeout.ms", "30000"),
        ],
    )?;
    let t = Duration::from_secs(30);
    p.init_transactions(t)?;
    let group = gregor_tests::clients::consumer(&bs, &[("group.id", "rtx-group")])?;
    let metadata: ConsumerGroupMetadata = group
        .group_metadata()
        .context("the consumer's group metadata")?;
    let run = |prefix: &str, offset: i64, commit: bool| -> Result<()> {
        p.begin_transaction()?;
        for i in 0..30 {
            let value = format!("{prefix}-{i}");
            let key = format!("k{i}");
            p.send(
                BaseRecord::to("rtx")
                    .partition(i % 3)
                    .key(&key)
                    .payload(&value),
            )
            .map_err(|(e, _)| e)?;
        }
        let mut offsets = TopicPartitionList::new();
        offsets.add_partition_offset("rtx", 0, Offset::Offset(offset))?;
        p.send_offsets_to_transaction(&offsets, &metadata, t)?;
        // A BaseProducer serves delivery reports when polled: flush them (the records of the
        // aborted transaction are in the log too, as read_uncommitted shows).
        p.flush(t)?;
        if commit {
            p.commit_transaction(t)?;
        } else {
            p.abort_transaction(t)?;
        }
        Ok(())
    };
    run("c1", 10, true)?;
    run("a2", 20, false)?;
    run("c3", 30, true)?;
    let read = |isolation: &str, want: usize| -> Result<Vec<String>> {
        let reader = format!("rtx-reader-{isolation}");
        let c = gregor_tests::clients::consumer(
            &bs,
            &[
                ("isolation.level", isolation),
                ("group.id", &reader),
                ("enable.auto.commit", "false"),
            ],
        )?;
        let mut tpl = TopicPartitionList::new();
        for part in 0..3 {
            tpl.add_partition_offset("rtx", part, Offset::Beginning)?;
        }
        c.assign(&tpl)?;
        let mut got = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while got.len() < want && std::time::Instant::now() < deadline {
            if let Some(m) = c.poll(Duration::from_millis(200)) {
                let m = m?;
                got.push(String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned());
            }
        }
        got.sort();
        Ok(got)
    };
    let expected = |prefixes: &[&str]| {
        let mut v: Vec<String> = prefixes
            .iter()
            .flat_map(|p| (0..30).map(move |i| format!("{p}-{i}")))
            .collect();
        v.sort();
        v
    };
    ensure!(
        read("read_committed", 60)? == expected(&["c1", "c3"]),
        "read_committed"
    );
    ensure!(
        read("read_uncommitted", 90)? == expected(&["a2", "c1", "c3"]),
        "read_uncommitted"
    );
    // The offsets of the committed transactions: the last one's (30), with requireStable.
    let mut c = KafkaConn::connect(&bs, "txn-rdkafka")?;
    let ResponseKind::OffsetFetch(f) = call(
        &mut c,
        ApiKey::OffsetFetch,
        7,
        OffsetFetchRequest::default()
            .with_group_id(GroupId(sb("rtx-group")))
            .with_require_stable(true)
            .with_topics(Some(vec![OffsetFetchRequestTopic::default()
                .with_name(TopicName(sb("rtx")))
                .with_partition_indexes(vec![0])]))
            .into(),
    )?
    else {
        bail!("not OffsetFetch")
    };
    let part = &f.topics[0].partitions[0];
    ensure!(part.error_code == 0 && part.committed_offset == 30, "{f:?}");
    Ok(())
}
