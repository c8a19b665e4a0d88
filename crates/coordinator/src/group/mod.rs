//! The group coordinator: consumer groups and committed offsets, stored in the compacted
//! internal topic `__consumer_offsets`, on the [`CoordinatorRuntime`].
//!
//! Kafka's design, in Kafka's terms (`GroupCoordinator`, `GroupMetadataManager`, KIP-848 for the
//! new protocol): the coordinator of a group is the leader of partition
//! `abs(groupId.hashCode) % offsets.topic.num.partitions` of `__consumer_offsets`; group
//! metadata and offset commits are written there as records in Kafka's own schemas
//! ([`records`]). When this broker becomes the leader of a partition
//! ([`GroupCoordinator::on_became_leader`]) its groups and offsets are rebuilt by replaying
//! the partition; when it resigns ([`GroupCoordinator::on_resigned`]) they are dropped.
//!
//! Two group types share one namespace:
//! - classic groups (JoinGroup / SyncGroup / Heartbeat / LeaveGroup, [`classic`]): the
//!   coordinator relays protocol metadata and assignments, the leader's client assigns;
//! - consumer groups (KIP-848 ConsumerGroupHeartbeat, [`consumer`]): the coordinator assigns
//!   with a server-side assignor ([`assignor`]: `uniform`, `range`).
//!
//! All group state lives behind one mutex that is never held across an await. Waits (a JoinGroup
//! until the rebalance completes, a SyncGroup until the leader's assignment is committed, an
//! OffsetCommit until its records are committed) are oneshot channels completed by membership
//! events or by the high watermark; timers (session timeouts, rebalance timeouts,
//! `group.initial.rebalance.delay.ms`) are [`Timer`]s queued in the runtime on its clock.

pub mod assignor;
pub mod classic;
pub mod consumer;
pub mod offsets;
pub mod records;
pub mod txn_offsets;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use gregor_log::clock::SharedClock;
use gregor_protocol::error::ErrorCode;
use gregor_protocol::kafka_protocol::protocol::StrBytes;
use parking_lot::{MappedMutexGuard, Mutex, MutexGuard};
use thiserror::Error;
use tokio::sync::oneshot;
use tracing::{debug, info, warn};

use crate::runtime::{
    CoordinatorRecord, CoordinatorRuntime, PartitionWriter, PendingWrite, ReplayItem, TopicMetadata,
};

pub use classic::{ClassicGroup, ClassicGroupState};
pub use consumer::ConsumerGroup;

/// The internal topic holding group metadata and committed offsets.
pub const GROUP_METADATA_TOPIC_NAME: &str = "__consumer_offsets";

/// A group setting out of Kafka's range.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("Invalid value {value} for configuration {name}: {reason}")]
pub struct GroupConfigError {
    /// Config name.
    pub name: String,
    /// Offending value.
    pub value: String,
    /// Why it is invalid.
    pub reason: String,
}

/// Group coordinator settings, with Kafka's names and defaults.
#[derive(Debug, Clone)]
pub struct GroupConfig {
    /// `group.initial.rebalance.delay.ms` (3000): how long the first rebalance of an empty
    /// group waits for more members (KIP-134).
    pub initial_rebalance_delay_ms: u64,
    /// `group.min.session.timeout.ms` (6000).
    pub min_session_timeout_ms: i32,
    /// `group.max.session.timeout.ms` (1800000).
    pub max_session_timeout_ms: i32,
    /// `group.max.size` (Integer.MAX_VALUE): members of a classic group (KIP-389).
    pub max_size: usize,
    /// `offsets.topic.num.partitions` (50).
    pub offsets_topic_num_partitions: i32,
    /// `offsets.topic.replication.factor` (3, capped at the number of brokers).
    pub offsets_topic_replication_factor: i16,
    /// `offsets.topic.segment.bytes` (104857600).
    pub offsets_topic_segment_bytes: i32,
    /// `offsets.retention.minutes` (10080, 7 days), KIP-211 semantics.
    pub offsets_retention_ms: i64,
    /// `offsets.retention.check.interval.ms` (600000).
    pub offsets_retention_check_interval_ms: u64,
    /// `offset.metadata.max.bytes` (4096).
    pub offset_metadata_max_bytes: usize,
    /// `group.consumer.session.timeout.ms` (45000), KIP-848.
    pub consumer_session_timeout_ms: i32,
    /// `group.consumer.heartbeat.interval.ms` (5000), KIP-848.
    pub consumer_heartbeat_interval_ms: i32,
    /// `group.consumer.max.size` (Integer.MAX_VALUE), KIP-848.
    pub consumer_max_size: usize,
    /// `group.consumer.assignors` ("uniform,range"); the first is the default.
    pub consumer_assignors: Vec<String>,
    /// `offsets.commit.timeout.ms` (5000): how long a write to `__consumer_offsets` may wait
    /// for the high watermark before the request fails with COORDINATOR_NOT_AVAILABLE.
    pub offsets_commit_timeout_ms: i64,
}

impl Default for GroupConfig {
    fn default() -> Self {
        Self::from_properties(&BTreeMap::new()).unwrap_or_else(|_| unreachable_defaults())
    }
}

fn unreachable_defaults() -> GroupConfig {
    GroupConfig {
        initial_rebalance_delay_ms: 3000,
        min_session_timeout_ms: 6000,
        max_session_timeout_ms: 1_800_000,
        max_size: i32::MAX as usize,
        offsets_topic_num_partitions: 50,
        offsets_topic_replication_factor: 3,
        offsets_topic_segment_bytes: 104_857_600,
        offsets_retention_ms: 10080 * 60_000,
        offsets_retention_check_interval_ms: 600_000,
        offset_metadata_max_bytes: 4096,
        consumer_session_timeout_ms: 45_000,
        consumer_heartbeat_interval_ms: 5000,
        consumer_max_size: i32::MAX as usize,
        consumer_assignors: vec!["uniform".into(), "range".into()],
        offsets_commit_timeout_ms: 5000,
    }
}

impl GroupConfig {
    /// Reads the group settings from broker properties.
    ///
    /// # Errors
    /// [`GroupConfigError`] for a value out of Kafka's range.
    pub fn from_properties(props: &BTreeMap<String, String>) -> Result<Self, GroupConfigError> {
        let d = unreachable_defaults();
        let num = |k: &str, default: i64, min: i64| -> Result<i64, GroupConfigError> {
            match props.get(k).map(|v| v.trim()) {
                None => Ok(default),
                Some(v) => {
                    let n: i64 = v.parse().map_err(|_| config_error(k, v, "not a number"))?;
                    if n < min {
                        return Err(config_error(k, v, format!("Value must be at least {min}")));
                    }
                    Ok(n)
                }
            }
        };
        let assignors = props
            .get("group.consumer.assignors")
            .map(|v| {
                v.split(',')
                    .map(|s| assignor::short_name(s.trim()).to_string())
                    .filter(|s| !s.is_empty())
                    .collect::<Vec<_>>()
            })
            .unwrap_or(d.consumer_assignors);
        if let Some(bad) = assignors.iter().find(|a| assignor::by_name(a).is_none()) {
            return Err(config_error(
                "group.consumer.assignors",
                bad,
                "unknown assignor (gregor has uniform and range)",
            ));
        }
        Ok(Self {
            initial_rebalance_delay_ms: num("group.initial.rebalance.delay.ms", 3000, 0)? as u64,
            min_session_timeout_ms: num("group.min.session.timeout.ms", 6000, 0)? as i32,
            max_session_timeout_ms: num("group.max.session.timeout.ms", 1_800_000, 0)? as i32,
            max_size: num("group.max.size", i64::from(i32::MAX), 1)? as usize,
            offsets_topic_num_partitions: num("offsets.topic.num.partitions", 50, 1)?
                .min(i64::from(i32::MAX)) as i32,
            offsets_topic_replication_factor: num("offsets.topic.replication.factor", 3, 1)?
                .min(i64::from(i16::MAX)) as i16,
            offsets_topic_segment_bytes: num("offsets.topic.segment.bytes", 104_857_600, 1)?
                .min(i64::from(i32::MAX)) as i32,
            offsets_retention_ms: num("offsets.retention.minutes", 10080, 1)?
                .saturating_mul(60_000),
            offsets_retention_check_interval_ms: num(
                "offsets.retention.check.interval.ms",
                600_000,
                1,
            )? as u64,
            offset_metadata_max_bytes: num("offset.metadata.max.bytes", 4096, 0)? as usize,
            consumer_session_timeout_ms: num("group.consumer.session.timeout.ms", 45_000, 1)?
                .min(i64::from(i32::MAX)) as i32,
            consumer_heartbeat_interval_ms: num("group.consumer.heartbeat.interval.ms", 5000, 1)?
                .min(i64::from(i32::MAX)) as i32,
            consumer_max_size: num("group.consumer.max.size", i64::from(i32::MAX), 1)? as usize,
            consumer_assignors: assignors,
            offsets_commit_timeout_ms: num("offsets.commit.timeout.ms", 5000, 1)?,
        })
    }
}

fn config_error(name: &str, value: &str, reason: impl Into<String>) -> GroupConfigError {
    GroupConfigError {
        name: name.into(),
        value: value.into(),
        reason: reason.into(),
    }
}

/// Java's `String.hashCode` over UTF-16 code units, as Kafka hashes group ids.
pub fn java_string_hash_code(s: &str) -> i32 {
    s.encode_utf16()
        .fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(i32::from(c)))
}

/// Kafka's `Utils.abs`: `Integer.MIN_VALUE` maps to 0.
fn kafka_abs(n: i32) -> i32 {
    if n == i32::MIN {
        0
    } else {
        n.abs()
    }
}

/// A committed offset (`OffsetAndMetadata`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedOffset {
    /// Offset.
    pub offset: i64,
    /// Leader epoch, -1 if unknown.
    pub leader_epoch: i32,
    /// Client metadata.
    pub metadata: String,
    /// Commit time (ms).
    pub commit_timestamp_ms: i64,
    /// Explicit expiry (OffsetCommit v1 retention), -1 if none.
    pub expire_timestamp_ms: i64,
}

/// The protocol-specific part of a group.
// Groups live in one map for their lifetime; the variants' size difference costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum GroupKind {
    /// A classic group (JoinGroup/SyncGroup), also "simple" groups that only commit offsets.
    Classic(ClassicGroup),
    /// A KIP-848 consumer group.
    Consumer(ConsumerGroup),
}

/// A group: its committed offsets and its membership state.
pub struct Group {
    /// Group id.
    pub group_id: String,
    /// Committed offsets by (topic, partition).
    pub offsets: BTreeMap<(String, i32), CommittedOffset>,
    /// Membership state.
    pub kind: GroupKind,
}

impl Group {
    fn new_classic(group_id: &str, now_ms: i64) -> Self {
        Self {
            group_id: group_id.to_string(),
            offsets: BTreeMap::new(),
            kind: GroupKind::Classic(ClassicGroup::new(now_ms)),
        }
    }

    /// True when the group has no members (offsets may still exist).
    pub fn is_empty(&self) -> bool {
        match &self.kind {
            GroupKind::Classic(c) => c.members.is_empty() && c.pending_members.is_empty(),
            GroupKind::Consumer(c) => c.members.is_empty(),
        }
    }

    /// Kafka's state name (ListGroups, DescribeGroups).
    pub fn state_name(&self) -> &'static str {
        match &self.kind {
            GroupKind::Classic(c) => c.state.name(),
            GroupKind::Consumer(c) => c.state_name(),
        }
    }

    /// "classic" or "consumer" (KIP-848 ListGroups v5 type).
    pub fn type_name(&self) -> &'static str {
        match &self.kind {
            GroupKind::Classic(_) => "classic",
            GroupKind::Consumer(_) => "consumer",
        }
    }

    /// The protocol type (ListGroups): a classic group's, "consumer" for consumer groups.
    pub fn protocol_type(&self) -> String {
        match &self.kind {
            GroupKind::Classic(c) => c.protocol_type.clone().unwrap_or_default(),
            GroupKind::Consumer(_) => "consumer".to_string(),
        }
    }
}

/// A response now, or one that a membership event or a commit will complete.
pub enum Wait<T> {
    /// Answered now.
    Ready(T),
    /// Answered when the rebalance (join), the leader's assignment (sync) or the write
    /// (offset commit) completes.
    Pending(oneshot::Receiver<T>),
}

/// A string for a `kafka-protocol` message field.
pub(crate) fn sb(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

/// A group coordinator timer, queued in the runtime at a deadline on its clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Timer {
    /// A classic member's session: removes it if no heartbeat moved its deadline.
    Session {
        /// Group id.
        group_id: String,
        /// Member id.
        member_id: String,
        /// The member incarnation the timer belongs to.
        incarnation: u64,
    },
    /// A classic group's rebalance (or KIP-134 initial) delay.
    Rebalance {
        /// Group id.
        group_id: String,
        /// The rebalance the timer belongs to.
        id: u64,
        /// Delay (ms).
        delay_ms: u64,
    },
    /// The SyncGroup deadline of a generation (the rebalance timeout).
    Sync {
        /// Group id.
        group_id: String,
        /// Generation.
        generation: i32,
        /// Delay (ms).
        delay_ms: u64,
    },
    /// A KIP-394 pending member that never joined.
    PendingMember {
        /// Group id.
        group_id: String,
        /// Member id.
        member_id: String,
        /// Delay (ms).
        delay_ms: u64,
    },
    /// A KIP-848 member's session.
    ConsumerSession {
        /// Group id.
        group_id: String,
        /// Member id.
        member_id: String,
        /// The member incarnation the timer belongs to.
        incarnation: u64,
        /// Delay (ms).
        delay_ms: u64,
    },
}

/// All groups hosted by this broker.
pub(crate) struct CoordinatorState {
    pub(crate) groups: HashMap<String, Group>,
    /// Transactional offset commits waiting for their transaction's marker (KIP-98): by
    /// group, then producer id. Visible to OffsetFetch only as UNSTABLE_OFFSET_COMMIT.
    pub(crate) pending_txn_offsets: txn_offsets::PendingTxnOffsets,
    /// Distinguishes timers of re-created members and stale rebalance timers.
    pub(crate) next_timer_id: u64,
}

impl CoordinatorState {
    pub(crate) fn next_id(&mut self) -> u64 {
        self.next_timer_id += 1;
        self.next_timer_id
    }
}

/// The group coordinator of this broker (Kafka's `GroupCoordinatorService` for the partitions
/// of `__consumer_offsets` this broker leads).
pub struct GroupCoordinator {
    /// Settings.
    pub config: GroupConfig,
    pub(crate) state: Mutex<CoordinatorState>,
    pub(crate) runtime: CoordinatorRuntime<Timer>,
    pub(crate) metadata: Arc<dyn TopicMetadata>,
}

impl GroupCoordinator {
    /// A coordinator with no partitions loaded: writes go through `writer`, topic ids and
    /// partition counts come from `metadata`, time from `clock`.
    pub fn new(
        config: GroupConfig,
        writer: Arc<dyn PartitionWriter>,
        metadata: Arc<dyn TopicMetadata>,
        clock: SharedClock,
    ) -> Self {
        let runtime = CoordinatorRuntime::new(
            GROUP_METADATA_TOPIC_NAME,
            writer,
            clock,
            config.offsets_commit_timeout_ms,
        );
        Self {
            config,
            state: Mutex::new(CoordinatorState {
                groups: HashMap::new(),
                next_timer_id: 0,
                pending_txn_offsets: HashMap::new(),
            }),
            runtime,
            metadata,
        }
    }

    /// The runtime (partitions, timers, writes).
    pub fn runtime(&self) -> &CoordinatorRuntime<Timer> {
        &self.runtime
    }

    /// Every group hosted here, locked: hold the guard briefly (metrics, tests).
    pub fn groups(&self) -> MappedMutexGuard<'_, HashMap<String, Group>> {
        MutexGuard::map(self.state.lock(), |s| &mut s.groups)
    }

    pub(crate) fn now_ms(&self) -> i64 {
        self.runtime.now_ms()
    }

    /// The partition of `__consumer_offsets` that holds `group_id`:
    /// `Utils.abs(groupId.hashCode) % offsets.topic.num.partitions`.
    pub fn partition_for(&self, group_id: &str) -> i32 {
        kafka_abs(java_string_hash_code(group_id)) % self.config.offsets_topic_num_partitions
    }

    /// Checks that this broker coordinates `group_id`: it leads the group's partition of
    /// `__consumer_offsets` and has loaded it. Returns that partition.
    ///
    /// # Errors
    /// NOT_COORDINATOR when it does not lead it (or the topic does not exist yet),
    /// COORDINATOR_LOAD_IN_PROGRESS while the partition is loading.
    pub fn check_coordinator(&self, group_id: &str) -> Result<i32, i16> {
        let p = self.partition_for(group_id);
        self.runtime.check_active(p).map_err(|e| e.code())?;
        Ok(p)
    }

    /// Appends records to partition `partition` of `__consumer_offsets` (acks=all, as Kafka
    /// writes coordinator records). The write is in the log; it is committed when the high
    /// watermark passes it ([`CoordinatorRuntime::committed`]).
    ///
    /// # Errors
    /// The error code to return, mapped in one place
    /// ([`crate::error::CoordinatorError::error_code`]): NOT_COORDINATOR when not the leader,
    /// COORDINATOR_NOT_AVAILABLE when the partition is missing or under-replicated,
    /// INVALID_COMMIT_OFFSET_SIZE for too-large batches, UNKNOWN_SERVER_ERROR otherwise.
    pub(crate) fn append(
        &self,
        partition: i32,
        records: &[CoordinatorRecord],
    ) -> Result<PendingWrite, i16> {
        self.runtime
            .append(partition, records)
            .map_err(|e| e.code())
    }

    /// `Ready(ok)` when `write` is already committed, else a wait that completes with `ok`
    /// once the high watermark passes it, or with `on_error(code)` when it does not.
    pub(crate) fn when_committed<T: Send + 'static>(
        &self,
        write: PendingWrite,
        ok: T,
        on_error: impl FnOnce(i16) -> T + Send + 'static,
    ) -> Wait<T> {
        if self.runtime.is_committed(&write) {
            return Wait::Ready(ok);
        }
        let (tx, rx) = oneshot::channel();
        self.runtime.complete_when_committed(write, move |r| {
            let _ = tx.send(match r {
                Ok(()) => ok,
                Err(e) => on_error(e.code()),
            });
        });
        Wait::Pending(rx)
    }

    /// Called when this broker becomes the leader of `partition` of `__consumer_offsets`
    /// (at start-up for the partitions it leads, then on every leadership change): the
    /// partition's groups and committed offsets are rebuilt from its records, and the session
    /// timers of loaded members start. Requests for its groups get
    /// COORDINATOR_LOAD_IN_PROGRESS meanwhile. A repeated call for a loaded partition does
    /// nothing.
    pub fn on_became_leader(&self, partition: i32) {
        if !self.runtime.begin_load(partition) {
            return;
        }
        let started = std::time::Instant::now();
        let now = self.now_ms();
        let mut groups: HashMap<String, Group> = HashMap::new();
        let mut pending = txn_offsets::PendingTxnOffsets::new();
        let summary = match self.runtime.replay_batches(partition, |item| match item {
            ReplayItem::Record {
                key,
                value,
                producer_id: None,
                ..
            } => apply_loaded_record(&mut groups, key, value, now),
            ReplayItem::Record {
                key,
                value,
                producer_id: Some(pid),
                ..
            } => txn_offsets::apply_loaded_transactional_record(&mut pending, pid, key, value),
            ReplayItem::Marker {
                producer_id,
                commit,
                ..
            } => txn_offsets::apply_marker(&mut groups, &mut pending, producer_id, commit, now),
        }) {
            Ok(s) => s,
            Err(e) => {
                warn!(partition, error = %e, "cannot load {GROUP_METADATA_TOPIC_NAME}");
                self.runtime.unload(partition);
                return;
            }
        };
        groups.retain(|_, g| {
            !g.offsets.is_empty()
                || match &g.kind {
                    GroupKind::Classic(c) => c.has_metadata_record,
                    GroupKind::Consumer(_) => true,
                }
        });
        let n_groups = groups.len();
        let n_offsets: usize = groups.values().map(|g| g.offsets.len()).sum();
        let mut timers = Vec::new();
        {
            let mut st = self.state.lock();
            let consumer_session_ms = i64::from(self.config.consumer_session_timeout_ms.max(0));
            let CoordinatorState {
                groups: hosted,
                next_timer_id,
                pending_txn_offsets,
            } = &mut *st;
            hosted.retain(|id, _| self.partition_for(id) != partition);
            pending_txn_offsets.retain(|id, _| self.partition_for(id) != partition);
            pending_txn_offsets.extend(pending);
            for (id, mut g) in groups {
                if let GroupKind::Consumer(c) = &mut g.kind {
                    // Loaded KIP-848 members keep their assignments; each gets a full session
                    // to heartbeat to this coordinator.
                    for m in c.members.values_mut() {
                        *next_timer_id += 1;
                        m.restart_session(*next_timer_id, now + consumer_session_ms);
                        timers.push(Timer::ConsumerSession {
                            group_id: g.group_id.clone(),
                            member_id: m.member_id.clone(),
                            incarnation: *next_timer_id,
                            delay_ms: consumer_session_ms as u64,
                        });
                    }
                }
                if let GroupKind::Classic(c) = &mut g.kind {
                    for m in c.members.values_mut() {
                        *next_timer_id += 1;
                        m.incarnation = *next_timer_id;
                        m.heartbeat_deadline = now + i64::from(m.session_timeout_ms);
                        timers.push(Timer::Session {
                            group_id: g.group_id.clone(),
                            member_id: m.member_id.clone(),
                            incarnation: m.incarnation,
                        });
                    }
                }
                hosted.insert(id, g);
            }
        }
        self.schedule_timers(timers);
        self.runtime.complete_load(partition);
        let elapsed_ms = started.elapsed().as_millis() as u64;
        if summary.records > 0 {
            info!(
                partition,
                groups = n_groups,
                offsets = n_offsets,
                records = summary.records,
                elapsed_ms,
                "loaded groups from {GROUP_METADATA_TOPIC_NAME}"
            );
        } else {
            debug!(
                partition,
                elapsed_ms, "loaded an empty partition of {GROUP_METADATA_TOPIC_NAME}"
            );
        }
    }

    /// Called when this broker stops leading `partition` of `__consumer_offsets`: its groups
    /// are dropped (another broker now coordinates them); members waiting in a JoinGroup or
    /// SyncGroup get NOT_COORDINATOR and look for the new coordinator.
    pub fn on_resigned(&self, partition: i32) {
        if !self.runtime.unload(partition) {
            return;
        }
        let mut st = self.state.lock();
        st.pending_txn_offsets
            .retain(|id, _| self.partition_for(id) != partition);
        let gone: Vec<String> = st
            .groups
            .keys()
            .filter(|id| self.partition_for(id) == partition)
            .cloned()
            .collect();
        for id in &gone {
            if let Some(mut g) = st.groups.remove(id) {
                if let GroupKind::Classic(c) = &mut g.kind {
                    c.fail_waiting_members(ErrorCode::NotCoordinator.code());
                }
            }
        }
        drop(st);
        if !gone.is_empty() {
            info!(
                partition,
                groups = gone.len(),
                "unloaded groups of {GROUP_METADATA_TOPIC_NAME}"
            );
        }
    }

    /// Queues timers in the runtime.
    pub(crate) fn schedule_timers(&self, timers: Vec<Timer>) {
        for t in timers {
            let delay_ms = match &t {
                Timer::Session { .. } => 0,
                Timer::Rebalance { delay_ms, .. }
                | Timer::Sync { delay_ms, .. }
                | Timer::PendingMember { delay_ms, .. }
                | Timer::ConsumerSession { delay_ms, .. } => {
                    i64::try_from(*delay_ms).unwrap_or(i64::MAX)
                }
            };
            self.runtime.schedule(delay_ms, t);
        }
    }

    /// Runs one timer that fell due.
    pub fn fire_timer(&self, timer: Timer) {
        match timer {
            Timer::Session {
                group_id,
                member_id,
                incarnation,
            } => self.on_session_timer(&group_id, &member_id, incarnation),
            Timer::Rebalance { group_id, id, .. } => self.on_rebalance_timer(&group_id, id),
            Timer::Sync {
                group_id,
                generation,
                ..
            } => self.on_sync_timer(&group_id, generation),
            Timer::PendingMember {
                group_id,
                member_id,
                ..
            } => self.on_pending_member_timer(&group_id, &member_id),
            Timer::ConsumerSession {
                group_id,
                member_id,
                incarnation,
                ..
            } => {
                if let Some(deadline) =
                    self.expire_consumer_member(&group_id, &member_id, incarnation)
                {
                    self.runtime.schedule_at(
                        deadline,
                        Timer::ConsumerSession {
                            group_id,
                            member_id,
                            incarnation,
                            delay_ms: 0,
                        },
                    );
                }
            }
        }
    }

    /// Fires every timer due on the runtime's clock; returns how many fired. Production code
    /// uses [`GroupCoordinator::run_timers`]; tests call this after moving a manual clock.
    pub fn fire_expired_timers(&self) -> usize {
        let due = self.runtime.expired_timers(self.now_ms());
        let n = due.len();
        for t in due {
            self.fire_timer(t);
        }
        n
    }

    /// Fires timers as they fall due until `shutdown` changes.
    pub async fn run_timers(&self, shutdown: tokio::sync::watch::Receiver<bool>) {
        self.runtime
            .run_timers(|t| self.fire_timer(t), shutdown)
            .await;
    }

    /// Runs [`GroupCoordinator::expire_offsets`] every `offsets.retention.check.interval.ms`
    /// until `shutdown` changes.
    pub async fn run_offsets_retention(&self, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let period = Duration::from_millis(self.config.offsets_retention_check_interval_ms);
        loop {
            tokio::select! {
                () = tokio::time::sleep(period) => {}
                _ = shutdown.changed() => return,
            }
            self.expire_offsets(self.now_ms());
        }
    }

    /// Deletes expired offsets (KIP-211) and then empty groups without offsets, writing
    /// tombstones. Offsets of a group with members never expire; those of an empty classic
    /// group expire `offsets.retention.minutes` after the group became empty, those of a group
    /// that never used group management (a "simple" group) that long after their commit.
    pub fn expire_offsets(&self, now: i64) {
        let retention = self.config.offsets_retention_ms;
        let mut st = self.state.lock();
        let mut dead = Vec::new();
        let mut expired_total = 0usize;
        for g in st.groups.values_mut() {
            if !g.is_empty() {
                continue;
            }
            // Kafka's `offsetExpirationCondition`: an empty classic group counts from the
            // moment it became empty; a simple group and a KIP-848 group from each commit.
            let base = match &g.kind {
                GroupKind::Classic(c) if c.protocol_type.is_some() => Some(c.state_timestamp_ms),
                GroupKind::Classic(_) | GroupKind::Consumer(_) => None,
            };
            let expired: Vec<(String, i32)> = g
                .offsets
                .iter()
                .filter(|(_, o)| {
                    if o.expire_timestamp_ms >= 0 {
                        return now >= o.expire_timestamp_ms;
                    }
                    let since = base.unwrap_or(o.commit_timestamp_ms);
                    now.saturating_sub(since) >= retention
                })
                .map(|(k, _)| k.clone())
                .collect();
            let partition = self.partition_for(&g.group_id);
            let mut recs: Vec<CoordinatorRecord> = expired
                .iter()
                .map(|(t, p)| (records::offset_commit_key(&g.group_id, t, *p), None))
                .collect();
            let group_dead = expired.len() == g.offsets.len();
            if group_dead {
                recs.push((records::group_metadata_key(&g.group_id), None));
                if let GroupKind::Consumer(c) = &g.kind {
                    recs.extend(consumer::group_tombstones(&g.group_id, c));
                }
            }
            if recs.is_empty() {
                continue;
            }
            if self.append(partition, &recs).is_err() {
                continue;
            }
            expired_total += expired.len();
            for k in &expired {
                g.offsets.remove(k);
            }
            if group_dead {
                dead.push(g.group_id.clone());
            }
        }
        for id in &dead {
            st.groups.remove(id);
        }
        if expired_total > 0 || !dead.is_empty() {
            info!(
                offsets = expired_total,
                groups = dead.len(),
                "expired committed offsets (offsets.retention.minutes)"
            );
        }
    }
}

fn apply_loaded_record(
    groups: &mut HashMap<String, Group>,
    key: &[u8],
    value: Option<&[u8]>,
    now: i64,
) {
    let key = match records::decode_key(key) {
        Ok(k) => k,
        Err(e) => {
            warn!(error = %e, "skipping an undecodable {GROUP_METADATA_TOPIC_NAME} key");
            return;
        }
    };
    match key {
        records::CoordinatorKey::OffsetCommit {
            group,
            topic,
            partition,
        } => match value {
            None => {
                if let Some(g) = groups.get_mut(&group) {
                    g.offsets.remove(&(topic, partition));
                }
            }
            Some(v) => match records::decode_offset_commit_value(v) {
                Ok(v) => {
                    let g = groups
                        .entry(group.clone())
                        .or_insert_with(|| Group::new_classic(&group, now));
                    g.offsets.insert(
                        (topic, partition),
                        CommittedOffset {
                            offset: v.offset,
                            leader_epoch: v.leader_epoch,
                            metadata: v.metadata,
                            commit_timestamp_ms: v.commit_timestamp_ms,
                            expire_timestamp_ms: v.expire_timestamp_ms,
                        },
                    );
                }
                Err(e) => warn!(group, error = %e, "skipping an undecodable offset commit"),
            },
        },
        records::CoordinatorKey::GroupMetadata { group } => match value {
            None => {
                if let Some(g) = groups.get_mut(&group) {
                    if matches!(g.kind, GroupKind::Classic(_)) {
                        g.kind = GroupKind::Classic(ClassicGroup::new(now));
                    }
                }
            }
            Some(v) => match records::decode_group_metadata_value(v) {
                Ok(v) => {
                    let g = groups
                        .entry(group.clone())
                        .or_insert_with(|| Group::new_classic(&group, now));
                    g.kind = GroupKind::Classic(ClassicGroup::from_record(v, now));
                }
                Err(e) => warn!(group, error = %e, "skipping undecodable group metadata"),
            },
        },
        records::CoordinatorKey::ConsumerGroupMetadata { group } => match value {
            None => {
                if let Some(g) = groups.get_mut(&group) {
                    if matches!(g.kind, GroupKind::Consumer(_)) {
                        g.kind = GroupKind::Classic(ClassicGroup::new(now));
                    }
                }
            }
            Some(v) => match records::decode_consumer_group_metadata_value(v) {
                // A group written before gregor persisted target assignments has only its
                // epoch record; its assignment epoch then starts equal to the group epoch.
                Ok(epoch) => {
                    let g = groups
                        .entry(group.clone())
                        .or_insert_with(|| Group::new_classic(&group, now));
                    match &mut g.kind {
                        GroupKind::Consumer(c) => c.group_epoch = epoch,
                        GroupKind::Classic(_) => {
                            let mut c = ConsumerGroup::new(now);
                            c.group_epoch = epoch;
                            c.assignment_epoch = epoch;
                            g.kind = GroupKind::Consumer(c);
                        }
                    }
                }
                Err(e) => warn!(group, error = %e, "skipping undecodable consumer group metadata"),
            },
        },
        records::CoordinatorKey::ConsumerGroupPartitionMetadata { group } => match value {
            None => {
                if let Some(c) = existing_consumer_group(groups, &group) {
                    c.apply_partition_metadata(BTreeMap::new());
                }
            }
            Some(v) => match records::decode_consumer_group_partition_metadata_value(v) {
                Ok(topics) => {
                    consumer_group_for_load(groups, &group, now).apply_partition_metadata(topics)
                }
                Err(e) => {
                    warn!(group, error = %e, "skipping undecodable consumer group partition metadata")
                }
            },
        },
        records::CoordinatorKey::ConsumerGroupMemberMetadata { group, member } => match value {
            None => {
                if let Some(c) = existing_consumer_group(groups, &group) {
                    c.members.remove(&member);
                }
            }
            Some(v) => match records::decode_consumer_group_member_metadata_value(v) {
                Ok(v) => consumer_group_for_load(groups, &group, now)
                    .members
                    .entry(member.clone())
                    .or_insert_with(|| consumer::ConsumerMember::loaded(&member))
                    .apply_metadata(v),
                Err(e) => {
                    warn!(group, member, error = %e, "skipping undecodable consumer group member metadata")
                }
            },
        },
        records::CoordinatorKey::ConsumerGroupTargetAssignmentMetadata { group } => match value {
            // Kafka writes it just before the group epoch's tombstone, which removes the group.
            None => {}
            Some(v) => match records::decode_consumer_group_target_assignment_metadata_value(v) {
                Ok(epoch) => consumer_group_for_load(groups, &group, now).assignment_epoch = epoch,
                Err(e) => {
                    warn!(group, error = %e, "skipping undecodable consumer group assignment epoch")
                }
            },
        },
        records::CoordinatorKey::ConsumerGroupTargetAssignmentMember { group, member } => {
            match value {
                None => {
                    if let Some(c) = existing_consumer_group(groups, &group) {
                        c.target.remove(&member);
                    }
                }
                Some(v) => match records::decode_consumer_group_target_assignment_member_value(v) {
                    Ok(a) => {
                        consumer_group_for_load(groups, &group, now)
                            .target
                            .insert(member, a);
                    }
                    Err(e) => {
                        warn!(group, member, error = %e, "skipping undecodable consumer group target assignment")
                    }
                },
            }
        }
        records::CoordinatorKey::ConsumerGroupCurrentMemberAssignment { group, member } => {
            match value {
                None => {
                    if let Some(c) = existing_consumer_group(groups, &group) {
                        if let Some(m) = c.members.get_mut(&member) {
                            m.apply_current(None);
                        }
                    }
                }
                Some(v) => {
                    match records::decode_consumer_group_current_member_assignment_value(v) {
                        Ok(v) => consumer_group_for_load(groups, &group, now)
                            .members
                            .entry(member.clone())
                            .or_insert_with(|| consumer::ConsumerMember::loaded(&member))
                            .apply_current(Some(v)),
                        Err(e) => {
                            warn!(group, member, error = %e, "skipping undecodable consumer group current assignment")
                        }
                    }
                }
            }
        }
        records::CoordinatorKey::Other(_) => {}
    }
}

/// The KIP-848 group `group` while loading, if it exists.
fn existing_consumer_group<'a>(
    groups: &'a mut HashMap<String, Group>,
    group: &str,
) -> Option<&'a mut ConsumerGroup> {
    match groups.get_mut(group).map(|g| &mut g.kind) {
        Some(GroupKind::Consumer(c)) => Some(c),
        _ => None,
    }
}

/// The KIP-848 group `group` while loading: created (or turned from an offsets-only classic
/// group into a consumer group) by the first of its records, as Kafka's
/// `getOrMaybeCreatePersistedConsumerGroup`.
fn consumer_group_for_load<'a>(
    groups: &'a mut HashMap<String, Group>,
    group: &str,
    now: i64,
) -> &'a mut ConsumerGroup {
    let g = groups
        .entry(group.to_string())
        .or_insert_with(|| Group::new_classic(group, now));
    if !matches!(g.kind, GroupKind::Consumer(_)) {
        g.kind = GroupKind::Consumer(ConsumerGroup::new(now));
    }
    match &mut g.kind {
        GroupKind::Consumer(c) => c,
        // Unreachable: set just above.
        GroupKind::Classic(_) => unreachable!("the group was just made a consumer group"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn java_hash_code_matches_java() {
        // Values computed by java.lang.String.hashCode.
        assert_eq!(java_string_hash_code(""), 0);
        assert_eq!(java_string_hash_code("a"), 97);
        assert_eq!(java_string_hash_code("hello"), 99_162_322);
        assert_eq!(java_string_hash_code("my-group"), -1_906_497_762);
        // A supplementary character is two UTF-16 code units.
        assert_eq!(java_string_hash_code("😀"), 0xD83D * 31 + 0xDE00);
        // "polygenelubricants".hashCode() == Integer.MIN_VALUE
        assert_eq!(java_string_hash_code("polygenelubricants"), i32::MIN);
        let c = crate::tests::coordinator(GroupConfig::default()).coordinator;
        assert_eq!(c.partition_for("polygenelubricants"), 0);
        assert_eq!(c.partition_for("hello"), 99_162_322 % 50);
    }

    #[test]
    fn config_defaults_are_kafkas() {
        let c = GroupConfig::default();
        assert_eq!(c.initial_rebalance_delay_ms, 3000);
        assert_eq!(c.offsets_topic_num_partitions, 50);
        assert_eq!(c.offsets_retention_ms, 10080 * 60_000);
        assert_eq!(c.min_session_timeout_ms, 6000);
        assert_eq!(c.max_session_timeout_ms, 1_800_000);
        assert_eq!(c.consumer_assignors, vec!["uniform", "range"]);
        assert_eq!(c.offsets_commit_timeout_ms, 5000);
        let mut props = BTreeMap::new();
        props.insert("offsets.commit.timeout.ms".to_string(), "0".to_string());
        assert!(GroupConfig::from_properties(&props).is_err());
    }
}
