//! `cargo xtask ...`: project automation that needs nothing but Rust, Java, Maven and Python.
//!
//! - `cargo xtask test` is the one command CI runs (`.ci/run`): formatting, lints, unit and
//!   integration tests, a release build, then the interop suites in `interop/` against a
//!   `gregor` started on a free port.
//! - `cargo xtask kafka ...` fetches and runs the reference Apache Kafka broker and its tools
//!   from the jars on Maven Central (see "Reference broker" in docs/DESIGN).
//! - `cargo xtask difftest` compares gregor's answers with that broker's, field by field.
//! - `cargo xtask bench` runs the same workloads against both and reports the ratios.
//! - `cargo xtask scale` puts many partitions on one broker of each and compares the costs.
//! - `cargo xtask fuzz` runs the cargo-fuzz targets in `fuzz/` on their committed corpora.
//! - `cargo xtask sim` runs the deterministic KRaft simulator of `gregor-raft` over many seeds.
//! - `cargo xtask chaos` runs the replication fault test on a 3-node cluster for N minutes.
//! - `cargo xtask rdkafka-suite` runs librdkafka's own integration test suite against gregor
//!   (and the reference Kafka) and checks the results against its expectations file.

mod bench;
mod bench_cache;
mod bench_client_limit;
mod bench_loopback;
mod bench_png;
mod bench_tls;
mod chaos;
mod difftest;
mod difftest_requests;
mod fuzz;
mod kafka;
mod parallel_test;
mod proc;
mod rdkafka_suite;
mod scale;
mod secure;
mod sim;
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
    /// Send the scenarios in xtask/difftest/ to gregor and to Apache Kafka; compare responses.
    Difftest(difftest::DifftestArgs),
    /// The same workloads against gregor and Apache Kafka; report in target/bench/.
    Bench(bench::BenchArgs),
    /// Many partitions on one gregor and one Apache Kafka broker: time to create, memory and
    /// descriptors, Metadata latency, shutdown and restart; report in target/scale/.
    Scale(scale::ScaleArgs),
    /// Run the cargo-fuzz targets in fuzz/ (nightly; installs cargo-fuzz when missing).
    Fuzz(fuzz::FuzzArgs),
    /// Run the deterministic KRaft simulator (gregor-raft) over many seeds.
    Sim(sim::SimArgs),
    /// The replication fault test on a 3-node cluster for N minutes (seeded faults, history
    /// check).
    Chaos(chaos::ChaosArgs),
    /// librdkafka's own test suite (its test-runner, built from the rdkafka-sys crate's
    /// source) against gregor and, with --broker both, the reference Kafka; results checked
    /// against xtask/rdkafka-suite/expectations.json, report in target/librdkafka-suite/.
    RdkafkaSuite(rdkafka_suite::RdkafkaSuiteArgs),
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
        Command::Difftest(args) => {
            let code = difftest::run(&args)?;
            std::process::exit(code);
        }
        Command::Bench(args) => {
            let code = bench::run(&args)?;
            std::process::exit(code);
        }
        Command::Scale(args) => {
            let code = scale::run(&args)?;
            std::process::exit(code);
        }
        Command::Fuzz(args) => {
            let code = fuzz::run(&args)?;
            std::process::exit(code);
        }
        Command::Sim(args) => {
            let code = sim::run(&args)?;
            std::process::exit(code);
        }
        Command::Chaos(args) => {
            let code = chaos::run(&args)?;
            std::process::exit(code);
        }
        Command::RdkafkaSuite(args) => {
            let code = rdkafka_suite::run(&args)?;
            std::process::exit(code);
        }
    }
}
