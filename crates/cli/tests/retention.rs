//! Retention, DeleteRecords and compaction against the real binary, driven by librdkafka and
//! by raw Kafka requests.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use bytes::{Bytes, BytesMut};
use gregor_tests::{clients, Gregor};
use kafka_protocol::messages::delete_records_request::{
    DeleteRecordsPartition, DeleteRecordsTopic,
};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

const BIN: &str = env!("CARGO_BIN_EXE_gregor");
const TIMEOUT: Duration = Duration::from_secs(30);

fn runtime() -> tokio::runtime::Runtime {
    clients::runtime().expect("tokio runtime")
}

fn admin(bootstrap: &str) -> Result<AdminClient<DefaultClientContext>> {
    clients::admin(bootstrap)
}

fn create_topic(bootstrap: &str, name: &str, configs: &[(&str, &str)]) -> Result<()> {
    clients::create_topic_with(bootstrap, name, 1, configs)
}

fn producer(bootstrap: &str) -> Result<BaseProducer> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .create()?)
}

fn produce(
    p: &BaseProducer,
    topic: &str,
    n: usize,
    key: impl Fn(usize) -> String,
    value_len: usize,
) -> Result<()> {
    let value = vec![b'v'; value_len];
    for i in 0..n {
        let k = key(i);
        loop {
            match p.send(BaseRecord::to(topic).key(&k).payload(&value)) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(_), _)) => {
                    p.poll(Duration::from_millis(10));
                }
                Err((e, _)) => bail!("produce: {e}"),
            }
        }
        p.poll(Duration::ZERO);
    }
    p.flush(TIMEOUT)?;
    Ok(())
}

fn consumer(bootstrap: &str, reset: &str) -> Result<BaseConsumer> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "retention-test")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", reset)
        .create()?)
}

fn watermarks(c: &BaseConsumer, topic: &str) -> Result<(i64, i64)> {
    Ok(c.fetch_watermarks(topic, 0, TIMEOUT)?)
}

fn wait_for(what: &str, mut f: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + TIMEOUT;
    while Instant::now() < deadline {
        if f()? {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("timed out waiting for {what}")
}

fn start() -> Result<Gregor> {
    Gregor::start(
        BIN,
        &[
            "log.retention.check.interval.ms=200",
            "log.segment.delete.delay.ms=100",
            "log.cleaner.backoff.ms=100",
        ],
    )
}

#[test]
fn retention_by_size_while_a_consumer_reads() -> Result<()> {
    let g = start()?;
    let b = g.bootstrap();
    create_topic(
        &b,
        "sized",
        &[("segment.bytes", "1048576"), ("retention.bytes", "2097152")],
    )?;
    let c = consumer(&b, "earliest")?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("sized", 0, Offset::Beginning)?;
    c.assign(&tpl)?;
    let p = producer(&b)?;
    let mut last_seen = -1i64;
    for round in 0..8 {
        produce(&p, "sized", 1000, |i| format!("k{round}-{i}"), 1000)?;
        // Read a little while retention deletes under the consumer.
        let until = Instant::now() + Duration::from_millis(300);
        while Instant::now() < until {
            if let Some(m) = c.poll(Duration::from_millis(50)) {
                match m {
                    Ok(m) => {
                        ensure!(m.offset() > last_seen, "offsets increase");
                        last_seen = m.offset();
                    }
                    Err(e) => bail!("consumer error: {e}"),
                }
            }
        }
    }
    let (_, high) = watermarks(&c, "sized")?;
    ensure!(high == 8000);
    wait_for("retention.bytes to delete segments", || {
        Ok(watermarks(&c, "sized")?.0 > 0)
    })?;
    let (low, _) = watermarks(&c, "sized")?;
    // What is left is about retention.bytes (plus the active segment).
    ensure!(high - low < 4000, "kept {} records", high - low);
    // The consumer keeps going to the end (reset to the new start if it fell behind).
    wait_for("the consumer to reach the end", || {
        if let Some(Ok(m)) = c.poll(Duration::from_millis(100)) {
            ensure!(
                m.offset() > last_seen || m.offset() >= low,
                "offsets move on"
            );
            last_seen = m.offset();
        }
        Ok(last_seen == high - 1)
    })?;
    Ok(())
}

#[test]
fn retention_by_time_deletes_everything_old() -> Result<()> {
    let g = start()?;
    let b = g.bootstrap();
    create_topic(
        &b,
        "timed",
        // Long enough that the records are surely still there when first checked on a
        // loaded machine (1,500 ms was not, in a full CI run), short enough to wait for.
        &[("retention.ms", "5000"), ("segment.ms", "200")],
    )?;
    let p = producer(&b)?;
    produce(&p, "timed", 50, |i| format!("a{i}"), 100)?;
    std::thread::sleep(Duration::from_millis(300));
    produce(&p, "timed", 50, |i| format!("b{i}"), 100)?;
    let c = consumer(&b, "earliest")?;
    ensure!(watermarks(&c, "timed")? == (0, 100));
    wait_for("retention.ms to delete every segment", || {
        Ok(watermarks(&c, "timed")? == (100, 100))
    })?;
    // New records are kept and readable from the new start.
    produce(&p, "timed", 5, |i| format!("c{i}"), 100)?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("timed", 0, Offset::Beginning)?;
    c.assign(&tpl)?;
    let mut got = Vec::new();
    wait_for("the new records", || {
        if let Some(m) = c.poll(Duration::from_millis(100)) {
            got.push(m?.offset());
        }
        Ok(got.len() == 5)
    })?;
    ensure!(got == (100..105).collect::<Vec<_>>(), "{got:?}");
    Ok(())
}

struct Conn {
    s: TcpStream,
    correlation: i32,
}

impl Conn {
    fn new(g: &Gregor) -> Result<Self> {
        Ok(Self {
            s: TcpStream::connect(g.bootstrap())?,
            correlation: 0,
        })
    }

    fn call(&mut self, key: ApiKey, version: i16, req: RequestKind) -> Result<ResponseKind> {
        self.correlation += 1;
        let mut buf = BytesMut::new();
        RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation)
            .with_client_id(Some(StrBytes::from_static_str("retention-test")))
            .encode(&mut buf, key.request_header_version(version))?;
        req.encode(&mut buf, version)?;
        self.s.write_all(&(buf.len() as i32).to_be_bytes())?;
        self.s.write_all(&buf)?;
        let mut len = [0u8; 4];
        self.s.read_exact(&mut len).context("no response")?;
        let mut body = vec![0u8; i32::from_be_bytes(len) as usize];
        self.s.read_exact(&mut body)?;
        let mut b = Bytes::from(body);
        let h = ResponseHeader::decode(&mut b, key.response_header_version(version))?;
        ensure!(h.correlation_id == self.correlation);
        let r = ResponseKind::decode(key, &mut b, version)?;
        ensure!(b.is_empty(), "{key:?} v{version}: trailing bytes");
        Ok(r)
    }

    fn delete_records(&mut self, version: i16, topic: &str, offset: i64) -> Result<(i16, i64)> {
        let req = DeleteRecordsRequest::default()
            .with_timeout_ms(5000)
            .with_topics(vec![DeleteRecordsTopic::default()
                .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                .with_partitions(vec![DeleteRecordsPartition::default()
                    .with_partition_index(0)
                    .with_offset(offset)])]);
        let ResponseKind::DeleteRecords(r) =
            self.call(ApiKey::DeleteRecords, version, req.into())?
        else {
            bail!("wrong response kind");
        };
        let p = &r.topics[0].partitions[0];
        Ok((p.error_code, p.low_watermark))
    }

    fn fetch_error(&mut self, topic: &str, offset: i64) -> Result<(i16, i64)> {
        let req = FetchRequest::default()
            .with_max_wait_ms(0)
            .with_max_bytes(1 << 20)
            .with_topics(vec![FetchTopic::default()
                .with_topic(TopicName(StrBytes::from_string(topic.to_string())))
                .with_partitions(vec![FetchPartition::default()
                    .with_partition(0)
                    .with_fetch_offset(offset)
                    .with_partition_max_bytes(1 << 20)])]);
        let ResponseKind::Fetch(r) = self.call(ApiKey::Fetch, 12, req.into())? else {
            bail!("wrong response kind");
        };
        let p = &r.responses[0].partitions[0];
        Ok((p.error_code, p.log_start_offset))
    }
}

#[test]
fn delete_records_moves_the_log_start_offset_at_every_version() -> Result<()> {
    let mut g = start()?;
    let b = g.bootstrap();
    create_topic(&b, "dr", &[("segment.bytes", "1048576")])?;
    create_topic(&b, "dr-compact", &[("cleanup.policy", "compact")])?;
    let p = producer(&b)?;
    produce(&p, "dr", 3000, |i| format!("k{i}"), 1000)?;
    let mut conn = Conn::new(&g)?;
    let mut expected_low = 0;
    for v in 0..=2 {
        expected_low += 100;
        let (code, low) = conn.delete_records(v, "dr", expected_low)?;
        ensure!(
            (code, low) == (0, expected_low),
            "DeleteRecords v{v}: {code} {low}"
        );
    }
    // Beyond the high watermark, and compacted topics, are refused as Kafka does.
    ensure!(conn.delete_records(2, "dr", 3001)?.0 == 1);
    ensure!(conn.delete_records(2, "dr-compact", 0)?.0 == 44);
    ensure!(conn.delete_records(2, "no-such-topic", 0)?.0 == 3);
    // A smaller offset leaves the start where it is.
    ensure!(conn.delete_records(2, "dr", 5)? == (0, 300));
    // Fetches below the start are out of range; at the start they work.
    // As Kafka, an out-of-range fetch reports the offsets as unknown (-1); the next line
    // shows the new log start offset.
    ensure!(conn.fetch_error("dr", 299)? == (1, -1));
    ensure!(conn.fetch_error("dr", 300)? == (0, 300));
    // rdkafka's admin client and watermarks agree.
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("dr", 0, Offset::Offset(1500))?;
    let res = runtime().block_on(admin(&b)?.delete_records(&tpl, &AdminOptions::new()))?;
    let e = res.find_partition("dr", 0).context("partition in result")?;
    ensure!(e.offset() == Offset::Offset(1500), "{:?}", e.offset());
    let c = consumer(&b, "error")?;
    ensure!(watermarks(&c, "dr")? == (1500, 3000));
    // -1 means the high watermark.
    ensure!(conn.delete_records(1, "dr", -1)? == (0, 3000));
    // The start survives a kill -9 (log-start-offset-checkpoint).
    drop(conn);
    drop(c);
    g.kill9()?;
    g.restart()?;
    let c = consumer(&g.bootstrap(), "error")?;
    ensure!(watermarks(&c, "dr")? == (3000, 3000));
    let mut conn = Conn::new(&g)?;
    ensure!(conn.fetch_error("dr", 0)?.0 == 1);
    Ok(())
}

#[test]
fn compaction_keeps_the_latest_value_per_key() -> Result<()> {
    let g = start()?;
    let b = g.bootstrap();
    create_topic(
        &b,
        "compacted",
        &[
            ("cleanup.policy", "compact"),
            ("segment.ms", "100"),
            ("min.cleanable.dirty.ratio", "0.01"),
            ("delete.retention.ms", "86400000"),
        ],
    )?;
    let p = producer(&b)?;
    for round in 0..6 {
        let value = format!("round-{round}");
        for k in 0..20 {
            let key = format!("key-{k}");
            p.send(BaseRecord::to("compacted").key(&key).payload(&value))
                .map_err(|(e, _)| e)?;
        }
        p.flush(TIMEOUT)?;
        std::thread::sleep(Duration::from_millis(150));
    }
    // A keyless record is rejected (INVALID_RECORD).
    let strict: rdkafka::producer::FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &b)
        .set("message.send.max.retries", "0")
        .create()?;
    let delivery = runtime().block_on(strict.send(
        rdkafka::producer::FutureRecord::<(), _>::to("compacted").payload("no key"),
        TIMEOUT,
    ));
    match delivery {
        Err((KafkaError::MessageProduction(code), _)) => ensure!(
            code == rdkafka::types::RDKafkaErrorCode::InvalidRecord,
            "{code:?}"
        ),
        other => bail!("keyless record on a compacted topic: {other:?}"),
    }
    // The cleaner runs in the background; read everything once it shrank the log.
    let c = consumer(&b, "earliest")?;
    let read_all = || -> Result<Vec<(String, String, i64)>> {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset("compacted", 0, Offset::Beginning)?;
        c.assign(&tpl)?;
        let (_, high) = watermarks(&c, "compacted")?;
        let mut out = Vec::new();
        let deadline = Instant::now() + TIMEOUT;
        while Instant::now() < deadline {
            if let Some(m) = c.poll(Duration::from_millis(100)) {
                let m = m?;
                out.push((
                    String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned(),
                    String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
                    m.offset(),
                ));
                if m.offset() == high - 1 {
                    break;
                }
            }
        }
        Ok(out)
    };
    let mut records = Vec::new();
    wait_for("the cleaner to compact", || {
        records = read_all()?;
        Ok(records.len() < 60)
    })?;
    let offsets: Vec<i64> = records.iter().map(|r| r.2).collect();
    ensure!(offsets.windows(2).all(|w| w[0] < w[1]));
    let mut latest = std::collections::BTreeMap::new();
    for (k, v, _) in &records {
        latest.insert(k.clone(), v.clone());
    }
    ensure!(latest.len() == 20, "{latest:?}");
    ensure!(latest.values().all(|v| v == "round-5"), "{latest:?}");
    ensure!(offsets.last() == Some(&119), "{offsets:?}");
    Ok(())
}
