//! `gregor dev cluster`: a local N-node KRaft cluster for development. Writes one
//! `server.properties` per node (combined broker and controller roles, node ids 1..N,
//! PLAINTEXT and CONTROLLER listeners on 127.0.0.1, `controller.quorum.voters` naming every
//! node), formats every node's storage with one cluster id (in-process, with
//! `gregor_broker::storage`, as `gregor storage format`), starts one `gregor serve --config
//! <file>` child per node, prints the bootstrap strings and the data dir, forwards Ctrl-C and
//! SIGTERM to every node, and exits non-zero when a node dies.
//!
//! Child processes rather than N brokers in this process: each node is then exactly what
//! `gregor serve` runs in production, with its own runtime, logs and process-global state
//! (the metrics recorder, the tracing subscriber), and a node can be killed (-9) or paused
//! (SIGSTOP) alone, which is what a local cluster is for.

use std::collections::BTreeMap;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use clap::Subcommand;
use gregor_broker::storage::{self, FormatOptions, StorageConfig};

/// How long the nodes have to listen after they are started.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the nodes have to exit after SIGTERM before they are killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// `gregor dev ...`: tools for developing against gregor.
#[derive(Subcommand)]
pub enum DevCommand {
    /// Run a local KRaft cluster of N combined (broker,controller) nodes on 127.0.0.1, one
    /// `gregor serve` process per node, until Ctrl-C or SIGTERM. Node i (1..N) has node.id
    /// i, its properties in <DIR>/node-<i>/server.properties, its data in
    /// <DIR>/node-<i>/data and its log in <DIR>/node-<i>/server.log.
    Cluster(ClusterArgs),
}

/// The arguments of `gregor dev cluster`.
#[derive(clap::Args, Debug)]
pub struct ClusterArgs {
    /// Number of nodes (voters), 1 to 9; 3 or 5 tolerate one or two failures.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=9))]
    pub nodes: u16,
    /// The cluster's directory; an existing cluster there is started again (same cluster
    /// id, data kept; the ports are picked again unless --base-port is given).
    #[arg(long, default_value = "gregor-cluster")]
    pub dir: PathBuf,
    /// First port: node i gets client (PLAINTEXT) port P+i-1, controller port P+N+i-1 and
    /// admin (HTTP) port P+2N+i-1. Without it, free ports are picked.
    #[arg(long, value_name = "P")]
    pub base_port: Option<u16>,
    /// Write the properties and format the storage, print the cluster, and exit without
    /// starting the nodes (start each with `gregor serve --config <file>`).
    #[arg(long)]
    pub no_start: bool,
}

/// The ports of one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodePorts {
    /// `node.id`.
    pub node_id: i32,
    /// PLAINTEXT listener.
    pub client: u16,
    /// CONTROLLER listener.
    pub controller: u16,
    /// `admin.listener` (HTTP `/metrics`, `/health`, `/ready`).
    pub admin: u16,
}

/// The ports of `nodes` nodes: from `base` as documented on `--base-port`, else free ports.
///
/// # Errors
/// When a port would pass 65535, or free ports cannot be found.
pub fn allocate_ports(nodes: u16, base: Option<u16>) -> Result<Vec<NodePorts>> {
    let n = usize::from(nodes);
    let ports: Vec<u16> = match base {
        Some(p) => {
            let last = u32::from(p) + 3 * u32::from(nodes) - 1;
            ensure!(
                last <= u32::from(u16::MAX),
                "--base-port {p} with {nodes} nodes needs ports up to {last}"
            );
            (0..3 * nodes).map(|i| p + i).collect()
        }
        None => {
            // Hold every listener until all are picked, so the ports differ.
            let held = (0..3 * n)
                .map(|_| TcpListener::bind("127.0.0.1:0"))
                .collect::<std::io::Result<Vec<_>>>()
                .context("finding free ports on 127.0.0.1")?;
            held.iter()
                .map(|l| Ok(l.local_addr()?.port()))
                .collect::<std::io::Result<_>>()?
        }
    };
    Ok((0..n)
        .map(|i| NodePorts {
            node_id: i32::try_from(i + 1).unwrap_or(i32::MAX),
            client: ports[i],
            controller: ports[n + i],
            admin: ports[2 * n + i],
        })
        .collect())
}

/// `controller.quorum.voters` for these nodes.
pub fn voters(nodes: &[NodePorts]) -> String {
    nodes
        .iter()
        .map(|n| format!("{}@127.0.0.1:{}", n.node_id, n.controller))
        .collect::<Vec<_>>()
        .join(",")
}

/// The directory of node `node_id`.
pub fn node_dir(dir: &Path, node_id: i32) -> PathBuf {
    dir.join(format!("node-{node_id}"))
}

/// The `server.properties` of one node, as (key, value) in file order.
pub fn node_properties(
    node: &NodePorts,
    all: &[NodePorts],
    node_dir: &Path,
) -> Vec<(String, String)> {
    // As a production cluster: three replicas (fewer nodes: one per node) and
    // min.insync.replicas 2 once there are three, so acks=all survives the loss of a node.
    let rf = all.len().clamp(1, 3);
    let min_isr = if rf >= 3 { 2 } else { 1 };
    [
        ("node.id", node.node_id.to_string()),
        ("process.roles", "broker,controller".into()),
        ("controller.quorum.voters", voters(all)),
        (
            "listeners",
            format!(
                "PLAINTEXT://127.0.0.1:{},CONTROLLER://127.0.0.1:{}",
                node.client, node.controller
            ),
        ),
        (
            "advertised.listeners",
            format!("PLAINTEXT://127.0.0.1:{}", node.client),
        ),
        (
            "listener.security.protocol.map",
            "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT".into(),
        ),
        ("controller.listener.names", "CONTROLLER".into()),
        ("inter.broker.listener.name", "PLAINTEXT".into()),
        ("log.dirs", node_dir.join("data").display().to_string()),
        ("admin.listener", format!("127.0.0.1:{}", node.admin)),
        ("offsets.topic.replication.factor", rf.to_string()),
        ("default.replication.factor", rf.to_string()),
        ("min.insync.replicas", min_isr.to_string()),
        ("transaction.state.log.replication.factor", rf.to_string()),
        ("transaction.state.log.min.isr", min_isr.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

fn properties_text(props: &[(String, String)]) -> String {
    let mut out = String::from("# Written by `gregor dev cluster`.\n");
    for (k, v) in props {
        out.push_str(k);
        out.push('=');
        out.push_str(v);
        out.push('\n');
    }
    out
}

/// A prepared cluster: properties written, storage formatted.
#[derive(Debug)]
pub struct Prepared {
    /// The cluster id.
    pub cluster_id: String,
    /// The nodes' ports.
    pub nodes: Vec<NodePorts>,
    /// The cluster's directory (absolute).
    pub dir: PathBuf,
}

impl Prepared {
    /// Every node's client endpoint, comma-separated.
    pub fn bootstrap(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.client))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Every node's controller endpoint, comma-separated (`--bootstrap-controller`).
    pub fn bootstrap_controllers(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.controller))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Writes every node's properties and formats its storage: with a new cluster id, or, when
/// `dir` holds a cluster already, with its id (formatting skips what is formatted).
///
/// # Errors
/// When a file cannot be written or formatting fails (e.g. node dirs of different clusters).
pub fn prepare(args: &ClusterArgs) -> Result<Prepared> {
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("creating {}", args.dir.display()))?;
    let dir = std::fs::canonicalize(&args.dir)
        .with_context(|| format!("resolving {}", args.dir.display()))?;
    let nodes = allocate_ports(args.nodes, args.base_port)?;
    let mut cluster_id = None;
    for n in &nodes {
        if let Some(meta) = storage::read_meta_properties(&node_dir(&dir, n.node_id).join("data"))?
        {
            cluster_id = Some(meta.cluster_id);
            break;
        }
    }
    let cluster_id = cluster_id.unwrap_or_else(storage::random_cluster_id);
    for n in &nodes {
        let nd = node_dir(&dir, n.node_id);
        std::fs::create_dir_all(&nd).with_context(|| format!("creating {}", nd.display()))?;
        let props = node_properties(n, &nodes, &nd);
        let file = nd.join("server.properties");
        std::fs::write(&file, properties_text(&props))
            .with_context(|| format!("writing {}", file.display()))?;
        let map: BTreeMap<String, String> = props.into_iter().collect();
        let cfg = StorageConfig::from_properties(&map)
            .with_context(|| format!("the properties of node {}", n.node_id))?;
        storage::format(
            &cfg,
            &FormatOptions {
                cluster_id: cluster_id.clone(),
                ignore_formatted: true,
                ..FormatOptions::default()
            },
        )
        .with_context(|| format!("formatting node {}", n.node_id))?;
    }
    Ok(Prepared {
        cluster_id,
        nodes,
        dir,
    })
}

/// One running node.
struct Running {
    node_id: i32,
    child: Child,
    log: PathBuf,
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn signal(pid: u32, sig: &str) {
    // kill(1): no unsafe libc call; a process that is already gone is not an error here.
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status();
}

fn start_nodes(p: &Prepared) -> Result<Vec<Running>> {
    for n in &p.nodes {
        for port in [n.client, n.controller, n.admin] {
            TcpListener::bind(("127.0.0.1", port)).with_context(|| {
                format!("port {port} of node {} on 127.0.0.1 is taken", n.node_id)
            })?;
        }
    }
    let exe = std::env::current_exe().context("finding the gregor binary")?;
    let mut running = Vec::new();
    for n in &p.nodes {
        let nd = node_dir(&p.dir, n.node_id);
        let log = nd.join("server.log");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("opening {}", log.display()))?;
        let mut cmd = Command::new(&exe);
        cmd.arg("serve")
            .arg("--config")
            .arg(nd.join("server.properties"))
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file);
        // Their own process group: a terminal's Ctrl-C reaches only this process, which
        // forwards SIGTERM to every node and waits for them.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let child = match cmd.spawn() {
            Ok(child) => child,
            Err(e) => {
                stop_nodes(&mut running);
                return Err(e).with_context(|| format!("starting node {}", n.node_id));
            }
        };
        running.push(Running {
            node_id: n.node_id,
            child,
            log,
        });
    }
    Ok(running)
}

/// The first node that has exited, with its status.
fn exited(running: &mut [Running]) -> Result<Option<(usize, ExitStatus)>> {
    for (i, r) in running.iter_mut().enumerate() {
        if let Some(status) = r.child.try_wait()? {
            return Ok(Some((i, status)));
        }
    }
    Ok(None)
}

/// SIGTERM to every node still running, then waits up to [`STOP_TIMEOUT`] and kills the
/// rest. Returns whether every node exited cleanly.
fn stop_nodes(running: &mut [Running]) -> bool {
    for r in running.iter_mut() {
        if matches!(r.child.try_wait(), Ok(None)) {
            signal(r.child.id(), "TERM");
        }
    }
    let deadline = Instant::now() + STOP_TIMEOUT;
    let mut clean = true;
    for r in running.iter_mut() {
        loop {
            match r.child.try_wait() {
                Ok(Some(status)) => {
                    if !status.success() {
                        eprintln!("node {} exited with {status}", r.node_id);
                        clean = false;
                    }
                    break;
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                _ => {
                    eprintln!(
                        "node {} did not stop within {STOP_TIMEOUT:?}; killing it",
                        r.node_id
                    );
                    let _ = r.child.kill();
                    let _ = r.child.wait();
                    clean = false;
                    break;
                }
            }
        }
    }
    clean
}

fn print_cluster(p: &Prepared, out: &mut impl std::io::Write) -> std::io::Result<()> {
    writeln!(out, "cluster id:             {}", p.cluster_id)?;
    writeln!(out, "bootstrap servers:      {}", p.bootstrap())?;
    writeln!(out, "bootstrap controllers:  {}", p.bootstrap_controllers())?;
    writeln!(out, "data dir:               {}", p.dir.display())?;
    for n in &p.nodes {
        writeln!(
            out,
            "node {}: client 127.0.0.1:{}, controller 127.0.0.1:{}, admin http://127.0.0.1:{}, log {}",
            n.node_id,
            n.client,
            n.controller,
            n.admin,
            node_dir(&p.dir, n.node_id).join("server.log").display()
        )?;
    }
    out.flush()
}

/// Runs a `gregor dev` command to its end; the process exit code (0: stopped cleanly on
/// Ctrl-C or SIGTERM; 1: a node died or did not stop cleanly).
///
/// # Errors
/// When the cluster cannot be prepared or started.
pub async fn run(cmd: DevCommand) -> Result<i32> {
    let DevCommand::Cluster(args) = cmd;
    let prepared = prepare(&args)?;
    if args.no_start {
        print_cluster(&prepared, &mut std::io::stdout())?;
        return Ok(0);
    }
    // Before any node runs, so that no error path leaves nodes behind.
    use tokio::signal::unix::{signal as on, SignalKind};
    let mut term = on(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = on(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut running = start_nodes(&prepared)?;
    // Until every node listens; a node that exits first ends the command.
    let deadline = Instant::now() + START_TIMEOUT;
    let mut waiting: Vec<NodePorts> = prepared.nodes.clone();
    while !waiting.is_empty() {
        let dead = match exited(&mut running) {
            Ok(dead) => dead,
            Err(e) => {
                stop_nodes(&mut running);
                return Err(e);
            }
        };
        if let Some((i, status)) = dead {
            let r = &running[i];
            let msg = format!(
                "node {} exited with {status} while starting; last lines of {}:\n{}",
                r.node_id,
                r.log.display(),
                tail(&r.log, 30)
            );
            stop_nodes(&mut running);
            bail!(msg);
        }
        waiting.retain(|n| TcpStream::connect(("127.0.0.1", n.client)).is_err());
        if Instant::now() > deadline {
            stop_nodes(&mut running);
            bail!(
                "nodes {:?} did not listen within {START_TIMEOUT:?}; see their server.log",
                waiting.iter().map(|n| n.node_id).collect::<Vec<_>>()
            );
        }
        tokio::select! {
            _ = term.recv() => return Ok(if stop_nodes(&mut running) { 0 } else { 1 }),
            _ = int.recv() => return Ok(if stop_nodes(&mut running) { 0 } else { 1 }),
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
    // The nodes run from here on: nothing may return before they are stopped.
    if let Err(e) = print_cluster(&prepared, &mut std::io::stdout()) {
        eprintln!("warning: printing the cluster: {e}");
    }
    {
        use std::io::Write as _;
        let mut out = std::io::stdout();
        let _ = writeln!(out, "running; Ctrl-C or SIGTERM stops every node");
        let _ = out.flush();
    }

    let mut poll = tokio::time::interval(Duration::from_millis(200));
    let died = loop {
        tokio::select! {
            _ = term.recv() => break None,
            _ = int.recv() => break None,
            _ = poll.tick() => {
                match exited(&mut running) {
                    Ok(Some(dead)) => break Some(dead),
                    Ok(None) => {}
                    Err(e) => {
                        eprintln!("checking the nodes: {e:#}; stopping them");
                        stop_nodes(&mut running);
                        return Ok(1);
                    }
                }
            }
        }
    };
    match died {
        None => {
            eprintln!("stopping {} nodes", running.len());
            Ok(if stop_nodes(&mut running) { 0 } else { 1 })
        }
        Some((i, status)) => {
            let (node_id, log) = (running[i].node_id, running[i].log.clone());
            eprintln!(
                "node {node_id} exited with {status}; last lines of {}:\n{}\nstopping the others",
                log.display(),
                tail(&log, 30)
            );
            // The dead node is reported above; stop_nodes reports the others only.
            running.remove(i);
            stop_nodes(&mut running);
            Ok(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_from_a_base_and_free_ports() {
        let p = allocate_ports(3, Some(20000)).unwrap();
        assert_eq!(
            p[1],
            NodePorts {
                node_id: 2,
                client: 20001,
                controller: 20004,
                admin: 20007
            }
        );
        assert!(allocate_ports(3, Some(65530)).is_err());
        let p = allocate_ports(5, None).unwrap();
        let all: std::collections::BTreeSet<u16> = p
            .iter()
            .flat_map(|n| [n.client, n.controller, n.admin])
            .collect();
        assert_eq!(all.len(), 15);
        assert_eq!(
            voters(&p[..2]),
            format!(
                "1@127.0.0.1:{},2@127.0.0.1:{}",
                p[0].controller, p[1].controller
            )
        );
    }

    #[test]
    fn properties_are_a_valid_combined_voter() {
        let p = allocate_ports(3, Some(30000)).unwrap();
        let props: BTreeMap<String, String> = node_properties(&p[2], &p, Path::new("/d/node-3"))
            .into_iter()
            .collect();
        assert_eq!(
            props["listeners"],
            "PLAINTEXT://127.0.0.1:30002,CONTROLLER://127.0.0.1:30005"
        );
        assert_eq!(props["log.dirs"], "/d/node-3/data");
        let cfg = StorageConfig::from_properties(&props).unwrap();
        assert_eq!(cfg.node_id, 3);
        assert!(cfg.broker && cfg.controller);
        assert_eq!(cfg.static_voters, [1, 2, 3]);
    }
}
