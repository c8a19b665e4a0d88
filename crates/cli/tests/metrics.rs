//! The admin listener: `/metrics` counters match a known produce and consume (done with
//! librdkafka), `/health`, `/ready` before and after start-up, and the exposition passes
//! Prometheus' own linter (`promtool check metrics`); the Grafana dashboard's queries run on a
//! Prometheus server scraping a live broker.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use gregor_tests::process::{free_ports, poll, prometheus_tool, ChildGuard};
use gregor_tests::Gregor;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_gregor");
const TIMEOUT: Duration = Duration::from_secs(30);

/// Parses the Prometheus text format into `name{labels}` -> value (labels as written).
fn parse(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

fn get(m: &BTreeMap<String, f64>, key: &str) -> Result<f64> {
    m.get(key)
        .copied()
        .with_context(|| format!("metric {key} missing"))
}

fn sum_prefix(m: &BTreeMap<String, f64>, prefix: &str, contains: &str) -> f64 {
    m.iter()
        .filter(|(k, _)| k.starts_with(prefix) && k.contains(contains))
        .map(|(_, v)| v)
        .sum()
}

#[test]
fn counters_match_a_known_produce_and_consume() -> Result<()> {
    let g = Gregor::start(BIN, &[])?;
    let bs = g.bootstrap();
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", &bs).create()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(admin.create_topics(
        &[NewTopic::new("m", 2, TopicReplication::Fixed(1))],
        &AdminOptions::new(),
    ))?;

    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &bs)
        .set("linger.ms", "20")
        .create()?;
    for i in 0..100 {
        let v = format!("{i:0>100}");
        p.send(BaseRecord::<(), _>::to("m").partition(0).payload(&v))
            .map_err(|(e, _)| e)?;
    }
    p.flush(TIMEOUT)?;

    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bs)
        .set("group.id", "unused")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("m", 0, Offset::Beginning)?;
    c.assign(&tpl)?;
    let mut got = 0;
    let deadline = Instant::now() + TIMEOUT;
    while got < 100 {
        ensure!(Instant::now() < deadline, "consumed only {got}");
        if let Some(m) = c.poll(Duration::from_millis(200)) {
            m?;
            got += 1;
        }
    }
    // An invalid topic name: counted as an error of the Metadata API.
    let _ = c.fetch_metadata(Some("bad/name"), Duration::from_secs(5));

    let (status, body) = g.admin_get("/metrics")?;
    ensure!(status == 200, "/metrics answered {status}");
    let m = parse(&body);
    ensure!(get(&m, "gregor_topic_records_in_total{topic=\"m\"}")? == 100.0);
    // The broker registration and topic "m" are committed and applied.
    ensure!(get(&m, "gregor_metadata_last_applied_record_offset")? >= 1.0);
    ensure!(get(&m, "gregor_metadata_apply_errors_total")? == 0.0);
    let bytes_in = get(&m, "gregor_topic_bytes_in_total{topic=\"m\"}")?;
    let log_size = sum_prefix(&m, "gregor_log_size_bytes", "topic=\"m\"");
    ensure!(
        bytes_in == log_size && bytes_in > 100.0 * 100.0,
        "bytes in {bytes_in} vs log size {log_size}"
    );
    ensure!(get(&m, "gregor_topic_records_out_total{topic=\"m\"}")? == 100.0);
    ensure!(get(&m, "gregor_topic_bytes_out_total{topic=\"m\"}")? == bytes_in);
    ensure!(get(&m, "gregor_log_end_offset{topic=\"m\",partition=\"0\"}")? == 100.0);
    ensure!(get(&m, "gregor_high_watermark{topic=\"m\",partition=\"0\"}")? == 100.0);
    ensure!(get(&m, "gregor_log_end_offset{topic=\"m\",partition=\"1\"}")? == 0.0);
    // Topic m plus __consumer_offsets, which the consumer's group.id brings into being.
    let partitions = get(&m, "gregor_partitions")?;
    ensure!(partitions >= 2.0, "{partitions} partitions");
    ensure!(get(&m, "gregor_leader_partitions")? == partitions);
    ensure!(get(&m, "gregor_under_replicated_partitions")? == 0.0);
    ensure!(get(&m, "gregor_connections_active")? >= 2.0);
    ensure!(sum_prefix(&m, "gregor_requests_total", "api=\"Produce\"") >= 1.0);
    ensure!(sum_prefix(&m, "gregor_requests_total", "api=\"Fetch\"") >= 1.0);
    ensure!(
        sum_prefix(
            &m,
            "gregor_request_errors_total",
            "error=\"InvalidTopicException\""
        ) >= 1.0,
        "invalid topic not counted"
    );
    ensure!(
        sum_prefix(
            &m,
            "gregor_request_processing_seconds_count",
            "api=\"Produce\""
        ) >= 1.0
    );
    ensure!(m
        .keys()
        .any(|k| k.starts_with("process_resident_memory_bytes")));
    ensure!(get(&m, "gregor_ready")? == 1.0);

    ensure!(g.admin_get("/health")?.0 == 200);
    ensure!(g.admin_get("/ready")?.0 == 200);
    ensure!(g.admin_get("/nope")?.0 == 404);

    // Prometheus' linter accepts the exposition.
    promtool_check(&body)
}

/// `promtool check metrics` accepts `body`.
fn promtool_check(body: &str) -> Result<()> {
    let promtool = gregor_tests::process::prometheus_tool("promtool").context(
        "promtool not found: put it on PATH, or run `cargo xtask test`, which extracts it from Debian's `prometheus` package",
    )?;
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .context("promtool stdin")?
        .write_all(body.as_bytes())?;
    let out = child.wait_with_output()?;
    ensure!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// Produces `n` records to `partition` of `topic` and waits for their acknowledgement.
fn produce(bs: &str, topic: &str, partition: i32, n: usize) -> Result<()> {
    let p: BaseProducer = ClientConfig::new().set("bootstrap.servers", bs).create()?;
    for i in 0..n {
        let v = format!("r{i}");
        p.send(
            BaseRecord::<(), _>::to(topic)
                .partition(partition)
                .payload(&v),
        )
        .map_err(|(e, _)| e)?;
    }
    p.flush(TIMEOUT)?;
    Ok(())
}

/// Commits `offsets` ((partition, offset)) of `topic` for `group`.
fn commit(bs: &str, group: &str, topic: &str, offsets: &[(i32, i64)]) -> Result<()> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bs)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for (p, o) in offsets {
        tpl.add_partition_offset(topic, *p, Offset::Offset(*o))?;
    }
    c.commit(&tpl, CommitMode::Sync)?;
    Ok(())
}

/// With `admin.metrics.per.partition=false` the log gauges and the lag have one series per
/// topic, summed over its partitions, beside the number of partitions; none has a `partition`
/// label, and the exposition still passes Prometheus' linter.
#[test]
fn per_topic_series_sum_the_partitions() -> Result<()> {
    let g = Gregor::start(BIN, &["admin.metrics.per.partition=false"])?;
    let bs = g.bootstrap();
    gregor_tests::clients::create_topic(&bs, "agg", 3)?;
    produce(&bs, "agg", 0, 10)?;
    produce(&bs, "agg", 2, 5)?;
    commit(&bs, "gagg", "agg", &[(0, 4), (2, 5)])?;
    let (status, body) = g.admin_get("/metrics")?;
    ensure!(status == 200, "/metrics answered {status}");
    let m = parse(&body);
    ensure!(get(&m, "gregor_topic_partitions{topic=\"agg\"}")? == 3.0);
    ensure!(get(&m, "gregor_log_end_offset{topic=\"agg\"}")? == 15.0);
    ensure!(get(&m, "gregor_high_watermark{topic=\"agg\"}")? == 15.0);
    ensure!(get(&m, "gregor_log_start_offset{topic=\"agg\"}")? == 0.0);
    ensure!(get(&m, "gregor_log_segments{topic=\"agg\"}")? == 3.0);
    ensure!(
        get(&m, "gregor_log_size_bytes{topic=\"agg\"}")?
            == get(&m, "gregor_topic_bytes_in_total{topic=\"agg\"}")?
    );
    // 10 - 4 on partition 0, 5 - 5 on partition 2.
    ensure!(
        get(
            &m,
            "gregor_consumer_group_lag{group=\"gagg\",topic=\"agg\"}"
        )? == 6.0
    );
    for family in [
        "gregor_log_size_bytes",
        "gregor_log_segments",
        "gregor_log_end_offset",
        "gregor_log_start_offset",
        "gregor_high_watermark",
        "gregor_consumer_group_lag",
    ] {
        ensure!(
            !m.keys()
                .any(|k| k.starts_with(&format!("{family}{{")) && k.contains("partition=")),
            "{family} has per-partition series:\n{body}"
        );
    }
    promtool_check(&body)
}

/// Per partition (the default), a deleted topic's log gauges leave `/metrics` (they are read
/// from the hosted partitions at each scrape, not kept from earlier scrapes).
#[test]
fn a_deleted_topic_leaves_no_partition_series() -> Result<()> {
    let g = Gregor::start(BIN, &[])?;
    let bs = g.bootstrap();
    gregor_tests::clients::create_topic(&bs, "gone", 2)?;
    produce(&bs, "gone", 1, 3)?;
    let (_, body) = g.admin_get("/metrics")?;
    ensure!(
        get(
            &parse(&body),
            "gregor_log_end_offset{topic=\"gone\",partition=\"1\"}"
        )? == 3.0
    );
    let admin = gregor_tests::clients::admin(&bs)?;
    for r in gregor_tests::clients::runtime()?
        .block_on(admin.delete_topics(&["gone"], &AdminOptions::new()))?
    {
        if let Err((t, e)) = r {
            bail!("deleting {t}: {e}");
        }
    }
    let left = poll(TIMEOUT, || {
        let (_, body) = g.admin_get("/metrics").ok()?;
        (!body
            .lines()
            .any(|l| l.starts_with("gregor_log_") && l.contains("topic=\"gone\"")))
        .then_some(())
    });
    ensure!(
        left.is_some(),
        "series of the deleted topic are still served"
    );
    Ok(())
}

#[test]
fn ready_is_false_until_logs_are_loaded() -> Result<()> {
    let mut g = Gregor::spawn_with_env(BIN, &[], &[("GREGOR_TEST_STARTUP_DELAY_MS", "1500")])?;
    // The admin listener answers first: healthy, not ready.
    let deadline = Instant::now() + TIMEOUT;
    let mut saw_not_ready = false;
    loop {
        ensure!(Instant::now() < deadline, "admin listener never answered");
        match g.admin_get("/ready") {
            Ok((503, _)) => {
                saw_not_ready = true;
                ensure!(g.admin_get("/health")?.0 == 200);
            }
            Ok((200, _)) => break,
            Ok((other, _)) => bail!("/ready answered {other}"),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    ensure!(saw_not_ready, "/ready was never 503 during start-up");
    g.wait_ready()?;
    Ok(())
}

#[test]
fn lag_is_end_minus_committed_for_a_group_that_stopped_halfway() -> Result<()> {
    use rdkafka::consumer::CommitMode;
    let g = Gregor::start(BIN, &[])?;
    let bs = g.bootstrap();
    let p: BaseProducer = ClientConfig::new().set("bootstrap.servers", &bs).create()?;
    for i in 0..100 {
        let v = format!("v{i}");
        p.send(BaseRecord::<(), _>::to("lagged").partition(0).payload(&v))
            .map_err(|(e, _)| e)?;
    }
    p.flush(TIMEOUT)?;
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bs)
        .set("group.id", "halfway")
        .set("enable.auto.commit", "false")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("lagged", 0, Offset::Offset(40))?;
    c.commit(&tpl, CommitMode::Sync)?;
    let (_, body) = g.admin_get("/metrics")?;
    let m = parse(&body);
    let lag = get(
        &m,
        "gregor_consumer_group_lag{group=\"halfway\",topic=\"lagged\",partition=\"0\"}",
    )?;
    ensure!(lag == 60.0, "lag {lag}");
    ensure!(sum_prefix(&m, "gregor_consumer_groups", "") >= 1.0);
    Ok(())
}

// The Grafana dashboard (`packaging/grafana/gregor-dashboard.json`) against a live broker:
// every metric its queries name is one the broker exports, and every query, run by a real
// Prometheus server (Debian's package; Grafana itself is not in our registries) that scrapes
// the broker, is valid PromQL and returns series.

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// (panel title, expression) for every query of the dashboard, Grafana's variables replaced
/// as Grafana would for "All instances" and a 15 s scrape interval.
fn dashboard_queries(dashboard: &Value) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().context("no panels")? {
        let title = panel["title"].as_str().context("panel without title")?;
        ensure!(
            panel["datasource"]["uid"] == "${datasource}",
            "{title}: not on the dashboard's data source variable"
        );
        for target in panel["targets"].as_array().context("no targets")? {
            let expr = target["expr"].as_str().context("target without expr")?;
            out.push((
                title.to_string(),
                expr.replace("$__rate_interval", "10s")
                    .replace("$instance", ".*"),
            ));
        }
    }
    ensure!(out.len() >= 20, "only {} queries", out.len());
    Ok(out)
}

#[test]
fn every_dashboard_query_returns_series_from_a_live_broker() -> Result<()> {
    let text = std::fs::read_to_string(
        gregor_tests::process::repo_root().join("packaging/grafana/gregor-dashboard.json"),
    )?;
    let dashboard: Value = serde_json::from_str(&text)?;
    let queries = dashboard_queries(&dashboard)?;

    // A broker with traffic: records in and out, a group with committed offsets (lag).
    let g = Gregor::start(BIN, &["group.initial.rebalance.delay.ms=0"])?;
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", g.bootstrap())
        .create()?;
    for i in 0..50 {
        producer
            .send(BaseRecord::<(), _>::to("dash").payload(&format!("r{i}")))
            .map_err(|(e, _)| e)?;
    }
    producer.flush(Duration::from_secs(30))?;
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", g.bootstrap())
        .set("group.id", "dash-group")
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()?;
    consumer.subscribe(&["dash"])?;
    let mut read = 0;
    poll(Duration::from_secs(30), || {
        if let Some(Ok(_)) = consumer.poll(Duration::from_millis(200)) {
            read += 1;
        }
        (read >= 10).then_some(())
    })
    .context("consumed nothing")?;
    consumer.commit_consumer_state(CommitMode::Sync)?;
    // An error answer, for the errors panel: Metadata for a name that cannot be a topic.
    let invalid = consumer.fetch_metadata(Some("not/a/topic"), Duration::from_secs(10));
    let invalid_topic = invalid
        .ok()
        .is_some_and(|m| m.topics().iter().any(|t| t.error().is_some()));
    ensure!(invalid_topic, "Metadata accepted an invalid topic name");

    // Every metric the dashboard names is exported.
    let (_, scrape) = g.admin_get("/metrics")?;
    let exported: BTreeSet<&str> = scrape
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    for (title, expr) in &queries {
        for name in expr
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("gregor_") || w.starts_with("process_"))
        {
            ensure!(
                exported.contains(name),
                "panel {title:?} queries {name}, which the broker does not export"
            );
        }
    }

    // Prometheus scrapes the broker every second; each query must be valid and return data.
    let prometheus = prometheus_tool("prometheus").context(
        "prometheus not found: put it on PATH, or run `cargo xtask test`, which extracts it \
         from Debian's `prometheus` package",
    )?;
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: gregor\n    \
             static_configs:\n      - targets: ['127.0.0.1:{}']\n",
            g.admin_port
        ),
    )?;
    let web = free_ports(1)?[0];
    let child = Command::new(prometheus)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{web}"))
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(dir.path().join("log"))?))
        .spawn()?;
    let mut guard = ChildGuard::new("prometheus", child);
    let mut last = String::new();
    let answered = poll(Duration::from_secs(60), || {
        guard.check_alive().ok()?;
        for (title, expr) in &queries {
            let path = format!("/api/v1/query?query={}", percent_encode(expr));
            let (status, body) = gregor_tests::process::http_get(web, &path).ok()?;
            let v: Value = serde_json::from_str(&body).unwrap_or_default();
            if status == 400 || v["status"] == "error" {
                // Not PromQL Prometheus accepts: fail at once, not after the timeout.
                last = format!("INVALID {title}: {expr}: {body}");
                return Some(false);
            }
            let empty = v["data"]["result"].as_array().is_none_or(Vec::is_empty);
            if empty {
                last = format!("no series yet for {title}: {expr} ({body})");
                return None;
            }
        }
        Some(true)
    });
    let log = std::fs::read_to_string(dir.path().join("log")).unwrap_or_default();
    ensure!(answered == Some(true), "{last}\nprometheus log:\n{log}");
    Ok(())
}
