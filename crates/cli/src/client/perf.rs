//! `gregor perf produce|consume`: the load generator of `cargo xtask bench`, built on rdkafka so
//! that it drives gregor and Apache Kafka identically.
//!
//! `produce` sends `--num-records` records of `--record-size` bytes (random upper-case letters,
//! as Kafka's ProducerPerformance, so compression has something to do), unthrottled or at
//! `--throughput` records/s. With `--latency` a consumer in the same process reads the topic
//! from the beginning while the producer runs; each record carries its send time (microseconds
//! since the epoch, in its first 8 bytes), so the end-to-end latency (send to consumer receipt)
//! is measured on one clock. `consume` reads `--num-records` from the beginning of every
//! partition. Both print one JSON object: records/s, MB/s (10^6 bytes of record values) and,
//! for `--latency`, p50/p99/p99.9 in milliseconds.
//!
//! Transactions (KIP-98, issue 12): `produce --transactional-id ID` produces in transactions
//! of `--transaction-records` records (InitProducerId once, then begin, send, commit, each
//! commit waited for), and its latency consumer reads with read_committed, so the latency runs
//! until the record's transaction is committed and its marker written; `consume
//! --isolation-level read_committed` reads committed records only (up to the last stable
//! offset, skipping aborted data and control batches).

use super::ConnectionArgs;
use anyhow::{bail, Context, Result};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, Message, Offset, TopicPartitionList};
use serde_json::json;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// `gregor perf ...`
#[derive(clap::Args, Debug)]
pub struct PerfArgs {
    #[command(subcommand)]
    command: PerfCommand,
}

#[derive(clap::Subcommand, Debug)]
enum PerfCommand {
    /// Produce records as fast as possible or at a fixed rate; report throughput (and latency).
    Produce(ProduceArgs),
    /// Consume records from the beginning of every partition; report throughput.
    Consume(ConsumeArgs),
}

#[derive(clap::Args, Debug)]
struct ProduceArgs {
    /// Topic (created beforehand).
    #[arg(long)]
    topic: String,
    #[command(flatten)]
    connection: ConnectionArgs,
    /// Records to send.
    #[arg(long)]
    num_records: u64,
    /// Bytes per record value (at least 8: the send time).
    #[arg(long, default_value_t = 1024)]
    record_size: usize,
    /// Records per second; -1: as fast as possible.
    #[arg(long, default_value_t = -1, allow_hyphen_values = true)]
    throughput: i64,
    /// acks: 0, 1 or all.
    #[arg(long, default_value = "1")]
    acks: String,
    /// compression.type: none, gzip, snappy, lz4, zstd.
    #[arg(long, default_value = "none")]
    compression: String,
    /// Also consume the topic while producing and report end-to-end latency (with
    /// `--transactional-id`, read_committed: the latency until the commit is visible).
    #[arg(long)]
    latency: bool,
    /// Produce in transactions with this `transactional.id` (KIP-98): `--transaction-records`
    /// records per transaction, each committed before the next begins.
    #[arg(long)]
    transactional_id: Option<String>,
    /// Records per transaction (with `--transactional-id`).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    transaction_records: u64,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout_secs: u64,
}

#[derive(clap::Args, Debug)]
struct ConsumeArgs {
    /// Topic to read from the beginning.
    #[arg(long)]
    topic: String,
    #[command(flatten)]
    connection: ConnectionArgs,
    /// Records to read.
    #[arg(long)]
    num_records: u64,
    /// `isolation.level`: read_uncommitted, or read_committed (records of committed
    /// transactions only, up to the last stable offset; KIP-98).
    #[arg(long, default_value = "read_uncommitted", value_parser = ["read_uncommitted", "read_committed"])]
    isolation_level: String,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout_secs: u64,
}

impl PerfArgs {
    /// The connection options of the chosen subcommand.
    pub fn connection(&self) -> &ConnectionArgs {
        match &self.command {
            PerfCommand::Produce(a) => &a.connection,
            PerfCommand::Consume(a) => &a.connection,
        }
    }
}

/// Runs `gregor perf ...`.
pub async fn run(args: PerfArgs) -> Result<()> {
    // rdkafka's base clients block; keep them off the async runtime's threads.
    tokio::task::spawn_blocking(move || match args.command {
        PerfCommand::Produce(a) => produce(&a),
        PerfCommand::Consume(a) => consume(&a),
    })
    .await
    .context("perf task panicked")?
}

struct CountingContext {
    delivered: AtomicU64,
    failed: AtomicU64,
}

impl ClientContext for CountingContext {}

impl ProducerContext for CountingContext {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: Self::DeliveryOpaque) {
        match result {
            Ok(_) => self.delivered.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.failed.fetch_add(1, Ordering::Relaxed),
        };
    }
}

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// A payload of random upper-case letters, as ProducerPerformance fills its records.
fn payload(size: usize) -> Vec<u8> {
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15 ^ now_micros();
    (0..size.max(8))
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            b'A' + u8::try_from(state % 26).unwrap_or(0)
        })
        .collect()
}

fn produce(a: &ProduceArgs) -> Result<()> {
    if a.record_size < 8 {
        bail!("--record-size must be at least 8 (the send time)");
    }
    let context = CountingContext {
        delivered: AtomicU64::new(0),
        failed: AtomicU64::new(0),
    };
    let mut config = vec![
        ("acks", a.acks.as_str()),
        ("compression.type", a.compression.as_str()),
        ("linger.ms", "5"),
        ("queue.buffering.max.kbytes", "262144"),
    ];
    if let Some(id) = &a.transactional_id {
        config.push(("transactional.id", id.as_str()));
    }
    let producer: BaseProducer<CountingContext> = a
        .connection
        .client_config(&config)
        .create_with_context(context)
        .context("creating the producer")?;
    let deadline = Instant::now() + Duration::from_secs(a.timeout_secs);
    let transactional = a.transactional_id.is_some();
    if transactional {
        producer
            .init_transactions(deadline.saturating_duration_since(Instant::now()))
            .context("initialising transactions (InitProducerId)")?;
    }
    let isolation = if transactional {
        "read_committed"
    } else {
        "read_uncommitted"
    };

    let latency = if a.latency {
        let consumer = assigned_consumer(&a.connection, &a.topic, isolation)?;
        let expected = a.num_records;
        let deadline = Instant::now() + Duration::from_secs(a.timeout_secs);
        Some(std::thread::spawn(move || -> Result<Vec<u32>> {
            let mut latencies_us = Vec::with_capacity(usize::try_from(expected).unwrap_or(0));
            while (latencies_us.len() as u64) < expected && Instant::now() < deadline {
                match consumer.poll(Duration::from_millis(100)) {
                    Some(Ok(m)) => {
                        let now = now_micros();
                        if let Some(v) = m.payload() {
                            if let Some(sent) = v.get(..8) {
                                let sent = u64::from_be_bytes(sent.try_into().unwrap_or([0; 8]));
                                latencies_us.push(
                                    u32::try_from(now.saturating_sub(sent)).unwrap_or(u32::MAX),
                                );
                            }
                        }
                    }
                    Some(Err(e)) => eprintln!("perf consumer: {e}"),
                    None => {}
                }
            }
            Ok(latencies_us)
        }))
    } else {
        None
    };

    let mut value = payload(a.record_size);
    let start = Instant::now();
    let mut transactions = 0u64;
    let interval = (a.throughput > 0).then(|| Duration::from_secs_f64(1.0 / a.throughput as f64));
    for i in 0..a.num_records {
        if transactional && i % a.transaction_records == 0 {
            if i > 0 {
                producer
                    .commit_transaction(deadline.saturating_duration_since(Instant::now()))
                    .context("committing a transaction")?;
                transactions += 1;
            }
            producer
                .begin_transaction()
                .context("beginning a transaction")?;
        }
        if let Some(interval) = interval {
            // A fixed rate: wait for this record's slot (the throttle is the point here).
            let due = start + interval.mul_f64(i as f64);
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
        }
        value[..8].copy_from_slice(&now_micros().to_be_bytes());
        let mut record: BaseRecord<'_, (), [u8]> = BaseRecord::to(&a.topic).payload(&value[..]);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    producer.poll(Duration::from_millis(5));
                    if Instant::now() > deadline {
                        bail!("timed out with a full producer queue");
                    }
                }
                Err((e, _)) => bail!("producing: {e}"),
            }
        }
        if i % 1024 == 0 {
            producer.poll(Duration::ZERO);
        }
    }
    if transactional && a.num_records > 0 {
        producer
            .commit_transaction(deadline.saturating_duration_since(Instant::now()))
            .context("committing the last transaction")?;
        transactions += 1;
    }
    producer
        .flush(deadline.saturating_duration_since(Instant::now()))
        .context("flushing the producer")?;
    let seconds = start.elapsed().as_secs_f64();
    let delivered = producer.context().delivered.load(Ordering::Relaxed);
    let failed = producer.context().failed.load(Ordering::Relaxed);
    let mut out = summary(delivered, a.record_size, seconds);
    out["failed"] = json!(failed);
    if transactional {
        out["transactions"] = json!(transactions);
    }
    if let Some(handle) = latency {
        let mut lat = handle
            .join()
            .map_err(|_| anyhow::anyhow!("latency consumer panicked"))??;
        out["consumed"] = json!(lat.len());
        lat.sort_unstable();
        let pct = |p: f64| -> f64 {
            if lat.is_empty() {
                return -1.0;
            }
            let idx = ((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1;
            f64::from(lat[idx]) / 1000.0
        };
        out["latency_ms"] = json!({"p50": pct(0.50), "p99": pct(0.99), "p999": pct(0.999)});
    }
    println!("{out}");
    if failed > 0 {
        bail!("{failed} records were not delivered");
    }
    Ok(())
}

fn summary(records: u64, record_size: usize, seconds: f64) -> serde_json::Value {
    let bytes = records as f64 * record_size as f64;
    json!({
        "records": records,
        "seconds": seconds,
        "records_per_sec": records as f64 / seconds,
        "mb_per_sec": bytes / seconds / 1e6,
    })
}

/// A consumer assigned to every partition of `topic` from the beginning (no group, no
/// commits), with `isolation.level` `isolation`.
fn assigned_consumer(
    connection: &ConnectionArgs,
    topic: &str,
    isolation: &str,
) -> Result<BaseConsumer> {
    let consumer: BaseConsumer = connection
        .client_config(&[
            ("group.id", "gregor-perf"),
            ("isolation.level", isolation),
            ("enable.auto.commit", "false"),
            ("enable.partition.eof", "false"),
            ("fetch.wait.max.ms", "100"),
        ])
        .create()
        .context("creating the consumer")?;
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(30))
        .context("fetching metadata")?;
    let partitions = metadata
        .topics()
        .first()
        .map_or(0, |t| t.partitions().len());
    if partitions == 0 {
        bail!("topic {topic} has no partitions (create it first)");
    }
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, i32::try_from(p)?, Offset::Beginning)?;
    }
    consumer.assign(&tpl).context("assigning partitions")?;
    Ok(consumer)
}

fn consume(a: &ConsumeArgs) -> Result<()> {
    let consumer = assigned_consumer(&a.connection, &a.topic, &a.isolation_level)?;
    let deadline = Instant::now() + Duration::from_secs(a.timeout_secs);
    let mut records = 0u64;
    let mut bytes = 0u64;
    let mut start = None;
    while records < a.num_records {
        if Instant::now() > deadline {
            bail!("timed out after {records} of {} records", a.num_records);
        }
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                start.get_or_insert_with(Instant::now);
                records += 1;
                bytes += m.payload().map_or(0, |p| p.len() as u64);
            }
            Some(Err(e)) => eprintln!("perf consumer: {e}"),
            None => {}
        }
    }
    let seconds = start.map_or(0.0, |s| s.elapsed().as_secs_f64());
    let record_size = usize::try_from(bytes / records.max(1)).unwrap_or(0);
    println!("{}", summary(records, record_size, seconds));
    Ok(())
}
