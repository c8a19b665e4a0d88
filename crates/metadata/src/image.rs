//! [`MetadataImage`]: the state of the cluster after applying every metadata record in order,
//! as Kafka's `MetadataImage` is built by `MetadataDelta.replay` (KIP-631): features, brokers
//! and controllers (`ClusterDelta`), topics and partitions (`TopicsDelta`/`TopicDelta`,
//! `PartitionRegistration.merge`), configs, client quotas, producer ids, ACLs, SCRAM
//! credentials and delegation tokens. Images are immutable snapshots shared through `Arc`; a
//! change builds a new image.
//!
//! [`MetadataImage::to_records`] is the other way: the records of a snapshot of the image, in
//! the order Kafka's `MetadataImage.write` writes them; applying them to an empty image gives an
//! equal image.
//!
//! A record that cannot apply (a partition of an unknown topic, a broker change with a stale
//! broker epoch) is logged and skipped, where Kafka's loader raises a fault and goes on.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use gregor_protocol::metadata_records::{
    AccessControlEntryRecord, BrokerEndpoint, BrokerFeature, BrokerRegistrationChangeRecord,
    ClientQuotaRecord, ConfigRecord, DelegationTokenRecord, EntityData, FeatureLevelRecord,
    PartitionChangeRecord, PartitionRecord, ProducerIdsRecord, RawTaggedField,
    RegisterBrokerRecord, RegisterControllerRecord, TopicRecord, UserScramCredentialRecord,
};
use uuid::Uuid;

use crate::record::{ConfigResource, MetadataRecord, DIRECTORY_MIGRATING};

/// The feature name of `metadata.version`.
pub const METADATA_VERSION_FEATURE: &str = "metadata.version";

/// The feature that turns on eligible leader replicas (KIP-966).
pub const ELR_FEATURE: &str = "eligible.leader.replicas.version";

/// `PartitionChangeRecord.Leader` value meaning "the leader did not change"
/// (`LeaderConstants.NO_LEADER_CHANGE`).
pub const NO_LEADER_CHANGE: i32 = -2;
/// A partition without a leader (`LeaderConstants.NO_LEADER`).
pub const NO_LEADER: i32 = -1;
/// `metadata.version` 3.7-IV2 (level 17, Kafka's `isDirectoryAssignmentSupported`): brokers
/// register their log directory ids and partitions name each replica's directory (KIP-858).
pub const MV_3_7_IV2: i16 = 17;

/// A registered broker (Kafka's `BrokerRegistration`).
#[derive(Debug, Clone, PartialEq)]
pub struct BrokerRegistration {
    /// `node.id`.
    pub broker_id: i32,
    /// The incarnation id of the broker process (a new one per process start).
    pub incarnation_id: Uuid,
    /// The broker epoch: the offset of its `RegisterBrokerRecord`.
    pub epoch: i64,
    /// Its listeners, as registered (name, host, port, security protocol).
    pub endpoints: Vec<BrokerEndpoint>,
    /// The features it supports: name, min and max level, by name.
    pub features: Vec<BrokerFeature>,
    /// `broker.rack`.
    pub rack: Option<String>,
    /// Fenced: not eligible as leader or ISR member, not given new replicas.
    pub fenced: bool,
    /// In controlled shutdown: leadership is being moved away from it. Fencing does not clear
    /// it (Kafka's `BrokerRegistration.cloneWith`); a new registration does.
    pub in_controlled_shutdown: bool,
    /// A ZooKeeper broker in migration (always false for gregor).
    pub is_migrating_zk_broker: bool,
    /// The ids of its online log directories (KIP-858).
    pub directories: Vec<Uuid>,
    /// Cordoned log directories, None before the broker reported any (KIP-1066).
    pub cordoned_directories: Option<Vec<Uuid>>,
    /// Tagged fields of its record gregor does not know, written back in snapshots.
    pub unknown_tagged_fields: Vec<RawTaggedField>,
}

impl BrokerRegistration {
    /// The registration a `RegisterBrokerRecord` makes (`BrokerRegistration.fromRecord`).
    pub fn from_record(r: &RegisterBrokerRecord) -> Self {
        // Kafka keeps the features in a map, and writes them in its iteration order: the order
        // of a record carries no meaning, so the image keeps them by name.
        let mut features = r.features.clone();
        features.sort_by(|a, b| a.name.cmp(&b.name));
        Self {
            broker_id: r.broker_id,
            incarnation_id: r.incarnation_id,
            epoch: r.broker_epoch,
            endpoints: r.end_points.clone(),
            features,
            rack: r.rack.clone(),
            fenced: r.fenced,
            in_controlled_shutdown: r.in_controlled_shutdown,
            is_migrating_zk_broker: r.is_migrating_zk_broker,
            directories: r.log_dirs.clone(),
            cordoned_directories: r.cordoned_log_dirs.clone(),
            unknown_tagged_fields: r.unknown_tagged_fields.clone(),
        }
    }

    /// The record of this registration in a snapshot (`BrokerRegistration.toRecord`).
    pub fn to_record(&self) -> RegisterBrokerRecord {
        RegisterBrokerRecord {
            broker_id: self.broker_id,
            is_migrating_zk_broker: self.is_migrating_zk_broker,
            incarnation_id: self.incarnation_id,
            broker_epoch: self.epoch,
            end_points: self.endpoints.clone(),
            features: self.features.clone(),
            rack: self.rack.clone(),
            fenced: self.fenced,
            in_controlled_shutdown: self.in_controlled_shutdown,
            log_dirs: self.directories.clone(),
            cordoned_log_dirs: self.cordoned_directories.clone(),
            unknown_tagged_fields: self.unknown_tagged_fields.clone(),
        }
    }

    /// Its endpoint on the listener named `listener` (e.g. `PLAINTEXT`).
    pub fn endpoint(&self, listener: &str) -> Option<&BrokerEndpoint> {
        self.endpoints.iter().find(|e| e.name == listener)
    }

    /// The supported range `(min, max)` of a feature, None when it did not register it.
    pub fn supported(&self, feature: &str) -> Option<(i16, i16)> {
        self.features
            .iter()
            .find(|f| f.name == feature)
            .map(|f| (f.min_supported_version, f.max_supported_version))
    }
}

/// Replica assignment and leadership of one partition (Kafka's `PartitionRegistration`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionRegistration {
    /// Replica broker ids, preferred leader first.
    pub replicas: Vec<i32>,
    /// The log directory of each replica, in the order of `replicas` (KIP-858; `MIGRATING`
    /// when unknown).
    pub directories: Vec<Uuid>,
    /// In-sync replicas.
    pub isr: Vec<i32>,
    /// Replicas being removed by a reassignment.
    pub removing_replicas: Vec<i32>,
    /// Replicas being added by a reassignment.
    pub adding_replicas: Vec<i32>,
    /// Leader broker id, -1 if none.
    pub leader: i32,
    /// 0: the leader was elected from the ISR (or recovered); 1: recovering from an unclean
    /// election.
    pub leader_recovery_state: i8,
    /// Leader epoch: bumps with every leader change.
    pub leader_epoch: i32,
    /// Partition epoch: bumps with every change of the registration.
    pub partition_epoch: i32,
    /// Eligible leader replicas (KIP-966).
    pub elr: Vec<i32>,
    /// Last known ELR (KIP-966).
    pub last_known_elr: Vec<i32>,
}

/// `PartitionRegistration.defaultToMigrating`: no directories, or only `MIGRATING` ones, mean
/// every replica's directory is `MIGRATING`.
fn default_to_migrating(directories: Vec<Uuid>, replicas: usize) -> Vec<Uuid> {
    if directories.iter().all(|d| *d == DIRECTORY_MIGRATING) {
        vec![DIRECTORY_MIGRATING; replicas]
    } else {
        directories
    }
}

impl PartitionRegistration {
    /// The registration a `PartitionRecord` makes.
    pub fn from_record(r: &PartitionRecord) -> Self {
        Self {
            replicas: r.replicas.clone(),
            directories: default_to_migrating(r.directories.clone(), r.replicas.len()),
            isr: r.isr.clone(),
            removing_replicas: r.removing_replicas.clone(),
            adding_replicas: r.adding_replicas.clone(),
            leader: r.leader,
            leader_recovery_state: r.leader_recovery_state,
            leader_epoch: r.leader_epoch,
            partition_epoch: r.partition_epoch,
            elr: r.eligible_leader_replicas.clone().unwrap_or_default(),
            last_known_elr: r.last_known_elr.clone().unwrap_or_default(),
        }
    }

    /// The record of this partition in a snapshot (`PartitionRegistration.toRecord` at
    /// `metadata.version` 33: directories written, ELR fields only when not empty).
    pub fn to_record(&self, topic_id: Uuid, partition_id: i32) -> PartitionRecord {
        PartitionRecord {
            partition_id,
            topic_id,
            replicas: self.replicas.clone(),
            isr: self.isr.clone(),
            removing_replicas: self.removing_replicas.clone(),
            adding_replicas: self.adding_replicas.clone(),
            leader: self.leader,
            leader_recovery_state: self.leader_recovery_state,
            leader_epoch: self.leader_epoch,
            partition_epoch: self.partition_epoch,
            directories: self.directories.clone(),
            eligible_leader_replicas: (!self.elr.is_empty()).then(|| self.elr.clone()),
            last_known_elr: (!self.last_known_elr.is_empty()).then(|| self.last_known_elr.clone()),
            ..PartitionRecord::default()
        }
    }

    /// This registration after a `PartitionChangeRecord` (`PartitionRegistration.merge`): only
    /// the fields the record carries change; a leader other than -2 ("no change") bumps the
    /// leader epoch, and every change bumps the partition epoch.
    pub fn merge(&self, r: &PartitionChangeRecord) -> Self {
        let replicas = r.replicas.clone().unwrap_or_else(|| self.replicas.clone());
        let directories = default_to_migrating(
            r.directories
                .clone()
                .unwrap_or_else(|| self.directories.clone()),
            replicas.len(),
        );
        let (leader, leader_epoch) = if r.leader == NO_LEADER_CHANGE {
            (self.leader, self.leader_epoch)
        } else {
            (r.leader, self.leader_epoch + 1)
        };
        Self {
            directories,
            isr: r.isr.clone().unwrap_or_else(|| self.isr.clone()),
            removing_replicas: r
                .removing_replicas
                .clone()
                .unwrap_or_else(|| self.removing_replicas.clone()),
            adding_replicas: r
                .adding_replicas
                .clone()
                .unwrap_or_else(|| self.adding_replicas.clone()),
            leader,
            // -1: no change (`LeaderRecoveryState.changeTo`).
            leader_recovery_state: if r.leader_recovery_state == -1 {
                self.leader_recovery_state
            } else {
                r.leader_recovery_state
            },
            leader_epoch,
            partition_epoch: self.partition_epoch + 1,
            elr: r
                .eligible_leader_replicas
                .clone()
                .unwrap_or_else(|| self.elr.clone()),
            last_known_elr: r
                .last_known_elr
                .clone()
                .unwrap_or_else(|| self.last_known_elr.clone()),
            replicas,
        }
    }
}

/// One topic and its partitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicImage {
    /// Topic name.
    pub name: String,
    /// Topic id (KIP-516).
    pub topic_id: Uuid,
    /// Partitions by index.
    pub partitions: BTreeMap<i32, PartitionRegistration>,
}

/// A client-quota entity: (entity type, entity name or None for the default), sorted by type
/// (Kafka's `ClientQuotaEntity`).
pub type QuotaEntity = Vec<(String, Option<String>)>;

/// The cluster's metadata at one point of the metadata log.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MetadataImage {
    /// Number of records applied (the offset after the last one).
    pub offset: u64,
    /// Finalized feature levels by name (`metadata.version`, `kraft.version`, ...); a level of
    /// 0 removes a feature, as Kafka's `FeaturesDelta`.
    pub features: BTreeMap<String, i16>,
    /// Registered brokers by id.
    pub brokers: BTreeMap<i32, BrokerRegistration>,
    /// Registered controllers by id (KIP-919), as their records.
    pub controllers: BTreeMap<i32, RegisterControllerRecord>,
    /// Topics by id, each shared between the images that have it unchanged: an image is
    /// cloned for every committed metadata batch (by the loader, and by the controller for its
    /// scratch copy), and a topic is copied only when a record changes it, so a clone costs a
    /// pointer per topic rather than a copy of every partition's registration.
    pub topics: HashMap<Uuid, Arc<TopicImage>>,
    /// Topic ids by name.
    pub topic_ids: BTreeMap<String, Uuid>,
    /// Non-default configs, by resource and then by config name.
    pub configs: BTreeMap<(ConfigResource, String), BTreeMap<String, String>>,
    /// Client quotas by entity, then by quota key.
    pub client_quotas: BTreeMap<QuotaEntity, BTreeMap<String, f64>>,
    /// First producer id not yet handed out.
    pub next_producer_id: i64,
    /// ACLs by id.
    pub acls: BTreeMap<Uuid, AccessControlEntryRecord>,
    /// SCRAM credentials by user name and mechanism.
    pub scram: BTreeMap<(String, i8), UserScramCredentialRecord>,
    /// Delegation tokens by token id.
    pub delegation_tokens: BTreeMap<String, DelegationTokenRecord>,
}

impl MetadataImage {
    /// The topic named `name`.
    pub fn topic(&self, name: &str) -> Option<&TopicImage> {
        self.topic_ids
            .get(name)
            .and_then(|id| self.topics.get(id))
            .map(|t| &**t)
    }

    /// The topic with id `id`.
    pub fn topic_by_id(&self, id: &Uuid) -> Option<&TopicImage> {
        self.topics.get(id).map(|t| &**t)
    }

    /// Non-default configs of a resource (empty if none).
    pub fn configs_of(&self, resource: ConfigResource, name: &str) -> BTreeMap<String, String> {
        self.configs
            .get(&(resource, name.to_string()))
            .cloned()
            .unwrap_or_default()
    }

    /// The finalized `metadata.version`, None before the bootstrap records.
    pub fn metadata_version(&self) -> Option<i16> {
        self.features.get(METADATA_VERSION_FEATURE).copied()
    }

    /// Whether directory assignment (KIP-858) is on: the finalized `metadata.version` is at
    /// least 3.7-IV2 ([`MV_3_7_IV2`]).
    pub fn is_directory_assignment_supported(&self) -> bool {
        self.metadata_version().is_some_and(|mv| mv >= MV_3_7_IV2)
    }

    /// Registered brokers that are not fenced, by id.
    pub fn unfenced_brokers(&self) -> impl Iterator<Item = &BrokerRegistration> {
        self.brokers.values().filter(|b| !b.fenced)
    }

    /// Applies one record, as Kafka's `MetadataDelta.replay`.
    pub fn apply(&mut self, record: &MetadataRecord) {
        self.offset += 1;
        match record {
            MetadataRecord::RegisterBroker(r) => {
                self.brokers
                    .insert(r.broker_id, BrokerRegistration::from_record(r));
            }
            MetadataRecord::UnregisterBroker(r) => {
                self.brokers.remove(&r.broker_id);
            }
            MetadataRecord::FenceBroker(r) => self.change_broker(r.id, r.epoch, Some(true), None),
            MetadataRecord::UnfenceBroker(r) => {
                self.change_broker(r.id, r.epoch, Some(false), None)
            }
            MetadataRecord::BrokerRegistrationChange(r) => self.apply_broker_change(r),
            MetadataRecord::RegisterController(r) => {
                self.controllers.insert(r.controller_id, r.clone());
            }
            MetadataRecord::UnregisterController(r) => {
                self.controllers.remove(&r.controller_id);
            }
            MetadataRecord::FeatureLevel(r) => {
                if r.feature_level == 0 {
                    self.features.remove(&r.name);
                } else {
                    self.features.insert(r.name.clone(), r.feature_level);
                }
            }
            MetadataRecord::Topic(r) => {
                self.topic_ids.insert(r.name.clone(), r.topic_id);
                self.topics.insert(
                    r.topic_id,
                    Arc::new(TopicImage {
                        name: r.name.clone(),
                        topic_id: r.topic_id,
                        partitions: BTreeMap::new(),
                    }),
                );
            }
            MetadataRecord::Partition(r) => match self.topics.get_mut(&r.topic_id) {
                Some(t) => {
                    Arc::make_mut(t)
                        .partitions
                        .insert(r.partition_id, PartitionRegistration::from_record(r));
                }
                None => skipped(record, "its topic does not exist"),
            },
            MetadataRecord::PartitionChange(r) => {
                let merged = self
                    .topics
                    .get_mut(&r.topic_id)
                    .filter(|t| t.partitions.contains_key(&r.partition_id))
                    .and_then(|t| Arc::make_mut(t).partitions.get_mut(&r.partition_id))
                    .map(|p| *p = p.merge(r));
                if merged.is_none() {
                    skipped(record, "its partition does not exist");
                }
            }
            MetadataRecord::RemoveTopic(r) => match self.topics.remove(&r.topic_id) {
                Some(t) => {
                    self.topic_ids.remove(&t.name);
                    self.configs
                        .remove(&(ConfigResource::Topic, t.name.clone()));
                }
                None => skipped(record, "the topic does not exist"),
            },
            MetadataRecord::ClearElr(r) => {
                for t in self.topics.values_mut() {
                    let has_elr = t
                        .partitions
                        .values()
                        .any(|p| !p.elr.is_empty() || !p.last_known_elr.is_empty());
                    // A topic is copied only when it changes.
                    if has_elr && (r.topic_name.is_empty() || r.topic_name == t.name) {
                        for p in Arc::make_mut(t).partitions.values_mut() {
                            if !p.elr.is_empty() || !p.last_known_elr.is_empty() {
                                p.elr.clear();
                                p.last_known_elr.clear();
                                p.partition_epoch += 1;
                            }
                        }
                    }
                }
            }
            MetadataRecord::Config(r) => self.apply_config(r),
            MetadataRecord::ClientQuota(r) => self.apply_client_quota(r),
            MetadataRecord::ProducerIds(r) => {
                self.next_producer_id = self.next_producer_id.max(r.next_producer_id);
            }
            MetadataRecord::AccessControlEntry(r) => {
                self.acls.insert(r.id, r.clone());
            }
            MetadataRecord::RemoveAccessControlEntry(r) => {
                if self.acls.remove(&r.id).is_none() {
                    skipped(record, "no ACL has this id");
                }
            }
            MetadataRecord::UserScramCredential(r) => {
                self.scram.insert((r.name.clone(), r.mechanism), r.clone());
            }
            MetadataRecord::RemoveUserScramCredential(r) => {
                self.scram.remove(&(r.name.clone(), r.mechanism));
            }
            MetadataRecord::DelegationToken(r) => {
                self.delegation_tokens.insert(r.token_id.clone(), r.clone());
            }
            MetadataRecord::RemoveDelegationToken(r) => {
                self.delegation_tokens.remove(&r.token_id);
            }
            // Nothing to replay: NoOpRecord only moves the offset; the ZooKeeper migration
            // state means nothing to a KRaft-only cluster (Kafka 4 ignores it too); metadata
            // transactions (KIP-868) are the replay's business, not the image's
            // (`crate::txn_replay`: an abort returns to the image from before the transaction).
            MetadataRecord::NoOp(_)
            | MetadataRecord::ZkMigrationState(_)
            | MetadataRecord::BeginTransaction(_)
            | MetadataRecord::EndTransaction(_)
            | MetadataRecord::AbortTransaction(_) => {}
        }
    }

    fn change_broker(
        &mut self,
        broker_id: i32,
        epoch: i64,
        fenced: Option<bool>,
        in_controlled_shutdown: Option<bool>,
    ) {
        match self.brokers.get_mut(&broker_id) {
            Some(b) if b.epoch == epoch => {
                if let Some(f) = fenced {
                    b.fenced = f;
                }
                if let Some(c) = in_controlled_shutdown {
                    b.in_controlled_shutdown = c;
                }
            }
            Some(b) => tracing::warn!(
                broker_id,
                epoch,
                current_epoch = b.epoch,
                "metadata record for a broker at another epoch skipped"
            ),
            None => tracing::warn!(
                broker_id,
                "metadata record for an unregistered broker skipped"
            ),
        }
    }

    fn apply_broker_change(&mut self, r: &BrokerRegistrationChangeRecord) {
        // `BrokerRegistrationFencingChange`: -1 unfence, 0 none, 1 fence;
        // `BrokerRegistrationInControlledShutdownChange`: 0 none, 1 in controlled shutdown.
        let fenced = match r.fenced {
            -1 => Some(false),
            1 => Some(true),
            _ => None,
        };
        let in_controlled_shutdown = (r.in_controlled_shutdown == 1).then_some(true);
        self.change_broker(r.broker_id, r.broker_epoch, fenced, in_controlled_shutdown);
        if let Some(b) = self.brokers.get_mut(&r.broker_id) {
            if b.epoch == r.broker_epoch {
                if !r.log_dirs.is_empty() {
                    b.directories = r.log_dirs.clone();
                }
                if let Some(c) = &r.cordoned_log_dirs {
                    b.cordoned_directories = Some(c.clone());
                }
            }
        }
    }

    fn apply_config(&mut self, r: &ConfigRecord) {
        let key = (
            ConfigResource::from_resource_type(r.resource_type),
            r.resource_name.clone(),
        );
        match &r.value {
            Some(v) => {
                self.configs
                    .entry(key)
                    .or_default()
                    .insert(r.name.clone(), v.clone());
            }
            None => {
                if let Some(m) = self.configs.get_mut(&key) {
                    m.remove(&r.name);
                    if m.is_empty() {
                        self.configs.remove(&key);
                    }
                }
            }
        }
    }

    fn apply_client_quota(&mut self, r: &ClientQuotaRecord) {
        let mut entity: QuotaEntity = r
            .entity
            .iter()
            .map(|e| (e.entity_type.clone(), e.entity_name.clone()))
            .collect();
        entity.sort();
        if r.remove {
            if let Some(q) = self.client_quotas.get_mut(&entity) {
                q.remove(&r.key);
                if q.is_empty() {
                    self.client_quotas.remove(&entity);
                }
            }
        } else {
            self.client_quotas
                .entry(entity)
                .or_default()
                .insert(r.key.clone(), r.value);
        }
    }

    /// The records of a snapshot of this image (KIP-630), in the order Kafka's
    /// `MetadataImage.write` writes them: features (`metadata.version` first), brokers, then
    /// controllers, each topic followed by its partitions, configs, client quotas, the
    /// producer-id block, ACLs, SCRAM credentials, delegation tokens. Applying them to an empty
    /// image gives an image equal to this one except for `offset`.
    pub fn to_records(&self) -> Vec<MetadataRecord> {
        let mut out: Vec<MetadataRecord> = Vec::new();
        let feature = |name: &str, level: i16| -> MetadataRecord {
            FeatureLevelRecord {
                name: name.to_string(),
                feature_level: level,
                ..FeatureLevelRecord::default()
            }
            .into()
        };
        if let Some(mv) = self.metadata_version() {
            out.push(feature(METADATA_VERSION_FEATURE, mv));
        }
        out.extend(
            self.features
                .iter()
                .filter(|(n, _)| *n != METADATA_VERSION_FEATURE)
                .map(|(n, l)| feature(n, *l)),
        );
        out.extend(self.brokers.values().map(|b| b.to_record().into()));
        out.extend(self.controllers.values().map(|c| c.clone().into()));
        for id in self.topic_ids.values() {
            let Some(t) = self.topics.get(id) else {
                continue;
            };
            out.push(
                TopicRecord {
                    name: t.name.clone(),
                    topic_id: t.topic_id,
                    ..TopicRecord::default()
                }
                .into(),
            );
            out.extend(
                t.partitions
                    .iter()
                    .map(|(i, p)| p.to_record(t.topic_id, *i).into()),
            );
        }
        for ((resource, resource_name), configs) in &self.configs {
            out.extend(configs.iter().map(|(name, value)| {
                ConfigRecord {
                    resource_type: resource.resource_type(),
                    resource_name: resource_name.clone(),
                    name: name.clone(),
                    value: Some(value.clone()),
                    ..ConfigRecord::default()
                }
                .into()
            }));
        }
        for (entity, quotas) in &self.client_quotas {
            out.extend(quotas.iter().map(|(key, value)| {
                ClientQuotaRecord {
                    entity: entity
                        .iter()
                        .map(|(t, n)| EntityData {
                            entity_type: t.clone(),
                            entity_name: n.clone(),
                            ..EntityData::default()
                        })
                        .collect(),
                    key: key.clone(),
                    value: *value,
                    remove: false,
                    ..ClientQuotaRecord::default()
                }
                .into()
            }));
        }
        // `ProducerIdsImage.write`: the block only, with no broker.
        if self.next_producer_id > 0 {
            out.push(
                ProducerIdsRecord {
                    broker_id: -1,
                    broker_epoch: -1,
                    next_producer_id: self.next_producer_id,
                    ..ProducerIdsRecord::default()
                }
                .into(),
            );
        }
        out.extend(self.acls.values().map(|a| a.clone().into()));
        out.extend(self.scram.values().map(|s| s.clone().into()));
        out.extend(self.delegation_tokens.values().map(|d| d.clone().into()));
        out
    }
}

fn skipped(record: &MetadataRecord, why: &str) {
    tracing::warn!(
        record = record.record_type().name,
        "metadata record skipped: {why}"
    );
}

#[cfg(test)]
mod tests {
    use gregor_protocol::metadata_records::{
        ClearElrRecord, PartitionChangeRecord, PartitionRecord, TopicRecord,
    };

    use super::*;

    fn image_with(topics: &[(&str, Uuid)]) -> MetadataImage {
        let mut image = MetadataImage::default();
        for (name, id) in topics {
            image.apply(&MetadataRecord::Topic(TopicRecord {
                name: (*name).to_string(),
                topic_id: *id,
                ..TopicRecord::default()
            }));
            for p in 0..3 {
                image.apply(&MetadataRecord::Partition(PartitionRecord {
                    topic_id: *id,
                    partition_id: p,
                    replicas: vec![1, 2],
                    isr: vec![1, 2],
                    leader: 1,
                    ..PartitionRecord::default()
                }));
            }
        }
        image
    }

    #[test]
    fn a_clone_shares_its_topics_until_a_record_changes_one() {
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let before = image_with(&[("a", a), ("b", b)]);
        let mut after = before.clone();
        assert!(Arc::ptr_eq(&before.topics[&a], &after.topics[&a]));
        after.apply(&MetadataRecord::PartitionChange(PartitionChangeRecord {
            topic_id: a,
            partition_id: 1,
            isr: Some(vec![1]),
            leader: NO_LEADER_CHANGE,
            ..PartitionChangeRecord::default()
        }));
        // The changed topic is a copy; the earlier image still has the old ISR.
        assert!(!Arc::ptr_eq(&before.topics[&a], &after.topics[&a]));
        assert_eq!(before.topics[&a].partitions[&1].isr, [1, 2]);
        assert_eq!(after.topics[&a].partitions[&1].isr, [1]);
        assert_eq!(
            after.topics[&a].partitions[&0],
            before.topics[&a].partitions[&0]
        );
        assert!(Arc::ptr_eq(&before.topics[&b], &after.topics[&b]));
        // A change of a partition that does not exist copies nothing.
        let mut again = after.clone();
        again.apply(&MetadataRecord::PartitionChange(PartitionChangeRecord {
            topic_id: b,
            partition_id: 9,
            isr: Some(vec![1]),
            leader: NO_LEADER_CHANGE,
            ..PartitionChangeRecord::default()
        }));
        assert!(Arc::ptr_eq(&again.topics[&b], &after.topics[&b]));
        // Clearing ELRs copies only topics that have some.
        again.apply(&MetadataRecord::ClearElr(ClearElrRecord::default()));
        assert!(Arc::ptr_eq(&again.topics[&a], &after.topics[&a]));
        assert_eq!(again.topics, after.topics);
    }
}
