//! Dynamic broker configs (KIP-226) and group configs (KIP-848, `ConfigResource` type GROUP =
//! 32) answered as Apache Kafka 4.4.0 answers them: the same IncrementalAlterConfigs,
//! AlterConfigs and DescribeConfigs requests go to gregor and, when its jars are present, to a
//! Kafka 4.4.0 broker, and the answers (error codes and messages, described values and
//! sources) must be the same list. Cases come from librdkafka's 0081_admin (broker configs
//! gregor does not act on, such as `background.threads` and
//! `sasl.kerberos.min.time.before.relogin`, and the GROUP resource) and from Kafka's rules:
//! read-only configs, per-broker-only configs at the cluster default, types and ranges,
//! unknown names, the group configs' bounds from the broker's `group.*` configs.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use gregor_tests::process::{free_port, ChildGuard};
use gregor_tests::reference::{self, Instance};
use gregor_tests::wire::{sb, KafkaConn};
use gregor_tests::Gregor;
use kafka_protocol::messages::alter_configs_request::{AlterConfigsResource, AlterableConfig};
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::incremental_alter_configs_request::{
    AlterConfigsResource as IncrementalResource, AlterableConfig as IncrementalConfig,
};
use kafka_protocol::messages::{
    AlterConfigsRequest, AlterConfigsResponse, ApiKey, ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse, DescribeConfigsRequest, DescribeConfigsResponse,
    FindCoordinatorRequest, FindCoordinatorResponse, GroupId, IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse, TopicName,
};

const BIN: &str = env!("CARGO_BIN_EXE_gregor");
const BROKER: i8 = 4;
const GROUP: i8 = 32;
const SET: i8 = 0;
const DELETE: i8 = 1;
const APPEND: i8 = 2;
const SUBTRACT: i8 = 3;

/// A request of the script.
enum Step {
    /// IncrementalAlterConfigs v1 of one resource: (type, name, [(key, op, value)]).
    Incremental(
        i8,
        &'static str,
        &'static [(&'static str, i8, Option<&'static str>)],
    ),
    /// AlterConfigs v2 of one resource: (type, name, [(key, value)]).
    Alter(i8, &'static str, &'static [(&'static str, &'static str)]),
    /// DescribeConfigs v4 of the keys of one resource: (type, name, keys).
    Describe(i8, &'static str, &'static [&'static str]),
}

use Step::{Alter, Describe, Incremental};

/// The script: each step's answer is compared.
const SCRIPT: &[Step] = &[
    // librdkafka 0081: broker configs gregor does not act on, per broker and cluster-wide.
    Incremental(
        BROKER,
        "1",
        &[
            ("background.threads", SET, Some("9")),
            ("log.cleanup.policy", APPEND, Some("compact")),
        ],
    ),
    Describe(BROKER, "1", &["background.threads", "log.cleanup.policy"]),
    Incremental(
        BROKER,
        "1",
        &[
            ("background.threads", DELETE, Some("")),
            ("log.cleanup.policy", SUBTRACT, Some("compact")),
        ],
    ),
    Describe(BROKER, "1", &["background.threads", "log.cleanup.policy"]),
    Alter(
        BROKER,
        "1",
        &[("sasl.kerberos.min.time.before.relogin", "58000")],
    ),
    Describe(BROKER, "1", &["sasl.kerberos.min.time.before.relogin"]),
    Incremental(
        BROKER,
        "1",
        &[("sasl.kerberos.min.time.before.relogin", SET, Some("58000"))],
    ),
    Incremental(
        BROKER,
        "1",
        &[("sasl.kerberos.min.time.before.relogin", DELETE, None)],
    ),
    Incremental(BROKER, "", &[("background.threads", SET, Some("12"))]),
    Describe(BROKER, "", &["background.threads"]),
    Incremental(BROKER, "", &[("background.threads", DELETE, None)]),
    // Kafka's refusals.
    Incremental(BROKER, "1", &[("background.threads", SET, Some("nine"))]),
    Incremental(BROKER, "1", &[("background.threads", SET, Some("0"))]),
    Incremental(BROKER, "1", &[("num.partitions", SET, Some("3"))]),
    Incremental(
        BROKER,
        "",
        &[("sasl.kerberos.min.time.before.relogin", SET, Some("58000"))],
    ),
    Incremental(BROKER, "1", &[("ssl.keystore.type", SET, Some("PKCS12"))]),
    Incremental(BROKER, "1", &[("no.such.broker.config", SET, Some("1"))]),
    Incremental(BROKER, "1", &[("log.cleaner.threads", SET, Some("-1"))]),
    Incremental(BROKER, "1", &[("num.io.threads", SET, Some("0"))]),
    Incremental(BROKER, "1", &[("message.max.bytes", SET, Some("1048588"))]),
    Incremental(BROKER, "1", &[("message.max.bytes", DELETE, None)]),
    Incremental(BROKER, "1", &[("max.connections", SET, Some("-5"))]),
    Alter(BROKER, "1", &[("num.partitions", "3")]),
    Alter(BROKER, "1", &[]),
    // KIP-848 group configs (librdkafka 0081: SET, DELETE, describe a group that does not
    // exist).
    Describe(
        GROUP,
        "parity-group",
        &[
            "consumer.session.timeout.ms",
            "consumer.heartbeat.interval.ms",
        ],
    ),
    Incremental(
        GROUP,
        "parity-group",
        &[("consumer.session.timeout.ms", SET, Some("50000"))],
    ),
    Describe(
        GROUP,
        "parity-group",
        &[
            "consumer.session.timeout.ms",
            "consumer.heartbeat.interval.ms",
        ],
    ),
    Incremental(
        GROUP,
        "parity-group",
        &[("consumer.session.timeout.ms", DELETE, Some(""))],
    ),
    Describe(GROUP, "parity-group", &["consumer.session.timeout.ms"]),
    Incremental(
        GROUP,
        "parity-group",
        &[("consumer.session.timeout.ms", SET, Some("1000"))],
    ),
    Incremental(
        GROUP,
        "parity-group",
        &[("consumer.session.timeout.ms", SET, Some("70000"))],
    ),
    Incremental(
        GROUP,
        "parity-group",
        &[("consumer.heartbeat.interval.ms", SET, Some("1000"))],
    ),
    Incremental(
        GROUP,
        "parity-group",
        &[("consumer.heartbeat.interval.ms", SET, Some("500"))],
    ),
    Incremental(
        GROUP,
        "parity-group",
        &[("consumer.heartbeat.interval.ms", SET, Some("20000"))],
    ),
    Incremental(
        GROUP,
        "parity-group",
        &[("consumer.session.timeout.ms", SET, Some("abc"))],
    ),
    Incremental(
        GROUP,
        "parity-group",
        &[("no.such.group.config", SET, Some("1"))],
    ),
    Incremental(
        GROUP,
        "parity-group",
        &[("share.isolation.level", SET, Some("read_committed"))],
    ),
    Incremental(
        GROUP,
        "parity-group",
        &[("streams.num.standby.replicas", SET, Some("1"))],
    ),
    Describe(
        GROUP,
        "parity-group",
        &[
            "consumer.heartbeat.interval.ms",
            "share.isolation.level",
            "streams.num.standby.replicas",
        ],
    ),
    Alter(
        GROUP,
        "parity-group",
        &[("consumer.heartbeat.interval.ms", "6000")],
    ),
    Describe(
        GROUP,
        "parity-group",
        &["consumer.heartbeat.interval.ms", "share.isolation.level"],
    ),
    Incremental(
        GROUP,
        "",
        &[("consumer.session.timeout.ms", SET, Some("50000"))],
    ),
];

/// Runs the script against `bootstrap` and returns one line per step. A DescribeConfigs step
/// is repeated for up to 10 s until it answers `expected`'s line for it: a broker applies a
/// committed config record asynchronously (Kafka's `DynamicConfigPublisher`).
fn run_script(bootstrap: &str, expected: &[&str]) -> Result<Vec<String>> {
    let mut conn = KafkaConn::connect(bootstrap, "configs-parity")?;
    let mut out = Vec::new();
    for (i, step) in SCRIPT.iter().enumerate() {
        let deadline = Instant::now() + Duration::from_secs(10);
        let line = loop {
            let line = run_step(&mut conn, step)?;
            let line = format!("{i}: {line}");
            if !matches!(step, Describe(..))
                || expected.get(i) == Some(&line.as_str())
                || Instant::now() > deadline
            {
                break line;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        out.push(line);
    }
    Ok(out)
}

/// One step's answer.
fn run_step(conn: &mut KafkaConn, step: &Step) -> Result<String> {
    {
        let line = match step {
            Incremental(ty, name, ops) => {
                let req = IncrementalAlterConfigsRequest::default().with_resources(vec![
                    IncrementalResource::default()
                        .with_resource_type(*ty)
                        .with_resource_name(sb(name))
                        .with_configs(
                            ops.iter()
                                .map(|(k, op, v)| {
                                    IncrementalConfig::default()
                                        .with_name(sb(k))
                                        .with_config_operation(*op)
                                        .with_value(v.map(sb))
                                })
                                .collect(),
                        ),
                ]);
                let resp: IncrementalAlterConfigsResponse =
                    conn.call(ApiKey::IncrementalAlterConfigs, 1, &req)?;
                let r = resp.responses.first().context("no resource")?;
                format!(
                    "incremental {ty} {name:?} {ops:?}: {} {:?}",
                    r.error_code,
                    r.error_message.as_deref().map(ToString::to_string)
                )
            }
            Alter(ty, name, configs) => {
                let req = AlterConfigsRequest::default().with_resources(vec![
                    AlterConfigsResource::default()
                        .with_resource_type(*ty)
                        .with_resource_name(sb(name))
                        .with_configs(
                            configs
                                .iter()
                                .map(|(k, v)| {
                                    AlterableConfig::default()
                                        .with_name(sb(k))
                                        .with_value(Some(sb(v)))
                                })
                                .collect(),
                        ),
                ]);
                let resp: AlterConfigsResponse = conn.call(ApiKey::AlterConfigs, 2, &req)?;
                let r = resp.responses.first().context("no resource")?;
                format!(
                    "alter {ty} {name:?} {configs:?}: {} {:?}",
                    r.error_code,
                    r.error_message.as_deref().map(ToString::to_string)
                )
            }
            Describe(ty, name, keys) => {
                let req = DescribeConfigsRequest::default()
                    .with_resources(vec![DescribeConfigsResource::default()
                        .with_resource_type(*ty)
                        .with_resource_name(sb(name))
                        .with_configuration_keys(Some(keys.iter().map(|k| sb(k)).collect()))])
                    .with_include_synonyms(true);
                let resp: DescribeConfigsResponse = conn.call(ApiKey::DescribeConfigs, 4, &req)?;
                let r = resp.results.first().context("no resource")?;
                let mut configs: Vec<String> = r
                    .configs
                    .iter()
                    .map(|c| {
                        format!(
                            "{}={:?} source {} read-only {} type {} synonyms {:?}",
                            c.name.as_str(),
                            c.value.as_deref().map(ToString::to_string),
                            c.config_source,
                            c.read_only,
                            c.config_type,
                            c.synonyms
                                .iter()
                                .map(|s| (s.name.to_string(), s.source))
                                .collect::<Vec<_>>()
                        )
                    })
                    .collect();
                configs.sort();
                format!(
                    "describe {ty} {name:?}: {} {:?} {configs:?}",
                    r.error_code,
                    r.error_message.as_deref().map(ToString::to_string)
                )
            }
        };
        Ok(line)
    }
}

fn wait_for_broker_config_api(bootstrap: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut conn = KafkaConn::connect(bootstrap, "configs-parity")?;
        let req = DescribeConfigsRequest::default().with_resources(vec![
            DescribeConfigsResource::default()
                .with_resource_type(BROKER)
                .with_resource_name(sb("1"))
                .with_configuration_keys(Some(vec![sb("background.threads")])),
        ]);
        let resp: DescribeConfigsResponse = conn.call(ApiKey::DescribeConfigs, 4, &req)?;
        if resp.results.first().is_some_and(|r| r.error_code == 0) || Instant::now() > deadline {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Kafka 4.4.0's answers to the script, recorded from a run of
/// `configs_parity_kafka` (the test prints them).
const EXPECTED: &str = include_str!("data/configs_kafka_parity.txt");

fn expected_lines() -> Vec<&'static str> {
    EXPECTED.lines().filter(|l| !l.is_empty()).collect()
}

fn check(got: &[String], who: &str) -> Result<()> {
    let want = expected_lines();
    let mut diffs = Vec::new();
    for i in 0..want.len().max(got.len()) {
        let w = want.get(i).copied().unwrap_or("<missing>");
        let g = got.get(i).map_or("<missing>", String::as_str);
        if w != g {
            diffs.push(format!("  Kafka:  {w}\n  {who}: {g}"));
        }
    }
    ensure!(
        diffs.is_empty(),
        "{who} differs from Kafka 4.4.0 in {} step(s):\n{}",
        diffs.len(),
        diffs.join("\n")
    );
    Ok(())
}

#[test]
fn configs_parity_gregor() -> Result<()> {
    let g = Gregor::start(BIN, &[])?;
    wait_for_broker_config_api(&g.bootstrap())?;
    let got = run_script(&g.bootstrap(), &expected_lines())?;
    check(&got, "gregor")
}

#[test]
fn configs_parity_kafka() -> Result<()> {
    if !reference::jars_or_skip() {
        return Ok(());
    }
    let (instance, _guard) = start_kafka()?;
    wait_for_broker_config_api(&instance.bootstrap())?;
    let got = run_script(&instance.bootstrap(), &expected_lines())?;
    println!("{}", got.join("\n"));
    check(&got, "Kafka")
}

/// A group's `consumer.heartbeat.interval.ms` reaches its members: a KIP-848 member joining
/// the group is told the group's interval in the ConsumerGroupHeartbeat response, another
/// group keeps the broker's 5000 ms. Returns the two intervals.
fn group_heartbeat_intervals(bootstrap: &str) -> Result<(i32, i32)> {
    let mut conn = KafkaConn::connect(bootstrap, "configs-parity")?;
    let req = IncrementalAlterConfigsRequest::default().with_resources(vec![
        IncrementalResource::default()
            .with_resource_type(GROUP)
            .with_resource_name(sb("tuned"))
            .with_configs(vec![IncrementalConfig::default()
                .with_name(sb("consumer.heartbeat.interval.ms"))
                .with_config_operation(SET)
                .with_value(Some(sb("7000")))]),
    ]);
    let resp: IncrementalAlterConfigsResponse =
        conn.call(ApiKey::IncrementalAlterConfigs, 1, &req)?;
    ensure!(
        resp.responses.first().is_some_and(|r| r.error_code == 0),
        "setting the group config: {resp:?}"
    );
    std::thread::sleep(Duration::from_millis(500));
    let mut interval = |group: &str| -> Result<i32> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            // The coordinator (and __consumer_offsets) comes with FindCoordinator.
            let find = FindCoordinatorRequest::default()
                .with_key_type(0)
                .with_coordinator_keys(vec![sb(group)]);
            let _: FindCoordinatorResponse = conn.call(ApiKey::FindCoordinator, 4, &find)?;
            let req = ConsumerGroupHeartbeatRequest::default()
                .with_group_id(GroupId(sb(group)))
                .with_member_id(sb("AAAAAAAAAAAAAAAAAAAAAA"))
                .with_member_epoch(0)
                .with_rebalance_timeout_ms(30_000)
                .with_subscribed_topic_names(Some(vec![TopicName(sb("parity-topic"))]))
                .with_topic_partitions(Some(vec![]));
            let resp: ConsumerGroupHeartbeatResponse =
                conn.call(ApiKey::ConsumerGroupHeartbeat, 1, &req)?;
            // COORDINATOR_NOT_AVAILABLE / _LOAD_IN_PROGRESS while __consumer_offsets is made.
            if resp.error_code != 0 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
            ensure!(resp.error_code == 0, "heartbeat: {resp:?}");
            return Ok(resp.heartbeat_interval_ms);
        }
    };
    Ok((interval("tuned")?, interval("untuned")?))
}

#[test]
fn group_configs_apply_to_consumer_groups_gregor() -> Result<()> {
    let g = Gregor::start(BIN, &[])?;
    let got = group_heartbeat_intervals(&g.bootstrap())?;
    ensure!(got == (7000, 5000), "gregor: {got:?}");
    Ok(())
}

#[test]
fn group_configs_apply_to_consumer_groups_kafka() -> Result<()> {
    if !reference::jars_or_skip() {
        return Ok(());
    }
    let (instance, _guard) = start_kafka()?;
    let got = group_heartbeat_intervals(&instance.bootstrap())?;
    ensure!(got == (7000, 5000), "Kafka: {got:?}");
    Ok(())
}

/// Starts a Kafka 4.4.0 node on free ports, trying other ports when one was taken between
/// choosing and binding it (tests start brokers in parallel).
fn start_kafka() -> Result<(Instance, ChildGuard)> {
    let mut last = None;
    for _ in 0..5 {
        let instance = Instance::new(free_port()?, None, None)?;
        match instance.spawn() {
            Ok(child) => {
                let mut guard = ChildGuard::new("kafka", child);
                instance.wait_ready(|| guard.check_alive())?;
                return Ok((instance, guard));
            }
            Err(e) if format!("{e:#}").contains("is not free") => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("no free ports for Kafka")))
}
