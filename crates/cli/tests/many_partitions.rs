//! Many partitions within few file descriptors (issue 14): a broker whose open-file limit is
//! 512 (soft and hard, so it cannot raise it) hosts 2,000 partitions, takes a record in every
//! one through librdkafka, and gives every acknowledged record back after a clean restart and
//! after kill -9. Kafka would need at least 2,000 descriptors (one per segment) for this.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use gregor_tests::{clients, Gregor};
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::{ClientContext, Offset, TopicPartitionList};

const BIN: &str = env!("CARGO_BIN_EXE_gregor");
const NOFILE: u64 = 512;
const TOPICS: usize = 20;
const PARTITIONS_PER_TOPIC: i32 = 100;
/// `log.index.cache.bytes`: not the default, so /metrics shows that the setting reached the log.
const INDEX_CACHE_BYTES: u64 = 64 * 1024 * 1024;

/// (topic, partition) -> offset -> value of every acknowledged record.
type Acked = BTreeMap<(String, i32), BTreeMap<i64, Vec<u8>>>;

#[derive(Default)]
struct Acks(Mutex<(Acked, Vec<String>)>);

impl ClientContext for Acks {}

impl ProducerContext for Acks {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        let mut state = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match result {
            Ok(m) => {
                state
                    .0
                    .entry((m.topic().to_string(), m.partition()))
                    .or_default()
                    .insert(m.offset(), m.payload().unwrap_or_default().to_vec());
            }
            Err((e, m)) => state
                .1
                .push(format!("{}-{}: {e}", m.topic(), m.partition())),
        }
    }
}

fn topic(i: usize) -> String {
    format!("many-{i:02}")
}

fn create_topics(bootstrap: &str) -> Result<()> {
    let names: Vec<String> = (0..TOPICS).map(topic).collect();
    let new: Vec<NewTopic<'_>> = names
        .iter()
        .map(|n| NewTopic::new(n, PARTITIONS_PER_TOPIC, TopicReplication::Fixed(1)))
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(120)));
    let results = clients::runtime()?
        .block_on(clients::admin(bootstrap)?.create_topics(&new, &opts))
        .context("CreateTopics")?;
    for r in results {
        if let Err((t, e)) = r {
            bail!("creating {t}: {e}");
        }
    }
    Ok(())
}

/// Produces one record (`round`, topic, partition) to every partition with acks=all.
fn produce_round(bootstrap: &str, round: u32, acked: &mut Acked) -> Result<()> {
    let producer: BaseProducer<Acks> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("message.timeout.ms", "120000")
        .create_with_context(Acks::default())
        .context("creating the producer")?;
    for t in 0..TOPICS {
        let name = topic(t);
        for p in 0..PARTITIONS_PER_TOPIC {
            let value = format!("round {round} {name} {p}");
            let mut record: BaseRecord<(), String> =
                BaseRecord::to(&name).partition(p).payload(&value);
            loop {
                match producer.send(record) {
                    Ok(()) => break,
                    Err((e, r)) => {
                        // A full local queue: serve delivery reports, then retry.
                        if !matches!(
                            e.rdkafka_error_code(),
                            Some(rdkafka::types::RDKafkaErrorCode::QueueFull)
                        ) {
                            bail!("send to {name}-{p}: {e}");
                        }
                        producer.poll(Duration::from_millis(50));
                        record = r;
                    }
                }
            }
        }
    }
    producer
        .flush(Duration::from_secs(120))
        .context("flushing the producer")?;
    let (got, errors) = std::mem::take(
        &mut *producer
            .context()
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    ensure!(errors.is_empty(), "delivery errors: {errors:?}");
    let n: usize = got.values().map(BTreeMap::len).sum();
    ensure!(
        n == TOPICS * PARTITIONS_PER_TOPIC as usize,
        "{n} records acknowledged"
    );
    for (tp, records) in got {
        acked.entry(tp).or_default().extend(records);
    }
    Ok(())
}

/// Reads every partition from the beginning and checks that each acknowledged record is there
/// at its offset with its value.
fn check_all(bootstrap: &str, acked: &Acked) -> Result<()> {
    let consumer: BaseConsumer = clients::consumer(
        bootstrap,
        &[
            ("group.id", "many-partitions-check"),
            ("enable.auto.commit", "false"),
            ("fetch.wait.max.ms", "100"),
        ],
    )?;
    let mut tpl = TopicPartitionList::new();
    for (t, p) in acked.keys() {
        tpl.add_partition_offset(t, *p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let mut missing: HashMap<(String, i32), BTreeMap<i64, Vec<u8>>> =
        acked.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let deadline = Instant::now() + Duration::from_secs(180);
    while !missing.is_empty() {
        if Instant::now() > deadline {
            let left: usize = missing.values().map(BTreeMap::len).sum();
            bail!(
                "{left} acknowledged records not read back, e.g. {:?}",
                missing.keys().next()
            );
        }
        let Some(m) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let m = m.context("consuming")?;
        let key = (m.topic().to_string(), m.partition());
        if let Some(records) = missing.get_mut(&key) {
            if let Some(want) = records.remove(&m.offset()) {
                ensure!(
                    m.payload() == Some(want.as_slice()),
                    "{}-{} offset {}: another value",
                    key.0,
                    key.1,
                    m.offset()
                );
            }
            if records.is_empty() {
                missing.remove(&key);
            }
        }
    }
    Ok(())
}

fn open_descriptors(g: &Gregor) -> Result<usize> {
    let pid = g.pid().context("the broker is not running")?;
    Ok(std::fs::read_dir(format!("/proc/{pid}/fd"))?.count())
}

#[test]
fn two_thousand_partitions_within_512_descriptors_survive_restarts() -> Result<()> {
    let index_cache = format!("log.index.cache.bytes={INDEX_CACHE_BYTES}");
    let mut g = Gregor::start_with_nofile(BIN, &[&index_cache], NOFILE)?;
    let bootstrap = g.bootstrap();
    create_topics(&bootstrap)?;
    let mut acked = Acked::new();
    produce_round(&bootstrap, 1, &mut acked)?;
    let fds = open_descriptors(&g)?;
    ensure!(fds <= NOFILE as usize, "{fds} descriptors open");
    // The budget is half the limit, and /metrics says how it is used.
    let (status, body) = g.admin_get("/metrics")?;
    ensure!(status == 200, "/metrics answered {status}");
    let gauge = |name: &str| -> Result<f64> {
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .with_context(|| format!("{name} not in /metrics"))
    };
    ensure!(gauge("gregor_log_segment_files_open_max")? == (NOFILE / 2) as f64);
    let open = gauge("gregor_log_segment_files_open")?;
    ensure!(open <= (NOFILE / 2) as f64, "{open} segment files open");
    ensure!(gauge("gregor_log_segment_files_evicted_total")? > 0.0);
    // Every partition has only its active segment, whose index entries are not the cache's.
    ensure!(gauge("gregor_log_index_cache_max_bytes")? == INDEX_CACHE_BYTES as f64);
    ensure!(gauge("gregor_log_index_cache_bytes")? == 0.0);
    check_all(&bootstrap, &acked)?;

    // Clean restart: every partition loads within the limit.
    g.stop()?;
    g.restart()?;
    check_all(&bootstrap, &acked)?;
    produce_round(&bootstrap, 2, &mut acked)?;

    // Crash: recovery opens every partition again within the limit.
    g.kill9()?;
    g.restart()?;
    check_all(&bootstrap, &acked)?;
    produce_round(&bootstrap, 3, &mut acked)?;
    check_all(&bootstrap, &acked)?;

    let log = g.server_log();
    ensure!(
        !log.contains("Too many open files"),
        "the broker ran out of descriptors:\n{}",
        log.lines()
            .filter(|l| l.contains("Too many open files"))
            .take(5)
            .collect::<Vec<_>>()
            .join("\n")
    );
    Ok(())
}

/// Clients can take every descriptor the broker has left (connections are not capped by
/// default). The appends that then cannot open a segment fail alone: once the connections are
/// gone the directory was never taken out of service, `/ready` is 200 with no restart, and
/// every partition takes writes again with nothing acknowledged lost. Before, the first such
/// append marked the log dir failed until a restart.
#[test]
fn running_out_of_descriptors_does_not_take_the_log_dir_out_of_service() -> Result<()> {
    const LOW_NOFILE: u64 = 128;
    let mut g = Gregor::start_with_nofile(BIN, &[], LOW_NOFILE)?;
    let bootstrap = g.bootstrap();
    create_topics(&bootstrap)?;
    let mut acked = Acked::new();
    produce_round(&bootstrap, 1, &mut acked)?;
    // After a restart no segment file is open, so appends must open them: with the budget
    // full, opening one would first close another and free its descriptor.
    g.stop()?;
    g.restart()?;

    // A producer connected before the descriptors run out keeps its connection.
    let producer: BaseProducer<Acks> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("message.timeout.ms", "10000")
        .create_with_context(Acks::default())
        .context("creating the producer")?;
    producer
        .client()
        .fetch_metadata(None, Duration::from_secs(30))
        .context("metadata before the descriptors run out")?;
    let port = bootstrap
        .rsplit(':')
        .next()
        .and_then(|p| p.parse::<u16>().ok())
        .context("bootstrap port")?;
    // Once the broker stops accepting, its backlog fills and a connect waits for SYN
    // retries: each gets a second, and the first that fails ends the loop.
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut idle = Vec::new();
    while idle.len() < 2 * LOW_NOFILE as usize {
        match std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
            Ok(s) => idle.push(s),
            Err(_) => break,
        }
    }
    // The broker has no descriptor left once its accepts fail.
    let exhausted = gregor_tests::process::poll(Duration::from_secs(20), || {
        g.server_log().contains("accept failed").then_some(())
    });
    ensure!(
        exhausted.is_some(),
        "{} idle connections did not exhaust the broker's descriptors",
        idle.len()
    );
    // Appends to partitions whose segments are closed (none is open after the restart) now
    // need a descriptor the broker does not have.
    for t in 0..TOPICS {
        let name = topic(t);
        for p in 0..PARTITIONS_PER_TOPIC {
            let value = format!("starved {name} {p}");
            let record: BaseRecord<(), String> = BaseRecord::to(&name).partition(p).payload(&value);
            if producer.send(record).is_err() {
                producer.poll(Duration::from_millis(50));
            }
        }
    }
    let _ = producer.flush(Duration::from_secs(15));
    drop(idle);
    let starved = g.server_log().contains("lack of file descriptors");
    ensure!(
        starved,
        "no append ran out of descriptors: the test did not exercise the case"
    );
    // Records acknowledged while starved count too.
    let (got, _) = std::mem::take(
        &mut *producer
            .context()
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    for (tp, records) in got {
        acked.entry(tp).or_default().extend(records);
    }
    drop(producer);

    let ready = gregor_tests::process::poll(Duration::from_secs(30), || {
        matches!(g.admin_get("/ready"), Ok((200, _))).then_some(())
    });
    ensure!(
        ready.is_some(),
        "/ready is not 200 after the connections closed: {:?}",
        g.admin_get("/ready")
    );
    ensure!(
        !g.server_log().contains("log directory failed"),
        "the log dir was taken out of service"
    );
    produce_round(&bootstrap, 2, &mut acked)?;
    check_all(&bootstrap, &acked)?;
    g.stop()?;
    Ok(())
}
