//! Directory assignment on the active controller (KIP-858; the AssignReplicasToDirs part of
//! Kafka's `ReplicationControlManager`, `handleAssignReplicasToDirs`).
//!
//! A broker with several log directories is placed replicas with the UNASSIGNED directory
//! (the controller cannot know where the broker will put them); once the broker has created
//! or loaded the log, it tells the controller which directory holds it (AssignReplicasToDirs,
//! API 73), and the controller writes the directory into the partition's registration
//! (`PartitionChangeRecord.Directories`). From then on a heartbeat reporting that directory
//! offline moves leadership and ISR membership off the replica
//! ([`Controller::broker_heartbeat`]); an assignment naming a directory that is already
//! offline moves them at once.

use gregor_protocol::error::ErrorCode;
use gregor_protocol::kafka_protocol::messages::assign_replicas_to_dirs_response::{
    DirectoryData, PartitionData, TopicData,
};
use gregor_protocol::kafka_protocol::messages::{
    AssignReplicasToDirsRequest, AssignReplicasToDirsResponse,
};
use uuid::Uuid;

use crate::controller::{Controller, ControllerError, ControllerResult};
use crate::record::MetadataRecord;
use crate::replication_control::PartitionChangeBuilder;

impl Controller {
    /// AssignReplicasToDirs (API 73, KIP-858) from a broker: for each partition, the
    /// directory holding the broker's replica. Each replica whose registration names another
    /// directory gets a `PartitionChangeRecord` with the new `Directories` (a leader that is
    /// no longer acceptable is replaced, as every partition change does). When the named
    /// directory is not an online directory of the broker
    /// ([`Controller::broker_dir_online`]), the replica also leaves leadership and the ISR, as
    /// for a directory reported offline, with the same departure: a partition no other
    /// replica could lead keeps its leader.
    ///
    /// Answers per partition: UNKNOWN_TOPIC_ID for a topic id the image does not have,
    /// UNKNOWN_TOPIC_OR_PARTITION for a partition it does not have, NOT_LEADER_OR_FOLLOWER
    /// when the broker is not one of the partition's replicas.
    ///
    /// # Errors
    /// UNSUPPORTED_VERSION before `metadata.version` 3.7-IV2 (Kafka's
    /// `isDirectoryAssignmentSupported`); STALE_BROKER_EPOCH when the broker is not
    /// registered with that epoch.
    pub fn assign_replicas_to_dirs(
        &self,
        request: &AssignReplicasToDirsRequest,
    ) -> Result<ControllerResult<AssignReplicasToDirsResponse>, ControllerError> {
        if !self.image.is_directory_assignment_supported() {
            return Err(ControllerError::UnsupportedVersion(
                "Directory assignment is not supported yet.".into(),
            ));
        }
        let broker_id = request.broker_id.0;
        self.check_broker_epoch(broker_id, request.broker_epoch)?;
        if !self.image.brokers.contains_key(&broker_id) {
            return Err(ControllerError::BrokerIdNotRegistered(format!(
                "Broker ID {broker_id} is not currently registered"
            )));
        }
        let mut records: Vec<MetadataRecord> = Vec::new();
        let mut response = AssignReplicasToDirsResponse::default();
        // Partitions assigned to an offline directory, in request order, once each.
        let mut offline: Vec<(Uuid, i32)> = Vec::new();
        for dir in &request.directories {
            let dir_online = self.broker_dir_online(broker_id, &dir.id);
            let mut dir_out = DirectoryData::default().with_id(dir.id);
            for topic in &dir.topics {
                let mut topic_out = TopicData::default().with_topic_id(topic.topic_id);
                let t = self.image.topic_by_id(&topic.topic_id);
                if t.is_none() {
                    tracing::warn!(
                        broker_id,
                        topic_id = %topic.topic_id,
                        "AssignReplicasToDirs references an unknown topic id"
                    );
                }
                for pd in &topic.partitions {
                    let index = pd.partition_index;
                    let code = match t {
                        None => ErrorCode::UnknownTopicId,
                        Some(t) => match t.partitions.get(&index) {
                            None => {
                                tracing::warn!(broker_id, topic = %t.name, partition = index,
                                    "AssignReplicasToDirs references an unknown partition");
                                ErrorCode::UnknownTopicOrPartition
                            }
                            Some(p) if !p.replicas.contains(&broker_id) => {
                                tracing::warn!(broker_id, topic = %t.name, partition = index,
                                    "AssignReplicasToDirs references a partition not assigned to the broker");
                                ErrorCode::NotLeaderOrFollower
                            }
                            Some(p) => {
                                let change = PartitionChangeBuilder::new(
                                    &self.image,
                                    p,
                                    t.topic_id,
                                    index,
                                    |r| self.is_acceptable_leader(p, r),
                                )
                                .directory(broker_id, dir.id)
                                .build();
                                if let Some(change) = change {
                                    records.push(change.into());
                                }
                                if !dir_online && !offline.contains(&(t.topic_id, index)) {
                                    offline.push((t.topic_id, index));
                                }
                                tracing::debug!(broker_id, topic = %t.name, partition = index,
                                    dir = %dir.id, dir_online, "replica assigned to a directory");
                                ErrorCode::None
                            }
                        },
                    };
                    topic_out.partitions.push(
                        PartitionData::default()
                            .with_partition_index(index)
                            .with_error_code(code.code()),
                    );
                }
                dir_out.topics.push(topic_out);
            }
            response.directories.push(dir_out);
        }
        for (topic_id, index) in offline {
            let Some(t) = self.image.topic_by_id(&topic_id) else {
                continue;
            };
            let Some(p) = t.partitions.get(&index) else {
                continue;
            };
            let election = self.election_of(&t.name);
            if let Some(change) = self.offline_replica_change(t, election, index, p, broker_id) {
                records.push(change.into());
            }
        }
        Ok(ControllerResult { records, response })
    }
}

#[cfg(test)]
mod tests {
    use gregor_protocol::kafka_protocol::messages::assign_replicas_to_dirs_request as req;
    use gregor_protocol::kafka_protocol::messages::BrokerId;
    use gregor_protocol::metadata_records::{BrokerEndpoint, FeatureLevelRecord};

    use super::*;
    use crate::controller::{BrokerHeartbeatRequest, BrokerRegistrationRequest};
    use crate::image::{PartitionRegistration, METADATA_VERSION_FEATURE, NO_LEADER};
    use crate::record::{DIRECTORY_LOST, DIRECTORY_UNASSIGNED};
    use crate::replication_control::tests::{commit, controller, create, partition};

    /// Registers `id` with the log directories `dirs` and unfences it; its broker epoch.
    fn join_with_dirs(c: &mut Controller, id: i32, dirs: &[Uuid]) -> i64 {
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
                log_dirs: dirs.to_vec(),
                previous_broker_epoch: -1,
            })
            .unwrap();
        let epoch = r.response;
        commit(c, r.records);
        beat(c, id, &[]);
        assert!(!c.image.brokers[&id].fenced);
        epoch
    }

    /// A heartbeat of `id` reporting `offline` directories.
    fn beat(c: &mut Controller, id: i32, offline: &[Uuid]) {
        let r = c
            .broker_heartbeat(BrokerHeartbeatRequest {
                broker_id: id,
                broker_epoch: c.image.brokers[&id].epoch,
                current_metadata_offset: c.image.offset as i64,
                want_fence: false,
                want_shut_down: false,
                cordoned_log_dirs: None,
                offline_log_dirs: offline.to_vec(),
            })
            .unwrap();
        commit(c, r.records);
    }

    /// Three brokers with two log directories each (broker b's are `dirs[b - 1]`) and topic
    /// "t": one partition on replicas 1, 2, 3, led by 1.
    fn cluster() -> (Controller, Vec<[Uuid; 2]>, Uuid) {
        let mut c = controller();
        let dirs: Vec<[Uuid; 2]> = (0..3).map(|_| [Uuid::new_v4(), Uuid::new_v4()]).collect();
        for id in 1..=3 {
            join_with_dirs(&mut c, id, &dirs[(id - 1) as usize]);
        }
        let topic = create(&mut c, "t", vec![1, 2, 3], &[("min.insync.replicas", "2")]);
        (c, dirs, topic)
    }

    /// One partition of one topic in one directory.
    fn request(
        broker: i32,
        epoch: i64,
        dir: Uuid,
        topic: Uuid,
        partitions: &[i32],
    ) -> AssignReplicasToDirsRequest {
        AssignReplicasToDirsRequest::default()
            .with_broker_id(BrokerId(broker))
            .with_broker_epoch(epoch)
            .with_directories(vec![req::DirectoryData::default()
                .with_id(dir)
                .with_topics(vec![req::TopicData::default()
                    .with_topic_id(topic)
                    .with_partitions(
                        partitions
                            .iter()
                            .map(|p| req::PartitionData::default().with_partition_index(*p))
                            .collect(),
                    )])])
    }

    /// Every partition's answer, in order: (topic id, partition, error code).
    fn codes(r: &AssignReplicasToDirsResponse) -> Vec<(Uuid, i32, i16)> {
        r.directories
            .iter()
            .flat_map(|d| &d.topics)
            .flat_map(|t| {
                t.partitions
                    .iter()
                    .map(move |p| (t.topic_id, p.partition_index, p.error_code))
            })
            .collect()
    }

    fn dir_of(p: &PartitionRegistration, broker: i32) -> Uuid {
        let i = p.replicas.iter().position(|r| *r == broker).unwrap();
        p.directories[i]
    }

    /// Sends `r` and commits its records; the answer and the records.
    fn assign(
        c: &mut Controller,
        r: &AssignReplicasToDirsRequest,
    ) -> (AssignReplicasToDirsResponse, Vec<MetadataRecord>) {
        let result = c.assign_replicas_to_dirs(r).unwrap();
        commit(c, result.records.clone());
        (result.response, result.records)
    }

    /// A broker with several directories is placed UNASSIGNED; its assignment writes the
    /// directory into the registration (one PartitionChangeRecord, partition epoch + 1, the
    /// leader and its epoch unchanged); the same assignment again writes nothing.
    #[test]
    fn an_assignment_names_the_replicas_directory_once() {
        let (mut c, dirs, topic) = cluster();
        let before = partition(&c, "t");
        assert_eq!(before.directories, vec![DIRECTORY_UNASSIGNED; 3]);
        let epoch = c.image.brokers[&2].epoch;
        let r = request(2, epoch, dirs[1][1], topic, &[0]);
        let (answer, records) = assign(&mut c, &r);
        assert_eq!(codes(&answer), vec![(topic, 0, 0)]);
        assert_eq!(answer.directories[0].id, dirs[1][1]);
        let [MetadataRecord::PartitionChange(change)] = records.as_slice() else {
            panic!("{records:?}")
        };
        assert_eq!(
            change.directories,
            Some(vec![DIRECTORY_UNASSIGNED, dirs[1][1], DIRECTORY_UNASSIGNED])
        );
        assert_eq!(change.isr, None);
        let after = partition(&c, "t");
        assert_eq!(dir_of(&after, 2), dirs[1][1]);
        assert_eq!(
            (after.leader, after.leader_epoch, after.isr.clone()),
            (before.leader, before.leader_epoch, before.isr.clone())
        );
        assert_eq!(after.partition_epoch, before.partition_epoch + 1);
        let (answer, records) = assign(&mut c, &r);
        assert_eq!(codes(&answer), vec![(topic, 0, 0)]);
        assert!(records.is_empty(), "nothing changes: {records:?}");
        // Moving it to the broker's other directory is a change again.
        let (_, records) = assign(&mut c, &request(2, epoch, dirs[1][0], topic, &[0]));
        assert_eq!(records.len(), 1);
        assert_eq!(dir_of(&partition(&c, "t"), 2), dirs[1][0]);
    }

    /// Kafka's errors: per partition UNKNOWN_TOPIC_ID, UNKNOWN_TOPIC_OR_PARTITION and
    /// NOT_LEADER_OR_FOLLOWER (the others of the request still assigned); for the request
    /// STALE_BROKER_EPOCH (a wrong epoch, an unknown broker) and UNSUPPORTED_VERSION before
    /// metadata.version 3.7-IV2.
    #[test]
    fn kafkas_errors() {
        let (mut c, dirs, topic) = cluster();
        let epoch = c.image.brokers[&1].epoch;
        let other = create(&mut c, "elsewhere", vec![2, 3], &[]);
        let unknown = Uuid::new_v4();
        let mut r = request(1, epoch, dirs[0][0], topic, &[0, 7]);
        r.directories[0].topics.push(
            req::TopicData::default()
                .with_topic_id(unknown)
                .with_partitions(vec![
                    req::PartitionData::default().with_partition_index(0),
                    req::PartitionData::default().with_partition_index(1),
                ]),
        );
        r.directories[0].topics.push(
            req::TopicData::default()
                .with_topic_id(other)
                .with_partitions(vec![req::PartitionData::default().with_partition_index(0)]),
        );
        let (answer, records) = assign(&mut c, &r);
        assert_eq!(
            codes(&answer),
            vec![
                (topic, 0, ErrorCode::None.code()),
                (topic, 7, ErrorCode::UnknownTopicOrPartition.code()),
                (unknown, 0, ErrorCode::UnknownTopicId.code()),
                (unknown, 1, ErrorCode::UnknownTopicId.code()),
                (other, 0, ErrorCode::NotLeaderOrFollower.code()),
            ]
        );
        assert_eq!(records.len(), 1, "{records:?}");
        assert_eq!(dir_of(&partition(&c, "t"), 1), dirs[0][0]);
        assert_eq!(
            c.image.topic("elsewhere").unwrap().partitions[&0].directories,
            vec![DIRECTORY_UNASSIGNED; 2]
        );

        let stale = c.assign_replicas_to_dirs(&request(1, epoch + 1, dirs[0][0], topic, &[0]));
        assert_eq!(
            stale.map(|_| ()).unwrap_err().error_code(),
            ErrorCode::StaleBrokerEpoch
        );
        let unregistered = c.assign_replicas_to_dirs(&request(9, epoch, dirs[0][0], topic, &[0]));
        assert_eq!(
            unregistered.map(|_| ()).unwrap_err().error_code(),
            ErrorCode::StaleBrokerEpoch
        );

        commit(
            &mut c,
            vec![FeatureLevelRecord {
                name: METADATA_VERSION_FEATURE.into(),
                feature_level: crate::image::MV_3_7_IV2 - 1,
                ..Default::default()
            }
            .into()],
        );
        let old = c.assign_replicas_to_dirs(&request(1, epoch, dirs[0][1], topic, &[0]));
        assert_eq!(
            old.map(|_| ()).unwrap_err().error_code(),
            ErrorCode::UnsupportedVersion
        );
    }

    /// The point of assignments: before one, a heartbeat reporting the leader's directory
    /// offline cannot tell which partitions are in it (UNASSIGNED) and moves nothing; after
    /// it, the same report moves leadership and ISR membership off the replica.
    #[test]
    fn an_offline_directory_moves_only_assigned_replicas() {
        // Before an assignment: the report changes the registration's online dirs only.
        let (mut unassigned, dirs, _) = cluster();
        assert_eq!(partition(&unassigned, "t").leader, 1);
        beat(&mut unassigned, 1, &[dirs[0][0]]);
        assert_eq!(unassigned.image.brokers[&1].directories, vec![dirs[0][1]]);
        let p = partition(&unassigned, "t");
        assert_eq!((p.leader, p.isr.clone()), (1, vec![1, 2, 3]));

        let (mut c, dirs, topic) = cluster();
        assert_eq!(partition(&c, "t").leader, 1);
        let epoch = c.image.brokers[&1].epoch;
        assign(&mut c, &request(1, epoch, dirs[0][0], topic, &[0]));
        beat(&mut c, 1, &[dirs[0][0]]);
        let p = partition(&c, "t");
        assert_ne!(p.leader, 1);
        assert_ne!(p.leader, NO_LEADER);
        assert_eq!(p.isr, vec![2, 3]);
        assert_eq!(c.image.brokers[&1].directories, vec![dirs[0][1]]);
    }

    /// An assignment naming a directory that is already offline (reported before the
    /// assignment arrived, or LOST) also moves leadership and the ISR off the replica, in
    /// the same batch; with no other replica to lead, the leader stays.
    #[test]
    fn an_assignment_to_an_offline_directory_moves_leadership() {
        let (mut c, dirs, topic) = cluster();
        beat(&mut c, 1, &[dirs[0][0]]);
        assert_eq!(
            partition(&c, "t").leader,
            1,
            "UNASSIGNED: nothing moved yet"
        );
        let epoch = c.image.brokers[&1].epoch;
        let (answer, records) = assign(&mut c, &request(1, epoch, dirs[0][0], topic, &[0]));
        assert_eq!(codes(&answer), vec![(topic, 0, 0)]);
        let [MetadataRecord::PartitionChange(dir), MetadataRecord::PartitionChange(moved)] =
            records.as_slice()
        else {
            panic!("{records:?}")
        };
        assert!(dir.directories.is_some());
        assert_eq!(moved.isr, Some(vec![2, 3]));
        let p = partition(&c, "t");
        assert_eq!(dir_of(&p, 1), dirs[0][0]);
        assert_eq!(p.leader, 2);
        assert_eq!(p.isr, vec![2, 3]);

        // LOST is never online; a follower assigned to it leaves the ISR.
        let epoch3 = c.image.brokers[&3].epoch;
        assign(&mut c, &request(3, epoch3, DIRECTORY_LOST, topic, &[0]));
        let p = partition(&c, "t");
        assert_eq!((p.leader, p.isr.clone()), (2, vec![2]));

        // A single replica keeps its leader (departure: Kafka would leave it leaderless).
        let solo = create(&mut c, "solo", vec![2], &[]);
        let epoch2 = c.image.brokers[&2].epoch;
        beat(&mut c, 2, &[dirs[1][1]]);
        let (_, records) = assign(&mut c, &request(2, epoch2, dirs[1][1], solo, &[0]));
        assert_eq!(records.len(), 1, "the directory only: {records:?}");
        assert_eq!(c.image.topic("solo").unwrap().partitions[&0].leader, 2);
    }
}
