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
//! Every run has a produce phase and a consume phase, each with the broker's CPU seconds
//! sampled around it (`/proc/<pid>/stat`), reported per GB of record values: a produce
//! workload measures producing and then reads the topic back once; a consume workload fills
//! the topic and measures reading it. Each run starts from the same page-cache state
//! (`bench_cache`: `sync`, and the caches dropped when running as root), and each phase after
//! a `sync`. (j) and (k) repeat (a) and (f) over an SSL listener configured alike on both
//! brokers (`bench_tls`), (l) consumes from 1,000 partitions, (m) repeats (f) with the
//! broker's files evicted from the page cache before the consume; the report sets each of
//! them against its twin.
//!
//! Output: `target/bench/report.json`, `report.md` (a table) and `report.png` (throughput bars
//! and latency percentiles). `--quick` shrinks every size so that CI tests the harness, and
//! writes to `target/bench/quick/` instead.
//!
//! Before/after: `--baseline <PATH>` measures a second gregor binary as well (say, a build of
//! the commit before a change). Each repetition of each workload then runs both binaries, each
//! on a fresh broker with the same warm-up and the same load generator (`gregor perf` of the
//! new binary, `--binary`), back to back, the order alternating (new first, then baseline
//! first, by repetition and workload) so that drift of the machine cancels out; the report
//! adds the ratios new/baseline of the medians and lists the metrics where the new binary is
//! more than 5% worse. A full run writes to `target/bench/baseline/`, so it leaves the
//! gregor-vs-Kafka report alone. `--no-kafka` skips the reference broker (and the
//! ProducerPerformance cross-check, which needs it to mean anything).

use crate::bench_cache::{self, PageCache};
use crate::bench_client_limit;
use crate::bench_loopback;
use crate::bench_png::{self, Canvas, Group};
use crate::bench_tls::BenchTls;
use crate::difftest::Gregor;
use crate::kafka;
use crate::proc::{self, repo_root, ChildGuard};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use gregor_tests::cluster::{Cluster, ClusterConfig, ClusterOptions, Implementation};
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
    /// A second gregor binary to compare with (before/after a change): every workload also runs
    /// against it, and the report gives the ratios new/baseline. Writes to target/bench/baseline/.
    #[arg(long, value_name = "PATH")]
    pub baseline: Option<PathBuf>,
    /// Do not run the reference Apache Kafka broker.
    #[arg(long)]
    pub no_kafka: bool,
    /// Only re-render report.md and report.png from report.json (of target/bench/, or of
    /// target/bench/baseline/ with --baseline, or of target/bench/quick/ with --quick).
    #[arg(long)]
    pub render: bool,
    /// Do not drop the page cache before each run even when running as root (`sync` only).
    #[arg(long)]
    pub no_drop_caches: bool,
}

/// One broker measured: a gregor binary or the reference Kafka broker.
struct Side {
    /// Its key in report.json: "gregor" (the `--binary`), "baseline" or "kafka".
    key: &'static str,
    /// The gregor binary it serves with; `None` for Kafka.
    binary: Option<PathBuf>,
}

/// The brokers of a run: gregor, then the baseline, then Kafka, as asked for.
fn sides(binary: &Path, baseline: Option<&Path>, kafka: bool) -> Vec<Side> {
    let mut out = vec![Side {
        key: "gregor",
        binary: Some(binary.to_path_buf()),
    }];
    if let Some(b) = baseline {
        out.push(Side {
            key: "baseline",
            binary: Some(b.to_path_buf()),
        });
    }
    if kafka {
        out.push(Side {
            key: "kafka",
            binary: None,
        });
    }
    out
}

/// Indices into `sides` in the order they run for repetition `rep` of workload number `wi`:
/// gregor and its baseline swap places every other time, so that neither always goes first;
/// Kafka stays last.
fn run_order(sides: &[Side], rep: usize, wi: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..sides.len()).collect();
    if sides.iter().any(|s| s.key == "baseline") && (rep + wi) % 2 == 1 {
        order.swap(0, 1);
    }
    order
}

/// A new-binary metric this much worse than the baseline's (as a ratio) is listed.
const WORSE_THRESHOLD: f64 = 0.05;

/// More CPU for the new binary is listed only from this many seconds on.
const CPU_NOISE_S: f64 = 0.1;

#[derive(Clone)]
pub(crate) struct Produce {
    pub(crate) records: u64,
    pub(crate) record_size: usize,
    pub(crate) acks: &'static str,
    pub(crate) compression: &'static str,
    /// Records per second, -1 unthrottled.
    pub(crate) throughput: i64,
    /// Transactions of this many records each (KIP-98), committed one after the other, with
    /// the transactional id `bench-txn-<topic>`; None: no transactions.
    pub(crate) transaction_records: Option<u64>,
}

#[derive(Clone)]
struct Workload {
    id: &'static str,
    name: String,
    produce: Produce,
    /// (f), (i), (k), (l), (m): the produce phase only fills the topic; consuming it is
    /// measured. Otherwise the produce phase is measured, and the topic is then read back once
    /// (the consume phase, for its CPU seconds per GB).
    consume: bool,
    /// (i): consuming with `isolation.level=read_committed`.
    read_committed: bool,
    /// (g): a three-node cluster (`gregor_tests::cluster`, every node combined broker and
    /// controller), the topic with replication factor 3 and `min.insync.replicas=2`.
    cluster: bool,
    /// Partitions of the measured topic.
    partitions: u32,
    /// (j), (k): the load generator (warm-up included) talks to an SSL listener of the broker
    /// (`bench_tls`: the same PEM keystore on both brokers).
    tls: bool,
    /// (m): before the measured consume the broker's files are evicted from the page cache
    /// (and the caches dropped where root), so the consumer reads from the disk.
    cold: bool,
    /// librdkafka properties (`-X`) of the produce phase: (l) spreads records over its
    /// partitions (`sticky.partitioning.linger.ms=0`: each record to a random partition).
    produce_properties: &'static [(&'static str, &'static str)],
    /// The workload this one is compared with in the report's table of twins (same shape, one
    /// thing changed), and what changed.
    twin: Option<(&'static str, &'static str)>,
}

impl Workload {
    /// A produce workload on one node over PLAINTEXT, [`PARTITIONS`] partitions.
    fn produce(id: &'static str, name: impl Into<String>, produce: Produce) -> Self {
        Self {
            id,
            name: name.into(),
            produce,
            consume: false,
            read_committed: false,
            cluster: false,
            partitions: PARTITIONS,
            tls: false,
            cold: false,
            produce_properties: &[],
            twin: None,
        }
    }

    /// A consume workload: `records` records of 1000 bytes fill the topic, reading them from
    /// the start is measured.
    fn consume(id: &'static str, name: impl Into<String>, records: u64) -> Self {
        Self {
            consume: true,
            produce_properties: EVEN_FILL,
            ..Self::produce(
                id,
                name,
                Produce {
                    records,
                    record_size: 1000,
                    acks: "1",
                    compression: "none",
                    throughput: -1,
                    transaction_records: None,
                },
            )
        }
    }
}

/// librdkafka properties of a consume workload's fill: each record to a random partition
/// (`sticky.partitioning.linger.ms=0`), so the partitions end within a fraction of a percent of
/// each other. librdkafka's sticky partitioner (10 ms on one partition, then another at random)
/// left a 2 GB fill up to twice as large in one partition as in another on the broker that
/// took it in 2.5 s (about 250 stints) and within 15% on one that took 10 s; the consumer then
/// reads the largest partition's tail alone, one batch per fetch, and the two brokers were
/// compared on different data layouts.
const EVEN_FILL: &[(&str, &str)] = &[("sticky.partitioning.linger.ms", "0")];

/// Nodes of the cluster workload.
const CLUSTER_NODES: usize = 3;

const PARTITIONS: u32 = 6;

/// Partitions of the many-partition consume workload (l) (issue 15: fetch sessions matter
/// there).
const MANY_PARTITIONS: u32 = 1000;

/// Records per transaction of the transactional workloads (h) and (i), as issue 12 asks.
const TXN_RECORDS: u64 = 100;

fn workloads(quick: bool) -> Vec<Workload> {
    let s = |full: u64, small: u64| if quick { small } else { full };
    let kib = |records, acks, compression| Produce {
        records,
        record_size: 1024,
        acks,
        compression,
        throughput: -1,
        transaction_records: None,
    };
    let e_secs = s(60, 5);
    let e_rate = 20_000; // 1000-byte records: 20 MB/s
    let f_records = s(2_000_000, 50_000);
    let i_records = s(500_000, 20_000);
    let l_records = s(1_000_000, 20_000);
    vec![
        Workload::produce("a", "1 KiB, acks=1", kib(s(1_000_000, 20_000), "1", "none")),
        Workload::produce(
            "b",
            "1 KiB, acks=all",
            kib(s(1_000_000, 20_000), "all", "none"),
        ),
        Workload::produce(
            "c",
            "1 KiB, acks=1, lz4",
            kib(s(1_000_000, 20_000), "1", "lz4"),
        ),
        Workload::produce(
            "d",
            "100 B, acks=1",
            Produce {
                records: s(5_000_000, 100_000),
                record_size: 100,
                acks: "1",
                compression: "none",
                throughput: -1,
                transaction_records: None,
            },
        ),
        Workload::produce(
            "e",
            format!("20 MB/s for {e_secs} s"),
            Produce {
                records: e_rate * e_secs,
                record_size: 1000,
                acks: "1",
                compression: "none",
                throughput: i64::try_from(e_rate).unwrap_or(20_000),
                transaction_records: None,
            },
        ),
        Workload::consume("f", format!("consume {} MB", f_records / 1000), f_records),
        Workload {
            cluster: true,
            ..Workload::produce(
                "g",
                format!("1 KiB, acks=all, {CLUSTER_NODES} nodes, RF 3"),
                kib(s(500_000, 10_000), "all", "none"),
            )
        },
        Workload::produce(
            "h",
            format!("1 KiB, transactions of {TXN_RECORDS}"),
            Produce {
                transaction_records: Some(TXN_RECORDS),
                ..kib(s(300_000, 10_000), "all", "none")
            },
        ),
        Workload {
            read_committed: true,
            produce: Produce {
                records: i_records,
                record_size: 1000,
                acks: "all",
                compression: "none",
                throughput: -1,
                transaction_records: Some(TXN_RECORDS),
            },
            // Each transaction's records stay together (the sticky partitioner).
            produce_properties: &[],
            ..Workload::consume(
                "i",
                format!("consume {} MB, read_committed", i_records / 1000),
                i_records,
            )
        },
        Workload {
            tls: true,
            twin: Some(("a", "SSL vs PLAINTEXT")),
            ..Workload::produce(
                "j",
                "1 KiB, acks=1, SSL",
                kib(s(1_000_000, 20_000), "1", "none"),
            )
        },
        Workload {
            tls: true,
            twin: Some(("f", "SSL vs PLAINTEXT")),
            ..Workload::consume(
                "k",
                format!("consume {} MB, SSL", f_records / 1000),
                f_records,
            )
        },
        Workload {
            partitions: MANY_PARTITIONS,
            twin: Some(("f", "1000 vs 6 partitions")),
            produce_properties: &[("sticky.partitioning.linger.ms", "0"), ("linger.ms", "100")],
            ..Workload::consume(
                "l",
                format!(
                    "consume {} MB, {MANY_PARTITIONS} partitions",
                    l_records / 1000
                ),
                l_records,
            )
        },
        Workload {
            cold: true,
            twin: Some(("f", "cold vs page cache")),
            ..Workload::consume(
                "m",
                format!("consume {} MB, cold", f_records / 1000),
                f_records,
            )
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
    "cpu_s_per_gb",
    "produce_cpu_s_per_gb",
    "consume_cpu_s_per_gb",
    "produce_mb_per_sec",
    "consume_mb_per_sec",
];

pub fn run(args: &BenchArgs) -> Result<i32> {
    let root = repo_root();
    let binary = args
        .binary
        .clone()
        .unwrap_or_else(|| root.join("target").join("release").join("gregor"));
    let repeat = args.repeat.unwrap_or(if args.quick { 1 } else { 3 }).max(1);
    // --quick (CI) does not overwrite the report of a real run, nor a before/after comparison
    // the gregor-vs-Kafka one.
    let out_dir = if args.quick {
        root.join("target").join("bench").join("quick")
    } else if args.baseline.is_some() {
        root.join("target").join("bench").join("baseline")
    } else {
        root.join("target").join("bench")
    };
    if args.render {
        let report: Value =
            serde_json::from_str(&std::fs::read_to_string(out_dir.join("report.json"))?)?;
        return write_reports(&out_dir, &report).map(|()| 0);
    }
    if !binary.exists() {
        bail!(
            "{} is missing: run `cargo build --release -p gregor`",
            binary.display()
        );
    }
    if let Some(b) = &args.baseline {
        if !b.is_file() {
            bail!("the baseline binary {} is missing", b.display());
        }
    }
    let sides = sides(&binary, args.baseline.as_deref(), !args.no_kafka);
    let with_kafka = !args.no_kafka;
    let work = out_dir.join("work");
    std::fs::create_dir_all(&work)?;
    if with_kafka {
        kafka::fetch()?;
    }
    let clk_tck = clock_ticks();
    let selected: Vec<Workload> = workloads(args.quick)
        .into_iter()
        .filter(|w| args.only.is_empty() || args.only.iter().any(|o| o == w.id))
        .collect();
    if selected.is_empty() {
        bail!("no workload selected");
    }
    let tls = if selected.iter().any(|w| w.tls) {
        Some(BenchTls::create(&work.join("tls"))?)
    } else {
        None
    };
    let mut cache = PageCache::new(args.no_drop_caches);

    let started = Instant::now();
    // The loopback limit the consume workloads are judged against (issue 15: consume
    // throughput within 80% of it, broker CPU per GB against its floor).
    let loopback = if selected.iter().any(|w| w.consume) {
        cache.settle();
        eprintln!("==== bench: loopback limit (sendfile over one 127.0.0.1 connection)");
        let l = if args.quick {
            bench_loopback::measure(&work, 64 << 20, 1)?
        } else {
            bench_loopback::measure(&work, 1 << 30, 3)?
        };
        eprintln!(
            "loopback: {:.0} MB/s, sender {:.3} CPU s/GB, receiver {:.3} CPU s/GB",
            l.mb_per_sec, l.sender_cpu_s_per_gb, l.receiver_cpu_s_per_gb
        );
        Some(l)
    } else {
        None
    };
    // The same limit as the load generator meets it (issue 15: "measure it with the same
    // tool"): `gregor perf consume` of (f)'s records from a server that does no broker work.
    let client_limit = match selected.iter().find(|w| w.id == "f") {
        Some(f) => {
            cache.settle();
            eprintln!(
                "==== bench: the load generator's consume limit (a server with no broker work)"
            );
            let c = bench_client_limit::measure(
                &binary,
                f.produce.records,
                f.produce.record_size,
                i32::try_from(f.partitions)?,
                if args.quick { 1 } else { 3 },
            )?;
            eprintln!(
                "client limit: {:.0} MB/s ({:.0} records/s), server {:.3} CPU s/GB, load generator {:.3} CPU s/GB",
                c.mb_per_sec, c.records_per_sec, c.server_cpu_s_per_gb, c.client_cpu_s_per_gb
            );
            Some(c)
        }
        None => None,
    };
    // runs[workload][side] = one JSON object per repetition.
    let mut runs: Vec<Vec<Vec<Value>>> = vec![vec![vec![]; sides.len()]; selected.len()];
    let mut cross_check = json!({});
    let mut consumer_check = json!({});
    for rep in 0..repeat {
        for (wi, w) in selected.iter().enumerate() {
            for bi in run_order(&sides, rep, wi) {
                let side = &sides[bi];
                let broker = &side.key;
                eprintln!(
                    "==== bench rep {}/{repeat} workload ({}) {} on {broker}",
                    rep + 1,
                    w.id,
                    w.name
                );
                // Every run starts from the same page-cache state (issue 15).
                cache.settle();
                let ssl = match (&tls, w.tls) {
                    (Some(t), true) => Some((t, proc::free_port()?)),
                    _ => None,
                };
                let mut server = if w.cluster {
                    Server::start_cluster(side)?
                } else {
                    Server::start(side, &work, ssl)?
                };
                let client = match ssl {
                    Some((t, port)) => Client {
                        bootstrap: format!("127.0.0.1:{port}"),
                        properties: t.client_properties(),
                    },
                    None => Client {
                        bootstrap: server.bootstrap().to_string(),
                        properties: Vec::new(),
                    },
                };
                let result = run_workload(
                    &binary, &server, &client, w, clk_tck, args.quick, &mut cache,
                )
                .with_context(|| format!("workload ({}) on {broker}", w.id));
                let result = match result {
                    Ok(r) => r,
                    // A gregor without partition replication refuses replication factor 3:
                    // the report says so instead of failing the whole run.
                    Err(e) if w.cluster && side.binary.is_some() && refuses_replication(&e) => {
                        eprintln!("     not measured: {e:#}");
                        server.stop();
                        runs[wi][bi].push(json!({"error": format!("{e:#}")}));
                        continue;
                    }
                    Err(e) => {
                        server.stop();
                        return Err(e);
                    }
                };
                eprintln!("     {result}");
                runs[wi][bi].push(result);
                // The cross-check compares the load generator with Kafka's on both brokers.
                if with_kafka && side.key != "baseline" && rep == 0 && w.id == "a" {
                    match producer_performance(&server, w) {
                        Ok(v) => cross_check[*broker] = v,
                        Err(e) => eprintln!("warning: ProducerPerformance cross-check: {e:#}"),
                    }
                }
                // (l) again with the Java consumer, which uses KIP-227 fetch sessions.
                if with_kafka && side.key != "baseline" && rep == 0 && w.id == "l" {
                    match consumer_performance(&server, w, clk_tck) {
                        Ok(v) => consumer_check[*broker] = v,
                        Err(e) => eprintln!("warning: ConsumerPerformance cross-check: {e:#}"),
                    }
                }
                server.check_alive()?;
                server.stop();
            }
        }
    }

    let mut report_workloads = Vec::new();
    let mut worse = Vec::new();
    for (w, side_runs) in selected.iter().zip(&runs) {
        let mut med = json!({});
        let mut all_runs = json!({});
        for (side, r) in sides.iter().zip(side_runs) {
            med[side.key] = medians(r);
            if let Some(e) = r.iter().find_map(|x| x["error"].as_str()) {
                med[side.key]["error"] = json!(e);
            }
            all_runs[side.key] = json!(r);
        }
        let mut entry = json!({
            "id": w.id,
            "name": w.name,
            "records": w.produce.records,
            "record_size": w.produce.record_size,
            "partitions": w.partitions,
            "nodes": if w.cluster { CLUSTER_NODES } else { 1 },
            "listener": if w.tls { "SSL" } else { "PLAINTEXT" },
            "page_cache_before_consume": if w.cold { "evicted (cold)" } else { "warm" },
            "replication_factor": if w.cluster { 3 } else { 1 },
            "acks": w.produce.acks,
            "compression": w.produce.compression,
            "throughput_limit": w.produce.throughput,
            "measured": if w.consume { "consume" } else { "produce" },
        });
        if let Some((of, what)) = w.twin {
            entry["twin"] = json!({"of": of, "what": what});
        }
        entry["gregor"] = med["gregor"].clone();
        if args.baseline.is_some() {
            let ratio = ratios(&med["gregor"], &med["baseline"]);
            worse.extend(worse_than_baseline(
                w.id,
                &ratio,
                &med["gregor"],
                &med["baseline"],
            ));
            entry["baseline"] = med["baseline"].clone();
            entry["ratio_new_over_baseline"] = ratio;
            // Paired per repetition (the two ran back to back): their spread shows the noise.
            entry["ratio_new_over_baseline_per_repetition"] = side_runs[0]
                .iter()
                .zip(&side_runs[1])
                .map(|(n, b)| ratios(n, b))
                .collect();
        }
        if with_kafka {
            entry["kafka"] = med["kafka"].clone();
            entry["ratio_gregor_over_kafka"] = ratios(&med["gregor"], &med["kafka"]);
        }
        entry["runs"] = all_runs;
        report_workloads.push(entry);
    }
    let mut report = json!({
        "command": command_line(args),
        "quick": args.quick,
        "repeat": repeat,
        "machine": {"cores": nproc(), "note": "nothing pinned; broker and load generator share the cores"},
        "page_cache": {
            "before_each_run": cache.describe(),
            "dropped": cache.dropped(),
            "cold_read": "sync, then posix_fadvise(DONTNEED) on every file of the broker's log dirs, \
                          then the run-start treatment again",
        },
    });
    if with_kafka {
        report["kafka"] = json!({"version": kafka::KAFKA_VERSION, "jvm": "-Xmx1g -Xms256m"});
    }
    if let Some(b) = &args.baseline {
        report["baseline"] = json!({
            "binary": b.display().to_string(),
            "new_binary": binary.display().to_string(),
            "order": "new and baseline back to back on fresh brokers, alternating which goes first",
            "worse_threshold": WORSE_THRESHOLD,
            "worse_than_baseline": worse,
        });
        report["load_generator"] = json!("gregor perf (librdkafka) of the new binary, linger.ms=5");
    } else {
        report["load_generator"] = json!("gregor perf (librdkafka), linger.ms=5");
    }
    report["warmup_records"] = json!(if args.quick { 5_000 } else { WARMUP_RECORDS });
    if let Some(c) = &client_limit {
        report["client_limit"] = c.to_json();
    }
    if let Some(l) = &loopback {
        report["loopback"] = l.to_json();
    }
    report["workloads"] = json!(report_workloads);
    if with_kafka {
        report["producer_performance_cross_check"] = cross_check;
        report["consumer_performance_cross_check"] = consumer_check;
    }
    report["seconds"] = json!(started.elapsed().as_secs());
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
    if args.no_kafka {
        s.push_str(" --no-kafka");
    }
    if args.no_drop_caches {
        s.push_str(" --no-drop-caches");
    }
    if let Some(b) = &args.baseline {
        if let Some(n) = &args.binary {
            let _ = write!(s, " --binary {}", n.display());
        }
        let _ = write!(s, " --baseline {}", b.display());
    }
    s
}

/// a/b for every metric both have (b > 0).
fn ratios(a: &Value, b: &Value) -> Value {
    let mut ratio = json!({});
    for m in METRICS {
        if let (Some(x), Some(y)) = (a[*m].as_f64(), b[*m].as_f64()) {
            if y > 0.0 && x >= 0.0 {
                ratio[*m] = json!(round(x / y, 3));
            }
        }
    }
    ratio
}

/// The metrics of a new/baseline `ratio` where the new binary is worse by more than
/// [`WORSE_THRESHOLD`]: less throughput, or more latency, CPU or memory. CPU seconds count in
/// clock ticks (10 ms), so a difference under [`CPU_NOISE_S`] is not listed.
fn worse_than_baseline(id: &str, ratio: &Value, new: &Value, baseline: &Value) -> Vec<Value> {
    let mut out = Vec::new();
    for m in METRICS {
        let Some(r) = ratio[*m].as_f64() else {
            continue;
        };
        let is_worse = match *m {
            // mb_per_sec is records_per_sec times a constant.
            "mb_per_sec" | "cpu_s_per_gb" => false,
            "records_per_sec" | "produce_mb_per_sec" | "consume_mb_per_sec" => {
                r < 1.0 - WORSE_THRESHOLD
            }
            "cpu_s" | "produce_cpu_s_per_gb" | "consume_cpu_s_per_gb" => {
                let diff = new[*m].as_f64().unwrap_or(0.0) - baseline[*m].as_f64().unwrap_or(0.0);
                r > 1.0 + WORSE_THRESHOLD && diff >= CPU_NOISE_S
            }
            _ => r > 1.0 + WORSE_THRESHOLD,
        };
        if is_worse {
            out.push(json!({"workload": id, "metric": m, "ratio": r}));
        }
    }
    out
}

pub(crate) fn round(x: f64, digits: i32) -> f64 {
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
        data_dir: PathBuf,
    },
    /// A three-node cluster of gregor or Kafka (its directories go with it).
    Cluster {
        bootstrap: String,
        cluster: Box<Cluster>,
    },
}

/// Whether `e` is a broker refusing replication factor 3 (gregor before issue 11).
fn refuses_replication(e: &anyhow::Error) -> bool {
    let text = format!("{e:#}");
    text.contains("INVALID_REPLICATION_FACTOR")
        || text.contains("InvalidReplicationFactor")
        || text.contains("replication factor")
}

impl Server {
    /// A single broker with a PLAINTEXT listener and, with `ssl`, an SSL listener on that
    /// port with the bench's keystore (configured alike on gregor and Kafka).
    fn start(side: &Side, work: &Path, ssl: Option<(&BenchTls, u16)>) -> Result<Self> {
        let ports = proc::free_ports(2)?;
        if let Some(binary) = &side.binary {
            let mut sets = Vec::new();
            if let Some((tls, ssl_port)) = ssl {
                sets.push(format!(
                    "listeners=PLAINTEXT://127.0.0.1:{},SSL://127.0.0.1:{ssl_port}",
                    ports[0]
                ));
                sets.push("listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SSL:SSL".into());
                sets.extend(tls.broker_settings());
            }
            let mut g = Gregor::start_with(binary, work, ports[0], ports[1], &sets)?;
            g.wait_ready()?;
            Ok(Self::Gregor(g))
        } else {
            let data_dir = work.join(format!("kafka-data-{}", ports[0]));
            let mut instance =
                kafka::Instance::new(ports[0], Some(ports[1]), Some(data_dir.clone()))?;
            if let Some((tls, ssl_port)) = ssl {
                // Later lines of server.properties win over the generated ones.
                instance.extra_properties.extend([
                    format!(
                        "listeners=PLAINTEXT://127.0.0.1:{},CONTROLLER://127.0.0.1:{},\
                         SSL://127.0.0.1:{ssl_port}",
                        ports[0], ports[1]
                    ),
                    format!(
                        "advertised.listeners=PLAINTEXT://127.0.0.1:{},SSL://127.0.0.1:{ssl_port}",
                        ports[0]
                    ),
                    "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,\
                     SSL:SSL"
                        .to_string(),
                ]);
                instance.extra_properties.extend(tls.broker_settings());
            }
            let mut guard = ChildGuard::new("kafka", instance.spawn()?);
            instance.wait_ready(|| guard.check_alive())?;
            Ok(Self::Kafka {
                bootstrap: instance.bootstrap(),
                guard,
                data_dir,
            })
        }
    }

    /// A cluster of [`CLUSTER_NODES`] combined nodes of the side's implementation; Kafka
    /// nodes get the single broker's JVM options (`-Xmx1g -Xms256m`, full JIT).
    fn start_cluster(side: &Side) -> Result<Self> {
        let implementation = match &side.binary {
            Some(b) => Implementation::Gregor(b.clone()),
            None => Implementation::Kafka,
        };
        let config = ClusterConfig::combined(implementation, CLUSTER_NODES);
        let options = ClusterOptions::default().with_kafka_jvm_opts(&["-Xmx1g", "-Xms256m"]);
        let cluster = Cluster::start_with(&config, &options)?;
        Ok(Self::Cluster {
            bootstrap: cluster.bootstrap(),
            cluster: Box::new(cluster),
        })
    }

    fn bootstrap(&self) -> &str {
        match self {
            Self::Gregor(g) => &g.bootstrap,
            Self::Kafka { bootstrap, .. } | Self::Cluster { bootstrap, .. } => bootstrap,
        }
    }

    /// The broker's processes: one, or every node of a cluster.
    fn pids(&self) -> Vec<u32> {
        match self {
            Self::Gregor(g) => vec![g.guard.id()],
            Self::Kafka { guard, .. } => vec![guard.id()],
            Self::Cluster { cluster, .. } => {
                cluster.nodes().iter().filter_map(|n| n.pid()).collect()
            }
        }
    }

    fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster { .. })
    }

    /// The log dirs of a single broker (a cluster's are not needed: no cold workload runs
    /// on one).
    fn log_dirs(&self) -> Vec<&Path> {
        match self {
            Self::Gregor(g) => vec![g.log_dir.as_path()],
            Self::Kafka { data_dir, .. } => vec![data_dir.as_path()],
            Self::Cluster { .. } => Vec::new(),
        }
    }

    fn check_alive(&mut self) -> Result<()> {
        match self {
            Self::Gregor(g) => g.check_alive(),
            Self::Kafka { guard, .. } => guard.check_alive(),
            Self::Cluster { cluster, .. } => {
                for id in cluster.broker_ids() {
                    cluster.node_mut(id).check_alive()?;
                }
                Ok(())
            }
        }
    }

    /// Stops the broker and deletes its data (a full run writes tens of GB over its runs).
    fn stop(self) {
        let (data_dir, result) = match self {
            Self::Gregor(mut g) => (g.log_dir.clone(), g.guard.stop()),
            Self::Kafka {
                mut guard,
                data_dir,
                ..
            } => (data_dir, guard.stop()),
            Self::Cluster { mut cluster, .. } => {
                // Dropping the cluster removes its directories.
                if let Err(e) = cluster.stop_all() {
                    eprintln!("warning: stopping a cluster: {e:#}");
                }
                return;
            }
        };
        if let Err(e) = result {
            eprintln!("warning: stopping a broker: {e:#}");
        }
        if let Err(e) = std::fs::remove_dir_all(&data_dir) {
            eprintln!("warning: removing {}: {e}", data_dir.display());
        }
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

pub(crate) fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

pub(crate) fn nproc() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

pub(crate) fn gregor_client(binary: &Path, bootstrap: &str) -> Command {
    let mut c = Command::new(binary);
    c.arg("--log-format")
        .arg("text")
        .env("GREGOR_BOOTSTRAP", bootstrap)
        .env("RUST_LOG", "warn");
    c
}

/// Runs a `gregor perf ...` command and returns the JSON object on its last stdout line.
pub(crate) fn perf(cmd: &mut Command) -> Result<Value> {
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

pub(crate) fn produce_command(
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
    if let Some(n) = p.transaction_records {
        c.arg("--transactional-id")
            .arg(format!("bench-txn-{topic}"))
            .arg("--transaction-records")
            .arg(n.to_string());
    }
    if latency {
        c.arg("--latency");
    }
    c
}

/// Creates `topic` with `partitions` partitions; on a cluster with replication factor 3
/// and `min.insync.replicas=2`.
fn create_topic(
    binary: &Path,
    bootstrap: &str,
    topic: &str,
    partitions: u32,
    replicated: bool,
) -> Result<()> {
    let mut c = gregor_client(binary, bootstrap);
    c.args(["topic", "create", topic, "--partitions"])
        .arg(partitions.to_string());
    if replicated {
        c.args([
            "--replication-factor",
            "3",
            "--config",
            "min.insync.replicas=2",
        ]);
    }
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

/// Waits until every broker in `bootstrap` (comma-separated) has a leader for each of the
/// `partitions` partitions of `topic` in its Metadata: on a cluster the controller
/// acknowledges a creation before the brokers learn of it.
fn wait_for_topic(bootstrap: &str, topic: &str, partitions: u32) -> Result<()> {
    use gregor_tests::wire::{sb, KafkaConn};
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    use kafka_protocol::messages::{ApiKey, MetadataRequest, MetadataResponse, TopicName};
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    for addr in bootstrap.split(',') {
        let addr: std::net::SocketAddr = addr
            .parse()
            .with_context(|| format!("bootstrap address {addr}"))?;
        loop {
            let ready =
                KafkaConn::connect_timeout(addr, std::time::Duration::from_secs(5), "xtask-bench")
                    .and_then(|mut conn| {
                        let req = MetadataRequest::default()
                            .with_topics(Some(vec![MetadataRequestTopic::default()
                                .with_name(Some(TopicName(sb(topic))))]));
                        conn.call::<_, MetadataResponse>(ApiKey::Metadata, 12, &req)
                    })
                    .is_ok_and(|resp| {
                        resp.topics.iter().any(|t| {
                            t.error_code == 0
                                && t.partitions.len() == partitions as usize
                                && t.partitions
                                    .iter()
                                    .all(|p| p.error_code == 0 && p.leader_id.0 >= 0)
                        })
                    });
            if ready {
                break;
            }
            if Instant::now() > deadline {
                bail!("{topic} has no leader for every partition at {addr} within 60 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
    Ok(())
}

/// Records produced to a separate topic before each measured run, on both brokers alike, so
/// that Kafka's JIT compiler has warmed up (and gregor's page cache is in the same state).
const WARMUP_RECORDS: u64 = 50_000;

/// How the load generator reaches the broker: the bootstrap of the PLAINTEXT or the SSL
/// listener, and the librdkafka properties (`-X`) that go with it.
struct Client {
    bootstrap: String,
    properties: Vec<(String, String)>,
}

impl Client {
    /// Adds the client's properties, then `extra`, as `-X key=value` (later ones win).
    fn add_properties(&self, c: &mut Command, extra: &[(&str, &str)]) {
        for (k, v) in &self.properties {
            c.arg("-X").arg(format!("{k}={v}"));
        }
        for (k, v) in extra {
            c.arg("-X").arg(format!("{k}={v}"));
        }
    }

    fn produce(
        &self,
        binary: &Path,
        topic: &str,
        p: &Produce,
        latency: bool,
        extra: &[(&str, &str)],
    ) -> Command {
        let mut c = produce_command(binary, &self.bootstrap, topic, p, latency);
        self.add_properties(&mut c, extra);
        c
    }

    /// `gregor perf consume` of `records` records from the start of every partition.
    fn consume(&self, binary: &Path, topic: &str, records: u64, read_committed: bool) -> Command {
        let mut c = gregor_client(binary, &self.bootstrap);
        c.args(["perf", "consume", "--topic", topic])
            .arg("--num-records")
            .arg(records.to_string());
        if read_committed {
            c.args(["--isolation-level", "read_committed"]);
        }
        self.add_properties(&mut c, &[]);
        c
    }
}

/// CPU seconds per 10^9 bytes of record values, `None` when nothing moved.
fn per_gb(cpu_s: f64, records: &Value, record_size: usize) -> Option<f64> {
    let gb = records.as_f64()? * record_size as f64 / 1e9;
    (gb > 0.0).then(|| round(cpu_s / gb, 3))
}

/// One run of `w`: warm-up, then the produce phase and the consume phase, each with the
/// broker's CPU seconds sampled around it. A produce workload measures the produce phase (with
/// `--latency`, an end-to-end consumer reading along) and then reads the topic back once; a
/// consume workload fills the topic and measures reading it.
fn run_workload(
    binary: &Path,
    server: &Server,
    client: &Client,
    w: &Workload,
    clk_tck: f64,
    quick: bool,
    cache: &mut PageCache,
) -> Result<Value> {
    // Topics are created over the PLAINTEXT listener; the load goes through `client`.
    let admin = server.bootstrap();
    let pids = server.pids();
    let replicated = server.is_cluster();
    // A cluster's CPU and peak RSS are the sums over its nodes.
    let cpu_total = || -> Result<f64> { pids.iter().map(|p| cpu_seconds(*p, clk_tck)).sum() };
    let rss_total = || -> Result<f64> { pids.iter().map(|p| peak_rss_mb(*p)).sum() };
    let warmup = Produce {
        records: if quick { 5_000 } else { WARMUP_RECORDS },
        record_size: 1024,
        acks: "1",
        compression: w.produce.compression,
        throughput: -1,
        transaction_records: None,
    };
    create_topic(binary, admin, "bench-warmup", PARTITIONS, replicated)?;
    wait_for_topic(admin, "bench-warmup", PARTITIONS)?;
    perf(&mut client.produce(binary, "bench-warmup", &warmup, true, &[]))?;
    let topic = format!("bench-{}", w.id);
    create_topic(binary, admin, &topic, w.partitions, replicated)?;
    wait_for_topic(admin, &topic, w.partitions)?;

    // Each phase starts with nothing dirty in the page cache.
    rustix::fs::sync();
    let cpu0 = cpu_total()?;
    let produced =
        perf(&mut client.produce(binary, &topic, &w.produce, !w.consume, w.produce_properties))?;
    let produce_cpu = cpu_total()? - cpu0;
    let mut evicted_mb = None;
    if w.cold {
        let bytes = bench_cache::evict_files(&server.log_dirs())?;
        evicted_mb = Some(round(bytes as f64 / 1e6, 1));
        cache.settle();
    } else {
        rustix::fs::sync();
    }
    let cpu1 = cpu_total()?;
    let consumed = perf(&mut client.consume(binary, &topic, w.produce.records, w.read_committed))?;
    let consume_cpu = cpu_total()? - cpu1;

    let (measured, cpu) = if w.consume {
        (&consumed, consume_cpu)
    } else {
        (&produced, produce_cpu)
    };
    let size = w.produce.record_size;
    let lat = &measured["latency_ms"];
    Ok(json!({
        "records_per_sec": round(measured["records_per_sec"].as_f64().unwrap_or(0.0), 1),
        "mb_per_sec": round(measured["mb_per_sec"].as_f64().unwrap_or(0.0), 2),
        "p50_ms": lat["p50"],
        "p99_ms": lat["p99"],
        "p999_ms": lat["p999"],
        "cpu_s": round(cpu, 2),
        "rss_mb": round(rss_total()?, 1),
        "seconds": round(measured["seconds"].as_f64().unwrap_or(0.0), 2),
        "cpu_s_per_gb": per_gb(cpu, &measured["records"], size),
        "produce_cpu_s": round(produce_cpu, 2),
        "produce_cpu_s_per_gb": per_gb(produce_cpu, &produced["records"], size),
        "produce_mb_per_sec": round(produced["mb_per_sec"].as_f64().unwrap_or(0.0), 2),
        "consume_cpu_s": round(consume_cpu, 2),
        "consume_cpu_s_per_gb": per_gb(consume_cpu, &consumed["records"], size),
        "consume_mb_per_sec": round(consumed["mb_per_sec"].as_f64().unwrap_or(0.0), 2),
        "evicted_mb": evicted_mb,
    }))
}

/// Kafka's ConsumerPerformance (the Java consumer: a group, KIP-227 fetch sessions) reading
/// workload `w`'s topic, already filled, from the start; with the broker's CPU seconds around
/// it. Its summary line is "start.time, end.time, data.consumed.in.MB, MB.sec,
/// data.consumed.in.nMsg, nMsg.sec, rebalance.time.ms, fetch.time.ms, fetch.MB.sec,
/// fetch.nMsg.sec" (MB of 2^20 bytes); fetch.* leave out the group join.
fn consumer_performance(server: &Server, w: &Workload, clk_tck: f64) -> Result<Value> {
    let mut c = kafka::tool_command(
        "org.apache.kafka.tools.ConsumerPerformance",
        &[
            "--bootstrap-server".into(),
            server.bootstrap().into(),
            "--topic".into(),
            format!("bench-{}", w.id),
            "--messages".into(),
            w.produce.records.to_string(),
            "--group".into(),
            "bench-consumer-performance".into(),
            "--timeout".into(),
            "60000".into(),
            "--hide-header".into(),
        ],
    )?;
    let pids = server.pids();
    let cpu = || -> Result<f64> { pids.iter().map(|p| cpu_seconds(*p, clk_tck)).sum() };
    rustix::fs::sync();
    let cpu0 = cpu()?;
    eprintln!("$ {}", proc::display_command(&c));
    let out = c.output().context("running ConsumerPerformance")?;
    let cpu_s = cpu()? - cpu0;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "ConsumerPerformance failed ({}):\n{stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let fields: Vec<&str> = stdout
        .lines()
        .rev()
        .map(|l| l.split(',').map(str::trim).collect::<Vec<_>>())
        .find(|f| f.len() >= 10)
        .ok_or_else(|| anyhow!("no summary line from ConsumerPerformance:\n{stdout}"))?;
    let num = |i: usize| -> Option<f64> { fields.get(i)?.parse().ok() };
    let records = num(4).ok_or_else(|| anyhow!("ConsumerPerformance: no record count"))?;
    if records < w.produce.records as f64 {
        bail!(
            "ConsumerPerformance read {records} of {} records:\n{stdout}",
            w.produce.records
        );
    }
    Ok(json!({
        "records": records,
        "mb_per_sec": num(3).map(|x| round(x * 1_048_576.0 / 1e6, 2)),
        "fetch_mb_per_sec": num(8).map(|x| round(x * 1_048_576.0 / 1e6, 2)),
        "cpu_s": round(cpu_s, 2),
        "cpu_s_per_gb": per_gb(cpu_s, &json!(records), w.produce.record_size),
        "summary": stdout.lines().last().unwrap_or_default().trim(),
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

pub(crate) fn fmt_num(v: &Value, digits: usize) -> String {
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

/// The table's rows per workload, (label, key in the workload's JSON, digits), for the sides
/// the report has.
fn rows(report: &Value) -> Vec<(&'static str, &'static str, usize)> {
    let baseline = report.get("baseline").is_some();
    let kafka = report.get("kafka").is_some();
    let mut rows = Vec::new();
    if baseline {
        rows.push(("gregor (new)", "gregor", 1));
        rows.push(("gregor (baseline)", "baseline", 1));
        rows.push(("new/baseline", "ratio_new_over_baseline", 2));
    } else {
        rows.push(("gregor", "gregor", 1));
    }
    if kafka {
        rows.push(("Kafka", "kafka", 1));
        rows.push(("gregor/Kafka", "ratio_gregor_over_kafka", 2));
    }
    rows
}

fn markdown(report: &Value) -> String {
    let mut s = String::new();
    let baseline = &report["baseline"];
    if baseline.is_null() {
        let (brokers, both) = if report["kafka"].is_null() {
            ("gregor alone".to_string(), "")
        } else {
            let brokers = format!(
                "Apache Kafka {} ({}) and gregor",
                report["kafka"]["version"].as_str().unwrap_or_default(),
                report["kafka"]["jvm"].as_str().unwrap_or_default(),
            );
            (brokers, " on both")
        };
        let _ = writeln!(
            s,
            "`{}`: {brokers}, same load generator (`gregor perf`, librdkafka), \
             {} partitions (unless named), {} core(s), nothing pinned; medians of {} \
             repetition(s). \
             Latency is end to end (producer send to consumer receipt). CPU seconds are the \
             server's over the measured phase, peak RSS (VmHWM) over its life (a fresh broker per \
             run, warmed up with {} records{both}). (f), (i), (k), (l) and (m) measure consuming (i: \
             read_committed, of a topic filled in transactions); the others producing. (h) produces in \
             transactions of 100 records, each committed before the next begins; its latency \
             runs until a read_committed consumer sees the record. \
             In the unthrottled workloads (a)-(d) the latency is mostly the backlog of a producer \
             that outruns its consumer (both in the load generator); (e) measures latency.\n",
            report["command"].as_str().unwrap_or_default(),
            PARTITIONS,
            report["machine"]["cores"],
            report["repeat"],
            report["warmup_records"]
        );
    } else {
        let kafka = if report["kafka"].is_null() {
            String::new()
        } else {
            format!(
                " and Apache Kafka {} ({})",
                report["kafka"]["version"].as_str().unwrap_or_default(),
                report["kafka"]["jvm"].as_str().unwrap_or_default(),
            )
        };
        let _ = writeln!(
            s,
            "`{}`: gregor `{}` (new) against gregor `{}` (baseline){kafka}, same load generator \
             (`gregor perf` of the new binary, librdkafka), {} partitions, {} core(s), nothing \
             pinned; medians of {} repetition(s), new and baseline back to back on fresh brokers \
             in alternating order. new/baseline is the ratio of the medians: above 1 is more \
             of it for the new binary (better for records/s and MB/s, worse for latency, CPU \
             and RSS). Latency is end to end (producer send to consumer receipt). CPU seconds \
             are the server's over the measured phase, peak RSS (VmHWM) over its life (a fresh \
             broker per run, warmed up with {} records). (f), (i), (k), (l) and (m) measure \
             consuming (i: read_committed); the others producing. In the unthrottled workloads (a)-(d) the latency is mostly the backlog \
             of a producer that outruns its consumer; (e) measures latency.\n",
            report["command"].as_str().unwrap_or_default(),
            baseline["new_binary"].as_str().unwrap_or_default(),
            baseline["binary"].as_str().unwrap_or_default(),
            PARTITIONS,
            report["machine"]["cores"],
            report["repeat"],
            report["warmup_records"]
        );
    }
    let _ = writeln!(
        s,
        "CPU s/GB is the broker's CPU seconds per 10^9 bytes of record values in the measured \
         phase. (j) and (k) are (a) and (f) over an SSL listener (TLS on both brokers with the \
         same PEM keystore, ECDSA P-256; the load generator on librdkafka/OpenSSL; warm-up over \
         SSL too); (l) consumes from {MANY_PARTITIONS} partitions (filled with each record sent \
         to a random partition; librdkafka's consumer sends full fetch requests, no KIP-227 \
         fetch session); (m) is (f) read cold: after the fill, the broker's files are evicted \
         from the page cache. Page cache before each run: {}.\n",
        report["page_cache"]["before_each_run"]
            .as_str()
            .unwrap_or("not recorded")
    );
    let _ = writeln!(
        s,
        "| workload | broker | records/s | MB/s | p50 ms | p99 ms | p99.9 ms | CPU s | CPU s/GB | peak RSS MB |"
    );
    let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for w in report["workloads"].as_array().into_iter().flatten() {
        let label = format!(
            "({}) {}",
            w["id"].as_str().unwrap_or(""),
            w["name"].as_str().unwrap_or("")
        );
        for (broker, key, digits) in rows(report) {
            let m = &w[key];
            let _ = writeln!(
                s,
                "| {} | {broker} | {} | {} | {} | {} | {} | {} | {} | {} |",
                if key == "gregor" { label.as_str() } else { "" },
                fmt_num(&m["records_per_sec"], digits),
                fmt_num(&m["mb_per_sec"], digits),
                fmt_num(&m["p50_ms"], digits),
                fmt_num(&m["p99_ms"], digits),
                fmt_num(&m["p999_ms"], digits),
                fmt_num(&m["cpu_s"], digits),
                fmt_num(&m["cpu_s_per_gb"], digits.max(2)),
                fmt_num(&m["rss_mb"], digits),
            );
        }
    }
    phase_table(&mut s, report);
    twin_table(&mut s, report);
    for w in report["workloads"].as_array().into_iter().flatten() {
        if w["nodes"].as_u64().unwrap_or(1) > 1 {
            let _ = writeln!(
                s,
                "\n({}) runs on a cluster of {} combined nodes per broker (replication factor {}, \
                 min.insync.replicas=2); its CPU seconds and peak RSS are sums over the nodes.",
                w["id"].as_str().unwrap_or(""),
                w["nodes"],
                w["replication_factor"]
            );
        }
        for (broker, key, _) in rows(report) {
            if let Some(e) = w[key]["error"].as_str() {
                let _ = writeln!(
                    s,
                    "\n({}) not measured on {broker}: {}",
                    w["id"].as_str().unwrap_or(""),
                    e.lines().next().unwrap_or(e)
                );
            }
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
    let l = &report["loopback"];
    if l.get("mb_per_sec").is_some() {
        let _ = writeln!(
            s,
            "\nLoopback limit on this machine ({} MB, median of {}): one TCP connection over \
             127.0.0.1, `sendfile` of a file in the page cache to a thread that reads and \
             discards, nothing parsed: {} MB/s; the sending thread {} CPU s/GB, the receiving \
             thread {} CPU s/GB. On loopback the receiver's TCP processing mostly runs in the \
             sender's context, so the sender's figure is the floor under any broker's consume \
             CPU per GB.",
            fmt_num(&json!(l["bytes"].as_f64().unwrap_or(0.0) / 1e6), 0),
            l["repetitions"],
            fmt_num(&l["mb_per_sec"], 0),
            fmt_num(&l["sender_cpu_s_per_gb"], 3),
            fmt_num(&l["receiver_cpu_s_per_gb"], 3),
        );
    }
    let c = &report["client_limit"];
    if let Some(limit) = c["mb_per_sec"].as_f64() {
        let f = report["workloads"]
            .as_array()
            .and_then(|ws| ws.iter().find(|w| w["id"] == "f"));
        let share = |side: &str| -> Option<String> {
            let mb = f?[side]["mb_per_sec"].as_f64()?;
            Some(format!("{side} {:.0}%", 100.0 * mb / limit))
        };
        let shares: Vec<String> = ["gregor", "baseline", "kafka"]
            .into_iter()
            .filter_map(share)
            .collect();
        let _ = writeln!(
            s,
            "\nThe load generator's own limit (median of {}): the same `gregor perf consume` of \
             (f)'s {} records over {} partitions from a server that writes record batches built \
             in memory beforehand, no broker work: {} MB/s ({} records/s); that server {} CPU \
             s/GB, the load generator {} CPU s/GB.{}",
            c["repetitions"],
            fmt_num(&c["records"], 0),
            c["partitions"],
            fmt_num(&c["mb_per_sec"], 0),
            fmt_num(&c["records_per_sec"], 0),
            fmt_num(&c["server_cpu_s_per_gb"], 3),
            fmt_num(&c["client_cpu_s_per_gb"], 3),
            if shares.is_empty() {
                String::new()
            } else {
                format!(" (f) reaches {} of it.", shares.join(", "))
            },
        );
    }
    let x = &report["consumer_performance_cross_check"];
    if x.get("gregor").is_some() || x.get("kafka").is_some() {
        let _ = writeln!(
            s,
            "\nCross-check of (l) with Kafka's ConsumerPerformance (the Java consumer, which \
             uses KIP-227 fetch sessions; one run, after the measured consume, group join \
             included): gregor {} MB/s, {} broker CPU s/GB; Kafka {} MB/s, {} broker CPU s/GB.",
            fmt_num(&x["gregor"]["mb_per_sec"], 1),
            fmt_num(&x["gregor"]["cpu_s_per_gb"], 2),
            fmt_num(&x["kafka"]["mb_per_sec"], 1),
            fmt_num(&x["kafka"]["cpu_s_per_gb"], 2),
        );
    }
    if let Some(worse) = baseline["worse_than_baseline"].as_array() {
        let threshold = baseline["worse_threshold"]
            .as_f64()
            .unwrap_or(WORSE_THRESHOLD);
        let list: Vec<String> = worse
            .iter()
            .map(|x| {
                format!(
                    "({}) {} {:.2}",
                    x["workload"].as_str().unwrap_or(""),
                    metric_label(x["metric"].as_str().unwrap_or("")),
                    x["ratio"].as_f64().unwrap_or(f64::NAN)
                )
            })
            .collect();
        let _ = writeln!(
            s,
            "\nNew worse than baseline by more than {:.0}% (new/baseline of the medians): {}.",
            threshold * 100.0,
            if list.is_empty() {
                "none".to_string()
            } else {
                list.join(", ")
            }
        );
    }
    s
}

/// The second table: the broker's CPU seconds per GB in each phase of every workload.
fn phase_table(s: &mut String, report: &Value) {
    let _ = writeln!(
        s,
        "\nBroker CPU seconds per GB (10^9 bytes of record values) by phase. In (a)-(e), (g), \
         (h) and (j) the produce phase is the measured one (its end-to-end latency consumer \
         reads along) and the consume phase reads the topic back once afterwards; in the \
         consume workloads the produce phase fills the topic (no consumer) and the consume \
         phase is the measured one.\n"
    );
    let _ = writeln!(
        s,
        "| workload | broker | produce MB/s | produce CPU s/GB | consume MB/s | consume CPU s/GB |"
    );
    let _ = writeln!(s, "|---|---|---:|---:|---:|---:|");
    for w in report["workloads"].as_array().into_iter().flatten() {
        let label = format!("({})", w["id"].as_str().unwrap_or(""));
        for (broker, key, digits) in rows(report) {
            let m = &w[key];
            let _ = writeln!(
                s,
                "| {} | {broker} | {} | {} | {} | {} |",
                if key == "gregor" { label.as_str() } else { "" },
                fmt_num(&m["produce_mb_per_sec"], digits),
                fmt_num(&m["produce_cpu_s_per_gb"], 2),
                fmt_num(&m["consume_mb_per_sec"], digits),
                fmt_num(&m["consume_cpu_s_per_gb"], 2),
            );
        }
    }
}

/// The third table: each workload with a twin against it (one thing changed: SSL, a cold
/// page cache), per broker: the measured phase's MB/s and CPU seconds per GB.
fn twin_table(s: &mut String, report: &Value) {
    let workloads: Vec<&Value> = report["workloads"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    let pairs: Vec<(&Value, &Value)> = workloads
        .iter()
        .filter_map(|w| {
            let of = w["twin"]["of"].as_str()?;
            let twin = workloads.iter().find(|t| t["id"] == of)?;
            Some((*w, *twin))
        })
        .collect();
    if pairs.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "\nOne thing changed (medians of the measured phase; this/twin above 1 is more of it):\n"
    );
    let _ = writeln!(
        s,
        "| workloads | broker | twin MB/s | MB/s | this/twin | twin CPU s/GB | CPU s/GB | this/twin |"
    );
    let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|---:|");
    let sides: Vec<(&str, &str)> = rows(report)
        .into_iter()
        .filter(|(_, key, _)| !key.starts_with("ratio"))
        .map(|(broker, key, _)| (broker, key))
        .collect();
    for (w, twin) in pairs {
        let label = format!(
            "({}) vs ({}): {}",
            w["id"].as_str().unwrap_or(""),
            twin["id"].as_str().unwrap_or(""),
            w["twin"]["what"].as_str().unwrap_or("")
        );
        for (i, (broker, key)) in sides.iter().enumerate() {
            let ratio = |m: &str| match (w[*key][m].as_f64(), twin[*key][m].as_f64()) {
                (Some(a), Some(b)) if b > 0.0 => json!(round(a / b, 3)),
                _ => Value::Null,
            };
            let _ = writeln!(
                s,
                "| {} | {broker} | {} | {} | {} | {} | {} | {} |",
                if i == 0 { label.as_str() } else { "" },
                fmt_num(&twin[*key]["mb_per_sec"], 1),
                fmt_num(&w[*key]["mb_per_sec"], 1),
                fmt_num(&ratio("mb_per_sec"), 2),
                fmt_num(&twin[*key]["cpu_s_per_gb"], 2),
                fmt_num(&w[*key]["cpu_s_per_gb"], 2),
                fmt_num(&ratio("cpu_s_per_gb"), 2),
            );
        }
    }
}

/// A metric's name as in the table's header.
fn metric_label(metric: &str) -> &str {
    match metric {
        "records_per_sec" => "records/s",
        "mb_per_sec" => "MB/s",
        "p50_ms" => "p50 ms",
        "p99_ms" => "p99 ms",
        "p999_ms" => "p99.9 ms",
        "cpu_s" => "CPU s",
        "rss_mb" => "peak RSS MB",
        "cpu_s_per_gb" => "CPU s/GB",
        "produce_cpu_s_per_gb" => "produce CPU s/GB",
        "consume_cpu_s_per_gb" => "consume CPU s/GB",
        "produce_mb_per_sec" => "produce MB/s",
        "consume_mb_per_sec" => "consume MB/s",
        other => other,
    }
}

fn chart(report: &Value) -> Result<Vec<u8>> {
    let workloads: Vec<&Value> = report["workloads"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    let mut c = Canvas::new(1200, 520);
    // (key in the workload's JSON, colour, legend) for the sides the report has.
    let mut series = vec![("gregor", bench_png::GREGOR, "GREGOR")];
    if report.get("baseline").is_some() {
        series[0].2 = "GREGOR (NEW)";
        series.push(("baseline", bench_png::BASELINE, "GREGOR (BASELINE)"));
    }
    if report.get("kafka").is_some() {
        series.push(("kafka", bench_png::KAFKA, "APACHE KAFKA"));
    }
    let colors: Vec<bench_png::Rgb> = series.iter().map(|s| s.1).collect();
    let get = |w: &Value, b: &str, m: &str| w[b][m].as_f64().unwrap_or(0.0);
    let values = |w: &Value, m: &str| series.iter().map(|s| get(w, s.0, m)).collect::<Vec<_>>();
    let throughput: Vec<Group> = workloads
        .iter()
        .map(|w| Group {
            label: format!("({})", w["id"].as_str().unwrap_or("")),
            values: values(w, "mb_per_sec"),
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
                values: values(w, m),
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
    let mut x = 20;
    for (_, color, legend) in &series {
        c.rect(x, 490, 14, 14, *color);
        c.text(x + 20, 493, legend, 1, bench_png::BLACK);
        x += 20 + Canvas::text_width(legend, 1) + 34;
    }
    c.text(
        x.max(260),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn baseline_and_new_swap_places_kafka_stays_last() {
        let s = sides(Path::new("new"), Some(Path::new("old")), true);
        assert_eq!(run_order(&s, 0, 0), [0, 1, 2]);
        assert_eq!(run_order(&s, 1, 0), [1, 0, 2]);
        assert_eq!(run_order(&s, 2, 0), [0, 1, 2]);
        assert_eq!(run_order(&s, 0, 1), [1, 0, 2]);
        let s = sides(Path::new("new"), None, true);
        assert_eq!(run_order(&s, 1, 0), [0, 1]);
    }

    #[test]
    fn worse_means_less_throughput_or_more_of_the_rest() {
        let ratio = json!({
            "records_per_sec": 0.9, "mb_per_sec": 0.9, "p50_ms": 0.5, "p99_ms": 1.2,
            "cpu_s": 1.04, "rss_mb": 1.06,
        });
        let tiny = worse_than_baseline(
            "c",
            &json!({"cpu_s": 2.0}),
            &json!({"cpu_s": 0.02}),
            &json!({"cpu_s": 0.01}),
        );
        assert!(tiny.is_empty());
        let more = worse_than_baseline(
            "c",
            &json!({"cpu_s": 1.5}),
            &json!({"cpu_s": 1.5}),
            &json!({"cpu_s": 1.0}),
        );
        assert_eq!(more.len(), 1);
        let new = json!({"cpu_s": 1.04});
        let baseline = json!({"cpu_s": 1.0});
        let metrics: Vec<Value> = worse_than_baseline("a", &ratio, &new, &baseline)
            .iter()
            .map(|w| w["metric"].clone())
            .collect();
        assert_eq!(
            metrics,
            [json!("records_per_sec"), json!("p99_ms"), json!("rss_mb")]
        );
    }

    #[test]
    fn twins_and_phases_are_tabled_per_broker() {
        let f = json!({"mb_per_sec": 800.0, "cpu_s_per_gb": 0.5, "produce_mb_per_sec": 200.0,
                       "produce_cpu_s_per_gb": 1.5, "consume_mb_per_sec": 800.0,
                       "consume_cpu_s_per_gb": 0.5});
        let k = json!({"mb_per_sec": 400.0, "cpu_s_per_gb": 1.0});
        let report = json!({
            "command": "cargo xtask bench", "repeat": 1, "machine": {"cores": 2},
            "warmup_records": 5, "kafka": {"version": "4.4.0", "jvm": "-Xmx1g"},
            "page_cache": {"before_each_run": "sync only (caches not dropped: not running as root)"},
            "workloads": [
                {"id": "f", "name": "consume", "gregor": f, "kafka": f,
                 "ratio_gregor_over_kafka": ratios(&f, &f)},
                {"id": "k", "name": "consume, SSL", "twin": {"of": "f", "what": "SSL vs PLAINTEXT"},
                 "gregor": k, "kafka": {}, "ratio_gregor_over_kafka": {}},
            ],
        });
        let md = markdown(&report);
        assert!(
            md.contains(
                "Page cache before each run: sync only (caches not dropped: not running as root)."
            ),
            "{md}"
        );
        assert!(
            md.contains("| (f) | gregor | 200.0 | 1.50 | 800.0 | 0.50 |"),
            "{md}"
        );
        assert!(
            md.contains("| (k) vs (f): SSL vs PLAINTEXT | gregor | 800.0 | 400.0 | 0.50 | 0.50 | 1.00 | 2.00 |"),
            "{md}"
        );
        // A side without figures shows dashes, not a division by nothing.
        assert!(
            md.contains("|  | Kafka | 800.0 | – | – | 0.50 | – | – |"),
            "{md}"
        );
        assert!(!md.contains("| gregor/Kafka | 800.0"), "{md}");
    }

    #[test]
    fn every_new_workload_has_its_shape() {
        for quick in [false, true] {
            let ws = workloads(quick);
            let get = |id: &str| ws.iter().find(|w| w.id == id).cloned().unwrap();
            let (f, k, l, m) = (get("f"), get("k"), get("l"), get("m"));
            assert!(get("j").tls && !get("j").consume && k.tls && k.consume);
            assert_eq!(k.produce.records, f.produce.records);
            assert_eq!(m.produce.records, f.produce.records);
            assert!(m.cold && m.consume && !f.cold);
            assert_eq!(l.partitions, MANY_PARTITIONS);
            for w in &ws {
                if let Some((of, _)) = w.twin {
                    assert!(ws.iter().any(|t| t.id == of), "({}) has no twin {of}", w.id);
                }
            }
        }
    }

    #[test]
    fn markdown_has_the_rows_of_the_sides_present() {
        let m = json!({"records_per_sec": 2.0, "p50_ms": 1.0});
        let mut report = json!({
            "command": "cargo xtask bench",
            "repeat": 1,
            "machine": {"cores": 2},
            "warmup_records": 5,
            "kafka": {"version": "4.4.0", "jvm": "-Xmx1g"},
            "workloads": [{"id": "a", "name": "x", "gregor": m, "kafka": m,
                           "ratio_gregor_over_kafka": ratios(&m, &m)}],
        });
        let md = markdown(&report);
        assert!(md.contains("| (a) x | gregor | 2.0 |"), "{md}");
        assert!(md.contains("|  | gregor/Kafka | 1.00 |"), "{md}");
        assert!(!md.contains("baseline"), "{md}");
        assert!(
            md.contains("Apache Kafka 4.4.0 (-Xmx1g) and gregor, same load"),
            "{md}"
        );
        assert!(md.contains("warmed up with 5 records on both)"), "{md}");
        assert!(!md.contains("Loopback"), "{md}");
        report["loopback"] = bench_loopback::Loopback {
            bytes: 1 << 30,
            repetitions: 3,
            mb_per_sec: 1500.0,
            sender_cpu_s_per_gb: 0.26,
            receiver_cpu_s_per_gb: 0.4,
        }
        .to_json();
        let md = markdown(&report);
        assert!(
            md.contains("Loopback limit on this machine (1074 MB, median of 3)"),
            "{md}"
        );
        assert!(
            md.contains("1500 MB/s; the sending thread 0.260 CPU s/GB"),
            "{md}"
        );
        report["client_limit"] = bench_client_limit::ClientLimit {
            records: 2_000_000,
            record_size: 1000,
            partitions: 6,
            records_per_batch: 990,
            repetitions: 3,
            mb_per_sec: 1200.0,
            records_per_sec: 1_200_000.0,
            server_cpu_s_per_gb: 0.2,
            client_cpu_s_per_gb: 1.5,
        }
        .to_json();
        let md = markdown(&report);
        assert!(
            md.contains("(f)'s 2,000,000 records over 6 partitions"),
            "{md}"
        );
        assert!(md.contains("1200 MB/s (1,200,000 records/s)"), "{md}");
        report["baseline"] = json!({"binary": "old", "new_binary": "new",
                                    "worse_threshold": 0.05, "worse_than_baseline": []});
        report["workloads"][0]["baseline"] = m.clone();
        report["workloads"][0]["ratio_new_over_baseline"] = ratios(&m, &m);
        let md = markdown(&report);
        assert!(md.contains("| (a) x | gregor (new) | 2.0 |"), "{md}");
        assert!(md.contains("|  | gregor (baseline) | 2.0 |"), "{md}");
        assert!(md.contains("|  | new/baseline | 1.00 |"), "{md}");
        assert!(md.contains("|  | Kafka | 2.0 |"), "{md}");
        assert!(
            md.contains("by more than 5% (new/baseline of the medians): none."),
            "{md}"
        );
        assert!(chart(&report).is_ok());
    }
}
