//! The record batches a KRaft leader writes (KIP-595): the data batch of a proposal
//! ([`build_data_batch`], also the batches of a snapshot's image) and the `LeaderChange`
//! control batch that opens its epoch ([`build_leader_change_batch`]). Both are Kafka v2
//! record batches whose `partitionLeaderEpoch` is the leader's epoch.

use bytes::{Bytes, BytesMut};
use gregor_protocol::batch::{self, BatchBuilder};
use kafka_protocol::messages::leader_change_message::{LeaderChangeMessage, Voter};
use kafka_protocol::messages::BrokerId;
use kafka_protocol::protocol::Encodable;

use crate::types::NodeId;

/// Builds the batch of a leader's proposal: one record per value (null key), at `base_offset`,
/// `partitionLeaderEpoch` = `epoch`, timestamps `now_ms`.
pub fn build_data_batch(base_offset: i64, epoch: i32, now_ms: i64, values: &[Bytes]) -> Bytes {
    let mut builder = BatchBuilder::new(base_offset, now_ms);
    for v in values {
        builder = builder.record(now_ms, None, Some(v), &[]);
    }
    let mut bytes = builder.build();
    batch::set_partition_leader_epoch(&mut bytes, epoch);
    Bytes::from(bytes)
}

/// The control record type of a `LeaderChangeMessage` (`ControlRecordType.LEADER_CHANGE`).
pub const CONTROL_TYPE_LEADER_CHANGE: i16 = 2;

/// Builds the `LeaderChange` control batch a new leader appends at the start of its epoch
/// (KIP-595): a control batch holding one record whose key is the control record key
/// (`version` 0, `type` 2) and whose value is a `LeaderChangeMessage` v0 naming the leader, the
/// voters and the voters that granted the vote.
pub fn build_leader_change_batch(
    base_offset: i64,
    epoch: i32,
    now_ms: i64,
    leader_id: NodeId,
    voters: &[NodeId],
    granting_voters: &[NodeId],
) -> Bytes {
    let mut key = Vec::with_capacity(4);
    key.extend_from_slice(&0i16.to_be_bytes());
    key.extend_from_slice(&CONTROL_TYPE_LEADER_CHANGE.to_be_bytes());
    let voter = |id: &NodeId| Voter::default().with_voter_id(*id);
    let message = LeaderChangeMessage::default()
        .with_version(0)
        .with_leader_id(BrokerId(leader_id))
        .with_voters(voters.iter().map(voter).collect())
        .with_granting_voters(granting_voters.iter().map(voter).collect());
    let mut value = BytesMut::new();
    // Encoding a message built here into a growable buffer cannot fail.
    let _ = message.encode(&mut value, 0);
    let mut bytes = BatchBuilder::new(base_offset, now_ms)
        .transactional(false, true)
        .record(now_ms, Some(&key), Some(&value), &[])
        .build();
    batch::set_partition_leader_epoch(&mut bytes, epoch);
    Bytes::from(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gregor_protocol::records::decode_records;
    use kafka_protocol::protocol::Decodable;

    #[test]
    fn leader_change_batch_is_a_control_batch_kafka_can_read() {
        let b = build_leader_change_batch(7, 3, 1000, 2, &[1, 2, 3], &[2, 3]);
        let h = batch::validate_batch(&b).unwrap();
        assert!(h.is_control());
        assert_eq!((h.base_offset, h.partition_leader_epoch), (7, 3));
        let records = decode_records(&b).unwrap();
        assert_eq!(records.len(), 1);
        let key = records[0].key.clone().unwrap();
        assert_eq!(&key[..], &[0, 0, 0, 2]);
        let mut value = records[0].value.clone().unwrap();
        let m = LeaderChangeMessage::decode(&mut value, 0).unwrap();
        assert_eq!(m.leader_id, BrokerId(2));
        assert_eq!(m.voters.len(), 3);
        assert_eq!(m.granting_voters.len(), 2);
    }
}
