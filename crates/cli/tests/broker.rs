//! Integration tests: the real `gregor` binary driven by librdkafka (the `rdkafka` crate).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use gregor_tests::{clients, Gregor};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

const BIN: &str = env!("CARGO_BIN_EXE_gregor");
const TIMEOUT: Duration = Duration::from_secs(30);

fn runtime() -> tokio::runtime::Runtime {
    clients::runtime().expect("tokio runtime")
}

fn create_topic(
    bootstrap: &str,
    name: &str,
    partitions: i32,
    configs: &[(&str, &str)],
) -> Result<()> {
    clients::create_topic_with(bootstrap, name, partitions, configs)
}

fn producer(bootstrap: &str, extra: &[(&str, &str)]) -> Result<BaseProducer> {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .set("message.timeout.ms", "30000");
    for (k, v) in extra {
        c.set(*k, *v);
    }
    Ok(c.create()?)
}

fn consumer(bootstrap: &str, extra: &[(&str, &str)]) -> Result<BaseConsumer> {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("group.id", "unused-assign-only")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false");
    for (k, v) in extra {
        c.set(*k, *v);
    }
    Ok(c.create()?)
}

/// A consumed record.
#[derive(Debug, Clone, PartialEq)]
struct Got {
    partition: i32,
    offset: i64,
    key: Vec<u8>,
    value: Vec<u8>,
    headers: Vec<(String, Vec<u8>)>,
    timestamp: Option<i64>,
}

/// Reads `count` records from every partition of `topic` (assign, from the beginning).
fn read_all(bootstrap: &str, topic: &str, partitions: i32, count: usize) -> Result<Vec<Got>> {
    let c = consumer(bootstrap, &[])?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    c.assign(&tpl)?;
    let mut out = Vec::with_capacity(count);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while out.len() < count {
        ensure!(
            std::time::Instant::now() < deadline,
            "read only {} of {count} records from {topic}",
            out.len()
        );
        match c.poll(Duration::from_millis(500)) {
            None => {}
            // librdkafka reports transport trouble (e.g. a connection reset while the machine
            // is overloaded) as errors it recovers from itself; the deadline still applies.
            Some(Err(KafkaError::MessageConsumption(
                code
                @ (RDKafkaErrorCode::AllBrokersDown | RDKafkaErrorCode::BrokerTransportFailure),
            ))) => eprintln!("transient consumer error: {code:?}"),
            Some(Err(e)) => bail!("consume error: {e}"),
            Some(Ok(m)) => out.push(Got {
                partition: m.partition(),
                offset: m.offset(),
                key: m.key().unwrap_or_default().to_vec(),
                value: m.payload().unwrap_or_default().to_vec(),
                headers: m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|h| (h.key.to_string(), h.value.unwrap_or_default().to_vec()))
                            .collect()
                    })
                    .unwrap_or_default(),
                timestamp: m.timestamp().to_millis(),
            }),
        }
    }
    // Nothing beyond `count` may arrive.
    if let Some(Ok(m)) = c.poll(Duration::from_millis(300)) {
        bail!(
            "unexpected extra record at {}:{}",
            m.partition(),
            m.offset()
        );
    }
    Ok(out)
}

fn produce_keyed(bootstrap: &str, topic: &str, codec: &str, n: usize) -> Result<()> {
    let p = producer(
        bootstrap,
        &[
            ("compression.codec", codec),
            ("enable.idempotence", "true"),
            ("queue.buffering.max.messages", "1000000"),
        ],
    )?;
    for i in 0..n {
        let key = format!("key-{i}");
        let value = format!("value-{i}-{codec}");
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "idx",
                value: Some(i.to_string().as_bytes()),
            })
            .insert(Header {
                key: "codec",
                value: Some(codec.as_bytes()),
            });
        let mut rec = BaseRecord::to(topic)
            .key(&key)
            .payload(&value)
            .headers(headers);
        loop {
            match p.send(rec) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    rec = r;
                    p.poll(Duration::from_millis(10));
                }
                Err((e, _)) => bail!("send: {e}"),
            }
        }
    }
    p.flush(Duration::from_secs(120))?;
    Ok(())
}

/// Every record 0..n present once, offsets contiguous from 0 per partition, per-partition
/// order equal to production order, keys/values/headers intact.
fn check_keyed(got: &[Got], codec: &str, n: usize) -> Result<()> {
    ensure!(got.len() == n, "expected {n} records, got {}", got.len());
    let mut per_partition: BTreeMap<i32, Vec<&Got>> = BTreeMap::new();
    for g in got {
        per_partition.entry(g.partition).or_default().push(g);
    }
    let mut seen = vec![false; n];
    for (p, recs) in per_partition {
        let mut last_idx = None;
        for (expected_offset, g) in recs.iter().enumerate() {
            ensure!(
                g.offset == expected_offset as i64,
                "partition {p}: offset {} where {expected_offset} was expected",
                g.offset
            );
            let key = String::from_utf8(g.key.clone())?;
            let i: usize = key
                .strip_prefix("key-")
                .and_then(|s| s.parse().ok())
                .context("bad key")?;
            ensure!(
                g.value == format!("value-{i}-{codec}").into_bytes(),
                "value of {key}"
            );
            ensure!(
                g.headers
                    == vec![
                        ("idx".to_string(), i.to_string().into_bytes()),
                        ("codec".to_string(), codec.as_bytes().to_vec())
                    ],
                "headers of {key}: {:?}",
                g.headers
            );
            ensure!(!seen[i], "record {i} read twice");
            seen[i] = true;
            if let Some(prev) = last_idx {
                ensure!(i > prev, "partition {p}: record {i} after {prev}");
            }
            last_idx = Some(i);
        }
    }
    ensure!(seen.iter().all(|s| *s), "records missing");
    Ok(())
}

#[test]
fn keyed_records_in_every_codec_survive_restart_and_kill() -> Result<()> {
    let mut g = Gregor::start(BIN, &["log.segment.bytes=4194304"])?;
    keyed_scenario(&mut g).map_err(|e| {
        let log = g.server_log();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        e.context(format!("server log tail:\n{}", tail.join("\n")))
    })
}

fn keyed_scenario(g: &mut Gregor) -> Result<()> {
    const N: usize = 100_000;
    let codecs = ["none", "gzip", "snappy", "lz4", "zstd"];
    let bs = g.bootstrap();
    for codec in codecs {
        let topic = format!("keyed-{codec}");
        create_topic(&bs, &topic, 3, &[])?;
        produce_keyed(&bs, &topic, codec, N)?;
        check_keyed(&read_all(&bs, &topic, 3, N)?, codec, N)
            .with_context(|| format!("first read of {topic}"))?;
    }
    g.restart()?;
    for codec in codecs {
        let topic = format!("keyed-{codec}");
        check_keyed(&read_all(&bs, &topic, 3, N)?, codec, N)
            .with_context(|| format!("read of {topic} after graceful restart"))?;
    }
    g.kill9()?;
    g.restart()?;
    for codec in codecs {
        let topic = format!("keyed-{codec}");
        check_keyed(&read_all(&bs, &topic, 3, N)?, codec, N)
            .with_context(|| format!("read of {topic} after kill -9"))?;
    }
    // Appends continue with contiguous offsets after recovery.
    produce_keyed(&bs, "keyed-none", "none", 10)?;
    let got = read_all(&bs, "keyed-none", 3, N + 10)?;
    let mut per_partition: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
    for r in got {
        per_partition.entry(r.partition).or_default().push(r.offset);
    }
    for (p, offsets) in per_partition {
        ensure!(
            offsets.iter().enumerate().all(|(i, o)| *o == i as i64),
            "partition {p} offsets not contiguous after recovery"
        );
    }
    Ok(())
}

#[test]
fn acks_zero_records_arrive() -> Result<()> {
    let g = Gregor::start(BIN, &[])?;
    let bs = g.bootstrap();
    create_topic(&bs, "acks0", 1, &[])?;
    let p = producer(&bs, &[("acks", "0")])?;
    for i in 0..1000 {
        let v = format!("v{i}");
        p.send(BaseRecord::<(), _>::to("acks0").payload(&v))
            .map_err(|(e, _)| e)?;
    }
    p.flush(TIMEOUT)?;
    let got = read_all(&bs, "acks0", 1, 1000)?;
    for (i, r) in got.iter().enumerate() {
        ensure!(r.value == format!("v{i}").into_bytes());
    }
    Ok(())
}

#[test]
fn oversize_batch_gets_message_too_large() -> Result<()> {
    let g = Gregor::start(BIN, &[])?;
    let bs = g.bootstrap();
    create_topic(&bs, "small", 1, &[("max.message.bytes", "10000")])?;
    let big = vec![b'x'; 50_000];
    // librdkafka sends the batch (its own limit is higher); gregor must refuse it.
    let fp: rdkafka::producer::FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &bs)
        .set("message.max.bytes", "1000000")
        .create()?;
    let res = runtime().block_on(fp.send(
        rdkafka::producer::FutureRecord::<(), _>::to("small").payload(&big),
        TIMEOUT,
    ));
    match res {
        Err((KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge), _)) => {}
        other => bail!("expected MESSAGE_TOO_LARGE, got {other:?}"),
    }
    // The record was not stored.
    let c = consumer(&bs, &[])?;
    let (low, high) = c.fetch_watermarks("small", 0, TIMEOUT)?;
    ensure!(
        (low, high) == (0, 0),
        "oversize record was stored: {low}..{high}"
    );
    Ok(())
}

#[test]
fn tiny_fetch_limit_still_returns_a_200kib_record() -> Result<()> {
    let g = Gregor::start(BIN, &[])?;
    let bs = g.bootstrap();
    create_topic(&bs, "big", 1, &[])?;
    let p = producer(&bs, &[])?;
    let big: Vec<u8> = (0..200 * 1024).map(|i| (i % 251) as u8).collect();
    p.send(BaseRecord::<(), _>::to("big").payload(&big))
        .map_err(|(e, _)| e)?;
    p.flush(TIMEOUT)?;
    let c = consumer(
        &bs,
        &[
            ("fetch.max.bytes", "1024"),
            ("message.max.bytes", "1000"),
            ("max.partition.fetch.bytes", "1024"),
        ],
    )?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("big", 0, Offset::Beginning)?;
    c.assign(&tpl)?;
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        ensure!(std::time::Instant::now() < deadline, "no record received");
        if let Some(m) = c.poll(Duration::from_millis(500)) {
            let m = m?;
            ensure!(m.payload() == Some(&big[..]), "payload differs");
            return Ok(());
        }
    }
}

#[test]
fn list_offsets_by_timestamp_finds_the_exact_record() -> Result<()> {
    let g = Gregor::start(BIN, &[])?;
    let bs = g.bootstrap();
    create_topic(&bs, "times", 1, &[])?;
    // Several records per batch (linger), so the answer must come from inside a batch.
    let p = producer(&bs, &[("linger.ms", "100")])?;
    for i in 0..10i64 {
        let v = format!("v{i}");
        p.send(
            BaseRecord::<(), _>::to("times")
                .payload(&v)
                .timestamp(1_000_000 + i * 1000),
        )
        .map_err(|(e, _)| e)?;
    }
    p.flush(TIMEOUT)?;
    let c = consumer(&bs, &[])?;
    for (target, expected) in [(1_000_000, 0), (1_002_500, 3), (1_009_000, 9), (0, 0)] {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset("times", 0, Offset::Offset(target))?;
        let res = c.offsets_for_times(tpl, TIMEOUT)?;
        let off = res
            .find_partition("times", 0)
            .context("partition missing")?
            .offset();
        ensure!(
            off == Offset::Offset(expected),
            "timestamp {target}: got {off:?}, expected {expected}"
        );
    }
    // Past the last record: no offset (end).
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("times", 0, Offset::Offset(2_000_000))?;
    let res = c.offsets_for_times(tpl, TIMEOUT)?;
    let off = res
        .find_partition("times", 0)
        .context("partition")?
        .offset();
    ensure!(off == Offset::End, "after the last record: got {off:?}");
    let (low, high) = c.fetch_watermarks("times", 0, TIMEOUT)?;
    ensure!((low, high) == (0, 10));
    Ok(())
}

/// A SIGTERM that arrives while `gregor serve` is still starting (here: as soon as it has
/// logged its first line) is not lost to the default action, which would end the process
/// with no clean shutdown (exit by signal, no clean shutdown marker, recovery on the next
/// start): the broker finishes starting, then shuts down cleanly and exits 0.
#[test]
fn sigterm_during_start_up_shuts_down_cleanly() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let port = gregor_tests::process::free_port()?;
    let log_path = dir.path().join("server.log");
    let log = std::fs::File::create(&log_path)?;
    let child = std::process::Command::new(BIN)
        .arg("serve")
        .arg("--set")
        .arg(format!("listeners=PLAINTEXT://127.0.0.1:{port}"))
        .arg("--set")
        .arg(format!("log.dirs={}", dir.path().join("data").display()))
        .arg("--set")
        .arg("admin.listener=")
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()?;
    let mut guard = gregor_tests::process::ChildGuard::new("gregor serve", child);
    // Checked every 5 ms (not `process::poll`'s 100 ms): the point is to signal early.
    let deadline = std::time::Instant::now() + TIMEOUT;
    let first_line = loop {
        let text = std::fs::read_to_string(&log_path)?;
        if text.contains('\n') {
            break text;
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "gregor serve logged nothing"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    gregor_tests::process::signal(guard.id(), "TERM")?;
    let started = first_line.contains("gregor 0.1.0 started");
    let deadline = std::time::Instant::now() + TIMEOUT;
    while gregor_tests::process::pid_alive(guard.id()) {
        ensure!(
            std::time::Instant::now() < deadline,
            "gregor serve still runs 30 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = guard.stop()?.context("no exit status")?;
    let out = std::fs::read_to_string(&log_path)?;
    ensure!(status.success(), "{status}; log:\n{out}");
    ensure!(out.contains("shut down cleanly"), "log:\n{out}");
    if started {
        eprintln!("note: the broker had finished starting before the signal");
    }
    Ok(())
}

/// A node that cannot finish starting (one voter of three, the others never started, so no
/// quorum forms) still stops on SIGTERM: it gives start-up its grace (10 s), then exits 0
/// without a clean shutdown, saying why. It used to ignore SIGTERM and SIGINT for as long as
/// it waited, which was forever.
#[test]
fn sigterm_while_waiting_for_the_metadata_quorum_exits() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ports = gregor_tests::process::free_ports(4)?;
    let props = dir.path().join("node-1.properties");
    std::fs::write(
        &props,
        format!(
            "node.id=1\nprocess.roles=broker,controller\n\
             listeners=PLAINTEXT://127.0.0.1:{},CONTROLLER://127.0.0.1:{}\n\
             controller.listener.names=CONTROLLER\n\
             controller.quorum.voters=1@127.0.0.1:{},2@127.0.0.1:{},3@127.0.0.1:{}\n\
             log.dirs={}\nadmin.listener=\n",
            ports[0],
            ports[1],
            ports[1],
            ports[2],
            ports[3],
            dir.path().join("data").display()
        ),
    )?;
    let format = std::process::Command::new(BIN)
        .args(["storage", "format", "-t", "MkU3OEVBNTcwNTJENDM2Qg", "-c"])
        .arg(&props)
        .output()?;
    ensure!(
        format.status.success(),
        "format: {}",
        String::from_utf8_lossy(&format.stderr)
    );
    let log_path = dir.path().join("server.log");
    let log = std::fs::File::create(&log_path)?;
    let child = std::process::Command::new(BIN)
        .arg("serve")
        .arg("--config")
        .arg(&props)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()?;
    let mut guard = gregor_tests::process::ChildGuard::new("gregor serve", child);
    gregor_tests::process::poll(TIMEOUT, || {
        std::fs::read_to_string(&log_path)
            .ok()?
            .contains("waiting for the metadata quorum's high watermark")
            .then_some(())
    })
    .context("the node never logged that it waits for its quorum")?;
    let signalled = std::time::Instant::now();
    gregor_tests::process::signal(guard.id(), "TERM")?;
    let deadline = signalled + Duration::from_secs(40);
    while gregor_tests::process::pid_alive(guard.id()) {
        ensure!(
            std::time::Instant::now() < deadline,
            "gregor serve still runs 40 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let waited = signalled.elapsed();
    let status = guard.stop()?.context("no exit status")?;
    let out = std::fs::read_to_string(&log_path)?;
    ensure!(status.success(), "{status}; log:\n{out}");
    ensure!(
        out.contains("start-up did not finish") && !out.contains("shut down cleanly"),
        "log:\n{out}"
    );
    ensure!(
        waited >= Duration::from_secs(9),
        "exited after {waited:?}, before the grace ended"
    );
    Ok(())
}
