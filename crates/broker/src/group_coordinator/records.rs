//! The records the group coordinator writes to `__consumer_offsets`, in Kafka's own key/value
//! schemas (`group-coordinator/src/main/resources/common/message/*.json` in Apache Kafka), so
//! that Kafka's tools (`kafka-dump-log --offsets-decoder`, `kafka-console-consumer` with the
//! group metadata formatter) can read the topic.
//!
//! A key starts with an int16 that is the record type (Kafka's `CoordinatorRecordType`): 0 and 1
//! are `OffsetCommitKey` (Kafka 4 writes 1), 2 is `GroupMetadataKey`, 3 is
//! `ConsumerGroupMetadataKey` (KIP-848). Keys are never flexible. Values start with their schema
//! version: Kafka 4 writes `OffsetCommitValue` v3 (v1 only with an explicit expire timestamp),
//! `GroupMetadataValue` v3 and `ConsumerGroupMetadataValue` v0 (flexible). A null value is a
//! tombstone.

use bytes::Bytes;
use thiserror::Error;

/// Record type of an offset commit written by Kafka 4 (`CoordinatorRecordType.OFFSET_COMMIT`).
pub const OFFSET_COMMIT_KEY_VERSION: i16 = 1;
/// Record type of a classic group's metadata (`CoordinatorRecordType.GROUP_METADATA`).
pub const GROUP_METADATA_KEY_VERSION: i16 = 2;
/// Record type of a KIP-848 consumer group's epoch (`CONSUMER_GROUP_METADATA`).
pub const CONSUMER_GROUP_METADATA_KEY_VERSION: i16 = 3;
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
    /// Another record type (KIP-848 member and assignment records, share groups); skipped.
    Other(i16),
}

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
    let _version = r.i16("ConsumerGroupMetadataValue version")?;
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
    if n < 0 || n as usize > r.0.len() {
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
