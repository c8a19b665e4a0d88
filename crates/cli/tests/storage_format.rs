//! `gregor storage format` against Apache Kafka 4.4.0's `kafka-storage format` as the oracle:
//! the same configuration, cluster id and flags given to both, then
//! - `meta.properties`: the same keys and values in every dir (except `directory.id`, random);
//! - the bootstrap snapshot `__cluster_metadata-0/00000000000000000000-0000000000.checkpoint`:
//!   the same control records and metadata records, record by record (timestamps and a
//!   `--standalone` voter's random directory id aside), in the same dirs;
//! - the error cases: both refuse, with a non-zero exit and the same message;
//! - Kafka 4.4.0 starts (and creates a topic) on storage gregor formatted;
//! - `gregor serve` refuses log dirs of another cluster or node.
//!
//! Needs Java 17+ and the Kafka jars (`cargo xtask kafka fetch`); the Kafka parts are skipped
//! with a message when they cannot be fetched.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gregor_protocol::kafka_protocol::messages::VotersRecord;
use gregor_protocol::metadata_records::log::{BatchRecords, ControlRecord, MetadataLogBatches};
use gregor_protocol::metadata_records::ApiMessageAndVersion;
use gregor_tests::process::{free_port, ChildGuard};
use gregor_tests::reference::{self, tool_command, Instance};

const BIN: &str = env!("CARGO_BIN_EXE_gregor");
const CLUSTER_ID: &str = "q1Sh-9_ISia_zwGINzRvyQ";
const SNAPSHOT: &str = "__cluster_metadata-0/00000000000000000000-0000000000.checkpoint";

/// (success, stdout + stderr).
fn output(cmd: &mut Command) -> (bool, String) {
    let out = cmd
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null())
        .output()
        .expect("running a command");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn kafka_storage(args: &[String]) -> (bool, String) {
    let mut all = vec!["format".to_string()];
    all.extend_from_slice(args);
    output(&mut tool_command("kafka-storage", &all).expect("the kafka-storage command"))
}

fn gregor_storage(args: &[String]) -> (bool, String) {
    output(Command::new(BIN).arg("storage").arg("format").args(args))
}

/// The kinds of configuration the cases use.
#[derive(Clone, Copy)]
enum Quorum {
    /// `controller.quorum.voters=1@...`, combined node 1.
    Static,
    /// `controller.quorum.bootstrap.servers`, combined node 1.
    Dynamic,
    /// `process.roles=broker` with bootstrap servers, node 4.
    BrokerOnly,
}

/// Writes a server.properties for a node with data under `root`: log dirs `a` and `b`, and
/// the metadata log in `meta`.
fn write_config(root: &Path, quorum: Quorum, extra: &[&str]) -> PathBuf {
    let mut lines = vec![
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT".to_string(),
        "controller.listener.names=CONTROLLER".to_string(),
        format!(
            "log.dirs={},{}",
            root.join("a").display(),
            root.join("b").display()
        ),
        format!("metadata.log.dir={}", root.join("meta").display()),
    ];
    match quorum {
        Quorum::Static | Quorum::Dynamic => {
            lines.push("node.id=1".into());
            lines.push("process.roles=broker,controller".into());
            lines.push("listeners=PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093".into());
        }
        Quorum::BrokerOnly => {
            lines.push("node.id=4".into());
            lines.push("process.roles=broker".into());
            lines.push("listeners=PLAINTEXT://127.0.0.1:19092".into());
        }
    }
    lines.push(match quorum {
        Quorum::Static => "controller.quorum.voters=1@127.0.0.1:19093".into(),
        Quorum::Dynamic | Quorum::BrokerOnly => {
            "controller.quorum.bootstrap.servers=127.0.0.1:19093".into()
        }
    });
    lines.extend(extra.iter().map(|s| (*s).to_string()));
    std::fs::create_dir_all(root).expect("a test dir");
    let path = root.join("server.properties");
    std::fs::write(&path, lines.join("\n") + "\n").expect("writing server.properties");
    path
}

fn meta_properties(dir: &Path) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(dir.join("meta.properties"))
        .unwrap_or_else(|e| panic!("{}/meta.properties: {e}", dir.display()));
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The snapshot's control records (timestamps zeroed) and metadata records; `None` when the
/// dir has none.
fn snapshot(dir: &Path) -> Option<(Vec<ControlRecord>, Vec<ApiMessageAndVersion>)> {
    let buf = std::fs::read(dir.join(SNAPSHOT)).ok()?;
    let (mut control, mut data) = (Vec::new(), Vec::new());
    let mut next_offset = 0;
    for batch in MetadataLogBatches::new(&buf) {
        let batch = batch.expect("every batch of the snapshot decodes");
        assert_eq!(batch.header.base_offset, next_offset, "contiguous offsets");
        assert_eq!(batch.header.partition_leader_epoch, 0);
        next_offset += batch.records.len() as i64;
        match batch.records {
            BatchRecords::Control(c) => control.extend(c.into_iter().map(|r| match r {
                ControlRecord::SnapshotHeader(h) => {
                    ControlRecord::SnapshotHeader(h.with_last_contained_log_timestamp(0))
                }
                other => other,
            })),
            BatchRecords::Metadata(m) => data.extend(m),
        }
    }
    Some((control, data))
}

fn voters(control: &[ControlRecord]) -> Option<&VotersRecord> {
    control.iter().find_map(|r| match r {
        ControlRecord::KRaftVoters(v) => Some(v),
        _ => None,
    })
}

/// Formats with both tools and compares what they wrote.
fn compare(name: &str, quorum: Quorum, extra_config: &[&str], flags: &[&str]) {
    let tmp = tempfile::tempdir().expect("a temp dir");
    let run = |who: &str| {
        let root = tmp.path().join(who);
        let config = write_config(&root, quorum, extra_config);
        let mut args = vec![
            "--cluster-id".to_string(),
            CLUSTER_ID.to_string(),
            "--config".to_string(),
            config.display().to_string(),
        ];
        args.extend(flags.iter().map(|f| (*f).to_string()));
        let (ok, out) = if who == "kafka" {
            kafka_storage(&args)
        } else {
            gregor_storage(&args)
        };
        assert!(ok, "{name}: {who} format failed:\n{out}");
        root
    };
    let kafka = run("kafka");
    let gregor = run("gregor");
    for dir in ["a", "b", "meta"] {
        let (mut k, mut g) = (
            meta_properties(&kafka.join(dir)),
            meta_properties(&gregor.join(dir)),
        );
        let (kd, gd) = (k.remove("directory.id"), g.remove("directory.id"));
        assert!(
            kd.is_some() && gd.is_some(),
            "{name}: {dir}: a directory.id"
        );
        assert_eq!(g, k, "{name}: {dir}/meta.properties");
        let (ks, gs) = (snapshot(&kafka.join(dir)), snapshot(&gregor.join(dir)));
        assert_eq!(
            gs.is_some(),
            ks.is_some(),
            "{name}: {dir}: a bootstrap snapshot in one and not the other"
        );
        let (Some((mut kc, kd_records)), Some((mut gc, gd_records))) = (ks, gs) else {
            continue;
        };
        assert!(!kd_records.is_empty(), "{name}: Kafka wrote feature levels");
        assert_eq!(gd_records, kd_records, "{name}: {dir}: metadata records");
        // --standalone: each tool picks a random directory id for the voter, which is the
        // metadata dir's directory.id; compare the rest.
        for (c, root) in [(&mut kc, &kafka), (&mut gc, &gregor)] {
            for r in c.iter_mut() {
                if let ControlRecord::KRaftVoters(v) = r {
                    if flags.contains(&"--standalone") || flags.contains(&"-s") {
                        let dir_id = meta_properties(&root.join("meta"))["directory.id"].clone();
                        let id = v.voters[0].voter_directory_id;
                        assert_eq!(
                            gregor_broker::storage::kafka_uuid_string(id),
                            dir_id,
                            "{name}: the voter's directory id is the metadata dir's"
                        );
                        v.voters[0].voter_directory_id = uuid::Uuid::nil();
                    }
                }
            }
        }
        assert_eq!(gc, kc, "{name}: {dir}: control records");
        if let Some(v) = voters(&kc) {
            eprintln!("{name}: {} voter(s)", v.voters.len());
        }
    }
}

#[test]
fn gregor_formats_as_kafka_storage_does() {
    if !reference::jars_or_skip() {
        return;
    }
    compare("static quorum", Quorum::Static, &[], &[]);
    compare(
        "static, 3.9",
        Quorum::Static,
        &[],
        &["--release-version", "3.9"],
    );
    compare("static, 3.3-IV3", Quorum::Static, &[], &["-r", "3.3-IV3"]);
    compare(
        "static, features",
        Quorum::Static,
        &[],
        &["--feature", "group.version=0", "-f", "share.version=1"],
    );
    compare("standalone", Quorum::Dynamic, &[], &["--standalone"]);
    compare(
        "standalone, advertised controller",
        Quorum::Dynamic,
        &["advertised.listeners=PLAINTEXT://localhost:19092,CONTROLLER://localhost:19093"],
        &["-s", "-r", "4.0"],
    );
    compare(
        "initial controllers",
        Quorum::Dynamic,
        &[],
        &[
            "--initial-controllers",
            "1@127.0.0.1:19093:JEXY6aqzQY-32P5TStzaFg,2@[::1]:19094:MvDxzVmcRsaTz33bUuRU6A,3@c3.example.com:19095:07R5amHmR32VDA6jHkGbTA",
        ],
    );
    compare(
        "not among the initial controllers",
        Quorum::Dynamic,
        &[],
        &["-I", "2@c2:19094:MvDxzVmcRsaTz33bUuRU6A"],
    );
    compare(
        "no initial controllers",
        Quorum::Dynamic,
        &[],
        &["--no-initial-controllers"],
    );
    compare("broker only", Quorum::BrokerOnly, &[], &["-N"]);
}

/// Both tools refuse, with a non-zero exit and a message containing `expected`.
fn both_refuse(
    name: &str,
    quorum: Quorum,
    extra_config: &[&str],
    flags: &[&str],
    expected: &str,
    prepare: impl Fn(&Path, &Path),
) {
    let tmp = tempfile::tempdir().expect("a temp dir");
    for who in ["kafka", "gregor"] {
        let root = tmp.path().join(who);
        let config = write_config(&root, quorum, extra_config);
        prepare(&root, &config);
        let mut args = vec!["-t".to_string(), CLUSTER_ID.to_string()];
        args.extend(["-c".to_string(), config.display().to_string()]);
        args.extend(flags.iter().map(|f| (*f).to_string()));
        let (ok, out) = if who == "kafka" {
            kafka_storage(&args)
        } else {
            gregor_storage(&args)
        };
        assert!(!ok, "{name}: {who} accepted it:\n{out}");
        assert!(
            out.contains(expected),
            "{name}: {who} did not say {expected:?}:\n{out}"
        );
    }
}

fn nothing(_: &Path, _: &Path) {}

/// Formats the dirs with `cluster_id` first (with gregor, which the first test checks against
/// Kafka), so that the command under test finds them formatted.
fn formatted_with(cluster_id: &'static str) -> impl Fn(&Path, &Path) {
    move |_, config| {
        let (ok, out) = gregor_storage(&[
            "-t".into(),
            cluster_id.into(),
            "-c".into(),
            config.display().to_string(),
        ]);
        assert!(ok, "{out}");
    }
}

#[test]
fn gregor_refuses_what_kafka_storage_refuses() {
    if !reference::jars_or_skip() {
        return;
    }
    both_refuse(
        "already formatted",
        Quorum::Static,
        &[],
        &[],
        "is already formatted. Use --ignore-formatted to ignore this directory and format the others.",
        formatted_with(CLUSTER_ID),
    );
    both_refuse(
        "another cluster id",
        Quorum::Static,
        &[],
        &["--ignore-formatted"],
        &format!("Expected {CLUSTER_ID}, but read AAAAAAAAAAAAAAAAAAAAAA"),
        formatted_with("AAAAAAAAAAAAAAAAAAAAAA"),
    );
    both_refuse(
        "another node id",
        Quorum::Static,
        &[],
        &["--ignore-formatted"],
        "Stored node id 4 doesn't match previous node id 1",
        |root, _| {
            let cfg = write_config(&root.join("other"), Quorum::BrokerOnly, &[]);
            let text = std::fs::read_to_string(&cfg).expect("config");
            let text = text.replace(
                &root.join("other").display().to_string(),
                &root.display().to_string(),
            );
            std::fs::write(&cfg, text).expect("config");
            let (ok, out) = gregor_storage(&[
                "-t".into(),
                CLUSTER_ID.into(),
                "-c".into(),
                cfg.display().to_string(),
                "-N".into(),
            ]);
            assert!(ok, "{out}");
        },
    );
    both_refuse(
        "no node.id",
        Quorum::Static,
        &[],
        &[],
        "Missing required configuration \"node.id\" which has no default value.",
        |_, config| {
            let text = std::fs::read_to_string(config).expect("config");
            std::fs::write(config, text.replace("node.id=1\n", "")).expect("config");
        },
    );
    both_refuse(
        "controller not among the voters",
        Quorum::Static,
        &["controller.quorum.voters=2@127.0.0.1:19093"],
        &[],
        "the node id 1 must be included in the set of voters controller.quorum.voters=Set(2)",
        nothing,
    );
    both_refuse(
        "static voters and --standalone",
        Quorum::Static,
        &[],
        &["--standalone"],
        "You cannot specify controller.quorum.voters and format the node with --initial-controllers or --standalone.",
        nothing,
    );
    both_refuse(
        "dynamic quorum without a flag",
        Quorum::Dynamic,
        &[],
        &[],
        "Because controller.quorum.voters is not set on this controller, you must specify one of the following: --standalone, --initial-controllers, or --no-initial-controllers.",
        nothing,
    );
    both_refuse(
        "--standalone on a broker",
        Quorum::BrokerOnly,
        &[],
        &["--standalone"],
        "You can only use --standalone on a controller.",
        nothing,
    );
    both_refuse(
        "unknown release version",
        Quorum::Static,
        &[],
        &["--release-version", "3.0"],
        "Unknown metadata.version '3.0'. Supported metadata.version are: 3.3-IV3,",
        nothing,
    );
    both_refuse(
        "unstable release version",
        Quorum::Static,
        &[],
        &["-r", "4.5-IV0"],
        "Unknown metadata.version '4.5-IV0'.",
        nothing,
    );
    both_refuse(
        "kraft.version 1 on a static quorum",
        Quorum::Static,
        &[],
        &["--feature", "kraft.version=1"],
        "Cannot set kraft.version to 1 unless controller.quorum.voters is empty",
        nothing,
    );
    both_refuse(
        "unknown feature",
        Quorum::Static,
        &[],
        &["--feature", "foo.version=1"],
        "Unsupported feature: foo.version. Supported features are: eligible.leader.replicas.version, group.version, kraft.version, share.version, streams.version, transaction.version",
        nothing,
    );
    both_refuse(
        "feature level too high",
        Quorum::Static,
        &[],
        &["--feature", "transaction.version=3"],
        "No feature:transaction.version with feature level 3",
        nothing,
    );
    both_refuse(
        "feature needs a newer metadata.version",
        Quorum::Static,
        &[],
        &["-r", "3.9", "-f", "eligible.leader.replicas.version=1"],
        "eligible.leader.replicas.version could not be set to 1 because it depends on metadata.version level 23",
        nothing,
    );
    both_refuse(
        "metadata.version as a feature and a release version",
        Quorum::Static,
        &[],
        &["-r", "3.9", "-f", "metadata.version=21"],
        "Use --release-version instead of --feature metadata.version=X to avoid ambiguity.",
        nothing,
    );
    both_refuse(
        "a bad initial controller",
        Quorum::Dynamic,
        &[],
        &["-I", "1@host:19093"],
        "No colon following port could be found.",
        nothing,
    );
    both_refuse(
        "empty process.roles",
        Quorum::Static,
        &["process.roles="],
        &[],
        "Configuration 'process.roles' must not be empty. Valid values include: [broker, controller]",
        nothing,
    );

    // --add-scram (KIP-900) formats, as Kafka's; a bad argument refuses with Kafka's message
    // and writes nothing. (Logging in with the credential: tests/sasl.rs.)
    let tmp = tempfile::tempdir().expect("a temp dir");
    let config = write_config(tmp.path(), Quorum::Static, &[]);
    let (ok, out) = gregor_storage(&[
        "-t".into(),
        CLUSTER_ID.into(),
        "-c".into(),
        config.display().to_string(),
        "--add-scram".into(),
        "SCRAM-SHA-256=[name=alice,password=alice-secret]".into(),
    ]);
    assert!(ok, "{out}");
    assert!(tmp.path().join("a").join("meta.properties").exists());
    let tmp = tempfile::tempdir().expect("a temp dir");
    let config = write_config(tmp.path(), Quorum::Static, &[]);
    let (ok, out) = gregor_storage(&[
        "-t".into(),
        CLUSTER_ID.into(),
        "-c".into(),
        config.display().to_string(),
        "--add-scram".into(),
        "SCRAM-SHA-256=[name=alice]".into(),
    ]);
    assert!(
        !ok && out.contains("You must supply one of 'password' or 'saltedpassword' to add-scram"),
        "{out}"
    );
    assert!(!tmp.path().join("a").join("meta.properties").exists());
}

#[test]
fn random_uuid_prints_a_kafka_uuid() {
    let (ok, out) = output(Command::new(BIN).args(["storage", "random-uuid"]));
    assert!(ok, "{out}");
    let id = out.trim();
    assert_eq!(id.len(), 22, "{id}");
    assert!(!id.starts_with('-'), "{id}");
    let parsed = gregor_broker::storage::parse_kafka_uuid(id).expect("a Kafka uuid");
    assert!(parsed.as_u128() >= 100, "not a reserved id");
}

/// Kafka 4.4.0 starts on a node gregor formatted, with Kafka's own generated configuration,
/// static and standalone, and creates a topic.
#[test]
fn kafka_starts_on_storage_gregor_formatted() {
    if !reference::jars_or_skip() {
        return;
    }
    for standalone in [false, true] {
        let port = free_port().expect("a free port");
        let mut instance = Instance::new(port, None, None).expect("an instance");
        instance.standalone = standalone;
        // Writes Kafka's server.properties (and formats with Kafka); the data is then wiped
        // and formatted again by gregor.
        instance.format().expect("writing the configuration");
        std::fs::remove_dir_all(&instance.data_dir).expect("wiping Kafka's format");
        let config = instance.dir.join("server.properties");
        let mut args = vec![
            "-t".to_string(),
            CLUSTER_ID.to_string(),
            "-c".to_string(),
            config.display().to_string(),
        ];
        if standalone {
            args.push("--standalone".into());
        }
        let (ok, out) = gregor_storage(&args);
        assert!(ok, "gregor storage format:\n{out}");
        let child = instance.start().expect("starting Kafka");
        let mut guard = ChildGuard::new("kafka", child);
        instance
            .wait_ready(|| guard.check_alive())
            .expect("Kafka ready on storage gregor formatted");
        let bs = instance.bootstrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (_, out) = output(
                &mut tool_command(
                    "kafka-topics",
                    &[
                        "--bootstrap-server".to_string(),
                        bs.clone(),
                        "--create".to_string(),
                        "--if-not-exists".to_string(),
                        "--topic".to_string(),
                        "formatted-by-gregor".to_string(),
                    ],
                )
                .expect("kafka-topics"),
            );
            let (_, described) = output(
                &mut tool_command(
                    "kafka-topics",
                    &[
                        "--bootstrap-server".to_string(),
                        bs.clone(),
                        "--describe".to_string(),
                        "--topic".to_string(),
                        "formatted-by-gregor".to_string(),
                    ],
                )
                .expect("kafka-topics"),
            );
            if described.contains("Leader: 1") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "standalone={standalone}: Kafka does not create a topic:\n{out}\n{described}\n{}",
                std::fs::read_to_string(instance.server_log()).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_secs(1));
        }
        let (_, cluster) = output(
            &mut tool_command(
                "org.apache.kafka.tools.ClusterTool",
                &[
                    "cluster-id".to_string(),
                    "--bootstrap-server".to_string(),
                    bs.clone(),
                ],
            )
            .expect("kafka-cluster"),
        );
        assert!(
            cluster.contains(&format!("Cluster ID: {CLUSTER_ID}")),
            "{cluster}"
        );
        guard.stop().expect("stopping Kafka");
        let _ = std::fs::remove_dir_all(&instance.data_dir);
    }
}

/// Starts `gregor serve` and reports whether it came up (it wrote `ready_file` and was still
/// running a second later); it is stopped either way.
fn serve_starts(log_dirs: &str, extra: &[&str], ready_file: &Path) -> bool {
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "--set"])
        .arg(format!("log.dirs={log_dirs}"))
        .args([
            "--set",
            "listeners=PLAINTEXT://127.0.0.1:0",
            "--set",
            "admin.listener=",
        ]);
    for e in extra {
        cmd.args(["--set", e]);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let child = cmd.spawn().expect("starting gregor serve");
    let mut guard = ChildGuard::new("gregor", child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ready_file.exists() && guard.check_alive().is_ok() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(1));
    let alive = guard.check_alive().is_ok();
    guard.stop().expect("stopping gregor");
    alive && ready_file.exists()
}

/// `gregor serve` on dirs of two clusters, or of another node, refuses to start with the
/// reason; on dirs `gregor storage format` prepared, it starts.
#[test]
fn serve_checks_meta_properties() {
    let tmp = tempfile::tempdir().expect("a temp dir");
    let root = tmp.path();
    let format = |dir: &str, cluster: &str| {
        let config = root.join(format!("{dir}.properties"));
        std::fs::write(
            &config,
            format!(
                "node.id=1\nprocess.roles=broker,controller\ncontroller.quorum.voters=1@127.0.0.1:19093\n\
                 listeners=PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093\n\
                 controller.listener.names=CONTROLLER\nlog.dirs={}\n",
                root.join(dir).display()
            ),
        )
        .expect("config");
        let (ok, out) = gregor_storage(&[
            "-t".into(),
            cluster.into(),
            "-c".into(),
            config.display().to_string(),
        ]);
        assert!(ok, "{out}");
    };
    format("x", CLUSTER_ID);
    format("y", "AAAAAAAAAAAAAAAAAAAAAA");
    let (x, y) = (root.join("x"), root.join("y"));
    let out = serve_output(&format!("{},{}", x.display(), y.display()), &[]);
    assert!(!out.0, "gregor served two clusters' dirs");
    assert!(
        out.1.contains("Invalid cluster.id in:") && out.1.contains("meta.properties"),
        "{}",
        out.1
    );
    let out = serve_output(&x.display().to_string(), &["node.id=2"]);
    assert!(!out.0, "gregor served another node's dir");
    assert!(
        out.1
            .contains("Stored node id 1 doesn't match previous node id 2"),
        "{}",
        out.1
    );
    // A new, empty dir next to a formatted one gets the cluster's meta.properties.
    let z = root.join("z");
    let started = serve_starts(
        &format!("{},{}", x.display(), z.display()),
        &[],
        &z.join("meta.properties"),
    );
    assert!(started, "gregor did not start on formatted storage");
    let props = meta_properties(&z);
    assert_eq!(props["cluster.id"], CLUSTER_ID);
    assert_eq!(props["node.id"], "1");
    assert_eq!(props["version"], "1");
    assert!(
        x.join(SNAPSHOT).exists(),
        "the bootstrap snapshot survived the start"
    );
}

/// Runs `gregor serve` expecting it to exit; (success, stderr).
fn serve_output(log_dirs: &str, extra: &[&str]) -> (bool, String) {
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "--set"])
        .arg(format!("log.dirs={log_dirs}"))
        .args([
            "--set",
            "listeners=PLAINTEXT://127.0.0.1:0",
            "--set",
            "admin.listener=",
        ]);
    for e in extra {
        cmd.args(["--set", e]);
    }
    let child = cmd
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting gregor serve");
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(20);
    let waiter = std::thread::spawn(move || child.wait_with_output());
    while !waiter.is_finished() {
        if Instant::now() > deadline {
            let _ = gregor_tests::process::terminate_pid(pid, 5_000);
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = waiter.join().expect("the waiter").expect("gregor's output");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `(long, short)` flag pairs of a help text: Kafka's argparse4j prints `--config CONFIG,
/// -c CONFIG`, clap prints `-c, --config <CONFIG>`.
fn flag_pairs(help: &str) -> std::collections::BTreeSet<(String, String)> {
    let word = |s: &str| s.split_whitespace().next().unwrap_or("").to_string();
    help.lines()
        .map(str::trim)
        .filter_map(|l| {
            let (first, second) = l.split_once(", ")?;
            let (first, second) = (word(first), word(second));
            if first.starts_with("--") && second.starts_with('-') && !second.starts_with("--") {
                Some((first, second))
            } else if second.starts_with("--") && first.starts_with('-') {
                Some((second, first))
            } else {
                None
            }
        })
        .filter(|(long, _)| long != "--help")
        .collect()
}

/// `gregor storage format` has exactly `kafka-storage format`'s flags, long and short.
#[test]
fn format_has_kafka_storage_flags() {
    if !reference::jars_or_skip() {
        return;
    }
    let (_, kafka) = kafka_storage(&["--help".to_string()]);
    let (ok, gregor) = gregor_storage(&["--help".to_string()]);
    assert!(ok, "{gregor}");
    let kafka = flag_pairs(&kafka);
    assert!(
        kafka.contains(&("--no-initial-controllers".into(), "-N".into())),
        "{kafka:?}"
    );
    assert_eq!(flag_pairs(&gregor), kafka);
}

/// `gregor serve` starts on log dirs `kafka-storage format` prepared, keeps Kafka's
/// `meta.properties` and bootstrap snapshot, and refuses them under another `node.id`.
#[test]
fn serve_starts_on_storage_kafka_formatted() {
    if !reference::jars_or_skip() {
        return;
    }
    let tmp = tempfile::tempdir().expect("a temp dir");
    let config = write_config(tmp.path(), Quorum::Static, &[]);
    let (ok, out) = kafka_storage(&[
        "-t".into(),
        CLUSTER_ID.into(),
        "-c".into(),
        config.display().to_string(),
    ]);
    assert!(ok, "{out}");
    let meta = tmp.path().join("meta");
    let before = meta_properties(&meta);
    let snapshot_before = std::fs::read(meta.join(SNAPSHOT)).expect("Kafka's snapshot");
    let dirs = format!(
        "{},{}",
        tmp.path().join("a").display(),
        tmp.path().join("b").display()
    );
    let metadata_log_dir = format!("metadata.log.dir={}", meta.display());
    let (ok, err) = serve_output(&dirs, &[&metadata_log_dir, "node.id=3"]);
    assert!(!ok);
    assert!(
        err.contains("Stored node id 1 doesn't match previous node id 3"),
        "{err}"
    );
    // Kafka's meta.properties and snapshot stay as they were.
    let started = serve_starts(
        &dirs,
        &[&metadata_log_dir],
        &tmp.path().join("a").join(".lock"),
    );
    assert!(started, "gregor did not start on Kafka-formatted storage");
    assert_eq!(meta_properties(&meta), before);
    assert_eq!(
        meta_properties(&tmp.path().join("a"))["cluster.id"],
        CLUSTER_ID
    );
    assert_eq!(
        std::fs::read(meta.join(SNAPSHOT)).expect("the snapshot after gregor ran"),
        snapshot_before
    );
}

/// A second gregor process on a running node's log directory stops at once, naming the
/// directory, before it opens the metadata log (so it never joins the quorum as that node).
#[test]
fn a_second_process_on_a_running_nodes_directory_is_refused_before_it_joins_the_quorum() {
    use gregor_tests::cluster::{Cluster, ClusterConfig, Implementation};
    let cluster = Cluster::start(&ClusterConfig::combined(
        Implementation::Gregor(BIN.into()),
        1,
    ))
    .unwrap_or_else(|e| panic!("{e:#}"));
    let node = cluster.node(1);
    let ports: Vec<u16> = (0..3).map(|_| free_port().expect("port")).collect();
    let text = serve_fails(
        &node.config_file(),
        &[
            format!(
                "listeners=PLAINTEXT://127.0.0.1:{},CONTROLLER://127.0.0.1:{}",
                ports[0], ports[1]
            ),
            format!("advertised.listeners=PLAINTEXT://127.0.0.1:{}", ports[0]),
            format!("admin.listener=127.0.0.1:{}", ports[2]),
        ],
    );
    assert!(
        text.contains(&format!(
            "log directory {} is in use by another process",
            node.data_dir().display()
        )),
        "{text}"
    );
    assert!(!text.contains("raft node starting"), "{text}");
}

/// A node of a larger quorum does not format itself: without meta.properties it refuses to
/// start (as Kafka does), naming the directory and how to format it; only a one-node cluster
/// formats itself on first start.
#[test]
fn an_unformatted_node_of_a_larger_quorum_refuses_to_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let ports: Vec<u16> = (0..5).map(|_| free_port().expect("port")).collect();
    let config = dir.path().join("server.properties");
    std::fs::write(
        &config,
        format!(
            "node.id=1\nprocess.roles=broker,controller\ncontroller.listener.names=CONTROLLER\n\
             listeners=PLAINTEXT://127.0.0.1:{},CONTROLLER://127.0.0.1:{}\n\
             controller.quorum.voters=1@127.0.0.1:{},2@127.0.0.1:{},3@127.0.0.1:{}\n\
             log.dirs={}\n",
            ports[0],
            ports[1],
            ports[1],
            ports[2],
            ports[3],
            data.display()
        ),
    )
    .expect("config");
    let text = serve_fails(&config, &[format!("admin.listener=127.0.0.1:{}", ports[4])]);
    assert!(text.contains("no meta.properties in"), "{text}");
    assert!(text.contains("gregor storage format"), "{text}");
    assert!(!data.join("meta.properties").exists());
}

/// Runs `gregor serve --config config --set ...` and returns its output, which must come from a
/// failed start.
fn serve_fails(config: &Path, sets: &[String]) -> String {
    let mut cmd = Command::new(BIN);
    cmd.arg("serve").arg("--config").arg(config);
    for set in sets {
        cmd.arg("--set").arg(set);
    }
    let out = cmd
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null())
        .output()
        .expect("running gregor serve");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !out.status.success(),
        "gregor serve should have failed: {text}"
    );
    text
}
