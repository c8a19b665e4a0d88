//! Committed offsets and group administration: OffsetCommit, OffsetFetch, OffsetDelete,
//! DescribeGroups, ListGroups, DeleteGroups, as Kafka's `GroupMetadataManager` and
//! `OffsetMetadataManager` answer them.

use std::collections::BTreeMap;

use super::classic::ClassicGroupState;
use super::records::{self, OffsetCommitValue};
use super::{CommittedOffset, CoordinatorRecord, Group, GroupCoordinator, GroupKind, Wait};
use gregor_protocol::error::ErrorCode;

/// One partition of an OffsetCommit.
pub struct OffsetToCommit {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Leader epoch (-1 unknown).
    pub leader_epoch: i32,
    /// Metadata (null is stored as "").
    pub metadata: Option<String>,
}

/// An OffsetCommit as the coordinator sees it.
pub struct CommitRequest {
    /// Group id.
    pub group_id: String,
    /// Generation (classic) or member epoch (KIP-848); -1 for a commit without membership.
    pub generation_id_or_member_epoch: i32,
    /// Member id.
    pub member_id: String,
    /// Static instance id.
    pub group_instance_id: Option<String>,
    /// OffsetCommit v2-4 retention, -1 for the broker's.
    pub retention_time_ms: i64,
    /// Request version.
    pub api_version: i16,
    /// The offsets.
    pub offsets: Vec<OffsetToCommit>,
}

/// A committed offset as OffsetFetch reports it: -1 and "" when there is none.
#[derive(Debug, Clone)]
pub struct FetchedOffset {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset, -1 if none.
    pub offset: i64,
    /// Leader epoch, -1 if none.
    pub leader_epoch: i32,
    /// Metadata.
    pub metadata: String,
    /// Per-partition error: UNSTABLE_OFFSET_COMMIT (with offset -1) when `require_stable`
    /// asked and a transactional commit for the partition is pending (KIP-447), else NONE.
    pub error_code: i16,
}

/// A group as DescribeGroups reports it.
pub struct DescribedClassicGroup {
    /// Error (GROUP_ID_NOT_FOUND from v6 for unknown or non-classic groups).
    pub error_code: i16,
    /// Error message.
    pub error_message: Option<String>,
    /// State name.
    pub state: String,
    /// Protocol type.
    pub protocol_type: String,
    /// Selected protocol (only for Stable groups, as Kafka).
    pub protocol: String,
    /// Members: id, instance id, client id, host, metadata, assignment.
    pub members: Vec<DescribedMember>,
}

/// A member in DescribeGroups.
pub struct DescribedMember {
    /// Member id.
    pub member_id: String,
    /// Instance id.
    pub group_instance_id: Option<String>,
    /// Client id.
    pub client_id: String,
    /// Client host.
    pub client_host: String,
    /// Metadata of the selected protocol (Stable groups only).
    pub metadata: bytes::Bytes,
    /// Assignment (Stable groups only).
    pub assignment: bytes::Bytes,
}

/// A listed group.
pub struct ListedGroup {
    /// Group id.
    pub group_id: String,
    /// Protocol type.
    pub protocol_type: String,
    /// State.
    pub state: String,
    /// "classic" or "consumer".
    pub group_type: String,
}

impl GroupCoordinator {
    fn validate_commit(&self, group: Option<&Group>, req: &CommitRequest) -> Result<(), i16> {
        let Some(group) = group else {
            return if req.generation_id_or_member_epoch < 0 {
                Ok(())
            } else if req.api_version >= 9 {
                Err(ErrorCode::GroupIdNotFound.code())
            } else {
                Err(ErrorCode::IllegalGeneration.code())
            };
        };
        match &group.kind {
            GroupKind::Classic(g) => {
                if g.state == ClassicGroupState::Dead {
                    return Err(ErrorCode::CoordinatorNotAvailable.code());
                }
                if req.generation_id_or_member_epoch < 0 && g.state == ClassicGroupState::Empty {
                    return Ok(());
                }
                if req.generation_id_or_member_epoch >= 0
                    || !req.member_id.is_empty()
                    || req.group_instance_id.is_some()
                {
                    if let Some(i) = &req.group_instance_id {
                        match g.static_members.get(i) {
                            None => return Err(ErrorCode::UnknownMemberId.code()),
                            Some(m) if *m != req.member_id => {
                                return Err(ErrorCode::FencedInstanceId.code())
                            }
                            Some(_) => {}
                        }
                    } else if !g.members.contains_key(&req.member_id) {
                        return Err(ErrorCode::UnknownMemberId.code());
                    }
                    if req.generation_id_or_member_epoch != g.generation_id {
                        return Err(ErrorCode::IllegalGeneration.code());
                    }
                } else {
                    // generation -1 and no member id, but the group has members.
                    return Err(ErrorCode::UnknownMemberId.code());
                }
                if g.state == ClassicGroupState::CompletingRebalance {
                    return Err(ErrorCode::RebalanceInProgress.code());
                }
                Ok(())
            }
            GroupKind::Consumer(c) => {
                if req.generation_id_or_member_epoch < 0 && c.members.is_empty() {
                    return Ok(());
                }
                let Some(m) = c.members.get(&req.member_id) else {
                    return Err(ErrorCode::UnknownMemberId.code());
                };
                if req.generation_id_or_member_epoch != m.member_epoch {
                    return Err(if req.api_version >= 9 {
                        ErrorCode::StaleMemberEpoch.code()
                    } else {
                        ErrorCode::IllegalGeneration.code()
                    });
                }
                Ok(())
            }
        }
    }

    /// OffsetCommit: per-partition error codes, in request order.
    pub fn commit_offsets(&self, req: CommitRequest) -> Wait<Vec<i16>> {
        let n = req.offsets.len();
        if req.group_id.is_empty() {
            return Wait::Ready(vec![ErrorCode::InvalidGroupId.code(); n]);
        }
        let partition = match self.check_coordinator(&req.group_id) {
            Ok(p) => p,
            Err(e) => return Wait::Ready(vec![e; n]),
        };
        let mut st = self.state.lock();
        if let Err(e) = self.validate_commit(st.groups.get(&req.group_id), &req) {
            return Wait::Ready(vec![e; n]);
        }
        let now = self.now_ms();
        let expire = if req.retention_time_ms > 0 {
            now.saturating_add(req.retention_time_ms)
        } else {
            -1
        };
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
                expire_timestamp_ms: expire,
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
        let write = match self.append(partition, &recs) {
            Ok(w) => w,
            Err(e) => return Wait::Ready(failed(e, errors)),
        };
        if !accepted.is_empty() {
            let g = st
                .groups
                .entry(req.group_id.clone())
                .or_insert_with(|| Group::new_classic(&req.group_id, now));
            for (k, c) in accepted {
                g.offsets.insert(k, c);
            }
        }
        drop(st);
        let on_error = errors.clone();
        self.when_committed(write, errors, move |e| failed(e, on_error))
    }

    /// OffsetFetch for one group: the group error and the offsets. `partitions` None means all
    /// committed offsets of the group. `member` is KIP-848's (member id, member epoch), checked
    /// for consumer groups when the epoch is >= 0.
    pub fn fetch_offsets(
        &self,
        group_id: &str,
        partitions: Option<Vec<(String, Vec<i32>)>>,
        member: Option<(&str, i32)>,
    ) -> Result<Vec<FetchedOffset>, i16> {
        self.fetch_offsets_stable(group_id, partitions, member, false)
    }

    /// OffsetFetch as [`GroupCoordinator::fetch_offsets`], with OffsetFetch v7's
    /// `require_stable` (KIP-447): a partition with a pending transactional commit answers
    /// UNSTABLE_OFFSET_COMMIT instead of its offset.
    pub fn fetch_offsets_stable(
        &self,
        group_id: &str,
        partitions: Option<Vec<(String, Vec<i32>)>>,
        member: Option<(&str, i32)>,
        require_stable: bool,
    ) -> Result<Vec<FetchedOffset>, i16> {
        self.check_coordinator(group_id)?;
        let st = self.state.lock();
        let group = st.groups.get(group_id);
        if let (Some(g), Some((member_id, epoch))) = (group, member) {
            if let GroupKind::Consumer(c) = &g.kind {
                if epoch >= 0 {
                    match c.members.get(member_id) {
                        None => return Err(ErrorCode::UnknownMemberId.code()),
                        Some(m) if m.member_epoch != epoch => {
                            return Err(ErrorCode::StaleMemberEpoch.code())
                        }
                        Some(_) => {}
                    }
                }
            }
        }
        let empty = BTreeMap::new();
        let offsets = group.map_or(&empty, |g| &g.offsets);
        let pending = st.pending_txn_offsets.get(group_id);
        let unstable = |t: &str, p: i32| {
            require_stable
                && pending.is_some_and(|by_producer| {
                    by_producer
                        .values()
                        .any(|o| o.contains_key(&(t.to_string(), p)))
                })
        };
        let mut out: Vec<FetchedOffset> = match partitions {
            None => offsets
                .iter()
                .map(|((t, p), o)| FetchedOffset {
                    topic: t.clone(),
                    partition: *p,
                    offset: o.offset,
                    leader_epoch: o.leader_epoch,
                    metadata: o.metadata.clone(),
                    error_code: 0,
                })
                .collect(),
            Some(topics) => topics
                .into_iter()
                .flat_map(|(t, ps)| {
                    ps.into_iter()
                        .map(move |p| (t.clone(), p))
                        .collect::<Vec<_>>()
                })
                .map(|(t, p)| match offsets.get(&(t.clone(), p)) {
                    Some(o) => FetchedOffset {
                        topic: t,
                        partition: p,
                        offset: o.offset,
                        leader_epoch: o.leader_epoch,
                        metadata: o.metadata.clone(),
                        error_code: 0,
                    },
                    None => FetchedOffset {
                        topic: t,
                        partition: p,
                        offset: -1,
                        leader_epoch: -1,
                        metadata: String::new(),
                        error_code: 0,
                    },
                })
                .collect(),
        };
        for o in &mut out {
            if unstable(&o.topic, o.partition) {
                o.offset = -1;
                o.leader_epoch = -1;
                o.metadata = String::new();
                o.error_code = ErrorCode::UnstableOffsetCommit.code();
            }
        }
        Ok(out)
    }

    /// OffsetDelete (KIP-496): the group error, and per (topic, partition) its error:
    /// GROUP_SUBSCRIBED_TO_TOPIC while the group has members consuming the topic.
    pub fn delete_offsets(
        &self,
        group_id: &str,
        partitions: &[(String, i32)],
    ) -> Result<Vec<i16>, i16> {
        if group_id.is_empty() {
            return Err(ErrorCode::InvalidGroupId.code());
        }
        let partition = self.check_coordinator(group_id)?;
        let mut st = self.state.lock();
        let Some(g) = st.groups.get_mut(group_id) else {
            return Err(ErrorCode::GroupIdNotFound.code());
        };
        let subscribed: Vec<String> = match &g.kind {
            GroupKind::Classic(c) => {
                if c.state == ClassicGroupState::Dead {
                    return Err(ErrorCode::GroupIdNotFound.code());
                }
                if c.protocol_type.as_deref() == Some("consumer") && !c.members.is_empty() {
                    let proto = c.protocol_name.clone().unwrap_or_default();
                    c.members
                        .values()
                        .flat_map(|m| {
                            m.protocols
                                .iter()
                                .filter(|(n, _)| *n == proto)
                                .flat_map(|(_, md)| records::subscription_topics(md))
                                .collect::<Vec<_>>()
                        })
                        .collect()
                } else if !c.members.is_empty() {
                    return Err(ErrorCode::NonEmptyGroup.code());
                } else {
                    Vec::new()
                }
            }
            GroupKind::Consumer(c) => c
                .members
                .values()
                .flat_map(|m| m.subscribed_topic_names.iter().cloned())
                .collect(),
        };
        let mut errors = Vec::with_capacity(partitions.len());
        let mut recs = Vec::new();
        for (t, p) in partitions {
            if subscribed.contains(t) {
                errors.push(ErrorCode::GroupSubscribedToTopic.code());
            } else {
                errors.push(ErrorCode::None.code());
                if g.offsets.contains_key(&(t.clone(), *p)) {
                    recs.push((records::offset_commit_key(group_id, t, *p), None));
                }
            }
        }
        self.append(partition, &recs)?;
        for ((t, p), e) in partitions.iter().zip(&errors) {
            if *e == ErrorCode::None.code() {
                g.offsets.remove(&(t.clone(), *p));
            }
        }
        Ok(errors)
    }

    /// DescribeGroups for one group. From v6 an unknown or non-classic group is
    /// GROUP_ID_NOT_FOUND; before, it is described as Dead with no error (as Kafka 4).
    pub fn describe_classic_group(&self, group_id: &str, version: i16) -> DescribedClassicGroup {
        let dead = |code: i16, msg: Option<String>| DescribedClassicGroup {
            error_code: code,
            error_message: msg,
            state: "Dead".into(),
            protocol_type: String::new(),
            protocol: String::new(),
            members: vec![],
        };
        if let Err(e) = self.check_coordinator(group_id) {
            return dead(e, None);
        }
        let st = self.state.lock();
        let not_found = |msg: String| {
            if version >= 6 {
                dead(ErrorCode::GroupIdNotFound.code(), Some(msg))
            } else {
                dead(ErrorCode::None.code(), None)
            }
        };
        let Some(group) = st.groups.get(group_id) else {
            return not_found(format!("Group {group_id} not found."));
        };
        let GroupKind::Classic(g) = &group.kind else {
            return not_found(format!("Group {group_id} is not a classic group."));
        };
        let stable = g.state == ClassicGroupState::Stable;
        let protocol = g.protocol_name.clone().unwrap_or_default();
        DescribedClassicGroup {
            error_code: ErrorCode::None.code(),
            error_message: None,
            state: g.state.name().into(),
            protocol_type: g.protocol_type.clone().unwrap_or_default(),
            protocol: if stable {
                protocol.clone()
            } else {
                String::new()
            },
            members: g
                .members
                .values()
                .map(|m| DescribedMember {
                    member_id: m.member_id.clone(),
                    group_instance_id: m.group_instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    metadata: if stable {
                        m.protocols
                            .iter()
                            .find(|(n, _)| *n == protocol)
                            .map(|(_, b)| b.clone())
                            .unwrap_or_default()
                    } else {
                        bytes::Bytes::new()
                    },
                    assignment: if stable {
                        m.assignment.clone()
                    } else {
                        bytes::Bytes::new()
                    },
                })
                .collect(),
        }
    }

    /// ListGroups with KIP-518 state and KIP-848 type filters (case-insensitive, empty means
    /// all).
    pub fn list_groups(&self, states: &[String], types: &[String]) -> Vec<ListedGroup> {
        let st = self.state.lock();
        let mut out: Vec<ListedGroup> = st
            .groups
            .values()
            .filter(|g| {
                states.is_empty()
                    || states
                        .iter()
                        .any(|s| s.eq_ignore_ascii_case(g.state_name()))
            })
            .filter(|g| {
                types.is_empty() || types.iter().any(|t| t.eq_ignore_ascii_case(g.type_name()))
            })
            .map(|g| ListedGroup {
                group_id: g.group_id.clone(),
                protocol_type: g.protocol_type(),
                state: g.state_name().into(),
                group_type: g.type_name().into(),
            })
            .collect();
        out.sort_by(|a, b| a.group_id.cmp(&b.group_id));
        out
    }

    /// DeleteGroups for one group: GROUP_ID_NOT_FOUND, NON_EMPTY_GROUP, or NONE after writing
    /// tombstones for its offsets and metadata.
    pub fn delete_group(&self, group_id: &str) -> i16 {
        if group_id.is_empty() {
            return ErrorCode::InvalidGroupId.code();
        }
        let partition = match self.check_coordinator(group_id) {
            Ok(p) => p,
            Err(e) => return e,
        };
        let mut st = self.state.lock();
        let Some(g) = st.groups.get(group_id) else {
            return ErrorCode::GroupIdNotFound.code();
        };
        if let GroupKind::Classic(c) = &g.kind {
            if c.state == ClassicGroupState::Dead {
                return ErrorCode::GroupIdNotFound.code();
            }
        }
        if !g.is_empty() {
            return ErrorCode::NonEmptyGroup.code();
        }
        let mut recs: Vec<CoordinatorRecord> = g
            .offsets
            .keys()
            .map(|(t, p)| (records::offset_commit_key(group_id, t, *p), None))
            .collect();
        recs.push((records::group_metadata_key(group_id), None));
        if let GroupKind::Consumer(c) = &g.kind {
            recs.extend(super::consumer::group_tombstones(group_id, c));
        }
        if let Err(e) = self.append(partition, &recs) {
            return e;
        }
        st.groups.remove(group_id);
        tracing::info!(group = group_id, "deleted group");
        ErrorCode::None.code()
    }
}
