//! The reference Apache Kafka broker and its command-line tools, run from the jars on Maven
//! Central (no tarball, no Docker): `cargo xtask kafka fetch|start|stop|run|classpath`.
//!
//! Jars are resolved by Maven from a generated pom into `.cache/kafka/<version>/libs/` (git
//! ignored). A started broker is a single KRaft node in combined broker+controller roles; its
//! state (properties, pid, log) lives in `.cache/kafka/instances/<port>/`.

use crate::proc::{self, repo_root};
use anyhow::{bail, ensure, Context, Result};
use clap::{Args, Subcommand};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// The newest Apache Kafka 4.x release whose jars resolve from Maven Central (checked
/// 2026-11: 4.4.0; older: 4.3.1, 4.2.2, 4.1.2, 4.0.2).
pub const KAFKA_VERSION: &str = "4.4.0";
/// Kafka's own distribution ships log4j2 with the slf4j 1.x binding (its poms use slf4j 1.7.36).
const LOG4J_VERSION: &str = "2.24.3";
const DEPENDENCY_PLUGIN: &str = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1";
/// Port `start`/`stop` use when none is given; 9092 is left to gregor.
const DEFAULT_PORT: u16 = 9192;
/// How long a starting broker may take to answer ApiVersions.
const START_DEADLINE_MS: u64 = 90_000;

/// Short names for the tools, as Kafka's `bin/*.sh` scripts call them.
const TOOL_ALIASES: &[(&str, &str)] = &[
    ("kafka-topics", "org.apache.kafka.tools.TopicCommand"),
    (
        "kafka-console-producer",
        "org.apache.kafka.tools.ConsoleProducer",
    ),
    (
        "kafka-console-consumer",
        "org.apache.kafka.tools.consumer.ConsoleConsumer",
    ),
    ("kafka-get-offsets", "org.apache.kafka.tools.GetOffsetShell"),
    ("kafka-dump-log", "org.apache.kafka.tools.DumpLogSegments"),
    (
        "kafka-consumer-groups",
        "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
    ),
    ("kafka-configs", "org.apache.kafka.tools.ConfigCommand"),
    ("kafka-acls", "org.apache.kafka.tools.AclCommand"),
    (
        "kafka-broker-api-versions",
        "org.apache.kafka.tools.BrokerApiVersionsCommand",
    ),
    (
        "kafka-metadata-quorum",
        "org.apache.kafka.tools.MetadataQuorumCommand",
    ),
    (
        "kafka-producer-perf-test",
        "org.apache.kafka.tools.ProducerPerformance",
    ),
    (
        "kafka-consumer-perf-test",
        "org.apache.kafka.tools.ConsumerPerformance",
    ),
    (
        "kafka-transactions",
        "org.apache.kafka.tools.TransactionsCommand",
    ),
    (
        "kafka-delete-records",
        "org.apache.kafka.tools.DeleteRecordsCommand",
    ),
    ("kafka-storage", "kafka.tools.StorageTool"),
];

#[derive(Subcommand)]
pub enum KafkaCommand {
    /// Resolve the Kafka jars with Maven into .cache/kafka/<version>/ (skipped when present).
    Fetch,
    /// Start a single-node KRaft broker in the background and wait until it answers.
    Start(StartArgs),
    /// Stop the broker started on --port.
    Stop {
        #[arg(long, default_value_t = DEFAULT_PORT)]
        port: u16,
    },
    /// Run a Kafka tool by class name or script name (kafka-topics, kafka-dump-log, ...).
    #[command(trailing_var_arg = true)]
    Run {
        /// Fully qualified main class, or one of the kafka-*.sh names.
        tool: String,
        /// Arguments passed to the tool unchanged.
        #[arg(allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Print the Java classpath of the cached jars.
    Classpath,
}

#[derive(Args, Clone)]
pub struct StartArgs {
    /// Client (PLAINTEXT) port on 127.0.0.1.
    #[arg(long, default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// Controller port; a free port is picked when not given.
    #[arg(long)]
    pub controller_port: Option<u16>,
    /// log.dirs; default: a fresh directory in the system temp dir. Wiped before starting.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
}

pub fn run(cmd: KafkaCommand) -> Result<i32> {
    match cmd {
        KafkaCommand::Fetch => {
            let dir = fetch()?;
            println!("{}", dir.display());
        }
        KafkaCommand::Start(args) => {
            let instance = Instance::new(&args)?;
            if let Some(pid) = instance.running_pid() {
                bail!(
                    "a Kafka broker started by xtask already runs on port {} (pid {pid}); \
                     `cargo xtask kafka stop --port {}` first",
                    instance.port,
                    instance.port
                );
            }
            let child = instance.spawn()?;
            let pid = child.id();
            std::fs::write(instance.pid_file(), pid.to_string())
                .with_context(|| format!("writing {}", instance.pid_file().display()))?;
            let mut guard = proc::ChildGuard::new("kafka", child);
            if let Err(e) = instance.wait_ready(|| guard.check_alive()) {
                drop(guard);
                let _ = std::fs::remove_file(instance.pid_file());
                return Err(e);
            }
            // Detach: the broker outlives this command; `stop` ends it through the pid file.
            std::mem::forget(guard);
            std::fs::write(instance.dir.join("env"), instance.env_lines())?;
            print!("{}", instance.env_lines());
            eprintln!(
                "Kafka {KAFKA_VERSION} (pid {pid}) is up; log: {}",
                instance.server_log().display()
            );
        }
        KafkaCommand::Stop { port } => stop(port)?,
        KafkaCommand::Run { tool, args } => {
            let status = tool_command(&tool, &args)?
                .status()
                .with_context(|| format!("running Kafka tool {tool}"))?;
            return Ok(status.code().unwrap_or(1));
        }
        KafkaCommand::Classpath => println!("{}", classpath()?),
    }
    Ok(0)
}

/// `.cache/kafka/<version>/`.
fn cache_dir() -> PathBuf {
    repo_root().join(".cache").join("kafka").join(KAFKA_VERSION)
}

fn generated_pom() -> String {
    format!(
        r#"<?xml version="1.0" encoding="UTF-8"?>
<!-- Generated by `cargo xtask kafka fetch`: the reference broker and its tools. -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.gregor</groupId>
  <artifactId>kafka-reference</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>{KAFKA_VERSION}</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-tools</artifactId><version>{KAFKA_VERSION}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId><version>{LOG4J_VERSION}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>{LOG4J_VERSION}</version></dependency>
  </dependencies>
</project>
"#
    )
}

/// log4j2 configuration: everything to stderr at `level`.
fn log4j_config(level: &str) -> String {
    format!(
        "status = warn\n\
         appender.stderr.type = Console\n\
         appender.stderr.name = STDERR\n\
         appender.stderr.target = SYSTEM_ERR\n\
         appender.stderr.layout.type = PatternLayout\n\
         appender.stderr.layout.pattern = [%d] %p %m (%c)%n\n\
         rootLogger.level = {level}\n\
         rootLogger.appenderRef.stderr.ref = STDERR\n"
    )
}

/// Resolves the jars once; later calls return at once.
pub fn fetch() -> Result<PathBuf> {
    let dir = cache_dir();
    let complete = dir.join(".complete");
    if complete.exists() {
        return Ok(dir);
    }
    eprintln!(
        "Resolving Apache Kafka {KAFKA_VERSION} jars with Maven into {}",
        dir.display()
    );
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let libs = dir.join("libs");
    if libs.exists() {
        std::fs::remove_dir_all(&libs)
            .with_context(|| format!("removing partial {}", libs.display()))?;
    }
    let pom = dir.join("pom.xml");
    std::fs::write(&pom, generated_pom()).with_context(|| format!("writing {}", pom.display()))?;
    proc::run_checked(
        Command::new("mvn")
            .arg("-B")
            .arg("-q")
            .arg("-f")
            .arg(&pom)
            .arg(format!("{DEPENDENCY_PLUGIN}:copy-dependencies"))
            .arg("-DincludeScope=runtime")
            .arg(format!("-DoutputDirectory={}", libs.display())),
    )
    .context("resolving Kafka jars with Maven (is `mvn` installed and Maven Central reachable?)")?;
    let config = dir.join("config");
    std::fs::create_dir_all(&config)?;
    std::fs::write(config.join("tools-log4j2.properties"), log4j_config("warn"))?;
    std::fs::write(
        config.join("server-log4j2.properties"),
        log4j_config("info"),
    )?;
    for jar in [
        format!("kafka_2.13-{KAFKA_VERSION}.jar"),
        format!("kafka-tools-{KAFKA_VERSION}.jar"),
    ] {
        ensure!(
            libs.join(&jar).exists(),
            "Maven finished but {jar} is missing from {}",
            libs.display()
        );
    }
    std::fs::write(&complete, format!("{KAFKA_VERSION}\n"))?;
    Ok(dir)
}

/// The classpath of the cached jars (a `libs/*` wildcard, which java expands).
pub fn classpath() -> Result<String> {
    Ok(format!("{}/*", fetch()?.join("libs").display()))
}

fn java_command(main_class: &str, log4j: &str, jvm_opts: &[&str]) -> Result<Command> {
    let dir = fetch()?;
    let mut cmd = Command::new("java");
    cmd.args(jvm_opts)
        .arg("-cp")
        .arg(classpath()?)
        .arg(format!(
            "-Dlog4j2.configurationFile={}",
            dir.join("config").join(log4j).display()
        ))
        .arg(main_class);
    Ok(cmd)
}

/// A command that runs a Kafka tool with the cached classpath; `tool` may be a class name or a
/// `kafka-*.sh` script name (with or without `.sh`).
pub fn tool_command(tool: &str, args: &[String]) -> Result<Command> {
    let short = tool.strip_suffix(".sh").unwrap_or(tool);
    let class = TOOL_ALIASES
        .iter()
        .find(|(alias, _)| *alias == short)
        .map_or(tool, |(_, class)| class);
    let mut cmd = java_command(class, "tools-log4j2.properties", &[])?;
    cmd.args(args);
    Ok(cmd)
}

/// One broker started by xtask, keyed by its client port.
pub struct Instance {
    pub port: u16,
    pub controller_port: u16,
    pub data_dir: PathBuf,
    pub dir: PathBuf,
}

impl Instance {
    pub fn new(args: &StartArgs) -> Result<Self> {
        let controller_port = match args.controller_port {
            Some(p) => p,
            None => loop {
                let p = proc::free_port()?;
                if p != args.port {
                    break p;
                }
            },
        };
        let data_dir = args
            .data_dir
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join(format!("gregor-kafka-{}", args.port)));
        let data_dir = if data_dir.is_absolute() {
            data_dir
        } else {
            std::env::current_dir()?.join(data_dir)
        };
        Ok(Self {
            port: args.port,
            controller_port,
            data_dir,
            dir: repo_root()
                .join(".cache")
                .join("kafka")
                .join("instances")
                .join(args.port.to_string()),
        })
    }

    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn pid_file(&self) -> PathBuf {
        self.dir.join("kafka.pid")
    }

    pub fn server_log(&self) -> PathBuf {
        self.dir.join("server.log")
    }

    fn env_lines(&self) -> String {
        format!(
            "GREGOR_BOOTSTRAP={}\nGREGOR_LOG_DIR={}\n",
            self.bootstrap(),
            self.data_dir.display()
        )
    }

    /// The pid in the pid file, if that process is alive and is a Kafka broker.
    fn running_pid(&self) -> Option<u32> {
        let pid: u32 = std::fs::read_to_string(self.pid_file())
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let cmdline = proc::pid_cmdline(pid)?;
        (proc::pid_alive(pid) && cmdline.contains("kafka.Kafka")).then_some(pid)
    }

    fn server_properties(&self) -> String {
        let mut p = String::new();
        let lines = [
            "# Generated by `cargo xtask kafka start`: one KRaft node, broker and controller."
                .to_string(),
            "node.id=1".to_string(),
            "process.roles=broker,controller".to_string(),
            format!(
                "controller.quorum.voters=1@127.0.0.1:{}",
                self.controller_port
            ),
            format!(
                "listeners=PLAINTEXT://127.0.0.1:{},CONTROLLER://127.0.0.1:{}",
                self.port, self.controller_port
            ),
            format!("advertised.listeners=PLAINTEXT://127.0.0.1:{}", self.port),
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT".to_string(),
            "controller.listener.names=CONTROLLER".to_string(),
            "inter.broker.listener.name=PLAINTEXT".to_string(),
            format!("log.dirs={}", self.data_dir.display()),
            "num.partitions=1".to_string(),
            "offsets.topic.replication.factor=1".to_string(),
            "offsets.topic.num.partitions=1".to_string(),
            "transaction.state.log.replication.factor=1".to_string(),
            "transaction.state.log.min.isr=1".to_string(),
            "share.coordinator.state.topic.replication.factor=1".to_string(),
            "share.coordinator.state.topic.min.isr=1".to_string(),
            "group.initial.rebalance.delay.ms=0".to_string(),
        ];
        for line in lines {
            let _ = writeln!(p, "{line}");
        }
        p
    }

    /// Writes the configuration, formats storage and starts the broker; does not wait.
    pub fn spawn(&self) -> Result<Child> {
        // Otherwise the readiness probe could be answered by whatever already listens there.
        for port in [self.port, self.controller_port] {
            std::net::TcpListener::bind(("127.0.0.1", port))
                .with_context(|| format!("port {port} on 127.0.0.1 is not free"))?;
        }
        std::fs::create_dir_all(&self.dir)
            .with_context(|| format!("creating {}", self.dir.display()))?;
        if self.data_dir.exists() {
            std::fs::remove_dir_all(&self.data_dir)
                .with_context(|| format!("wiping {}", self.data_dir.display()))?;
        }
        std::fs::create_dir_all(&self.data_dir)
            .with_context(|| format!("creating {}", self.data_dir.display()))?;
        let props = self.dir.join("server.properties");
        std::fs::write(&props, self.server_properties())
            .with_context(|| format!("writing {}", props.display()))?;

        let mut format = tool_command(
            "kafka.tools.StorageTool",
            &[
                "format".into(),
                "--cluster-id".into(),
                random_cluster_id()?,
                "--config".into(),
                props.display().to_string(),
                "--ignore-formatted".into(),
            ],
        )?;
        let out = format.output().context("running kafka-storage format")?;
        if !out.status.success() {
            bail!(
                "kafka-storage format failed ({}):\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }

        let log = std::fs::File::create(self.server_log())
            .with_context(|| format!("creating {}", self.server_log().display()))?;
        let mut cmd = java_command(
            "kafka.Kafka",
            "server-log4j2.properties",
            &["-Xmx1g", "-Xms256m"],
        )?;
        cmd.arg(&props)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // Its own process group: a Ctrl-C meant for a later command in this terminal does not
        // reach it.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        eprintln!(
            "Starting Kafka {KAFKA_VERSION} on {} (controller :{}, log.dirs {})",
            self.bootstrap(),
            self.controller_port,
            self.data_dir.display()
        );
        cmd.spawn()
            .context("starting java kafka.Kafka (is Java 17+ installed?)")
    }

    /// Waits until the broker answers ApiVersions; `alive` reports an early exit.
    pub fn wait_ready(&self, alive: impl FnMut() -> Result<()>) -> Result<()> {
        let addr: SocketAddr = self.bootstrap().parse()?;
        proc::wait_for_broker(addr, START_DEADLINE_MS, alive).with_context(|| {
            format!(
                "Kafka did not come up; last lines of {}:\n{}",
                self.server_log().display(),
                proc::tail(&self.server_log(), 30)
            )
        })
    }
}

fn stop(port: u16) -> Result<()> {
    let instance = Instance::new(&StartArgs {
        port,
        controller_port: Some(0),
        data_dir: None,
    })?;
    match instance.running_pid() {
        Some(pid) => {
            eprintln!("Stopping Kafka on port {port} (pid {pid})");
            proc::terminate_pid(pid, 30_000)?;
        }
        None => eprintln!("No Kafka broker started by xtask runs on port {port}"),
    }
    let _ = std::fs::remove_file(instance.pid_file());
    Ok(())
}

/// A Kafka cluster id: 16 random bytes, URL-safe base64 without padding (as `Uuid.toString`).
fn random_cluster_id() -> Result<String> {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut bytes = [0u8; 16];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut bytes)
        .context("reading /dev/urandom")?;
    // Kafka avoids ids that start with '-' (they look like command-line flags).
    bytes[0] &= 0x7f;
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let chars = chunk.len() + 1;
        for i in 0..chars {
            out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_id_is_22_url_safe_chars() {
        let id = random_cluster_id().unwrap();
        assert_eq!(id.len(), 22);
        assert!(!id.starts_with('-'));
        assert!(id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
    }
}
