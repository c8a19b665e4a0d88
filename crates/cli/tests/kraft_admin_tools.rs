//! Apache Kafka 4.4.0's admin tools against a 3-node gregor cluster, through the brokers
//! (`--bootstrap-server`) and through the controllers (`--bootstrap-controller`, KIP-919):
//! - `kafka-features describe` lists every feature gregor supports with its supported range and
//!   the cluster's finalized level (ApiVersions v3+ SupportedFeatures / FinalizedFeatures,
//!   KIP-584); before, the tool printed nothing;
//! - `kafka-configs --bootstrap-controller` alters a cluster-wide broker default and describes
//!   it back from a controller (DescribeConfigs on the controller listener; before,
//!   UnsupportedVersionException "The node does not support DESCRIBE_CONFIGS"), and the brokers
//!   see the same value.
//!
//! `cargo test -p gregor --test kraft_admin_tools -- --nocapture`

use std::time::{Duration, Instant};

use gregor_tests::cluster::{Cluster, ClusterConfig, Implementation};
use gregor_tests::reference::{self, tool_output};

const FEATURES: &str = "org.apache.kafka.tools.FeatureCommand";

fn cluster() -> Cluster {
    let config = ClusterConfig::combined(
        Implementation::Gregor(env!("CARGO_BIN_EXE_gregor").into()),
        3,
    );
    let mut cluster = Cluster::start(&config).expect("starting a 3-node gregor cluster");
    cluster
        .wait_ready(Duration::from_secs(60))
        .expect("cluster ready");
    cluster
}

/// The `Feature: <name> SupportedMinVersion: a SupportedMaxVersion: b FinalizedVersionLevel: c`
/// lines of `kafka-features describe`, as (name, min, max, finalized).
fn feature_lines(out: &str) -> Vec<(String, String, String, String)> {
    out.lines()
        .filter(|l| l.starts_with("Feature:"))
        .map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let after = |key: &str| {
                words
                    .iter()
                    .position(|w| *w == key)
                    .and_then(|i| words.get(i + 1))
                    .map(|s| (*s).to_string())
                    .unwrap_or_default()
            };
            (
                after("Feature:"),
                after("SupportedMinVersion:"),
                after("SupportedMaxVersion:"),
                after("FinalizedVersionLevel:"),
            )
        })
        .collect()
}

#[test]
fn kafka_features_and_kafka_configs_through_brokers_and_controllers() {
    if !reference::jars_or_skip() {
        return;
    }
    let mut cluster = cluster();
    let bootstrap = cluster.bootstrap();
    let controllers = cluster.bootstrap_controllers();

    // kafka-features describe, both ways: the same features, metadata.version finalized.
    let mut described = Vec::new();
    for (flag, address) in [
        ("--bootstrap-server", &bootstrap),
        ("--bootstrap-controller", &controllers),
    ] {
        let out = tool_output(FEATURES, &[flag, address, "describe"]).expect("kafka-features");
        let lines = feature_lines(&out);
        let names: Vec<&str> = lines.iter().map(|l| l.0.as_str()).collect();
        for expected in [
            "metadata.version",
            "kraft.version",
            "group.version",
            "transaction.version",
            "eligible.leader.replicas.version",
        ] {
            assert!(
                names.contains(&expected),
                "{flag}: {expected} missing from kafka-features describe:\n{out}"
            );
        }
        let mv = lines
            .iter()
            .find(|l| l.0 == "metadata.version")
            .expect("metadata.version line");
        assert!(
            mv.3.starts_with("4.") && mv.2.starts_with("4."),
            "{flag}: metadata.version finalized at a 4.x level within the supported range: {mv:?}\n{out}"
        );
        described.push(lines);
    }
    assert_eq!(
        described[0], described[1],
        "brokers and controllers describe the same features"
    );

    // kafka-configs through a controller: alter a cluster-wide default, describe it back from
    // the controllers and from the brokers.
    let out = tool_output(
        "kafka-configs",
        &[
            "--bootstrap-controller",
            &controllers,
            "--alter",
            "--entity-type",
            "brokers",
            "--entity-default",
            "--add-config",
            "log.retention.ms=123456",
        ],
    )
    .expect("kafka-configs --alter");
    assert!(
        out.contains("Completed updating default config for brokers"),
        "alter through the controller: {out}"
    );
    for (flag, address) in [
        ("--bootstrap-controller", &controllers),
        ("--bootstrap-server", &bootstrap),
    ] {
        // The brokers apply the committed change from the metadata log; give them a moment.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let out = tool_output(
                "kafka-configs",
                &[
                    flag,
                    address,
                    "--describe",
                    "--entity-type",
                    "brokers",
                    "--entity-default",
                ],
            )
            .expect("kafka-configs --describe");
            if out.contains("log.retention.ms=123456") {
                assert!(!out.contains("Exception"), "{flag}: describe failed: {out}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{flag}: the cluster-wide default is not described: {out}"
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }
    // One broker's own configs, asked of a controller.
    let out = tool_output(
        "kafka-configs",
        &[
            "--bootstrap-controller",
            &controllers,
            "--describe",
            "--entity-type",
            "brokers",
            "--entity-name",
            "1",
            "--all",
        ],
    )
    .expect("kafka-configs --describe --all");
    assert!(
        out.contains("All configs for broker 1 are:") && out.contains("log.retention.ms="),
        "all configs of broker 1 from a controller: {out}"
    );
    cluster.stop_all().expect("stopping the cluster");
}
