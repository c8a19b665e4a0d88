//! Mixed clusters (issue 11): Apache Kafka 4.4.0 nodes in a gregor cluster and the reverse.

use gregor_tests::cluster::{Cluster, ClusterConfig, Implementation, Layout};
use gregor_tests::reference;

fn gregor() -> Implementation {
    Implementation::Gregor(env!("CARGO_BIN_EXE_gregor").into())
}

#[test]
#[ignore]
fn explore_kafka_broker_in_gregor_cluster() {
    if !reference::jars_or_skip() {
        return;
    }
    let config = ClusterConfig::new(
        gregor(),
        Layout::CombinedAndBrokers {
            combined: 3,
            brokers: 1,
        },
    )
    .with_node_implementation(4, Implementation::Kafka)
    .with("broker.session.timeout.ms", "4000")
    .with("broker.heartbeat.interval.ms", "500");
    let mut cluster = Cluster::prepare(&config).unwrap();
    cluster.format().unwrap();
    for id in 1..=4 {
        cluster.node_mut(id).spawn().unwrap();
    }
    let r = cluster.wait_ready(std::time::Duration::from_secs(60));
    let _ = std::fs::remove_dir_all("/tmp/mixed/explore");
    let _ = std::process::Command::new("cp").arg("-r").arg(cluster.root()).arg("/tmp/mixed/explore").status();
    r.unwrap();
}
