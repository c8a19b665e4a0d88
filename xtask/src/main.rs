//! `cargo xtask ...`: project automation that needs nothing but Rust, Java, Maven and Python.
//!
//! - `cargo xtask test` is the one command CI runs (`.ci/run`): formatting, lints, unit and
//!   integration tests, a release build, then the interop suites in `interop/` against a
//!   `gregor` started on a free port.
//! - `cargo xtask kafka ...` fetches and runs the reference Apache Kafka broker and its tools
//!   from the jars on Maven Central (see "Reference broker" in docs/DESIGN).

mod kafka;
mod proc;
mod test;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "gregor project automation")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run everything CI runs (fmt, clippy, tests, release build, interop suites).
    Test(test::TestArgs),
    /// Fetch, start, stop the reference Apache Kafka broker, or run one of its tools.
    #[command(subcommand)]
    Kafka(kafka::KafkaCommand),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Test(args) => {
            let code = test::run(&args)?;
            std::process::exit(code);
        }
        Command::Kafka(cmd) => {
            let code = kafka::run(cmd)?;
            std::process::exit(code);
        }
    }
}
