//! Mixed clusters (issue 11): Apache Kafka 4.4.0 nodes in a gregor cluster and a gregor node
//! in a Kafka cluster, one partition replicated across both implementations
//! (`gregor_tests::mixed`). Skipped with a message when the Kafka jars cannot be fetched.
//! `cargo test -p gregor --test cluster_mixed -- --test-threads=1 --nocapture`.

use gregor_tests::cluster::{Cluster, ClusterConfig, Implementation, Layout};
use gregor_tests::mixed;
use gregor_tests::reference;

fn gregor() -> Implementation {
    Implementation::Gregor(env!("CARGO_BIN_EXE_gregor").into())
}

/// Three combined nodes of `main` and a broker-only node 4 of `broker`.
fn mixed_config(main: Implementation, broker: Implementation) -> ClusterConfig {
    ClusterConfig::new(
        main,
        Layout::CombinedAndBrokers {
            combined: 3,
            brokers: 1,
        },
    )
    .with_node_implementation(4, broker)
    .with("broker.session.timeout.ms", "4000")
    .with("broker.heartbeat.interval.ms", "500")
}

/// A Kafka 4.4.0 broker (process.roles=broker) in a cluster of three combined gregor nodes:
/// it registers with the gregor quorum, replays its metadata log and is unfenced (the cluster
/// is ready only when every broker is in Metadata), follows a gregor leader, leads with the
/// gregor brokers following, and loses nothing acknowledged when killed.
#[test]
fn kafka_broker_in_a_gregor_cluster() {
    if !reference::jars_or_skip() {
        return;
    }
    let mut cluster = Cluster::start(&mixed_config(gregor(), Implementation::Kafka))
        .unwrap_or_else(|e| panic!("{e:#}"));
    let m = mixed::replicate_across_implementations(&mut cluster, 1, 4, 2)
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(m.acknowledged >= 600, "{m:?}");
}

/// A gregor broker (process.roles=broker) in a cluster of three combined Kafka 4.4.0 nodes:
/// it registers with the Kafka quorum, replays Kafka's metadata log, follows a Kafka leader,
/// leads with Kafka brokers following, and loses nothing acknowledged when killed.
#[test]
fn gregor_broker_in_a_kafka_cluster() {
    if !reference::jars_or_skip() {
        return;
    }
    let mut cluster = Cluster::start(&mixed_config(Implementation::Kafka, gregor()))
        .unwrap_or_else(|e| panic!("{e:#}"));
    let m = mixed::replicate_across_implementations(&mut cluster, 1, 4, 2)
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(m.acknowledged >= 600, "{m:?}");
}

/// A Kafka broker that starts after the gregor quorum took snapshots and deleted the log
/// below them: it catches up through FetchSnapshot (gregor's snapshot, decoded by Kafka) and
/// lists every topic.
#[test]
fn kafka_broker_catches_up_from_a_gregor_snapshot() {
    if !reference::jars_or_skip() {
        return;
    }
    let mut config = mixed_config(gregor(), Implementation::Kafka);
    for (k, v) in mixed::SMALL_METADATA_LOG {
        config = config.with(k, v);
    }
    let mut cluster = Cluster::prepare(&config).unwrap_or_else(|e| panic!("{e:#}"));
    let m = mixed::late_broker_catches_up_from_a_snapshot(&mut cluster, 4, 300)
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(m.leader_log_start > 0, "{m:?}");
}

/// A gregor broker that starts after the Kafka quorum took snapshots and deleted the log
/// below them: it catches up through FetchSnapshot (Kafka's snapshot, decoded by gregor).
#[test]
fn gregor_broker_catches_up_from_a_kafka_snapshot() {
    if !reference::jars_or_skip() {
        return;
    }
    let mut config = mixed_config(Implementation::Kafka, gregor());
    for (k, v) in mixed::SMALL_METADATA_LOG {
        config = config.with(k, v);
    }
    let mut cluster = Cluster::prepare(&config).unwrap_or_else(|e| panic!("{e:#}"));
    let m = mixed::late_broker_catches_up_from_a_snapshot(&mut cluster, 4, 300)
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(m.leader_log_start > 0, "{m:?}");
}

/// A Kafka quorum that finalized a `metadata.version` gregor does not know (4.5-IV0, level
/// 34, Kafka's unstable next version): the gregor broker does not join; it exits at start-up
/// naming the feature, its level and the levels it supports (the Kafka controller would
/// answer its registration with a bare UNSUPPORTED_VERSION).
#[test]
fn gregor_broker_refuses_a_kafka_cluster_with_a_newer_metadata_version() {
    use std::time::{Duration, Instant};
    if !reference::jars_or_skip() {
        return;
    }
    let config = mixed_config(Implementation::Kafka, gregor())
        .with("unstable.feature.versions.enable", "true")
        .with_controller_format_args(&["--release-version", "4.5-IV0"]);
    let mut cluster = Cluster::prepare(&config).unwrap_or_else(|e| panic!("{e:#}"));
    cluster.format().unwrap_or_else(|e| panic!("{e:#}"));
    for id in 1..=4 {
        cluster.node_mut(id).spawn().unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let exited = loop {
        if let Err(e) = cluster.node_mut(4).check_alive() {
            break format!("{e:#}");
        }
        assert!(
            Instant::now() < deadline,
            "the gregor broker still runs:{}",
            cluster.logs(30)
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let log = std::fs::read_to_string(cluster.node(4).log_file()).unwrap_or_default();
    assert!(
        log.contains("the cluster finalized metadata.version at level 34, and this gregor broker supports levels 7 to 33"),
        "{exited}\n{}",
        log.lines().rev().take(30).collect::<Vec<_>>().join("\n")
    );
    eprintln!(
        "{}",
        log.lines()
            .filter(|l| l.contains("ERROR") || l.contains("error"))
            .take(5)
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// DescribeQuorum sent to the broker-only node of the other implementation is forwarded to
/// the active controller in an Envelope and answered as the controllers answer it: a gregor
/// broker forwarding to Kafka controllers, and a Kafka broker forwarding to gregor controllers
/// (whose Envelope handling must accept DescribeQuorum).
#[test]
fn describe_quorum_through_a_broker_of_the_other_implementation() {
    if !reference::jars_or_skip() {
        return;
    }
    for (main, broker) in [
        (Implementation::Kafka, gregor()),
        (gregor(), Implementation::Kafka),
    ] {
        let label = format!("{} broker, {} controllers", broker.name(), main.name());
        let cluster =
            Cluster::start(&mixed_config(main, broker)).unwrap_or_else(|e| panic!("{e:#}"));
        let (through, direct) = cluster.wait_for(
            std::time::Duration::from_secs(60),
            &format!("DescribeQuorum through node 4 ({label}) to agree with the controllers"),
            || {
                let direct = (1..=3).find_map(|n| cluster.describe_quorum_at_node(n))?;
                let through = cluster.describe_quorum_through_broker(4)?;
                let same = (through.leader_id, through.leader_epoch, &through.voters)
                    == (direct.leader_id, direct.leader_epoch, &direct.voters)
                    && through.observers == direct.observers;
                same.then_some((through, direct))
            },
        );
        assert_eq!(through.voters, [1, 2, 3], "{label}: {through:?} {direct:?}");
        assert_eq!(through.observers, [4], "{label}: {through:?} {direct:?}");
        println!("{label}: DescribeQuorum through node 4: {through:?}");
    }
}
