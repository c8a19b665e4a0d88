//! KIP-848 consumer groups: ConsumerGroupHeartbeat
//! (<https://cwiki.apache.org/confluence/display/KAFKA/KIP-848>). The coordinator computes a
//! target assignment with a server-side assignor whenever the group epoch moves (a member
//! joins, leaves or changes its subscription, or a subscribed topic changes), and reconciles
//! each member towards it: partitions still owned by another member are only handed over once
//! that member has revoked them (its heartbeat no longer lists them).

use std::collections::{BTreeMap, BTreeSet};

use tracing::info;
use uuid::Uuid;

use super::assignor::{self, Assignment, MemberSpec};
use super::records::{self, ConsumerMemberMetadataValue, CurrentMemberAssignmentValue};
use super::{CoordinatorRecord, Group, GroupCoordinator, GroupKind, Timer, Wait};
use crate::runtime::PendingWrite;
use crate::runtime::TopicMetadata;
use gregor_protocol::error::ErrorCode;

/// A member of a consumer group.
pub struct ConsumerMember {
    /// Member id.
    pub member_id: String,
    /// Static instance id.
    pub instance_id: Option<String>,
    /// Rack id.
    pub rack_id: Option<String>,
    /// Client id.
    pub client_id: String,
    /// Client host.
    pub client_host: String,
    /// Rebalance timeout.
    pub rebalance_timeout_ms: i32,
    /// Subscribed topics.
    pub subscribed_topic_names: Vec<String>,
    /// Subscribed regex (RE2J in Kafka; not resolved by gregor yet).
    pub subscribed_topic_regex: Option<String>,
    /// Preferred server assignor.
    pub server_assignor: Option<String>,
    /// Member epoch; -2 after a static member's temporary leave.
    pub member_epoch: i32,
    /// Previous member epoch.
    pub previous_member_epoch: i32,
    /// Partitions the member owns.
    pub assigned: Assignment,
    /// Partitions the member must revoke.
    pub pending_revocation: Assignment,
    last_sent: Option<Assignment>,
    heartbeat_deadline: i64,
    incarnation: u64,
}

/// A KIP-848 consumer group.
pub struct ConsumerGroup {
    /// Group epoch: bumped on every membership or subscription change.
    pub group_epoch: i32,
    /// Epoch of the current target assignment.
    pub assignment_epoch: i32,
    /// Members.
    pub members: BTreeMap<String, ConsumerMember>,
    /// Target assignment per member.
    pub target: BTreeMap<String, Assignment>,
    /// Subscribed topics when the target was computed: name -> (id, partitions).
    subscription_metadata: BTreeMap<String, (Uuid, i32)>,
    /// When the group last became empty (ms). Offset expiry counts from each commit for KIP-848
    /// groups, as Kafka.
    pub state_timestamp_ms: i64,
}

/// A ConsumerGroupHeartbeat as the coordinator sees it.
pub struct HeartbeatRequest {
    /// Group id.
    pub group_id: String,
    /// Member id.
    pub member_id: String,
    /// Member epoch (0 join, -1 leave, -2 static temporary leave).
    pub member_epoch: i32,
    /// Instance id.
    pub instance_id: Option<String>,
    /// Rack id.
    pub rack_id: Option<String>,
    /// Rebalance timeout (-1 unchanged).
    pub rebalance_timeout_ms: i32,
    /// Subscribed topic names (None unchanged).
    pub subscribed_topic_names: Option<Vec<String>>,
    /// Subscribed regex (None unchanged).
    pub subscribed_topic_regex: Option<String>,
    /// Server assignor (None unchanged).
    pub server_assignor: Option<String>,
    /// Owned partitions (None unchanged).
    pub owned: Option<Assignment>,
    /// Client id.
    pub client_id: String,
    /// Client host.
    pub client_host: String,
    /// Request version (v1: KIP-1082, the client chooses its member id).
    pub version: i16,
}

/// The answer to a heartbeat.
pub struct HeartbeatResponse {
    /// Error.
    pub error_code: i16,
    /// Error message.
    pub error_message: Option<String>,
    /// Member id.
    pub member_id: Option<String>,
    /// Member epoch.
    pub member_epoch: i32,
    /// Heartbeat interval.
    pub heartbeat_interval_ms: i32,
    /// Assignment, when it changed.
    pub assignment: Option<Assignment>,
}

fn hb_error(code: i16, msg: impl Into<String>) -> HeartbeatResponse {
    HeartbeatResponse {
        error_code: code,
        error_message: Some(msg.into()),
        member_id: None,
        member_epoch: -1,
        heartbeat_interval_ms: 0,
        assignment: None,
    }
}

fn count(a: &Assignment) -> usize {
    a.values().map(BTreeSet::len).sum()
}

fn minus(a: &Assignment, b: &Assignment) -> Assignment {
    let mut out = Assignment::new();
    for (t, ps) in a {
        let rest: BTreeSet<i32> = match b.get(t) {
            Some(o) => ps.difference(o).copied().collect(),
            None => ps.clone(),
        };
        if !rest.is_empty() {
            out.insert(*t, rest);
        }
    }
    out
}

fn intersect(a: &Assignment, b: &Assignment) -> Assignment {
    let mut out = Assignment::new();
    for (t, ps) in a {
        if let Some(o) = b.get(t) {
            let both: BTreeSet<i32> = ps.intersection(o).copied().collect();
            if !both.is_empty() {
                out.insert(*t, both);
            }
        }
    }
    out
}

fn overlaps(a: &Assignment, b: &Assignment) -> bool {
    count(&intersect(a, b)) > 0
}

impl ConsumerMember {
    /// A member rebuilt from `__consumer_offsets`; its metadata and assignment records fill it.
    pub(crate) fn loaded(member_id: &str) -> Self {
        Self {
            member_id: member_id.to_string(),
            instance_id: None,
            rack_id: None,
            client_id: String::new(),
            client_host: String::new(),
            rebalance_timeout_ms: -1,
            subscribed_topic_names: Vec::new(),
            subscribed_topic_regex: None,
            server_assignor: None,
            member_epoch: 0,
            previous_member_epoch: -1,
            assigned: Assignment::new(),
            pending_revocation: Assignment::new(),
            last_sent: None,
            heartbeat_deadline: 0,
            incarnation: 0,
        }
    }

    /// Applies a `ConsumerGroupMemberMetadataValue`.
    pub(crate) fn apply_metadata(&mut self, v: ConsumerMemberMetadataValue) {
        self.instance_id = v.instance_id;
        self.rack_id = v.rack_id;
        self.client_id = v.client_id;
        self.client_host = v.client_host;
        self.subscribed_topic_names = v.subscribed_topic_names;
        self.subscribed_topic_regex = v.subscribed_topic_regex;
        self.rebalance_timeout_ms = v.rebalance_timeout_ms;
        self.server_assignor = v.server_assignor;
    }

    /// Applies a `ConsumerGroupCurrentMemberAssignmentValue` (None: its tombstone).
    pub(crate) fn apply_current(&mut self, v: Option<CurrentMemberAssignmentValue>) {
        let v = v.unwrap_or_default();
        self.member_epoch = v.member_epoch;
        self.previous_member_epoch = v.previous_member_epoch;
        self.assigned = v.assigned;
        self.pending_revocation = v.pending_revocation;
        self.last_sent = None;
    }

    /// Starts a new session for a loaded member (a new coordinator gives every member a full
    /// session timeout to heartbeat again, as Kafka does on load).
    pub(crate) fn restart_session(&mut self, incarnation: u64, deadline_ms: i64) {
        self.incarnation = incarnation;
        self.heartbeat_deadline = deadline_ms;
    }

    fn metadata_value(&self) -> ConsumerMemberMetadataValue {
        ConsumerMemberMetadataValue {
            instance_id: self.instance_id.clone(),
            rack_id: self.rack_id.clone(),
            client_id: self.client_id.clone(),
            client_host: self.client_host.clone(),
            subscribed_topic_names: self.subscribed_topic_names.clone(),
            subscribed_topic_regex: self.subscribed_topic_regex.clone(),
            rebalance_timeout_ms: self.rebalance_timeout_ms,
            server_assignor: self.server_assignor.clone(),
        }
    }

    fn current_value(&self, target: Option<&Assignment>) -> CurrentMemberAssignmentValue {
        let state = if !self.pending_revocation.is_empty() {
            records::MEMBER_STATE_UNREVOKED_PARTITIONS
        } else if target.is_some_and(|t| *t != self.assigned) {
            records::MEMBER_STATE_UNRELEASED_PARTITIONS
        } else {
            records::MEMBER_STATE_STABLE
        };
        CurrentMemberAssignmentValue {
            member_epoch: self.member_epoch,
            previous_member_epoch: self.previous_member_epoch,
            state,
            assigned: self.assigned.clone(),
            pending_revocation: self.pending_revocation.clone(),
        }
    }
}

fn member_metadata_record(group_id: &str, m: &ConsumerMember) -> CoordinatorRecord {
    (
        records::consumer_group_member_metadata_key(group_id, &m.member_id),
        Some(records::consumer_group_member_metadata_value(
            &m.metadata_value(),
        )),
    )
}

fn current_assignment_record(
    group_id: &str,
    member_id: &str,
    v: &CurrentMemberAssignmentValue,
) -> CoordinatorRecord {
    (
        records::consumer_group_current_member_assignment_key(group_id, member_id),
        Some(records::consumer_group_current_member_assignment_value(v)),
    )
}

fn target_record(group_id: &str, member_id: &str, a: &Assignment) -> CoordinatorRecord {
    (
        records::consumer_group_target_assignment_member_key(group_id, member_id),
        Some(records::consumer_group_target_assignment_member_value(a)),
    )
}

/// Kafka's `removeMember`: tombstones for a member's current assignment, target assignment
/// and subscription.
fn member_removal_records(group_id: &str, member_id: &str) -> [CoordinatorRecord; 3] {
    [
        (
            records::consumer_group_current_member_assignment_key(group_id, member_id),
            None,
        ),
        (
            records::consumer_group_target_assignment_member_key(group_id, member_id),
            None,
        ),
        (
            records::consumer_group_member_metadata_key(group_id, member_id),
            None,
        ),
    ]
}

/// Kafka's `ConsumerGroup.createGroupTombstoneRecords`: every record of a deleted group, the
/// group epoch last.
pub(crate) fn group_tombstones(group_id: &str, c: &ConsumerGroup) -> Vec<CoordinatorRecord> {
    let mut recs = Vec::with_capacity(3 * c.members.len() + 3);
    for id in c.members.keys() {
        recs.push((
            records::consumer_group_current_member_assignment_key(group_id, id),
            None,
        ));
    }
    for id in c.members.keys() {
        recs.push((
            records::consumer_group_target_assignment_member_key(group_id, id),
            None,
        ));
    }
    recs.push((
        records::consumer_group_target_assignment_metadata_key(group_id),
        None,
    ));
    for id in c.members.keys() {
        recs.push((
            records::consumer_group_member_metadata_key(group_id, id),
            None,
        ));
    }
    recs.push((
        records::consumer_group_partition_metadata_key(group_id),
        None,
    ));
    recs.push((records::consumer_group_metadata_key(group_id), None));
    recs
}

impl ConsumerGroup {
    /// Applies a `ConsumerGroupPartitionMetadataValue`.
    pub(crate) fn apply_partition_metadata(&mut self, topics: BTreeMap<String, (Uuid, i32)>) {
        self.subscription_metadata = topics;
    }

    /// An empty group.
    pub fn new(now_ms: i64) -> Self {
        Self {
            group_epoch: 0,
            assignment_epoch: 0,
            members: BTreeMap::new(),
            target: BTreeMap::new(),
            subscription_metadata: BTreeMap::new(),
            state_timestamp_ms: now_ms,
        }
    }

    /// Kafka's `ConsumerGroupState` name: Empty, Assigning, Reconciling, Stable.
    pub fn state_name(&self) -> &'static str {
        if self.members.is_empty() {
            "Empty"
        } else if self.group_epoch > self.assignment_epoch {
            "Assigning"
        } else if self.members.values().any(|m| {
            m.member_epoch != self.assignment_epoch
                || !m.pending_revocation.is_empty()
                || self
                    .target
                    .get(&m.member_id)
                    .is_some_and(|t| *t != m.assigned)
        }) {
            "Reconciling"
        } else {
            "Stable"
        }
    }

    /// The assignor name used for the group: the one members prefer, or the default.
    pub fn assignor_name(&self, default: &str) -> String {
        self.members
            .values()
            .find_map(|m| m.server_assignor.clone())
            .unwrap_or_else(|| default.to_string())
    }

    /// Topics the members subscribe to, resolved against the topic metadata.
    fn resolve_subscriptions(&self, image: &dyn TopicMetadata) -> BTreeMap<String, (Uuid, i32)> {
        let mut out = BTreeMap::new();
        for m in self.members.values() {
            for t in &m.subscribed_topic_names {
                if let Some(topic) = image.topic(t) {
                    out.insert(t.clone(), topic);
                }
            }
        }
        out
    }

    /// Computes the target assignment; returns the records of what changed (Kafka's
    /// `TargetAssignmentBuilder`: one record per member whose target changed, then the
    /// assignment epoch).
    fn compute_target(
        &mut self,
        group_id: &str,
        assignor: assignor::Assignor,
    ) -> Vec<CoordinatorRecord> {
        let topics: BTreeMap<Uuid, i32> = self.subscription_metadata.values().copied().collect();
        let specs: Vec<MemberSpec<'_>> = self
            .members
            .values()
            .filter(|m| m.member_epoch != -2)
            .map(|m| MemberSpec {
                member_id: &m.member_id,
                topics: m
                    .subscribed_topic_names
                    .iter()
                    .filter_map(|t| self.subscription_metadata.get(t).map(|(id, _)| *id))
                    .collect(),
                current: self.target.get(&m.member_id),
            })
            .collect();
        let target = assignor.assign(&specs, &topics);
        let old = std::mem::replace(&mut self.target, target);
        self.assignment_epoch = self.group_epoch;
        let mut recs = Vec::new();
        for (id, a) in &self.target {
            if old.get(id) != Some(a) {
                recs.push(target_record(group_id, id, a));
            }
        }
        for id in old.keys().filter(|id| !self.target.contains_key(*id)) {
            recs.push((
                records::consumer_group_target_assignment_member_key(group_id, id),
                None,
            ));
        }
        recs.push((
            records::consumer_group_target_assignment_metadata_key(group_id),
            Some(records::consumer_group_target_assignment_metadata_value(
                self.assignment_epoch,
            )),
        ));
        recs
    }

    /// Moves a member towards its target (Kafka's `CurrentAssignmentBuilder`, simplified):
    /// first revoke what it must give up (keeping its epoch until it confirms), then take the
    /// target partitions that no other member still owns.
    fn reconcile(&mut self, member_id: &str, owned: Option<&Assignment>) {
        let target = self.target.get(member_id).cloned().unwrap_or_default();
        let others: Assignment = {
            let mut o = Assignment::new();
            for m in self.members.values().filter(|m| m.member_id != member_id) {
                for src in [&m.assigned, &m.pending_revocation] {
                    for (t, ps) in src {
                        o.entry(*t).or_default().extend(ps.iter().copied());
                    }
                }
            }
            o
        };
        let assignment_epoch = self.assignment_epoch;
        let Some(m) = self.members.get_mut(member_id) else {
            return;
        };
        if !m.pending_revocation.is_empty() {
            let confirmed = owned.is_some_and(|o| !overlaps(o, &m.pending_revocation));
            if !confirmed {
                return;
            }
            m.pending_revocation.clear();
        }
        let revoke = minus(&m.assigned, &target);
        if !revoke.is_empty() {
            m.assigned = intersect(&m.assigned, &target);
            m.pending_revocation = revoke;
            return;
        }
        let grantable = minus(&minus(&target, &m.assigned), &others);
        for (t, ps) in grantable {
            m.assigned.entry(t).or_default().extend(ps);
        }
        if m.member_epoch != assignment_epoch {
            m.previous_member_epoch = m.member_epoch;
            m.member_epoch = assignment_epoch;
        }
    }
}

impl GroupCoordinator {
    /// Bumps the group epoch and adds its record.
    fn bump_epoch(group_id: &str, c: &mut ConsumerGroup, recs: &mut Vec<CoordinatorRecord>) {
        c.group_epoch += 1;
        recs.push((
            records::consumer_group_metadata_key(group_id),
            Some(records::consumer_group_metadata_value(c.group_epoch)),
        ));
    }

    /// Writes the records of a heartbeat or session expiry. A failed append is logged (by
    /// [`GroupCoordinator::append`]) and the in-memory state is kept: the next change writes
    /// the member's records again.
    fn persist(&self, partition: i32, recs: &[CoordinatorRecord]) -> Option<PendingWrite> {
        self.append(partition, recs).ok()
    }

    /// ConsumerGroupHeartbeat (Kafka's `consumerGroupHeartbeat`). A heartbeat that changed
    /// the group is answered once its records are committed (the high watermark passes them).
    pub fn consumer_group_heartbeat(&self, req: HeartbeatRequest) -> Wait<HeartbeatResponse> {
        let mut write = None;
        let resp = self.heartbeat_and_write(req, &mut write);
        match write {
            Some(w) if resp.error_code == ErrorCode::None.code() => {
                self.when_committed(w, resp, |code| hb_error(code, ""))
            }
            _ => Wait::Ready(resp),
        }
    }

    fn heartbeat_and_write(
        &self,
        req: HeartbeatRequest,
        write: &mut Option<PendingWrite>,
    ) -> HeartbeatResponse {
        if req.group_id.is_empty() {
            return hb_error(ErrorCode::InvalidRequest.code(), "GroupId can't be empty.");
        }
        if req.instance_id.as_deref() == Some("") {
            return hb_error(
                ErrorCode::InvalidRequest.code(),
                "InstanceId can't be empty.",
            );
        }
        if req.member_epoch != 0 && req.member_id.is_empty() {
            return hb_error(ErrorCode::InvalidRequest.code(), "MemberId can't be empty.");
        }
        if req.version >= 1 && req.member_id.is_empty() {
            return hb_error(ErrorCode::InvalidRequest.code(), "MemberId can't be empty.");
        }
        if req.member_epoch == 0 {
            if req.rebalance_timeout_ms == -1 {
                return hb_error(
                    ErrorCode::InvalidRequest.code(),
                    "RebalanceTimeoutMs must be provided in first request.",
                );
            }
            if req.owned.as_ref().is_none_or(|o| !o.is_empty()) {
                return hb_error(
                    ErrorCode::InvalidRequest.code(),
                    "TopicPartitions must be empty when (re-)joining.",
                );
            }
            if req.subscribed_topic_names.is_none() && req.subscribed_topic_regex.is_none() {
                return hb_error(
                    ErrorCode::InvalidRequest.code(),
                    "SubscribedTopicNames or SubscribedTopicRegex must be set in first request.",
                );
            }
        }
        if let Some(a) = &req.server_assignor {
            if assignor::by_name(a).is_none()
                || !self
                    .config
                    .consumer_assignors
                    .iter()
                    .any(|x| x == assignor::short_name(a))
            {
                return hb_error(
                    ErrorCode::UnsupportedAssignor.code(),
                    format!(
                        "ServerAssignor {a} is not supported. Supported assignors: {}.",
                        self.config.consumer_assignors.join(", ")
                    ),
                );
            }
        }
        let partition = match self.check_coordinator(&req.group_id) {
            Ok(p) => p,
            Err(e) => return hb_error(e, ""),
        };
        let image = self.metadata.clone();
        let mut timers = Vec::new();
        let mut st = self.state.lock();
        let incarnation = st.next_id();
        if !st.groups.contains_key(&req.group_id) {
            if req.member_epoch != 0 {
                return hb_error(
                    ErrorCode::UnknownMemberId.code(),
                    format!(
                        "Member {} is not a member of group {}.",
                        req.member_id, req.group_id
                    ),
                );
            }
            st.groups.insert(
                req.group_id.clone(),
                Group {
                    group_id: req.group_id.clone(),
                    offsets: BTreeMap::new(),
                    kind: GroupKind::Consumer(ConsumerGroup::new(self.now_ms())),
                },
            );
        }
        let Some(group) = st.groups.get_mut(&req.group_id) else {
            return hb_error(ErrorCode::UnknownServerError.code(), "");
        };
        if let GroupKind::Classic(c) = &group.kind {
            if c.members.is_empty() && c.pending_members.is_empty() {
                // An empty classic group (offsets only) becomes a consumer group.
                let mut cg = ConsumerGroup::new(self.now_ms());
                cg.group_epoch = c.generation_id.max(0);
                cg.assignment_epoch = cg.group_epoch;
                group.kind = GroupKind::Consumer(cg);
            } else {
                return hb_error(
                    ErrorCode::GroupIdNotFound.code(),
                    format!("Group {} is not a consumer group.", req.group_id),
                );
            }
        }
        let GroupKind::Consumer(c) = &mut group.kind else {
            return hb_error(ErrorCode::UnknownServerError.code(), "");
        };
        let default_assignor = self
            .config
            .consumer_assignors
            .first()
            .cloned()
            .unwrap_or_else(|| "uniform".into());
        // KIP-848 group configs set with AlterConfigs take precedence over the broker's.
        let group_int = |name: &str| {
            self.metadata
                .group_config(&req.group_id, name)
                .and_then(|v| v.trim().parse::<i32>().ok())
        };
        let interval = group_int("consumer.heartbeat.interval.ms")
            .unwrap_or(self.config.consumer_heartbeat_interval_ms);
        let session = i64::from(
            group_int("consumer.session.timeout.ms")
                .unwrap_or(self.config.consumer_session_timeout_ms),
        );

        // Leaving.
        if req.member_epoch == -1 || req.member_epoch == -2 {
            let Some(m) = c.members.get_mut(&req.member_id) else {
                return hb_error(
                    ErrorCode::UnknownMemberId.code(),
                    format!(
                        "Member {} is not a member of group {}.",
                        req.member_id, req.group_id
                    ),
                );
            };
            if req.member_epoch == -2 && m.instance_id.is_some() {
                // KIP-848 static member leaving temporarily: it keeps its assignment until its
                // session times out or the instance rejoins.
                m.member_epoch = -2;
                let v = m.current_value(c.target.get(&req.member_id));
                *write = self.persist(
                    partition,
                    &[current_assignment_record(&req.group_id, &req.member_id, &v)],
                );
                return HeartbeatResponse {
                    error_code: ErrorCode::None.code(),
                    error_message: None,
                    member_id: Some(req.member_id),
                    member_epoch: -2,
                    heartbeat_interval_ms: 0,
                    assignment: None,
                };
            }
            c.members.remove(&req.member_id);
            c.target.remove(&req.member_id);
            info!(
                group = req.group_id,
                member = req.member_id,
                "consumer group member left"
            );
            let mut recs = member_removal_records(&req.group_id, &req.member_id).to_vec();
            Self::bump_epoch(&req.group_id, c, &mut recs);
            *write = self.persist(partition, &recs);
            if c.members.is_empty() {
                c.state_timestamp_ms = self.now_ms();
            }
            return HeartbeatResponse {
                error_code: ErrorCode::None.code(),
                error_message: None,
                member_id: Some(req.member_id),
                member_epoch: -1,
                heartbeat_interval_ms: 0,
                assignment: None,
            };
        }

        let mut bump = false;
        let member_id = if req.member_id.is_empty() {
            Uuid::new_v4().to_string()
        } else {
            req.member_id.clone()
        };
        // What is persisted of this member now; the records of what the heartbeat changes are
        // written at its end, in Kafka's order: removed members, the member's subscription,
        // the subscribed topics and group epoch, the target assignment, the member's current
        // assignment.
        let before = c.members.get(&member_id).map(|m| {
            (
                m.metadata_value(),
                m.current_value(c.target.get(&member_id)),
            )
        });
        let mut removed_recs: Vec<CoordinatorRecord> = Vec::new();
        let mut epoch_recs: Vec<CoordinatorRecord> = Vec::new();
        let mut target_recs: Vec<CoordinatorRecord> = Vec::new();
        if req.member_epoch == 0 {
            if !c.members.contains_key(&member_id) {
                if c.members.len() >= self.config.consumer_max_size {
                    return hb_error(
                        ErrorCode::GroupMaxSizeReached.code(),
                        format!(
                            "The consumer group has reached its maximum capacity of {} members.",
                            self.config.consumer_max_size
                        ),
                    );
                }
                let mut inherited = (Assignment::new(), None);
                if let Some(i) = &req.instance_id {
                    if let Some(old) = c
                        .members
                        .values()
                        .find(|m| m.instance_id.as_deref() == Some(i))
                        .map(|m| (m.member_id.clone(), m.member_epoch))
                    {
                        if old.1 != -2 {
                            return hb_error(ErrorCode::UnreleasedInstanceId.code(), format!("Static member {} with instance id {i} cannot join the group because the instance id is owned by {} member.", member_id, old.0));
                        }
                        if let Some(o) = c.members.remove(&old.0) {
                            inherited = (o.assigned, c.target.remove(&old.0));
                            removed_recs.extend(member_removal_records(&req.group_id, &old.0));
                        }
                    }
                }
                let had_target = inherited.1.is_some();
                if let Some(t) = inherited.1 {
                    target_recs.push(target_record(&req.group_id, &member_id, &t));
                    c.target.insert(member_id.clone(), t);
                }
                c.members.insert(
                    member_id.clone(),
                    ConsumerMember {
                        member_id: member_id.clone(),
                        instance_id: req.instance_id.clone(),
                        rack_id: req.rack_id.clone(),
                        client_id: req.client_id.clone(),
                        client_host: req.client_host.clone(),
                        rebalance_timeout_ms: req.rebalance_timeout_ms,
                        subscribed_topic_names: Vec::new(),
                        subscribed_topic_regex: None,
                        server_assignor: None,
                        member_epoch: 0,
                        previous_member_epoch: -1,
                        assigned: inherited.0,
                        pending_revocation: Assignment::new(),
                        last_sent: None,
                        heartbeat_deadline: self.now_ms() + session,
                        incarnation,
                    },
                );
                timers.push((member_id.clone(), incarnation));
                if !had_target {
                    bump = true;
                }
                info!(
                    group = req.group_id,
                    member = member_id,
                    "consumer group member joined"
                );
            } else if let Some(m) = c.members.get_mut(&member_id) {
                // Rejoining with epoch 0: it lost its partitions.
                m.assigned.clear();
                m.pending_revocation.clear();
                m.last_sent = None;
                m.member_epoch = 0;
            }
        }
        let Some(m) = c.members.get_mut(&member_id) else {
            return hb_error(
                ErrorCode::UnknownMemberId.code(),
                format!(
                    "Member {member_id} is not a member of group {}.",
                    req.group_id
                ),
            );
        };
        if req.member_epoch > 0 && req.member_epoch != m.member_epoch {
            let lenient = req.member_epoch == m.previous_member_epoch
                && req
                    .owned
                    .as_ref()
                    .is_some_and(|o| minus(o, &m.assigned).is_empty());
            if !lenient {
                return hb_error(ErrorCode::FencedMemberEpoch.code(), format!("The consumer group member has a smaller member epoch ({}) than the one known by the group coordinator ({}). The member must abandon all its partitions and rejoin.", req.member_epoch, m.member_epoch));
            }
        }
        m.heartbeat_deadline = self.now_ms() + session;
        if let Some(names) = &req.subscribed_topic_names {
            let mut names = names.clone();
            names.sort();
            names.dedup();
            if names != m.subscribed_topic_names {
                m.subscribed_topic_names = names;
                bump = true;
            }
        }
        if req.subscribed_topic_regex.is_some()
            && req.subscribed_topic_regex != m.subscribed_topic_regex
        {
            m.subscribed_topic_regex = req.subscribed_topic_regex.clone();
        }
        if req.server_assignor.is_some() && req.server_assignor != m.server_assignor {
            m.server_assignor = req
                .server_assignor
                .as_deref()
                .map(|a| assignor::short_name(a).to_string());
            bump = true;
        }
        if req.rebalance_timeout_ms >= 0 {
            m.rebalance_timeout_ms = req.rebalance_timeout_ms;
        }
        if req.rack_id.is_some() {
            m.rack_id = req.rack_id.clone();
        }
        let new_metadata = c.resolve_subscriptions(image.as_ref());
        if new_metadata != c.subscription_metadata {
            epoch_recs.push((
                records::consumer_group_partition_metadata_key(&req.group_id),
                Some(records::consumer_group_partition_metadata_value(
                    &new_metadata,
                )),
            ));
            c.subscription_metadata = new_metadata;
            bump = true;
        }
        if bump {
            Self::bump_epoch(&req.group_id, c, &mut epoch_recs);
        }
        if c.group_epoch > c.assignment_epoch {
            let a = assignor::by_name(&c.assignor_name(&default_assignor))
                .unwrap_or(assignor::Assignor::Uniform);
            target_recs.extend(c.compute_target(&req.group_id, a));
        }
        c.reconcile(&member_id, req.owned.as_ref());
        let Some(m) = c.members.get(&member_id) else {
            return hb_error(ErrorCode::UnknownServerError.code(), "");
        };
        let after = (
            m.metadata_value(),
            m.current_value(c.target.get(&member_id)),
        );
        let mut recs = removed_recs;
        if before.as_ref().map(|b| &b.0) != Some(&after.0) {
            recs.push(member_metadata_record(&req.group_id, m));
        }
        recs.extend(epoch_recs);
        recs.extend(target_recs);
        if before.as_ref().map(|b| &b.1) != Some(&after.1) {
            recs.push(current_assignment_record(
                &req.group_id,
                &member_id,
                &after.1,
            ));
        }
        *write = self.persist(partition, &recs);
        let Some(m) = c.members.get_mut(&member_id) else {
            return hb_error(ErrorCode::UnknownServerError.code(), "");
        };
        let assignment = if m.last_sent.as_ref() != Some(&m.assigned) || req.member_epoch == 0 {
            m.last_sent = Some(m.assigned.clone());
            Some(m.assigned.clone())
        } else {
            None
        };
        let resp = HeartbeatResponse {
            error_code: ErrorCode::None.code(),
            error_message: None,
            member_id: Some(member_id.clone()),
            member_epoch: m.member_epoch,
            heartbeat_interval_ms: interval,
            assignment,
        };
        drop(st);
        self.schedule_timers(
            timers
                .into_iter()
                .map(|(member_id, incarnation)| Timer::ConsumerSession {
                    group_id: req.group_id.clone(),
                    member_id,
                    incarnation,
                    delay_ms: session.max(0) as u64,
                })
                .collect(),
        );
        resp
    }

    pub(crate) fn expire_consumer_member(
        &self,
        group_id: &str,
        member_id: &str,
        incarnation: u64,
    ) -> Option<i64> {
        let partition = self.partition_for(group_id);
        let mut st = self.state.lock();
        let group = st.groups.get_mut(group_id)?;
        let GroupKind::Consumer(c) = &mut group.kind else {
            return None;
        };
        let m = c.members.get(member_id)?;
        if m.incarnation != incarnation {
            return None;
        }
        if m.heartbeat_deadline > self.now_ms() {
            return Some(m.heartbeat_deadline);
        }
        info!(
            group = group_id,
            member = member_id,
            "consumer group member's session timed out; removing it"
        );
        c.members.remove(member_id);
        c.target.remove(member_id);
        let mut recs = member_removal_records(group_id, member_id).to_vec();
        Self::bump_epoch(group_id, c, &mut recs);
        self.persist(partition, &recs);
        if c.members.is_empty() {
            c.state_timestamp_ms = self.now_ms();
        }
        None
    }
}

/// A consumer group as ConsumerGroupDescribe reports it.
pub struct DescribedConsumerGroup {
    /// Error.
    pub error_code: i16,
    /// Message.
    pub error_message: Option<String>,
    /// State.
    pub state: String,
    /// Group epoch.
    pub group_epoch: i32,
    /// Assignment epoch.
    pub assignment_epoch: i32,
    /// Assignor.
    pub assignor_name: String,
    /// Members: (member, target assignment).
    pub members: Vec<DescribedConsumerMember>,
}

/// A member in ConsumerGroupDescribe.
pub struct DescribedConsumerMember {
    /// Member id.
    pub member_id: String,
    /// Instance id.
    pub instance_id: Option<String>,
    /// Rack.
    pub rack_id: Option<String>,
    /// Epoch.
    pub member_epoch: i32,
    /// Client id.
    pub client_id: String,
    /// Client host.
    pub client_host: String,
    /// Subscribed topics.
    pub subscribed_topic_names: Vec<String>,
    /// Regex.
    pub subscribed_topic_regex: Option<String>,
    /// Current assignment.
    pub assignment: Assignment,
    /// Target assignment.
    pub target_assignment: Assignment,
}

impl GroupCoordinator {
    /// ConsumerGroupDescribe for one group: GROUP_ID_NOT_FOUND for unknown or classic groups.
    pub fn describe_consumer_group(&self, group_id: &str) -> DescribedConsumerGroup {
        let err = |code: i16, msg: Option<String>| DescribedConsumerGroup {
            error_code: code,
            error_message: msg,
            state: String::new(),
            group_epoch: 0,
            assignment_epoch: 0,
            assignor_name: String::new(),
            members: vec![],
        };
        if group_id.is_empty() {
            return err(
                ErrorCode::InvalidGroupId.code(),
                Some("Group ID can't be empty.".into()),
            );
        }
        if let Err(e) = self.check_coordinator(group_id) {
            return err(e, None);
        }
        let st = self.state.lock();
        let Some(g) = st.groups.get(group_id) else {
            return err(
                ErrorCode::GroupIdNotFound.code(),
                Some(format!("Group {group_id} not found.")),
            );
        };
        let GroupKind::Consumer(c) = &g.kind else {
            return err(
                ErrorCode::GroupIdNotFound.code(),
                Some(format!("Group {group_id} is not a consumer group.")),
            );
        };
        let default = self
            .config
            .consumer_assignors
            .first()
            .cloned()
            .unwrap_or_default();
        DescribedConsumerGroup {
            error_code: ErrorCode::None.code(),
            error_message: None,
            state: c.state_name().into(),
            group_epoch: c.group_epoch,
            assignment_epoch: c.assignment_epoch,
            assignor_name: c.assignor_name(&default),
            members: c
                .members
                .values()
                .map(|m| DescribedConsumerMember {
                    member_id: m.member_id.clone(),
                    instance_id: m.instance_id.clone(),
                    rack_id: m.rack_id.clone(),
                    member_epoch: m.member_epoch,
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    subscribed_topic_names: m.subscribed_topic_names.clone(),
                    subscribed_topic_regex: m.subscribed_topic_regex.clone(),
                    assignment: m.assigned.clone(),
                    target_assignment: c.target.get(&m.member_id).cloned().unwrap_or_default(),
                })
                .collect(),
        }
    }
}
