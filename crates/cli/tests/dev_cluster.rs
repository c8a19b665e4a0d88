//! `gregor dev cluster`: the properties it writes, the storage it formats (one cluster id,
//! kept when the cluster is started again), its ports, its help, stopping every node on
//! SIGTERM and exiting non-zero when a node dies. That the nodes form one KRaft cluster is
//! tested by the ignored test at the end, enabled when gregor is a KRaft cluster.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gregor_tests::process::{pid_alive, signal, ChildGuard};

const BIN: &str = env!("CARGO_BIN_EXE_gregor");

fn properties(path: &Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn run(args: &[&str]) -> (bool, String) {
    let out = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running gregor");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// The value printed after `label` in the command's output.
fn printed<'a>(out: &'a str, label: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.strip_prefix(label))
        .unwrap_or_else(|| panic!("no {label:?} in:\n{out}"))
        .trim()
}

#[test]
fn help_names_the_options() {
    let (ok, out) = run(&["dev", "cluster", "--help"]);
    assert!(ok, "{out}");
    for flag in ["--nodes", "--dir", "--base-port", "--no-start"] {
        assert!(out.contains(flag), "{flag} in:\n{out}");
    }
    let (ok, out) = run(&["dev", "--help"]);
    assert!(ok && out.contains("cluster"), "{out}");
    let (ok, out) = run(&["dev", "cluster", "--nodes", "0", "--no-start"]);
    assert!(!ok, "zero nodes refused: {out}");
}

#[test]
fn writes_properties_and_formats_every_node_with_one_cluster_id() {
    let dir = tempfile::tempdir().unwrap();
    let cdir = dir.path().join("c");
    let base = gregor_tests::free_port().unwrap();
    let base_s = base.to_string();
    let args = [
        "dev",
        "cluster",
        "--nodes",
        "3",
        "--dir",
        cdir.to_str().unwrap(),
        "--base-port",
        &base_s,
        "--no-start",
    ];
    let (ok, out) = run(&args);
    assert!(ok, "{out}");
    let cluster_id = printed(&out, "cluster id:").to_string();
    assert_eq!(
        printed(&out, "bootstrap servers:"),
        format!(
            "127.0.0.1:{base},127.0.0.1:{},127.0.0.1:{}",
            base + 1,
            base + 2
        )
    );
    assert_eq!(
        printed(&out, "bootstrap controllers:"),
        format!(
            "127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}",
            base + 3,
            base + 4,
            base + 5
        )
    );
    let voters = format!(
        "1@127.0.0.1:{},2@127.0.0.1:{},3@127.0.0.1:{}",
        base + 3,
        base + 4,
        base + 5
    );
    for id in 1..=3u16 {
        let node = cdir.join(format!("node-{id}"));
        let p = properties(&node.join("server.properties"));
        assert_eq!(p["node.id"], id.to_string());
        assert_eq!(p["process.roles"], "broker,controller");
        assert_eq!(p["controller.quorum.voters"], voters);
        assert_eq!(
            p["listeners"],
            format!(
                "PLAINTEXT://127.0.0.1:{},CONTROLLER://127.0.0.1:{}",
                base + id - 1,
                base + 3 + id - 1
            )
        );
        assert_eq!(p["controller.listener.names"], "CONTROLLER");
        assert_eq!(
            p["admin.listener"],
            format!("127.0.0.1:{}", base + 6 + id - 1)
        );
        let meta = properties(&node.join("data").join("meta.properties"));
        assert_eq!(meta["cluster.id"], cluster_id);
        assert_eq!(meta["node.id"], id.to_string());
        assert!(
            node.join("data")
                .join("__cluster_metadata-0/00000000000000000000-0000000000.checkpoint")
                .exists(),
            "the bootstrap snapshot of a controller"
        );
    }
    // Again on the same directory: the same cluster, nothing reformatted.
    let (ok, again) = run(&args);
    assert!(ok, "{again}");
    assert_eq!(printed(&again, "cluster id:"), cluster_id);
    // A fresh directory gets another cluster id.
    let other = dir.path().join("other");
    let (ok, out) = run(&[
        "dev",
        "cluster",
        "--nodes",
        "1",
        "--dir",
        other.to_str().unwrap(),
        "--no-start",
    ]);
    assert!(ok, "{out}");
    assert_ne!(printed(&out, "cluster id:"), cluster_id);
}

#[test]
fn a_taken_port_is_refused_before_anything_starts() {
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port().to_string();
    let dir = tempfile::tempdir().unwrap();
    let (ok, out) = run(&[
        "dev",
        "cluster",
        "--nodes",
        "1",
        "--dir",
        dir.path().to_str().unwrap(),
        "--base-port",
        &port,
    ]);
    assert!(!ok, "{out}");
    assert!(out.contains(&format!("port {port} of node 1")), "{out}");
}

/// A running `gregor dev cluster`, its printed output, and its nodes' pids.
struct DevCluster {
    guard: ChildGuard,
    out: String,
    node_pids: Vec<u32>,
    _dir: tempfile::TempDir,
}

fn start_dev_cluster(nodes: u16) -> DevCluster {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(BIN)
        .args(["dev", "cluster", "--nodes", &nodes.to_string(), "--dir"])
        .arg(dir.path().join("c"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let guard = ChildGuard::new("gregor dev cluster", child);
    // Read until the "running" line (the nodes listen), in a thread so a hang is bounded.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut out = String::new();
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            out.push_str(&line);
            out.push('\n');
            if line.starts_with("running;") {
                break;
            }
        }
        let _ = tx.send(out);
    });
    let out = rx
        .recv_timeout(Duration::from_secs(90))
        .expect("gregor dev cluster did not report its nodes running within 90 s");
    assert!(out.contains("running;"), "{out}");
    let node_pids: Vec<u32> =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children", pid = guard.id()))
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
    assert_eq!(node_pids.len(), usize::from(nodes), "one child per node");
    DevCluster {
        guard,
        out,
        node_pids,
        _dir: dir,
    }
}

fn wait_exit(guard: &mut ChildGuard, timeout: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + timeout;
    while pid_alive(guard.id()) {
        assert!(Instant::now() < deadline, "gregor dev cluster did not exit");
        std::thread::sleep(Duration::from_millis(50));
    }
    guard.stop().unwrap().expect("an exit status")
}

#[test]
fn sigterm_stops_every_node_and_exits_zero() {
    let mut c = start_dev_cluster(3);
    for pid in &c.node_pids {
        assert!(pid_alive(*pid));
    }
    signal(c.guard.id(), "TERM").unwrap();
    let status = wait_exit(&mut c.guard, Duration::from_secs(40));
    assert!(status.success(), "{status}; output:\n{}", c.out);
    for pid in &c.node_pids {
        assert!(
            !pid_alive(*pid),
            "node pid {pid} outlived gregor dev cluster"
        );
    }
}

#[test]
fn a_node_that_dies_ends_the_cluster_with_a_failure() {
    let mut c = start_dev_cluster(3);
    signal(c.node_pids[1], "KILL").unwrap();
    let status = wait_exit(&mut c.guard, Duration::from_secs(40));
    assert_eq!(status.code(), Some(1), "{status}");
    for pid in &c.node_pids {
        assert!(
            !pid_alive(*pid),
            "node pid {pid} outlived gregor dev cluster"
        );
    }
}

#[test]
fn the_nodes_form_one_cluster() {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let mut c = start_dev_cluster(3);
    let bootstrap = printed(&c.out, "bootstrap servers:").to_string();
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let brokers = consumer
            .fetch_metadata(None, Duration::from_secs(5))
            .map(|m| m.brokers().len())
            .unwrap_or(0);
        if brokers == 3 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{brokers} brokers in Metadata, not 3"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // One replica per partition, given explicitly (the dev cluster's default is 3).
    let rt = gregor_tests::clients::runtime().unwrap();
    let topic =
        rdkafka::admin::NewTopic::new("spread", 3, rdkafka::admin::TopicReplication::Fixed(1));
    let results = rt
        .block_on(
            gregor_tests::clients::admin(&bootstrap)
                .unwrap()
                .create_topics(&[topic], &rdkafka::admin::AdminOptions::new()),
        )
        .unwrap();
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    // Its partitions are led by all three brokers.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let leaders: std::collections::BTreeSet<i32> = consumer
            .fetch_metadata(Some("spread"), Duration::from_secs(5))
            .map(|m| {
                m.topics()
                    .iter()
                    .flat_map(|t| t.partitions().iter().map(|p| p.leader()))
                    .collect()
            })
            .unwrap_or_default();
        if leaders.len() == 3 && !leaders.contains(&-1) {
            break;
        }
        assert!(Instant::now() < deadline, "leaders {leaders:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    signal(c.guard.id(), "TERM").unwrap();
    assert!(wait_exit(&mut c.guard, Duration::from_secs(40)).success());
}
