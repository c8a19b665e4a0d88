//! Transactional offset commits (KIP-98 TxnOffsetCommit, KIP-447 generation and member
//! fencing), as Kafka's `OffsetMetadataManager` keeps them.
//!
//! A TxnOffsetCommit writes ordinary `OffsetCommitKey`/`OffsetCommitValue` records, but in a
//! *transactional* batch of the producer (producer id and epoch, no sequence). Until that
//! producer's transaction ends they are pending: OffsetFetch does not return them, and with
//! `require_stable` (KIP-447) answers UNSTABLE_OFFSET_COMMIT for their partitions. When the
//! transaction's COMMIT marker reaches this `__consumer_offsets` partition they become the
//! group's committed offsets; an ABORT marker drops them
//! ([`GroupCoordinator::complete_transaction`], called by the partition's leader once it has
//! written the marker). Loading replays the same: transactional records go to the pending
//! set, markers apply or drop them ([`crate::runtime::CoordinatorRuntime::replay_batches`]).

use std::collections::{BTreeMap, HashMap};

use gregor_protocol::error::ErrorCode;
use tracing::{debug, warn};

use super::classic::ClassicGroupState;
use super::offsets::OffsetToCommit;
use super::records::{self, OffsetCommitValue};
use super::{CommittedOffset, CoordinatorRecord, Group, GroupCoordinator, GroupKind, Wait};

/// Pending transactional offsets: group -> producer id -> (topic, partition) -> offset.
pub type PendingTxnOffsets =
    HashMap<String, BTreeMap<i64, BTreeMap<(String, i32), CommittedOffset>>>;

/// A TxnOffsetCommit as the coordinator sees it.
pub struct TxnCommitRequest {
    /// Group id.
    pub group_id: String,
    /// The transaction's producer id.
    pub producer_id: i64,
    /// The transaction's producer epoch.
    pub producer_epoch: i16,
    /// KIP-447 generation (classic) or member epoch (KIP-848); -1 without group metadata.
    pub generation_id: i32,
    /// KIP-447 member id ("" without group metadata).
    pub member_id: String,
    /// KIP-447 static instance id.
    pub group_instance_id: Option<String>,
    /// The offsets.
    pub offsets: Vec<OffsetToCommit>,
}

impl GroupCoordinator {
    /// KIP-447 fencing of a transactional commit (Kafka's `validateOffsetCommit` with
    /// `isTransactional`): a commit without group metadata (generation < 0) is accepted for an
    /// unknown or empty group; otherwise the member must be known and the generation (member
    /// epoch) current. A rebalance in progress does not refuse it.
    fn validate_txn_commit(
        &self,
        group: Option<&Group>,
        req: &TxnCommitRequest,
    ) -> Result<(), i16> {
        let Some(group) = group else {
            return if req.generation_id < 0 {
                Ok(())
            } else {
                Err(ErrorCode::IllegalGeneration.code())
            };
        };
        match &group.kind {
            GroupKind::Classic(g) => {
                if g.state == ClassicGroupState::Dead {
                    return Err(ErrorCode::CoordinatorNotAvailable.code());
                }
                if req.generation_id < 0 && g.state == ClassicGroupState::Empty {
                    return Ok(());
                }
                if let Some(i) = &req.group_instance_id {
                    match g.static_members.get(i) {
                        None => return Err(ErrorCode::UnknownMemberId.code()),
                        Some(m) if *m != req.member_id => {
                            return Err(ErrorCode::FencedInstanceId.code())
                        }
                        Some(_) => {}
                    }
                }
                if !g.members.contains_key(&req.member_id) {
                    return Err(ErrorCode::UnknownMemberId.code());
                }
                if req.generation_id != g.generation_id {
                    return Err(ErrorCode::IllegalGeneration.code());
                }
                Ok(())
            }
            GroupKind::Consumer(c) => {
                if req.generation_id < 0 && c.members.is_empty() {
                    return Ok(());
                }
                let Some(m) = c.members.get(&req.member_id) else {
                    return Err(ErrorCode::UnknownMemberId.code());
                };
                if req.generation_id != m.member_epoch {
                    return Err(ErrorCode::IllegalGeneration.code());
                }
                Ok(())
            }
        }
    }

    /// TxnOffsetCommit: per-partition error codes in request order, answered once the
    /// transactional batch is committed. The offsets stay pending until the transaction's
    /// marker ([`GroupCoordinator::complete_transaction`]).
    pub fn commit_transactional_offsets(&self, req: TxnCommitRequest) -> Wait<Vec<i16>> {
        let n = req.offsets.len();
        if req.group_id.is_empty() {
            return Wait::Ready(vec![ErrorCode::InvalidGroupId.code(); n]);
        }
        let partition = match self.check_coordinator(&req.group_id) {
            Ok(p) => p,
            Err(e) => return Wait::Ready(vec![e; n]),
        };
        let mut st = self.state.lock();
        if let Err(e) = self.validate_txn_commit(st.groups.get(&req.group_id), &req) {
            return Wait::Ready(vec![e; n]);
        }
        let now = self.now_ms();
        let mut errors = Vec::with_capacity(n);
        let mut recs: Vec<CoordinatorRecord> = Vec::new();
        let mut accepted = Vec::new();
        for o in &req.offsets {
            let metadata = o.metadata.clone().unwrap_or_default();
            if metadata.len() > self.config.offset_metadata_max_bytes {
                errors.push(ErrorCode::OffsetMetadataTooLarge.code());
                continue;
            }
            errors.push(ErrorCode::None.code());
            let c = CommittedOffset {
                offset: o.offset,
                leader_epoch: o.leader_epoch,
                metadata,
                commit_timestamp_ms: now,
                expire_timestamp_ms: -1,
            };
            recs.push((
                records::offset_commit_key(&req.group_id, &o.topic, o.partition),
                Some(records::offset_commit_value(&OffsetCommitValue {
                    offset: c.offset,
                    leader_epoch: c.leader_epoch,
                    metadata: c.metadata.clone(),
                    commit_timestamp_ms: c.commit_timestamp_ms,
                    expire_timestamp_ms: c.expire_timestamp_ms,
                })),
            ));
            accepted.push(((o.topic.clone(), o.partition), c));
        }
        let failed = move |e: i16, errors: Vec<i16>| -> Vec<i16> {
            errors
                .into_iter()
                .map(|x| if x == ErrorCode::None.code() { e } else { x })
                .collect()
        };
        let write = match self.runtime.append_transactional(
            partition,
            &recs,
            req.producer_id,
            req.producer_epoch,
        ) {
            Ok(w) => w,
            Err(e) => return Wait::Ready(failed(e.code(), errors)),
        };
        if !accepted.is_empty() {
            let pending = st
                .pending_txn_offsets
                .entry(req.group_id.clone())
                .or_default()
                .entry(req.producer_id)
                .or_default();
            for (k, c) in accepted {
                pending.insert(k, c);
            }
        }
        drop(st);
        let on_error = errors.clone();
        self.when_committed(write, errors, move |e| failed(e, on_error))
    }

    /// The hook for transaction markers written to partition `partition` of
    /// `__consumer_offsets` (Kafka's `GroupCoordinator.onTransactionCompleted`): the pending
    /// offsets of `producer_id` in that partition's groups become committed (`commit`) or are
    /// dropped. The partition's leader calls it after appending the marker.
    pub fn complete_transaction(&self, partition: i32, producer_id: i64, commit: bool) {
        if self.runtime.status(partition).is_none() {
            return;
        }
        let now = self.now_ms();
        let mut st = self.state.lock();
        let super::CoordinatorState {
            groups,
            pending_txn_offsets,
            ..
        } = &mut *st;
        let mut touched = 0usize;
        pending_txn_offsets.retain(|group_id, by_producer| {
            if self.partition_for(group_id) != partition {
                return true;
            }
            if let Some(offsets) = by_producer.remove(&producer_id) {
                touched += offsets.len();
                if commit {
                    let g = groups
                        .entry(group_id.clone())
                        .or_insert_with(|| Group::new_classic(group_id, now));
                    g.offsets.extend(offsets);
                }
            }
            !by_producer.is_empty()
        });
        if touched > 0 {
            debug!(
                partition,
                producer_id,
                commit,
                offsets = touched,
                "transaction completed on {}",
                super::GROUP_METADATA_TOPIC_NAME
            );
        }
    }

    /// Whether `group_id` has a transactional offset for `topic`-`partition` waiting for its
    /// transaction's marker.
    pub fn has_pending_transactional_offset(
        &self,
        group_id: &str,
        topic: &str,
        partition: i32,
    ) -> bool {
        let key = (topic.to_string(), partition);
        self.state
            .lock()
            .pending_txn_offsets
            .get(group_id)
            .is_some_and(|by_producer| by_producer.values().any(|o| o.contains_key(&key)))
    }
}

/// A record of a transactional batch read while loading: an offset commit becomes pending
/// for its producer (tombstones and other records are not written transactionally).
pub(crate) fn apply_loaded_transactional_record(
    pending: &mut PendingTxnOffsets,
    producer_id: i64,
    key: &[u8],
    value: Option<&[u8]>,
) {
    let Ok(records::CoordinatorKey::OffsetCommit {
        group,
        topic,
        partition,
    }) = records::decode_key(key)
    else {
        return;
    };
    let Some(v) = value else { return };
    match records::decode_offset_commit_value(v) {
        Ok(v) => {
            pending
                .entry(group)
                .or_default()
                .entry(producer_id)
                .or_default()
                .insert(
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
        Err(e) => warn!(group, error = %e, "skipping an undecodable transactional offset commit"),
    }
}

/// A marker read while loading: the producer's pending offsets become committed or are
/// dropped.
pub(crate) fn apply_marker(
    groups: &mut HashMap<String, Group>,
    pending: &mut PendingTxnOffsets,
    producer_id: i64,
    commit: bool,
    now: i64,
) {
    pending.retain(|group_id, by_producer| {
        if let Some(offsets) = by_producer.remove(&producer_id) {
            if commit {
                groups
                    .entry(group_id.clone())
                    .or_insert_with(|| Group::new_classic(group_id, now))
                    .offsets
                    .extend(offsets);
            }
        }
        !by_producer.is_empty()
    });
}
