//! The replication fault test (`gregor_tests::chaos`) on three Apache Kafka 4.4.0 nodes: a
//! bounded run in CI (it validates the harness and the checker against the reference; the
//! same run on gregor is in `crates/cli/tests/cluster.rs`), and the long run behind
//! `cargo xtask chaos`.
//!
//! Environment: `GREGOR_CHAOS_SEED` (default: from the clock, printed), `GREGOR_CHAOS_FAULTS`
//! (a comma-separated subset of `kill-leader,kill-controller,pause-broker,cut-link,
//! isolate-node,full-restart,disk-full`), and for the long run
//! `GREGOR_CHAOS_MINUTES`, `GREGOR_CHAOS_IMPL` (`kafka` or `gregor`) and `GREGOR_BIN` (the
//! gregor binary, for `gregor`).

use std::time::Duration;

use gregor_tests::chaos::{self, ChaosConfig};
use gregor_tests::cluster::Implementation;
use gregor_tests::reference;

/// `GREGOR_CHAOS_SEED`, else a seed from the clock.
fn seed() -> u64 {
    std::env::var("GREGOR_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_secs())
        })
}

fn run_and_check(config: &ChaosConfig) {
    let mut config = config.clone();
    if let Ok(list) = std::env::var("GREGOR_CHAOS_FAULTS") {
        config.faults = chaos::Fault::parse_list(&list).unwrap_or_else(|e| panic!("{e:#}"));
    }
    let config = &config;
    eprintln!(
        "chaos seed {} (replay: GREGOR_CHAOS_SEED={})",
        config.seed, config.seed
    );
    let out = chaos::run(config).unwrap_or_else(|e| panic!("seed {}: {e:#}", config.seed));
    eprintln!("{out}");
    assert!(
        out.is_valid(),
        "seed {}: the history check failed:\n{out}",
        config.seed
    );
    assert!(!out.events.is_empty(), "no fault was injected:\n{out}");
    assert!(
        out.acknowledged_rdkafka > 0 && (!config.java || out.acknowledged_java > 0),
        "both clients must have written:\n{out}"
    );
}

/// CI: 90 s of faults on Kafka (about three minutes with start-up and the read-back).
#[test]
fn kafka_chaos_bounded() {
    if !reference::jars_or_skip() {
        return;
    }
    run_and_check(&ChaosConfig::new(
        Implementation::Kafka,
        Duration::from_secs(90),
        seed(),
    ));
}

/// `cargo xtask chaos --minutes N [--impl gregor|kafka] [--seed S]` runs this.
#[test]
#[ignore = "long run: cargo xtask chaos --minutes N"]
fn chaos_from_env() {
    let minutes: u64 = std::env::var("GREGOR_CHAOS_MINUTES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let implementation = match std::env::var("GREGOR_CHAOS_IMPL").as_deref() {
        Ok("gregor") => Implementation::Gregor(
            std::env::var("GREGOR_BIN")
                .expect("GREGOR_BIN: the gregor binary for GREGOR_CHAOS_IMPL=gregor")
                .into(),
        ),
        Ok("kafka") | Err(_) => {
            if !reference::jars_or_skip() {
                return;
            }
            Implementation::Kafka
        }
        Ok(other) => panic!("GREGOR_CHAOS_IMPL={other}: gregor or kafka"),
    };
    run_and_check(&ChaosConfig::new(
        implementation,
        Duration::from_secs(minutes * 60),
        seed(),
    ));
}
