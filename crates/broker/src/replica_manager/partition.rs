//! One hosted partition (Kafka's `Partition`): its log, its leadership state and the offsets
//! replication needs (high watermark, followers' log end offsets).
//!
//! Leadership is a [`Role`] changed only by [`Partition::make_leader`],
//! [`Partition::make_follower`] and [`Partition::make_offline`]. Every change that may let a
//! delayed operation complete (high watermark moved, new data, leadership changed) triggers the
//! partition's key in both purgatories ([`DelayedOperations`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use gregor_log::{
    AppendInfo, AppendOrigin, LogError, PartitionLog, ReadInfo, SharedClock, TopicPartition,
    VerificationGuard,
};
use gregor_protocol::control::EndTxnMarker;
use parking_lot::{Mutex, RwLock};
use uuid::Uuid;

use super::purgatory::DelayedOperationPurgatory;
use super::AppendRejected;
use crate::alter_partition::{AlterPartitionItem, AlterPartitionSender};
use crate::error_codes as ec;
use crate::observability::TopicMetrics;
use crate::replication::leader::{
    AlterPartitionOutcome, BrokerLiveness, FollowerFetch, IsrChange, LeaderRegistration,
    LeaderState, DEFAULT_REPLICA_LAG_TIME_MAX_MS,
};

/// What every partition of a broker shares for replication: `replica.lag.time.max.ms`, the
/// brokers' liveness from the latest metadata image (ISR eligibility, KIP-841) and the
/// AlterPartition sender (installed once the broker reaches its controller).
pub struct ReplicationContext {
    replica_lag_time_max_ms: AtomicI64,
    brokers: RwLock<Arc<BTreeMap<i32, BrokerLiveness>>>,
    alter_partition: OnceLock<Arc<dyn AlterPartitionSender>>,
}

impl ReplicationContext {
    /// A context with `replica.lag.time.max.ms` in ms, no brokers and no sender.
    pub fn new(replica_lag_time_max_ms: i64) -> Arc<Self> {
        Arc::new(Self {
            replica_lag_time_max_ms: AtomicI64::new(replica_lag_time_max_ms),
            brokers: RwLock::new(Arc::new(BTreeMap::new())),
            alter_partition: OnceLock::new(),
        })
    }

    /// `replica.lag.time.max.ms` (ms).
    pub fn replica_lag_time_max_ms(&self) -> i64 {
        self.replica_lag_time_max_ms.load(Ordering::Relaxed)
    }

    /// The brokers' liveness of the latest image.
    pub fn brokers(&self) -> Arc<BTreeMap<i32, BrokerLiveness>> {
        self.brokers.read().clone()
    }

    /// Replaces the brokers' liveness (from a metadata image).
    pub fn set_brokers(&self, brokers: BTreeMap<i32, BrokerLiveness>) {
        *self.brokers.write() = Arc::new(brokers);
    }

    /// Installs the AlterPartition sender; later calls are ignored. Until then, ISR changes
    /// are dropped as soon as they are proposed (and proposed again by the next check).
    pub fn set_alter_partition_sender(&self, sender: Arc<dyn AlterPartitionSender>) {
        let _ = self.alter_partition.set(sender);
    }
}

impl Default for ReplicationContext {
    fn default() -> Self {
        Self {
            replica_lag_time_max_ms: AtomicI64::new(DEFAULT_REPLICA_LAG_TIME_MAX_MS),
            brokers: RwLock::new(Arc::new(BTreeMap::new())),
            alter_partition: OnceLock::new(),
        }
    }
}

mod follower;
mod read_replica;

/// The purgatories a partition triggers (Kafka's `DelayedOperations` of a `Partition`).
pub struct DelayedOperations {
    /// Delayed fetches (long polls), `delayed_operation="Fetch"`.
    pub fetch: Arc<DelayedOperationPurgatory>,
    /// Delayed produces (acks=all), `delayed_operation="Produce"`.
    pub produce: Arc<DelayedOperationPurgatory>,
    /// DeleteRecords waiting for every live replica's log start offset (the low watermark),
    /// `delayed_operation="DeleteRecords"`.
    pub delete_records: Arc<DelayedOperationPurgatory>,
}

impl DelayedOperations {
    /// The three purgatories, reading deadlines on `clock`.
    pub fn new(clock: &SharedClock) -> Arc<Self> {
        Arc::new(Self {
            fetch: DelayedOperationPurgatory::new("Fetch", clock.clone()),
            produce: DelayedOperationPurgatory::new("Produce", clock.clone()),
            delete_records: DelayedOperationPurgatory::new("DeleteRecords", clock.clone()),
        })
    }

    /// Kafka's `checkAndCompleteAll` for one partition.
    pub fn check_and_complete_all(&self, key: &TopicPartition) {
        self.fetch.check_and_complete(key);
        self.produce.check_and_complete(key);
        self.delete_records.check_and_complete(key);
    }
}

/// This broker's role for a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// This broker leads: it takes appends and serves consumers.
    Leader,
    /// Another broker leads; this one replicates it.
    Follower,
    /// No leader is known (leader -1 in the metadata), or the partition is being removed.
    None,
}

/// Leadership state of a partition, from the latest metadata.
#[derive(Debug, Clone)]
pub struct PartitionState {
    /// This broker's role.
    pub role: Role,
    /// Leader broker id (-1 when none).
    pub leader: i32,
    /// Leader epoch.
    pub leader_epoch: i32,
    /// Partition epoch (bumps with every change of the registration).
    pub partition_epoch: i32,
    /// Replica ids.
    pub replicas: Vec<i32>,
    /// In-sync replica ids.
    pub isr: Vec<i32>,
    /// `min.insync.replicas` of the topic.
    pub min_insync_replicas: usize,
}

/// A partition's leader, epoch and replicas as the metadata gives them.
#[derive(Debug, Clone)]
pub struct LeaderAndIsr {
    /// Leader broker id, -1 when none.
    pub leader: i32,
    /// Leader epoch.
    pub leader_epoch: i32,
    /// Partition epoch (bumps with every change of the registration).
    pub partition_epoch: i32,
    /// Replica ids.
    pub replicas: Vec<i32>,
    /// In-sync replica ids.
    pub isr: Vec<i32>,
    /// `min.insync.replicas` of the topic.
    pub min_insync_replicas: usize,
}

/// One partition hosted by this broker.
pub struct Partition {
    /// Topic name.
    pub topic: String,
    /// Topic id.
    pub topic_id: Uuid,
    /// Partition index.
    pub index: i32,
    /// The partition's log.
    pub log: Arc<PartitionLog>,
    topic_partition: TopicPartition,
    state: RwLock<PartitionState>,
    high_watermark: AtomicI64,
    /// The leader's replication state (followers, pending ISR change), while this broker leads.
    leader: Mutex<Option<LeaderState>>,
    replication: Arc<ReplicationContext>,
    self_ref: Weak<Partition>,
    delayed: Arc<DelayedOperations>,
    clock: SharedClock,
    local_broker: i32,
    /// Byte and record counters of the topic (Prometheus handles, created once).
    pub metrics: TopicMetrics,
}

impl Partition {
    /// A partition over `log` with no role yet ([`Role::None`]); the caller applies the
    /// metadata with [`Partition::apply`]. The high watermark starts at the log start offset.
    pub fn new(
        topic_id: Uuid,
        topic_partition: TopicPartition,
        log: Arc<PartitionLog>,
        local_broker: i32,
        delayed: Arc<DelayedOperations>,
        clock: SharedClock,
        replication: Arc<ReplicationContext>,
    ) -> Arc<Self> {
        let hw = log.log_start_offset();
        Arc::new_cyclic(|self_ref| Self {
            topic: topic_partition.topic.clone(),
            topic_id,
            index: topic_partition.partition,
            metrics: TopicMetrics::new(&topic_partition.topic),
            log,
            topic_partition,
            state: RwLock::new(PartitionState {
                role: Role::None,
                leader: -1,
                leader_epoch: -1,
                partition_epoch: -1,
                replicas: Vec::new(),
                isr: Vec::new(),
                min_insync_replicas: 1,
            }),
            high_watermark: AtomicI64::new(hw),
            leader: Mutex::new(None),
            replication,
            self_ref: self_ref.clone(),
            delayed,
            clock,
            local_broker,
        })
    }

    /// `topic`-`index`.
    pub fn topic_partition(&self) -> &TopicPartition {
        &self.topic_partition
    }

    /// The current leadership state.
    pub fn state(&self) -> PartitionState {
        self.state.read().clone()
    }

    /// This broker's role.
    pub fn role(&self) -> Role {
        self.state.read().role
    }

    /// Whether `replica_id` is in the committed ISR (Kafka's `inSyncReplicaIds.contains`).
    pub fn in_committed_isr(&self, replica_id: i32) -> bool {
        self.state.read().isr.contains(&replica_id)
    }

    /// The current leader epoch.
    pub fn leader_epoch(&self) -> i32 {
        self.state.read().leader_epoch
    }

    /// The high watermark: the offset below which every record is replicated to the ISR.
    pub fn high_watermark(&self) -> i64 {
        self.high_watermark.load(Ordering::Acquire)
    }

    /// The last stable offset (KIP-98, Kafka's `UnifiedLog.lastStableOffset`): the first
    /// offset of the earliest transaction not yet decided (or decided by a marker the high
    /// watermark has not passed), if below the high watermark, else the high watermark.
    /// read_committed consumers read below it.
    pub fn last_stable_offset(&self) -> i64 {
        self.log.last_stable_offset(self.high_watermark())
    }

    /// True when this broker leads the partition.
    pub fn is_leader(&self) -> bool {
        self.state.read().role == Role::Leader
    }

    /// Applies the metadata's leader and ISR: the one entry point for leadership changes,
    /// dispatching to [`Partition::make_leader`], [`Partition::make_follower`] or
    /// [`Partition::make_offline`].
    pub fn apply(&self, reg: LeaderAndIsr) {
        if reg.leader == self.local_broker {
            self.make_leader(reg);
        } else if reg.leader >= 0 {
            self.make_follower(reg);
        } else {
            self.make_offline(reg.leader_epoch);
        }
    }

    /// Kafka's `Partition.makeLeader`: this broker leads from `reg.leader_epoch`. The
    /// leader state ([`LeaderState::apply`]) takes the committed ISR; on a new leader epoch the
    /// epoch cache records `(leader epoch, log end offset)` (Kafka's
    /// `maybeAssignEpochStartOffset`) and followers' progress is reset (ISR members count as
    /// caught up now). A registration older than the current one (leader or partition epoch)
    /// is stale and ignored. The high watermark is recomputed and delayed operations on the
    /// partition re-checked.
    pub fn make_leader(&self, reg: LeaderAndIsr) {
        debug_assert_eq!(reg.leader, self.local_broker);
        let registration = LeaderRegistration {
            leader_epoch: reg.leader_epoch,
            partition_epoch: reg.partition_epoch,
            replicas: reg.replicas.clone(),
            isr: reg.isr.clone(),
            min_insync_replicas: reg.min_insync_replicas,
        };
        if !self.set_state(Role::Leader, reg) {
            return;
        }
        let now = self.clock.now_ms();
        let leo = self.log.log_end_offset();
        let new_epoch = {
            let mut guard = self.leader.lock();
            let core = guard.get_or_insert_with(|| {
                LeaderState::new(
                    self.local_broker,
                    self.replication.replica_lag_time_max_ms(),
                    self.high_watermark(),
                )
            });
            core.set_brokers((*self.replication.brokers()).clone());
            core.apply(&registration, leo, now)
        };
        if new_epoch == Some(true) {
            // Written with the other partitions of the metadata change
            // (ReplicaManager::apply_image), synced by the next flush.
            self.log
                .maybe_assign_epoch_start_offset_deferred(registration.leader_epoch, leo);
        }
        self.maybe_increment_high_watermark();
        self.delayed.check_and_complete_all(&self.topic_partition);
    }

    /// Kafka's `Partition.makeFollower`: another broker leads. Appends as leader are refused
    /// from now on (NOT_LEADER_OR_FOLLOWER) and waiting produces and fetches complete.
    pub fn make_follower(&self, reg: LeaderAndIsr) {
        debug_assert!(reg.leader >= 0 && reg.leader != self.local_broker);
        if self.set_state(Role::Follower, reg) {
            *self.leader.lock() = None;
            self.delayed.check_and_complete_all(&self.topic_partition);
        }
    }

    /// No leader (the metadata says -1, or the partition is leaving this broker): neither
    /// appends nor consumer reads are served.
    pub fn make_offline(&self, leader_epoch: i32) {
        {
            let mut s = self.state.write();
            s.role = Role::None;
            s.leader = -1;
            s.leader_epoch = s.leader_epoch.max(leader_epoch);
        }
        *self.leader.lock() = None;
        self.delayed.check_and_complete_all(&self.topic_partition);
    }

    fn set_state(&self, role: Role, reg: LeaderAndIsr) -> bool {
        let mut s = self.state.write();
        if reg.leader_epoch < s.leader_epoch
            || (reg.leader_epoch == s.leader_epoch && reg.partition_epoch < s.partition_epoch)
        {
            tracing::debug!(partition = %self.topic_partition, epoch = reg.leader_epoch,
                current = s.leader_epoch, "ignoring a stale leader epoch");
            return false;
        }
        *s = PartitionState {
            role,
            leader: reg.leader,
            leader_epoch: reg.leader_epoch,
            partition_epoch: reg.partition_epoch,
            replicas: reg.replicas,
            isr: reg.isr,
            min_insync_replicas: reg.min_insync_replicas,
        };
        true
    }

    /// Checks a request's `current_leader_epoch` (-1 = not given) against ours (KIP-320).
    ///
    /// # Errors
    /// FENCED_LEADER_EPOCH (74) when the client's epoch is older, UNKNOWN_LEADER_EPOCH (76) when
    /// it is newer, NOT_LEADER_OR_FOLLOWER (6) when this broker does not lead.
    pub fn check_leader(&self, current_leader_epoch: i32) -> Result<(), i16> {
        let s = self.state.read();
        if current_leader_epoch >= 0 {
            if current_leader_epoch < s.leader_epoch {
                return Err(ec::FENCED_LEADER_EPOCH);
            }
            if current_leader_epoch > s.leader_epoch {
                return Err(ec::UNKNOWN_LEADER_EPOCH);
            }
        }
        if s.role != Role::Leader {
            return Err(ec::NOT_LEADER_OR_FOLLOWER);
        }
        Ok(())
    }

    /// Kafka's `maybeIncrementLeaderHW` through the leader state
    /// ([`LeaderState::maybe_increment_high_watermark`]: min log end offset over the maximal
    /// ISR and caught-up eligible followers, not while under min ISR, never below the log
    /// start offset) and, if it moved, completes the delayed operations it unblocks. Returns
    /// whether it moved.
    pub fn maybe_increment_high_watermark(&self) -> bool {
        let moved = {
            let mut guard = self.leader.lock();
            let Some(core) = guard.as_mut() else {
                return false;
            };
            let leo = self.log.log_end_offset();
            let moved = core.maybe_increment_high_watermark(
                leo,
                self.log.log_start_offset(),
                self.clock.now_ms(),
            );
            if let Some(hw) = moved {
                self.high_watermark.fetch_max(hw, Ordering::AcqRel);
            }
            moved.is_some()
        };
        if moved {
            // Completed transactions whose markers the high watermark passed are stable now.
            self.log.on_high_watermark_updated(self.high_watermark());
        }
        debug_assert!(
            self.high_watermark() <= self.log.log_end_offset().max(self.log.log_start_offset()),
            "HW <= LEO"
        );
        if moved {
            self.delayed.check_and_complete_all(&self.topic_partition);
        }
        moved
    }

    /// Kafka's `Partition.updateFollowerFetchState`: follower `replica_id` fetched from
    /// `fetch_offset` (so that is its log end offset) with log start offset
    /// `follower_log_start_offset` and broker epoch `broker_epoch` (-1 when the fetch has none,
    /// Fetch < v15), while this log's end offset was `leader_log_end_offset`. May move the high
    /// watermark (completing delayed operations) and propose adding the follower to the ISR.
    ///
    /// # Errors
    /// NOT_LEADER_OR_FOLLOWER when this broker does not lead, the replica is not a follower of
    /// the partition, or the fetch's broker epoch is stale (KIP-903).
    pub fn update_follower_fetch_state(
        &self,
        replica_id: i32,
        fetch_offset: i64,
        follower_log_start_offset: i64,
        broker_epoch: i64,
        leader_log_end_offset: i64,
    ) -> Result<(), i16> {
        let update = {
            let mut guard = self.leader.lock();
            let core = guard.as_mut().ok_or(ec::NOT_LEADER_OR_FOLLOWER)?;
            let update = core
                .update_follower_fetch_state(
                    FollowerFetch {
                        replica: replica_id,
                        fetch_offset,
                        log_start_offset: follower_log_start_offset,
                        broker_epoch,
                    },
                    leader_log_end_offset,
                    self.log.log_start_offset(),
                    self.clock.now_ms(),
                )
                .map_err(|e| {
                    tracing::debug!(partition = %self.topic_partition, error = %e, "follower fetch refused");
                    e.error_code()
                })?;
            if let Some(hw) = update.high_watermark {
                self.high_watermark.fetch_max(hw, Ordering::AcqRel);
            }
            update
        };
        if update.high_watermark.is_some() {
            self.log.on_high_watermark_updated(self.high_watermark());
        }
        if update.high_watermark.is_some() {
            self.delayed.check_and_complete_all(&self.topic_partition);
        } else if update.log_start_offset_moved {
            self.delayed
                .delete_records
                .check_and_complete(&self.topic_partition);
        }
        if let Some(change) = update.isr_change {
            self.submit_isr_change(change);
        }
        Ok(())
    }

    /// True when `replica_id` is a follower replica of this partition led here.
    pub fn is_follower_replica(&self, replica_id: i32) -> bool {
        let s = self.state.read();
        s.role == Role::Leader
            && replica_id != self.local_broker
            && s.replicas.contains(&replica_id)
    }

    /// Kafka's `maybeShrinkIsr` (the ISR-expiration task): proposes removing the ISR followers
    /// that are not caught up. Returns whether a change was proposed.
    pub fn maybe_shrink_isr(&self) -> bool {
        let change = {
            let mut guard = self.leader.lock();
            let Some(core) = guard.as_mut() else {
                return false;
            };
            core.set_replica_lag_time_max_ms(self.replication.replica_lag_time_max_ms());
            core.maybe_shrink_isr(self.log.log_end_offset(), self.clock.now_ms())
        };
        match change {
            Some(change) => {
                tracing::info!(partition = %self.topic_partition, ?change, "shrinking the ISR");
                self.submit_isr_change(change);
                true
            }
            None => false,
        }
    }

    fn submit_isr_change(&self, change: IsrChange) {
        let id = change.id;
        let Some(sender) = self.replication.alter_partition.get() else {
            self.on_alter_partition_outcome(id, AlterPartitionOutcome::Rejected);
            return;
        };
        let weak = self.self_ref.clone();
        let item = AlterPartitionItem {
            topic_id: self.topic_id,
            topic_partition: self.topic_partition.clone(),
            change,
            on_complete: Box::new(move |outcome| {
                if let Some(p) = weak.upgrade() {
                    p.on_alter_partition_outcome(id, outcome);
                }
            }),
        };
        sender.submit(item);
    }

    /// The controller's answer to ISR change `id` ([`LeaderState::on_alter_partition_outcome`]).
    pub fn on_alter_partition_outcome(&self, id: u64, outcome: AlterPartitionOutcome) {
        let dropped = self
            .leader
            .lock()
            .as_mut()
            .is_some_and(|core| core.on_alter_partition_outcome(id, outcome));
        if dropped {
            self.maybe_increment_high_watermark();
        }
    }

    /// The pending ISR change, if this broker leads and one is in flight.
    pub fn pending_isr_change(&self) -> Option<IsrChange> {
        self.leader
            .lock()
            .as_ref()
            .and_then(|c| c.pending().cloned())
    }

    /// The answer for this partition of a waiting acks=all produce whose batch was appended in
    /// leader epoch `batch_epoch` and ends before `required_offset`, or `None` while it waits
    /// ([`crate::replication::leader::acks_all_answer`] with
    /// [`crate::replication::leader::batch_still_there`] over this log's leader epoch cache; the
    /// replication simulator decides with the same two functions).
    pub fn acks_all_answer(
        &self,
        batch_epoch: Option<i32>,
        required_offset: i64,
        expired: bool,
    ) -> Option<i16> {
        let survived = crate::replication::leader::batch_still_there(
            batch_epoch,
            |e| self.log.end_offset_for_leader_epoch(e),
            required_offset,
        );
        crate::replication::leader::acks_all_answer(
            self.leader.lock().as_ref(),
            survived,
            required_offset,
            expired,
        )
    }

    /// Kafka's `lowWatermarkIfLeader` ([`LeaderState::low_watermark`] over this log's start
    /// offset), `None` when not led here.
    pub fn low_watermark_if_leader(&self) -> Option<i64> {
        self.leader
            .lock()
            .as_ref()
            .map(|core| core.low_watermark(self.log.log_start_offset()))
    }

    /// Kafka's `isUnderReplicated`: led here with an ISR smaller than the replica set.
    pub fn is_under_replicated(&self) -> bool {
        let s = self.state.read();
        s.role == Role::Leader && s.isr.len() < s.replicas.len()
    }

    /// Kafka's `isUnderMinIsr`: led here with an ISR smaller than the effective
    /// `min.insync.replicas` (capped at the replication factor).
    pub fn is_under_min_isr(&self) -> bool {
        self.leader
            .lock()
            .as_ref()
            .is_some_and(LeaderState::is_under_min_isr)
    }

    /// The leader's view of a follower's log end offset ([`crate::replication::leader::UNKNOWN_OFFSET`]
    /// before its first fetch), `None` when not led here or not a follower.
    pub fn follower_log_end_offset(&self, replica_id: i32) -> Option<i64> {
        self.leader
            .lock()
            .as_ref()
            .and_then(|c| c.follower(replica_id).map(|f| f.log_end_offset))
    }

    /// Appends a produce request's records as leader (Kafka's `appendRecordsToLeader`),
    /// stamping LogAppendTime from the partition's clock. Runs on an I/O thread.
    ///
    /// # Errors
    /// Kafka error codes: NOT_LEADER_OR_FOLLOWER, NOT_ENOUGH_REPLICAS (19) for acks=all with
    /// fewer in-sync replicas than `min.insync.replicas`, and the log's errors
    /// ([`LogError::kafka_error_code`]) with a message.
    pub fn append_records_as_leader(
        &self,
        records: &mut [u8],
        required_acks: i16,
    ) -> Result<AppendInfo, AppendRejected> {
        self.append_records_as_leader_from(records, required_acks, AppendOrigin::Client, None)
    }

    /// [`Partition::append_records_as_leader`] for `origin`, with the transaction
    /// verification guard of the request (`None`: verification is off; see
    /// [`gregor_log::PartitionLog::append_as_leader_from`]). Runs on an I/O thread.
    ///
    /// # Errors
    /// As [`Partition::append_records_as_leader`], plus INVALID_TXN_STATE and
    /// TRANSACTION_COORDINATOR_FENCED.
    pub fn append_records_as_leader_from(
        &self,
        records: &mut [u8],
        required_acks: i16,
        origin: AppendOrigin,
        verification: Option<VerificationGuard>,
    ) -> Result<AppendInfo, AppendRejected> {
        self.append_as_leader_with(required_acks, |log, leader_epoch, now_ms| {
            log.append_as_leader_from(records, leader_epoch, now_ms, origin, verification)
        })
    }

    /// Appends a transaction marker as leader (Kafka's WriteTxnMarkers append: origin
    /// COORDINATOR, acks=all, so NOT_ENOUGH_REPLICAS below `min.insync.replicas`). Runs on
    /// an I/O thread.
    ///
    /// # Errors
    /// As [`Partition::append_records_as_leader`]; INVALID_PRODUCER_EPOCH and
    /// TRANSACTION_COORDINATOR_FENCED from the producer state's checks.
    pub fn append_txn_marker_as_leader(
        &self,
        producer_id: i64,
        producer_epoch: i16,
        marker: EndTxnMarker,
    ) -> Result<AppendInfo, AppendRejected> {
        self.append_as_leader_with(-1, |log, leader_epoch, now_ms| {
            log.append_txn_marker(producer_id, producer_epoch, marker, leader_epoch, now_ms)
        })
    }

    /// The leader checks of an append, `append` with the leader epoch and the partition's
    /// clock, the error mapping, metrics and the high-watermark move after it.
    fn append_as_leader_with(
        &self,
        required_acks: i16,
        append: impl FnOnce(&PartitionLog, i32, i64) -> Result<AppendInfo, LogError>,
    ) -> Result<AppendInfo, AppendRejected> {
        let leader_epoch = {
            let s = self.state.read();
            if s.role != Role::Leader {
                return Err(AppendRejected::new(ec::NOT_LEADER_OR_FOLLOWER, ""));
            }
            // Kafka's effectiveMinIsr: min(min.insync.replicas, replication factor).
            let min_isr = s.min_insync_replicas.min(s.replicas.len().max(1));
            if required_acks == -1 && s.isr.len() < min_isr {
                return Err(AppendRejected::new(
                    ec::NOT_ENOUGH_REPLICAS,
                    format!(
                        "The size of the current ISR {:?} is insufficient to satisfy the min.isr requirement of {} for partition {}",
                        s.isr, min_isr, self.topic_partition
                    ),
                ));
            }
            s.leader_epoch
        };
        let info = append(self.log.as_ref(), leader_epoch, self.clock.now_ms()).map_err(|e| {
            let code = e.kafka_error_code();
            match e {
                // Kafka's ReplicaManager answers a RecordValidationException with its
                // message, the record errors and the log start offset (KIP-467).
                LogError::RecordValidation {
                    message,
                    record_errors,
                    ..
                } => AppendRejected {
                    code,
                    message,
                    record_errors,
                    log_start_offset: self.log.log_start_offset(),
                },
                e => AppendRejected::new(code, e.to_string()),
            }
        })?;
        if !info.duplicate {
            self.metrics.bytes_in.increment(info.bytes);
            self.metrics.records_in.increment(info.records);
        }
        if !self.maybe_increment_high_watermark() && !info.duplicate {
            // The high watermark waits for followers, whose fetches this new data may complete.
            self.delayed.fetch.check_and_complete(&self.topic_partition);
        }
        Ok(info)
    }

    /// Kafka's `Partition.lastOffsetForLeaderEpoch` as the leader (OffsetForLeaderEpoch):
    /// after the leader check of `current_leader_epoch` (KIP-320), the largest epoch `<=`
    /// `leader_epoch` in the epoch cache and its end offset (the log end offset for the
    /// latest epoch); `(-1, -1)` when unknown.
    ///
    /// # Errors
    /// The leader check's codes: FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH,
    /// NOT_LEADER_OR_FOLLOWER.
    pub fn last_offset_for_leader_epoch(
        &self,
        current_leader_epoch: i32,
        leader_epoch: i32,
    ) -> Result<(i32, i64), i16> {
        self.check_leader(current_leader_epoch)?;
        Ok(self.log.end_offset_for_leader_epoch(leader_epoch))
    }

    /// The offset a read may not pass: the log end offset for a follower, else the high
    /// watermark (isolation 0) or the last stable offset (isolation 1).
    pub fn fetch_upper_bound(&self, isolation_level: i8, from_follower: bool) -> i64 {
        if from_follower {
            self.log.log_end_offset()
        } else if isolation_level == 1 {
            self.last_stable_offset()
        } else {
            self.high_watermark()
        }
    }

    /// Reads for a consumer: up to `max_bytes` from `fetch_offset`, bounded by the high
    /// watermark (isolation 0) or last stable offset (isolation 1). Runs on an I/O thread.
    ///
    /// # Errors
    /// The log's errors, e.g. OFFSET_OUT_OF_RANGE.
    pub fn read(
        &self,
        fetch_offset: i64,
        max_bytes: usize,
        isolation_level: i8,
        min_one_batch: bool,
    ) -> Result<ReadInfo, LogError> {
        self.read_bounded(
            fetch_offset,
            max_bytes,
            self.fetch_upper_bound(isolation_level, false),
            min_one_batch,
        )
    }

    /// Reads up to `max_bytes` from `fetch_offset`, below `max_offset`.
    ///
    /// # Errors
    /// The log's errors, e.g. OFFSET_OUT_OF_RANGE.
    pub fn read_bounded(
        &self,
        fetch_offset: i64,
        max_bytes: usize,
        max_offset: i64,
        min_one_batch: bool,
    ) -> Result<ReadInfo, LogError> {
        self.log
            .read(fetch_offset, max_bytes, max_offset, min_one_batch)
    }

    /// [`Partition::read_bounded`] for a Fetch response: with `from_file`, the batches may come
    /// back as a pinned range of the segment file, sent without copying
    /// ([`gregor_log::PartitionLog::read_for_fetch`]).
    ///
    /// # Errors
    /// The log's errors, e.g. OFFSET_OUT_OF_RANGE.
    pub fn read_for_fetch(
        &self,
        fetch_offset: i64,
        max_bytes: usize,
        max_offset: i64,
        min_one_batch: bool,
        from_file: bool,
    ) -> Result<gregor_log::FetchReadInfo, LogError> {
        self.log.read_for_fetch(
            fetch_offset,
            max_bytes,
            max_offset,
            min_one_batch,
            from_file,
        )
    }

    /// Kafka's `Partition.fetchOffsetForTimestamp` (ListOffsets), after the leader check
    /// (KIP-320; with `fetch_only_from_leader` false, ListOffsets' debugging replica id -2, a
    /// follower answers too, [`Partition::check_local_replica`]): -2 earliest and -4 earliest local give the log start offset, -1 latest the
    /// high watermark (or the last stable offset for read_committed), -3 the record with the
    /// largest timestamp (KIP-734), -5 and -6 (tiered storage, KIP-1005) offset -1; otherwise
    /// the first record whose timestamp is at or after `timestamp` (KIP-79), if below the high
    /// watermark. Returns (timestamp, offset, leader epoch), -1 where unknown. Blocking: reads
    /// the time index and a segment.
    ///
    /// # Errors
    /// The leader check's codes, INVALID_REQUEST for another negative timestamp,
    /// OFFSET_NOT_AVAILABLE (78) for latest, or a record at or past the high watermark, while a
    /// new leader's high watermark is below its epoch's start offset, the log's errors.
    pub fn fetch_offset_for_timestamp(
        &self,
        timestamp: i64,
        isolation_level: Option<i8>,
        current_leader_epoch: i32,
        fetch_only_from_leader: bool,
    ) -> Result<(i64, i64, i32), i16> {
        self.check_local_replica(current_leader_epoch, fetch_only_from_leader)?;
        let epoch = self.log.latest_leader_epoch().unwrap_or(-1);
        // Kafka's fetchOffsetForTimestamp: a consumer (an isolation level) reads up to the high
        // watermark or the LSO; a follower or a debugging client (none) up to the log end
        // offset, which is what a follower recovering from OFFSET_OUT_OF_RANGE needs.
        let last_fetchable = match isolation_level {
            Some(level) => self.fetch_upper_bound(level, false),
            None => self.log.log_end_offset(),
        };
        // A new leader whose high watermark has not reached the start offset of its epoch
        // cannot tell a consumer where the committed data ends yet.
        let lagging = isolation_level.is_some()
            && self
                .leader
                .lock()
                .as_ref()
                .is_some_and(|c| c.leader_epoch_start_offset() > self.high_watermark());
        let found = |t: Option<gregor_log::TimestampAndOffset>| match t {
            Some(t) if t.offset < last_fetchable => {
                Ok((t.timestamp_ms, t.offset, t.leader_epoch.unwrap_or(-1)))
            }
            Some(_) if lagging => Err(ec::OFFSET_NOT_AVAILABLE),
            _ => Ok((-1, -1, -1)),
        };
        match timestamp {
            LATEST_TIMESTAMP if lagging => Err(ec::OFFSET_NOT_AVAILABLE),
            LATEST_TIMESTAMP => Ok((-1, last_fetchable, epoch)),
            EARLIEST_TIMESTAMP | EARLIEST_LOCAL_TIMESTAMP => {
                Ok((-1, self.log.log_start_offset(), epoch))
            }
            EARLIEST_PENDING_UPLOAD_TIMESTAMP | LATEST_TIERED_TIMESTAMP => Ok((-1, -1, -1)),
            MAX_TIMESTAMP => self
                .log
                .max_timestamp_and_offset()
                .map_err(|e| e.kafka_error_code())
                .and_then(found),
            ts if ts < 0 => Err(ec::INVALID_REQUEST),
            ts => self
                .log
                .fetch_offset_by_timestamp(ts)
                .map_err(|e| e.kafka_error_code())
                .and_then(found),
        }
    }
}

/// ListOffsets: earliest offset.
pub const EARLIEST_TIMESTAMP: i64 = -2;
/// ListOffsets: latest offset.
pub const LATEST_TIMESTAMP: i64 = -1;
/// ListOffsets: offset of the record with the largest timestamp (KIP-734).
pub const MAX_TIMESTAMP: i64 = -3;
/// ListOffsets: earliest offset in local storage (KIP-405).
pub const EARLIEST_LOCAL_TIMESTAMP: i64 = -4;
/// ListOffsets: latest offset in tiered storage (KIP-1005; Kafka's
/// `ListOffsetsRequest.LATEST_TIERED_TIMESTAMP`).
pub const LATEST_TIERED_TIMESTAMP: i64 = -5;
/// ListOffsets: earliest offset not yet uploaded to tiered storage (KIP-1023; Kafka's
/// `ListOffsetsRequest.EARLIEST_PENDING_UPLOAD_TIMESTAMP`).
pub const EARLIEST_PENDING_UPLOAD_TIMESTAMP: i64 = -6;
