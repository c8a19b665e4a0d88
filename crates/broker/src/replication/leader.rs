//! The leader side of partition replication as a sans-I/O state machine (Kafka's
//! `Partition`/`Replica` leader bookkeeping, KIP-497 AlterPartition, KIP-841/903 eligibility,
//! KIP-966 strict min ISR).
//!
//! A [`LeaderState`] is one partition led by this broker: the committed ISR from the metadata,
//! at most one pending ISR change (an AlterPartition in flight), the followers' fetch state,
//! and the high watermark. It takes no locks, does no I/O and reads no clock: every call gets
//! the time (`now_ms`, ms since the Unix epoch) and the leader's log end offset as arguments and
//! returns what to do (a new high watermark, an [`IsrChange`] to send to the controller), so a
//! simulator can drive it. [`crate::replica_manager::Partition`] wraps it in a lock.
//!
//! Rules, with their Kafka source:
//! - **Caught up** (`Replica.scala` `isCaughtUp`): a follower whose log end offset equals the
//!   leader's, or whose last caught-up time is at most `replica.lag.time.max.ms` ago. The
//!   last caught-up time is the latest fetch time at which the follower's fetch offset reached
//!   the leader's log end offset of that fetch, or of the previous fetch
//!   (`updateFetchStateOrThrow`).
//! - **High watermark** (`Partition.maybeIncrementLeaderHW`): never moves while the committed
//!   ISR is smaller than the effective `min.insync.replicas` (KIP-966's strict min ISR, applied
//!   unconditionally in Kafka 4.x); otherwise the minimum log end offset over the leader, the
//!   *maximal* ISR (committed plus a pending addition) and every follower that is caught up and
//!   ISR-eligible (so a follower about to join is waited for). It never goes backwards.
//! - **Shrink** (`getOutOfSyncReplicas`): ISR followers that are not caught up; nothing while a
//!   change is pending.
//! - **Expand** (`maybeExpandIsr`, `isFollowerInSync`, `isReplicaIsrEligible`): a follower not
//!   in the ISR whose log end offset is at least the high watermark and at least the start
//!   offset of the current leader epoch, and which is eligible: registered, not fenced, not in
//!   controlled shutdown, and whose broker epoch from its fetches is -1 or equals the
//!   registration's (KIP-841, KIP-903).
//! - The committed ISR changes only through [`LeaderState::apply`] (the metadata image), which
//!   also ends a pending change when the partition epoch moved.

use std::collections::BTreeMap;

/// Kafka's `replica.lag.time.max.ms` default (30 s).
pub const DEFAULT_REPLICA_LAG_TIME_MAX_MS: i64 = 30_000;

/// A follower's log end offset before its first fetch (Kafka's `UnifiedLog.UnknownOffset`).
pub const UNKNOWN_OFFSET: i64 = -1;

/// Error codes the leader state answers with (Kafka's).
const NOT_LEADER_OR_FOLLOWER: i16 = 6;
const NOT_ENOUGH_REPLICAS_AFTER_APPEND: i16 = 20;
const UNKNOWN_LEADER_EPOCH: i16 = 75;
const REQUEST_TIMED_OUT: i16 = 7;

/// Whether the batch an acks=all produce waits for is still in the log: the records of its
/// leader epoch `batch_epoch` (the epoch of the batch's last offset when it was appended) still
/// reach `required_offset` (its last offset + 1). `epoch_end` is the log's
/// `end_offset_for_leader_epoch(batch_epoch)`: `(largest epoch <= batch_epoch, where it ends)`.
///
/// A truncation below the batch, and records of a later epoch written over it (this broker
/// followed another leader meanwhile, then led again), end that epoch sooner. Kafka fails a
/// waiting produce with NOT_LEADER_OR_FOLLOWER the moment its leader becomes a follower, before
/// any truncation; gregor evaluates a woken produce later, so it checks that the batch survived
/// instead. `None` (no epoch known for the batch) counts as there.
pub fn batch_still_there(
    batch_epoch: Option<i32>,
    epoch_end: impl FnOnce(i32) -> (i32, i64),
    required_offset: i64,
) -> bool {
    batch_epoch.is_none_or(|e| {
        let (got, end) = epoch_end(e);
        got == e && end >= required_offset
    })
}

/// The answer for one partition of a waiting acks=all produce (Kafka's
/// `DelayedProduce.tryComplete` and `onComplete` with `checkEnoughReplicasReachOffset`), or
/// `None` while it keeps waiting. `leader` is this broker's leader state of the partition
/// (`None` when it no longer leads it), `batch_survived` is [`batch_still_there`], and
/// `expired` says the produce's timeout passed (or its request task is answering now
/// whatever the state: the purgatory woke it).
///
/// Answers: 0 (acknowledged) once the high watermark reached `required_offset` with enough
/// in-sync replicas; NOT_ENOUGH_REPLICAS_AFTER_APPEND (20) when it reached it with the ISR
/// below `min.insync.replicas`; NOT_LEADER_OR_FOLLOWER (6) when this broker no longer leads the
/// partition or the batch is gone from its log; REQUEST_TIMED_OUT (7) when `expired` and still
/// short of the offset.
pub fn acks_all_answer(
    leader: Option<&LeaderState>,
    batch_survived: bool,
    required_offset: i64,
    expired: bool,
) -> Option<i16> {
    if !batch_survived {
        return Some(NOT_LEADER_OR_FOLLOWER);
    }
    let Some(leader) = leader else {
        return Some(NOT_LEADER_OR_FOLLOWER);
    };
    match leader.check_enough_replicas_reach_offset(required_offset) {
        (true, code) => Some(code),
        (false, _) if expired => Some(REQUEST_TIMED_OUT),
        (false, _) => None,
    }
}

/// Kafka's `Partition.readRecords` check of a follower's `LastFetchedEpoch`
/// (`validateFetchOffsetAndMaybeGetDivergingEpoch`): given this log's `(epoch, end offset)`
/// for the follower's last fetched epoch (`end_offset_for_leader_epoch`), `Some((epoch, end
/// offset))` when the follower's log diverges from this one (this log's largest epoch `<=`
/// the follower's is older, or ends before the fetch offset), `None` when it does not.
///
/// # Errors
/// OFFSET_OUT_OF_RANGE (1) when the epoch's end offset is unknown here or the fetch offset is
/// below the log start offset.
pub fn diverging_epoch(
    end_offset_for_last_fetched_epoch: (i32, i64),
    last_fetched_epoch: i32,
    fetch_offset: i64,
    log_start_offset: i64,
) -> Result<Option<(i32, i64)>, i16> {
    const OFFSET_OUT_OF_RANGE: i16 = 1;
    let (epoch, end_offset) = end_offset_for_last_fetched_epoch;
    if epoch < 0 || end_offset < 0 || fetch_offset < log_start_offset {
        return Err(OFFSET_OUT_OF_RANGE);
    }
    if epoch < last_fetched_epoch || end_offset < fetch_offset {
        return Ok(Some((epoch, end_offset)));
    }
    Ok(None)
}

/// What the metadata says about a broker, for ISR eligibility (KIP-841).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BrokerLiveness {
    /// The broker epoch of its current registration.
    pub broker_epoch: i64,
    /// Fenced by the controller.
    pub fenced: bool,
    /// In controlled shutdown.
    pub in_controlled_shutdown: bool,
}

/// A follower's replication state as the leader sees it (Kafka's `ReplicaState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FollowerState {
    /// The follower's log start offset from its last fetch, [`UNKNOWN_OFFSET`] before one.
    pub log_start_offset: i64,
    /// The follower's log end offset: the fetch offset of its last fetch.
    pub log_end_offset: i64,
    /// The leader's log end offset at the follower's last fetch (ms-independent baseline
    /// for the caught-up time).
    pub last_fetch_leader_log_end_offset: i64,
    /// When the leader got the follower's last fetch (ms since the epoch).
    pub last_fetch_time_ms: i64,
    /// The latest time the follower was known to have every record the leader had (ms).
    pub last_caught_up_time_ms: i64,
    /// The broker epoch its last fetch carried (Fetch v15+ `ReplicaState.ReplicaEpoch`; -1 for
    /// older fetches), `None` before a fetch.
    pub broker_epoch: Option<i64>,
}

impl FollowerState {
    const EMPTY: FollowerState = FollowerState {
        log_start_offset: UNKNOWN_OFFSET,
        log_end_offset: UNKNOWN_OFFSET,
        last_fetch_leader_log_end_offset: 0,
        last_fetch_time_ms: 0,
        last_caught_up_time_ms: 0,
        broker_epoch: None,
    };

    /// Kafka's `ReplicaState.isCaughtUp`.
    pub fn is_caught_up(&self, leader_log_end_offset: i64, now_ms: i64, max_lag_ms: i64) -> bool {
        leader_log_end_offset == self.log_end_offset
            || now_ms.saturating_sub(self.last_caught_up_time_ms) <= max_lag_ms
    }
}

/// A partition's registration as the metadata image gives it to its leader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderRegistration {
    /// Leader epoch.
    pub leader_epoch: i32,
    /// Partition epoch (bumps with every change of the registration).
    pub partition_epoch: i32,
    /// Replica ids, the leader among them.
    pub replicas: Vec<i32>,
    /// The committed ISR.
    pub isr: Vec<i32>,
    /// The topic's `min.insync.replicas`.
    pub min_insync_replicas: usize,
}

/// An ISR change for the controller (one partition of an AlterPartition v3 request).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IsrChange {
    /// Identifies the proposal; a response for another id is stale.
    pub id: u64,
    /// The leader epoch the change is based on.
    pub leader_epoch: i32,
    /// The partition epoch the change is based on (`PartitionEpoch`).
    pub partition_epoch: i32,
    /// The proposed ISR with each member's broker epoch (`NewIsrWithEpochs`, KIP-903; -1
    /// when unknown, which the controller does not check).
    pub new_isr: Vec<(i32, i64)>,
    /// Expand (a follower joins) or shrink (followers leave).
    pub kind: IsrChangeKind,
}

/// Direction of an [`IsrChange`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IsrChangeKind {
    /// Kafka's `PendingExpandIsr`: this follower joins.
    Expand(i32),
    /// Kafka's `PendingShrinkIsr`: these followers leave.
    Shrink(Vec<i32>),
}

/// How an AlterPartition for a pending change ended, as the leader must react to it (Kafka's
/// `Partition.handleAlterPartitionError`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlterPartitionOutcome {
    /// The controller committed it; the metadata image will carry it.
    Committed,
    /// The controller says it was not applied and the partition epoch is current
    /// (INELIGIBLE_REPLICA, OPERATION_NOT_ATTEMPTED): the pending change is dropped.
    Rejected,
    /// The leader's view is stale (FENCED_LEADER_EPOCH, INVALID_UPDATE_VERSION,
    /// UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_TOPIC_ID, INVALID_REQUEST, NEW_LEADER_ELECTED): the
    /// change stays pending (no new proposal) until the metadata moves the partition epoch.
    AwaitMetadata,
}

/// What a follower's fetch says about it (Kafka's `updateFollowerFetchState` arguments).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FollowerFetch {
    /// The follower's broker id.
    pub replica: i32,
    /// The fetch offset: the follower's log end offset.
    pub fetch_offset: i64,
    /// The follower's log start offset.
    pub log_start_offset: i64,
    /// The broker epoch in the fetch (Fetch v15+ `ReplicaState.ReplicaEpoch`), -1 when none.
    pub broker_epoch: i64,
}

/// What a follower fetch changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FetchStateUpdate {
    /// The new high watermark, when it moved.
    pub high_watermark: Option<i64>,
    /// An ISR expansion to send, when the follower caught up.
    pub isr_change: Option<IsrChange>,
    /// The follower's log start offset changed, so the low watermark
    /// ([`LeaderState::low_watermark`]) may have moved (a waiting DeleteRecords may complete).
    pub log_start_offset_moved: bool,
}

/// Why a follower fetch may not update the leader's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FollowerFetchError {
    /// The replica id is not a follower of this partition (Kafka's `followerReplicaOrThrow`).
    #[error("replica {0} is not a follower of this partition")]
    NotAReplica(i32),
    /// The fetch's broker epoch is older than the registration's (KIP-903,
    /// `updateFetchStateOrThrow`): NOT_LEADER_OR_FOLLOWER.
    #[error("stale broker epoch {fetch} of replica {replica}, registered {registered}")]
    StaleBrokerEpoch {
        /// The follower.
        replica: i32,
        /// The epoch in its fetch.
        fetch: i64,
        /// The epoch of its registration.
        registered: i64,
    },
}

impl FollowerFetchError {
    /// The Kafka error code: NOT_LEADER_OR_FOLLOWER for both (the caller answers
    /// UNKNOWN_LEADER_EPOCH instead for an unknown replica whose fetch had a leader epoch).
    pub fn error_code(&self) -> i16 {
        NOT_LEADER_OR_FOLLOWER
    }
}

/// One partition led by this broker; see the module docs.
#[derive(Debug, Clone)]
pub struct LeaderState {
    local_broker: i32,
    replica_lag_time_max_ms: i64,
    leader_epoch: i32,
    partition_epoch: i32,
    /// The leader's log end offset when its epoch began (Kafka's `leaderEpochStartOffsetOpt`).
    leader_epoch_start_offset: i64,
    replicas: Vec<i32>,
    isr: Vec<i32>,
    min_insync_replicas: usize,
    /// The pending ISR change (Kafka's `PendingPartitionChange`).
    pending: Option<IsrChange>,
    followers: BTreeMap<i32, FollowerState>,
    brokers: BTreeMap<i32, BrokerLiveness>,
    high_watermark: i64,
    next_change_id: u64,
}

impl LeaderState {
    /// A leader state for broker `local_broker`, with `replica.lag.time.max.ms` in ms, the
    /// high watermark starting at `high_watermark`. Call [`LeaderState::apply`] next.
    pub fn new(local_broker: i32, replica_lag_time_max_ms: i64, high_watermark: i64) -> Self {
        Self {
            local_broker,
            replica_lag_time_max_ms,
            leader_epoch: -1,
            partition_epoch: -1,
            leader_epoch_start_offset: UNKNOWN_OFFSET,
            replicas: Vec::new(),
            isr: Vec::new(),
            min_insync_replicas: 1,
            pending: None,
            followers: BTreeMap::new(),
            brokers: BTreeMap::new(),
            high_watermark,
            next_change_id: 1,
        }
    }

    /// `replica.lag.time.max.ms` in ms.
    pub fn replica_lag_time_max_ms(&self) -> i64 {
        self.replica_lag_time_max_ms
    }

    /// Changes `replica.lag.time.max.ms` (ms).
    pub fn set_replica_lag_time_max_ms(&mut self, ms: i64) {
        self.replica_lag_time_max_ms = ms;
    }

    /// The leader epoch.
    pub fn leader_epoch(&self) -> i32 {
        self.leader_epoch
    }

    /// The partition epoch of the committed state.
    pub fn partition_epoch(&self) -> i32 {
        self.partition_epoch
    }

    /// The offset the current leader epoch began at.
    pub fn leader_epoch_start_offset(&self) -> i64 {
        self.leader_epoch_start_offset
    }

    /// The committed ISR.
    pub fn isr(&self) -> &[i32] {
        &self.isr
    }

    /// The replicas.
    pub fn replicas(&self) -> &[i32] {
        &self.replicas
    }

    /// The high watermark.
    pub fn high_watermark(&self) -> i64 {
        self.high_watermark
    }

    /// The pending ISR change, if any.
    pub fn pending(&self) -> Option<&IsrChange> {
        self.pending.as_ref()
    }

    /// A follower's state.
    pub fn follower(&self, id: i32) -> Option<&FollowerState> {
        self.followers.get(&id)
    }

    /// Kafka's `Partition.lowWatermarkIfLeader` (KIP-107): the smallest log start offset of
    /// this log (`leader_log_start_offset`) and of every follower whose broker is alive
    /// (registered and not fenced, Kafka's `hasAliveBroker`), from their last fetch. A live
    /// follower that has not fetched since this broker became leader counts as
    /// [`UNKNOWN_OFFSET`], so the low watermark is unknown (-1) until it does. DeleteRecords
    /// completes once this reaches the requested offset.
    pub fn low_watermark(&self, leader_log_start_offset: i64) -> i64 {
        self.followers
            .iter()
            .filter(|(id, _)| self.brokers.get(id).is_some_and(|b| !b.fenced))
            .map(|(_, f)| f.log_start_offset)
            .fold(leader_log_start_offset, i64::min)
    }

    /// Kafka's `maximalIsr`: the committed ISR plus a pending addition (a pending shrink keeps
    /// the committed ISR, the stricter set).
    pub fn maximal_isr(&self) -> Vec<i32> {
        let mut isr = self.isr.clone();
        if let Some(IsrChange {
            kind: IsrChangeKind::Expand(id),
            ..
        }) = &self.pending
        {
            if !isr.contains(id) {
                isr.push(*id);
            }
        }
        isr
    }

    /// Kafka's `effectiveMinIsr`: `min(min.insync.replicas, replication factor)`.
    pub fn effective_min_isr(&self) -> usize {
        self.min_insync_replicas.min(self.replicas.len().max(1))
    }

    /// Kafka's `isUnderMinIsr`: the committed ISR is smaller than the effective min ISR.
    pub fn is_under_min_isr(&self) -> bool {
        self.isr.len() < self.effective_min_isr()
    }

    /// Kafka's `isUnderReplicated`: the committed ISR is smaller than the replica set.
    pub fn is_under_replicated(&self) -> bool {
        self.isr.len() < self.replicas.len()
    }

    /// Replaces the brokers' liveness from a metadata image (fenced, controlled shutdown,
    /// broker epochs). Brokers not in the map are not registered (not ISR-eligible).
    pub fn set_brokers(&mut self, brokers: BTreeMap<i32, BrokerLiveness>) {
        self.brokers = brokers;
    }

    /// Applies the partition's registration from the metadata image (Kafka's
    /// `Partition.makeLeader`), with the leader's log end offset `leader_log_end_offset` and
    /// the time `now_ms`. A registration with an older partition epoch is stale and ignored
    /// (returns `None`). A newer partition epoch replaces the committed replicas and ISR and
    /// ends the pending change (the controller applied it or moved past it). A new leader
    /// epoch starts at `leader_log_end_offset` and resets the followers' state: ISR members
    /// count as caught up as of `now_ms`, the others as never caught up (Kafka's
    /// `resetReplicaState`); the caller records `(leader epoch, start offset)` in the leader
    /// epoch cache. Returns `Some(true)` for a new leader epoch, `Some(false)` otherwise. The
    /// caller then calls [`LeaderState::maybe_increment_high_watermark`].
    pub fn apply(
        &mut self,
        reg: &LeaderRegistration,
        leader_log_end_offset: i64,
        now_ms: i64,
    ) -> Option<bool> {
        if reg.partition_epoch < self.partition_epoch || reg.leader_epoch < self.leader_epoch {
            return None;
        }
        let is_new_leader = self.leader_epoch < 0;
        let new_epoch = reg.leader_epoch > self.leader_epoch;
        if reg.partition_epoch > self.partition_epoch || new_epoch {
            self.pending = None;
        }
        self.min_insync_replicas = reg.min_insync_replicas.max(1);
        self.replicas = reg.replicas.clone();
        self.isr = reg.isr.clone();
        self.partition_epoch = reg.partition_epoch;
        let local = self.local_broker;
        self.followers
            .retain(|id, _| *id != local && reg.replicas.contains(id));
        for id in reg.replicas.iter().filter(|id| **id != local) {
            self.followers.entry(*id).or_insert(FollowerState::EMPTY);
        }
        if new_epoch {
            for (id, f) in self.followers.iter_mut() {
                let in_sync = reg.isr.contains(id);
                let caught_up = if in_sync { now_ms } else { 0 };
                *f = if is_new_leader {
                    FollowerState {
                        last_fetch_leader_log_end_offset: UNKNOWN_OFFSET,
                        last_caught_up_time_ms: caught_up,
                        ..FollowerState::EMPTY
                    }
                } else {
                    FollowerState {
                        last_fetch_leader_log_end_offset: leader_log_end_offset,
                        last_fetch_time_ms: caught_up,
                        last_caught_up_time_ms: caught_up,
                        ..*f
                    }
                };
            }
            self.leader_epoch = reg.leader_epoch;
            self.leader_epoch_start_offset = leader_log_end_offset;
        }
        Some(new_epoch)
    }

    fn is_isr_eligible(&self, id: i32) -> bool {
        let Some(b) = self.brokers.get(&id) else {
            return false;
        };
        let Some(f) = self.followers.get(&id) else {
            return false;
        };
        let epoch_ok = match f.broker_epoch {
            Some(-1) => true,
            Some(e) => e == b.broker_epoch,
            None => false,
        };
        !b.fenced && !b.in_controlled_shutdown && epoch_ok
    }

    /// Kafka's `maybeIncrementLeaderHW` with the leader's log end offset and the time; see the
    /// module docs. `log_start_offset` is a floor (the high watermark is never below it).
    /// Returns the new high watermark when it moved.
    pub fn maybe_increment_high_watermark(
        &mut self,
        leader_log_end_offset: i64,
        log_start_offset: i64,
        now_ms: i64,
    ) -> Option<i64> {
        if self.is_under_min_isr() {
            return None;
        }
        let maximal = self.maximal_isr();
        let mut new_hw = leader_log_end_offset;
        for (id, f) in &self.followers {
            if f.log_end_offset >= new_hw {
                continue;
            }
            let wait = maximal.contains(id)
                || (f.is_caught_up(leader_log_end_offset, now_ms, self.replica_lag_time_max_ms)
                    && self.is_isr_eligible(*id));
            if wait {
                new_hw = f.log_end_offset;
            }
        }
        let new_hw = new_hw.max(log_start_offset);
        if new_hw > self.high_watermark {
            self.high_watermark = new_hw;
            Some(new_hw)
        } else {
            None
        }
    }

    /// Moves the high watermark up to at least `offset` without the ISR rule (the log start
    /// offset moved past it, e.g. DeleteRecords or retention). Returns the new value if moved.
    pub fn raise_high_watermark_to(&mut self, offset: i64) -> Option<i64> {
        (offset > self.high_watermark).then(|| {
            self.high_watermark = offset;
            offset
        })
    }

    /// Kafka's `updateFollowerFetchState`: a follower fetched ([`FollowerFetch`]: its log end
    /// and start offsets, its broker epoch) at `now_ms`, while the leader's log end offset was
    /// `leader_log_end_offset` (`log_start_offset` is the leader's, the high watermark's
    /// floor). May move the high watermark and propose adding the follower to the ISR.
    ///
    /// # Errors
    /// [`FollowerFetchError::NotAReplica`] for a replica id that is not a follower here,
    /// [`FollowerFetchError::StaleBrokerEpoch`] when the fetch's broker epoch is older than
    /// the registered one.
    pub fn update_follower_fetch_state(
        &mut self,
        fetch: FollowerFetch,
        leader_log_end_offset: i64,
        log_start_offset: i64,
        now_ms: i64,
    ) -> Result<FetchStateUpdate, FollowerFetchError> {
        let FollowerFetch {
            replica,
            fetch_offset,
            log_start_offset: follower_log_start_offset,
            broker_epoch,
        } = fetch;
        let registered = self.brokers.get(&replica).map(|b| b.broker_epoch);
        let Some(f) = self.followers.get_mut(&replica) else {
            return Err(FollowerFetchError::NotAReplica(replica));
        };
        if let Some(registered) = registered {
            if broker_epoch != -1 && registered > broker_epoch {
                return Err(FollowerFetchError::StaleBrokerEpoch {
                    replica,
                    fetch: broker_epoch,
                    registered,
                });
            }
        }
        let last_caught_up_time_ms = if fetch_offset >= leader_log_end_offset {
            f.last_caught_up_time_ms.max(now_ms)
        } else if fetch_offset >= f.last_fetch_leader_log_end_offset {
            f.last_caught_up_time_ms.max(f.last_fetch_time_ms)
        } else {
            f.last_caught_up_time_ms
        };
        let previous_leo = f.log_end_offset;
        let log_start_offset_moved = f.log_start_offset != follower_log_start_offset;
        *f = FollowerState {
            log_start_offset: follower_log_start_offset,
            log_end_offset: fetch_offset,
            last_fetch_leader_log_end_offset: leader_log_end_offset
                .max(f.last_fetch_leader_log_end_offset),
            last_fetch_time_ms: now_ms,
            last_caught_up_time_ms,
            broker_epoch: Some(broker_epoch),
        };
        let isr_change = self.maybe_expand_isr(replica);
        let high_watermark = if previous_leo != fetch_offset || isr_change.is_some() {
            self.maybe_increment_high_watermark(leader_log_end_offset, log_start_offset, now_ms)
        } else {
            None
        };
        Ok(FetchStateUpdate {
            high_watermark,
            isr_change,
            log_start_offset_moved,
        })
    }

    /// Kafka's `isFollowerInSync` and `canAddReplicaToIsr` for `replica`.
    fn can_expand_with(&self, replica: i32) -> bool {
        let Some(f) = self.followers.get(&replica) else {
            return false;
        };
        self.pending.is_none()
            && !self.isr.contains(&replica)
            && self.is_isr_eligible(replica)
            && f.log_end_offset >= self.high_watermark
            && self.leader_epoch_start_offset >= 0
            && f.log_end_offset >= self.leader_epoch_start_offset
    }

    /// Kafka's `maybeExpandIsr`: proposes adding `replica` when it is in sync and eligible
    /// and nothing is pending. The proposal becomes the pending change.
    pub fn maybe_expand_isr(&mut self, replica: i32) -> Option<IsrChange> {
        if !self.can_expand_with(replica) {
            return None;
        }
        let mut isr = self.isr.clone();
        isr.push(replica);
        Some(self.propose(isr, IsrChangeKind::Expand(replica)))
    }

    /// Kafka's `getOutOfSyncReplicas`: ISR followers not caught up at `now_ms` given the
    /// leader's log end offset; empty while a change is pending.
    pub fn out_of_sync_replicas(&self, leader_log_end_offset: i64, now_ms: i64) -> Vec<i32> {
        if self.pending.is_some() {
            return Vec::new();
        }
        self.isr
            .iter()
            .copied()
            .filter(|id| *id != self.local_broker)
            .filter(|id| {
                self.followers.get(id).is_none_or(|f| {
                    !f.is_caught_up(leader_log_end_offset, now_ms, self.replica_lag_time_max_ms)
                })
            })
            .collect()
    }

    /// Kafka's `maybeShrinkIsr` (the ISR-expiration task, every `replica.lag.time.max.ms / 2`):
    /// proposes removing the out-of-sync followers. The proposal becomes the pending change.
    pub fn maybe_shrink_isr(
        &mut self,
        leader_log_end_offset: i64,
        now_ms: i64,
    ) -> Option<IsrChange> {
        let out = self.out_of_sync_replicas(leader_log_end_offset, now_ms);
        if out.is_empty() {
            return None;
        }
        let isr: Vec<i32> = self
            .isr
            .iter()
            .copied()
            .filter(|id| !out.contains(id))
            .collect();
        Some(self.propose(isr, IsrChangeKind::Shrink(out)))
    }

    fn propose(&mut self, isr: Vec<i32>, kind: IsrChangeKind) -> IsrChange {
        let new_isr = isr
            .into_iter()
            .map(|id| {
                let epoch = if id == self.local_broker {
                    self.brokers.get(&id).map_or(-1, |b| b.broker_epoch)
                } else {
                    self.followers
                        .get(&id)
                        .and_then(|f| f.broker_epoch)
                        .unwrap_or(-1)
                };
                (id, epoch)
            })
            .collect();
        let change = IsrChange {
            id: self.next_change_id,
            leader_epoch: self.leader_epoch,
            partition_epoch: self.partition_epoch,
            new_isr,
            kind,
        };
        self.next_change_id += 1;
        self.pending = Some(change.clone());
        change
    }

    /// The controller's answer to the pending change `id` (Kafka's `submitAlterPartition`
    /// completion); an answer for a change no longer pending is ignored.
    /// [`AlterPartitionOutcome::Rejected`] drops the pending change so the next check may
    /// propose again; the others keep it until the metadata moves the partition epoch. Returns
    /// whether the pending change was dropped (the caller then re-checks the high watermark).
    pub fn on_alter_partition_outcome(&mut self, id: u64, outcome: AlterPartitionOutcome) -> bool {
        if self.pending.as_ref().map(|c| c.id) != Some(id) {
            return false;
        }
        if outcome == AlterPartitionOutcome::Rejected {
            self.pending = None;
            return true;
        }
        false
    }

    /// Kafka's `checkEnoughReplicasReachOffset` for an acks=all produce waiting for
    /// `required_offset`: `(true, 0)` once the high watermark reached it with the maximal ISR
    /// at least the effective min ISR, `(true, NOT_ENOUGH_REPLICAS_AFTER_APPEND)` when it was
    /// reached but the ISR shrank below, `(false, 0)` while it waits.
    pub fn check_enough_replicas_reach_offset(&self, required_offset: i64) -> (bool, i16) {
        if self.high_watermark >= required_offset {
            if self.effective_min_isr() <= self.maximal_isr().len() {
                (true, 0)
            } else {
                (true, NOT_ENOUGH_REPLICAS_AFTER_APPEND)
            }
        } else {
            (false, 0)
        }
    }

    /// The error code for a replica id that may not fetch as a follower (Kafka's
    /// `followerReplicaOrThrow`): UNKNOWN_LEADER_EPOCH when the fetch carried a leader epoch
    /// (the replica may not be known yet, e.g. during a reassignment), else
    /// NOT_LEADER_OR_FOLLOWER.
    pub fn unknown_replica_error(current_leader_epoch_given: bool) -> i16 {
        if current_leader_epoch_given {
            UNKNOWN_LEADER_EPOCH
        } else {
            NOT_LEADER_OR_FOLLOWER
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAG: i64 = 10_000;

    fn brokers(ids: &[i32]) -> BTreeMap<i32, BrokerLiveness> {
        ids.iter()
            .map(|id| {
                (
                    *id,
                    BrokerLiveness {
                        broker_epoch: 100 + i64::from(*id),
                        fenced: false,
                        in_controlled_shutdown: false,
                    },
                )
            })
            .collect()
    }

    fn reg(epoch: i32, pepoch: i32, isr: &[i32], min_isr: usize) -> LeaderRegistration {
        LeaderRegistration {
            leader_epoch: epoch,
            partition_epoch: pepoch,
            replicas: vec![1, 2, 3],
            isr: isr.to_vec(),
            min_insync_replicas: min_isr,
        }
    }

    /// Leader 1 of replicas {1,2,3}, ISR as given, leader epoch 5 starting at `leo`.
    fn leader(isr: &[i32], min_isr: usize, leo: i64, now: i64) -> LeaderState {
        let mut l = LeaderState::new(1, LAG, 0);
        l.set_brokers(brokers(&[1, 2, 3]));
        assert_eq!(l.apply(&reg(5, 10, isr, min_isr), leo, now), Some(true));
        l
    }

    fn fetch(
        l: &mut LeaderState,
        id: i32,
        offset: i64,
        leo: i64,
        now: i64,
    ) -> Result<FetchStateUpdate, FollowerFetchError> {
        l.update_follower_fetch_state(
            FollowerFetch {
                replica: id,
                fetch_offset: offset,
                log_start_offset: 0,
                broker_epoch: 100 + i64::from(id),
            },
            leo,
            0,
            now,
        )
    }

    #[test]
    fn low_watermark_is_the_smallest_log_start_offset_of_live_replicas() {
        let mut l = leader(&[1, 2, 3], 1, 10, 1000);
        let fetch_with_start = |l: &mut LeaderState, id: i32, start: i64| {
            l.update_follower_fetch_state(
                FollowerFetch {
                    replica: id,
                    fetch_offset: 10,
                    log_start_offset: start,
                    broker_epoch: 100 + i64::from(id),
                },
                10,
                7,
                1000,
            )
            .unwrap()
        };
        // Followers that have not fetched yet: unknown.
        assert_eq!(l.low_watermark(7), UNKNOWN_OFFSET);
        assert!(fetch_with_start(&mut l, 2, 7).log_start_offset_moved);
        assert_eq!(l.low_watermark(7), UNKNOWN_OFFSET);
        assert!(fetch_with_start(&mut l, 3, 4).log_start_offset_moved);
        assert_eq!(l.low_watermark(7), 4);
        assert!(!fetch_with_start(&mut l, 3, 4).log_start_offset_moved);
        assert!(fetch_with_start(&mut l, 3, 7).log_start_offset_moved);
        assert_eq!(l.low_watermark(7), 7);
        assert_eq!(l.low_watermark(5), 5);
        // A fenced follower no longer holds it back.
        assert!(fetch_with_start(&mut l, 2, 3).log_start_offset_moved);
        assert_eq!(l.low_watermark(7), 3);
        let mut b = brokers(&[1, 2, 3]);
        b.get_mut(&2).unwrap().fenced = true;
        l.set_brokers(b);
        assert_eq!(l.low_watermark(7), 7);
    }

    #[test]
    fn high_watermark_is_min_leo_over_isr_and_never_backwards() {
        let mut l = leader(&[1, 2, 3], 1, 10, 1000);
        // Unknown follower LEOs hold the high watermark.
        assert_eq!(l.maybe_increment_high_watermark(10, 0, 1000), None);
        assert_eq!(fetch(&mut l, 2, 7, 10, 1001).unwrap().high_watermark, None);
        let u = fetch(&mut l, 3, 4, 10, 1002).unwrap();
        assert_eq!(u.high_watermark, Some(4));
        assert_eq!(
            fetch(&mut l, 3, 9, 10, 1003).unwrap().high_watermark,
            Some(7)
        );
        assert_eq!(l.high_watermark(), 7);
        // A follower going back (it truncated) does not move the HW back.
        assert_eq!(fetch(&mut l, 2, 3, 10, 1004).unwrap().high_watermark, None);
        assert_eq!(l.high_watermark(), 7);
        assert_eq!(
            fetch(&mut l, 2, 10, 10, 1005).unwrap().high_watermark,
            Some(9)
        );
    }

    #[test]
    fn high_watermark_is_floored_at_the_log_start_offset() {
        let mut l = leader(&[1], 1, 50, 0);
        assert_eq!(l.maybe_increment_high_watermark(50, 20, 0), Some(50));
        let mut l = LeaderState::new(1, LAG, 0);
        l.set_brokers(brokers(&[1, 2, 3]));
        l.apply(&reg(1, 1, &[1, 2], 1), 50, 0);
        assert_eq!(l.maybe_increment_high_watermark(50, 20, 0), Some(20));
    }

    #[test]
    fn strict_min_isr_holds_the_high_watermark() {
        // ISR {1} with min.insync.replicas 2: under min ISR, the HW does not move (KIP-966).
        let mut l = leader(&[1], 2, 10, 0);
        assert!(l.is_under_min_isr());
        assert_eq!(l.maybe_increment_high_watermark(10, 0, 0), None);
        // min.insync.replicas above the replication factor is capped at it.
        let mut l = leader(&[1, 2, 3], 5, 10, 0);
        assert_eq!(l.effective_min_isr(), 3);
        assert!(!l.is_under_min_isr());
        fetch(&mut l, 2, 10, 10, 1).unwrap();
        assert_eq!(
            fetch(&mut l, 3, 10, 10, 1).unwrap().high_watermark,
            Some(10)
        );
    }

    #[test]
    fn caught_up_follower_outside_the_isr_holds_the_high_watermark() {
        const T: i64 = 1_000_000;
        let mut l = leader(&[1], 1, 10, T);
        assert_eq!(l.maybe_increment_high_watermark(10, 0, T), Some(10));
        // 2 joins (pending); 3 is caught up but cannot be proposed while 2 is pending.
        assert!(fetch(&mut l, 2, 10, 10, T + 1)
            .unwrap()
            .isr_change
            .is_some());
        assert_eq!(fetch(&mut l, 3, 10, 10, T + 1).unwrap().isr_change, None);
        // The leader is at 20 and 2 has it all: 3, caught up and eligible, holds the HW at 10.
        assert_eq!(
            fetch(&mut l, 2, 20, 20, T + 2).unwrap().high_watermark,
            None
        );
        assert_eq!(l.high_watermark(), 10);
        // Once 3 is no longer caught up it does not.
        assert_eq!(
            l.maybe_increment_high_watermark(20, 0, T + 2 + LAG),
            Some(20)
        );
    }

    #[test]
    fn ineligible_caught_up_follower_does_not_hold_the_high_watermark() {
        let mut l = leader(&[1, 2], 1, 0, 0);
        let mut b = brokers(&[1, 2, 3]);
        b.get_mut(&3).unwrap().fenced = true;
        l.set_brokers(b);
        fetch(&mut l, 3, 0, 0, 10).unwrap();
        fetch(&mut l, 2, 20, 20, 20).unwrap();
        assert_eq!(l.high_watermark(), 20);
    }

    #[test]
    fn caught_up_rule_follows_replica_scala() {
        let mut l = leader(&[1, 2, 3], 1, 100, 0);
        // Fetch at t=1000 reaching the leader's LEO: caught up at 1000.
        fetch(&mut l, 2, 100, 100, 1000).unwrap();
        assert_eq!(l.follower(2).unwrap().last_caught_up_time_ms, 1000);
        // Leader appends to 150; a fetch at 2000 from 100 (>= LEO of the previous fetch):
        // caught up as of the previous fetch time.
        fetch(&mut l, 2, 100, 150, 2000).unwrap();
        assert_eq!(l.follower(2).unwrap().last_caught_up_time_ms, 1000);
        // Next fetch from 150 (reaching the previous fetch's leader LEO 150) at 3000 while the
        // leader is at 200: caught up as of 2000.
        fetch(&mut l, 2, 150, 200, 3000).unwrap();
        assert_eq!(l.follower(2).unwrap().last_caught_up_time_ms, 2000);
        // A fetch below the previous leader LEO keeps the time.
        fetch(&mut l, 2, 160, 250, 4000).unwrap();
        assert_eq!(l.follower(2).unwrap().last_caught_up_time_ms, 2000);
        let f = *l.follower(2).unwrap();
        assert!(
            f.is_caught_up(160, 1_000_000, LAG),
            "same LEO as the leader"
        );
        assert!(f.is_caught_up(250, 2000 + LAG, LAG));
        assert!(!f.is_caught_up(250, 2001 + LAG, LAG));
    }

    #[test]
    fn shrink_proposes_removing_lagging_followers_once() {
        let mut l = leader(&[1, 2, 3], 2, 100, 0);
        fetch(&mut l, 2, 100, 100, 5000).unwrap();
        fetch(&mut l, 3, 50, 100, 5000).unwrap();
        // 3 reset as caught up at 0 (new leader, in ISR); 2 at 5000.
        assert!(l.out_of_sync_replicas(100, LAG).is_empty());
        assert_eq!(l.out_of_sync_replicas(100, LAG + 1), vec![3]);
        let c = l.maybe_shrink_isr(100, LAG + 1).expect("shrink");
        assert_eq!(c.kind, IsrChangeKind::Shrink(vec![3]));
        assert_eq!(c.new_isr, vec![(1, 101), (2, 102)]);
        assert_eq!((c.leader_epoch, c.partition_epoch), (5, 10));
        // Pending: no second proposal, and the maximal ISR is the committed one.
        assert!(l.maybe_shrink_isr(100, LAG + 100).is_none());
        assert_eq!(l.maximal_isr(), vec![1, 2, 3]);
        // A follower equal to the leader's LEO is never out of sync.
        let mut l = leader(&[1, 2], 1, 100, 0);
        fetch(&mut l, 2, 100, 100, 0).unwrap();
        assert!(l.out_of_sync_replicas(100, 10 * LAG).is_empty());
    }

    #[test]
    fn a_follower_that_never_fetched_leaves_after_the_lag() {
        let l = leader(&[1, 2, 3], 1, 100, 1000);
        assert!(l.out_of_sync_replicas(100, 1000 + LAG).is_empty());
        assert_eq!(l.out_of_sync_replicas(100, 1001 + LAG), vec![2, 3]);
    }

    #[test]
    fn expand_needs_hw_epoch_start_and_eligibility() {
        // Leader epoch 5 starts at offset 100; ISR {1}; HW 100.
        let mut l = leader(&[1], 1, 100, 0);
        assert_eq!(l.maybe_increment_high_watermark(100, 0, 0), Some(100));
        // 2 below the epoch start: not added.
        assert_eq!(fetch(&mut l, 2, 99, 100, 1).unwrap().isr_change, None);
        let u = fetch(&mut l, 2, 100, 100, 2).unwrap();
        let c = u.isr_change.expect("expand");
        assert_eq!(c.kind, IsrChangeKind::Expand(2));
        assert_eq!(c.new_isr, vec![(1, 101), (2, 102)]);
        assert_eq!(l.maximal_isr(), vec![1, 2]);
        // One change at a time.
        assert_eq!(fetch(&mut l, 3, 100, 100, 3).unwrap().isr_change, None);
        // The maximal ISR holds the HW for the pending member; 3 (caught up) holds it too.
        assert_eq!(l.maybe_increment_high_watermark(120, 0, 4), None);
        fetch(&mut l, 2, 110, 120, 5).unwrap();
        assert_eq!(l.high_watermark(), 100);
        fetch(&mut l, 3, 120, 120, 6).unwrap();
        assert_eq!(l.high_watermark(), 110);
    }

    #[test]
    fn expand_refuses_fenced_shutting_down_or_epoch_mismatch() {
        for case in 0..4 {
            let mut l = leader(&[1], 1, 0, 0);
            let mut b = brokers(&[1, 2, 3]);
            match case {
                0 => {
                    b.get_mut(&2).unwrap().fenced = true;
                }
                1 => {
                    b.get_mut(&2).unwrap().in_controlled_shutdown = true;
                }
                2 => {
                    b.remove(&2);
                }
                _ => {}
            }
            l.set_brokers(b);
            let epoch = if case == 3 { 999 } else { 102 };
            let u = l
                .update_follower_fetch_state(
                    FollowerFetch {
                        replica: 2,
                        fetch_offset: 0,
                        log_start_offset: 0,
                        broker_epoch: epoch,
                    },
                    0,
                    0,
                    1,
                )
                .unwrap();
            assert_eq!(u.isr_change, None, "case {case}");
        }
        // A fetch without a broker epoch (-1, Fetch < v15) is eligible.
        let mut l = leader(&[1], 1, 0, 0);
        let u = l
            .update_follower_fetch_state(
                FollowerFetch {
                    replica: 2,
                    fetch_offset: 0,
                    log_start_offset: 0,
                    broker_epoch: -1,
                },
                0,
                0,
                1,
            )
            .unwrap();
        assert_eq!(
            u.isr_change.map(|c| c.new_isr),
            Some(vec![(1, 101), (2, -1)])
        );
    }

    #[test]
    fn stale_broker_epoch_and_unknown_replica_are_refused() {
        let mut l = leader(&[1, 2, 3], 1, 0, 0);
        assert_eq!(
            l.update_follower_fetch_state(
                FollowerFetch {
                    replica: 2,
                    fetch_offset: 0,
                    log_start_offset: 0,
                    broker_epoch: 50
                },
                0,
                0,
                1
            ),
            Err(FollowerFetchError::StaleBrokerEpoch {
                replica: 2,
                fetch: 50,
                registered: 102
            })
        );
        assert_eq!(
            l.update_follower_fetch_state(
                FollowerFetch {
                    replica: 9,
                    fetch_offset: 0,
                    log_start_offset: 0,
                    broker_epoch: -1
                },
                0,
                0,
                1
            ),
            Err(FollowerFetchError::NotAReplica(9))
        );
        assert_eq!(
            l.update_follower_fetch_state(
                FollowerFetch {
                    replica: 1,
                    fetch_offset: 0,
                    log_start_offset: 0,
                    broker_epoch: -1
                },
                0,
                0,
                1
            ),
            Err(FollowerFetchError::NotAReplica(1)),
            "the leader itself is no follower"
        );
        assert_eq!(LeaderState::unknown_replica_error(true), 75);
        assert_eq!(LeaderState::unknown_replica_error(false), 6);
    }

    #[test]
    fn metadata_clears_pending_when_the_partition_epoch_moves() {
        let mut l = leader(&[1], 1, 0, 0);
        let c = fetch(&mut l, 2, 0, 0, 1).unwrap().isr_change.unwrap();
        // Same partition epoch (an unrelated image): still pending.
        assert_eq!(l.apply(&reg(5, 10, &[1], 1), 0, 2), Some(false));
        assert!(l.pending().is_some());
        // The committed change arrives.
        assert_eq!(l.apply(&reg(5, 11, &[1, 2], 1), 0, 3), Some(false));
        assert!(l.pending().is_none());
        assert_eq!(l.isr(), &[1, 2]);
        // A late answer for it is ignored.
        assert!(!l.on_alter_partition_outcome(c.id, AlterPartitionOutcome::Rejected));
        // Stale registrations are ignored.
        assert_eq!(l.apply(&reg(5, 9, &[1], 1), 0, 4), None);
        assert_eq!(l.apply(&reg(4, 12, &[1], 1), 0, 4), None);
        assert_eq!(l.isr(), &[1, 2]);
    }

    #[test]
    fn alter_partition_outcomes() {
        let mut l = leader(&[1], 1, 0, 0);
        let c = fetch(&mut l, 2, 0, 0, 1).unwrap().isr_change.unwrap();
        assert!(!l.on_alter_partition_outcome(c.id + 1, AlterPartitionOutcome::Rejected));
        assert!(!l.on_alter_partition_outcome(c.id, AlterPartitionOutcome::AwaitMetadata));
        assert!(l.pending().is_some(), "waits for the metadata");
        assert!(l.on_alter_partition_outcome(c.id, AlterPartitionOutcome::Rejected));
        assert!(l.pending().is_none());
        // The next fetch proposes again, with a new id.
        let c2 = fetch(&mut l, 2, 0, 0, 2).unwrap().isr_change.unwrap();
        assert_ne!(c.id, c2.id);
    }

    #[test]
    fn new_leader_epoch_resets_followers() {
        let mut l = leader(&[1, 2, 3], 1, 10, 0);
        fetch(&mut l, 2, 10, 10, 100).unwrap();
        fetch(&mut l, 3, 5, 10, 100).unwrap();
        // Re-elected with epoch 6, ISR {1,2}, at LEO 20 and t=500.
        assert_eq!(l.apply(&reg(6, 12, &[1, 2], 1), 20, 500), Some(true));
        assert_eq!(l.leader_epoch_start_offset(), 20);
        let f2 = *l.follower(2).unwrap();
        assert_eq!((f2.log_end_offset, f2.last_caught_up_time_ms), (10, 500));
        assert_eq!(f2.last_fetch_leader_log_end_offset, 20);
        let f3 = *l.follower(3).unwrap();
        assert_eq!((f3.last_caught_up_time_ms, f3.last_fetch_time_ms), (0, 0));
        // A first-time leader knows nothing of its followers.
        let l = leader(&[1, 2], 1, 10, 700);
        let f = *l.follower(2).unwrap();
        assert_eq!(
            (f.log_end_offset, f.last_caught_up_time_ms),
            (UNKNOWN_OFFSET, 700)
        );
        assert_eq!(l.follower(3).unwrap().last_caught_up_time_ms, 0);
    }

    #[test]
    fn replicas_leaving_the_assignment_are_forgotten() {
        let mut l = leader(&[1, 2, 3], 1, 0, 0);
        let mut r = reg(5, 11, &[1, 2], 1);
        r.replicas = vec![1, 2];
        l.apply(&r, 0, 1);
        assert!(l.follower(3).is_none());
        assert_eq!(
            fetch(&mut l, 3, 0, 0, 2),
            Err(FollowerFetchError::NotAReplica(3))
        );
        fetch(&mut l, 2, 0, 0, 2).unwrap();
    }

    #[test]
    fn enough_replicas_after_append() {
        let mut l = leader(&[1, 2], 2, 10, 0);
        assert_eq!(l.check_enough_replicas_reach_offset(5), (false, 0));
        fetch(&mut l, 2, 10, 10, 1).unwrap();
        assert_eq!(l.check_enough_replicas_reach_offset(10), (true, 0));
        // The ISR shrank to {1} (committed) after the append reached the HW.
        l.apply(&reg(5, 11, &[1], 2), 10, 2);
        assert_eq!(l.check_enough_replicas_reach_offset(10), (true, 20));
        assert!(l.is_under_replicated());
    }

    #[test]
    fn single_replica_high_watermark_follows_the_log_end_offset() {
        let mut l = LeaderState::new(1, LAG, 0);
        l.set_brokers(brokers(&[1]));
        l.apply(
            &LeaderRegistration {
                leader_epoch: 0,
                partition_epoch: 0,
                replicas: vec![1],
                isr: vec![1],
                min_insync_replicas: 1,
            },
            0,
            0,
        );
        assert_eq!(l.maybe_increment_high_watermark(3, 0, 1), Some(3));
        assert_eq!(l.maybe_increment_high_watermark(3, 0, 2), None);
        assert!(l.out_of_sync_replicas(3, 1_000_000).is_empty());
        assert_eq!(l.maybe_shrink_isr(3, 1_000_000), None);
    }
}
