//! A deterministic simulation of partition replication: the real leader core
//! ([`super::leader::LeaderState`]), the real follower decisions ([`super::follower`]) and the
//! real controller (`gregor_metadata::controller::Controller`: registration, heartbeats,
//! session fencing, leader election with ELR, AlterPartition) driven over a simulated network
//! with delays, dropped links, crashed and paused brokers, and an acks=all producer. One seed
//! replays exactly.
//!
//! What is modelled and what is not:
//! - one partition with replication factor 3 and `min.insync.replicas=2` on three brokers, one
//!   controller that commits at once (the KRaft quorum has its own simulator); brokers apply
//!   the committed metadata images in order, each with its own lag;
//! - a log is a list of `(leader epoch, value)` records with Kafka's leader-epoch cache
//!   semantics (`assign`, `truncate_from_end`, `end_offset_for`); a crash (kill -9) keeps the
//!   log (the page cache survives a process crash) and loses everything in memory; the high
//!   watermark restarts from the last `replication-offset-checkpoint` (every 5 s);
//! - the producer is idempotent: an attempt that fails or times out is retried (up to
//!   three times) with the same record; a leader whose log has it answers a duplicate, which
//!   waits for the high watermark by the replica manager's rule
//!   (`replica_manager::acks_all_required_offset`);
//! - an acks=all produce waits in a purgatory and is answered by the replica manager's own
//!   rule ([`super::leader::acks_all_answer`] and [`super::leader::batch_still_there`]); the
//!   purgatory's check only wakes the request task, which computes its answer later: mostly at
//!   once, sometimes seconds later (a response queued behind a slower one on the same
//!   connection), when the partition may have changed hands and come back;
//! - faults: crash and restart, pause (SIGSTOP: nothing is processed, messages queue), cut
//!   links between two brokers or between a broker and the controller; then everything heals
//!   and the cluster must converge.
//!
//! Invariants, checked at every step:
//! - **committed prefix** (state machine safety): the records below any broker's high
//!   watermark are the same on every broker and never change; the global committed log is the
//!   longest such prefix seen;
//! - **leader completeness**: a broker serving as leader (appending or answering a fetch) has
//!   every committed record;
//! - **acknowledged means committed**: an acks=all acknowledgement names a committed record;
//! - the high watermark is at most the log end offset; the committed ISR contains the leader
//!   and only replicas;
//! - after healing: every broker back in the ISR, identical logs, every acknowledged record
//!   present at its offset (liveness within a bound).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use gregor_metadata::controller::{
    BrokerHeartbeatRequest, BrokerRegistrationRequest, Controller, ControllerConfig, ManualClock,
    NewTopic,
};
use gregor_metadata::image::METADATA_VERSION_FEATURE;
use gregor_metadata::log::CommittedBatch;
use gregor_metadata::record::MetadataRecord;
use gregor_metadata::MetadataImage;
use gregor_protocol::metadata_records::{BrokerEndpoint, FeatureLevelRecord};
use gregor_raft::rng::Rng;
use uuid::Uuid;

use super::follower::{
    follower_high_watermark, on_fetch_response, resolve_out_of_range,
    truncation_for_diverging_epoch, EpochEndOffset, FetchDecision, FetchStatus, FetchedPartition,
    OutOfRange, PartitionFetchState,
};
use super::leader::{
    acks_all_answer, batch_still_there, BrokerLiveness, FollowerFetch, IsrChange,
    LeaderRegistration, LeaderState,
};
use crate::alter_partition::{build_request, outcome_of, AlterPartitionItem};
use crate::error_codes as ec;
use crate::replica_manager::acks_all_required_offset;
use gregor_log::AppendInfo;

const TOPIC: &str = "sim";
const BROKERS: [i32; 3] = [1, 2, 3];
const MIN_ISR: usize = 2;
const REPLICA_LAG_TIME_MAX_MS: i64 = 2_000;
const SESSION_TIMEOUT_MS: u64 = 3_000;
const HEARTBEAT_INTERVAL_MS: i64 = 500;
const CHECKPOINT_INTERVAL_MS: i64 = 5_000;
const FETCH_BACKOFF_MS: i64 = 100;
const FETCH_TIMEOUT_MS: i64 = 1_000;
const PRODUCE_TIMEOUT_MS: i64 = 3_000;
/// Retries of an idempotent producer for a record whose attempt failed or timed out (the same
/// producer id and sequence: a leader that has the batch answers it as a duplicate).
const PRODUCE_RETRIES: u32 = 3;
const MAX_RECORDS_PER_FETCH: usize = 20;
const ELR_FEATURE: &str = "eligible.leader.replicas.version";

/// How a run is shaped.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// The seed everything random comes from.
    pub seed: u64,
    /// Steps with faults (each advances the clock 1-20 ms).
    pub fault_steps: usize,
    /// Steps after healing in which the cluster must converge.
    pub heal_steps: usize,
    /// Probability per step that a fault starts.
    pub fault_rate: f64,
    /// Breaks the acks=all completion rule on purpose (answers without
    /// [`super::leader::batch_still_there`]), to show the checker catches a produce
    /// acknowledged after its batch was truncated away; only for the checker's own test.
    pub skip_batch_check: bool,
}

impl SimConfig {
    /// The default shape for `seed`: about a minute of simulated faults, then healing.
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            fault_steps: 6_000,
            heal_steps: 6_000,
            fault_rate: 0.004,
            skip_batch_check: false,
        }
    }
}

/// What a run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SimReport {
    /// Records appended by leaders.
    pub produced: u64,
    /// Records acknowledged (acks=all).
    pub acknowledged: u64,
    /// Produce attempts refused or failed (not leader, NOT_ENOUGH_REPLICAS, timeouts, ...).
    pub failed: u64,
    /// Idempotent retries a leader answered as duplicates (the batch already in its log).
    pub duplicates: u64,
    /// Leader changes in the committed metadata.
    pub leader_changes: u64,
    /// ISR changes committed by the controller.
    pub isr_changes: u64,
    /// Follower truncations.
    pub truncations: u64,
    /// Crashes, pauses and cut links injected.
    pub faults: u64,
    /// Length of the committed log at the end.
    pub committed: u64,
}

/// A broken invariant, with the seed and step to replay it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("seed {seed}, step {step} (t={now_ms} ms): {what}")]
pub struct Violation {
    /// The seed.
    pub seed: u64,
    /// The step.
    pub step: usize,
    /// Simulated time.
    pub now_ms: i64,
    /// What broke.
    pub what: String,
}

/// One record: the leader epoch it was written in and its value.
type Entry = (i32, u64);

/// A partition log with Kafka's leader-epoch cache semantics (`LeaderEpochFileCache`).
#[derive(Debug, Clone, Default)]
struct SimLog {
    entries: Vec<Entry>,
    /// (epoch, start offset), epochs increasing.
    epochs: Vec<(i32, i64)>,
    /// How many leading entries are known to equal the committed log (so each check only
    /// looks at what is new; a truncation lowers it).
    verified: usize,
}

impl SimLog {
    fn leo(&self) -> i64 {
        self.entries.len() as i64
    }

    fn latest_epoch(&self) -> Option<i32> {
        self.epochs.last().map(|e| e.0)
    }

    fn assign(&mut self, epoch: i32, start: i64) {
        if epoch >= 0 && self.latest_epoch().is_none_or(|l| l < epoch) {
            self.epochs.push((epoch, start));
        }
    }

    fn append(&mut self, entry: Entry) {
        self.assign(entry.0, self.leo());
        self.entries.push(entry);
    }

    /// Kafka's `UnifiedLog.truncateTo`: the epoch cache is truncated even when no record is
    /// (an epoch assigned at the log end offset that never got a record).
    fn truncate_to(&mut self, offset: i64) {
        let offset = offset.max(0).min(self.leo());
        self.entries.truncate(offset as usize);
        self.verified = self.verified.min(offset as usize);
        self.epochs.retain(|e| e.1 < offset);
    }

    /// The leader epoch of the record at `offset` (the replica manager's `epoch_of_offset`:
    /// the epoch cache's last entry starting at or below it).
    fn epoch_of(&self, offset: i64) -> Option<i32> {
        self.epochs
            .iter()
            .rev()
            .find(|e| e.1 <= offset)
            .map(|e| e.0)
    }

    /// `endOffsetFor`: the largest epoch `<=` `requested` and where it ends; (-1, -1) unknown.
    fn end_offset_for(&self, requested: i32) -> (i32, i64) {
        if requested < 0 {
            return (-1, -1);
        }
        if self.latest_epoch() == Some(requested) {
            return (requested, self.leo());
        }
        let Some(higher) = self.epochs.iter().find(|e| e.0 > requested) else {
            return (-1, -1);
        };
        match self.epochs.iter().rev().find(|e| e.0 <= requested) {
            Some(floor) => (floor.0, higher.1),
            None => (requested, higher.1),
        }
    }
}

/// The leader's check of a follower's `LastFetchedEpoch`: the real
/// [`super::leader::diverging_epoch`] over this log's epoch cache (no log start offset here).
fn diverging_epoch(
    log: &SimLog,
    last_fetched_epoch: i32,
    fetch_offset: i64,
) -> Result<Option<EpochEndOffset>, i16> {
    super::leader::diverging_epoch(
        log.end_offset_for(last_fetched_epoch),
        last_fetched_epoch,
        fetch_offset,
        0,
    )
    .map(|d| d.map(|(epoch, end_offset)| EpochEndOffset { epoch, end_offset }))
}

#[derive(Debug)]
enum Role {
    None,
    Leader(Box<LeaderState>),
    Follower {
        leader: i32,
        state: PartitionFetchState,
        /// The fetch in flight: (fetch offset, leader epoch, sent at).
        inflight: Option<(i64, i32, i64)>,
    },
}

#[derive(Debug)]
struct SimBroker {
    id: i32,
    alive: bool,
    /// Which process this is: a restart makes a new one, and the produce requests waiting in
    /// the old one's purgatory are gone with its connections.
    incarnation: u64,
    paused_until: Option<i64>,
    restart_at: i64,
    log: SimLog,
    hw: i64,
    checkpoint_hw: i64,
    last_checkpoint_ms: i64,
    role: Role,
    /// The index into `Sim::images` this broker has applied (None before its first).
    applied: Option<usize>,
    broker_epoch: i64,
    registered: bool,
    last_heartbeat_ms: i64,
    last_isr_check_ms: i64,
    /// The ISR change in flight to the controller, if any.
    alter_inflight: bool,
    /// When the last AlterPartition was sent (the manager resends an unanswered one, as
    /// Kafka's `AlterPartitionManager` does after a request timeout or disconnection).
    alter_sent_ms: i64,
    /// The error of the last AlterPartition answer (for reports).
    last_alter_error: i16,
}

impl SimBroker {
    fn running(&self, now: i64) -> bool {
        self.alive && self.paused_until.is_none_or(|t| t <= now)
    }
}

#[derive(Debug, Clone)]
enum Msg {
    Fetch {
        from: i32,
        to: i32,
        fetch_offset: i64,
        current_leader_epoch: i32,
        last_fetched_epoch: i32,
        broker_epoch: i64,
    },
    FetchResponse {
        from: i32,
        to: i32,
        fetch_offset: i64,
        leader_epoch: i32,
        response: FetchedPartition,
        records: Vec<Entry>,
    },
    AlterPartition {
        from: i32,
        broker_epoch: i64,
        change: IsrChange,
    },
    AlterPartitionResponse {
        to: i32,
        change_id: u64,
        error_code: i16,
    },
}

impl Msg {
    /// (sender, receiver); 0 is the controller.
    fn ends(&self) -> (i32, i32) {
        match self {
            Msg::Fetch { from, to, .. } | Msg::FetchResponse { from, to, .. } => (*from, *to),
            Msg::AlterPartition { from, .. } => (*from, 0),
            Msg::AlterPartitionResponse { to, .. } => (0, *to),
        }
    }
}

/// An acks=all produce waiting in a leader's purgatory (the replica manager's
/// `DelayedProduce`).
struct Pending {
    broker: i32,
    /// The broker process it waits in.
    incarnation: u64,
    /// The leader epoch of the batch's records when appended (`epoch_of_offset`).
    batch_epoch: Option<i32>,
    offset: i64,
    value: u64,
    deadline: i64,
    /// Retries the idempotent producer has left for this record.
    retries_left: u32,
    /// When the woken request task evaluates its answer: the purgatory's check only wakes it,
    /// and the answer is computed from the state at that later time, which may have moved on
    /// meanwhile (leader to follower, truncation, another leader's records, leader again).
    answer_at: Option<i64>,
}

struct Sim {
    config: SimConfig,
    rng: Rng,
    now: i64,
    step: usize,
    clock: Arc<ManualClock>,
    controller: Controller,
    images: Vec<Arc<MetadataImage>>,
    topic_id: Uuid,
    brokers: BTreeMap<i32, SimBroker>,
    network: Vec<(i64, Msg)>,
    /// Cut links (unordered pairs, 0 = the controller) until a time.
    cuts: BTreeMap<(i32, i32), i64>,
    pending: Vec<Pending>,
    next_value: u64,
    committed: Vec<Entry>,
    acked: BTreeMap<i64, u64>,
    report: SimReport,
    last_leader: Option<(i32, i32)>,
    last_isr: Vec<i32>,
    healing: bool,
}

/// Runs one seed.
///
/// # Errors
/// The first [`Violation`] of an invariant.
pub fn run(config: SimConfig) -> Result<SimReport, Violation> {
    let mut sim = Sim::new(config)?;
    for _ in 0..sim.config.fault_steps {
        sim.tick(true)?;
    }
    sim.heal();
    for _ in 0..sim.config.heal_steps {
        sim.tick(false)?;
        if sim.converged() {
            break;
        }
    }
    sim.check_final()?;
    sim.report.committed = sim.committed.len() as u64;
    Ok(sim.report)
}

impl Sim {
    fn new(config: SimConfig) -> Result<Self, Violation> {
        let clock = Arc::new(ManualClock::default());
        let controller = Controller::with_config(
            MetadataImage::default(),
            ControllerConfig {
                session_timeout_ms: SESSION_TIMEOUT_MS,
                clock: clock.clone(),
                placement_seed: Some(config.seed),
                ..ControllerConfig::default()
            },
        );
        let rng = Rng::new(config.seed);
        let brokers = BROKERS
            .iter()
            .map(|id| {
                (
                    *id,
                    SimBroker {
                        id: *id,
                        alive: true,
                        incarnation: 0,
                        paused_until: None,
                        restart_at: 0,
                        log: SimLog::default(),
                        hw: 0,
                        checkpoint_hw: 0,
                        last_checkpoint_ms: 0,
                        role: Role::None,
                        applied: None,
                        broker_epoch: -1,
                        registered: false,
                        last_heartbeat_ms: i64::MIN / 2,
                        last_isr_check_ms: 0,
                        alter_inflight: false,
                        alter_sent_ms: 0,
                        last_alter_error: 0,
                    },
                )
            })
            .collect();
        let mut sim = Self {
            config,
            rng,
            now: 0,
            step: 0,
            clock,
            controller,
            images: Vec::new(),
            topic_id: Uuid::nil(),
            brokers,
            network: Vec::new(),
            cuts: BTreeMap::new(),
            pending: Vec::new(),
            next_value: 1,
            committed: Vec::new(),
            acked: BTreeMap::new(),
            report: SimReport::default(),
            last_leader: None,
            last_isr: Vec::new(),
            healing: false,
        };
        sim.commit(vec![
            FeatureLevelRecord {
                name: METADATA_VERSION_FEATURE.into(),
                feature_level: 33,
                ..Default::default()
            }
            .into(),
            FeatureLevelRecord {
                name: ELR_FEATURE.into(),
                feature_level: 1,
                ..Default::default()
            }
            .into(),
        ]);
        // Register the brokers and let them catch up and unfence, then create the topic.
        for _ in 0..200 {
            sim.tick(false)?;
            if sim.controller.image().unfenced_brokers().count() == BROKERS.len() {
                break;
            }
        }
        let created = sim.controller.create_topics(
            vec![NewTopic {
                name: TOPIC.into(),
                num_partitions: 1,
                replication_factor: 3,
                assignments: Vec::new(),
                configs: BTreeMap::from([("min.insync.replicas".to_string(), MIN_ISR.to_string())]),
            }],
            false,
        );
        match created.response.first() {
            Some(Ok(id)) => sim.topic_id = *id,
            other => return Err(sim.violation(format!("creating the topic: {other:?}"))),
        }
        sim.commit(created.records);
        Ok(sim)
    }

    fn violation(&self, what: String) -> Violation {
        Violation {
            seed: self.config.seed,
            step: self.step,
            now_ms: self.now,
            what,
        }
    }

    fn commit(&mut self, records: Vec<MetadataRecord>) {
        if records.is_empty() {
            return;
        }
        let batch = CommittedBatch {
            base_offset: self.controller.image().offset,
            epoch: 1,
            records: records.into(),
        };
        self.controller.replay(&batch);
        self.images.push(Arc::new(self.controller.image().clone()));
        if let Some((leader, epoch, isr)) = self.partition_of(self.images.len() - 1) {
            if self
                .last_leader
                .is_some_and(|(l, e)| l != leader || e != epoch)
            {
                self.report.leader_changes += 1;
            }
            if !self.last_isr.is_empty() && self.last_isr != isr {
                self.report.isr_changes += 1;
            }
            self.last_leader = Some((leader, epoch));
            self.last_isr = isr;
        }
    }

    fn partition_of(&self, image: usize) -> Option<(i32, i32, Vec<i32>)> {
        let t = self.images.get(image)?.topic(TOPIC)?;
        let p = t.partitions.get(&0)?;
        Some((p.leader, p.leader_epoch, p.isr.clone()))
    }

    /// The leader and leader epoch of the latest committed metadata. Leader completeness is
    /// owed by this leader only: a deposed leader that has not seen the new metadata yet may
    /// still serve (its high watermark cannot move without the controller's ISR).
    fn current_leader(&self) -> Option<(i32, i32)> {
        let (leader, epoch, _) = self.partition_of(self.images.len().checked_sub(1)?)?;
        Some((leader, epoch))
    }

    fn link_up(&self, a: i32, b: i32) -> bool {
        let key = (a.min(b), a.max(b));
        self.cuts.get(&key).is_none_or(|until| *until <= self.now)
    }

    fn send(&mut self, msg: Msg) {
        let delay = self.rng.between(1, 30) as i64;
        self.network.push((self.now + delay, msg));
    }

    // ----- one step -----

    fn tick(&mut self, faults: bool) -> Result<(), Violation> {
        self.step += 1;
        self.now += self.rng.between(1, 20) as i64;
        self.clock.advance(self.now as u64 - self.clock_now());
        if faults && self.rng.chance(self.config.fault_rate) {
            self.inject_fault();
        }
        self.restart_due();
        self.deliver()?;
        let ids: Vec<i32> = self.brokers.keys().copied().collect();
        for id in &ids {
            self.broker_work(*id)?;
        }
        // The controller fences brokers whose session expired.
        loop {
            let r = self.controller.fence_stale_broker();
            let fenced = r.response;
            self.commit(r.records);
            if fenced.is_none() {
                break;
            }
        }
        if self.rng.chance(0.3) {
            self.produce()?;
        }
        self.complete_produces()?;
        self.check_state()
    }

    fn clock_now(&self) -> u64 {
        use gregor_metadata::controller::ControllerClock;
        self.clock.now_ms()
    }

    fn inject_fault(&mut self) {
        self.report.faults += 1;
        let ids: Vec<i32> = BROKERS.to_vec();
        let victim = ids[self.rng.below(ids.len() as u64) as usize];
        match self.rng.below(4) {
            0 => {
                // kill -9, back after 0.2-5 s.
                let restart = self.now + self.rng.between(200, 5_000) as i64;
                if let Some(b) = self.brokers.get_mut(&victim) {
                    if b.alive {
                        b.alive = false;
                        b.restart_at = restart;
                    }
                }
            }
            1 => {
                // SIGSTOP for 0.5-6 s.
                let until = self.now + self.rng.between(500, 6_000) as i64;
                if let Some(b) = self.brokers.get_mut(&victim) {
                    b.paused_until = Some(until);
                }
            }
            2 => {
                // A cut link between two brokers.
                let other = ids[self.rng.below(ids.len() as u64) as usize];
                if other != victim {
                    let until = self.now + self.rng.between(500, 6_000) as i64;
                    self.cuts
                        .insert((victim.min(other), victim.max(other)), until);
                }
            }
            _ => {
                // A cut link to the controller.
                let until = self.now + self.rng.between(500, 6_000) as i64;
                self.cuts.insert((0, victim), until);
            }
        }
    }

    fn heal(&mut self) {
        self.healing = true;
        self.cuts.clear();
        let now = self.now;
        for b in self.brokers.values_mut() {
            b.paused_until = None;
            if !b.alive {
                b.restart_at = now;
            }
        }
    }

    fn restart_due(&mut self) {
        let now = self.now;
        for b in self.brokers.values_mut() {
            if !b.alive && b.restart_at <= now {
                // A new process: the log and the checkpointed high watermark survive.
                b.alive = true;
                b.incarnation += 1;
                b.paused_until = None;
                b.role = Role::None;
                b.applied = None;
                b.registered = false;
                b.broker_epoch = -1;
                b.hw = b.checkpoint_hw.min(b.log.leo());
                b.last_heartbeat_ms = i64::MIN / 2;
                b.alter_inflight = false;
            }
        }
        // Messages to or from a dead process's connections are lost with them.
        let alive: BTreeSet<i32> = self
            .brokers
            .values()
            .filter(|b| b.alive)
            .map(|b| b.id)
            .collect();
        self.network.retain(|(_, m)| {
            let (a, b) = m.ends();
            (a == 0 || alive.contains(&a)) && (b == 0 || alive.contains(&b))
        });
    }

    fn deliver(&mut self) -> Result<(), Violation> {
        let now = self.now;
        let mut due = Vec::new();
        let mut keep = Vec::new();
        for (at, m) in std::mem::take(&mut self.network) {
            let (_, to) = m.ends();
            let receiver_running = to == 0 || self.brokers.get(&to).is_some_and(|b| b.running(now));
            if at <= now && receiver_running {
                due.push(m);
            } else {
                keep.push((at, m));
            }
        }
        self.network = keep;
        for m in due {
            let (a, b) = m.ends();
            if !self.link_up(a, b) {
                continue;
            }
            match m {
                Msg::Fetch {
                    from,
                    to,
                    fetch_offset,
                    current_leader_epoch,
                    last_fetched_epoch,
                    broker_epoch,
                } => self.leader_fetch(
                    to,
                    from,
                    fetch_offset,
                    current_leader_epoch,
                    last_fetched_epoch,
                    broker_epoch,
                )?,
                Msg::FetchResponse {
                    from,
                    to,
                    fetch_offset,
                    leader_epoch,
                    response,
                    records,
                } => {
                    self.follower_response(to, from, fetch_offset, leader_epoch, response, records)?
                }
                Msg::AlterPartition {
                    from,
                    broker_epoch,
                    change,
                } => self.controller_alter_partition(from, broker_epoch, change),
                Msg::AlterPartitionResponse {
                    to,
                    change_id,
                    error_code,
                } => {
                    if let Some(b) = self.brokers.get_mut(&to) {
                        b.last_alter_error = error_code;
                        match (&mut b.role, outcome_of(error_code)) {
                            (Role::Leader(state), Some(outcome)) => {
                                b.alter_inflight = false;
                                state.on_alter_partition_outcome(change_id, outcome);
                            }
                            // Retriable (Kafka's manager sends it again after a backoff).
                            (Role::Leader(_), None) => {}
                            _ => b.alter_inflight = false,
                        }
                    }
                    self.update_leader_hw(to)?;
                }
            }
        }
        Ok(())
    }

    // ----- the leader -----

    fn leader_fetch(
        &mut self,
        leader: i32,
        follower: i32,
        fetch_offset: i64,
        current_leader_epoch: i32,
        last_fetched_epoch: i32,
        broker_epoch: i64,
    ) -> Result<(), Violation> {
        let now = self.now;
        let current_leader = self.current_leader();
        let Some(b) = self.brokers.get_mut(&leader) else {
            return Ok(());
        };
        let leo = b.log.leo();
        let mut response = FetchedPartition {
            error_code: ec::NONE,
            high_watermark: -1,
            log_start_offset: -1,
            diverging_epoch: None,
            records_bytes: 0,
        };
        let mut records = Vec::new();
        let mut isr_change = None;
        match &mut b.role {
            Role::Leader(state) => {
                if current_leader_epoch < state.leader_epoch() {
                    response.error_code = ec::FENCED_LEADER_EPOCH;
                } else if current_leader_epoch > state.leader_epoch() {
                    response.error_code = ec::UNKNOWN_LEADER_EPOCH;
                } else {
                    let diverging = if last_fetched_epoch >= 0 {
                        diverging_epoch(&b.log, last_fetched_epoch, fetch_offset)
                    } else {
                        Ok(None)
                    };
                    match diverging {
                        Err(code) => response.error_code = code,
                        Ok(Some(d)) => {
                            response.diverging_epoch = Some(d);
                            response.high_watermark = state.high_watermark();
                            response.log_start_offset = 0;
                        }
                        Ok(None) if fetch_offset > leo || fetch_offset < 0 => {
                            response.error_code = ec::OFFSET_OUT_OF_RANGE;
                        }
                        Ok(None) => {
                            let end = (fetch_offset as usize + MAX_RECORDS_PER_FETCH)
                                .min(b.log.entries.len());
                            records = b.log.entries[fetch_offset as usize..end].to_vec();
                            // Kafka's readRecords: the HW as of before the fetch state update.
                            response.high_watermark = state.high_watermark();
                            response.log_start_offset = 0;
                            response.records_bytes = records.len();
                            match state.update_follower_fetch_state(
                                FollowerFetch {
                                    replica: follower,
                                    fetch_offset,
                                    log_start_offset: 0,
                                    broker_epoch,
                                },
                                leo,
                                0,
                                now,
                            ) {
                                Ok(update) => isr_change = update.isr_change,
                                Err(e) => {
                                    records.clear();
                                    response = FetchedPartition {
                                        error_code: e.error_code(),
                                        high_watermark: -1,
                                        log_start_offset: -1,
                                        diverging_epoch: None,
                                        records_bytes: 0,
                                    };
                                }
                            }
                        }
                    }
                }
            }
            _ => response.error_code = ec::NOT_LEADER_OR_FOLLOWER,
        }
        let leader_epoch = match &b.role {
            Role::Leader(state) => state.leader_epoch(),
            _ => -1,
        };
        if response.error_code == ec::NONE && current_leader == Some((leader, leader_epoch)) {
            check_leader_complete(&mut b.log, &self.committed).map_err(|w| Violation {
                seed: self.config.seed,
                step: self.step,
                now_ms: now,
                what: format!("leader {leader} answering a fetch: {w}"),
            })?;
        }
        if let Some(change) = isr_change {
            self.submit_alter(leader, change);
        }
        self.update_leader_hw(leader)?;
        self.send(Msg::FetchResponse {
            from: leader,
            to: follower,
            fetch_offset,
            leader_epoch: current_leader_epoch,
            response,
            records,
        });
        Ok(())
    }

    fn submit_alter(&mut self, leader: i32, change: IsrChange) {
        let Some(b) = self.brokers.get_mut(&leader) else {
            return;
        };
        b.alter_inflight = true;
        b.alter_sent_ms = self.now;
        let broker_epoch = b.broker_epoch;
        self.send(Msg::AlterPartition {
            from: leader,
            broker_epoch,
            change,
        });
    }

    fn controller_alter_partition(&mut self, from: i32, broker_epoch: i64, change: IsrChange) {
        let change_id = change.id;
        let request = build_request(
            from,
            broker_epoch,
            &[AlterPartitionItem {
                topic_id: self.topic_id,
                topic_partition: gregor_log::TopicPartition::new(TOPIC.to_string(), 0),
                change,
                on_complete: Box::new(|_| {}),
            }],
        );
        let error_code = match self.controller.alter_partition(request) {
            Err(e) => e.kafka_error_code(),
            Ok(result) => {
                let code = result
                    .response
                    .topics
                    .first()
                    .and_then(|t| t.partitions.first())
                    .map_or(ec::UNKNOWN_SERVER_ERROR, |p| p.error_code);
                self.commit(result.records);
                code
            }
        };
        self.send(Msg::AlterPartitionResponse {
            to: from,
            change_id,
            error_code,
        });
    }

    /// Re-reads a leader's high watermark after its state changed, and records it.
    fn update_leader_hw(&mut self, id: i32) -> Result<(), Violation> {
        let now = self.now;
        let Some(b) = self.brokers.get_mut(&id) else {
            return Ok(());
        };
        let leo = b.log.leo();
        if let Role::Leader(state) = &mut b.role {
            state.maybe_increment_high_watermark(leo, 0, now);
            b.hw = state.high_watermark();
        }
        self.observe_hw(id)
    }

    // ----- the follower -----

    fn follower_response(
        &mut self,
        follower: i32,
        leader: i32,
        fetch_offset: i64,
        leader_epoch: i32,
        response: FetchedPartition,
        records: Vec<Entry>,
    ) -> Result<(), Violation> {
        let now = self.now;
        let leader_offsets = self
            .brokers
            .get(&leader)
            .filter(|l| l.running(now) && self.link_up(leader, follower))
            .map(|l| (l.log.leo(), 0i64));
        let Some(b) = self.brokers.get_mut(&follower) else {
            return Ok(());
        };
        let Role::Follower {
            leader: current,
            state,
            inflight,
        } = &mut b.role
        else {
            return Ok(());
        };
        if *current != leader {
            return Ok(());
        }
        *inflight = None;
        let mut truncated = false;
        match on_fetch_response(state, fetch_offset, leader_epoch, &response) {
            FetchDecision::Ignore => {}
            FetchDecision::Append {
                leader_high_watermark,
                ..
            } => {
                for r in records {
                    b.log.append(r);
                }
                state.advance(b.log.leo(), b.log.latest_epoch());
                b.hw = follower_high_watermark(leader_high_watermark, 0, b.log.leo());
            }
            FetchDecision::Diverged(d) => {
                let log = &b.log;
                let t = truncation_for_diverging_epoch(d, log.leo(), |e| {
                    let (epoch, end_offset) = log.end_offset_for(e);
                    (epoch >= 0 && end_offset >= 0).then_some(EpochEndOffset { epoch, end_offset })
                });
                if t.offset < b.log.leo() {
                    truncated = true;
                }
                b.log.truncate_to(t.offset);
                b.hw = b.hw.min(b.log.leo());
                state.advance(b.log.leo(), b.log.latest_epoch());
            }
            FetchDecision::ResolveOutOfRange => match leader_offsets {
                Some((leader_leo, leader_start)) => {
                    match resolve_out_of_range(leader_leo, leader_start, b.log.leo()) {
                        OutOfRange::TruncateTo(o) => {
                            truncated = o < b.log.leo();
                            b.log.truncate_to(o);
                        }
                        OutOfRange::TruncateFullyAndStartAt(_) => {
                            // No log start offsets in this model (no retention).
                        }
                        OutOfRange::FetchFrom(_) => {}
                    }
                    b.hw = b.hw.min(b.log.leo());
                    state.advance(b.log.leo(), b.log.latest_epoch());
                }
                None => state.delay(now, FETCH_BACKOFF_MS),
            },
            FetchDecision::AwaitMetadata => state.status = FetchStatus::AwaitingMetadata,
            FetchDecision::Backoff => state.delay(now, FETCH_BACKOFF_MS),
        }
        if truncated {
            self.report.truncations += 1;
        }
        self.observe_hw(follower)
    }

    // ----- every broker, every step -----

    fn broker_work(&mut self, id: i32) -> Result<(), Violation> {
        let now = self.now;
        if !self.brokers.get(&id).is_some_and(|b| b.running(now)) {
            return Ok(());
        }
        self.heartbeat(id);
        // Metadata arrives with a lag: most steps apply the next image, some apply all.
        let latest = self.images.len().checked_sub(1);
        let link = self.link_up(0, id);
        if let (Some(latest), true) = (latest, link) {
            let applied = self.brokers[&id].applied;
            if applied != Some(latest) && self.rng.chance(0.5) {
                let next = match applied {
                    None => latest,
                    Some(a) if self.rng.chance(0.5) => a + 1,
                    Some(_) => latest,
                };
                self.apply_image(id, next)?;
            }
        }
        let b = self.brokers.get_mut(&id).expect("broker");
        if now - b.last_checkpoint_ms >= CHECKPOINT_INTERVAL_MS {
            b.checkpoint_hw = b.hw;
            b.last_checkpoint_ms = now;
        }
        let leo = b.log.leo();
        let mut alter = None;
        let mut fetch = None;
        match &mut b.role {
            Role::Leader(state) => {
                if b.alter_inflight && now - b.alter_sent_ms > FETCH_TIMEOUT_MS {
                    // Unanswered (lost with a cut link or a dead controller connection): sent
                    // again.
                    alter = state.pending().cloned();
                } else if now - b.last_isr_check_ms >= REPLICA_LAG_TIME_MAX_MS / 2
                    && !b.alter_inflight
                {
                    b.last_isr_check_ms = now;
                    alter = state.maybe_shrink_isr(leo, now);
                }
            }
            Role::Follower {
                leader,
                state,
                inflight,
            } => {
                if inflight.is_some_and(|(_, _, at)| now - at > FETCH_TIMEOUT_MS) {
                    *inflight = None;
                }
                if inflight.is_none() && state.is_ready(now) {
                    *inflight = Some((state.fetch_offset, state.current_leader_epoch, now));
                    fetch = Some(Msg::Fetch {
                        from: id,
                        to: *leader,
                        fetch_offset: state.fetch_offset,
                        current_leader_epoch: state.current_leader_epoch,
                        last_fetched_epoch: state.last_fetched_epoch.unwrap_or(-1),
                        broker_epoch: b.broker_epoch,
                    });
                }
            }
            Role::None => {}
        }
        if let Some(change) = alter {
            self.submit_alter(id, change);
        }
        if let Some(m) = fetch {
            self.send(m);
        }
        Ok(())
    }

    fn heartbeat(&mut self, id: i32) {
        let now = self.now;
        if !self.link_up(0, id) {
            return;
        }
        let b = &self.brokers[&id];
        if now - b.last_heartbeat_ms < HEARTBEAT_INTERVAL_MS {
            return;
        }
        let offset = b
            .applied
            .and_then(|i| self.images.get(i))
            .map_or(-1, |img| img.offset as i64);
        if !b.registered {
            let incarnation = Uuid::from_u64_pair(self.rng.next_u64(), self.rng.next_u64());
            let result = self.controller.register_broker(BrokerRegistrationRequest {
                broker_id: id,
                incarnation_id: incarnation,
                listeners: vec![BrokerEndpoint {
                    name: "PLAINTEXT".into(),
                    host: "127.0.0.1".into(),
                    port: 9092,
                    security_protocol: 0,
                    ..Default::default()
                }],
                features: BrokerRegistrationRequest::supported_features(),
                rack: None,
                log_dirs: vec![Uuid::from_u64_pair(id as u64, 1)],
                previous_broker_epoch: -1,
            });
            let b = self.brokers.get_mut(&id).expect("broker");
            b.last_heartbeat_ms = now;
            if let Ok(r) = result {
                b.registered = true;
                b.broker_epoch = r.response;
                self.commit(r.records);
            }
            return;
        }
        let result = self.controller.broker_heartbeat(BrokerHeartbeatRequest {
            broker_id: id,
            broker_epoch: b.broker_epoch,
            current_metadata_offset: offset,
            want_fence: false,
            want_shut_down: false,
            cordoned_log_dirs: None,
            offline_log_dirs: Vec::new(),
        });
        let b = self.brokers.get_mut(&id).expect("broker");
        b.last_heartbeat_ms = now;
        match result {
            Ok(r) => self.commit(r.records),
            // STALE_BROKER_EPOCH and the like: register again.
            Err(_) => b.registered = false,
        }
    }

    /// Kafka's `ReplicaManager.applyDelta` for the one partition.
    fn apply_image(&mut self, id: i32, index: usize) -> Result<(), Violation> {
        let now = self.now;
        let image = self.images[index].clone();
        let b = self.brokers.get_mut(&id).expect("broker");
        b.applied = Some(index);
        let Some(p) = image.topic(TOPIC).and_then(|t| t.partitions.get(&0)) else {
            return Ok(());
        };
        let liveness: BTreeMap<i32, BrokerLiveness> = image
            .brokers
            .values()
            .map(|r| {
                (
                    r.broker_id,
                    BrokerLiveness {
                        broker_epoch: r.epoch,
                        fenced: r.fenced,
                        in_controlled_shutdown: r.in_controlled_shutdown,
                    },
                )
            })
            .collect();
        let leo = b.log.leo();
        if p.leader == id {
            let reg = LeaderRegistration {
                leader_epoch: p.leader_epoch,
                partition_epoch: p.partition_epoch,
                replicas: p.replicas.clone(),
                isr: p.isr.clone(),
                min_insync_replicas: MIN_ISR,
            };
            if !matches!(b.role, Role::Leader(_)) {
                b.role = Role::Leader(Box::new(LeaderState::new(
                    id,
                    REPLICA_LAG_TIME_MAX_MS,
                    b.hw,
                )));
                b.alter_inflight = false;
            }
            if let Role::Leader(state) = &mut b.role {
                state.set_brokers(liveness);
                if state.apply(&reg, leo, now) == Some(true) {
                    b.log.assign(p.leader_epoch, leo);
                }
            }
        } else if p.leader >= 0 && p.replicas.contains(&id) {
            let same = matches!(&b.role, Role::Follower { leader, state, .. }
                if *leader == p.leader && state.current_leader_epoch == p.leader_epoch);
            if !same {
                b.role = Role::Follower {
                    leader: p.leader,
                    state: PartitionFetchState::new(leo, p.leader_epoch, b.log.latest_epoch()),
                    inflight: None,
                };
            }
        } else {
            b.role = Role::None;
        }
        self.update_leader_hw(id)
    }

    // ----- the producer -----

    fn produce(&mut self) -> Result<(), Violation> {
        let value = self.next_value;
        self.next_value += 1;
        self.send_produce(value, PRODUCE_RETRIES)
    }

    /// One acks=all attempt for `value` by an idempotent producer: to the leader the client's
    /// metadata (any running broker's image) names. A leader whose log already has the value
    /// answers the attempt as a duplicate (`AppendInfo::duplicate`, the original offset) and
    /// the replica manager's rule ([`acks_all_required_offset`]) decides whether it waits for
    /// the high watermark.
    fn send_produce(&mut self, value: u64, retries_left: u32) -> Result<(), Violation> {
        let now = self.now;
        // The client's metadata comes from any running broker.
        let running: Vec<i32> = self
            .brokers
            .values()
            .filter(|b| b.running(now) && b.applied.is_some())
            .map(|b| b.id)
            .collect();
        if running.is_empty() {
            self.report.failed += 1;
            return Ok(());
        }
        let source = running[self.rng.below(running.len() as u64) as usize];
        let Some((leader, _, _)) = self.partition_of(self.brokers[&source].applied.unwrap_or(0))
        else {
            self.report.failed += 1;
            return Ok(());
        };
        let current_leader = self.current_leader();
        let Some(b) = self.brokers.get_mut(&leader).filter(|b| b.running(now)) else {
            self.report.failed += 1;
            return Ok(());
        };
        let Role::Leader(state) = &b.role else {
            self.report.failed += 1;
            return Ok(());
        };
        // NOT_ENOUGH_REPLICAS before the append (acks=all).
        if state.isr().len() < state.effective_min_isr() {
            self.report.failed += 1;
            return Ok(());
        }
        let epoch = state.leader_epoch();
        let incarnation = b.incarnation;
        let offset = match b.log.entries.iter().position(|e| e.1 == value) {
            Some(offset) => {
                // A duplicate: nothing is appended, the original offset is answered and
                // waited for (`acks_all_required_offset`).
                self.report.duplicates += 1;
                offset as i64
            }
            None => {
                let is_current = current_leader == Some((leader, epoch));
                check_leader_complete(&mut b.log, if is_current { &self.committed } else { &[] })
                    .map_err(|w| Violation {
                    seed: self.config.seed,
                    step: self.step,
                    now_ms: now,
                    what: format!("leader {leader} appending: {w}"),
                })?;
                let offset = b.log.leo();
                b.log.append((epoch, value));
                self.report.produced += 1;
                offset
            }
        };
        let info = AppendInfo {
            first_offset: offset,
            last_offset: offset,
            log_append_time_ms: -1,
            log_start_offset: 0,
            duplicate: false,
            records: 1,
            bytes: 0,
        };
        let Some(required_offset) = acks_all_required_offset(-1, &info) else {
            return Err(self.violation("acks=all without a required offset".into()));
        };
        let batch_epoch = self.brokers[&leader].log.epoch_of(offset);
        self.update_leader_hw(leader)?;
        let mut p = Pending {
            broker: leader,
            incarnation,
            batch_epoch,
            offset: required_offset - 1,
            value,
            deadline: now + PRODUCE_TIMEOUT_MS,
            retries_left,
            answer_at: None,
        };
        // The replica manager answers at once what is already decided (a single replica, or
        // followers already past the batch), else the produce waits in the purgatory.
        match self.produce_answer(&p, false) {
            Some(code) => {
                p.answer_at = Some(now);
                self.answer(p, code)
            }
            None => {
                self.pending.push(p);
                Ok(())
            }
        }
    }

    /// [`super::leader::acks_all_answer`] for `p` from its broker's state now, `None` while it
    /// waits.
    fn produce_answer(&self, p: &Pending, expired: bool) -> Option<i16> {
        let b = &self.brokers[&p.broker];
        let leader = match &b.role {
            Role::Leader(state) => Some(&**state),
            _ => None,
        };
        let required_offset = p.offset + 1;
        let survived = self.config.skip_batch_check
            || batch_still_there(p.batch_epoch, |e| b.log.end_offset_for(e), required_offset);
        acks_all_answer(leader, survived, required_offset, expired)
    }

    /// The producer gets `code` for `p`: acknowledged (0), or an error it retries with the
    /// same sequence.
    fn answer(&mut self, p: Pending, code: i16) -> Result<(), Violation> {
        if code == ec::NONE {
            return self.acknowledge(p.offset, p.value);
        }
        self.report.failed += 1;
        if p.retries_left > 0 {
            self.send_produce(p.value, p.retries_left - 1)?;
        }
        Ok(())
    }

    /// An acks=all acknowledgement of `value` at `offset`: it must name the committed record.
    fn acknowledge(&mut self, offset: i64, value: u64) -> Result<(), Violation> {
        if self.committed.get(offset as usize).map(|e| e.1) != Some(value) {
            return Err(self.violation(format!(
                "acknowledged value {value} at offset {offset} is not the committed record {:?}",
                self.committed.get(offset as usize)
            )));
        }
        self.acked.insert(offset, value);
        self.report.acknowledged += 1;
        Ok(())
    }

    /// The produce purgatory: a waiting produce whose check (`acks_all_answer` not `None`, or
    /// its timeout) passes is woken, and its request task answers from the state at a later
    /// step: mostly at once, sometimes after a scheduling delay of up to seconds (a loaded
    /// broker), during which the partition may change hands and come back. A produce in a
    /// crashed process is lost with its connection (the client's request times out and is
    /// retried); a paused process answers nothing.
    fn complete_produces(&mut self) -> Result<(), Violation> {
        let now = self.now;
        let mut still = Vec::new();
        let mut answers = Vec::new();
        for mut p in std::mem::take(&mut self.pending) {
            let b = &self.brokers[&p.broker];
            if !b.alive || b.incarnation != p.incarnation {
                answers.push((p, ec::REQUEST_TIMED_OUT));
                continue;
            }
            if !b.running(now) {
                still.push(p);
                continue;
            }
            if p.answer_at.is_none()
                && (now > p.deadline || self.produce_answer(&p, false).is_some())
            {
                let delay = match self.rng.below(20) {
                    0..=13 => 0,
                    14..=16 => self.rng.between(1, 50) as i64,
                    _ => self.rng.between(100, 3 * PRODUCE_TIMEOUT_MS as u64) as i64,
                };
                p.answer_at = Some(now + delay);
            }
            match p.answer_at {
                Some(at) if at <= now => {
                    let code = self
                        .produce_answer(&p, true)
                        .unwrap_or(ec::REQUEST_TIMED_OUT);
                    answers.push((p, code));
                }
                _ => still.push(p),
            }
        }
        self.pending = still;
        for (p, code) in answers {
            self.answer(p, code)?;
        }
        Ok(())
    }

    // ----- invariants -----

    /// A broker's high watermark: its log below it must be the committed log, which it may
    /// extend.
    fn observe_hw(&mut self, id: i32) -> Result<(), Violation> {
        let (seed, step, now) = (self.config.seed, self.step, self.now);
        let b = self.brokers.get_mut(&id).expect("broker");
        let violation = |what: String| Violation {
            seed,
            step,
            now_ms: now,
            what,
        };
        if b.hw > b.log.leo() {
            return Err(violation(format!(
                "broker {id}: high watermark {} above log end offset {}",
                b.hw,
                b.log.leo()
            )));
        }
        let hw = b.hw as usize;
        check_prefix(&mut b.log, &self.committed, hw)
            .map_err(|w| violation(format!("broker {id}, below its high watermark {hw}: {w}")))?;
        if hw > self.committed.len() {
            let extra = b.log.entries[self.committed.len()..hw].to_vec();
            self.committed.extend(extra);
            b.log.verified = b.log.verified.max(hw);
        }
        Ok(())
    }

    fn check_state(&mut self) -> Result<(), Violation> {
        if let Some(last) = self.images.len().checked_sub(1) {
            if let Some(t) = self.images[last].topic(TOPIC) {
                if let Some(p) = t.partitions.get(&0) {
                    if p.leader >= 0 && !p.isr.contains(&p.leader) {
                        return Err(
                            self.violation(format!("leader {} not in ISR {:?}", p.leader, p.isr))
                        );
                    }
                    if p.isr.iter().any(|r| !p.replicas.contains(r)) {
                        return Err(self.violation(format!(
                            "ISR {:?} outside replicas {:?}",
                            p.isr, p.replicas
                        )));
                    }
                }
            }
        }
        // Every broker's committed prefix (followers' high watermarks included).
        for id in BROKERS {
            self.observe_hw(id)?;
        }
        Ok(())
    }

    fn converged(&self) -> bool {
        let Some(last) = self.images.len().checked_sub(1) else {
            return false;
        };
        let Some((leader, _, isr)) = self.partition_of(last) else {
            return false;
        };
        let Some(l) = self.brokers.get(&leader) else {
            return false;
        };
        isr.len() == BROKERS.len()
            && self.brokers.values().all(|b| {
                b.alive
                    && b.applied == Some(last)
                    && b.log.entries == l.log.entries
                    && b.hw == l.log.leo()
            })
    }

    fn check_final(&self) -> Result<(), Violation> {
        if !self.converged() {
            let state: Vec<String> = self
                .brokers
                .values()
                .map(|b| {
                    format!(
                        "broker {}: alive {} leo {} hw {} epochs {:?} last AlterPartition error {} role {}",
                        b.id,
                        b.alive,
                        b.log.leo(),
                        b.hw,
                        b.log.epochs,
                        b.last_alter_error,
                        match &b.role {
                            Role::Leader(s) => format!(
                                "leader epoch {} isr {:?} pending {:?}",
                                s.leader_epoch(),
                                s.isr(),
                                s.pending()
                            ),
                            Role::Follower { leader, state, .. } =>
                                format!("follower of {leader} {state:?}"),
                            Role::None => "none".into(),
                        }
                    )
                })
                .collect();
            return Err(self.violation(format!(
                "did not converge after healing: partition {:?}; {}",
                self.images
                    .last()
                    .map(|_| self.partition_of(self.images.len() - 1)),
                state.join("; ")
            )));
        }
        let (leader, _, _) = self
            .partition_of(self.images.len() - 1)
            .ok_or_else(|| self.violation("no partition".into()))?;
        let log = &self.brokers[&leader].log;
        for (offset, value) in &self.acked {
            if log.entries.get(*offset as usize).map(|e| e.1) != Some(*value) {
                return Err(self.violation(format!(
                    "acknowledged value {value} at offset {offset} lost: the final log has {:?}",
                    log.entries.get(*offset as usize)
                )));
            }
        }
        Ok(())
    }
}

/// Runs seeds `from..from + n` and sums their reports.
///
/// # Errors
/// The first seed's [`Violation`].
pub fn run_seeds(from: u64, n: u64) -> Result<SimReport, Violation> {
    let mut totals = SimReport::default();
    for seed in from..from + n {
        let r = run(SimConfig::new(seed))?;
        totals.produced += r.produced;
        totals.acknowledged += r.acknowledged;
        totals.failed += r.failed;
        totals.leader_changes += r.leader_changes;
        totals.isr_changes += r.isr_changes;
        totals.truncations += r.truncations;
        totals.faults += r.faults;
        totals.committed += r.committed;
        totals.duplicates += r.duplicates;
    }
    Ok(totals)
}

/// A serving leader must hold every committed record (leader completeness).
fn check_leader_complete(log: &mut SimLog, committed: &[Entry]) -> Result<(), String> {
    if log.entries.len() < committed.len() {
        return Err(format!(
            "its log ends at {} but {} records are committed",
            log.entries.len(),
            committed.len()
        ));
    }
    check_prefix(log, committed, committed.len())
}

/// Checks that the first `upto` records of `log` (at most the committed ones) are the
/// committed records, from where the last check stopped.
fn check_prefix(log: &mut SimLog, committed: &[Entry], upto: usize) -> Result<(), String> {
    let end = upto.min(committed.len()).min(log.entries.len());
    if let Some(i) = (log.verified.min(end)..end).find(|i| log.entries[*i] != committed[*i]) {
        return Err(format!(
            "record {i} is {:?}, the committed record is {:?}",
            log.entries[i], committed[i]
        ));
    }
    log.verified = log.verified.max(end);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_cache_end_offsets_follow_kafka() {
        let mut log = SimLog::default();
        log.append((0, 1));
        log.append((0, 2));
        log.assign(3, 2);
        log.append((3, 3));
        assert_eq!(log.end_offset_for(0), (0, 2));
        assert_eq!(log.end_offset_for(2), (0, 2));
        assert_eq!(log.end_offset_for(3), (3, 3));
        assert_eq!(log.end_offset_for(4), (-1, -1));
        log.truncate_to(2);
        assert_eq!(log.latest_epoch(), Some(0));
    }

    /// Runs `GREGOR_REPLICATION_SIM_SEEDS` seeds (default 750) of the block `block` (seeds
    /// `block * n ..`, shifted by `GREGOR_REPLICATION_SIM_FROM`); four blocks run side by
    /// side, 3000 seeds in all by default. More: `cargo xtask sim --replication`.
    fn run_block(block: u64) {
        let n: u64 = std::env::var("GREGOR_REPLICATION_SIM_SEEDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(750);
        let from: u64 = std::env::var("GREGOR_REPLICATION_SIM_FROM")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
            + block * n;
        let totals = run_seeds(from, n).unwrap_or_else(|v| panic!("{v}"));
        eprintln!("seeds {from}..{}: {totals:?}", from + n);
        assert!(
            totals.acknowledged > 0,
            "nothing was acknowledged: {totals:?}"
        );
        assert!(
            totals.leader_changes > 0
                && totals.isr_changes > 0
                && totals.truncations > 0
                && totals.duplicates > 0,
            "failover, ISR changes, truncation and idempotent retries not all exercised: \
             {totals:?}"
        );
    }

    /// The checker itself: with the completion rule broken as gregor's was before the batch
    /// check (a woken acks=all produce answered from the high watermark alone, after its
    /// broker followed another leader, truncated the batch away and led again), some early
    /// seed acknowledges a record that is not the committed one at its offset.
    #[test]
    fn the_checker_catches_an_acknowledged_batch_that_was_truncated_away() {
        let caught = (0..300).find_map(|seed| {
            run(SimConfig {
                skip_batch_check: true,
                ..SimConfig::new(seed)
            })
            .err()
        });
        let Some(v) = caught else {
            panic!("no seed of 300 caught the broken completion rule");
        };
        assert!(
            v.what.contains("is not the committed record"),
            "caught something else: {v}"
        );
    }

    #[test]
    fn seeds_block_0() {
        run_block(0);
    }

    #[test]
    fn seeds_block_1() {
        run_block(1);
    }

    #[test]
    fn seeds_block_2() {
        run_block(2);
    }

    #[test]
    fn seeds_block_3() {
        run_block(3);
    }
}
