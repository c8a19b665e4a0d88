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
//!
//! `kafka-metadata-quorum --bootstrap-server <broker>` works through every broker too (Kafka's
//! brokers forward DescribeQuorum to the active controller): on three combined nodes plus a
//! broker-only one, each broker shows the leader, epoch, voters and observers (the broker-only
//! node) that `--bootstrap-controller` shows, `--replication` the same replicas and states,
//! and after a kill -9 of the active controller the broker-only node shows the new leader. The
//! same test on three Apache Kafka 4.4.0 nodes plus a Kafka broker runs with `-- --ignored`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gregor_tests::cluster::{Cluster, ClusterConfig, Implementation, Layout};
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
    quorum_tool(
        "--bootstrap-controller",
        &format!("127.0.0.1:{controller_port}"),
        what,
    )
}

/// `kafka-metadata-quorum <flag> <servers> describe --<what>` (`flag`: `--bootstrap-server`
/// or `--bootstrap-controller`): exit success and stdout, or the combined output.
///
/// The tool's admin client asks its bootstrap controller once (DescribeCluster) which
/// controller is active and sends every later call there until its metadata expires (five
/// minutes). Asked within the fetch timeout after the leader died, a survivor still names the
/// dead leader (Kafka's controllers answer the same way: `ControllerApis.handleDescribeCluster`
/// gives the Raft leader it knows), and during the election it names none; either way that one
/// call waits out `default.api.timeout.ms`. The config below makes such a call give up after
/// 10 s instead of 60, so the caller's next try starts with fresh metadata.
fn quorum_tool(flag: &str, servers: &str, what: &str) -> Result<String, String> {
    let admin = tempfile::NamedTempFile::new().map_err(|e| e.to_string())?;
    std::fs::write(
        admin.path(),
        "default.api.timeout.ms=10000\nrequest.timeout.ms=5000\n",
    )
    .map_err(|e| e.to_string())?;
    let out = tool_command(
        "kafka-metadata-quorum",
        &[
            "--command-config".to_string(),
            admin.path().display().to_string(),
            flag.to_string(),
            servers.to_string(),
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

/// `describe --status` through the broker at `broker` and through `controllers` (before and
/// after it), until both name the same leader in the same epoch with the same cluster id,
/// voters and observers, and the broker's high watermark lies between the two controller
/// answers'; returns the broker's fields. Panics after 90 s with the last answers.
fn same_status_through(
    cluster: &Cluster,
    controllers: &str,
    broker: &str,
) -> BTreeMap<String, String> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let answers = (
            quorum_tool("--bootstrap-controller", controllers, "status"),
            quorum_tool("--bootstrap-server", broker, "status"),
            quorum_tool("--bootstrap-controller", controllers, "status"),
        );
        let last = match answers {
            (Ok(before), Ok(through), Ok(after)) => {
                let (b, t, a) = (
                    status_fields(&before),
                    status_fields(&through),
                    status_fields(&after),
                );
                let same =
                    |k: &str| b.contains_key(k) && b.get(k) == t.get(k) && t.get(k) == a.get(k);
                let hw = |f: &BTreeMap<String, String>| {
                    f.get("HighWatermark").and_then(|v| v.parse::<i64>().ok())
                };
                let keys = [
                    "ClusterId",
                    "LeaderId",
                    "LeaderEpoch",
                    "CurrentVoters",
                    "CurrentObservers",
                ];
                if keys.iter().all(|k| same(k))
                    && hw(&b).is_some_and(|x| hw(&t).is_some_and(|y| x <= y))
                    && hw(&t).is_some_and(|y| hw(&a).is_some_and(|z| y <= z))
                {
                    return t;
                }
                format!("through the controllers:\n{before}\nthrough {broker}:\n{through}\nthrough the controllers again:\n{after}")
            }
            (before, through, after) => {
                format!("{before:?}\nthrough {broker}: {through:?}\n{after:?}")
            }
        };
        assert!(
            Instant::now() < deadline,
            "kafka-metadata-quorum --bootstrap-server {broker} never agreed with --bootstrap-controller {controllers}:\n{last}\n{}",
            cluster.logs(40)
        );
        // The tool is a separate JVM per call; nothing to wait on but its next answers.
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The (NodeId, DirectoryId, Status) rows of `describe --replication`, sorted.
fn replication_rows(out: &str) -> Vec<(String, String, String)> {
    let mut rows: Vec<_> = out
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|r| r.len() >= 3)
        .map(|r| {
            (
                r[0].to_string(),
                r[1].to_string(),
                r[r.len() - 1].to_string(),
            )
        })
        .collect();
    rows.sort();
    rows
}

/// The same replicas and states through `broker` as through `controllers` (`describe
/// --replication`); returns the rows. Panics after 90 s with the last answers.
fn same_replication_through(
    cluster: &Cluster,
    controllers: &str,
    broker: &str,
) -> Vec<(String, String, String)> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let c = quorum_tool("--bootstrap-controller", controllers, "replication");
        let b = quorum_tool("--bootstrap-server", broker, "replication");
        let last = match (&c, &b) {
            (Ok(c), Ok(b))
                if replication_rows(c) == replication_rows(b)
                    && !replication_rows(b).is_empty() =>
            {
                return replication_rows(b)
            }
            _ => format!("through the controllers: {c:?}\nthrough {broker}: {b:?}"),
        };
        assert!(
            Instant::now() < deadline,
            "describe --replication differs:\n{last}\n{}",
            cluster.logs(40)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Three combined nodes and a broker-only node of `implementation`: `kafka-metadata-quorum
/// --bootstrap-server` through each broker shows what `--bootstrap-controller` shows, also
/// after the active controller was killed.
fn metadata_quorum_through_brokers(implementation: Implementation) {
    if !reference::jars_or_skip() {
        return;
    }
    let config = ClusterConfig::new(
        implementation,
        Layout::CombinedAndBrokers {
            combined: 3,
            brokers: 1,
        },
    );
    let mut cluster = Cluster::start(&config).unwrap_or_else(|e| panic!("{e:#}"));
    let controllers = cluster.bootstrap_controllers();
    let brokers: Vec<(i32, String)> = cluster
        .nodes()
        .iter()
        .filter_map(|n| n.bootstrap().map(|b| (n.node_id, b)))
        .collect();
    assert_eq!(brokers.len(), 4);
    // DescribeQuorum sent to each broker's own listener (the tool below picks any broker it
    // learnt from Metadata): what the controller listeners say.
    for (id, _) in &brokers {
        let (through, direct) = cluster.wait_for(
            Duration::from_secs(30),
            &format!("DescribeQuorum through broker {id} to agree with the controllers"),
            || {
                let direct = cluster
                    .describe_quorum_at_node(1)
                    .or_else(|| (2..=3).find_map(|n| cluster.describe_quorum_at_node(n)))?;
                let through = cluster.describe_quorum_through_broker(*id)?;
                let same = (through.leader_id, through.leader_epoch, &through.voters)
                    == (direct.leader_id, direct.leader_epoch, &direct.voters)
                    && through.observers == direct.observers;
                same.then_some((through, direct))
            },
        );
        assert_eq!(through.voters, [1, 2, 3], "{through:?} {direct:?}");
        assert_eq!(through.observers, [4], "{through:?} {direct:?}");
    }
    for (id, bootstrap) in &brokers {
        let f = same_status_through(&cluster, &controllers, bootstrap);
        eprintln!("through broker {id}: {f:#?}");
        let voters = &f["CurrentVoters"];
        for v in 1..=3 {
            assert!(voters.contains(&format!("\"id\": {v}")), "{voters}");
        }
        let observers = &f["CurrentObservers"];
        assert!(observers.contains("\"id\": 4"), "{observers}");
        assert!(!voters.contains("\"id\": 4"), "{voters}");
    }
    // --replication through the broker-only node and a combined one.
    for (id, bootstrap) in [&brokers[3], &brokers[0]] {
        let rows = same_replication_through(&cluster, &controllers, bootstrap);
        eprintln!("--replication through broker {id}: {rows:?}");
        let status = |node: &str| {
            rows.iter()
                .find(|r| r.0 == node)
                .map(|r| r.2.clone())
                .unwrap_or_default()
        };
        assert_eq!(status("4"), "Observer", "{rows:?}");
        assert_eq!(
            ["1", "2", "3"]
                .iter()
                .filter(|n| status(n) == "Leader")
                .count(),
            1,
            "{rows:?}"
        );
    }

    // Kill -9 the active controller: the broker-only node forwards to the new one.
    let leader = cluster
        .active_controller()
        .unwrap_or_else(|e| panic!("{e:#}"));
    let epoch = cluster
        .describe_quorum()
        .ok()
        .flatten()
        .map_or(0, |s| s.leader_epoch);
    cluster
        .node_mut(leader)
        .kill9()
        .unwrap_or_else(|e| panic!("{e:#}"));
    let killed_at = Instant::now();
    let survivors = cluster
        .nodes()
        .iter()
        .filter(|n| n.node_id != leader)
        .filter_map(|n| n.controller_endpoint())
        .collect::<Vec<_>>()
        .join(",");
    // Until the survivors elect a new leader they name the dead one, and the tool with
    // --bootstrap-controller then waits out its own 60 s timeout on it (Kafka's too).
    let elected = cluster
        .wait_for_quorum(Duration::from_secs(60), |s| {
            s.leader_id >= 0 && s.leader_id != leader && s.leader_epoch > epoch
        })
        .unwrap_or_else(|e| panic!("{e:#}\n{}", cluster.logs(40)));
    let elected_ms = killed_at.elapsed().as_millis();
    let through = &brokers[3].1;
    let deadline = Instant::now() + Duration::from_secs(90);
    let (new_leader, new_epoch) = loop {
        let f = same_status_through(&cluster, &survivors, through);
        let l = f.get("LeaderId").and_then(|v| v.parse::<i32>().ok());
        let e = f.get("LeaderEpoch").and_then(|v| v.parse::<i32>().ok());
        if let (Some(l), Some(e)) = (l, e) {
            if l != leader && l >= 0 && e > epoch {
                break (l, e);
            }
        }
        assert!(
            Instant::now() < deadline,
            "no new leader through {through}: {f:#?}"
        );
    };
    println!(
        "{}: leader {leader} (epoch {epoch}) killed; leader {} (epoch {}) elected after {elected_ms} ms; kafka-metadata-quorum --bootstrap-server {through} showed leader {new_leader} in epoch {new_epoch} after {} ms",
        config.implementation.name(),
        elected.leader_id,
        elected.leader_epoch,
        killed_at.elapsed().as_millis()
    );
}

#[test]
fn kafka_metadata_quorum_through_each_broker_shows_what_the_controllers_show() {
    metadata_quorum_through_brokers(Implementation::Gregor(BIN.into()));
}

/// The same on Apache Kafka 4.4.0 (four JVMs; `-- --ignored`).
#[test]
#[ignore = "reference run on Apache Kafka: cargo test -p gregor --test kraft_quorum -- --ignored"]
fn kafka_metadata_quorum_through_each_broker_on_kafka() {
    metadata_quorum_through_brokers(Implementation::Kafka);
}
