//! Replication throttles (KIP-73) on a 3-node gregor cluster, driven by Apache Kafka 4.4.0's
//! `kafka-reassign-partitions` and `kafka-configs`: a partition holding 6 MiB on broker 1 is
//! reassigned to brokers 1 and 2 with `--execute --throttle 1000000`. The tool sets
//! `leader.replication.throttled.rate` / `follower.replication.throttled.rate` on both brokers
//! and the topic's `leader.replication.throttled.replicas=0:1` /
//! `follower.replication.throttled.replicas=0:2`; broker 2 then catches up at about 1 MB/s
//! (measured from the size of its copy of the log over time, DescribeLogDirs on broker 2),
//! an acks=all produce meanwhile is not held back by the throttled out-of-sync replica, and
//! once the reassignment is done `--verify` exits 0 and removes every throttle config.
//!
//! `cargo test -p gregor --test replication_throttle -- --nocapture` (needs `cargo xtask kafka`).

use std::process::Stdio;
use std::time::{Duration, Instant};

use bytes::Bytes;
use gregor_protocol::batch::BatchBuilder;
use gregor_tests::cluster::{Cluster, ClusterConfig, Implementation};
use gregor_tests::reference::{tool_command, tool_output};
use gregor_tests::wire::{sb, KafkaConn};
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, DescribeConfigsRequest, DescribeConfigsResponse, DescribeLogDirsRequest,
    DescribeLogDirsResponse, ProduceRequest, ProduceResponse, TopicName,
};

const REASSIGN: &str = "org.apache.kafka.tools.reassign.ReassignPartitionsCommand";
const TOPIC: &str = "throttled";
/// Bytes per second given to `--throttle`.
const THROTTLE: f64 = 1_000_000.0;
/// Record value size and count: 6 MiB of values (plus record and batch headers).
const VALUE: usize = 1024;
const RECORDS: usize = 6 * 1024;

fn gregor() -> Implementation {
    Implementation::Gregor(env!("CARGO_BIN_EXE_gregor").into())
}

fn conn(bootstrap: &str) -> KafkaConn {
    KafkaConn::connect_timeout(
        bootstrap.parse().expect("an address"),
        Duration::from_secs(10),
        "throttle-test",
    )
    .expect("connect")
}

/// Produces `n` records of `VALUE` bytes to partition 0 in batches of 64, acks=all; returns
/// how long the last produce took.
fn produce(bootstrap: &str, n: usize) -> Duration {
    let mut c = conn(bootstrap);
    let mut last = Duration::ZERO;
    let value: Vec<u8> = (0..VALUE).map(|i| (i * 7 % 251) as u8).collect();
    for chunk in 0..n.div_ceil(64) {
        let mut b = BatchBuilder::new(0, 1_000);
        for _ in 0..64.min(n - chunk * 64) {
            b = b.record(1_000, None, Some(&value), &[]);
        }
        let req = ProduceRequest::default()
            .with_acks(-1)
            .with_timeout_ms(30_000)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(TopicName(sb(TOPIC)))
                .with_partition_data(vec![PartitionProduceData::default()
                    .with_index(0)
                    .with_records(Some(Bytes::from(b.build())))])]);
        let started = Instant::now();
        let resp: ProduceResponse = c.call(ApiKey::Produce, 9, &req).expect("Produce");
        last = started.elapsed();
        assert_eq!(resp.responses[0].partition_responses[0].error_code, 0);
    }
    last
}

/// The size in bytes of broker `bootstrap`'s copy of partition 0, None when it has none.
fn local_size(bootstrap: &str) -> Option<i64> {
    let r: DescribeLogDirsResponse = conn(bootstrap)
        .call(
            ApiKey::DescribeLogDirs,
            4,
            &DescribeLogDirsRequest::default().with_topics(None),
        )
        .expect("DescribeLogDirs");
    r.results
        .iter()
        .flat_map(|d| d.topics.iter())
        .filter(|t| t.name.0.as_str() == TOPIC)
        .flat_map(|t| t.partitions.iter())
        .find(|p| p.partition_index == 0)
        .map(|p| p.partition_size)
}

/// The configs of a resource (2 = topic, 4 = broker) that are set, as `name=value`.
fn set_configs(bootstrap: &str, resource_type: i8, name: &str) -> Vec<String> {
    let r: DescribeConfigsResponse = conn(bootstrap)
        .call(
            ApiKey::DescribeConfigs,
            4,
            &DescribeConfigsRequest::default().with_resources(vec![
                DescribeConfigsResource::default()
                    .with_resource_type(resource_type)
                    .with_resource_name(sb(name)),
            ]),
        )
        .expect("DescribeConfigs");
    assert_eq!(
        r.results[0].error_code, 0,
        "{:?}",
        r.results[0].error_message
    );
    r.results[0]
        .configs
        .iter()
        // 1 = DYNAMIC_TOPIC_CONFIG, 2 = DYNAMIC_BROKER_CONFIG.
        .filter(|c| c.config_source == 1 || c.config_source == 2)
        .map(|c| {
            format!(
                "{}={}",
                c.name.as_str(),
                c.value.as_ref().map_or("", |v| v.as_str())
            )
        })
        .collect()
}

/// Runs `kafka-reassign-partitions` with `args`; (exit success, output).
fn reassign(args: &[&str]) -> (bool, String) {
    let out = tool_command(
        REASSIGN,
        &args.iter().map(|a| (*a).to_string()).collect::<Vec<_>>(),
    )
    .expect("kafka-reassign-partitions")
    .stdin(Stdio::null())
    .output()
    .expect("run kafka-reassign-partitions");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// The value of the series `series` (name and labels as exposed) on node `node`'s `/metrics`.
fn metric(cluster: &Cluster, node: i32, series: &str) -> f64 {
    use std::io::{Read, Write};
    let port = cluster.node(node).admin_port.expect("an admin listener");
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("admin listener");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .expect("request");
    let mut body = String::new();
    s.read_to_string(&mut body).expect("response");
    body.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
        .unwrap_or_else(|| panic!("no {series} on node {node}: {body}"))
}

#[test]
fn reassignment_with_throttle_catches_up_at_the_throttled_rate_and_verify_clears_it() {
    let cluster = Cluster::start(
        &ClusterConfig::combined(gregor(), 3)
            .with("broker.heartbeat.interval.ms", "500")
            // Smaller fetches and a shorter pause after a throttled round: the rate is
            // followed closely rather than in 1 MiB steps.
            .with("replica.fetch.max.bytes", "131072")
            .with("replica.fetch.backoff.ms", "100"),
    )
    .expect("a 3-node cluster");
    let b1 = cluster.node(1).bootstrap().expect("broker 1");
    let b2 = cluster.node(2).bootstrap().expect("broker 2");
    let out = tool_output(
        "kafka-topics",
        &[
            "--bootstrap-server",
            &b1,
            "--create",
            "--topic",
            TOPIC,
            "--replica-assignment",
            "1",
        ],
    )
    .expect("kafka-topics");
    assert!(out.contains("Created topic"), "{out}");
    produce(&b1, RECORDS);
    let total = local_size(&b1).expect("broker 1 holds the partition");
    assert!(total > 6 << 20, "{total} bytes");

    let dir = tempfile::tempdir().expect("a temp dir");
    let plan = dir.path().join("plan.json");
    std::fs::write(
        &plan,
        format!(
            r#"{{"version":1,"partitions":[{{"topic":"{TOPIC}","partition":0,"replicas":[1,2]}}]}}"#
        ),
    )
    .expect("write the plan");
    let plan = plan.display().to_string();
    let (ok, out) = reassign(&[
        "--bootstrap-server",
        &b1,
        "--reassignment-json-file",
        &plan,
        "--execute",
        "--throttle",
        "1000000",
    ]);
    assert!(ok, "{out}");
    assert!(
        out.contains("The inter-broker throttle limit was set to 1000000 B/s"),
        "{out}"
    );
    // Broker 2's copy over time, sampled from now on (Kafka's tools below take seconds to
    // start): until it passes total - 1 MiB.
    let high = total - (1 << 20);
    let sampler = {
        let b2 = b2.clone();
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(90);
            let mut samples = Vec::new();
            loop {
                let size = local_size(&b2).unwrap_or(0);
                let now = Instant::now();
                samples.push((now, size));
                if size >= high || now > deadline {
                    return samples;
                }
                // Another process's progress: sampled, nothing to wait on.
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };

    // The throttles are set where Kafka's tool puts them.
    for (node, b) in [(1, &b1), (2, &b2)] {
        let set = set_configs(b, 4, &node.to_string());
        for rate in ["leader", "follower"] {
            assert!(
                set.contains(&format!("{rate}.replication.throttled.rate=1000000")),
                "broker {node}: {set:?}"
            );
        }
    }
    let set = set_configs(&b1, 2, TOPIC);
    assert!(
        set.contains(&"leader.replication.throttled.replicas=0:1".to_string())
            && set.contains(&"follower.replication.throttled.replicas=0:2".to_string()),
        "{set:?}"
    );
    let described = tool_output(
        "kafka-configs",
        &[
            "--bootstrap-server",
            &b1,
            "--entity-type",
            "brokers",
            "--entity-name",
            "2",
            "--describe",
        ],
    )
    .expect("kafka-configs");
    assert!(
        described.contains("follower.replication.throttled.rate=1000000")
            && described
                .contains("DYNAMIC_BROKER_CONFIG:leader.replication.throttled.rate=1000000"),
        "{described}"
    );

    // The throttled replica out of the ISR holds nothing back: acks=all answers at once.
    let acks_all = produce(&b1, 8);
    assert!(
        acks_all < Duration::from_secs(2),
        "acks=all took {acks_all:?}"
    );

    // The catch-up rate from 1 MiB to total - 1 MiB.
    let samples = sampler.join().expect("the sampler");
    let low = 1i64 << 20;
    let first = samples[0].0;
    let shown: Vec<(u128, i64)> = samples
        .iter()
        .map(|(t, s)| (t.duration_since(first).as_millis(), *s))
        .collect();
    let t_low = samples.iter().find(|(_, s)| *s >= low).copied();
    let t_high = samples.iter().find(|(_, s)| *s >= high).copied();
    assert!(
        t_high.is_some(),
        "broker 2 did not catch up: {shown:?}\n{}",
        cluster.logs(200)
    );
    let (t0, s0) = t_low.expect("passed the low mark");
    let (t1, s1) = t_high.expect("passed the high mark");
    let secs = t1.duration_since(t0).as_secs_f64().max(0.001);
    let rate = (s1 - s0) as f64 / secs;
    println!(
        "throttled catch-up: {} bytes in {secs:.2} s = {rate:.0} B/s (throttle {THROTTLE})",
        s1 - s0
    );
    assert!(
        rate > 0.4 * THROTTLE && rate < 2.0 * THROTTLE,
        "catch-up rate {rate:.0} B/s under a {THROTTLE} B/s throttle: {shown:?}"
    );

    // The throttles show in the metrics: bytes sent by the leader and fetched by the follower
    // for the throttled partition, and rounds held back on both sides.
    let leader_bytes = metric(
        &cluster,
        1,
        "gregor_replication_throttled_bytes_total{type=\"leader\"}",
    );
    let follower_bytes = metric(
        &cluster,
        2,
        "gregor_replication_throttled_bytes_total{type=\"follower\"}",
    );
    assert!(leader_bytes >= (s1 as f64), "leader sent {leader_bytes}");
    assert!(
        follower_bytes >= (s1 as f64),
        "follower fetched {follower_bytes}"
    );
    let held_back = metric(
        &cluster,
        1,
        "gregor_replication_throttled_total{type=\"leader\"}",
    ) + metric(
        &cluster,
        2,
        "gregor_replication_throttled_total{type=\"follower\"}",
    );
    assert!(held_back > 0.0);

    // Once broker 2 is in the ISR the reassignment completes and --verify clears the throttles.
    let deadline = Instant::now() + Duration::from_secs(60);
    let out = loop {
        let (ok, out) = reassign(&[
            "--bootstrap-server",
            &b1,
            "--reassignment-json-file",
            &plan,
            "--verify",
        ]);
        if out.contains(&format!("Reassignment of partition {TOPIC}-0 is completed")) {
            assert!(ok, "--verify failed: {out}");
            break out;
        }
        assert!(Instant::now() < deadline, "not completed: {out}");
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(out.contains("Clearing broker-level throttles"), "{out}");
    assert!(out.contains("Clearing topic-level throttles"), "{out}");
    for (node, b) in [(1, &b1), (2, &b2)] {
        let set = set_configs(b, 4, &node.to_string());
        assert!(
            !set.iter().any(|c| c.contains("throttled")),
            "broker {node}: {set:?}"
        );
    }
    let set = set_configs(&b1, 2, TOPIC);
    assert!(!set.iter().any(|c| c.contains("throttled")), "{set:?}");
    assert_eq!(local_size(&b2), local_size(&b1));
}
