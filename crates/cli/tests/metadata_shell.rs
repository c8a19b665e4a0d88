//! Apache Kafka 4.4.0 reads gregor's `__cluster_metadata` log and snapshots the way
//! `kafka-metadata-shell` does (issue 10), and builds the cluster gregor serves.
//!
//! The shell itself (`org.apache.kafka:kafka-shell`) is not on Maven Central, so this test runs
//! the classes it loads with instead: `interop/java/metadata-image/MetadataImageDump.java`
//! (compiled once per cache by [`reference::metadata_image`]) feeds Kafka's `MetadataLoader`
//! from `SnapshotFileReader` (the shell's `--snapshot`) or from Kafka's Raft readers (a
//! restarting node: latest snapshot, then the log after it) and prints the `MetadataImage`
//! Kafka built from gregor's bytes.
//!
//! A three-node gregor cluster with a small `metadata.log.max.record.bytes.between.snapshots`
//! creates, grows and deletes topics, sets topic, broker and cluster-default configs,
//! allocates producer id blocks, and has one node stopped gracefully (controlled shutdown:
//! leaders move, ISRs shrink). The two running nodes are then killed (kill -9: a graceful stop
//! would write more records) and Kafka's image of each one's directory must
//! - be the same from the directory (snapshot + log), from the whole log replayed from offset 0,
//!   and from the segment read as the shell reads it;
//! - equal what gregor served just before: brokers (Metadata), finalized features
//!   (ApiVersions), topics with ids, leaders, replicas, ISRs (rdkafka's Metadata) and leader
//!   epochs (Metadata v12), dynamic topic, broker and cluster-default configs (rdkafka's
//!   DescribeConfigs), and a producer id block consistent with InitProducerId's answers;
//! - register broker listeners only (no CONTROLLER endpoint: Kafka's
//!   `effectiveAdvertisedBrokerListeners`), with no ACLs, quotas, SCRAM users or tokens.
//!
//! A copy of the log with one well-formed but wrong record (a partition's leader epoch raised)
//! must make the comparison fail, so the check can fail. Skipped without the Kafka jars.
//!
//! `cargo test -p gregor --test metadata_shell -- --nocapture`

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gregor_protocol::metadata_records::log::{
    build_metadata_batch, BatchRecords, MetadataLogBatches,
};
use gregor_protocol::metadata_records::MetadataRecord;
use gregor_tests::clients;
use gregor_tests::cluster::{Cluster, ClusterConfig, Implementation};
use gregor_tests::reference;
use gregor_tests::wire::{sb, KafkaConn};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, InitProducerIdRequest, InitProducerIdResponse,
    MetadataRequest, MetadataResponse, ProducerId,
};
use rdkafka::admin::{
    AdminOptions, AlterConfig, ConfigSource, NewPartitions, NewTopic, ResourceSpecifier,
    TopicReplication,
};
use rdkafka::consumer::{BaseConsumer, Consumer};

/// Metadata record bytes between snapshots: a few topics' worth, so that the log holds
/// snapshots and records after them.
const SNAPSHOT_BYTES: &str = "1024";
/// Kafka's producer id block size (`ProducerIdManager`), which gregor's controller hands out.
const PRODUCER_ID_BLOCK: i64 = 1000;
const CLIENT: &str = "metadata-shell-test";
/// How long the cluster may take to agree on the changes made.
const SETTLE: Duration = Duration::from_secs(20);

fn gregor() -> Implementation {
    Implementation::Gregor(env!("CARGO_BIN_EXE_gregor").into())
}

fn conn(bootstrap: &str) -> KafkaConn {
    let addr: SocketAddr = bootstrap.parse().expect("an address");
    KafkaConn::connect_timeout(addr, Duration::from_secs(10), CLIENT).expect("connect")
}

fn admin_ok<T: std::fmt::Debug, E: std::fmt::Debug>(what: &str, results: Vec<Result<T, E>>) {
    for r in results {
        assert!(r.is_ok(), "{what}: {r:?}");
    }
}

/// Kafka's `Uuid.toString`: URL-safe base64 without padding.
fn kafka_uuid(id: uuid::Uuid) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in id.as_bytes().chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=chunk.len() {
            out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

fn ids(v: impl IntoIterator<Item = i32>) -> String {
    let parts: Vec<String> = v.into_iter().map(|i| i.to_string()).collect();
    format!("[{}]", parts.join(","))
}

/// What one broker serves, as sorted lines comparable with [`OracleImage::served_lines`]:
/// `broker`, `feature`, `topic`, `partition` and `config` lines.
fn served_by(bootstrap: &str, broker_ids: &[i32]) -> anyhow::Result<String> {
    let mut lines = BTreeSet::new();
    // rdkafka: brokers, topics, leaders, replicas, ISRs.
    let consumer: BaseConsumer = clients::consumer(bootstrap, &[])?;
    let md = consumer.fetch_metadata(None, Duration::from_secs(10))?;
    for b in md.brokers() {
        lines.insert(format!("broker {} {}:{}", b.id(), b.host(), b.port()));
    }
    // Metadata v12 (rdkafka shows neither topic ids nor leader epochs).
    let raw: MetadataResponse = conn(bootstrap).call(
        ApiKey::Metadata,
        12,
        &MetadataRequest::default().with_topics(None),
    )?;
    let raw_topics: BTreeMap<String, _> = raw
        .topics
        .iter()
        .filter_map(|t| Some((t.name.as_ref()?.to_string(), t)))
        .collect();
    for b in &raw.brokers {
        lines.insert(format!(
            "broker {} rack={}",
            b.node_id.0,
            b.rack.as_ref().map_or("-".to_string(), ToString::to_string)
        ));
    }
    for t in md.topics() {
        anyhow::ensure!(t.error().is_none(), "{}: {:?}", t.name(), t.error());
        let r = raw_topics
            .get(t.name())
            .ok_or_else(|| anyhow::anyhow!("{} is not in Metadata v12", t.name()))?;
        lines.insert(format!(
            "topic {} id={} partitions={}",
            t.name(),
            kafka_uuid(r.topic_id),
            t.partitions().len()
        ));
        for p in t.partitions() {
            let epoch = r
                .partitions
                .iter()
                .find(|rp| rp.partition_index == p.id())
                .map_or(-2, |rp| rp.leader_epoch);
            lines.insert(format!(
                "partition {} {} leader={} leader_epoch={epoch} replicas={} isr={}",
                t.name(),
                p.id(),
                p.leader(),
                ids(p.replicas().iter().copied()),
                ids(p.isr().iter().copied())
            ));
        }
    }
    // ApiVersions v3: the finalized features.
    let versions: ApiVersionsResponse = conn(bootstrap).call(
        ApiKey::ApiVersions,
        3,
        &ApiVersionsRequest::default()
            .with_client_software_name(sb("gregor-tests"))
            .with_client_software_version(sb("1")),
    )?;
    for f in &versions.finalized_features {
        // kraft.version is the quorum's (a KRaftVersion control record), not in Kafka's
        // MetadataImage; Kafka's ApiVersions adds it from the Raft client.
        if f.name.as_str() != "kraft.version" {
            lines.insert(format!("feature {}={}", f.name, f.max_version_level));
        }
    }
    // rdkafka's DescribeConfigs: the dynamic configs, by source.
    let admin = clients::admin(bootstrap)?;
    let rt = clients::runtime()?;
    let topics: Vec<ResourceSpecifier<'_>> = md
        .topics()
        .iter()
        .map(|t| ResourceSpecifier::Topic(t.name()))
        .collect();
    // librdkafka sends a broker resource to that broker: one request each.
    let mut described = rt.block_on(admin.describe_configs(&topics, &AdminOptions::new()))?;
    for id in broker_ids {
        described.extend(rt.block_on(
            admin.describe_configs(&[ResourceSpecifier::Broker(*id)], &AdminOptions::new()),
        )?);
    }
    for r in described {
        let r = r.map_err(|e| anyhow::anyhow!("DescribeConfigs: {e:?}"))?;
        for e in &r.entries {
            let resource = match (&r.specifier, &e.source) {
                (rdkafka::admin::OwnedResourceSpecifier::Topic(t), ConfigSource::DynamicTopic) => {
                    format!("TOPIC \"{t}\"")
                }
                (
                    rdkafka::admin::OwnedResourceSpecifier::Broker(b),
                    ConfigSource::DynamicBroker,
                ) => {
                    format!("BROKER \"{b}\"")
                }
                // A topic's entry with a broker source is inherited, not the topic's own.
                (
                    rdkafka::admin::OwnedResourceSpecifier::Broker(_),
                    ConfigSource::DynamicDefaultBroker,
                ) => "BROKER \"\"".to_string(),
                _ => continue,
            };
            lines.insert(format!(
                "config {resource} {}={}",
                e.name,
                e.value.as_deref().unwrap_or("")
            ));
        }
    }
    Ok(lines.into_iter().collect::<Vec<_>>().join("\n"))
}

/// The `key=value` words of a line.
type Fields = BTreeMap<String, String>;

/// One input's part of `MetadataImageDump`'s output, parsed.
#[derive(Debug, Default)]
struct OracleImage {
    /// The summary without its `# input:` line.
    text: String,
    features: BTreeMap<String, String>,
    /// Broker id -> its fields (`fenced`, `listeners`, `rack`, ...).
    brokers: BTreeMap<i32, BTreeMap<String, String>>,
    /// Topic name -> (its fields, partition -> fields).
    topics: BTreeMap<String, (Fields, BTreeMap<i32, Fields>)>,
    /// `TYPE "name"` -> key -> value.
    configs: BTreeMap<String, BTreeMap<String, String>>,
    producer_ids_next: i64,
    /// Lines of the acls, client_quotas, scram and delegation_tokens sections.
    security: Vec<String>,
}

fn fields<'a>(words: impl Iterator<Item = &'a str>) -> BTreeMap<String, String> {
    words
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

impl OracleImage {
    /// Splits the tool's output into its inputs' images, in order.
    fn parse_all(output: &str) -> Vec<(String, Self)> {
        let mut out: Vec<(String, Self)> = Vec::new();
        for line in output.lines() {
            if let Some(header) = line.strip_prefix("# input: ") {
                out.push((header.to_string(), Self::default()));
            } else if let Some((_, image)) = out.last_mut() {
                image.text.push_str(line);
                image.text.push('\n');
            }
        }
        for (_, image) in &mut out {
            image.parse_text();
        }
        out
    }

    fn parse_text(&mut self) {
        let mut section = "";
        let mut topic = String::new();
        let mut config = String::new();
        for line in self.text.clone().lines() {
            if !line.starts_with(' ') {
                if let Some(next) = line.strip_prefix("producer_ids: next=") {
                    self.producer_ids_next = next.parse().expect("producer_ids");
                }
                section = line.trim_end_matches(':');
                continue;
            }
            let depth = line.len() - line.trim_start().len();
            let mut words = line.split_whitespace();
            match (section, depth) {
                ("features", _) => self.features.extend(fields(words)),
                ("brokers", _) => {
                    let id = words
                        .next()
                        .and_then(|w| w.parse().ok())
                        .expect("broker id");
                    self.brokers.insert(id, fields(words));
                }
                ("topics", 2) => {
                    topic = words.next().expect("topic name").to_string();
                    self.topics
                        .insert(topic.clone(), (fields(words), BTreeMap::new()));
                }
                ("topics", _) => {
                    let p = words
                        .next()
                        .and_then(|w| w.parse().ok())
                        .expect("partition");
                    let t = self.topics.get_mut(&topic).expect("a topic line first");
                    t.1.insert(p, fields(words));
                }
                ("configs", 2) => {
                    config = line.trim().to_string();
                    self.configs.entry(config.clone()).or_default();
                }
                ("configs", _) => {
                    let (k, v) = line.trim().split_once('=').expect("key=value");
                    self.configs
                        .get_mut(&config)
                        .expect("a resource line first")
                        .insert(k.to_string(), v.to_string());
                }
                ("acls" | "client_quotas" | "scram" | "delegation_tokens", _) => {
                    self.security.push(format!("{section}: {}", line.trim()));
                }
                _ => {}
            }
        }
    }

    /// The PLAINTEXT endpoint of a broker's registration.
    fn plaintext_endpoint(listeners: &str) -> Option<&str> {
        listeners
            .trim_matches(['[', ']'])
            .split(',')
            .find_map(|l| l.strip_prefix("PLAINTEXT(PLAINTEXT)://"))
    }

    /// The lines [`served_by`] makes, from Kafka's image: unfenced brokers, features, topics,
    /// partitions and configs.
    fn served_lines(&self) -> String {
        let mut lines = BTreeSet::new();
        for (id, b) in &self.brokers {
            if b.get("fenced").map(String::as_str) != Some("false") {
                continue;
            }
            let endpoint = b
                .get("listeners")
                .and_then(|l| Self::plaintext_endpoint(l))
                .unwrap_or("none");
            lines.insert(format!("broker {id} {endpoint}"));
            lines.insert(format!(
                "broker {id} rack={}",
                b.get("rack").map_or("-", String::as_str)
            ));
        }
        for (name, level) in &self.features {
            lines.insert(format!("feature {name}={level}"));
        }
        for (name, (t, partitions)) in &self.topics {
            lines.insert(format!(
                "topic {name} id={} partitions={}",
                t["id"], t["partitions"]
            ));
            for (p, f) in partitions {
                lines.insert(format!(
                    "partition {name} {p} leader={} leader_epoch={} replicas={} isr={}",
                    f["leader"], f["leader_epoch"], f["replicas"], f["isr"]
                ));
            }
        }
        for (resource, entries) in &self.configs {
            for (k, v) in entries {
                lines.insert(format!("config {resource} {k}={v}"));
            }
        }
        lines.into_iter().collect::<Vec<_>>().join("\n")
    }
}

/// The `.checkpoint` files of a `__cluster_metadata-0` other than the bootstrap one, and its
/// segments, names sorted.
fn metadata_files(dir: &Path) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let mut snapshots = Vec::new();
    let mut segments = Vec::new();
    for e in std::fs::read_dir(dir).expect("reading __cluster_metadata-0") {
        let p = e.expect("an entry").path();
        let name = p
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        if name.ends_with(".checkpoint") && !name.starts_with("00000000000000000000-") {
            snapshots.push(p);
        } else if name.ends_with(".log") {
            segments.push(p);
        }
    }
    snapshots.sort();
    segments.sort();
    (snapshots, segments)
}

/// Copies the segments of `from` into `to` (a new `__cluster_metadata-0`) with the first
/// `PartitionRecord` of `topic_id` partition 0 given a leader epoch `raise` higher: a
/// well-formed batch (CRC recomputed) holding a wrong record. Returns whether it was found.
fn copy_with_wrong_leader_epoch(from: &Path, to: &Path, topic_id: uuid::Uuid, raise: i32) -> bool {
    std::fs::create_dir_all(to).expect("creating the copy");
    let mut done = false;
    for segment in metadata_files(from).1 {
        let bytes = std::fs::read(&segment).expect("reading a segment");
        let mut out = Vec::with_capacity(bytes.len());
        for batch in MetadataLogBatches::new(&bytes) {
            let batch = batch.expect("gregor decodes its own segment");
            let end = batch.position + batch.header.total_size();
            let raw = &bytes[batch.position..end];
            let BatchRecords::Metadata(mut records) = batch.records else {
                out.extend_from_slice(raw);
                continue;
            };
            let target = records.iter_mut().find(|r| {
                matches!(&r.record, MetadataRecord::Partition(p)
                    if p.topic_id == topic_id && p.partition_id == 0)
            });
            match target {
                Some(r) if !done => {
                    if let MetadataRecord::Partition(p) = &mut r.record {
                        p.leader_epoch += raise;
                    }
                    done = true;
                    out.extend(
                        build_metadata_batch(
                            batch.header.base_offset,
                            batch.header.partition_leader_epoch,
                            batch.header.max_timestamp,
                            &records,
                        )
                        .expect("re-encoding the batch"),
                    );
                }
                _ => out.extend_from_slice(raw),
            }
        }
        let name = segment.file_name().expect("a segment name");
        std::fs::write(to.join(name), out).expect("writing the copy");
    }
    done
}

fn line_diff(want: &str, got: &str) -> String {
    let want: BTreeSet<&str> = want.lines().collect();
    let got: BTreeSet<&str> = got.lines().collect();
    let mut out = String::new();
    for l in want.difference(&got) {
        let _ = writeln!(out, "- {l}");
    }
    for l in got.difference(&want) {
        let _ = writeln!(out, "+ {l}");
    }
    out
}

#[test]
fn kafkas_metadata_loader_builds_from_gregors_log_and_snapshots_what_gregor_serves() {
    if !reference::jars_or_skip() {
        return;
    }
    let started = Instant::now();
    // Compiled once per cache; the first run of a cache pays for javac here.
    reference::metadata_image_classes().expect("compiling MetadataImageDump");
    // advertised.listeners unset: the registration must still leave CONTROLLER out.
    let config = ClusterConfig::combined(gregor(), 3)
        .with(
            "metadata.log.max.record.bytes.between.snapshots",
            SNAPSHOT_BYTES,
        )
        .with("advertised.listeners", "");
    let mut cluster = Cluster::start(&config).expect("a 3-node gregor cluster");
    eprintln!("cluster ready after {} ms", started.elapsed().as_millis());
    let bootstrap = cluster.bootstrap();
    let admin = clients::admin(&bootstrap).expect("admin");
    let rt = clients::runtime().expect("runtime");
    let opts = AdminOptions::new().operation_timeout(Some(clients::TIMEOUT));

    // A node that is not the active controller is stopped later: the quorum keeps its leader.
    let active = cluster.active_controller().expect("the active controller");
    let stopped = *cluster
        .broker_ids()
        .iter()
        .rev()
        .find(|id| **id != active)
        .expect("a node that does not lead");
    let live: Vec<i32> = cluster
        .broker_ids()
        .into_iter()
        .filter(|id| *id != stopped)
        .collect();

    let topics = [
        NewTopic::new("shell-rf3", 6, TopicReplication::Fixed(3))
            .set("retention.ms", "3600000")
            .set("min.insync.replicas", "2"),
        NewTopic::new("shell-rf2", 4, TopicReplication::Fixed(2)).set("cleanup.policy", "compact"),
        NewTopic::new("shell-rf1", 2, TopicReplication::Fixed(1)),
        NewTopic::new("shell-deleted", 3, TopicReplication::Fixed(3)),
    ];
    admin_ok(
        "CreateTopics",
        rt.block_on(admin.create_topics(&topics, &opts))
            .expect("CreateTopics"),
    );
    admin_ok(
        "CreatePartitions",
        rt.block_on(admin.create_partitions(&[NewPartitions::new("shell-rf1", 5)], &opts))
            .expect("CreatePartitions"),
    );
    admin_ok(
        "DeleteTopics",
        rt.block_on(admin.delete_topics(&["shell-deleted"], &opts))
            .expect("DeleteTopics"),
    );
    let broker_config =
        AlterConfig::new(ResourceSpecifier::Broker(live[0])).set("log.segment.bytes", "2097152");
    admin_ok(
        "AlterConfigs",
        rt.block_on(admin.alter_configs(&[broker_config], &opts))
            .expect("AlterConfigs"),
    );
    // The cluster-wide default (resource name ""), with Kafka's own tool.
    let out = reference::tool_output(
        "kafka-configs",
        &[
            "--bootstrap-server",
            &bootstrap,
            "--alter",
            "--entity-type",
            "brokers",
            "--entity-default",
            "--add-config",
            "log.retention.bytes=987654321",
        ],
    )
    .expect("kafka-configs");
    assert!(out.contains("Completed updating default config"), "{out}");

    // Controlled shutdown of one node: its leaderships move, it leaves the ISRs.
    cluster
        .node_mut(stopped)
        .stop()
        .expect("stopping a node gracefully");
    let live_bootstrap: Vec<String> = live
        .iter()
        .map(|id| cluster.node(*id).bootstrap().expect("a broker"))
        .collect();
    let live_admin = clients::admin(&live_bootstrap.join(",")).expect("admin");
    admin_ok(
        "CreateTopics",
        rt.block_on(
            live_admin.create_topics(
                &[NewTopic::new("shell-after", 3, TopicReplication::Fixed(2))
                    .set("segment.ms", "7200000")],
                &opts,
            ),
        )
        .expect("CreateTopics"),
    );
    let topic_config = AlterConfig::new(ResourceSpecifier::Topic("shell-rf2"))
        .set("cleanup.policy", "compact")
        .set("max.message.bytes", "65536");
    admin_ok(
        "AlterConfigs",
        rt.block_on(live_admin.alter_configs(&[topic_config], &opts))
            .expect("AlterConfigs"),
    );
    // Each running broker allocates a producer id block from the controller.
    let mut producer_ids = Vec::new();
    for b in &live_bootstrap {
        let init: InitProducerIdResponse = conn(b)
            .call(
                ApiKey::InitProducerId,
                4,
                &InitProducerIdRequest::default()
                    .with_transactional_id(None)
                    .with_transaction_timeout_ms(60_000)
                    .with_producer_id(ProducerId(-1))
                    .with_producer_epoch(-1),
            )
            .expect("InitProducerId");
        assert_eq!(init.error_code, 0, "InitProducerId at {b}");
        producer_ids.push(init.producer_id.0);
    }

    // Both running nodes have written a snapshot, and serve the same, settled metadata.
    for id in &live {
        let dir = cluster.node(*id).data_dir().join("__cluster_metadata-0");
        cluster.wait_for(SETTLE, &format!("a snapshot of node {id}"), || {
            (!metadata_files(&dir).0.is_empty()).then_some(())
        });
    }
    let mut previous = String::new();
    let mut last_views = Vec::new();
    let served = gregor_tests::process::poll(SETTLE, || {
        let views: Vec<String> = live_bootstrap
            .iter()
            .map(|b| served_by(b, &live).unwrap_or_else(|e| format!("error: {e:#}")))
            .collect();
        let settled = views.iter().all(|v| *v == views[0])
            && views[0] == previous
            && views[0].contains("topic shell-after ")
            && !views[0].contains("shell-deleted");
        previous.clone_from(&views[0]);
        last_views.clone_from(&views);
        settled.then(|| views[0].clone())
    })
    .unwrap_or_else(|| {
        panic!(
            "the running brokers did not agree within {SETTLE:?}:\n{}\n{}",
            last_views.join("\n----\n"),
            cluster.logs(40)
        )
    });
    eprintln!("gregor serves:\n{served}");
    // Kafka's own FileLock (what the shell and a Kafka broker take) is refused on a running
    // node's directory: gregor's .lock is an fcntl lock too.
    let running = cluster
        .node(live[0])
        .data_dir()
        .join("__cluster_metadata-0");
    let refused = reference::metadata_image(&["--dir".into(), running.display().to_string()])
        .expect_err("Kafka's FileLock taken on a running gregor node's log directory");
    assert!(
        format!("{refused:#}").contains("Unable to lock"),
        "{refused:#}"
    );
    for id in &live {
        cluster.node_mut(*id).kill9().expect("kill -9");
    }

    // Kafka reads what the nodes wrote.
    let dir = |id: i32| cluster.node(id).data_dir().join("__cluster_metadata-0");
    let first = dir(live[0]);
    let (snapshots, segments) = metadata_files(&first);
    eprintln!(
        "node {}: snapshots {:?}, segments {:?}",
        live[0],
        snapshots.iter().map(|p| p.file_name()).collect::<Vec<_>>(),
        segments.iter().map(|p| p.file_name()).collect::<Vec<_>>()
    );
    let wrong = tempfile::tempdir().expect("tempdir");
    let wrong_dir = wrong.path().join("__cluster_metadata-0");
    let mut args: Vec<String> = Vec::new();
    for id in &live {
        args.extend(["--dir".into(), dir(*id).display().to_string()]);
    }
    args.extend(["--log".into(), first.display().to_string()]);
    // As `kafka-metadata-shell --snapshot` reads a segment and a snapshot.
    args.extend(["--snapshot".into(), segments[0].display().to_string()]);
    let latest = snapshots.last().expect("a snapshot").clone();
    args.extend(["--snapshot".into(), latest.display().to_string()]);
    args.extend(["--dir".into(), dir(stopped).display().to_string()]);
    let shell_rf3_id = served
        .lines()
        .find_map(|l| l.strip_prefix("topic shell-rf3 id="))
        .and_then(|rest| rest.split_whitespace().next())
        .expect("shell-rf3 served")
        .to_string();
    let topic_uuid = topic_id_in_log(&first, "shell-rf3");
    assert_eq!(kafka_uuid(topic_uuid), shell_rf3_id);
    assert!(
        copy_with_wrong_leader_epoch(&first, &wrong_dir, topic_uuid, 7),
        "no PartitionRecord of shell-rf3 in {}",
        first.display()
    );
    args.extend(["--log".into(), wrong_dir.display().to_string()]);
    let loaded = Instant::now();
    let output = reference::metadata_image(&args).unwrap_or_else(|e| panic!("{e:#}"));
    eprintln!(
        "MetadataImageDump read {} inputs in {} ms",
        args.len() / 2,
        loaded.elapsed().as_millis()
    );
    let images = OracleImage::parse_all(&output);
    assert_eq!(images.len(), args.len() / 2, "{output}");
    let (dirs, rest) = images.split_at(live.len());
    let (log, shell_segment, shell_snapshot, stopped_dir, wrong_log) =
        (&rest[0], &rest[1], &rest[2], &rest[3], &rest[4]);
    let reference_image = &dirs[0].1;
    eprintln!("{}\n{}", dirs[0].0, reference_image.text);

    // One image, however it is read and whichever running node wrote it.
    for (header, image) in dirs.iter().chain([log, shell_segment]) {
        assert!(
            image.text == reference_image.text,
            "{header} differs from {}:\n{}",
            dirs[0].0,
            line_diff(&reference_image.text, &image.text)
        );
    }
    // ... and it is what gregor served.
    let kafka_view = reference_image.served_lines();
    assert!(
        kafka_view == served,
        "Kafka's image of gregor's log (+) differs from what gregor served (-):\n{}",
        line_diff(&served, &kafka_view)
    );
    // Broker registrations: broker listeners only; the stopped node is fenced.
    for (id, b) in &reference_image.brokers {
        assert!(
            !b["listeners"].contains("CONTROLLER"),
            "broker {id} registered a controller listener: {}",
            b["listeners"]
        );
        assert_eq!(
            b["fenced"],
            (*id == stopped).to_string(),
            "broker {id}: {b:?}"
        );
    }
    // Partition epochs (no API shows them): at least the leader epoch (every leader change is
    // a partition change), and 0 on partitions created after the stop, on running brokers.
    for (name, (_, partitions)) in &reference_image.topics {
        for (p, f) in partitions {
            let (leader_epoch, partition_epoch): (i32, i32) = (
                f["leader_epoch"].parse().expect("leader_epoch"),
                f["partition_epoch"].parse().expect("partition_epoch"),
            );
            assert!(partition_epoch >= leader_epoch, "{name}-{p}: {f:?}");
            if name == "shell-after" {
                assert_eq!((leader_epoch, partition_epoch), (0, 0), "{name}-{p}: {f:?}");
            }
        }
    }
    // The producer id block the controller handed out last ends at the next producer id.
    let max_pid = *producer_ids.iter().max().expect("producer ids");
    assert_eq!(
        reference_image.producer_ids_next,
        (max_pid / PRODUCER_ID_BLOCK + 1) * PRODUCER_ID_BLOCK,
        "InitProducerId answered {producer_ids:?}"
    );
    assert!(
        reference_image.security.is_empty(),
        "gregor writes no ACLs, quotas, SCRAM users or tokens: {:?}",
        reference_image.security
    );
    // The latest snapshot read as the shell reads it holds the topics created before it.
    assert!(
        shell_snapshot
            .1
            .topics
            .get("shell-rf3")
            .is_some_and(|t| t.0["id"] == shell_rf3_id),
        "{}:\n{}",
        shell_snapshot.0,
        shell_snapshot.1.text
    );
    // The stopped node's directory loads too (it stopped before the last changes).
    assert!(
        stopped_dir.1.topics.contains_key("shell-rf3"),
        "{}",
        stopped_dir.1.text
    );
    // A wrong record makes the comparison fail.
    let wrong_view = wrong_log.1.served_lines();
    assert!(
        wrong_view != served && line_diff(&served, &wrong_view).contains("partition shell-rf3 0 "),
        "a wrong leader epoch in the log went unnoticed:\n{}",
        line_diff(&served, &wrong_view)
    );
    eprintln!(
        "metadata_shell: {} ms in all",
        started.elapsed().as_millis()
    );
}

/// The topic id of `name` from the first `TopicRecord` of the segments of `dir`.
fn topic_id_in_log(dir: &Path, name: &str) -> uuid::Uuid {
    for segment in metadata_files(dir).1 {
        let bytes = std::fs::read(&segment).expect("reading a segment");
        for batch in MetadataLogBatches::new(&bytes) {
            let batch = batch.expect("gregor decodes its own segment");
            let BatchRecords::Metadata(records) = batch.records else {
                continue;
            };
            for r in records {
                if let MetadataRecord::Topic(t) = r.record {
                    if t.name == name {
                        return t.topic_id;
                    }
                }
            }
        }
    }
    panic!("no TopicRecord of {name} in {}", dir.display())
}
