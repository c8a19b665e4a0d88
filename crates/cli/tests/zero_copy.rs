//! Zero-copy fetch (issue 15, item 1): on plain TCP, Fetch responses send their record sets
//! from the segment files without a copy (`splice`); `fetch.zero.copy.enable=false` forces the copying
//! path (read into memory, then written). Both must send the same bytes.
//!
//! - One broker, a topic per codec (none, gzip, snappy, lz4, zstd, produced by librdkafka in
//!   large batches) and one of small batches, segments of 256 KiB so that reading a topic
//!   crosses segment boundaries: our raw wire client reads every topic from offset 0 with
//!   Fetch v4 and v12, the records of all responses together are the segment files byte for
//!   byte, librdkafka consumes every record; then the same broker restarts with the copying
//!   path forced and every response's records are the same bytes as before, and librdkafka
//!   again reads every record. `gregor_network_zero_copy_bytes_total` shows which path ran.
//! - Followers: a 3-node cluster replicates topics (lz4, zstd) through zero-copy follower
//!   fetches; every replica's segment files end up byte-identical.
//!
//! `cargo test -p gregor --test zero_copy`

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use bytes::Bytes;
use gregor_protocol::batch::Batches;
use gregor_tests::clients::{consumer, create_topic_with, producer, runtime, TIMEOUT};
use gregor_tests::cluster::{Cluster, ClusterConfig, Implementation};
use gregor_tests::process::poll;
use gregor_tests::wire::{sb, KafkaConn};
use gregor_tests::Gregor;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{ApiKey, BrokerId, FetchRequest, FetchResponse, TopicName};
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::Consumer;
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

const BIN: &str = env!("CARGO_BIN_EXE_gregor");
const CODECS: [&str; 5] = ["none", "gzip", "snappy", "lz4", "zstd"];
/// Records per topic, of [`VALUE_BYTES`] each: about 3 MB, in batches of up to 64 KiB, sixteen
/// to a segment.
const RECORDS: usize = 3000;
const VALUE_BYTES: usize = 1024;
const SEGMENT_BYTES: &str = "1048576";
/// Per-partition fetch size of the raw reads: several responses per segment.
const PARTITION_MAX_BYTES: i32 = 300_000;

/// Record `i`'s value: pseudo-random bytes (xorshift), so compression keeps the size.
fn value(seed: u64, i: usize) -> Vec<u8> {
    let mut x = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(i as u64 + 1);
    (0..VALUE_BYTES)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Produces [`RECORDS`] records to partition 0 of `topic` with `codec`; `small_batches`: one
/// record per batch.
fn produce(
    bootstrap: &str,
    topic: &str,
    codec: &str,
    seed: u64,
    small_batches: bool,
) -> Result<()> {
    let mut settings = vec![("compression.codec", codec), ("acks", "all")];
    if small_batches {
        settings.extend([("linger.ms", "0"), ("batch.num.messages", "1")]);
    } else {
        settings.extend([("linger.ms", "50"), ("batch.size", "65536")]);
    }
    let p = producer(bootstrap, &settings)?;
    for i in 0..RECORDS {
        let v = value(seed, i);
        loop {
            match p.send(BaseRecord::<(), _>::to(topic).partition(0).payload(&v)) {
                Ok(()) => break,
                Err((e, _)) if e.to_string().contains("Queue full") => {
                    p.poll(Duration::from_millis(10));
                }
                Err((e, _)) => return Err(e.into()),
            }
        }
    }
    p.flush(TIMEOUT)?;
    Ok(())
}

/// Reads partition 0 of `topic` from offset 0 to its high watermark with Fetch `version`:
/// each response's fetch offset and records.
fn raw_read(conn: &mut KafkaConn, topic: &str, version: i16) -> Result<Vec<(i64, Bytes)>> {
    let mut out = Vec::new();
    let mut offset = 0i64;
    loop {
        let req = FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(0)
            .with_min_bytes(1)
            .with_max_bytes(1 << 20)
            .with_isolation_level(0)
            .with_session_epoch(-1)
            .with_topics(vec![FetchTopic::default()
                .with_topic(TopicName(sb(topic)))
                .with_partitions(vec![FetchPartition::default()
                    .with_partition(0)
                    .with_fetch_offset(offset)
                    .with_partition_max_bytes(PARTITION_MAX_BYTES)
                    .with_current_leader_epoch(-1)
                    .with_log_start_offset(-1)])]);
        let resp: FetchResponse = conn.call(ApiKey::Fetch, version, &req)?;
        let p = resp
            .responses
            .first()
            .and_then(|t| t.partitions.first())
            .context("no partition in the fetch response")?;
        ensure!(
            p.error_code == 0,
            "{topic} v{version} at {offset}: error {}",
            p.error_code
        );
        let records = p.records.clone().unwrap_or_default();
        if records.is_empty() {
            ensure!(
                offset >= p.high_watermark,
                "{topic} v{version}: nothing at {offset} below the high watermark {}",
                p.high_watermark
            );
            return Ok(out);
        }
        let mut next = offset;
        for b in Batches::new(&records) {
            let (_, h) = b.context("a fetch returned a cut batch")?;
            next = h.last_offset() + 1;
        }
        out.push((offset, records));
        offset = next;
    }
}

/// The directory of partition 0 of `topic` under `root`.
fn partition_dir(root: &Path, topic: &str) -> Result<PathBuf> {
    let name = format!("{topic}-0");
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir)? {
            let p = e?.path();
            if p.is_dir() {
                if p.file_name().is_some_and(|n| n == name.as_str()) {
                    return Ok(p);
                }
                stack.push(p);
            }
        }
    }
    bail!("no {name} under {}", root.display())
}

/// The partition's `.log` files in offset order, concatenated, and how many there are.
fn log_bytes(root: &Path, topic: &str) -> Result<(Vec<u8>, usize)> {
    let dir = partition_dir(root, topic)?;
    let mut logs: Vec<PathBuf> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    logs.sort();
    let mut out = Vec::new();
    for l in &logs {
        out.extend(std::fs::read(l)?);
    }
    Ok((out, logs.len()))
}

/// librdkafka reads partition 0 of `topic` from the start: every value in order.
fn consume_all(bootstrap: &str, topic: &str, seed: u64) -> Result<()> {
    let c = consumer(
        bootstrap,
        &[
            ("group.id", "zero-copy-test"),
            ("enable.auto.commit", "false"),
            ("fetch.max.bytes", "1100000"),
            ("max.partition.fetch.bytes", "300000"),
        ],
    )?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)?;
    c.assign(&tpl)?;
    let mut next = 0usize;
    let got = poll(Duration::from_secs(60), || {
        while let Some(m) = c.poll(Duration::from_millis(100)) {
            let m = match m {
                Ok(m) => m,
                Err(e) => return Some(Err(anyhow::anyhow!("{topic}: {e}"))),
            };
            if m.offset() != next as i64 || m.payload() != Some(&value(seed, next)[..]) {
                return Some(Err(anyhow::anyhow!(
                    "{topic}: record at offset {} is not record {next}",
                    m.offset()
                )));
            }
            next += 1;
            if next == RECORDS {
                return Some(Ok(()));
            }
        }
        None
    });
    got.with_context(|| format!("{topic}: librdkafka read {next} of {RECORDS} records"))?
}

/// `gregor_network_zero_copy_bytes_total` (0 while nothing was sent from a file).
fn zero_copy_bytes(g: &Gregor) -> Result<f64> {
    let (status, text) = g.admin_get("/metrics")?;
    ensure!(status == 200, "/metrics answered {status}");
    Ok(text
        .lines()
        .find_map(|l| l.strip_prefix("gregor_network_zero_copy_bytes_total "))
        .map_or(Ok(0.0), str::parse)?)
}

struct Topic {
    name: String,
    seed: u64,
}

/// Every topic read over the wire with both Fetch versions.
type Reads = Vec<(String, i16, Vec<(i64, Bytes)>)>;

fn read_everything(g: &Gregor, topics: &[Topic]) -> Result<Reads> {
    let mut conn = KafkaConn::connect(g.bootstrap(), "zero-copy-raw")?;
    let mut reads = Vec::new();
    for t in topics {
        let (segments, count) = log_bytes(g.data_dir(), &t.name)?;
        ensure!(
            count >= 2,
            "{}: {count} segment(s), the reads cross none",
            t.name
        );
        for version in [4, 12] {
            let read = raw_read(&mut conn, &t.name, version)?;
            let all: Vec<u8> = read.iter().flat_map(|(_, r)| r.iter().copied()).collect();
            ensure!(
                all == segments,
                "{} v{version}: the records of {} responses ({} bytes) are not the segment files ({} bytes)",
                t.name,
                read.len(),
                all.len(),
                segments.len()
            );
            reads.push((t.name.clone(), version, read));
        }
        consume_all(&g.bootstrap(), &t.name, t.seed)?;
    }
    Ok(reads)
}

#[test]
fn zero_copy_and_copying_fetches_send_the_same_bytes() -> Result<()> {
    let mut g = Gregor::start(BIN, &[])?;
    let bs = g.bootstrap();
    let mut topics = Vec::new();
    for (i, codec) in CODECS.iter().enumerate() {
        let name = format!("zc-{codec}");
        create_topic_with(&bs, &name, 1, &[("segment.bytes", SEGMENT_BYTES)])?;
        produce(&bs, &name, codec, i as u64, false)?;
        topics.push(Topic {
            name,
            seed: i as u64,
        });
    }
    create_topic_with(&bs, "zc-small", 1, &[("segment.bytes", SEGMENT_BYTES)])?;
    produce(&bs, "zc-small", "none", 99, true)?;
    topics.push(Topic {
        name: "zc-small".into(),
        seed: 99,
    });

    let zero_copy = read_everything(&g, &topics)?;
    let sent = zero_copy_bytes(&g)?;
    ensure!(
        sent > 1_000_000.0,
        "only {sent} bytes went out from files: the zero-copy path did not run"
    );

    g.restart_with(&["fetch.zero.copy.enable=false"])?;
    let copying = read_everything(&g, &topics)?;
    ensure!(
        zero_copy_bytes(&g)? == 0.0,
        "bytes went out from files although fetch.zero.copy.enable=false"
    );
    ensure!(zero_copy.len() == copying.len());
    for ((topic, version, a), (_, _, b)) in zero_copy.iter().zip(&copying) {
        ensure!(
            a == b,
            "{topic} v{version}: the zero-copy and the copying responses differ"
        );
    }
    Ok(())
}

#[test]
fn followers_replicate_byte_identical_logs_through_zero_copy_fetches() -> Result<()> {
    let config = ClusterConfig::combined(Implementation::Gregor(BIN.into()), 3)
        .with("replica.fetch.max.bytes", "300000");
    let cluster = Cluster::start(&config)?;
    let bs = cluster.bootstrap();
    let admin = gregor_tests::clients::admin(&bs)?;
    let topics: Vec<NewTopic> = ["lz4", "zstd"]
        .iter()
        .map(|c| {
            NewTopic::new(
                if *c == "lz4" { "rep-lz4" } else { "rep-zstd" },
                1,
                TopicReplication::Fixed(3),
            )
            .set("segment.bytes", SEGMENT_BYTES)
        })
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(TIMEOUT));
    for r in runtime()?.block_on(admin.create_topics(&topics, &opts))? {
        if let Err((t, e)) = r {
            bail!("creating {t}: {e}");
        }
    }
    for (seed, (topic, codec)) in [("rep-lz4", "lz4"), ("rep-zstd", "zstd")]
        .iter()
        .enumerate()
    {
        produce(&bs, topic, codec, seed as u64 + 10, false)?;
    }
    for topic in ["rep-lz4", "rep-zstd"] {
        let replicas = || -> Result<Vec<(Vec<u8>, usize)>> {
            cluster
                .nodes()
                .iter()
                .map(|n| log_bytes(&n.log_dirs()[0], topic))
                .collect()
        };
        let same = poll(Duration::from_secs(60), || {
            let r = replicas().ok()?;
            let first = &r[0].0;
            (r.len() == 3 && !first.is_empty() && r.iter().all(|(b, _)| b == first)).then_some(r)
        });
        let Some(r) = same else {
            let sizes: Vec<usize> = replicas()?.iter().map(|(b, _)| b.len()).collect();
            bail!("{topic}: the replicas' logs did not become identical (sizes {sizes:?})");
        };
        ensure!(r[0].1 >= 2, "{topic}: {} segment(s)", r[0].1);
        consume_all(&bs, topic, if topic == "rep-lz4" { 10 } else { 11 })?;
    }
    Ok(())
}
