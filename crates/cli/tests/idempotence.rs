//! Idempotent-producer dedup, driven at the protocol level: a client library hides retries, so
//! this test sends the same batch twice itself, as a producer does after a lost response. Topic
//! creation and the final read use rdkafka.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use bytes::Bytes;
use gregor_protocol::batch::BatchBuilder;
use gregor_tests::wire::KafkaConn;
use gregor_tests::Gregor;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, InitProducerIdRequest, InitProducerIdResponse, ProduceRequest, ProduceResponse,
    TopicName,
};
use kafka_protocol::protocol::StrBytes;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;

const BIN: &str = env!("CARGO_BIN_EXE_gregor");

type Conn = KafkaConn;

fn produce(conn: &mut Conn, topic: &str, batch: Vec<u8>) -> Result<(i16, i64)> {
    let req = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(10_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(0)
                .with_records(Some(Bytes::from(batch)))])]);
    let resp: ProduceResponse = conn.call(ApiKey::Produce, 9, &req)?;
    let p = &resp.responses[0].partition_responses[0];
    Ok((p.error_code, p.base_offset))
}

#[test]
fn retried_batch_is_not_duplicated_and_gaps_are_refused() -> Result<()> {
    let mut g = Gregor::start(BIN, &[])?;
    let bs = g.bootstrap();
    let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", &bs).create()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(admin.create_topics(
        &[rdkafka::admin::NewTopic::new(
            "idem",
            1,
            rdkafka::admin::TopicReplication::Fixed(1),
        )],
        &rdkafka::admin::AdminOptions::new(),
    ))?;

    let mut conn = KafkaConn::connect(&bs, "idempotence-test")?;
    let init: InitProducerIdResponse = conn.call(
        ApiKey::InitProducerId,
        4,
        &InitProducerIdRequest::default()
            .with_transactional_id(None)
            .with_transaction_timeout_ms(60_000)
            .with_producer_id(kafka_protocol::messages::ProducerId(-1))
            .with_producer_epoch(-1),
    )?;
    ensure!(
        init.error_code == 0,
        "InitProducerId error {}",
        init.error_code
    );
    let pid = init.producer_id.0;
    let batch = |seq: i32, n: usize| {
        let mut b = BatchBuilder::new(0, 1_000).producer(pid, 0, seq);
        for i in 0..n {
            b = b.record(1_000, None, Some(format!("r{seq}-{i}").as_bytes()), &[]);
        }
        b.build()
    };
    ensure!(produce(&mut conn, "idem", batch(0, 3))? == (0, 0));
    ensure!(produce(&mut conn, "idem", batch(3, 2))? == (0, 3));
    // The retry of the first batch gets its original offset and is not stored again.
    ensure!(produce(&mut conn, "idem", batch(0, 3))? == (0, 0));
    ensure!(produce(&mut conn, "idem", batch(3, 2))? == (0, 3));
    // A gap in sequence numbers: OUT_OF_ORDER_SEQUENCE_NUMBER (45).
    let (code, _) = produce(&mut conn, "idem", batch(9, 1))?;
    ensure!(code == 45, "gap answered with {code}");

    let check_end = |expected: i64| -> Result<()> {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &bs)
            .set("group.id", "x")
            .create()?;
        let (_, high) = c.fetch_watermarks("idem", 0, Duration::from_secs(30))?;
        ensure!(
            high == expected,
            "log end offset {high}, expected {expected}"
        );
        Ok(())
    };
    check_end(5)?;

    // Producer state is rebuilt after a restart (graceful and crash): the retry is still a
    // duplicate and the next sequence continues.
    for crash in [false, true] {
        if crash {
            g.kill9()?;
        }
        g.restart()?;
        let mut conn = KafkaConn::connect(&bs, "idempotence-test").context("reconnecting")?;
        ensure!(produce(&mut conn, "idem", batch(3, 2))? == (0, 3));
        check_end(5)?;
    }
    let mut conn = KafkaConn::connect(&bs, "idempotence-test")?;
    ensure!(produce(&mut conn, "idem", batch(5, 1))? == (0, 5));
    check_end(6)?;
    // A new producer id never reuses an old one, even after restarts.
    let init2: InitProducerIdResponse = conn.call(
        ApiKey::InitProducerId,
        4,
        &InitProducerIdRequest::default()
            .with_transactional_id(None)
            .with_transaction_timeout_ms(60_000)
            .with_producer_id(kafka_protocol::messages::ProducerId(-1))
            .with_producer_epoch(-1),
    )?;
    ensure!(init2.producer_id.0 > pid, "producer id reused");
    Ok(())
}
