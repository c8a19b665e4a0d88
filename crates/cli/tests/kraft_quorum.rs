//! Three combined `gregor serve` nodes (broker and controller roles, `controller.quorum.voters`
//! of all three, a CONTROLLER listener each, storage formatted with one cluster id by
//! `gregor storage format`) form one KRaft quorum. Apache Kafka 4.4.0's
//! `kafka-metadata-quorum --bootstrap-controller` shows the same leader, epoch and voters from
//! every controller (`describe --status`) and the replication state (`describe --replication`);
//! after the leader is killed (SIGKILL) the tool shows a new leader in a later epoch, and the
//! time it took is printed.
//!
//! Needs Java 17+ and the Kafka jars (`cargo xtask kafka fetch`) for the tool; without them the
//! quorum is still checked to form (every node's broker listener only opens once its metadata
//! is loaded, which needs an elected leader) and the tool part is skipped with a message.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gregor_tests::process::{free_ports, signal, tail, wait_for_broker, ChildGuard};
use gregor_tests::reference::{self, tool_command};

const BIN: &str = env!("CARGO_BIN_EXE_gregor");
const CLUSTER_ID: &str = "MkU3OEVBNTcwNTJENDM2Qg";

struct Node {
    id: i32,
    client_port: u16,
    controller_port: u16,
    log: std::path::PathBuf,
    guard: ChildGuard,
}

fn start_nodes(root: &Path) -> Vec<Node> {
    let ports = free_ports(9).expect("free ports");
    let voters: Vec<String> = (0..3)
        .map(|i| format!("{}@127.0.0.1:{}", i + 1, ports[3 + i]))
        .collect();
    let mut nodes = Vec::new();
    for i in 0..3 {
        let id = i as i32 + 1;
        let props = root.join(format!("server-{id}.properties"));
        std::fs::write(
            &props,
            format!(
                "node.id={id}\nprocess.roles=broker,controller\n\
                 listeners=PLAINTEXT://127.0.0.1:{},CONTROLLER://127.0.0.1:{}\n\
                 controller.listener.names=CONTROLLER\ncontroller.quorum.voters={}\n\
                 log.dirs={}\nadmin.listener=127.0.0.1:{}\n",
                ports[i],
                ports[3 + i],
                voters.join(","),
                root.join(format!("data-{id}")).display(),
                ports[6 + i],
            ),
        )
        .expect("writing properties");
        let out = Command::new(BIN)
            .args(["storage", "format", "-t", CLUSTER_ID, "-c"])
            .arg(&props)
            .output()
            .expect("gregor storage format");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let log = root.join(format!("gregor-{id}.log"));
        let file = std::fs::File::create(&log).expect("log file");
        let child = Command::new(BIN)
            .arg("serve")
            .arg("--config")
            .arg(&props)
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log file"))
            .stderr(file)
            .spawn()
            .expect("starting gregor serve");
        nodes.push(Node {
            id,
            client_port: ports[i],
            controller_port: ports[3 + i],
            log,
            guard: ChildGuard::new(format!("gregor-{id}"), child),
        });
    }
    nodes
}

/// `kafka-metadata-quorum --bootstrap-controller 127.0.0.1:<port> describe --<what>`: exit
/// success and stdout, or the combined output.
fn describe(controller_port: u16, what: &str) -> Result<String, String> {
    let out = tool_command(
        "kafka-metadata-quorum",
        &[
            "--bootstrap-controller".to_string(),
            format!("127.0.0.1:{controller_port}"),
            "describe".to_string(),
            format!("--{what}"),
        ],
    )
    .map_err(|e| e.to_string())?
    .stdin(Stdio::null())
    .output()
    .map_err(|e| e.to_string())?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)))
    }
}

/// The `Key: value` lines of `describe --status`.
fn status_fields(out: &str) -> BTreeMap<String, String> {
    out.lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// `describe --status` from `port` until it names a leader other than `not`, in an epoch
/// above `above_epoch`; returns (leader, epoch, fields).
fn wait_status(
    port: u16,
    not: Option<i32>,
    above_epoch: i32,
) -> (i32, i32, BTreeMap<String, String>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let last = match describe(port, "status") {
            Ok(out) => {
                let f = status_fields(&out);
                let leader = f.get("LeaderId").and_then(|v| v.parse::<i32>().ok());
                let epoch = f.get("LeaderEpoch").and_then(|v| v.parse::<i32>().ok());
                match (leader, epoch) {
                    (Some(l), Some(e)) if Some(l) != not && e > above_epoch => return (l, e, f),
                    _ => out,
                }
            }
            Err(e) => e,
        };
        assert!(
            Instant::now() < deadline,
            "no new leader seen at {port}: {last}"
        );
        // The tool is a separate JVM per call; nothing to wait on but its next answer.
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn three_combined_nodes_form_one_quorum_that_kafka_metadata_quorum_describes() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut nodes = start_nodes(root.path());
    for n in &mut nodes {
        let addr: SocketAddr = format!("127.0.0.1:{}", n.client_port)
            .parse()
            .expect("addr");
        let (guard, log) = (&mut n.guard, n.log.clone());
        wait_for_broker(addr, 60_000, || guard.check_alive())
            .unwrap_or_else(|e| panic!("node did not come up: {e:#}\n{}", tail(&log, 30)));
    }
    if !reference::jars_or_skip() {
        return;
    }
    let (leader, epoch, fields) = wait_status(nodes[0].controller_port, None, 0);
    eprintln!("{fields:#?}");
    assert_eq!(fields["ClusterId"], CLUSTER_ID);
    for n in &nodes {
        let endpoint = format!("CONTROLLER://127.0.0.1:{}", n.controller_port);
        assert!(
            fields["CurrentVoters"].contains(&format!("\"id\": {}", n.id))
                && fields["CurrentVoters"].contains(&endpoint),
            "{}",
            fields["CurrentVoters"]
        );
    }
    assert_eq!(fields["CurrentObservers"], "[]");
    // Every controller names the same leader and epoch.
    for n in &nodes[1..] {
        let (l, e, _) = wait_status(n.controller_port, None, 0);
        assert_eq!((l, e), (leader, epoch), "node {}", n.id);
    }
    let replication = describe(nodes[1].controller_port, "replication").expect("--replication");
    eprintln!("{replication}");
    let rows: Vec<Vec<&str>> = replication
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect())
        .filter(|r: &Vec<&str>| !r.is_empty())
        .collect();
    assert_eq!(rows.len(), 3, "{replication}");
    for r in &rows {
        let status = r.last().copied().unwrap_or_default();
        if r[0] == leader.to_string() {
            assert_eq!(status, "Leader", "{replication}");
        } else {
            assert_eq!(status, "Follower", "{replication}");
        }
    }

    // Kill the leader: the others elect a new one in a later epoch.
    let victim = nodes
        .iter_mut()
        .find(|n| n.id == leader)
        .expect("the leader is one of the nodes");
    signal(victim.guard.id(), "KILL").expect("kill -9");
    let killed_at = Instant::now();
    let survivor = nodes
        .iter()
        .find(|n| n.id != leader)
        .expect("a survivor")
        .controller_port;
    let (new_leader, new_epoch, _) = wait_status(survivor, Some(leader), epoch);
    println!(
        "leader {leader} (epoch {epoch}) killed; kafka-metadata-quorum saw leader {new_leader} in epoch {new_epoch} after {} ms",
        killed_at.elapsed().as_millis()
    );
    assert!(new_epoch > epoch);
    for n in &mut nodes {
        if n.id != leader {
            n.guard.check_alive().expect("survivors keep running");
        }
    }
}
