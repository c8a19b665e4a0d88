//! The group coordinator: consumer groups and committed offsets, stored in the compacted
//! internal topic `__consumer_offsets`.
//!
//! Kafka's design, in Kafka's terms (`GroupCoordinator`, `GroupMetadataManager`, KIP-848 for the
//! new protocol): the coordinator of a group is the leader of partition
//! `abs(groupId.hashCode) % offsets.topic.num.partitions` of `__consumer_offsets`; group
//! metadata and offset commits are written there as records in Kafka's own schemas
//! ([`records`]), and on start-up every group and committed offset is rebuilt by reading those
//! partitions back ([`GroupCoordinator::load`]).
//!
//! Two group types share one namespace:
//! - classic groups (JoinGroup / SyncGroup / Heartbeat / LeaveGroup, [`classic`]): the
//!   coordinator relays protocol metadata and assignments, the leader's client assigns;
//! - consumer groups (KIP-848 ConsumerGroupHeartbeat, [`consumer`]): the coordinator assigns
//!   with a server-side assignor ([`assignor`]: `uniform`, `range`).
//!
//! All group state lives behind one mutex that is never held across an await. Waits (a JoinGroup
//! until the rebalance completes, a SyncGroup until the leader's assignment) are oneshot
//! channels completed by membership events; timers (session timeouts, rebalance timeouts,
//! `group.initial.rebalance.delay.ms`, offset expiry) are tokio sleeps until a deadline.

pub mod assignor;
#[cfg(test)]
mod broker_tests;
pub mod classic;
pub mod consumer;
pub mod offsets;
pub mod records;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, OnceLock, Weak};

use gregor_metadata::controller::NewTopic;
use gregor_protocol::batch::{BatchBuilder, Batches};
use parking_lot::Mutex;
use tokio::sync::oneshot;
use tracing::{info, warn};

use crate::config::ConfigError;
use crate::error_codes as ec;
use crate::replica_manager::now_ms;
use crate::server::Broker;

pub use classic::{ClassicGroup, ClassicGroupState};
pub use consumer::ConsumerGroup;

/// The internal topic holding group metadata and committed offsets.
pub const GROUP_METADATA_TOPIC_NAME: &str = "__consumer_offsets";

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
    }
}

impl GroupConfig {
    /// Reads the group settings from broker properties.
    ///
    /// # Errors
    /// [`ConfigError`] for a value out of Kafka's range.
    pub fn from_properties(props: &BTreeMap<String, String>) -> Result<Self, ConfigError> {
        let d = unreachable_defaults();
        let num = |k: &str, default: i64, min: i64| -> Result<i64, ConfigError> {
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
        })
    }
}

fn config_error(name: &str, value: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError {
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
    fn new_classic(group_id: &str) -> Self {
        Self {
            group_id: group_id.to_string(),
            offsets: BTreeMap::new(),
            kind: GroupKind::Classic(ClassicGroup::new()),
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

/// A response now, or one that a membership event will complete.
pub enum Wait<T> {
    /// Answered now.
    Ready(T),
    /// Answered when the rebalance (join) or the leader's assignment (sync) completes.
    Pending(oneshot::Receiver<T>),
}

/// One record to append: key and value (None is a tombstone).
pub(crate) type CoordinatorRecord = (Vec<u8>, Option<Vec<u8>>);

/// All groups hosted by this broker.
pub(crate) struct CoordinatorState {
    pub(crate) groups: HashMap<String, Group>,
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
    broker: OnceLock<Weak<Broker>>,
}

impl GroupCoordinator {
    /// A coordinator with no groups; [`GroupCoordinator::load`] fills it.
    pub fn new(config: GroupConfig) -> Self {
        Self {
            config,
            state: Mutex::new(CoordinatorState {
                groups: HashMap::new(),
                next_timer_id: 0,
            }),
            broker: OnceLock::new(),
        }
    }

    /// The partition of `__consumer_offsets` that holds `group_id`:
    /// `Utils.abs(groupId.hashCode) % offsets.topic.num.partitions`.
    pub fn partition_for(&self, group_id: &str) -> i32 {
        kafka_abs(java_string_hash_code(group_id)) % self.config.offsets_topic_num_partitions
    }

    /// Creates `__consumer_offsets` if it does not exist (Kafka creates it on the first
    /// FindCoordinator for a group): `offsets.topic.num.partitions` partitions,
    /// `cleanup.policy=compact`, `offsets.topic.segment.bytes`.
    ///
    /// # Errors
    /// The Kafka error code to return to the client (COORDINATOR_NOT_AVAILABLE).
    pub async fn ensure_offsets_topic(&self, broker: &Broker) -> Result<(), i16> {
        let image = broker.controller.image();
        if image.topic(GROUP_METADATA_TOPIC_NAME).is_some() {
            return Ok(());
        }
        let brokers = image.brokers.len().max(1);
        let rf = self
            .config
            .offsets_topic_replication_factor
            .min(i16::try_from(brokers).unwrap_or(i16::MAX));
        let mut configs = BTreeMap::new();
        configs.insert("cleanup.policy".to_string(), "compact".to_string());
        configs.insert("compression.type".to_string(), "producer".to_string());
        configs.insert(
            "segment.bytes".to_string(),
            self.config.offsets_topic_segment_bytes.to_string(),
        );
        let t = NewTopic {
            name: GROUP_METADATA_TOPIC_NAME.to_string(),
            num_partitions: self.config.offsets_topic_num_partitions,
            replication_factor: rf,
            assignments: vec![],
            configs,
        };
        let created = broker
            .controller
            .create_topics(vec![t], false)
            .await
            .and_then(|r| {
                r.into_iter().next().unwrap_or(Err(
                    gregor_metadata::ControllerError::UnknownTopicOrPartition,
                ))
            });
        match created {
            Ok(_) => {
                info!(
                    partitions = self.config.offsets_topic_num_partitions,
                    "created {GROUP_METADATA_TOPIC_NAME}"
                );
            }
            Err(e) if e.kafka_error_code() == ec::TOPIC_ALREADY_EXISTS => {}
            Err(e) => {
                warn!(error = %e, "cannot create {GROUP_METADATA_TOPIC_NAME}");
                return Err(ec::COORDINATOR_NOT_AVAILABLE);
            }
        }
        Ok(())
    }

    /// Checks that this broker coordinates `group_id`: it leads the group's partition of
    /// `__consumer_offsets`. Returns that partition.
    ///
    /// # Errors
    /// NOT_COORDINATOR when it does not (or the topic does not exist yet).
    pub fn check_coordinator(&self, broker: &Broker, group_id: &str) -> Result<i32, i16> {
        let p = self.partition_for(group_id);
        match broker
            .replica_manager
            .partition(GROUP_METADATA_TOPIC_NAME, p)
        {
            Some(part) if part.is_leader() => Ok(p),
            _ => Err(ec::NOT_COORDINATOR),
        }
    }

    /// Appends records to partition `p` of `__consumer_offsets` (acks=all, as Kafka writes
    /// coordinator records).
    ///
    /// # Errors
    /// The error code to return, mapped as Kafka's coordinator maps append errors:
    /// NOT_COORDINATOR when not the leader, COORDINATOR_NOT_AVAILABLE when the partition is
    /// missing or under-replicated, INVALID_COMMIT_OFFSET_SIZE for too-large batches,
    /// UNKNOWN_SERVER_ERROR otherwise.
    pub(crate) fn append(
        &self,
        broker: &Broker,
        partition: i32,
        records: &[CoordinatorRecord],
    ) -> Result<(), i16> {
        if records.is_empty() {
            return Ok(());
        }
        let Some(p) = broker
            .replica_manager
            .partition(GROUP_METADATA_TOPIC_NAME, partition)
        else {
            return Err(ec::NOT_COORDINATOR);
        };
        let now = now_ms();
        let mut b = BatchBuilder::new(0, now);
        for (k, v) in records {
            b = b.record(now, Some(k), v.as_deref(), &[]);
        }
        let mut buf = b.build();
        match p.append_records_as_leader(&mut buf, -1) {
            Ok(_) => Ok(()),
            Err((code, msg)) => {
                warn!(partition, code, %msg, "appending to {GROUP_METADATA_TOPIC_NAME} failed");
                Err(match code {
                    ec::NOT_LEADER_OR_FOLLOWER | ec::KAFKA_STORAGE_ERROR => ec::NOT_COORDINATOR,
                    ec::UNKNOWN_TOPIC_OR_PARTITION
                    | ec::NOT_ENOUGH_REPLICAS
                    | ec::REQUEST_TIMED_OUT => ec::COORDINATOR_NOT_AVAILABLE,
                    ec::MESSAGE_TOO_LARGE | ec::RECORD_LIST_TOO_LARGE => {
                        ec::INVALID_COMMIT_OFFSET_SIZE
                    }
                    _ => ec::UNKNOWN_SERVER_ERROR,
                })
            }
        }
    }

    /// Rebuilds every group and committed offset from the partitions of `__consumer_offsets`
    /// this broker leads, then starts the session timers of loaded members and the offset
    /// expiration task. Called once at start-up, before listeners accept clients.
    pub fn load(&self, broker: &Arc<Broker>) {
        let _ = self.broker.set(Arc::downgrade(broker));
        let started = std::time::Instant::now();
        let mut loaded_records = 0u64;
        let mut groups: HashMap<String, Group> = HashMap::new();
        for part in broker.replica_manager.partitions() {
            if part.topic != GROUP_METADATA_TOPIC_NAME || !part.is_leader() {
                continue;
            }
            let mut offset = part.log.log_start_offset();
            let hw = part.high_watermark();
            while offset < hw {
                let read = match part.read(offset, 1 << 20, 0, true) {
                    Ok(r) => r,
                    Err(e) => {
                        warn!(partition = part.index, offset, error = %e, "cannot read {GROUP_METADATA_TOPIC_NAME}; the rest of this partition is skipped");
                        break;
                    }
                };
                if read.records.is_empty() {
                    break;
                }
                let mut next = offset;
                for item in Batches::new(&read.records) {
                    let Ok((at, h)) = item else { break };
                    next = h.next_offset();
                    if h.is_control() {
                        continue;
                    }
                    let batch = &read.records[at..at + h.total_size()];
                    let recs = match gregor_protocol::records::decode_records(batch) {
                        Ok(r) => r,
                        Err(e) => {
                            warn!(partition = part.index, offset = h.base_offset, error = %e, "skipping an undecodable batch");
                            continue;
                        }
                    };
                    for r in recs {
                        let Some(key) = r.key else { continue };
                        loaded_records += 1;
                        apply_loaded_record(&mut groups, &key, r.value.as_deref());
                    }
                }
                if next <= offset {
                    break;
                }
                offset = next;
            }
        }
        groups.retain(|_, g| {
            !g.offsets.is_empty()
                || match &g.kind {
                    GroupKind::Classic(c) => c.has_metadata_record,
                    GroupKind::Consumer(_) => true,
                }
        });
        let n_groups = groups.len();
        let n_offsets: usize = groups.values().map(|g| g.offsets.len()).sum();
        {
            let mut st = self.state.lock();
            st.groups = groups;
            let mut timers = Vec::new();
            let mut consumer_timers = Vec::new();
            let now = tokio::time::Instant::now();
            let consumer_session = std::time::Duration::from_millis(
                self.config.consumer_session_timeout_ms.max(0) as u64,
            );
            let CoordinatorState {
                groups,
                next_timer_id,
            } = &mut *st;
            for g in groups.values_mut() {
                if let GroupKind::Consumer(c) = &mut g.kind {
                    // Loaded KIP-848 members keep their assignments; each gets a full session
                    // to heartbeat to this coordinator.
                    for m in c.members.values_mut() {
                        *next_timer_id += 1;
                        m.restart_session(*next_timer_id, now + consumer_session);
                        consumer_timers.push((
                            g.group_id.clone(),
                            m.member_id.clone(),
                            *next_timer_id,
                        ));
                    }
                }
                if let GroupKind::Classic(c) = &mut g.kind {
                    for m in c.members.values_mut() {
                        *next_timer_id += 1;
                        m.incarnation = *next_timer_id;
                        m.heartbeat_deadline =
                            now + std::time::Duration::from_millis(m.session_timeout_ms as u64);
                        timers.push((g.group_id.clone(), m.member_id.clone(), m.incarnation));
                    }
                }
            }
            drop(st);
            for (g, m, inc) in timers {
                classic::spawn_session_timer(broker, g, m, inc);
            }
            for (g, m, inc) in consumer_timers {
                consumer::spawn_consumer_session_timer(broker, g, m, inc);
            }
        }
        info!(
            groups = n_groups,
            offsets = n_offsets,
            records = loaded_records,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "loaded groups from {GROUP_METADATA_TOPIC_NAME}"
        );
    }

    /// Deletes expired offsets (KIP-211) and then empty groups without offsets, writing
    /// tombstones. Offsets of a group with members never expire; those of an empty classic
    /// group expire `offsets.retention.minutes` after the group became empty, those of a group
    /// that never used group management (a "simple" group) that long after their commit.
    pub fn expire_offsets(&self, broker: &Broker, now: i64) {
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
            if self.append(broker, partition, &recs).is_err() {
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

fn apply_loaded_record(groups: &mut HashMap<String, Group>, key: &[u8], value: Option<&[u8]>) {
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
                        .or_insert_with(|| Group::new_classic(&group));
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
                        g.kind = GroupKind::Classic(ClassicGroup::new());
                    }
                }
            }
            Some(v) => match records::decode_group_metadata_value(v) {
                Ok(v) => {
                    let g = groups
                        .entry(group.clone())
                        .or_insert_with(|| Group::new_classic(&group));
                    g.kind = GroupKind::Classic(ClassicGroup::from_record(v));
                }
                Err(e) => warn!(group, error = %e, "skipping undecodable group metadata"),
            },
        },
        records::CoordinatorKey::ConsumerGroupMetadata { group } => match value {
            None => {
                if let Some(g) = groups.get_mut(&group) {
                    if matches!(g.kind, GroupKind::Consumer(_)) {
                        g.kind = GroupKind::Classic(ClassicGroup::new());
                    }
                }
            }
            Some(v) => match records::decode_consumer_group_metadata_value(v) {
                // A group written before gregor persisted target assignments has only its
                // epoch record; its assignment epoch then starts equal to the group epoch.
                Ok(epoch) => {
                    let g = groups
                        .entry(group.clone())
                        .or_insert_with(|| Group::new_classic(&group));
                    match &mut g.kind {
                        GroupKind::Consumer(c) => c.group_epoch = epoch,
                        GroupKind::Classic(_) => {
                            let mut c = ConsumerGroup::new(now_ms());
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
                    consumer_group_for_load(groups, &group).apply_partition_metadata(topics)
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
                Ok(v) => consumer_group_for_load(groups, &group)
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
                Ok(epoch) => consumer_group_for_load(groups, &group).assignment_epoch = epoch,
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
                        consumer_group_for_load(groups, &group)
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
                        Ok(v) => consumer_group_for_load(groups, &group)
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
) -> &'a mut ConsumerGroup {
    let g = groups
        .entry(group.to_string())
        .or_insert_with(|| Group::new_classic(group));
    if !matches!(g.kind, GroupKind::Consumer(_)) {
        g.kind = GroupKind::Consumer(ConsumerGroup::new(now_ms()));
    }
    match &mut g.kind {
        GroupKind::Consumer(c) => c,
        // Unreachable: set just above.
        GroupKind::Classic(_) => unreachable!("the group was just made a consumer group"),
    }
}

/// Runs [`GroupCoordinator::expire_offsets`] every `offsets.retention.check.interval.ms` until
/// shutdown.
pub async fn offsets_retention_task(
    broker: Arc<Broker>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let period = std::time::Duration::from_millis(
        broker
            .group_coordinator
            .config
            .offsets_retention_check_interval_ms,
    );
    loop {
        tokio::select! {
            () = tokio::time::sleep(period) => {}
            _ = shutdown.changed() => return,
        }
        broker.group_coordinator.expire_offsets(&broker, now_ms());
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
        let c = GroupCoordinator::new(GroupConfig::default());
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
    }
}
