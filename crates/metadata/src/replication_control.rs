//! Partition changes on the active controller (the partition parts of Kafka's
//! `ReplicationControlManager`, and its `PartitionChangeBuilder`): AlterPartition from partition
//! leaders (ISR shrink and expand, KIP-497; broker epochs of new ISR members, KIP-903; leader
//! recovery, KIP-704), with eligible leader replicas maintained as KIP-966 says.
//!
//! Every change of a partition is one `PartitionChangeRecord` built by
//! [`PartitionChangeBuilder`] from a target (ISR, replicas, adding/removing replicas, leader
//! recovery state) and an election type: it completes a reassignment whose target replicas are
//! all in the ISR, keeps the ELR, elects a leader when the current one is not acceptable, bumps
//! the leader epoch when replicas are removed (not on an ISR shrink: metadata version >= 3.6),
//! and writes only the fields that change (no record when nothing does).

use gregor_protocol::error::ErrorCode;
use gregor_protocol::kafka_protocol::messages::alter_partition_reassignments_response::{
    ReassignablePartitionResponse, ReassignableTopicResponse,
};
use gregor_protocol::kafka_protocol::messages::alter_partition_response::{
    PartitionData as AlterPartitionResponsePartition, TopicData as AlterPartitionResponseTopic,
};
use gregor_protocol::kafka_protocol::messages::elect_leaders_response::{
    PartitionResult as ElectLeadersPartitionResult, ReplicaElectionResult,
};
use gregor_protocol::kafka_protocol::messages::list_partition_reassignments_response::{
    OngoingPartitionReassignment, OngoingTopicReassignment,
};
use gregor_protocol::kafka_protocol::messages::{
    AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse, AlterPartitionRequest,
    AlterPartitionResponse, BrokerId, ElectLeadersResponse, ListPartitionReassignmentsResponse,
    TopicName,
};
use gregor_protocol::kafka_protocol::protocol::StrBytes;
use gregor_protocol::metadata_records::PartitionChangeRecord;
use uuid::Uuid;

use crate::controller::{Controller, ControllerError, ControllerResult};
use crate::image::{
    MetadataImage, PartitionRegistration, ELR_FEATURE, MV_3_7_IV2, NO_LEADER, NO_LEADER_CHANGE,
};
use crate::record::{ConfigResource, MetadataRecord};

/// `unclean.leader.election.enable`.
pub const UNCLEAN_LEADER_ELECTION_ENABLE: &str = "unclean.leader.election.enable";

/// `LeaderRecoveryState.RECOVERED`.
pub const LEADER_RECOVERED: i8 = 0;
/// `LeaderRecoveryState.RECOVERING`: the leader was elected uncleanly and has not yet told the
/// controller (AlterPartition) that it recovered (KIP-704).
pub const LEADER_RECOVERING: i8 = 1;

/// `metadata.version` 3.6-IV0: from here an ISR shrink does not bump the leader epoch.
const MV_3_6_IV0: i16 = 12;

/// How a [`PartitionChangeBuilder`] picks a leader (Kafka's `PartitionChangeBuilder.Election`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Election {
    /// The first replica if it is a valid leader, else as [`Election::Online`] (KIP-460).
    Preferred,
    /// Keep the leader if it is valid, else the first valid replica of the ISR (or ELR).
    Online,
    /// As [`Election::Online`], else any acceptable replica (data may be lost; the leader
    /// then recovers, `LeaderRecoveryState` RECOVERING).
    Unclean,
}

/// Builds the `PartitionChangeRecord` that moves one partition to a target state, as Kafka's
/// `PartitionChangeBuilder.build`.
pub struct PartitionChangeBuilder<'a> {
    partition: &'a PartitionRegistration,
    topic_id: Uuid,
    partition_id: i32,
    acceptable: Box<dyn Fn(i32) -> bool + 'a>,
    default_dir: Box<dyn Fn(i32) -> Uuid + 'a>,
    min_isr: usize,
    elr_enabled: bool,
    metadata_version: i16,
    election: Election,
    target_isr: Vec<i32>,
    target_replicas: Vec<i32>,
    target_removing: Vec<i32>,
    target_adding: Vec<i32>,
    target_elr: Vec<i32>,
    target_last_known_elr: Vec<i32>,
    target_leader_recovery_state: i8,
    unclean_shutdown_replicas: Vec<i32>,
    /// Directories set for replicas (`setDirectory`), over the partition's own.
    target_directories: Vec<(i32, Uuid)>,
}

/// The replicas, ISR and adding/removing replicas after a reassignment completes
/// (`PartitionReassignmentReplicas.maybeCompleteReassignment`): None while a target replica
/// is not in the ISR, or when removing replicas would leave no ISR or replicas.
fn complete_reassignment(
    removing: &[i32],
    adding: &[i32],
    replicas: &[i32],
    isr: &[i32],
) -> Option<(Vec<i32>, Vec<i32>)> {
    if removing.is_empty() && adding.is_empty() {
        return None;
    }
    let new_isr: Vec<i32> = isr
        .iter()
        .copied()
        .filter(|r| !removing.contains(r))
        .collect();
    let new_replicas: Vec<i32> = replicas
        .iter()
        .copied()
        .filter(|r| !removing.contains(r))
        .collect();
    if new_isr.is_empty() || new_replicas.is_empty() {
        return None;
    }
    new_replicas
        .iter()
        .all(|r| new_isr.contains(r))
        .then_some((new_replicas, new_isr))
}

/// Whether a reassignment of the partition is in progress (adding or removing replicas).
pub fn reassignment_in_progress(p: &PartitionRegistration) -> bool {
    !p.adding_replicas.is_empty() || !p.removing_replicas.is_empty()
}

impl<'a> PartitionChangeBuilder<'a> {
    /// A builder for `partition` of `topic_id` whose target is its current state; leaders are
    /// acceptable when `acceptable` says so (Kafka's `LeaderAcceptor`: an active broker).
    pub fn new(
        image: &'a MetadataImage,
        partition: &'a PartitionRegistration,
        topic_id: Uuid,
        partition_id: i32,
        acceptable: impl Fn(i32) -> bool + 'a,
    ) -> Self {
        let topic_name = image
            .topic_by_id(&topic_id)
            .map(|t| t.name.clone())
            .unwrap_or_default();
        Self {
            partition,
            topic_id,
            partition_id,
            acceptable: Box::new(acceptable),
            default_dir: Box::new(move |b| Controller::default_dir(image, b)),
            min_isr: effective_min_isr(image, &topic_name, partition.replicas.len()),
            elr_enabled: elr_enabled(image),
            metadata_version: image.metadata_version().unwrap_or(i16::MAX),
            election: Election::Online,
            target_isr: partition.isr.clone(),
            target_replicas: partition.replicas.clone(),
            target_removing: partition.removing_replicas.clone(),
            target_adding: partition.adding_replicas.clone(),
            target_elr: partition.elr.clone(),
            target_last_known_elr: partition.last_known_elr.clone(),
            target_leader_recovery_state: partition.leader_recovery_state,
            unclean_shutdown_replicas: Vec::new(),
            target_directories: Vec::new(),
        }
    }

    /// Overrides whether ELR is maintained (KIP-966) and the minimum ISR (tests).
    pub fn with_elr(mut self, enabled: bool, min_isr: usize) -> Self {
        self.elr_enabled = enabled;
        self.min_isr = min_isr;
        self
    }

    /// The ISR wanted.
    pub fn target_isr(mut self, isr: Vec<i32>) -> Self {
        self.target_isr = isr;
        self
    }

    /// The replicas wanted.
    pub fn target_replicas(mut self, replicas: Vec<i32>) -> Self {
        self.target_replicas = replicas;
        self
    }

    /// The replicas a reassignment is removing.
    pub fn target_removing(mut self, removing: Vec<i32>) -> Self {
        self.target_removing = removing;
        self
    }

    /// The replicas a reassignment is adding.
    pub fn target_adding(mut self, adding: Vec<i32>) -> Self {
        self.target_adding = adding;
        self
    }

    /// The leader recovery state wanted (KIP-704).
    pub fn target_leader_recovery_state(mut self, state: i8) -> Self {
        self.target_leader_recovery_state = state;
        self
    }

    /// The election type.
    pub fn election(mut self, election: Election) -> Self {
        self.election = election;
        self
    }

    /// The log directory of `broker`'s replica (`setDirectory`, KIP-858): written from
    /// `metadata.version` 3.7-IV2 when the broker is among the target replicas.
    pub fn directory(mut self, broker: i32, dir: Uuid) -> Self {
        self.target_directories.retain(|(b, _)| *b != broker);
        self.target_directories.push((broker, dir));
        self
    }

    /// Replicas that shut down uncleanly: left out of the ELR (KIP-966).
    pub fn unclean_shutdown_replicas(mut self, replicas: Vec<i32>) -> Self {
        self.unclean_shutdown_replicas = replicas;
        self
    }

    fn is_valid_leader(&self, r: i32) -> bool {
        (self.target_isr.contains(&r)
            || (self.target_isr.is_empty() && self.target_elr.contains(&r)))
            && (self.acceptable)(r)
    }

    fn can_elect_last_known_leader(&self) -> bool {
        self.elr_enabled
            && self.target_elr.is_empty()
            && self.target_isr.is_empty()
            && self.partition.last_known_elr.len() == 1
    }

    /// `electLeader`: the new leader and whether the election is unclean.
    fn elect_leader(&self) -> (i32, bool) {
        let p = self.partition;
        if self.election == Election::Preferred {
            if let Some(&first) = self.target_replicas.first() {
                if self.is_valid_leader(first) {
                    return (first, false);
                }
            }
        }
        if self.is_valid_leader(p.leader) {
            return (p.leader, false);
        }
        let skip = usize::from(self.election == Election::Preferred);
        if let Some(r) = self
            .target_replicas
            .iter()
            .skip(skip)
            .copied()
            .find(|r| self.is_valid_leader(*r))
        {
            return (r, false);
        }
        if self.can_elect_last_known_leader() {
            return (p.last_known_elr[0], true);
        }
        if self.election == Election::Unclean {
            if let Some(r) = self
                .target_replicas
                .iter()
                .copied()
                .find(|r| (self.acceptable)(*r))
            {
                return (r, true);
            }
        }
        (NO_LEADER, false)
    }

    /// The record of the change, None when nothing changes.
    pub fn build(mut self) -> Option<PartitionChangeRecord> {
        let p = self.partition;
        let mut record = PartitionChangeRecord {
            topic_id: self.topic_id,
            partition_id: self.partition_id,
            ..PartitionChangeRecord::default()
        };
        // completeReassignmentIfNeeded
        if let Some((replicas, isr)) = complete_reassignment(
            &self.target_removing,
            &self.target_adding,
            &self.target_replicas,
            &self.target_isr,
        ) {
            self.target_isr = isr;
            self.target_replicas = replicas;
            self.target_removing.clear();
            self.target_adding.clear();
        }
        self.populate_target_elr();
        // tryElection
        let (leader, unclean) = self.elect_leader();
        if leader != p.leader {
            if self.target_elr.contains(&leader) {
                self.target_isr = vec![leader];
                self.target_elr.retain(|r| *r != leader);
            }
            record.leader = leader;
            if unclean {
                record.isr = Some(vec![leader]);
                if p.leader_recovery_state != LEADER_RECOVERING {
                    record.leader_recovery_state = LEADER_RECOVERING;
                }
            }
        }
        // triggerLeaderEpochBumpForReplicaReassignmentIfNeeded
        if record.leader == NO_LEADER_CHANGE
            && !p.replicas.iter().all(|r| self.target_replicas.contains(r))
        {
            record.leader = p.leader;
        }
        self.update_record_elr(&mut record);
        if record.isr.is_none()
            && (!self.target_isr.is_empty() || self.elr_enabled)
            && self.target_isr != p.isr
        {
            record.isr = Some(self.target_isr.clone());
        }
        // triggerLeaderEpochBumpForIsrShrinkIfNeeded (metadata versions before 3.6)
        if self.metadata_version < MV_3_6_IV0 && record.leader == NO_LEADER_CHANGE {
            if let Some(isr) = &record.isr {
                if !p.isr.iter().all(|r| isr.contains(r)) {
                    record.leader = p.leader;
                }
            }
        }
        self.update_last_known_leader(&mut record);
        self.set_assignment_changes(&mut record);
        if self.target_leader_recovery_state != p.leader_recovery_state
            && record.leader_recovery_state == -1
        {
            record.leader_recovery_state = self.target_leader_recovery_state;
        }
        let no_op = PartitionChangeRecord {
            topic_id: self.topic_id,
            partition_id: self.partition_id,
            ..PartitionChangeRecord::default()
        };
        (record != no_op).then_some(record)
    }

    /// `maybePopulateTargetElr`.
    fn populate_target_elr(&mut self) {
        if !self.elr_enabled {
            return;
        }
        if self.target_isr.len() >= self.min_isr {
            self.target_elr.clear();
            self.target_last_known_elr.clear();
            return;
        }
        // Kafka unions the ELR and the ISR in a hash set: small ids come out in order.
        let mut candidates: Vec<i32> = self.target_elr.clone();
        candidates.extend(self.partition.isr.iter().copied());
        candidates.sort_unstable();
        candidates.dedup();
        let elr: Vec<i32> = candidates
            .iter()
            .copied()
            .filter(|r| !self.target_isr.contains(r) && !self.unclean_shutdown_replicas.contains(r))
            .collect();
        let mut last_known = candidates;
        last_known.extend(self.target_last_known_elr.iter().copied());
        last_known.sort_unstable();
        last_known.dedup();
        self.target_last_known_elr = last_known
            .into_iter()
            .filter(|r| !self.target_isr.contains(r) && !elr.contains(r))
            .collect();
        self.target_elr = elr;
    }

    /// `maybeUpdateRecordElr` (the last known ELR keeps only the last known leader, Kafka's
    /// default `useLastKnownLeaderInBalancedRecovery`).
    fn update_record_elr(&mut self, record: &mut PartitionChangeRecord) {
        let clean = record.isr.is_none();
        if !clean || !self.elr_enabled {
            self.target_elr.clear();
            self.target_last_known_elr.clear();
        }
        if self.target_elr != self.partition.elr {
            record.eligible_leader_replicas = Some(self.target_elr.clone());
        }
    }

    /// `maybeUpdateLastKnownLeader`.
    fn update_last_known_leader(&self, record: &mut PartitionChangeRecord) {
        if !self.elr_enabled {
            return;
        }
        let p = self.partition;
        let emptied = record.isr.as_ref().is_some_and(Vec::is_empty);
        if emptied && (p.last_known_elr.len() != 1 || p.last_known_elr[0] != p.leader) {
            record.last_known_elr = Some(vec![p.leader]);
        } else if (record.leader >= 0 || (p.leader != NO_LEADER && record.leader != NO_LEADER))
            && !p.last_known_elr.is_empty()
        {
            record.last_known_elr = Some(vec![]);
        }
    }

    /// `setAssignmentChanges`: replicas, their directories, adding and removing replicas.
    fn set_assignment_changes(&self, record: &mut PartitionChangeRecord) {
        let p = self.partition;
        if !self.target_replicas.is_empty() {
            if self.metadata_version >= MV_3_7_IV2 {
                let directories: Vec<Uuid> = self
                    .target_replicas
                    .iter()
                    .map(|r| {
                        self.target_directories
                            .iter()
                            .find(|(b, _)| b == r)
                            .map(|(_, d)| *d)
                            .or_else(|| {
                                p.replicas
                                    .iter()
                                    .position(|x| x == r)
                                    .and_then(|i| p.directories.get(i).copied())
                            })
                            .unwrap_or_else(|| (self.default_dir)(*r))
                    })
                    .collect();
                if directories != p.directories {
                    record.directories = Some(directories);
                }
            }
            if self.target_replicas != p.replicas {
                record.replicas = Some(self.target_replicas.clone());
            }
        }
        if self.target_removing != p.removing_replicas {
            record.removing_replicas = Some(self.target_removing.clone());
        }
        if self.target_adding != p.adding_replicas {
            record.adding_replicas = Some(self.target_adding.clone());
        }
    }
}

/// Whether ELR is maintained: `eligible.leader.replicas.version` >= 1 (KIP-966).
pub fn elr_enabled(image: &MetadataImage) -> bool {
    image
        .features
        .get(ELR_FEATURE)
        .is_some_and(|level| *level >= 1)
}

/// A config of a topic: its own, else the cluster default (the dynamic default broker config).
fn topic_config<'i>(image: &'i MetadataImage, topic: &str, name: &str) -> Option<&'i String> {
    image
        .configs
        .get(&(ConfigResource::Topic, topic.to_string()))
        .and_then(|c| c.get(name))
        .or_else(|| {
            image
                .configs
                .get(&(ConfigResource::Broker, String::new()))
                .and_then(|c| c.get(name))
        })
}

/// `min.insync.replicas` of a topic (its own, else the cluster default, else Kafka's default
/// 1), at most its replication factor (`getTopicEffectiveMinIsr`).
pub fn effective_min_isr(image: &MetadataImage, topic: &str, replication_factor: usize) -> usize {
    let configured = topic_config(image, topic, "min.insync.replicas")
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(1);
    configured.min(replication_factor.max(1))
}

impl Controller {
    /// `unclean.leader.election.enable` of a topic: its own, else the cluster default, else
    /// the controller's static config ([`crate::controller::ControllerConfig`]).
    pub fn unclean_leader_election_enabled(&self, topic: &str) -> bool {
        topic_config(&self.image, topic, UNCLEAN_LEADER_ELECTION_ENABLE)
            .map(|v| v.trim().eq_ignore_ascii_case("true"))
            .unwrap_or(self.config.unclean_leader_election_enable)
    }

    /// AlterPartition (API 56, v2-3) from a partition leader, as Kafka's
    /// `ReplicationControlManager.alterPartition`: the sender's broker epoch must be its
    /// registration's; then per partition the new ISR (and leader recovery state, KIP-704) is
    /// validated and, when it changes anything, written as a `PartitionChangeRecord` (partition
    /// epoch + 1; the leader epoch stays for an ISR change). The answer per partition is the
    /// partition's state after the change, or its error: UNKNOWN_TOPIC_ID,
    /// UNKNOWN_TOPIC_OR_PARTITION, NOT_CONTROLLER (the leader knows a newer epoch than this
    /// controller), FENCED_LEADER_EPOCH, INVALID_REQUEST (the sender does not lead, an ISR
    /// member outside the replicas, an ISR without the leader, more than one ISR member while
    /// recovering, RECOVERED to RECOVERING), INVALID_UPDATE_VERSION (stale partition epoch),
    /// INELIGIBLE_REPLICA (a new ISR member not registered, fenced, in controlled shutdown or
    /// with another broker epoch, KIP-903), NEW_LEADER_ELECTED (the change completed a
    /// reassignment that moved leadership).
    ///
    /// v2 requests carry `NewIsr`, v3 `NewIsrWithEpochs`; the one that is not empty is used
    /// (an ISR without the leader is invalid in both).
    ///
    /// # Errors
    /// STALE_BROKER_EPOCH for the whole request.
    pub fn alter_partition(
        &self,
        request: AlterPartitionRequest,
    ) -> Result<ControllerResult<AlterPartitionResponse>, ControllerError> {
        let broker_id = request.broker_id.0;
        self.check_broker_epoch(broker_id, request.broker_epoch)?;
        let image = &self.image;
        let mut records = Vec::new();
        let mut response = AlterPartitionResponse::default();
        for topic in &request.topics {
            let mut out = AlterPartitionResponseTopic::default().with_topic_id(topic.topic_id);
            let known = image
                .topic_by_id(&topic.topic_id)
                .filter(|_| !topic.topic_id.is_nil());
            let Some(t) = known else {
                for pd in &topic.partitions {
                    out.partitions.push(
                        AlterPartitionResponsePartition::default()
                            .with_partition_index(pd.partition_index)
                            .with_error_code(ErrorCode::UnknownTopicId.code()),
                    );
                }
                response.topics.push(out);
                continue;
            };
            for pd in &topic.partitions {
                let new_isr: Vec<(i32, i64)> = if pd.new_isr_with_epochs.is_empty() {
                    pd.new_isr.iter().map(|b| (b.0, -1)).collect()
                } else {
                    pd.new_isr_with_epochs
                        .iter()
                        .map(|b| (b.broker_id.0, b.broker_epoch))
                        .collect()
                };
                let error_of = |code: ErrorCode| {
                    AlterPartitionResponsePartition::default()
                        .with_partition_index(pd.partition_index)
                        .with_error_code(code.code())
                };
                let Some(p) = t.partitions.get(&pd.partition_index) else {
                    out.partitions
                        .push(error_of(ErrorCode::UnknownTopicOrPartition));
                    continue;
                };
                if let Err(code) = self.validate_alter_partition(broker_id, p, pd, &new_isr) {
                    tracing::info!(
                        broker_id,
                        topic = %t.name,
                        partition = pd.partition_index,
                        error = code.name(),
                        "rejecting AlterPartition"
                    );
                    out.partitions.push(error_of(code));
                    continue;
                }
                let mut builder =
                    PartitionChangeBuilder::new(image, p, t.topic_id, pd.partition_index, |r| {
                        self.is_acceptable_leader(p, r)
                    })
                    .target_isr(new_isr.iter().map(|(id, _)| *id).collect())
                    .target_leader_recovery_state(pd.leader_recovery_state);
                if self.unclean_leader_election_enabled(&t.name) {
                    builder = builder.election(Election::Unclean);
                }
                let mut after = p.clone();
                if let Some(change) = builder.build() {
                    after = p.merge(&change);
                    records.push(change.clone().into());
                    if change.leader != broker_id && change.leader != NO_LEADER_CHANGE {
                        // The ISR change completed a reassignment that moved leadership.
                        out.partitions.push(error_of(ErrorCode::NewLeaderElected));
                        continue;
                    }
                }
                out.partitions.push(
                    AlterPartitionResponsePartition::default()
                        .with_partition_index(pd.partition_index)
                        .with_leader_id(BrokerId(after.leader))
                        .with_leader_epoch(after.leader_epoch)
                        .with_isr(after.isr.iter().map(|r| BrokerId(*r)).collect())
                        .with_leader_recovery_state(after.leader_recovery_state)
                        .with_partition_epoch(after.partition_epoch),
                );
            }
            response.topics.push(out);
        }
        Ok(ControllerResult { records, response })
    }

    /// `validateAlterPartitionData`.
    fn validate_alter_partition(
        &self,
        broker_id: i32,
        p: &PartitionRegistration,
        pd: &gregor_protocol::kafka_protocol::messages::alter_partition_request::PartitionData,
        new_isr: &[(i32, i64)],
    ) -> Result<(), ErrorCode> {
        // A leader that knows newer epochs than this controller: this controller is likely
        // not the active one any more.
        if pd.leader_epoch > p.leader_epoch || pd.partition_epoch > p.partition_epoch {
            return Err(ErrorCode::NotController);
        }
        if pd.leader_epoch < p.leader_epoch {
            return Err(ErrorCode::FencedLeaderEpoch);
        }
        if broker_id != p.leader {
            return Err(ErrorCode::InvalidRequest);
        }
        if pd.partition_epoch < p.partition_epoch {
            return Err(ErrorCode::InvalidUpdateVersion);
        }
        let ids: Vec<i32> = new_isr.iter().map(|(id, _)| *id).collect();
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        sorted.dedup();
        // Replicas.validateIsr: no duplicates, every member a replica.
        if sorted.len() != ids.len() || ids.iter().any(|r| !p.replicas.contains(r)) {
            return Err(ErrorCode::InvalidRequest);
        }
        if !ids.contains(&p.leader) {
            return Err(ErrorCode::InvalidRequest);
        }
        if pd.leader_recovery_state == LEADER_RECOVERING && ids.len() > 1 {
            return Err(ErrorCode::InvalidRequest);
        }
        if p.leader_recovery_state == LEADER_RECOVERED
            && pd.leader_recovery_state == LEADER_RECOVERING
        {
            return Err(ErrorCode::InvalidRequest);
        }
        if !matches!(
            pd.leader_recovery_state,
            LEADER_RECOVERED | LEADER_RECOVERING
        ) {
            return Err(ErrorCode::InvalidRequest);
        }
        let ineligible = new_isr
            .iter()
            .any(|(id, epoch)| match self.image.brokers.get(id) {
                None => true,
                Some(b) => {
                    b.in_controlled_shutdown || b.fenced || (*epoch != -1 && *epoch != b.epoch)
                }
            });
        // Departure from Kafka 4.4 (whose brokers stop fetching for an offline directory): a
        // replica whose directory the broker reported offline does not join the ISR.
        let offline_dir = new_isr
            .iter()
            .any(|(id, _)| !p.isr.contains(id) && !self.replica_dir_online(p, *id));
        if ineligible || offline_dir {
            return Err(ErrorCode::IneligibleReplica);
        }
        Ok(())
    }
}

/// `ElectionType.PREFERRED` (KIP-460).
pub const ELECTION_PREFERRED: i8 = 0;
/// `ElectionType.UNCLEAN` (KIP-460).
pub const ELECTION_UNCLEAN: i8 = 1;

/// The most elections one periodic balancing event writes (Kafka's
/// `maxElectionsPerImbalance`); the rest wait for the next event.
pub const MAX_ELECTIONS_PER_IMBALANCE: usize = 1000;

/// A per-partition error with Kafka's message.
fn api_error(code: ErrorCode, message: Option<String>) -> (i16, Option<StrBytes>) {
    (code.code(), message.map(StrBytes::from_string))
}

/// Validates the replicas of a reassignment as Kafka's `validateManualPartitionAssignment`.
fn validate_replicas(image: &MetadataImage, replicas: &[i32]) -> Result<(), ControllerError> {
    let invalid = ControllerError::InvalidReplicaAssignment;
    if replicas.is_empty() {
        return Err(invalid(
            "The manual partition assignment includes an empty replica list.".into(),
        ));
    }
    let mut sorted = replicas.to_vec();
    sorted.sort_unstable();
    for (i, b) in sorted.iter().enumerate() {
        if !image.brokers.contains_key(b) {
            return Err(invalid(format!(
                "The manual partition assignment includes broker {b}, but no such broker is registered."
            )));
        }
        if i > 0 && sorted[i - 1] == *b {
            return Err(invalid(format!(
                "The manual partition assignment includes the broker {b} more than once."
            )));
        }
    }
    Ok(())
}

/// `a` without the members of `b`, sorted (Kafka's `calculateDifference`, a `TreeSet`).
fn difference(a: &[i32], b: &[i32]) -> Vec<i32> {
    let mut out: Vec<i32> = a.iter().copied().filter(|r| !b.contains(r)).collect();
    out.sort_unstable();
    out.dedup();
    out
}

impl Controller {
    fn builder<'a>(
        &'a self,
        t: &'a crate::image::TopicImage,
        partition_id: i32,
        p: &'a PartitionRegistration,
    ) -> PartitionChangeBuilder<'a> {
        let image = &self.image;
        PartitionChangeBuilder::new(image, p, t.topic_id, partition_id, move |r| {
            self.is_acceptable_leader(p, r)
        })
    }

    /// ElectLeaders (API 43, KIP-460): a preferred (`election_type` 0, and every v0 request)
    /// or unclean (1) election for each partition named, or for every partition when
    /// `topic_partitions` is null (then the partitions that need no election are left out of
    /// the answer). Per partition: ELECTION_NOT_NEEDED (the preferred replica leads, or for an
    /// unclean election the partition has a leader), PREFERRED_LEADER_NOT_AVAILABLE (the
    /// preferred replica is not in the ISR or not alive, and no other change is possible),
    /// ELIGIBLE_LEADERS_NOT_AVAILABLE (no live replica for an unclean election),
    /// UNKNOWN_TOPIC_OR_PARTITION. An unclean election makes the leader RECOVERING (KIP-704).
    ///
    /// # Errors
    /// INVALID_REQUEST for an unknown election type.
    pub fn elect_leaders(
        &self,
        election_type: i8,
        topic_partitions: Option<Vec<(String, Vec<i32>)>>,
    ) -> Result<ControllerResult<ElectLeadersResponse>, ControllerError> {
        if !matches!(election_type, ELECTION_PREFERRED | ELECTION_UNCLEAN) {
            return Err(ControllerError::InvalidRequest(format!(
                "Unknown election type {election_type}"
            )));
        }
        let mut records = Vec::new();
        let mut response = ElectLeadersResponse::default();
        let all = topic_partitions.is_none();
        let wanted = topic_partitions.unwrap_or_else(|| {
            let mut topics: Vec<_> = self.image.topics.values().collect();
            topics.sort_by(|a, b| a.name.cmp(&b.name));
            topics
                .into_iter()
                .map(|t| (t.name.clone(), t.partitions.keys().copied().collect()))
                .collect()
        });
        for (topic, partitions) in wanted {
            let mut result = ReplicaElectionResult::default()
                .with_topic(TopicName(StrBytes::from_string(topic.clone())));
            for partition_id in partitions {
                let (code, message) =
                    self.elect_leader(&topic, partition_id, election_type, &mut records);
                if all && code == ErrorCode::ElectionNotNeeded.code() {
                    continue;
                }
                result.partition_result.push(
                    ElectLeadersPartitionResult::default()
                        .with_partition_id(partition_id)
                        .with_error_code(code)
                        .with_error_message(message),
                );
            }
            response.replica_election_results.push(result);
        }
        Ok(ControllerResult { records, response })
    }

    /// `electLeader`: one partition's election; its error code and message.
    fn elect_leader(
        &self,
        topic: &str,
        partition_id: i32,
        election_type: i8,
        records: &mut Vec<MetadataRecord>,
    ) -> (i16, Option<StrBytes>) {
        let Some(t) = self.image.topic(topic) else {
            return api_error(
                ErrorCode::UnknownTopicOrPartition,
                Some(format!("No such topic as {topic}")),
            );
        };
        let Some(p) = t.partitions.get(&partition_id) else {
            return api_error(
                ErrorCode::UnknownTopicOrPartition,
                Some(format!("No such partition as {topic}-{partition_id}")),
            );
        };
        let has_preferred_leader = p.replicas.first().is_some_and(|r| *r == p.leader);
        if (election_type == ELECTION_PREFERRED && has_preferred_leader)
            || (election_type == ELECTION_UNCLEAN && p.leader != NO_LEADER)
        {
            return api_error(ErrorCode::ElectionNotNeeded, None);
        }
        let election = if election_type == ELECTION_UNCLEAN {
            Election::Unclean
        } else {
            Election::Preferred
        };
        match self.builder(t, partition_id, p).election(election).build() {
            Some(change) => {
                records.push(change.into());
                (0, None)
            }
            None if election_type == ELECTION_PREFERRED => {
                api_error(ErrorCode::PreferredLeaderNotAvailable, None)
            }
            None => api_error(ErrorCode::EligibleLeadersNotAvailable, None),
        }
    }

    /// AlterPartitionReassignments (API 45, KIP-455), all partitions in one batch: for each
    /// partition, a target replica list starts (or replaces) a reassignment, null cancels the
    /// one in progress. Starting one adds the new replicas to the replica list and records
    /// them as adding, the replicas to drop as removing; it completes (replicas = the target,
    /// adding/removing cleared, leader moved off removed replicas, leader epoch bumped) as
    /// soon as every target replica is in the ISR, at once for a reordering or a pure removal,
    /// otherwise when an AlterPartition brings the last one in. Per partition:
    /// UNKNOWN_TOPIC_OR_PARTITION, INVALID_REPLICA_ASSIGNMENT (empty, unregistered or repeated
    /// brokers; a cancellation that would need an unclean election without
    /// `unclean.leader.election.enable`), NO_REASSIGNMENT_IN_PROGRESS (cancelling none),
    /// INVALID_REPLICATION_FACTOR (v1 with `AllowReplicationFactorChange` false and another
    /// replica count, KIP-860).
    pub fn alter_partition_reassignments(
        &self,
        request: &AlterPartitionReassignmentsRequest,
    ) -> ControllerResult<AlterPartitionReassignmentsResponse> {
        let mut records = Vec::new();
        let mut response = AlterPartitionReassignmentsResponse::default()
            .with_allow_replication_factor_change(request.allow_replication_factor_change);
        for topic in &request.topics {
            let mut out = ReassignableTopicResponse::default().with_name(topic.name.clone());
            for target in &topic.partitions {
                let (code, message) = match self.alter_partition_reassignment(
                    topic.name.as_str(),
                    target.partition_index,
                    target
                        .replicas
                        .as_ref()
                        .map(|r| r.iter().map(|b| b.0).collect()),
                    request.allow_replication_factor_change,
                ) {
                    Ok(record) => {
                        records.extend(record.map(MetadataRecord::from));
                        (0, None)
                    }
                    Err(e) => (
                        e.kafka_error_code(),
                        Some(StrBytes::from_string(e.to_string())),
                    ),
                };
                out.partitions.push(
                    ReassignablePartitionResponse::default()
                        .with_partition_index(target.partition_index)
                        .with_error_code(code)
                        .with_error_message(message),
                );
            }
            response.responses.push(out);
        }
        ControllerResult { records, response }
    }

    fn alter_partition_reassignment(
        &self,
        topic: &str,
        partition_id: i32,
        target: Option<Vec<i32>>,
        allow_replication_factor_change: bool,
    ) -> Result<Option<PartitionChangeRecord>, ControllerError> {
        let unknown = || {
            ControllerError::UnknownTopicOrPartitionWithMessage(format!(
                "Unable to find partition {topic}:{partition_id}."
            ))
        };
        let t = self.image.topic(topic).ok_or_else(|| {
            ControllerError::UnknownTopicOrPartitionWithMessage(format!(
                "Unable to find a topic named {topic}."
            ))
        })?;
        let p = t.partitions.get(&partition_id).ok_or_else(unknown)?;
        let Some(target) = target else {
            return self.cancel_partition_reassignment(t, partition_id, p);
        };
        validate_replicas(&self.image, &target)?;
        if !allow_replication_factor_change {
            let current: Vec<i32> = difference(&p.replicas, &p.adding_replicas);
            if current.len() != target.len() {
                return Err(ControllerError::InvalidReplicationFactor(format!(
                    "The replication factor is changed from {} to {} but allowReplicationFactorChange is false.",
                    current.len(),
                    target.len()
                )));
            }
        }
        let removing = difference(&p.replicas, &target);
        let adding = difference(&target, &p.replicas);
        let mut replicas = target.clone();
        replicas.extend(removing.iter().copied());
        let mut builder = self.builder(t, partition_id, p);
        if replicas != p.replicas {
            builder = builder.target_replicas(replicas);
        }
        if !removing.is_empty() {
            builder = builder.target_removing(removing);
        }
        if !adding.is_empty() {
            builder = builder.target_adding(adding);
        }
        Ok(builder.build())
    }

    /// `cancelPartitionReassignment`: back to the replicas before the reassignment (those it
    /// was adding leave the replicas and the ISR).
    fn cancel_partition_reassignment(
        &self,
        t: &crate::image::TopicImage,
        partition_id: i32,
        p: &PartitionRegistration,
    ) -> Result<Option<PartitionChangeRecord>, ControllerError> {
        if !reassignment_in_progress(p) {
            return Err(ControllerError::NoReassignmentInProgress(
                "No partition reassignment is in progress for the topic partition.".into(),
            ));
        }
        let replicas: Vec<i32> = p
            .replicas
            .iter()
            .copied()
            .filter(|r| !p.adding_replicas.contains(r))
            .collect();
        let mut isr: Vec<i32> = p
            .isr
            .iter()
            .copied()
            .filter(|r| !p.adding_replicas.contains(r))
            .collect();
        let unclean_enabled = self.unclean_leader_election_enabled(&t.name);
        if isr.is_empty() {
            let Some(first) = replicas.first() else {
                return Err(ControllerError::InvalidReplicaAssignment(
                    "Invalid replica assignment: addingReplicas contains all replicas.".into(),
                ));
            };
            if !unclean_enabled {
                return Err(ControllerError::InvalidReplicaAssignment(format!(
                    "Unable to revert partition assignment for {}:{partition_id} because it would require an unclean leader election.",
                    t.name
                )));
            }
            isr.push(*first);
        }
        let mut builder = self
            .builder(t, partition_id, p)
            .target_isr(isr)
            .target_replicas(replicas)
            .target_removing(Vec::new())
            .target_adding(Vec::new());
        if unclean_enabled {
            builder = builder.election(Election::Unclean);
        }
        Ok(builder.build())
    }

    /// ListPartitionReassignments (API 46, KIP-455): the partitions with a reassignment in
    /// progress (replicas, adding, removing), of the topics and partitions named or of all
    /// topics (null). Unknown topics and partitions are left out, as in Kafka.
    pub fn list_partition_reassignments(
        &self,
        topics: Option<Vec<(String, Vec<i32>)>>,
    ) -> ListPartitionReassignmentsResponse {
        let mut response = ListPartitionReassignmentsResponse::default();
        let wanted = topics.unwrap_or_else(|| {
            let mut all: Vec<_> = self
                .image
                .topics
                .values()
                .filter(|t| t.partitions.values().any(reassignment_in_progress))
                .collect();
            all.sort_by(|a, b| a.name.cmp(&b.name));
            all.into_iter()
                .map(|t| (t.name.clone(), t.partitions.keys().copied().collect()))
                .collect()
        });
        let ids = |v: &[i32]| v.iter().map(|r| BrokerId(*r)).collect::<Vec<_>>();
        for (name, partitions) in wanted {
            let Some(t) = self.image.topic(&name) else {
                continue;
            };
            let ongoing: Vec<OngoingPartitionReassignment> = partitions
                .iter()
                .filter_map(|id| t.partitions.get(id).map(|p| (id, p)))
                .filter(|(_, p)| reassignment_in_progress(p))
                .map(|(id, p)| {
                    OngoingPartitionReassignment::default()
                        .with_partition_index(*id)
                        .with_replicas(ids(&p.replicas))
                        .with_adding_replicas(ids(&p.adding_replicas))
                        .with_removing_replicas(ids(&p.removing_replicas))
                })
                .collect();
            if !ongoing.is_empty() {
                response.topics.push(
                    OngoingTopicReassignment::default()
                        .with_name(TopicName(StrBytes::from_string(name)))
                        .with_partitions(ongoing),
                );
            }
        }
        response
    }

    /// The periodic leader balancing (`auto.leader.rebalance.enable`): for every broker whose
    /// share of partitions it is the preferred replica of but does not lead is above
    /// `leader.imbalance.per.broker.percentage`, a preferred election for each such partition
    /// (at most [`MAX_ELECTIONS_PER_IMBALANCE`]); an election that is not possible (the
    /// preferred replica out of the ISR or not alive) writes nothing. The answer is the number
    /// of elections.
    pub fn balance_partition_leaders(&self) -> ControllerResult<usize> {
        let mut records = Vec::new();
        if !self.config.auto_leader_rebalance_enable {
            return ControllerResult {
                records,
                response: 0,
            };
        }
        // Per preferred broker: (partitions, partitions it does not lead).
        let mut counts: std::collections::BTreeMap<i32, (usize, usize)> = Default::default();
        for t in self.image.topics.values() {
            for p in t.partitions.values() {
                if let Some(preferred) = p.replicas.first() {
                    let c = counts.entry(*preferred).or_default();
                    c.0 += 1;
                    if p.leader != *preferred {
                        c.1 += 1;
                    }
                }
            }
        }
        let threshold = self.config.leader_imbalance_per_broker_percentage;
        let imbalanced: Vec<i32> = counts
            .into_iter()
            .filter(|(_, (total, off))| {
                *off > 0 && (*off as u64) * 100 > u64::from(threshold) * (*total as u64)
            })
            .map(|(b, _)| b)
            .collect();
        let mut topics: Vec<_> = self.image.topics.values().collect();
        topics.sort_by(|a, b| a.name.cmp(&b.name));
        'topics: for t in topics {
            for (id, p) in &t.partitions {
                if records.len() >= MAX_ELECTIONS_PER_IMBALANCE {
                    break 'topics;
                }
                let Some(preferred) = p.replicas.first() else {
                    continue;
                };
                if p.leader == *preferred || !imbalanced.contains(preferred) {
                    continue;
                }
                if let Some(change) = self
                    .builder(t, *id, p)
                    .election(Election::Preferred)
                    .build()
                {
                    if change.leader == *preferred {
                        records.push(change.into());
                    }
                }
            }
        }
        let n = records.len();
        ControllerResult {
            records,
            response: n,
        }
    }

    /// Unclean elections for the leaderless partitions of topics with
    /// `unclean.leader.election.enable` (Kafka's `maybeElectUncleanLeaders`): a partition whose
    /// every ISR and ELR member is gone gets a live replica as leader, RECOVERING, once the
    /// config is turned on. The answer is the number of elections.
    pub fn elect_unclean_leaders(&self) -> ControllerResult<usize> {
        let mut records = Vec::new();
        let mut topics: Vec<_> = self.image.topics.values().collect();
        topics.sort_by(|a, b| a.name.cmp(&b.name));
        for t in topics {
            if !t.partitions.values().any(|p| p.leader == NO_LEADER)
                || !self.unclean_leader_election_enabled(&t.name)
            {
                continue;
            }
            for (id, p) in &t.partitions {
                if p.leader != NO_LEADER || records.len() >= MAX_ELECTIONS_PER_IMBALANCE {
                    continue;
                }
                if let Some(change) = self.builder(t, *id, p).election(Election::Unclean).build() {
                    if change.leader >= 0 {
                        tracing::warn!(topic = %t.name, partition = id, leader = change.leader, "unclean leader election for an offline partition");
                        records.push(change.into());
                    }
                }
            }
        }
        let n = records.len();
        ControllerResult {
            records,
            response: n,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use gregor_protocol::kafka_protocol::messages::alter_partition_reassignments_request::{
        ReassignablePartition, ReassignableTopic,
    };
    use gregor_protocol::kafka_protocol::messages::alter_partition_request::{
        BrokerState, PartitionData, TopicData,
    };
    use gregor_protocol::metadata_records::{BrokerEndpoint, FeatureLevelRecord};

    use super::*;
    use crate::controller::{
        BrokerHeartbeatRequest, BrokerRegistrationRequest, ControllerConfig, ManualClock, NewTopic,
    };
    use crate::image::METADATA_VERSION_FEATURE;
    use crate::log::CommittedBatch;
    use crate::record::MetadataRecord;

    /// A controller of a cluster at metadata.version 33 with ELR on.
    pub(crate) fn controller() -> Controller {
        let mut c = Controller::with_config(
            MetadataImage::default(),
            ControllerConfig {
                clock: Arc::new(ManualClock::default()),
                placement_seed: Some(1),
                ..ControllerConfig::default()
            },
        );
        commit(
            &mut c,
            vec![
                FeatureLevelRecord {
                    name: METADATA_VERSION_FEATURE.into(),
                    feature_level: 33,
                    ..Default::default()
                }
                .into(),
                FeatureLevelRecord {
                    name: ELR_FEATURE.into(),
                    feature_level: 1,
                    ..Default::default()
                }
                .into(),
            ],
        );
        c
    }

    /// Commits `records` as the next batch.
    pub(crate) fn commit(c: &mut Controller, records: Vec<MetadataRecord>) {
        if records.is_empty() {
            return;
        }
        let batch = CommittedBatch {
            base_offset: c.image.offset,
            epoch: 1,
            records: records.into(),
        };
        c.replay(&batch);
    }

    /// Registers and unfences `id`; its broker epoch.
    pub(crate) fn join(c: &mut Controller, id: i32) -> i64 {
        let r = c
            .register_broker(BrokerRegistrationRequest {
                broker_id: id,
                incarnation_id: Uuid::new_v4(),
                listeners: vec![BrokerEndpoint {
                    name: "PLAINTEXT".into(),
                    host: "127.0.0.1".into(),
                    port: 9092,
                    security_protocol: 0,
                    ..Default::default()
                }],
                features: BrokerRegistrationRequest::supported_features(),
                rack: None,
                log_dirs: vec![Uuid::new_v4()],
                previous_broker_epoch: -1,
            })
            .unwrap();
        let epoch = r.response;
        commit(c, r.records);
        heartbeat(c, id, false, false);
        assert!(!c.image.brokers[&id].fenced);
        epoch
    }

    /// A heartbeat of `id` at the current offset.
    pub(crate) fn heartbeat(c: &mut Controller, id: i32, fence: bool, shut_down: bool) {
        let r = c
            .broker_heartbeat(BrokerHeartbeatRequest {
                broker_id: id,
                broker_epoch: c.image.brokers[&id].epoch,
                current_metadata_offset: c.image.offset as i64,
                want_fence: fence,
                want_shut_down: shut_down,
                cordoned_log_dirs: None,
                offline_log_dirs: Vec::new(),
            })
            .unwrap();
        commit(c, r.records);
    }

    /// Creates `name` with one partition on `replicas` and `configs`; its id.
    pub(crate) fn create(
        c: &mut Controller,
        name: &str,
        replicas: Vec<i32>,
        configs: &[(&str, &str)],
    ) -> Uuid {
        let r = c.create_topics(
            vec![NewTopic {
                name: name.into(),
                num_partitions: -1,
                replication_factor: -1,
                assignments: vec![replicas],
                configs: configs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>(),
            }],
            false,
        );
        commit(c, r.records);
        r.response.into_iter().next().unwrap().unwrap()
    }

    pub(crate) fn partition(c: &Controller, name: &str) -> PartitionRegistration {
        c.image.topic(name).unwrap().partitions[&0].clone()
    }

    /// An AlterPartition v3 request of `broker` for partition 0 of `topic_id` with the
    /// partition's current epochs and `isr` (with the brokers' registered epochs).
    pub(crate) fn request(
        c: &Controller,
        broker: i32,
        topic_id: Uuid,
        isr: &[i32],
    ) -> AlterPartitionRequest {
        let p = c
            .image
            .topic_by_id(&topic_id)
            .map(|t| t.partitions[&0].clone());
        let (le, pe) = p.map_or((0, 0), |p| (p.leader_epoch, p.partition_epoch));
        AlterPartitionRequest::default()
            .with_broker_id(BrokerId(broker))
            .with_broker_epoch(c.image.brokers[&broker].epoch)
            .with_topics(vec![TopicData::default()
                .with_topic_id(topic_id)
                .with_partitions(vec![PartitionData::default()
                    .with_partition_index(0)
                    .with_leader_epoch(le)
                    .with_partition_epoch(pe)
                    .with_new_isr_with_epochs(
                        isr.iter()
                            .map(|b| {
                                BrokerState::default()
                                    .with_broker_id(BrokerId(*b))
                                    .with_broker_epoch(
                                        c.image.brokers.get(b).map_or(-1, |r| r.epoch),
                                    )
                            })
                            .collect(),
                    )])])
    }

    fn partition_of(r: &AlterPartitionRequest) -> &PartitionData {
        &r.topics[0].partitions[0]
    }

    fn edit(
        mut r: AlterPartitionRequest,
        f: impl FnOnce(&mut PartitionData),
    ) -> AlterPartitionRequest {
        f(&mut r.topics[0].partitions[0]);
        r
    }

    /// Sends `r` and commits its records; the one partition's answer.
    pub(crate) fn alter(
        c: &mut Controller,
        r: AlterPartitionRequest,
    ) -> (AlterPartitionResponsePartition, Vec<MetadataRecord>) {
        let result = c.alter_partition(r).unwrap();
        commit(c, result.records.clone());
        (
            result.response.topics[0].partitions[0].clone(),
            result.records,
        )
    }

    /// [`alter`] of [`request`].
    pub(crate) fn alter_isr(
        c: &mut Controller,
        broker: i32,
        topic_id: Uuid,
        isr: &[i32],
    ) -> (AlterPartitionResponsePartition, Vec<MetadataRecord>) {
        let r = request(c, broker, topic_id, isr);
        alter(c, r)
    }

    fn three_brokers() -> (Controller, Uuid) {
        let mut c = controller();
        for id in 1..=3 {
            join(&mut c, id);
        }
        let id = create(&mut c, "t", vec![1, 2, 3], &[]);
        (c, id)
    }

    #[test]
    fn an_isr_shrink_and_expand_change_the_partition_epoch_only() {
        let (mut c, id) = three_brokers();
        let before = partition(&c, "t");
        assert_eq!((before.leader, before.isr.clone()), (1, vec![1, 2, 3]));
        let (answer, records) = alter_isr(&mut c, 1, id, &[1, 2]);
        assert_eq!(answer.error_code, 0);
        let [MetadataRecord::PartitionChange(change)] = records.as_slice() else {
            panic!("{records:?}")
        };
        assert_eq!(change.isr, Some(vec![1, 2]));
        assert_eq!(change.leader, NO_LEADER_CHANGE, "no leader epoch bump");
        assert_eq!(
            (
                change.replicas.clone(),
                change.eligible_leader_replicas.clone()
            ),
            (None, None)
        );
        let after = partition(&c, "t");
        assert_eq!(after.leader_epoch, before.leader_epoch);
        assert_eq!(after.partition_epoch, before.partition_epoch + 1);
        assert_eq!(
            (
                answer.leader_id.0,
                answer.leader_epoch,
                answer.partition_epoch
            ),
            (1, after.leader_epoch, after.partition_epoch)
        );
        assert_eq!(answer.isr, vec![BrokerId(1), BrokerId(2)]);
        let (answer, _) = alter_isr(&mut c, 1, id, &[1, 2, 3]);
        assert_eq!(answer.error_code, 0);
        assert_eq!(partition(&c, "t").isr, vec![1, 2, 3]);
        assert_eq!(answer.partition_epoch, before.partition_epoch + 2);
    }

    #[test]
    fn the_same_isr_returns_the_current_state_and_writes_nothing() {
        let (mut c, id) = three_brokers();
        let p = partition(&c, "t");
        let (answer, records) = alter_isr(&mut c, 1, id, &[1, 2, 3]);
        assert!(records.is_empty());
        assert_eq!(answer.error_code, 0);
        assert_eq!(
            (
                answer.leader_epoch,
                answer.partition_epoch,
                answer.isr.len()
            ),
            (p.leader_epoch, p.partition_epoch, 3)
        );
    }

    #[test]
    fn a_shrink_below_min_isr_keeps_the_removed_members_as_eligible_leaders() {
        let mut c = controller();
        for id in 1..=3 {
            join(&mut c, id);
        }
        let id = create(&mut c, "t", vec![1, 2, 3], &[("min.insync.replicas", "2")]);
        alter_isr(&mut c, 1, id, &[1, 2]);
        assert!(
            partition(&c, "t").elr.is_empty(),
            "ISR still at min.insync.replicas"
        );
        let (answer, records) = alter_isr(&mut c, 1, id, &[1]);
        assert_eq!(answer.error_code, 0);
        let MetadataRecord::PartitionChange(change) = &records[0] else {
            panic!("{records:?}")
        };
        assert_eq!(change.eligible_leader_replicas, Some(vec![2]));
        assert_eq!(partition(&c, "t").elr, vec![2]);
        // Back to min.insync.replicas: the ELR is cleared.
        let (_, records) = alter_isr(&mut c, 1, id, &[1, 3]);
        let MetadataRecord::PartitionChange(change) = &records[0] else {
            panic!("{records:?}")
        };
        assert_eq!(change.eligible_leader_replicas, Some(vec![]));
        assert!(partition(&c, "t").elr.is_empty());
    }

    #[test]
    fn kafkas_errors() {
        let (mut c, id) = three_brokers();
        let code = |c: &mut Controller, r| alter(c, r).0.error_code;
        let good = request(&c, 1, id, &[1, 2]);
        // The sender's broker epoch.
        let stale = good.clone().with_broker_epoch(12345);
        assert_eq!(c.alter_partition(stale).unwrap_err().kafka_error_code(), 77);
        let unknown = request(&c, 1, Uuid::new_v4(), &[1, 2]);
        assert_eq!(code(&mut c, unknown), 100);
        let nil = request(&c, 1, Uuid::nil(), &[1, 2]);
        assert_eq!(code(&mut c, nil), 100);
        let no_partition = edit(good.clone(), |p| p.partition_index = 7);
        assert_eq!(code(&mut c, no_partition), 3);
        let old_leader_epoch = edit(good.clone(), |p| p.leader_epoch -= 1);
        assert_eq!(code(&mut c, old_leader_epoch), 74);
        let newer = edit(good.clone(), |p| p.leader_epoch += 1);
        assert_eq!(code(&mut c, newer), 41);
        let not_leader = request(&c, 2, id, &[1, 2]);
        assert_eq!(code(&mut c, not_leader), 42);
        let old_partition_epoch = edit(good.clone(), |p| p.partition_epoch -= 1);
        assert_eq!(code(&mut c, old_partition_epoch), 95);
        let outside = request(&c, 1, id, &[1, 4]);
        assert_eq!(code(&mut c, outside), 42);
        let without_leader = request(&c, 1, id, &[2, 3]);
        assert_eq!(code(&mut c, without_leader), 42);
        let duplicate = request(&c, 1, id, &[1, 1]);
        assert_eq!(code(&mut c, duplicate), 42);
        let to_recovering = edit(request(&c, 1, id, &[1]), |p| p.leader_recovery_state = 1);
        assert_eq!(code(&mut c, to_recovering), 42);
        let epoch_mismatch = edit(good.clone(), |p| p.new_isr_with_epochs[1].broker_epoch += 1);
        assert_eq!(code(&mut c, epoch_mismatch), 107);
        // Fenced and shutting-down brokers may not join the ISR.
        alter_isr(&mut c, 1, id, &[1]);
        heartbeat(&mut c, 3, true, false);
        assert!(c.image.brokers[&3].fenced);
        let fenced = request(&c, 1, id, &[1, 3]);
        assert_eq!(code(&mut c, fenced), 107);
        heartbeat(&mut c, 2, false, true);
        assert!(c.image.brokers[&2].in_controlled_shutdown || c.image.brokers[&2].fenced);
        let shutting_down = request(&c, 1, id, &[1, 2]);
        assert_eq!(code(&mut c, shutting_down), 107);
        // Nothing of the above was written.
        assert_eq!(partition(&c, "t").isr, vec![1]);
        // v2: NewIsr without epochs is taken as epochs -1.
        let v2 = edit(request(&c, 1, id, &[]), |p| p.new_isr = vec![BrokerId(1)]);
        assert_eq!(code(&mut c, v2), 0);
        let _ = partition_of(&good);
    }

    #[test]
    fn a_recovering_leader_may_only_finish_recovering_alone() {
        let mut c = controller();
        for id in 1..=2 {
            join(&mut c, id);
        }
        let id = create(
            &mut c,
            "t",
            vec![1, 2],
            &[(UNCLEAN_LEADER_ELECTION_ENABLE, "true")],
        );
        // Broker 2 shrinks out, then the leader 1 is fenced: no ISR member left; 2 comes back
        // and, with unclean election on, is elected uncleanly, RECOVERING.
        alter_isr(&mut c, 1, id, &[1]);
        heartbeat(&mut c, 2, true, false);
        heartbeat(&mut c, 1, true, false);
        let p = partition(&c, "t");
        assert_eq!(p.leader, NO_LEADER, "{p:?}");
        heartbeat(&mut c, 2, false, false);
        let p = partition(&c, "t");
        assert_eq!(
            (p.leader, p.leader_recovery_state),
            (2, LEADER_RECOVERING),
            "{p:?}"
        );
        heartbeat(&mut c, 1, false, false);
        let both = edit(request(&c, 2, id, &[2, 1]), |p| p.leader_recovery_state = 1);
        assert_eq!(alter(&mut c, both).0.error_code, 42);
        let done = edit(request(&c, 2, id, &[2]), |p| p.leader_recovery_state = 0);
        let (answer, records) = alter(&mut c, done);
        assert_eq!(answer.error_code, 0);
        let MetadataRecord::PartitionChange(change) = &records[0] else {
            panic!("{records:?}")
        };
        assert_eq!(change.leader_recovery_state, LEADER_RECOVERED);
        assert_eq!(answer.leader_recovery_state, LEADER_RECOVERED);
    }

    fn election(c: &mut Controller, election_type: i8, topic: &str) -> (i16, Option<String>) {
        let r = c
            .elect_leaders(election_type, Some(vec![(topic.to_string(), vec![0])]))
            .unwrap();
        commit(c, r.records);
        let p = &r.response.replica_election_results[0].partition_result[0];
        (
            p.error_code,
            p.error_message.as_ref().map(|m| m.to_string()),
        )
    }

    #[test]
    fn preferred_election_moves_leadership_back_to_the_first_replica() {
        let (mut c, id) = three_brokers();
        // Broker 1 shuts down: broker 2 leads; it comes back and the leader takes it back
        // into the ISR.
        heartbeat(&mut c, 1, true, false);
        assert_eq!(partition(&c, "t").leader, 2);
        heartbeat(&mut c, 1, false, false);
        // Not in the ISR yet: the preferred replica is not available.
        assert_eq!(election(&mut c, ELECTION_PREFERRED, "t").0, 80);
        alter_isr(&mut c, 2, id, &[2, 3, 1]);
        let before = partition(&c, "t");
        assert_eq!(election(&mut c, ELECTION_PREFERRED, "t").0, 0);
        let after = partition(&c, "t");
        assert_eq!(after.leader, 1);
        assert_eq!(after.leader_epoch, before.leader_epoch + 1);
        assert_eq!(after.isr, before.isr, "a clean election keeps the ISR");
        // Now the preferred replica leads.
        assert_eq!(election(&mut c, ELECTION_PREFERRED, "t").0, 84);
        assert_eq!(election(&mut c, ELECTION_UNCLEAN, "t").0, 84);
        let (code, message) = election(&mut c, ELECTION_PREFERRED, "nope");
        assert_eq!(code, 3);
        assert_eq!(message.as_deref(), Some("No such topic as nope"));
        let r = c
            .elect_leaders(ELECTION_PREFERRED, Some(vec![("t".into(), vec![5])]))
            .unwrap();
        assert_eq!(
            r.response.replica_election_results[0].partition_result[0].error_code,
            3
        );
        assert_eq!(c.elect_leaders(7, None).unwrap_err().kafka_error_code(), 42);
    }

    #[test]
    fn electing_every_partition_answers_only_those_that_needed_one() {
        let (mut c, id) = three_brokers();
        create(&mut c, "u", vec![2, 3, 1], &[]);
        heartbeat(&mut c, 1, true, false);
        heartbeat(&mut c, 1, false, false);
        alter_isr(&mut c, 2, id, &[2, 3, 1]);
        let r = c.elect_leaders(ELECTION_PREFERRED, None).unwrap();
        let results = &r.response.replica_election_results;
        let t: Vec<_> = results
            .iter()
            .map(|t| (t.topic.as_str().to_string(), t.partition_result.len()))
            .collect();
        assert_eq!(t, vec![("t".to_string(), 1), ("u".to_string(), 0)]);
        assert_eq!(results[0].partition_result[0].error_code, 0);
        assert_eq!(r.records.len(), 1);
    }

    #[test]
    fn unclean_election_picks_a_live_replica_outside_the_isr_and_recovers() {
        let mut c = controller();
        for id in 1..=2 {
            join(&mut c, id);
        }
        let id = create(&mut c, "t", vec![1, 2], &[]);
        alter_isr(&mut c, 1, id, &[1]);
        heartbeat(&mut c, 1, true, false);
        let p = partition(&c, "t");
        assert_eq!(p.leader, NO_LEADER, "unclean election is off: no leader");
        assert_eq!(p.elr, vec![1], "{p:?}");
        assert_eq!(election(&mut c, ELECTION_PREFERRED, "t").0, 80);
        // Broker 2 is alive but out of the ISR: only an unclean election takes it.
        assert!(c.elect_unclean_leaders().records.is_empty(), "config off");
        assert_eq!(election(&mut c, ELECTION_UNCLEAN, "t").0, 0);
        let p = partition(&c, "t");
        assert_eq!((p.leader, p.isr.clone()), (2, vec![2]));
        assert_eq!(p.leader_recovery_state, LEADER_RECOVERING);
        assert!(p.elr.is_empty());
        // No live replica at all: ELIGIBLE_LEADERS_NOT_AVAILABLE.
        heartbeat(&mut c, 2, true, false);
        assert_eq!(partition(&c, "t").leader, NO_LEADER);
        assert_eq!(election(&mut c, ELECTION_UNCLEAN, "t").0, 83);
    }

    #[test]
    fn turning_on_unclean_leader_election_elects_leaderless_partitions() {
        let mut c = controller();
        for id in 1..=2 {
            join(&mut c, id);
        }
        let id = create(&mut c, "t", vec![1, 2], &[]);
        alter_isr(&mut c, 1, id, &[1]);
        heartbeat(&mut c, 1, true, false);
        assert_eq!(partition(&c, "t").leader, NO_LEADER);
        let r = c
            .alter_configs(
                ConfigResource::Topic,
                "t",
                vec![(UNCLEAN_LEADER_ELECTION_ENABLE.into(), Some("true".into()))],
            )
            .unwrap();
        commit(&mut c, r.records);
        let r = c.elect_unclean_leaders();
        assert_eq!(r.response, 1);
        commit(&mut c, r.records);
        let p = partition(&c, "t");
        assert_eq!((p.leader, p.leader_recovery_state), (2, LEADER_RECOVERING));
        assert_eq!(c.elect_unclean_leaders().response, 0);
    }

    #[test]
    fn a_fenced_leader_with_unclean_election_enabled_in_the_cluster_default() {
        let mut c = controller();
        for id in 1..=2 {
            join(&mut c, id);
        }
        let id = create(&mut c, "t", vec![1, 2], &[]);
        alter_isr(&mut c, 1, id, &[1]);
        let r = c
            .alter_configs(
                ConfigResource::Broker,
                "",
                vec![(UNCLEAN_LEADER_ELECTION_ENABLE.into(), Some("true".into()))],
            )
            .unwrap();
        commit(&mut c, r.records);
        heartbeat(&mut c, 1, true, false);
        let p = partition(&c, "t");
        assert_eq!((p.leader, p.isr.clone()), (2, vec![2]), "{p:?}");
        assert_eq!(p.leader_recovery_state, LEADER_RECOVERING);
    }

    fn reassign(
        c: &mut Controller,
        topic: &str,
        replicas: Option<Vec<i32>>,
        allow_rf_change: bool,
    ) -> (i16, Option<String>) {
        let r = c.alter_partition_reassignments(
            &AlterPartitionReassignmentsRequest::default()
                .with_allow_replication_factor_change(allow_rf_change)
                .with_topics(vec![ReassignableTopic::default()
                    .with_name(TopicName(StrBytes::from_string(topic.into())))
                    .with_partitions(vec![ReassignablePartition::default()
                        .with_partition_index(0)
                        .with_replicas(
                            replicas.map(|r| r.into_iter().map(BrokerId).collect()),
                        )])]),
        );
        commit(c, r.records);
        let p = &r.response.responses[0].partitions[0];
        (
            p.error_code,
            p.error_message.as_ref().map(|m| m.to_string()),
        )
    }

    /// (topic, partition, replicas, adding, removing) of a listed reassignment.
    type Listed = (String, i32, Vec<i32>, Vec<i32>, Vec<i32>);

    fn listed(c: &Controller) -> Vec<Listed> {
        let ids = |v: &[BrokerId]| v.iter().map(|b| b.0).collect::<Vec<_>>();
        c.list_partition_reassignments(None)
            .topics
            .iter()
            .flat_map(|t| {
                t.partitions.iter().map(|p| {
                    (
                        t.name.as_str().to_string(),
                        p.partition_index,
                        ids(&p.replicas),
                        ids(&p.adding_replicas),
                        ids(&p.removing_replicas),
                    )
                })
            })
            .collect()
    }

    #[test]
    fn a_reassignment_adds_then_completes_when_the_target_is_in_the_isr() {
        let mut c = controller();
        for id in 1..=4 {
            join(&mut c, id);
        }
        let id = create(&mut c, "t", vec![1, 2, 3], &[]);
        let before = partition(&c, "t");
        // Move the replica of broker 1 to broker 4.
        assert_eq!(reassign(&mut c, "t", Some(vec![4, 2, 3]), false).0, 0);
        let p = partition(&c, "t");
        assert_eq!(p.replicas, vec![4, 2, 3, 1]);
        assert_eq!(
            (p.adding_replicas.clone(), p.removing_replicas.clone()),
            (vec![4], vec![1])
        );
        assert_eq!(
            (p.leader, p.leader_epoch),
            (1, before.leader_epoch),
            "{p:?}"
        );
        assert_eq!(
            listed(&c),
            vec![("t".into(), 0, vec![4, 2, 3, 1], vec![4], vec![1])]
        );
        assert_eq!(
            c.list_partition_reassignments(Some(vec![
                ("t".into(), vec![0, 9]),
                ("x".into(), vec![0])
            ]))
            .topics
            .len(),
            1
        );
        // ISR changes without broker 4 do not complete it.
        alter_isr(&mut c, 1, id, &[1, 2]);
        let (answer, _) = alter_isr(&mut c, 1, id, &[1, 2, 3]);
        assert_eq!(answer.error_code, 0);
        assert_eq!(partition(&c, "t").adding_replicas, vec![4]);
        // Broker 4 caught up and the leader adds it: the reassignment completes, leadership
        // leaves the removed broker 1 (which gets NEW_LEADER_ELECTED) and the leader epoch is
        // bumped.
        let (answer, records) = alter_isr(&mut c, 1, id, &[1, 2, 3, 4]);
        assert_eq!(answer.error_code, 108, "{answer:?}");
        assert_eq!(records.len(), 1);
        let p = partition(&c, "t");
        assert_eq!(p.replicas, vec![4, 2, 3]);
        assert_eq!(p.isr, vec![2, 3, 4]);
        assert!(p.adding_replicas.is_empty() && p.removing_replicas.is_empty());
        assert_eq!((p.leader, p.leader_epoch), (4, before.leader_epoch + 1));
        assert!(listed(&c).is_empty());
    }

    #[test]
    fn removing_or_reordering_replicas_completes_at_once() {
        let (mut c, _) = three_brokers();
        let before = partition(&c, "t");
        // Reorder: done at once, same leader and leader epoch.
        assert_eq!(reassign(&mut c, "t", Some(vec![2, 1, 3]), false).0, 0);
        let p = partition(&c, "t");
        assert_eq!((p.replicas.clone(), p.leader), (vec![2, 1, 3], 1));
        assert_eq!(p.leader_epoch, before.leader_epoch);
        // Remove the leader's replica: done at once (the rest is in the ISR), the leader moves
        // to a remaining replica, leader epoch bumped.
        assert_eq!(reassign(&mut c, "t", Some(vec![2, 3]), true).0, 0);
        let p = partition(&c, "t");
        assert_eq!(
            (p.replicas.clone(), p.isr.clone()),
            (vec![2, 3], vec![2, 3])
        );
        assert_eq!((p.leader, p.leader_epoch), (2, before.leader_epoch + 1));
        assert!(listed(&c).is_empty());
    }

    #[test]
    fn cancelling_a_reassignment_goes_back_to_the_original_replicas() {
        let mut c = controller();
        for id in 1..=4 {
            join(&mut c, id);
        }
        let id = create(&mut c, "t", vec![1, 2, 3], &[]);
        assert_eq!(reassign(&mut c, "t", None, false).0, 85);
        assert_eq!(reassign(&mut c, "t", Some(vec![4, 2, 3]), false).0, 0);
        // Broker 4 joined the ISR, not yet the whole target (3 left it).
        alter_isr(&mut c, 1, id, &[1, 2]);
        alter_isr(&mut c, 1, id, &[1, 2, 4]);
        assert_eq!(partition(&c, "t").adding_replicas, vec![4]);
        assert_eq!(reassign(&mut c, "t", None, false).0, 0);
        let p = partition(&c, "t");
        assert_eq!(p.replicas, vec![2, 3, 1]);
        assert_eq!(p.isr, vec![1, 2]);
        assert!(p.adding_replicas.is_empty() && p.removing_replicas.is_empty());
        assert_eq!(p.leader, 1);
        assert!(listed(&c).is_empty());
    }

    #[test]
    fn reassignment_errors_are_kafkas() {
        let (mut c, _) = three_brokers();
        let (code, message) = reassign(&mut c, "nope", Some(vec![1]), true);
        assert_eq!(code, 3);
        assert_eq!(
            message.as_deref(),
            Some("Unable to find a topic named nope.")
        );
        assert_eq!(reassign(&mut c, "t", Some(vec![1, 2, 9]), true).0, 39);
        assert_eq!(reassign(&mut c, "t", Some(vec![1, 1, 2]), true).0, 39);
        assert_eq!(reassign(&mut c, "t", Some(vec![]), true).0, 39);
        let (code, message) = reassign(&mut c, "t", Some(vec![1, 2]), false);
        assert_eq!(code, 38, "{message:?}");
        assert!(partition(&c, "t").replicas.len() == 3, "nothing changed");
        let r = c.alter_partition_reassignments(
            &AlterPartitionReassignmentsRequest::default().with_topics(vec![
                ReassignableTopic::default()
                    .with_name(TopicName(StrBytes::from_string("t".into())))
                    .with_partitions(vec![ReassignablePartition::default()
                        .with_partition_index(3)
                        .with_replicas(Some(vec![BrokerId(1)]))]),
            ]),
        );
        assert_eq!(r.response.responses[0].partitions[0].error_code, 3);
        assert!(r.records.is_empty());
    }

    #[test]
    fn the_periodic_balancing_elects_preferred_leaders_above_the_imbalance_threshold() {
        let (mut c, id) = three_brokers();
        // Broker 1 leaves and comes back into the ISR: broker 2 leads its partition.
        heartbeat(&mut c, 1, true, false);
        heartbeat(&mut c, 1, false, false);
        alter_isr(&mut c, 2, id, &[2, 3, 1]);
        assert_eq!(partition(&c, "t").leader, 2);
        // 1 of broker 1's 1 preferred partitions is led elsewhere: 100% > 10%.
        let r = c.balance_partition_leaders();
        assert_eq!(r.response, 1);
        commit(&mut c, r.records);
        assert_eq!(partition(&c, "t").leader, 1);
        assert_eq!(c.balance_partition_leaders().response, 0);
        // Off: nothing.
        heartbeat(&mut c, 1, true, false);
        heartbeat(&mut c, 1, false, false);
        alter_isr(&mut c, 2, id, &[2, 3, 1]);
        c.config.auto_leader_rebalance_enable = false;
        assert_eq!(c.balance_partition_leaders().response, 0);
        // Below the threshold: nothing.
        c.config.auto_leader_rebalance_enable = true;
        c.config.leader_imbalance_per_broker_percentage = 100;
        assert_eq!(c.balance_partition_leaders().response, 0);
    }

    #[test]
    fn an_eligible_leader_replica_that_comes_back_leads_again() {
        let mut c = controller();
        for id in 1..=2 {
            join(&mut c, id);
        }
        let id = create(&mut c, "t", vec![1, 2], &[]);
        alter_isr(&mut c, 1, id, &[1]);
        heartbeat(&mut c, 1, true, false);
        let p = partition(&c, "t");
        assert_eq!(
            (p.leader, p.isr.clone(), p.elr.clone()),
            (NO_LEADER, vec![], vec![1])
        );
        assert_eq!(p.last_known_elr, vec![1]);
        // handleBrokerUnfenced: the leaderless partition gets its ELR member back as leader.
        heartbeat(&mut c, 1, false, false);
        let p = partition(&c, "t");
        assert_eq!(
            (p.leader, p.isr.clone(), p.elr.clone()),
            (1, vec![1], vec![])
        );
        assert!(p.last_known_elr.is_empty());
        assert_eq!(p.leader_recovery_state, LEADER_RECOVERED);
    }

    /// A new incarnation that does not present its predecessor's epoch (an unclean shutdown,
    /// KIP-966) leaves the ISR and ELR before it registers; one that does keeps them.
    #[test]
    fn an_unclean_restart_leaves_the_isr_and_elr() {
        let mut c = controller();
        for id in 1..=3 {
            join(&mut c, id);
        }
        let id = create(&mut c, "t", vec![1, 2, 3], &[("min.insync.replicas", "3")]);
        alter_isr(&mut c, 1, id, &[1, 2]);
        let p = partition(&c, "t");
        assert_eq!((p.isr.clone(), p.elr.clone()), (vec![1, 2], vec![3]));
        let registration = |id: i32, previous: i64| BrokerRegistrationRequest {
            broker_id: id,
            incarnation_id: Uuid::new_v4(),
            listeners: vec![],
            features: BrokerRegistrationRequest::supported_features(),
            rack: None,
            log_dirs: vec![Uuid::new_v4()],
            previous_broker_epoch: previous,
        };
        // Broker 3 stops and comes back with its previous epoch: a clean restart, still in
        // the ELR.
        heartbeat(&mut c, 3, true, false);
        let e3 = c.image.brokers[&3].epoch;
        let r = c.register_broker(registration(3, e3)).unwrap();
        assert_eq!(r.records.len(), 1, "only the registration: {:?}", r.records);
        commit(&mut c, r.records);
        assert_eq!(partition(&c, "t").elr, vec![3]);
        // Broker 2 stops (fenced: from the ISR into the ELR) and restarts uncleanly (-1): it
        // leaves the ELR first; the epoch is where the change starts.
        heartbeat(&mut c, 2, true, false);
        let p = partition(&c, "t");
        assert_eq!(
            (p.leader, p.isr.clone(), p.elr.clone()),
            (1, vec![1], vec![2, 3])
        );
        let offset = c.image.offset;
        let r = c.register_broker(registration(2, -1)).unwrap();
        assert_eq!(r.response, offset as i64);
        let [MetadataRecord::PartitionChange(change), MetadataRecord::RegisterBroker(_)] =
            r.records.as_slice()
        else {
            panic!("{:?}", r.records)
        };
        assert_eq!(change.eligible_leader_replicas, Some(vec![3]));
        commit(&mut c, r.records);
        let p = partition(&c, "t");
        assert_eq!(
            (p.leader, p.isr.clone(), p.elr.clone()),
            (1, vec![1], vec![3])
        );
        // Broker 3 restarts again, uncleanly: it leaves the ELR.
        let r = c.register_broker(registration(3, -1)).unwrap();
        commit(&mut c, r.records);
        assert!(partition(&c, "t").elr.is_empty());
    }
}
