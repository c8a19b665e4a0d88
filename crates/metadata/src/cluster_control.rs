//! Brokers in a cluster, on the active controller (Kafka's `ClusterControlManager`,
//! `BrokerHeartbeatManager` and the broker parts of `ReplicationControlManager`; KIP-631):
//! registration (the broker epoch is the offset of its `RegisterBrokerRecord`), heartbeats
//! (unfence once the broker's metadata has reached its registration; fence when it asks or
//! when its session of `broker.session.timeout.ms` expires; controlled shutdown moves
//! leadership away before the broker is told it may stop), and unregistration. Fencing a
//! broker elects new leaders for the partitions it led (`PartitionChangeRecord`, leader epoch
//! bump; no other ISR member: no leader, -1).
//!
//! Sessions live in memory only, as in Kafka: a controller that starts (or takes over) gives
//! every unfenced broker of the image a full session from the moment it first looks.
//!
//! With `eligible.leader.replicas.version` >= 1 (KIP-966, on in a new Kafka 4.4 cluster) an
//! ISR shrinking below `min.insync.replicas` keeps its members as eligible leader replicas, as
//! Kafka's `PartitionChangeBuilder`; without it an ISR never becomes empty.
//!
//! KIP-966's unclean-shutdown handling: with ELR on, a new incarnation whose previous broker
//! epoch is not its registration's leaves every ISR and ELR at registration (gregor's brokers
//! do not keep their clean-shutdown epoch yet and send -1, so each of their restarts counts as
//! unclean). Offline log directories in heartbeats (KIP-858, `handleDirectoriesOffline`) move
//! leadership and ISR membership off the replicas in them; an amended registration brings
//! them back ([`Controller::register_broker`]). Partition changes are built by
//! [`crate::replication_control::PartitionChangeBuilder`] (with `unclean.leader.election.enable`
//! an out-of-ISR replica may be elected, RECOVERING).

use std::collections::BTreeMap;

use gregor_protocol::metadata_records::{
    BrokerFeature, BrokerRegistrationChangeRecord, PartitionChangeRecord, RegisterBrokerRecord,
    UnregisterBrokerRecord,
};
use uuid::Uuid;

use crate::broker_sessions::Session;
use crate::controller::{
    BrokerHeartbeatReply, BrokerHeartbeatRequest, BrokerRegistrationRequest, Controller,
    ControllerError, ControllerResult,
};
use crate::image::{
    MetadataImage, PartitionRegistration, TopicImage, METADATA_VERSION_FEATURE, NO_LEADER,
};
use crate::record::MetadataRecord;
use crate::replication_control::{Election, PartitionChangeBuilder};

/// `metadata.version` 4.3-IV0: cordoned log directories (KIP-1066) in registrations.
const MV_4_3_IV0: i16 = 30;

/// The feature ranges a gregor broker supports, as it registers them: those Kafka 4.4.0's
/// broker registers (`metadata.version` 3.3-IV3 (7) to 4.4-IV2 (33), and the finalized features
/// `gregor storage format` may set).
pub const SUPPORTED_FEATURES: &[(&str, i16, i16)] = &[
    ("eligible.leader.replicas.version", 0, 1),
    ("group.version", 0, 1),
    ("kraft.version", 0, 1),
    (METADATA_VERSION_FEATURE, 7, 33),
    ("share.version", 0, 2),
    ("streams.version", 0, 1),
    ("transaction.version", 0, 2),
];

/// The finalized features of `finalized` (name -> level, as in
/// [`MetadataImage::features`]) outside [`SUPPORTED_FEATURES`], one sentence each, as a
/// Kafka controller would judge this broker's registration (an unknown feature counts as
/// supported at level 0 only; an unset `metadata.version` is not judged). Empty when a gregor
/// broker may join a cluster with these levels.
pub fn unsupported_finalized_features(finalized: &BTreeMap<String, i16>) -> Vec<String> {
    finalized
        .iter()
        .filter_map(|(name, level)| {
            let (min, max) = SUPPORTED_FEATURES
                .iter()
                .find(|(n, _, _)| n == name)
                .map_or((0, 0), |(_, min, max)| (*min, *max));
            (!(min..=max).contains(level)).then(|| {
                format!(
                    "the cluster finalized {name} at level {level}, and this gregor broker \
                     supports levels {min} to {max}"
                )
            })
        })
        .collect()
}

impl BrokerRegistrationRequest {
    /// [`SUPPORTED_FEATURES`] as the request's features.
    pub fn supported_features() -> Vec<BrokerFeature> {
        SUPPORTED_FEATURES
            .iter()
            .map(|(name, min, max)| BrokerFeature {
                name: (*name).to_string(),
                min_supported_version: *min,
                max_supported_version: *max,
                ..BrokerFeature::default()
            })
            .collect()
    }
}

/// `BrokerControlState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Fenced,
    Unfenced,
    ControlledShutdown,
    ShutdownNow,
}

/// `DirectoryId.reserved`: the ids below 100 with no high bits mean MIGRATING, UNASSIGNED,
/// LOST and future markers, never a real directory.
fn reserved_directory(id: &Uuid) -> bool {
    let (high, low) = id.as_u64_pair();
    high == 0 && low < 100
}

impl Controller {
    fn now_ms(&self) -> u64 {
        self.config.clock.now_ms()
    }

    /// Whether `broker`'s incarnation is alive: unfenced, not in controlled shutdown (Kafka
    /// 4.1's KAFKA-19047: a broker that shut down cleanly re-registers at once) and heard from
    /// within the session timeout (`BrokerHeartbeatManager.hasValidSession`).
    fn has_valid_session(&self, broker: i32) -> bool {
        let active = self
            .image
            .brokers
            .get(&broker)
            .is_some_and(|b| !b.fenced && !b.in_controlled_shutdown);
        active
            && self
                .sessions
                .sessions
                .get(&broker)
                .is_none_or(|s| s.last_contact_ms + self.config.session_timeout_ms >= self.now_ms())
    }

    /// Registers a broker (BrokerRegistration): a new incarnation gets a new broker epoch, the
    /// offset its `RegisterBrokerRecord` will have, and starts fenced; the same incarnation
    /// amends its registration and keeps epoch, fencing and controlled-shutdown state. The
    /// answer is the broker epoch.
    ///
    /// # Errors
    /// DUPLICATE_BROKER_REGISTRATION when another incarnation of the id is unfenced and within
    /// its session; UNSUPPORTED_VERSION when the broker's range of a finalized feature (e.g.
    /// `metadata.version`) does not contain the finalized level; INVALID_REGISTRATION for no,
    /// reserved, duplicate or another broker's log directory ids.
    pub fn register_broker(
        &mut self,
        req: BrokerRegistrationRequest,
    ) -> Result<ControllerResult<i64>, ControllerError> {
        let broker_id = req.broker_id;
        let existing = self.image.brokers.get(&broker_id).cloned();
        // This process's own broker: any other incarnation of it died with an earlier process.
        let own_broker = self.config.colocated_broker && broker_id == self.config.node_id;
        if let Some(e) = &existing {
            if e.incarnation_id != req.incarnation_id
                && !own_broker
                && self.has_valid_session(broker_id)
            {
                return Err(ControllerError::DuplicateBrokerRegistration(
                    "Another broker is registered with that broker id.".into(),
                ));
            }
        }
        self.check_features(&req.features)?;
        // Directory assignment (KIP-858) exists from metadata.version 3.7-IV2.
        let directories = self.image.is_directory_assignment_supported();
        if directories {
            self.check_log_dirs(broker_id, &req.log_dirs)?;
        }
        let mut record = RegisterBrokerRecord {
            broker_id,
            incarnation_id: req.incarnation_id,
            end_points: req.listeners,
            features: req.features,
            rack: req.rack,
            log_dirs: if directories { req.log_dirs } else { vec![] },
            ..RegisterBrokerRecord::default()
        };
        let mut records: Vec<MetadataRecord> = Vec::new();
        match existing {
            Some(e) if e.incarnation_id == req.incarnation_id => {
                record.broker_epoch = e.epoch;
                record.fenced = e.fenced;
                record.in_controlled_shutdown = e.in_controlled_shutdown;
            }
            existing => {
                // KIP-966: a new incarnation that does not present the epoch its predecessor
                // shut down cleanly with may have lost data: it leaves every ISR and ELR (and
                // may not be elected from them) before it registers.
                if existing.is_some_and(|e| e.epoch != req.previous_broker_epoch)
                    && crate::replication_control::elr_enabled(&self.image)
                {
                    self.unclean_shutdown_records(broker_id, &mut records);
                }
                // Kafka's rule: the broker epoch is the offset the change starts at (the
                // record's own offset when nothing precedes it).
                record.broker_epoch = i64::try_from(self.write_offset()).unwrap_or(i64::MAX);
                record.fenced = true;
                self.sessions.sessions.remove(&broker_id);
            }
        }
        let epoch = record.broker_epoch;
        let now = self.now_ms();
        self.sessions
            .sessions
            .entry(broker_id)
            .or_insert(Session {
                last_contact_ms: now,
                metadata_offset: -1,
                controlled_shutdown_offset: None,
                offline_dirs: Default::default(),
            })
            .last_contact_ms = now;
        records.push(record.into());
        Ok(ControllerResult {
            records,
            response: epoch,
        })
    }

    /// Every topic, by name (so records come out in a stable order), with the election its
    /// leaderless partitions get: unclean where `unclean.leader.election.enable` is set.
    fn topics_by_name(&self) -> Vec<(&TopicImage, Election)> {
        let mut topics: Vec<&TopicImage> = self.image.topics.values().map(|t| &**t).collect();
        topics.sort_by(|a, b| a.name.cmp(&b.name));
        topics
            .into_iter()
            .map(|t| (t, self.election_of(&t.name)))
            .collect()
    }

    /// `handleBrokerUncleanShutdown` (KIP-966): the broker leaves the ISR and ELR of every
    /// partition that has it there, and may not be elected from them.
    fn unclean_shutdown_records(&self, broker_id: i32, records: &mut Vec<MetadataRecord>) {
        let image: &MetadataImage = &self.image;
        for (t, election) in self.topics_by_name() {
            for (partition_id, p) in &t.partitions {
                if !p.isr.contains(&broker_id) && !p.elr.contains(&broker_id) {
                    continue;
                }
                let acceptable = |r: i32| r != broker_id && self.is_acceptable_leader(p, r);
                let change =
                    PartitionChangeBuilder::new(image, p, t.topic_id, *partition_id, acceptable)
                        .election(election)
                        .unclean_shutdown_replicas(vec![broker_id])
                        .target_isr(p.isr.iter().copied().filter(|r| *r != broker_id).collect())
                        .build();
                if let Some(change) = change {
                    records.push(change.into());
                }
            }
        }
    }

    fn check_features(&self, features: &[BrokerFeature]) -> Result<(), ControllerError> {
        let unsupported = |name: &str, finalized: i16, min: i16, max: i16| {
            ControllerError::UnsupportedVersion(format!(
                "Unable to register because the broker does not support finalized version {finalized} of {name}. The broker wants a version between {min} and {max}, inclusive."
            ))
        };
        for f in features {
            let Some(finalized) = self.image.features.get(&f.name).copied().or(
                // Kafka's default: metadata.version 1 when unset, other features 0. gregor's
                // one-voter file log holds no bootstrap records, so an unset metadata.version
                // is not checked.
                (f.name != METADATA_VERSION_FEATURE).then_some(0),
            ) else {
                continue;
            };
            if !(f.min_supported_version..=f.max_supported_version).contains(&finalized) {
                return Err(unsupported(
                    &f.name,
                    finalized,
                    f.min_supported_version,
                    f.max_supported_version,
                ));
            }
        }
        for (name, finalized) in &self.image.features {
            if *finalized != 0 && !features.iter().any(|f| &f.name == name) {
                return Err(unsupported(name, *finalized, 0, 0));
            }
        }
        Ok(())
    }

    fn check_log_dirs(&self, broker_id: i32, dirs: &[Uuid]) -> Result<(), ControllerError> {
        let invalid = |m: String| ControllerError::InvalidRegistration(m);
        if dirs.is_empty() {
            return Err(invalid("No directories specified in request".into()));
        }
        if dirs.iter().any(reserved_directory) {
            return Err(invalid("Reserved directory ID in request".into()));
        }
        let mut sorted = dirs.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != dirs.len() {
            return Err(invalid("Duplicate directory ID in request".into()));
        }
        for b in self.image.brokers.values() {
            if b.broker_id == broker_id {
                continue;
            }
            if let Some(d) = dirs.iter().find(|d| b.directories.contains(d)) {
                return Err(invalid(format!(
                    "Broker {} is already registered with directory {d}",
                    b.broker_id
                )));
            }
        }
        Ok(())
    }

    pub(crate) fn check_broker_epoch(
        &self,
        broker_id: i32,
        epoch: i64,
    ) -> Result<(), ControllerError> {
        match self.image.brokers.get(&broker_id) {
            None => Err(ControllerError::StaleBrokerEpoch(format!(
                "No broker registration found for broker id {broker_id}"
            ))),
            Some(b) if b.epoch != epoch => Err(ControllerError::StaleBrokerEpoch(format!(
                "Expected broker epoch {}, but got broker epoch {epoch}",
                b.epoch
            ))),
            Some(_) => Ok(()),
        }
    }

    fn has_leaderships(&self, broker: i32) -> bool {
        self.image
            .topics
            .values()
            .any(|t| t.partitions.values().any(|p| p.leader == broker))
    }

    /// The lowest metadata offset of the active brokers (unfenced, not shutting down); i64::MAX
    /// when there are none.
    fn lowest_active_offset(&self) -> i64 {
        self.image
            .brokers
            .values()
            .filter(|b| !b.fenced && !b.in_controlled_shutdown)
            .map(|b| {
                self.sessions
                    .sessions
                    .get(&b.broker_id)
                    .map_or(-1, |s| s.metadata_offset)
            })
            .min()
            .unwrap_or(i64::MAX)
    }

    fn current_state(&self, broker: i32) -> State {
        // Fencing ends a controlled shutdown (Kafka's heartbeat manager forgets the shutdown
        // offset), though the registration keeps its InControlledShutdown flag.
        match self.image.brokers.get(&broker) {
            Some(b) if b.fenced => State::Fenced,
            Some(b) if b.in_controlled_shutdown => State::ControlledShutdown,
            Some(_) => State::Unfenced,
            None => State::ShutdownNow,
        }
    }

    /// `BrokerHeartbeatManager.calculateNextBrokerState`.
    fn next_state(&self, req: &BrokerHeartbeatRequest, registration_offset: i64) -> State {
        let current = self.current_state(req.broker_id);
        match current {
            State::Fenced if req.want_shut_down => State::ShutdownNow,
            State::Fenced
                if !req.want_fence && req.current_metadata_offset >= registration_offset =>
            {
                State::Unfenced
            }
            State::Fenced => State::Fenced,
            State::Unfenced if req.want_fence && req.want_shut_down => State::ShutdownNow,
            State::Unfenced if req.want_fence => State::Fenced,
            State::Unfenced if req.want_shut_down => {
                if self.has_leaderships(req.broker_id) {
                    State::ControlledShutdown
                } else {
                    State::ShutdownNow
                }
            }
            State::Unfenced => State::Unfenced,
            State::ControlledShutdown => {
                if self.has_leaderships(req.broker_id) {
                    return State::ControlledShutdown;
                }
                let shutdown_offset = self
                    .sessions
                    .sessions
                    .get(&req.broker_id)
                    .and_then(|s| s.controlled_shutdown_offset)
                    .unwrap_or(i64::MAX);
                if shutdown_offset <= self.lowest_active_offset() {
                    State::ShutdownNow
                } else {
                    State::ControlledShutdown
                }
            }
            State::ShutdownNow => State::ShutdownNow,
        }
    }

    /// A heartbeat (BrokerHeartbeat): renews the broker's session and moves it between fenced,
    /// unfenced, controlled shutdown and shut down as Kafka's `BrokerHeartbeatManager`. A
    /// fenced broker is unfenced (`BrokerRegistrationChangeRecord` fenced = -1) once its
    /// metadata offset reached its registration's, and leaderless partitions it can lead get
    /// it as leader; a broker that wants to shut down and leads partitions enters controlled
    /// shutdown (InControlledShutdown = 1, leadership moved away) and is told to shut down once
    /// it leads nothing and every active broker has seen those changes; then it is fenced.
    ///
    /// # Errors
    /// STALE_BROKER_EPOCH when the broker is not registered at that epoch.
    pub fn broker_heartbeat(
        &mut self,
        req: BrokerHeartbeatRequest,
    ) -> Result<ControllerResult<BrokerHeartbeatReply>, ControllerError> {
        let broker_id = req.broker_id;
        self.check_broker_epoch(broker_id, req.broker_epoch)?;
        let registration_offset = self
            .sessions
            .register_offsets
            .get(&broker_id)
            .copied()
            .unwrap_or(req.broker_epoch);
        let current = self.current_state(broker_id);
        let next = self.next_state(&req, registration_offset);
        let mut records = Vec::new();
        self.cordoned_records(
            broker_id,
            req.broker_epoch,
            req.cordoned_log_dirs.as_deref(),
            &mut records,
        );
        // Offline directories are handled in a heartbeat that changes nothing else: a state
        // change (fencing, controlled shutdown) built from the same image would move the same
        // partitions twice; the next heartbeat reports them again.
        if current == next && self.image.is_directory_assignment_supported() {
            let now = self.now_ms();
            let reported: std::collections::BTreeSet<Uuid> =
                req.offline_log_dirs.iter().copied().collect();
            let session = self.sessions.sessions.entry(broker_id).or_insert(Session {
                last_contact_ms: now,
                metadata_offset: -1,
                controlled_shutdown_offset: None,
                offline_dirs: Default::default(),
            });
            let previous = std::mem::replace(&mut session.offline_dirs, reported);
            self.offline_dir_records(
                broker_id,
                req.broker_epoch,
                &req.offline_log_dirs,
                &previous,
                &mut records,
            );
        }
        if current != next {
            match next {
                State::Fenced | State::ShutdownNow => self.fence_records(broker_id, &mut records),
                State::Unfenced => self.unfence_records(broker_id, req.broker_epoch, &mut records),
                State::ControlledShutdown => {
                    self.controlled_shutdown_records(broker_id, req.broker_epoch, &mut records)
                }
            }
        }
        let now = self.now_ms();
        let end_offset =
            i64::try_from(self.write_offset() + records.len() as u64).unwrap_or(i64::MAX) - 1;
        let session = self.sessions.sessions.entry(broker_id).or_insert(Session {
            last_contact_ms: now,
            metadata_offset: -1,
            controlled_shutdown_offset: None,
            offline_dirs: Default::default(),
        });
        session.last_contact_ms = now;
        session.metadata_offset = req.current_metadata_offset;
        if next == State::ControlledShutdown && session.controlled_shutdown_offset.is_none() {
            session.controlled_shutdown_offset = Some(end_offset);
        }
        Ok(ControllerResult {
            records,
            response: BrokerHeartbeatReply {
                is_caught_up: req.current_metadata_offset >= registration_offset,
                is_fenced: matches!(next, State::Fenced | State::ShutdownNow),
                in_controlled_shutdown: next == State::ControlledShutdown,
                should_shut_down: next == State::ShutdownNow,
            },
        })
    }

    /// KIP-1066 (`handleDirectoriesCordoned`): from `metadata.version` 4.3-IV0 a heartbeat
    /// that reports cordoned directories other than the registration's (a set; none recorded
    /// yet counts as different) writes them in a `BrokerRegistrationChangeRecord` (v3). The
    /// record only informs: gregor's placement does not avoid cordoned directories yet.
    fn cordoned_records(
        &self,
        broker_id: i32,
        broker_epoch: i64,
        cordoned: Option<&[Uuid]>,
        records: &mut Vec<MetadataRecord>,
    ) {
        let Some(cordoned) = cordoned else {
            return;
        };
        if self
            .image
            .metadata_version()
            .is_none_or(|mv| mv < MV_4_3_IV0)
        {
            return;
        }
        let Some(broker) = self.image.brokers.get(&broker_id) else {
            return;
        };
        let changed = broker.cordoned_directories.as_ref().is_none_or(|known| {
            let known: std::collections::BTreeSet<_> = known.iter().collect();
            known != cordoned.iter().collect()
        });
        if changed {
            records.push(
                BrokerRegistrationChangeRecord {
                    broker_id,
                    broker_epoch,
                    cordoned_log_dirs: Some(cordoned.to_vec()),
                    ..BrokerRegistrationChangeRecord::default()
                }
                .into(),
            );
        }
    }

    /// Kafka's `handleDirectoriesOffline` (KIP-858), for the directories of `offline` not in
    /// `previous` (what the broker's last handled heartbeat reported): leadership and ISR
    /// membership move off the broker's replicas in them (a `PartitionChangeRecord` each, as
    /// for a fenced broker but only for those partitions), and when the registration keeps
    /// other directories online a `BrokerRegistrationChangeRecord` (v2) records them.
    ///
    /// Departures from Kafka 4.4, whose broker halts once every directory is offline and has
    /// no way back but a restart:
    /// - a partition no other replica could lead keeps its leader (which refuses appends with
    ///   KAFKA_STORAGE_ERROR and still serves reads) instead of going leaderless;
    /// - with no directory left online no `BrokerRegistrationChangeRecord` is written (Kafka's
    ///   replay ignores an empty list); the controller remembers the reported directories in
    ///   the broker's session instead ([`Controller::replica_dir_online`]);
    /// - the directories of `previous` not in `offline` are back: leaderless partitions whose
    ///   replica on this broker is in one of them get it as leader (as at unfencing). A
    ///   directory the registration had dropped comes back with the broker's amended
    ///   registration (same incarnation), as Kafka's broker re-sends its registration.
    fn offline_dir_records(
        &self,
        broker_id: i32,
        broker_epoch: i64,
        offline: &[Uuid],
        previous: &std::collections::BTreeSet<Uuid>,
        records: &mut Vec<MetadataRecord>,
    ) {
        let Some(broker) = self.image.brokers.get(&broker_id) else {
            return;
        };
        let dir_of = |p: &PartitionRegistration| {
            p.replicas
                .iter()
                .position(|r| *r == broker_id)
                .and_then(|i| p.directories.get(i).copied())
        };
        let back: Vec<Uuid> = previous
            .iter()
            .filter(|d| !offline.contains(d))
            .copied()
            .collect();
        if !back.is_empty() {
            tracing::info!(broker_id, dirs = ?back, "log directories of a broker are back online");
            self.leader_and_isr_updates(NO_LEADER, broker_id, records, |p| {
                p.leader == NO_LEADER && dir_of(p).is_some_and(|d| back.contains(&d))
            });
        }
        let newly_offline: Vec<Uuid> = broker
            .directories
            .iter()
            .filter(|d| offline.contains(d) && !previous.contains(d))
            .copied()
            .collect();
        if newly_offline.is_empty() {
            return;
        }
        for (t, election) in self.topics_by_name() {
            for (partition_id, p) in &t.partitions {
                if !dir_of(p).is_some_and(|d| newly_offline.contains(&d)) {
                    continue;
                }
                if let Some(c) =
                    self.offline_replica_change(t, election, *partition_id, p, broker_id)
                {
                    records.push(c.into());
                }
            }
        }
        let online: Vec<Uuid> = broker
            .directories
            .iter()
            .filter(|d| !offline.contains(d))
            .copied()
            .collect();
        tracing::warn!(
            broker_id,
            offline = ?newly_offline,
            remaining = ?online,
            "log directories of a broker are offline; moving leadership and ISR off its replicas in them"
        );
        if !online.is_empty() {
            records.push(
                BrokerRegistrationChangeRecord {
                    broker_id,
                    broker_epoch,
                    log_dirs: online,
                    ..BrokerRegistrationChangeRecord::default()
                }
                .into(),
            );
        }
    }

    /// The change that takes `broker_id`'s replica of partition `partition_id` of `t` out of
    /// leadership and the ISR because its log directory is offline (`handleDirectoriesOffline`
    /// and AssignReplicasToDirs to an offline directory, KIP-858): None when nothing changes,
    /// and when no other replica could lead (the departure described at
    /// [`Controller::offline_dir_records`]: the leader stays).
    pub(crate) fn offline_replica_change(
        &self,
        t: &TopicImage,
        election: Election,
        partition_id: i32,
        p: &PartitionRegistration,
        broker_id: i32,
    ) -> Option<PartitionChangeRecord> {
        let acceptable = |r: i32| r != broker_id && self.is_acceptable_leader(p, r);
        PartitionChangeBuilder::new(&self.image, p, t.topic_id, partition_id, acceptable)
            .election(election)
            .target_isr(p.isr.iter().copied().filter(|r| *r != broker_id).collect())
            .build()
            .filter(|c| c.leader != NO_LEADER)
    }

    /// The election a topic's leaderless partitions get: unclean where
    /// `unclean.leader.election.enable` is set.
    pub(crate) fn election_of(&self, topic: &str) -> Election {
        if self.unclean_leader_election_enabled(topic) {
            Election::Unclean
        } else {
            Election::Online
        }
    }

    /// Unregisters a broker (UnregisterBroker, KIP-631): it leaves every ISR and leadership,
    /// then its registration is removed.
    ///
    /// # Errors
    /// BROKER_ID_NOT_REGISTERED.
    pub fn unregister_broker(
        &mut self,
        broker_id: i32,
    ) -> Result<ControllerResult<()>, ControllerError> {
        let Some(b) = self.image.brokers.get(&broker_id) else {
            return Err(ControllerError::BrokerIdNotRegistered(format!(
                "Broker ID {broker_id} is not currently registered"
            )));
        };
        let epoch = b.epoch;
        let mut records = Vec::new();
        self.leader_and_isr_updates(broker_id, NO_LEADER, &mut records, |p| {
            p.isr.contains(&broker_id) || p.elr.contains(&broker_id)
        });
        records.push(
            UnregisterBrokerRecord {
                broker_id,
                broker_epoch: epoch,
                ..UnregisterBrokerRecord::default()
            }
            .into(),
        );
        self.sessions.sessions.remove(&broker_id);
        Ok(ControllerResult {
            records,
            response: (),
        })
    }

    /// Forgets every broker session (this controller is not active: heartbeats go to the
    /// active one); the next [`Controller::fence_stale_broker`] starts each unfenced broker a
    /// full session from then.
    pub fn forget_sessions(&mut self) {
        self.sessions.sessions.clear();
    }

    /// Fences one broker whose session expired, if any (`maybeFenceOneStaleBroker`; one at a
    /// time so each fencing is committed before the next is decided). The answer is its id.
    pub fn fence_stale_broker(&mut self) -> ControllerResult<Option<i32>> {
        let now = self.now_ms();
        let timeout = self.config.session_timeout_ms;
        let unfenced: Vec<i32> = self
            .image
            .brokers
            .values()
            .filter(|b| !b.fenced)
            .map(|b| b.broker_id)
            .collect();
        let mut stale = None;
        for id in unfenced {
            // A broker the controller has not heard from since it started gets a full session.
            let s = self.sessions.sessions.entry(id).or_insert(Session {
                last_contact_ms: now,
                metadata_offset: -1,
                controlled_shutdown_offset: None,
                offline_dirs: Default::default(),
            });
            if s.last_contact_ms + timeout < now && stale.is_none() {
                stale = Some(id);
            }
        }
        let mut records = Vec::new();
        if let Some(id) = stale {
            tracing::info!(
                broker_id = id,
                "fencing broker because its session has timed out"
            );
            self.fence_records(id, &mut records);
        }
        ControllerResult {
            records,
            response: stale,
        }
    }

    /// `handleBrokerFenced`: leadership and ISR away from the broker, then
    /// `BrokerRegistrationChangeRecord(fenced = 1)`.
    fn fence_records(&self, broker_id: i32, records: &mut Vec<MetadataRecord>) {
        let Some(b) = self.image.brokers.get(&broker_id) else {
            return;
        };
        self.leader_and_isr_updates(broker_id, NO_LEADER, records, |p| {
            p.isr.contains(&broker_id)
        });
        records.push(
            BrokerRegistrationChangeRecord {
                broker_id,
                broker_epoch: b.epoch,
                fenced: 1,
                ..BrokerRegistrationChangeRecord::default()
            }
            .into(),
        );
    }

    /// `handleBrokerUnfenced`: `BrokerRegistrationChangeRecord(fenced = -1)`, then leaders
    /// for the leaderless partitions it can lead.
    fn unfence_records(&self, broker_id: i32, epoch: i64, records: &mut Vec<MetadataRecord>) {
        records.push(
            BrokerRegistrationChangeRecord {
                broker_id,
                broker_epoch: epoch,
                fenced: -1,
                ..BrokerRegistrationChangeRecord::default()
            }
            .into(),
        );
        self.leader_and_isr_updates(NO_LEADER, broker_id, records, |p| p.leader == NO_LEADER);
    }

    /// `handleBrokerInControlledShutdown`: `BrokerRegistrationChangeRecord(InControlledShutdown
    /// = 1)`, then leadership and ISR moved away.
    fn controlled_shutdown_records(
        &self,
        broker_id: i32,
        epoch: i64,
        records: &mut Vec<MetadataRecord>,
    ) {
        if self
            .image
            .brokers
            .get(&broker_id)
            .is_some_and(|b| !b.in_controlled_shutdown)
        {
            records.push(
                BrokerRegistrationChangeRecord {
                    broker_id,
                    broker_epoch: epoch,
                    in_controlled_shutdown: 1,
                    ..BrokerRegistrationChangeRecord::default()
                }
                .into(),
            );
        }
        self.leader_and_isr_updates(broker_id, NO_LEADER, records, |p| {
            p.isr.contains(&broker_id)
        });
    }

    /// `generateLeaderAndIsrUpdates`: for each partition `which` selects, the
    /// `PartitionChangeRecord` of Kafka's `PartitionChangeBuilder`
    /// ([`crate::replication_control::PartitionChangeBuilder`]) when something changes:
    /// `remove` leaves the ISR and may not lead, `add` may lead although the image still shows
    /// it fenced; an unclean election when the topic's `unclean.leader.election.enable` is
    /// true.
    pub(crate) fn leader_and_isr_updates(
        &self,
        remove: i32,
        add: i32,
        records: &mut Vec<MetadataRecord>,
        which: impl Fn(&PartitionRegistration) -> bool,
    ) {
        let image: &MetadataImage = &self.image;
        for (t, election) in self.topics_by_name() {
            for (partition_id, p) in &t.partitions {
                if !which(p) {
                    continue;
                }
                let acceptable = |r: i32| {
                    r != remove
                        && (r == add || Controller::is_active(image, r))
                        && self.replica_dir_online(p, r)
                };
                let change =
                    PartitionChangeBuilder::new(image, p, t.topic_id, *partition_id, acceptable)
                        .election(election)
                        .target_isr(p.isr.iter().copied().filter(|r| *r != remove).collect())
                        .build();
                if let Some(change) = change {
                    records.push(change.into());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use gregor_protocol::metadata_records::{BrokerEndpoint, FeatureLevelRecord};

    use super::*;
    use crate::controller::{
        ControllerConfig, ManualClock, NewTopic, DEFAULT_BROKER_SESSION_TIMEOUT_MS,
    };
    use crate::image::ELR_FEATURE;
    use crate::log::CommittedBatch;

    struct Cluster {
        c: Controller,
        clock: Arc<ManualClock>,
    }

    fn cluster() -> Cluster {
        let clock = Arc::new(ManualClock::default());
        let mut c = Controller::with_config(
            MetadataImage::default(),
            ControllerConfig {
                session_timeout_ms: DEFAULT_BROKER_SESSION_TIMEOUT_MS,
                clock: clock.clone(),
                placement_seed: Some(7),
                ..ControllerConfig::default()
            },
        );
        commit(
            &mut c,
            vec![FeatureLevelRecord {
                name: METADATA_VERSION_FEATURE.into(),
                feature_level: 33,
                ..Default::default()
            }
            .into()],
        );
        Cluster { c, clock }
    }

    /// Commits `records` as the next batch (what the log and the controller task do).
    fn commit(c: &mut Controller, records: Vec<MetadataRecord>) {
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

    fn request(broker_id: i32) -> BrokerRegistrationRequest {
        BrokerRegistrationRequest {
            broker_id,
            incarnation_id: Uuid::new_v4(),
            listeners: vec![BrokerEndpoint {
                name: "PLAINTEXT".into(),
                host: "127.0.0.1".into(),
                port: 9092 + broker_id as u16,
                security_protocol: 0,
                ..Default::default()
            }],
            features: BrokerRegistrationRequest::supported_features(),
            rack: Some(format!("rack-{broker_id}")),
            log_dirs: vec![Uuid::new_v4()],
            previous_broker_epoch: -1,
        }
    }

    fn heartbeat(broker_id: i32, epoch: i64, offset: i64) -> BrokerHeartbeatRequest {
        BrokerHeartbeatRequest {
            broker_id,
            broker_epoch: epoch,
            current_metadata_offset: offset,
            want_fence: false,
            want_shut_down: false,
            cordoned_log_dirs: None,
            offline_log_dirs: Vec::new(),
        }
    }

    impl Cluster {
        fn register(&mut self, req: BrokerRegistrationRequest) -> Result<i64, ControllerError> {
            let r = self.c.register_broker(req)?;
            commit(&mut self.c, r.records);
            Ok(r.response)
        }

        fn beat(
            &mut self,
            req: BrokerHeartbeatRequest,
        ) -> Result<(BrokerHeartbeatReply, Vec<MetadataRecord>), ControllerError> {
            let r = self.c.broker_heartbeat(req)?;
            commit(&mut self.c, r.records.clone());
            Ok((r.response, r.records))
        }

        /// Registers and unfences `broker_id`; its epoch.
        fn join(&mut self, broker_id: i32) -> i64 {
            let epoch = self.register(request(broker_id)).unwrap();
            let offset = self.offset();
            let (reply, _) = self.beat(heartbeat(broker_id, epoch, offset)).unwrap();
            assert!(!reply.is_fenced);
            epoch
        }

        fn offset(&self) -> i64 {
            self.c.image.offset as i64 - 1
        }

        fn create(
            &mut self,
            name: &str,
            partitions: i32,
            rf: i16,
        ) -> Result<Uuid, ControllerError> {
            let r = self.c.create_topics(
                vec![NewTopic {
                    name: name.into(),
                    num_partitions: partitions,
                    replication_factor: rf,
                    assignments: vec![],
                    configs: BTreeMap::new(),
                }],
                false,
            );
            commit(&mut self.c, r.records);
            r.response.into_iter().next().unwrap()
        }

        /// Turns on `eligible.leader.replicas.version` (KIP-966).
        fn enable_elr(&mut self) {
            commit(
                &mut self.c,
                vec![FeatureLevelRecord {
                    name: ELR_FEATURE.into(),
                    feature_level: 1,
                    ..Default::default()
                }
                .into()],
            );
        }

        /// Creates `name` with one partition on `replicas`, its first the leader.
        fn create_on(&mut self, name: &str, replicas: Vec<i32>) {
            let r = self.c.create_topics(
                vec![NewTopic {
                    name: name.into(),
                    num_partitions: -1,
                    replication_factor: -1,
                    assignments: vec![replicas],
                    configs: BTreeMap::new(),
                }],
                false,
            );
            commit(&mut self.c, r.records);
        }

        fn partition(&self, topic: &str, p: i32) -> PartitionRegistration {
            self.c.image.topic(topic).unwrap().partitions[&p].clone()
        }
    }

    #[test]
    fn finalized_features_outside_the_supported_ranges_are_named() {
        let levels = |l: &[(&str, i16)]| -> BTreeMap<String, i16> {
            l.iter().map(|(n, v)| ((*n).to_string(), *v)).collect()
        };
        assert!(unsupported_finalized_features(&levels(&[
            (METADATA_VERSION_FEATURE, 33),
            ("transaction.version", 2),
            ("kraft.version", 0),
        ]))
        .is_empty());
        assert_eq!(
            unsupported_finalized_features(&levels(&[
                (METADATA_VERSION_FEATURE, 34),
                ("some.future.version", 1),
                ("other.future.version", 0),
            ])),
            [
                "the cluster finalized metadata.version at level 34, and this gregor broker supports levels 7 to 33",
                "the cluster finalized some.future.version at level 1, and this gregor broker supports levels 0 to 0",
            ]
        );
    }

    /// KIP-1066 as Kafka 4.4's `handleDirectoriesCordoned`: a heartbeat (v2) with cordoned
    /// dirs other than the registration's writes them once; none reported changes nothing;
    /// before metadata.version 4.3-IV0 nothing is written.
    #[test]
    fn cordoned_log_dirs_from_heartbeats_are_recorded_once() {
        let mut k = cluster();
        let epoch = k.join(1);
        assert_eq!(k.c.image.brokers[&1].cordoned_directories, None);
        let dir = k.c.image.brokers[&1].directories[0];
        let mut beat = heartbeat(1, epoch, k.offset());
        beat.cordoned_log_dirs = Some(vec![]);
        let (_, records) = k.beat(beat.clone()).unwrap();
        let [MetadataRecord::BrokerRegistrationChange(r)] = records.as_slice() else {
            panic!("one BrokerRegistrationChangeRecord: {records:?}")
        };
        assert_eq!(
            (
                r.broker_id,
                r.broker_epoch,
                r.cordoned_log_dirs.clone(),
                r.fenced
            ),
            (1, epoch, Some(vec![]), 0),
            "only the cordoned dirs change"
        );
        assert_eq!(k.c.image.brokers[&1].cordoned_directories, Some(vec![]));
        assert!(
            k.beat(beat.clone()).unwrap().1.is_empty(),
            "no change, no record"
        );
        beat.cordoned_log_dirs = None;
        assert!(k.beat(beat.clone()).unwrap().1.is_empty(), "not reported");
        beat.cordoned_log_dirs = Some(vec![dir]);
        assert_eq!(k.beat(beat.clone()).unwrap().1.len(), 1);
        assert_eq!(k.c.image.brokers[&1].cordoned_directories, Some(vec![dir]));

        let mut old = cluster();
        commit(
            &mut old.c,
            vec![FeatureLevelRecord {
                name: METADATA_VERSION_FEATURE.into(),
                feature_level: MV_4_3_IV0 - 1,
                ..Default::default()
            }
            .into()],
        );
        let epoch = old.join(1);
        let mut beat = heartbeat(1, epoch, old.offset());
        beat.cordoned_log_dirs = Some(vec![]);
        assert!(old.beat(beat).unwrap().1.is_empty(), "before 4.3-IV0");
    }

    /// KIP-858 as Kafka's `handleDirectoriesOffline`: a heartbeat reporting a directory
    /// offline moves leadership and ISR membership off the broker's replicas in it, once.
    #[test]
    fn offline_log_dirs_move_leadership_and_isr_off_the_replicas_in_them() {
        let mut k = cluster();
        let epochs: Vec<i64> = (1..=3).map(|b| k.join(b)).collect();
        k.create("t", 6, 3).unwrap();
        let led = |k: &Cluster, b: i32| (0..6).filter(|p| k.partition("t", *p).leader == b).count();
        assert!(led(&k, 1) > 0);
        let dir = k.c.image.brokers[&1].directories[0];
        assert!((0..6).all(|p| k.partition("t", p).directories.contains(&dir)));
        let mut beat = heartbeat(1, epochs[0], k.offset());
        beat.offline_log_dirs = vec![dir];
        let (reply, records) = k.beat(beat.clone()).unwrap();
        assert!(!reply.is_fenced);
        assert_eq!(records.len(), 6, "one change per partition: {records:?}");
        assert!(records
            .iter()
            .all(|r| matches!(r, MetadataRecord::PartitionChange(_))));
        for p in 0..6 {
            let reg = k.partition("t", p);
            assert!(!reg.isr.contains(&1), "{reg:?}");
            assert_ne!(reg.leader, 1);
            assert_ne!(reg.leader, NO_LEADER);
        }
        // Its only directory: the registration keeps it (no record that would change nothing),
        // the session knows it is offline.
        assert_eq!(k.c.image.brokers[&1].directories, vec![dir]);
        assert!(!k.c.replica_dir_online(&k.partition("t", 0), 1));
        assert!(k.beat(beat).unwrap().1.is_empty(), "nothing left to move");
        // Back online: acceptable again (the leader's AlterPartition brings it into ISRs).
        let (_, records) = k.beat(heartbeat(1, epochs[0], k.offset())).unwrap();
        assert!(
            records.is_empty(),
            "every partition has a leader: {records:?}"
        );
        assert!(k.c.is_acceptable_leader(&k.partition("t", 0), 1));
        // A dir the registration does not have is ignored.
        let mut beat = heartbeat(2, epochs[1], k.offset());
        beat.offline_log_dirs = vec![Uuid::new_v4()];
        assert!(k.beat(beat).unwrap().1.is_empty());
    }

    /// A partition no other replica can lead keeps its leader on the offline directory (it
    /// refuses appends and serves reads) instead of going leaderless (departure: Kafka halts).
    #[test]
    fn a_leader_no_other_replica_could_replace_stays() {
        let mut k = cluster();
        let epoch = k.join(1);
        k.join(2);
        k.create("solo", 4, 1).unwrap();
        let dir = k.c.image.brokers[&1].directories[0];
        let mine: Vec<i32> = (0..4)
            .filter(|p| k.partition("solo", *p).leader == 1)
            .collect();
        assert!(!mine.is_empty());
        let mut beat = heartbeat(1, epoch, k.offset());
        beat.offline_log_dirs = vec![dir];
        let (_, records) = k.beat(beat).unwrap();
        assert!(records.is_empty(), "{records:?}");
        for p in mine {
            assert_eq!(k.partition("solo", p).leader, 1);
        }
    }

    /// A broker with two directories: one offline leaves the other registered online, and
    /// the same incarnation's amended registration brings both back, keeping its epoch and
    /// fencing (Kafka's way back for a directory).
    #[test]
    fn an_offline_dir_comes_back_with_an_amended_registration() {
        let mut k = cluster();
        let mut req = request(1);
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        req.log_dirs = vec![a, b];
        let epoch = k.register(req.clone()).unwrap();
        let offset = k.offset();
        assert!(!k.beat(heartbeat(1, epoch, offset)).unwrap().0.is_fenced);
        let mut beat = heartbeat(1, epoch, k.offset());
        beat.offline_log_dirs = vec![b];
        let (_, records) = k.beat(beat.clone()).unwrap();
        let [MetadataRecord::BrokerRegistrationChange(r)] = records.as_slice() else {
            panic!("{records:?}")
        };
        assert_eq!(r.log_dirs, vec![a]);
        assert_eq!(k.c.image.brokers[&1].directories, vec![a]);
        assert!(k.beat(beat).unwrap().1.is_empty(), "reported once");
        assert_eq!(
            k.register(req).unwrap(),
            epoch,
            "same incarnation: same epoch"
        );
        let reg = &k.c.image.brokers[&1];
        assert_eq!(reg.directories, vec![a, b]);
        assert!(!reg.fenced);
    }

    /// A replica in a directory its broker reported offline is not elected and does not
    /// rejoin the ISR (AlterPartition answers INELIGIBLE_REPLICA).
    #[test]
    fn a_replica_in_an_offline_dir_is_not_acceptable() {
        let mut k = cluster();
        let mut req = request(1);
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        req.log_dirs = vec![a, b];
        let epoch = k.register(req).unwrap();
        let offset = k.offset();
        k.beat(heartbeat(1, epoch, offset)).unwrap();
        k.join(2);
        k.create("t", 1, 2).unwrap();
        let mut p = k.partition("t", 0);
        let i = p.replicas.iter().position(|r| *r == 1).unwrap();
        p.directories[i] = b;
        assert!(k.c.is_acceptable_leader(&p, 1));
        let mut beat = heartbeat(1, epoch, k.offset());
        beat.offline_log_dirs = vec![b];
        k.beat(beat).unwrap();
        assert!(!k.c.is_acceptable_leader(&p, 1));
        assert!(!k.c.replica_dir_online(&p, 1));
        p.directories[i] = a;
        assert!(k.c.is_acceptable_leader(&p, 1));
    }

    #[test]
    fn a_new_registration_is_fenced_with_its_record_offset_as_epoch() {
        let mut k = cluster();
        let req = request(1);
        let r = k.c.register_broker(req.clone()).unwrap();
        assert_eq!(r.response, 1, "the record goes at offset 1");
        let MetadataRecord::RegisterBroker(rec) = &r.records[0] else {
            panic!("{:?}", r.records)
        };
        assert_eq!(
            (rec.broker_epoch, rec.fenced, rec.incarnation_id),
            (1, true, req.incarnation_id)
        );
        assert_eq!(rec.log_dirs, req.log_dirs);
        commit(&mut k.c, r.records);
        let b = &k.c.image.brokers[&1];
        assert!(b.fenced);
        assert_eq!(b.endpoint("PLAINTEXT").unwrap().port, 9093);
        assert_eq!(b.rack.as_deref(), Some("rack-1"));
    }

    #[test]
    fn unfenced_once_caught_up_with_the_registration() {
        let mut k = cluster();
        let epoch = k.register(request(1)).unwrap();
        // Behind its registration record: still fenced, nothing written.
        let (reply, records) = k.beat(heartbeat(1, epoch, epoch - 1)).unwrap();
        assert!(!reply.is_caught_up && reply.is_fenced);
        assert!(records.is_empty());
        let (reply, records) = k.beat(heartbeat(1, epoch, epoch)).unwrap();
        assert!(reply.is_caught_up && !reply.is_fenced && !reply.should_shut_down);
        let MetadataRecord::BrokerRegistrationChange(change) = &records[0] else {
            panic!("{records:?}")
        };
        assert_eq!(
            (change.broker_id, change.broker_epoch, change.fenced),
            (1, epoch, -1)
        );
        assert_eq!(
            crate::codec::encode_record(&records[0]).unwrap()[2],
            0,
            "v0"
        );
        assert!(!k.c.image.brokers[&1].fenced);
    }

    #[test]
    fn caught_up_means_with_the_latest_registration_record() {
        let mut k = cluster();
        let req = request(1);
        let epoch = k.register(req.clone()).unwrap();
        // The same incarnation amends its registration (fenced still): same epoch, a new
        // record further on, which the broker must have seen to be unfenced.
        assert_eq!(k.register(req).unwrap(), epoch);
        let amended_at = k.offset();
        assert!(amended_at > epoch);
        let (reply, records) = k.beat(heartbeat(1, epoch, epoch)).unwrap();
        assert!(!reply.is_caught_up && reply.is_fenced && records.is_empty());
        let (reply, _) = k.beat(heartbeat(1, epoch, amended_at)).unwrap();
        assert!(reply.is_caught_up && !reply.is_fenced);
    }

    #[test]
    fn another_incarnation_is_refused_while_the_session_lives() {
        let mut k = cluster();
        let first = request(1);
        let epoch = k.register(first.clone()).unwrap();
        let offset = k.offset();
        k.beat(heartbeat(1, epoch, offset)).unwrap();
        let e = k.register(request(1)).unwrap_err();
        assert_eq!(e.kafka_error_code(), 101);
        assert_eq!(
            e.to_string(),
            "Another broker is registered with that broker id."
        );
        // The same incarnation amends: epoch and fencing stay.
        let mut amended = first.clone();
        amended.rack = Some("other".into());
        assert_eq!(k.register(amended).unwrap(), epoch);
        assert!(!k.c.image.brokers[&1].fenced);
        assert_eq!(k.c.image.brokers[&1].rack.as_deref(), Some("other"));
        // Once the session expired, a new incarnation gets a new epoch.
        k.clock.advance(DEFAULT_BROKER_SESSION_TIMEOUT_MS);
        assert_eq!(k.register(request(1)).unwrap_err().kafka_error_code(), 101);
        k.clock.advance(1);
        let next = k.register(request(1)).unwrap();
        assert!(next > epoch);
        assert!(k.c.image.brokers[&1].fenced);
    }

    #[test]
    fn a_combined_nodes_own_broker_replaces_its_dead_incarnation_at_once() {
        let mut k = cluster();
        k.c.config.node_id = 1;
        k.c.config.colocated_broker = true;
        let epoch = k.register(request(1)).unwrap();
        let offset = k.offset();
        k.beat(heartbeat(1, epoch, offset)).unwrap();
        assert!(!k.c.image.brokers[&1].fenced);
        // The process restarted (a new incarnation) while the old session still runs.
        let next = k.register(request(1)).unwrap();
        assert!(next > epoch);
        assert!(k.c.image.brokers[&1].fenced);
        // Another node's broker still waits for its session to run out.
        let other = k.register(request(2)).unwrap();
        let offset = k.offset();
        k.beat(heartbeat(2, other, offset)).unwrap();
        assert_eq!(k.register(request(2)).unwrap_err().kafka_error_code(), 101);
    }

    #[test]
    fn unsupported_metadata_version_and_bad_log_dirs_are_refused() {
        let mut k = cluster();
        let mut req = request(1);
        req.features
            .iter_mut()
            .filter(|f| f.name == METADATA_VERSION_FEATURE)
            .for_each(|f| f.max_supported_version = 20);
        let e = k.register(req).unwrap_err();
        assert_eq!(e.kafka_error_code(), 35);
        assert_eq!(
            e.to_string(),
            "Unable to register because the broker does not support finalized version 33 of metadata.version. The broker wants a version between 7 and 20, inclusive."
        );
        let mut no_mv = request(1);
        no_mv
            .features
            .retain(|f| f.name != METADATA_VERSION_FEATURE);
        assert_eq!(k.register(no_mv).unwrap_err().kafka_error_code(), 35);
        let mut req = request(1);
        req.log_dirs = vec![];
        assert_eq!(k.register(req).unwrap_err().kafka_error_code(), 119);
        let mut req = request(1);
        req.log_dirs = vec![crate::record::DIRECTORY_UNASSIGNED];
        assert_eq!(k.register(req).unwrap_err().kafka_error_code(), 119);
        let taken = request(1);
        let dir = taken.log_dirs[0];
        k.register(taken).unwrap();
        let mut req = request(2);
        req.log_dirs = vec![dir];
        let e = k.register(req).unwrap_err();
        assert_eq!(e.kafka_error_code(), 119);
    }

    #[test]
    fn a_stale_broker_epoch_is_refused() {
        let mut k = cluster();
        let epoch = k.join(1);
        let e = k.beat(heartbeat(1, epoch + 1, 100)).unwrap_err();
        assert_eq!(e.kafka_error_code(), 77);
        assert_eq!(
            k.beat(heartbeat(9, 0, 100)).unwrap_err().kafka_error_code(),
            77
        );
    }

    #[test]
    fn an_expired_session_fences_the_broker_and_moves_its_leaderships() {
        let mut k = cluster();
        let e1 = k.join(1);
        let e2 = k.join(2);
        // Manual assignments: [1, 2] led by 1, and [1] alone.
        let r = k.c.create_topics(
            vec![NewTopic {
                name: "t".into(),
                num_partitions: -1,
                replication_factor: -1,
                assignments: vec![vec![1, 2], vec![1]],
                configs: BTreeMap::new(),
            }],
            false,
        );
        assert!(
            matches!(
                r.response.first(),
                Some(Err(ControllerError::InvalidReplicaAssignment(_)))
            ),
            "partitions of different replication factors"
        );
        let r = k.c.create_topics(
            vec![NewTopic {
                name: "t".into(),
                num_partitions: -1,
                replication_factor: -1,
                assignments: vec![vec![1, 2], vec![1, 2]],
                configs: BTreeMap::new(),
            }],
            false,
        );
        commit(&mut k.c, r.records);
        assert_eq!(k.partition("t", 0).leader, 1);
        // Broker 2 keeps heartbeating, broker 1 stops.
        k.clock.advance(5000);
        let offset = k.offset();
        k.beat(heartbeat(2, e2, offset)).unwrap();
        k.clock.advance(4000);
        let r = k.c.fence_stale_broker();
        assert_eq!(r.response, None, "9000 ms is still within the session");
        k.clock.advance(1);
        let r = k.c.fence_stale_broker();
        assert_eq!(r.response, Some(1));
        // One PartitionChangeRecord per partition (leader 2, ISR [2]), then the fencing.
        assert_eq!(r.records.len(), 3, "{:?}", r.records);
        let MetadataRecord::PartitionChange(pc) = &r.records[0] else {
            panic!("{:?}", r.records)
        };
        assert_eq!((pc.leader, pc.isr.as_deref()), (2, Some(&[2][..])));
        assert!(pc.replicas.is_none(), "only what changed");
        let MetadataRecord::BrokerRegistrationChange(f) = &r.records[2] else {
            panic!("{:?}", r.records)
        };
        assert_eq!((f.broker_id, f.broker_epoch, f.fenced), (1, e1, 1));
        let before = k.partition("t", 0);
        commit(&mut k.c, r.records);
        let after = k.partition("t", 0);
        assert_eq!((after.leader, after.isr.clone()), (2, vec![2]));
        assert_eq!(after.leader_epoch, before.leader_epoch + 1);
        assert_eq!(after.partition_epoch, before.partition_epoch + 1);
        assert!(k.c.image.brokers[&1].fenced);
        assert_eq!(
            k.c.fence_stale_broker().response,
            None,
            "one at a time, then none"
        );
        // Broker 2 goes too: no replica is left to lead, the leader becomes -1 and the ISR
        // keeps its last member (no ELR).
        k.clock.advance(DEFAULT_BROKER_SESSION_TIMEOUT_MS + 1);
        let r = k.c.fence_stale_broker();
        assert_eq!(r.response, Some(2));
        commit(&mut k.c, r.records);
        let p = k.partition("t", 0);
        assert_eq!((p.leader, p.isr.clone()), (-1, vec![2]));
        // Broker 2 comes back (caught up): it leads again, at a new leader epoch.
        let offset = k.offset();
        let (reply, records) = k.beat(heartbeat(2, e2, offset)).unwrap();
        assert!(!reply.is_fenced);
        assert!(records.len() == 3, "unfence + 2 elections: {records:?}");
        let p2 = k.partition("t", 0);
        assert_eq!(p2.leader, 2);
        assert_eq!(p2.leader_epoch, p.leader_epoch + 1);
    }

    #[test]
    fn with_elr_a_fenced_last_isr_member_becomes_eligible_and_leads_again() {
        let mut k = cluster();
        k.enable_elr();
        let e1 = k.join(1);
        k.create("t", 1, 1).unwrap();
        k.clock.advance(DEFAULT_BROKER_SESSION_TIMEOUT_MS + 1);
        let r = k.c.fence_stale_broker();
        let MetadataRecord::PartitionChange(pc) = &r.records[0] else {
            panic!("{:?}", r.records)
        };
        assert_eq!(pc.leader, -1);
        assert_eq!(
            pc.isr.as_deref(),
            Some(&[][..]),
            "the ISR may be empty with ELR"
        );
        assert_eq!(pc.eligible_leader_replicas.as_deref(), Some(&[1][..]));
        assert_eq!(pc.last_known_elr.as_deref(), Some(&[1][..]));
        commit(&mut k.c, r.records);
        // Back and caught up: elected from the ELR, which becomes the ISR.
        let offset = k.offset();
        let (reply, _) = k.beat(heartbeat(1, e1, offset)).unwrap();
        assert!(!reply.is_fenced);
        let p = k.partition("t", 0);
        assert_eq!((p.leader, p.isr.clone()), (1, vec![1]));
        assert!(p.elr.is_empty() && p.last_known_elr.is_empty());
    }

    /// The sequence of `kraft_elections`' leaderless check, with ELR on: the follower stops
    /// (controlled shutdown, out of the ISR), then the last ISR member, whose process stops
    /// before the go-ahead; the active controller changes; the follower comes back as a new
    /// incarnation, and the old leader's session expires. The partition stays leaderless at
    /// every step: the returning replica was in neither the ISR nor the ELR.
    #[test]
    fn a_replica_out_of_the_isr_and_elr_is_not_elected_when_it_returns() {
        let mut k = cluster();
        k.enable_elr();
        let e1 = k.join(1);
        let e2 = k.join(2);
        let e3 = k.join(3);
        k.create_on("elect", vec![1, 2]);
        // Broker 2's controlled shutdown, to the go-ahead.
        let mut shut2 = heartbeat(2, e2, k.offset());
        shut2.want_shut_down = true;
        k.beat(shut2.clone()).unwrap();
        for (id, e) in [(1, e1), (3, e3)] {
            let offset = k.offset();
            k.beat(heartbeat(id, e, offset)).unwrap();
        }
        shut2.current_metadata_offset = k.offset();
        let (reply, _) = k.beat(shut2).unwrap();
        assert!(reply.should_shut_down);
        let p = k.partition("elect", 0);
        assert_eq!((p.leader, p.isr.clone()), (1, vec![1]));
        assert!(p.elr.is_empty());
        // Broker 1's controlled shutdown begins; its process stops before the go-ahead.
        let mut shut1 = heartbeat(1, e1, k.offset());
        shut1.want_shut_down = true;
        let (reply, _) = k.beat(shut1).unwrap();
        assert!(!reply.should_shut_down);
        let p = k.partition("elect", 0);
        assert_eq!(
            (
                p.leader,
                p.isr.clone(),
                p.elr.clone(),
                p.last_known_elr.clone()
            ),
            (-1, vec![], vec![1], vec![1])
        );
        // Another controller takes over; broker 2 registers again (no clean-shutdown epoch)
        // and catches up.
        k.c.forget_sessions();
        assert_eq!(k.c.fence_stale_broker().response, None);
        let e2 = k.register(request(2)).unwrap();
        let offset = k.offset();
        let (reply, _) = k.beat(heartbeat(2, e2, offset)).unwrap();
        assert!(!reply.is_fenced);
        assert_eq!(k.partition("elect", 0).leader, -1, "2 was in no ISR or ELR");
        assert_eq!(
            k.c.elect_unclean_leaders().response,
            0,
            "unclean election is off"
        );
        // Broker 1's session expires.
        k.clock.advance(DEFAULT_BROKER_SESSION_TIMEOUT_MS + 1);
        for (id, e) in [(2, e2), (3, e3)] {
            let offset = k.offset();
            k.beat(heartbeat(id, e, offset)).unwrap();
        }
        let r = k.c.fence_stale_broker();
        assert_eq!(r.response, Some(1));
        commit(&mut k.c, r.records);
        let p = k.partition("elect", 0);
        assert_eq!((p.leader, p.elr.clone()), (-1, vec![1]));
        assert_eq!(k.c.elect_unclean_leaders().response, 0);
        assert_eq!(k.partition("elect", 0).leader, -1);
    }

    #[test]
    fn controlled_shutdown_moves_leadership_first() {
        let mut k = cluster();
        let e1 = k.join(1);
        let e2 = k.join(2);
        k.create_on("t", vec![1, 2]);
        let offset = k.offset();
        let mut shut = heartbeat(1, e1, offset);
        shut.want_shut_down = true;
        let (reply, records) = k.beat(shut.clone()).unwrap();
        assert!(reply.in_controlled_shutdown && !reply.should_shut_down && !reply.is_fenced);
        let MetadataRecord::BrokerRegistrationChange(c) = &records[0] else {
            panic!("{records:?}")
        };
        assert_eq!((c.fenced, c.in_controlled_shutdown), (0, 1));
        assert_eq!(
            crate::codec::encode_record(&records[0]).unwrap()[2],
            1,
            "v1"
        );
        assert_eq!(k.partition("t", 0).leader, 2, "leadership moved away");
        assert!(k.c.image.brokers[&1].in_controlled_shutdown);
        // Broker 2 has not yet seen the change: not yet.
        let (reply, _) = k.beat(shut.clone()).unwrap();
        assert!(!reply.should_shut_down);
        let offset = k.offset();
        k.beat(heartbeat(2, e2, offset)).unwrap();
        let (reply, records) = k.beat(shut.clone()).unwrap();
        assert!(reply.should_shut_down && reply.is_fenced);
        assert!(matches!(
            records.last(),
            Some(MetadataRecord::BrokerRegistrationChange(c)) if c.fenced == 1
        ));
        assert!(k.c.image.brokers[&1].fenced);
        // A broker that leads nothing may go at once.
        let offset = k.offset();
        let e3 = k.join(3);
        let mut go = heartbeat(3, e3, offset + 2);
        go.want_shut_down = true;
        let (reply, _) = k.beat(go.clone()).unwrap();
        assert!(reply.should_shut_down);
    }

    #[test]
    fn a_broker_in_controlled_shutdown_may_register_again_at_once() {
        let mut k = cluster();
        let e1 = k.join(1);
        k.join(2);
        k.create_on("t", vec![1, 2]);
        let offset = k.offset();
        let mut shut = heartbeat(1, e1, offset);
        shut.want_shut_down = true;
        let (reply, _) = k.beat(shut.clone()).unwrap();
        assert!(reply.in_controlled_shutdown);
        // Its process stops before the go-ahead; the next one registers within the session.
        let again = k.register(request(1)).unwrap();
        assert!(again > e1);
        let b = &k.c.image.brokers[&1];
        assert!(b.fenced && !b.in_controlled_shutdown);
    }

    #[test]
    fn unregistering_removes_the_broker_from_isrs_and_leadership() {
        let mut k = cluster();
        k.join(1);
        k.join(2);
        let r = k.c.create_topics(
            vec![NewTopic {
                name: "t".into(),
                num_partitions: -1,
                replication_factor: -1,
                assignments: vec![vec![2, 1]],
                configs: BTreeMap::new(),
            }],
            false,
        );
        commit(&mut k.c, r.records);
        let r = k.c.unregister_broker(2).unwrap();
        assert!(
            matches!(r.records.last(), Some(MetadataRecord::UnregisterBroker(u)) if u.broker_id == 2)
        );
        commit(&mut k.c, r.records);
        assert!(!k.c.image.brokers.contains_key(&2));
        let p = k.partition("t", 0);
        assert_eq!((p.leader, p.isr.clone()), (1, vec![1]));
        assert_eq!(
            k.c.unregister_broker(2).unwrap_err().kafka_error_code(),
            102
        );
    }

    #[test]
    fn placement_uses_unfenced_brokers_and_kafkas_errors() {
        let mut k = cluster();
        assert_eq!(
            k.create("none", 1, 1).unwrap_err().to_string(),
            "Unable to replicate the partition 1 time(s): All brokers are currently fenced."
        );
        k.join(1);
        k.join(2);
        k.register(request(3)).unwrap(); // fenced
        let e = k.create("big", 1, 4).unwrap_err();
        assert_eq!(e.kafka_error_code(), 38);
        assert_eq!(
            e.to_string(),
            "Unable to replicate the partition 4 time(s): The target replication factor of 4 cannot be reached because only 3 broker(s) are registered."
        );
        k.create("t", 12, 2).unwrap();
        let t = k.c.image.topic("t").unwrap().clone();
        for p in t.partitions.values() {
            assert_ne!(p.leader, 3, "a fenced broker never leads");
            assert_eq!(p.leader, p.isr[0]);
            assert!(!p.isr.contains(&3), "fenced replicas are not in the ISR");
            assert_eq!((p.leader_epoch, p.partition_epoch), (0, 0));
            assert_eq!(p.directories.len(), 2);
            for (r, d) in p.replicas.iter().zip(&p.directories) {
                assert_eq!(
                    *d, k.c.image.brokers[r].directories[0],
                    "the broker's one log dir"
                );
            }
        }
        let leaders: std::collections::BTreeSet<i32> =
            t.partitions.values().map(|p| p.leader).collect();
        assert_eq!(leaders, [1, 2].into(), "leadership spread");
        // Manual assignment: a fenced-only partition is refused as Kafka does.
        let r = k.c.create_topics(
            vec![NewTopic {
                name: "m".into(),
                num_partitions: -1,
                replication_factor: -1,
                assignments: vec![vec![1], vec![3]],
                configs: BTreeMap::new(),
            }],
            false,
        );
        let e = r.response[0].as_ref().unwrap_err();
        assert_eq!(e.kafka_error_code(), 39);
        assert_eq!(e.to_string(), "All brokers specified in the manual partition assignment for partition 1 are fenced or in controlled shutdown.");
        let r = k.c.create_topics(
            vec![NewTopic {
                name: "m".into(),
                num_partitions: -1,
                replication_factor: -1,
                assignments: vec![vec![1, 1]],
                configs: BTreeMap::new(),
            }],
            false,
        );
        assert_eq!(
            r.response[0].as_ref().unwrap_err().to_string(),
            "The manual partition assignment includes the broker 1 more than once."
        );
    }
}
