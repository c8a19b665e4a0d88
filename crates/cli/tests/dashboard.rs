//! The Grafana dashboard (`packaging/grafana/gregor-dashboard.json`) against a live broker:
//! every metric its queries name is one the broker exports, and every query, run by a real
//! Prometheus server (Debian's package; Grafana itself is not in our registries) that scrapes
//! the broker, is valid PromQL and returns series.

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use gregor_tests::process::{free_ports, poll, prometheus_tool, ChildGuard};
use gregor_tests::Gregor;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::ClientConfig;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_gregor");

fn http_get(port: u16, path: &str) -> Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    let status = raw
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("no HTTP status")?;
    let body = raw.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    // Prometheus answers queries with chunked encoding: the JSON is inside one chunk here.
    let body = if raw.contains("Transfer-Encoding: chunked") {
        body.split_once("\r\n").map_or("", |(_, b)| b)
    } else {
        body
    };
    Ok((status, body.to_string()))
}

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
fn queries(dashboard: &Value) -> Result<Vec<(String, String)>> {
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
    let queries = queries(&dashboard)?;

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
            let (status, body) = http_get(web, &path).ok()?;
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
