//! A failed log dir never stops a multi-dir broker (issue 14 item 4, KIP-112).
//!
//! - One broker with two log dirs, the second replaced by a file while stopped: it starts
//!   with that dir offline (`/ready` 503 naming it, `gregor_log_dir_offline{dir=…}` 1, one
//!   ERROR line), serves the first dir's partitions with every acknowledged record, creates
//!   no empty log elsewhere for the failed dir's partitions; a clean shutdown then writes the
//!   healthy dir's `.kafka_cleanshutdown`, and once the dir is back every partition is
//!   served and nothing is recovered.
//! - One broker whose second dir is made read-only at runtime (a read-only bind mount, root
//!   only: skipped otherwise): the first failed checkpoint write takes it offline, new
//!   partitions all go to the healthy dir, and a clean shutdown marks the healthy dir.
//! - Three brokers (RF 3) with two log dirs each: a broker restarted with its second dir
//!   read-only leads none of the partitions in that dir; their acknowledged records are read
//!   from the new leaders (root only).
//!
//! `cargo test -p gregor --test log_dir_failure -- --nocapture --test-threads=1`

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use gregor_protocol::batch::{BatchBuilder, Batches};
use gregor_protocol::records::decode_records;
use gregor_tests::cluster::{Cluster, ClusterConfig, ClusterOptions, Implementation, Layout, Node};
use gregor_tests::wire::{sb, KafkaConn};
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, CreateTopicsRequest, CreateTopicsResponse, DescribeLogDirsRequest,
    DescribeLogDirsResponse, FetchRequest, FetchResponse, MetadataRequest, MetadataResponse,
    ProduceRequest, ProduceResponse, TopicName,
};

const WAIT: Duration = Duration::from_secs(60);

fn gregor() -> Implementation {
    Implementation::Gregor(PathBuf::from(env!("CARGO_BIN_EXE_gregor")))
}

fn config(layout: Layout) -> ClusterConfig {
    ClusterConfig {
        implementation: gregor(),
        layout,
        properties: Vec::new(),
        node_implementations: Vec::new(),
        controller_format_args: Vec::new(),
    }
    .with("broker.heartbeat.interval.ms", "500")
    .with("replica.lag.time.max.ms", "3000")
    .with("replica.fetch.backoff.ms", "200")
    .with("replica.high.watermark.checkpoint.interval.ms", "500")
}

fn conn(bootstrap: &str) -> anyhow::Result<KafkaConn> {
    KafkaConn::connect_timeout(
        bootstrap.parse()?,
        Duration::from_secs(5),
        "log-dir-failure",
    )
}

fn create_topic(bootstrap: &str, topic: &str, partitions: i32, rf: i16) {
    let req = CreateTopicsRequest::default()
        .with_timeout_ms(30_000)
        .with_topics(vec![CreatableTopic::default()
            .with_name(TopicName(sb(topic)))
            .with_num_partitions(partitions)
            .with_replication_factor(rf)
            .with_configs(vec![CreatableTopicConfig::default()
                .with_name(sb("min.insync.replicas"))
                .with_value(Some(sb(if rf > 1 { "2" } else { "1" })))])]);
    let r: CreateTopicsResponse = conn(bootstrap)
        .and_then(|mut c| c.call(ApiKey::CreateTopics, 7, &req))
        .expect("CreateTopics answered");
    assert_eq!(r.topics[0].error_code, 0, "{r:?}");
}

/// Leader of each partition of `topic` (-1: none) as `bootstrap` sees it.
fn leaders(bootstrap: &str, topic: &str) -> Option<BTreeMap<i32, i32>> {
    let req = MetadataRequest::default()
        .with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(TopicName(sb(topic))))
        ]))
        .with_allow_auto_topic_creation(false);
    let m: MetadataResponse = conn(bootstrap)
        .ok()?
        .call(ApiKey::Metadata, 12, &req)
        .ok()?;
    let t = m.topics.first()?;
    Some(
        t.partitions
            .iter()
            .map(|p| (p.partition_index, p.leader_id.0))
            .collect(),
    )
}

fn value(topic: &str, partition: i32, tag: &str, r: usize) -> Vec<u8> {
    format!("{topic}-{partition}-{tag}-{r}").into_bytes()
}

/// One batch of 3 records to `topic`/`partition` with acks=all: the base offset or the error
/// code (-1: no answer).
fn produce(bootstrap: &str, topic: &str, partition: i32, tag: &str) -> Result<i64, i16> {
    let mut c = conn(bootstrap).map_err(|_| -1i16)?;
    let mut b = BatchBuilder::new(0, 1_000);
    for r in 0..3 {
        b = b.record(1_000, None, Some(&value(topic, partition, tag, r)), &[]);
    }
    let req = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(15_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(sb(topic)))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(partition)
                .with_records(Some(Bytes::from(b.build())))])]);
    let resp: ProduceResponse = c.call(ApiKey::Produce, 9, &req).map_err(|_| -1i16)?;
    let p = &resp.responses[0].partition_responses[0];
    if p.error_code != 0 {
        return Err(p.error_code);
    }
    Ok(p.base_offset)
}

/// Every record value of `topic`/`partition` up to the high watermark, read from `bootstrap`.
fn read_all(bootstrap: &str, topic: &str, partition: i32) -> Result<Vec<Vec<u8>>, String> {
    let mut out = Vec::new();
    let mut offset = 0;
    let mut c = conn(bootstrap).map_err(|e| e.to_string())?;
    loop {
        let req = FetchRequest::default()
            .with_replica_id(kafka_protocol::messages::BrokerId(-1))
            .with_max_wait_ms(0)
            .with_min_bytes(1)
            .with_max_bytes(8 << 20)
            .with_topics(vec![FetchTopic::default()
                .with_topic(TopicName(sb(topic)))
                .with_partitions(vec![FetchPartition::default()
                    .with_partition(partition)
                    .with_fetch_offset(offset)
                    .with_partition_max_bytes(4 << 20)])]);
        let r: FetchResponse = c.call(ApiKey::Fetch, 12, &req).map_err(|e| e.to_string())?;
        let p = &r.responses[0].partitions[0];
        if p.error_code != 0 {
            return Err(format!("fetch at {offset}: error {}", p.error_code));
        }
        let Some(records) = &p.records else { break };
        if records.is_empty() {
            break;
        }
        for item in Batches::new(records) {
            let (pos, h) = item.map_err(|e| e.to_string())?;
            let recs =
                decode_records(&records[pos..pos + h.total_size()]).map_err(|e| e.to_string())?;
            out.extend(
                recs.into_iter()
                    .map(|r| r.value.map(|v| v.to_vec()).unwrap_or_default()),
            );
            offset = h.next_offset();
        }
        if offset >= p.high_watermark {
            break;
        }
    }
    Ok(out)
}

fn admin_get(node: &Node, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", node.admin_port?)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    let status = raw.split_whitespace().nth(1)?.parse().ok()?;
    Some((
        status,
        raw.split_once("\r\n\r\n")
            .map_or("", |(_, b)| b)
            .to_string(),
    ))
}

/// The value of gauge `name` (with label `dir` = `dir` when given) on `node`'s `/metrics`.
fn metric(node: &Node, name: &str, dir: Option<&Path>) -> Option<f64> {
    let (_, body) = admin_get(node, "/metrics")?;
    let label = dir.map(|d| format!("dir=\"{}\"", d.display()));
    body.lines()
        .find(|l| {
            l.starts_with(name)
                && l[name.len()..].starts_with(['{', ' '])
                && label.as_ref().is_none_or(|want| l.contains(want.as_str()))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Waits until `/ready` answers 503 naming `dir` and `gregor_log_dir_offline{dir}` is 1.
fn wait_offline(cluster: &Cluster, node: &Node, dir: &Path) {
    let ready = cluster.wait_for(WAIT, "/ready to name the failed dir", || {
        admin_get(node, "/ready")
            .filter(|(s, body)| *s == 503 && body.contains(&dir.display().to_string()))
    });
    eprintln!("/ready: {} {}", ready.0, ready.1.trim());
    cluster.wait_for(WAIT, "gregor_log_dir_offline 1", || {
        metric(node, "gregor_log_dir_offline", Some(dir)).filter(|v| *v == 1.0)
    });
}

/// Waits until `node`'s directory assignments (KIP-858) are all accepted by the controller.
fn wait_assigned(cluster: &Cluster, node: &Node) {
    cluster.wait_for(WAIT, "the directory assignments", || {
        metric(node, "gregor_queued_replica_to_dir_assignments", None).filter(|v| *v == 0.0)
    });
}

/// The partitions of `topic` whose directories are in `dir`.
fn partitions_in(dir: &Path, topic: &str) -> Vec<i32> {
    let mut out: Vec<i32> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter_map(|e| {
                    e.file_name()
                        .to_str()?
                        .strip_prefix(&format!("{topic}-"))?
                        .parse()
                        .ok()
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort_unstable();
    out
}

fn log_text(node: &Node) -> String {
    std::fs::read_to_string(node.log_file()).unwrap_or_default()
}

/// Whether a read-only bind mount can be made (root or CAP_SYS_ADMIN).
fn read_only_mounts_supported() -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let guard = ReadOnly::mount(dir.path())?;
    drop(guard);
    Ok(())
}

/// A read-only bind mount of a directory on itself, undone when dropped.
struct ReadOnly(PathBuf);

impl ReadOnly {
    fn mount(dir: &Path) -> Result<Self, String> {
        let run = |args: &[&str]| -> Result<(), String> {
            let out = Command::new("mount")
                .args(args)
                .arg(dir)
                .arg(dir)
                .output()
                .map_err(|e| format!("cannot run mount: {e}"))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "mount {args:?} failed ({}): {} (a read-only bind mount needs root or \
                     CAP_SYS_ADMIN)",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
        };
        run(&["--bind"])?;
        let guard = ReadOnly(dir.to_path_buf());
        run(&["-o", "remount,ro,bind"])?;
        Ok(guard)
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn skip_without_mounts() -> bool {
    match read_only_mounts_supported() {
        Ok(()) => false,
        Err(why) => {
            eprintln!("SKIPPED: {why}");
            true
        }
    }
}

/// Produces one batch to every partition of `topic`; returns what each acknowledged.
fn produce_everywhere(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    tag: &str,
) -> BTreeMap<i32, Vec<Vec<u8>>> {
    (0..partitions)
        .map(|p| {
            produce(bootstrap, topic, p, tag)
                .unwrap_or_else(|e| panic!("produce to {topic}-{p}: error {e}"));
            (p, (0..3).map(|r| value(topic, p, tag, r)).collect())
        })
        .collect()
}

#[test]
fn a_dir_replaced_by_a_file_starts_offline_and_shuts_down_cleanly() {
    const TOPIC: &str = "dirfail";
    const PARTITIONS: i32 = 8;
    let mut cluster = Cluster::start_with(
        &config(Layout::Combined(1)),
        &ClusterOptions::default().with_log_dirs_per_broker(2),
    )
    .expect("cluster");
    let node_id = cluster.broker_ids()[0];
    let bootstrap = cluster.node(node_id).bootstrap().expect("a broker");
    let dirs = cluster.node(node_id).log_dirs().to_vec();
    let (good, bad) = (dirs[0].clone(), dirs[1].clone());
    create_topic(&bootstrap, TOPIC, PARTITIONS, 1);
    cluster.wait_for(WAIT, "every partition led", || {
        leaders(&bootstrap, TOPIC)
            .filter(|l| l.len() == PARTITIONS as usize && l.values().all(|x| *x >= 0))
    });
    let acked = produce_everywhere(&bootstrap, TOPIC, PARTITIONS, "a");
    wait_assigned(&cluster, cluster.node(node_id));
    cluster.node_mut(node_id).stop().expect("clean stop");
    let in_bad = partitions_in(&bad, TOPIC);
    let in_good = partitions_in(&good, TOPIC);
    assert!(
        !in_bad.is_empty() && !in_good.is_empty(),
        "{in_good:?} {in_bad:?}"
    );

    // The second dir becomes a file.
    let aside = bad.with_extension("aside");
    std::fs::rename(&bad, &aside).expect("moving the dir aside");
    std::fs::write(&bad, b"not a directory").expect("a file in its place");
    let before = log_text(cluster.node(node_id)).len();
    cluster.node_mut(node_id).spawn().expect("spawn");
    cluster
        .node_mut(node_id)
        .wait_listening(WAIT)
        .unwrap_or_else(|e| panic!("the broker starts with one dir failed: {e}"));
    wait_offline(&cluster, cluster.node(node_id), &bad);
    // DescribeLogDirs (kafka-log-dirs) answers KAFKA_STORAGE_ERROR for the failed dir.
    let described: DescribeLogDirsResponse = conn(&bootstrap)
        .and_then(|mut c| {
            c.call(
                ApiKey::DescribeLogDirs,
                4,
                &DescribeLogDirsRequest::default(),
            )
        })
        .expect("DescribeLogDirs");
    let codes: BTreeMap<String, i16> = described
        .results
        .iter()
        .map(|r| (r.log_dir.to_string(), r.error_code))
        .collect();
    assert_eq!(
        codes.get(&bad.display().to_string()),
        Some(&56),
        "{codes:?}"
    );
    assert_eq!(
        codes.get(&good.display().to_string()),
        Some(&0),
        "{codes:?}"
    );
    for p in &in_good {
        let got = cluster.wait_for(WAIT, "the healthy dir's partitions readable", || {
            read_all(&bootstrap, TOPIC, *p).ok()
        });
        assert_eq!(got, acked[p], "partition {p}");
        produce(&bootstrap, TOPIC, *p, "b").unwrap_or_else(|e| panic!("produce to {p}: {e}"));
    }
    for p in &in_bad {
        assert!(
            produce(&bootstrap, TOPIC, *p, "b").is_err(),
            "partition {p} of the failed dir accepted a write"
        );
    }
    assert_eq!(
        partitions_in(&good, TOPIC),
        in_good,
        "no empty log was created in the healthy dir for the failed dir's partitions"
    );
    let text = log_text(cluster.node(node_id))[before..].to_string();
    let errors: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("ERROR") && l.contains(&bad.display().to_string()))
        .collect();
    assert_eq!(errors.len(), 1, "one ERROR naming the dir: {errors:#?}");
    assert!(errors[0].contains("Not a directory"), "{}", errors[0]);

    // A clean shutdown marks the healthy dir.
    cluster
        .node_mut(node_id)
        .stop()
        .expect("clean stop with one dir failed");
    assert!(
        good.join(".kafka_cleanshutdown").exists(),
        "the healthy dir has its clean-shutdown marker"
    );

    // The dir is back: everything is served and nothing is recovered.
    std::fs::remove_file(&bad).expect("removing the file");
    std::fs::rename(&aside, &bad).expect("the dir back");
    let before = log_text(cluster.node(node_id)).len();
    cluster.node_mut(node_id).spawn().expect("spawn");
    cluster
        .node_mut(node_id)
        .wait_listening(WAIT)
        .expect("listening");
    cluster.wait_for(WAIT, "/ready 200", || {
        admin_get(cluster.node(node_id), "/ready").filter(|(s, _)| *s == 200)
    });
    for p in 0..PARTITIONS {
        let mut want = acked[&p].clone();
        if in_good.contains(&p) {
            want.extend((0..3).map(|r| value(TOPIC, p, "b", r)));
        }
        let got = cluster.wait_for(WAIT, "every partition readable", || {
            read_all(&bootstrap, TOPIC, p).ok()
        });
        assert_eq!(got, want, "partition {p}");
    }
    let text = log_text(cluster.node(node_id))[before..].to_string();
    assert!(
        !text.contains("no clean shutdown marker"),
        "a dir was recovered after the clean shutdown:\n{text}"
    );
    cluster.stop_all().expect("stop");
}

#[test]
fn a_dir_made_read_only_at_runtime_goes_offline_and_new_partitions_go_elsewhere() {
    if skip_without_mounts() {
        return;
    }
    const TOPIC: &str = "before";
    const NEW: &str = "after";
    let mut cluster = Cluster::start_with(
        &config(Layout::Combined(1)),
        &ClusterOptions::default().with_log_dirs_per_broker(2),
    )
    .expect("cluster");
    let node_id = cluster.broker_ids()[0];
    let bootstrap = cluster.node(node_id).bootstrap().expect("a broker");
    let dirs = cluster.node(node_id).log_dirs().to_vec();
    let (good, bad) = (dirs[0].clone(), dirs[1].clone());
    create_topic(&bootstrap, TOPIC, 4, 1);
    cluster.wait_for(WAIT, "every partition led", || {
        leaders(&bootstrap, TOPIC).filter(|l| l.len() == 4 && l.values().all(|x| *x >= 0))
    });
    let acked = produce_everywhere(&bootstrap, TOPIC, 4, "a");
    let in_good = partitions_in(&good, TOPIC);

    let ro = ReadOnly::mount(&bad).expect("read-only bind mount");
    // The next checkpoint (replica.high.watermark.checkpoint.interval.ms) fails on it.
    wait_offline(&cluster, cluster.node(node_id), &bad);

    create_topic(&bootstrap, NEW, 6, 1);
    cluster.wait_for(WAIT, "every new partition led", || {
        leaders(&bootstrap, NEW).filter(|l| l.len() == 6 && l.values().all(|x| *x >= 0))
    });
    assert_eq!(partitions_in(&good, NEW), (0..6).collect::<Vec<_>>());
    assert!(partitions_in(&bad, NEW).is_empty());
    let new_acked = produce_everywhere(&bootstrap, NEW, 6, "n");
    for p in 0..6 {
        assert_eq!(read_all(&bootstrap, NEW, p).expect("read"), new_acked[&p]);
    }
    for p in &in_good {
        produce(&bootstrap, TOPIC, *p, "b").unwrap_or_else(|e| panic!("produce to {p}: {e}"));
        let mut want = acked[p].clone();
        want.extend((0..3).map(|r| value(TOPIC, *p, "b", r)));
        assert_eq!(read_all(&bootstrap, TOPIC, *p).expect("read"), want);
    }
    let _ = std::fs::remove_file(good.join(".kafka_cleanshutdown"));
    cluster
        .node_mut(node_id)
        .stop()
        .expect("clean stop with one dir read-only");
    assert!(good.join(".kafka_cleanshutdown").exists());
    assert!(!bad.join(".kafka_cleanshutdown").exists());
    drop(ro);
    cluster.stop_all().expect("stop");
}

#[test]
fn a_broker_restarted_with_a_read_only_dir_leads_none_of_its_partitions() {
    if skip_without_mounts() {
        return;
    }
    const TOPIC: &str = "moved";
    const PARTITIONS: i32 = 6;
    let mut cluster = Cluster::start_with(
        &config(Layout::Split {
            controllers: 1,
            brokers: 3,
        }),
        &ClusterOptions::default().with_log_dirs_per_broker(2),
    )
    .expect("cluster");
    let ids = cluster.broker_ids();
    let at = |c: &Cluster, id: i32| c.node(id).bootstrap().expect("a broker");
    let bootstrap = ids.iter().map(|id| at(&cluster, *id)).collect::<Vec<_>>();
    create_topic(&bootstrap[0], TOPIC, PARTITIONS, 3);
    let leaders_before = cluster.wait_for(WAIT, "every partition led", || {
        leaders(&bootstrap[0], TOPIC)
            .filter(|l| l.len() == PARTITIONS as usize && l.values().all(|x| *x >= 0))
    });
    let mut acked = BTreeMap::new();
    for p in 0..PARTITIONS {
        let leader = at(&cluster, leaders_before[&p]);
        produce(&leader, TOPIC, p, "a").unwrap_or_else(|e| panic!("produce to {p}: {e}"));
        acked.insert(
            p,
            (0..3).map(|r| value(TOPIC, p, "a", r)).collect::<Vec<_>>(),
        );
    }
    for id in &ids {
        wait_assigned(&cluster, cluster.node(*id));
    }
    // The broker with the most partitions in its second dir.
    let (victim, in_bad) = ids
        .iter()
        .map(|id| (*id, partitions_in(&cluster.node(*id).log_dirs()[1], TOPIC)))
        .max_by_key(|(_, ps)| ps.len())
        .expect("brokers");
    assert!(!in_bad.is_empty());
    let bad = cluster.node(victim).log_dirs()[1].clone();
    cluster.node_mut(victim).stop().expect("clean stop");
    let ro = ReadOnly::mount(&bad).expect("read-only bind mount");
    cluster.node_mut(victim).spawn().expect("spawn");
    cluster
        .node_mut(victim)
        .wait_listening(WAIT)
        .expect("listening");
    wait_offline(&cluster, cluster.node(victim), &bad);
    // Give it the chance to lead: leadership is elected among the replicas whose dir is online.
    let now = cluster.wait_for(WAIT, "the failed dir's partitions led elsewhere", || {
        leaders(&at(&cluster, victim), TOPIC).filter(|l| {
            in_bad
                .iter()
                .all(|p| l.get(p).is_some_and(|x| *x >= 0 && *x != victim))
        })
    });
    for p in 0..PARTITIONS {
        let leader = at(&cluster, now[&p]);
        // A new leader's high watermark catches up once its followers fetch again.
        let got = cluster.wait_for(WAIT, "every partition readable", || {
            read_all(&leader, TOPIC, p)
                .ok()
                .filter(|g| g.len() >= acked[&p].len())
        });
        assert_eq!(got, acked[&p], "partition {p} (broker {victim}'s read-only dir held {in_bad:?}; leaders {leaders_before:?}, then {now:?})");
    }
    cluster.stop_all().expect("stop");
    drop(ro);
}
