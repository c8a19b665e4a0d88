//! The client side of the `gregor` binary: `topic`, `produce`, `consume`, `group`, `config`,
//! `status` and `perf`, built on rdkafka (librdkafka), so they work against gregor and against
//! any Apache Kafka broker alike; `acl` speaks the Kafka protocol itself (the binding has no
//! ACL calls).
//!
//! Tables (comfy-table) are for people; `--output json` is for scripts. Client properties that
//! have no flag of their own can be passed through with `-X key=value` (librdkafka names).

mod acl;
mod config;
mod consume;
mod delete_records;
mod format;
mod group;
pub mod perf;
mod produce;
mod status;
mod topic;

use anyhow::{bail, Result};
use rdkafka::ClientConfig;
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// How long the start-up check waits for a TCP connection to each bootstrap address.
const BOOTSTRAP_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

pub use consume::ConsumeArgs;
pub use produce::ProduceArgs;
pub use topic::TopicArgs;

/// Client subcommands, flattened into the binary's top-level subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum ClientCommand {
    /// Create, list, describe and delete topics.
    Topic(TopicArgs),
    /// Produce records read line by line from stdin or a file.
    Produce(ProduceArgs),
    /// Consume records and print them, one per line.
    Consume(ConsumeArgs),
    /// List, describe, reset the offsets of, and delete consumer groups.
    Group(group::GroupArgs),
    /// Describe, set and delete topic and broker configs.
    Config(config::ConfigArgs),
    /// Add, list and remove ACLs (as Kafka's `kafka-acls`).
    Acl(acl::AclArgs),
    /// One screen about a running broker: uptime, topics, throughput, largest lags.
    Status(status::StatusArgs),
    /// Load generator: produce or consume and report throughput and latency (JSON).
    Perf(perf::PerfArgs),
}

/// Runs one client subcommand, after checking that a bootstrap server answers at all (so a
/// broker that is not running is named at once rather than after the request timeout).
pub async fn run(cmd: ClientCommand) -> Result<()> {
    let connection = match &cmd {
        ClientCommand::Topic(a) => Some(&a.connection),
        ClientCommand::Produce(a) => Some(&a.connection),
        ClientCommand::Consume(a) => Some(&a.connection),
        ClientCommand::Group(a) => Some(&a.connection),
        ClientCommand::Config(a) => Some(&a.connection),
        ClientCommand::Acl(a) => Some(&a.connection),
        // `status` asks the admin listener first and explains its own failures.
        ClientCommand::Status(_) => None,
        ClientCommand::Perf(a) => Some(a.connection()),
    };
    if let Some(connection) = connection {
        let probe = connection.clone();
        tokio::task::spawn_blocking(move || probe.check_reachable(BOOTSTRAP_CONNECT_TIMEOUT))
            .await??;
    }
    match cmd {
        ClientCommand::Topic(args) => topic::run(args).await,
        ClientCommand::Produce(args) => produce::run(args).await,
        ClientCommand::Consume(args) => consume::run(args).await,
        ClientCommand::Group(args) => group::run(args).await,
        ClientCommand::Config(args) => config::run(args).await,
        ClientCommand::Acl(args) => acl::run(args).await,
        ClientCommand::Status(args) => status::run(args).await,
        ClientCommand::Perf(args) => perf::run(args).await,
    }
}

/// How results are printed.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Output {
    /// Tables and sentences for people.
    #[default]
    Table,
    /// JSON for scripts.
    Json,
}

/// Connection options shared by every client subcommand.
#[derive(clap::Args, Debug, Clone)]
pub struct ConnectionArgs {
    /// Broker(s) to bootstrap from, host:port[,host:port...].
    #[arg(
        long,
        short = 'b',
        env = "GREGOR_BOOTSTRAP",
        default_value = "127.0.0.1:9092",
        global = true
    )]
    pub bootstrap_server: String,
    /// Extra client property (librdkafka name), e.g. -X debug=protocol. Repeatable.
    #[arg(short = 'X', long = "client-property", value_name = "KEY=VALUE", value_parser = parse_key_value, global = true)]
    pub client_properties: Vec<(String, String)>,
}

impl ConnectionArgs {
    /// A client configuration with the bootstrap servers and the `-X` properties applied last.
    pub fn client_config(&self, defaults: &[(&str, &str)]) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.bootstrap_server);
        for (k, v) in defaults {
            config.set(*k, *v);
        }
        for (k, v) in &self.client_properties {
            config.set(k, v);
        }
        config
    }
}

impl ConnectionArgs {
    /// Fails with an error naming every bootstrap server and why it could not be reached
    /// (resolution, refused, timed out after `timeout` per address) when none accepts a TCP
    /// connection; succeeds as soon as one does. librdkafka alone would retry quietly until the
    /// request timeout (30 s) and then report only `BrokerTransportFailure`.
    ///
    /// Entries may carry a `PROTOCOL://` prefix, as librdkafka's `bootstrap.servers` allows.
    pub fn check_reachable(&self, timeout: Duration) -> Result<()> {
        let mut failures = Vec::new();
        for server in self.bootstrap_server.split(',').map(str::trim) {
            if server.is_empty() {
                continue;
            }
            let hostport = server.split_once("://").map_or(server, |(_, rest)| rest);
            let addrs = match hostport.to_socket_addrs() {
                Ok(addrs) => addrs.collect::<Vec<_>>(),
                Err(e) => {
                    failures.push(format!("{server} ({e})"));
                    continue;
                }
            };
            if addrs.is_empty() {
                failures.push(format!("{server} (resolves to no address)"));
            }
            for addr in addrs {
                match TcpStream::connect_timeout(&addr, timeout) {
                    Ok(_) => return Ok(()),
                    Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                        failures.push(format!("{server} ({addr}: no answer in {timeout:?})"))
                    }
                    Err(e) => failures.push(format!("{server} ({addr}: {e})")),
                }
            }
        }
        if failures.is_empty() {
            bail!("no bootstrap server given: set --bootstrap-server (-b) or GREGOR_BOOTSTRAP");
        }
        bail!(
            "cannot reach any bootstrap server: {}. Is the broker running there? Point \
             --bootstrap-server (-b) or GREGOR_BOOTSTRAP at its client listener.",
            failures.join(", ")
        )
    }
}

/// Parses `key=value` (the value may itself contain `=`).
pub fn parse_key_value(s: &str) -> Result<(String, String)> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => bail!("expected KEY=VALUE, got {s:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(subcommand)]
        cmd: ClientCommand,
    }

    #[test]
    fn key_value_splits_at_first_equals() {
        assert_eq!(
            parse_key_value("a=b=c").unwrap(),
            ("a".to_string(), "b=c".to_string())
        );
        assert!(parse_key_value("=x").is_err());
        assert!(parse_key_value("novalue").is_err());
    }

    #[test]
    fn command_line_parses() {
        Cli::try_parse_from([
            "gregor",
            "topic",
            "create",
            "t",
            "--partitions",
            "3",
            "--config",
            "cleanup.policy=compact",
        ])
        .unwrap();
        Cli::try_parse_from(["gregor", "topic", "describe", "--output", "json"]).unwrap();
        Cli::try_parse_from([
            "gregor",
            "topic",
            "list",
            "--bootstrap-server",
            "h:1",
            "-X",
            "a=b",
        ])
        .unwrap();
        Cli::try_parse_from([
            "gregor",
            "produce",
            "t",
            "--key-separator",
            ":",
            "--acks",
            "all",
            "--compression",
            "zstd",
            "--header",
            "a=b",
            "--partition",
            "0",
        ])
        .unwrap();
        Cli::try_parse_from([
            "gregor",
            "consume",
            "t",
            "--partition",
            "0",
            "--offset",
            "earliest",
            "--max-messages",
            "5",
            "--format",
            "%k:%v",
        ])
        .unwrap();
    }

    #[test]
    fn clap_definitions_are_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
