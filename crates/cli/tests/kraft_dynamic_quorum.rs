//! `controller.quorum.bootstrap.servers` (KIP-853's configuration, Kafka 4.x's default
//! `server.properties`) instead of `controller.quorum.voters`: the voters are those of the
//! bootstrap snapshot `storage format --standalone` or `--initial-controllers` wrote.
//! - three nodes formatted with `--initial-controllers` form one quorum of three voters;
//! - a node formatted without a voter set refuses to start, naming the key and what to do
//!   (it would otherwise elect itself alone: three such nodes would be three clusters).
//!
//! `kafka-metadata-quorum` (Apache Kafka 4.4.0) checks the voters when its jars are present.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gregor_tests::process::{free_ports, wait_for_broker, ChildGuard};
use gregor_tests::reference::{self, tool_command};

const BIN: &str = env!("CARGO_BIN_EXE_gregor");
const CLUSTER_ID: &str = "Dyn4mic-QuorumTestAAAw";

fn write_props(
    root: &Path,
    id: i32,
    client: u16,
    controller: u16,
    admin: u16,
    bootstrap: &str,
) -> PathBuf {
    let props = root.join(format!("server-{id}.properties"));
    std::fs::write(
        &props,
        format!(
            "node.id={id}\nprocess.roles=broker,controller\n\
             listeners=PLAINTEXT://127.0.0.1:{client},CONTROLLER://127.0.0.1:{controller}\n\
             controller.listener.names=CONTROLLER\n\
             controller.quorum.bootstrap.servers={bootstrap}\n\
             log.dirs={}\nadmin.listener=127.0.0.1:{admin}\n",
            root.join(format!("data-{id}")).display(),
        ),
    )
    .expect("writing properties");
    props
}

fn gregor(args: &[&str], props: &Path) -> std::process::Output {
    Command::new(BIN)
        .args(args)
        .arg(props)
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null())
        .output()
        .expect("running gregor")
}

fn random_uuid() -> String {
    let out = Command::new(BIN)
        .args(["storage", "random-uuid"])
        .output()
        .expect("gregor storage random-uuid");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn initial_controllers_form_one_quorum_of_three() {
    let root = tempfile::tempdir().expect("a temp dir");
    let ports = free_ports(9).expect("free ports");
    let bootstrap: Vec<String> = (0..3)
        .map(|i| format!("127.0.0.1:{}", ports[3 + i]))
        .collect();
    let initial: Vec<String> = (0..3)
        .map(|i| format!("{}@127.0.0.1:{}:{}", i + 1, ports[3 + i], random_uuid()))
        .collect();
    let mut guards = Vec::new();
    for i in 0..3 {
        let id = i as i32 + 1;
        let props = write_props(
            root.path(),
            id,
            ports[i],
            ports[3 + i],
            ports[6 + i],
            &bootstrap.join(","),
        );
        let out = gregor(
            &[
                "storage",
                "format",
                "-t",
                CLUSTER_ID,
                "--initial-controllers",
                &initial.join(","),
                "-c",
            ],
            &props,
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let log = std::fs::File::create(root.path().join(format!("gregor-{id}.log"))).expect("log");
        let child = Command::new(BIN)
            .arg("serve")
            .arg("--config")
            .arg(&props)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("gregor serve");
        guards.push(ChildGuard::new(format!("gregor-{id}"), child));
    }
    // Each broker listener opens once its node has loaded the metadata, which needs a leader
    // elected by a majority of the three voters.
    for (i, guard) in guards.iter_mut().enumerate() {
        let addr: SocketAddr = format!("127.0.0.1:{}", ports[i]).parse().expect("address");
        wait_for_broker(addr, 60_000, || guard.check_alive()).unwrap_or_else(|e| {
            panic!(
                "node {} did not serve: {e:#}\n{}",
                i + 1,
                std::fs::read_to_string(root.path().join(format!("gregor-{}.log", i + 1)))
                    .unwrap_or_default()
            )
        });
    }
    if !reference::jars_or_skip() {
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = tool_command(
            "kafka-metadata-quorum",
            &[
                "--bootstrap-controller".into(),
                bootstrap.join(","),
                "describe".into(),
                "--status".into(),
            ],
        )
        .expect("kafka-metadata-quorum")
        .stdin(Stdio::null())
        .output()
        .expect("running kafka-metadata-quorum");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let voters = text
            .lines()
            .find(|l| l.starts_with("CurrentVoters:"))
            .unwrap_or_default()
            .to_string();
        if out.status.success() && (1..=3).all(|id| voters.contains(&format!("\"id\": {id}"))) {
            eprintln!("{text}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no quorum of voters 1, 2, 3:\n{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn bootstrap_servers_without_a_voter_set_refuse_to_start() {
    let root = tempfile::tempdir().expect("a temp dir");
    let ports = free_ports(3).expect("free ports");
    let props = write_props(
        root.path(),
        1,
        ports[0],
        ports[1],
        ports[2],
        &format!("127.0.0.1:{}", ports[1]),
    );
    // `--no-initial-controllers`: the bootstrap snapshot names no voters (a controller meant
    // to be added later with `kafka-metadata-quorum add-controller`, which gregor cannot do).
    let out = gregor(
        &[
            "storage",
            "format",
            "-t",
            CLUSTER_ID,
            "--no-initial-controllers",
            "-c",
        ],
        &props,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(BIN)
        .arg("serve")
        .arg("--config")
        .arg(&props)
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null())
        .output()
        .expect("gregor serve");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started without voters:\n{stderr}");
    assert!(
        stderr.contains("controller.quorum.bootstrap.servers")
            && stderr.contains("--initial-controllers"),
        "{stderr}"
    );
}
