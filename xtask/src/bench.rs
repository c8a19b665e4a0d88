//! `cargo xtask bench`: the same workloads against gregor and the reference Apache Kafka broker,
//! one after the other, with the same load generator (`gregor perf`, on librdkafka).
//!
//! Each run of a workload gets a freshly started broker (so peak RSS and CPU belong to that
//! workload), gregor first, then Kafka, back to back; the whole set is repeated `--repeat`
//! times and every metric is the median over the repetitions. Nothing is pinned: the machine
//! has 2 cores shared by broker and load generator, as a user's laptop would. Kafka runs with
//! `-Xmx1g -Xms256m` (`kafka::Instance::spawn`). Before each measured run both brokers get the
//! same warm-up (50,000 records of 1 KiB to another topic, with the workload's codec), so
//! Kafka is measured with a warm JIT. Kafka's own ProducerPerformance is run once
//! per broker on workload (a)'s shape as a cross-check of the load generator.
//!
//! Output: `target/bench/report.json`, `report.md` (a table) and `report.png` (throughput bars
//! and latency percentiles). `--quick` shrinks every size so that CI tests the harness, and
//! writes to `target/bench/quick/` instead.

use crate::bench_png::{self, Canvas, Group};
use crate::difftest::Gregor;
use crate::kafka;
use crate::proc::{self, repo_root, ChildGuard};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use gregor_tests::process::GregorServer;
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

#[derive(Args)]
pub struct BenchArgs {
    /// Small sizes and one repetition: checks the harness (CI), not the brokers.
    #[arg(long)]
    pub quick: bool,
    /// Repetitions (medians are reported); default 3, or 1 with --quick.
    #[arg(long)]
    pub repeat: Option<usize>,
    /// Only these workloads, e.g. `--only a,e`.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// The gregor binary; default target/release/gregor.
    #[arg(long)]
    pub binary: Option<PathBuf>,
    /// Only re-render report.md and report.png from target/bench/report.json.
    #[arg(long)]
    pub render: bool,
}

#[derive(Clone)]
struct Produce {
    records: u64,
    record_size: usize,
    acks: &'static str,
    compression: &'static str,
    /// Records per second, -1 unthrottled.
    throughput: i64,
}

#[derive(Clone)]
struct Workload {
    id: &'static str,
    name: String,
    produce: Produce,
    /// (f): the produce phase only fills the topic; consuming it is measured.
    consume: bool,
}

const PARTITIONS: u32 = 6;

fn workloads(quick: bool) -> Vec<Workload> {
    let s = |full: u64, small: u64| if quick { small } else { full };
    let kib = |records, acks, compression| Produce {
        records,
        record_size: 1024,
        acks,
        compression,
        throughput: -1,
    };
    let e_secs = s(60, 5);
    let e_rate = 20_000; // 1000-byte records: 20 MB/s
    let f_records = s(2_000_000, 50_000);
    vec![
        Workload {
            id: "a",
            name: "1 KiB, acks=1".into(),
            produce: kib(s(1_000_000, 20_000), "1", "none"),
            consume: false,
        },
        Workload {
            id: "b",
            name: "1 KiB, acks=all".into(),
            produce: kib(s(1_000_000, 20_000), "all", "none"),
            consume: false,
        },
        Workload {
            id: "c",
            name: "1 KiB, acks=1, lz4".into(),
            produce: kib(s(1_000_000, 20_000), "1", "lz4"),
            consume: false,
        },
        Workload {
            id: "d",
            name: "100 B, acks=1".into(),
            produce: Produce {
                records: s(5_000_000, 100_000),
                record_size: 100,
                acks: "1",
                compression: "none",
                throughput: -1,
            },
            consume: false,
        },
        Workload {
            id: "e",
            name: format!("20 MB/s for {e_secs} s"),
            produce: Produce {
                records: e_rate * e_secs,
                record_size: 1000,
                acks: "1",
                compression: "none",
                throughput: i64::try_from(e_rate).unwrap_or(20_000),
            },
            consume: false,
        },
        Workload {
            id: "f",
            name: format!("consume {} MB", f_records / 1000),
            produce: Produce {
                records: f_records,
                record_size: 1000,
                acks: "1",
                compression: "none",
                throughput: -1,
            },
            consume: true,
        },
    ]
}

/// Metrics of one run of one workload against one broker.
const METRICS: &[&str] = &[
    "records_per_sec",
    "mb_per_sec",
    "p50_ms",
    "p99_ms",
    "p999_ms",
    "cpu_s",
    "rss_mb",
];

pub fn run(args: &BenchArgs) -> Result<i32> {
    let root = repo_root();
    let binary = args
        .binary
        .clone()
        .unwrap_or_else(|| root.join("target").join("release").join("gregor"));
    if !binary.exists() {
        bail!(
            "{} is missing: run `cargo build --release -p gregor`",
            binary.display()
        );
    }
    let repeat = args.repeat.unwrap_or(if args.quick { 1 } else { 3 }).max(1);
    // --quick (CI) does not overwrite the report of a real run.
    let out_dir = if args.quick {
        root.join("target").join("bench").join("quick")
    } else {
        root.join("target").join("bench")
    };
    if args.render {
        let report: Value =
            serde_json::from_str(&std::fs::read_to_string(out_dir.join("report.json"))?)?;
        return write_reports(&out_dir, &report).map(|()| 0);
    }
    let work = out_dir.join("work");
    std::fs::create_dir_all(&work)?;
    kafka::fetch()?;
    let clk_tck = clock_ticks();
    let selected: Vec<Workload> = workloads(args.quick)
        .into_iter()
        .filter(|w| args.only.is_empty() || args.only.iter().any(|o| o == w.id))
        .collect();
    if selected.is_empty() {
        bail!("no workload selected");
    }

    let started = Instant::now();
    // runs[workload][broker] = one JSON object per repetition.
    let mut runs: Vec<[Vec<Value>; 2]> = vec![[vec![], vec![]]; selected.len()];
    let mut cross_check = json!({});
    for rep in 0..repeat {
        for (wi, w) in selected.iter().enumerate() {
            for (bi, broker) in ["gregor", "kafka"].iter().enumerate() {
                eprintln!(
                    "==== bench rep {}/{repeat} workload ({}) {} on {broker}",
                    rep + 1,
                    w.id,
                    w.name
                );
                let mut server = Server::start(broker, &binary, &work)?;
                let result = run_workload(&binary, &server, w, clk_tck, args.quick)
                    .with_context(|| format!("workload ({}) on {broker}", w.id));
                let result = match result {
                    Ok(r) => r,
                    Err(e) => {
                        server.stop();
                        return Err(e);
                    }
                };
                eprintln!("     {result}");
                runs[wi][bi].push(result);
                if rep == 0 && w.id == "a" {
                    match producer_performance(&server, w) {
                        Ok(v) => cross_check[*broker] = v,
                        Err(e) => eprintln!("warning: ProducerPerformance cross-check: {e:#}"),
                    }
                }
                server.check_alive()?;
                server.stop();
            }
        }
    }

    let mut report_workloads = Vec::new();
    for (w, [g, k]) in selected.iter().zip(&runs) {
        let gm = medians(g);
        let km = medians(k);
        let mut ratio = json!({});
        for m in METRICS {
            if let (Some(a), Some(b)) = (gm[*m].as_f64(), km[*m].as_f64()) {
                if b > 0.0 && a >= 0.0 {
                    ratio[*m] = json!(round(a / b, 3));
                }
            }
        }
        report_workloads.push(json!({
            "id": w.id,
            "name": w.name,
            "records": w.produce.records,
            "record_size": w.produce.record_size,
            "partitions": PARTITIONS,
            "acks": w.produce.acks,
            "compression": w.produce.compression,
            "throughput_limit": w.produce.throughput,
            "measured": if w.consume { "consume" } else { "produce" },
            "gregor": gm,
            "kafka": km,
            "ratio_gregor_over_kafka": ratio,
            "runs": {"gregor": g, "kafka": k},
        }));
    }
    let report = json!({
        "command": command_line(args),
        "quick": args.quick,
        "repeat": repeat,
        "machine": {"cores": nproc(), "note": "nothing pinned; broker and load generator share the cores"},
        "kafka": {"version": kafka::KAFKA_VERSION, "jvm": "-Xmx1g -Xms256m"},
        "load_generator": "gregor perf (librdkafka), linger.ms=5",
        "warmup_records": if args.quick { 5_000 } else { WARMUP_RECORDS },
        "workloads": report_workloads,
        "producer_performance_cross_check": cross_check,
        "seconds": started.elapsed().as_secs(),
    });
    std::fs::write(
        out_dir.join("report.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    write_reports(&out_dir, &report)?;
    println!(
        "bench: {} workloads x {repeat} repetitions in {} s; report in {}",
        selected.len(),
        started.elapsed().as_secs(),
        out_dir.display()
    );
    Ok(0)
}

fn write_reports(out_dir: &Path, report: &Value) -> Result<()> {
    let md = markdown(report);
    std::fs::write(out_dir.join("report.md"), &md)?;
    std::fs::write(out_dir.join("report.png"), chart(report)?)?;
    println!("{md}");
    Ok(())
}

fn command_line(args: &BenchArgs) -> String {
    let mut s = "cargo xtask bench".to_string();
    if args.quick {
        s.push_str(" --quick");
    }
    if let Some(r) = args.repeat {
        let _ = write!(s, " --repeat {r}");
    }
    if !args.only.is_empty() {
        let _ = write!(s, " --only {}", args.only.join(","));
    }
    s
}

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

fn medians(runs: &[Value]) -> Value {
    let mut out = json!({});
    for m in METRICS {
        let mut xs: Vec<f64> = runs.iter().filter_map(|r| r[*m].as_f64()).collect();
        if xs.is_empty() {
            continue;
        }
        xs.sort_by(f64::total_cmp);
        let mid = xs.len() / 2;
        let med = if xs.len() % 2 == 1 {
            xs[mid]
        } else {
            (xs[mid - 1] + xs[mid]) / 2.0
        };
        out[*m] = json!(round(med, 3));
    }
    out
}

/// A broker started for one run.
enum Server {
    Gregor(GregorServer),
    Kafka {
        bootstrap: String,
        guard: ChildGuard,
    },
}

impl Server {
    fn start(kind: &str, binary: &Path, work: &Path) -> Result<Self> {
        let ports = proc::free_ports(2)?;
        if kind == "gregor" {
            let mut g = Gregor::start(binary, work, ports[0], ports[1])?;
            g.wait_ready()?;
            Ok(Self::Gregor(g))
        } else {
            let instance = kafka::Instance::new(
                ports[0],
                Some(ports[1]),
                Some(work.join(format!("kafka-data-{}", ports[0]))),
            )?;
            let mut guard = ChildGuard::new("kafka", instance.spawn()?);
            instance.wait_ready(|| guard.check_alive())?;
            Ok(Self::Kafka {
                bootstrap: instance.bootstrap(),
                guard,
            })
        }
    }

    fn bootstrap(&self) -> &str {
        match self {
            Self::Gregor(g) => &g.bootstrap,
            Self::Kafka { bootstrap, .. } => bootstrap,
        }
    }

    fn pid(&self) -> u32 {
        match self {
            Self::Gregor(g) => g.guard.id(),
            Self::Kafka { guard, .. } => guard.id(),
        }
    }

    fn check_alive(&mut self) -> Result<()> {
        match self {
            Self::Gregor(g) => g.check_alive(),
            Self::Kafka { guard, .. } => guard.check_alive(),
        }
    }

    fn stop(self) {
        let (data_dir, result) = match self {
            Self::Gregor(mut g) => (None, g.guard.stop()),
            Self::Kafka { mut guard, .. } => (None::<PathBuf>, guard.stop()),
        };
        if let Err(e) = result {
            eprintln!("warning: stopping a broker: {e:#}");
        }
        drop(data_dir);
    }
}

/// CPU seconds (user + system) the process has used so far.
fn cpu_seconds(pid: u32, clk_tck: f64) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| anyhow!("malformed /proc/{pid}/stat"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of stat(5); `rest` starts at field 3.
    let utime: f64 = fields.get(11).ok_or_else(|| anyhow!("no utime"))?.parse()?;
    let stime: f64 = fields.get(12).ok_or_else(|| anyhow!("no stime"))?.parse()?;
    Ok((utime + stime) / clk_tck)
}

/// Peak resident set size (VmHWM) in MB.
fn peak_rss_mb(pid: u32) -> Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .ok_or_else(|| anyhow!("no VmHWM in /proc/{pid}/status"))?
        .parse()?;
    Ok(kb * 1024.0 / 1e6)
}

fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

fn nproc() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

fn gregor_client(binary: &Path, bootstrap: &str) -> Command {
    let mut c = Command::new(binary);
    c.arg("--log-format")
        .arg("text")
        .env("GREGOR_BOOTSTRAP", bootstrap)
        .env("RUST_LOG", "warn");
    c
}

/// Runs a `gregor perf ...` command and returns the JSON object on its last stdout line.
fn perf(cmd: &mut Command) -> Result<Value> {
    eprintln!("$ {}", proc::display_command(cmd));
    let out = cmd.output().context("running gregor perf")?;
    if !out.status.success() {
        bail!(
            "{} failed ({}):\n{}{}",
            proc::display_command(cmd),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .ok_or_else(|| anyhow!("gregor perf printed no JSON:\n{stdout}"))?;
    Ok(serde_json::from_str(line)?)
}

fn produce_command(
    binary: &Path,
    bootstrap: &str,
    topic: &str,
    p: &Produce,
    latency: bool,
) -> Command {
    let mut c = gregor_client(binary, bootstrap);
    c.args(["perf", "produce", "--topic", topic])
        .arg("--num-records")
        .arg(p.records.to_string())
        .arg("--record-size")
        .arg(p.record_size.to_string())
        .arg("--throughput")
        .arg(p.throughput.to_string())
        .arg("--acks")
        .arg(p.acks)
        .arg("--compression")
        .arg(p.compression);
    if latency {
        c.arg("--latency");
    }
    c
}

fn create_topic(binary: &Path, bootstrap: &str, topic: &str) -> Result<()> {
    let mut c = gregor_client(binary, bootstrap);
    c.args(["topic", "create", topic, "--partitions"])
        .arg(PARTITIONS.to_string());
    let out = c.output().context("running gregor topic create")?;
    if !out.status.success() {
        bail!(
            "gregor topic create {topic} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Records produced to a separate topic before each measured run, on both brokers alike, so
/// that Kafka's JIT compiler has warmed up (and gregor's page cache is in the same state).
const WARMUP_RECORDS: u64 = 50_000;

fn run_workload(
    binary: &Path,
    server: &Server,
    w: &Workload,
    clk_tck: f64,
    quick: bool,
) -> Result<Value> {
    let bootstrap = server.bootstrap();
    let pid = server.pid();
    let warmup = Produce {
        records: if quick { 5_000 } else { WARMUP_RECORDS },
        record_size: 1024,
        acks: "1",
        compression: w.produce.compression,
        throughput: -1,
    };
    create_topic(binary, bootstrap, "bench-warmup")?;
    perf(&mut produce_command(
        binary,
        bootstrap,
        "bench-warmup",
        &warmup,
        true,
    ))?;
    let topic = format!("bench-{}", w.id);
    create_topic(binary, bootstrap, &topic)?;
    let (measured, cpu) = if w.consume {
        perf(&mut produce_command(
            binary, bootstrap, &topic, &w.produce, false,
        ))?;
        let cpu0 = cpu_seconds(pid, clk_tck)?;
        let mut c = gregor_client(binary, bootstrap);
        c.args(["perf", "consume", "--topic", &topic])
            .arg("--num-records")
            .arg(w.produce.records.to_string());
        let v = perf(&mut c)?;
        (v, cpu_seconds(pid, clk_tck)? - cpu0)
    } else {
        let cpu0 = cpu_seconds(pid, clk_tck)?;
        let v = perf(&mut produce_command(
            binary, bootstrap, &topic, &w.produce, true,
        ))?;
        (v, cpu_seconds(pid, clk_tck)? - cpu0)
    };
    let lat = &measured["latency_ms"];
    Ok(json!({
        "records_per_sec": round(measured["records_per_sec"].as_f64().unwrap_or(0.0), 1),
        "mb_per_sec": round(measured["mb_per_sec"].as_f64().unwrap_or(0.0), 2),
        "p50_ms": lat["p50"],
        "p99_ms": lat["p99"],
        "p999_ms": lat["p999"],
        "cpu_s": round(cpu, 2),
        "rss_mb": round(peak_rss_mb(pid)?, 1),
        "seconds": round(measured["seconds"].as_f64().unwrap_or(0.0), 2),
    }))
}

/// Kafka's ProducerPerformance on workload (a)'s shape (acks=1, 1 KiB, unthrottled), parsed from
/// its summary line "N records sent, R records/sec (M MB/sec), ...".
fn producer_performance(server: &Server, w: &Workload) -> Result<Value> {
    let topic = "bench-xcheck";
    let mut c = kafka::tool_command(
        "org.apache.kafka.tools.ProducerPerformance",
        &[
            "--topic".into(),
            topic.into(),
            "--num-records".into(),
            w.produce.records.to_string(),
            "--record-size".into(),
            w.produce.record_size.to_string(),
            "--throughput".into(),
            "-1".into(),
            "--producer-props".into(),
            format!("bootstrap.servers={}", server.bootstrap()),
            "acks=1".into(),
            "linger.ms=5".into(),
        ],
    )?;
    eprintln!("$ {}", proc::display_command(&c));
    let out = c.output().context("running ProducerPerformance")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.contains("records sent"))
        .ok_or_else(|| anyhow!("no summary line from ProducerPerformance:\n{stdout}"))?;
    let num_before = |marker: &str| -> Option<f64> {
        let head = &line[..line.find(marker)?];
        head.rsplit([' ', '('])
            .find(|s| !s.is_empty())?
            .parse()
            .ok()
    };
    Ok(json!({
        "records_per_sec": num_before(" records/sec"),
        "mb_per_sec": num_before(" MB/sec"),
        "summary": line.trim(),
    }))
}

fn fmt_num(v: &Value, digits: usize) -> String {
    match v.as_f64() {
        None => "–".into(),
        Some(x) if x >= 10_000.0 => {
            let s = format!("{x:.0}");
            let mut out = String::new();
            for (i, c) in s.chars().enumerate() {
                if i > 0 && (s.len() - i) % 3 == 0 {
                    out.push(',');
                }
                out.push(c);
            }
            out
        }
        Some(x) => format!("{x:.digits$}"),
    }
}

fn markdown(report: &Value) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "`{}`: Apache Kafka {} ({}) and gregor, same load generator (`gregor perf`, librdkafka), \
         {} partitions, {} core(s), nothing pinned; medians of {} repetition(s). \
         Latency is end to end (producer send to consumer receipt). CPU seconds are the \
         server's over the measured phase, peak RSS (VmHWM) over its life (a fresh broker per \
         run, warmed up with {} records on both). (f) measures consuming; the others producing. \
         In the unthrottled workloads (a)-(d) the latency is mostly the backlog of a producer \
         that outruns its consumer (both in the load generator); (e) measures latency.\n",
        report["command"].as_str().unwrap_or_default(),
        report["kafka"]["version"].as_str().unwrap_or_default(),
        report["kafka"]["jvm"].as_str().unwrap_or_default(),
        PARTITIONS,
        report["machine"]["cores"],
        report["repeat"],
        report["warmup_records"]
    );
    let _ = writeln!(
        s,
        "| workload | broker | records/s | MB/s | p50 ms | p99 ms | p99.9 ms | CPU s | peak RSS MB |"
    );
    let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for w in report["workloads"].as_array().into_iter().flatten() {
        let label = format!(
            "({}) {}",
            w["id"].as_str().unwrap_or(""),
            w["name"].as_str().unwrap_or("")
        );
        for (broker, key, digits) in [
            ("gregor", "gregor", 1),
            ("Kafka", "kafka", 1),
            ("gregor/Kafka", "ratio_gregor_over_kafka", 2),
        ] {
            let m = &w[key];
            let _ = writeln!(
                s,
                "| {} | {broker} | {} | {} | {} | {} | {} | {} | {} |",
                if key == "gregor" { label.as_str() } else { "" },
                fmt_num(&m["records_per_sec"], digits),
                fmt_num(&m["mb_per_sec"], digits),
                fmt_num(&m["p50_ms"], digits),
                fmt_num(&m["p99_ms"], digits),
                fmt_num(&m["p999_ms"], digits),
                fmt_num(&m["cpu_s"], digits),
                fmt_num(&m["rss_mb"], digits),
            );
        }
    }
    let x = &report["producer_performance_cross_check"];
    if x.get("gregor").is_some() || x.get("kafka").is_some() {
        let _ = writeln!(
            s,
            "\nCross-check with Kafka's ProducerPerformance (workload (a)'s shape, Java client): \
             gregor {} records/s ({} MB/s), Kafka {} records/s ({} MB/s).",
            fmt_num(&x["gregor"]["records_per_sec"], 0),
            fmt_num(&x["gregor"]["mb_per_sec"], 1),
            fmt_num(&x["kafka"]["records_per_sec"], 0),
            fmt_num(&x["kafka"]["mb_per_sec"], 1),
        );
    }
    s
}

fn chart(report: &Value) -> Result<Vec<u8>> {
    let workloads: Vec<&Value> = report["workloads"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    let mut c = Canvas::new(1200, 520);
    let colors = [bench_png::GREGOR, bench_png::KAFKA];
    let get = |w: &Value, b: &str, m: &str| w[b][m].as_f64().unwrap_or(0.0);
    let throughput: Vec<Group> = workloads
        .iter()
        .map(|w| Group {
            label: format!("({})", w["id"].as_str().unwrap_or("")),
            values: vec![
                get(w, "gregor", "mb_per_sec"),
                get(w, "kafka", "mb_per_sec"),
            ],
        })
        .collect();
    bench_png::bar_panel(
        &mut c,
        20,
        20,
        560,
        440,
        "THROUGHPUT MB/S",
        &throughput,
        &colors,
    );
    let mut latency = Vec::new();
    // The fixed-rate workload (e) measures latency; in the unthrottled ones it is the backlog
    // of a producer that outruns its consumer (see report.md).
    for w in workloads.iter().filter(|w| w["id"] == "e") {
        let id = w["id"].as_str().unwrap_or("");
        for (m, name) in [("p50_ms", "P50"), ("p99_ms", "P99"), ("p999_ms", "P99.9")] {
            latency.push(Group {
                label: format!("({id}) {name}"),
                values: vec![get(w, "gregor", m), get(w, "kafka", m)],
            });
        }
    }
    bench_png::bar_panel(
        &mut c,
        620,
        20,
        560,
        440,
        "LATENCY MS, (E) 20 MB/S",
        &latency,
        &colors,
    );
    c.rect(20, 490, 14, 14, bench_png::GREGOR);
    c.text(40, 493, "GREGOR", 1, bench_png::BLACK);
    c.rect(110, 490, 14, 14, bench_png::KAFKA);
    c.text(130, 493, "APACHE KAFKA", 1, bench_png::BLACK);
    c.text(
        260,
        493,
        &format!(
            "MEDIANS OF {} RUN(S), {} CORES",
            report["repeat"], report["machine"]["cores"]
        ),
        1,
        bench_png::BLACK,
    );
    c.rect(600, 30, 1, 430, bench_png::GREY);
    c.png()
}
