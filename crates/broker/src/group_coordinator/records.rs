//! The records the group coordinator writes to `__consumer_offsets`, in Kafka's own key/value
//! schemas (`group-coordinator/src/main/resources/common/message/*.json` in Apache Kafka), so
//! that Kafka's tools (`kafka-dump-log --offsets-decoder`, `kafka-console-consumer` with the
//! group metadata formatter) can read the topic.
//!
//! A key starts with an int16 that is the record type (Kafka's `CoordinatorRecordType`): 0 and 1
//! are `OffsetCommitKey` (Kafka 4 writes 1), 2 is `GroupMetadataKey`, and the KIP-848 consumer
//! group records are 3 `ConsumerGroupMetadataKey` (group epoch), 4
//! `ConsumerGroupPartitionMetadataKey` (subscribed topics), 5 `ConsumerGroupMemberMetadataKey`,
//! 6 `ConsumerGroupTargetAssignmentMetadataKey` (assignment epoch), 7
//! `ConsumerGroupTargetAssignmentMemberKey` and 8 `ConsumerGroupCurrentMemberAssignmentKey`.
//! Keys are never flexible. Values start with their schema version: Kafka 4 writes
//! `OffsetCommitValue` v3 (v1 only with an explicit expire timestamp), `GroupMetadataValue` v3,
//! and v0 of every consumer group value (flexible: compact strings and arrays, tagged fields).
//! A null value is a tombstone.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use thiserror::Error;
use uuid::Uuid;

use super::assignor::Assignment;

/// Record type of an offset commit written by Kafka 4 (`CoordinatorRecordType.OFFSET_COMMIT`).
pub const OFFSET_COMMIT_KEY_VERSION: i16 = 1;
/// Record type of a classic group's metadata (`CoordinatorRecordType.GROUP_METADATA`).
pub const GROUP_METADATA_KEY_VERSION: i16 = 2;
/// Record type of a KIP-848 consumer group's epoch (`CONSUMER_GROUP_METADATA`).
pub const CONSUMER_GROUP_METADATA_KEY_VERSION: i16 = 3;
/// Record type of a KIP-848 group's subscribed topic metadata (`CONSUMER_GROUP_PARTITION_METADATA`).
pub const CONSUMER_GROUP_PARTITION_METADATA_KEY_VERSION: i16 = 4;
/// Record type of a KIP-848 member's subscription (`CONSUMER_GROUP_MEMBER_METADATA`).
pub const CONSUMER_GROUP_MEMBER_METADATA_KEY_VERSION: i16 = 5;
/// Record type of a KIP-848 group's assignment epoch (`CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA`).
pub const CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA_KEY_VERSION: i16 = 6;
/// Record type of a KIP-848 member's target assignment (`CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER`).
pub const CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER_KEY_VERSION: i16 = 7;
/// Record type of a KIP-848 member's current assignment (`CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT`).
pub const CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT_KEY_VERSION: i16 = 8;
/// `OffsetCommitValue` version Kafka 4 writes (no expire timestamp).
pub const OFFSET_COMMIT_VALUE_VERSION: i16 = 3;
/// `GroupMetadataValue` version Kafka 4 writes (`GROUP_METADATA_VALUE_VERSION`).
pub const GROUP_METADATA_VALUE_VERSION: i16 = 3;

/// A record that could not be decoded.
#[derive(Debug, Error)]
pub enum RecordError {
    /// Fewer bytes than a field needs.
    #[error("truncated {0}")]
    Truncated(&'static str),
    /// A length or version out of range.
    #[error("invalid {0}")]
    Invalid(&'static str),
}

/// A decoded key of `__consumer_offsets`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CoordinatorKey {
    /// `OffsetCommitKey`: group, topic, partition.
    OffsetCommit {
        /// Group id.
        group: String,
        /// Topic name.
        topic: String,
        /// Partition index.
        partition: i32,
    },
    /// `GroupMetadataKey`.
    GroupMetadata {
        /// Group id.
        group: String,
    },
    /// `ConsumerGroupMetadataKey` (KIP-848).
    ConsumerGroupMetadata {
        /// Group id.
        group: String,
    },
    /// `ConsumerGroupPartitionMetadataKey` (KIP-848).
    ConsumerGroupPartitionMetadata {
        /// Group id.
        group: String,
    },
    /// `ConsumerGroupMemberMetadataKey` (KIP-848).
    ConsumerGroupMemberMetadata {
        /// Group id.
        group: String,
        /// Member id.
        member: String,
    },
    /// `ConsumerGroupTargetAssignmentMetadataKey` (KIP-848).
    ConsumerGroupTargetAssignmentMetadata {
        /// Group id.
        group: String,
    },
    /// `ConsumerGroupTargetAssignmentMemberKey` (KIP-848).
    ConsumerGroupTargetAssignmentMember {
        /// Group id.
        group: String,
        /// Member id.
        member: String,
    },
    /// `ConsumerGroupCurrentMemberAssignmentKey` (KIP-848).
    ConsumerGroupCurrentMemberAssignment {
        /// Group id.
        group: String,
        /// Member id.
        member: String,
    },
    /// Another record type (share groups, streams groups); skipped.
    Other(i16),
}

/// `ConsumerGroupMemberMetadataValue` v0 (the tagged `ClassicMemberMetadata` is not written: gregor's
/// KIP-848 members all use the consumer protocol).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConsumerMemberMetadataValue {
    /// Static instance id.
    pub instance_id: Option<String>,
    /// Rack id.
    pub rack_id: Option<String>,
    /// Client id.
    pub client_id: String,
    /// Client host.
    pub client_host: String,
    /// Subscribed topic names.
    pub subscribed_topic_names: Vec<String>,
    /// Subscribed regex.
    pub subscribed_topic_regex: Option<String>,
    /// Rebalance timeout.
    pub rebalance_timeout_ms: i32,
    /// Preferred server assignor.
    pub server_assignor: Option<String>,
}

/// `ConsumerGroupCurrentMemberAssignmentValue` v0.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CurrentMemberAssignmentValue {
    /// Member epoch.
    pub member_epoch: i32,
    /// Previous member epoch.
    pub previous_member_epoch: i32,
    /// Kafka's `MemberState`: 0 STABLE, 1 UNREVOKED_PARTITIONS, 2 UNRELEASED_PARTITIONS.
    pub state: i8,
    /// Partitions the member owns.
    pub assigned: Assignment,
    /// Partitions the member must revoke.
    pub pending_revocation: Assignment,
}

/// `MemberState.STABLE`.
pub const MEMBER_STATE_STABLE: i8 = 0;
/// `MemberState.UNREVOKED_PARTITIONS`.
pub const MEMBER_STATE_UNREVOKED_PARTITIONS: i8 = 1;
/// `MemberState.UNRELEASED_PARTITIONS`.
pub const MEMBER_STATE_UNRELEASED_PARTITIONS: i8 = 2;

/// `OffsetCommitValue`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetCommitValue {
    /// Committed offset.
    pub offset: i64,
    /// Leader epoch of the committed offset, -1 if unknown (v3+).
    pub leader_epoch: i32,
    /// Client metadata.
    pub metadata: String,
    /// When the commit happened (ms).
    pub commit_timestamp_ms: i64,
    /// Explicit expiry (v1 only), else -1.
    pub expire_timestamp_ms: i64,
}

/// `GroupMetadataValue.MemberMetadata`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberMetadataValue {
    /// Member id.
    pub member_id: String,
    /// Static instance id (v3+).
    pub group_instance_id: Option<String>,
    /// Client id.
    pub client_id: String,
    /// Client host.
    pub client_host: String,
    /// Rebalance timeout (v1+).
    pub rebalance_timeout_ms: i32,
    /// Session timeout.
    pub session_timeout_ms: i32,
    /// The member's metadata for the selected protocol.
    pub subscription: Bytes,
    /// The member's assignment.
    pub assignment: Bytes,
}

/// `GroupMetadataValue`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupMetadataValue {
    /// Protocol type ("consumer", "connect", "" for a group without members ever).
    pub protocol_type: String,
    /// Generation id.
    pub generation: i32,
    /// Selected protocol (assignor) name.
    pub protocol: Option<String>,
    /// Leader member id.
    pub leader: Option<String>,
    /// When the group entered its current state (v2+), -1 if unknown.
    pub current_state_timestamp_ms: i64,
    /// Members.
    pub members: Vec<MemberMetadataValue>,
}

struct Writer(Vec<u8>);

impl Writer {
    fn i16(&mut self, v: i16) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn i32(&mut self, v: i32) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn i64(&mut self, v: i64) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn str(&mut self, s: &str) {
        let b = s.as_bytes();
        let len = b.len().min(i16::MAX as usize);
        self.i16(len as i16);
        self.0.extend_from_slice(&b[..len]);
    }
    fn nstr(&mut self, s: Option<&str>) {
        match s {
            Some(s) => self.str(s),
            None => self.i16(-1),
        }
    }
    fn bytes(&mut self, b: &[u8]) {
        self.i32(b.len() as i32);
        self.0.extend_from_slice(b);
    }
    fn uvarint(&mut self, mut v: u32) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }
    fn compact_len(&mut self, n: usize) {
        self.uvarint(u32::try_from(n).unwrap_or(u32::MAX - 1) + 1);
    }
    fn compact_str(&mut self, s: &str) {
        self.compact_len(s.len());
        self.0.extend_from_slice(s.as_bytes());
    }
    fn compact_nstr(&mut self, s: Option<&str>) {
        match s {
            Some(s) => self.compact_str(s),
            None => self.uvarint(0),
        }
    }
    fn no_tags(&mut self) {
        self.0.push(0);
    }
    /// A compact array of `{TopicId uuid, Partitions []int32}` structs.
    fn topic_partitions(&mut self, a: &Assignment) {
        self.compact_len(a.len());
        for (id, ps) in a {
            self.0.extend_from_slice(id.as_bytes());
            self.compact_len(ps.len());
            for p in ps {
                self.i32(*p);
            }
            self.no_tags();
        }
    }
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&[u8], RecordError> {
        if self.0.len() < n {
            return Err(RecordError::Truncated(what));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn i16(&mut self, what: &'static str) -> Result<i16, RecordError> {
        let b = self.take(2, what)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }
    fn i32(&mut self, what: &'static str) -> Result<i32, RecordError> {
        let b = self.take(4, what)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn i64(&mut self, what: &'static str) -> Result<i64, RecordError> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(i64::from_be_bytes(a))
    }
    fn nstr(&mut self, what: &'static str) -> Result<Option<String>, RecordError> {
        let len = self.i16(what)?;
        if len < 0 {
            return Ok(None);
        }
        let b = self.take(len as usize, what)?;
        Ok(Some(String::from_utf8_lossy(b).into_owned()))
    }
    fn str(&mut self, what: &'static str) -> Result<String, RecordError> {
        self.nstr(what)?.ok_or(RecordError::Invalid(what))
    }
    fn bytes(&mut self, what: &'static str) -> Result<Bytes, RecordError> {
        let len = self.i32(what)?;
        if len < 0 {
            return Ok(Bytes::new());
        }
        Ok(Bytes::copy_from_slice(self.take(len as usize, what)?))
    }
    fn i8(&mut self, what: &'static str) -> Result<i8, RecordError> {
        Ok(self.take(1, what)?[0] as i8)
    }
    fn uvarint(&mut self, what: &'static str) -> Result<u32, RecordError> {
        let mut v: u32 = 0;
        for i in 0..5 {
            let b = self.take(1, what)?[0];
            v |= u32::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(RecordError::Invalid(what))
    }
    /// A compact length: None for null (0), else the length, at most the bytes left times
    /// `min_size` apart (a corrupt length is an error, not a huge allocation).
    fn compact_len(
        &mut self,
        what: &'static str,
        min_size: usize,
    ) -> Result<Option<usize>, RecordError> {
        let n = self.uvarint(what)? as usize;
        if n == 0 {
            return Ok(None);
        }
        let n = n - 1;
        if n.saturating_mul(min_size) > self.0.len() {
            return Err(RecordError::Invalid(what));
        }
        Ok(Some(n))
    }
    fn compact_nstr(&mut self, what: &'static str) -> Result<Option<String>, RecordError> {
        match self.compact_len(what, 1)? {
            None => Ok(None),
            Some(n) => Ok(Some(
                String::from_utf8_lossy(self.take(n, what)?).into_owned(),
            )),
        }
    }
    fn compact_str(&mut self, what: &'static str) -> Result<String, RecordError> {
        self.compact_nstr(what)?.ok_or(RecordError::Invalid(what))
    }
    fn uuid(&mut self, what: &'static str) -> Result<Uuid, RecordError> {
        let b = self.take(16, what)?;
        let mut a = [0u8; 16];
        a.copy_from_slice(b);
        Ok(Uuid::from_bytes(a))
    }
    /// Skips a tagged-field section (fields gregor does not use).
    fn skip_tags(&mut self) -> Result<(), RecordError> {
        let n = self.uvarint("tagged fields")?;
        for _ in 0..n {
            let _tag = self.uvarint("tag")?;
            let size = self.uvarint("tag size")? as usize;
            self.take(size, "tagged field")?;
        }
        Ok(())
    }
    fn topic_partitions(&mut self, what: &'static str) -> Result<Assignment, RecordError> {
        let n = self.compact_len(what, 18)?.unwrap_or(0);
        let mut out = Assignment::new();
        for _ in 0..n {
            let id = self.uuid("topicId")?;
            let m = self.compact_len("partitions", 4)?.unwrap_or(0);
            let mut ps = BTreeSet::new();
            for _ in 0..m {
                ps.insert(self.i32("partition")?);
            }
            self.skip_tags()?;
            if !ps.is_empty() {
                out.entry(id).or_default().extend(ps);
            }
        }
        Ok(out)
    }
    /// Reads a flexible value's version and checks it is 0.
    fn version0(&mut self, what: &'static str) -> Result<(), RecordError> {
        if self.i16(what)? != 0 {
            return Err(RecordError::Invalid(what));
        }
        Ok(())
    }
}

/// `OffsetCommitKey` bytes (record type 1).
pub fn offset_commit_key(group: &str, topic: &str, partition: i32) -> Vec<u8> {
    let mut w = Writer(Vec::with_capacity(8 + group.len() + topic.len()));
    w.i16(OFFSET_COMMIT_KEY_VERSION);
    w.str(group);
    w.str(topic);
    w.i32(partition);
    w.0
}

/// `GroupMetadataKey` bytes (record type 2).
pub fn group_metadata_key(group: &str) -> Vec<u8> {
    let mut w = Writer(Vec::with_capacity(4 + group.len()));
    w.i16(GROUP_METADATA_KEY_VERSION);
    w.str(group);
    w.0
}

/// `ConsumerGroupMetadataKey` bytes (record type 3, KIP-848).
pub fn consumer_group_metadata_key(group: &str) -> Vec<u8> {
    let mut w = Writer(Vec::with_capacity(4 + group.len()));
    w.i16(CONSUMER_GROUP_METADATA_KEY_VERSION);
    w.str(group);
    w.0
}

fn group_member_key(record_type: i16, group: &str, member: &str) -> Vec<u8> {
    let mut w = Writer(Vec::with_capacity(6 + group.len() + member.len()));
    w.i16(record_type);
    w.str(group);
    w.str(member);
    w.0
}

fn group_key(record_type: i16, group: &str) -> Vec<u8> {
    let mut w = Writer(Vec::with_capacity(4 + group.len()));
    w.i16(record_type);
    w.str(group);
    w.0
}

/// `ConsumerGroupPartitionMetadataKey` bytes (record type 4).
pub fn consumer_group_partition_metadata_key(group: &str) -> Vec<u8> {
    group_key(CONSUMER_GROUP_PARTITION_METADATA_KEY_VERSION, group)
}

/// `ConsumerGroupMemberMetadataKey` bytes (record type 5).
pub fn consumer_group_member_metadata_key(group: &str, member: &str) -> Vec<u8> {
    group_member_key(CONSUMER_GROUP_MEMBER_METADATA_KEY_VERSION, group, member)
}

/// `ConsumerGroupTargetAssignmentMetadataKey` bytes (record type 6).
pub fn consumer_group_target_assignment_metadata_key(group: &str) -> Vec<u8> {
    group_key(CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA_KEY_VERSION, group)
}

/// `ConsumerGroupTargetAssignmentMemberKey` bytes (record type 7).
pub fn consumer_group_target_assignment_member_key(group: &str, member: &str) -> Vec<u8> {
    group_member_key(
        CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER_KEY_VERSION,
        group,
        member,
    )
}

/// `ConsumerGroupCurrentMemberAssignmentKey` bytes (record type 8).
pub fn consumer_group_current_member_assignment_key(group: &str, member: &str) -> Vec<u8> {
    group_member_key(
        CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT_KEY_VERSION,
        group,
        member,
    )
}

/// `ConsumerGroupPartitionMetadataValue` v0 bytes: per subscribed topic its id, name and
/// partition count (the deprecated per-partition racks are written empty, as Kafka 4 does).
pub fn consumer_group_partition_metadata_value(topics: &BTreeMap<String, (Uuid, i32)>) -> Vec<u8> {
    let mut w = Writer(Vec::with_capacity(8 + topics.len() * 32));
    w.i16(0);
    w.compact_len(topics.len());
    for (name, (id, n)) in topics {
        w.0.extend_from_slice(id.as_bytes());
        w.compact_str(name);
        w.i32(*n);
        w.compact_len(0);
        w.no_tags();
    }
    w.no_tags();
    w.0
}

/// Decodes a `ConsumerGroupPartitionMetadataValue`: topic name -> (id, partitions).
///
/// # Errors
/// [`RecordError`] for a truncated value or an unknown version.
pub fn decode_consumer_group_partition_metadata_value(
    value: &[u8],
) -> Result<BTreeMap<String, (Uuid, i32)>, RecordError> {
    let mut r = Reader(value);
    r.version0("ConsumerGroupPartitionMetadataValue version")?;
    let n = r.compact_len("topics", 22)?.unwrap_or(0);
    let mut out = BTreeMap::new();
    for _ in 0..n {
        let id = r.uuid("topicId")?;
        let name = r.compact_str("topicName")?;
        let partitions = r.i32("numPartitions")?;
        let m = r.compact_len("partitionMetadata", 6)?.unwrap_or(0);
        for _ in 0..m {
            r.i32("partition")?;
            let racks = r.compact_len("racks", 1)?.unwrap_or(0);
            for _ in 0..racks {
                r.compact_str("rack")?;
            }
            r.skip_tags()?;
        }
        r.skip_tags()?;
        out.insert(name, (id, partitions));
    }
    Ok(out)
}

/// `ConsumerGroupMemberMetadataValue` v0 bytes.
pub fn consumer_group_member_metadata_value(v: &ConsumerMemberMetadataValue) -> Vec<u8> {
    let mut w = Writer(Vec::with_capacity(64));
    w.i16(0);
    w.compact_nstr(v.instance_id.as_deref());
    w.compact_nstr(v.rack_id.as_deref());
    w.compact_str(&v.client_id);
    w.compact_str(&v.client_host);
    w.compact_len(v.subscribed_topic_names.len());
    for t in &v.subscribed_topic_names {
        w.compact_str(t);
    }
    w.compact_nstr(v.subscribed_topic_regex.as_deref());
    w.i32(v.rebalance_timeout_ms);
    w.compact_nstr(v.server_assignor.as_deref());
    w.no_tags();
    w.0
}

/// Decodes a `ConsumerGroupMemberMetadataValue` (its tagged classic member metadata is skipped).
///
/// # Errors
/// [`RecordError`] for a truncated value or an unknown version.
pub fn decode_consumer_group_member_metadata_value(
    value: &[u8],
) -> Result<ConsumerMemberMetadataValue, RecordError> {
    let mut r = Reader(value);
    r.version0("ConsumerGroupMemberMetadataValue version")?;
    let instance_id = r.compact_nstr("instanceId")?;
    let rack_id = r.compact_nstr("rackId")?;
    let client_id = r.compact_str("clientId")?;
    let client_host = r.compact_str("clientHost")?;
    let n = r.compact_len("subscribedTopicNames", 1)?.unwrap_or(0);
    let subscribed_topic_names = (0..n)
        .map(|_| r.compact_str("topic"))
        .collect::<Result<Vec<_>, _>>()?;
    let subscribed_topic_regex = r.compact_nstr("subscribedTopicRegex")?;
    let rebalance_timeout_ms = r.i32("rebalanceTimeoutMs")?;
    let server_assignor = r.compact_nstr("serverAssignor")?;
    r.skip_tags()?;
    Ok(ConsumerMemberMetadataValue {
        instance_id,
        rack_id,
        client_id,
        client_host,
        subscribed_topic_names,
        subscribed_topic_regex,
        rebalance_timeout_ms,
        server_assignor,
    })
}

/// `ConsumerGroupTargetAssignmentMetadataValue` v0 bytes: the assignment epoch.
pub fn consumer_group_target_assignment_metadata_value(epoch: i32) -> Vec<u8> {
    consumer_group_metadata_value(epoch)
}

/// Decodes a `ConsumerGroupTargetAssignmentMetadataValue`: the assignment epoch.
///
/// # Errors
/// [`RecordError`] for a truncated value or an unknown version.
pub fn decode_consumer_group_target_assignment_metadata_value(
    value: &[u8],
) -> Result<i32, RecordError> {
    let mut r = Reader(value);
    r.version0("ConsumerGroupTargetAssignmentMetadataValue version")?;
    r.i32("assignmentEpoch")
}

/// `ConsumerGroupTargetAssignmentMemberValue` v0 bytes.
pub fn consumer_group_target_assignment_member_value(a: &Assignment) -> Vec<u8> {
    let mut w = Writer(Vec::with_capacity(8 + a.len() * 32));
    w.i16(0);
    w.topic_partitions(a);
    w.no_tags();
    w.0
}

/// Decodes a `ConsumerGroupTargetAssignmentMemberValue`.
///
/// # Errors
/// [`RecordError`] for a truncated value or an unknown version.
pub fn decode_consumer_group_target_assignment_member_value(
    value: &[u8],
) -> Result<Assignment, RecordError> {
    let mut r = Reader(value);
    r.version0("ConsumerGroupTargetAssignmentMemberValue version")?;
    let a = r.topic_partitions("topicPartitions")?;
    r.skip_tags()?;
    Ok(a)
}

/// `ConsumerGroupCurrentMemberAssignmentValue` v0 bytes.
pub fn consumer_group_current_member_assignment_value(v: &CurrentMemberAssignmentValue) -> Vec<u8> {
    let mut w = Writer(Vec::with_capacity(32));
    w.i16(0);
    w.i32(v.member_epoch);
    w.i32(v.previous_member_epoch);
    w.0.push(v.state as u8);
    w.topic_partitions(&v.assigned);
    w.topic_partitions(&v.pending_revocation);
    w.no_tags();
    w.0
}

/// Decodes a `ConsumerGroupCurrentMemberAssignmentValue`.
///
/// # Errors
/// [`RecordError`] for a truncated value or an unknown version.
pub fn decode_consumer_group_current_member_assignment_value(
    value: &[u8],
) -> Result<CurrentMemberAssignmentValue, RecordError> {
    let mut r = Reader(value);
    r.version0("ConsumerGroupCurrentMemberAssignmentValue version")?;
    let member_epoch = r.i32("memberEpoch")?;
    let previous_member_epoch = r.i32("previousMemberEpoch")?;
    let state = r.i8("state")?;
    let assigned = r.topic_partitions("assignedPartitions")?;
    let pending_revocation = r.topic_partitions("partitionsPendingRevocation")?;
    r.skip_tags()?;
    Ok(CurrentMemberAssignmentValue {
        member_epoch,
        previous_member_epoch,
        state,
        assigned,
        pending_revocation,
    })
}

/// `ConsumerGroupMetadataValue` v0 bytes: the group epoch, then an empty tagged-field section
/// (the schema is flexible from v0).
pub fn consumer_group_metadata_value(epoch: i32) -> Vec<u8> {
    let mut w = Writer(Vec::with_capacity(7));
    w.i16(0);
    w.i32(epoch);
    w.0.push(0);
    w.0
}

/// Decodes a `ConsumerGroupMetadataValue`: the group epoch.
///
/// # Errors
/// [`RecordError`] for a truncated value.
pub fn decode_consumer_group_metadata_value(value: &[u8]) -> Result<i32, RecordError> {
    let mut r = Reader(value);
    r.version0("ConsumerGroupMetadataValue version")?;
    r.i32("epoch")
}

/// `OffsetCommitValue` bytes, v3 (v1 when an expire timestamp is given, as Kafka does).
pub fn offset_commit_value(v: &OffsetCommitValue) -> Vec<u8> {
    let mut w = Writer(Vec::with_capacity(32 + v.metadata.len()));
    if v.expire_timestamp_ms >= 0 {
        w.i16(1);
        w.i64(v.offset);
        w.str(&v.metadata);
        w.i64(v.commit_timestamp_ms);
        w.i64(v.expire_timestamp_ms);
    } else {
        w.i16(OFFSET_COMMIT_VALUE_VERSION);
        w.i64(v.offset);
        w.i32(v.leader_epoch);
        w.str(&v.metadata);
        w.i64(v.commit_timestamp_ms);
    }
    w.0
}

/// `GroupMetadataValue` bytes, v3.
pub fn group_metadata_value(v: &GroupMetadataValue) -> Vec<u8> {
    let mut w = Writer(Vec::with_capacity(64));
    w.i16(GROUP_METADATA_VALUE_VERSION);
    w.str(&v.protocol_type);
    w.i32(v.generation);
    w.nstr(v.protocol.as_deref());
    w.nstr(v.leader.as_deref());
    w.i64(v.current_state_timestamp_ms);
    w.i32(v.members.len() as i32);
    for m in &v.members {
        w.str(&m.member_id);
        w.nstr(m.group_instance_id.as_deref());
        w.str(&m.client_id);
        w.str(&m.client_host);
        w.i32(m.rebalance_timeout_ms);
        w.i32(m.session_timeout_ms);
        w.bytes(&m.subscription);
        w.bytes(&m.assignment);
    }
    w.0
}

/// Decodes a key of `__consumer_offsets`.
///
/// # Errors
/// [`RecordError`] for a truncated key.
pub fn decode_key(key: &[u8]) -> Result<CoordinatorKey, RecordError> {
    let mut r = Reader(key);
    let version = r.i16("key version")?;
    Ok(match version {
        0 | 1 => CoordinatorKey::OffsetCommit {
            group: r.str("group")?,
            topic: r.str("topic")?,
            partition: r.i32("partition")?,
        },
        2 => CoordinatorKey::GroupMetadata {
            group: r.str("group")?,
        },
        3 => CoordinatorKey::ConsumerGroupMetadata {
            group: r.str("group")?,
        },
        4 => CoordinatorKey::ConsumerGroupPartitionMetadata {
            group: r.str("group")?,
        },
        5 => CoordinatorKey::ConsumerGroupMemberMetadata {
            group: r.str("group")?,
            member: r.str("member")?,
        },
        6 => CoordinatorKey::ConsumerGroupTargetAssignmentMetadata {
            group: r.str("group")?,
        },
        7 => CoordinatorKey::ConsumerGroupTargetAssignmentMember {
            group: r.str("group")?,
            member: r.str("member")?,
        },
        8 => CoordinatorKey::ConsumerGroupCurrentMemberAssignment {
            group: r.str("group")?,
            member: r.str("member")?,
        },
        other => CoordinatorKey::Other(other),
    })
}

/// Decodes an `OffsetCommitValue` of versions 0 to 3 (v4, flexible, is not written by Kafka 4.1).
///
/// # Errors
/// [`RecordError`] for a truncated value or an unknown version.
pub fn decode_offset_commit_value(value: &[u8]) -> Result<OffsetCommitValue, RecordError> {
    let mut r = Reader(value);
    let version = r.i16("OffsetCommitValue version")?;
    if !(0..=3).contains(&version) {
        return Err(RecordError::Invalid("OffsetCommitValue version"));
    }
    let offset = r.i64("offset")?;
    let leader_epoch = if version >= 3 {
        r.i32("leaderEpoch")?
    } else {
        -1
    };
    let metadata = r.str("metadata")?;
    let commit_timestamp_ms = r.i64("commitTimestamp")?;
    let expire_timestamp_ms = if version == 1 {
        r.i64("expireTimestamp")?
    } else {
        -1
    };
    Ok(OffsetCommitValue {
        offset,
        leader_epoch,
        metadata,
        commit_timestamp_ms,
        expire_timestamp_ms,
    })
}

/// Smallest encoding of one `MemberMetadata` in a `GroupMetadataValue` (v0: three empty
/// strings, sessionTimeout, two empty byte arrays), in bytes.
const MIN_MEMBER_METADATA_BYTES: usize = 2 + 2 + 2 + 4 + 4 + 4;

/// Decodes a `GroupMetadataValue` of versions 0 to 3.
///
/// # Errors
/// [`RecordError`] for a truncated value or an unknown version.
pub fn decode_group_metadata_value(value: &[u8]) -> Result<GroupMetadataValue, RecordError> {
    let mut r = Reader(value);
    let version = r.i16("GroupMetadataValue version")?;
    if !(0..=3).contains(&version) {
        return Err(RecordError::Invalid("GroupMetadataValue version"));
    }
    let protocol_type = r.str("protocolType")?;
    let generation = r.i32("generation")?;
    let protocol = r.nstr("protocol")?;
    let leader = r.nstr("leader")?;
    let current_state_timestamp_ms = if version >= 2 {
        r.i64("currentStateTimestamp")?
    } else {
        -1
    };
    let n = r.i32("members")?;
    // issue 9: the count sizes `members` below; every member takes at least
    // MIN_MEMBER_METADATA_BYTES, so a larger count than the bytes can hold is corrupt.
    if n < 0 || (n as usize).saturating_mul(MIN_MEMBER_METADATA_BYTES) > r.0.len() {
        return Err(RecordError::Invalid("member count"));
    }
    let mut members = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let member_id = r.str("memberId")?;
        let group_instance_id = if version >= 3 {
            r.nstr("groupInstanceId")?
        } else {
            None
        };
        let client_id = r.str("clientId")?;
        let client_host = r.str("clientHost")?;
        let rebalance_timeout_ms = if version >= 1 {
            r.i32("rebalanceTimeout")?
        } else {
            -1
        };
        let session_timeout_ms = r.i32("sessionTimeout")?;
        let rebalance_timeout_ms = if rebalance_timeout_ms < 0 {
            session_timeout_ms
        } else {
            rebalance_timeout_ms
        };
        members.push(MemberMetadataValue {
            member_id,
            group_instance_id,
            client_id,
            client_host,
            rebalance_timeout_ms,
            session_timeout_ms,
            subscription: r.bytes("subscription")?,
            assignment: r.bytes("assignment")?,
        });
    }
    Ok(GroupMetadataValue {
        protocol_type,
        generation,
        protocol,
        leader,
        current_state_timestamp_ms,
        members,
    })
}

/// The topics of a consumer-protocol subscription (`ConsumerProtocolSubscription`, versions
/// 0-3: int16 version, then an array of topic names). Used by OffsetDelete to refuse deleting
/// offsets of a topic the group still consumes (GROUP_SUBSCRIBED_TO_TOPIC).
pub fn subscription_topics(metadata: &[u8]) -> Vec<String> {
    let mut r = Reader(metadata);
    let parse = |r: &mut Reader<'_>| -> Result<Vec<String>, RecordError> {
        let _version = r.i16("version")?;
        let n = r.i32("topics")?;
        if n < 0 || n as usize > r.0.len() {
            return Err(RecordError::Invalid("topic count"));
        }
        (0..n).map(|_| r.str("topic")).collect()
    };
    parse(&mut r).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_commit_round_trip_and_layout() {
        let key = offset_commit_key("g", "t", 7);
        assert_eq!(key, vec![0, 1, 0, 1, b'g', 0, 1, b't', 0, 0, 0, 7]);
        assert_eq!(
            decode_key(&key).unwrap(),
            CoordinatorKey::OffsetCommit {
                group: "g".into(),
                topic: "t".into(),
                partition: 7
            }
        );
        let v = OffsetCommitValue {
            offset: 42,
            leader_epoch: 3,
            metadata: "m".into(),
            commit_timestamp_ms: 1000,
            expire_timestamp_ms: -1,
        };
        let bytes = offset_commit_value(&v);
        assert_eq!(&bytes[..2], &[0, 3]);
        assert_eq!(decode_offset_commit_value(&bytes).unwrap(), v);
    }

    #[test]
    fn group_metadata_member_count_beyond_the_bytes_is_rejected_before_allocating() {
        // issue 9: v0 value, empty strings, generation 1, then a member count of 1000 with
        // 1000 bytes left: enough for the old `count <= bytes` check, too few for 1000 members.
        let mut v = vec![0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff];
        v.extend_from_slice(&1000i32.to_be_bytes());
        v.extend_from_slice(&[0u8; 1000]);
        assert!(matches!(
            decode_group_metadata_value(&v),
            Err(RecordError::Invalid("member count"))
        ));
    }

    #[test]
    fn group_metadata_round_trip() {
        let v = GroupMetadataValue {
            protocol_type: "consumer".into(),
            generation: 5,
            protocol: Some("range".into()),
            leader: Some("m1".into()),
            current_state_timestamp_ms: 99,
            members: vec![MemberMetadataValue {
                member_id: "m1".into(),
                group_instance_id: Some("i1".into()),
                client_id: "c".into(),
                client_host: "/127.0.0.1".into(),
                rebalance_timeout_ms: 300_000,
                session_timeout_ms: 45_000,
                subscription: Bytes::from_static(b"sub"),
                assignment: Bytes::from_static(b"asg"),
            }],
        };
        let bytes = group_metadata_value(&v);
        assert_eq!(decode_group_metadata_value(&bytes).unwrap(), v);
        assert_eq!(
            decode_key(&group_metadata_key("g")).unwrap(),
            CoordinatorKey::GroupMetadata { group: "g".into() }
        );
    }

    #[test]
    fn truncated_input_is_an_error_not_a_panic() {
        let bytes = group_metadata_value(&GroupMetadataValue {
            protocol_type: "consumer".into(),
            generation: 1,
            protocol: None,
            leader: None,
            current_state_timestamp_ms: -1,
            members: vec![],
        });
        for n in 0..bytes.len() {
            assert!(decode_group_metadata_value(&bytes[..n]).is_err());
        }
        assert!(decode_key(&[0]).is_err());
    }

    #[test]
    fn consumer_group_records_round_trip() {
        let t = Uuid::from_u128(0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10);
        let mut a = Assignment::new();
        a.insert(t, [0, 2, 5].into_iter().collect());
        let m = ConsumerMemberMetadataValue {
            instance_id: Some("i".into()),
            rack_id: None,
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            subscribed_topic_names: vec!["a".into(), "b".into()],
            subscribed_topic_regex: None,
            rebalance_timeout_ms: 300_000,
            server_assignor: Some("uniform".into()),
        };
        let bytes = consumer_group_member_metadata_value(&m);
        assert_eq!(
            decode_consumer_group_member_metadata_value(&bytes).unwrap(),
            m
        );
        for n in 0..bytes.len() {
            assert!(decode_consumer_group_member_metadata_value(&bytes[..n]).is_err());
        }
        let c = CurrentMemberAssignmentValue {
            member_epoch: 7,
            previous_member_epoch: 6,
            state: MEMBER_STATE_UNREVOKED_PARTITIONS,
            assigned: a.clone(),
            pending_revocation: Assignment::new(),
        };
        let bytes = consumer_group_current_member_assignment_value(&c);
        assert_eq!(
            decode_consumer_group_current_member_assignment_value(&bytes).unwrap(),
            c
        );
        for n in 0..bytes.len() {
            assert!(decode_consumer_group_current_member_assignment_value(&bytes[..n]).is_err());
        }
        let bytes = consumer_group_target_assignment_member_value(&a);
        // Version, one topic (compact length 2), the uuid, three partitions (4), then the
        // topic's and the value's empty tagged fields.
        assert_eq!(&bytes[..3], &[0, 0, 2]);
        assert_eq!(bytes[19], 4);
        assert_eq!(bytes.len(), 3 + 16 + 1 + 12 + 1 + 1);
        assert_eq!(
            decode_consumer_group_target_assignment_member_value(&bytes).unwrap(),
            a
        );
        let mut topics = BTreeMap::new();
        topics.insert("a".to_string(), (t, 6));
        let bytes = consumer_group_partition_metadata_value(&topics);
        assert_eq!(
            decode_consumer_group_partition_metadata_value(&bytes).unwrap(),
            topics
        );
        assert_eq!(
            decode_consumer_group_target_assignment_metadata_value(
                &consumer_group_target_assignment_metadata_value(3)
            )
            .unwrap(),
            3
        );
        assert_eq!(
            decode_key(&consumer_group_current_member_assignment_key("g", "m")).unwrap(),
            CoordinatorKey::ConsumerGroupCurrentMemberAssignment {
                group: "g".into(),
                member: "m".into()
            }
        );
        assert_eq!(
            decode_key(&consumer_group_member_metadata_key("g", "m")).unwrap(),
            CoordinatorKey::ConsumerGroupMemberMetadata {
                group: "g".into(),
                member: "m".into()
            }
        );
        // A tagged field Kafka may write (ClassicMemberMetadata, tag 0) is skipped.
        let mut bytes = consumer_group_member_metadata_value(&m);
        bytes.pop();
        bytes.extend_from_slice(&[1, 0, 2, 0xAA, 0xBB]);
        assert_eq!(
            decode_consumer_group_member_metadata_value(&bytes).unwrap(),
            m
        );
    }

    #[test]
    fn subscription_topics_of_consumer_protocol() {
        let mut w = Writer(Vec::new());
        w.i16(1);
        w.i32(2);
        w.str("a");
        w.str("b");
        w.bytes(b"");
        assert_eq!(subscription_topics(&w.0), vec!["a", "b"]);
        assert!(subscription_topics(&[1]).is_empty());
    }
}
