//! The delayed-operation purgatory seen from outside (issue 9, defect 3): many long polls on
//! idle partitions leave nothing behind (`gregor_purgatory_size` returns to 0), and a long poll
//! is completed by new data rather than by its timeout. Raw frames are built with the
//! `kafka-protocol` crate so the fetch parameters are exactly what the test says.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use bytes::{Buf, Bytes};
use gregor_protocol::batch::BatchBuilder;
use gregor_tests::wire::{sb, KafkaConn};
use gregor_tests::Gregor;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, CreateTopicsRequest, CreateTopicsResponse, FetchRequest, FetchResponse, ProduceRequest,
    ProduceResponse, TopicName,
};
use kafka_protocol::protocol::Decodable;

const BIN: &str = env!("CARGO_BIN_EXE_gregor");
const TOPIC: &str = "idle";
const PARTITIONS: i32 = 4;
const FETCH_VERSION: i16 = 12;

fn connect(g: &Gregor) -> Result<KafkaConn> {
    KafkaConn::connect(g.bootstrap(), "purgatory-test")
}

fn create_topic(g: &Gregor) -> Result<()> {
    let req = CreateTopicsRequest::default()
        .with_timeout_ms(10_000)
        .with_topics(vec![CreatableTopic::default()
            .with_name(TopicName(sb(TOPIC)))
            .with_num_partitions(PARTITIONS)
            .with_replication_factor(1)]);
    let r: CreateTopicsResponse = connect(g)?.call(ApiKey::CreateTopics, 7, &req)?;
    ensure!(r.topics[0].error_code == 0, "create: {:?}", r.topics[0]);
    Ok(())
}

fn long_poll(max_wait_ms: i32) -> FetchRequest {
    FetchRequest::default()
        .with_max_wait_ms(max_wait_ms)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(sb(TOPIC)))
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
        let mut sent = Vec::new();
        for c in &mut conns {
            let ids = (0..10)
                .map(|_| c.send(ApiKey::Fetch, FETCH_VERSION, &long_poll(300)))
                .collect::<Result<Vec<_>>>()?;
            sent.push(ids);
        }
        if round == 0 {
            // While they wait, each watches its four partitions.
            wait_for("long polls in the purgatory", || {
                Ok(purgatory_size(&g, "Fetch")? >= 4.0)
            })?;
        }
        for (c, ids) in conns.iter_mut().zip(sent) {
            // Responses come in request order (expect_response checks the correlation id).
            for id in ids {
                let mut body = c.expect_response(ApiKey::Fetch, FETCH_VERSION, id)?;
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
    let id = consumer.send(ApiKey::Fetch, FETCH_VERSION, &long_poll(30_000))?;
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
            .with_name(TopicName(sb(TOPIC)))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(2)
                .with_records(Some(Bytes::from(batch)))])]);
    let r: ProduceResponse = connect(&g)?.call(ApiKey::Produce, 9, &produce)?;
    ensure!(r.responses[0].partition_responses[0].error_code == 0);
    let mut body = consumer.expect_response(ApiKey::Fetch, FETCH_VERSION, id)?;
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

#[test]
fn a_closed_connection_takes_its_long_polls_out_of_the_purgatory() -> Result<()> {
    let g = Gregor::start(BIN, &[])?;
    create_topic(&g)?;
    // 20 connections, each with 5 pipelined 10-minute long polls on four idle partitions, then
    // closed: their waits must leave at once, not after ten minutes.
    let mut conns = (0..20).map(|_| connect(&g)).collect::<Result<Vec<_>>>()?;
    for c in &mut conns {
        for _ in 0..5 {
            c.send(ApiKey::Fetch, FETCH_VERSION, &long_poll(600_000))?;
        }
    }
    wait_for("the long polls in the purgatory", || {
        Ok(purgatory_size(&g, "Fetch")? >= f64::from(20 * PARTITIONS))
    })?;
    drop(conns);
    wait_for("the purgatory to empty after the clients left", || {
        Ok(purgatory_size(&g, "Fetch")? == 0.0)
    })?;
    Ok(())
}
