//! Transactions on a three-node gregor cluster with replication factor 3 (issue 12):
//! `__transaction_state` and the data topic replicated three ways (`min.insync.replicas` 2),
//! the coordinator on one broker writing markers to partition leaders on the others over the
//! inter-broker listener; the Java client's transactional producer end to end; and the
//! coordinator killed (kill -9) in the middle of a transaction: the new leader of its
//! `__transaction_state` partition loads the transaction and the commit completes there; and a
//! partition leader stopped after the commit is decided and killed before its marker: the
//! coordinator writes that marker to the partition's next leader.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use bytes::Bytes;
use gregor_protocol::batch::{BatchBuilder, Batches};
use gregor_protocol::records::decode_records;
use gregor_tests::cluster::{Cluster, ClusterConfig, Implementation};
use gregor_tests::wire::{sb, KafkaConn};
use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    AddPartitionsToTxnRequest, ApiKey, BrokerId, CreateTopicsRequest, DescribeTransactionsRequest,
    EndTxnRequest, FetchRequest, FetchResponse, FindCoordinatorRequest, InitProducerIdRequest,
    MetadataRequest, MetadataResponse, ProduceRequest, ProduceResponse, ProducerId, RequestKind,
    ResponseKind, TopicName, TransactionalId,
};

fn gregor() -> Implementation {
    Implementation::Gregor(env!("CARGO_BIN_EXE_gregor").into())
}

fn call(c: &mut KafkaConn, key: ApiKey, version: i16, req: RequestKind) -> Result<ResponseKind> {
    c.call_kind(key, version, &req)
}

/// Retries `f` (a request to whichever broker it picks) until it returns Some, for at most
/// 60 s: leadership moves after a kill take the controller's session timeout.
fn until<T>(what: &str, mut f: impl FnMut() -> Result<Option<T>>) -> Result<T> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match f() {
            Ok(Some(t)) => return Ok(t),
            Ok(None) => {}
            Err(e) => {
                if Instant::now() >= deadline {
                    return Err(e.context(format!("waiting for {what}")));
                }
            }
        }
        ensure!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The node coordinating `id` and its address, once FindCoordinator answers NONE.
fn coordinator_of(bootstrap: &str, id: &str) -> Result<(i32, String)> {
    let brokers: Vec<&str> = bootstrap.split(',').collect();
    let mut attempt = 0usize;
    until("a transaction coordinator", || {
        attempt += 1;
        let broker = brokers[attempt % brokers.len()];
        let mut c = KafkaConn::connect(broker, "txn-cluster")?;
        let req = FindCoordinatorRequest::default()
            .with_key_type(1)
            .with_coordinator_keys(vec![sb(id)]);
        let ResponseKind::FindCoordinator(r) =
            call(&mut c, ApiKey::FindCoordinator, 4, req.into())?
        else {
            bail!("not FindCoordinator")
        };
        let k = &r.coordinators[0];
        Ok((k.error_code == 0).then(|| (k.node_id.0, format!("{}:{}", k.host, k.port))))
    })
}

/// A three-node cluster (combined roles) and topics `topics` with 3 partitions and
/// replication factor 3.
fn cluster_with_topics(topics: &[&str]) -> Result<(Cluster, KafkaConn)> {
    cluster_with_topics_of(&ClusterConfig::combined(gregor(), 3), topics)
}

/// [`cluster_with_topics`] with the cluster of `config`.
fn cluster_with_topics_of(config: &ClusterConfig, topics: &[&str]) -> Result<(Cluster, KafkaConn)> {
    let cluster = Cluster::start(config)?;
    let bootstrap = cluster.bootstrap();
    let first = bootstrap.split(',').next().context("a broker")?.to_string();
    let mut c = KafkaConn::connect(first.as_str(), "txn-cluster")?;
    let req = CreateTopicsRequest::default()
        .with_timeout_ms(30_000)
        .with_topics(
            topics
                .iter()
                .map(|t| {
                    CreatableTopic::default()
                        .with_name(TopicName(sb(t)))
                        .with_num_partitions(3)
                        .with_replication_factor(3)
                })
                .collect(),
        );
    let ResponseKind::CreateTopics(r) = call(&mut c, ApiKey::CreateTopics, 7, req.into())? else {
        bail!("not CreateTopics")
    };
    ensure!(r.topics.iter().all(|t| t.error_code == 0), "{r:?}");
    Ok((cluster, c))
}

/// The Java client's transactional producer end to end with replication factor 3: the
/// coordinator on one broker, partition leaders on all three. With transaction.version 2 the
/// producer's next transaction (bumped epoch) often reaches a partition leader before the
/// previous one's marker: the leader must verify it apart rather than let it join the open
/// transaction (KAFKA-18575, `ProducerStateManager::has_ongoing_transaction` compares the
/// epoch).
#[test]
fn java_transactions_with_replication_factor_3() -> Result<()> {
    let (cluster, mut c) = cluster_with_topics(&["ctx"])?;
    let bootstrap = cluster.bootstrap();
    // The Java client's transactional producer end to end on the cluster.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let classes = tempfile::tempdir()?;
    let classpath = gregor_tests::reference::classpath()?;
    let javac = Command::new("javac")
        .arg("-d")
        .arg(classes.path())
        .arg("-cp")
        .arg(&classpath)
        .arg(root.join("interop/java/transactions/TxnCheck.java"))
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
        .args([bootstrap.as_str(), "ctx", "ctx-group"])
        .stdin(Stdio::null())
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success() && stdout.contains("ok done"),
        "TxnCheck on the cluster failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // __transaction_state is replicated three ways.
    let ResponseKind::Metadata(m) = call(
        &mut c,
        ApiKey::Metadata,
        12,
        kafka_protocol::messages::MetadataRequest::default()
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
        m.topics[0].partitions.len() == 50
            && m.topics[0]
                .partitions
                .iter()
                .all(|p| p.replica_nodes.len() == 3),
        "{:?}",
        m.topics[0]
    );

    Ok(())
}

/// The coordinator of a transaction is killed (kill -9) between AddPartitionsToTxn and EndTxn:
/// another broker becomes the leader of the id's `__transaction_state` partition (replicated
/// three ways, `min.insync.replicas` 2), loads the transaction as Ongoing, and the producer's
/// commit completes there, its markers reaching the partitions' leaders on the live brokers.
#[test]
fn coordinator_failover_with_replication_factor_3() -> Result<()> {
    let (mut cluster, _c) = cluster_with_topics(&["fo"])?;
    let bootstrap = cluster.bootstrap();
    // A transaction whose coordinator is killed between AddPartitionsToTxn and EndTxn.
    let id = "failover-txn";
    let (node, address, pid, epoch) = init_transactional_id(&bootstrap, id)?;
    let mut k = KafkaConn::connect(address.as_str(), "txn-cluster")?;
    let ResponseKind::AddPartitionsToTxn(r) = call(
        &mut k,
        ApiKey::AddPartitionsToTxn,
        3,
        AddPartitionsToTxnRequest::default()
            .with_v3_and_below_transactional_id(TransactionalId(sb(id)))
            .with_v3_and_below_producer_id(ProducerId(pid))
            .with_v3_and_below_producer_epoch(epoch)
            .with_v3_and_below_topics(vec![AddPartitionsToTxnTopic::default()
                .with_name(TopicName(sb("fo")))
                .with_partitions(vec![0, 1, 2])])
            .into(),
    )?
    else {
        bail!("not AddPartitionsToTxn")
    };
    ensure!(
        r.results_by_topic_v3_and_below[0]
            .results_by_partition
            .iter()
            .all(|p| p.partition_error_code == 0),
        "{r:?}"
    );
    drop(k);
    cluster.node_mut(node).kill9()?;
    let survivors = cluster.bootstrap_of_running()?;
    // Another broker takes over the transactional id's partition and loads it: Ongoing.
    let (new_node, address) = until("a new coordinator", || {
        let (n, a) = coordinator_of(&survivors, id)?;
        Ok((n != node).then_some((n, a)))
    })?;
    let describe = |address: &str| describe_transaction(address, id);
    let (state, e) = until("the loaded transaction", || describe(&address))?;
    ensure!(
        state == "Ongoing" && e == epoch,
        "on node {new_node}: {state} {e}"
    );
    // The producer commits with the new coordinator; the markers reach the three partitions
    // (their leaders among the two live brokers) and the commit completes.
    // Retriable while the partition settles.
    let code = commit(&address, id, pid, epoch, &[14, 15, 16, 51])?;
    ensure!(code == 0, "EndTxn: {code}");
    until("CompleteCommit", || {
        Ok(describe(&address)?.filter(|(s, _)| s == "CompleteCommit"))
    })?;
    Ok(())
}

/// Each partition of `topic` with its leader's node id and address, once all have leaders, as
/// `broker` sees them.
fn leaders(broker: &str, topic: &str) -> Result<Vec<(i32, i32, String)>> {
    until("partition leaders", || {
        let mut c = KafkaConn::connect(broker, "txn-cluster")?;
        let m: MetadataResponse = c.call(
            ApiKey::Metadata,
            12,
            &MetadataRequest::default().with_topics(Some(vec![
                MetadataRequestTopic::default().with_name(Some(TopicName(sb(topic))))
            ])),
        )?;
        let Some(t) = m.topics.first().filter(|t| t.error_code == 0) else {
            return Ok(None);
        };
        let mut out = Vec::new();
        for p in &t.partitions {
            let Some(b) = m.brokers.iter().find(|b| b.node_id == p.leader_id) else {
                return Ok(None);
            };
            out.push((
                p.partition_index,
                p.leader_id.0,
                format!("{}:{}", b.host, b.port),
            ));
        }
        out.sort();
        Ok((out.len() == 3).then_some(out))
    })
}

/// The values of `topic`-`partition` read with read_committed from `broker` (its leader), and
/// whether a COMMIT marker follows them; fails unless the last stable offset reached the high
/// watermark.
fn read_committed(broker: &str, topic: &str, partition: i32) -> Result<(Vec<String>, bool)> {
    let mut c = KafkaConn::connect(broker, "txn-cluster")?;
    let req = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(0)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_isolation_level(1)
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(sb(topic)))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(partition)
                .with_fetch_offset(0)
                .with_partition_max_bytes(1 << 20)])]);
    let r: FetchResponse = c.call(ApiKey::Fetch, 12, &req)?;
    let p = &r.responses[0].partitions[0];
    ensure!(p.error_code == 0, "fetch error {}", p.error_code);
    ensure!(
        p.last_stable_offset == p.high_watermark,
        "{topic}-{partition}: last stable offset {} below the high watermark {}",
        p.last_stable_offset,
        p.high_watermark
    );
    let mut values = Vec::new();
    let mut committed = false;
    if let Some(raw) = &p.records {
        for item in Batches::new(raw) {
            let (pos, h) = item?;
            let recs = decode_records(&raw[pos..pos + h.total_size()])?;
            if h.is_control() {
                committed |= recs.first().and_then(|r| r.key.as_deref()) == Some(&[0, 0, 0, 1]);
            } else {
                values.extend(recs.iter().map(|r| {
                    String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned()
                }));
            }
        }
    }
    Ok((values, committed))
}

/// A partition leader crashes between the markers (issue 12): a transaction writes to the
/// three partitions of a topic (replication factor 3, leaders on different nodes); the leader
/// of one partition that is not the coordinator is stopped (SIGSTOP), then the producer
/// commits. The coordinator decides the commit (PrepareCommit, once the stopped node has left
/// the ISR of its `__transaction_state` partition) but cannot write that partition's marker;
/// the stopped leader is then killed (SIGKILL). The coordinator must write the marker to the
/// partition's next leader and complete the transaction, and read_committed must see every
/// record of the transaction on every partition, followed by its COMMIT marker.
#[test]
fn a_partition_leader_killed_between_the_markers() -> Result<()> {
    let topic = "between";
    let (mut cluster, _c) = cluster_with_topics_of(
        // The stopped node leaves ISRs after 3 s instead of 30 s, so the commit is decided
        // quickly.
        &ClusterConfig::combined(gregor(), 3).with("replica.lag.time.max.ms", "3000"),
        &[topic],
    )?;
    let bootstrap = cluster.bootstrap();
    let id = "between-markers";
    let (node, address, pid, epoch) = init_transactional_id(&bootstrap, id)?;
    let before = leaders(&address, topic)?;
    let (victim_partition, victim, _) = before
        .iter()
        .find(|(_, leader, _)| *leader != node)
        .cloned()
        .with_context(|| {
            format!("every partition of {topic} is led by the coordinator: {before:?}")
        })?;

    let mut k = KafkaConn::connect(address.as_str(), "txn-cluster")?;
    let ResponseKind::AddPartitionsToTxn(r) = call(
        &mut k,
        ApiKey::AddPartitionsToTxn,
        3,
        AddPartitionsToTxnRequest::default()
            .with_v3_and_below_transactional_id(TransactionalId(sb(id)))
            .with_v3_and_below_producer_id(ProducerId(pid))
            .with_v3_and_below_producer_epoch(epoch)
            .with_v3_and_below_topics(vec![AddPartitionsToTxnTopic::default()
                .with_name(TopicName(sb(topic)))
                .with_partitions(vec![0, 1, 2])])
            .into(),
    )?
    else {
        bail!("not AddPartitionsToTxn")
    };
    ensure!(
        r.results_by_topic_v3_and_below[0]
            .results_by_partition
            .iter()
            .all(|p| p.partition_error_code == 0),
        "{r:?}"
    );
    // Two records to each partition's leader, in the transaction (sequence 0 on each).
    for (partition, _, leader) in &before {
        let values = [format!("p{partition}-a"), format!("p{partition}-b")];
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(0));
        let mut b = BatchBuilder::new(0, now)
            .producer(pid, epoch, 0)
            .transactional(true, false);
        for v in &values {
            b = b.record(now, None, Some(v.as_bytes()), &[]);
        }
        let records = Bytes::from(b.build());
        let code = until("a transactional Produce", || {
            let mut c = KafkaConn::connect(leader.as_str(), "txn-cluster")?;
            let req = ProduceRequest::default()
                .with_transactional_id(Some(TransactionalId(sb(id))))
                .with_acks(-1)
                .with_timeout_ms(10_000)
                .with_topic_data(vec![TopicProduceData::default()
                    .with_name(TopicName(sb(topic)))
                    .with_partition_data(vec![PartitionProduceData::default()
                        .with_index(*partition)
                        .with_records(Some(records.clone()))])]);
            let r: ProduceResponse = c.call(ApiKey::Produce, 9, &req)?;
            let code = r.responses[0].partition_responses[0].error_code;
            // Retriable: NOT_ENOUGH_REPLICAS (19), CONCURRENT_TRANSACTIONS (51).
            Ok((![19, 51].contains(&code)).then_some(code))
        })?;
        ensure!(code == 0, "Produce to {topic}-{partition}: error {code}");
    }

    // The victim stops before the commit: its marker cannot be written.
    cluster.node_mut(victim).pause()?;
    // Retriable: REQUEST_TIMED_OUT (7), NOT_ENOUGH_REPLICAS (19, 20), coordinator moves.
    let code = commit(&address, id, pid, epoch, &[7, 14, 15, 16, 19, 20])?;
    ensure!(code == 0, "EndTxn: {code}");
    let describe = |address: &str| Ok(describe_transaction(address, id)?.map(|(state, _)| state));
    let state = until("the transaction's state", || describe(&address))?;
    ensure!(
        state == "PrepareCommit",
        "the commit completed while the leader of {topic}-{victim_partition} (node {victim}) \
         was stopped: {state}"
    );
    cluster.node_mut(victim).kill9()?;
    eprintln!(
        "node {victim}, leader of {topic}-{victim_partition}, killed with the transaction in \
         PrepareCommit"
    );
    until("CompleteCommit", || {
        Ok(describe(&address)?.filter(|s| s == "CompleteCommit"))
    })?;
    let after = leaders(&address, topic)?;
    for (partition, leader, addr) in &after {
        ensure!(
            *leader != victim,
            "{topic}-{partition} still led by the killed node"
        );
        let (values, committed) = until("the records and the marker", || {
            Ok(read_committed(addr, topic, *partition)
                .ok()
                .filter(|(_, c)| *c))
        })?;
        ensure!(
            values == [format!("p{partition}-a"), format!("p{partition}-b")],
            "{topic}-{partition} read_committed: {values:?}"
        );
        ensure!(committed);
    }
    Ok(())
}

/// Finds the coordinator of transactional id `id` (looking again while it answers
/// NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS, as a client does: a new topic's leaders
/// learn of their leadership from the metadata log a moment after the others) and initialises
/// the id there; returns the coordinator's node id and address, the producer id and epoch.
fn init_transactional_id(bootstrap: &str, id: &str) -> Result<(i32, String, i64, i16)> {
    let (node, address, r) = until("InitProducerId", || {
        let (node, address) = coordinator_of(bootstrap, id)?;
        let mut k = KafkaConn::connect(address.as_str(), "txn-cluster")?;
        let ResponseKind::InitProducerId(r) = call(
            &mut k,
            ApiKey::InitProducerId,
            5,
            InitProducerIdRequest::default()
                .with_transactional_id(Some(TransactionalId(sb(id))))
                .with_transaction_timeout_ms(120_000)
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1)
                .into(),
        )?
        else {
            bail!("not InitProducerId")
        };
        Ok((![14, 15, 16].contains(&r.error_code)).then_some((node, address, r)))
    })?;
    ensure!(r.error_code == 0, "{r:?}");
    Ok((node, address, r.producer_id.0, r.producer_epoch))
}

/// The state and producer epoch of transactional id `id` from DescribeTransactions at the
/// coordinator `address`; None while it answers an error (not the coordinator yet, loading).
fn describe_transaction(address: &str, id: &str) -> Result<Option<(String, i16)>> {
    let mut k = KafkaConn::connect(address, "txn-cluster")?;
    let ResponseKind::DescribeTransactions(d) = call(
        &mut k,
        ApiKey::DescribeTransactions,
        0,
        DescribeTransactionsRequest::default()
            .with_transactional_ids(vec![TransactionalId(sb(id))])
            .into(),
    )?
    else {
        bail!("not DescribeTransactions")
    };
    let s = &d.transaction_states[0];
    Ok((s.error_code == 0).then(|| (s.transaction_state.to_string(), s.producer_epoch)))
}

/// EndTxn v4 committing `id`'s transaction at `address`, sent again while the answer is one of
/// `retriable`; the final error code.
fn commit(address: &str, id: &str, pid: i64, epoch: i16, retriable: &[i16]) -> Result<i16> {
    until("EndTxn", || {
        let mut k = KafkaConn::connect(address, "txn-cluster")?;
        let ResponseKind::EndTxn(r) = call(
            &mut k,
            ApiKey::EndTxn,
            4,
            EndTxnRequest::default()
                .with_transactional_id(TransactionalId(sb(id)))
                .with_producer_id(ProducerId(pid))
                .with_producer_epoch(epoch)
                .with_committed(true)
                .into(),
        )?
        else {
            bail!("not EndTxn")
        };
        Ok((!retriable.contains(&r.error_code)).then_some(r.error_code))
    })
}
