//! `gregor storage`: Kafka's `kafka-storage` for a gregor node. `format` prepares the log
//! dirs (meta.properties everywhere, the bootstrap snapshot in the metadata log dir of a
//! controller) with the flags, rules and messages of Apache Kafka 4.4's tool; `random-uuid`
//! prints a new cluster id. The rules live in `gregor_broker::storage`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{ArgGroup, Subcommand};
use gregor_broker::storage::{self, FormatOptions, InitialControllers, StorageConfig};

/// `gregor storage ...`.
#[derive(Subcommand)]
pub enum StorageCommand {
    /// Format the log directories of this node, as Kafka's `kafka-storage format`: writes
    /// meta.properties (version 1, node.id, cluster.id, directory.id) in every `log.dirs` and
    /// `metadata.log.dir`, and on a controller the bootstrap snapshot
    /// `__cluster_metadata-0/00000000000000000000-0000000000.checkpoint` (the initial
    /// feature levels; with --standalone or --initial-controllers also the KIP-853 voters).
    Format(FormatArgs),
    /// Print a random UUID, for use as a cluster id (`--cluster-id`).
    RandomUuid,
}

/// The flags of Kafka 4.4's `kafka-storage format`.
#[derive(clap::Args)]
#[command(group(
    ArgGroup::new("quorum")
        .args(["standalone", "no_initial_controllers", "initial_controllers"])
        .multiple(false)
))]
pub struct FormatArgs {
    /// The Kafka configuration file (server.properties) of this node: node.id,
    /// process.roles, controller.quorum.voters or controller.quorum.bootstrap.servers,
    /// controller.listener.names, listeners, log.dirs, metadata.log.dir.
    #[arg(short = 'c', long, value_name = "CONFIG")]
    config: PathBuf,
    /// The cluster ID to use (e.g. from `gregor storage random-uuid`); the same on every node.
    #[arg(short = 't', long = "cluster-id", value_name = "CLUSTER_ID")]
    cluster_id: String,
    /// A SCRAM credential to add to the metadata log (KIP-900), e.g.
    /// 'SCRAM-SHA-512=[name=admin,password=admin-secret]'; repeatable.
    #[arg(short = 'S', long = "add-scram", value_name = "ADD_SCRAM")]
    add_scram: Vec<String>,
    /// Skip directories that are already formatted instead of failing.
    #[arg(short = 'g', long)]
    ignore_formatted: bool,
    /// The release version for the initial feature levels: 3.3-IV3 to 4.4-IV2, or a release
    /// such as 4.0 (its newest level); the default is 4.4-IV2.
    #[arg(short = 'r', long, value_name = "RELEASE_VERSION")]
    release_version: Option<String>,
    /// A feature level, as feature=level (e.g. `group.version=1`); repeatable.
    #[arg(short = 'f', long = "feature", value_name = "FEATURE")]
    features: Vec<String>,
    /// Initialize this controller as a single-node dynamic quorum (KIP-853); the config must
    /// set controller.quorum.bootstrap.servers, not controller.quorum.voters.
    #[arg(short = 's', long)]
    standalone: bool,
    /// Format without a dynamic quorum topology (brokers, and controllers that will be added
    /// to a dynamic quorum later); controller.quorum.voters should not be set.
    #[arg(short = 'N', long)]
    no_initial_controllers: bool,
    /// The initial dynamic quorum: a comma-separated list of id@host:port:directory-id, the
    /// same on every node, e.g. 0@c0:9093:JEXY6aqzQY-32P5TStzaFg,1@c1:9093:MvDxzVmcRsaTz33bUuRU6A;
    /// controller.quorum.voters must not be set.
    #[arg(short = 'I', long, value_name = "INITIAL_CONTROLLERS")]
    initial_controllers: Option<String>,
}

impl FormatArgs {
    /// The options of [`storage::format`], with the `--feature` and `--initial-controllers`
    /// arguments parsed.
    fn options(&self) -> Result<FormatOptions> {
        let initial_controllers = if self.standalone {
            InitialControllers::Standalone
        } else if self.no_initial_controllers {
            InitialControllers::None
        } else if let Some(v) = &self.initial_controllers {
            InitialControllers::Listed(storage::parse_dynamic_voters(v)?)
        } else {
            InitialControllers::Unspecified
        };
        let features = self
            .features
            .iter()
            .map(|f| storage::parse_feature_arg(f))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(FormatOptions {
            cluster_id: self.cluster_id.clone(),
            release_version: self.release_version.clone(),
            features,
            ignore_formatted: self.ignore_formatted,
            initial_controllers,
            add_scram: self.add_scram.clone(),
        })
    }
}

fn load_config(path: &PathBuf) -> Result<BTreeMap<String, String>> {
    let file = std::fs::File::open(path)
        .with_context(|| format!("opening config file {}", path.display()))?;
    let map = java_properties::read(std::io::BufReader::new(file))
        .with_context(|| format!("parsing config file {}", path.display()))?;
    Ok(map.into_iter().collect())
}

/// Runs a `gregor storage` command.
pub fn run(cmd: StorageCommand) -> Result<()> {
    match cmd {
        StorageCommand::RandomUuid => {
            println!("{}", storage::random_cluster_id());
            Ok(())
        }
        StorageCommand::Format(args) => {
            let opts = args.options()?;
            let cfg = StorageConfig::from_properties(&load_config(&args.config)?)?;
            let report = storage::format(&cfg, &opts)?;
            for line in report.lines {
                println!("{line}");
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        cmd: StorageCommand,
    }

    fn parse(args: &[&str]) -> Result<FormatArgs, clap::Error> {
        let mut all = vec!["gregor", "format"];
        all.extend_from_slice(args);
        match Cli::try_parse_from(all)?.cmd {
            StorageCommand::Format(f) => Ok(f),
            StorageCommand::RandomUuid => unreachable!("format was asked for"),
        }
    }

    #[test]
    fn short_and_long_flags_as_kafka_storage() {
        let f = parse(&[
            "-t",
            "id",
            "-c",
            "s.properties",
            "-g",
            "-r",
            "4.0",
            "-f",
            "group.version=1",
            "-f",
            "transaction.version=2",
            "-s",
        ])
        .unwrap();
        assert_eq!(f.cluster_id, "id");
        assert!(f.ignore_formatted && f.standalone);
        let o = f.options().unwrap();
        assert_eq!(o.release_version.as_deref(), Some("4.0"));
        assert_eq!(
            o.features,
            [
                ("group.version".to_string(), 1),
                ("transaction.version".to_string(), 2)
            ]
        );
        assert_eq!(o.initial_controllers, InitialControllers::Standalone);
        let f = parse(&[
            "--cluster-id",
            "id",
            "--config",
            "s",
            "--initial-controllers",
            "1@h:9093:AAAAAAAAAAAAAAAAAAAAAQ",
        ])
        .unwrap();
        assert!(matches!(
            f.options().unwrap().initial_controllers,
            InitialControllers::Listed(v) if v.len() == 1 && v[0].port == 9093
        ));
        let f = parse(&["-t", "id", "-c", "s", "-N"]).unwrap();
        assert_eq!(
            f.options().unwrap().initial_controllers,
            InitialControllers::None
        );
    }

    #[test]
    fn required_and_exclusive_flags() {
        assert!(parse(&["-c", "s"]).is_err(), "--cluster-id is required");
        assert!(parse(&["-t", "id"]).is_err(), "--config is required");
        for pair in [["-s", "-N"], ["-s", "-I"], ["-N", "-I"]] {
            let mut args = vec!["-t", "id", "-c", "s"];
            for p in pair {
                args.push(p);
                if p == "-I" {
                    args.push("1@h:1:AAAAAAAAAAAAAAAAAAAAAQ");
                }
            }
            assert!(parse(&args).is_err(), "{pair:?} are exclusive");
        }
        let f = parse(&["-t", "id", "-c", "s", "-f", "group.version"]).unwrap();
        assert!(f
            .options()
            .unwrap_err()
            .to_string()
            .contains("equals sign not found"));
        let f = parse(&["-t", "id", "-c", "s", "-I", "nope"]).unwrap();
        assert!(f.options().unwrap_err().to_string().contains("No @ found"));
    }
}
