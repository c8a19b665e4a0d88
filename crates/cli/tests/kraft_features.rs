//! UpdateFeatures (API 57) on a 3-node gregor cluster formatted at `--release-version 3.9`,
//! driven by Apache Kafka 4.4.0's `kafka-features`, through the brokers (forwarded to the
//! active controller) and through the controllers (`--bootstrap-controller`):
//! - `upgrade --dry-run` validates and changes nothing; `upgrade --metadata 4.4` and
//!   `upgrade --feature group.version=1` commit, and every node's ApiVersions (broker and
//!   controller listener) then finalizes the new levels;
//! - refused as Kafka refuses them, with Kafka's messages: a `metadata.version` downgrade
//!   across a metadata change, an unknown feature, a level the nodes do not support, ELR at
//!   level 1 below `metadata.version` 4.0-IV1; and, a departure, `upgrade --release-version`
//!   (it sends `kraft.version`, which gregor does not change);
//! - `disable --feature group.version` removes the feature;
//! - on the wire, an error is top-level only, a success at v1 has one result per feature and
//!   at v2 none.
//!
//! The same steps pass on three Apache Kafka 4.4.0 nodes (the ignored reference test), with
//! the same tool output but for the local controller's id.
//!
//! `cargo test -p gregor --test kraft_features -- --nocapture` (`-- --ignored` for Kafka)

use std::time::{Duration, Instant};

use gregor_protocol::kafka_protocol::messages::update_features_request::FeatureUpdateKey;
use gregor_protocol::kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, UpdateFeaturesRequest, UpdateFeaturesResponse,
};
use gregor_tests::cluster::{Cluster, ClusterConfig, Implementation};
use gregor_tests::reference::{self, tool_output};
use gregor_tests::wire::{sb, KafkaConn};

const FEATURES: &str = "org.apache.kafka.tools.FeatureCommand";
const INVALID_UPDATE_VERSION: i16 = 95;

/// Every listener of every node (broker and controller), as `host:port`.
fn listeners(cluster: &Cluster) -> Vec<String> {
    cluster
        .nodes()
        .iter()
        .flat_map(|n| [n.bootstrap(), n.controller_endpoint()])
        .flatten()
        .collect()
}

/// The finalized features a node's ApiVersions v3 answers: (name, level) sorted, and the epoch.
fn finalized(addr: &str) -> anyhow::Result<(Vec<(String, i16)>, i64)> {
    let mut conn = KafkaConn::connect(addr, "kraft-features")?;
    let req = ApiVersionsRequest::default()
        .with_client_software_name(sb("gregor-tests"))
        .with_client_software_version(sb("1"));
    let resp: ApiVersionsResponse = conn.call(ApiKey::ApiVersions, 3, &req)?;
    let mut levels: Vec<(String, i16)> = resp
        .finalized_features
        .iter()
        .map(|f| (f.name.to_string(), f.max_version_level))
        .collect();
    levels.sort();
    Ok((levels, resp.finalized_features_epoch))
}

/// Waits until every listener of the cluster finalizes `feature` at `level` (None: not set).
fn wait_everywhere(cluster: &Cluster, feature: &str, level: Option<i16>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    for addr in listeners(cluster) {
        loop {
            let seen = finalized(&addr)
                .map(|(l, _)| l.into_iter().find(|(n, _)| n == feature).map(|(_, v)| v));
            match seen {
                Ok(s) if s == level => break,
                other => assert!(
                    Instant::now() < deadline,
                    "{addr}: {feature} is {other:?}, expected {level:?}"
                ),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn features(args: &[&str]) -> String {
    let out = tool_output(FEATURES, args).expect("kafka-features");
    eprintln!("kafka-features {}:\n{out}", args.join(" "));
    out
}

fn update(feature: &str, level: i16, upgrade_type: i8) -> FeatureUpdateKey {
    FeatureUpdateKey::default()
        .with_feature(sb(feature))
        .with_max_version_level(level)
        .with_upgrade_type(upgrade_type)
}

#[test]
fn kafka_features_upgrades_downgrades_and_disables_on_a_gregor_cluster() {
    if !reference::jars_or_skip() {
        return;
    }
    upgrades_downgrades_and_disables(Implementation::Gregor(env!("CARGO_BIN_EXE_gregor").into()));
}

/// The same steps on three Apache Kafka 4.4.0 nodes: the oracle of the messages and levels the
/// gregor test expects (`--ignored`: three JVMs take a while).
#[test]
#[ignore = "reference run on Apache Kafka 4.4.0; run with --ignored"]
fn kafka_features_upgrades_downgrades_and_disables_on_a_kafka_cluster() {
    if !reference::jars_or_skip() {
        return;
    }
    upgrades_downgrades_and_disables(Implementation::Kafka);
}

fn upgrades_downgrades_and_disables(implementation: Implementation) {
    let gregor = matches!(implementation, Implementation::Gregor(_));
    let config = ClusterConfig::combined(implementation, 3)
        .with_controller_format_args(&["--release-version", "3.9"]);
    let mut cluster = Cluster::start(&config).expect("a 3-node cluster at 3.9");
    cluster
        .wait_ready(Duration::from_secs(60))
        .expect("cluster ready");
    let bootstrap = cluster.bootstrap();
    let controllers = cluster.bootstrap_controllers();
    let first = cluster.nodes()[0].bootstrap().expect("a broker listener");
    wait_everywhere(&cluster, "metadata.version", Some(21));
    wait_everywhere(&cluster, "group.version", None);

    // --dry-run: validated by the controller, nothing committed.
    let out = features(&[
        "--bootstrap-server",
        &bootstrap,
        "upgrade",
        "--feature",
        "group.version=1",
        "--dry-run",
    ]);
    assert!(
        out.contains("group.version can be upgraded to 1"),
        "dry run: {out}"
    );
    let (levels, _) = finalized(&first).expect("ApiVersions");
    assert!(
        !levels.iter().any(|(n, _)| n == "group.version"),
        "a dry run committed: {levels:?}"
    );

    // ELR 1 needs metadata.version 4.0-IV1 (23): refused at 3.9.
    let out = features(&[
        "--bootstrap-server",
        &bootstrap,
        "upgrade",
        "--feature",
        "eligible.leader.replicas.version=1",
    ]);
    assert!(
        out.contains(
            "eligible.leader.replicas.version could not be set to 1 because it depends on \
             metadata.version level 23"
        ),
        "{out}"
    );

    // --release-version also sends kraft.version=1, which gregor does not change on a static
    // quorum (a documented departure): the whole request is refused and nothing changes.
    let out = gregor.then(|| {
        features(&[
            "--bootstrap-server",
            &bootstrap,
            "upgrade",
            "--release-version",
            "4.4",
        ])
    });
    if let Some(out) = out {
        assert!(
            out.contains("gregor does not change kraft.version through UpdateFeatures."),
            "upgrade --release-version: {out}"
        );
        wait_everywhere(&cluster, "metadata.version", Some(21));
    }

    // The upgrade of metadata.version, through the controllers.
    let epoch_before = finalized(&first).expect("ApiVersions").1;
    let out = features(&[
        "--bootstrap-controller",
        &controllers,
        "upgrade",
        "--metadata",
        "4.4",
    ]);
    assert!(
        out.contains("metadata.version was upgraded to 33"),
        "upgrade --metadata 4.4: {out}"
    );
    wait_everywhere(&cluster, "metadata.version", Some(33));
    let (_, epoch_after) = finalized(&first).expect("ApiVersions");
    assert!(
        epoch_after > epoch_before,
        "{epoch_before} -> {epoch_after}"
    );

    // A feature through the brokers (forwarded from whichever node the tool reaches).
    let out = features(&[
        "--bootstrap-server",
        &bootstrap,
        "upgrade",
        "--feature",
        "group.version=1",
    ]);
    assert!(out.contains("group.version was upgraded to 1"), "{out}");
    wait_everywhere(&cluster, "group.version", Some(1));
    let out = features(&["--bootstrap-server", &bootstrap, "describe"]);
    assert!(
        out.lines()
            .any(|l| l.starts_with("Feature: metadata.version")
                && l.contains("FinalizedVersionLevel: 4.4-IV2")),
        "describe: {out}"
    );

    // A downgrade across a metadata change is refused, the level stays.
    let out = features(&[
        "--bootstrap-server",
        &bootstrap,
        "downgrade",
        "--metadata",
        "3.9",
    ]);
    assert!(
        out.contains(
            "Unsupported metadata.version downgrade from 33 to 21. Refusing to perform the \
             requested downgrade because it might delete metadata information."
        ),
        "downgrade: {out}"
    );
    // An unknown feature, a level no node supports.
    let out = features(&[
        "--bootstrap-server",
        &bootstrap,
        "upgrade",
        "--feature",
        "foo.version=1",
    ]);
    assert!(
        out.contains("Invalid update version 1 for feature foo.version.")
            && out.contains("does not support this feature."),
        "unknown feature: {out}"
    );
    let out = features(&[
        "--bootstrap-server",
        &bootstrap,
        "upgrade",
        "--feature",
        "group.version=2",
    ]);
    assert!(
        out.contains("Invalid update version 2 for feature group.version.")
            && out.contains("only supports versions 0-1"),
        "unsupported level: {out}"
    );
    wait_everywhere(&cluster, "metadata.version", Some(33));

    // Now ELR can be enabled; it makes the cluster's min.insync.replicas explicit.
    let out = features(&[
        "--bootstrap-server",
        &bootstrap,
        "upgrade",
        "--feature",
        "eligible.leader.replicas.version=1",
    ]);
    assert!(
        out.contains("eligible.leader.replicas.version was upgraded to 1"),
        "{out}"
    );
    wait_everywhere(&cluster, "eligible.leader.replicas.version", Some(1));
    let out = tool_output(
        "kafka-configs",
        &[
            "--bootstrap-server",
            &bootstrap,
            "--entity-type",
            "brokers",
            "--entity-default",
            "--describe",
        ],
    )
    .expect("kafka-configs");
    assert!(
        out.contains("min.insync.replicas=1"),
        "cluster configs: {out}"
    );

    // disable: level 0 removes the feature.
    let out = features(&[
        "--bootstrap-server",
        &bootstrap,
        "disable",
        "--feature",
        "group.version",
    ]);
    assert!(out.contains("group.version was disabled"), "{out}");
    wait_everywhere(&cluster, "group.version", None);

    // The wire answer at v1 (results per feature) and v2 (top-level only), from every broker
    // listener: two of them forward to the active controller.
    for node in cluster.nodes() {
        let Some(addr) = node.bootstrap() else {
            continue;
        };
        let mut conn = KafkaConn::connect(&addr, "kraft-features").expect("connect");
        let req = UpdateFeaturesRequest::default()
            .with_timeout_ms(30_000)
            .with_validate_only(true)
            .with_feature_updates(vec![
                update("group.version", 1, 1),
                update("metadata.version", 32, 2),
            ]);
        let v1: UpdateFeaturesResponse = conn
            .call(ApiKey::UpdateFeatures, 1, &req)
            .expect("UpdateFeatures v1");
        assert_eq!(v1.error_code, INVALID_UPDATE_VERSION, "{addr}: {v1:?}");
        assert!(
            v1.error_message.as_deref().is_some_and(|m| m.starts_with(
                "The update failed for all features since the following feature had an error: "
            )),
            "{v1:?}"
        );
        assert!(
            v1.results.is_empty(),
            "an error has no per-feature results: {v1:?}"
        );
        let v2: UpdateFeaturesResponse = conn
            .call(ApiKey::UpdateFeatures, 2, &req)
            .expect("UpdateFeatures v2");
        assert_eq!(v2.error_code, INVALID_UPDATE_VERSION, "{addr}: {v2:?}");
        assert!(v2.results.is_empty(), "{v2:?}");
        let ok = UpdateFeaturesRequest::default()
            .with_timeout_ms(30_000)
            .with_validate_only(true)
            .with_feature_updates(vec![update("group.version", 1, 1)]);
        let v1: UpdateFeaturesResponse = conn
            .call(ApiKey::UpdateFeatures, 1, &ok)
            .expect("UpdateFeatures v1");
        assert_eq!(v1.error_code, 0, "{addr}: {v1:?}");
        assert_eq!(v1.results.len(), 1, "{v1:?}");
        assert_eq!(v1.results[0].error_code, 0);
        let v2: UpdateFeaturesResponse = conn
            .call(ApiKey::UpdateFeatures, 2, &ok)
            .expect("UpdateFeatures v2");
        assert_eq!(v2.error_code, 0, "{addr}: {v2:?}");
        assert!(v2.results.is_empty(), "{v2:?}");
    }
    // validate_only committed nothing.
    wait_everywhere(&cluster, "group.version", None);
    cluster.stop_all().expect("stopping the cluster");
}

/// A dynamic quorum (`controller.quorum.bootstrap.servers`, formatted `--standalone`, KIP-853)
/// runs `kraft.version` 1: ApiVersions finalizes it, and `upgrade --release-version 4.4`, which
/// sends `kraft.version=1` with every other feature, is accepted (the level in force).
#[test]
fn a_dynamic_quorum_takes_upgrade_release_version() {
    use std::net::SocketAddr;
    use std::process::{Command, Stdio};

    use gregor_tests::process::{free_ports, wait_for_broker, ChildGuard};

    if !reference::jars_or_skip() {
        return;
    }
    const BIN: &str = env!("CARGO_BIN_EXE_gregor");
    let root = tempfile::tempdir().expect("a temp dir");
    let ports = free_ports(3).expect("free ports");
    let props = root.path().join("server.properties");
    std::fs::write(
        &props,
        format!(
            "node.id=1\nprocess.roles=broker,controller\n\
             listeners=PLAINTEXT://127.0.0.1:{},CONTROLLER://127.0.0.1:{}\n\
             controller.listener.names=CONTROLLER\n\
             controller.quorum.bootstrap.servers=127.0.0.1:{}\n\
             log.dirs={}\nadmin.listener=127.0.0.1:{}\n",
            ports[0],
            ports[1],
            ports[1],
            root.path().join("data").display(),
            ports[2],
        ),
    )
    .expect("writing properties");
    let out = Command::new(BIN)
        .args([
            "storage",
            "format",
            "-t",
            "Dyn4mic-FeaturesTestAAw",
            "--standalone",
        ])
        .args(["--release-version", "3.9", "-c"])
        .arg(&props)
        .output()
        .expect("gregor storage format");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log_path = root.path().join("gregor.log");
    let log = std::fs::File::create(&log_path).expect("log");
    let child = Command::new(BIN)
        .arg("serve")
        .arg("--config")
        .arg(&props)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("gregor serve");
    let mut guard = ChildGuard::new("gregor", child);
    let addr: SocketAddr = format!("127.0.0.1:{}", ports[0]).parse().expect("address");
    wait_for_broker(addr, 60_000, || guard.check_alive()).unwrap_or_else(|e| {
        panic!(
            "gregor did not serve: {e:#}\n{}",
            std::fs::read_to_string(&log_path).unwrap_or_default()
        )
    });
    let bootstrap = addr.to_string();
    let (levels, _) = finalized(&bootstrap).expect("ApiVersions");
    assert!(
        levels.contains(&("kraft.version".to_string(), 1))
            && levels.contains(&("metadata.version".to_string(), 21)),
        "{levels:?}"
    );
    let out = features(&[
        "--bootstrap-server",
        &bootstrap,
        "upgrade",
        "--release-version",
        "4.4",
    ]);
    assert!(out.contains("metadata.version was upgraded to 33"), "{out}");
    let (levels, _) = finalized(&bootstrap).expect("ApiVersions");
    for (name, level) in [
        ("metadata.version", 33),
        ("kraft.version", 1),
        ("group.version", 1),
        ("eligible.leader.replicas.version", 1),
    ] {
        assert!(
            levels.contains(&(name.to_string(), level)),
            "{name} {level}: {levels:?}"
        );
    }
}
