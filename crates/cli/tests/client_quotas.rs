//! Client quotas (KIP-13, KIP-219, KIP-546) with clients gregor did not write: librdkafka's
//! producer under `producer_byte_rate`, its consumer under `consumer_byte_rate`, and the
//! AlterClientQuotas / DescribeClientQuotas answers at the protocol level.
//!
//! `cargo test -p gregor --test client_quotas -- --nocapture` prints the measured rates.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use gregor_tests::process::{free_port, ChildGuard};
use gregor_tests::reference;
use gregor_tests::wire::KafkaConn;
use gregor_tests::Gregor;
use kafka_protocol::messages::alter_client_quotas_request::{EntityData, EntryData, OpData};
use kafka_protocol::messages::describe_client_quotas_request::ComponentData;
use kafka_protocol::messages::{
    AlterClientQuotasRequest, AlterClientQuotasResponse, ApiKey, DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
};
use kafka_protocol::protocol::StrBytes;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::statistics::Statistics;
use rdkafka::ClientContext;

const BIN: &str = env!("CARGO_BIN_EXE_gregor");

/// The tests of this file measure rates against wall time (bytes/s, connections/s, throttle
/// times), and several start a Kafka JVM: run side by side on two cores, one test's JVM starves
/// another's measured client or broker. They run one at a time; each holds this lock.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn sb(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

/// Sets (Some) or removes (None) quota `key` of the entity `components`.
fn alter(
    bootstrap: &str,
    components: &[(&str, Option<&str>)],
    ops: &[(&str, Option<f64>)],
    validate_only: bool,
) -> Result<AlterClientQuotasResponse> {
    let mut conn = KafkaConn::connect(bootstrap, "quota-admin")?;
    let req = AlterClientQuotasRequest::default()
        .with_validate_only(validate_only)
        .with_entries(vec![EntryData::default()
            .with_entity(
                components
                    .iter()
                    .map(|(t, n)| {
                        EntityData::default()
                            .with_entity_type(sb(t))
                            .with_entity_name(n.map(sb))
                    })
                    .collect(),
            )
            .with_ops(
                ops.iter()
                    .map(|(k, v)| {
                        OpData::default()
                            .with_key(sb(k))
                            .with_value(v.unwrap_or(0.0))
                            .with_remove(v.is_none())
                    })
                    .collect(),
            )]);
    conn.call(ApiKey::AlterClientQuotas, 1, &req)
}

fn set_quota(bootstrap: &str, client_id: &str, key: &str, value: f64) -> Result<()> {
    let r = alter(
        bootstrap,
        &[("client-id", Some(client_id))],
        &[(key, Some(value))],
        false,
    )?;
    ensure!(
        r.entries.len() == 1 && r.entries[0].error_code == 0,
        "AlterClientQuotas: {r:?}"
    );
    Ok(())
}

fn create_topic(bootstrap: &str, topic: &str) -> Result<()> {
    let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
        ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .create()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let r = rt.block_on(admin.create_topics(
        &[rdkafka::admin::NewTopic::new(
            topic,
            1,
            rdkafka::admin::TopicReplication::Fixed(1),
        )],
        &rdkafka::admin::AdminOptions::new(),
    ))?;
    for t in r {
        t.map_err(|(n, e)| anyhow::anyhow!("creating {n}: {e}"))?;
    }
    Ok(())
}

/// Counts acknowledged bytes and keeps the largest broker throttle librdkafka reports.
#[derive(Default)]
struct Counting {
    acked_bytes: AtomicU64,
    failed: AtomicU64,
    throttle_max_ms: AtomicI64,
}

/// The clients' context: a handle on the shared counters.
#[derive(Clone)]
struct Ctx(Arc<Counting>);

impl ClientContext for Ctx {
    fn stats(&self, statistics: Statistics) {
        for b in statistics.brokers.values() {
            if let Some(w) = &b.throttle {
                self.0.throttle_max_ms.fetch_max(w.max, Ordering::Relaxed);
            }
        }
    }
}

impl rdkafka::consumer::ConsumerContext for Ctx {}

impl ProducerContext for Ctx {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(m) => {
                self.0
                    .acked_bytes
                    .fetch_add(m.payload_len() as u64, Ordering::Relaxed);
            }
            Err(_) => {
                self.0.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// `producer_byte_rate` of 1 MB/s for the producer's client id: librdkafka produces as fast as
/// it can for 20 s, the bytes it has acknowledged over that wall time stay within 10% of the
/// quota, and it reports a broker throttle (its statistics' `throttle`, from the responses'
/// `throttle_time_ms`).
///
/// Kafka's rate is measured over at least `quota.window.num - 1` windows (10 s): a producer
/// that starts flat out gets 10 MB through at once, and when that sample leaves the window
/// about 11 s later, another burst of its size; the bursts recur every window (Kafka 4.4 and
/// gregor acknowledge the same 1.13 MB/s over a first 20 s, second by second alike, see the
/// `_kafka` variant with `--nocapture`). So the producer first sends at the quota for 10 s,
/// as a producer that has been running does, and the 20 s are measured after that, flat out.
#[test]
fn producer_byte_rate_holds_an_rdkafka_producer_to_its_quota() -> Result<()> {
    let _serial = one_at_a_time();
    let g = Gregor::start(BIN, &[])?;
    produce_under_quota(&g.bootstrap(), "gregor")
}

/// The same against Apache Kafka 4.4.0.
#[test]
fn producer_byte_rate_holds_an_rdkafka_producer_to_its_quota_kafka() -> Result<()> {
    let _serial = one_at_a_time();
    if !reference::jars_or_skip() {
        return Ok(());
    }
    let (instance, _guard) = start_kafka()?;
    produce_under_quota(&instance.bootstrap(), "kafka")
}

/// Starts a Kafka 4.4.0 node on free ports, trying other ports when one was taken between
/// choosing and binding it (tests start brokers in parallel).
fn start_kafka() -> Result<(reference::Instance, ChildGuard)> {
    let mut last = None;
    for _ in 0..5 {
        let instance = reference::Instance::new(free_port()?, None, None)?;
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

fn produce_under_quota(bs: &str, implementation: &str) -> Result<()> {
    const QUOTA: f64 = 1_000_000.0;
    create_topic(bs, "quota-produce")?;
    set_quota(bs, "quota-producer", "producer_byte_rate", QUOTA)?;

    let ctx = Arc::new(Counting::default());
    let producer: ThreadedProducer<Ctx> = ClientConfig::new()
        .set("bootstrap.servers", bs)
        .set("client.id", "quota-producer")
        .set("statistics.interval.ms", "500")
        .set("linger.ms", "5")
        .set("batch.size", "65536")
        .set("queue.buffering.max.kbytes", "8192")
        .set("message.timeout.ms", "120000")
        .create_with_context(Ctx(ctx.clone()))?;
    let value = vec![7u8; 8 * 1024];
    let send_until = |until: Instant| {
        while Instant::now() < until {
            match producer.send(BaseRecord::<(), [u8]>::to("quota-produce").payload(&value)) {
                Ok(()) => {}
                Err((_, _)) => std::thread::sleep(Duration::from_millis(1)),
            }
        }
    };
    // The warm-up: sends paced to QUOTA bytes per second.
    let warm_up = Instant::now();
    let mut sent = 0usize;
    while warm_up.elapsed() < WARM_UP {
        let due = (warm_up.elapsed().as_secs_f64() * QUOTA) as usize;
        if sent + value.len() > due {
            std::thread::sleep(Duration::from_millis(2));
            continue;
        }
        match producer.send(BaseRecord::<(), [u8]>::to("quota-produce").payload(&value)) {
            Ok(()) => sent += value.len(),
            Err((_, _)) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    let started = Instant::now();
    let start_bytes = ctx.acked_bytes.load(Ordering::Relaxed);
    let mut per_second = Vec::new();
    let mut last = start_bytes;
    for s in 1..=MEASURED_SECONDS {
        send_until(started + Duration::from_secs(s));
        let now = ctx.acked_bytes.load(Ordering::Relaxed);
        per_second.push((now - last) as f64 / 1e6);
        last = now;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let acked = (ctx.acked_bytes.load(Ordering::Relaxed) - start_bytes) as f64;
    let rate = acked / elapsed;
    let throttle = ctx.throttle_max_ms.load(Ordering::Relaxed);
    println!(
        "{implementation}: acknowledged {rate:.0} B/s over {elapsed:.1} s (quota {QUOTA}); per second (MB): {per_second:?}; max throttle {throttle} ms"
    );
    ensure!(ctx.failed.load(Ordering::Relaxed) == 0, "deliveries failed");
    ensure!(throttle > 0, "librdkafka saw no throttle_time_ms");
    ensure!(
        (rate - QUOTA).abs() <= QUOTA * 0.10,
        "acknowledged rate {rate:.0} B/s is not within 10% of {QUOTA}"
    );
    drop(producer);
    Ok(())
}

/// How long the producer runs flat out, measured (s).
const MEASURED_SECONDS: u64 = 20;
/// How long it first sends at the quota.
const WARM_UP: Duration = Duration::from_secs(10);

/// `consumer_byte_rate` of 200 KB/s for the consumer's client id, 6 MiB already in the log: a
/// consumer with another client id reads it all, unthrottled; the quota's consumer gets no
/// more in its first 6 s than Kafka's rate allows — 10 windows' worth (2 MB, the minimum
/// window) plus the one fetch that crossed the bound (a consumer's fetch is capped at that
/// same 2 MB, Kafka's `getMaxValueInQuotaWindow`), a throttled fetch returning nothing — and
/// librdkafka reports the broker's throttle.
#[test]
fn consumer_byte_rate_throttles_an_rdkafka_consumer() -> Result<()> {
    let _serial = one_at_a_time();
    const QUOTA: f64 = 200_000.0;
    const TOTAL: usize = 6 * 1024 * 1024;
    let g = Gregor::start(BIN, &[])?;
    let bs = g.bootstrap();
    create_topic(&bs, "quota-fetch")?;
    {
        let ctx = Arc::new(Counting::default());
        let producer: ThreadedProducer<Ctx> = ClientConfig::new()
            .set("bootstrap.servers", &bs)
            .set("linger.ms", "5")
            .create_with_context(Ctx(ctx.clone()))?;
        let value = vec![3u8; 16 * 1024];
        let mut sent = 0;
        while sent < TOTAL {
            match producer.send(BaseRecord::<(), [u8]>::to("quota-fetch").payload(&value)) {
                Ok(()) => sent += value.len(),
                Err(_) => std::thread::sleep(Duration::from_millis(1)),
            }
        }
        producer.flush(Duration::from_secs(60))?;
        ensure!(ctx.acked_bytes.load(Ordering::Relaxed) as usize == TOTAL);
    }
    set_quota(&bs, "quota-consumer", "consumer_byte_rate", QUOTA)?;

    // Reads for at most `limit`, or until everything is read; (bytes read, max throttle).
    let consume = |client_id: &str, limit: Duration| -> Result<(usize, i64)> {
        let ctx = Arc::new(Counting::default());
        let consumer: BaseConsumer<Ctx> = ClientConfig::new()
            .set("bootstrap.servers", &bs)
            .set("client.id", client_id)
            .set("group.id", client_id)
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false")
            .set("statistics.interval.ms", "500")
            .create_with_context(Ctx(ctx.clone()))?;
        consumer.subscribe(&["quota-fetch"])?;
        let started = Instant::now();
        let mut read = 0usize;
        while read < TOTAL && started.elapsed() < limit {
            if let Some(m) = consumer.poll(Duration::from_millis(100)) {
                read += m.context("consume")?.payload_len();
            }
        }
        // One more statistics interval, so the last throttle is reported.
        let until = Instant::now() + Duration::from_millis(1200);
        while Instant::now() < until {
            let _ = consumer.poll(Duration::from_millis(100));
        }
        Ok((read, ctx.throttle_max_ms.load(Ordering::Relaxed)))
    };
    let (free_read, free_throttle) = consume("unthrottled-consumer", Duration::from_secs(60))?;
    let (read, throttle) = consume("quota-consumer", Duration::from_secs(6))?;
    println!(
        "unthrottled: {free_read} B (throttle {free_throttle} ms); consumer_byte_rate {QUOTA}: {read} B in 6 s (max throttle {throttle} ms)"
    );
    ensure!(
        free_read == TOTAL && free_throttle == 0,
        "the other client id was throttled"
    );
    ensure!(throttle > 0, "librdkafka saw no throttle_time_ms");
    let allowed = QUOTA * 10.0 * 2.0 + 64.0 * 1024.0;
    ensure!(
        (read as f64) <= allowed,
        "read {read} bytes in 6 s, more than the quota allows ({allowed:.0})"
    );
    ensure!(read > 0, "nothing read");
    Ok(())
}

/// AlterClientQuotas and DescribeClientQuotas as Kafka answers them: validate_only writes
/// nothing, a set quota is described with its entity, invalid alterations get
/// INVALID_REQUEST with Kafka's message, and a removal empties the entity.
#[test]
fn alter_and_describe_client_quotas() -> Result<()> {
    let _serial = one_at_a_time();
    let g = Gregor::start(BIN, &[])?;
    let bs = g.bootstrap();
    let describe =
        |components: Vec<ComponentData>, strict: bool| -> Result<DescribeClientQuotasResponse> {
            let mut conn = KafkaConn::connect(&bs, "quota-admin")?;
            conn.call(
                ApiKey::DescribeClientQuotas,
                1,
                &DescribeClientQuotasRequest::default()
                    .with_components(components)
                    .with_strict(strict),
            )
        };
    let user_alice = || {
        vec![ComponentData::default()
            .with_entity_type(sb("user"))
            .with_match_type(0)
            .with_match(Some(sb("alice")))]
    };
    let entity = [("user", Some("alice")), ("client-id", None)];
    let r = alter(&bs, &entity, &[("producer_byte_rate", Some(1024.0))], true)?;
    ensure!(r.entries[0].error_code == 0, "{r:?}");
    let d = describe(user_alice(), false)?;
    ensure!(
        d.entries.as_ref().is_some_and(Vec::is_empty),
        "validate_only wrote: {d:?}"
    );

    let r = alter(
        &bs,
        &entity,
        &[
            ("producer_byte_rate", Some(1024.0)),
            ("request_percentage", Some(12.5)),
        ],
        false,
    )?;
    ensure!(r.entries[0].error_code == 0, "{r:?}");
    let d = describe(user_alice(), false)?;
    let entries = d.entries.context("entries")?;
    ensure!(entries.len() == 1, "{entries:?}");
    let mut values: Vec<(String, f64)> = entries[0]
        .values
        .iter()
        .map(|v| (v.key.to_string(), v.value))
        .collect();
    values.sort_by(|a, b| a.0.cmp(&b.0));
    ensure!(
        values
            == vec![
                ("producer_byte_rate".into(), 1024.0),
                ("request_percentage".into(), 12.5)
            ],
        "{values:?}"
    );
    // Strict with only the user component: alice's (user, default client-id) entity has two.
    let d = describe(user_alice(), true)?;
    ensure!(d.entries.as_ref().is_some_and(Vec::is_empty), "{d:?}");

    for (ops, message) in [
        (
            vec![("producer_byte_rate", Some(-5.0))],
            "Quota producer_byte_rate must be greater than 0",
        ),
        (
            vec![("no_such_quota", Some(1.0))],
            "Invalid configuration key no_such_quota",
        ),
        (
            vec![("consumer_byte_rate", Some(0.5))],
            "consumer_byte_rate cannot be a fractional value.",
        ),
    ] {
        let r = alter(&bs, &entity, &ops, false)?;
        ensure!(
            r.entries[0].error_code == 42 && r.entries[0].error_message.as_deref() == Some(message),
            "{ops:?}: {r:?}"
        );
    }
    let r = alter(
        &bs,
        &[("group", Some("g"))],
        &[("producer_byte_rate", Some(1.0))],
        false,
    )?;
    ensure!(
        r.entries[0].error_code == 42
            && r.entries[0].error_message.as_deref()
                == Some("Unhandled client quota entity type: group"),
        "{r:?}"
    );
    let d = describe(
        vec![ComponentData::default()
            .with_entity_type(sb("group"))
            .with_match_type(2)],
        false,
    )?;
    ensure!(d.error_code == 35 && d.entries.is_none(), "{d:?}");

    let r = alter(
        &bs,
        &entity,
        &[("producer_byte_rate", None), ("request_percentage", None)],
        false,
    )?;
    ensure!(r.entries[0].error_code == 0, "{r:?}");
    let d = describe(user_alice(), false)?;
    ensure!(
        d.entries.as_ref().is_some_and(Vec::is_empty),
        "not removed: {d:?}"
    );
    Ok(())
}

/// `kafka-configs` (Kafka 4.4.0's tool) adding, describing and deleting client quotas of
/// users, client ids, both, defaults and an IP, against gregor and against Kafka: the tool
/// prints the same for both, line for line (Kafka's output is the expectation).
#[test]
fn kafka_configs_manages_client_quotas_as_on_kafka() -> Result<()> {
    let _serial = one_at_a_time();
    if !reference::jars_or_skip() {
        return Ok(());
    }
    let g = Gregor::start(BIN, &[])?;
    let (kafka, _guard) = start_kafka()?;
    let script: &[&[&str]] = &[
        &[
            "--alter",
            "--entity-type",
            "clients",
            "--entity-name",
            "app1",
            "--add-config",
            "producer_byte_rate=1048576,consumer_byte_rate=2097152",
        ],
        &[
            "--alter",
            "--entity-type",
            "users",
            "--entity-name",
            "alice",
            "--add-config",
            "request_percentage=50.5",
        ],
        &[
            "--alter",
            "--entity-type",
            "users",
            "--entity-default",
            "--add-config",
            "producer_byte_rate=1000",
        ],
        &[
            "--alter",
            "--entity-type",
            "users",
            "--entity-name",
            "alice",
            "--entity-type",
            "clients",
            "--entity-name",
            "app1",
            "--add-config",
            "controller_mutation_rate=10",
        ],
        &[
            "--alter",
            "--entity-type",
            "ips",
            "--entity-name",
            "127.0.0.1",
            "--add-config",
            "connection_creation_rate=10",
        ],
        &[
            "--describe",
            "--entity-type",
            "clients",
            "--entity-name",
            "app1",
        ],
        &[
            "--describe",
            "--entity-type",
            "users",
            "--entity-name",
            "alice",
            "--entity-type",
            "clients",
            "--entity-name",
            "app1",
        ],
        &["--describe", "--entity-type", "users", "--entity-default"],
        &[
            "--describe",
            "--entity-type",
            "ips",
            "--entity-name",
            "127.0.0.1",
        ],
        &[
            "--alter",
            "--entity-type",
            "clients",
            "--entity-name",
            "app1",
            "--delete-config",
            "producer_byte_rate",
        ],
        &[
            "--alter",
            "--entity-type",
            "clients",
            "--entity-name",
            "app1",
            "--add-config",
            "consumer_byte_rate=-1",
        ],
        &[
            "--describe",
            "--entity-type",
            "clients",
            "--entity-name",
            "app1",
        ],
    ];
    let run = |bootstrap: &str| -> Result<Vec<String>> {
        script
            .iter()
            .map(|args| {
                let mut all = vec!["--bootstrap-server", bootstrap];
                all.extend_from_slice(args);
                let out = reference::tool_output("kafka-configs", &all)?;
                // Only the tool's own lines (not JVM or log noise), stack traces cut.
                Ok(out
                    .lines()
                    .filter(|l| !l.starts_with('\t') && !l.trim().is_empty())
                    .collect::<Vec<_>>()
                    .join("\n")
                    .replace(bootstrap, "<bootstrap>"))
            })
            .collect()
    };
    let on_kafka = run(&kafka.bootstrap())?;
    let on_gregor = run(&g.bootstrap())?;
    for ((args, k), gr) in script.iter().zip(&on_kafka).zip(&on_gregor) {
        println!(
            "kafka-configs {}\n  kafka:  {k}\n  gregor: {gr}",
            args.join(" ")
        );
    }
    ensure!(
        on_gregor == on_kafka,
        "kafka-configs printed something else on gregor"
    );
    Ok(())
}

/// `controller_mutation_rate` (KIP-599) of 1 partition/s for a client id: its burst (11
/// tokens) lets a 20-partition CreateTopics v7 through whole, into debt; the next one is
/// refused with THROTTLING_QUOTA_EXCEEDED and a throttle time (strict from v6), while a v5
/// request (permissive) is accepted and answered with a throttle time. Another client id is
/// not limited.
#[test]
fn controller_mutation_rate_refuses_strict_clients_and_throttles_old_ones() -> Result<()> {
    let _serial = one_at_a_time();
    use kafka_protocol::messages::create_topics_request::CreatableTopic;
    use kafka_protocol::messages::{CreateTopicsRequest, CreateTopicsResponse, TopicName};
    let g = Gregor::start(BIN, &[])?;
    let bs = g.bootstrap();
    set_quota(&bs, "mutator", "controller_mutation_rate", 1.0)?;
    let create =
        |client_id: &str, version: i16, name: &str, partitions: i32| -> Result<(i16, i32)> {
            let mut conn = KafkaConn::connect(&bs, client_id)?;
            let r: CreateTopicsResponse = conn.call(
                ApiKey::CreateTopics,
                version,
                &CreateTopicsRequest::default()
                    .with_timeout_ms(30_000)
                    .with_topics(vec![CreatableTopic::default()
                        .with_name(TopicName(sb(name)))
                        .with_num_partitions(partitions)
                        .with_replication_factor(1)]),
            )?;
            Ok((r.topics[0].error_code, r.throttle_time_ms))
        };
    let (code, throttle) = create("mutator", 7, "mutation-1", 20)?;
    ensure!(code == 0 && throttle == 0, "first: {code} {throttle}");
    let (code, throttle) = create("mutator", 7, "mutation-2", 1)?;
    ensure!(
        code == 89 && (8_000..=9_000).contains(&throttle),
        "strict: {code} {throttle}"
    );
    let (code, throttle) = create("mutator", 5, "mutation-3", 1)?;
    ensure!(
        code == 0 && throttle > 8_000,
        "permissive: {code} {throttle}"
    );
    let (code, throttle) = create("someone-else", 7, "mutation-4", 20)?;
    ensure!(
        code == 0 && throttle == 0,
        "another client id: {code} {throttle}"
    );
    Ok(())
}

/// One connection and an ApiVersions round trip: true when answered, false when the broker
/// closed the connection instead.
fn served(bootstrap: &str) -> Result<bool> {
    use kafka_protocol::messages::{ApiVersionsRequest, ApiVersionsResponse};
    let mut conn = KafkaConn::connect(bootstrap, "conn-rate")?;
    let r: Result<ApiVersionsResponse> = conn.call(
        ApiKey::ApiVersions,
        3,
        &ApiVersionsRequest::default()
            .with_client_software_name(sb("t"))
            .with_client_software_version(sb("1")),
    );
    Ok(r.is_ok())
}

/// KIP-612. `max.connection.creation.rate=5`: Kafka's rate lets the first 10 windows' worth
/// (50) in at once, then holds the acceptor back (200 ms, 400 ms, ...), each connection still
/// served: 54 connections take more than a second. A `connection_creation_rate` quota of 5 for
/// `ip=127.0.0.1` (AlterClientQuotas): the 51st connection from that address is closed
/// without an answer (after the throttle time), while the first 50 are served.
#[test]
fn connection_creation_rates_throttle_new_connections() -> Result<()> {
    let _serial = one_at_a_time();
    let g = Gregor::start(BIN, &["max.connection.creation.rate=5"])?;
    let bs = g.bootstrap();
    let started = Instant::now();
    for i in 0..54 {
        ensure!(served(&bs)?, "connection {i} was not served");
    }
    let took = started.elapsed();
    println!("54 connections at max.connection.creation.rate=5: {took:?}");
    ensure!(
        took >= Duration::from_secs(1),
        "60 connections in {took:?}: not throttled"
    );
    drop(g);

    let g = Gregor::start(BIN, &[])?;
    let bs = g.bootstrap();
    let r = alter(
        &bs,
        &[("ip", Some("127.0.0.1"))],
        &[("connection_creation_rate", Some(5.0))],
        false,
    )?;
    ensure!(r.entries[0].error_code == 0, "{r:?}");
    // The AlterClientQuotas connection counted as one.
    let mut answered = 1;
    while answered < 50 {
        ensure!(
            served(&bs)?,
            "connection {answered} was refused below the rate"
        );
        answered += 1;
    }
    let mut refused = false;
    for _ in 0..5 {
        if !served(&bs)? {
            refused = true;
            break;
        }
    }
    ensure!(
        refused,
        "no connection above connection_creation_rate was closed"
    );
    Ok(())
}

/// `request_percentage` on APIs other than Produce and Fetch (Kafka's
/// `sendResponseMaybeThrottle`): a client id with a tiny quota (0.01 % of a thread) that sends
/// Metadata requests is throttled within a few requests, `throttle_time_ms` in the answer is
/// at most one quota window (1 s, `quota.window.size.seconds`), the next request on a new
/// connection (DescribeCluster, ListGroups) is throttled too (the rate is the client id's),
/// and another client id is not throttled.
fn request_percentage_on_other_apis(bootstrap: &str, implementation: &str) -> Result<()> {
    use kafka_protocol::messages::{
        DescribeClusterRequest, DescribeClusterResponse, ListGroupsRequest, ListGroupsResponse,
        MetadataRequest, MetadataResponse,
    };
    set_quota(bootstrap, "busy", "request_percentage", 0.01)?;
    let metadata = |c: &mut KafkaConn| -> Result<i32> {
        let r: MetadataResponse = c.call(ApiKey::Metadata, 12, &MetadataRequest::default())?;
        Ok(r.throttle_time_ms)
    };
    // Quotas reach the broker through its metadata: poll until the first throttle.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut busy = KafkaConn::connect(bootstrap, "busy")?;
    let mut sent = 0;
    let first = loop {
        let t = metadata(&mut busy)?;
        sent += 1;
        if t > 0 {
            break t;
        }
        ensure!(
            Instant::now() < deadline,
            "{implementation}: {sent} Metadata requests of client id busy, never throttled"
        );
    };
    eprintln!("{implementation}: Metadata throttled after {sent} requests: {first} ms");
    ensure!(
        (1..=1000).contains(&first),
        "{implementation}: Metadata throttle_time_ms {first}, want 1..=1000"
    );
    let mut other = KafkaConn::connect(bootstrap, "busy")?;
    let r: DescribeClusterResponse = other.call(
        ApiKey::DescribeCluster,
        1,
        &DescribeClusterRequest::default(),
    )?;
    eprintln!(
        "{implementation}: DescribeCluster throttle_time_ms {}",
        r.throttle_time_ms
    );
    ensure!(
        (1..=1000).contains(&r.throttle_time_ms),
        "{implementation}: DescribeCluster of a throttled client id: {}",
        r.throttle_time_ms
    );
    let mut other = KafkaConn::connect(bootstrap, "busy")?;
    let r: ListGroupsResponse = other.call(ApiKey::ListGroups, 4, &ListGroupsRequest::default())?;
    eprintln!(
        "{implementation}: ListGroups throttle_time_ms {}",
        r.throttle_time_ms
    );
    ensure!(
        (1..=1000).contains(&r.throttle_time_ms),
        "{implementation}: ListGroups of a throttled client id: {}",
        r.throttle_time_ms
    );
    let mut idle = KafkaConn::connect(bootstrap, "idle")?;
    for _ in 0..20 {
        let t = metadata(&mut idle)?;
        ensure!(
            t == 0,
            "{implementation}: client id idle has no quota: {t} ms"
        );
    }
    Ok(())
}

#[test]
fn request_percentage_throttles_other_apis() -> Result<()> {
    let _serial = one_at_a_time();
    let g = Gregor::start(BIN, &[])?;
    request_percentage_on_other_apis(&g.bootstrap(), "gregor")
}

/// The same against Apache Kafka 4.4.0.
#[test]
fn request_percentage_throttles_other_apis_kafka() -> Result<()> {
    let _serial = one_at_a_time();
    if !reference::jars_or_skip() {
        return Ok(());
    }
    let (instance, _guard) = start_kafka()?;
    request_percentage_on_other_apis(&instance.bootstrap(), "kafka")
}

/// Sends Metadata requests as `client_id` until one is throttled (the quota reaches the
/// broker through its metadata), so that the client id's request rate is above its
/// `request_percentage` for the next requests.
fn saturate_request_quota(bootstrap: &str, client_id: &str, implementation: &str) -> Result<()> {
    use kafka_protocol::messages::{MetadataRequest, MetadataResponse};
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut conn = KafkaConn::connect(bootstrap, client_id)?;
    loop {
        let r: MetadataResponse = conn.call(ApiKey::Metadata, 12, &MetadataRequest::default())?;
        if r.throttle_time_ms > 0 {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "{implementation}: Metadata of client id {client_id} never throttled"
        );
    }
}

/// `request_percentage` (KIP-124) on the group and transaction coordinators' APIs (Kafka's
/// `sendMaybeThrottle` / `sendResponseMaybeThrottle` in `KafkaApis`): a group member
/// (JoinGroup twice, SyncGroup, Heartbeat, OffsetCommit, OffsetFetch) and a transactional
/// producer (InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn)
/// whose client ids have a quota of 0.01 % of a thread, once above it, get every answer with
/// `throttle_time_ms` > 0 (at most one quota window, 1 s) and no error. A forwarded admin
/// request (CreateTopics) is throttled too.
fn request_percentage_on_coordinator_apis(bootstrap: &str, implementation: &str) -> Result<()> {
    use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
    use kafka_protocol::messages::create_topics_request::CreatableTopic;
    use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
    use kafka_protocol::messages::offset_commit_request::{
        OffsetCommitRequestPartition, OffsetCommitRequestTopic,
    };
    use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
    use kafka_protocol::messages::txn_offset_commit_request::{
        TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic,
    };
    use kafka_protocol::messages::*;

    create_topic(bootstrap, "rp-topic")?;
    set_quota(bootstrap, "rp-member", "request_percentage", 0.01)?;
    set_quota(bootstrap, "rp-txn", "request_percentage", 0.01)?;
    let check = |api: &str, throttle: i32, error: i16| -> Result<()> {
        eprintln!("{implementation}: {api}: throttle_time_ms {throttle}, error {error}");
        ensure!(
            (1..=1000).contains(&throttle),
            "{implementation}: {api} throttle_time_ms {throttle}, want 1..=1000"
        );
        ensure!(error == 0, "{implementation}: {api} error {error}");
        Ok(())
    };

    // The coordinators' topics exist before the quota'd clients start (Kafka creates them on
    // the first FindCoordinator).
    let find = |key: &str, key_type: i8| -> Result<()> {
        let mut c = KafkaConn::connect(bootstrap, "rp-setup")?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let r: FindCoordinatorResponse = c.call(
                ApiKey::FindCoordinator,
                4,
                &FindCoordinatorRequest::default()
                    .with_key_type(key_type)
                    .with_coordinator_keys(vec![sb(key)]),
            )?;
            if r.coordinators.first().is_some_and(|c| c.error_code == 0) {
                return Ok(());
            }
            ensure!(
                Instant::now() < deadline,
                "{implementation}: no coordinator for {key}: {r:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    find("rp-group", 0)?;
    find("rp-txn-group", 0)?;
    find("rp-txn-id", 1)?;

    // A group member.
    saturate_request_quota(bootstrap, "rp-member", implementation)?;
    let mut m = KafkaConn::connect(bootstrap, "rp-member")?;
    let join = |m: &mut KafkaConn, member: &str| -> Result<JoinGroupResponse> {
        m.call(
            ApiKey::JoinGroup,
            5,
            &JoinGroupRequest::default()
                .with_group_id(GroupId(sb("rp-group")))
                .with_session_timeout_ms(30_000)
                .with_rebalance_timeout_ms(30_000)
                .with_member_id(sb(member))
                .with_protocol_type(sb("consumer"))
                .with_protocols(vec![JoinGroupRequestProtocol::default()
                    .with_name(sb("range"))
                    .with_metadata(bytes::Bytes::from_static(&[0, 0, 0, 0, 0, 0]))]),
        )
    };
    let r = join(&mut m, "")?;
    // MEMBER_ID_REQUIRED (79) is the expected first answer of v4+.
    check("JoinGroup (member id required)", r.throttle_time_ms, 0)?;
    ensure!(
        r.error_code == 79,
        "{implementation}: first JoinGroup: {r:?}"
    );
    let member = r.member_id.to_string();
    let r = join(&mut m, &member)?;
    check("JoinGroup", r.throttle_time_ms, r.error_code)?;
    let generation = r.generation_id;
    let r: SyncGroupResponse = m.call(
        ApiKey::SyncGroup,
        3,
        &SyncGroupRequest::default()
            .with_group_id(GroupId(sb("rp-group")))
            .with_generation_id(generation)
            .with_member_id(sb(&member))
            .with_assignments(vec![SyncGroupRequestAssignment::default()
                .with_member_id(sb(&member))
                .with_assignment(bytes::Bytes::from_static(&[0, 0, 0, 0, 0, 0, 0, 0]))]),
    )?;
    check("SyncGroup", r.throttle_time_ms, r.error_code)?;
    let r: HeartbeatResponse = m.call(
        ApiKey::Heartbeat,
        3,
        &HeartbeatRequest::default()
            .with_group_id(GroupId(sb("rp-group")))
            .with_generation_id(generation)
            .with_member_id(sb(&member)),
    )?;
    check("Heartbeat", r.throttle_time_ms, r.error_code)?;
    let r: OffsetCommitResponse = m.call(
        ApiKey::OffsetCommit,
        7,
        &OffsetCommitRequest::default()
            .with_group_id(GroupId(sb("rp-group")))
            .with_generation_id_or_member_epoch(generation)
            .with_member_id(sb(&member))
            .with_topics(vec![OffsetCommitRequestTopic::default()
                .with_name(TopicName(sb("rp-topic")))
                .with_partitions(vec![OffsetCommitRequestPartition::default()
                    .with_partition_index(0)
                    .with_committed_offset(0)])]),
    )?;
    check(
        "OffsetCommit",
        r.throttle_time_ms,
        r.topics[0].partitions[0].error_code,
    )?;
    let r: OffsetFetchResponse = m.call(
        ApiKey::OffsetFetch,
        7,
        &OffsetFetchRequest::default()
            .with_group_id(GroupId(sb("rp-group")))
            .with_topics(None),
    )?;
    check("OffsetFetch", r.throttle_time_ms, r.error_code)?;

    // A transactional producer.
    saturate_request_quota(bootstrap, "rp-txn", implementation)?;
    let mut p = KafkaConn::connect(bootstrap, "rp-txn")?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let r = loop {
        let r: InitProducerIdResponse = p.call(
            ApiKey::InitProducerId,
            3,
            &InitProducerIdRequest::default()
                .with_transactional_id(Some(TransactionalId(sb("rp-txn-id"))))
                .with_transaction_timeout_ms(60_000)
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1),
        )?;
        // Retriable while the transaction coordinator loads: COORDINATOR_LOAD_IN_PROGRESS,
        // COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR, CONCURRENT_TRANSACTIONS.
        if ![14, 15, 16, 51].contains(&r.error_code) || Instant::now() > deadline {
            break r;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    check("InitProducerId", r.throttle_time_ms, r.error_code)?;
    let (pid, epoch) = (r.producer_id, r.producer_epoch);
    let r: AddPartitionsToTxnResponse = p.call(
        ApiKey::AddPartitionsToTxn,
        3,
        &AddPartitionsToTxnRequest::default()
            .with_v3_and_below_transactional_id(TransactionalId(sb("rp-txn-id")))
            .with_v3_and_below_producer_id(pid)
            .with_v3_and_below_producer_epoch(epoch)
            .with_v3_and_below_topics(vec![AddPartitionsToTxnTopic::default()
                .with_name(TopicName(sb("rp-topic")))
                .with_partitions(vec![0])]),
    )?;
    let error = r
        .results_by_topic_v3_and_below
        .first()
        .and_then(|t| t.results_by_partition.first())
        .map_or(-1, |p| p.partition_error_code);
    check("AddPartitionsToTxn", r.throttle_time_ms, error)?;
    let r: AddOffsetsToTxnResponse = p.call(
        ApiKey::AddOffsetsToTxn,
        3,
        &AddOffsetsToTxnRequest::default()
            .with_transactional_id(TransactionalId(sb("rp-txn-id")))
            .with_producer_id(pid)
            .with_producer_epoch(epoch)
            .with_group_id(GroupId(sb("rp-txn-group"))),
    )?;
    check("AddOffsetsToTxn", r.throttle_time_ms, r.error_code)?;
    let r: TxnOffsetCommitResponse = p.call(
        ApiKey::TxnOffsetCommit,
        3,
        &TxnOffsetCommitRequest::default()
            .with_transactional_id(TransactionalId(sb("rp-txn-id")))
            .with_group_id(GroupId(sb("rp-txn-group")))
            .with_producer_id(pid)
            .with_producer_epoch(epoch)
            .with_generation_id(-1)
            .with_member_id(sb(""))
            .with_topics(vec![TxnOffsetCommitRequestTopic::default()
                .with_name(TopicName(sb("rp-topic")))
                .with_partitions(vec![TxnOffsetCommitRequestPartition::default()
                    .with_partition_index(0)
                    .with_committed_offset(0)])]),
    )?;
    check(
        "TxnOffsetCommit",
        r.throttle_time_ms,
        r.topics[0].partitions[0].error_code,
    )?;
    let r: EndTxnResponse = p.call(
        ApiKey::EndTxn,
        3,
        &EndTxnRequest::default()
            .with_transactional_id(TransactionalId(sb("rp-txn-id")))
            .with_producer_id(pid)
            .with_producer_epoch(epoch)
            .with_committed(true),
    )?;
    check("EndTxn", r.throttle_time_ms, r.error_code)?;

    // An admin request forwarded to the controller.
    let r: CreateTopicsResponse = p.call(
        ApiKey::CreateTopics,
        7,
        &CreateTopicsRequest::default()
            .with_timeout_ms(30_000)
            .with_topics(vec![CreatableTopic::default()
                .with_name(TopicName(sb("rp-created")))
                .with_num_partitions(1)
                .with_replication_factor(1)]),
    )?;
    check("CreateTopics", r.throttle_time_ms, r.topics[0].error_code)?;
    Ok(())
}

#[test]
fn request_percentage_throttles_group_and_transaction_apis() -> Result<()> {
    let _serial = one_at_a_time();
    let g = Gregor::start(BIN, &[])?;
    request_percentage_on_coordinator_apis(&g.bootstrap(), "gregor")
}

/// The same against Apache Kafka 4.4.0.
#[test]
fn request_percentage_throttles_group_and_transaction_apis_kafka() -> Result<()> {
    let _serial = one_at_a_time();
    if !reference::jars_or_skip() {
        return Ok(());
    }
    let (instance, _guard) = start_kafka()?;
    request_percentage_on_coordinator_apis(&instance.bootstrap(), "kafka")
}

/// KIP-612 with Kafka's own tool on a running broker: `kafka-configs --alter --entity-type ips
/// --entity-name 127.0.0.1 --add-config connection_creation_rate=5` takes effect without a
/// restart. Kafka's rate is measured over at least 10 s (`quota.window.num` 11 of 1 s), so
/// of the connections that follow about 50 are served (fewer by the tool's own), then one is
/// closed without an answer; `--delete-config` lifts the quota. Counted, not timed.
fn ips_quota_from_kafka_configs(bootstrap: &str, implementation: &str) -> Result<()> {
    let kafka_configs = |args: &[&str]| -> Result<String> {
        let mut all = vec!["--bootstrap-server", bootstrap];
        all.extend_from_slice(args);
        reference::tool_output("kafka-configs", &all)
    };
    for i in 0..60 {
        ensure!(
            served(bootstrap)?,
            "{implementation}: connection {i} refused with no quota"
        );
    }
    let out = kafka_configs(&[
        "--alter",
        "--entity-type",
        "ips",
        "--entity-name",
        "127.0.0.1",
        "--add-config",
        "connection_creation_rate=5",
    ])?;
    ensure!(
        out.contains("Completed updating config"),
        "{implementation}: kafka-configs: {out}"
    );
    let mut answered = 0;
    let mut refused = false;
    for _ in 0..80 {
        if served(bootstrap)? {
            answered += 1;
        } else {
            refused = true;
            break;
        }
    }
    eprintln!("{implementation}: {answered} connections served before one was refused");
    ensure!(
        refused,
        "{implementation}: 80 connections at connection_creation_rate=5, none refused"
    );
    ensure!(
        (35..=60).contains(&answered),
        "{implementation}: {answered} connections served, want about 50"
    );
    let out = kafka_configs(&[
        "--alter",
        "--entity-type",
        "ips",
        "--entity-name",
        "127.0.0.1",
        "--delete-config",
        "connection_creation_rate",
    ])?;
    ensure!(
        out.contains("Completed updating config"),
        "{implementation}: kafka-configs: {out}"
    );
    // The removal reaches the broker through its metadata: the first few may still be refused.
    let mut lifted = false;
    for _ in 0..30 {
        if served(bootstrap)? {
            lifted = true;
            break;
        }
    }
    ensure!(lifted, "{implementation}: the quota was not lifted");
    for i in 0..20 {
        ensure!(
            served(bootstrap)?,
            "{implementation}: connection {i} refused after the quota was deleted"
        );
    }
    Ok(())
}

#[test]
fn ips_connection_creation_rate_from_kafka_configs_applies_at_once() -> Result<()> {
    let _serial = one_at_a_time();
    if !reference::jars_or_skip() {
        return Ok(());
    }
    let g = Gregor::start(BIN, &[])?;
    ips_quota_from_kafka_configs(&g.bootstrap(), "gregor")
}

/// The same against Apache Kafka 4.4.0.
#[test]
fn ips_connection_creation_rate_from_kafka_configs_applies_at_once_kafka() -> Result<()> {
    let _serial = one_at_a_time();
    if !reference::jars_or_skip() {
        return Ok(());
    }
    let (instance, _guard) = start_kafka()?;
    ips_quota_from_kafka_configs(&instance.bootstrap(), "kafka")
}
