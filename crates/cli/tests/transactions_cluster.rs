//! Transactions on a three-node gregor cluster with replication factor 3 (issue 12):
//! `__transaction_state` and the data topic replicated three ways (`min.insync.replicas` 2),
//! the coordinator on one broker writing markers to partition leaders on the others over the
//! inter-broker listener; the Java client's transactional producer end to end; and the
//! coordinator killed (kill -9) in the middle of a transaction: the new leader of its
//! `__transaction_state` partition loads the transaction and the commit completes there.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use gregor_tests::cluster::{Cluster, ClusterConfig, Implementation};
use gregor_tests::wire::{sb, KafkaConn};
use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::{
    AddPartitionsToTxnRequest, ApiKey, CreateTopicsRequest, DescribeTransactionsRequest,
    EndTxnRequest, FindCoordinatorRequest, InitProducerIdRequest, ProducerId, RequestKind,
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
    let cluster = Cluster::start(&ClusterConfig::combined(gregor(), 3))?;
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
    // As a client does: find the coordinator, and look again while it answers NOT_COORDINATOR
    // or COORDINATOR_LOAD_IN_PROGRESS (a new topic's leaders learn of their leadership from
    // the metadata log a moment after the others do).
    let (node, address, r) = until("InitProducerId", || {
        let (node, address) = coordinator_of(&bootstrap, id)?;
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
    let mut k = KafkaConn::connect(address.as_str(), "txn-cluster")?;
    let (pid, epoch) = (r.producer_id.0, r.producer_epoch);
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
    let describe = |address: &str| -> Result<Option<(String, i16)>> {
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
    };
    let (state, e) = until("the loaded transaction", || describe(&address))?;
    ensure!(
        state == "Ongoing" && e == epoch,
        "on node {new_node}: {state} {e}"
    );
    // The producer commits with the new coordinator; the markers reach the three partitions
    // (their leaders among the two live brokers) and the commit completes.
    let code = until("EndTxn", || {
        let mut k = KafkaConn::connect(address.as_str(), "txn-cluster")?;
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
        // Retriable while the partition settles.
        Ok((![14, 15, 16, 51].contains(&r.error_code)).then_some(r.error_code))
    })?;
    ensure!(code == 0, "EndTxn: {code}");
    until("CompleteCommit", || {
        Ok(describe(&address)?.filter(|(s, _)| s == "CompleteCommit"))
    })?;
    Ok(())
}
