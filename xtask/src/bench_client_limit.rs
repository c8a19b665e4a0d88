//! `cargo xtask bench`: the consume limit of the load generator itself (issue 15: "consume
//! throughput within 80% of loopback's limit, measured with the same tool").
//!
//! The same `gregor perf consume` the consume workloads run reads a topic over 127.0.0.1 from
//! a server that does no broker work: every record batch is built once in memory before the
//! measurement and each Fetch response is written straight from it (the encoded fields, then
//! per batch its 8-byte base offset and the shared rest of the batch, in one vectored write).
//! Its answers are what a broker of one node answers a consumer assigned to every partition
//! (ApiVersions, Metadata, FindCoordinator, ListOffsets, OffsetForLeaderEpoch, Fetch, with the
//! version ranges gregor advertises); anything else fails the measurement by name. So the
//! figure is the most this load generator reads over loopback on this machine, with the server
//! costing as little as a server can: the ceiling a broker's consume throughput is judged
//! against. The server's CPU per GB is reported too (all its threads).

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use gregor_protocol::batch::BatchBuilder;
use gregor_protocol::fetch_frame::{encode_fetch_response, FramePart};
use gregor_protocol::frame::{decode_request, encode_response, frame_size, DecodedRequest};
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::offset_for_leader_epoch_response::{
    EpochEndOffset, OffsetForLeaderTopicResult,
};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsResponse, BrokerId, FetchResponse, FindCoordinatorResponse,
    ListOffsetsResponse, MetadataResponse, OffsetForLeaderEpochResponse, RequestKind, ResponseKind,
    TopicName,
};
use kafka_protocol::protocol::StrBytes;
use serde_json::Value;
use std::io::{IoSlice, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Bytes of a served batch at most: librdkafka's `batch.size` (1,000,000), the largest batch
/// the bench's fill can leave. The fewest batches per byte cost the client least, so the limit
/// is the highest this load generator can reach.
const BATCH_BYTES: usize = 1_000_000;

/// The node id, topic name and leader epoch the server answers with.
const NODE: i32 = 0;
const LEADER_EPOCH: i32 = 0;

/// One measurement: the median repetition by throughput.
#[derive(Debug, Clone)]
pub struct ClientLimit {
    /// Records read per repetition.
    pub records: u64,
    /// Bytes per record value.
    pub record_size: usize,
    /// Partitions of the served topic.
    pub partitions: i32,
    /// Records per served batch.
    pub records_per_batch: i64,
    /// Repetitions taken.
    pub repetitions: usize,
    /// Throughput of the median repetition, 10^6 bytes of record values per second.
    pub mb_per_sec: f64,
    /// Records per second of the median repetition.
    pub records_per_sec: f64,
    /// CPU seconds of the server (all its threads) per 10^9 bytes of record values.
    pub server_cpu_s_per_gb: f64,
    /// CPU seconds of the load generator's process per 10^9 bytes of record values.
    pub client_cpu_s_per_gb: f64,
}

impl ClientLimit {
    /// The report.json form.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "method": "gregor perf consume (the consume workloads' load generator) reading over \
                       127.0.0.1 from a server that writes record batches built in memory \
                       beforehand; no broker work",
            "records": self.records,
            "record_size": self.record_size,
            "partitions": self.partitions,
            "records_per_batch": self.records_per_batch,
            "repetitions": self.repetitions,
            "mb_per_sec": self.mb_per_sec,
            "records_per_sec": self.records_per_sec,
            "server_cpu_s_per_gb": self.server_cpu_s_per_gb,
            "client_cpu_s_per_gb": self.client_cpu_s_per_gb,
        })
    }
}

/// What the server serves: `partitions` partitions of `topic`, each holding `end_offset`
/// records in batches that are all `batch` but for their base offset.
struct Topic {
    name: String,
    id: uuid::Uuid,
    partitions: i32,
    end_offset: i64,
    records_per_batch: i64,
    batch: Bytes,
}

/// Serves `records` records of `record_size` bytes over `partitions` partitions to `gregor perf
/// consume` (`binary`) `repetitions` times and returns the median repetition.
pub fn measure(
    binary: &Path,
    records: u64,
    record_size: usize,
    partitions: i32,
    repetitions: usize,
) -> Result<ClientLimit> {
    let partitions = partitions.max(1);
    let (batch, records_per_batch) = template_batch(record_size);
    let per_partition = records.div_ceil(u64::try_from(partitions)?);
    // Whole batches: the end offset rounded up, so every partition holds at least its share.
    let end_offset = i64::try_from(per_partition.div_ceil(u64::try_from(records_per_batch)?))?
        * records_per_batch;
    let topic = Arc::new(Topic {
        name: "client-limit".into(),
        id: uuid::Uuid::new_v4(),
        partitions,
        end_offset,
        records_per_batch,
        batch,
    });
    let clk_tck = crate::bench::clock_ticks();
    let mut runs = Vec::new();
    for _ in 0..repetitions.max(1) {
        runs.push(once(binary, &topic, records, clk_tck)?);
    }
    runs.sort_by(|a, b| a.mb_per_sec.total_cmp(&b.mb_per_sec));
    let median = runs[runs.len() / 2].clone();
    Ok(ClientLimit {
        repetitions: runs.len(),
        ..median
    })
}

/// The largest batch of at most [`BATCH_BYTES`] (at least one record) of `record_size`-byte
/// values of random upper-case letters, as the producer sends, and its record count.
fn template_batch(record_size: usize) -> (Bytes, i64) {
    let build = |records: usize| {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut builder = BatchBuilder::new(0, 1_700_000_000_000);
        for _ in 0..records {
            let value: Vec<u8> = (0..record_size)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    b'A' + (seed % 26) as u8
                })
                .collect();
            builder = builder.record(1_700_000_000_000, None, Some(&value), &[]);
        }
        builder.build()
    };
    // One record's size on the wire gives the count; varints of later offset deltas may make
    // the batch a little larger, so step down until it fits.
    let one = build(1).len();
    let per_record = build(2).len().saturating_sub(one).max(1);
    let mut n = (BATCH_BYTES.saturating_sub(one - per_record) / per_record).max(1);
    loop {
        let batch = build(n);
        if batch.len() <= BATCH_BYTES || n == 1 {
            return (Bytes::from(batch), i64::try_from(n).unwrap_or(1));
        }
        n -= 1;
    }
}

/// One repetition: a fresh server, one `gregor perf consume` run.
fn once(binary: &Path, topic: &Arc<Topic>, records: u64, clk_tck: f64) -> Result<ClientLimit> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    let stop = Arc::new(AtomicBool::new(false));
    // Server CPU in nanoseconds, summed over its connection threads as each ends.
    let server_cpu = Arc::new(AtomicU64::new(0));
    let accept = {
        let (topic, stop, server_cpu) = (topic.clone(), stop.clone(), server_cpu.clone());
        listener.set_nonblocking(true)?;
        std::thread::spawn(move || -> Result<()> {
            let mut conns = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((s, _)) => {
                        s.set_nonblocking(false)?;
                        s.set_nodelay(true)?;
                        let (topic, stop, cpu) = (topic.clone(), stop.clone(), server_cpu.clone());
                        conns.push(std::thread::spawn(move || {
                            let started = crate::bench_loopback::thread_cpu();
                            let r = serve(s, port, &topic, &stop);
                            let used = crate::bench_loopback::thread_cpu().saturating_sub(started);
                            cpu.fetch_add(
                                u64::try_from(used.as_nanos()).unwrap_or(u64::MAX),
                                Ordering::Relaxed,
                            );
                            r
                        }));
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            let mut first_error = None;
            for c in conns {
                match c.join() {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        first_error.get_or_insert(e);
                    }
                    Err(_) => {
                        first_error.get_or_insert(anyhow!("a connection thread panicked"));
                    }
                }
            }
            first_error.map_or(Ok(()), Err)
        })
    };
    let children_before = children_cpu_seconds(clk_tck)?;
    let mut cmd = crate::bench::gregor_client(binary, &format!("127.0.0.1:{port}"));
    cmd.args(["perf", "consume", "--topic", &topic.name])
        .arg("--num-records")
        .arg(records.to_string());
    let out = run_perf(&mut cmd);
    let client_cpu = children_cpu_seconds(clk_tck)? - children_before;
    stop.store(true, Ordering::Relaxed);
    let served = accept
        .join()
        .map_err(|_| anyhow!("the client-limit server panicked"))?;
    let out = out?;
    served.context("the client-limit server")?;
    let mb_per_sec = out["mb_per_sec"]
        .as_f64()
        .ok_or_else(|| anyhow!("no mb_per_sec in {out}"))?;
    let records_per_sec = out["records_per_sec"].as_f64().unwrap_or(0.0);
    let record_size = (mb_per_sec * 1e6 / records_per_sec.max(1.0)).round() as usize;
    let gb = records as f64 * record_size as f64 / 1e9;
    Ok(ClientLimit {
        records,
        record_size,
        partitions: topic.partitions,
        records_per_batch: topic.records_per_batch,
        repetitions: 1,
        mb_per_sec,
        records_per_sec,
        server_cpu_s_per_gb: server_cpu.load(Ordering::Relaxed) as f64 / 1e9 / gb,
        client_cpu_s_per_gb: client_cpu / gb,
    })
}

fn run_perf(cmd: &mut Command) -> Result<Value> {
    crate::bench::perf(cmd)
}

/// CPU seconds of this process's waited-for children (`cutime` + `cstime`, stat(5)).
fn children_cpu_seconds(clk_tck: f64) -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| anyhow!("malformed /proc/self/stat"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Fields 16 and 17 of stat(5); `rest` starts at field 3.
    let cutime: f64 = fields
        .get(13)
        .ok_or_else(|| anyhow!("no cutime"))?
        .parse()?;
    let cstime: f64 = fields
        .get(14)
        .ok_or_else(|| anyhow!("no cstime"))?
        .parse()?;
    Ok((cutime + cstime) / clk_tck)
}

/// Answers one connection until the client closes it or the measurement ends.
fn serve(mut s: TcpStream, port: u16, topic: &Topic, stop: &AtomicBool) -> Result<()> {
    // Reads time out now and then so the thread notices the end of the measurement.
    s.set_read_timeout(Some(Duration::from_millis(200)))?;
    let mut prefix = [0u8; 4];
    loop {
        if !read_full(&mut s, &mut prefix, stop)? {
            return Ok(());
        }
        let size = frame_size(prefix);
        if !(8..=100 << 20).contains(&size) {
            bail!("a request frame of {size} bytes");
        }
        let mut frame = vec![0u8; usize::try_from(size)?];
        if !read_full(&mut s, &mut frame, stop)? {
            return Ok(());
        }
        let decoded = decode_request(
            Bytes::from(frame),
            &gregor_broker::handlers::supported_versions,
        )
        .map_err(|e| anyhow!("decoding a request: {e}"))?;
        let (header, api_key, body) = match decoded {
            DecodedRequest::Request {
                header,
                api_key,
                body,
            } => (header, api_key, body),
            other => bail!("the client sent {other:?}"),
        };
        let (version, correlation) = (header.request_api_version, header.correlation_id);
        if let RequestKind::Fetch(req) = *body {
            if !write_fetch(&mut s, version, correlation, &req, topic)? {
                return Ok(());
            }
            continue;
        }
        let response = answer(api_key, &body, port, topic)?;
        let bytes = encode_response(api_key, version, correlation, &response)
            .map_err(|e| anyhow!("encoding {api_key:?} v{version}: {e}"))?;
        if s.write_all(&bytes).is_err() {
            return Ok(());
        }
    }
}

/// Fills `buf`; `false` when the client closed the connection (or the measurement ended)
/// before the first byte.
fn read_full(s: &mut TcpStream, buf: &mut [u8], stop: &AtomicBool) -> Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => bail!("the client closed the connection inside a request"),
            Ok(n) => got += n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if stop.load(Ordering::Relaxed) {
                    return Ok(false);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(false),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(true)
}

fn name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_owned()))
}

/// The answer to every request but Fetch.
fn answer(api_key: ApiKey, body: &RequestKind, port: u16, topic: &Topic) -> Result<ResponseKind> {
    let host = StrBytes::from_static_str("127.0.0.1");
    Ok(match body {
        RequestKind::ApiVersions(_) => {
            // Produce is advertised, never answered: librdkafka enables message format v2
            // (and with it fetching) only when the broker lists Produce v3+ beside Fetch v4+.
            let api_keys = [
                ApiKey::Produce,
                ApiKey::ApiVersions,
                ApiKey::Metadata,
                ApiKey::FindCoordinator,
                ApiKey::ListOffsets,
                ApiKey::OffsetForLeaderEpoch,
                ApiKey::Fetch,
            ]
            .into_iter()
            .filter_map(|k| {
                let (min, max) = gregor_broker::handlers::supported_versions(k)?;
                Some(
                    ApiVersion::default()
                        .with_api_key(k as i16)
                        .with_min_version(min)
                        .with_max_version(max),
                )
            })
            .collect();
            ResponseKind::ApiVersions(ApiVersionsResponse::default().with_api_keys(api_keys))
        }
        RequestKind::Metadata(req) => {
            let ours = |t: &kafka_protocol::messages::metadata_request::MetadataRequestTopic| {
                t.name.as_ref().is_some_and(|n| n.0.as_str() == topic.name)
                    || t.topic_id == topic.id
            };
            let include = req.topics.as_ref().is_none_or(|ts| ts.iter().any(ours));
            let mut topics = Vec::new();
            if include {
                let partitions = (0..topic.partitions)
                    .map(|p| {
                        MetadataResponsePartition::default()
                            .with_partition_index(p)
                            .with_leader_id(BrokerId(NODE))
                            .with_leader_epoch(LEADER_EPOCH)
                            .with_replica_nodes(vec![BrokerId(NODE)])
                            .with_isr_nodes(vec![BrokerId(NODE)])
                    })
                    .collect();
                topics.push(
                    MetadataResponseTopic::default()
                        .with_name(Some(name(&topic.name)))
                        .with_topic_id(topic.id)
                        .with_partitions(partitions),
                );
            }
            for t in req.topics.iter().flatten().filter(|t| !ours(t)) {
                topics.push(
                    MetadataResponseTopic::default()
                        .with_name(t.name.clone())
                        .with_error_code(3), // UNKNOWN_TOPIC_OR_PARTITION
                );
            }
            ResponseKind::Metadata(
                MetadataResponse::default()
                    .with_brokers(vec![MetadataResponseBroker::default()
                        .with_node_id(BrokerId(NODE))
                        .with_host(host)
                        .with_port(i32::from(port))])
                    .with_cluster_id(Some(StrBytes::from_static_str("client-limit")))
                    .with_controller_id(BrokerId(NODE))
                    .with_topics(topics),
            )
        }
        RequestKind::FindCoordinator(req) => {
            let coordinators = req
                .coordinator_keys
                .iter()
                .map(|k| {
                    Coordinator::default()
                        .with_key(k.clone())
                        .with_node_id(BrokerId(NODE))
                        .with_host(host.clone())
                        .with_port(i32::from(port))
                })
                .collect();
            ResponseKind::FindCoordinator(
                FindCoordinatorResponse::default()
                    .with_node_id(BrokerId(NODE))
                    .with_host(host)
                    .with_port(i32::from(port))
                    .with_coordinators(coordinators),
            )
        }
        RequestKind::ListOffsets(req) => {
            let topics = req
                .topics
                .iter()
                .map(|t| {
                    let partitions = t
                        .partitions
                        .iter()
                        .map(|p| {
                            // -1 latest, -2 earliest (and any timestamp: the first record).
                            let offset = if p.timestamp == -1 {
                                topic.end_offset
                            } else {
                                0
                            };
                            ListOffsetsPartitionResponse::default()
                                .with_partition_index(p.partition_index)
                                .with_timestamp(-1)
                                .with_offset(offset)
                                .with_leader_epoch(LEADER_EPOCH)
                        })
                        .collect();
                    ListOffsetsTopicResponse::default()
                        .with_name(t.name.clone())
                        .with_partitions(partitions)
                })
                .collect();
            ResponseKind::ListOffsets(ListOffsetsResponse::default().with_topics(topics))
        }
        RequestKind::OffsetForLeaderEpoch(req) => {
            let topics = req
                .topics
                .iter()
                .map(|t| {
                    let partitions = t
                        .partitions
                        .iter()
                        .map(|p| {
                            EpochEndOffset::default()
                                .with_partition(p.partition)
                                .with_leader_epoch(LEADER_EPOCH)
                                .with_end_offset(topic.end_offset)
                        })
                        .collect();
                    OffsetForLeaderTopicResult::default()
                        .with_topic(t.topic.clone())
                        .with_partitions(partitions)
                })
                .collect();
            ResponseKind::OffsetForLeaderEpoch(
                OffsetForLeaderEpochResponse::default().with_topics(topics),
            )
        }
        _ => bail!("the client-limit server does not answer {api_key:?}"),
    })
}

/// Record sets of a Fetch response: (first base offset, batches).
type Sets = (i64, i64);

/// Answers a Fetch: per partition whole batches from the fetch offset (at least one, at most
/// `partition_max_bytes`, none at the end); when no partition has any, waits `max_wait_ms`
/// (at most 500 ms) first, as a broker's long poll. `false` when the client went away.
fn write_fetch(
    s: &mut TcpStream,
    version: i16,
    correlation: i32,
    req: &kafka_protocol::messages::FetchRequest,
    topic: &Topic,
) -> Result<bool> {
    let batch_len = topic.batch.len();
    let mut responses = Vec::new();
    let mut external: Vec<Option<(Sets, usize)>> = Vec::new();
    for t in &req.topics {
        let ours = t.topic_id == topic.id || t.topic.0.as_str() == topic.name;
        let mut partitions = Vec::new();
        for p in &t.partitions {
            let mut data = PartitionData::default()
                .with_partition_index(p.partition)
                .with_high_watermark(topic.end_offset)
                .with_last_stable_offset(topic.end_offset)
                .with_log_start_offset(0)
                .with_aborted_transactions(Some(Vec::new()));
            let mut set = None;
            if !ours || p.partition < 0 || p.partition >= topic.partitions {
                data = data.with_error_code(3); // UNKNOWN_TOPIC_OR_PARTITION
            } else if p.fetch_offset < 0 || p.fetch_offset > topic.end_offset {
                data = data.with_error_code(1); // OFFSET_OUT_OF_RANGE
            } else if p.fetch_offset < topic.end_offset {
                let per = topic.records_per_batch;
                let first = p.fetch_offset - p.fetch_offset % per;
                let left = (topic.end_offset - first) / per;
                let fit = usize::try_from(p.partition_max_bytes.max(0))? / batch_len;
                let n = i64::try_from(fit.max(1))?.min(left);
                set = Some(((first, n), usize::try_from(n)? * batch_len));
            }
            external.push(set);
            partitions.push(data);
        }
        responses.push(
            FetchableTopicResponse::default()
                .with_topic(t.topic.clone())
                .with_topic_id(t.topic_id)
                .with_partitions(partitions),
        );
    }
    if external.iter().all(Option::is_none) {
        let wait = u64::try_from(req.max_wait_ms.clamp(0, 500)).unwrap_or(0);
        std::thread::sleep(Duration::from_millis(wait));
    }
    let body = FetchResponse::default().with_responses(responses);
    let frame = encode_fetch_response(version, correlation, &body, external)
        .map_err(|e| anyhow!("encoding Fetch v{version}: {e}"))?;
    // Each batch goes out as its base offset and the shared rest of the template.
    let offsets: Vec<[u8; 8]> = frame
        .parts
        .iter()
        .filter_map(|p| match p {
            FramePart::Records((first, n)) => Some((*first, *n)),
            FramePart::Bytes(_) => None,
        })
        .flat_map(|(first, n)| {
            (0..n).map(move |i| (first + i * topic.records_per_batch).to_be_bytes())
        })
        .collect();
    let rest = &topic.batch[8..];
    let mut slices = Vec::with_capacity(offsets.len() * 2 + frame.parts.len());
    let mut next = offsets.iter();
    for part in &frame.parts {
        match part {
            FramePart::Bytes(b) => slices.push(IoSlice::new(b)),
            FramePart::Records((_, n)) => {
                for _ in 0..*n {
                    let o = next
                        .next()
                        .ok_or_else(|| anyhow!("batch offsets miscounted"))?;
                    slices.push(IoSlice::new(o));
                    slices.push(IoSlice::new(rest));
                }
            }
        }
    }
    Ok(write_all_vectored(s, &mut slices).is_ok())
}

/// `Write::write_all_vectored`, which is not stable.
fn write_all_vectored(s: &mut TcpStream, mut slices: &mut [IoSlice<'_>]) -> std::io::Result<()> {
    while !slices.is_empty() {
        // At most IOV_MAX (1024) pieces per call.
        let take = slices.len().min(1024);
        let n = s.write_vectored(&slices[..take])?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut slices, n);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_template_batch_is_a_valid_batch_of_its_records() {
        let (b, n) = template_batch(1000);
        assert!(
            b.len() <= BATCH_BYTES && b.len() > BATCH_BYTES - 1100,
            "{}",
            b.len()
        );
        let header = gregor_protocol::batch::validate_batch(&b).unwrap();
        assert_eq!(header.total_size(), b.len());
        assert_eq!(header.next_offset(), n);
        let records = gregor_protocol::records::decode_records(&b).unwrap();
        assert_eq!(records.len(), n as usize);
        assert!(records
            .iter()
            .all(|r| r.value.as_ref().is_some_and(|v| v.len() == 1000)));
        let (b, n) = template_batch(100);
        assert!(b.len() <= BATCH_BYTES);
        assert_eq!(
            gregor_protocol::records::decode_records(&b).unwrap().len(),
            n as usize
        );
    }
}
