//! A multi-node KRaft cluster of real processes on 127.0.0.1, for fault tests: N combined
//! (broker,controller) nodes, or N controllers and M brokers, or N combined nodes and M
//! brokers, of one implementation (the `gregor` binary or the reference Apache Kafka from
//! [`crate::reference`]) or of both: [`ClusterConfig::with_node_implementation`] runs one
//! node on the other one (a mixed cluster, issue 11). Both read the same `server.properties`
//! keys and are formatted by the same `storage format -t <cluster id> -c <props>` command, so
//! one [`Cluster`] drives either.
//!
//! [`Cluster::start`] allocates free ports, writes each node's properties into its own
//! directory under a temporary root, formats every node with one cluster id (in parallel),
//! starts every node at once (JVM start is slow) and waits until the cluster is ready: every
//! listener answers ApiVersions, the quorum has a leader (DescribeQuorum, KIP-595, on the
//! controller listeners) and every running broker is in the Metadata response (Kafka lists
//! only registered, unfenced brokers). Per node ([`Node`]): kill -9, SIGSTOP/SIGCONT,
//! graceful stop (SIGTERM), restart on the same directories, pid, the tail of its log.
//! Every process is killed when the cluster is dropped, also when a test panics.
//!
//! The active controller comes from DescribeQuorum ([`Cluster::describe_quorum`], answered
//! only by the leader, cheap enough to poll) or from Kafka's own tool,
//! `kafka-metadata-quorum --bootstrap-controller ... describe --status`
//! ([`Cluster::describe_quorum_tool`], parsed by [`QuorumStatus::parse_tool_output`]).

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use kafka_protocol::messages::{
    describe_quorum_request, ApiKey, DescribeQuorumRequest, DescribeQuorumResponse,
    MetadataRequest, MetadataResponse, TopicName,
};

use crate::process::{self, api_versions_ok};
use crate::proxy::{Listener, Network, PidRegistry};
use crate::reference;
use crate::wire::{sb, KafkaConn};

/// How long [`Cluster::start`] and [`Node::restart`] wait for readiness.
pub const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a graceful stop (SIGTERM) may take before the node is killed and the stop fails.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(60);
/// JVM options of a Kafka node: a small heap and the C1 compiler only, which starts faster
/// and needs less CPU on a small machine (the tests are about behaviour, not throughput).
const KAFKA_JVM_OPTS: &[&str] = &[
    "-Xmx768m",
    "-Xms128m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
];
/// The name of the KRaft metadata topic.
const METADATA_TOPIC: &str = "__cluster_metadata";

/// Which broker runs on the nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Implementation {
    /// The `gregor` binary at this path (`gregor serve --config <file>`).
    Gregor(PathBuf),
    /// The reference Apache Kafka ([`reference::KAFKA_VERSION`]) from Maven Central.
    Kafka,
}

impl Implementation {
    /// `gregor` or `kafka`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Gregor(_) => "gregor",
            Self::Kafka => "kafka",
        }
    }

    /// Whether this exit status is a clean exit after SIGTERM: gregor exits 0; a JVM exits
    /// 143 (128 + SIGTERM) once its shutdown hooks, Kafka's controlled shutdown, have run.
    fn clean_term_exit(&self, status: std::process::ExitStatus) -> bool {
        match self {
            Self::Gregor(_) => status.success(),
            Self::Kafka => status.success() || status.code() == Some(143),
        }
    }
}

/// The roles of the nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// N nodes, each `process.roles=broker,controller`, all voters.
    Combined(usize),
    /// `controllers` controller-only voters (node ids 1..), then `brokers` broker-only nodes.
    Split {
        /// Controller-only nodes (the voters).
        controllers: usize,
        /// Broker-only nodes.
        brokers: usize,
    },
    /// `combined` combined voters (node ids 1..), then `brokers` broker-only nodes.
    CombinedAndBrokers {
        /// Combined nodes (the voters).
        combined: usize,
        /// Broker-only nodes.
        brokers: usize,
    },
}

impl Layout {
    /// Each node's role, in node id order (ids from 1).
    pub fn roles(self) -> Vec<Role> {
        match self {
            Self::Combined(n) => vec![Role::Combined; n],
            Self::Split {
                controllers,
                brokers,
            } => std::iter::repeat_n(Role::Controller, controllers)
                .chain(std::iter::repeat_n(Role::Broker, brokers))
                .collect(),
            Self::CombinedAndBrokers { combined, brokers } => {
                std::iter::repeat_n(Role::Combined, combined)
                    .chain(std::iter::repeat_n(Role::Broker, brokers))
                    .collect()
            }
        }
    }
}

/// A node's `process.roles`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `broker,controller`.
    Combined,
    /// `controller`.
    Controller,
    /// `broker`.
    Broker,
}

impl Role {
    /// Whether the node serves clients.
    pub fn is_broker(self) -> bool {
        matches!(self, Self::Combined | Self::Broker)
    }

    /// Whether the node is a voter of the metadata quorum.
    pub fn is_controller(self) -> bool {
        matches!(self, Self::Combined | Self::Controller)
    }

    fn process_roles(self) -> &'static str {
        match self {
            Self::Combined => "broker,controller",
            Self::Controller => "controller",
            Self::Broker => "broker",
        }
    }
}

/// What to start.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// gregor or Kafka: every node's, unless [`ClusterConfig::node_implementations`] says
    /// otherwise.
    pub implementation: Implementation,
    /// The roles.
    pub layout: Layout,
    /// `key=value` properties added to every node's file after the generated ones (a later
    /// line wins), e.g. shorter `broker.session.timeout.ms` for a test.
    pub properties: Vec<(String, String)>,
    /// Nodes (by node id) that run another implementation than
    /// [`ClusterConfig::implementation`]: a mixed cluster.
    pub node_implementations: Vec<(i32, Implementation)>,
    /// Arguments added to `storage format` of the controllers (whose bootstrap checkpoint
    /// sets the cluster's feature levels), e.g. `--release-version 4.3-IV0` or
    /// `--feature share.version=0`.
    pub controller_format_args: Vec<String>,
}

impl ClusterConfig {
    /// `n` combined nodes of `implementation`.
    pub fn combined(implementation: Implementation, n: usize) -> Self {
        Self::new(implementation, Layout::Combined(n))
    }

    /// Nodes of `implementation` in `layout`, no extra properties.
    pub fn new(implementation: Implementation, layout: Layout) -> Self {
        Self {
            implementation,
            layout,
            properties: Vec::new(),
            node_implementations: Vec::new(),
            controller_format_args: Vec::new(),
        }
    }

    /// Runs node `node_id` on `implementation` (a later call for the same node wins).
    #[must_use]
    pub fn with_node_implementation(
        mut self,
        node_id: i32,
        implementation: Implementation,
    ) -> Self {
        self.node_implementations.push((node_id, implementation));
        self
    }

    /// Adds `args` to `storage format` of the controllers (see
    /// [`ClusterConfig::controller_format_args`]).
    #[must_use]
    pub fn with_controller_format_args(mut self, args: &[&str]) -> Self {
        self.controller_format_args
            .extend(args.iter().map(|a| (*a).to_string()));
        self
    }

    /// The implementation node `node_id` runs.
    pub fn implementation_of(&self, node_id: i32) -> &Implementation {
        self.node_implementations
            .iter()
            .rev()
            .find(|(id, _)| *id == node_id)
            .map_or(&self.implementation, |(_, i)| i)
    }

    /// Whether some node runs another implementation than another node.
    pub fn is_mixed(&self) -> bool {
        self.node_implementations
            .iter()
            .any(|(_, i)| *i != self.implementation)
    }

    /// Adds a property to every node.
    #[must_use]
    pub fn with(mut self, key: &str, value: &str) -> Self {
        self.properties.push((key.to_string(), value.to_string()));
        self
    }
}

/// Options of a cluster beyond its configuration ([`Cluster::start_with`]).
#[derive(Debug, Clone, Default)]
pub struct ClusterOptions {
    /// Put a [`Network`] proxy in front of every listener and advertise the proxies, so that
    /// links can be cut ([`Cluster::network`]).
    pub proxies: bool,
    /// Mount a tmpfs of this many MiB on every node's data directory, so that a node's disk
    /// can be filled ([`Node::fill_disk`]). Needs `mount` to be permitted (root, or
    /// CAP_SYS_ADMIN); [`Cluster::prepare_with`] fails otherwise.
    pub disk_limit_mib: Option<u64>,
    /// JVM options of Kafka nodes instead of the default small heap with the C1 compiler
    /// only (which starts fast but is slow; a benchmark wants the full JIT).
    pub kafka_jvm_opts: Option<Vec<String>>,
    /// Log directories of each node with the broker role (at most 1: `data/` holds the logs
    /// and the metadata log). With more, `log.dirs` is `logs-1/`, `logs-2/`, ... beside
    /// `data/`, which keeps the metadata log (`metadata.log.dir`), each on a tmpfs of its own
    /// with [`ClusterOptions::disk_limit_mib`] ([`Node::log_dirs`], [`Node::fill_dir`]).
    pub log_dirs_per_broker: usize,
    /// Secure the cluster's own traffic (issue 13): see [`InternalSecurity`].
    pub internal_security: Option<InternalSecurity>,
    /// With [`ClusterOptions::internal_security`]: a SASL controller listener instead of SSL
    /// with mTLS (see [`ControllerSasl`]).
    pub controller_sasl: Option<ControllerSasl>,
}

/// The CONTROLLER listener of a cluster with [`InternalSecurity`] on SASL (`SASL_SSL`, or
/// `SASL_PLAINTEXT`) instead of SSL with mTLS: the listener enables `mechanism`, and every node
/// logs in to it as `user` (`sasl.mechanism.controller.protocol` and the listener's JAAS
/// config `username`/`password`). With PLAIN the listener's users are `user` and
/// `other_users`; with SCRAM-SHA-256/512 they are formatted into the controllers with
/// `--add-scram` (KIP-900), which a quorum of one controller can use (voters could not log
/// in to each other before their metadata is loaded).
#[derive(Debug, Clone)]
pub struct ControllerSasl {
    /// `SASL_SSL`, or `SASL_PLAINTEXT` where every node is a broker (a controller-only node
    /// would have no TLS listener for the shared `ssl.*` keys, which gregor refuses).
    pub protocol: &'static str,
    /// `PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`.
    pub mechanism: &'static str,
    /// The nodes' own user.
    pub user: String,
    /// Its password.
    pub password: String,
    /// More users of the listener (for the test's own tools), name and password.
    pub other_users: Vec<(String, String)>,
}

impl ControllerSasl {
    /// The properties that replace [`InternalSecurity`]'s controller listener.
    fn properties(&self) -> Vec<(String, String)> {
        let p = |k: &str, v: String| (k.to_string(), v);
        let lower = self.mechanism.to_ascii_lowercase();
        let jaas = if self.mechanism == "PLAIN" {
            let mut users = format!(" user_{}=\"{}\"", self.user, self.password);
            for (u, pw) in &self.other_users {
                let _ = write!(users, " user_{u}=\"{pw}\"");
            }
            format!(
                "org.apache.kafka.common.security.plain.PlainLoginModule required username=\"{}\" password=\"{}\"{users};",
                self.user, self.password
            )
        } else {
            format!(
                "org.apache.kafka.common.security.scram.ScramLoginModule required username=\"{}\" password=\"{}\";",
                self.user, self.password
            )
        };
        vec![
            p(
                "listener.security.protocol.map",
                format!(
                    "PLAINTEXT:PLAINTEXT,CONTROLLER:{},INTERNAL:SASL_SSL",
                    self.protocol
                ),
            ),
            p(
                "listener.name.controller.sasl.enabled.mechanisms",
                self.mechanism.into(),
            ),
            p("sasl.mechanism.controller.protocol", self.mechanism.into()),
            p(
                &format!("listener.name.controller.{lower}.sasl.jaas.config"),
                jaas,
            ),
        ]
    }

    /// The `--add-scram` arguments of a controller's format.
    fn format_args(&self) -> Vec<String> {
        if self.mechanism == "PLAIN" {
            return Vec::new();
        }
        let mut args = Vec::new();
        for (u, pw) in std::iter::once((&self.user, &self.password))
            .chain(self.other_users.iter().map(|(u, pw)| (u, pw)))
        {
            args.push("--add-scram".to_string());
            args.push(format!("{}=[name={u},password={pw}]", self.mechanism));
        }
        args
    }
}

/// A cluster whose own traffic is secured: the CONTROLLER listener is `SSL` with
/// `ssl.client.auth=required` (mTLS), and every broker has an `INTERNAL` listener on
/// `SASL_SSL` with SCRAM-SHA-512, the inter-broker listener
/// (`sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512`, the user formatted into the
/// controllers with `--add-scram`). Every node uses the same keystore and truststore. The
/// PLAINTEXT listener stays for the test's clients. With it, the harness checks the controller
/// and internal listeners with a TCP connect (not ApiVersions) and asks DescribeQuorum through
/// the brokers.
#[derive(Debug, Clone)]
pub struct InternalSecurity {
    /// A PEM file with a private key (PKCS #8) and its certificate, valid for 127.0.0.1.
    pub keystore: PathBuf,
    /// A PEM file with the CA certificate that signed it.
    pub truststore: PathBuf,
    /// The SCRAM-SHA-512 user of the inter-broker listener.
    pub scram_user: String,
    /// Its password.
    pub scram_password: String,
}

impl InternalSecurity {
    /// The properties of a node with it.
    fn properties(&self) -> Vec<(String, String)> {
        let p = |k: &str, v: String| (k.to_string(), v);
        vec![
            p(
                "listener.security.protocol.map",
                "PLAINTEXT:PLAINTEXT,CONTROLLER:SSL,INTERNAL:SASL_SSL".into(),
            ),
            p("ssl.keystore.type", "PEM".into()),
            p("ssl.keystore.location", self.keystore.display().to_string()),
            p("ssl.truststore.type", "PEM".into()),
            p(
                "ssl.truststore.location",
                self.truststore.display().to_string(),
            ),
            p("listener.name.controller.ssl.client.auth", "required".into()),
            p("sasl.mechanism.inter.broker.protocol", "SCRAM-SHA-512".into()),
            p(
                "listener.name.internal.sasl.enabled.mechanisms",
                "SCRAM-SHA-512".into(),
            ),
            p(
                "listener.name.internal.scram-sha-512.sasl.jaas.config",
                format!(
                    "org.apache.kafka.common.security.scram.ScramLoginModule required username=\"{}\" password=\"{}\";",
                    self.scram_user, self.scram_password
                ),
            ),
        ]
    }
}

impl ClusterOptions {
    /// With secured internal traffic (see [`InternalSecurity`]).
    #[must_use]
    pub fn with_internal_security(mut self, security: InternalSecurity) -> Self {
        self.internal_security = Some(security);
        self
    }

    /// With a SASL controller listener (see [`ControllerSasl`]; needs
    /// [`ClusterOptions::with_internal_security`]).
    #[must_use]
    pub fn with_controller_sasl(mut self, sasl: ControllerSasl) -> Self {
        self.controller_sasl = Some(sasl);
        self
    }

    /// With these JVM options on Kafka nodes (see [`ClusterOptions::kafka_jvm_opts`]).
    #[must_use]
    pub fn with_kafka_jvm_opts(mut self, opts: &[&str]) -> Self {
        self.kafka_jvm_opts = Some(opts.iter().map(|s| (*s).to_string()).collect());
        self
    }

    /// With a proxy in front of every listener (see [`ClusterOptions::proxies`]).
    #[must_use]
    pub fn with_proxies(mut self) -> Self {
        self.proxies = true;
        self
    }

    /// With a size-limited tmpfs per data directory (see [`ClusterOptions::disk_limit_mib`]).
    #[must_use]
    pub fn with_disk_limit_mib(mut self, mib: u64) -> Self {
        self.disk_limit_mib = Some(mib);
        self
    }

    /// With `n` log directories per broker (see [`ClusterOptions::log_dirs_per_broker`]).
    #[must_use]
    pub fn with_log_dirs_per_broker(mut self, n: usize) -> Self {
        self.log_dirs_per_broker = n;
        self
    }
}

/// One node of a [`Cluster`].
pub struct Node {
    /// `node.id`.
    pub node_id: i32,
    /// `process.roles`.
    pub role: Role,
    /// The PLAINTEXT (client) port on 127.0.0.1, on brokers.
    pub client_port: Option<u16>,
    /// The CONTROLLER port on 127.0.0.1, on controllers.
    pub controller_port: Option<u16>,
    /// gregor's `admin.listener` port (HTTP `/metrics`, `/health`), on gregor nodes.
    pub admin_port: Option<u16>,
    /// The node's directory: `server.properties`, `server.log`, `data/`.
    pub dir: PathBuf,
    /// The port of the proxy in front of the PLAINTEXT listener (advertised), when proxied.
    pub client_proxy_port: Option<u16>,
    /// The port of the proxy in front of the CONTROLLER listener (in
    /// `controller.quorum.voters`), when proxied.
    pub controller_proxy_port: Option<u16>,
    implementation: Implementation,
    child: Option<Child>,
    paused: bool,
    pids: Option<PidRegistry>,
    disk_limited: bool,
    /// `log.dirs`: `[data_dir()]`, or [`ClusterOptions::log_dirs_per_broker`] of them.
    log_dirs: Vec<PathBuf>,
    jvm_opts: Vec<String>,
    /// Extra `storage format` arguments ([`ClusterConfig::controller_format_args`]).
    format_args: Vec<String>,
    /// The INTERNAL (SASL_SSL, inter-broker) port on brokers of a cluster with
    /// [`ClusterOptions::internal_security`].
    pub internal_port: Option<u16>,
    security: Option<InternalSecurity>,
    /// [`ClusterOptions::controller_sasl`].
    controller_sasl: Option<ControllerSasl>,
}

impl Node {
    /// The implementation this node runs.
    pub fn implementation(&self) -> &Implementation {
        &self.implementation
    }

    /// `server.properties`.
    pub fn config_file(&self) -> PathBuf {
        self.dir.join("server.properties")
    }

    /// The metadata log dir, and `log.dirs` unless the node has several
    /// ([`ClusterOptions::log_dirs_per_broker`]).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// `log.dirs`, in order.
    pub fn log_dirs(&self) -> &[PathBuf] {
        &self.log_dirs
    }

    /// The node's stdout and stderr, appended to across restarts.
    pub fn log_file(&self) -> PathBuf {
        self.dir.join("server.log")
    }

    /// `127.0.0.1:<client port>` on a broker.
    pub fn bootstrap(&self) -> Option<String> {
        self.client_port.map(|p| format!("127.0.0.1:{p}"))
    }

    /// `127.0.0.1:<controller port>` on a controller.
    pub fn controller_endpoint(&self) -> Option<String> {
        self.controller_port.map(|p| format!("127.0.0.1:{p}"))
    }

    /// The process id while the node runs (also while it is paused).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process was started and has not exited (a paused node is running).
    ///
    /// # Errors
    /// When the process state cannot be read.
    pub fn is_running(&mut self) -> Result<bool> {
        match self.child.as_mut() {
            None => Ok(false),
            Some(c) => Ok(c.try_wait()?.is_none()),
        }
    }

    /// Whether the node is stopped with SIGSTOP.
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// The last `lines` lines of the node's log.
    pub fn log_tail(&self, lines: usize) -> String {
        process::tail(&self.log_file(), lines)
    }

    /// Errors (with the tail of its log) when the node was started and has exited.
    ///
    /// # Errors
    /// When the process has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        if let Some(c) = self.child.as_mut() {
            if let Some(status) = c.try_wait()? {
                bail!(
                    "{} node {} exited with {status}; last lines of {} (backtrace frames left out):\n{}",
                    self.implementation.name(),
                    self.node_id,
                    self.log_file().display(),
                    without_backtrace_frames(&self.log_tail(400), 40)
                );
            }
        }
        Ok(())
    }

    fn properties(&self, voters: &str, brokers: usize, extra: &[(String, String)]) -> String {
        let mut listeners = Vec::new();
        if let Some(p) = self.client_port {
            listeners.push(format!("PLAINTEXT://127.0.0.1:{p}"));
        }
        if let Some(p) = self.controller_port {
            listeners.push(format!("CONTROLLER://127.0.0.1:{p}"));
        }
        if let Some(p) = self.internal_port {
            listeners.push(format!("INTERNAL://127.0.0.1:{p}"));
        }
        // Internal topics as replicated as the cluster allows, as a production cluster.
        let rf = brokers.clamp(1, 3);
        let min_isr = rf.min(2);
        let mut lines = vec![
            format!(
                "# Generated by gregor_tests::cluster: node {} of a {} cluster.",
                self.node_id,
                self.implementation.name()
            ),
            format!("node.id={}", self.node_id),
            format!("process.roles={}", self.role.process_roles()),
            format!("controller.quorum.voters={voters}"),
            format!("listeners={}", listeners.join(",")),
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT".into(),
            "controller.listener.names=CONTROLLER".into(),
            format!(
                "log.dirs={}",
                self.log_dirs
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            "num.partitions=1".into(),
            format!("offsets.topic.replication.factor={rf}"),
            format!("transaction.state.log.replication.factor={rf}"),
            format!("transaction.state.log.min.isr={min_isr}"),
            format!("share.coordinator.state.topic.replication.factor={rf}"),
            format!("share.coordinator.state.topic.min.isr={min_isr}"),
            "group.initial.rebalance.delay.ms=0".into(),
        ];
        let mut advertised = Vec::new();
        if let Some(p) = self.client_proxy_port.or(self.client_port) {
            advertised.push(format!("PLAINTEXT://127.0.0.1:{p}"));
            if self.internal_port.is_none() {
                lines.push("inter.broker.listener.name=PLAINTEXT".into());
            }
        }
        if let Some(p) = self.internal_port {
            advertised.push(format!("INTERNAL://127.0.0.1:{p}"));
            lines.push("inter.broker.listener.name=INTERNAL".into());
        }
        if let Some(security) = &self.security {
            // Later lines win: this replaces the PLAINTEXT-only protocol map above.
            for (k, v) in security.properties() {
                // A SASL controller listener authenticates with SASL, not a client
                // certificate (and a SASL_PLAINTEXT one has no TLS keys at all).
                if self.controller_sasl.is_some() && k == "listener.name.controller.ssl.client.auth"
                {
                    continue;
                }
                lines.push(format!("{k}={v}"));
            }
            for (k, v) in self
                .controller_sasl
                .iter()
                .flat_map(ControllerSasl::properties)
            {
                lines.push(format!("{k}={v}"));
            }
        }
        // Behind a proxy the controller listener is advertised too: Kafka 4's followers fetch
        // from the endpoint the leader advertises (KIP-853), not from controller.quorum.voters.
        if let Some(p) = self.controller_proxy_port {
            advertised.push(format!("CONTROLLER://127.0.0.1:{p}"));
        }
        if !advertised.is_empty() {
            lines.push(format!("advertised.listeners={}", advertised.join(",")));
        }
        if let Some(p) = self.admin_port {
            lines.push(format!("admin.listener=127.0.0.1:{p}"));
        }
        for (k, v) in extra {
            lines.push(format!("{k}={v}"));
        }
        if self.log_dirs != [self.data_dir()] {
            lines.push(format!("metadata.log.dir={}", self.data_dir().display()));
        }
        let mut out = String::new();
        for l in lines {
            let _ = writeln!(out, "{l}");
        }
        out
    }

    fn format_command(&self, cluster_id: &str) -> Result<Command> {
        let mut args = vec![
            "format".to_string(),
            "-t".into(),
            cluster_id.into(),
            "-c".into(),
            self.config_file().display().to_string(),
        ];
        args.extend(self.format_args.iter().cloned());
        Ok(match &self.implementation {
            Implementation::Kafka => reference::tool_command("kafka-storage", &args)?,
            Implementation::Gregor(bin) => {
                let mut c = Command::new(bin);
                c.arg("storage").args(args);
                c
            }
        })
    }

    /// Starts the process on the node's directories (formatted already); does not wait.
    ///
    /// # Errors
    /// When it is already running or cannot be spawned.
    pub fn spawn(&mut self) -> Result<()> {
        ensure!(
            !self.is_running()?,
            "node {} is already running",
            self.node_id
        );
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_file())
            .with_context(|| format!("opening {}", self.log_file().display()))?;
        let mut cmd = match &self.implementation {
            Implementation::Kafka => {
                let opts: Vec<&str> = self.jvm_opts.iter().map(String::as_str).collect();
                reference::server_command(&self.config_file(), &opts)?
            }
            Implementation::Gregor(bin) => {
                let mut c = Command::new(bin);
                c.arg("serve").arg("--config").arg(self.config_file());
                c
            }
        };
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = cmd.spawn().with_context(|| {
            format!(
                "starting {} node {} ({})",
                self.implementation.name(),
                self.node_id,
                process::display_command(&cmd)
            )
        })?;
        if let Some(r) = &self.pids {
            r.set(self.node_id, Some(child.id()));
        }
        self.child = Some(child);
        self.paused = false;
        Ok(())
    }

    /// Forgets the process (it has exited or been killed).
    fn forget_child(&mut self) {
        self.child = None;
        self.paused = false;
        if let Some(r) = &self.pids {
            r.set(self.node_id, None);
        }
    }

    /// Fills the node's data directory (a tmpfs of [`ClusterOptions::disk_limit_mib`]) with a
    /// file `disk-filler` until the device is full: every later write of the node fails with
    /// ENOSPC. Returns the bytes written.
    ///
    /// # Errors
    /// When the cluster has no disk limit (filling the machine's disk is not a test), or the
    /// file cannot be created.
    pub fn fill_disk(&self) -> Result<u64> {
        self.fill_dir(&self.data_dir())
    }

    /// [`Node::fill_disk`] for one of the node's directories ([`Node::data_dir`] or one of
    /// [`Node::log_dirs`]), each a tmpfs of its own.
    ///
    /// # Errors
    /// As [`Node::fill_disk`].
    pub fn fill_dir(&self, dir: &Path) -> Result<u64> {
        ensure!(
            self.disk_limited,
            "node {} has no size-limited data directory (ClusterOptions::disk_limit_mib)",
            self.node_id
        );
        ensure!(
            dir == self.data_dir() || self.log_dirs.iter().any(|d| d == dir),
            "{} is none of node {}'s directories",
            dir.display(),
            self.node_id
        );
        let path = dir.join("disk-filler");
        let mut f =
            std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        let chunk = vec![0u8; 1 << 20];
        let mut written = 0u64;
        loop {
            match std::io::Write::write(&mut f, &chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => written += n as u64,
            }
        }
        Ok(written)
    }

    /// Removes the file of [`Node::fill_disk`]: the disk has room again.
    ///
    /// # Errors
    /// When it exists and cannot be removed.
    pub fn free_disk(&self) -> Result<()> {
        self.free_dir(&self.data_dir())
    }

    /// Removes the file of [`Node::fill_dir`] from `dir`.
    ///
    /// # Errors
    /// When it exists and cannot be removed.
    pub fn free_dir(&self, dir: &Path) -> Result<()> {
        let path = dir.join("disk-filler");
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(e).with_context(|| format!("removing {}", path.display()))
            }
            _ => Ok(()),
        }
    }

    /// kill -9: no flush, no controlled shutdown. Waits until the process is gone.
    ///
    /// # Errors
    /// When the process cannot be signalled or reaped.
    pub fn kill9(&mut self) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        // SIGKILL also ends a stopped process.
        child.kill().ok();
        child
            .wait()
            .with_context(|| format!("reaping node {}", self.node_id))?;
        self.forget_child();
        Ok(())
    }

    /// SIGSTOP: the process freezes (no heartbeats, no answers, its sockets stay open).
    /// Returns once every thread is stopped ([`process::wait_stopped`]), so nothing the test
    /// does afterwards is seen by the node.
    ///
    /// # Errors
    /// When the node is not running, cannot be signalled, or does not stop within 10 s.
    pub fn pause(&mut self) -> Result<()> {
        let pid = self.pid().context("pausing a node that is not running")?;
        process::signal(pid, "STOP")?;
        self.paused = true;
        process::wait_stopped(pid, Duration::from_secs(10))
            .with_context(|| format!("pausing node {}", self.node_id))
    }

    /// SIGCONT after [`Node::pause`].
    ///
    /// # Errors
    /// When the node is not running or cannot be signalled.
    pub fn resume(&mut self) -> Result<()> {
        let pid = self.pid().context("resuming a node that is not running")?;
        process::signal(pid, "CONT")?;
        self.paused = false;
        Ok(())
    }

    /// Graceful stop: SIGTERM (after SIGCONT if paused) and wait up to [`STOP_TIMEOUT`] for the
    /// process to exit. Fails when it must be killed or exits uncleanly.
    ///
    /// # Errors
    /// When the process does not exit in time (it is then killed) or exits uncleanly.
    pub fn stop(&mut self) -> Result<()> {
        let pid = self.begin_stop()?;
        self.finish_stop(pid, Instant::now() + STOP_TIMEOUT)
    }

    /// Sends SIGTERM; [`Node::finish_stop`] waits. Lets a cluster stop its nodes together.
    fn begin_stop(&mut self) -> Result<Option<u32>> {
        let Some(pid) = self.pid() else {
            return Ok(None);
        };
        if self.paused {
            self.resume()?;
        }
        process::signal(pid, "TERM")?;
        Ok(Some(pid))
    }

    fn finish_stop(&mut self, pid: Option<u32>, deadline: Instant) -> Result<()> {
        let Some(pid) = pid else {
            return Ok(());
        };
        let Some(child) = self.child.as_mut() else {
            return Ok(());
        };
        loop {
            if let Some(status) = child.try_wait()? {
                self.forget_child();
                ensure!(
                    self.implementation.clean_term_exit(status),
                    "node {} (pid {pid}) exited with {status} on SIGTERM; last lines of its log:\n{}",
                    self.node_id,
                    self.log_tail(40)
                );
                return Ok(());
            }
            if Instant::now() > deadline {
                self.kill9()?;
                bail!(
                    "node {} (pid {pid}) did not exit within {STOP_TIMEOUT:?} of SIGTERM and was \
                     killed; last lines of its log:\n{}",
                    self.node_id,
                    self.log_tail(40)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until every listener of the node answers ApiVersions (not that it has joined
    /// the cluster: [`Cluster::wait_ready`] checks that).
    ///
    /// # Errors
    /// When the process exits or `timeout` passes; with the tail of its log.
    pub fn wait_listening(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            self.check_alive()?;
            if self.listeners_answer() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "node {} did not answer ApiVersions within {timeout:?}; last lines of its log:\n{}",
                    self.node_id,
                    self.log_tail(40)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Whether every listener of the node answers ApiVersions (the secured ones of
    /// [`ClusterOptions::internal_security`]: accept a TCP connection).
    fn listeners_answer(&self) -> bool {
        let (plain, secured) = if self.security.is_some() {
            (
                vec![self.client_port],
                vec![self.controller_port, self.internal_port],
            )
        } else {
            (vec![self.client_port, self.controller_port], Vec::new())
        };
        plain
            .into_iter()
            .flatten()
            .all(|p| api_versions_ok(SocketAddr::from(([127, 0, 0, 1], p)), 1_000).is_ok())
            && secured.into_iter().flatten().all(|p| {
                std::net::TcpStream::connect_timeout(
                    &SocketAddr::from(([127, 0, 0, 1], p)),
                    Duration::from_secs(1),
                )
                .is_ok()
            })
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Err(e) = self.kill9() {
            eprintln!("warning: killing node {}: {e:#}", self.node_id);
        }
    }
}

/// What DescribeQuorum says about the metadata quorum (`kafka-metadata-quorum describe
/// --status` prints the same fields).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuorumStatus {
    /// `LeaderId`: the active controller.
    pub leader_id: i32,
    /// `LeaderEpoch`.
    pub leader_epoch: i32,
    /// `HighWatermark` of `__cluster_metadata-0`.
    pub high_watermark: i64,
    /// `CurrentVoters`: node ids.
    pub voters: Vec<i32>,
    /// `CurrentObservers`: node ids (brokers that fetch the metadata log).
    pub observers: Vec<i32>,
}

impl QuorumStatus {
    /// Parses the output of `kafka-metadata-quorum describe --status`: `Key: value` lines;
    /// `CurrentVoters`/`CurrentObservers` are Kafka 4's JSON lists of `{"id": N, ...}`
    /// objects (or Kafka 3's `[1,2,3]`).
    ///
    /// # Errors
    /// When `LeaderId`, `LeaderEpoch`, `HighWatermark` or `CurrentVoters` is missing or not a
    /// number.
    pub fn parse_tool_output(text: &str) -> Result<Self> {
        let field = |key: &str| -> Option<&str> {
            text.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == key).then(|| v.trim())
            })
        };
        let number = |key: &str| -> Result<i64> {
            field(key)
                .with_context(|| format!("no {key} in:\n{text}"))?
                .parse()
                .with_context(|| format!("{key} is not a number in:\n{text}"))
        };
        let voters =
            field("CurrentVoters").with_context(|| format!("no CurrentVoters in:\n{text}"))?;
        Ok(Self {
            leader_id: i32::try_from(number("LeaderId")?)?,
            leader_epoch: i32::try_from(number("LeaderEpoch")?)?,
            high_watermark: number("HighWatermark")?,
            voters: parse_node_ids(voters)?,
            observers: field("CurrentObservers").map_or(Ok(Vec::new()), parse_node_ids)?,
        })
    }
}

/// The node ids in a `CurrentVoters` value: `"id": N` fields, else bare numbers.
fn parse_node_ids(list: &str) -> Result<Vec<i32>> {
    let mut ids = Vec::new();
    if list.contains("\"id\"") {
        for part in list.split("\"id\"").skip(1) {
            let digits: String = part
                .trim_start_matches([':', ' '])
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '-')
                .collect();
            ids.push(
                digits
                    .parse()
                    .with_context(|| format!("bad id in {list}"))?,
            );
        }
    } else {
        for n in list
            .trim_matches(|c| c == '[' || c == ']')
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
        {
            ids.push(n.parse().with_context(|| format!("bad id in {list}"))?);
        }
    }
    Ok(ids)
}

/// A running cluster. Dropping it kills every node and deletes its directories.
pub struct Cluster {
    /// The cluster id every node was formatted with.
    pub cluster_id: String,
    /// gregor or Kafka.
    pub implementation: Implementation,
    nodes: Vec<Node>,
    /// `controller.quorum.voters`.
    voters: String,
    /// The proxies, when [`ClusterOptions::proxies`] (dropped after the processes).
    network: Option<Network>,
    /// The tmpfs mounts, unmounted after the processes are gone.
    _mounts: Mounts,
    // Last: the directories go after the processes that use them.
    root: tempfile::TempDir,
}

/// tmpfs mounts, unmounted when dropped.
struct Mounts(Vec<PathBuf>);

impl Drop for Mounts {
    fn drop(&mut self) {
        for dir in &self.0 {
            match Command::new("umount").arg(dir).status() {
                Ok(s) if s.success() => {}
                other => eprintln!("warning: umount {}: {other:?}", dir.display()),
            }
        }
    }
}

/// A test that panics with a cluster up gets the tails of its nodes' logs on stderr (the
/// process kills the nodes next, in [`Node`]'s drop), so a failure in CI says what the
/// nodes saw.
impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "---- the cluster's logs when the test panicked ----\n{}",
                self.logs(60)
            );
        }
    }
}

impl Cluster {
    /// Allocates ports, writes the properties, formats every node with one new cluster id,
    /// starts every node and waits until the cluster is ready ([`Cluster::wait_ready`]).
    ///
    /// # Errors
    /// When a layout is empty, a format fails, a node exits or the cluster is not ready
    /// within [`READY_TIMEOUT`]; the error carries the logs' tails.
    pub fn start(config: &ClusterConfig) -> Result<Self> {
        Self::start_with(config, &ClusterOptions::default())
    }

    /// [`Cluster::start`] with `options` (proxies, size-limited disks, JVM options).
    ///
    /// # Errors
    /// As [`Cluster::start`], and when a tmpfs cannot be mounted or a proxy port bound.
    pub fn start_with(config: &ClusterConfig, options: &ClusterOptions) -> Result<Self> {
        let started = Instant::now();
        let mut cluster = Self::prepare_with(config, options)?;
        cluster.format()?;
        let formatted_ms = started.elapsed().as_millis();
        for n in &mut cluster.nodes {
            n.spawn()?;
        }
        cluster.wait_ready(READY_TIMEOUT)?;
        eprintln!(
            "{} cluster {:?} in {}: formatted in {formatted_ms} ms, ready {} ms after the start",
            cluster.implementation.name(),
            config.layout,
            cluster.root().display(),
            started.elapsed().as_millis()
        );
        Ok(cluster)
    }

    /// Ports, directories and properties, without formatting or starting anything.
    ///
    /// # Errors
    /// When the layout has no controller or no broker, or a file cannot be written.
    pub fn prepare(config: &ClusterConfig) -> Result<Self> {
        Self::prepare_with(config, &ClusterOptions::default())
    }

    /// [`Cluster::prepare`] with `options`.
    ///
    /// # Errors
    /// As [`Cluster::prepare`], and when a tmpfs cannot be mounted or a proxy port bound.
    pub fn prepare_with(config: &ClusterConfig, options: &ClusterOptions) -> Result<Self> {
        let roles = config.layout.roles();
        ensure!(
            roles.iter().any(|r| r.is_controller()) && roles.iter().any(|r| r.is_broker()),
            "a cluster needs at least one controller and one broker: {:?}",
            config.layout
        );
        for (id, _) in &config.node_implementations {
            ensure!(
                usize::try_from(*id).is_ok_and(|i| (1..=roles.len()).contains(&i)),
                "an implementation for node {id}, which {:?} does not have",
                config.layout
            );
        }
        let is_gregor = |i: usize| {
            i32::try_from(i + 1)
                .is_ok_and(|id| matches!(config.implementation_of(id), Implementation::Gregor(_)))
        };
        let per_listener = if options.proxies { 2 } else { 1 };
        let secured = options.internal_security.is_some();
        let wanted: usize = roles
            .iter()
            .enumerate()
            .map(|(i, r)| {
                per_listener * (usize::from(r.is_broker()) + usize::from(r.is_controller()))
                    + usize::from(is_gregor(i))
                    + usize::from(secured && r.is_broker())
            })
            .sum();
        let mut ports = process::free_ports(wanted)?.into_iter();
        let root = tempfile::Builder::new()
            .prefix(&format!(
                "gregor-cluster-{}{}-",
                config.implementation.name(),
                if config.is_mixed() { "-mixed" } else { "" }
            ))
            .tempdir()
            .context("creating the cluster directory")?;
        let network = options.proxies.then(Network::new);
        let mut mounts = Mounts(Vec::new());
        let mut nodes = Vec::new();
        for (i, role) in roles.iter().enumerate() {
            let node_id = i32::try_from(i + 1)?;
            let dir = root.path().join(format!("node-{node_id}"));
            let log_dirs: Vec<PathBuf> = if role.is_broker() && options.log_dirs_per_broker > 1 {
                (1..=options.log_dirs_per_broker)
                    .map(|i| dir.join(format!("logs-{i}")))
                    .collect()
            } else {
                vec![dir.join("data")]
            };
            let mut dirs = vec![dir.join("data")];
            dirs.extend(log_dirs.iter().filter(|d| **d != dir.join("data")).cloned());
            for data in dirs {
                std::fs::create_dir_all(&data)
                    .with_context(|| format!("creating {}", data.display()))?;
                let Some(mib) = options.disk_limit_mib else {
                    continue;
                };
                let out = Command::new("mount")
                    .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
                    .arg(&data)
                    .output()
                    .context("running mount")?;
                ensure!(
                    out.status.success(),
                    "mounting a {mib} MiB tmpfs on {} failed ({}): {} (a size-limited data \
                     directory needs mount, i.e. root or CAP_SYS_ADMIN)",
                    data.display(),
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                );
                mounts.0.push(data);
            }
            let client_port = role.is_broker().then(|| ports.next()).flatten();
            let controller_port = role.is_controller().then(|| ports.next()).flatten();
            let (client_proxy_port, controller_proxy_port) = if options.proxies {
                (
                    client_port.and_then(|_| ports.next()),
                    controller_port.and_then(|_| ports.next()),
                )
            } else {
                (None, None)
            };
            nodes.push(Node {
                node_id,
                role: *role,
                client_port,
                controller_port,
                admin_port: is_gregor(i).then(|| ports.next()).flatten(),
                dir,
                client_proxy_port,
                controller_proxy_port,
                implementation: config.implementation_of(node_id).clone(),
                child: None,
                paused: false,
                pids: network.as_ref().map(Network::pid_registry),
                disk_limited: options.disk_limit_mib.is_some(),
                log_dirs,
                jvm_opts: options
                    .kafka_jvm_opts
                    .clone()
                    .unwrap_or_else(|| KAFKA_JVM_OPTS.iter().map(|s| (*s).to_string()).collect()),
                format_args: if role.is_controller() {
                    let mut args = config.controller_format_args.clone();
                    if let Some(sec) = &options.internal_security {
                        args.push("--add-scram".into());
                        args.push(format!(
                            "SCRAM-SHA-512=[name={},password={}]",
                            sec.scram_user, sec.scram_password
                        ));
                        if let Some(c) = &options.controller_sasl {
                            args.extend(c.format_args());
                        }
                    }
                    args
                } else {
                    Vec::new()
                },
                internal_port: (secured && role.is_broker())
                    .then(|| ports.next())
                    .flatten(),
                security: options.internal_security.clone(),
                controller_sasl: options
                    .controller_sasl
                    .clone()
                    .filter(|_| options.internal_security.is_some()),
            });
        }
        let mut network = network;
        if let Some(net) = network.as_mut() {
            for n in &nodes {
                if let (Some(proxy), Some(real)) = (n.client_proxy_port, n.client_port) {
                    net.add_proxy(n.node_id, Listener::Broker, proxy, real)?;
                }
                if let (Some(proxy), Some(real)) = (n.controller_proxy_port, n.controller_port) {
                    net.add_proxy(n.node_id, Listener::Controller, proxy, real)?;
                }
            }
        }
        let voters = nodes
            .iter()
            .filter_map(|n| {
                let port = n.controller_proxy_port.or(n.controller_port)?;
                Some(format!("{}@127.0.0.1:{port}", n.node_id))
            })
            .collect::<Vec<_>>()
            .join(",");
        let brokers = roles.iter().filter(|r| r.is_broker()).count();
        for n in &nodes {
            let text = n.properties(&voters, brokers, &config.properties);
            std::fs::write(n.config_file(), text)
                .with_context(|| format!("writing {}", n.config_file().display()))?;
        }
        Ok(Self {
            cluster_id: reference::random_cluster_id()?,
            implementation: config.implementation.clone(),
            nodes,
            voters,
            network,
            _mounts: mounts,
            root,
        })
    }

    /// Formats every node's storage with [`Cluster::cluster_id`] (`kafka-storage format` or
    /// `gregor storage format`), all nodes at once.
    ///
    /// # Errors
    /// When a format fails (with its output).
    pub fn format(&self) -> Result<()> {
        std::thread::scope(|s| {
            let handles: Vec<_> = self
                .nodes
                .iter()
                .map(|n| {
                    s.spawn(move || -> Result<()> {
                        let mut cmd = n.format_command(&self.cluster_id)?;
                        let out = cmd.stdin(Stdio::null()).output().with_context(|| {
                            format!("running {}", process::display_command(&cmd))
                        })?;
                        ensure!(
                            out.status.success(),
                            "{} failed ({}):\n{}{}",
                            process::display_command(&cmd),
                            out.status,
                            String::from_utf8_lossy(&out.stdout),
                            String::from_utf8_lossy(&out.stderr)
                        );
                        Ok(())
                    })
                })
                .collect();
            for h in handles {
                h.join()
                    .map_err(|_| anyhow::anyhow!("a format thread panicked"))??;
            }
            Ok(())
        })
    }

    /// The directory holding every node's directory.
    pub fn root(&self) -> &Path {
        self.root.path()
    }

    /// `controller.quorum.voters`.
    pub fn voters(&self) -> &str {
        &self.voters
    }

    /// The proxies in front of the listeners, when started with [`ClusterOptions::proxies`]:
    /// cut and heal links between nodes.
    pub fn network(&self) -> Option<&Network> {
        self.network.as_ref()
    }

    /// Every node, in node id order.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The node with `node_id`.
    ///
    /// # Panics
    /// When there is no such node (a test's mistake).
    pub fn node(&self, node_id: i32) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.node_id == node_id)
            .unwrap_or_else(|| panic!("no node {node_id}"))
    }

    /// The node with `node_id`, to signal or restart it.
    ///
    /// # Panics
    /// When there is no such node (a test's mistake).
    pub fn node_mut(&mut self, node_id: i32) -> &mut Node {
        self.nodes
            .iter_mut()
            .find(|n| n.node_id == node_id)
            .unwrap_or_else(|| panic!("no node {node_id}"))
    }

    /// The node ids of the brokers.
    pub fn broker_ids(&self) -> Vec<i32> {
        self.nodes
            .iter()
            .filter(|n| n.role.is_broker())
            .map(|n| n.node_id)
            .collect()
    }

    /// The client bootstrap string: every broker's `127.0.0.1:<port>`, comma-separated.
    pub fn bootstrap(&self) -> String {
        self.nodes
            .iter()
            .filter_map(Node::bootstrap)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The client bootstrap string of the brokers that are running (and not paused).
    ///
    /// # Errors
    /// When no broker runs or a process state cannot be read.
    pub fn bootstrap_of_running(&mut self) -> Result<String> {
        let mut out = Vec::new();
        for n in &mut self.nodes {
            if n.is_running()? && !n.paused {
                out.extend(n.bootstrap());
            }
        }
        ensure!(!out.is_empty(), "no broker is running");
        Ok(out.join(","))
    }

    /// The bootstrap string of the controllers (`--bootstrap-controller`, KIP-919).
    pub fn bootstrap_controllers(&self) -> String {
        self.nodes
            .iter()
            .filter_map(Node::controller_endpoint)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The tail of every node's log, for a failure message.
    pub fn logs(&self, lines: usize) -> String {
        let mut out = String::new();
        for n in &self.nodes {
            let _ = write!(
                out,
                "\n---- node {} ({:?}, pid {:?}) {} ----\n{}",
                n.node_id,
                n.role,
                n.pid(),
                n.log_file().display(),
                n.log_tail(lines)
            );
        }
        out
    }

    /// DescribeQuorum (v2, else v0) sent to each running controller in turn: the first
    /// answer without error (only the leader answers one; the others say
    /// NOT_LEADER_OR_FOLLOWER). `Ok(None)` when no controller knows a leader.
    ///
    /// # Errors
    /// Never for an unreachable or silent controller (that is `None`); only for a response
    /// that cannot be decoded.
    pub fn describe_quorum(&mut self) -> Result<Option<QuorumStatus>> {
        // Secured controller listeners: through the brokers, which forward it on their
        // controller channel (over mTLS).
        if self.nodes.iter().any(|n| n.security.is_some()) {
            for n in &mut self.nodes {
                if !n.role.is_broker() || n.paused || !n.is_running()? {
                    continue;
                }
                let Some(port) = n.client_port else {
                    continue;
                };
                if let Some(s) = describe_quorum_at(SocketAddr::from(([127, 0, 0, 1], port))) {
                    return Ok(Some(s));
                }
            }
            return Ok(None);
        }
        for n in &mut self.nodes {
            if !n.role.is_controller() || n.paused || !n.is_running()? {
                continue;
            }
            let Some(port) = n.controller_port else {
                continue;
            };
            if let Some(s) = describe_quorum_at(SocketAddr::from(([127, 0, 0, 1], port))) {
                return Ok(Some(s));
            }
        }
        Ok(None)
    }

    /// DescribeQuorum sent to node `node_id`'s own controller listener (not through a proxy):
    /// what that node says, `None` when it is not the leader or cannot be reached.
    pub fn describe_quorum_at_node(&self, node_id: i32) -> Option<QuorumStatus> {
        let port = self.node(node_id).controller_port?;
        describe_quorum_at(SocketAddr::from(([127, 0, 0, 1], port)))
    }

    /// DescribeQuorum sent to node `node_id`'s broker (client) listener, which forwards it to
    /// the active controller (as Kafka's brokers do): `None` when the node is not a broker,
    /// cannot be reached or answers with an error.
    pub fn describe_quorum_through_broker(&self, node_id: i32) -> Option<QuorumStatus> {
        let port = self.node(node_id).client_port?;
        describe_quorum_at(SocketAddr::from(([127, 0, 0, 1], port)))
    }

    /// Runs `kafka-metadata-quorum --bootstrap-controller <controllers> describe --status`
    /// (Kafka's tool, whatever the implementation) and parses its output.
    ///
    /// # Errors
    /// When the tool fails or prints something [`QuorumStatus::parse_tool_output`] refuses.
    pub fn describe_quorum_tool(&self) -> Result<QuorumStatus> {
        let running: Vec<String> = self
            .nodes
            .iter()
            .filter(|n| n.child.is_some() && !n.paused)
            .filter_map(Node::controller_endpoint)
            .collect();
        let out = reference::tool_command(
            "kafka-metadata-quorum",
            &[
                "--bootstrap-controller".into(),
                running.join(","),
                "describe".into(),
                "--status".into(),
            ],
        )?
        .stdin(Stdio::null())
        .output()
        .context("running kafka-metadata-quorum")?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        ensure!(
            out.status.success(),
            "kafka-metadata-quorum describe --status failed ({}):\n{stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        QuorumStatus::parse_tool_output(&stdout)
    }

    /// Polls [`Cluster::describe_quorum`] until `accept` takes the status, or `timeout`.
    ///
    /// # Errors
    /// When the timeout passes (with the last status seen).
    pub fn wait_for_quorum(
        &mut self,
        timeout: Duration,
        accept: impl Fn(&QuorumStatus) -> bool,
    ) -> Result<QuorumStatus> {
        let deadline = Instant::now() + timeout;
        let mut last = None;
        loop {
            if let Some(s) = self.describe_quorum()? {
                if accept(&s) {
                    return Ok(s);
                }
                last = Some(s);
            }
            if Instant::now() > deadline {
                bail!("no acceptable quorum status within {timeout:?}; last: {last:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The active controller's node id (the quorum leader), waiting up to 30 s for one.
    ///
    /// # Errors
    /// When there is no leader within 30 s.
    pub fn active_controller(&mut self) -> Result<i32> {
        Ok(self
            .wait_for_quorum(Duration::from_secs(30), |s| s.leader_id >= 0)?
            .leader_id)
    }

    /// The broker ids in the Metadata response (v12, no topics) of the first running broker
    /// that answers within 2 s (Kafka lists the registered, unfenced brokers); `None` when
    /// none answers.
    ///
    /// # Errors
    /// When a node's state cannot be read.
    pub fn metadata_broker_ids(&mut self) -> Result<Option<BTreeSet<i32>>> {
        for n in &mut self.nodes {
            if !n.role.is_broker() || n.paused || !n.is_running()? {
                continue;
            }
            let Some(port) = n.client_port else {
                continue;
            };
            let Ok(mut conn) = KafkaConn::connect_timeout(
                SocketAddr::from(([127, 0, 0, 1], port)),
                Duration::from_secs(2),
                "gregor-cluster",
            ) else {
                continue;
            };
            let req = MetadataRequest::default().with_topics(Some(Vec::new()));
            if let Ok(resp) = conn.call::<_, MetadataResponse>(ApiKey::Metadata, 12, &req) {
                return Ok(Some(resp.brokers.iter().map(|b| b.node_id.0).collect()));
            }
        }
        Ok(None)
    }

    /// Waits until every running node answers ApiVersions on each of its listeners, the
    /// quorum has a leader, and the Metadata response lists every running broker.
    ///
    /// # Errors
    /// When a node exits or the timeout passes; with every node's log tail.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut waiting_for;
        loop {
            for n in &mut self.nodes {
                n.check_alive()?;
            }
            let mut running = BTreeSet::new();
            let mut listening = true;
            for n in &mut self.nodes {
                if n.is_running()? && !n.paused {
                    listening &= n.listeners_answer();
                    if n.role.is_broker() {
                        running.insert(n.node_id);
                    }
                }
            }
            if !listening {
                waiting_for = "every listener to answer ApiVersions".to_string();
            } else if self.describe_quorum()?.is_none_or(|s| s.leader_id < 0) {
                waiting_for = "a quorum leader (DescribeQuorum)".to_string();
            } else {
                match self.metadata_broker_ids()? {
                    Some(ids) if running.is_subset(&ids) => return Ok(()),
                    ids => {
                        waiting_for =
                            format!("brokers {running:?} in the Metadata response (got {ids:?})");
                    }
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "the {} cluster was not ready within {timeout:?}: waiting for {waiting_for}{}",
                    self.implementation.name(),
                    self.logs(30)
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// [`process::poll`] until `check` returns `Some`, for at most `timeout`; panics naming
    /// `what`, with the last lines of every node's log (tests).
    pub fn wait_for<T>(
        &self,
        timeout: Duration,
        what: &str,
        check: impl FnMut() -> Option<T>,
    ) -> T {
        process::poll(timeout, check)
            .unwrap_or_else(|| panic!("timed out waiting for {what}\n{}", self.logs(300)))
    }

    /// Restarts node `node_id` on its directories (after a kill or stop) and waits until the
    /// cluster is ready again.
    ///
    /// # Errors
    /// As [`Node::spawn`] and [`Cluster::wait_ready`].
    pub fn restart_node(&mut self, node_id: i32) -> Result<()> {
        let node = self.node_mut(node_id);
        if node.is_running()? {
            node.stop()?;
        }
        node.spawn()?;
        self.wait_ready(READY_TIMEOUT)
    }

    /// Stops every node gracefully (SIGTERM to all, then waits for all).
    ///
    /// # Errors
    /// When a node does not stop cleanly (every node is stopped or killed anyway).
    pub fn stop_all(&mut self) -> Result<()> {
        let mut pids = Vec::new();
        for n in &mut self.nodes {
            pids.push(n.begin_stop()?);
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        let mut first_error = None;
        for (n, pid) in self.nodes.iter_mut().zip(pids) {
            if let Err(e) = n.finish_stop(pid, deadline) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// kill -9 of every node.
    ///
    /// # Errors
    /// When a process cannot be reaped.
    pub fn kill_all(&mut self) -> Result<()> {
        for n in &mut self.nodes {
            n.kill9()?;
        }
        Ok(())
    }

    /// Starts every node that is not running, all at once, and waits until ready.
    ///
    /// # Errors
    /// As [`Cluster::wait_ready`].
    pub fn start_all(&mut self) -> Result<()> {
        for n in &mut self.nodes {
            if !n.is_running()? {
                n.spawn()?;
            }
        }
        self.wait_ready(READY_TIMEOUT)
    }
}

/// DescribeQuorum for `__cluster_metadata-0` at one controller; `None` when it cannot be
/// reached or is not the leader.
fn describe_quorum_at(addr: SocketAddr) -> Option<QuorumStatus> {
    for version in [2, 0] {
        let Ok(mut conn) =
            KafkaConn::connect_timeout(addr, Duration::from_secs(1), "gregor-cluster")
        else {
            return None;
        };
        let mut partition = describe_quorum_request::PartitionData::default();
        partition.partition_index = 0;
        let mut topic = describe_quorum_request::TopicData::default();
        topic.topic_name = TopicName(sb(METADATA_TOPIC));
        topic.partitions = vec![partition];
        let mut req = DescribeQuorumRequest::default();
        req.topics = vec![topic];
        let Ok(resp) =
            conn.call::<_, DescribeQuorumResponse>(ApiKey::DescribeQuorum, version, &req)
        else {
            // Closed: perhaps the version is not supported; try the next one.
            continue;
        };
        if resp.error_code != 0 {
            return None;
        }
        let p = resp.topics.first()?.partitions.first()?;
        if p.error_code != 0 || p.leader_id.0 < 0 {
            return None;
        }
        return Some(QuorumStatus {
            leader_id: p.leader_id.0,
            leader_epoch: p.leader_epoch,
            high_watermark: p.high_watermark,
            voters: p.current_voters.iter().map(|r| r.replica_id.0).collect(),
            observers: p.observers.iter().map(|r| r.replica_id.0).collect(),
        });
    }
    None
}

/// The last `lines` lines of `text` without Rust backtrace frames (`  12: symbol` and the
/// `at file:line` under it), so a node's exit shows the error its backtrace would push out.
fn without_backtrace_frames(text: &str, lines: usize) -> String {
    let kept: Vec<&str> = text
        .lines()
        .filter(|l| {
            let t = l.trim_start();
            let frame = t
                .split_once(": ")
                .is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
            !(l.starts_with(' ') && (frame || t.starts_with("at ")))
        })
        .collect();
    kept[kept.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    #[test]
    fn backtrace_frames_are_left_out_of_a_log_tail() {
        let log = "INFO started\nError: registration refused: X\n\nStack backtrace:\n   0: gregor::main\n             at ./src/main.rs:1:2\n  12: tokio::run\n";
        assert_eq!(
            super::without_backtrace_frames(log, 10),
            "INFO started\nError: registration refused: X\n\nStack backtrace:"
        );
        assert_eq!(super::without_backtrace_frames(log, 1), "Stack backtrace:");
    }

    use super::*;

    #[test]
    fn parses_kafka_4_describe_status() {
        let text = "ClusterId:              q1Sh-9_ISia_zwGINzRvyQ\n\
            LeaderId:               2\n\
            LeaderEpoch:            7\n\
            HighWatermark:          1234\n\
            MaxFollowerLag:         0\n\
            MaxFollowerLagTimeMs:   0\n\
            CurrentVoters:          [{\"id\": 1, \"directoryId\": null, \"endpoints\": [\"CONTROLLER://127.0.0.1:4001\"]}, {\"id\": 2, \"directoryId\": null, \"endpoints\": [\"CONTROLLER://127.0.0.1:4002\"]}, {\"id\": 3, \"directoryId\": null, \"endpoints\": [\"CONTROLLER://127.0.0.1:4003\"]}]\n\
            CurrentObservers:       [{\"id\": 4, \"directoryId\": \"AAAAAAAAAAAAAAAAAAAAAQ\"}]\n";
        assert_eq!(
            QuorumStatus::parse_tool_output(text).unwrap(),
            QuorumStatus {
                leader_id: 2,
                leader_epoch: 7,
                high_watermark: 1234,
                voters: vec![1, 2, 3],
                observers: vec![4],
            }
        );
    }

    #[test]
    fn parses_kafka_3_lists_and_refuses_missing_fields() {
        let text = "LeaderId: 1\nLeaderEpoch: 3\nHighWatermark: 10\nCurrentVoters: [1,2,3]\nCurrentObservers: []\n";
        let s = QuorumStatus::parse_tool_output(text).unwrap();
        assert_eq!((s.voters, s.observers), (vec![1, 2, 3], vec![]));
        assert!(QuorumStatus::parse_tool_output(
            "LeaderEpoch: 3\nHighWatermark: 1\nCurrentVoters: [1]"
        )
        .is_err());
        assert!(QuorumStatus::parse_tool_output(
            "LeaderId: x\nLeaderEpoch: 3\nHighWatermark: 1\nCurrentVoters: [1]"
        )
        .is_err());
    }

    #[test]
    fn a_mixed_cluster_runs_each_node_on_its_implementation() {
        let gregor = Implementation::Gregor(PathBuf::from("/nonexistent/gregor"));
        let config = ClusterConfig::new(
            gregor.clone(),
            Layout::CombinedAndBrokers {
                combined: 3,
                brokers: 1,
            },
        )
        .with_node_implementation(4, Implementation::Kafka)
        .with_controller_format_args(&["--release-version", "4.3-IV0"]);
        assert!(config.is_mixed());
        let c = Cluster::prepare(&config).unwrap();
        assert_eq!(c.broker_ids(), [1, 2, 3, 4]);
        assert_eq!(c.voters().split(',').count(), 3);
        for n in c.nodes() {
            let kafka = n.node_id == 4;
            assert_eq!(n.implementation() == &Implementation::Kafka, kafka);
            assert_eq!(
                n.admin_port.is_none(),
                kafka,
                "admin listener on gregor only"
            );
            assert_eq!(n.role, if kafka { Role::Broker } else { Role::Combined });
            assert_eq!(
                n.format_args.is_empty(),
                kafka,
                "format args on controllers only"
            );
            let props = std::fs::read_to_string(n.config_file()).unwrap();
            assert!(props.contains(&format!("controller.quorum.voters={}\n", c.voters())));
        }
        assert!(Cluster::prepare(&config.with_node_implementation(5, gregor)).is_err());
    }

    #[test]
    fn properties_of_a_split_layout() {
        let c = Cluster::prepare(&ClusterConfig {
            implementation: Implementation::Gregor(PathBuf::from("/nonexistent/gregor")),
            layout: Layout::Split {
                controllers: 3,
                brokers: 2,
            },
            properties: vec![("broker.session.timeout.ms".into(), "3000".into())],
            node_implementations: Vec::new(),
            controller_format_args: Vec::new(),
        })
        .unwrap();
        assert_eq!(c.nodes().len(), 5);
        assert_eq!(c.broker_ids(), [4, 5]);
        let ports: BTreeSet<u16> = c
            .nodes()
            .iter()
            .flat_map(|n| [n.client_port, n.controller_port, n.admin_port])
            .flatten()
            .collect();
        assert_eq!(ports.len(), 3 + 2 + 5, "every port distinct");
        assert_eq!(c.voters().split(',').count(), 3);
        assert_eq!(c.bootstrap().split(',').count(), 2);
        assert_eq!(c.bootstrap_controllers().split(',').count(), 3);
        let controller = std::fs::read_to_string(c.node(1).config_file()).unwrap();
        assert!(controller.contains("process.roles=controller\n"));
        assert!(controller.contains(&format!("controller.quorum.voters={}\n", c.voters())));
        assert!(!controller.contains("PLAINTEXT://"));
        let broker = std::fs::read_to_string(c.node(5).config_file()).unwrap();
        assert!(broker.contains("process.roles=broker\n"));
        assert!(broker.contains("offsets.topic.replication.factor=2\n"));
        assert!(broker.ends_with("broker.session.timeout.ms=3000\n"));
        assert!(!broker.contains("CONTROLLER://"));
        assert!(Cluster::prepare(&ClusterConfig {
            implementation: Implementation::Kafka,
            layout: Layout::Split {
                controllers: 0,
                brokers: 2,
            },
            properties: vec![],
            node_implementations: Vec::new(),
            controller_format_args: Vec::new(),
        })
        .is_err());
    }
}
