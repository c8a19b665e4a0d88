//! Replica fetchers on three combined gregor nodes (issue 11): a partition with replication
//! factor 3 is copied batch for batch (same offsets, leader epochs and CRCs) into both
//! followers' logs, which is also what lets acks=all produces complete; a follower killed
//! with kill -9 catches up after its restart, and writes its `replication-offset-checkpoint`;
//! an old leader that appended records the followers never got truncates that divergent tail
//! when it comes back as a follower of the new leader; a follower whose log ends below the
//! leader's log start offset (DeleteRecords while it was down) starts over there.
//!
//! `cargo test -p gregor --test replica_fetcher -- --nocapture --test-threads=1`

use gregor_tests::process::wait_for;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use gregor_protocol::batch::{BatchBuilder, Batches};
use gregor_tests::cluster::{Cluster, ClusterConfig, Implementation};
use gregor_tests::wire::{sb, KafkaConn};
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::delete_records_request::{
    DeleteRecordsPartition, DeleteRecordsTopic,
};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, CreateTopicsRequest, CreateTopicsResponse, DeleteRecordsRequest, DeleteRecordsResponse,
    MetadataRequest, MetadataResponse, ProduceRequest, ProduceResponse, TopicName,
};

fn gregor() -> Implementation {
    Implementation::Gregor(env!("CARGO_BIN_EXE_gregor").into())
}

fn config() -> ClusterConfig {
    ClusterConfig::combined(gregor(), 3)
        .with("broker.session.timeout.ms", "3000")
        .with("broker.heartbeat.interval.ms", "500")
        .with("replica.high.watermark.checkpoint.interval.ms", "300")
        .with("replica.fetch.backoff.ms", "200")
}

fn conn(bootstrap: &str) -> anyhow::Result<KafkaConn> {
    KafkaConn::connect_timeout(
        bootstrap.parse()?,
        Duration::from_secs(5),
        "replica-fetcher-test",
    )
}

fn create_topic(bootstrap: &str, name: &str, rf: i16) {
    create_topic_with(bootstrap, name, rf, &[]);
}

fn create_topic_with(bootstrap: &str, name: &str, rf: i16, configs: &[(&str, &str)]) {
    let req = CreateTopicsRequest::default()
        .with_timeout_ms(30_000)
        .with_topics(vec![CreatableTopic::default()
            .with_name(TopicName(sb(name)))
            .with_num_partitions(1)
            .with_replication_factor(rf)
            .with_configs(
                configs
                    .iter()
                    .map(|(k, v)| {
                        CreatableTopicConfig::default()
                            .with_name(sb(k))
                            .with_value(Some(sb(v)))
                    })
                    .collect(),
            )]);
    let r: CreateTopicsResponse = conn(bootstrap)
        .and_then(|mut c| c.call(ApiKey::CreateTopics, 7, &req))
        .expect("CreateTopics answered");
    assert_eq!(r.topics[0].error_code, 0, "{r:?}");
}

/// (leader, leader epoch, ISR) of partition 0 of `topic` as `bootstrap` sees it.
fn leader_of(bootstrap: &str, topic: &str) -> Option<(i32, i32, Vec<i32>)> {
    let req = MetadataRequest::default()
        .with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(TopicName(sb(topic))))
        ]))
        .with_allow_auto_topic_creation(false);
    let m: MetadataResponse = conn(bootstrap)
        .ok()?
        .call(ApiKey::Metadata, 12, &req)
        .ok()?;
    let p = m.topics.first()?.partitions.first()?;
    (p.error_code == 0 && p.leader_id.0 >= 0).then(|| {
        (
            p.leader_id.0,
            p.leader_epoch,
            p.isr_nodes.iter().map(|b| b.0).collect(),
        )
    })
}

/// Produces `batches` batches of 5 records to partition 0 of `topic` at `bootstrap`; returns
/// the error code of the first failure, else the last batch's base offset.
fn produce(bootstrap: &str, topic: &str, acks: i16, batches: usize, tag: &str) -> Result<i64, i16> {
    let mut c = conn(bootstrap).map_err(|_| -1i16)?;
    let mut last = -1;
    for i in 0..batches {
        let mut b = BatchBuilder::new(0, 1_000);
        for r in 0..5 {
            let value = format!("{tag}-{i}-{r}");
            b = b.record(1_000, None, Some(value.as_bytes()), &[]);
        }
        let req = ProduceRequest::default()
            .with_acks(acks)
            .with_timeout_ms(15_000)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(TopicName(sb(topic)))
                .with_partition_data(vec![PartitionProduceData::default()
                    .with_index(0)
                    .with_records(Some(Bytes::from(b.build())))])]);
        // A leader that has not applied the topic yet answers UNKNOWN_TOPIC_OR_PARTITION (3)
        // or NOT_LEADER_OR_FOLLOWER (6) for a moment: retried, nothing was appended.
        let deadline = Instant::now() + Duration::from_secs(20);
        let p = loop {
            let resp: ProduceResponse = c.call(ApiKey::Produce, 9, &req).map_err(|_| -1i16)?;
            let p = resp.responses[0].partition_responses[0].clone();
            if !matches!(p.error_code, 3 | 6) || Instant::now() > deadline {
                break p;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        if p.error_code != 0 {
            return Err(p.error_code);
        }
        last = p.base_offset;
    }
    Ok(last)
}

/// Every batch in the partition directory's segments, in offset order: (base offset, last
/// offset, partition leader epoch, CRC). Read from the files, as the node wrote them.
fn log_batches(data_dir: &Path, topic: &str) -> Vec<(i64, i64, i32, u32)> {
    let dir = data_dir.join(format!("{topic}-0"));
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut segments: Vec<_> = rd
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    segments.sort();
    let mut out = Vec::new();
    for s in segments {
        let Ok(bytes) = std::fs::read(&s) else {
            continue;
        };
        for item in Batches::new(&bytes) {
            let Ok((_, h)) = item else { break };
            out.push((
                h.base_offset,
                h.base_offset + i64::from(h.last_offset_delta),
                h.partition_leader_epoch,
                h.crc,
            ));
        }
    }
    out
}

/// Waits until node `id`'s log of `topic` holds exactly `expected`.
fn wait_for_log(cluster: &Cluster, id: i32, topic: &str, expected: &[(i64, i64, i32, u32)]) {
    let dir = cluster.node(id).data_dir();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = log_batches(&dir, topic);
        if got == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "node {id}'s log of {topic} never matched the leader's:\n got {got:?}\nwant {expected:?}\n{}",
            cluster.logs(40)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The high watermark node `id` checkpointed for partition 0 of `topic`.
fn checkpointed_hw(cluster: &Cluster, id: i32, topic: &str) -> Option<i64> {
    let text = std::fs::read_to_string(
        cluster
            .node(id)
            .data_dir()
            .join("replication-offset-checkpoint"),
    )
    .ok()?;
    let mut lines = text.lines();
    if lines.next()? != "0" {
        return None;
    }
    let count: usize = lines.next()?.parse().ok()?;
    let entries: Vec<&str> = lines.collect();
    if entries.len() != count {
        return None;
    }
    entries.iter().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        match f.as_slice() {
            [t, "0", o] if *t == topic => o.parse().ok(),
            _ => None,
        }
    })
}

#[test]
fn followers_copy_the_leader_and_a_killed_follower_catches_up() {
    let mut cluster = Cluster::start(&config()).unwrap_or_else(|e| panic!("{e:#}"));
    let b1 = cluster.node(1).bootstrap().expect("broker listener");
    create_topic(&b1, "copied", 3);
    let (leader, _, isr) = wait_for(Duration::from_secs(20), "a leader of copied", || {
        leader_of(&b1, "copied")
    });
    assert_eq!(isr.len(), 3, "{isr:?}");
    let lb = cluster.node(leader).bootstrap().expect("leader listener");

    // acks=all completes only once both followers fetched the batches (the ISR is all three).
    let started = Instant::now();
    assert_eq!(produce(&lb, "copied", -1, 20, "a"), Ok(95));
    println!(
        "20 acks=all batches in {} ms",
        started.elapsed().as_millis()
    );
    let expected = log_batches(&cluster.node(leader).data_dir(), "copied");
    assert_eq!(expected.len(), 20);
    assert_eq!(expected.last().map(|b| b.1), Some(99));
    let followers: Vec<i32> = [1, 2, 3].into_iter().filter(|i| *i != leader).collect();
    for f in &followers {
        wait_for_log(&cluster, *f, "copied", &expected);
        // The follower's high watermark (the leader's, as it fetched) reaches the checkpoint.
        wait_for(
            Duration::from_secs(20),
            "the follower's HW checkpoint",
            || (checkpointed_hw(&cluster, *f, "copied")? == 100).then_some(()),
        );
    }

    // kill -9 a follower; the leader takes more (acks=1, not waiting for the ISR to shrink);
    // the restarted follower catches up from its log end offset.
    let victim = followers[0];
    cluster.node_mut(victim).kill9().unwrap();
    assert_eq!(produce(&lb, "copied", 1, 10, "b"), Ok(145));
    let expected = log_batches(&cluster.node(leader).data_dir(), "copied");
    assert_eq!(expected.len(), 30);
    assert_eq!(
        log_batches(&cluster.node(victim).data_dir(), "copied").len(),
        20,
        "the dead follower has only the first 20 batches"
    );
    cluster.node_mut(victim).spawn().unwrap();
    cluster
        .node_mut(victim)
        .wait_listening(Duration::from_secs(30))
        .unwrap();
    wait_for_log(&cluster, victim, "copied", &expected);
    wait_for(
        Duration::from_secs(20),
        "the HW checkpoint after catching up",
        || (checkpointed_hw(&cluster, victim, "copied")? == 150).then_some(()),
    );
    // Every replica still agrees after one more acks=all round.
    assert_eq!(produce(&lb, "copied", -1, 1, "c"), Ok(150));
    let expected = log_batches(&cluster.node(leader).data_dir(), "copied");
    for f in &followers {
        wait_for_log(&cluster, *f, "copied", &expected);
    }
}

/// The old leader appended 5 batches no follower has, then died with both followers down; the
/// followers come back and one of them is elected (cleanly or not); `new_leader_writes_first` = the new leader
/// takes records in its epoch before the old one returns. The old leader, back as a follower,
/// must end with exactly the new leader's log.
fn divergent_tail(new_leader_writes_first: bool) {
    let mut cluster = Cluster::start(&config()).unwrap_or_else(|e| panic!("{e:#}"));
    let b1 = cluster.node(1).bootstrap().expect("broker listener");
    // The restarted followers may have left the ISR (their old sessions can expire before
    // they register again, and Kafka 4.x also drops a replica that shut down uncleanly): then
    // only an unclean election gives the partition a leader, which is the case this models.
    create_topic_with(
        &b1,
        "diverge",
        3,
        &[("unclean.leader.election.enable", "true")],
    );
    let (old_leader, old_epoch, _) =
        wait_for(Duration::from_secs(20), "a leader of diverge", || {
            leader_of(&b1, "diverge")
        });
    let lb = cluster.node(old_leader).bootstrap().expect("listener");
    // The leader itself must have applied the topic before it takes records.
    wait_for(
        Duration::from_secs(20),
        "the leader to know it leads",
        || leader_of(&lb, "diverge").filter(|(l, _, _)| *l == old_leader),
    );
    assert_eq!(produce(&lb, "diverge", -1, 10, "common"), Ok(45));
    let common = log_batches(&cluster.node(old_leader).data_dir(), "diverge");
    let followers: Vec<i32> = [1, 2, 3].into_iter().filter(|i| *i != old_leader).collect();
    for f in &followers {
        wait_for_log(&cluster, *f, "diverge", &common);
    }

    // Both followers die (and the quorum with them, so nothing changes in the metadata); the
    // old leader still takes acks=1 records no one else will ever have, then dies too.
    for f in &followers {
        cluster.node_mut(*f).kill9().unwrap();
    }
    assert_eq!(produce(&lb, "diverge", 1, 5, "tail"), Ok(70));
    assert_eq!(
        log_batches(&cluster.node(old_leader).data_dir(), "diverge").len(),
        15
    );
    cluster.node_mut(old_leader).kill9().unwrap();

    // The followers return; once the old leader's session expires one of them leads.
    for f in &followers {
        cluster.node_mut(*f).spawn().unwrap();
    }
    for f in &followers {
        cluster
            .node_mut(*f)
            .wait_listening(Duration::from_secs(30))
            .unwrap();
    }
    let fb = cluster.node(followers[0]).bootstrap().expect("listener");
    let deadline = Instant::now() + Duration::from_secs(60);
    let (new_leader, new_epoch) = loop {
        let seen = leader_of(&fb, "diverge");
        if let Some((l, e, _)) = seen
            .clone()
            .filter(|(l, e, _)| *l != old_leader && *e > old_epoch)
        {
            break (l, e);
        }
        assert!(
            Instant::now() < deadline,
            "no new leader of diverge (last seen {seen:?}, old leader {old_leader} epoch {old_epoch}):\n{}",
            cluster.logs(60)
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let nb = cluster.node(new_leader).bootstrap().expect("listener");
    if new_leader_writes_first {
        // Offsets 50-59 in the new epoch, where the old leader has its own tail.
        assert_eq!(produce(&nb, "diverge", 1, 2, "new"), Ok(55));
    }

    cluster.node_mut(old_leader).spawn().unwrap();
    cluster
        .node_mut(old_leader)
        .wait_listening(Duration::from_secs(30))
        .unwrap();
    // More records in the new epoch once the old leader follows.
    wait_for(Duration::from_secs(30), "the old leader to follow", || {
        leader_of(&nb, "diverge")
            .filter(|(l, e, isr)| *l == new_leader && *e == new_epoch && !isr.is_empty())
    });
    let next = if new_leader_writes_first { 60 } else { 50 };
    assert_eq!(produce(&nb, "diverge", 1, 2, "after"), Ok(next + 5));
    let expected = log_batches(&cluster.node(new_leader).data_dir(), "diverge");
    assert_eq!(&expected[..10], &common[..]);
    assert!(
        expected[10..].iter().all(|b| b.2 == new_epoch),
        "{expected:?}"
    );
    for id in [1, 2, 3] {
        wait_for_log(&cluster, id, "diverge", &expected);
    }
}

#[test]
fn an_old_leader_truncates_its_divergent_tail_beyond_the_new_leaders_log() {
    divergent_tail(false);
}

/// Found through the leader's `DivergingEpoch` (the old leader's fetch offset is inside the
/// new leader's log, so no OFFSET_OUT_OF_RANGE).
#[test]
fn an_old_leader_truncates_a_divergent_tail_the_new_leader_overwrote() {
    divergent_tail(true);
}

/// A follower down while the leader moved its log start offset past the follower's log end
/// (DeleteRecords, inside a batch) gets OFFSET_OUT_OF_RANGE, learns the leader's log start
/// offset (ListOffsets earliest), drops its log and starts at the batch holding that offset,
/// then copies the rest; its log start offset is the leader's.
#[test]
fn a_follower_behind_the_leaders_log_start_starts_over_there() {
    let mut cluster = Cluster::start(&config().with("replica.lag.time.max.ms", "1500"))
        .unwrap_or_else(|e| panic!("{e:#}"));
    let b1 = cluster.node(1).bootstrap().expect("broker listener");
    create_topic(&b1, "trimmed", 3);
    let (leader, _, _) = wait_for(Duration::from_secs(20), "a leader of trimmed", || {
        leader_of(&b1, "trimmed")
    });
    let lb = cluster.node(leader).bootstrap().expect("listener");
    assert_eq!(produce(&lb, "trimmed", -1, 10, "old"), Ok(45));
    let followers: Vec<i32> = [1, 2, 3].into_iter().filter(|i| *i != leader).collect();
    let victim = followers[0];
    let early = log_batches(&cluster.node(leader).data_dir(), "trimmed");
    wait_for_log(&cluster, victim, "trimmed", &early);
    cluster.node_mut(victim).kill9().unwrap();
    assert_eq!(produce(&lb, "trimmed", 1, 10, "new"), Ok(95));
    // The leader drops the dead follower from the ISR, so its high watermark reaches 100.
    wait_for(
        Duration::from_secs(30),
        "the ISR without the dead follower",
        || leader_of(&lb, "trimmed").filter(|(_, _, isr)| !isr.contains(&victim)),
    );
    let req = DeleteRecordsRequest::default()
        .with_timeout_ms(5000)
        .with_topics(vec![DeleteRecordsTopic::default()
            .with_name(TopicName(sb("trimmed")))
            .with_partitions(vec![DeleteRecordsPartition::default()
                .with_partition_index(0)
                .with_offset(72)])]);
    let low = wait_for(Duration::from_secs(20), "DeleteRecords up to 72", || {
        let r: DeleteRecordsResponse = conn(&lb).ok()?.call(ApiKey::DeleteRecords, 2, &req).ok()?;
        let p = &r.topics[0].partitions[0];
        (p.error_code == 0).then_some(p.low_watermark)
    });
    assert_eq!(low, 72);

    cluster.node_mut(victim).spawn().unwrap();
    cluster
        .node_mut(victim)
        .wait_listening(Duration::from_secs(30))
        .unwrap();
    // From the batch [70, 74] that holds the leader's log start offset on.
    let expected: Vec<_> = log_batches(&cluster.node(leader).data_dir(), "trimmed")
        .into_iter()
        .filter(|b| b.1 >= 72)
        .collect();
    assert_eq!(expected.first().map(|b| b.0), Some(70));
    wait_for_log(&cluster, victim, "trimmed", &expected);
    let start_checkpoint = |id: i32| {
        std::fs::read_to_string(
            cluster
                .node(id)
                .data_dir()
                .join("log-start-offset-checkpoint"),
        )
        .unwrap_or_default()
    };
    wait_for(
        Duration::from_secs(20),
        "the follower's log start offset checkpoint",
        || {
            start_checkpoint(victim)
                .contains("trimmed 0 72\n")
                .then_some(())
        },
    );
}

/// ListOffsets earliest asked of node `id` itself as a debugging client (ReplicaId -2, which a
/// follower answers from its own log): that replica's log start offset.
fn log_start_at(bootstrap: &str, topic: &str) -> Option<i64> {
    use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
    use kafka_protocol::messages::{BrokerId, ListOffsetsRequest, ListOffsetsResponse};
    let req = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-2))
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(TopicName(sb(topic)))
            .with_partitions(vec![ListOffsetsPartition::default()
                .with_partition_index(0)
                .with_timestamp(-2)])]);
    let r: ListOffsetsResponse = conn(bootstrap)
        .ok()?
        .call(ApiKey::ListOffsets, 7, &req)
        .ok()?;
    let p = r.topics.first()?.partitions.first()?;
    (p.error_code == 0).then_some(p.offset)
}

/// DeleteRecords through rdkafka's admin client, `timeout` as its operation timeout (the
/// request's TimeoutMs): the partition's result, the low watermark or the error.
fn delete_records_rdkafka(
    bootstrap: &str,
    topic: &str,
    offset: i64,
    timeout: Duration,
) -> Result<i64, rdkafka::types::RDKafkaErrorCode> {
    use rdkafka::admin::AdminOptions;
    use rdkafka::{Offset, TopicPartitionList};
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Offset(offset))
        .expect("offset");
    let admin = gregor_tests::clients::admin(bootstrap).expect("admin client");
    let runtime = gregor_tests::clients::runtime().expect("runtime");
    let options = AdminOptions::new()
        .operation_timeout(Some(timeout))
        .request_timeout(Some(timeout + Duration::from_secs(10)));
    let res = runtime
        .block_on(admin.delete_records(&tpl, &options))
        .expect("DeleteRecords request");
    let e = res.find_partition(topic, 0).expect("partition in result");
    match (e.error(), e.offset()) {
        (Ok(()), rdkafka::Offset::Offset(low)) => Ok(low),
        (Err(rdkafka::error::KafkaError::OffsetFetch(code)), _) => Err(code),
        other => panic!("unexpected DeleteRecords result {other:?}"),
    }
}

/// DeleteRecords answers once every live replica starts at the offset (Kafka's
/// `DelayedDeleteRecords`, KIP-107): when rdkafka gets the answer, each follower already
/// answers ListOffsets earliest with it; with a follower paused (SIGSTOP, not fenced yet) the
/// request times out (REQUEST_TIMED_OUT), and once it resumes a new request completes.
#[test]
fn delete_records_waits_for_every_live_replica() {
    delete_records_waits(gregor());
}

/// The same on Apache Kafka 4.4 (the reference: the same answers at the same moments).
/// `cargo test -p gregor --test replica_fetcher -- --ignored`.
#[test]
#[ignore = "the reference run on three Kafka JVMs; run by hand"]
fn delete_records_waits_for_every_live_replica_on_kafka() {
    if gregor_tests::reference::jars_or_skip() {
        delete_records_waits(Implementation::Kafka);
    }
}

fn delete_records_waits(implementation: Implementation) {
    // A paused follower stays registered and unfenced for the whole test.
    let config = ClusterConfig {
        implementation,
        ..config().with("broker.session.timeout.ms", "60000")
    };
    let mut cluster = Cluster::start(&config).unwrap_or_else(|e| panic!("{e:#}"));
    let b1 = cluster.node(1).bootstrap().expect("broker listener");
    create_topic(&b1, "deleted", 3);
    let (leader, _, _) = wait_for(Duration::from_secs(20), "a leader of deleted", || {
        leader_of(&b1, "deleted").filter(|(_, _, isr)| isr.len() == 3)
    });
    let lb = cluster.node(leader).bootstrap().expect("listener");
    assert_eq!(produce(&lb, "deleted", -1, 20, "r"), Ok(95));
    let followers: Vec<i32> = [1, 2, 3].into_iter().filter(|i| *i != leader).collect();

    assert_eq!(
        delete_records_rdkafka(&lb, "deleted", 40, Duration::from_secs(20)),
        Ok(40)
    );
    for id in &followers {
        let b = cluster.node(*id).bootstrap().expect("listener");
        assert_eq!(
            log_start_at(&b, "deleted"),
            Some(40),
            "follower {id} when DeleteRecords was answered"
        );
    }

    let paused = followers[0];
    cluster.node_mut(paused).pause().expect("SIGSTOP");
    let timed_out = delete_records_rdkafka(&lb, "deleted", 60, Duration::from_millis(1500));
    cluster.node_mut(paused).resume().expect("SIGCONT");
    assert_eq!(
        timed_out,
        Err(rdkafka::types::RDKafkaErrorCode::RequestTimedOut)
    );
    // The leader moved its own start already; the low watermark follows the resumed follower.
    assert_eq!(
        delete_records_rdkafka(&lb, "deleted", 60, Duration::from_secs(20)),
        Ok(60)
    );
    let b = cluster.node(paused).bootstrap().expect("listener");
    assert_eq!(log_start_at(&b, "deleted"), Some(60));
}
