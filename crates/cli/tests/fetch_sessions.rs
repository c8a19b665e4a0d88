//! Incremental fetch sessions (KIP-227) end to end.
//!
//! - On the wire (Fetch v12 by name and v13 by topic id): a full fetch gets a session id, an
//!   incremental fetch leaves out unchanged partitions and brings a partition back when it has
//!   new records, cached fetch offsets follow the request, `ForgottenTopicsData` drops
//!   partitions, a duplicate epoch gets INVALID_FETCH_SESSION_EPOCH, a v13 request on a
//!   name-keyed session FETCH_SESSION_TOPIC_ID_ERROR, an unknown id and any id after a restart
//!   FETCH_SESSION_ID_NOT_FOUND, epoch -1 closes the session; with
//!   `max.incremental.fetch.session.cache.slots=1` (below the 8 shards, as in Kafka) no
//!   session is created.
//! - librdkafka 2.12.1 fetches without sessions (it always sends `SessionEpoch` -1): it reads a
//!   40-partition topic whole and the broker holds no session. Kafka 4.4's Java consumer
//!   (`kafka-console-consumer`) reads the same topic through a session, in small responses,
//!   while more records arrive on every partition: every record once.
//! - A restart in the middle of a Java consumer's session: it reconnects with a full fetch
//!   and gets every record.
//! - Eviction: a cache of 8 slots (1 per shard) with `min.incremental.fetch.session.eviction.ms=0`
//!   while new sessions keep arriving: two Java consumers' sessions are evicted, they get
//!   FETCH_SESSION_ID_NOT_FOUND, fall back to full fetches, and read every record.
//! - Followers: on a 3-node gregor cluster the replica fetchers hold sessions on the leaders,
//!   every record is replicated, a restarted node rejoins every ISR and the ISRs stay full
//!   while idle partitions are left out of incremental fetches.
//!
//! `cargo test -p gregor --test fetch_sessions -- --nocapture`

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use gregor_tests::clients::{create_topic, producer};
use gregor_tests::process::wait_for;
use gregor_tests::reference::{jars_or_skip, tool_command};
use gregor_tests::wire::{sb, KafkaConn};
use gregor_tests::Gregor;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic, ForgottenTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    ApiKey, BrokerId, FetchRequest, FetchResponse, MetadataRequest, MetadataResponse, TopicName,
};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

const BIN: &str = env!("CARGO_BIN_EXE_gregor");
const TIMEOUT: Duration = Duration::from_secs(60);
const FETCH_SESSION_ID_NOT_FOUND: i16 = 70;
const INVALID_FETCH_SESSION_EPOCH: i16 = 71;
const FETCH_SESSION_TOPIC_ID_ERROR: i16 = 106;

/// The admin listener's metrics, `name{labels}` -> value.
fn metrics(g: &Gregor) -> Result<BTreeMap<String, f64>> {
    let (status, body) = g.admin_get("/metrics")?;
    ensure!(status == 200, "/metrics answered {status}");
    Ok(body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect())
}

/// The sum of the metrics named `name` whose labels contain `labels`.
fn metric(g: &Gregor, name: &str, labels: &str) -> Result<f64> {
    Ok(metrics(g)?
        .iter()
        .filter(|(k, _)| {
            (k.as_str() == name || k.starts_with(&format!("{name}{{"))) && k.contains(labels)
        })
        .map(|(_, v)| v)
        .sum())
}

/// Produces values `v-<i>` for `i` in `range`, record `i` to partition `i % partitions`
/// (acks=all).
fn produce(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    range: std::ops::Range<usize>,
) -> Result<()> {
    let p = producer(bootstrap, &[("acks", "all"), ("linger.ms", "5")])?;
    for i in range {
        let v = format!("v-{i}");
        let partition = i32::try_from(i)? % partitions;
        loop {
            match p.send(
                BaseRecord::<(), _>::to(topic)
                    .partition(partition)
                    .payload(&v),
            ) {
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

fn values(range: std::ops::Range<usize>) -> BTreeSet<String> {
    range.map(|i| format!("v-{i}")).collect()
}

fn partition(index: i32, fetch_offset: i64) -> FetchPartition {
    FetchPartition::default()
        .with_partition(index)
        .with_current_leader_epoch(-1)
        .with_fetch_offset(fetch_offset)
        .with_log_start_offset(-1)
        .with_partition_max_bytes(1 << 20)
}

fn fetch(session_id: i32, epoch: i32, topics: Vec<FetchTopic>) -> FetchRequest {
    FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(0)
        .with_min_bytes(1)
        .with_max_bytes(50 << 20)
        .with_session_id(session_id)
        .with_session_epoch(epoch)
        .with_topics(topics)
}

fn by_name(topic: &str, partitions: Vec<FetchPartition>) -> FetchTopic {
    FetchTopic::default()
        .with_topic(TopicName(sb(topic)))
        .with_partitions(partitions)
}

/// (partition, record bytes, high watermark) of every partition of a response, in order.
fn answered(r: &FetchResponse) -> Vec<(i32, usize, i64)> {
    r.responses
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(|p| {
                (
                    p.partition_index,
                    p.records.as_ref().map_or(0, bytes::Bytes::len),
                    p.high_watermark,
                )
            })
        })
        .collect()
}

#[test]
fn sessions_on_the_wire() -> Result<()> {
    let mut g = Gregor::start(BIN, &[])?;
    let bs = g.bootstrap();
    create_topic(&bs, "w", 4)?;
    produce(&bs, "w", 4, 0..12)?;
    let mut c = KafkaConn::connect(&bs, "sessions-on-the-wire")?;
    let call = |c: &mut KafkaConn, v: i16, r: &FetchRequest| -> Result<FetchResponse> {
        c.call(ApiKey::Fetch, v, r)
    };

    // A full fetch: every partition, and a new session.
    let all = |offset: i64| (0..4).map(|p| partition(p, offset)).collect::<Vec<_>>();
    let r = call(&mut c, 12, &fetch(0, 0, vec![by_name("w", all(0))]))?;
    assert_eq!(r.error_code, 0);
    let id = r.session_id;
    assert!(id > 0, "a new session: {r:?}");
    let got = answered(&r);
    assert_eq!(got.len(), 4);
    assert!(
        got.iter().all(|(_, bytes, hw)| *bytes > 0 && *hw == 3),
        "{got:?}"
    );
    assert_eq!(metric(&g, "gregor_fetch_sessions", "")?, 1.0);
    assert_eq!(metric(&g, "gregor_fetch_session_partitions", "")?, 4.0);

    // The client advances every fetch offset: nothing new anywhere, nothing answered.
    let r = call(&mut c, 12, &fetch(id, 1, vec![by_name("w", all(3))]))?;
    assert_eq!((r.error_code, r.session_id), (0, id));
    assert_eq!(answered(&r), vec![]);
    // Nothing listed: the cached offsets (3) are read, still nothing new.
    let r = call(&mut c, 12, &fetch(id, 2, vec![]))?;
    assert_eq!((r.error_code, r.session_id, answered(&r)), (0, id, vec![]));

    // Two new records on every partition: all four come back, read from the cached offsets.
    produce(&bs, "w", 4, 12..20)?;
    let r = call(&mut c, 12, &fetch(id, 3, vec![]))?;
    let got = answered(&r);
    assert_eq!(got.len(), 4, "{got:?}");
    assert!(
        got.iter().all(|(_, bytes, hw)| *bytes > 0 && *hw == 5),
        "{got:?}"
    );
    // One new record, on partition 2 (22 % 4): only partition 2 is answered.
    produce(&bs, "w", 4, 22..23)?;
    let r = call(&mut c, 12, &fetch(id, 4, vec![by_name("w", all(5))]))?;
    let got = answered(&r);
    assert_eq!(
        got.iter().map(|g| g.0).collect::<Vec<_>>(),
        vec![2],
        "{got:?}"
    );
    assert!(got[0].1 > 0 && got[0].2 == 6);
    // Partition 2 now at 6; nothing new.
    let r = call(
        &mut c,
        12,
        &fetch(id, 5, vec![by_name("w", vec![partition(2, 6)])]),
    )?;
    assert_eq!(answered(&r), vec![]);

    // A duplicate of the last request.
    let r = call(&mut c, 12, &fetch(id, 5, vec![]))?;
    assert_eq!(
        (r.error_code, r.session_id),
        (INVALID_FETCH_SESSION_EPOCH, 0)
    );
    assert!(r.responses.is_empty());
    // The session was made by name: v13 (topic ids) cannot use it.
    let r = call(&mut c, 13, &fetch(id, 6, vec![]))?;
    assert_eq!(
        (r.error_code, r.session_id),
        (FETCH_SESSION_TOPIC_ID_ERROR, 0)
    );
    // Another id.
    let other = if id == i32::MAX { 1 } else { id + 1 };
    let r = call(&mut c, 12, &fetch(other, 1, vec![]))?;
    assert_eq!(
        (r.error_code, r.session_id),
        (FETCH_SESSION_ID_NOT_FOUND, 0)
    );

    // Forget partitions 0, 1 and 2; produce to partition 0: not in the session any more.
    let forget = ForgottenTopic::default()
        .with_topic(TopicName(sb("w")))
        .with_partitions(vec![0, 1, 2]);
    produce(&bs, "w", 4, 24..25)?;
    let r = call(
        &mut c,
        12,
        &fetch(id, 6, vec![]).with_forgotten_topics_data(vec![forget]),
    )?;
    assert_eq!((r.error_code, answered(&r)), (0, vec![]));
    assert_eq!(metric(&g, "gregor_fetch_session_partitions", "")?, 1.0);

    // Epoch -1 with the id closes the session; the fetch itself is sessionless.
    let r = call(
        &mut c,
        12,
        &fetch(id, -1, vec![by_name("w", vec![partition(3, 0)])]),
    )?;
    assert_eq!((r.error_code, r.session_id), (0, 0));
    assert_eq!(answered(&r).len(), 1);
    assert_eq!(metric(&g, "gregor_fetch_sessions", "")?, 0.0);
    let r = call(&mut c, 12, &fetch(id, 7, vec![]))?;
    assert_eq!(r.error_code, FETCH_SESSION_ID_NOT_FOUND);

    // A session by topic id (v13); then a restart: the session is gone.
    let m: MetadataResponse = c.call(
        ApiKey::Metadata,
        12,
        &MetadataRequest::default().with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(TopicName(sb("w"))))
        ])),
    )?;
    let topic_id = m.topics[0].topic_id;
    let by_id = FetchTopic::default()
        .with_topic_id(topic_id)
        .with_partitions(all(0));
    let r = call(&mut c, 13, &fetch(0, 0, vec![by_id]))?;
    let id = r.session_id;
    assert!(
        id > 0 && r.responses.iter().all(|t| t.topic_id == topic_id),
        "{r:?}"
    );
    assert_eq!(answered(&r).len(), 4);
    let r = call(&mut c, 13, &fetch(id, 1, vec![]))?;
    assert_eq!((r.error_code, r.session_id), (0, id));
    assert_eq!(
        answered(&r).len(),
        4,
        "the same records again (offsets still 0)"
    );
    let r = call(&mut c, 12, &fetch(id, 2, vec![]))?;
    assert_eq!(r.error_code, FETCH_SESSION_TOPIC_ID_ERROR);

    g.restart()?;
    let mut c = KafkaConn::connect(&bs, "sessions-on-the-wire")?;
    let r = wait_for(TIMEOUT, "the restarted broker answers a fetch", || {
        c.call::<_, FetchResponse>(ApiKey::Fetch, 13, &fetch(id, 2, vec![]))
            .ok()
    });
    assert_eq!(
        (r.error_code, r.session_id),
        (FETCH_SESSION_ID_NOT_FOUND, 0)
    );
    Ok(())
}

#[test]
fn one_slot_holds_no_session_as_in_kafka() -> Result<()> {
    // Kafka divides the slots among 8 shards: 1 slot leaves every shard without room.
    let g = Gregor::start(BIN, &["max.incremental.fetch.session.cache.slots=1"])?;
    let bs = g.bootstrap();
    create_topic(&bs, "one", 1)?;
    let mut c = KafkaConn::connect(&bs, "one-slot")?;
    for _ in 0..3 {
        let r: FetchResponse = c.call(
            ApiKey::Fetch,
            12,
            &fetch(0, 0, vec![by_name("one", vec![partition(0, 0)])]),
        )?;
        assert_eq!((r.error_code, r.session_id), (0, 0));
    }
    let g8 = Gregor::start(BIN, &["max.incremental.fetch.session.cache.slots=8"])?;
    let bs8 = g8.bootstrap();
    create_topic(&bs8, "one", 1)?;
    let mut c = KafkaConn::connect(&bs8, "eight-slots")?;
    let r: FetchResponse = c.call(
        ApiKey::Fetch,
        12,
        &fetch(0, 0, vec![by_name("one", vec![partition(0, 0)])]),
    )?;
    assert!(r.session_id > 0, "{r:?}");
    Ok(())
}

/// `kafka-console-consumer` reading `max` records of `topic` from the start, its output
/// collected by a thread; killed when dropped.
struct JavaConsumer {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl JavaConsumer {
    fn start(bootstrap: &str, topic: &str, group: &str, max: usize) -> Result<Self> {
        let args: Vec<String> = [
            "--bootstrap-server",
            bootstrap,
            "--topic",
            topic,
            "--group",
            group,
            "--from-beginning",
            "--max-messages",
            &max.to_string(),
            "--timeout-ms",
            "90000",
            // Small responses: many fetches, each leaving most partitions out.
            "--consumer-property",
            "fetch.max.bytes=2048",
            "--consumer-property",
            "max.partition.fetch.bytes=1024",
            "--consumer-property",
            "fetch.max.wait.ms=100",
        ]
        .iter()
        .map(ToString::to_string)
        .collect();
        let mut child = tool_command("kafka-console-consumer", &args)?
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("spawning kafka-console-consumer")?;
        let stdout = child.stdout.take().context("stdout")?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.starts_with("v-") {
                    sink.lock().expect("lines").push(line);
                }
            }
        });
        Ok(Self {
            child,
            lines,
            reader: Some(reader),
        })
    }

    fn count(&self) -> usize {
        self.lines.lock().expect("lines").len()
    }

    /// Waits for the tool to exit (after `max` records, or 90 s without one) and returns what
    /// it printed.
    fn finish(&mut self) -> Result<Vec<String>> {
        let status = self.child.wait()?;
        if let Some(r) = self.reader.take() {
            r.join()
                .map_err(|_| anyhow::anyhow!("the reader thread panicked"))?;
        }
        ensure!(status.success(), "kafka-console-consumer: {status}");
        Ok(self.lines.lock().expect("lines").clone())
    }
}

impl Drop for JavaConsumer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every value of `range` exactly once.
fn exactly_once(got: &[String], range: std::ops::Range<usize>) -> Result<()> {
    let set: BTreeSet<String> = got.iter().cloned().collect();
    ensure!(
        set == values(range.clone()),
        "missing: {:?}",
        values(range).difference(&set).take(10).collect::<Vec<_>>()
    );
    ensure!(
        set.len() == got.len(),
        "{} duplicates",
        got.len() - set.len()
    );
    Ok(())
}

const PARTITIONS: i32 = 40;

#[test]
fn librdkafka_without_sessions_and_the_java_consumer_with_them() -> Result<()> {
    let g = Gregor::start(BIN, &[])?;
    let bs = g.bootstrap();
    create_topic(&bs, "many", PARTITIONS)?;
    produce(&bs, "many", PARTITIONS, 0..4000)?;

    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bs)
        .set("group.id", "rd-assign-only")
        .set("enable.auto.commit", "false")
        .set("message.max.bytes", "2048")
        .set("fetch.max.bytes", "2048")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset("many", p, Offset::Beginning)?;
    }
    c.assign(&tpl)?;
    let mut got = Vec::new();
    let deadline = Instant::now() + TIMEOUT;
    while got.len() < 4000 {
        ensure!(
            Instant::now() < deadline,
            "librdkafka read {} of 4000",
            got.len()
        );
        if let Some(m) = c.poll(Duration::from_millis(200)) {
            let m = m?;
            got.push(String::from_utf8_lossy(m.payload().unwrap_or_default()).to_string());
        }
    }
    drop(c);
    exactly_once(&got, 0..4000)?;
    // librdkafka 2.12.1 always sends SessionId 0 / SessionEpoch -1.
    assert_eq!(metric(&g, "gregor_fetch_sessions", "")?, 0.0);
    assert!(metric(&g, "gregor_requests_total", "api=\"Fetch\"")? > 0.0);

    if !jars_or_skip() {
        return Ok(());
    }
    let mut java = JavaConsumer::start(&bs, "many", "java-sessions", 8000)?;
    wait_for(
        Duration::from_secs(90),
        "the Java consumer reads the first 4000",
        || (java.count() >= 4000).then_some(()),
    );
    // The Java consumer holds a session (its partitions: those it has no records buffered for).
    assert!(metric(&g, "gregor_fetch_sessions", "")? >= 1.0);
    assert!(metric(&g, "gregor_fetch_session_partitions", "")? >= 1.0);
    // More records on every partition while the consumer fetches incrementally.
    produce(&bs, "many", PARTITIONS, 4000..8000)?;
    let got = java.finish()?;
    exactly_once(&got, 0..8000)?;
    // Closing, the consumer ends its session (a fetch with SessionEpoch -1).
    wait_for(
        Duration::from_secs(10),
        "the Java consumer's session closed",
        || (metric(&g, "gregor_fetch_sessions", "").ok()? == 0.0).then_some(()),
    );
    assert_eq!(metric(&g, "gregor_fetch_session_partitions", "")?, 0.0);
    Ok(())
}

#[test]
fn a_restart_in_the_middle_of_a_java_session() -> Result<()> {
    if !jars_or_skip() {
        return Ok(());
    }
    let mut g = Gregor::start(BIN, &[])?;
    let bs = g.bootstrap();
    create_topic(&bs, "restart", 10)?;
    produce(&bs, "restart", 10, 0..1000)?;
    let mut java = JavaConsumer::start(&bs, "restart", "java-restart", 2000)?;
    wait_for(
        Duration::from_secs(90),
        "the Java consumer reads the first 1000",
        || (java.count() >= 1000).then_some(()),
    );
    assert!(metric(&g, "gregor_fetch_sessions", "")? >= 1.0);
    g.restart()?;
    assert_eq!(
        metric(&g, "gregor_fetch_sessions", "")?,
        0.0,
        "sessions do not survive"
    );
    // The consumer reconnects with a full fetch and gets a new session.
    wait_for(
        Duration::from_secs(60),
        "a new session after the restart",
        || (metric(&g, "gregor_fetch_sessions", "").ok()? >= 1.0).then_some(()),
    );
    produce(&bs, "restart", 10, 1000..2000)?;
    let got = java.finish()?;
    // A group consumer may read again from its last commit after the restart: every record at
    // least once.
    let set: BTreeSet<String> = got.iter().cloned().collect();
    ensure!(
        set == values(0..2000),
        "missing: {:?}",
        values(0..2000)
            .difference(&set)
            .take(10)
            .collect::<Vec<_>>()
    );
    println!(
        "restart: {} records read, {} again",
        got.len(),
        got.len() - set.len()
    );
    Ok(())
}

#[test]
fn evicted_java_sessions_recover() -> Result<()> {
    if !jars_or_skip() {
        return Ok(());
    }
    let g = Gregor::start(
        BIN,
        &[
            "max.incremental.fetch.session.cache.slots=8",
            "min.incremental.fetch.session.eviction.ms=0",
        ],
    )?;
    let bs = g.bootstrap();
    create_topic(&bs, "evict", 20)?;
    create_topic(&bs, "churn", 1)?;
    produce(&bs, "evict", 20, 0..2000)?;

    // New one-partition sessions, one every 20 ms: each lands in the next shard and evicts
    // the session there (with an eviction time of 0 every session is stale a millisecond
    // after its last use).
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let stop = stop.clone();
        let bs = bs.clone();
        std::thread::spawn(move || -> Result<usize> {
            let mut c = KafkaConn::connect(&bs, "churn")?;
            let mut created = 0;
            while !stop.load(Ordering::Relaxed) {
                let r: FetchResponse = c.call(
                    ApiKey::Fetch,
                    12,
                    &fetch(0, 0, vec![by_name("churn", vec![partition(0, 0)])]),
                )?;
                if r.session_id > 0 {
                    created += 1;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(created)
        })
    };
    let mut a = JavaConsumer::start(&bs, "evict", "java-evict-a", 4000)?;
    let mut b = JavaConsumer::start(&bs, "evict", "java-evict-b", 4000)?;
    wait_for(
        Duration::from_secs(90),
        "both consumers read the first 2000",
        || (a.count() >= 2000 && b.count() >= 2000).then_some(()),
    );
    produce(&bs, "evict", 20, 2000..4000)?;
    let got_a = a.finish()?;
    let got_b = b.finish()?;
    stop.store(true, Ordering::Relaxed);
    let created = churn
        .join()
        .map_err(|_| anyhow::anyhow!("churn panicked"))??;
    exactly_once(&got_a, 0..4000)?;
    exactly_once(&got_b, 0..4000)?;
    let evictions = metric(&g, "gregor_fetch_session_evictions_total", "")?;
    let not_found = metric(
        &g,
        "gregor_request_errors_total",
        "error=\"FetchSessionIdNotFound\"",
    )?;
    println!(
        "churn sessions {created}, evictions {evictions}, FETCH_SESSION_ID_NOT_FOUND {not_found}"
    );
    assert!(created > 0 && evictions > 0.0);
    assert!(
        not_found > 0.0,
        "an evicted consumer was told and recovered"
    );
    assert!(metric(&g, "gregor_fetch_sessions", "")? <= 8.0);
    Ok(())
}

/// GETs `/metrics` from an admin listener and sums the metric `name`.
fn node_metric(admin_port: u16, name: &str) -> Option<f64> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", admin_port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    Some(
        body.lines()
            .filter(|l| l.starts_with(&format!("{name} ")) || l.starts_with(&format!("{name}{{")))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum(),
    )
}

/// The ISR sizes of every partition of `topic`, when every partition has a leader.
fn isr_sizes(bootstrap: &str, topic: &str) -> Option<Vec<usize>> {
    let mut c = KafkaConn::connect(bootstrap, "isr").ok()?;
    let m: MetadataResponse = c
        .call(
            ApiKey::Metadata,
            12,
            &MetadataRequest::default().with_topics(Some(vec![
                MetadataRequestTopic::default().with_name(Some(TopicName(sb(topic))))
            ])),
        )
        .ok()?;
    let t = m.topics.first()?;
    (t.error_code == 0 && t.partitions.iter().all(|p| p.leader_id.0 >= 0))
        .then(|| t.partitions.iter().map(|p| p.isr_nodes.len()).collect())
}

/// gregor's followers fetch through sessions: a 3-node cluster, a topic of 6 partitions with
/// replication factor 3. Followers hold sessions on the leaders (privileged ones), every record
/// is replicated (acks=all) and readable; a restarted node's fetchers start new sessions and
/// it rejoins every ISR (the leaders track its idle partitions from the session's cached
/// offsets).
#[test]
fn followers_replicate_through_sessions() -> Result<()> {
    use gregor_tests::cluster::{Cluster, ClusterConfig, Implementation};
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;

    let config = ClusterConfig::combined(Implementation::Gregor(BIN.into()), 3)
        .with("replica.lag.time.max.ms", "3000")
        .with("broker.heartbeat.interval.ms", "500");
    let mut cluster = Cluster::start(&config)?;
    let bs = cluster.bootstrap();
    // One node's listener, for the raw Metadata requests.
    let b1 = cluster.node(1).bootstrap().context("node 1 listener")?;
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", &bs).create()?;
    let topic = NewTopic::new("rep", 6, TopicReplication::Fixed(3));
    for r in gregor_tests::clients::runtime()?
        .block_on(admin.create_topics(&[topic], &AdminOptions::new()))?
    {
        r.map_err(|(t, e)| anyhow::anyhow!("creating {t}: {e}"))?;
    }
    cluster.wait_for(TIMEOUT, "every ISR full", || {
        isr_sizes(&b1, "rep").filter(|s| s.iter().all(|n| *n == 3))
    });
    produce(&bs, "rep", 6, 0..3000)?;
    let admin_ports: Vec<u16> = cluster
        .nodes()
        .iter()
        .filter_map(|n| n.admin_port)
        .collect();
    let sessions = |ports: &[u16]| -> f64 {
        ports
            .iter()
            .filter_map(|p| node_metric(*p, "gregor_fetch_sessions"))
            .sum()
    };
    // Every node follows partitions of the two others: up to 6 follower sessions.
    cluster.wait_for(TIMEOUT, "follower sessions on the leaders", || {
        (sessions(&admin_ports) >= 3.0).then_some(())
    });

    cluster.restart_node(3)?;
    produce(&bs, "rep", 6, 3000..6000)?;
    cluster.wait_for(Duration::from_secs(90), "node 3 back in every ISR", || {
        isr_sizes(&b1, "rep").filter(|s| s.iter().all(|n| *n == 3))
    });
    // The ISRs stay full while nothing is produced (idle partitions are omitted from the
    // followers' incremental fetches): wait longer than replica.lag.time.max.ms.
    std::thread::sleep(Duration::from_secs(5));
    let isr = isr_sizes(&b1, "rep").context("metadata")?;
    assert!(
        isr.iter().all(|n| *n == 3),
        "ISR sizes after an idle while: {isr:?}"
    );

    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bs)
        .set("group.id", "rep-assign-only")
        .set("enable.auto.commit", "false")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..6 {
        tpl.add_partition_offset("rep", p, Offset::Beginning)?;
    }
    c.assign(&tpl)?;
    let mut got = Vec::new();
    let deadline = Instant::now() + TIMEOUT;
    while got.len() < 6000 {
        ensure!(Instant::now() < deadline, "read {} of 6000", got.len());
        if let Some(m) = c.poll(Duration::from_millis(200)) {
            let m = m?;
            got.push(String::from_utf8_lossy(m.payload().unwrap_or_default()).to_string());
        }
    }
    exactly_once(&got, 0..6000)?;
    Ok(())
}
