//! Classic groups: the JoinGroup / SyncGroup / Heartbeat / LeaveGroup protocol
//! (<https://kafka.apache.org/protocol#The_Messages_JoinGroup>), with KIP-345 static membership
//! (`group.instance.id`, FENCED_INSTANCE_ID), KIP-394 (MEMBER_ID_REQUIRED from JoinGroup v4),
//! KIP-134 (`group.initial.rebalance.delay.ms`) and KIP-389 (`group.max.size`).
//!
//! The state machine is Kafka's `ClassicGroupState`: Empty -> PreparingRebalance ->
//! CompletingRebalance -> Stable, back to PreparingRebalance on membership changes; every
//! transition is in [`ClassicGroup::transition`]. Generation ids only grow.

use std::collections::{HashMap, HashSet};

use bytes::Bytes;
use gregor_protocol::kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use gregor_protocol::kafka_protocol::messages::{JoinGroupResponse, SyncGroupResponse};
use indexmap::IndexMap;
use tokio::sync::oneshot;
use tracing::{debug, info};

use super::records::{self, GroupMetadataValue, MemberMetadataValue};
use super::{sb, CoordinatorRecord, Group, GroupCoordinator, GroupKind, Timer, Wait};
use gregor_protocol::error::ErrorCode;

/// `ClassicGroupState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClassicGroupState {
    /// No members (offsets may exist).
    Empty,
    /// Waiting for members to (re)join.
    PreparingRebalance,
    /// Joined; waiting for the leader's assignment (SyncGroup).
    CompletingRebalance,
    /// Assigned.
    Stable,
    /// Deleted.
    Dead,
}

impl ClassicGroupState {
    /// Kafka's name for the state.
    pub fn name(self) -> &'static str {
        match self {
            Self::Empty => "Empty",
            Self::PreparingRebalance => "PreparingRebalance",
            Self::CompletingRebalance => "CompletingRebalance",
            Self::Stable => "Stable",
            Self::Dead => "Dead",
        }
    }

    fn valid_previous(self) -> &'static [ClassicGroupState] {
        use ClassicGroupState::*;
        match self {
            Empty => &[PreparingRebalance],
            PreparingRebalance => &[Empty, CompletingRebalance, Stable],
            CompletingRebalance => &[PreparingRebalance],
            Stable => &[CompletingRebalance],
            Dead => &[Empty, PreparingRebalance, CompletingRebalance, Stable, Dead],
        }
    }
}

/// A member of a classic group.
pub struct ClassicMember {
    /// Member id (client id + "-" + UUID).
    pub member_id: String,
    /// KIP-345 static instance id.
    pub group_instance_id: Option<String>,
    /// Client id.
    pub client_id: String,
    /// Client host ("/ip").
    pub client_host: String,
    /// Rebalance timeout.
    pub rebalance_timeout_ms: i32,
    /// Session timeout.
    pub session_timeout_ms: i32,
    /// Protocol type ("consumer").
    pub protocol_type: String,
    /// Supported protocols (assignor name, metadata), in preference order.
    pub protocols: Vec<(String, Bytes)>,
    /// The assignment from the last SyncGroup.
    pub assignment: Bytes,
    pub(crate) awaiting_join: Option<oneshot::Sender<JoinGroupResponse>>,
    pub(crate) awaiting_sync: Option<oneshot::Sender<SyncGroupResponse>>,
    pub(crate) is_new: bool,
    pub(crate) heartbeat_deadline: i64,
    pub(crate) incarnation: u64,
}

impl ClassicMember {
    fn metadata(&self, protocol: &str) -> Bytes {
        self.protocols
            .iter()
            .find(|(n, _)| n == protocol)
            .map(|(_, m)| m.clone())
            .unwrap_or_default()
    }
}

/// A classic group's membership state.
pub struct ClassicGroup {
    /// State.
    pub state: ClassicGroupState,
    /// When the state was entered (ms); the base of offset expiry when Empty (KIP-211).
    pub state_timestamp_ms: i64,
    /// Generation id.
    pub generation_id: i32,
    /// Protocol type, None until a member joined.
    pub protocol_type: Option<String>,
    /// Selected protocol.
    pub protocol_name: Option<String>,
    /// Leader member id.
    pub leader_id: Option<String>,
    /// Members, in join order (a new leader is the first remaining member).
    pub members: IndexMap<String, ClassicMember>,
    /// KIP-394: member ids handed out with MEMBER_ID_REQUIRED, not yet joined.
    pub pending_members: HashSet<String>,
    /// KIP-345: instance id -> member id.
    pub static_members: HashMap<String, String>,
    /// Members that have not sent SyncGroup since the join completed.
    pending_sync: HashSet<String>,
    new_member_added: bool,
    initial_delay_active: bool,
    initial_delay_remaining_ms: u64,
    rebalance_timer: u64,
    pub(crate) has_metadata_record: bool,
}

impl ClassicGroup {
    /// A new empty group, created at `now_ms`.
    pub fn new(now_ms: i64) -> Self {
        Self {
            state: ClassicGroupState::Empty,
            state_timestamp_ms: now_ms,
            generation_id: 0,
            protocol_type: None,
            protocol_name: None,
            leader_id: None,
            members: IndexMap::new(),
            pending_members: HashSet::new(),
            static_members: HashMap::new(),
            pending_sync: HashSet::new(),
            new_member_added: false,
            initial_delay_active: false,
            initial_delay_remaining_ms: 0,
            rebalance_timer: 0,
            has_metadata_record: false,
        }
    }

    /// The group as a `GroupMetadataValue` record loaded it: Stable with its members, or Empty.
    pub fn from_record(v: GroupMetadataValue, now_ms: i64) -> Self {
        let mut g = Self::new(now_ms);
        g.has_metadata_record = true;
        g.generation_id = v.generation;
        g.protocol_type = Some(v.protocol_type).filter(|p| !p.is_empty());
        g.protocol_name = v.protocol.clone();
        g.leader_id = v.leader;
        if v.current_state_timestamp_ms >= 0 {
            g.state_timestamp_ms = v.current_state_timestamp_ms;
        }
        for m in v.members {
            if let Some(i) = &m.group_instance_id {
                g.static_members.insert(i.clone(), m.member_id.clone());
            }
            let protocols = v
                .protocol
                .clone()
                .map(|p| vec![(p, m.subscription.clone())])
                .unwrap_or_default();
            g.members.insert(
                m.member_id.clone(),
                ClassicMember {
                    member_id: m.member_id,
                    group_instance_id: m.group_instance_id,
                    client_id: m.client_id,
                    client_host: m.client_host,
                    rebalance_timeout_ms: m.rebalance_timeout_ms,
                    session_timeout_ms: m.session_timeout_ms,
                    protocol_type: g.protocol_type.clone().unwrap_or_default(),
                    protocols,
                    assignment: m.assignment,
                    awaiting_join: None,
                    awaiting_sync: None,
                    is_new: false,
                    heartbeat_deadline: 0,
                    incarnation: 0,
                },
            );
        }
        g.state = if g.members.is_empty() {
            ClassicGroupState::Empty
        } else {
            ClassicGroupState::Stable
        };
        g
    }

    fn transition(&mut self, to: ClassicGroupState, now_ms: i64) {
        debug_assert!(
            to.valid_previous().contains(&self.state),
            "classic group transition {:?} -> {to:?}",
            self.state
        );
        self.state = to;
        self.state_timestamp_ms = now_ms;
    }

    fn metadata_record(&self, group_id: &str) -> CoordinatorRecord {
        let protocol = self.protocol_name.clone().unwrap_or_default();
        let value = GroupMetadataValue {
            protocol_type: self.protocol_type.clone().unwrap_or_default(),
            generation: self.generation_id,
            protocol: self.protocol_name.clone(),
            leader: self.leader_id.clone(),
            current_state_timestamp_ms: self.state_timestamp_ms,
            members: self
                .members
                .values()
                .map(|m| MemberMetadataValue {
                    member_id: m.member_id.clone(),
                    group_instance_id: m.group_instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    rebalance_timeout_ms: m.rebalance_timeout_ms,
                    session_timeout_ms: m.session_timeout_ms,
                    subscription: m.metadata(&protocol),
                    assignment: m.assignment.clone(),
                })
                .collect(),
        };
        (
            records::group_metadata_key(group_id),
            Some(records::group_metadata_value(&value)),
        )
    }

    /// Kafka's `supportsProtocols`: the group is empty, or the type matches and at least one
    /// of the protocols is supported by every member.
    fn supports_protocols(&self, protocol_type: &str, protocols: &[(String, Bytes)]) -> bool {
        if self.members.is_empty() {
            return !protocol_type.is_empty() && !protocols.is_empty();
        }
        self.protocol_type.as_deref() == Some(protocol_type)
            && protocols.iter().any(|(name, _)| {
                self.members
                    .values()
                    .all(|m| m.protocols.iter().any(|(n, _)| n == name))
            })
    }

    /// Kafka's `selectProtocol`: among the protocols every member supports, the one most members
    /// list first.
    fn select_protocol(&self) -> Option<String> {
        let first = self.members.values().next()?;
        let candidates: Vec<&String> = first
            .protocols
            .iter()
            .map(|(n, _)| n)
            .filter(|n| {
                self.members
                    .values()
                    .all(|m| m.protocols.iter().any(|(x, _)| x == *n))
            })
            .collect();
        let mut votes: Vec<(usize, &String)> = candidates.iter().map(|c| (0, *c)).collect();
        for m in self.members.values() {
            if let Some((n, _)) = m.protocols.iter().find(|(n, _)| candidates.contains(&n)) {
                if let Some(v) = votes.iter_mut().find(|(_, c)| *c == n) {
                    v.0 += 1;
                }
            }
        }
        let best = votes.iter().map(|(v, _)| *v).max()?;
        votes
            .into_iter()
            .find(|(v, _)| *v == best)
            .map(|(_, n)| n.clone())
    }

    fn all_members_joined(&self) -> bool {
        self.pending_members.is_empty() && self.members.values().all(|m| m.awaiting_join.is_some())
    }

    fn max_rebalance_timeout_ms(&self) -> u64 {
        self.members
            .values()
            .map(|m| m.rebalance_timeout_ms.max(0) as u64)
            .max()
            .unwrap_or(0)
    }

    /// Validates a member's identity as Kafka's `ClassicGroup.validateMember`.
    fn validate_member(&self, member_id: &str, instance_id: Option<&str>) -> Result<(), i16> {
        if let Some(i) = instance_id {
            match self.static_members.get(i) {
                None => Err(ErrorCode::UnknownMemberId.code()),
                Some(m) if m != member_id => Err(ErrorCode::FencedInstanceId.code()),
                Some(_) => Ok(()),
            }
        } else if self.members.contains_key(member_id) {
            Ok(())
        } else {
            Err(ErrorCode::UnknownMemberId.code())
        }
    }

    fn current_members_for(&self, leader: bool) -> Vec<JoinGroupResponseMember> {
        if !leader {
            return Vec::new();
        }
        let protocol = self.protocol_name.clone().unwrap_or_default();
        self.members
            .values()
            .map(|m| {
                JoinGroupResponseMember::default()
                    .with_member_id(sb(&m.member_id))
                    .with_group_instance_id(m.group_instance_id.as_deref().map(sb))
                    .with_metadata(m.metadata(&protocol))
            })
            .collect()
    }

    fn join_response(&self, member_id: &str) -> JoinGroupResponse {
        let is_leader = self.leader_id.as_deref() == Some(member_id);
        JoinGroupResponse::default()
            .with_generation_id(self.generation_id)
            .with_protocol_type(self.protocol_type.as_deref().map(sb))
            .with_protocol_name(self.protocol_name.as_deref().map(sb))
            .with_leader(sb(self.leader_id.as_deref().unwrap_or("")))
            .with_member_id(sb(member_id))
            .with_members(self.current_members_for(is_leader))
    }

    /// Answers every waiting JoinGroup and SyncGroup with `error` (the coordinator unloaded
    /// the group).
    pub(crate) fn fail_waiting_members(&mut self, error: i16) {
        for m in self.members.values_mut() {
            if let Some(tx) = m.awaiting_join.take() {
                let _ = tx.send(join_error(error, &m.member_id));
            }
            if let Some(tx) = m.awaiting_sync.take() {
                let _ = tx.send(sync_error(error));
            }
        }
    }

    /// Removes a member; a waiting JoinGroup/SyncGroup gets `error`.
    fn remove_member(&mut self, member_id: &str, error: i16) {
        if let Some(mut m) = self.members.shift_remove(member_id) {
            if let Some(tx) = m.awaiting_join.take() {
                let _ = tx.send(join_error(error, member_id));
            }
            if let Some(tx) = m.awaiting_sync.take() {
                let _ = tx.send(sync_error(error));
            }
            if let Some(i) = &m.group_instance_id {
                if self.static_members.get(i).map(String::as_str) == Some(member_id) {
                    self.static_members.remove(i);
                }
            }
        }
        self.pending_sync.remove(member_id);
        if self.leader_id.as_deref() == Some(member_id) {
            self.leader_id = self.members.keys().next().cloned();
        }
    }
}

fn join_error(code: i16, member_id: &str) -> JoinGroupResponse {
    JoinGroupResponse::default()
        .with_error_code(code)
        .with_generation_id(-1)
        .with_member_id(sb(member_id))
        .with_protocol_name(None)
}

fn sync_error(code: i16) -> SyncGroupResponse {
    SyncGroupResponse::default().with_error_code(code)
}

/// A JoinGroup as the coordinator sees it.
pub struct JoinRequest {
    /// Group id.
    pub group_id: String,
    /// Member id ("" for a new member).
    pub member_id: String,
    /// KIP-345 instance id.
    pub group_instance_id: Option<String>,
    /// Session timeout.
    pub session_timeout_ms: i32,
    /// Rebalance timeout (the session timeout for v0).
    pub rebalance_timeout_ms: i32,
    /// Protocol type.
    pub protocol_type: String,
    /// Protocols (name, metadata).
    pub protocols: Vec<(String, Bytes)>,
    /// Client id.
    pub client_id: String,
    /// Client host.
    pub client_host: String,
    /// KIP-394: v4+ requires a known member id.
    pub require_known_member_id: bool,
    /// Reason (v8+), logged.
    pub reason: Option<String>,
}

/// Member identity for LeaveGroup.
pub struct LeavingMember {
    /// Member id ("" with an instance id).
    pub member_id: String,
    /// Instance id.
    pub group_instance_id: Option<String>,
}

impl GroupCoordinator {
    /// A classic member's session timer fell due: the member is removed, and the group
    /// rebalances, unless a heartbeat moved its deadline (then the timer is queued again).
    pub(crate) fn on_session_timer(&self, group_id: &str, member_id: &str, incarnation: u64) {
        let now = self.now_ms();
        let mut st = self.state.lock();
        let Some(group) = st.groups.get_mut(group_id) else {
            return;
        };
        let GroupKind::Classic(g) = &mut group.kind else {
            return;
        };
        let Some(m) = g.members.get_mut(member_id) else {
            return;
        };
        if m.incarnation != incarnation {
            return;
        }
        if m.awaiting_join.is_some() || m.awaiting_sync.is_some() {
            // Kafka's hasSatisfiedHeartbeat: a member waiting in a rebalance is alive; the
            // rebalance timeout bounds the wait instead.
            m.heartbeat_deadline = now + i64::from(m.session_timeout_ms);
        }
        if m.heartbeat_deadline > now {
            let deadline = m.heartbeat_deadline;
            drop(st);
            self.runtime.schedule_at(
                deadline,
                Timer::Session {
                    group_id: group_id.to_string(),
                    member_id: member_id.to_string(),
                    incarnation,
                },
            );
            return;
        }
        info!(
            group = group_id,
            member = member_id,
            "member's session timed out; removing it"
        );
        let mut timers = Vec::new();
        self.remove_members_and_rebalance(group, &[member_id.to_string()], &mut timers);
        drop(st);
        self.schedule_timers(timers);
    }
}

impl GroupCoordinator {
    /// JoinGroup (Kafka's `classicGroupJoin`).
    pub fn join_group(&self, req: JoinRequest) -> Wait<JoinGroupResponse> {
        let member_id = req.member_id.clone();
        if req.group_id.is_empty() {
            return Wait::Ready(join_error(ErrorCode::InvalidGroupId.code(), &member_id));
        }
        let partition = match self.check_coordinator(&req.group_id) {
            Ok(p) => p,
            Err(e) => return Wait::Ready(join_error(e, &member_id)),
        };
        if req.session_timeout_ms < self.config.min_session_timeout_ms
            || req.session_timeout_ms > self.config.max_session_timeout_ms
        {
            return Wait::Ready(join_error(
                ErrorCode::InvalidSessionTimeout.code(),
                &member_id,
            ));
        }
        let now = self.now_ms();
        let mut timers = Vec::new();
        let mut st = self.state.lock();
        let next_id = st.next_id();
        let is_unknown = member_id.is_empty();
        let group = match st.groups.get_mut(&req.group_id) {
            Some(g) => g,
            None if is_unknown => st
                .groups
                .entry(req.group_id.clone())
                .or_insert_with(|| Group::new_classic(&req.group_id, now)),
            None => return Wait::Ready(join_error(ErrorCode::UnknownMemberId.code(), &member_id)),
        };
        if let GroupKind::Consumer(c) = &group.kind {
            if !c.members.is_empty() {
                // Joining a live KIP-848 group with the classic protocol (KIP-848's upgrade
                // path) is not supported.
                return Wait::Ready(join_error(
                    ErrorCode::InconsistentGroupProtocol.code(),
                    &member_id,
                ));
            }
            // An empty consumer group becomes a classic group (Kafka's offline downgrade).
            group.kind = GroupKind::Classic(ClassicGroup::new(self.now_ms()));
        }
        let out = {
            let GroupKind::Classic(g) = &mut group.kind else {
                return Wait::Ready(join_error(ErrorCode::UnknownServerError.code(), &member_id));
            };
            // Kafka's acceptJoiningMember (KIP-389).
            let accept = match g.state {
                ClassicGroupState::Empty | ClassicGroupState::Dead => true,
                ClassicGroupState::PreparingRebalance => {
                    g.members.contains_key(&member_id)
                        || g.members
                            .values()
                            .filter(|m| m.awaiting_join.is_some())
                            .count()
                            < self.config.max_size
                }
                _ => {
                    g.members.contains_key(&member_id)
                        || g.pending_members.contains(&member_id)
                        || g.members.len() < self.config.max_size
                }
            };
            if !accept {
                return Wait::Ready(join_error(
                    ErrorCode::GroupMaxSizeReached.code(),
                    &member_id,
                ));
            }
            if g.state == ClassicGroupState::Dead {
                return Wait::Ready(join_error(
                    ErrorCode::CoordinatorNotAvailable.code(),
                    &member_id,
                ));
            }
            if !g.supports_protocols(&req.protocol_type, &req.protocols) {
                return Wait::Ready(join_error(
                    ErrorCode::InconsistentGroupProtocol.code(),
                    &member_id,
                ));
            }
            if let Some(reason) = &req.reason {
                debug!(
                    group = req.group_id,
                    member = member_id,
                    reason,
                    "JoinGroup"
                );
            }
            if is_unknown {
                // Kafka's `generateMemberId`: the instance id for static members, else the
                // client id, then a random uuid.
                let prefix = req.group_instance_id.as_deref().unwrap_or(&req.client_id);
                let new_id = format!("{prefix}-{}", uuid::Uuid::new_v4());
                if let Some(instance) = req.group_instance_id.clone() {
                    if let Some(old_id) = g.static_members.get(&instance).cloned() {
                        self.update_static_member(
                            partition,
                            &req,
                            g,
                            &old_id,
                            &new_id,
                            next_id,
                            &mut timers,
                        )
                    } else {
                        self.add_member_and_rebalance(g, &req, new_id, next_id, &mut timers)
                    }
                } else if req.require_known_member_id {
                    g.pending_members.insert(new_id.clone());
                    timers.push(Timer::PendingMember {
                        group_id: req.group_id.clone(),
                        member_id: new_id.clone(),
                        delay_ms: req.session_timeout_ms.max(0) as u64,
                    });
                    Wait::Ready(join_error(ErrorCode::MemberIdRequired.code(), &new_id))
                } else {
                    self.add_member_and_rebalance(g, &req, new_id, next_id, &mut timers)
                }
            } else if g.pending_members.remove(&member_id) {
                self.add_member_and_rebalance(g, &req, member_id.clone(), next_id, &mut timers)
            } else if let Err(e) = g.validate_member(&member_id, req.group_instance_id.as_deref()) {
                Wait::Ready(join_error(e, &member_id))
            } else {
                match g.state {
                    ClassicGroupState::PreparingRebalance => {
                        self.update_member_and_rebalance(g, &req, &mut timers)
                    }
                    ClassicGroupState::CompletingRebalance | ClassicGroupState::Stable => {
                        let is_leader = g.leader_id.as_deref() == Some(member_id.as_str());
                        let same = g
                            .members
                            .get(&member_id)
                            .is_some_and(|m| m.protocols == req.protocols);
                        if same && (g.state == ClassicGroupState::CompletingRebalance || !is_leader)
                        {
                            // The member lost its JoinGroup response, or rejoins without
                            // changes: the current generation stands.
                            if let Some(m) = g.members.get_mut(&member_id) {
                                m.heartbeat_deadline =
                                    self.now_ms() + i64::from(m.session_timeout_ms);
                            }
                            Wait::Ready(g.join_response(&member_id))
                        } else {
                            self.update_member_and_rebalance(g, &req, &mut timers)
                        }
                    }
                    ClassicGroupState::Empty | ClassicGroupState::Dead => {
                        Wait::Ready(join_error(ErrorCode::UnknownMemberId.code(), &member_id))
                    }
                }
            }
        };
        self.try_complete_join(group, &mut timers);
        drop(st);
        self.schedule_timers(timers);
        out
    }

    fn add_member_and_rebalance(
        &self,
        g: &mut ClassicGroup,
        req: &JoinRequest,
        member_id: String,
        incarnation: u64,
        timers: &mut Vec<Timer>,
    ) -> Wait<JoinGroupResponse> {
        let (tx, rx) = oneshot::channel();
        if g.members.is_empty() {
            g.protocol_type = Some(req.protocol_type.clone());
        }
        if let Some(i) = &req.group_instance_id {
            g.static_members.insert(i.clone(), member_id.clone());
        }
        g.members.insert(
            member_id.clone(),
            ClassicMember {
                member_id: member_id.clone(),
                group_instance_id: req.group_instance_id.clone(),
                client_id: req.client_id.clone(),
                client_host: req.client_host.clone(),
                rebalance_timeout_ms: req.rebalance_timeout_ms,
                session_timeout_ms: req.session_timeout_ms,
                protocol_type: req.protocol_type.clone(),
                protocols: req.protocols.clone(),
                assignment: Bytes::new(),
                awaiting_join: Some(tx),
                awaiting_sync: None,
                is_new: true,
                heartbeat_deadline: self.now_ms() + i64::from(req.session_timeout_ms.max(0)),
                incarnation,
            },
        );
        if g.leader_id.is_none() {
            g.leader_id = Some(member_id.clone());
        }
        timers.push(Timer::Session {
            group_id: req.group_id.clone(),
            member_id,
            incarnation,
        });
        if g.state == ClassicGroupState::PreparingRebalance && g.initial_delay_active {
            g.new_member_added = true;
        }
        self.maybe_prepare_rebalance(&req.group_id, g, timers);
        Wait::Pending(rx)
    }

    fn update_member_and_rebalance(
        &self,
        g: &mut ClassicGroup,
        req: &JoinRequest,
        timers: &mut Vec<Timer>,
    ) -> Wait<JoinGroupResponse> {
        let (tx, rx) = oneshot::channel();
        if let Some(m) = g.members.get_mut(&req.member_id) {
            m.protocols = req.protocols.clone();
            m.rebalance_timeout_ms = req.rebalance_timeout_ms;
            m.session_timeout_ms = req.session_timeout_ms;
            if let Some(old) = m.awaiting_join.replace(tx) {
                let _ = old.send(join_error(
                    ErrorCode::RebalanceInProgress.code(),
                    &req.member_id,
                ));
            }
        }
        self.maybe_prepare_rebalance(&req.group_id, g, timers);
        Wait::Pending(rx)
    }

    /// KIP-345: a static member rejoins with a new member id. In a Stable group with unchanged
    /// protocols there is no rebalance: the old id is fenced and the new one takes its place.
    #[allow(clippy::too_many_arguments)]
    fn update_static_member(
        &self,
        partition: i32,
        req: &JoinRequest,
        g: &mut ClassicGroup,
        old_id: &str,
        new_id: &str,
        incarnation: u64,
        timers: &mut Vec<Timer>,
    ) -> Wait<JoinGroupResponse> {
        let Some(mut m) = g.members.shift_remove(old_id) else {
            return self.add_member_and_rebalance(g, req, new_id.to_string(), incarnation, timers);
        };
        if let Some(tx) = m.awaiting_join.take() {
            let _ = tx.send(join_error(ErrorCode::FencedInstanceId.code(), old_id));
        }
        if let Some(tx) = m.awaiting_sync.take() {
            let _ = tx.send(sync_error(ErrorCode::FencedInstanceId.code()));
        }
        let protocols_changed = m.protocols != req.protocols;
        let old_protocols = std::mem::replace(&mut m.protocols, req.protocols.clone());
        m.member_id = new_id.to_string();
        m.client_id = req.client_id.clone();
        m.client_host = req.client_host.clone();
        m.incarnation = incarnation;
        m.session_timeout_ms = req.session_timeout_ms;
        m.rebalance_timeout_ms = req.rebalance_timeout_ms;
        m.heartbeat_deadline = self.now_ms() + i64::from(req.session_timeout_ms.max(0));
        g.members.insert(new_id.to_string(), m);
        if let Some(i) = &req.group_instance_id {
            g.static_members.insert(i.clone(), new_id.to_string());
        }
        let was_leader = g.leader_id.as_deref() == Some(old_id);
        if was_leader {
            g.leader_id = Some(new_id.to_string());
        }
        if g.pending_sync.remove(old_id) {
            g.pending_sync.insert(new_id.to_string());
        }
        timers.push(Timer::Session {
            group_id: req.group_id.clone(),
            member_id: new_id.to_string(),
            incarnation,
        });
        info!(
            group = req.group_id,
            instance = req.group_instance_id.as_deref().unwrap_or(""),
            old = old_id,
            new = new_id,
            "static member rejoined with a new member id"
        );
        if g.state == ClassicGroupState::Stable && !protocols_changed {
            let record = g.metadata_record(&req.group_id);
            if let Err(e) = self.append(partition, &[record]) {
                // Revert, as Kafka does when the write fails.
                if let Some(mut m) = g.members.shift_remove(new_id) {
                    m.member_id = old_id.to_string();
                    m.protocols = old_protocols;
                    g.members.insert(old_id.to_string(), m);
                }
                if let Some(i) = &req.group_instance_id {
                    g.static_members.insert(i.clone(), old_id.to_string());
                }
                if was_leader {
                    g.leader_id = Some(old_id.to_string());
                }
                return Wait::Ready(join_error(e, ""));
            }
            let mut resp = g.join_response(new_id);
            resp.skip_assignment = was_leader;
            return Wait::Ready(resp);
        }
        let r = JoinRequest {
            member_id: new_id.to_string(),
            group_id: req.group_id.clone(),
            group_instance_id: req.group_instance_id.clone(),
            session_timeout_ms: req.session_timeout_ms,
            rebalance_timeout_ms: req.rebalance_timeout_ms,
            protocol_type: req.protocol_type.clone(),
            protocols: req.protocols.clone(),
            client_id: req.client_id.clone(),
            client_host: req.client_host.clone(),
            require_known_member_id: req.require_known_member_id,
            reason: None,
        };
        self.update_member_and_rebalance(g, &r, timers)
    }

    fn maybe_prepare_rebalance(
        &self,
        group_id: &str,
        g: &mut ClassicGroup,
        timers: &mut Vec<Timer>,
    ) {
        if matches!(
            g.state,
            ClassicGroupState::Empty
                | ClassicGroupState::Stable
                | ClassicGroupState::CompletingRebalance
        ) {
            self.prepare_rebalance(group_id, g, timers);
        }
    }

    fn prepare_rebalance(&self, group_id: &str, g: &mut ClassicGroup, timers: &mut Vec<Timer>) {
        if g.state == ClassicGroupState::CompletingRebalance {
            // Kafka's resetAndPropagateAssignmentWithError.
            for m in g.members.values_mut() {
                m.assignment = Bytes::new();
                if let Some(tx) = m.awaiting_sync.take() {
                    let _ = tx.send(sync_error(ErrorCode::RebalanceInProgress.code()));
                }
            }
        }
        g.pending_sync.clear();
        let was_empty = g.state == ClassicGroupState::Empty;
        g.transition(ClassicGroupState::PreparingRebalance, self.now_ms());
        g.rebalance_timer += 1;
        let max_rebalance = g.max_rebalance_timeout_ms();
        let initial = self.config.initial_rebalance_delay_ms;
        // Kafka's `prepareRebalance`: the first rebalance of an empty group (KIP-134) always
        // ends on the delayed-join timer, never in the join that started it, even with a delay
        // of 0 (then the timer fires at once, after the joins already queued); the delay is
        // `group.initial.rebalance.delay.ms` whatever the rebalance timeout, which only bounds
        // the extensions. Members that join meanwhile are in the first generation.
        let delay_ms = if was_empty {
            g.initial_delay_active = true;
            g.new_member_added = false;
            g.initial_delay_remaining_ms = max_rebalance.saturating_sub(initial);
            initial
        } else {
            g.initial_delay_active = false;
            max_rebalance
        };
        debug!(group = group_id, delay_ms, "preparing rebalance");
        timers.push(Timer::Rebalance {
            group_id: group_id.to_string(),
            id: g.rebalance_timer,
            delay_ms,
        });
    }

    pub(crate) fn on_rebalance_timer(&self, group_id: &str, id: u64) {
        let mut timers = Vec::new();
        let mut st = self.state.lock();
        let Some(group) = st.groups.get_mut(group_id) else {
            return;
        };
        let GroupKind::Classic(g) = &mut group.kind else {
            return;
        };
        if g.rebalance_timer != id || g.state != ClassicGroupState::PreparingRebalance {
            return;
        }
        if g.initial_delay_active && g.new_member_added && g.initial_delay_remaining_ms > 0 {
            // KIP-134: new members arrived during the delay; wait a little longer
            // (`tryCompleteInitialRebalanceElseSchedule`).
            g.new_member_added = false;
            let d = self
                .config
                .initial_rebalance_delay_ms
                .min(g.initial_delay_remaining_ms);
            g.initial_delay_remaining_ms = g
                .initial_delay_remaining_ms
                .saturating_sub(self.config.initial_rebalance_delay_ms);
            g.rebalance_timer += 1;
            timers.push(Timer::Rebalance {
                group_id: group_id.to_string(),
                id: g.rebalance_timer,
                delay_ms: d,
            });
        } else {
            g.initial_delay_active = false;
            self.complete_join(group, &mut timers);
        }
        drop(st);
        self.schedule_timers(timers);
    }

    fn try_complete_join(&self, group: &mut Group, timers: &mut Vec<Timer>) {
        let GroupKind::Classic(g) = &group.kind else {
            return;
        };
        if g.state == ClassicGroupState::PreparingRebalance
            && !g.initial_delay_active
            && g.all_members_joined()
        {
            self.complete_join(group, timers);
        }
    }

    /// Kafka's `completeClassicGroupJoin`: members that did not rejoin are removed, the next
    /// generation starts, every waiting JoinGroup is answered (the leader gets the members'
    /// metadata).
    fn complete_join(&self, group: &mut Group, timers: &mut Vec<Timer>) {
        let group_id = group.group_id.clone();
        let GroupKind::Classic(g) = &mut group.kind else {
            return;
        };
        let not_rejoined: Vec<String> = g
            .members
            .values()
            .filter(|m| m.awaiting_join.is_none())
            .map(|m| m.member_id.clone())
            .collect();
        for id in not_rejoined {
            info!(
                group = group_id,
                member = id,
                "member did not rejoin within the rebalance timeout; removing it"
            );
            g.remove_member(&id, ErrorCode::UnknownMemberId.code());
        }
        let previous_generation = g.generation_id;
        g.generation_id += 1;
        debug_assert!(
            g.generation_id > previous_generation,
            "generation ids only grow"
        );
        let partition = self.partition_for(&group_id);
        if g.members.is_empty() {
            g.protocol_name = None;
            g.transition(ClassicGroupState::Empty, self.now_ms());
            g.has_metadata_record = true;
            let record = g.metadata_record(&group_id);
            let _ = self.append(partition, &[record]);
            return;
        }
        g.protocol_name = g.select_protocol();
        if g.leader_id
            .as_ref()
            .is_none_or(|l| !g.members.contains_key(l))
        {
            g.leader_id = g.members.keys().next().cloned();
        }
        g.transition(ClassicGroupState::CompletingRebalance, self.now_ms());
        info!(
            group = group_id,
            generation = g.generation_id,
            members = g.members.len(),
            protocol = g.protocol_name.as_deref().unwrap_or(""),
            "rebalance: join phase complete"
        );
        let now = self.now_ms();
        let ids: Vec<String> = g.members.keys().cloned().collect();
        for id in &ids {
            let resp = g.join_response(id);
            if let Some(m) = g.members.get_mut(id) {
                m.is_new = false;
                m.heartbeat_deadline = now + i64::from(m.session_timeout_ms);
                if let Some(tx) = m.awaiting_join.take() {
                    let _ = tx.send(resp);
                }
            }
        }
        g.pending_sync = ids.into_iter().collect();
        timers.push(Timer::Sync {
            group_id,
            generation: g.generation_id,
            delay_ms: g.max_rebalance_timeout_ms(),
        });
    }

    pub(crate) fn on_sync_timer(&self, group_id: &str, generation: i32) {
        let mut timers = Vec::new();
        let mut st = self.state.lock();
        let Some(group) = st.groups.get_mut(group_id) else {
            return;
        };
        let GroupKind::Classic(g) = &mut group.kind else {
            return;
        };
        if g.generation_id != generation
            || !matches!(
                g.state,
                ClassicGroupState::CompletingRebalance | ClassicGroupState::Stable
            )
            || g.pending_sync.is_empty()
        {
            return;
        }
        let missing: Vec<String> = g.pending_sync.iter().cloned().collect();
        info!(group = group_id, members = ?missing, "members did not send SyncGroup within the rebalance timeout; removing them");
        self.remove_members_and_rebalance(group, &missing, &mut timers);
        drop(st);
        self.schedule_timers(timers);
    }

    pub(crate) fn on_pending_member_timer(&self, group_id: &str, member_id: &str) {
        let mut timers = Vec::new();
        let mut st = self.state.lock();
        let Some(group) = st.groups.get_mut(group_id) else {
            return;
        };
        let GroupKind::Classic(g) = &mut group.kind else {
            return;
        };
        if g.pending_members.remove(member_id) {
            debug!(
                group = group_id,
                member = member_id,
                "pending member expired"
            );
            self.try_complete_join(group, &mut timers);
        }
        drop(st);
        self.schedule_timers(timers);
    }

    /// Removes members (session expiry, LeaveGroup, missing SyncGroup) and rebalances.
    pub(crate) fn remove_members_and_rebalance(
        &self,
        group: &mut Group,
        member_ids: &[String],
        timers: &mut Vec<Timer>,
    ) {
        let group_id = group.group_id.clone();
        let GroupKind::Classic(g) = &mut group.kind else {
            return;
        };
        for id in member_ids {
            g.remove_member(id, ErrorCode::UnknownMemberId.code());
            g.pending_members.remove(id);
        }
        match g.state {
            ClassicGroupState::Stable | ClassicGroupState::CompletingRebalance => {
                self.prepare_rebalance(&group_id, g, timers);
                // A group that lost its last member completes at once.
                if g.members.is_empty() {
                    g.initial_delay_active = false;
                }
            }
            _ => {}
        }
        self.try_complete_join(group, timers);
    }

    /// SyncGroup (Kafka's `classicGroupSync`).
    #[allow(clippy::too_many_arguments)]
    pub fn sync_group(
        &self,
        group_id: &str,
        generation_id: i32,
        member_id: &str,
        group_instance_id: Option<&str>,
        protocol_type: Option<&str>,
        protocol_name: Option<&str>,
        assignments: Vec<(String, Bytes)>,
    ) -> Wait<SyncGroupResponse> {
        let partition = match self.check_coordinator(group_id) {
            Ok(p) => p,
            Err(e) => return Wait::Ready(sync_error(e)),
        };
        let mut timers = Vec::new();
        let mut st = self.state.lock();
        let Some(group) = st.groups.get_mut(group_id) else {
            return Wait::Ready(sync_error(ErrorCode::UnknownMemberId.code()));
        };
        let GroupKind::Classic(g) = &mut group.kind else {
            return Wait::Ready(sync_error(ErrorCode::UnknownMemberId.code()));
        };
        if g.state == ClassicGroupState::Dead {
            return Wait::Ready(sync_error(ErrorCode::CoordinatorNotAvailable.code()));
        }
        if let Err(e) = g.validate_member(member_id, group_instance_id) {
            return Wait::Ready(sync_error(e));
        }
        if generation_id != g.generation_id {
            return Wait::Ready(sync_error(ErrorCode::IllegalGeneration.code()));
        }
        if protocol_type.is_some_and(|t| Some(t) != g.protocol_type.as_deref())
            || protocol_name.is_some_and(|n| Some(n) != g.protocol_name.as_deref())
        {
            return Wait::Ready(sync_error(ErrorCode::InconsistentGroupProtocol.code()));
        }
        let out = match g.state {
            ClassicGroupState::Empty | ClassicGroupState::Dead => {
                Wait::Ready(sync_error(ErrorCode::UnknownMemberId.code()))
            }
            ClassicGroupState::PreparingRebalance => {
                Wait::Ready(sync_error(ErrorCode::RebalanceInProgress.code()))
            }
            ClassicGroupState::CompletingRebalance => {
                let (tx, rx) = oneshot::channel();
                g.pending_sync.remove(member_id);
                if let Some(m) = g.members.get_mut(member_id) {
                    if let Some(old) = m.awaiting_sync.replace(tx) {
                        let _ = old.send(sync_error(ErrorCode::RebalanceInProgress.code()));
                    }
                }
                if g.leader_id.as_deref() == Some(member_id) {
                    let mut by_member: HashMap<String, Bytes> = assignments.into_iter().collect();
                    for m in g.members.values_mut() {
                        m.assignment = by_member.remove(&m.member_id).unwrap_or_default();
                    }
                    g.has_metadata_record = true;
                    let record = g.metadata_record(group_id);
                    match self.append(partition, &[record]) {
                        Ok(write) => {
                            g.transition(ClassicGroupState::Stable, self.now_ms());
                            info!(
                                group = group_id,
                                generation = g.generation_id,
                                "rebalance: assignment received, group is Stable"
                            );
                            let protocol_type = g.protocol_type.clone();
                            let protocol_name = g.protocol_name.clone();
                            let mut answers = Vec::new();
                            for m in g.members.values_mut() {
                                if let Some(tx) = m.awaiting_sync.take() {
                                    answers.push((
                                        tx,
                                        SyncGroupResponse::default()
                                            .with_protocol_type(protocol_type.as_deref().map(sb))
                                            .with_protocol_name(protocol_name.as_deref().map(sb))
                                            .with_assignment(m.assignment.clone()),
                                    ));
                                }
                            }
                            // The members learn their assignment once it is committed.
                            self.runtime.complete_when_committed(write, move |r| {
                                for (tx, resp) in answers {
                                    let _ = tx.send(match &r {
                                        Ok(()) => resp,
                                        Err(e) => sync_error(e.code()),
                                    });
                                }
                            });
                        }
                        Err(e) => {
                            for m in g.members.values_mut() {
                                m.assignment = Bytes::new();
                                if let Some(tx) = m.awaiting_sync.take() {
                                    let _ = tx.send(sync_error(e));
                                }
                            }
                            self.prepare_rebalance(group_id, g, &mut timers);
                        }
                    }
                }
                Wait::Pending(rx)
            }
            ClassicGroupState::Stable => {
                g.pending_sync.remove(member_id);
                let assignment = g
                    .members
                    .get(member_id)
                    .map(|m| m.assignment.clone())
                    .unwrap_or_default();
                Wait::Ready(
                    SyncGroupResponse::default()
                        .with_protocol_type(g.protocol_type.as_deref().map(sb))
                        .with_protocol_name(g.protocol_name.as_deref().map(sb))
                        .with_assignment(assignment),
                )
            }
        };
        drop(st);
        self.schedule_timers(timers);
        out
    }

    /// Heartbeat (Kafka's `classicGroupHeartbeat`): the error code.
    pub fn heartbeat(
        &self,
        group_id: &str,
        generation_id: i32,
        member_id: &str,
        group_instance_id: Option<&str>,
    ) -> i16 {
        if let Err(e) = self.check_coordinator(group_id) {
            return e;
        }
        let mut st = self.state.lock();
        let Some(group) = st.groups.get_mut(group_id) else {
            return ErrorCode::UnknownMemberId.code();
        };
        let GroupKind::Classic(g) = &mut group.kind else {
            return ErrorCode::UnknownMemberId.code();
        };
        if g.state == ClassicGroupState::Dead {
            return ErrorCode::CoordinatorNotAvailable.code();
        }
        if let Err(e) = g.validate_member(member_id, group_instance_id) {
            return e;
        }
        if generation_id != g.generation_id {
            return ErrorCode::IllegalGeneration.code();
        }
        let state = g.state;
        if let Some(m) = g.members.get_mut(member_id) {
            m.heartbeat_deadline = self.now_ms() + i64::from(m.session_timeout_ms);
        }
        match state {
            ClassicGroupState::Empty | ClassicGroupState::Dead => ErrorCode::UnknownMemberId.code(),
            ClassicGroupState::PreparingRebalance => ErrorCode::RebalanceInProgress.code(),
            _ => ErrorCode::None.code(),
        }
    }

    /// LeaveGroup (Kafka's `classicGroupLeave`): the top-level error and, per member, its error.
    pub fn leave_group(&self, group_id: &str, members: &[LeavingMember]) -> (i16, Vec<i16>) {
        if let Err(e) = self.check_coordinator(group_id) {
            return (e, vec![]);
        }
        let mut timers = Vec::new();
        let mut st = self.state.lock();
        let Some(group) = st.groups.get_mut(group_id) else {
            return (ErrorCode::UnknownMemberId.code(), vec![]);
        };
        let GroupKind::Classic(g) = &mut group.kind else {
            return (ErrorCode::UnknownMemberId.code(), vec![]);
        };
        if g.state == ClassicGroupState::Dead {
            return (ErrorCode::CoordinatorNotAvailable.code(), vec![]);
        }
        let mut errors = Vec::with_capacity(members.len());
        let mut leaving = Vec::new();
        let mut pending_left = false;
        for m in members {
            let err = if m.member_id.is_empty() {
                match m
                    .group_instance_id
                    .as_ref()
                    .and_then(|i| g.static_members.get(i))
                {
                    Some(id) => {
                        leaving.push(id.clone());
                        ErrorCode::None.code()
                    }
                    None => ErrorCode::UnknownMemberId.code(),
                }
            } else if g.pending_members.remove(&m.member_id) {
                pending_left = true;
                ErrorCode::None.code()
            } else {
                match g.validate_member(&m.member_id, m.group_instance_id.as_deref()) {
                    Ok(()) => {
                        leaving.push(m.member_id.clone());
                        ErrorCode::None.code()
                    }
                    Err(e) => e,
                }
            };
            errors.push(err);
        }
        if !leaving.is_empty() {
            info!(group = group_id, members = ?leaving, "members left the group");
            self.remove_members_and_rebalance(group, &leaving, &mut timers);
        } else if pending_left {
            self.try_complete_join(group, &mut timers);
        }
        drop(st);
        self.schedule_timers(timers);
        (ErrorCode::None.code(), errors)
    }
}
