//! `cargo xtask kafka fetch|start|stop|run|classpath`: the command line over the reference
//! Apache Kafka broker of `gregor_tests::reference` (jars from Maven Central in
//! `.cache/kafka/<version>/`, instances in `.cache/kafka/instances/<port>/`).

use crate::proc;
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use gregor_tests::reference::DEFAULT_PORT;
pub use gregor_tests::reference::{classpath, fetch, tool_command, Instance, KAFKA_VERSION};
use std::path::PathBuf;

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
            let instance = Instance::new(args.port, args.controller_port, args.data_dir)?;
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

fn stop(port: u16) -> Result<()> {
    let instance = Instance::new(port, Some(0), None)?;
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
