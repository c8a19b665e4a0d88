//! `gregor status`: one screen about a running broker, from its admin listener's `/metrics`
//! (scraped twice, `--interval-ms` apart, for rates) and a Metadata request.
//!
//! The HTTP client is a plain GET over a `TcpStream`: the admin listener is local, answers
//! HTTP/1.1 with a Content-Length, and this is the only request the CLI makes to it.

use super::{ConnectionArgs, Output};
use anyhow::{bail, ensure, Context, Result};
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use rdkafka::consumer::{BaseConsumer, Consumer};
use serde_json::json;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Bound on the `/metrics` body (a broker with many partitions is a few MB).
const MAX_METRICS_BYTES: u64 = 64 * 1024 * 1024;
/// How many consumer lags to show.
const TOP_LAGS: usize = 5;

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    connection: ConnectionArgs,
    /// The broker's admin listener (`admin.listener`), where `/metrics` is served.
    #[arg(
        long,
        env = "GREGOR_ADMIN_URL",
        default_value = "http://127.0.0.1:9644"
    )]
    admin_url: String,
    /// Time between the two scrapes that rates are computed from, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    interval_ms: u64,
    /// Timeout for each request, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    timeout_ms: u64,
    /// How to print results.
    #[arg(long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

/// One sample of the Prometheus text format.
#[derive(Debug, Clone, PartialEq)]
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

impl Sample {
    fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Parses the Prometheus text exposition format (comments and malformed lines are skipped).
fn parse_metrics(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(parse_line)
        .collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() {
        return None;
    }
    let name_end = line.find(['{', ' '])?;
    let name = line[..name_end].to_string();
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(mut s) = rest.strip_prefix('{') {
        loop {
            s = s.trim_start_matches([',', ' ']);
            if let Some(after) = s.strip_prefix('}') {
                rest = after;
                break;
            }
            let (key, after) = s.split_once("=\"")?;
            let mut value = String::new();
            let mut chars = after.char_indices();
            let end = loop {
                let (i, c) = chars.next()?;
                match c {
                    '\\' => match chars.next()?.1 {
                        'n' => value.push('\n'),
                        other => value.push(other),
                    },
                    '"' => break i,
                    c => value.push(c),
                }
            };
            labels.push((key.trim().to_string(), value));
            s = &after[end + 1..];
        }
    }
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// `http://host:port[/prefix]` -> (host:port, prefix without a trailing slash).
fn parse_url(url: &str) -> Result<(String, String)> {
    let Some(rest) = url.strip_prefix("http://") else {
        bail!("--admin-url must start with http:// (got {url:?})");
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    ensure!(!authority.is_empty(), "no host in --admin-url {url:?}");
    let authority = if authority.contains(':') {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    Ok((authority, path.to_string()))
}

/// GETs `url` + `path`; the body of a 200 answer.
fn http_get(url: &str, path: &str, timeout: Duration) -> Result<String> {
    let (authority, prefix) = parse_url(url)?;
    let addr = authority
        .to_socket_addrs()
        .with_context(|| format!("resolving {authority}"))?
        .next()
        .with_context(|| format!("{authority} resolves to no address"))?;
    let mut stream = TcpStream::connect_timeout(&addr, timeout).with_context(|| {
        format!("connecting to the admin listener at {url} (is the broker running, and is this its admin.listener?)")
    })?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    write!(
        stream,
        "GET {prefix}{path} HTTP/1.1\r\nHost: {authority}\r\nAccept: text/plain\r\nConnection: close\r\n\r\n"
    )
    .with_context(|| format!("sending GET {path} to {url}"))?;
    let mut raw = Vec::new();
    stream
        .take(MAX_METRICS_BYTES)
        .read_to_end(&mut raw)
        .with_context(|| format!("reading {path} from {url}"))?;
    let raw = String::from_utf8_lossy(&raw);
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .with_context(|| format!("{url}{path}: not an HTTP response"))?;
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse::<u16>().ok())
        .with_context(|| format!("{url}{path}: no HTTP status line"))?;
    ensure!(status == 200, "{url}{path} answered HTTP {status}");
    let chunked = lines.any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked")
        })
    });
    if chunked {
        dechunk(body).with_context(|| format!("{url}{path}: bad chunked body"))
    } else {
        Ok(body.to_string())
    }
}

fn dechunk(mut body: &str) -> Result<String> {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n").context("no chunk size")?;
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
            .context("bad chunk size")?;
        if size == 0 {
            return Ok(out);
        }
        ensure!(rest.len() >= size, "truncated chunk");
        out.push_str(rest.get(..size).context("chunk splits a character")?);
        body = rest[size..].trim_start_matches("\r\n");
    }
}

/// The four per-topic counters.
#[derive(Default, Clone, Copy)]
struct Traffic {
    records_in: f64,
    bytes_in: f64,
    records_out: f64,
    bytes_out: f64,
}

fn traffic_by_topic(samples: &[Sample]) -> BTreeMap<String, Traffic> {
    let mut out: BTreeMap<String, Traffic> = BTreeMap::new();
    for s in samples {
        let Some(topic) = s.label("topic") else {
            continue;
        };
        let field: fn(&mut Traffic) -> &mut f64 = match s.name.as_str() {
            "gregor_topic_records_in_total" => |t: &mut Traffic| &mut t.records_in,
            "gregor_topic_bytes_in_total" => |t: &mut Traffic| &mut t.bytes_in,
            "gregor_topic_records_out_total" => |t: &mut Traffic| &mut t.records_out,
            "gregor_topic_bytes_out_total" => |t: &mut Traffic| &mut t.bytes_out,
            _ => continue,
        };
        *field(out.entry(topic.to_string()).or_default()) += s.value;
    }
    out
}

fn gauge(samples: &[Sample], name: &str) -> Option<f64> {
    samples.iter().find(|s| s.name == name).map(|s| s.value)
}

/// Per-second rates between two scrapes; a counter that went down (restart) counts from 0.
fn rates(
    before: &BTreeMap<String, Traffic>,
    after: &BTreeMap<String, Traffic>,
    seconds: f64,
) -> BTreeMap<String, Traffic> {
    let rate = |a: f64, b: f64| {
        if a >= b {
            (a - b) / seconds
        } else {
            a / seconds
        }
    };
    after
        .iter()
        .map(|(topic, a)| {
            let b = before.get(topic).copied().unwrap_or_default();
            (
                topic.clone(),
                Traffic {
                    records_in: rate(a.records_in, b.records_in),
                    bytes_in: rate(a.bytes_in, b.bytes_in),
                    records_out: rate(a.records_out, b.records_out),
                    bytes_out: rate(a.bytes_out, b.bytes_out),
                },
            )
        })
        .collect()
}

struct Lag {
    group: String,
    topic: String,
    partition: String,
    lag: f64,
}

/// The largest non-zero consumer lags.
fn top_lags(samples: &[Sample], n: usize) -> Vec<Lag> {
    let mut lags: Vec<Lag> = samples
        .iter()
        .filter(|s| s.name == "gregor_consumer_group_lag" && s.value > 0.0)
        .map(|s| Lag {
            group: s.label("group").unwrap_or_default().to_string(),
            topic: s.label("topic").unwrap_or_default().to_string(),
            partition: s.label("partition").unwrap_or_default().to_string(),
            lag: s.value,
        })
        .collect();
    lags.sort_by(|a, b| {
        b.lag.total_cmp(&a.lag).then_with(|| {
            (&a.group, &a.topic, &a.partition).cmp(&(&b.group, &b.topic, &b.partition))
        })
    });
    lags.truncate(n);
    lags
}

fn human_duration(seconds: f64) -> String {
    let s = seconds.max(0.0) as u64;
    let (d, h, m, s) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    if d > 0 {
        format!("{d}d {h}h {m:02}m")
    } else if h > 0 {
        format!("{h}h {m:02}m {s:02}s")
    } else if m > 0 {
        format!("{m}m {s:02}s")
    } else {
        format!("{s}s")
    }
}

fn human_bytes(bytes: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{v:.0} {}", UNITS[unit])
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// What Metadata says about the cluster.
struct ClusterShape {
    brokers: usize,
    topics: Vec<(String, usize)>,
    internal_topics: Vec<(String, usize)>,
}

fn cluster_shape(connection: &ConnectionArgs, timeout: Duration) -> Result<ClusterShape> {
    let client: BaseConsumer = connection
        .client_config(&[])
        .create()
        .context("creating the client")?;
    let metadata = client
        .fetch_metadata(None, timeout)
        .with_context(|| format!("fetching metadata from {}", connection.bootstrap_server))?;
    let mut topics = Vec::new();
    let mut internal_topics = Vec::new();
    for t in metadata.topics() {
        if t.error().is_some() {
            continue;
        }
        let entry = (t.name().to_string(), t.partitions().len());
        if t.name().starts_with("__") {
            internal_topics.push(entry);
        } else {
            topics.push(entry);
        }
    }
    topics.sort();
    internal_topics.sort();
    Ok(ClusterShape {
        brokers: metadata.brokers().len(),
        topics,
        internal_topics,
    })
}

pub async fn run(args: StatusArgs) -> Result<()> {
    tokio::task::spawn_blocking(move || status(&args)).await?
}

fn status(args: &StatusArgs) -> Result<()> {
    let timeout = Duration::from_millis(args.timeout_ms);
    let first = parse_metrics(&http_get(&args.admin_url, "/metrics", timeout)?);
    let started = Instant::now();
    let shape = cluster_shape(&args.connection, timeout)?;
    std::thread::sleep(
        Duration::from_millis(args.interval_ms.max(1)).saturating_sub(started.elapsed()),
    );
    let second = parse_metrics(&http_get(&args.admin_url, "/metrics", timeout)?);
    let seconds = started.elapsed().as_secs_f64().max(0.001);

    let version = second
        .iter()
        .find(|s| s.name == "gregor_build_info")
        .and_then(|s| s.label("version"))
        .map(str::to_string);
    let uptime_seconds = gauge(&second, "gregor_uptime_seconds");
    let ready = gauge(&second, "gregor_ready").map(|v| v >= 1.0);
    let connections = gauge(&second, "gregor_connections_active");
    let under_replicated = gauge(&second, "gregor_under_replicated_partitions");
    let rss_bytes = gauge(&second, "process_resident_memory_bytes");
    let per_topic = rates(
        &traffic_by_topic(&first),
        &traffic_by_topic(&second),
        seconds,
    );
    let mut total = Traffic::default();
    for t in per_topic.values() {
        total.records_in += t.records_in;
        total.bytes_in += t.bytes_in;
        total.records_out += t.records_out;
        total.bytes_out += t.bytes_out;
    }
    let busy: Vec<(&String, &Traffic)> = per_topic
        .iter()
        .filter(|(_, t)| t.records_in > 0.0 || t.records_out > 0.0)
        .collect();
    let lags = top_lags(&second, TOP_LAGS);
    let partitions: usize = shape.topics.iter().map(|(_, n)| n).sum();
    let internal_partitions: usize = shape.internal_topics.iter().map(|(_, n)| n).sum();

    match args.output {
        Output::Json => {
            let traffic = |t: &Traffic| {
                json!({
                    "records_in_per_sec": t.records_in,
                    "bytes_in_per_sec": t.bytes_in,
                    "records_out_per_sec": t.records_out,
                    "bytes_out_per_sec": t.bytes_out,
                })
            };
            println!(
                "{}",
                json!({
                    "bootstrap": args.connection.bootstrap_server,
                    "admin_url": args.admin_url,
                    "version": version,
                    "cli_version": env!("CARGO_PKG_VERSION"),
                    "uptime_seconds": uptime_seconds,
                    "ready": ready,
                    "brokers": shape.brokers,
                    "topics": shape.topics.iter()
                        .map(|(n, p)| json!({"name": n, "partitions": p}))
                        .collect::<Vec<_>>(),
                    "topic_count": shape.topics.len(),
                    "partition_count": partitions,
                    "internal_topic_count": shape.internal_topics.len(),
                    "internal_partition_count": internal_partitions,
                    "connections_active": connections,
                    "under_replicated_partitions": under_replicated,
                    "resident_memory_bytes": rss_bytes,
                    "interval_seconds": seconds,
                    "throughput": traffic(&total),
                    "topic_throughput": busy.iter()
                        .map(|(n, t)| {
                            let mut v = traffic(t);
                            v["topic"] = json!(n);
                            v
                        })
                        .collect::<Vec<_>>(),
                    "largest_lags": lags.iter()
                        .map(|l| json!({
                            "group": l.group,
                            "topic": l.topic,
                            "partition": l.partition.parse::<i64>().ok(),
                            "lag": l.lag,
                        }))
                        .collect::<Vec<_>>(),
                })
            );
        }
        Output::Table => {
            let dash = || "-".to_string();
            let mut table = Table::new();
            table.load_preset(UTF8_FULL_CONDENSED);
            let mut row = |k: &str, v: String| {
                table.add_row([k.to_string(), v]);
            };
            row(
                "broker",
                format!(
                    "{} (admin {})",
                    args.connection.bootstrap_server, args.admin_url
                ),
            );
            row(
                "version",
                version.clone().unwrap_or_else(|| {
                    format!(
                        "not reported by the broker (this CLI: {})",
                        env!("CARGO_PKG_VERSION")
                    )
                }),
            );
            row("uptime", uptime_seconds.map_or_else(dash, human_duration));
            row(
                "ready",
                ready.map_or_else(dash, |r| if r { "yes" } else { "no" }.to_string()),
            );
            row("brokers", shape.brokers.to_string());
            row(
                "topics",
                format!(
                    "{} with {} partitions (+{} internal with {})",
                    shape.topics.len(),
                    partitions,
                    shape.internal_topics.len(),
                    internal_partitions
                ),
            );
            row(
                "under-replicated",
                under_replicated.map_or_else(dash, |v| format!("{v:.0}")),
            );
            row(
                "connections",
                connections.map_or_else(dash, |v| format!("{v:.0}")),
            );
            row("memory (RSS)", rss_bytes.map_or_else(dash, human_bytes));
            row(
                "in",
                format!(
                    "{:.0} records/s, {}/s",
                    total.records_in,
                    human_bytes(total.bytes_in)
                ),
            );
            row(
                "out",
                format!(
                    "{:.0} records/s, {}/s",
                    total.records_out,
                    human_bytes(total.bytes_out)
                ),
            );
            println!("{table}");
            if !busy.is_empty() {
                let mut table = Table::new();
                table.load_preset(UTF8_FULL_CONDENSED);
                table.set_header([
                    "Topic",
                    "In records/s",
                    "In bytes/s",
                    "Out records/s",
                    "Out bytes/s",
                ]);
                for (n, t) in busy.iter().take(10) {
                    table.add_row([
                        (*n).clone(),
                        format!("{:.0}", t.records_in),
                        human_bytes(t.bytes_in),
                        format!("{:.0}", t.records_out),
                        human_bytes(t.bytes_out),
                    ]);
                }
                println!("{table}");
            }
            if lags.is_empty() {
                println!("No consumer group is lagging.");
            } else {
                let mut table = Table::new();
                table.load_preset(UTF8_FULL_CONDENSED);
                table.set_header(["Group", "Topic", "Partition", "Lag"]);
                for l in &lags {
                    table.add_row([
                        l.group.clone(),
                        l.topic.clone(),
                        l.partition.clone(),
                        format!("{:.0}", l.lag),
                    ]);
                }
                println!("Largest consumer lags:\n{table}");
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_lines_parse() {
        let text = "# HELP x y\n# TYPE gregor_ready gauge\ngregor_ready 1\n\
                    gregor_consumer_group_lag{group=\"g \\\"1\\\"\",topic=\"t\",partition=\"0\"} 5\n\
                    h_bucket{le=\"+Inf\"} 3\nbad line here\n";
        let samples = parse_metrics(text);
        assert_eq!(samples.len(), 3);
        assert_eq!(samples[0].name, "gregor_ready");
        assert_eq!(samples[0].value, 1.0);
        assert_eq!(samples[1].label("group"), Some("g \"1\""));
        assert_eq!(samples[1].label("partition"), Some("0"));
        assert_eq!(samples[1].value, 5.0);
        assert_eq!(samples[2].label("le"), Some("+Inf"));
    }

    #[test]
    fn rates_and_lags() {
        let a = parse_metrics("gregor_topic_records_in_total{topic=\"t\"} 10\n");
        let b = parse_metrics(
            "gregor_topic_records_in_total{topic=\"t\"} 30\n\
             gregor_topic_bytes_out_total{topic=\"u\"} 8\n\
             gregor_consumer_group_lag{group=\"g\",topic=\"t\",partition=\"1\"} 0\n\
             gregor_consumer_group_lag{group=\"g\",topic=\"t\",partition=\"0\"} 7\n\
             gregor_consumer_group_lag{group=\"h\",topic=\"t\",partition=\"0\"} 9\n",
        );
        let r = rates(&traffic_by_topic(&a), &traffic_by_topic(&b), 2.0);
        assert_eq!(r["t"].records_in, 10.0);
        assert_eq!(r["u"].bytes_out, 4.0);
        let lags = top_lags(&b, 5);
        assert_eq!(lags.len(), 2);
        assert_eq!((lags[0].group.as_str(), lags[0].lag), ("h", 9.0));
    }

    #[test]
    fn urls_and_chunks() {
        assert_eq!(
            parse_url("http://127.0.0.1:9644").unwrap(),
            ("127.0.0.1:9644".into(), String::new())
        );
        assert_eq!(
            parse_url("http://h/x/").unwrap(),
            ("h:80".into(), "/x".into())
        );
        assert!(parse_url("https://h").is_err());
        assert_eq!(
            dechunk("3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n").unwrap(),
            "abcde"
        );
        assert!(dechunk("9\r\nab").is_err());
    }

    #[test]
    fn human_units() {
        assert_eq!(human_duration(59.9), "59s");
        assert_eq!(human_duration(3723.0), "1h 02m 03s");
        assert_eq!(human_bytes(512.0), "512 B");
        assert_eq!(human_bytes(1536.0), "1.5 KiB");
    }
}
