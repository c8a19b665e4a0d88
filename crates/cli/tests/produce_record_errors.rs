//! KIP-467: a produced batch with invalid records (a null key on a compacted topic, a
//! timestamp out of range) is refused whole with INVALID_RECORD / INVALID_TIMESTAMP, and the
//! ProduceResponse names the records (`record_errors`: batch index and message) with Kafka's
//! `error_message` and the log start offset (Kafka's `LogValidator` and `ReplicaManager`).
//! librdkafka then fails the named records with INVALID_RECORD and the others of the batch
//! with its local `_INVALID_DIFFERENT_RECORD` (librdkafka's test 0011_produce_batch); records
//! in batches of their own are delivered. The wire answers are compared with Apache Kafka
//! 4.4.0's when its jars are present.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, ensure, Context, Result};
use gregor_protocol::batch::BatchBuilder;
use gregor_tests::process::{free_port, ChildGuard};
use gregor_tests::reference::{self, Instance};
use gregor_tests::wire::{sb, KafkaConn};
use gregor_tests::{clients, Gregor};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::produce_response::PartitionProduceResponse;
use kafka_protocol::messages::{ApiKey, ProduceRequest, ProduceResponse, TopicName};
use rdkafka::config::ClientConfig;
use rdkafka::message::DeliveryResult;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientContext;

const BIN: &str = env!("CARGO_BIN_EXE_gregor");

/// A record's number and its delivery error (None: delivered).
type Outcome = (usize, Option<RDKafkaErrorCode>);

/// Delivery outcomes by record number.
#[derive(Clone, Default)]
struct Outcomes(Arc<Mutex<Vec<Outcome>>>);

impl ClientContext for Outcomes {}

impl ProducerContext for Outcomes {
    type DeliveryOpaque = Box<usize>;

    fn delivery(&self, result: &DeliveryResult<'_>, id: Self::DeliveryOpaque) {
        let code = match result {
            Ok(_) => None,
            Err((e, _)) => Some(e.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Unknown)),
        };
        if let Ok(mut v) = self.0.lock() {
            v.push((*id, code));
        }
    }
}

/// Produces 100 records to partition 0 of `topic`, every tenth without a key (librdkafka's
/// 0011 test), and returns each record's outcome, in record order.
fn produce_hundred(
    bootstrap: &str,
    topic: &str,
    batch_size: Option<&str>,
) -> Result<Vec<Option<RDKafkaErrorCode>>> {
    let outcomes = Outcomes::default();
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "200")
        .set("message.timeout.ms", "30000");
    if let Some(b) = batch_size {
        config.set("batch.size", b);
    }
    let p: BaseProducer<Outcomes> = config.create_with_context(outcomes.clone())?;
    for i in 0..100usize {
        let value = format!("record {i}");
        let mut r = BaseRecord::with_opaque_to(topic, Box::new(i))
            .payload(&value)
            .partition(0);
        if i % 10 != 0 {
            r = r.key(&value);
        }
        p.send(r).map_err(|(e, _)| e)?;
    }
    p.flush(Duration::from_secs(30))?;
    let mut got = outcomes
        .0
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .clone();
    got.sort_by_key(|(i, _)| *i);
    ensure!(got.len() == 100, "{} delivery reports", got.len());
    Ok(got.into_iter().map(|(_, c)| c).collect())
}

#[test]
fn keyless_records_in_a_batch_fail_alone_with_record_errors() -> Result<()> {
    let g = Gregor::start(BIN, &[])?;
    let b = g.bootstrap();
    clients::create_topic_with(&b, "compacted", 1, &[("cleanup.policy", "compact")])?;

    // One batch (or a few): the ten keyless records fail with INVALID_RECORD, the other
    // ninety with librdkafka's _INVALID_DIFFERENT_RECORD (the batch was refused whole).
    let outcomes = produce_hundred(&b, "compacted", None)?;
    for (i, o) in outcomes.iter().enumerate() {
        let want = if i % 10 == 0 {
            RDKafkaErrorCode::InvalidRecord
        } else {
            RDKafkaErrorCode::InvalidDifferentRecord
        };
        ensure!(*o == Some(want), "record {i}: {o:?}, expected {want:?}");
    }

    // One record per batch: only the keyless ones fail, the ninety others are delivered.
    let outcomes = produce_hundred(&b, "compacted", Some("1"))?;
    for (i, o) in outcomes.iter().enumerate() {
        let want = (i % 10 == 0).then_some(RDKafkaErrorCode::InvalidRecord);
        ensure!(
            *o == want,
            "record {i} (own batch): {o:?}, expected {want:?}"
        );
    }
    Ok(())
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Sends one Produce v9 of `batch` to partition 0 of `topic` and returns its partition answer.
fn produce_raw(bootstrap: &str, topic: &str, batch: Vec<u8>) -> Result<PartitionProduceResponse> {
    let mut conn = KafkaConn::connect(bootstrap, "record-errors")?;
    let req = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(10_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(sb(topic)))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(0)
                .with_records(Some(batch.into()))])]);
    // The leader may need a moment after creation (Kafka).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let resp: ProduceResponse = conn.call(ApiKey::Produce, 9, &req)?;
        let p = resp
            .responses
            .first()
            .and_then(|t| t.partition_responses.first())
            .cloned()
            .context("no partition in the Produce response")?;
        // NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION: not ready yet.
        if matches!(p.error_code, 6 | 3) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
            continue;
        }
        return Ok(p);
    }
}

/// A partition's answer: error code, base offset, error message, record errors (batch
/// index, message), log start offset.
type Summary = (i16, i64, Option<String>, Vec<(i32, Option<String>)>, i64);

/// What a broker answered for the two invalid batches, with the parts that vary removed.
#[derive(Debug, PartialEq, Eq)]
struct Answers {
    keyless: Summary,
    old_timestamp: Summary,
}

fn summary(p: &PartitionProduceResponse) -> Summary {
    (
        p.error_code,
        p.base_offset,
        p.error_message.as_ref().map(ToString::to_string),
        p.record_errors
            .iter()
            .map(|e| {
                (
                    e.batch_index,
                    e.batch_index_error_message
                        .as_ref()
                        .map(ToString::to_string),
                )
            })
            .collect(),
        p.log_start_offset,
    )
}

/// The wire check run against gregor and Kafka: a batch of five with records 1 and 3 keyless
/// on a compacted topic; a batch of three whose record 2 is two hours old on a topic that
/// accepts one hour.
fn wire_answers(bootstrap: &str) -> Result<Answers> {
    clients::create_topic_with(bootstrap, "kip467-c", 1, &[("cleanup.policy", "compact")])?;
    clients::create_topic_with(
        bootstrap,
        "kip467-t",
        1,
        &[("message.timestamp.before.max.ms", "3600000")],
    )?;
    let now = now_ms();
    let mut b = BatchBuilder::new(0, now);
    for i in 0..5 {
        let key = (i % 2 == 0).then_some(b"k".as_slice());
        b = b.record(now, key, Some(b"v"), &[]);
    }
    let keyless = produce_raw(bootstrap, "kip467-c", b.build())?;
    let old = now - 2 * 3_600_000;
    let b = BatchBuilder::new(0, now)
        .record(now, Some(b"k"), Some(b"v"), &[])
        .record(now, Some(b"k"), Some(b"v"), &[])
        .record(old, Some(b"k"), Some(b"v"), &[]);
    let mut old_timestamp = summary(&produce_raw(bootstrap, "kip467-t", b.build())?);
    // The message names the broker's clock ("... should be within [now - 1 h, ...]").
    if let Some((_, m)) = old_timestamp.3.get_mut(0) {
        if let Some(m) = m.as_mut() {
            if let Some(cut) = m.find(" is out of range") {
                m.truncate(cut);
            }
        }
    }
    Ok(Answers {
        keyless: summary(&keyless),
        old_timestamp,
    })
}

fn expected() -> Answers {
    let key_error =
        "Compacted topic cannot accept message without key in topic partition kip467-c-0";
    Answers {
        keyless: (
            87,
            -1,
            Some(format!(
                "One or more records have been rejected due to 2 record errors in total, and only showing the first three errors at most: [RecordError(batchIndex=1, message='{key_error}'), RecordError(batchIndex=3, message='{key_error}')]"
            )),
            vec![
                (1, Some(key_error.to_string())),
                (3, Some(key_error.to_string())),
            ],
            0,
        ),
        old_timestamp: (
            32,
            -1,
            Some("One or more records have been rejected due to invalid timestamp".into()),
            vec![(2, Some("Timestamp {} of message with offset 2".to_string()))],
            0,
        ),
    }
}

/// Normalises the timestamp in the second answer's record message (it is the test's clock).
fn without_timestamp(mut a: Answers) -> Answers {
    if let Some((_, Some(m))) = a.old_timestamp.3.get_mut(0) {
        if let (Some(start), Some(end)) = (m.find("Timestamp "), m.find(" of message")) {
            m.replace_range(start + "Timestamp ".len()..end, "{}");
        }
    }
    a
}

#[test]
fn record_errors_on_the_wire() -> Result<()> {
    let g = Gregor::start(BIN, &[])?;
    let got = without_timestamp(wire_answers(&g.bootstrap())?);
    ensure!(got == expected(), "gregor answered {got:#?}");
    Ok(())
}

/// The same batches against Apache Kafka 4.4.0: the expectations above are Kafka's answers.
#[test]
fn record_errors_on_the_wire_kafka() -> Result<()> {
    if !reference::jars_or_skip() {
        return Ok(());
    }
    let (instance, _guard) = start_kafka()?;
    let got = without_timestamp(wire_answers(&instance.bootstrap())?);
    if got != expected() {
        bail!("Kafka answered {got:#?}");
    }
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
