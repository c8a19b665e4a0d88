//! `cargo xtask sim`: the deterministic KRaft simulator of `gregor-raft` over many seeds.
//!
//! Seeds run one after the other in this process (each run's memory is freed before the next),
//! so a long run needs one core and little memory. A failing seed prints what was violated and
//! the command that replays it exactly (`--seeds 1 --start <seed> --trace`).

use anyhow::{bail, Result};
use clap::Args;
use gregor_raft::sim::{self, SimOptions};
use std::time::Instant;

#[derive(Args, Clone)]
pub struct SimArgs {
    /// Number of seeds to run.
    #[arg(long, default_value_t = 1000)]
    pub seeds: u64,
    /// First seed.
    #[arg(long, default_value_t = 0)]
    pub start: u64,
    /// Voters in the quorum (3 or 5).
    #[arg(long, default_value_t = 3)]
    pub voters: usize,
    /// Observers (brokers) following the quorum.
    #[arg(long, default_value_t = 1)]
    pub observers: usize,
    /// Print every event of every seed to stderr (for replaying one seed).
    #[arg(long)]
    pub trace: bool,
    /// Run the partition-replication simulator (`gregor_broker::replication::sim`: leader
    /// and follower cores with the real controller) instead of the KRaft one.
    #[arg(long)]
    pub replication: bool,
}

pub fn run(args: &SimArgs) -> Result<i32> {
    if args.replication {
        return run_replication(args);
    }
    if !(args.voters == 3 || args.voters == 5) {
        bail!("--voters must be 3 or 5, not {}", args.voters);
    }
    let mut options = SimOptions::new(args.voters);
    options.observers = args.observers;
    options.trace = args.trace;
    let started = Instant::now();
    let mut total = sim::SimSummary::default();
    let end = args.start.saturating_add(args.seeds);
    for seed in args.start..end {
        match sim::run_seeds(seed, 1, &options) {
            Ok(s) => {
                total.seeds += s.seeds;
                total.events += s.events;
                total.crashes += s.crashes;
                total.torn_writes += s.torn_writes;
                total.partitions += s.partitions;
                total.proposals += s.proposals;
                total.leaders_elected += s.leaders_elected;
                total.truncations += s.truncations;
                total.diverging_epochs += s.diverging_epochs;
                total.pre_votes += s.pre_votes;
                total.end_quorum_epochs += s.end_quorum_epochs;
                total.snapshots_taken += s.snapshots_taken;
                total.snapshot_chunks += s.snapshot_chunks;
                total.snapshot_installs += s.snapshot_installs;
                total.max_epoch = total.max_epoch.max(s.max_epoch);
                total.max_recovery_ms = total.max_recovery_ms.max(s.max_recovery_ms);
            }
            Err(failure) => {
                eprintln!("{failure}");
                eprintln!(
                    "{} seeds passed before it, in {:.1} s",
                    seed - args.start,
                    started.elapsed().as_secs_f64()
                );
                return Ok(1);
            }
        }
        let done = seed - args.start + 1;
        if done.is_multiple_of(1000) && done < args.seeds {
            eprintln!(
                "{done} seeds passed ({:.1} s)",
                started.elapsed().as_secs_f64()
            );
        }
    }
    println!(
        "sim: {} seeds ({}..{}) with {} voters and {} observers passed in {:.1} s: {} events, {} leaders elected, {} proposals, {} crashes ({} tearing a write), {} partitions, {} pre-votes, {} EndQuorumEpochs, {} DivergingEpochs, {} log truncations, {} snapshots taken, {} FetchSnapshot chunks, {} snapshots installed, highest epoch {}, slowest recovery after heal {} ms",
        total.seeds,
        args.start,
        end,
        args.voters,
        args.observers,
        started.elapsed().as_secs_f64(),
        total.events,
        total.leaders_elected,
        total.proposals,
        total.crashes,
        total.torn_writes,
        total.partitions,
        total.pre_votes,
        total.end_quorum_epochs,
        total.diverging_epochs,
        total.truncations,
        total.snapshots_taken,
        total.snapshot_chunks,
        total.snapshot_installs,
        total.max_epoch,
        total.max_recovery_ms
    );
    Ok(0)
}

/// `--replication`: seeds of the partition-replication simulator, stopping at the first
/// violation (printed with its seed and step).
fn run_replication(args: &SimArgs) -> Result<i32> {
    use gregor_broker::replication::sim as rsim;
    let started = Instant::now();
    let mut total = rsim::SimReport::default();
    let end = args.start.saturating_add(args.seeds);
    for seed in args.start..end {
        match rsim::run_seeds(seed, 1) {
            Ok(r) => {
                total.produced += r.produced;
                total.acknowledged += r.acknowledged;
                total.failed += r.failed;
                total.leader_changes += r.leader_changes;
                total.isr_changes += r.isr_changes;
                total.truncations += r.truncations;
                total.faults += r.faults;
                total.committed += r.committed;
                total.duplicates += r.duplicates;
            }
            Err(v) => {
                eprintln!("VIOLATION: {v}");
                eprintln!(
                    "replay: cargo xtask sim --replication --start {} --seeds 1",
                    v.seed
                );
                return Ok(1);
            }
        }
        if (seed + 1 - args.start).is_multiple_of(500) {
            println!(
                "{} seeds, {:.0}s",
                seed + 1 - args.start,
                started.elapsed().as_secs_f64()
            );
        }
    }
    println!(
        "replication: {} seeds in {:.1}s, no violation: {total:?}",
        args.seeds,
        started.elapsed().as_secs_f64()
    );
    Ok(0)
}
