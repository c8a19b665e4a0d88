//! A client that pipelines large fetches and never reads the responses cannot make the broker
//! hold them all in memory (found by a new-user trial: 10 pipelined unread fetches of a 200 MB
//! topic took 585 MB). The broker stops reading a connection's requests while more than
//! `MAX_UNSENT_RESPONSE_BYTES` of its responses are unsent, as Kafka mutes a connection with
//! an outstanding response.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use bytes::Bytes;
use gregor_protocol::batch::BatchBuilder;
use gregor_tests::wire::{sb, KafkaConn};
use gregor_tests::Gregor;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, CreateTopicsRequest, CreateTopicsResponse,
    FetchRequest, FetchResponse, ProduceRequest, ProduceResponse, TopicName,
};
use kafka_protocol::protocol::Decodable;

const BIN: &str = env!("CARGO_BIN_EXE_gregor");
const FETCH_VERSION: i16 = 12;
/// Topic size: 12 batches of about 1 MB.
const BATCHES: usize = 12;
const PIPELINED_FETCHES: usize = 20;

/// VmRSS of `pid` in MiB.
fn rss_mib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .context("no VmRSS")?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()?;
    Ok(kib / 1024)
}

#[test]
fn unread_pipelined_fetches_do_not_pile_up_in_memory() -> Result<()> {
    let g = Gregor::start(BIN, &[])?;
    let pid = g.pid().context("pid")?;
    let mut c = KafkaConn::connect(g.bootstrap(), "response-memory-test")?;
    let create = CreateTopicsRequest::default()
        .with_timeout_ms(10_000)
        .with_topics(vec![CreatableTopic::default()
            .with_name(TopicName(sb("big")))
            .with_num_partitions(1)
            .with_replication_factor(1)]);
    let r: CreateTopicsResponse = c.call(ApiKey::CreateTopics, 7, &create)?;
    ensure!(r.topics[0].error_code == 0);
    let value = vec![b'x'; 1000];
    for _ in 0..BATCHES {
        let mut b = BatchBuilder::new(0, 1_700_000_000_000);
        for _ in 0..1000 {
            b = b.record(1_700_000_000_000, None, Some(&value), &[]);
        }
        let produce = ProduceRequest::default()
            .with_acks(1)
            .with_timeout_ms(10_000)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(TopicName(sb("big")))
                .with_partition_data(vec![PartitionProduceData::default()
                    .with_index(0)
                    .with_records(Some(Bytes::from(b.build())))])]);
        let r: ProduceResponse = c.call(ApiKey::Produce, 9, &produce)?;
        ensure!(r.responses[0].partition_responses[0].error_code == 0);
    }
    let before = rss_mib(pid)?;

    // Every fetch asks for the whole topic (about 12 MB); none of the responses is read.
    let fetch = FetchRequest::default()
        .with_max_wait_ms(0)
        .with_max_bytes(i32::MAX)
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(sb("big")))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(0)
                .with_fetch_offset(0)
                .with_partition_max_bytes(i32::MAX)])]);
    let mut greedy = KafkaConn::connect(g.bootstrap(), "greedy")?;
    let mut ids = Vec::new();
    for _ in 0..PIPELINED_FETCHES {
        ids.push(greedy.send(ApiKey::Fetch, FETCH_VERSION, &fetch)?);
    }
    // Without the bound the broker answers all of them into memory within a second or two
    // (some 240 MB); watch it for three seconds.
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut peak = before;
    while Instant::now() < deadline {
        peak = peak.max(rss_mib(pid)?);
        std::thread::sleep(Duration::from_millis(50));
    }
    ensure!(
        peak < before + 100,
        "RSS grew from {before} MiB to {peak} MiB with {PIPELINED_FETCHES} unread fetches"
    );
    // Other clients are served meanwhile.
    let v: ApiVersionsResponse = KafkaConn::connect(g.bootstrap(), "other")?.call(
        ApiKey::ApiVersions,
        3,
        &ApiVersionsRequest::default()
            .with_client_software_name(sb("t"))
            .with_client_software_version(sb("1")),
    )?;
    ensure!(v.error_code == 0);
    // Reading resumes the connection: every fetch is answered, in order, whole.
    for id in ids {
        let mut body = greedy.expect_response(ApiKey::Fetch, FETCH_VERSION, id)?;
        let r = FetchResponse::decode(&mut body, FETCH_VERSION)?;
        let p = &r.responses[0].partitions[0];
        ensure!(p.error_code == 0 && p.high_watermark == (BATCHES * 1000) as i64);
        ensure!(p.records.as_ref().is_some_and(|r| r.len() > 10_000_000));
    }
    Ok(())
}
