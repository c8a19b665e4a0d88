//! The delayed-operation purgatory seen from outside (issue 9, defect 3): many long polls on
//! idle partitions leave nothing behind (`gregor_purgatory_size` returns to 0), and a long poll
//! is completed by new data rather than by its timeout. Raw frames are built with the
//! `kafka-protocol` crate so the fetch parameters are exactly what the test says.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use bytes::{Buf, Bytes, BytesMut};
use gregor_protocol::batch::BatchBuilder;
use gregor_tests::Gregor;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, CreateTopicsRequest, CreateTopicsResponse, FetchRequest, FetchResponse, ProduceRequest,
    ProduceResponse, RequestHeader, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

const BIN: &str = env!("CARGO_BIN_EXE_gregor");
const TOPIC: &str = "idle";
const PARTITIONS: i32 = 4;
const FETCH_VERSION: i16 = 12;

fn frame<R: Encodable>(key: ApiKey, version: i16, correlation_id: i32, req: &R) -> Result<Vec<u8>> {
    let mut buf = BytesMut::new();
    RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_static_str("purgatory-test")))
        .encode(&mut buf, key.request_header_version(version))?;
    req.encode(&mut buf, version)?;
    let mut out = i32::try_from(buf.len())?.to_be_bytes().to_vec();
    out.extend_from_slice(&buf);
    Ok(out)
}

/// Reads one response and returns its correlation id and body.
fn read_response(s: &mut TcpStream, key: ApiKey, version: i16) -> Result<(i32, Bytes)> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let mut body = vec![0u8; usize::try_from(i32::from_be_bytes(len))?];
    s.read_exact(&mut body)?;
    let mut b = Bytes::from(body);
    let h = ResponseHeader::decode(&mut b, key.response_header_version(version))?;
    Ok((h.correlation_id, b))
}

fn connect(g: &Gregor) -> Result<TcpStream> {
    let s = TcpStream::connect(g.bootstrap())?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    Ok(s)
}

fn create_topic(g: &Gregor) -> Result<()> {
    let mut s = connect(g)?;
    let req = CreateTopicsRequest::default()
        .with_timeout_ms(10_000)
        .with_topics(vec![CreatableTopic::default()
            .with_name(TopicName(StrBytes::from_static_str(TOPIC)))
            .with_num_partitions(PARTITIONS)
            .with_replication_factor(1)]);
    s.write_all(&frame(ApiKey::CreateTopics, 7, 1, &req)?)?;
    let (_, mut body) = read_response(&mut s, ApiKey::CreateTopics, 7)?;
    let r = CreateTopicsResponse::decode(&mut body, 7)?;
    ensure!(r.topics[0].error_code == 0, "create: {:?}", r.topics[0]);
    Ok(())
}

fn long_poll(max_wait_ms: i32) -> FetchRequest {
    FetchRequest::default()
        .with_max_wait_ms(max_wait_ms)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(StrBytes::from_static_str(TOPIC)))
            .with_partitions(
                (0..PARTITIONS)
                    .map(|p| {
                        FetchPartition::default()
                            .with_partition(p)
                            .with_fetch_offset(0)
                            .with_partition_max_bytes(1 << 20)
                    })
                    .collect(),
            )])
}

/// The value of `gregor_purgatory_size{delayed_operation="<op>"}`.
fn purgatory_size(g: &Gregor, op: &str) -> Result<f64> {
    let (status, body) = g.admin_get("/metrics")?;
    ensure!(status == 200, "/metrics answered {status}");
    let prefix = format!("gregor_purgatory_size{{delayed_operation=\"{op}\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .with_context(|| format!("no {prefix}in /metrics"))?
        .trim()
        .parse()
        .context("gauge value")
}

fn wait_for(what: &str, mut cond: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond()? {
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

#[test]
fn long_polls_on_idle_partitions_leave_the_purgatory_empty() -> Result<()> {
    let g = Gregor::start(BIN, &[])?;
    create_topic(&g)?;
    ensure!(purgatory_size(&g, "Fetch")? == 0.0);
    ensure!(purgatory_size(&g, "Produce")? == 0.0);
    // Five rounds of 8 connections x 10 pipelined long polls on four idle partitions: 400
    // fetches that all expire.
    for round in 0..5 {
        let mut conns = (0..8).map(|_| connect(&g)).collect::<Result<Vec<_>>>()?;
        for c in &mut conns {
            let mut out = Vec::new();
            for i in 0..10 {
                out.extend(frame(ApiKey::Fetch, FETCH_VERSION, i, &long_poll(300))?);
            }
            c.write_all(&out)?;
        }
        if round == 0 {
            // While they wait, each watches its four partitions.
            wait_for("long polls in the purgatory", || {
                Ok(purgatory_size(&g, "Fetch")? >= 4.0)
            })?;
        }
        for c in &mut conns {
            for i in 0..10 {
                let (id, mut body) = read_response(c, ApiKey::Fetch, FETCH_VERSION)?;
                ensure!(id == i, "responses in request order");
                let r = FetchResponse::decode(&mut body, FETCH_VERSION)?;
                let parts = &r.responses[0].partitions;
                ensure!(parts.len() == PARTITIONS as usize);
                ensure!(parts
                    .iter()
                    .all(|p| p.error_code == 0 && p.records.as_ref().is_some_and(Bytes::is_empty)));
            }
        }
    }
    // Every fetch answered has left every watch list.
    let size = purgatory_size(&g, "Fetch")?;
    ensure!(
        size == 0.0,
        "purgatory size {size} after every long poll expired"
    );
    Ok(())
}

#[test]
fn new_data_completes_a_long_poll_before_its_timeout() -> Result<()> {
    let g = Gregor::start(BIN, &[])?;
    create_topic(&g)?;
    let mut consumer = connect(&g)?;
    let started = Instant::now();
    consumer.write_all(&frame(ApiKey::Fetch, FETCH_VERSION, 7, &long_poll(30_000))?)?;
    wait_for("the long poll in the purgatory", || {
        Ok(purgatory_size(&g, "Fetch")? == f64::from(PARTITIONS))
    })?;
    let batch = BatchBuilder::new(0, 1_700_000_000_000)
        .record(1_700_000_000_000, Some(b"k"), Some(b"v"), &[])
        .build();
    let produce = ProduceRequest::default()
        .with_acks(1)
        .with_timeout_ms(10_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_static_str(TOPIC)))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(2)
                .with_records(Some(Bytes::from(batch)))])]);
    let mut producer = connect(&g)?;
    producer.write_all(&frame(ApiKey::Produce, 9, 1, &produce)?)?;
    let (_, mut body) = read_response(&mut producer, ApiKey::Produce, 9)?;
    let r = ProduceResponse::decode(&mut body, 9)?;
    ensure!(r.responses[0].partition_responses[0].error_code == 0);
    let (id, mut body) = read_response(&mut consumer, ApiKey::Fetch, FETCH_VERSION)?;
    ensure!(id == 7);
    ensure!(
        started.elapsed() < Duration::from_secs(20),
        "woken by data, not the timeout"
    );
    let r = FetchResponse::decode(&mut body, FETCH_VERSION)?;
    let p2 = r.responses[0]
        .partitions
        .iter()
        .find(|p| p.partition_index == 2)
        .context("partition 2")?;
    ensure!(p2.high_watermark == 1);
    ensure!(p2.records.as_ref().is_some_and(|r| r.remaining() > 0));
    ensure!(purgatory_size(&g, "Fetch")? == 0.0);
    Ok(())
}
