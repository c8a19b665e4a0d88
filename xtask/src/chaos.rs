//! `cargo xtask chaos`: the replication fault test (`gregor_tests::chaos`) for as long as
//! asked, on a three-node gregor or Apache Kafka cluster.
//!
//! It builds gregor (debug, or `--release`) when the implementation is gregor, then runs the
//! ignored test `chaos_from_env` of `tests/tests/chaos.rs` with `GREGOR_CHAOS_MINUTES`,
//! `GREGOR_CHAOS_SEED`, `GREGOR_CHAOS_IMPL` and `GREGOR_BIN` set (the test crate has the
//! rdkafka clients; xtask builds without librdkafka). The test prints every fault as it is
//! injected, the whole schedule and the checker's counts; on a failed check it writes the
//! history and the final log to `target/chaos/<impl>-<seed>.txt`. The same seed replays the
//! same schedule.

use crate::proc::repo_root;
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use std::process::Command;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum, Debug)]
pub enum Impl {
    /// The gregor binary of this workspace.
    Gregor,
    /// Apache Kafka 4.4.0 from the jars of `cargo xtask kafka`.
    Kafka,
}

#[derive(Args)]
pub struct ChaosArgs {
    /// How long faults are injected, in minutes (start-up and the final read come on top).
    #[arg(long, default_value_t = 30)]
    pub minutes: u64,
    /// The implementation on the three nodes.
    #[arg(long = "impl", value_enum, default_value_t = Impl::Gregor)]
    pub implementation: Impl,
    /// The schedule's seed (default: from the clock; printed for a replay).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Build and run gregor with the release profile.
    #[arg(long)]
    pub release: bool,
}

pub fn run(args: &ChaosArgs) -> Result<i32> {
    if args.minutes == 0 {
        bail!("--minutes must be at least 1");
    }
    let root = repo_root();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_secs())
    });
    let mut test = Command::new(&cargo);
    test.current_dir(&root);
    test.args(["test", "-p", "gregor-tests", "--test", "chaos"]);
    if args.release {
        test.arg("--release");
    }
    test.args([
        "chaos_from_env",
        "--",
        "--ignored",
        "--exact",
        "--nocapture",
    ])
    .env("GREGOR_CHAOS_MINUTES", args.minutes.to_string())
    .env("GREGOR_CHAOS_SEED", seed.to_string());
    match args.implementation {
        Impl::Kafka => {
            test.env("GREGOR_CHAOS_IMPL", "kafka");
        }
        Impl::Gregor => {
            let mut build = Command::new(&cargo);
            build.current_dir(&root).args(["build", "-p", "gregor"]);
            if args.release {
                build.arg("--release");
            }
            let status = build.status().context("building gregor")?;
            if !status.success() {
                bail!("cargo build -p gregor failed: {status}");
            }
            let profile = if args.release { "release" } else { "debug" };
            test.env("GREGOR_CHAOS_IMPL", "gregor").env(
                "GREGOR_BIN",
                root.join("target").join(profile).join("gregor"),
            );
        }
    }
    eprintln!(
        "chaos: {} minutes on {:?}, seed {seed} (replay: cargo xtask chaos --minutes {} --impl {} \
         --seed {seed})",
        args.minutes,
        args.implementation,
        args.minutes,
        match args.implementation {
            Impl::Gregor => "gregor",
            Impl::Kafka => "kafka",
        }
    );
    let status = test.status().context("running the chaos test")?;
    Ok(status.code().unwrap_or(1))
}
