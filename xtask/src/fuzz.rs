//! `cargo xtask fuzz`: the cargo-fuzz targets in `fuzz/` (issue 9), each run for a bounded time
//! on its committed corpus, with the CPU time each one used.
//!
//! Installs cargo-fuzz (`cargo +nightly install cargo-fuzz --locked`) when `cargo +nightly fuzz`
//! is missing; CI machines start fresh. New inputs libFuzzer finds go to
//! `target/fuzz-corpus/<target>/`, never into the committed `fuzz/corpus/<target>/` (read-only
//! here); crashes go to `fuzz/artifacts/<target>/` and fail the run.
//! `--seed-corpus` rewrites the committed seeds from valid encodings (see [`seeds`]).

use crate::proc::{self, repo_root};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// The targets in `fuzz/fuzz_targets/`, in the order they run.
pub const TARGETS: [&str; 7] = [
    "frame",
    "request",
    "record_batch",
    "decompress",
    "consumer_offsets",
    "metadata_log",
    "metadata_records",
];

#[derive(Args, Clone)]
pub struct FuzzArgs {
    /// Seconds of fuzzing per target (libFuzzer's -max_total_time).
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// Run only these targets (repeat or comma-separate); default: all.
    #[arg(long, value_delimiter = ',')]
    pub target: Vec<String>,
    /// libFuzzer worker processes per target (-fork=N); 1 runs in-process.
    #[arg(long, default_value_t = 1)]
    pub jobs: u32,
    /// Build without optimizations (cargo fuzz --dev): a much faster build for short runs, at a
    /// fraction of the executions per second; the `fuzz` suite of `cargo xtask test` uses it.
    #[arg(long)]
    pub dev: bool,
    /// Rewrite the committed seed corpora under fuzz/corpus/ from valid encodings and exit.
    #[arg(long)]
    pub seed_corpus: bool,
}

/// Bound on any single allocation, in MiB: well above what a decoder of a libFuzzer-sized
/// input (at most a few KiB) legitimately asks for, far below what a count taken from the
/// input would ask for. libzstd's window (up to 128 MiB for a frame that declares it) is the
/// largest legitimate one.
const MALLOC_LIMIT_MB: u32 = 256;
/// Bound on the fuzzing process' resident memory, in MiB.
const RSS_LIMIT_MB: u32 = 2048;
/// cargo-fuzz builds with one codegen unit by default; 16 builds several times faster on a
/// small machine (kafka-protocol's generated code dominates) for slightly slower runs. `build`
/// and `run` must pass the same value, or `run` rebuilds.
const CODEGEN_UNITS: &str = "16";

pub fn run(args: &FuzzArgs) -> Result<i32> {
    let root = repo_root();
    if args.seed_corpus {
        let written = seeds::write_all(&root.join("fuzz/corpus"))?;
        for (target, n) in written {
            println!("fuzz/corpus/{target}: {n} seed inputs");
        }
        return Ok(0);
    }
    let targets: Vec<&str> = if args.target.is_empty() {
        TARGETS.to_vec()
    } else {
        for t in &args.target {
            if !TARGETS.contains(&t.as_str()) {
                bail!(
                    "unknown fuzz target {t:?}; the targets are {}",
                    TARGETS.join(", ")
                );
            }
        }
        TARGETS
            .iter()
            .copied()
            .filter(|t| args.target.iter().any(|a| a == t))
            .collect()
    };
    ensure_cargo_fuzz()?;
    let fuzz_dir = root.join("fuzz");
    // The same build flags for `build` and `run`, or `run` builds again.
    let mut build_flags = vec!["--codegen-units", CODEGEN_UNITS];
    if args.dev {
        build_flags.push("--dev");
    }
    let started = Instant::now();
    proc::run_checked(
        Command::new("cargo")
            .args(["+nightly", "fuzz", "build"])
            .args(&build_flags)
            .args(
                targets
                    .iter()
                    .copied()
                    .take(usize::from(targets.len() == 1)),
            )
            .current_dir(&root),
    )
    .context("building the fuzz targets (cargo +nightly fuzz build)")?;
    println!(
        "fuzz targets built in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    let mut failed = Vec::new();
    let mut report = Vec::new();
    for target in &targets {
        let seeds = fuzz_dir.join("corpus").join(target);
        let found = root.join("target/fuzz-corpus").join(target);
        std::fs::create_dir_all(&found).with_context(|| format!("creating {}", found.display()))?;
        let cpu_before = children_cpu_seconds();
        let wall = Instant::now();
        let mut cmd = Command::new("cargo");
        cmd.args(["+nightly", "fuzz", "run"])
            .args(&build_flags)
            .arg(target)
            .arg(&found)
            .arg(&seeds)
            .arg("--")
            .arg(format!("-max_total_time={}", args.seconds))
            .arg(format!("-malloc_limit_mb={MALLOC_LIMIT_MB}"))
            .arg(format!("-rss_limit_mb={RSS_LIMIT_MB}"))
            .arg("-timeout=20")
            .arg("-print_final_stats=1")
            .current_dir(&root);
        if args.jobs > 1 {
            cmd.arg(format!("-fork={}", args.jobs));
        }
        println!("== fuzz {target} ({} s)", args.seconds);
        let status = proc::run_status(&mut cmd)?;
        let cpu = children_cpu_seconds() - cpu_before;
        let wall = wall.elapsed().as_secs_f64();
        report.push(format!(
            "{target:<18} {:>8.1} s CPU {:>8.1} s wall  {}",
            cpu,
            wall,
            if status.success() { "ok" } else { "FAILED" }
        ));
        if !status.success() {
            failed.push(*target);
        }
    }
    println!("\nfuzz summary (CPU = user + system time of the fuzzing processes):");
    for line in &report {
        println!("  {line}");
    }
    if failed.is_empty() {
        Ok(0)
    } else {
        eprintln!(
            "fuzz targets failed: {}; the crashing inputs are in fuzz/artifacts/<target>/, \
             replay one with `cargo +nightly fuzz run <target> <file>`",
            failed.join(", ")
        );
        Ok(1)
    }
}

/// Installs cargo-fuzz for the nightly toolchain unless `cargo +nightly fuzz` already works.
pub fn ensure_cargo_fuzz() -> Result<()> {
    let works = Command::new("cargo")
        .args(["+nightly", "fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if works {
        return Ok(());
    }
    println!("cargo-fuzz is missing; installing it (cargo +nightly install cargo-fuzz --locked)");
    proc::run_checked(Command::new("cargo").args(["+nightly", "install", "cargo-fuzz", "--locked"]))
        .context(
            "installing cargo-fuzz (needs the nightly toolchain: rustup toolchain install nightly)",
        )
}

/// User + system CPU seconds of this process' waited-for children (`cutime` + `cstime` in
/// /proc/self/stat), 0 where /proc is missing.
fn children_cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command name (which is in parentheses and may contain spaces).
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // cutime and cstime are fields 16 and 17 of the whole line, 14 and 15 after ')'.
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // The kernel reports in USER_HZ, 100 on every Linux ABI gregor runs on.
    (ticks(13) + ticks(14)) / 100.0
}

/// Seed inputs: valid encodings for each target, written as `fuzz/corpus/<target>/<hash>`.
mod seeds {
    use super::*;
    use bytes::BytesMut;
    use gregor_broker::group_coordinator::records as gc;
    use gregor_metadata::log::encode_frame;
    use gregor_metadata::record::{ConfigResource, MetadataRecord};
    use gregor_protocol::batch::{BatchBuilder, Compression};
    use gregor_protocol::compression::compress;
    use kafka_protocol::messages::{ApiKey, RequestHeader};
    use kafka_protocol::protocol::{Encodable, StrBytes};

    include!("../../crates/protocol/tests/support/requests.rs");

    pub fn write_all(dir: &Path) -> Result<BTreeMap<&'static str, usize>> {
        let mut out = BTreeMap::new();
        let sets: [(&'static str, Vec<Vec<u8>>); 7] = [
            ("frame", frames()),
            ("request", requests()),
            ("record_batch", record_batches()),
            ("decompress", compressed()),
            ("consumer_offsets", consumer_offsets()),
            ("metadata_log", metadata_logs()?),
            ("metadata_records", metadata_records()?),
        ];
        for (target, inputs) in sets {
            let d = dir.join(target);
            if d.exists() {
                std::fs::remove_dir_all(&d).with_context(|| format!("clearing {}", d.display()))?;
            }
            std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
            let mut n = 0;
            for input in inputs {
                let name = format!("seed-{:016x}", fnv1a(&input));
                let path = d.join(name);
                if !path.exists() {
                    std::fs::write(&path, &input)
                        .with_context(|| format!("writing {}", path.display()))?;
                    n += 1;
                }
            }
            out.insert(target, n);
        }
        Ok(out)
    }

    /// FNV-1a: a stable file name per input.
    fn fnv1a(b: &[u8]) -> u64 {
        b.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| {
            (h ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3)
        })
    }

    /// (api key, min, max) of every API the broker advertises, in the order the `request`
    /// target indexes them.
    fn advertised() -> Vec<(ApiKey, i16, i16)> {
        ApiKey::iter()
            .filter_map(|k| {
                gregor_broker::handlers::supported_versions(k).map(|(min, max)| (k, min, max))
            })
            .collect()
    }

    /// Up to `per_version` valid bodies of each advertised API and version.
    fn bodies(per_version: usize) -> Vec<(usize, ApiKey, i16, i16, Vec<u8>)> {
        let mut out = Vec::new();
        for (i, (k, min, max)) in advertised().into_iter().enumerate() {
            for v in min..=max {
                for b in grown_bodies(k, v).into_iter().take(per_version) {
                    out.push((i, k, min, v, b));
                }
            }
        }
        out
    }

    fn frames() -> Vec<Vec<u8>> {
        bodies(3)
            .into_iter()
            .filter_map(|(_, k, _, v, body)| {
                let mut f = BytesMut::new();
                RequestHeader::default()
                    .with_request_api_key(k as i16)
                    .with_request_api_version(v)
                    .with_correlation_id(1)
                    .with_client_id(Some(StrBytes::from_static_str("seed")))
                    .encode(&mut f, k.request_header_version(v))
                    .ok()?;
                f.extend_from_slice(&body);
                Some(f.to_vec())
            })
            .collect()
    }

    fn requests() -> Vec<Vec<u8>> {
        bodies(3)
            .into_iter()
            .map(|(i, _, min, v, body)| {
                let mut f = vec![i as u8, (v - min) as u8];
                f.extend_from_slice(&body);
                f
            })
            .collect()
    }

    fn record_batches() -> Vec<Vec<u8>> {
        let codecs = [
            Compression::None,
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ];
        let mut out = Vec::new();
        for codec in codecs {
            out.push(
                BatchBuilder::new(0, 1_700_000_000_000)
                    .compression(codec)
                    .record(1_700_000_000_000, Some(b"key"), Some(b"value"), &[])
                    .build(),
            );
            out.push(
                BatchBuilder::new(0, 1_700_000_000_000)
                    .producer(4000, 0, 0)
                    .compression(codec)
                    .record(
                        1_700_000_000_000,
                        Some(b"k1"),
                        Some(b"v1"),
                        &[("h".into(), Some(b"x".to_vec())), ("n".into(), None)],
                    )
                    .record(1_700_000_000_005, None, Some(b"v2"), &[])
                    .record(1_700_000_000_009, Some(b"k1"), None, &[])
                    .build(),
            );
        }
        // Two batches back to back, as a segment or a fetch response holds them; and a
        // transactional one.
        let mut two = out[0].clone();
        two.extend_from_slice(&out[1]);
        out.push(two);
        out.push(
            BatchBuilder::new(10, 1_700_000_000_000)
                .producer(7, 1, 5)
                .transactional(true, false)
                .record(1_700_000_000_000, Some(b"t"), Some(b"x"), &[])
                .build(),
        );
        out
    }

    fn compressed() -> Vec<Vec<u8>> {
        let text: &[u8] = b"gregor fuzz seed: the quick brown fox jumps over the lazy dog, \
            the quick brown fox jumps over the lazy dog, 0123456789";
        let mut out = Vec::new();
        for (id, codec) in [
            (0u8, Compression::None),
            (1, Compression::Gzip),
            (2, Compression::Snappy),
            (3, Compression::Lz4),
            (4, Compression::Zstd),
        ] {
            for data in [text, &[0u8; 4096][..], &[][..]] {
                if let Ok(c) = compress(codec, data) {
                    let mut f = vec![id];
                    f.extend_from_slice(&c);
                    out.push(f);
                }
            }
        }
        if let Ok(raw) = snap::raw::Encoder::new().compress_vec(text) {
            // librdkafka's raw (unframed) snappy.
            let mut f = vec![2u8];
            f.extend_from_slice(&raw);
            out.push(f);
        }
        out
    }

    fn consumer_offsets() -> Vec<Vec<u8>> {
        let with = |which: u8, b: Vec<u8>| {
            let mut f = vec![which];
            f.extend_from_slice(&b);
            f
        };
        let topic_id = uuid::Uuid::from_u128(0x1234_5678_9abc_def0_1234_5678_9abc_def0);
        let mut assignment = gregor_broker::group_coordinator::assignor::Assignment::new();
        assignment.entry(topic_id).or_default().extend([0, 1, 2]);
        let mut topics = BTreeMap::new();
        topics.insert("orders".to_string(), (topic_id, 3));
        let member = gc::ConsumerMemberMetadataValue {
            instance_id: Some("i-1".into()),
            rack_id: None,
            client_id: "client".into(),
            client_host: "/127.0.0.1".into(),
            subscribed_topic_names: vec!["orders".into()],
            subscribed_topic_regex: None,
            rebalance_timeout_ms: 30_000,
            server_assignor: Some("uniform".into()),
        };
        let current = gc::CurrentMemberAssignmentValue {
            member_epoch: 3,
            previous_member_epoch: 2,
            state: gc::MEMBER_STATE_STABLE,
            assigned: assignment.clone(),
            pending_revocation: Default::default(),
        };
        // ConsumerProtocolSubscription v0: version, topics ["orders"], user data null.
        let mut subscription = vec![0, 0, 0, 0, 0, 1, 0, 6];
        subscription.extend_from_slice(b"orders");
        subscription.extend_from_slice(&(-1i32).to_be_bytes());
        let group = gc::GroupMetadataValue {
            protocol_type: "consumer".into(),
            generation: 4,
            protocol: Some("range".into()),
            leader: Some("m-1".into()),
            current_state_timestamp_ms: 1_700_000_000_000,
            members: vec![gc::MemberMetadataValue {
                member_id: "m-1".into(),
                group_instance_id: None,
                client_id: "client".into(),
                client_host: "/127.0.0.1".into(),
                rebalance_timeout_ms: 30_000,
                session_timeout_ms: 45_000,
                subscription: subscription.clone().into(),
                assignment: bytes::Bytes::from_static(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
            }],
        };
        vec![
            with(0, gc::offset_commit_key("g", "orders", 0)),
            with(0, gc::group_metadata_key("g")),
            with(0, gc::consumer_group_metadata_key("g")),
            with(0, gc::consumer_group_partition_metadata_key("g")),
            with(0, gc::consumer_group_member_metadata_key("g", "m-1")),
            with(0, gc::consumer_group_target_assignment_metadata_key("g")),
            with(
                0,
                gc::consumer_group_target_assignment_member_key("g", "m-1"),
            ),
            with(
                0,
                gc::consumer_group_current_member_assignment_key("g", "m-1"),
            ),
            with(
                1,
                gc::offset_commit_value(&gc::OffsetCommitValue {
                    offset: 42,
                    leader_epoch: 0,
                    metadata: "meta".into(),
                    commit_timestamp_ms: 1_700_000_000_000,
                    expire_timestamp_ms: -1,
                }),
            ),
            with(2, gc::group_metadata_value(&group)),
            with(3, gc::consumer_group_metadata_value(5)),
            with(4, gc::consumer_group_partition_metadata_value(&topics)),
            with(5, gc::consumer_group_member_metadata_value(&member)),
            with(6, gc::consumer_group_target_assignment_metadata_value(5)),
            with(
                7,
                gc::consumer_group_target_assignment_member_value(&assignment),
            ),
            with(
                8,
                gc::consumer_group_current_member_assignment_value(&current),
            ),
            with(9, subscription),
        ]
    }

    /// KIP-631 records: every record type at every version (schema defaults), a segment of a
    /// control batch and data batches, and the metadata log, snapshot and bootstrap checkpoint
    /// real Kafka 4.4.0 controllers wrote (`crates/protocol/tests/data/kraft-4.4.0*/`).
    fn metadata_records() -> Result<Vec<Vec<u8>>> {
        use gregor_protocol::kafka_protocol::messages::KRaftVersionRecord;
        use gregor_protocol::metadata_records::log::{
            build_control_batch, build_metadata_batch, ControlRecord,
        };
        use gregor_protocol::metadata_records::{
            encode_framed, ApiMessageAndVersion, MetadataRecord, METADATA_RECORD_TYPES,
        };
        let mut out = Vec::new();
        let mut all = Vec::new();
        for t in &METADATA_RECORD_TYPES {
            for version in t.lowest_version..=t.highest_version {
                let record = ApiMessageAndVersion::new(
                    MetadataRecord::default_for(t.api_key).context("a record type")?,
                    version,
                );
                let bytes = encode_framed(&record)?;
                out.push(bytes);
                all.push(record);
            }
        }
        let control = [ControlRecord::KRaftVersion(
            KRaftVersionRecord::default().with_k_raft_version(1),
        )];
        let mut segment = build_control_batch(0, 1, 1_700_000_000_000, &control)?;
        let records: Vec<ApiMessageAndVersion> = all;
        segment.extend(build_metadata_batch(1, 1, 1_700_000_000_000, &records)?);
        out.push(segment);
        let mut files = Vec::new();
        for dir in ["kraft-4.4.0", "kraft-4.4.0-standalone"] {
            let fixture = repo_root().join("crates/protocol/tests/data").join(dir);
            files.extend(
                std::fs::read_dir(&fixture)
                    .with_context(|| format!("reading {}", fixture.display()))?
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| {
                        p.extension()
                            .is_some_and(|e| e == "log" || e == "checkpoint")
                    }),
            );
        }
        files.sort();
        for f in files {
            out.push(std::fs::read(&f).with_context(|| format!("reading {}", f.display()))?);
        }
        Ok(out)
    }

    fn metadata_logs() -> Result<Vec<Vec<u8>>> {
        use gregor_protocol::metadata_records::{
            BrokerEndpoint, ConfigRecord, PartitionRecord, ProducerIdsRecord, RegisterBrokerRecord,
            RemoveTopicRecord, TopicRecord,
        };
        let topic_id = uuid::Uuid::from_u128(7);
        let groups: [Vec<MetadataRecord>; 5] = [
            vec![RegisterBrokerRecord {
                broker_id: 1,
                incarnation_id: uuid::Uuid::from_u128(9),
                end_points: vec![BrokerEndpoint {
                    name: "PLAINTEXT".into(),
                    host: "localhost".into(),
                    port: 9092,
                    ..Default::default()
                }],
                rack: None,
                ..Default::default()
            }
            .into()],
            vec![
                TopicRecord {
                    name: "orders".into(),
                    topic_id,
                    ..Default::default()
                }
                .into(),
                PartitionRecord {
                    topic_id,
                    partition_id: 0,
                    replicas: vec![1],
                    isr: vec![1],
                    leader: 1,
                    leader_epoch: 0,
                    partition_epoch: 0,
                    ..Default::default()
                }
                .into(),
            ],
            vec![ConfigRecord {
                resource_type: ConfigResource::Topic.resource_type(),
                resource_name: "orders".into(),
                name: "retention.ms".into(),
                value: Some("1000".into()),
                ..Default::default()
            }
            .into()],
            vec![ProducerIdsRecord {
                broker_id: 1,
                broker_epoch: 0,
                next_producer_id: 1000,
                ..Default::default()
            }
            .into()],
            vec![RemoveTopicRecord {
                topic_id,
                ..Default::default()
            }
            .into()],
        ];
        // Seeds: the log after each append (a prefix of frames), as the file would hold it.
        let mut out = vec![Vec::new()];
        // A file of the JSON format before KIP-631 records, which is still read.
        let legacy = br#"[{"type":"ProducerIds","broker_id":1,"next_producer_id":1000}]"#;
        let mut file = (legacy.len() as u32).to_be_bytes().to_vec();
        file.extend(crc32c::crc32c(legacy).to_be_bytes());
        file.extend_from_slice(legacy);
        out.push(file.clone());
        for g in &groups {
            file.extend_from_slice(&encode_frame(g).context("encoding a metadata frame")?);
            out.push(file.clone());
        }
        Ok(out)
    }
}
