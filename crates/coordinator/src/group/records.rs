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
use gregor_protocol::wire::{Reader, WireError, Writer};
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
pub type RecordError = WireError;

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

/// A compact array of `{TopicId uuid, Partitions []int32}` structs.
fn write_topic_partitions(w: &mut Writer, a: &Assignment) {
    w.compact_len(a.len());
    for (id, ps) in a {
        w.uuid(id);
        w.compact_len(ps.len());
        for p in ps {
            w.i32(*p);
        }
        w.no_tagged_fields();
    }
}

fn read_topic_partitions(
    r: &mut Reader<'_>,
    what: &'static str,
) -> Result<Assignment, RecordError> {
    let n = r.compact_len(what, 18)?.unwrap_or(0);
    let mut out = Assignment::new();
    for _ in 0..n {
        let id = r.uuid("topicId")?;
        let m = r.compact_len("partitions", 4)?.unwrap_or(0);
        let mut ps = BTreeSet::new();
        for _ in 0..m {
            ps.insert(r.i32("partition")?);
        }
        r.skip_tagged_fields()?;
        if !ps.is_empty() {
            out.entry(id).or_default().extend(ps);
        }
    }
    Ok(out)
}

/// Reads a flexible value's version and checks it is 0.
fn read_version0(r: &mut Reader<'_>, what: &'static str) -> Result<(), RecordError> {
    if r.i16(what)? != 0 {
        return Err(RecordError::Invalid(what));
    }
    Ok(())
}

/// `OffsetCommitKey` bytes (record type 1).
pub fn offset_commit_key(group: &str, topic: &str, partition: i32) -> Vec<u8> {
    let mut w = Writer::with_capacity(8 + group.len() + topic.len());
    w.i16(OFFSET_COMMIT_KEY_VERSION);
    w.string(group);
    w.string(topic);
    w.i32(partition);
    w.into_inner()
}

/// `GroupMetadataKey` bytes (record type 2).
pub fn group_metadata_key(group: &str) -> Vec<u8> {
    let mut w = Writer::with_capacity(4 + group.len());
    w.i16(GROUP_METADATA_KEY_VERSION);
    w.string(group);
    w.into_inner()
}

/// `ConsumerGroupMetadataKey` bytes (record type 3, KIP-848).
pub fn consumer_group_metadata_key(group: &str) -> Vec<u8> {
    let mut w = Writer::with_capacity(4 + group.len());
    w.i16(CONSUMER_GROUP_METADATA_KEY_VERSION);
    w.string(group);
    w.into_inner()
}

fn group_member_key(record_type: i16, group: &str, member: &str) -> Vec<u8> {
    let mut w = Writer::with_capacity(6 + group.len() + member.len());
    w.i16(record_type);
    w.string(group);
    w.string(member);
    w.into_inner()
}

fn group_key(record_type: i16, group: &str) -> Vec<u8> {
    let mut w = Writer::with_capacity(4 + group.len());
    w.i16(record_type);
    w.string(group);
    w.into_inner()
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
    let mut w = Writer::with_capacity(8 + topics.len() * 32);
    w.i16(0);
    w.compact_len(topics.len());
    for (name, (id, n)) in topics {
        w.uuid(id);
        w.compact_string(name);
        w.i32(*n);
        w.compact_len(0);
        w.no_tagged_fields();
    }
    w.no_tagged_fields();
    w.into_inner()
}

/// Decodes a `ConsumerGroupPartitionMetadataValue`: topic name -> (id, partitions).
///
/// # Errors
/// [`RecordError`] for a truncated value or an unknown version.
pub fn decode_consumer_group_partition_metadata_value(
    value: &[u8],
) -> Result<BTreeMap<String, (Uuid, i32)>, RecordError> {
    let mut r = Reader::new(value);
    read_version0(&mut r, "ConsumerGroupPartitionMetadataValue version")?;
    let n = r.compact_len("topics", 22)?.unwrap_or(0);
    let mut out = BTreeMap::new();
    for _ in 0..n {
        let id = r.uuid("topicId")?;
        let name = r.compact_string("topicName")?;
        let partitions = r.i32("numPartitions")?;
        let m = r.compact_len("partitionMetadata", 6)?.unwrap_or(0);
        for _ in 0..m {
            r.i32("partition")?;
            let racks = r.compact_len("racks", 1)?.unwrap_or(0);
            for _ in 0..racks {
                r.compact_string("rack")?;
            }
            r.skip_tagged_fields()?;
        }
        r.skip_tagged_fields()?;
        out.insert(name, (id, partitions));
    }
    Ok(out)
}

/// `ConsumerGroupMemberMetadataValue` v0 bytes.
pub fn consumer_group_member_metadata_value(v: &ConsumerMemberMetadataValue) -> Vec<u8> {
    let mut w = Writer::with_capacity(64);
    w.i16(0);
    w.compact_nullable_string(v.instance_id.as_deref());
    w.compact_nullable_string(v.rack_id.as_deref());
    w.compact_string(&v.client_id);
    w.compact_string(&v.client_host);
    w.compact_len(v.subscribed_topic_names.len());
    for t in &v.subscribed_topic_names {
        w.compact_string(t);
    }
    w.compact_nullable_string(v.subscribed_topic_regex.as_deref());
    w.i32(v.rebalance_timeout_ms);
    w.compact_nullable_string(v.server_assignor.as_deref());
    w.no_tagged_fields();
    w.into_inner()
}

/// Decodes a `ConsumerGroupMemberMetadataValue` (its tagged classic member metadata is skipped).
///
/// # Errors
/// [`RecordError`] for a truncated value or an unknown version.
pub fn decode_consumer_group_member_metadata_value(
    value: &[u8],
) -> Result<ConsumerMemberMetadataValue, RecordError> {
    let mut r = Reader::new(value);
    read_version0(&mut r, "ConsumerGroupMemberMetadataValue version")?;
    let instance_id = r.compact_nullable_string("instanceId")?;
    let rack_id = r.compact_nullable_string("rackId")?;
    let client_id = r.compact_string("clientId")?;
    let client_host = r.compact_string("clientHost")?;
    let n = r.compact_len("subscribedTopicNames", 1)?.unwrap_or(0);
    let subscribed_topic_names = (0..n)
        .map(|_| r.compact_string("topic"))
        .collect::<Result<Vec<_>, _>>()?;
    let subscribed_topic_regex = r.compact_nullable_string("subscribedTopicRegex")?;
    let rebalance_timeout_ms = r.i32("rebalanceTimeoutMs")?;
    let server_assignor = r.compact_nullable_string("serverAssignor")?;
    r.skip_tagged_fields()?;
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
    let mut r = Reader::new(value);
    read_version0(&mut r, "ConsumerGroupTargetAssignmentMetadataValue version")?;
    r.i32("assignmentEpoch")
}

/// `ConsumerGroupTargetAssignmentMemberValue` v0 bytes.
pub fn consumer_group_target_assignment_member_value(a: &Assignment) -> Vec<u8> {
    let mut w = Writer::with_capacity(8 + a.len() * 32);
    w.i16(0);
    write_topic_partitions(&mut w, a);
    w.no_tagged_fields();
    w.into_inner()
}

/// Decodes a `ConsumerGroupTargetAssignmentMemberValue`.
///
/// # Errors
/// [`RecordError`] for a truncated value or an unknown version.
pub fn decode_consumer_group_target_assignment_member_value(
    value: &[u8],
) -> Result<Assignment, RecordError> {
    let mut r = Reader::new(value);
    read_version0(&mut r, "ConsumerGroupTargetAssignmentMemberValue version")?;
    let a = read_topic_partitions(&mut r, "topicPartitions")?;
    r.skip_tagged_fields()?;
    Ok(a)
}

/// `ConsumerGroupCurrentMemberAssignmentValue` v0 bytes.
pub fn consumer_group_current_member_assignment_value(v: &CurrentMemberAssignmentValue) -> Vec<u8> {
    let mut w = Writer::with_capacity(32);
    w.i16(0);
    w.i32(v.member_epoch);
    w.i32(v.previous_member_epoch);
    w.i8(v.state);
    write_topic_partitions(&mut w, &v.assigned);
    write_topic_partitions(&mut w, &v.pending_revocation);
    w.no_tagged_fields();
    w.into_inner()
}

/// Decodes a `ConsumerGroupCurrentMemberAssignmentValue`.
///
/// # Errors
/// [`RecordError`] for a truncated value or an unknown version.
pub fn decode_consumer_group_current_member_assignment_value(
    value: &[u8],
) -> Result<CurrentMemberAssignmentValue, RecordError> {
    let mut r = Reader::new(value);
    read_version0(&mut r, "ConsumerGroupCurrentMemberAssignmentValue version")?;
    let member_epoch = r.i32("memberEpoch")?;
    let previous_member_epoch = r.i32("previousMemberEpoch")?;
    let state = r.i8("state")?;
    let assigned = read_topic_partitions(&mut r, "assignedPartitions")?;
    let pending_revocation = read_topic_partitions(&mut r, "partitionsPendingRevocation")?;
    r.skip_tagged_fields()?;
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
    let mut w = Writer::with_capacity(7);
    w.i16(0);
    w.i32(epoch);
    w.no_tagged_fields();
    w.into_inner()
}

/// Decodes a `ConsumerGroupMetadataValue`: the group epoch.
///
/// # Errors
/// [`RecordError`] for a truncated value.
pub fn decode_consumer_group_metadata_value(value: &[u8]) -> Result<i32, RecordError> {
    let mut r = Reader::new(value);
    read_version0(&mut r, "ConsumerGroupMetadataValue version")?;
    r.i32("epoch")
}

/// `OffsetCommitValue` bytes, v3 (v1 when an expire timestamp is given, as Kafka does).
pub fn offset_commit_value(v: &OffsetCommitValue) -> Vec<u8> {
    let mut w = Writer::with_capacity(32 + v.metadata.len());
    if v.expire_timestamp_ms >= 0 {
        w.i16(1);
        w.i64(v.offset);
        w.string(&v.metadata);
        w.i64(v.commit_timestamp_ms);
        w.i64(v.expire_timestamp_ms);
    } else {
        w.i16(OFFSET_COMMIT_VALUE_VERSION);
        w.i64(v.offset);
        w.i32(v.leader_epoch);
        w.string(&v.metadata);
        w.i64(v.commit_timestamp_ms);
    }
    w.into_inner()
}

/// `GroupMetadataValue` bytes, v3.
pub fn group_metadata_value(v: &GroupMetadataValue) -> Vec<u8> {
    let mut w = Writer::with_capacity(64);
    w.i16(GROUP_METADATA_VALUE_VERSION);
    w.string(&v.protocol_type);
    w.i32(v.generation);
    w.nullable_string(v.protocol.as_deref());
    w.nullable_string(v.leader.as_deref());
    w.i64(v.current_state_timestamp_ms);
    w.i32(v.members.len() as i32);
    for m in &v.members {
        w.string(&m.member_id);
        w.nullable_string(m.group_instance_id.as_deref());
        w.string(&m.client_id);
        w.string(&m.client_host);
        w.i32(m.rebalance_timeout_ms);
        w.i32(m.session_timeout_ms);
        w.bytes(&m.subscription);
        w.bytes(&m.assignment);
    }
    w.into_inner()
}

/// Decodes a key of `__consumer_offsets`.
///
/// # Errors
/// [`RecordError`] for a truncated key.
pub fn decode_key(key: &[u8]) -> Result<CoordinatorKey, RecordError> {
    let mut r = Reader::new(key);
    let version = r.i16("key version")?;
    Ok(match version {
        0 | 1 => CoordinatorKey::OffsetCommit {
            group: r.string("group")?,
            topic: r.string("topic")?,
            partition: r.i32("partition")?,
        },
        2 => CoordinatorKey::GroupMetadata {
            group: r.string("group")?,
        },
        3 => CoordinatorKey::ConsumerGroupMetadata {
            group: r.string("group")?,
        },
        4 => CoordinatorKey::ConsumerGroupPartitionMetadata {
            group: r.string("group")?,
        },
        5 => CoordinatorKey::ConsumerGroupMemberMetadata {
            group: r.string("group")?,
            member: r.string("member")?,
        },
        6 => CoordinatorKey::ConsumerGroupTargetAssignmentMetadata {
            group: r.string("group")?,
        },
        7 => CoordinatorKey::ConsumerGroupTargetAssignmentMember {
            group: r.string("group")?,
            member: r.string("member")?,
        },
        8 => CoordinatorKey::ConsumerGroupCurrentMemberAssignment {
            group: r.string("group")?,
            member: r.string("member")?,
        },
        other => CoordinatorKey::Other(other),
    })
}

/// Decodes an `OffsetCommitValue` of versions 0 to 3 (v4, flexible, is not written by Kafka 4.1).
///
/// # Errors
/// [`RecordError`] for a truncated value or an unknown version.
pub fn decode_offset_commit_value(value: &[u8]) -> Result<OffsetCommitValue, RecordError> {
    let mut r = Reader::new(value);
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
    let metadata = r.string("metadata")?;
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
    let mut r = Reader::new(value);
    let version = r.i16("GroupMetadataValue version")?;
    if !(0..=3).contains(&version) {
        return Err(RecordError::Invalid("GroupMetadataValue version"));
    }
    let protocol_type = r.string("protocolType")?;
    let generation = r.i32("generation")?;
    let protocol = r.nullable_string("protocol")?;
    let leader = r.nullable_string("leader")?;
    let current_state_timestamp_ms = if version >= 2 {
        r.i64("currentStateTimestamp")?
    } else {
        -1
    };
    let n = r.i32("members")?;
    // issue 9: the count sizes `members` below; every member takes at least
    // MIN_MEMBER_METADATA_BYTES, so a larger count than the bytes can hold is corrupt.
    if n < 0 || (n as usize).saturating_mul(MIN_MEMBER_METADATA_BYTES) > r.remaining() {
        return Err(RecordError::Invalid("member count"));
    }
    let mut members = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let member_id = r.string("memberId")?;
        let group_instance_id = if version >= 3 {
            r.nullable_string("groupInstanceId")?
        } else {
            None
        };
        let client_id = r.string("clientId")?;
        let client_host = r.string("clientHost")?;
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
            subscription: Bytes::copy_from_slice(r.bytes("subscription")?),
            assignment: Bytes::copy_from_slice(r.bytes("assignment")?),
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
    let mut r = Reader::new(metadata);
    let parse = |r: &mut Reader<'_>| -> Result<Vec<String>, RecordError> {
        let _version = r.i16("version")?;
        let n = r.i32("topics")?;
        if n < 0 || n as usize > r.remaining() {
            return Err(RecordError::Invalid("topic count"));
        }
        (0..n).map(|_| r.string("topic")).collect()
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
        let mut w = Writer::new();
        w.i16(1);
        w.i32(2);
        w.string("a");
        w.string("b");
        w.bytes(b"");
        assert_eq!(subscription_topics(&w.into_inner()), vec!["a", "b"]);
        assert!(subscription_topics(&[1]).is_empty());
    }
}
