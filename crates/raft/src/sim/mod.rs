//! A deterministic simulator of a KRaft quorum: N voters and some observers, each a
//! [`RaftNode`] over a [`MemoryLog`], on a simulated network and clock. One seed drives
//! everything: message delay, loss, duplication and reordering, network partitions and heals,
//! crashes and restarts (losing unflushed log data and, when the crash tears a barrier, the
//! election state or flush being written), graceful resignations of the leader, forward clock
//! jumps on single nodes, and a client
//! proposing records at random times to whichever node it believes leads.
//!
//! A run has a fault phase, then heals everything (network, crashed nodes, no more loss) and
//! requires liveness: a proposal made after the heal must commit within
//! [`SimOptions::liveness_bound_ms`]. After every event a checker verifies safety:
//! - at most one leader per epoch;
//! - a committed batch (below some node's published high watermark) is never changed on any
//!   node that holds that offset later, and every leader holds all committed batches;
//! - logs agree below the high watermark (the committed prefix is one sequence);
//! - epochs never go back on a node, nor below what it persisted; published high watermarks
//!   never go back within a node's lifetime and never pass its log end; nor across leaders: a
//!   leader's high watermark covers everything committed before its epoch;
//! - no node saw a protocol anomaly ([`RaftNode::anomalies`]);
//! - a snapshot (KIP-630) holds exactly the committed prefix below its end offset, when it is
//!   written and when a follower installs it; the log above it then agrees with the committed
//!   batches as any log does.
//!
//! Nodes take snapshots at random committed batch boundaries (the state machine is the
//! committed batches themselves: a snapshot holds one record per batch, the batch as value)
//! and mostly delete their log before them, so a node crashed or cut off long enough comes
//! back through FetchSnapshot, in chunks of a few hundred bytes to a few KiB.
//!
//! A failure names the seed and the command that replays it exactly
//! (`cargo xtask sim --seeds 1 --start <seed> --voters <n> --trace`).

mod checker;

use std::collections::BTreeMap;
use std::fmt;

use bytes::Bytes;

use crate::config::{BrokenRule, QuorumConfig};
use crate::log::{MemoryLog, RaftLog};
use crate::message::Message;
use crate::node::{Action, RaftNode, Role};
use crate::rng::Rng;
use crate::types::{ElectionState, NodeId, VoterSet};
use checker::Checker;

/// What a run simulates.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// Number of voters (ids `1..=voters`).
    pub voters: usize,
    /// Number of observers (ids `101..`).
    pub observers: usize,
    /// Longest fault phase (ms of simulated time); each seed draws its own, at least a quarter.
    pub max_fault_phase_ms: u64,
    /// After the heal, a proposal must commit within this time (ms).
    pub liveness_bound_ms: u64,
    /// Give up (and fail) after this many events: a livelock guard.
    pub max_events: u64,
    /// Test only: a protocol rule to break on every voter, to show the checker catches it.
    pub broken_rule: Option<BrokenRule>,
    /// Fail when a node reports a protocol anomaly (default). Off, only the checker's
    /// cluster-wide invariants can fail a run: the checker's own test uses that.
    pub fail_on_anomalies: bool,
    /// Print every event to stderr.
    pub trace: bool,
}

impl SimOptions {
    /// Defaults for `voters` voters and one observer.
    pub fn new(voters: usize) -> Self {
        Self {
            voters,
            observers: 1,
            max_fault_phase_ms: 12_000,
            liveness_bound_ms: 15_000,
            max_events: 3_000_000,
            broken_rule: None,
            fail_on_anomalies: true,
            trace: false,
        }
    }
}

/// What a passing run did.
#[derive(Debug, Clone, Default)]
pub struct SimReport {
    /// The seed.
    pub seed: u64,
    /// Events processed.
    pub events: u64,
    /// Simulated time at the end (ms).
    pub end_time_ms: u64,
    /// Highest epoch reached.
    pub max_epoch: i32,
    /// End offset of the committed prefix.
    pub committed_end_offset: i64,
    /// Crashes injected (including torn writes).
    pub crashes: u64,
    /// Crashes that tore a barrier (an election-state write or a flush lost).
    pub torn_writes: u64,
    /// Network partitions injected.
    pub partitions: u64,
    /// Proposals the leaders accepted.
    pub proposals: u64,
    /// Simulated ms from the heal to the first committed post-heal proposal.
    pub recovery_ms: u64,
    /// Epochs that had a leader.
    pub leaders_elected: u64,
    /// Log truncations (diverging epochs, data lost or restored by crashes).
    pub truncations: u64,
    /// A hash of every event and action of the run, in order: equal for two runs of the same
    /// seed, different as soon as anything differs.
    pub fingerprint: u64,
    /// Fetch responses delivered with a `DivergingEpoch` (follower truncations asked for).
    pub diverging_epochs: u64,
    /// PreVote requests delivered.
    pub pre_votes: u64,
    /// EndQuorumEpoch requests delivered (leaders that resigned).
    pub end_quorum_epochs: u64,
    /// Snapshots the nodes wrote (state machine snapshots).
    pub snapshots_taken: u64,
    /// FetchSnapshot chunks delivered (responses without error).
    pub snapshot_chunks: u64,
    /// Fetched snapshots installed (`Action::SnapshotInstalled`).
    pub snapshot_installs: u64,
}

/// A failed run: the seed, where it failed, and how to replay it.
#[derive(Debug, Clone)]
pub struct SimFailure {
    /// The seed.
    pub seed: u64,
    /// Voters in the run.
    pub voters: usize,
    /// Observers in the run.
    pub observers: usize,
    /// Index of the event after which the check failed.
    pub event: u64,
    /// Simulated time (ms).
    pub time_ms: u64,
    /// What was violated.
    pub reason: String,
}

impl fmt::Display for SimFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "simulation seed {} ({} voters, {} observers) failed at event {} (t={} ms): {}\n  replay: cargo xtask sim --seeds 1 --start {} --voters {} --observers {} --trace",
            self.seed,
            self.voters,
            self.observers,
            self.event,
            self.time_ms,
            self.reason,
            self.seed,
            self.voters,
            self.observers
        )
    }
}

impl std::error::Error for SimFailure {}

/// Totals of [`run_seeds`].
#[derive(Debug, Clone, Default)]
pub struct SimSummary {
    /// Seeds run.
    pub seeds: u64,
    /// Events over all seeds.
    pub events: u64,
    /// Crashes over all seeds.
    pub crashes: u64,
    /// Torn writes over all seeds.
    pub torn_writes: u64,
    /// Partitions over all seeds.
    pub partitions: u64,
    /// Proposals accepted over all seeds.
    pub proposals: u64,
    /// Highest epoch seen in any seed.
    pub max_epoch: i32,
    /// Longest heal-to-commit time of any seed (ms).
    pub max_recovery_ms: u64,
    /// Epochs with a leader, over all seeds.
    pub leaders_elected: u64,
    /// Log truncations over all seeds.
    pub truncations: u64,
    /// Fetch responses with a `DivergingEpoch` over all seeds.
    pub diverging_epochs: u64,
    /// PreVote requests over all seeds.
    pub pre_votes: u64,
    /// EndQuorumEpoch requests over all seeds.
    pub end_quorum_epochs: u64,
    /// Snapshots written over all seeds.
    pub snapshots_taken: u64,
    /// FetchSnapshot chunks delivered over all seeds.
    pub snapshot_chunks: u64,
    /// Fetched snapshots installed over all seeds.
    pub snapshot_installs: u64,
}

/// Runs seeds `start..start + count` one after the other (memory is freed between seeds);
/// stops at the first failure.
///
/// # Errors
/// The first [`SimFailure`].
pub fn run_seeds(start: u64, count: u64, options: &SimOptions) -> Result<SimSummary, SimFailure> {
    let mut summary = SimSummary::default();
    for seed in start..start.saturating_add(count) {
        let r = run(seed, options)?;
        summary.seeds += 1;
        summary.events += r.events;
        summary.crashes += r.crashes;
        summary.torn_writes += r.torn_writes;
        summary.partitions += r.partitions;
        summary.proposals += r.proposals;
        summary.max_epoch = summary.max_epoch.max(r.max_epoch);
        summary.max_recovery_ms = summary.max_recovery_ms.max(r.recovery_ms);
        summary.leaders_elected += r.leaders_elected;
        summary.truncations += r.truncations;
        summary.diverging_epochs += r.diverging_epochs;
        summary.pre_votes += r.pre_votes;
        summary.end_quorum_epochs += r.end_quorum_epochs;
        summary.snapshots_taken += r.snapshots_taken;
        summary.snapshot_chunks += r.snapshot_chunks;
        summary.snapshot_installs += r.snapshot_installs;
    }
    Ok(summary)
}

#[derive(Debug)]
enum Event {
    Deliver {
        from: NodeId,
        to: usize,
        message: Message,
    },
    Tick {
        node: usize,
        incarnation: u32,
    },
    Propose,
    Snapshot,
    Fault,
    Restart {
        node: usize,
    },
    Heal,
}

/// One simulated node and what the checker remembers of it.
struct Slot {
    id: NodeId,
    config: QuorumConfig,
    node: Option<RaftNode<MemoryLog>>,
    /// The log while the node is down.
    log_down: Option<MemoryLog>,
    /// The election state last written completely.
    persisted: Option<ElectionState>,
    clock_offset_ms: u64,
    incarnation: u32,
    group: u8,
    tick_ms: u64,
    /// Checker state.
    published_hw: i64,
    last_epoch: i32,
    /// End offset of the batches the checker verified on this node.
    verified_end: i64,
}

struct Proposal {
    base_offset: i64,
    epoch: i32,
    crc: u32,
}

struct Sim<'a> {
    seed: u64,
    options: &'a SimOptions,
    rng: Rng,
    now: u64,
    seq: u64,
    events: u64,
    queue: BTreeMap<(u64, u64), Event>,
    slots: Vec<Slot>,
    checker: Checker,
    loss: f64,
    duplicate: f64,
    max_delay_ms: u64,
    torn_write: f64,
    healed_at: Option<u64>,
    post_heal_proposals: Vec<Proposal>,
    next_value: u64,
    report: SimReport,
}

/// Runs one seed.
///
/// # Errors
/// A [`SimFailure`] naming the violated property.
pub fn run(seed: u64, options: &SimOptions) -> Result<SimReport, SimFailure> {
    let failure = |reason: String| SimFailure {
        seed,
        voters: options.voters,
        observers: options.observers,
        event: 0,
        time_ms: 0,
        reason,
    };
    let voters = VoterSet::new(1..=i32::try_from(options.voters).unwrap_or(0))
        .map_err(|e| failure(format!("bad voter count {}: {e}", options.voters)))?;
    let mut sim = Sim::new(seed, options, voters);
    let result = sim.run();
    result.map_err(|reason| SimFailure {
        seed,
        voters: options.voters,
        observers: options.observers,
        event: sim.events,
        time_ms: sim.now,
        reason,
    })
}

impl<'a> Sim<'a> {
    fn new(seed: u64, options: &'a SimOptions, voters: VoterSet) -> Self {
        let mut rng = Rng::new(seed ^ 0x6772_6567_6f72_7261); // "gregorra"
        let ids: Vec<NodeId> = voters
            .ids()
            .chain((0..options.observers as NodeId).map(|i| 101 + i))
            .collect();
        // Kafka's timeouts, or the same scaled down towards the network delays, where elections
        // collide and time out far more often.
        let election_timeout_ms = [1000, 300, 150][rng.below(3) as usize];
        let snapshot_chunk_bytes = [256, 1024, 4096][rng.below(3) as usize];
        let slots = ids
            .iter()
            .map(|&id| {
                let mut config = QuorumConfig::new(id, voters.clone());
                config.cluster_id = Some("gregor-sim".into());
                config.election_timeout_ms = election_timeout_ms;
                config.election_backoff_max_ms = election_timeout_ms;
                config.fetch_timeout_ms = 2 * election_timeout_ms;
                config.request_timeout_ms = 2 * election_timeout_ms;
                config.fetch_max_wait_ms = election_timeout_ms / 2;
                config.max_fetch_snapshot_bytes = snapshot_chunk_bytes;
                if voters.contains(id) {
                    config.broken_rule = options.broken_rule;
                }
                Slot {
                    id,
                    config,
                    node: None,
                    log_down: Some(MemoryLog::new()),
                    persisted: None,
                    clock_offset_ms: 0,
                    incarnation: 0,
                    group: 0,
                    tick_ms: rng.between(5, 40),
                    published_hw: 0,
                    last_epoch: 0,
                    verified_end: 0,
                }
            })
            .collect();
        let loss = [0.0, 0.01, 0.05, 0.15][rng.below(4) as usize];
        let duplicate = [0.0, 0.01, 0.05][rng.below(3) as usize];
        let max_delay_ms = [2, 10, 30, 80][rng.below(4) as usize];
        let torn_write = [0.0, 0.002, 0.01][rng.below(3) as usize];
        Self {
            seed,
            options,
            rng,
            now: 0,
            seq: 0,
            events: 0,
            queue: BTreeMap::new(),
            slots,
            checker: Checker::default(),
            loss,
            duplicate,
            max_delay_ms,
            torn_write,
            healed_at: None,
            post_heal_proposals: Vec::new(),
            next_value: 0,
            report: SimReport {
                seed,
                fingerprint: 0xcbf2_9ce4_8422_2325,
                ..SimReport::default()
            },
        }
    }

    fn schedule(&mut self, at: u64, event: Event) {
        self.seq += 1;
        self.queue.insert((at, self.seq), event);
    }

    fn trace(&self, what: impl FnOnce() -> String) {
        if self.options.trace {
            eprintln!("[seed {} t={:>6}] {}", self.seed, self.now, what());
        }
    }

    fn run(&mut self) -> Result<SimReport, String> {
        self.trace(|| {
            format!(
                "loss {} duplicate {} max delay {} ms torn writes {}",
                self.loss, self.duplicate, self.max_delay_ms, self.torn_write
            )
        });
        for i in 0..self.slots.len() {
            let at = self.rng.between(0, 50);
            self.schedule(at, Event::Restart { node: i });
        }
        let fault_phase = self.rng.between(
            self.options.max_fault_phase_ms / 4,
            self.options.max_fault_phase_ms,
        );
        let first_fault = self.rng.between(100, 1500);
        self.schedule(first_fault, Event::Fault);
        self.schedule(fault_phase, Event::Heal);
        self.schedule(100, Event::Propose);
        let first_snapshot = self.rng.between(200, 2000);
        self.schedule(first_snapshot, Event::Snapshot);

        while let Some(((at, _), event)) = self.queue.pop_first() {
            self.now = at;
            self.events += 1;
            if self.events > self.options.max_events {
                return Err(format!(
                    "event budget of {} exhausted (livelock?)",
                    self.options.max_events
                ));
            }
            self.handle(event)?;
            self.check()?;
            if let Some(healed) = self.healed_at {
                if self.post_heal_committed() {
                    self.report.events = self.events;
                    self.report.end_time_ms = self.now;
                    self.report.recovery_ms = self.now - healed;
                    self.report.committed_end_offset = self.checker.committed_end();
                    self.report.leaders_elected = self.checker.leaders_elected();
                    self.report.truncations = self.checker.truncations;
                    return Ok(self.report.clone());
                }
                if self.now > healed + self.options.liveness_bound_ms {
                    return Err(format!(
                        "liveness: no proposal made after the heal at t={healed} committed within {} ms (leaders: {})",
                        self.options.liveness_bound_ms,
                        self.describe_nodes()
                    ));
                }
            }
        }
        Err("event queue ran dry".into())
    }

    fn describe_nodes(&self) -> String {
        self.slots
            .iter()
            .map(|s| match &s.node {
                Some(n) => format!(
                    "{}:{:?}@{} leo {} hw {:?}",
                    s.id,
                    n.role(),
                    n.epoch(),
                    n.log().log_end_offset(),
                    n.high_watermark()
                ),
                None => format!("{}:down", s.id),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn node_now(&self, i: usize) -> u64 {
        self.now.saturating_add(self.slots[i].clock_offset_ms)
    }

    fn index_of(&self, id: NodeId) -> Option<usize> {
        self.slots.iter().position(|s| s.id == id)
    }

    /// Folds `values` into the run's fingerprint (FNV-1a over their bytes).
    fn fold(&mut self, values: &[u64]) {
        let mut h = self.report.fingerprint;
        for v in values {
            for b in v.to_le_bytes() {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
        }
        self.report.fingerprint = h;
    }

    fn handle(&mut self, event: Event) -> Result<(), String> {
        let (kind, target) = match &event {
            Event::Deliver { to, .. } => (1, *to as u64),
            Event::Tick { node, .. } => (2, *node as u64),
            Event::Propose => (3, 0),
            Event::Snapshot => (7, 0),
            Event::Fault => (4, 0),
            Event::Restart { node } => (5, *node as u64),
            Event::Heal => (6, 0),
        };
        self.fold(&[self.now, kind, target]);
        match event {
            Event::Deliver { from, to, message } => {
                let partitioned = self
                    .index_of(from)
                    .is_some_and(|f| self.slots[f].group != self.slots[to].group);
                if partitioned || self.slots[to].node.is_none() {
                    return Ok(());
                }
                let now = self.node_now(to);
                self.trace(|| format!("deliver {from} -> {}: {message:?}", self.slots[to].id));
                match &message {
                    Message::Response {
                        response: crate::message::Response::Fetch(f),
                        ..
                    } if f.diverging_epoch.is_some() => self.report.diverging_epochs += 1,
                    Message::Response {
                        response: crate::message::Response::FetchSnapshot(f),
                        ..
                    } if f.error.is_none() => self.report.snapshot_chunks += 1,
                    Message::Request {
                        request: crate::message::Request::Vote(v),
                        ..
                    } if v.pre_vote => self.report.pre_votes += 1,
                    Message::Request {
                        request: crate::message::Request::EndQuorumEpoch(_),
                        ..
                    } => self.report.end_quorum_epochs += 1,
                    _ => {}
                }
                let actions = match self.slots[to].node.as_mut() {
                    Some(node) => node.handle_message(from, message, now),
                    None => Vec::new(),
                };
                self.execute(to, actions)
            }
            Event::Tick { node, incarnation } => {
                if self.slots[node].incarnation != incarnation || self.slots[node].node.is_none() {
                    return Ok(());
                }
                let now = self.node_now(node);
                let actions = match self.slots[node].node.as_mut() {
                    Some(n) => n.tick(now),
                    None => Vec::new(),
                };
                let next = self.now + self.slots[node].tick_ms;
                self.schedule(next, Event::Tick { node, incarnation });
                self.execute(node, actions)
            }
            Event::Propose => {
                self.propose()?;
                let next = self.now + self.rng.between(20, 400);
                self.schedule(next, Event::Propose);
                Ok(())
            }
            Event::Snapshot => {
                self.take_snapshot()?;
                let next = self.now + self.rng.between(100, 1500);
                self.schedule(next, Event::Snapshot);
                Ok(())
            }
            Event::Fault => {
                if self.healed_at.is_none() {
                    self.fault()?;
                    let next = self.now + self.rng.between(50, 1200);
                    self.schedule(next, Event::Fault);
                }
                Ok(())
            }
            Event::Restart { node } => self.restart(node),
            Event::Heal => {
                self.trace(|| "heal: network whole, no loss, every node up".into());
                self.healed_at = Some(self.now);
                self.loss = 0.0;
                self.duplicate = 0.0;
                for s in &mut self.slots {
                    s.group = 0;
                }
                for i in 0..self.slots.len() {
                    if self.slots[i].node.is_none() {
                        self.restart(i)?;
                    }
                }
                Ok(())
            }
        }
    }

    /// The live node that leads the highest epoch, if any.
    fn current_leader(&self) -> Option<usize> {
        (0..self.slots.len())
            .filter(|&i| {
                self.slots[i]
                    .node
                    .as_ref()
                    .is_some_and(|n| n.role() == Role::Leader)
            })
            .max_by_key(|&i| self.slots[i].node.as_ref().map_or(0, |n| n.epoch()))
    }

    fn fault(&mut self) -> Result<(), String> {
        let n = self.slots.len();
        match self.rng.below(100) {
            0..=34 => {
                // Half of the crashes aim at the leader, where the protocol is most exposed.
                let target = match self.current_leader() {
                    Some(l) if self.rng.chance(0.5) => l,
                    _ => self.rng.below(n as u64) as usize,
                };
                if self.slots[target].node.is_some() {
                    self.crash(target, false);
                    let at = self.now + self.rng.between(100, 4000);
                    self.schedule(at, Event::Restart { node: target });
                }
            }
            35..=54 => {
                self.report.partitions += 1;
                match (self.rng.below(3), self.current_leader()) {
                    (0, Some(leader)) => {
                        // The leader alone, or with one other node, against the rest.
                        let buddy = self.rng.below(n as u64) as usize;
                        let with_buddy = self.rng.chance(0.5);
                        for (i, s) in self.slots.iter_mut().enumerate() {
                            s.group = u8::from(i == leader || (with_buddy && i == buddy));
                        }
                    }
                    (1, _) => {
                        let isolated = self.rng.below(n as u64) as usize;
                        for (i, s) in self.slots.iter_mut().enumerate() {
                            s.group = u8::from(i == isolated);
                        }
                    }
                    _ => {
                        for i in 0..n {
                            self.slots[i].group = self.rng.below(3) as u8;
                        }
                    }
                }
                let groups: Vec<u8> = self.slots.iter().map(|s| s.group).collect();
                self.trace(|| format!("partition {groups:?}"));
            }
            55..=59 => {
                // The leader resigns, as on a graceful shutdown.
                if let Some(l) = self.current_leader() {
                    self.trace(|| format!("leader {} resigns", self.slots[l].id));
                    let now = self.node_now(l);
                    let actions = match self.slots[l].node.as_mut() {
                        Some(node) => node.resign(now),
                        None => Vec::new(),
                    };
                    self.execute(l, actions)?;
                }
            }
            60..=69 => {
                self.trace(|| "network heals".into());
                for s in &mut self.slots {
                    s.group = 0;
                }
            }
            70..=77 => {
                let i = self.rng.below(n as u64) as usize;
                let jump = self.rng.between(100, 5000);
                self.slots[i].clock_offset_ms += jump;
                self.trace(|| format!("clock of {} jumps {jump} ms forward", self.slots[i].id));
            }
            78..=89 => {
                let down: Vec<usize> = (0..n).filter(|&i| self.slots[i].node.is_none()).collect();
                if !down.is_empty() {
                    let i = down[self.rng.below(down.len() as u64) as usize];
                    self.restart(i)?;
                }
            }
            _ => {
                self.loss = [0.0, 0.02, 0.1, 0.3][self.rng.below(4) as usize];
                self.trace(|| format!("loss now {}", self.loss));
            }
        }
        Ok(())
    }

    fn crash(&mut self, i: usize, torn: bool) {
        self.report.crashes += 1;
        if torn {
            self.report.torn_writes += 1;
        }
        let Some(node) = self.slots[i].node.take() else {
            return;
        };
        let mut log = node.into_log();
        let before = log.log_end_offset();
        log.crash(&mut self.rng);
        let after = log.log_end_offset();
        self.trace(|| {
            format!(
                "crash {}{} (log end {before} -> {after})",
                self.slots[i].id,
                if torn { " tearing a write" } else { "" }
            )
        });
        let slot = &mut self.slots[i];
        slot.log_down = Some(log);
        slot.incarnation += 1;
        slot.published_hw = 0;
    }

    fn restart(&mut self, i: usize) -> Result<(), String> {
        if self.slots[i].node.is_some() {
            return Ok(());
        }
        let Some(log) = self.slots[i].log_down.take() else {
            return Ok(());
        };
        let now = self.node_now(i);
        let rng = self.rng.fork();
        let slot = &mut self.slots[i];
        slot.incarnation += 1;
        slot.published_hw = log.high_watermark();
        slot.last_epoch = slot.persisted.map_or(0, |p| p.epoch);
        let (node, actions) = RaftNode::new(slot.config.clone(), log, slot.persisted, rng, now);
        let (id, incarnation, tick) = (slot.id, slot.incarnation, slot.tick_ms);
        self.trace(|| format!("start {id}: {:?} epoch {}", node.role(), node.epoch()));
        self.slots[i].node = Some(node);
        self.schedule(
            self.now + tick,
            Event::Tick {
                node: i,
                incarnation,
            },
        );
        self.execute(i, actions)
    }

    fn propose(&mut self) -> Result<(), String> {
        let live: Vec<usize> = (0..self.slots.len())
            .filter(|&i| self.slots[i].node.is_some())
            .collect();
        if live.is_empty() {
            return Ok(());
        }
        // Mostly the newest leader, as a client following NOT_LEADER hints would find.
        let leader = live
            .iter()
            .copied()
            .filter(|&i| {
                self.slots[i]
                    .node
                    .as_ref()
                    .is_some_and(|n| n.role() == Role::Leader)
            })
            .max_by_key(|&i| self.slots[i].node.as_ref().map_or(0, |n| n.epoch()));
        let target = match leader {
            Some(l) if self.rng.chance(0.8) => l,
            _ => live[self.rng.below(live.len() as u64) as usize],
        };
        self.next_value += 1;
        let count = self.rng.between(1, 3) as usize;
        let values: Vec<Bytes> = (0..count)
            .map(|k| Bytes::from(format!("seed{}-value{}-{k}", self.seed, self.next_value)))
            .collect();
        let now = self.node_now(target);
        let Some(node) = self.slots[target].node.as_mut() else {
            return Ok(());
        };
        match node.propose(&values, now) {
            Ok((proposed, actions)) => {
                self.report.proposals += 1;
                let crc = node.log().batches().last().map_or(0, |b| b.crc);
                if self.healed_at.is_some() {
                    self.post_heal_proposals.push(Proposal {
                        base_offset: proposed.base_offset,
                        epoch: proposed.epoch,
                        crc,
                    });
                }
                self.trace(|| format!("propose to {} -> {proposed:?}", self.slots[target].id));
                self.execute(target, actions)
            }
            Err(_) => Ok(()),
        }
    }

    /// A random live node snapshots its state machine (its snapshot at the log start plus the
    /// batches after it) at a random committed batch boundary past its latest snapshot, and
    /// most of the time deletes its log before it.
    fn take_snapshot(&mut self) -> Result<(), String> {
        let live: Vec<usize> = (0..self.slots.len())
            .filter(|&i| self.slots[i].node.is_some())
            .collect();
        if live.is_empty() {
            return Ok(());
        }
        let i = live[self.rng.below(live.len() as u64) as usize];
        let pick = self.rng.below(u64::MAX);
        let delete = self.rng.chance(0.8);
        let now = millis(self.node_now(i));
        let id = self.slots[i].id;
        let Some(node) = self.slots[i].node.as_mut() else {
            return Ok(());
        };
        let log = node.log();
        let start = log.log_start_offset();
        let hw = log.high_watermark();
        let latest = log.latest_snapshot_id().map_or(0, |s| s.offset);
        // Boundaries: the ends of the batches wholly in [log start, hw), past the latest
        // snapshot.
        let batches = log.batches();
        if batches.first().is_some_and(|b| b.base_offset != start) {
            return Ok(());
        }
        let ends: Vec<(i64, i32, usize)> = batches
            .iter()
            .enumerate()
            .filter(|(_, b)| b.last_offset < hw && b.last_offset + 1 > latest)
            .map(|(k, b)| (b.last_offset + 1, b.epoch, k))
            .collect();
        if ends.is_empty() {
            return Ok(());
        }
        let (end, epoch, last_index) = ends[(pick % ends.len() as u64) as usize];
        let mut values = Vec::new();
        if start > 0 {
            let Some(base) = log.earliest_snapshot_id().filter(|s| s.offset == start) else {
                return Err(format!(
                    "node {id} has log start {start} and no snapshot there"
                ));
            };
            let snapshot = log
                .read_snapshot(base)
                .map_err(|e| format!("node {id}: reading snapshot {base:?}: {e}"))?;
            values = checker::snapshot_values(&snapshot)?;
        }
        values.extend(batches[..=last_index].iter().map(|b| b.bytes.clone()));
        let snapshot_id = crate::types::OffsetAndEpoch::new(end, epoch);
        let log = node.log_mut();
        log.write_snapshot(snapshot_id, &values, now)
            .map_err(|e| format!("node {id}: writing snapshot {snapshot_id:?}: {e}"))?;
        let snapshot = log
            .read_snapshot(snapshot_id)
            .map_err(|e| format!("node {id}: reading snapshot {snapshot_id:?}: {e}"))?;
        if delete {
            log.delete_before(snapshot_id, now)
                .map_err(|e| format!("node {id}: deleting before {snapshot_id:?}: {e}"))?;
        }
        self.checker.check_snapshot(snapshot_id, &snapshot)?;
        self.report.snapshots_taken += 1;
        self.fold(&[8, end as u64, epoch as u64, u64::from(delete)]);
        self.trace(|| {
            format!(
                "node {id} snapshots {snapshot_id:?}{}",
                if delete {
                    ", deletes the log before it"
                } else {
                    ""
                }
            )
        });
        Ok(())
    }

    fn execute(&mut self, i: usize, actions: Vec<Action>) -> Result<(), String> {
        for action in actions {
            let digest = match &action {
                Action::PersistElectionState(s) => [
                    1,
                    s.epoch as u64,
                    s.leader_id.map_or(u64::MAX, |l| l as u64),
                    s.voted_id.map_or(u64::MAX, |v| v as u64),
                ],
                Action::FlushLog { end_offset } => [2, *end_offset as u64, 0, 0],
                Action::Send { to, message } => [3, *to as u64, message_kind(message), 0],
                Action::HighWatermark(hw) => [4, *hw as u64, 0, 0],
                Action::LeaderChange { epoch, leader_id } => [
                    5,
                    *epoch as u64,
                    leader_id.map_or(u64::MAX, |l| l as u64),
                    0,
                ],
                Action::SnapshotInstalled { snapshot_id } => {
                    [6, snapshot_id.offset as u64, snapshot_id.epoch as u64, 0]
                }
            };
            self.fold(&digest);
            if action.is_barrier() && self.healed_at.is_none() && self.rng.chance(self.torn_write) {
                // The write never completes: it and everything after it are lost.
                self.crash(i, true);
                let at = self.now + self.rng.between(100, 3000);
                self.schedule(at, Event::Restart { node: i });
                return Ok(());
            }
            match action {
                Action::PersistElectionState(state) => {
                    let slot = &mut self.slots[i];
                    if let Some(previous) = slot.persisted {
                        if state.epoch < previous.epoch {
                            return Err(format!(
                                "node {} persisted epoch {} after {}",
                                slot.id, state.epoch, previous.epoch
                            ));
                        }
                        if state.epoch == previous.epoch
                            && previous.voted_id.is_some()
                            && state.voted_id != previous.voted_id
                        {
                            return Err(format!(
                                "node {} changed its vote in epoch {} from {:?} to {:?}",
                                slot.id, state.epoch, previous.voted_id, state.voted_id
                            ));
                        }
                    }
                    slot.persisted = Some(state);
                }
                Action::FlushLog { end_offset } => {
                    if let Some(node) = self.slots[i].node.as_mut() {
                        node.log_mut().flush(end_offset);
                    }
                }
                Action::Send { to, message } => self.send(i, to, message),
                Action::HighWatermark(hw) => {
                    if let Some(node) = self.slots[i].node.as_ref() {
                        // A leader's high watermark starts past everything committed before
                        // its epoch: anything lower means committed records are not on a
                        // majority any more.
                        let required = self.checker.required_end(node.epoch());
                        if node.role() == Role::Leader && hw < required {
                            return Err(format!(
                                "leader {} of epoch {} published high watermark {hw} below the {required} committed before its epoch",
                                self.slots[i].id,
                                node.epoch()
                            ));
                        }
                    }
                    let slot = &mut self.slots[i];
                    let leo = slot.node.as_ref().map_or(0, |n| n.log().log_end_offset());
                    if hw < slot.published_hw {
                        return Err(format!(
                            "node {} published high watermark {hw} after {}",
                            slot.id, slot.published_hw
                        ));
                    }
                    if hw > leo {
                        return Err(format!(
                            "node {} published high watermark {hw} past its log end {leo}",
                            slot.id
                        ));
                    }
                    slot.published_hw = hw;
                }
                Action::LeaderChange { .. } => {}
                Action::SnapshotInstalled { snapshot_id } => {
                    let id = self.slots[i].id;
                    let Some(node) = self.slots[i].node.as_ref() else {
                        continue;
                    };
                    let log = node.log();
                    if log.log_start_offset() < snapshot_id.offset
                        && log.log_end_offset() < snapshot_id.offset
                    {
                        return Err(format!(
                            "node {id} installed {snapshot_id:?} but its log is [{}, {})",
                            log.log_start_offset(),
                            log.log_end_offset()
                        ));
                    }
                    let snapshot = log.read_snapshot(snapshot_id).map_err(|e| {
                        format!("node {id}: reading installed {snapshot_id:?}: {e}")
                    })?;
                    self.checker.check_snapshot(snapshot_id, &snapshot)?;
                    self.report.snapshot_installs += 1;
                    self.trace(|| format!("node {id} installed snapshot {snapshot_id:?}"));
                }
            }
        }
        Ok(())
    }

    fn send(&mut self, from: usize, to: NodeId, message: Message) {
        let Some(t) = self.index_of(to) else {
            return;
        };
        if self.slots[from].group != self.slots[t].group || self.rng.chance(self.loss) {
            return;
        }
        let copies = if self.rng.chance(self.duplicate) {
            2
        } else {
            1
        };
        let from_id = self.slots[from].id;
        for _ in 0..copies {
            let at = self.now + self.rng.between(1, self.max_delay_ms);
            self.schedule(
                at,
                Event::Deliver {
                    from: from_id,
                    to: t,
                    message: message.clone(),
                },
            );
        }
    }

    fn check(&mut self) -> Result<(), String> {
        for slot in &mut self.slots {
            if let Some(node) = &slot.node {
                self.report.max_epoch = self.report.max_epoch.max(node.epoch());
            }
            self.checker
                .check_node(slot, self.options.fail_on_anomalies)?;
        }
        Ok(())
    }

    fn post_heal_committed(&self) -> bool {
        self.post_heal_proposals
            .iter()
            .any(|p| self.checker.is_committed(p.base_offset, p.epoch, p.crc))
    }
}

fn millis(now_ms: u64) -> i64 {
    i64::try_from(now_ms).unwrap_or(i64::MAX)
}

/// A small number naming a message's kind, for the fingerprint.
fn message_kind(message: &Message) -> u64 {
    use crate::message::{Request, Response};
    match message {
        Message::Request { request, .. } => match request {
            Request::Vote(v) => 10 + u64::from(v.pre_vote),
            Request::BeginQuorumEpoch(_) => 12,
            Request::EndQuorumEpoch(_) => 13,
            Request::Fetch(f) => 14 + ((f.fetch_offset as u64) << 8),
            Request::FetchSnapshot(f) => 15 + ((f.position as u64) << 8),
        },
        Message::Response { response, .. } => match response {
            Response::Vote(v) => 20 + u64::from(v.vote_granted),
            Response::BeginQuorumEpoch(_) => 22,
            Response::EndQuorumEpoch(_) => 23,
            Response::Fetch(f) => 24 + ((f.records.len() as u64) << 8),
            Response::FetchSnapshot(f) => 25 + ((f.unaligned_records.len() as u64) << 8),
        },
    }
}
